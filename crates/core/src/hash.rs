//! A stable hash: 64-bit FNV-1a.
//!
//! Names of shared state must hash the same in every process of every
//! version: a limit's id (the Redis store and the gossip cluster name state
//! with it), a copy pool's Redis hash tag and transfer ids, a cluster's tag
//! on every datagram. The standard library's hasher is seeded per process,
//! so it cannot serve; FNV-1a is tiny, fixed, and spreads short names well
//! enough for these. It is not a cryptographic hash: it authenticates
//! nothing and tells apart only what no one forges.

/// The FNV-1a-64 offset basis.
const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// The FNV-1a-64 prime.
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// A running FNV-1a-64 hash, fed bytes in order.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Fnv1a(u64);

impl Fnv1a {
    /// The hash of nothing yet.
    pub const fn new() -> Fnv1a {
        Fnv1a(OFFSET)
    }

    /// The hash with `byte` fed next.
    pub const fn byte(self, byte: u8) -> Fnv1a {
        Fnv1a((self.0 ^ byte as u64).wrapping_mul(PRIME))
    }

    /// The hash with `bytes` fed next, in order.
    pub const fn bytes(self, bytes: &[u8]) -> Fnv1a {
        let mut h = self;
        let mut i = 0;
        // A loop, not an iterator: usable in `const` (a cluster's tag).
        while i < bytes.len() {
            h = h.byte(bytes[i]);
            i += 1;
        }
        h
    }

    /// The hash's value.
    pub const fn finish(self) -> u64 {
        self.0
    }
}

impl Default for Fnv1a {
    fn default() -> Fnv1a {
        Fnv1a::new()
    }
}

/// Feeds what [`std::hash::Hash`] writes into the hash, so a value can
/// be hashed the same in every process (unlike with the standard library's
/// seeded hasher). Integers are written in the machine's byte order and
/// lengths as `usize`, so the value is the same only between machines of
/// one byte order and word size: use it where a difference costs a repair,
/// never where it would lose data.
impl std::hash::Hasher for Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        *self = self.bytes(bytes);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// FNV-1a-64 of `bytes`.
pub const fn fnv1a64(bytes: &[u8]) -> u64 {
    Fnv1a::new().bytes(bytes).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_vectors() {
        // From the FNV reference: "", "a", "foobar".
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        // Fed in pieces, the same.
        assert_eq!(
            Fnv1a::new().bytes(b"foo").bytes(b"bar").finish(),
            fnv1a64(b"foobar")
        );
    }
}
