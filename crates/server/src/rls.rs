//! Envoy's rate-limit service v3 (`envoy.service.ratelimit.v3.RateLimitService`,
//! `ShouldRateLimit`), wire-compatible with Envoy and answering as
//! envoyproxy/ratelimit does. `docs/envoy-rls.md` is the reference.
//!
//! The request's `domain` is the tollgate namespace; its descriptors are
//! decided together by [`Limiter::request_descriptors`] — matching, nested
//! descriptors, `replaces`, shadow mode, unknown domains and the
//! all-or-nothing consumption all live there. This module only checks the
//! input, works out how many hits to charge, and turns the outcome into
//! Envoy's per-descriptor statuses (with the limit *as configured*, which
//! the compiled algorithm no longer knows: it comes from the config's
//! [`EnvoyMeta`](tollgate_config::EnvoyMeta)).
//!
//! [`should_rate_limit`] is shared with envoyproxy/ratelimit's `POST /json`
//! ([`crate::rls_json`]).
//!
//! [`Limiter::request_descriptors`]: tollgate_service::Limiter::request_descriptors

use std::sync::Arc;
use std::time::Instant;

use tollgate_config::model::{EnvoyLimit, EnvoyUnit};
use tollgate_core::{Algorithm, Hits, Mode, Nanos};
use tollgate_proto::rls::rate_limit_response::{
    self, rate_limit::Unit, Code, DescriptorStatus as WireStatus, RateLimit,
};
use tollgate_proto::rls::{HeaderValue, RateLimitDescriptor, RateLimitRequest, RateLimitResponse};
use tollgate_service::view::{Listed, Main, NamespaceView, ResourceEntry, ResourceView};
use tollgate_service::{DescriptorRequest, DescriptorStatus, ServiceError};
use tollgate_store::Store;
use tonic::{Request, Response, Status};

use crate::app::App;
use crate::errors::{malformed, status};
use crate::spans::{Caller, Decision, Outcome};
use crate::{decision_log, metrics as m};

/// The response header naming the limit of the descriptor closest to its
/// limit (envoyproxy/ratelimit's default name).
pub const LIMIT_HEADER: &str = "RateLimit-Limit";
/// The response header with that descriptor's remaining hits.
pub const REMAINING_HEADER: &str = "RateLimit-Remaining";
/// The response header with the whole seconds until that descriptor's limit
/// resets.
pub const RESET_HEADER: &str = "RateLimit-Reset";

/// Implements `envoy.service.ratelimit.v3.RateLimitService`.
pub struct Rls<S> {
    app: Arc<App<S>>,
    headers: bool,
}

impl<S> Rls<S> {
    /// The service over `app`, without response headers.
    pub fn new(app: Arc<App<S>>) -> Rls<S> {
        Rls {
            app,
            headers: false,
        }
    }

    /// Whether responses carry the `RateLimit-Limit`, `RateLimit-Remaining`
    /// and `RateLimit-Reset` headers in `response_headers_to_add`, as
    /// envoyproxy/ratelimit does with `LIMIT_RESPONSE_HEADERS_ENABLED`.
    pub fn with_headers(self, on: bool) -> Rls<S> {
        Rls {
            headers: on,
            ..self
        }
    }
}

#[tonic::async_trait]
impl<S: Store> tollgate_proto::rls::rate_limit_service_server::RateLimitService for Rls<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let caller = self.app.caller_from_grpc(request.metadata());
        decide(&self.app, request.get_ref(), self.headers, "rls", &caller)
            .await
            .map(Response::new)
            .map_err(|e| status(&e))
    }
}

/// Answers one `ShouldRateLimit` request, without response headers.
pub async fn should_rate_limit<S: Store>(
    app: &App<S>,
    req: &RateLimitRequest,
) -> Result<RateLimitResponse, ServiceError> {
    should_rate_limit_with(app, req, false).await
}

/// Answers one `ShouldRateLimit` request; with `headers`, the response
/// carries the `RateLimit-*` headers describing the descriptor with the
/// fewest hits remaining.
pub async fn should_rate_limit_with<S: Store>(
    app: &App<S>,
    req: &RateLimitRequest,
    headers: bool,
) -> Result<RateLimitResponse, ServiceError> {
    decide(app, req, headers, "rls", &Caller::NONE).await
}

/// [`should_rate_limit_with`], recording metrics under `surface` (the JSON
/// form counts as its own surface) and, when spans are on, a span that is
/// a child of `caller`'s trace.
pub(crate) async fn decide<S: Store>(
    app: &App<S>,
    req: &RateLimitRequest,
    headers: bool,
    surface: &'static str,
    caller: &Caller,
) -> Result<RateLimitResponse, ServiceError> {
    let started = Instant::now();
    let mut traced = Traced::default();
    let result = answer(app, req, headers, surface, &mut traced).await;
    m::latency(surface, started.elapsed().as_secs_f64());
    if let Err(e) = &result {
        m::error(surface, e.reason());
    }
    if app.spans_on() {
        let (outcome, granted) = match &result {
            Ok(r) if r.overall_code == Code::Ok as i32 => (Outcome::Granted, traced.hits),
            Ok(_) => (Outcome::Rejected, 0),
            Err(e) => (Outcome::Error(e.reason()), 0),
        };
        // A request refused before the store was asked spent no time there.
        let times = traced.store.unwrap_or_else(|| {
            let now = app.now();
            (now, now)
        });
        app.record_span(
            caller,
            times,
            &Decision {
                name: "tollgate.should_rate_limit",
                surface,
                namespace: &req.domain,
                resource: None,
                descriptors: Some(&req.descriptors),
                hits: traced.hits,
                granted,
                outcome,
            },
        );
    }
    result
}

/// What [`answer`] learns that a decision span reports.
#[derive(Default)]
struct Traced {
    /// When the store was asked and when it answered (app clock), if it
    /// was asked and spans are on.
    store: Option<(Nanos, Nanos)>,
    /// The hits charged to every descriptor (0 when the request was
    /// refused before they were worked out).
    hits: u64,
}

async fn answer<S: Store>(
    app: &App<S>,
    req: &RateLimitRequest,
    headers: bool,
    surface: &'static str,
    traced: &mut Traced,
) -> Result<RateLimitResponse, ServiceError> {
    let Checked {
        descriptors,
        hits,
        descriptor_hits,
        mode,
        refunds,
        limits,
    } = check(req)?;
    traced.hits = hits;
    let now = app.now();
    let outcome = app
        .service()
        .request_descriptors(&DescriptorRequest {
            namespace: &req.domain,
            descriptors: &descriptors,
            hits,
            mode,
            limits: &limits,
            descriptor_hits: &descriptor_hits,
            refunds: &refunds,
        })
        .await;
    if app.spans_on() {
        traced.store = Some((now, app.now()));
    }
    let outcome = outcome?;
    // Loaded after the decision: only a reload landing in between could
    // make it differ from the limiter's, and then the freshest limits are
    // the better ones to report.
    let view = app.limiter().view();
    let ns = view.namespace(&req.domain);
    let statuses: Vec<WireStatus> = outcome
        .statuses
        .iter()
        .zip(&descriptors)
        .map(|(s, d)| {
            let entry = ns.and_then(|ns| entry_of(ns, d, s));
            wire_status(s, entry, now)
        })
        .collect();
    for s in &outcome.statuses {
        // A check's hits only when the whole request is OK; usage (a
        // `report: true` descriptor's hits, a refund) whatever it says, as
        // its counters took it (`DescriptorStatus::charged`).
        m::rate_decision(
            surface,
            &req.domain,
            s.resource.as_deref().unwrap_or_default(),
            s.resource.is_some(),
            s.allowed,
            s.charged,
            s.mode,
        );
        // Near the limit, per descriptor as upstream counts it, only for
        // hits actually charged (a check of a request that is OK, a report
        // whatever the answer). A descriptor over its limit but let through
        // (shadow mode, `ignore_configured`) is over, not near, as upstream
        // counts it. Giving back never brings a limit nearer (as on the
        // native API); a report does.
        // A `limits:` list is near when any of its limits is: when its
        // fullest one is.
        if s.charged > 0 && s.mode != Mode::Refund && !s.unlimited && !s.shadowed {
            if let (Some(resource), Some(d)) = (s.resource.as_deref(), s.decision) {
                let near =
                    |d: &tollgate_core::Decision| app.near_limit().is_near(d.limit, d.remaining);
                if near(&d) || s.fullest.as_ref().is_some_and(near) {
                    m::near_limit(surface, &req.domain, resource);
                }
            }
        }
    }
    if let Some(log) = app.decision_log().filter(|l| l.sampled()) {
        log.write(&decision_log::Line {
            time_ms: decision_log::time_ms(now),
            namespace: &req.domain,
            resource: None,
            domain: None,
            descriptors: Some(
                descriptors
                    .iter()
                    .map(|d| {
                        d.iter()
                            .map(|(key, value)| decision_log::Entry { key, value })
                            .collect()
                    })
                    .collect(),
            ),
            limit: None,
            // Only when some descriptor brought one: `limits` is empty
            // otherwise, and nothing is allocated.
            descriptor_limits: (!limits.is_empty()).then(|| {
                limits
                    .iter()
                    .map(|l| {
                        l.map(|l| decision_log::Brought {
                            requests_per_unit: l.requests_per_unit,
                            unit: l.unit.as_str(),
                        })
                    })
                    .collect()
            }),
            descriptor_hits: (!descriptor_hits.is_empty()).then_some(&descriptor_hits[..]),
            descriptor_refunds: (!refunds.is_empty()).then_some(&refunds[..]),
            hits,
            min_hits: hits,
            mode: mode.as_str(),
            surface,
            decision: decision_log::Answer {
                allowed: outcome.allowed,
                granted: if outcome.allowed { hits } else { 0 },
                remaining: None,
                limited_by: None,
                limited_by_name: None,
            },
        });
    }
    let response_headers_to_add = if headers {
        limit_headers(&statuses)
    } else {
        Vec::new()
    };
    let overall = if outcome.allowed {
        Code::Ok
    } else {
        Code::OverLimit
    };
    Ok(RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        response_headers_to_add,
        ..RateLimitResponse::default()
    })
}

/// A request that passed [`check`].
#[derive(Debug)]
struct Checked {
    /// The descriptors as the limiter takes them: `(key, value)` entries.
    descriptors: Vec<Vec<(String, String)>>,
    /// The hits to charge every one of them: their own when they all give
    /// the same, else the request's.
    hits: u64,
    /// Per descriptor: its own hits, when the descriptors' hits differ
    /// (each is then charged its own); empty otherwise.
    descriptor_hits: Vec<Option<u64>>,
    /// `try`, or `refund` when every descriptor sets `is_negative_hits`.
    mode: Mode,
    /// Per descriptor, when some but not all set `is_negative_hits`:
    /// whether it does (it is refunded, the others checked); empty
    /// otherwise.
    refunds: Vec<bool>,
    /// Per descriptor: the limit it brought of its own (`limit`); empty
    /// when none did.
    limits: Vec<Option<EnvoyLimit>>,
}

/// The descriptors as the limiter takes them, and the hits to charge; or
/// what is wrong with the request.
///
/// Hits: a descriptor's own `hits_addend`, when set, overrides the
/// request's (0 then means "check, charge nothing"); the request's
/// `hits_addend` of 0 means 1, as envoyproxy/ratelimit reads it. Each
/// descriptor is charged its own hits, all descriptors still all or
/// nothing.
///
/// Mode: descriptors with `is_negative_hits` (Envoy's newer field) give
/// their hits back, a refund, whatever the others' check says; when every
/// descriptor sets it the request is one refund.
fn check(req: &RateLimitRequest) -> Result<Checked, ServiceError> {
    if req.domain.is_empty() {
        return Err(malformed("rate limit domain must not be empty"));
    }
    if req.descriptors.is_empty() {
        return Err(malformed("rate limit descriptor list must not be empty"));
    }
    let default_hits = u64::from(req.hits_addend.max(1));
    let mut out = Vec::with_capacity(req.descriptors.len());
    let mut limits = Vec::new();
    for (i, d) in req.descriptors.iter().enumerate() {
        out.push(entries(i, d)?);
        if let Some(own) = &d.limit {
            if limits.is_empty() {
                limits.resize(req.descriptors.len(), None);
            }
            limits[i] = Some(brought_limit(i, own)?);
        }
    }
    let wanted = |d: &RateLimitDescriptor| d.hits_addend.as_ref().map_or(default_hits, |h| h.value);
    let first = wanted(&req.descriptors[0]);
    let (hits, descriptor_hits) = if req.descriptors.iter().all(|d| wanted(d) == first) {
        (first, Vec::new())
    } else {
        let own = req
            .descriptors
            .iter()
            .map(|d| d.hits_addend.as_ref().map(|h| h.value))
            .collect();
        (default_hits, own)
    };
    let negative = req
        .descriptors
        .iter()
        .filter(|d| d.is_negative_hits)
        .count();
    let (mode, refunds) = if negative == 0 {
        (Mode::Try, Vec::new())
    } else if negative == req.descriptors.len() {
        (Mode::Refund, Vec::new())
    } else {
        let each = req.descriptors.iter().map(|d| d.is_negative_hits).collect();
        (Mode::Try, each)
    };
    Ok(Checked {
        descriptors: out,
        hits,
        descriptor_hits,
        mode,
        refunds,
        limits,
    })
}

/// Descriptor `i`'s `limit` (Envoy's `RateLimitOverride`) as tollgate's:
/// a unit Envoy does not name (`UNKNOWN`, or a number past `YEAR`) is a
/// malformed request, not a guess.
fn brought_limit(
    i: usize,
    own: &tollgate_proto::rls::rate_limit_descriptor::RateLimitOverride,
) -> Result<EnvoyLimit, ServiceError> {
    let unit = match Unit::try_from(own.unit) {
        Ok(Unit::Second) => EnvoyUnit::Second,
        Ok(Unit::Minute) => EnvoyUnit::Minute,
        Ok(Unit::Hour) => EnvoyUnit::Hour,
        Ok(Unit::Day) => EnvoyUnit::Day,
        Ok(Unit::Month) => EnvoyUnit::Month,
        Ok(Unit::Year) => EnvoyUnit::Year,
        _ => {
            return Err(malformed(format!(
                "descriptor {i}: its limit override has no unit (unit {}): expected SECOND to YEAR",
                own.unit
            )))
        }
    };
    Ok(EnvoyLimit {
        requests_per_unit: u64::from(own.requests_per_unit),
        unit,
    })
}

/// Descriptor `i`'s entries, each with a key.
fn entries(i: usize, d: &RateLimitDescriptor) -> Result<Vec<(String, String)>, ServiceError> {
    if d.entries.is_empty() {
        return Err(malformed(format!("descriptor {i} has no entries")));
    }
    d.entries
        .iter()
        .enumerate()
        .map(|(j, e)| {
            if e.key.is_empty() {
                Err(malformed(format!("descriptor {i}, entry {j}: empty key")))
            } else {
                Ok((e.key.clone(), e.value.clone()))
            }
        })
        .collect()
}

/// The resource entry that decided a descriptor. Found through the tree,
/// as the limiter found it, because two limits may share a name (dots
/// inside keys); by name if the tree now says otherwise (a reload).
fn entry_of<'v>(
    ns: &'v NamespaceView,
    descriptor: &[(String, String)],
    status: &DescriptorStatus,
) -> Option<&'v ResourceEntry> {
    let resource = status.resource.as_deref()?;
    let named = |e: &&ResourceEntry| e.name == resource;
    // Where the deciding view had it; a reload in between may have moved
    // it, and then the tree, then the name, find it in this view.
    status
        .entry
        .and_then(|i| ns.resources.get(i))
        .filter(named)
        .or_else(|| {
            ns.descriptors
                .as_ref()
                .and_then(|tree| tree.find(descriptor))
                .and_then(|m| ns.resources.get(m.resource))
                .filter(named)
        })
        .or_else(|| ns.resource(resource))
}

/// One descriptor's status on the wire.
///
/// - No limit (no match, replaced) or an `unlimited` one: OK and nothing
///   else, as upstream answers.
/// - Otherwise `current_limit` is the limit as configured
///   (`requests_per_unit` per `unit`, and its `name`); an algorithm
///   extension that is not "N per unit" reports its headline limit with
///   unit `UNKNOWN`. `limit_remaining` and `duration_until_reset` come from
///   the decision, except that a descriptor over its limit has 0 remaining
///   and a reset that is never 0 (see `docs/envoy-rls.md` §3). A
///   descriptor no decision was made for (a
///   `requests_per_unit: 0` limit, or any descriptor of a request such a
///   limit rejected before anything was looked at) has 0 remaining and
///   resets at the end of its unit's window, as upstream computes it.
fn wire_status(s: &DescriptorStatus, entry: Option<&ResourceEntry>, now: Nanos) -> WireStatus {
    let code = if s.allowed { Code::Ok } else { Code::OverLimit };
    let mut out = WireStatus {
        code: code as i32,
        ..WireStatus::default()
    };
    if s.resource.is_none() || s.unlimited {
        return out;
    }
    // A limit the descriptor brought decided it, not the config's entry.
    let entry = if s.limit_override.is_some() {
        None
    } else {
        entry
    };
    let meta = entry.and_then(|e| e.envoy.as_ref());
    // Of a `rate_limit` list: the binding limit, by its own name and terms.
    let listed = s
        .limit
        .and_then(|at| listed_limit(entry, s.domain.as_deref(), at));
    let (limit, name) = match (s.limit_override, listed) {
        (Some(own), _) => (Some(own), String::new()),
        (None, Some(l)) => (l.envoy, l.name.to_string()),
        (None, None) => (
            meta.and_then(|m| m.limit),
            meta.and_then(|m| m.name.clone()).unwrap_or_default(),
        ),
    };
    out.current_limit = match (limit, s.decision) {
        (Some(l), _) => Some(RateLimit {
            name,
            requests_per_unit: saturate(l.requests_per_unit),
            unit: wire_unit(l.unit) as i32,
        }),
        (None, Some(d)) => Some(RateLimit {
            name,
            requests_per_unit: saturate(d.limit),
            unit: Unit::Unknown as i32,
        }),
        (None, None) => None,
    };
    // Over its limit (rejected, or shadowed and over): 0 remaining, as
    // upstream answers, even when the counter kept room for fewer hits
    // than were asked (all or nothing charged none of them). A 429 saying
    // "5 remaining" reads as a bug to every client of Envoy's headers.
    let over = !s.allowed || s.shadowed;
    out.limit_remaining = match s.decision {
        Some(d) if !over => saturate(d.remaining),
        _ => 0,
    };
    let reset = match (s.decision, limit) {
        (Some(d), _) if !over || d.reset_after > Nanos::ZERO => Some(d.reset_after),
        // Over with a counter holding nothing: the request alone asks
        // more than the limit. "Fresh now" would invite a retry that
        // fails the same way; say when a used-up counter is fresh again,
        // as its own algorithm tells (for a native limit, an epoch-aligned
        // fixed window, the end of the unit's window; for an extension
        // with a unit, such as a first_hit day, not UTC midnight).
        (Some(_), l) => {
            let fresh = fresh_again_once_spent(entry, s.domain.as_deref(), s.limit, now);
            match l {
                Some(l) if fresh == Nanos::ZERO => Some(until_window_end(l, now)),
                _ => Some(fresh),
            }
        }
        // No decision (`requests_per_unit: 0` rejected it unlooked at):
        // the end of the unit's window, as upstream computes it.
        (None, Some(l)) => Some(until_window_end(l, now)),
        (None, None) => None,
    };
    if let Some(reset) = reset {
        // The wire type is not re-exported by name; the field names it.
        let d = out
            .duration_until_reset
            .get_or_insert_with(Default::default);
        d.seconds = i64::try_from(reset.as_u64() / 1_000_000_000).unwrap_or(i64::MAX);
        d.nanos = i32::try_from(reset.as_u64() % 1_000_000_000).unwrap_or(0);
    }
    out
}

/// How long the descriptor's counter would take to be fresh again if it
/// were used up now, as its own algorithm decides (native limit or
/// extension alike): what an over-limit descriptor reports when its
/// counter holds nothing. Zero when the entry has no algorithm to ask.
fn fresh_again_once_spent(
    entry: Option<&ResourceEntry>,
    domain: Option<&str>,
    listed: Option<usize>,
    now: Nanos,
) -> Nanos {
    let Some(ResourceView::Rate(rate)) = entry.map(|e| &e.view) else {
        return Nanos::ZERO;
    };
    let limit = match (&rate.for_domain(domain.unwrap_or_default()).main, listed) {
        (Main::Limited(compiled), None) => &compiled.limit,
        (Main::Listed(list), Some(at)) => match list.get(at) {
            Some(l) => &l.compiled.limit,
            None => return Nanos::ZERO,
        },
        _ => return Nanos::ZERO,
    };
    let mut state = limit.fresh();
    // Every hit it has room for, from a fresh state: used up.
    limit
        .decide(&mut state, now, Hits::between(1, u64::MAX))
        .reset_after
}

/// The limit at position `at` of the `limits:` list that decides `domain`
/// of `entry`'s resource.
fn listed_limit<'e>(
    entry: Option<&'e ResourceEntry>,
    domain: Option<&str>,
    at: usize,
) -> Option<&'e Listed> {
    let ResourceView::Rate(rate) = &entry?.view else {
        return None;
    };
    match &rate.for_domain(domain.unwrap_or_default()).main {
        Main::Listed(list) => list.get(at),
        _ => None,
    }
}

/// Time until the current epoch-aligned window of `limit`'s unit ends.
fn until_window_end(limit: EnvoyLimit, now: Nanos) -> Nanos {
    let window = limit.unit.window().as_u64().max(1);
    Nanos::new(window - now.as_u64() % window)
}

fn wire_unit(unit: EnvoyUnit) -> Unit {
    match unit {
        EnvoyUnit::Second => Unit::Second,
        EnvoyUnit::Minute => Unit::Minute,
        EnvoyUnit::Hour => Unit::Hour,
        EnvoyUnit::Day => Unit::Day,
        EnvoyUnit::Week => Unit::Week,
        EnvoyUnit::Month => Unit::Month,
        EnvoyUnit::Year => Unit::Year,
    }
}

/// The wire's counts are 32 bits; a larger count (an extension's limit,
/// an unlimited remaining) reads as the largest.
fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// `RateLimit-Limit`, `-Remaining` and `-Reset` for the descriptor with a
/// limit that has the fewest hits remaining (the first of equals), as
/// envoyproxy/ratelimit picks it; none when no descriptor has a limit.
/// Reset is in whole seconds, rounded up so that it never says "now" early.
fn limit_headers(statuses: &[WireStatus]) -> Vec<HeaderValue> {
    let closest = statuses
        .iter()
        .filter_map(|s| s.current_limit.as_ref().map(|l| (s, l)))
        .min_by_key(|(s, _)| s.limit_remaining);
    let Some((s, limit)) = closest else {
        return Vec::new();
    };
    let reset = s.duration_until_reset.as_ref().map_or(0, |d| {
        let whole = u64::try_from(d.seconds).unwrap_or(0);
        whole.saturating_add(u64::from(d.nanos > 0))
    });
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    };
    vec![
        header(LIMIT_HEADER, limit.requests_per_unit.to_string()),
        header(REMAINING_HEADER, s.limit_remaining.to_string()),
        header(RESET_HEADER, reset.to_string()),
    ]
}

/// The name of a response code, as protojson writes it.
pub(crate) fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// The name of a unit, as protojson writes it.
pub(crate) fn unit_name(unit: i32) -> &'static str {
    rate_limit_response::rate_limit::Unit::try_from(unit).map_or("UNKNOWN", |u| u.as_str_name())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tollgate_proto::rls::descriptor;

    fn with_hits(mut d: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
        d.hits_addend.get_or_insert_with(Default::default).value = hits;
        d
    }

    fn request(descriptors: Vec<RateLimitDescriptor>, hits_addend: u32) -> RateLimitRequest {
        RateLimitRequest {
            domain: "d".into(),
            descriptors,
            hits_addend,
        }
    }

    #[test]
    fn hits_follow_upstream() {
        let one = descriptor(&[("k", "v")]);
        assert_eq!(check(&request(vec![one.clone()], 0)).unwrap().hits, 1);
        assert_eq!(check(&request(vec![one.clone()], 7)).unwrap().hits, 7);
        // A descriptor's own hits_addend overrides, 0 included.
        let own = with_hits(one.clone(), 0);
        assert_eq!(check(&request(vec![own], 7)).unwrap().hits, 0);
        let both = vec![with_hits(one.clone(), 3), with_hits(one.clone(), 3)];
        assert_eq!(check(&request(both, 9)).unwrap().hits, 3);
        let huge = with_hits(one.clone(), u64::MAX);
        assert_eq!(check(&request(vec![huge], 0)).unwrap().hits, u64::MAX);
        // Hits that differ: each descriptor's own, the request's for the
        // others.
        let differ = vec![with_hits(one.clone(), 3), one];
        let checked = check(&request(differ, 4)).unwrap();
        assert_eq!(checked.hits, 4);
        assert_eq!(checked.descriptor_hits, [Some(3), None]);
    }

    #[test]
    fn bad_requests_are_named() {
        let ok = descriptor(&[("k", "v")]);
        let msg = |r: RateLimitRequest| check(&r).unwrap_err().to_string();
        let mut no_domain = request(vec![ok.clone()], 0);
        no_domain.domain.clear();
        assert!(msg(no_domain).contains("domain must not be empty"));
        assert!(msg(request(vec![], 0)).contains("descriptor list must not be empty"));
        assert!(msg(request(vec![ok.clone(), descriptor(&[])], 0))
            .contains("descriptor 1 has no entries"));
        assert!(msg(request(vec![descriptor(&[("a", "b"), ("", "x")])], 0))
            .contains("descriptor 0, entry 1: empty key"));
    }

    #[test]
    fn negative_hits_make_a_refund() {
        let mut negative = descriptor(&[("k", "v")]);
        negative.is_negative_hits = true;
        let checked = check(&request(vec![negative.clone(), negative], 7)).unwrap();
        assert_eq!((checked.hits, checked.mode), (7, Mode::Refund));
        let checked = check(&request(vec![descriptor(&[("k", "v")])], 7)).unwrap();
        assert_eq!(checked.mode, Mode::Try);
        assert!(checked.refunds.is_empty());
        // Some but not all: a check, with those refunds marked.
        let mut negative = descriptor(&[("k", "v")]);
        negative.is_negative_hits = true;
        let mixed = vec![descriptor(&[("k", "w")]), negative];
        let checked = check(&request(mixed, 7)).unwrap();
        assert_eq!(checked.mode, Mode::Try);
        assert_eq!(checked.refunds, [false, true]);
    }

    #[test]
    fn headers_describe_the_descriptor_closest_to_its_limit() {
        let status = |remaining: u32, secs: i64, nanos: i32| {
            let mut s = WireStatus {
                code: Code::Ok as i32,
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: 10 + remaining,
                    unit: Unit::Minute as i32,
                }),
                limit_remaining: remaining,
                ..WireStatus::default()
            };
            let d = s.duration_until_reset.get_or_insert_with(Default::default);
            d.seconds = secs;
            d.nanos = nanos;
            s
        };
        let none = WireStatus::default();
        let h = limit_headers(&[
            none.clone(),
            status(5, 10, 0),
            status(2, 3, 1),
            status(2, 9, 0),
        ]);
        let pairs: Vec<(&str, &str)> = h
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                (LIMIT_HEADER, "12"),
                (REMAINING_HEADER, "2"),
                (RESET_HEADER, "4")
            ]
        );
        assert!(limit_headers(&[none]).is_empty());
    }

    #[test]
    fn window_ends_are_epoch_aligned() {
        let limit = EnvoyLimit {
            requests_per_unit: 1,
            unit: EnvoyUnit::Minute,
        };
        let now = Nanos::from_secs(120 + 45);
        assert_eq!(until_window_end(limit, now), Nanos::from_secs(15));
        assert_eq!(
            until_window_end(limit, Nanos::from_secs(120)),
            Nanos::from_secs(60)
        );
    }
}
