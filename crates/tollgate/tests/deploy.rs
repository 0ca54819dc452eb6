//! What can be proved about `deploy/` without a container engine or a
//! Kubernetes cluster:
//!
//! - every manifest, the chart's Chart.yaml and values.yaml parse as YAML,
//!   and the dashboard as JSON;
//! - the Helm chart, rendered for each mode with its default values by
//!   [`helm`] (the template subset the chart uses; anything else fails),
//!   is the plain manifests of that mode;
//! - every `tollgate` command line (the Dockerfile's entrypoint with its
//!   environment, each container of the manifests and of rendered charts)
//!   is accepted by `tollgate serve --check`, run on the files its volumes
//!   would hold (the ConfigMap in the kubelet's layout, a test secret), its
//!   `$(VAR)` expanded as the kubelet expands them;
//! - every port of a probe, a container and a Service is one that
//!   command line listens on, every `TOLLGATE_*` variable is one the
//!   binary reads, every probe path is answered by a real server and
//!   every gRPC health probe by its gRPC health service;
//! - every metric the dashboard queries is exported by real servers (a
//!   memory, a Redis and a cluster one);
//! - a ConfigMap mounted as a directory is reloaded when the kubelet
//!   swaps its `..data` symlink.
//!
//! What it cannot prove: that the image builds and runs (no engine here),
//! that Kubernetes accepts the objects (no API server; the fields are
//! standard ones), that DNS in a cluster resolves the headless Service.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "deploy/helm.rs"]
mod helm;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::serving::Serving;
use common::{Run, Sandbox};
use serde_json::{json, Value};
use tollgate_config::yaml;
use tollgate_redis::testing::RedisServer;

/// The repository's `deploy/`.
fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A YAML node as JSON (positions dropped), for comparing documents.
fn to_json(n: &yaml::Node) -> Value {
    match &n.kind {
        yaml::Kind::Null => Value::Null,
        yaml::Kind::Bool(b) => json!(b),
        yaml::Kind::Int(i) => json!(i),
        yaml::Kind::Float(f) => json!(f),
        yaml::Kind::Str(s) => json!(s),
        yaml::Kind::Seq(items) => Value::Array(items.iter().map(to_json).collect()),
        yaml::Kind::Map(entries) => Value::Object(
            entries
                .iter()
                .map(|(k, v)| {
                    let key = match &k.kind {
                        yaml::Kind::Str(s) => s.clone(),
                        other => panic!("{}: a key that is not a string: {other:?}", k.pos),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
    }
}

/// The documents of a YAML text (empty ones skipped).
fn documents(name: &str, text: &str) -> Vec<Value> {
    yaml::parse(name, text)
        .unwrap_or_else(|e| panic!("{name} is not YAML: {e}\n{text}"))
        .iter()
        .map(to_json)
        .filter(|d| !d.is_null())
        .collect()
}

const MODES: [&str; 3] = ["memory", "redis", "cluster"];

/// The plain manifests of `mode`.
fn plain(mode: &str) -> Vec<Value> {
    let path = deploy().join(format!("kubernetes/{mode}.yaml"));
    documents(&path.display().to_string(), &read(&path))
}

/// The chart's default values with `overrides` merged in.
fn values(overrides: &Value) -> Value {
    let path = deploy().join("helm/tollgate/values.yaml");
    let mut v = documents("values.yaml", &read(&path)).remove(0);
    merge(&mut v, overrides);
    v
}

fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

/// The chart rendered with `overrides`, release `tollgate`: (template
/// name, text), or the render's error.
fn render_chart(overrides: &Value) -> Result<Vec<(String, String)>, String> {
    let dir = deploy().join("helm/tollgate/templates");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_str().unwrap().to_owned(),
                read(&p),
            )
        })
        .collect();
    files.sort();
    let chart = helm::Chart::parse(&files).unwrap_or_else(|e| panic!("the chart: {e}"));
    chart.render(&values(overrides), "tollgate")
}

/// The chart rendered with `overrides`, release `tollgate`, as documents.
fn rendered(overrides: &Value) -> Vec<Value> {
    let out = render_chart(overrides).unwrap_or_else(|e| panic!("rendering {overrides}: {e}"));
    out.iter()
        .flat_map(|(name, text)| documents(name, text))
        .collect()
}

/// Objects by (kind, name).
fn by_name(docs: Vec<Value>) -> BTreeMap<(String, String), Value> {
    let mut out = BTreeMap::new();
    for d in docs {
        let key = (
            d["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("no kind: {d}"))
                .to_owned(),
            d["metadata"]["name"]
                .as_str()
                .unwrap_or_else(|| panic!("no name: {d}"))
                .to_owned(),
        );
        assert!(out.insert(key.clone(), d).is_none(), "{key:?} twice");
    }
    out
}

#[test]
fn every_file_in_deploy_parses() {
    for mode in MODES {
        let docs = plain(mode);
        assert!(!docs.is_empty(), "{mode}");
        for d in &docs {
            assert!(
                d["apiVersion"].is_string() && d["kind"].is_string(),
                "{mode}: {d}"
            );
        }
    }
    let chart = documents(
        "Chart.yaml",
        &read(&deploy().join("helm/tollgate/Chart.yaml")),
    );
    assert_eq!(chart.len(), 1);
    assert_eq!(chart[0]["apiVersion"], "v2");
    assert_eq!(chart[0]["name"], "tollgate");
    assert_eq!(chart[0]["version"], chart[0]["appVersion"]);
    let values = values(&json!({}));
    assert_eq!(values["mode"], "memory");
    let dashboard: Value =
        serde_json::from_str(&read(&deploy().join("grafana/tollgate.json"))).unwrap();
    assert_eq!(dashboard["uid"], "tollgate");
}

#[test]
fn the_chart_renders_the_plain_manifests_of_each_mode() {
    for mode in MODES {
        let chart = by_name(rendered(&json!({ "mode": mode })));
        let plain = by_name(plain(mode));
        assert_eq!(
            chart.keys().collect::<Vec<_>>(),
            plain.keys().collect::<Vec<_>>(),
            "{mode}: the same objects"
        );
        for (key, want) in &plain {
            assert_eq!(
                &chart[key], want,
                "{mode}: {key:?} rendered differs from deploy/kubernetes/{mode}.yaml"
            );
        }
    }
    // A Redis of one's own: no Redis objects, and the servers use it.
    let own = by_name(rendered(
        &json!({ "mode": "redis", "redis": { "url": "rediss://redis.example:6380/1" } }),
    ));
    assert!(
        !own.keys().any(|(_, name)| name.contains("redis")),
        "{own:?}"
    );
    // Another cluster domain: in the peers' name, still fully qualified.
    let other = by_name(rendered(
        &json!({ "mode": "cluster", "clusterDomain": "corp.example" }),
    ));
    let args = &other[&("StatefulSet".to_owned(), "tollgate".to_owned())]["spec"]["template"]
        ["spec"]["containers"][0]["args"];
    let args: Vec<&str> = args
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let peers = args.iter().position(|a| *a == "--peers").unwrap();
    assert_eq!(
        args[peers + 1],
        "dns:tollgate-peers.$(POD_NAMESPACE).svc.corp.example.:7946"
    );
}

/// The args of the tollgate container of the chart's server with
/// `overrides`.
fn server_args(overrides: &Value) -> Vec<String> {
    let docs = rendered(overrides);
    let server = docs
        .iter()
        .find(|d| {
            matches!(d["kind"].as_str(), Some("Deployment" | "StatefulSet"))
                && d["metadata"]["name"] == "tollgate"
        })
        .unwrap_or_else(|| panic!("no server in {docs:?}"));
    server["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// Regression: a mode the chart does not know (`Redis`) rendered a
/// Deployment without a store, and values were put in the manifest
/// unquoted.
#[test]
fn the_chart_refuses_an_unknown_mode_and_quotes_urls() {
    for mode in ["Redis", "", "clustered"] {
        let e = render_chart(&json!({ "mode": mode }))
            .map(|_| ())
            .expect_err(&format!("mode {mode:?} rendered"));
        assert!(
            e.contains("mode must be memory, redis or cluster"),
            "{mode:?}: {e}"
        );
    }
    // Characters YAML would read otherwise in a plain scalar (a comment
    // after ` #`, a leading `*` alias, a `: ` mapping): kept as given.
    for url in [
        "rediss://:p#ss@redis.example:6380/1",
        "redis://redis.example:6379/0 #1",
        "*redis.example",
        "redis://h: 1",
    ] {
        let args = server_args(&json!({ "mode": "redis", "redis": { "url": url } }));
        let store = args.iter().position(|a| a == "--store").unwrap();
        assert_eq!(args[store + 1], url, "{args:?}");
        let args = server_args(&json!({ "otlpEndpoint": url }));
        let otlp = args.iter().position(|a| a == "--otlp-endpoint").unwrap();
        assert_eq!(args[otlp + 1], url, "{args:?}");
    }
}

// ---------------------------------------------------------------------
// Command lines
// ---------------------------------------------------------------------

/// The runtime stage of the Dockerfile: its ENV, ENTRYPOINT, CMD, EXPOSE
/// and USER.
struct Image {
    env: Vec<(String, String)>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    expose: BTreeSet<(u16, String)>,
    user: String,
    from: String,
}

fn image() -> Image {
    let text = read(&deploy().join("Dockerfile"));
    let joined = text.replace("\\\n", " ");
    let mut image = None;
    for line in joined.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let rest = rest.trim();
        match word {
            "FROM" => {
                image = Some(Image {
                    env: Vec::new(),
                    entrypoint: Vec::new(),
                    cmd: Vec::new(),
                    expose: BTreeSet::new(),
                    user: "root".into(),
                    from: rest.to_owned(),
                });
            }
            "ENV" => {
                let i = image.as_mut().unwrap();
                for pair in rest.split_whitespace() {
                    let (k, v) = pair
                        .split_once('=')
                        .unwrap_or_else(|| panic!("ENV {pair}: only KEY=VALUE is read here"));
                    i.env.push((k.to_owned(), v.to_owned()));
                }
            }
            "ENTRYPOINT" | "CMD" => {
                let list: Vec<String> = serde_json::from_str(rest)
                    .unwrap_or_else(|e| panic!("{word} must be a JSON list ({e}): {rest}"));
                let i = image.as_mut().unwrap();
                if word == "CMD" {
                    i.cmd = list;
                } else {
                    i.entrypoint = list;
                }
            }
            "EXPOSE" => {
                for p in rest.split_whitespace() {
                    let (port, proto) = p.split_once('/').unwrap_or((p, "tcp"));
                    let i = image.as_mut().unwrap();
                    i.expose
                        .insert((port.parse().unwrap(), proto.to_uppercase()));
                }
            }
            "USER" => image.as_mut().unwrap().user = rest.to_owned(),
            _ => {}
        }
    }
    image.expect("a FROM")
}

/// What `serve --check` said a command line listens on.
#[derive(Debug)]
struct Listening {
    grpc: u16,
    http: u16,
    gossip: Option<u16>,
}

fn summary_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// Runs `tollgate ARGS` in `dir` with `env` and no other `TOLLGATE_*`.
fn tollgate(dir: &Path, args: &[String], env: &[(String, String)]) -> Run {
    common::run_clean(dir, args, env)
}

/// `serve --check` on `argv` (the image's entrypoint, without the binary,
/// then the container's args).
fn check(what: &str, dir: &Path, argv: &[String], env: &[(String, String)]) -> Listening {
    assert_eq!(
        argv.first().map(String::as_str),
        Some("serve"),
        "{what}: {argv:?}"
    );
    let mut args = vec!["serve".to_owned(), "--check".to_owned()];
    args.extend_from_slice(&argv[1..]);
    let run = tollgate(dir, &args, env);
    assert!(
        run.success(),
        "{what}: `serve --check` refuses it{run}\nenv: {env:?}"
    );
    let line = run.stdout.trim();
    Listening {
        grpc: port_of(summary_field(line, "grpc").unwrap()),
        http: port_of(summary_field(line, "http").unwrap()),
        gossip: summary_field(line, "gossip").map(port_of),
    }
}

/// The kubelet's expansion of `$(VAR)` in args and env values: known
/// variables are replaced, `$$` is a `$`, anything else stays.
fn expand(text: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some(close) = after.strip_prefix('(').and_then(|a| a.find(')')) {
            let name = &after[1..=close];
            match vars.get(name) {
                Some(v) => out.push_str(v),
                None => out.push_str(&format!("$({name})")),
            }
            rest = &after[close + 2..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// What the downward API gives a pod in this test.
fn field_ref(path: &str) -> String {
    match path {
        "metadata.name" => "tollgate-0".into(),
        "metadata.namespace" => "default".into(),
        "status.podIP" => "10.1.2.3".into(),
        other => panic!("a fieldRef this test does not know: {other}"),
    }
}

/// Writes `data` (a ConfigMap's) into `dir` as the kubelet does: the files
/// in a timestamped directory, `..data` a symlink to it, and each key a
/// symlink through `..data`. Returns the timestamped directory's name.
fn kubelet_layout(dir: &Path, data: &serde_json::Map<String, Value>, version: &str) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let stamp = format!("..2025_01_01_00_00_00.{version}");
    std::fs::create_dir(dir.join(&stamp)).unwrap();
    for (key, text) in data {
        std::fs::write(dir.join(&stamp).join(key), text.as_str().unwrap()).unwrap();
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&stamp, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for key in data.keys() {
        let link = dir.join(key);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{key}"), &link).unwrap();
        }
    }
    stamp
}

/// Ports and probes found in the manifests, for the tests that follow.
#[derive(Default)]
struct Seen {
    probe_paths: BTreeSet<String>,
    grpc_services: BTreeSet<String>,
    env_names: BTreeSet<String>,
    gossip_ports: BTreeSet<u16>,
}

/// Checks every tollgate container of `docs` (`what` names them): its
/// command line passes `serve --check` on the files its volumes hold, and
/// its ports, probes and Services agree with what it listens on.
fn check_workloads(what: &str, docs: &[Value], image: &Image, seen: &mut Seen) {
    let objects = by_name(docs.to_vec());
    let config_maps: BTreeMap<&str, &Value> = objects
        .iter()
        .filter(|((kind, _), _)| kind == "ConfigMap")
        .map(|((_, name), v)| (name.as_str(), v))
        .collect();
    let services: Vec<&Value> = objects
        .iter()
        .filter(|((kind, _), _)| kind == "Service")
        .map(|(_, v)| v)
        .collect();
    let mut servers = 0;
    for ((kind, name), object) in &objects {
        if !matches!(kind.as_str(), "Deployment" | "StatefulSet") {
            continue;
        }
        let pod = &object["spec"]["template"];
        let labels = pod["metadata"]["labels"].as_object().unwrap();
        assert_eq!(
            &object["spec"]["selector"]["matchLabels"], &pod["metadata"]["labels"],
            "{what}: {name} selects its pods"
        );
        let security = &pod["spec"]["securityContext"];
        assert_eq!(security["runAsNonRoot"], true, "{what}: {name}");
        for container in pod["spec"]["containers"].as_array().unwrap() {
            let cname = format!("{what}: {name}/{}", container["name"]);
            let sc = &container["securityContext"];
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{cname}");
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{cname}");
            assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{cname}");
            assert!(
                container["resources"]["requests"]["memory"].is_string(),
                "{cname}"
            );
            assert!(
                container["resources"]["limits"]["memory"].is_string(),
                "{cname}"
            );
            let tollgate_image = container["image"]
                .as_str()
                .unwrap()
                .starts_with("tollgate:");
            if !tollgate_image {
                continue;
            }
            servers += 1;
            assert!(
                container.get("command").is_none(),
                "{cname}: keeps the image's entrypoint"
            );

            // The pod's files: its volumes, written where they would be
            // mounted (under a temp root).
            let sb = Sandbox::new("deploy-pod");
            let volumes: BTreeMap<&str, &Value> = pod["spec"]["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| (v["name"].as_str().unwrap(), v))
                .collect();
            let mut mounts: Vec<(String, PathBuf)> = Vec::new();
            for m in container["volumeMounts"].as_array().unwrap() {
                let at = m["mountPath"].as_str().unwrap().to_owned();
                let host = sb.dir.join(at.trim_start_matches('/'));
                let volume = volumes[m["name"].as_str().unwrap()];
                if let Some(cm) = volume.get("configMap") {
                    let cm_name = cm["name"].as_str().unwrap();
                    let source = config_maps
                        .get(cm_name)
                        .unwrap_or_else(|| panic!("{cname}: no ConfigMap {cm_name}"));
                    kubelet_layout(&host, source["data"].as_object().unwrap(), "1");
                } else if let Some(secret) = volume.get("secret") {
                    // Created by the operator (docs/deploy.md): a test one.
                    std::fs::create_dir_all(&host).unwrap();
                    for item in secret["items"].as_array().unwrap() {
                        std::fs::write(
                            host.join(item["path"].as_str().unwrap()),
                            "a test cluster secret, 32 bytes\n",
                        )
                        .unwrap();
                    }
                } else {
                    panic!("{cname}: a volume this test does not know: {volume}");
                }
                mounts.push((at, host));
            }
            mounts.sort_by_key(|(at, _)| std::cmp::Reverse(at.len()));
            let on_host = |value: String| -> String {
                if !value.starts_with('/') {
                    return value;
                }
                for (at, host) in &mounts {
                    if value == *at {
                        return host.display().to_string();
                    }
                    if let Some(rest) = value.strip_prefix(&format!("{at}/")) {
                        return host.join(rest).display().to_string();
                    }
                }
                panic!("{cname}: {value} is in no volume of the pod");
            };

            // The environment: the image's, then the container's, expanded
            // as the kubelet does.
            let mut vars: BTreeMap<String, String> = BTreeMap::new();
            let mut env: Vec<(String, String)> = image.env.clone();
            let mut referenced = BTreeSet::new();
            for e in container["env"].as_array().into_iter().flatten() {
                let k = e["name"].as_str().unwrap().to_owned();
                let v = if let Some(v) = e["value"].as_str() {
                    on_host(expand(v, &vars))
                } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                    field_ref(path)
                } else {
                    panic!("{cname}: env {k} comes from where this test does not know: {e}");
                };
                seen.env_names.insert(k.clone());
                vars.insert(k.clone(), v.clone());
                env.push((k, v));
            }
            let args: Vec<String> = container["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| {
                    let a = a.as_str().unwrap();
                    for name in vars.keys() {
                        if a.contains(&format!("$({name})")) {
                            referenced.insert(name.clone());
                        }
                    }
                    on_host(expand(a, &vars))
                })
                .collect();
            for (k, _) in &env {
                assert!(
                    k.starts_with("TOLLGATE_") || referenced.contains(k),
                    "{cname}: {k} is neither read by tollgate nor used in its args"
                );
            }
            let mut argv: Vec<String> = image.entrypoint[1..].to_vec();
            argv.extend(args.iter().cloned());
            let listening = check(&cname, &sb.dir, &argv, &env);

            // The kubelet's SIGKILL comes after the longest shutdown: the
            // delay, open connections' grace, releasing holds and flushing
            // spans (each up to the grace), leaving the gossip cluster.
            let flag = |name: &str| -> Option<u64> {
                let i = args.iter().position(|a| a == name)?;
                Some(args[i + 1].parse().unwrap())
            };
            let delay = flag("--shutdown-delay-ms")
                .unwrap_or_else(|| panic!("{cname}: no --shutdown-delay-ms"));
            assert!(delay > 0, "{cname}: endpoints need time to drop the pod");
            let grace = flag("--shutdown-grace-ms").unwrap_or_else(|| {
                env.iter()
                    .find(|(k, _)| k == "TOLLGATE_SHUTDOWN_GRACE_MS")
                    .map_or(10_000, |(_, v)| v.parse().unwrap())
            });
            let budget = pod["spec"]["terminationGracePeriodSeconds"]
                .as_u64()
                .unwrap_or(30)
                * 1000;
            let longest = delay + 3 * grace + 2000;
            assert!(
                budget >= longest,
                "{cname}: terminationGracePeriodSeconds {} s is below the longest shutdown, {longest} ms",
                budget / 1000
            );

            // Ports: declared, and the ones it listens on.
            let mut ports: BTreeMap<String, (u16, String)> = BTreeMap::new();
            for p in container["ports"].as_array().unwrap() {
                let port = u16::try_from(p["containerPort"].as_u64().unwrap()).unwrap();
                let proto = p["protocol"].as_str().unwrap_or("TCP").to_owned();
                match proto.as_str() {
                    "TCP" => assert!(
                        port == listening.grpc || port == listening.http,
                        "{cname}: containerPort {port} is neither --grpc nor --http ({listening:?})"
                    ),
                    "UDP" => assert_eq!(Some(port), listening.gossip, "{cname}: UDP {port}"),
                    other => panic!("{cname}: protocol {other}"),
                }
                ports.insert(p["name"].as_str().unwrap().to_owned(), (port, proto));
            }
            let declared: BTreeSet<(u16, String)> = ports.values().cloned().collect();
            let mut wanted = BTreeSet::from([
                (listening.grpc, "TCP".to_owned()),
                (listening.http, "TCP".to_owned()),
            ]);
            if let Some(g) = listening.gossip {
                wanted.insert((g, "UDP".to_owned()));
                seen.gossip_ports.insert(g);
            }
            assert_eq!(
                declared, wanted,
                "{cname}: every port it listens on is declared"
            );
            let resolve = |port: &Value| -> u16 {
                match port {
                    Value::String(name) => {
                        ports
                            .get(name)
                            .unwrap_or_else(|| panic!("{cname}: no port named {name}"))
                            .0
                    }
                    n => u16::try_from(n.as_u64().unwrap()).unwrap(),
                }
            };

            // Probes: HTTP ones on the HTTP port, gRPC ones on the gRPC
            // port.
            for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
                let p = &container[probe];
                assert!(p.is_object(), "{cname}: no {probe}");
                if let Some(get) = p.get("httpGet") {
                    assert_eq!(resolve(&get["port"]), listening.http, "{cname}: {probe}");
                    seen.probe_paths
                        .insert(get["path"].as_str().unwrap().to_owned());
                } else if let Some(grpc) = p.get("grpc") {
                    // Kubernetes' grpc probe takes a number, not a name.
                    assert_eq!(
                        grpc["port"].as_u64(),
                        Some(u64::from(listening.grpc)),
                        "{cname}: {probe}"
                    );
                    seen.grpc_services
                        .insert(grpc["service"].as_str().unwrap_or("").to_owned());
                } else {
                    panic!("{cname}: {probe} is neither httpGet nor grpc: {p}");
                }
            }
            assert_eq!(
                container["livenessProbe"]["httpGet"]["path"], "/healthz",
                "{cname}"
            );
            assert_eq!(
                container["readinessProbe"]["httpGet"]["path"], "/readyz",
                "{cname}"
            );

            // Services that select these pods point at their ports.
            let mut selected = 0;
            for s in &services {
                let selector = s["spec"]["selector"].as_object().unwrap();
                if !selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                    continue;
                }
                selected += 1;
                for p in s["spec"]["ports"].as_array().unwrap() {
                    let proto = p["protocol"].as_str().unwrap_or("TCP");
                    let target = resolve(&p["targetPort"]);
                    assert!(
                        declared.contains(&(target, proto.to_owned())),
                        "{cname}: Service {} port {p} is no port of the pod",
                        s["metadata"]["name"]
                    );
                }
            }
            assert!(selected > 0, "{cname}: no Service selects it");

            // A cluster: the StatefulSet's peers are its headless
            // Service's DNS records, on the gossip port.
            if kind == "StatefulSet" {
                let headless = object["spec"]["serviceName"].as_str().unwrap();
                let svc = services
                    .iter()
                    .find(|s| s["metadata"]["name"] == headless)
                    .unwrap_or_else(|| panic!("{cname}: no Service {headless}"));
                assert_eq!(svc["spec"]["clusterIP"], "None", "{cname}");
                assert_eq!(svc["spec"]["publishNotReadyAddresses"], true, "{cname}");
                let peers = args.iter().position(|a| a == "--peers").unwrap();
                let dns = args[peers + 1].strip_prefix("dns:").unwrap();
                let (host, port) = dns.rsplit_once(':').unwrap();
                assert_eq!(host.split('.').next(), Some(headless), "{cname}: {dns}");
                assert!(
                    host.starts_with(&format!("{headless}.default.svc.")),
                    "{cname}: {dns}"
                );
                // Fully qualified: without the final dot every look-up
                // first walks the pod's search list (ndots:5).
                assert!(host.ends_with('.'), "{cname}: {dns} has no final dot");
                assert_eq!(port.parse::<u16>().ok(), listening.gossip, "{cname}: {dns}");
            }
        }
    }
    assert!(servers > 0, "{what}: no tollgate container");
    // A PodDisruptionBudget covers the servers.
    let pdb = objects
        .iter()
        .find(|((kind, _), _)| kind == "PodDisruptionBudget")
        .unwrap_or_else(|| panic!("{what}: no PodDisruptionBudget"))
        .1;
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "tollgate"
    );
}

/// The `TOLLGATE_*` variables the binary reads: those `serve --help`
/// names (every flag's, and the ones read directly, which the help
/// mentions).
fn variables_read() -> BTreeSet<String> {
    let sb = Sandbox::new("deploy-help");
    let run = sb.run(&["serve", "--help"]);
    assert!(run.success(), "{run}");
    tollgate_words(&run.stdout)
}

fn tollgate_words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .filter(|w| w.starts_with("TOLLGATE_") && w.len() > "TOLLGATE_".len())
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_tollgate_command_line_passes_serve_check() {
    let image = image();
    // The image alone: non-root, the entrypoint `tollgate serve` on every
    // interface, exposing what it listens on.
    assert!(
        image.from.starts_with("gcr.io/distroless/") || image.from.contains("-slim"),
        "a small runtime image: {}",
        image.from
    );
    assert!(
        !["root", "0", "0:0"].contains(&image.user.as_str()),
        "USER {}",
        image.user
    );
    assert!(
        image.entrypoint[0].ends_with("/tollgate"),
        "{:?}",
        image.entrypoint
    );
    assert_eq!(image.entrypoint[1], "serve");
    assert!(
        image.cmd.is_empty(),
        "no CMD: a container's args follow `serve`"
    );
    let sb = Sandbox::new("deploy-image");
    let bare = check("the image", &sb.dir, &image.entrypoint[1..], &image.env);
    for (k, v) in &image.env {
        if k == "TOLLGATE_GRPC" || k == "TOLLGATE_HTTP" {
            assert!(v.starts_with("0.0.0.0:"), "{k}={v}: every interface");
        }
    }

    let mut seen = Seen::default();
    for mode in MODES {
        check_workloads(
            &format!("deploy/kubernetes/{mode}.yaml"),
            &plain(mode),
            &image,
            &mut seen,
        );
        check_workloads(
            &format!("the chart, mode {mode}"),
            &rendered(&json!({ "mode": mode })),
            &image,
            &mut seen,
        );
        check_workloads(
            &format!("the chart, mode {mode}, with otlpEndpoint"),
            &rendered(&json!({ "mode": mode, "otlpEndpoint": "http://otel-collector:4317" })),
            &image,
            &mut seen,
        );
    }
    check_workloads(
        "the chart, mode cluster, with another cluster domain",
        &rendered(&json!({ "mode": "cluster", "clusterDomain": "corp.example" })),
        &image,
        &mut seen,
    );
    check_workloads(
        "the chart, mode redis, with a Redis of one's own",
        &rendered(&json!({ "mode": "redis", "redis": { "url": "rediss://redis.example:6380/1" } })),
        &image,
        &mut seen,
    );

    let expose: BTreeSet<(u16, String)> =
        [(bare.grpc, "TCP".to_owned()), (bare.http, "TCP".to_owned())]
            .into_iter()
            .chain(seen.gossip_ports.iter().map(|p| (*p, "UDP".to_owned())))
            .collect();
    assert_eq!(
        image.expose, expose,
        "EXPOSE: the image's ports and the cluster's gossip"
    );

    // Every TOLLGATE_* variable deploy/ sets, or mentions, is one the
    // binary reads (or, for TOLLGATE_GIT_COMMIT, the build reads).
    let read_by_binary = variables_read();
    let build = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("build.rs"));
    let mut used: BTreeSet<String> = image.env.iter().map(|(k, _)| k.clone()).collect();
    used.extend(
        seen.env_names
            .iter()
            .filter(|k| k.starts_with("TOLLGATE_"))
            .cloned(),
    );
    for entry in walk(&deploy()) {
        used.extend(tollgate_words(&read(&entry)));
    }
    assert!(used.contains("TOLLGATE_GRPC"), "{used:?}");
    for v in &used {
        assert!(
            read_by_binary.contains(v) || build.contains(&format!("\"{v}\"")),
            "{v} is used in deploy/ but tollgate does not read it"
        );
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

// ---------------------------------------------------------------------
// A real server
// ---------------------------------------------------------------------

/// The config of `mode`'s ConfigMap.
fn configmap_config(mode: &str) -> String {
    let objects = by_name(plain(mode));
    objects[&("ConfigMap".to_owned(), "tollgate-config".to_owned())]["data"]["tollgate.yaml"]
        .as_str()
        .unwrap()
        .to_owned()
}

mod grpc_health {
    //! The call the kubelet's `grpc:` probe makes:
    //! `grpc.health.v1.Health/Check`, with the messages of
    //! grpc/health/v1/health.proto written out.

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HealthCheckRequest {
        #[prost(string, tag = "1")]
        pub service: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HealthCheckResponse {
        /// 1 is SERVING.
        #[prost(int32, tag = "1")]
        pub status: i32,
    }

    pub async fn check(addr: std::net::SocketAddr, service: &str) -> Result<i32, tonic::Status> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let path =
            tonic::codegen::http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check");
        let answer = grpc
            .unary(
                tonic::Request::new(HealthCheckRequest {
                    service: service.to_owned(),
                }),
                path,
                tonic_prost::ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default(),
            )
            .await?;
        Ok(answer.into_inner().status)
    }
}

#[test]
fn probes_are_answered_by_a_real_server() {
    let image = image();
    let mut seen = Seen::default();
    for mode in MODES {
        check_workloads(mode, &plain(mode), &image, &mut seen);
    }
    assert!(seen.probe_paths.contains("/healthz") && seen.probe_paths.contains("/readyz"));
    let dir = Sandbox::new("deploy-probes");
    let config = dir.write("tollgate.yaml", configmap_config("memory"));
    let server = Serving::start_config(&dir, &config, &[], &[]);
    for path in &seen.probe_paths {
        let (status, body) = server.http("GET", path, None);
        assert_eq!(status, 200, "GET {path}: {body}");
    }
    assert!(!seen.grpc_services.is_empty(), "a gRPC health probe");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for service in &seen.grpc_services {
        let status = runtime
            .block_on(grpc_health::check(server.grpc, service))
            .unwrap_or_else(|e| panic!("grpc.health.v1.Health/Check {service:?}: {e}"));
        assert_eq!(status, 1, "{service:?} SERVING");
    }
}

#[test]
fn a_configmap_mount_is_reloaded_on_the_kubelets_symlink_swap() {
    let dir = Sandbox::new("deploy-reload");
    let config = configmap_config("memory");
    let mount = dir.path("etc/tollgate");
    let mut data = serde_json::Map::new();
    data.insert("tollgate.yaml".into(), json!(config));
    let first = kubelet_layout(&mount, &data, "1");
    let server = Serving::start_config(&dir, &mount, &["--watch-interval-ms", "20"], &[]);
    let ask = |resource: &str| {
        server.http(
            "POST",
            "/v1/request",
            Some(&format!(
                r#"{{"namespace":"default","resource":"{resource}","domain":"acme","hits":1}}"#
            )),
        )
    };
    assert_eq!(ask("api").0, 200);
    assert_eq!(ask("added").0, 404, "not configured yet");
    // An update: a new timestamped directory, `..data` swapped to it, the
    // old one removed; the path the server watches never changes.
    let updated = format!(
        "{config}      - {{ name: added, algorithm: fixed_window, limit: 5, window: 1h, align: first_hit }}\n"
    );
    data.insert("tollgate.yaml".into(), json!(updated));
    kubelet_layout(&mount, &data, "2");
    std::fs::remove_dir_all(mount.join(first)).unwrap();
    server.poll("the swapped config in force", |s| {
        s.json("GET", "/status", None).1["config"]["revision"] == 2
    });
    assert_eq!(ask("added").0, 200, "served from the swapped config");
    assert!(server.json("GET", "/status", None).1["config"]["last_error"].is_null());
}

// ---------------------------------------------------------------------
// The dashboard
// ---------------------------------------------------------------------

/// The metric names the dashboard queries.
fn dashboard_metrics() -> BTreeSet<String> {
    let dashboard: Value =
        serde_json::from_str(&read(&deploy().join("grafana/tollgate.json"))).unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().unwrap();
        assert!(
            !targets.is_empty(),
            "panel {} queries nothing",
            panel["title"]
        );
        for t in targets {
            exprs.push(t["expr"].as_str().unwrap().to_owned());
            assert_eq!(
                t["datasource"]["uid"], "${datasource}",
                "{}",
                panel["title"]
            );
        }
    }
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            exprs.push(q.to_owned());
        }
    }
    exprs
        .iter()
        .flat_map(|e| {
            e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("tollgate_"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The series names of a server's `/metrics`.
fn exported(server: &Serving) -> BTreeSet<String> {
    let (status, text) = server.http("GET", "/metrics", None);
    assert_eq!(status, 200);
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
        .collect()
}

#[test]
fn every_metric_of_the_dashboard_is_exported() {
    let wanted = dashboard_metrics();
    assert!(wanted.len() > 15, "{wanted:?}");

    // A memory server with the bundled config: grants, rejections, an
    // error, a hold.
    let dir = Sandbox::new("deploy-metrics");
    let memory = Serving::start(
        &dir,
        &["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"],
        &[],
    );
    for _ in 0..7 {
        memory.http(
            "POST",
            "/v1/request",
            Some(r#"{"namespace":"default","resource":"exact","domain":"acme","hits":1}"#),
        );
    }
    // Usage: a report, and a refund within the log's 10 s window (so it
    // gives something back).
    for mode in ["report", "refund"] {
        let body = format!(
            r#"{{"namespace":"default","resource":"exact","domain":"acme","hits":2,"mode":"{mode}"}}"#
        );
        let (status, answer) = memory.http("POST", "/v1/request", Some(&body));
        assert_eq!(status, 200, "{mode}: {answer}");
    }
    memory.http(
        "POST",
        "/v1/request",
        Some(r#"{"namespace":"nope","resource":"api","domain":"acme","hits":1}"#),
    );
    let (status, body) = memory.http(
        "POST",
        "/v1/reserve",
        Some(r#"{"namespace":"default","resource":"sandbox","domain":"acme","copies":1}"#),
    );
    assert_eq!(status, 200, "{body}");

    // A Redis server.
    let redis = RedisServer::start();
    dir.write("tollgate.yaml", configmap_config("redis"));
    let on_redis = Serving::start_redis(&dir, &redis.url(), &[], &[]);

    // Two nodes of a cluster, gossiping.
    dir.write("secret", "a test cluster secret, 32 bytes\n");
    let a = Serving::start_node(&dir, "c", "a", "127.0.0.1:0", &[], &[]);
    let b = Serving::start_node(&dir, "c", "b", "127.0.0.1:0", &[a.gossip()], &[]);
    for s in [&a, &b] {
        s.http(
            "POST",
            "/v1/request",
            Some(r#"{"namespace":"default","resource":"api","domain":"acme","hits":1}"#),
        );
    }

    // Gauges are set by periodic tasks: wait until every series is there,
    // or report the ones that never came.
    let mut missing = wanted.clone();
    for _ in 0..200 {
        let mut all = BTreeSet::new();
        for s in [&memory, &on_redis, &a, &b] {
            all.extend(exported(s));
        }
        missing = wanted.difference(&all).cloned().collect();
        if missing.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics no server exports: {missing:?}"
    );
}
