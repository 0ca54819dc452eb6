//! Service errors as gRPC statuses and HTTP answers (Charon §3.1's error
//! classes): client errors get distinct codes and a machine-readable
//! reason; server errors are UNAVAILABLE or INTERNAL.

use http::StatusCode;
use tollgate_service::ServiceError;
use tonic::{Code, Status};

/// The metadata key carrying the machine-readable reason.
pub const REASON_HEADER: &str = "tollgate-reason";

/// The gRPC code of `e`.
pub fn grpc_code(e: &ServiceError) -> Code {
    match e.reason() {
        "malformed_request" | "bad_copies" => Code::InvalidArgument,
        "unknown_namespace" | "unknown_resource" | "unknown_transfer" | "unknown_hold" => {
            Code::NotFound
        }
        "wrong_resource_kind"
        | "not_held"
        | "no_descriptors"
        | "cannot_schedule"
        | "session_closed" => Code::FailedPrecondition,
        "exceeds_limit" | "unsupported_by_store" => Code::OutOfRange,
        "duplicate_key" => Code::Internal,
        _ => Code::Unavailable,
    }
}

/// The HTTP status of `e`.
pub fn http_status(e: &ServiceError) -> StatusCode {
    match grpc_code(e) {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::FailedPrecondition => StatusCode::CONFLICT,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// `e` as a gRPC status with the reason in metadata.
pub fn status(e: &ServiceError) -> Status {
    let mut s = Status::new(grpc_code(e), e.to_string());
    if let Ok(v) = e.reason().parse() {
        s.metadata_mut().insert(REASON_HEADER, v);
    }
    s
}

/// A malformed request found by a surface before the service saw it.
pub fn malformed(message: impl Into<String>) -> ServiceError {
    ServiceError::Malformed(message.into())
}
