//! Strings the emitter writes read back as the same strings.
//!
//! Review of issue 22 (HIGH): `emit::scalar` quoted only lowercase
//! `true`/`false`/`null`, so a resource named `NULL` came back as a null
//! name, `True` as a boolean and a domain override `TRUE` was renamed
//! `true`. Every string is now written plain only when the YAML reader's
//! own scalar resolution gives it back unchanged.

use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use serde_json::json;
use tollgate_config::yaml::{self, Kind};
use tollgate_config::{emit, load_str, Config, ResourceKind};

/// Words and shapes a YAML reader might resolve to something else.
const TRICKY: &[&str] = &[
    "true",
    "True",
    "TRUE",
    "tRUE",
    "false",
    "False",
    "FALSE",
    "null",
    "Null",
    "NULL",
    "nULL",
    "~",
    "yes",
    "Yes",
    "YES",
    "no",
    "No",
    "NO",
    "on",
    "On",
    "ON",
    "off",
    "Off",
    "OFF",
    "y",
    "Y",
    "n",
    "N",
    "1e3",
    "1E3",
    "0x10",
    "0X10",
    "0o17",
    "0b101",
    "+5",
    "-5",
    "5",
    "007",
    "1_000",
    "3.5",
    ".5",
    "5.",
    ".inf",
    ".Inf",
    ".INF",
    "-.inf",
    "+.inf",
    ".nan",
    ".NaN",
    "inf",
    "nan",
    "NaN",
    "infinity",
    "-",
    "--",
    "---",
    "...",
    "?",
    ":",
    "- x",
    "? x",
    ": x",
    "a: b",
    "a:b",
    "#",
    "a #b",
    "#a",
    " a",
    "a ",
    " ",
    "",
    "\t",
    "a\nb",
    "\n",
    "\r\n",
    "'",
    "\"",
    "\\",
    "&a",
    "*a",
    "!a",
    "!!str",
    "%a",
    "@a",
    "`a",
    "|",
    ">",
    "[a]",
    "{a}",
    ",",
    "a,b",
    "é",
    "日本",
    "🦀",
    "\u{0}",
    "\u{7f}",
    "\u{85}",
    "\u{feff}x",
    "\u{2028}",
];

fn tricky() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(TRICKY).prop_map(String::from),
        1 => "[a-zA-Z0-9_ .:#+\\-~]{0,8}",
        1 => "\\PC{0,8}",
        1 => any::<String>(),
    ]
}

fn runner() -> TestRunner {
    TestRunner::new(RunnerConfig {
        cases: 512,
        failure_persistence: None,
        ..RunnerConfig::default()
    })
}

/// `check` on every fixed tricky string, then on proptest's; a failure
/// panics with `check`'s message.
fn on_every_tricky_string<T>(check: impl Fn(&str) -> Result<T, String>) {
    for s in TRICKY {
        check(s).unwrap_or_else(|e| panic!("{e}"));
    }
    let swept = runner().run(&tricky(), |s| {
        check(&s).map_err(TestCaseError::fail)?;
        Ok(())
    });
    if let Err(e) = swept {
        panic!("{e}");
    }
}

fn read_back(text: &str) -> Result<yaml::Node, String> {
    let nodes = yaml::parse("t.yaml", text).map_err(|d| format!("{d}\n{text}"))?;
    nodes
        .into_iter()
        .next()
        .ok_or_else(|| format!("empty\n{text}"))
}

/// A scalar as a value, a key and a flow sequence item reads back as the
/// same string.
#[test]
fn every_string_is_written_so_it_reads_back_unchanged() {
    let check = |s: &str| -> Result<(), String> {
        let q = emit::scalar(s);
        let text = format!("v: {q}\nm:\n  {q}: 1\nl: [{q}, {q}]\nf: {{ k: {q} }}\n");
        let node = read_back(&text)?;
        let Kind::Map(pairs) = &node.kind else {
            return Err(format!("not a map\n{text}"));
        };
        let str_of = |n: &yaml::Node| match &n.kind {
            Kind::Str(t) => Some(t.clone()),
            _ => None,
        };
        let want = Some(s.to_owned());
        let key = match &pairs[1].1.kind {
            Kind::Map(p) => p.first().and_then(|(k, _)| str_of(k)),
            _ => None,
        };
        if str_of(&pairs[0].1) != want || key != want {
            return Err(format!("{s:?} written as {q} read back otherwise"));
        }
        match &pairs[2].1.kind {
            Kind::Seq(items) if items.iter().all(|i| str_of(i) == want) => {}
            _ => return Err(format!("{s:?} in a flow sequence as {q}")),
        }
        match &pairs[3].1.kind {
            Kind::Map(p) if str_of(&p[0].1) == want => Ok(()),
            _ => Err(format!("{s:?} in a flow map as {q}")),
        }
    };
    on_every_tricky_string(check);
}

fn config_with(name: &str) -> Option<Config> {
    let doc = json!({"namespaces": [{"name": name, "resources": [
        {"name": name, "algorithm": "token_bucket", "capacity": 10, "rate": "1/s",
         "domains": {name: {"capacity": 5}, "plain": {"capacity": 6}}},
        {"name": format!("c{name}"), "kind": "concurrency", "domain_limit": 3,
         "groups": [{"name": name, "limit": 2, "members": [name, "other"]}],
         "domains": {name: {"domain_limit": 1}}},
    ]}]});
    load_str("t.json", &doc.to_string()).ok().map(|l| l.config)
}

/// Resource and namespace names, domain-override keys and group members:
/// a config the loader accepts is emitted and loads back equal, with the
/// names as given.
#[test]
fn names_overrides_and_members_round_trip_through_the_emitter() {
    let check = |s: &str| -> Result<bool, String> {
        let Some(config) = config_with(s) else {
            return Ok(false); // a name the loader refuses: nothing to emit
        };
        let r = &config.namespaces[0].resources[0];
        if r.name != s {
            return Err(format!("loaded name {:?} for {s:?}", r.name));
        }
        if let ResourceKind::Rate(rate) = &r.kind {
            if !rate.domains.contains_key(s) {
                return Err(format!("override {s:?} missing: {:?}", rate.domains.keys()));
            }
        }
        let text = emit::to_yaml(&config);
        let again = load_str("emitted.yaml", &text)
            .map_err(|e| format!("{s:?}: emitted config refused: {e}\n{text}"))?;
        // Positions differ between the two loads: compare what they limit
        // (the emitted form) and the names themselves.
        if emit::to_yaml(&again.config) != text {
            return Err(format!("{s:?} changed on the round trip\n{text}"));
        }
        let ns = &again.config.namespaces[0];
        let (rate, conc) = (&ns.resources[0], &ns.resources[1]);
        let names_kept = ns.name == s
            && rate.name == s
            && matches!(&rate.kind, ResourceKind::Rate(r) if r.domains.contains_key(s))
            && matches!(&conc.kind, ResourceKind::Concurrency(c)
                if c.overrides().contains_key(s)
                    && c.groups()[0].name == s
                    && c.groups()[0].members.contains(s));
        if !names_kept {
            return Err(format!("{s:?} renamed on the round trip\n{text}"));
        }
        Ok(true)
    };
    for s in [
        "NULL", "True", "TRUE", "False", "Null", "~", "1e3", "0x10", ".inf", "-",
    ] {
        assert!(
            check(s).unwrap_or_else(|e| panic!("{e}")),
            "the loader refused {s:?}"
        );
    }
    on_every_tricky_string(check);
}
