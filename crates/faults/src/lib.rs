//! Fault injection for tollgate's chaos suite (`crates/tollgate/tests/chaos.rs`,
//! `scripts/chaos.sh`, `docs/reliability.md`). Development only: not
//! published, not linked into the server.
//!
//! The suite drives real processes (`tollgate serve`, redis-server) and
//! breaks what lies between them. This crate holds the parts that do not
//! depend on those processes, so they can be tested on their own:
//!
//! - [`tcp::TcpProxy`]: a TCP proxy to put between a server and Redis,
//!   whose behaviour the test switches at run time (pass, added latency,
//!   stall, refuse new connections) and which drops or resets every
//!   connection on demand;
//! - [`udp::UdpMesh`]: one UDP socket per gossip node, each the address
//!   the node advertises, forwarding between nodes with loss,
//!   duplication, reordering, replay and partitions;
//! - [`rng::Rng`]: a tiny self-contained generator (splitmix64), so a
//!   schedule drawn from a seed never changes with a dependency upgrade;
//! - [`schedule`]: from a seed, a reproducible sequence of client
//!   operations and faults;
//! - [`copylog`]: the Redis copy log's pools decoded from their hash
//!   fields, and the invariants every pool must satisfy once the system
//!   is quiet (counts equal live holds plus staged transfers, none
//!   negative, no contribution of a server that is gone).
//!
//! The proxies own their tokio runtime, so a synchronous test uses them
//! like any other value; dropping one stops it.

#![deny(missing_docs)]

pub mod copylog;
pub mod rng;
pub mod schedule;
pub mod tcp;
pub mod udp;

pub use rng::Rng;
