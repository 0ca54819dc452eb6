//! The gossiping interval limiter's bucket (seed 001): an ordinary token
//! bucket on every node, corrected once per epoch by the traffic its peers
//! report, and allowed to go negative when the correction is larger than
//! what it holds.
//!
//! Time is cut into epochs (one second by default, seed 001: "Each epoch
//! lasts for a second"), numbered `now / epoch_length` on every node, so
//! synchronized clocks agree on the number without any message. Within an
//! epoch a node grants from its own bucket and "will not allocate more
//! tokens than are in that bucket", counting what it grants as its traffic
//! of the *open* epoch. When its epoch ticks over it commits that traffic:
//! it becomes this node's entry in the [`EpochReport`] of the last
//! committed epoch, the map node → traffic that nodes gossip ("each node
//! shares a map of node -> traffic history for its most recently-committed
//! epoch"). A node receiving a report subtracts each peer's traffic from its
//! bucket once, which can take the level below zero ("those adjustments can
//! take a count negative"); the debt is repaid at the refill rate.
//!
//! Why this shape: the bucket itself is not a CRDT (its level depends on
//! when corrections arrive), but the gossiped payload is. An
//! [`EpochReport`] is a join semilattice, ordered by epoch and then
//! node-wise, so reports can be pushed and pulled in any order, repeated or
//! late. The receiver's own copy of the report doubles as its record of
//! what it has already subtracted: for each peer, its entry is exactly the
//! traffic of that peer in that epoch already taken out of the bucket, so a
//! report received again subtracts only what grew since (nothing if it did
//! not), and a node never subtracts its own entry.
//!
//! # What the seed says, and the rules chosen here
//!
//! - **Bursts can exceed the bucket by up to the number of nodes.** A greedy
//!   client can take `capacity` tokens from each of N nodes in one epoch;
//!   the corrections arrive with the next epoch's gossip and drive every
//!   bucket negative, so "bursts can be steeper than configured, but the
//!   average throughput of tokens remains as configured, in the long run".
//! - **Which epoch a receiver accepts.** The seed leaves it open ("if that
//!   traffic is for a different epoch then it will take no proactive effort
//!   to gossip that"). Here a node keeps exactly one report, the latest
//!   epoch it knows of (its own last committed epoch, or a later one a peer
//!   with a clock ahead already committed). A report for that epoch is
//!   merged node-wise; one for a later epoch replaces it (its peers'
//!   entries are all new, so all are subtracted); one for an earlier epoch
//!   is ignored, its traffic never subtracted. Epochs never move back, so
//!   no (node, epoch) traffic is ever subtracted twice.
//! - **Committing.** At the first call in a new epoch (a decision, a
//!   receive, or [`EpochBucket::report`], which the gossip layer calls when
//!   it composes a message) the open traffic is added to this node's entry
//!   of the report for epoch `now_epoch − 1`, or of the later epoch the
//!   report already holds. Labelling it with the epoch just closed rather
//!   than the one it was granted in changes nothing when the node ticks
//!   every epoch (the two are equal), and when it missed ticks (no call for
//!   that key during a whole epoch) it keeps the traffic gossiped instead
//!   of filing it under an epoch its peers have already left.
//! - **Clock skew.** A peer whose clock runs ahead reports an epoch the
//!   receiver has not committed yet: the receiver adopts it, dropping its
//!   own last report, so peers that had not pulled that one never subtract
//!   it. Skew within an epoch therefore costs at most one epoch of traffic,
//!   the "greater burst" the seed warns of; the seed requires clocks within
//!   about one gossip tick.
//! - **Partitions.** Each side keeps granting at the configured rate from
//!   its own buckets, so a cluster split in k parts delivers up to k times
//!   the rate. Reports are only ever for the latest epoch, so "if splits
//!   last more than an epoch ... the protocol has no chance at all to
//!   recover those totals"; once healed, the next epoch's reports flow and
//!   the cluster delivers the global rate again. Nothing here repairs the
//!   split's excess, as in the seed.
//!
//! # Where this differs from the seed, and why
//!
//! - **Fractions of a token are kept and a full bucket banks no time**, as
//!   in [`crate::replicated::counter`] and the core's
//!   [`crate::TokenBucket`]: on one node with no peers this bucket decides
//!   exactly like a `TokenBucket` of the same capacity and rate. The seed
//!   only says "a standard token bucket".
//! - **A request may take several hits** and accept as few as `min_hits`
//!   (the core's [`Hits`]): the largest `n` in `[min_hits, hits]` not
//!   above the level is granted, or nothing.
//! - **A rejection changes nothing** (no refill, no tick), so a key that is
//!   only rejected has nothing new to store or gossip; refilling or ticking
//!   later gives the same result, so no decision depends on it.
//!
//! # The bound
//!
//! With gossip every epoch (every node's report for epoch `k − 1` reaches
//! every other node at the boundary `k·E`, before any request of epoch
//! `k`), the grants of N nodes that start full at or after time 0 satisfy,
//! at every time `T`:
//!
//! ```text
//! total grants in [0, T] <= T/I + N·C + (N − 1)·(E/I + 1)
//! ```
//!
//! where `C` is the capacity, `I` the rate's interval and `E` the epoch
//! length. Take the node `i` that granted last, at `τ <= T` in epoch `k`:
//! its bucket held at least what it granted, so its grants plus everything
//! subtracted from it (all peers' grants before `k·E`) are at most
//! `C + τ/I`. Every other node granted after `k·E` at most its level then
//! (`<= C`) plus its refill until `τ` (`<= E/I + 1`, the 1 for the fraction
//! it carried). The seed's "rate × time + N × capacity" leaves out the
//! `(N − 1)·E/I` of the epoch nobody has reported yet.
//!
//! # Memory
//!
//! A state is dropped safely ([`EpochBucket::is_idle`]) when it is full,
//! has no open traffic and its report is one its next tick replaces with an
//! empty one: then it behaves exactly like a fresh state, for decisions and
//! for every report it may still receive.

use std::num::NonZeroU64;

use smallvec::SmallVec;

use crate::decision::{Decision, Grant, Hits};
use crate::error::ParamError;
use crate::rate::Rate;
use crate::replicated::{raise_entry, Generation, NodeId, OnNode, Replicated};
use crate::time::{Nanos, Span};

/// Parameters of an epoch bucket: capacity, refill rate and epoch length.
/// The same on every node of a cluster (the epoch numbers only agree if the
/// length does); which node decides is an argument ([`EpochBucket::on`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct EpochBucket {
    capacity: NonZeroU64,
    rate: Rate,
    /// `rate.interval()`: nanoseconds per token, at least 1.
    interval: Nanos,
    epoch: Span,
}

impl EpochBucket {
    /// The seed's epoch: one second.
    pub const DEFAULT_EPOCH: Nanos = Nanos::SECOND;

    /// A bucket of `capacity` tokens refilled at `rate`, with one-second
    /// epochs. The capacity must be positive and a whole refill must be a
    /// [`crate::Span`], as for [`crate::TokenBucket`] (which also keeps the
    /// level, a signed count, far from overflow).
    pub fn new(capacity: u64, rate: Rate) -> Result<EpochBucket, ParamError> {
        EpochBucket::with_epoch(capacity, rate, EpochBucket::DEFAULT_EPOCH)
    }

    /// [`EpochBucket::new`] with epochs of `epoch`, which must be a
    /// [`crate::Span`]. Shorter epochs correct sooner (a smaller burst) but need gossip to
    /// reach every node within one epoch (seed 001).
    pub fn with_epoch(capacity: u64, rate: Rate, epoch: Nanos) -> Result<EpochBucket, ParamError> {
        let capacity = ParamError::positive("capacity", capacity)?;
        let epoch = ParamError::span("epoch", epoch)?;
        let interval = rate.interval();
        ParamError::hits_span("capacity", capacity, interval)?;
        Ok(EpochBucket {
            capacity,
            rate,
            interval,
            epoch,
        })
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

    /// The length of an epoch.
    pub fn epoch(&self) -> Nanos {
        self.epoch.get()
    }

    /// The number of the epoch `now` falls in: `now / epoch`, the same on
    /// every node whose clock agrees (seed 001's "timestamp (with
    /// epoch-level resolution)").
    pub fn epoch_of(&self, now: Nanos) -> u64 {
        now.as_u64() / self.epoch.as_non_zero()
    }

    /// This bucket as node `node` decides with it: an [`Algorithm`] whose
    /// grants are counted as `node`'s traffic.
    pub fn on(self, node: NodeId) -> OnNode<Self> {
        OnNode { limit: self, node }
    }

    /// The capacity as a level. Validation keeps it at most 2^62.
    fn full(&self) -> i64 {
        i64::try_from(self.capacity.get()).unwrap_or(i64::MAX)
    }

    /// The level and refill timestamp after refilling at `now`, without
    /// changing the state.
    fn refilled(&self, state: &EpochBucketState, now: Nanos) -> (i64, Nanos) {
        let full = self.full();
        let Some(at) = state.refilled_at else {
            // A key never seen starts full.
            return (full, now);
        };
        if now <= at {
            // A clock or trace going backwards refills nothing, and the
            // timestamp never moves back: that span would be refilled twice.
            return (state.level, at);
        }
        if state.level >= full {
            // A full bucket banks no time.
            return (state.level, now);
        }
        let whole = now.saturating_sub(at).as_u64() / self.interval.as_u64();
        // `full - level` is below 2^62 + 2^63 and positive: it fits a u64.
        let missing = u64::try_from(i128::from(full) - i128::from(state.level)).unwrap_or(u64::MAX);
        if whole >= missing {
            (full, now)
        } else {
            // Only whole tokens are added; the timestamp advances by their
            // time, keeping the fraction of the next. `whole < missing`, so
            // the level stays below `full`; `whole × interval <= now − at`.
            let level = i64::try_from(i128::from(state.level) + i128::from(whole)).unwrap_or(full);
            (
                level,
                at.saturating_add(self.interval.saturating_mul(whole)),
            )
        }
    }

    /// Tokens that can be granted at `now`: the refilled level, not below
    /// zero (a bucket in debt grants nothing).
    fn available(&self, state: &EpochBucketState, now: Nanos) -> u64 {
        let (level, _) = self.refilled(state, now);
        u64::try_from(level.max(0))
            .unwrap_or(0)
            .min(self.capacity.get())
    }

    /// Brings the state to `now`: refills the bucket and, if `now` is in a
    /// later epoch than the open one, commits the open traffic to this
    /// node's entry of the report (module docs: "Committing"). Every
    /// operation that changes a state starts with it; the gossip layer need
    /// not call it directly ([`EpochBucket::report`] does).
    pub fn advance(&self, state: &mut EpochBucketState, node: NodeId, now: Nanos) {
        let epoch = self.epoch_of(now);
        let closed = epoch.saturating_sub(1);
        let (level, at) = self.refilled(state, now);
        let fresh = state.refilled_at.is_none();
        state.level = level;
        state.refilled_at = Some(at);
        if fresh {
            state.open_epoch = epoch;
            state.open_traffic = 0;
        }
        if fresh || epoch > state.open_epoch {
            if closed > state.report.epoch {
                // The report of an epoch before the one just closed is no
                // longer gossiped: peers have moved on too.
                state.report = EpochReport::new(closed).with_generation(state.report.generation);
            }
            if state.open_traffic > 0 {
                let own = state.report.traffic_of(node);
                state
                    .report
                    .raise(node, own.saturating_add(state.open_traffic));
            }
            state.open_epoch = epoch;
            state.open_traffic = 0;
        }
    }

    /// The report to gossip from this node at `now` (seed 001's push-pull
    /// payload): the state is first brought to `now`, so traffic of an
    /// epoch that just closed is in it.
    pub fn report(&self, state: &mut EpochBucketState, node: NodeId, now: Nanos) -> EpochReport {
        self.advance(state, node, now);
        state.report.clone()
    }

    /// Receives a peer's report at `now` on node `node`: brings the state to
    /// `now`, then merges the report into the node's own (module docs:
    /// "Which epoch a receiver accepts"), subtracting from the bucket each
    /// peer's traffic this node had not yet accounted for. The level may go
    /// negative. This node's own entry is never subtracted. Returns whether
    /// the node's report changed, so the gossip layer knows whether there
    /// is anything new to pass on.
    ///
    /// Receiving needs the parameters (to refill before correcting: a debt
    /// taken on a bucket not yet refilled would be hidden by its cap) and
    /// the node (to recognise its own entry), which is why it is here and
    /// not a merge of two states.
    pub fn receive(
        &self,
        state: &mut EpochBucketState,
        node: NodeId,
        now: Nanos,
        report: &EpochReport,
    ) -> bool {
        self.advance(state, node, now);
        let mut changed = false;
        match report.generation.cmp(&state.report.generation) {
            // From before a reset this node knows of: ignored.
            std::cmp::Ordering::Less => return false,
            // A later reset: the bucket starts over full, and only the
            // report's own traffic (granted after the reset) is taken.
            std::cmp::Ordering::Greater => {
                *state = EpochBucketState::reset(report.generation);
                self.advance(state, node, now);
                changed = true;
            }
            std::cmp::Ordering::Equal => {}
        }
        if report.epoch < state.report.epoch {
            return changed;
        }
        if report.epoch > state.report.epoch {
            state.report = EpochReport::new(report.epoch).with_generation(report.generation);
            changed = true;
        }
        for &(peer, traffic) in &report.traffic {
            let known = state.report.traffic_of(peer);
            if traffic <= known {
                continue;
            }
            if peer != node {
                let new = i64::try_from(traffic - known).unwrap_or(i64::MAX);
                state.level = state.level.saturating_sub(new);
            }
            state.report.raise(peer, traffic);
            changed = true;
        }
        changed
    }

    /// How many of `hits` the state admits at `now`, without changing it.
    pub fn room(&self, state: &EpochBucketState, now: Nanos, hits: u64) -> u64 {
        self.available(state, now).min(hits)
    }

    /// Records `grant` at `now` on node `node`: brings the state to `now`,
    /// takes the granted tokens from the bucket and counts them as this
    /// node's traffic of the open epoch; then describes the state. A grant
    /// of nothing changes nothing (module docs).
    pub fn commit(
        &self,
        state: &mut EpochBucketState,
        node: NodeId,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        if grant.granted > 0 {
            self.advance(state, node, now);
            let taken = i64::try_from(grant.granted).unwrap_or(i64::MAX);
            state.level = state.level.saturating_sub(taken);
            state.open_traffic = state.open_traffic.saturating_add(grant.granted);
        }
        self.describe(state, now, request, grant)
    }

    /// Decides `request` at `now` on node `node`: grants the largest `n` in
    /// `[min_hits, hits]` the bucket holds, or nothing and changes nothing.
    pub fn decide(
        &self,
        state: &mut EpochBucketState,
        node: NodeId,
        now: Nanos,
        request: Hits,
    ) -> Decision {
        let room = self.room(state, now, request.hits);
        let grant = Grant::from_room(request, room);
        self.commit(state, node, now, request, grant)
    }

    /// When the bucket is full if nothing more is taken from it: the refill
    /// timestamp plus the time of the missing tokens, debt included
    /// ([`Nanos::ZERO`] for a state never refilled).
    pub fn full_at(&self, state: &EpochBucketState) -> Nanos {
        let Some(at) = state.refilled_at else {
            return Nanos::ZERO;
        };
        let missing = u64::try_from((i128::from(self.full()) - i128::from(state.level)).max(0))
            .unwrap_or(u64::MAX);
        at.saturating_add(self.interval.saturating_mul(missing))
    }

    /// Whether the state is equivalent to a fresh one at `now` and later,
    /// so a store may drop it: the bucket is full, no traffic is open, and
    /// the report is one the next tick replaces by an empty one (anything
    /// still to gossip, or any peer entry already subtracted, keeps the
    /// state: a fresh one would subtract it again). A fresh one *of its
    /// reset generation*: a reset key also ignores every report from
    /// before its reset, which a fresh state would take, so a store keeps
    /// it a while longer (the replicated store's reset hold).
    pub fn is_idle(&self, state: &EpochBucketState, now: Nanos) -> bool {
        let closed = self.epoch_of(now).saturating_sub(1);
        let stale = state.report.epoch < closed
            || (state.report.epoch == closed && state.report.traffic.is_empty());
        state.open_traffic == 0 && now >= self.full_at(state) && stale
    }

    /// Time from `now` until `min_hits` tokens are in the bucket, assuming
    /// no other traffic and no further correction: zero if they are now,
    /// `None` if they never can be (more than the capacity).
    fn retry_after(&self, state: &EpochBucketState, now: Nanos, min_hits: u64) -> Option<Nanos> {
        if min_hits == 0 {
            return Some(Nanos::ZERO);
        }
        if min_hits > self.capacity.get() {
            return None;
        }
        let (level, at) = self.refilled(state, now);
        let missing = i128::from(min_hits) - i128::from(level);
        if missing <= 0 {
            return Some(Nanos::ZERO);
        }
        // Counting from the refill timestamp credits the fraction of a token
        // already accrued; a debt is repaid first.
        let missing = u64::try_from(missing).unwrap_or(u64::MAX);
        let ready = at.saturating_add(self.interval.saturating_mul(missing));
        Some(ready.saturating_sub(now))
    }

    fn describe(
        &self,
        state: &EpochBucketState,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        Decision {
            granted: grant.granted,
            allowed: grant.allowed,
            limit: self.capacity.get(),
            remaining: self.available(state, now),
            reset_after: self.full_at(state).saturating_sub(now),
            retry_after: self.retry_after(state, now, request.min_hits),
            wait: Nanos::ZERO,
            tier: None,
        }
    }
}

impl Replicated for EpochBucket {
    type State = EpochBucketState;

    fn room_on(&self, state: &EpochBucketState, _node: NodeId, now: Nanos, hits: u64) -> u64 {
        self.room(state, now, hits)
    }

    fn commit_on(
        &self,
        state: &mut EpochBucketState,
        node: NodeId,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        self.commit(state, node, now, request, grant)
    }

    fn idle(&self, state: &EpochBucketState, now: Nanos) -> bool {
        self.is_idle(state, now)
    }
}

/// One key's bucket on one node: the level and its refill timestamp, this
/// node's traffic in the open epoch, and the report of the last committed
/// epoch (which is also what this node has accounted for of its peers).
///
/// The default is a key never seen: its first use fills it. Only the
/// operations of [`EpochBucket`] change it, so its parts stay consistent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct EpochBucketState {
    /// Whole tokens in the bucket at `refilled_at`; negative after peers'
    /// corrections exceed it (seed 001).
    level: i64,
    /// Up to when the level has been refilled; `None` for a key never seen.
    refilled_at: Option<Nanos>,
    /// The epoch whose traffic `open_traffic` counts.
    open_epoch: u64,
    /// Tokens this node granted in the open epoch, not yet reported.
    open_traffic: u64,
    /// The last committed epoch's traffic per node: this node's own,
    /// committed at ticks, and its peers', each already subtracted.
    report: EpochReport,
}

impl EpochBucketState {
    /// Whole tokens in the bucket at the refill timestamp (0 for a key
    /// never seen, which its first use fills); negative when in debt.
    pub fn level(&self) -> i64 {
        self.level
    }

    /// Up to when the level has been refilled (`None` for a key never
    /// seen).
    pub fn refilled_at(&self) -> Option<Nanos> {
        self.refilled_at
    }

    /// The epoch this node is collecting traffic for.
    pub fn open_epoch(&self) -> u64 {
        self.open_epoch
    }

    /// Tokens granted by this node in the open epoch, to be reported when
    /// it closes.
    pub fn open_traffic(&self) -> u64 {
        self.open_traffic
    }

    /// The report this node holds: the last committed epoch it knows and
    /// the traffic per node it has accounted for in it.
    pub fn report(&self) -> &EpochReport {
        &self.report
    }

    /// The state of a key just reset to `generation`: a fresh bucket whose
    /// report ignores every report of an older generation.
    pub fn reset(generation: Generation) -> EpochBucketState {
        EpochBucketState {
            report: EpochReport::default().with_generation(generation),
            ..EpochBucketState::default()
        }
    }

    /// The key's reset generation ([`Generation::ZERO`] if never reset).
    pub fn generation(&self) -> Generation {
        self.report.generation
    }
}

/// What nodes gossip (seed 001): an epoch and the traffic per node in it,
/// "a map of node -> traffic history for its most recently-committed
/// epoch".
///
/// A join semilattice: a later epoch replaces an earlier one whole, and
/// two reports of the same epoch merge node by node with the maximum (each
/// entry only grows, as its node commits more). The default (epoch 0, no
/// traffic) is the bottom. Entries are kept sorted by node with no zeros,
/// so equal values compare equal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct EpochReport {
    /// The key's reset generation: it orders reports before the epoch.
    generation: Generation,
    epoch: u64,
    /// Sorted by node, no duplicates, no zeros.
    traffic: SmallVec<[(NodeId, u64); 4]>,
}

impl EpochReport {
    /// An epoch with no traffic reported yet.
    pub fn new(epoch: u64) -> EpochReport {
        EpochReport {
            generation: Generation::ZERO,
            epoch,
            traffic: SmallVec::new(),
        }
    }

    /// A report from its parts, for decoding one received from a peer.
    /// Duplicate nodes keep the largest traffic and zeros are dropped, so
    /// any input is a valid report.
    pub fn from_parts(epoch: u64, traffic: impl IntoIterator<Item = (NodeId, u64)>) -> EpochReport {
        let mut report = EpochReport::new(epoch);
        for (node, count) in traffic {
            report.raise(node, count);
        }
        report
    }

    /// The same report in `generation` (for decoding one received from a
    /// peer).
    pub fn with_generation(mut self, generation: Generation) -> EpochReport {
        self.generation = generation;
        self
    }

    /// The key's reset generation ([`Generation::ZERO`] if never reset).
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The committed epoch this traffic belongs to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// `(node, traffic)`, sorted by node, nodes without traffic left out.
    pub fn traffic(&self) -> &[(NodeId, u64)] {
        &self.traffic
    }

    /// The traffic reported for `node` (0 if none).
    pub fn traffic_of(&self, node: NodeId) -> u64 {
        match self.traffic.binary_search_by_key(&node, |e| e.0) {
            Ok(i) => self.traffic[i].1,
            Err(_) => 0,
        }
    }

    /// All nodes' traffic, saturating.
    pub fn total(&self) -> u64 {
        self.traffic
            .iter()
            .fold(0u64, |sum, e| sum.saturating_add(e.1))
    }

    /// Merges `other` into this report: a later epoch replaces this one, an
    /// earlier one changes nothing, the same epoch keeps each node's
    /// larger entry. The reset generation orders before the epoch: a
    /// report of a later reset replaces this one whatever its epoch.
    /// Returns whether this report changed.
    pub fn merge(&mut self, other: &EpochReport) -> bool {
        if (other.generation, other.epoch) < (self.generation, self.epoch) {
            return false;
        }
        if (other.generation, other.epoch) > (self.generation, self.epoch) {
            self.clone_from(other);
            return true;
        }
        let mut changed = false;
        for &(node, count) in &other.traffic {
            changed |= self.raise(node, count);
        }
        changed
    }

    /// Whether merging `other` would change nothing (`other ⊑ self`).
    pub fn includes(&self, other: &EpochReport) -> bool {
        (other.generation, other.epoch) < (self.generation, self.epoch)
            || ((other.generation, other.epoch) == (self.generation, self.epoch)
                && other
                    .traffic
                    .iter()
                    .all(|&(node, count)| self.traffic_of(node) >= count))
    }

    /// Raises `node`'s entry to at least `count`; whether it changed.
    fn raise(&mut self, node: NodeId, count: u64) -> bool {
        raise_entry(&mut self.traffic, node, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);
    const C: NodeId = NodeId(3);

    fn bucket(capacity: u64, per_sec: u64) -> EpochBucket {
        EpochBucket::new(capacity, Rate::per_second(per_sec).unwrap()).unwrap()
    }

    fn ms(n: u64) -> Nanos {
        Nanos::from_millis(n)
    }

    #[test]
    fn parameters_are_validated() {
        let r = Rate::per_second(1).unwrap();
        assert_eq!(
            EpochBucket::new(0, r),
            Err(ParamError::MustBePositive { param: "capacity" })
        );
        assert_eq!(
            EpochBucket::with_epoch(5, r, Nanos::ZERO),
            Err(ParamError::MustBePositive { param: "epoch" })
        );
        assert!(matches!(
            EpochBucket::new(u64::MAX, r),
            Err(ParamError::TooLarge {
                param: "capacity",
                ..
            })
        ));
        let b = EpochBucket::new(5, r).unwrap();
        assert_eq!(b.epoch(), Nanos::SECOND);
        assert_eq!(b.epoch_of(ms(2999)), 2);
    }

    #[test]
    fn never_grants_more_than_the_level() {
        let b = bucket(5, 1);
        let mut s = EpochBucketState::default();
        let d = b.decide(&mut s, A, Nanos::ZERO, Hits::between(1, 8));
        assert_eq!(d.granted, 5);
        assert_eq!(s.open_traffic(), 5);
        let d = b.decide(&mut s, A, ms(500), Hits::exactly(1));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(ms(500)));
        assert_eq!(d.reset_after, ms(4500));
        // A rejection changes nothing.
        let before = s.clone();
        b.decide(&mut s, A, ms(900), Hits::exactly(6));
        assert_eq!(s, before);
    }

    #[test]
    fn the_tick_commits_the_open_traffic() {
        let b = bucket(5, 1);
        let mut s = EpochBucketState::default();
        b.decide(&mut s, A, ms(200), Hits::exactly(3));
        assert_eq!(s.report(), &EpochReport::new(0));
        let r = b.report(&mut s, A, ms(1100));
        assert_eq!(r, EpochReport::from_parts(0, [(A, 3)]));
        assert_eq!((s.open_epoch(), s.open_traffic()), (1, 0));
        // The next tick starts a new report; an idle epoch reports nothing.
        b.decide(&mut s, A, ms(1200), Hits::exactly(1));
        assert_eq!(
            b.report(&mut s, A, ms(2000)),
            EpochReport::from_parts(1, [(A, 1)])
        );
        assert_eq!(b.report(&mut s, A, ms(3000)), EpochReport::new(2));
    }

    #[test]
    fn a_late_tick_files_the_traffic_under_the_epoch_just_closed() {
        let b = bucket(5, 1);
        let mut s = EpochBucketState::default();
        b.decide(&mut s, A, ms(200), Hits::exactly(2));
        assert_eq!(
            b.report(&mut s, A, ms(3500)),
            EpochReport::from_parts(2, [(A, 2)])
        );
    }

    #[test]
    fn peers_traffic_is_subtracted_once_and_can_go_negative() {
        // Seed 001: corrections can take the count negative.
        let b = bucket(5, 1);
        let mut a = EpochBucketState::default();
        let mut bb = EpochBucketState::default();
        assert_eq!(b.decide(&mut a, A, ms(0), Hits::between(1, 9)).granted, 5);
        assert_eq!(b.decide(&mut bb, B, ms(0), Hits::between(1, 9)).granted, 5);
        let ra = b.report(&mut a, A, ms(1000));
        let rb = b.report(&mut bb, B, ms(1000));
        assert!(b.receive(&mut a, A, ms(1000), &rb));
        // A refilled one token at 1 s, then owes B's five.
        assert_eq!(a.level(), -4);
        let again = a.clone();
        assert!(!b.receive(&mut a, A, ms(1000), &rb));
        assert_eq!(a, again);
        // Its own report echoed back subtracts nothing.
        assert!(!b.receive(&mut a, A, ms(1000), &ra));
        assert_eq!(a, again);
        // A larger entry for the same epoch subtracts only the difference.
        let grown = EpochReport::from_parts(0, [(B, 7), (C, 1)]);
        assert!(b.receive(&mut a, A, ms(1000), &grown));
        assert_eq!(a.level(), -7);
        assert_eq!(
            a.report(),
            &EpochReport::from_parts(0, [(A, 5), (B, 7), (C, 1)])
        );
        // The debt is repaid at the rate: one token needs 8 more seconds.
        let d = b.decide(&mut a, A, ms(1000), Hits::exactly(1));
        assert_eq!(d.retry_after, Some(Nanos::from_secs(8)));
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn reports_of_other_epochs() {
        let b = bucket(10, 1);
        let mut a = EpochBucketState::default();
        b.decide(&mut a, A, ms(4100), Hits::exactly(1));
        b.advance(&mut a, A, ms(5100));
        assert_eq!(a.report().epoch(), 4);
        // An older epoch is ignored: its traffic is never subtracted.
        let before = a.clone();
        assert!(!b.receive(&mut a, A, ms(5100), &EpochReport::from_parts(3, [(B, 4)])));
        assert_eq!(a, before);
        // A later one (a peer's clock ahead) replaces ours, all subtracted.
        assert!(b.receive(
            &mut a,
            A,
            ms(5100),
            &EpochReport::from_parts(5, [(B, 2), (A, 9)])
        ));
        assert_eq!(a.report(), &EpochReport::from_parts(5, [(A, 9), (B, 2)]));
        assert_eq!(a.level(), 10 - 2);
        // Our own open traffic of epoch 5 adds to our entry when it closes.
        b.decide(&mut a, A, ms(5200), Hits::exactly(1));
        assert_eq!(b.report(&mut a, A, ms(6000)).traffic_of(A), 10);
    }

    #[test]
    fn report_merge_is_a_join() {
        let x = EpochReport::from_parts(3, [(A, 2), (B, 1)]);
        let y = EpochReport::from_parts(3, [(B, 4), (C, 1)]);
        let z = EpochReport::from_parts(4, [(C, 1)]);
        let mut xy = x.clone();
        assert!(xy.merge(&y));
        let mut yx = y.clone();
        assert!(yx.merge(&x));
        assert_eq!(xy, yx);
        assert_eq!(xy, EpochReport::from_parts(3, [(A, 2), (B, 4), (C, 1)]));
        assert!(!xy.clone().merge(&x));
        assert!(xy.includes(&x) && !x.includes(&xy));
        let mut later = xy.clone();
        assert!(later.merge(&z));
        assert_eq!(later, z);
        assert!(!later.merge(&xy));
        assert!(z.includes(&xy));
        assert_eq!(xy.total(), 7);
        assert_eq!(
            EpochReport::from_parts(1, [(B, 2), (A, 0), (B, 1)]).traffic(),
            &[(B, 2)]
        );
    }

    #[test]
    fn idle_only_once_nothing_is_left_to_gossip() {
        let b = bucket(2, 10);
        let mut s = EpochBucketState::default();
        assert!(b.is_idle(&s, ms(123)));
        b.decide(&mut s, A, ms(100), Hits::exactly(2));
        // Full again at 300 ms, but the traffic is open.
        assert!(!b.is_idle(&s, ms(900)));
        b.advance(&mut s, A, ms(1000));
        // Committed for epoch 0: still to be gossiped.
        assert!(!b.is_idle(&s, ms(1900)));
        assert!(b.is_idle(&s, ms(2000)));
        // A peer's entry already subtracted also keeps the state.
        let mut t = EpochBucketState::default();
        b.receive(&mut t, A, ms(1000), &EpochReport::from_parts(0, [(B, 1)]));
        assert!(!b.is_idle(&t, ms(1500)));
        assert!(b.is_idle(&t, ms(2000)));
    }

    #[test]
    fn on_node_is_an_algorithm() {
        let alg = bucket(3, 1).on(B);
        let mut s = alg.fresh();
        let alone = alg.decide_alone(&mut s, Nanos::ZERO, Hits::between(1, 5));
        assert_eq!(alone.room, 3);
        assert_eq!(alone.decision.granted, 3);
        assert!(!alone.idle);
        assert_eq!(s.open_traffic(), 3);
    }

    #[test]
    fn extremes_saturate() {
        let b = EpochBucket::with_epoch(
            1 << 62,
            Rate::new(1, Nanos::NANOSECOND).unwrap(),
            Nanos::NANOSECOND,
        )
        .unwrap();
        let mut s = EpochBucketState::default();
        b.decide(&mut s, A, Nanos::MAX, Hits::between(1, u64::MAX));
        let huge = EpochReport::from_parts(u64::MAX, [(B, u64::MAX), (C, u64::MAX)]);
        assert!(b.receive(&mut s, A, Nanos::MAX, &huge));
        assert_eq!(s.level(), i64::MIN);
        let d = b.decide(&mut s, A, Nanos::MAX, Hits::exactly(1));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Nanos::ZERO));
        let d = b.decide(&mut s, C, Nanos::ZERO, Hits::between(0, u64::MAX));
        assert_eq!(d.granted, 0);
        assert!(!b.is_idle(&s, Nanos::ZERO));
        b.report(&mut s, A, Nanos::ZERO);
    }
}
