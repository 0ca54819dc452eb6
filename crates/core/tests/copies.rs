//! Copy-limited resources (Charon §2.2, §3.1): domain, override, group and
//! global limits; reserve, release, transfer and seize.

// This whole file is test code, where a panic is how a check fails; the
// workspace's `allow-unwrap-in-tests` covers `#[test]` functions but not
// the helpers they share.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tollgate_core::copies::{CopyError, CopyLimits, CopyPool, GroupContext, TransferId};
use tollgate_core::{Hits, Nanos};

fn groups(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

const T: Nanos = Nanos::new(5_000 * 1_000_000_000);

fn at(secs: u64) -> Nanos {
    T.saturating_add(Nanos::from_secs(secs))
}

/// Reserves and checks that the whole request was granted.
fn take(pool: &mut CopyPool, limits: &CopyLimits, domain: &str, n: u64) -> Vec<String> {
    let r = pool.reserve(limits, domain, Hits::exactly(n));
    assert!(r.allowed, "{domain} could not reserve {n}: {r:?}");
    assert_eq!(r.granted, n);
    r.groups
}

/// Reserves a request that must be refused; the pool must not change.
fn refuse(pool: &mut CopyPool, limits: &CopyLimits, domain: &str, req: Hits) {
    let before = pool.clone();
    let r = pool.reserve(limits, domain, req);
    assert!(!r.allowed, "{domain} got {r:?}");
    assert_eq!(r.granted, 0);
    assert_eq!(*pool, before, "a refused reserve changes nothing");
}

#[test]
fn domain_limit() {
    let limits = CopyLimits::new(3, None);
    let mut pool = CopyPool::default();
    for i in 1..=3 {
        let r = pool.reserve(&limits, "a", Hits::exactly(1));
        assert!(r.allowed);
        assert_eq!(r.context.domain_holds, i);
        assert_eq!(r.context.domain_limit, 3);
        assert_eq!(r.context.global_limit, None);
        assert!(r.groups.is_empty());
    }
    refuse(&mut pool, &limits, "a", Hits::exactly(1));
    assert_eq!(pool.room(&limits, "a"), 0);
    // Domains are independent.
    assert_eq!(pool.room(&limits, "b"), 3);
    take(&mut pool, &limits, "b", 3);
    assert_eq!(pool.global_holds(), 6);
    assert_eq!(pool.domain_holds("a"), 3);
    assert_eq!(pool.domain_holds("b"), 3);
    // Releasing one lets one more in.
    pool.release("a", &[], 1).unwrap();
    take(&mut pool, &limits, "a", 1);
    refuse(&mut pool, &limits, "a", Hits::exactly(1));
}

#[test]
fn per_domain_overrides() {
    let limits = CopyLimits::new(2, None)
        .with_override("big", 10)
        .with_override("banned", 0);
    assert_eq!(limits.domain_limit_for("big"), 10);
    assert_eq!(limits.domain_limit_for("other"), 2);
    let mut pool = CopyPool::default();
    let r = pool.reserve(&limits, "big", Hits::between(1, 100));
    assert_eq!(r.granted, 10);
    assert_eq!(r.context.domain_limit, 10);
    let r = pool.reserve(&limits, "other", Hits::between(1, 100));
    assert_eq!(r.granted, 2);
    assert_eq!(r.context.domain_limit, 2);
    refuse(&mut pool, &limits, "banned", Hits::exactly(1));
}

#[test]
fn global_limit() {
    let limits = CopyLimits::new(5, Some(7));
    let mut pool = CopyPool::default();
    take(&mut pool, &limits, "a", 5);
    let r = pool.reserve(&limits, "b", Hits::between(1, 5));
    assert_eq!(r.granted, 2, "only two left globally");
    assert_eq!(r.context.global_holds, 7);
    assert_eq!(r.context.global_limit, Some(7));
    assert_eq!(r.context.domain_holds, 2);
    refuse(&mut pool, &limits, "c", Hits::exactly(1));
    pool.release("a", &[], 1).unwrap();
    take(&mut pool, &limits, "c", 1);
}

#[test]
fn a_domain_in_two_groups_takes_from_each_pool() {
    let limits = CopyLimits::new(10, None)
        .with_group("g1", 4, ["a", "b"])
        .unwrap()
        .with_group("g2", 2, ["a", "c"])
        .unwrap();
    let mut pool = CopyPool::default();
    let r = pool.reserve(&limits, "a", Hits::exactly(1));
    assert_eq!(r.groups, groups(&["g1", "g2"]));
    assert_eq!(
        r.context.groups,
        vec![
            GroupContext {
                name: "g1".into(),
                limit: 4,
                holds: 1
            },
            GroupContext {
                name: "g2".into(),
                limit: 2,
                holds: 1
            },
        ]
    );
    assert_eq!(pool.group_holds("g1"), 1);
    assert_eq!(pool.group_holds("g2"), 1);
    assert_eq!(pool.global_holds(), 1, "one copy, counted in both groups");
    // g2 (limit 2) bounds a.
    let r = pool.reserve(&limits, "a", Hits::between(1, 10));
    assert_eq!(r.granted, 1);
    assert_eq!(pool.group_holds("g1"), 2);
    assert_eq!(pool.group_holds("g2"), 2);
    // c shares g2, which is full; b shares g1, which has two left.
    refuse(&mut pool, &limits, "c", Hits::exactly(1));
    let r = pool.reserve(&limits, "b", Hits::between(1, 10));
    assert_eq!(r.granted, 2);
    assert_eq!(r.groups, groups(&["g1"]));
    assert_eq!(pool.group_holds("g1"), 4);
    // A domain in no group is bounded only by its own limit.
    assert_eq!(pool.room(&limits, "z"), 10);
    // Releasing a's copies frees both pools.
    pool.release("a", &groups(&["g1", "g2"]), 2).unwrap();
    assert_eq!(pool.group_holds("g1"), 2);
    assert_eq!(pool.group_holds("g2"), 0);
    take(&mut pool, &limits, "c", 2);
}

#[test]
fn duplicate_group_names_are_refused() {
    let r = CopyLimits::new(1, None)
        .with_group("g", 1, ["a"])
        .unwrap()
        .with_group("g", 2, ["b"]);
    assert!(r.is_err());
}

#[test]
fn partial_reserve_grants_the_largest_n_in_range() {
    let limits = CopyLimits::new(5, None);
    let mut pool = CopyPool::default();
    take(&mut pool, &limits, "a", 2);
    // Room is 3.
    let r = pool.reserve(&limits, "a", Hits::between(2, 5));
    assert!(r.allowed);
    assert_eq!(r.granted, 3);
    assert_eq!(pool.domain_holds("a"), 5);
    pool.release("a", &[], 3).unwrap();
    refuse(&mut pool, &limits, "a", Hits::between(4, 5));
    refuse(&mut pool, &limits, "a", Hits::between(3, 2));
    // min 0 succeeds with what is left, even nothing.
    take(&mut pool, &limits, "a", 3);
    let before = pool.clone();
    let r = pool.reserve(&limits, "a", Hits::between(0, 5));
    assert!(r.allowed);
    assert_eq!(r.granted, 0);
    assert_eq!(pool, before);
}

#[test]
fn release_names_the_groups_at_reserve_time() {
    let before = CopyLimits::new(10, None)
        .with_group("g1", 10, ["a"])
        .unwrap()
        .with_group("g2", 10, Vec::<String>::new())
        .unwrap();
    // a moves from g1 to g2 while holding copies.
    let after = CopyLimits::new(10, None)
        .with_group("g1", 10, Vec::<String>::new())
        .unwrap()
        .with_group("g2", 10, ["a"])
        .unwrap();
    let mut pool = CopyPool::default();
    let old = take(&mut pool, &before, "a", 2);
    assert_eq!(old, groups(&["g1"]));
    let new = take(&mut pool, &after, "a", 1);
    assert_eq!(new, groups(&["g2"]));
    assert_eq!(pool.held("a", &old), 2);
    assert_eq!(pool.held("a", &new), 1);
    assert_eq!(pool.domain_holds("a"), 3);
    // Releasing two under the current membership would be wrong: only one
    // is held under g2.
    let snapshot = pool.clone();
    let e = pool.release("a", &new, 2).unwrap_err();
    assert_eq!(
        e,
        CopyError::NotHeld {
            domain: "a".into(),
            groups: groups(&["g2"]),
            held: 1,
            requested: 2
        }
    );
    assert_eq!(pool, snapshot);
    // The groups at reserve time refill the right pool.
    pool.release("a", &old, 2).unwrap();
    assert_eq!(pool.group_holds("g1"), 0);
    assert_eq!(pool.group_holds("g2"), 1);
    assert_eq!(pool.domain_holds("a"), 1);
    // Group lists are compared as sets: order and repeats do not matter.
    let mut pool = CopyPool::default();
    let both = CopyLimits::new(10, None)
        .with_group("x", 10, ["a"])
        .unwrap()
        .with_group("y", 10, ["a"])
        .unwrap();
    take(&mut pool, &both, "a", 2);
    pool.release("a", &groups(&["y", "x", "y"]), 2).unwrap();
    assert!(pool.is_empty());
}

#[test]
fn release_errors_leave_counts_unchanged() {
    let limits = CopyLimits::new(5, Some(10))
        .with_group("g", 5, ["a"])
        .unwrap();
    let mut pool = CopyPool::default();
    let g = take(&mut pool, &limits, "a", 2);
    let snapshot = pool.clone();
    assert_eq!(pool.release("a", &g, 0), Err(CopyError::ZeroCopies));
    assert_eq!(pool, snapshot);
    assert!(matches!(
        pool.release("a", &g, 3),
        Err(CopyError::NotHeld {
            held: 2,
            requested: 3,
            ..
        })
    ));
    assert_eq!(pool, snapshot);
    assert!(matches!(
        pool.release("b", &g, 1),
        Err(CopyError::NotHeld { held: 0, .. })
    ));
    assert!(matches!(
        pool.release("a", &[], 1),
        Err(CopyError::NotHeld { held: 0, .. })
    ));
    assert_eq!(pool, snapshot);
    assert_eq!(
        (
            pool.global_holds(),
            pool.domain_holds("a"),
            pool.group_holds("g")
        ),
        (2, 2, 2)
    );
    // Releases may be split.
    pool.release("a", &g, 1).unwrap();
    pool.release("a", &g, 1).unwrap();
    assert!(pool.is_empty());
    assert_eq!(pool.group_holds("g"), 0);
}

/// Issue 23: `not_held` said ``holds 2 copies in groups []``, which read
/// as if the domain were in no group at all; the groups are now named as
/// the set the copies are counted in.
#[test]
fn not_held_names_the_groups_in_words() {
    let limits = CopyLimits::new(5, None)
        .with_group("big", 5, ["a"])
        .unwrap()
        .with_group("eu", 5, ["a"])
        .unwrap();
    let mut pool = CopyPool::default();
    let both = take(&mut pool, &limits, "a", 2);
    let message = |r: Result<_, CopyError>| r.unwrap_err().to_string();
    assert_eq!(
        message(pool.release("a", &both, 3)),
        "domain `a` holds 2 copies in groups `big`, `eu`, cannot release 3"
    );
    assert_eq!(
        message(pool.release("a", &groups(&["big"]), 1)),
        "domain `a` holds no copies in group `big`, cannot release 1"
    );
    assert_eq!(
        message(pool.release("a", &[], 1)),
        "domain `a` holds no copies in no group, cannot release 1"
    );
    let mut pool = CopyPool::default();
    let none = take(&mut pool, &CopyLimits::new(5, None), "b", 1);
    assert_eq!(
        message(pool.release("b", &none, 2)),
        "domain `b` holds 1 copy in no group, cannot release 2"
    );
}

#[test]
fn transfer_then_seize_moves_the_hold() {
    let limits = CopyLimits::new(5, Some(5))
        .with_group("g", 5, ["a"])
        .unwrap();
    let mut pool = CopyPool::default();
    let g = take(&mut pool, &limits, "a", 3);
    let id = TransferId(0xfeed);
    pool.transfer("a", &g, 2, id, at(30)).unwrap();
    // Staged copies stay counted but are no longer held (not releasable).
    assert_eq!(pool.held("a", &g), 1);
    assert_eq!(
        (
            pool.global_holds(),
            pool.domain_holds("a"),
            pool.group_holds("g")
        ),
        (3, 3, 3)
    );
    assert_eq!(pool.room(&limits, "a"), 2);
    assert!(matches!(
        pool.release("a", &g, 2),
        Err(CopyError::NotHeld { held: 1, .. })
    ));
    assert!(!pool.is_empty());
    let staged: Vec<_> = pool.staged().collect();
    assert_eq!(staged.len(), 1);
    assert_eq!(*staged[0].0, id);
    assert_eq!(staged[0].1.copies, 2);
    // Another client seizes them before the TTL ends.
    let s = pool.seize(id, at(29)).unwrap();
    assert_eq!(s.domain, "a");
    assert_eq!(s.groups, g);
    assert_eq!(s.copies, 2);
    assert_eq!(pool.held("a", &g), 3);
    assert_eq!(pool.global_holds(), 3);
    assert_eq!(pool.staged().count(), 0);
    // Seized once; a second seize finds nothing.
    assert_eq!(pool.seize(id, at(29)), Err(CopyError::UnknownTransfer));
    // The seizer releases with the groups the seize returned.
    pool.release(&s.domain, &s.groups, 2).unwrap();
    pool.release("a", &g, 1).unwrap();
    assert!(pool.is_empty());
}

#[test]
fn transfer_ttl_expiry_releases() {
    let limits = CopyLimits::new(5, None).with_group("g", 5, ["a"]).unwrap();
    let mut pool = CopyPool::default();
    let g = take(&mut pool, &limits, "a", 2);
    let id = TransferId(7);
    pool.transfer("a", &g, 2, id, at(30)).unwrap();
    assert_eq!(pool.held("a", &g), 0);
    // Still staged one nanosecond before the TTL ends.
    assert!(pool
        .expire(at(30).saturating_sub(Nanos::NANOSECOND))
        .is_empty());
    assert_eq!(pool.global_holds(), 2);
    let expired = pool.expire(at(30));
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].0, id);
    assert_eq!(expired[0].1.copies, 2);
    assert_eq!(
        (
            pool.global_holds(),
            pool.domain_holds("a"),
            pool.group_holds("g")
        ),
        (0, 0, 0)
    );
    assert!(pool.is_empty());
    assert_eq!(pool.room(&limits, "a"), 5);
}

#[test]
fn seize_after_expiry_fails_and_releases() {
    let limits = CopyLimits::new(5, None);
    let mut pool = CopyPool::default();
    take(&mut pool, &limits, "a", 1);
    let id = TransferId(u128::MAX);
    pool.transfer("a", &[], 1, id, at(10)).unwrap();
    // A seize one nanosecond before the TTL ends still works...
    let mut early = pool.clone();
    let s = early
        .seize(id, at(10).saturating_sub(Nanos::NANOSECOND))
        .unwrap();
    assert_eq!(s.copies, 1);
    // ...at the TTL it does not, and the copies are released.
    assert_eq!(pool.seize(id, at(10)), Err(CopyError::UnknownTransfer));
    assert!(pool.is_empty());
    assert_eq!(pool.global_holds(), 0);
}

#[test]
fn duplicate_transfer_id_is_refused() {
    let limits = CopyLimits::new(5, None);
    let mut pool = CopyPool::default();
    take(&mut pool, &limits, "a", 3);
    let id = TransferId(42);
    pool.transfer("a", &[], 1, id, at(10)).unwrap();
    let snapshot = pool.clone();
    assert_eq!(
        pool.transfer("a", &[], 1, id, at(20)),
        Err(CopyError::DuplicateTransfer(id))
    );
    assert_eq!(pool, snapshot, "the refused transfer took nothing");
    assert_eq!(pool.held("a", &[]), 2);
    // Other transfer errors also change nothing.
    assert_eq!(
        pool.transfer("a", &[], 0, TransferId(43), at(10)),
        Err(CopyError::ZeroCopies)
    );
    assert!(matches!(
        pool.transfer("a", &[], 3, TransferId(43), at(10)),
        Err(CopyError::NotHeld { held: 2, .. })
    ));
    assert_eq!(pool, snapshot);
    // The original transfer is intact.
    assert_eq!(pool.seize(id, at(5)).unwrap().copies, 1);
}

#[test]
fn transfer_ids_print_and_parse_as_32_hex_digits() {
    let id = TransferId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
    let s = id.to_string();
    assert_eq!(s, "0123456789abcdef0011223344556677");
    assert_eq!(s.parse::<TransferId>(), Ok(id));
    assert_eq!(TransferId(1).to_string().len(), 32);
    // Upper case is still hex.
    assert_eq!(
        "0123456789ABCDEF0011223344556677".parse::<TransferId>(),
        Ok(id)
    );
    for bad in [
        "",
        "123",
        "0123456789abcdef001122334455667g",
        " 123456789abcdef0011223344556677",
    ] {
        assert_eq!(
            bad.parse::<TransferId>(),
            Err(CopyError::UnknownTransfer),
            "{bad:?}"
        );
    }
}

/// Regression: `u128::from_str_radix` accepts a leading `+`, so
/// "+123456789abcdef0011223344556677" (32 characters, 31 digits) parsed as a
/// second spelling of transfer id 0123456789abcdef0011223344556677.
#[test]
fn bug_transfer_id_parse_accepted_a_plus_sign() {
    assert_eq!(
        "+123456789abcdef0011223344556677".parse::<TransferId>(),
        Err(CopyError::UnknownTransfer)
    );
    assert_eq!(
        "+0000000000000000000000000000000".parse::<TransferId>(),
        Err(CopyError::UnknownTransfer)
    );
}
