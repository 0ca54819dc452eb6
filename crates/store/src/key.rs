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
    /// For whom: a domain, or `""` for a limit shared by all domains.
    pub scope: CompactString,
}

impl Key {
    /// The key of `limit` for `scope`.
    pub fn new(limit: LimitId, scope: &str) -> Key {
        Key {
            limit,
            scope: CompactString::from(scope),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.limit, self.scope)
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
