//! Test support shared by tollgate's crates; a dev-dependency only,
//! never linked into what ships.
//!
//! - [`JavaRandom`]: `java.util.Random`, bit for bit, so tests replay what
//!   Guava's own tests draw with the same seeds; [`guava_scripts`] and
//!   [`guava_steps`]: the Guava scripts the memory and Redis smooth
//!   limiters both replay, with the Java port's waits.
//! - [`eventually`] and [`eventually_async`]: poll a condition of a real
//!   process (which a test cannot step by a clock of its own) until it
//!   holds, and fail with its last complaint after a bound.
//! - Process harness pieces: [`free_port`], [`free_udp_addr`], a
//!   [`KillOnDrop`] guard for a child, [`wait_ready`] until a started
//!   server answers ([`accepts`] for a plain TCP one), and [`signal`].

#![deny(missing_docs)]

mod guava;
mod java_random;
mod poll;
mod process;

pub use guava::{guava_scripts, guava_steps, GuavaLimiter, GuavaScript, GuavaStep};
pub use java_random::JavaRandom;
pub use poll::{eventually, eventually_async, POLL};
pub use process::{
    accepts, free_port, free_udp_addr, refused_addr, signal, wait_ready, KillOnDrop,
};
