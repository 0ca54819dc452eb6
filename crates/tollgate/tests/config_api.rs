//! `tollgate config-api` as a real process on a free port, over real
//! SQLite (and PostgreSQL: see `postgres_*`): CRUD of namespaces,
//! resources, domain overrides, groups and members; normalization on write
//! with warnings; invalid input refused with nothing written; revisions,
//! deltas and the long poll; export and import; the audit trail; tokens
//! and roles; the API's own rate limit; concurrent writers; restarts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::config_api::{ConfigApi, ADMIN, READER};
use common::Sandbox;
use serde_json::{json, Value};

/// The CRUD scenario, on any database.
async fn crud(api: &ConfigApi, dir: &Sandbox) {
    let r = api.ok("PUT", "/v1/namespaces/shop", Some(json!({}))).await;
    assert_eq!(r["revision"], 1);
    let r = api
        .ok(
            "PUT",
            "/v1/namespaces/shop/resources/api",
            Some(json!({"algorithm": "token_bucket", "capacity": 100, "rate": "10/s"})),
        )
        .await;
    assert_eq!(r["revision"], 2);
    assert_eq!(
        r["resource"]["rate"], "10/1s",
        "normalized as the file loader does"
    );

    // Charon §4.1: limits above the global limit are lowered, with a
    // warning returned to the caller.
    let r = api
        .ok(
            "PUT",
            "/v1/namespaces/shop/resources/db",
            Some(json!({"kind": "concurrency", "domain_limit": 50, "global_limit": 10})),
        )
        .await;
    assert_eq!(r["resource"]["domain_limit"], 10);
    assert_eq!(r["warnings"].as_array().unwrap().len(), 1, "{r}");

    // Domain overrides, groups and members.
    let r = api
        .ok(
            "PUT",
            "/v1/namespaces/shop/resources/db/domains/acme",
            Some(json!({"domain_limit": 5})),
        )
        .await;
    assert_eq!(r["resource"]["domains"]["acme"]["domain_limit"], 5);
    let r = api
        .ok(
            "PUT",
            "/v1/namespaces/shop/resources/db/groups/big",
            Some(json!({"limit": 4, "members": ["acme"]})),
        )
        .await;
    assert_eq!(r["resource"]["groups"][0]["members"], json!(["acme"]));
    api.ok(
        "PUT",
        "/v1/namespaces/shop/resources/db/groups/big/members/globex",
        None,
    )
    .await;
    let r = api
        .ok(
            "DELETE",
            "/v1/namespaces/shop/resources/db/groups/big/members/acme",
            None,
        )
        .await;
    assert_eq!(r["resource"]["groups"][0]["members"], json!(["globex"]));
    let at = r["revision"].as_i64().unwrap();

    // Invalid input: a precise 4xx, and nothing written.
    let (status, e) = api
        .admin(
            "PUT",
            "/v1/namespaces/shop/resources/api",
            Some(json!({"algorithm": "token_bucket", "capacity": 100, "rat": "10/s"})),
        )
        .await;
    assert_eq!(status, 422, "{e}");
    assert_eq!(e["error"]["reason"], "invalid_config");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("rat"),
        "{e}"
    );
    let (status, e) = api
        .call(
            Some(ADMIN),
            "PUT",
            "/v1/namespaces/shop/resources/api",
            Some("{not json"),
        )
        .await;
    assert_eq!(
        (status, e["error"]["reason"].as_str()),
        (400, Some("malformed_request"))
    );
    let (status, _) = api
        .admin(
            "PUT",
            "/v1/namespaces/nope/resources/api",
            Some(json!({"algorithm": "deny"})),
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = api
        .admin(
            "PUT",
            "/v1/namespaces/shop/resources/db/domains/x",
            Some(json!({"domain_limit": -1})),
        )
        .await;
    assert_eq!(status, 422);
    assert_eq!(
        api.get("/v1/namespaces/shop/resources/api").await["capacity"],
        100
    );
    assert_eq!(
        api.get("/v1/namespaces").await["revision"],
        at,
        "refused changes write nothing"
    );

    // Deltas.
    let all = api.get("/v1/config?since=0").await;
    assert_eq!(all["revision"], at);
    assert_eq!(all["resources"].as_array().unwrap().len(), 2);
    let none = api.get(&format!("/v1/config?since={at}")).await;
    assert!(none["resources"].as_array().unwrap().is_empty());
    api.ok("DELETE", "/v1/namespaces/shop/resources/api", None)
        .await;
    let d = api.get(&format!("/v1/config?since={at}")).await;
    assert_eq!(
        d["deleted"],
        json!([{"namespace": "shop", "resource": "api"}])
    );
    assert!(d["resources"].as_array().unwrap().is_empty());

    // The audit trail: who changed what.
    let audit = api.get("/v1/audit").await;
    let entries = audit["entries"].as_array().unwrap();
    assert_eq!(entries.len() as i64, at + 1);
    assert!(entries.iter().all(|e| e["actor"] == "alice"));
    assert_eq!(entries[1]["action"], "put_resource");
    assert_eq!(entries[1]["target"], "shop/api");
    assert_eq!(entries.last().unwrap()["action"], "delete_resource");

    // Export: a config file the loader takes.
    let resp = api
        .http
        .get(format!("http://{}/v1/export", api.addr))
        .bearer_auth(READER)
        .send()
        .await
        .unwrap();
    let yaml = resp.text().await.unwrap();
    assert!(
        yaml.contains("name: db") && yaml.contains("globex"),
        "{yaml}"
    );
    let file = dir.write("exported.yaml", &yaml);
    let check = dir.run(&["check-config", file.to_str().unwrap()]);
    assert!(check.success(), "{check}");

    // Import: a whole file, all or nothing.
    let example = std::fs::read_to_string(common::example("tollgate.yaml")).unwrap();
    let (status, r) = api
        .call(Some(ADMIN), "POST", "/v1/import", Some(&example))
        .await;
    assert_eq!(status, 200, "{r}");
    let ns = api.get("/v1/namespaces").await;
    let names: Vec<&str> = ns["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["default"]);
    let sandbox = api.get("/v1/namespaces/default/resources/sandbox").await;
    assert_eq!(sandbox["domains"]["acme"]["domain_limit"], 10);
    let (status, _) = api
        .call(
            Some(ADMIN),
            "POST",
            "/v1/import",
            Some("namespaces: [ { name: x, resources: [ { name: y } ] } ]"),
        )
        .await;
    assert_eq!(status, 422);
    assert!(
        api.get("/v1/namespaces/default").await["resources"]
            .as_array()
            .unwrap()
            .len()
            > 5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_crud_normalization_deltas_audit_export_import() {
    let dir = Sandbox::new("config-api-sqlite");
    let db = format!("sqlite://{}", dir.path("tollgate.db").display());
    let api = ConfigApi::start(&dir, &db, &[]);
    crud(&api, &dir).await;
    let revision = api.get("/v1/namespaces").await["revision"].clone();
    drop(api);
    // The file keeps everything across a restart.
    let api = ConfigApi::start(&dir, &db, &[]);
    assert_eq!(api.get("/v1/namespaces").await["revision"], revision);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_database_is_a_file_created_on_first_start() {
    let dir = Sandbox::new("config-api-default");
    let api = ConfigApi::start(&dir, "sqlite://tollgate.db", &[]);
    api.ok("PUT", "/v1/namespaces/x", None).await;
    assert!(dir.path("tollgate.db").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_and_readers_cannot_write_and_callers_are_rate_limited() {
    let dir = Sandbox::new("config-api-auth");
    let db = format!("sqlite://{}", dir.path("t.db").display());
    let api = ConfigApi::start(&dir, &db, &[]);
    let (status, e) = api.call(None, "GET", "/v1/namespaces", None).await;
    assert_eq!(
        (status, e["error"]["reason"].as_str()),
        (401, Some("unauthorized"))
    );
    let (status, _) = api
        .call(Some("not-a-token-at-all-xx"), "GET", "/v1/namespaces", None)
        .await;
    assert_eq!(status, 401);
    let (status, e) = api
        .call(Some(READER), "PUT", "/v1/namespaces/x", Some("{}"))
        .await;
    assert_eq!(
        (status, e["error"]["reason"].as_str()),
        (403, Some("forbidden"))
    );
    api.get("/v1/namespaces").await;
    assert!(api.get("/v1/audit").await["entries"]
        .as_array()
        .unwrap()
        .is_empty());

    // tollgate's own token bucket in front of the API: 3 at once, then
    // one a second.
    let dir = Sandbox::new("config-api-limit");
    let db = format!("sqlite://{}", dir.path("t.db").display());
    let api = ConfigApi::start(&dir, &db, &["--rate-limit", "1", "--burst", "3"]);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(
            api.call(Some(READER), "GET", "/v1/namespaces", None)
                .await
                .0,
        );
    }
    assert_eq!(&statuses[..3], &[200, 200, 200]);
    assert!(statuses[3..].contains(&429), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_each_get_their_own_revision() {
    let dir = Sandbox::new("config-api-concurrent");
    let db = format!("sqlite://{}", dir.path("t.db").display());
    let api = std::sync::Arc::new(ConfigApi::start(&dir, &db, &[]));
    concurrent(&api).await;
}

async fn concurrent(api: &std::sync::Arc<ConfigApi>) {
    let base = api.ok("PUT", "/v1/namespaces/load", None).await["revision"]
        .as_i64()
        .unwrap();
    let audited = api.get("/v1/audit?limit=1000").await["entries"]
        .as_array()
        .unwrap()
        .len();
    let mut tasks = Vec::new();
    for w in 0..6 {
        let api = std::sync::Arc::clone(api);
        tasks.push(tokio::spawn(async move {
            let mut revisions = Vec::new();
            for i in 0..8 {
                let body =
                    json!({"algorithm": "gcra", "rate": format!("{}/s", i + 1), "burst": w + 1});
                let r = api
                    .ok(
                        "PUT",
                        &format!("/v1/namespaces/load/resources/r{w}-{i}"),
                        Some(body),
                    )
                    .await;
                revisions.push(r["revision"].as_i64().unwrap());
            }
            revisions
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    let expected: Vec<i64> = (base + 1..=base + 48).collect();
    assert_eq!(all, expected, "48 writes, 48 distinct revisions");
    let d = api.get(&format!("/v1/config?since={base}")).await;
    assert_eq!(d["resources"].as_array().unwrap().len(), 48);
    let entries = api.get("/v1/audit?limit=1000").await["entries"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(entries, audited + 48);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_answers_with_the_change_that_ends_it() {
    let dir = Sandbox::new("config-api-wait");
    let db = format!("sqlite://{}", dir.path("t.db").display());
    let api = std::sync::Arc::new(ConfigApi::start(&dir, &db, &[]));
    api.ok("PUT", "/v1/namespaces/w", None).await;
    let waiter = {
        let api = std::sync::Arc::clone(&api);
        tokio::spawn(async move { api.get("/v1/config/wait?since=1&timeout_ms=60000").await })
    };
    api.ok(
        "PUT",
        "/v1/namespaces/w/resources/r",
        Some(json!({"algorithm": "unlimited"})),
    )
    .await;
    let d = waiter.await.unwrap();
    assert_eq!(d["revision"], 2);
    assert_eq!(d["resources"][0]["body"]["name"], "r");
    // Nothing newer: the poll ends at its timeout with an empty delta.
    let d = api.get("/v1/config/wait?since=2&timeout_ms=50").await;
    assert_eq!(
        (
            d["revision"].as_i64(),
            d["resources"].as_array().map(Vec::len)
        ),
        (Some(2), Some(0))
    );
}

#[test]
fn it_refuses_to_start_without_tokens_or_with_a_bad_database() {
    let dir = Sandbox::new("config-api-refuse");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "config-api",
            "--listen",
            "127.0.0.1:0",
            "--database",
            "sqlite://x.db",
        ])
        .current_dir(&dir.dir)
        .env_remove("TOLLGATE_CONFIG_API_TOKENS")
        .env_remove("TOLLGATE_CONFIG_API_TOKENS_FILE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tokens"));
    let tokens = dir.write("tokens", format!("admin:a:{ADMIN}\n"));
    // Issue 23: a file name was answered with "relative URL without a
    // base: relative URL without a base".
    for database in ["mysql://nope/x", "tollgate.db"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args([
                "config-api",
                "--listen",
                "127.0.0.1:0",
                "--database",
                database,
            ])
            .arg("--tokens-file")
            .arg(&tokens)
            .current_dir(&dir.dir)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "--database {database}: not a database URL: give sqlite:FILE (a SQLite file, \
                 created if missing) or postgres://USER@HOST/DATABASE"
            )),
            "{stderr}"
        );
        assert!(!stderr.contains("relative URL"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crud_concurrent_writers_and_the_database_going_away() {
    use tollgate_configapi::testing::PostgresServer;
    let mut pg = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap();
    let dir = Sandbox::new("config-api-postgres");
    // The password from a file, not the URL.
    let url = pg.url();
    let (head, host) = url.split_once('@').unwrap();
    let (scheme_user, password) = head.rsplit_once(':').unwrap();
    let password_file = dir.write("db-password", format!("{password}\n"));
    let bare = format!("{scheme_user}@{host}");
    let api = std::sync::Arc::new(ConfigApi::start(
        &dir,
        &bare,
        &["--database-password-file", password_file.to_str().unwrap()],
    ));
    crud(&api, &dir).await;
    concurrent(&api).await;
    let revision = api.get("/v1/namespaces").await["revision"].clone();

    // The database goes away: reads and writes fail with 503 and a reason,
    // readiness says so; when it is back, everything is where it was.
    pg.kill();
    let (status, e) = api.call(Some(READER), "GET", "/v1/namespaces", None).await;
    assert_eq!(
        (status, e["error"]["reason"].as_str()),
        (503, Some("database_unavailable")),
        "{e}"
    );
    let (status, _) = api.admin("PUT", "/v1/namespaces/late", None).await;
    assert_eq!(status, 503);
    let ready = api
        .http
        .get(format!("http://{}/readyz", api.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    let mut pg = tokio::task::spawn_blocking(move || {
        pg.restart();
        pg
    })
    .await
    .unwrap();
    let mut back = None;
    for _ in 0..100 {
        let (status, v) = api.call(Some(READER), "GET", "/v1/namespaces", None).await;
        if status == 200 {
            back = Some(v);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(back.expect("the API never recovered")["revision"], revision);
    api.ok("PUT", "/v1/namespaces/late", None).await;
    pg.kill();
}

/// Polls the server's `/status` until the config API revision in force is
/// `revision`.
fn until_revision(server: &common::serving::Serving, revision: i64) -> Value {
    let mut last = Value::Null;
    for _ in 0..300 {
        let (_, status) = server.json("GET", "/status", None);
        if status["config"]["api_revision"] == revision {
            return status;
        }
        last = status;
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the server never ran revision {revision}: {last}");
}

fn hit(server: &common::serving::Serving, ns: &str, resource: &str) -> bool {
    let body =
        format!(r#"{{"namespace":"{ns}","resource":"{resource}","domain":"acme","hits":1}}"#);
    let (status, v) = server.json("POST", "/v1/request", Some(&body));
    assert!(status == 200 || status == 429, "{status} {v}");
    v["allowed"].as_bool().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_follows_the_api_and_keeps_the_state_of_unchanged_limits() {
    let dir = Sandbox::new("config-api-follow");
    let db = format!("sqlite://{}", dir.path("t.db").display());
    let api = ConfigApi::start(&dir, &db, &[]);
    api.ok("PUT", "/v1/namespaces/shop", None).await;
    let r = api
        .ok(
            "PUT",
            "/v1/namespaces/shop/resources/api",
            Some(json!({"algorithm": "token_bucket", "capacity": 3, "rate": "1/h"})),
        )
        .await;
    let first = r["revision"].as_i64().unwrap();

    // The server also has a file with a namespace of its own.
    let file = dir.write(
        "tollgate.yaml",
        "namespaces:\n  - name: local\n    resources:\n      - { name: x, algorithm: unlimited }\n",
    );
    let token = dir.write("read-token", format!("{READER}\n"));
    let url = format!("http://{}", api.addr);
    let server = common::serving::Serving::start(
        &dir,
        &[
            "--config",
            file.to_str().unwrap(),
            "--config-api",
            &url,
            "--config-api-token-file",
            token.to_str().unwrap(),
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
        ],
        &[],
    );
    until_revision(&server, first);
    assert!(hit(&server, "local", "x"));
    for _ in 0..3 {
        assert!(hit(&server, "shop", "api"));
    }
    assert!(!hit(&server, "shop", "api"));

    // A new resource arrives through the long poll; the bucket that did
    // not change keeps its state (still empty).
    let r = api
        .ok(
            "PUT",
            "/v1/namespaces/shop/resources/search",
            Some(json!({"algorithm": "gcra", "rate": "10/s", "burst": 5})),
        )
        .await;
    until_revision(&server, r["revision"].as_i64().unwrap());
    assert!(hit(&server, "shop", "search"));
    assert!(
        !hit(&server, "shop", "api"),
        "the unchanged limit kept its state"
    );

    // A changed limit starts afresh with its new parameters.
    let r = api
        .ok(
            "PUT",
            "/v1/namespaces/shop/resources/api",
            Some(json!({"algorithm": "token_bucket", "capacity": 5, "rate": "1/h"})),
        )
        .await;
    until_revision(&server, r["revision"].as_i64().unwrap());
    assert!(hit(&server, "shop", "api"));

    // A revision the server cannot take (a namespace its file has too) is
    // refused; the previous config keeps serving.
    let before = api.ok("PUT", "/v1/namespaces/local", None).await["revision"]
        .as_i64()
        .unwrap();
    let mut refused = Value::Null;
    for _ in 0..300 {
        let (_, status) = server.json("GET", "/status", None);
        if status["config"]["last_error"].is_string() {
            refused = status;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let error = refused["config"]["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("both in the config file and in the config API"),
        "{refused}"
    );
    assert_eq!(refused["config"]["api_revision"], before - 1);
    assert!(hit(&server, "shop", "search"));
    // Fixing the file (its namespace renamed) lets the refused revision
    // in: the server kept it as the newest and the reload takes it.
    dir.write(
        "tollgate.yaml",
        "namespaces:\n  - name: local2\n    resources:\n      - { name: x, algorithm: unlimited }\n",
    );
    let status = until_revision(&server, before);
    assert!(status["config"]["last_error"].is_null(), "{status}");
    assert!(hit(&server, "local2", "x"));

    // The API goes away: the server keeps serving what it has.
    let addr = api.addr.to_string();
    drop(api);
    assert!(hit(&server, "shop", "search"));
    assert!(hit(&server, "local2", "x"));

    // It comes back on another database, at a lower revision: the server
    // notices and takes the new database's config whole.
    let fresh = format!("sqlite://{}", dir.path("fresh.db").display());
    let api = ConfigApi::start(&dir, &fresh, &["--listen", &addr]);
    api.ok("PUT", "/v1/namespaces/fresh", None).await;
    let r = api
        .ok(
            "PUT",
            "/v1/namespaces/fresh/resources/r",
            Some(json!({"algorithm": "unlimited"})),
        )
        .await;
    until_revision(&server, r["revision"].as_i64().unwrap());
    assert!(hit(&server, "fresh", "r"));
    let body = r#"{"namespace":"shop","resource":"search","domain":"acme","hits":1}"#;
    let (status, v) = server.json("POST", "/v1/request", Some(body));
    assert_eq!(status, 404, "the old database's namespace is gone: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_for_the_api_and_for_a_server_that_follows_it() {
    let certs = tollgate_redis::testing::TestCerts::generate();
    let dir = Sandbox::new("config-api-tls");
    let cert = dir.write("api.pem", &certs.server_cert);
    let key = dir.write("api.key", &certs.server_key);
    let ca = dir.write("ca.pem", &certs.ca);
    let db = format!("sqlite://{}", dir.path("t.db").display());
    let api = ConfigApi::start_trusting(
        &dir,
        &db,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        Some(&certs.ca),
    );
    assert_eq!(api.scheme, "https");
    api.ok("PUT", "/v1/namespaces/tls", None).await;
    let r = api
        .ok(
            "PUT",
            "/v1/namespaces/tls/resources/r",
            Some(json!({"algorithm": "deny"})),
        )
        .await;
    // Plain HTTP to the TLS port gets nowhere.
    let plain = reqwest::get(format!("http://{}/v1/namespaces", api.addr)).await;
    assert!(plain.map(|r| !r.status().is_success()).unwrap_or(true));

    let token = dir.write("read-token", READER);
    let url = format!("https://{}", api.addr);
    let server = common::serving::Serving::start(
        &dir,
        &[
            "--config-api",
            &url,
            "--config-api-token-file",
            token.to_str().unwrap(),
            "--config-api-ca",
            ca.to_str().unwrap(),
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
        ],
        &[],
    );
    until_revision(&server, r["revision"].as_i64().unwrap());
    assert!(
        !hit(&server, "tls", "r"),
        "the API's deny resource is in force"
    );
}

/// Regression (issue 16, item 11): an import nested 100,000 levels deep
/// overflowed the stack of the loader and took the config API down. Now
/// it is refused, naming the bound and where it was passed, and the API
/// keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeply_nested_import_is_refused_and_the_api_keeps_serving() {
    let dir = Sandbox::new("config-api-deep");
    let db = format!("sqlite://{}", dir.path("tollgate.db").display());
    let api = ConfigApi::start(&dir, &db, &[]);
    for deep in [
        format!("namespaces:\n  {}x\n", "- ".repeat(100_000)),
        format!(
            "namespaces: {}1{}\n",
            "{a: ".repeat(100_000),
            "}".repeat(100_000)
        ),
    ] {
        let (status, e) = api
            .call(Some(ADMIN), "POST", "/v1/import", Some(&deep))
            .await;
        assert_eq!(
            (status, e["error"]["reason"].as_str()),
            (422, Some("invalid_config")),
            "{e}"
        );
        let message = e["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("import:") && message.contains("nested more than 64 levels deep"),
            "{message}"
        );
    }
    assert_eq!(api.get("/v1/namespaces").await["revision"], 0);
}
