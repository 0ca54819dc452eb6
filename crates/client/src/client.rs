//! The client: rate requests and holds with retries, fail-open and the
//! kill switch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate_proto::v1::{self, session_request::Op, session_response::Result as Answer};

use crate::backoff::RetryHint;
use crate::config::ClientConfig;
use crate::error::{Error, Rejected, Rejection};
use crate::hold::Hold;
use crate::metrics as m;
use crate::outage::Outage;
use crate::session::{Delivered, Failure, Server, Session};

/// How a call was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A server granted it.
    Server,
    /// No server answered (unreachable, timed out, or failed with a server
    /// error such as `store_unavailable`): granted the minimum without a
    /// server (Charon §4.3's degraded mode). A server that answered and
    /// refused (too many sessions, store at capacity) is never taken for
    /// this: see [`Error::AtCapacity`]. The grant's (or hold's) outage
    /// says which servers were tried and how each failed.
    Degraded,
    /// A server rejected it and the kill switch turned the rejection into
    /// a grant of the minimum.
    KillSwitch,
}

/// A granted rate request.
///
/// Non-exhaustive: only the client makes one, and later versions may say
/// more about a grant without breaking callers that read its fields.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Grant {
    /// Hits granted (`min_hits` when degraded or overridden).
    pub granted: u64,
    /// Who granted it.
    pub via: Via,
    /// The server's answer (`None` when degraded; the rejection when
    /// overridden).
    pub response: Option<v1::RateResponse>,
    /// Requests sent, the first included.
    pub attempts: u32,
    /// Time spent, sleeps included.
    pub waited: Duration,
    /// Why no server answered, when [`Via::Degraded`]: every server
    /// tried, each with its error. `None` otherwise.
    pub outage: Option<Outage>,
}

impl Grant {
    /// Granted without the server's say-so (degraded or kill switch).
    pub fn is_degraded(&self) -> bool {
        self.via == Via::Degraded
    }
}

/// A client of one or several tollgate servers. Cheap to clone: clones
/// share the sessions.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: ClientConfig,
    servers: Vec<Server>,
    /// The server that answered last: tried first.
    preferred: AtomicU64,
    /// When the last "degraded" line was logged (clock ms + 1; 0: never).
    logged: AtomicU64,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// At most one "degraded" log line per this long.
const LOG_EVERY: Duration = Duration::from_secs(10);

impl Client {
    /// A client of `config.endpoints`. Connects lazily: the first call
    /// opens the session, so a client made while the servers are down
    /// works (degraded) and recovers by itself.
    pub fn new(config: ClientConfig) -> Result<Client, Error> {
        if config.endpoints.is_empty() {
            return Err(Error::Invalid("no server endpoints given".to_owned()));
        }
        let servers = config
            .endpoints
            .iter()
            .map(|e| Server::new(e, &config))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::Invalid)?;
        Ok(Client {
            inner: Arc::new(Inner {
                config,
                servers,
                preferred: AtomicU64::new(0),
                logged: AtomicU64::new(0),
            }),
        })
    }

    /// The settings the client was made with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// A rate request for `resource` on behalf of `domain`; set the hits
    /// and the wait, then [`RequestBuilder::send`].
    pub fn request(&self, namespace: &str, resource: &str, domain: &str) -> RequestBuilder {
        RequestBuilder {
            client: self.clone(),
            request: v1::RateRequest {
                namespace: namespace.to_owned(),
                resource: resource.to_owned(),
                domain: domain.to_owned(),
                hits: Some(tollgate_proto::DEFAULT_HITS),
                min_hits: None,
                mode: v1::Mode::Try as i32,
                limit: None,
            },
            max_wait: Duration::ZERO,
        }
    }

    /// A hold of copies of `resource` on behalf of `domain`; set the
    /// copies and the wait, then [`HoldBuilder::send`].
    pub fn hold(&self, namespace: &str, resource: &str, domain: &str) -> HoldBuilder {
        HoldBuilder {
            client: self.clone(),
            request: v1::ReserveRequest {
                namespace: namespace.to_owned(),
                resource: resource.to_owned(),
                domain: domain.to_owned(),
                copies: 1,
                min_copies: None,
                lease_ms: None,
            },
            max_wait: Duration::ZERO,
        }
    }

    /// Takes the copies another client staged with
    /// [`Hold::transfer`](crate::Hold::transfer), into a hold on this
    /// client's session. A transfer is known only to the servers that
    /// share its store, so seizing is never failed open: an unreachable
    /// server is an error.
    pub async fn seize(&self, transfer_id: &str) -> Result<Hold, Error> {
        let op = Op::Seize(v1::SeizeRequest {
            transfer_id: transfer_id.to_owned(),
            lease_ms: None,
        });
        match self.inner.call(op).await.map(|(d, s)| (d.claim(), s)) {
            Ok((Answer::Seize(s), Some(session))) => Ok(Hold::on_server(
                session,
                s.namespace,
                s.resource,
                s.domain,
                s.copies,
                s.groups,
                None,
            )),
            Ok(_) => Err(wrong_kind()),
            Err(Call::Refused(f)) => Err(refused(f)),
            Err(Call::Unavailable(outage)) => Err(outage.into()),
        }
    }

    /// The first answering server's status (version, store, readiness,
    /// config revision, sessions).
    pub async fn status(&self) -> Result<(String, v1::StatusResponse), Error> {
        let mut outage = Outage::default();
        for server in &self.inner.servers {
            match server.status(self.inner.config.request_timeout).await {
                Ok(s) => return Ok((server.name.clone(), s)),
                Err(f) if f.is_client_error() || f.is_refusal() => return Err(refused(f)),
                Err(f) => outage.push(&server.name, f),
            }
        }
        Err(outage.into())
    }
}

/// One attempt's answer, as the caller of [`Inner::retry`] reads it.
// Moved once per attempt and matched at once; a box would cost an
// allocation per rejection to save that move.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Read<T> {
    /// Granted: what the caller keeps.
    Granted(T),
    /// Rejected, and what the server said about retrying.
    Rejected(Rejected, RetryHint),
}

/// How a call of [`Inner::retry`] ended without an error.
pub(crate) enum Ended<T> {
    /// A server granted it.
    Granted(T),
    /// No server answered: grant the minimum, degraded, saying why.
    Degraded(Outage),
    /// A server rejected it and the kill switch grants the minimum.
    Overridden(Rejected),
}

/// An answer that does not match its question (a server bug).
pub(crate) fn wrong_kind() -> Error {
    Error::WrongAnswer
}

/// Why a call did not reach an answer.
pub(crate) enum Call {
    /// A server answered with a refusal: the caller's mistake, or (when
    /// every server that answered refused) want of room. Not failed open.
    Refused(Failure),
    /// No server answered (or every one failed with a server error):
    /// each server tried, with its failure.
    Unavailable(Outage),
}

/// The error a refusing answer ends a call with.
pub(crate) fn refused(f: Failure) -> Error {
    match f {
        Failure::Status {
            code: tonic::Code::ResourceExhausted,
            reason,
            message,
        } => Error::AtCapacity { reason, message },
        Failure::Status {
            code,
            reason,
            message,
        } => Error::Refused {
            code,
            reason,
            message,
        },
        // Never a refusal (is_refusal, is_client_error): callers keep
        // these in an outage under their server's name before.
        f @ (Failure::Unreachable(_) | Failure::Tls(_)) => Outage::one("a server", f).into(),
    }
}

impl Inner {
    /// Sends `op` to the preferred server, then to the others in order,
    /// until one answers. A rate request goes as a unary call and needs no
    /// session (the session in the answer is `None`); every other
    /// operation goes on the server's session. A client error ends the
    /// call at once; a refusal (the server is up but has no room) tries
    /// the next server, and ends the call only when no server granted;
    /// only when no server answered at all is the call unavailable.
    pub(crate) async fn call(&self, op: Op) -> Result<(Delivered, Option<Arc<Session>>), Call> {
        let n = self.servers.len();
        let first = self.preferred.load(Ordering::Relaxed) as usize % n.max(1);
        let mut outage = Outage::default();
        let mut refusal = None;
        for i in 0..n {
            let index = (first + i) % n;
            let server = &self.servers[index];
            let attempt = match &op {
                Op::Request(r) => server
                    .request(r.clone(), self.config.request_timeout)
                    .await
                    .map(|answer| (Delivered::unguarded(Answer::Request(answer)), None)),
                _ => self
                    .on_session(server, op.clone())
                    .await
                    .map(|(answer, session)| (answer, Some(session))),
            };
            match attempt {
                Ok(answered) => {
                    self.preferred.store(index as u64, Ordering::Relaxed);
                    metrics::gauge!(m::SERVING).set(1.0);
                    return Ok(answered);
                }
                Err(f) if f.is_client_error() => return Err(Call::Refused(f)),
                // Up, but full: another server may have room.
                Err(f) if f.is_refusal() => refusal = Some(f),
                // Unreachable, or a server error: another server may do
                // better.
                Err(f) => outage.push(&server.name, f),
            }
        }
        if let Some(f) = refusal {
            metrics::gauge!(m::SERVING).set(1.0);
            return Err(Call::Refused(f));
        }
        metrics::gauge!(m::SERVING).set(0.0);
        Err(Call::Unavailable(outage))
    }

    /// Sends `op` on `server`'s session (opening one if needed). A session
    /// that did not answer is dropped, and the server backs off.
    async fn on_session(
        &self,
        server: &Server,
        op: Op,
    ) -> Result<(Delivered, Arc<Session>), Failure> {
        let session = server.session().await?;
        match session.call(op, None, self.config.request_timeout).await {
            Ok(answer) => Ok((answer, session)),
            Err(f) => {
                if f.is_unanswered() || !session.is_alive() {
                    server.failed(&session, &f);
                }
                Err(f)
            }
        }
    }

    /// Sends `op` until a server grants it, backing off after rejections
    /// until `max_wait` is spent (Charon §3.2); `read` tells a grant from a
    /// rejection (and its retry hint). When no server answers, the call
    /// fails open (or errs, with fail-open off); when one rejects and the
    /// kill switch is on, the rejection is overridden. Returns how it
    /// ended, the attempts and the time spent.
    async fn retry<T>(
        &self,
        what: &'static str,
        op: &Op,
        max_wait: Duration,
        mut read: impl FnMut(Answer, Option<Arc<Session>>) -> Result<Read<T>, Error>,
    ) -> Result<(Ended<T>, u32, Duration), Error> {
        let clock = Arc::clone(&self.config.timer);
        let start = clock.now();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            // Claimed at once: a grant is the caller's from here (nothing
            // between this and the caller's hold can be cancelled), and a
            // rejection holds nothing.
            let (answer, session) = match self.call(op.clone()).await {
                Ok((delivered, session)) => (delivered.claim(), session),
                Err(Call::Refused(f)) => return Err(refused(f)),
                Err(Call::Unavailable(outage)) => {
                    if !self.config.fail_open {
                        return Err(outage.into());
                    }
                    self.degraded(what, &outage);
                    let waited = clock.now().saturating_sub(start);
                    return Ok((Ended::Degraded(outage), attempts, waited));
                }
            };
            let waited = clock.now().saturating_sub(start);
            let (last, hint) = match read(answer, session)? {
                Read::Granted(granted) => return Ok((Ended::Granted(granted), attempts, waited)),
                Read::Rejected(last, hint) => (last, hint),
            };
            if self.config.kill_switch {
                metrics::counter!(m::OVERRIDDEN, "op" => what).increment(1);
                return Ok((Ended::Overridden(last), attempts, waited));
            }
            let sleep =
                self.config
                    .backoff
                    .sleep(attempts, waited, max_wait, hint, &mut rand::rng());
            let Some(sleep) = sleep else {
                return Err(Error::Rejected(Box::new(Rejection {
                    attempts,
                    waited,
                    last,
                })));
            };
            metrics::counter!(m::RETRIES, "op" => what).increment(1);
            clock.sleep(sleep).await;
        }
    }

    /// Logs that a call failed open, at most once per [`LOG_EVERY`].
    fn degraded(&self, op: &'static str, why: &Outage) {
        metrics::counter!(m::DEGRADED, "op" => op).increment(1);
        let now = u64::try_from(self.config.timer.now().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = self.logged.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= LOG_EVERY.as_millis() as u64;
        if due
            && self
                .logged
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(op, reason = %why, "no tollgate server answered; granting the minimum (degraded)");
        }
    }
}

impl Server {
    async fn status(&self, timeout: Duration) -> Result<v1::StatusResponse, Failure> {
        let channel = self.channel().await?;
        let mut grpc = v1::tollgate_client::TollgateClient::new(channel);
        let deadline = tokio::time::Instant::now() + timeout;
        match tokio::time::timeout_at(deadline, grpc.status(v1::StatusRequest {})).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(self
                .diagnose(crate::session::status_failure(&s), deadline)
                .await),
            Err(_) => Err(Failure::Unreachable(format!(
                "did not answer within {timeout:?}"
            ))),
        }
    }
}

/// A rate request being built: see [`Client::request`].
#[derive(Debug)]
#[must_use = "a request does nothing until sent"]
pub struct RequestBuilder {
    client: Client,
    request: v1::RateRequest,
    max_wait: Duration,
}

impl RequestBuilder {
    /// Hits wanted (default 1). 0 is a probe: it counts nothing and
    /// answers with the current context.
    pub fn hits(mut self, hits: u64) -> Self {
        self.request.hits = Some(hits);
        self
    }

    /// Fewest hits worth having (default: all of them).
    pub fn min_hits(mut self, min: u64) -> Self {
        self.request.min_hits = Some(min);
        self
    }

    /// A limit of the request's own: `requests_per_unit` per `unit`
    /// (`second` to `year`), in place of the resource's algorithm. The
    /// server takes it only for a resource with `allow_override: true`,
    /// up to its `override_max`, and refuses it otherwise
    /// (`invalid_limit_override`).
    pub fn limit(mut self, requests_per_unit: u64, unit: &str) -> Self {
        self.request.limit = Some(v1::LimitOverride {
            requests_per_unit,
            unit: unit.to_owned(),
        });
        self
    }

    /// Longest time to keep retrying after rejections (default zero: one
    /// attempt).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Makes it a report: the hits were already used (an LLM answer's
    /// tokens, counted once it is out), so the server charges them even
    /// past the limit, into a debt bounded by the resource's `max_debt`,
    /// and never rejects. The grant's `granted` is how many were charged
    /// (fewer when the bound clamped the report). Check before with an
    /// estimate ([`RequestBuilder::send`] as usual), report the rest after.
    pub fn report(mut self) -> Self {
        self.request.mode = v1::Mode::Report as i32;
        self
    }

    /// Makes it a refund: gives back hits taken and not used (an estimate
    /// checked before that turned out too high), never past a fresh
    /// state. The grant's `granted` is how many were given back.
    pub fn refund(mut self) -> Self {
        self.request.mode = v1::Mode::Refund as i32;
        self
    }

    /// Sends it, backing off after rejections until `max_wait` is spent
    /// (a report or a refund is never rejected, so it is sent once). When
    /// no server answers, a report or refund comes back degraded: nothing
    /// was recorded.
    pub async fn send(self) -> Result<Grant, Error> {
        let RequestBuilder {
            client,
            request,
            max_wait,
        } = self;
        let min = request.min_hits_or_default();
        if min > request.hits_or_default() {
            return Err(Error::Invalid(format!(
                "min_hits {min} is more than hits {}",
                request.hits_or_default()
            )));
        }
        let op = Op::Request(request);
        let (ended, attempts, waited) = client
            .inner
            .retry("request", &op, max_wait, |answer, _| match answer {
                Answer::Request(r) if r.allowed => Ok(Read::Granted(r)),
                Answer::Request(r) => {
                    let hint = match r.retry_after_ns {
                        Some(ns) => RetryHint::After(Duration::from_nanos(ns)),
                        None => RetryHint::Never,
                    };
                    Ok(Read::Rejected(Rejected::Rate(r), hint))
                }
                _ => Err(wrong_kind()),
            })
            .await?;
        let (granted, via, response, outage) = match ended {
            Ended::Granted(r) => (r.granted, Via::Server, Some(r), None),
            Ended::Degraded(outage) => (min, Via::Degraded, None, Some(outage)),
            Ended::Overridden(last) => {
                let response = match last {
                    Rejected::Rate(r) => Some(r),
                    Rejected::Hold(_) => None,
                };
                (min, Via::KillSwitch, response, None)
            }
        };
        Ok(Grant {
            granted,
            via,
            response,
            attempts,
            waited,
            outage,
        })
    }
}

/// A hold being built: see [`Client::hold`].
#[derive(Debug)]
#[must_use = "a hold does nothing until sent"]
pub struct HoldBuilder {
    client: Client,
    request: v1::ReserveRequest,
    max_wait: Duration,
}

impl HoldBuilder {
    /// Copies wanted (default 1).
    pub fn copies(mut self, copies: u64) -> Self {
        self.request.copies = copies;
        self
    }

    /// Fewest copies worth having (default: all of them).
    pub fn min_copies(mut self, min: u64) -> Self {
        self.request.min_copies = Some(min);
        self
    }

    /// Longest time to keep retrying after rejections (default zero: one
    /// attempt).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Reserves, backing off after rejections until `max_wait` is spent.
    /// The hold releases what it still holds when dropped.
    pub async fn send(self) -> Result<Hold, Error> {
        let HoldBuilder {
            client,
            request,
            max_wait,
        } = self;
        let min = request.min_copies.unwrap_or(request.copies);
        if request.copies == 0 || min > request.copies {
            return Err(Error::Invalid(format!(
                "a hold needs 1 ≤ min_copies ≤ copies (got copies {}, min_copies {min})",
                request.copies
            )));
        }
        let op = Op::Reserve(request.clone());
        let (ended, attempts, waited) = client
            .inner
            .retry("reserve", &op, max_wait, |answer, session| match answer {
                Answer::Reserve(r) if r.allowed => match session {
                    Some(session) => Ok(Read::Granted((r, session))),
                    None => Err(wrong_kind()),
                },
                Answer::Reserve(r) => Ok(Read::Rejected(Rejected::Hold(r), RetryHint::None)),
                _ => Err(wrong_kind()),
            })
            .await?;
        let (via, outage) = match ended {
            Ended::Granted((response, session)) => {
                return Ok(Hold::on_server(
                    session,
                    request.namespace,
                    request.resource,
                    request.domain,
                    response.granted,
                    response.groups.clone(),
                    Some((response, attempts, waited)),
                ))
            }
            Ended::Degraded(outage) => (Via::Degraded, Some(outage)),
            Ended::Overridden(_) => (Via::KillSwitch, None),
        };
        Ok(Hold::local(
            &request.namespace,
            &request.resource,
            &request.domain,
            min,
            via,
            attempts,
            waited,
        )
        .with_outage(outage))
    }
}
