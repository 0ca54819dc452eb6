//! The decision log: a sampled record of decisions, as JSON lines that
//! `tollgate replay` reads back (Charon sent every decision to an event
//! stream for later analysis).
//!
//! One line per sampled decision, in the trace format plus what was
//! answered:
//!
//! ```json
//! {"time_ms":1732291200123.456,"namespace":"default","resource":"api","domain":"acme","hits":1,"min_hits":1,"mode":"try","surface":"grpc","decision":{"allowed":true,"granted":1,"remaining":99,"limited_by":null}}
//! ```
//!
//! Envoy requests are logged with their `descriptors` instead of a resource
//! and domain. Replaying a log re-decides every line against a config and
//! ignores `surface` and `decision`, so comparing the two shows what a
//! config change would have done to real traffic.
//!
//! Writing never slows a decision down: lines go through a bounded queue to
//! a writer thread, and when the queue is full a line is dropped and
//! counted (`tollgate_decision_log_dropped_total`) rather than waited for.

use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;
use tollgate_core::Nanos;

/// Lines dropped because the writer fell behind.
pub const DROPPED: &str = "tollgate_decision_log_dropped_total";
/// Lines written.
pub const WRITTEN: &str = "tollgate_decision_log_lines_total";

/// Where the log goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogTarget {
    /// Standard output.
    Stdout,
    /// A file, appended to.
    File(PathBuf),
}

impl std::str::FromStr for LogTarget {
    type Err = std::convert::Infallible;
    /// `-` or `stdout` is standard output; anything else a file path.
    fn from_str(s: &str) -> Result<LogTarget, Self::Err> {
        Ok(match s {
            "-" | "stdout" => LogTarget::Stdout,
            path => LogTarget::File(PathBuf::from(path)),
        })
    }
}

/// A limit a request brought of its own, as it gave it.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Brought<'a> {
    /// Hits per unit.
    pub requests_per_unit: u64,
    /// The unit's name (`second` to `year`).
    pub unit: &'a str,
}

/// What a line records of the answer.
#[derive(Clone, Debug, Serialize)]
pub struct Answer {
    /// Whether the request succeeded.
    pub allowed: bool,
    /// Hits granted.
    pub granted: u64,
    /// What remained of the deciding limit (absent for Envoy requests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    /// What limited it (`limit`, `tier`, `hard`, `global`, `deny`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limited_by: Option<&'static str>,
    /// Of a resource with a `limits:` list: the name of the limit that
    /// bound the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limited_by_name: Option<std::sync::Arc<str>>,
}

/// One descriptor entry of an Envoy request.
#[derive(Clone, Debug, Serialize)]
pub struct Entry<'a> {
    /// The key.
    pub key: &'a str,
    /// The value.
    pub value: &'a str,
}

/// One line.
#[derive(Debug, Serialize)]
pub struct Line<'a> {
    /// When, in Unix-epoch milliseconds (microsecond precision).
    pub time_ms: f64,
    /// The namespace (Envoy's `domain`).
    pub namespace: &'a str,
    /// The resource (absent for Envoy requests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<&'a str>,
    /// The domain (absent for Envoy requests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<&'a str>,
    /// Envoy descriptors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub descriptors: Option<Vec<Vec<Entry<'a>>>>,
    /// The limit the request brought of its own (`limit`), so that a
    /// replay decides it as the server did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<Brought<'a>>,
    /// Of an Envoy request whose descriptors brought limits of their own
    /// (a descriptor's `limit`): per descriptor, in order, its limit or
    /// `null`. Absent when none did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub descriptor_limits: Option<Vec<Option<Brought<'a>>>>,
    /// Of an Envoy request whose descriptors asked different hits: per
    /// descriptor, in order, its own `hits_addend` or `null` (`hits`).
    /// Absent when they all asked the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub descriptor_hits: Option<&'a [Option<u64>]>,
    /// Of an Envoy request some of whose descriptors (not all) set
    /// `is_negative_hits`: per descriptor, in order, whether it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub descriptor_refunds: Option<&'a [bool]>,
    /// Hits asked.
    pub hits: u64,
    /// Fewest useful.
    pub min_hits: u64,
    /// `try` or `acquire`.
    pub mode: &'static str,
    /// Which surface answered.
    pub surface: &'static str,
    /// The answer.
    pub decision: Answer,
}

/// A sampled, non-blocking JSON-lines writer.
pub struct DecisionLog {
    tx: Mutex<Option<SyncSender<String>>>,
    sample: f64,
    seen: AtomicU64,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl DecisionLog {
    /// Opens `target` and starts the writer; `sample` in `(0, 1]` is the
    /// fraction of decisions logged (exactly: every decision whose running
    /// count crosses a multiple of `1 / sample`).
    pub fn open(target: &LogTarget, sample: f64) -> io::Result<DecisionLog> {
        if !(sample > 0.0 && sample <= 1.0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the decision log's sample rate must be in (0, 1], not {sample}"),
            ));
        }
        let out: Box<dyn Write + Send> = match target {
            LogTarget::Stdout => Box::new(io::stdout()),
            LogTarget::File(path) => Box::new(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| {
                        io::Error::new(e.kind(), format!("decision log {}: {e}", path.display()))
                    })?,
            ),
        };
        let (tx, rx) = sync_channel::<String>(65_536);
        let writer = std::thread::Builder::new()
            .name("decision-log".into())
            .spawn(move || {
                let mut out = BufWriter::new(out);
                loop {
                    match rx.recv_timeout(Duration::from_millis(200)) {
                        Ok(line) => {
                            if let Err(e) = writeln!(out, "{line}") {
                                // Said once; every line from now on is
                                // counted as dropped.
                                tracing::error!(error = %e, "the decision log cannot be written; its lines are dropped from now on");
                                metrics::counter!(DROPPED).increment(1);
                                return;
                            }
                            metrics::counter!(WRITTEN).increment(1);
                        }
                        // Idle: make what was written visible.
                        Err(RecvTimeoutError::Timeout) => {
                            let _ = out.flush();
                        }
                        Err(RecvTimeoutError::Disconnected) => {
                            let _ = out.flush();
                            return;
                        }
                    }
                }
            })?;
        Ok(DecisionLog {
            tx: Mutex::new(Some(tx)),
            sample,
            seen: AtomicU64::new(0),
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Whether the next decision is sampled. Cheap: one atomic add.
    pub fn sampled(&self) -> bool {
        if self.sample >= 1.0 {
            return true;
        }
        let k = self.seen.fetch_add(1, Ordering::Relaxed) as f64;
        ((k + 1.0) * self.sample).floor() > (k * self.sample).floor()
    }

    /// Queues `line` (call only for sampled decisions).
    pub fn write(&self, line: &Line<'_>) {
        let Ok(text) = serde_json::to_string(line) else {
            return;
        };
        let tx = self.tx.lock().ok().and_then(|g| g.clone());
        if let Some(tx) = tx {
            match tx.try_send(text) {
                Ok(()) => {}
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    metrics::counter!(DROPPED).increment(1);
                }
            }
        }
    }

    /// Stops the writer after it has written and flushed every queued
    /// line.
    pub fn close(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        let writer = self.writer.lock().ok().and_then(|mut w| w.take());
        if let Some(w) = writer {
            let _ = w.join();
        }
    }
}

impl Drop for DecisionLog {
    fn drop(&mut self) {
        self.close();
    }
}

/// `now` as fractional Unix-epoch milliseconds, to the microsecond.
pub fn time_ms(now: Nanos) -> f64 {
    (now.as_u64() / 1_000) as f64 / 1_000.0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Descriptors' own hits and refunds are logged where replay's trace
    /// reader takes them, and only when a request has them.
    #[test]
    fn descriptor_hits_and_refunds_are_logged() {
        let text = serde_json::to_string(&line(1)).unwrap();
        assert!(!text.contains("descriptor_hits") && !text.contains("descriptor_refunds"));
        let mut l = line(1);
        let (hits, refunds) = ([Some(3), None], [true, false]);
        l.descriptor_hits = Some(&hits);
        l.descriptor_refunds = Some(&refunds);
        let text = serde_json::to_string(&l).unwrap();
        assert!(text.contains(r#""descriptor_hits":[3,null]"#), "{text}");
        assert!(
            text.contains(r#""descriptor_refunds":[true,false]"#),
            "{text}"
        );
    }

    /// A brought limit is logged as the request gave it, where replay's
    /// trace reader takes it.
    #[test]
    fn a_brought_limit_is_logged() {
        let mut l = line(1);
        l.limit = Some(Brought {
            requests_per_unit: 5,
            unit: "hour",
        });
        let text = serde_json::to_string(&l).unwrap();
        assert!(
            text.contains(r#""limit":{"requests_per_unit":5,"unit":"hour"}"#),
            "{text}"
        );
        let mut l = line(1);
        l.descriptor_limits = Some(vec![
            None,
            Some(Brought {
                requests_per_unit: 1,
                unit: "day",
            }),
        ]);
        let text = serde_json::to_string(&l).unwrap();
        assert!(
            text.contains(r#""descriptor_limits":[null,{"requests_per_unit":1,"unit":"day"}]"#),
            "{text}"
        );
        assert!(!serde_json::to_string(&line(1))
            .unwrap()
            .contains("\"limit\""));
    }

    fn line(granted: u64) -> Line<'static> {
        Line {
            time_ms: 1500.25,
            namespace: "default",
            resource: Some("api"),
            domain: Some("acme"),
            descriptors: None,
            limit: None,
            descriptor_limits: None,
            descriptor_hits: None,
            descriptor_refunds: None,
            hits: 1,
            min_hits: 1,
            mode: "try",
            surface: "grpc",
            decision: Answer {
                allowed: granted > 0,
                granted,
                remaining: Some(3),
                limited_by: None,
                limited_by_name: None,
            },
        }
    }

    #[test]
    fn sampling_keeps_exactly_the_fraction_asked() {
        let dir = tempfile::tempdir().unwrap();
        let log = DecisionLog::open(&LogTarget::File(dir.path().join("d.jsonl")), 0.25).unwrap();
        let kept = (0..1000).filter(|_| log.sampled()).count();
        assert_eq!(kept, 250);
        let all = DecisionLog::open(&LogTarget::File(dir.path().join("e.jsonl")), 1.0).unwrap();
        assert!((0..10).all(|_| all.sampled()));
        for bad in [0.0, -1.0, 1.5, f64::NAN] {
            assert!(DecisionLog::open(&LogTarget::Stdout, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lines_are_written_flushed_on_close_and_appended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        for round in 0..2 {
            let log = DecisionLog::open(&LogTarget::File(path.clone()), 1.0).unwrap();
            log.write(&line(round));
            log.close();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["time_ms"], 1500.25);
        assert_eq!(lines[0]["decision"]["allowed"], false);
        assert_eq!(lines[1]["decision"]["granted"], 1);
        assert_eq!(lines[1]["domain"], "acme");
        assert!(lines[1].get("descriptors").is_none());
    }

    #[test]
    fn an_unwritable_path_is_an_error_naming_it() {
        let e = DecisionLog::open(&LogTarget::File("/nonexistent-dir/x.jsonl".into()), 1.0)
            .err()
            .unwrap();
        assert!(e.to_string().contains("/nonexistent-dir/x.jsonl"), "{e}");
    }
}
