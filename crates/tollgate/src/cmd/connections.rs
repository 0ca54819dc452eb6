//! The connection limits of `tollgate serve` and `tollgate config-api`:
//! the same flags for both, each with the environment variables of its
//! command (`TOLLGATE_…` and `TOLLGATE_CONFIG_API_…`), so that one
//! environment can configure both processes apart.

use std::time::Duration;

use clap::Args;
use tollgate_server::ConnectionLimits;

/// Connection limits of `tollgate serve`'s HTTP and gRPC ports.
#[derive(Args, Debug, Clone)]
pub struct ServeConnectionArgs {
    /// Connections open at once on each port (HTTP and gRPC apart); one
    /// more is accepted and closed at once.
    #[arg(long, env = "TOLLGATE_MAX_CONNECTIONS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,
    /// How long a TLS handshake may take (milliseconds).
    #[arg(long, env = "TOLLGATE_TLS_HANDSHAKE_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub tls_handshake_timeout_ms: u64,
    /// How long a client has to send a complete HTTP request head, or on
    /// the gRPC port the HTTP/2 preface (milliseconds).
    #[arg(long, env = "TOLLGATE_HTTP_HEADER_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_timeout_ms: u64,
    /// How long an HTTP connection may stay open with no request in
    /// flight (milliseconds). gRPC connections are kept by HTTP/2 pings.
    #[arg(long, env = "TOLLGATE_HTTP_IDLE_TIMEOUT_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_ms: u64,
    /// How long the whole body of an HTTP request may take to arrive
    /// (milliseconds); a slower one is answered 408.
    #[arg(long, env = "TOLLGATE_HTTP_BODY_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_body_timeout_ms: u64,
}

impl ServeConnectionArgs {
    /// The limits the flags give.
    pub fn limits(&self) -> ConnectionLimits {
        limits(
            self.max_connections,
            self.tls_handshake_timeout_ms,
            self.http_header_timeout_ms,
            self.http_idle_timeout_ms,
            self.http_body_timeout_ms,
        )
    }
}

/// Connection limits of `tollgate config-api`'s port.
#[derive(Args, Debug, Clone)]
pub struct ConfigApiConnectionArgs {
    /// Connections open at once; one more is accepted and closed at once.
    #[arg(long, env = "TOLLGATE_CONFIG_API_MAX_CONNECTIONS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,
    /// How long a TLS handshake may take (milliseconds).
    #[arg(long, env = "TOLLGATE_CONFIG_API_TLS_HANDSHAKE_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub tls_handshake_timeout_ms: u64,
    /// How long a client has to send a complete request head
    /// (milliseconds).
    #[arg(long, env = "TOLLGATE_CONFIG_API_HTTP_HEADER_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_timeout_ms: u64,
    /// How long a connection may stay open with no request in flight
    /// (milliseconds); a long poll in flight keeps it.
    #[arg(long, env = "TOLLGATE_CONFIG_API_HTTP_IDLE_TIMEOUT_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_ms: u64,
    /// How long the whole body of a request may take to arrive
    /// (milliseconds); a slower one is answered 408. Imports are larger
    /// than the limiting server's requests, hence a longer default.
    #[arg(long, env = "TOLLGATE_CONFIG_API_HTTP_BODY_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_body_timeout_ms: u64,
}

impl ConfigApiConnectionArgs {
    /// The limits the flags give.
    pub fn limits(&self) -> ConnectionLimits {
        limits(
            self.max_connections,
            self.tls_handshake_timeout_ms,
            self.http_header_timeout_ms,
            self.http_idle_timeout_ms,
            self.http_body_timeout_ms,
        )
    }
}

fn limits(max: u64, handshake: u64, header: u64, idle: u64, body: u64) -> ConnectionLimits {
    ConnectionLimits {
        max_connections: usize::try_from(max).unwrap_or(usize::MAX),
        handshake_timeout: Duration::from_millis(handshake),
        header_timeout: Duration::from_millis(header),
        idle_timeout: Duration::from_millis(idle),
        body_timeout: Duration::from_millis(body),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        c: ServeConnectionArgs,
    }

    #[test]
    fn the_serve_defaults_are_the_servers_defaults() {
        let args = Serve::try_parse_from(["serve"]).unwrap();
        assert_eq!(args.c.limits(), ConnectionLimits::default());
    }

    #[test]
    fn zero_is_refused_with_the_flag_named() {
        let Err(e) = Serve::try_parse_from(["serve", "--http-idle-timeout-ms", "0"]) else {
            panic!("a zero timeout was accepted");
        };
        let text = e.to_string();
        assert!(text.contains("--http-idle-timeout-ms"), "{text}");
        assert!(Serve::try_parse_from(["serve", "--max-connections", "0"]).is_err());
    }
}
