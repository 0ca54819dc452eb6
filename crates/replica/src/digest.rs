//! Anti-entropy digests: a short summary of a replica's *settled* state,
//! so two nodes that agree learn it from one small datagram, and two that
//! differ exchange only the keys of the buckets that differ.
//!
//! Keys fall into [`BUCKETS`] buckets by a stable hash of the key. A
//! bucket's hash is the XOR of its keys' hashes, each taken over the key
//! and its settled view ([`crate::Replica::digest`]): a queue's elements
//! born at least the settle time before the digest's time `at` and not
//! about to be pruned, a counter's whole state. Elements still in flight
//! are left out, so two nodes that both received everything sent more
//! than a settle time ago agree, whatever is on its way. Epoch reports are
//! left out: each epoch's report supersedes the last within seconds.
//!
//! The hash is FNV-1a over what [`std::hash::Hash`] writes: stable between
//! processes of one byte order and word size. Between machines that differ
//! there, every bucket differs and anti-entropy repairs more than it needs
//! to, which costs bytes and loses nothing.

use std::hash::{Hash, Hasher};

use tollgate_core::hash::Fnv1a;
use tollgate_store::Key;

/// Buckets a digest has.
pub const BUCKETS: usize = 64;

/// A set of buckets, bit `b` for bucket `b`.
pub type Buckets = u64;

/// A replica's digest; see the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digest {
    hashes: [u64; BUCKETS],
}

impl Default for Digest {
    fn default() -> Digest {
        Digest {
            hashes: [0; BUCKETS],
        }
    }
}

impl Digest {
    /// Adds a key whose settled view hashes to `state`.
    pub fn add(&mut self, key: &Key, state: u64) {
        let h = key_hash(key).bytes(&state.to_le_bytes()).finish();
        // Never zero, so a bucket of one key never looks empty.
        self.hashes[bucket_of(key)] ^= h | 1;
    }

    /// The buckets where `self` and `other` differ.
    pub fn differs(&self, other: &Digest) -> Buckets {
        let mut mask = 0;
        for (b, (x, y)) in self.hashes.iter().zip(other.hashes.iter()).enumerate() {
            if x != y {
                mask |= 1 << b;
            }
        }
        mask
    }

    /// The non-empty buckets and their hashes, as the wire carries them.
    pub fn entries(&self) -> impl Iterator<Item = (u8, u64)> + '_ {
        self.hashes
            .iter()
            .enumerate()
            .filter(|(_, h)| **h != 0)
            .map(|(b, h)| (b as u8, *h))
    }

    /// A digest from its non-empty buckets; `None` for a bucket number out
    /// of range.
    pub fn from_entries(entries: impl IntoIterator<Item = (u8, u64)>) -> Option<Digest> {
        let mut d = Digest::default();
        for (b, h) in entries {
            *d.hashes.get_mut(usize::from(b))? = h;
        }
        Some(d)
    }
}

/// The bucket of `key`.
pub fn bucket_of(key: &Key) -> usize {
    (key_hash(key).finish() % BUCKETS as u64) as usize
}

/// A key's stable hash: its limit's id and its domain, as bytes.
fn key_hash(key: &Key) -> Fnv1a {
    Fnv1a::new()
        .bytes(&key.limit.0.to_le_bytes())
        .bytes(key.scope().as_bytes())
}

/// The stable hash of a value's [`Hash`] writes (see the module docs).
pub fn stable_hash(value: &impl Hash) -> u64 {
    let mut h = Fnv1a::new();
    value.hash(&mut h);
    Hasher::finish(&h)
}
