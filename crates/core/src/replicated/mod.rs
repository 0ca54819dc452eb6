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

pub mod counter;
pub mod queue;

/// A node of a replicated cluster, as the states know it: a number every
/// node derives the same way from the node's configured id, so states
/// merged on different nodes agree on whose entry is whose.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct NodeId(pub u64);
