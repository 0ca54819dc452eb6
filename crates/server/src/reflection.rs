//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`) on the gRPC
//! port, so tools such as `grpcurl` can list the services, describe them
//! and call them without a copy of the protos.
//!
//! It serves [`tollgate_proto::FILE_DESCRIPTOR_SET`] (the native API, and
//! Envoy's rate-limit service with everything it imports) and
//! `tonic-health`'s descriptor of `grpc.health.v1.Health`. Both versions
//! are served because clients still differ: `grpcurl` asks v1 first and
//! falls back to v1alpha, older tools know only v1alpha.

use tonic_reflection::server::v1::{ServerReflection as V1, ServerReflectionServer as V1Server};
use tonic_reflection::server::v1alpha::{
    ServerReflection as V1Alpha, ServerReflectionServer as V1AlphaServer,
};
use tonic_reflection::server::{Builder, Error};

fn builder() -> Builder<'static> {
    Builder::configure()
        .register_encoded_file_descriptor_set(tollgate_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// The v1 reflection service, taking messages of at most
/// `max_message_bytes`. An error means a descriptor set compiled into the
/// binary does not decode.
pub fn v1(max_message_bytes: usize) -> Result<V1Server<impl V1>, Error> {
    Ok(builder()
        .build_v1()?
        .max_decoding_message_size(max_message_bytes))
}

/// The v1alpha reflection service, as [`v1`].
pub fn v1alpha(max_message_bytes: usize) -> Result<V1AlphaServer<impl V1Alpha>, Error> {
    Ok(builder()
        .build_v1alpha()?
        .max_decoding_message_size(max_message_bytes))
}
