//! `tollgate check-config`: validate, show warnings and the normalized
//! config; with `--cluster`, also hold it to a replicated cluster's rules.

use std::path::PathBuf;

use super::store_rules;

/// Arguments of `tollgate check-config`.
#[derive(clap::Args, Debug)]
pub struct CheckConfigArgs {
    /// The config: a file, or a directory of *.yaml files.
    pub config: PathBuf,
    /// Print only errors and warnings, not the normalized config.
    #[arg(long, short)]
    pub quiet: bool,
    /// Also check that a replicated cluster (`serve --cluster`) can serve
    /// the config: every resource it cannot replicate is an error saying
    /// what to change. Nothing is started or contacted.
    #[arg(long)]
    pub cluster: bool,
    #[command(flatten)]
    pub replication: store_rules::ReplicationArg,
}

/// Validates; prints warnings on stderr and the normalized config on
/// stdout. Returns whether the config is valid (and, with `--cluster`,
/// whether a cluster can serve it). `given` are the command's matches, to
/// refuse `--replication` without `--cluster` on the command line (clap's
/// `requires` would refuse `TOLLGATE_REPLICATION` too, which a cluster
/// node's environment sets for `serve`).
pub fn run(args: &CheckConfigArgs, given: Option<&clap::ArgMatches>) -> bool {
    let on_command_line = given.and_then(|m| m.value_source("replication"))
        == Some(clap::parser::ValueSource::CommandLine);
    if on_command_line && !args.cluster {
        let mut command = clap::Command::new("tollgate check-config");
        command = <CheckConfigArgs as clap::Args>::augment_args(command);
        let error = command.error(
            clap::error::ErrorKind::MissingRequiredArgument,
            "--replication says how a cluster replicates; it needs --cluster",
        );
        error.exit();
    }
    match tollgate_config::load_path(&args.config) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            if args.cluster {
                let now = tollgate_service::Clock::now(&tollgate_service::SystemClock);
                if let Err(unserved) =
                    store_rules::on_cluster(&loaded.config, args.replication.strategy.0, now)
                {
                    let refused = store_rules::Refused {
                        store: "replicated",
                        unserved,
                    };
                    eprintln!("error: {refused}");
                    return false;
                }
            }
            if !args.quiet {
                print!("{}", tollgate_config::emit::to_yaml(&loaded.config));
            }
            true
        }
        Err(e) => {
            eprintln!("{e}");
            false
        }
    }
}
