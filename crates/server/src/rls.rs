//! Envoy's rate-limit service v3 (`ShouldRateLimit`). STUB: being written.

use std::sync::Arc;

use tollgate_proto::rls::{RateLimitRequest, RateLimitResponse};
use tollgate_store::Store;
use tonic::{Request, Response, Status};

use crate::app::App;

/// Implements `envoy.service.ratelimit.v3.RateLimitService`.
pub struct Rls<S> {
    app: Arc<App<S>>,
}

impl<S> Rls<S> {
    /// The service over `app`.
    pub fn new(app: Arc<App<S>>) -> Rls<S> {
        Rls { app }
    }
}

#[tonic::async_trait]
impl<S: Store> tollgate_proto::rls::rate_limit_service_server::RateLimitService for Rls<S> {
    async fn should_rate_limit(
        &self,
        _request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let _ = &self.app;
        Err(Status::unimplemented("not yet"))
    }
}
