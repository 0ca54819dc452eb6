#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The thesis's data sets: shape, determinism and hand-checked ground
//! truth; and the thesis's trace export format.

use std::collections::{BTreeMap, HashSet};

use tollgate_core::Nanos;
use tollgate_sim::dataset::{
    centralized_decisions, centralized_rejections, from_thesis_json, generate, to_thesis_json,
    DataSet, Kind, Params, DEFAULT_C_USERS,
};
use tollgate_sim::Arrival;

fn params(capacity: u64, seed: u64) -> Params {
    Params {
        capacity,
        seed,
        users: None,
    }
}

/// C with fewer users, for the tests that only need its shape.
fn small_c(seed: u64) -> DataSet {
    generate(
        Kind::C,
        &Params {
            capacity: 300,
            seed,
            users: Some(500),
        },
    )
}

fn well_formed(set: &DataSet) {
    assert!(!set.arrivals.is_empty(), "{}: empty", set.name);
    assert!(
        set.arrivals.windows(2).all(|w| w[0].at <= w[1].at),
        "{}: not sorted",
        set.name
    );
    for a in &set.arrivals {
        assert!(
            a.at < set.duration,
            "{}: {a:?} past {}",
            set.name,
            set.duration
        );
        assert_eq!(
            a.at.as_u64() % 1_000_000,
            0,
            "{}: {a:?} not whole ms",
            set.name
        );
        assert_eq!(a.user.len(), 32, "{}: user id {}", set.name, a.user);
        assert!(
            a.user
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
            "{}: user id {}",
            set.name,
            a.user
        );
    }
    assert!(!set.description.is_empty() && !set.description.contains('\n'));
}

/// Users with at least one centralized rejection, and all users.
fn limited_users(set: &DataSet) -> (HashSet<&str>, HashSet<&str>) {
    let decisions = centralized_decisions(set);
    let all = set.arrivals.iter().map(|a| a.user.as_str()).collect();
    let limited = set
        .arrivals
        .iter()
        .zip(&decisions)
        .filter(|(_, ok)| !**ok)
        .map(|(a, _)| a.user.as_str())
        .collect();
    (limited, all)
}

#[test]
fn kinds_round_trip_through_their_names() {
    let names: Vec<String> = Kind::ALL.iter().map(|k| k.to_string()).collect();
    assert_eq!(
        names,
        [
            "A",
            "B-extreme",
            "B-substantial",
            "B-barely",
            "B-unlimited",
            "C",
            "D"
        ]
    );
    for k in Kind::ALL {
        assert_eq!(k.to_string().parse::<Kind>().unwrap(), k);
        assert_eq!(k.to_string().to_lowercase().parse::<Kind>().unwrap(), k);
    }
    let e = "B".parse::<Kind>().unwrap_err();
    assert!(e.to_string().contains("`B`"), "{e}");
    assert_eq!(Params::default().capacity, 300);
    assert_eq!(Params::default().users, None);
}

#[test]
fn same_seed_same_set_different_seed_different_set() {
    for k in Kind::ALL {
        let p = if k == Kind::C {
            Params {
                users: Some(300),
                ..params(300, 7)
            }
        } else {
            params(300, 7)
        };
        let a = generate(k, &p);
        let b = generate(k, &p);
        assert_eq!(a, b, "{k}");
        well_formed(&a);
        assert_eq!(a.name, k.to_string());
    }
    for k in [Kind::A, Kind::BExtreme, Kind::BSubstantial, Kind::BBarely] {
        assert_ne!(
            generate(k, &params(300, 1)).arrivals,
            generate(k, &params(300, 2)).arrivals,
            "{k}"
        );
    }
    assert_ne!(small_c(1).arrivals, small_c(2).arrivals);
    // User ids come from the seed too.
    assert_ne!(
        generate(Kind::D, &params(300, 1)).arrivals[0].user,
        generate(Kind::D, &params(300, 2)).arrivals[0].user
    );
}

#[test]
fn exact_request_counts_and_limits() {
    for c in [100u64, 300] {
        let count = |k| generate(k, &params(c, 3)).arrivals.len() as u64;
        let round = |x: f64| (x * c as f64).round() as u64;
        assert_eq!(count(Kind::A), round(68.3), "A, c = {c}");
        assert_eq!(count(Kind::BExtreme), round(21.5), "B-extreme, c = {c}");
        assert_eq!(
            count(Kind::BSubstantial),
            round(3.2),
            "B-substantial, c = {c}"
        );
        assert_eq!(count(Kind::BBarely), round(1.1), "B-barely, c = {c}");
        assert_eq!(count(Kind::D), 112, "D, c = {c}");
        for k in Kind::ALL.into_iter().filter(|&k| k != Kind::C) {
            let set = generate(k, &params(c, 3));
            well_formed(&set);
            if k == Kind::D {
                assert_eq!(set.capacity, 5);
                assert_eq!(set.rate.interval(), Nanos::SECOND);
            } else {
                assert_eq!(set.capacity, c);
                // 0.001·c per second: one token every 1000/c s.
                assert_eq!(set.rate.interval(), Nanos::new(1_000_000_000_000 / c));
            }
        }
    }
    let users = |k| {
        let set = generate(k, &params(300, 3));
        set.arrivals
            .iter()
            .map(|a| a.user.clone())
            .collect::<HashSet<_>>()
            .len()
    };
    assert_eq!(users(Kind::A), 10);
    for k in [
        Kind::BExtreme,
        Kind::BSubstantial,
        Kind::BBarely,
        Kind::BUnlimited,
        Kind::D,
    ] {
        assert_eq!(users(k), 1, "{k}");
    }
    let durations: Vec<u64> = Kind::ALL
        .iter()
        .filter(|&&k| k != Kind::C)
        .map(|&k| generate(k, &params(300, 3)).duration.as_u64() / 1_000_000_000)
        .collect();
    assert_eq!(durations, [300, 60, 60, 60, 120, 100]);
}

#[test]
fn d_ground_truth_is_hand_checked() {
    // Capacity 5, 1 token/s, a request every 0.9 s from 0 to 99.9 s: the
    // bucket loses 0.1 token per request after the first five, so the
    // 42nd request (36.9 s) is the first to find less than one token, and
    // then every tenth (every 9 s).
    let set = generate(Kind::D, &params(300, 1));
    let times: Vec<u64> = set
        .arrivals
        .iter()
        .map(|a| a.at.as_u64() / 1_000_000)
        .collect();
    assert_eq!(times.len(), 112);
    assert_eq!(times[1], 900);
    assert_eq!(times[111], 99_900);
    assert_eq!(centralized_rejections(&set), (104, 8));
    let rejected: Vec<u64> = centralized_decisions(&set)
        .iter()
        .zip(&times)
        .filter(|(ok, _)| !**ok)
        .map(|(_, &t)| t)
        .collect();
    assert_eq!(
        rejected,
        [36_900, 45_900, 54_900, 63_900, 72_900, 81_900, 90_900, 99_900]
    );
}

#[test]
fn b_unlimited_is_never_rejected() {
    for c in [100, 300, 1000] {
        let set = generate(Kind::BUnlimited, &params(c, 5));
        let (accepted, rejected) = centralized_rejections(&set);
        assert_eq!(rejected, 0, "c = {c}");
        assert_eq!(accepted as usize, set.arrivals.len());
        // Interval 1.05 × 1000/c s over two minutes.
        let interval_ms = 1_050_000 / c;
        let gap = set.arrivals[1].at.saturating_sub(set.arrivals[0].at);
        assert!(gap.as_u64() / 1_000_000 >= interval_ms, "c = {c}");
    }
    assert_eq!(
        generate(Kind::BUnlimited, &params(300, 5)).arrivals.len(),
        35
    );
}

#[test]
fn b_barely_is_limited_only_at_the_end() {
    for c in [100, 300] {
        for seed in 1..=5 {
            let set = generate(Kind::BBarely, &params(c, seed));
            let (_, rejected) = centralized_rejections(&set);
            assert!(rejected > 0, "c = {c}, seed {seed}");
            assert!(
                rejected * 10 < set.arrivals.len() as u64,
                "c = {c}, seed {seed}: {rejected}"
            );
            let last_quarter = set.duration.as_u64() / 4 * 3;
            for (a, ok) in set.arrivals.iter().zip(centralized_decisions(&set)) {
                assert!(ok || a.at.as_u64() >= last_quarter, "{a:?}");
            }
        }
    }
}

#[test]
fn b_extreme_and_substantial_are_limited_and_extreme_is_front_loaded() {
    for c in [100, 300] {
        let set = generate(Kind::BExtreme, &params(c, 4));
        let (accepted, rejected) = centralized_rejections(&set);
        // A minute admits at most c + 0.06c.
        assert!(accepted * 100 <= 106 * c + 100, "c = {c}: {accepted}");
        assert!(rejected > 0);
        let first_15s = set
            .arrivals
            .iter()
            .filter(|a| a.at < Nanos::from_secs(15))
            .count();
        assert!(first_15s * 3 > set.arrivals.len(), "c = {c}: {first_15s}");
        // Rejections begin within the first seconds.
        let first_rejection = set
            .arrivals
            .iter()
            .zip(centralized_decisions(&set))
            .find(|(_, ok)| !ok)
            .map(|(a, _)| a.at)
            .unwrap();
        assert!(first_rejection < Nanos::from_secs(12), "{first_rejection}");

        let set = generate(Kind::BSubstantial, &params(c, 4));
        let (accepted, rejected) = centralized_rejections(&set);
        assert!(accepted * 100 <= 106 * c + 100, "c = {c}: {accepted}");
        assert!(rejected >= 2 * c, "c = {c}: {rejected}");
    }
}

#[test]
fn a_limits_every_user_with_a_skewed_split() {
    for c in [100, 300] {
        for seed in 1..=3 {
            let set = generate(Kind::A, &params(c, seed));
            let (limited, all) = limited_users(&set);
            assert_eq!(all.len(), 10);
            assert_eq!(limited.len(), 10, "c = {c}, seed {seed}");
            let mut per_user: BTreeMap<&str, u64> = BTreeMap::new();
            for a in &set.arrivals {
                *per_user.entry(&a.user).or_default() += 1;
            }
            let min = per_user.values().min().copied().unwrap();
            let max = per_user.values().max().copied().unwrap();
            assert!(min > c, "c = {c}, seed {seed}: {min}");
            assert!(
                max > 2 * min,
                "c = {c}, seed {seed}: {min}..{max}: not skewed"
            );
            // At most c + 0.3c per user is admitted in five minutes.
            let (accepted, _) = centralized_rejections(&set);
            assert!(accepted <= 13 * c, "c = {c}: {accepted}");
        }
    }
}

#[test]
fn c_default_is_sized_for_a_simulation_with_few_limited_users() {
    let set = generate(Kind::C, &Params::default());
    well_formed(&set);
    let n = set.arrivals.len();
    assert!((20_000..300_000).contains(&n), "{n}");
    let (limited, all) = limited_users(&set);
    assert_eq!(all.len(), DEFAULT_C_USERS);
    let share = limited.len() as f64 / all.len() as f64;
    assert!((0.005..0.05).contains(&share), "{share}");
    assert_eq!(set.duration, Nanos::from_secs(3600));
    // Users keep arriving all through the hour (Fig 5.14).
    let mut first = BTreeMap::new();
    for a in &set.arrivals {
        first.entry(a.user.as_str()).or_insert(a.at);
    }
    let late = first
        .values()
        .filter(|t| **t >= Nanos::from_secs(2700))
        .count();
    assert!(
        late * 8 > all.len(),
        "{late} users first seen in the last quarter"
    );
    // Heavy-tailed volumes: the busiest user sends far more than the median.
    let mut volumes: BTreeMap<&str, u64> = BTreeMap::new();
    for a in &set.arrivals {
        *volumes.entry(&a.user).or_default() += 1;
    }
    let mut v: Vec<u64> = volumes.into_values().collect();
    v.sort_unstable();
    assert!(
        v[v.len() - 1] > 20 * v[v.len() / 2],
        "{:?}",
        (v[v.len() / 2], v[v.len() - 1])
    );
}

#[test]
fn c_honours_the_user_count() {
    let set = small_c(9);
    let (limited, all) = limited_users(&set);
    assert_eq!(all.len(), 500);
    assert_eq!(limited.len(), 10);
}

#[test]
fn thesis_json_round_trips() {
    let set = generate(Kind::A, &params(100, 2));
    let text = to_thesis_json(&set.arrivals, 1_614_556_800_000);
    let parsed = from_thesis_json(&text).unwrap();
    let origin = set.arrivals[0].at;
    let expected: Vec<Arrival> = set
        .arrivals
        .iter()
        .map(|a| Arrival {
            at: a.at.saturating_sub(origin),
            user: a.user.clone(),
            told: a.told,
        })
        .collect();
    assert_eq!(parsed, expected);
}

#[test]
fn thesis_json_sorts_relativises_and_accepts_floats() {
    let text = r#"[
        {"user_id": "deadbeefdeadbeefdeadbeefdeadbeef", "time": 1614556800500},
        {"user_id": "b", "time": 1614556800000.25},
        {"time": 1614556800500, "user_id": 42},
        {"user_id": "c", "time": 1614556800000}
    ]"#;
    let parsed = from_thesis_json(text).unwrap();
    let got: Vec<(u64, &str)> = parsed
        .iter()
        .map(|a| (a.at.as_u64(), a.user.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (0, "c"),
            (250_000, "b"),
            (500_000_000, "deadbeefdeadbeefdeadbeefdeadbeef"),
            (500_000_000, "42"),
        ]
    );
    assert_eq!(from_thesis_json("[]").unwrap(), []);
}

#[test]
fn thesis_json_refuses_what_it_does_not_know() {
    let err = |text: &str| from_thesis_json(text).unwrap_err();
    let e = err(r#"[{"user_id": "a", "time": 1, "hits": 2}]"#);
    assert!(
        e.contains("unknown field `hits`") && e.contains("entry 0"),
        "{e}"
    );
    let e = err(r#"[{"user_id": "a", "time": 1}, {"user_id": "a"}]"#);
    assert!(
        e.contains("entry 1") && e.contains("missing field `time`"),
        "{e}"
    );
    let e = err(r#"[{"time": 1}]"#);
    assert!(e.contains("missing field `user_id`"), "{e}");
    let e = err(r#"[{"user_id": "a", "time": -5}]"#);
    assert!(e.contains("`time`"), "{e}");
    let e = err(r#"[{"user_id": "a", "time": "1"}]"#);
    assert!(e.contains("`time` must be a number"), "{e}");
    let e = err(r#"[{"user_id": true, "time": 1}]"#);
    assert!(e.contains("`user_id`"), "{e}");
    let e = err(r#"{"user_id": "a", "time": 1}"#);
    assert!(e.contains("array"), "{e}");
    let e = err(r#"[1]"#);
    assert!(e.contains("entry 0") && e.contains("object"), "{e}");
    let e = err("[{");
    assert!(e.contains("JSON"), "{e}");
}

#[test]
fn capacity_is_clamped() {
    let set = generate(Kind::BUnlimited, &params(0, 1));
    assert_eq!(set.capacity, 1);
    well_formed(&set);
    assert_eq!(centralized_rejections(&set).1, 0);
}
