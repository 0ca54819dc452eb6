//! A running `tollgate config-api` for end-to-end tests: a real process
//! on a free port with an admin and a read token, and an HTTP client.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tollgate_testing::KillOnDrop;

use super::Sandbox;

/// The admin token every test API knows (token name `alice`).
pub const ADMIN: &str = "admin-token-0123456789";
/// The read token every test API knows (token name `fleet`).
pub const READER: &str = "read-token-0123456789ab";

/// An SQLite database in the sandbox.
pub fn sqlite(dir: &Sandbox, file: &str) -> String {
    format!("sqlite://{}", dir.path(file).display())
}

/// A running `tollgate config-api`, killed on drop (by its guard).
pub struct ConfigApi {
    /// The process; only held, as dropping the guard kills it.
    _child: KillOnDrop,
    /// Where it listens.
    pub addr: SocketAddr,
    /// `http` or `https`.
    pub scheme: String,
    /// A client for it.
    pub http: reqwest::Client,
}

impl ConfigApi {
    pub fn start(dir: &Sandbox, database: &str, extra: &[&str]) -> ConfigApi {
        ConfigApi::start_trusting(dir, database, extra, None)
    }

    /// Starts it on an SQLite database `t.db` in the sandbox.
    pub fn start_sqlite(dir: &Sandbox, extra: &[&str]) -> ConfigApi {
        ConfigApi::start(dir, &sqlite(dir, "t.db"), extra)
    }

    /// Starts it; its HTTPS certificate is signed by `ca` (PEM).
    pub fn start_trusting(
        dir: &Sandbox,
        database: &str,
        extra: &[&str],
        ca: Option<&str>,
    ) -> ConfigApi {
        let tokens = format!("admin:alice:{ADMIN}\nread:fleet:{READER}\n");
        ConfigApi::start_with_tokens(dir, database, extra, ca, &tokens)
    }

    /// Starts it with `tokens` (the tokens file's text) instead of
    /// [`ADMIN`] and [`READER`].
    pub fn start_with_tokens(
        dir: &Sandbox,
        database: &str,
        extra: &[&str],
        ca: Option<&str>,
        tokens: &str,
    ) -> ConfigApi {
        ConfigApi::start_with_env(dir, database, extra, ca, tokens, &[])
    }

    /// Starts it as [`ConfigApi::start_with_tokens`] does, with `env` set
    /// in its environment.
    pub fn start_with_env(
        dir: &Sandbox,
        database: &str,
        extra: &[&str],
        ca: Option<&str>,
        tokens: &str,
        env: &[(&str, &str)],
    ) -> ConfigApi {
        let tokens = dir.write("tokens", tokens);
        let listen = if extra.contains(&"--listen") {
            &[][..]
        } else {
            &["--listen", "127.0.0.1:0"][..]
        };
        let mut child = KillOnDrop::spawn(
            Command::new(env!("CARGO_BIN_EXE_tollgate"))
                .args(["config-api", "--log-format", "json"])
                .args(listen)
                .args(["--database", database])
                .arg("--tokens-file")
                .arg(&tokens)
                .args(extra)
                .current_dir(&dir.dir)
                .env("TOLLGATE_LOG", "info")
                .env_remove("TOLLGATE_DATABASE")
                .env_remove("TOLLGATE_CONFIG_API_TOKENS")
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        )
        .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line).unwrap_or(json!({ "raw": line }));
                let _ = tx.send(v);
            }
        });
        let mut seen = Vec::new();
        let (addr, scheme) = loop {
            let v = rx
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("no listening line: {seen:?}"));
            if v["fields"]["message"] == "tollgate config-api listening" {
                let addr = v["fields"]["addr"].as_str().unwrap().parse().unwrap();
                break (addr, v["fields"]["scheme"].as_str().unwrap().to_owned());
            }
            seen.push(v);
        };
        let mut http = reqwest::Client::builder();
        if let Some(ca) = ca {
            http =
                http.add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap());
        }
        ConfigApi {
            _child: child,
            addr,
            scheme,
            http: http.build().unwrap(),
        }
    }

    /// The URL of `path` on it.
    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme, self.addr)
    }

    pub async fn call(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> (u16, Value) {
        let (status, v, _) = self.call_with(token, method, path, body, &[]).await;
        (status, v)
    }

    /// A call with extra request `headers`: the status, the JSON answer
    /// and the answer's `ETag` (if any).
    pub async fn call_with(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (u16, Value, Option<String>) {
        let url = self.url(path);
        let mut req = self
            .http
            .request(method.parse().unwrap(), url)
            .header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.body(b.to_owned());
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let etag = resp
            .headers()
            .get("etag")
            .map(|v| v.to_str().unwrap().to_owned());
        let text = resp.text().await.unwrap();
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, v, etag)
    }

    /// An admin write under `If-Match: "revision"` (`None`: no header).
    pub async fn write_at(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        revision: Option<i64>,
    ) -> (u16, Value, Option<String>) {
        let body = body.map(|b| b.to_string());
        let tag = revision.map(|r| format!("\"{r}\""));
        let headers: Vec<(&str, &str)> = tag.iter().map(|t| ("if-match", t.as_str())).collect();
        self.call_with(Some(ADMIN), method, path, body.as_deref(), &headers)
            .await
    }

    pub async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map(|b| b.to_string());
        self.call(Some(ADMIN), method, path, body.as_deref()).await
    }

    pub async fn get(&self, path: &str) -> Value {
        let (status, v) = self.call(Some(READER), "GET", path, None).await;
        assert_eq!(status, 200, "GET {path}: {v}");
        v
    }

    pub async fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, v) = self.admin(method, path, body).await;
        assert_eq!(status, 200, "{method} {path}: {v}");
        v
    }
}
