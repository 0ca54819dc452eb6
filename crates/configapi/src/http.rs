//! The HTTP API. Every `/v1` route needs a bearer token (`Authorization:
//! Bearer TOKEN`): reads any token, writes an `admin` one, and every caller
//! is rate limited by tollgate's own token bucket. The web page (`/`,
//! `/ui`) and the health checks need none: the page holds no data, it asks
//! for a token and calls `/v1` with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::watch;
use tollgate_core::algorithms::token_bucket::TokenBucketState;
use tollgate_core::message::bounded;
use tollgate_core::{Algorithm, Clock, Hits, Nanos, TokenBucket};

use crate::auth::{Caller, Role, Tokens};
use crate::error::ApiError;
use crate::normalize::{self, NamespaceFlags};
use crate::precondition::{etag, Precondition};
use crate::store::{Change, Db};

/// What the handlers share.
#[derive(Clone)]
pub struct Api {
    db: Db,
    tokens: Arc<Tokens>,
    /// The time the rate limit reads: the database's clock ([`Db::clock`]).
    clock: Arc<dyn Clock>,
    limiter: Arc<CallerBuckets>,
    revision: watch::Sender<i64>,
    /// The last database check and when it was made: `/readyz` needs no
    /// token, so it must not let strangers load the database.
    ready: Arc<Mutex<Option<(tokio::time::Instant, bool)>>>,
    /// The limiting servers' live usage (`GET /v1/usage`).
    usage: crate::usage::Board,
}

/// Why an [`Api`] could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The rate limit's parameters.
    #[error(transparent)]
    RateLimit(#[from] tollgate_core::ParamError),
    /// The database's revision could not be read.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The API's own rate limit: one token bucket per caller (per token name;
/// requests without a valid token share one bucket).
struct CallerBuckets {
    bucket: TokenBucket,
    states: Mutex<HashMap<String, TokenBucketState>>,
}

impl CallerBuckets {
    fn allow(&self, who: &str, now: Nanos) -> Option<Duration> {
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        if states.len() > 10_000 {
            states.retain(|_, s| !self.bucket.is_idle(s, now));
        }
        let state = states
            .entry(who.to_owned())
            .or_insert_with(|| self.bucket.fresh());
        let d = self.bucket.decide(state, now, Hits::exactly(1));
        if d.allowed {
            None
        } else {
            Some(Duration::from_nanos(
                d.retry_after.map_or(1_000_000_000, |n| n.as_u64()),
            ))
        }
    }
}

impl Api {
    /// The API over `db`, with `tokens`, allowing each caller `burst`
    /// requests at once and `per_second` after that. Time is read from
    /// the database's clock ([`Db::clock`]), so the audit trail and the
    /// rate limit agree.
    pub async fn new(
        db: Db,
        tokens: Tokens,
        per_second: u64,
        burst: u64,
    ) -> Result<Api, SetupError> {
        let rate = tollgate_core::Rate::new(per_second.max(1), tollgate_core::Nanos::from_secs(1))?;
        let bucket = TokenBucket::new(burst.max(1), rate)?;
        let revision = db.revision().await?;
        let (tx, _) = watch::channel(revision);
        Ok(Api {
            clock: Arc::clone(db.clock()),
            db,
            tokens: Arc::new(tokens),
            limiter: Arc::new(CallerBuckets {
                bucket,
                states: Mutex::new(HashMap::new()),
            }),
            revision: tx,
            ready: Arc::new(Mutex::new(None)),
            usage: crate::usage::Board::new(Vec::new(), 0),
        })
    }

    /// Serves `board` at `GET /v1/usage` (the binary keeps it refreshed
    /// from the servers `--servers` names).
    pub fn with_usage(mut self, board: crate::usage::Board) -> Api {
        self.usage = board;
        self
    }

    /// Follows the database's revision (changes made through other
    /// instances of the API sharing it), so long polls wake for them too.
    pub fn watch_database(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let api = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Ok(r) = api.db.revision().await {
                    api.changed(r);
                }
            }
        })
    }

    /// Wakes the long polls when `revision` is newer than the last seen.
    fn changed(&self, revision: i64) {
        self.revision.send_if_modified(|cur| {
            let newer = revision > *cur;
            if newer {
                *cur = revision;
            }
            newer
        });
    }

    /// The router, serving `extra`'s routes too (the binary's `/metrics`,
    /// when it serves one), with the same error shape. The paths of
    /// `extra` join the list of endpoints a 404 names, so the list says
    /// what this process serves.
    pub fn router(self, extra: Vec<(&'static str, MethodRouter)>) -> Router {
        let v1 = Router::new()
            .route("/v1/namespaces", get(list_namespaces))
            .route(
                "/v1/namespaces/{ns}",
                get(get_namespace)
                    .put(put_namespace)
                    .delete(delete_namespace),
            )
            .route(
                "/v1/namespaces/{ns}/resources/{r}",
                get(get_resource).put(put_resource).delete(delete_resource),
            )
            .route(
                "/v1/namespaces/{ns}/resources/{r}/domains/{d}",
                get(get_domain).put(put_domain).delete(delete_domain),
            )
            .route(
                "/v1/namespaces/{ns}/resources/{r}/groups/{g}",
                axum::routing::put(put_group).delete(delete_group),
            )
            .route(
                "/v1/namespaces/{ns}/resources/{r}/groups/{g}/members/{m}",
                axum::routing::put(put_member).delete(delete_member),
            )
            .route("/v1/config", get(delta))
            .route("/v1/snapshot", get(snapshot))
            .route("/v1/config/wait", get(wait))
            .route("/v1/export", get(export))
            .route("/v1/import", axum::routing::post(import))
            .route("/v1/audit", get(audit))
            .route("/v1/whoami", get(whoami))
            .route("/v1/usage", get(usage))
            .route_layer(middleware::from_fn_with_state(self.clone(), authenticate));
        let mut api = Router::new()
            .merge(v1)
            .route("/healthz", get(|| async { "ok" }))
            .route("/", get(crate::ui::page))
            .route("/ui", get(crate::ui::page))
            .route("/readyz", get(readyz))
            .with_state(self);
        let paths: Vec<&str> = extra.iter().map(|(path, _)| *path).collect();
        let served: Arc<str> = endpoints(&paths).into();
        for (path, route) in extra {
            api = api.route(path, route);
        }
        let api = api
            .fallback(move |uri: axum::http::Uri| std::future::ready(no_endpoint(&uri, &served)));
        // Around the whole router, not layered onto each route: a route's
        // `Allow` header is added outside its layers, and the 405's
        // message lists it.
        Router::new()
            .fallback_service(api)
            .layer(middleware::from_fn(errors_as_json))
    }
}

/// The longest text of one of axum's own rejections kept in the message.
const REJECTION_TEXT_BYTES: usize = 1024;

/// What the API serves, `extra` (the paths the binary mounts) included,
/// for the message of a request to a path it does not: the caller learns
/// where to go instead of an empty 404.
fn endpoints(extra: &[&str]) -> String {
    let mut served = vec![
        "/v1/namespaces[/{ns}[/resources/{r}[/domains/{d} | /groups/{g}[/members/{m}]]]]",
        "/v1/config",
        "/v1/config/wait",
        "/v1/snapshot",
        "/v1/export",
        "/v1/import",
        "/v1/audit",
        "/v1/whoami",
        "/v1/usage",
        "/healthz",
        "/readyz",
    ];
    served.extend_from_slice(extra);
    format!(
        "{} and the web page at / (docs/config-api.md)",
        served.join(", ")
    )
}

/// A path the API does not serve: 404 `not_found`, naming the path and
/// the endpoints there are (`served`). The only place a 404 for a path
/// is made: [`errors_as_json`] leaves this JSON answer as it is.
fn no_endpoint(uri: &axum::http::Uri, served: &str) -> ApiError {
    ApiError::not_found(bounded(format!(
        "no endpoint at {}; the config API serves {served}",
        uri.path()
    )))
}

/// Gives axum's own refusals the API's error shape: a body that is not
/// UTF-8 (`/v1/import`), a path segment that is not valid percent-encoding,
/// a body over the limit, a method a path does not take. axum answers
/// those in plain text (or with an empty body) before any handler runs,
/// and clients of this API parse one shape. A 405 names the method and
/// the ones the path takes (also in `Allow`).
async fn errors_as_json(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !status.is_client_error() || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, REJECTION_TEXT_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let allowed = parts
        .headers
        .get(header::ALLOW)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(',').map(str::trim).collect::<Vec<_>>().join(", "));
    let message = match (status, allowed) {
        (StatusCode::METHOD_NOT_ALLOWED, Some(allowed)) => {
            format!("{path} does not take {method}; it takes {allowed}")
        }
        _ if text.is_empty() => format!(
            "{method} {path}: {}",
            status
                .canonical_reason()
                .unwrap_or("refused")
                .to_lowercase()
        ),
        _ => text,
    };
    let reason = match status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        _ => "malformed_request",
    };
    let message = bounded(message);
    let mut answer = ApiError::new(status, reason, message).into_response();
    // Keep what tells the client what to do next (`Allow`, `Retry-After`).
    for name in [header::ALLOW, header::RETRY_AFTER] {
        if let Some(v) = parts.headers.get(&name) {
            answer.headers_mut().insert(name, v.clone());
        }
    }
    answer
}

/// Checks the bearer token and the caller's rate; hands the caller on.
async fn authenticate(
    State(api): State<Api>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(tollgate_auth::bearer);
    let caller = token.and_then(|t| api.tokens.check(t));
    let who = match &caller {
        Some(c) => format!("token:{}", c.name),
        None => "anonymous".to_owned(),
    };
    if let Some(wait) = api.limiter.allow(&who, api.clock.now()) {
        let mut r = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!("too many requests; retry in {} ms", wait.as_millis().max(1)),
        )
        .into_response();
        if let Ok(v) = header::HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return Ok(r);
    }
    let Some(caller) = caller else {
        let reason = if token.is_some() {
            "the bearer token is not known"
        } else {
            "an `Authorization: Bearer TOKEN` header is required"
        };
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            reason,
        ));
    };
    let writes = !matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if writes && caller.role != Role::Admin {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "token {:?} may only read; changes need an admin token",
                caller.name
            ),
        ));
    }
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}

async fn readyz(State(api): State<Api>) -> Response {
    let cached = *api.ready.lock().unwrap_or_else(PoisonError::into_inner);
    let ready = match cached {
        Some((at, ready)) if at.elapsed() < Duration::from_secs(1) => ready,
        _ => {
            let ready = api.db.ping().await;
            *api.ready.lock().unwrap_or_else(PoisonError::into_inner) =
                Some((tokio::time::Instant::now(), ready));
            ready
        }
    };
    if ready {
        "ready".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "database unavailable").into_response()
    }
}

/// A JSON body, with a 400 that says what is wrong instead of axum's.
fn body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::malformed(format!("the body: {e}")))
}

fn check_name(kind: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= normalize::MAX_NAME_BYTES
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '@'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::malformed(format!(
            "{kind} {name:?} must be 1 to {} characters of letters, digits, `_-.:@`",
            normalize::MAX_NAME_BYTES
        )))
    }
}

/// A JSON answer with the `ETag` of `revision`.
fn tagged(body: Value, revision: i64) -> Response {
    let mut r = Json(body).into_response();
    if let Ok(v) = header::HeaderValue::from_str(&etag(revision)) {
        r.headers_mut().insert(header::ETAG, v);
    }
    r
}

/// A write's answer: its body, tagged with the revision it made.
fn written(body: Value) -> Response {
    let revision = body.get("revision").and_then(Value::as_i64).unwrap_or(0);
    tagged(body, revision)
}

async fn list_namespaces(State(api): State<Api>) -> Result<Response, ApiError> {
    // One snapshot: the ETag is never newer than the list (review M6).
    let (revision, namespaces) = api.db.namespaces_at().await?;
    Ok(tagged(
        json!({ "revision": revision, "namespaces": namespaces }),
        revision,
    ))
}

/// Namespace `ns` as `GET` answers it (its revision is the last change
/// to it or its resources), or `None`.
async fn namespace_now(api: &Api, ns: &str) -> Result<Option<(Value, i64)>, ApiError> {
    let Some((doc, changed)) = api.db.namespace(ns).await? else {
        return Ok(None);
    };
    let body = json!({
        "name": doc.name,
        "revision": changed,
        "ignore_configured": doc.flags.ignore_configured,
        "allow_unconfigured": doc.flags.allow_unconfigured,
        "resources": doc.resources,
    });
    Ok(Some((body, changed)))
}

/// Resource `ns/r` as `GET` answers it (stored and resolved), or `None`.
async fn resource_now(api: &Api, ns: &str, r: &str) -> Result<Option<(Value, i64)>, ApiError> {
    let Some(stored) = api.db.resource(ns, r).await? else {
        return Ok(None);
    };
    Ok(Some((
        json!({ "revision": stored.revision, "resource": stored.body, "resolved": stored.resolved }),
        stored.revision,
    )))
}

/// A 412 with what its target (`now`) is at present; other errors as
/// they are.
async fn with_current<F>(e: ApiError, now: F) -> ApiError
where
    F: std::future::Future<Output = Result<Option<(Value, i64)>, ApiError>>,
{
    if !e.is_precondition() {
        return e;
    }
    match now.await {
        Ok(Some((body, revision))) => e.with_current(body, Some(revision)),
        Ok(None) => e.with_current(Value::Null, None),
        Err(other) => other,
    }
}

async fn get_namespace(
    State(api): State<Api>,
    Path(ns): Path<String>,
) -> Result<Response, ApiError> {
    let (body, revision) = namespace_now(&api, &ns)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no namespace {ns:?}")))?;
    Ok(tagged(body, revision))
}

async fn put_namespace(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Response, ApiError> {
    check_name("namespace", &ns)?;
    let pre = Precondition::from_headers(&headers)?;
    let flags: NamespaceFlags = if bytes.is_empty() {
        NamespaceFlags::default()
    } else {
        body(&bytes)?
    };
    let warnings = normalize::namespace(&ns, flags)?;
    let change = Change {
        actor: &caller.name,
        action: "put_namespace",
        target: ns.clone(),
    };
    let revision = match api.db.put_namespace(&change, &ns, flags, &pre).await {
        Ok(revision) => revision,
        Err(e) => return Err(with_current(e, namespace_now(&api, &ns)).await),
    };
    api.changed(revision);
    Ok(written(
        json!({ "revision": revision, "namespace": ns, "flags": flags, "warnings": warnings }),
    ))
}

async fn delete_namespace(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let pre = Precondition::from_headers(&headers)?;
    let change = Change {
        actor: &caller.name,
        action: "delete_namespace",
        target: ns.clone(),
    };
    let revision = match api.db.delete_namespace(&change, &ns, &pre).await {
        Ok(revision) => revision,
        Err(e) => return Err(with_current(e, namespace_now(&api, &ns)).await),
    };
    api.changed(revision);
    Ok(written(json!({ "revision": revision })))
}

/// `GET .../domains/{d}`: the override as stored (what it changes) and
/// resolved (what servers enforce), with the resource's revision.
async fn get_domain(
    State(api): State<Api>,
    Path((ns, r, d)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let stored = api
        .db
        .resource(&ns, &r)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no resource {ns}/{r}")))?;
    let over = |body: &Value| body.get("domains").and_then(|x| x.get(&d)).cloned();
    let (Some(given), Some(resolved)) = (over(&stored.body), over(&stored.resolved)) else {
        return Err(ApiError::not_found(format!(
            "{ns}/{r} has no override for {d:?}"
        )));
    };
    Ok(tagged(
        json!({ "revision": stored.revision, "override": given, "resolved": resolved }),
        stored.revision,
    ))
}

async fn get_resource(
    State(api): State<Api>,
    Path((ns, r)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (body, revision) = resource_now(&api, &ns, &r)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no resource {ns}/{r}")))?;
    Ok(tagged(body, revision))
}

/// Who asks for a change to a resource, and under which precondition
/// (`If-Match` on the resource, see [`crate::precondition`]).
struct Edit<'a> {
    api: &'a Api,
    caller: &'a Caller,
    headers: &'a HeaderMap,
}

/// Applies `edit` to a resource (see [`Db::edit_resource`]), normalizing
/// what it returns; answers with the revision, the body and the warnings.
/// A 412 carries the resource as it is now.
async fn edit(
    who: Edit<'_>,
    action: &str,
    target: String,
    ns: &str,
    name: &str,
    edit: impl FnOnce(Option<&Value>) -> Result<Option<Value>, ApiError>,
) -> Result<Response, ApiError> {
    let Edit {
        api,
        caller,
        headers,
    } = who;
    let pre = Precondition::from_headers(headers)?;
    let change = Change {
        actor: &caller.name,
        action,
        target,
    };
    let mut warnings = Vec::new();
    let done = api
        .db
        .edit_resource(&change, ns, name, &pre, |flags, current| {
            match edit(current)? {
                None => Ok(None),
                Some(raw) => {
                    let r = normalize::resource(ns, flags, name, &raw)?;
                    warnings = r.warnings;
                    Ok(Some((r.stored, r.resolved)))
                }
            }
        })
        .await;
    let (revision, bodies) = match done {
        Ok(done) => done,
        Err(e) => return Err(with_current(e, resource_now(api, ns, name)).await),
    };
    api.changed(revision);
    let (body, resolved) = bodies.unzip();
    Ok(written(json!({
        "revision": revision,
        "resource": body,
        "resolved": resolved,
        "warnings": warnings,
    })))
}

async fn put_resource(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((ns, r)): Path<(String, String)>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Response, ApiError> {
    check_name("resource", &r)?;
    let raw: Value = body(&bytes)?;
    edit(
        Edit {
            api: &api,
            caller: &caller,
            headers: &headers,
        },
        "put_resource",
        format!("{ns}/{r}"),
        &ns,
        &r,
        |_| Ok(Some(raw)),
    )
    .await
}

async fn delete_resource(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((ns, r)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    edit(
        Edit {
            api: &api,
            caller: &caller,
            headers: &headers,
        },
        "delete_resource",
        format!("{ns}/{r}"),
        &ns,
        &r,
        |_| Ok(None),
    )
    .await
}

/// The resource being edited, which must exist.
fn existing(
    current: Option<&Value>,
    ns: &str,
    r: &str,
) -> Result<serde_json::Map<String, Value>, ApiError> {
    match current {
        Some(Value::Object(m)) => Ok(m.clone()),
        _ => Err(ApiError::not_found(format!("no resource {ns}/{r}"))),
    }
}

async fn put_domain(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((ns, r, d)): Path<(String, String, String)>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Response, ApiError> {
    check_name("domain", &d)?;
    let over: Value = body(&bytes)?;
    let target = format!("{ns}/{r}/domains/{d}");
    let who = Edit {
        api: &api,
        caller: &caller,
        headers: &headers,
    };
    edit(who, "put_domain", target, &ns, &r, |current| {
        let mut m = existing(current, &ns, &r)?;
        let domains = m.entry("domains").or_insert_with(|| json!({}));
        let Value::Object(domains) = domains else {
            return Err(ApiError::invalid("the resource's domains are not a map"));
        };
        domains.insert(d.clone(), over);
        Ok(Some(Value::Object(m)))
    })
    .await
}

async fn delete_domain(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((ns, r, d)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let target = format!("{ns}/{r}/domains/{d}");
    let who = Edit {
        api: &api,
        caller: &caller,
        headers: &headers,
    };
    edit(who, "delete_domain", target, &ns, &r, |current| {
        let mut m = existing(current, &ns, &r)?;
        let removed = m
            .get_mut("domains")
            .and_then(Value::as_object_mut)
            .and_then(|domains| domains.remove(&d));
        if removed.is_none() {
            return Err(ApiError::not_found(format!(
                "{ns}/{r} has no override for {d:?}"
            )));
        }
        if m.get("domains")
            .and_then(Value::as_object)
            .is_some_and(|x| x.is_empty())
        {
            m.remove("domains");
        }
        Ok(Some(Value::Object(m)))
    })
    .await
}

/// A group's body: its limit and, optionally, its members.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupBody {
    limit: u64,
    #[serde(default)]
    members: Option<Vec<String>>,
}

/// The resource's groups list and the index of group `g` in it.
fn groups(m: &mut serde_json::Map<String, Value>) -> Result<&mut Vec<Value>, ApiError> {
    match m.entry("groups").or_insert_with(|| json!([])) {
        Value::Array(list) => Ok(list),
        _ => Err(ApiError::invalid("the resource's groups are not a list")),
    }
}

fn position(list: &[Value], g: &str) -> Option<usize> {
    list.iter()
        .position(|x| x.get("name").and_then(Value::as_str) == Some(g))
}

async fn put_group(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((ns, r, g)): Path<(String, String, String)>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Response, ApiError> {
    check_name("group", &g)?;
    let group: GroupBody = body(&bytes)?;
    let target = format!("{ns}/{r}/groups/{g}");
    let who = Edit {
        api: &api,
        caller: &caller,
        headers: &headers,
    };
    edit(who, "put_group", target, &ns, &r, |current| {
        let mut m = existing(current, &ns, &r)?;
        let list = groups(&mut m)?;
        let members = match (&group.members, position(list, &g)) {
            (Some(given), _) => json!(given),
            (None, Some(i)) => list[i].get("members").cloned().unwrap_or_else(|| json!([])),
            (None, None) => json!([]),
        };
        let value = json!({ "name": g, "limit": group.limit, "members": members });
        match position(list, &g) {
            Some(i) => list[i] = value,
            None => list.push(value),
        }
        Ok(Some(Value::Object(m)))
    })
    .await
}

async fn delete_group(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((ns, r, g)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let target = format!("{ns}/{r}/groups/{g}");
    let who = Edit {
        api: &api,
        caller: &caller,
        headers: &headers,
    };
    edit(who, "delete_group", target, &ns, &r, |current| {
        let mut m = existing(current, &ns, &r)?;
        let list = groups(&mut m)?;
        let Some(i) = position(list, &g) else {
            return Err(ApiError::not_found(format!("{ns}/{r} has no group {g:?}")));
        };
        list.remove(i);
        if list.is_empty() {
            m.remove("groups");
        }
        Ok(Some(Value::Object(m)))
    })
    .await
}

/// Adds (`add`) or removes a member of a group.
async fn member(
    api: &Api,
    caller: &Caller,
    headers: &HeaderMap,
    (ns, r, g, member): (String, String, String, String),
    add: bool,
) -> Result<Response, ApiError> {
    check_name("member", &member)?;
    let target = format!("{ns}/{r}/groups/{g}/members/{member}");
    let action = if add { "put_member" } else { "delete_member" };
    let who = Edit {
        api,
        caller,
        headers,
    };
    edit(who, action, target, &ns, &r, |current| {
        let mut m = existing(current, &ns, &r)?;
        let list = groups(&mut m)?;
        let Some(i) = position(list, &g) else {
            return Err(ApiError::not_found(format!("{ns}/{r} has no group {g:?}")));
        };
        let members = list[i]
            .as_object_mut()
            .map(|o| o.entry("members").or_insert_with(|| json!([])));
        let Some(Value::Array(members)) = members else {
            return Err(ApiError::invalid("the group's members are not a list"));
        };
        let at = members
            .iter()
            .position(|x| x.as_str() == Some(member.as_str()));
        match (add, at) {
            (true, None) => members.push(json!(member)),
            (true, Some(_)) => {}
            (false, Some(j)) => {
                members.remove(j);
            }
            (false, None) => {
                return Err(ApiError::not_found(format!(
                    "{member:?} is not in group {g:?}"
                )))
            }
        }
        Ok(Some(Value::Object(m)))
    })
    .await
}

async fn put_member(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(path): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    member(&api, &caller, &headers, path, true).await
}

async fn delete_member(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(path): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    member(&api, &caller, &headers, path, false).await
}

/// A request's query parameters, checked against the ones its endpoint
/// takes: an unknown one is refused (a misspelt `since` would otherwise
/// read everything), and each value is parsed with a message naming the
/// parameter and what it takes, not serde's. Kept in the order of the
/// query string, so the first unknown one is the one named.
struct Params {
    endpoint: &'static str,
    values: Vec<(String, String)>,
}

/// The query string as its pairs, in order.
type Pairs = Query<Vec<(String, String)>>;

impl Params {
    fn new(
        endpoint: &'static str,
        takes: &[&str],
        Query(values): Pairs,
    ) -> Result<Params, ApiError> {
        if let Some((unknown, _)) = values.iter().find(|(k, _)| !takes.contains(&k.as_str())) {
            let takes: Vec<String> = takes.iter().map(|t| format!("`{t}`")).collect();
            return Err(ApiError::malformed(bounded(format!(
                "unknown query parameter {unknown:?}; {endpoint} takes {}",
                takes.join(", ")
            ))));
        }
        Ok(Params { endpoint, values })
    }

    /// The whole number `name` (the last one given), at least `min`, and
    /// at most `cap` if there is one: a larger number, however large, is
    /// taken as `cap`. `what` says what it is for the message when it is
    /// not one.
    fn number(
        &self,
        name: &str,
        min: i64,
        cap: Option<i64>,
        what: &str,
    ) -> Result<Option<i64>, ApiError> {
        let Some((_, text)) = self.values.iter().rev().find(|(k, _)| k == name) else {
            return Ok(None);
        };
        let refused = |problem: &str, bound: String| {
            Err(ApiError::malformed(bounded(format!(
                "query parameter `{name}` of {} {problem} {what}{bound}, not {text:?}",
                self.endpoint
            ))))
        };
        match text.trim().parse::<i64>() {
            Ok(n) if n < min => refused("must be", String::new()),
            Ok(n) => Ok(Some(cap.map_or(n, |cap| n.min(cap)))),
            Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => match cap {
                Some(cap) => Ok(Some(cap)),
                None => refused(
                    "is too large: it must be",
                    format!(", at most {}", i64::MAX),
                ),
            },
            Err(_) => refused("must be", String::new()),
        }
    }

    /// The text of `name` (the last one given), if given.
    fn text(&self, name: &str) -> Result<Option<&str>, ApiError> {
        Ok(self
            .values
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str()))
    }

    /// `since`: the revision a caller has (0, everything, when absent).
    fn since(&self) -> Result<i64, ApiError> {
        Ok(self
            .number(
                "since",
                0,
                None,
                "a revision: a whole number from 0 (0: everything)",
            )?
            .unwrap_or(0))
    }
}

async fn delta(State(api): State<Api>, query: Pairs) -> Result<Response, ApiError> {
    let since = Params::new("GET /v1/config", &["since"], query)?.since()?;
    delta_after(&api, since).await
}

async fn delta_after(api: &Api, since: i64) -> Result<Response, ApiError> {
    let d = api.db.delta(since).await?;
    let revision = d.revision;
    Ok(tagged(
        serde_json::to_value(d).unwrap_or(Value::Null),
        revision,
    ))
}

/// The most namespaces, and the most resources, one `GET /v1/snapshot`
/// answers.
const SNAPSHOT_LIMIT: i64 = 1000;

/// `GET /v1/snapshot?after=CURSOR&limit=N`: the whole config (namespaces
/// with their resources, stored and resolved, with their revisions) from
/// one snapshot, in parts of at most `limit` namespaces and resources:
/// what the web page loads in one request (one per 1,000 resources).
async fn snapshot(State(api): State<Api>, query: Pairs) -> Result<Response, ApiError> {
    let params = Params::new("GET /v1/snapshot", &["after", "limit"], query)?;
    let limit = params
        .number(
            "limit",
            1,
            Some(SNAPSHOT_LIMIT),
            "a whole number of namespaces and resources from 1 (at most 1000 are answered)",
        )?
        .unwrap_or(SNAPSHOT_LIMIT);
    let after = params.text("after")?;
    if let Some(cursor) = after {
        let parts: Vec<&str> = cursor.split('/').collect();
        if parts.len() > 2 {
            return Err(ApiError::malformed(bounded(
                format!("query parameter `after` of GET /v1/snapshot is NS or NS/RESOURCE (a `next` it answered), not {cursor:?}"),
            )));
        }
        for part in parts {
            check_name("`after`", part)?;
        }
    }
    let snap = api.db.snapshot(after, limit).await?;
    let revision = snap.revision;
    Ok(tagged(
        serde_json::to_value(snap).unwrap_or(Value::Null),
        revision,
    ))
}

/// The longest a long poll waits, whatever `timeout_ms` asks.
const MAX_WAIT_MS: i64 = 300_000;

/// A long poll: answers with the delta as soon as the revision passes
/// `since`, or when `timeout_ms` (default 30 s, at most 5 minutes) ends.
async fn wait(State(api): State<Api>, query: Pairs) -> Result<Response, ApiError> {
    let params = Params::new("GET /v1/config/wait", &["since", "timeout_ms"], query)?;
    let since = params.since()?;
    let timeout_ms = params
        .number(
            "timeout_ms",
            0,
            Some(MAX_WAIT_MS),
            "a whole number of milliseconds from 0 (at most 300000 are waited)",
        )?
        .unwrap_or(30_000);
    let timeout = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
    let mut rx = api.revision.subscribe();
    // A caller ahead of this database (it was replaced or restored) is
    // answered at once: the delta's revision and instance tell it to
    // start over.
    let _ = tokio::time::timeout(timeout, rx.wait_for(|r| *r != since)).await;
    delta_after(&api, since).await
}

async fn export(State(api): State<Api>) -> Result<Response, ApiError> {
    let (revision, all) = api.db.all_at().await?;
    let doc = normalize::document(&all);
    // The stored bodies, refining overrides as stored, so an export
    // imported again keeps them inheriting (the loader's emitter would
    // write them resolved, whole). Checked to load, as before.
    let yaml = normalize::to_yaml(&doc);
    tollgate_config::load_str("export", &yaml)
        .map_err(|e| ApiError::invalid(format!("the stored config does not load: {e}")))?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/yaml".to_owned()),
            (header::ETAG, etag(revision)),
        ],
        yaml,
    )
        .into_response())
}

/// Replaces the whole config with a YAML (or JSON) one in tollgate's
/// format: validated and normalized as a file is, all or nothing.
async fn import(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    text: String,
) -> Result<Response, ApiError> {
    let pre = Precondition::from_headers(&headers)?;
    let (namespaces, warnings) = normalize::import(&text)?;
    for (ns, _) in &namespaces {
        check_name("namespace", &ns.name)?;
        for r in &ns.resources {
            check_name(
                "resource",
                r.get("name").and_then(Value::as_str).unwrap_or_default(),
            )?;
        }
    }
    let change = Change {
        actor: &caller.name,
        action: "import",
        target: "*".to_owned(),
    };
    let revision = api.db.import(&change, &namespaces, &pre).await?;
    api.changed(revision);
    Ok(written(
        json!({ "revision": revision, "namespaces": namespaces.len(), "warnings": warnings }),
    ))
}

/// `GET /v1/whoami`: the caller's token name and role, for the page to
/// say who is signed in and show edit controls to admins only (the API
/// still checks every write).
async fn whoami(Extension(caller): Extension<Caller>) -> Json<Value> {
    let role = match caller.role {
        Role::Admin => "admin",
        Role::Read => "read",
    };
    Json(json!({ "name": caller.name, "role": role }))
}

/// `GET /v1/usage`: what the limiting servers decide now, per resource
/// (see [`crate::usage`]); `enabled: false` without `--servers`.
async fn usage(State(api): State<Api>) -> Json<Value> {
    Json(api.usage.view())
}

async fn audit(State(api): State<Api>, query: Pairs) -> Result<Response, ApiError> {
    let params = Params::new(
        "GET /v1/audit",
        &["since", "limit", "target", "order"],
        query,
    )?;
    let target = params.text("target")?;
    if let Some(t) = target {
        for part in t.split('/') {
            check_name("target part", part)?;
        }
    }
    let newest = match params.text("order")? {
        None | Some("oldest") => false,
        Some("newest") => true,
        Some(other) => {
            return Err(ApiError::malformed(bounded(format!(
                "query parameter `order` of GET /v1/audit is `oldest` (the default) or \
                     `newest`, not {other:?}"
            ))))
        }
    };
    let since = params.since()?;
    let limit = params
        .number(
            "limit",
            1,
            Some(1000),
            "a whole number of entries from 1 (at most 1000 are answered)",
        )?
        .unwrap_or(100);
    let revision = api.db.revision().await?;
    let entries = api.db.audit(since, limit, target, newest).await?;
    Ok(tagged(
        json!({ "revision": revision, "entries": entries }),
        revision,
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn params(query: &[(&str, &str)], takes: &[&str]) -> Result<Params, ApiError> {
        let pairs = query
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Params::new("GET /v1/test", takes, Query(pairs))
    }

    /// The API's own rate limit decides at the time it is given (the
    /// clock of the API's state), so a caller's refill is checked by
    /// moving time, not by waiting.
    #[test]
    fn each_caller_gets_a_bucket_that_refills_with_the_time_given() {
        let rate = tollgate_core::Rate::new(1, Nanos::from_secs(1)).unwrap();
        let limiter = CallerBuckets {
            bucket: TokenBucket::new(2, rate).unwrap(),
            states: Mutex::new(HashMap::new()),
        };
        let t = Nanos::from_secs(1_700_000_000);
        assert_eq!(limiter.allow("token:alice", t), None);
        assert_eq!(limiter.allow("token:alice", t), None);
        assert_eq!(
            limiter.allow("token:alice", t),
            Some(Duration::from_secs(1))
        );
        // Another caller has a bucket of its own.
        assert_eq!(limiter.allow("anonymous", t), None);
        let later = Nanos::new(t.as_u64() + 1_000_000_000);
        assert_eq!(limiter.allow("token:alice", later), None);
        assert!(limiter.allow("token:alice", later).is_some());
    }

    /// Review of issue 23: /metrics was listed as served whether or not
    /// the binary mounted it.
    #[test]
    fn the_endpoints_listed_are_the_ones_mounted() {
        assert!(!endpoints(&[]).contains("/metrics"), "{}", endpoints(&[]));
        let with = endpoints(&["/metrics"]);
        assert!(
            with.contains("/healthz, /readyz, /metrics and the web page at /"),
            "{with}"
        );
    }

    /// Review of issue 23: with several unknown parameters, the one named
    /// depended on a HashMap's order; it is the first of the query.
    #[test]
    fn the_first_unknown_parameter_of_the_query_is_named() {
        for _ in 0..20 {
            let e = params(
                &[("since", "1"), ("zeta", "1"), ("alpha", "2"), ("mid", "3")],
                &["since"],
            )
            .err()
            .unwrap();
            assert!(
                e.message.starts_with("unknown query parameter \"zeta\";"),
                "{}",
                e.message
            );
        }
    }

    /// Review of issue 23: a number past i64::MAX was called "not a whole
    /// number"; a bounded parameter (`timeout_ms`, `limit`) takes it as
    /// its bound, as a large one below i64::MAX always was.
    #[test]
    fn a_number_too_large_is_called_so_or_taken_as_the_bound() {
        let huge = "9".repeat(30);
        let p = params(&[("since", &huge)], &["since"]).unwrap();
        let e = p.since().unwrap_err();
        assert_eq!(e.reason, "malformed_request");
        assert!(
            e.message.starts_with(
                "query parameter `since` of GET /v1/test is too large: it must be a revision: \
                 a whole number from 0 (0: everything), at most 9223372036854775807, not \"999"
            ),
            "{}",
            e.message
        );
        let p = params(&[("timeout_ms", &huge)], &["timeout_ms"]).unwrap();
        assert_eq!(
            p.number("timeout_ms", 0, Some(300), "ms").unwrap(),
            Some(300)
        );
        let p = params(&[("timeout_ms", "301")], &["timeout_ms"]).unwrap();
        assert_eq!(
            p.number("timeout_ms", 0, Some(300), "ms").unwrap(),
            Some(300)
        );
        let p = params(&[("timeout_ms", "-1")], &["timeout_ms"]).unwrap();
        assert!(p.number("timeout_ms", 0, Some(300), "ms").is_err());
        // The last of a parameter given twice counts, as it always did.
        let p = params(&[("since", "1"), ("since", "2")], &["since"]).unwrap();
        assert_eq!(p.since().unwrap(), 2);
    }
}
