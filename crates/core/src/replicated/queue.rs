//! The thesis's token-bucket queue as a state-based CRDT (thesis §4.1.2,
//! §4.2.1–4.2.2, Listings 4.1–4.4, and the margin §5.4 asks for).
//!
//! # What it is
//!
//! One key's state is a queue of [`Element`]s, one per granted hit, sorted
//! by identity. Each element has a *time of birth* (when it was granted), a
//! *time of death* (when its token is refilled) and, unlike the thesis, the
//! granting node and a per-node sequence number in its identity. A hit is
//! granted when fewer than `capacity` elements are alive (`death > now`).
//! A new element dies one refill interval `T` after the element before it,
//! or `T` after now if none is alive (Equation 4.2), so elements die one per
//! `T`: on one node this *is* a token bucket of `capacity` refilled at
//! `rate` — it grants exactly what [`crate::TokenBucket`] grants, as long
//! as time does not go backwards (a decision at a time before an earlier
//! one sees the elements alive then, which is only stricter).
//!
//! A merge is the merge step of merge sort over two queues (Listing 4.2):
//! the same element in both keeps the larger death, and every element's
//! death is raised to at least `T` after its predecessor's (Listing 4.3,
//! which never lowers a death). Requests that two nodes granted without
//! seeing each other thus push each other's deaths back, and the merged
//! queue refills as slowly as if one node had granted them all.
//!
//! What is not here: which keys or elements each neighbour still has to
//! receive, frequency analysis (§4.2.3), LINF (§4.2.4), transport. The
//! replicated store owns those; this module gives it the join, the pruning
//! and the deltas ([`QueueState::merge_changes`],
//! [`QueueState::changes_since`], [`QueueState::elements_after`]).
//!
//! # Why the merge is a CRDT
//!
//! Call a queue *closed* under `T` when, in identity order, every death is
//! at least `T` after the one before. Every state this module builds is
//! closed: a local grant appends at the tail with `death >= tail.death + T`,
//! and [`QueueState::merge`] and [`QueueState::from_elements`] close their
//! result. Order closed states by "has every element of the other, each
//! with a death at least as late, and an interval at least as long". The
//! merge of `a` and `b` is then their *least* closed upper bound: the union
//! keeping the larger death, with the interval `max(Ta, Tb)`, closed by one
//! forward pass. Any closed `c` above both holds every element of the
//! union, and its deaths satisfy the closure constraints (with elements in
//! between, more strongly), so by induction along the queue each of its
//! deaths is at least the pass's. A least upper bound is unique, which
//! makes the merge commutative, associative and idempotent — the thesis
//! left this unproven (§3.4.1). Listing 4.3's `max` is what makes it hold:
//! recomputing deaths from Equation 4.2 alone could lower a death, and the
//! result would depend on the order of merges.
//!
//! Pruning is the one step outside the lattice. It drops elements dead for
//! longer than the margin, and it is not a join: an element pruned on
//! every node before it reached some node is forgotten there, and that
//! node's later elements are not pushed back by it (§5.4, the thesis's
//! "elements removed before they reach every node"). The margin exists to
//! make that rare: set it to how long gossip takes to reach every node.
//! Replicas that have merged each other's current states are still equal,
//! whatever they pruned before.
//!
//! # Where this departs from the thesis, and why
//!
//! - **Identity** (§4.2.2, second scenario): the thesis identifies an
//!   element by its time of birth alone, so two nodes that grant in the
//!   same millisecond merge two requests into one. Here an element is
//!   identified by `(birth, node, seq)` ([`ElementId`]): 16 more bytes per
//!   element (32 in all with padding, against the thesis's two 8-byte
//!   timestamps), the "GUID" the thesis considered and left out for
//!   memory. With birth-only identities the merge would still be a join,
//!   but of the wrong thing: two requests would count as one.
//! - **Duplicates in deltas** (Listing 4.2, line 7): with unique
//!   identities a neighbour's delta is merged with the same join as the
//!   local state, so the `into_local_state` flag is gone. (That mode keeps
//!   both copies of an element and is not idempotent: a list of updates
//!   merged twice into a delta would count its elements twice.)
//! - **Listing 4.1** reads `time_of_death > now()` in the extracted text,
//!   which would drop live elements and keep dead ones; we read it as
//!   "dead when `death <= now`", the reading that makes one node a token
//!   bucket (the token of an element returns at its death).
//! - **Merge has no clock**: the thesis refills after merging; here
//!   [`QueueState::merge`] is the pure join and the store calls
//!   [`TokenQueue::prune`] afterwards, because a join that depends on the
//!   time of merging is no longer commutative.
//! - **Retention margin** (§5.4): dead elements are kept for
//!   [`TokenQueue::margin`] past their death, so they can still reach
//!   every node and push back the deaths of elements granted there.
//! - **Births are clamped to the tail**: a new element goes at the tail
//!   (§4.2.1, "put on the tail end of the queue"), so its birth is at least
//!   the tail's birth even if this node's clock is behind a peer's or went
//!   backwards; its death follows Equation 4.2 from the tail.
//! - **Hits**: one element per hit (the thesis's requests are one token
//!   each); the elements of one request die `T` apart.
//! - **The interval travels with the state**: Listing 4.3 needs the refill
//!   rate, and a merge must not depend on which node runs it, so a state
//!   carries the interval it was closed under and a merge takes the larger
//!   (the slower rate: the conservative choice). A key whose rate changes
//!   keeps the slower of its old and new rates until its queue empties.
//!
//! # Memory
//!
//! A node never grants past `capacity` live elements, and deaths are at
//! least `T` apart, so a queue that only this node fed holds at most
//! `capacity + margin / T + 1` elements; parameters are refused when that
//! exceeds [`MAX_ELEMENTS`]. A merged queue holds more: every hit granted
//! on nodes that had not yet heard of each other, which is the overshoot
//! the merged queue pays back by refilling later (it is "in debt"). While
//! gossip keeps up that is a few times `capacity`; after a partition it is
//! every hit granted on every side of it. This module does not truncate,
//! because no truncation is a join; a store that must bound a key's
//! memory against long partitions has to refuse or cap what it merges
//! (see [`QueueState::footprint`]).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::VecDeque;
use std::num::NonZeroU64;

use super::{Generation, NodeId, OnNode, Replicated};
use crate::algorithm::Algorithm;
use crate::decision::{Decision, Grant, Hits};
use crate::error::ParamError;
use crate::rate::Rate;
use crate::time::{Nanos, Span, SpanError};

/// The most elements one node's queue may hold for one key after a local
/// decision (`capacity + margin / interval + 1`): 65,536 elements, 2 MiB.
pub const MAX_ELEMENTS: u64 = 1 << 16;

/// Token-bucket-queue parameters: capacity, refill rate and retention
/// margin (thesis §4.1.2, §5.4).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenQueue {
    capacity: NonZeroU64,
    interval: Nanos,
    margin: Nanos,
}

/// Who granted an element, and when: the element's identity.
///
/// Ordered by birth, then node, then sequence number: the queue's order.
/// The node and sequence number make identities unique when two nodes, or
/// two requests on one node, are granted at the same instant (§4.2.2).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ElementId {
    /// When the hit was granted (clamped to the queue's tail; see the
    /// module docs).
    pub birth: Nanos,
    /// The node that granted it.
    pub node: NodeId,
    /// Distinguishes elements the same node created at the same birth.
    pub seq: u32,
}

/// One granted hit: its identity and when its token is refilled.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Element {
    /// Which hit this is.
    pub id: ElementId,
    /// When the element dies and its token returns: alive while
    /// `now < death`.
    pub death: Nanos,
}

/// One key's replicated state: the queue of elements, in identity order,
/// closed under its interval (see the module docs).
///
/// The default value is a key never seen, and what an emptied queue
/// becomes, so a store can drop it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct QueueState {
    /// The key's reset generation: a state of a higher one replaces this
    /// one whole in a merge, one of a lower one is ignored. Kept when the
    /// queue empties.
    generation: Generation,
    /// The refill interval the queue is closed under; zero when empty.
    interval: Nanos,
    /// Sorted by id, unique ids, deaths at least `interval` apart.
    elements: VecDeque<Element>,
}

impl TokenQueue {
    /// A queue of `capacity` tokens refilled at `rate`, with no retention
    /// margin (the thesis's behaviour).
    pub fn new(capacity: u64, rate: Rate) -> Result<TokenQueue, ParamError> {
        TokenQueue::with_margin(capacity, rate, Nanos::ZERO)
    }

    /// As [`TokenQueue::new`], keeping dead elements for `margin` past
    /// their death so gossip can still carry them to every node (§5.4).
    pub fn with_margin(capacity: u64, rate: Rate, margin: Nanos) -> Result<TokenQueue, ParamError> {
        let capacity = ParamError::positive("capacity", capacity)?;
        let interval = rate.interval();
        ParamError::hits_span("capacity", capacity, interval)?;
        // No margin is the thesis's behaviour; a margin is a span.
        if let Err(problem @ SpanError::TooLong) = Span::new(margin) {
            return Err(ParamError::Span {
                param: "margin",
                problem,
            });
        }
        // Deaths are at least one interval apart, so the margin keeps at
        // most this many dead elements besides the live ones.
        let kept = margin.as_u64().div_ceil(interval.as_u64().max(1));
        let most = capacity.get().saturating_add(kept).saturating_add(1);
        if most > MAX_ELEMENTS {
            return Err(ParamError::TooLarge {
                param: "capacity",
                reason: format!(
                    "a queue of {capacity} tokens at one every {interval}, keeping dead \
                     elements for {margin}, can hold {most} elements; the most is {MAX_ELEMENTS}"
                ),
            });
        }
        Ok(TokenQueue {
            capacity,
            interval,
            margin,
        })
    }

    /// Tokens a full bucket holds: the most elements a node lets live.
    pub fn capacity(&self) -> u64 {
        self.capacity.get()
    }

    /// Nanoseconds per token, `1 / refillRate` in Equation 4.2 (rounded
    /// down, see [`Rate`]).
    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// How long a dead element is kept before it is pruned.
    pub fn margin(&self) -> Nanos {
        self.margin
    }

    /// `capacity / refillRate` (Equation 4.1): the longest an element
    /// granted on one node lives, i.e. the time an empty bucket takes to
    /// refill. The thesis's example: 4 tokens at 1 per second, 4 seconds.
    pub fn lifetime(&self) -> Nanos {
        self.interval.saturating_mul(self.capacity.get())
    }

    /// This queue deciding on behalf of `node`.
    pub fn on(&self, node: NodeId) -> OnNode<Self> {
        OnNode { limit: *self, node }
    }

    /// Elements alive at `now`: the tokens consumed and not yet refilled
    /// (the "size of the queue" the thesis compares with the limit).
    pub fn live(&self, state: &QueueState, now: Nanos) -> u64 {
        self.effective(state).live(now)
    }

    /// How many of `hits` `node` may grant at `now`, without changing
    /// anything.
    pub fn room(&self, state: &QueueState, node: NodeId, now: Nanos, hits: u64) -> u64 {
        let state = self.effective(state);
        let free = self.capacity.get().saturating_sub(state.live(now));
        // The identities commit will take come after the tail that
        // survives its pruning; deaths rise, so either the tail survives
        // or nothing does.
        let tail = if self.is_idle(&state, now) {
            None
        } else {
            state.tail_id()
        };
        free.min(hits).min(ids_available(tail, node, now, hits))
    }

    /// Refills at `now` (Listing 4.1), then records `grant` on behalf of
    /// `node`: one element per hit at the tail (Equation 4.2). Describes
    /// the state afterwards.
    ///
    /// A grant larger than [`TokenQueue::room`] allows is cut to the room,
    /// and the decision says so: a queue never grows past its capacity on
    /// a local decision, whatever the caller passes.
    pub fn commit(
        &self,
        state: &mut QueueState,
        node: NodeId,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        // Re-closing under a slower configured rate comes first, so the
        // elements about to be pruned still push their successors back.
        state.raise_interval(self.interval);
        self.prune(state, now);
        // An emptied (or fresh) queue has no interval; its new elements
        // take this one.
        let interval = state.interval.max(self.interval);
        let want = grant
            .granted
            .min(self.room(state, node, now, grant.granted));
        let mut granted = 0;
        while granted < want {
            let Some(id) = next_id(state.tail_id(), node, now) else {
                break;
            };
            // Equation 4.2: one interval after the tail's death, or after
            // now when the tail is already dead (the refilled queue is
            // empty).
            let from = state.elements.back().map_or(now, |e| e.death.max(now));
            state.elements.push_back(Element {
                id,
                death: from.saturating_add(interval),
            });
            state.interval = interval;
            granted += 1;
        }
        let grant = if granted == grant.granted {
            grant
        } else {
            Grant {
                granted,
                allowed: grant.allowed && granted >= request.min_hits,
            }
        };
        self.describe(state, now, request, grant)
    }

    /// Decides one request for `node` at `now`: the largest `n` in
    /// `[min_hits, hits]` that fits, or nothing.
    pub fn decide(
        &self,
        state: &mut QueueState,
        node: NodeId,
        now: Nanos,
        request: Hits,
    ) -> Decision {
        self.on(node).decide(state, now, request)
    }

    /// Drops the elements dead for at least the margin at `now`
    /// (Listing 4.1, with §5.4's margin). The store calls it after a merge,
    /// as the thesis refills after merging; decisions call it themselves.
    pub fn prune(&self, state: &mut QueueState, now: Nanos) {
        state.prune(now, self.margin);
    }

    /// Whether pruning at `now` would empty the queue: the state is then
    /// equivalent to a fresh one now and later, and a store may drop it.
    pub fn is_idle(&self, state: &QueueState, now: Nanos) -> bool {
        state
            .elements
            .back()
            .is_none_or(|e| e.death.saturating_add(self.margin) <= now)
    }

    /// The state as a local decision sees it: closed under this queue's
    /// interval too. Borrowed unless a slower rate was configured than the
    /// state carries (rare: only after a configuration change).
    fn effective<'a>(&self, state: &'a QueueState) -> Cow<'a, QueueState> {
        if state.elements.is_empty() || state.interval >= self.interval {
            Cow::Borrowed(state)
        } else {
            let mut raised = state.clone();
            raised.raise_interval(self.interval);
            Cow::Owned(raised)
        }
    }

    fn describe(&self, state: &QueueState, now: Nanos, request: Hits, grant: Grant) -> Decision {
        let live = state.live(now);
        let reset_after = state
            .elements
            .back()
            .map_or(Nanos::ZERO, |e| e.death.saturating_sub(now));
        Decision {
            granted: grant.granted,
            allowed: grant.allowed,
            limit: self.capacity.get(),
            remaining: self.capacity.get().saturating_sub(live),
            reset_after,
            retry_after: self.retry_after(state, now, request.min_hits),
            wait: Nanos::ZERO,
            tier: None,
        }
    }

    /// When enough elements have died for `min_hits` to fit. Deaths rise
    /// along the queue, so the elements die in order and the answer is the
    /// death of the last one that has to go.
    fn retry_after(&self, state: &QueueState, now: Nanos, min_hits: u64) -> Option<Nanos> {
        if min_hits == 0 {
            return Some(Nanos::ZERO);
        }
        if min_hits > self.capacity.get() {
            return None;
        }
        let first = state.first_live(now);
        let live = state.elements.len().saturating_sub(first) as u64;
        let must_die = live.saturating_sub(self.capacity.get() - min_hits);
        if must_die == 0 {
            return Some(Nanos::ZERO);
        }
        let last = first.saturating_add(must_die as usize - 1);
        state
            .elements
            .get(last)
            .map(|e| e.death.saturating_sub(now))
    }
}

impl Replicated for TokenQueue {
    type State = QueueState;

    fn room_on(&self, state: &QueueState, node: NodeId, now: Nanos, hits: u64) -> u64 {
        self.room(state, node, now, hits)
    }

    fn commit_on(
        &self,
        state: &mut QueueState,
        node: NodeId,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        self.commit(state, node, now, request, grant)
    }

    fn idle(&self, state: &QueueState, now: Nanos) -> bool {
        self.is_idle(state, now)
    }
}

impl QueueState {
    /// A state from elements received from a peer, in any order and with
    /// any duplicates: sorted, duplicates keeping the later death, and
    /// closed under `interval` (Listing 4.3), so it obeys the invariants
    /// every merge relies on. An empty queue has no interval.
    pub fn from_elements(interval: Nanos, elements: impl IntoIterator<Item = Element>) -> Self {
        let mut sorted: Vec<Element> = elements.into_iter().collect();
        // Same id next to each other, latest death first, so dedup keeps it.
        sorted.sort_unstable_by(|a, b| a.id.cmp(&b.id).then(b.death.cmp(&a.death)));
        sorted.dedup_by_key(|e| e.id);
        let mut state = QueueState {
            generation: Generation::ZERO,
            interval: if sorted.is_empty() {
                Nanos::ZERO
            } else {
                interval
            },
            elements: sorted.into(),
        };
        state.close();
        state
    }

    /// The state of a key just reset to `generation`: an empty queue that
    /// every state of an older generation merges into as nothing.
    pub fn reset(generation: Generation) -> QueueState {
        QueueState {
            generation,
            ..QueueState::default()
        }
    }

    /// The same state in `generation` (for decoding one received from a
    /// peer).
    pub fn with_generation(mut self, generation: Generation) -> QueueState {
        self.generation = generation;
        self
    }

    /// The key's reset generation ([`Generation::ZERO`] if never reset).
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The refill interval the queue is closed under (zero when empty).
    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// The elements, oldest identity first; their deaths strictly rise
    /// (for any positive interval).
    pub fn elements(&self) -> impl DoubleEndedIterator<Item = &Element> + ExactSizeIterator + '_ {
        self.elements.iter()
    }

    /// How many elements are held, dead ones in the margin included.
    pub fn len(&self) -> usize {
        self.elements.len()
    }

    /// Whether no element is held: the state of a key never seen.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }

    /// The identity of the newest element: a version for local grants,
    /// which append at the tail (see [`QueueState::elements_after`]).
    pub fn tail_id(&self) -> Option<ElementId> {
        self.elements.back().map(|e| e.id)
    }

    /// Elements whose identity is after `version` (everything when
    /// `None`): what local grants added since [`QueueState::tail_id`]
    /// returned `version`, the cheap local delta of §4.2.1 ("immediately
    /// added to the tail end of this user's queue in each delta state").
    ///
    /// It is exact for a peer that had everything before, even when a
    /// slower configured rate re-closed the queue (the delta carries the
    /// interval and the peer re-closes alike), except for a decision that
    /// raised the interval and granted nothing, which leaves it empty. A
    /// merge can change older elements; its changes come from
    /// [`QueueState::merge_changes`], and [`QueueState::changes_since`] is
    /// exact in every case.
    pub fn elements_after(&self, version: Option<ElementId>) -> QueueState {
        let from = match version {
            None => 0,
            Some(v) => self.elements.partition_point(|e| e.id <= v),
        };
        QueueState::subset(
            self.generation,
            self.interval,
            self.elements.range(from..).copied(),
        )
    }

    /// Merges `other` into `self`: the join of the two states (§4.2.1,
    /// Listings 4.2–4.3). Commutative, associative and idempotent; see the
    /// module docs. Returns whether `self` changed (Listing 3.3's test for
    /// passing the key on to the other neighbours). It does not prune: the
    /// store calls [`TokenQueue::prune`] afterwards.
    pub fn merge(&mut self, other: &QueueState) -> bool {
        self.join(other, None)
    }

    /// Whether an element of identity `id` is in the queue (pruned ones
    /// are not).
    pub fn contains(&self, id: ElementId) -> bool {
        self.elements.binary_search_by(|e| e.id.cmp(&id)).is_ok()
    }

    /// Whether `other` is already part of this state (`other ⊑ self`):
    /// every element of `other` is here with a death at least as late, and
    /// the interval is at least as long, so merging it would change
    /// nothing.
    pub fn includes(&self, other: &QueueState) -> bool {
        if other.generation != self.generation {
            return other.generation < self.generation;
        }
        other.elements.is_empty()
            || (other.interval <= self.interval && other.changes_since(self).is_empty())
    }

    /// Bytes this state occupies, inline and on the heap, for the memory
    /// benchmarks (32 bytes per element held).
    pub fn footprint(&self) -> usize {
        std::mem::size_of::<QueueState>()
            + self.elements.capacity() * std::mem::size_of::<Element>()
    }

    /// [`QueueState::merge`], returning what changed: the elements that
    /// are new to `self` or whose death rose, the thesis's "list of
    /// updates" (§4.2.1) that the store adds to every other neighbour's
    /// delta (all of them when the interval grew). Merging it into the old
    /// `self` gives the new `self`.
    pub fn merge_changes(&mut self, other: &QueueState) -> QueueState {
        let (generation, interval) = (self.generation, self.interval);
        let mut changes = VecDeque::new();
        self.join(other, Some(&mut changes));
        if self.generation > generation || self.interval > interval {
            // A later reset generation replaced the state: a peer must
            // learn all of it, the generation included.
            // A peer must learn the longer interval too, even where no
            // death rose: rare (a rate changed), so the whole queue goes.
            return self.clone();
        }
        QueueState::subset(self.generation, self.interval, changes)
    }

    /// The elements of `self` that `before` lacks or holds with an earlier
    /// death: a delta that brings `before` up to `self`
    /// (`before.merge(&self.changes_since(&before))` equals
    /// `before.merge(&self)`).
    pub fn changes_since(&self, before: &QueueState) -> QueueState {
        if self.generation < before.generation {
            // Nothing here is news to a state of a later generation.
            return QueueState::reset(self.generation);
        }
        if self.generation > before.generation || self.interval > before.interval {
            // As in `merge_changes`: a longer interval sends everything.
            return self.clone();
        }
        let mut old = before.elements.iter().peekable();
        let mut changes = VecDeque::new();
        for e in &self.elements {
            while old.next_if(|o| o.id < e.id).is_some() {}
            let known = old
                .peek()
                .is_some_and(|o| o.id == e.id && o.death >= e.death);
            if !known {
                changes.push_back(*e);
            }
        }
        QueueState::subset(self.generation, self.interval, changes)
    }

    /// Drops every element dead for at least `margin` at `now`. Deaths
    /// rise along the queue, so they are a prefix. An emptied queue forgets
    /// its interval and equals [`QueueState::default`], or
    /// [`QueueState::reset`] of its generation.
    pub fn prune(&mut self, now: Nanos, margin: Nanos) {
        while self
            .elements
            .front()
            .is_some_and(|e| e.death.saturating_add(margin) <= now)
        {
            self.elements.pop_front();
        }
        if self.elements.is_empty() {
            self.interval = Nanos::ZERO;
        }
    }

    /// A sub-queue of a closed queue is closed (deaths of non-adjacent
    /// elements are further apart still), so it needs no closing.
    fn subset(
        generation: Generation,
        interval: Nanos,
        elements: impl IntoIterator<Item = Element>,
    ) -> QueueState {
        let elements: VecDeque<Element> = elements.into_iter().collect();
        QueueState {
            generation,
            interval: if elements.is_empty() {
                Nanos::ZERO
            } else {
                interval
            },
            elements,
        }
    }

    /// Index of the first element alive at `now`.
    fn first_live(&self, now: Nanos) -> usize {
        self.elements.partition_point(|e| e.death <= now)
    }

    /// Elements alive at `now`.
    fn live(&self, now: Nanos) -> u64 {
        (self.elements.len() - self.first_live(now)) as u64
    }

    /// Raises every death to at least one interval after its
    /// predecessor's (Listing 4.3); deaths only ever rise, and the first
    /// element, with no predecessor, keeps its own.
    fn close(&mut self) {
        let interval = self.interval;
        let mut prev: Option<Nanos> = None;
        for e in self.elements.iter_mut() {
            if let Some(p) = prev {
                e.death = e.death.max(p.saturating_add(interval));
            }
            prev = Some(e.death);
        }
    }

    /// Adopts a longer interval (a join with an empty queue closed under
    /// it), re-closing the queue.
    fn raise_interval(&mut self, interval: Nanos) {
        // An empty queue has no interval (it equals a fresh one).
        if interval > self.interval && !self.elements.is_empty() {
            self.interval = interval;
            self.close();
        }
    }

    /// The join: merge sort by identity (Listing 4.2), the later death for
    /// the same element, then Listing 4.3 in the same pass. Returns whether
    /// `self` changed; when `changes` is given, collects the elements that
    /// are new or rose.
    fn join(&mut self, other: &QueueState, mut changes: Option<&mut VecDeque<Element>>) -> bool {
        // Generations first: a later reset replaces this state whole, an
        // earlier one is ignored (a lexicographic product, still a join).
        let reset = match other.generation.cmp(&self.generation) {
            Ordering::Less => return false,
            Ordering::Greater => {
                *self = QueueState::reset(other.generation);
                true
            }
            Ordering::Equal => false,
        };
        if other.elements.is_empty() {
            // Empty states carry no interval: nothing to learn.
            return reset;
        }
        let interval = self.interval.max(other.interval);
        let mut changed = reset || interval != self.interval;
        let mut mine = std::mem::take(&mut self.elements).into_iter().peekable();
        let mut theirs = other.elements.iter().copied().peekable();
        let mut merged = VecDeque::with_capacity(mine.len() + theirs.len());
        let mut prev: Option<Nanos> = None;
        loop {
            let side = match (mine.peek(), theirs.peek()) {
                (None, None) => break,
                (Some(m), Some(t)) => m.id.cmp(&t.id),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
            };
            // The next element, and the death `self` held for it.
            let (mut e, held) = match side {
                Ordering::Less => {
                    let Some(m) = mine.next() else { break };
                    (m, Some(m.death))
                }
                Ordering::Greater => {
                    let Some(t) = theirs.next() else { break };
                    (t, None)
                }
                Ordering::Equal => {
                    let (Some(m), Some(t)) = (mine.next(), theirs.next()) else {
                        break;
                    };
                    let death = m.death.max(t.death);
                    (Element { id: m.id, death }, Some(m.death))
                }
            };
            if let Some(p) = prev {
                // Listing 4.3: one interval after the element before it,
                // never lower than the death it already has.
                e.death = e.death.max(p.saturating_add(interval));
            }
            prev = Some(e.death);
            if held.is_none_or(|h| h < e.death) {
                changed = true;
                if let Some(changes) = changes.as_deref_mut() {
                    changes.push_back(e);
                }
            }
            merged.push_back(e);
        }
        self.interval = interval;
        self.elements = merged;
        changed
    }
}

/// The identity for the next element `node` appends at `now` after
/// `tail`: the smallest one after the tail with this node and a birth no earlier
/// than `now`. `None` only when the tail sits at the end of time.
fn next_id(tail: Option<ElementId>, node: NodeId, now: Nanos) -> Option<ElementId> {
    let Some(tail) = tail else {
        return Some(ElementId {
            birth: now,
            node,
            seq: 0,
        });
    };
    let birth = now.max(tail.birth);
    let fresh = ElementId {
        birth,
        node,
        seq: 0,
    };
    if fresh > tail {
        return Some(fresh);
    }
    // Same birth as the tail and a node no later than its node.
    if node == tail.node && tail.seq < u32::MAX {
        return Some(ElementId {
            seq: tail.seq + 1,
            ..tail
        });
    }
    if birth < Nanos::MAX {
        return Some(ElementId {
            birth: birth.saturating_add(Nanos::NANOSECOND),
            node,
            seq: 0,
        });
    }
    None
}

/// How many of `hits` new identities `node` can still take at `now`:
/// all of them, unless the tail sits at the end of time (a birth of
/// `Nanos::MAX`, year 2554), where only the sequence numbers are left.
fn ids_available(tail: Option<ElementId>, node: NodeId, now: Nanos, hits: u64) -> u64 {
    match next_id(tail, node, now) {
        None => 0,
        Some(id) if id.birth < Nanos::MAX => hits,
        Some(id) => hits.min(u64::from(u32::MAX - id.seq) + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);
    const C: NodeId = NodeId(3);

    fn secs(s: u64) -> Nanos {
        Nanos::from_secs(s)
    }

    fn ms(m: u64) -> Nanos {
        Nanos::from_millis(m)
    }

    /// Capacity 4, one token per second: the thesis's Figure 4.1 setting.
    fn figure_4_1() -> TokenQueue {
        TokenQueue::new(4, Rate::per_second(1).unwrap()).unwrap()
    }

    fn deaths(s: &QueueState) -> Vec<Nanos> {
        s.elements().map(|e| e.death).collect()
    }

    fn births(s: &QueueState) -> Vec<Nanos> {
        s.elements().map(|e| e.id.birth).collect()
    }

    #[test]
    fn parameters_are_validated() {
        let r = Rate::per_second(1).unwrap();
        assert_eq!(
            TokenQueue::new(0, r),
            Err(ParamError::MustBePositive { param: "capacity" })
        );
        assert!(TokenQueue::new(MAX_ELEMENTS - 1, r).is_ok());
        assert!(TokenQueue::new(MAX_ELEMENTS, r).is_err());
        // A minute of margin at one per second keeps 60 dead elements.
        assert!(TokenQueue::with_margin(MAX_ELEMENTS - 61, r, secs(60)).is_ok());
        assert!(TokenQueue::with_margin(MAX_ELEMENTS - 60, r, secs(60)).is_err());
        assert!(TokenQueue::with_margin(4, r, Nanos::MAX).is_err());
        let slow = Rate::new(1, Nanos::from_secs(100 * 365 * 86_400)).unwrap();
        assert!(TokenQueue::new(2, slow).is_err());
    }

    #[test]
    fn lifetime_is_equation_4_1() {
        // "the same parameters ... yield a lifetime of 4/1 = 4 seconds".
        assert_eq!(figure_4_1().lifetime(), secs(4));
    }

    #[test]
    fn hand_computed_capacity_4_at_1_per_second() {
        let q = figure_4_1();
        let mut s = QueueState::default();
        let d = q.decide(&mut s, A, Nanos::ZERO, Hits::exactly(4));
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_after, secs(4));
        assert_eq!(deaths(&s), [secs(1), secs(2), secs(3), secs(4)]);
        assert_eq!(
            s.elements().map(|e| e.id.seq).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        // Half a second later nothing has died.
        let d = q.decide(&mut s, A, ms(500), Hits::exactly(1));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(ms(500)));
        // At 1 s the first element dies (death <= now) and its token is back;
        // the new element dies one interval after the tail (Equation 4.2).
        let d = q.decide(&mut s, A, secs(1), Hits::exactly(1));
        assert!(d.allowed);
        assert_eq!(deaths(&s), [secs(2), secs(3), secs(4), secs(5)]);
        // At 2.5 s one more died: room for one of four.
        let d = q.decide(&mut s, A, ms(2500), Hits::between(1, 4));
        assert_eq!(d.granted, 1);
        assert_eq!(deaths(&s), [secs(3), secs(4), secs(5), secs(6)]);
        assert_eq!(d.retry_after, Some(ms(500)));
        // Two tokens are back at 4 s.
        let d = q.decide(&mut s, A, ms(2500), Hits::exactly(2));
        assert_eq!(d.retry_after, Some(ms(1500)));
        // Once everything is dead the queue is empty again and Equation
        // 4.2's first case applies: death = now + 1/refillRate.
        assert!(q.is_idle(&s, secs(6)));
        let d = q.decide(&mut s, A, secs(10), Hits::exactly(2));
        assert!(d.allowed);
        assert_eq!(deaths(&s), [secs(11), secs(12)]);
        assert_eq!(d.remaining, 2);
        assert_eq!(d.reset_after, secs(2));
    }

    #[test]
    fn refills_at_a_constant_rate_unlike_a_sliding_log() {
        // §4.1.1–4.1.2: with the same capacity and Equation 4.1's lifetime
        // (4 s), a sliding log keeps each element for 4 s, while the
        // token-bucket queue frees one slot per second after a burst.
        let q = figure_4_1();
        let log = crate::SlidingLog::new(4, q.lifetime()).unwrap();
        let mut s = QueueState::default();
        let mut l = Algorithm::fresh(&log);
        let mut queue_grants = vec![];
        let mut log_grants = vec![];
        for t in [0, 0, 0, 0, 1, 2, 3] {
            let now = secs(t);
            queue_grants.push(q.decide(&mut s, A, now, Hits::exactly(1)).granted);
            log_grants.push(log.decide(&mut l, now, Hits::exactly(1)).granted);
        }
        assert_eq!(queue_grants, [1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(log_grants, [1, 1, 1, 1, 0, 0, 0]);
    }

    #[test]
    fn thesis_merge_example() {
        // §4.1.2, refill rate 1/20:
        //   merge([{1,21},{3,41},{5,61}], [{2,22},{4,42}])
        //     -> [{1,21},{2,41},{3,61},{4,81},{5,101}]
        // Both inputs are what one node builds by Equation 4.2.
        let q = TokenQueue::new(5, Rate::new(1, secs(20)).unwrap()).unwrap();
        let mut a = QueueState::default();
        for t in [1, 3, 5] {
            assert!(q.decide(&mut a, A, secs(t), Hits::exactly(1)).allowed);
        }
        let mut b = QueueState::default();
        for t in [2, 4] {
            assert!(q.decide(&mut b, B, secs(t), Hits::exactly(1)).allowed);
        }
        assert_eq!(deaths(&a), [secs(21), secs(41), secs(61)]);
        assert_eq!(deaths(&b), [secs(22), secs(42)]);

        let mut ab = a.clone();
        ab.merge(&b);
        let mut ba = b.clone();
        ba.merge(&a);
        assert_eq!(ab, ba);
        assert_eq!(births(&ab), [secs(1), secs(2), secs(3), secs(4), secs(5)]);
        assert_eq!(
            deaths(&ab),
            [secs(21), secs(41), secs(61), secs(81), secs(101)]
        );
        // Every element after the first one inserted from the other queue
        // changed, and is what the thesis adds to the neighbours' deltas.
        let changes = a.clone().merge_changes(&b);
        assert_eq!(births(&changes), [secs(2), secs(3), secs(4), secs(5)]);
        assert_eq!(deaths(&changes), [secs(41), secs(61), secs(81), secs(101)]);
        // Five live elements at 5 s against a capacity of five: full.
        assert_eq!(q.live(&ab, secs(5)), 5);
        assert_eq!(q.room(&ab, A, secs(5), 1), 0);
    }

    #[test]
    fn same_instant_grants_on_two_nodes_are_two_elements() {
        // §4.2.2, second scenario: the thesis would keep one of the two.
        let q = figure_4_1();
        let mut a = QueueState::default();
        let mut b = QueueState::default();
        assert!(q.decide(&mut a, A, secs(7), Hits::exactly(1)).allowed);
        assert!(q.decide(&mut b, B, secs(7), Hits::exactly(1)).allowed);
        assert_eq!(deaths(&a), deaths(&b));
        a.merge(&b);
        assert_eq!(a.len(), 2);
        assert_eq!(deaths(&a), [secs(8), secs(9)]);
        assert_eq!(q.live(&a, secs(7)), 2);
    }

    #[test]
    fn an_element_that_comes_back_is_counted_once() {
        // §4.2.2, first scenario (Figure 4.4): A -> B -> C -> A.
        let q = figure_4_1();
        let mut a = QueueState::default();
        q.decide(&mut a, A, secs(1), Hits::exactly(1));
        let mut b = QueueState::default();
        b.merge(&a);
        let mut c = QueueState::default();
        c.merge(&b);
        let before = a.clone();
        a.merge(&c);
        assert_eq!(a, before);
        assert!(a.clone().merge_changes(&c).is_empty());
    }

    #[test]
    fn a_death_is_never_lowered_by_a_merge() {
        // §4.2.2, Figure 4.5: node A's element at 00:00 pushed back the
        // element at 00:01 and was then removed; node B later sends the
        // same 00:01 element with the death it had before it heard of the
        // 00:00 one. The later death, which remembers 00:00, is kept.
        let q = figure_4_1();
        let mut a = QueueState::default();
        let mut b = QueueState::default();
        q.decide(&mut a, A, secs(0), Hits::exactly(1)); // dies at 1
        q.decide(&mut b, B, ms(500), Hits::exactly(1)); // dies at 1.5
        let mut c = a.clone();
        c.merge(&b); // B's element now dies at 2
        assert_eq!(deaths(&c), [secs(1), secs(2)]);
        q.prune(&mut c, ms(1200)); // A's element is gone
        assert_eq!(deaths(&c), [secs(2)]);
        c.merge(&b);
        assert_eq!(deaths(&c), [secs(2)]);
        assert_eq!(q.live(&c, ms(1700)), 1);
        // And a re-added dead element still pushes its successors back
        // (§4.1.2: removed elements "might need to be readded").
        let mut d = b.clone();
        d.merge(&a);
        assert_eq!(deaths(&d), [secs(1), secs(2)]);
    }

    #[test]
    fn the_margin_keeps_dead_elements_without_counting_them() {
        let q = TokenQueue::with_margin(2, Rate::per_second(1).unwrap(), secs(3)).unwrap();
        let mut s = QueueState::default();
        q.decide(&mut s, A, Nanos::ZERO, Hits::exactly(2)); // dies at 1, 2
        let d = q.decide(&mut s, A, secs(2), Hits::exactly(2));
        assert!(d.allowed);
        // Both old elements are dead and still held; new ones die at 3, 4.
        assert_eq!(deaths(&s), [secs(1), secs(2), secs(3), secs(4)]);
        q.prune(&mut s, secs(4));
        assert_eq!(deaths(&s), [secs(2), secs(3), secs(4)]);
        assert!(!q.is_idle(&s, secs(6)));
        assert!(q.is_idle(&s, secs(7)));
        q.prune(&mut s, secs(7));
        assert_eq!(s, QueueState::default());
    }

    #[test]
    fn a_late_element_still_pushes_back_within_the_margin() {
        // §5.4: without a margin, A's element is gone from A before it
        // reaches B, and B's grants never pay for it.
        let rate = Rate::per_second(1).unwrap();
        for (margin, expected) in [(Nanos::ZERO, ms(1100)), (secs(1), secs(2))] {
            let q = TokenQueue::with_margin(1, rate, margin).unwrap();
            let mut a = QueueState::default();
            q.decide(&mut a, A, secs(0), Hits::exactly(1)); // dies at 1
            let mut b = QueueState::default();
            q.decide(&mut b, B, ms(100), Hits::exactly(1)); // dies at 1.1
            q.prune(&mut a, ms(1500));
            b.merge(&a);
            assert_eq!(deaths(&b).last().copied(), Some(expected));
        }
    }

    #[test]
    fn births_are_clamped_to_the_tail() {
        let q = figure_4_1();
        let mut s = QueueState::default();
        q.decide(&mut s, B, secs(5), Hits::exactly(1));
        // A is behind B in node order, and its clock is behind too.
        q.decide(&mut s, A, secs(4), Hits::exactly(2));
        let ids: Vec<ElementId> = s.elements().map(|e| e.id).collect();
        assert_eq!(
            ids,
            [
                ElementId {
                    birth: secs(5),
                    node: B,
                    seq: 0
                },
                ElementId {
                    birth: secs(5).saturating_add(Nanos::NANOSECOND),
                    node: A,
                    seq: 0
                },
                ElementId {
                    birth: secs(5).saturating_add(Nanos::NANOSECOND),
                    node: A,
                    seq: 1
                },
            ]
        );
        assert_eq!(deaths(&s), [secs(6), secs(7), secs(8)]);
        // C sorts after B at the same birth: no nanosecond is added.
        q.decide(&mut s, C, secs(3), Hits::exactly(1));
        assert_eq!(
            s.tail_id(),
            Some(ElementId {
                birth: secs(5).saturating_add(Nanos::NANOSECOND),
                node: C,
                seq: 0
            })
        );
    }

    #[test]
    fn the_end_of_time_rejects_instead_of_reusing_an_identity() {
        let q = figure_4_1();
        let tail = Element {
            id: ElementId {
                birth: Nanos::MAX,
                node: B,
                seq: 0,
            },
            death: Nanos::MAX,
        };
        let mut s = QueueState::from_elements(q.interval(), [tail]);
        let now = Nanos::MAX.saturating_sub(secs(1));
        assert_eq!(q.room(&s, A, now, 1), 0);
        let d = q.decide(&mut s, A, now, Hits::exactly(1));
        assert!(!d.allowed);
        // C sorts after B, so it can still take identities at the end.
        assert_eq!(q.room(&s, C, now, 3), 3);
        let d = q.decide(&mut s, C, now, Hits::exactly(1));
        assert!(d.allowed);
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn an_oversized_grant_is_cut_to_the_room() {
        let q = figure_4_1();
        let mut s = QueueState::default();
        let d = q.commit(
            &mut s,
            A,
            Nanos::ZERO,
            Hits::exactly(u64::MAX),
            Grant {
                granted: u64::MAX,
                allowed: true,
            },
        );
        assert_eq!(d.granted, 4);
        assert!(!d.allowed);
        assert_eq!(s.len(), 4);
    }

    #[test]
    fn a_slower_configured_rate_recloses_the_queue() {
        let fast = TokenQueue::new(4, Rate::per_second(2).unwrap()).unwrap();
        let slow = TokenQueue::new(4, Rate::per_second(1).unwrap()).unwrap();
        let mut s = QueueState::default();
        fast.decide(&mut s, A, Nanos::ZERO, Hits::exactly(2));
        assert_eq!(deaths(&s), [ms(500), secs(1)]);
        // Under the slower rate the second element dies at 1.5 s, not 1 s.
        assert_eq!(slow.live(&s, ms(900)), 1);
        assert_eq!(slow.live(&s, ms(1200)), 1);
        slow.decide(&mut s, A, ms(900), Hits::exactly(1));
        assert_eq!(s.interval(), secs(1));
        // Re-closed to [0.5 s, 1.5 s], the first pruned, then Equation 4.2.
        assert_eq!(deaths(&s), [ms(1500), ms(2500)]);
        // A faster rate does not speed an existing queue up.
        fast.decide(&mut s, A, ms(900), Hits::exactly(1));
        assert_eq!(deaths(&s).last().copied(), Some(ms(3500)));
    }

    #[test]
    fn from_elements_sorts_dedups_and_closes() {
        let id = |b: u64, n: NodeId| ElementId {
            birth: secs(b),
            node: n,
            seq: 0,
        };
        let s = QueueState::from_elements(
            secs(1),
            [
                Element {
                    id: id(3, A),
                    death: secs(4),
                },
                Element {
                    id: id(1, A),
                    death: secs(2),
                },
                Element {
                    id: id(1, A),
                    death: secs(5),
                },
                Element {
                    id: id(2, B),
                    death: secs(3),
                },
            ],
        );
        assert_eq!(births(&s), [secs(1), secs(2), secs(3)]);
        assert_eq!(deaths(&s), [secs(5), secs(6), secs(7)]);
        assert_eq!(
            QueueState::from_elements(secs(1), []),
            QueueState::default()
        );
    }

    #[test]
    fn local_grants_are_the_elements_after_the_old_tail() {
        let q = figure_4_1();
        let mut s = QueueState::default();
        q.decide(&mut s, A, Nanos::ZERO, Hits::exactly(1));
        let version = s.tail_id();
        let before = s.clone();
        q.decide(&mut s, A, ms(10), Hits::exactly(2));
        let delta = s.elements_after(version);
        assert_eq!(delta.len(), 2);
        assert_eq!(delta, s.changes_since(&before));
        assert_eq!(s.elements_after(None), s);
    }
}
