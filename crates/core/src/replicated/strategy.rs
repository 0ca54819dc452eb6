//! One type for "a replicated limit as a node of the cluster runs it":
//! [`ReplicatedLimit`], with its per-key [`ReplicatedState`] and the
//! [`Payload`] that gossip carries for one key.
//!
//! The three strategies (counter, queue, epoch) differ in what they gossip
//! and how a node takes it in; the replicated store works with this enum so
//! that it handles keys of every strategy side by side, as the memory store
//! handles [`crate::Limit`]s. Which strategy a resource uses, and how often
//! and how eagerly it gossips, is [`Replication`], read from the config.

use crate::algorithm::Algorithm;
use crate::decision::{Decision, Grant, Hits};
use crate::rate::Rate;
use crate::replicated::counter::{CounterBucket, CounterBucketState};
use crate::replicated::epoch::{EpochBucket, EpochBucketState, EpochReport};
use crate::replicated::queue::{ElementId, QueueState, TokenQueue};
use crate::replicated::{Generation, NodeId, Replicated};
use crate::time::Nanos;
use crate::ParamError;

/// Which replicated state a resource uses (`replication:` in the config).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum StrategyKind {
    /// The G-counter token bucket (thesis §3.1).
    Counter,
    /// The token-bucket queue (thesis §4.1.2, §4.2).
    #[default]
    Queue,
    /// The gossiping interval limiter's epoch bucket (seed 001).
    Epoch,
}

impl StrategyKind {
    /// The name the config uses.
    pub fn as_str(self) -> &'static str {
        match self {
            StrategyKind::Counter => "counter",
            StrategyKind::Queue => "queue",
            StrategyKind::Epoch => "epoch",
        }
    }

    /// Parses a config name.
    pub fn parse(name: &str) -> Option<StrategyKind> {
        match name {
            "counter" => Some(StrategyKind::Counter),
            "queue" => Some(StrategyKind::Queue),
            "epoch" => Some(StrategyKind::Epoch),
            _ => None,
        }
    }
}

/// Frequency analysis with eager propagation (thesis §4.2.3): when a
/// node's pending delta for a key holds `window` elements granted at an
/// average gap of at most `threshold`, it is sent to that neighbour at once
/// instead of waiting for the next gossip round.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Eager {
    /// Elements looked at; `None` is the thesis's default, the node's
    /// share of the capacity (`capacity / nodes`, at least 1).
    pub window: Option<u64>,
    /// The average gap between grants below which a key is "frequent".
    pub threshold: Nanos,
}

impl Eager {
    /// The thesis's frequency threshold (Table 4.1).
    pub const DEFAULT_THRESHOLD: Nanos = Nanos::from_millis(2400);
}

/// How a resource is replicated: the strategy and its gossip parameters,
/// as the config gives them (defaults from the thesis, Table 4.1).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Replication {
    /// Which state.
    pub strategy: StrategyKind,
    /// How often a node sends a synchronization message to one neighbour.
    pub gossip_interval: Nanos,
    /// Frequency analysis with eager propagation (queue only), or off.
    pub eager: Option<Eager>,
    /// Least-informed-neighbour-first gossip (queue only, §4.2.4).
    pub least_informed: bool,
    /// Near-limit propagation (queue only; tollgate's extension of
    /// §4.2.3, after the thesis's §5.4–5.5): when a local grant leaves the
    /// bucket with at most one node's share of the capacity (the eager
    /// window, `capacity / nodes` by default), the key's pending updates
    /// go to every neighbour at once. Near the limit is where a late
    /// update lets a request through; far from it, nothing is rushed.
    pub near_limit: bool,
    /// The epoch length (epoch only).
    pub epoch: Nanos,
    /// How long a queue keeps a dead element (§5.4's margin); `None`:
    /// long enough for gossip to reach every node (ten gossip intervals,
    /// at least two seconds).
    pub retention: Option<Nanos>,
}

impl Replication {
    /// The thesis's gossip interval (Table 4.1).
    pub const DEFAULT_GOSSIP_INTERVAL: Nanos = Nanos::from_millis(300);

    /// The defaults for `strategy`: gossip every 300 ms; a queue analyses
    /// frequencies (window `capacity / nodes`, threshold 2,400 ms) and
    /// gossips to a random neighbour; epochs of one second.
    pub fn new(strategy: StrategyKind) -> Replication {
        Replication {
            strategy,
            gossip_interval: Replication::DEFAULT_GOSSIP_INTERVAL,
            eager: (strategy == StrategyKind::Queue).then_some(Eager {
                window: None,
                threshold: Eager::DEFAULT_THRESHOLD,
            }),
            least_informed: false,
            near_limit: strategy == StrategyKind::Queue,
            epoch: EpochBucket::DEFAULT_EPOCH,
            retention: None,
        }
    }

    /// A stable text naming every parameter, for limit ids: nodes of one
    /// cluster must agree on it, across versions too (not `Debug`).
    pub fn fingerprint(&self) -> String {
        let eager = match self.eager {
            None => "off".to_owned(),
            Some(e) => format!(
                "window={},threshold={}",
                e.window
                    .map_or_else(|| "auto".to_owned(), |w| w.to_string()),
                e.threshold.as_u64()
            ),
        };
        format!(
            "strategy={};gossip={};eager={eager};least_informed={};near_limit={};epoch={};retention={}",
            self.strategy.as_str(),
            self.gossip_interval.as_u64(),
            self.least_informed,
            self.near_limit,
            self.epoch.as_u64(),
            self.retention_margin().as_u64(),
        )
    }

    /// The retention margin a queue uses (see [`Replication::retention`]).
    pub fn retention_margin(&self) -> Nanos {
        self.retention.unwrap_or_else(|| {
            self.gossip_interval
                .saturating_mul(10)
                .max(Nanos::from_secs(2))
        })
    }

    /// Builds the replicated limit of a token bucket of `capacity` refilled
    /// at `rate`, deciding on behalf of `node`.
    pub fn build(
        &self,
        capacity: u64,
        rate: Rate,
        node: NodeId,
    ) -> Result<ReplicatedLimit, ParamError> {
        ParamError::span("gossip_interval", self.gossip_interval)?;
        let strategy = match self.strategy {
            StrategyKind::Counter => Strategy::Counter(CounterBucket::new(capacity, rate)?),
            StrategyKind::Queue => Strategy::Queue(TokenQueue::with_margin(
                capacity,
                rate,
                self.retention_margin(),
            )?),
            StrategyKind::Epoch => {
                Strategy::Epoch(EpochBucket::with_epoch(capacity, rate, self.epoch)?)
            }
        };
        Ok(ReplicatedLimit {
            strategy,
            node,
            replication: *self,
        })
    }
}

/// A replicated state's parameters, of any strategy.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// [`CounterBucket`].
    Counter(CounterBucket),
    /// [`TokenQueue`].
    Queue(TokenQueue),
    /// [`EpochBucket`].
    Epoch(EpochBucket),
}

/// A replicated limit as one node runs it: the strategy's parameters, the
/// node deciding, and how it gossips.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReplicatedLimit {
    /// The state's parameters.
    pub strategy: Strategy,
    /// The node deciding: its share of the state records its grants.
    pub node: NodeId,
    /// How the state is gossiped.
    pub replication: Replication,
}

/// The state of one key of a replicated limit, of any strategy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicatedState {
    /// A counter bucket.
    Counter(CounterBucketState),
    /// A token-bucket queue.
    Queue(QueueState),
    /// An epoch bucket.
    Epoch(EpochBucketState),
}

/// What gossip carries for one key: a join-semilattice value that a
/// neighbour merges into its state. Per-neighbour deltas are maps of
/// payloads, merged as they accumulate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// A counter bucket's state (small: one entry per node that granted).
    Counter(CounterBucketState),
    /// Queue elements: new ones, or ones whose death rose.
    Queue(QueueState),
    /// The report of the last committed epoch.
    Epoch(EpochReport),
}

/// Where a key's state stood before a local decision, to tell afterwards
/// what the decision added ([`ReplicatedLimit::mark`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Mark {
    /// A queue's newest element.
    tail: Option<ElementId>,
    /// A counter's tokens consumed by the deciding node.
    consumed: u64,
    /// A counter's limit, which a refund raises.
    limit: u64,
}

impl Payload {
    /// The strategy this payload belongs to.
    pub fn kind(&self) -> StrategyKind {
        match self {
            Payload::Counter(_) => StrategyKind::Counter,
            Payload::Queue(_) => StrategyKind::Queue,
            Payload::Epoch(_) => StrategyKind::Epoch,
        }
    }

    /// Joins `other` into this payload (both must be of one strategy;
    /// another strategy's payload is ignored). Returns whether it changed.
    pub fn merge(&mut self, other: &Payload) -> bool {
        match (self, other) {
            (Payload::Counter(a), Payload::Counter(b)) => a.merge(b),
            (Payload::Queue(a), Payload::Queue(b)) => a.merge(b),
            (Payload::Epoch(a), Payload::Epoch(b)) => a.merge(b),
            _ => false,
        }
    }

    /// Updates it carries: queue elements, counter entries, report
    /// entries. Least-informed-neighbour-first gossip ranks neighbours by
    /// the updates queued for them (§4.2.4).
    pub fn updates(&self) -> usize {
        match self {
            Payload::Counter(s) => s.token_counter().len().max(1),
            Payload::Queue(q) => q.len(),
            Payload::Epoch(r) => r.traffic().len(),
        }
    }

    /// Bytes it occupies, inline and on the heap.
    pub fn footprint(&self) -> usize {
        match self {
            Payload::Counter(s) => s.footprint(),
            Payload::Queue(q) => q.footprint(),
            Payload::Epoch(r) => {
                std::mem::size_of::<EpochReport>() + std::mem::size_of_val(r.traffic())
            }
        }
    }

    /// Whether it carries nothing a neighbour could learn from: no
    /// grants, and no reset generation either.
    pub fn is_empty(&self) -> bool {
        match self {
            Payload::Counter(s) => s.is_empty(),
            Payload::Queue(q) => q.is_empty() && q.generation().is_zero(),
            Payload::Epoch(r) => r.traffic().is_empty() && r.generation().is_zero(),
        }
    }

    /// The reset generation it belongs to.
    pub fn generation(&self) -> Generation {
        match self {
            Payload::Counter(s) => s.generation(),
            Payload::Queue(q) => q.generation(),
            Payload::Epoch(r) => r.generation(),
        }
    }

    /// Whether the last `window` queue elements were granted at an average
    /// gap of at most `threshold` (Listing 4.5, comparing the average gap,
    /// which is what "frequency above the threshold" means). Only queues
    /// are analysed.
    pub fn is_frequent(&self, window: u64, threshold: Nanos) -> bool {
        let Payload::Queue(q) = self else {
            return false;
        };
        let window = usize::try_from(window.max(1)).unwrap_or(usize::MAX);
        if q.len() < window {
            return false;
        }
        if window == 1 {
            // One element has no gap: every grant is "frequent".
            return true;
        }
        let mut recent = q.elements().rev();
        let (Some(latest), Some(earliest)) = (recent.next(), recent.nth(window - 2)) else {
            return false;
        };
        let span = latest.id.birth.saturating_sub(earliest.id.birth);
        span.as_u64() / (window as u64) <= threshold.as_u64()
    }
}

impl ReplicatedLimit {
    /// The strategy's kind.
    pub fn kind(&self) -> StrategyKind {
        self.replication.strategy
    }

    /// The token capacity.
    pub fn capacity(&self) -> u64 {
        match &self.strategy {
            Strategy::Counter(c) => c.capacity(),
            Strategy::Queue(q) => q.capacity(),
            Strategy::Epoch(e) => e.capacity(),
        }
    }

    /// Whether the strategy takes usage reported after the fact (reports
    /// and refunds, `docs/algorithms/usage.md`): only the counter bucket,
    /// whose debt is a node's counter entry repaid by refill and whose
    /// refund raises a limit that only grows. A queue (whose merge never
    /// removes an element nor brings a death forward) and an epoch bucket
    /// (whose peers' traffic is a maximum already subtracted) could take a
    /// report but have no sound refund, so they take neither.
    pub fn takes_usage(&self) -> bool {
        matches!(self.strategy, Strategy::Counter(_))
    }

    /// The most tokens a report may leave owing (`None`: no usage taken).
    pub fn max_debt(&self) -> Option<u64> {
        match &self.strategy {
            Strategy::Counter(c) => Some(c.max_debt()),
            _ => None,
        }
    }

    /// The same limit with reports bounded at `max_debt` tokens below
    /// empty; a strategy that takes no usage is returned unchanged.
    pub fn with_max_debt(mut self, max_debt: u64) -> Result<ReplicatedLimit, ParamError> {
        if let Strategy::Counter(c) = self.strategy {
            self.strategy = Strategy::Counter(c.with_max_debt(max_debt)?);
        }
        Ok(self)
    }

    /// A report (`refund: false`) or refund of `hits` at `now` on this
    /// node; `None` for a strategy that takes no usage.
    pub fn usage(
        &self,
        state: &mut ReplicatedState,
        now: Nanos,
        hits: u64,
        refund: bool,
    ) -> Option<Decision> {
        if !self.takes_usage() {
            return None;
        }
        if !self.owns(state) {
            *state = self.fresh();
        }
        match (&self.strategy, state) {
            (Strategy::Counter(c), ReplicatedState::Counter(s)) => Some(if refund {
                c.refund(s, now, hits)
            } else {
                c.report(s, self.node, now, hits)
            }),
            _ => None,
        }
    }

    /// Tokens the bucket holds for a grant at `now`.
    pub fn available(&self, state: &ReplicatedState, now: Nanos) -> u64 {
        self.room(state, now, self.capacity())
    }

    /// Whether `state` belongs to this strategy.
    pub fn owns(&self, state: &ReplicatedState) -> bool {
        matches!(
            (&self.strategy, state),
            (Strategy::Counter(_), ReplicatedState::Counter(_))
                | (Strategy::Queue(_), ReplicatedState::Queue(_))
                | (Strategy::Epoch(_), ReplicatedState::Epoch(_))
        )
    }

    /// Where `state` stands, before a local decision.
    pub fn mark(&self, state: &ReplicatedState) -> Mark {
        match state {
            ReplicatedState::Queue(q) => Mark {
                tail: q.tail_id(),
                ..Mark::default()
            },
            ReplicatedState::Counter(s) => Mark {
                tail: None,
                consumed: s.consumed_by(self.node),
                limit: s.limit(),
            },
            ReplicatedState::Epoch(_) => Mark::default(),
        }
    }

    /// What a local decision since `mark` changed, to add to every
    /// neighbour's delta: a counter's whole (small) state once this node
    /// consumed more (a grant or a report) or its limit rose without a
    /// grant (a refund), a queue's new elements. `None` when nothing was
    /// granted (a rejection or a peek gossips nothing), and for an epoch
    /// bucket, whose grants are gossiped as reports when the epoch closes
    /// ([`ReplicatedLimit::report`]).
    pub fn local_changes(&self, state: &ReplicatedState, mark: Mark) -> Option<Payload> {
        match state {
            ReplicatedState::Counter(s)
                if s.consumed_by(self.node) > mark.consumed || s.limit() > mark.limit =>
            {
                Some(Payload::Counter(s.clone()))
            }
            ReplicatedState::Queue(q) => {
                let new = q.elements_after(mark.tail);
                (!new.is_empty()).then_some(Payload::Queue(new))
            }
            _ => None,
        }
    }

    /// The whole state as a payload: what a joining node receives.
    /// `None` when there is nothing to send. A key reset and not granted
    /// since sends its generation (an epoch bucket, its empty report).
    pub fn full(&self, state: &mut ReplicatedState, now: Nanos) -> Option<Payload> {
        let payload = match state {
            ReplicatedState::Counter(s) => Payload::Counter(s.clone()),
            ReplicatedState::Queue(q) => Payload::Queue(q.clone()),
            ReplicatedState::Epoch(_) => {
                return self.report(state, now).or_else(|| match state {
                    ReplicatedState::Epoch(s) if !s.generation().is_zero() => {
                        Some(Payload::Epoch(s.report().clone()))
                    }
                    _ => None,
                })
            }
        };
        (!payload.is_empty()).then_some(payload)
    }

    /// Resets the key on this node at `now` (`DELETE /v1/counters`): its
    /// state becomes a fresh one of a new reset generation, later than the
    /// one it had (and unlike any other node's), and the answer is the
    /// payload that carries the reset to every peer. Every state of an
    /// older generation, wherever and whenever it arrives, merges into it
    /// as nothing; grants made after it count.
    ///
    /// `None`, with the state unchanged, when no later generation exists
    /// ([`Generation::next`]): a reset that every peer would ignore is
    /// not made.
    pub fn reset(&self, state: &mut ReplicatedState, now: Nanos) -> Option<Payload> {
        let old = if self.owns(state) {
            state.generation()
        } else {
            Generation::ZERO
        };
        let generation = old.next(self.node, now)?;
        Some(match &self.strategy {
            Strategy::Counter(_) => {
                let fresh = CounterBucketState::reset(generation);
                *state = ReplicatedState::Counter(fresh.clone());
                Payload::Counter(fresh)
            }
            Strategy::Queue(_) => {
                let fresh = QueueState::reset(generation);
                *state = ReplicatedState::Queue(fresh.clone());
                Payload::Queue(fresh)
            }
            Strategy::Epoch(e) => {
                let mut fresh = EpochBucketState::reset(generation);
                let report = e.report(&mut fresh, self.node, now);
                *state = ReplicatedState::Epoch(fresh);
                Payload::Epoch(report)
            }
        })
    }

    /// An epoch bucket's report of its last committed epoch, once it holds
    /// any traffic (seed 001's push-pull payload); `None` for the other
    /// strategies and for an empty report.
    pub fn report(&self, state: &mut ReplicatedState, now: Nanos) -> Option<Payload> {
        match (&self.strategy, state) {
            (Strategy::Epoch(e), ReplicatedState::Epoch(s)) => {
                let report = e.report(s, self.node, now);
                (!report.traffic().is_empty()).then_some(Payload::Epoch(report))
            }
            _ => None,
        }
    }

    /// Takes in a payload a neighbour sent: merges it into `state` (a state
    /// of another strategy is first replaced by a fresh one) and returns
    /// what changed, for the other neighbours' deltas (§4.2.1, Listing
    /// 3.3: "merged and forwarded ... never echoed"). A payload of another
    /// strategy changes nothing. Queues are pruned afterwards.
    pub fn absorb(
        &self,
        state: &mut ReplicatedState,
        now: Nanos,
        payload: &Payload,
    ) -> Option<Payload> {
        if payload.kind() != self.kind() {
            return None;
        }
        if !self.owns(state) {
            *state = self.fresh();
        }
        match (&self.strategy, state, payload) {
            (Strategy::Counter(_), ReplicatedState::Counter(s), Payload::Counter(p)) => {
                s.merge(p).then(|| Payload::Counter(s.clone()))
            }
            (Strategy::Queue(q), ReplicatedState::Queue(s), Payload::Queue(p)) => {
                let before = s.generation();
                let mut changes = s.merge_changes(p);
                q.prune(s, now);
                // An element past its retention margin is pruned here at
                // once; passing it on would make every node that already
                // pruned it take it back, forward it and prune it again,
                // for as long as late deltas keep it going round.
                q.prune(&mut changes, now);
                // A later reset is news even with no element (a reset
                // queue has none): its generation is what peers learn.
                let reset = s.generation() > before;
                (!changes.is_empty() || reset).then_some(Payload::Queue(changes))
            }
            (Strategy::Epoch(e), ReplicatedState::Epoch(s), Payload::Epoch(p)) => e
                .receive(s, self.node, now, p)
                .then(|| Payload::Epoch(s.report().clone())),
            _ => None,
        }
    }

    /// Whether a neighbour that sent `payload` lacks something of `state`
    /// that it should pull back (seed 001's push-pull: an epoch report
    /// that misses entries this node holds). Epoch buckets answer so; and
    /// on every strategy, a neighbour still gossiping from before a reset
    /// this node knows of gets the reset back (it lost the reset's push,
    /// and its payloads of the older generation merge here as nothing).
    pub fn should_answer(&self, state: &ReplicatedState, payload: &Payload) -> bool {
        if payload.kind() == self.kind()
            && self.owns(state)
            && state.generation() > payload.generation()
        {
            return true;
        }
        match (state, payload) {
            (ReplicatedState::Epoch(s), Payload::Epoch(p)) => {
                (s.generation(), s.report().epoch()) >= (p.generation(), p.epoch())
                    && !p.includes(s.report())
            }
            _ => false,
        }
    }

    /// Elements a key's state holds (queue) or entries (counter, epoch),
    /// for the state-size metric.
    pub fn size(state: &ReplicatedState) -> usize {
        match state {
            ReplicatedState::Counter(s) => s.token_counter().len(),
            ReplicatedState::Queue(q) => q.len(),
            ReplicatedState::Epoch(s) => s.report().traffic().len(),
        }
    }
}

impl ReplicatedState {
    /// The key's reset generation ([`Generation::ZERO`] if never reset).
    pub fn generation(&self) -> Generation {
        match self {
            ReplicatedState::Counter(s) => s.generation(),
            ReplicatedState::Queue(q) => q.generation(),
            ReplicatedState::Epoch(s) => s.generation(),
        }
    }

    /// Bytes this state occupies, for memory measurements.
    pub fn footprint(&self) -> usize {
        match self {
            ReplicatedState::Counter(s) => s.footprint(),
            ReplicatedState::Queue(q) => q.footprint(),
            ReplicatedState::Epoch(_) => std::mem::size_of::<EpochBucketState>(),
        }
    }
}

/// Runs `$body` with the strategy's parameters and its matching state, or
/// `$other` for a state of another strategy.
macro_rules! with_strategy {
    ($limit:expr, $state:expr, |$alg:ident, $st:ident| $body:expr, $other:expr) => {
        match (&$limit.strategy, $state) {
            (Strategy::Counter($alg), ReplicatedState::Counter($st)) => $body,
            (Strategy::Queue($alg), ReplicatedState::Queue($st)) => $body,
            (Strategy::Epoch($alg), ReplicatedState::Epoch($st)) => $body,
            _ => $other,
        }
    };
}

impl Algorithm for ReplicatedLimit {
    type State = ReplicatedState;

    fn fresh(&self) -> ReplicatedState {
        match self.strategy {
            Strategy::Counter(_) => ReplicatedState::Counter(CounterBucketState::default()),
            Strategy::Queue(_) => ReplicatedState::Queue(QueueState::default()),
            Strategy::Epoch(_) => ReplicatedState::Epoch(EpochBucketState::default()),
        }
    }

    fn room(&self, state: &ReplicatedState, now: Nanos, hits: u64) -> u64 {
        with_strategy!(self, state, |a, s| a.room_on(s, self.node, now, hits), {
            self.room(&self.fresh(), now, hits)
        })
    }

    fn commit(
        &self,
        state: &mut ReplicatedState,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        if !self.owns(state) {
            *state = self.fresh();
        }
        with_strategy!(
            self,
            state,
            |a, s| a.commit_on(s, self.node, now, request, grant),
            Decision::unlimited(0)
        )
    }

    fn is_idle(&self, state: &ReplicatedState, now: Nanos) -> bool {
        with_strategy!(self, state, |a, s| a.idle(s, now), true)
    }
}
