//! The state every surface shares: the service (limiter, sessions, clock),
//! the config's status, the metrics handle.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;
use tollgate_config::Config;
use tollgate_core::Nanos;
use tollgate_service::{
    Clock, Limiter, Service, ServiceOptions, Sessions, SystemClock, Unserved, View,
};
use tollgate_store::Store;

/// What `/status` reports of the config in force.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ConfigStatus {
    /// Where it comes from, for people: the file or directory, `config
    /// API URL`, or both as `FILE + config API URL` (`None`: built in).
    pub source: Option<String>,
    /// Increments with every successful load.
    pub revision: u64,
    /// When the config in force was loaded (Unix ms).
    pub loaded_at_ms: u64,
    /// Why the last reload was refused, if it was (cleared by a good one).
    pub last_error: Option<String>,
    /// Warnings of the config in force (normalization, ignored fields).
    pub warnings: Vec<String>,
    /// The config API's revision in force, for a server that follows one
    /// (`serve --config-api`).
    pub api_revision: Option<i64>,
}

/// The part of the config that comes from the configuration API: its
/// namespaces as a config text (JSON, which the YAML loader reads), and
/// the API's revision it stands for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApiPart {
    /// The API's revision.
    pub revision: i64,
    /// The namespaces, in tollgate's config format.
    pub text: String,
}

/// Shared server state, built by an [`AppBuilder`].
pub struct App<S> {
    /// Decides requests, owns sessions, reads the clock.
    service: Arc<Service<S>>,
    config: Mutex<(Arc<Config>, ConfigStatus)>,
    /// The newest part of the config the config API sent, if the server
    /// follows one (in force unless `/status` reports it refused).
    api_part: Mutex<Option<ApiPart>>,
    /// Held from reading the parts through putting them in force, so a
    /// file reload and a config API revision never undo each other.
    install_lock: Mutex<()>,
    /// Renders `/metrics` (`None` when no recorder is installed, as in
    /// tests that run several servers in one process).
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The store's name for `/status` (`memory`, `redis`, ...).
    store_name: &'static str,
    /// Where sampled decisions are recorded, if anywhere.
    decision_log: Option<crate::decision_log::DecisionLog>,
    /// Records a span per decision, when traces are exported
    /// (`serve --otlp-endpoint`); `None` keeps the decision path free of
    /// any tracing work.
    spans: Option<crate::spans::Spans>,
    /// When the app was built, for `/status`'s uptime (a monotonic
    /// instant: uptime is not limit time, and a stepped clock must not
    /// change it).
    started: std::time::Instant,
    /// The domains refused most lately, per resource (`GET /v1/denied`).
    denied: crate::denied::Denied,
    /// The tokens the admin endpoints (`/v1/denied`) take
    /// (`serve --admin-tokens-file`); none: those endpoints are off.
    admin_tokens: crate::tokens::Tokens,
    /// What the limit-describing headers of `POST /v1/request` are
    /// ([`App::rate_headers`]).
    answers: Answers,
    stopping: std::sync::atomic::AtomicBool,
    /// The readiness last published to watchers (gRPC health's Watch).
    readiness: watch::Sender<Readiness>,
}

/// What an [`App`] is made of: a store, its name and the config to start
/// with, and optionally where the config came from, its warnings, the
/// service's bounds, the clock (the system's by default; tests pass a
/// [`tollgate_service::ManualClock`]), the metrics handle, the decision
/// log, decision spans and the admin tokens. [`AppBuilder::build`]
/// compiles the config for the store.
#[must_use = "an AppBuilder does nothing until built"]
pub struct AppBuilder<S> {
    store: S,
    store_name: &'static str,
    config: Config,
    source: Option<String>,
    warnings: Vec<String>,
    options: ServiceOptions,
    clock: Arc<dyn Clock>,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    decision_log: Option<crate::decision_log::DecisionLog>,
    spans: Option<crate::spans::Spans>,
    admin_tokens: crate::tokens::Tokens,
    answers: Answers,
}

/// How answers describe their limits beyond their bodies: the RateLimit
/// headers of `POST /v1/request`, when a grant counts as near its limit,
/// and how many of the most refused domains `/metrics` names.
#[derive(Copy, Clone, Debug, Default)]
struct Answers {
    rate_headers: crate::http::RateHeaders,
    near_limit: crate::metrics::NearLimitRatio,
    denied_metrics_top: usize,
}

impl<S: Store> AppBuilder<S> {
    /// Where the config comes from, for people (`/status`'s `source`;
    /// `None`, the default: built in).
    pub fn source(mut self, source: Option<String>) -> Self {
        self.source = source;
        self
    }

    /// The warnings of the config (normalization, ignored fields).
    pub fn warnings(mut self, warnings: Vec<String>) -> Self {
        self.warnings = warnings;
        self
    }

    /// The service's bounds (sessions, holds, copy deadline).
    pub fn options(mut self, options: ServiceOptions) -> Self {
        self.options = options;
        self
    }

    /// The clock every surface and the service read the time from.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The handle that renders `/metrics` (without one, `/metrics` says
    /// metrics are off).
    pub fn metrics(mut self, handle: metrics_exporter_prometheus::PrometheusHandle) -> Self {
        self.metrics = Some(handle);
        self
    }

    /// Where sampled decisions are recorded.
    pub fn decision_log(mut self, log: crate::decision_log::DecisionLog) -> Self {
        self.decision_log = Some(log);
        self
    }

    /// Records a span per decision (`serve --otlp-endpoint`).
    pub fn spans(mut self, spans: crate::spans::Spans) -> Self {
        self.spans = Some(spans);
        self
    }

    /// The tokens the admin endpoints take (none: those endpoints are off).
    pub fn admin_tokens(mut self, tokens: crate::tokens::Tokens) -> Self {
        self.admin_tokens = tokens;
        self
    }

    /// The RateLimit headers `POST /v1/request` answers carry (none by
    /// default: `serve --http-ratelimit-headers`).
    pub fn rate_headers(mut self, form: crate::http::RateHeaders) -> Self {
        self.answers.rate_headers = form;
        self
    }

    /// When a grant counts in `tollgate_near_limit_total` (0.8 of the
    /// limit used by default: `serve --near-limit-ratio`).
    pub fn near_limit(mut self, ratio: crate::metrics::NearLimitRatio) -> Self {
        self.answers.near_limit = ratio;
        self
    }

    /// How many of each resource's most refused domains `/metrics` shows
    /// (`serve --denied-metrics-top`; 0, the default, shows none), at
    /// most [`crate::denied::MAX_METRIC_RANKS`] (a larger number is
    /// taken as that).
    pub fn denied_metrics_top(mut self, top: usize) -> Self {
        self.answers.denied_metrics_top = top.min(crate::denied::MAX_METRIC_RANKS);
        self
    }

    /// The app, its config compiled for the store at the clock's now; the
    /// error lists every limit the store cannot serve, each saying why
    /// ([`Limiter::compile`]).
    pub fn build(self) -> Result<App<S>, Unserved> {
        let now = self.clock.now();
        let limiter = Limiter::new(self.store, View::default());
        limiter.set_view(limiter.compile(&self.config, now)?);
        Ok(App {
            service: Arc::new(Service::new(limiter, self.clock, self.options)),
            config: Mutex::new((
                Arc::new(self.config),
                ConfigStatus {
                    source: self.source,
                    revision: 1,
                    loaded_at_ms: now.as_u64() / 1_000_000,
                    last_error: None,
                    warnings: self.warnings,
                    api_revision: None,
                },
            )),
            api_part: Mutex::new(None),
            install_lock: Mutex::new(()),
            metrics: self.metrics,
            store_name: self.store_name,
            decision_log: self.decision_log,
            spans: self.spans,
            started: std::time::Instant::now(),
            denied: crate::denied::Denied::default(),
            admin_tokens: self.admin_tokens,
            answers: self.answers,
            stopping: std::sync::atomic::AtomicBool::new(false),
            readiness: watch::Sender::new(Readiness::Ready),
        })
    }
}

/// Whether the server should receive traffic and, if not, why: the one
/// rule `/readyz`, gRPC health and the Status RPC all answer by
/// ([`App::readiness`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// It decides requests.
    Ready,
    /// Its store cannot decide now: Redis unreachable, a cluster node
    /// still joining (or with a clock too far off, or a different
    /// secret from its seeds).
    StoreUnavailable,
    /// Shutdown has begun: a load balancer should stop sending before
    /// the listeners close (after the shutdown delay). Final.
    Stopping,
}

impl Readiness {
    /// Whether traffic should come.
    pub fn is_ready(self) -> bool {
        self == Readiness::Ready
    }

    /// A word for `/readyz`'s body.
    pub fn as_str(self) -> &'static str {
        match self {
            Readiness::Ready => "ready",
            Readiness::StoreUnavailable => "store unavailable",
            Readiness::Stopping => "stopping",
        }
    }
}

impl<S: Store> App<S> {
    /// An app over `store` (named `store_name`) serving `config`, with
    /// every other part at its default until the builder says otherwise.
    pub fn builder(store: S, store_name: &'static str, config: Config) -> AppBuilder<S> {
        AppBuilder {
            store,
            store_name,
            config,
            source: None,
            warnings: Vec::new(),
            options: ServiceOptions::default(),
            clock: Arc::new(SystemClock),
            metrics: None,
            decision_log: None,
            spans: None,
            admin_tokens: crate::tokens::Tokens::default(),
            answers: Answers::default(),
        }
    }

    /// The service: decides requests, owns sessions, reads the clock.
    pub fn service(&self) -> &Arc<Service<S>> {
        &self.service
    }

    /// Renders `/metrics`, when a recorder is installed.
    pub fn metrics(&self) -> Option<&metrics_exporter_prometheus::PrometheusHandle> {
        self.metrics.as_ref()
    }

    /// The store's name for `/status` (`memory`, `redis`, ...).
    pub fn store_name(&self) -> &'static str {
        self.store_name
    }

    /// Where sampled decisions are recorded, if anywhere.
    pub fn decision_log(&self) -> Option<&crate::decision_log::DecisionLog> {
        self.decision_log.as_ref()
    }

    /// Whether a span is recorded per decision.
    pub fn spans_on(&self) -> bool {
        self.spans.is_some()
    }

    /// How long the app has run, for `/status`.
    pub fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// The RateLimit headers `POST /v1/request` answers carry.
    pub fn rate_headers(&self) -> crate::http::RateHeaders {
        self.answers.rate_headers
    }

    /// When a grant counts as near its limit.
    pub fn near_limit(&self) -> crate::metrics::NearLimitRatio {
        self.answers.near_limit
    }

    /// How many of each resource's most refused domains `/metrics` shows
    /// (0: none).
    pub fn denied_metrics_top(&self) -> usize {
        self.answers.denied_metrics_top
    }

    /// The domains refused most lately, per resource (`GET /v1/denied`).
    pub fn denied(&self) -> &crate::denied::Denied {
        &self.denied
    }

    /// The tokens the admin endpoints take.
    pub fn admin_tokens(&self) -> &crate::tokens::Tokens {
        &self.admin_tokens
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<S> {
        self.service.limiter()
    }

    /// Open sessions and HTTP holds.
    pub fn sessions(&self) -> &Sessions {
        self.service.sessions()
    }

    /// Now, by the app's clock.
    pub fn now(&self) -> Nanos {
        self.service.now()
    }

    /// Now by the app's clock when decision spans are on (a span starts
    /// here), else `None` without reading the clock.
    pub fn span_start(&self) -> Option<Nanos> {
        self.spans.as_ref().map(|_| self.now())
    }

    /// Records the span of `decision`, whose service call ran from
    /// `started` (from [`App::span_start`]) to `ended`, by the app's
    /// clock; nothing when spans are off.
    pub fn record_span(
        &self,
        caller: &crate::spans::Caller,
        (started, ended): (Nanos, Nanos),
        decision: &crate::spans::Decision<'_>,
    ) {
        if let Some(spans) = &self.spans {
            spans.record(caller, started, ended, decision);
        }
    }

    /// The caller's trace context from gRPC metadata, when spans are on.
    pub fn caller_from_grpc(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> crate::spans::Caller {
        match &self.spans {
            Some(spans) => spans.caller_from_grpc(metadata),
            None => crate::spans::Caller::NONE,
        }
    }

    /// The caller's trace context from HTTP headers, when spans are on.
    pub fn caller_from_http(&self, headers: &http::HeaderMap) -> crate::spans::Caller {
        match &self.spans {
            Some(spans) => spans.caller_from_http(headers),
            None => crate::spans::Caller::NONE,
        }
    }

    /// Whether shutdown has begun (`/readyz` then answers 503).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Marks shutdown as begun, and tells readiness watchers at once.
    pub fn begin_stopping(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.refresh_readiness();
    }

    /// Whether the server should receive traffic now, and if not, why.
    /// Shutdown comes first: a stopping server is not made ready again by
    /// its store.
    pub fn readiness(&self) -> Readiness {
        if self.is_stopping() {
            Readiness::Stopping
        } else if !self.limiter().store().is_ready() {
            Readiness::StoreUnavailable
        } else {
            Readiness::Ready
        }
    }

    /// Publishes [`App::readiness`] to watchers if it changed, and returns
    /// it. A store's readiness changes without an event (a Redis ping
    /// failing, a cluster node finishing its join), so the server calls
    /// this periodically; shutdown calls it at once.
    pub fn refresh_readiness(&self) -> Readiness {
        let mut now = Readiness::Ready;
        // Read under the channel's lock, so a refresh that read "ready"
        // just before shutdown began cannot publish it after the refresh
        // that says "stopping".
        self.readiness.send_if_modified(|published| {
            now = self.readiness();
            let changed = *published != now;
            *published = now;
            changed
        });
        now
    }

    /// The published readiness, which changes as [`App::refresh_readiness`]
    /// notices; refreshed first, so it starts from now.
    pub fn watch_readiness(&self) -> watch::Receiver<Readiness> {
        self.refresh_readiness();
        self.readiness.subscribe()
    }

    /// The config in force.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.lock().0)
    }

    /// The config's status.
    pub fn config_status(&self) -> ConfigStatus {
        self.lock().1.clone()
    }

    /// Puts `config`, compiled into `view`, in force: limits whose
    /// parameters did not change keep their state (their ids are
    /// fingerprints of their parameters).
    fn install(&self, config: Config, view: View, warnings: Vec<String>) -> u64 {
        let now = self.now();
        let mut guard = self.lock();
        self.limiter().set_view(view);
        guard.0 = Arc::new(config);
        guard.1.revision += 1;
        guard.1.loaded_at_ms = now.as_u64() / 1_000_000;
        guard.1.last_error = None;
        guard.1.warnings = warnings;
        metrics::counter!(crate::metrics::RELOADS, "outcome" => "ok").increment(1);
        metrics::gauge!(crate::metrics::CONFIG_REVISION).set(guard.1.revision as f64);
        metrics::gauge!(crate::metrics::CONFIG_ERROR).set(0.0);
        guard.1.revision
    }

    /// The newest part of the config the config API sent.
    pub fn api_part(&self) -> Option<ApiPart> {
        self.api_part
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records that the config in force (given to [`App::builder`]) includes
    /// the config API's `part`.
    pub fn adopt_api_part(&self, part: ApiPart) {
        self.lock().1.api_revision = Some(part.revision);
        *self.api_part.lock().unwrap_or_else(PoisonError::into_inner) = Some(part);
    }

    /// Puts the config made of the file at `file` (if any) and the config
    /// API's newest part in force, or records why not (the old one keeps
    /// serving). `api`, when given, is a newer part from the config API:
    /// it is kept as the newest even if refused, so a later file reload
    /// tries it again. Returns the local revision.
    pub fn install_parts(
        &self,
        file: Option<&std::path::Path>,
        api: Option<ApiPart>,
    ) -> Result<u64, InstallError> {
        let _installing = self
            .install_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let api = {
            let mut newest = self.api_part.lock().unwrap_or_else(PoisonError::into_inner);
            if api.is_some() {
                *newest = api;
            }
            newest.clone()
        };
        let result = compose(file, api.as_ref())
            .map_err(InstallError::from)
            .and_then(|(config, warnings)| {
                for w in &warnings {
                    tracing::warn!(warning = ?w.to_string(), "config warning");
                }
                Ok(self.try_install(config, warnings)?)
            });
        match result {
            Ok(revision) => {
                self.lock().1.api_revision = api.as_ref().map(|a| a.revision);
                Ok(revision)
            }
            Err(e) => {
                self.refuse(&e);
                Err(e)
            }
        }
    }

    /// Puts `config` in force if the store can serve it
    /// ([`Limiter::compile`]): limits whose parameters did not change keep
    /// their state. Otherwise changes nothing and says why.
    pub fn try_install(&self, config: Config, warnings: Vec<String>) -> Result<u64, Unserved> {
        let view = self.limiter().compile(&config, self.now())?;
        Ok(self.install(config, view, warnings))
    }

    /// Whether the server should receive traffic: not stopping, and its
    /// store can decide ([`App::readiness`]).
    pub fn is_ready(&self) -> bool {
        self.readiness().is_ready()
    }

    /// Records a refused reload: the old config keeps serving, and
    /// `/status` shows why (the whole message: every problem, each with
    /// its file and line or its namespace and resource).
    pub fn refuse(&self, error: &InstallError) {
        metrics::counter!(crate::metrics::RELOADS, "outcome" => "error").increment(1);
        metrics::gauge!(crate::metrics::CONFIG_ERROR).set(1.0);
        self.lock().1.last_error = Some(error.to_string());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Arc<Config>, ConfigStatus)> {
        self.config.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Loads the file at `file` and the config API's part, and merges their
/// namespaces (a namespace in both is an error, as across files).
pub fn compose(
    file: Option<&std::path::Path>,
    api: Option<&ApiPart>,
) -> Result<(Config, Vec<String>), ComposeError> {
    let mut config = Config::default();
    let mut warnings = Vec::new();
    if let Some(path) = file {
        let loaded = tollgate_config::load_path(path).map_err(ComposeError::File)?;
        warnings.extend(loaded.warnings.iter().map(ToString::to_string));
        config = loaded.config;
    }
    if let Some(api) = api {
        let what = format!("config API revision {}", api.revision);
        let loaded = tollgate_config::load_str(&what, &api.text).map_err(ComposeError::Api)?;
        warnings.extend(loaded.warnings.iter().map(ToString::to_string));
        for ns in loaded.config.namespaces {
            if config.namespaces.iter().any(|n| n.name == ns.name) {
                return Err(ComposeError::InBoth(ns.name));
            }
            config.namespaces.push(ns);
        }
    }
    Ok((config, warnings))
}

/// Why the file and the config API's part do not make a config
/// ([`compose`]). A load error's diagnostics are its message, not a
/// [`source`](std::error::Error::source): each already names its file (or
/// the API's revision), line and column, and the config error's own
/// `Display` starts every line with `error: `, which a wrapped message
/// would then say twice.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ComposeError {
    /// The config file (or directory) did not load.
    #[error("{}", .0.plain())]
    File(tollgate_config::ConfigError),
    /// The config API's part did not load.
    #[error("{}", .0.plain())]
    Api(tollgate_config::ConfigError),
    /// A namespace is both in the file and in the config API.
    #[error("namespace {0:?} is both in the config file and in the config API")]
    InBoth(String),
}

/// Why a config was not put in force ([`App::install_parts`], a reload):
/// the previous one keeps serving, and `/status` says why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InstallError {
    /// The file or the config API's part did not load, or they clash.
    #[error(transparent)]
    Compose(#[from] ComposeError),
    /// The store cannot serve the config: every limit it refused.
    #[error(transparent)]
    Unserved(#[from] Unserved),
}
