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
use common::live_usage::limiting_server;
use common::serving::FREE_PORTS;
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
        api.get("/v1/namespaces/shop/resources/api").await["resource"]["capacity"],
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
    let sandbox = api.get("/v1/namespaces/default/resources/sandbox").await["resource"].clone();
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
    let api = ConfigApi::start_sqlite(&dir, &[]);
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
    let api = ConfigApi::start_sqlite(&dir, &["--rate-limit", "1", "--burst", "3"]);
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
    let api = std::sync::Arc::new(ConfigApi::start_sqlite(&dir, &[]));
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

/// Issue 22: a page's stale body overwrote a change made meanwhile (a
/// lost update), and saving a resource deleted meanwhile re-created it.
/// Every read names its revision (body and `ETag`); a write under
/// `If-Match` is refused with 412 and what is there now when its target
/// changed or vanished, and of concurrent writers that read the same
/// revision exactly one wins.
async fn preconditions(api: &std::sync::Arc<ConfigApi>) {
    const R: &str = "/v1/namespaces/cc/resources/api";
    api.ok("PUT", "/v1/namespaces/cc", None).await;
    let first = json!({"algorithm": "token_bucket", "capacity": 1, "rate": "1/s"});
    let (status, put, tag) = api.write_at("PUT", R, Some(first), None).await;
    assert_eq!(status, 200, "{put}");
    let mut at = put["revision"].as_i64().unwrap();
    assert_eq!(tag, Some(format!("\"{at}\"")), "a write answers its ETag");
    let (_, got, tag) = api.call_with(Some(READER), "GET", R, None, &[]).await;
    assert_eq!(
        (got["revision"].as_i64(), tag),
        (Some(at), Some(format!("\"{at}\"")))
    );
    assert_eq!(got["resource"]["capacity"], 1);

    // Rounds of four writers that all read revision `at`: one wins, the
    // others get 412 with the winner's resource and revision.
    for round in 0..6 {
        let mut tasks = Vec::new();
        for w in 0..4 {
            let api = std::sync::Arc::clone(api);
            let body = json!({"algorithm": "token_bucket", "capacity": 100 * round + w + 2, "rate": "1/s"});
            tasks.push(tokio::spawn(async move {
                api.write_at("PUT", R, Some(body), Some(at)).await
            }));
        }
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        let winners: Vec<&(u16, Value, Option<String>)> =
            answers.iter().filter(|a| a.0 == 200).collect();
        assert_eq!(
            winners.len(),
            1,
            "round {round}: exactly one wins: {answers:?}"
        );
        let won = &winners[0].1;
        for (status, e, tag) in answers.iter().filter(|a| a.0 != 200) {
            assert_eq!(*status, 412, "{e}");
            assert_eq!(e["error"]["reason"], "precondition_failed");
            assert_eq!(e["current"]["resource"], won["resource"], "{e}");
            assert_eq!(e["current"]["revision"], won["revision"]);
            assert_eq!(tag.clone(), Some(format!("\"{}\"", won["revision"])));
            let message = e["error"]["message"].as_str().unwrap();
            assert!(
                message.contains(&format!("changed since revision {at}")),
                "{message}"
            );
        }
        let now = api.get(R).await;
        assert_eq!(
            now["resource"], won["resource"],
            "the winner's change stands"
        );
        at = won["revision"].as_i64().unwrap();
    }

    // Overrides and groups carry the resource's revision: a stale one is
    // refused and writes nothing.
    let stale = at - 1;
    let before = api.get("/v1/namespaces").await["revision"].clone();
    for (method, path, body) in [
        (
            "PUT",
            format!("{R}/domains/acme"),
            Some(json!({"capacity": 5})),
        ),
        ("PUT", format!("{R}/groups/big"), Some(json!({"limit": 3}))),
        ("DELETE", R.to_owned(), None),
        ("PUT", "/v1/namespaces/cc".to_owned(), Some(json!({}))),
        ("DELETE", "/v1/namespaces/cc".to_owned(), None),
    ] {
        let (status, e, _) = api.write_at(method, &path, body, Some(stale)).await;
        assert_eq!(status, 412, "{method} {path}: {e}");
        assert!(e.get("current").is_some(), "{e}");
    }
    assert_eq!(
        api.get("/v1/namespaces").await["revision"],
        before,
        "nothing written"
    );
    let (status, r, _) = api
        .write_at(
            "PUT",
            &format!("{R}/domains/acme"),
            Some(json!({"capacity": 5})),
            Some(at),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    at = r["revision"].as_i64().unwrap();
    const POOL: &str = "/v1/namespaces/cc/resources/pool";
    let pool = api
        .ok(
            "PUT",
            POOL,
            Some(json!({"kind": "concurrency", "domain_limit": 3})),
        )
        .await["revision"]
        .as_i64()
        .unwrap();
    let group = json!({"limit": 3, "members": ["acme"]});
    let (status, r, _) = api
        .write_at(
            "PUT",
            &format!("{POOL}/groups/big"),
            Some(group.clone()),
            Some(pool),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let (status, e, _) = api
        .write_at(
            "PUT",
            &format!("{POOL}/groups/big/members/x"),
            None,
            Some(pool),
        )
        .await;
    assert_eq!(status, 412, "a member carries the resource's revision: {e}");
    let last = r["revision"].as_i64().unwrap();

    // The namespace's revision moves with any change in it.
    let (_, ns, tag) = api
        .call_with(Some(READER), "GET", "/v1/namespaces/cc", None, &[])
        .await;
    assert_eq!(
        (ns["revision"].as_i64(), tag),
        (Some(last), Some(format!("\"{last}\"")))
    );

    // Deleted meanwhile: 412 with `current: null`, and never re-created.
    let (status, r, _) = api.write_at("DELETE", R, None, Some(at)).await;
    assert_eq!(status, 200, "{r}");
    let deleted = r["revision"].as_i64().unwrap();
    let body = json!({"algorithm": "token_bucket", "capacity": 9, "rate": "1/s"});
    for (method, path) in [
        ("PUT", R.to_owned()),
        ("PUT", format!("{R}/domains/acme")),
        ("DELETE", R.to_owned()),
    ] {
        let (status, e, _) = api
            .write_at(method, &path, Some(body.clone()), Some(at))
            .await;
        assert_eq!(status, 412, "{method} {path}: {e}");
        assert_eq!(e["current"], Value::Null, "{e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("no longer exists (deleted at revision {deleted})")),
            "{message}"
        );
    }
    let (status, e, _) = api
        .call_with(
            Some(ADMIN),
            "PUT",
            R,
            Some(&body.to_string()),
            &[("if-match", "*")],
        )
        .await;
    assert_eq!(status, 412, "If-Match: * needs it to exist: {e}");
    let (status, _) = api.call(Some(READER), "GET", R, None).await;
    assert_eq!(status, 404, "not re-created");

    // If-None-Match: * creates, never replaces.
    let create = [("if-none-match", "*")];
    let (status, r, _) = api
        .call_with(Some(ADMIN), "PUT", R, Some(&body.to_string()), &create)
        .await;
    assert_eq!(status, 200, "{r}");
    let (status, e, _) = api
        .call_with(Some(ADMIN), "PUT", R, Some(&body.to_string()), &create)
        .await;
    assert_eq!(status, 412, "{e}");
    assert_eq!(e["current"]["resource"]["capacity"], 9);

    // A namespace deleted meanwhile: its resources are gone too, and an
    // If-Match write is 412, not a namespace re-created.
    let (_, ns, _) = api
        .call_with(Some(READER), "GET", "/v1/namespaces/cc", None, &[])
        .await;
    let ns_at = ns["revision"].as_i64().unwrap();
    let (status, r, _) = api
        .write_at("DELETE", "/v1/namespaces/cc", None, Some(ns_at))
        .await;
    assert_eq!(status, 200, "{r}");
    let (status, e, _) = api
        .write_at("PUT", R, Some(body.clone()), Some(ns_at))
        .await;
    assert_eq!((status, &e["current"]), (412, &Value::Null), "{e}");
    let (status, e, _) = api
        .write_at("PUT", "/v1/namespaces/cc", Some(json!({})), Some(ns_at))
        .await;
    assert_eq!((status, &e["current"]), (412, &Value::Null), "{e}");
    let (status, _) = api
        .call(Some(READER), "GET", "/v1/namespaces/cc", None)
        .await;
    assert_eq!(status, 404);

    // Review M6: a namespace's `revision` in the list is the one GET
    // /v1/namespaces/{ns} answers (anything in it changed), so it works
    // as If-Match; the flags' own revision is `flags_revision`. A change
    // to a resource moves the first only.
    api.ok("PUT", "/v1/namespaces/cc", None).await;
    api.ok("PUT", R, Some(body.clone())).await;
    let listed = |list: &Value| {
        list["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "cc")
            .cloned()
            .unwrap()
    };
    let entry = listed(&api.get("/v1/namespaces").await);
    let (_, one, _) = api
        .call_with(Some(READER), "GET", "/v1/namespaces/cc", None, &[])
        .await;
    assert_eq!(entry["revision"], one["revision"], "{entry} {one}");
    assert!(
        entry["flags_revision"].as_i64() < entry["revision"].as_i64(),
        "{entry}"
    );
    let (status, e, _) = api
        .write_at(
            "PUT",
            "/v1/namespaces/cc",
            Some(json!({})),
            entry["revision"].as_i64(),
        )
        .await;
    assert_eq!(status, 200, "the list's revision as If-Match: {e}");

    // Review: a weak tag never matches a write (strong comparison, RFC
    // 9110): 412, not a 400; empty list elements are skipped.
    let (_, ns, _) = api
        .call_with(Some(READER), "GET", "/v1/namespaces/cc", None, &[])
        .await;
    let weak = format!("W/\"{}\"", ns["revision"]);
    let (status, e, _) = put_cc_if_match(api, &weak).await;
    assert_eq!(status, 412, "{e}");
    let spaced = format!(" , \"{}\" ,", ns["revision"]);
    let (status, e, _) = put_cc_if_match(api, &spaced).await;
    assert_eq!(status, 200, "{e}");

    // A malformed precondition is a 400 naming the header.
    for bad in ["12", "W/12", "\"abc\""] {
        let (status, e, _) = put_cc_if_match(api, bad).await;
        assert_eq!(
            (status, e["error"]["reason"].as_str()),
            (400, Some("malformed_request")),
            "{e}"
        );
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("If-Match: "),
            "{e}"
        );
    }
}

/// `PUT /v1/namespaces/cc` by the admin with `If-Match: if_match`.
async fn put_cc_if_match(api: &ConfigApi, if_match: &str) -> (u16, Value, Option<String>) {
    api.call_with(
        Some(ADMIN),
        "PUT",
        "/v1/namespaces/cc",
        Some("{}"),
        &[("if-match", if_match)],
    )
    .await
}

/// `psql` on `url` with `sql` (one row, one column, unaligned): its
/// answer.
fn psql(url: &str, sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .args([url, "-qAtX", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("psql runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Review: the race test let two writers run as they came, so it passed
/// whether or not they ever overlapped. Here they are made to: a session
/// of our own holds `tg_meta` (whose revision every write bumps first)
/// locked while two writers under the same `If-Match` start, until the
/// database shows both waiting for it; then it lets go. A precondition
/// checked before the write's transaction (or before the bump) would let
/// both through, a lost update; checked after the bump, exactly one wins
/// and the other is refused with 412. Several rounds.
async fn writers_held_together_then_released(api: &std::sync::Arc<ConfigApi>, url: &str) {
    use std::io::{BufRead, Write};
    const R: &str = "/v1/namespaces/race/resources/r";
    api.ok("PUT", "/v1/namespaces/race", None).await;
    let waiting = "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                   WHERE c.relname = 'tg_meta' AND NOT l.granted";
    for round in 0..3 {
        let body = json!({"algorithm": "token_bucket", "capacity": 1, "rate": "1/s"});
        let at = api.ok("PUT", R, Some(body)).await["revision"]
            .as_i64()
            .unwrap();
        let mut holder = std::process::Command::new("psql")
            .args([url, "-qAtX", "-v", "ON_ERROR_STOP=1"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("psql runs");
        let mut stdin = holder.stdin.take().unwrap();
        writeln!(
            stdin,
            "BEGIN; LOCK TABLE tg_meta IN EXCLUSIVE MODE; SELECT 'locked';"
        )
        .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "locked");
        let writers: Vec<_> = [2, 3]
            .into_iter()
            .map(|capacity| {
                let api = std::sync::Arc::clone(api);
                tokio::spawn(async move {
                    let body =
                        json!({"algorithm": "token_bucket", "capacity": capacity, "rate": "1/s"});
                    let (status, v, _) = api.write_at("PUT", R, Some(body), Some(at)).await;
                    (status, v)
                })
            })
            .collect();
        let mut both_waiting = false;
        for _ in 0..600 {
            if psql(url, waiting) == "2" {
                both_waiting = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        writeln!(stdin, "COMMIT;").unwrap();
        drop(stdin);
        holder.wait().unwrap();
        assert!(
            both_waiting,
            "round {round}: the two writers never waited together"
        );
        let mut statuses = Vec::new();
        for w in writers {
            let (status, v) = w.await.unwrap();
            if status == 412 {
                assert_eq!(v["error"]["reason"], "precondition_failed", "{v}");
            }
            statuses.push(status);
        }
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 412], "round {round}: exactly one wins");
    }
}

/// Resource `imp/a`, asserting its domain `big` overrides the capacity
/// (50) and nothing else.
async fn big_kept_its_override(api: &ConfigApi) -> Value {
    let a = api.get("/v1/namespaces/imp/resources/a").await;
    assert_eq!(
        a["resource"]["domains"]["big"],
        json!({"capacity": 50}),
        "{a}"
    );
    a
}

/// Issue 22: the API stored a domain override with every inherited field
/// written out, so raising the resource's rate left the override at the
/// old one. An override stores what it changes; the resolved view (what
/// servers get in deltas) follows the resource.
async fn inheritance(api: &ConfigApi) {
    const R: &str = "/v1/namespaces/inh/resources/api";
    api.ok("PUT", "/v1/namespaces/inh", None).await;
    api.ok(
        "PUT",
        R,
        Some(json!({"algorithm": "token_bucket", "capacity": 100, "rate": "10/s"})),
    )
    .await;
    let r = api
        .ok(
            "PUT",
            &format!("{R}/domains/bigcorp"),
            Some(json!({"capacity": 1000})),
        )
        .await;
    assert_eq!(
        r["resource"]["domains"]["bigcorp"],
        json!({"capacity": 1000}),
        "{r}"
    );
    assert_eq!(r["resolved"]["domains"]["bigcorp"]["rate"], "10/1s", "{r}");
    let over = api.get(&format!("{R}/domains/bigcorp")).await;
    assert_eq!(over["override"], json!({"capacity": 1000}));
    assert_eq!(
        over["resolved"],
        json!({"algorithm": "token_bucket", "capacity": 1000, "rate": "10/1s"})
    );
    let (status, _) = api
        .call(Some(READER), "GET", &format!("{R}/domains/nobody"), None)
        .await;
    assert_eq!(status, 404);

    // The resource's rate raised with the body a GET answered (the
    // override as stored): the override follows it.
    let mut body = api.get(R).await["resource"].clone();
    body["rate"] = json!("20/s");
    let r = api.ok("PUT", R, Some(body)).await;
    assert_eq!(r["resolved"]["domains"]["bigcorp"]["rate"], "20/1s", "{r}");
    assert_eq!(r["resolved"]["domains"]["bigcorp"]["capacity"], 1000);
    let got = api.get(R).await;
    assert_eq!(
        got["resource"]["domains"]["bigcorp"],
        json!({"capacity": 1000})
    );
    assert_eq!(got["resolved"]["domains"]["bigcorp"]["rate"], "20/1s");
    // Servers get the resolved view.
    let since = r["revision"].as_i64().unwrap() - 1;
    let d = api.get(&format!("/v1/config?since={since}")).await;
    assert_eq!(d["resources"][0]["body"], got["resolved"], "{d}");

    // An override that names its algorithm replaces: whole, inheriting
    // nothing, in both views.
    let r = api
        .ok(
            "PUT",
            &format!("{R}/domains/other"),
            Some(json!({"algorithm": "gcra", "rate": "5/s"})),
        )
        .await;
    assert_eq!(
        r["resource"]["domains"]["other"],
        r["resolved"]["domains"]["other"]
    );
    assert_eq!(r["resolved"]["domains"]["other"]["algorithm"], "gcra");

    // An import keeps what each override of the file says.
    let text = "namespaces:\n  - name: imp\n    resources:\n      - name: a\n        \
                algorithm: token_bucket\n        capacity: 10\n        rate: 1/s\n        \
                domains:\n          big: { capacity: 50 }\n";
    // The file alone, then (review M2) as the later document of a
    // multi-document file: the override is imported either way.
    let multi = "namespaces:\n  - name: first\n    resources: []\n---\n".to_owned() + text;
    for import in [text, multi.as_str()] {
        let (status, r) = api
            .call(Some(ADMIN), "POST", "/v1/import", Some(import))
            .await;
        assert_eq!(status, 200, "{r}");
        let a = big_kept_its_override(api).await;
        assert_eq!(a["resolved"]["domains"]["big"]["rate"], "1/1s", "{a}");
    }

    // Review M3: a backup and its restore (export, then import under the
    // export's ETag) keep the override inheriting: the resource's rate
    // raised afterwards reaches it. The export wrote the resolved view,
    // which froze it.
    let (status, yaml, tag) = api
        .call_with(Some(READER), "GET", "/v1/export", None, &[])
        .await;
    assert_eq!(status, 200);
    let yaml = yaml.as_str().unwrap().to_owned();
    assert!(!yaml.contains("big:\n          algorithm"), "{yaml}");
    let tag = tag.unwrap();
    let (status, r, _) = api
        .call_with(
            Some(ADMIN),
            "POST",
            "/v1/import",
            Some(&yaml),
            &[("if-match", &tag)],
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let a = big_kept_its_override(api).await;
    let mut body = a["resource"].clone();
    body["rate"] = json!("2/s");
    let r = api
        .ok("PUT", "/v1/namespaces/imp/resources/a", Some(body))
        .await;
    assert_eq!(r["resolved"]["domains"]["big"]["rate"], "2/1s", "{r}");
    assert_eq!(r["resolved"]["domains"]["big"]["capacity"], 50, "{r}");

    // An import under an ETag older than the config: 412, nothing
    // replaced.
    let (status, r, _) = api
        .call_with(
            Some(ADMIN),
            "POST",
            "/v1/import",
            Some(text),
            &[("if-match", &tag)],
        )
        .await;
    assert_eq!(status, 412, "{r}");
    assert_eq!(r["error"]["reason"], "precondition_failed", "{r}");
    let a = api.get("/v1/namespaces/imp/resources/a").await;
    assert_eq!(
        a["resolved"]["rate"], "2/1s",
        "the import was not applied: {a}"
    );
}

/// Issue 22: the page made one request per namespace (113 for 112) and
/// tripped the API's own rate limit. `GET /v1/snapshot` answers the whole
/// config in one request, in bounded parts that join into the whole; the
/// audit trail answers one resource's history, newest first.
async fn snapshot_and_history(api: &ConfigApi) {
    // Three namespaces: `sa` with three resources, `sb` with none, `sc`
    // with two (names sort the same in every collation).
    for ns in ["sa", "sb", "sc"] {
        api.ok("PUT", &format!("/v1/namespaces/{ns}"), None).await;
    }
    for (ns, r) in [
        ("sa", "r1"),
        ("sa", "r2"),
        ("sa", "r3"),
        ("sc", "r1"),
        ("sc", "r2"),
    ] {
        api.ok(
            "PUT",
            &format!("/v1/namespaces/{ns}/resources/{r}"),
            Some(json!({"algorithm": "gcra", "rate": "1/s", "burst": 1})),
        )
        .await;
    }
    let (status, whole, tag) = api
        .call_with(Some(READER), "GET", "/v1/snapshot", None, &[])
        .await;
    assert_eq!(status, 200, "{whole}");
    let revision = api.get("/v1/namespaces").await["revision"].clone();
    assert_eq!(whole["revision"], revision);
    assert_eq!(tag, Some(format!("\"{revision}\"")));
    assert_eq!(whole["next"], Value::Null);
    let ours = |snap: &Value| -> Vec<(String, Vec<String>)> {
        snap["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["name"].as_str().unwrap().starts_with('s'))
            .map(|n| {
                let names = n["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["resource"]["name"].as_str().unwrap().to_owned())
                    .collect();
                (n["name"].as_str().unwrap().to_owned(), names)
            })
            .collect()
    };
    let expected = vec![
        (
            "sa".to_owned(),
            vec!["r1".to_owned(), "r2".to_owned(), "r3".to_owned()],
        ),
        ("sb".to_owned(), vec![]),
        ("sc".to_owned(), vec!["r1".to_owned(), "r2".to_owned()]),
    ];
    assert_eq!(ours(&whole), expected);
    let sa = &whole["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "sa")
        .unwrap();
    let r1 = api.get("/v1/namespaces/sa/resources/r1").await;
    assert_eq!(sa["resources"][0], r1, "each resource as GET answers it");
    assert!(
        sa["revision"].is_i64()
            && sa["flags_revision"].is_i64()
            && sa["ignore_configured"] == false,
        "{sa}"
    );

    // Parts of two: each bounded, joined they are the whole.
    let mut joined: Vec<(String, Vec<String>)> = Vec::new();
    let mut after: Option<String> = None;
    let mut parts = 0;
    loop {
        let path = match &after {
            Some(a) => format!("/v1/snapshot?limit=2&after={a}"),
            None => "/v1/snapshot?limit=2".to_owned(),
        };
        let part = api.get(&path).await;
        let list = part["namespaces"].as_array().unwrap();
        assert!(list.len() <= 2, "{part}");
        let count: usize = list
            .iter()
            .map(|n| n["resources"].as_array().unwrap().len())
            .sum();
        assert!(count <= 2, "{part}");
        for (ns, names) in ours(&part) {
            match joined.last_mut() {
                Some((last, have)) if *last == ns => have.extend(names),
                _ => joined.push((ns, names)),
            }
        }
        parts += 1;
        assert!(parts < 50, "the parts never end");
        match part["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(joined, expected);
    assert!(parts >= 3, "{parts}");
    for bad in [
        "/v1/snapshot?limit=0",
        "/v1/snapshot?after=a/b/c",
        "/v1/snapshot?after=%20",
        "/v1/snapshot?al=1",
    ] {
        let (status, e) = api.call(Some(READER), "GET", bad, None).await;
        assert_eq!(
            (status, e["error"]["reason"].as_str()),
            (400, Some("malformed_request")),
            "{bad}: {e}"
        );
    }

    // One resource's history: its own changes and its overrides', not
    // its neighbours' (`sa/r1` is not `sa/r10`).
    api.ok(
        "PUT",
        "/v1/namespaces/sa/resources/r10",
        Some(json!({"algorithm": "unlimited"})),
    )
    .await;
    api.ok(
        "PUT",
        "/v1/namespaces/sa/resources/r1/domains/acme",
        Some(json!({"burst": 3})),
    )
    .await;
    let h = api.get("/v1/audit?target=sa/r1&order=newest").await;
    let entries = h["entries"].as_array().unwrap();
    let seen: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["target"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seen,
        [
            ("put_domain", "sa/r1/domains/acme"),
            ("put_resource", "sa/r1")
        ]
    );
    assert_eq!(entries[0]["before"]["burst"], 1);
    assert_eq!(entries[0]["after"]["domains"]["acme"], json!({"burst": 3}));
    let (status, e) = api
        .call(Some(READER), "GET", "/v1/audit?order=sideways", None)
        .await;
    assert_eq!(status, 400, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writes_under_if_match_never_lose_an_update() {
    let dir = Sandbox::new("config-api-if-match");
    let api = std::sync::Arc::new(ConfigApi::start_sqlite(&dir, &[]));
    preconditions(&api).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_overrides_store_what_they_change_and_inherit_the_rest() {
    let dir = Sandbox::new("config-api-inherit");
    let api = ConfigApi::start_sqlite(&dir, &[]);
    inheritance(&api).await;
}

/// Review of issue 22 (HIGH): the YAML emitter quoted only lowercase
/// `null`/`true`, so a resource named `NULL` was stored as `"name": null`
/// (halting every server that followed) and an override `TRUE` was
/// renamed `true`. Names that read as booleans, nulls or numbers stay
/// strings, in the write's answer, a read and the export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_read_as_null_booleans_or_numbers_stay_strings() {
    let dir = Sandbox::new("config-api-yaml-words");
    let api = ConfigApi::start_sqlite(&dir, &[]);
    api.ok("PUT", "/v1/namespaces/True", None).await;
    const R: &str = "/v1/namespaces/True/resources/NULL";
    let r = api
        .ok(
            "PUT",
            R,
            Some(json!({"algorithm": "token_bucket", "capacity": 10, "rate": "1/s"})),
        )
        .await;
    assert_eq!(r["resource"]["name"], "NULL", "{r}");
    let r = api
        .ok(
            "PUT",
            &format!("{R}/domains/TRUE"),
            Some(json!({"capacity": 5})),
        )
        .await;
    assert_eq!(
        r["resource"]["domains"]["TRUE"],
        json!({"capacity": 5}),
        "{r}"
    );
    assert_eq!(r["resolved"]["domains"]["TRUE"]["capacity"], 5, "{r}");
    let got = api.get(R).await;
    assert_eq!(got["resource"]["name"], "NULL", "{got}");
    assert_eq!(got["resource"]["domains"]["TRUE"], json!({"capacity": 5}));
    let over = api.get(&format!("{R}/domains/TRUE")).await;
    assert_eq!(over["override"], json!({"capacity": 5}), "{over}");
    // What a following server reads, and the export imported again.
    let all = api.get("/v1/config?since=0").await.to_string();
    assert!(all.contains("\"name\":\"NULL\""), "{all}");
    assert!(!all.contains("\"name\":null"), "{all}");
    let (status, export) = api.call(Some(READER), "GET", "/v1/export", None).await;
    assert_eq!(status, 200);
    let yaml = export.as_str().unwrap();
    assert!(yaml.contains("name: \"NULL\""), "{yaml}");
    assert!(yaml.contains("\"TRUE\":"), "{yaml}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_the_whole_config_in_one_bounded_request_and_a_resources_history() {
    let dir = Sandbox::new("config-api-snapshot");
    let api = ConfigApi::start_sqlite(&dir, &[]);
    snapshot_and_history(&api).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_answers_with_the_change_that_ends_it() {
    let dir = Sandbox::new("config-api-wait");
    let api = std::sync::Arc::new(ConfigApi::start_sqlite(&dir, &[]));
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

/// Second review of issue 22 (LOW): the `Bearer` scheme was matched in
/// that case only; RFC 9110 §11.1 makes it case-insensitive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_taken_in_any_case() {
    let dir = Sandbox::new("config-api-bearer-case");
    let api = ConfigApi::start_sqlite(&dir, &[]);
    let client = reqwest::Client::new();
    for (scheme, want) in [
        ("bearer", 200),
        ("BEARER", 200),
        ("Bearer", 200),
        ("Basic", 401),
    ] {
        let resp = client
            .get(api.url("/v1/whoami"))
            .header("authorization", format!("{scheme} {READER}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), want, "{scheme}");
    }
}

/// Second review of issue 22 (MEDIUM-A): `GET /v1/export` read the
/// revision, then each namespace apart, outside a transaction: a backup
/// torn between writes, its ETag older than what it held. Under a writer
/// creating resources one by one, each export holds exactly the resources
/// created at or before its ETag's revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_is_one_snapshot_and_its_etag_is_its_revision() {
    let dir = Sandbox::new("config-api-export-snapshot");
    let api = std::sync::Arc::new(ConfigApi::start_sqlite(
        &dir,
        &["--rate-limit", "100000", "--burst", "100000"],
    ));
    api.ok("PUT", "/v1/namespaces/snap", None).await;
    let writer = {
        let api = api.clone();
        tokio::spawn(async move {
            let mut created = Vec::new();
            for i in 0..40 {
                let r = api
                    .ok(
                        "PUT",
                        &format!("/v1/namespaces/snap/resources/r{i:03}"),
                        Some(json!({"algorithm": "token_bucket", "capacity": 10, "rate": "1/s"})),
                    )
                    .await;
                created.push((format!("r{i:03}"), r["revision"].as_i64().unwrap()));
            }
            created
        })
    };
    let mut exports = Vec::new();
    while !writer.is_finished() || exports.is_empty() {
        let (status, body, etag) = api
            .call_with(Some(READER), "GET", "/v1/export", None, &[])
            .await;
        assert_eq!(status, 200, "{body}");
        let etag = etag.unwrap();
        let revision: i64 = etag.trim_matches('"').parse().unwrap();
        exports.push((revision, body.as_str().unwrap().to_owned()));
    }
    let created = writer.await.unwrap();
    for (revision, yaml) in &exports {
        for (name, at) in &created {
            assert_eq!(
                yaml.contains(&format!("name: {name}\n")),
                at <= revision,
                "export with ETag {revision}: {name} (created at {at})\n{yaml}"
            );
        }
    }
}

/// Review of issue 22: a domain override's key in a resource body was not
/// bounded (only `/domains/{d}` in the path was), and YAML refuses a key
/// over 1024 characters: a PUT with an 1100-byte key was taken, and the
/// export could no longer be imported. Keys over 200 bytes, the bound on
/// names in paths, are refused; one of 200 bytes goes through an export
/// and an import again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_override_key_is_bounded_so_the_export_imports_again() {
    let dir = Sandbox::new("config-api-long-override-key");
    let api = ConfigApi::start_sqlite(&dir, &[]);
    api.ok("PUT", "/v1/namespaces/shop", Some(json!({}))).await;
    let body = |key: &str| {
        let mut domains = serde_json::Map::new();
        domains.insert(key.to_owned(), json!({"capacity": 5}));
        json!({"algorithm": "token_bucket", "capacity": 10, "rate": "1/s", "domains": domains})
    };
    for len in [201, 1100] {
        let (status, v) = api
            .admin(
                "PUT",
                "/v1/namespaces/shop/resources/api",
                Some(body(&"d".repeat(len))),
            )
            .await;
        assert_eq!(status, 422, "{v}");
        assert_eq!(v["error"]["reason"], "invalid_config", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("is {len} bytes long"))
                && message.contains("at most 200 bytes"),
            "{message}"
        );
    }
    let key = "d".repeat(200);
    api.ok("PUT", "/v1/namespaces/shop/resources/api", Some(body(&key)))
        .await;
    let (status, yaml, etag) = api
        .call_with(Some(READER), "GET", "/v1/export", None, &[])
        .await;
    assert_eq!(status, 200, "{yaml}");
    let etag = etag.unwrap();
    let (status, v, _) = api
        .call_with(
            Some(ADMIN),
            "POST",
            "/v1/import",
            Some(yaml.as_str().unwrap()),
            &[("if-match", etag.as_str())],
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let r = api.get("/v1/namespaces/shop/resources/api").await;
    assert_eq!(r["resource"]["domains"][&key]["capacity"], 5, "{r}");
}

/// Second review of issue 22 (MEDIUM-C): the servers' bearer token went
/// in clear to any plain `http://` server. Beyond loopback that is
/// refused at start unless asked for; loopback and https are taken.
#[test]
fn the_servers_token_is_not_sent_in_clear_beyond_loopback() {
    let dir = Sandbox::new("config-api-servers-token-http");
    let tokens = dir.write("tokens", format!("admin:a:{ADMIN}\n"));
    let token = dir.write("servers-token", "a-servers-read-token-1234\n");
    let run = |servers: &str, extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["config-api", "--listen", "127.0.0.1:0", "--database"])
            .arg(format!("sqlite://{}", dir.path("t.db").display()))
            .arg("--tokens-file")
            .arg(&tokens)
            .args(["--servers", servers, "--servers-token-file"])
            .arg(&token)
            // Past the check, the start is stopped by the next one (a
            // refresh out of range), so no run keeps serving.
            .args(["--servers-refresh-ms", "1"])
            .args(extra)
            .current_dir(&dir.dir)
            .output()
            .unwrap()
    };
    let out = run("127.0.0.1:9,10.0.0.12:8080", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "--servers 10.0.0.12:8080: plain http:// beyond loopback would send \
             --servers-token-file's token in clear"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("--servers-token-over-http"), "{stderr}");
    assert!(!stderr.contains("a-servers-read-token"), "{stderr}");
    // Second review of issue 18: an entry with a password was refused
    // with the password in the message.
    let out = run("http://ops:hunter2-secret@10.0.0.12:8080", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("user or password is not taken"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
    for (servers, extra) in [
        ("127.0.0.1:9,localhost:9,[::1]:9", &[][..]),
        ("https://10.0.0.12:8080", &[][..]),
        ("10.0.0.12:8080", &["--servers-token-over-http"][..]),
    ] {
        let out = run(servers, extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("in clear"), "{servers}: {stderr}");
        assert!(
            stderr.contains("--servers-refresh-ms 1: give 100 to 3600000 ms"),
            "{servers}: {stderr}"
        );
    }
}

/// `tollgate config-api` on a free port with `database`, in the sandbox.
fn config_api_on(dir: &Sandbox, database: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.args([
        "config-api",
        "--listen",
        "127.0.0.1:0",
        "--database",
        database,
    ])
    .current_dir(&dir.dir);
    cmd
}

#[test]
fn it_refuses_to_start_without_tokens_or_with_a_bad_database() {
    let dir = Sandbox::new("config-api-refuse");
    let out = config_api_on(&dir, "sqlite://x.db")
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
        let out = config_api_on(&dir, database)
            .arg("--tokens-file")
            .arg(&tokens)
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
        // Every scenario on one API: more requests than its default
        // bucket holds.
        &[
            "--database-password-file",
            password_file.to_str().unwrap(),
            "--rate-limit",
            "100000",
            "--burst",
            "100000",
        ],
    ));
    crud(&api, &dir).await;
    concurrent(&api).await;
    preconditions(&api).await;
    writers_held_together_then_released(&api, &url).await;
    inheritance(&api).await;
    snapshot_and_history(&api).await;
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
    let what = format!("the server runs revision {revision}");
    tollgate_testing::eventually(&what, Duration::from_secs(60), || {
        let (_, status) = server.json("GET", "/status", None);
        if status["config"]["api_revision"] == revision {
            Ok(status)
        } else {
            Err(status.to_string())
        }
    })
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
    let api = ConfigApi::start_sqlite(&dir, &[]);
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
    let mut args = vec!["--config", file.to_str().unwrap()];
    args.extend(follow_args(&url, &token));
    let server = common::serving::Serving::start(&dir, &args, &[]);
    let status = until_revision(&server, first);
    // Issue 23: both sources are named (the source was the file alone).
    assert_eq!(
        status["config"]["source"],
        format!("{} + config API {url}", file.display()),
        "{status}"
    );
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
    let (cert, key, ca) = dir.write_server_tls(&certs, "api");
    let api = ConfigApi::start_trusting(
        &dir,
        &common::config_api::sqlite(&dir, "t.db"),
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
    let mut args = follow_args(&url, &token);
    args.extend(["--config-api-ca", ca.to_str().unwrap()]);
    let server = common::serving::Serving::start(&dir, &args, &[]);
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

/// A server following `api` over plain HTTP, its read token in the
/// sandbox's `read-token`: the server, the API's URL and the token file.
fn follow(
    dir: &Sandbox,
    api: &ConfigApi,
) -> (common::serving::Serving, String, std::path::PathBuf) {
    let token = dir.write("read-token", format!("{READER}\n"));
    let url = format!("http://{}", api.addr);
    let server = common::serving::Serving::start(dir, &follow_args(&url, &token), &[]);
    (server, url, token)
}

/// The arguments of `tollgate serve` following the API at `url` with the
/// token in `token`, on free ports.
fn follow_args<'a>(url: &'a str, token: &'a std::path::Path) -> Vec<&'a str> {
    let mut args = vec![
        "--config-api",
        url,
        "--config-api-token-file",
        token.to_str().unwrap(),
    ];
    args.extend(FREE_PORTS);
    args
}

/// Polls the server's log until a line with `message` appears (a minute
/// at most: the follower backs off up to 5 s between tries).
fn until_logged(server: &common::serving::Serving, message: &str) -> Value {
    let what = format!("the server logs {message:?}");
    tollgate_testing::eventually(&what, Duration::from_secs(60), || {
        server
            .logged(message)
            .into_iter()
            .next()
            .ok_or_else(|| format!("{:?}", server.logs.lock().unwrap()))
    })
}

/// Regression (issue 23): a wrong token was retried for
/// `--config-api-startup-ms` (30 s), then reported as "the config API did
/// not answer at startup". A 401 is an answer: `serve` stops at once,
/// naming where the token came from and what token it needs. The startup
/// window here is 10 minutes, so the old code would still be retrying
/// when the bound of the run kills it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_stops_serve_at_once_naming_the_token_it_needs() {
    let dir = Sandbox::new("config-api-refused");
    let api = ConfigApi::start_sqlite(&dir, &[]);
    let url = format!("http://{}", api.addr);
    let wrong = dir.write("wrong-token", "not-a-token-of-this-api\n");
    // A whole line of the tokens file instead of its TOKEN part.
    let line = dir.write("line-token", format!("read:fleet:{READER}\n"));
    for (file, whole_line) in [(&wrong, false), (&line, true)] {
        let mut args = vec!["serve"];
        args.extend(follow_args(&url, file));
        args.extend(["--config-api-startup-ms", "600000"]);
        let run = dir.run_within(&args, Duration::from_secs(60));
        assert_eq!(run.code, Some(1), "{run}");
        let expected = format!(
            "error: the config API at {url} refused the token in --config-api-token-file {} \
             (401 Unauthorized: the bearer token is not known); it must hold a `read` token of \
             the config API alone (the TOKEN of a `read:NAME:TOKEN` line of the API's tokens file)",
            file.display()
        );
        assert!(run.stderr.contains(&expected), "{run}");
        assert_eq!(
            run.stderr
                .contains("it holds a whole `ROLE:NAME:TOKEN` line: keep only the TOKEN part"),
            whole_line,
            "{run}"
        );
        assert!(!run.stderr.contains("did not answer"), "{run}");
        // Review of issue 23: the token itself is never shown.
        assert!(!run.stderr.contains(READER), "{run}");
        assert!(!run.stderr.contains("not-a-token-of-this-api"), "{run}");
    }

    // The same from the environment names the variable.
    let run = common::run_clean(
        &dir.dir,
        &[
            &[
                "serve",
                "--config-api",
                &url,
                "--config-api-startup-ms",
                "600000",
            ][..],
            &FREE_PORTS,
        ]
        .concat(),
        &[("TOLLGATE_CONFIG_API_TOKEN", "not-a-token-of-this-api")],
    );
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.stderr.contains(&format!(
            "error: the config API at {url} refused the token in TOLLGATE_CONFIG_API_TOKEN (401"
        )),
        "{run}"
    );

    // An empty token file is refused before anything is contacted.
    let empty = dir.write("empty-token", "\n");
    let mut args = vec!["serve", "--check"];
    args.extend(follow_args(&url, &empty));
    let run = dir.run(&args);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.stderr.contains(&format!(
            "error: --config-api-token-file {} is empty: it must hold a `read` token of the config API alone",
            empty.display()
        )),
        "{run}"
    );
}

/// Issue 23: a token the API refuses while the server follows it (the
/// API came back without it) is logged as a refusal naming the token
/// file, not as "unreachable"; the config in force keeps serving, and a
/// fixed token file is read again without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_refused_while_following_is_logged_and_the_config_keeps_serving() {
    let dir = Sandbox::new("config-api-revoked");
    let db = common::config_api::sqlite(&dir, "t.db");
    let api = ConfigApi::start(&dir, &db, &[]);
    api.ok("PUT", "/v1/namespaces/shop", None).await;
    let first = api
        .ok(
            "PUT",
            "/v1/namespaces/shop/resources/api",
            Some(json!({"algorithm": "token_bucket", "capacity": 100, "rate": "1/s"})),
        )
        .await["revision"]
        .as_i64()
        .unwrap();
    let (server, url, token) = follow(&dir, &api);
    until_revision(&server, first);
    // Another with the token in the variable, which cannot change.
    let mut args = vec!["--config-api", url.as_str()];
    args.extend(FREE_PORTS);
    let from_env =
        common::serving::Serving::start(&dir, &args, &[("TOLLGATE_CONFIG_API_TOKEN", READER)]);
    until_revision(&from_env, first);

    // The API comes back on the same address and database, without this
    // server's token.
    let addr = api.addr.to_string();
    drop(api);
    let other = "read-token-of-another-fleet-0123";
    let api = ConfigApi::start_with_tokens(
        &dir,
        &db,
        &["--listen", &addr],
        None,
        &format!("admin:alice:{ADMIN}\nread:other:{other}\n"),
    );
    let refused = until_logged(
        &server,
        "the config API refused this server's token; keeping the config in force, and reading \
         the token file again before each retry",
    );
    assert_eq!(refused["level"], "ERROR", "{refused}");
    let error = refused["fields"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!(
            "refused the token in --config-api-token-file {} (401 Unauthorized",
            token.display()
        )),
        "{refused}"
    );
    assert_eq!(refused["fields"]["api_revision"], first, "{refused}");
    // Review of issue 23: the server with the variable was promised a
    // read of the token before each retry, which cannot change it.
    let refused = until_logged(
        &from_env,
        "the config API refused this server's token; keeping the config in force and retrying \
         (TOLLGATE_CONFIG_API_TOKEN is read at start only: a new token needs a restart)",
    );
    let error = refused["fields"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("refused the token in TOLLGATE_CONFIG_API_TOKEN (401 Unauthorized"),
        "{refused}"
    );
    // The config in force keeps serving.
    assert!(hit(&server, "shop", "api"));
    let (_, status) = server.json("GET", "/status", None);
    assert_eq!(status["config"]["api_revision"], first, "{status}");

    // The token file fixed: the next retry reads it and follows again.
    dir.write("read-token", format!("{other}\n"));
    let r = api
        .ok(
            "PUT",
            "/v1/namespaces/shop/resources/search",
            Some(json!({"algorithm": "unlimited"})),
        )
        .await;
    until_revision(&server, r["revision"].as_i64().unwrap());
    let new_token = until_logged(&server, "read a new config API token");
    assert_eq!(
        new_token["fields"]["token_source"],
        format!("--config-api-token-file {}", token.display()),
        "{new_token}"
    );
    // Review of issue 23: the end of a refusal was logged as "config API
    // reachable again"; it says the token was accepted.
    until_logged(&server, "the config API accepted this server's token again");
    assert!(server.logged("config API reachable again").is_empty());
    assert!(hit(&server, "shop", "search"));
    // Review of issue 23: neither token is ever logged.
    let env_logs = from_env.logs.lock().unwrap().clone();
    for line in server.logs.lock().unwrap().iter().chain(&env_logs) {
        let text = line.to_string();
        assert!(!text.contains(READER) && !text.contains(other), "{text}");
    }
}

/// A stand-in for a proxy before the config API that answers every
/// request 401 with the request itself (its `Authorization` header
/// among it) and 5000 more bytes: as a JSON error's message when `json`,
/// else as plain text.
fn echoing_proxy(json: bool) -> std::net::SocketAddr {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = String::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head += &line;
            }
            let echo = format!("{head}{}", "x".repeat(5000));
            let (kind, body) = if json {
                let v = json!({"error": {"reason": "unauthorized", "message": echo}});
                ("application/json", v.to_string())
            } else {
                ("text/plain", echo)
            };
            let _ = write!(
                stream,
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// Review of issue 23: a refusal's text went into the error as sent (up
/// to 200 characters of a plain body, a JSON message whole), so a proxy
/// that echoes the request put `Bearer TOKEN` on standard error and in
/// the log. The token is replaced, and the text is bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_that_echoes_the_token_does_not_show_it() {
    let dir = Sandbox::new("config-api-echo");
    let secret = "echoed-secret-token-0123456789";
    let token = dir.write("read-token", format!("{secret}\n"));
    for json in [false, true] {
        let url = format!("http://{}", echoing_proxy(json));
        let mut args = vec!["serve"];
        args.extend(follow_args(&url, &token));
        let run = dir.run_within(&args, Duration::from_secs(60));
        assert_eq!(run.code, Some(1), "{run}");
        assert!(!run.stderr.contains(secret), "json: {json}{run}");
        let error = run
            .stderr
            .lines()
            .find(|l| l.starts_with("error: "))
            .unwrap_or_else(|| panic!("no error line{run}"));
        assert!(
            error.starts_with(&format!("error: the config API at {url} refused the token")),
            "{run}"
        );
        assert!(error.contains("authorization: Bearer <token>"), "{run}");
        assert!(error.contains("bytes cut]"), "{run}");
        assert!(error.len() < 1500, "{} bytes{run}", error.len());
    }
}

/// Regression (issue 23): a server following the API alone logged
/// `config=bundled example`, its `/status` said `"source": null` and
/// `tollgate status` "from the built-in default", though the bundled
/// example was not in force (its namespace `default` was unknown). Each
/// now names the config API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_following_the_api_alone_says_its_config_comes_from_the_api() {
    let dir = Sandbox::new("config-api-source");
    let api = ConfigApi::start_sqlite(&dir, &[]);
    api.ok("PUT", "/v1/namespaces/shop", None).await;
    let revision = api
        .ok(
            "PUT",
            "/v1/namespaces/shop/resources/api",
            Some(json!({"algorithm": "unlimited"})),
        )
        .await["revision"]
        .as_i64()
        .unwrap();
    let (server, url, token) = follow(&dir, &api);

    let listening = until_logged(&server, "tollgate listening");
    assert_eq!(
        listening["fields"]["config"],
        format!("config API {url} at revision {revision}"),
        "{listening}"
    );
    let status = until_revision(&server, revision);
    assert_eq!(
        status["config"]["source"],
        format!("config API {url}"),
        "{status}"
    );

    let run = dir.run(&["status", "--server", &server.grpc.to_string()]);
    assert!(
        run.stdout
            .contains(&format!("config     revision 1 from config API {url}\n")),
        "{run}"
    );
    assert!(
        run.stdout
            .contains(&format!("config API revision {revision}\n")),
        "{run}"
    );
    assert!(!run.stdout.contains("built-in"), "{run}");

    // `serve --check` does not claim the bundled example either.
    let mut args = vec!["serve", "--check"];
    args.extend(follow_args(&url, &token));
    let run = dir.run(&args);
    assert!(run.stdout.contains(" config=none namespaces=0 "), "{run}");
}

/// Regression (issue 23): an unknown path was answered 404 and a wrong
/// method 405, each with an empty body (later with "not found" and
/// "method not allowed", which name nothing), and `?since=abc` with
/// serde's "Failed to deserialize query string". Every refusal is the
/// API's error shape, and its message names the problem: the path and
/// the endpoints there are, the method and the ones the path takes (also
/// in `Allow`), the query parameter and what it takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_names_the_problem_in_the_error_shape() {
    let dir = Sandbox::new("config-api-refusals");
    let api = ConfigApi::start_sqlite(&dir, &[]);
    // Method, path, status, reason, a part of the message, `Allow`.
    type Case = (
        &'static str,
        &'static str,
        u16,
        &'static str,
        &'static str,
        Option<&'static str>,
    );
    let cases: &[Case] = &[
        (
            "GET",
            "/v1/nothing-here",
            404,
            "not_found",
            "no endpoint at /v1/nothing-here; the config API serves /v1/namespaces",
            None,
        ),
        (
            "GET",
            "/nothing",
            404,
            "not_found",
            "no endpoint at /nothing; the config API serves",
            None,
        ),
        (
            "POST",
            "/v1/namespaces",
            405,
            "method_not_allowed",
            "/v1/namespaces does not take POST; it takes GET, HEAD",
            Some("GET,HEAD"),
        ),
        (
            "PATCH",
            "/v1/import",
            405,
            "method_not_allowed",
            "/v1/import does not take PATCH; it takes POST",
            Some("POST"),
        ),
        (
            "DELETE",
            "/healthz",
            405,
            "method_not_allowed",
            "/healthz does not take DELETE; it takes GET, HEAD",
            Some("GET,HEAD"),
        ),
        (
            "POST",
            "/metrics",
            405,
            "method_not_allowed",
            "/metrics does not take POST; it takes GET, HEAD",
            Some("GET,HEAD"),
        ),
        (
            "GET",
            "/v1/config?since=abc",
            400,
            "malformed_request",
            "query parameter `since` of GET /v1/config must be a revision: a whole number from 0 \
             (0: everything), not \"abc\"",
            None,
        ),
        (
            "GET",
            "/v1/config?sinc=3",
            400,
            "malformed_request",
            "unknown query parameter \"sinc\"; GET /v1/config takes `since`",
            None,
        ),
        (
            "GET",
            "/v1/config/wait?since=0&timeout_ms=soon",
            400,
            "malformed_request",
            "query parameter `timeout_ms` of GET /v1/config/wait must be a whole number of \
             milliseconds from 0 (at most 300000 are waited), not \"soon\"",
            None,
        ),
        (
            "GET",
            "/v1/audit?since=-1",
            400,
            "malformed_request",
            "query parameter `since` of GET /v1/audit must be a revision",
            None,
        ),
        (
            "GET",
            "/v1/audit?limit=many",
            400,
            "malformed_request",
            "query parameter `limit` of GET /v1/audit must be a whole number of entries from 1 \
             (at most 1000 are answered), not \"many\"",
            None,
        ),
    ];
    for &(method, path, status, reason, message, allow) in cases {
        let resp = api
            .http
            .request(method.parse().unwrap(), api.url(path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let what = format!("{method} {path}");
        assert_eq!(resp.status().as_u16(), status, "{what}");
        assert_eq!(
            resp.headers()
                .get("allow")
                .map(|v| v.to_str().unwrap().to_owned())
                .as_deref(),
            allow,
            "{what}"
        );
        let text = resp.text().await.unwrap();
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("{what}: not JSON: {text:?}"));
        assert_eq!(v["error"]["reason"], reason, "{what}: {v}");
        let got = v["error"]["message"].as_str().unwrap_or_default();
        assert!(got.contains(message), "{what}: {got}");
    }

    // Review of issue 23: what a client sends is quoted in the message,
    // bounded: a 5000-character path, `since` and unknown key each give
    // a message of about 1 KiB that still says what is wrong.
    let long = "x".repeat(5000);
    let digits = "9".repeat(5000);
    let long_cases = [
        (
            format!("/v1/{long}"),
            404,
            "not_found",
            "no endpoint at /v1/xxx",
        ),
        (
            format!("/v1/config?since={digits}"),
            400,
            "malformed_request",
            "query parameter `since` of GET /v1/config is too large: it must be a revision",
        ),
        (
            format!("/v1/config?{long}=1"),
            400,
            "malformed_request",
            "unknown query parameter \"xxx",
        ),
    ];
    for (path, status, reason, message) in long_cases {
        let resp = api
            .http
            .get(api.url(&path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let what = format!("GET {}...", &path[..20]);
        assert_eq!(resp.status().as_u16(), status, "{what}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["reason"], reason, "{what}: {v}");
        let got = v["error"]["message"].as_str().unwrap_or_default();
        assert!(got.starts_with(message), "{what}: {got}");
        assert!(got.contains("bytes cut]"), "{what}: {got}");
        assert!(got.len() <= 1100, "{what}: {} bytes", got.len());
    }
    // A number past i64::MAX for a bounded parameter is its bound, as any
    // large one was (`since` ahead of the database: answered at once).
    api.get(&format!(
        "/v1/config/wait?since=1&timeout_ms={}",
        "9".repeat(40)
    ))
    .await;
    api.get(&format!("/v1/audit?limit={}", "9".repeat(40)))
        .await;

    // What the follower and the web page send is still taken.
    api.get("/v1/config?since=0").await;
    api.get("/v1/config/wait?since=0&timeout_ms=0").await;
    api.get("/v1/audit?since=0&limit=5").await;
}

/// Issue 22: a server following the API enforces the resolved override,
/// and raising the resource's limit raises the override's that inherits
/// it (the override was frozen at the old value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_following_server_enforces_the_override_resolved_against_its_resource() {
    let dir = Sandbox::new("config-api-follow-inherit");
    let api = ConfigApi::start_sqlite(&dir, &[]);
    const R: &str = "/v1/namespaces/shop/resources/login";
    api.ok("PUT", "/v1/namespaces/shop", None).await;
    api.ok(
        "PUT",
        R,
        Some(json!({"algorithm": "fixed_window", "limit": 1, "window": "1h"})),
    )
    .await;
    // `acme` (the domain `hit` asks for) changes only the window.
    let r = api
        .ok(
            "PUT",
            &format!("{R}/domains/acme"),
            Some(json!({"window": "2h"})),
        )
        .await;
    let (server, _, _) = follow(&dir, &api);
    until_revision(&server, r["revision"].as_i64().unwrap());
    assert!(hit(&server, "shop", "login"));
    assert!(
        !hit(&server, "shop", "login"),
        "the resolved override: limit 1"
    );

    let mut body = api.get(R).await["resource"].clone();
    body["limit"] = json!(3);
    let r = api.ok("PUT", R, Some(body)).await;
    assert_eq!(r["resolved"]["domains"]["acme"]["limit"], 3, "{r}");
    until_revision(&server, r["revision"].as_i64().unwrap());
    // New parameters, a new limit: three hits, then refused.
    let allowed: Vec<bool> = (0..4).map(|_| hit(&server, "shop", "login")).collect();
    assert_eq!(allowed, [true, true, true, false]);
}

/// Issue 18's fields set through the config API, served by a server that
/// follows it: a `limits:` list (refused by the limit that binds, named),
/// usage reported after the fact up to `max_debt`, a limit brought by the
/// request (`allow_override`), and a calendar month.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_following_server_serves_limits_lists_usage_brought_limits_and_calendar_windows() {
    let dir = Sandbox::new("config-api-follow-issue-18");
    let api = ConfigApi::start_sqlite(&dir, &[]);
    const NS: &str = "/v1/namespaces/shop";
    api.ok("PUT", NS, None).await;
    api.ok(
        "PUT",
        &format!("{NS}/resources/api"),
        Some(json!({"limits": [
            {"name": "burst", "algorithm": "token_bucket", "capacity": 2, "rate": "1/1d"},
            {"name": "daily", "algorithm": "fixed_window", "limit": 5, "window": "1d", "align": "first_hit"},
        ]})),
    )
    .await;
    api.ok(
        "PUT",
        &format!("{NS}/resources/tokens"),
        Some(json!({"algorithm": "token_bucket", "capacity": 10, "rate": "1/1d", "max_debt": 5})),
    )
    .await;
    api.ok(
        "PUT",
        &format!("{NS}/resources/plans"),
        Some(
            json!({"algorithm": "fixed_window", "limit": 100, "window": "1d",
                    "allow_override": true, "override_max": "50/d"}),
        ),
    )
    .await;
    let r = api
        .ok(
            "PUT",
            &format!("{NS}/resources/monthly"),
            Some(
                json!({"algorithm": "fixed_window", "limit": 2, "window": "1mo",
                        "align": "calendar", "timezone": "Europe/Paris"}),
            ),
        )
        .await;
    let (server, _, _) = follow(&dir, &api);
    until_revision(&server, r["revision"].as_i64().unwrap());
    let ask_hits = |resource: &str, hits: u64, extra: &str| {
        let body = format!(
            r#"{{"namespace":"shop","resource":"{resource}","domain":"acme","hits":{hits}{extra}}}"#
        );
        server.json("POST", "/v1/request", Some(&body))
    };
    let ask = |resource: &str, extra: &str| ask_hits(resource, 1, extra);

    // The list: two from the bucket, then refused by `burst`.
    for _ in 0..2 {
        assert_eq!(ask("api", "").0, 200);
    }
    let (status, v) = ask("api", "");
    assert_eq!(
        (status, &v["limited_by_name"]),
        (429, &json!("burst")),
        "{v}"
    );

    // Usage: 20 reported, 15 charged: the 10 there are and the 5
    // `max_debt` allows (the default would be one capacity, 10).
    let (status, v) = ask_hits("tokens", 20, r#","mode":"report""#);
    assert_eq!((status, &v["granted"]), (200, &json!(15)), "{v}");
    let (status, v) = ask("tokens", "");
    assert_eq!(status, 429, "refused while owing: {v}");

    // A brought plan of 1 a year (no window edge falls inside the test),
    // then one past `override_max`.
    let (status, v) = ask("plans", r#","limit":{"requests_per_unit":1,"unit":"year"}"#);
    assert_eq!((status, &v["limit"]), (200, &json!(1)), "{v}");
    let (status, _) = ask("plans", r#","limit":{"requests_per_unit":1,"unit":"year"}"#);
    assert_eq!(status, 429);
    let (status, v) = ask(
        "plans",
        r#","limit":{"requests_per_unit":500,"unit":"day"}"#,
    );
    assert_eq!(
        (status, &v["error"]["reason"]),
        (400, &json!("invalid_limit_override")),
        "{v}"
    );

    // The calendar month: it resets at the next Paris midnight of the
    // first of a month, within the answer's times.
    assert_eq!(ask("monthly", "").0, 200);
    let before = jiff::Timestamp::now();
    let (status, v) = ask("monthly", "");
    let upto = jiff::Timestamp::now();
    assert_eq!(status, 200, "{v}");
    let edge = |t: jiff::Timestamp| {
        use jiff::ToSpan;
        let tz = jiff::tz::TimeZone::get("Europe/Paris").unwrap();
        t.to_zoned_datetime(tz.clone())
            .date()
            .first_of_month()
            .checked_add(1.months())
            .unwrap()
            .to_zoned_datetime(tz)
            .unwrap()
            .timestamp()
            .as_nanosecond()
    };
    let reset = i128::from(v["reset_after_ns"].as_u64().unwrap());
    assert!(
        reset <= edge(before) - before.as_nanosecond()
            && reset >= edge(upto) - upto.as_nanosecond(),
        "{v}"
    );
    assert_eq!(ask("monthly", "").0, 429);
}

/// Review of issue 22: the servers were read through `HTTP_PROXY` when
/// it was set, so the bearer token sent to a plain `http://` loopback
/// server went in clear to the proxy. With every proxy variable naming a
/// port nobody listens on, the server is still read, token and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_are_read_directly_never_through_a_proxy() {
    let dir = Sandbox::new("config-api-usage-no-proxy");
    let (server, token_file) = limiting_server(&dir, "login", &[]);
    let closed = closed_addr();
    let proxy = format!("http://{closed}");
    let servers = format!("http://{}", server.http);
    let tokens = format!("admin:alice:{ADMIN}\nread:fleet:{READER}\n");
    let env: Vec<(&str, &str)> = [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ]
    .into_iter()
    .map(|k| (k, proxy.as_str()))
    .chain([("NO_PROXY", ""), ("no_proxy", "")])
    .collect();
    let api = ConfigApi::start_with_env(
        &dir,
        &common::config_api::sqlite(&dir, "t.db"),
        &[
            "--servers",
            &servers,
            "--servers-refresh-ms",
            "200",
            "--servers-token-file",
            token_file.to_str().unwrap(),
        ],
        None,
        &tokens,
        &env,
    );
    let allowed: Vec<bool> = (0..3).map(|_| hit(&server, "shop", "login")).collect();
    assert_eq!(allowed, [true, true, false]);
    let u = until_usage(&api, |u| {
        u["namespaces"]["shop"]["login"]["top_denied"]
            == json!([{"domain": "acme", "rejected": 1.0}])
    })
    .await;
    assert_eq!(u["servers"][0]["ok"], true, "{u}");
    assert_eq!(u["top_denied_unavailable"], Value::Null, "{u}");
}

/// A loopback address nobody listens on (bound, then let go).
fn closed_addr() -> std::net::SocketAddr {
    tollgate_testing::refused_addr()
}

/// Polls `GET /v1/usage` until `done` holds (a minute at most).
async fn until_usage(api: &ConfigApi, done: impl Fn(&Value) -> bool) -> Value {
    let done = &done;
    tollgate_testing::eventually_async(
        "the usage gets there",
        Duration::from_secs(60),
        move || async move {
            let usage = api.get("/v1/usage").await;
            if done(&usage) {
                Ok(usage)
            } else {
                Err(usage.to_string())
            }
        },
    )
    .await
}

/// Issue 22: the console shows what the limiting servers decide now, from
/// their metrics; a server down or silent is said so, and does not hold up
/// the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_reads_live_usage_from_the_limiting_servers_metrics() {
    let dir = Sandbox::new("config-api-usage");
    let (server, token_file) = limiting_server(&dir, "login", &[]);
    // A port nobody listens on, and one that accepts and never answers.
    let closed = closed_addr();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let servers = format!("{},{closed},http://{silent_addr}", server.http);
    let api = ConfigApi::start_sqlite(
        &dir,
        &[
            "--servers",
            &servers,
            "--servers-refresh-ms",
            "200",
            "--servers-token-file",
            token_file.to_str().unwrap(),
        ],
    );
    let allowed: Vec<bool> = (0..5).map(|_| hit(&server, "shop", "login")).collect();
    assert_eq!(allowed, [true, true, false, false, false]);
    // Rates come with the second refresh that saw the server.
    let u = until_usage(&api, |u| {
        let login = &u["namespaces"]["shop"]["login"];
        login["decisions"] == 5.0 && login["decisions_per_s"].is_number()
    })
    .await;
    assert_eq!(u["enabled"], true);
    assert_eq!(u["every_ms"], 200);
    assert_eq!(u["top_denied_unavailable"], Value::Null, "{u}");
    let login = &u["namespaces"]["shop"]["login"];
    assert_eq!(
        (login["rejected"].as_f64(), login["hits_granted"].as_f64()),
        (Some(3.0), Some(2.0))
    );
    assert!(login["decisions_per_s"].is_number(), "{u}");
    // The second grant left nothing of the limit of 2: near it.
    assert_eq!(login["near_limit"], 1.0, "{u}");
    assert_eq!(
        login["top_denied"],
        json!([{"domain": "acme", "rejected": 3.0}]),
        "from the server's GET /v1/denied"
    );
    let status: Vec<(Value, Value)> = u["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["server"].clone(), s["ok"].clone()))
        .collect();
    assert_eq!(
        status,
        [
            (json!(server.http.to_string()), json!(true)),
            (json!(closed.to_string()), json!(false)),
            (json!(format!("http://{silent_addr}")), json!(false)),
        ]
    );
    assert!(
        u["servers"][1]["error"]
            .as_str()
            .unwrap()
            .starts_with("unreachable"),
        "{u}"
    );
    drop(silent);

    // Review H1: without --servers-token-file (or with a token the server
    // refuses) the numbers from the metrics still come, and the console
    // is told the denied domains are unavailable, and why.
    let wrong = dir.write("wrong-token", "not-the-servers-token-000\n");
    for (extra, why) in [(None, "no --servers-token-file"), (Some(&wrong), "401")] {
        let mut args = vec![
            "--servers".to_owned(),
            server.http.to_string(),
            "--servers-refresh-ms".to_owned(),
            "200".to_owned(),
        ];
        if let Some(f) = extra {
            args.push("--servers-token-file".to_owned());
            args.push(f.to_str().unwrap().to_owned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let db = format!("t-{}.db", extra.is_some());
        let plain = ConfigApi::start(&dir, &common::config_api::sqlite(&dir, &db), &args);
        let u = until_usage(&plain, |u| {
            u["namespaces"]["shop"]["login"]["decisions"] == 5.0
        })
        .await;
        assert_eq!(u["namespaces"]["shop"]["login"]["rejected"], 3.0, "{u}");
        assert_eq!(
            u["namespaces"]["shop"]["login"]["top_denied"],
            json!([]),
            "{u}"
        );
        let unavailable = u["top_denied_unavailable"].as_str().unwrap_or_default();
        assert!(unavailable.contains(why), "{u}");
        assert_eq!(u["servers"][0]["state"], "ok", "{u}");
    }
    assert!(
        server
            .metric("tollgate_admin_auth_failures_total{reason=\"unknown_token\"}")
            .unwrap_or(0.0)
            >= 1.0
    );

    // Without --servers there is nothing live, and it says so.
    let dir2 = Sandbox::new("config-api-usage-off");
    let off = ConfigApi::start(&dir2, &common::config_api::sqlite(&dir2, "t.db"), &[]);
    let u = off.get("/v1/usage").await;
    assert_eq!(
        (u["enabled"].clone(), u["namespaces"].clone()),
        (json!(false), json!({}))
    );

    // A bad address is refused at start, naming it.
    let tokens = dir2.write("tokens2", format!("admin:a:{ADMIN}\n"));
    for (servers, expected) in [
        ("ftp://x:1", "--servers ftp://x:1: not an address"),
        ("http://u:p@h:1", "with a user or password"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args([
                "config-api",
                "--listen",
                "127.0.0.1:0",
                "--servers",
                servers,
            ])
            .arg("--tokens-file")
            .arg(&tokens)
            .current_dir(&dir2.dir)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{stderr}");
    }
}

/// A loopback HTTP server that answers every request with a body of
/// `bytes` bytes, announcing its length or not (then it ends the body by
/// closing): a limiting server whose metrics outgrew the cap.
fn oversized_server(bytes: usize, announce: bool) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head);
                let length = if announce {
                    format!("Content-Length: {bytes}\r\n")
                } else {
                    String::new()
                };
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{length}Connection: close\r\n\r\n"
                );
                let line = "tollgate_decisions_total{namespace=\"n\",resource=\"r\",outcome=\"granted\"} 1\n";
                let mut sent = 0;
                while sent < bytes {
                    let chunk = line.as_bytes();
                    if conn.write_all(chunk).is_err() {
                        return;
                    }
                    sent += chunk.len();
                }
            });
        }
    });
    addr
}

/// Review M7: a server whose /metrics is over the 8 MiB cap is reported
/// as `too_large`, whether its Content-Length says so or the body runs
/// over while read; the servers beside it still count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_metrics_over_the_cap_is_reported_too_large() {
    let dir = Sandbox::new("config-api-usage-large");
    let (server, _) = limiting_server(&dir, "login", &[]);
    let announced = oversized_server(9 * 1024 * 1024, true);
    let streamed = oversized_server(9 * 1024 * 1024, false);
    let servers = format!("{},{announced},{streamed}", server.http);
    let api = ConfigApi::start_sqlite(
        &dir,
        &["--servers", &servers, "--servers-refresh-ms", "1000"],
    );
    assert!(hit(&server, "shop", "login"));
    let u = until_usage(&api, |u| {
        u["servers"][1]["state"].is_string()
            && u["servers"][2]["state"].is_string()
            && u["namespaces"]["shop"]["login"]["decisions"] == 1.0
    })
    .await;
    assert_eq!(u["servers"][0]["state"], "ok", "{u}");
    for i in [1, 2] {
        assert_eq!(u["servers"][i]["state"], "too_large", "{u}");
        let error = u["servers"][i]["error"].as_str().unwrap();
        assert!(
            error.starts_with("too large: its /metrics is larger than 8 MiB"),
            "{u}"
        );
    }
    assert!(
        u["namespaces"].get("n").is_none(),
        "nothing of a refused answer counts: {u}"
    );
}

/// Review M7: `--servers https://...` reached only servers whose
/// certificates chain to the system's roots. With `--servers-ca` it
/// trusts the servers' own CA, and with `--servers-cert`/`--servers-key`
/// it passes a server's mutual TLS; its top denied domains come over the
/// same connection, with the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_usage_reads_servers_on_their_own_mutual_tls() {
    let certs = tollgate_redis::testing::TestCerts::generate();
    let dir = Sandbox::new("config-api-usage-tls");
    let (cert, key, ca) = dir.write_server_tls(&certs, "server");
    let client_cert = dir.write("client.pem", &certs.client_cert);
    let client_key = dir.write("client.key", &certs.client_key);
    let (server, token_file) = limiting_server(
        &dir,
        "login",
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-client-ca",
            ca.to_str().unwrap(),
        ],
    );
    let servers = format!("https://{}", server.http);
    let api = ConfigApi::start_sqlite(
        &dir,
        &[
            "--servers",
            &servers,
            "--servers-refresh-ms",
            "200",
            "--servers-ca",
            ca.to_str().unwrap(),
            "--servers-cert",
            client_cert.to_str().unwrap(),
            "--servers-key",
            client_key.to_str().unwrap(),
            "--servers-token-file",
            token_file.to_str().unwrap(),
        ],
    );
    let u = until_usage(&api, |u| u["servers"][0]["ok"].is_boolean()).await;
    assert_eq!(u["servers"][0]["state"], "ok", "{u}");
    assert_eq!(u["servers"][0]["denied_error"], Value::Null, "{u}");
    assert_eq!(u["top_denied_unavailable"], Value::Null, "{u}");

    // Without the CA: the server's certificate is not trusted, and it
    // says so rather than showing nothing.
    let untrusting = ConfigApi::start(
        &dir,
        &common::config_api::sqlite(&dir, "u.db"),
        &["--servers", &servers, "--servers-refresh-ms", "200"],
    );
    let u = until_usage(&untrusting, |u| u["servers"][0]["ok"].is_boolean()).await;
    assert_eq!(u["servers"][0]["state"], "error", "{u}");

    // A CA file that holds no certificate stops the start, naming it.
    let tokens = dir.write("tokens-x", format!("admin:a:{ADMIN}\n"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "config-api",
            "--listen",
            "127.0.0.1:0",
            "--servers",
            &servers,
        ])
        .arg("--tokens-file")
        .arg(&tokens)
        .arg("--servers-ca")
        .arg(&key)
        .current_dir(&dir.dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--servers-ca"), "{stderr}");
    assert!(!stderr.contains("PRIVATE KEY"), "{stderr}");
}
