//! `tollgate serve --otlp-endpoint`: decision spans exported over
//! OTLP/gRPC to an OpenTelemetry collector (`docs/server.md`, "Tracing").
//!
//! The flags follow the OpenTelemetry SDK's environment variables where
//! one exists (`OTEL_BSP_*` for batching), so a deployment configured the
//! usual way works unchanged. The SDK reads more of them itself: the
//! exporter `OTEL_EXPORTER_OTLP_{TRACES_,}HEADERS` and `..._TIMEOUT`, the
//! tracer `OTEL_TRACES_SAMPLER{,_ARG}` and `OTEL_SPAN_*_COUNT_LIMIT`, the
//! resource `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`.
//!
//! Parse, then build: [`settings`] checks the flags and every one of those
//! variables without connecting or spawning anything, and is what `serve`
//! and `serve --check` both call first, so they refuse the same setups
//! with the same error; [`start`] then builds the exporter on the runtime.
//! The SDK ignores a value it cannot use (a malformed header, a timeout
//! that is not a number, an unknown sampler) with at most a warning through
//! its own logging, which tollgate does not install: the operator would
//! never learn that the API key or the sampling they set is not in force.
//! So a malformed value is refused at startup, naming the variable.
//! `OTEL_EXPORTER_OTLP_{TRACES_,}COMPRESSION` is refused too unless it is
//! `none`: compression is not built in (spans are small and a collector is
//! usually near), and the SDK would silently send uncompressed.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use tollgate_server::spans::{self, BatchOptions, Exporting, Spans};

/// Trace export flags of `tollgate serve`.
#[derive(Args, Debug, Clone)]
pub struct OtlpArgs {
    /// Export a span per decision over OTLP/gRPC to this collector
    /// (`http://HOST:4317`, or `https://` for TLS). Off when not given.
    #[arg(long, env = "TOLLGATE_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// PEM CA certificates the collector's TLS certificate must chain to,
    /// instead of the bundled Mozilla roots (`https://` endpoints only).
    #[arg(long, env = "TOLLGATE_OTLP_CA", requires = "otlp_endpoint")]
    pub otlp_ca: Option<PathBuf>,
    /// How long a span waits at most before it is exported (milliseconds).
    #[arg(long, env = "OTEL_BSP_SCHEDULE_DELAY", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    pub otlp_schedule_delay_ms: u64,
    /// Spans waiting for export at most; beyond it they are dropped and
    /// counted in tollgate_spans_dropped_total (a decision never waits).
    #[arg(long, env = "OTEL_BSP_MAX_QUEUE_SIZE", default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub otlp_max_queue: u64,
    /// Spans sent in one export at most.
    #[arg(long, env = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub otlp_max_batch: u64,
    /// How long one export may take before its spans are given up
    /// (milliseconds).
    #[arg(long, env = "OTEL_BSP_EXPORT_TIMEOUT", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub otlp_export_timeout_ms: u64,
}

/// How the collector is reached.
#[derive(Clone, Debug)]
enum Transport {
    /// `http://`: plain text.
    Plain,
    /// `https://`, the collector's certificate checked against this PEM CA
    /// (already read and parsed), or against Mozilla's roots.
    Tls { ca: Option<Vec<u8>> },
}

/// The trace export `serve` will run, checked: its endpoint, its TLS
/// material read and parsed, and every OpenTelemetry variable the SDK
/// will read holding a value it can use. Nothing was contacted or spawned.
#[derive(Clone, Debug)]
pub struct Settings {
    endpoint: String,
    transport: Transport,
    /// Whether `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names the
    /// service; else it is `tollgate`.
    named: bool,
    batch: BatchOptions,
}

impl Settings {
    /// The collector's URL, as `--otlp-endpoint` gave it.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

/// Checks the trace export flags and the OpenTelemetry variables the
/// export will read: `None` when `--otlp-endpoint` is not given (no
/// variable is read then). `serve` and `serve --check` both call it, so
/// they refuse alike.
pub fn settings(args: &OtlpArgs) -> Result<Option<Settings>> {
    settings_with(args, &|name| std::env::var_os(name))
}

/// [`settings`], with the environment read through `env`.
fn settings_with(
    args: &OtlpArgs,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Option<Settings>> {
    let Some(endpoint) = &args.otlp_endpoint else {
        return Ok(None);
    };
    let checked = transport(endpoint, args.otlp_ca.as_ref())
        .and_then(|transport| Ok((transport, environment(env)?)));
    let (transport, named) =
        checked.with_context(|| format!("cannot export traces to --otlp-endpoint {endpoint}"))?;
    let to_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    Ok(Some(Settings {
        endpoint: endpoint.clone(),
        transport,
        named,
        batch: BatchOptions {
            max_queue: to_usize(args.otlp_max_queue),
            max_batch: to_usize(args.otlp_max_batch),
            delay: Duration::from_millis(args.otlp_schedule_delay_ms),
            export_timeout: Duration::from_millis(args.otlp_export_timeout_ms),
        },
    }))
}

/// How `endpoint` is reached: plain text for `http://`, TLS for
/// `https://` with the CA in `ca` (read and parsed now) or Mozilla's roots.
fn transport(endpoint: &str, ca: Option<&PathBuf>) -> Result<Transport> {
    let uri: tonic::codegen::http::Uri = endpoint
        .parse()
        .context("not a URL (expected http://HOST:PORT or https://HOST:PORT)")?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => anyhow::bail!("the URL must start with http:// or https://"),
    };
    if uri.host().is_none() {
        anyhow::bail!("the URL names no host");
    }
    match (https, ca) {
        (false, Some(ca)) => anyhow::bail!(
            "--otlp-ca {} needs an https:// endpoint (an http:// one is plain text)",
            ca.display()
        ),
        (false, None) => Ok(Transport::Plain),
        (true, None) => Ok(Transport::Tls { ca: None }),
        (true, Some(path)) => Ok(Transport::Tls {
            ca: Some(tollgate_server::tls::read_ca("--otlp-ca", path)?),
        }),
    }
}

/// A variable as the SDK reads it: `None` when unset or empty.
fn var(env: &dyn Fn(&str) -> Option<OsString>, name: &str) -> Result<Option<String>> {
    match env(name).map(OsString::into_string) {
        None => Ok(None),
        Some(Ok(v)) if v.is_empty() => Ok(None),
        Some(Ok(v)) => Ok(Some(v)),
        Some(Err(_)) => anyhow::bail!("{name} is not valid Unicode"),
    }
}

/// Samplers the SDK builds from `OTEL_TRACES_SAMPLER`.
const SAMPLERS: [&str; 6] = [
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
];

/// Checks every OpenTelemetry variable the exporter, the tracer and the
/// resource read (see the [module docs](self) for why a value the SDK
/// would ignore is refused); whether the service's name is given.
fn environment(env: &dyn Fn(&str) -> Option<OsString>) -> Result<bool> {
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
    ] {
        if let Some(v) = var(env, name)? {
            if !v.trim().eq_ignore_ascii_case("none") {
                anyhow::bail!(
                    "{name}={v:?}: compression is not built into tollgate; unset it or set it to `none`"
                );
            }
        }
    }
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ] {
        if let Some(v) = var(env, name)? {
            match v.parse::<u64>() {
                Ok(0) => anyhow::bail!("{name}=0: an export needs at least 1 millisecond"),
                Ok(_) => {}
                Err(_) => anyhow::bail!("{name}={v:?} is not a whole number of milliseconds"),
            }
        }
    }
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_EXPORTER_OTLP_HEADERS",
    ] {
        if let Some(v) = var(env, name)? {
            headers(&v).with_context(|| format!("{name} (NAME=VALUE,NAME=VALUE)"))?;
        }
    }
    if let Some(sampler) = var(env, "OTEL_TRACES_SAMPLER")? {
        if !SAMPLERS.contains(&sampler.as_str()) {
            anyhow::bail!(
                "OTEL_TRACES_SAMPLER={sampler:?} is not a sampler tollgate has: {}",
                SAMPLERS.join(", ")
            );
        }
        // Without the argument the ratio is 1, as the specification says.
        if sampler.ends_with("traceidratio") {
            if let Some(arg) = var(env, "OTEL_TRACES_SAMPLER_ARG")? {
                if !arg.parse::<f64>().is_ok_and(|r| (0.0..=1.0).contains(&r)) {
                    anyhow::bail!(
                        "OTEL_TRACES_SAMPLER_ARG={arg:?}: {sampler} needs the share of traces to keep, from 0 to 1"
                    );
                }
            }
        }
    }
    for name in [
        "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
        "OTEL_SPAN_EVENT_COUNT_LIMIT",
        "OTEL_SPAN_LINK_COUNT_LIMIT",
    ] {
        if let Some(v) = var(env, name)? {
            if v.parse::<u32>().is_err() {
                anyhow::bail!("{name}={v:?} is not a count (0 to {})", u32::MAX);
            }
        }
    }
    let mut named = var(env, "OTEL_SERVICE_NAME")?.is_some_and(|n| !n.trim().is_empty());
    if let Some(attributes) = var(env, "OTEL_RESOURCE_ATTRIBUTES")? {
        for (i, entry) in attributes.split(',').enumerate() {
            if entry.trim().is_empty() {
                continue;
            }
            let key = match entry.split_once('=') {
                Some((key, _)) if !key.trim().is_empty() => key.trim(),
                _ => anyhow::bail!(
                    "OTEL_RESOURCE_ATTRIBUTES: entry {} is not KEY=VALUE (KEY=VALUE,KEY=VALUE)",
                    i + 1
                ),
            };
            named |= key == "service.name";
        }
    }
    Ok(named)
}

/// Checks `OTEL_EXPORTER_OTLP_HEADERS`' entries as the exporter will send
/// them (percent-decoded values). Errors never show a value: it is often
/// an API key.
fn headers(list: &str) -> Result<()> {
    use tonic::codegen::http::{HeaderName, HeaderValue};
    for (i, entry) in list.split(',').enumerate() {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let Some((name, value)) = entry.split_once('=') else {
            anyhow::bail!("entry {} is not NAME=VALUE", i + 1);
        };
        let (name, value) = (name.trim(), value.trim());
        if name.is_empty() {
            anyhow::bail!("entry {} has no header name", i + 1);
        }
        if HeaderName::from_bytes(name.as_bytes()).is_err() {
            anyhow::bail!("{name:?} is not a header name");
        }
        if value.is_empty() {
            anyhow::bail!("header `{name}` has no value");
        }
        // As the exporter does: a value that does not percent-decode is
        // sent as given.
        let decoded = percent_decoded(value).unwrap_or_else(|| value.to_owned());
        if HeaderValue::from_str(&decoded).is_err() {
            anyhow::bail!(
                "the value of header `{name}` cannot be sent (only visible ASCII once \
                 percent-decoded); it is not shown"
            );
        }
    }
    Ok(())
}

/// `%XX` sequences decoded; `None` when one is malformed or the result is
/// not UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Starts exporting decision spans as `settings` say: what the app
/// records spans with, and the handle that flushes them at shutdown. Must
/// run within the tokio runtime the exporter will use.
pub fn start(settings: Settings) -> Result<(Spans, Exporting)> {
    let Settings {
        endpoint,
        transport,
        named,
        batch,
    } = settings;
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone());
    if let Transport::Tls { ca } = transport {
        let tls = tonic::transport::ClientTlsConfig::new();
        let tls = match ca {
            Some(pem) => tls.ca_certificate(tonic::transport::Certificate::from_pem(pem)),
            None => tls.with_webpki_roots(),
        };
        builder = builder.with_tls_config(tls);
    }
    let exporter = builder
        .build()
        .with_context(|| format!("cannot export traces to --otlp-endpoint {endpoint}"))?;
    // The SDK's resource reads OTEL_SERVICE_NAME and
    // OTEL_RESOURCE_ATTRIBUTES; the service is `tollgate` unless they name
    // it.
    let mut resource = Resource::builder();
    if !named {
        resource = resource.with_service_name("tollgate");
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    let (tracer, exporting) = spans::batch::start(exporter, resource, batch);
    tracing::info!(endpoint = %endpoint, "exporting decision spans over OTLP");
    Ok((Spans::new(tracer), exporting))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(endpoint: Option<&str>) -> OtlpArgs {
        OtlpArgs {
            otlp_endpoint: endpoint.map(str::to_owned),
            otlp_ca: None,
            otlp_schedule_delay_ms: 5000,
            otlp_max_queue: 2048,
            otlp_max_batch: 512,
            otlp_export_timeout_ms: 30_000,
        }
    }

    /// `settings` of an `http://` endpoint with exactly `vars` set.
    fn with(vars: &[(&str, &str)]) -> Result<Option<Settings>> {
        let vars: Vec<(String, OsString)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        settings_with(&args(Some("http://collector:4317")), &|name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    fn refused(vars: &[(&str, &str)]) -> String {
        match with(vars) {
            Ok(s) => panic!("accepted {vars:?}: {s:?}"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn without_an_endpoint_nothing_is_read() {
        let read = |name: &str| -> Option<OsString> { panic!("read {name}") };
        assert!(settings_with(&args(None), &read).unwrap().is_none());
    }

    #[test]
    fn good_settings_pass() {
        let s = with(&[
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "api-key=abc, x-tenant=a%2Cb ,",
            ),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.01"),
            ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "128"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,"),
            ("OTEL_SERVICE_NAME", " "),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(s.endpoint(), "http://collector:4317");
        assert!(!s.named, "a blank OTEL_SERVICE_NAME names nothing");
        assert!(matches!(s.transport, Transport::Plain));
        // Without its argument a ratio sampler keeps every trace.
        with(&[("OTEL_TRACES_SAMPLER", "traceidratio")]).unwrap();
    }

    #[test]
    fn the_service_is_named_by_either_variable() {
        let named = |vars: &[(&str, &str)]| with(vars).unwrap().unwrap().named;
        assert!(!named(&[]));
        assert!(named(&[("OTEL_SERVICE_NAME", "limits")]));
        assert!(named(&[(
            "OTEL_RESOURCE_ATTRIBUTES",
            "a=b, service.name=limits"
        )]));
        assert!(!named(&[("OTEL_RESOURCE_ATTRIBUTES", "a=service.name")]));
    }

    #[test]
    fn compression_is_refused_unless_none() {
        for name in [
            "OTEL_EXPORTER_OTLP_COMPRESSION",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        ] {
            let e = refused(&[(name, "gzip")]);
            assert!(e.contains(&format!("{name}=\"gzip\"")), "{e}");
            assert!(e.contains("compression is not built into tollgate"), "{e}");
            assert!(e.contains("--otlp-endpoint http://collector:4317"), "{e}");
            with(&[(name, "NONE")]).unwrap();
            with(&[(name, "")]).unwrap();
        }
    }

    #[test]
    fn malformed_values_are_refused_naming_the_variable() {
        for (vars, want) in [
            (
                vec![("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")],
                "OTEL_EXPORTER_OTLP_TIMEOUT=\"10s\" is not a whole number of milliseconds",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "0")],
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT=0",
            ),
            (
                vec![(
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "api-key=a,secret-without-name",
                )],
                "OTEL_EXPORTER_OTLP_HEADERS (NAME=VALUE,NAME=VALUE): entry 2 is not NAME=VALUE",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "api key=a")],
                "\"api key\" is not a header name",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_HEADERS", "=a")],
                "entry 1 has no header name",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_HEADERS", "api-key=")],
                "header `api-key` has no value",
            ),
            (
                vec![("OTEL_TRACES_SAMPLER", "ratio")],
                "OTEL_TRACES_SAMPLER=\"ratio\" is not a sampler tollgate has",
            ),
            (
                vec![
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "1%"),
                ],
                "OTEL_TRACES_SAMPLER_ARG=\"1%\": traceidratio needs the share",
            ),
            (
                vec![
                    ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "2"),
                ],
                "OTEL_TRACES_SAMPLER_ARG=\"2\"",
            ),
            (
                vec![("OTEL_SPAN_LINK_COUNT_LIMIT", "-1")],
                "OTEL_SPAN_LINK_COUNT_LIMIT=\"-1\" is not a count",
            ),
            (
                vec![("OTEL_RESOURCE_ATTRIBUTES", "a=b,prod")],
                "OTEL_RESOURCE_ATTRIBUTES: entry 2 is not KEY=VALUE",
            ),
        ] {
            let e = refused(&vars);
            assert!(e.contains(want), "{vars:?}: {e}");
            assert!(e.contains("--otlp-endpoint"), "{e}");
        }
    }

    #[test]
    fn a_header_value_is_checked_decoded_and_never_shown() {
        let e = refused(&[("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cr%0At")]);
        assert!(
            e.contains("the value of header `api-key` cannot be sent"),
            "{e}"
        );
        assert!(!e.contains("s3cr"), "the value is shown: {e}");
        // Not valid percent-encoding: sent as given, as the exporter does.
        with(&[("OTEL_EXPORTER_OTLP_HEADERS", "api-key=100%")]).unwrap();
    }

    #[test]
    fn a_variable_that_is_not_unicode_is_refused() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0xff, b'x']);
        let e = settings_with(&args(Some("http://c:4317")), &|name| {
            (name == "OTEL_TRACES_SAMPLER").then(|| bad.clone())
        })
        .unwrap_err();
        assert!(
            format!("{e:#}").contains("OTEL_TRACES_SAMPLER is not valid Unicode"),
            "{e:#}"
        );
    }

    #[test]
    fn percent_decoding_follows_the_exporter() {
        assert_eq!(percent_decoded("a%2Cb%20c").as_deref(), Some("a,b c"));
        assert_eq!(percent_decoded("100%"), None);
        assert_eq!(percent_decoded("%zz"), None);
        assert_eq!(percent_decoded("%ff"), None);
    }
}
