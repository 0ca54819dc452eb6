//! Hot reload: the config file is re-read when its content changes and on
//! SIGHUP.
//!
//! The watcher polls: every interval it reads the config's files and
//! compares a hash of their contents with the last one loaded. Polling
//! content rather than listening for file events is what makes a
//! Kubernetes ConfigMap work: the kubelet swaps a `..data` symlink, which
//! changes what the path resolves to without any event on the path itself,
//! and editors that write a new file and rename it over the old one are
//! seen the same way. Config files are small; reading them once a second
//! costs nothing.
//!
//! A config that fails to load is refused: the old one keeps serving and
//! `/status` and `tollgate_config_last_reload_failed` report the error. A
//! good one replaces the view; limits whose parameters did not change keep
//! their state.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tollgate_store::Store;

use crate::app::{App, InstallError};

/// A hash of the contents of the config's files, or `None` if they cannot
/// be read (a reload then reports why).
pub fn fingerprint(path: &Path) -> Option<u64> {
    let files = tollgate_config::config_files(path).ok()?;
    let mut h = DefaultHasher::new();
    for f in files {
        f.hash(&mut h);
        std::fs::read(&f).ok()?.hash(&mut h);
    }
    Some(h.finish())
}

/// Loads `path` (with the config API's part in force, if any) and puts it
/// in force, or records why not. Returns the new revision.
pub fn reload<S: Store>(app: &App<S>, path: &Path) -> Result<u64, InstallError> {
    match app.install_parts(Some(path), None) {
        Ok(revision) => {
            tracing::info!(path = ?path.display().to_string(), revision, "config reloaded");
            Ok(revision)
        }
        Err(e) => {
            tracing::error!(path = ?path.display().to_string(), error = ?e.to_string(), "config refused; the previous one keeps serving");
            Err(e)
        }
    }
}

/// Watches `path` until `stop`: reloads when its content changes, and
/// whenever `hup` fires (SIGHUP). The file is read when this is called, not
/// when the future first runs, so a change made right after the call is
/// seen as a change.
pub fn watch<S: Store>(
    app: Arc<App<S>>,
    path: PathBuf,
    every: Duration,
    mut hup: tokio::sync::mpsc::Receiver<()>,
    mut stop: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut last = fingerprint(&path);
    async move {
        // The first look is one interval away: the file was read just now
        // (a tick at once would race an edit made right after this call,
        // and reload without SIGHUP where a long interval promised none).
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let forced = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = hup.recv() => true,
                _ = stop.wait_for(|s| *s) => return,
            };
            let now = fingerprint(&path);
            if forced || now != last {
                // Remembered even when refused: a broken file is reported
                // once, not every tick, and fixing it triggers the next
                // reload.
                last = now;
                let _ = reload(&app, &path);
            }
        }
    }
}
