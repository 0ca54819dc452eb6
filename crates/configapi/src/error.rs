//! The config API's errors: an HTTP status, a machine-readable reason and
//! a message for people, as the server's HTTP API answers.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

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
}

impl ApiError {
    /// An error with `status`, `reason` and `message`.
    pub fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            reason,
            message: message.into(),
        }
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
        let body = serde_json::json!({
            "error": { "reason": self.reason, "message": self.message }
        });
        (self.status, Json(body)).into_response()
    }
}

/// The answer to a request whose body did not arrive within `limit`: the
/// HTTP port serving the API gives it in the handler's place.
pub fn body_timeout_response(limit: Duration) -> Response {
    ApiError::body_timeout(limit).into_response()
}
