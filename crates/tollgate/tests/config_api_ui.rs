#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The config API's web page (`/` and `/ui`) in a real headless Chromium,
//! against a real `tollgate config-api` on a free port over SQLite: the
//! page lists what the API holds, an admin edits a resource through it,
//! and a read-only token is refused with the API's own message.
//!
//! Chromium is driven through the DevTools protocol over
//! `--remote-debugging-pipe` (JSON messages ended by NUL on fds 3 and 4),
//! with a small client here: no websocket, no port, no extra crate. Its
//! network is limited to loopback: every other host resolves to nothing
//! and goes through a proxy that does not exist.
//!
//! Chromium is required: `scripts/test.sh` installs Debian's `chromium`
//! package when it is missing; these tests fail (never skip) without it.

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use common::Sandbox;
use serde_json::{json, Value};

use common::config_api::{sqlite, ConfigApi, ADMIN, READER};

/// A domain name that is markup, and would run if the page inserted it
/// as HTML (the image fails to load under the page's policy, which fires
/// `onerror`).
const MARKUP: &str = "<img src=x onerror=\"window.pwned=1\">";

/// How long the page gets to reach a state.
const PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// The API

/// Puts `body` at `path` with the admin token.
async fn put(api: &ConfigApi, path: &str, body: Value) -> Value {
    api.ok("PUT", path, Some(body)).await
}

/// Two namespaces: `shop` (a token bucket and a concurrency resource
/// with a domain override and a group) and `edge` (flags, a fixed
/// window and a resource with a [`MARKUP`] domain). Returns the
/// revision.
async fn populate(api: &ConfigApi) -> i64 {
    put(api, "/v1/namespaces/shop", json!({})).await;
    put(
        api,
        "/v1/namespaces/shop/resources/api",
        json!({"algorithm": "token_bucket", "capacity": 100, "rate": "10/s"}),
    )
    .await;
    put(
        api,
        "/v1/namespaces/shop/resources/db",
        json!({
            "kind": "concurrency",
            "domain_limit": 8,
            "global_limit": 10,
            "domains": {"acme": {"domain_limit": 5}},
            "groups": [{"name": "big", "limit": 4, "members": ["acme"]}],
        }),
    )
    .await;
    put(
        api,
        "/v1/namespaces/edge",
        json!({"allow_unconfigured": true}),
    )
    .await;
    // A domain named like markup (the API accepts any domain key):
    // the page must show it as text, never run it.
    put(
        api,
        "/v1/namespaces/edge/resources/gate",
        json!({
            "kind": "concurrency",
            "domain_limit": 3,
            "domains": {(MARKUP): {"domain_limit": 1}},
        }),
    )
    .await;
    let r = put(
        api,
        "/v1/namespaces/edge/resources/login",
        json!({"algorithm": "fixed_window", "limit": 5, "window": "1m"}),
    )
    .await;
    r["revision"].as_i64().unwrap()
}

// ---------------------------------------------------------------------------
// Chromium over the DevTools protocol

/// The Chromium on the PATH (`chromium`, as Debian names it, or
/// `chromium-browser`); a failure that says how to get one otherwise.
fn chromium() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["chromium", "chromium-browser"] {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "these tests need a headless Chromium, but neither `chromium` nor \
         `chromium-browser` is on the PATH; scripts/test.sh installs it \
         (Debian's `chromium` package: apt-get install chromium)"
    );
}

/// Whether this process runs as root (Chromium's sandbox refuses root).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            == Some("0")
    })
}

/// A headless Chromium with one page, driven over the DevTools pipe;
/// closed (then killed) on drop. Its calls block: the tests' runtime has
/// nothing else to run meanwhile (the API is another process).
struct Browser {
    child: Child,
    to: ChildStdin,
    from: Receiver<Value>,
    next_id: u64,
    session: String,
    /// Exceptions and console errors the page reported.
    problems: Vec<String>,
    log: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let id = self.next_id;
        let _ = self.send(&json!({ "id": id, "method": "Browser.close" }));
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Starts Chromium with a fresh profile in `dir` and opens a blank page.
    fn start(dir: &Sandbox) -> Browser {
        let binary = chromium();
        let profile = dir.path("chromium-profile");
        std::fs::create_dir_all(&profile).unwrap();
        let log = dir.path("chromium.log");
        let mut args: Vec<String> = [
            "--headless",
            "--disable-gpu",
            "--remote-debugging-pipe",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-sync",
            "--mute-audio",
            "--window-size=1280,1024",
            // Loopback only: names resolve to nothing, and anything not on
            // loopback (which bypasses proxies) goes to a closed port.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--proxy-server=127.0.0.1:9",
        ]
        .map(String::from)
        .into();
        if is_root() {
            args.push("--no-sandbox".into());
        }
        args.push(format!("--user-data-dir={}", profile.display()));
        args.push("about:blank".into());
        // The pipe is fds 3 (commands in) and 4 (answers out): a shell
        // moves our stdin and stdout there, then becomes Chromium.
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>/dev/null"#)
            .arg(&binary)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let to = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, from) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(out);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                let Ok(v) = serde_json::from_slice::<Value>(&buf) else {
                    continue;
                };
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let mut browser = Browser {
            child,
            to,
            from,
            next_id: 1,
            session: String::new(),
            problems: Vec::new(),
            log,
        };
        let target = browser.browser_call("Target.createTarget", json!({ "url": "about:blank" }));
        let target_id = target["targetId"].as_str().unwrap().to_owned();
        let attached = browser.browser_call(
            "Target.attachToTarget",
            json!({ "targetId": target_id, "flatten": true }),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_owned();
        browser.call("Page.enable", json!({}));
        browser.call("Runtime.enable", json!({}));
        browser.call("Log.enable", json!({}));
        browser
    }

    fn send(&mut self, message: &Value) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec(message).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes)?;
        self.to.flush()
    }

    /// Chromium's log, for failure messages.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Sends `method` (to the page's session if `session`) and waits for
    /// its answer, noting the page's problems reported meanwhile.
    fn raw_call(&mut self, session: bool, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if session {
            message["sessionId"] = json!(self.session);
        }
        if let Err(e) = self.send(&message) {
            panic!("{method}: chromium is gone ({e}):\n{}", self.log_tail());
        }
        let until = Instant::now() + PATIENCE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let v = match self.from.recv_timeout(left) {
                Ok(v) => v,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{method}: no answer from chromium:\n{}", self.log_tail())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("{method}: chromium exited:\n{}", self.log_tail())
                }
            };
            if v["id"] == id {
                if let Some(e) = v.get("error") {
                    panic!("{method} {params}: {e}");
                }
                return v["result"].clone();
            }
            self.note(&v);
        }
    }

    /// Remembers uncaught exceptions and console errors other than failed
    /// loads (the 403s the tests provoke are logged as those).
    fn note(&mut self, event: &Value) {
        match event["method"].as_str() {
            Some("Runtime.exceptionThrown") => {
                self.problems.push(format!(
                    "exception: {}",
                    event["params"]["exceptionDetails"]
                ));
            }
            Some("Log.entryAdded") => {
                let entry = &event["params"]["entry"];
                if entry["level"] == "error" && entry["source"] != "network" {
                    self.problems.push(format!("console: {entry}"));
                }
            }
            _ => {}
        }
    }

    fn browser_call(&mut self, method: &str, params: Value) -> Value {
        self.raw_call(false, method, params)
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.raw_call(true, method, params)
    }

    /// Loads `url` in the page.
    fn navigate(&mut self, url: &str) {
        let r = self.call("Page.navigate", json!({ "url": url }));
        assert!(r.get("errorText").is_none(), "navigating to {url}: {r}");
    }

    /// The value of the JavaScript expression `js` in the page.
    fn eval(&mut self, js: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": js, "returnByValue": true }),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{js}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Waits until `js` is true in the page; fails with `what` and the
    /// page's status otherwise.
    fn wait_for(&mut self, what: &str, js: &str) {
        let until = Instant::now() + PATIENCE;
        loop {
            // Before the page is there, `js` may throw: not yet.
            let test =
                format!("(() => {{ try {{ return !!({js}); }} catch (e) {{ return false; }} }})()");
            if self.eval(&test) == json!(true) {
                return;
            }
            if Instant::now() > until {
                let state = self.eval(
                    "JSON.stringify({status: document.getElementById('status')?.textContent, \
                     message: document.getElementById('message')?.textContent, \
                     url: location.href})",
                );
                panic!("waiting for {what} ({js}): page is {state}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Clicks the middle of the element `selector` with the mouse.
    fn click(&mut self, selector: &str) {
        let at = self.eval(&format!(
            "(() => {{ const e = document.querySelector({sel}); if (!e) return null; \
             e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
             return [r.x + r.width / 2, r.y + r.height / 2]; }})()",
            sel = json!(selector)
        ));
        let (x, y) = match (at[0].as_f64(), at[1].as_f64()) {
            (Some(x), Some(y)) => (x, y),
            _ => panic!("no element {selector} to click"),
        };
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            );
        }
    }

    /// Replaces the text of the field `selector` by typing `text` into it.
    fn type_into(&mut self, selector: &str, text: &str) {
        self.click(selector);
        let focused = self.eval(&format!(
            "(() => {{ const e = document.querySelector({sel}); e.focus(); e.select(); \
             return document.activeElement === e; }})()",
            sel = json!(selector)
        ));
        assert_eq!(focused, json!(true), "{selector} takes the focus");
        self.call("Input.insertText", json!({ "text": text }));
    }

    /// Presses Enter in the focused element.
    fn press_enter(&mut self) {
        for kind in ["keyDown", "keyUp"] {
            self.call(
                "Input.dispatchKeyEvent",
                json!({
                    "type": kind, "key": "Enter", "code": "Enter",
                    "windowsVirtualKeyCode": 13, "text": "\r",
                }),
            );
        }
    }

    /// The page's resource rows: `{id, name, kind, params: {key: text}}`.
    fn rows(&mut self) -> Vec<Value> {
        let v = self.eval(
            "[...document.querySelectorAll('tr[data-resource]')].map(tr => ({ \
               id: tr.dataset.resource, \
               name: tr.querySelector('.name').textContent, \
               kind: tr.querySelector('.kind').textContent, \
               params: Object.fromEntries([...tr.querySelectorAll('.param')] \
                 .map(li => [li.dataset.key, li.textContent])) }))",
        );
        v.as_array().cloned().unwrap_or_default()
    }

    fn row(&mut self, id: &str) -> Value {
        self.rows()
            .into_iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("no row {id}"))
    }

    fn text(&mut self, selector: &str) -> String {
        let v = self.eval(&format!(
            "document.querySelector({})?.textContent ?? null",
            json!(selector)
        ));
        v.as_str()
            .unwrap_or_else(|| panic!("no element {selector}"))
            .to_owned()
    }

    /// Fails if the page threw or logged an error.
    fn assert_no_problems(&mut self) {
        self.eval("0"); // collects events sent before now
        assert!(self.problems.is_empty(), "the page: {:#?}", self.problems);
    }
}

/// Waits for the page's list to be loaded (status `ready`).
fn wait_ready(b: &mut Browser) {
    b.wait_for(
        "the list",
        "document.getElementById('status').dataset.state === 'ready'",
    );
}

/// What the page should show for resource `body`'s parameter `key`.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Checks a row of the page against the API's body of the resource.
fn assert_row_matches(row: &Value, ns: &str, body: &Value) {
    let name = body["name"].as_str().unwrap();
    assert_eq!(row["id"], format!("{ns}/{name}"), "{row}");
    assert_eq!(row["name"], name, "{row}");
    let kind = body
        .get("algorithm")
        .or_else(|| body.get("kind"))
        .map(shown)
        .unwrap_or_default();
    assert_eq!(row["kind"], kind, "{row}");
    let params = row["params"].as_object().unwrap();
    let expected: Vec<(&String, &Value)> = body
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "name" | "algorithm" | "kind"))
        .collect();
    assert_eq!(params.len(), expected.len(), "{row} vs {body}");
    for (key, value) in expected {
        let text = params[key].as_str().unwrap();
        let (k, v) = text
            .split_once(": ")
            .unwrap_or_else(|| panic!("{text:?} is not `key: value`"));
        assert_eq!(k, key);
        match value {
            // Objects and lists are shown as JSON (in the API's key order,
            // which may not be serde_json's here): compare as values.
            Value::Object(_) | Value::Array(_) => {
                assert_eq!(&serde_json::from_str::<Value>(v).unwrap(), value, "{text}")
            }
            _ => assert_eq!(v, shown(value), "{key}"),
        }
    }
}

fn capacity_of(row: &Value) -> &str {
    row["params"]["capacity"].as_str().unwrap()
}

/// The page's editor content, parsed.
fn editor(b: &mut Browser) -> Value {
    let text = b.eval("document.getElementById('editor').value");
    serde_json::from_str(text.as_str().unwrap()).unwrap()
}

/// Opens the editor on `id` (`ns/name`) and waits for it.
fn open_editor(b: &mut Browser, id: &str) {
    b.click(&format!("button.edit[data-resource=\"{id}\"]"));
    b.wait_for(
        "the editor",
        &format!(
            "!document.getElementById('edit-panel').hidden && \
             document.getElementById('editing').textContent === {}",
            json!(id)
        ),
    );
}

// ---------------------------------------------------------------------------
// The tests

#[tokio::test]
async fn the_page_lists_namespaces_resources_parameters_and_the_revision() {
    let dir = Sandbox::new("config-api-ui-list");
    let api = ConfigApi::start(&dir, &sqlite(&dir, "tollgate.db"), &[]);
    let revision = populate(&api).await;

    // The page itself needs no token, and is served with a strict policy.
    for path in ["/", "/ui"] {
        let resp = api.http.get(api.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let h = resp.headers();
        assert_eq!(h["content-type"], "text/html; charset=utf-8");
        assert_eq!(
            h["content-security-policy"],
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'"
        );
        assert_eq!(h["x-frame-options"], "DENY");
        let text = resp.text().await.unwrap();
        assert!(text.contains("id=\"revision\""), "{text}");
        assert!(!text.contains(READER) && !text.contains("shop"), "no data");
    }
    // The data still needs one.
    let resp = api
        .http
        .get(api.url("/v1/namespaces"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);

    let mut b = Browser::start(&dir);
    b.navigate(&api.url(&format!("/ui#token={READER}")));
    wait_ready(&mut b);

    // The token left the address bar for the tab's session storage.
    assert_eq!(b.eval("location.hash"), json!(""));
    assert_eq!(
        b.eval("sessionStorage.getItem('tollgate.token')"),
        json!(READER)
    );

    assert_eq!(b.text("#revision"), revision.to_string());
    let list = api.get("/v1/namespaces").await;
    assert_eq!(list["revision"], revision);
    let names: Vec<&str> = list["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{list}");
    let shown_names = b.eval(
        "[...document.querySelectorAll('section[data-namespace]')].map(s => s.dataset.namespace)",
    );
    assert_eq!(shown_names, json!(names));

    let rows = b.rows();
    let mut expected_rows = 0;
    for ns in &names {
        let doc = api.get(&format!("/v1/namespaces/{ns}")).await;
        for body in doc["resources"].as_array().unwrap() {
            let id = format!("{ns}/{}", body["name"].as_str().unwrap());
            let row = rows
                .iter()
                .find(|r| r["id"] == id)
                .unwrap_or_else(|| panic!("no row {id} in {rows:?}"));
            assert_row_matches(row, ns, body);
            expected_rows += 1;
        }
    }
    assert_eq!(rows.len(), expected_rows, "{rows:?}");
    assert_eq!(expected_rows, 4);

    // Spot checks, in the words a person reads.
    let api_row = b.row("shop/api");
    assert_eq!(api_row["kind"], "token_bucket");
    assert_eq!(capacity_of(&api_row), "capacity: 100");
    assert_eq!(api_row["params"]["rate"], "rate: 10/1s", "normalized");
    let db_row = b.row("shop/db");
    assert_eq!(db_row["kind"], "concurrency");
    assert_eq!(db_row["params"]["domain_limit"], "domain_limit: 8");
    let gate = b.row("edge/gate");
    let domains = gate["params"]["domains"].as_str().unwrap();
    let quoted = json!(MARKUP).to_string();
    assert!(domains.contains(&quoted), "shown as text: {domains}");
    assert_eq!(b.eval("document.querySelectorAll('img').length"), json!(0));
    assert_eq!(b.eval("window.pwned === undefined"), json!(true));
    let flags = b.text("section[data-namespace=\"edge\"] .flags");
    assert!(flags.contains("allow_unconfigured"), "{flags}");

    // A change made elsewhere shows on reload.
    put(
        &api,
        "/v1/namespaces/shop/resources/api",
        json!({"algorithm": "token_bucket", "capacity": 7, "rate": "1/s"}),
    )
    .await;
    b.click("#reload");
    b.wait_for(
        "the new revision",
        &format!(
            "document.getElementById('revision').textContent === '{}'",
            revision + 1
        ),
    );
    wait_ready(&mut b);
    assert_eq!(capacity_of(&b.row("shop/api")), "capacity: 7");
    b.assert_no_problems();
}

#[tokio::test]
async fn an_admin_edits_a_resource_in_the_page() {
    let dir = Sandbox::new("config-api-ui-edit");
    let api = ConfigApi::start(&dir, &sqlite(&dir, "tollgate.db"), &[]);
    let revision = populate(&api).await;

    let mut b = Browser::start(&dir);
    b.navigate(&api.url("/"));
    b.wait_for(
        "the token prompt",
        "document.getElementById('status').dataset.state === 'need-token'",
    );
    // The token typed into the page's field.
    b.type_into("#token", ADMIN);
    b.press_enter();
    wait_ready(&mut b);
    assert_eq!(b.eval("document.getElementById('token').value"), json!(""));
    assert_eq!(capacity_of(&b.row("shop/api")), "capacity: 100");

    open_editor(&mut b, "shop/api");
    let before = api.get("/v1/namespaces/shop/resources/api").await["resource"].clone();
    let mut body = editor(&mut b);
    assert_eq!(body, before, "the editor holds the resource's JSON");
    body["capacity"] = json!(250);
    b.type_into("#editor", &serde_json::to_string_pretty(&body).unwrap());
    b.click("#save");
    b.wait_for(
        "the saved change",
        &format!(
            "document.getElementById('message').dataset.state === 'ok' && \
             document.getElementById('revision').textContent === '{}' && \
             document.getElementById('status').dataset.state === 'ready'",
            revision + 1
        ),
    );

    // The API has it...
    let after = api.get("/v1/namespaces/shop/resources/api").await["resource"].clone();
    assert_eq!(after["capacity"], 250, "{after}");
    assert_eq!(after["rate"], before["rate"]);
    assert_eq!(api.get("/v1/namespaces").await["revision"], revision + 1);
    // ...and the page shows it.
    assert_eq!(capacity_of(&b.row("shop/api")), "capacity: 250");
    let summary = b.text("#message .summary");
    assert!(
        summary.contains(&format!("revision {}", revision + 1)),
        "{summary}"
    );
    assert_eq!(
        b.eval("document.querySelectorAll('#message .warning').length"),
        json!(0)
    );

    // A change the API lowers: its warning is shown.
    open_editor(&mut b, "shop/db");
    let mut db = editor(&mut b);
    db["domain_limit"] = json!(50);
    b.type_into("#editor", &db.to_string());
    b.click("#save");
    b.wait_for(
        "the warning",
        "document.querySelectorAll('#message .warning').length > 0 && \
         document.getElementById('status').dataset.state === 'ready'",
    );
    let warnings =
        b.eval("[...document.querySelectorAll('#message .warning')].map(li => li.textContent)");
    assert_eq!(warnings.as_array().unwrap().len(), 1, "{warnings}");
    assert_eq!(
        api.get("/v1/namespaces/shop/resources/db").await["resource"]["domain_limit"],
        10
    );
    assert_eq!(
        b.row("shop/db")["params"]["domain_limit"],
        "domain_limit: 10"
    );

    // An invalid change: the API's message, and nothing written.
    open_editor(&mut b, "shop/api");
    let bad = json!({"name": "api", "algorithm": "token_bucket", "capacity": 3, "rat": "1/s"});
    b.type_into("#editor", &bad.to_string());
    b.click("#save");
    b.wait_for(
        "the refusal",
        "document.getElementById('message').dataset.state === 'error' && \
         document.getElementById('status').dataset.state === 'ready'",
    );
    let (status, e) = api
        .admin("PUT", "/v1/namespaces/shop/resources/api", Some(bad))
        .await;
    assert!((400..500).contains(&status), "{status} {e}");
    assert_eq!(
        b.text("#message .error"),
        e["error"]["message"].as_str().unwrap()
    );
    assert_eq!(
        api.get("/v1/namespaces/shop/resources/api").await["resource"]["capacity"],
        250
    );
    assert_eq!(capacity_of(&b.row("shop/api")), "capacity: 250");
    b.assert_no_problems();
}

#[tokio::test]
async fn a_read_token_cannot_save_and_sees_the_apis_refusal() {
    let dir = Sandbox::new("config-api-ui-read");
    let api = ConfigApi::start(&dir, &sqlite(&dir, "tollgate.db"), &[]);
    let revision = populate(&api).await;

    let mut b = Browser::start(&dir);
    // A wrong token: the API's message, no data.
    b.navigate(&api.url("/ui#token=not-a-token-at-all"));
    b.wait_for(
        "the refusal of the token",
        "document.getElementById('status').dataset.state === 'need-token'",
    );
    assert_eq!(b.text("#status"), "the bearer token is not known");
    assert_eq!(b.rows().len(), 0);

    // The read token, given the same way.
    b.navigate(&api.url(&format!("/ui#token={READER}")));
    wait_ready(&mut b);
    assert_eq!(b.text("#revision"), revision.to_string());
    assert_eq!(capacity_of(&b.row("shop/api")), "capacity: 100");

    open_editor(&mut b, "shop/api");
    let mut body = editor(&mut b);
    body["capacity"] = json!(999);
    b.type_into("#editor", &serde_json::to_string_pretty(&body).unwrap());
    b.click("#save");
    b.wait_for(
        "the refusal",
        "document.getElementById('message').dataset.state === 'error' && \
         document.getElementById('status').dataset.state === 'ready'",
    );

    // Exactly the API's answer to that token.
    let (status, e) = api
        .call(
            Some(READER),
            "PUT",
            "/v1/namespaces/shop/resources/api",
            Some(&body.to_string()),
        )
        .await;
    assert_eq!(status, 403, "{e}");
    assert_eq!(e["error"]["reason"], "forbidden");
    let message = e["error"]["message"].as_str().unwrap();
    assert_eq!(b.text("#message .error"), message);
    assert_eq!(
        b.eval("document.querySelector('#message .error').dataset.reason"),
        json!("forbidden")
    );

    // Nothing changed, in the API or on the page.
    let now = api.get("/v1/namespaces/shop/resources/api").await["resource"].clone();
    assert_eq!(now["capacity"], 100, "{now}");
    assert_eq!(api.get("/v1/namespaces").await["revision"], revision);
    assert_eq!(b.text("#revision"), revision.to_string());
    assert_eq!(capacity_of(&b.row("shop/api")), "capacity: 100");
    b.assert_no_problems();
}
