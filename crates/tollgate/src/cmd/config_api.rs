//! `tollgate config-api`: the configuration API over a database.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use tokio::signal::unix::{signal, SignalKind};
use tollgate_configapi::http::Api;
use tollgate_configapi::{Db, Tokens};

use super::serve::LogFormat;

/// Arguments of `tollgate config-api`.
#[derive(Args, Debug)]
pub struct ConfigApiArgs {
    /// The database: `sqlite://FILE` (created and migrated on first start)
    /// or `postgres://USER@HOST/DB`.
    #[arg(
        long,
        env = "TOLLGATE_DATABASE",
        default_value = "sqlite://tollgate.db"
    )]
    pub database: String,
    /// The database password, read from this file (never logged); or set
    /// TOLLGATE_DATABASE_PASSWORD.
    #[arg(long, env = "TOLLGATE_DATABASE_PASSWORD_FILE")]
    pub database_password_file: Option<PathBuf>,
    /// Where to listen; port 0 picks a free port.
    #[arg(
        long,
        env = "TOLLGATE_CONFIG_API_LISTEN",
        default_value = "127.0.0.1:8090"
    )]
    pub listen: SocketAddr,
    /// Bearer tokens, one `ROLE:NAME:TOKEN` per line (role `admin` or
    /// `read`); or put the lines in TOLLGATE_CONFIG_API_TOKENS.
    #[arg(long, env = "TOLLGATE_CONFIG_API_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// Requests per second each caller may make (after its burst).
    #[arg(long, default_value_t = 50)]
    pub rate_limit: u64,
    /// Requests each caller may make at once.
    #[arg(long, default_value_t = 100)]
    pub burst: u64,
    /// PEM certificate chain: serve TLS (with --tls-key).
    #[arg(long, env = "TOLLGATE_CONFIG_API_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "TOLLGATE_CONFIG_API_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA: require client certificates it signed (mutual TLS).
    #[arg(long, env = "TOLLGATE_CONFIG_API_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "TOLLGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Connection cap and handshake, header, idle and body timeouts.
    #[command(flatten)]
    pub connections: super::connections::ConfigApiConnectionArgs,
    /// Limiting servers whose live usage the console shows, read from
    /// their `/metrics`: their HTTP addresses (`HOST:PORT`, or
    /// `http(s)://HOST:PORT`), comma separated.
    #[arg(long, env = "TOLLGATE_CONFIG_API_SERVERS", value_delimiter = ',')]
    pub servers: Vec<String>,
    /// How often the servers' metrics are read (ms); one read of one
    /// server may take at most this long, and 2 s at most.
    #[arg(
        long,
        env = "TOLLGATE_CONFIG_API_SERVERS_REFRESH_MS",
        default_value_t = 5000
    )]
    pub servers_refresh_ms: u64,
    /// A file holding one bearer token (a `read` token of the servers'
    /// --admin-tokens-file) sent to the --servers for their top denied
    /// domains (GET /v1/denied); without it the console shows the
    /// metrics-based numbers only. Never logged.
    #[arg(long, env = "TOLLGATE_CONFIG_API_SERVERS_TOKEN_FILE")]
    pub servers_token_file: Option<PathBuf>,
    /// Send --servers-token-file's token to --servers on plain `http://`
    /// beyond loopback too (anyone on the path can read it); without this
    /// flag such a setup is refused at start.
    #[arg(long, env = "TOLLGATE_CONFIG_API_SERVERS_TOKEN_OVER_HTTP")]
    pub servers_token_over_http: bool,
    /// PEM CA bundle that signed the --servers' certificates (for
    /// `https://` servers using their own CA).
    #[arg(long, env = "TOLLGATE_CONFIG_API_SERVERS_CA")]
    pub servers_ca: Option<PathBuf>,
    /// PEM client certificate chain shown to --servers that require
    /// client certificates (mutual TLS; with --servers-key).
    #[arg(
        long,
        env = "TOLLGATE_CONFIG_API_SERVERS_CERT",
        requires = "servers_key"
    )]
    pub servers_cert: Option<PathBuf>,
    /// PEM private key of --servers-cert.
    #[arg(
        long,
        env = "TOLLGATE_CONFIG_API_SERVERS_KEY",
        requires = "servers_cert"
    )]
    pub servers_key: Option<PathBuf>,
}

/// How long a shutdown waits for open requests (long polls among them)
/// before it closes their connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs the config API until SIGTERM or Ctrl-C.
pub fn run(args: ConfigApiArgs) -> Result<()> {
    super::serve::init_logs(args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(args))
}

/// `url` with `password` put in as the user's password.
fn with_password(url: &str, password: &str) -> Result<String> {
    let Some(scheme_end) = url.find("://") else {
        bail!("the database URL has no scheme");
    };
    let rest = &url[scheme_end + 3..];
    let host_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..host_end].rfind('@') else {
        bail!("a database password needs a user in the URL (postgres://USER@HOST/DB)");
    };
    let user = rest[..at].split(':').next().unwrap_or_default();
    let encoded: String = password
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    Ok(format!(
        "{}://{user}:{encoded}@{}",
        &url[..scheme_end],
        &rest[at + 1..]
    ))
}

/// The metrics URL of each `--servers` address, with the address as
/// given (for the console).
fn metrics_urls(servers: &[String]) -> Result<Vec<(String, reqwest::Url)>> {
    use tollgate_configapi::usage::MAX_SERVERS;
    let servers: Vec<&str> = servers
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    if servers.len() > MAX_SERVERS {
        bail!(
            "--servers names {} servers; at most {MAX_SERVERS}",
            servers.len()
        );
    }
    servers
        .into_iter()
        .map(|s| {
            // Every message names the entry with its credentials hidden:
            // an entry with a password is refused, and the refusal must
            // not print it.
            let shown = tollgate_redis::conn::redact(s);
            let text = if s.contains("://") {
                s.to_owned()
            } else {
                format!("http://{s}")
            };
            let mut url = reqwest::Url::parse(&text).with_context(|| {
                format!("--servers {shown}: not an address (HOST:PORT or http://HOST:PORT)")
            })?;
            if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
                bail!("--servers {shown}: not an address (HOST:PORT or http://HOST:PORT)");
            }
            if !url.username().is_empty() || url.password().is_some() {
                bail!("--servers {shown}: an address with a user or password is not taken");
            }
            if url.path() == "/" || url.path().is_empty() {
                url.set_path("/metrics");
            }
            Ok((s.to_owned(), url))
        })
        .collect()
}

/// The longest one read of one server's metrics may take.
const METRICS_TIMEOUT: Duration = Duration::from_secs(2);

/// How many servers are read at once. Each read holds at most
/// [`tollgate_configapi::usage::MAX_METRICS_BYTES`] of metrics and as
/// much of `/v1/denied`, so a refresh holds at most 8 × 2 × 8 MiB = 128
/// MiB of answers, however many servers `--servers` names.
const READS_AT_ONCE: usize = 8;

/// The HTTP client that reads the servers: bounded in time, with the
/// servers' CA and a client certificate when given (checked with
/// `tollgate_tls`, so a bad file is named before the first refresh).
fn usage_client(args: &ConfigApiArgs, timeout: Duration) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout);
    if let Some(ca) = &args.servers_ca {
        let pem = std::fs::read(ca)
            .with_context(|| format!("--servers-ca: cannot read {}", ca.display()))?;
        tollgate_tls::trust_anchors(&pem, tollgate_tls::Anchors::Every)
            .with_context(|| format!("--servers-ca {}", ca.display()))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("--servers-ca {}", ca.display()))?
        {
            builder = builder.add_root_certificate(cert);
        }
    }
    if let (Some(cert), Some(key)) = (&args.servers_cert, &args.servers_key) {
        let chain = std::fs::read(cert)
            .with_context(|| format!("--servers-cert: cannot read {}", cert.display()))?;
        tollgate_tls::certificates(&chain)
            .with_context(|| format!("--servers-cert {}", cert.display()))?;
        let key_pem = std::fs::read(key)
            .with_context(|| format!("--servers-key: cannot read {}", key.display()))?;
        tollgate_tls::private_key(&key_pem)
            .with_context(|| format!("--servers-key {}", key.display()))?;
        let mut both = chain;
        both.push(b'\n');
        both.extend_from_slice(&key_pem);
        // reqwest's error could quote the key's text: not kept.
        let identity = reqwest::Identity::from_pem(&both).map_err(|_| {
            anyhow::anyhow!(
                "--servers-cert {} and --servers-key {}: not a certificate and its key",
                cert.display(),
                key.display()
            )
        })?;
        builder = builder.identity(identity);
    }
    // A redirect could take the bearer token to another host: none is
    // followed (a server's metrics and /v1/denied never redirect). The
    // servers are addressed directly, never through `HTTP_PROXY` and the
    // like: a proxy would get the token of a plain `http://` loopback
    // server in clear (`token_stays_private` allows those).
    builder
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .context("cannot build the HTTP client for --servers")
}

/// Refuses to send the servers' bearer token in clear beyond this host:
/// a `--servers` address on plain `http://` that is not loopback, with
/// `--servers-token-file` and without `--servers-token-over-http`.
fn token_stays_private(args: &ConfigApiArgs, servers: &[(String, reqwest::Url)]) -> Result<()> {
    if args.servers_token_file.is_none() || args.servers_token_over_http {
        return Ok(());
    }
    let loopback = super::counters::loopback;
    if let Some((shown, _)) = servers
        .iter()
        .find(|(_, url)| url.scheme() == "http" && !loopback(url))
    {
        bail!(
            "--servers {shown}: plain http:// beyond loopback would send --servers-token-file's \
             token in clear: give https://{shown_host} (with --servers-ca for your own CA), or \
             --servers-token-over-http to send it anyway",
            shown_host = shown.trim_start_matches("http://")
        );
    }
    Ok(())
}

/// The bearer token of `--servers-token-file`, if given.
fn servers_token(args: &ConfigApiArgs) -> Result<Option<String>> {
    let Some(path) = &args.servers_token_file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--servers-token-file: cannot read {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        bail!(
            "--servers-token-file {}: expected one bearer token (the TOKEN part of a servers' \
             admin token), alone in the file",
            path.display()
        );
    }
    Ok(Some(token.to_owned()))
}

/// Reads the servers' metrics every `every`, [`READS_AT_ONCE`] servers
/// at a time, each read bounded in time and bytes, and records them on
/// `board` at `clock`'s time (the one the API's audit trail reads).
async fn follow_usage(
    board: tollgate_configapi::usage::Board,
    servers: Vec<(String, reqwest::Url)>,
    every: Duration,
    http: reqwest::Client,
    token: Option<String>,
    clock: std::sync::Arc<dyn tollgate_core::clock::Clock>,
) {
    use tollgate_configapi::usage::Fetched;
    let token = std::sync::Arc::new(token);
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(READS_AT_ONCE));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut reads = tokio::task::JoinSet::new();
        for (i, (_, url)) in servers.iter().enumerate() {
            let (http, url, token) = (http.clone(), url.clone(), std::sync::Arc::clone(&token));
            let permits = std::sync::Arc::clone(&permits);
            reads.spawn(async move {
                // Closed never: the semaphore lives as long as the loop.
                let _permit = permits.acquire_owned().await.ok();
                let mut denied_url = url.clone();
                denied_url.set_path("/v1/denied");
                denied_url.set_query(None);
                let (text, denied) = tokio::join!(
                    read_bounded(&http, url, None),
                    read_denied(&http, denied_url, token.as_deref())
                );
                (i, (text, denied))
            });
        }
        let mut fetched: Vec<Option<Fetched>> = vec![None; servers.len()];
        while let Some(done) = reads.join_next().await {
            if let Ok((i, (text, denied))) = done {
                fetched[i] = Some(Fetched {
                    server: servers[i].0.clone(),
                    text,
                    denied,
                });
            }
        }
        let now_ms = clock.now().as_u64() / 1_000_000;
        board.record(now_ms, fetched.into_iter().flatten().collect());
    }
}

/// One server's domains refused most lately (`GET /v1/denied`, an admin
/// endpoint: it needs `--servers-token-file`), or why there are none.
async fn read_denied(
    http: &reqwest::Client,
    url: reqwest::Url,
    token: Option<&str>,
) -> Result<serde_json::Value, String> {
    let Some(token) = token else {
        return Err(
            "no --servers-token-file: the servers' GET /v1/denied needs a token".to_owned(),
        );
    };
    let text = read_bounded(http, url, Some(token)).await?;
    serde_json::from_str(&text).map_err(|_| "GET /v1/denied: not JSON".to_owned())
}

/// A text answer of at most
/// [`tollgate_configapi::usage::MAX_METRICS_BYTES`]; a longer one is
/// refused as "too large" (by its Content-Length when it gives one,
/// before reading).
async fn read_bounded(
    http: &reqwest::Client,
    url: reqwest::Url,
    token: Option<&str>,
) -> Result<String, String> {
    use tollgate_configapi::usage::{MAX_METRICS_BYTES, TOO_LARGE};
    let path = url.path().to_owned();
    let mut req = http.get(url);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let mut resp = req
        .send()
        .await
        .map_err(|e| format!("unreachable: {}", tollgate_tls::bounded(e)))?;
    if !resp.status().is_success() {
        let status = resp.status();
        let hint = match status.as_u16() {
            401 => ": the server refused the --servers-token-file token",
            404 if path == "/v1/denied" => {
                ": the server's admin endpoints are off (serve --admin-tokens-file) or it predates them"
            }
            _ => "",
        };
        return Err(format!("{path} answered {status}{hint}"));
    }
    let too_large = || {
        format!(
            "{TOO_LARGE}: its {path} is larger than {} MiB; not read",
            MAX_METRICS_BYTES / (1024 * 1024)
        )
    };
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_METRICS_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("the answer broke off: {e}"))?
    {
        if body.len() + chunk.len() > MAX_METRICS_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| format!("its {path} is not UTF-8"))
}

fn tokens(args: &ConfigApiArgs) -> Result<Tokens> {
    let text = match &args.tokens_file {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("cannot read the tokens file {}", p.display()))?,
        None => std::env::var("TOLLGATE_CONFIG_API_TOKENS").unwrap_or_default(),
    };
    let tokens = Tokens::parse(&text).context("bad tokens")?;
    if tokens.is_empty() {
        bail!(
            "no tokens: give --tokens-file or TOLLGATE_CONFIG_API_TOKENS (one ROLE:NAME:TOKEN per \
             line); the API refuses every request without one"
        );
    }
    Ok(tokens)
}

async fn serve(args: ConfigApiArgs) -> Result<()> {
    let tokens = tokens(&args)?;
    // Else sqlx answers a file name with "relative URL without a base".
    if !["sqlite:", "postgres://", "postgresql://"]
        .iter()
        .any(|scheme| args.database.starts_with(scheme))
    {
        anyhow::bail!(
            "--database {}: not a database URL: give sqlite:FILE (a SQLite file, created if \
             missing) or postgres://USER@HOST/DATABASE",
            tollgate_redis::conn::redact(&args.database)
        );
    }
    let password = match &args.database_password_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?
                .trim_end_matches(['\n', '\r'])
                .to_owned(),
        ),
        None => std::env::var("TOLLGATE_DATABASE_PASSWORD").ok(),
    };
    let url = match &password {
        Some(p) => with_password(&args.database, p)?,
        None => args.database.clone(),
    };
    let shown = tollgate_redis::conn::redact(&url);
    let clock: std::sync::Arc<dyn tollgate_core::clock::Clock> =
        std::sync::Arc::new(tollgate_core::SystemClock);
    let db = Db::connect(&url, std::sync::Arc::clone(&clock))
        .await
        .with_context(|| format!("cannot open the database {shown}"))?;
    let api = Api::new(db, tokens, args.rate_limit, args.burst).await?;
    let _watch = api.watch_database(Duration::from_secs(1));
    let servers = metrics_urls(&args.servers)?;
    token_stays_private(&args, &servers)?;
    if !(100..=3_600_000).contains(&args.servers_refresh_ms) {
        bail!(
            "--servers-refresh-ms {}: give 100 to 3600000 ms",
            args.servers_refresh_ms
        );
    }
    let board = tollgate_configapi::usage::Board::new(
        servers.iter().map(|(shown, _)| shown.clone()).collect(),
        args.servers_refresh_ms,
    );
    let api = api.with_usage(board.clone());
    let every = Duration::from_millis(args.servers_refresh_ms);
    let usage_http = usage_client(&args, every.min(METRICS_TIMEOUT))?;
    let servers_token = servers_token(&args)?;
    let _usage = (!servers.is_empty()).then(|| {
        tokio::spawn(follow_usage(
            board,
            servers,
            every,
            usage_http,
            servers_token,
            clock,
        ))
    });
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            tollgate_server::tls::Tls::load(&tollgate_server::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_ca.clone(),
            })
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        ),
        _ => None,
    };
    let tcp = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = tcp.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(%addr, scheme, database = %shown, "tollgate config-api listening");
    let metrics = match tollgate_server::metrics::install_for_listeners() {
        Ok(metrics) => vec![(
            "/metrics",
            axum::routing::get(move || std::future::ready(metrics.render())),
        )],
        Err(e) => {
            tracing::warn!(error = %e, "metrics disabled");
            Vec::new()
        }
    };
    let router = api.router(metrics);
    let stop = async {
        let mut term = match signal(SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => return,
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let port = tollgate_server::listen::http::HttpPort {
        listener: "config_api",
        limits: args.connections.limits(),
        tls: tls.as_ref().map(tollgate_server::tls::Tls::http_config),
        body_timeout_response: tollgate_configapi::error::body_timeout_response,
        shutdown_grace: SHUTDOWN_GRACE,
        direct: None,
    };
    tollgate_server::listen::http::serve(tcp, router, port, stop).await;
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_go_into_the_url_encoded() {
        let u = with_password("postgres://tollgate@127.0.0.1:5432/db", "p@ss:w/rd").unwrap();
        assert_eq!(u, "postgres://tollgate:p%40ss%3Aw%2Frd@127.0.0.1:5432/db");
        assert!(with_password("postgres://127.0.0.1/db", "x").is_err());
    }
}
