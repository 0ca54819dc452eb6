//! Compiles `proto/tollgate/v1/tollgate.proto` with protox, a pure-Rust
//! protobuf compiler, so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("tollgate/v1/tollgate.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&root])?;
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
        .compile_fds(fds)?;
    Ok(())
}
