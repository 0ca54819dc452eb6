//! The three clients, one per API (native gRPC, Envoy RLS, HTTP/JSON):
//! opening their connections, sending one request, and turning what comes
//! back into an [`Outcome`] (granted, rejected, or an error counted by
//! kind).
//!
//! Apart so that the load loops know nothing of any protocol: they draw a
//! key and [`call`].

use std::sync::Arc;

use anyhow::{Context, Result};
use serde::Deserialize;
use tollgate_proto::rls::rate_limit_descriptor::Entry;
use tollgate_proto::rls::rate_limit_response::Code as RlsCode;
use tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::rls::{RateLimitDescriptor, RateLimitRequest};
use tollgate_proto::v1::tollgate_client::TollgateClient;
use tollgate_proto::v1::RateRequest;
use tonic::transport::{Channel, Endpoint};

use super::plan::{LoadPlan, Template};
use super::Api;

/// What one request came back as.
pub(super) enum Outcome {
    Granted,
    Rejected,
    Error(String),
}

/// A connection-level client for one API; clones share the connection.
#[derive(Clone)]
pub(super) enum Client {
    Native(TollgateClient<Channel>),
    Rls(RateLimitServiceClient<Channel>),
    Http {
        client: reqwest::Client,
        url: Arc<str>,
    },
}

/// The parts of the HTTP answer the benchmark reads.
#[derive(Deserialize)]
struct HttpAnswer {
    allowed: bool,
}

impl Client {
    async fn call(&mut self, t: &Template, key: u64) -> Outcome {
        let domain = format!("user-{key}");
        match self {
            Client::Native(c) => {
                let req = RateRequest {
                    namespace: t.namespace.clone(),
                    resource: t.resource.clone(),
                    domain,
                    hits: Some(t.hits),
                    // All or nothing, said explicitly (absent means the
                    // same): `min_hits: 0` would make every request
                    // "allowed", possibly with nothing granted.
                    min_hits: Some(t.hits),
                    ..RateRequest::default()
                };
                match c.request(req).await {
                    Ok(r) if r.get_ref().allowed => Outcome::Granted,
                    Ok(_) => Outcome::Rejected,
                    Err(s) => Outcome::Error(status_kind(&s)),
                }
            }
            Client::Rls(c) => {
                let req = RateLimitRequest {
                    domain: t.domain_name.clone(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: t.descriptor_key.clone(),
                            value: domain,
                        }],
                        ..RateLimitDescriptor::default()
                    }],
                    // Checked to fit when the run was planned.
                    hits_addend: u32::try_from(t.hits).unwrap_or(u32::MAX),
                };
                match c.should_rate_limit(req).await {
                    Ok(r) => match r.get_ref().overall_code() {
                        RlsCode::Ok => Outcome::Granted,
                        RlsCode::OverLimit => Outcome::Rejected,
                        RlsCode::Unknown => Outcome::Error("RLS overall_code UNKNOWN".into()),
                    },
                    Err(s) => Outcome::Error(status_kind(&s)),
                }
            }
            Client::Http { client, url } => {
                let body = serde_json::json!({
                    "namespace": t.namespace,
                    "resource": t.resource,
                    "domain": domain,
                    "hits": t.hits,
                    "min_hits": t.hits,
                });
                let answer = match client.post(&**url).json(&body).send().await {
                    Ok(a) => a,
                    Err(e) => return Outcome::Error(http_error_kind(&e)),
                };
                let status = answer.status();
                // 429 is how HTTP rate limiters (envoyproxy/ratelimit's
                // /json among them) say "over limit", with or without a
                // body; any other non-2xx is an error.
                if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
                    return Outcome::Rejected;
                }
                if !status.is_success() {
                    return Outcome::Error(format!("HTTP {status}"));
                }
                match answer.json::<HttpAnswer>().await {
                    Ok(a) if a.allowed => Outcome::Granted,
                    Ok(_) => Outcome::Rejected,
                    Err(e) => Outcome::Error(format!("HTTP body: {}", root_cause(&e))),
                }
            }
        }
    }
}

/// An error kind for counting: the gRPC code and message.
fn status_kind(s: &tonic::Status) -> String {
    let message = s.message();
    if message.is_empty() {
        format!("gRPC {:?}", s.code())
    } else {
        format!("gRPC {:?}: {}", s.code(), cut(message, 120))
    }
}

fn http_error_kind(e: &reqwest::Error) -> String {
    let what = if e.is_connect() {
        "connect"
    } else if e.is_timeout() {
        "timeout"
    } else {
        "transport"
    };
    format!("HTTP {what}: {}", cut(&root_cause(e), 120))
}

/// The innermost error message, which names the actual failure
/// (`Connection refused`) where the outer ones only say "error sending
/// request".
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = e;
    while let Some(next) = inner.source() {
        inner = next;
    }
    inner.to_string()
}

fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

/// Opens the connections (before the clock starts, so connection setup is
/// not measured).
pub(super) async fn connect(plan: &LoadPlan) -> Result<Vec<Client>> {
    match plan.api {
        Api::Http => {
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(plan.concurrency)
                .tcp_nodelay(true)
                .build()
                .context("cannot build the HTTP client")?;
            let url: Arc<str> = format!("http://{}/v1/request", plan.target).into();
            Ok(vec![Client::Http { client, url }])
        }
        Api::Native | Api::Rls => {
            let uri = format!("http://{}", plan.target);
            let endpoint = Endpoint::from_shared(uri.clone())
                .with_context(|| format!("--target {}: not host:port", plan.target))?
                .tcp_nodelay(true)
                .connect_timeout(plan.timeout);
            let mut clients = Vec::with_capacity(plan.connections);
            for _ in 0..plan.connections {
                // One `connect` per channel: each is its own HTTP/2
                // connection.
                let channel = endpoint
                    .connect()
                    .await
                    .map_err(|e| anyhow::anyhow!("{}", root_cause(&e)))
                    .with_context(|| format!("cannot connect to {uri}"))?;
                clients.push(match plan.api {
                    Api::Rls => Client::Rls(RateLimitServiceClient::new(channel)),
                    _ => Client::Native(TollgateClient::new(channel)),
                });
            }
            Ok(clients)
        }
    }
}

pub(super) async fn call(client: &mut Client, plan: &LoadPlan, key: u64) -> Outcome {
    match tokio::time::timeout(plan.timeout, client.call(&plan.template, key)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::Error(format!("timeout ({:?})", plan.timeout)),
    }
}
