//! Live usage for the console: what the limiting servers are deciding now,
//! per resource, read from their Prometheus `/metrics`
//! (`tollgate_decisions_total` by `namespace`, `resource` and `outcome`,
//! `tollgate_hits_granted_total`, `tollgate_hits_reported_total`,
//! `tollgate_hits_refunded_total`, `tollgate_near_limit_total`), summed
//! over the servers and their surfaces, with rates over the last refresh;
//! and the domains they refused most lately, from their `GET /v1/denied`
//! (a bounded summary per server, summed here).
//!
//! Sans-IO: the binary fetches the servers' metrics texts (bounded in time
//! and bytes) and hands them to [`Board::record`] with the time; the API's
//! `GET /v1/usage` answers [`Board::view`]. Parsing and arithmetic are
//! pure, so tests drive them with texts and times of their choosing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde_json::{json, Value};

/// The most resources one view holds; past it, the rest are counted in
/// `resources_left_off` (a server labels only names its config knows,
/// but several servers with different configs add up).
pub const MAX_RESOURCES: usize = 10_000;

/// The most servers `--servers` may name.
pub const MAX_SERVERS: usize = 64;

/// The longest metrics text (or `/v1/denied` answer) read from one
/// server; a longer one is refused by the fetcher, and the server's
/// status says [`TOO_LARGE`].
pub const MAX_METRICS_BYTES: usize = 8 * 1024 * 1024;

/// How a server's error begins when its answer was over
/// [`MAX_METRICS_BYTES`]; its state is then `too_large`.
pub const TOO_LARGE: &str = "too large";

/// A resource: its namespace and its name, kept apart (a name may hold a
/// `/`, so `NS/RESOURCE` strings could collide).
pub type Key = (String, String);

/// One resource's counters, summed over servers and surfaces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Counters {
    /// Decisions (granted and rejected).
    pub decisions: f64,
    /// Decisions that rejected.
    pub rejected: f64,
    /// Hits granted by checks.
    pub hits_granted: f64,
    /// Hits charged after the fact (reports).
    pub hits_reported: f64,
    /// Hits given back (refunds).
    pub hits_refunded: f64,
    /// Grants that left at most a tenth of the limit.
    pub near_limit: f64,
}

/// The per-resource counters of one metrics text.
pub fn parse(text: &str) -> BTreeMap<Key, Counters> {
    let mut out: BTreeMap<Key, Counters> = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        let (name, rest) = match line.split_once('{') {
            Some(x) => x,
            None => continue,
        };
        let decisions = name == "tollgate_decisions_total";
        let hits = name == "tollgate_hits_granted_total";
        let reported = name == "tollgate_hits_reported_total";
        let refunded = name == "tollgate_hits_refunded_total";
        let near = name == "tollgate_near_limit_total";
        if !decisions && !hits && !reported && !refunded && !near {
            continue;
        }
        let Some((labels, value)) = rest.rsplit_once('}') else {
            continue;
        };
        let Some(value) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
        else {
            continue;
        };
        let labels = parse_labels(labels);
        let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let (Some(ns), Some(resource)) = (get("namespace"), get("resource")) else {
            continue;
        };
        // Errors carry no resource; unconfigured names share one label.
        if ns.is_empty() || resource.is_empty() || ns == "_unconfigured" {
            continue;
        }
        let c = out.entry((ns.to_owned(), resource.to_owned())).or_default();
        if hits {
            c.hits_granted += value;
        } else if reported {
            c.hits_reported += value;
        } else if refunded {
            c.hits_refunded += value;
        } else if near {
            c.near_limit += value;
        } else {
            match get("outcome") {
                Some("granted") => c.decisions += value,
                Some("rejected") => {
                    c.decisions += value;
                    c.rejected += value;
                }
                _ => {}
            }
        }
    }
    out
}

/// `a="x",b="y\"z"` as pairs (Prometheus escapes `\\`, `\"` and `\n`).
fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while matches!(chars.peek(), Some(',' | ' ')) {
            chars.next();
        }
        let mut name = String::new();
        for c in chars.by_ref() {
            if c == '=' {
                break;
            }
            name.push(c);
        }
        if name.is_empty() || chars.next() != Some('"') {
            return out;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                c => value.push(c),
            }
        }
        out.push((name.trim().to_owned(), value));
    }
}

/// What one server's fetch gave: its metrics text, or why there is none.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// The server as `--servers` named it.
    pub server: String,
    /// Its metrics text, or the error.
    pub text: Result<String, String>,
    /// Its `GET /v1/denied` answer, or why there is none (no token, the
    /// token refused, the server's admin endpoints off).
    pub denied: Result<Value, String>,
}

/// The most denied domains shown per resource.
pub const TOP_DENIED: usize = 5;

/// The live usage the console shows, kept between refreshes.
#[derive(Clone, Default)]
pub struct Board {
    inner: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// The servers named, none: no live usage.
    servers: Vec<String>,
    every_ms: u64,
    /// The last refresh: when (Unix ms), each server's counters (kept
    /// per server so a server that misses one refresh does not look like
    /// a drop), and each server's status.
    at_ms: Option<u64>,
    last: BTreeMap<String, BTreeMap<Key, Counters>>,
    status: BTreeMap<String, Option<String>>,
    view: Value,
}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board").finish_non_exhaustive()
    }
}

impl Board {
    /// A board for `servers`, refreshed every `every_ms` (for the page,
    /// which polls as often).
    pub fn new(servers: Vec<String>, every_ms: u64) -> Board {
        let board = Board::default();
        {
            let mut s = board.lock();
            s.servers = servers;
            s.every_ms = every_ms;
            s.view = Self::empty(&s);
        }
        board
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn empty(s: &State) -> Value {
        json!({
            "enabled": !s.servers.is_empty(),
            "every_ms": s.every_ms,
            "at_ms": null,
            "servers": s.servers.iter().map(|a| json!({"server": a, "ok": null, "state": null, "error": null, "denied_error": null})).collect::<Vec<_>>(),
            "namespaces": {},
            "top_denied_unavailable": null,
            "resources_left_off": 0,
        })
    }

    /// The servers it reads.
    pub fn servers(&self) -> Vec<String> {
        self.lock().servers.clone()
    }

    /// Takes one refresh's fetches, made at `now_ms`: totals per resource,
    /// and per-second rates since the previous refresh of each server.
    pub fn record(&self, now_ms: u64, fetched: Vec<Fetched>) {
        let mut s = self.lock();
        let elapsed_s = s
            .at_ms
            .map(|at| now_ms.saturating_sub(at) as f64 / 1000.0)
            .filter(|e| *e > 0.0);
        let mut totals: BTreeMap<Key, Counters> = BTreeMap::new();
        let mut rates: BTreeMap<Key, Counters> = BTreeMap::new();
        let mut denied: BTreeMap<Key, BTreeMap<String, f64>> = BTreeMap::new();
        let mut denied_errors: BTreeMap<String, String> = BTreeMap::new();
        let mut denied_answered = false;
        for f in fetched {
            let namespaces = match &f.denied {
                Ok(d) => d.get("namespaces").and_then(Value::as_object),
                Err(e) => {
                    denied_errors.insert(f.server.clone(), e.clone());
                    None
                }
            };
            if let Some(namespaces) = namespaces {
                denied_answered = true;
                let resources = namespaces.iter().flat_map(|(ns, resources)| {
                    resources
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(move |(r, list)| (ns, r, list))
                });
                for (ns, r, list) in resources.take(MAX_RESOURCES) {
                    let domains = denied.entry((ns.clone(), r.clone())).or_default();
                    for c in list.as_array().into_iter().flatten().take(64) {
                        let (Some(d), Some(n)) = (
                            c.get("domain").and_then(Value::as_str),
                            c.get("rejected").and_then(Value::as_f64),
                        ) else {
                            continue;
                        };
                        *domains.entry(d.to_owned()).or_default() += n;
                    }
                }
            }
            match f.text {
                Ok(text) => {
                    let now = parse(&text);
                    let before = s.last.get(&f.server);
                    for (key, c) in &now {
                        let t = totals.entry(key.clone()).or_default();
                        t.decisions += c.decisions;
                        t.rejected += c.rejected;
                        t.hits_granted += c.hits_granted;
                        t.hits_reported += c.hits_reported;
                        t.hits_refunded += c.hits_refunded;
                        t.near_limit += c.near_limit;
                        if let (Some(e), Some(prev)) = (elapsed_s, before) {
                            let p = prev.get(key).copied().unwrap_or_default();
                            // A counter below its last value: the server
                            // restarted; it counted `c` since.
                            let d = |now: f64, was: f64| if now >= was { now - was } else { now };
                            let r = rates.entry(key.clone()).or_default();
                            r.decisions += d(c.decisions, p.decisions) / e;
                            r.rejected += d(c.rejected, p.rejected) / e;
                            r.hits_granted += d(c.hits_granted, p.hits_granted) / e;
                            r.hits_reported += d(c.hits_reported, p.hits_reported) / e;
                            r.hits_refunded += d(c.hits_refunded, p.hits_refunded) / e;
                            r.near_limit += d(c.near_limit, p.near_limit) / e;
                        }
                    }
                    s.last.insert(f.server.clone(), now);
                    s.status.insert(f.server, None);
                }
                Err(e) => {
                    s.last.remove(&f.server);
                    s.status.insert(f.server, Some(e));
                }
            }
        }
        s.at_ms = Some(now_ms);
        let left_off = totals.len().saturating_sub(MAX_RESOURCES);
        let mut namespaces = serde_json::Map::new();
        for (key, v) in totals.into_iter().take(MAX_RESOURCES).map(|(key, t)| {
            let r = rates.get(&key).copied();
            let mut top: Vec<(String, f64)> = denied
                .get(&key)
                .map(|d| d.iter().map(|(k, v)| (k.clone(), *v)).collect())
                .unwrap_or_default();
            top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            top.truncate(TOP_DENIED);
            let top: Vec<Value> = top
                .into_iter()
                .map(|(domain, rejected)| json!({"domain": domain, "rejected": rejected}))
                .collect();
            let v = json!({
                "decisions": t.decisions,
                "rejected": t.rejected,
                "hits_granted": t.hits_granted,
                "hits_reported": t.hits_reported,
                "hits_refunded": t.hits_refunded,
                "near_limit": t.near_limit,
                "decisions_per_s": r.map(|r| r.decisions),
                "rejected_per_s": r.map(|r| r.rejected),
                "hits_granted_per_s": r.map(|r| r.hits_granted),
                "hits_reported_per_s": r.map(|r| r.hits_reported),
                "hits_refunded_per_s": r.map(|r| r.hits_refunded),
                "near_limit_per_s": r.map(|r| r.near_limit),
                "top_denied": top,
            });
            (key, v)
        }) {
            let (ns, resource) = key;
            if let Value::Object(resources) = namespaces
                .entry(ns)
                .or_insert_with(|| Value::Object(serde_json::Map::new()))
            {
                resources.insert(resource, v);
            }
        }
        // Said once for the page: no server answered its top denied
        // domains, and why (the first server's reason).
        let unavailable = if denied_answered {
            None
        } else {
            denied_errors.values().next().cloned()
        };
        let servers: Vec<Value> = s
            .servers
            .iter()
            .map(|a| {
                let status = s.status.get(a);
                let error = status.cloned().flatten();
                let state = match (status, &error) {
                    (None, _) => None,
                    (Some(None), _) => Some("ok"),
                    (Some(Some(_)), Some(e)) if e.starts_with(TOO_LARGE) => Some("too_large"),
                    (Some(Some(_)), _) => Some("error"),
                };
                json!({
                    "server": a,
                    "ok": status.map(Option::is_none),
                    "state": state,
                    "error": error,
                    "denied_error": denied_errors.get(a),
                })
            })
            .collect();
        s.view = json!({
            "enabled": true,
            "every_ms": s.every_ms,
            "at_ms": now_ms,
            "servers": servers,
            "namespaces": namespaces,
            "resources_left_off": left_off,
            "top_denied_unavailable": unavailable,
        });
    }

    /// What `GET /v1/usage` answers.
    pub fn view(&self) -> Value {
        self.lock().view.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = r#"# TYPE tollgate_decisions_total counter
tollgate_decisions_total{surface="http",namespace="shop",resource="api",outcome="granted"} 7
tollgate_decisions_total{surface="grpc",namespace="shop",resource="api",outcome="granted"} 3
tollgate_decisions_total{surface="http",namespace="shop",resource="api",outcome="rejected"} 5
tollgate_decisions_total{surface="http",namespace="",resource="",outcome="error",reason="malformed_request"} 2
tollgate_decisions_total{surface="http",namespace="_unconfigured",resource="_unconfigured",outcome="granted"} 9
tollgate_decisions_total{surface="http",namespace="we\"ird",resource="a,b",outcome="rejected"} 1
tollgate_hits_granted_total{namespace="shop",resource="api"} 12
tollgate_hits_reported_total{namespace="shop",resource="api"} 30
tollgate_hits_refunded_total{namespace="shop",resource="api"} 6
tollgate_near_limit_total{surface="http",namespace="shop",resource="api"} 4
tollgate_sessions 0
"#;

    #[test]
    fn metrics_are_summed_per_resource() {
        let p = parse(ONE);
        assert_eq!(
            p[&("shop".to_owned(), "api".to_owned())],
            Counters {
                decisions: 15.0,
                rejected: 5.0,
                hits_granted: 12.0,
                hits_reported: 30.0,
                hits_refunded: 6.0,
                near_limit: 4.0,
            }
        );
        assert_eq!(p[&("we\"ird".to_owned(), "a,b".to_owned())].rejected, 1.0);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(parse("garbage{ 1\n{}\nx{a=\"1\"} notanumber").is_empty());
    }

    #[test]
    fn rates_come_from_the_last_refresh_of_each_server() {
        let board = Board::new(vec!["a".into(), "b".into()], 5000);
        assert_eq!(board.view()["enabled"], true);
        let text = |granted: u32, rejected: u32| {
            format!(
                "tollgate_decisions_total{{namespace=\"n\",resource=\"r\",outcome=\"granted\"}} {granted}\n\
                 tollgate_decisions_total{{namespace=\"n\",resource=\"r\",outcome=\"rejected\"}} {rejected}\n\
                 tollgate_hits_reported_total{{namespace=\"n\",resource=\"r\"}} {granted}\n"
            )
        };
        let ok = |server: &str, t: String| Fetched {
            server: server.into(),
            text: Ok(t),
            denied: Err("no token".into()),
        };
        board.record(1_000, vec![ok("a", text(10, 0)), ok("b", text(5, 5))]);
        let v = board.view();
        assert_eq!(v["namespaces"]["n"]["r"]["decisions"], 20.0);
        assert_eq!(v["namespaces"]["n"]["r"]["rejected"], 5.0);
        assert_eq!(v["namespaces"]["n"]["r"]["decisions_per_s"], Value::Null);
        // Two seconds on: a made 10 more decisions (2 rejected), b is
        // down.
        board.record(
            3_000,
            vec![
                ok("a", text(18, 2)),
                Fetched {
                    server: "b".into(),
                    text: Err("connection refused".into()),
                    denied: Err("no token".into()),
                },
            ],
        );
        let v = board.view();
        assert_eq!(v["namespaces"]["n"]["r"]["decisions_per_s"], 5.0);
        assert_eq!(v["namespaces"]["n"]["r"]["rejected_per_s"], 1.0);
        // a reported 8 more hits in those two seconds.
        assert_eq!(v["namespaces"]["n"]["r"]["hits_reported_per_s"], 4.0);
        assert_eq!(v["servers"][1]["ok"], false);
        assert_eq!(v["servers"][1]["error"], "connection refused");
        // A restarted server's counters start again from zero.
        board.record(5_000, vec![ok("a", text(4, 0))]);
        assert_eq!(board.view()["namespaces"]["n"]["r"]["decisions_per_s"], 2.0);
        assert_eq!(Board::new(vec![], 5000).view()["enabled"], false);
    }

    #[test]
    fn denied_domains_are_summed_over_servers_and_cut_to_the_top() {
        let board = Board::new(vec!["a".into(), "b".into()], 5000);
        let metrics =
            "tollgate_decisions_total{namespace=\"n\",resource=\"r\",outcome=\"rejected\"} 9\n";
        let denied = |pairs: &[(&str, u32)]| {
            let list: Vec<Value> = pairs
                .iter()
                .map(|(d, n)| json!({"domain": d, "rejected": n, "error": 0}))
                .collect();
            Ok(json!({"window_s": 60, "namespaces": {"n": {"r": list}}}))
        };
        board.record(
            1_000,
            vec![
                Fetched {
                    server: "a".into(),
                    text: Ok(metrics.into()),
                    denied: denied(&[("acme", 5), ("x1", 1), ("x2", 1), ("x3", 1)]),
                },
                Fetched {
                    server: "b".into(),
                    text: Ok(metrics.into()),
                    denied: denied(&[("globex", 4), ("acme", 2), ("x4", 1)]),
                },
            ],
        );
        let top = board.view()["namespaces"]["n"]["r"]["top_denied"].clone();
        assert_eq!(
            top,
            json!([
                {"domain": "acme", "rejected": 7.0},
                {"domain": "globex", "rejected": 4.0},
                {"domain": "x1", "rejected": 1.0},
                {"domain": "x2", "rejected": 1.0},
                {"domain": "x3", "rejected": 1.0},
            ])
        );
    }

    /// Regression: resources were keyed `NS/RESOURCE`, so namespace `a`
    /// with resource `b/db` and namespace `a/b` with resource `db` were
    /// summed as one.
    #[test]
    fn resources_with_slashes_in_their_names_stay_apart() {
        let text = "tollgate_decisions_total{namespace=\"a\",resource=\"b/db\",outcome=\"granted\"} 1\n\
                    tollgate_decisions_total{namespace=\"a/b\",resource=\"db\",outcome=\"granted\"} 2\n";
        let board = Board::new(vec!["s".into()], 5000);
        let denied = json!({"namespaces": {
            "a": {"b/db": [{"domain": "x", "rejected": 1}]},
            "a/b": {"db": [{"domain": "y", "rejected": 2}]},
        }});
        board.record(
            1_000,
            vec![Fetched {
                server: "s".into(),
                text: Ok(text.into()),
                denied: Ok(denied),
            }],
        );
        let v = board.view();
        assert_eq!(v["namespaces"]["a"]["b/db"]["decisions"], 1.0);
        assert_eq!(v["namespaces"]["a/b"]["db"]["decisions"], 2.0);
        assert_eq!(
            v["namespaces"]["a"]["b/db"]["top_denied"],
            json!([{"domain": "x", "rejected": 1.0}])
        );
        assert_eq!(v["top_denied_unavailable"], Value::Null);
    }

    #[test]
    fn a_server_too_large_or_without_denied_domains_is_said_so() {
        let board = Board::new(vec!["big".into(), "small".into()], 5000);
        board.record(
            1_000,
            vec![
                Fetched {
                    server: "big".into(),
                    text: Err(format!("{TOO_LARGE}: its /metrics is larger than 8 MiB")),
                    denied: Err("no --servers-token-file".into()),
                },
                Fetched {
                    server: "small".into(),
                    text: Ok("tollgate_decisions_total{namespace=\"n\",resource=\"r\",outcome=\"rejected\"} 3\n".into()),
                    denied: Err("no --servers-token-file".into()),
                },
            ],
        );
        let v = board.view();
        assert_eq!(v["servers"][0]["state"], "too_large");
        assert_eq!(v["servers"][1]["state"], "ok");
        assert_eq!(v["namespaces"]["n"]["r"]["rejected"], 3.0);
        assert_eq!(v["namespaces"]["n"]["r"]["top_denied"], json!([]));
        assert_eq!(v["top_denied_unavailable"], "no --servers-token-file");
    }
}
