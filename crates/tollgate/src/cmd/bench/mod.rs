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

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::Zipf;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tollgate_proto::rls::rate_limit_descriptor::Entry;
use tollgate_proto::rls::rate_limit_response::Code as RlsCode;
use tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::rls::{RateLimitDescriptor, RateLimitRequest};
use tollgate_proto::v1::tollgate_client::TollgateClient;
use tollgate_proto::v1::RateRequest;
use tonic::transport::{Channel, Endpoint};

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
    let plan = Plan::new(&args)?;
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

/// The validated shape of a run.
struct Plan {
    api: Api,
    target: String,
    concurrency: usize,
    connections: usize,
    warmup: Duration,
    duration: Duration,
    rate: Option<f64>,
    timeout: Duration,
    keys: Keys,
    template: Template,
}

impl Plan {
    fn new(args: &BenchArgs) -> Result<Plan> {
        if args.concurrency == 0 {
            bail!("--concurrency must be at least 1");
        }
        if args.keys == 0 {
            bail!("--keys must be at least 1");
        }
        if args.duration.is_zero() {
            bail!("--duration must be more than 0");
        }
        if args.hits == 0 {
            bail!("--hits must be at least 1");
        }
        if args.api == Api::Rls && u32::try_from(args.hits).is_err() {
            bail!(
                "--hits: Envoy's hits_addend is 32 bits, at most {}",
                u32::MAX
            );
        }
        if let Some(r) = args.rate {
            // Also refuses NaN. The bounds keep every intended send time
            // (n / rate) a sane duration.
            if !(0.01..=1e9).contains(&r) {
                bail!("--rate must be between 0.01 and 10^9 requests per second");
            }
        }
        let connections = args.connections.unwrap_or(args.concurrency.min(4));
        if connections == 0 {
            bail!("--connections must be at least 1");
        }
        let keys = match args.distribution {
            KeyDistribution::Uniform => Keys::Uniform(args.keys),
            KeyDistribution::Zipf => Keys::Zipf(
                Zipf::new(args.keys as f64, args.zipf_exponent)
                    .map_err(|e| anyhow::anyhow!("--zipf-exponent {}: {e}", args.zipf_exponent))?,
            ),
        };
        // A scheme is accepted and dropped: each API adds its own.
        let target = args
            .target
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        if target.is_empty() {
            bail!("--target is empty (expected host:port)");
        }
        Ok(Plan {
            api: args.api,
            target,
            concurrency: args.concurrency,
            connections: connections.min(args.concurrency),
            warmup: args.warmup,
            duration: args.duration,
            rate: args.rate,
            timeout: args.timeout,
            keys,
            template: Template {
                namespace: args.namespace.clone(),
                resource: args.resource.clone(),
                domain_name: args.domain_name.clone(),
                descriptor_key: args.descriptor_key.clone(),
                hits: args.hits,
            },
        })
    }
}

/// The fixed part of every request.
struct Template {
    namespace: String,
    resource: String,
    domain_name: String,
    descriptor_key: String,
    hits: u64,
}

/// How keys are drawn.
#[derive(Clone, Copy)]
enum Keys {
    Uniform(u64),
    Zipf(Zipf<f64>),
}

impl Keys {
    /// A key index in `0..K`.
    fn draw(&self, rng: &mut SmallRng) -> u64 {
        match self {
            Keys::Uniform(k) => rng.random_range(0..*k),
            // Zipf draws ranks 1..=K as floats; rank 1 is `user-0`.
            Keys::Zipf(z) => (rng.sample(z) as u64).saturating_sub(1),
        }
    }
}

/// What one request came back as.
enum Outcome {
    Granted,
    Rejected,
    Error(String),
}

/// A connection-level client for one API; clones share the connection.
#[derive(Clone)]
enum Client {
    Native(TollgateClient<Channel>),
    Rls(RateLimitServiceClient<Channel>),
    Http {
        client: reqwest::Client,
        url: Arc<str>,
    },
}

/// The parts of the HTTP answer the benchmark reads.
#[derive(Deserialize)]
struct HttpAnswer {
    allowed: bool,
}

impl Client {
    async fn call(&mut self, t: &Template, key: u64) -> Outcome {
        let domain = format!("user-{key}");
        match self {
            Client::Native(c) => {
                let req = RateRequest {
                    namespace: t.namespace.clone(),
                    resource: t.resource.clone(),
                    domain,
                    hits: Some(t.hits),
                    // All or nothing, said explicitly (absent means the
                    // same): `min_hits: 0` would make every request
                    // "allowed", possibly with nothing granted.
                    min_hits: Some(t.hits),
                    ..RateRequest::default()
                };
                match c.request(req).await {
                    Ok(r) if r.get_ref().allowed => Outcome::Granted,
                    Ok(_) => Outcome::Rejected,
                    Err(s) => Outcome::Error(status_kind(&s)),
                }
            }
            Client::Rls(c) => {
                let req = RateLimitRequest {
                    domain: t.domain_name.clone(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: t.descriptor_key.clone(),
                            value: domain,
                        }],
                        ..RateLimitDescriptor::default()
                    }],
                    // Checked to fit when the run was planned.
                    hits_addend: u32::try_from(t.hits).unwrap_or(u32::MAX),
                };
                match c.should_rate_limit(req).await {
                    Ok(r) => match r.get_ref().overall_code() {
                        RlsCode::Ok => Outcome::Granted,
                        RlsCode::OverLimit => Outcome::Rejected,
                        RlsCode::Unknown => Outcome::Error("RLS overall_code UNKNOWN".into()),
                    },
                    Err(s) => Outcome::Error(status_kind(&s)),
                }
            }
            Client::Http { client, url } => {
                let body = serde_json::json!({
                    "namespace": t.namespace,
                    "resource": t.resource,
                    "domain": domain,
                    "hits": t.hits,
                    "min_hits": t.hits,
                });
                let answer = match client.post(&**url).json(&body).send().await {
                    Ok(a) => a,
                    Err(e) => return Outcome::Error(http_error_kind(&e)),
                };
                let status = answer.status();
                // 429 is how HTTP rate limiters (envoyproxy/ratelimit's
                // /json among them) say "over limit", with or without a
                // body; any other non-2xx is an error.
                if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
                    return Outcome::Rejected;
                }
                if !status.is_success() {
                    return Outcome::Error(format!("HTTP {status}"));
                }
                match answer.json::<HttpAnswer>().await {
                    Ok(a) if a.allowed => Outcome::Granted,
                    Ok(_) => Outcome::Rejected,
                    Err(e) => Outcome::Error(format!("HTTP body: {}", root_cause(&e))),
                }
            }
        }
    }
}

/// An error kind for counting: the gRPC code and message.
fn status_kind(s: &tonic::Status) -> String {
    let message = s.message();
    if message.is_empty() {
        format!("gRPC {:?}", s.code())
    } else {
        format!("gRPC {:?}: {}", s.code(), cut(message, 120))
    }
}

fn http_error_kind(e: &reqwest::Error) -> String {
    let what = if e.is_connect() {
        "connect"
    } else if e.is_timeout() {
        "timeout"
    } else {
        "transport"
    };
    format!("HTTP {what}: {}", cut(&root_cause(e), 120))
}

/// The innermost error message, which names the actual failure
/// (`Connection refused`) where the outer ones only say "error sending
/// request".
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = e;
    while let Some(next) = inner.source() {
        inner = next;
    }
    inner.to_string()
}

fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

/// Opens the connections (before the clock starts, so connection setup is
/// not measured).
async fn connect(plan: &Plan) -> Result<Vec<Client>> {
    match plan.api {
        Api::Http => {
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(plan.concurrency)
                .tcp_nodelay(true)
                .build()
                .context("cannot build the HTTP client")?;
            let url: Arc<str> = format!("http://{}/v1/request", plan.target).into();
            Ok(vec![Client::Http { client, url }])
        }
        Api::Native | Api::Rls => {
            let uri = format!("http://{}", plan.target);
            let endpoint = Endpoint::from_shared(uri.clone())
                .with_context(|| format!("--target {}: not host:port", plan.target))?
                .tcp_nodelay(true)
                .connect_timeout(plan.timeout);
            let mut clients = Vec::with_capacity(plan.connections);
            for _ in 0..plan.connections {
                // One `connect` per channel: each is its own HTTP/2
                // connection.
                let channel = endpoint
                    .connect()
                    .await
                    .map_err(|e| anyhow::anyhow!("{}", root_cause(&e)))
                    .with_context(|| format!("cannot connect to {uri}"))?;
                clients.push(match plan.api {
                    Api::Rls => Client::Rls(RateLimitServiceClient::new(channel)),
                    _ => Client::Native(TollgateClient::new(channel)),
                });
            }
            Ok(clients)
        }
    }
}

/// What one task measured.
struct Tally {
    latency: Histogram<u64>,
    /// Open loop: how late requests were sent after their intended time
    /// (the client's own scheduling delay, part of `latency`).
    lag: Histogram<u64>,
    requests: u64,
    granted: u64,
    rejected: u64,
    errors: BTreeMap<String, u64>,
    /// Open loop: tickets of the measured window never sent because the
    /// run's deadline passed first.
    unsent: u64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Latencies recorded from 1 ns up to an hour.
const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

impl Tally {
    fn new() -> Result<Tally> {
        Ok(Tally {
            latency: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)
                .context("cannot create a latency histogram")?,
            lag: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)
                .context("cannot create a latency histogram")?,
            requests: 0,
            granted: 0,
            rejected: 0,
            errors: BTreeMap::new(),
            unsent: 0,
        })
    }

    fn record(&mut self, outcome: Outcome, latency: Duration) {
        self.requests += 1;
        match outcome {
            Outcome::Granted => self.granted += 1,
            Outcome::Rejected => self.rejected += 1,
            Outcome::Error(kind) => {
                *self.errors.entry(kind).or_default() += 1;
                // An error's latency (often an instant refusal) would
                // flatter the percentiles; they describe answers.
                return;
            }
        }
        self.latency.saturating_record(nanos(latency));
    }

    fn merge(&mut self, other: Tally) -> Result<()> {
        self.latency
            .add(&other.latency)
            .and_then(|()| self.lag.add(&other.lag))
            .map_err(|e| anyhow::anyhow!("cannot merge latency histograms: {e:?}"))?;
        self.requests += other.requests;
        self.granted += other.granted;
        self.rejected += other.rejected;
        self.unsent += other.unsent;
        for (kind, n) in other.errors {
            *self.errors.entry(kind).or_default() += n;
        }
        Ok(())
    }
}

/// The clock of a run, shared by every task.
struct Clock {
    /// Load starts (warm-up begins).
    start: Instant,
    /// Measuring starts: requests sent (or, open loop, intended) before it
    /// are not counted.
    measure_from: Instant,
    /// No request is sent (or intended) from here on.
    end: Instant,
    /// Open loop: tickets still queued at this point are given up on, so
    /// an overloaded server cannot make a run last forever.
    give_up: Instant,
    /// Answers so far, warm-up included (for the progress bar).
    answered: AtomicU64,
}

/// Closed loop: send, wait, repeat until the end.
async fn closed_task(
    mut client: Client,
    plan: Arc<Plan>,
    clock: Arc<Clock>,
    mut rng: SmallRng,
) -> Result<Tally> {
    let mut tally = Tally::new()?;
    loop {
        let sent = Instant::now();
        if sent >= clock.end {
            return Ok(tally);
        }
        let key = plan.keys.draw(&mut rng);
        let outcome = call(&mut client, &plan, key).await;
        let done = Instant::now();
        clock.answered.fetch_add(1, Ordering::Relaxed);
        if sent >= clock.measure_from {
            tally.record(outcome, done - sent);
        }
    }
}

/// Tickets of the open loop: the pacer adds a permit per due request; a
/// task takes one, then the next ticket number, whose intended send time
/// is `start + n / rate`.
struct Tickets {
    due: Semaphore,
    next: AtomicU64,
    /// Tickets in the whole run, warm-up included.
    total: u64,
    rate: f64,
}

impl Tickets {
    fn intended(&self, clock: &Clock, n: u64) -> Instant {
        clock.start + Duration::from_secs_f64(n as f64 / self.rate)
    }
}

/// Open loop: take the next due ticket, send, measure from its intended
/// time.
async fn open_task(
    mut client: Client,
    plan: Arc<Plan>,
    clock: Arc<Clock>,
    tickets: Arc<Tickets>,
    mut rng: SmallRng,
) -> Result<Tally> {
    let mut tally = Tally::new()?;
    loop {
        match tickets.due.acquire().await {
            Ok(permit) => permit.forget(),
            Err(_) => return Ok(tally),
        }
        let n = tickets.next.fetch_add(1, Ordering::Relaxed);
        if n >= tickets.total {
            // One of the closing permits: every ticket is taken.
            return Ok(tally);
        }
        let intended = tickets.intended(&clock, n);
        let counted = intended >= clock.measure_from;
        if Instant::now() >= clock.give_up {
            if counted {
                tally.unsent += 1;
            }
            continue;
        }
        let key = plan.keys.draw(&mut rng);
        let sent = Instant::now();
        let outcome = call(&mut client, &plan, key).await;
        let done = Instant::now();
        clock.answered.fetch_add(1, Ordering::Relaxed);
        if counted {
            tally
                .lag
                .saturating_record(nanos(sent.saturating_duration_since(intended)));
            tally.record(outcome, done.saturating_duration_since(intended));
        }
    }
}

/// Releases the open loop's tickets on time, from a thread of its own: the
/// async runtime's timer has millisecond resolution, far too coarse to pace
/// requests a few microseconds apart. A sleeping thread costs nothing; its
/// wake-up lateness (about 80 µs at the median on the 2-vCPU machine of
/// docs/benchmarks.md, mostly the kernel's timer slack) is counted in
/// every latency, as it should be, since latency is measured from the
/// intended time, and shows in `send_lag_us`.
fn pace(tickets: &Tickets, clock: &Clock, tasks: usize, stop: &AtomicBool) {
    let mut issued = 0u64;
    while issued < tickets.total && !stop.load(Ordering::Relaxed) {
        let elapsed = clock.start.elapsed().as_secs_f64();
        // Ticket n is due at n / rate, so floor(elapsed × rate) + 1 are.
        let due = ((elapsed * tickets.rate) as u64)
            .saturating_add(1)
            .min(tickets.total);
        if due > issued {
            // In bounded steps: a semaphore holds at most usize::MAX >> 3
            // permits.
            let step = (due - issued).min(1 << 20);
            tickets.due.add_permits(step as usize);
            issued += step;
            if issued < due {
                continue;
            }
        }
        if issued < tickets.total {
            let next = tickets.intended(clock, issued);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    }
    // One closing permit per task: each takes one, finds the tickets used
    // up and ends.
    tickets.due.add_permits(tasks);
}

async fn call(client: &mut Client, plan: &Plan, key: u64) -> Outcome {
    match tokio::time::timeout(plan.timeout, client.call(&plan.template, key)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::Error(format!("timeout ({:?})", plan.timeout)),
    }
}

async fn drive(args: &BenchArgs, plan: Plan) -> Result<Report> {
    let clients = connect(&plan).await?;
    let plan = Arc::new(plan);
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let end = measure_from + plan.duration;
    let clock = Arc::new(Clock {
        start,
        measure_from,
        end,
        // Long enough for a real backlog to drain and be measured, short
        // enough that a stuck server does not hold the run hostage.
        give_up: end + plan.timeout,
        answered: AtomicU64::new(0),
    });
    let progress = progress_bar(&clock);
    let cpu = tokio::spawn(measure_cpu(Arc::clone(&clock), args.server_pid));

    let tickets = plan.rate.map(|rate| {
        let run = (plan.warmup + plan.duration).as_secs_f64();
        Arc::new(Tickets {
            due: Semaphore::new(0),
            next: AtomicU64::new(0),
            // Tickets whose intended time falls before the end.
            total: (run * rate).ceil() as u64,
            rate,
        })
    });
    let stop = Arc::new(AtomicBool::new(false));
    let pacer = tickets.as_ref().map(|t| {
        let (t, c, s) = (Arc::clone(t), Arc::clone(&clock), Arc::clone(&stop));
        let tasks = plan.concurrency;
        std::thread::spawn(move || pace(&t, &c, tasks, &s))
    });

    let mut tasks = Vec::with_capacity(plan.concurrency);
    for i in 0..plan.concurrency {
        let client = clients[i % clients.len()].clone();
        let rng = SmallRng::seed_from_u64(args.seed.wrapping_add(i as u64));
        let (p, c) = (Arc::clone(&plan), Arc::clone(&clock));
        tasks.push(match &tickets {
            Some(t) => tokio::spawn(open_task(client, p, c, Arc::clone(t), rng)),
            None => tokio::spawn(closed_task(client, p, c, rng)),
        });
    }

    let mut total = Tally::new()?;
    let mut failure = None;
    for task in tasks {
        match task.await {
            Ok(Ok(tally)) => total.merge(tally)?,
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(anyhow::anyhow!("a load task failed: {e}")),
        }
    }
    // The pacer ends by itself once every ticket is out; this only cuts it
    // short if the tasks ended early.
    stop.store(true, Ordering::Relaxed);
    if let Some(p) = pacer {
        if p.join().is_err() {
            failure.get_or_insert_with(|| anyhow::anyhow!("the pacer thread panicked"));
        }
    }
    progress.finish_and_clear();
    if let Some(e) = failure {
        return Err(e);
    }
    // The window's CPU was sampled at its end, which has passed.
    let cpu = cpu.await.unwrap_or_default();
    Ok(Report::new(args, &plan, &total, cpu))
}

/// CPU time used by the client and the server during the measured window.
#[derive(Default)]
struct CpuWindow {
    /// Wall-clock length of the window.
    wall: Duration,
    client: Option<Duration>,
    server: Option<Duration>,
}

/// Samples both processes' CPU time when measuring starts and ends.
async fn measure_cpu(clock: Arc<Clock>, server: Option<u32>) -> CpuWindow {
    let sample = || {
        (
            Instant::now(),
            process_cpu("self"),
            server.and_then(|pid| process_cpu(&pid.to_string())),
        )
    };
    tokio::time::sleep_until(clock.measure_from.into()).await;
    let (t0, client0, server0) = sample();
    tokio::time::sleep_until(clock.end.into()).await;
    let (t1, client1, server1) = sample();
    let delta = |a: Option<Duration>, b: Option<Duration>| Some(b?.saturating_sub(a?));
    CpuWindow {
        wall: t1 - t0,
        client: delta(client0, client1),
        server: delta(server0, server1),
    }
}

/// User plus system CPU time of a process (all its threads), from
/// `/proc/<pid>/stat`; `None` where there is no such file (not Linux, no
/// such process).
fn process_cpu(pid: &str) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; the
    // fields after its closing parenthesis are fixed: utime and stime are
    // the 12th and 13th of them.
    let rest = text.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // In clock ticks of USER_HZ, which Linux fixes at 100 for user space
    // on every architecture it runs on.
    Some(Duration::from_millis((utime + stime) * 10))
}

/// A bar over the run's length, with the current answer rate; indicatif
/// draws nothing when stderr is not a terminal.
fn progress_bar(clock: &Arc<Clock>) -> ProgressBar {
    let length = clock.end.duration_since(clock.start);
    let bar = ProgressBar::new(u64::try_from(length.as_millis()).unwrap_or(u64::MAX));
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} {prefix:9} [{bar:40}] {elapsed:>4} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    let (bar2, clock) = (bar.clone(), Arc::clone(clock));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let (mut last_at, mut last_n) = (Instant::now(), 0);
        while !bar2.is_finished() {
            tick.tick().await;
            let now = Instant::now();
            let n = clock.answered.load(Ordering::Relaxed);
            let rate = (n - last_n) as f64 / now.duration_since(last_at).as_secs_f64();
            (last_at, last_n) = (now, n);
            bar2.set_prefix(if now < clock.measure_from {
                "warm-up"
            } else {
                "measuring"
            });
            bar2.set_position(
                u64::try_from(now.duration_since(clock.start).as_millis()).unwrap_or(u64::MAX),
            );
            bar2.set_message(format!("{rate:.0} req/s"));
        }
    });
    bar
}

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
    fn new(used: Option<Duration>, wall: Duration, requests: u64) -> Option<CpuUse> {
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
    fn of(h: &Histogram<u64>) -> Latency {
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
    fn new(args: &BenchArgs, plan: &Plan, t: &Tally, cpu: CpuWindow) -> Report {
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
    fn table(&self) -> String {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn durations_use_the_config_syntax() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert!(parse_duration("10").is_err());
    }

    #[test]
    fn keys_stay_in_range_and_zipf_favours_the_first() {
        let mut rng = SmallRng::seed_from_u64(7);
        let uniform = Keys::Uniform(10);
        let zipf = Keys::Zipf(Zipf::new(10.0, 1.0).unwrap());
        let mut counts = [0u32; 10];
        for _ in 0..10_000 {
            assert!(uniform.draw(&mut rng) < 10);
            let k = zipf.draw(&mut rng);
            assert!(k < 10);
            counts[k as usize] += 1;
        }
        // Harmonic weights: key 0 takes about 34%, key 9 about 3.4%.
        assert!(counts[0] > 3 * counts[9], "{counts:?}");
        assert!(counts[0] > counts[1]);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn cpu_time_is_read_from_proc() {
        // Burn CPU until the figure leaves zero (10 ms resolution). Not a
        // fixed wall-clock time: on a loaded machine 30 ms of wall clock
        // can be less than one tick of CPU; the bound only stops a broken
        // reading from looping forever.
        let start = Instant::now();
        let mut x = 0u64;
        while process_cpu("self") == Some(Duration::ZERO)
            && start.elapsed() < Duration::from_secs(60)
        {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            }
        }
        assert!(x != 1);
        assert!(process_cpu("self").unwrap() > Duration::ZERO);
        assert!(process_cpu("no-such-process").is_none());
    }

    #[test]
    fn a_tally_counts_every_outcome_and_times_only_answers() {
        let mut a = Tally::new().unwrap();
        a.record(Outcome::Granted, Duration::from_micros(10));
        a.record(Outcome::Rejected, Duration::from_micros(30));
        a.record(Outcome::Error("x".into()), Duration::from_secs(1));
        let mut b = Tally::new().unwrap();
        b.record(Outcome::Error("x".into()), Duration::ZERO);
        a.merge(b).unwrap();
        assert_eq!((a.requests, a.granted, a.rejected), (4, 1, 1));
        assert_eq!(a.errors.get("x"), Some(&2));
        assert_eq!(a.latency.len(), 2);
        assert!(a.latency.max() < 31_000);
    }
}
