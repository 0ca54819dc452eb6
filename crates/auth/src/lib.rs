//! tollgate's credentials: bearer tokens with two roles, and URLs shown
//! without their password.
//!
//! Tokens come from a file or the environment, are kept only as SHA-256
//! digests, and are never logged; the audit trail (config API) and the
//! logs name a token by the name it was given. The config API and the
//! limiting server's admin endpoints read the same format, which is why it
//! is a crate of its own: the config API needs it without the server.
//!
//! One token per line: `ROLE:NAME:TOKEN`, where ROLE is `admin` (reads and
//! writes) or `read` (reads only). Blank lines and lines starting with `#`
//! are skipped. A refused line is a [`TokensError`] naming the line, never
//! the token.
//!
//! What is not here: HTTP. [`bearer`] takes the header's text, and each
//! surface answers a missing or unknown token in its own error shape.

#![deny(missing_docs)]

use sha2::{Digest, Sha256};

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Reads: the config, deltas, the audit trail.
    Read,
    /// Reads and writes.
    Admin,
}

/// Who made a request: the token's name and role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The token's name, recorded in the audit trail.
    pub name: String,
    /// What it may do.
    pub role: Role,
}

/// The known tokens, as digests.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Vec<([u8; 32], Caller)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|(_, c)| c.name.as_str()).collect();
        f.debug_struct("Tokens").field("names", &names).finish()
    }
}

/// The token of an `Authorization` header value in the `Bearer` scheme,
/// trimmed; `None` for another scheme or no token. The scheme is matched
/// case-insensitively (RFC 9110 §11.1: `bearer`, `BEARER` are the same).
/// Shared by the limiting server's admin endpoints and the config API.
pub fn bearer(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim_start().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

/// `url` with the user and password (if any) replaced by `***`, for logs
/// and errors: the Redis store's URL, the config API's database and the
/// API a server follows are shown this way.
///
/// Everything between the scheme and the last `@` is hidden, wherever
/// that `@` is: a password may hold any character, and one that is not
/// percent-encoded (`/`, `?`, `#`, `@`) ends the URL parser's authority
/// early, so no parser can be asked where the credentials end; but they
/// always end at an `@`, and nothing after the last one can be part of
/// them. An `@` in a path, query or fragment hides more than the
/// credentials (the host too), never less. Without `://` (a mistyped
/// URL), everything before the last `@` is hidden.
///
/// A password may also come in the query (`postgres://u@h/db?password=`,
/// which sqlx reads; `redis+unix:///s?pass=`, which redis-rs reads): the
/// value of every query parameter whose name holds `pass`, `pwd`,
/// `secret` or `token` (any case) is hidden too, up to the next `&` (a
/// `#` or `@` in it included), as is the rest of one whose value holds
/// the last `@` (second review of issue 18: such a value was shown).
pub fn redact(url: &str) -> String {
    let (head, rest) = match url.rfind('@') {
        None => return hide_query_secrets(url, false),
        Some(at) => match url.find("://") {
            Some(scheme_end) if scheme_end < at => (
                format!("{}://***@", &url[..scheme_end]),
                (&url[scheme_end + 3..at], &url[at + 1..]),
            ),
            _ => ("***@".to_owned(), (&url[..at], &url[at + 1..])),
        },
    };
    let (hidden, shown) = rest;
    // A secret parameter whose value the last `@` cuts: the part after
    // it is still that value, up to the next `&`.
    head + &hide_query_secrets(shown, secret_runs_on(hidden))
}

/// Whether a name of a query parameter says its value is a secret.
fn is_secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "pwd", "secret", "token"]
        .iter()
        .any(|w| name.contains(w))
}

/// Whether `text` ends inside the value of a secret query parameter (one
/// after a `?` or `&`, with no `&` after its `=`).
fn secret_runs_on(text: &str) -> bool {
    let Some(q) = text.find('?') else {
        return false;
    };
    let last = text[q + 1..].rsplit('&').next().unwrap_or_default();
    last.split_once('=')
        .is_some_and(|(name, _)| is_secret_name(name))
}

/// `text` (the part of a URL after its credentials) with the values of
/// its secret query parameters replaced by `***`; with `cut`, its start
/// up to the first `&` too (the rest of a secret value).
fn hide_query_secrets(text: &str, cut: bool) -> String {
    let (lead, text) = if cut {
        match text.find('&') {
            Some(i) => ("***", &text[i..]),
            None => return "***".to_owned(),
        }
    } else {
        ("", text)
    };
    let Some(q) = text.find('?') else {
        return format!("{lead}{text}");
    };
    let params: Vec<String> = text[q + 1..]
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((name, _)) if is_secret_name(name) => format!("{name}=***"),
            _ => p.to_owned(),
        })
        .collect();
    format!("{lead}{}?{}", &text[..q], params.join("&"))
}

/// The longest first field an error message repeats as a mistyped role:
/// half the minimum token length, so no valid token is ever echoed.
pub const ROLE_ECHO_MAX: usize = 8;

/// A tokens file refused: the line (1-based) and what is wrong with it.
/// No variant holds the token, nor a field that could be it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokensError {
    /// Fewer than three `:`-separated fields.
    #[error("line {line}: expected ROLE:NAME:TOKEN")]
    NotRoleNameToken {
        /// The line.
        line: usize,
    },
    /// A first field that looks like a mistyped role (a few letters).
    #[error("line {line}: role {role:?} is neither `admin` nor `read` (expected ROLE:NAME:TOKEN)")]
    UnknownRole {
        /// The line.
        line: usize,
        /// The field, at most [`ROLE_ECHO_MAX`] ASCII letters.
        role: String,
    },
    /// A first field that is no role at all (it may be the token).
    #[error(
        "line {line}: the first field is not a role (`admin` or `read`): expected ROLE:NAME:TOKEN"
    )]
    NotARole {
        /// The line.
        line: usize,
    },
    /// An empty second field.
    #[error("line {line}: the token has no name")]
    NoName {
        /// The line.
        line: usize,
    },
    /// A token under 16 characters.
    #[error("line {line}: the token (the third field) is shorter than 16 characters")]
    TooShort {
        /// The line.
        line: usize,
    },
    /// A name an earlier line already gave.
    #[error("line {line}: the token name (the second field) is used twice (also on line {first})")]
    NameTwice {
        /// The line.
        line: usize,
        /// The line that used it first.
        first: usize,
    },
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Parses `ROLE:NAME:TOKEN` lines; an error names the line (never the
    /// token).
    pub fn parse(text: &str) -> Result<Tokens, TokensError> {
        let mut entries = Vec::new();
        let mut lines_of_names: Vec<(&str, usize)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.splitn(3, ':');
            let (Some(role), Some(name), Some(token)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(TokensError::NotRoleNameToken { line: i + 1 });
            };
            let role = match role.trim() {
                "admin" => Role::Admin,
                "read" => Role::Read,
                // The role is named only when it looks like one: at most
                // `ROLE_ECHO_MAX` ASCII letters, far below the shortest
                // token (16), so a line written in the wrong order
                // (`TOKEN:admin:alice`) never prints its token; a field
                // with digits or other characters no role has is not named.
                other
                    if (1..=ROLE_ECHO_MAX).contains(&other.len())
                        && other.chars().all(|c| c.is_ascii_alphabetic()) =>
                {
                    return Err(TokensError::UnknownRole {
                        line: i + 1,
                        role: other.to_owned(),
                    })
                }
                _ => return Err(TokensError::NotARole { line: i + 1 }),
            };
            let name = name.trim();
            let token = token.trim();
            if name.is_empty() {
                return Err(TokensError::NoName { line: i + 1 });
            }
            // Neither the name nor the token is printed: in a line written
            // in the wrong order (`admin:TOKEN:short`) the name is the secret.
            if token.len() < 16 {
                return Err(TokensError::TooShort { line: i + 1 });
            }
            if let Some(first) = lines_of_names
                .iter()
                .find(|(n, _): &&(&str, usize)| *n == name)
            {
                return Err(TokensError::NameTwice {
                    line: i + 1,
                    first: first.1,
                });
            }
            lines_of_names.push((name, i + 1));
            entries.push((
                digest(token),
                Caller {
                    name: name.to_owned(),
                    role,
                },
            ));
        }
        Ok(Tokens { entries })
    }

    /// Whether no token is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller a bearer token belongs to. Every entry is compared, in
    /// constant time per entry, so the time taken says nothing of which
    /// digest bytes matched.
    pub fn check(&self, token: &str) -> Option<Caller> {
        let d = digest(token);
        let mut found = None;
        for (known, caller) in &self.entries {
            let diff = known
                .iter()
                .zip(d.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 {
                found = Some(caller.clone());
            }
        }
        found
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1/0"), "redis://h:1/0");
        // A password with a `/` in it (base64), which a URL parser takes
        // for the start of the path.
        assert_eq!(redact("https://fleet:ab/cd@h:1/v"), "https://***@h:1/v");
        assert_eq!(redact("https://fleet:12/x@h"), "https://***@h");
    }

    /// Regression (review of issue 18, finding 3): a password with an
    /// unescaped `?` or `#` was printed whole (the `@` was looked for only
    /// before the first `?` or `#`).
    #[test]
    fn hostile_passwords_never_show() {
        for hostile in [
            "?",
            "#",
            "@",
            "/",
            "?#@/",
            "??@@##",
            ":",
            " ",
            "%3F",
            "://",
            "@b:c/d?e#f",
        ] {
            // Marked, so that the check below is not fooled by a `?` or
            // `/` of the rest of the URL; the hostile part on both sides.
            let password = format!("{hostile}s3cr3t{hostile}");
            let password = password.as_str();
            for url in [
                format!("redis://:{password}@127.0.0.1:6379/0"),
                format!("rediss://user:{password}@h:1"),
                format!("redis-sentinel://:{password}@a:1,b:2/mymaster/2"),
                format!("redis-cluster://:{password}@a:1,:{password}@b:2"),
                format!("postgres://u:{password}@db/x?sslmode=require"),
                format!("redis:/:{password}@h:1"),
                format!(":{password}@h:1"),
            ] {
                let shown = redact(&url);
                assert!(!shown.contains("s3cr3t"), "{url} shown as {shown}");
                assert!(shown.contains("***@"), "{url} shown as {shown}");
            }
        }
        // The host and the rest still show.
        assert_eq!(
            redact("redis-sentinel://:pa?ss@127.0.0.1:1/m"),
            "redis-sentinel://***@127.0.0.1:1/m"
        );
        assert_eq!(redact("redis://:pa#ss@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis:/:pw@h:1"), "***@h:1");
        // No `@`, nothing hidden.
        assert_eq!(
            redact("redis-sentinel://a:1,b:2/m?x#y"),
            "redis-sentinel://a:1,b:2/m?x#y"
        );
    }

    /// Regression (second review of issue 18): a password given in the
    /// query, which sqlx (`?password=`) and redis-rs (`?pass=` of a
    /// `redis+unix://` URL, which `--store` refuses, naming it) read, was
    /// shown whole: the rule looked for credentials before an `@` only.
    #[test]
    fn passwords_in_the_query_never_show() {
        for hostile in ["", "@", "#", "/", "?", "@b?c#d", "=", "%40"] {
            let password = format!("{hostile}s3cr3t{hostile}");
            for url in [
                format!("postgres://u@db/x?password={password}"),
                format!("postgres://u@db/x?sslmode=require&password={password}&x=1"),
                format!("postgres://db/x?PassWord={password}"),
                format!("postgres://u:{password}@db/x?sslpassword={password}"),
                format!("redis+unix:///tmp/r.sock?db=1&pass={password}"),
                format!("unix:///tmp/r.sock?pass={password}"),
                format!("https://h/api?token={password}"),
            ] {
                let shown = redact(&url);
                assert!(!shown.contains("s3cr3t"), "{url} shown as {shown}");
                assert!(shown.contains("***"), "{url} shown as {shown}");
            }
        }
        // The rest still shows.
        assert_eq!(
            redact("postgres://u@db/x?sslmode=require&password=pw&x=1"),
            "postgres://***@db/x?sslmode=require&password=***&x=1"
        );
        assert_eq!(
            redact("redis+unix:///tmp/r.sock?pass=pw"),
            "redis+unix:///tmp/r.sock?pass=***"
        );
        assert_eq!(
            redact("postgres://u@db/x?password=p@ss&x=1"),
            "postgres://***@***&x=1"
        );
        assert_eq!(redact("redis://h:1/0?db=2"), "redis://h:1/0?db=2");
    }

    #[test]
    fn parses_roles_and_checks_tokens() {
        let t = Tokens::parse(
            "# ops\nadmin:alice:0123456789abcdef0123\n\nread:fleet:fedcba9876543210fedc\n",
        )
        .unwrap();
        assert_eq!(t.check("0123456789abcdef0123").unwrap().role, Role::Admin);
        let fleet = t.check("fedcba9876543210fedc").unwrap();
        assert_eq!((fleet.name.as_str(), fleet.role), ("fleet", Role::Read));
        assert!(t.check("0123456789abcdef012").is_none());
        assert!(t.check("").is_none());
        assert!(!format!("{t:?}").contains("0123"), "tokens never printed");
    }

    #[test]
    fn bad_lines_are_named_without_the_token() {
        let e = Tokens::parse("owner:bob:0123456789abcdef0123")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 1") && e.contains("owner") && !e.contains("0123"),
            "{e}"
        );
        assert!(Tokens::parse("admin:bob:short")
            .unwrap_err()
            .to_string()
            .contains("16"));
        assert!(Tokens::parse("admin:bob")
            .unwrap_err()
            .to_string()
            .contains("ROLE:NAME:TOKEN"));
        let twice = "admin:a:0123456789abcdef0123\nread:a:fedcba9876543210fedc";
        assert!(Tokens::parse(twice)
            .unwrap_err()
            .to_string()
            .contains("twice"));
    }

    /// Second review of issue 22 (LOW): the scheme was matched as
    /// `Bearer ` only; RFC 9110 §11.1 makes it case-insensitive.
    #[test]
    fn the_bearer_scheme_is_matched_in_any_case() {
        for h in ["Bearer abc", "bearer abc", "BEARER abc", "bEaReR   abc  "] {
            assert_eq!(bearer(h), Some("abc"), "{h}");
        }
        for h in [
            "Basic abc",
            "Bearerabc",
            "Bearer",
            "Bearer ",
            "Token abc",
            "",
        ] {
            assert_eq!(bearer(h), None, "{h}");
        }
    }

    /// Second review of issue 22 (LOW): a line written in the wrong order
    /// printed its secret, as the role (`SECRET:admin:alice`) or as the
    /// name (`admin:SECRET:short`, or a secret name used twice).
    #[test]
    fn misordered_lines_are_named_without_echoing_the_secret() {
        const SECRET: &str = "s3cr3tT0kenValue42";
        for (text, line, what) in [
            (format!("{SECRET}:admin:alice"), "line 1", "not a role"),
            (
                format!("# x\nadmin:{SECRET}:short"),
                "line 2",
                "shorter than 16",
            ),
            (
                format!("admin:{SECRET}:0123456789abcdef0123\nread:{SECRET}:fedcba9876543210fedc"),
                "line 2",
                "used twice (also on line 1)",
            ),
            (
                format!("a{SECRET}:alice:0123456789abcdef0123"),
                "line 1",
                "not a role",
            ),
        ] {
            let e = Tokens::parse(&text).unwrap_err().to_string();
            assert!(e.contains(line) && e.contains(what), "{e}");
            assert!(!e.contains("s3cr3t"), "the secret echoed: {e}");
        }
        // Regression: a valid token of exactly 16 letters put first was
        // echoed as a mistyped role (the guard allowed up to 16 letters).
        const LETTERS: &str = "abcdefghijklmnop";
        for text in [
            format!("{LETTERS}:admin:alice"),
            format!("{}:admin:alice", &LETTERS[..9]),
        ] {
            let e = Tokens::parse(&text).unwrap_err().to_string();
            assert!(e.contains("line 1") && e.contains("not a role"), "{e}");
            assert!(!e.contains("abcdefghi"), "the secret echoed: {e}");
        }
        // A short mistyped role is still named, to help the operator.
        let e = Tokens::parse("admn:alice:0123456789abcdef0123")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"admn\""), "{e}");
    }
}
