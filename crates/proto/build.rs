//! Compiles the protos under `proto/` with protox, a pure-Rust protobuf
//! compiler, so building needs no system `protoc`:
//!
//! - `tollgate/v1/tollgate.proto`, the native API;
//! - `envoy/service/ratelimit/v3/rls.proto` and the three files it imports,
//!   Envoy's rate-limit service v3 as tollgate serves it (the wire contract
//!   of Envoy's own definitions, checked against them by a test).
//!
//! It also writes the descriptors that gRPC server reflection serves
//! (`descriptors.bin` in `OUT_DIR`): both, with their comments, and
//! Google's well-known types they import.

use std::path::Path;

/// The native API.
const TOLLGATE_PROTO: &str = "tollgate/v1/tollgate.proto";

/// Envoy's rate-limit service, and what it imports.
const RLS_PROTOS: [&str; 4] = [
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/type/v3/ratelimit_unit.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not baked in when it is compiled: a build
    // script compiled for one checkout can be reused by another (a second
    // worktree sharing the target directory), and must read that one's files.
    let manifest = std::env::var("CARGO_MANIFEST_DIR")?;
    let root = Path::new(&manifest).join("../../proto");
    for file in std::iter::once(TOLLGATE_PROTO).chain(RLS_PROTOS) {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let native = protox::compile([TOLLGATE_PROTO], [&root])?;
    let rls = protox::compile([RLS_PROTOS[0]], [&root])?;
    write_descriptors(&native, &rls)?;
    // The messages double as the HTTP API's JSON bodies: field names as in
    // the proto, absent fields default, unknown fields refused.
    let serde_message =
        "#[derive(serde::Serialize, serde::Deserialize)] #[serde(default, deny_unknown_fields)]";
    let serde_enum =
        "#[derive(serde::Serialize, serde::Deserialize)] #[serde(rename_all = \"snake_case\")]";
    tonic_prost_build::configure()
        .message_attribute(".tollgate.v1", serde_message)
        .enum_attribute(".tollgate.v1", serde_enum)
        .field_attribute(
            ".tollgate.v1.RateRequest.mode",
            "#[serde(with = \"crate::json::mode\")]",
        )
        .field_attribute(
            ".tollgate.v1.RateResponse.limited_by",
            "#[serde(with = \"crate::json::limited_by\")]",
        )
        // Only resources with a `limits:` list fill these: every other
        // answer stays as it was, byte for byte.
        .field_attribute(
            ".tollgate.v1.RateResponse.limits",
            "#[serde(skip_serializing_if = \"Vec::is_empty\")]",
        )
        .field_attribute(
            ".tollgate.v1.RateResponse.limited_by_name",
            "#[serde(skip_serializing_if = \"String::is_empty\")]",
        )
        .compile_fds(native)?;
    // Envoy's types, with Google's well-known types generated beside them
    // (so `Duration` and `UInt64Value` are plain messages, as in Envoy's
    // own Rust bindings), in one module tree: `envoy_rls.rs`.
    tonic_prost_build::configure()
        .compile_well_known_types(true)
        .include_file("envoy_rls.rs")
        .compile_fds(rls)?;
    Ok(())
}

/// Writes `descriptors.bin`: both sets, each file once.
fn write_descriptors(
    native: &prost_types::FileDescriptorSet,
    rls: &prost_types::FileDescriptorSet,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut set = native.clone();
    for file in &rls.file {
        if !set.file.iter().any(|f| f.name == file.name) {
            set.file.push(file.clone());
        }
    }
    let out = Path::new(&std::env::var("OUT_DIR")?).join("descriptors.bin");
    std::fs::write(out, prost::Message::encode_to_vec(&set))?;
    Ok(())
}
