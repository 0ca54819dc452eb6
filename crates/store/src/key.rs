//! How a store names state.
//!
//! A limit's state is keyed by *which limit* ([`LimitId`]: a fingerprint of
//! namespace, resource, role and parameters, computed by the service) and
//! *for whom* (the domain, or empty for an all-domain limit). Because the
//! parameters are part of the id, changing a limit's parameters starts it
//! fresh while limits whose parameters did not change keep their state
//! across a config reload.
//!
//! A scope is client input (a domain, or Envoy descriptor values), so its
//! size is bounded where it is stored: a scope longer than
//! [`MAX_SCOPE_BYTES`] is kept as a digest of it (SHA-256, 128 bits, in
//! hex behind `#`), in every store alike. Two long scopes share state only
//! if their digests collide, which no one can arrange; every key costs at
//! most a few dozen bytes whatever a client sends.

use std::fmt;

use compact_str::CompactString;

/// Identifies one configured limit: namespace, resource, role, parameters.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitId(pub u64);

impl fmt::Display for LimitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The key of one limit's state for one domain.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    /// Which limit.
    pub limit: LimitId,
    scope: Scope,
}

/// Longest scope kept inline in a [`Key`].
const INLINE: usize = 22;

/// A domain name, inline when short. The representation is canonical (a
/// short name is always inline, zero-padded), so equality and hashing can
/// work on it directly: comparing two short names is a few word compares
/// rather than a call into `memcmp`, which matters on the hot path of every
/// decision (`docs/benchmarks.md`).
#[derive(Clone, PartialEq, Eq)]
enum Scope {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

impl Scope {
    fn new(s: &str) -> Scope {
        if s.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..s.len()].copy_from_slice(s.as_bytes());
            Scope::Inline {
                len: s.len() as u8,
                bytes,
            }
        } else {
            Scope::Heap(s.into())
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Built from a `&str` cut at its length: always valid UTF-8.
            Scope::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Scope::Heap(s) => s,
        }
    }
}

impl std::hash::Hash for Key {
    /// A key with a short scope (nearly all of them) is hashed as two
    /// 128-bit words: the limit id and the scope's canonical inline bytes
    /// with its length. foldhash takes each in one folded multiply, where
    /// hashing the id and the name's bytes separately took its
    /// variable-length path and three times the instructions, on the path
    /// of every decision (`docs/benchmarks.md`). The inline form is
    /// canonical and zero-padded, so equal keys hash equally.
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match &self.scope {
            Scope::Inline { len, bytes } => {
                let mut words = [0u8; 24];
                words[..INLINE].copy_from_slice(bytes);
                words[23] = *len;
                let word = |i: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&words[i * 8..i * 8 + 8]);
                    u128::from(u64::from_le_bytes(w))
                };
                state.write_u128(u128::from(self.limit.0) | word(0) << 64);
                state.write_u128(word(1) | word(2) << 64);
            }
            Scope::Heap(name) => {
                state.write_u64(self.limit.0);
                name.hash(state);
            }
        }
    }
}

impl PartialOrd for Scope {
    fn partial_cmp(&self, other: &Scope) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scope {
    /// String order, whatever the representation.
    fn cmp(&self, other: &Scope) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Longest scope a key keeps as it is; a longer one is kept as a digest.
pub const MAX_SCOPE_BYTES: usize = 128;

impl Key {
    /// The key of `limit` for `scope` (a digest of it, when it is longer
    /// than [`MAX_SCOPE_BYTES`]).
    pub fn new(limit: LimitId, scope: &str) -> Key {
        let scope = if scope.len() > MAX_SCOPE_BYTES {
            Scope::Heap(digest(scope).into_boxed_str())
        } else {
            Scope::new(scope)
        };
        Key { limit, scope }
    }

    /// For whom: a domain, or `""` for a limit shared by all domains (a
    /// digest of a long one).
    pub fn scope(&self) -> &str {
        self.scope.as_str()
    }
}

/// `#` and the first 128 bits of `scope`'s SHA-256, in hex: 33 bytes.
fn digest(scope: &str) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;
    let hash = Sha256::digest(scope.as_bytes());
    let mut out = String::with_capacity(33);
    out.push('#');
    for b in &hash[..16] {
        let _ = write!(out, "{b:02x}");
    }
    out
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.limit, self.scope())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_scopes_round_trip_and_order_as_strings() {
        let long = "a".repeat(INLINE + 1);
        for s in ["", "acme", "exactly-twenty-two-b!!", long.as_str(), "é∂"] {
            assert_eq!(Key::new(LimitId(1), s).scope(), s);
        }
        assert_eq!(Key::new(LimitId(1), "acme"), Key::new(LimitId(1), "acme"));
        assert_ne!(Key::new(LimitId(1), "acme"), Key::new(LimitId(1), "acm"));
        assert!(Key::new(LimitId(1), &long) > Key::new(LimitId(1), "a"));
        assert!(Key::new(LimitId(1), "b") > Key::new(LimitId(1), &long));
    }

    #[test]
    fn a_scope_over_the_limit_is_kept_as_a_short_digest_that_tells_scopes_apart() {
        let at = "x".repeat(MAX_SCOPE_BYTES);
        assert_eq!(
            Key::new(LimitId(1), &at).scope(),
            at,
            "up to the limit: as is"
        );
        let over = "x".repeat(MAX_SCOPE_BYTES + 1);
        let huge = "x".repeat(64 * 1024);
        let k = Key::new(LimitId(1), &over);
        assert_eq!(k.scope().len(), 33);
        assert!(k.scope().starts_with('#'));
        assert_eq!(
            k,
            Key::new(LimitId(1), &over),
            "the same scope, the same key"
        );
        assert_ne!(k, Key::new(LimitId(1), &huge));
        assert_eq!(Key::new(LimitId(1), &huge).scope().len(), 33);
    }
}

/// Names a copy-limited resource's pool: `namespace/resource`. Unlike
/// [`LimitId`] it does not include the limits, because holds must survive
/// a change of limits.
///
/// Names may contain `/` (a config may name a resource `b/db`), so each
/// part is escaped before they are joined: `%` as `%25`, `/` as `%2F`.
/// Namespace `a` with resource `b/db` is `a/b%2Fdb`, namespace `a/b` with
/// resource `db` is `a%2Fb/db`: two names, two pools. A name without `/`
/// or `%` (nearly all of them) reads as written, which keeps metric labels
/// and store keys readable, and [`PoolKey::parts`] gives the names back.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey(pub CompactString);

impl PoolKey {
    /// The pool of `resource` in `namespace`.
    pub fn new(namespace: &str, resource: &str) -> PoolKey {
        let mut s = CompactString::with_capacity(namespace.len() + resource.len() + 1);
        escape_into(&mut s, namespace);
        s.push('/');
        escape_into(&mut s, resource);
        PoolKey(s)
    }

    /// The namespace and the resource, unescaped. A key not made by
    /// [`PoolKey::new`] (no separator) reads as a namespace with an empty
    /// resource.
    pub fn parts(&self) -> (String, String) {
        match self.0.split_once('/') {
            Some((namespace, resource)) => (unescape(namespace), unescape(resource)),
            None => (unescape(&self.0), String::new()),
        }
    }
}

fn escape_into(out: &mut CompactString, name: &str) {
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
}

/// Undoes [`escape_into`]; any other `%` is kept as it is.
fn unescape(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("%25") {
            out.push('%');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("%2F") {
            out.push('/');
            rest = after;
        } else {
            out.push('%');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

impl fmt::Display for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod pool_tests {
    use super::*;

    /// Regression (issue 16, item 11): `a` + `b/db` and `a/b` + `db` were
    /// both `a/b/db`, one pool counting the holds of two resources.
    #[test]
    fn names_with_slashes_make_distinct_pools_and_come_back_whole() {
        let one = PoolKey::new("a", "b/db");
        let two = PoolKey::new("a/b", "db");
        assert_ne!(one, two);
        assert_eq!(one.parts(), ("a".to_owned(), "b/db".to_owned()));
        assert_eq!(two.parts(), ("a/b".to_owned(), "db".to_owned()));
        // Escapes themselves are escaped: `%2F` written in a name is not a
        // slash.
        let three = PoolKey::new("a%2Fb", "db");
        assert_ne!(three, two);
        assert_eq!(three.parts(), ("a%2Fb".to_owned(), "db".to_owned()));
        // Plain names read as written.
        assert_eq!(PoolKey::new("ns", "sandbox").to_string(), "ns/sandbox");
        for (ns, r) in [("", ""), ("%", "/"), ("x%y", "%25/%2F"), ("é/∂", "a b")] {
            assert_eq!(PoolKey::new(ns, r).parts(), (ns.to_owned(), r.to_owned()));
        }
    }
}
