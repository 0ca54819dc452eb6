//! A small web page over the HTTP API: at `/` and `/ui`, it lists the
//! namespaces and their resources and lets an admin edit a resource's
//! JSON. The page is static and holds no data, so it is served without a
//! token; its script calls the `/v1` API with the bearer token the user
//! gives it (kept in the tab's `sessionStorage`, or taken from the URL
//! fragment `#token=...`), so every read and write is checked there as for
//! any other client.
//!
//! The page is self-contained (inline style and script, nothing fetched
//! from elsewhere), and its `Content-Security-Policy` allows exactly that:
//! no other origin, no frames, no plugins; the script may only call this
//! server.

use axum::http::header;
use axum::response::IntoResponse;

/// The page: `ui/index.html`, compiled in.
const PAGE: &str = include_str!("../ui/index.html");

/// The page's content security policy: inline style and script only, and
/// requests to this server only.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; connect-src 'self'";

/// `GET /` and `GET /ui`: the page, as HTML that may not be framed.
pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        PAGE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_page_is_html_with_a_strict_policy() {
        let r = page().await.into_response();
        let h = r.headers();
        assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(
            h[header::CONTENT_SECURITY_POLICY],
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'"
        );
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
        assert!(PAGE.contains("id=\"revision\""));
        assert!(!PAGE.contains("innerHTML"), "data goes in with textContent");
        assert!(!PAGE.contains("http://") && !PAGE.contains("https://"));
    }
}
