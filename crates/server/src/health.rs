//! gRPC health checking (`grpc.health.v1.Health`, Check and Watch) on the
//! gRPC port, answering by the rule `/readyz` answers by
//! ([`App::readiness`]): `SERVING` while ready, `NOT_SERVING` while the
//! store cannot decide and from the moment shutdown begins.
//!
//! Three names are known: `""` (the whole server), the native API
//! (`tollgate.v1.Tollgate`) and Envoy's rate-limit service
//! (`envoy.service.ratelimit.v3.RateLimitService`); all three follow the
//! one readiness, since both APIs decide through the same store. Check of
//! any other name fails with `NOT_FOUND`; Watch of one answers
//! `SERVICE_UNKNOWN` and stays open, as the protocol says.
//!
//! **Why not `tonic-health`'s `HealthReporter` and its service:** its
//! Watch streams never end, so a client watching (gRPC's client-side
//! health checking does) would hold a graceful shutdown up for the whole
//! grace period; and it answers a Watch of an unknown name with
//! `NOT_FOUND`, where the protocol wants `SERVICE_UNKNOWN`. Here a Watch
//! sends `NOT_SERVING` when shutdown begins and then ends, and the
//! statuses are a pure function of the readiness ([`status`]), so the
//! protocol's rules are tested without a server. The generated types and
//! the service's descriptor are still `tonic-health`'s.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use tollgate_proto::rls::rate_limit_service_server;
use tollgate_proto::v1::tollgate_server;
use tollgate_store::Store;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{self, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::app::{App, Readiness};

/// The service names health answers for: the whole server, the native
/// API and Envoy's rate-limit service.
pub const SERVICES: [&str; 3] = [
    "",
    tollgate_server::SERVICE_NAME,
    rate_limit_service_server::SERVICE_NAME,
];

/// The status of `service` when the server's readiness is `readiness`:
/// `None` for a name the server does not serve.
pub fn status(service: &str, readiness: Readiness) -> Option<ServingStatus> {
    if !SERVICES.contains(&service) {
        return None;
    }
    Some(if readiness.is_ready() {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    })
}

/// The `grpc.health.v1.Health` service of `app`, taking messages of at
/// most `max_message_bytes`.
///
/// `stopped` turns true when the server stops accepting connections (the
/// end of the shutdown delay): a Watch ends then, not when shutdown
/// begins, so a client that watches again at once is not answered by a
/// loop of calls that end as they start while the port still accepts.
pub fn service<S: Store>(
    app: Arc<App<S>>,
    stopped: tokio::sync::watch::Receiver<bool>,
    max_message_bytes: usize,
) -> HealthServer<Health<S>> {
    HealthServer::new(Health { app, stopped }).max_decoding_message_size(max_message_bytes)
}

/// Answers health checks from the app's readiness.
pub struct Health<S> {
    app: Arc<App<S>>,
    stopped: tokio::sync::watch::Receiver<bool>,
}

/// At most [`SHOWN_BYTES`] of a name a client sent, for an error
/// message: it travels in a header, which a long name would bloat.
fn shown(name: &str) -> String {
    if name.len() <= SHOWN_BYTES {
        return name.to_owned();
    }
    let mut end = SHOWN_BYTES;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &name[..end], name.len())
}

/// How much of an unknown name an error repeats.
const SHOWN_BYTES: usize = 128;

fn answer(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status.into(),
    }
}

/// A Watch's answers.
type Answers = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<S: Store> health_server::Health for Health<S> {
    /// Reads the readiness now, as `/readyz` does, rather than the last
    /// one published to watchers.
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = &request.get_ref().service;
        match status(service, self.app.readiness()) {
            Some(s) => Ok(Response::new(answer(s))),
            None => Err(Status::not_found(format!(
                "no service {:?} here: this server answers for {SERVICES:?}",
                shown(service)
            ))),
        }
    }

    type WatchStream = Answers;

    /// Sends the status now and at every change; when shutdown begins,
    /// sends `NOT_SERVING`, and ends when the server stops accepting
    /// connections (after the shutdown delay), so a watcher never holds a
    /// graceful shutdown up.
    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Answers>, Status> {
        let service = request.into_inner().service;
        let readiness = self.app.watch_readiness();
        let stopped = self.stopped.clone();
        let answers = futures_util::stream::unfold(
            Some((readiness, stopped, None)),
            move |state: Option<(_, tokio::sync::watch::Receiver<bool>, Option<ServingStatus>)>| {
                let service = service.clone();
                async move {
                    let (mut readiness, mut stopped, sent) = state?;
                    loop {
                        let now = *readiness.borrow_and_update();
                        let status = status(&service, now).unwrap_or(ServingStatus::ServiceUnknown);
                        if sent != Some(status) {
                            return Some((
                                Ok(answer(status)),
                                Some((readiness, stopped, Some(status))),
                            ));
                        }
                        if now == Readiness::Stopping {
                            // Said; the call ends with the listeners (an
                            // error means the server is gone: end too).
                            let _ = stopped.wait_for(|s| *s).await;
                            return None;
                        }
                        if readiness.changed().await.is_err() {
                            // Gone with the app.
                            return None;
                        }
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(answers)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_names_follow_readiness_and_others_are_unknown() {
        for name in SERVICES {
            assert_eq!(status(name, Readiness::Ready), Some(ServingStatus::Serving));
            assert_eq!(
                status(name, Readiness::StoreUnavailable),
                Some(ServingStatus::NotServing)
            );
            assert_eq!(
                status(name, Readiness::Stopping),
                Some(ServingStatus::NotServing)
            );
        }
        assert_eq!(SERVICES[1], "tollgate.v1.Tollgate");
        assert_eq!(SERVICES[2], "envoy.service.ratelimit.v3.RateLimitService");
        for unknown in [
            "tollgate.v1",
            "grpc.health.v1.Health",
            " ",
            "TOLLGATE.V1.TOLLGATE",
        ] {
            assert_eq!(status(unknown, Readiness::Ready), None, "{unknown:?}");
        }
    }

    #[test]
    fn an_unknown_name_is_repeated_short() {
        assert_eq!(shown("a.B"), "a.B");
        let long = "é".repeat(1000);
        let s = shown(&long);
        assert!(s.len() < 150, "{s}");
        assert!(s.ends_with("... (2000 bytes)"), "{s}");
    }
}
