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

fn tokens(args: &ConfigApiArgs) -> Result<Tokens> {
    let text = match &args.tokens_file {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("cannot read the tokens file {}", p.display()))?,
        None => std::env::var("TOLLGATE_CONFIG_API_TOKENS").unwrap_or_default(),
    };
    let tokens = Tokens::parse(&text).map_err(|e| anyhow::anyhow!("bad tokens: {e}"))?;
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
    let db = Db::connect(&url)
        .await
        .with_context(|| format!("cannot open the database {shown}"))?;
    let api = Api::new(db, tokens, args.rate_limit, args.burst)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let _watch = api.watch_database(Duration::from_secs(1));
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
