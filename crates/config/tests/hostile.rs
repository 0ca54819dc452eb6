//! The config loader under hostile input (issue 16): the text of a config
//! file, and of the config API's `/v1/import`, which anyone holding an
//! admin token can send. Valid configs of every format and algorithm are
//! mutated field by field (huge, negative, fractional and non-numeric
//! values, durations and rates that overflow, wrong types, unknown and
//! duplicated keys, deep nesting, anchors and aliases, repeated entries),
//! emitted as block or flow YAML, and mutated line by line; and arbitrary
//! token soup is thrown at the parser.
//!
//! Every input must load or be refused with diagnostics that name the
//! file, line and column, within a bound (each load runs on a thread with
//! a tokio worker's 2 MiB stack, so a recursion that would take a server
//! down fails here too); and a config that loads must come back the same
//! from the emitter (`what the API accepts, a server runs`).
//!
//! `TOLLGATE_HOSTILE_CASES` sets the cases per property (default 48).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use tollgate_config::{emit, load_str, ConfigError, Loaded};

/// How long a load may take on a loaded machine before it counts as a
/// hang.
const BOUND: Duration = Duration::from_secs(20);

fn cases() -> u32 {
    std::env::var("TOLLGATE_HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &u32| n > 0)
        .unwrap_or(48)
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        max_shrink_iters: 500,
        ..Config::default()
    })
}

/// Loads `text` on a thread of its own with a 2 MiB stack (a tokio
/// worker's), within [`BOUND`].
fn load(text: String) -> Result<Loaded, ConfigError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let shown: String = text.chars().take(300).collect();
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let _ = tx.send(load_str("fuzz.yaml", &text));
        })
        .unwrap();
    match rx.recv_timeout(BOUND) {
        Ok(r) => r,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("no answer within {BOUND:?} for a config starting {shown:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("the loader panicked on a config starting {shown:?}")
        }
    }
}

/// Panics unless `result` is a config that survives the emitter, or
/// diagnostics naming this file, a line and a column, and saying what.
fn check(text: &str, result: &Result<Loaded, ConfigError>) -> &'static str {
    match result {
        Ok(loaded) => {
            let emitted = emit::to_yaml(&loaded.config);
            let again = load_str("emitted.yaml", &emitted).unwrap_or_else(|e| {
                panic!(
                    "a config that loaded does not load once emitted: {e}\n{emitted}\nfrom\n{text}"
                )
            });
            // Positions differ (another file); what the config says must not.
            assert_eq!(
                emit::to_yaml(&again.config),
                emitted,
                "the emitted config changed when loaded again"
            );
            "loaded"
        }
        Err(e) => {
            assert!(!e.errors.is_empty());
            for d in &e.errors {
                assert_eq!(d.pos.file, "fuzz.yaml", "{d}");
                assert!(
                    d.pos.line >= 1 && d.pos.col >= 1,
                    "a diagnostic without a place: {d}"
                );
                assert!(!d.message.is_empty(), "{d:?}");
                assert!(
                    d.message.len() <= 2048 + text.len(),
                    "a {}-byte message",
                    d.message.len()
                );
            }
            "refused"
        }
    }
}

/// A YAML tree, emitted by hand so a case can write what no serializer
/// would (raw scalars, aliases, duplicated keys).
#[derive(Clone, Debug)]
enum Y {
    Map(Vec<(String, Y)>),
    Seq(Vec<Y>),
    /// A scalar, written as is.
    Raw(String),
}

fn s(text: &str) -> Y {
    Y::Raw(text.to_owned())
}

fn map(entries: &[(&str, Y)]) -> Y {
    Y::Map(
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
    )
}

/// tollgate's format, with every algorithm and a copy pool.
fn native() -> Y {
    let r = |name: &str, fields: &[(&str, &str)]| {
        let mut e = vec![("name".to_owned(), s(name))];
        e.extend(fields.iter().map(|(k, v)| ((*k).to_owned(), s(v))));
        Y::Map(e)
    };
    let tier = |limit: &str, window: &str, active: &str, cooldown: &str| {
        map(&[
            ("limit", s(limit)),
            ("window", s(window)),
            ("active", s(active)),
            ("cooldown", s(cooldown)),
        ])
    };
    let login = map(&[
        ("name", s("login")),
        ("algorithm", s("burst_tiers")),
        ("hard_limit", s("20")),
        ("global_limit", s("1000")),
        (
            "tiers",
            Y::Seq(vec![
                tier("10", "1s", "60s", "0s"),
                tier("50", "10s", "30s", "300s"),
            ]),
        ),
        (
            "domains",
            map(&[(
                "acme",
                map(&[("tiers", Y::Seq(vec![tier("100", "1s", "60s", "0s")]))]),
            )]),
        ),
    ]);
    let sandbox = map(&[
        ("name", s("sandbox")),
        ("kind", s("concurrency")),
        ("domain_limit", s("3")),
        ("global_limit", s("100")),
        (
            "groups",
            Y::Seq(vec![map(&[
                ("name", s("big")),
                ("members", Y::Seq(vec![s("acme"), s("globex")])),
                ("limit", s("20")),
            ])]),
        ),
        (
            "domains",
            map(&[("acme", map(&[("domain_limit", s("10"))]))]),
        ),
    ]);
    let resources = Y::Seq(vec![
        r(
            "tb",
            &[
                ("algorithm", "token_bucket"),
                ("capacity", "100"),
                ("rate", "10/s"),
            ],
        ),
        r(
            "gcra",
            &[("algorithm", "gcra"), ("rate", "100/min"), ("burst", "10")],
        ),
        r(
            "sw",
            &[
                ("algorithm", "sliding_window"),
                ("limit", "100"),
                ("window", "1m"),
                ("buckets", "2"),
            ],
        ),
        r(
            "log",
            &[
                ("algorithm", "sliding_log"),
                ("limit", "5"),
                ("window", "10s"),
                ("min_gap", "100ms"),
            ],
        ),
        r(
            "fw",
            &[
                ("algorithm", "fixed_window"),
                ("limit", "1000"),
                ("window", "1h"),
                ("align", "epoch"),
            ],
        ),
        r(
            "lb",
            &[
                ("algorithm", "leaky_bucket"),
                ("rate", "5/s"),
                ("queue_size", "10"),
            ],
        ),
        r("sb", &[("algorithm", "smooth_bursty"), ("rate", "5/s")]),
        r(
            "sw2",
            &[
                ("algorithm", "smooth_warming_up"),
                ("rate", "50/s"),
                ("warmup", "10s"),
                ("cold_factor", "3"),
            ],
        ),
        login,
        sandbox,
    ]);
    map(&[(
        "namespaces",
        Y::Seq(vec![map(&[
            ("name", s("app")),
            ("allow_unconfigured", s("false")),
            ("ignore_configured", s("false")),
            ("resources", resources),
        ])]),
    )])
}

/// envoyproxy/ratelimit's format.
fn envoy() -> Y {
    let limit = |unit: &str, n: &str| map(&[("unit", s(unit)), ("requests_per_unit", s(n))]);
    map(&[
        ("domain", s("shop")),
        (
            "descriptors",
            Y::Seq(vec![
                map(&[
                    ("key", s("path")),
                    ("value", s("/x")),
                    ("rate_limit", limit("second", "100")),
                ]),
                map(&[
                    ("key", s("user")),
                    (
                        "descriptors",
                        Y::Seq(vec![map(&[
                            ("key", s("plan")),
                            ("value", s("free")),
                            (
                                "rate_limit",
                                map(&[
                                    ("unit", s("minute")),
                                    ("requests_per_unit", s("5")),
                                    ("name", s("n")),
                                ]),
                            ),
                        ])]),
                    ),
                ]),
                map(&[("key", s("closed")), ("rate_limit", limit("day", "0"))]),
                map(&[
                    ("key", s("vip")),
                    (
                        "rate_limit",
                        map(&[
                            ("unit", s("day")),
                            ("requests_per_unit", s("100")),
                            ("replaces", Y::Seq(vec![map(&[("name", s("n"))])])),
                        ]),
                    ),
                ]),
                map(&[
                    ("key", s("free")),
                    ("rate_limit", map(&[("unlimited", s("true"))])),
                ]),
                map(&[
                    ("key", s("shadow")),
                    ("shadow_mode", s("true")),
                    ("rate_limit", limit("hour", "1")),
                ]),
            ]),
        ),
    ])
}

/// Block YAML.
fn block(y: &Y, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match y {
        Y::Map(entries) if entries.is_empty() => out.push_str(&format!("{pad}{{}}\n")),
        Y::Seq(items) if items.is_empty() => out.push_str(&format!("{pad}[]\n")),
        Y::Map(entries) => {
            for (k, v) in entries {
                match v {
                    Y::Raw(text) => out.push_str(&format!("{pad}{k}: {text}\n")),
                    Y::Map(e) if e.is_empty() => out.push_str(&format!("{pad}{k}: {{}}\n")),
                    Y::Seq(i) if i.is_empty() => out.push_str(&format!("{pad}{k}: []\n")),
                    _ => {
                        out.push_str(&format!("{pad}{k}:\n"));
                        block(v, indent + 2, out);
                    }
                }
            }
        }
        Y::Seq(items) => {
            for item in items {
                if let Y::Raw(text) = item {
                    out.push_str(&format!("{pad}- {text}\n"));
                    continue;
                }
                let mut inner = String::new();
                block(item, indent + 2, &mut inner);
                // The item's first line starts with the list's dash.
                out.push_str(&pad);
                out.push_str("- ");
                out.push_str(&inner[indent + 2..]);
            }
        }
        Y::Raw(text) => out.push_str(&format!("{pad}{text}\n")),
    }
}

/// Flow YAML (JSON-like, keys plain).
fn flow(y: &Y, out: &mut String) {
    match y {
        Y::Map(entries) => {
            out.push('{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(k);
                out.push_str(": ");
                flow(v, out);
            }
            out.push('}');
        }
        Y::Seq(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                flow(v, out);
            }
            out.push(']');
        }
        Y::Raw(text) => out.push_str(text),
    }
}

/// Every place in `y` (as child indices), `y` itself first.
fn places(y: &Y) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new()];
    let children: Vec<&Y> = match y {
        Y::Map(e) => e.iter().map(|(_, v)| v).collect(),
        Y::Seq(i) => i.iter().collect(),
        Y::Raw(_) => Vec::new(),
    };
    for (i, c) in children.into_iter().enumerate() {
        for mut p in places(c) {
            p.insert(0, i);
            out.push(p);
        }
    }
    out
}

fn at<'a>(y: &'a mut Y, path: &[usize]) -> &'a mut Y {
    match path.split_first() {
        None => y,
        Some((&i, rest)) => match y {
            Y::Map(e) => at(&mut e[i].1, rest),
            Y::Seq(items) => at(&mut items[i], rest),
            Y::Raw(_) => y,
        },
    }
}

/// A scalar a stranger might write for any field.
fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "0", "-1", "1", "2", "18446744073709551615", "18446744073709551616",
            "9223372036854775807", "-9223372036854775808", "99999999999999999999999", "1e308",
            "1e999", "-1e999", ".inf", "-.inf", ".nan", ".NaN", "0x10", "0o17", "0b101", "1_000",
            "3.5", "-0", "+5", "'5'", "\"5\"", "true", "false", "yes", "no", "null", "~", "''",
            "\"\"", "1000/s", "0/s", "1/0s", "18446744073709551615/ns", "1/18446744073709551615h",
            "-1/s", "1/s/s", "1 / s", "1/fortnight", "10/1.5s", "1e3/s", "5/min", "0s", "1ns",
            "18446744073709551615s", "999999999999999999h", "1.5s", "-1s", "1h1m", "forever",
            "token_bucket", "gcra", "sliding_log", "burst_tiers", "concurrency", "rate", "epoch",
            "second", "minute", "day", "week", "acme", "app", "n", "\"\\u0000\"", "\"\\ud800\"",
            "\"a\\nb\"", "!!binary aGk=", "!!str 5", "!!int x", "!custom 1", "&a 5", "*a", "*nope",
            "|\n  text", ">\n  folded", "[1, 2]", "{a: 1}", "[]", "{}", "- x", "? x", "@x", "`x",
            "%x", "#comment",
        ])
        .prop_map(String::from),
        1 => "[a-z_0-9./]{0,12}",
        1 => "\\PC{1,8}".prop_map(|t| format!("{t:?}")),
        1 => (0usize..5000).prop_map(|n| "x".repeat(n)),
    ]
}

/// A value a stranger might put anywhere: a scalar, or a structure where
/// a scalar belongs (or the other way round), or deep nesting.
fn value() -> impl Strategy<Value = Y> {
    prop_oneof![
        6 => scalar().prop_map(Y::Raw),
        1 => Just(Y::Seq(vec![])),
        1 => Just(Y::Map(vec![])),
        1 => prop::collection::vec(scalar().prop_map(Y::Raw), 1..3).prop_map(Y::Seq),
        1 => (scalar(), scalar()).prop_map(|(k, v)| Y::Map(vec![(k, Y::Raw(v))])),
        1 => (1usize..200).prop_map(|d| {
            let mut y = s("1");
            for _ in 0..d {
                y = Y::Seq(vec![y]);
            }
            y
        }),
    ]
}

/// A change to the tree.
#[derive(Clone, Debug)]
enum Edit {
    Set(prop::sample::Index, Y),
    /// Removes an entry of a map or an item of a list.
    Remove(prop::sample::Index),
    /// Adds a key (known somewhere in the format, or not at all).
    Add(prop::sample::Index, String, Y),
    /// Repeats a list's first item.
    Repeat(prop::sample::Index, usize),
    /// Anchors a value and refers to it elsewhere.
    Alias(prop::sample::Index, prop::sample::Index),
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "name", "algorithm", "rate", "capacity", "burst", "limit", "window", "tiers", "domains",
            "kind", "groups", "members", "domain_limit", "global_limit", "hard_limit", "descriptors",
            "key", "value", "rate_limit", "unit", "requests_per_unit", "namespaces", "resources",
            "domain", "shadow_mode", "replaces", "unlimited", "allow_unconfigured", "replication",
            "namspaces", "<<", "? complex",
        ])
        .prop_map(String::from),
        1 => "[a-z_]{1,10}",
        1 => "\\PC{1,6}".prop_map(|t| format!("{t:?}")),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        6 => (any::<prop::sample::Index>(), value()).prop_map(|(i, v)| Edit::Set(i, v)),
        2 => any::<prop::sample::Index>().prop_map(Edit::Remove),
        2 => (any::<prop::sample::Index>(), key(), value()).prop_map(|(i, k, v)| Edit::Add(i, k, v)),
        1 => (any::<prop::sample::Index>(), 1usize..3000).prop_map(|(i, n)| Edit::Repeat(i, n)),
        1 => (any::<prop::sample::Index>(), any::<prop::sample::Index>()).prop_map(|(a, b)| Edit::Alias(a, b)),
    ]
}

fn apply(mut y: Y, edits: &[Edit]) -> Y {
    for (n, e) in edits.iter().enumerate() {
        let all = places(&y);
        match e {
            Edit::Set(i, v) => *at(&mut y, i.get(&all[..]).as_slice()) = v.clone(),
            Edit::Remove(i) => {
                let path = i.get(&all[..]).clone();
                if let Some((last, parent)) = path.split_last() {
                    match at(&mut y, parent) {
                        Y::Map(entries) => {
                            entries.remove(*last);
                        }
                        Y::Seq(items) => {
                            items.remove(*last);
                        }
                        Y::Raw(_) => {}
                    }
                }
            }
            Edit::Add(i, k, v) => {
                if let Y::Map(entries) = at(&mut y, i.get(&all[..]).as_slice()) {
                    entries.push((k.clone(), v.clone()));
                }
            }
            Edit::Repeat(i, times) => {
                if let Y::Seq(items) = at(&mut y, i.get(&all[..]).as_slice()) {
                    if let Some(first) = items.first().cloned() {
                        items.extend(std::iter::repeat_n(first, *times));
                    }
                }
            }
            Edit::Alias(a, b) => {
                // Only scalars are anchored: emitting an anchor before a
                // block structure would need its own line.
                let (from, to) = (a.get(&all[..]).clone(), b.get(&all[..]).clone());
                let anchored = match at(&mut y, &from) {
                    Y::Raw(text) if !text.starts_with('&') => {
                        *text = format!("&a{n} {text}");
                        true
                    }
                    _ => false,
                };
                if anchored && to != from {
                    *at(&mut y, &to) = Y::Raw(format!("*a{n}"));
                }
            }
        }
    }
    y
}

/// A change to the lines of the emitted text.
#[derive(Clone, Debug)]
enum LineEdit {
    Duplicate(prop::sample::Index),
    Delete(prop::sample::Index),
    Indent(prop::sample::Index, bool),
    Insert(prop::sample::Index, String),
    Tab(prop::sample::Index),
}

fn line_edit() -> impl Strategy<Value = LineEdit> {
    prop_oneof![
        (any::<prop::sample::Index>()).prop_map(LineEdit::Duplicate),
        (any::<prop::sample::Index>()).prop_map(LineEdit::Delete),
        (any::<prop::sample::Index>(), any::<bool>())
            .prop_map(|(i, more)| LineEdit::Indent(i, more)),
        (
            any::<prop::sample::Index>(),
            prop_oneof![
                Just("---".to_owned()),
                Just("...".to_owned()),
                Just("%YAML 1.2".to_owned()),
                Just("%TAG ! tag:x,2000:".to_owned()),
                Just("? [a]".to_owned()),
                Just(": b".to_owned()),
                Just("\t- x".to_owned()),
                Just("\u{feff}".to_owned()),
                "\\PC{0,12}",
            ]
        )
            .prop_map(|(i, l)| LineEdit::Insert(i, l)),
        any::<prop::sample::Index>().prop_map(LineEdit::Tab),
    ]
}

fn apply_lines(text: &str, edits: &[LineEdit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for e in edits {
        if lines.is_empty() {
            break;
        }
        match e {
            LineEdit::Duplicate(i) => {
                let at = i.index(lines.len());
                let l = lines[at].clone();
                lines.insert(at, l);
            }
            LineEdit::Delete(i) => {
                lines.remove(i.index(lines.len()));
            }
            LineEdit::Indent(i, more) => {
                let at = i.index(lines.len());
                let l = &mut lines[at];
                if *more {
                    l.insert_str(0, "  ");
                } else if l.starts_with("  ") {
                    l.replace_range(..2, "");
                }
            }
            LineEdit::Insert(i, text) => lines.insert(i.index(lines.len() + 1), text.clone()),
            LineEdit::Tab(i) => {
                let at = i.index(lines.len());
                let l = &mut lines[at];
                *l = l.replacen("  ", "\t", 1);
            }
        }
    }
    lines.join("\n")
}

/// Valid configs of both formats, mutated in the tree (every field, any
/// value), emitted as block or flow YAML and mutated line by line.
#[test]
fn mutated_configs_load_or_are_refused_with_positions() {
    let input = (
        prop_oneof![Just(native()), Just(envoy())],
        prop::collection::vec(edit(), 0..5),
        any::<bool>(),
        prop_oneof![3 => Just(Vec::new()), 1 => prop::collection::vec(line_edit(), 1..4)],
    );
    let tally = std::cell::RefCell::new(std::collections::BTreeMap::<&str, u64>::new());
    runner()
        .run(&input, |(base, edits, as_flow, line_edits)| {
            let tree = apply(base, &edits);
            let mut text = String::new();
            if as_flow {
                flow(&tree, &mut text);
            } else {
                block(&tree, 0, &mut text);
            }
            let text = apply_lines(&text, &line_edits);
            let result = load(text.clone());
            *tally.borrow_mut().entry(check(&text, &result)).or_default() += 1;
            Ok(())
        })
        .unwrap();
    eprintln!("YAML configs, mutated: {:?}", tally.borrow());
}

/// Token soup: sequences of YAML's syntax, config words and junk, which
/// reach the scanner's and parser's corners (flow inside block, tags,
/// anchors, directives, complex keys, bad indentation, stray quotes).
#[test]
fn token_soup_loads_or_is_refused_with_positions() {
    let token = prop_oneof![
        4 => prop::sample::select(vec![
            "- ", ": ", "{", "}", "[", "]", ", ", "&a ", "*a ", "&b ", "*b ", "!!map ", "!!seq ",
            "!t ", "| ", "> ", "|-\n", "---\n", "...\n", "%YAML 1.2\n", "# c\n", "'", "\"", "\n",
            "\n  ", "\n    ", "? ", "namespaces", "resources", "name", "algorithm", "token_bucket",
            "rate", "10/s", "capacity", "100", "domain", "descriptors", "key", "rate_limit", "unit",
            "second", "requests_per_unit", "kind", "concurrency", "domain_limit", "<<: *a", "\t",
            "\\", "\u{0}", "\u{feff}", "\u{85}", "\u{2028}", "\r\n", "\r",
        ])
        .prop_map(String::from),
        1 => "\\PC{1,6}",
    ];
    let soup = prop::collection::vec(token, 0..200).prop_map(|t| t.concat());
    let tally = std::cell::RefCell::new(std::collections::BTreeMap::<&str, u64>::new());
    runner()
        .run(&soup, |text| {
            let result = load(text.clone());
            *tally.borrow_mut().entry(check(&text, &result)).or_default() += 1;
            Ok(())
        })
        .unwrap();
    eprintln!("YAML token soup: {:?}", tally.borrow());
}

/// Nesting of every kind far past the bound (block lists, block maps,
/// flow lists and maps, mixed), and alias expansion: refused with a
/// position, never a stack overflow, never exponential work.
#[test]
fn deep_nesting_and_alias_bombs_are_refused() {
    // Block nesting costs its depth in indentation on every line (so the
    // text grows with the square of the depth): a few thousand levels.
    let shapes = (1usize..100_000, 0usize..5).prop_map(|(depth, shape)| match shape {
        0 | 1 if depth > 3000 => format!("{}x", "- ".repeat(depth)),
        0 => {
            (0..depth)
                .map(|i| format!("{}- ", " ".repeat(2 * i)))
                .collect::<Vec<_>>()
                .join("\n")
                + "x"
        }
        1 => {
            (0..depth)
                .map(|i| format!("{}k{i}:", " ".repeat(2 * i)))
                .collect::<Vec<_>>()
                .join("\n")
                + " x"
        }
        2 => format!("namespaces: {}{}", "[".repeat(depth), "]".repeat(depth)),
        3 => format!("namespaces: {}1{}", "{a: ".repeat(depth), "}".repeat(depth)),
        _ => format!("{}x", "- [".repeat(depth)),
    });
    runner()
        .run(&shapes, |text| {
            let result = load(text.clone());
            check(&text, &result);
            Ok(())
        })
        .unwrap();
    // A billion laughs: nine levels of nine aliases.
    let mut bomb = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let p = i - 1;
        bomb.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    let result = load(bomb.clone());
    assert_eq!(check(&bomb, &result), "refused");
}

/// Found by this suite: a value with a tag (`!custom 1`, `!!str x`) lost
/// its place: saphyr gives the value inside a tag no position, so a
/// diagnostic about it said `line 0`. Now it names the tag's line and
/// column.
#[test]
fn a_tagged_value_is_refused_at_its_own_line_and_column() {
    for (text, at) in [
        ("namespaces: !custom 1\n", "fuzz.yaml:1:13"),
        ("!t namespaces\n", "fuzz.yaml:1:1"),
        (
            "namespaces:\n  - name: app\n    resources:\n      - { name: x, algorithm: !t 5, rate: 1/s }\n",
            "fuzz.yaml:4:31",
        ),
        ("namespaces:\n  - name: !!str 5\n    resources: !x {a: 1}\n", "fuzz.yaml:3:16"),
    ] {
        let e = load_str("fuzz.yaml", text).unwrap_err();
        let shown: Vec<String> = e.errors.iter().map(ToString::to_string).collect();
        assert!(
            shown.iter().any(|d| d.starts_with(&format!("{at}:"))),
            "{text:?}: {shown:?}"
        );
        for d in &e.errors {
            assert!(d.pos.line >= 1, "{text:?}: {d}");
        }
    }
}
