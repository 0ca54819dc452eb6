//! The summary of a run: the `--json` document ([`Report`]) and the table
//! printed otherwise.
//!
//! Apart so that the output's format (field names, units, rounding) is one
//! file; the numbers come from the merged tally, the plan and the CPU
//! window.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::cpu::CpuWindow;
use super::plan::LoadPlan;
use super::tally::Tally;
use super::{Api, BenchArgs, KeyDistribution};

/// Latency percentiles in microseconds.
#[derive(Serialize, Debug)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Slowest answer.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// The summary of a run (the `--json` document).
#[derive(Serialize, Debug)]
pub struct Report {
    /// The API driven.
    pub api: Api,
    /// The server.
    pub target: String,
    /// `closed` (max throughput) or `open` (fixed offered rate).
    pub mode: &'static str,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// gRPC connections (`http`: the client's pool, up to `concurrency`).
    pub connections: usize,
    /// Offered rate, requests per second (open loop).
    pub rate: Option<f64>,
    /// Measured seconds (warm-up excluded).
    pub duration_s: f64,
    /// Warm-up seconds.
    pub warmup_s: f64,
    /// Distinct keys.
    pub keys: u64,
    /// How keys were drawn.
    pub distribution: KeyDistribution,
    /// Requests answered or failed in the measured window.
    pub requests: u64,
    /// Failed requests: transport errors, non-OK statuses, timeouts.
    pub errors: u64,
    /// Requests answered "allowed" (RLS: overall OK).
    pub granted: u64,
    /// Requests answered "over limit".
    pub rejected: u64,
    /// Open loop: tickets of the window given up on when the run's deadline
    /// passed (0 unless the server fell far behind).
    pub unsent: u64,
    /// `requests` per measured second.
    pub throughput: f64,
    /// `granted + rejected` per measured second.
    pub decisions_per_s: f64,
    /// Latencies of answered (non-error) requests, in microseconds; open
    /// loop: from each request's intended send time.
    pub latency_us: Latency,
    /// Open loop: how late requests left the client after their intended
    /// send time, in microseconds. This is the client's own scheduling
    /// delay (the pacer thread's wake-up, a free task, CPU time on a shared
    /// machine); it is included in `latency_us`, as a real client's would
    /// be, and shown apart so the server's share can be told from it.
    pub send_lag_us: Option<Latency>,
    /// The client's CPU use in the measured window.
    pub client_cpu: Option<CpuUse>,
    /// The server's CPU use in the measured window (with `--server-pid`).
    pub server_cpu: Option<CpuUse>,
    /// Errors by kind.
    pub error_kinds: BTreeMap<String, u64>,
}

/// CPU a process used in the measured window.
#[derive(Serialize, Debug)]
pub struct CpuUse {
    /// CPU seconds per second: 1.0 is one core fully busy.
    pub cores: f64,
    /// CPU microseconds per request counted in the window.
    pub us_per_request: f64,
}

impl CpuUse {
    pub(super) fn new(used: Option<Duration>, wall: Duration, requests: u64) -> Option<CpuUse> {
        let used = used?;
        if wall.is_zero() || requests == 0 {
            return None;
        }
        Some(CpuUse {
            cores: (used.as_secs_f64() / wall.as_secs_f64() * 100.0).round() / 100.0,
            us_per_request: (used.as_secs_f64() * 1e7 / requests as f64).round() / 10.0,
        })
    }
}

impl Latency {
    pub(super) fn of(h: &Histogram<u64>) -> Latency {
        let us = |ns: u64| (ns as f64 / 100.0).round() / 10.0;
        Latency {
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
            mean: (h.mean() / 100.0).round() / 10.0,
        }
    }
}

impl Report {
    pub(super) fn new(args: &BenchArgs, plan: &LoadPlan, t: &Tally, cpu: CpuWindow) -> Report {
        let secs = plan.duration.as_secs_f64();
        let errors = t.errors.values().sum();
        Report {
            api: plan.api,
            target: plan.target.clone(),
            mode: if plan.rate.is_some() {
                "open"
            } else {
                "closed"
            },
            concurrency: plan.concurrency,
            connections: match plan.api {
                Api::Http => plan.concurrency,
                _ => plan.connections,
            },
            rate: plan.rate,
            duration_s: secs,
            warmup_s: plan.warmup.as_secs_f64(),
            keys: args.keys,
            distribution: args.distribution,
            requests: t.requests,
            errors,
            granted: t.granted,
            rejected: t.rejected,
            unsent: t.unsent,
            throughput: t.requests as f64 / secs,
            decisions_per_s: (t.granted + t.rejected) as f64 / secs,
            latency_us: Latency::of(&t.latency),
            send_lag_us: plan.rate.map(|_| Latency::of(&t.lag)),
            client_cpu: CpuUse::new(cpu.client, cpu.wall, t.requests),
            server_cpu: CpuUse::new(cpu.server, cpu.wall, t.requests),
            error_kinds: t.errors.clone(),
        }
    }

    /// The human-readable summary.
    pub(super) fn table(&self) -> String {
        let mut s = String::new();
        let load = match self.rate {
            Some(r) => format!("open loop at {r:.0} req/s"),
            None => "closed loop".to_owned(),
        };
        let api = match self.api {
            Api::Rls => "rls",
            Api::Native => "native",
            Api::Http => "http",
        };
        let _ = writeln!(
            s,
            "{api} against {}: {load}, {} in flight over {} connection(s), {}s measured after {}s warm-up, {} keys ({:?})",
            self.target,
            self.concurrency,
            self.connections,
            self.duration_s,
            self.warmup_s,
            self.keys,
            self.distribution,
        );
        let rows: [(&str, String); 12] = [
            ("requests", self.requests.to_string()),
            ("errors", self.errors.to_string()),
            ("granted", self.granted.to_string()),
            ("rejected", self.rejected.to_string()),
            ("throughput", format!("{:.0} req/s", self.throughput)),
            ("decisions", format!("{:.0} /s", self.decisions_per_s)),
            ("p50", format!("{:.1} µs", self.latency_us.p50)),
            ("p90", format!("{:.1} µs", self.latency_us.p90)),
            ("p99", format!("{:.1} µs", self.latency_us.p99)),
            ("p99.9", format!("{:.1} µs", self.latency_us.p999)),
            ("max", format!("{:.1} µs", self.latency_us.max)),
            ("mean", format!("{:.1} µs", self.latency_us.mean)),
        ];
        for (label, value) in rows {
            let _ = writeln!(s, "  {label:<11} {value:>14}");
        }
        if let Some(lag) = &self.send_lag_us {
            let _ = writeln!(
                s,
                "  {:<11} {:>14}  (p50 {:.1}, p99.9 {:.1}, max {:.1}; included above)",
                "send lag",
                format!("p99 {:.1} µs", lag.p99),
                lag.p50,
                lag.p999,
                lag.max
            );
        }
        for (label, cpu) in [
            ("client cpu", &self.client_cpu),
            ("server cpu", &self.server_cpu),
        ] {
            if let Some(c) = cpu {
                let _ = writeln!(
                    s,
                    "  {label:<11} {:>14}  ({:.2} cores)",
                    format!("{:.1} µs/req", c.us_per_request),
                    c.cores
                );
            }
        }
        if self.unsent > 0 {
            let _ = writeln!(
                s,
                "  {:<11} {:>14}  (the server fell behind the offered rate)",
                "unsent", self.unsent
            );
        }
        for (kind, n) in &self.error_kinds {
            let _ = writeln!(s, "  error × {n}: {kind}");
        }
        s
    }
}
