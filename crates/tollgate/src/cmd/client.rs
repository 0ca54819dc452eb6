//! `tollgate request | hold | transfer | seize | status`: the client
//! library for operators and scripts.
//!
//! Exit codes scripts can use: 0 granted (also when degraded or
//! overridden, which the output says), 1 rejected, 2 error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Value};
use tollgate_client::{
    Client, ClientConfig, Error, FailureKind, Grant, Hold, Outage, Rejected, Tls, Via,
};

/// Exit code of a granted call.
const GRANTED: u8 = 0;
/// Exit code of a rejected call.
const REJECTED: u8 = 1;
/// Exit code of an error (bad arguments, refused, unreachable with
/// fail-open off).
const ERROR: u8 = 2;

/// How to reach the servers, shared by the client subcommands.
#[derive(Args, Debug, Clone)]
pub struct Connect {
    /// Servers' gRPC addresses, comma-separated, tried in order
    /// (`host:port`, `http://...` or `https://...`).
    #[arg(
        long,
        env = "TOLLGATE_SERVER",
        value_delimiter = ',',
        default_value = "127.0.0.1:8081"
    )]
    pub server: Vec<String>,
    /// PEM CA certificate that signs the servers' certificates: connect
    /// with TLS (without it, `https://` addresses use the web roots).
    #[arg(long, env = "TOLLGATE_CLIENT_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// PEM certificate presented to servers that require mutual TLS.
    #[arg(long, env = "TOLLGATE_CLIENT_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert (read from the file; never logged).
    #[arg(long, env = "TOLLGATE_CLIENT_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The name the servers' certificates carry (default: the address's
    /// host).
    #[arg(long)]
    pub tls_domain: Option<String>,
    /// Longest wait for one answer, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
    /// Fail instead of granting the minimum when no server answers.
    #[arg(long)]
    pub no_fail_open: bool,
    /// Turn rejections into grants, marked overridden (also
    /// TOLLGATE_KILL_SWITCH=1).
    #[arg(long)]
    pub kill_switch: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

impl Connect {
    fn client(&self) -> Result<Client> {
        let mut config = ClientConfig::new(self.server.iter().cloned());
        let read =
            |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        if self.tls_ca.is_some() || self.tls_cert.is_some() || self.tls_domain.is_some() {
            config.tls = Some(Tls {
                ca: self.tls_ca.as_ref().map(read).transpose()?,
                domain: self.tls_domain.clone(),
                identity: match (&self.tls_cert, &self.tls_key) {
                    (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
                    _ => None,
                },
            });
        }
        config.request_timeout = Duration::from_millis(self.timeout_ms.max(1));
        config.connect_timeout = config.request_timeout;
        config.fail_open = !self.no_fail_open;
        config.kill_switch |= self.kill_switch;
        Client::new(config).map_err(|e| anyhow::anyhow!("{e}"))
    }
}

fn duration(text: &str) -> Result<Duration, String> {
    tollgate_config::units::parse_duration(text).map(|n| Duration::from_nanos(n.as_u64()))
}

/// `tollgate request`.
#[derive(Args, Debug)]
pub struct RequestArgs {
    /// The resource's namespace.
    pub namespace: String,
    /// The rate-limited resource.
    pub resource: String,
    /// On behalf of this domain.
    pub domain: String,
    /// Hits wanted.
    #[arg(long, default_value_t = 1)]
    pub hits: u64,
    /// Fewest hits worth having (default: all of them).
    #[arg(long)]
    pub min_hits: Option<u64>,
    /// Keep retrying with backoff for this long (`500ms`, `5s`).
    #[arg(long, value_parser = duration, default_value = "0s")]
    pub max_wait: Duration,
    /// The hits were already used: charge them even past the limit, into
    /// the resource's `max_debt`, never rejected.
    #[arg(long, conflicts_with = "refund")]
    pub report: bool,
    /// Give back hits taken and not used, never past a fresh state.
    #[arg(long)]
    pub refund: bool,
    /// A limit of the request's own, `COUNT/UNIT` (`500/hour`; `second`
    /// to `year`), in place of the resource's algorithm: only for a
    /// resource with `allow_override: true`, up to its `override_max`.
    #[arg(long, value_name = "COUNT/UNIT", value_parser = brought_limit)]
    pub limit: Option<(u64, String)>,
    #[command(flatten)]
    pub connect: Connect,
}

/// `--limit COUNT/UNIT`: the count, and the unit as written (the server
/// names the units it takes when it refuses one).
fn brought_limit(text: &str) -> Result<(u64, String), String> {
    let (count, unit) = text
        .split_once('/')
        .ok_or_else(|| format!("`{text}` is not COUNT/UNIT (e.g. `500/hour`)"))?;
    let count = count
        .trim()
        .parse::<u64>()
        .map_err(|e| format!("`{count}` in `{text}` is not a count: {e}"))?;
    Ok((count, unit.trim().to_owned()))
}

/// `tollgate hold`.
#[derive(Args, Debug)]
pub struct HoldArgs {
    /// The resource's namespace.
    pub namespace: String,
    /// The copy-limited resource.
    pub resource: String,
    /// On behalf of this domain.
    pub domain: String,
    /// Copies wanted.
    #[arg(long, default_value_t = 1)]
    pub copies: u64,
    /// Fewest copies worth having (default: all of them).
    #[arg(long)]
    pub min_copies: Option<u64>,
    /// Keep retrying with backoff for this long.
    #[arg(long, value_parser = duration, default_value = "0s")]
    pub max_wait: Duration,
    /// Hold this long, then release (Ctrl-C or SIGTERM release at once).
    #[arg(long = "for", value_parser = duration, default_value = "0s")]
    pub hold_for: Duration,
    #[command(flatten)]
    pub connect: Connect,
}

/// `tollgate transfer`.
#[derive(Args, Debug)]
pub struct TransferArgs {
    /// The resource's namespace.
    pub namespace: String,
    /// The copy-limited resource.
    pub resource: String,
    /// On behalf of this domain.
    pub domain: String,
    /// Copies to reserve and stage.
    #[arg(long, default_value_t = 1)]
    pub copies: u64,
    /// Keep retrying the reserve with backoff for this long.
    #[arg(long, value_parser = duration, default_value = "0s")]
    pub max_wait: Duration,
    /// Time the other side has to seize them before they are released.
    #[arg(long, value_parser = duration, default_value = "30s")]
    pub ttl: Duration,
    #[command(flatten)]
    pub connect: Connect,
}

/// `tollgate seize`.
#[derive(Args, Debug)]
pub struct SeizeArgs {
    /// The transfer id `tollgate transfer` printed.
    pub transfer_id: String,
    /// Hold the seized copies this long, then release.
    #[arg(long = "for", value_parser = duration, default_value = "0s")]
    pub hold_for: Duration,
    #[command(flatten)]
    pub connect: Connect,
}

/// `tollgate status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub connect: Connect,
}

/// Runs `f` on a runtime; maps its outcome to an exit code, printing
/// errors.
fn run_with(json_out: bool, f: impl std::future::Future<Output = Result<u8>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start a runtime: {e}");
            return ExitCode::from(ERROR);
        }
    };
    match runtime.block_on(f) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            if json_out {
                println!(
                    "{}",
                    json!({ "outcome": "error", "error": format!("{e:#}") })
                );
            }
            eprintln!("error: {e:#}");
            ExitCode::from(ERROR)
        }
    }
}

/// What a failed call prints and exits with.
fn failed(e: Error, json_out: bool) -> Result<u8> {
    match e {
        Error::Rejected(r) => {
            let last = match &r.last {
                Rejected::Rate(v) => serde_json::to_value(v)?,
                Rejected::Hold(v) => serde_json::to_value(v)?,
            };
            if json_out {
                println!(
                    "{}",
                    json!({
                        "outcome": "rejected",
                        "attempts": r.attempts,
                        "waited_ms": r.waited.as_millis() as u64,
                        "response": last,
                    })
                );
            } else {
                println!(
                    "rejected after {} attempt(s) over {:?}: {}",
                    r.attempts,
                    r.waited,
                    describe(&last)
                );
            }
            Ok(REJECTED)
        }
        e => {
            // No server answered: the JSON error keeps each server and
            // its error apart, as a degraded grant's does.
            if let Some(outage) = e.outage() {
                if json_out {
                    let mut out = json!({ "outcome": "error", "error": e.to_string() });
                    add_outage(&mut out, Some(outage));
                    println!("{out}");
                }
                // A TLS failure already says what to pass.
                if outage.tls_failed() {
                    eprintln!("error: {e}");
                } else {
                    eprintln!("error: {e}; {}", advice(outage));
                }
                return Ok(ERROR);
            }
            Err(anyhow::anyhow!("{e}"))
        }
    }
}

/// A failure kind as the JSON `outage` names it.
fn kind(k: FailureKind) -> &'static str {
    match k {
        FailureKind::Unreachable => "unreachable",
        FailureKind::Tls => "tls",
        FailureKind::Server => "server_error",
        _ => "other",
    }
}

fn via(v: Via) -> &'static str {
    match v {
        Via::Server => "server",
        Via::Degraded => "degraded",
        Via::KillSwitch => "kill_switch",
    }
}

/// A response's limits in a few words.
fn describe(response: &Value) -> String {
    let mut parts = Vec::new();
    for key in [
        "limit",
        "remaining",
        "retry_after_ns",
        "limited_by",
        "limited_by_name",
        "domain_limit",
        "domain_holds",
        "global_limit",
        "global_holds",
    ] {
        if let Some(v) = response.get(key).filter(|v| !v.is_null()) {
            parts.push(format!("{key} {v}"));
        }
    }
    parts.join(", ")
}

/// `tollgate request`.
pub fn request(args: RequestArgs) -> ExitCode {
    let json_out = args.connect.json;
    run_with(json_out, async move {
        let client = args.connect.client()?;
        let mut builder = client
            .request(&args.namespace, &args.resource, &args.domain)
            .hits(args.hits)
            .max_wait(args.max_wait);
        if let Some(min) = args.min_hits {
            builder = builder.min_hits(min);
        }
        if args.report {
            builder = builder.report();
        }
        if args.refund {
            builder = builder.refund();
        }
        if let Some((count, unit)) = &args.limit {
            builder = builder.limit(*count, unit);
        }
        match builder.send().await {
            Ok(grant) => {
                print_grant(&grant, json_out)?;
                Ok(GRANTED)
            }
            Err(e) => failed(e, json_out),
        }
    })
}

fn print_grant(grant: &Grant, json_out: bool) -> Result<()> {
    let response = grant
        .response
        .as_ref()
        .map(serde_json::to_value)
        .transpose()?;
    warn_degraded(grant.outage.as_ref());
    if json_out {
        let mut out = json!({
            "outcome": "granted",
            "granted": grant.granted,
            "via": via(grant.via),
            "attempts": grant.attempts,
            "waited_ms": grant.waited.as_millis() as u64,
            "response": response,
        });
        add_outage(&mut out, grant.outage.as_ref());
        println!("{out}");
    } else {
        println!(
            "granted {} via {}{}",
            grant.granted,
            via(grant.via),
            why(response.as_ref(), grant.outage.as_ref())
        );
    }
    Ok(())
}

/// What follows `via ...` in a text line: why a degraded grant has no
/// server (`(no server answered: a: error; b: error)`), else `; ` and the
/// response's limits, or nothing when there is no response.
fn why(response: Option<&Value>, outage: Option<&Outage>) -> String {
    if let Some(outage) = outage {
        return format!(" (no server answered: {outage})");
    }
    match response.map(describe) {
        Some(detail) if !detail.is_empty() => format!("; {detail}"),
        _ => String::new(),
    }
}

/// On stderr, for a degraded grant: limiting was off for this call, why,
/// and what to do about it.
fn warn_degraded(outage: Option<&Outage>) {
    if let Some(outage) = outage {
        eprintln!(
            "warning: no tollgate server answered ({outage}), so the minimum was granted \
             without limiting (fail-open); {}, or pass --no-fail-open to fail instead",
            advice(outage)
        );
    }
}

/// What to check when no server answered, by how they failed: a server
/// that answered with an error runs (its store may not), and a TLS
/// failure is a setting, not a missing server.
fn advice(outage: &Outage) -> &'static str {
    let kinds = || outage.tried.iter().map(|u| u.kind);
    if kinds().any(|k| k == FailureKind::Tls) {
        "check the TLS settings (--tls-ca, --tls-cert and --tls-key, --tls-domain) against the server's"
    } else if kinds().all(|k| k == FailureKind::Unreachable) {
        "check that a server runs at --server (TOLLGATE_SERVER)"
    } else if kinds().all(|k| k == FailureKind::Server) {
        "the servers run but could not decide: see their logs and /status (their store)"
    } else {
        "check that the servers at --server (TOLLGATE_SERVER) run and reach their store"
    }
}

/// A degraded answer's `outage`: each server tried and its error.
fn add_outage(out: &mut Value, outage: Option<&Outage>) {
    if let (Some(outage), Some(map)) = (outage, out.as_object_mut()) {
        let tried: Vec<Value> = outage
            .tried
            .iter()
            .map(|u| json!({"server": u.server, "error": u.error, "kind": kind(u.kind)}))
            .collect();
        map.insert("outage".to_owned(), Value::Array(tried));
    }
}

fn print_hold(hold: &Hold, json_out: bool, what: &str) -> Result<()> {
    let response = hold.response().map(serde_json::to_value).transpose()?;
    warn_degraded(hold.outage());
    if json_out {
        let mut out = json!({
            "outcome": what,
            "copies": hold.copies(),
            "via": via(hold.via()),
            "namespace": hold.namespace(),
            "resource": hold.resource(),
            "domain": hold.domain(),
            "groups": hold.groups(),
            "attempts": hold.attempts(),
            "response": response,
        });
        add_outage(&mut out, hold.outage());
        println!("{out}");
    } else {
        println!(
            "{what} {} copies of {}/{} for {} via {}{}",
            hold.copies(),
            hold.namespace(),
            hold.resource(),
            hold.domain(),
            via(hold.via()),
            why(response.as_ref(), hold.outage())
        );
    }
    // A script waits for this line before acting on the hold.
    use std::io::Write;
    std::io::stdout().flush()?;
    Ok(())
}

/// Holds for `d`, or until Ctrl-C or SIGTERM; then releases.
async fn keep(hold: Hold, d: Duration, json_out: bool) -> Result<u8> {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop_signal() => {}
    }
    let copies = hold.copies();
    hold.release_all()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if json_out {
        println!("{}", json!({ "outcome": "released", "copies": copies }));
    } else {
        println!("released {copies} copies");
    }
    Ok(GRANTED)
}

async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// `tollgate hold`.
pub fn hold(args: HoldArgs) -> ExitCode {
    let json_out = args.connect.json;
    run_with(json_out, async move {
        let client = args.connect.client()?;
        let mut builder = client
            .hold(&args.namespace, &args.resource, &args.domain)
            .copies(args.copies)
            .max_wait(args.max_wait);
        if let Some(min) = args.min_copies {
            builder = builder.min_copies(min);
        }
        match builder.send().await {
            Ok(hold) => {
                print_hold(&hold, json_out, "held")?;
                keep(hold, args.hold_for, json_out).await
            }
            Err(e) => failed(e, json_out),
        }
    })
}

/// `tollgate transfer`: reserves, stages everything for another client,
/// prints the transfer id.
pub fn transfer(args: TransferArgs) -> ExitCode {
    let json_out = args.connect.json;
    run_with(json_out, async move {
        let client = args.connect.client()?;
        let hold = client
            .hold(&args.namespace, &args.resource, &args.domain)
            .copies(args.copies)
            .max_wait(args.max_wait)
            .send()
            .await;
        let mut hold = match hold {
            Ok(h) => h,
            Err(e) => return failed(e, json_out),
        };
        let copies = hold.copies();
        let id = match hold.transfer(copies, args.ttl).await {
            Ok(id) => id,
            // A degraded hold holds nothing to transfer: say why no server
            // granted it.
            Err(e @ Error::NotOnServer) => match hold.outage() {
                Some(outage) => anyhow::bail!(
                    "{e}: no tollgate server answered ({outage}); {}",
                    advice(outage)
                ),
                None => anyhow::bail!("{e}"),
            },
            Err(e) => anyhow::bail!("{e}"),
        };
        if json_out {
            println!(
                "{}",
                json!({ "outcome": "transferred", "transfer_id": id, "copies": copies })
            );
        } else {
            println!("{id}");
        }
        Ok(GRANTED)
    })
}

/// `tollgate seize`.
pub fn seize(args: SeizeArgs) -> ExitCode {
    let json_out = args.connect.json;
    run_with(json_out, async move {
        let client = args.connect.client()?;
        let hold = client
            .seize(&args.transfer_id)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        print_hold(&hold, json_out, "seized")?;
        keep(hold, args.hold_for, json_out).await
    })
}

/// `tollgate status`.
pub fn status(args: StatusArgs) -> ExitCode {
    let json_out = args.connect.json;
    run_with(json_out, async move {
        let client = args.connect.client()?;
        let (server, s) = client.status().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        if json_out {
            let mut v = serde_json::to_value(&s)?;
            v["server"] = json!(server);
            println!("{v}");
        } else {
            println!("server     {server}");
            println!("version    {}", s.version);
            println!("store      {}", s.store);
            println!("ready      {}", s.ready);
            println!("uptime     {:?}", Duration::from_millis(s.uptime_ms));
            println!(
                "config     revision {} from {}",
                s.config_revision,
                if s.config_source.is_empty() {
                    "the built-in default"
                } else {
                    &s.config_source
                }
            );
            if let Some(r) = s.config_api_revision {
                println!("config API revision {r}");
            }
            if let Some(e) = &s.config_last_error {
                println!("last error {e}");
            }
            for w in &s.config_warnings {
                println!("warning    {w}");
            }
            println!(
                "sessions   {} open, {} opened",
                s.sessions_open, s.sessions_opened
            );
        }
        Ok(if s.ready { GRANTED } else { REJECTED })
    })
}
