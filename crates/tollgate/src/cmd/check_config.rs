//! `tollgate check-config`: validate, show warnings and the normalized
//! config; with `--cluster`, also hold it to a replicated cluster's rules.

use std::path::PathBuf;
use std::sync::Arc;

use tollgate_core::replicated::strategy::{Replication, StrategyKind};
use tollgate_replica::{Replica, ReplicaOptions, ReplicaStore};
use tollgate_service::{Limiter, View};

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
    /// With --cluster: how resources without `replication:` are replicated,
    /// as `serve --replication` says.
    #[arg(long, value_name = "STRATEGY", default_value = "queue",
          value_parser = ["counter", "queue", "epoch"], requires = "cluster")]
    pub replication: String,
}

/// Validates; prints warnings on stderr and the normalized config on
/// stdout. Returns whether the config is valid (and, with `--cluster`,
/// whether a cluster can serve it).
pub fn run(args: &CheckConfigArgs) -> bool {
    match tollgate_config::load_path(&args.config) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            if args.cluster {
                // The value parser admits only the three names.
                let strategy =
                    StrategyKind::parse(&args.replication).unwrap_or(StrategyKind::Queue);
                if let Err(e) = on_cluster(&loaded.config, strategy) {
                    eprintln!("error: {}", refusal("replicated", &e));
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

/// Compiles `config` as a node of a replicated cluster whose default
/// strategy is `strategy` would (`Limiter::compile` on a replica store:
/// the rules `serve --cluster` applies), without starting a node. The
/// error has one line per limit the cluster cannot serve.
fn on_cluster(config: &tollgate_config::Config, strategy: StrategyKind) -> Result<(), String> {
    let replica = Replica::new(ReplicaOptions {
        default: Replication::new(strategy),
        ..ReplicaOptions::default()
    });
    Limiter::new(ReplicaStore::new(Arc::new(replica)), View::default())
        .compile(config, tollgate_server::clock::now())
        .map(drop)
}

/// The error for a config the `store_name` store cannot serve: `reasons`
/// has one line per limit refused (as `Limiter::compile` gives them); all
/// are listed, so one run shows everything to change.
pub(crate) fn refusal(store_name: &str, reasons: &str) -> String {
    let lines: Vec<&str> = reasons.lines().filter(|l| !l.trim().is_empty()).collect();
    match lines.as_slice() {
        [one] => format!("the config cannot run on the {store_name} store: {one}"),
        many => format!(
            "the config cannot run on the {store_name} store ({} problems, each saying what to change):\n  {}",
            many.len(),
            many.join("\n  ")
        ),
    }
}
