//! `tollgate replay`: what would this config have done with this traffic?
//!
//! Feeds a recorded trace through the config with the trace's own
//! timestamps (no sleeping), using the same service and in-memory store as
//! the server, and prints one JSON line per event, in order, then a summary.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tollgate_config::Loaded;
use tollgate_core::{Decision, Mode, Nanos};
use tollgate_service::{
    DescriptorOutcome, DescriptorRequest, LimitedBy, Limiter, RateOutcome, RateRequest, View,
};
use tollgate_store::MemoryStore;

use crate::summary::Summary;
use crate::trace::{self, Event};

/// Arguments of `tollgate replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The config: a file, or a directory of *.yaml files.
    #[arg(long, short, env = "TOLLGATE_CONFIG")]
    pub config: PathBuf,
    /// The trace: JSON lines (`-` reads standard input).
    #[arg(long, short)]
    pub trace: PathBuf,
    /// Write the per-event JSON lines here instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Stop at the first malformed line or failed request instead of
    /// reporting and skipping it.
    #[arg(long)]
    pub strict: bool,
    /// How to print the summary.
    #[arg(long, value_enum, default_value_t = SummaryFormat::Table)]
    pub summary: SummaryFormat,
    /// Do not print per-event lines, only the summary.
    #[arg(long)]
    pub no_events: bool,
}

/// Summary output formats.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SummaryFormat {
    /// An aligned table.
    Table,
    /// One JSON document.
    Json,
    /// No summary.
    None,
}

/// How often idle state is dropped, in events.
const SWEEP_EVERY: u64 = 1 << 16;

/// The longest trace line read, in bytes. A decision-log line is at most
/// a few hundred KiB (a 64 KiB request whose every byte needs a six-byte
/// JSON escape); a longer line is reported and skipped without being held
/// in memory, so a trace without line breaks cannot take all of it.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Reads the next line (without its `\n`) into `line`: its length, or
/// `None` at the end of the input. A line longer than
/// [`MAX_LINE_BYTES`] is consumed but not kept (`line` is left empty).
fn read_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<Option<usize>> {
    line.clear();
    let mut length = 0usize;
    let mut started = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(started.then_some(length));
        }
        started = true;
        let end = available.iter().position(|&b| b == b'\n');
        let chunk = &available[..end.unwrap_or(available.len())];
        length = length.saturating_add(chunk.len());
        if length <= MAX_LINE_BYTES {
            line.extend_from_slice(chunk);
        } else {
            line.clear();
        }
        let used = chunk.len() + usize::from(end.is_some());
        reader.consume(used);
        if end.is_some() {
            return Ok(Some(length));
        }
    }
}

/// Runs the replay; returns whether every line was replayed cleanly.
pub fn run(args: &ReplayArgs, loaded: Loaded) -> Result<bool> {
    let (reader, size): (Box<dyn Read>, Option<u64>) = if args.trace == Path::new("-") {
        (Box::new(io::stdin().lock()), None)
    } else {
        let f = File::open(&args.trace)
            .with_context(|| format!("cannot open trace {}", args.trace.display()))?;
        let size = f.metadata().ok().map(|m| m.len());
        (Box::new(f), size)
    };
    let mut events: Box<dyn Write> = match (&args.output, args.no_events) {
        (_, true) => Box::new(io::sink()),
        (Some(path), false) => Box::new(BufWriter::new(
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
        )),
        (None, false) => Box::new(BufWriter::new(io::stdout().lock())),
    };
    let progress = match size {
        Some(len) if len > 1 << 20 => {
            let bar = ProgressBar::new(len);
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} replaying [{bar:40}] {bytes}/{total_bytes} ({eta})",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        }
        _ => ProgressBar::hidden(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .context("cannot start the runtime")?;
    let mut replay = Replay {
        loaded,
        limiter: None,
        summary: Summary::default(),
        strict: args.strict,
        clean: true,
    };
    runtime.block_on(replay.feed(BufReader::new(reader), &mut events, &progress))?;
    progress.finish_and_clear();
    events.flush()?;
    drop(events);
    let stdout = io::stdout();
    match args.summary {
        SummaryFormat::Table => replay.summary.write_table(stdout.lock())?,
        SummaryFormat::Json => replay.summary.write_json(stdout.lock())?,
        SummaryFormat::None => {}
    }
    Ok(replay.clean)
}

struct Replay {
    loaded: Loaded,
    limiter: Option<Limiter<MemoryStore>>,
    summary: Summary,
    strict: bool,
    clean: bool,
}

impl Replay {
    async fn feed(
        &mut self,
        mut reader: impl BufRead,
        out: &mut dyn Write,
        progress: &ProgressBar,
    ) -> Result<()> {
        let mut count = 0u64;
        let mut number = 0u64;
        let mut first = true;
        let mut bytes = Vec::new();
        // Split on bytes, not `lines()`: a line that is not UTF-8 is one
        // malformed line to report and skip, not a read error that ends
        // the whole replay.
        loop {
            number += 1;
            let length = read_line(&mut reader, &mut bytes)
                .with_context(|| format!("cannot read trace line {number}"))?;
            let Some(length) = length else { break };
            progress.inc(length as u64 + 1);
            if length > MAX_LINE_BYTES {
                self.summary.malformed += 1;
                self.problem(
                    progress,
                    format!(
                        "trace line {number}: {length} bytes long, longer than any trace line \
                         ({MAX_LINE_BYTES} bytes at most)"
                    ),
                )?;
                continue;
            }
            let line = match std::str::from_utf8(&bytes) {
                // As `lines()` does, a CRLF ending is one line ending.
                Ok(l) => l.strip_suffix('\r').unwrap_or(l),
                Err(e) => {
                    self.summary.malformed += 1;
                    self.problem(progress, format!("trace line {number}: not UTF-8: {e}"))?;
                    continue;
                }
            };
            if line.trim().is_empty() {
                continue;
            }
            if std::mem::take(&mut first) && line.trim_start().starts_with('[') {
                // Else every line of it is skipped as malformed and the
                // run "succeeds" having replayed nothing.
                bail!(
                    "trace line {number}: the trace is a JSON array, but replay reads JSON \
                     lines, one object per line (convert it with `jq -c '.[]' FILE`)"
                );
            }
            let event = match trace::parse(line) {
                Ok(e) => e,
                Err(e) => {
                    self.summary.malformed += 1;
                    self.problem(progress, format!("trace line {number}: {e}"))?;
                    continue;
                }
            };
            self.event(number, &event, out, progress).await?;
            count += 1;
            if count % SWEEP_EVERY == 0 {
                if let Some(l) = &self.limiter {
                    l.store().sweep_now(event.time);
                }
            }
        }
        Ok(())
    }

    /// Reports a bad line; stops the run when strict.
    fn problem(&mut self, progress: &ProgressBar, message: String) -> Result<()> {
        self.clean = false;
        if self.strict {
            bail!("{message}");
        }
        progress.suspend(|| eprintln!("warning: {message} (skipped)"));
        Ok(())
    }

    async fn event(
        &mut self,
        number: u64,
        e: &Event,
        out: &mut dyn Write,
        progress: &ProgressBar,
    ) -> Result<()> {
        // Every key's smooth limiter counts as created at the trace's start.
        let limiter = self.limiter.get_or_insert_with(|| {
            Limiter::new(MemoryStore::new(), View::new(&self.loaded.config, e.time))
        });
        let namespace = match default_namespace(&self.loaded, e) {
            Ok(ns) => ns,
            Err(msg) => {
                let resource = e.resource.clone().unwrap_or_default();
                self.summary.record_error("?", &resource, &e.domain, e.hits);
                let line =
                    ErrorLine::new(number, e, "", &resource, msg.clone(), "missing_namespace");
                write_line(out, &line)?;
                return self.problem(progress, format!("trace line {number}: {msg}"));
            }
        };
        if let Some(descriptors) = &e.descriptors {
            let req = DescriptorRequest {
                namespace: &namespace,
                descriptors,
                hits: e.hits,
                // A decision log's report and refund lines replay as such;
                // descriptors are never scheduled.
                mode: if e.mode.is_usage() { e.mode } else { Mode::Try },
                limits: &e.descriptor_limits,
                descriptor_hits: &e.descriptor_hits,
                refunds: &e.descriptor_refunds,
            };
            return match limiter.request_descriptors(&req, e.time).await {
                Ok(outcome) => {
                    for (i, s) in outcome.statuses.iter().enumerate() {
                        if let (Some(r), Some(d)) = (&s.resource, &s.domain) {
                            // Each descriptor's own hits, and what it
                            // charged as the server counts it: a check's
                            // when the request is OK, usage as its
                            // counters took it (as a native line's
                            // `granted`).
                            let hits = e
                                .descriptor_hits
                                .get(i)
                                .copied()
                                .flatten()
                                .unwrap_or(e.hits);
                            self.summary
                                .record(&namespace, r, d, hits, s.charged, outcome.allowed);
                        }
                    }
                    write_line(out, &descriptor_line(number, e, &namespace, &outcome))
                }
                Err(err) => {
                    self.summary
                        .record_error(&namespace, "(descriptors)", "", e.hits);
                    write_line(out, &error_line(number, e, &namespace, "", &err))?;
                    self.problem(progress, format!("trace line {number}: {err}"))
                }
            };
        }
        let resource = match default_resource(&self.loaded, &namespace, e) {
            Ok(r) => r,
            Err(msg) => {
                self.summary
                    .record_error(&namespace, "?", &e.domain, e.hits);
                let line =
                    ErrorLine::new(number, e, &namespace, "", msg.clone(), "missing_resource");
                write_line(out, &line)?;
                return self.problem(progress, format!("trace line {number}: {msg}"));
            }
        };
        let req = RateRequest {
            namespace: &namespace,
            resource: &resource,
            domain: &e.domain,
            hits: e.hits,
            min_hits: e.min_hits,
            mode: e.mode,
            limit: e.limit,
        };
        match limiter.request(&req, e.time).await {
            Ok(o) => {
                self.summary.record(
                    &namespace, &resource, &e.domain, e.hits, o.granted, o.allowed,
                );
                write_line(out, &rate_line(number, e, &namespace, &resource, &o))
            }
            Err(err) => {
                self.summary
                    .record_error(&namespace, &resource, &e.domain, e.hits);
                write_line(out, &error_line(number, e, &namespace, &resource, &err))?;
                self.problem(progress, format!("trace line {number}: {err}"))
            }
        }
    }
}

fn default_namespace(loaded: &Loaded, e: &Event) -> Result<String, String> {
    match &e.namespace {
        Some(n) => Ok(n.clone()),
        None => match loaded.config.namespaces.as_slice() {
            [only] => Ok(only.name.clone()),
            all => Err(format!(
                "`namespace` is required: the config has {} namespaces",
                all.len()
            )),
        },
    }
}

fn default_resource(loaded: &Loaded, namespace: &str, e: &Event) -> Result<String, String> {
    match &e.resource {
        Some(r) => Ok(r.clone()),
        None => match loaded
            .config
            .namespace(namespace)
            .map(|n| n.resources.as_slice())
        {
            Some([only]) => Ok(only.name.clone()),
            Some(all) => Err(format!(
                "`resource` is required: namespace `{namespace}` has {} resources",
                all.len()
            )),
            // The service reports the unknown namespace.
            None => Ok(String::new()),
        },
    }
}

/// Milliseconds with microsecond precision.
fn ms(n: Nanos) -> f64 {
    (n.as_u64() / 1_000) as f64 / 1_000.0
}

fn bounded(v: u64) -> Option<u64> {
    (v != u64::MAX).then_some(v)
}

#[derive(Serialize)]
struct RateLine<'a> {
    line: u64,
    time_ms: f64,
    namespace: &'a str,
    resource: &'a str,
    domain: &'a str,
    hits: u64,
    min_hits: u64,
    granted: u64,
    allowed: bool,
    limit: Option<u64>,
    remaining: Option<u64>,
    retry_after_ms: Option<f64>,
    reset_after_ms: f64,
    wait_ms: f64,
    tier: Option<u32>,
    burst: Option<bool>,
    tier_limit: Option<u64>,
    tier_hits: Option<u64>,
    limited_by: Option<&'static str>,
    hard_limit: Option<u64>,
    global_limit: Option<u64>,
    domain_hits_last_second: Option<u64>,
    global_hits_last_second: Option<u64>,
    algorithm: &'static str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shadowed: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ignored: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    unconfigured: bool,
    /// Of a resource with a `limits:` list: the limit that bound it.
    #[serde(skip_serializing_if = "Option::is_none")]
    limited_by_name: Option<String>,
    /// Of a resource with a `limits:` list: each limit's own state.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    limits: Vec<LimitLine>,
}

/// One limit of a `limits:` list after a replayed decision.
#[derive(Serialize)]
struct LimitLine {
    name: String,
    algorithm: &'static str,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset_after_ms: f64,
}

fn rate_line<'a>(
    number: u64,
    e: &'a Event,
    ns: &'a str,
    resource: &'a str,
    o: &RateOutcome,
) -> RateLine<'a> {
    let d: &Decision = &o.decision;
    RateLine {
        line: number,
        time_ms: ms(e.time),
        namespace: ns,
        resource,
        domain: &e.domain,
        hits: e.hits,
        min_hits: e.min_hits,
        granted: o.granted,
        allowed: o.allowed,
        limit: bounded(d.limit),
        remaining: bounded(d.remaining),
        retry_after_ms: d.retry_after.map(ms),
        reset_after_ms: ms(d.reset_after),
        wait_ms: ms(d.wait),
        tier: o.tier.map(|t| t.index),
        burst: o.tier.map(|t| t.burst),
        tier_limit: o.tier.map(|t| t.limit),
        tier_hits: o.tier.map(|t| t.hits),
        limited_by: o.limited_by.map(|l| l.as_str()),
        hard_limit: o.hard_limit,
        global_limit: o.global_limit,
        domain_hits_last_second: o.domain_hits_last_second,
        global_hits_last_second: o.global_hits_last_second,
        algorithm: o.algorithm,
        shadowed: o.shadowed,
        ignored: o.ignored,
        unconfigured: o.unconfigured,
        limited_by_name: match (o.limited_by, &o.limit_name) {
            (Some(LimitedBy::Limit | LimitedBy::Tier), Some(name)) => Some(name.to_string()),
            _ => None,
        },
        limits: o
            .limits
            .iter()
            .map(|l| LimitLine {
                name: l.name.to_string(),
                algorithm: l.algorithm,
                limit: bounded(l.decision.limit),
                remaining: bounded(l.decision.remaining),
                reset_after_ms: ms(l.decision.reset_after),
            })
            .collect(),
    }
}

#[derive(Serialize)]
struct DescriptorLine<'a> {
    line: u64,
    time_ms: f64,
    namespace: &'a str,
    hits: u64,
    allowed: bool,
    descriptors: Vec<DescriptorStatusLine>,
}

#[derive(Serialize)]
struct DescriptorStatusLine {
    resource: Option<String>,
    domain: Option<String>,
    allowed: bool,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset_after_ms: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    unlimited: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shadowed: bool,
}

fn descriptor_line<'a>(
    number: u64,
    e: &Event,
    ns: &'a str,
    o: &DescriptorOutcome,
) -> DescriptorLine<'a> {
    DescriptorLine {
        line: number,
        time_ms: ms(e.time),
        namespace: ns,
        hits: e.hits,
        allowed: o.allowed,
        descriptors: o
            .statuses
            .iter()
            .map(|s| DescriptorStatusLine {
                resource: s.resource.clone(),
                domain: s.domain.clone(),
                allowed: s.allowed,
                limit: s.decision.and_then(|d| bounded(d.limit)),
                remaining: s.decision.and_then(|d| bounded(d.remaining)),
                reset_after_ms: s.decision.map(|d| ms(d.reset_after)),
                unlimited: s.unlimited,
                shadowed: s.shadowed,
            })
            .collect(),
    }
}

#[derive(Serialize)]
struct ErrorLine<'a> {
    line: u64,
    time_ms: f64,
    namespace: &'a str,
    resource: &'a str,
    domain: &'a str,
    hits: u64,
    error: String,
    reason: &'static str,
}

impl<'a> ErrorLine<'a> {
    fn new(
        number: u64,
        e: &'a Event,
        ns: &'a str,
        resource: &'a str,
        error: String,
        reason: &'static str,
    ) -> ErrorLine<'a> {
        ErrorLine {
            line: number,
            time_ms: ms(e.time),
            namespace: ns,
            resource,
            domain: &e.domain,
            hits: e.hits,
            error,
            reason,
        }
    }
}

fn error_line<'a>(
    number: u64,
    e: &'a Event,
    ns: &'a str,
    resource: &'a str,
    err: &tollgate_service::ServiceError,
) -> ErrorLine<'a> {
    ErrorLine::new(number, e, ns, resource, err.to_string(), err.reason())
}

fn write_line(out: &mut dyn Write, value: &impl Serialize) -> Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn lines_are_read_whole_and_split_on_line_feeds() {
        let mut r = io::Cursor::new(b"a\nbc\r\n\nlast".to_vec());
        let mut line = Vec::new();
        let mut got = Vec::new();
        while let Some(n) = read_line(&mut r, &mut line).unwrap() {
            assert_eq!(n, line.len());
            got.push(String::from_utf8(line.clone()).unwrap());
        }
        assert_eq!(got, ["a", "bc\r", "", "last"]);
    }

    /// Issue 16: a trace line was read whole whatever its length, so a
    /// trace without line breaks took as much memory as it was long.
    #[test]
    fn a_line_longer_than_the_bound_is_consumed_without_being_kept() {
        let long = MAX_LINE_BYTES * 20;
        let input = io::Cursor::new([vec![b'x'; long], b"\nnext\n".to_vec()].concat());
        // A small buffer, as a slow pipe gives.
        let mut r = BufReader::with_capacity(4096, input);
        let mut line = Vec::new();
        assert_eq!(read_line(&mut r, &mut line).unwrap(), Some(long));
        assert!(line.is_empty());
        assert!(line.capacity() <= 2 * MAX_LINE_BYTES, "{}", line.capacity());
        assert_eq!(read_line(&mut r, &mut line).unwrap(), Some(4));
        assert_eq!(line, b"next");
        assert_eq!(read_line(&mut r, &mut line).unwrap(), None);
    }
}
