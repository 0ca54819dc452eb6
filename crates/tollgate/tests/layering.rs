//! The crates' layering, as docs/architecture.md states it: which
//! tollgate crate may depend on which. Read from `cargo metadata`, so an
//! edge added to a `Cargo.toml` that the table does not allow fails here
//! rather than in a review (the config API once depended on the whole
//! server for a clock).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Each library crate and the tollgate crates it may depend on (normal and
/// build dependencies). Dev-dependencies may add `tollgate-testing` and
/// `tollgate-faults`, and the crate itself (for test features); so may an
/// optional dependency, which only a test harness feature turns on (the
/// Redis store's and the config API's `testing`).
const ALLOWED: &[(&str, &[&str])] = &[
    ("tollgate-core", &[]),
    ("tollgate-proto", &[]),
    ("tollgate-tls", &[]),
    ("tollgate-auth", &[]),
    ("tollgate-faults", &[]),
    ("tollgate-testing", &[]),
    ("tollgate-config", &["tollgate-core"]),
    ("tollgate-store", &["tollgate-core"]),
    (
        "tollgate-service",
        &["tollgate-core", "tollgate-config", "tollgate-store"],
    ),
    (
        "tollgate-redis",
        &[
            "tollgate-core",
            "tollgate-store",
            "tollgate-tls",
            "tollgate-auth",
        ],
    ),
    ("tollgate-replica", &["tollgate-core", "tollgate-store"]),
    (
        "tollgate-sim",
        &["tollgate-core", "tollgate-store", "tollgate-replica"],
    ),
    (
        "tollgate-server",
        &[
            "tollgate-core",
            "tollgate-config",
            "tollgate-store",
            "tollgate-service",
            "tollgate-proto",
            "tollgate-tls",
            "tollgate-auth",
        ],
    ),
    (
        "tollgate-configapi",
        &["tollgate-core", "tollgate-config", "tollgate-auth"],
    ),
    ("tollgate-client", &["tollgate-proto", "tollgate-tls"]),
];

/// Crates only tests may use.
const DEV_ONLY: &[&str] = &["tollgate-testing", "tollgate-faults"];

/// A dependency on another tollgate crate.
struct Dep {
    name: String,
    /// `None` for normal, `Some("dev")`, `Some("build")`.
    kind: Option<String>,
    optional: bool,
}

/// Every workspace crate, with its tollgate dependencies.
fn workspace() -> BTreeMap<String, Vec<Dep>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter_map(|d| {
                    let name = d["name"].as_str()?;
                    names.contains(name).then(|| Dep {
                        name: name.to_owned(),
                        kind: d["kind"].as_str().map(str::to_owned),
                        optional: d["optional"].as_bool().unwrap_or(false),
                    })
                })
                .collect();
            (p["name"].as_str().expect("name").to_owned(), deps)
        })
        .collect()
}

#[test]
fn every_crate_depends_only_on_the_layers_below_it() {
    let workspace = workspace();
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut wrong = Vec::new();
    for (krate, deps) in &workspace {
        if krate == "tollgate" {
            // The binary is the composition root: it may use any crate,
            // but not ship the dev-only ones.
            for dep in deps {
                if dep.kind.as_deref() != Some("dev") && DEV_ONLY.contains(&dep.name.as_str()) {
                    wrong.push(format!("tollgate -> {} (dev-only crate)", dep.name));
                }
            }
            continue;
        }
        let Some(may) = allowed.get(krate.as_str()) else {
            wrong.push(format!(
                "{krate} is not in the layering table (tests/layering.rs and docs/architecture.md)"
            ));
            continue;
        };
        for dep in deps {
            let name = dep.name.as_str();
            let for_tests = dep.kind.as_deref() == Some("dev") || dep.optional;
            let ok =
                may.contains(&name) || (for_tests && (DEV_ONLY.contains(&name) || name == krate));
            if !ok {
                wrong.push(format!(
                    "{krate} -> {name} ({}{})",
                    dep.kind.as_deref().unwrap_or("normal"),
                    if dep.optional { ", optional" } else { "" }
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies the layering does not allow:\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn the_table_names_every_crate_of_the_workspace() {
    let workspace = workspace();
    for (krate, _) in ALLOWED {
        assert!(
            workspace.contains_key(*krate),
            "{krate} is in the layering table but not in the workspace"
        );
    }
}
