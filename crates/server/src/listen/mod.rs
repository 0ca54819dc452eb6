//! What a listening port admits, and for how long: a cap on the
//! connections open at once, and deadlines for a TLS handshake, a request
//! head, an idle connection and a request body. Without them a stranger
//! holds a server's sockets and memory for as long as it likes by sending
//! slowly or not at all ("slowloris").
//!
//! - [`http`]: serves an axum router on an HTTP port (the limiting
//!   server's, and the config API's), plain text or TLS, HTTP/1.1 or
//!   HTTP/2, connection by connection with hyper, so that every deadline
//!   below applies.
//! - [`grpc`]: the gRPC port's connections for tonic: the same cap and
//!   handshake deadline, and the HTTP/2 preface within the header timeout;
//!   an established connection is tonic's, kept alive by HTTP/2 pings.
//!
//! **Why connections beyond the cap are accepted and closed at once**
//! rather than left in the kernel's accept backlog: a client of a limiter
//! sits on its own request path, and a connection that fails at once lets
//! it fail over or fail open now; one left in the backlog costs it its
//! whole connect timeout, and is invisible to the server, which could not
//! count or report it. Each refusal is counted
//! (`tollgate_connections_refused_total`) and logged at most once every
//! ten seconds, so that a flood cannot flood the log too.
//!
//! A failed TLS handshake is counted and logged, with its reason in words
//! and at most once every ten seconds per reason ([`handshake`]).
//!
//! This module knows nothing of the limiting service: it depends only on
//! hyper, rustls, tollgate-tls (the words for refused certificates) and
//! the metric names, so the config API (served by the same binary) uses
//! it as it is.

/// Implements `AsyncWrite` for a wrapper of a connection by writing
/// straight through to its `io` field (the wrappers watch reads only).
macro_rules! write_through {
    ($wrapper:ty) => {
        impl tokio::io::AsyncWrite for $wrapper {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.io.is_write_vectored()
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
            }
        }
    };
}
pub(crate) use write_through;

pub mod grpc;
mod handshake;
pub mod http;

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::metrics as m;

/// The limits of one listening port (each port of a server has its own
/// count of connections).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is accepted and closed at once.
    pub max_connections: usize,
    /// How long a TLS handshake may take, from the moment the connection
    /// is accepted.
    pub handshake_timeout: Duration,
    /// How long a client has to send a complete request head: on a new
    /// connection from the end of its handshake (or its accept), on a
    /// kept-alive one from the first byte of the next request. On the
    /// gRPC port, how long a new connection has to send the HTTP/2
    /// preface.
    pub header_timeout: Duration,
    /// How long an HTTP connection may stay open with no request in
    /// flight before it is closed. Not applied to gRPC, whose sessions
    /// are idle by design between operations; HTTP/2 pings find a gRPC
    /// client that vanished.
    pub idle_timeout: Duration,
    /// How long the whole body of an HTTP request may take to arrive,
    /// from the end of its head; a slower body is answered 408 and its
    /// connection closed.
    pub body_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: 10_000,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(10),
        }
    }
}

/// Counts a port's open connections and refuses those beyond its cap.
#[derive(Clone)]
struct Gate(Arc<GateInner>);

struct GateInner {
    /// The `listener` label of the metrics: `http`, `grpc`, `config_api`.
    listener: &'static str,
    max: usize,
    open: AtomicUsize,
    refusals: Throttle,
}

impl Gate {
    fn new(listener: &'static str, max: usize) -> Gate {
        // Present (at 0) before the first connection, so a scrape shows it.
        ::metrics::gauge!(m::CONNECTIONS, "listener" => listener).set(0.0);
        ::metrics::counter!(m::CONNECTIONS_REFUSED, "listener" => listener).absolute(0);
        Gate(Arc::new(GateInner {
            listener,
            max,
            open: AtomicUsize::new(0),
            refusals: Throttle::new(Duration::from_secs(10)),
        }))
    }

    /// A permit for one more connection, or `None` (counted and logged)
    /// when the port is full.
    fn admit(&self) -> Option<Permit> {
        let g = &self.0;
        let admitted = g
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < g.max).then_some(n + 1)
            })
            .is_ok();
        if admitted {
            ::metrics::gauge!(m::CONNECTIONS, "listener" => g.listener).increment(1.0);
            return Some(Permit(self.clone()));
        }
        ::metrics::counter!(m::CONNECTIONS_REFUSED, "listener" => g.listener).increment(1);
        if let Some(refused) = g.refusals.note(Instant::now()) {
            tracing::warn!(
                listener = g.listener,
                max_connections = g.max,
                refused,
                "connection limit reached: closing new connections at once (logged at most every 10 s)"
            );
        }
        None
    }

    fn listener(&self) -> &'static str {
        self.0.listener
    }
}

/// One admitted connection; dropping it frees its place.
struct Permit(Gate);

impl Drop for Permit {
    fn drop(&mut self) {
        let g = &(self.0).0;
        g.open.fetch_sub(1, Ordering::AcqRel);
        ::metrics::gauge!(m::CONNECTIONS, "listener" => g.listener).decrement(1.0);
    }
}

/// Lets one of many like events through to the log per period, with the
/// number of events since the last one logged. It only decides: the
/// caller logs, after the lock is released, so that events a stranger
/// causes at its own rate never queue behind a log write.
struct Throttle {
    every: Duration,
    // A std mutex: nothing awaits while it is held, and it is held for a
    // comparison and two stores.
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// Counts an event at `now`: the number of events since the last one
    /// logged (this one included) when a period has passed since then, so
    /// it is to be logged, else `None`. The time is an argument so tests
    /// drive it.
    fn note(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.1 += 1;
        let due = state
            .0
            .is_none_or(|last| now.saturating_duration_since(last) >= self.every);
        if !due {
            return None;
        }
        let count = state.1;
        *state = (Some(now), 0);
        Some(count)
    }
}

/// An accepted socket, plain or TLS.
enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Counts a connection closed (or a request cut off) for being too slow;
/// `phase` is `handshake`, `header`, `idle` or `body`.
fn timed_out(listener: &'static str, phase: &'static str) {
    ::metrics::counter!(m::CONNECTIONS_TIMED_OUT, "listener" => listener, "phase" => phase)
        .increment(1);
}

/// Accepting failed (out of file descriptors, say): log (throttled, as it
/// repeats for as long as the cause lasts) and pause, rather than spin.
async fn accept_failed(throttle: &Throttle, listener: &'static str, e: &std::io::Error) {
    if let Some(failures) = throttle.note(Instant::now()) {
        tracing::warn!(listener, error = %e, failures, "accepting a connection failed (logged at most every 10 s)");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_admits_up_to_its_cap_and_again_when_one_closes() {
        let gate = Gate::new("test", 2);
        let a = gate.admit();
        let b = gate.admit();
        assert!(a.is_some() && b.is_some());
        assert!(gate.admit().is_none());
        drop(a);
        assert!(gate.admit().is_some());
    }

    #[test]
    fn the_throttle_logs_the_first_event_then_counts_the_rest() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let throttle = Throttle::new(Duration::from_secs(10));
        let logged: Vec<_> = (0..5).map(|i| throttle.note(at(i * 1000))).collect();
        assert_eq!(logged, vec![Some(1), None, None, None, None]);
        // A period after the last line: the four counted since, and this.
        assert_eq!(throttle.note(at(10_000)), Some(5));
        assert_eq!(throttle.note(at(19_999)), None);
        assert_eq!(throttle.note(at(20_000)), Some(2));
        let throttle = Throttle::new(Duration::ZERO);
        let logged: Vec<_> = (0..3).map(|_| throttle.note(start)).collect();
        assert_eq!(logged, vec![Some(1), Some(1), Some(1)]);
    }
}
