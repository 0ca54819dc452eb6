//! Several resources at once, pseudo-atomically (Charon §3.3, Figure 7).
//!
//! The copy-limited resources are reserved one after another, each for as
//! many copies as the previous one granted, with what is left of one
//! `max_wait`; when a later one grants fewer, the surplus of the earlier
//! ones is released, so all hold the same count. A rate-limited resource,
//! at most one, comes last: hits cannot be given back, so it is asked only
//! once every hold is in place, and the copies beyond the hits it grants
//! are released. If any step fails, every hold taken is released before
//! the error returns: nothing stays held.

use std::time::Duration;

use crate::client::{Client, Grant};
use crate::error::Error;
use crate::hold::Hold;

/// A multi-resource acquisition being built: see [`Client::acquire`].
#[derive(Debug)]
#[must_use = "an acquisition does nothing until sent"]
pub struct AcquireBuilder {
    client: Client,
    domain: String,
    copies: Vec<(String, String)>,
    rate: Option<(String, String)>,
    count: u64,
    min: Option<u64>,
    max_wait: Duration,
    twice: Option<String>,
}

/// What an acquisition got: the same number of copies of every
/// copy-limited resource and, if one was asked, as many hits of the
/// rate-limited one.
#[derive(Debug)]
pub struct Acquired {
    /// The count held of each (and granted of the rate-limited resource).
    pub count: u64,
    /// One hold per copy-limited resource, in the order they were added.
    pub holds: Vec<Hold>,
    /// The rate-limited resource's grant, if one was asked.
    pub rate: Option<Grant>,
    /// Time spent in all.
    pub waited: Duration,
}

impl Client {
    /// Acquires several resources for `domain` pseudo-atomically (Charon
    /// §3.3): add copy-limited resources with
    /// [`AcquireBuilder::copies_of`], at most one rate-limited one with
    /// [`AcquireBuilder::rate_of`], then [`AcquireBuilder::send`].
    pub fn acquire(&self, domain: &str) -> AcquireBuilder {
        AcquireBuilder {
            client: self.clone(),
            domain: domain.to_owned(),
            copies: Vec::new(),
            rate: None,
            count: 1,
            min: None,
            max_wait: Duration::ZERO,
            twice: None,
        }
    }
}

impl AcquireBuilder {
    /// Adds a copy-limited resource.
    pub fn copies_of(mut self, namespace: &str, resource: &str) -> Self {
        self.copies
            .push((namespace.to_owned(), resource.to_owned()));
        self
    }

    /// Sets the rate-limited resource, asked last (at most one).
    pub fn rate_of(mut self, namespace: &str, resource: &str) -> Self {
        if let Some((ns, r)) = &self.rate {
            self.twice = Some(format!(
                "{ns}/{r} and {namespace}/{resource}: at most one rate-limited resource \
                 can be acquired with others (its hits cannot be given back)"
            ));
        }
        self.rate = Some((namespace.to_owned(), resource.to_owned()));
        self
    }

    /// The most of each to acquire (default 1).
    pub fn count(mut self, count: u64) -> Self {
        self.count = count;
        self
    }

    /// The fewest worth having (default: `count`).
    pub fn min(mut self, min: u64) -> Self {
        self.min = Some(min);
        self
    }

    /// Longest time for the whole acquisition (default zero: one attempt
    /// per resource).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Acquires; on any failure, releases every hold taken and returns the
    /// error.
    pub async fn send(self) -> Result<Acquired, Error> {
        if let Some(why) = self.twice {
            return Err(Error::Invalid(why));
        }
        let min = self.min.unwrap_or(self.count);
        if self.count == 0 || min == 0 || min > self.count {
            return Err(Error::Invalid(format!(
                "an acquisition needs 1 ≤ min ≤ count (got count {}, min {min})",
                self.count
            )));
        }
        if self.copies.is_empty() && self.rate.is_none() {
            return Err(Error::Invalid("nothing to acquire".to_owned()));
        }
        let clock = std::sync::Arc::clone(&self.client.config().timer);
        let start = clock.now();
        let left = |elapsed: Duration| self.max_wait.saturating_sub(elapsed);
        let mut holds: Vec<Hold> = Vec::with_capacity(self.copies.len());
        let mut n = self.count;
        for (namespace, resource) in &self.copies {
            let hold = self
                .client
                .hold(namespace, resource, &self.domain)
                .copies(n)
                .min_copies(min)
                .max_wait(left(clock.now().saturating_sub(start)))
                .send()
                .await;
            let hold = match hold {
                Ok(h) => h,
                Err(e) => return Err(give_back(holds, e).await),
            };
            let got = hold.copies();
            holds.push(hold);
            if got < n {
                if let Err(e) = trim(&mut holds, got).await {
                    return Err(give_back(holds, e).await);
                }
                n = got;
            }
        }
        let mut rate = None;
        if let Some((namespace, resource)) = &self.rate {
            let grant = self
                .client
                .request(namespace, resource, &self.domain)
                .hits(n)
                .min_hits(min)
                .max_wait(left(clock.now().saturating_sub(start)))
                .send()
                .await;
            let grant = match grant {
                Ok(g) => g,
                Err(e) => return Err(give_back(holds, e).await),
            };
            if grant.granted < n {
                if let Err(e) = trim(&mut holds, grant.granted).await {
                    return Err(give_back(holds, e).await);
                }
                n = grant.granted;
            }
            rate = Some(grant);
        }
        Ok(Acquired {
            count: n,
            holds,
            rate,
            waited: clock.now().saturating_sub(start),
        })
    }
}

/// Releases what each hold holds beyond `to`.
async fn trim(holds: &mut [Hold], to: u64) -> Result<(), Error> {
    for hold in holds.iter_mut() {
        let extra = hold.copies().saturating_sub(to);
        if extra > 0 {
            hold.release(extra).await?;
        }
    }
    Ok(())
}

/// Releases every hold (waiting for the answers), then returns `error`.
async fn give_back(holds: Vec<Hold>, error: Error) -> Error {
    for hold in holds {
        if let Err(e) = hold.release_all().await {
            tracing::debug!(error = ?e.to_string(), "releasing after a failed acquisition");
        }
    }
    error
}
