//! Calendar windows through the real binary: a monthly quota in a time
//! zone resets at local midnight of the first of the month, and every
//! answer's `reset_after_ns` is the real time to that edge, computed here
//! independently with the time zone database.
//!
//! The month's edge is reached without waiting a month: the server's clock
//! is shifted (the hidden `--clock-offset-ms` test hook) to stand a few
//! seconds before it, and the test polls until the quota resets. With
//! Redis, whose own clock decides, the answer is checked against the edge
//! as Redis's time (this machine's) sees it, for a month and for a year (a
//! year's reset may pass 2^53 ns, which the scripts send as seconds and
//! nanoseconds); a gossip cluster refuses calendar windows at startup
//! naming the resource.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::serving::{Serving, WAIT};
use common::Sandbox;
use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};
use serde_json::Value;
use tollgate_redis::testing::RedisServer;

const ZONE: &str = "Europe/Paris";

const CONFIG: &str = "\
namespaces:
  - name: billing
    resources:
      - { name: quota, algorithm: fixed_window, limit: 3, window: 1mo, align: calendar, timezone: Europe/Paris }
";

/// Now, in Unix nanoseconds, by this machine's clock.
fn now_ns() -> i128 {
    Timestamp::now().as_nanosecond()
}

/// The first instants of the next two months in `zone` after `t` (Unix
/// nanoseconds): local midnight of their first days.
fn next_month_edges(zone: &str, t: i128) -> (i128, i128) {
    let tz = TimeZone::get(zone).unwrap();
    let local = Timestamp::from_nanosecond(t)
        .unwrap()
        .to_zoned_datetime(tz.clone())
        .date();
    let first: Date = local.first_of_month();
    let edge = |months: i32| {
        first
            .checked_add(months.months())
            .unwrap()
            .to_zoned_datetime(tz.clone())
            .unwrap()
            .timestamp()
            .as_nanosecond()
    };
    (edge(1), edge(2))
}

/// `tollgate serve ARGS`, in the sandbox, without the caller's
/// environment.
fn serve_run(sb: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> common::Run {
    let mut all = vec!["serve"];
    all.extend_from_slice(args);
    common::run_clean(&sb.dir, &all, env)
}

fn ask(s: &Serving, hits: u64) -> (u16, Value) {
    ask_for(s, "quota", hits)
}

fn ask_for(s: &Serving, resource: &str, hits: u64) -> (u16, Value) {
    s.json(
        "POST",
        "/v1/request",
        Some(&format!(
            r#"{{"namespace":"billing","resource":"{resource}","domain":"acme","hits":{hits}}}"#
        )),
    )
}

/// The first instant of the year after the one holding `t` (Unix
/// nanoseconds) in `zone`: local midnight of the first of January.
fn next_new_year(zone: &str, t: i128) -> i128 {
    let tz = TimeZone::get(zone).unwrap();
    let year = Timestamp::from_nanosecond(t)
        .unwrap()
        .to_zoned_datetime(tz.clone())
        .year();
    Date::new(year + 1, 1, 1)
        .unwrap()
        .to_zoned_datetime(tz)
        .unwrap()
        .timestamp()
        .as_nanosecond()
}

fn reset(v: &Value) -> i128 {
    i128::from(v["reset_after_ns"].as_u64().unwrap())
}

/// Asserts that `what`, a time left until `edge` answered between the
/// server times `before` and `upto`, is exactly the time from then to the
/// edge: within `[edge - upto, edge - before]`.
fn assert_until_edge(what: &str, value: i128, edge: i128, (before, upto): (i128, i128)) {
    assert!(
        value <= edge - before && value >= edge - upto,
        "{what} {value} not within [{}, {}]",
        edge - upto,
        edge - before
    );
}

#[test]
fn a_monthly_quota_resets_at_local_midnight_of_the_first() {
    let sb = Sandbox::new("calendar-month");
    sb.write("tollgate.yaml", CONFIG);
    // Stand the server's clock three seconds before the next month's
    // edge in Paris.
    let (edge, after) = next_month_edges(ZONE, now_ns());
    let lead = 3_000_000_000i128;
    let offset_ms = (edge - lead - now_ns()) / 1_000_000;
    let offset = offset_ms.to_string();
    let s = Serving::start_config(
        &sb,
        &sb.path("tollgate.yaml"),
        &["--clock-offset-ms", &offset],
        &[],
    );
    // The server's time, as this test computes it, around each answer.
    let server_now = || now_ns() + offset_ms * 1_000_000;

    let before = server_now();
    let (status, v) = ask(&s, 3);
    let upto = server_now();
    assert_eq!((status, v["allowed"].as_bool()), (200, Some(true)), "{v}");
    assert_eq!(v["remaining"], 0);
    // The reset is the time left to the Paris midnight, not a month.
    assert_until_edge("reset", reset(&v), edge, (before, upto));
    let (status, v) = ask(&s, 1);
    assert_eq!((status, v["allowed"].as_bool()), (429, Some(false)), "{v}");
    assert_eq!(v["limited_by"], "limit");
    assert!(i128::from(v["retry_after_ns"].as_u64().unwrap()) <= lead);

    // At the edge the month's quota is whole again.
    let deadline = std::time::Instant::now() + WAIT;
    let v = loop {
        let before = server_now();
        let (status, v) = ask(&s, 1);
        if status == 200 {
            assert!(before <= edge + 1_000_000_000, "reset late: {v}");
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "never reset: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(v["remaining"], 2);
    // And the new window is the whole next month: 28 to 31 days, less or
    // more the hour of a clock change, as the database says.
    let now = server_now();
    assert!(
        reset(&v) <= after - edge && reset(&v) >= after - now,
        "reset {} for a month of {} ns",
        reset(&v),
        after - edge
    );
}

/// A calendar month through Envoy's rate-limit service (the Lyft format's
/// algorithm extension): the month's quota is all or nothing as any
/// limit, and `duration_until_reset` is the time left to the Paris
/// midnight, not a month.
#[test]
fn an_envoy_descriptor_takes_a_calendar_month() {
    use tollgate_proto::rls::rate_limit_descriptor::Entry;
    use tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient;
    use tollgate_proto::rls::{RateLimitDescriptor, RateLimitRequest};

    let sb = Sandbox::new("calendar-envoy");
    sb.write(
        "conf/envoy.yaml",
        "domain: billing\ndescriptors:\n  - key: tenant\n    rate_limit: \
         { algorithm: fixed_window, limit: 3, window: 1mo, align: calendar, timezone: Europe/Paris }\n",
    );
    let s = Serving::start_config(&sb, &sb.path("conf"), &[], &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut rls = RateLimitServiceClient::connect(format!("http://{}", s.grpc))
            .await
            .unwrap();
        let request = |hits: u32| RateLimitRequest {
            domain: "billing".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "tenant".into(),
                    value: "acme".into(),
                }],
                ..Default::default()
            }],
            hits_addend: hits,
        };
        let before = now_ns();
        let (edge, _) = next_month_edges(ZONE, before);
        let a = rls
            .should_rate_limit(request(3))
            .await
            .unwrap()
            .into_inner();
        let upto = now_ns();
        assert_eq!(a.overall_code, 1, "OK: {a:?}");
        let status = &a.statuses[0];
        assert_eq!(status.limit_remaining, 0, "{a:?}");
        let d = status.duration_until_reset.unwrap();
        let left = i128::from(d.seconds) * 1_000_000_000 + i128::from(d.nanos);
        assert_until_edge("duration_until_reset", left, edge, (before, upto));
        let a = rls
            .should_rate_limit(request(1))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(a.overall_code, 2, "OVER_LIMIT: {a:?}");
    });
}

#[test]
fn with_redis_the_reset_is_the_time_to_the_edge_by_redis_clock() {
    let redis = RedisServer::start();
    let sb = Sandbox::new("calendar-redis");
    sb.write("tollgate.yaml", CONFIG);
    let s = Serving::start_redis(&sb, &redis.url(), &[], &[]);
    loop {
        let before = now_ns();
        let (status, v) = ask(&s, 2);
        let upto = now_ns();
        assert_eq!(status, 200, "{v}");
        let (edge, _) = next_month_edges(ZONE, before);
        if next_month_edges(ZONE, upto).0 != edge {
            // The month changed during the call (a test run at midnight
            // of the first): its answer may be of either month.
            continue;
        }
        assert_until_edge("reset", reset(&v), edge, (before, upto));
        assert_eq!(v["remaining"], 1, "{v}");
        break;
    }
}

/// A yearly quota in Paris on Redis: the reset is the time to the next
/// Paris new year by Redis's clock (from January to mid-September more
/// than 2^53 ns, which the script sends as seconds and nanoseconds), and
/// a rejection's retry_after is the same. A server whose clock stands
/// three years ahead of Redis's gets its own year, whose end is always
/// past 2^53 ns from Redis's now. Before calendar years ran on Redis the
/// server refused this config at startup.
#[test]
fn with_redis_a_yearly_quota_resets_at_the_local_new_year() {
    let redis = RedisServer::start();
    let sb = Sandbox::new("calendar-redis-year");
    sb.write(
        "tollgate.yaml",
        "namespaces:\n  - name: billing\n    resources:\n      - { name: yearly, algorithm: fixed_window, limit: 2, window: 1y, align: calendar, timezone: Europe/Paris }\n",
    );
    let s = Serving::start_redis(&sb, &redis.url(), &[], &[]);
    loop {
        let before = now_ns();
        let (status, v) = ask_for(&s, "yearly", 2);
        let (refused, r) = ask_for(&s, "yearly", 1);
        let upto = now_ns();
        assert_eq!(status, 200, "{v}");
        let edge = next_new_year(ZONE, before);
        if next_new_year(ZONE, upto) != edge {
            // The year changed during the calls: their answers may be of
            // either year.
            continue;
        }
        assert_eq!(v["remaining"], 0, "{v}");
        assert_until_edge("reset", reset(&v), edge, (before, upto));
        assert_eq!(refused, 429, "{r}");
        let retry = i128::from(r["retry_after_ns"].as_u64().unwrap());
        assert_until_edge("retry_after", retry, edge, (before, upto));
        break;
    }
    drop(s);
    // This year's count stays in Redis (it would refuse the next hit):
    // start over.
    redis.command("FLUSHALL");

    // Three years ahead (a leap day at most in between): the server's
    // windows all lie after Redis's time, so the script takes the
    // server's own year.
    let ahead_ms: i128 = 3 * 365 * 86_400_000;
    let ahead = ahead_ms.to_string();
    let s = Serving::start_redis(&sb, &redis.url(), &["--clock-offset-ms", &ahead], &[]);
    loop {
        let before = now_ns();
        let (status, v) = ask_for(&s, "yearly", 1);
        let upto = now_ns();
        assert_eq!(status, 200, "{v}");
        let edge = next_new_year(ZONE, before + ahead_ms * 1_000_000);
        if next_new_year(ZONE, upto + ahead_ms * 1_000_000) != edge {
            continue;
        }
        assert!(edge - upto >= 1 << 53, "{edge}");
        assert_until_edge("reset", reset(&v), edge, (before, upto));
        break;
    }
}

#[test]
fn a_gossip_cluster_refuses_a_calendar_window_at_startup() {
    let sb = Sandbox::new("calendar-refused");
    sb.write(
        "year.yaml",
        "namespaces:\n  - name: billing\n    resources:\n      - { name: yearly, algorithm: fixed_window, limit: 9, window: 1y, align: calendar }\n",
    );
    sb.write("secret", "0123456789abcdef0123456789abcdef");
    // Redis counts a year (it refused one before calendar years ran).
    let redis = RedisServer::start();
    let url = redis.url();
    let run = serve_run(
        &sb,
        &["--check", "--config", "year.yaml", "--store", &url],
        &[],
    );
    assert_eq!(run.code, Some(0), "{run}");
    // A gossip cluster replicates no fixed window, calendar or not, and
    // sends the resource to Redis, which now counts a year too.
    let mut args = vec!["--check", "--config", "year.yaml"];
    args.extend_from_slice(&common::NODE_N1);
    let run = serve_run(&sb, &args, &[]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.stderr.contains(
            "namespace `billing`, resource `yearly`: `fixed_window` cannot be replicated in a gossip cluster"
        ) && run.stderr.contains("serve it from the Redis store"),
        "{}",
        run.stderr
    );
    // The memory store serves it.
    let run = serve_run(&sb, &["--check", "--config", "year.yaml"], &[]);
    assert_eq!(run.code, Some(0), "{run}");
}

/// `tollgate replay` decides a trace of Unix-epoch milliseconds by the
/// calendar: a Paris month's quota is spent two hours before its end,
/// refused at its last millisecond, and whole again at local midnight of
/// the 1st, with `reset_after_ms` the time to the edge, then April's 30
/// days.
#[test]
fn replay_crosses_a_month_edge_as_the_calendar_says() {
    let sb = Sandbox::new("calendar-replay");
    sb.write(
        "c.yaml",
        "namespaces:\n  - name: billing\n    resources:\n      - { name: quota, algorithm: fixed_window, limit: 2, window: 1mo, align: calendar, timezone: Europe/Paris }\n",
    );
    // 1 April 2024, 00:00 in Paris (summer time: 22:00 UTC the day before).
    let march = Timestamp::from_second(1_711_000_000)
        .unwrap()
        .as_nanosecond();
    let (edge, may) = next_month_edges(ZONE, march);
    let edge_ms = edge / 1_000_000;
    assert_eq!(edge_ms, 1_711_922_400_000);
    let trace = [(edge_ms - 7_200_000, 2), (edge_ms - 1, 1), (edge_ms, 1)]
        .iter()
        .map(|(t, hits)| {
            format!(r#"{{"time_ms": {t}, "domain": "acme", "hits": {hits}, "min_hits": {hits}}}"#)
        })
        .collect::<Vec<_>>()
        .join("\n");
    sb.write("t.jsonl", &trace);
    let run = sb.run(&[
        "replay",
        "-c",
        "c.yaml",
        "-t",
        "t.jsonl",
        "--summary",
        "none",
    ]);
    assert!(run.success(), "{run}");
    let (events, _) = common::split_events(&run.stdout);
    let pick = |e: &Value| {
        (
            e["allowed"].as_bool().unwrap(),
            e["remaining"].as_u64().unwrap(),
            e["reset_after_ms"].as_f64().unwrap(),
        )
    };
    assert_eq!(pick(&events[0]), (true, 0, 7_200_000.0), "{run}");
    assert_eq!(pick(&events[1]), (false, 0, 1.0), "{run}");
    assert_eq!(events[1]["retry_after_ms"], 1.0);
    let april_ms = ((may - edge) / 1_000_000) as f64;
    assert_eq!(april_ms, 30.0 * 86_400_000.0);
    assert_eq!(pick(&events[2]), (true, 1, april_ms), "{run}");
}
