#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The replicated store's bookkeeping, without a network: what goes into
//! which neighbour's delta (thesis §3.1, §4.2), eager pushes (§4.2.3),
//! least-informed-neighbour-first (§4.2.4), overflow, the epoch pull, and
//! dropping idle keys only after the retention margin.

use std::net::SocketAddr;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use tollgate_core::replicated::strategy::{Eager, Payload, Replication, StrategyKind};
use tollgate_core::replicated::NodeId;
use tollgate_core::{Hits, Limit, Mode, Nanos, Rate, TokenBucket};
use tollgate_replica::{Class, Dissemination, Replica, ReplicaOptions, Round};
use tollgate_store::{Key, LimitId, Plan};

const T0: Nanos = Nanos::from_secs(1_800_000_000);
const LIMIT: LimitId = LimitId(11);

fn peer(n: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], n))
}

/// A replica that disseminates as the thesis does (most tests here are of
/// the thesis's bookkeeping); [`origin`] makes one of tollgate's default.
fn replica(node: u64, max_delta_keys: usize) -> Replica {
    let r = Replica::new(ReplicaOptions {
        node: NodeId(node),
        max_delta_keys,
        dissemination: Dissemination::Epidemic,
        ..ReplicaOptions::default()
    });
    r.set_synced(true);
    r
}

fn plan(r: &Replica, how: &Replication, capacity: u64, domain: &str) -> Plan {
    let tb = TokenBucket::new(capacity, Rate::new(1, Nanos::from_secs(1)).unwrap()).unwrap();
    let limit = r.prepare_limit(Limit::TokenBucket(tb), Some(how)).unwrap();
    let limit = Arc::new(limit);
    // As a config put in force does (`Store::serve_limits`).
    r.register(LIMIT, Arc::clone(&limit));
    Plan::single(Key::new(LIMIT, domain), limit)
}

fn class(how: &Replication) -> Class {
    Class {
        interval: how.gossip_interval,
        least_informed: how.least_informed,
        everyone: how.strategy == StrategyKind::Epoch,
    }
}

/// Every round of `class` until nothing is left, by peer.
fn drain(r: &Replica, class: Class, now: Nanos) -> Vec<(SocketAddr, Vec<(Key, Payload)>)> {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut out = Vec::new();
    for _ in 0..64 {
        for round in r.take_round(class, now, &mut rng) {
            match round {
                Round::Delta(p, items) => out.push((p, items)),
                Round::Resync(p) => out.push((p, Vec::new())),
            }
        }
    }
    out
}

/// The thesis's queue: no frequency analysis, no near-limit push.
fn plain_queue() -> Replication {
    Replication {
        eager: None,
        near_limit: false,
        ..Replication::new(StrategyKind::Queue)
    }
}

#[test]
fn a_local_grant_goes_to_every_neighbour_and_a_merged_change_never_back_to_its_sender() {
    let how = plain_queue();
    let sender = replica(2, 1000);
    let p = plan(&sender, &how, 10, "u");
    sender.set_synced(true);
    sender
        .decide_now(&p, T0, Hits::exactly(3), Mode::Try)
        .unwrap();
    // What node 2 would send: the full state of its key.
    let items = sender.full_state(T0);
    assert_eq!(items.len(), 1);

    let r = replica(1, 1000);
    plan(&r, &how, 10, "u");
    for n in [1, 2, 3] {
        r.add_peer(peer(n));
    }
    assert_eq!(r.absorb(peer(2), NodeId(2), items.clone(), T0).merged, 1);
    let sent = drain(&r, class(&how), T0);
    let to: Vec<SocketAddr> = sent.iter().map(|(p, _)| *p).collect();
    assert!(to.contains(&peer(1)) && to.contains(&peer(3)), "{to:?}");
    assert!(!to.contains(&peer(2)), "echoed to its sender: {to:?}");
    // Receiving it again changes nothing and forwards nothing.
    assert_eq!(r.absorb(peer(2), NodeId(2), items, T0).merged, 0);
    assert!(drain(&r, class(&how), T0).is_empty());

    // A local grant goes to all three.
    let p = plan(&r, &how, 10, "u");
    r.decide_now(&p, T0, Hits::exactly(1), Mode::Try).unwrap();
    let mut to: Vec<SocketAddr> = drain(&r, class(&how), T0).iter().map(|(p, _)| *p).collect();
    to.sort();
    assert_eq!(to, vec![peer(1), peer(2), peer(3)]);
}

#[test]
fn a_frequent_key_is_pushed_at_once_when_its_window_fills() {
    let how = Replication {
        eager: Some(Eager {
            window: Some(3),
            threshold: Nanos::from_millis(100),
        }),
        ..Replication::new(StrategyKind::Queue)
    };
    let r = replica(1, 1000);
    r.add_peer(peer(2));
    let p = plan(&r, &how, 10, "hot");
    // Two grants 50 ms apart: below the window, nothing urgent.
    for i in 0..2 {
        let at = T0.saturating_add(Nanos::from_millis(50 * i));
        r.decide_now(&p, at, Hits::exactly(1), Mode::Try).unwrap();
    }
    assert!(r.take_urgent().is_empty());
    // The third fills the window at an average gap under 100 ms.
    r.decide_now(
        &p,
        T0.saturating_add(Nanos::from_millis(100)),
        Hits::exactly(1),
        Mode::Try,
    )
    .unwrap();
    let urgent = r.take_urgent();
    assert_eq!(urgent.len(), 1);
    let (to, items) = &urgent[0];
    assert_eq!(*to, peer(2));
    assert_eq!(items[0].1.updates(), 3, "the whole window goes");
    assert_eq!(
        r.stats
            .eager_pushes
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // ... and it left the delta: the next round has nothing.
    assert!(drain(&r, class(&how), T0).is_empty());

    // Slow grants (a second apart) never trigger it.
    let slow = replica(1, 1000);
    slow.add_peer(peer(2));
    let p = plan(&slow, &how, 10, "slow");
    for i in 0..5 {
        let at = T0.saturating_add(Nanos::from_secs(i));
        slow.decide_now(&p, at, Hits::exactly(1), Mode::Try)
            .unwrap();
    }
    assert!(slow.take_urgent().is_empty());
}

#[test]
fn least_informed_first_picks_the_neighbour_with_most_updates_queued() {
    let how = Replication {
        eager: None,
        least_informed: true,
        near_limit: false,
        ..Replication::new(StrategyKind::Queue)
    };
    // Node 2 sent four elements: peers 1 and 3 get them, not 2. Then one
    // local grant goes to all three: 1 and 3 have 5 queued, 2 has 1.
    let sender = replica(2, 1000);
    let p = plan(&sender, &how, 10, "u");
    sender
        .decide_now(&p, T0, Hits::exactly(4), Mode::Try)
        .unwrap();
    let r = replica(1, 1000);
    plan(&r, &how, 10, "u");
    for n in [1, 2, 3] {
        r.add_peer(peer(n));
    }
    r.absorb(peer(2), NodeId(2), sender.full_state(T0), T0);
    let p = plan(&r, &how, 10, "u");
    r.decide_now(&p, T0, Hits::exactly(1), Mode::Try).unwrap();
    let mut rng = SmallRng::seed_from_u64(7);
    let first = r.take_round(class(&how), T0, &mut rng);
    let second = r.take_round(class(&how), T0, &mut rng);
    let third = r.take_round(class(&how), T0, &mut rng);
    let peer_of = |rounds: &[Round]| match &rounds[0] {
        Round::Delta(p, _) | Round::Resync(p) => *p,
    };
    let mut best_two = [peer_of(&first), peer_of(&second)];
    best_two.sort();
    assert_eq!(best_two, [peer(1), peer(3)], "the two least informed first");
    assert_eq!(peer_of(&third), peer(2));
}

#[test]
fn least_informed_first_never_picks_a_neighbour_it_has_nothing_for() {
    // Two limits gossiped in two classes (300 ms and 500 ms rounds). In
    // the 500 ms rounds, peer 1 looks the least informed (four 300 ms
    // updates queued) but has nothing of this class waiting: picking it
    // would send nothing, round after round, and peer 3 would never hear
    // of the 500 ms update.
    let fast = Replication {
        eager: None,
        least_informed: true,
        near_limit: false,
        ..Replication::new(StrategyKind::Queue)
    };
    let slow = Replication {
        gossip_interval: Nanos::from_millis(500),
        ..fast
    };
    let tb = TokenBucket::new(10, Rate::new(1, Nanos::from_secs(1)).unwrap()).unwrap();
    let register = |r: &Replica, id: LimitId, how: &Replication| {
        let limit = Arc::new(
            r.prepare_limit(Limit::TokenBucket(tb.clone()), Some(how))
                .unwrap(),
        );
        r.register(id, Arc::clone(&limit));
        Plan::single(Key::new(id, "u"), limit)
    };
    let state_of = |id: LimitId, how: &Replication, hits: u64| {
        let s = replica(9, 1000);
        let p = register(&s, id, how);
        s.decide_now(&p, T0, Hits::exactly(hits), Mode::Try)
            .unwrap();
        s.full_state(T0)
    };
    let slow_limit = LimitId(12);
    let r = replica(1, 1000);
    register(&r, LIMIT, &fast);
    register(&r, slow_limit, &slow);
    for n in [1, 2, 3] {
        r.add_peer(peer(n));
    }
    // From peer 3, four fast elements: queued for peers 1 and 2. From
    // peer 1, one slow element: queued for peers 2 and 3.
    r.absorb(peer(3), NodeId(3), state_of(LIMIT, &fast, 4), T0);
    r.absorb(peer(1), NodeId(1), state_of(slow_limit, &slow, 1), T0);
    let sent = drain(&r, class(&slow), T0);
    let mut to: Vec<SocketAddr> = sent.iter().map(|(p, _)| *p).collect();
    to.sort();
    assert_eq!(to, vec![peer(2), peer(3)]);
    assert!(sent
        .iter()
        .all(|(_, items)| items.iter().all(|(k, _)| k.limit == slow_limit)));
    // The fast updates still wait for their own rounds.
    assert_eq!(r.delta_sizes(), (2, 8));
}

#[test]
fn an_overflowing_delta_becomes_a_full_state_resync() {
    let how = plain_queue();
    let r = replica(1, 2);
    r.add_peer(peer(2));
    for d in ["a", "b", "c"] {
        let p = plan(&r, &how, 10, d);
        r.decide_now(&p, T0, Hits::exactly(1), Mode::Try).unwrap();
    }
    let mut rng = SmallRng::seed_from_u64(1);
    let rounds = r.take_round(class(&how), T0, &mut rng);
    assert!(
        matches!(rounds.as_slice(), [Round::Resync(p)] if *p == peer(2)),
        "{rounds:?}"
    );
    assert_eq!(
        r.stats.resyncs.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(r.full_state(T0).len(), 3, "the full state has every key");
}

#[test]
fn an_epoch_report_missing_what_this_node_knows_is_answered() {
    let how = Replication::new(StrategyKind::Epoch);
    let a = replica(1, 1000);
    let b = replica(2, 1000);
    a.add_peer(peer(2));
    b.add_peer(peer(1));
    let pa = plan(&a, &how, 10, "e");
    let pb = plan(&b, &how, 10, "e");
    a.decide_now(&pa, T0, Hits::exactly(2), Mode::Try).unwrap();
    b.decide_now(&pb, T0, Hits::exactly(3), Mode::Try).unwrap();
    // The next epoch: both commit and report.
    let t1 = T0.saturating_add(Nanos::from_secs(1));
    let from_a = drain(&a, class(&how), t1);
    assert_eq!(from_a.len(), 1);
    let (to, items) = from_a.into_iter().next().unwrap();
    assert_eq!(to, peer(2));
    // b merges a's report and, since a's lacks b's own entry, answers.
    b.absorb(peer(1), NodeId(1), items, t1);
    let answer = b.take_urgent();
    assert_eq!(answer.len(), 1, "{answer:?}");
    assert_eq!(answer[0].0, peer(1));
    a.absorb(peer(2), NodeId(2), answer[0].1.clone(), t1);
    // Each subtracted the other's traffic, and a second refilled one
    // token: 10 − 2 − 3 + 1 = 6 on both.
    for (r, p) in [(&a, &pa), (&b, &pb)] {
        let left = r
            .decide_now(p, t1, Hits::exactly(0), Mode::Try)
            .unwrap()
            .decisions[0]
            .remaining;
        assert_eq!(left, 6);
    }
}

#[test]
fn an_idle_key_is_dropped_only_after_the_retention_margin() {
    let how = Replication::new(StrategyKind::Counter);
    let r = replica(1, 1000);
    let p = plan(&r, &how, 2, "idle");
    r.decide_now(&p, T0, Hits::exactly(2), Mode::Try).unwrap();
    assert_eq!(r.keys(), 1);
    // Full again 2 s later (1 token a second); the margin is 3 s (ten
    // gossip intervals of 300 ms).
    let full = T0.saturating_add(Nanos::from_secs(2));
    r.sweep_now(full.saturating_add(Nanos::from_secs(1)));
    assert_eq!(r.keys(), 1, "dropped before the margin");
    r.sweep_now(full.saturating_add(how.retention_margin()));
    assert_eq!(r.keys(), 0);
}

#[test]
fn a_swept_key_is_not_brought_back_by_late_news_past_its_margin() {
    // A node's late delta carries a state every replica is about to
    // forget. A node that already forgot it must not adopt it and send it
    // on: in a large cluster, where a delta waits many rounds for its
    // neighbour, that restarted the key's gossip over and over.
    let how = Replication::new(StrategyKind::Counter);
    let sender = replica(2, 1000);
    let p = plan(&sender, &how, 2, "late");
    sender
        .decide_now(&p, T0, Hits::exactly(2), Mode::Try)
        .unwrap();
    let news = sender.full_state(T0);
    let full = T0.saturating_add(Nanos::from_secs(2));
    let expired = full.saturating_add(how.retention_margin());

    let r = replica(1, 1000);
    plan(&r, &how, 2, "other");
    r.add_peer(peer(2));
    r.add_peer(peer(3));
    assert_eq!(
        r.absorb(peer(2), NodeId(2), news.clone(), expired).merged,
        0
    );
    assert_eq!(r.keys(), 0);
    assert!(drain(&r, class(&how), expired).is_empty());
    // Before the margin has passed, the same news is adopted and passed
    // on.
    let within = full.saturating_add(Nanos::from_secs(1));
    assert_eq!(r.absorb(peer(2), NodeId(2), news, within).merged, 1);
    assert_eq!(r.keys(), 1);
    let to: Vec<SocketAddr> = drain(&r, class(&how), within)
        .iter()
        .map(|(p, _)| *p)
        .collect();
    assert_eq!(to, vec![peer(3)]);
}

#[test]
fn a_peek_or_a_rejection_gossips_nothing() {
    for how in [Replication::new(StrategyKind::Counter), plain_queue()] {
        let r = replica(1, 1000);
        r.add_peer(peer(2));
        let p = plan(&r, &how, 1, "u");
        r.decide_now(&p, T0, Hits::exactly(1), Mode::Try).unwrap();
        assert_eq!(drain(&r, class(&how), T0).len(), 1, "{how:?}: the grant");
        let peek = r.decide_now(&p, T0, Hits::exactly(0), Mode::Try).unwrap();
        assert_eq!(peek.granted, 0);
        let rejected = r.decide_now(&p, T0, Hits::exactly(1), Mode::Try).unwrap();
        assert!(!rejected.allowed);
        assert!(drain(&r, class(&how), T0).is_empty(), "{how:?}");
    }
}

#[test]
fn a_plan_of_several_keys_is_all_or_nothing_and_gossips_only_what_it_granted() {
    let how = Replication::new(StrategyKind::Counter);
    let r = replica(1, 1000);
    r.add_peer(peer(2));
    let one = plan(&r, &how, 1, "a");
    let ten = plan(&r, &how, 10, "b");
    let mut both = Plan::default();
    for p in [&one, &ten] {
        let item = &p.items()[0];
        both.push(item.key.clone(), Arc::clone(&item.limit), false)
            .unwrap();
    }
    let first = r
        .decide_now(&both, T0, Hits::exactly(1), Mode::Try)
        .unwrap();
    assert!(first.allowed);
    let sent = drain(&r, class(&how), T0);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1.len(), 2, "both keys changed");
    // "a" is spent: the plan is refused, and "b" keeps its 9.
    let second = r
        .decide_now(&both, T0, Hits::exactly(1), Mode::Try)
        .unwrap();
    assert!(!second.allowed);
    assert!(drain(&r, class(&how), T0).is_empty());
    let b = r.decide_now(&ten, T0, Hits::exactly(0), Mode::Try).unwrap();
    assert_eq!(b.decisions[0].remaining, 9);
}

/// A late delta carrying an element dead for longer than the retention
/// margin is merged away at once and not passed on: otherwise it would go
/// round the cluster for ever, every node taking it back and pruning it.
#[test]
fn an_element_past_its_margin_is_not_passed_on() {
    let how = plain_queue();
    let sender = replica(2, 1000);
    let p = plan(&sender, &how, 10, "old");
    sender
        .decide_now(&p, T0, Hits::exactly(1), Mode::Try)
        .unwrap();
    let items = sender.full_state(T0);
    let r = replica(1, 1000);
    plan(&r, &how, 10, "old");
    r.add_peer(peer(1));
    r.add_peer(peer(3));
    let late = T0.saturating_add(Nanos::from_secs(3600));
    assert_eq!(r.absorb(peer(2), NodeId(2), items.clone(), late).merged, 0);
    assert!(drain(&r, class(&how), late).is_empty());
    assert_eq!(r.keys(), 0);
    // While it is still within the margin, it is news.
    assert_eq!(r.absorb(peer(2), NodeId(2), items, T0).merged, 1);
}

/// A replica of tollgate's default dissemination.
fn origin(node: u64) -> Replica {
    let r = Replica::new(ReplicaOptions {
        node: NodeId(node),
        max_delta_keys: 1000,
        dissemination: Dissemination::Origin,
        ..ReplicaOptions::default()
    });
    r.set_synced(true);
    r
}

/// What node `node` sends after granting `hits` on a fresh key at `at`.
fn granted_by(node: u64, how: &Replication, hits: u64, at: Nanos) -> Vec<(Key, Payload)> {
    let r = origin(node);
    let p = plan(&r, how, 100, "u");
    r.decide_now(&p, at, Hits::exactly(hits), Mode::Try)
        .unwrap();
    r.full_state(at)
}

#[test]
fn under_origin_dissemination_a_round_ships_every_neighbour_its_delta_and_learnt_news_stays() {
    let how = plain_queue();
    let r = origin(1);
    let p = plan(&r, &how, 100, "u");
    for n in [2, 3, 4] {
        r.add_peer(peer(n));
    }
    r.decide_now(&p, T0, Hits::exactly(2), Mode::Try).unwrap();
    // One round, every neighbour: not one at random.
    let mut rng = SmallRng::seed_from_u64(1);
    let mut to: Vec<SocketAddr> = r
        .take_round(class(&how), T0, &mut rng)
        .into_iter()
        .map(|round| match round {
            Round::Delta(p, items) => {
                assert_eq!(items.len(), 1);
                p
            }
            Round::Resync(p) => panic!("resync to {p}"),
        })
        .collect();
    to.sort();
    assert_eq!(to, vec![peer(2), peer(3), peer(4)]);

    // News from node 2 is merged and passed on to nobody: its origin
    // sent it to every node itself.
    let news = granted_by(2, &how, 3, T0);
    let absorbed = r.absorb(peer(2), NodeId(2), news, T0);
    assert_eq!(absorbed.merged, 1);
    assert!(
        absorbed.relayed.is_empty(),
        "node 2's own news is not a relay"
    );
    assert!(drain(&r, class(&how), T0).is_empty());
    assert_eq!(r.delta_sizes(), (0, 0));
}

#[test]
fn a_grafted_peer_hears_what_this_node_learns_until_the_graft_lapses() {
    let how = plain_queue();
    let r = origin(1);
    plan(&r, &how, 100, "u");
    for n in [2, 3, 4] {
        r.add_peer(peer(n));
    }
    let until = T0.saturating_add(Nanos::from_secs(60));
    assert!(r.graft(peer(3), &[], T0, until), "a new relay");
    assert!(!r.graft(peer(3), &[], T0, until), "a renewal");
    assert!(r.relays_to(peer(3), T0) && !r.relays_to(peer(4), T0));
    r.absorb(peer(2), NodeId(2), granted_by(2, &how, 1, T0), T0);
    let sent = drain(&r, class(&how), T0);
    let to: Vec<SocketAddr> = sent.iter().map(|(p, _)| *p).collect();
    assert_eq!(to, vec![peer(3)], "relayed only to the peer that grafted");

    // Past the graft, learnt news stays here again.
    let later = until.saturating_add(Nanos::SECOND);
    assert!(!r.relays_to(peer(3), later));
    r.absorb(peer(2), NodeId(2), granted_by(2, &how, 2, later), later);
    assert!(drain(&r, class(&how), later).is_empty());
}

#[test]
fn news_from_a_third_node_is_reported_as_relayed_and_as_late_once_settled() {
    let how = plain_queue();
    let settle = tollgate_replica::replica::settle_time(class(&how));
    let r = origin(1);
    plan(&r, &how, 100, "u");
    // Node 3's grant, passed on by node 2 at once: relayed, not late.
    let fresh = granted_by(3, &how, 1, T0);
    let absorbed = r.absorb(peer(2), NodeId(2), fresh.clone(), T0);
    assert_eq!(absorbed.relayed, vec![NodeId(3)], "{absorbed:?}");
    assert!(absorbed.late.is_empty(), "{absorbed:?}");
    // The same again changes nothing: no news at all.
    let again = r.absorb(peer(2), NodeId(2), fresh, T0);
    assert!(again.relayed.is_empty() && again.merged == 0, "{again:?}");
    // Node 4's grant, arriving a settle time after it was made: the way
    // from node 4 to here is broken.
    let old = granted_by(4, &how, 1, T0);
    let late = T0.saturating_add(settle);
    let absorbed = r.absorb(peer(2), NodeId(2), old, late);
    assert_eq!(absorbed.relayed, vec![NodeId(4)], "{absorbed:?}");
    assert_eq!(absorbed.late, vec![NodeId(4)], "{absorbed:?}");
}

#[test]
fn digests_agree_on_settled_state_and_name_the_buckets_that_differ() {
    let how = plain_queue();
    let settle = tollgate_replica::replica::settle_time(class(&how));
    let a = origin(1);
    let b = origin(2);
    let pa = plan(&a, &how, 100, "u");
    plan(&b, &how, 100, "u");
    plan(&a, &how, 100, "v");
    plan(&b, &how, 100, "v");
    let later = T0.saturating_add(settle).saturating_add(Nanos::SECOND);
    // Nothing held: equal, empty digests.
    assert_eq!(a.digest(later).differs(&b.digest(later)), 0);

    // A grant on a that b has merged: the digests agree.
    a.decide_now(&pa, T0, Hits::exactly(2), Mode::Try).unwrap();
    b.absorb(peer(1), NodeId(1), a.full_state(T0), T0);
    assert_eq!(a.digest(later).differs(&b.digest(later)), 0);

    // A grant b never heard of, older than the settle time: the digests
    // differ in exactly the key's bucket, and that bucket's items carry
    // it; merged, they agree again.
    a.decide_now(
        &pa,
        T0.saturating_add(Nanos::SECOND),
        Hits::exactly(1),
        Mode::Try,
    )
    .unwrap();
    let differ = a.digest(later).differs(&b.digest(later));
    let bucket = tollgate_replica::digest::bucket_of(&Key::new(LIMIT, "u"));
    assert_eq!(differ, 1 << bucket);
    let items = a.items_in(differ, later);
    assert!(items.iter().any(|(k, _)| *k == Key::new(LIMIT, "u")));
    assert!(b.absorb(peer(1), NodeId(1), items, later).merged > 0);
    assert_eq!(a.digest(later).differs(&b.digest(later)), 0);

    // A grant still within the settle time is on its way, not a gap: the
    // digest leaves it out.
    a.decide_now(&pa, later, Hits::exactly(1), Mode::Try)
        .unwrap();
    assert_eq!(a.digest(later).differs(&b.digest(later)), 0);
}

#[test]
fn a_relay_passes_on_only_the_updates_of_nodes_the_asker_does_not_hear() {
    let how = plain_queue();
    let r = origin(1);
    plan(&r, &how, 100, "u");
    for n in [2, 3] {
        r.add_peer(peer(n));
    }
    let until = T0.saturating_add(Nanos::from_secs(60));
    // Peer 3 (node 3) hears nodes 1, 3 and 4 itself, not node 5.
    r.graft(peer(3), &[NodeId(1), NodeId(3), NodeId(4)], T0, until);
    let mut mixed = granted_by(4, &how, 2, T0);
    let from_5 = granted_by(5, &how, 3, T0);
    let (Payload::Queue(a), Payload::Queue(b)) = (&mut mixed[0].1, &from_5[0].1) else {
        panic!("queues");
    };
    a.merge(b);
    assert_eq!(a.len(), 5);
    r.absorb(peer(2), NodeId(2), mixed, T0);
    let sent = drain(&r, class(&how), T0);
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (to, items) = &sent[0];
    assert_eq!(*to, peer(3));
    let Payload::Queue(q) = &items[0].1 else {
        panic!("a queue");
    };
    assert_eq!(q.len(), 3, "only node 5's elements: {q:?}");
    assert!(q.elements().all(|e| e.id.node == NodeId(5)));
    // News only from nodes it hears goes nowhere (a second key, so no
    // death of node 5's elements moves).
    let later = T0.saturating_add(Nanos::SECOND);
    r.absorb(peer(2), NodeId(2), granted_by(4, &how, 4, later), later);
    assert!(drain(&r, class(&how), later).is_empty());
    // Its latest request replaces the last: now it hears only itself.
    r.graft(peer(3), &[NodeId(3)], later, until);
    let latest = later.saturating_add(Nanos::SECOND);
    r.absorb(peer(2), NodeId(2), granted_by(4, &how, 6, latest), latest);
    assert_eq!(drain(&r, class(&how), latest).len(), 1);
}

/// Regression (review of issue 18's gossip usage): a refund raises a
/// counter's limit without naming the refunding node in the token
/// counter, so a relay that passed on only counters naming a node the
/// grafted peer does not hear dropped it whenever the bucket's entries
/// were all of nodes the peer hears: the peer kept the lower limit (and
/// refused what the refund gave back) until anti-entropy.
#[test]
fn a_relay_passes_on_a_refund_of_a_node_the_asker_does_not_hear() {
    let how = Replication::new(StrategyKind::Counter);
    let r = origin(1);
    plan(&r, &how, 100, "u");
    for n in [2, 3] {
        r.add_peer(peer(n));
    }
    let until = T0.saturating_add(Nanos::from_secs(60));
    // Peer 3 (node 3) hears nodes 1, 3 and 4 itself, not node 5.
    r.graft(peer(3), &[NodeId(1), NodeId(3), NodeId(4)], T0, until);
    // Node 4 granted (peer 3 hears that itself); the relay learns it.
    let by_4 = granted_by(4, &how, 5, T0);
    r.absorb(peer(2), NodeId(4), by_4.clone(), T0);
    drain(&r, class(&how), T0);
    // Node 5 (which peer 3 does not hear) refunds three on that state.
    let five = origin(5);
    let p5 = plan(&five, &how, 100, "u");
    five.absorb(peer(4), NodeId(4), by_4, T0);
    let d = five
        .decide_now(&p5, T0, Hits::exactly(3), Mode::Refund)
        .unwrap();
    assert_eq!(d.granted, 3);
    r.absorb(peer(2), NodeId(5), five.full_state(T0), T0);
    let sent = drain(&r, class(&how), T0);
    let to_3: Vec<_> = sent.iter().filter(|(to, _)| *to == peer(3)).collect();
    assert_eq!(to_3.len(), 1, "the refund is relayed to peer 3: {sent:?}");
    let Payload::Counter(c) = &to_3[0].1[0].1 else {
        panic!("a counter");
    };
    assert_eq!(c.limit(), 103, "{c:?}");
}

/// Regression (review of issue 18's gossip reset): a state from before a
/// reset merges as nothing, yet its third nodes' elements were counted
/// as relayed (and late) news, so a peer that missed the reset made this
/// node graft it, and keep the relay going, on news it ignored.
#[test]
fn a_state_from_before_a_reset_is_no_relayed_news() {
    let how = plain_queue();
    let r = origin(1);
    let p = plan(&r, &how, 100, "u");
    r.add_peer(peer(2));
    let old = granted_by(3, &how, 4, T0);
    r.reset_now(&p, T0).unwrap();
    let later = T0.saturating_add(Nanos::from_secs(30));
    let absorbed = r.absorb(peer(2), NodeId(2), old, later);
    assert_eq!(absorbed.merged, 0);
    assert!(absorbed.relayed.is_empty(), "{absorbed:?}");
    assert!(absorbed.late.is_empty(), "{absorbed:?}");
}

/// The replica keeps its keys in the store's keyed-state table, under the
/// memory store's capacity rule: `max_keys` holds per shard under the
/// shard's lock, grants beyond it are decided on a state not kept (and
/// counted), and a full shard first sweeps its expired keys. The replica's
/// own copy used to count keys globally and never swept at the cap: once
/// full, it kept every new key untracked until the next timed sweep, even
/// with every key it held long expired.
#[test]
fn at_max_keys_new_grants_are_not_kept_until_expired_keys_make_room() {
    const MAX: usize = 64;
    let r = Replica::new(ReplicaOptions {
        node: NodeId(1),
        max_keys: MAX,
        ..ReplicaOptions::default()
    });
    r.set_synced(true);
    let how = plain_queue();
    let domains = |tag: &'static str| (0..400).map(move |i| format!("{tag}-{i}"));
    for d in domains("first") {
        let p = plan(&r, &how, 10, &d);
        let decision = r.decide_now(&p, T0, Hits::exactly(1), Mode::Try).unwrap();
        assert!(decision.allowed, "{d}: a fresh key grants");
    }
    let kept = r.keys();
    assert!(
        kept > 0 && kept <= MAX as u64,
        "{kept} keys kept, cap {MAX}"
    );
    let untracked = r
        .stats
        .at_capacity
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(untracked, 400 - kept, "every grant not kept is counted");

    // An hour on, every key held is long past its retention margin, and no
    // timed sweep ran: a new grant finds its shard full of expired keys,
    // sweeps it, and is kept.
    let later = T0.saturating_add(Nanos::from_secs(3600));
    for d in domains("second") {
        let p = plan(&r, &how, 10, &d);
        r.decide_now(&p, later, Hits::exactly(1), Mode::Try)
            .unwrap();
    }
    let fresh = domains("second")
        .filter(|d| r.state_of(&Key::new(LIMIT, d)).is_some())
        .count();
    assert!(fresh > 0, "no new grant was kept");
    assert!(r.keys() <= MAX as u64, "{} keys kept, cap {MAX}", r.keys());
}

/// Issue 18, item 5: inspecting a key on a node answers this node's view
/// (its grants and its peers' merged so far) as a request of zero hits
/// would be answered, and changes nothing: no key is created for a domain
/// never seen, and nothing is queued for gossip.
#[test]
fn inspect_reads_the_local_view_and_creates_and_gossips_nothing() {
    for how in [
        plain_queue(),
        Replication::new(StrategyKind::Counter),
        Replication::new(StrategyKind::Epoch),
    ] {
        let r = replica(1, 100);
        r.add_peer(peer(2));
        let p = plan(&r, &how, 5, "acme");
        for _ in 0..3 {
            let d = r.decide_now(&p, T0, Hits::exactly(1), Mode::Try).unwrap();
            assert!(d.allowed, "{how:?}");
        }
        drain(&r, class(&how), T0);
        let keys = r.keys();
        let seen = r.inspect_now(&p, T0).unwrap();
        assert_eq!(seen.decisions[0].remaining, 2, "{how:?}");
        assert!(seen.allowed);
        assert!(
            drain(&r, class(&how), T0)
                .iter()
                .all(|(_, items)| items.is_empty()),
            "{how:?}: inspecting queued gossip"
        );
        let never = Plan::single(
            Key::new(LIMIT, "never-seen"),
            Arc::clone(&p.items()[0].limit),
        );
        let fresh = r.inspect_now(&never, T0).unwrap();
        assert_eq!(fresh.decisions[0].remaining, 5, "{how:?}");
        assert_eq!(r.keys(), keys, "{how:?}: inspecting created a key");
    }
}

/// Usage after the fact in a gossip cluster (issue 18, item 3): on a
/// counter-replicated limit a report (past the limit, into debt) and a
/// refund (a raised limit, no grant) are both news for every neighbour,
/// as a grant is, and the peer that merges them decides by them. A
/// queue-replicated limit refuses both, changing nothing.
#[test]
fn reports_and_refunds_are_gossiped_like_grants_on_a_counter() {
    use tollgate_core::PlanError;
    use tollgate_store::StoreError;
    let how = Replication::new(StrategyKind::Counter);
    let a = replica(1, 1000);
    let b = replica(2, 1000);
    a.add_peer(peer(2));
    b.add_peer(peer(1));
    let pa = plan(&a, &how, 5, "u");
    let pb = plan(&b, &how, 5, "u");
    let gossip = |from: &Replica, node: u64, to: &Replica| {
        for (_, items) in drain(from, class(&how), T0) {
            to.absorb(peer(node as u16), NodeId(node), items, T0);
        }
    };
    let d = a
        .decide_now(&pa, T0, Hits::exactly(8), Mode::Report)
        .unwrap();
    assert_eq!((d.granted, d.allowed), (8, true));
    gossip(&a, 1, &b);
    // Three owed: node 2 grants nothing, and may report two more (the
    // debt bound is one capacity).
    assert!(
        !b.decide_now(&pb, T0, Hits::exactly(1), Mode::Try)
            .unwrap()
            .allowed
    );
    let d = b
        .decide_now(&pb, T0, Hits::exactly(9), Mode::Report)
        .unwrap();
    assert_eq!(d.granted, 2);
    gossip(&b, 2, &a);
    // A refund on node 2 gives back the ten below full; node 1 hears it.
    let d = b
        .decide_now(&pb, T0, Hits::exactly(20), Mode::Refund)
        .unwrap();
    assert_eq!(d.granted, 10);
    gossip(&b, 2, &a);
    let seen = a.inspect_now(&pa, T0).unwrap();
    assert_eq!(seen.decisions[0].remaining, 5);

    let q = plain_queue();
    let pq = plan(&a, &q, 5, "q");
    for mode in [Mode::Report, Mode::Refund] {
        match a.decide_now(&pq, T0, Hits::exactly(1), mode) {
            Err(StoreError::Plan(PlanError::NoUsage { algorithm, .. })) => {
                assert_eq!(algorithm, "replicated_queue");
            }
            other => panic!("{mode:?} on a queue: {other:?}"),
        }
    }
    assert_eq!(a.inspect_now(&pq, T0).unwrap().decisions[0].remaining, 5);
}

/// Items asked hits of their own (Envoy descriptors with their own
/// `hits_addend`) are decided all or nothing on a replica too, each
/// charged its own; a one-item plan asked its own takes them, not the
/// request's.
#[test]
fn items_asked_hits_of_their_own_are_each_charged_them_all_or_nothing() {
    let how = Replication::new(StrategyKind::Counter);
    let r = replica(1, 1000);
    let five = plan(&r, &how, 5, "a");
    let ten = plan(&r, &how, 10, "b");
    let both = |a: u64, b: u64| {
        let mut p = Plan::default();
        for q in [&five, &ten] {
            let item = &q.items()[0];
            p.push(item.key.clone(), Arc::clone(&item.limit), false)
                .unwrap();
        }
        p.ask(0, a);
        p.ask(1, b);
        p
    };
    let left = |p: &Plan| {
        r.decide_now(p, T0, Hits::exactly(0), Mode::Try)
            .unwrap()
            .decisions[0]
            .remaining
    };
    let d = r
        .decide_now(&both(2, 7), T0, Hits::exactly(1), Mode::Try)
        .unwrap();
    assert!(d.allowed);
    let granted: Vec<u64> = d.decisions.iter().map(|d| d.granted).collect();
    assert_eq!(granted, [2, 7]);
    // 4 do not fit in a's 3: b is not charged its 1 either.
    let d = r
        .decide_now(&both(4, 1), T0, Hits::exactly(1), Mode::Try)
        .unwrap();
    assert!(!d.allowed);
    assert_eq!((left(&five), left(&ten)), (3, 3));
    // One item asked its own 3, not the request's 1.
    let mut own = five.clone();
    own.ask(0, 3);
    let d = r.decide_now(&own, T0, Hits::exactly(1), Mode::Try).unwrap();
    assert_eq!((d.allowed, d.decisions[0].granted), (true, 3));
    assert_eq!(left(&five), 0);
}
