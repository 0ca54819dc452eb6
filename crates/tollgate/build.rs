//! Puts the git commit the binary is built from into
//! `TOLLGATE_GIT_COMMIT`, for `tollgate --version`.
//!
//! The commit is `git rev-parse --short HEAD`, or the
//! `TOLLGATE_GIT_COMMIT` environment variable when it is set (a container
//! build has no `.git`; `docker build --build-arg GIT_COMMIT=...` passes
//! it), or `unknown`. This script never fails the build: no git, no
//! repository, a detached or broken HEAD all give `unknown`.
//!
//! It runs again when HEAD moves: when `.git/HEAD` changes (a checkout) or
//! the branch it points to does (a commit), found through `git rev-parse
//! --git-path` so that worktrees work too. Only files that exist are
//! watched, since cargo reruns a script on every build while a watched
//! file is missing.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn watch(path: PathBuf) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TOLLGATE_GIT_COMMIT");
    let given = std::env::var("TOLLGATE_GIT_COMMIT")
        .ok()
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty());
    let commit = given.or_else(|| {
        let head = git(&["rev-parse", "--git-path", "HEAD"]).map(PathBuf::from)?;
        if let Ok(text) = std::fs::read_to_string(&head) {
            if let Some(branch) = text.trim().strip_prefix("ref: ") {
                if let Some(r) = git(&["rev-parse", "--git-path", branch]) {
                    watch(PathBuf::from(r));
                }
                if let Some(packed) = git(&["rev-parse", "--git-path", "packed-refs"]) {
                    watch(PathBuf::from(packed));
                }
            }
        }
        watch(head);
        git(&["rev-parse", "--short", "HEAD"])
    });
    // Only what can go in a version string: a hash, or `unknown`.
    let commit = commit
        .filter(|c| c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-'))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=TOLLGATE_GIT_COMMIT={commit}");
}
