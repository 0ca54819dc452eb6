//! Prometheus metric names, descriptions and the recorder.

/// What renders `/metrics`, from [`install`]: named here so the binary
/// can hold one without depending on the exporter itself.
pub use metrics_exporter_prometheus::PrometheusHandle;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

mod handles;
mod near;

pub use near::{NearLimitRatio, NearLimitRatioError};
use tollgate_core::Mode;

/// Decisions, by `surface`, `namespace`, `resource` and `outcome`
/// (`granted` / `rejected` / `error`).
pub const DECISIONS: &str = "tollgate_decisions_total";
/// Hits granted by checks (`try` and `acquire`), by `namespace` and
/// `resource`.
pub const HITS: &str = "tollgate_hits_granted_total";
/// Hits charged after the fact (mode `report`, `report: true`
/// descriptors), by `namespace` and `resource`: charged whatever the
/// check beside them said, so counted whatever the answer.
pub const HITS_REPORTED: &str = "tollgate_hits_reported_total";
/// Hits given back (mode `refund`, Envoy's `is_negative_hits`), by
/// `namespace` and `resource`.
pub const HITS_REFUNDED: &str = "tollgate_hits_refunded_total";
/// Grants that left more than the near-limit ratio of the limit used
/// (`limit - remaining > floor(limit × ratio)`, [`NearLimitRatio`]), by
/// `surface`, `namespace` and `resource`, on every surface.
pub const NEAR_LIMIT: &str = "tollgate_near_limit_total";
/// Refusals not counted in `GET /v1/denied` because its summary already
/// held [`crate::denied::MAX_RESOURCES`] resources in the window.
pub const DENIED_UNCOUNTED: &str = "tollgate_denied_uncounted_total";
/// The rejections counted for the domain at each `rank` of a resource's
/// most refused (`serve --denied-metrics-top`), by `namespace`,
/// `resource` and `rank`: written at each scrape from
/// [`crate::denied`]'s summaries, never registered, so the series are
/// bounded by ranks × resources ([`crate::denied::Denied::write_metrics`]).
pub const DENIED_TOP_REJECTED: &str = "tollgate_denied_top_rejected";
/// 1 for the domain at each `rank` of a resource's most refused, with
/// the domain as a label: the only series that name domains, as many as
/// [`DENIED_TOP_REJECTED`]'s.
pub const DENIED_TOP_DOMAIN: &str = "tollgate_denied_top_domain";
/// Requests to admin endpoints (`/v1/denied`, `/v1/counters`, gRPC
/// `Inspect` and `Reset`) refused for a missing or unknown bearer token,
/// or a `read` token that asked to write, by `reason` (`no_token`,
/// `unknown_token`, `admin_role_required`).
pub const ADMIN_AUTH_FAILURES: &str = "tollgate_admin_auth_failures_total";
/// Counters reset through an admin endpoint (`DELETE /v1/counters`, gRPC
/// `Reset`), by `surface`, `namespace` and `resource` (configured names
/// only: an unknown one is refused before it is counted).
pub const COUNTER_RESETS: &str = "tollgate_counter_resets_total";
/// Seconds per decision, by `surface`.
pub const LATENCY: &str = "tollgate_decision_seconds";
/// Open sessions (gRPC streams and HTTP holds).
pub const SESSIONS: &str = "tollgate_sessions";
/// Copies held by sessions, by `pool`.
pub const HOLDS: &str = "tollgate_holds";
/// Leased HTTP holds released because their lease lapsed.
pub const LAPSED: &str = "tollgate_holds_lapsed_total";
/// Config reloads, by `outcome` (`ok` / `error`).
pub const RELOADS: &str = "tollgate_config_reloads_total";
/// The revision of the config in force.
pub const CONFIG_REVISION: &str = "tollgate_config_revision";
/// 1 while the last reload was refused, else 0.
pub const CONFIG_ERROR: &str = "tollgate_config_last_reload_failed";
/// Connections open, by `listener` (`http`, `grpc`, `config_api`).
pub const CONNECTIONS: &str = "tollgate_connections";
/// Connections closed at once because their port was at its cap, by
/// `listener`.
pub const CONNECTIONS_REFUSED: &str = "tollgate_connections_refused_total";
/// Connections closed (or requests answered 408) for being too slow, by
/// `listener` and `phase` (`handshake`, `header`, `idle`, `body`).
pub const CONNECTIONS_TIMED_OUT: &str = "tollgate_connections_timed_out_total";
/// TLS handshakes that failed, by `listener` and `reason`
/// (`no_client_cert`, `client_cert_untrusted`, `client_cert_v1`,
/// `client_cert_expired`, `client_cert_refused`, `client_alert`,
/// `not_tls`, `protocol`, `closed`). Timeouts are
/// [`CONNECTIONS_TIMED_OUT`]'s.
pub const TLS_HANDSHAKE_FAILURES: &str = "tollgate_tls_handshake_failures_total";
/// Decision spans dropped because the export queue was full (the
/// collector slow or down) or exporting had stopped.
pub const SPANS_DROPPED: &str = "tollgate_spans_dropped_total";
/// Decision spans handed to the exporter, by `outcome` (`ok`, or `error`
/// when the collector refused them or did not answer in time).
pub const SPANS_EXPORTED: &str = "tollgate_spans_exported_total";

/// Installs the process-wide Prometheus recorder; its handle renders
/// `/metrics`. Errors if a recorder is already installed.
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(LATENCY.to_owned()),
            &[
                0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
                0.01, 0.025, 0.1,
            ],
        )
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    handles::recorder_installed();
    describe();
    describe_connections();
    tollgate_store::MemoryStore::describe_metrics();
    Ok(handle)
}

/// Installs the process-wide Prometheus recorder for a process that
/// serves no limiting surface (the config API): only the connection
/// metrics of [`crate::listen`] are described.
pub fn install_for_listeners() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| e.to_string())?;
    describe_connections();
    Ok(handle)
}

fn describe_connections() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(CONNECTIONS, "Connections open, by listener.");
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Connections closed at once because their listener was at its connection cap."
    );
    describe_counter!(
        CONNECTIONS_TIMED_OUT,
        "Connections closed, or requests answered 408, for being too slow, by listener and phase."
    );
    describe_counter!(
        TLS_HANDSHAKE_FAILURES,
        "TLS handshakes that failed, by listener and reason (the log line says more, at most every 10 s per reason)."
    );
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        DECISIONS,
        "Limiting decisions by surface, namespace, resource and outcome."
    );
    describe_counter!(HITS, "Hits granted by checks, by namespace and resource.");
    describe_counter!(
        HITS_REPORTED,
        "Hits charged after the fact (reports), by namespace and resource."
    );
    describe_counter!(
        HITS_REFUNDED,
        "Hits given back (refunds), by namespace and resource."
    );
    describe_counter!(
        DENIED_UNCOUNTED,
        "Refusals left out of GET /v1/denied because its summary held as many resources as it may."
    );
    describe_counter!(
        ADMIN_AUTH_FAILURES,
        "Requests to admin endpoints refused for a missing or unknown bearer token, or a read token that asked to write, by reason."
    );
    describe_counter!(
        COUNTER_RESETS,
        "Counters reset through an admin endpoint, by surface, namespace and resource."
    );
    describe_counter!(
        NEAR_LIMIT,
        "Grants that left more of the limit used than the near-limit ratio, by surface, namespace and resource."
    );
    describe_histogram!(LATENCY, Unit::Seconds, "Time to decide, by surface.");
    describe_gauge!(
        SESSIONS,
        "Open sessions (gRPC session streams and HTTP holds)."
    );
    describe_gauge!(HOLDS, "Copies held by sessions, by pool.");
    describe_counter!(LAPSED, "HTTP holds released because their lease lapsed.");
    describe_counter!(RELOADS, "Config reloads by outcome.");
    describe_gauge!(CONFIG_REVISION, "Revision of the config in force.");
    describe_gauge!(CONFIG_ERROR, "1 while the last config reload was refused.");
    describe_counter!(
        SPANS_DROPPED,
        "Decision spans dropped: the export queue was full or exporting had stopped."
    );
    describe_counter!(
        SPANS_EXPORTED,
        "Decision spans sent to the OTLP collector, by outcome."
    );
}

/// Sets the config metrics for the config a server starts with (its
/// `revision`), so that they exist before the first reload: a dashboard
/// then shows revision 1 and no failed reload rather than no data.
pub fn config_loaded_at_start(revision: u64) {
    metrics::gauge!(CONFIG_REVISION).set(revision as f64);
    metrics::gauge!(CONFIG_ERROR).set(0.0);
    metrics::counter!(RELOADS, "outcome" => "ok").increment(0);
    metrics::counter!(RELOADS, "outcome" => "error").increment(0);
}

/// Records one rate decision that charged `hits` in `mode`: hits a check
/// granted ([`HITS`]), reported ([`HITS_REPORTED`]) or gave back
/// ([`HITS_REFUNDED`]). Names are labels only when the config knows them,
/// so a flood of made-up names cannot grow the label set.
pub fn rate_decision(
    surface: &'static str,
    namespace: &str,
    resource: &str,
    known: bool,
    allowed: bool,
    hits: u64,
    mode: Mode,
) {
    let (ns, res) = if known {
        (namespace, resource)
    } else {
        (UNCONFIGURED, UNCONFIGURED)
    };
    handles::with(surface, ns, res, |h| {
        h.decision(allowed).increment(1);
        if hits > 0 {
            h.hits(mode).increment(hits);
        }
    });
}

/// The label of names the config does not know.
const UNCONFIGURED: &str = "_unconfigured";

/// Records a grant near its limit ([`NearLimitRatio::is_near`]), for a
/// configured resource (names are labels only then, as for decisions).
pub fn near_limit(surface: &'static str, namespace: &str, resource: &str) {
    handles::with(surface, namespace, resource, |h| {
        h.near_limit().increment(1)
    });
}

/// Records how long a decision took, in seconds, on `surface`.
pub fn latency(surface: &'static str, seconds: f64) {
    handles::record_latency(surface, seconds);
}

/// Records a request the service refused with an error.
pub fn error(surface: &'static str, reason: &'static str) {
    metrics::counter!(DECISIONS, "surface" => surface, "namespace" => "", "resource" => "", "outcome" => "error", "reason" => reason).increment(1);
}
