//! What a store can serve of a config, checked without starting one.
//!
//! `serve` compiles its config for the store it runs on, `serve --check`
//! holds a config to the same rules without connecting or binding, and
//! `check-config --cluster` to a replicated cluster's. All three go through
//! here, so each refuses a config alike, listing every limit to change in
//! the config's order ([`tollgate_service::Limiter::compile`]), and a
//! cluster's default strategy is one flag, parsed once, with one error.
//! The service's refusals say what to change in the config; the flags that
//! change the store are this binary's, so [`Refused`] adds them here.

use std::sync::Arc;

use clap::builder::PossibleValue;
use clap::ValueEnum;
use tollgate_config::Config;
use tollgate_core::replicated::strategy::{Replication, StrategyKind};
use tollgate_core::Nanos;
use tollgate_replica::{Replica, ReplicaOptions, ReplicaStore};
use tollgate_service::{Limiter, Unservable, Unserved, View};
use tollgate_store::{MemoryStore, Refusal};

/// A replicated cluster's default strategy as `--replication` (or
/// `TOLLGATE_REPLICATION`) takes it: `counter`, `queue` or `epoch`, the
/// names a config's `replication:` uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct StrategyFlag(pub StrategyKind);

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
    pub strategy: StrategyFlag,
}

impl ValueEnum for StrategyFlag {
    fn value_variants<'a>() -> &'a [StrategyFlag] {
        &[
            StrategyFlag(StrategyKind::Counter),
            StrategyFlag(StrategyKind::Queue),
            StrategyFlag(StrategyKind::Epoch),
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
) -> Result<(), Unserved> {
    let replica = Replica::new(ReplicaOptions {
        default: Replication::new(strategy),
        ..ReplicaOptions::default()
    });
    Limiter::new(ReplicaStore::new(Arc::new(replica)), View::default())
        .compile(config, now)
        .map(drop)
}

/// Compiles `config` as a server storing in Redis does, without a
/// connection: as the memory store (the Redis store prepares limits
/// alike), then every limit held to the exact range of Redis's scripts
/// ([`tollgate_redis::check_limit`], what the Redis store's `admit` holds
/// a rate limit to; it admits every copy pool).
pub(crate) fn on_redis(config: &Config, now: Nanos) -> Result<(), Unserved> {
    let view = Limiter::new(MemoryStore::default(), View::default()).compile(config, now)?;
    let problems = view.unservable(config, |limit| {
        tollgate_redis::check_limit(limit).map_err(Refusal::limit)
    });
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Unserved { problems })
    }
}

/// A config the `store` store cannot serve, as this binary reports it:
/// every problem listed, so one run shows everything to change, each with
/// its reason's causes, and the flag to use where a refusal says to serve
/// a resource from another store. The message holds the whole chain of
/// every problem (a list has no one cause); [`Refused::unserved`] keeps
/// them typed.
#[derive(Debug)]
pub(crate) struct Refused {
    /// The store's name as `serve --check` prints it (`memory`, `redis`,
    /// `replicated`).
    pub store: &'static str,
    /// What the store refused.
    pub unserved: Unserved,
}

impl Refused {
    /// One problem: where, why (with every cause), and the flag that
    /// changes the store when the reason says to change it.
    fn line(problem: &Unservable) -> String {
        let mut line = format!("{:#}", anyhow::Error::new(problem.clone()));
        if matches!(problem.reason, Refusal::NoCopies) {
            line += " (the Redis store does: --store redis://...)";
        }
        line
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let store = self.store;
        match self.unserved.problems.as_slice() {
            [one] => write!(
                f,
                "the config cannot run on the {store} store: {}",
                Refused::line(one)
            ),
            many => {
                let lines: Vec<String> = many.iter().map(Refused::line).collect();
                write!(
                    f,
                    "the config cannot run on the {store} store ({} problems, each saying what \
                     to change):\n  {}",
                    many.len(),
                    lines.join("\n  ")
                )
            }
        }
    }
}

impl std::error::Error for Refused {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store's reason with a cause of its own.
    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("the limit cannot be prepared")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn problem(resource: &str, reason: Refusal) -> Unservable {
        Unservable {
            namespace: "ns".into(),
            resource: resource.into(),
            domain: None,
            limit: None,
            reason,
        }
    }

    /// Issue 20: the service named `--store` in its refusal of copy pools;
    /// the flag is this binary's, so it is added here, to that refusal
    /// alone. Every reason is shown with its causes (the message had only
    /// the top one when reasons were strings made by `to_string`).
    #[test]
    fn the_flag_hint_is_added_here_and_every_cause_is_shown() {
        let cause = std::io::Error::other("a parameter out of range");
        let refused = Refused {
            store: "replicated",
            unserved: Unserved {
                problems: vec![
                    problem("pool", Refusal::NoCopies),
                    problem("api", Refusal::limit(Outer(cause))),
                ],
            },
        };
        let text = refused.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "the config cannot run on the replicated store (2 problems, each saying what to change):",
                &format!("  namespace `ns`, resource `pool`: {} (the Redis store does: --store redis://...)", Refusal::NoCopies),
                "  namespace `ns`, resource `api`: the limit cannot be prepared: a parameter out of range",
            ]
        );
        assert!(!Refusal::NoCopies.to_string().contains("--store"));
    }
}
