//! The CLI's finish, as the real binary: `--version` names the git commit
//! it was built from, `completions` prints scripts that know `serve` and
//! its flags, `man` prints roff man pages.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::Sandbox;

/// `git rev-parse --short HEAD` of this repository, if git and the
/// repository are there.
fn head() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8(out.stdout).unwrap().trim().to_owned())
}

#[test]
fn version_names_the_version_and_the_commit_of_the_build() {
    let sb = Sandbox::new("cli-version");
    let run = sb.run(&["--version"]);
    assert!(run.success(), "{run}");
    let line = run.stdout.trim();
    let rest = line
        .strip_prefix(&format!("tollgate {} (commit ", env!("CARGO_PKG_VERSION")))
        .unwrap_or_else(|| panic!("version and commit{run}"));
    let commit = rest.strip_suffix(')').unwrap();
    assert!(!commit.is_empty(), "{run}");
    // The build script asked git, and runs again when HEAD moves (cargo
    // rebuilt the binary for this test if it did).
    match head() {
        // (TOLLGATE_GIT_COMMIT, when set, is the commit instead of git's.)
        Some(head) if std::env::var_os("TOLLGATE_GIT_COMMIT").is_none() => {
            assert_eq!(commit, head, "{run}");
        }
        _ => assert!(
            commit == "unknown" || commit.chars().all(|c| c.is_ascii_alphanumeric()),
            "{run}"
        ),
    }
    // Subcommands say it too.
    let run = sb.run(&["serve", "--version"]);
    assert!(run.stdout.contains(&format!("(commit {commit})")), "{run}");
}

#[test]
fn completions_know_serve_and_its_flags_in_every_shell() {
    let sb = Sandbox::new("cli-completions");
    for shell in ["bash", "zsh", "fish"] {
        let run = sb.run(&["completions", shell]);
        assert!(run.success(), "{run}");
        for word in [
            "serve",
            "check-config",
            "--check",
            "--config",
            "--store",
            "--cluster-secret-file",
            "--tls-client-ca",
        ] {
            // fish writes long flags without their dashes (`-l check`).
            let found = run.stdout.contains(word)
                || (shell == "fish" && run.stdout.contains(&format!("-l {}", &word[2..])));
            assert!(found, "{shell} completion lacks {word}{run}");
        }
    }
    let run = sb.run(&["completions", "tcsh"]);
    assert_eq!(run.code, Some(2), "{run}");
    assert!(run.stderr.contains("bash"), "the shells are listed{run}");
}

#[test]
fn man_prints_roff_pages_of_tollgate_and_of_a_subcommand() {
    let sb = Sandbox::new("cli-man");
    let run = sb.run(&["man"]);
    assert!(run.success(), "{run}");
    assert!(run.stdout.contains("\n.TH tollgate 1 "), "{run}");
    assert!(run.stdout.contains(".SH SYNOPSIS"), "{run}");
    assert!(run.stdout.contains("serve"), "{run}");
    let run = sb.run(&["man", "serve"]);
    assert!(run.success(), "{run}");
    assert!(run.stdout.contains("\n.TH tollgate-serve 1 "), "{run}");
    assert!(run.stdout.contains("\\-\\-check"), "{run}");
    assert!(run.stdout.contains("TOLLGATE_STORE"), "{run}");
    let run = sb.run(&["man", "nope"]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(run.stderr.contains("no subcommand `nope`"), "{run}");
}
