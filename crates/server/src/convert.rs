//! Service outcomes as wire messages: one place, shared by the gRPC and
//! HTTP surfaces (the HTTP API's JSON bodies are the same messages).

use tollgate_config::model::{EnvoyLimit, EnvoyUnit};
use tollgate_core::{Mode, Nanos};
use tollgate_proto::{v1, RateRequestView};
use tollgate_service::{
    Counters, LimitDetail, LimitedBy, RateOutcome, RateRequest, ReserveOutcome, ServiceError,
};
use tollgate_store::Seized;

/// The service's view of a wire rate request. A `mode` the proto does
/// not define is refused, as the HTTP API refuses an unknown name: read
/// as `MODE_TRY`, a client that meant some other mode would be answered
/// as if it had asked for something it did not.
pub fn rate_request(r: RateRequestView<'_>) -> Result<RateRequest<'_>, ServiceError> {
    let mode = match v1::Mode::try_from(r.mode) {
        Ok(v1::Mode::Try) => Mode::Try,
        Ok(v1::Mode::Acquire) => Mode::Acquire,
        Ok(v1::Mode::Report) => Mode::Report,
        Ok(v1::Mode::Refund) => Mode::Refund,
        Err(_) => {
            return Err(ServiceError::Malformed(format!(
                "mode {} is not a mode: expected MODE_TRY (0), MODE_ACQUIRE (1), \
                 MODE_REPORT (2) or MODE_REFUND (3)",
                r.mode
            )))
        }
    };
    let limit = match r.limit {
        None => None,
        Some((requests_per_unit, unit)) => {
            let Some(unit) = EnvoyUnit::parse(unit) else {
                return Err(ServiceError::Malformed(format!(
                    "limit.unit {:?} is not a unit: expected second, minute, hour, day, week, month or year",
                    unit.chars().take(32).collect::<String>()
                )));
            };
            Some(EnvoyLimit {
                requests_per_unit,
                unit,
            })
        }
    };
    Ok(RateRequest {
        namespace: r.namespace,
        resource: r.resource,
        domain: r.domain,
        hits: r.hits_or_default(),
        min_hits: r.min_hits_or_default(),
        mode,
        limit,
    })
}

fn limited_by(l: Option<LimitedBy>) -> v1::LimitedBy {
    match l {
        None => v1::LimitedBy::None,
        Some(LimitedBy::Limit) => v1::LimitedBy::Limit,
        Some(LimitedBy::Tier) => v1::LimitedBy::Tier,
        Some(LimitedBy::Hard) => v1::LimitedBy::Hard,
        Some(LimitedBy::Global) => v1::LimitedBy::Global,
        Some(LimitedBy::Deny) => v1::LimitedBy::Deny,
    }
}

/// A rate outcome with all of Charon §3.1's context.
pub fn rate_response(o: &RateOutcome) -> v1::RateResponse {
    let d = &o.decision;
    v1::RateResponse {
        allowed: o.allowed,
        granted: o.granted,
        limit: d.limit,
        remaining: d.remaining,
        retry_after_ns: d.retry_after.map(Nanos::as_u64),
        reset_after_ns: d.reset_after.as_u64(),
        wait_ns: d.wait.as_u64(),
        limited_by: limited_by(o.limited_by) as i32,
        tier: o.tier.map(tier_context),
        hard_limit: o.hard_limit,
        global_limit: o.global_limit,
        domain_hits_last_second: o.domain_hits_last_second,
        global_hits_last_second: o.global_hits_last_second,
        shadowed: o.shadowed,
        ignored: o.ignored,
        unconfigured: o.unconfigured,
        algorithm: o.algorithm.to_owned(),
        limits: o.limits.iter().map(limit_status).collect(),
        limited_by_name: match (&o.limit_name, o.limited_by) {
            (Some(name), Some(LimitedBy::Limit | LimitedBy::Tier)) => name.to_string(),
            _ => String::new(),
        },
    }
}

/// One limit's own state, after a decision or as inspected.
pub fn limit_status(l: &LimitDetail) -> v1::LimitStatus {
    let d = &l.decision;
    v1::LimitStatus {
        name: l.name.to_string(),
        algorithm: l.algorithm.to_owned(),
        limit: d.limit,
        remaining: d.remaining,
        reset_after_ns: d.reset_after.as_u64(),
        retry_after_ns: d.retry_after.map(Nanos::as_u64),
        tier: d.tier.map(tier_context),
        shadow: l.shadow,
    }
}

fn tier_context(t: tollgate_core::TierInfo) -> v1::TierContext {
    v1::TierContext {
        index: t.index,
        limit: t.limit,
        hits: t.hits,
        burst: t.burst,
    }
}

/// A reservation with its domain, global and group context.
pub fn reserve_response(o: &ReserveOutcome) -> v1::ReserveResponse {
    let r = &o.reservation;
    let c = &r.context;
    v1::ReserveResponse {
        allowed: r.allowed,
        granted: r.granted,
        groups: r.groups.clone(),
        domain_limit: c.domain_limit,
        global_limit: c.global_limit,
        domain_holds: c.domain_holds,
        global_holds: c.global_holds,
        group_limits: group_contexts(&c.groups),
        hold_id: String::new(),
        shadowed: o.shadowed,
        ignored: o.ignored,
    }
}

/// Seized copies, with the names their pool was made of.
pub fn seize_response(s: &Seized) -> v1::SeizeResponse {
    let (namespace, resource) = s.pool.parts();
    v1::SeizeResponse {
        namespace,
        resource,
        domain: s.staged.domain.clone(),
        copies: s.staged.copies,
        groups: s.staged.groups.clone(),
        hold_id: String::new(),
    }
}

/// An inspection's answer (`GET /v1/counters`, gRPC `Inspect`).
pub fn counters_response(
    namespace: &str,
    resource: &str,
    domain: &str,
    c: &Counters,
) -> v1::CountersResponse {
    let mut out = v1::CountersResponse {
        namespace: namespace.to_owned(),
        resource: resource.to_owned(),
        domain: domain.to_owned(),
        ..Default::default()
    };
    match c {
        Counters::Rate { limits, deny } => {
            out.limits = limits.iter().map(limit_status).collect();
            out.deny = *deny;
        }
        Counters::Copies(h) => {
            out.holds = Some(v1::Holds {
                domain_limit: h.domain_limit,
                global_limit: h.global_limit,
                domain_holds: h.domain_holds,
                global_holds: h.global_holds,
                groups: group_contexts(&h.groups),
            });
        }
    }
    out
}

/// Each group's limit and holds, as a reserve's answer and an
/// inspection's show them.
fn group_contexts(groups: &[tollgate_core::copies::GroupContext]) -> Vec<v1::GroupContext> {
    groups
        .iter()
        .map(|g| v1::GroupContext {
            name: g.name.clone(),
            limit: g.limit,
            holds: g.holds,
        })
        .collect()
}
