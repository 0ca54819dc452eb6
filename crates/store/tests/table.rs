//! The keyed-state table ([`tollgate_store::table`]) against a reference
//! model: a `HashMap` with the capacity rule written out plainly. Any
//! sequence of one-key decisions, multi-key decisions (failing or not),
//! merges, removals, sweeps and clock steps leaves the table holding what
//! the model holds, answering what it answers, and counting what it
//! counts — with one shard (where the capacity rule is exact and
//! observable) and with several (where plans lock several shards).

// The workspace's `allow-unwrap-in-tests` covers `#[test]` functions but
// not the helpers and proptest bodies here.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use tollgate_core::{Align, FixedWindow, Limit, Nanos};
use tollgate_store::table::{AtCapacity, Effect, Policy, Table, TableOptions};
use tollgate_store::{Key, LimitId, Plan, StoreError};

/// A state is the time (ms) it lives until; it is dead from then on.
struct Expiring;

impl Policy for Expiring {
    type State = u64;

    fn fresh(&self, _: &Limit) -> u64 {
        0
    }

    fn is_dead(&self, _: &Limit, until: &u64, now: Nanos) -> bool {
        Nanos::from_millis(*until) <= now
    }
}

const KEYS: usize = 8;
/// Capacity sweeps of a shard at most this often.
const SWEEP_MS: u64 = 5;

fn key(i: usize) -> Key {
    Key::new(LimitId(1), &format!("k{i}"))
}

fn limit() -> Arc<Limit> {
    let w = FixedWindow::new(10, Nanos::from_secs(60), Align::Epoch).unwrap();
    Arc::new(Limit::FixedWindow(w))
}

#[derive(Clone, Debug)]
enum Op {
    /// The clock moves on.
    Advance(u64),
    /// One key decided: it lives `ttl` ms from now (0: dead at once).
    Decide {
        key: usize,
        ttl: u64,
    },
    /// One key decided, refused before its state was touched.
    Refuse {
        key: usize,
    },
    /// Several distinct keys decided together, or failing (changing
    /// nothing).
    Many {
        keys: Vec<(usize, u64)>,
        fail: bool,
    },
    /// A merge: a key not held takes room first.
    Update {
        key: usize,
        ttl: u64,
    },
    Remove {
        key: usize,
    },
    Sweep,
    Read {
        key: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0..KEYS;
    let ttl = prop_oneof![1 => Just(0u64), 3 => 1u64..20];
    prop_oneof![
        2 => (1u64..8).prop_map(Op::Advance),
        6 => (k.clone(), ttl.clone()).prop_map(|(key, ttl)| Op::Decide { key, ttl }),
        1 => k.clone().prop_map(|key| Op::Refuse { key }),
        4 => (
            proptest::sample::subsequence((0..KEYS).collect::<Vec<_>>(), 2..=4),
            proptest::collection::vec(ttl.clone(), 4),
            proptest::bool::weighted(0.2),
        )
            .prop_map(|(keys, ttls, fail)| Op::Many {
                keys: keys.into_iter().zip(ttls).collect(),
                fail,
            }),
        3 => (k.clone(), ttl).prop_map(|(key, ttl)| Op::Update { key, ttl }),
        1 => k.clone().prop_map(|key| Op::Remove { key }),
        1 => Just(Op::Sweep),
        1 => k.prop_map(|key| Op::Read { key }),
    ]
}

/// The table's rules, written for one shard of `cap` keys.
struct Model {
    map: HashMap<usize, u64>,
    cap: usize,
    reject: bool,
    last_sweep: Option<u64>,
    untracked: u64,
    rejected: u64,
    swept: u64,
}

impl Model {
    fn sweep(&mut self, now: u64) -> u64 {
        let before = self.map.len();
        self.map.retain(|_, until| *until > now);
        self.last_sweep = Some(now);
        let n = (before - self.map.len()) as u64;
        self.swept += n;
        n
    }

    fn make_room(&mut self, extra: usize, now: u64) -> bool {
        if self.map.len() + extra <= self.cap {
            return true;
        }
        if self.last_sweep.is_none_or(|last| now - last >= SWEEP_MS) {
            self.sweep(now);
        }
        self.map.len() + extra <= self.cap
    }

    fn decide(&mut self, key: usize, ttl: u64, now: u64) -> Result<u64, StoreError> {
        let until = now + ttl;
        let dead = until <= now;
        match self.map.get(&key).copied() {
            Some(prev) => {
                if dead {
                    self.map.remove(&key);
                } else {
                    self.map.insert(key, until);
                }
                Ok(prev)
            }
            None if dead => Ok(0),
            None if self.make_room(1, now) => {
                self.map.insert(key, until);
                Ok(0)
            }
            None if self.reject => {
                self.rejected += 1;
                Err(StoreError::AtCapacity(0))
            }
            None => {
                self.untracked += 1;
                Ok(0)
            }
        }
    }

    fn many(
        &mut self,
        keys: &[(usize, u64)],
        fail: bool,
        now: u64,
    ) -> Result<Vec<u64>, StoreError> {
        let taken: Vec<Option<u64>> = keys.iter().map(|(k, _)| self.map.remove(k)).collect();
        let put_back = |map: &mut HashMap<usize, u64>| {
            for ((k, _), t) in keys.iter().zip(&taken) {
                if let Some(v) = t {
                    map.insert(*k, *v);
                }
            }
        };
        let tight = self.reject && self.map.len() + keys.len() > self.cap;
        if fail {
            put_back(&mut self.map);
            return Err(StoreError::Unsupported("fail".into()));
        }
        let live: Vec<bool> = keys.iter().map(|(_, ttl)| *ttl > 0).collect();
        if tight {
            let back = (0..keys.len())
                .filter(|&i| live[i] && taken[i].is_some())
                .count();
            let new = (0..keys.len())
                .filter(|&i| live[i] && taken[i].is_none())
                .count();
            if new > 0 && !self.make_room(back + new, now) {
                put_back(&mut self.map);
                self.rejected += 1;
                return Err(StoreError::AtCapacity(0));
            }
        }
        for (i, (k, ttl)) in keys.iter().enumerate() {
            if live[i] && taken[i].is_some() {
                self.map.insert(*k, now + ttl);
            }
        }
        let mut untracked = false;
        for (i, (k, ttl)) in keys.iter().enumerate() {
            if live[i] && taken[i].is_none() {
                if self.make_room(1, now) {
                    self.map.insert(*k, now + ttl);
                } else {
                    untracked = true;
                }
            }
        }
        self.untracked += u64::from(untracked);
        Ok(taken.iter().map(|t| t.unwrap_or(0)).collect())
    }

    fn update(&mut self, key: usize, ttl: u64, now: u64) -> Option<(u64, bool)> {
        let until = now + ttl;
        let dead = until <= now;
        if let Some(prev) = self.map.get(&key).copied() {
            if dead {
                self.map.remove(&key);
            } else {
                self.map.insert(key, until);
            }
            return Some((prev, true));
        }
        if !self.make_room(1, now) {
            self.untracked += 1;
            return None;
        }
        if !dead {
            self.map.insert(key, until);
        }
        Some((0, false))
    }
}

/// Errors compare by kind: the table names its configured cap.
fn kind<T>(r: Result<T, StoreError>) -> Result<T, String> {
    r.map_err(|e| match e {
        StoreError::AtCapacity(_) => "at capacity".to_string(),
        other => other.to_string(),
    })
}

fn run(shards: usize, cap: usize, reject: bool, ops: &[Op]) -> Result<(), TestCaseError> {
    let at_capacity = if reject {
        AtCapacity::Reject
    } else {
        AtCapacity::DecideUntracked
    };
    let table = Table::new(
        TableOptions {
            shards,
            max_keys: cap,
            at_capacity,
            sweep_interval: Nanos::from_millis(SWEEP_MS),
        },
        Expiring,
    );
    let mut model = Model {
        map: HashMap::new(),
        cap,
        reject,
        last_sweep: None,
        untracked: 0,
        rejected: 0,
        swept: 0,
    };
    let limit = limit();
    let mut now = 1u64;
    for op in ops {
        let t = Nanos::from_millis(now);
        match op {
            Op::Advance(ms) => now += ms,
            Op::Decide { key: k, ttl } => {
                let got = table.decide_one(&key(*k), &limit, t, |_, until| {
                    let prev = *until;
                    *until = now + ttl;
                    (prev, Effect::after(*ttl == 0))
                });
                prop_assert_eq!(kind(got), kind(model.decide(*k, *ttl, now)), "{:?}", op);
            }
            Op::Refuse { key: k } => {
                let got =
                    table.decide_one(&key(*k), &limit, t, |_, until| (*until, Effect::Untouched));
                let want = model.map.get(k).copied().unwrap_or(0);
                prop_assert_eq!(got, Ok(want), "{:?}", op);
            }
            Op::Many { keys, fail } => {
                let mut plan = Plan::default();
                for (k, _) in keys {
                    plan.push(key(*k), Arc::clone(&limit), false).unwrap();
                }
                let got = table.decide_many(&plan, t, |states| {
                    if *fail {
                        return Err(StoreError::Unsupported("fail".into()));
                    }
                    let prev = states.to_vec();
                    for (state, (_, ttl)) in states.iter_mut().zip(keys) {
                        *state = now + ttl;
                    }
                    Ok(prev)
                });
                prop_assert_eq!(kind(got), kind(model.many(keys, *fail, now)), "{:?}", op);
            }
            Op::Update { key: k, ttl } => {
                let got = table.update(&key(*k), &limit, t, |until, present| {
                    let prev = *until;
                    *until = now + ttl;
                    ((prev, present), Effect::after(*ttl == 0))
                });
                prop_assert_eq!(got, model.update(*k, *ttl, now), "{:?}", op);
            }
            Op::Remove { key: k } => {
                prop_assert_eq!(table.remove(&key(*k)), model.map.remove(k), "{:?}", op);
            }
            Op::Sweep => {
                prop_assert_eq!(table.sweep(t), model.sweep(now), "{:?}", op);
            }
            Op::Read { key: k } => {
                let got = table.with_stored(&key(*k), |_, until| *until);
                prop_assert_eq!(got, model.map.get(k).copied(), "{:?}", op);
            }
        }
        let mut held = HashMap::new();
        table.for_each(|k, l, until| {
            assert!(Arc::ptr_eq(l, &limit));
            held.insert(k.clone(), *until);
        });
        let want: HashMap<Key, u64> = model.map.iter().map(|(k, v)| (key(*k), *v)).collect();
        prop_assert_eq!(&held, &want, "after {:?}", op);
        let stats = table.stats();
        prop_assert_eq!(stats.keys, model.map.len());
        prop_assert_eq!(stats.untracked_decisions, model.untracked, "after {:?}", op);
        prop_assert_eq!(stats.rejected_at_capacity, model.rejected, "after {:?}", op);
        prop_assert_eq!(stats.swept, model.swept, "after {:?}", op);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// One shard: the capacity rule (sweep when full, at most once per
    /// interval; then untracked or refused) is exactly the model's.
    #[test]
    fn one_shard_behaves_as_the_model(
        cap in 1usize..6,
        reject in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        run(1, cap, reject, &ops)?;
    }

    /// Several shards and no bound: plans over keys of several shards
    /// take, decide and put back exactly what the model does.
    #[test]
    fn many_shards_behave_as_the_model(
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        run(8, usize::MAX / 2, false, &ops)?;
    }
}
