#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The simulator's own guarantees: the same seed gives the same numbers;
//! a one-node cluster is the ground truth; a cluster whose gossip has time
//! to spread between requests decides like the ground truth; and the
//! thesis's data set D gives its hand-checked numbers.

use tollgate_core::{Nanos, Rate};
use tollgate_replica::Dissemination;
use tollgate_sim::dataset::{self, DataSet, Kind, Params};
use tollgate_sim::run::{self, Assign, Outcome, SimConfig, SimStrategy};
use tollgate_sim::{Arrival, Told};

fn config(nodes: usize, seed: u64) -> SimConfig {
    SimConfig {
        nodes,
        seed,
        ..SimConfig::default()
    }
}

fn simulate(set: &DataSet, strategy: &str, config: &SimConfig) -> Outcome {
    let strategy = SimStrategy::parse(strategy, Nanos::from_millis(300)).unwrap();
    run::run(set, &strategy, config, &mut |_| {}).unwrap()
}

fn small_barely(seed: u64) -> DataSet {
    dataset::generate(
        Kind::BBarely,
        &Params {
            capacity: 40,
            seed,
            users: None,
        },
    )
}

#[test]
fn the_same_seed_gives_the_same_numbers() {
    let set = small_barely(3);
    for strategy in ["counter", "queue+freq"] {
        let a = simulate(&set, strategy, &config(4, 7));
        let b = simulate(&set, strategy, &config(4, 7));
        assert_eq!(a, b, "{strategy}");
    }
    // The seed draws the network's latencies, and under the thesis's
    // dissemination each round's neighbour: another one changes something.
    // (Under origin dissemination every neighbour gets its delta each
    // round, so with a fixed latency nothing is left to draw.)
    let jittered = |seed| SimConfig {
        latency_max: Nanos::from_millis(20),
        dissemination: Dissemination::Epidemic,
        ..config(4, seed)
    };
    let other = simulate(&set, "counter", &jittered(8));
    let first = simulate(&set, "counter", &jittered(7));
    assert_ne!(
        (first.gossip_bytes, &first.series),
        (other.gossip_bytes, &other.series),
        "another seed changes something"
    );
}

#[test]
fn a_one_node_cluster_is_the_ground_truth() {
    let set = dataset::generate(
        Kind::BExtreme,
        &Params {
            capacity: 20,
            seed: 1,
            users: None,
        },
    );
    for strategy in SimStrategy::ALL {
        let o = simulate(&set, strategy, &config(1, 1));
        assert_eq!(o.over_admissions, 0, "{strategy}");
        assert_eq!(o.false_rejections, 0, "{strategy}");
        assert_eq!(o.rejections, o.central_rejections, "{strategy}");
        assert_eq!(o.precision, Some(100.0), "{strategy}");
        assert_eq!(o.gossip_bytes, 0, "{strategy}: nobody to gossip to");
    }
}

/// Requests 3 s apart, round-robin over five nodes with no latency: every
/// grant has reached every node (ten rounds of 300 ms) before the next
/// request, so the cluster decides exactly as the centralized limiter.
#[test]
fn a_cluster_with_time_to_converge_decides_like_the_ground_truth() {
    let arrivals: Vec<Arrival> = (0..40)
        .map(|i| Arrival {
            at: Nanos::from_secs(3 * i),
            user: "0123456789abcdef0123456789abcdef".into(),
            told: None,
        })
        .collect();
    let set = DataSet {
        name: "spaced".into(),
        capacity: 5,
        // One token a minute: the bucket empties after five, then refills
        // one every 20 requests.
        rate: Rate::new(1, Nanos::from_secs(60)).unwrap(),
        duration: Nanos::from_secs(120),
        arrivals,
        description: "one request every 3 s".into(),
    };
    let cfg = SimConfig {
        nodes: 5,
        assign: Assign::RoundRobin,
        latency_min: Nanos::ZERO,
        latency_max: Nanos::ZERO,
        ..SimConfig::default()
    };
    for strategy in ["counter", "queue", "queue+freq", "queue+linf"] {
        let o = simulate(&set, strategy, &cfg);
        assert!(o.central_rejections > 0);
        assert_eq!(
            (o.over_admissions, o.false_rejections),
            (0, 0),
            "{strategy}: {o:?}"
        );
        assert!(o.convergence.is_some(), "{strategy}");
    }
}

/// Usage told after the fact (a trace's `report` and `refund` lines) is
/// charged on the node routed to and in the ground truth: with time to
/// converge, the counter strategy's cluster is refused by a report's debt
/// and let through after a refund exactly when the ground truth is; the
/// reports are counted apart from the requests. A strategy that takes no
/// usage is refused, naming the one that does.
#[test]
fn reports_and_refunds_are_charged_in_the_cluster_and_the_ground_truth() {
    let user = "0123456789abcdef0123456789abcdef";
    let at = |s: u64, told: Option<Told>| Arrival {
        at: Nanos::from_secs(s),
        user: user.into(),
        told,
    };
    // A bucket of 5, one token a minute: checks every 3 s; at 30 s a
    // report of 8 leaves it owing; at 60 s a refund of 6 gives some back.
    let mut arrivals: Vec<Arrival> = (0..40).map(|i| at(3 * i + 1, None)).collect();
    arrivals.push(at(30, Some(Told::Report(8))));
    arrivals.push(at(60, Some(Told::Refund(6))));
    arrivals.sort();
    let set = DataSet {
        name: "told".into(),
        capacity: 5,
        rate: Rate::new(1, Nanos::from_secs(60)).unwrap(),
        duration: Nanos::from_secs(120),
        arrivals,
        description: "checks, a report and a refund".into(),
    };
    let cfg = SimConfig {
        nodes: 3,
        assign: Assign::RoundRobin,
        latency_min: Nanos::ZERO,
        latency_max: Nanos::ZERO,
        ..SimConfig::default()
    };
    let o = simulate(&set, "counter", &cfg);
    assert_eq!((o.requests, o.told), (40, 2), "{o:?}");
    assert_eq!(
        (o.over_admissions, o.false_rejections),
        (0, 0),
        "the cluster decides as the ground truth: {o:?}"
    );
    // Without the report and the refund the ground truth refuses another
    // number: they were charged.
    let mut checks_only = set.clone();
    checks_only.arrivals.retain(|a| a.told.is_none());
    let plain = simulate(&checks_only, "counter", &cfg);
    assert_ne!(
        plain.central_rejections, o.central_rejections,
        "{plain:?} {o:?}"
    );
    let strategy = SimStrategy::parse("queue", Nanos::from_millis(300)).unwrap();
    let err = run::run(&set, &strategy, &cfg, &mut |_| {}).unwrap_err();
    assert!(
        err.contains("strategy `queue` cannot take") && err.contains("--strategies counter"),
        "{err}"
    );
}

/// The thesis's data set D (capacity 5, refill 1/s, a request every
/// 0.9 s for 100 s): 112 requests, 8 rejected by the centralized limiter
/// (hand-checked: the first at 36.9 s, then every 9 s).
#[test]
fn data_set_d_gives_its_hand_checked_ground_truth() {
    let set = dataset::generate(Kind::D, &Params::default());
    let o = simulate(&set, "counter", &config(3, 1));
    assert_eq!(o.requests, 112);
    assert_eq!(o.central_rejections, 8);
    let first = o.series.iter().find(|s| s.central_rejections > 0).unwrap();
    assert!(
        (36.0..=38.0).contains(&first.t),
        "first rejection sampled at {}",
        first.t
    );
}

#[test]
fn bad_parameters_are_refused_by_name() {
    assert!(SimStrategy::parse("queue+magic", Nanos::from_millis(300)).is_none());
    assert!(Assign::parse("nearest").is_none());
    for name in SimStrategy::ALL {
        assert_eq!(
            SimStrategy::parse(name, Nanos::from_millis(300))
                .unwrap()
                .name,
            name
        );
    }
}

/// A partition for the first half of the minute splits the cluster in
/// two sides that each grant from the whole bucket: the cluster admits
/// more than without it, and still converges once it heals.
#[test]
fn a_partition_costs_precision_and_heals() {
    let set = dataset::generate(
        Kind::BSubstantial,
        &Params {
            capacity: 30,
            seed: 2,
            users: None,
        },
    );
    let whole = simulate(&set, "counter", &config(4, 5));
    let mut cut = config(4, 5);
    cut.partitions = vec![tollgate_sim::run::Partition::parse("0..40@0-1", 4).unwrap()];
    let split = simulate(&set, "counter", &cut);
    assert!(
        split.over_admissions > whole.over_admissions,
        "{} over-admitted with the partition, {} without",
        split.over_admissions,
        whole.over_admissions
    );
    assert!(split.convergence.is_some(), "it heals");
}

#[test]
fn a_ring_spreads_news_hop_by_hop_and_converges() {
    let set = small_barely(4);
    let mut ring = config(6, 3);
    ring.topology = tollgate_sim::run::Topology::Ring;
    let o = simulate(&set, "queue+freq", &ring);
    assert!(o.convergence.is_some());
    assert!(o.central_rejections > 0);
}

#[test]
fn partitions_are_parsed_and_bad_ones_named() {
    use tollgate_sim::run::Partition;
    let p = Partition::parse("1.5..3@0,2-3", 5).unwrap();
    assert_eq!(p.from, Nanos::from_millis(1500));
    assert_eq!(p.until, Nanos::from_secs(3));
    assert_eq!(p.side, vec![0, 2, 3]);
    for bad in ["3..1@0", "1..2@9", "1..2", "a..2@0", "1-2@0"] {
        let e = Partition::parse(bad, 5).unwrap_err();
        assert!(e.contains(bad), "{e}");
    }
}

#[test]
fn several_runs_are_averaged_with_their_range() {
    let set = small_barely(5);
    let strategy = SimStrategy::parse("counter", Nanos::from_millis(300)).unwrap();
    let cfg = config(4, 11);
    let many = run::run_many(&set, &strategy, &cfg, 3, &mut |_| {}).unwrap();
    assert_eq!(many.runs, 3);
    let singles: Vec<Outcome> = (0..3)
        .map(|r| {
            let c = SimConfig {
                seed: 11 + r,
                ..cfg.clone()
            };
            run::run(&set, &strategy, &c, &mut |_| {}).unwrap()
        })
        .collect();
    let precisions: Vec<f64> = singles.iter().filter_map(|o| o.precision).collect();
    let mean = precisions.iter().sum::<f64>() / precisions.len() as f64;
    assert!((many.precision.unwrap() - mean).abs() < 1e-9);
    assert_eq!(
        many.precision_min,
        precisions.iter().copied().reduce(f64::min)
    );
    assert_eq!(many.series, singles[0].series, "the first run's series");
}
