//! The algorithms, one module each; see each module for its guarantees.

pub mod burst_tiers;
pub mod fixed_window;
pub mod gcra;
pub mod hit_log;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod smooth;
pub mod token_bucket;
