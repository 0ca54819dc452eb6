//! One module per subcommand.

pub mod check_config;
pub mod replay;
pub mod serve;
