//! `GET` and `DELETE /v1/counters?namespace=&resource=&domain=`: one
//! domain's live counters of one resource, inspected (nothing charged,
//! nothing created) or reset. Admin endpoints: [`super::admin::admin_auth`]
//! guards them (either role reads; a reset needs `admin`).

use axum::extract::{Query, State};
use axum::Extension;
use axum::Json;
use http::{StatusCode, Uri};
use tollgate_proto::v1;
use tollgate_store::Store;
use tonic::Code;

use super::body::{fail, ApiError};
use super::Http;
use crate::errors::malformed;
use crate::tokens::Caller;
use crate::{convert, metrics as m};

/// The longest query string `/v1/counters` reads: three names, each far
/// shorter in any config; a longer one is refused before it is parsed.
pub const MAX_QUERY_BYTES: usize = 4096;

/// `?namespace=&resource=&domain=`. Unknown parameters are refused, so a
/// misspelt one is not read as an empty domain.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Names {
    namespace: String,
    resource: String,
    domain: String,
}

fn names(uri: &Uri) -> Result<Names, ApiError> {
    let query = uri.query().unwrap_or("");
    if query.len() > MAX_QUERY_BYTES {
        return Err(fail(malformed(format!(
            "the query string is {} bytes; /v1/counters reads at most {MAX_QUERY_BYTES}",
            query.len()
        ))));
    }
    let Query(names) = Query::<Names>::try_from_uri(uri).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            Code::InvalidArgument,
            "malformed_request",
            format!(
                "bad query: {}; expected ?namespace=NS&resource=RES&domain=DOMAIN",
                e.body_text()
            ),
        )
    })?;
    Ok(names)
}

/// `GET /v1/counters`: each limit's state (or a copy resource's holds).
pub(super) async fn inspect<S: Store>(
    State(http): State<Http<S>>,
    uri: Uri,
) -> Result<Json<v1::CountersResponse>, ApiError> {
    let n = names(&uri)?;
    let counters = http
        .app
        .service()
        .inspect(&n.namespace, &n.resource, &n.domain)
        .await
        .map_err(fail)?;
    Ok(Json(convert::counters_response(
        &n.namespace,
        &n.resource,
        &n.domain,
        &counters,
    )))
}

/// `DELETE /v1/counters`: the domain's counters start afresh.
pub(super) async fn reset<S: Store>(
    State(http): State<Http<S>>,
    caller: Option<Extension<Caller>>,
    uri: Uri,
) -> Result<Json<v1::ResetResponse>, ApiError> {
    let n = names(&uri)?;
    let reset = http
        .app
        .service()
        .reset(&n.namespace, &n.resource, &n.domain)
        .await
        .map_err(fail)?;
    metrics::counter!(m::COUNTER_RESETS, "surface" => "http", "namespace" => n.namespace.clone(), "resource" => n.resource.clone())
        .increment(1);
    let by = caller.map(|Extension(c)| c.name);
    tracing::info!(
        namespace = %n.namespace,
        resource = %n.resource,
        domain = %n.domain,
        token = by.as_deref().unwrap_or("-"),
        "counters reset"
    );
    Ok(Json(v1::ResetResponse {
        reset: u32::try_from(reset).unwrap_or(u32::MAX),
    }))
}
