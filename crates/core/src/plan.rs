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

use smallvec::SmallVec;
use thiserror::Error;

use crate::algorithm::Algorithm;
use crate::decision::{Decision, Grant, Mode, Request};
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

/// Decides `request` against every entry at `now`, all or nothing.
pub fn decide(
    entries: &mut [PlanEntry<'_>],
    now: Nanos,
    request: Request,
    mode: Mode,
) -> Result<PlanDecision, PlanError> {
    match mode {
        Mode::Try => Ok(decide_try(entries, now, request)),
        Mode::Acquire => acquire(entries, now, request.hits),
    }
}

fn decide_try(entries: &mut [PlanEntry<'_>], now: Nanos, request: Request) -> PlanDecision {
    let mut room = if request.is_well_formed() {
        request.hits
    } else {
        0
    };
    let mut limited_by = None;
    let mut rooms: SmallVec<[u64; 4]> = SmallVec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let r = e.limit.room(e.state, now, request.hits);
        rooms.push(r);
        if !e.shadow && r < room {
            room = r;
            limited_by = Some(i);
        }
    }
    let grant = Grant::from_room(request, room);
    let mut shadow_limited = false;
    let mut wait = Nanos::ZERO;
    let decisions = entries
        .iter_mut()
        .zip(rooms.iter().copied())
        .map(|(e, r)| {
            let own = if e.shadow {
                let granted = r.min(grant.granted);
                let fits = granted == grant.granted;
                shadow_limited |= !fits || (!grant.allowed && r < request.min_hits);
                Grant {
                    granted,
                    allowed: grant.allowed && fits,
                }
            } else {
                grant
            };
            let d = e.limit.commit(e.state, now, request, own);
            if !e.shadow {
                wait = wait.max(d.wait);
            }
            d
        })
        .collect();
    PlanDecision {
        granted: grant.granted,
        allowed: grant.allowed,
        wait,
        limited_by: if grant.granted < request.hits {
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
    if let Some((index, e)) = entries
        .iter()
        .enumerate()
        .find(|(_, e)| !e.limit.can_schedule())
    {
        return Err(PlanError::CannotSchedule {
            index,
            algorithm: e.limit.algorithm_name(),
        });
    }
    let mut wait = Nanos::ZERO;
    let rooms = entries.iter().map(|_| hits).collect();
    let mut decisions = SmallVec::with_capacity(entries.len());
    for e in entries.iter_mut() {
        let d = e
            .limit
            .acquire(e.state, now, hits)
            .unwrap_or(Decision::unlimited(hits));
        if !e.shadow {
            wait = wait.max(d.wait);
        }
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
