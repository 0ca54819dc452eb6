//! Every shell example of README.md and docs/ runs as written.
//!
//! Each page's ```sh blocks run in order in one bash session, in a fresh
//! directory holding a copy of the repository's `examples/` and `proto/`,
//! against the binary under test, on loopback; where a page shows a
//! command's output, the run must print it (see `matching` for what may differ). So a page
//! that drifts from the program fails here. How to write an example that
//! runs is in docs/README.md ("Examples are tested").
//!
//! Rewrites, so a page can read as a reader types it:
//! - `cargo run --release -- ARGS` (and the `-p tollgate` forms) run
//!   `tollgate ARGS`, the binary under test, found first on `PATH`;
//! - every port written after `localhost:`, `127.0.0.1:` or `0.0.0.0:`, and
//!   the defaults' ports (8080, 8081, 8090, 7946), become free loopback
//!   ports, in commands and in shown output alike; `0.0.0.0` becomes
//!   `127.0.0.1` (nothing listens beyond loopback); the defaults point at
//!   the same free ports through `TOLLGATE_GRPC`, `TOLLGATE_HTTP`, ...
//! - ids a page shows become the ids the run printed in their place.
//!
//! `tollgate serve` and `tollgate config-api` (without `--check`) run in the
//! background until the page is done, and the page goes on once they log
//! that they listen; in a block without prompts, a server started by a
//! later line replaces one started by an earlier line of the same block
//! (such blocks list alternatives).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
mod markdown;
mod matching;
mod session;

use std::collections::BTreeMap;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use markdown::Block;
use matching::Ids;
use session::{Background, Session, Start};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The hosts after which a port is rewritten.
const HOSTS: &[&str] = &["localhost:", "127.0.0.1:", "0.0.0.0:"];

/// The ports the binary uses when a page names none.
const DEFAULT_PORTS: &[u16] = &[8080, 8081, 8090, 7946];

/// The page's ports, each bound to a free loopback port.
struct Ports {
    map: BTreeMap<u16, u16>,
}

impl Ports {
    /// Every port the page's shell blocks write after a host, plus the
    /// defaults; each gets a port free for both TCP and UDP (gossip).
    fn for_page(blocks: &[Block]) -> Ports {
        let mut wanted: Vec<u16> = DEFAULT_PORTS.to_vec();
        for step in blocks.iter().flat_map(|b| &b.steps) {
            let mut text = step.command.clone();
            for line in step.expected.iter().flatten() {
                text.push('\n');
                text.push_str(line);
            }
            for host in HOSTS {
                for (at, _) in text.match_indices(host) {
                    let digits: String = text[at + host.len()..]
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .collect();
                    if let Ok(port) = digits.parse::<u16>() {
                        if port != 0 && !wanted.contains(&port) {
                            wanted.push(port);
                        }
                    }
                }
            }
        }
        // Held until all are chosen, so no two are the same.
        let mut held = Vec::new();
        let mut map = BTreeMap::new();
        for port in wanted {
            loop {
                let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
                let free = tcp.local_addr().unwrap().port();
                if let Ok(udp) = UdpSocket::bind(("127.0.0.1", free)) {
                    held.push((tcp, udp));
                    map.insert(port, free);
                    break;
                }
            }
        }
        Ports { map }
    }

    /// `text` with the page's ports replaced (see the module doc).
    fn apply(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        'scan: while !rest.is_empty() {
            for host in HOSTS {
                if let Some(after) = rest.strip_prefix(host) {
                    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
                    if let Some(free) = digits.parse::<u16>().ok().and_then(|p| self.map.get(&p)) {
                        let host = if *host == "0.0.0.0:" {
                            "127.0.0.1:"
                        } else {
                            host
                        };
                        out.push_str(host);
                        out.push_str(&free.to_string());
                        rest = &after[digits.len()..];
                        continue 'scan;
                    }
                }
            }
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
        out
    }

    fn get(&self, port: u16) -> u16 {
        self.map[&port]
    }
}

/// `cargo run ... -- ARGS` as `tollgate ARGS`.
fn rewrite(command: &str) -> String {
    let mut out = command.to_owned();
    for cargo in [
        "cargo run --release -p tollgate -- ",
        "cargo run -p tollgate --release -- ",
        "cargo run --release -- ",
        "cargo run -p tollgate -- ",
        "cargo run -- ",
    ] {
        out = out.replace(cargo, "tollgate ");
    }
    out
}

/// Whether `command` starts a server that runs until stopped.
fn long_running(command: &str) -> bool {
    let mut words = command
        .split_whitespace()
        .skip_while(|w| w.contains('=') && !w.starts_with('-'));
    if words.next() != Some("tollgate") {
        return false;
    }
    let sub = words.find(|w| !w.starts_with('-'));
    matches!(sub, Some("serve" | "config-api")) && !command.contains("--check")
}

/// Whether `tool` is on `PATH`.
fn installed(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

/// Copies `from` into `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Runs every shell block of the page at `page` (relative to the root).
fn page(page: &str) {
    let text = std::fs::read_to_string(root().join(page)).unwrap();
    let blocks = markdown::blocks(&text).unwrap_or_else(|e| panic!("{page}: {e}"));
    if blocks.iter().all(|b| b.skip.is_some()) {
        return;
    }
    let dir = std::env::temp_dir().join(format!(
        "tollgate-docs-{}-{}",
        page.replace('/', "-"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&root().join("examples"), &dir.join("examples"));
    // grpcurl examples name the native API's .proto files.
    copy_dir(&root().join("proto"), &dir.join("proto"));
    let bin = dir.join(".doctest/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(dir.join("home")).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tollgate"), bin.join("tollgate")).unwrap();
    let ports = Ports::for_page(&blocks);
    let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let at = |p: u16| format!("127.0.0.1:{}", ports.get(p));
    let env = vec![
        ("PATH".to_owned(), path.to_string_lossy().into_owned()),
        ("HOME".to_owned(), dir.join("home").display().to_string()),
        ("NO_COLOR".to_owned(), "1".to_owned()),
        ("TOLLGATE_GRPC".to_owned(), at(8081)),
        ("TOLLGATE_HTTP".to_owned(), at(8080)),
        ("TOLLGATE_SERVER".to_owned(), at(8081)),
        ("TOLLGATE_CONFIG_API_LISTEN".to_owned(), at(8090)),
        ("TOLLGATE_GOSSIP".to_owned(), at(7946)),
    ];
    let result = run_blocks(page, &blocks, &dir, &env, &ports);
    // Kept when the page fails, to look at.
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if let Err(why) = result {
        panic!("{why}\n(the page ran in {})", dir.display());
    }
}

fn run_blocks(
    page: &str,
    blocks: &[Block],
    dir: &Path,
    env: &[(String, String)],
    ports: &Ports,
) -> Result<(), String> {
    let mut session = Session::start(dir, env);
    let mut ids = Ids::default();
    let mut servers: Vec<Background> = Vec::new();
    for block in blocks {
        if let Some(reason) = &block.skip {
            eprintln!("{page}:{}: not run: {reason}", block.line);
            continue;
        }
        if let Some(tool) = block.needs.as_deref().filter(|t| !installed(t)) {
            eprintln!("{page}:{}: not run: `{tool}` is not installed", block.line);
            continue;
        }
        let script = block.steps.iter().all(|s| s.expected.is_none());
        let mut this_block: Vec<usize> = Vec::new();
        for step in &block.steps {
            let command = ids.apply(&ports.apply(&rewrite(&step.command)));
            let expected: Option<Vec<String>> = step
                .expected
                .as_ref()
                .map(|lines| lines.iter().map(|l| ports.apply(l)).collect());
            let expected = expected.filter(|e| !e.is_empty());
            let fail = |why: String, servers: &[Background]| {
                let logs: String = servers
                    .iter()
                    .map(|s| {
                        let log = std::fs::read_to_string(&s.log).unwrap_or_default();
                        let tail: Vec<&str> = log.lines().rev().take(20).collect();
                        let tail: Vec<&str> = tail.into_iter().rev().collect();
                        format!(
                            "\n--- background {} (last lines) ---\n{}",
                            s.pid,
                            tail.join("\n")
                        )
                    })
                    .collect();
                format!("{page}:{}: `{command}`: {why}{logs}", step.line)
            };
            if long_running(&command) {
                if script {
                    let earlier: Vec<Background> = this_block
                        .drain(..)
                        .rev()
                        .map(|i| servers.remove(i))
                        .collect();
                    session.stop(&earlier);
                }
                let bg = session.spawn(&command).map_err(|w| fail(w, &servers))?;
                let (started, log) = match session.ready(&bg) {
                    Start::Ready(log) => (true, log),
                    Start::Exited(log) => (false, log),
                };
                match &expected {
                    Some(e) => {
                        // The page shows the start of its log.
                        let mut e = e.clone();
                        e.push("...".into());
                        matching::output(&e, &log, &mut ids).map_err(|w| fail(w, &servers))?;
                    }
                    None if !started => {
                        return Err(fail(format!("it did not start:\n{log}"), &servers));
                    }
                    None => {}
                }
                if started {
                    this_block.push(servers.len());
                    servers.push(bg);
                }
                continue;
            }
            let (code, printed) = session
                .run(&command, Duration::from_secs(120))
                .map_err(|w| fail(w, &servers))?;
            match &expected {
                Some(e) => {
                    matching::output(e, &printed, &mut ids).map_err(|w| fail(w, &servers))?
                }
                None if code != Some(0) => {
                    return Err(fail(
                        format!("exit status {code:?}; it printed:\n{printed}"),
                        &servers,
                    ));
                }
                None => {}
            }
        }
    }
    session.stop(&servers);
    Ok(())
}

/// Every page with shell examples, one test each (they run in parallel).
macro_rules! pages {
    ($($name:ident => $file:literal,)*) => {
        $(
            #[test]
            fn $name() {
                page($file);
            }
        )*

        /// The pages above are every Markdown page there is: a new page
        /// is tested too.
        #[test]
        fn every_page_is_listed() {
            let listed = [$($file),*];
            let mut found = vec!["README.md".to_owned()];
            let mut stack = vec![root().join("docs")];
            while let Some(dir) = stack.pop() {
                for entry in std::fs::read_dir(&dir).unwrap() {
                    let path = entry.unwrap().path();
                    if path.is_dir() {
                        stack.push(path);
                    } else if path.extension().is_some_and(|e| e == "md") {
                        let rel = path.strip_prefix(root()).unwrap();
                        found.push(rel.to_string_lossy().into_owned());
                    }
                }
            }
            for page in &found {
                let text = std::fs::read_to_string(root().join(page)).unwrap();
                let blocks = markdown::blocks(&text).unwrap_or_else(|e| panic!("{page}: {e}"));
                assert!(
                    blocks.is_empty() || listed.contains(&page.as_str()),
                    "{page} has shell examples but is not listed in tests/docs/main.rs"
                );
            }
        }
    };
}

pages! {
    readme => "README.md",
    docs_readme => "docs/README.md",
    benchmarks => "docs/benchmarks.md",
    build => "docs/build.md",
    client => "docs/client.md",
    config => "docs/config.md",
    config_api => "docs/config-api.md",
    deploy => "docs/deploy.md",
    envoy_rls => "docs/envoy-rls.md",
    http_api => "docs/http-api.md",
    precision => "docs/precision.md",
    reliability => "docs/reliability.md",
    replay => "docs/replay.md",
    replicated => "docs/replicated.md",
    server => "docs/server.md",
    redis => "docs/redis.md",
}
