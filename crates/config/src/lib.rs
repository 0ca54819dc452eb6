//! tollgate's configuration: YAML in, validated and normalized limits out.
//!
//! Two formats load into one [`Config`]:
//! - tollgate's own (`namespaces:` → resources), described in
//!   `docs/config.md`, which is the contract;
//! - envoyproxy/ratelimit's (`domain:` + `descriptors:`), unchanged and with
//!   that project's semantics ([`envoy`]).
//!
//! Loading is "parse, then resolve" (ripgrep's habit): [`yaml`] turns text
//! into a tree of nodes with positions; the format modules validate it and
//! apply Charon §4.1's normalization, reporting every change as a warning.
//! Every error names file, line and column. Loaders take text, so tests
//! never need files; [`load_path`] is the thin wrapper that reads them.
//!
//! What is not here: building live state. The service turns the resolved
//! config into plans.

#![deny(missing_docs)]

pub mod diag;
pub mod emit;
pub mod envoy;
pub mod model;
mod native;
pub mod units;
pub mod yaml;

use std::path::{Path, PathBuf};

pub use diag::{ConfigError, Diagnostic, Diagnostics, Pos};
pub use envoy::{DescriptorMatch, DescriptorTree};
pub use model::{
    AlgorithmSpec, Config, EnvoyMeta, LimitSpec, Namespace, RateResource, RateSpec, Resource,
    ResourceKind, MAX_LIMITS_PER_RESOURCE, RESERVED_LIMIT_NAMES,
};

/// A loaded config and the warnings normalization produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Loaded {
    /// The resolved config.
    pub config: Config,
    /// What normalization changed, and ignored fields.
    pub warnings: Vec<Diagnostic>,
}

/// Loads one YAML text, named `file` in messages. A text may hold several
/// YAML documents, each in either format.
pub fn load_str(file: &str, text: &str) -> Result<Loaded, ConfigError> {
    let mut diags = Diagnostics::default();
    let mut namespaces = Vec::new();
    read_text(file, text, &mut namespaces, &mut diags);
    finish(namespaces, diags, file)
}

/// Loads a file, or every `*.yaml` / `*.yml` file of a directory (sorted by
/// name, dotfiles skipped, as envoyproxy/ratelimit's runtime directory is
/// read); namespaces must be unique across files.
pub fn load_path(path: &Path) -> Result<Loaded, ConfigError> {
    let shown = path.display().to_string();
    let io_err = |e: std::io::Error, p: &Path| {
        ConfigError::one(
            &Pos {
                file: p.display().to_string(),
                line: 0,
                col: 0,
            },
            match e.kind() {
                std::io::ErrorKind::NotFound => {
                    format!("cannot read: {e} (check the path; `--config` takes a YAML file or a directory of them)")
                }
                _ => format!("cannot read: {e}"),
            },
        )
    };
    let files = config_files(path).map_err(|e| io_err(e, path))?;
    let mut diags = Diagnostics::default();
    let mut namespaces = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|e| io_err(e, f))?;
        read_text(&f.display().to_string(), &text, &mut namespaces, &mut diags);
    }
    finish(namespaces, diags, &shown)
}

/// The files a config path stands for: the path itself, or a directory's
/// `*.yaml` and `*.yml` files (not hidden ones, as envoyproxy/ratelimit
/// skips its runtime's `..data` entries), sorted.
pub fn config_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<_> = std::fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !name.starts_with('.')
                && (name.ends_with(".yaml") || name.ends_with(".yml"))
                && p.is_file()
        })
        .collect();
    files.sort();
    Ok(files)
}

fn read_text(file: &str, text: &str, namespaces: &mut Vec<Namespace>, diags: &mut Diagnostics) {
    let docs = match yaml::parse(file, text) {
        Ok(d) => d,
        Err(e) => {
            diags.errors.push(e);
            return;
        }
    };
    for doc in &docs {
        if matches!(doc.kind, yaml::Kind::Null) {
            continue;
        }
        let Some(root) = diags.take(doc.as_map("the config")) else {
            continue;
        };
        let found = if root.has("domain") {
            envoy::read(&root, diags).into_iter().collect()
        } else if root.has("namespaces") {
            native::read(&root, diags)
        } else {
            diags.error(
                &doc.pos,
                "expected `namespaces:` (tollgate format) or `domain:` (envoyproxy/ratelimit format) at the top level",
            );
            Vec::new()
        };
        for ns in found {
            if let Some(first) = namespaces.iter().find(|n: &&Namespace| n.name == ns.name) {
                diags.error(
                    &ns.pos,
                    format!(
                        "namespace `{}` is defined twice (first at {})",
                        ns.name, first.pos
                    ),
                );
                continue;
            }
            namespaces.push(ns);
        }
    }
}

fn finish(
    namespaces: Vec<Namespace>,
    diags: Diagnostics,
    file: &str,
) -> Result<Loaded, ConfigError> {
    if !diags.errors.is_empty() {
        return Err(ConfigError {
            errors: diags.errors,
        });
    }
    if namespaces.is_empty() {
        return Err(ConfigError::one(
            &Pos {
                file: file.to_owned(),
                line: 1,
                col: 1,
            },
            "the config defines no namespace",
        ));
    }
    Ok(Loaded {
        config: Config { namespaces },
        warnings: diags.warnings,
    })
}
