//! envoyproxy/ratelimit-style descriptors to a plan, and a decided plan
//! back to per-descriptor statuses: the pure halves of
//! [`Limiter::request_descriptors`](crate::Limiter::request_descriptors).
//!
//! Apart from the limiter so that upstream's matching rules (an unknown
//! domain is OK with no limit, `replaces` scoped to the request, `unlimited`,
//! `deny` and shadow mode per descriptor, identical descriptors sharing one
//! counter, all or nothing) are functions of the config view and the
//! request alone: no store, no clock, no await, so each rule has a unit
//! test. The limiter only loads the view, counts, and asks the store to
//! decide the plan built here.

use smallvec::SmallVec;
use tollgate_core::{Decision, Mode, Nanos, PlanDecision};
use tollgate_store::{Key, Plan};

use crate::error::ServiceError;
use crate::limiter::{DescriptorOutcome, DescriptorRequest, DescriptorStatus};
use crate::view::{Main, ResourceView, View};

impl DescriptorStatus {
    /// The status of a descriptor no limit applies to: allowed, nothing
    /// counted.
    fn unlimited_by_default() -> DescriptorStatus {
        DescriptorStatus {
            resource: None,
            entry: None,
            domain: None,
            allowed: true,
            decision: None,
            limit: None,
            limit_override: None,
            unlimited: false,
            shadowed: false,
            mode: Mode::Try,
            charged: 0,
            fullest: None,
        }
    }
}

/// The name a descriptor's status gives a limit it brought when the
/// config has no rule for it: a fixed label, never the descriptor's
/// values (which would be a stranger's metric label).
pub const BROUGHT_RESOURCE: &str = "(request limit)";

/// A limit a descriptor brought of its own (Envoy's descriptor `limit`),
/// built by the limiter: its id and algorithm, or `None` for a limit of 0.
#[derive(Clone, Debug)]
pub(crate) struct Brought {
    /// As the descriptor gave it.
    pub(crate) limit: tollgate_config::model::EnvoyLimit,
    /// Built and admitted by the store; `None`: 0 requests, refuses all.
    pub(crate) built: Option<(
        tollgate_store::LimitId,
        std::sync::Arc<tollgate_core::Limit>,
    )>,
}

/// What a descriptor request comes to before any limit is decided.
// Returned once per request and matched at once: boxing the plan would
// cost an allocation per request to save stack space for a moment.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Planned {
    /// The request's domain (the namespace) has no config: envoyproxy/ratelimit
    /// answers OK, with no limit, for every descriptor.
    UnknownDomain(DescriptorOutcome),
    /// A descriptor matched a `deny` limit outside shadow mode: the request
    /// is rejected and nothing is consumed.
    Denied(DescriptorOutcome),
    /// The plan to decide, all or nothing; then [`ToDecide::outcome`].
    Decide(ToDecide),
}

/// A plan of the descriptors' limits, and which item decides which
/// descriptor.
#[derive(Debug)]
pub(crate) struct ToDecide {
    /// One item per distinct counter, in the order descriptors first name
    /// them, with the namespace's affinity.
    pub(crate) plan: Plan,
    /// Per descriptor, in request order: what is known before deciding
    /// (resource, domain, unlimited, shadowed by a deny).
    statuses: Vec<DescriptorStatus>,
    /// Per descriptor: the plan item deciding it, if any; for a resource
    /// with a `limits:` list, the first of its limits' items, which follow
    /// it in the plan ([`ToDecide::widths`]).
    item_of: Vec<Option<usize>>,
    /// Per plan item: its resource is `report: true`, so a request with
    /// hits charges it in report mode (and one with none checks that it is
    /// not exhausted).
    reported: Vec<bool>,
    /// Per plan item: a descriptor with `is_negative_hits` names it, so it
    /// is refunded whatever the others' check says. Empty when no
    /// descriptor of a `try` request refunds.
    refunded: Vec<bool>,
    /// Per descriptor: its hits, when the descriptors' hits differ (each
    /// plan item is then asked its own, [`Plan::ask`]); empty when every
    /// descriptor takes the request's.
    hits: SmallVec<[u64; 4]>,
    /// Per descriptor: how many plan items decide it (a `limits:` list's
    /// length, else 1). Inline for the few descriptors a request has.
    widths: SmallVec<[usize; 4]>,
    /// A descriptor matched a `deny`: the request is refused and its
    /// checks only inspected, but the usage beside them (reports and
    /// refunds) is charged, as it is beside any refused check.
    pub(crate) denied: bool,
}

/// Matches the request's descriptors against the namespace's descriptor
/// tree and builds the plan of the limits that apply.
///
/// Errors: no descriptors ([`ServiceError::Malformed`]), and a namespace
/// with no descriptor tree ([`ServiceError::NoDescriptors`]).
pub(crate) fn plan(
    view: &View,
    req: &DescriptorRequest<'_>,
    brought: &[Option<Brought>],
) -> Result<Planned, ServiceError> {
    if req.descriptors.is_empty() {
        return Err(ServiceError::Malformed("no descriptors".into()));
    }
    let Some(ns) = view.namespace(req.namespace) else {
        return Ok(Planned::UnknownDomain(DescriptorOutcome {
            allowed: true,
            statuses: (0..req.descriptors.len())
                .map(|i| {
                    let mut status = DescriptorStatus::unlimited_by_default();
                    status.mode = asked_mode(req, i);
                    // Allowed, with no counter: it counts what it asked.
                    status.charged = req.hits_of(i);
                    status
                })
                .collect(),
        }));
    };
    let tree = ns
        .descriptors
        .as_ref()
        .ok_or_else(|| ServiceError::NoDescriptors(req.namespace.to_owned()))?;
    let matches: Vec<_> = req.descriptors.iter().map(|d| tree.find(d)).collect();
    // `replaces` is scoped to the request: a matched limit's name drops
    // every matched limit of that name (envoyproxy/ratelimit semantics).
    let replaced: Vec<&str> = matches
        .iter()
        .flatten()
        .filter_map(|m| ns.resources.get(m.resource))
        .filter_map(|r| r.envoy.as_ref())
        .flat_map(|e| e.replaces.iter().map(String::as_str))
        .collect();
    // Per descriptor, its hits when they differ from the request's (each
    // item is then asked its own); empty otherwise.
    let hits: SmallVec<[u64; 4]> = if req
        .descriptor_hits
        .iter()
        .any(|h| h.is_some_and(|h| h != req.hits))
    {
        (0..matches.len()).map(|i| req.hits_of(i)).collect()
    } else {
        SmallVec::new()
    };
    let refunds = req.mode == Mode::Try && req.refunds.contains(&true);
    let mut refunded: Vec<bool> = Vec::new();
    let mut statuses = Vec::with_capacity(matches.len());
    let mut plan = Plan::default().with_affinity(ns.affinity);
    // The plan item deciding each descriptor, if any.
    let mut item_of: Vec<Option<usize>> = Vec::with_capacity(matches.len());
    let mut reported = Vec::new();
    let mut widths: SmallVec<[usize; 4]> = SmallVec::new();
    let mut denied = false;
    for (i, m) in matches.into_iter().enumerate() {
        let mut status = DescriptorStatus::unlimited_by_default();
        status.mode = asked_mode(req, i);
        let mut item = None;
        let mut width = 1;
        // Matched to its limit; the replaced and brought cases leave early.
        'matched: {
            if let Some(Some(own)) = brought.get(i) {
                // A limit the descriptor brought decides it in place of the
                // config's, matched or not, keyed by the descriptor itself
                // (envoyproxy/ratelimit's rule); never in shadow, and never
                // dropped by `replaces`.
                let entry = m
                    .as_ref()
                    .and_then(|m| ns.resources.get(m.resource).map(|e| (m.resource, e)));
                status.resource = Some(
                    entry.map_or_else(|| BROUGHT_RESOURCE.to_owned(), |(_, e)| e.name.clone()),
                );
                status.entry = entry.map(|(at, _)| at);
                status.limit_override = Some(own.limit);
                let domain = tollgate_config::envoy::descriptor_domain(&req.descriptors[i]);
                match &own.built {
                    Some((id, limit)) => {
                        let at = plan.item_for(Key::new(*id, &domain), limit, false);
                        // A limit brought to a `report: true` descriptor is
                        // charged as the config's would be.
                        if at == reported.len() {
                            reported.push(entry.is_some_and(|(_, e)| e.report));
                        }
                        item = Some(at);
                    }
                    None => {
                        no_usage_to_deny(i, status.mode)?;
                        status.allowed = false;
                        denied = true;
                    }
                }
                status.domain = Some(domain);
                break 'matched;
            }
            if let Some((m, entry)) = m.and_then(|m| ns.resources.get(m.resource).map(|e| (m, e))) {
                let name = entry.envoy.as_ref().and_then(|e| e.name.as_deref());
                if name.is_some_and(|n| replaced.contains(&n)) {
                    break 'matched;
                }
                status.resource = Some(entry.name.clone());
                status.entry = Some(m.resource);
                // A `report: true` descriptor with hits is a report, also
                // where no counter takes it (an `unlimited` limit).
                let own = hits.get(i).copied().unwrap_or(req.hits);
                if entry.report && status.mode == Mode::Try && own > 0 {
                    status.mode = Mode::Report;
                }
                if let ResourceView::Rate(rate) = &entry.view {
                    let shadow = entry.shadow || ns.ignore_configured;
                    match &rate.for_domain(&m.domain).main {
                        Main::Unlimited => status.unlimited = true,
                        Main::Deny if shadow => status.shadowed = true,
                        Main::Deny => {
                            no_usage_to_deny(i, status.mode)?;
                            status.allowed = false;
                            denied = true;
                        }
                        Main::Limited(c) => {
                            // Two identical descriptors share one counter
                            // (as upstream); they are one plan item here.
                            let key = Key::new(c.id, &m.domain);
                            let i = plan.item_for(key, &c.limit, shadow);
                            if i == reported.len() {
                                reported.push(entry.report);
                            }
                            item = Some(i);
                        }
                        Main::Listed(list) => {
                            // Each limit's key is its own, and all of them are
                            // new to the plan or all already in it (the same
                            // descriptor twice): their items are consecutive.
                            for l in list {
                                let c = &l.compiled;
                                let key = Key::new(c.id, &m.domain);
                                let at = plan.item_for(key, &c.limit, shadow);
                                // A reported resource's every limit is charged.
                                if at == reported.len() {
                                    reported.push(entry.report);
                                }
                                item.get_or_insert(at);
                            }
                            width = list.len();
                            status.limit = Some(0);
                        }
                    }
                }
                status.domain = Some(m.domain);
            }
        }
        if let Some(at) = item {
            own_terms(
                &mut plan,
                &mut refunded,
                (at, width),
                i,
                (&hits, refunds, req),
            )?;
        }
        statuses.push(status);
        item_of.push(item);
        widths.push(width);
    }
    let to_decide = ToDecide {
        plan,
        statuses,
        item_of,
        reported,
        refunded,
        hits,
        widths,
        denied,
    };
    if denied && !to_decide.has_usage(req.hits, req.mode) {
        // Nothing is consumed when any descriptor is over its limit.
        return Ok(Planned::Denied(DescriptorOutcome {
            allowed: false,
            statuses: to_decide.statuses,
        }));
    }
    Ok(Planned::Decide(to_decide))
}

/// Of `decisions`, the one with the largest share used (`limit -
/// remaining` of `limit`, compared exactly by cross-multiplying in
/// `u128`; a limit of 0 uses nothing): a share past the near-limit ratio
/// is what "near" means, so it is near its limit when any of them is.
pub(crate) fn fullest(decisions: impl IntoIterator<Item = Decision>) -> Option<Decision> {
    let share = |d: &Decision| {
        (
            u128::from(d.limit.saturating_sub(d.remaining)),
            u128::from(d.limit.max(1)),
        )
    };
    decisions.into_iter().max_by(|a, b| {
        let ((used_a, of_a), (used_b, of_b)) = (share(a), share(b));
        (used_a * of_b).cmp(&(used_b * of_a))
    })
}

/// A report or refund to a limit that refuses everything (`deny`, or a
/// brought limit of 0) is refused as the native API refuses it, before
/// anything is charged: there is no debt to owe or give back.
fn no_usage_to_deny(i: usize, mode: Mode) -> Result<(), ServiceError> {
    if mode.is_usage() {
        return Err(
            tollgate_store::StoreError::Plan(tollgate_core::PlanError::NoUsage {
                index: i,
                algorithm: "deny",
                mode,
            })
            .into(),
        );
    }
    Ok(())
}

/// How descriptor `i` of `req` asks to be decided, before any limit is
/// known: the request's mode, or a refund when it alone gives back
/// (Envoy's `is_negative_hits`).
fn asked_mode(req: &DescriptorRequest<'_>, i: usize) -> Mode {
    if req.mode == Mode::Try && req.refunds.get(i) == Some(&true) {
        Mode::Refund
    } else {
        req.mode
    }
}

/// Descriptor `i`'s own terms on its plan items `at..at + width`: the
/// hits it asks when the descriptors' hits differ (`hits`, per
/// descriptor; an item two descriptors share is asked the larger), and,
/// when some descriptors of a `try` request refund (`refunds`), whether
/// these items are refunded (`refunded`, per item). Two descriptors that
/// share a counter but not a refund are a malformed request: the counter
/// cannot be both charged and given back.
fn own_terms(
    plan: &mut Plan,
    refunded: &mut Vec<bool>,
    (at, width): (usize, usize),
    i: usize,
    (hits, refunds, req): (&[u64], bool, &DescriptorRequest<'_>),
) -> Result<(), ServiceError> {
    if let Some(&h) = hits.get(i) {
        for item in at..at + width {
            plan.ask(item, h);
        }
    }
    if refunds {
        let refund = req.refunds.get(i).copied().unwrap_or(false);
        for item in at..at + width {
            if item < refunded.len() {
                if refunded[item] != refund {
                    return Err(ServiceError::Malformed(format!(
                        "descriptor {i} names a counter an earlier descriptor names too, \
                         and one of them sets is_negative_hits but the other does not: \
                         a counter is charged or refunded, not both"
                    )));
                }
            } else {
                refunded.push(refund);
            }
        }
    }
    Ok(())
}

/// How a [`ToDecide`] is decided: one plan, or parts (the checked items
/// all or nothing, the `report: true` items in report mode, the refunded
/// items in refund mode).
// Matched at once, like `Planned`.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Split {
    /// The whole plan in one mode.
    Whole(Mode),
    /// The plan in parts, each a plan of its own decided in its mode, with
    /// the whole plan's item index of each of its items: the zero-hit
    /// checks of `report: true` items first when the check charges
    /// anything ([`Part::probe`]), then the check (`try`, all or nothing),
    /// then the usage, which is charged or given back whatever the check
    /// says. Parts without items are left out.
    Parts(SmallVec<[Part; 4]>),
}

/// One part of a [`Split::Parts`].
#[derive(Debug)]
pub(crate) struct Part {
    /// How the part is decided.
    pub(crate) mode: Mode,
    /// Its items.
    pub(crate) plan: Plan,
    /// Each item's index in the whole plan.
    pub(crate) items: Vec<usize>,
    /// The zero-hit checks of `report: true` items (the check before a
    /// call whose cost is reported after it), beside a check that charges
    /// hits: decided first, since such a check is refused while its item
    /// is exhausted ([`ToDecide::outcome`]), which no plan of zero hits
    /// refuses. When one is refused ([`ToDecide::exhausted`]) the check
    /// is not charged, only inspected: all or nothing.
    pub(crate) probe: bool,
}

impl ToDecide {
    /// How item `i` is decided in a `try` request of `hits`: refunded
    /// (its descriptor sets `is_negative_hits`), reported (`report: true`
    /// and hits to charge), or checked.
    fn mode_of(&self, i: usize, hits: u64) -> Mode {
        let asked = self
            .plan
            .items()
            .get(i)
            .and_then(|it| it.hits)
            .unwrap_or(hits);
        if self.refunded.get(i) == Some(&true) {
            Mode::Refund
        } else if self.reported.get(i) == Some(&true) && asked > 0 {
            Mode::Report
        } else {
            Mode::Try
        }
    }

    /// Whether a request of `hits` in `mode` charges or gives back usage
    /// to some item (a report, a refund, a `report: true` item with hits,
    /// an item refunded beside checks).
    fn has_usage(&self, hits: u64, mode: Mode) -> bool {
        match mode {
            Mode::Report | Mode::Refund => !self.plan.is_empty(),
            Mode::Acquire => false,
            Mode::Try => (0..self.plan.len()).any(|i| self.mode_of(i, hits).is_usage()),
        }
    }

    /// How to decide this plan for `hits` in `mode`: a refund (Envoy's
    /// `is_negative_hits` on every descriptor) or an explicit report takes
    /// every item in that mode; in `try`, items whose descriptor refunds
    /// are refunded, `report: true` items with hits to charge are charged
    /// in report mode, and the others are checked all or nothing. A check
    /// with no hits (of a reported item too) is a check; the zero-hit
    /// checks of reported items beside a check that charges hits are a
    /// probe part decided before it ([`Part::probe`]).
    pub(crate) fn split(&self, hits: u64, mode: Mode) -> Split {
        if mode != Mode::Try || (!self.reported.contains(&true) && !self.refunded.contains(&true)) {
            return Split::Whole(mode);
        }
        let n = self.plan.len();
        let asked = |i: usize| {
            self.plan
                .items()
                .get(i)
                .and_then(|it| it.hits)
                .unwrap_or(hits)
        };
        // A zero-hit check of a reported item, and whether the check
        // charges anything: together they need a probe part first.
        let probe =
            |i: usize| self.reported.get(i) == Some(&true) && self.mode_of(i, hits) == Mode::Try;
        let probing = (0..n).any(probe)
            && (0..n).any(|i| !probe(i) && self.mode_of(i, hits) == Mode::Try && asked(i) > 0);
        let first = self.mode_of(0, hits);
        if !probing && (1..n).all(|i| self.mode_of(i, hits) == first) {
            return Split::Whole(first);
        }
        let mut parts: SmallVec<[Part; 4]> = [
            (Mode::Try, true),
            (Mode::Try, false),
            (Mode::Report, false),
            (Mode::Refund, false),
        ]
        .into_iter()
        .map(|(mode, probe)| Part {
            mode,
            plan: Plan::default().with_affinity(self.plan.affinity()),
            items: Vec::new(),
            probe,
        })
        .collect();
        for (i, item) in self.plan.items().iter().enumerate() {
            let at = match self.mode_of(i, hits) {
                Mode::Report => 2,
                Mode::Refund => 3,
                _ if probing && probe(i) => 0,
                _ => 1,
            };
            let part = &mut parts[at];
            // Distinct in the whole plan, so distinct in each part.
            let j = part
                .plan
                .item_for(item.key.clone(), &item.limit, item.shadow);
            if let Some(h) = item.hits {
                part.plan.ask(j, h);
            }
            part.items.push(i);
        }
        parts.retain(|p| !p.items.is_empty());
        Split::Parts(parts)
    }

    /// The whole plan's decision from its parts' ([`Split::Parts`], each
    /// with its decision): each item's decision in place; an item of a
    /// usage part had room for everything, since usage is never refused.
    /// The check's grant stands for the whole (or, with no check, all was
    /// granted).
    pub(crate) fn join(&self, parts: &[(&Part, &PlanDecision)]) -> PlanDecision {
        let n = self.plan.len();
        let mut decisions = vec![None; n];
        let mut rooms = vec![u64::MAX; n];
        for (part, d) in parts {
            for (j, &i) in part.items.iter().enumerate() {
                decisions[i] = d.decisions.get(j).copied();
                if part.mode == Mode::Try {
                    rooms[i] = d.rooms.get(j).copied().unwrap_or(0);
                }
            }
        }
        let check = parts.iter().find(|(p, _)| p.mode == Mode::Try && !p.probe);
        PlanDecision {
            granted: check.map_or(0, |(_, d)| d.granted),
            allowed: parts.iter().all(|(p, d)| p.mode != Mode::Try || d.allowed),
            wait: check.map_or(Nanos::ZERO, |(_, d)| d.wait),
            // The check's binding item, as the whole plan's index.
            limited_by: check.and_then(|(p, d)| d.limited_by.and_then(|j| p.items.get(j).copied())),
            shadow_limited: check.is_some_and(|(_, d)| d.shadow_limited),
            decisions: decisions
                .into_iter()
                .map(|d| d.unwrap_or(tollgate_core::Decision::unlimited(0)))
                .collect(),
            rooms: rooms.into_iter().collect(),
        }
    }

    /// Whether a probe part's decision `pd` ([`Part::probe`]) refuses the
    /// request: a live item of it has no hit left, as
    /// [`ToDecide::outcome`] judges a zero-hit check of a reported item.
    pub(crate) fn exhausted(part: &Part, pd: &PlanDecision) -> bool {
        part.plan
            .items()
            .iter()
            .zip(&pd.decisions)
            .any(|(it, d)| !it.shadow && d.remaining < 1)
    }

    /// Each descriptor's status once the store decided [`ToDecide::plan`]
    /// for `hits` (the plan's decision `pd`): a descriptor is within its
    /// limit when its item alone had room for every hit it asked (`hits`,
    /// or its own when the descriptors' differ); a shadow item
    /// over its limit marks the descriptor shadowed and allows it. OK
    /// overall when every descriptor is allowed.
    ///
    /// Usage (`mode` report or refund) is never refused: every descriptor
    /// is within its limit. A check with no hits of a `report: true` item
    /// asks whether one more hit would be admitted: refused while the
    /// item owes hits or is exhausted, which is how a gateway checks
    /// before a request whose cost it reports afterwards.
    pub(crate) fn outcome(self, pd: &PlanDecision, hits: u64, mode: Mode) -> DescriptorOutcome {
        // How each descriptor's counter was decided: in a check, each
        // item's own mode (reported, refunded or checked); a descriptor
        // without one keeps the mode it asked ([`plan`]).
        let modes: SmallVec<[Option<Mode>; 4]> = self
            .item_of
            .iter()
            .map(|item| match (mode, item) {
                (_, None) => None,
                (Mode::Try, Some(i)) => Some(self.mode_of(*i, hits)),
                _ => Some(mode),
            })
            .collect();
        let ToDecide {
            plan,
            mut statuses,
            item_of,
            reported,
            hits: own,
            widths,
            ..
        } = self;
        for (d, ((status, item), width)) in
            statuses.iter_mut().zip(&item_of).zip(&widths).enumerate()
        {
            // This descriptor's hits: its own when they differ.
            let hits = own.get(d).copied().unwrap_or(hits);
            let Some(first) = *item else {
                // No counter: it counts what it asked, as an unconfigured
                // resource does on the native API, when the request is OK.
                status.charged = hits;
                continue;
            };
            if let Some(m) = modes.get(d).copied().flatten() {
                status.mode = m;
            }
            // The binding item: the first without room for every hit,
            // the least room first; else the one with the least remaining.
            let span = first..first + *width;
            let item = span
                .clone()
                .filter(|&i| pd.rooms.get(i).is_some_and(|&r| r < hits))
                .min_by_key(|&i| pd.rooms.get(i).copied().unwrap_or(0))
                .or_else(|| {
                    span.clone()
                        .min_by_key(|&i| pd.decisions.get(i).map_or(u64::MAX, |d| d.remaining))
                })
                .unwrap_or(first);
            if status.limit.is_some() {
                status.limit = Some(item - first);
                status.fullest = fullest(span.clone().filter_map(|i| pd.decisions.get(i).copied()));
            }
            let decision = pd.decisions.get(item).copied();
            // A check with no hits of a reported list asks this of its
            // binding limit, the one with the least remaining.
            let fits = if mode.is_usage() {
                true
            } else if hits == 0 && reported.get(item) == Some(&true) {
                decision.is_some_and(|d| d.remaining >= 1)
            } else {
                pd.rooms.get(item).is_some_and(|&r| r >= hits)
            };
            status.decision = decision;
            if plan.items()[item].shadow {
                status.shadowed = !fits;
            } else {
                status.allowed = fits;
            }
            // Usage is charged (or given back) whatever the answer, as its
            // counters took it: the least any of its live limits took (a
            // shadow limit never limits), as the native API counts it. A
            // check's hits, when the request is OK.
            status.charged = if status.mode.is_usage() {
                span.filter(|&i| plan.items().get(i).is_some_and(|it| !it.shadow))
                    .filter_map(|i| pd.decisions.get(i))
                    .map(|d| d.granted)
                    .min()
                    .unwrap_or(hits)
            } else {
                hits
            };
        }
        let allowed = statuses.iter().all(|s| s.allowed);
        if !allowed {
            // Nothing is charged but usage: all or nothing.
            for (status, item) in statuses.iter_mut().zip(&item_of) {
                if item.is_none() || !status.mode.is_usage() {
                    status.charged = 0;
                }
            }
        }
        DescriptorOutcome { allowed, statuses }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use tollgate_core::{Decision, Nanos};

    use super::*;

    /// Every rule of the step: limited, unlimited, deny, shadow, deny in
    /// shadow, and a limit another replaces.
    const EDGE: &str = "\
domain: edge
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    value: /open
    rate_limit: { unlimited: true }
  - key: ip
    value: 10.0.0.1
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: tenant
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: blocked
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: account
    rate_limit: { name: per_account, unit: minute, requests_per_unit: 1 }
  - key: premium
    value: 'yes'
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces: [ { name: per_account } ]
";

    const NATIVE: &str = "\
namespaces:
  - name: ns
    resources:
      - { name: api, algorithm: unlimited }
";

    fn view(yaml: &str, ignore_configured: bool) -> View {
        let mut loaded = tollgate_config::load_str("test.yaml", yaml).unwrap();
        for ns in &mut loaded.config.namespaces {
            ns.ignore_configured = ignore_configured;
        }
        View::new(&loaded.config, Nanos::ZERO)
    }

    fn d(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn planned(view: &View, namespace: &str, descriptors: &[Vec<(String, String)>]) -> Planned {
        let req = DescriptorRequest {
            namespace,
            descriptors,
            hits: 1,
            mode: Mode::Try,
            limits: &[],
            descriptor_hits: &[],
            refunds: &[],
        };
        plan(view, &req, &[]).unwrap()
    }

    fn to_decide(view: &View, descriptors: &[Vec<(String, String)>]) -> ToDecide {
        match planned(view, "edge", descriptors) {
            Planned::Decide(t) => t,
            other => panic!("expected a plan to decide, got {other:?}"),
        }
    }

    /// A plan decision in which item `i` had room for `rooms[i]` hits.
    fn decided(rooms: &[u64]) -> PlanDecision {
        PlanDecision {
            granted: 0,
            allowed: false,
            wait: Nanos::ZERO,
            limited_by: None,
            shadow_limited: false,
            decisions: rooms
                .iter()
                .map(|&r| {
                    let mut d = Decision::unlimited(0);
                    d.remaining = r;
                    d
                })
                .collect(),
            rooms: rooms.iter().copied().collect(),
        }
    }

    #[test]
    fn no_descriptors_is_malformed_even_in_an_unknown_domain() {
        let view = view(EDGE, false);
        for namespace in ["edge", "nowhere"] {
            let req = DescriptorRequest {
                namespace,
                descriptors: &[],
                hits: 1,
                mode: Mode::Try,
                limits: &[],
                descriptor_hits: &[],
                refunds: &[],
            };
            let err = plan(&view, &req, &[]).unwrap_err();
            assert_eq!(err.reason(), "malformed_request", "{namespace}");
        }
    }

    #[test]
    fn an_unknown_domain_is_ok_with_no_limit_for_every_descriptor() {
        let view = view(EDGE, false);
        let list = [d(&[("user", "u")]), d(&[("ip", "10.0.0.1")])];
        let Planned::UnknownDomain(out) = planned(&view, "nowhere", &list) else {
            panic!("expected an unknown domain");
        };
        assert!(out.allowed);
        // Allowed with no counter: each counts the hit it asked.
        let mut want = DescriptorStatus::unlimited_by_default();
        want.charged = 1;
        assert_eq!(out.statuses, vec![want; 2]);
    }

    #[test]
    fn a_namespace_without_descriptors_is_refused() {
        let view = view(NATIVE, false);
        let req = DescriptorRequest {
            namespace: "ns",
            descriptors: &[d(&[("user", "u")])],
            hits: 1,
            mode: Mode::Try,
            limits: &[],
            descriptor_hits: &[],
            refunds: &[],
        };
        let err = plan(&view, &req, &[]).unwrap_err();
        assert_eq!(err.reason(), "no_descriptors");
    }

    #[test]
    fn unmatched_and_unlimited_descriptors_add_no_plan_item() {
        let view = view(EDGE, false);
        let list = [
            d(&[("nothing", "here")]),
            d(&[("user", "u1"), ("extra", "x")]),
            d(&[("path", "/open")]),
        ];
        let t = to_decide(&view, &list);
        assert!(t.plan.items().is_empty());
        assert_eq!(t.item_of, vec![None, None, None]);
        assert_eq!(t.statuses[0], DescriptorStatus::unlimited_by_default());
        assert_eq!(t.statuses[1], DescriptorStatus::unlimited_by_default());
        let open = &t.statuses[2];
        assert_eq!(open.resource.as_deref(), Some("path_/open"));
        // Values are escaped in the counter's domain.
        assert_eq!(open.domain.as_deref(), Some("path=%2Fopen"));
        assert!(open.unlimited && open.allowed && !open.shadowed);
        // Nothing to decide: the outcome is OK as it stands.
        let out = t.outcome(&decided(&[]), 1, Mode::Try);
        assert!(out.allowed);
        assert!(out.statuses.iter().all(|s| s.decision.is_none()));
    }

    #[test]
    fn a_deny_rejects_the_request_before_anything_is_decided() {
        let view = view(EDGE, false);
        let list = [d(&[("user", "u1")]), d(&[("ip", "10.0.0.1")])];
        let Planned::Denied(out) = planned(&view, "edge", &list) else {
            panic!("expected a denial");
        };
        assert!(!out.allowed);
        // The limited descriptor is matched but not decided.
        assert_eq!(out.statuses[0].resource.as_deref(), Some("user"));
        assert!(out.statuses[0].allowed);
        assert_eq!(out.statuses[0].decision, None);
        let ip = &out.statuses[1];
        assert_eq!(ip.resource.as_deref(), Some("ip_10.0.0.1"));
        assert!(!ip.allowed && !ip.shadowed);
    }

    #[test]
    fn a_deny_in_shadow_mode_is_shadowed_and_decides_nothing() {
        let view = view(EDGE, false);
        let t = to_decide(&view, &[d(&[("blocked", "b")])]);
        assert!(t.plan.items().is_empty());
        let s = &t.statuses[0];
        assert!(s.allowed && s.shadowed);
        assert_eq!(s.resource.as_deref(), Some("blocked"));
    }

    #[test]
    fn each_limited_descriptor_is_a_plan_item_with_its_shadow_flag() {
        let view = view(EDGE, false);
        let list = [d(&[("user", "u1")]), d(&[("tenant", "t1")])];
        let t = to_decide(&view, &list);
        let affinity = view.namespace("edge").unwrap().affinity;
        assert_eq!(t.plan.affinity(), affinity);
        assert_eq!(t.plan.items().len(), 2);
        assert_eq!(t.item_of, vec![Some(0), Some(1)]);
        assert_eq!(t.plan.items()[0].key.scope(), "user=u1");
        assert!(!t.plan.items()[0].shadow);
        assert_eq!(t.plan.items()[1].key.scope(), "tenant=t1");
        assert!(t.plan.items()[1].shadow);
        assert_ne!(t.plan.items()[0].key.limit, t.plan.items()[1].key.limit);
    }

    #[test]
    fn identical_descriptors_share_one_plan_item() {
        let view = view(EDGE, false);
        let list = [
            d(&[("user", "u1")]),
            d(&[("user", "u2")]),
            d(&[("user", "u1")]),
        ];
        let t = to_decide(&view, &list);
        assert_eq!(t.plan.items().len(), 2);
        assert_eq!(t.item_of, vec![Some(0), Some(1), Some(0)]);
        // Both copies get the shared counter's answer.
        let out = t.outcome(&decided(&[0, 3]), 1, Mode::Try);
        assert!(!out.allowed);
        assert_eq!(
            out.statuses.iter().map(|s| s.allowed).collect::<Vec<_>>(),
            [false, true, false]
        );
        assert_eq!(out.statuses[2].decision.unwrap().remaining, 0);
    }

    #[test]
    fn replaces_drops_the_named_limit_only_when_both_are_in_the_request() {
        let view = view(EDGE, false);
        let both = [d(&[("account", "a1")]), d(&[("premium", "yes")])];
        let t = to_decide(&view, &both);
        assert_eq!(t.item_of, vec![None, Some(0)]);
        assert_eq!(t.statuses[0], DescriptorStatus::unlimited_by_default());
        assert_eq!(t.statuses[1].resource.as_deref(), Some("premium_yes"));
        assert_eq!(t.plan.items().len(), 1);
        let alone = to_decide(&view, &both[..1]);
        assert_eq!(alone.item_of, vec![Some(0)]);
        assert_eq!(alone.statuses[0].resource.as_deref(), Some("account"));
    }

    #[test]
    fn an_ignoring_namespace_shadows_every_limit_and_every_deny() {
        let view = view(EDGE, true);
        let list = [d(&[("user", "u1")]), d(&[("ip", "10.0.0.1")])];
        let t = to_decide(&view, &list);
        assert_eq!(t.item_of, vec![Some(0), None]);
        assert!(t.plan.items()[0].shadow);
        assert!(t.statuses[1].allowed && t.statuses[1].shadowed);
        // Over the limit, yet allowed: shadowed.
        let out = t.outcome(&decided(&[0]), 1, Mode::Try);
        assert!(out.allowed);
        assert!(out.statuses[0].allowed && out.statuses[0].shadowed);
    }

    #[test]
    fn a_descriptor_needs_room_for_every_hit() {
        let view = view(EDGE, false);
        let list = [d(&[("user", "u1")]), d(&[("tenant", "t1")])];
        // Room for 3 hits of 4 is not enough: all or nothing.
        let out = to_decide(&view, &list).outcome(&decided(&[3, 9]), 4, Mode::Try);
        assert!(!out.allowed);
        assert!(!out.statuses[0].allowed && !out.statuses[0].shadowed);
        assert_eq!(out.statuses[0].decision.unwrap().remaining, 3);
        // The shadow item has room: neither shadowed nor refused.
        assert!(out.statuses[1].allowed && !out.statuses[1].shadowed);
        let out = to_decide(&view, &list).outcome(&decided(&[4, 3]), 4, Mode::Try);
        assert!(out.allowed);
        assert!(out.statuses[0].allowed);
        // The shadow item is over: allowed, and marked shadowed.
        assert!(out.statuses[1].allowed && out.statuses[1].shadowed);
    }

    /// A `report: true` limit beside a checked one.
    const REPORTED: &str = "\
domain: llm
descriptors:
  - key: user
    report: true
    rate_limit: { algorithm: token_bucket, capacity: 100, rate: 100/1d }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: blocked
    rate_limit: { unit: second, requests_per_unit: 0 }
";

    /// A deny refuses the request, and the checks beside it are not
    /// charged; but usage beside it happened, and is charged.
    #[test]
    fn a_deny_beside_usage_refuses_the_checks_but_charges_the_usage() {
        let view = view(REPORTED, false);
        let checks = [d(&[("path", "/a")]), d(&[("blocked", "x")])];
        assert!(matches!(planned(&view, "llm", &checks), Planned::Denied(_)));
        let list = [
            d(&[("path", "/a")]),
            d(&[("user", "u")]),
            d(&[("blocked", "x")]),
        ];
        let t = to_decide_in(&view, "llm", &list);
        assert!(t.denied);
        let Split::Parts(parts) = t.split(5, Mode::Try) else {
            panic!("expected parts");
        };
        let shape: Vec<(Mode, &[usize])> =
            parts.iter().map(|p| (p.mode, p.items.as_slice())).collect();
        assert_eq!(shape, [(Mode::Try, &[0][..]), (Mode::Report, &[1][..])]);
        // The check inspected (room 9 of 10), the report charged its 5.
        let mut reported = decided(&[0]);
        reported.decisions[0].granted = 5;
        let pd = t.join(&[(&parts[0], &decided(&[9])), (&parts[1], &reported)]);
        let out = t.outcome(&pd, 5, Mode::Try);
        assert!(!out.allowed);
        assert!(!out.statuses[2].allowed);
        let got: Vec<(Mode, u64)> = out.statuses.iter().map(|s| (s.mode, s.charged)).collect();
        assert_eq!(got, [(Mode::Try, 0), (Mode::Report, 5), (Mode::Try, 0)]);
        // A refund to the deny itself is refused, as the native API
        // refuses usage to `deny`, before anything is charged.
        let req = DescriptorRequest {
            namespace: "llm",
            descriptors: &list,
            hits: 5,
            mode: Mode::Try,
            limits: &[],
            descriptor_hits: &[],
            refunds: &[false, false, true],
        };
        let err = plan(&view, &req, &[]).unwrap_err();
        assert_eq!(err.reason(), "no_usage", "{err}");
        // With no hits, nothing is usage: denied before anything is asked.
        let req = DescriptorRequest {
            namespace: "llm",
            descriptors: &list,
            hits: 0,
            mode: Mode::Try,
            limits: &[],
            descriptor_hits: &[],
            refunds: &[],
        };
        assert!(matches!(plan(&view, &req, &[]), Ok(Planned::Denied(_))));
    }

    #[test]
    fn report_items_are_charged_apart_from_the_checked_ones() {
        let view = view(REPORTED, false);
        let list = [d(&[("path", "/a")]), d(&[("user", "u")])];
        let t = match planned(&view, "llm", &list) {
            Planned::Decide(t) => t,
            other => panic!("{other:?}"),
        };
        assert_eq!(t.reported, vec![false, true]);
        // With hits, the path is checked and the user reported.
        let Split::Parts(parts) = t.split(5, Mode::Try) else {
            panic!("expected two parts");
        };
        let shape: Vec<(Mode, &[usize])> =
            parts.iter().map(|p| (p.mode, p.items.as_slice())).collect();
        assert_eq!(shape, [(Mode::Try, &[0][..]), (Mode::Report, &[1][..])]);
        // Joined: the reported item had room for everything, so only the
        // checked item's room decides.
        let (checked, reported) = (decided(&[4]), decided(&[0]));
        let pd = t.join(&[(&parts[0], &checked), (&parts[1], &reported)]);
        assert_eq!(pd.rooms.as_slice(), &[4, u64::MAX]);
        let out = t.outcome(&pd, 5, Mode::Try);
        assert!(!out.allowed);
        assert!(!out.statuses[0].allowed && out.statuses[1].allowed);
        let modes: Vec<Mode> = out.statuses.iter().map(|s| s.mode).collect();
        assert_eq!(modes, [Mode::Try, Mode::Report]);
        // No hits: one check of everything. A refund: one refund.
        let t = to_decide_in(&view, "llm", &list);
        assert!(matches!(t.split(0, Mode::Try), Split::Whole(Mode::Try)));
        // With no hits the reported item is checked, not reported.
        let out = to_decide_in(&view, "llm", &list).outcome(&decided(&[4, 1]), 0, Mode::Try);
        let modes: Vec<Mode> = out.statuses.iter().map(|s| s.mode).collect();
        assert_eq!(modes, [Mode::Try, Mode::Try]);
        assert!(matches!(
            t.split(5, Mode::Refund),
            Split::Whole(Mode::Refund)
        ));
        // Only reported descriptors: one report.
        let t = to_decide_in(&view, "llm", &[d(&[("user", "u")])]);
        assert!(matches!(t.split(5, Mode::Try), Split::Whole(Mode::Report)));
    }

    #[test]
    fn a_check_without_hits_of_a_reported_item_needs_one_hit_of_room() {
        let view = view(REPORTED, false);
        let list = [d(&[("user", "u")])];
        // Nothing remaining (in debt, or exhausted): refused.
        let out = to_decide_in(&view, "llm", &list).outcome(&decided(&[0]), 0, Mode::Try);
        assert!(!out.allowed);
        let out = to_decide_in(&view, "llm", &list).outcome(&decided(&[1]), 0, Mode::Try);
        assert!(out.allowed);
        // A refund is never refused.
        let out = to_decide_in(&view, "llm", &list).outcome(&decided(&[0]), 3, Mode::Refund);
        assert!(out.allowed);
    }

    fn planned_with(
        view: &View,
        descriptors: &[Vec<(String, String)>],
        own: &[Option<u64>],
        refunds: &[bool],
    ) -> Result<Planned, ServiceError> {
        let req = DescriptorRequest {
            namespace: "edge",
            descriptors,
            hits: 1,
            mode: Mode::Try,
            limits: &[],
            descriptor_hits: own,
            refunds,
        };
        plan(view, &req, &[])
    }

    #[test]
    fn descriptors_with_hits_of_their_own_ask_their_items_for_them() {
        let view = view(EDGE, false);
        let list = [
            d(&[("user", "u1")]),
            d(&[("account", "a")]),
            d(&[("user", "u1")]),
        ];
        let Planned::Decide(t) =
            planned_with(&view, &list, &[Some(3), None, Some(5)], &[]).unwrap()
        else {
            panic!("expected a plan");
        };
        // The user's counter, named twice, is one item asked the larger
        // hits; the account's takes the request's.
        let asked: Vec<Option<u64>> = t.plan.items().iter().map(|i| i.hits).collect();
        assert_eq!(asked, [Some(5), Some(1)]);
        // Each descriptor is judged by its own hits: room for 4 on the
        // shared counter fits the first's 3, not the third's 5.
        let out = t.outcome(&decided(&[4, 9]), 1, Mode::Try);
        let allowed: Vec<bool> = out.statuses.iter().map(|s| s.allowed).collect();
        assert_eq!(allowed, [true, true, false]);
        assert!(!out.allowed);
        // The same hits as the request's: no item is asked its own.
        let Planned::Decide(t) = planned_with(&view, &list[..2], &[Some(1), None], &[]).unwrap()
        else {
            panic!("expected a plan");
        };
        assert!(t.plan.items().iter().all(|i| i.hits.is_none()));
    }

    #[test]
    fn refunding_descriptors_are_a_part_of_their_own() {
        let view = view(EDGE, false);
        let list = [d(&[("user", "u1")]), d(&[("account", "a")])];
        let Planned::Decide(t) = planned_with(&view, &list, &[], &[true, false]).unwrap() else {
            panic!("expected a plan");
        };
        let Split::Parts(parts) = t.split(1, Mode::Try) else {
            panic!("expected two parts");
        };
        let shape: Vec<(Mode, &[usize])> =
            parts.iter().map(|p| (p.mode, p.items.as_slice())).collect();
        assert_eq!(shape, [(Mode::Try, &[1][..]), (Mode::Refund, &[0][..])]);
        // The refunded item is never refused; the check's binding item is
        // named by its index in the whole plan.
        let mut checked = decided(&[0]);
        checked.limited_by = Some(0);
        let refunded = decided(&[0]);
        let pd = t.join(&[(&parts[0], &checked), (&parts[1], &refunded)]);
        assert_eq!(pd.rooms.as_slice(), &[u64::MAX, 0]);
        assert_eq!(pd.limited_by, Some(1));
        let out = t.outcome(&pd, 1, Mode::Try);
        assert!(out.statuses[0].allowed && !out.statuses[1].allowed);
        // Each status says how its counter was decided (the metrics count
        // the refund as given back, not granted).
        let modes: Vec<Mode> = out.statuses.iter().map(|s| s.mode).collect();
        assert_eq!(modes, [Mode::Refund, Mode::Try]);
        // One counter both refunded and charged: malformed.
        let twice = [d(&[("user", "u1")]), d(&[("user", "u1")])];
        let err = planned_with(&view, &twice, &[], &[false, true]).unwrap_err();
        assert!(
            err.to_string()
                .contains("a counter is charged or refunded, not both"),
            "{err}"
        );
    }

    #[test]
    fn each_status_says_how_its_counter_was_decided_and_what_it_charged() {
        let view = view(REPORTED, false);
        let list = [d(&[("path", "/a")]), d(&[("user", "u")])];
        let t = to_decide_in(&view, "llm", &list);
        let Split::Parts(parts) = t.split(5, Mode::Try) else {
            panic!("expected two parts");
        };
        // The user's report clamped to 3 by its debt's bound.
        let mut reported = decided(&[0]);
        reported.decisions[0].granted = 3;
        let checked = decided(&[9]);
        let pd = t.join(&[(&parts[0], &checked), (&parts[1], &reported)]);
        let out = t.outcome(&pd, 5, Mode::Try);
        assert!(out.allowed);
        let got: Vec<(Mode, u64)> = out.statuses.iter().map(|s| (s.mode, s.charged)).collect();
        assert_eq!(got, [(Mode::Try, 5), (Mode::Report, 3)]);
        // The check refused: it charged nothing, the report its 3.
        let t = to_decide_in(&view, "llm", &list);
        let Split::Parts(parts) = t.split(5, Mode::Try) else {
            panic!("expected two parts");
        };
        let pd = t.join(&[(&parts[0], &decided(&[4])), (&parts[1], &reported)]);
        let out = t.outcome(&pd, 5, Mode::Try);
        assert!(!out.allowed);
        let got: Vec<(Mode, u64)> = out.statuses.iter().map(|s| (s.mode, s.charged)).collect();
        assert_eq!(got, [(Mode::Try, 0), (Mode::Report, 3)]);

        // A refund with no counter (an unlimited path) is still a refund,
        // counting what it asked, as an unconfigured resource does.
        let view = self::view(EDGE, false);
        let list = [d(&[("user", "u1")]), d(&[("path", "/open")])];
        let Planned::Decide(t) = planned_with(&view, &list, &[], &[false, true]).unwrap() else {
            panic!("expected a plan");
        };
        let out = t.outcome(&decided(&[3]), 1, Mode::Try);
        let got: Vec<(Mode, u64)> = out.statuses.iter().map(|s| (s.mode, s.charged)).collect();
        assert_eq!(got, [(Mode::Try, 1), (Mode::Refund, 1)]);
        // An unknown domain: every descriptor as it asked.
        let req = DescriptorRequest {
            namespace: "nowhere",
            descriptors: &list,
            hits: 2,
            mode: Mode::Try,
            limits: &[],
            descriptor_hits: &[],
            refunds: &[true, false],
        };
        let Ok(Planned::UnknownDomain(out)) = plan(&view, &req, &[]) else {
            panic!("expected an unknown domain");
        };
        let got: Vec<(Mode, u64)> = out.statuses.iter().map(|s| (s.mode, s.charged)).collect();
        assert_eq!(got, [(Mode::Refund, 2), (Mode::Try, 2)]);
    }

    #[test]
    fn the_fullest_limit_is_the_largest_share_used_compared_exactly() {
        let d = |limit: u64, remaining: u64| {
            let mut d = Decision::unlimited(0);
            d.limit = limit;
            d.remaining = remaining;
            d
        };
        let limit = |ds: &[Decision]| fullest(ds.iter().copied()).map(|d| d.limit);
        // 85 of 100 used is fuller than 5 of 10, though it has more left.
        assert_eq!(limit(&[d(10, 5), d(100, 15)]), Some(100));
        // Exact at the largest counts: all of 3 beats all but 1 of 2^64 - 1.
        assert_eq!(limit(&[d(3, 0), d(u64::MAX, 1)]), Some(3));
        assert_eq!(limit(&[d(u64::MAX, 1), d(3, 0)]), Some(3));
        // A limit of 0 uses nothing; none at all, none.
        assert_eq!(limit(&[d(0, 0), d(5, 4)]), Some(5));
        assert_eq!(limit(&[]), None);
    }

    fn to_decide_in(
        view: &View,
        namespace: &str,
        descriptors: &[Vec<(String, String)>],
    ) -> ToDecide {
        match planned(view, namespace, descriptors) {
            Planned::Decide(t) => t,
            other => panic!("expected a plan to decide, got {other:?}"),
        }
    }
}
