//! The `tollgate` binary: one executable, many subcommands. It only wires
//! the library crates together, chooses exit codes and adds context to
//! errors (`anyhow` lives here and nowhere else).

mod cmd;
mod config_follow;
mod summary;
mod trace;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// The version and the git commit it was built from (build.rs).
pub(crate) const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TOLLGATE_GIT_COMMIT"),
    ")"
);

/// tollgate: rate limiting and concurrency limiting.
#[derive(Parser, Debug)]
#[command(name = "tollgate", version = VERSION, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate a config; print warnings and the normalized config.
    CheckConfig(cmd::check_config::CheckConfigArgs),
    /// Feed a recorded trace through a config and show what it would do.
    Replay(cmd::replay::ReplayArgs),
    /// Run the limiting server (gRPC, Envoy RLS, HTTP).
    Serve(Box<cmd::serve::ServeArgs>),
    /// Simulate a gossip cluster on a data set or trace: precision, memory,
    /// bandwidth and convergence of each replication strategy.
    Sim(cmd::sim::SimArgs),
    /// Drive a running server with load; print throughput and latency.
    Bench(cmd::bench::BenchArgs),
    /// A gRPC server that answers without deciding: `bench`'s ceiling.
    BenchEcho(cmd::echo::EchoArgs),
    /// Ask a server for hits of a rate-limited resource (exit 0 granted,
    /// 1 rejected, 2 error).
    Request(cmd::client::RequestArgs),
    /// Hold copies of a copy-limited resource for a while, then release.
    Hold(cmd::client::HoldArgs),
    /// Reserve copies and stage them for another client; prints the
    /// transfer id.
    Transfer(cmd::client::TransferArgs),
    /// Take copies another client staged, hold them for a while, release.
    Seize(cmd::client::SeizeArgs),
    /// Show a server's version, store, readiness, config and sessions.
    Status(cmd::client::StatusArgs),
    /// Inspect or reset a server's live counters (an admin endpoint: needs
    /// a token of its --admin-tokens-file).
    Counters(cmd::counters::CountersArgs),
    /// Run the configuration API: limits over HTTP, stored in SQLite or
    /// PostgreSQL.
    ConfigApi(cmd::config_api::ConfigApiArgs),
    /// Print a shell completion script (bash, zsh, fish, ...).
    Completions(cmd::shell::CompletionsArgs),
    /// Print the man page (roff), of tollgate or of one subcommand.
    Man(cmd::shell::ManArgs),
}

fn main() -> ExitCode {
    // Parsed in two steps to keep the matches: `check-config` tells a flag
    // given on its command line from the same setting in the environment.
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::CheckConfig(args) => {
            let given = matches.subcommand_matches("check-config");
            exit(cmd::check_config::run(&args, given))
        }
        Command::Bench(args) => edge(cmd::bench::run(args)),
        Command::Sim(args) => edge(cmd::sim::run(&args)),
        Command::BenchEcho(args) => edge(cmd::echo::run(args)),
        Command::Request(args) => cmd::client::request(args),
        Command::Hold(args) => cmd::client::hold(args),
        Command::Transfer(args) => cmd::client::transfer(args),
        Command::Seize(args) => cmd::client::seize(args),
        Command::Status(args) => cmd::client::status(args),
        Command::ConfigApi(args) => edge(cmd::config_api::run(args)),
        Command::Counters(args) => cmd::counters::run(args),
        Command::Completions(args) => edge(cmd::shell::completions(&args, Cli::command())),
        Command::Man(args) => edge(cmd::shell::man(&args, Cli::command())),
        Command::Serve(args) => match cmd::serve::run(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Replay(args) => {
            let loaded = match tollgate_config::load_path(&args.config) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            match cmd::replay::run(&args, loaded) {
                Ok(clean) => exit(clean || !args.strict),
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Reports an error at the binary's edge.
fn edge(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
