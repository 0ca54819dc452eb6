//! tollgate's Envoy RLS protos (`proto/envoy/`) against Envoy's own
//! definitions (the `envoy-types` crate): every field, set to a value of
//! its own, is read back under the same name in both directions, and a
//! message re-encoded by the other side is byte for byte the same (a field
//! either side lacked would be dropped; two fields with swapped numbers
//! would be read under the wrong names).

use envoy_types::pb::envoy as theirs;
use envoy_types::pb::google::protobuf as their_pb;
use prost::Message;
use tollgate_proto::rls as ours;

fn their_request() -> theirs::service::ratelimit::v3::RateLimitRequest {
    use theirs::extensions::common::ratelimit::v3::{rate_limit_descriptor, RateLimitDescriptor};
    theirs::service::ratelimit::v3::RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![
                rate_limit_descriptor::Entry {
                    key: "remote_address".to_owned(),
                    value: "10.0.0.1".to_owned(),
                },
                rate_limit_descriptor::Entry {
                    key: "path".to_owned(),
                    value: "/api".to_owned(),
                },
            ],
            limit: Some(rate_limit_descriptor::RateLimitOverride {
                requests_per_unit: 42,
                unit: theirs::r#type::v3::RateLimitUnit::Year as i32,
            }),
            hits_addend: Some(their_pb::UInt64Value { value: 7 }),
            is_negative_hits: true,
        }],
        hits_addend: 3,
    }
}

#[test]
fn an_envoy_request_reads_the_same_in_tollgate() -> Result<(), prost::DecodeError> {
    let bytes = their_request().encode_to_vec();
    let request = ours::RateLimitRequest::decode(bytes.as_slice())?;
    assert_eq!(request.domain, "edge");
    assert_eq!(request.hits_addend, 3);
    let [descriptor] = request.descriptors.as_slice() else {
        panic!("one descriptor expected: {request:?}");
    };
    let entries: Vec<(&str, &str)> = descriptor
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(entries, [("remote_address", "10.0.0.1"), ("path", "/api")]);
    let limit = descriptor
        .limit
        .as_ref()
        .map(|l| (l.requests_per_unit, l.unit));
    assert_eq!(limit, Some((42, ours::RateLimitUnit::Year as i32)));
    assert_eq!(descriptor.hits_addend, Some(ours::UInt64Value { value: 7 }));
    assert!(descriptor.is_negative_hits);
    assert_eq!(request.encode_to_vec(), bytes, "re-encoded differently");
    Ok(())
}

fn our_response() -> ours::RateLimitResponse {
    use ours::rate_limit_response::{rate_limit, Code, DescriptorStatus, Quota, RateLimit};
    let quota = |id: &str, requests| Quota {
        requests,
        id: id.to_owned(),
        expiration_specifier: Some(
            ours::rate_limit_response::quota::ExpirationSpecifier::ValidUntil(ours::Timestamp {
                seconds: 1_800_000_000,
                nanos: 5,
            }),
        ),
    };
    let mut fields = std::collections::HashMap::new();
    fields.insert("limited_by".to_owned(), string_value("burst"));
    ours::RateLimitResponse {
        overall_code: Code::OverLimit as i32,
        statuses: vec![DescriptorStatus {
            code: Code::OverLimit as i32,
            current_limit: Some(RateLimit {
                name: "per_ip".to_owned(),
                requests_per_unit: 10,
                unit: rate_limit::Unit::Week as i32,
            }),
            limit_remaining: 4,
            duration_until_reset: Some(ours::Duration {
                seconds: 9,
                nanos: 250,
            }),
            quota: Some(quota("descriptor", 11)),
        }],
        response_headers_to_add: vec![ours::HeaderValue {
            key: "ratelimit-remaining".to_owned(),
            value: "4".to_owned(),
            raw_value: b"raw-4".to_vec(),
        }],
        request_headers_to_add: vec![ours::HeaderValue {
            key: "x-limited".to_owned(),
            value: "yes".to_owned(),
            raw_value: Vec::new(),
        }],
        raw_body: b"slow down".to_vec(),
        dynamic_metadata: Some(ours::Struct { fields }),
        quota: Some(quota("overall", 12)),
    }
}

fn string_value(text: &str) -> ours::Value {
    ours::Value {
        kind: Some(ours::value::Kind::StringValue(text.to_owned())),
    }
}

#[test]
fn a_tollgate_response_reads_the_same_in_envoy() -> Result<(), prost::DecodeError> {
    use theirs::service::ratelimit::v3::rate_limit_response::{quota, rate_limit, Code};
    let bytes = our_response().encode_to_vec();
    let response = theirs::service::ratelimit::v3::RateLimitResponse::decode(bytes.as_slice())?;
    assert_eq!(response.overall_code, Code::OverLimit as i32);
    let [status] = response.statuses.as_slice() else {
        panic!("one status expected: {response:?}");
    };
    assert_eq!(status.code, Code::OverLimit as i32);
    let limit = status
        .current_limit
        .as_ref()
        .map(|l| (l.name.as_str(), l.requests_per_unit, l.unit));
    assert_eq!(limit, Some(("per_ip", 10, rate_limit::Unit::Week as i32)));
    assert_eq!(status.limit_remaining, 4);
    assert_eq!(
        status.duration_until_reset,
        Some(their_pb::Duration {
            seconds: 9,
            nanos: 250
        })
    );
    let their_quota = |q: Option<&theirs::service::ratelimit::v3::rate_limit_response::Quota>| {
        q.map(|q| (q.requests, q.id.clone(), q.expiration_specifier))
    };
    let valid_until = Some(quota::ExpirationSpecifier::ValidUntil(
        their_pb::Timestamp {
            seconds: 1_800_000_000,
            nanos: 5,
        },
    ));
    assert_eq!(
        their_quota(status.quota.as_ref()),
        Some((11, "descriptor".to_owned(), valid_until))
    );
    assert_eq!(
        their_quota(response.quota.as_ref()),
        Some((12, "overall".to_owned(), valid_until))
    );
    let headers = |h: &[theirs::config::core::v3::HeaderValue]| -> Vec<(String, String, Vec<u8>)> {
        h.iter()
            .map(|h| (h.key.clone(), h.value.clone(), h.raw_value.clone()))
            .collect()
    };
    assert_eq!(
        headers(&response.response_headers_to_add),
        [(
            "ratelimit-remaining".to_owned(),
            "4".to_owned(),
            b"raw-4".to_vec()
        )]
    );
    assert_eq!(
        headers(&response.request_headers_to_add),
        [("x-limited".to_owned(), "yes".to_owned(), Vec::new())]
    );
    assert_eq!(response.raw_body, b"slow down");
    let metadata = response
        .dynamic_metadata
        .as_ref()
        .and_then(|m| m.fields.get("limited_by"));
    assert_eq!(
        metadata.and_then(|v| v.kind.clone()),
        Some(their_pb::value::Kind::StringValue("burst".to_owned()))
    );
    assert_eq!(response.encode_to_vec(), bytes, "re-encoded differently");
    Ok(())
}

/// The service is the one Envoy calls: same package, service and method.
#[test]
fn the_service_path_is_envoys() {
    use tonic::server::NamedService;
    type Server = ours::rate_limit_service_server::RateLimitServiceServer<Never>;
    assert_eq!(
        <Server as NamedService>::NAME,
        "envoy.service.ratelimit.v3.RateLimitService"
    );
}

/// A service that never answers, only to name the server type.
struct Never;

#[tonic::async_trait]
impl ours::rate_limit_service_server::RateLimitService for Never {
    async fn should_rate_limit(
        &self,
        _: tonic::Request<ours::RateLimitRequest>,
    ) -> Result<tonic::Response<ours::RateLimitResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("never"))
    }
}
