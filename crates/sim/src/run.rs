//! One simulation: a data set replayed into a simulated cluster that runs
//! tollgate's real replication code, and into a centralized limiter (the
//! ground truth), compared request by request.
//!
//! # How it runs
//!
//! The cluster is [`SimNet`]: `nodes` real [`tollgate_replica::Node`]s
//! (foca membership, gossip rounds, encrypted datagrams) on simulated time
//! and a simulated network (latency drawn per datagram, loss, cuts), every
//! random choice seeded. It first forms (membership settles, every node
//! knows the limit); then each arrival, at its time, goes to one node
//! ([`Assign`]), which decides it locally; the same arrival goes through
//! the core's token bucket, one per user, which sees everything. After the
//! last arrival the simulation runs on until the cluster has converged:
//! no payload waits in any delta and every node holds the same state for
//! every user, as of now (a queue as pruned now; an epoch bucket's report,
//! its level being each node's own) — the thesis: "when all delta states
//! and message input queues are empty".
//!
//! # What it measures
//!
//! - **precision**: the cluster's rejections as a percentage of the
//!   centralized ones (the thesis, §5.1.1: "all points ... summed and then
//!   divided by the same value of the centralized run"); one number can
//!   hide errors that cancel, so also
//! - **over-admissions** (the cluster granted what the ground truth
//!   rejected) and **false rejections** (the reverse), request by request;
//! - **memory** per node ([`tollgate_replica::Replica::memory_bytes`]:
//!   states and pending deltas), peak and mean over time;
//! - **bandwidth**: gossip datagrams and bytes sent (membership and clock
//!   probes counted apart);
//! - **convergence time** after the last arrival;
//! - a time series of all of it, every `sample`.

use std::collections::HashMap;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tollgate_core::replicated::strategy::{Eager, Replication, StrategyKind};
use tollgate_core::replicated::NodeId;
use tollgate_core::{Algorithm, Hits, Limit, Mode, Nanos, PlanError, TokenBucket, Usage};
use tollgate_replica::sim::SimNet;
use tollgate_replica::{Dissemination, ReplicaOptions};
use tollgate_store::{Key, LimitId, Plan, StoreError};

use crate::dataset::DataSet;
use crate::{Arrival, Told};

/// Simulated time of the data set's start (an arbitrary Unix time).
const START: Nanos = Nanos::from_secs(1_700_000_000);

/// The limit's id on every node.
const LIMIT: LimitId = LimitId(0x7011_9a7e);

/// Formation: membership settles and every node knows the limit (a
/// cluster started all at once waits two join timeouts of 3 s).
const FORMATION: Nanos = Nanos::from_secs(10);

/// The longest the simulation waits for convergence after the last
/// arrival.
const MAX_CONVERGENCE: Nanos = Nanos::from_secs(600);

/// How a request is routed to a node.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assign {
    /// The thesis's injector (§4.3.1): a hash of the request's time (ms)
    /// multiplied by the user id, so requests spread over all nodes but
    /// one user's requests of one millisecond go to one node.
    ConsistentHash,
    /// Request `i` to node `i mod N`.
    RoundRobin,
    /// Every request of a user to one node (a hash of the user).
    Sticky,
    /// A node drawn at random (seeded).
    Random,
}

impl Assign {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Assign::ConsistentHash => "consistent-hash",
            Assign::RoundRobin => "round-robin",
            Assign::Sticky => "sticky",
            Assign::Random => "random",
        }
    }

    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<Assign> {
        [
            Assign::ConsistentHash,
            Assign::RoundRobin,
            Assign::Sticky,
            Assign::Random,
        ]
        .into_iter()
        .find(|a| a.as_str() == name)
    }
}

/// A strategy as the simulator names it: the replication and its two
/// queue extensions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SimStrategy {
    /// `counter`, `queue`, `queue+freq`, `queue+linf`, `queue+freq+linf`,
    /// `epoch` (the thesis's), `queue+near` or `queue+freq+near`
    /// (tollgate's near-limit propagation).
    pub name: String,
    #[serde(skip)]
    replication: Replication,
}

impl SimStrategy {
    /// Every strategy name: the thesis's, in the order it presents them,
    /// then tollgate's near-limit propagation on top of the queue.
    pub const ALL: [&'static str; 8] = [
        "counter",
        "queue",
        "queue+freq",
        "queue+linf",
        "queue+freq+linf",
        "epoch",
        "queue+near",
        "queue+freq+near",
    ];

    /// The strategy `name` gossiping every `interval`.
    pub fn parse(name: &str, interval: Nanos) -> Option<SimStrategy> {
        let mut r = match name {
            "counter" => Replication::new(StrategyKind::Counter),
            "epoch" => Replication::new(StrategyKind::Epoch),
            "queue" | "queue+freq" | "queue+linf" | "queue+freq+linf" | "queue+near"
            | "queue+freq+near" => {
                let mut r = Replication::new(StrategyKind::Queue);
                r.eager = name.contains("freq").then_some(Eager {
                    window: None,
                    threshold: Eager::DEFAULT_THRESHOLD,
                });
                r.least_informed = name.contains("linf");
                r.near_limit = name.contains("near");
                r
            }
            _ => return None,
        };
        r.gossip_interval = interval;
        Some(SimStrategy {
            name: name.to_owned(),
            replication: r,
        })
    }

    /// The replication it runs.
    pub fn replication(&self) -> &Replication {
        &self.replication
    }
}

/// How the simulated cluster is set up.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Nodes in the cluster (the thesis: 30, full mesh).
    pub nodes: usize,
    /// How requests are routed.
    pub assign: Assign,
    /// Least one-way latency of a datagram.
    pub latency_min: Nanos,
    /// Largest one-way latency (uniform in between).
    pub latency_max: Nanos,
    /// Probability that a datagram is lost.
    pub loss: f64,
    /// Seed of every random choice.
    pub seed: u64,
    /// Time between two samples of the time series.
    pub sample: Nanos,
    /// How often each node compares digests with a random member (the
    /// server's 30 s by default; zero turns it off, as the thesis's
    /// simulation, which lost nothing, had no such thing).
    pub anti_entropy: Nanos,
    /// Which nodes can talk to which.
    pub topology: Topology,
    /// How updates spread (the server's default: origin push).
    pub dissemination: Dissemination,
    /// Partitions at given times.
    pub partitions: Vec<Partition>,
}

/// Which nodes of the simulated cluster have a link between them.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// Every node with every other (the thesis's).
    #[default]
    FullMesh,
    /// Node `i` with `i − 1` and `i + 1` only (mod N): news travels hop by
    /// hop, and membership reaches farther nodes only indirectly.
    Ring,
}

impl Topology {
    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<Topology> {
        match name {
            "full-mesh" => Some(Topology::FullMesh),
            "ring" => Some(Topology::Ring),
            _ => None,
        }
    }

    fn linked(self, a: usize, b: usize, n: usize) -> bool {
        match self {
            Topology::FullMesh => true,
            Topology::Ring => (a + 1) % n == b || (b + 1) % n == a,
        }
    }
}

/// Nodes cut off from all others for a span of the data set's time; the
/// links heal at its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// When the cut starts, from the data set's start.
    pub from: Nanos,
    /// When it heals.
    pub until: Nanos,
    /// The nodes on one side (the others are the other side).
    pub side: Vec<usize>,
}

impl Partition {
    /// Parses `FROM..UNTIL@NODES`: seconds from the data set's start, and
    /// nodes as a list of numbers and ranges (`0-14`, `0,3,5-7`).
    pub fn parse(text: &str, nodes: usize) -> Result<Partition, String> {
        let bad = |why: &str| {
            format!("partition `{text}`: {why} (expected FROM..UNTIL@NODES, e.g. 10..30@0-14)")
        };
        let (span, side) = text.split_once('@').ok_or_else(|| bad("no `@`"))?;
        let (from, until) = span.split_once("..").ok_or_else(|| bad("no `..`"))?;
        let secs = |v: &str| -> Result<Nanos, String> {
            let s: f64 = v
                .trim()
                .parse()
                .map_err(|_| bad(&format!("`{v}` is not seconds")))?;
            if !(s.is_finite() && s >= 0.0) {
                return Err(bad(&format!("`{v}` is not seconds")));
            }
            Ok(Nanos::new((s * 1e9) as u64))
        };
        let (from, until) = (secs(from)?, secs(until)?);
        if until <= from {
            return Err(bad("it must end after it starts"));
        }
        let mut members = Vec::new();
        for part in side.split(',') {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let a: usize = a
                .trim()
                .parse()
                .map_err(|_| bad(&format!("`{part}` is not a node")))?;
            let b: usize = b
                .trim()
                .parse()
                .map_err(|_| bad(&format!("`{part}` is not a node")))?;
            if a > b || b >= nodes {
                return Err(bad(&format!("nodes `{part}` are not within 0..{nodes}")));
            }
            members.extend(a..=b);
        }
        members.sort_unstable();
        members.dedup();
        Ok(Partition {
            from,
            until,
            side: members,
        })
    }
}

/// Cuts and heals, in time order, applied as the simulation reaches them.
struct Faults {
    events: Vec<(Nanos, bool, usize)>,
    next: usize,
}

impl Faults {
    fn new(config: &SimConfig, base: Nanos) -> Faults {
        let mut events: Vec<(Nanos, bool, usize)> = Vec::new();
        for (k, p) in config.partitions.iter().enumerate() {
            events.push((base.saturating_add(p.from), true, k));
            events.push((base.saturating_add(p.until), false, k));
        }
        events.sort_by_key(|e| e.0);
        Faults { events, next: 0 }
    }

    /// Runs `net` until `to`, cutting and healing on the way.
    fn advance(&mut self, net: &mut SimNet, config: &SimConfig, to: Nanos) {
        while let Some(&(at, cut, k)) = self.events.get(self.next) {
            if at > to {
                break;
            }
            net.run_until(at);
            let n = net.len();
            let side = &config.partitions[k].side;
            for a in side.iter().copied().filter(|&a| a < n) {
                for b in (0..n).filter(|b| !side.contains(b)) {
                    // Healing restores only links the topology has.
                    net.set_cut(a, b, cut || !config.topology.linked(a, b, n));
                }
            }
            self.next += 1;
        }
        net.run_until(to);
    }
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            nodes: 30,
            assign: Assign::ConsistentHash,
            latency_min: Nanos::from_millis(1),
            latency_max: Nanos::from_millis(1),
            loss: 0.0,
            seed: 1,
            sample: Nanos::SECOND,
            anti_entropy: Nanos::from_secs(30),
            topology: Topology::FullMesh,
            dissemination: Dissemination::Origin,
            partitions: Vec::new(),
        }
    }
}

/// One sample of the time series.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds from the data set's start.
    pub t: f64,
    /// Arrivals so far.
    pub requests: u64,
    /// Cluster rejections so far.
    pub rejections: u64,
    /// Centralized rejections so far.
    pub central_rejections: u64,
    /// Mean memory per node, bytes.
    pub memory: f64,
    /// Gossip bytes sent so far, all nodes.
    pub gossip_bytes: u64,
}

/// What one simulation measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Outcome {
    /// The strategy.
    pub strategy: String,
    /// Requests replayed.
    pub requests: u64,
    /// Reports and refunds replayed (usage told after the fact: charged
    /// or given back on the node routed to and in the ground truth, never
    /// refused, so neither requests nor rejections).
    pub told: u64,
    /// Cluster rejections.
    pub rejections: u64,
    /// Centralized rejections (the ground truth).
    pub central_rejections: u64,
    /// `rejections / central_rejections × 100`, or `None` when the ground
    /// truth rejects nothing.
    pub precision: Option<f64>,
    /// Granted by the cluster, rejected by the ground truth.
    pub over_admissions: u64,
    /// Rejected by the cluster, granted by the ground truth.
    pub false_rejections: u64,
    /// Largest mean memory per node over time, bytes.
    pub peak_memory: f64,
    /// Mean memory per node over the run, bytes.
    pub mean_memory: f64,
    /// Gossip datagrams sent, all nodes.
    pub gossip_datagrams: u64,
    /// Gossip bytes sent, all nodes.
    pub gossip_bytes: u64,
    /// Gossip bytes per request the cluster granted (`None` when it
    /// granted none): what one grant costs the network.
    pub gossip_per_grant: Option<f64>,
    /// Updates (queue elements, counter and epoch entries) the gossip
    /// carried, all nodes.
    pub gossip_updates: u64,
    /// Updates carried per granted request: how many times each grant
    /// crossed the network (N − 1 when each node receives it once).
    pub updates_per_grant: Option<f64>,
    /// Membership and clock-probe bytes sent, all nodes.
    pub membership_bytes: u64,
    /// Seconds from the last arrival until the cluster converged, or
    /// `None` if it had not after ten minutes.
    pub convergence: Option<f64>,
    /// Runs averaged into this outcome (1 for a single run).
    pub runs: u64,
    /// The lowest precision over the runs.
    pub precision_min: Option<f64>,
    /// The highest precision over the runs.
    pub precision_max: Option<f64>,
    /// The time series.
    pub series: Vec<Sample>,
}

/// A node for `arrival` (the `i`-th of the data set) among `nodes`.
pub fn route(
    assign: Assign,
    arrival: &Arrival,
    i: usize,
    nodes: usize,
    rng: &mut SmallRng,
) -> usize {
    let n = nodes.max(1) as u64;
    let pick = match assign {
        Assign::ConsistentHash => {
            let ms = u128::from(arrival.at.as_u64() / 1_000_000);
            let user = user_number(&arrival.user);
            mix(ms.wrapping_mul(user) as u64 ^ (ms.wrapping_mul(user) >> 64) as u64)
        }
        Assign::RoundRobin => i as u64,
        Assign::Sticky => mix(user_number(&arrival.user) as u64),
        Assign::Random => rng.random::<u64>(),
    };
    (pick % n) as usize
}

/// A user id as a number: its hex value when it is hex (the thesis's ids),
/// otherwise a hash of it.
fn user_number(user: &str) -> u128 {
    if !user.is_empty() && user.len() <= 32 {
        if let Ok(v) = u128::from_str_radix(user, 16) {
            return v;
        }
    }
    u128::from(tollgate_replica::wire::cluster_tag(user))
}

/// SplitMix64's finalizer: a stable, well-spread hash of a number.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs `set` through a cluster running `strategy` and through the
/// centralized limiter. `progress` is told how many arrivals are done.
pub fn run(
    set: &DataSet,
    strategy: &SimStrategy,
    config: &SimConfig,
    progress: &mut dyn FnMut(u64),
) -> Result<Outcome, String> {
    let bucket = TokenBucket::new(set.capacity, set.rate).map_err(|e| e.to_string())?;
    let nodes = config.nodes.max(1);
    let mut net = SimNet::with_anti_entropy(
        nodes,
        START,
        config.latency_min,
        config.seed,
        config.anti_entropy,
        |node: NodeId| ReplicaOptions {
            node,
            dissemination: config.dissemination,
            ..ReplicaOptions::default()
        },
    );
    net.set_network(config.latency_min, config.latency_max, config.loss);
    for a in 0..nodes {
        for b in (a + 1)..nodes {
            if !config.topology.linked(a, b, nodes) {
                net.set_cut(a, b, true);
            }
        }
    }
    let limits: Vec<Arc<Limit>> = (0..nodes)
        .map(|i| {
            let limit = net
                .replica(i)
                .prepare_limit(
                    Limit::TokenBucket(bucket.clone()),
                    Some(strategy.replication()),
                )
                .map(Arc::new)
                .map_err(|e| e.to_string())?;
            net.replica(i).register(LIMIT, Arc::clone(&limit));
            Ok(limit)
        })
        .collect::<Result<_, String>>()?;
    net.run_for(FORMATION);
    let base = net.now();
    let mut faults = Faults::new(config, base);

    let mut central: HashMap<&str, tollgate_core::algorithms::token_bucket::TokenBucketState> =
        HashMap::new();
    let mut rng = SmallRng::seed_from_u64(config.seed ^ 0xa55a);
    let mut out = Outcome {
        strategy: strategy.name.clone(),
        ..Outcome::default()
    };
    let mut sampler = Sampler {
        next: base,
        every: config.sample,
        base,
        memory_sum: 0.0,
        samples: 0,
    };
    for (i, arrival) in set.arrivals.iter().enumerate() {
        let at = base.saturating_add(arrival.at);
        sampler.run_to(&mut net, &mut faults, config, &mut out, at);
        let node = route(config.assign, arrival, i, nodes, &mut rng);
        let plan = Plan::single(Key::new(LIMIT, &arrival.user), Arc::clone(&limits[node]));
        if let Some(told) = arrival.told {
            let (mode, hits) = match told {
                Told::Report(h) => (Mode::Report, h),
                Told::Refund(h) => (Mode::Refund, h),
            };
            net.decide_in(node, &plan, Hits::exactly(hits), mode)
                .map_err(|e| match e {
                    StoreError::Plan(PlanError::NoUsage { .. }) => format!(
                        "the traffic tells usage after the fact (a `{}` line), which strategy \
                         `{}` cannot take: only `counter` replicates reports and refunds \
                         (run it alone with `--strategies counter`)",
                        mode.as_str(),
                        strategy.name
                    ),
                    e => format!("node {node} at {}: {e}", arrival.at),
                })?;
            let state = central
                .entry(arrival.user.as_str())
                .or_insert_with(|| bucket.fresh());
            match told {
                Told::Report(h) => bucket.report(state, at, h),
                Told::Refund(h) => bucket.refund(state, at, h),
            };
            out.told += 1;
            continue;
        }
        let granted = net
            .decide(node, &plan, Hits::exactly(1))
            .map_err(|e| format!("node {node} at {}: {e}", arrival.at))?
            .allowed;
        let state = central
            .entry(arrival.user.as_str())
            .or_insert_with(|| bucket.fresh());
        let truth = bucket.decide(state, at, Hits::exactly(1)).granted > 0;
        out.requests += 1;
        out.rejections += u64::from(!granted);
        out.central_rejections += u64::from(!truth);
        out.over_admissions += u64::from(granted && !truth);

        out.false_rejections += u64::from(!granted && truth);
        if i % 1024 == 0 {
            progress(i as u64);
        }
    }
    progress(set.arrivals.len() as u64);
    // Converge: every delta empty and every node holding the same state.
    let last = net.now();
    let users: Vec<&str> = central.keys().copied().collect();
    let mut converged = None;
    while net.now().saturating_sub(last) <= MAX_CONVERGENCE {
        let step = net.now().saturating_add(Nanos::from_millis(100));
        sampler.run_to(&mut net, &mut faults, config, &mut out, step);
        if is_converged(&net, &users) {
            converged = Some(net.now().saturating_sub(last).as_secs_f64());
            break;
        }
    }
    sampler.take(&net, &mut out);
    out.convergence = converged;
    out.mean_memory = sampler.memory_sum / sampler.samples.max(1) as f64;
    let (bytes, datagrams, other, updates) = gossip_sent(&net);
    out.gossip_bytes = bytes;
    out.gossip_datagrams = datagrams;
    out.gossip_updates = updates;
    (out.gossip_per_grant, out.updates_per_grant) = per_grant(&out);
    out.membership_bytes = other;
    out.precision = (out.central_rejections > 0)
        .then(|| out.rejections as f64 * 100.0 / out.central_rejections as f64);
    out.precision_min = out.precision;
    out.precision_max = out.precision;
    out.runs = 1;
    Ok(out)
}

/// Runs `set` `runs` times, seeds `config.seed`, `config.seed + 1`, ...
/// (the network's and the gossip's randomness; the data set stays), and
/// averages them ([`average`]), as the thesis averaged ten runs.
pub fn run_many(
    set: &DataSet,
    strategy: &SimStrategy,
    config: &SimConfig,
    runs: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<Outcome, String> {
    let mut outcomes = Vec::new();
    for r in 0..runs.max(1) {
        let config = SimConfig {
            seed: config.seed.wrapping_add(r),
            ..config.clone()
        };
        let done = r * set.arrivals.len() as u64;
        outcomes.push(run(set, strategy, &config, &mut |n| progress(done + n))?);
    }
    Ok(average(&outcomes))
}

/// The mean of several runs of one strategy: counts and memory averaged
/// (counts rounded), precision averaged with its range, convergence the
/// mean of the runs that converged (`None` if one did not), and the first
/// run's time series.
pub fn average(outcomes: &[Outcome]) -> Outcome {
    let Some(first) = outcomes.first() else {
        return Outcome::default();
    };
    let n = outcomes.len() as f64;
    let mean = |f: &dyn Fn(&Outcome) -> f64| outcomes.iter().map(f).sum::<f64>() / n;
    let count = |f: &dyn Fn(&Outcome) -> u64| mean(&|o| f(o) as f64).round() as u64;
    let precisions: Vec<f64> = outcomes.iter().filter_map(|o| o.precision).collect();
    let convergence = outcomes
        .iter()
        .map(|o| o.convergence)
        .collect::<Option<Vec<f64>>>()
        .map(|c| c.iter().sum::<f64>() / n);
    Outcome {
        strategy: first.strategy.clone(),
        requests: first.requests,
        told: first.told,
        rejections: count(&|o| o.rejections),
        central_rejections: first.central_rejections,
        precision: (!precisions.is_empty())
            .then(|| precisions.iter().sum::<f64>() / precisions.len() as f64),
        precision_min: precisions.iter().copied().reduce(f64::min),
        precision_max: precisions.iter().copied().reduce(f64::max),
        over_admissions: count(&|o| o.over_admissions),
        false_rejections: count(&|o| o.false_rejections),
        peak_memory: mean(&|o| o.peak_memory),
        mean_memory: mean(&|o| o.mean_memory),
        gossip_datagrams: count(&|o| o.gossip_datagrams),
        gossip_bytes: count(&|o| o.gossip_bytes),
        gossip_per_grant: None,
        gossip_updates: count(&|o| o.gossip_updates),
        updates_per_grant: None,
        membership_bytes: count(&|o| o.membership_bytes),
        convergence,
        runs: outcomes.len() as u64,
        series: first.series.clone(),
    }
    .with_per_grant()
}

impl Outcome {
    fn with_per_grant(mut self) -> Outcome {
        (self.gossip_per_grant, self.updates_per_grant) = per_grant(&self);
        self
    }
}

/// Gossip bytes and updates per granted request.
fn per_grant(o: &Outcome) -> (Option<f64>, Option<f64>) {
    let grants = o.requests.saturating_sub(o.rejections);
    let per = |n: u64| (grants > 0).then(|| n as f64 / grants as f64);
    (per(o.gossip_bytes), per(o.gossip_updates))
}

/// The time series' sampling: a sample every `every` of simulated time.
struct Sampler {
    next: Nanos,
    every: Nanos,
    base: Nanos,
    memory_sum: f64,
    samples: u64,
}

impl Sampler {
    /// Runs `net` to `to` (cutting and healing on the way), taking every
    /// sample due before it.
    fn run_to(
        &mut self,
        net: &mut SimNet,
        faults: &mut Faults,
        config: &SimConfig,
        out: &mut Outcome,
        to: Nanos,
    ) {
        while self.next <= to {
            faults.advance(net, config, self.next);
            self.take(net, out);
            self.next = self.next.saturating_add(self.every);
        }
        faults.advance(net, config, to);
    }

    /// One sample now.
    fn take(&mut self, net: &SimNet, out: &mut Outcome) {
        let nodes = net.len();
        // As the server's housekeeping does: idle keys are dropped once
        // past their retention margin.
        for i in 0..nodes {
            net.replica(i).sweep_now(net.now());
        }
        let memory = (0..nodes)
            .map(|i| net.replica(i).memory_bytes() as f64)
            .sum::<f64>()
            / nodes.max(1) as f64;
        out.series.push(Sample {
            t: net.now().saturating_sub(self.base).as_secs_f64(),
            requests: out.requests,
            rejections: out.rejections,
            central_rejections: out.central_rejections,
            memory,
            gossip_bytes: gossip_sent(net).0,
        });
        out.peak_memory = out.peak_memory.max(memory);
        self.memory_sum += memory;
        self.samples += 1;
    }
}

/// Gossip bytes, gossip datagrams and other bytes sent by every node.
fn gossip_sent(net: &SimNet) -> (u64, u64, u64, u64) {
    (0..net.len())
        .filter_map(|i| net.node(i))
        .map(|n| n.sent())
        .fold((0, 0, 0, 0), |(b, d, o, u), s| {
            (
                b + s.gossip_bytes,
                d + s.gossip_datagrams,
                o + s.other_bytes,
                u + s.gossip_updates,
            )
        })
}

fn is_converged(net: &SimNet, users: &[&str]) -> bool {
    if (0..net.len()).any(|i| net.replica(i).delta_sizes() != (0, 0)) {
        return false;
    }
    let now = net.now();
    users.iter().all(|user| {
        let key = Key::new(LIMIT, user);
        let first = net.replica(0).view_of(&key, now);
        (1..net.len()).all(|i| net.replica(i).view_of(&key, now) == first)
    })
}
