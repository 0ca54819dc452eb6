//! The gossip wire format: datagrams as bytes, and bytes back into
//! datagrams, encrypted and authenticated under the cluster's secret.
//!
//! Pure and sans-IO: this module turns a [`Header`] and a [`Body`] into at
//! most [`MAX_DATAGRAM`] bytes and back, and guards against replays
//! ([`ReplayGuard`]). It reads no clock (the sender's time comes in the
//! header), opens no socket and keeps no state of the cluster; the node
//! decides what to send and the runtime sends it.
//!
//! # Design
//!
//! Every datagram is sealed with XChaCha20-Poly1305 (an AEAD) under a key
//! derived from the cluster's secret and name. The [`Header`] travels in
//! the clear, authenticated as the AEAD's associated data: the receiver
//! needs its cluster tag to tell a neighbouring cluster from a forger,
//! its sender, incarnation and sequence number for the replay window, and
//! its *recipient* (node id and incarnation) to refuse a datagram recorded
//! on its way to another member, or to an earlier life of this one. The
//! message kind and the body (limit ids, domains, which are often user
//! ids, node ids, counts and times) are the ciphertext, so someone on the
//! network path without the secret learns only who talks to whom, when,
//! and how much.
//!
//! # Recipients
//!
//! Every datagram names the node it is for, `to` and `to_incarnation`,
//! inside the authenticated data: a datagram captured on its way from A to
//! B and played to C, or to B after B restarted, is refused there
//! (`misaddressed`), so a pull answer cannot be reflected to a spoofed
//! source through another member, and a full state cannot make a joining
//! node believe it is synced. The one exception is a membership announce
//! to a seed whose identity the sender does not know yet: it goes to
//! *anyone* at the seed's address (`to = 0`, `to_incarnation = 0`), and
//! foca itself accepts an announce only when it names this node's address.
//!
//! The nonce must never repeat under one key. The header's `(from,
//! incarnation, seq)` is unique per datagram only while a node never
//! reuses an incarnation, and an incarnation is a boot-time wall-clock
//! stamp that a clock reset can repeat. So every datagram carries a fresh
//! 16-byte random *salt* after the header, and the 24-byte nonce is that
//! salt followed by the header's `seq` (little-endian). Two datagrams share
//! a nonce only if both their salts (128 random bits) and their sequence
//! numbers collide: negligible, with no counter to keep in the encoder, no
//! state to persist across restarts and no reliance on any clock. The salt
//! is in the clear and authenticated with the header. (XChaCha's 192-bit
//! nonce is what makes random nonces safe; ChaCha20-Poly1305's 96 bits
//! would not be.)
//!
//! A datagram is checked in the order that makes each failure cheap and
//! countable: size, magic and version, then the cluster tag *before* the
//! AEAD, so a node of another cluster on the same network is counted as
//! `foreign_cluster` rather than as a forgery, then the AEAD over
//! everything (a header that does not parse, a missing salt or tag, and any
//! changed byte all fail here, as `bad_mac`). Only an authentic datagram is
//! decrypted and reaches the body parser; it is still parsed strictly (no
//! trailing bytes, counts capped by what the datagram could hold, no
//! unknown kinds), never panics, and allocates no more than in proportion
//! to the datagram's length, so a buggy peer or a leaked secret cannot
//! crash or balloon a node.
//!
//! Gossip is mostly queue elements, so the body is built to make them
//! small. Within one datagram, limit ids, domains and nodes are *interned*:
//! each is written in full the first time and as a one-byte reference
//! afterwards (the sender's own node is known from the header). Times are
//! exact nanoseconds, not the design note's microseconds, because an
//! element's birth is part of its identity and must not be rounded; they
//! are kept small instead by writing each as a difference from a time the
//! reader already knows: the first birth from the header's `sent_at`, each
//! later birth from the previous one, and each death from the death the
//! token-bucket queue itself would predict, `max(birth, previous death) +
//! interval` (Equation 4.2), which is exact both for a queue at its limit
//! and for one well under it. A steadily fed queue then costs about six
//! bytes per element (a grant a millisecond), some 180 elements per
//! datagram.
//!
//! Signed differences are zig-zag varints computed modulo 2⁶⁴, so every
//! `u64` time round-trips exactly and no input can overflow; the decoder
//! rejects queue elements that are not in strictly increasing identity
//! order, which also catches a difference that "wrapped".
//!
//! # Layout
//!
//! Integers are LEB128 varints (minimal: an overlong encoding is refused)
//! unless a width is given; `zz(x)` is the zig-zag varint of a signed
//! difference taken modulo 2⁶⁴.
//!
//! ```text
//! datagram  = header salt sealed tag                 (≤ 1,200 bytes)
//! header    = "TG" version:u8(=3) cluster:u64le from incarnation seq
//!             sent_at to to_incarnation              (17 to 71 bytes, clear)
//!   to, to_incarnation = the recipient's node id and incarnation, or
//!             0 0 for anyone at the address (membership announces to
//!             seeds, and the `unauthenticated` notice)
//! salt      = 16 random bytes, fresh per datagram    (clear)
//! sealed    = XChaCha20(key, nonce, kind:u8 body)    (ciphertext)
//! tag       = Poly1305 tag, 16 bytes
//!   AEAD    = XChaCha20-Poly1305 (RFC 8439 with the 24-byte nonce of
//!             draft-irtf-cfrg-xchacha), associated data = header salt
//!   nonce   = salt || seq:u64le                      (24 bytes)
//!   key     = HMAC-SHA256(secret, "tollgate gossip v2" || cluster name)
//!             (unchanged since version 2: the version byte is checked
//!             first)
//! cluster   = FNV-1a-64(cluster name)                (see cluster_tag)
//!
//! body by kind:
//!   1 Membership   len bytes[len]                   (foca's message)
//!   2 Delta        item*                            (to the end)
//!   3 FullRequest  (empty)
//!   4 Full         stream index last:u8(0|1) item*
//!   5 Ping         t1
//!   6 Pong         t1 t2 t3
//!   7 Outdated     incarnation seq   (the receiver's datagram came from an
//!                                     earlier life than one seen of it)
//!   8 Unauthenticated (empty)        (a datagram from the receiver's
//!                                     address failed authentication)
//!   9 Digest       at n (bucket:u8 hash:u64le)[n ≤ 64]   (buckets in
//!                                     increasing order, each < 64)
//!  10 Pull         buckets:u64le     (bit b: send your keys of bucket b)
//!  11 Repair       item*             (to the end; merged as a delta)
//!  12 Graft        n node[n ≤ 100]   (relay to me what you learn of
//!                                     every node's updates but these
//!                                     nodes', which I hear myself)
//!
//! item      = limit domain payload_kind:u8 [generation] payload
//!   payload_kind's high bit (0x80) set: the key was reset, and its
//!             reset generation follows; clear: never reset (generation
//!             zero), written as before resets existed
//! generation = zz(at − sent_at) node       (never the zero generation)
//! limit     = 0 id  |  k (≥ 1: the k-th limit id written in this datagram)
//! domain    = 0 len utf8[len ≤ 512]  |  k (the k-th domain)
//! node      = 0 id  |  k (the k-th node; the header's `from` is the 1st)
//!
//! payload by payload_kind:
//!   1 counter  (entries << 1 | has_refill) (node count)* limit
//!              [zz(refill_timestamp − sent_at)]
//!   2 queue    interval n element[n]
//!   3 epoch    epoch n (node traffic)[n]
//!
//! element i = zz(birth − (i = 0 ? sent_at : birth[i−1])) node seq
//!             zz(death − predicted)
//!   predicted = (i = 0 ? birth : max(birth, death[i−1])) + interval
//! ```
//!
//! A datagram thus spends at most 104 bytes on framing (a 71-byte header,
//! the salt, the kind and the tag), 32 of them for the AEAD (salt and tag).
//! A reset generation written with the flag is never zero (zero is
//! written without it), so each value has one encoding. Counter and epoch
//! entries are sorted by node with no zero counts, and
//! queue elements sorted by identity, as the states keep them; the decoder
//! refuses anything else.
//!
//! # Modules
//!
//! The format is one module; its parts are files, each one concern, so a
//! change to the cipher, to a message's body or to the replay window reads
//! and reviews alone. Everything public is re-exported here: callers name
//! `wire::encode`, `wire::Body`, `wire::ReplayGuard`, never a file.
//!
//! - `seal`: the cluster key and the AEAD (key derivation, nonce, seal and
//!   open);
//! - `header`: the clear, authenticated header and the salt, and the
//!   cluster tag;
//! - `message`: the message kinds ([`Body`], [`Message`]) and each kind's
//!   body on the wire;
//! - `items`: the items of gossip bodies (keys, counters, queues, epochs),
//!   interned and delta-coded;
//! - `datagram`: one datagram, [`encode`] and [`decode`], with the checks in
//!   the order that makes each failure cheap;
//! - `pack`: many items into as many datagrams as they need
//!   ([`encode_items`]);
//! - `replay`: the per-sender anti-replay window ([`ReplayGuard`]);
//! - `bytes`: varints, zig-zag deltas and the checked reader the others
//!   build on.

#![deny(missing_docs)]

mod bytes;
mod datagram;
mod header;
mod items;
mod message;
mod pack;
mod replay;
mod seal;

pub use datagram::{decode, encode};
pub use header::{cluster_tag, unauthenticated_header, Header, ANYONE};
pub use message::{Body, Message, MAX_GRAFT_EXCEPT};
pub use pack::{encode_items, Batch, Packed};
pub use replay::{Admission, ReplayGuard};
pub use seal::ClusterKey;

/// The most bytes a datagram may take: small enough to cross any common
/// path without IP fragmentation (`docs/replicated.md`, "Transport").
pub const MAX_DATAGRAM: usize = 1200;

/// The longest domain, in bytes, a key may have to be gossiped. A longer
/// one is an encode error ([`WireError::DomainTooLong`]).
pub const MAX_DOMAIN: usize = 512;

/// The first two bytes of every datagram.
pub const MAGIC: [u8; 2] = *b"TG";

/// The wire version this module reads and writes: 3, encrypted and bound
/// to its recipient (version 2 named no recipient, version 1 was
/// authenticated only; both are refused).
pub const VERSION: u8 = 3;

/// Bytes of the authentication tag that ends every datagram (Poly1305's).
pub const TAG_LEN: usize = 16;

/// Bytes of the random salt after the header, the first part of the
/// AEAD's nonce.
pub const SALT_LEN: usize = 16;

/// The largest membership (foca) message that always fits in a datagram,
/// whatever the header's values: the size to configure foca with (1,094
/// bytes: the datagram less the longest header, the salt, the kind, the
/// message's 2-byte length and the tag).
pub const MAX_MEMBERSHIP: usize = MAX_DATAGRAM - MAX_HEADER - OVERHEAD - 2;

/// Magic, version and cluster tag: the fixed-width start of the header.
const FIXED_HEADER: usize = 11;

/// The longest header: the fixed part and six 10-byte varints.
const MAX_HEADER: usize = FIXED_HEADER + 6 * 10;

/// What a datagram spends besides its header and body: the salt, the
/// (encrypted) kind and the tag.
const OVERHEAD: usize = SALT_LEN + 1 + TAG_LEN;

const TRUNCATED: WireError = WireError::Malformed("truncated");

/// Why a datagram could not be encoded, or was refused on receipt.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The datagram is (or would be) longer than [`MAX_DATAGRAM`]; the
    /// length it has.
    #[error("datagram of {0} bytes is over the {MAX_DATAGRAM}-byte limit")]
    Oversized(usize),
    /// It does not start with [`MAGIC`]: not tollgate gossip.
    #[error("not a tollgate gossip datagram")]
    BadMagic,
    /// A wire version this node does not speak.
    #[error("wire version {0} is not supported (this node speaks {VERSION})")]
    Version(u8),
    /// Sent by a node of another cluster: the cluster tag it carries.
    #[error("datagram of another cluster (tag {0:016x})")]
    ForeignCluster(u64),
    /// The AEAD does not authenticate it: forged, corrupted, truncated,
    /// or sent under another secret (or cluster name).
    #[error("datagram failed authentication")]
    BadMac,
    /// Authentic but not well formed; what is wrong with it.
    #[error("malformed datagram: {0}")]
    Malformed(&'static str),
    /// Authentic but already received, or too old to tell
    /// ([`ReplayGuard::check`]); [`decode`] itself never returns it.
    #[error("replayed datagram")]
    Replayed,
    /// Authentic but addressed to another node, or to another incarnation
    /// of this one ([`Header::is_for`]); [`decode`] itself never returns
    /// it.
    #[error("datagram addressed to another node")]
    Misaddressed,
    /// A key's domain is longer than [`MAX_DOMAIN`]; its length.
    #[error("domain of {0} bytes is over the {MAX_DOMAIN}-byte limit")]
    DomainTooLong(usize),
}

impl WireError {
    /// A short label that stays the same across releases, for a metric's
    /// `reason` label.
    pub fn reason(&self) -> &'static str {
        match self {
            WireError::Oversized(_) => "oversized",
            WireError::BadMagic => "bad_magic",
            WireError::Version(_) => "version",
            WireError::ForeignCluster(_) => "foreign_cluster",
            WireError::BadMac => "bad_mac",
            WireError::Malformed(_) => "malformed",
            WireError::Replayed => "replayed",
            WireError::Misaddressed => "misaddressed",
            WireError::DomainTooLong(_) => "domain_too_long",
        }
    }
}
