//! The shape every algorithm has: a pure update of a state value.
//!
//! An algorithm is split in two steps so that a plan of several limits can
//! be decided all or nothing (see [`crate::plan`]): [`Algorithm::room`] asks,
//! without changing anything, how many of the requested hits the state would
//! admit now; [`Algorithm::commit`] records what was finally granted (which
//! may be less, because another limit of the plan admitted less) and reports
//! the decision. Every algorithm's room is monotone — if it admits `n` hits
//! it admits any fewer — so the largest grant every limit allows is the
//! minimum of their rooms.
//!
//! The store owns atomicity (a shard lock, a Lua script, a CRDT merge); the
//! algorithm never knows which one runs it.

use crate::decision::{Decision, Grant, Hits};
use crate::time::Nanos;

/// A limiting algorithm: its parameters are `self`, its per-key state is
/// [`Algorithm::State`].
pub trait Algorithm {
    /// Per-key state. A missing key is [`Algorithm::fresh`].
    type State: Clone + std::fmt::Debug;

    /// The state of a key that has never been seen.
    fn fresh(&self) -> Self::State;

    /// How many of `hits` the state admits at `now`, without changing it.
    fn room(&self, state: &Self::State, now: Nanos, hits: u64) -> u64;

    /// Records `grant` at `now` and describes the state afterwards;
    /// `request` is what was asked, for `retry_after` and for algorithms that
    /// record rejected attempts.
    fn commit(&self, state: &mut Self::State, now: Nanos, request: Hits, grant: Grant) -> Decision;

    /// Whether the state is equivalent to [`Algorithm::fresh`] at `now` and
    /// every later time, so a store may drop it without changing any future
    /// decision.
    fn is_idle(&self, state: &Self::State, now: Nanos) -> bool;

    /// Decides one request against one limit: `(params, &mut state, now,
    /// hits, min_hits) -> decision`.
    fn decide(&self, state: &mut Self::State, now: Nanos, request: Hits) -> Decision {
        self.decide_alone(state, now, request).decision
    }

    /// [`Algorithm::decide`], also reporting the room it found and whether
    /// the state is idle afterwards: everything a store needs to decide a
    /// one-limit plan in one call. Inlined where it can be, so that a
    /// store's single-limit path is one piece of code per algorithm.
    #[inline]
    fn decide_alone(&self, state: &mut Self::State, now: Nanos, request: Hits) -> Alone {
        // A malformed request (min_hits > hits) is rejected by the grant
        // rule; its room is still reported, as a plan reports it.
        let room = self.room(state, now, request.hits);
        let grant = Grant::from_room(request, room);
        let decision = self.commit(state, now, request, grant);
        Alone {
            decision,
            room,
            idle: self.is_idle(state, now),
        }
    }
}

/// The result of [`Algorithm::decide_alone`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Alone {
    /// The decision.
    pub decision: Decision,
    /// How many of the requested hits the state admitted before deciding.
    pub room: u64,
    /// Whether the state is idle afterwards (a store may drop it).
    pub idle: bool,
}

/// An algorithm that can schedule: it always grants, and says how long the
/// caller must sleep before using the hits ([`crate::Mode::Acquire`]).
pub trait Schedule: Algorithm {
    /// Grants `hits` at `now`, recording them, and returns the wait.
    fn acquire(&self, state: &mut Self::State, now: Nanos, hits: u64) -> Decision;
}

/// An algorithm with a sound debt: it can be charged for hits already used
/// ([`crate::Mode::Report`]) and give unused hits back
/// ([`crate::Mode::Refund`]).
///
/// A report charges as many of `hits` as keep the state within the limit's
/// `max_debt` (hits beyond what a fresh state admits; by default one full
/// limit) and leaves the rest uncharged: a report never fails, and its
/// decision's `granted` says how many hits were charged. The debt is paid
/// before anything is granted again: a bucket's tokens go negative and
/// refill to zero first, a window's count goes above its limit until the
/// window moves on. A refund gives back as many of `hits` as keep the
/// state no fresher than a fresh one (a full bucket, an empty window); its
/// `granted` says how many were given back. Both describe the state after,
/// with `retry_after` for one more hit.
pub trait Usage: Algorithm {
    /// Charges `hits` already used at `now`, into debt up to the bound.
    fn report(&self, state: &mut Self::State, now: Nanos, hits: u64) -> Decision;

    /// Gives back up to `hits` at `now`, never past a fresh state.
    fn refund(&self, state: &mut Self::State, now: Nanos, hits: u64) -> Decision;
}

/// What a report or refund describes its state for: one more hit.
pub(crate) const NEXT_HIT: Hits = Hits::exactly(1);
