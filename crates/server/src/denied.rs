//! The domains a server refused most, per resource, lately: what the
//! config API's console shows as "top denied domains" (`GET /v1/denied`).
//!
//! Registered Prometheus metrics cannot carry this: a `domain` label
//! would make a series per domain a client ever sent, kept by the exporter
//! for good. [`write_metrics`] shows the top ranks on `/metrics` instead
//! (`serve --denied-metrics-top`), written from these summaries at each
//! scrape, so their series are bounded by ranks × resources per scrape,
//! and only domains counted for certain at least [`MIN_METRIC_REFUSALS`]
//! times are named. Here each resource keeps a Space-Saving summary (Metwally, Agrawal and
//! El Abbadi, 2005) of [`TOP`] counters: a domain not yet counted takes
//! the place of the smallest counter and starts from its count, so the
//! domains refused most are kept (with counts that may be over by at most
//! the smallest counter) in fixed memory, whatever domains clients send.
//! Counts cover the current window of [`WINDOW`] and the one before, so
//! "lately" means the last one to two minutes. Time is the app's clock.

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, TryLockError};

use hashbrown::{DefaultHashBuilder, HashMap};
use serde::Serialize;

/// Counters kept per resource.
pub const TOP: usize = 16;

/// The length of a window (ns): one minute.
pub const WINDOW: u64 = 60_000_000_000;

/// The most resources counted at once: past it, rejections of a resource
/// not yet counted are not (and are counted in
/// `tollgate_denied_uncounted_total`). Only configured resources are
/// recorded, so this is a bound against configs replaced many times; a
/// resource with nothing refused for two windows gives its place up at
/// the next [`Denied::top`] (a refusal never sweeps: it would take every
/// shard's lock on the request path).
pub const MAX_RESOURCES: usize = 10_000;

/// The longest domain kept, in bytes (a longer one is cut at a character
/// boundary): a client chooses domains.
pub const MAX_DOMAIN_BYTES: usize = 128;

/// The most ranks per resource `/metrics` shows
/// (`serve --denied-metrics-top`): what `GET /v1/denied` answers.
pub const MAX_METRIC_RANKS: usize = 10;

/// The fewest refusals `/metrics` names a domain for: counted for certain
/// (a counter's `rejected - error`, never what it inherited from the
/// domain it replaced) in the current window and the last. A client
/// that sends refused requests under ever new domains puts each of them
/// in a summary at the smallest counter's count plus one, with all but
/// the one as `error`: shown by `rejected`, a domain refused once would
/// read as a heavy hitter, and a flood of them would put a new name at
/// every rank at every scrape. With this floor, each name `/metrics`
/// ever shows cost its sender this many refusals within two minutes.
pub const MIN_METRIC_REFUSALS: u64 = 10;

/// The most resources `/metrics` shows ranks of at one scrape: those
/// whose first rank has the most refusals. With
/// [`MAX_METRIC_RANKS`], a scrape has at most 10,000 series of each of
/// the two families, whatever domains clients send.
pub const MAX_METRIC_RESOURCES: usize = 1_000;

/// Shards of the resource table: refusals of different resources take
/// different locks, and a refusal takes its shard's lock only to read.
const SHARDS: usize = 16;

/// One domain's count in a summary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Counted {
    /// The domain (cut to [`MAX_DOMAIN_BYTES`]).
    pub domain: String,
    /// Rejections counted for it (at most the true count plus `error`).
    pub rejected: u64,
    /// How much of `rejected` may belong to domains it replaced.
    pub error: u64,
}

/// A Space-Saving summary of at most [`TOP`] counters.
#[derive(Clone, Debug, Default)]
struct Summary {
    counters: Vec<Counted>,
    /// Each counter's domain hashed ([`Denied::hasher`]), at the same
    /// index: domains are compared by hash first, so a client sending
    /// long domains that differ only at the end costs neither a refusal
    /// nor a scrape a string comparison per counter.
    hashes: Vec<u64>,
}

impl Summary {
    /// The counter of `domain` (hashed `hash`), if it has one.
    fn find(&self, hash: u64, domain: &str) -> Option<usize> {
        self.hashes
            .iter()
            .zip(&self.counters)
            .position(|(&h, c)| h == hash && c.domain == domain)
    }

    fn add(&mut self, hash: u64, domain: &str, n: u64) {
        if let Some(c) = self
            .find(hash, domain)
            .and_then(|i| self.counters.get_mut(i))
        {
            c.rejected = c.rejected.saturating_add(n);
            return;
        }
        if self.counters.len() < TOP {
            self.counters.push(Counted {
                domain: domain.to_owned(),
                rejected: n,
                error: 0,
            });
            self.hashes.push(hash);
            return;
        }
        let min = (0..self.counters.len()).min_by_key(|&i| self.counters[i].rejected);
        if let (Some(min), Some(h)) = (
            min.and_then(|i| self.counters.get_mut(i)),
            min.and_then(|i| self.hashes.get_mut(i)),
        ) {
            let floor = min.rejected;
            // The replaced domain's buffer is reused: no allocation once
            // the summary is full, whatever domains clients send.
            min.domain.clear();
            min.domain.push_str(domain);
            min.rejected = floor.saturating_add(n);
            min.error = floor;
            *h = hash;
        }
    }

    fn clear(&mut self) {
        self.counters.clear();
        self.hashes.clear();
    }
}

/// One resource's summaries: this window's and the last one's.
#[derive(Default)]
struct Windows {
    /// When the current window started (ns).
    start: u64,
    current: Summary,
    previous: Summary,
    /// Set by the sweep that dropped it from the table, under this lock:
    /// a refusal that looked the entry up before must not count into it
    /// (nobody would read the count).
    removed: bool,
}

impl Windows {
    /// Moves the windows on to `now`.
    fn advance(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.start);
        if elapsed < WINDOW {
            return;
        }
        self.previous = if elapsed < 2 * WINDOW {
            std::mem::take(&mut self.current)
        } else {
            self.current.clear();
            Summary::default()
        };
        self.start = now - elapsed % WINDOW;
    }

    /// Whether nothing was refused in this window or the last.
    fn is_idle(&self) -> bool {
        self.current.counters.is_empty() && self.previous.counters.is_empty()
    }
}

/// A shard: namespace, then resource (two levels, so a refusal looks its
/// resource up by `&str` without building a key, and `a` + `b/c` is never
/// `a/b` + `c`). hashbrown's foldhash rather than SipHash: a refusal
/// hashes three times (the shard, then each level), and SipHash made that
/// a tenth of what serving a refusal costs. foldhash does not resist
/// chosen keys the way SipHash does, and needs not here: only resources
/// the config names are recorded (an unconfigured one is never refused
/// into this table), at most [`MAX_RESOURCES`] of them, so a client cannot
/// add keys at all; the domains it does choose go into each resource's
/// fixed-size summary, which is not a hash table.
/// Names are `Arc<str>` so that a scrape copies them out of the shard's
/// lock by a reference count, not a string each.
type Shard = HashMap<Arc<str>, HashMap<Arc<str>, Arc<Mutex<Windows>>>>;

/// The recently refused domains of every resource.
///
/// A refusal takes a read lock on one of [`SHARDS`] shards to find its
/// resource (a write lock only the first time the resource is refused),
/// then that resource's own lock to count; [`Denied::top`] copies each
/// resource's summaries out under its lock and merges outside any lock.
pub struct Denied {
    shards: Box<[RwLock<Shard>]>,
    hasher: DefaultHashBuilder,
    /// Resources in the table.
    resources: AtomicUsize,
    /// When idle resources were last dropped (ns), so the table is swept
    /// (by [`Denied::top`]) at most once a window.
    swept: AtomicU64,
}

impl Default for Denied {
    fn default() -> Denied {
        Denied {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            hasher: DefaultHashBuilder::default(),
            resources: AtomicUsize::new(0),
            swept: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Denied").finish_non_exhaustive()
    }
}

/// `domain` cut to at most [`MAX_DOMAIN_BYTES`] at a character boundary.
fn cut(domain: &str) -> &str {
    if domain.len() <= MAX_DOMAIN_BYTES {
        return domain;
    }
    let mut end = MAX_DOMAIN_BYTES;
    while !domain.is_char_boundary(end) {
        end -= 1;
    }
    &domain[..end]
}

/// The domains refused most lately, per namespace, then resource.
pub type Top = BTreeMap<String, BTreeMap<String, Vec<Counted>>>;

impl Denied {
    fn shard(&self, namespace: &str, resource: &str) -> &RwLock<Shard> {
        let h = self.hasher.hash_one((namespace, resource));
        &self.shards[(h as usize) % self.shards.len()]
    }

    /// The entry of `namespace/resource`, made if there is room.
    fn entry(&self, now: u64, namespace: &str, resource: &str) -> Option<Arc<Mutex<Windows>>> {
        let shard = self.shard(namespace, resource);
        {
            let read = shard.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(e) = read.get(namespace).and_then(|r| r.get(resource)) {
                return Some(Arc::clone(e));
            }
        }
        if self.resources.load(Ordering::Relaxed) >= MAX_RESOURCES {
            // Full: the idle ones are dropped by the next `top`, not here
            // (a sweep takes every shard's lock; this is a refusal).
            return None;
        }
        let mut write = shard.write().unwrap_or_else(PoisonError::into_inner);
        let resources = write.entry(namespace.into()).or_default();
        if let Some(e) = resources.get(resource) {
            return Some(Arc::clone(e));
        }
        // Another shard may have taken the last place meanwhile.
        if self.resources.fetch_add(1, Ordering::Relaxed) >= MAX_RESOURCES {
            self.resources.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        // Windows begin at multiples of WINDOW on the app's clock, the
        // same for every resource.
        let e = Arc::new(Mutex::new(Windows {
            start: now - now % WINDOW,
            ..Windows::default()
        }));
        resources.insert(resource.into(), Arc::clone(&e));
        Some(e)
    }

    /// Drops the resources with nothing refused in this window or the
    /// last, at most once a window.
    fn sweep(&self, now: u64) {
        let last = self.swept.load(Ordering::Relaxed);
        if now.saturating_sub(last) < WINDOW
            || self
                .swept
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        for shard in self.shards.iter() {
            let mut w = shard.write().unwrap_or_else(PoisonError::into_inner);
            w.retain(|_, resources| {
                resources.retain(|_, e| {
                    let mut e = e.lock().unwrap_or_else(PoisonError::into_inner);
                    e.advance(now);
                    let keep = !e.is_idle();
                    if !keep {
                        e.removed = true;
                        self.resources.fetch_sub(1, Ordering::Relaxed);
                    }
                    keep
                });
                !resources.is_empty()
            });
        }
    }

    /// Counts a refusal of `domain` by `namespace/resource` at `now` (ns);
    /// whether it was counted. It is not (and is counted in
    /// `tollgate_denied_uncounted_total`) when the table is full, or when
    /// the resource's summary is busy: a refusal never waits for a lock
    /// (a hammered resource's refusals would queue on it).
    pub fn record(&self, now: u64, namespace: &str, resource: &str, domain: &str) -> bool {
        self.record_from(|| self.entry(now, namespace, resource), now, domain)
    }

    /// [`Denied::record`] with the entry from `lookup`. A sweep (from
    /// `top`) may drop the entry between the lookup and its lock: then
    /// the entry is looked up again, once (a second sweep comes a window
    /// later at the earliest), and the refusal is counted as uncounted
    /// if that one is gone too — never counted into a dropped entry.
    fn record_from(
        &self,
        mut lookup: impl FnMut() -> Option<Arc<Mutex<Windows>>>,
        now: u64,
        domain: &str,
    ) -> bool {
        let uncounted = || {
            metrics::counter!(crate::metrics::DENIED_UNCOUNTED).increment(1);
            false
        };
        for _ in 0..2 {
            let Some(entry) = lookup() else {
                return uncounted();
            };
            let mut w = match entry.try_lock() {
                Ok(w) => w,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return uncounted(),
            };
            if w.removed {
                continue;
            }
            w.advance(now);
            let domain = cut(domain);
            w.current.add(self.hasher.hash_one(domain), domain, 1);
            return true;
        }
        uncounted()
    }

    /// Every resource in the table, with its names (reference counts, no
    /// copies), each shard's read lock held only to list them.
    fn entries(&self) -> Vec<Entry> {
        let mut all = Vec::with_capacity(self.resources.load(Ordering::Relaxed));
        for shard in self.shards.iter() {
            let r = shard.read().unwrap_or_else(PoisonError::into_inner);
            for (ns, resources) in r.iter() {
                for (res, e) in resources {
                    all.push((Arc::clone(ns), Arc::clone(res), Arc::clone(e)));
                }
            }
        }
        all
    }

    /// The domains refused most lately (this window and the last), per
    /// namespace and resource, most first, at most `n` per resource.
    /// Each resource's two summaries are merged under its own lock (a
    /// short one, on the stack) and only the `n` shown are copied out.
    pub fn top(&self, now: u64, n: usize) -> Top {
        // Idle resources give their places up here, off the request path.
        self.sweep(now);
        let mut out = Top::new();
        for (ns, res, e) in self.entries() {
            let mut w = e.lock().unwrap_or_else(PoisonError::into_inner);
            w.advance(now);
            if w.is_idle() {
                continue;
            }
            let mut both = Both::of(&w);
            let list = both.as_mut_slice();
            list.sort_by(|a, b| b.rejected.cmp(&a.rejected).then(a.domain.cmp(b.domain)));
            let shown: Vec<Counted> = list
                .iter()
                .take(n)
                .map(|c| Counted {
                    domain: c.domain.to_owned(),
                    rejected: c.rejected,
                    error: c.error,
                })
                .collect();
            drop(w);
            out.entry(ns.to_string())
                .or_default()
                .insert(res.to_string(), shown);
        }
        out
    }

    /// Writes the first `ranks` (at most [`MAX_METRIC_RANKS`]) of each
    /// resource to `out` in the Prometheus text format: see
    /// [`write_metrics`]. A scrape costs a lock and a merge of at most
    /// 2 × [`TOP`] counters on the stack per resource counted, and copies
    /// out only the ranks it writes: never every summary (at
    /// [`MAX_RESOURCES`] resources with full summaries, that copy was
    /// some 50 MB and 320,000 allocations per scrape).
    pub fn write_metrics(&self, now: u64, ranks: usize, out: &mut String) {
        self.sweep(now);
        let ranks = ranks.min(MAX_METRIC_RANKS);
        let mut listed: Vec<Ranked> = Vec::new();
        if ranks > 0 {
            for (ns, res, e) in self.entries() {
                let mut w = e.lock().unwrap_or_else(PoisonError::into_inner);
                w.advance(now);
                let mut both = Both::of(&w);
                let list = both.as_mut_slice();
                // Ranked by the count known for certain, never by what a
                // counter inherited (see MIN_METRIC_REFUSALS); those
                // under the floor are left out before sorting (after a
                // flood of new domains, that is nearly all of them).
                let mut kept = 0;
                for i in 0..list.len() {
                    let mut c = list[i];
                    c.rejected = c.rejected.saturating_sub(c.error);
                    if c.rejected >= MIN_METRIC_REFUSALS {
                        list[kept] = c;
                        kept += 1;
                    }
                }
                let list = &mut list[..kept];
                list.sort_by(|a, b| b.rejected.cmp(&a.rejected).then(a.domain.cmp(b.domain)));
                let shown: Vec<(u64, String)> = list
                    .iter()
                    .take(ranks)
                    .map(|c| (c.rejected, c.domain.to_owned()))
                    .collect();
                drop(w);
                if !shown.is_empty() {
                    listed.push((ns, res, shown));
                }
            }
        }
        if listed.len() > MAX_METRIC_RESOURCES {
            listed.sort_by(|a, b| {
                let first = |l: &[(u64, String)]| l.first().map_or(0, |c| c.0);
                first(&b.2)
                    .cmp(&first(&a.2))
                    .then((&a.0, &a.1).cmp(&(&b.0, &b.1)))
            });
            listed.truncate(MAX_METRIC_RESOURCES);
        }
        listed.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        write_metrics(&listed, out);
    }
}

/// A resource in the table: namespace, resource, its windows.
type Entry = (Arc<str>, Arc<str>, Arc<Mutex<Windows>>);

/// One domain's counts over a resource's two windows, borrowed from them.
#[derive(Clone, Copy, Default)]
struct Merged<'w> {
    hash: u64,
    domain: &'w str,
    rejected: u64,
    error: u64,
}

/// A resource's two summaries merged by domain, on the stack: at most
/// [`TOP`] counters each, so at most 2 × [`TOP`] domains.
struct Both<'w> {
    list: [Merged<'w>; 2 * TOP],
    len: usize,
}

impl<'w> Both<'w> {
    fn of(w: &'w Windows) -> Both<'w> {
        let mut both = Both {
            list: [Merged::default(); 2 * TOP],
            len: 0,
        };
        let previous = w.previous.hashes.iter().zip(&w.previous.counters);
        for (&hash, c) in previous.chain(w.current.hashes.iter().zip(&w.current.counters)) {
            let (seen, free) = both.list.split_at_mut(both.len);
            if let Some(x) = seen
                .iter_mut()
                .find(|x| x.hash == hash && x.domain == c.domain)
            {
                x.rejected = x.rejected.saturating_add(c.rejected);
                x.error = x.error.saturating_add(c.error);
            } else if let Some(slot) = free.first_mut() {
                *slot = Merged {
                    hash,
                    domain: &c.domain,
                    rejected: c.rejected,
                    error: c.error,
                };
                both.len += 1;
            }
        }
        both
    }

    fn as_mut_slice(&mut self) -> &mut [Merged<'w>] {
        &mut self.list[..self.len]
    }
}

/// Writes `listed` (from [`Denied::write_metrics`]) to `out` in the
/// Prometheus text format, as two gauge families:
///
/// - `tollgate_denied_top_rejected{namespace, resource, rank}`: the
///   refusals counted for certain for the domain at that rank (this
///   window and the last: `rejected - error`, a lower bound of the true
///   count). Its series are one per rank, so they stay the same series
///   while the domains behind them change;
/// - `tollgate_denied_top_domain{namespace, resource, rank, domain}`: 1,
///   naming the domain at that rank (join on `rank`). The only series
///   that carry a domain: as many as the first family's.
///
/// Only domains refused at least [`MIN_METRIC_REFUSALS`] times for
/// certain are shown, ranked by that certain count: a domain that only
/// inherited a replaced counter's count is never named (see there).
///
/// Nothing is registered with the metrics recorder: the series are made
/// from the summaries at each scrape, so a domain that leaves a resource's
/// top is gone from the next scrape rather than kept for the life of the
/// process. A scrape shows at most [`MAX_METRIC_RESOURCES`] resources;
/// label values are escaped (a domain is a client's text).
fn write_metrics(listed: &[Ranked], out: &mut String) {
    use crate::metrics::{DENIED_TOP_DOMAIN, DENIED_TOP_REJECTED};
    out.push_str(&format!(
        "# HELP {DENIED_TOP_REJECTED} Refusals counted for certain of the domain at each rank of a resource's most refused, this minute and the last (at least {MIN_METRIC_REFUSALS}).\n# TYPE {DENIED_TOP_REJECTED} gauge\n"
    ));
    for (ns, res, list) in listed {
        for (i, (n, _)) in list.iter().enumerate() {
            series(out, DENIED_TOP_REJECTED, ns, res, i + 1, None);
            out.push_str(itoa::Buffer::new().format(*n));
            out.push('\n');
        }
    }
    out.push_str(&format!(
        "# HELP {DENIED_TOP_DOMAIN} 1, naming the domain at each rank of a resource's most refused.\n# TYPE {DENIED_TOP_DOMAIN} gauge\n"
    ));
    for (ns, res, list) in listed {
        for (i, (_, domain)) in list.iter().enumerate() {
            series(out, DENIED_TOP_DOMAIN, ns, res, i + 1, Some(domain));
            out.push_str("1\n");
        }
    }
}

/// A resource's ranks as `/metrics` shows them: (namespace, resource,
/// [(certain count, domain)] most first).
type Ranked = (Arc<str>, Arc<str>, Vec<(u64, String)>);

/// `name{namespace="..",resource="..",rank="..",domain=".."} ` (the
/// domain only when given).
fn series(out: &mut String, name: &str, ns: &str, res: &str, rank: usize, domain: Option<&str>) {
    out.push_str(name);
    out.push_str("{namespace=\"");
    escape_label(out, ns);
    out.push_str("\",resource=\"");
    escape_label(out, res);
    out.push_str("\",rank=\"");
    out.push_str(itoa::Buffer::new().format(rank));
    if let Some(domain) = domain {
        out.push_str("\",domain=\"");
        escape_label(out, domain);
    }
    out.push_str("\"} ");
}

/// A label value as the Prometheus text format writes it: `\`, `"` and
/// a line feed escaped. The format has no escape for other control
/// characters, and line-oriented tools split on a carriage return or
/// stop at a NUL, so those (and the Unicode line and paragraph
/// separators) are written as U+FFFD, the replacement character.
fn escape_label(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                out.push(char::REPLACEMENT_CHARACTER)
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn the_most_refused_domains_are_kept_in_fixed_memory() {
        let d = Denied::default();
        // A heavy hitter among a flood of one-off domains.
        for i in 0..1000u64 {
            d.record(S, "shop", "api", "bigcorp");
            d.record(S, "shop", "api", &format!("stranger-{i}"));
            if i % 10 == 0 {
                d.record(S, "shop", "api", "acme");
            }
        }
        let top = d.top(S, 3);
        let api = &top["shop"]["api"];
        assert_eq!(api[0].domain, "bigcorp");
        assert!(api[0].rejected >= 1000 && api[0].rejected - api[0].error <= 1000);
        assert!(api.len() <= 3);
        assert!(d.top(S, 100)["shop"]["api"].len() <= TOP, "bounded");
    }

    /// Regression: every refusal took one lock for all resources. A
    /// refusal of one resource now goes through while another
    /// resource's summary is held (as a long `top` merge or a busy
    /// resource would hold it).
    #[test]
    fn a_refusal_does_not_wait_for_another_resource() {
        let d = Arc::new(Denied::default());
        d.record(S, "shop", "api", "acme");
        d.record(S, "shop", "db", "acme");
        let held = d.entry(S, "shop", "api").unwrap();
        let _guard = held.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let other = Arc::clone(&d);
        std::thread::spawn(move || {
            other.record(S, "shop", "db", "globex");
            let _ = tx.send(());
        });
        // A generous bound on an outcome, not a speed: it hangs forever
        // under a shared lock.
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("a refusal of shop/db waited for shop/api's lock");
    }

    /// Review of issue 22: a refusal looked its resource's entry up, let
    /// the table's lock go, then locked the entry; a sweep in between
    /// dropped the entry, and the refusal was counted into it (lost, yet
    /// reported as counted). It is now counted into the table's entry.
    #[test]
    fn a_refusal_racing_a_sweep_is_not_lost() {
        let d = Denied::default();
        let later = S + WINDOW;
        // The refusal's lookup: the entry as it is before the sweep.
        let stale = d.entry(S, "shop", "api").unwrap();
        // The sweep (from a `top`) drops it: nothing was refused yet.
        d.sweep(later);
        assert!(d.top(later, 3).is_empty());
        assert!(stale.lock().unwrap().removed);
        // The refusal goes on with the entry it looked up.
        let mut first = Some(stale);
        let counted = d.record_from(
            || first.take().or_else(|| d.entry(later, "shop", "api")),
            later,
            "acme",
        );
        assert!(counted);
        let top = d.top(later, 3);
        assert_eq!(top["shop"]["api"][0].domain, "acme", "{top:?}");
        // An entry dropped twice over is not counted, and says so.
        let gone = d.entry(later, "shop", "gone").unwrap();
        gone.lock().unwrap().removed = true;
        assert!(!d.record_from(|| Some(Arc::clone(&gone)), later, "acme"));
    }

    /// Regression: keys were `NS/RESOURCE` strings, so namespace `a` with
    /// resource `b/db` and namespace `a/b` with resource `db` shared one
    /// summary.
    #[test]
    fn namespaces_and_resources_with_slashes_do_not_collide() {
        let d = Denied::default();
        d.record(S, "a", "b/db", "x");
        d.record(S, "a/b", "db", "y");
        let top = d.top(S, 5);
        assert_eq!(top["a"]["b/db"][0].domain, "x");
        assert_eq!(top["a"]["b/db"].len(), 1);
        assert_eq!(top["a/b"]["db"][0].domain, "y");
    }

    /// The lines of `family` in `text`.
    fn family<'t>(text: &'t str, family: &str) -> Vec<&'t str> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .collect()
    }

    /// `/metrics` as a scrape writes it: every counter, `ranks` shown.
    fn scrape(d: &Denied, now: u64, ranks: usize) -> String {
        let mut text = String::new();
        d.write_metrics(now, ranks, &mut text);
        text
    }

    #[test]
    fn metrics_name_the_top_ranks_only_after_many_distinct_domains() {
        let d = Denied::default();
        // 10,000 distinct denied domains and two heavy hitters, over two
        // resources.
        for i in 0..10_000u64 {
            d.record(S, "shop", "api", &format!("stranger-{i}"));
            d.record(S, "shop", "db", &format!("other-{i}"));
            if i % 4 == 0 {
                d.record(S, "shop", "api", "bigcorp");
            }
            if i % 8 == 0 {
                d.record(S, "shop", "api", "acme");
            }
        }
        let text = scrape(&d, S, 3);
        let rejected = family(&text, "tollgate_denied_top_rejected");
        let domains = family(&text, "tollgate_denied_top_domain");
        // The strangers were each refused once: none is named, on either
        // resource, though the summaries hold 14 and 16 of them.
        assert_eq!(rejected.len(), 2, "the two heavy hitters only:\n{text}");
        assert_eq!(domains.len(), 2, "{text}");
        assert!(
            !text.contains("stranger") && !text.contains("other"),
            "{text}"
        );
        assert_eq!(
            rejected[0],
            "tollgate_denied_top_rejected{namespace=\"shop\",resource=\"api\",rank=\"1\"} 2500"
        );
        assert_eq!(
            domains[0],
            "tollgate_denied_top_domain{namespace=\"shop\",resource=\"api\",rank=\"1\",domain=\"bigcorp\"} 1"
        );
        assert!(
            domains[1].contains("rank=\"2\",domain=\"acme\"} 1"),
            "{text}"
        );
        // Families are whole (Prometheus wants a family's lines together).
        let first = |needle: &str| text.find(needle).unwrap();
        assert!(
            first("# TYPE tollgate_denied_top_rejected gauge")
                < first("tollgate_denied_top_rejected{")
        );
        assert!(
            text.rfind("tollgate_denied_top_rejected{").unwrap()
                < first("# TYPE tollgate_denied_top_domain gauge")
        );
        // Never more ranks than the bound, however many are asked for.
        let d = Denied::default();
        for i in 0..12 {
            for _ in 0..MIN_METRIC_REFUSALS {
                d.record(S, "shop", "api", &format!("heavy-{i}"));
            }
        }
        assert_eq!(
            family(&scrape(&d, S, 100), "tollgate_denied_top_domain").len(),
            MAX_METRIC_RANKS
        );
    }

    /// Regression (review of issue 18, finding 1): a client sending
    /// refused requests under ever new domains took every rank with a
    /// domain refused once (shown with the count it inherited), pushed
    /// the real heavy hitters out of `/metrics`, and put new `domain`
    /// series on every scrape.
    #[test]
    fn a_flood_of_new_domains_never_names_a_stranger() {
        let d = Denied::default();
        for _ in 0..50 {
            d.record(S, "n", "r", "bob");
        }
        for _ in 0..30 {
            d.record(S, "n", "r", "carol");
        }
        let mut named = std::collections::BTreeSet::new();
        for round in 0..20 {
            for i in 0..200 {
                d.record(S, "n", "r", &format!("stranger-{round}-{i}"));
            }
            let text = scrape(&d, S, 2);
            named.extend(
                family(&text, "tollgate_denied_top_domain")
                    .into_iter()
                    .map(str::to_owned),
            );
            if round == 0 {
                // Still counted for certain: bob and carol, by their true
                // counts.
                assert_eq!(
                    family(&text, "tollgate_denied_top_rejected"),
                    [
                        "tollgate_denied_top_rejected{namespace=\"n\",resource=\"r\",rank=\"1\"} 50",
                        "tollgate_denied_top_rejected{namespace=\"n\",resource=\"r\",rank=\"2\"} 30",
                    ],
                    "{text}"
                );
            }
        }
        // bob and carol, then nothing once the flood pushed them out (their
        // counts are no longer known): never a stranger.
        assert_eq!(
            named.into_iter().collect::<Vec<_>>(),
            [
                "tollgate_denied_top_domain{namespace=\"n\",resource=\"r\",rank=\"1\",domain=\"bob\"} 1",
                "tollgate_denied_top_domain{namespace=\"n\",resource=\"r\",rank=\"2\",domain=\"carol\"} 1",
            ]
        );
        // A domain is named once refused the floor's number of times for
        // certain, not before, whatever count it inherited.
        let d = Denied::default();
        for i in 0..100 {
            d.record(S, "n", "r", &format!("x-{i}"));
        }
        for _ in 1..MIN_METRIC_REFUSALS {
            d.record(S, "n", "r", "late");
        }
        assert!(!scrape(&d, S, 10).contains("late"));
        d.record(S, "n", "r", "late");
        let text = scrape(&d, S, 10);
        assert_eq!(
            family(&text, "tollgate_denied_top_rejected"),
            [format!(
                "tollgate_denied_top_rejected{{namespace=\"n\",resource=\"r\",rank=\"1\"}} {MIN_METRIC_REFUSALS}"
            )],
            "{text}"
        );
    }

    #[test]
    fn metrics_escape_domains_and_show_a_bounded_number_of_resources() {
        let d = Denied::default();
        for _ in 0..MIN_METRIC_REFUSALS {
            d.record(S, "n", "r", "a\"b\\c\nd");
            d.record(S, "n", "r2", "e\rf\0g\u{2028}h\u{7f}i");
        }
        let text = scrape(&d, S, 1);
        assert!(
            text.contains(r#"rank="1",domain="a\"b\\c\nd"} 1"#),
            "{text}"
        );
        // Regression (review of issue 18, nit 9): control characters went
        // out raw; the format has no escape for them.
        assert!(
            text.contains("rank=\"1\",domain=\"e\u{fffd}f\u{fffd}g\u{fffd}h\u{fffd}i\"} 1"),
            "{text:?}"
        );
        // Past the bound, the resources whose first rank is refused most.
        let d = Denied::default();
        for i in 0..(MAX_METRIC_RESOURCES + 5) {
            for _ in 0..MIN_METRIC_REFUSALS {
                d.record(S, "n", &format!("r{i}"), "x");
            }
        }
        for _ in 0..3 {
            d.record(S, "n", &format!("r{}", MAX_METRIC_RESOURCES + 4), "x");
        }
        let text = scrape(&d, S, 1);
        let rejected = family(&text, "tollgate_denied_top_rejected");
        assert_eq!(rejected.len(), MAX_METRIC_RESOURCES);
        let busiest = format!(
            "resource=\"r{}\",rank=\"1\"}} {}",
            MAX_METRIC_RESOURCES + 4,
            MIN_METRIC_REFUSALS + 3
        );
        assert!(rejected.iter().any(|l| l.contains(&busiest)), "{busiest}");
        // Nothing refused: the families' heads and no series.
        let mut empty = String::new();
        Denied::default().write_metrics(S, 10, &mut empty);
        assert_eq!(empty.lines().filter(|l| !l.starts_with('#')).count(), 0);
    }

    /// Domains are compared by hash first (second review of issue 18):
    /// two domains with one hash stay two counters, in a summary and in
    /// the merge of a resource's two windows.
    #[test]
    fn domains_sharing_a_hash_stay_apart() {
        let mut w = Windows::default();
        w.previous.add(7, "a", 2);
        w.previous.add(7, "b", 3);
        w.current.add(7, "b", 4);
        w.current.add(9, "a", 1);
        assert_eq!(w.previous.counters.len(), 2);
        let mut both = Both::of(&w);
        let mut merged: Vec<(&str, u64)> = both
            .as_mut_slice()
            .iter()
            .map(|m| (m.domain, m.rejected))
            .collect();
        merged.sort();
        // `a` under hash 9 is another counter than `a` under 7: one
        // domain is always hashed alike, so this only shows the string
        // decides, never the hash alone.
        assert_eq!(merged, [("a", 1), ("a", 2), ("b", 7)]);
    }

    #[test]
    fn resources_past_the_bound_are_not_counted_until_idle_ones_go() {
        let d = Denied::default();
        for i in 0..=MAX_RESOURCES {
            d.record(S, "n", &format!("r{i}"), "acme");
        }
        let top = d.top(S, 1);
        assert_eq!(top["n"].len(), MAX_RESOURCES);
        assert!(!top["n"].contains_key(&format!("r{MAX_RESOURCES}")));
        // One already counted still is.
        d.record(S, "n", "r0", "acme");
        assert_eq!(d.top(S, 1)["n"]["r0"][0].rejected, 2);
        // Two windows on, the idle resources give their places up at the
        // next read (a refusal never sweeps).
        let later = S + 3 * WINDOW;
        assert!(!d.record(later, "n", "new", "acme"), "full until a read");
        d.top(later, 1);
        assert!(d.record(later, "n", "new", "acme"));
        assert_eq!(d.top(later, 1)["n"]["new"][0].rejected, 1);
        assert_eq!(d.resources.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn counts_cover_this_window_and_the_last_then_go() {
        let d = Denied::default();
        d.record(10 * S, "n", "r", "old");
        d.record(70 * S, "n", "r", "new");
        let names = |t: &Top| -> Vec<String> {
            t.get("n")
                .and_then(|r| r.get("r"))
                .map(|l| l.iter().map(|c| c.domain.clone()).collect())
                .unwrap_or_default()
        };
        let mut both = names(&d.top(70 * S, 5));
        both.sort();
        assert_eq!(both, ["new", "old"]);
        assert_eq!(names(&d.top(125 * S, 5)), ["new"]);
        assert!(names(&d.top(300 * S, 5)).is_empty());
        let long = "é".repeat(100);
        d.record(300 * S, "n", "r", &long);
        assert_eq!(d.top(300 * S, 1)["n"]["r"][0].domain.len(), 128);
    }

    #[test]
    fn refusals_from_many_threads_are_counted_or_said_not_to_be() {
        let d = Arc::new(Denied::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let d = Arc::clone(&d);
                std::thread::spawn(move || {
                    let mut counted = 0u64;
                    for i in 0..1000 {
                        counted +=
                            u64::from(d.record(S, "n", &format!("r{}", i % 8), &format!("d{t}")));
                    }
                    counted
                })
            })
            .collect();
        let counted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let top = d.top(S, 10);
        let total: u64 = top["n"].values().flatten().map(|c| c.rejected).sum();
        // Every refusal is counted, or said not to be (a busy summary).
        assert_eq!(total, counted);
        assert!(counted > 0);
    }

    /// Second review of issue 22 (MEDIUM-B): every refusal of a hammered
    /// resource queued on its lock. A refusal that finds the summary
    /// busy is left out (and said so) instead of waiting.
    #[test]
    fn a_refusal_finding_the_summary_busy_is_left_out_not_waiting() {
        let d = Denied::default();
        assert!(d.record(S, "shop", "api", "acme"));
        let held = d.entry(S, "shop", "api").unwrap();
        {
            let _guard = held.lock().unwrap();
            assert!(!d.record(S, "shop", "api", "globex"), "it would wait");
        }
        assert!(d.record(S, "shop", "api", "acme"));
        let top = d.top(S, 10);
        assert_eq!(top["shop"]["api"].len(), 1, "{top:?}");
        assert_eq!(top["shop"]["api"][0].rejected, 2);
    }
}
