//! The config API's errors: an HTTP status, a machine-readable reason and
//! a message for people, as the server's HTTP API answers.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

/// An error answer.
#[derive(Debug, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// Machine-readable: `invalid_config`, `not_found`, `unauthorized`, ...
    pub reason: &'static str,
    /// For people.
    pub message: String,
    /// For `412 precondition_failed`: what the target is now, in the shape
    /// its `GET` answers (`Some(Value::Null)` when it no longer exists),
    /// and its revision (the `ETag`).
    pub current: Option<(Value, Option<i64>)>,
}

impl ApiError {
    /// An error with `status`, `reason` and `message`.
    pub fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            reason,
            message: message.into(),
            current: None,
        }
    }

    /// 412 `precondition_failed`: the target changed or vanished since the
    /// revision the caller sent in `If-Match` (or exists, for
    /// `If-None-Match: *`). The handler adds the target's current state
    /// with [`ApiError::with_current`].
    pub fn precondition(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "precondition_failed",
            message,
        )
    }

    /// Whether this is a 412 `precondition_failed`.
    pub fn is_precondition(&self) -> bool {
        self.status == StatusCode::PRECONDITION_FAILED
    }

    /// This error with the target's current state (`Value::Null`: it no
    /// longer exists) and revision.
    pub fn with_current(mut self, current: Value, revision: Option<i64>) -> ApiError {
        self.current = Some((current, revision));
        self
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 400 `malformed_request`.
    pub fn malformed(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "malformed_request", message)
    }

    /// 422 `invalid_config`: the change would make an invalid config.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_config", message)
    }

    /// 408 `body_timeout`: the request body did not arrive within
    /// `limit`.
    pub fn body_timeout(limit: Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the request body did not arrive within {} ms; the connection is closed",
                limit.as_millis()
            ),
        )
    }

    /// 503 `database_unavailable`. The database's own error can name its
    /// host, user and tables: it goes to the log (escaped, so it cannot
    /// forge lines), not to the client.
    pub fn database(e: &sqlx::Error) -> ApiError {
        tracing::warn!(error = ?e.to_string(), "database error");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            "the database failed or is unreachable; the config API's log has the detail",
        )
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        ApiError::database(&e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let answer = crate::protocol::ErrorAnswer {
            error: crate::protocol::ErrorDetail {
                reason: self.reason.to_owned(),
                message: self.message,
            },
        };
        let mut body = serde_json::to_value(answer).unwrap_or(Value::Null);
        let mut etag = None;
        if let Some((current, revision)) = self.current {
            body["current"] = current;
            etag = revision.map(crate::precondition::etag);
        }
        let mut r = (self.status, Json(body)).into_response();
        if let Some(v) = etag.and_then(|e| axum::http::HeaderValue::from_str(&e).ok()) {
            r.headers_mut().insert(axum::http::header::ETAG, v);
        }
        r
    }
}

/// The answer to a request whose body did not arrive within `limit`: the
/// HTTP port serving the API gives it in the handler's place.
pub fn body_timeout_response(limit: Duration) -> Response {
    ApiError::body_timeout(limit).into_response()
}
