//! `tollgate replay`, run as the real binary: per-event JSON lines in
//! order, the summary, malformed lines, strict mode, trace formats and
//! output options.

// Helpers outside #[test] fns are not covered by clippy.toml's
// allow-unwrap-in-tests; a failed unwrap here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::{example, json_lines, split_events, Run, Sandbox};
use serde_json::{json, Value};

/// Fields every rate-request event line carries (null when they do not
/// apply).
const RATE_FIELDS: &[&str] = &[
    "line",
    "time_ms",
    "namespace",
    "resource",
    "domain",
    "hits",
    "min_hits",
    "granted",
    "allowed",
    "limit",
    "remaining",
    "retry_after_ms",
    "reset_after_ms",
    "wait_ms",
    "tier",
    "burst",
    "limited_by",
    "algorithm",
];

const ONE_WINDOW: &str = "\
namespaces:
  - name: ns
    resources:
      - { name: r, algorithm: fixed_window, limit: 2, window: 1s }
";

/// `tollgate replay -c c.yaml -t t.jsonl` plus `extra`, in `sb`.
fn replay_t(sb: &Sandbox, extra: &[&str]) -> Run {
    let mut args = vec!["replay", "-c", "c.yaml", "-t", "t.jsonl"];
    args.extend_from_slice(extra);
    sb.run(&args)
}

/// A sandbox holding `c.yaml` ([`ONE_WINDOW`]) and the trace `text` in
/// `file`.
fn one_window_with_trace(name: &str, file: &str, text: &str) -> Sandbox {
    let sb = Sandbox::new(name);
    sb.write("c.yaml", ONE_WINDOW);
    sb.write(file, text);
    sb
}

fn field<'a>(e: &'a Value, name: &str) -> &'a Value {
    e.get(name).unwrap_or_else(|| panic!("no `{name}` in {e}"))
}

/// The events of one resource, in output order.
fn of<'a>(events: &'a [Value], resource: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["resource"] == resource)
        .collect()
}

#[test]
fn the_bundled_trace_replays_event_by_event_then_summarizes() {
    let sb = Sandbox::new("replay-example");
    let run = sb.run(&[
        "replay",
        "--config",
        &example("tollgate.yaml"),
        "--trace",
        &example("trace.jsonl"),
    ]);
    assert!(run.success(), "{run}");
    let (events, table) = split_events(&run.stdout);
    let trace_lines = std::fs::read_to_string(example("trace.jsonl"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(events.len(), trace_lines, "one line per event{run}");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(field(e, "line"), &json!(i + 1), "in order");
        if e.get("error").is_none() {
            for f in RATE_FIELDS {
                field(e, f);
            }
        }
    }

    // api: a token bucket of 100 refilled at 10/s, hit every 10ms for
    // 1.19s: the 100 initial tokens plus 11 refilled are granted.
    let api = of(&events, "api");
    assert_eq!(api.len(), 120);
    let granted: u64 = api.iter().map(|e| e["granted"].as_u64().unwrap()).sum();
    assert_eq!(granted, 111);
    assert_eq!(api[0]["time_ms"], json!(1000.0));
    assert_eq!(api[0]["remaining"], json!(99));
    assert_eq!(api[0]["algorithm"], "token_bucket");
    let first_rejection = api.iter().find(|e| e["allowed"] == false).unwrap();
    assert_eq!(first_rejection["limited_by"], "limit");
    assert!(first_rejection["retry_after_ms"].as_f64().unwrap() > 0.0);

    // login: burst tiers 10/1s then 50/10s. The first hit bursts into
    // tier 1, the 11th into tier 2.
    let login = of(&events, "login");
    assert_eq!(login.len(), 15);
    assert!(login.iter().all(|e| e["allowed"] == true));
    assert_eq!(
        (&login[0]["tier"], &login[0]["burst"]),
        (&json!(1), &json!(true))
    );
    for e in &login[1..10] {
        assert_eq!((&e["tier"], &e["burst"]), (&json!(1), &json!(false)), "{e}");
    }
    assert_eq!(login[9]["tier_hits"], json!(10));
    assert_eq!(login[10]["tier"], json!(2));
    assert_eq!(login[10]["burst"], json!(true));
    assert_eq!(login[10]["tier_limit"], json!(50));
    assert_eq!(login[10]["tier_hits"], json!(1));
    assert_eq!(login[11]["burst"], json!(false));
    // Charon §3.1's context: hard and global limits and hits last second.
    assert_eq!(login[10]["hard_limit"], json!(20));
    assert_eq!(login[10]["global_limit"], json!(1000));
    assert_eq!(login[10]["domain_hits_last_second"], json!(11));
    assert_eq!(login[10]["global_hits_last_second"], json!(11));

    // exact: a sliding log of 5 per 10s with a 100ms gap.
    let exact: Vec<bool> = of(&events, "exact")
        .iter()
        .map(|e| e["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(exact, [true, false, true, true, true, true, false]);

    // search: GCRA with burst 10: 10 of 25 granted (min 5), then nothing.
    let search = of(&events, "search");
    assert_eq!(
        (
            &search[0]["hits"],
            &search[0]["granted"],
            &search[0]["allowed"]
        ),
        (&json!(25), &json!(10), &json!(true))
    );
    assert_eq!(search[0]["limited_by"], "limit");
    assert_eq!(search[1]["granted"], json!(0));
    assert_eq!(search[1]["allowed"], json!(false));

    // queue: a leaky bucket of 10 at 5/s; each queued hit waits 200ms more.
    let queue = of(&events, "queue");
    let waits: Vec<f64> = queue
        .iter()
        .map(|e| e["wait_ms"].as_f64().unwrap())
        .collect();
    assert_eq!(
        waits,
        [0.0, 200.0, 400.0, 600.0, 800.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0, 0.0, 0.0]
    );
    assert_eq!(queue[10]["allowed"], json!(false));
    assert_eq!(queue[11]["allowed"], json!(false));

    // guava: acquire mode always grants.
    let guava = of(&events, "guava");
    assert_eq!(guava.len(), 4);
    assert!(guava
        .iter()
        .all(|e| e["allowed"] == true && e["granted"] == 1));

    // nope: an unknown resource is an error line, reported and skipped.
    let last = events.last().unwrap();
    assert_eq!(last["resource"], "nope");
    assert_eq!(last["reason"], "unknown_resource");
    assert!(
        run.stderr
            .contains("trace line 161: unknown resource `nope`"),
        "{run}"
    );

    // The table: a header, then per resource a total row and its domains.
    assert_eq!(
        table[0].split_whitespace().collect::<Vec<_>>(),
        [
            "namespace",
            "resource",
            "domain",
            "requests",
            "hits",
            "granted",
            "rejected",
            "errors"
        ]
    );
    let rows: Vec<Vec<&str>> = table[1..]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let row = |resource: &str, domain: &str| -> Vec<&str> {
        rows.iter()
            .find(|r| r[1] == resource && r[2] == domain)
            .unwrap_or_else(|| panic!("no row {resource}/{domain}{run}"))[3..]
            .to_vec()
    };
    assert_eq!(row("api", "*"), ["120", "120", "111", "9", "0"]);
    assert_eq!(row("api", "acme"), ["120", "120", "111", "9", "0"]);
    assert_eq!(row("search", "initech"), ["2", "30", "10", "1", "0"]);
    assert_eq!(row("queue", "*"), ["12", "12", "10", "2", "0"]);
    assert_eq!(row("nope", "*"), ["1", "1", "0", "0", "1"]);
}

/// Issue 23: a JSON array instead of JSON lines was skipped line by line
/// with serde's messages, and the run exited 0 having replayed nothing.
#[test]
fn a_json_array_is_refused_as_such_with_how_to_convert_it() {
    let sb = one_window_with_trace(
        "replay-array",
        "t.json",
        "\n[\n  {\"time_ms\": 1, \"domain\": \"a\"},\n  {\"time_ms\": 2, \"domain\": \"a\"}\n]\n",
    );
    let run = sb.run(&["replay", "-c", "c.yaml", "-t", "t.json"]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.stderr.contains(
            "trace line 2: the trace is a JSON array, but replay reads JSON lines, one object \
             per line (convert it with `jq -c '.[]' FILE`)"
        ),
        "{run}"
    );
    assert!(split_events(&run.stdout).0.is_empty(), "{run}");
}

#[test]
fn malformed_lines_are_reported_with_their_number_and_skipped() {
    let sb = Sandbox::new("replay-malformed");
    sb.write("c.yaml", ONE_WINDOW);
    let mut trace = Vec::new();
    trace.extend_from_slice(b"{\"time_ms\": 1, \"domain\": \"a\"}\n");
    trace.extend_from_slice(b"{\"time_ms\": 2, \"domain\": \n");
    trace.extend_from_slice(b"\n");
    trace.extend_from_slice(b"{\"time_ms\": 3, \"domain\": \"a\", \"hitz\": 1}\n");
    trace.extend_from_slice(b"{\"time_ms\": 4, \"domain\": \"\xff\xfe\"}\n");
    trace.extend_from_slice(b"{\"time_ms\": 5, \"domain\": \"a\"}\r\n");
    trace.extend_from_slice(b"{\"time_ms\": 6, \"domain\": \"a\"}");
    sb.write("t.jsonl", &trace);

    let run = replay_t(&sb, &[]);
    assert!(run.success(), "non-strict replay skips bad lines{run}");
    let (events, table) = split_events(&run.stdout);
    let lines: Vec<u64> = events.iter().map(|e| e["line"].as_u64().unwrap()).collect();
    assert_eq!(
        lines,
        [1, 6, 7],
        "line numbers count every physical line{run}"
    );
    let allowed: Vec<bool> = events
        .iter()
        .map(|e| e["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(allowed, [true, true, false]);
    let warnings: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(warnings.len(), 3, "{run}");
    assert!(warnings[0].contains("trace line 2:"), "{run}");
    assert!(warnings[1].contains("trace line 4:"), "{run}");
    assert!(warnings[1].contains("unknown field `hitz`"), "{run}");
    assert!(warnings[2].contains("trace line 5:"), "{run}");
    assert!(warnings.iter().all(|w| w.ends_with("(skipped)")), "{run}");
    assert_eq!(
        table.last().copied(),
        Some("3 malformed trace lines skipped"),
        "{run}"
    );

    // --strict stops at the first bad line: what came before is printed,
    // nothing after it.
    let run = replay_t(&sb, &["--strict"]);
    assert_eq!(run.code, Some(1), "{run}");
    let (events, rest) = split_events(&run.stdout);
    assert_eq!(events.len(), 1, "{run}");
    assert_eq!(events[0]["line"], json!(1));
    assert!(rest.is_empty(), "no summary after a strict failure{run}");
    assert!(run.stderr.contains("trace line 2:"), "{run}");
    assert!(!run.stderr.contains("trace line 4"), "{run}");

    // A line that is valid JSON but not valid UTF-8 stops a strict run too.
    sb.write(
        "utf8.jsonl",
        b"{\"time_ms\": 1, \"domain\": \"a\"}\n{\"time_ms\": 2, \"domain\": \"\xff\"}\n{\"time_ms\": 3, \"domain\": \"a\"}\n",
    );
    let run = sb.run(&["replay", "-c", "c.yaml", "-t", "utf8.jsonl", "--strict"]);
    assert_eq!(run.code, Some(1), "{run}");
    assert_eq!(split_events(&run.stdout).0.len(), 1, "{run}");
    assert!(run.stderr.contains("trace line 2:"), "{run}");
}

#[test]
fn failed_requests_are_error_lines_and_stop_a_strict_run() {
    let sb = one_window_with_trace(
        "replay-errors",
        "t.jsonl",
        "\
{\"time_ms\": 1, \"resource\": \"r\", \"domain\": \"a\"}
{\"time_ms\": 2, \"resource\": \"missing\", \"domain\": \"a\"}
{\"time_ms\": 3, \"resource\": \"r\", \"domain\": \"a\", \"mode\": \"acquire\"}
{\"time_ms\": 4, \"namespace\": \"other\", \"domain\": \"a\"}
{\"time_ms\": 5, \"resource\": \"r\", \"domain\": \"a\"}
",
    );
    let run = replay_t(&sb, &["--summary", "json", "-o", "events.jsonl"]);
    assert!(run.success(), "{run}");
    let events = json_lines(&sb.read("events.jsonl"));
    assert_eq!(events.len(), 5);
    assert_eq!(events[1]["reason"], "unknown_resource");
    assert_eq!(events[2]["reason"], "cannot_schedule");
    assert_eq!(events[3]["reason"], "unknown_namespace");
    assert_eq!(events[4]["allowed"], json!(true), "errors consumed nothing");
    assert_eq!(run.stderr.lines().count(), 3, "{run}");

    let run = replay_t(&sb, &["--strict"]);
    assert_eq!(run.code, Some(1), "{run}");
    let (events, rest) = split_events(&run.stdout);
    assert_eq!(events.len(), 2, "{run}");
    assert_eq!(events[1]["reason"], "unknown_resource");
    assert!(rest.is_empty(), "{run}");
    assert!(run.stderr.contains("trace line 2:"), "{run}");
}

#[test]
fn thesis_traces_replay_against_a_single_resource_config() {
    let sb = Sandbox::new("replay-thesis");
    sb.write("c.yaml", ONE_WINDOW);
    // The thesis exports `{"user_id", "time"}` with Unix milliseconds and
    // hexadecimal (or numeric) user ids.
    let t0 = 1_500_000_000_000u64;
    let trace: String = [
        (t0, "\"deadbeefdeadbeefdeadbeefdeadbeef\""),
        (t0 + 100, "\"deadbeefdeadbeefdeadbeefdeadbeef\""),
        (t0 + 200, "\"deadbeefdeadbeefdeadbeefdeadbeef\""),
        (t0 + 300, "42"),
        (t0 + 1_000, "\"deadbeefdeadbeefdeadbeefdeadbeef\""),
    ]
    .iter()
    .map(|(t, u)| format!("{{\"user_id\": {u}, \"time\": {t}}}\n"))
    .collect();
    sb.write("t.json", trace);
    let run = sb.run(&["replay", "-c", "c.yaml", "-t", "t.json"]);
    assert!(run.success(), "{run}");
    let (events, _) = split_events(&run.stdout);
    assert_eq!(events.len(), 5, "{run}");
    for e in &events {
        assert_eq!(
            (&e["namespace"], &e["resource"]),
            (&json!("ns"), &json!("r"))
        );
    }
    assert_eq!(events[0]["domain"], "deadbeefdeadbeefdeadbeefdeadbeef");
    assert_eq!(events[0]["time_ms"], json!(1_500_000_000_000.0));
    assert_eq!(events[3]["domain"], "42");
    let allowed: Vec<bool> = events
        .iter()
        .map(|e| e["allowed"].as_bool().unwrap())
        .collect();
    // Two per epoch-aligned second: t0 is a whole second.
    assert_eq!(allowed, [true, true, false, true, true]);

    // With two namespaces, the trace must say which one.
    sb.write(
        "two.yaml",
        format!("{ONE_WINDOW}  - name: other\n    resources: []\n"),
    );
    let run = sb.run(&["replay", "-c", "two.yaml", "-t", "t.json"]);
    assert!(run.success(), "{run}");
    // Each event still gets a line: an error line saying what is missing.
    let lines = split_events(&run.stdout).0;
    assert_eq!(lines.len(), 5, "{run}");
    assert!(
        lines.iter().all(|l| l["reason"] == "missing_namespace"),
        "{run}"
    );
    assert!(
        run.stderr.contains("trace line 1: `namespace` is required"),
        "{run}"
    );
}

#[test]
fn output_file_gets_the_events_and_stdout_the_table() {
    let sb = one_window_with_trace(
        "replay-output",
        "t.jsonl",
        "{\"time_ms\": 1, \"domain\": \"a\"}\n{\"time_ms\": 2, \"domain\": \"b\"}\n{\"time_ms\": 3, \"domain\": \"a\"}\n",
    );
    let run = replay_t(&sb, &["--output", "out.jsonl"]);
    assert!(run.success(), "{run}");
    assert!(
        run.stdout.starts_with("namespace "),
        "only the table on stdout{run}"
    );
    assert!(!run.stdout.contains('{'), "{run}");
    let events = json_lines(&sb.read("out.jsonl"));
    assert_eq!(events.len(), 3);
    let domains: Vec<&str> = events
        .iter()
        .map(|e| e["domain"].as_str().unwrap())
        .collect();
    assert_eq!(domains, ["a", "b", "a"]);

    // --no-events prints only the summary; --summary none only the events.
    let run = replay_t(&sb, &["--no-events"]);
    assert!(run.stdout.starts_with("namespace "), "{run}");
    let run = replay_t(&sb, &["--summary", "none"]);
    assert_eq!(json_lines(&run.stdout).len(), 3, "{run}");
}

#[test]
fn json_summary_parses_and_counts_every_domain() {
    let sb = one_window_with_trace(
        "replay-json",
        "t.jsonl",
        "\
{\"time_ms\": 1, \"domain\": \"a\", \"hits\": 3, \"min_hits\": 1}
{\"time_ms\": 2, \"domain\": \"b\"}
{\"time_ms\": 3, \"domain\": \"a\"}
not json
",
    );
    let (_, doc) = summary_json(&sb);
    assert_eq!(doc["malformed"], json!(1));
    assert_eq!(
        doc["rows"],
        json!([
            {"namespace": "ns", "resource": "r", "domain": "a",
             "requests": 2, "hits": 4, "granted": 2, "rejected": 1, "errors": 0},
            {"namespace": "ns", "resource": "r", "domain": "b",
             "requests": 1, "hits": 1, "granted": 1, "rejected": 0, "errors": 0},
        ])
    );
}

/// Issue 18 item 3 in tollgate's own trace format: a gateway's check
/// before, its report after (charged past the limit, clamped at
/// `max_debt`, never refused), the debt refusing the next check, and a
/// refund paying it, each line replayed as a server decides it.
#[test]
fn report_and_refund_lines_replay_as_the_server_decides_them() {
    let sb = Sandbox::new("replay-usage");
    sb.write(
        "c.yaml",
        "namespaces:\n  - name: llm\n    resources:\n      \
         - { name: tokens, algorithm: token_bucket, capacity: 1000, rate: 1000/1d, max_debt: 500 }\n",
    );
    sb.write(
        "t.jsonl",
        "\
{\"time_ms\": 1, \"domain\": \"a\", \"hits\": 100}
{\"time_ms\": 2, \"domain\": \"a\", \"hits\": 1200, \"mode\": \"report\"}
{\"time_ms\": 3, \"domain\": \"a\", \"hits\": 1}
{\"time_ms\": 4, \"domain\": \"a\", \"hits\": 1000, \"mode\": \"report\"}
{\"time_ms\": 5, \"domain\": \"a\", \"hits\": 600, \"mode\": \"refund\"}
{\"time_ms\": 6, \"domain\": \"a\", \"hits\": 100}
",
    );
    let run = replay_t(&sb, &[]);
    assert!(run.success(), "{run}");
    let (events, _) = split_events(&run.stdout);
    let got: Vec<(bool, u64)> = events
        .iter()
        .map(|e| {
            (
                e["allowed"].as_bool().unwrap(),
                e["granted"].as_u64().unwrap(),
            )
        })
        .collect();
    // Checked 100; reported 1200 (300 owed); refused while owing; 200 of
    // 1000 charged, up to the 500 the bound allows; 600 given back (100
    // left); 100 granted.
    assert_eq!(
        got,
        [
            (true, 100),
            (true, 1200),
            (false, 0),
            (true, 200),
            (true, 600),
            (true, 100)
        ],
        "{run}"
    );
}

/// Replays `t.jsonl` against `c.yaml` printing only the JSON summary, which
/// must parse; the run is returned for further checks.
fn summary_json(sb: &Sandbox) -> (Run, Value) {
    let run = replay_t(sb, &["--no-events", "--summary", "json"]);
    assert!(run.success(), "{run}");
    let doc: Value = serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}{run}"));
    (run, doc)
}

const MESSAGING: &str = include_str!("../../../examples/envoy-messaging.yaml");

#[test]
fn descriptor_traces_replay_against_an_envoy_config() {
    let sb = Sandbox::new("replay-envoy");
    sb.write("envoy.yaml", MESSAGING);
    let both = r#"[[{"key": "message_type", "value": "marketing"}, {"key": "to_number", "value": "4145551234"}], [{"key": "to_number", "value": "4145551234"}]]"#;
    let mut trace = String::new();
    for i in 0..6 {
        trace.push_str(&format!("{{\"time_ms\": {i}, \"descriptors\": {both}}}\n"));
    }
    trace.push_str(
        "{\"time_ms\": 10, \"namespace\": \"messaging\", \"descriptors\": [{\"key\": \"to_number\", \"value\": \"4145551234\"}]}\n",
    );
    trace
        .push_str("{\"time_ms\": 11, \"descriptors\": [{\"key\": \"other\", \"value\": \"x\"}]}\n");
    sb.write("t.jsonl", trace);
    let run = sb.run(&["replay", "-c", "envoy.yaml", "-t", "t.jsonl"]);
    assert!(run.success(), "{run}");
    let (events, _) = split_events(&run.stdout);
    assert_eq!(events.len(), 8, "{run}");
    for e in &events[..5] {
        assert_eq!(e["allowed"], json!(true), "{e}");
        assert_eq!(e["namespace"], "messaging");
        assert_eq!(e["descriptors"].as_array().unwrap().len(), 2);
    }
    let marketing = &events[4]["descriptors"][0];
    assert_eq!(marketing["resource"], "message_type_marketing.to_number");
    assert_eq!(
        marketing["domain"],
        "message_type=marketing/to_number=4145551234"
    );
    assert_eq!(
        (&marketing["limit"], &marketing["remaining"]),
        (&json!(5), &json!(0))
    );
    // The sixth is over the marketing limit; the per-number limit is not.
    let sixth = &events[5];
    assert_eq!(sixth["allowed"], json!(false));
    assert_eq!(sixth["descriptors"][0]["allowed"], json!(false));
    assert_eq!(sixth["descriptors"][1]["allowed"], json!(true));
    // All or nothing: the rejected request did not count per number.
    let alone = &events[6]["descriptors"][0];
    assert_eq!(alone["resource"], "to_number");
    assert_eq!(alone["remaining"], json!(100 - 6));
    // No match: OK, no limit.
    assert_eq!(events[7]["allowed"], json!(true));
    assert_eq!(events[7]["descriptors"][0]["resource"], Value::Null);
}

#[test]
fn the_trace_may_come_from_stdin_and_times_keep_microseconds() {
    let sb = Sandbox::new("replay-stdin");
    // One token per millisecond: whether a hit fits depends on fractions of
    // a millisecond.
    sb.write(
        "c.yaml",
        "namespaces:\n  - name: ns\n    resources:\n      - { name: r, algorithm: token_bucket, capacity: 1, rate: 1000/s }\n",
    );
    let trace = "\
{\"time_ms\": 1234.567, \"domain\": \"a\"}
{\"time_ms\": 1235.5, \"domain\": \"a\"}
{\"time_ms\": 1235.567, \"domain\": \"a\"}
{\"time_ms\": 2000.0004, \"domain\": \"b\"}
";
    let run = sb.run_with_stdin(
        &["replay", "-c", "c.yaml", "--trace", "-"],
        trace.as_bytes(),
    );
    assert!(run.success(), "{run}");
    let (events, table) = split_events(&run.stdout);
    let times: Vec<f64> = events
        .iter()
        .map(|e| e["time_ms"].as_f64().unwrap())
        .collect();
    assert_eq!(times, [1234.567, 1235.5, 1235.567, 2000.0]);
    let allowed: Vec<bool> = events
        .iter()
        .map(|e| e["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(allowed, [true, false, true, true]);
    assert_eq!(events[1]["retry_after_ms"], json!(0.067));
    assert!(table[0].starts_with("namespace "), "{run}");
}

#[test]
fn replay_refuses_an_invalid_config_or_a_missing_trace() {
    let sb = Sandbox::new("replay-refuse");
    sb.write(
        "bad.yaml",
        "namespaces:\n  - name: ns\n    resources:\n      - { name: r, algorithm: nope }\n",
    );
    sb.write("c.yaml", ONE_WINDOW);
    sb.write("t.jsonl", "{\"time_ms\": 1, \"domain\": \"a\"}\n");
    let run = sb.run(&["replay", "-c", "bad.yaml", "-t", "t.jsonl"]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(run.stderr.starts_with("error: bad.yaml:4:"), "{run}");
    assert_eq!(run.stdout, "", "{run}");
    let run = sb.run(&["replay", "-c", "c.yaml", "-t", "missing.jsonl"]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(run.stderr.contains("missing.jsonl"), "{run}");
}

/// A deterministic pseudo-random sequence (a 64-bit LCG), so the generated
/// trace is the same on every run without a `rand` dependency.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[test]
fn a_large_generated_trace_matches_a_reference_fixed_window() {
    const LINES: u64 = 100_000;
    const LIMIT: u64 = 7;
    const WINDOW_MS: u64 = 50;
    let sb = Sandbox::new("replay-large");
    sb.write(
        "c.yaml",
        format!(
            "namespaces:\n  - name: ns\n    resources:\n      - {{ name: r, algorithm: fixed_window, limit: {LIMIT}, window: {WINDOW_MS}ms }}\n"
        ),
    );
    // Reference: per domain, the epoch-aligned window and its count; a
    // request is granted the most of [min_hits, hits] that fits, or nothing.
    #[derive(Default)]
    struct Row {
        requests: u64,
        hits: u64,
        granted: u64,
        rejected: u64,
        window: u64,
        count: u64,
    }
    let mut reference: BTreeMap<String, Row> = BTreeMap::new();
    let mut rng = Lcg(7);
    let mut trace = String::with_capacity(LINES as usize * 64);
    let mut t = 1_700_000_000_000u64;
    for _ in 0..LINES {
        t += rng.below(3);
        let domain = format!("d{}", rng.below(40));
        let hits = 1 + rng.below(3);
        let min_hits = if rng.below(2) == 0 { hits } else { 1 };
        trace.push_str(&format!(
            "{{\"time_ms\": {t}, \"domain\": \"{domain}\", \"hits\": {hits}, \"min_hits\": {min_hits}}}\n"
        ));
        let row = reference.entry(domain).or_default();
        let window = t / WINDOW_MS;
        if row.window != window {
            row.window = window;
            row.count = 0;
        }
        let room = (LIMIT - row.count).min(hits);
        row.requests += 1;
        row.hits += hits;
        if room >= min_hits {
            row.granted += room;
            row.count += room;
        } else {
            row.rejected += 1;
        }
    }
    sb.write("t.jsonl", trace);
    let (run, doc) = summary_json(&sb);
    // The trace is over 1 MB, so replay sets up a progress bar; with stderr
    // not a terminal it must draw nothing.
    assert_eq!(run.stderr, "", "{run}");
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), reference.len());
    for row in rows {
        let want = &reference[row["domain"].as_str().unwrap()];
        assert_eq!(
            row,
            &json!({
                "namespace": "ns", "resource": "r", "domain": row["domain"],
                "requests": want.requests, "hits": want.hits,
                "granted": want.granted, "rejected": want.rejected, "errors": 0,
            })
        );
    }
    let total: u64 = rows.iter().map(|r| r["requests"].as_u64().unwrap()).sum();
    assert_eq!(total, LINES);
    assert!(
        reference.values().map(|r| r.rejected).sum::<u64>() > 0,
        "the trace must exercise rejections"
    );
}

/// Issue 18: a resource with a `limits:` list replays with each limit's
/// state on every line and the binding limit named when one bound it.
#[test]
fn a_limits_list_replays_with_each_limit_and_the_binding_one_named() {
    let sb = Sandbox::new("replay-limits");
    sb.write(
        "c.yaml",
        "namespaces:
  - name: ns
    resources:
      - name: r
        limits:
          - { name: second, algorithm: fixed_window, limit: 2, window: 1s }
          - { name: minute, algorithm: fixed_window, limit: 3, window: 1m }
",
    );
    // Two in the first second, a third refused by `second`; then a new
    // second where `minute` has 1 left, then none.
    let times = [0, 10, 20, 1000, 1010];
    let trace: String = times
        .iter()
        .map(|t| format!("{{\"time_ms\": {t}, \"namespace\": \"ns\", \"resource\": \"r\", \"domain\": \"a\"}}\n"))
        .collect();
    sb.write("t.jsonl", trace);
    let run = replay_t(&sb, &["--summary", "none"]);
    assert!(run.success(), "{run}");
    let events = json_lines(&run.stdout);
    let allowed: Vec<bool> = events.iter().map(|e| e["allowed"] == true).collect();
    assert_eq!(allowed, [true, true, false, true, false]);
    let named: Vec<&Value> = events.iter().map(|e| &e["limited_by_name"]).collect();
    assert_eq!(
        named,
        [
            &Value::Null,
            &Value::Null,
            &json!("second"),
            &Value::Null,
            &json!("minute")
        ]
    );
    assert_eq!(
        events[3]["limits"],
        json!([
            {"name": "second", "algorithm": "fixed_window", "limit": 2, "remaining": 1, "reset_after_ms": 1000.0},
            {"name": "minute", "algorithm": "fixed_window", "limit": 3, "remaining": 0, "reset_after_ms": 59000.0}
        ])
    );
}

/// Regression: a request that brought its own `limit` (a resource with
/// `allow_override`) was neither logged with it nor replayable: the trace
/// line's `limit` was an unknown field, and replay always decided with the
/// config's algorithm. Now the decision log records it and replay decides
/// with it, as the server did.
#[test]
fn a_limit_brought_by_a_request_is_replayed_as_the_server_decided_it() {
    let sb = Sandbox::new("replay-brought");
    sb.write(
        "c.yaml",
        "\
namespaces:
  - name: ns
    resources:
      - { name: r, algorithm: fixed_window, limit: 2, window: 1s, allow_override: true, override_max: 100/h }
",
    );
    let t0 = 1_500_000_000_000u64;
    let line = |t: u64| {
        format!(
            "{{\"time_ms\": {t}, \"namespace\": \"ns\", \"resource\": \"r\", \"domain\": \"a\", \"limit\": {{\"requests_per_unit\": 1, \"unit\": \"hour\"}}}}\n"
        )
    };
    sb.write("t.jsonl", format!("{}{}", line(t0), line(t0 + 2_000)));
    let run = replay_t(&sb, &["--strict"]);
    assert!(run.success(), "{run}");
    let (events, _) = split_events(&run.stdout);
    let decided: Vec<(bool, u64)> = events
        .iter()
        .map(|e| {
            (
                e["allowed"].as_bool().unwrap(),
                e["limit"].as_u64().unwrap(),
            )
        })
        .collect();
    // One an hour, not the config's two a second.
    assert_eq!(decided, [(true, 1), (false, 1)], "{run}");
    // A unit that is not one is named.
    sb.write(
        "t.jsonl",
        "{\"time_ms\": 1, \"namespace\": \"ns\", \"resource\": \"r\", \"domain\": \"a\", \"limit\": {\"requests_per_unit\": 1, \"unit\": \"fortnight\"}}\n",
    );
    let run = replay_t(&sb, &[]);
    assert!(
        run.stderr
            .contains("`limit.unit` \"fortnight\" is not a unit"),
        "{run}"
    );
}

/// Regression (with the test above): an Envoy descriptor's own `limit`
/// was neither logged nor replayed; the trace's `descriptor_limits`
/// carries it, one entry (or `null`) per descriptor.
#[test]
fn a_descriptor_limit_is_replayed_as_the_server_decided_it() {
    let sb = Sandbox::new("replay-descriptor-limit");
    sb.write("envoy.yaml", MESSAGING);
    let line = |t: u64| {
        format!(
            "{{\"time_ms\": {t}, \"descriptors\": [[{{\"key\": \"to_number\", \"value\": \"1\"}}]], \"descriptor_limits\": [{{\"requests_per_unit\": 1, \"unit\": \"hour\"}}]}}\n"
        )
    };
    sb.write("t.jsonl", format!("{}{}", line(0), line(1)));
    let run = sb.run(&["replay", "-c", "envoy.yaml", "-t", "t.jsonl", "--strict"]);
    assert!(run.success(), "{run}");
    let (events, _) = split_events(&run.stdout);
    let decided: Vec<(bool, u64)> = events
        .iter()
        .map(|e| {
            let d = &e["descriptors"][0];
            (
                e["allowed"].as_bool().unwrap(),
                d["limit"].as_u64().unwrap(),
            )
        })
        .collect();
    // One an hour, the descriptor's own, not the config's 100 a day.
    assert_eq!(decided, [(true, 1), (false, 1)], "{run}");
}

/// Envoy descriptors with hits of their own (`descriptor_hits`) and some
/// refunding beside checked ones (`descriptor_refunds`), as a server's
/// decision log records them, replay as the server decided them: each
/// descriptor charged its own hits, all or nothing, refunds given back
/// whatever the check says.
#[test]
fn descriptor_hits_and_refunds_are_replayed_as_the_server_decided_them() {
    let sb = Sandbox::new("replay-descriptor-hits");
    sb.write("envoy.yaml", MESSAGING);
    let both = r#"[[{"key": "message_type", "value": "marketing"}, {"key": "to_number", "value": "1"}], [{"key": "to_number", "value": "1"}]]"#;
    let trace = [
        format!(r#"{{"time_ms": 0, "descriptors": {both}, "descriptor_hits": [3, 40]}}"#),
        format!(r#"{{"time_ms": 1, "descriptors": {both}, "descriptor_hits": [4, 1]}}"#),
        format!(
            r#"{{"time_ms": 2, "descriptors": {both}, "descriptor_hits": [3, null], "descriptor_refunds": [true, false]}}"#
        ),
    ]
    .join("\n");
    sb.write("t.jsonl", format!("{trace}\n"));
    let run = sb.run(&["replay", "-c", "envoy.yaml", "-t", "t.jsonl", "--strict"]);
    assert!(run.success(), "{run}");
    let (events, _) = split_events(&run.stdout);
    let decided: Vec<(bool, u64, u64)> = events
        .iter()
        .map(|e| {
            let d = &e["descriptors"];
            (
                e["allowed"].as_bool().unwrap(),
                d[0]["remaining"].as_u64().unwrap(),
                d[1]["remaining"].as_u64().unwrap(),
            )
        })
        .collect();
    // 3 of marketing's 5 and 40 of the number's 100; then 4 do not fit in
    // marketing's 2, so the number is not charged its 1 either; then the
    // 3 come back while the number is charged the line's 1 hit.
    assert_eq!(
        decided,
        [(true, 2, 60), (false, 2, 60), (true, 5, 59)],
        "{run}"
    );
    // A list of the wrong length is named.
    sb.write(
        "t.jsonl",
        format!("{{\"time_ms\": 0, \"descriptors\": {both}, \"descriptor_hits\": [1]}}\n"),
    );
    let run = sb.run(&["replay", "-c", "envoy.yaml", "-t", "t.jsonl", "--strict"]);
    assert!(
        run.stderr
            .contains("`descriptor_hits` has 1 entries for 2 descriptors"),
        "{run}"
    );
}

/// Issue 18 items 3 and 4 (review of the per-descriptor hits change): a
/// decision log's `descriptor_hits` and `descriptor_refunds` replay as the
/// server decided them: each descriptor asks its own hits, all or
/// nothing, and a refunding descriptor gives its hits back beside a
/// check. The summary counts each descriptor's own hits, as the server's
/// metrics do (regression: it counted the request's `hits` for every
/// descriptor).
#[test]
fn descriptor_hits_and_refunds_replay_as_the_server_decided_them() {
    let sb = Sandbox::new("replay-descriptor-hits-summary");
    sb.write("envoy.yaml", MESSAGING);
    let two = r#"[[{"key": "to_number", "value": "1"}], [{"key": "to_number", "value": "2"}]]"#;
    let trace = format!(
        "{{\"time_ms\": 0, \"descriptors\": {two}, \"descriptor_hits\": [60, null]}}\n\
         {{\"time_ms\": 1, \"descriptors\": {two}, \"descriptor_hits\": [50, null]}}\n\
         {{\"time_ms\": 2, \"descriptors\": {two}, \"hits\": 30, \"descriptor_refunds\": [true, false]}}\n"
    );
    sb.write("t.jsonl", trace);
    let run = sb.run(&["replay", "-c", "envoy.yaml", "-t", "t.jsonl", "--strict"]);
    assert!(run.success(), "{run}");
    let (events, _) = split_events(&run.stdout);
    let decided: Vec<(bool, Vec<u64>)> = events
        .iter()
        .map(|e| {
            let left = e["descriptors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["remaining"].as_u64().unwrap())
                .collect();
            (e["allowed"].as_bool().unwrap(), left)
        })
        .collect();
    assert_eq!(
        decided,
        [
            // 60 and 1 of 100 a day.
            (true, vec![40, 99]),
            // 50 do not fit the first's 40: neither is charged.
            (false, vec![40, 99]),
            // 30 given back to the first, 30 charged to the second.
            (true, vec![70, 69]),
        ],
        "{run}"
    );
    sb.write("t.jsonl", "{\"time_ms\": 0, \"descriptors\": [[{\"key\": \"to_number\", \"value\": \"1\"}], [{\"key\": \"to_number\", \"value\": \"2\"}]], \"descriptor_hits\": [60, null]}\n");
    let run = sb.run(&[
        "replay",
        "-c",
        "envoy.yaml",
        "-t",
        "t.jsonl",
        "--no-events",
        "--summary",
        "json",
    ]);
    assert!(run.success(), "{run}");
    let doc: Value = serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}{run}"));
    let hits: Vec<(String, u64, u64)> = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["domain"].as_str().unwrap().to_owned(),
                r["hits"].as_u64().unwrap(),
                r["granted"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        hits,
        [
            ("to_number=1".to_owned(), 60, 60),
            ("to_number=2".to_owned(), 1, 1)
        ],
        "{run}"
    );
}
