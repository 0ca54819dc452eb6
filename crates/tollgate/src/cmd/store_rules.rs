//! What a store can serve of a config, checked without starting one.
//!
//! `serve` compiles its config for the store it runs on, `serve --check`
//! holds a config to the same rules without connecting or binding, and
//! `check-config --cluster` to a replicated cluster's. All three go through
//! here, so each refuses a config alike, listing every limit to change in
//! the config's order ([`tollgate_service::Limiter::compile_all`]), and a
//! cluster's default strategy is one flag, parsed once, with one error.

use std::sync::Arc;

use clap::builder::PossibleValue;
use clap::ValueEnum;
use tollgate_config::Config;
use tollgate_core::replicated::strategy::{Replication, StrategyKind};
use tollgate_core::Nanos;
use tollgate_replica::{Replica, ReplicaOptions, ReplicaStore};
use tollgate_service::{Limiter, Unservable, View};
use tollgate_store::MemoryStore;

/// A replicated cluster's default strategy as `--replication` (or
/// `TOLLGATE_REPLICATION`) takes it: `counter`, `queue` or `epoch`, the
/// names a config's `replication:` uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Strategy(pub StrategyKind);

/// `--replication`, one flag for `serve` and `check-config` (same name,
/// variable, values and default), flattened into each.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplicationArg {
    /// How a cluster replicates resources without `replication:`:
    /// `counter`, `queue` or `epoch`.
    #[arg(
        id = "replication",
        long = "replication",
        value_name = "STRATEGY",
        env = "TOLLGATE_REPLICATION",
        value_enum,
        default_value = "queue"
    )]
    pub strategy: Strategy,
}

impl ValueEnum for Strategy {
    fn value_variants<'a>() -> &'a [Strategy] {
        &[
            Strategy(StrategyKind::Counter),
            Strategy(StrategyKind::Queue),
            Strategy(StrategyKind::Epoch),
        ]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.0.as_str()))
    }
}

/// Compiles `config` as a node of a replicated cluster whose default
/// strategy is `strategy` does (on a replica store, which no node or
/// socket backs) at `now`; the error lists every limit the cluster cannot
/// serve.
pub(crate) fn on_cluster(
    config: &Config,
    strategy: StrategyKind,
    now: Nanos,
) -> Result<(), Vec<Unservable>> {
    let replica = Replica::new(ReplicaOptions {
        default: Replication::new(strategy),
        ..ReplicaOptions::default()
    });
    Limiter::new(ReplicaStore::new(Arc::new(replica)), View::default())
        .compile_all(config, now)
        .map(drop)
}

/// Compiles `config` as a server storing in Redis does, without a
/// connection: as the memory store (the Redis store prepares limits
/// alike), then every limit held to the exact range of Redis's scripts
/// ([`tollgate_redis::check_limit`], the Redis store's `check_limit`).
pub(crate) fn on_redis(config: &Config, now: Nanos) -> Result<(), Vec<Unservable>> {
    let view = Limiter::new(MemoryStore::default(), View::default()).compile_all(config, now)?;
    let problems = view.unservable(config, tollgate_redis::check_limit);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// The error for a config the `store_name` store cannot serve: every
/// problem listed, so one run shows everything to change.
pub(crate) fn refusal(store_name: &str, problems: &[Unservable]) -> String {
    match problems {
        [one] => format!("the config cannot run on the {store_name} store: {one}"),
        many => {
            let lines: Vec<String> = many.iter().map(ToString::to_string).collect();
            format!(
                "the config cannot run on the {store_name} store ({} problems, each saying what \
                 to change):\n  {}",
                many.len(),
                lines.join("\n  ")
            )
        }
    }
}
