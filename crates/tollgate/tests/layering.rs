//! The crates' layering, as docs/architecture.md states it: which
//! tollgate crate may depend on which. Read from `cargo metadata`, so an
//! edge added to a `Cargo.toml` that the table does not allow fails here
//! rather than in a review (the config API once depended on the whole
//! server for a clock).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// The layering table of docs/architecture.md ("may depend on"): each
/// library crate and the tollgate crates it may depend on (normal and
/// build dependencies). The test reads the page itself, so the page and
/// the check cannot say different things. Dev-dependencies may add
/// `tollgate-testing` and `tollgate-faults`, and the crate itself (for test
/// features); so may an optional dependency that the crate's `testing`
/// feature turns on (the Redis store's and the config API's harnesses).
fn allowed() -> BTreeMap<String, BTreeSet<String>> {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md"),
    )
    .expect("docs/architecture.md");
    let table = page
        .split("| crate | may depend on")
        .nth(1)
        .expect("the layering table in docs/architecture.md");
    let mut allowed = BTreeMap::new();
    for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (crates, deps) = (cells[1], cells[2]);
        let deps: BTreeSet<String> = match deps {
            "none" | "any" => BTreeSet::new(),
            list => list
                .split(',')
                .map(|d| format!("tollgate-{}", d.trim()))
                .collect(),
        };
        for krate in crates.split('`').skip(1).step_by(2) {
            allowed.insert(krate.to_owned(), deps.clone());
        }
    }
    assert!(
        allowed.len() > 10,
        "the layering table was not read: {allowed:?}"
    );
    allowed
}

/// Crates only tests may use.
const DEV_ONLY: &[&str] = &["tollgate-testing", "tollgate-faults"];

/// A dependency on another tollgate crate.
struct Dep {
    name: String,
    /// `None` for normal, `Some("dev")`, `Some("build")`.
    kind: Option<String>,
    /// Optional, and turned on by the crate's `testing` feature.
    for_testing: bool,
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
            let testing: Vec<&str> = p["features"]["testing"]
                .as_array()
                .map(|f| f.iter().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter_map(|d| {
                    let name = d["name"].as_str()?;
                    names.contains(name).then(|| Dep {
                        name: name.to_owned(),
                        kind: d["kind"].as_str().map(str::to_owned),
                        for_testing: d["optional"].as_bool().unwrap_or(false)
                            && testing
                                .iter()
                                .any(|f| *f == name || *f == format!("dep:{name}")),
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
    let allowed = allowed();
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
            let for_tests = dep.kind.as_deref() == Some("dev") || dep.for_testing;
            let ok =
                may.contains(name) || (for_tests && (DEV_ONLY.contains(&name) || name == krate));
            if !ok {
                wrong.push(format!(
                    "{krate} -> {name} ({}{})",
                    dep.kind.as_deref().unwrap_or("normal"),
                    if dep.for_testing {
                        ", testing feature"
                    } else {
                        ""
                    }
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
    for krate in allowed().keys() {
        assert!(
            workspace.contains_key(krate),
            "{krate} is in the layering table but not in the workspace"
        );
    }
}
