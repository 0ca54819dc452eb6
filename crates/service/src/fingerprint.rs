//! Stable identities for configured limits.
//!
//! A [`LimitId`] is a 64-bit FNV-1a hash of the namespace, resource, role
//! and canonical parameters. FNV is chosen over the std hasher because the
//! value must be the same in every process and every release: the Redis
//! store and the replicated cluster name shared state with it.

use tollgate_store::LimitId;

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// The id of a limit from its parts (joined with a separator that cannot
/// occur in them unescaped, so distinct parts never collide by
/// concatenation).
pub fn limit_id(parts: &[&str]) -> LimitId {
    let mut h = OFFSET;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            h = step(h, 0);
        }
        for b in part.bytes() {
            h = step(h, b);
        }
    }
    LimitId(h)
}

fn step(h: u64, b: u8) -> u64 {
    (h ^ u64::from(b)).wrapping_mul(PRIME)
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
