//! tollgate's replicated mode: a gossip cluster of servers that limits
//! without a store (seed 000, the thesis; seed 001, the gossiping interval
//! limiter). See `docs/replicated.md`.
//!
//! - [`replica`]: one node's replicated state, decided on and merged
//!   under shard locks;
//! - [`deltas`]: what each peer has not been sent yet, and who gets an
//!   update ([`Dissemination`]);
//! - [`digest`]: the short summaries anti-entropy compares;
//! - [`store`]: the [`ReplicaStore`] the server decides on;
//! - [`wire`]: the datagrams nodes exchange, encrypted and authenticated
//!   with the cluster's secret;
//! - [`node`]: the sans-IO node (membership with foca, gossip rounds,
//!   full-state transfer, clock checks) that a runtime drives;
//! - [`runtime`]: the node on a tokio UDP socket;
//! - [`discovery`]: seed peers found by DNS (`--peers dns:NAME:PORT`),
//!   re-resolved while the node runs;
//! - [`sim`]: the node on a simulated network and simulated time.

#![deny(missing_docs)]

pub mod deltas;
pub mod digest;
pub mod discovery;
pub mod metrics;
pub mod node;
pub mod replica;
pub mod runtime;
pub mod sim;
pub mod store;
pub mod wire;

pub use deltas::{Class, Dissemination, Round};
pub use node::{Node, NodeConfig, NodeTimer, Output, Peer, Sent};
pub use replica::{Absorbed, Replica, ReplicaOptions};
pub use store::{NotReplicable, ReplicaStore};
