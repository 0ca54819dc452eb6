//! `tollgate sim`: replays a data set or a trace into a simulated gossip
//! cluster running tollgate's replication code, against a centralized
//! limiter, and reports each strategy's precision, memory, bandwidth and
//! convergence (docs/precision.md).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use tollgate_core::{Nanos, Rate};
use tollgate_replica::Dissemination;
use tollgate_sim::dataset::{self, DataSet, Kind, Params};
use tollgate_sim::figures;
use tollgate_sim::run::{self, Assign, Outcome, Partition, SimConfig, SimStrategy, Topology};
use tollgate_sim::{Arrival, Told};

/// Arguments of `tollgate sim`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SimArgs {
    /// A study instead of a cluster simulation.
    #[command(subcommand)]
    pub command: Option<SimCommand>,
    /// The cluster simulation's arguments.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Studies `tollgate sim` runs besides the cluster simulation.
#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// Seed 004's study: window approximations against a perfect sliding
    /// window.
    Windows(super::sim_windows::WindowsArgs),
}

/// Arguments of a cluster simulation.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The thesis's data set: A, B-extreme, B-substantial, B-barely,
    /// B-unlimited, C or D.
    #[arg(long, default_value = "B-extreme")]
    pub dataset: String,
    /// Replay this trace instead: JSON lines (`tollgate replay`'s format;
    /// `domain` or `user_id` is the user) or the thesis's export (a JSON
    /// array of `{"user_id", "time"}`).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The capacity parameter c (the bucket's capacity; data set D always
    /// uses 5). The refill is 0.001·c per second, as in the thesis (D: 1
    /// per second).
    #[arg(long, default_value_t = 300)]
    pub capacity: u64,
    /// Users of data set C.
    #[arg(long)]
    pub users: Option<usize>,
    /// Strategies to run, comma-separated: the thesis's counter, queue,
    /// queue+freq, queue+linf, queue+freq+linf and epoch, and tollgate's
    /// queue+near and queue+freq+near (near-limit propagation).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "counter,queue,queue+freq,queue+linf,queue+freq+linf,epoch,queue+near,queue+freq+near"
    )]
    pub strategies: Vec<String>,
    /// Nodes in the simulated cluster (full mesh).
    #[arg(long, default_value_t = 30)]
    pub nodes: usize,
    /// Seed of every random choice (data set, network, gossip).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Runs to average, with seeds SEED, SEED+1, ... for the network and
    /// gossip (the data set stays): the thesis averaged ten. The table
    /// shows the mean precision and its range; counts are rounded means.
    #[arg(long, default_value_t = 1)]
    pub runs: u64,
    /// Gossip interval (milliseconds).
    #[arg(long, default_value_t = 300)]
    pub gossip_interval_ms: u64,
    /// Least one-way latency of a datagram (milliseconds).
    #[arg(long, default_value_t = 1.0)]
    pub latency_ms: f64,
    /// Largest one-way latency (milliseconds; uniform in between).
    #[arg(long)]
    pub latency_max_ms: Option<f64>,
    /// Probability that a datagram is lost, in [0, 1].
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// How requests are routed to nodes: consistent-hash (the thesis's),
    /// round-robin, sticky or random.
    #[arg(long, default_value = "consistent-hash")]
    pub assign: String,
    /// Seconds between two anti-entropy digests a node sends a random
    /// member (the server's default is 30; 0 turns it off, as in the
    /// thesis's simulation).
    #[arg(long, default_value_t = 30.0)]
    pub anti_entropy_s: f64,
    /// Which nodes have links: full-mesh (the thesis's) or ring.
    #[arg(long, default_value = "full-mesh")]
    pub topology: String,
    /// How updates spread: origin (each node sends its own updates to
    /// every peer; tollgate's) or epidemic (everything learnt is forwarded
    /// to every other peer, one neighbour a round; the thesis's).
    #[arg(long, default_value = "origin")]
    pub dissemination: String,
    /// Cut some nodes off from the others for a while:
    /// `FROM..UNTIL@NODES`, seconds from the data set's start and nodes as
    /// numbers and ranges (e.g. `10..30@0-14`). Repeatable.
    #[arg(long)]
    pub partition: Vec<String>,
    /// Seconds between two samples of the time series.
    #[arg(long, default_value_t = 1.0)]
    pub sample_s: f64,
    /// Write results.csv, results.json, each strategy's time series (CSV)
    /// and charts of rejections, memory and bandwidth over time (SVG, and
    /// PNG in a build with the `png` feature) to this directory (created if
    /// missing).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tollgate sim`.
pub fn run(args: &SimArgs) -> Result<()> {
    match &args.command {
        Some(SimCommand::Windows(w)) => super::sim_windows::run(w),
        None => simulate(&args.run),
    }
}

fn ms(value: f64, flag: &str) -> Result<Nanos> {
    if !(value.is_finite() && value >= 0.0) {
        anyhow::bail!("{flag} {value}: expected a number of milliseconds, 0 or more");
    }
    Ok(Nanos::new((value * 1e6) as u64))
}

/// The data set the arguments name, or the trace they point to.
fn load(args: &RunArgs) -> Result<DataSet> {
    if args.capacity == 0 {
        anyhow::bail!("--capacity 0: the capacity must be at least 1");
    }
    let Some(path) = &args.trace else {
        let kind: Kind = args.dataset.parse().map_err(|e| {
            anyhow::anyhow!(
                "--dataset {}: {e} (expected one of {})",
                args.dataset,
                Kind::ALL.map(|k| k.to_string()).join(", ")
            )
        })?;
        return Ok(dataset::generate(
            kind,
            &Params {
                capacity: args.capacity,
                seed: args.seed,
                users: args.users,
            },
        ));
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the trace {}", path.display()))?;
    let arrivals = if text.trim_start().starts_with('[') {
        dataset::from_thesis_json(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
    } else {
        trace_lines(&text, path)?
    };
    let duration = arrivals
        .last()
        .map_or(Nanos::ZERO, |a| a.at.saturating_add(Nanos::from_millis(1)));
    Ok(DataSet {
        name: path.display().to_string(),
        capacity: args.capacity,
        rate: Rate::new(args.capacity, Nanos::from_secs(1000))
            .map_err(|e| anyhow::anyhow!("--capacity {}: {e}", args.capacity))?,
        arrivals,
        duration,
        description: format!("the trace {}", path.display()),
    })
}

/// Arrivals of a JSON-lines trace, times relative to the first.
fn trace_lines(text: &str, path: &Path) -> Result<Vec<Arrival>> {
    let mut arrivals = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let event = crate::trace::parse(line)
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), n + 1))?;
        // Usage told after the fact is one arrival carrying its hits; a
        // check of n hits is n one-hit requests, as the thesis counts.
        let told = match event.mode {
            tollgate_core::Mode::Report => Some(Told::Report(event.hits)),
            tollgate_core::Mode::Refund => Some(Told::Refund(event.hits)),
            _ => None,
        };
        if told.is_some() {
            arrivals.push(Arrival {
                at: event.time,
                user: event.domain.clone(),
                told,
            });
            continue;
        }
        for _ in 0..event.hits.max(1) {
            arrivals.push(Arrival {
                at: event.time,
                user: event.domain.clone(),
                told: None,
            });
        }
    }
    arrivals.sort();
    if let Some(first) = arrivals.first().map(|a| a.at) {
        for a in &mut arrivals {
            a.at = a.at.saturating_sub(first);
        }
    }
    Ok(arrivals)
}

fn simulate(args: &RunArgs) -> Result<()> {
    let set = load(args)?;
    let interval = Nanos::from_millis(args.gossip_interval_ms.max(1));
    let strategies: Vec<SimStrategy> = args
        .strategies
        .iter()
        .map(|name| {
            SimStrategy::parse(name, interval).ok_or_else(|| {
                anyhow::anyhow!(
                    "--strategies: unknown strategy `{name}` (expected {})",
                    SimStrategy::ALL.join(", ")
                )
            })
        })
        .collect::<Result<_>>()?;
    // A second run of the same strategy would overwrite the first's
    // series file and wear a line of its own for the same thing.
    if let Some((i, name)) = args
        .strategies
        .iter()
        .enumerate()
        .find(|(i, name)| args.strategies[..*i].contains(name))
    {
        anyhow::bail!(
            "--strategies: `{name}` is named twice (as strategy {} and {})",
            args.strategies[..i]
                .iter()
                .position(|n| n == name)
                .map_or(0, |p| p + 1),
            i + 1
        );
    }
    let assign = Assign::parse(&args.assign).ok_or_else(|| {
        anyhow::anyhow!(
            "--assign {}: expected consistent-hash, round-robin, sticky or random",
            args.assign
        )
    })?;
    if !(0.0..=1.0).contains(&args.loss) {
        anyhow::bail!("--loss {}: expected a probability in [0, 1]", args.loss);
    }
    let latency_min = ms(args.latency_ms, "--latency-ms")?;
    let config = SimConfig {
        nodes: args.nodes.max(1),
        assign,
        latency_min,
        latency_max: match args.latency_max_ms {
            Some(v) => ms(v, "--latency-max-ms")?.max(latency_min),
            None => latency_min,
        },
        loss: args.loss,
        seed: args.seed,
        sample: ms(args.sample_s * 1000.0, "--sample-s")?.max(Nanos::from_millis(10)),
        anti_entropy: ms(args.anti_entropy_s * 1000.0, "--anti-entropy-s")?,
        topology: Topology::parse(&args.topology).ok_or_else(|| {
            anyhow::anyhow!("--topology {}: expected full-mesh or ring", args.topology)
        })?,
        dissemination: Dissemination::parse(&args.dissemination).ok_or_else(|| {
            anyhow::anyhow!(
                "--dissemination {}: expected origin or epidemic",
                args.dissemination
            )
        })?,
        partitions: args
            .partition
            .iter()
            .map(|p| Partition::parse(p, args.nodes.max(1)))
            .collect::<Result<_, String>>()
            .map_err(|e| anyhow::anyhow!("--partition: {e}"))?,
    };
    eprintln!(
        "{}: {} requests from {} users over {:.0} s; capacity {}, refill one token every {}; {} nodes, gossip every {} ms, {} dissemination, {}",
        set.name,
        set.arrivals.iter().filter(|a| a.told.is_none()).count(),
        {
            let mut users: Vec<&str> = set.arrivals.iter().map(|a| a.user.as_str()).collect();
            users.sort_unstable();
            users.dedup();
            users.len()
        },
        set.duration.as_secs_f64(),
        set.capacity,
        set.rate.interval(),
        config.nodes,
        args.gossip_interval_ms,
        config.dissemination,
        config.assign.as_str(),
    );
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let bar = ProgressBar::new(
            set.arrivals.len() as u64 * strategies.len() as u64 * args.runs.max(1),
        );
        if let Ok(style) =
            ProgressStyle::with_template("{spinner} {msg:>16} [{bar:40}] {pos}/{len} ({eta})")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut outcomes = Vec::new();
    for (k, strategy) in strategies.iter().enumerate() {
        bar.set_message(strategy.name.clone());
        let done = k as u64 * set.arrivals.len() as u64 * args.runs;
        let outcome = run::run_many(&set, strategy, &config, args.runs, &mut |n| {
            bar.set_position(done + n)
        })
        .map_err(|e| anyhow::anyhow!("{}: {e}", strategy.name))?;
        outcomes.push(outcome);
    }
    bar.finish_and_clear();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary_json(&set, &outcomes))?
        );
    } else {
        print!("{}", table(&outcomes));
    }
    if let Some(dir) = &args.out {
        write_outputs(dir, &set, &outcomes)?;
        eprintln!("results written to {}", dir.display());
    }
    Ok(())
}

/// The results without their time series.
fn summary_json(set: &DataSet, outcomes: &[Outcome]) -> serde_json::Value {
    let results: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| {
            let mut v = serde_json::to_value(o).unwrap_or_default();
            if let Some(m) = v.as_object_mut() {
                m.remove("series");
            }
            v
        })
        .collect();
    serde_json::json!({
        "dataset": set.name,
        "description": set.description,
        "requests": set.arrivals.iter().filter(|a| a.told.is_none()).count(),
        "capacity": set.capacity,
        "results": results,
    })
}

/// The results as an aligned text table.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut rows = vec![[
        "strategy".to_owned(),
        "precision".to_owned(),
        "rejected".to_owned(),
        "centralized".to_owned(),
        "over-admitted".to_owned(),
        "false rejections".to_owned(),
        "peak memory/node".to_owned(),
        "mean memory/node".to_owned(),
        "gossip sent".to_owned(),
        "datagrams".to_owned(),
        "gossip/grant".to_owned(),
        "copies/grant".to_owned(),
        "convergence".to_owned(),
    ]];
    for o in outcomes {
        rows.push([
            o.strategy.clone(),
            match (o.precision, o.precision_min, o.precision_max) {
                (Some(p), Some(lo), Some(hi)) if o.runs > 1 => {
                    format!("{p:.1} % ({lo:.1}–{hi:.1})")
                }
                (Some(p), _, _) => format!("{p:.1} %"),
                _ => "-".into(),
            },
            o.rejections.to_string(),
            o.central_rejections.to_string(),
            o.over_admissions.to_string(),
            o.false_rejections.to_string(),
            format!("{:.1} KiB", o.peak_memory / 1024.0),
            format!("{:.1} KiB", o.mean_memory / 1024.0),
            format!("{:.1} KiB", o.gossip_bytes as f64 / 1024.0),
            o.gossip_datagrams.to_string(),
            o.gossip_per_grant
                .map_or("-".into(), |b| format!("{b:.0} B")),
            o.updates_per_grant
                .map_or("-".into(), |u| format!("{u:.1}")),
            o.convergence
                .map_or("not within 600 s".into(), |s| format!("{s:.1} s")),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (n, row) in rows.iter().enumerate() {
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c] - cell.chars().count();
            if c == 0 {
                let _ = write!(out, "{cell}{}", " ".repeat(pad));
            } else {
                let _ = write!(out, "  {}{cell}", " ".repeat(pad));
            }
        }
        out.push('\n');
        if n == 0 {
            let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
            out.push_str(&"-".repeat(total));
            out.push('\n');
        }
    }
    out
}

/// results.csv, results.json and series-STRATEGY.csv in `dir`.
fn write_outputs(dir: &Path, set: &DataSet, outcomes: &[Outcome]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    };
    let mut csv = String::from(
        "strategy,precision,rejections,central_rejections,over_admissions,false_rejections,peak_memory_bytes,mean_memory_bytes,gossip_bytes,gossip_datagrams,gossip_bytes_per_grant,gossip_updates_per_grant,membership_bytes,convergence_s\n",
    );
    for o in outcomes {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{:.0},{:.0},{},{},{},{},{},{}",
            o.strategy,
            o.precision.map_or(String::new(), |p| format!("{p:.3}")),
            o.rejections,
            o.central_rejections,
            o.over_admissions,
            o.false_rejections,
            o.peak_memory,
            o.mean_memory,
            o.gossip_bytes,
            o.gossip_datagrams,
            o.gossip_per_grant
                .map_or(String::new(), |b| format!("{b:.1}")),
            o.updates_per_grant
                .map_or(String::new(), |u| format!("{u:.2}")),
            o.membership_bytes,
            o.convergence.map_or(String::new(), |s| format!("{s:.3}")),
        );
    }
    write("results.csv", csv)?;
    write(
        "results.json",
        serde_json::to_string_pretty(&summary_json(set, outcomes))?,
    )?;
    for o in outcomes {
        let mut csv =
            String::from("t_s,requests,rejections,central_rejections,memory_bytes,gossip_bytes\n");
        for s in &o.series {
            let _ = writeln!(
                csv,
                "{:.3},{},{},{},{:.0},{}",
                s.t, s.requests, s.rejections, s.central_rejections, s.memory, s.gossip_bytes
            );
        }
        write(&format!("series-{}.csv", o.strategy.replace('+', "-")), csv)?;
    }
    write_charts(dir, set, outcomes)
}

/// rejections.svg, memory.svg and bandwidth.svg in `dir`: each strategy
/// over time, with the centralized limiter as the reference line drawn on
/// top (the thesis's Figures 5.5–5.12; [`figures`]).
fn write_charts(dir: &Path, set: &DataSet, outcomes: &[Outcome]) -> Result<()> {
    for figure in figures::figures(&set.name, outcomes) {
        figure
            .write(dir)
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.join(figure.file).display()))?;
    }
    Ok(())
}
