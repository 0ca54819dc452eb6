//! tollgate's wire types.
//!
//! - [`v1`]: the native API (`proto/tollgate/v1/tollgate.proto`): a unary
//!   rate request and sessions that hold copies; client and server stubs.
//!   The messages are also the HTTP API's JSON bodies.
//! - [`rls`]: Envoy's rate-limit service v3
//!   (`envoy.service.ratelimit.v3`), generated from `proto/envoy/`: the
//!   wire contract of Envoy's own definitions (a test encodes every field
//!   with the `envoy-types` crate and decodes it with these, and back),
//!   without compiling all of Envoy's API, which took a tenth of a first
//!   build.
//! - [`FILE_DESCRIPTOR_SET`]: the descriptors of both, for gRPC server
//!   reflection.

#![deny(missing_docs)]

pub mod answer_json;
pub mod json;

/// The native API, generated from `proto/tollgate/v1/tollgate.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("tollgate.v1");
}

/// The encoded `FileDescriptorSet` of the native API and of Envoy's
/// rate-limit service v3 with every file it imports (Google's well-known
/// types included), with their comments: what gRPC server reflection
/// serves, so tools such as `grpcurl` can list, describe and call both
/// services.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));

/// The generated module tree of Envoy's rate-limit service: `envoy::...`
/// and the `google::protobuf` types it uses.
// Google's wrappers file brings types nobody here uses.
#[allow(missing_docs, dead_code, clippy::all, clippy::pedantic)]
mod envoy_rls {
    include!(concat!(env!("OUT_DIR"), "/envoy_rls.rs"));
}

/// Envoy's rate-limit service v3 and the types it uses.
pub mod rls {
    pub use crate::envoy_rls::envoy::config::core::v3::HeaderValue;
    pub use crate::envoy_rls::envoy::extensions::common::ratelimit::v3::{
        rate_limit_descriptor, RateLimitDescriptor,
    };
    pub use crate::envoy_rls::envoy::r#type::v3::RateLimitUnit;
    pub use crate::envoy_rls::envoy::service::ratelimit::v3::*;
    pub use crate::envoy_rls::google::protobuf::{
        value, Duration, Struct, Timestamp, UInt64Value, Value,
    };

    /// A descriptor of `(key, value)` entries, as Envoy sends them.
    pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(key, value)| rate_limit_descriptor::Entry {
                    key: (*key).to_owned(),
                    value: (*value).to_owned(),
                })
                .collect(),
            ..RateLimitDescriptor::default()
        }
    }
}

/// Hits a rate request asks for when it leaves `hits` out: one, as the
/// CLI, replay and Envoy (which charges `max(1, hits_addend)`) count. A
/// probe (`hits: 0`) must be asked for explicitly.
pub const DEFAULT_HITS: u64 = 1;

impl v1::RateRequest {
    /// The hits asked for: `hits`, or [`DEFAULT_HITS`] when absent.
    pub fn hits_or_default(&self) -> u64 {
        self.view().hits_or_default()
    }

    /// The fewest hits worth having: `min_hits`, or all of them when
    /// absent.
    pub fn min_hits_or_default(&self) -> u64 {
        self.view().min_hits_or_default()
    }

    /// Its fields, borrowed.
    pub fn view(&self) -> RateRequestView<'_> {
        RateRequestView {
            namespace: &self.namespace,
            resource: &self.resource,
            domain: &self.domain,
            hits: self.hits,
            min_hits: self.min_hits,
            mode: self.mode,
            limit: self
                .limit
                .as_ref()
                .map(|l| (l.requests_per_unit, l.unit.as_str())),
        }
    }
}

/// A rate request's fields, borrowed: from a decoded [`v1::RateRequest`]
/// (gRPC) or from a JSON body read without copying its strings
/// ([`json::RateRequestJson`], HTTP), so the server decides either the
/// same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateRequestView<'a> {
    /// `namespace`.
    pub namespace: &'a str,
    /// `resource`.
    pub resource: &'a str,
    /// `domain`.
    pub domain: &'a str,
    /// `hits`, if given.
    pub hits: Option<u64>,
    /// `min_hits`, if given.
    pub min_hits: Option<u64>,
    /// `mode`, as the proto's number.
    pub mode: i32,
    /// `limit`, if given: `requests_per_unit` and the unit's name.
    pub limit: Option<(u64, &'a str)>,
}

impl RateRequestView<'_> {
    /// The hits asked for: `hits`, or [`DEFAULT_HITS`] when absent.
    pub fn hits_or_default(&self) -> u64 {
        self.hits.unwrap_or(DEFAULT_HITS)
    }

    /// The fewest hits worth having: `min_hits`, or all of them when
    /// absent.
    pub fn min_hits_or_default(&self) -> u64 {
        self.min_hits.unwrap_or_else(|| self.hits_or_default())
    }
}
