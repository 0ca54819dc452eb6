//! Hot reload: a changed file is picked up (also through a symlink swap as
//! a Kubernetes ConfigMap does it), a broken one is refused while the old
//! config keeps serving, and unchanged limits keep their state.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, TestServer};
use tokio::sync::{mpsc, watch};
use tollgate_proto::v1;
use tollgate_server::reload;

const V1: &str = r#"
namespaces:
  - name: app
    resources:
      - { name: kept, algorithm: fixed_window, limit: 5, window: 1h, align: first_hit }
      - { name: changed, algorithm: fixed_window, limit: 5, window: 1h, align: first_hit }
"#;

const V2: &str = r#"
namespaces:
  - name: app
    resources:
      - { name: kept, algorithm: fixed_window, limit: 5, window: 1h, align: first_hit }
      - { name: changed, algorithm: fixed_window, limit: 9, window: 1h, align: first_hit }
      - { name: added, algorithm: fixed_window, limit: 1, window: 1h, align: first_hit }
"#;

const BROKEN: &str = "namespaces:\n  - name: app\n    resources:\n      - { name: x, algorithm: fixed_window, limit: -1, window: 1h }\n";

fn req(resource: &str) -> v1::RateRequest {
    v1::RateRequest {
        namespace: "app".into(),
        resource: resource.into(),
        domain: "d".into(),
        hits: Some(1),
        min_hits: None,
        mode: 0,
        limit: None,
    }
}

/// A config watcher over `app`, with its hangup and stop switches.
struct Watching {
    hup: mpsc::Sender<()>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Watching {
    fn start(
        app: &Arc<tollgate_server::App<tollgate_store::MemoryStore>>,
        path: &Path,
        every: Duration,
    ) -> Watching {
        let (hup, hup_rx) = mpsc::channel(1);
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(reload::watch(
            Arc::clone(app),
            path.to_owned(),
            every,
            hup_rx,
            stop_rx,
        ));
        Watching { hup, stop, task }
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        self.task.await.unwrap();
    }
}

/// Whether a request for `resource` is allowed; it must be answered.
async fn allowed(
    client: &mut tollgate_proto::v1::tollgate_client::TollgateClient<tonic::transport::Channel>,
    resource: &str,
) -> bool {
    client
        .request(req(resource))
        .await
        .unwrap()
        .into_inner()
        .allowed
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A server started on `V1`, and a config file holding `file` for it to
/// reload from (in a directory that lives as long as the returned guard).
async fn serving_v1_with_file(
    file: &str,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    TestServer,
    Arc<tollgate_server::App<tollgate_store::MemoryStore>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, file).unwrap();
    let server = TestServer::start(V1).await;
    let app = Arc::clone(&server.app);
    (dir, path, server, app)
}

#[tokio::test]
async fn a_changed_file_is_reloaded_keeping_unchanged_state_and_a_broken_one_refused() {
    let (_dir, path, server, app) = serving_v1_with_file(V1).await;
    let watcher = Watching::start(&app, &path, Duration::from_millis(10));
    let mut client = server.native().await;
    for _ in 0..2 {
        assert!(allowed(&mut client, "kept").await);
        assert!(allowed(&mut client, "changed").await);
    }

    write_atomically(&path, V2);
    eventually("V2 in force", || app.config_status().revision == 2).await;
    // `kept` did not change: its two hits are still counted.
    let r = client.request(req("kept")).await.unwrap().into_inner();
    assert_eq!((r.limit, r.remaining), (5, 2));
    // `changed` has new parameters: a fresh window of 9.
    let r = client.request(req("changed")).await.unwrap().into_inner();
    assert_eq!((r.limit, r.remaining), (9, 8));
    assert!(allowed(&mut client, "added").await);

    write_atomically(&path, BROKEN);
    eventually("the broken file refused", || {
        app.config_status().last_error.is_some()
    })
    .await;
    let status = app.config_status();
    assert_eq!(status.revision, 2, "the old config keeps serving");
    let error = status.last_error.unwrap();
    assert!(error.contains("tollgate.yaml:4"), "{error}");
    let r = client.request(req("added")).await.unwrap().into_inner();
    assert!(!r.allowed, "V2's `added` (limit 1) is still in force");

    // Fixed again: reloaded, and the error cleared.
    write_atomically(&path, V1);
    eventually("V1 back", || app.config_status().revision == 3).await;
    assert!(app.config_status().last_error.is_none());
    let e = client.request(req("added")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);

    watcher.stop().await;
}

#[tokio::test]
async fn a_configmap_style_symlink_swap_is_reloaded() {
    // The kubelet's layout: config.yaml -> ..data/config.yaml,
    // ..data -> ..v1; an update writes ..v2 and swaps ..data.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("..v1")).unwrap();
    std::fs::write(root.join("..v1/config.yaml"), V1).unwrap();
    std::os::unix::fs::symlink("..v1", root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/config.yaml", root.join("config.yaml")).unwrap();
    let server = TestServer::start(V1).await;
    let app = Arc::clone(&server.app);
    let watcher = Watching::start(&app, &root.join("config.yaml"), Duration::from_millis(10));
    std::fs::create_dir(root.join("..v2")).unwrap();
    std::fs::write(root.join("..v2/config.yaml"), V2).unwrap();
    std::os::unix::fs::symlink("..v2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    eventually("the swapped config in force", || {
        app.config_status().revision == 2
    })
    .await;
    let mut client = server.native().await;
    assert!(allowed(&mut client, "added").await);
    watcher.stop().await;
}

#[tokio::test]
async fn a_hangup_reloads_even_when_nothing_changed() {
    let (_dir, path, _server, app) = serving_v1_with_file(V1).await;
    // A long interval: only the hangup can cause the reload.
    let watcher = Watching::start(&app, &path, Duration::from_secs(3600));
    watcher.hup.send(()).await.unwrap();
    eventually("reloaded on hangup", || app.config_status().revision == 2).await;
    watcher.stop().await;
}

/// Issue 20: a refused reload was a `Result<_, String>`. Now it says what
/// failed as a type a caller can branch on (a file that does not load,
/// with its diagnostics; a namespace both in the file and in the config
/// API), and `/status` shows the same message the error does.
#[tokio::test]
async fn a_refused_reload_says_why_as_a_typed_error() {
    use tollgate_server::app::{ApiPart, ComposeError, InstallError};
    let (_dir, path, server, app) = serving_v1_with_file(BROKEN).await;

    let error = reload::reload(&app, &path).unwrap_err();
    let InstallError::Compose(ComposeError::File(config_error)) = &error else {
        panic!("not the file's load error: {error:?}");
    };
    assert_eq!(config_error.errors[0].pos.line, 4, "{error}");
    let status = app.config_status();
    assert_eq!(status.last_error, Some(error.to_string()));
    assert!(error.to_string().contains("tollgate.yaml:4"), "{error}");
    assert_eq!(status.revision, 1, "the old config keeps serving");

    std::fs::write(&path, V1).unwrap();
    let api = ApiPart {
        revision: 7,
        text: r#"{"namespaces": [{"name": "app", "resources": []}]}"#.into(),
    };
    let error = app.install_parts(Some(&path), Some(api)).unwrap_err();
    assert_eq!(
        error,
        InstallError::Compose(ComposeError::InBoth("app".into()))
    );
    assert_eq!(app.config_status().last_error, Some(error.to_string()));
    assert_eq!(app.config_status().revision, 1);
    server.stop().await;
}
