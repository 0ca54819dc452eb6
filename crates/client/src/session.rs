//! One server: its connection, its session stream, and reconnecting with
//! backoff when it goes away.
//!
//! Every operation travels on one long-lived `Session` stream per server,
//! so the server knows which holds belong to this client and releases them
//! when the stream ends, whatever ended it (Charon §4.3.1). A task owns the
//! stream; callers hand it operations and wait for the matching answer.
//! A caller that stops waiting (its timeout passed) does not leak what the
//! server granted late: the task releases copies nobody is waiting for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tollgate_proto::v1::{self, session_request::Op, session_response::Result as Answer};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::backoff::{jitter, Clock};
use crate::config::{ClientConfig, Tls};
use crate::metrics as m;

/// Why a call to one server did not get an answer.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// Could not connect, the stream broke, or no answer in time.
    Unreachable(String),
    /// The server answered with an error.
    Status {
        code: tonic::Code,
        reason: String,
        message: String,
    },
}

impl Failure {
    /// Whether the caller is at fault (retrying elsewhere cannot help),
    /// as opposed to the server or the network (Charon's "non-client
    /// exceptional response", which fails open).
    pub(crate) fn is_client_error(&self) -> bool {
        use tonic::Code::*;
        match self {
            Failure::Unreachable(_) => false,
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

    fn describe(&self) -> String {
        match self {
            Failure::Unreachable(why) => why.clone(),
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

type Reply = oneshot::Sender<Result<Answer, Failure>>;

struct Outgoing {
    op: Op,
    /// `None`: fire and forget (a guard's release on drop).
    reply: Option<Reply>,
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

    /// Sends `op` and waits at most `timeout` for its answer.
    pub(crate) async fn call(&self, op: Op, timeout: Duration) -> Result<Answer, Failure> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Outgoing {
                op,
                reply: Some(reply),
            })
            .map_err(|_| Failure::Unreachable(format!("the session to {} ended", self.endpoint)))?;
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Failure::Unreachable(format!(
                "the session to {} ended",
                self.endpoint
            ))),
            Err(_) => Err(Failure::Unreachable(format!(
                "{} did not answer within {timeout:?}",
                self.endpoint
            ))),
        }
    }

    /// Sends `op` without waiting (a guard's release on drop: `Drop`
    /// cannot wait). Lost if the session has ended, which is fine: the
    /// server released everything of the session then.
    pub(crate) fn send(&self, op: Op) {
        let _ = self.tx.send(Outgoing { op, reply: None });
    }
}

/// Opens a session on `channel`.
async fn open(channel: Channel, endpoint: String) -> Result<Arc<Session>, Failure> {
    let mut grpc = v1::tollgate_client::TollgateClient::new(channel);
    let (requests, outbound) = mpsc::channel::<v1::SessionRequest>(64);
    let response = grpc
        .session(ReceiverStream::new(outbound))
        .await
        .map_err(|s| status_failure(&s))?;
    let mut inbound = response.into_inner();
    let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();
    let alive = Arc::new(AtomicBool::new(true));
    let session = Arc::new(Session {
        tx,
        alive: Arc::clone(&alive),
        endpoint: endpoint.clone(),
    });
    metrics::counter!(m::SESSIONS).increment(1);
    tokio::spawn(async move {
        let mut pending: HashMap<u64, (Op, Option<Reply>)> = HashMap::new();
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
                    pending.insert(next, (out.op, out.reply));
                    if requests.send(request).await.is_err() {
                        break String::from("the request stream closed");
                    }
                }
                message = inbound.message() => match message {
                    Ok(Some(response)) => {
                        let Some((op, reply)) = pending.remove(&response.id) else { continue };
                        let result = match response.result {
                            Some(Answer::Error(e)) => Err(Failure::Status {
                                code: tonic::Code::from_i32(e.code),
                                reason: e.reason,
                                message: e.message,
                            }),
                            Some(answer) => Ok(answer),
                            None => Err(Failure::Unreachable("an empty answer".to_owned())),
                        };
                        let unclaimed = match reply {
                            Some(reply) => reply.send(result).err(),
                            None => None,
                        };
                        // Whoever asked has given up: copies granted now
                        // would be held by nobody until the session ends.
                        if let Some(Ok(answer)) = unclaimed {
                            if let Some(release) = release_unclaimed(&op, &answer) {
                                next += 1;
                                let request = v1::SessionRequest { id: next, op: Some(release) };
                                if requests.send(request).await.is_err() {
                                    break String::from("the request stream closed");
                                }
                            }
                        }
                    }
                    Ok(None) => break String::from("the server ended the session"),
                    Err(status) => break status_failure(&status).describe(),
                },
            }
        };
        alive.store(false, Ordering::Release);
        tracing::debug!(%endpoint, %why, "session ended");
        for (_, (_, reply)) in pending {
            if let Some(reply) = reply {
                let _ = reply.send(Err(Failure::Unreachable(format!(
                    "the session to {endpoint} ended: {why}"
                ))));
            }
        }
    });
    Ok(session)
}

/// The release of what `answer` granted to `op`, when it granted copies.
fn release_unclaimed(op: &Op, answer: &Answer) -> Option<Op> {
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

fn status_failure(s: &tonic::Status) -> Failure {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown => {
            Failure::Unreachable(format!("{:?}: {}", s.code(), s.message()))
        }
        code => Failure::Status {
            code,
            reason: String::new(),
            message: s.message().to_owned(),
        },
    }
}

/// One server and its session, reconnected with backoff.
pub(crate) struct Server {
    pub(crate) name: String,
    endpoint: Endpoint,
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
    reconnect_base: Duration,
    reconnect_max: Duration,
}

#[derive(Default)]
struct State {
    session: Option<Arc<Session>>,
    failures: u32,
    /// Not before this (clock time) after a failure.
    retry_at: Option<Duration>,
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
        let mut endpoint = Endpoint::from_shared(full.clone())
            .map_err(|e| format!("bad server address {uri:?}: {e}"))?
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true);
        if full.starts_with("https://") {
            endpoint = endpoint
                .tls_config(tls_config(config.tls.as_ref()))
                .map_err(|e| format!("TLS for {uri:?}: {e}"))?;
        }
        Ok(Server {
            name: uri.to_owned(),
            endpoint,
            state: Mutex::new(State::default()),
            clock: Arc::clone(&config.clock),
            reconnect_base: config.reconnect_base,
            reconnect_max: config.reconnect_max,
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
            if let Some(at) = state.retry_at {
                if self.clock.now() < at {
                    return Err(Failure::Unreachable(format!(
                        "{} failed recently; next attempt in {:?}",
                        self.name,
                        at.saturating_sub(self.clock.now())
                    )));
                }
            }
        }
        let opened = match self.endpoint.connect().await {
            Ok(channel) => open(channel, self.name.clone()).await,
            Err(e) => Err(Failure::Unreachable(format!(
                "cannot connect to {}: {}",
                self.name,
                error_chain(&e)
            ))),
        };
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
            Err(f) => {
                self.failed_locked(&mut state);
                Err(f)
            }
        }
    }

    /// A connection for a unary call (`status`).
    pub(crate) async fn channel(&self) -> Result<Channel, Failure> {
        self.endpoint.connect().await.map_err(|e| {
            Failure::Unreachable(format!(
                "cannot connect to {}: {}",
                self.name,
                error_chain(&e)
            ))
        })
    }

    /// Records that the server did not answer: its session is dropped
    /// and it is not tried again before its reconnection backoff.
    pub(crate) fn failed(&self) {
        let mut state = self.state();
        self.failed_locked(&mut state);
    }

    fn failed_locked(&self, state: &mut State) {
        state.session = None;
        let nominal = self
            .reconnect_base
            .saturating_mul(1u32.checked_shl(state.failures.min(16)).unwrap_or(u32::MAX))
            .min(self.reconnect_max);
        state.failures = state.failures.saturating_add(1);
        let wait = jitter(nominal, &mut rand::rng());
        state.retry_at = Some(self.clock.now().saturating_add(wait));
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
