//! One server: its connection, its session stream, and reconnecting with
//! backoff when it goes away.
//!
//! Rate requests hold nothing, so they go as unary `Request` calls on the
//! server's connection and need no session: a server whose session table
//! is full still decides them. Every operation on copies travels on one
//! long-lived `Session` stream per server, so the server knows which holds
//! belong to this client and releases them when the stream ends, whatever
//! ended it (Charon §4.3.1). A task owns the
//! stream; callers hand it operations and wait for the matching answer.
//! Copies the server granted are handed over inside a [`Delivered`] whose
//! guard releases them if nobody takes them: a caller that stopped
//! waiting (its timeout passed, its future was dropped) leaks nothing. A
//! hold's release or transfer lowers its count before it is sent, and the
//! task puts the copies back if the server refused, whether or not the
//! caller still waits, so the count a guard releases on drop is never
//! stale.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tollgate_proto::v1::{self, session_request::Op, session_response::Result as Answer};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::backoff::{jitter, Timer};
use crate::config::{ClientConfig, Tls};
use crate::metrics as m;
use crate::tls::Probe;

/// Why a call to one server did not get an answer.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// Could not connect, the stream broke, or no answer in time. The
    /// text does not name the server: whoever asked it adds the name
    /// (an [`Outage`](crate::Outage) lists each server with its failure).
    Unreachable(String),
    /// No answer because TLS with the server failed in a way a setting
    /// fixes (the server requires a client certificate, or refused this
    /// one; its certificate is not trusted, or lacks the name): like
    /// [`Failure::Unreachable`] for failover and fail-open, but named, so
    /// a caller can tell a misconfiguration from an outage.
    Tls(String),
    /// The server answered with an error.
    Status {
        code: tonic::Code,
        reason: String,
        message: String,
    },
}

impl Failure {
    /// Whether the server is up and refused for want of room of its own
    /// (`RESOURCE_EXHAUSTED`: too many sessions, store at capacity). Not
    /// the caller's fault, so another server may take it; but a server
    /// answered, so it is not failed open either (DESIGN: refusal is not
    /// absence), or filling one server's session table would switch
    /// limiting off for every client.
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(
            self,
            Failure::Status {
                code: tonic::Code::ResourceExhausted,
                ..
            }
        )
    }

    /// Whether the failure came from the connection rather than from the
    /// server's service: no `tollgate-reason` (the server names the
    /// reason of every error it answers), and a code the transport gives
    /// (an HTTP/2 stream cut off, a connection closed under a call).
    fn is_transport(&self) -> bool {
        use tonic::Code::*;
        match self {
            Failure::Unreachable(_) => true,
            // Already said why.
            Failure::Tls(_) => false,
            Failure::Status { code, reason, .. } => {
                reason.is_empty() && matches!(code, Internal | Unknown | Unavailable | Cancelled)
            }
        }
    }

    /// Whether the caller is at fault (retrying elsewhere cannot help),
    /// as opposed to a refusal ([`Failure::is_refusal`]) or a failure of
    /// the server or the network (Charon's "non-client exceptional
    /// response", which fails open: `store_unavailable`, `INTERNAL`).
    pub(crate) fn is_client_error(&self) -> bool {
        use tonic::Code::*;
        match self {
            Failure::Unreachable(_) | Failure::Tls(_) => false,
            // The server ended the session under the caller: another
            // session (or server) will do.
            Failure::Status { reason, .. } if reason == "session_closed" => false,
            Failure::Status { code, .. } => matches!(
                code,
                InvalidArgument
                    | NotFound
                    | AlreadyExists
                    | PermissionDenied
                    | FailedPrecondition
                    | OutOfRange
                    | Unauthenticated
            ),
        }
    }

    /// Why TLS failed, if that is the failure.
    fn tls(&self) -> Option<&str> {
        match self {
            Failure::Tls(why) => Some(why),
            _ => None,
        }
    }

    /// Whether nobody answered (unreachable, or TLS failed): the server
    /// is backed off from.
    pub(crate) fn is_unanswered(&self) -> bool {
        matches!(self, Failure::Unreachable(_) | Failure::Tls(_))
    }

    fn describe(&self) -> String {
        match self {
            Failure::Unreachable(why) | Failure::Tls(why) => why.clone(),
            Failure::Status {
                code,
                reason,
                message,
            } => format!("{code:?} ({reason}): {message}"),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// An answer, with the release of what it granted should it be dropped
/// unclaimed.
pub(crate) struct Delivered {
    /// The server's answer.
    pub(crate) answer: Answer,
    guard: Option<ReleaseGuard>,
}

impl Delivered {
    /// An answer that granted no copies (a unary rate request's).
    pub(crate) fn unguarded(answer: Answer) -> Delivered {
        Delivered {
            answer,
            guard: None,
        }
    }

    /// Takes the copies the answer granted: from now on, whoever holds
    /// them releases them.
    pub(crate) fn claim(mut self) -> Answer {
        if let Some(g) = self.guard.as_mut() {
            g.release = None;
        }
        std::mem::replace(&mut self.answer, Answer::Closed(v1::Close {}))
    }
}

/// Sends a release of granted copies when dropped, unless claimed.
struct ReleaseGuard {
    tx: mpsc::UnboundedSender<Outgoing>,
    release: Option<Op>,
}

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        if let Some(op) = self.release.take() {
            let _ = self.tx.send(Outgoing {
                op,
                reply: None,
                restore: None,
            });
        }
    }
}

type Reply = oneshot::Sender<Result<Delivered, Failure>>;

/// Copies to give back to a hold's count if the server refuses the
/// operation that took them from it.
pub(crate) type Restore = (Arc<AtomicU64>, u64);

struct Outgoing {
    op: Op,
    /// `None`: fire and forget (a guard's release on drop).
    reply: Option<Reply>,
    restore: Option<Restore>,
}

/// An open session on one server.
pub(crate) struct Session {
    tx: mpsc::UnboundedSender<Outgoing>,
    alive: Arc<AtomicBool>,
    /// The endpoint, for messages.
    pub(crate) endpoint: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("endpoint", &self.endpoint)
            .field("alive", &self.is_alive())
            .finish()
    }
}

impl Session {
    /// Whether the stream is still open (a hold taken on it still holds).
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Sends `op` and waits at most `timeout` for its answer. Copies the
    /// answer grants are released unless the caller claims them
    /// ([`Delivered::claim`]); `restore` goes back to its count if the
    /// server refuses.
    pub(crate) async fn call(
        &self,
        op: Op,
        restore: Option<Restore>,
        timeout: Duration,
    ) -> Result<Delivered, Failure> {
        let (reply, mut answer) = oneshot::channel();
        self.tx
            .send(Outgoing {
                op,
                reply: Some(reply),
                restore,
            })
            .map_err(|_| Failure::Unreachable("the session ended".to_owned()))?;
        match tokio::time::timeout(timeout, &mut answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Failure::Unreachable("the session ended".to_owned())),
            Err(_) => {
                // An answer arriving from now on is dropped with the
                // receiver, and its guard releases what it granted.
                answer.close();
                Err(Failure::Unreachable(format!(
                    "did not answer within {timeout:?}"
                )))
            }
        }
    }

    /// Sends `op` without waiting (a guard's release on drop: `Drop`
    /// cannot wait). Lost if the session has ended, which is fine: the
    /// server released everything of the session then.
    pub(crate) fn send(&self, op: Op) {
        let _ = self.tx.send(Outgoing {
            op,
            reply: None,
            restore: None,
        });
    }
}

/// Marks the session dead however its task ends (also when the runtime
/// drops it mid-await).
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Opens a session on `channel`.
async fn open(channel: Channel, endpoint: String) -> Result<Arc<Session>, Failure> {
    let mut grpc = v1::tollgate_client::TollgateClient::new(channel);
    // Unbounded, so the task never stops reading answers while it waits to
    // send (the server stops reading when its answers are not read).
    let (requests, outbound) = mpsc::unbounded_channel::<v1::SessionRequest>();
    let response = grpc
        .session(UnboundedReceiverStream::new(outbound))
        .await
        .map_err(|s| status_failure(&s))?;
    let mut inbound = response.into_inner();
    let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();
    let alive = Arc::new(AtomicBool::new(true));
    let session = Arc::new(Session {
        tx: tx.clone(),
        alive: Arc::clone(&alive),
        endpoint: endpoint.clone(),
    });
    // The task's own sender would keep it alive forever: it sends guards'
    // releases through a weak one.
    let weak = tx.downgrade();
    drop(tx);
    metrics::counter!(m::SESSIONS).increment(1);
    tokio::spawn(async move {
        let _alive = AliveGuard(Arc::clone(&alive));
        type Pending = (Op, Option<Reply>, Option<Restore>);
        let mut pending: HashMap<u64, Pending> = HashMap::new();
        let mut next = 0u64;
        let why = loop {
            tokio::select! {
                out = rx.recv() => {
                    // Every handle dropped (client and holds gone): ending
                    // the request stream ends the session, and the server
                    // releases whatever it still holds.
                    let Some(out) = out else { break String::from("closed") };
                    next += 1;
                    let request = v1::SessionRequest { id: next, op: Some(out.op.clone()) };
                    pending.insert(next, (out.op, out.reply, out.restore));
                    if requests.send(request).is_err() {
                        break String::from("the request stream closed");
                    }
                }
                message = inbound.message() => match message {
                    Ok(Some(response)) => {
                        let Some((op, reply, restore)) = pending.remove(&response.id) else {
                            continue;
                        };
                        let result = match response.result {
                            Some(Answer::Error(e)) => Err(Failure::Status {
                                code: tonic::Code::from_i32(e.code),
                                reason: e.reason,
                                message: e.message,
                            }),
                            Some(answer) => Ok(answer),
                            None => Err(Failure::Unreachable("an empty answer".to_owned())),
                        };
                        if let (Err(_), Some((count, copies))) = (&result, &restore) {
                            count.fetch_add(*copies, Ordering::AcqRel);
                        }
                        let delivered = result.map(|answer| {
                            let guard = release_of(&op, &answer)
                                .zip(weak.upgrade())
                                .map(|(release, tx)| ReleaseGuard { tx, release: Some(release) });
                            Delivered { answer, guard }
                        });
                        // Nobody waiting: the value (and its guard) is
                        // dropped here, which releases what it granted.
                        if let Some(reply) = reply {
                            let _ = reply.send(delivered);
                        }
                    }
                    Ok(None) => break String::from("the server ended the session"),
                    Err(status) => break status_failure(&status).describe(),
                },
            }
        };
        alive.store(false, Ordering::Release);
        tracing::debug!(%endpoint, why = ?why, "session ended");
        for (_, (_, reply, _)) in pending {
            if let Some(reply) = reply {
                let _ = reply.send(Err(Failure::Unreachable(format!(
                    "the session ended: {why}"
                ))));
            }
        }
    });
    Ok(session)
}

/// The release of what `answer` granted to `op`, when it granted copies.
fn release_of(op: &Op, answer: &Answer) -> Option<Op> {
    match (op, answer) {
        (Op::Reserve(r), Answer::Reserve(a)) if a.granted > 0 => {
            Some(Op::Release(v1::ReleaseRequest {
                namespace: r.namespace.clone(),
                resource: r.resource.clone(),
                domain: r.domain.clone(),
                copies: a.granted,
                groups: a.groups.clone(),
                hold_id: String::new(),
            }))
        }
        (Op::Seize(_), Answer::Seize(s)) if s.copies > 0 => Some(Op::Release(v1::ReleaseRequest {
            namespace: s.namespace.clone(),
            resource: s.resource.clone(),
            domain: s.domain.clone(),
            copies: s.copies,
            groups: s.groups.clone(),
            hold_id: String::new(),
        })),
        _ => None,
    }
}

/// A gRPC status as a failure. The server names the reason of every
/// error it answers in the `tollgate-reason` metadata; an `UNAVAILABLE`
/// (or cancelled, or unknown) status without one comes from the transport
/// or a proxy: nobody answered.
pub(crate) fn status_failure(s: &tonic::Status) -> Failure {
    let reason = s
        .metadata()
        .get(REASON_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown
            if reason.is_empty() =>
        {
            Failure::Unreachable(format!("{:?}: {}", s.code(), s.message()))
        }
        code => Failure::Status {
            code,
            reason,
            message: s.message().to_owned(),
        },
    }
}

/// The metadata key in which the server names an error's reason.
const REASON_HEADER: &str = "tollgate-reason";

/// One server and its session, reconnected with backoff.
pub(crate) struct Server {
    pub(crate) name: String,
    endpoint: Endpoint,
    state: Mutex<State>,
    timer: Arc<dyn Timer>,
    reconnect_base: Duration,
    reconnect_max: Duration,
    open_timeout: Duration,
    /// Finds out what the server refused when a call fails on the
    /// connection (see [`crate::tls`]).
    probe: Arc<Probe>,
}

#[derive(Default)]
struct State {
    session: Option<Arc<Session>>,
    /// The connection unary calls (rate requests) share; HTTP/2
    /// multiplexes them, and tonic reconnects it by itself.
    channel: Option<Channel>,
    failures: u32,
    /// Not before this (clock time) after a failure.
    retry_at: Option<Duration>,
    /// What the last failure was: a call refused during the backoff says
    /// it, not only that the server failed.
    last_failure: String,
    /// Whether the last failure was TLS's: a call refused during the
    /// backoff is then a TLS failure too, told apart from an outage.
    last_tls: bool,
}

impl Server {
    /// The server at `uri` (`host:port`, `http://` or `https://`).
    pub(crate) fn new(uri: &str, config: &ClientConfig) -> Result<Server, String> {
        let full = if uri.contains("://") {
            uri.to_owned()
        } else if config.tls.is_some() {
            format!("https://{uri}")
        } else {
            format!("http://{uri}")
        };
        // A user or password would be shown in every outage, on stdout
        // and in JSON; tollgate servers take none: refused, unshown. Found
        // in the text, before the parse, whose error would quote it (a
        // password with a `/` in it does not parse as one).
        if let Some((_, host)) = uri.rsplit_once('@') {
            return Err(format!(
                "bad server address for {host}: it has a user or password (before `@`), \
                 which tollgate servers do not take; remove it"
            ));
        }
        let mut endpoint = Endpoint::from_shared(full.clone())
            .map_err(|e| format!("bad server address {uri:?}: {e}"))?;
        let https = full.starts_with("https://");
        // Before tonic's TLS settings, whose errors name nothing.
        let probe = Probe::new(
            endpoint.uri(),
            config.tls.as_ref(),
            https,
            config.connect_timeout,
            Arc::clone(&config.timer),
        )
        .map_err(|e| format!("TLS for {uri:?}: {e}"))?;
        endpoint = endpoint
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            // A half-open connection (a server that vanished without a
            // word) is noticed: the session ends, its holds read as lost.
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        if https {
            endpoint = endpoint
                .tls_config(tls_config(config.tls.as_ref()))
                .map_err(|e| format!("TLS for {uri:?}: {}", error_chain(&e)))?;
        }
        Ok(Server {
            name: uri.to_owned(),
            endpoint,
            state: Mutex::new(State::default()),
            timer: Arc::clone(&config.timer),
            reconnect_base: config.reconnect_base,
            reconnect_max: config.reconnect_max,
            open_timeout: config
                .connect_timeout
                .saturating_add(config.request_timeout),
            probe: Arc::new(probe),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The open session, opening one if there is none and the server is
    /// not in its reconnection backoff.
    pub(crate) async fn session(&self) -> Result<Arc<Session>, Failure> {
        {
            let state = self.state();
            if let Some(s) = state.session.as_ref().filter(|s| s.is_alive()) {
                return Ok(Arc::clone(s));
            }
            self.backing_off(&state)?;
        }
        // The connect timeout covers only TCP: a server that accepts and
        // then stalls (TLS, headers) must not hang callers past it.
        let deadline = tokio::time::Instant::now() + self.open_timeout;
        let opened = tokio::time::timeout_at(deadline, async {
            let channel = self.channel().await?;
            match open(channel, self.name.clone()).await {
                Err(f) => Err(self.diagnose(f, deadline).await),
                opened => opened,
            }
        })
        .await
        .unwrap_or_else(|_| {
            Err(Failure::Unreachable(format!(
                "did not open a session within {:?}",
                self.open_timeout
            )))
        });
        let mut state = self.state();
        match opened {
            Ok(session) => {
                if state.failures > 0 {
                    tracing::info!(server = %self.name, "reconnected");
                }
                state.failures = 0;
                state.retry_at = None;
                // Two callers may race to open: keep the first, so holds
                // share one session.
                if let Some(s) = state.session.as_ref().filter(|s| s.is_alive()) {
                    return Ok(Arc::clone(s));
                }
                state.session = Some(Arc::clone(&session));
                Ok(session)
            }
            // Refused by the server (credentials, too many sessions, ...):
            // not a reason to back off from a healthy server.
            Err(f) if f.is_client_error() || f.is_refusal() => Err(f),
            Err(f) => {
                if state.session.as_ref().is_none_or(|s| !s.is_alive()) {
                    self.failed_locked(&mut state, &f);
                }
                Err(f)
            }
        }
    }

    /// Decides a rate request with the unary `Request` call: it holds
    /// nothing, so it needs no session (and no room in the server's
    /// session table). Waits at most `timeout` for the answer.
    pub(crate) async fn request(
        &self,
        request: v1::RateRequest,
        timeout: Duration,
    ) -> Result<v1::RateResponse, Failure> {
        let channel = {
            let state = self.state();
            match &state.channel {
                Some(c) => Some(c.clone()),
                None => {
                    self.backing_off(&state)?;
                    None
                }
            }
        };
        let channel = match channel {
            Some(c) => c,
            None => {
                let connected = tokio::time::timeout(self.open_timeout, self.channel())
                    .await
                    .unwrap_or_else(|_| {
                        Err(Failure::Unreachable(format!(
                            "did not accept a connection within {:?}",
                            self.open_timeout
                        )))
                    });
                match connected {
                    Ok(c) => {
                        self.state().channel = Some(c.clone());
                        c
                    }
                    Err(f) => {
                        self.channel_failed(&f);
                        return Err(f);
                    }
                }
            }
        };
        let mut grpc = v1::tollgate_client::TollgateClient::new(channel);
        let deadline = tokio::time::Instant::now() + timeout;
        let answer = match tokio::time::timeout_at(deadline, grpc.request(request)).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(self.diagnose(status_failure(&status), deadline).await),
            Err(_) => Err(Failure::Unreachable(format!(
                "did not answer within {timeout:?}"
            ))),
        };
        match &answer {
            Err(f) if f.is_unanswered() => self.channel_failed(f),
            _ => {
                let mut state = self.state();
                if state.failures > 0 {
                    tracing::info!(server = %self.name, "reconnected");
                }
                state.failures = 0;
                state.retry_at = None;
            }
        }
        answer
    }

    /// Whether the server is in its reconnection backoff.
    fn backing_off(&self, state: &State) -> Result<(), Failure> {
        let now = self.timer.now();
        match state.retry_at {
            Some(at) if now < at => {
                let why = format!(
                    "failed recently ({}); next attempt in {:?}",
                    state.last_failure,
                    at.saturating_sub(now)
                );
                Err(if state.last_tls {
                    Failure::Tls(why)
                } else {
                    Failure::Unreachable(why)
                })
            }
            _ => Ok(()),
        }
    }

    /// A unary call found nobody: the connection is dropped (the next call
    /// connects anew) and the server is not tried again before its
    /// reconnection backoff. A live session is left alone: its own stream
    /// tells whether it still works.
    fn channel_failed(&self, why: &Failure) {
        let mut state = self.state();
        state.channel = None;
        let session = state.session.take();
        self.failed_locked(&mut state, why);
        state.session = session;
    }

    /// A connection for a unary call (`status`).
    pub(crate) async fn channel(&self) -> Result<Channel, Failure> {
        // The server's name is added where failures are collected.
        self.endpoint.connect().await.map_err(|e| match self.probe.explain(&e) {
            Some(why) => {
                // A refused certificate (either side's) looks like any
                // failed connection and would fail open quietly: say it
                // loudly. Once per attempt, and attempts back off.
                tracing::error!(server = %self.name, error = %why, "TLS with the server failed");
                Failure::Tls(format!("cannot connect: {why}"))
            }
            None => Failure::Unreachable(format!("cannot connect: {}", error_chain(&e))),
        })
    }

    /// `failure` of a call, or what the server refused when the call
    /// failed on its connection: a server that refused this client's
    /// certificate closes the connection after the handshake, and the
    /// call only hears `Cancelled` (see [`crate::tls`]). Waits for the
    /// probe until `deadline`, the end of the call's own time, at most.
    pub(crate) async fn diagnose(
        &self,
        failure: Failure,
        deadline: tokio::time::Instant,
    ) -> Failure {
        if !failure.is_transport() {
            return failure;
        }
        // The probe logs what it found, once per probe.
        match self.probe.refused(deadline).await {
            Some(why) => Failure::Tls(why),
            None => failure,
        }
    }

    /// Records that `session` did not answer: it is dropped and the
    /// server is not tried again before its reconnection backoff (unless a
    /// newer session replaced it meanwhile).
    pub(crate) fn failed(&self, session: &Arc<Session>, why: &Failure) {
        let mut state = self.state();
        let current = match &state.session {
            None => true,
            Some(s) => Arc::ptr_eq(s, session),
        };
        if current {
            self.failed_locked(&mut state, why);
        }
    }

    /// Backs off from the server after a failure, keeping `why` to say
    /// during the backoff.
    fn failed_locked(&self, state: &mut State, why: &Failure) {
        state.session = None;
        // Said again in every call during the backoff: kept bounded.
        state.last_failure = crate::outage::clean(why);
        state.last_tls = why.tls().is_some();
        let nominal = self
            .reconnect_base
            .saturating_mul(1u32.checked_shl(state.failures.min(16)).unwrap_or(u32::MAX))
            .min(self.reconnect_max);
        state.failures = state.failures.saturating_add(1);
        let wait = jitter(nominal, &mut rand::rng());
        state.retry_at = Some(self.timer.now().saturating_add(wait));
    }
}

fn tls_config(tls: Option<&Tls>) -> ClientTlsConfig {
    let mut config = ClientTlsConfig::new();
    match tls.and_then(|t| t.ca.as_ref()) {
        Some(ca) => config = config.ca_certificate(Certificate::from_pem(ca)),
        None => config = config.with_webpki_roots(),
    }
    if let Some(tls) = tls {
        if let Some(domain) = &tls.domain {
            config = config.domain_name(domain.clone());
        }
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
    }
    config
}

/// An error and its sources on one line ("transport error: connection
/// refused").
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}
