//! The client library and the client subcommands against real `tollgate
//! serve` processes on free ports: Charon's backoff on a controllable
//! clock, fail-open when the server dies and recovery when it returns,
//! holds released on drop, on panic and by the server when a client
//! process is killed, transfers between processes and between servers
//! (Redis), multi-resource acquisition leaving nothing held on failure,
//! the kill switch, TLS, and the CLI's exit codes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::serving::Serving;
use common::Sandbox;
use serde_json::Value;
use tollgate_client::backoff::{Backoff, Sleep, Timer};
use tollgate_client::{Client, ClientConfig, Error, FailureKind, Hold, Rejected, Tls, Via};

const CONFIG: &str = r#"
namespaces:
  - name: app
    resources:
      - { name: hourly, algorithm: token_bucket, capacity: 1, rate: 1/h }
      - { name: fast, algorithm: gcra, rate: 10/s, burst: 1 }
      - { name: api, algorithm: token_bucket, capacity: 1000, rate: 1000/s }
      - { name: pool, kind: concurrency, domain_limit: 3 }
      - { name: pool2, kind: concurrency, domain_limit: 2 }
"#;

fn serve(dir: &Sandbox, extra: &[&str]) -> Serving {
    let config = dir.write("tollgate.yaml", CONFIG);
    Serving::start_config(dir, &config, extra, &[])
}

/// `tollgate request app api acme --server server` plus `extra`.
fn request_cli(dir: &Sandbox, server: &str, extra: &[&str]) -> common::Run {
    let mut args = vec!["request", "app", "api", "acme", "--server", server];
    args.extend_from_slice(extra);
    dir.run(&args)
}

/// A request for 5 hits of `api`, at least 2, which is answered.
async fn five_at_least_two(client: &Client) -> tollgate_client::Grant {
    client
        .request("app", "api", "acme")
        .hits(5)
        .min_hits(2)
        .send()
        .await
        .unwrap()
}

/// A clock that sleeps instantly and remembers every sleep.
#[derive(Default)]
struct ManualClock {
    now: AtomicU64,
    sleeps: Mutex<Vec<Duration>>,
}

impl Timer for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now.load(Ordering::SeqCst))
    }

    fn sleep(&self, d: Duration) -> Sleep {
        self.sleeps.lock().unwrap().push(d);
        self.now
            .fetch_add(u64::try_from(d.as_nanos()).unwrap(), Ordering::SeqCst);
        Box::pin(std::future::ready(()))
    }
}

fn config(server: &Serving) -> ClientConfig {
    let mut c = ClientConfig::new([server.grpc.to_string()]);
    c.kill_switch = false;
    c.reconnect_base = Duration::from_millis(20);
    c.reconnect_max = Duration::from_millis(200);
    c
}

fn client(server: &Serving) -> Client {
    Client::new(config(server)).unwrap()
}

fn manual(server: &Serving, base: Duration) -> (Client, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    let mut c = config(server);
    c.backoff = Backoff { base };
    c.timer = clock.clone();
    (Client::new(c).unwrap(), clock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_back_off_exponentially_with_jitter_until_max_wait() {
    let dir = Sandbox::new("client-backoff");
    let server = serve(&dir, &[]);
    let base = Duration::from_millis(100);
    let (client, clock) = manual(&server, base);
    // The bucket's one token; after it, the next is an hour away, so the
    // backoff (not retry_after) sets every sleep.
    let first = client
        .request("app", "hourly", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!((first.granted, first.via), (1, Via::Server));

    let max_wait = Duration::from_secs(2);
    let err = client
        .request("app", "hourly", "acme")
        .max_wait(max_wait)
        .send()
        .await
        .unwrap_err();
    let sleeps = clock.sleeps.lock().unwrap().clone();
    // Charon §3.2: after the i-th failure, min(max_wait − elapsed,
    // jitter(2^i · base)), jitter within a quarter either way.
    let mut elapsed = Duration::ZERO;
    for (i, s) in sleeps.iter().enumerate() {
        let v = base * (1 << (i + 1));
        let left = max_wait - elapsed;
        let low = (v - v / 4).min(left);
        let high = (v + v / 4).min(left);
        assert!(
            *s >= low && *s <= high,
            "sleep {i}: {s:?} not in [{low:?}, {high:?}]"
        );
        elapsed += *s;
    }
    // 200 + 400 + 800 ms nominal, then what is left of the 2 s.
    assert!((3..=5).contains(&sleeps.len()), "{sleeps:?}");
    assert_eq!(elapsed, max_wait, "the sleeps stop exactly at max_wait");
    let Error::Rejected(r) = err else {
        panic!("{err:?}")
    };
    assert_eq!(r.attempts as usize, sleeps.len() + 1);
    assert_eq!(r.waited, max_wait);
    let Rejected::Rate(last) = &r.last else {
        panic!()
    };
    assert!(!last.allowed && last.retry_after_ns.unwrap() > 3_000_000_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sooner_retry_after_is_honoured_and_never_is_not_retried() {
    let dir = Sandbox::new("client-retry-after");
    let server = serve(&dir, &[]);
    // Base 1 s, but the GCRA says 100 ms at most.
    let (client, clock) = manual(&server, Duration::from_secs(1));
    client.request("app", "fast", "acme").send().await.unwrap();
    let _ = client
        .request("app", "fast", "acme")
        .max_wait(Duration::from_millis(300))
        .send()
        .await;
    let sleeps = clock.sleeps.lock().unwrap().clone();
    assert!(!sleeps.is_empty());
    assert!(
        sleeps.iter().all(|s| *s <= Duration::from_millis(100)),
        "{sleeps:?}"
    );

    // More hits than the bucket holds: the server says never; no retry.
    clock.sleeps.lock().unwrap().clear();
    let err = client
        .request("app", "hourly", "acme")
        .hits(5)
        .max_wait(Duration::from_secs(60))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.rejection().unwrap().attempts, 1);
    assert!(clock.sleeps.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_open_while_the_server_is_dead_and_recovers_when_it_returns() {
    let dir = Sandbox::new("client-fail-open");
    let mut server = serve(&dir, &[]);
    let addr = server.grpc;
    let client = client(&server);
    let strict = {
        let mut c = config(&server);
        c.fail_open = false;
        Client::new(c).unwrap()
    };
    let g = five_at_least_two(&client).await;
    assert_eq!((g.granted, g.via), (5, Via::Server));

    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let g = five_at_least_two(&client).await;
    assert_eq!(
        (g.granted, g.via),
        (2, Via::Degraded),
        "the minimum, marked"
    );
    assert!(g.response.is_none());
    let h = client
        .hold("app", "pool", "acme")
        .copies(3)
        .min_copies(1)
        .send()
        .await
        .unwrap();
    assert_eq!((h.copies(), h.via()), (1, Via::Degraded));
    assert!(matches!(
        strict.request("app", "api", "acme").send().await,
        Err(Error::Unavailable(_))
    ));

    // The server comes back on the same port: service resumes by itself.
    let config = dir.path("tollgate.yaml");
    let grpc = addr.to_string();
    let _back = Serving::start(
        &dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--grpc",
            &grpc,
            "--http",
            "127.0.0.1:0",
        ],
        &[],
    );
    let mut via = Via::Degraded;
    for _ in 0..100 {
        via = client
            .request("app", "api", "acme")
            .send()
            .await
            .unwrap()
            .via;
        if via == Via::Server {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(via, Via::Server);
}

/// A hold on `copies` of `resource` for `acme`, which the server grants.
async fn granted_hold(client: &Client, resource: &str, copies: u64) -> Hold {
    client
        .hold("app", resource, "acme")
        .copies(copies)
        .send()
        .await
        .unwrap()
}

/// Whether `copies` of `resource` can be reserved now (released at once).
async fn can_hold(client: &Client, resource: &str, copies: u64) -> bool {
    match client
        .hold("app", resource, "acme")
        .copies(copies)
        .send()
        .await
    {
        Ok(h) => {
            assert_eq!(h.via(), Via::Server);
            h.release_all().await.unwrap();
            true
        }
        Err(Error::Rejected(_)) => false,
        Err(e) => panic!("{e:?}"),
    }
}

/// Waits until `copies` can be reserved (a release on drop is sent
/// without waiting for its answer).
async fn eventually_holds(client: &Client, resource: &str, copies: u64) {
    let what = format!("{copies} copies of {resource} come free");
    tollgate_testing::eventually_async(&what, Duration::from_secs(5), move || async move {
        if can_hold(client, resource, copies).await {
            Ok(())
        } else {
            Err("a reserve is rejected".to_owned())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_are_released_in_part_on_drop_and_on_panic() {
    let dir = Sandbox::new("client-holds");
    let server = serve(&dir, &[]);
    let client = client(&server);
    let other = crate::client(&server);

    let mut hold = granted_hold(&client, "pool", 3).await;
    assert_eq!(hold.copies(), 3);
    assert_eq!(hold.response().unwrap().domain_limit, 3);
    assert!(!can_hold(&other, "pool", 1).await);
    assert_eq!(hold.release(2).await.unwrap(), 1);
    assert!(can_hold(&other, "pool", 2).await);
    assert!(!can_hold(&other, "pool", 3).await);
    assert!(matches!(hold.release(2).await, Err(Error::Invalid(_))));
    drop(hold);
    eventually_holds(&other, "pool", 3).await;

    let c = client.clone();
    let task = tokio::spawn(async move {
        let _hold = granted_hold(&c, "pool", 3).await;
        panic!("the work failed while holding");
    });
    assert!(task.await.unwrap_err().is_panic());
    eventually_holds(&other, "pool", 3).await;
}

/// Polls `f` once, then drops it: a caller that gives up mid-flight.
async fn once<F: std::future::Future>(f: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        out = f => Some(out),
        _ = std::future::ready(()) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_abandoned_mid_flight_leave_nothing_held() {
    let dir = Sandbox::new("client-abandoned");
    let server = serve(&dir, &[]);
    let client = client(&server);
    let other = crate::client(&server);
    // Open the session, so the next calls send at their first poll.
    client.request("app", "api", "acme").send().await.unwrap();

    // A reserve whose caller gives up before the answer: the grant that
    // arrives later is released by the session.
    let abandoned = once(client.hold("app", "pool", "acme").copies(3).send()).await;
    assert!(
        abandoned.is_none(),
        "the answer cannot come within one poll"
    );
    eventually_holds(&other, "pool", 3).await;

    // A release whose caller gives up: the hold's count is already down,
    // so the drop releases only the rest, and all three come free (a
    // release of all three would be refused once the one was released).
    let mut hold = granted_hold(&client, "pool", 3).await;
    let cancelled = once(hold.release(1)).await;
    assert!(cancelled.is_none());
    assert_eq!(hold.copies(), 2);
    drop(hold);
    eventually_holds(&other, "pool", 3).await;

    // Asking for more than is held changes nothing.
    let mut c = granted_hold(&client, "pool", 2).await;
    assert!(matches!(
        c.transfer(3, Duration::from_secs(5)).await,
        Err(Error::Invalid(_))
    ));
    assert_eq!(c.copies(), 2);
    let id = c.transfer(2, Duration::from_secs(5)).await.unwrap();
    assert_eq!(c.copies(), 0);
    other.seize(&id).await.unwrap().release_all().await.unwrap();
    eventually_holds(&other, "pool", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_releases_what_a_killed_client_process_held() {
    let dir = Sandbox::new("client-killed");
    let server = serve(&dir, &[]);
    let grpc = server.grpc.to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "hold", "app", "pool", "acme", "--copies", "3", "--for", "1h", "--json",
        ])
        .args(["--server", &grpc])
        .env_remove("TOLLGATE_KILL_SWITCH")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let held: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(held["outcome"], "held");
    assert_eq!(held["copies"], 3);
    assert_eq!(held["via"], "server");
    let other = client(&server);
    assert!(!can_hold(&other, "pool", 1).await);
    child.kill().unwrap();
    child.wait().unwrap();
    eventually_holds(&other, "pool", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_transfer_between_two_processes_of_one_server() {
    let dir = Sandbox::new("client-transfer");
    let server = serve(&dir, &[]);
    let grpc = server.grpc.to_string();
    let out = dir.run(&[
        "transfer", "app", "pool", "acme", "--copies", "2", "--ttl", "30s", "--server", &grpc,
    ]);
    assert!(out.success(), "{out}");
    let id = out.stdout.trim().to_owned();
    assert_eq!(id.len(), 32, "{out}");
    // Staged copies still count: one of three is free.
    let other = client(&server);
    assert!(can_hold(&other, "pool", 1).await);
    assert!(!can_hold(&other, "pool", 2).await);

    let out = dir.run(&["seize", &id, "--json", "--server", &grpc]);
    assert!(out.success(), "{out}");
    let lines: Vec<Value> = common::json_lines(&out.stdout);
    assert_eq!(lines[0]["outcome"], "seized");
    assert_eq!(lines[0]["copies"], 2);
    assert_eq!(lines[1]["outcome"], "released");
    assert!(can_hold(&other, "pool", 3).await);
    // A transfer is seized once.
    let again = dir.run(&["seize", &id, "--server", &grpc]);
    assert_eq!(again.code, Some(2), "{again}");
    assert!(again.stderr.contains("unknown_transfer"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_transfer_between_two_servers_sharing_redis() {
    use tollgate_redis::testing::RedisServer;
    let redis = RedisServer::start();
    let dir = Sandbox::new("client-transfer-redis");
    dir.write("tollgate.yaml", CONFIG);
    let a = Serving::start_redis(&dir, &redis.url(), &[], &[]);
    let b = Serving::start_redis(&dir, &redis.url(), &[], &[]);
    let on_a = client(&a);
    let on_b = client(&b);
    let mut hold = granted_hold(&on_a, "pool", 3).await;
    let id = hold.transfer(2, Duration::from_secs(30)).await.unwrap();
    assert_eq!(hold.copies(), 1);
    let seized = on_b.seize(&id).await.unwrap();
    assert_eq!((seized.copies(), seized.resource()), (2, "pool"));
    assert!(!can_hold(&on_a, "pool", 1).await);
    drop(hold);
    seized.release_all().await.unwrap();
    eventually_holds(&on_a, "pool", 3).await;

    // Redis goes away: the server answers with a server error (not the
    // caller's fault), and the client fails open on it.
    let mut redis = redis;
    redis.kill();
    let mut patient = config(&a);
    patient.request_timeout = Duration::from_secs(30);
    let patient = Client::new(patient).unwrap();
    let g = patient
        .request("app", "api", "acme")
        .hits(4)
        .min_hits(1)
        .send()
        .await
        .unwrap();
    assert_eq!((g.granted, g.via), (1, Via::Degraded));
    let mut strict = config(&a);
    strict.request_timeout = Duration::from_secs(30);
    strict.fail_open = false;
    let err = Client::new(strict)
        .unwrap()
        .request("app", "api", "acme")
        .send()
        .await;
    let Err(Error::Unavailable(outage)) = err else {
        panic!("{err:?}")
    };
    let why = outage.to_string();
    assert!(why.contains("Unavailable"), "{why}");
    assert_eq!(outage.tried[0].kind, FailureKind::Server, "{outage:?}");

    // Review of issue 23: the CLI told to "check that a server runs at
    // --server" of a server that runs and answered with an error.
    let grpc = a.grpc.to_string();
    let out = request_cli(&dir, &grpc, &["--timeout-ms", "30000"]);
    assert_eq!(out.code, Some(0), "{out}");
    assert!(
        out.stderr.contains("the servers run but could not decide"),
        "{out}"
    );
    assert!(!out.stderr.contains("check that a server runs"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquiring_several_resources_trims_to_the_smallest_grant_and_leaves_nothing_on_failure() {
    let dir = Sandbox::new("client-acquire");
    let server = serve(&dir, &[]);
    let client = client(&server);
    let other = crate::client(&server);

    // pool grants 3, pool2 only 2 (pool is trimmed to 2), the hourly
    // bucket's single token trims both to 1.
    let got = client
        .acquire("acme")
        .copies_of("app", "pool")
        .copies_of("app", "pool2")
        .rate_of("app", "hourly")
        .count(3)
        .min(1)
        .send()
        .await
        .unwrap();
    assert_eq!(got.count, 1);
    assert_eq!(got.rate.as_ref().unwrap().granted, 1);
    let held: Vec<u64> = got.holds.iter().map(|h| h.copies()).collect();
    assert_eq!(held, vec![1, 1]);
    assert!(can_hold(&other, "pool", 2).await && !can_hold(&other, "pool", 3).await);
    assert!(can_hold(&other, "pool2", 1).await && !can_hold(&other, "pool2", 2).await);
    drop(got);
    eventually_holds(&other, "pool", 3).await;
    eventually_holds(&other, "pool2", 2).await;

    // The bucket is empty now: the acquisition fails at its last step and
    // gives back both holds it had taken.
    let err = client
        .acquire("acme")
        .copies_of("app", "pool")
        .copies_of("app", "pool2")
        .rate_of("app", "hourly")
        .count(2)
        .send()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Rejected(_)), "{err:?}");
    assert!(can_hold(&other, "pool", 3).await);
    assert!(can_hold(&other, "pool2", 2).await);

    let two = client
        .acquire("acme")
        .rate_of("app", "api")
        .rate_of("app", "fast")
        .send()
        .await;
    assert!(matches!(two, Err(Error::Invalid(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_switch_turns_rejections_into_marked_grants() {
    let dir = Sandbox::new("client-kill-switch");
    let server = serve(&dir, &[]);
    let mut c = config(&server);
    c.kill_switch = true;
    let killed = Client::new(c).unwrap();
    client(&server)
        .request("app", "hourly", "acme")
        .send()
        .await
        .unwrap();
    let g = killed
        .request("app", "hourly", "acme")
        .hits(1)
        .send()
        .await
        .unwrap();
    assert_eq!((g.granted, g.via), (1, Via::KillSwitch));
    assert!(
        !g.response.unwrap().allowed,
        "the server's rejection is kept"
    );
    client(&server)
        .hold("app", "pool", "acme")
        .copies(3)
        .send()
        .await
        .map(std::mem::forget)
        .unwrap();
    let h = killed
        .hold("app", "pool", "acme")
        .copies(2)
        .min_copies(1)
        .send()
        .await
        .unwrap();
    assert_eq!((h.copies(), h.via()), (1, Via::KillSwitch));

    // The CLI: the environment variable turns it on.
    let grpc = server.grpc.to_string();
    let run = |kill: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.args([
            "request", "app", "hourly", "acme", "--json", "--server", &grpc,
        ])
        .env_remove("TOLLGATE_KILL_SWITCH");
        if let Some(v) = kill {
            cmd.env("TOLLGATE_KILL_SWITCH", v);
        }
        let out = cmd.output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code(), v)
    };
    let (code, v) = run(None);
    assert_eq!(
        (code, v["outcome"].as_str()),
        (Some(1), Some("rejected")),
        "{v}"
    );
    let (code, v) = run(Some("1"));
    assert_eq!(
        (code, v["outcome"].as_str()),
        (Some(0), Some("granted")),
        "{v}"
    );
    assert_eq!(v["via"], "kill_switch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_exits_0_granted_1_rejected_2_error() {
    let dir = Sandbox::new("client-cli");
    let server = serve(&dir, &[]);
    let grpc = server.grpc.to_string();
    let request = |extra: &[&str]| {
        let mut args = vec!["request", "app", "hourly", "acme", "--server", &grpc];
        args.extend_from_slice(extra);
        dir.run(&args)
    };
    let out = request(&["--json"]);
    assert_eq!(out.code, Some(0), "{out}");
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(
        (v["granted"].as_u64(), v["via"].as_str()),
        (Some(1), Some("server"))
    );
    let out = request(&[]);
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stdout.starts_with("rejected after 1 attempt"), "{out}");
    let out = dir.run(&["request", "app", "nope", "acme", "--server", &grpc]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(out.stderr.contains("unknown_resource"), "{out}");
    let out = request(&["--hits", "1", "--min-hits", "2"]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(
        out.stderr.contains("min_hits 2 is more than hits 1"),
        "{out}"
    );

    let out = dir.run(&["status", "--json", "--server", &grpc]);
    assert_eq!(out.code, Some(0), "{out}");
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["store"], "memory");
    assert_eq!(v["ready"], true);
    assert_eq!(v["config_revision"], 1);
    assert!(v["config_source"]
        .as_str()
        .unwrap()
        .ends_with("tollgate.yaml"));
    // Nobody listens here: fail-open off makes it an error.
    let dead = format!("127.0.0.1:{}", tollgate_redis::testing::free_port());
    let out = request_cli(&dir, &dead, &["--no-fail-open"]);
    assert_eq!(out.code, Some(2), "{out}");
    let out = request_cli(&dir, &dead, &["--json"]);
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.stdout.contains("\"via\":\"degraded\""), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_clients_certificate() {
    let certs = tollgate_redis::testing::TestCerts::generate();
    let dir = Sandbox::new("client-tls");
    let (cert, key, ca) = dir.write_server_tls(&certs, "server");
    let server = serve(
        &dir,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-client-ca",
            ca.to_str().unwrap(),
        ],
    );
    let tls = |identity: bool| {
        let mut c = config(&server);
        c.endpoints = vec![format!("https://localhost:{}", server.grpc.port())];
        c.fail_open = false;
        c.tls = Some(Tls {
            ca: Some(certs.ca.clone().into_bytes()),
            domain: None,
            identity: identity.then(|| {
                (
                    certs.client_cert.clone().into_bytes(),
                    certs.client_key.clone().into_bytes(),
                )
            }),
        });
        Client::new(c).unwrap()
    };
    let g = tls(true)
        .request("app", "api", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(g.via, Via::Server);
    // Refused for want of a certificate: a TLS failure, not an outage.
    let refused = tls(false).request("app", "api", "acme").send().await;
    assert!(matches!(refused, Err(Error::Tls(_))), "{refused:?}");
    // The CLI with files.
    let client_cert = dir.write("client.pem", &certs.client_cert);
    let client_key = dir.write("client.key", &certs.client_key);
    let out = request_cli(
        &dir,
        &format!("https://localhost:{}", server.grpc.port()),
        &[
            "--no-fail-open",
            "--tls-ca",
            ca.to_str().unwrap(),
            "--tls-cert",
            client_cert.to_str().unwrap(),
            "--tls-key",
            client_key.to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, Some(0), "{out}");
}

#[test]
fn the_blocking_client_holds_and_releases() {
    let dir = Sandbox::new("client-blocking");
    let server = serve(&dir, &[]);
    let client = tollgate_client::blocking::Client::new(config(&server)).unwrap();
    let g = client.request("app", "api", "acme", |r| r.hits(3)).unwrap();
    assert_eq!(g.granted, 3);
    let mut hold = client.hold("app", "pool", "acme", |h| h.copies(3)).unwrap();
    assert!(client.hold("app", "pool", "acme", |h| h.copies(1)).is_err());
    assert_eq!(hold.release(1).unwrap(), 2);
    drop(hold);
    let mut ok = false;
    for _ in 0..200 {
        if let Ok(h) = client.hold("app", "pool", "acme", |h| h.copies(3)) {
            h.release_all().unwrap();
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(ok, "the dropped hold was never released");
    let (_, status) = client.status().unwrap();
    assert_eq!(status.store, "memory");
}

/// Regression (issue 16, item 4): `serve --max-sessions 2` with two HTTP
/// holds of a day made `tollgate request` print `granted 1 via degraded`:
/// the client sent rate requests on a session, the server refused the
/// session as if it were down, and the client failed open, so filling one
/// server's session table switched limiting off for every client. Rate
/// requests need no session now, and a refusal is never taken for an
/// outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_session_table_refuses_holds_but_never_switches_limiting_off() {
    let dir = Sandbox::new("client-full-sessions");
    let full = serve(&dir, &["--max-sessions", "2"]);
    let squat = r#"{"namespace":"app","resource":"pool2","domain":"squatter","copies":1,"lease_ms":86400000}"#;
    for _ in 0..2 {
        let (status, v) = full.json("POST", "/v1/reserve", Some(squat));
        assert_eq!(status, 200, "{v}");
    }
    // A third hold over HTTP: refused as a refusal (429 with Retry-After),
    // not as an outage (503).
    let (status, text) = full.http("POST", "/v1/reserve", Some(squat));
    assert_eq!(status, 429, "{text}");
    let v: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(
        (v["error"]["reason"].as_str(), v["error"]["code"].as_i64()),
        (Some("too_many_sessions"), Some(8)),
        "{v}"
    );
    let raw = common::serving::exchange_raw(full.http, "POST", "/v1/reserve", Some(squat)).unwrap();
    assert!(
        raw.to_ascii_lowercase().contains("\r\nretry-after: 1\r\n"),
        "{raw}"
    );

    // The CLI gets real decisions: the bucket's one token, then a
    // rejection, never a degraded grant.
    let grpc = full.grpc.to_string();
    let out = dir.run(&["request", "app", "hourly", "acme", "--server", &grpc]);
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.stdout.contains("granted 1 via server"), "{out}");
    let out = dir.run(&["request", "app", "hourly", "acme", "--server", &grpc]);
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stdout.starts_with("rejected"), "{out}");

    // So does the library, fail-open on as by default.
    let client = client(&full);
    assert!(client.config().fail_open);
    let g = client
        .request("app", "hourly", "globex")
        .send()
        .await
        .unwrap();
    assert_eq!((g.granted, g.via), (1, Via::Server));
    let e = client.request("app", "hourly", "globex").send().await;
    assert!(matches!(e, Err(Error::Rejected(_))), "{e:?}");
    // A hold needs a session: refused with the reason, not granted
    // degraded.
    let e = client.hold("app", "pool", "acme").send().await;
    let Err(Error::AtCapacity { reason, message }) = e else {
        panic!("{e:?}")
    };
    assert_eq!(reason, "too_many_sessions");
    assert!(message.contains("2 at once"), "{message}");
    // The CLI's hold says so too, and exits with an error.
    let out = dir.run(&["hold", "app", "pool", "acme", "--server", &grpc]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(out.stderr.contains("too_many_sessions"), "{out}");

    // A refusing server is passed over for one with room.
    let roomy = serve(&dir, &[]);
    let mut both = config(&full);
    both.endpoints.push(roomy.grpc.to_string());
    let both = Client::new(both).unwrap();
    let hold = both.hold("app", "pool", "acme").send().await.unwrap();
    assert_eq!((hold.copies(), hold.via()), (1, Via::Server));
    hold.release_all().await.unwrap();
}

/// Regression (issue 23): with no server answering, `tollgate request`
/// printed `granted 1 via degraded; ` (an empty `; ` and no reason) and
/// nothing on stderr. It now names each server with its error, on stdout,
/// in `--json` and in a warning on stderr that says what to do.
#[test]
fn a_degraded_cli_grant_names_the_server_and_why() {
    let dir = Sandbox::new("client-cli-degraded");
    // Nothing listens there, and no server of another test will.
    let closed = tollgate_testing::refused_addr().to_string();
    let refused = |text: &str| text.to_lowercase().contains("connection refused");

    let out = dir.run(&["request", "app", "api", "acme", "--server", &closed]);
    assert_eq!(out.code, Some(0), "{out}");
    let line = out.stdout.trim_end();
    assert!(
        line.starts_with(&format!(
            "granted 1 via degraded (no server answered: {closed}: cannot connect: "
        )),
        "{out}"
    );
    assert!(line.ends_with(')') && refused(line), "{out}");
    assert!(
        out.stderr.starts_with(&format!(
            "warning: no tollgate server answered ({closed}: cannot connect: "
        )),
        "{out}"
    );
    assert!(refused(&out.stderr), "{out}");
    assert!(out.stderr.contains("--no-fail-open"), "{out}");
    assert!(
        out.stderr.contains("check that a server runs at --server"),
        "{out}"
    );

    let out = request_cli(&dir, &closed, &["--json"]);
    assert_eq!(out.code, Some(0), "{out}");
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["via"], "degraded", "{v}");
    assert_eq!(v["outage"][0]["server"], closed.as_str(), "{v}");
    assert_eq!(v["outage"][0]["kind"], "unreachable", "{v}");
    assert!(refused(v["outage"][0]["error"].as_str().unwrap()), "{v}");

    // Review of issue 23: with fail-open off, the JSON error only had the
    // outage's words, not each server and its error apart.
    let out = request_cli(&dir, &closed, &["--json", "--no-fail-open"]);
    assert_eq!(out.code, Some(2), "{out}");
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["outcome"], "error", "{v}");
    assert_eq!(v["outage"][0]["server"], closed.as_str(), "{v}");
    assert!(refused(v["outage"][0]["error"].as_str().unwrap()), "{v}");
    assert!(
        out.stderr.contains("check that a server runs at --server"),
        "{out}"
    );

    // Review of issue 23: a transfer of a degraded hold said only that it
    // cannot be transferred, not why no server held it.
    let out = dir.run(&["transfer", "app", "pool", "acme", "--server", &closed]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(out.stderr.contains("cannot be transferred"), "{out}");
    assert!(
        out.stderr.contains(&format!(
            "no tollgate server answered ({closed}: cannot connect: "
        )),
        "{out}"
    );

    let out = dir.run(&[
        "hold", "app", "pool", "acme", "--server", &closed, "--for", "0s",
    ]);
    assert_eq!(out.code, Some(0), "{out}");
    assert!(
        out.stdout.starts_with(&format!(
            "held 1 copies of app/pool for acme via degraded (no server answered: {closed}: "
        )),
        "{out}"
    );
    assert!(
        out.stderr.contains("warning: no tollgate server answered"),
        "{out}"
    );
}
