//! The thesis's token bucket as a state-based CRDT: a G-counter of the
//! tokens each node consumed, a limit and its refill timestamp (seed 000,
//! §3.1, Listings 3.1–3.4). This is the thesis's baseline, "the system"
//! Spotify runs.
//!
//! A bucket is three values (§3.1): the *token counter*, a map from node
//! to the tokens that node consumed (a G-counter: each node only increments
//! its own entry, Listing 3.2, and a merge keeps each entry's maximum); the
//! *limit*, the total tokens ever made available, which a refill raises
//! instead of putting tokens in the bucket; and the *refill timestamp*, up
//! to when the limit has been refilled. The bucket holds `limit − Σ token
//! counter` tokens. A merge (Listing 3.4) takes the per-node maximum of the
//! counters and the greater limit *together with its own refill timestamp*,
//! so the refill of one span of time is never counted twice.
//!
//! Merges are joins of a semilattice (the product of a per-node max and a
//! lexicographic max of `(limit, refill timestamp)`), and every local
//! operation only moves a state up in it, so replicas converge whatever the
//! order, repetition or delay of gossip. What a replica cannot know is what
//! its peers granted since they last gossiped: two nodes may each grant the
//! last tokens (§3.1.1), and the merged state then shows more consumed than
//! the limit allows. That debt is repaid at the refill rate before anything
//! is granted again (§5.2.5).
//!
//! # Where this differs from the listings, and why
//!
//! The pseudo-code of Listing 3.1 is terse; three readings here keep the
//! behaviour the thesis documents rather than the letter of the listing.
//!
//! - **The refill fills the bucket, not more** (Listing 3.1, line 17).
//!   Taken literally, `limit += min(delta_limit, capacity)` caps each
//!   refill's *increment* at the capacity, so a bucket that is not empty
//!   when refilled grows past it: a new bucket (limit = capacity, nothing
//!   consumed) refilled after an idle minute holds twice the capacity, and
//!   one request every idle minute makes it grow without bound. That
//!   contradicts the thesis's own token bucket ("a limit for how many tokens
//!   it can hold at any time", §2.2, §3.1) and its claim that the queue,
//!   which never holds more than the capacity, enforces the same behaviour
//!   as this design (§4.1.3, §5.1.2). Here the limit is raised to at most
//!   `Σ token counter + capacity`, which is the listing exactly whenever the
//!   bucket is empty at the refill.
//! - **Fractions of a token are kept** (Listing 3.1, lines 15–18). The
//!   listing moves the refill timestamp to `now` whenever at least one whole
//!   token was added, dropping the fraction accrued since: at one token per
//!   second and a request every 1.5 s it refills one token per 1.5 s, not
//!   per second. Here the timestamp advances by the time of the whole tokens
//!   added, and jumps to `now` only when the refill fills the bucket (a full
//!   bucket banks no time). This is what the thesis's queue does (Equation
//!   4.2 chains each time of death to the last one, exactly `1 / rate`
//!   later) and what the core's [`crate::TokenBucket`] does with its exact
//!   token-time: on one node that never merges, this bucket decides exactly
//!   like a `TokenBucket` of the same capacity and rate, `Decision` for
//!   `Decision`. The listing's result is the same whenever the time since
//!   the last refill is a whole number of tokens, or fills the bucket.
//! - **Only a grant refills.** Listing 3.1 refills on every request, before
//!   the emptiness check. Because the fraction is kept, refilling at `t1`
//!   and then at `t2` gives what refilling once at `t2` gives, so skipping
//!   the refill when nothing is consumed changes no decision; in exchange a
//!   rejected request leaves the state untouched, with nothing to store and
//!   nothing to gossip (the thesis's delta states carry only users "that
//!   have consumed tokens", §3.1).
//!
//! Two smaller choices. A request may ask for several hits and accept as few
//! as `min_hits` (the core's [`Hits`]): the largest `n` in
//! `[min_hits, hits]` that the bucket holds is consumed, or nothing; the
//! thesis's one-token request is `Hits::exactly(1)`. And Listing 3.4
//! replaces the limit only when the other one is strictly greater, which
//! keeps whichever refill timestamp was merged *into*: `merge(a, b)` and
//! `merge(b, a)` would differ on equal limits. Equal limits keep the later
//! refill timestamp here, the one with less unspent refill time: merge
//! stays commutative and errs on the side of rejecting.
//!
//! # For the gossip layer
//!
//! - **The delta is the whole per-key state**, as in the thesis (Listing
//!   3.3 ships and stores whole buckets): a few words plus one entry per node
//!   that consumed. [`CounterBucketState::merge`] reports whether it changed
//!   anything, which is Listing 3.3's test (line 10) for whether the key goes
//!   into the neighbours' delta states. A key whose state a request did not
//!   change ([`Decision::granted`] is 0) needs no gossip. Shipping only the
//!   changed counter entries is *not* safe on its own: the limit is only
//!   meaningful next to the consumption it was computed from (a limit never
//!   exceeds the sender's `Σ token counter + capacity`), so a fragment that
//!   carries the limit must carry every counter entry too.
//! - **A key the receiver lacks** is the merge into the empty state
//!   ([`CounterBucketState::default`] is the bottom of the semilattice), as
//!   Listing 3.3 lines 4–5 take the received bucket as it is.
//! - **Clocks are assumed synchronized** (§3.1). A peer's refill timestamp
//!   ahead of the local clock refills nothing until the clock passes it, so
//!   a state from a node whose clock runs ahead makes the receiver stricter,
//!   not more lenient; a node whose own clock runs ahead refills early, as
//!   any token bucket on a fast clock would.
//!
//! # Resets and usage reported after the fact
//!
//! Two additions of tollgate's, neither in the thesis:
//!
//! - **A reset generation** ([`crate::replicated::Generation`]) orders
//!   states before anything else: a merge takes a state of a later
//!   generation whole and ignores one of an earlier generation, so a
//!   reset (a fresh state of a new generation) wins over every state from
//!   before it, wherever and whenever that arrives. The product of the
//!   generation order and the bucket's semilattice is still a join.
//! - **A report** ([`CounterBucket::report`]) is a grant that is never
//!   refused, up to `max_debt` tokens below empty: it adds to the
//!   reporting node's counter entry, and the debt is repaid by refill as
//!   the debt of §3.1.1's concurrent grants is. **A refund**
//!   ([`CounterBucket::refund`]) raises the limit, which only grows, up
//!   to a full bucket; refunds made on two nodes before they merge keep
//!   only the larger (the limit is a maximum): an under-refund. On one
//!   node both decide exactly as the core's [`crate::TokenBucket`] does.
//!
//! # Memory
//!
//! The thesis's counter never forgets a user (§5.2.5: its memory only
//! grows). Here a state whose bucket is full is equivalent, for every future
//! decision of the replica holding it, to the empty state
//! ([`CounterBucket::is_idle`]), so a store may drop it. In a cluster that
//! is not the whole story: if a peer still holds the old state when this
//! node recreates the key, the old entry for this node (a maximum) hides the
//! new consumption until the new count passes it. A store should therefore
//! drop a key only after it has been full for longer than gossip takes to
//! reach every node ([`CounterBucket::full_at`] plus a grace period), so that
//! every replica, deciding on the same converged state, drops it too.

use std::num::NonZeroU64;

use smallvec::SmallVec;

use crate::decision::{Decision, Grant, Hits};
use crate::error::ParamError;
use crate::rate::Rate;
use crate::replicated::{raise_entry, Generation, NodeId, OnNode, Replicated};
use crate::time::Nanos;

/// Parameters of a counter-based token bucket: a capacity and a refill rate
/// (§3.1's `capacity` and `refill_rate`). The same for every node of a
/// cluster; which node decides is an argument ([`CounterBucket::on`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct CounterBucket {
    capacity: NonZeroU64,
    rate: Rate,
    /// `rate.interval()`: nanoseconds per token, at least 1.
    interval: Nanos,
    /// The most tokens a report may leave the bucket owing (module docs,
    /// "Usage reported after the fact"); one capacity by default.
    debt: u64,
}

impl CounterBucket {
    /// A bucket of `capacity` tokens refilled at `rate`. The capacity must
    /// be positive and a whole refill (`capacity` tokens at `rate`) must be
    /// a [`crate::Span`], as for [`crate::TokenBucket`], so the two accept
    /// the same parameters.
    pub fn new(capacity: u64, rate: Rate) -> Result<CounterBucket, ParamError> {
        let capacity = ParamError::positive("capacity", capacity)?;
        let interval = rate.interval();
        ParamError::hits_span("capacity", capacity, interval)?;
        Ok(CounterBucket {
            capacity,
            rate,
            interval,
            debt: capacity.get(),
        })
    }

    /// Bounds the debt a report may leave at `max_debt` tokens below
    /// empty, as [`crate::TokenBucket::with_max_debt`] does (and with the
    /// same check: repaying it must take at most a [`crate::Span`]).
    pub fn with_max_debt(mut self, max_debt: u64) -> Result<CounterBucket, ParamError> {
        if let Some(n) = NonZeroU64::new(max_debt) {
            ParamError::hits_span("max_debt", n, self.interval)?;
        }
        self.debt = max_debt;
        Ok(self)
    }

    /// The most tokens a report may leave the bucket owing.
    pub fn max_debt(&self) -> u64 {
        self.debt
    }

    /// Tokens a full bucket holds.
    pub fn capacity(&self) -> u64 {
        self.capacity.get()
    }

    /// The refill rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Nanoseconds per token, rounded down (see [`Rate`]).
    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// This bucket as node `node` decides with it: an [`Algorithm`] whose
    /// grants are counted in `node`'s entry, so it fits wherever the core's
    /// algorithms do (plans, `decide_alone`).
    pub fn on(self, node: NodeId) -> OnNode<Self> {
        OnNode { limit: self, node }
    }

    /// Listing 3.1's `refill()` at `now`, without changing the state: the
    /// limit and refill timestamp the state would hold.
    fn refilled(&self, state: &CounterBucketState, now: Nanos) -> Refill {
        let full = state.consumed().saturating_add(self.capacity.get());
        let Some(at) = state.refill_timestamp else {
            // Listing 3.1, lines 2–3: a new bucket starts with a limit of
            // `capacity`, that is, full. Counted on top of any consumption
            // already known, so it holds exactly `capacity`.
            return Refill {
                limit: state.limit.max(full),
                at: now,
            };
        };
        if now <= at {
            // Time at or before the last refill (a peer's clock ahead of
            // ours, or a trace going backwards) refills nothing, and the
            // timestamp never moves back: that span would be refilled twice.
            return Refill {
                limit: state.limit,
                at,
            };
        }
        if state.limit >= full {
            // A full bucket banks no time: the next token is one interval
            // after now.
            return Refill {
                limit: state.limit,
                at: now,
            };
        }
        let whole = now.saturating_sub(at).as_u64() / self.interval.as_u64();
        let missing = full - state.limit;
        if whole >= missing {
            // Listing 3.1, line 17, read as filling the bucket and no more
            // (see the module docs).
            Refill {
                limit: full,
                at: now,
            }
        } else {
            // Only whole tokens are added; the timestamp advances by their
            // time, keeping the fraction of the next one (module docs).
            // `whole × interval <= now − at`, so this cannot overflow.
            Refill {
                limit: state.limit + whole,
                at: at.saturating_add(self.interval.saturating_mul(whole)),
            }
        }
    }

    /// Tokens the bucket holds once refilled to `refill`.
    fn available(&self, state: &CounterBucketState, refill: Refill) -> u64 {
        // The limit never exceeds the consumption it was computed from plus
        // the capacity, so the `min` only matters for a state forged from
        // parts that break that rule; it keeps such a state from granting
        // more than a bucket holds in one request.
        refill
            .limit
            .saturating_sub(state.consumed())
            .min(self.capacity.get())
    }

    /// How many of `hits` the state admits at `now`, without changing it.
    pub fn room(&self, state: &CounterBucketState, now: Nanos, hits: u64) -> u64 {
        self.available(state, self.refilled(state, now)).min(hits)
    }

    /// Records `grant` at `now` on behalf of `node` (Listings 3.1 and 3.2:
    /// refill, then add the granted tokens to `node`'s counter entry) and
    /// describes the state afterwards. A grant of nothing changes nothing
    /// (module docs: only a grant refills).
    pub fn commit(
        &self,
        state: &mut CounterBucketState,
        node: NodeId,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        if grant.granted > 0 {
            let refill = self.refilled(state, now);
            state.limit = refill.limit;
            state.refill_timestamp = Some(refill.at);
            state.consume(node, grant.granted);
        }
        self.describe(state, now, request, grant)
    }

    /// Decides `request` at `now` on node `node`: grants the largest `n` in
    /// `[min_hits, hits]` that the bucket holds and consumes it, or grants
    /// nothing and changes nothing.
    pub fn decide(
        &self,
        state: &mut CounterBucketState,
        node: NodeId,
        now: Nanos,
        request: Hits,
    ) -> Decision {
        let room = self.room(state, now, request.hits);
        let grant = Grant::from_room(request, room);
        self.commit(state, node, now, request, grant)
    }

    /// Charges `hits` already used at `now` to `node` (a report): as many
    /// as keep the bucket at most `max_debt` tokens below empty, even past
    /// the limit, never refused. The debt is in `node`'s counter entry like
    /// any grant, and is repaid by refill (§5.2.5). Described for one more
    /// hit, as every report is.
    pub fn report(
        &self,
        state: &mut CounterBucketState,
        node: NodeId,
        now: Nanos,
        hits: u64,
    ) -> Decision {
        let refill = self.refilled(state, now);
        let floor = state.consumed();
        let fits = refill.limit.saturating_add(self.debt).saturating_sub(floor);
        let charged = hits.min(fits);
        if charged > 0 {
            state.limit = refill.limit;
            state.refill_timestamp = Some(refill.at);
            state.consume(node, charged);
        }
        let grant = Grant {
            granted: charged,
            allowed: true,
        };
        self.describe(state, now, Hits::exactly(1), grant)
    }

    /// Gives back up to `hits` at `now` (a refund) by raising the limit,
    /// the tokens made available, which only grows: the state stays a
    /// CRDT. Never past a full bucket (`Σ token counter + capacity`), and
    /// whole tokens only: the fraction of a token refilled since the last
    /// refill is not counted as given back (as the core's token bucket
    /// counts it). Two nodes refunding at once keep the larger limit when
    /// they merge, so the smaller refund is lost: an under-refund, the
    /// safe direction (`docs/algorithms/usage.md`).
    pub fn refund(&self, state: &mut CounterBucketState, now: Nanos, hits: u64) -> Decision {
        let refill = self.refilled(state, now);
        let full = state.consumed().saturating_add(self.capacity.get());
        // A fraction of the next token already accrued: giving back the
        // tokens up to full completes it, and it is not counted.
        let fraction = refill.limit < full && now > refill.at;
        let room = full
            .saturating_sub(refill.limit)
            .saturating_sub(u64::from(fraction));
        let given = hits.min(room);
        if hits > 0 && hits <= room {
            state.limit = refill.limit + hits;
            state.refill_timestamp = Some(refill.at);
        } else if hits > 0 && refill.limit < full {
            // Filled (the fraction with it): a full bucket banks no time.
            state.limit = full;
            state.refill_timestamp = Some(now);
        }
        let grant = Grant {
            granted: given,
            allowed: true,
        };
        self.describe(state, now, Hits::exactly(1), grant)
    }

    /// When the bucket is full, if nothing more is consumed: the refill
    /// timestamp plus the time of the missing tokens ([`Nanos::ZERO`] for a
    /// state never refilled, which any first refill fills). A pure function
    /// of the state, so replicas holding the same state agree on it; a store
    /// can drop a key once `now` is past it by a grace period (module docs).
    pub fn full_at(&self, state: &CounterBucketState) -> Nanos {
        let Some(at) = state.refill_timestamp else {
            return Nanos::ZERO;
        };
        let missing = state
            .consumed()
            .saturating_add(self.capacity.get())
            .saturating_sub(state.limit);
        at.saturating_add(self.interval.saturating_mul(missing))
    }

    /// Whether the bucket is full at `now`, which makes the state
    /// equivalent to the empty one for every later decision of this
    /// replica: both hold `capacity` tokens from `now` on, with no fraction
    /// of the next. See the module docs before dropping it in a cluster. A
    /// reset state is equivalent to a fresh one *of its generation*: it
    /// also ignores every state from before its reset, which a fresh one
    /// would take (the replicated store holds reset keys a while longer).
    pub fn is_idle(&self, state: &CounterBucketState, now: Nanos) -> bool {
        now >= self.full_at(state)
    }

    /// Time from `now` until `min_hits` tokens are in the bucket, assuming
    /// no other traffic: zero if they are now, `None` if they never can be.
    fn retry_after(&self, state: &CounterBucketState, now: Nanos, min_hits: u64) -> Option<Nanos> {
        if min_hits == 0 {
            return Some(Nanos::ZERO);
        }
        if min_hits > self.capacity.get() {
            return None;
        }
        let refill = self.refilled(state, now);
        if self.available(state, refill) >= min_hits {
            return Some(Nanos::ZERO);
        }
        // Counting from the refill timestamp credits the fraction of a token
        // already accrued; in debt after a merge, the debt comes first.
        let missing = state
            .consumed()
            .saturating_add(min_hits)
            .saturating_sub(refill.limit);
        let at = refill
            .at
            .saturating_add(self.interval.saturating_mul(missing));
        Some(at.saturating_sub(now))
    }

    fn describe(
        &self,
        state: &CounterBucketState,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        Decision {
            granted: grant.granted,
            allowed: grant.allowed,
            limit: self.capacity.get(),
            remaining: self.available(state, self.refilled(state, now)),
            reset_after: self.full_at(state).saturating_sub(now),
            retry_after: self.retry_after(state, now, request.min_hits),
            wait: Nanos::ZERO,
            tier: None,
        }
    }
}

/// A refill's outcome: the limit and refill timestamp to keep.
#[derive(Copy, Clone, Debug)]
struct Refill {
    limit: u64,
    at: Nanos,
}

impl Replicated for CounterBucket {
    type State = CounterBucketState;

    fn room_on(&self, state: &CounterBucketState, _node: NodeId, now: Nanos, hits: u64) -> u64 {
        self.room(state, now, hits)
    }

    fn commit_on(
        &self,
        state: &mut CounterBucketState,
        node: NodeId,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        self.commit(state, node, now, request, grant)
    }

    fn idle(&self, state: &CounterBucketState, now: Nanos) -> bool {
        self.is_idle(state, now)
    }
}

/// One key's bucket on one replica: the token counter (tokens consumed per
/// node), the limit and the refill timestamp (§3.1).
///
/// The default is the empty state, the bottom of the semilattice: merging
/// it changes nothing, and its first refill fills it. Equality is equality
/// of the replicated value: the token counter is kept sorted by node with no
/// zero entries, so two states that merge to the same thing compare equal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CounterBucketState {
    /// The key's reset generation: a state of a higher one replaces this
    /// one whole in a merge, one of a lower one is ignored.
    generation: Generation,
    /// Sorted by node, no duplicates, no zeros.
    token_counter: SmallVec<[(NodeId, u64); 2]>,
    /// Total tokens ever made available; 0 before the first refill.
    limit: u64,
    /// Up to when the limit has been refilled; `None` before the first
    /// refill. Orders below every time, which is what the merge's
    /// `(limit, refill timestamp)` comparison needs of the bottom.
    refill_timestamp: Option<Nanos>,
}

impl CounterBucketState {
    /// A state from its parts, for decoding one received from a peer.
    /// Duplicate nodes keep the largest count (they are the same G-counter
    /// entry) and zero counts are dropped, so any input is a valid state.
    pub fn from_parts(
        token_counter: impl IntoIterator<Item = (NodeId, u64)>,
        limit: u64,
        refill_timestamp: Option<Nanos>,
    ) -> CounterBucketState {
        let mut state = CounterBucketState {
            generation: Generation::ZERO,
            token_counter: SmallVec::new(),
            limit,
            refill_timestamp,
        };
        for (node, count) in token_counter {
            state.raise(node, count);
        }
        state
    }

    /// The state of a key just reset to `generation`: a fresh bucket that
    /// every state of an older generation merges into as nothing.
    pub fn reset(generation: Generation) -> CounterBucketState {
        CounterBucketState {
            generation,
            ..CounterBucketState::default()
        }
    }

    /// The same state in `generation` (for decoding one received from a
    /// peer).
    pub fn with_generation(mut self, generation: Generation) -> CounterBucketState {
        self.generation = generation;
        self
    }

    /// The key's reset generation ([`Generation::ZERO`] if never reset).
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The token counter: `(node, tokens it consumed)`, sorted by node,
    /// nodes that consumed nothing left out.
    pub fn token_counter(&self) -> &[(NodeId, u64)] {
        &self.token_counter
    }

    /// Tokens `node` consumed, as far as this replica knows.
    pub fn consumed_by(&self, node: NodeId) -> u64 {
        match self.token_counter.binary_search_by_key(&node, |e| e.0) {
            Ok(i) => self.token_counter[i].1,
            Err(_) => 0,
        }
    }

    /// Tokens consumed by all nodes (the counter's sum), saturating.
    pub fn consumed(&self) -> u64 {
        self.token_counter
            .iter()
            .fold(0u64, |sum, e| sum.saturating_add(e.1))
    }

    /// Total tokens ever made available (0 before the first refill). The
    /// bucket holds `limit − consumed`; more consumed than the limit is the
    /// over-admission of §3.1.1, a debt repaid by refills.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Up to when the limit has been refilled (`None` before the first
    /// refill). Not necessarily the time of the last request: it trails it
    /// by the fraction of a token accrued since.
    pub fn refill_timestamp(&self) -> Option<Nanos> {
        self.refill_timestamp
    }

    /// Merges `other` into this state (Listing 3.4): each node's entry
    /// becomes the larger of the two, and the greater `(limit, refill
    /// timestamp)` pair is kept whole (equal limits: the later timestamp).
    /// Returns whether this state changed, Listing 3.3's test for passing
    /// the key on to the other neighbours.
    ///
    /// Generations come first: a state of a later reset generation
    /// replaces this one whole, and one of an earlier generation changes
    /// nothing (a lexicographic product, still a join).
    pub fn merge(&mut self, other: &CounterBucketState) -> bool {
        match other.generation.cmp(&self.generation) {
            std::cmp::Ordering::Less => return false,
            std::cmp::Ordering::Greater => {
                self.clone_from(other);
                return true;
            }
            std::cmp::Ordering::Equal => {}
        }
        let mut changed = false;
        for &(node, count) in &other.token_counter {
            changed |= self.raise(node, count);
        }
        if (other.limit, other.refill_timestamp) > (self.limit, self.refill_timestamp) {
            self.limit = other.limit;
            self.refill_timestamp = other.refill_timestamp;
            changed = true;
        }
        changed
    }

    /// Whether `other` is already part of this state (`other ⊑ self`):
    /// merging it would change nothing.
    pub fn includes(&self, other: &CounterBucketState) -> bool {
        if other.generation != self.generation {
            return other.generation < self.generation;
        }
        (other.limit, other.refill_timestamp) <= (self.limit, self.refill_timestamp)
            && other
                .token_counter
                .iter()
                .all(|&(node, count)| self.consumed_by(node) >= count)
    }

    /// Whether this is the empty state (nothing consumed, never refilled,
    /// never reset): a reset state is not empty, it carries its
    /// generation to the peers.
    pub fn is_empty(&self) -> bool {
        *self == CounterBucketState::default()
    }

    /// Bytes this state occupies, inline and on the heap, for the memory
    /// benchmarks.
    pub fn footprint(&self) -> usize {
        let heap = if self.token_counter.spilled() {
            self.token_counter.capacity() * std::mem::size_of::<(NodeId, u64)>()
        } else {
            0
        };
        std::mem::size_of::<CounterBucketState>() + heap
    }

    /// Listing 3.2's `consume()`, for `hits` tokens at once.
    fn consume(&mut self, node: NodeId, hits: u64) {
        let count = self.consumed_by(node).saturating_add(hits);
        self.raise(node, count);
    }

    /// Raises `node`'s entry to at least `count`; whether it changed.
    fn raise(&mut self, node: NodeId, count: u64) -> bool {
        raise_entry(&mut self.token_counter, node, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);
    const C: NodeId = NodeId(3);

    fn bucket(capacity: u64, per_sec: u64) -> CounterBucket {
        CounterBucket::new(capacity, Rate::per_second(per_sec).unwrap()).unwrap()
    }

    fn ms(n: u64) -> Nanos {
        Nanos::from_millis(n)
    }

    fn one(b: &CounterBucket, s: &mut CounterBucketState, node: NodeId, t: Nanos) -> bool {
        b.decide(s, node, t, Hits::exactly(1)).allowed
    }

    #[test]
    fn parameters_are_validated() {
        let r = Rate::per_second(1).unwrap();
        assert_eq!(
            CounterBucket::new(0, r),
            Err(ParamError::MustBePositive { param: "capacity" })
        );
        assert!(matches!(
            CounterBucket::new(u64::MAX, r),
            Err(ParamError::TooLarge {
                param: "capacity",
                ..
            })
        ));
        assert!(CounterBucket::new(5, r).is_ok());
    }

    #[test]
    fn a_new_bucket_starts_with_the_capacity_as_its_limit() {
        // Listing 3.1, lines 2–3 and 9: a new user's bucket gets limit =
        // capacity and the request consumes a token.
        let b = bucket(5, 1);
        let mut s = CounterBucketState::default();
        let t = Nanos::from_secs(100);
        let d = b.decide(&mut s, A, t, Hits::exactly(1));
        assert!(d.allowed);
        assert_eq!(d.remaining, 4);
        assert_eq!(s.limit(), 5);
        assert_eq!(s.refill_timestamp(), Some(t));
        assert_eq!(s.token_counter(), &[(A, 1)]);
        // The bucket is empty (limit <= consumed) after four more.
        for _ in 0..4 {
            assert!(one(&b, &mut s, A, t));
        }
        let d = b.decide(&mut s, A, t, Hits::exactly(1));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Nanos::SECOND));
        assert_eq!(d.reset_after, Nanos::from_secs(5));
    }

    #[test]
    fn refill_adds_whole_tokens_and_keeps_the_fraction() {
        // Hand-computed, one token per second. The literal Listing 3.1
        // would set the timestamp to 2.5 s at the first refill and find no
        // whole token at 3 s.
        let b = bucket(5, 1);
        let mut s = CounterBucketState::default();
        assert!(b.decide(&mut s, A, Nanos::ZERO, Hits::exactly(5)).allowed);
        let d = b.decide(&mut s, A, ms(2500), Hits::exactly(1));
        assert!(d.allowed);
        assert_eq!(d.remaining, 1);
        assert_eq!(s.limit(), 7);
        assert_eq!(s.refill_timestamp(), Some(ms(2000)));
        let d = b.decide(&mut s, A, ms(3000), Hits::between(1, 10));
        assert_eq!(d.granted, 2);
        assert_eq!(s.limit(), 8);
        assert_eq!(s.refill_timestamp(), Some(ms(3000)));
        assert_eq!(s.consumed(), 8);
    }

    #[test]
    fn refill_fills_the_bucket_and_no_more() {
        // The literal Listing 3.1 adds min(delta, capacity) = 5 to a limit
        // of 5 with 1 consumed: 9 tokens. The bucket holds at most 5.
        let b = bucket(5, 1);
        let mut s = CounterBucketState::default();
        assert!(one(&b, &mut s, A, Nanos::ZERO));
        let d = b.decide(&mut s, A, Nanos::from_secs(60), Hits::between(1, 100));
        assert_eq!(d.granted, 5);
        assert_eq!(s.limit(), 6);
        assert_eq!(s.refill_timestamp(), Some(Nanos::from_secs(60)));
    }

    #[test]
    fn a_full_bucket_banks_no_time() {
        let b = bucket(2, 1);
        let mut s = CounterBucketState::default();
        assert!(one(&b, &mut s, A, Nanos::ZERO));
        // Full again at 1 s; at 1.7 s the 0.7 s past full is not credited.
        assert!(one(&b, &mut s, A, ms(1700)));
        assert_eq!(s.refill_timestamp(), Some(ms(1700)));
        assert!(one(&b, &mut s, A, ms(1700)));
        assert!(!one(&b, &mut s, A, ms(2699)));
        assert!(one(&b, &mut s, A, ms(2700)));
    }

    #[test]
    fn a_rejection_changes_nothing() {
        let b = bucket(2, 1);
        let mut s = CounterBucketState::default();
        b.decide(&mut s, A, Nanos::ZERO, Hits::exactly(2));
        let before = s.clone();
        let d = b.decide(&mut s, A, ms(1500), Hits::exactly(2));
        assert!(!d.allowed);
        assert_eq!(d.remaining, 1);
        assert_eq!(d.retry_after, Some(ms(500)));
        assert_eq!(s, before);
        // Asking for more than the capacity never succeeds.
        let d = b.decide(&mut s, A, ms(1500), Hits::exactly(3));
        assert_eq!(d.retry_after, None);
        assert_eq!(s, before);
    }

    #[test]
    fn figure_2_1_counts_per_node() {
        // §2.1.1, Figure 2.1 (b): A adds 2 and B adds 3 concurrently; a value
        // per node makes the merged sum 5 on both.
        let b = bucket(10, 1);
        let mut a = CounterBucketState::default();
        let mut bb = CounterBucketState::default();
        b.decide(&mut a, A, Nanos::ZERO, Hits::exactly(2));
        b.decide(&mut bb, B, Nanos::ZERO, Hits::exactly(3));
        let a0 = a.clone();
        assert!(a.merge(&bb));
        assert!(bb.merge(&a0));
        assert_eq!(a, bb);
        assert_eq!(a.consumed(), 5);
        assert_eq!(a.token_counter(), &[(A, 2), (B, 3)]);
    }

    #[test]
    fn section_3_1_1_two_nodes_grant_the_last_token_before_they_merge() {
        // §3.1.1: capacity 5, one token per second. A grants 4, gossips to
        // B; then each grants the last token before hearing of the other.
        let b = bucket(5, 1);
        let mut a = CounterBucketState::default();
        b.decide(&mut a, A, Nanos::ZERO, Hits::exactly(4));
        let mut bb = CounterBucketState::default();
        assert!(bb.merge(&a));
        assert!(one(&b, &mut a, A, ms(100)));
        assert!(one(&b, &mut bb, B, ms(100)));
        // Each alone thinks the bucket is empty and exactly full-used.
        assert_eq!(b.room(&a, ms(100), 1), 0);
        assert_eq!(b.room(&bb, ms(100), 1), 0);
        let a0 = a.clone();
        a.merge(&bb);
        bb.merge(&a0);
        assert_eq!(a, bb);
        // The merged state shows the over-admission: 6 consumed, limit 5.
        assert_eq!(a.consumed(), 6);
        assert_eq!(a.limit(), 5);
        assert_eq!(a.refill_timestamp(), Some(Nanos::ZERO));
        // The debt is repaid at the refill rate (§5.2.5): the token refilled
        // at 1 s pays it, the next one comes at 2 s.
        let d = b.decide(&mut a, A, ms(1000), Hits::exactly(1));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(ms(1000)));
        assert!(!one(&b, &mut a, A, ms(1999)));
        assert!(one(&b, &mut a, A, ms(2000)));
    }

    #[test]
    fn section_3_1_1_more_nodes_exceed_the_limit_more() {
        // "The more nodes the system consists of, the more a user can exceed
        // its limit": three nodes that never heard of each other grant a
        // full bucket each.
        let b = bucket(5, 1);
        let mut states = [A, B, C].map(|n| {
            let mut s = CounterBucketState::default();
            assert_eq!(
                b.decide(&mut s, n, Nanos::ZERO, Hits::between(1, 10))
                    .granted,
                5
            );
            s
        });
        let [first, rest @ ..] = &mut states;
        for s in rest.iter() {
            first.merge(s);
        }
        assert_eq!(first.consumed(), 15);
        assert_eq!(first.limit(), 5);
        // Ten tokens of debt: the next token is eleven seconds away.
        let d = b.decide(first, A, Nanos::ZERO, Hits::exactly(1));
        assert_eq!(d.retry_after, Some(Nanos::from_secs(11)));
        assert_eq!(d.reset_after, Nanos::from_secs(15));
    }

    #[test]
    fn merge_keeps_the_greater_limit_with_its_own_timestamp() {
        // Listing 3.4, lines 16–18.
        let hi = CounterBucketState::from_parts([(A, 3)], 8, Some(Nanos::from_secs(1)));
        let lo = CounterBucketState::from_parts([(B, 2)], 7, Some(Nanos::from_secs(3)));
        let mut x = hi.clone();
        assert!(x.merge(&lo));
        assert_eq!(
            (x.limit(), x.refill_timestamp()),
            (8, Some(Nanos::from_secs(1)))
        );
        let mut y = lo.clone();
        assert!(y.merge(&hi));
        assert_eq!(x, y);
    }

    #[test]
    fn equal_limits_keep_the_later_timestamp_whatever_the_order() {
        let early = CounterBucketState::from_parts([(A, 1)], 7, Some(Nanos::from_secs(2)));
        let late = CounterBucketState::from_parts([(A, 1)], 7, Some(Nanos::from_secs(3)));
        let mut x = early.clone();
        assert!(x.merge(&late));
        let mut y = late.clone();
        assert!(!y.merge(&early));
        assert_eq!(x, y);
        assert_eq!(x.refill_timestamp(), Some(Nanos::from_secs(3)));
    }

    #[test]
    fn merge_reports_change_as_listing_3_3_needs() {
        let b = bucket(5, 1);
        let mut a = CounterBucketState::default();
        b.decide(&mut a, A, Nanos::ZERO, Hits::exactly(1));
        // A key the receiver lacks: the received bucket is taken as it is.
        let mut r = CounterBucketState::default();
        assert!(r.merge(&a));
        assert_eq!(r, a);
        assert!(!r.merge(&a));
        assert!(r.includes(&a) && a.includes(&r));
        assert!(!r.merge(&CounterBucketState::default()));
    }

    #[test]
    fn from_parts_canonicalizes() {
        let s = CounterBucketState::from_parts(
            [(B, 2), (A, 0), (C, 1), (B, 5), (C, 0)],
            9,
            Some(Nanos::SECOND),
        );
        assert_eq!(s.token_counter(), &[(B, 5), (C, 1)]);
        assert_eq!(s.consumed(), 6);
        assert_eq!(s.consumed_by(A), 0);
        assert_eq!(
            s,
            CounterBucketState::from_parts([(C, 1), (B, 5)], 9, Some(Nanos::SECOND))
        );
        assert!(CounterBucketState::from_parts([(A, 0)], 0, None).is_empty());
    }

    #[test]
    fn a_full_bucket_is_idle() {
        let b = bucket(10, 10);
        let mut s = CounterBucketState::default();
        assert!(b.is_idle(&s, Nanos::ZERO));
        b.decide(&mut s, A, Nanos::ZERO, Hits::exactly(10));
        assert_eq!(b.full_at(&s), ms(1000));
        assert!(!b.is_idle(&s, ms(999)));
        assert!(b.is_idle(&s, ms(1000)));
        // A peer's refill timestamp ahead of our clock: not yet equivalent
        // to a new bucket, whose refill would start now.
        let ahead = CounterBucketState::from_parts([(B, 1)], 11, Some(Nanos::from_secs(5)));
        assert!(!b.is_idle(&ahead, Nanos::from_secs(4)));
        assert!(b.is_idle(&ahead, Nanos::from_secs(5)));
    }

    #[test]
    fn a_peer_clock_ahead_refills_nothing_until_ours_passes_it() {
        let b = bucket(5, 1);
        let mut s = CounterBucketState::from_parts([(B, 5)], 5, Some(Nanos::from_secs(10)));
        assert!(!one(&b, &mut s, A, Nanos::from_secs(9)));
        assert!(!one(&b, &mut s, A, ms(10_999)));
        assert!(one(&b, &mut s, A, Nanos::from_secs(11)));
    }

    #[test]
    fn on_node_is_an_algorithm() {
        let alg = bucket(3, 1).on(B);
        let mut s = alg.fresh();
        let alone = alg.decide_alone(&mut s, Nanos::ZERO, Hits::between(1, 5));
        assert_eq!(alone.room, 3);
        assert_eq!(alone.decision.granted, 3);
        assert!(!alone.idle);
        assert_eq!(s.token_counter(), &[(B, 3)]);
    }

    #[test]
    fn extremes_saturate() {
        let b = CounterBucket::new(1 << 62, Rate::new(1, Nanos::NANOSECOND).unwrap()).unwrap();
        let mut s = CounterBucketState::from_parts(
            [(A, u64::MAX), (B, u64::MAX)],
            u64::MAX,
            Some(Nanos::MAX),
        );
        let d = b.decide(&mut s, A, Nanos::MAX, Hits::exactly(u64::MAX));
        assert!(!d.allowed);
        let d = b.decide(&mut s, C, Nanos::ZERO, Hits::between(0, u64::MAX));
        assert_eq!(d.granted, 0);
        let mut t = CounterBucketState::default();
        b.decide(&mut t, A, Nanos::MAX, Hits::between(1, u64::MAX));
        t.merge(&s);
        assert!(!b.is_idle(&t, Nanos::ZERO));
        assert!(s.footprint() >= std::mem::size_of::<CounterBucketState>());
    }
}
