//! `tollgate bench`: a load generator for a running tollgate server (or
//! for `tollgate bench-echo`, the ceiling any gRPC service reaches here).
//!
//! Two ways to drive the server:
//!
//! - **closed loop** (no `--rate`): `--concurrency` tasks, each sending its
//!   next request as soon as the previous one is answered. This finds the
//!   maximum throughput; its latencies are those of a saturated server.
//! - **open loop** (`--rate R`): a pacer thread releases one ticket every
//!   1/R seconds, each stamped with its *intended* send time; tasks take
//!   tickets in order and latency is measured from the intended time, not
//!   from when a task got round to sending. A server that stalls therefore
//!   shows the stall in every request queued behind it (no coordinated
//!   omission). `--concurrency` still bounds the requests in flight, so an
//!   offered rate the server cannot follow builds a backlog at the client,
//!   visible as latency and as a throughput below the offered rate.
//!
//! Latencies go into one HDR histogram per task (nanoseconds, three
//! significant digits), merged at the end. Errors (transport failures,
//! non-OK statuses, timeouts) are counted by kind, never fatal; only a run
//! where every request failed exits non-zero.
//!
//! The parts, one module each: `plan` (the arguments checked into the
//! shape of a run, and how keys are drawn), `client` (one client per API
//! and what an answer counts as), `drive` (the run's clock, the tasks and
//! the closed loop), `pacing` (the open loop's tickets and the thread that
//! releases them), `tally` (what each task records), `cpu` (CPU time from
//! /proc) and `report` (the summary, as a table or JSON). Only the
//! arguments and [`run`] are this command's surface.

use std::io::Write as _;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;

mod client;
mod cpu;
mod drive;
mod pacing;
mod plan;
mod report;
mod tally;

use drive::drive;
use plan::LoadPlan;

/// Which API `tollgate bench` drives.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// Envoy's rate-limit service v3 (`ShouldRateLimit`) on the gRPC port.
    Rls,
    /// tollgate's native gRPC API (`tollgate.v1.Tollgate/Request`).
    Native,
    /// The HTTP/JSON API (`POST /v1/request`) on the HTTP port.
    Http,
}

/// How request keys (domains `user-0` .. `user-K-1`) are drawn.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyDistribution {
    /// Every key equally likely.
    Uniform,
    /// Zipf: `user-0` the most frequent, key k's weight ∝ 1/(k+1)^s.
    Zipf,
}

/// Arguments of `tollgate bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The server, `host:port`: the gRPC port for `rls` and `native`, the
    /// HTTP port for `http`.
    #[arg(long)]
    pub target: String,
    /// The API to drive.
    #[arg(long, value_enum, default_value_t = Api::Native)]
    pub api: Api,
    /// Requests in flight at once (one task each).
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// gRPC connections the in-flight requests are spread over (HTTP/2
    /// multiplexes them); default min(concurrency, 4). Ignored for `http`,
    /// where HTTP/1.1 keep-alive needs one connection per in-flight request.
    #[arg(long)]
    pub connections: Option<usize>,
    /// How long to measure (`10s`, `500ms`, `1m`).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load before measuring, not counted (connections warm, server caches
    /// and key state filled).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Distinct keys: domains `user-0` .. `user-<K-1>`.
    #[arg(long, default_value_t = 1000)]
    pub keys: u64,
    /// How keys are drawn.
    #[arg(long, value_enum, default_value_t = KeyDistribution::Uniform)]
    pub distribution: KeyDistribution,
    /// The Zipf exponent s (with `--distribution zipf`).
    #[arg(long, default_value_t = 1.0)]
    pub zipf_exponent: f64,
    /// Namespace of `native` and `http` requests.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Resource of `native` and `http` requests.
    #[arg(long, default_value = "api")]
    pub resource: String,
    /// Envoy domain of `rls` requests. The default matches
    /// examples/envoy-messaging.yaml (serve `--config examples/` to load it
    /// next to the bundled config); a domain the server does not know is
    /// answered OK without deciding anything.
    #[arg(long, default_value = "messaging")]
    pub domain_name: String,
    /// The key of the one descriptor entry of `rls` requests; its value is
    /// the drawn key (`user-N`).
    #[arg(long, default_value = "to_number")]
    pub descriptor_key: String,
    /// Hits per request (`hits`, or `hits_addend` for `rls`). Requests are
    /// all or nothing (`native` and `http` send `min_hits` = `hits`).
    #[arg(long, default_value_t = 1)]
    pub hits: u64,
    /// Offered load in requests per second, all tasks together (open
    /// loop); without it, closed loop at maximum throughput.
    #[arg(long)]
    pub rate: Option<f64>,
    /// A request not answered within this time counts as an error.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Worker threads of the client's runtime (default: one per CPU).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seed of the key draws (task i uses seed + i), for repeatable runs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the summary as one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The server's process id: report the CPU time it used per request
    /// during the measured window (Linux, from /proc). When client and
    /// server share the machine, throughput is bounded by both; the
    /// server's CPU per request is its own cost.
    #[arg(long)]
    pub server_pid: Option<u32>,
}

/// Parses `10s`, `500ms`, `1m` with the config's duration syntax.
fn parse_duration(text: &str) -> Result<Duration, String> {
    tollgate_config::units::parse_duration(text).map(|n| Duration::from_nanos(n.as_u64()))
}

/// Runs the benchmark and prints its summary; fails if the arguments are
/// unusable, the target cannot be reached, or every request failed.
pub fn run(args: BenchArgs) -> Result<()> {
    let plan = LoadPlan::new(&args)?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(threads) = args.threads {
        if threads == 0 {
            bail!("--threads must be at least 1");
        }
        runtime.worker_threads(threads);
    }
    let runtime = runtime.build().context("cannot start the async runtime")?;
    let report = runtime.block_on(drive(&args, plan))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        out.write_all(report.table().as_bytes())?;
    }
    out.flush()?;
    if report.requests == 0 {
        bail!("no request was answered within the measured window");
    }
    if report.errors == report.requests {
        let first = report
            .error_kinds
            .keys()
            .next()
            .map_or("unknown", String::as_str);
        bail!(
            "every request failed ({} of {}; e.g. {first})",
            report.errors,
            report.requests
        );
    }
    Ok(())
}
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    #[test]
    fn durations_use_the_config_syntax() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert!(parse_duration("10").is_err());
    }
}
