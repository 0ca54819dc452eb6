#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The operators' console (`/` and `/ui`) in a real headless Chromium,
//! against a real `tollgate config-api` on a free port over SQLite: the
//! page lists what the API holds in one request, filters it, and an admin
//! creates, edits and deletes namespaces, resources, overrides and groups
//! through it; a change made elsewhere meanwhile is shown as a conflict,
//! never overwritten; a resource's history shows who changed what; a read
//! token sees no edit controls; a refused token or a 429 clears the page;
//! at 390 px nothing overflows. The tests write screenshots of the page
//! under `$CARGO_TARGET_TMPDIR/console-screenshots/` (docs/config-api.md).
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
        // Not while the page draws its list again: a button found now
        // would be replaced before the click lands.
        self.wait_for(
            "the page to finish loading",
            "document.getElementById('status')?.dataset.state !== 'loading'",
        );
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

/// The screenshots docs/config-api.md shows, written to
/// `docs/images/console/` when the run is asked to
/// (`TOLLGATE_WRITE_SCREENSHOTS=1`).
const DOCUMENTED: &[&str] = &[
    "console-list-1280.png",
    "console-list-390.png",
    "console-conflict-1280.png",
    "console-history-1280.png",
    "console-read-only-1280.png",
];

/// Where the screenshot `name` goes: under the target directory, or, with
/// `TOLLGATE_WRITE_SCREENSHOTS=1` and a screenshot the docs show, into
/// `docs/images/console/` (they depend on the fonts installed, so they
/// are written there only when asked).
fn screenshot_path(name: &str) -> PathBuf {
    let to_docs = std::env::var("TOLLGATE_WRITE_SCREENSHOTS").is_ok_and(|v| v == "1")
        && DOCUMENTED.contains(&name);
    let dir = if to_docs {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/images/console")
    } else {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots")
    };
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Standard base64 decoding (Chromium's screenshots).
fn unbase64(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let bytes: Vec<u8> = text.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c) << (18 - 6 * i);
        }
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

impl Browser {
    /// Saves a PNG of what the viewport shows of the page to `name`
    /// ([`screenshot_path`]), cut where the page ends (no empty space
    /// below a short page) and at most 900 CSS pixels high; wide views
    /// scaled to 0.6.
    fn screenshot(&mut self, name: &str) {
        let area = self.eval(
            "({ x: window.scrollX, y: window.scrollY, width: window.innerWidth, \
                height: Math.min(window.innerHeight, 900, \
                  document.documentElement.scrollHeight - window.scrollY) })",
        );
        // Wide views at 0.6: small files for the docs, still legible.
        let wide = area["width"].as_f64().unwrap_or(0.0) > 600.0;
        let mut clip = area;
        clip["scale"] = json!(if wide { 0.6 } else { 1.0 });
        let r = self.call(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": false, "clip": clip }),
        );
        let png = unbase64(r["data"].as_str().unwrap());
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(screenshot_path(name), png).unwrap();
    }

    /// Emulates a viewport `width` CSS pixels wide (a phone at 390).
    fn viewport(&mut self, width: u32, height: u32) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600 }),
        );
    }

    /// Whether the checkbox `selector` is checked.
    fn checked(&mut self, selector: &str) -> bool {
        self.eval(&format!(
            "document.querySelector({}).checked",
            json!(selector)
        ))
        .as_bool()
        .unwrap()
    }

    /// The `/v1/` requests the page made since it loaded.
    fn api_requests(&mut self) -> Vec<String> {
        let v = self.eval(
            "performance.getEntriesByType('resource').map(e => new URL(e.name).pathname + \
             new URL(e.name).search).filter(p => p.startsWith('/v1/'))",
        );
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_owned())
            .collect()
    }
}

/// Signs in with `token` through the page's field and waits for the list.
fn sign_in(b: &mut Browser, api: &ConfigApi, token: &str) {
    b.navigate(&api.url("/"));
    b.wait_for(
        "the token prompt",
        "document.getElementById('status').dataset.state === 'need-token'",
    );
    b.type_into("#token", token);
    b.press_enter();
    wait_ready(b);
}

/// Opens the editor on `id` (`ns/name`) and waits for it. A click that
/// lands while the list is being drawn again (after a save, the page
/// reloads it) hits a button that is about to be replaced: the click is
/// repeated until the editor shows, for as long as `wait_for` waits.
fn open_editor(b: &mut Browser, id: &str) {
    let open = format!(
        "!document.getElementById('edit-panel').hidden && \
         document.getElementById('editing').textContent === {}",
        json!(id)
    );
    let until = Instant::now() + PATIENCE;
    let button = format!("button.edit[data-resource=\"{id}\"]");
    while Instant::now() < until {
        let there = format!("document.querySelector({}) !== null", json!(button));
        if b.eval(&there) == json!(true) {
            b.click(&button);
        }
        let tried = Instant::now() + Duration::from_secs(2);
        while Instant::now() < tried {
            if b.eval(&format!(
                "(() => {{ try {{ return !!({open}); }} catch (e) {{ return false; }} }})()"
            )) == json!(true)
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    b.wait_for("the editor", &open);
}

/// Clicks a button that asks once more, twice (with the list loaded:
/// a load draws the buttons anew).
fn click_confirmed(b: &mut Browser, selector: &str) {
    wait_ready(b);
    b.click(selector);
    b.wait_for(
        "the button to ask again",
        &format!(
            "document.querySelector({}).dataset.armed === '1'",
            json!(selector)
        ),
    );
    b.click(selector);
}

/// Waits for the editor's message to be in `state` with the list loaded.
fn wait_message(b: &mut Browser, state: &str) {
    b.wait_for(
        &format!("the message {state}"),
        &format!(
            "document.getElementById('message').dataset.state === '{state}' && \
             document.getElementById('status').dataset.state === 'ready'"
        ),
    );
}

/// Whether the page is no wider than its viewport.
fn fits(b: &mut Browser) -> bool {
    b.eval("document.documentElement.scrollWidth <= window.innerWidth && document.body.scrollWidth <= window.innerWidth")
        == json!(true)
}

// ---------------------------------------------------------------------------
// The tests

#[tokio::test]
async fn the_page_lists_everything_in_one_request_and_filters_it() {
    let dir = Sandbox::new("config-api-ui-list");
    let api = ConfigApi::start(&dir, &sqlite(&dir, "tollgate.db"), &[]);
    let revision = populate(&api).await;

    // The page itself needs no token, and is served with a strict policy:
    // its own script and style by digest, nothing else inline.
    for path in ["/", "/ui"] {
        let resp = api.http.get(api.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let h = resp.headers();
        assert_eq!(h["content-type"], "text/html; charset=utf-8");
        let policy = h["content-security-policy"].to_str().unwrap().to_owned();
        assert!(
            policy.starts_with("default-src 'none'; script-src 'sha256-")
                && policy.contains("; style-src 'sha256-")
                && policy.contains("connect-src 'self'")
                && !policy.contains("unsafe"),
            "{policy}"
        );
        assert_eq!(h["x-frame-options"], "DENY");
        let text = resp.text().await.unwrap();
        assert!(text.contains("id=\"revision\""), "{text}");
        assert!(!text.contains(READER) && !text.contains("shop"), "no data");
    }
    let resp = api
        .http
        .get(api.url("/v1/namespaces"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401, "the data needs a token");

    let mut b = Browser::start(&dir);
    b.navigate(&api.url(&format!("/ui#token={READER}")));
    wait_ready(&mut b);
    assert_eq!(b.eval("location.hash"), json!(""));
    assert_eq!(
        b.eval("sessionStorage.getItem('tollgate.token')"),
        json!(READER)
    );
    // Issue 22: one request per namespace tripped the API's rate limit.
    let loads: Vec<String> = b
        .api_requests()
        .into_iter()
        .filter(|p| p != "/v1/usage")
        .collect();
    assert_eq!(loads, ["/v1/whoami", "/v1/snapshot"]);
    assert_eq!(b.text("#whoami"), "signed in as fleet (read)");

    assert_eq!(b.text("#revision"), revision.to_string());
    let list = api.get("/v1/namespaces").await;
    let names: Vec<&str> = list["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
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
    let api_row = b.row("shop/api");
    assert_eq!(api_row["kind"], "token_bucket");
    assert_eq!(capacity_of(&api_row), "capacity: 100");
    assert_eq!(api_row["params"]["rate"], "rate: 10/1s", "normalized");
    let gate = b.row("edge/gate");
    let domains = gate["params"]["domains"].as_str().unwrap();
    assert!(
        domains.contains(&json!(MARKUP).to_string()),
        "as text: {domains}"
    );
    assert_eq!(b.eval("document.querySelectorAll('img').length"), json!(0));
    assert_eq!(b.eval("window.pwned === undefined"), json!(true));
    let flags = b.text("section[data-namespace=\"edge\"] .flags");
    assert!(flags.contains("allow_unconfigured"), "{flags}");
    // "changed at" counts changes to the namespace's resources too.
    assert!(
        flags.contains(&format!("changed at revision {revision}")),
        "{flags}"
    );

    // The filter: by namespace, by resource, by parameter.
    let visible = |b: &mut Browser| -> Value {
        b.eval(
            "[...document.querySelectorAll('tr[data-resource]')] \
               .filter(tr => tr.offsetParent !== null).map(tr => tr.dataset.resource)",
        )
    };
    b.type_into("#filter", "edge");
    assert_eq!(visible(&mut b), json!(["edge/gate", "edge/login"]));
    b.type_into("#filter", "fixed_window");
    assert_eq!(visible(&mut b), json!(["edge/login"]));
    assert_eq!(b.text("#filter-count"), "1 of 4 resource(s)");
    b.type_into("#filter", "shop/d");
    assert_eq!(visible(&mut b), json!(["shop/db"]));
    assert_eq!(
        b.eval("document.querySelector('section[data-namespace=\"edge\"]').hidden"),
        json!(true)
    );
    b.type_into("#filter", "nothing-like-this");
    assert_eq!(visible(&mut b), json!([]));
    b.type_into("#filter", "");
    b.eval("document.getElementById('filter').dispatchEvent(new Event('input'))");
    assert_eq!(visible(&mut b).as_array().unwrap().len(), 4);

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
async fn an_admin_creates_edits_and_deletes_through_the_page() {
    let dir = Sandbox::new("config-api-ui-edit");
    let api = ConfigApi::start(&dir, &sqlite(&dir, "tollgate.db"), &[]);
    populate(&api).await;
    let mut b = Browser::start(&dir);
    sign_in(&mut b, &api, ADMIN);
    assert_eq!(b.eval("document.getElementById('token').value"), json!(""));
    assert_eq!(b.text("#whoami"), "signed in as alice (admin)");
    b.screenshot("console-list-1280.png");

    // A namespace, created from its form.
    b.type_into("#new-namespace-name", "billing");
    b.click("#create-namespace");
    b.wait_for(
        "the new namespace",
        "document.querySelector('section[data-namespace=\"billing\"]') !== null",
    );
    let ns = api.get("/v1/namespaces/billing").await;
    assert_eq!(ns["resources"], json!([]));

    // A resource in it, from the form: common fields, the rest as JSON.
    b.click("section[data-namespace=\"billing\"] button.new-resource");
    b.wait_for(
        "the new resource's form",
        "!document.getElementById('edit-panel').hidden && \
         document.getElementById('edit-title').textContent === 'new resource in'",
    );
    b.type_into("#f-name", "invoices");
    b.type_into("#f-algorithm", "token_bucket");
    b.type_into("#f-capacity", "100");
    b.type_into("#f-rate", "10/s");
    b.type_into("#editor", r#"{"shadow_mode": true}"#);
    b.click("#save");
    wait_message(&mut b, "ok");
    let r = api.get("/v1/namespaces/billing/resources/invoices").await;
    assert_eq!(
        r["resource"],
        json!({"name": "invoices", "algorithm": "token_bucket", "capacity": 100,
               "rate": "10/1s", "shadow_mode": true}),
        "{r}"
    );
    assert!(b
        .text("#message .summary")
        .starts_with("created billing/invoices at revision"));
    assert_eq!(capacity_of(&b.row("billing/invoices")), "capacity: 100");

    // An override that changes only the capacity: stored as given,
    // resolved against the resource, both shown.
    b.type_into("#o-domain", "bigcorp");
    b.type_into("#o-body", r#"{"capacity": 1000}"#);
    b.click("#save-override");
    b.wait_for(
        "the override",
        "document.querySelector('#override-list tr[data-domain=\"bigcorp\"]') !== null",
    );
    assert_eq!(
        b.text("#override-list tr[data-domain=\"bigcorp\"] .override"),
        r#"{"capacity":1000}"#
    );
    let resolved: Value =
        serde_json::from_str(&b.text("#override-list tr[data-domain=\"bigcorp\"] .resolved"))
            .unwrap();
    assert_eq!(
        resolved,
        json!({"algorithm": "token_bucket", "capacity": 1000, "rate": "10/1s"})
    );
    // Raising the resource's rate in the form raises the override's.
    b.type_into("#f-rate", "20/s");
    b.click("#save");
    wait_message(&mut b, "ok");
    let over = api
        .get("/v1/namespaces/billing/resources/invoices/domains/bigcorp")
        .await;
    assert_eq!(over["override"], json!({"capacity": 1000}));
    assert_eq!(over["resolved"]["rate"], "20/1s");
    let resolved: Value =
        serde_json::from_str(&b.text("#override-list tr[data-domain=\"bigcorp\"] .resolved"))
            .unwrap();
    assert_eq!(resolved["rate"], "20/1s");
    b.screenshot("console-editor-1280.png");

    // Review M8: a new algorithm and the overrides that fit it, in one
    // save (`domains` in the JSON). The page sent the old overrides with
    // every save, and `capacity` does not fit gcra: it could not be done.
    b.eval("document.getElementById('f-capacity').value = ''");
    b.type_into("#f-algorithm", "gcra");
    b.type_into("#f-rate", "10/s");
    b.type_into("#f-burst", "5");
    b.type_into(
        "#editor",
        r#"{"shadow_mode": true, "domains": {"bigcorp": {"burst": 50}}}"#,
    );
    b.click("#save");
    wait_message(&mut b, "ok");
    let r = api.get("/v1/namespaces/billing/resources/invoices").await;
    assert_eq!(r["resource"]["algorithm"], "gcra", "{r}");
    assert_eq!(
        r["resource"]["domains"],
        json!({"bigcorp": {"burst": 50}}),
        "{r}"
    );
    assert_eq!(r["resolved"]["domains"]["bigcorp"]["rate"], "10/1s", "{r}");

    // A change the API lowers: its warning is shown.
    open_editor(&mut b, "shop/db");
    b.type_into("#f-domain_limit", "50");
    b.click("#save");
    wait_message(&mut b, "ok");
    let warnings =
        b.eval("[...document.querySelectorAll('#message .warning')].map(li => li.textContent)");
    assert_eq!(warnings.as_array().unwrap().len(), 1, "{warnings}");
    assert_eq!(
        api.get("/v1/namespaces/shop/resources/db").await["resource"]["domain_limit"],
        10
    );
    // A group of the concurrency resource, from its form.
    b.type_into("#g-name", "small");
    b.type_into("#g-limit", "2");
    b.type_into("#g-members", "globex, initech");
    b.click("#save-group");
    b.wait_for(
        "the group",
        "document.querySelector('#group-list tr[data-group=\"small\"]') !== null",
    );
    let db = api.get("/v1/namespaces/shop/resources/db").await;
    let small = db["resource"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "small")
        .cloned()
        .unwrap();
    assert_eq!(
        small,
        json!({"name": "small", "limit": 2, "members": ["globex", "initech"]})
    );

    // An invalid change: the API's message, and nothing written.
    open_editor(&mut b, "shop/api");
    b.type_into("#editor", r#"{"rat": "1/s"}"#);
    b.click("#save");
    wait_message(&mut b, "error");
    let (status, e) = api
        .admin(
            "PUT",
            "/v1/namespaces/shop/resources/api",
            Some(json!({"algorithm": "token_bucket", "capacity": 100, "rate": "10/1s", "rat": "1/s"})),
        )
        .await;
    assert_eq!(status, 422, "{e}");
    assert_eq!(
        b.text("#message .error"),
        e["error"]["message"].as_str().unwrap()
    );
    assert_eq!(
        api.get("/v1/namespaces/shop/resources/api").await["resource"]["capacity"],
        100
    );

    // Namespace flags, under the namespace's revision.
    b.click("section[data-namespace=\"billing\"] input[data-flag=\"ignore_configured\"]");
    b.click("section[data-namespace=\"billing\"] button.save-flags");
    b.wait_for(
        "the flag",
        "document.querySelector('section[data-namespace=\"billing\"] .flags').textContent.includes('ignore_configured')",
    );
    assert_eq!(
        api.get("/v1/namespaces/billing").await["ignore_configured"],
        true
    );
    assert!(b.checked("section[data-namespace=\"billing\"] input[data-flag=\"ignore_configured\"]"));

    // Deletes: an override, a resource, a namespace (each asks twice).
    open_editor(&mut b, "billing/invoices");
    click_confirmed(&mut b, "button.delete-override[data-domain=\"bigcorp\"]");
    b.wait_for(
        "the override gone",
        "document.querySelector('#override-list tr[data-domain=\"bigcorp\"]') === null && \
         document.getElementById('status').dataset.state === 'ready'",
    );
    let r = api.get("/v1/namespaces/billing/resources/invoices").await;
    assert!(r["resource"].get("domains").is_none(), "{r}");
    click_confirmed(&mut b, "button.delete[data-resource=\"edge/login\"]");
    b.wait_for(
        "the resource gone",
        "document.querySelector('tr[data-resource=\"edge/login\"]') === null && \
         document.getElementById('status').dataset.state === 'ready'",
    );
    let (status, _) = api
        .call(
            Some(READER),
            "GET",
            "/v1/namespaces/edge/resources/login",
            None,
        )
        .await;
    assert_eq!(status, 404);
    click_confirmed(
        &mut b,
        "section[data-namespace=\"billing\"] button.delete-namespace",
    );
    b.wait_for(
        "the namespace gone",
        "document.querySelector('section[data-namespace=\"billing\"]') === null && \
         document.getElementById('edit-panel').hidden",
    );
    let (status, _) = api
        .call(Some(READER), "GET", "/v1/namespaces/billing", None)
        .await;
    assert_eq!(status, 404);
    b.assert_no_problems();
}

/// Issue 22: a page's stale body overwrote a change made with curl
/// meanwhile, and saving a resource deleted meanwhile re-created it.
#[tokio::test]
async fn a_change_made_elsewhere_meanwhile_is_a_conflict_shown_never_overwritten() {
    let dir = Sandbox::new("config-api-ui-conflict");
    let api = ConfigApi::start(&dir, &sqlite(&dir, "tollgate.db"), &[]);
    populate(&api).await;
    let mut b = Browser::start(&dir);
    sign_in(&mut b, &api, ADMIN);

    open_editor(&mut b, "shop/api");
    // Meanwhile, with curl:
    let theirs = put(
        &api,
        "/v1/namespaces/shop/resources/api",
        json!({"algorithm": "token_bucket", "capacity": 13, "rate": "10/s"}),
    )
    .await;
    b.type_into("#f-capacity", "250");
    b.click("#save");
    wait_message(&mut b, "conflict");
    let text = b.text("#message .conflict");
    assert!(
        text.contains("Conflict: shop/api was changed elsewhere; your change was not saved."),
        "{text}"
    );
    assert!(
        text.contains(&format!("it is at revision {} now", theirs["revision"])),
        "{text}"
    );
    b.screenshot("console-conflict-1280.png");
    let now = api.get("/v1/namespaces/shop/resources/api").await;
    assert_eq!(now["resource"]["capacity"], 13, "their change stands");
    // Taking their version, then making the change again.
    b.click("#load-current");
    b.wait_for(
        "their version in the form",
        "document.getElementById('f-capacity').value === '13'",
    );
    b.type_into("#f-capacity", "250");
    b.click("#save");
    wait_message(&mut b, "ok");
    assert_eq!(
        api.get("/v1/namespaces/shop/resources/api").await["resource"]["capacity"],
        250
    );

    // Review: created meanwhile by someone else while the page creates
    // it: a conflict; taking their version switches the editor to edit
    // it (under its revision), so the next save is not refused again as
    // a create.
    b.click("section[data-namespace=\"shop\"] button.new-resource");
    b.wait_for(
        "the new resource's form",
        "!document.getElementById('edit-panel').hidden && \
         document.getElementById('edit-title').textContent === 'new resource in'",
    );
    b.type_into("#f-name", "fresh");
    b.type_into("#f-algorithm", "token_bucket");
    b.type_into("#f-capacity", "5");
    b.type_into("#f-rate", "1/s");
    put(
        &api,
        "/v1/namespaces/shop/resources/fresh",
        json!({"algorithm": "token_bucket", "capacity": 7, "rate": "1/s"}),
    )
    .await;
    b.click("#save");
    wait_message(&mut b, "conflict");
    b.click("#load-current");
    b.wait_for(
        "their version, in edit mode",
        "document.getElementById('f-capacity').value === '7' && \
         document.getElementById('edit-title').textContent === 'edit' && \
         document.getElementById('editing').textContent === 'shop/fresh' && \
         document.getElementById('f-name').disabled",
    );
    b.type_into("#f-capacity", "9");
    b.click("#save");
    wait_message(&mut b, "ok");
    assert_eq!(
        api.get("/v1/namespaces/shop/resources/fresh").await["resource"]["capacity"],
        9
    );

    // Deleted meanwhile: a conflict, and nothing re-created.
    open_editor(&mut b, "shop/db");
    api.ok("DELETE", "/v1/namespaces/shop/resources/db", None)
        .await;
    b.type_into("#f-domain_limit", "7");
    b.click("#save");
    wait_message(&mut b, "conflict");
    let text = b.text("#message .conflict");
    assert!(text.contains("no longer exists"), "{text}");
    let (status, _) = api
        .call(
            Some(READER),
            "GET",
            "/v1/namespaces/shop/resources/db",
            None,
        )
        .await;
    assert_eq!(status, 404, "not re-created");
    // An override saved on a stale resource: a conflict too.
    open_editor(&mut b, "edge/gate");
    put(
        &api,
        "/v1/namespaces/edge/resources/gate",
        json!({"kind": "concurrency", "domain_limit": 4}),
    )
    .await;
    b.type_into("#o-domain", "acme");
    b.type_into("#o-body", r#"{"domain_limit": 2}"#);
    b.click("#save-override");
    wait_message(&mut b, "conflict");
    let gate = api.get("/v1/namespaces/edge/resources/gate").await;
    assert!(gate["resource"].get("domains").is_none(), "{gate}");
    b.assert_no_problems();
}

/// Second review of issue 22 (LOW): a 429 while saving cleared the page
/// and closed the editor, losing the unsaved change. The editor stays
/// open with the change, says when to try again and asks nothing before
/// then. (The 429 is the page's fetch answered with one, Retry-After 30 s:
/// no wall clock decides the outcome.)
#[tokio::test]
async fn a_save_refused_by_the_rate_limit_keeps_the_editor_and_the_change() {
    let dir = Sandbox::new("config-api-ui-save-429");
    let api = ConfigApi::start(&dir, &sqlite(&dir, "tollgate.db"), &[]);
    populate(&api).await;
    let before = api.get("/v1/namespaces/shop/resources/api").await;
    let mut b = Browser::start(&dir);
    sign_in(&mut b, &api, ADMIN);
    let rows = b.rows().len();
    open_editor(&mut b, "shop/api");
    b.type_into("#f-capacity", "250");
    b.eval(
        "(() => { window.__calls = 0; const f = window.fetch; \
           window.fetch = (path, init) => { window.__calls++; \
             if (init && init.method === 'PUT') return Promise.resolve(new Response( \
               JSON.stringify({ error: { reason: 'rate_limited', \
                 message: 'too many requests; retry in 30000 ms' } }), \
               { status: 429, headers: { 'Retry-After': '30', \
                 'Content-Type': 'application/json' } })); \
             return f(path, init); }; \
           return true; })()",
    );
    b.click("#save");
    b.wait_for(
        "the refusal in the editor",
        "document.getElementById('message').dataset.state === 'error'",
    );
    let message = b.text("#message");
    assert!(
        message.contains("shop/api was not saved; try again in 30 s")
            && message.contains("your change is kept"),
        "{message}"
    );
    assert_eq!(
        b.eval("document.getElementById('edit-panel').hidden"),
        json!(false),
        "the editor stays open"
    );
    assert_eq!(
        b.eval("document.getElementById('f-capacity').value"),
        json!("250"),
        "the unsaved change stays"
    );
    assert_eq!(b.text("#editing"), "shop/api");
    assert_eq!(b.rows().len(), rows, "the list stays");
    // Nothing is asked before Retry-After: the save and a reload wait.
    let calls = b.eval(
        "(() => { window.__calls = 0; \
           for (let i = 0; i < 3; i++) document.getElementById('reload').click(); \
           return window.__calls; })()",
    );
    assert_eq!(calls, json!(0), "no request before Retry-After");
    // Review of issue 22: only a load waited; a second save (or an
    // override's) went out at once. Each is held, saying when to try.
    b.eval(
        "(() => { window.__calls = 0; const m = document.getElementById('message'); \
           m.dataset.state = 'idle'; m.textContent = ''; return true; })()",
    );
    b.click("#save");
    b.wait_for(
        "the held save",
        "document.getElementById('message').dataset.state === 'error'",
    );
    let message = b.text("#message");
    assert!(
        message.contains("not sent") && message.contains("shop/api was not saved; try again in "),
        "{message}"
    );
    b.eval(
        "(() => { const m = document.getElementById('message'); \
           m.dataset.state = 'idle'; m.textContent = ''; return true; })()",
    );
    b.type_into("#o-domain", "acme");
    b.type_into("#o-body", r#"{"capacity": 5}"#);
    b.click("#save-override");
    b.wait_for(
        "the held override",
        "document.getElementById('message').dataset.state === 'error'",
    );
    let message = b.text("#message");
    assert!(message.contains("try again in "), "{message}");
    assert_eq!(
        b.eval("window.__calls"),
        json!(0),
        "no PUT (nor anything else) during the pause"
    );
    let now = api.get("/v1/namespaces/shop/resources/api").await;
    assert_eq!(now["resource"], before["resource"], "nothing was written");
    b.assert_no_problems();
}

#[tokio::test]
async fn a_resources_history_shows_who_changed_what() {
    let dir = Sandbox::new("config-api-ui-history");
    let api = ConfigApi::start(&dir, &sqlite(&dir, "tollgate.db"), &[]);
    populate(&api).await;
    put(
        &api,
        "/v1/namespaces/shop/resources/api",
        json!({"algorithm": "token_bucket", "capacity": 250, "rate": "10/s"}),
    )
    .await;
    let over = put(
        &api,
        "/v1/namespaces/shop/resources/api/domains/bigcorp",
        json!({"capacity": 1000}),
    )
    .await;
    let mut b = Browser::start(&dir);
    sign_in(&mut b, &api, READER);
    b.click("button.history[data-resource=\"shop/api\"]");
    b.wait_for(
        "the history",
        "document.querySelectorAll('#history li.change').length === 3",
    );
    assert_eq!(b.text("#history-of"), "shop/api");
    let changes = b.eval(
        "[...document.querySelectorAll('#history li.change')].map(li => ({ \
           revision: li.dataset.revision, who: li.querySelector('.who').textContent, \
           diff: [...li.querySelectorAll('.diff li')].map(x => x.textContent) }))",
    );
    let newest = &changes[0];
    assert_eq!(newest["revision"], over["revision"].to_string());
    let who = newest["who"].as_str().unwrap();
    assert!(
        who.contains("alice") && who.contains("put_domain shop/api/domains/bigcorp"),
        "{who}"
    );
    assert_eq!(newest["diff"], json!(["+ domains.bigcorp.capacity: 1000"]));
    assert_eq!(
        changes[1]["diff"],
        json!(["- capacity: 100", "+ capacity: 250"])
    );
    let created = changes[2]["diff"].as_array().unwrap();
    assert!(created.contains(&json!("+ capacity: 100")), "{created:?}");
    b.screenshot("console-history-1280.png");
    b.assert_no_problems();
}

#[tokio::test]
async fn a_read_token_sees_no_edit_controls_and_a_refused_token_or_429_clears_the_page() {
    let dir = Sandbox::new("config-api-ui-read");
    // The page's bucket (token `fleet`): 8 requests at once, then 1 a second.
    let api = ConfigApi::start(
        &dir,
        &sqlite(&dir, "tollgate.db"),
        &["--rate-limit", "1", "--burst", "8"],
    );
    let revision = populate(&api).await;

    let mut b = Browser::start(&dir);
    // A wrong token: the API's message, no data.
    b.navigate(&api.url("/ui#token=not-a-token-at-all"));
    b.wait_for(
        "the refusal of the token",
        "document.getElementById('status').dataset.state === 'need-token'",
    );
    assert_eq!(
        b.text("#status"),
        "the bearer token is not known (the token was forgotten: enter one again)"
    );
    assert_eq!(b.rows().len(), 0);
    // Review: the refused token is not kept to be sent again.
    assert_eq!(
        b.eval("sessionStorage.length"),
        json!(0),
        "a refused token is dropped"
    );

    // The read token: everything shown, nothing to change it with.
    b.navigate(&api.url(&format!("/ui#token={READER}")));
    wait_ready(&mut b);
    assert_eq!(b.text("#revision"), revision.to_string());
    assert_eq!(b.text("#whoami"), "signed in as fleet (read)");
    assert_eq!(b.rows().len(), 4);
    let controls = b.eval(
        "document.querySelectorAll('button.edit, button.delete, button.new-resource, \
         button.save-flags, button.delete-namespace, input.flag').length",
    );
    assert_eq!(controls, json!(0), "no edit controls for a read token");
    assert_eq!(
        b.eval("getComputedStyle(document.getElementById('new-namespace')).display"),
        json!("none"),
        "no create form shown"
    );
    assert_eq!(
        b.eval("document.querySelectorAll('button.history').length"),
        json!(4),
        "history is a read"
    );
    b.screenshot("console-read-only-1280.png");

    // A wrong token after a good one: nothing of the old state stays.
    b.navigate(&api.url("/ui#token=another-wrong-token-xyz"));
    b.wait_for(
        "the refusal",
        "document.getElementById('status').dataset.state === 'need-token'",
    );
    assert_eq!(b.rows().len(), 0);
    assert_eq!(b.text("#revision"), "-");
    assert_eq!(b.text("#whoami"), "not signed in");

    // Reloads past the bucket: the 429 clears the page too, and the page
    // loads by itself once the API's Retry-After (1 s here) has passed.
    b.navigate(&api.url(&format!("/ui#token={READER}")));
    b.wait_for(
        "the list or the limit",
        "['ready', 'error'].includes(document.getElementById('status').dataset.state)",
    );
    let past_the_bucket = |b: &mut Browser| {
        for _ in 0..20 {
            b.eval("document.getElementById('reload').click()");
        }
        b.wait_for(
            "the rate limit",
            "document.getElementById('status').dataset.state === 'error' && \
             document.getElementById('status').textContent.startsWith('too many requests')",
        );
    };
    past_the_bucket(&mut b);
    b.wait_for(
        "the list again after Retry-After",
        "document.getElementById('status').dataset.state === 'ready'",
    );
    assert_eq!(b.rows().len(), 4);

    // Review: it says when to retry (the API's Retry-After) and asks
    // nothing before then (a reload is not sent: it would only be refused
    // again). Second review (MEDIUM-D): the API's 1 s Retry-After could
    // pass during the round trips of the check, so the API's 429s are
    // given a Retry-After of 30 s here (the page's own fetch, wrapped):
    // no wall clock decides the outcome.
    b.eval(
        "(() => { window.__calls = 0; const f = window.fetch; \
           window.fetch = async (...a) => { window.__calls++; const r = await f(...a); \
             if (r.status !== 429) return r; \
             const h = new Headers(r.headers); h.set('Retry-After', '30'); \
             return new Response(await r.text(), { status: 429, statusText: r.statusText, headers: h }); }; \
           return true; })()",
    );
    past_the_bucket(&mut b);
    assert_eq!(b.rows().len(), 0);
    assert_eq!(b.text("#revision"), "-");
    assert_eq!(b.text("#whoami"), "not signed in");
    let status = b.text("#status");
    assert!(
        status.contains("rate limited: retrying in 30 s"),
        "{status}"
    );
    let calls = b.eval(
        "(() => { window.__calls = 0; \
           for (let i = 0; i < 5; i++) document.getElementById('reload').click(); \
           return window.__calls; })()",
    );
    assert_eq!(calls, json!(0), "no request before Retry-After");
    assert_eq!(b.rows().len(), 0);
    b.assert_no_problems();
}

/// Issue 22: at 390 px the header overflowed and the edit buttons were
/// off-screen.
#[tokio::test]
async fn at_390_px_nothing_overflows_and_every_control_is_on_screen() {
    let dir = Sandbox::new("config-api-ui-narrow");
    let api = ConfigApi::start(&dir, &sqlite(&dir, "tollgate.db"), &[]);
    populate(&api).await;
    // A long parameter (a JSON of overrides) that must wrap.
    put(
        &api,
        "/v1/namespaces/shop/resources/wide",
        json!({
            "algorithm": "token_bucket", "capacity": 100, "rate": "10/s",
            "domains": {
                "a-very-long-domain-name-that-is-wider-than-a-phone.example": {"capacity": 1000},
                "another-long-domain-name-of-a-big-customer.example": {"capacity": 2000},
            },
        }),
    )
    .await;
    let mut b = Browser::start(&dir);
    b.viewport(390, 844);
    sign_in(&mut b, &api, ADMIN);
    assert_eq!(b.eval("window.innerWidth"), json!(390));
    assert!(fits(&mut b), "the list overflows at 390 px");
    let off_screen = b.eval(
        "[...document.querySelectorAll('button, input, select, textarea')] \
           .filter(e => e.offsetParent !== null) \
           .map(e => [e.id || e.className, e.getBoundingClientRect().right]) \
           .filter(([_, right]) => right > window.innerWidth + 0.5)",
    );
    assert_eq!(off_screen, json!([]), "controls off-screen");
    b.screenshot("console-list-390.png");
    open_editor(&mut b, "shop/wide");
    assert!(fits(&mut b), "the editor overflows at 390 px");
    let save_right = b.eval("document.getElementById('save').getBoundingClientRect().right");
    assert!(save_right.as_f64().unwrap() <= 390.0, "{save_right}");
    b.screenshot("console-editor-390.png");
    b.click("button.history[data-resource=\"shop/wide\"]");
    b.wait_for(
        "the history",
        "document.querySelectorAll('#history li.change').length === 1",
    );
    assert!(fits(&mut b), "the history overflows at 390 px");
    b.assert_no_problems();
}

/// Issue 22: the console shows per resource what the limiting servers
/// decide now (`--servers`), refreshed on its own.
#[tokio::test]
async fn the_console_shows_what_the_limiting_servers_decide_now() {
    let dir = Sandbox::new("config-api-ui-live");
    let (server, token_file) = common::live_usage::limiting_server(&dir, "api", &[]);
    let servers = server.http.to_string();
    let api = ConfigApi::start(
        &dir,
        &sqlite(&dir, "tollgate.db"),
        &[
            "--servers",
            &servers,
            "--servers-refresh-ms",
            "1000",
            "--servers-token-file",
            token_file.to_str().unwrap(),
        ],
    );
    // One without the token: metrics only, and it says so.
    let plain = ConfigApi::start(
        &dir,
        &sqlite(&dir, "plain.db"),
        &["--servers", &servers, "--servers-refresh-ms", "1000"],
    );
    populate(&api).await;
    let mut b = Browser::start(&dir);
    sign_in(&mut b, &api, READER);
    b.wait_for(
        "the live state",
        "document.getElementById('live-state').textContent.startsWith('live from 1 of 1 server(s)')",
    );
    assert_eq!(b.text("td.live[data-resource=\"shop/db\"]"), "no decisions");
    let body = r#"{"namespace":"shop","resource":"api","domain":"acme","hits":1}"#;
    for _ in 0..5 {
        server.json("POST", "/v1/request", Some(body));
    }
    b.wait_for(
        "the decisions shown",
        "document.querySelector('td.live[data-resource=\"shop/api\"]').textContent \
           .includes('5 decisions, 3 rejected (60%) in all; 1 near the limit; \
                      top denied: acme (3)')",
    );
    b.screenshot("console-live-1280.png");
    b.assert_no_problems();

    // Review H1: without --servers-token-file the numbers still show, and
    // the page says the denied domains are unavailable.
    populate(&plain).await;
    drop(b);
    let mut b = Browser::start(&Sandbox::new("config-api-ui-live-plain"));
    sign_in(&mut b, &plain, READER);
    b.wait_for(
        "the decisions shown without denied domains",
        "document.querySelector('td.live[data-resource=\"shop/api\"]').textContent \
           .includes('5 decisions, 3 rejected (60%) in all') && \
         document.getElementById('live-state').textContent \
           .includes('top denied domains unavailable (no --servers-token-file')",
    );
    assert!(!b
        .text("td.live[data-resource=\"shop/api\"]")
        .contains("top denied"));
    b.assert_no_problems();
}
