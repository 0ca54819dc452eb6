//! What `tollgate serve`'s answers and metrics say about limits beyond
//! the decision itself: the RateLimit headers of `POST /v1/request`, when
//! a grant counts as near its limit, and how many of each resource's most
//! refused domains `/metrics` names.

use clap::Args;
use tollgate_server::http::RateHeaders;
use tollgate_server::metrics::NearLimitRatio;
use tollgate_server::AppBuilder;
use tollgate_store::Store;

/// `--http-ratelimit-headers`, `--near-limit-ratio`, `--denied-metrics-top`.
#[derive(Args, Debug, Clone)]
pub struct ServeAnswerArgs {
    /// RateLimit headers on POST /v1/request answers: `off`, `ietf`
    /// (RateLimit-Policy and RateLimit, the IETF draft's structured
    /// fields) or `legacy` (RateLimit-Limit, -Remaining, -Reset).
    #[arg(long, env = "TOLLGATE_HTTP_RATELIMIT_HEADERS", default_value = "off", value_parser = clap::value_parser!(RateHeaders))]
    pub http_ratelimit_headers: RateHeaders,
    /// A grant counts in tollgate_near_limit_total when it leaves more
    /// than this share of the limit used (`limit - remaining >
    /// floor(limit × ratio)`, envoyproxy/ratelimit's NEAR_LIMIT_RATIO):
    /// a decimal in [0, 1], at most 6 decimal places. Counts grants, not
    /// hits (upstream counts hits), and never a request over the limit
    /// let through by shadow mode.
    #[arg(long, env = "TOLLGATE_NEAR_LIMIT_RATIO", default_value = "0.8", value_parser = clap::value_parser!(NearLimitRatio))]
    pub near_limit_ratio: NearLimitRatio,
    /// Show each resource's K most refused domains on /metrics (0 to 10;
    /// 0, the default, shows none), those refused at least 10 times for
    /// certain in the last two minutes. /metrics needs no token: the
    /// domains (user ids, keys, addresses) become readable to whoever
    /// reads it, and each new domain named is a new series in
    /// Prometheus for its retention.
    #[arg(long, env = "TOLLGATE_DENIED_METRICS_TOP", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=10))]
    pub denied_metrics_top: u8,
}

impl ServeAnswerArgs {
    /// `app` with these settings.
    pub fn apply<S: Store>(&self, app: AppBuilder<S>) -> AppBuilder<S> {
        app.rate_headers(self.http_ratelimit_headers)
            .near_limit(self.near_limit_ratio)
            .denied_metrics_top(usize::from(self.denied_metrics_top))
    }
}
