//! envoyproxy/ratelimit's `POST /json`: `ShouldRateLimit` with protojson
//! bodies, for clients that do not speak gRPC.
//!
//! The request body is a `RateLimitRequest` as protojson writes it
//! (`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}],
//! "hitsAddend":1}`); like protojson, field names are accepted in
//! lowerCamelCase and as in the proto (`hits_addend`), integers as JSON
//! numbers or decimal strings, `null` as absent, and an unknown field is
//! an error. The answer is the `RateLimitResponse` as protojson, with HTTP
//! 200 when it is OK and 429 when it is OVER_LIMIT, as upstream answers.
//! A body that cannot be read is 400 `malformed_request`; any other
//! refusal is the HTTP API's error shape and status
//! ([`crate::http::error_response`]).
//!
//! The generated RLS types have no serde support, so the JSON shapes are written here
//! and converted to and from the wire types; the decision itself is
//! [`crate::rls`]'s, the same as over gRPC.

use std::fmt;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use serde::de::{self, Deserializer, IgnoredAny, Visitor};
use serde::{Deserialize, Serialize};
use tollgate_proto::rls::rate_limit_descriptor::Entry;
use tollgate_proto::rls::rate_limit_response::{Code, DescriptorStatus};
use tollgate_proto::rls::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse};
use tollgate_store::Store;

use crate::app::App;
use crate::errors::malformed;
use crate::http::TraceContext;
use crate::metrics as m;
use crate::rls::{code_name, unit_name};
use crate::spans::{Decision, Outcome};

/// The metrics surface of this endpoint.
const SURFACE: &str = "rls_json";

/// `POST /json`: decides a protojson `RateLimitRequest` (see the module
/// documentation for the shapes and statuses).
pub async fn json<S: Store>(
    State(app): State<Arc<App<S>>>,
    TraceContext(caller): TraceContext,
    body: axum::body::Bytes,
) -> Response {
    let request = match parse(&body) {
        Ok(r) => r,
        Err(message) => {
            m::error(SURFACE, "malformed_request");
            // A body that is not a request is still decided (refused):
            // it gets a span, without names.
            let refused = malformed(message);
            if let Some(started) = app.span_start() {
                app.record_span(
                    &caller,
                    (started, started),
                    &Decision {
                        name: "tollgate.should_rate_limit",
                        surface: SURFACE,
                        namespace: "",
                        resource: None,
                        descriptors: None,
                        hits: 0,
                        granted: 0,
                        outcome: Outcome::Error(refused.reason()),
                    },
                );
            }
            return crate::http::error_response(&refused);
        }
    };
    match crate::rls::decide(&app, &request, false, SURFACE, &caller).await {
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, Json(ResponseJson::from(&response))).into_response()
        }
        Err(e) => crate::http::error_response(&e),
    }
}

/// The body as a wire request, or what is wrong with it.
fn parse(body: &[u8]) -> Result<RateLimitRequest, String> {
    let json: RequestJson = serde_json::from_slice(body)
        .map_err(|e| format!("the request body is not a valid RateLimitRequest: {e}"))?;
    let hits_addend = match json.hits_addend {
        None => 0,
        Some(n) => u32::try_from(n).map_err(|_| {
            format!("hitsAddend: {n} does not fit in 32 bits (a uint32 in the proto)")
        })?,
    };
    let descriptors = json
        .descriptors
        .unwrap_or_default()
        .into_iter()
        .map(|d| {
            let mut out = RateLimitDescriptor {
                entries: d
                    .entries
                    .unwrap_or_default()
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key.unwrap_or_default(),
                        value: e.value.unwrap_or_default(),
                    })
                    .collect(),
                is_negative_hits: d.is_negative_hits.unwrap_or(false),
                ..RateLimitDescriptor::default()
            };
            if let Some(hits) = d.hits_addend {
                // The wrapper type is not re-exported by name; the field
                // names it.
                out.hits_addend.get_or_insert_with(Default::default).value = hits;
            }
            out
        })
        .collect();
    Ok(RateLimitRequest {
        domain: json.domain.unwrap_or_default(),
        descriptors,
        hits_addend,
    })
}

/// `RateLimitRequest` as protojson.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestJson {
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    descriptors: Option<Vec<DescriptorJson>>,
    #[serde(
        default,
        rename = "hitsAddend",
        alias = "hits_addend",
        deserialize_with = "hits_addend"
    )]
    hits_addend: Option<u64>,
}

/// `RateLimitDescriptor` as protojson.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorJson {
    #[serde(default)]
    entries: Option<Vec<EntryJson>>,
    /// A per-request limit override: accepted and ignored, as over gRPC
    /// (tollgate applies its configured limits).
    #[serde(default)]
    #[allow(dead_code)]
    limit: Option<IgnoredAny>,
    /// `google.protobuf.UInt64Value`, which protojson writes as a bare
    /// number.
    #[serde(
        default,
        rename = "hitsAddend",
        alias = "hits_addend",
        deserialize_with = "hits_addend"
    )]
    hits_addend: Option<u64>,
    #[serde(default, rename = "isNegativeHits", alias = "is_negative_hits")]
    is_negative_hits: Option<bool>,
}

/// `RateLimitDescriptor.Entry` as protojson.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryJson {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    value: Option<String>,
}

/// A `hitsAddend`, as protojson reads an unsigned integer: a JSON number,
/// or a decimal string (how protojson writes 64-bit integers); `null` is
/// absent. (serde_json does not name the field of a value it rejects, so
/// the expectation does.)
fn hits_addend<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct Count;

    impl<'de> Visitor<'de> for Count {
        type Value = Option<u64>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("hitsAddend as an unsigned integer (a number or a decimal string)")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<u64>, E> {
            Ok(Some(v))
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<u64>, E> {
            u64::try_from(v)
                .map(Some)
                .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<u64>, E> {
            // protojson accepts `5.0` and `5e2` for integers when they are
            // whole and in range.
            // `u64::MAX as f64` is 2^64, one past the largest u64.
            if v.fract() == 0.0 && v >= 0.0 && v < u64::MAX as f64 {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                Ok(Some(v as u64))
            } else {
                Err(E::invalid_value(de::Unexpected::Float(v), &self))
            }
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<u64>, E> {
            v.parse()
                .map(Some)
                .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
        }

        fn visit_none<E: de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }
    }

    d.deserialize_any(Count)
}

/// `RateLimitResponse` as protojson (fields that are never set here —
/// request headers, raw body, metadata, quota — are left out).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseJson {
    overall_code: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    statuses: Vec<StatusJson>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<HeaderJson>,
}

/// One descriptor's status. Unlike protojson, `limitRemaining` is written
/// even when 0 whenever the descriptor has a limit, so that a plain JSON
/// client reads "0 left" rather than a missing field; a protojson parser
/// reads both the same.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusJson {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<LimitJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit_remaining: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LimitJson {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    requests_per_unit: u32,
    unit: &'static str,
}

#[derive(Serialize)]
struct HeaderJson {
    key: String,
    value: String,
}

impl From<&RateLimitResponse> for ResponseJson {
    fn from(r: &RateLimitResponse) -> ResponseJson {
        ResponseJson {
            overall_code: code_name(r.overall_code),
            statuses: r.statuses.iter().map(StatusJson::from).collect(),
            response_headers_to_add: r
                .response_headers_to_add
                .iter()
                .map(|h| HeaderJson {
                    key: h.key.clone(),
                    value: h.value.clone(),
                })
                .collect(),
        }
    }
}

impl From<&DescriptorStatus> for StatusJson {
    fn from(s: &DescriptorStatus) -> StatusJson {
        StatusJson {
            code: code_name(s.code),
            current_limit: s.current_limit.as_ref().map(|l| LimitJson {
                name: l.name.clone(),
                requests_per_unit: l.requests_per_unit,
                unit: unit_name(l.unit),
            }),
            limit_remaining: s.current_limit.as_ref().map(|_| s.limit_remaining),
            duration_until_reset: s
                .duration_until_reset
                .as_ref()
                .map(|d| duration(d.seconds, d.nanos)),
        }
    }
}

/// A `google.protobuf.Duration` as protojson writes it: seconds with an
/// `s`, and 3, 6 or 9 fractional digits when there is a fraction
/// (`"60s"`, `"1.500s"`). Durations here are never negative.
fn duration(seconds: i64, nanos: i32) -> String {
    let nanos = nanos.unsigned_abs();
    if nanos == 0 {
        format!("{seconds}s")
    } else if nanos % 1_000_000 == 0 {
        format!("{seconds}.{:03}s", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{seconds}.{:06}s", nanos / 1_000)
    } else {
        format!("{seconds}.{nanos:09}s")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn durations_are_written_as_protojson_does() {
        assert_eq!(duration(60, 0), "60s");
        assert_eq!(duration(1, 500_000_000), "1.500s");
        assert_eq!(duration(0, 1_000), "0.000001s");
        assert_eq!(duration(3, 1), "3.000000001s");
    }

    #[test]
    fn both_field_name_forms_and_string_integers_are_read() {
        let camel = parse(br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":"3"}],"hitsAddend":2}"#).unwrap();
        let snake = parse(br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"hits_addend":3}],"hits_addend":"2"}"#).unwrap();
        assert_eq!(camel, snake);
        assert_eq!(camel.hits_addend, 2);
        assert_eq!(camel.descriptors[0].hits_addend.as_ref().unwrap().value, 3);
        assert_eq!(camel.descriptors[0].entries[0].key, "k");
    }

    #[test]
    fn bad_bodies_name_the_problem() {
        let err = |b: &[u8]| parse(b).unwrap_err();
        assert!(err(b"{").contains("not a valid RateLimitRequest"));
        assert!(err(br#"{"domian":"d"}"#).contains("unknown field `domian`"));
        assert!(err(br#"{"hitsAddend":-1}"#).contains("-1"));
        assert!(err(br#"{"hitsAddend":4294967296}"#).contains("32 bits"));
        assert!(err(br#"{"hitsAddend":1,"hits_addend":1}"#).contains("duplicate"));
    }
}
