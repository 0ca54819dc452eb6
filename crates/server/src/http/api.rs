//! `/v1/*`: rate requests and holds of copy-limited resources.
//!
//! A hold is a session with a lease, opened by one reserve or one seize; it
//! therefore holds copies of one resource for one domain. Once it holds
//! nothing (everything released or transferred) it is closed, so its id is
//! unknown from then on, exactly as after its lease lapsed.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, StatusCode};
use tollgate_core::Nanos;
use tollgate_proto::json::RateRequestJson;
use tollgate_proto::{answer_json, v1, RateRequestView};
use tollgate_service::{Service, ServiceError, Session};
use tollgate_store::Store;

use super::body::{fail, parse_borrowed, read, ApiError, JsonBody, OptionalJsonBody, Parsed};
use super::{Http, TraceContext};
use crate::app::App;
use crate::errors::malformed;
use crate::native;
use crate::native::Via;

/// A hold's lease when the request names none.
const DEFAULT_LEASE_MS: u64 = 30_000;
/// The longest lease: a hold is meant to be renewed while in use, and a
/// forgotten one should not pin copies for days.
const MAX_LEASE_MS: u64 = 24 * 60 * 60 * 1000;

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// `POST /v1/request`: 200 when granted, 429 with `Retry-After` when not;
/// either with the RateLimit headers of `serve --http-ratelimit-headers`
/// ([`super::headers`]).
///
/// Served before the router (`super::direct_request`), so it reads its
/// own body and headers rather than through axum's extractors.
/// Its body is read with borrowed strings ([`RateRequestJson`]); a body
/// that form refuses is described as [`JsonBody`] would.
pub(super) async fn request<S: Store>(http: Http<S>, req: Request) -> Response {
    let caller = http.app.caller_from_http(req.headers());
    let answer = async {
        let bytes = read(req, &http).await?;
        match parse_borrowed::<RateRequestJson, v1::RateRequest>(&bytes)? {
            Parsed::Borrowed(req) => decide(&http, req.view(), &caller).await,
            Parsed::Owned(req) => decide(&http, req.view(), &caller).await,
        }
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

async fn decide<S: Store>(
    http: &Http<S>,
    req: RateRequestView<'_>,
    caller: &crate::spans::Caller,
) -> Result<Response, ApiError> {
    let answer = native::rate(&http.app, "http", req, caller)
        .await
        .map_err(|e| ApiError::service(&e))?;
    let form = http.app.rate_headers();
    if answer.allowed {
        let mut response = rate_json(StatusCode::OK, &answer);
        form.write(&answer, response.headers_mut());
        return Ok(response);
    }
    let retry = answer.retry_after_ns;
    let mut response = rate_json(StatusCode::TOO_MANY_REQUESTS, &answer);
    form.write(&answer, response.headers_mut());
    // Whole seconds, rounded up: retrying at the rounded-down second would
    // be rejected again.
    if let Some(ns) = retry.filter(|&ns| ns > 0) {
        let seconds = ns.div_ceil(NANOS_PER_SECOND);
        response
            .headers_mut()
            .insert(RETRY_AFTER, retry_after(seconds));
    }
    Ok(response)
}

/// `Retry-After: seconds`. Values below [`super::headers::SHARED`] are
/// made once and shared (static bytes: a clone copies a pointer), so a
/// rejection's answer does not allocate for its header; glibc then found
/// the freed header among its small chunks and consolidated them before
/// the connection's next read buffer, once per rejection
/// (docs/benchmarks.md, "Where a decision's time goes").
fn retry_after(seconds: u64) -> HeaderValue {
    super::headers::number(seconds)
}

/// A rate answer as JSON, written by [`answer_json`] (the bytes serde
/// would write, for a fraction of the cost).
fn rate_json(status: StatusCode, answer: &v1::RateResponse) -> Response {
    let mut body = Vec::with_capacity(answer_json::TYPICAL_RATE_RESPONSE_BYTES);
    answer_json::write_rate_response(answer, &mut body);
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `POST /v1/reserve`: a new hold with what was granted; 429 and no hold
/// when nothing was.
pub(super) async fn reserve<S: Store>(
    State(http): State<Http<S>>,
    TraceContext(caller): TraceContext,
    JsonBody(req): JsonBody<v1::ReserveRequest>,
) -> Result<Response, ApiError> {
    let app = &http.app;
    if req.copies == 0 {
        // It could only ever grant nothing, and a hold of nothing is no hold.
        return Err(fail(malformed("copies must be at least 1")));
    }
    let lease = lease(req.lease_ms).map_err(fail)?;
    let fresh = Fresh::open(app, lease)?;
    match native::reserve(app, &fresh.session, &req, http_via(&caller)).await {
        Ok(mut answer) if answer.granted > 0 => {
            answer.hold_id = fresh.keep().id().to_string();
            Ok(Json(answer).into_response())
        }
        Ok(answer) => Ok((StatusCode::TOO_MANY_REQUESTS, Json(answer)).into_response()),
        Err(e) => Err(fail(e)),
    }
}

/// `POST /v1/release`: gives back copies of a hold; an emptied hold ends.
pub(super) async fn release<S: Store>(
    State(http): State<Http<S>>,
    TraceContext(caller): TraceContext,
    JsonBody(req): JsonBody<v1::ReleaseRequest>,
) -> Result<Json<v1::ReleaseResponse>, ApiError> {
    let app = &http.app;
    let session = app.service().hold(&req.hold_id).map_err(fail)?;
    let answer = native::release(app, &session, &req, http_via(&caller))
        .await
        .map_err(fail)?;
    end_if_empty(app, &session);
    Ok(Json(answer))
}

/// `POST /v1/transfer`: stages copies of a hold for another client; an
/// emptied hold ends (the staged copies live on in the store until seized
/// or their ttl ends).
pub(super) async fn transfer<S: Store>(
    State(http): State<Http<S>>,
    TraceContext(caller): TraceContext,
    JsonBody(req): JsonBody<v1::TransferRequest>,
) -> Result<Json<v1::TransferResponse>, ApiError> {
    let app = &http.app;
    let session = app.service().hold(&req.hold_id).map_err(fail)?;
    let answer = native::transfer(app, &session, &req, http_via(&caller))
        .await
        .map_err(fail)?;
    end_if_empty(app, &session);
    Ok(Json(answer))
}

/// `POST /v1/seize`: takes staged copies into a new hold.
pub(super) async fn seize<S: Store>(
    State(http): State<Http<S>>,
    TraceContext(caller): TraceContext,
    JsonBody(req): JsonBody<v1::SeizeRequest>,
) -> Result<Json<v1::SeizeResponse>, ApiError> {
    let app = &http.app;
    if req.transfer_id.is_empty() {
        return Err(fail(malformed("transfer_id is required")));
    }
    let lease = lease(req.lease_ms).map_err(fail)?;
    let fresh = Fresh::open(app, lease)?;
    let mut answer = native::seize(app, &fresh.session, &req, http_via(&caller))
        .await
        .map_err(fail)?;
    answer.hold_id = fresh.keep().id().to_string();
    Ok(Json(answer))
}

/// `POST /v1/holds/{id}/renew`'s optional body.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct Renew {
    /// The new lease; absent: the hold's current one.
    lease_ms: Option<u64>,
}

/// `POST /v1/holds/{id}/renew`'s answer.
#[derive(Debug, serde::Serialize)]
pub(super) struct Renewed {
    hold_id: String,
    /// When the hold now lapses (Unix ms).
    expires_at_ms: u64,
}

/// `POST /v1/holds/{id}/renew`: the hold now lapses a lease from now.
pub(super) async fn renew<S: Store>(
    State(http): State<Http<S>>,
    id: Result<Path<String>, PathRejection>,
    OptionalJsonBody(body): OptionalJsonBody<Renew>,
) -> Result<Json<Renewed>, ApiError> {
    let app = &http.app;
    let id = path(id)?;
    let ttl = match body.and_then(|b| b.lease_ms) {
        Some(ms) => Some(lease(Some(ms)).map_err(fail)?),
        None => None,
    };
    let at = app.service().renew(&id, ttl).map_err(fail)?;
    Ok(Json(Renewed {
        hold_id: id,
        expires_at_ms: at.as_u64() / 1_000_000,
    }))
}

/// `DELETE /v1/holds/{id}`'s answer.
#[derive(Debug, serde::Serialize)]
pub(super) struct Dropped {
    /// Copies the hold held, all released or being released.
    released: u64,
    /// The store had not confirmed every release within the copy deadline
    /// (they go on until it does).
    pending: bool,
}

/// `DELETE /v1/holds/{id}`: releases everything the hold holds.
pub(super) async fn drop_hold<S: Store>(
    State(http): State<Http<S>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Dropped>, ApiError> {
    let app = &http.app;
    let session = app.service().hold(&path(id)?).map_err(fail)?;
    let closed = app.service().close(&session).await;
    Ok(Json(Dropped {
        released: closed.released,
        pending: closed.pending,
    }))
}

fn http_via(caller: &crate::spans::Caller) -> Via<'_> {
    Via {
        surface: "http",
        caller,
    }
}

/// The service answers an empty namespace with "unknown namespace ``" and,
/// in a namespace that allows unconfigured resources, grants an empty
/// resource name; both are almost surely a client's missing field.
fn lease(ms: Option<u64>) -> Result<Nanos, ServiceError> {
    match ms.unwrap_or(DEFAULT_LEASE_MS) {
        0 => Err(malformed("lease_ms must be at least 1")),
        ms if ms > MAX_LEASE_MS => Err(malformed(format!(
            "lease_ms must be at most {MAX_LEASE_MS} (24 h); renew the hold to keep it longer"
        ))),
        ms => Ok(Nanos::from_millis(ms)),
    }
}

fn path(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    id.map(|Path(id)| id)
        .map_err(|e| fail(malformed(format!("bad hold id in the path: {e}"))))
}

/// A hold opened by this request: ended (releasing whatever it got) unless
/// its id reaches the client, also when the handler's future is dropped
/// because the client hung up.
struct Fresh<S: Store> {
    service: Arc<Service<S>>,
    session: Arc<Session>,
    keep: bool,
}

impl<S: Store> Fresh<S> {
    fn open(app: &App<S>, lease: Nanos) -> Result<Fresh<S>, ApiError> {
        let session = app.service().open(Some(lease)).map_err(fail)?;
        Ok(Fresh {
            service: Arc::clone(app.service()),
            session,
            keep: false,
        })
    }

    /// The hold is the client's now.
    fn keep(mut self) -> Arc<Session> {
        self.keep = true;
        Arc::clone(&self.session)
    }
}

impl<S: Store> Drop for Fresh<S> {
    fn drop(&mut self) {
        if !self.keep {
            self.service.end(&self.session);
        }
    }
}

fn end_if_empty<S: Store>(app: &App<S>, session: &Session) {
    // Nothing adds to an existing hold (reserve and seize open new ones),
    // so empty now is empty for good.
    if session.held() == 0 {
        app.service().end(session);
    }
}

#[cfg(test)]
mod tests {
    use super::retry_after;

    #[test]
    fn retry_after_writes_every_number_shared_or_not() {
        for s in [0, 1, 59, 60, 61, 3600, u64::MAX] {
            assert_eq!(retry_after(s).to_str().ok(), Some(s.to_string().as_str()));
        }
    }
}
