//! The domains a server refused most, per resource, lately: what the
//! config API's console shows as "top denied domains" (`GET /v1/denied`).
//!
//! Prometheus metrics cannot carry this: a `domain` label would make a
//! series per domain a client ever sent, kept by the exporter for good.
//! Here each resource keeps a Space-Saving summary (Metwally, Agrawal and
//! El Abbadi, 2005) of [`TOP`] counters: a domain not yet counted takes
//! the place of the smallest counter and starts from its count, so the
//! domains refused most are kept (with counts that may be over by at most
//! the smallest counter) in fixed memory, whatever domains clients send.
//! Counts cover the current window of [`WINDOW`] and the one before, so
//! "lately" means the last one to two minutes. Time is the app's clock.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

/// Counters kept per resource.
pub const TOP: usize = 16;

/// The length of a window (ns): one minute.
pub const WINDOW: u64 = 60_000_000_000;

/// The most resources counted: past it, rejections of a resource not yet
/// counted are not (only configured resources are recorded, so this is a
/// bound against configs replaced many times within a window).
pub const MAX_RESOURCES: usize = 10_000;

/// The longest domain kept, in bytes (a longer one is cut at a character
/// boundary): a client chooses domains.
pub const MAX_DOMAIN_BYTES: usize = 128;

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
}

impl Summary {
    fn add(&mut self, domain: &str, n: u64) {
        if let Some(c) = self.counters.iter_mut().find(|c| c.domain == domain) {
            c.rejected = c.rejected.saturating_add(n);
            return;
        }
        if self.counters.len() < TOP {
            self.counters.push(Counted {
                domain: domain.to_owned(),
                rejected: n,
                error: 0,
            });
            return;
        }
        if let Some(min) = self.counters.iter_mut().min_by_key(|c| c.rejected) {
            let floor = min.rejected;
            *min = Counted {
                domain: domain.to_owned(),
                rejected: floor.saturating_add(n),
                error: floor,
            };
        }
    }
}

#[derive(Default)]
struct Windows {
    /// When the current window started (ns).
    start: u64,
    current: HashMap<String, Summary>,
    previous: HashMap<String, Summary>,
}

/// The recently refused domains of every resource.
#[derive(Default)]
pub struct Denied {
    windows: Mutex<Windows>,
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
            HashMap::new()
        };
        self.start = now - elapsed % WINDOW;
    }
}

impl Denied {
    /// Counts a refusal of `domain` by `namespace/resource` at `now` (ns).
    pub fn record(&self, now: u64, namespace: &str, resource: &str, domain: &str) {
        let mut w = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        w.advance(now);
        let key = format!("{namespace}/{resource}");
        if !w.current.contains_key(&key) && w.current.len() >= MAX_RESOURCES {
            metrics::counter!(crate::metrics::DENIED_UNCOUNTED).increment(1);
            return;
        }
        w.current.entry(key).or_default().add(cut(domain), 1);
    }

    /// The domains refused most lately (this window and the last), per
    /// `namespace/resource`, most first, at most `n` per resource.
    pub fn top(&self, now: u64, n: usize) -> BTreeMap<String, Vec<Counted>> {
        let mut w = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        w.advance(now);
        let mut out: BTreeMap<String, Vec<Counted>> = BTreeMap::new();
        for summaries in [&w.previous, &w.current] {
            for (key, s) in summaries {
                let list = out.entry(key.clone()).or_default();
                for c in &s.counters {
                    match list.iter_mut().find(|x| x.domain == c.domain) {
                        Some(x) => {
                            x.rejected = x.rejected.saturating_add(c.rejected);
                            x.error = x.error.saturating_add(c.error);
                        }
                        None => list.push(c.clone()),
                    }
                }
            }
        }
        for list in out.values_mut() {
            list.sort_by(|a, b| b.rejected.cmp(&a.rejected).then(a.domain.cmp(&b.domain)));
            list.truncate(n);
        }
        out
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
        let api = &top["shop/api"];
        assert_eq!(api[0].domain, "bigcorp");
        assert!(api[0].rejected >= 1000 && api[0].rejected - api[0].error <= 1000);
        assert!(api.len() <= 3);
        let w = d.windows.lock().unwrap();
        assert!(w.current["shop/api"].counters.len() <= TOP, "bounded");
    }

    #[test]
    fn resources_past_the_bound_are_not_counted() {
        let d = Denied::default();
        for i in 0..=MAX_RESOURCES {
            d.record(S, "n", &format!("r{i}"), "acme");
        }
        let top = d.top(S, 1);
        assert_eq!(top.len(), MAX_RESOURCES);
        assert!(!top.contains_key(&format!("n/r{MAX_RESOURCES}")));
        // One already counted still is.
        d.record(S, "n", "r0", "acme");
        assert_eq!(d.top(S, 1)["n/r0"][0].rejected, 2);
    }

    #[test]
    fn counts_cover_this_window_and_the_last_then_go() {
        let d = Denied::default();
        d.record(10 * S, "n", "r", "old");
        d.record(70 * S, "n", "r", "new");
        let names = |t: &BTreeMap<String, Vec<Counted>>| -> Vec<String> {
            t.get("n/r")
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
        assert_eq!(d.top(300 * S, 1)["n/r"][0].domain.len(), 128);
    }
}
