//! Replicated limit states: CRDTs that nodes of a gossip cluster update
//! locally and merge from their peers, with no store (the thesis, seed
//! 000, and the gossiping interval limiter, seed 001).
//!
//! Each type here is the state of one key (one user's bucket) on one node:
//! a local decision changes it at once; a state (or delta) received from a
//! peer is merged into it. Merges are joins of a semilattice: commutative,
//! associative and idempotent, so states converge whatever order, however
//! often and however late gossip arrives. Which keys changed, what each
//! neighbour still has to receive, and the transport are the replicated
//! store's business; the same code runs in the real cluster and in the
//! simulator.
//!
//! - [`counter`]: the thesis's token bucket as a G-counter of consumed
//!   tokens per node, with a limit and its refill time (§3.1, Listings
//!   3.1–3.4).
//! - [`queue`]: the thesis's token-bucket queue of (time of birth, time of
//!   death) elements and its merge (§4.1.2, §4.2, Listings 4.1–4.4).
//! - [`epoch`]: the gossiping interval limiter's bucket, corrected at each
//!   epoch boundary by its peers' traffic and allowed to go negative
//!   (seed 001).
//! - [`strategy`]: the three behind one type, [`strategy::ReplicatedLimit`],
//!   with what gossip carries for a key ([`strategy::Payload`]).

pub mod counter;
pub mod epoch;
pub mod queue;
pub mod strategy;

use crate::{Algorithm, Decision, Grant, Hits, Nanos};

/// A node of a replicated cluster, as the states know it: a number every
/// node derives the same way from the node's configured id, so states
/// merged on different nodes agree on whose entry is whose.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct NodeId(pub u64);

/// A key's reset generation: which reset of the key a replicated state
/// belongs to. States of a higher generation replace lower ones wholesale
/// in every merge, and states of a lower one are ignored, so a reset on
/// any node wins over every state from before it, whatever the order,
/// loss, duplication or delay of gossip (`docs/replicated.md`, "Resetting
/// counters").
///
/// Ordered by time, then node: two nodes resetting one key at the same
/// instant make two different generations, and every node agrees which is
/// larger. The default, [`Generation::ZERO`], is a key never reset.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Generation {
    /// When the reset was made, on the clock of the node that made it
    /// (and always after the generation it replaced).
    pub at: Nanos,
    /// The node that made it.
    pub node: NodeId,
}

impl Generation {
    /// A key never reset.
    pub const ZERO: Generation = Generation {
        at: Nanos::ZERO,
        node: NodeId(0),
    };

    /// The generation of a reset that `node` makes at `now` of a key in
    /// generation `self`: later than `self` even when `node`'s clock is
    /// behind the node that made `self` (or `self` is its own, made in
    /// the same instant). `None` when there is none: `self` is at the end
    /// of time ([`Nanos::MAX`], which only a peer's absurd generation
    /// reaches) and `node` orders no later than its maker, so any
    /// generation made here would merge as nothing.
    pub fn next(self, node: NodeId, now: Nanos) -> Option<Generation> {
        let next = Generation {
            at: now.max(self.at.saturating_add(Nanos::NANOSECOND)),
            node,
        };
        (next > self).then_some(next)
    }

    /// Whether this is [`Generation::ZERO`]: the key was never reset.
    pub fn is_zero(self) -> bool {
        self == Generation::ZERO
    }
}

/// Raises `node`'s entry of `entries` (sorted by node, no zeros) to at
/// least `count`: the per-node maximum every G-counter-like merge takes.
/// Answers whether it changed.
pub(crate) fn raise_entry<A>(entries: &mut smallvec::SmallVec<A>, node: NodeId, count: u64) -> bool
where
    A: smallvec::Array<Item = (NodeId, u64)>,
{
    if count == 0 {
        return false;
    }
    match entries.binary_search_by_key(&node, |e| e.0) {
        Ok(i) => {
            let entry = &mut entries[i].1;
            if count > *entry {
                *entry = count;
                true
            } else {
                false
            }
        }
        Err(i) => {
            entries.insert(i, (node, count));
            true
        }
    }
}

/// A replicated limit's parameters: they decide for one key's state on
/// behalf of a node, whose share of the state records the grants.
pub trait Replicated: Copy {
    /// One key's replicated state; the default is a key never seen.
    type State: Default + Clone + std::fmt::Debug;

    /// How many of `hits` `node` may grant now (the core's `room`).
    fn room_on(&self, state: &Self::State, node: NodeId, now: Nanos, hits: u64) -> u64;

    /// Records `grant` as `node`'s and describes the state after it (the
    /// core's `commit`).
    fn commit_on(
        &self,
        state: &mut Self::State,
        node: NodeId,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision;

    /// Whether the state is equivalent to a fresh one at `now`.
    fn idle(&self, state: &Self::State, now: Nanos) -> bool;
}

/// A replicated limit deciding on behalf of one node: the core's
/// [`Algorithm`], so plans and stores run it like any other limit.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct OnNode<L> {
    /// The limit's parameters.
    pub limit: L,
    /// The node deciding, whose share of the state records its grants.
    pub node: NodeId,
}

impl<L: Replicated> Algorithm for OnNode<L> {
    type State = L::State;

    fn fresh(&self) -> L::State {
        L::State::default()
    }

    fn room(&self, state: &L::State, now: Nanos, hits: u64) -> u64 {
        self.limit.room_on(state, self.node, now, hits)
    }

    fn commit(&self, state: &mut L::State, now: Nanos, request: Hits, grant: Grant) -> Decision {
        self.limit.commit_on(state, self.node, now, request, grant)
    }

    fn is_idle(&self, state: &L::State, now: Nanos) -> bool {
        self.limit.idle(state, now)
    }
}
