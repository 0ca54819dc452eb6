//! The client for programs without an async runtime: the same calls,
//! waiting on a runtime of their own.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tollgate_proto::v1;

use crate::acquire::{AcquireBuilder, Acquired};
use crate::client::{Grant, HoldBuilder, RequestBuilder};
use crate::config::ClientConfig;
use crate::error::Error;

/// A blocking client. Its runtime has one worker thread, which keeps the
/// sessions alive (and guards' releases flowing) between calls.
///
/// Do not use it inside an async runtime: use [`crate::Client`] there.
#[derive(Clone, Debug)]
pub struct Client {
    runtime: Arc<tokio::runtime::Runtime>,
    inner: crate::Client,
}

/// A blocking [`crate::Hold`].
#[derive(Debug)]
#[must_use = "dropping a hold releases it at once"]
pub struct Hold {
    runtime: Arc<tokio::runtime::Runtime>,
    inner: crate::Hold,
}

impl Client {
    /// A client of `config.endpoints` (see [`crate::Client::new`]).
    pub fn new(config: ClientConfig) -> Result<Client, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tollgate-client")
            .enable_all()
            .build()
            .map_err(|e| Error::Invalid(format!("cannot start the client's runtime: {e}")))?;
        let runtime = Arc::new(runtime);
        // The client spawns its session tasks, so it is made inside the
        // runtime.
        let inner = {
            let _guard = runtime.enter();
            crate::Client::new(config)?
        };
        Ok(Client { runtime, inner })
    }

    fn wait<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// A rate request: `configure` sets hits, min_hits and max_wait on the
    /// builder.
    pub fn request(
        &self,
        namespace: &str,
        resource: &str,
        domain: &str,
        configure: impl FnOnce(RequestBuilder) -> RequestBuilder,
    ) -> Result<Grant, Error> {
        let builder = configure(self.inner.request(namespace, resource, domain));
        self.wait(builder.send())
    }

    /// A hold: `configure` sets copies, min_copies and max_wait on the
    /// builder.
    pub fn hold(
        &self,
        namespace: &str,
        resource: &str,
        domain: &str,
        configure: impl FnOnce(HoldBuilder) -> HoldBuilder,
    ) -> Result<Hold, Error> {
        let builder = configure(self.inner.hold(namespace, resource, domain));
        let inner = self.wait(builder.send())?;
        Ok(Hold {
            runtime: Arc::clone(&self.runtime),
            inner,
        })
    }

    /// Takes transferred copies (see [`crate::Client::seize`]).
    pub fn seize(&self, transfer_id: &str) -> Result<Hold, Error> {
        let inner = self.wait(self.inner.seize(transfer_id))?;
        Ok(Hold {
            runtime: Arc::clone(&self.runtime),
            inner,
        })
    }

    /// Several resources at once (see [`crate::Client::acquire`]): the
    /// holds come back as async holds, released on drop all the same.
    pub fn acquire(
        &self,
        domain: &str,
        configure: impl FnOnce(AcquireBuilder) -> AcquireBuilder,
    ) -> Result<Acquired, Error> {
        let builder = configure(self.inner.acquire(domain));
        self.wait(builder.send())
    }

    /// The first answering server's status.
    pub fn status(&self) -> Result<(String, v1::StatusResponse), Error> {
        self.wait(self.inner.status())
    }
}

impl Hold {
    /// The async hold inside.
    pub fn get(&self) -> &crate::Hold {
        &self.inner
    }

    /// Copies still held.
    pub fn copies(&self) -> u64 {
        self.inner.copies()
    }

    /// Releases `copies`; returns how many are still held.
    pub fn release(&mut self, copies: u64) -> Result<u64, Error> {
        self.runtime.block_on(self.inner.release(copies))
    }

    /// Stages `copies` for another client (see [`crate::Hold::transfer`]).
    pub fn transfer(&mut self, copies: u64, ttl: Duration) -> Result<String, Error> {
        self.runtime.block_on(self.inner.transfer(copies, ttl))
    }

    /// Releases everything and waits for the answer.
    pub fn release_all(self) -> Result<(), Error> {
        let Hold { runtime, inner } = self;
        runtime.block_on(inner.release_all())
    }
}
