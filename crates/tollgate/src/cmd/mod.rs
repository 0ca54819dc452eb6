//! One module per subcommand.

pub mod answers;
pub mod bench;
pub mod check_config;
pub mod client;
pub mod config_api;
pub mod connections;
pub mod counters;
pub mod echo;
pub mod otlp;
pub mod replay;
pub mod serve;
pub mod shell;
pub mod sim;
pub mod sim_windows;
pub mod store_rules;

/// The stores `serve` runs on (not a subcommand).
mod backend;
