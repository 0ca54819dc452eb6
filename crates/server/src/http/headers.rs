//! RateLimit response headers on `POST /v1/request` answers
//! (`serve --http-ratelimit-headers`), describing the limit the answer's
//! `limit` and `remaining` describe.
//!
//! Two forms, as clients read them today:
//!
//! - [`RateHeaders::Ietf`]: the structured fields of the IETF httpapi
//!   draft "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers-08
//!   and later): `RateLimit-Policy: "default";q=LIMIT` and
//!   `RateLimit: "default";r=REMAINING;t=RESET`;
//! - [`RateHeaders::Legacy`]: the three fields of the earlier drafts, the
//!   names envoyproxy/ratelimit writes by default
//!   (`RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`).
//!
//! The numbers are the answer body's: `limit`, `remaining` (0 on a
//! refusal, as envoyproxy/ratelimit says for a descriptor over its
//! limit), and a reset in whole seconds rounded up: on a refusal with a
//! `Retry-After`, that moment (the draft wants Retry-After no earlier
//! than the reset, and the refused hits are the quota that comes back
//! then); otherwise `reset_after_ns`, when the limit is full again. The
//! reset is left out where it is not the named limit's own
//! (`burst_tiers`, and a resource with a hard or global limit: see
//! [`RateHeaders::write`]). An answer without a limit (an unconfigured
//! resource of a namespace that allows them, an `unlimited` resource)
//! gets no header at all rather than a made-up one; a `deny` resource
//! (limit 0) gets its limit and remaining but no reset, since nothing
//! ever resets it.
//!
//! A resource with a `limits:` list gets, in the IETF form, one policy
//! per limit under its own name (`"burst";q=20, "daily";q=1000`), each
//! with its own remaining and reset; the legacy form describes the
//! binding limit alone, as the body's `limit` and `remaining` do.
//!
//! This is on the request path of every rate request, so the names are
//! statics (inserting one clones a static string: no allocation), and
//! so are the values of numbers below [`SHARED`] and of
//! `RateLimit-Policy` for limits below it ([`Shared`]): the legacy form
//! then allocates nothing, and the IETF form only its `RateLimit` value
//! (written with `itoa` into a stack buffer, then copied once).

use std::str::FromStr;
use std::sync::OnceLock;

use http::{HeaderMap, HeaderName, HeaderValue};
use tollgate_proto::v1;

/// `RateLimit-Policy` (IETF draft, structured).
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF draft, structured).
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Limit` (earlier drafts; envoyproxy/ratelimit's default name).
pub static RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
/// `RateLimit-Remaining` (earlier drafts).
pub static RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
/// `RateLimit-Reset` (earlier drafts): seconds, not a date.
pub static RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// The largest integer a structured field may carry (RFC 8941 §3.3.1):
/// larger numbers are written as this.
pub const MAX_SF_INTEGER: u64 = 999_999_999_999_999;

/// The policy's name in the structured fields: a resource has one policy
/// today, and the draft's own example for a single policy names it so.
const POLICY: &[u8] = b"\"default\"";

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Numbers below this are written from values made once ([`Shared`]).
pub const SHARED: u64 = 1024;

/// Which RateLimit headers `POST /v1/request` answers carry.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RateHeaders {
    /// None (the default): answers as before the flag existed.
    #[default]
    Off,
    /// `RateLimit-Policy` and `RateLimit`, the IETF draft's structured
    /// fields.
    Ietf,
    /// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`.
    Legacy,
}

/// A `--http-ratelimit-headers` value that is not one of the forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a RateLimit header form: use `off`, `ietf` or `legacy`")]
pub struct UnknownRateHeaders(pub String);

impl RateHeaders {
    /// The form's name, as the flag takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            RateHeaders::Off => "off",
            RateHeaders::Ietf => "ietf",
            RateHeaders::Legacy => "legacy",
        }
    }

    /// Adds this form's headers for `answer` to `headers` (nothing when
    /// off, or when the answer has no limit).
    pub fn write(self, answer: &v1::RateResponse, headers: &mut HeaderMap) {
        if self == RateHeaders::Off || answer.unconfigured || answer.limit == u64::MAX {
            return;
        }
        let limit = answer.limit.min(MAX_SF_INTEGER);
        // Refused: 0, as envoyproxy/ratelimit says for a descriptor over
        // its limit, and as clients that back off at 0 expect; the body
        // keeps what a smaller request could still take.
        let remaining = if answer.allowed {
            answer.remaining.min(MAX_SF_INTEGER)
        } else {
            0
        };
        // The reset must be the named limit's own. The body's
        // `reset_after_ns` is when *every* limit of the resource is clear,
        // which is that only when the resource has one limit with one
        // period: a `burst_tiers` answer names one tier (or the hard or
        // global limit) but resets when every tier's active period ends,
        // and a hard or global limit beside the algorithm's makes the
        // named limit whichever has the least left. Then no reset is
        // written (the draft makes it optional) rather than a wrong one;
        // a 429's `Retry-After` still says when to retry. A limit of 0
        // (`deny`) never resets to anything.
        let single = answer.algorithm != "burst_tiers"
            && answer.hard_limit.is_none()
            && answer.global_limit.is_none();
        //
        // A refusal with a Retry-After resets at that moment: the draft
        // wants Retry-After no earlier than the reset (draft 10 §6; draft
        // 09: the same moment), and the reset is when more quota comes
        // (§4.1.2), which for the refused hits is then. The body's reset
        // (the limit full again) is later for every algorithm that refills
        // bit by bit: a token bucket of 3 refilling 1 a second, emptied,
        // said `t=3` beside `Retry-After: 1`.
        let reset_ns = match answer.retry_after_ns {
            Some(ns) if !answer.allowed && ns > 0 => ns,
            _ => answer.reset_after_ns,
        };
        let reset = (answer.limit > 0 && single)
            .then(|| reset_ns.div_ceil(NANOS_PER_SECOND).min(MAX_SF_INTEGER));
        match self {
            RateHeaders::Off => {}
            RateHeaders::Legacy => {
                headers.insert(&RATELIMIT_LIMIT, number(limit));
                headers.insert(&RATELIMIT_REMAINING, number(remaining));
                if let Some(reset) = reset {
                    headers.insert(&RATELIMIT_RESET, number(reset));
                }
            }
            RateHeaders::Ietf if !answer.limits.is_empty() => listed_policies(answer, headers),
            RateHeaders::Ietf => {
                static POLICIES: OnceLock<Shared> = OnceLock::new();
                let shared = POLICIES.get_or_init(|| Shared::new("\"default\";q="));
                if let Some(v) = shared.get(limit) {
                    headers.insert(&RATELIMIT_POLICY, v);
                } else {
                    let mut buf = Field::default();
                    buf.push(POLICY);
                    buf.param(b";q=", limit);
                    if let Some(v) = buf.value() {
                        headers.insert(&RATELIMIT_POLICY, v);
                    }
                }
                let mut buf = Field::default();
                buf.push(POLICY);
                buf.param(b";r=", remaining);
                if let Some(reset) = reset {
                    buf.param(b";t=", reset);
                }
                if let Some(v) = buf.value() {
                    headers.insert(&RATELIMIT, v);
                }
            }
        }
    }
}

/// The IETF fields of a resource with a `limits:` list: one policy per
/// limit, each under its own name (names are letters, digits, `_`, `-`
/// and `.`, so they need no escaping in a structured-field string), in
/// the answer's order, with each limit's own quota, remaining and reset.
/// A refused answer's binding limit says `r=0`, as the single form does;
/// a `burst_tiers` limit gets no `t` (its reset is not one period's).
/// Only resources with a list get here, so the one allocation per field
/// costs nothing on the common path.
fn listed_policies(answer: &v1::RateResponse, headers: &mut HeaderMap) {
    // The limit that refused: a listed one by name, or the hard or global
    // limit (listed as `hard` and `global`; the body names those by
    // `limited_by` alone).
    let binding: &str = match v1::LimitedBy::try_from(answer.limited_by) {
        Ok(v1::LimitedBy::Hard) => "hard",
        Ok(v1::LimitedBy::Global) => "global",
        _ => &answer.limited_by_name,
    };
    let mut policy = Vec::with_capacity(24 * answer.limits.len());
    let mut state = Vec::with_capacity(32 * answer.limits.len());
    for (i, l) in answer.limits.iter().enumerate() {
        if i > 0 {
            policy.extend_from_slice(b", ");
            state.extend_from_slice(b", ");
        }
        for out in [&mut policy, &mut state] {
            out.push(b'"');
            out.extend_from_slice(l.name.as_bytes());
            out.push(b'"');
        }
        policy.extend_from_slice(b";q=");
        policy.extend_from_slice(
            itoa::Buffer::new()
                .format(l.limit.min(MAX_SF_INTEGER))
                .as_bytes(),
        );
        let bound = !answer.allowed && !binding.is_empty() && l.name == binding;
        let remaining = if bound {
            0
        } else {
            l.remaining.min(MAX_SF_INTEGER)
        };
        state.extend_from_slice(b";r=");
        state.extend_from_slice(itoa::Buffer::new().format(remaining).as_bytes());
        if l.limit > 0 && l.algorithm != "burst_tiers" {
            // The binding limit of a refusal resets at its Retry-After, as
            // the single form's does (see `RateHeaders::write`).
            let reset_ns = match l.retry_after_ns {
                Some(ns) if bound && ns > 0 => ns,
                _ => l.reset_after_ns,
            };
            let reset = reset_ns.div_ceil(NANOS_PER_SECOND).min(MAX_SF_INTEGER);
            state.extend_from_slice(b";t=");
            state.extend_from_slice(itoa::Buffer::new().format(reset).as_bytes());
        }
    }
    if let Ok(v) = HeaderValue::from_bytes(&policy) {
        headers.insert(&RATELIMIT_POLICY, v);
    }
    if let Ok(v) = HeaderValue::from_bytes(&state) {
        headers.insert(&RATELIMIT, v);
    }
}

impl FromStr for RateHeaders {
    type Err = UnknownRateHeaders;

    fn from_str(s: &str) -> Result<RateHeaders, UnknownRateHeaders> {
        // Any case: `IETF` in an env file means the same.
        [RateHeaders::Off, RateHeaders::Ietf, RateHeaders::Legacy]
            .into_iter()
            .find(|form| form.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownRateHeaders(s.chars().take(64).collect()))
    }
}

impl std::fmt::Display for RateHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `n` as a header value: shared below [`SHARED`], else made (also
/// `Retry-After`'s, in `api`).
pub(super) fn number(n: u64) -> HeaderValue {
    static NUMBERS: OnceLock<Shared> = OnceLock::new();
    NUMBERS
        .get_or_init(|| Shared::new(""))
        .get(n)
        .unwrap_or_else(|| HeaderValue::from(n))
}

/// The values `PREFIX0` to `PREFIX1023` (below [`SHARED`]), made once
/// per process in one buffer that is never freed (a few kilobytes): each
/// is a static `Bytes`, so handing one to a response copies a pointer
/// and a length, with no allocation and no reference count. An
/// allocation per header is what `Retry-After` avoids too (see
/// `api::retry_after`, which takes its values from here): glibc
/// consolidated its small chunks once per answer.
struct Shared(Vec<HeaderValue>);

impl Shared {
    fn new(prefix: &str) -> Shared {
        let mut text = String::new();
        let mut ends = Vec::new();
        for n in 0..SHARED {
            text.push_str(prefix);
            text.push_str(itoa::Buffer::new().format(n));
            ends.push(text.len());
        }
        let text: &'static str = Box::leak(text.into_boxed_str());
        let mut start = 0;
        let values: Option<Vec<HeaderValue>> = ends
            .into_iter()
            .map(|end| {
                let value = text.get(start..end);
                start = end;
                // Checked before `from_static`, which would panic on a
                // byte a header may not hold (the prefixes here have none).
                value
                    .filter(|v| HeaderValue::from_str(v).is_ok())
                    .map(HeaderValue::from_static)
            })
            .collect();
        // Never empty in practice; if it were, every value is made.
        Shared(values.unwrap_or_default())
    }

    fn get(&self, n: u64) -> Option<HeaderValue> {
        usize::try_from(n).ok().and_then(|i| self.0.get(i)).cloned()
    }
}

/// A structured field's bytes, on the stack: `"default"` and at most two
/// parameters of at most 15 digits each fit with room to spare.
struct Field {
    bytes: [u8; 64],
    len: usize,
}

impl Default for Field {
    fn default() -> Field {
        Field {
            bytes: [0; 64],
            len: 0,
        }
    }
}

impl Field {
    fn push(&mut self, part: &[u8]) {
        let end = self.len + part.len();
        if let Some(slot) = self.bytes.get_mut(self.len..end) {
            slot.copy_from_slice(part);
            self.len = end;
        }
    }

    fn param(&mut self, key: &[u8], n: u64) {
        self.push(key);
        self.push(itoa::Buffer::new().format(n).as_bytes());
    }

    /// The header value (only ASCII digits, quotes, letters, `;` and
    /// `=` are ever written, so it is always valid).
    fn value(&self) -> Option<HeaderValue> {
        HeaderValue::from_bytes(&self.bytes[..self.len]).ok()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn answer(limit: u64, remaining: u64, reset_after_ns: u64) -> v1::RateResponse {
        v1::RateResponse {
            allowed: true,
            granted: 1,
            limit,
            remaining,
            reset_after_ns,
            ..v1::RateResponse::default()
        }
    }

    #[test]
    fn a_limits_list_gets_one_ietf_policy_per_limit_each_with_its_own_numbers() {
        let status =
            |name: &str, algorithm: &str, limit: u64, remaining: u64, reset: u64| v1::LimitStatus {
                name: name.into(),
                algorithm: algorithm.into(),
                limit,
                remaining,
                reset_after_ns: reset,
                ..v1::LimitStatus::default()
            };
        let mut a = answer(3, 0, 2_500_000_000);
        a.allowed = false;
        a.limited_by_name = "burst".into();
        a.limits = vec![
            v1::LimitStatus {
                retry_after_ns: Some(400_000_000),
                ..status("burst", "token_bucket", 3, 1, 2_500_000_000)
            },
            status(
                "daily",
                "fixed_window",
                1000,
                993,
                86_000 * NANOS_PER_SECOND,
            ),
            status("tiers", "burst_tiers", 10, 4, 7 * NANOS_PER_SECOND),
        ];
        assert_eq!(
            written(RateHeaders::Ietf, &a),
            pairs(&[
                (
                    "ratelimit",
                    // The refusing limit resets at its Retry-After (0.4 s).
                    r#""burst";r=0;t=1, "daily";r=993;t=86000, "tiers";r=4"#
                ),
                (
                    "ratelimit-policy",
                    r#""burst";q=3, "daily";q=1000, "tiers";q=10"#
                ),
            ])
        );
        // The legacy form names one limit: the binding one, as the body's
        // `limit` and `remaining` do.
        assert_eq!(
            written(RateHeaders::Legacy, &a),
            pairs(&[
                ("ratelimit-limit", "3"),
                ("ratelimit-remaining", "0"),
                ("ratelimit-reset", "3"),
            ])
        );
    }

    /// Regression: a list's refusal by the hard (or global) limit left
    /// every policy, the refusing `hard` one included, with its room
    /// (`"hard";r=2` on a 429 for 5 hits), where the single form says
    /// `r=0`: only a listed limit's name was compared.
    #[test]
    fn regression_a_list_refused_by_its_hard_limit_says_r0_for_it() {
        let mut a = answer(10, 2, NANOS_PER_SECOND);
        a.allowed = false;
        a.limited_by = v1::LimitedBy::Hard as i32;
        a.hard_limit = Some(10);
        a.limits = vec![
            v1::LimitStatus {
                name: "daily".into(),
                algorithm: "fixed_window".into(),
                limit: 1000,
                remaining: 900,
                reset_after_ns: 50 * NANOS_PER_SECOND,
                ..v1::LimitStatus::default()
            },
            v1::LimitStatus {
                name: "hard".into(),
                algorithm: "sliding_log".into(),
                limit: 10,
                remaining: 2,
                reset_after_ns: NANOS_PER_SECOND,
                retry_after_ns: Some(300_000_000),
                ..v1::LimitStatus::default()
            },
        ];
        assert_eq!(
            written(RateHeaders::Ietf, &a),
            pairs(&[
                ("ratelimit", r#""daily";r=900;t=50, "hard";r=0;t=1"#),
                ("ratelimit-policy", r#""daily";q=1000, "hard";q=10"#),
            ])
        );
    }

    fn written(form: RateHeaders, a: &v1::RateResponse) -> Vec<(String, String)> {
        let mut h = HeaderMap::new();
        form.write(a, &mut h);
        let mut out: Vec<(String, String)> = h
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        out.sort();
        out
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn each_form_writes_the_answers_numbers_with_reset_rounded_up() {
        let a = answer(100, 99, 100_000_000);
        assert_eq!(
            written(RateHeaders::Ietf, &a),
            pairs(&[
                ("ratelimit", "\"default\";r=99;t=1"),
                ("ratelimit-policy", "\"default\";q=100"),
            ])
        );
        assert_eq!(
            written(RateHeaders::Legacy, &a),
            pairs(&[
                ("ratelimit-limit", "100"),
                ("ratelimit-remaining", "99"),
                ("ratelimit-reset", "1"),
            ])
        );
        assert!(written(RateHeaders::Off, &a).is_empty());
        // Whole seconds stay whole; a fresh state resets in 0.
        let exact = answer(5, 0, 10_000_000_000);
        assert_eq!(
            written(RateHeaders::Legacy, &exact)[2],
            ("ratelimit-reset".to_owned(), "10".to_owned())
        );
        let fresh = answer(5, 5, 0);
        assert_eq!(
            written(RateHeaders::Ietf, &fresh)[0],
            ("ratelimit".to_owned(), "\"default\";r=5;t=0".to_owned())
        );
    }

    #[test]
    fn no_limit_no_header_and_deny_has_no_reset() {
        let mut unconfigured = answer(u64::MAX, u64::MAX, 0);
        assert!(written(RateHeaders::Ietf, &unconfigured).is_empty());
        assert!(written(RateHeaders::Legacy, &unconfigured).is_empty());
        unconfigured.unconfigured = true;
        unconfigured.limit = 7;
        assert!(written(RateHeaders::Legacy, &unconfigured).is_empty());
        let mut deny = answer(0, 0, 0);
        deny.allowed = false;
        deny.retry_after_ns = None;
        assert_eq!(
            written(RateHeaders::Ietf, &deny),
            pairs(&[
                ("ratelimit", "\"default\";r=0"),
                ("ratelimit-policy", "\"default\";q=0"),
            ])
        );
        assert_eq!(
            written(RateHeaders::Legacy, &deny),
            pairs(&[("ratelimit-limit", "0"), ("ratelimit-remaining", "0")])
        );
    }

    #[test]
    fn numbers_past_a_structured_integer_are_capped() {
        // u64::MAX ns is 18,446,744,074 s: within the bound, as written.
        let huge = answer(u64::MAX - 1, u64::MAX - 2, u64::MAX);
        assert_eq!(
            written(RateHeaders::Ietf, &huge),
            pairs(&[
                ("ratelimit", "\"default\";r=999999999999999;t=18446744074"),
                ("ratelimit-policy", "\"default\";q=999999999999999"),
            ])
        );
    }

    #[test]
    fn shared_values_are_the_numbers_they_stand_for() {
        for n in (0..=SHARED + 10).chain([u64::MAX]) {
            assert_eq!(number(n).to_str().unwrap(), n.to_string());
            let a = answer(n, 0, 0);
            let policy = written(RateHeaders::Ietf, &a)
                .into_iter()
                .find(|(k, _)| k == "ratelimit-policy")
                .map(|(_, v)| v);
            let expected = format!("\"default\";q={}", n.min(MAX_SF_INTEGER));
            // A limit of u64::MAX is "no limit": no header.
            if n != u64::MAX {
                assert_eq!(policy, Some(expected));
            }
        }
    }

    /// Regression (second review of issue 18): a refusal's reset was the
    /// body's (the limit full again), later than its Retry-After.
    #[test]
    fn a_refusal_resets_at_its_retry_after() {
        let mut a = answer(3, 0, 3_000_000_000);
        a.allowed = false;
        a.granted = 0;
        a.retry_after_ns = Some(1_000_000_001);
        assert_eq!(
            written(RateHeaders::Ietf, &a),
            pairs(&[
                ("ratelimit", "\"default\";r=0;t=2"),
                ("ratelimit-policy", "\"default\";q=3"),
            ])
        );
        assert_eq!(
            written(RateHeaders::Legacy, &a)[2],
            ("ratelimit-reset".to_owned(), "2".to_owned())
        );
        // Never possible (no Retry-After): the body's reset.
        a.retry_after_ns = None;
        assert_eq!(
            written(RateHeaders::Legacy, &a)[2],
            ("ratelimit-reset".to_owned(), "3".to_owned())
        );
        // A grant keeps the body's reset whatever its retry says.
        let mut g = answer(3, 2, 3_000_000_000);
        g.retry_after_ns = Some(0);
        assert_eq!(
            written(RateHeaders::Legacy, &g)[2],
            ("ratelimit-reset".to_owned(), "3".to_owned())
        );
    }

    #[test]
    fn forms_parse_by_name_and_refuse_others() {
        for form in [RateHeaders::Off, RateHeaders::Ietf, RateHeaders::Legacy] {
            assert_eq!(form.as_str().parse::<RateHeaders>(), Ok(form));
            let upper = form.as_str().to_ascii_uppercase();
            assert_eq!(upper.parse::<RateHeaders>(), Ok(form));
        }
        assert_eq!("Legacy".parse::<RateHeaders>(), Ok(RateHeaders::Legacy));
        let e = "draft".parse::<RateHeaders>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "`draft` is not a RateLimit header form: use `off`, `ietf` or `legacy`"
        );
        let long = "x".repeat(10_000).parse::<RateHeaders>().unwrap_err();
        assert!(long.to_string().len() < 200);
    }
}
