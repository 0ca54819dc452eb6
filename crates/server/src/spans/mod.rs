//! Decision spans: one OpenTelemetry span per decision on every surface,
//! a child of the caller's W3C trace context, exported in batches.
//!
//! What this module is for: the surfaces hand it what they decided
//! ([`Decision`]) and the caller's trace context ([`Caller`]); it builds
//! the span and queues it for [`batch`]'s exporter task. What it is not
//! for: choosing an exporter or a collector (the binary builds the OTLP
//! exporter and passes it in), or spans of anything but decisions.
//!
//! **Why the OpenTelemetry API directly, not `tracing` spans bridged by
//! `tracing-opentelemetry`:** a decision span is a record of one answer,
//! like a line of the decision log, built once the answer is known. Built
//! directly it costs nothing when tracing is off — the surfaces check one
//! `Option` in [`App`](crate::App) and neither read a header nor allocate
//! — and the log filter (`TOLLGATE_LOG`) cannot silently switch spans off.
//! The bridge would also put every `tracing` event of the server (and of
//! its libraries) through a second layer on the hot path.
//!
//! **Time** is the app's clock ([`App::now`](crate::App::now)), the one
//! the service decides with: the span starts just before the service is
//! asked and ends when it answered, and `tollgate.store_latency_us` is that
//! interval.
//!
//! **Bounds.** Everything in a span that a client chose is cut to
//! [`MAX_ATTRIBUTE_BYTES`]; an incoming `tracestate` longer than
//! [`MAX_TRACESTATE_BYTES`] is ignored (the `traceparent` still counts),
//! so a queued span holds at most a few kilobytes and the queue
//! ([`batch::BatchOptions::max_queue`]) bounds the memory of them all.

pub mod batch;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanBuilder, SpanKind, Status, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracer;
use tollgate_core::Nanos;
use tollgate_proto::rls::RateLimitDescriptor;

pub use batch::{BatchOptions, Exporting};

/// Longest string attribute of a span, in bytes (longer ones are cut at
/// a character boundary and end with `…`).
pub const MAX_ATTRIBUTE_BYTES: usize = 256;

/// Longest `tracestate` taken from a caller, in bytes: W3C Trace Context
/// asks that at least 512 characters be propagated and lets a vendor drop
/// the rest; tollgate drops a longer one whole rather than keep a
/// client-sized string in every queued span.
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// What a server records decision spans with: the tracer of the exporter
/// the binary set up, and W3C Trace Context to read the caller's.
#[derive(Debug)]
pub struct Spans {
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

impl Spans {
    /// Decision spans recorded with `tracer` (see [`batch::start`] for a
    /// tracer whose spans are exported in batches).
    pub fn new(tracer: SdkTracer) -> Spans {
        Spans {
            tracer,
            propagator: TraceContextPropagator::new(),
        }
    }

    /// The caller's trace context from gRPC metadata (`traceparent`,
    /// `tracestate`); an empty context (a new trace) when there is none or
    /// it is malformed.
    pub fn caller_from_grpc(&self, metadata: &tonic::metadata::MetadataMap) -> Caller {
        Caller(Some(self.propagator.extract(&Bounded(Grpc(metadata)))))
    }

    /// The caller's trace context from HTTP headers.
    pub fn caller_from_http(&self, headers: &http::HeaderMap) -> Caller {
        Caller(Some(self.propagator.extract(&Bounded(Http(headers)))))
    }

    /// Records one decision that took from `started` to `ended` (the app's
    /// clock), as a child of `caller`'s trace.
    pub fn record(&self, caller: &Caller, started: Nanos, ended: Nanos, d: &Decision<'_>) {
        let latency_us = ended.as_u64().saturating_sub(started.as_u64()) / 1_000;
        let mut attributes = Vec::with_capacity(9);
        attributes.push(KeyValue::new("tollgate.surface", d.surface));
        attributes.push(KeyValue::new("tollgate.namespace", bounded(d.namespace)));
        if let Some(resource) = d.resource {
            attributes.push(KeyValue::new("tollgate.resource", bounded(resource)));
        }
        if let Some(descriptors) = d.descriptors {
            attributes.push(KeyValue::new(
                "tollgate.descriptors",
                descriptors_summary(descriptors),
            ));
        }
        attributes.push(KeyValue::new("tollgate.outcome", d.outcome.name()));
        attributes.push(KeyValue::new("tollgate.hits", clamp(d.hits)));
        attributes.push(KeyValue::new("tollgate.granted", clamp(d.granted)));
        attributes.push(KeyValue::new(
            "tollgate.store_latency_us",
            clamp(latency_us),
        ));
        let status = match d.outcome {
            Outcome::Error(reason) => {
                attributes.push(KeyValue::new("tollgate.error", reason));
                Status::error(reason)
            }
            _ => Status::Unset,
        };
        let builder = SpanBuilder::from_name(d.name)
            .with_kind(SpanKind::Server)
            .with_start_time(system_time(started))
            .with_attributes(attributes);
        let root = Context::new();
        let parent = caller.0.as_ref().unwrap_or(&root);
        let mut span = self.tracer.build_with_context(builder, parent);
        span.set_status(status);
        span.end_with_timestamp(system_time(ended));
    }
}

/// The caller's trace context, taken only when spans are on: with spans
/// off it is empty and costs nothing to pass around.
#[derive(Clone, Debug, Default)]
pub struct Caller(Option<Context>);

impl Caller {
    /// No caller context: spans are off, or the request has no surface to
    /// carry one (a test, replay).
    pub const NONE: Caller = Caller(None);
}

/// What one decision was, for its span.
#[derive(Debug)]
pub struct Decision<'a> {
    /// The span's name: the operation (`tollgate.rate`,
    /// `tollgate.reserve`, `tollgate.should_rate_limit`, ...).
    pub name: &'static str,
    /// The surface it came in on (`grpc`, `session`, `http`, `rls`,
    /// `rls_json`), as in the metrics.
    pub surface: &'static str,
    /// The namespace (the RLS domain).
    pub namespace: &'a str,
    /// The resource, where the request names one.
    pub resource: Option<&'a str>,
    /// Envoy descriptors, summarized into one bounded attribute.
    pub descriptors: Option<&'a [RateLimitDescriptor]>,
    /// Hits (or copies) asked for.
    pub hits: u64,
    /// Hits (or copies) granted.
    pub granted: u64,
    /// How it ended.
    pub outcome: Outcome,
}

/// How a decision ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Granted (some hits or copies).
    Granted,
    /// Refused: over a limit, or no copies free.
    Rejected,
    /// A release or transfer that did what it was asked.
    Done,
    /// Refused with an error; the reason as the API names it
    /// (`unknown_namespace`, `malformed_request`, ...).
    Error(&'static str),
}

impl Outcome {
    /// `granted` when anything was granted, else `rejected`.
    pub fn of_grant(granted: bool) -> Outcome {
        if granted {
            Outcome::Granted
        } else {
            Outcome::Rejected
        }
    }

    fn name(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::Rejected => "rejected",
            Outcome::Done => "done",
            Outcome::Error(_) => "error",
        }
    }
}

/// `at` (the app's clock) as the SDK's time.
fn system_time(at: Nanos) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(at.as_u64())
}

/// OTLP integers are signed 64-bit.
fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `s`, cut to [`MAX_ATTRIBUTE_BYTES`] at a character boundary.
fn bounded(s: &str) -> opentelemetry::Value {
    if s.len() <= MAX_ATTRIBUTE_BYTES {
        return s.to_owned().into();
    }
    let mut end = MAX_ATTRIBUTE_BYTES - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end]).into()
}

/// Envoy descriptors as one line, `k=v,k=v;k=v` (descriptors separated by
/// `;`), cut to [`MAX_ATTRIBUTE_BYTES`]: a request may carry many.
fn descriptors_summary(descriptors: &[RateLimitDescriptor]) -> opentelemetry::Value {
    let mut out = String::new();
    'all: for (i, d) in descriptors.iter().enumerate() {
        if i > 0 {
            out.push(';');
        }
        for (j, e) in d.entries.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            out.push_str(&e.key);
            out.push('=');
            out.push_str(&e.value);
            // Stop copying once past the bound; `bounded` cuts the rest.
            if out.len() > MAX_ATTRIBUTE_BYTES {
                break 'all;
            }
        }
    }
    bounded(&out)
}

/// Header lookups through [`Extractor`], with `tracestate` dropped when
/// it is longer than [`MAX_TRACESTATE_BYTES`].
struct Bounded<E>(E);

impl<E: Extractor> Extractor for Bounded<E> {
    fn get(&self, key: &str) -> Option<&str> {
        let value = self.0.get(key)?;
        if key == "tracestate" && value.len() > MAX_TRACESTATE_BYTES {
            return None;
        }
        Some(value)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys()
    }
}

struct Grpc<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for Grpc<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => k.as_str(),
                tonic::metadata::KeyRef::Binary(k) => k.as_str(),
            })
            .collect()
    }
}

struct Http<'a>(&'a http::HeaderMap);

impl Extractor for Http<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    fn text(v: &opentelemetry::Value) -> Cow<'_, str> {
        v.as_str()
    }

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(
                    |(key, value)| tollgate_proto::rls::rate_limit_descriptor::Entry {
                        key: (*key).to_owned(),
                        value: (*value).to_owned(),
                    },
                )
                .collect(),
            ..RateLimitDescriptor::default()
        }
    }

    #[test]
    fn long_attributes_are_cut_at_a_character_boundary() {
        let short = "payments";
        assert_eq!(text(&bounded(short)), short);
        let long = "é".repeat(MAX_ATTRIBUTE_BYTES);
        let cut = bounded(&long);
        let cut = text(&cut);
        assert!(cut.len() <= MAX_ATTRIBUTE_BYTES, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
    }

    #[test]
    fn descriptors_are_summarized_within_the_bound() {
        let d = [
            descriptor(&[("remote_address", "10.0.0.1")]),
            descriptor(&[("path", "/a"), ("method", "GET")]),
        ];
        assert_eq!(
            text(&descriptors_summary(&d)),
            "remote_address=10.0.0.1;path=/a,method=GET"
        );
        let many: Vec<RateLimitDescriptor> = (0..10_000)
            .map(|i| descriptor(&[("k", &format!("value-{i}"))]))
            .collect();
        let summary = descriptors_summary(&many);
        assert!(text(&summary).len() <= MAX_ATTRIBUTE_BYTES);
        assert!(text(&summary).starts_with("k=value-0;k=value-1;"));
    }

    #[test]
    fn an_oversized_tracestate_is_ignored_but_the_traceparent_counts() {
        use opentelemetry::trace::TraceContextExt;
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", parent.parse().unwrap());
        headers.insert(
            "tracestate",
            format!("v={}", "x".repeat(MAX_TRACESTATE_BYTES))
                .parse()
                .unwrap(),
        );
        let cx = TraceContextPropagator::new().extract(&Bounded(Http(&headers)));
        let span = cx.span();
        let sc = span.span_context();
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(sc.trace_state().header(), "");

        headers.insert("tracestate", "v=1".parse().unwrap());
        let cx = TraceContextPropagator::new().extract(&Bounded(Http(&headers)));
        assert_eq!(cx.span().span_context().trace_state().header(), "v=1");
    }
}
