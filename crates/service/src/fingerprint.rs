//! Stable identities for configured limits.
//!
//! A [`LimitId`] is the stable hash ([`tollgate_core::hash`], FNV-1a-64)
//! of the namespace, resource, role and canonical parameters: the value
//! must be the same in every process and every release, since the Redis
//! store and the replicated cluster name shared state with it.

use tollgate_core::hash::Fnv1a;
use tollgate_store::LimitId;

/// The id of a limit from its parts (joined with a separator that cannot
/// occur in them unescaped, so distinct parts never collide by
/// concatenation).
pub fn limit_id(parts: &[&str]) -> LimitId {
    let mut h = Fnv1a::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            h = h.byte(0);
        }
        h = h.bytes(part.as_bytes());
    }
    LimitId(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_separated() {
        // Known FNV-1a vector: "a" hashes to 0xaf63dc4c8601ec8c.
        assert_eq!(limit_id(&["a"]).0, 0xaf63_dc4c_8601_ec8c);
        assert_ne!(limit_id(&["ab", "c"]), limit_id(&["a", "bc"]));
    }
}
