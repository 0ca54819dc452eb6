//! tollgate's wire types.
//!
//! - [`v1`]: the native API (`proto/tollgate/v1/tollgate.proto`): a unary
//!   rate request and sessions that hold copies; client and server stubs.
//!   The messages are also the HTTP API's JSON bodies.
//! - [`rls`]: Envoy's rate-limit service v3
//!   (`envoy.service.ratelimit.v3`), from the maintained `envoy-types`
//!   crate, so what Envoy sends is decoded by the official definitions.
//! - [`FILE_DESCRIPTOR_SET`]: the descriptors of both, for gRPC server
//!   reflection.

#![deny(missing_docs)]

pub mod json;

/// The native API, generated from `proto/tollgate/v1/tollgate.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("tollgate.v1");
}

/// The encoded `FileDescriptorSet` of the native API and of Envoy's
/// rate-limit service v3 with every file it imports (Google's well-known
/// types included): what gRPC server reflection serves, so tools such as
/// `grpcurl` can list, describe and call both services. The native API's
/// files keep their comments; Envoy's are compiled, at the version of
/// `envoy-types` this build uses, without them.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));

/// Envoy's rate-limit service v3 and the types it uses.
pub mod rls {
    pub use envoy_types::pb::envoy::config::core::v3::HeaderValue;
    pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        rate_limit_descriptor, RateLimitDescriptor,
    };
    pub use envoy_types::pb::envoy::service::ratelimit::v3::*;
    pub use envoy_types::pb::google::protobuf::{Duration, UInt64Value};

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
        self.hits.unwrap_or(DEFAULT_HITS)
    }

    /// The fewest hits worth having: `min_hits`, or all of them when
    /// absent.
    pub fn min_hits_or_default(&self) -> u64 {
        self.min_hits.unwrap_or_else(|| self.hits_or_default())
    }
}
