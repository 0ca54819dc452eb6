//! JSON bodies in, JSON errors out.
//!
//! axum's own `Json` extractor answers a bad body in plain text, with 415
//! or 422; clients of this API parse one error shape, so bodies are read by
//! [`JsonBody`] and every failure becomes an [`ApiError`].

use std::error::Error as _;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::BytesMut;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;
use tollgate_proto::v1;
use tollgate_service::ServiceError;
use tollgate_store::Store;
use tonic::Code;

use super::Http;
use crate::errors::{bounded, grpc_code, http_status, malformed, message, REFUSAL_RETRY_AFTER_S};
use crate::listen::http::BodyTimedOut;
use crate::metrics as m;

/// An error answer: `{"error": {"code", "reason", "message"}}`.
#[derive(Debug)]
pub(super) struct ApiError {
    status: StatusCode,
    error: v1::Error,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, code: Code, reason: &str, message: String) -> ApiError {
        ApiError {
            status,
            error: v1::Error {
                code: code as i32,
                reason: reason.to_owned(),
                message,
            },
        }
    }

    /// `e`, without recording it: for errors the service already counted.
    pub(super) fn service(e: &ServiceError) -> ApiError {
        ApiError::new(http_status(e), grpc_code(e), e.reason(), message(e))
    }
}

/// `e` counted as an HTTP error, then as an answer. Every error a handler
/// returns goes through here, except those of `native::rate`, which counts
/// its own.
pub(super) fn fail(e: ServiceError) -> ApiError {
    m::error("http", e.reason());
    ApiError::service(&e)
}

#[derive(serde::Serialize)]
struct Envelope<'a> {
    error: &'a v1::Error,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(Envelope { error: &self.error })).into_response();
        // A refusal (too many sessions, store at capacity) says when to
        // come back, as a rejection does.
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(REFUSAL_RETRY_AFTER_S));
        }
        response
    }
}

/// The HTTP answer to a service error: its status and the JSON error shape
/// the whole HTTP API uses.
pub fn error_response(e: &ServiceError) -> Response {
    ApiError::service(e).into_response()
}

/// A JSON body of type `T`: anything else is `400 malformed_request`, and a
/// body over the limit `413 body_too_large`. The content type is not
/// checked: the body is what it is, and `curl -d` sends form-encoded.
pub(super) struct JsonBody<T>(pub T);

/// Like [`JsonBody`], but an empty body is `None`.
pub(super) struct OptionalJsonBody<T>(pub Option<T>);

impl<S: Store, T: DeserializeOwned> FromRequest<Http<S>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Http<S>) -> Result<JsonBody<T>, ApiError> {
        let bytes = read(req, state).await?;
        parse(&bytes).map(JsonBody)
    }
}

impl<S: Store, T: DeserializeOwned> FromRequest<Http<S>> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Http<S>) -> Result<OptionalJsonBody<T>, ApiError> {
        let bytes = read(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(None));
        }
        parse(&bytes).map(|v| OptionalJsonBody(Some(v)))
    }
}

/// The whole body, within `max_body` bytes and the port's body timeout.
///
/// Read here rather than by axum's `Bytes` extractor, which learns the
/// limit from a `DefaultBodyLimit` layer: that layer and the rejection
/// it makes cost every request of every route, for the one check done
/// here.
pub(super) async fn read<S: Store>(req: Request, state: &Http<S>) -> Result<Bytes, ApiError> {
    let body = Limited::new(req.into_body(), state.max_body);
    match collect(body).await {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.is::<LengthLimitError>() => {
            m::error("http", "body_too_large");
            Err(too_large(state.max_body))
        }
        Err(e) => {
            if let Some(late) = timed_out(&*e) {
                m::error("http", "body_timeout");
                return Err(body_timeout(late.0));
            }
            Err(fail(malformed(format!(
                "cannot read the request body: Failed to buffer the request body: {e}"
            ))))
        }
    }
}

/// The data of `body`. A small body comes in one frame, which is kept as
/// it is; `http_body_util`'s `collect` would queue it in a list of its own
/// and copy it out again.
async fn collect<B>(mut body: B) -> Result<Bytes, B::Error>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    let mut first = Bytes::new();
    let mut more: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue; // trailers: not part of the body
        };
        match &mut more {
            Some(all) => all.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                let mut all = BytesMut::with_capacity(first.len() + data.len());
                all.extend_from_slice(&first);
                all.extend_from_slice(&data);
                more = Some(all);
            }
        }
    }
    Ok(more.map_or(first, BytesMut::freeze))
}

/// The body timeout that cut `e` short, if that is what did.
fn timed_out<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e BodyTimedOut> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(e) = source {
        if let Some(late) = e.downcast_ref::<BodyTimedOut>() {
            return Some(late);
        }
        source = e.source();
    }
    None
}

/// `408 body_timeout`: the body did not arrive within the port's body
/// timeout. `DEADLINE_EXCEEDED` is the gRPC code of a call that ran out
/// of time.
fn body_timeout(limit: Duration) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        Code::DeadlineExceeded,
        "body_timeout",
        format!(
            "the request body did not arrive within {} ms; the connection is closed",
            limit.as_millis()
        ),
    )
}

/// The answer to a request whose body did not arrive within `limit`, for
/// routes that read their body otherwise than through [`JsonBody`] (the
/// HTTP port answers it in their place): the API's error shape, 408
/// `body_timeout`.
pub fn body_timeout_response(limit: Duration) -> Response {
    body_timeout(limit).into_response()
}

/// `OUT_OF_RANGE` is what the gRPC surface answers for a message over the
/// same limit (tonic's code), and `code` is the unary form's code.
fn too_large(max_body: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        Code::OutOfRange,
        "body_too_large",
        format!("the request body is larger than the server accepts ({max_body} bytes)"),
    )
}

/// Gives a 413 from a handler that reads its body with axum's own
/// extractors (`/json`) the API's error shape, so a too-large body is
/// answered alike on every route.
pub(super) async fn too_large_as_json<S>(
    State(http): State<Http<S>>,
    response: Response,
) -> Response {
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE && !is_json {
        return too_large(http.max_body).into_response();
    }
    response
}

/// A body parsed by [`parse_borrowed`]: its borrowed form, or (for a body
/// only the owned form accepts, which a proptest says never happens for
/// the rate request) its owned form.
pub(super) enum Parsed<B, T> {
    /// Read with borrowed strings.
    Borrowed(B),
    /// Read by the owned form.
    Owned(T),
}

/// A body read with borrowed strings as `B`, which accepts what `T` does;
/// refused bodies are described through `T`, so the answer is word for
/// word the one [`JsonBody<T>`] gives.
pub(super) fn parse_borrowed<'a, B, T>(bytes: &'a [u8]) -> Result<Parsed<B, T>, ApiError>
where
    B: serde::Deserialize<'a>,
    T: DeserializeOwned,
{
    match serde_json::from_slice(bytes) {
        Ok(b) => Ok(Parsed::Borrowed(b)),
        Err(_) => parse(bytes).map(Parsed::Owned),
    }
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // Straight to serde_json: axum's `Json` tracks the path to every value
    // for its error message, which costs on every body, so it is asked
    // only to describe a body serde_json refused (it parses the same way).
    // A body serde_json accepts is UTF-8: it checks every string it reads
    // and refuses any other byte that is not ASCII, and the API's bodies
    // refuse unknown fields, so nothing is skipped unread.
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    // serde_json would report bad UTF-8 inside a string as a bad escape or
    // code point; say what it is.
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(fail(malformed(format!(
            "the request body is not UTF-8: {e}"
        ))));
    }
    Json::<T>::from_bytes(bytes)
        .map(|Json(v)| v)
        .map_err(|rejection| fail(malformed(describe::<T>(&rejection))))
}

/// What is wrong with a body, naming the field when serde knows it
/// (`hits: invalid type: string "2", expected u64 at line 1 column 12`).
fn describe<T>(rejection: &JsonRejection) -> String {
    let detail = rejection
        .source()
        .map_or_else(|| rejection.body_text(), ToString::to_string);
    match rejection {
        JsonRejection::JsonDataError(_) => {
            let full = std::any::type_name::<T>();
            let name = full.rsplit("::").next().unwrap_or(full);
            format!("the request body is not a valid {name}: {detail}")
        }
        JsonRejection::JsonSyntaxError(_) => {
            format!("the request body is not valid JSON: {detail}")
        }
        _ => detail,
    }
}

/// Unknown paths: the JSON error shape rather than an empty 404.
pub(super) async fn not_found(uri: http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        Code::NotFound,
        "not_found",
        bounded(format!("no endpoint at `{}`", uri.path())),
    )
}

/// Known paths, wrong method; axum adds the `Allow` header.
pub(super) async fn method_not_allowed(method: http::Method, uri: http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        Code::Unimplemented,
        "method_not_allowed",
        bounded(format!("`{}` does not answer {method}", uri.path())),
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tollgate_proto::json::RateRequestJson;
    use tollgate_proto::v1;

    use super::{parse, parse_borrowed, Parsed};

    /// Bodies: JSON-like text of a rate request's fields (right and wrong
    /// types, escapes, unknown fields, arrays, cut short), or any bytes,
    /// with a byte now and then replaced (non-UTF-8 included).
    fn body() -> impl Strategy<Value = Vec<u8>> {
        let value = prop_oneof![
            "[a-z/ é]{0,6}".prop_map(|s| format!("{s:?}")),
            Just(r#""a\"b\u00e9""#.to_owned()),
            Just(r#""try""#.to_owned()),
            Just(r#""acquire""#.to_owned()),
            any::<u32>().prop_map(|n| n.to_string()),
            Just("null".to_owned()),
            Just("-1".to_owned()),
            Just("[]".to_owned()),
        ];
        let key = prop::sample::select(vec![
            "namespace",
            "resource",
            "domain",
            "hits",
            "min_hits",
            "mode",
            "x",
        ]);
        let text = (prop::collection::vec((key, value), 0..7), any::<bool>()).prop_map(
            |(fields, array)| {
                let parts: Vec<String> = fields
                    .iter()
                    .map(|(k, v)| {
                        if array {
                            v.clone()
                        } else {
                            format!("{k:?}:{v}")
                        }
                    })
                    .collect();
                let (open, close) = if array { ("[", "]") } else { ("{", "}") };
                format!("{open}{}{close}", parts.join(",")).into_bytes()
            },
        );
        prop_oneof![
            4 => (text, any::<prop::sample::Index>(), any::<u8>(), any::<bool>()).prop_map(
                |(mut b, i, byte, edit)| {
                    if edit && !b.is_empty() {
                        let at = i.index(b.len());
                        b[at] = byte;
                    }
                    b
                }
            ),
            1 => prop::collection::vec(any::<u8>(), 0..40),
        ]
    }

    proptest! {
        /// What the server runs: the borrowed read answers every body as
        /// the proto's form alone did, the same request or the same
        /// refusal, word for word.
        #[test]
        fn the_borrowed_read_answers_as_the_owned_one(bytes in body()) {
            let borrowed = parse_borrowed::<RateRequestJson, v1::RateRequest>(&bytes);
            let owned = parse::<v1::RateRequest>(&bytes);
            match (&borrowed, &owned) {
                (Ok(Parsed::Borrowed(b)), Ok(o)) => prop_assert_eq!(b.view(), o.view()),
                (Ok(Parsed::Owned(b)), Ok(o)) => prop_assert_eq!(b.view(), o.view()),
                (Err(b), Err(o)) => {
                    prop_assert_eq!(b.status, o.status);
                    prop_assert_eq!(&b.error, &o.error);
                }
                _ => prop_assert!(false, "{:?}: {} against {}",
                    String::from_utf8_lossy(&bytes), borrowed.is_ok(), owned.is_ok()),
            }
        }
    }
}
