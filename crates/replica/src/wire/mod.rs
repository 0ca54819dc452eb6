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
//! item      = limit domain payload_kind:u8 payload
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
//! Counter and epoch entries are sorted by node with no zero counts, and
//! queue elements sorted by identity, as the states keep them; the decoder
//! refuses anything else.

#![deny(missing_docs)]

use std::collections::HashMap;
use std::fmt;

use chacha20poly1305::aead::AeadInOut;
use chacha20poly1305::{KeyInit as AeadKeyInit, Tag, XChaCha20Poly1305, XNonce};
use hmac::digest::{Key as BlockKey, KeyInit};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use tollgate_core::replicated::counter::CounterBucketState;
use tollgate_core::replicated::epoch::EpochReport;
use tollgate_core::replicated::queue::{Element, ElementId, QueueState};
use tollgate_core::replicated::strategy::Payload;
use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;
use tollgate_store::{Key, LimitId};

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

/// What the key derivation mixes in before the cluster name.
const KDF_LABEL: &[u8] = b"tollgate gossip v2";

const KIND_MEMBERSHIP: u8 = 1;
const KIND_DELTA: u8 = 2;
const KIND_FULL_REQUEST: u8 = 3;
const KIND_FULL: u8 = 4;
const KIND_PING: u8 = 5;
const KIND_PONG: u8 = 6;
const KIND_OUTDATED: u8 = 7;
const KIND_UNAUTHENTICATED: u8 = 8;
const KIND_DIGEST: u8 = 9;
const KIND_PULL: u8 = 10;
const KIND_REPAIR: u8 = 11;
const KIND_GRAFT: u8 = 12;

const PAYLOAD_COUNTER: u8 = 1;
const PAYLOAD_QUEUE: u8 = 2;
const PAYLOAD_EPOCH: u8 = 3;

/// The fewest bytes a queue element takes (four one-byte varints).
const MIN_ELEMENT: usize = 4;
/// The fewest bytes a counter or epoch entry takes (node and count).
const MIN_ENTRY: usize = 2;

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

/// The tag of a cluster's name that every datagram carries: the stable
/// hash ([`tollgate_core::hash`], FNV-1a-64) of its UTF-8 bytes, so every
/// process of every version computes the same tag. It tells clusters
/// apart; it is not secret and authenticates nothing.
pub const fn cluster_tag(name: &str) -> u64 {
    tollgate_core::hash::fnv1a64(name.as_bytes())
}

/// The key datagrams are encrypted and authenticated under, derived from
/// the cluster's secret and its name: the XChaCha20-Poly1305 key
/// HMAC-SHA256(secret, `"tollgate gossip v2"` || name). Binding the name
/// means two clusters that share a secret still cannot read or talk to
/// each other.
///
/// Its `Debug` shows no key material, and the key is zeroed when dropped.
#[derive(Clone)]
pub struct ClusterKey {
    aead: XChaCha20Poly1305,
}

impl ClusterKey {
    /// Derives the key of cluster `cluster_name` from the shared `secret`.
    pub fn new(secret: &[u8], cluster_name: &str) -> ClusterKey {
        let mut kdf = keyed(secret);
        kdf.update(KDF_LABEL);
        kdf.update(cluster_name.as_bytes());
        let derived: [u8; 32] = kdf.finalize().into_bytes().into();
        ClusterKey {
            aead: <XChaCha20Poly1305 as AeadKeyInit>::new(&derived.into()),
        }
    }

    /// Encrypts `plaintext` in place, authenticating `clear` (the header
    /// and the salt, which ends it) with it, and answers the tag; `None`
    /// only for a message too long for the cipher, which no datagram is.
    fn seal(&self, clear: &[u8], seq: u64, plaintext: &mut [u8]) -> Option<[u8; TAG_LEN]> {
        let nonce = nonce(clear, seq)?;
        let tag = self
            .aead
            .encrypt_inout_detached(&nonce, clear, plaintext.into())
            .ok()?;
        Some(tag.into())
    }

    /// Decrypts `sealed` in place if `tag` authenticates it and `clear`
    /// (the header and the salt, which ends it); whether it did. On
    /// failure `sealed` holds garbage.
    fn open(&self, clear: &[u8], seq: u64, sealed: &mut [u8], tag: &[u8]) -> bool {
        let (Some(nonce), Ok(tag)) = (nonce(clear, seq), Tag::try_from(tag)) else {
            return false;
        };
        self.aead
            .decrypt_inout_detached(&nonce, clear, sealed.into(), &tag)
            .is_ok()
    }
}

/// The nonce of a datagram whose clear part (header and salt) is `clear`:
/// the salt, then the sequence number. `None` if `clear` is shorter than
/// a salt.
fn nonce(clear: &[u8], seq: u64) -> Option<XNonce> {
    let salt = clear
        .len()
        .checked_sub(SALT_LEN)
        .and_then(|at| clear.get(at..))?;
    let mut nonce = [0u8; SALT_LEN + 8];
    nonce[..SALT_LEN].copy_from_slice(salt);
    nonce[SALT_LEN..].copy_from_slice(&seq.to_le_bytes());
    Some(nonce.into())
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterKey").finish_non_exhaustive()
    }
}

/// HMAC-SHA256 under a key of any length. The key is brought to the block
/// size as RFC 2104 §2 does (hashed when longer, zero-padded), which is
/// what HMAC does itself; doing it here reaches the infallible fixed-size
/// constructor rather than `new_from_slice`, whose `Result` cannot fail for
/// HMAC but would still need unwrapping.
fn keyed(key: &[u8]) -> Hmac<Sha256> {
    let mut block = BlockKey::<Hmac<Sha256>>::default();
    if key.len() > block.len() {
        let digest = Sha256::digest(key);
        block[..digest.len()].copy_from_slice(&digest);
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    <Hmac<Sha256> as KeyInit>::new(&block)
}

/// Who sent a datagram, and when: the part of every datagram before its
/// body. All of it is authenticated, and all of it is sent in the clear
/// (the receiver needs it before it can decrypt).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// The sender's cluster, [`cluster_tag`] of its name.
    pub cluster: u64,
    /// The sending node.
    pub from: NodeId,
    /// The sender's incarnation: raised each time it (re)joins, so its
    /// sequence numbers start over ([`ReplayGuard`]).
    pub incarnation: u64,
    /// The sender's datagram counter within the incarnation, one per
    /// datagram of any kind ([`ReplayGuard`]).
    pub seq: u64,
    /// The sender's wall clock when it sent the datagram: the receiver's
    /// view of the sender's clock (skew), and the base of the payloads'
    /// times.
    pub sent_at: Nanos,
    /// The node the datagram is for, or [`ANYONE`] for whoever listens at
    /// the address it was sent to (an announce to a seed not met yet).
    pub to: NodeId,
    /// The incarnation of `to` the datagram is for (0 with [`ANYONE`]): a
    /// datagram for an earlier life of the recipient is refused.
    pub to_incarnation: u64,
}

/// The recipient of a datagram sent to whoever listens at an address: a
/// seed whose identity the sender does not know yet.
pub const ANYONE: NodeId = NodeId(0);

impl Header {
    /// Whether the datagram is addressed to `node` in its `incarnation`
    /// exactly (not to [`ANYONE`]).
    pub fn is_for(&self, node: NodeId, incarnation: u64) -> bool {
        self.to == node && self.to_incarnation == incarnation
    }

    /// Whether the datagram is addressed to [`ANYONE`] at the address it
    /// arrived at.
    pub fn is_for_anyone(&self) -> bool {
        self.to == ANYONE && self.to_incarnation == 0
    }
}

/// What a datagram says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A message of the membership protocol (foca), opaque here; at most
    /// [`MAX_MEMBERSHIP`] bytes always fit.
    Membership(Vec<u8>),
    /// Ordinary gossip: payloads to merge, per key. One key may come in
    /// several items (a queue too large for one datagram is split); each
    /// merges on its own.
    Delta {
        /// The payloads, in the order they were written.
        items: Vec<(Key, Payload)>,
    },
    /// A joining node asks for the sender's whole state.
    FullRequest,
    /// One chunk of a whole-state transfer to a joining node.
    Full {
        /// Names the transfer, so chunks of two transfers do not mix.
        stream: u64,
        /// The chunk's position in the transfer, from 0.
        index: u32,
        /// Whether this is the transfer's final chunk.
        last: bool,
        /// The payloads, as in [`Body::Delta`].
        items: Vec<(Key, Payload)>,
    },
    /// A clock probe (NTP-style): the prober's clock when it sent it.
    Ping {
        /// The prober's send time.
        t1: Nanos,
    },
    /// The answer to a [`Body::Ping`]. With `t4`, when the prober receives
    /// it, the prober estimates the offset of the answerer's clock as
    /// `((t2 − t1) + (t3 − t4)) / 2` and the round trip as
    /// `(t4 − t1) − (t3 − t2)`.
    Pong {
        /// The ping's `t1`, echoed.
        t1: Nanos,
        /// The answerer's clock when the ping arrived.
        t2: Nanos,
        /// The answerer's clock when it sent this answer.
        t3: Nanos,
    },
    /// The answer to an authentic datagram that came from an earlier life
    /// of its sender than one this node has seen (an older incarnation, or
    /// the same one below its replay window): either a replay, or the
    /// sender restarted with a boot stamp no larger than before (its clock
    /// was stepped back). A sender that has not sent `seq` datagrams in
    /// incarnation `incarnation` is the restarted one, and takes a larger
    /// incarnation; a live sender ignores it.
    Outdated {
        /// The sender's latest incarnation this node has seen.
        incarnation: u64,
        /// The highest sequence number seen in it.
        seq: u64,
    },
    /// A datagram from the receiver's address, sent to anyone at this
    /// node's address, failed authentication here: the receiver, which can
    /// read this only if it shares the key, most likely has another secret
    /// (it then cannot authenticate this answer either, and counts it).
    Unauthenticated,
    /// Anti-entropy: the sender's digest of its settled state at `at`
    /// ([`crate::digest`]), its non-empty buckets only.
    Digest {
        /// The time the digest was taken at; the receiver takes its own at
        /// the same time, so in-flight updates are left out alike.
        at: Nanos,
        /// Bucket numbers (below [`crate::digest::BUCKETS`]) and hashes,
        /// in increasing bucket order.
        buckets: Vec<(u8, u64)>,
    },
    /// Anti-entropy: the sender's digest differed in these buckets: send
    /// every key of them.
    Pull {
        /// The buckets, bit `b` for bucket `b`.
        buckets: u64,
    },
    /// Anti-entropy: the sender's keys of buckets where digests differed,
    /// each with its whole state (merged as a [`Body::Delta`] is).
    Repair {
        /// The payloads, as in [`Body::Delta`].
        items: Vec<(Key, Payload)>,
    },
    /// The sender cannot hear some nodes, or lacked news the receiver
    /// had from them: for a while, the receiver is to relay to the sender
    /// what it learns of the updates of every node but `except` (origin
    /// dissemination; [`crate::deltas`]).
    Graft {
        /// The nodes the sender hears itself (itself included), whose
        /// updates are not to be relayed; at most [`MAX_GRAFT_EXCEPT`]
        /// (a sender that hears more names none, and gets every node's).
        except: Vec<NodeId>,
    },
}

/// Most nodes one [`Body::Graft`] names.
pub const MAX_GRAFT_EXCEPT: usize = 100;

impl Body {
    fn kind(&self) -> u8 {
        match self {
            Body::Membership(_) => KIND_MEMBERSHIP,
            Body::Delta { .. } => KIND_DELTA,
            Body::FullRequest => KIND_FULL_REQUEST,
            Body::Full { .. } => KIND_FULL,
            Body::Ping { .. } => KIND_PING,
            Body::Pong { .. } => KIND_PONG,
            Body::Outdated { .. } => KIND_OUTDATED,
            Body::Unauthenticated => KIND_UNAUTHENTICATED,
            Body::Digest { .. } => KIND_DIGEST,
            Body::Pull { .. } => KIND_PULL,
            Body::Repair { .. } => KIND_REPAIR,
            Body::Graft { .. } => KIND_GRAFT,
        }
    }
}

/// A decoded datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Who sent it, and when.
    pub header: Header,
    /// What it says.
    pub body: Body,
}

/// Which body [`encode_items`] packs items into.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Batch {
    /// [`Body::Delta`]s.
    Delta,
    /// The chunks of one whole-state transfer ([`Body::Full`]), numbered
    /// from 0, the final one marked `last`.
    Full {
        /// The transfer's [`Body::Full::stream`].
        stream: u64,
    },
    /// [`Body::Repair`]s.
    Repair,
}

/// What [`encode_items`] produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Packed {
    /// The datagrams, ready to send, in order.
    pub datagrams: Vec<Vec<u8>>,
    /// Items left out: a domain over [`MAX_DOMAIN`], or a counter or epoch
    /// payload that alone does not fit in a datagram.
    pub dropped: usize,
}

/// Encodes one datagram.
///
/// Fails with [`WireError::Oversized`] when it would exceed
/// [`MAX_DATAGRAM`] (use [`encode_items`] for items that may not fit) and
/// with [`WireError::DomainTooLong`] for an item whose domain does.
pub fn encode(key: &ClusterKey, header: &Header, body: &Body) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(MAX_DATAGRAM);
    let clear = put_clear(&mut out, header);
    out.push(body.kind());
    match body {
        Body::Membership(bytes) => {
            put_varint(&mut out, bytes.len() as u64);
            out.extend_from_slice(bytes);
        }
        Body::Delta { items } => put_all_items(&mut out, header, items)?,
        Body::FullRequest => {}
        Body::Full {
            stream,
            index,
            last,
            items,
        } => {
            put_full_meta(&mut out, *stream, *index, *last);
            put_all_items(&mut out, header, items)?;
        }
        Body::Ping { t1 } => put_varint(&mut out, t1.as_u64()),
        Body::Pong { t1, t2, t3 } => {
            for t in [t1, t2, t3] {
                put_varint(&mut out, t.as_u64());
            }
        }
        Body::Outdated { incarnation, seq } => {
            put_varint(&mut out, *incarnation);
            put_varint(&mut out, *seq);
        }
        Body::Unauthenticated => {}
        Body::Graft { except } => {
            put_varint(&mut out, except.len() as u64);
            for n in except {
                put_varint(&mut out, n.0);
            }
        }
        Body::Digest { at, buckets } => {
            put_varint(&mut out, at.as_u64());
            put_varint(&mut out, buckets.len() as u64);
            for (b, h) in buckets {
                out.push(*b);
                out.extend_from_slice(&h.to_le_bytes());
            }
        }
        Body::Pull { buckets } => out.extend_from_slice(&buckets.to_le_bytes()),
        Body::Repair { items } => put_all_items(&mut out, header, items)?,
    }
    let len = out.len() + TAG_LEN;
    if len > MAX_DATAGRAM || !seal(key, &mut out, clear, header.seq) {
        return Err(WireError::Oversized(len));
    }
    Ok(out)
}

/// Packs `items` into as many datagrams of `batch` as they need, greedily
/// and in order, whole items per datagram.
///
/// A queue that does not fit in a datagram of its own is split into
/// several items of the same key, each a run of its elements (a subset of
/// a queue is a queue; merging the parts gives the whole). Items that
/// cannot be sent at all are counted in [`Packed::dropped`]: a domain over
/// [`MAX_DOMAIN`], and a counter or epoch payload too large alone (one
/// entry per node: only a cluster of some fifty nodes with large counts).
///
/// `header` is a template: each datagram takes `*seq` as its sequence
/// number, and `*seq` advances past the datagrams produced (`header.seq`
/// is not used). A [`Batch::Delta`] of no items produces no datagram; a
/// [`Batch::Full`] always produces at least one, so a joining node learns
/// that the transfer is over even when there is no state to send.
pub fn encode_items(
    key: &ClusterKey,
    header: &Header,
    seq: &mut u64,
    batch: Batch,
    items: &[(Key, Payload)],
) -> Packed {
    let first_seq = *seq;
    let budget =
        |index: usize| chunk_budget(header, first_seq.wrapping_add(index as u64), batch, index);
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut w = ItemWriter::new(header, budget(0));
    let mut dropped = 0;
    let next_chunk = |w: &mut ItemWriter<'_>, chunks: &mut Vec<Vec<u8>>| {
        chunks.push(std::mem::take(&mut w.buf));
        w.reset(budget(chunks.len()));
    };
    for (k, payload) in items {
        if check_key(k).is_err() {
            dropped += 1;
            continue;
        }
        let Payload::Queue(q) = payload else {
            if !w.put_item(k, payload) {
                if !w.is_empty() {
                    next_chunk(&mut w, &mut chunks);
                }
                if !w.put_item(k, payload) {
                    dropped += 1;
                }
            }
            continue;
        };
        let elements: Vec<Element> = q.elements().copied().collect();
        if w.put_queue(k, q.interval(), &elements, false).is_some() {
            continue;
        }
        if !w.is_empty() {
            next_chunk(&mut w, &mut chunks);
            if w.put_queue(k, q.interval(), &elements, false).is_some() {
                continue;
            }
        }
        // Too large for a datagram of its own: runs of elements, each
        // filling a datagram.
        let mut rest = &elements[..];
        loop {
            match w.put_queue(k, q.interval(), rest, true) {
                Some(n) if n > 0 => {
                    rest = rest.get(n..).unwrap_or_default();
                    if rest.is_empty() {
                        break;
                    }
                    next_chunk(&mut w, &mut chunks);
                }
                // Not one element fits an empty datagram: impossible with
                // domains of at most MAX_DOMAIN bytes, but never loop.
                _ => {
                    dropped += 1;
                    break;
                }
            }
        }
    }
    if !w.is_empty() || (matches!(batch, Batch::Full { .. }) && chunks.is_empty()) {
        chunks.push(std::mem::take(&mut w.buf));
    }

    let total = chunks.len();
    let mut datagrams = Vec::with_capacity(total);
    for (i, items) in chunks.into_iter().enumerate() {
        let h = Header {
            seq: first_seq.wrapping_add(i as u64),
            ..*header
        };
        let mut out = Vec::with_capacity(MAX_DATAGRAM);
        let clear = put_clear(&mut out, &h);
        match batch {
            Batch::Delta => out.push(KIND_DELTA),
            Batch::Repair => out.push(KIND_REPAIR),
            Batch::Full { stream } => {
                out.push(KIND_FULL);
                put_full_meta(&mut out, stream, chunk_index(i), i + 1 == total);
            }
        }
        out.extend_from_slice(&items);
        debug_assert!(out.len() + TAG_LEN <= MAX_DATAGRAM);
        if seal(key, &mut out, clear, h.seq) {
            datagrams.push(out);
        } else {
            // Unreachable (the cipher takes far longer messages), but
            // never send an unsealed datagram.
            dropped += 1;
        }
    }
    *seq = first_seq.wrapping_add(total as u64);
    Packed { datagrams, dropped }
}

/// Decodes, authenticates and decrypts one datagram of the cluster tagged
/// `expected_cluster` (normally [`cluster_tag`] of the name `key` was
/// derived from).
///
/// Checks, in this order: size ([`WireError::Oversized`]), magic and
/// version, cluster tag ([`WireError::ForeignCluster`]), the AEAD
/// ([`WireError::BadMac`]: also a header that does not parse, or a
/// datagram too short for the salt and tag, since neither can be
/// authentic), then parses the decrypted body strictly
/// ([`WireError::Malformed`]). Never panics, whatever `bytes` hold, and
/// allocates in proportion to their length: it decrypts into a buffer on
/// the stack, counts are capped by what the rest of the datagram could
/// hold, and the worst case, an interned 512-byte domain copied into every
/// key of a datagram of five-byte items, is about 120 KB. It checks
/// neither the recipient ([`Header::is_for`]) nor replays (pass the header
/// to a [`ReplayGuard`]): the node does both.
pub fn decode(key: &ClusterKey, expected_cluster: u64, bytes: &[u8]) -> Result<Message, WireError> {
    if bytes.len() > MAX_DATAGRAM {
        return Err(WireError::Oversized(bytes.len()));
    }
    if bytes.get(..MAGIC.len()) != Some(&MAGIC[..]) {
        return Err(WireError::BadMagic);
    }
    let version = *bytes.get(MAGIC.len()).ok_or(TRUNCATED)?;
    if version != VERSION {
        return Err(WireError::Version(version));
    }
    let cluster = bytes
        .get(3..FIXED_HEADER)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
        .ok_or(TRUNCATED)?;
    if cluster != expected_cluster {
        return Err(WireError::ForeignCluster(cluster));
    }

    // The header, in the clear but not yet authenticated: whatever is
    // wrong with it is a failure to authenticate.
    let mut r = Reader {
        bytes: bytes.get(FIXED_HEADER..).unwrap_or_default(),
    };
    let header = read_header(&mut r, cluster).map_err(|_| WireError::BadMac)?;
    let clear_len = bytes.len() - r.remaining() + SALT_LEN;
    let sealed_len = bytes
        .len()
        .checked_sub(clear_len + TAG_LEN)
        .ok_or(WireError::BadMac)?;
    let (clear, rest) = bytes.split_at(clear_len);
    let (sealed, tag) = rest.split_at(sealed_len);
    let mut buf = [0u8; MAX_DATAGRAM];
    let plain = buf.get_mut(..sealed_len).ok_or(WireError::BadMac)?;
    plain.copy_from_slice(sealed);
    if !key.open(clear, header.seq, plain, tag) {
        return Err(WireError::BadMac);
    }

    let mut r = Reader { bytes: plain };
    let body = match r.u8()? {
        KIND_MEMBERSHIP => {
            let len = r.varint()?;
            Body::Membership(r.take(len)?.to_vec())
        }
        KIND_DELTA => Body::Delta {
            items: read_items(&mut r, &header)?,
        },
        KIND_FULL_REQUEST => Body::FullRequest,
        KIND_FULL => {
            let stream = r.varint()?;
            let index = u32::try_from(r.varint()?)
                .map_err(|_| WireError::Malformed("chunk index out of range"))?;
            let last = match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(WireError::Malformed("bad last-chunk flag")),
            };
            Body::Full {
                stream,
                index,
                last,
                items: read_items(&mut r, &header)?,
            }
        }
        KIND_PING => Body::Ping {
            t1: Nanos::new(r.varint()?),
        },
        KIND_PONG => Body::Pong {
            t1: Nanos::new(r.varint()?),
            t2: Nanos::new(r.varint()?),
            t3: Nanos::new(r.varint()?),
        },
        KIND_OUTDATED => Body::Outdated {
            incarnation: r.varint()?,
            seq: r.varint()?,
        },
        KIND_UNAUTHENTICATED => Body::Unauthenticated,
        KIND_DIGEST => {
            let at = Nanos::new(r.varint()?);
            let n = r.varint()?;
            if n > crate::digest::BUCKETS as u64 {
                return Err(WireError::Malformed("too many digest buckets"));
            }
            let mut buckets = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let b = r.u8()?;
                let h = r.u64le()?;
                let ordered = buckets.last().is_none_or(|(last, _): &(u8, u64)| *last < b);
                if usize::from(b) >= crate::digest::BUCKETS || !ordered {
                    return Err(WireError::Malformed("digest buckets out of order or range"));
                }
                buckets.push((b, h));
            }
            Body::Digest { at, buckets }
        }
        KIND_PULL => Body::Pull {
            buckets: r.u64le()?,
        },
        KIND_REPAIR => Body::Repair {
            items: read_items(&mut r, &header)?,
        },
        KIND_GRAFT => {
            let n = r.varint()?;
            if n > MAX_GRAFT_EXCEPT as u64 {
                return Err(WireError::Malformed("too many nodes in a graft"));
            }
            let mut except = Vec::with_capacity(n as usize);
            for _ in 0..n {
                except.push(NodeId(r.varint()?));
            }
            Body::Graft { except }
        }
        _ => return Err(WireError::Malformed("unknown message kind")),
    };
    r.finish()?;
    Ok(Message { header, body })
}

/// The header after the fixed part (magic, version, cluster tag).
fn read_header(r: &mut Reader<'_>, cluster: u64) -> Result<Header, WireError> {
    Ok(Header {
        cluster,
        from: NodeId(r.varint()?),
        incarnation: r.varint()?,
        seq: r.varint()?,
        sent_at: Nanos::new(r.varint()?),
        to: NodeId(r.varint()?),
        to_incarnation: r.varint()?,
    })
}

/// The clear header of a datagram of this wire version, **not
/// authenticated**: anyone can write any header. Only for deciding how to
/// treat a datagram that failed authentication (whether it was sent to
/// [`ANYONE`], as an announce to a seed is); never trust what it says.
pub fn unauthenticated_header(bytes: &[u8]) -> Option<Header> {
    if bytes.len() > MAX_DATAGRAM || bytes.get(..MAGIC.len()) != Some(&MAGIC[..]) {
        return None;
    }
    if *bytes.get(MAGIC.len())? != VERSION {
        return None;
    }
    let cluster = u64::from_le_bytes(bytes.get(3..FIXED_HEADER)?.try_into().ok()?);
    let mut r = Reader {
        bytes: bytes.get(FIXED_HEADER..)?,
    };
    read_header(&mut r, cluster).ok()
}

/// Per-sender anti-replay, as IPsec does it (RFC 4303 §3.4.3): for each
/// sender, its latest incarnation and a window of the last 64 sequence
/// numbers, so each datagram is accepted once, and late ones within the
/// window still are.
///
/// It never goes back to an older incarnation of a sender, whatever
/// membership says: a datagram recorded from an earlier life stays refused
/// for as long as the guard remembers the sender. A sender that restarts
/// with an incarnation no larger than its last one is not let in by
/// forgetting it (a replayed datagram of the old life would then shut the
/// new one out again); it is told so ([`Admission::Outdated`], answered
/// with [`Body::Outdated`]) and comes back with a larger incarnation.
///
/// Bounded: it remembers at most `max_senders` senders and forgets the one
/// heard from least recently to make room. A forgotten sender's next
/// datagram is accepted as if it were the first, so `max_senders` should
/// exceed the cluster's size by a margin. Only authenticated datagrams
/// should reach it, so strangers cannot churn it.
#[derive(Clone, Debug)]
pub struct ReplayGuard {
    max_senders: usize,
    senders: HashMap<NodeId, Window>,
    /// Counts calls, to tell which sender was heard from least recently.
    tick: u64,
}

/// What [`ReplayGuard::admit`] makes of a datagram.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Not seen before: accepted, and recorded.
    Fresh,
    /// Already accepted once (a duplicate within the window).
    Duplicate,
    /// From before what the guard knows of the sender: an older
    /// incarnation than its latest, or the latest one more than
    /// [`ReplayGuard::WINDOW`] below its highest sequence number. Either
    /// a replay, or the sender restarted without a larger incarnation.
    Outdated {
        /// The sender's latest incarnation seen.
        incarnation: u64,
        /// The highest sequence number accepted in it.
        top: u64,
    },
}

/// One sender's replay state.
#[derive(Copy, Clone, Debug)]
struct Window {
    incarnation: u64,
    /// The highest sequence number accepted.
    top: u64,
    /// Bit `i` set: `top − i` was accepted.
    seen: u64,
    /// The tick of the last accepted datagram.
    last_heard: u64,
}

impl Window {
    fn admit(&mut self, incarnation: u64, seq: u64) -> Admission {
        let outdated = Admission::Outdated {
            incarnation: self.incarnation,
            top: self.top,
        };
        if incarnation < self.incarnation {
            return outdated;
        }
        if incarnation > self.incarnation {
            // A new life of the sender: its sequence numbers start over.
            self.incarnation = incarnation;
            self.top = seq;
            self.seen = 1;
            return Admission::Fresh;
        }
        if seq > self.top {
            let shift = seq - self.top;
            self.seen = if shift >= ReplayGuard::WINDOW {
                0
            } else {
                self.seen << shift
            };
            self.seen |= 1;
            self.top = seq;
            return Admission::Fresh;
        }
        let age = self.top - seq;
        if age >= ReplayGuard::WINDOW {
            return outdated;
        }
        let bit = 1u64 << age;
        if self.seen & bit != 0 {
            return Admission::Duplicate;
        }
        self.seen |= bit;
        Admission::Fresh
    }
}

impl ReplayGuard {
    /// How many sequence numbers below the highest one seen are still
    /// accepted (once each).
    pub const WINDOW: u64 = 64;

    /// The default bound on senders remembered.
    pub const DEFAULT_MAX_SENDERS: usize = 1024;

    /// A guard remembering at most `max_senders` senders (at least one).
    pub fn new(max_senders: usize) -> ReplayGuard {
        ReplayGuard {
            max_senders: max_senders.max(1),
            senders: HashMap::new(),
            tick: 0,
        }
    }

    /// Whether to accept datagram `seq` of `from`'s `incarnation`, and
    /// records it if so. Refused: an older incarnation than the latest
    /// seen, a sequence number already accepted, or one more than
    /// [`ReplayGuard::WINDOW`] below the highest accepted. A newer
    /// incarnation starts a fresh window.
    pub fn accept(&mut self, from: NodeId, incarnation: u64, seq: u64) -> bool {
        self.admit(from, incarnation, seq) == Admission::Fresh
    }

    /// [`ReplayGuard::accept`], telling a duplicate from a datagram of an
    /// earlier life of the sender (see [`Admission`]).
    pub fn admit(&mut self, from: NodeId, incarnation: u64, seq: u64) -> Admission {
        self.tick += 1;
        let tick = self.tick;
        if let Some(w) = self.senders.get_mut(&from) {
            let admission = w.admit(incarnation, seq);
            if admission == Admission::Fresh {
                w.last_heard = tick;
            }
            return admission;
        }
        if self.senders.len() >= self.max_senders {
            // A linear scan: it runs only when a sender not seen before
            // arrives while the table is full, which a cluster smaller than
            // the bound never causes.
            if let Some(oldest) = self
                .senders
                .iter()
                .min_by_key(|(_, w)| w.last_heard)
                .map(|(node, _)| *node)
            {
                self.senders.remove(&oldest);
            }
        }
        self.senders.insert(
            from,
            Window {
                incarnation,
                top: seq,
                seen: 1,
                last_heard: tick,
            },
        );
        Admission::Fresh
    }

    /// [`ReplayGuard::accept`] for a decoded header, as an error to count
    /// ([`WireError::Replayed`]).
    pub fn check(&mut self, header: &Header) -> Result<(), WireError> {
        if self.accept(header.from, header.incarnation, header.seq) {
            Ok(())
        } else {
            Err(WireError::Replayed)
        }
    }

    /// Forgets `from`: its next datagram, of any incarnation, is accepted
    /// as if it were the first. The node does not call it when membership
    /// declares a member down: a replay of the member's old datagrams
    /// would then be accepted, and lock its next life out (see the type's
    /// docs).
    pub fn forget(&mut self, from: NodeId) {
        self.senders.remove(&from);
    }

    /// How many senders it remembers.
    pub fn len(&self) -> usize {
        self.senders.len()
    }

    /// Whether it remembers no sender.
    pub fn is_empty(&self) -> bool {
        self.senders.is_empty()
    }
}

impl Default for ReplayGuard {
    fn default() -> ReplayGuard {
        ReplayGuard::new(ReplayGuard::DEFAULT_MAX_SENDERS)
    }
}

// ---------------------------------------------------------------- writing

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// `value − base` modulo 2⁶⁴ as a zig-zag number: small for nearby times
/// on either side, and exact for any two `u64`s.
fn zigzag_delta(value: u64, base: u64) -> u64 {
    let d = value.wrapping_sub(base) as i64;
    ((d << 1) ^ (d >> 63)) as u64
}

/// The inverse of [`zigzag_delta`]: total, so no input overflows.
fn apply_delta(base: u64, z: u64) -> u64 {
    let d = ((z >> 1) as i64) ^ -((z & 1) as i64);
    base.wrapping_add(d as u64)
}

/// The death the queue would give an element born at `birth` after
/// `prev` (Equation 4.2): what an element's death is written relative to.
fn predicted_death(prev: Option<&Element>, birth: Nanos, interval: Nanos) -> Nanos {
    let start = match prev {
        Some(p) => birth.max(p.death),
        None => birth,
    };
    start.saturating_add(interval)
}

/// Writes the clear part of a datagram, the header and a fresh random
/// salt, and answers its length (where the plaintext starts).
fn put_clear(out: &mut Vec<u8>, h: &Header) -> usize {
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&h.cluster.to_le_bytes());
    put_varint(out, h.from.0);
    put_varint(out, h.incarnation);
    put_varint(out, h.seq);
    put_varint(out, h.sent_at.as_u64());
    put_varint(out, h.to.0);
    put_varint(out, h.to_incarnation);
    let salt: [u8; SALT_LEN] = rand::random();
    out.extend_from_slice(&salt);
    out.len()
}

fn header_len(h: &Header, seq: u64) -> usize {
    FIXED_HEADER
        + varint_len(h.from.0)
        + varint_len(h.incarnation)
        + varint_len(seq)
        + varint_len(h.sent_at.as_u64())
        + varint_len(h.to.0)
        + varint_len(h.to_incarnation)
}

fn put_full_meta(out: &mut Vec<u8>, stream: u64, index: u32, last: bool) {
    put_varint(out, stream);
    put_varint(out, u64::from(index));
    out.push(u8::from(last));
}

fn chunk_index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

/// Bytes of items the chunk at `index` may hold, given its header.
fn chunk_budget(header: &Header, seq: u64, batch: Batch, index: usize) -> usize {
    let meta = match batch {
        Batch::Delta | Batch::Repair => 0,
        Batch::Full { stream } => {
            varint_len(stream) + varint_len(u64::from(chunk_index(index))) + 1
        }
    };
    MAX_DATAGRAM - OVERHEAD - header_len(header, seq) - meta
}

/// Encrypts `out` past its first `clear` bytes (header and salt) in place
/// and appends the tag; `false`, leaving `out` unusable, in the
/// unreachable case of a message too long for the cipher.
fn seal(key: &ClusterKey, out: &mut Vec<u8>, clear: usize, seq: u64) -> bool {
    let Some((head, plaintext)) = out.split_at_mut_checked(clear) else {
        return false;
    };
    match key.seal(head, seq, plaintext) {
        Some(tag) => {
            out.extend_from_slice(&tag);
            true
        }
        None => false,
    }
}

fn check_key(key: &Key) -> Result<(), WireError> {
    let len = key.scope().len();
    if len > MAX_DOMAIN {
        return Err(WireError::DomainTooLong(len));
    }
    Ok(())
}

/// Writes every item, whatever its size (for [`encode`], which checks the
/// total).
fn put_all_items(
    out: &mut Vec<u8>,
    header: &Header,
    items: &[(Key, Payload)],
) -> Result<(), WireError> {
    let mut w = ItemWriter::new(header, usize::MAX);
    for (key, payload) in items {
        check_key(key)?;
        // Without a budget every item fits; `encode` checks the total.
        let fitted = w.put_item(key, payload);
        debug_assert!(fitted);
    }
    out.extend_from_slice(&w.buf);
    Ok(())
}

/// Writes a node as a reference into the datagram's node table, adding it
/// on first use.
fn put_node(out: &mut Vec<u8>, nodes: &mut Vec<NodeId>, node: NodeId) {
    match nodes.iter().position(|&n| n == node) {
        Some(i) => put_varint(out, i as u64 + 1),
        None => {
            out.push(0);
            put_varint(out, node.0);
            nodes.push(node);
        }
    }
}

/// The items of one datagram being written, with its intern tables and
/// the bytes it may hold.
struct ItemWriter<'a> {
    buf: Vec<u8>,
    /// Reused for a queue's elements, written before their count.
    scratch: Vec<u8>,
    limits: Vec<LimitId>,
    domains: Vec<&'a str>,
    nodes: Vec<NodeId>,
    from: NodeId,
    sent_at: Nanos,
    budget: usize,
}

/// Where an [`ItemWriter`] stood, to take back an item that did not fit.
#[derive(Copy, Clone)]
struct Mark {
    buf: usize,
    limits: usize,
    domains: usize,
    nodes: usize,
}

impl<'a> ItemWriter<'a> {
    fn new(header: &Header, budget: usize) -> ItemWriter<'a> {
        ItemWriter {
            buf: Vec::new(),
            scratch: Vec::new(),
            limits: Vec::new(),
            domains: Vec::new(),
            nodes: vec![header.from],
            from: header.from,
            sent_at: header.sent_at,
            budget,
        }
    }

    /// Starts the next datagram (its buffer was taken).
    fn reset(&mut self, budget: usize) {
        self.buf.clear();
        self.limits.clear();
        self.domains.clear();
        self.nodes.clear();
        self.nodes.push(self.from);
        self.budget = budget;
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn mark(&self) -> Mark {
        Mark {
            buf: self.buf.len(),
            limits: self.limits.len(),
            domains: self.domains.len(),
            nodes: self.nodes.len(),
        }
    }

    fn rollback(&mut self, m: Mark) {
        self.buf.truncate(m.buf);
        self.limits.truncate(m.limits);
        self.domains.truncate(m.domains);
        self.nodes.truncate(m.nodes);
    }

    /// Writes the key (its domain already checked against MAX_DOMAIN).
    fn put_key(&mut self, key: &'a Key) {
        match self.limits.iter().position(|&l| l == key.limit) {
            Some(i) => put_varint(&mut self.buf, i as u64 + 1),
            None => {
                self.buf.push(0);
                put_varint(&mut self.buf, key.limit.0);
                self.limits.push(key.limit);
            }
        }
        let domain = key.scope();
        match self.domains.iter().position(|&d| d == domain) {
            Some(i) => put_varint(&mut self.buf, i as u64 + 1),
            None => {
                self.buf.push(0);
                put_varint(&mut self.buf, domain.len() as u64);
                self.buf.extend_from_slice(domain.as_bytes());
                self.domains.push(domain);
            }
        }
    }

    /// Writes one whole item; `false`, writing nothing, if it does not fit.
    fn put_item(&mut self, key: &'a Key, payload: &Payload) -> bool {
        let m = self.mark();
        match payload {
            Payload::Queue(q) => {
                let elements: Vec<Element> = q.elements().copied().collect();
                return self
                    .put_queue(key, q.interval(), &elements, false)
                    .is_some();
            }
            Payload::Counter(s) => {
                self.put_key(key);
                self.buf.push(PAYLOAD_COUNTER);
                let entries = s.token_counter();
                let refill = s.refill_timestamp();
                put_varint(
                    &mut self.buf,
                    ((entries.len() as u64) << 1) | u64::from(refill.is_some()),
                );
                self.put_entries(entries);
                put_varint(&mut self.buf, s.limit());
                if let Some(t) = refill {
                    put_varint(
                        &mut self.buf,
                        zigzag_delta(t.as_u64(), self.sent_at.as_u64()),
                    );
                }
            }
            Payload::Epoch(r) => {
                self.put_key(key);
                self.buf.push(PAYLOAD_EPOCH);
                put_varint(&mut self.buf, r.epoch());
                put_varint(&mut self.buf, r.traffic().len() as u64);
                self.put_entries(r.traffic());
            }
        }
        if self.buf.len() > self.budget {
            self.rollback(m);
            return false;
        }
        true
    }

    fn put_entries(&mut self, entries: &[(NodeId, u64)]) {
        for &(node, count) in entries {
            put_node(&mut self.buf, &mut self.nodes, node);
            put_varint(&mut self.buf, count);
        }
    }

    /// Writes a queue item of `key` with the leading run of `elements`
    /// that fits: all of them unless `partial`. Answers how many were
    /// written, or `None`, writing nothing, when not even one (or, unless
    /// `partial`, not all) fit.
    fn put_queue(
        &mut self,
        key: &'a Key,
        interval: Nanos,
        elements: &[Element],
        partial: bool,
    ) -> Option<usize> {
        let m = self.mark();
        self.put_key(key);
        self.buf.push(PAYLOAD_QUEUE);
        put_varint(&mut self.buf, interval.as_u64());
        let head = self.buf.len();
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let mut prev: Option<&Element> = None;
        let mut n = 0;
        for e in elements {
            let (at, nodes) = (scratch.len(), self.nodes.len());
            let base = prev.map_or(self.sent_at, |p| p.id.birth);
            put_varint(
                &mut scratch,
                zigzag_delta(e.id.birth.as_u64(), base.as_u64()),
            );
            put_node(&mut scratch, &mut self.nodes, e.id.node);
            put_varint(&mut scratch, u64::from(e.id.seq));
            let predicted = predicted_death(prev, e.id.birth, interval);
            put_varint(
                &mut scratch,
                zigzag_delta(e.death.as_u64(), predicted.as_u64()),
            );
            if head + varint_len(n as u64 + 1) + scratch.len() > self.budget {
                scratch.truncate(at);
                self.nodes.truncate(nodes);
                break;
            }
            n += 1;
            prev = Some(e);
        }
        let fits = head + varint_len(n as u64) + scratch.len() <= self.budget;
        let written = if !fits || (n < elements.len() && (!partial || n == 0)) {
            self.rollback(m);
            None
        } else {
            put_varint(&mut self.buf, n as u64);
            self.buf.extend_from_slice(&scratch);
            Some(n)
        };
        self.scratch = scratch;
        written
    }
}

// ---------------------------------------------------------------- reading

/// A cursor over a datagram's bytes; every read is checked.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn u8(&mut self) -> Result<u8, WireError> {
        let (&b, rest) = self.bytes.split_first().ok_or(TRUNCATED)?;
        self.bytes = rest;
        Ok(b)
    }

    /// A fixed-width little-endian `u64` (digest hashes, pull masks).
    fn u64le(&mut self) -> Result<u64, WireError> {
        let bytes: [u8; 8] = self.take(8)?.try_into().map_err(|_| TRUNCATED)?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            if i == 9 && b > 1 {
                return Err(WireError::Malformed("varint overflows 64 bits"));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                if b == 0 && i > 0 {
                    return Err(WireError::Malformed("overlong varint"));
                }
                return Ok(v);
            }
        }
        Err(WireError::Malformed("varint overflows 64 bits"))
    }

    fn take(&mut self, len: u64) -> Result<&'a [u8], WireError> {
        let len = usize::try_from(len).map_err(|_| TRUNCATED)?;
        if len > self.bytes.len() {
            return Err(TRUNCATED);
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(taken)
    }

    fn remaining(&self) -> usize {
        self.bytes.len()
    }

    /// A count of things at least `min_size` bytes each, refused when the
    /// rest of the datagram could not hold them.
    fn count(&mut self, min_size: usize, what: &'static str) -> Result<usize, WireError> {
        let n = self.varint()?;
        bounded_count(n, self.remaining(), min_size).ok_or(WireError::Malformed(what))
    }

    fn finish(self) -> Result<(), WireError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(WireError::Malformed("trailing bytes"))
        }
    }
}

fn bounded_count(n: u64, remaining: usize, min_size: usize) -> Option<usize> {
    usize::try_from(n)
        .ok()
        .filter(|&n| n <= remaining / min_size)
}

/// A datagram's intern tables, as read so far.
struct Tables<'a> {
    limits: Vec<LimitId>,
    domains: Vec<&'a str>,
    nodes: Vec<NodeId>,
}

/// Resolves a reference `k ≥ 1` into `table`.
fn lookup<T: Copy>(table: &[T], k: u64, what: &'static str) -> Result<T, WireError> {
    k.checked_sub(1)
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| table.get(i).copied())
        .ok_or(WireError::Malformed(what))
}

impl<'a> Tables<'a> {
    fn node(&mut self, r: &mut Reader<'a>) -> Result<NodeId, WireError> {
        match r.varint()? {
            0 => {
                let node = NodeId(r.varint()?);
                self.nodes.push(node);
                Ok(node)
            }
            k => lookup(&self.nodes, k, "bad node reference"),
        }
    }

    fn key(&mut self, r: &mut Reader<'a>) -> Result<Key, WireError> {
        let limit = match r.varint()? {
            0 => {
                let limit = LimitId(r.varint()?);
                self.limits.push(limit);
                limit
            }
            k => lookup(&self.limits, k, "bad limit reference")?,
        };
        let domain = match r.varint()? {
            0 => {
                let len = r.varint()?;
                if len > MAX_DOMAIN as u64 {
                    return Err(WireError::Malformed("domain too long"));
                }
                let domain = std::str::from_utf8(r.take(len)?)
                    .map_err(|_| WireError::Malformed("domain is not UTF-8"))?;
                self.domains.push(domain);
                domain
            }
            k => lookup(&self.domains, k, "bad domain reference")?,
        };
        Ok(Key::new(limit, domain))
    }

    /// `(node, count)` entries, strictly increasing by node, no zeros.
    fn entries(&mut self, r: &mut Reader<'a>, n: usize) -> Result<Vec<(NodeId, u64)>, WireError> {
        let mut entries: Vec<(NodeId, u64)> = Vec::with_capacity(n);
        for _ in 0..n {
            let node = self.node(r)?;
            let count = r.varint()?;
            if count == 0 {
                return Err(WireError::Malformed("zero entry"));
            }
            if entries.last().is_some_and(|&(prev, _)| node <= prev) {
                return Err(WireError::Malformed("entries out of order"));
            }
            entries.push((node, count));
        }
        Ok(entries)
    }
}

/// Items up to the end of the body.
fn read_items<'a>(r: &mut Reader<'a>, header: &Header) -> Result<Vec<(Key, Payload)>, WireError> {
    let mut t = Tables {
        limits: Vec::new(),
        domains: Vec::new(),
        nodes: vec![header.from],
    };
    let sent_at = header.sent_at.as_u64();
    let mut items = Vec::new();
    while r.remaining() > 0 {
        let key = t.key(r)?;
        let payload = match r.u8()? {
            PAYLOAD_COUNTER => {
                let head = r.varint()?;
                let n = bounded_count(head >> 1, r.remaining(), MIN_ENTRY)
                    .ok_or(WireError::Malformed("too many counter entries"))?;
                let entries = t.entries(r, n)?;
                let limit = r.varint()?;
                let refill = if head & 1 == 1 {
                    Some(Nanos::new(apply_delta(sent_at, r.varint()?)))
                } else {
                    None
                };
                Payload::Counter(CounterBucketState::from_parts(entries, limit, refill))
            }
            PAYLOAD_QUEUE => {
                let interval = Nanos::new(r.varint()?);
                let n = r.count(MIN_ELEMENT, "too many queue elements")?;
                if n == 0 && !interval.is_zero() {
                    return Err(WireError::Malformed("empty queue with an interval"));
                }
                let mut elements: Vec<Element> = Vec::with_capacity(n);
                for _ in 0..n {
                    let prev = elements.last();
                    let base = prev.map_or(sent_at, |p| p.id.birth.as_u64());
                    let birth = Nanos::new(apply_delta(base, r.varint()?));
                    let node = t.node(r)?;
                    let seq = u32::try_from(r.varint()?)
                        .map_err(|_| WireError::Malformed("element sequence out of range"))?;
                    let id = ElementId { birth, node, seq };
                    if prev.is_some_and(|p| id <= p.id) {
                        return Err(WireError::Malformed("queue elements out of order"));
                    }
                    let predicted = predicted_death(prev, birth, interval);
                    let death = Nanos::new(apply_delta(predicted.as_u64(), r.varint()?));
                    elements.push(Element { id, death });
                }
                Payload::Queue(QueueState::from_elements(interval, elements))
            }
            PAYLOAD_EPOCH => {
                let epoch = r.varint()?;
                let n = r.count(MIN_ENTRY, "too many epoch entries")?;
                let traffic = t.entries(r, n)?;
                Payload::Epoch(EpochReport::from_parts(epoch, traffic))
            }
            _ => return Err(WireError::Malformed("unknown payload kind")),
        };
        items.push((key, payload));
    }
    Ok(items)
}
