//! Serves an axum router on an HTTP port, one hyper connection per
//! accepted socket, with the port's [`ConnectionLimits`].
//!
//! `axum::serve` cannot do this: it gives hyper no timer, so hyper's own
//! header-read timeout is off, and it has no cap or idle timeout. hyper's
//! header timeout would not do either: once a timer is set it runs from
//! the moment a kept-alive connection goes idle, so it would close idle
//! connections after the (short) header timeout. Each connection is
//! therefore watched here, with the deadlines of Go's `net/http`:
//!
//! - a new connection must send a complete request head within the header
//!   timeout of its handshake (or accept);
//! - between requests, the next one must start within the idle timeout,
//!   and once its first byte arrives its head must be complete within the
//!   header timeout;
//! - while a request is in flight no deadline applies to the connection (a
//!   long poll may wait), but its body must arrive within the body timeout
//!   of its head, or the request is answered 408 and the connection
//!   closed.
//!
//! On HTTP/2 the idle deadline runs from the end of the last stream and is
//! not reset by pings or other frames: only a request counts as use.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::Router;
use http::{header, HeaderValue, Request, Version};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use super::handshake::{linger, Handshakes};
use super::{accept_failed, timed_out, ConnectionLimits, Gate, Io, Permit, Throttle};

/// How an HTTP port is served.
#[derive(Clone)]
pub struct HttpPort {
    /// The `listener` label of the connection metrics (`http`,
    /// `config_api`).
    pub listener: &'static str,
    /// The cap and the deadlines.
    pub limits: ConnectionLimits,
    /// TLS settings; `None` serves plain text.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The answer to a request whose body did not arrive within the body
    /// timeout (given the timeout): 408 in the API's own error shape.
    pub body_timeout_response: fn(Duration) -> Response,
    /// How long a shutdown waits for open connections to finish before it
    /// closes them.
    pub shutdown_grace: Duration,
    /// A route answered before the router, if any.
    pub direct: Option<Direct>,
}

/// What answers a [`Direct`] route: the request (its body under the
/// port's body deadline, as the router's routes get it), to its answer.
pub type DirectHandler =
    Arc<dyn Fn(Request<Body>) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

/// One route answered without the router: its method and exact path
/// (no parameters), and the handler.
///
/// For the one route every decision takes (`POST /v1/request`): the
/// router's matching, its URL-parameter and matched-path bookkeeping, its
/// boxed route future and axum's extractor chain cost about an eighth
/// of the instructions of a whole decision (docs/benchmarks.md, "Where a
/// decision's time goes"). The router must still define the route, so
/// that another method on the path is answered 405 as on every route.
#[derive(Clone)]
pub struct Direct {
    /// The method it answers.
    pub method: http::Method,
    /// The path it answers, compared exactly (the query is not part of it).
    pub path: &'static str,
    /// The answer.
    pub handler: DirectHandler,
}

impl Direct {
    fn answers<B>(&self, request: &Request<B>) -> bool {
        request.method() == self.method && request.uri().path() == self.path
    }
}

/// The error a request body gives its reader when it did not arrive in
/// time. A handler that recognises it (in the error's source chain) may
/// answer itself; any other answer to such a request is replaced by the
/// port's `body_timeout_response`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} ms", .0.as_millis())]
pub struct BodyTimedOut(pub Duration);

/// Serves `router` on `tcp` until `shutdown` completes, then stops
/// accepting, lets each connection finish the request it is serving (idle
/// ones close at once), and closes those still open after the shutdown
/// grace. Failing to accept (out of file descriptors) is logged and
/// retried, never fatal.
pub async fn serve(
    tcp: TcpListener,
    router: Router,
    port: HttpPort,
    shutdown: impl Future<Output = ()>,
) {
    let gate = Gate::new(port.listener, port.limits.max_connections);
    let grace = port.shutdown_grace;
    let shared = Arc::new(Shared {
        router,
        handshakes: port.tls.as_ref().map(|_| Handshakes::new(port.listener)),
        acceptor: port.tls.map(TlsAcceptor::from),
        limits: port.limits,
        listener: port.listener,
        body_timeout_response: port.body_timeout_response,
        direct: port.direct,
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let accept_errors = Throttle::new(Duration::from_secs(10));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = tcp.accept() => match accepted {
                Ok((stream, peer)) => {
                    if let Some(permit) = gate.admit() {
                        connections.spawn(connection(
                            stream,
                            peer,
                            Arc::clone(&shared),
                            permit,
                            stop_rx.clone(),
                        ));
                    }
                    // Refused: dropping the socket closes it.
                }
                Err(e) => accept_failed(&accept_errors, gate.listener(), &e).await,
            },
            // Reaps finished connections, which a JoinSet keeps until then.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // Closes the port at once: new clients are refused by the kernel
    // rather than left waiting in a backlog nobody accepts from.
    drop(tcp);
    let _ = stop_tx.send(true);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!(
            listener = shared.listener,
            open = connections.len(),
            ?grace,
            "HTTP connections still open after the shutdown grace period; closing them"
        );
        connections.shutdown().await;
    }
}

/// What every connection of a port shares.
struct Shared {
    router: Router,
    acceptor: Option<TlsAcceptor>,
    /// Failed handshakes, counted and logged (with TLS only).
    handshakes: Option<Handshakes>,
    limits: ConnectionLimits,
    listener: &'static str,
    body_timeout_response: fn(Duration) -> Response,
    direct: Option<Direct>,
}

/// One connection, from accept to close; `_permit` holds its place under
/// the cap for all of it, handshake included.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    _permit: Permit,
    mut stop: watch::Receiver<bool>,
) {
    // Small JSON answers: do not wait to coalesce.
    let _ = tcp.set_nodelay(true);
    let Some(acceptor) = &shared.acceptor else {
        return drive(Io::Plain(tcp), &shared, stop).await;
    };
    let handshake = tokio::time::timeout(
        shared.limits.handshake_timeout,
        acceptor.accept(tcp).into_fallible(),
    );
    let done = tokio::select! {
        done = handshake => done,
        _ = stop.wait_for(|s| *s) => return,
    };
    let tls = match done {
        Ok(Ok(tls)) => tls,
        Ok(Err((e, tcp))) => {
            if let Some(h) = &shared.handshakes {
                h.failed(Some(peer), &e);
            }
            tokio::select! {
                () = linger(tcp) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
            return;
        }
        Err(_) => {
            timed_out(shared.listener, "handshake");
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    drive(Io::Tls(Box::new(tls)), &shared, stop).await;
}

/// Serves HTTP on an established connection until it closes, a deadline
/// passes or the port shuts down.
async fn drive(io: Io, shared: &Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let activity = Arc::new(Activity::new(
        shared.limits.header_timeout,
        shared.limits.idle_timeout,
    ));
    let io = TokioIo::new(Watched {
        io,
        activity: Arc::clone(&activity),
    });
    let service = Requests {
        shared: Arc::clone(shared),
        activity: Arc::clone(&activity),
    };
    // No timer: hyper's header timeout is replaced by `Activity` (see the
    // module's doc), and without a timer hyper leaves it off.
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let (mut closing, mut stopping) = (false, false);
    loop {
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "HTTP connection ended with an error");
                }
                return;
            }
            phase = activity.expired() => {
                if closing {
                    // Closed for idling, yet still open with nothing in
                    // flight: an HTTP/2 client that never answers the
                    // GOAWAY's ping would hold it for good.
                    return;
                }
                timed_out(shared.listener, phase.name());
                match phase {
                    // Mid-head: nothing to finish, and a graceful close
                    // would wait for the head.
                    Phase::Header => return,
                    // No request in flight: HTTP/1 closes at once, HTTP/2
                    // says GOAWAY and finishes a stream that raced it; the
                    // connection may not idle long after that.
                    Phase::Idle => {
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                        activity.closing();
                    }
                }
            }
            _ = stop.wait_for(|s| *s), if !stopping => {
                conn.as_mut().graceful_shutdown();
                stopping = true;
            }
        }
    }
}

/// Which deadline passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// A request head took too long.
    Header,
    /// The connection sat with no request for too long.
    Idle,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Header => "header",
            Phase::Idle => "idle",
        }
    }
}

/// What a connection is doing, as far as its deadlines care.
struct Activity {
    header_timeout: Duration,
    idle_timeout: Duration,
    // A std mutex: nothing awaits while it is held.
    state: Mutex<State>,
    /// Set while waiting idle for the next request on HTTP/1, so that a
    /// read (the first byte of the next head) starts the header deadline
    /// without every read taking the lock.
    idle_h1: AtomicBool,
}

struct State {
    in_flight: usize,
    /// What the connection waits for when nothing is in flight, and until
    /// when.
    waiting: (Phase, Instant),
    /// Whether the connection speaks HTTP/2 (known from its first
    /// request): then bytes between requests are frames, not a head.
    h2: bool,
    /// Whether it is being closed for idling: then it may idle
    /// [`Activity::linger`] at most.
    closing: bool,
}

impl Activity {
    fn new(header_timeout: Duration, idle_timeout: Duration) -> Activity {
        Activity {
            header_timeout,
            idle_timeout,
            state: Mutex::new(State {
                in_flight: 0,
                waiting: (Phase::Header, Instant::now() + header_timeout),
                h2: false,
                closing: false,
            }),
            idle_h1: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request's head arrived; it is in flight until the guard drops
    /// (its answer written, or the request abandoned).
    fn started(self: &Arc<Self>, version: Version) -> InFlight {
        let mut state = self.lock();
        state.in_flight += 1;
        state.h2 |= version == Version::HTTP_2;
        self.idle_h1.store(false, Ordering::Release);
        drop(state);
        InFlight(Arc::clone(self))
    }

    fn finished(&self) {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if state.in_flight == 0 {
            let idle = if state.closing {
                self.linger()
            } else {
                self.idle_timeout
            };
            state.waiting = (Phase::Idle, Instant::now() + idle);
            self.idle_h1
                .store(!state.h2 && !state.closing, Ordering::Release);
        }
    }

    /// Bytes arrived: on an idle HTTP/1 connection, the next head has
    /// begun and must be complete within the header timeout.
    fn read_some(&self) {
        if !self.idle_h1.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut state = self.lock();
        if state.in_flight == 0 && state.waiting.0 == Phase::Idle {
            state.waiting = (Phase::Header, Instant::now() + self.header_timeout);
        }
    }

    /// How long a connection being closed may sit with nothing in flight
    /// (an HTTP/2 client has to answer the GOAWAY's ping): the shorter of
    /// the header and the idle timeouts.
    fn linger(&self) -> Duration {
        self.header_timeout.min(self.idle_timeout)
    }

    /// The connection is being closed for idling: from now on it may sit
    /// with nothing in flight for [`Activity::linger`] at most.
    fn closing(&self) {
        let mut state = self.lock();
        state.closing = true;
        state.waiting = (Phase::Idle, Instant::now() + self.linger());
        self.idle_h1.store(false, Ordering::Release);
    }

    /// Completes when the connection's current deadline passes.
    ///
    /// Nothing wakes it when the state changes: a wake-up per request
    /// (and the timer it re-armed) cost more than the rest of the
    /// listener's work for the request. Instead it sleeps until the
    /// deadline or [`Activity::linger`] from now, whichever comes first,
    /// and looks again. That is never late: every deadline is set at
    /// least `linger` after the moment it is set (the header and idle
    /// timeouts are each at least `linger`), so none can fall before a
    /// wake-up armed earlier.
    async fn expired(&self) -> Phase {
        loop {
            let now = Instant::now();
            let wake = {
                let state = self.lock();
                if state.in_flight == 0 {
                    let (phase, at) = state.waiting;
                    if at <= now {
                        return phase;
                    }
                    at.min(now + self.linger())
                } else {
                    now + self.linger()
                }
            };
            tokio::time::sleep_until(wake).await;
        }
    }
}

/// A request in flight on its connection.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.finished();
    }
}

/// The socket, telling the connection's [`Activity`] when bytes arrive.
struct Watched {
    io: Io,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.read_some();
        }
        polled
    }
}

crate::listen::write_through!(Watched);

/// The router (or the direct route), called for each request of one
/// connection.
#[derive(Clone)]
struct Requests {
    shared: Arc<Shared>,
    activity: Arc<Activity>,
}

impl hyper::service::Service<Request<Incoming>> for Requests {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let in_flight = self.activity.started(request.version());
        let direct = self
            .shared
            .direct
            .as_ref()
            .is_some_and(|d| d.answers(&request));
        let http1 = request.version() < Version::HTTP_2;
        let limit = self.shared.limits.body_timeout;
        let late = Arc::new(AtomicBool::new(false));
        let request = request.map(|body| {
            Body::new(Deadline {
                body,
                at: Instant::now() + limit,
                limit,
                sleep: None,
                late: Arc::clone(&late),
            })
        });
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let mut response = match shared.direct.as_ref().filter(|_| direct) {
                Some(d) => (d.handler)(request).await,
                None => match shared.router.clone().oneshot(request).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                },
            };
            if late.load(Ordering::Acquire) {
                timed_out(shared.listener, "body");
                response = (shared.body_timeout_response)(limit);
                if http1 {
                    // The rest of the body is still on its way: do not
                    // read it as the next request.
                    response
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
            }
            // In flight until the answer is written (hyper drops the body
            // then), not merely until the handler returns.
            Ok(response.map(|body| {
                Body::new(Answer {
                    body,
                    _in_flight: in_flight,
                })
            }))
        })
    }
}

/// A request body that fails with [`BodyTimedOut`] once its deadline has
/// passed, however the bytes trickle in.
struct Deadline {
    body: Incoming,
    at: Instant,
    limit: Duration,
    /// Armed only when the body has to be waited for.
    sleep: Option<Pin<Box<Sleep>>>,
    late: Arc<AtomicBool>,
}

impl Deadline {
    fn expire(&mut self) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        self.late.store(true, Ordering::Release);
        Poll::Ready(Some(Err(Box::new(BodyTimedOut(self.limit)))))
    }
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        // Checked before reading too: a body sending a byte at a time
        // never leaves its reader waiting long enough for the timer.
        if this.at <= Instant::now() {
            return this.expire();
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => {
                let at = this.at;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => this.expire(),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// An answer's body, holding its request in flight until it is dropped.
struct Answer {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Answer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
