//! The limiting server that the console's live usage (`config-api
//! --servers`) reads in end-to-end tests: `tollgate serve` with one fixed
//! window, its admin endpoints taking [`SERVERS_TOKEN`], and the file the
//! config API sends that token from.

use std::path::PathBuf;

use super::serving::Serving;
use super::Sandbox;

/// The read token the limiting server takes for its admin endpoints
/// (`serve --admin-tokens-file`), which the config API sends from
/// `--servers-token-file`.
pub const SERVERS_TOKEN: &str = "console-read-token-0123456789";

/// Starts `tollgate serve` on free ports with `shop/RESOURCE` (a fixed
/// window of 2 an hour) in a file of its own, taking [`SERVERS_TOKEN`] for
/// its admin endpoints, plus `extra` flags (TLS). Returns it and the file
/// holding the token, for the config API's `--servers-token-file`.
pub fn limiting_server(dir: &Sandbox, resource: &str, extra: &[&str]) -> (Serving, PathBuf) {
    let file = dir.write(
        "limits.yaml",
        format!(
            "namespaces:\n  - name: shop\n    resources:\n      \
             - {{ name: {resource}, algorithm: fixed_window, limit: 2, window: 1h }}\n"
        ),
    );
    let tokens = dir.write("admin-tokens", format!("read:console:{SERVERS_TOKEN}\n"));
    let mut args = vec![
        "--config",
        file.to_str().unwrap(),
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--admin-tokens-file",
        tokens.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let server = Serving::start(dir, &args, &[]);
    let token_file = dir.write("servers-token", format!("{SERVERS_TOKEN}\n"));
    (server, token_file)
}
