//! The local over-limit cache: a key Redis rejected is answered here until
//! its state could admit again, exactly as Redis would answer, without a
//! round trip (what Envoy's ratelimit and Limitador do in front of Redis,
//! made exact).
//!
//! # What an entry is
//!
//! A decision describes its key's state after the request (every duration
//! is relative to the instant Redis decided). For four algorithms that
//! description *determines* the state, so the core's own state can be
//! rebuilt from it ([`snapshot`]) and the core's own functions decide the
//! next requests on a copy of it:
//!
//! - **GCRA and the leaky bucket**: the state is one time, the theoretical
//!   arrival time: `now + reset_after`.
//! - **Token bucket** (with `initial_tokens` at most the capacity): the
//!   token-time available is `capacity × interval − reset_after` (below a
//!   full bucket, `reset_after` is exactly the refill still to come), and
//!   the bucket was last used at the decision at the latest. A bucket below
//!   full is never forgotten before it is full, so until `reset_after` has
//!   passed the rebuilt state decides every request as the real one does.
//!   (With more initial tokens than capacity a full bucket's level is not
//!   in the answer: not cached.)
//! - **Fixed window** (any alignment, calendar windows included): the
//!   count is `limit − remaining` and the window ends `reset_after` from
//!   now, which is all the state holds. A new window only starts with a
//!   grant, which the cache never makes.
//!
//! The sliding window, the sliding log, burst tiers and Guava's smooth
//! limiters are not cached: their answers do not determine their states
//! (per-sub-window counts, hit logs, tier logs, stored permits as a
//! double), and the sliding log with `count_rejected` changes its state on
//! every rejection. A plan with any such item always goes to Redis.
//!
//! # When it answers, and why that is exact
//!
//! A plan is answered here only in `try` mode, only when every item has a
//! live entry for the same limit (parameters and all: a reloaded limit
//! never meets an entry of the old one), and only when the core, deciding
//! the request on copies of those states, grants no item anything, leaves
//! every state as it was, and rejects the request (not allowed, or
//! limited by a shadow item, for at least one hit). Anything that would
//! take hits goes to Redis; so does `acquire`, which always takes them,
//! and so does a check of zero hits (or a plan whose live items are all
//! asked none of their own), which is allowed whatever the state
//! and asks for fields another server's grants may have changed. Entries
//! come from rejections only, for the same reason. The answer is then
//! the core's `PlanDecision`, every field computed as the script computes
//! it (the conformance suite holds the two to identical answers).
//!
//! No over-admission is possible: the cache never grants. Every algorithm
//! cached here only moves toward admission with time, and every other
//! request (this server's or another's) only takes more: so Redis's real
//! state admits at most what the rebuilt one admits, and a request the
//! rebuilt state rejects Redis would reject too.
//!
//! Refunds (`Mode::Refund`) are the exception: they give hits back. This
//! server's own refund goes to Redis, and its answer replaces the key's
//! entry with the state after the refund (or drops it), so the refunding
//! server sees it at once. Another server's refund is not seen here until
//! the entry lapses (`max_age`, 1 s by default): until then this server
//! may reject what Redis would grant, the strict side again, never an
//! over-admission. Reports only take more, like any grant.
//!
//! The fields (`remaining`, `reset_after`, `retry_after`, `rooms`) are
//! Redis's own when nothing else took from the key since the entry's
//! decision: another server's grants make the real state emptier than the
//! entry knows, so the answer shows more remaining and sooner retry times
//! than Redis would (the rejection itself stands). With Redis's clock, the
//! entry's times are counted from when this server sent the call (the
//! driver's send, not the decision's arrival in the queue), not from the
//! instant Redis decided (it does not know that instant), so durations
//! read shorter than Redis's by the time between the two (the way to
//! Redis, the call ahead on the connection, the plans ahead in the
//! batch: usually well under a millisecond, at most twice the timeout,
//! past which the driver fails the call), and the entry lapses that much
//! early:
//! toward asking Redis. (A Redis clock that runs
//! faster than this process's monotonic one, or is stepped forward, would
//! admit a little before the entry lapses: the cache then rejects that
//! much longer than Redis would, the strict side.) A Redis that lost its
//! data (restarted empty, flushed, failed over to a replica that lagged,
//! the key evicted or deleted) would admit sooner: until an entry lapses
//! this server keeps rejecting that key, the strict side. That is what
//! bounds an entry's life by `max_age` (`RedisOptions::rejection_cache_max_age`,
//! 1 s by default) as well as by its `reset_after`, and why the store
//! drops every entry ([`RejectionCache::clear`]) when it finds Redis lost
//! its data (a heartbeat missing from the live set, a pool gone back), and
//! learns nothing from the answers to calls sent before that (Redis may
//! have decided them before it lost the data).
//!
//! # Bounds
//!
//! At most `capacity` entries, split exactly over the shards; a new key in
//! a full shard evicts one of its entries
//! (`tollgate_store_rejection_cache_evictions_total`).
//! Entries live at most `max_age` and are dropped when they lapse (by the
//! store's monitor, every half second), when Redis lost its data, when a
//! reload stops serving their limit
//! ([`RejectionCache::retain_limits`]), and when Redis answers their key
//! with a state that cannot be rebuilt.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use smallvec::SmallVec;
use tollgate_core::algorithms::fixed_window::FixedWindowState;
use tollgate_core::algorithms::gcra::GcraState;
use tollgate_core::algorithms::token_bucket::TokenBucketState;
use tollgate_core::plan::{decide_one, PlanEntry};
use tollgate_core::{Decision, Hits, Limit, LimitState, Mode, Nanos, PlanDecision};
use tollgate_store::{Key, LimitId, Plan, PlanItem};

/// Shards of the cache (a power of two).
const SHARDS: usize = 16;

/// The local clock's origin, with Redis's clock: far from zero, so that
/// rebuilt states never reach the core's saturation at zero (a fixed
/// window's start is its end minus the window: up to 2^52 ns before, or a
/// calendar year's 366 days, both far short of the 31 years `BASE` is), and
/// a whole number of microseconds.
const BASE: u64 = 1_000_000_000_000_000_000;

/// One key's rebuilt state, live in `[since, until)`.
#[derive(Clone, Debug)]
struct Entry {
    limit: Arc<Limit>,
    state: LimitState,
    since: Nanos,
    until: Nanos,
}

/// Whose time entries are kept in.
#[derive(Clone, Copy, Debug)]
pub(crate) enum CacheClock {
    /// The caller's `now`, which the scripts decide by too
    /// (`ScriptClock::Caller`): entries are exact in time.
    Caller,
    /// This process's monotonic clock (Redis decides by its own `TIME`).
    Local(Instant),
}

/// What the cache counted, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Decisions answered from the cache.
    pub hits: u64,
    /// Entries now.
    pub entries: usize,
    /// Entries dropped to make room for others.
    pub evictions: u64,
}

/// The cache; see the [module docs](self).
pub(crate) struct RejectionCache {
    shards: Box<[Mutex<HashMap<Key, Entry>>]>,
    /// Entries each shard may hold: the capacity split exactly (a
    /// capacity of 20 is 2 for four shards and 1 for the others).
    rooms: Box<[usize]>,
    hasher: std::collections::hash_map::RandomState,
    clock: CacheClock,
    /// The longest an entry lives, whatever its `reset_after`.
    max_age: Nanos,
    hits: AtomicU64,
    evictions: AtomicU64,
    entries: AtomicUsize,
    /// The latest caller's time seen ([`CacheClock::Caller`]), which
    /// [`RejectionCache::purge_lapsed`] purges by.
    latest: AtomicU64,
    /// How many times [`RejectionCache::clear`] ran: an answer to a call
    /// sent before the last clear describes what Redis lost, and is not
    /// learnt ([`RejectionCache::learn`]).
    generation: AtomicU64,
}

impl RejectionCache {
    /// A cache of at most `capacity` entries, kept by `clock`, each
    /// living at most `max_age`.
    pub(crate) fn new(capacity: usize, clock: CacheClock, max_age: Nanos) -> RejectionCache {
        let (per, extra) = (capacity / SHARDS, capacity % SHARDS);
        RejectionCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            rooms: (0..SHARDS).map(|i| per + usize::from(i < extra)).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
            clock,
            max_age,
            hits: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            entries: AtomicUsize::new(0),
            latest: AtomicU64::new(0),
            generation: AtomicU64::new(0),
        }
    }

    /// The cache's generation now: read before a decision's call is sent,
    /// and given back to [`RejectionCache::learn`] with its answer.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The cache's time for a decision the caller makes at `now`.
    pub(crate) fn now(&self, now: Nanos) -> Nanos {
        match self.clock {
            CacheClock::Caller => {
                self.latest.fetch_max(now.as_u64(), Ordering::Relaxed);
                now
            }
            CacheClock::Local(_) => self.at(now, Instant::now()),
        }
    }

    /// The cache's time at `instant`, for a decision the caller made at
    /// `now`.
    pub(crate) fn at(&self, now: Nanos, instant: Instant) -> Nanos {
        match self.clock {
            CacheClock::Caller => now,
            CacheClock::Local(origin) => {
                // In whole microseconds, rounded down, as Redis's TIME:
                // the durations answered are then in Redis's granularity
                // too.
                let elapsed = instant.saturating_duration_since(origin).as_micros();
                let elapsed = u64::try_from(elapsed).unwrap_or(u64::MAX);
                Nanos::new(BASE.saturating_add(elapsed.saturating_mul(1000)))
            }
        }
    }

    /// Entries are keyed by the store's key alone, without the plan's
    /// affinity that Redis's key also holds: a limit id names its
    /// namespace already, and the affinity is the namespace's, so one
    /// store key is one Redis key.
    fn shard(&self, key: &Key) -> &Mutex<HashMap<Key, Entry>> {
        &self.shards[self.shard_of(key)]
    }

    fn shard_of(&self, key: &Key) -> usize {
        (self.hasher.hash_one(key) >> 32) as usize % SHARDS
    }

    /// A copy of the live state of `item`'s key at `now`, if the cache has
    /// one for the same limit.
    fn live(&self, item: &PlanItem, now: Nanos) -> Option<LimitState> {
        let shard = self.shard(&item.key).lock();
        let e = shard.get(&item.key)?;
        let same = Arc::ptr_eq(&e.limit, &item.limit) || *e.limit == *item.limit;
        (same && e.since <= now && now < e.until).then(|| e.state.clone())
    }

    /// The answer Redis would give `plan` at `now` (the cache's time) in
    /// `try` mode, if the cache knows it: every item's state is live here
    /// and the request takes nothing from any of them.
    pub(crate) fn answer(&self, plan: &Plan, now: Nanos, request: Hits) -> Option<PlanDecision> {
        if self.entries.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let items = plan.items();
        // One item asked the request's hits: the core's one-limit path;
        // anything else (an item asked hits of its own) the whole plan.
        let decision = if let [item @ PlanItem { hits: None, .. }] = items {
            let before = self.live(item, now)?;
            let mut state = before.clone();
            let one = decide_one(&*item.limit, &mut state, item.shadow, now, request);
            if one.decision.granted > 0 || state != before {
                return None;
            }
            let d = one.into_plan_decision(request, item.shadow);
            if !is_rejection(&d, request) {
                return None;
            }
            d
        } else {
            let mut states: SmallVec<[LimitState; 4]> = SmallVec::new();
            for item in items {
                states.push(self.live(item, now)?);
            }
            let before = states.clone();
            let mut entries: SmallVec<[PlanEntry<'_>; 4]> = items
                .iter()
                .zip(states.iter_mut())
                .map(|(it, state)| PlanEntry {
                    limit: &it.limit,
                    state,
                    shadow: it.shadow,
                    hits: it.hits,
                })
                .collect();
            let d = tollgate_core::plan::decide(&mut entries, now, request, Mode::Try).ok()?;
            drop(entries);
            // Allowed with items asked hits of their own: its live items
            // were asked none (else they took some), a check of zero hits
            // whose fields are what the caller reads, as `is_rejection`
            // says of a request of zero hits.
            let own = items.iter().any(PlanItem::has_own_hits);
            if d.decisions.iter().any(|x| x.granted > 0)
                || states != before
                || !is_rejection(&d, request)
                || (own && d.allowed)
            {
                return None;
            }
            d
        };
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(decision)
    }

    /// Learns from Redis's answer `d` to `request` for `plan`, decided at
    /// the cache's time `t0` or later, by a call sent in `generation`
    /// ([`RejectionCache::generation`]): a rejection ([`is_rejection`]: no
    /// item took anything) whose every state can be rebuilt becomes
    /// entries; any other answer refreshes the entries its keys already
    /// have, or drops those it cannot rebuild. An answer to a call sent
    /// before the last [`RejectionCache::clear`] is not learnt: Redis may
    /// have decided it before it lost its data.
    pub(crate) fn learn(
        &self,
        plan: &Plan,
        d: &PlanDecision,
        request: Hits,
        t0: Nanos,
        generation: u64,
    ) {
        let rejected = is_rejection(d, request) && d.decisions.iter().all(|x| x.granted == 0);
        if !rejected && self.entries.load(Ordering::Relaxed) == 0 {
            return;
        }
        // An entry lives until its state could admit again, and never
        // longer than `max_age`: what bounds how long a Redis that lost
        // the key (flushed, failed over, evicted) goes on being answered
        // by the state it had.
        let oldest = t0.saturating_add(self.max_age);
        let snaps: SmallVec<[Option<(LimitState, Nanos)>; 4]> = plan
            .items()
            .iter()
            .zip(&d.decisions)
            .map(|(item, dec)| {
                snapshot(&item.limit, dec, t0).map(|(state, until)| (state, until.min(oldest)))
            })
            .collect();
        let insert = rejected && snaps.iter().all(Option::is_some);
        for (item, snap) in plan.items().iter().zip(snaps) {
            let at = self.shard_of(&item.key);
            let mut shard = self.shards[at].lock();
            // Read under the shard's lock, which `clear` takes after it
            // counts a new generation: either this sees the new
            // generation, or `clear` drops what this inserts.
            if self.generation.load(Ordering::SeqCst) != generation {
                return;
            }
            let room = self.rooms[at];
            match snap {
                Some(_) if room == 0 => {}
                Some((state, until)) if insert || shard.contains_key(&item.key) => {
                    if !shard.contains_key(&item.key) {
                        if shard.len() >= room {
                            // Any entry: they lapse on their own, and a
                            // hot one comes back with its next rejection.
                            let victim = shard.keys().next().cloned();
                            if let Some(victim) = victim {
                                shard.remove(&victim);
                                self.entries.fetch_sub(1, Ordering::Relaxed);
                                self.evictions.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        self.entries.fetch_add(1, Ordering::Relaxed);
                    }
                    shard.insert(
                        item.key.clone(),
                        Entry {
                            limit: Arc::clone(&item.limit),
                            state,
                            since: t0,
                            until,
                        },
                    );
                }
                _ => {
                    if shard.remove(&item.key).is_some() {
                        self.entries.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// Drops the entries that lapsed by now: this process's time, or with
    /// the caller's clock the latest the callers gave.
    pub(crate) fn purge_lapsed(&self) {
        let now = match self.clock {
            CacheClock::Caller => Nanos::new(self.latest.load(Ordering::Relaxed)),
            CacheClock::Local(_) => self.now(Nanos::ZERO),
        };
        self.purge(now);
    }

    /// Drops the entries that lapsed by `now` (the cache's time).
    pub(crate) fn purge(&self, now: Nanos) {
        self.retain(|_, e| e.until > now);
    }

    /// Drops every entry: Redis lost its data (or went back to an older
    /// state), so what the entries say of it no longer holds.
    pub(crate) fn clear(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.retain(|_, _| false);
    }

    /// Drops the entries of `keys` (a reset deleted them in Redis), and
    /// starts a new generation, so that an answer to a call sent before
    /// the reset, describing the state it deleted, is not learnt.
    pub(crate) fn forget<'k>(&self, keys: impl Iterator<Item = &'k Key>) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        for key in keys {
            let mut shard = self.shard(key).lock();
            if shard.remove(key).is_some() {
                self.entries.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Keeps only the entries of `limits` (a reload's: what is served
    /// from now on), with the same parameters.
    pub(crate) fn retain_limits(&self, limits: &[(LimitId, Arc<Limit>)]) {
        let served: HashMap<LimitId, &Arc<Limit>> = limits.iter().map(|(id, l)| (*id, l)).collect();
        self.retain(|k, e| served.get(&k.limit).is_some_and(|l| **l == e.limit));
    }

    fn retain(&self, mut keep: impl FnMut(&Key, &Entry) -> bool) {
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let before = shard.len();
            shard.retain(|k, e| keep(k, e));
            self.entries
                .fetch_sub(before - shard.len(), Ordering::Relaxed);
        }
    }

    /// What the cache counted so far.
    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}

/// Whether `d` refused `request` for want of room: not allowed (or, in
/// shadow mode, limited), for a well-formed request of at least one hit.
/// Only such an answer stands whatever others take from the key later, so
/// only such an answer is kept, or given, by the cache. A check of zero
/// hits (or a range whose minimum is zero) is allowed whatever the state,
/// and its fields (`remaining` above all) are what the caller asks for:
/// answered from an entry they would miss every other server's grants
/// since (review of issue 17, finding 1).
fn is_rejection(d: &PlanDecision, request: Hits) -> bool {
    request.min_hits > 0 && request.is_well_formed() && (!d.allowed || d.shadow_limited)
}

/// The core's state of `limit` that decision `d`, made at `t0` (or later,
/// with Redis's clock), describes, and until when it decides every request
/// as the real state would; `None` for an algorithm (or a state) whose
/// answer does not determine it. See the [module docs](self).
fn snapshot(limit: &Limit, d: &Decision, t0: Nanos) -> Option<(LimitState, Nanos)> {
    let reset = d.reset_after.as_u64();
    if reset == 0 {
        return None;
    }
    let until = Nanos::new(t0.as_u64().checked_add(reset)?);
    let state = match limit {
        Limit::Gcra(_) | Limit::LeakyBucket(_) => LimitState::Gcra(GcraState { tat: until }),
        Limit::TokenBucket(tb) if tb.initial_tokens() <= tb.capacity() => {
            let level = i128::from(tb.full_time().as_u64()) - i128::from(reset);
            // A bucket that starts below capacity and holds its initial
            // tokens may be a forgotten one (a report or refund of nothing
            // leaves it so), which refills only from its next request,
            // not from `t0`: the answer does not tell which, so it is not
            // learnt.
            if tb.initial_tokens() < tb.capacity()
                && level == i128::from(tb.initial_time().as_u64())
            {
                return None;
            }
            LimitState::TokenBucket(TokenBucketState {
                token_time: i64::try_from(level).ok()?,
                last: t0.as_u64(),
            })
        }
        Limit::FixedWindow(fw) => {
            let count = fw.limit().checked_sub(d.remaining)?;
            if count == 0 {
                return None;
            }
            LimitState::FixedWindow(FixedWindowState { end: until, count })
        }
        _ => return None,
    };
    Some((state, until))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{Algorithm, Align, FixedWindow, Gcra, Rate, SlidingWindow, TokenBucket};

    const T0: Nanos = Nanos::new(1_790_000_000_123_456_789);
    const HOUR: Nanos = Nanos::from_secs(3600);

    fn plan(limit: &Arc<Limit>, scope: &str) -> Plan {
        let mut p = Plan::default();
        p.push(Key::new(LimitId(1), scope), Arc::clone(limit), false)
            .unwrap_or_else(|e| panic!("{e}"));
        p
    }

    /// Decides `steps` (advance, hits) with the core on a fresh state,
    /// teaching the cache each rejection as Redis would answer it, and
    /// checks that whatever the cache answers equals the core's answer.
    fn agrees(limit: Limit, steps: &[(u64, u64)]) -> u64 {
        let limit = Arc::new(limit);
        let cache = RejectionCache::new(64, CacheClock::Caller, HOUR);
        let mut state = Algorithm::fresh(&*limit);
        let p = plan(&limit, "acme");
        let mut now = T0;
        let mut answered = 0;
        for &(advance, hits) in steps {
            now = now.saturating_add(Nanos::new(advance));
            let request = Hits::exactly(hits);
            let cached = cache.answer(&p, now, request);
            let truth = decide_one(&*limit, &mut state, false, now, request)
                .into_plan_decision(request, false);
            if let Some(c) = cached {
                assert_eq!(c, truth, "at +{}", now.saturating_sub(T0));
                answered += 1;
            }
            cache.learn(&p, &truth, request, now, 0);
        }
        answered
    }

    #[test]
    fn rejections_of_the_cached_algorithms_are_answered_as_the_core_answers() {
        let steps: Vec<(u64, u64)> = (0..400)
            .map(|i| ((i * 7919) % 50_000_000, 1 + i % 3))
            .collect();
        let per_second = |n| Rate::per_second(n).unwrap_or_else(|e| panic!("{e}"));
        let tb = TokenBucket::new(5, per_second(20)).unwrap_or_else(|e| panic!("{e}"));
        let low = TokenBucket::with_initial(5, per_second(20), 0).unwrap_or_else(|e| panic!("{e}"));
        let g = Gcra::new(per_second(20), 3).unwrap_or_else(|e| panic!("{e}"));
        let fw = FixedWindow::new(4, Nanos::from_millis(300), Align::Epoch)
            .unwrap_or_else(|e| panic!("{e}"));
        let first = FixedWindow::new(4, Nanos::from_millis(300), Align::FirstHit)
            .unwrap_or_else(|e| panic!("{e}"));
        for limit in [
            Limit::TokenBucket(tb),
            Limit::TokenBucket(low),
            Limit::Gcra(g),
            Limit::FixedWindow(fw),
            Limit::FixedWindow(first),
        ] {
            let name = limit.algorithm_name();
            assert!(
                agrees(limit, &steps) > 50,
                "{name}: the cache answered little"
            );
        }
        // Not cached: every request goes to Redis.
        let sw =
            SlidingWindow::new(4, Nanos::from_millis(300), 2).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(agrees(Limit::SlidingWindow(sw), &steps), 0);
    }

    /// Regression (review of per-item hits): a plan whose live items are
    /// asked no hits of their own beside a shadow item over its limit is
    /// allowed whatever the state, as a check of zero hits is, and its
    /// fields are what the caller reads (a `report: true` descriptor's
    /// zero-hit check reads `remaining`): not answered from entries that
    /// miss other servers' grants (issue 17's zero-hit rule).
    #[test]
    fn a_plan_of_live_items_asked_no_hits_of_their_own_is_not_answered() {
        let per_second = |n| Rate::per_second(n).unwrap_or_else(|e| panic!("{e}"));
        let g = Arc::new(Limit::Gcra(
            Gcra::new(per_second(1), 1).unwrap_or_else(|e| panic!("{e}")),
        ));
        let cache = RejectionCache::new(64, CacheClock::Caller, HOUR);
        // Both keys exhausted, and learnt as such.
        for scope in ["live", "shadow"] {
            let p = plan(&g, scope);
            let mut state = Algorithm::fresh(&*g);
            for _ in 0..2 {
                let d = decide_one(&*g, &mut state, false, T0, Hits::exactly(1))
                    .into_plan_decision(Hits::exactly(1), false);
                cache.learn(&p, &d, Hits::exactly(1), T0, 0);
            }
        }
        assert_eq!(cache.stats().entries, 2);
        let mut p = Plan::default();
        p.push(Key::new(LimitId(1), "live"), Arc::clone(&g), false)
            .unwrap_or_else(|e| panic!("{e}"));
        p.push(Key::new(LimitId(1), "shadow"), Arc::clone(&g), true)
            .unwrap_or_else(|e| panic!("{e}"));
        p.ask(0, 0);
        p.ask(1, 1);
        assert!(cache.answer(&p, T0, Hits::exactly(1)).is_none());
        // Asked a hit of its own, the live item is refused: answered.
        p.ask(0, 1);
        let d = cache.answer(&p, T0, Hits::exactly(1));
        assert!(d.as_ref().is_some_and(|d| !d.allowed), "{d:?}");
    }

    #[test]
    fn an_entry_of_other_parameters_is_never_used_and_a_reload_drops_it() {
        let per_second = |n| Rate::per_second(n).unwrap_or_else(|e| panic!("{e}"));
        let old = Arc::new(Limit::Gcra(
            Gcra::new(per_second(1), 1).unwrap_or_else(|e| panic!("{e}")),
        ));
        let new = Arc::new(Limit::Gcra(
            Gcra::new(per_second(1000), 1000).unwrap_or_else(|e| panic!("{e}")),
        ));
        let cache = RejectionCache::new(64, CacheClock::Caller, HOUR);
        let mut state = Algorithm::fresh(&*old);
        let p = plan(&old, "acme");
        for _ in 0..2 {
            let d = decide_one(&*old, &mut state, false, T0, Hits::exactly(1))
                .into_plan_decision(Hits::exactly(1), false);
            cache.learn(&p, &d, Hits::exactly(1), T0, 0);
        }
        assert!(cache.answer(&p, T0, Hits::exactly(1)).is_some());
        // The same key under new parameters: not answered from the old
        // limit's entry.
        assert!(cache
            .answer(&plan(&new, "acme"), T0, Hits::exactly(1))
            .is_none());
        assert_eq!(cache.stats().entries, 1);
        cache.retain_limits(&[(LimitId(1), Arc::clone(&new))]);
        assert_eq!(cache.stats().entries, 0);
    }

    #[test]
    fn an_entry_lives_at_most_max_age_and_clear_drops_every_one() {
        // Rejected for an hour, but kept a second.
        let g = Arc::new(Limit::Gcra(
            Gcra::new(Rate::new(1, HOUR).unwrap_or_else(|e| panic!("{e}")), 1)
                .unwrap_or_else(|e| panic!("{e}")),
        ));
        let cache = RejectionCache::new(64, CacheClock::Caller, Nanos::from_secs(1));
        let p = plan(&g, "acme");
        let mut state = Algorithm::fresh(&*g);
        for _ in 0..2 {
            let d = decide_one(&*g, &mut state, false, T0, Hits::exactly(1))
                .into_plan_decision(Hits::exactly(1), false);
            cache.learn(&p, &d, Hits::exactly(1), T0, 0);
        }
        let at = |ms| T0.saturating_add(Nanos::from_millis(ms));
        assert!(cache.answer(&p, at(999), Hits::exactly(1)).is_some());
        assert!(cache.answer(&p, at(1000), Hits::exactly(1)).is_none());
        // With the caller's clock, lapsed entries are purged by the
        // latest time a caller gave.
        cache.now(at(1000));
        cache.purge_lapsed();
        assert_eq!(cache.stats().entries, 0);
        // Learnt again, then Redis is found to have lost its data.
        let d = decide_one(&*g, &mut state, false, at(1000), Hits::exactly(1))
            .into_plan_decision(Hits::exactly(1), false);
        cache.learn(&p, &d, Hits::exactly(1), at(1000), 0);
        assert_eq!(cache.stats().entries, 1);
        cache.clear();
        assert_eq!(cache.stats().entries, 0);
        assert!(cache.answer(&p, at(1001), Hits::exactly(1)).is_none());
    }

    #[test]
    fn entries_are_bounded_and_evictions_counted() {
        let per_second = |n| Rate::per_second(n).unwrap_or_else(|e| panic!("{e}"));
        let g = Arc::new(Limit::Gcra(
            Gcra::new(per_second(1), 1).unwrap_or_else(|e| panic!("{e}")),
        ));
        let cache = RejectionCache::new(32, CacheClock::Caller, HOUR);
        for i in 0..1000 {
            let p = plan(&g, &format!("user-{i}"));
            let mut state = Algorithm::fresh(&*g);
            for _ in 0..2 {
                let d = decide_one(&*g, &mut state, false, T0, Hits::exactly(1))
                    .into_plan_decision(Hits::exactly(1), false);
                cache.learn(&p, &d, Hits::exactly(1), T0, 0);
            }
        }
        let stats = cache.stats();
        assert!(stats.entries <= 32, "{stats:?}");
        assert_eq!(stats.evictions, 1000 - stats.entries as u64);
        cache.purge(T0.saturating_add(Nanos::from_secs(2)));
        assert_eq!(cache.stats().entries, 0);
    }

    /// A plan of a one-an-hour GCRA for `scope`, and a rejection of it
    /// (the second request at `T0`) as Redis answers it.
    fn rejected(g: &Arc<Limit>, scope: &str) -> (Plan, PlanDecision) {
        let p = plan(g, scope);
        let mut state = Algorithm::fresh(&**g);
        let mut d = None;
        for _ in 0..2 {
            d = Some(
                decide_one(&**g, &mut state, false, T0, Hits::exactly(1))
                    .into_plan_decision(Hits::exactly(1), false),
            );
        }
        let d = d.unwrap_or_else(|| panic!("decided twice"));
        assert!(!d.allowed);
        (p, d)
    }

    fn hourly() -> Arc<Limit> {
        Arc::new(Limit::Gcra(
            Gcra::new(Rate::new(1, HOUR).unwrap_or_else(|e| panic!("{e}")), 1)
                .unwrap_or_else(|e| panic!("{e}")),
        ))
    }

    /// Second review of issue 17: each of the 16 shards got the capacity
    /// divided by 16 rounded up, so a cache of 20 held 32 entries, and one
    /// of 1 held 16. The capacity is split exactly now.
    #[test]
    fn the_capacity_is_exact_whatever_its_split_over_the_shards() {
        let g = hourly();
        for capacity in [1, 5, 20, 100] {
            let cache = RejectionCache::new(capacity, CacheClock::Caller, HOUR);
            for i in 0..2000 {
                let (p, d) = rejected(&g, &format!("user-{i}"));
                cache.learn(&p, &d, Hits::exactly(1), T0, cache.generation());
            }
            // 2,000 keys fill every shard's room (about 125 land in each).
            assert_eq!(cache.stats().entries, capacity, "capacity {capacity}");
        }
    }

    /// Second review of issue 17: `clear` (the store found Redis lost its
    /// data) dropped the entries present, but an answer to a call sent
    /// before it, read after it, became an entry again: a rejection Redis
    /// may have decided before it lost the key, answered for up to the
    /// entry cap. An answer is learnt only if no clear ran since its call
    /// was sent.
    #[test]
    fn an_answer_to_a_call_sent_before_a_clear_is_not_learnt() {
        let g = hourly();
        let cache = RejectionCache::new(64, CacheClock::Caller, HOUR);
        let (p, d) = rejected(&g, "acme");
        let sent = cache.generation();
        cache.clear();
        cache.learn(&p, &d, Hits::exactly(1), T0, sent);
        assert_eq!(cache.stats().entries, 0);
        assert!(cache.answer(&p, T0, Hits::exactly(1)).is_none());
        // A call sent after the clear is learnt as ever.
        cache.learn(&p, &d, Hits::exactly(1), T0, cache.generation());
        assert_eq!(cache.stats().entries, 1);
        assert!(cache.answer(&p, T0, Hits::exactly(1)).is_some());
    }
}
