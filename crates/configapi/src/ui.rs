//! The operators' console: a web page at `/` and `/ui` that lists the
//! namespaces and their resources (with filter and search), and lets an
//! admin create, edit and delete namespaces, resources, domain overrides
//! and groups, set namespace flags, and read a resource's history from
//! the audit trail. The page is static and holds no data, so it is served
//! without a token; its script calls the `/v1` API with the bearer token
//! the user gives it (kept in the tab's `sessionStorage`, or taken from
//! the URL fragment `#token=...`), so every read and write is checked
//! there as for any other client. It always writes under `If-Match`, so
//! a change made elsewhere meanwhile is shown as a conflict, never
//! overwritten.
//!
//! The page is one self-contained file (its style and script inline,
//! nothing fetched from elsewhere, no build step). Its
//! `Content-Security-Policy` allows exactly that file's one script and
//! one style block, by their SHA-256 digests, and nothing inline besides
//! (no `'unsafe-inline'`: an attribute or a `<script>` that data might
//! smuggle in does not run); no other origin, no frames, no plugins; the
//! script may only call this server.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::IntoResponse;
use sha2::{Digest, Sha256};

/// The page: `ui/index.html`, compiled in.
const PAGE: &str = include_str!("../ui/index.html");

/// The text between the first `<{tag}>` and the next `</{tag}>` of the
/// page: what a browser hashes for the policy.
fn inline(tag: &str) -> &'static str {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    PAGE.split_once(open.as_str())
        .and_then(|(_, rest)| rest.split_once(close.as_str()))
        .map_or("", |(text, _)| text)
}

/// Standard base64 (RFC 4648 §4, with padding), for the digests in the
/// policy.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `'sha256-...'` of `text`, as a policy source.
fn digest_source(text: &str) -> String {
    format!("'sha256-{}'", base64(&Sha256::digest(text.as_bytes())))
}

/// The page's content security policy: its own script and style block
/// (by digest) and requests to this server, nothing else.
pub fn content_security_policy() -> &'static str {
    static POLICY: OnceLock<String> = OnceLock::new();
    POLICY.get_or_init(|| {
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; \
             img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            digest_source(inline("script")),
            digest_source(inline("style")),
        )
    })
}

/// `GET /` and `GET /ui`: the page, as HTML that may not be framed.
pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, content_security_policy()),
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

    #[test]
    fn base64_is_rfc_4648() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain}");
        }
    }

    #[tokio::test]
    async fn the_page_is_html_with_a_strict_policy() {
        let r = page().await.into_response();
        let h = r.headers();
        assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
        let policy = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(!policy.contains("unsafe"), "{policy}");
        assert!(policy.starts_with("default-src 'none'; script-src 'sha256-"));
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
        // One script and one style block: the digests cover all there is.
        assert_eq!(PAGE.matches("<script").count(), 1);
        assert_eq!(PAGE.matches("<style").count(), 1);
        assert!(inline("script").len() > 1000 && inline("style").len() > 100);
        assert!(
            !PAGE.contains(" style=\""),
            "inline style attributes are refused"
        );
        assert!(!PAGE.contains("innerHTML"), "data goes in with textContent");
        assert!(!PAGE.contains("http://") && !PAGE.contains("https://"));
        assert!(PAGE.contains("id=\"revision\""));
    }
}
