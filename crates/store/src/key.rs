//! How a store names state.
//!
//! A limit's state is keyed by *which limit* ([`LimitId`]: a fingerprint of
//! namespace, resource, role and parameters, computed by the service) and
//! *for whom* (the domain, or empty for an all-domain limit). Because the
//! parameters are part of the id, changing a limit's parameters starts it
//! fresh while limits whose parameters did not change keep their state
//! across a config reload.

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
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

impl std::hash::Hash for Scope {
    /// Hashes the name only (the representation is canonical, so this
    /// agrees with `Eq`): a short name takes the hasher's short-input path.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            Scope::Inline { len, bytes } => {
                state.write(&bytes[..usize::from(*len)]);
                state.write_u8(0xff);
            }
            Scope::Heap(s) => s.hash(state),
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

impl Key {
    /// The key of `limit` for `scope`.
    pub fn new(limit: LimitId, scope: &str) -> Key {
        Key {
            limit,
            scope: Scope::new(scope),
        }
    }

    /// For whom: a domain, or `""` for a limit shared by all domains.
    pub fn scope(&self) -> &str {
        self.scope.as_str()
    }
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
}

/// Names a copy-limited resource's pool: `namespace/resource`. Unlike
/// [`LimitId`] it does not include the limits, because holds must survive
/// a change of limits.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey(pub CompactString);

impl PoolKey {
    /// The pool of `resource` in `namespace`.
    pub fn new(namespace: &str, resource: &str) -> PoolKey {
        let mut s = CompactString::with_capacity(namespace.len() + resource.len() + 1);
        s.push_str(namespace);
        s.push('/');
        s.push_str(resource);
        PoolKey(s)
    }
}

impl fmt::Display for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
