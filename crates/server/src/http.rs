//! The HTTP/JSON API and admin endpoints. STUB: being written.

use std::sync::Arc;

use tollgate_store::Store;

use crate::app::App;

/// The HTTP router over `app`; bodies larger than `max_body` are refused.
pub fn router<S: Store>(app: Arc<App<S>>, max_body: usize) -> axum::Router {
    let _ = (app, max_body);
    axum::Router::new()
}
