#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `tollgate sim` as a user runs it: a data set or a trace through a small
//! simulated cluster, its table, JSON and files; the windows study; and
//! bad arguments refused by name.

mod common;

use common::Sandbox;
use serde_json::Value;

#[test]
fn a_data_set_runs_through_each_strategy_and_writes_its_results() {
    let dir = Sandbox::new("sim-run");
    let out = dir.path("out");
    let run = dir.run(&[
        "sim",
        "--dataset",
        "B-barely",
        "--capacity",
        "30",
        "--nodes",
        "3",
        "--strategies",
        "counter,queue+freq",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(run.success(), "{run}");
    let v: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["dataset"], "B-barely");
    assert_eq!(v["requests"], 33, "round(1.1 × 30)");
    let results = v["results"].as_array().unwrap();
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["counter", "queue+freq"]);
    for r in results {
        assert_eq!(r["requests"], 33);
        let central = r["central_rejections"].as_u64().unwrap();
        assert!(central > 0, "{r}");
        let rejected = r["rejections"].as_u64().unwrap();
        let over = r["over_admissions"].as_u64().unwrap();
        let false_rej = r["false_rejections"].as_u64().unwrap();
        assert_eq!(rejected + over, central + false_rej, "{r}");
    }
    for file in [
        "results.csv",
        "results.json",
        "series-counter.csv",
        "series-queue-freq.csv",
        "rejections.svg",
        "memory.svg",
        "bandwidth.svg",
    ] {
        assert!(out.join(file).exists(), "{file} missing");
    }
    // The PNG copies come with the `png` feature, and only with it.
    for file in ["rejections.png", "memory.png", "bandwidth.png"] {
        assert_eq!(out.join(file).exists(), cfg!(feature = "png"), "{file}");
    }
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3);
    assert!(std::fs::read_to_string(out.join("rejections.svg"))
        .unwrap()
        .contains("centralized"));
}

/// Issue 23 ("Pictures"): on B-extreme, `counter` and `queue+freq+near`
/// were the same orange in rejections.png and the grey centralized line
/// disappeared under the others. Now every line has its own colour, the
/// centralized limiter is drawn last, and every line's final value is
/// written beside it.
#[test]
fn the_rejections_chart_tells_every_line_apart_and_shows_where_each_ends() {
    let dir = Sandbox::new("sim-chart");
    let out = dir.path("out");
    // Every strategy (the default), B-extreme at capacity 20, 3 nodes.
    let run = dir.run(&[
        "sim",
        "--dataset",
        "B-extreme",
        "--capacity",
        "20",
        "--nodes",
        "3",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(run.success(), "{run}");
    let svg = std::fs::read_to_string(out.join("rejections.svg")).unwrap();
    // The data lines, in drawing order: strokes 2 or 3 pixels wide above
    // the legend (which sits below the 500-pixel chart).
    let mut strokes: Vec<&str> = Vec::new();
    for tag in svg.split("<polyline").skip(1) {
        let width = attr(tag, "stroke-width").unwrap();
        let below = attr(tag, "points")
            .unwrap()
            .split_whitespace()
            .any(|p| p.split_once(',').unwrap().1.parse::<i32>().unwrap() >= 500);
        if width != "1" && !below {
            strokes.push(attr(tag, "stroke").unwrap());
        }
    }
    let mut colours = strokes.clone();
    colours.sort_unstable();
    colours.dedup();
    assert_eq!(
        colours.len(),
        9,
        "eight strategies and the centralized: {colours:?}"
    );
    assert_eq!(
        strokes.last(),
        Some(&"#000000"),
        "the centralized line is drawn last"
    );
    // Final values: each strategy's last count, and the centralized one.
    let texts: Vec<&str> = svg
        .split("<text")
        .skip(1)
        .map(|t| t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()].trim())
        .collect();
    let mut central = 0;
    for strategy in [
        "counter",
        "queue",
        "queue-freq",
        "queue-linf",
        "queue-freq-linf",
        "epoch",
        "queue-near",
        "queue-freq-near",
    ] {
        let csv = std::fs::read_to_string(out.join(format!("series-{strategy}.csv"))).unwrap();
        let last: Vec<&str> = csv.lines().last().unwrap().split(',').collect();
        // t_s,requests,rejections,central_rejections,...
        assert!(texts.contains(&last[2]), "{strategy}'s final {}", last[2]);
        central = central.max(last[3].parse::<u64>().unwrap());
    }
    assert!(
        texts.contains(&central.to_string().as_str()),
        "centralized {central}"
    );
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = tag[start..].find('"')?;
    Some(&tag[start..start + len])
}

#[test]
fn the_table_names_every_strategy() {
    let dir = Sandbox::new("sim-table");
    let run = dir.run(&[
        "sim",
        "--dataset",
        "D",
        "--nodes",
        "2",
        "--strategies",
        "counter,epoch",
    ]);
    assert!(run.success(), "{run}");
    assert!(run.stdout.contains("precision"), "{run}");
    for name in ["counter", "epoch"] {
        assert!(
            run.stdout.lines().any(|l| l.starts_with(name)),
            "{name}: {run}"
        );
    }
    assert!(run.stderr.contains("D: 112 requests"), "{run}");
}

#[test]
fn traces_replay_in_both_formats() {
    let dir = Sandbox::new("sim-trace");
    let user = "0123456789abcdef0123456789abcdef";
    let thesis: Vec<String> = (0..20)
        .map(|i| {
            format!(
                r#"{{"user_id":"{user}","time":{}}}"#,
                1_600_000_000_000u64 + i * 10
            )
        })
        .collect();
    dir.write("thesis.json", format!("[{}]", thesis.join(",")));
    let lines: Vec<String> = (0..20)
        .map(|i| format!(r#"{{"time_ms":{},"domain":"{user}"}}"#, i * 10))
        .collect();
    dir.write("trace.jsonl", lines.join("\n"));
    for file in ["thesis.json", "trace.jsonl"] {
        let run = dir.run(&[
            "sim",
            "--trace",
            file,
            "--capacity",
            "5",
            "--nodes",
            "2",
            "--strategies",
            "counter",
            "--json",
        ]);
        assert!(run.success(), "{file}: {run}");
        let v: Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(v["requests"], 20, "{file}");
        assert_eq!(
            v["results"][0]["central_rejections"], 15,
            "{file}: a bucket of 5"
        );
    }
}

/// A trace's `report` and `refund` lines are usage, not requests: the
/// counter strategy charges them (the ground truth refuses more), and a
/// strategy that takes no usage refuses the trace, naming the one that
/// does.
#[test]
fn a_traces_reports_and_refunds_are_charged_not_counted_as_requests() {
    let dir = Sandbox::new("sim-told");
    let user = "0123456789abcdef0123456789abcdef";
    let mut lines: Vec<String> = (0..20)
        .map(|i| format!(r#"{{"time_ms":{},"domain":"{user}"}}"#, i * 10))
        .collect();
    lines.insert(
        1,
        format!(r#"{{"time_ms":5,"domain":"{user}","hits":4,"mode":"report"}}"#),
    );
    lines.insert(
        3,
        format!(r#"{{"time_ms":15,"domain":"{user}","hits":1,"mode":"refund"}}"#),
    );
    dir.write("trace.jsonl", lines.join("\n"));
    let sim = |strategy: &str| {
        dir.run(&[
            "sim",
            "--trace",
            "trace.jsonl",
            "--capacity",
            "5",
            "--nodes",
            "2",
            "--strategies",
            strategy,
            "--json",
        ])
    };
    let run = sim("counter");
    assert!(run.success(), "{run}");
    let v: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["requests"], 20);
    assert_eq!(v["results"][0]["told"], 2);
    // A bucket of 5: 15 refused without usage; the 4 reported less the 1
    // refunded cost 3 more.
    assert_eq!(v["results"][0]["central_rejections"], 18, "{run}");
    let run = sim("queue");
    assert!(!run.success(), "{run}");
    assert!(run.stderr.contains("--strategies counter"), "{run}");
}

#[test]
fn the_windows_study_prints_its_table_and_writes_its_charts() {
    let dir = Sandbox::new("sim-windows");
    let out = dir.path("w");
    let run = dir.run(&[
        "sim",
        "windows",
        "--minutes",
        "5",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(run.success(), "{run}");
    for name in ["fixed window", "2-window", "sliding log"] {
        assert!(run.stdout.contains(name), "{name}: {run}");
    }
    for file in ["windows-stats.csv", "windows-all.svg"] {
        assert!(out.join(file).exists(), "{file}");
    }
    assert_eq!(
        out.join("windows-all.png").exists(),
        cfg!(feature = "png"),
        "windows-all.png"
    );
}

#[test]
fn bad_arguments_are_refused_by_name() {
    let dir = Sandbox::new("sim-bad");
    for (args, named) in [
        (vec!["--dataset", "Z"], "Z"),
        (vec!["--strategies", "counter,psychic"], "psychic"),
        // Twice the same run would share one series file and one look.
        (
            vec!["--strategies", "counter,queue,counter"],
            "`counter` is named twice (as strategy 1 and 3)",
        ),
        (vec!["--assign", "nearest"], "nearest"),
        (vec!["--loss", "2"], "--loss"),
        (vec!["--capacity", "0"], "--capacity"),
        (vec!["--trace", "missing.jsonl"], "missing.jsonl"),
    ] {
        let mut all = vec!["sim", "--nodes", "2"];
        all.extend(args.iter());
        let run = dir.run(&all);
        assert!(!run.success(), "{args:?}: {run}");
        assert!(run.stderr.contains(named), "{args:?}: {run}");
    }
}
