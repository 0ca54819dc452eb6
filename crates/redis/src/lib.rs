//! tollgate's Redis store: Redis as authoritative shared memory for a
//! fleet of limiting servers (Charon §4.2).
//!
//! # What it is for
//!
//! Any number of `tollgate serve --store redis://...` processes behind a
//! load balancer enforce one set of limits exactly: no server keeps limit
//! state of its own; every decision is made atomically inside Redis.
//!
//! # How a decision runs
//!
//! Every algorithm of the core is ported to Lua (`lua/algorithms/*.lua`,
//! one file per algorithm, each a line-by-line port of its Rust module).
//! A whole plan — every limit one request must pass — is decided in one
//! `EVALSHA` of the `decide` script (with other plans sent at the same
//! time): it reads every key of the plan, decides all or
//! nothing with the core's partial-grant rule, writes the states back and
//! answers, in one round trip and with no read-then-write from the server
//! (seed 002, "race conditions"). Redis runs one script at a time, which is
//! the atomicity a shard lock gives the memory store.
//!
//! - **Clock**: the script reads Redis's `TIME`, so servers with skewed
//!   clocks agree ([`ScriptClock::Redis`]). Tests pass their own ([`ScriptClock::Caller`]).
//! - **Exactness**: Lua numbers are doubles; the scripts keep times relative
//!   to their own now and refuse limits whose spans or counts reach 2^52
//!   ([`params::check_limit`]; calendar windows, a year's included, keep
//!   their times as seconds and nanoseconds instead), so they compute what
//!   the core computes. A
//!   conformance suite (`tests/conformance*.rs`) runs the same timed
//!   scenarios through both stores and requires identical decisions.
//! - **Memory**: a state that becomes idle is deleted; any other is written
//!   with a TTL past the time it must have become idle, so Redis memory
//!   stays bounded without a sweeper.
//! - **Keys**: `<prefix>{<affinity>}:l:<limit id>:<domain>`. The hash tag is
//!   the plan's affinity (one per namespace), so every key of a plan lands
//!   in one Redis Cluster slot.
//! - **Connections**: see [`conn`]: a few multiplexed connections carry
//!   every concurrent decision, batched into shared calls (`batch.rs`:
//!   whatever queued up, pipelined on each connection). A decision waits
//!   while Redis answers; when Redis leaves a connection unanswered for the
//!   timeout (50 ms by default) what it carries fails, and past a bound on
//!   decisions waiting one more is shed at once. A broken connection
//!   reconnects by itself with backoff while decisions fail fast with
//!   [`tollgate_store::StoreError::Unavailable`].
//! - **Over-limit cache** (`cache.rs`): a key Redis rejected is answered by
//!   the server, exactly as Redis would answer, until it could admit again
//!   (GCRA, leaky bucket, token bucket, fixed window; the others always go
//!   to Redis). It never grants, so it never over-admits.
//! - **Copy operations** are not given up on a timeout: each carries an id
//!   the script remembers, and is resent until Redis answers, so it is
//!   applied exactly once; a server counts its holds again where Redis lost
//!   them or went back to an older state (see `copies.rs` and
//!   `docs/redis.md`).

#![deny(missing_docs)]

mod batch;
mod cache;
pub mod conn;
mod copies;
mod copylog;
pub mod params;
mod reply;
mod script;
mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use cache::CacheStats;
pub use conn::{ClientCert, ConnectError, ConnectOptions, RedisTarget, TlsPart};
pub use copylog::Resignation;
pub use params::{check_limit, Inexact, MAX_EXACT};
pub use store::{
    RedisOptions, RedisStore, ScriptClock, DEFAULT_MAX_WAITING, DEFAULT_REJECTION_CACHE,
    DEFAULT_REJECTION_CACHE_MAX_AGE,
};
