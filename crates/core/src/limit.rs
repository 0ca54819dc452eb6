//! One type for "any algorithm with its parameters": [`Limit`], and its
//! per-key state [`LimitState`].
//!
//! Stores keep states of many algorithms side by side, so they work with
//! this enum rather than with generics; dispatch is one `match`. `Limit`
//! implements [`Algorithm`] itself, so code that decides never cares which
//! algorithm it holds.

use crate::algorithm::{Algorithm, Alone, Schedule, Usage};
use crate::algorithms::burst_tiers::{BurstTiers, BurstTiersState};
use crate::algorithms::fixed_window::{FixedWindow, FixedWindowState};
use crate::algorithms::gcra::{Gcra, GcraState};
use crate::algorithms::leaky_bucket::LeakyBucket;
use crate::algorithms::sliding_log::{SlidingLog, SlidingLogState};
use crate::algorithms::sliding_window::{SlidingWindow, SlidingWindowState};
use crate::algorithms::smooth::{Smooth, SmoothKind, SmoothState};
use crate::algorithms::token_bucket::{TokenBucket, TokenBucketState};
use crate::decision::{Decision, Grant, Hits, Mode};
use crate::error::ParamError;
use crate::replicated::strategy::{ReplicatedLimit, ReplicatedState};
use crate::time::Nanos;

/// Any algorithm, with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum Limit {
    /// [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// [`Gcra`].
    Gcra(Gcra),
    /// [`LeakyBucket`].
    LeakyBucket(LeakyBucket),
    /// [`FixedWindow`].
    FixedWindow(FixedWindow),
    /// [`SlidingWindow`].
    SlidingWindow(SlidingWindow),
    /// [`SlidingLog`].
    SlidingLog(SlidingLog),
    /// [`Smooth`], bursty or warming up.
    Smooth(Smooth),
    /// [`BurstTiers`].
    BurstTiers(BurstTiers),
    /// A token bucket replicated over a gossip cluster, as one node runs
    /// it ([`ReplicatedLimit`]).
    Replicated(ReplicatedLimit),
}

/// The state of any algorithm for one key.
#[derive(Clone, Debug, PartialEq)]
pub enum LimitState {
    /// Token bucket.
    TokenBucket(TokenBucketState),
    /// GCRA and leaky bucket (the same virtual-time state).
    Gcra(GcraState),
    /// Fixed window.
    FixedWindow(FixedWindowState),
    /// Sliding window.
    SlidingWindow(SlidingWindowState),
    /// Sliding log.
    SlidingLog(SlidingLogState),
    /// Smooth limiters.
    Smooth(SmoothState),
    /// Burst tiers.
    BurstTiers(BurstTiersState),
    /// A replicated state, boxed: it is larger than the others, and every
    /// stored state of every algorithm pays the enum's inline size.
    Replicated(Box<ReplicatedState>),
}

/// Runs `$body` with the algorithm and its matching state, or `$other`
/// when the state belongs to another algorithm (parameters changed under a
/// key); callers treat such a state as fresh.
macro_rules! with_state {
    ($limit:expr, $state:expr, |$alg:ident, $st:ident| $body:expr, $other:expr) => {
        match ($limit, $state) {
            (Limit::TokenBucket($alg), LimitState::TokenBucket($st)) => $body,
            (Limit::Gcra($alg), LimitState::Gcra($st)) => $body,
            (Limit::LeakyBucket($alg), LimitState::Gcra($st)) => $body,
            (Limit::FixedWindow($alg), LimitState::FixedWindow($st)) => $body,
            (Limit::SlidingWindow($alg), LimitState::SlidingWindow($st)) => $body,
            (Limit::SlidingLog($alg), LimitState::SlidingLog($st)) => $body,
            (Limit::Smooth($alg), LimitState::Smooth($st)) => $body,
            (Limit::BurstTiers($alg), LimitState::BurstTiers($st)) => $body,
            (Limit::Replicated($alg), LimitState::Replicated($st)) if $alg.owns($st) => $body,
            _ => $other,
        }
    };
}

impl Limit {
    /// The algorithm's name as written in the config.
    pub fn algorithm_name(&self) -> &'static str {
        match self {
            Limit::TokenBucket(_) => "token_bucket",
            Limit::Gcra(_) => "gcra",
            Limit::LeakyBucket(_) => "leaky_bucket",
            Limit::FixedWindow(_) => "fixed_window",
            Limit::SlidingWindow(_) => "sliding_window",
            Limit::SlidingLog(_) => "sliding_log",
            Limit::Smooth(s) => match s.kind() {
                SmoothKind::Bursty { .. } => "smooth_bursty",
                SmoothKind::WarmingUp { .. } => "smooth_warming_up",
            },
            Limit::BurstTiers(_) => "burst_tiers",
            Limit::Replicated(r) => match r.kind() {
                crate::replicated::strategy::StrategyKind::Counter => "replicated_counter",
                crate::replicated::strategy::StrategyKind::Queue => "replicated_queue",
                crate::replicated::strategy::StrategyKind::Epoch => "replicated_epoch",
            },
        }
    }

    /// Whether the algorithm can answer [`crate::Mode::Acquire`].
    pub fn can_schedule(&self) -> bool {
        matches!(
            self,
            Limit::TokenBucket(_)
                | Limit::Gcra(_)
                | Limit::LeakyBucket(_)
                | Limit::Smooth(_)
                | Limit::SlidingLog(_)
        )
    }

    /// Whether the algorithm has a sound debt and so answers
    /// [`Mode::Report`] and [`Mode::Refund`] ([`Usage`]). The smooth
    /// limiters (whose requests already pay for the previous one), burst
    /// tiers (whose hits belong to the tier current when granted) and the
    /// replicated buckets (gossiped counters a node cannot take back from
    /// its peers) do not.
    pub fn takes_usage(&self) -> bool {
        match self {
            Limit::TokenBucket(_)
            | Limit::Gcra(_)
            | Limit::LeakyBucket(_)
            | Limit::FixedWindow(_)
            | Limit::SlidingWindow(_)
            | Limit::SlidingLog(_) => true,
            Limit::Replicated(r) => r.takes_usage(),
            _ => false,
        }
    }

    /// The same limit with reports bounded at `max_debt` hits beyond what a
    /// fresh state admits ([`Usage`]); an algorithm that takes no usage is
    /// returned unchanged. Fails when `max_debt` hits take longer than a
    /// span to refill.
    pub fn with_max_debt(self, max_debt: u64) -> Result<Limit, ParamError> {
        Ok(match self {
            Limit::TokenBucket(a) => Limit::TokenBucket(a.with_max_debt(max_debt)?),
            Limit::Gcra(a) => Limit::Gcra(a.with_max_debt(max_debt)?),
            Limit::LeakyBucket(a) => Limit::LeakyBucket(a.with_max_debt(max_debt)?),
            Limit::FixedWindow(a) => Limit::FixedWindow(a.with_max_debt(max_debt)),
            Limit::SlidingWindow(a) => Limit::SlidingWindow(a.with_max_debt(max_debt)),
            Limit::SlidingLog(a) => Limit::SlidingLog(a.with_max_debt(max_debt)),
            Limit::Replicated(a) => Limit::Replicated(a.with_max_debt(max_debt)?),
            other => other,
        })
    }

    /// The most hits a report may leave owing; `None` for an algorithm
    /// that takes no usage.
    pub fn max_debt(&self) -> Option<u64> {
        match self {
            Limit::TokenBucket(a) => Some(a.max_debt()),
            Limit::Gcra(a) => Some(a.max_debt()),
            Limit::LeakyBucket(a) => Some(a.meter().max_debt()),
            Limit::FixedWindow(a) => Some(a.max_debt()),
            Limit::SlidingWindow(a) => Some(a.max_debt()),
            Limit::SlidingLog(a) => Some(a.max_debt()),
            Limit::Replicated(a) => a.max_debt(),
            _ => None,
        }
    }

    /// [`Mode::Report`] or [`Mode::Refund`] of `hits` ([`Usage`]); `None`,
    /// changing nothing, for an algorithm that takes no usage or another
    /// mode.
    pub fn usage(
        &self,
        state: &mut LimitState,
        now: Nanos,
        hits: u64,
        mode: Mode,
    ) -> Option<Decision> {
        if !self.takes_usage() || !mode.is_usage() {
            return None;
        }
        if !self.owns(state) {
            *state = self.fresh();
        }
        fn apply<U: Usage>(a: &U, s: &mut U::State, now: Nanos, hits: u64, mode: Mode) -> Decision {
            if mode == Mode::Refund {
                a.refund(s, now, hits)
            } else {
                a.report(s, now, hits)
            }
        }
        match (self, state) {
            (Limit::TokenBucket(a), LimitState::TokenBucket(s)) => {
                Some(apply(a, s, now, hits, mode))
            }
            (Limit::Gcra(a), LimitState::Gcra(s)) => Some(apply(a, s, now, hits, mode)),
            (Limit::LeakyBucket(a), LimitState::Gcra(s)) => Some(apply(a, s, now, hits, mode)),
            (Limit::FixedWindow(a), LimitState::FixedWindow(s)) => {
                Some(apply(a, s, now, hits, mode))
            }
            (Limit::Replicated(a), LimitState::Replicated(s)) => {
                a.usage(s, now, hits, mode == Mode::Refund)
            }
            (Limit::SlidingWindow(a), LimitState::SlidingWindow(s)) => {
                Some(apply(a, s, now, hits, mode))
            }
            (Limit::SlidingLog(a), LimitState::SlidingLog(s)) => Some(apply(a, s, now, hits, mode)),
            _ => None,
        }
    }

    /// Whether `state` belongs to this algorithm.
    pub fn owns(&self, state: &LimitState) -> bool {
        matches!(
            (self, state),
            (Limit::TokenBucket(_), LimitState::TokenBucket(_))
                | (Limit::Gcra(_) | Limit::LeakyBucket(_), LimitState::Gcra(_))
                | (Limit::FixedWindow(_), LimitState::FixedWindow(_))
                | (Limit::SlidingWindow(_), LimitState::SlidingWindow(_))
                | (Limit::SlidingLog(_), LimitState::SlidingLog(_))
                | (Limit::Smooth(_), LimitState::Smooth(_))
                | (Limit::BurstTiers(_), LimitState::BurstTiers(_))
        ) || matches!((self, state), (Limit::Replicated(r), LimitState::Replicated(s)) if r.owns(s))
    }

    /// [`Mode::Acquire`](crate::Mode::Acquire): grants `hits` and returns
    /// the wait, or `None` if the algorithm cannot schedule them.
    pub fn acquire(&self, state: &mut LimitState, now: Nanos, hits: u64) -> Option<Decision> {
        let wait = self.acquire_wait(state, now, hits)?;
        self.acquire_at(state, now, hits, wait)
    }

    /// How long a request for `hits` would wait in
    /// [`Mode::Acquire`](crate::Mode::Acquire), without changing anything;
    /// `None` if the algorithm cannot schedule them.
    pub fn acquire_wait(&self, state: &LimitState, now: Nanos, hits: u64) -> Option<Nanos> {
        if let (Limit::SlidingLog(a), LimitState::SlidingLog(s)) = (self, state) {
            return a.schedule(s, now, hits);
        }
        if !self.can_schedule() {
            return None;
        }
        let mut probe = state.clone();
        self.acquire_at(&mut probe, now, hits, Nanos::ZERO)
            .map(|d| d.wait)
    }

    /// Grants `hits` for a request that proceeds `wait` from now (at least
    /// this algorithm's own wait). Only logs care: a sliding log records the
    /// hits when they happen; the others charge them as they schedule.
    pub fn acquire_at(
        &self,
        state: &mut LimitState,
        now: Nanos,
        hits: u64,
        wait: Nanos,
    ) -> Option<Decision> {
        if !self.owns(state) {
            *state = self.fresh();
        }
        match (self, state) {
            (Limit::TokenBucket(a), LimitState::TokenBucket(s)) => Some(a.acquire(s, now, hits)),
            (Limit::Gcra(a), LimitState::Gcra(s)) => Some(a.acquire(s, now, hits)),
            (Limit::LeakyBucket(a), LimitState::Gcra(s)) => Some(a.acquire(s, now, hits)),
            (Limit::Smooth(a), LimitState::Smooth(s)) => Some(a.acquire(s, now, hits)),
            (Limit::SlidingLog(a), LimitState::SlidingLog(s)) => {
                let own = a.schedule(s, now, hits)?;
                let at = now.saturating_add(own.max(wait));
                Some(a.acquire_at(s, now, hits, at))
            }
            _ => None,
        }
    }
}

impl Algorithm for Limit {
    type State = LimitState;

    /// One dispatch for the whole decision: the concrete algorithm's room,
    /// grant, commit and idle check are inlined together, rather than
    /// matching the enum pair three times.
    #[inline]
    fn decide_alone(&self, state: &mut LimitState, now: Nanos, request: Hits) -> Alone {
        match (self, &mut *state) {
            (Limit::Gcra(a), LimitState::Gcra(s)) => a.decide_alone(s, now, request),
            (Limit::TokenBucket(a), LimitState::TokenBucket(s)) => a.decide_alone(s, now, request),
            (Limit::LeakyBucket(a), LimitState::Gcra(s)) => a.decide_alone(s, now, request),
            (Limit::FixedWindow(a), LimitState::FixedWindow(s)) => a.decide_alone(s, now, request),
            (Limit::SlidingWindow(a), LimitState::SlidingWindow(s)) => {
                a.decide_alone(s, now, request)
            }
            (Limit::SlidingLog(a), LimitState::SlidingLog(s)) => a.decide_alone(s, now, request),
            (Limit::Smooth(a), LimitState::Smooth(s)) => a.decide_alone(s, now, request),
            (Limit::BurstTiers(a), LimitState::BurstTiers(s)) => a.decide_alone(s, now, request),
            (Limit::Replicated(a), LimitState::Replicated(s)) if a.owns(s) => {
                a.decide_alone(s, now, request)
            }
            // Another algorithm's state (parameters changed under a key):
            // decide on a fresh one, which always matches.
            _ => {
                *state = self.fresh();
                self.decide_alone(state, now, request)
            }
        }
    }

    fn fresh(&self) -> LimitState {
        match self {
            Limit::TokenBucket(a) => LimitState::TokenBucket(a.fresh()),
            Limit::Gcra(a) => LimitState::Gcra(a.fresh()),
            Limit::LeakyBucket(a) => LimitState::Gcra(a.fresh()),
            Limit::FixedWindow(a) => LimitState::FixedWindow(a.fresh()),
            Limit::SlidingWindow(a) => LimitState::SlidingWindow(a.fresh()),
            Limit::SlidingLog(a) => LimitState::SlidingLog(a.fresh()),
            Limit::Smooth(a) => LimitState::Smooth(a.fresh()),
            Limit::BurstTiers(a) => LimitState::BurstTiers(a.fresh()),
            Limit::Replicated(a) => LimitState::Replicated(Box::new(a.fresh())),
        }
    }

    fn room(&self, state: &LimitState, now: Nanos, hits: u64) -> u64 {
        with_state!(self, state, |a, s| a.room(s, now, hits), {
            self.room(&self.fresh(), now, hits)
        })
    }

    fn commit(&self, state: &mut LimitState, now: Nanos, request: Hits, grant: Grant) -> Decision {
        if !self.owns(state) {
            *state = self.fresh();
        }
        with_state!(self, state, |a, s| a.commit(s, now, request, grant), {
            // `fresh` always matches; kept total instead of panicking.
            Decision::unlimited(0)
        })
    }

    fn is_idle(&self, state: &LimitState, now: Nanos) -> bool {
        with_state!(self, state, |a, s| a.is_idle(s, now), true)
    }
}

impl LimitState {
    /// Bytes this state occupies, inline and on the heap (map overhead
    /// excluded), for the memory benchmarks.
    pub fn footprint(&self) -> usize {
        let heap = match self {
            LimitState::SlidingWindow(s) if s.counts.spilled() => s.counts.capacity() * 8,
            LimitState::SlidingLog(log) => std::mem::size_of_val(&**log) + log.heap_bytes(),
            LimitState::BurstTiers(tiers) => tiers
                .iter()
                .map(|t| std::mem::size_of_val(t) + t.log.heap_bytes())
                .sum(),
            LimitState::Replicated(r) => r.footprint() + std::mem::size_of::<ReplicatedState>(),
            _ => 0,
        };
        std::mem::size_of::<LimitState>() + heap
    }
}
