//! Compiles `proto/tollgate/v1/tollgate.proto` with protox, a pure-Rust
//! protobuf compiler, so building needs no system `protoc`.
//!
//! It also writes the descriptors that gRPC server reflection serves
//! (`descriptors.bin` in `OUT_DIR`): tollgate's proto and Envoy's
//! rate-limit service v3 with everything it imports. `envoy-types` ships
//! Envoy's `.proto` files but no descriptors of them (its maintainer
//! declined to add them, since the crate holds hundreds of services), so
//! they are compiled here from the copy of `envoy-types` this build uses:
//! the one in Cargo's registry at the version `Cargo.lock` names, or, for a
//! vendored build, the directory `TOLLGATE_ENVOY_TYPES_DIR` names.

use std::path::{Path, PathBuf};

/// The Envoy service tollgate serves, the root of the descriptors taken
/// from `envoy-types`.
const RLS_PROTO: &str = "envoy/service/ratelimit/v3/rls.proto";

/// Where `envoy-types` keeps the protos `RLS_PROTO` imports, under its
/// `proto/` directory (Envoy's API, protoc-gen-validate, xDS and udpa
/// annotations); Google's well-known types are protox's own.
const ENVOY_INCLUDES: [&str; 3] = ["data-plane-api", "protoc-gen-validate", "xds"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.join("../../proto");
    let file = root.join("tollgate/v1/tollgate.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&root])?;
    write_descriptors(manifest, fds.clone())?;
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

/// Writes `descriptors.bin`: `tollgate` (with its comments, which
/// reflection clients show) and Envoy's RLS with its imports (without
/// source info, which would triple its size for comments nobody reads
/// through tollgate), each file once.
fn write_descriptors(
    manifest: &Path,
    mut set: prost_types::FileDescriptorSet,
) -> Result<(), Box<dyn std::error::Error>> {
    let envoy = envoy_types_dir(manifest)?.join("proto");
    let includes: Vec<PathBuf> = ENVOY_INCLUDES.iter().map(|d| envoy.join(d)).collect();
    let rls = protox::Compiler::new(&includes)?
        .include_imports(true)
        .include_source_info(false)
        .open_file(RLS_PROTO)?
        .file_descriptor_set();
    for file in rls.file {
        if !set.file.iter().any(|f| f.name == file.name) {
            set.file.push(file);
        }
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("descriptors.bin");
    std::fs::write(out, prost::Message::encode_to_vec(&set))?;
    Ok(())
}

/// The `envoy-types` package directory this build compiles.
fn envoy_types_dir(manifest: &Path) -> Result<PathBuf, String> {
    println!("cargo:rerun-if-env-changed=TOLLGATE_ENVOY_TYPES_DIR");
    if let Some(dir) = std::env::var_os("TOLLGATE_ENVOY_TYPES_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let lock = manifest.join("../../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(&lock)
        .map_err(|e| format!("cannot read {}: {e}", lock.display()))?;
    let version = locked_version(&text, "envoy-types")
        .ok_or_else(|| format!("{} names no envoy-types package", lock.display()))?;
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let registry = cargo_home.join("registry/src");
    let package = format!("envoy-types-{version}");
    let found = std::fs::read_dir(&registry)
        .into_iter()
        .flatten()
        .flatten()
        .map(|index| index.path().join(&package))
        .find(|dir| {
            dir.join("proto")
                .join(ENVOY_INCLUDES[0])
                .join(RLS_PROTO)
                .is_file()
        });
    found.ok_or_else(|| {
        format!(
            "cannot find {package}'s proto files under {}: for a vendored build, set \
             TOLLGATE_ENVOY_TYPES_DIR to the envoy-types package directory",
            registry.display()
        )
    })
}

/// The version `Cargo.lock` gives package `name` (the first, should there
/// be several).
fn locked_version<'a>(lock: &'a str, name: &str) -> Option<&'a str> {
    let wanted = format!("name = \"{name}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == wanted {
            let version = lines.next()?.trim().strip_prefix("version = \"")?;
            return version.strip_suffix('"');
        }
    }
    None
}
