//! Live counters (issue 18, item 5) through the real binary: `GET` and
//! `DELETE /v1/counters`, the gRPC `Inspect` and `Reset` rpcs and `tollgate
//! counters get|reset`, behind the server's admin tokens, on the memory
//! store, on a real redis-server and in a gossip cluster (where a reset
//! through any node wins on every node).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};

use common::serving::Serving;
use common::Sandbox;
use serde_json::Value;
use tollgate_proto::v1::{self, tollgate_client::TollgateClient};

const READ: &str = "console-read-token-0123";
const ADMIN: &str = "ops-admin-token-4567890";

/// A fixed window that never rolls over during a test (an hour from the
/// domain's first hit), with a hard limit
/// and a global limit, so a plan has three items; a shadow resource; a
/// copy-limited one.
const CONFIG: &str = "namespaces:
  - name: shop
    resources:
      - { name: api, algorithm: fixed_window, limit: 5, window: 1h, align: first_hit, hard_limit: 50, global_limit: 100 }
      - { name: quiet, algorithm: fixed_window, limit: 2, window: 1h, align: first_hit, shadow_mode: true }
      - name: seats
        kind: concurrency
        domain_limit: 3
        global_limit: 10
";

fn sandbox(name: &str) -> Sandbox {
    let dir = Sandbox::new(name);
    dir.write("tollgate.yaml", CONFIG);
    dir.write(
        "admin-tokens",
        format!("read:console:{READ}\nadmin:ops:{ADMIN}\n"),
    );
    dir
}

/// One HTTP exchange with an optional bearer token: (status, body, the
/// whole answer with its headers).
fn call(server: &Serving, method: &str, path: &str, token: Option<&str>) -> (u16, Value, String) {
    let mut s = std::net::TcpStream::connect(server.http).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 0\r\n{auth}\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1;
    let v = serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    (status, v, out)
}

fn request(server: &Serving, resource: &str, domain: &str, hits: u64) -> Value {
    let body = format!(
        r#"{{"namespace":"shop","resource":"{resource}","domain":"{domain}","hits":{hits}}}"#
    );
    let (status, v) = server.json("POST", "/v1/request", Some(&body));
    // 429: rejected, with the same body.
    assert!(status == 200 || status == 429, "{status}: {v}");
    v
}

fn counters(resource: &str, domain: &str) -> String {
    format!("/v1/counters?namespace=shop&resource={resource}&domain={domain}")
}

/// Without `--admin-tokens-file` the counters are off on both surfaces,
/// saying how to turn them on, and `/v1/config` and `/status` stay open.
#[test]
fn counters_are_off_without_admin_tokens() {
    let dir = sandbox("counters-off");
    let server = Serving::start_config(&dir, &dir.path("tollgate.yaml"), &[], &[]);
    for method in ["GET", "DELETE"] {
        let (status, v, _) = call(&server, method, &counters("api", "alice"), Some(ADMIN));
        assert_eq!(status, 404, "{method}: {v}");
        assert_eq!(v["error"]["reason"], "admin_endpoints_off");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("--admin-tokens-file"), "{message}");
    }
    assert_eq!(server.http("GET", "/v1/config", None).0, 200);
    assert_eq!(server.http("GET", "/status", None).0, 200);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt.block_on(async {
        let mut client = TollgateClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap();
        client
            .inspect(ask("api", "alice", Some(ADMIN)))
            .await
            .unwrap_err()
    });
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert!(err.message().contains("--admin-tokens-file"), "{err:?}");
    server.terminate();
}

/// The whole flow over HTTP on the memory store: an inspection lists each
/// limit of the plan a request decides (main, hard, global) with what a
/// request would find, charges nothing and creates nothing; a `read` token
/// may inspect but not reset (403), an `admin` token resets, after which
/// the domain's next request sees a fresh window; a missing or unknown
/// token is 401 with `WWW-Authenticate`, counted; bad names are 4xx naming
/// them; a copy resource shows its holds and refuses a reset.
#[test]
fn inspect_and_reset_over_http_behind_admin_tokens() {
    let dir = sandbox("counters-http");
    let tokens = dir.path("admin-tokens");
    let server = Serving::start_config(
        &dir,
        &dir.path("tollgate.yaml"),
        &["--admin-tokens-file", tokens.to_str().unwrap()],
        &[],
    );
    for _ in 0..3 {
        request(&server, "api", "alice", 1);
    }
    request(&server, "api", "bob", 2);

    let (status, v, _) = call(&server, "GET", &counters("api", "alice"), Some(READ));
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["namespace"].as_str(), v["domain"].as_str()),
        (Some("shop"), Some("alice"))
    );
    let limits = v["limits"].as_array().unwrap();
    let names: Vec<&str> = limits.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["main", "hard", "global"], "{v}");
    assert_eq!(limits[0]["algorithm"], "fixed_window");
    assert_eq!(
        (limits[0]["limit"].as_u64(), limits[0]["remaining"].as_u64()),
        (Some(5), Some(2))
    );
    // Hard and global limits count per second: what remains depends on
    // how fast this test runs, so only their limits are checked.
    assert_eq!(
        (limits[1]["limit"].as_u64(), limits[2]["limit"].as_u64()),
        (Some(50), Some(100))
    );
    assert_eq!(limits[0]["shadow"], false);
    assert!(v["holds"].is_null(), "{v}");
    // Charged nothing: twice the same, and a request still gets its 2.
    let (_, again, _) = call(&server, "GET", &counters("api", "alice"), Some(ADMIN));
    assert_eq!(again["limits"][0]["remaining"], 2);
    // What a request of zero hits is told.
    let zero = request(&server, "api", "alice", 0);
    assert_eq!(zero["remaining"], limits[0]["remaining"]);
    // A domain never seen: fresh.
    let (_, fresh, _) = call(&server, "GET", &counters("api", "carol"), Some(READ));
    assert_eq!(fresh["limits"][0]["remaining"], 5, "{fresh}");

    // A read token cannot reset.
    let (status, v, _) = call(&server, "DELETE", &counters("api", "alice"), Some(READ));
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["reason"], "admin_role_required");
    assert_eq!(
        request(&server, "api", "alice", 2)["granted"],
        2,
        "the refused reset reset"
    );
    assert_eq!(request(&server, "api", "alice", 1)["allowed"], false);

    // An admin token resets alice, and only alice.
    let (status, v, _) = call(&server, "DELETE", &counters("api", "alice"), Some(ADMIN));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["reset"], 3, "main, hard and global: {v}");
    let (_, after, _) = call(&server, "GET", &counters("api", "alice"), Some(READ));
    assert_eq!(after["limits"][0]["remaining"], 5, "{after}");
    assert_eq!(request(&server, "api", "alice", 5)["granted"], 5);
    let (_, bob, _) = call(&server, "GET", &counters("api", "bob"), Some(READ));
    assert_eq!(bob["limits"][0]["remaining"], 3, "{bob}");
    assert_eq!(
        server.metric(
            "tollgate_counter_resets_total{surface=\"http\",namespace=\"shop\",resource=\"api\"}"
        ),
        Some(1.0)
    );
    let reset_log = server.logged("counters reset");
    assert_eq!(reset_log.len(), 1, "{reset_log:?}");
    assert_eq!(reset_log[0]["fields"]["token"], "ops", "{reset_log:?}");

    // Shadow mode is said.
    request(&server, "quiet", "alice", 1);
    let (_, quiet, _) = call(&server, "GET", &counters("quiet", "alice"), Some(READ));
    assert_eq!(quiet["limits"][0]["shadow"], true, "{quiet}");
    assert_eq!(quiet["limits"][0]["remaining"], 1, "{quiet}");

    // No token, a wrong one: 401, counted, never echoed.
    let (status, _, whole) = call(&server, "GET", &counters("api", "alice"), None);
    assert_eq!(status, 401);
    assert!(whole.contains("www-authenticate: Bearer"), "{whole}");
    let (status, v, whole) = call(
        &server,
        "DELETE",
        &counters("api", "alice"),
        Some("not-a-token-of-this-one"),
    );
    assert_eq!(status, 401, "{v}");
    assert!(!whole.contains("not-a-token-of-this-one"), "{whole}");
    for (reason, n) in [
        ("no_token", 1.0),
        ("unknown_token", 1.0),
        ("admin_role_required", 1.0),
    ] {
        assert_eq!(
            server.metric(&format!(
                "tollgate_admin_auth_failures_total{{reason=\"{reason}\"}}"
            )),
            Some(n),
            "{reason}"
        );
    }

    // Names: missing, unknown, misspelt, too long.
    let bad = [
        (
            "/v1/counters?resource=api&domain=a",
            400,
            "malformed_request",
            "namespace",
        ),
        (
            "/v1/counters?namespace=shop&domain=a",
            400,
            "malformed_request",
            "resource",
        ),
        (
            "/v1/counters?namespace=nope&resource=api&domain=a",
            404,
            "unknown_namespace",
            "nope",
        ),
        (
            "/v1/counters?namespace=shop&resource=nope&domain=a",
            404,
            "unknown_resource",
            "nope",
        ),
        (
            "/v1/counters?namespace=shop&resourc=api&domain=a",
            400,
            "malformed_request",
            "resourc",
        ),
    ];
    for (path, want, reason, named) in bad {
        let (status, v, _) = call(&server, "GET", path, Some(READ));
        assert_eq!(status, want, "{path}: {v}");
        assert_eq!(v["error"]["reason"], reason, "{path}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(named), "{path}: {message}");
    }
    let long = format!("{}&x={}", counters("api", "a"), "y".repeat(5000));
    let (status, v, _) = call(&server, "GET", &long, Some(READ));
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("4096"),
        "{v}"
    );

    // A copy resource: its holds; no reset.
    let (status, _) = server.json(
        "POST",
        "/v1/reserve",
        Some(r#"{"namespace":"shop","resource":"seats","domain":"acme","copies":2}"#),
    );
    assert_eq!(status, 200);
    let (status, seats, _) = call(&server, "GET", &counters("seats", "acme"), Some(READ));
    assert_eq!(status, 200, "{seats}");
    assert_eq!(seats["holds"]["domain_holds"], 2, "{seats}");
    assert_eq!(seats["holds"]["global_holds"], 2, "{seats}");
    assert_eq!(seats["holds"]["domain_limit"], 3, "{seats}");
    assert_eq!(seats["holds"]["global_limit"], 10, "{seats}");
    assert_eq!(seats["limits"], serde_json::json!([]));
    let (status, v, _) = call(&server, "DELETE", &counters("seats", "acme"), Some(ADMIN));
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["reason"], "holds_not_resettable");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("release"),
        "{v}"
    );

    let (code, logs) = server.terminate();
    assert_eq!(code, Some(0));
    let logs = format!("{logs:?}");
    assert!(
        !logs.contains(ADMIN) && !logs.contains(READ),
        "a token was logged"
    );
}

/// A resource with a `limits:` list: each limit inspected by its name,
/// and a reset makes every one of them fresh.
#[test]
fn a_limits_list_is_inspected_limit_by_limit_and_reset_whole() {
    let dir = Sandbox::new("counters-list");
    dir.write(
        "tollgate.yaml",
        "namespaces:\n  - name: shop\n    resources:\n      - name: listed\n        limits:\n          \
         - { name: burst, algorithm: token_bucket, capacity: 3, rate: 1/1d }\n          \
         - { name: daily, algorithm: fixed_window, limit: 5, window: 1d, align: first_hit }\n",
    );
    dir.write("admin-tokens", format!("admin:ops:{ADMIN}\n"));
    let tokens = dir.path("admin-tokens");
    let server = Serving::start_config(
        &dir,
        &dir.path("tollgate.yaml"),
        &["--admin-tokens-file", tokens.to_str().unwrap()],
        &[],
    );
    request(&server, "listed", "alice", 2);
    let state = |v: &Value| -> Vec<(String, u64)> {
        v["limits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["name"].as_str().unwrap().to_owned(),
                    l["remaining"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let (status, v, _) = call(&server, "GET", &counters("listed", "alice"), Some(ADMIN));
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        state(&v),
        [("burst".to_owned(), 1), ("daily".to_owned(), 3)],
        "{v}"
    );
    let (status, v, _) = call(&server, "DELETE", &counters("listed", "alice"), Some(ADMIN));
    assert_eq!(status, 200, "{v}");
    let (_, v, _) = call(&server, "GET", &counters("listed", "alice"), Some(ADMIN));
    assert_eq!(
        state(&v),
        [("burst".to_owned(), 3), ("daily".to_owned(), 5)],
        "{v}"
    );
    assert_eq!(request(&server, "listed", "alice", 3)["granted"], 3);
}

fn ask(resource: &str, domain: &str, token: Option<&str>) -> tonic::Request<v1::CountersRequest> {
    let mut r = tonic::Request::new(v1::CountersRequest {
        namespace: "shop".into(),
        resource: resource.into(),
        domain: domain.into(),
    });
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

/// gRPC `Inspect` and `Reset`: the same answers and the same token rules
/// as HTTP, the token in the `authorization` metadata.
#[test]
fn inspect_and_reset_over_grpc() {
    let dir = sandbox("counters-grpc");
    let tokens = dir.path("admin-tokens");
    let server = Serving::start_config(
        &dir,
        &dir.path("tollgate.yaml"),
        &["--admin-tokens-file", tokens.to_str().unwrap()],
        &[],
    );
    for _ in 0..4 {
        request(&server, "api", "alice", 1);
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut client = TollgateClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap();
        let seen = client
            .inspect(ask("api", "alice", Some(READ)))
            .await
            .unwrap()
            .into_inner();
        let names: Vec<&str> = seen.limits.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["main", "hard", "global"]);
        assert_eq!((seen.limits[0].limit, seen.limits[0].remaining), (5, 1));
        assert!(seen.limits[0].reset_after_ns > 0);

        let err = client.inspect(ask("api", "alice", None)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
        let err = client
            .inspect(ask("api", "alice", Some("not-a-token-of-this-one")))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
        let err = client
            .reset(ask("api", "alice", Some(READ)))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
        assert_eq!(
            err.metadata().get("tollgate-reason").unwrap(),
            "admin_role_required"
        );
        let err = client
            .inspect(ask("nope", "alice", Some(READ)))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
        assert!(err.message().contains("nope"), "{err:?}");

        let reset = client
            .reset(ask("api", "alice", Some(ADMIN)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reset.reset, 3);
        let seen = client
            .inspect(ask("api", "alice", Some(READ)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(seen.limits[0].remaining, 5);

        let seats = client
            .inspect(ask("seats", "acme", Some(READ)))
            .await
            .unwrap()
            .into_inner();
        let holds = seats.holds.unwrap();
        assert_eq!((holds.domain_limit, holds.domain_holds), (3, 0));
        let err = client
            .reset(ask("seats", "acme", Some(ADMIN)))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    });
    assert_eq!(
        request(&server, "api", "alice", 5)["granted"],
        5,
        "the reset stuck"
    );
    assert_eq!(
        server.metric(
            "tollgate_counter_resets_total{surface=\"grpc\",namespace=\"shop\",resource=\"api\"}"
        ),
        Some(1.0)
    );
    server.terminate();
}

/// `tollgate counters get|reset` against a running server: text and JSON,
/// the token from a file, a read token refused a reset, exit codes.
#[test]
fn the_cli_gets_and_resets_counters() {
    let dir = sandbox("counters-cli");
    let tokens = dir.path("admin-tokens");
    let server = Serving::start_config(
        &dir,
        &dir.path("tollgate.yaml"),
        &["--admin-tokens-file", tokens.to_str().unwrap()],
        &[],
    );
    request(&server, "api", "alice", 4);
    dir.write("read-token", format!("{READ}\n"));
    dir.write("admin-token", ADMIN);
    let url = format!("http://{}", server.http);
    let target = |op: &'static str, token: &'static str| -> Vec<String> {
        [
            "counters",
            op,
            "--namespace",
            "shop",
            "--resource",
            "api",
            "--domain",
            "alice",
            "--server",
            &url,
            "--token-file",
            token,
        ]
        .iter()
        .map(ToString::to_string)
        .collect()
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        dir.run(&args)
    };

    let out = run(target("get", "read-token"));
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("shop/api domain \"alice\""), "{out}");
    assert!(
        out.stdout.contains("main (fixed_window): 1 of 5 remaining"),
        "{out}"
    );
    assert!(out.stdout.contains("hard (sliding_log): "), "{out}");
    assert!(out.stdout.contains(" of 50 remaining"), "{out}");

    let mut json = target("get", "read-token");
    json.push("--json".into());
    let out = run(json);
    assert!(out.success(), "{out}");
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["limits"][0]["remaining"], 1, "{v}");

    let out = run(target("reset", "read-token"));
    assert_eq!(out.code, Some(2), "{out}");
    assert!(out.stderr.contains("admin_role_required"), "{out}");
    assert!(out.stderr.contains("role `admin`"), "{out}");

    let out = run(target("reset", "admin-token"));
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("reset 3 limit(s) of shop/api"), "{out}");
    assert_eq!(request(&server, "api", "alice", 5)["granted"], 5);

    // No token: the server's 401, said.
    let out = dir.run(&[
        "counters",
        "get",
        "--namespace",
        "shop",
        "--resource",
        "api",
        "--server",
        &url,
    ]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(out.stderr.contains("no_token"), "{out}");
    // The token never goes in clear beyond loopback.
    let out = run({
        let mut a = target("get", "admin-token");
        let at = a.iter().position(|s| s == "--server").unwrap();
        a[at + 1] = "http://192.0.2.1:8080".into();
        a
    });
    assert_eq!(out.code, Some(2), "{out}");
    assert!(out.stderr.contains("in clear"), "{out}");
    server.terminate();
}

/// On a real redis-server: an inspection of a domain never decided
/// creates no key in Redis, and a reset deletes the domain's keys, so the
/// next request sees a fresh window.
#[test]
fn inspect_creates_no_key_and_reset_deletes_them_on_redis() {
    let redis = tollgate_redis::testing::RedisServer::start();
    let dir = sandbox("counters-redis");
    let tokens = dir.path("admin-tokens");
    let server = Serving::start_redis(
        &dir,
        &redis.url(),
        &["--admin-tokens-file", tokens.to_str().unwrap()],
        &[],
    );
    let domain_keys = |domain: &str| -> Vec<String> {
        redis
            .keys("")
            .into_iter()
            .filter(|k| k.contains(":l:") && k.ends_with(&format!(":{domain}")))
            .collect()
    };
    let (status, v, _) = call(&server, "GET", &counters("api", "fresh-one"), Some(READ));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["limits"][0]["remaining"], 5);
    assert!(domain_keys("fresh-one").is_empty(), "{:?}", redis.keys(""));

    for _ in 0..5 {
        request(&server, "api", "alice", 1);
    }
    assert_eq!(request(&server, "api", "alice", 1)["allowed"], false);
    // The window's key at least (the hard limit's lapses a second or two
    // after its last hit).
    assert!(!domain_keys("alice").is_empty(), "{:?}", redis.keys(""));
    let (_, v, _) = call(&server, "GET", &counters("api", "alice"), Some(READ));
    assert_eq!(v["limits"][0]["remaining"], 0, "{v}");

    let (status, v, _) = call(&server, "DELETE", &counters("api", "alice"), Some(ADMIN));
    assert_eq!(status, 200, "{v}");
    assert!(domain_keys("alice").is_empty(), "{:?}", redis.keys(""));
    assert_eq!(request(&server, "api", "alice", 5)["granted"], 5);
    server.terminate();
}

/// In a gossip cluster (issue 18, item 5; it used to refuse): an
/// inspection reads the node's view, and a reset through any node wins on
/// every node. For each strategy, node 1 exhausts a key, node 2 resets it
/// over `DELETE /v1/counters` with an admin token; both nodes then grant
/// again and count each other's grants, and after rounds of gossip and
/// anti-entropy (digests compared and found equal) the old counts have not
/// come back.
#[test]
fn a_reset_through_one_node_of_a_gossip_cluster_wins_on_every_node() {
    let dir = Sandbox::new("counters-cluster");
    dir.write(
        "tollgate.yaml",
        "namespaces:\n  - name: shop\n    resources:\n      \
         - { name: api, algorithm: token_bucket, capacity: 5, rate: 1/h, replication: counter }\n      \
         - { name: q, algorithm: token_bucket, capacity: 5, rate: 1/h, replication: queue }\n      \
         - { name: e, algorithm: token_bucket, capacity: 5, rate: 1/h, replication: epoch }\n",
    );
    dir.write("secret", "an end-to-end test secret, long enough\n");
    dir.write("admin-tokens", format!("admin:ops:{ADMIN}\n"));
    let extra = [
        "--admin-tokens-file",
        "admin-tokens",
        "--anti-entropy-ms",
        "200",
    ];
    let n1 = Serving::start_node(&dir, "t", "n1", "127.0.0.1:0", &[], &extra);
    let n2 = Serving::start_node(&dir, "t", "n2", "127.0.0.1:0", &[n1.gossip()], &extra);
    let nodes = [&n1, &n2];
    for node in nodes {
        node.poll("the cluster forms", |s| {
            s.http("GET", "/readyz", None).0 == 200
                && s.metric("tollgate_cluster_peers_alive") == Some(1.0)
        });
    }
    let seen = |node: &Serving, resource: &str| -> i64 {
        let (status, v, _) = call(node, "GET", &counters(resource, "alice"), Some(ADMIN));
        assert_eq!(status, 200, "{v}");
        v["limits"][0]["remaining"].as_i64().unwrap()
    };
    let converge = |resource: &str, want: i64| {
        for node in nodes {
            node.poll(
                &format!("{resource}: remaining {want} on every node"),
                |s| seen(s, resource) == want,
            );
        }
    };
    let agreed = |node: &Serving| {
        node.metric("tollgate_gossip_anti_entropy_total{outcome=\"agreed\"}")
            .unwrap_or(0.0)
    };
    for resource in ["api", "q", "e"] {
        assert_eq!(request(&n1, resource, "alice", 5)["granted"], 5);
        assert_eq!(request(&n1, resource, "alice", 1)["allowed"], false);
        converge(resource, 0);

        let (status, v, _) = call(&n2, "DELETE", &counters(resource, "alice"), Some(ADMIN));
        assert_eq!(status, 200, "{resource}: {v}");
        assert_eq!(v["reset"], 1, "{resource}: {v}");
        assert_eq!(seen(&n2, resource), 5, "{resource}: the resetting node");
        converge(resource, 5);

        // Both grant again; each counts the other's grant.
        for node in nodes {
            assert_eq!(
                request(node, resource, "alice", 1)["granted"],
                1,
                "{resource}"
            );
        }
        converge(resource, 3);
        // Rounds of anti-entropy later (each node compared digests with
        // the other and found them equal, twice more), nothing old is back.
        for node in nodes {
            let before = agreed(node);
            node.poll("two more anti-entropy rounds agree", |s| {
                agreed(s) >= before + 2.0
            });
        }
        for node in nodes {
            assert_eq!(seen(node, resource), 3, "{resource}: old counts came back");
        }
        assert_eq!(
            request(&n1, resource, "alice", 3)["granted"],
            3,
            "{resource}"
        );
        assert_eq!(
            request(&n1, resource, "alice", 1)["allowed"],
            false,
            "{resource}"
        );
    }
    n2.terminate();
    n1.terminate();
}
