//! `tollgate counters get | reset`: a limiting server's live counters, over
//! its HTTP admin endpoint `/v1/counters` (docs/http-api.md), with a
//! bearer token of the server's `--admin-tokens-file`.
//!
//! Exit codes: 0 answered, 2 error (bad arguments, the server refused, or
//! could not be reached).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::Value;

/// Exit code of an error.
const ERROR: u8 = 2;

/// The most bytes of an answer read: an inspection lists a handful of
/// limits, far below it.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// `tollgate counters`.
#[derive(Args, Debug)]
pub struct CountersArgs {
    #[command(subcommand)]
    pub op: CountersOp,
}

/// What to do with the counters.
#[derive(Subcommand, Debug)]
pub enum CountersOp {
    /// Show one domain's counters of a resource: each limit's remaining
    /// and reset (a copy-limited resource's holds), charging nothing.
    /// Needs a `read` or `admin` token.
    Get(Target),
    /// Reset one domain's counters of a rate-limited resource: its next
    /// request sees fresh limits. Needs an `admin` token.
    Reset(Target),
}

/// Which counters, and how to reach the server.
#[derive(Args, Debug)]
pub struct Target {
    /// The resource's namespace.
    #[arg(long)]
    pub namespace: String,
    /// The resource.
    #[arg(long)]
    pub resource: String,
    /// The domain whose counters (empty: the resource's domain-less ones).
    #[arg(long, default_value = "")]
    pub domain: String,
    /// The server's HTTP address (`http://host:port` or `https://...`).
    #[arg(
        long,
        env = "TOLLGATE_HTTP_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,
    /// A file holding one bearer token: the TOKEN part of a line of the
    /// server's --admin-tokens-file.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Send the token over plain `http://` to a host that is not loopback
    /// (in clear: only on a network you trust).
    #[arg(long)]
    pub token_over_http: bool,
    /// PEM CA certificate that signs the server's certificate (`https://`).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Longest wait for the answer, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
    /// Print the server's JSON answer instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tollgate counters`.
pub fn run(args: CountersArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start a runtime: {e}");
            return ExitCode::from(ERROR);
        }
    };
    let (target, reset) = match &args.op {
        CountersOp::Get(t) => (t, false),
        CountersOp::Reset(t) => (t, true),
    };
    match runtime.block_on(call(target, reset)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(ERROR)
        }
    }
}

async fn call(t: &Target, reset: bool) -> Result<()> {
    let mut url = reqwest::Url::parse(&t.server)
        .with_context(|| format!("--server {}: not a URL (http://host:port)", t.server))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("--server {}: expected http:// or https://", t.server);
    }
    url.set_path("/v1/counters");
    url.query_pairs_mut()
        .clear()
        .append_pair("namespace", &t.namespace)
        .append_pair("resource", &t.resource)
        .append_pair("domain", &t.domain);
    let token = token(t)?;
    if token.is_some() && url.scheme() == "http" && !t.token_over_http && !loopback(&url) {
        bail!(
            "--server {}: plain http:// beyond loopback would send the token in clear: use \
             https:// (with --tls-ca for your own CA), or --token-over-http to send it anyway",
            t.server
        );
    }
    let timeout = Duration::from_millis(t.timeout_ms.max(1));
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        // A redirect could take the token to another host.
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy();
    if let Some(ca) = &t.tls_ca {
        let pem =
            std::fs::read(ca).with_context(|| format!("--tls-ca: cannot read {}", ca.display()))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("--tls-ca {}: not PEM certificates", ca.display()))?
        {
            builder = builder.add_root_certificate(cert);
        }
    }
    let client = builder.build().context("cannot build the HTTP client")?;
    let mut req = if reset {
        client.delete(url.clone())
    } else {
        client.get(url.clone())
    };
    if let Some(token) = &token {
        req = req.bearer_auth(token);
    }
    let mut resp = req
        .send()
        .await
        .with_context(|| format!("cannot reach {}", t.server))?;
    let status = resp.status();
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.context("reading the answer")? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            bail!("the answer is over {MAX_ANSWER_BYTES} bytes: is --server a tollgate server?");
        }
        body.extend_from_slice(&chunk);
    }
    let answer: Value = serde_json::from_slice(&body).with_context(|| {
        format!("the server answered {status} with a body that is not JSON: is --server a tollgate HTTP port?")
    })?;
    if !status.is_success() {
        let message = answer["error"]["message"].as_str().unwrap_or("no message");
        let reason = answer["error"]["reason"].as_str().unwrap_or("unknown");
        bail!("the server refused ({status}, {reason}): {message}");
    }
    if t.json {
        println!("{answer}");
    } else if reset {
        println!(
            "reset {} limit(s) of {}/{} for domain {:?}",
            answer["reset"].as_u64().unwrap_or(0),
            t.namespace,
            t.resource,
            t.domain
        );
    } else {
        print!("{}", describe(t, &answer));
    }
    Ok(())
}

/// An inspection as text: one line per limit, or the holds.
fn describe(t: &Target, a: &Value) -> String {
    let mut out = format!("{}/{} domain {:?}\n", t.namespace, t.resource, t.domain);
    if let Some(h) = a.get("holds").filter(|h| !h.is_null()) {
        let n = |k: &str| h[k].as_u64().unwrap_or(0);
        let global = match h["global_limit"].as_u64() {
            Some(g) => format!("{} of {g}", n("global_holds")),
            None => format!("{} (no global limit)", n("global_holds")),
        };
        out.push_str(&format!(
            "  holds: domain {} of {}, global {global}\n",
            n("domain_holds"),
            n("domain_limit")
        ));
        for g in h["groups"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  group {}: {} of {}\n",
                g["name"].as_str().unwrap_or(""),
                g["holds"].as_u64().unwrap_or(0),
                g["limit"].as_u64().unwrap_or(0)
            ));
        }
        return out;
    }
    if a["deny"].as_bool() == Some(true) {
        out.push_str("  deny: every request is rejected\n");
    }
    let limits = a["limits"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if limits.is_empty() && a["deny"].as_bool() != Some(true) {
        out.push_str("  no limits: every request is granted\n");
    }
    for l in limits {
        let n = |k: &str| l[k].as_u64().unwrap_or(0);
        out.push_str(&format!(
            "  {} ({}): {} of {} remaining, reset in {}{}\n",
            l["name"].as_str().unwrap_or(""),
            l["algorithm"].as_str().unwrap_or(""),
            n("remaining"),
            n("limit"),
            ms(n("reset_after_ns")),
            if l["shadow"].as_bool() == Some(true) {
                " (shadow)"
            } else {
                ""
            }
        ));
    }
    out
}

/// Nanoseconds as milliseconds, rounded up: a reset 1 ns away is not now.
fn ms(ns: u64) -> String {
    format!("{}ms", ns.div_ceil(1_000_000))
}

/// The bearer token of `--token-file`, if given.
fn token(t: &Target) -> Result<Option<String>> {
    let Some(path) = &t.token_file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--token-file: cannot read {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        bail!(
            "--token-file {}: expected one bearer token (the TOKEN part of a line of the server's \
             --admin-tokens-file), alone in the file",
            path.display()
        );
    }
    Ok(Some(token.to_owned()))
}

/// Whether `url`'s host is this machine (`localhost` or a loopback
/// address): a token sent there in clear stays on the host. Shared with
/// `config-api --servers`.
pub(crate) fn loopback(url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or_default();
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
