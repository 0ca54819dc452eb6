//! The thesis's data sets (seed 000, §4.3.4), generated from a capacity
//! parameter `c` and a seed, and the thesis's trace export format.
//!
//! The thesis evaluated its designs on recorded Spotify traffic that is
//! not public; only the shape of each set survives (how many users, how
//! long, how many requests as a multiple of the confidential capacity `c`).
//! Each generator below reproduces that shape and documents every choice
//! the thesis leaves open, marked **assumption**.
//!
//! Common to every set:
//!
//! - The limit is a token bucket of capacity `c` refilled at `0.001·c`
//!   tokens per second (one token every `1000/c` s; an empty bucket is full
//!   again after 1000 s), Table 4.1; D alone has its own (Table 4.3).
//! - Times have millisecond resolution (the thesis's export records Unix
//!   milliseconds) and several requests may share a millisecond, as in the
//!   recorded traffic (T:825). They run from the data set's start, which is
//!   not necessarily an arrival, and stay below [`DataSet::duration`].
//! - User ids are 32 lowercase hexadecimal characters, like the thesis's
//!   export (T:808), drawn from the seed.
//! - The same kind, capacity, seed and user count give the same data set,
//!   bit for bit. The random stream is a SplitMix64 generator implemented
//!   here (with inverse-transform exponential and Box–Muller normal
//!   samples), so a data set does not change when `rand` or `rand_distr`
//!   change their algorithms; the only platform dependence is the last bit
//!   of `f64::ln`/`exp`/`cos`, which can at most move a time by a rounding
//!   step on an exotic libm.
//! - Which user is rate-limited is guaranteed by construction wherever the
//!   thesis says so: a user is given a burst of more than `c + c·T/1000`
//!   requests within `T` seconds (a bucket holds at most `c` tokens and
//!   refills `c·T/1000` in that span, so it must reject), and a user that
//!   must not be limited is given at most `c` requests in all.
//!
//! [`centralized_decisions`] runs a set through one core token bucket per
//! user: the ground truth in its simplest form.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use tollgate_core::{Algorithm, Hits, Nanos, Rate, TokenBucket};

use crate::Arrival;

/// The default capacity parameter `c` (300: then the window `c/30` of
/// Table 4.2 is a whole 10 and one token refills every 3⅓ s).
pub const DEFAULT_CAPACITY: u64 = 300;

/// The default seed (runs are seeded 1..=10, as the thesis's 10 runs).
pub const DEFAULT_SEED: u64 = 1;

/// The default number of users of data set C (the thesis's 5000, T:892).
pub const DEFAULT_C_USERS: usize = 5000;

/// The largest capacity [`generate`] accepts; larger values are clamped
/// (68.3 million requests for A is already beyond any simulation).
pub const MAX_CAPACITY: u64 = 1_000_000;

/// The share of data set C's users that are rate-limited, in percent.
/// **Assumption**: the thesis matched "the same distribution of
/// rate-limited users and non-rate-limited users" of a real hour (T:894)
/// without giving it, saying only that "the vast majority" are not limited
/// (T:886).
pub const C_LIMITED_PERCENT: u64 = 2;

const SECOND_MS: u64 = 1_000;
const MINUTE_MS: u64 = 60 * SECOND_MS;

/// A generated (or loaded) data set: the traffic and the limit it is
/// judged against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataSet {
    /// The data set's name: `A`, `B-extreme`, `B-substantial`, `B-barely`,
    /// `B-unlimited`, `C` or `D` (see [`Kind`]).
    pub name: String,
    /// The token bucket's capacity.
    pub capacity: u64,
    /// The token bucket's refill: `0.001·c` per second (`c` per 1000 s),
    /// except D's 1 per second.
    pub rate: Rate,
    /// The requests, sorted by time (stably), times from the set's start.
    pub arrivals: Vec<Arrival>,
    /// The span the data set covers: every arrival is before it.
    pub duration: Nanos,
    /// One line: what the set is and how it was generated.
    pub description: String,
}

/// Which of the thesis's data sets (§4.3.4).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Ten rate-limited users over five minutes, 68.3c requests.
    A,
    /// One user over one minute, 21.5c requests, front-loaded.
    BExtreme,
    /// One user over one minute, 3.2c requests.
    BSubstantial,
    /// One user over one minute, 1.1c requests: limited only at the end.
    BBarely,
    /// One user over two minutes on a fixed interval slightly slower than
    /// the refill: never limited.
    BUnlimited,
    /// Many users (5000 by default) over one hour, few of them limited.
    C,
    /// One user, a request every 0.9 s for 100 s, against capacity 5 and a
    /// refill of 1/s.
    D,
}

impl Kind {
    /// Every data set, in the thesis's order.
    pub const ALL: [Kind; 7] = [
        Kind::A,
        Kind::BExtreme,
        Kind::BSubstantial,
        Kind::BBarely,
        Kind::BUnlimited,
        Kind::C,
        Kind::D,
    ];

    /// The data set's name, as [`fmt::Display`] writes it and
    /// [`FromStr`] reads it.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::A => "A",
            Kind::BExtreme => "B-extreme",
            Kind::BSubstantial => "B-substantial",
            Kind::BBarely => "B-barely",
            Kind::BUnlimited => "B-unlimited",
            Kind::C => "C",
            Kind::D => "D",
        }
    }

    /// Separates the random streams of the kinds, so one seed gives
    /// unrelated sets.
    const fn stream(self) -> u64 {
        match self {
            Kind::A => 0xA,
            Kind::BExtreme => 0xB1,
            Kind::BSubstantial => 0xB2,
            Kind::BBarely => 0xB3,
            Kind::BUnlimited => 0xB4,
            Kind::C => 0xC,
            Kind::D => 0xD,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`Kind::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown data set `{0}`")]
pub struct UnknownKind(pub String);

impl FromStr for Kind {
    type Err = UnknownKind;

    /// Reads a name as [`Kind::name`] writes it, ignoring ASCII case.
    fn from_str(s: &str) -> Result<Kind, UnknownKind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownKind(s.to_owned()))
    }
}

/// What a data set is generated from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// The capacity parameter `c` ([`DEFAULT_CAPACITY`]); clamped to
    /// `1..=`[`MAX_CAPACITY`]. D ignores it (capacity 5, Table 4.3).
    pub capacity: u64,
    /// The seed of every random choice.
    pub seed: u64,
    /// Data set C's number of users ([`DEFAULT_C_USERS`] when `None`);
    /// the other sets ignore it.
    pub users: Option<usize>,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            capacity: DEFAULT_CAPACITY,
            seed: DEFAULT_SEED,
            users: None,
        }
    }
}

/// Generates data set `kind` from `params`; the same inputs give the same
/// set, bit for bit. See each generator's documentation ([`Kind`] and the
/// module documentation) for the choices made.
pub fn generate(kind: Kind, params: &Params) -> DataSet {
    let c = params.capacity.clamp(1, MAX_CAPACITY);
    let mut rng = Rng::new(params.seed, kind.stream());
    let shape = match kind {
        Kind::A => gen_a(c, &mut rng),
        Kind::BExtreme => gen_b_extreme(c, &mut rng),
        Kind::BSubstantial => gen_b_substantial(c, &mut rng),
        Kind::BBarely => gen_b_barely(c, &mut rng),
        Kind::BUnlimited => gen_b_unlimited(c, &mut rng),
        Kind::C => gen_c(c, params.users.unwrap_or(DEFAULT_C_USERS), &mut rng),
        Kind::D => gen_d(&mut rng),
    };
    let mut events = shape.events;
    // Stable: requests of one millisecond keep their generation order.
    events.sort_by_key(|&(ms, _)| ms);
    let arrivals = events
        .into_iter()
        .map(|(ms, user)| Arrival {
            at: Nanos::from_millis(ms),
            user: shape.users.get(user).cloned().unwrap_or_default(),
            told: None,
        })
        .collect();
    DataSet {
        name: kind.name().to_owned(),
        capacity: shape.capacity,
        rate: shape.rate,
        arrivals,
        duration: Nanos::from_millis(shape.duration_ms),
        description: format!(
            "{}: {} (seed {})",
            kind.name(),
            shape.description,
            params.seed
        ),
    }
}

/// What a generator produces, before sorting.
struct Shape {
    capacity: u64,
    rate: Rate,
    users: Vec<String>,
    /// `(millisecond, index into users)`.
    events: Vec<(u64, usize)>,
    duration_ms: u64,
    description: String,
}

/// `c` per 1000 s: one token every `1000/c` s.
fn thesis_rate(c: u64) -> Rate {
    // `c` is in 1..=MAX_CAPACITY, so the interval is at least a
    // millisecond: the rate is always valid. The fallback only keeps this
    // function total.
    match Rate::new(c, Nanos::from_secs(1000)) {
        Ok(rate) => rate,
        Err(_) => one_per_second(),
    }
}

/// One token per second (data set D).
fn one_per_second() -> Rate {
    match Rate::per_second(1) {
        Ok(rate) => rate,
        // One hit per second is valid by Rate's own rules.
        Err(e) => unreachable!("1/s is a valid rate: {e}"),
    }
}

/// `round(tenths · c / 10)`, half up: `round(68.3·c)` is `tenths(683, c)`.
fn tenths(tenths: u64, c: u64) -> u64 {
    (tenths * c + 5) / 10
}

/// The fewest requests a burst of `span_ms` must hold so that a bucket of
/// `c` refilled at `c` per 1000 s rejects one of them whatever it held
/// before: more than `c` plus the refill `c·span/1000 s`, with a margin of
/// one for the refill interval's rounding.
fn must_limit(c: u64, span_ms: u64) -> u64 {
    c + (c * span_ms).div_ceil(1_000_000) + 2
}

/// **A** (T:870-878): ten users over five minutes, `round(68.3·c)`
/// requests in total, every user rate-limited at least once.
///
/// - The per-user counts were only in the lost Fig 4.6. **Assumption**:
///   every user first gets [`must_limit`]`(c, 10 s)` requests (enough for
///   one limiting burst), and the rest is split by lognormal weights
///   (median 1, σ = 1), a skewed split in which the heaviest user usually
///   has several times the lightest's requests.
/// - **Assumption**: every user is on/off: its five minutes are cut into
///   3 to 6 equal slots with one burst (an "on" period) in each and
///   silence around it. One burst, the limiting one, lasts 2–10 s and
///   holds at least [`must_limit`] requests for its span, so a centralized
///   bucket must reject; the others last from 1 s to 60 % of the slot.
///   Requests are uniform within a burst (a Poisson process given its
///   count), and the requests beyond the limiting minimum are split among
///   the bursts by exponential weights.
fn gen_a(c: u64, rng: &mut Rng) -> Shape {
    const USERS: usize = 10;
    const SPAN_MS: u64 = 5 * MINUTE_MS;
    let total = tenths(683, c);
    let base = must_limit(c, 10 * SECOND_MS);
    let extra = total.saturating_sub(base * USERS as u64);
    let weights: Vec<f64> = (0..USERS).map(|_| rng.lognormal(1.0, 1.0)).collect();
    let extras = split(extra, &weights);
    let users = user_ids(rng, USERS);
    let mut events = Vec::with_capacity(total as usize);
    for (user, extra) in extras.into_iter().enumerate() {
        let n = base + extra;
        let bursts = rng.range(3, 6);
        let slot = SPAN_MS / bursts;
        let main = rng.below(bursts);
        let main_span = rng.range(2 * SECOND_MS, 10 * SECOND_MS);
        let need = must_limit(c, main_span);
        let weights: Vec<f64> = (0..bursts).map(|_| rng.exp()).collect();
        let shares = split(n.saturating_sub(need), &weights);
        for (j, share) in (0..bursts).zip(shares) {
            let (span, count) = if j == main {
                (main_span, need + share)
            } else {
                (rng.range(SECOND_MS, slot * 6 / 10), share)
            };
            let start = j * slot + rng.below(slot - span + 1);
            spread(rng, &mut events, user, count, start, span);
        }
    }
    // With the integer rounding `n` can only exceed `total` if `c` is so
    // small that ten limiting bursts do not fit, which c ≥ 1 rules out.
    Shape {
        capacity: c,
        rate: thesis_rate(c),
        users,
        events,
        duration_ms: SPAN_MS,
        description: format!(
            "10 rate-limited users over 5 min, {total} requests (68.3c, c = {c}) split by \
             lognormal weights; each user on/off in 3-6 bursts, one of them more than the \
             bucket can take"
        ),
    }
}

/// **B-extreme** (T:880-886): one user over one minute, `round(21.5·c)`
/// requests, "a rapid influx" (T:1049) that limits the user within
/// seconds (the thesis's counter stopped gossiping after about 10 s,
/// T:987).
///
/// **Assumption**: six bursts with halving weights (each ×0.75–1.25 at
/// random): the first starts within the first second and lasts 8–11 s
/// (about half the requests), the other five sit in equal 9.6 s slots of
/// the remaining 48 s and last 40–90 % of their slot.
fn gen_b_extreme(c: u64, rng: &mut Rng) -> Shape {
    let total = tenths(215, c);
    let users = user_ids(rng, 1);
    let mut spans = vec![(
        rng.below(SECOND_MS),
        rng.range(8 * SECOND_MS, 11 * SECOND_MS),
    )];
    let slot = 9_600;
    for j in 0..5 {
        let span = rng.range(slot * 4 / 10, slot * 9 / 10);
        spans.push((12 * SECOND_MS + j * slot + rng.below(slot - span + 1), span));
    }
    let weights: Vec<f64> = (0..spans.len())
        .map(|j| 0.5f64.powi(j as i32) * (0.75 + 0.5 * rng.unit()))
        .collect();
    let mut events = Vec::with_capacity(total as usize);
    for ((start, span), count) in spans.into_iter().zip(split(total, &weights)) {
        spread(rng, &mut events, 0, count, start, span);
    }
    Shape {
        capacity: c,
        rate: thesis_rate(c),
        users,
        events,
        duration_ms: MINUTE_MS,
        description: format!(
            "one user over 1 min, {total} requests (21.5c, c = {c}) in six front-loaded \
             bursts of halving size, the first in the first ~10 s"
        ),
    }
}

/// **B-substantial** (T:884): one user over one minute, `round(3.2·c)`
/// requests, three times what a bucket admits in a minute (1.06c).
///
/// **Assumption**: on/off bursts spread over the whole minute: 4 to 6
/// equal slots, one burst of 30–70 % of its slot in each, the requests
/// split by exponential weights.
fn gen_b_substantial(c: u64, rng: &mut Rng) -> Shape {
    let total = tenths(32, c);
    let users = user_ids(rng, 1);
    let bursts = rng.range(4, 6);
    let slot = MINUTE_MS / bursts;
    let weights: Vec<f64> = (0..bursts).map(|_| rng.exp()).collect();
    let mut events = Vec::with_capacity(total as usize);
    for (j, count) in (0..bursts).zip(split(total, &weights)) {
        let span = rng.range(slot * 3 / 10, slot * 7 / 10);
        let start = j * slot + rng.below(slot - span + 1);
        spread(rng, &mut events, 0, count, start, span);
    }
    Shape {
        capacity: c,
        rate: thesis_rate(c),
        users,
        events,
        duration_ms: MINUTE_MS,
        description: format!(
            "one user over 1 min, {total} requests (3.2c, c = {c}) in {bursts} on/off bursts \
             spread over the minute"
        ),
    }
}

/// **B-barely** (T:884, T:1015): one user over one minute, `round(1.1·c)`
/// requests, just above the 1.06c a bucket admits in a minute, so that
/// the centralized limiter rejects only "towards the end".
///
/// **Assumption**: nearly uniform: request `i` of `n` is at
/// `(i + ½ + j)·60 s/n` with a jitter `j` uniform in ±0.4. The bucket
/// drains at `c·(1.1/60 − 0.001)` per second and is empty after about
/// 57.7 s; about 0.04c requests are rejected, all in the last seconds.
fn gen_b_barely(c: u64, rng: &mut Rng) -> Shape {
    let total = tenths(11, c);
    let users = user_ids(rng, 1);
    let step = MINUTE_MS as f64 / total.max(1) as f64;
    let events = (0..total)
        .map(|i| {
            let at = (i as f64 + 0.5 + 0.8 * (rng.unit() - 0.5)) * step;
            ((at.max(0.0) as u64).min(MINUTE_MS - 1), 0)
        })
        .collect();
    Shape {
        capacity: c,
        rate: thesis_rate(c),
        users,
        events,
        duration_ms: MINUTE_MS,
        description: format!(
            "one user over 1 min, {total} requests (1.1c, c = {c}) nearly uniform (±40 % \
             jitter), limited only in the last seconds"
        ),
    }
}

/// **B-unlimited** (T:886): a fabricated user "on a fixed interval
/// slightly [slower] than the refill rate" over two minutes; no request is
/// ever rejected.
///
/// **Assumption** (the thesis gives no factor): the interval is 1.05 ×
/// the refill interval, `1.05 × 1000/c` s, with request `k` at
/// `floor(k·1050/c s)` in whole milliseconds, from 0 while before 120 s
/// (35 requests for c = 300).
fn gen_b_unlimited(c: u64, rng: &mut Rng) -> Shape {
    const SPAN_MS: u64 = 2 * MINUTE_MS;
    let users = user_ids(rng, 1);
    let events: Vec<(u64, usize)> = (0..)
        .map(|k: u64| (k * 1_050_000 / c, 0))
        .take_while(|&(ms, _)| ms < SPAN_MS)
        .collect();
    Shape {
        capacity: c,
        rate: thesis_rate(c),
        users,
        description: format!(
            "one fabricated user over 2 min, {} requests every 1.05 refill intervals \
             ({:.1} s for c = {c}): never limited",
            events.len(),
            1050.0 / c as f64
        ),
        events,
        duration_ms: SPAN_MS,
    }
}

/// **C** (T:888-894): `users` users over one hour, a few of them
/// rate-limited, users arriving all through the hour (Fig 5.14).
///
/// **Assumptions** (the thesis gives only the user count and the hour):
///
/// - [`C_LIMITED_PERCENT`] (2 %) of the users, rounded and at least one,
///   chosen at random, are rate-limited; the rest are not.
/// - Every user's first request is uniform over the hour (over its first
///   59 minutes for limited users, so their burst fits).
/// - Per-user volume is lognormal, median 6 requests and σ = 1.3 (mean
///   about 14, heavy tail), rounded and at least 1. A user that is not
///   limited is capped at `c` requests in all, which a bucket starting
///   full always admits; with c = 300 the cap touches about 0.1 % of
///   them.
/// - That volume comes in 1 to 4 sparse sessions: the first at the first
///   request, the others uniform between it and the end of the hour, the
///   volume split among them (at least one request each) by exponential
///   weights; within a session the gaps are exponential with a 15 s mean.
///   Requests a session would place after the hour are dropped.
/// - A limited user also gets one burst of 2–10 s holding
///   [`must_limit`] requests for its span plus up to `c/2` more, starting
///   uniformly between its first request and the end of the hour.
///
/// The default (5000 users, c = 300) holds about 100 000 requests.
fn gen_c(c: u64, users: usize, rng: &mut Rng) -> Shape {
    const SPAN_MS: u64 = 60 * MINUTE_MS;
    const GAP_MS: f64 = 15_000.0;
    let ids = user_ids(rng, users);
    let limited_count = if users == 0 {
        0
    } else {
        ((users as u64 * C_LIMITED_PERCENT + 50) / 100).max(1) as usize
    };
    let limited: HashSet<usize> = choose(rng, users, limited_count);
    let mut events = Vec::new();
    for user in 0..users {
        let is_limited = limited.contains(&user);
        let first = if is_limited {
            rng.below(SPAN_MS - MINUTE_MS)
        } else {
            rng.below(SPAN_MS)
        };
        let mut volume = (rng.lognormal(6.0, 1.3).round() as u64).max(1);
        if !is_limited {
            volume = volume.min(c);
        }
        let sessions = rng.range(1, volume.min(4));
        let weights: Vec<f64> = (0..sessions).map(|_| rng.exp()).collect();
        let counts = split(volume - sessions, &weights);
        for (s, extra) in counts.into_iter().enumerate() {
            let mut at = if s == 0 {
                first
            } else {
                first + rng.below(SPAN_MS - first)
            };
            for k in 0..=extra {
                if k > 0 {
                    at += (rng.exp() * GAP_MS).round() as u64;
                }
                if at >= SPAN_MS {
                    break;
                }
                events.push((at, user));
            }
        }
        if is_limited {
            let span = rng.range(2 * SECOND_MS, 10 * SECOND_MS);
            let count = must_limit(c, span) + rng.below(c / 2 + 1);
            let start = first + rng.below(SPAN_MS - span - first);
            spread(rng, &mut events, user, count, start, span);
        }
    }
    Shape {
        capacity: c,
        rate: thesis_rate(c),
        users: ids,
        description: format!(
            "{users} users over 1 h, {} requests (c = {c}); {limited_count} users \
             ({C_LIMITED_PERCENT} %, assumed) rate-limited by a burst, the rest in sparse \
             sessions of lognormal volume capped at c; first requests uniform over the hour",
            events.len()
        ),
        events,
        duration_ms: SPAN_MS,
    }
}

/// **D** (T:896-905, Table 4.3): capacity 5, refill 1 token per second,
/// one user sending a request every 0.9 s from 0 for 100 s: 112 requests
/// (at 0, 0.9, …, 99.9 s). A token bucket rejects 8 of them, the first at
/// 36.9 s and then every 9 s. The capacity parameter is ignored.
fn gen_d(rng: &mut Rng) -> Shape {
    const SPAN_MS: u64 = 100 * SECOND_MS;
    let users = user_ids(rng, 1);
    let events: Vec<(u64, usize)> = (0..)
        .map(|k: u64| (k * 900, 0))
        .take_while(|&(ms, _)| ms < SPAN_MS)
        .collect();
    Shape {
        capacity: 5,
        rate: one_per_second(),
        users,
        description: format!(
            "one user, a request every 0.9 s for 100 s ({} requests) against capacity 5, \
             refill 1/s",
            events.len()
        ),
        events,
        duration_ms: SPAN_MS,
    }
}

/// `count` requests of `user` uniform in `[start, start + span)` ms.
fn spread(
    rng: &mut Rng,
    events: &mut Vec<(u64, usize)>,
    user: usize,
    count: u64,
    start: u64,
    span: u64,
) {
    for _ in 0..count {
        events.push((start + rng.below(span.max(1)), user));
    }
}

/// `total` split in proportion to `weights` by largest remainders (ties
/// to the lower index); the parts sum to `total` exactly. Weights that
/// are not positive and finite count as zero; all zero splits evenly.
fn split(total: u64, weights: &[f64]) -> Vec<u64> {
    let n = weights.len();
    if n == 0 {
        return Vec::new();
    }
    let clean: Vec<f64> = weights
        .iter()
        .map(|&w| if w.is_finite() && w > 0.0 { w } else { 0.0 })
        .collect();
    let sum: f64 = clean.iter().sum();
    let exact: Vec<f64> = if sum > 0.0 {
        clean.iter().map(|w| w / sum * total as f64).collect()
    } else {
        vec![total as f64 / n as f64; n]
    };
    let mut parts: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    let mut assigned: u64 = parts.iter().sum();
    // Rounding can only overshoot by a hair; take it back from the largest.
    while assigned > total {
        if let Some(max) = parts.iter_mut().max() {
            *max -= 1;
            assigned -= 1;
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        let fa = exact[a] - parts[a] as f64;
        let fb = exact[b] - parts[b] as f64;
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take((total - assigned) as usize) {
        parts[i] += 1;
    }
    parts
}

/// `count` distinct indices below `n` (all of them if `count >= n`).
fn choose(rng: &mut Rng, n: usize, count: usize) -> HashSet<usize> {
    // A partial Fisher-Yates shuffle: deterministic and O(n).
    let mut all: Vec<usize> = (0..n).collect();
    let count = count.min(n);
    for i in 0..count {
        let j = i + rng.below((n - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(count);
    all.into_iter().collect()
}

/// `n` distinct 32-character lowercase hexadecimal user ids.
fn user_ids(rng: &mut Rng, n: usize) -> Vec<String> {
    let mut seen = HashSet::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    while ids.len() < n {
        let id = format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64());
        if seen.insert(id.clone()) {
            ids.push(id);
        }
    }
    ids
}

/// SplitMix64 (Steele, Lea and Flood 2014): small, fast, statistically
/// sound for simulation, and fixed here so data sets never change with a
/// dependency.
struct Rng {
    state: u64,
}

impl Rng {
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

    fn new(seed: u64, stream: u64) -> Rng {
        let mut seeding = Rng { state: seed };
        let mixed = seeding.next_u64();
        Rng {
            state: mixed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03),
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(Self::GOLDEN);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (0 when `n` is 0), by multiply-high.
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[lo, hi]` (`lo` when `hi < lo`).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo).saturating_add(1))
    }

    /// Uniform in `[0, 1)`, 53 bits.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Exponential with mean 1.
    fn exp(&mut self) -> f64 {
        -(1.0 - self.unit()).ln()
    }

    /// Standard normal (Box–Muller, one of the pair).
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit();
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Lognormal with the given median and log-scale σ.
    fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }
}

/// Whether each arrival of `set` is accepted by one core
/// [`TokenBucket`] per user (capacity and rate from the set, starting
/// full), in order: the centralized ground truth in its simplest form. A
/// set whose limit the core refuses (capacity 0) accepts nothing.
pub fn centralized_decisions(set: &DataSet) -> Vec<bool> {
    let Ok(bucket) = TokenBucket::new(set.capacity, set.rate) else {
        return vec![false; set.arrivals.len()];
    };
    let mut states: HashMap<&str, <TokenBucket as Algorithm>::State> = HashMap::new();
    set.arrivals
        .iter()
        .map(|a| {
            let state = states
                .entry(a.user.as_str())
                .or_insert_with(|| bucket.fresh());
            bucket.decide(state, a.at, Hits::exactly(1)).allowed
        })
        .collect()
}

/// `(accepted, rejected)` of [`centralized_decisions`].
pub fn centralized_rejections(set: &DataSet) -> (u64, u64) {
    let decisions = centralized_decisions(set);
    let accepted = decisions.iter().filter(|&&d| d).count() as u64;
    (accepted, decisions.len() as u64 - accepted)
}

/// Parses the thesis's export (T:803-815): a JSON array of
/// `{"user_id": "…", "time": <Unix milliseconds>}`.
///
/// `user_id` is a string (a number is taken as its decimal text); `time`
/// an integer or a fractional number of milliseconds, kept to the
/// microsecond. Any other field is refused, naming it. The arrivals are
/// sorted by time (stably) and made relative to the first.
pub fn from_thesis_json(text: &str) -> Result<Vec<Arrival>, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let serde_json::Value::Array(items) = value else {
        return Err("expected a JSON array of {\"user_id\", \"time\"} objects".into());
    };
    let mut arrivals = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let serde_json::Value::Object(fields) = item else {
            return Err(format!(
                "entry {i}: expected an object {{\"user_id\", \"time\"}}, found {item}"
            ));
        };
        if let Some(unknown) = fields.keys().find(|k| *k != "user_id" && *k != "time") {
            return Err(format!(
                "entry {i}: unknown field `{unknown}` (expected only `user_id` and `time`)"
            ));
        }
        let user = match fields.get("user_id") {
            Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            Some(other) => {
                return Err(format!(
                    "entry {i}: `user_id` must be a non-empty string, found {other}"
                ))
            }
            None => return Err(format!("entry {i}: missing field `user_id`")),
        };
        let at = match fields.get("time") {
            Some(serde_json::Value::Number(n)) => {
                millis_to_nanos(n).map_err(|e| format!("entry {i}: {e}"))?
            }
            Some(other) => {
                return Err(format!(
                    "entry {i}: `time` must be a number of milliseconds, found {other}"
                ))
            }
            None => return Err(format!("entry {i}: missing field `time`")),
        };
        arrivals.push(Arrival {
            at,
            user,
            told: None,
        });
    }
    arrivals.sort_by_key(|a| a.at);
    let origin = arrivals.first().map_or(Nanos::ZERO, |a| a.at);
    for a in &mut arrivals {
        a.at = a.at.saturating_sub(origin);
    }
    Ok(arrivals)
}

/// Unix milliseconds (integral or fractional) to nanoseconds, to the
/// microsecond.
fn millis_to_nanos(n: &serde_json::Number) -> Result<Nanos, String> {
    if let Some(ms) = n.as_u64() {
        return ms
            .checked_mul(1_000_000)
            .map(Nanos::new)
            .ok_or_else(|| format!("`time` {ms} is too large"));
    }
    let ms = n.as_f64().unwrap_or(f64::NAN);
    if !ms.is_finite() || ms < 0.0 {
        return Err(format!("`time` {n} is not a non-negative number"));
    }
    let micros = (ms * 1000.0).round();
    if micros >= (u64::MAX / 1000) as f64 {
        return Err(format!("`time` {n} is too large"));
    }
    Ok(Nanos::from_micros(micros as u64))
}

/// Writes `arrivals` in the thesis's export format, the inverse of
/// [`from_thesis_json`]: `time` is `start_unix_ms` plus the arrival's
/// time, an integer when it is a whole millisecond.
pub fn to_thesis_json(arrivals: &[Arrival], start_unix_ms: u64) -> String {
    let items: Vec<serde_json::Value> = arrivals
        .iter()
        .map(|a| {
            let ns = a.at.as_u64();
            let time = if ns % 1_000_000 == 0 {
                serde_json::Value::from(start_unix_ms.saturating_add(ns / 1_000_000))
            } else {
                serde_json::Value::from(start_unix_ms as f64 + a.at.as_millis_f64())
            };
            serde_json::json!({ "user_id": a.user, "time": time })
        })
        .collect();
    serde_json::Value::Array(items).to_string()
}
