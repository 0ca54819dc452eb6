//! The native gRPC API (`tollgate.v1.Tollgate`): unary rate requests and
//! sessions.
//!
//! A session is one bidirectional stream, handled by one task that answers
//! its operations in order. Whatever ends the stream — the client's
//! `Close`, the client going away, the connection breaking, the server
//! shutting down — the task closes the session, which releases every hold
//! still in it.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures_util::Stream;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tollgate_core::copies::TransferId;
use tollgate_core::{Hits, Mode};
use tollgate_proto::v1::{self, session_request::Op, session_response::Result as Answer};
use tollgate_proto::RateRequestView;
use tollgate_service::{LimitedBy, ServiceError, Session, Target};
use tollgate_store::Store;
use tonic::{Request, Response, Status, Streaming};

use crate::app::App;
use crate::errors::{grpc_code, status};
use crate::spans::{Caller, Decision, Outcome};
use crate::tokens::Refused;
use crate::{convert, decision_log, metrics as m};

/// Implements `tollgate.v1.Tollgate`.
pub struct Native<S> {
    app: Arc<App<S>>,
    shutdown: watch::Receiver<bool>,
}

impl<S> Native<S> {
    /// The service over `app`; sessions end when `shutdown` turns true.
    pub fn new(app: Arc<App<S>>, shutdown: watch::Receiver<bool>) -> Native<S> {
        Native { app, shutdown }
    }
}

/// Answers one rate request, recording metrics and, when spans are on, a
/// span that is a child of `caller`'s trace.
pub async fn rate<S: Store>(
    app: &App<S>,
    surface: &'static str,
    req: RateRequestView<'_>,
    caller: &Caller,
) -> Result<v1::RateResponse, ServiceError> {
    let started = Instant::now();
    let now = app.now();
    let result = match convert::rate_request(req) {
        Ok(r) => app.service().request_at(&r, now).await,
        Err(e) => Err(e),
    };
    m::latency(surface, started.elapsed().as_secs_f64());
    if app.spans_on() {
        let ended = app.now();
        let (outcome, granted) = match &result {
            Ok(o) => (Outcome::of_grant(o.allowed), o.granted),
            Err(e) => (Outcome::Error(e.reason()), 0),
        };
        app.record_span(
            caller,
            (now, ended),
            &Decision {
                name: "tollgate.rate",
                surface,
                namespace: req.namespace,
                resource: Some(req.resource),
                descriptors: None,
                hits: req.hits_or_default(),
                granted,
                outcome,
            },
        );
    }
    match result {
        Ok(o) => {
            m::rate_decision(
                surface,
                req.namespace,
                req.resource,
                !o.unconfigured,
                o.allowed,
                o.granted,
                match v1::Mode::try_from(req.mode) {
                    Ok(v1::Mode::Report) => Mode::Report,
                    Ok(v1::Mode::Refund) => Mode::Refund,
                    _ => Mode::Try,
                },
            );
            if !o.unconfigured {
                if !o.allowed {
                    app.denied()
                        .record(now.as_u64(), req.namespace, req.resource, req.domain);
                } else if o.granted > 0
                    // Giving back never brings a limit nearer.
                    && req.mode != v1::Mode::Refund as i32
                    // Over the limit is over, not near: a refusal that
                    // shadow mode or `ignore_configured` let through
                    // counts in neither (as envoyproxy/ratelimit counts
                    // it in over_limit/shadow_mode only).
                    && !o.shadowed
                    && !o.ignored
                    // A `limits:` list is near when any of its limits is:
                    // when its fullest one is (the answer's is the
                    // binding one).
                    && [Some(o.decision), o.fullest]
                        .into_iter()
                        .flatten()
                        .any(|d| app.near_limit().is_near(d.limit, d.remaining))
                {
                    m::near_limit(surface, req.namespace, req.resource);
                }
            }
            if let Some(log) = app.decision_log().filter(|l| l.sampled()) {
                log.write(&decision_log::Line {
                    time_ms: decision_log::time_ms(now),
                    namespace: req.namespace,
                    resource: Some(req.resource),
                    domain: Some(req.domain),
                    descriptors: None,
                    limit: req
                        .limit
                        .map(|(requests_per_unit, unit)| decision_log::Brought {
                            requests_per_unit,
                            unit,
                        }),
                    descriptor_limits: None,
                    descriptor_hits: None,
                    descriptor_refunds: None,
                    hits: req.hits_or_default(),
                    min_hits: req.min_hits_or_default(),
                    mode: match v1::Mode::try_from(req.mode) {
                        Ok(v1::Mode::Acquire) => "acquire",
                        Ok(v1::Mode::Report) => "report",
                        Ok(v1::Mode::Refund) => "refund",
                        _ => "try",
                    },
                    surface,
                    decision: decision_log::Answer {
                        allowed: o.allowed,
                        granted: o.granted,
                        remaining: Some(o.decision.remaining),
                        limited_by: o.limited_by.map(|l| l.as_str()),
                        limited_by_name: match o.limited_by {
                            Some(LimitedBy::Limit | LimitedBy::Tier) => o.limit_name.clone(),
                            _ => None,
                        },
                    },
                });
            }
            Ok(convert::rate_response(&o))
        }
        Err(e) => {
            m::error(surface, e.reason());
            Err(e)
        }
    }
}

/// The admin rule ([`crate::tokens::authorize`]) for an rpc: the bearer
/// token in the `authorization` metadata. Off is `NOT_FOUND`, a missing or
/// unknown token `UNAUTHENTICATED`, a `read` token that writes
/// `PERMISSION_DENIED`, each with the reason in `tollgate-reason`.
fn admin<S: Store, T>(
    app: &App<S>,
    request: &Request<T>,
    rpc: &str,
    write: bool,
) -> Result<crate::tokens::Caller, Status> {
    let authorization = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    crate::tokens::authorize(app.admin_tokens(), authorization, write).map_err(|refused| {
        let code = match refused {
            Refused::Off => tonic::Code::NotFound,
            Refused::Unauthenticated(_) => tonic::Code::Unauthenticated,
            Refused::Forbidden => tonic::Code::PermissionDenied,
        };
        if refused != Refused::Off {
            tracing::debug!(rpc, reason = refused.reason(), "admin rpc refused");
        }
        let mut s = Status::new(code, refused.message(rpc));
        if let Ok(v) = refused.reason().parse() {
            s.metadata_mut().insert(crate::errors::REASON_HEADER, v);
        }
        s
    })
}

/// `e` counted as a gRPC error, as a status.
fn failed(e: &ServiceError) -> Status {
    m::error("grpc", e.reason());
    status(e)
}

#[tonic::async_trait]
impl<S: Store> v1::tollgate_server::Tollgate for Native<S> {
    async fn request(
        &self,
        request: Request<v1::RateRequest>,
    ) -> Result<Response<v1::RateResponse>, Status> {
        let caller = self.app.caller_from_grpc(request.metadata());
        rate(&self.app, "grpc", request.get_ref().view(), &caller)
            .await
            .map(Response::new)
            .map_err(|e| status(&e))
    }

    async fn status(
        &self,
        _request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        let app = &self.app;
        let config = app.config_status();
        Ok(Response::new(v1::StatusResponse {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            store: app.store_name().to_owned(),
            uptime_ms: u64::try_from(app.uptime().as_millis()).unwrap_or(u64::MAX),
            ready: app.is_ready(),
            config_source: config.source.unwrap_or_default(),
            config_revision: config.revision,
            config_loaded_at_ms: config.loaded_at_ms,
            config_last_error: config.last_error,
            config_warnings: config.warnings,
            config_api_revision: config.api_revision,
            sessions_open: app.sessions().len() as u64,
            sessions_opened: app.sessions().opened(),
        }))
    }

    async fn inspect(
        &self,
        request: Request<v1::CountersRequest>,
    ) -> Result<Response<v1::CountersResponse>, Status> {
        admin(&self.app, &request, "Inspect", false)?;
        let r = request.get_ref();
        let counters = self
            .app
            .service()
            .inspect(&r.namespace, &r.resource, &r.domain)
            .await
            .map_err(|e| failed(&e))?;
        Ok(Response::new(convert::counters_response(
            &r.namespace,
            &r.resource,
            &r.domain,
            &counters,
        )))
    }

    async fn reset(
        &self,
        request: Request<v1::CountersRequest>,
    ) -> Result<Response<v1::ResetResponse>, Status> {
        let caller = admin(&self.app, &request, "Reset", true)?;
        let r = request.get_ref();
        let reset = self
            .app
            .service()
            .reset(&r.namespace, &r.resource, &r.domain)
            .await
            .map_err(|e| failed(&e))?;
        metrics::counter!(m::COUNTER_RESETS, "surface" => "grpc", "namespace" => r.namespace.clone(), "resource" => r.resource.clone())
            .increment(1);
        tracing::info!(
            namespace = %r.namespace,
            resource = %r.resource,
            domain = %r.domain,
            token = %caller.name,
            "counters reset"
        );
        Ok(Response::new(v1::ResetResponse {
            reset: u32::try_from(reset).unwrap_or(u32::MAX),
        }))
    }

    type SessionStream = Pin<Box<dyn Stream<Item = Result<v1::SessionResponse, Status>> + Send>>;

    async fn session(
        &self,
        request: Request<Streaming<v1::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let session = self.app.service().open(None).map_err(|e| status(&e))?;
        // Every operation of the session is a child of the trace the
        // stream was opened in.
        let caller = self.app.caller_from_grpc(request.metadata());
        let (tx, rx) = mpsc::channel(16);
        let app = Arc::clone(&self.app);
        let shutdown = self.shutdown.clone();
        let task = tokio::spawn(run_session(
            Arc::clone(&app),
            Arc::clone(&session),
            request.into_inner(),
            tx,
            shutdown,
            caller,
        ));
        // Should the task ever panic, its session must still end: a gRPC
        // session has no lease that would release its holds otherwise.
        tokio::spawn(async move {
            if task.await.is_err() {
                tracing::error!(session = %session.id(), "a session task failed; releasing its holds");
                app.service().close(&session).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Serves one session until its stream ends, then releases its holds.
async fn run_session<S: Store>(
    app: Arc<App<S>>,
    session: Arc<Session>,
    mut inbound: Streaming<v1::SessionRequest>,
    tx: mpsc::Sender<Result<v1::SessionResponse, Status>>,
    mut shutdown: watch::Receiver<bool>,
    caller: Caller,
) {
    let id = session.id();
    tracing::debug!(session = %id, "session opened");
    loop {
        let message = tokio::select! {
            m = inbound.next() => m,
            // The server is stopping: end the session as if closed.
            _ = shutdown.wait_for(|stop| *stop) => None,
            // The client stopped reading: nobody to answer.
            () = tx.closed() => None,
        };
        let Some(Ok(message)) = message else {
            if let Some(Err(e)) = message {
                tracing::debug!(session = %id, error = ?e.message(), "session stream broke");
                // The stream ends with the error (an oversized or undecodable
                // message), not with OK: the client must know its session,
                // and so its holds, are gone. Never waits: a client that
                // stopped reading does not get it.
                let _ = tx.try_send(Err(e));
            }
            break;
        };
        let reply = answer(&app, &session, message.op, &caller).await;
        let closing = matches!(reply, Some(Answer::Closed(_)));
        if closing {
            // Released before the answer (unless the store does not confirm
            // within the copy deadline; the releases go on regardless), so a
            // client that saw `closed` knows its holds are gone.
            app.service().close(&session).await;
        }
        let response = v1::SessionResponse {
            id: message.id,
            result: reply,
        };
        // A client that stopped reading fills the channel; the send must
        // not outlast a shutdown.
        let sent = tokio::select! {
            r = tx.send(Ok(response)) => r.is_ok(),
            _ = shutdown.wait_for(|stop| *stop) => false,
        };
        if !sent || closing {
            break;
        }
    }
    let closed = app.service().close(&session).await;
    tracing::debug!(session = %id, released = closed.released, "session ended");
}

/// Answers one session operation.
async fn answer<S: Store>(
    app: &App<S>,
    session: &Arc<Session>,
    op: Option<Op>,
    caller: &Caller,
) -> Option<Answer> {
    let via = Via {
        surface: "session",
        caller,
    };
    let result = match op {
        None => Err(ServiceError::Malformed(
            "a session request needs an operation".into(),
        )),
        Some(Op::Close(c)) => return Some(Answer::Closed(c)),
        Some(Op::Request(r)) => rate(app, "session", r.view(), caller)
            .await
            .map(Answer::Request),
        Some(Op::Reserve(r)) => reserve(app, session, &r, via).await.map(Answer::Reserve),
        Some(Op::Release(r)) => release(app, session, &r, via).await.map(Answer::Release),
        Some(Op::Transfer(r)) => transfer(app, session, &r, via).await.map(Answer::Transfer),
        Some(Op::Seize(r)) => seize(app, session, &r, via).await.map(Answer::Seize),
    };
    Some(result.unwrap_or_else(|e| {
        m::error("session", e.reason());
        Answer::Error(v1::Error {
            code: grpc_code(&e) as i32,
            reason: e.reason().to_owned(),
            message: crate::errors::message(&e),
        })
    }))
}

/// Where a copy operation came from, for its span: the surface (`session`
/// or `http`) and the caller's trace context.
#[derive(Clone, Copy, Debug)]
pub struct Via<'a> {
    /// The surface, as in the metrics.
    pub surface: &'static str,
    /// The caller's trace context.
    pub caller: &'a Caller,
}

/// A copy operation as its span names it.
struct CopyOp<'a> {
    /// When it began, when spans are on.
    started: Option<tollgate_core::Nanos>,
    /// The span's name (`tollgate.reserve`, ...).
    name: &'static str,
    /// The namespace and resource it acted on.
    target: (&'a str, &'a str),
    /// The copies it asked for.
    copies: u64,
}

impl Via<'_> {
    /// Records the span of copy operation `op`, which ended with `result`.
    fn record<S: Store, T>(
        self,
        app: &App<S>,
        op: CopyOp<'_>,
        result: &Result<T, ServiceError>,
        outcome: impl FnOnce(&T) -> (Outcome, u64),
    ) {
        let CopyOp {
            started,
            name,
            target,
            copies,
        } = op;
        let Some(started) = started else { return };
        let ended = app.now();
        let (outcome, granted) = match result {
            Ok(t) => outcome(t),
            Err(e) => (Outcome::Error(e.reason()), 0),
        };
        app.record_span(
            self.caller,
            (started, ended),
            &Decision {
                name,
                surface: self.surface,
                namespace: target.0,
                resource: Some(target.1),
                descriptors: None,
                hits: copies,
                granted,
                outcome,
            },
        );
    }
}

/// Copies named by a request: the groups it names, or any when it names
/// none.
fn groups(named: &[String]) -> Option<&[String]> {
    (!named.is_empty()).then_some(named)
}

/// Reserves into `session`.
pub async fn reserve<S: Store>(
    app: &App<S>,
    session: &Arc<Session>,
    r: &v1::ReserveRequest,
    via: Via<'_>,
) -> Result<v1::ReserveResponse, ServiceError> {
    let started = app.span_start();
    let reservation = app
        .service()
        .reserve(
            session,
            target(&r.namespace, &r.resource, &r.domain),
            Hits::between(r.min_copies.unwrap_or(r.copies), r.copies),
        )
        .await;
    via.record(
        app,
        CopyOp {
            started,
            name: "tollgate.reserve",
            target: (&r.namespace, &r.resource),
            copies: r.copies,
        },
        &reservation,
        |o| {
            let granted = o.reservation.granted;
            (Outcome::of_grant(granted > 0), granted)
        },
    );
    Ok(convert::reserve_response(&reservation?))
}

/// Releases from `session`.
pub async fn release<S: Store>(
    app: &App<S>,
    session: &Arc<Session>,
    r: &v1::ReleaseRequest,
    via: Via<'_>,
) -> Result<v1::ReleaseResponse, ServiceError> {
    let started = app.span_start();
    let done = app
        .service()
        .release(
            session,
            target(&r.namespace, &r.resource, &r.domain),
            groups(&r.groups),
            r.copies,
        )
        .await;
    via.record(
        app,
        CopyOp {
            started,
            name: "tollgate.release",
            target: (&r.namespace, &r.resource),
            copies: r.copies,
        },
        &done,
        |d| (Outcome::Done, d.released),
    );
    let done = done?;
    Ok(v1::ReleaseResponse {
        released: done.released,
        still_held: done.still_held,
    })
}

/// The longest a transfer may stay staged: copies nobody seizes are
/// released by then at the latest.
pub const MAX_TRANSFER_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// Transfers from `session`.
pub async fn transfer<S: Store>(
    app: &App<S>,
    session: &Arc<Session>,
    r: &v1::TransferRequest,
    via: Via<'_>,
) -> Result<v1::TransferResponse, ServiceError> {
    let started = app.span_start();
    let id = transfer_now(app, session, r).await;
    via.record(
        app,
        CopyOp {
            started,
            name: "tollgate.transfer",
            target: (&r.namespace, &r.resource),
            copies: r.copies,
        },
        &id,
        |_| (Outcome::Done, r.copies),
    );
    Ok(v1::TransferResponse {
        transfer_id: id?.to_string(),
    })
}

async fn transfer_now<S: Store>(
    app: &App<S>,
    session: &Arc<Session>,
    r: &v1::TransferRequest,
) -> Result<TransferId, ServiceError> {
    if r.ttl_ms == 0 {
        return Err(ServiceError::Malformed("ttl_ms must be at least 1".into()));
    }
    if r.ttl_ms > MAX_TRANSFER_TTL_MS {
        return Err(ServiceError::Malformed(format!(
            "ttl_ms must be at most {MAX_TRANSFER_TTL_MS} (24 h): staged copies nobody seizes are \
             held until then"
        )));
    }
    app.service()
        .transfer(
            session,
            target(&r.namespace, &r.resource, &r.domain),
            groups(&r.groups),
            r.copies,
            tollgate_core::Nanos::from_millis(r.ttl_ms),
        )
        .await
}

/// Seizes into `session`.
pub async fn seize<S: Store>(
    app: &App<S>,
    session: &Arc<Session>,
    r: &v1::SeizeRequest,
    via: Via<'_>,
) -> Result<v1::SeizeResponse, ServiceError> {
    let started = app.span_start();
    let seized = match r.transfer_id.parse::<TransferId>() {
        Ok(id) => app.service().seize(session, id).await,
        Err(e) => Err(ServiceError::Store(tollgate_store::StoreError::Copy(e))),
    }
    .map(|s| convert::seize_response(&s));
    // The names are the staged copies' (a seize names only the transfer).
    let (namespace, resource) = match &seized {
        Ok(s) => (s.namespace.as_str(), s.resource.as_str()),
        Err(_) => ("", ""),
    };
    via.record(
        app,
        CopyOp {
            started,
            name: "tollgate.seize",
            target: (namespace, resource),
            copies: seized.as_ref().map_or(0, |s| s.copies),
        },
        &seized,
        |s| (Outcome::Granted, s.copies),
    );
    seized
}

fn target<'a>(namespace: &'a str, resource: &'a str, domain: &'a str) -> Target<'a> {
    Target {
        namespace,
        resource,
        domain,
    }
}
