//! Deciding several limits at once, all or nothing.
//!
//! A request usually checks more than one limit: the resource's algorithm
//! for the domain, a per-domain hard limit, an all-domain global limit
//! (Charon §2.1), or several Envoy descriptors. [`decide`] grants the
//! largest `n` in `[min_hits, hits]` that *every* limit admits and records
//! it in all of them, or grants nothing and records nothing (DESIGN:
//! "consumes from all or from none"). Because every algorithm's room is
//! monotone, that `n` is the minimum of their rooms.
//!
//! Shadow entries (envoyproxy/ratelimit's `shadow_mode`) are evaluated and
//! recorded but never limit the request; the decision says whether one
//! would have.
//!
//! Usage told after the fact ([`Mode::Report`], [`Mode::Refund`]) is not
//! a question, so it is not all or nothing: every entry, shadow ones
//! included, is charged (or refunded) on its own, each as far as its bound
//! allows, and the plan's `granted` is the request's hits less the largest
//! shortfall of any live entry.
//!
//! An entry may carry hits of its own ([`PlanEntry::hits`]: Envoy
//! descriptors each with their own `hits_addend`). It is asked for exactly
//! those, in place of the request's, and still all or nothing with the
//! rest: the plan is granted only if every live entry with hits of its own
//! has room for all of them and the other entries grant the request; then
//! each entry records its own hits, else none records anything. The plan's
//! `granted` is what the entries without hits of their own were granted
//! (the request's hits when every entry has its own and the plan is
//! granted).

use smallvec::SmallVec;
use thiserror::Error;

use crate::algorithm::Algorithm;
use crate::decision::{Decision, Grant, Hits, Mode};
use crate::limit::{Limit, LimitState};
use crate::time::Nanos;

/// One limit of a plan with its key's state.
#[derive(Debug)]
pub struct PlanEntry<'a> {
    /// The algorithm and its parameters.
    pub limit: &'a Limit,
    /// The key's state, updated in place.
    pub state: &'a mut LimitState,
    /// Evaluated and recorded, but never limits the request.
    pub shadow: bool,
    /// Hits of this entry's own, decided exactly in place of the
    /// request's: Envoy descriptors of one request may each carry their
    /// own `hits_addend`. `None`: the request's hits.
    pub hits: Option<u64>,
}

impl PlanEntry<'_> {
    /// What this entry is asked: its own hits exactly, else `request`.
    #[inline]
    fn asked(&self, request: Hits) -> Hits {
        self.hits.map_or(request, Hits::exactly)
    }
}

/// Why a plan cannot be decided at all.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PlanError {
    /// [`Mode::Acquire`] on an algorithm that cannot schedule.
    #[error("algorithm `{algorithm}` cannot schedule requests; use mode `try`")]
    CannotSchedule {
        /// The plan entry.
        index: usize,
        /// Its algorithm's name.
        algorithm: &'static str,
    },
    /// [`Mode::Acquire`] for more hits than a window-limited entry can ever
    /// hold, so no wait would admit them.
    #[error("{hits} hits can never be admitted at once by this limit, whatever the wait")]
    NeverAdmits {
        /// The plan entry.
        index: usize,
        /// Hits asked for.
        hits: u64,
    },
    /// [`Mode::Report`] or [`Mode::Refund`] on an algorithm without a sound
    /// debt ([`Limit::takes_usage`]).
    #[error(
        "algorithm `{algorithm}` cannot take usage reported after the fact (mode `{}`): \
         only token_bucket, gcra, leaky_bucket, fixed_window, sliding_window and sliding_log \
         limits can be reported to or refunded (in a gossip cluster, those replicated with \
         `replication: counter`)",
        mode.as_str()
    )]
    NoUsage {
        /// The plan entry.
        index: usize,
        /// Its algorithm's name.
        algorithm: &'static str,
        /// The mode asked for.
        mode: Mode,
    },
}

impl PlanError {
    /// The plan entry that refused the plan.
    pub fn index(&self) -> usize {
        match self {
            PlanError::CannotSchedule { index, .. }
            | PlanError::NeverAdmits { index, .. }
            | PlanError::NoUsage { index, .. } => *index,
        }
    }
}

/// The answer for a whole plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanDecision {
    /// Hits granted by every limit (0 on rejection).
    pub granted: u64,
    /// Whether the request succeeded.
    pub allowed: bool,
    /// The longest wait any limit imposes.
    pub wait: Nanos,
    /// The non-shadow entry that bounded the grant below what was asked.
    pub limited_by: Option<usize>,
    /// Whether a shadow entry would have granted less.
    pub shadow_limited: bool,
    /// Each entry's own decision, in plan order.
    pub decisions: SmallVec<[Decision; 4]>,
    /// How many of the requested hits each entry alone would have admitted
    /// (before anything was recorded), in plan order.
    pub rooms: SmallVec<[u64; 4]>,
}

impl PlanDecision {
    /// One decision summarising the plan: the tightest entry's limit and
    /// remaining, the longest `retry_after` (`None` if any entry never
    /// admits `min_hits`), reset and wait. `retry_after` is the first time
    /// every limit alone would admit the request, a lower bound for them
    /// all together.
    pub fn summary(&self) -> Decision {
        let mut out = Decision::unlimited(self.granted);
        out.allowed = self.allowed;
        let mut retry = Some(Nanos::ZERO);
        for d in &self.decisions {
            if d.remaining < out.remaining {
                out.remaining = d.remaining;
                out.limit = d.limit;
            }
            out.reset_after = out.reset_after.max(d.reset_after);
            retry = match (retry, d.retry_after) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
            out.tier = out.tier.or(d.tier);
        }
        if out.remaining == u64::MAX {
            if let Some(d) = self.decisions.first() {
                out.limit = d.limit;
            }
        }
        out.retry_after = retry;
        out.wait = self.wait;
        out
    }
}

/// A one-limit plan decided with a single dispatch: what [`decide`] would
/// answer for `[entry]` in [`Mode::Try`], in pieces a store can carry out of
/// its lock cheaply, plus whether the state is idle afterwards.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct OneDecision {
    /// The entry's decision.
    pub decision: Decision,
    /// The entry's room.
    pub room: u64,
    /// The plan's grant (for a shadow entry: the whole request).
    pub grant: Grant,
    /// Whether a shadow entry would have granted less.
    pub shadow_limited: bool,
    /// Whether the state is idle after the decision.
    pub idle: bool,
}

/// Decides a one-limit plan in [`Mode::Try`]: the same answer as [`decide`]
/// on one entry, without building the plan machinery. Generic, so that a
/// store that knows the concrete algorithm (the memory store's GCRA path)
/// decides without dispatching on [`Limit`].
#[inline]
pub fn decide_one<A: Algorithm>(
    limit: &A,
    state: &mut A::State,
    shadow: bool,
    now: Nanos,
    request: Hits,
) -> OneDecision {
    if !shadow {
        let alone = limit.decide_alone(state, now, request);
        let d = alone.decision;
        return OneDecision {
            decision: d,
            room: alone.room,
            grant: Grant {
                granted: d.granted,
                allowed: d.allowed,
            },
            shadow_limited: false,
            idle: alone.idle,
        };
    }
    let room = limit.room(state, now, request.hits);
    // Nothing live limits the request; the shadow entry records what it
    // would as a live limit.
    let grant = Grant::from_room(request, request.hits);
    let live = Grant::from_room(request, room);
    let decision = limit.commit(state, now, request, live);
    OneDecision {
        decision,
        room,
        grant,
        shadow_limited: live.granted < grant.granted,
        idle: limit.is_idle(state, now),
    }
}

impl OneDecision {
    /// The same answer as a [`PlanDecision`].
    #[inline]
    pub fn into_plan_decision(self, request: Hits, shadow: bool) -> PlanDecision {
        let limited = !shadow && self.room < request.hits && self.grant.granted < request.hits;
        PlanDecision {
            granted: self.grant.granted,
            allowed: self.grant.allowed,
            wait: if shadow {
                Nanos::ZERO
            } else {
                self.decision.wait
            },
            limited_by: (limited && request.is_well_formed()).then_some(0),
            shadow_limited: self.shadow_limited,
            decisions: smallvec::smallvec![self.decision],
            rooms: smallvec::smallvec![self.room],
        }
    }
}

/// Decides `request` against every entry at `now`, all or nothing.
pub fn decide(
    entries: &mut [PlanEntry<'_>],
    now: Nanos,
    request: Hits,
    mode: Mode,
) -> Result<PlanDecision, PlanError> {
    match mode {
        Mode::Try => Ok(decide_try(entries, now, request)),
        Mode::Acquire => acquire(entries, now, request.hits),
        Mode::Report | Mode::Refund => usage(entries, now, request.hits, mode),
    }
}

/// Reports or refunds `hits` to every entry, each on its own: usage that
/// happened is recorded wherever it can be, never refused for want of
/// room. Refused, changing nothing, if an entry takes no usage.
fn usage(
    entries: &mut [PlanEntry<'_>],
    now: Nanos,
    hits: u64,
    mode: Mode,
) -> Result<PlanDecision, PlanError> {
    if let Some((index, e)) = entries
        .iter()
        .enumerate()
        .find(|(_, e)| !e.limit.takes_usage())
    {
        return Err(PlanError::NoUsage {
            index,
            algorithm: e.limit.algorithm_name(),
            mode,
        });
    }
    // The largest part of its hits a live entry could not take.
    let mut shortfall = 0;
    let mut limited_by = None;
    let mut rooms = SmallVec::with_capacity(entries.len());
    let mut decisions = SmallVec::with_capacity(entries.len());
    for (i, e) in entries.iter_mut().enumerate() {
        let asked = e.hits.unwrap_or(hits);
        rooms.push(e.limit.room(e.state, now, asked));
        let d = e
            .limit
            .usage(e.state, now, asked, mode)
            .unwrap_or(Decision::unlimited(asked));
        let short = asked.saturating_sub(d.granted);
        if !e.shadow && short > shortfall {
            shortfall = short;
            limited_by = Some(i);
        }
        decisions.push(d);
    }
    Ok(PlanDecision {
        granted: hits.saturating_sub(shortfall),
        allowed: true,
        wait: Nanos::ZERO,
        limited_by,
        shadow_limited: false,
        decisions,
        rooms,
    })
}

fn decide_try(entries: &mut [PlanEntry<'_>], now: Nanos, request: Hits) -> PlanDecision {
    let mut room = if request.is_well_formed() {
        request.hits
    } else {
        0
    };
    let mut limited_by = None;
    // The first live entry with hits of its own that has no room for all
    // of them: it alone refuses the plan.
    let mut own_short = None;
    let mut rooms: SmallVec<[u64; 4]> = SmallVec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let r = e.limit.room(e.state, now, e.asked(request).hits);
        rooms.push(r);
        if e.shadow {
            continue;
        }
        match e.hits {
            None if r < room => {
                room = r;
                limited_by = Some(i);
            }
            Some(h) if r < h && own_short.is_none() => own_short = Some(i),
            _ => {}
        }
    }
    let mut grant = Grant::from_room(request, room);
    if own_short.is_some() {
        if grant.allowed {
            limited_by = own_short;
        }
        grant = Grant {
            granted: 0,
            allowed: false,
        };
    }
    let mut shadow_limited = false;
    let mut wait = Nanos::ZERO;
    let decisions = entries
        .iter_mut()
        .zip(rooms.iter().copied())
        .map(|(e, r)| {
            let asked = e.asked(request);
            let own = match e.hits {
                // Its own hits, all or none: the plan's verdict, and for a
                // shadow entry its own room too.
                Some(h) => {
                    let fits = grant.allowed && (!e.shadow || r >= h);
                    shadow_limited |= e.shadow && grant.allowed && !fits;
                    Grant {
                        granted: if fits { h } else { 0 },
                        allowed: fits,
                    }
                }
                None if e.shadow => {
                    // What this limit would grant, and record, if it were
                    // live: the request against it and the live limits
                    // together.
                    let live = if own_short.is_some() {
                        grant
                    } else {
                        Grant::from_room(request, r.min(room))
                    };
                    shadow_limited |= live.granted < grant.granted;
                    live
                }
                None => grant,
            };
            let d = e.limit.commit(e.state, now, asked, own);
            if !e.shadow {
                wait = wait.max(d.wait);
            }
            d
        })
        .collect();
    // With every entry asked its own hits, the request's hits stand for
    // the plan's.
    let granted = if entries.iter().all(|e| e.hits.is_some()) && grant.allowed {
        request.hits
    } else {
        grant.granted
    };
    PlanDecision {
        granted,
        allowed: grant.allowed,
        wait,
        limited_by: if granted < request.hits || own_short.is_some() {
            limited_by
        } else {
            None
        },
        shadow_limited,
        decisions,
        rooms,
    }
}

fn acquire(
    entries: &mut [PlanEntry<'_>],
    now: Nanos,
    hits: u64,
) -> Result<PlanDecision, PlanError> {
    // Every limit says how long the request must wait for it, without
    // changing anything; the request proceeds when the last one allows it,
    // and limits that log when hits happen (sliding logs) log them then.
    let mut wait = Nanos::ZERO;
    for (index, e) in entries.iter().enumerate() {
        if !e.limit.can_schedule() {
            return Err(PlanError::CannotSchedule {
                index,
                algorithm: e.limit.algorithm_name(),
            });
        }
        let asked = e.hits.unwrap_or(hits);
        let Some(w) = e.limit.acquire_wait(e.state, now, asked) else {
            return Err(PlanError::NeverAdmits { index, hits: asked });
        };
        if !e.shadow {
            wait = wait.max(w);
        }
    }
    let rooms = entries.iter().map(|e| e.hits.unwrap_or(hits)).collect();
    let mut decisions = SmallVec::with_capacity(entries.len());
    for e in entries.iter_mut() {
        let asked = e.hits.unwrap_or(hits);
        let d = e
            .limit
            .acquire_at(e.state, now, asked, wait)
            .unwrap_or(Decision::unlimited(asked));
        decisions.push(d);
    }
    Ok(PlanDecision {
        granted: hits,
        allowed: true,
        wait,
        limited_by: None,
        shadow_limited: false,
        decisions,
        rooms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{per_second_limit, Rate, TokenBucket};

    #[test]
    fn acquire_waits_for_the_slowest_limit_and_logs_hits_then() {
        // A token bucket refilling 10/s behind a hard limit of 2 per second.
        let bucket =
            Limit::TokenBucket(TokenBucket::new(100, Rate::per_second(10).unwrap()).unwrap());
        let hard = Limit::SlidingLog(per_second_limit(2).unwrap());
        let (mut b, mut h) = (bucket.fresh(), hard.fresh());
        let now = Nanos::from_secs(5);
        let mut waits = Vec::new();
        for _ in 0..3 {
            let mut entries = [
                PlanEntry {
                    limit: &bucket,
                    state: &mut b,
                    shadow: false,
                    hits: None,
                },
                PlanEntry {
                    limit: &hard,
                    state: &mut h,
                    shadow: false,
                    hits: None,
                },
            ];
            waits.push(
                decide(&mut entries, now, Hits::exactly(1), Mode::Acquire)
                    .unwrap()
                    .wait,
            );
        }
        assert_eq!(
            waits,
            vec![
                Nanos::ZERO,
                Nanos::ZERO,
                Nanos::SECOND.saturating_add(Nanos::NANOSECOND)
            ]
        );
        // More than the hard limit at once can never be scheduled, and
        // refusing changes nothing.
        let before = (b.clone(), h.clone());
        let mut entries = [
            PlanEntry {
                limit: &bucket,
                state: &mut b,
                shadow: false,
                hits: None,
            },
            PlanEntry {
                limit: &hard,
                state: &mut h,
                shadow: false,
                hits: None,
            },
        ];
        let err = decide(&mut entries, now, Hits::exactly(3), Mode::Acquire).unwrap_err();
        assert_eq!(err, PlanError::NeverAdmits { index: 1, hits: 3 });
        assert_eq!((b, h), before);
    }

    #[test]
    fn shadow_entries_record_what_they_would_live() {
        // Live: room 5. Shadow: room 2, below min_hits 3, so as a live limit
        // it would have rejected and recorded nothing.
        let live = Limit::SlidingLog(per_second_limit(5).unwrap());
        let shadow = Limit::SlidingLog(per_second_limit(2).unwrap());
        let (mut a, mut s) = (live.fresh(), shadow.fresh());
        let mut entries = [
            PlanEntry {
                limit: &live,
                state: &mut a,
                shadow: false,
                hits: None,
            },
            PlanEntry {
                limit: &shadow,
                state: &mut s,
                shadow: true,
                hits: None,
            },
        ];
        let d = decide(&mut entries, Nanos::ZERO, Hits::between(3, 4), Mode::Try).unwrap();
        assert_eq!((d.granted, d.shadow_limited), (4, true));
        assert_eq!(d.decisions[1].granted, 0);
        assert!(
            shadow.is_idle(&s, Nanos::ZERO),
            "nothing recorded in the shadow limit"
        );
    }
}
