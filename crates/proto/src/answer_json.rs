//! The HTTP API's rate answer (`RateResponse` as JSON), written straight
//! into bytes.
//!
//! serde's derived serializer escapes every field name at run time and
//! goes through a generic writer: about 6,000 instructions for one answer
//! of about 300 bytes, a quarter of an HTTP decision's cost
//! (docs/benchmarks.md, "Where an HTTP decision's time goes"). The
//! names here are written pre-quoted. The bytes are exactly serde_json's
//! for the same message (field order, `null` for absent values, the same
//! string escapes); a property test holds the two to that.

use crate::v1::{LimitStatus, RateResponse, TierContext};

/// Appends `r` as JSON to `out`: byte for byte what
/// `serde_json::to_vec(r)` writes.
pub fn write_rate_response(r: &RateResponse, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"allowed\":");
    bool(out, r.allowed);
    out.extend_from_slice(b",\"granted\":");
    number(out, r.granted);
    out.extend_from_slice(b",\"limit\":");
    number(out, r.limit);
    out.extend_from_slice(b",\"remaining\":");
    number(out, r.remaining);
    out.extend_from_slice(b",\"retry_after_ns\":");
    optional(out, r.retry_after_ns);
    out.extend_from_slice(b",\"reset_after_ns\":");
    number(out, r.reset_after_ns);
    out.extend_from_slice(b",\"wait_ns\":");
    number(out, r.wait_ns);
    out.extend_from_slice(b",\"limited_by\":");
    // One table of names for both writers.
    match crate::json::limited_by::name(r.limited_by) {
        Some(name) => string(out, name),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"tier\":");
    match &r.tier {
        Some(t) => tier(out, t),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"hard_limit\":");
    optional(out, r.hard_limit);
    out.extend_from_slice(b",\"global_limit\":");
    optional(out, r.global_limit);
    out.extend_from_slice(b",\"domain_hits_last_second\":");
    optional(out, r.domain_hits_last_second);
    out.extend_from_slice(b",\"global_hits_last_second\":");
    optional(out, r.global_hits_last_second);
    out.extend_from_slice(b",\"shadowed\":");
    bool(out, r.shadowed);
    out.extend_from_slice(b",\"ignored\":");
    bool(out, r.ignored);
    out.extend_from_slice(b",\"unconfigured\":");
    bool(out, r.unconfigured);
    out.extend_from_slice(b",\"algorithm\":");
    string(out, &r.algorithm);
    if !r.limits.is_empty() {
        out.extend_from_slice(b",\"limits\":[");
        for (i, l) in r.limits.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            limit_status(out, l);
        }
        out.push(b']');
    }
    if !r.limited_by_name.is_empty() {
        out.extend_from_slice(b",\"limited_by_name\":");
        string(out, &r.limited_by_name);
    }
    out.push(b'}');
}

fn limit_status(out: &mut Vec<u8>, l: &LimitStatus) {
    out.extend_from_slice(b"{\"name\":");
    string(out, &l.name);
    out.extend_from_slice(b",\"algorithm\":");
    string(out, &l.algorithm);
    out.extend_from_slice(b",\"limit\":");
    number(out, l.limit);
    out.extend_from_slice(b",\"remaining\":");
    number(out, l.remaining);
    out.extend_from_slice(b",\"reset_after_ns\":");
    number(out, l.reset_after_ns);
    out.extend_from_slice(b",\"retry_after_ns\":");
    optional(out, l.retry_after_ns);
    out.extend_from_slice(b",\"tier\":");
    match &l.tier {
        Some(t) => tier(out, t),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"shadow\":");
    bool(out, l.shadow);
    out.push(b'}');
}

/// The answer's size for a typical grant, to allocate once.
pub const TYPICAL_RATE_RESPONSE_BYTES: usize = 384;

fn tier(out: &mut Vec<u8>, t: &TierContext) {
    out.extend_from_slice(b"{\"index\":");
    number(out, u64::from(t.index));
    out.extend_from_slice(b",\"limit\":");
    number(out, t.limit);
    out.extend_from_slice(b",\"hits\":");
    number(out, t.hits);
    out.extend_from_slice(b",\"burst\":");
    bool(out, t.burst);
    out.push(b'}');
}

fn bool(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

fn number(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn optional(out: &mut Vec<u8>, n: Option<u64>) {
    match n {
        Some(n) => number(out, n),
        None => out.extend_from_slice(b"null"),
    }
}

/// A JSON string with serde_json's escapes: `"` and `\` escaped, the
/// control characters below 0x20 as `\b \t \n \f \r` or `\u00XX`
/// (lowercase hex), everything else (DEL and non-ASCII included) as is.
fn string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0x00..=0x1f => &[],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use proptest::prelude::*;

    use super::*;
    use crate::v1::LimitedBy;

    fn tier() -> impl Strategy<Value = Option<TierContext>> {
        proptest::option::of(
            (any::<u32>(), any::<u64>(), any::<u64>(), any::<bool>()).prop_map(
                |(index, limit, hits, burst)| TierContext {
                    index,
                    limit,
                    hits,
                    burst,
                },
            ),
        )
    }

    fn limit_status() -> impl Strategy<Value = LimitStatus> {
        (
            (any::<String>(), any::<String>(), any::<u64>(), any::<u64>()),
            (any::<u64>(), any::<Option<u64>>(), tier(), any::<bool>()),
        )
            .prop_map(
                |(
                    (name, algorithm, limit, remaining),
                    (reset_after_ns, retry_after_ns, tier, shadow),
                )| LimitStatus {
                    name,
                    algorithm,
                    limit,
                    remaining,
                    reset_after_ns,
                    retry_after_ns,
                    tier,
                    shadow,
                },
            )
    }

    fn response() -> impl Strategy<Value = RateResponse> {
        (
            (
                proptest::collection::vec(limit_status(), 0..3),
                prop_oneof![Just(String::new()), any::<String>()],
            ),
            (any::<bool>(), any::<u64>(), any::<u64>(), any::<u64>()),
            (any::<Option<u64>>(), any::<u64>(), any::<u64>(), -2i32..8),
            tier(),
            (
                any::<Option<u64>>(),
                any::<Option<u64>>(),
                any::<Option<u64>>(),
                any::<Option<u64>>(),
            ),
            (any::<bool>(), any::<bool>(), any::<bool>(), any::<String>()),
        )
            .prop_map(
                |(
                    (limits, limited_by_name),
                    (allowed, granted, limit, remaining),
                    (retry_after_ns, reset_after_ns, wait_ns, limited_by),
                    tier,
                    (hard_limit, global_limit, domain_hits_last_second, global_hits_last_second),
                    (shadowed, ignored, unconfigured, algorithm),
                )| RateResponse {
                    allowed,
                    granted,
                    limit,
                    remaining,
                    retry_after_ns,
                    reset_after_ns,
                    wait_ns,
                    limited_by,
                    tier,
                    hard_limit,
                    global_limit,
                    domain_hits_last_second,
                    global_hits_last_second,
                    shadowed,
                    ignored,
                    unconfigured,
                    algorithm,
                    limits,
                    limited_by_name,
                },
            )
    }

    proptest! {
        #[test]
        fn writes_what_serde_json_writes(r in response()) {
            let mut out = Vec::new();
            write_rate_response(&r, &mut out);
            prop_assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&r).unwrap());
        }
    }

    #[test]
    fn every_control_character_and_quote_is_escaped_as_serde_json_does() {
        let algorithm: String = (0u8..0x80).map(char::from).chain(['é', '☃']).collect();
        let r = RateResponse {
            algorithm,
            limited_by: LimitedBy::Global as i32,
            ..RateResponse::default()
        };
        let mut out = Vec::new();
        write_rate_response(&r, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            serde_json::to_string(&r).unwrap()
        );
    }
}
