//! Charon's burst tiers (Charon §2.1, Figures 1–3).
//!
//! A resource has tiers `1..=n`, each `(limit, window, active, cooldown,
//! skippable)`. Every tier keeps a sliding window of the hits granted while
//! it was the current tier. A tier is *inactive* until a request bursts into
//! it; it is then *active* for `active`, in *cooldown* for `cooldown`, and
//! inactive again. Its hits count in its window until they leave it, also
//! across a re-entry: a tier with no cooldown, re-entered as its active
//! period ends, still never holds more than its limit in one window (the
//! over-limit Charon §4.1's trimming rule guards against). Once they have
//! left, nothing of the tier is kept (Charon §4.2: keys of a tier whose
//! cooldown ended are removed).
//!
//! The *current* tier is the active tier with the greatest index, or the fake
//! tier 0 (limit 0, infinite window) when none is active. Hits go into the
//! current tier while its window has room. When it is at capacity a request
//! *bursts* into the next tier, which starts its active period at once —
//! unless that tier is in cooldown: a skippable one is skipped for the one
//! above it, a non-skippable one blocks the burst. Tier 0 is always at
//! capacity, so a request there always bursts. *Fallback* needs no action:
//! when the current tier's active period ends, the highest tier still active
//! is current again, however many levels below.
//!
//! A multi-hit request fills the current tier, bursts, fills the next, and
//! so on (it may pass through several tiers). It is granted the largest `n`
//! in `[min_hits, hits]` this walk admits, or nothing: a rejected request
//! changes no tier (Charon §3.1: "the access log will remain untouched").
//!
//! Window edges follow Charon: a hit at `t` counts while `now <= t + window`.

use smallvec::SmallVec;

use crate::algorithm::Algorithm;
use crate::algorithms::hit_log::HitLog;
use crate::decision::{Decision, Grant, Hits, TierInfo};
use crate::error::ParamError;
use crate::time::{Nanos, Span};

/// One burst tier's configuration, `(L, Tw, Ta, Tc, S)` in Charon §2.1.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tier {
    /// Most hits inside the window.
    pub limit: u64,
    /// The sliding window's span.
    pub window: Nanos,
    /// How long the tier stays active once entered.
    pub active: Nanos,
    /// How long it then cools down before it may be entered again.
    pub cooldown: Nanos,
    /// Whether a burst may skip over it while it cools down.
    pub skippable: bool,
}

/// Burst-tier parameters: the tiers, lowest first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BurstTiers {
    tiers: Vec<Tier>,
}

/// Marks a tier never entered (or forgotten).
const NEVER: Nanos = Nanos::MAX;

/// One tier's state: when it was entered and its window's hits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TierState {
    /// When the tier's current active period began (`Nanos::MAX`: never).
    pub entered: Nanos,
    /// Hits granted while this tier was current.
    pub log: HitLog,
}

/// Burst-tier state: one entry per configured tier (tier `i` at `i - 1`).
pub type BurstTiersState = Box<[TierState]>;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Phase {
    Inactive,
    Active,
    Cooldown,
}

/// What a request would do: hits per tier and the tiers it enters.
#[derive(Default)]
struct Walk {
    granted: u64,
    takes: SmallVec<[(usize, u64); 4]>,
    entered: SmallVec<[usize; 4]>,
}

impl BurstTiers {
    /// Tiers lowest first. Each needs a positive limit, window and active
    /// period; an empty list makes the resource inaccessible (Charon §2.1).
    pub fn new(tiers: Vec<Tier>) -> Result<BurstTiers, ParamError> {
        for t in &tiers {
            if t.limit == 0 {
                return Err(ParamError::Invalid {
                    param: "limit",
                    reason: "a tier's limit must be at least 1: a tier with limit 0 can never be entered".into(),
                });
            }
            ParamError::span("window", t.window)?;
            ParamError::span("active", t.active)?;
            // The cycle of active then cooldown is a span too (`active` is
            // positive, so only its bound can fail).
            Span::new(t.active.saturating_add(t.cooldown)).map_err(|problem| {
                ParamError::TooLarge {
                    param: "cooldown",
                    reason: format!("`active` + `cooldown` {problem}"),
                }
            })?;
        }
        Ok(BurstTiers { tiers })
    }

    /// The tiers, lowest first.
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// Tier `i` (1-based).
    fn tier(&self, i: usize) -> &Tier {
        &self.tiers[i - 1]
    }

    fn phase(&self, i: usize, st: &TierState, now: Nanos) -> Phase {
        if st.entered == NEVER {
            return Phase::Inactive;
        }
        let t = self.tier(i);
        let active_end = st.entered.saturating_add(t.active);
        if now < active_end {
            Phase::Active
        } else if now < active_end.saturating_add(t.cooldown) {
            Phase::Cooldown
        } else {
            Phase::Inactive
        }
    }

    /// The current tier at `now` (0: the fake tier).
    fn current(&self, states: &[TierState], now: Nanos) -> usize {
        (1..=self.tiers.len())
            .rev()
            .find(|&i| self.phase(i, &states[i - 1], now) == Phase::Active)
            .unwrap_or(0)
    }

    /// Hits in tier `i`'s window at `now`.
    fn count(&self, i: usize, states: &[TierState], now: Nanos) -> u64 {
        states[i - 1]
            .log
            .count_since(now.saturating_sub(self.tier(i).window))
    }

    /// The tier a burst from `from` enters, skipping skippable tiers in
    /// cooldown; `None` if the burst is blocked or there is no tier above.
    fn burst_target(&self, states: &[TierState], now: Nanos, from: usize) -> Option<usize> {
        for j in from + 1..=self.tiers.len() {
            match self.phase(j, &states[j - 1], now) {
                Phase::Cooldown if self.tier(j).skippable => continue,
                Phase::Cooldown => return None,
                Phase::Inactive | Phase::Active => return Some(j),
            }
        }
        None
    }

    /// Walks `hits` through the tiers at `now` without changing anything.
    fn walk(&self, states: &[TierState], now: Nanos, hits: u64) -> Walk {
        let mut walk = Walk::default();
        let mut left = hits;
        let mut c = self.current(states, now);
        loop {
            if c > 0 {
                let used = self.count(c, states, now);
                let take = self.tier(c).limit.saturating_sub(used).min(left);
                if take > 0 {
                    walk.takes.push((c, take));
                    walk.granted += take;
                    left -= take;
                }
            }
            if left == 0 {
                break;
            }
            match self.burst_target(states, now, c) {
                Some(j) => {
                    walk.entered.push(j);
                    c = j;
                }
                None => break,
            }
        }
        walk
    }

    /// The next instant after `t` at which some tier changes phase.
    fn next_transition(&self, states: &[TierState], t: Nanos) -> Option<Nanos> {
        let mut next: Option<Nanos> = None;
        for (i, st) in states.iter().enumerate() {
            if st.entered == NEVER {
                continue;
            }
            let tier = &self.tiers[i];
            let active_end = st.entered.saturating_add(tier.active);
            for edge in [active_end, active_end.saturating_add(tier.cooldown)] {
                if edge > t && next.is_none_or(|n| edge < n) {
                    next = Some(edge);
                }
            }
        }
        next
    }

    /// Earliest time from `now` at which `min_hits` would be granted,
    /// assuming no other traffic. Phases only change at transitions; between
    /// two of them the tiers' windows only empty, so what the walk admits
    /// only grows, and the first instant that admits `min_hits` is found by
    /// binary search. After the last transition, nothing changes once every
    /// window is empty.
    fn retry_after(&self, states: &[TierState], now: Nanos, min_hits: u64) -> Option<Nanos> {
        if min_hits == 0 {
            return Some(Nanos::ZERO);
        }
        let admits = |t: Nanos| self.walk(states, t, min_hits).granted >= min_hits;
        let settled = states
            .iter()
            .zip(&self.tiers)
            .filter_map(|(st, tier)| st.log.newest().map(|n| n.saturating_add(tier.window)))
            .max()
            .unwrap_or(Nanos::ZERO)
            .saturating_add(Nanos::NANOSECOND);
        let mut start = now;
        loop {
            let next = self.next_transition(states, start);
            // The segment [start, end) has fixed phases.
            let end = next.unwrap_or_else(|| settled.max(start).saturating_add(Nanos::NANOSECOND));
            let last = end.saturating_sub(Nanos::NANOSECOND);
            if admits(last) {
                let (mut lo, mut hi) = (start, last);
                while lo < hi {
                    let mid = Nanos::new(lo.as_u64() + (hi.as_u64() - lo.as_u64()) / 2);
                    if admits(mid) {
                        hi = mid;
                    } else {
                        lo = mid.saturating_add(Nanos::NANOSECOND);
                    }
                }
                return Some(lo.saturating_sub(now));
            }
            match next {
                // Transitions lie strictly after `start`: the loop ends.
                Some(t) if t > start => start = t,
                _ => return None,
            }
        }
    }
}

impl Algorithm for BurstTiers {
    type State = BurstTiersState;

    fn fresh(&self) -> BurstTiersState {
        (0..self.tiers.len())
            .map(|_| TierState {
                entered: NEVER,
                log: HitLog::default(),
            })
            .collect()
    }

    fn room(&self, states: &BurstTiersState, now: Nanos, hits: u64) -> u64 {
        if states.len() != self.tiers.len() {
            return self.walk(&self.fresh(), now, hits).granted;
        }
        self.walk(states, now, hits).granted
    }

    fn commit(
        &self,
        states: &mut BurstTiersState,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        if states.len() != self.tiers.len() {
            *states = self.fresh();
        }
        // Forget ended periods, and hits that left the windows.
        for (i, st) in states.iter_mut().enumerate() {
            if self.phase(i + 1, st, now) == Phase::Inactive {
                st.entered = NEVER;
            }
            st.log.prune(now.saturating_sub(self.tiers[i].window));
        }
        let mut burst = false;
        if grant.granted > 0 {
            let walk = self.walk(states, now, grant.granted);
            for &j in &walk.entered {
                states[j - 1].entered = now;
                burst = true;
            }
            for &(j, n) in &walk.takes {
                states[j - 1].log.push(now, n, self.tier(j).limit);
            }
        }
        let c = self.current(states, now);
        let (limit, hits) = if c == 0 {
            (0, 0)
        } else {
            (self.tier(c).limit, self.count(c, states, now))
        };
        // Fresh again once every period has ended and every window emptied.
        let reset_after = states
            .iter()
            .zip(&self.tiers)
            .map(|(st, t)| {
                let period_end = if st.entered == NEVER {
                    Nanos::ZERO
                } else {
                    st.entered
                        .saturating_add(t.active)
                        .saturating_add(t.cooldown)
                };
                let window_end = st.log.newest().map_or(Nanos::ZERO, |n| {
                    n.saturating_add(t.window).saturating_add(Nanos::NANOSECOND)
                });
                period_end.max(window_end).saturating_sub(now)
            })
            .max()
            .unwrap_or(Nanos::ZERO);
        Decision {
            granted: grant.granted,
            allowed: grant.allowed,
            limit,
            remaining: self.walk(states, now, u64::MAX).granted,
            reset_after,
            retry_after: self.retry_after(states, now, request.min_hits),
            wait: Nanos::ZERO,
            tier: Some(TierInfo {
                index: c as u32,
                limit,
                hits,
                burst,
            }),
        }
    }

    fn is_idle(&self, states: &BurstTiersState, now: Nanos) -> bool {
        states.iter().enumerate().all(|(i, st)| {
            i >= self.tiers.len()
                || (self.phase(i + 1, st, now) == Phase::Inactive
                    && st.log.count_since(now.saturating_sub(self.tiers[i].window)) == 0)
        })
    }
}
