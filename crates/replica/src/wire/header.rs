//! The part of a datagram before its body: the header and the salt, sent
//! in the clear and authenticated as the AEAD's associated data.
//!
//! Apart because the header is read twice and trusted differently: before
//! the AEAD (to find the key's nonce, and in [`unauthenticated_header`] to
//! decide how to answer a datagram that failed authentication), and after
//! it, when every field is authentic. The cluster tag is here as well: it
//! is the one header field checked before anything else.

use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;

use super::bytes::{put_varint, varint_len, Reader};
#[cfg(doc)]
use super::ReplayGuard;
use super::{WireError, FIXED_HEADER, MAGIC, MAX_DATAGRAM, SALT_LEN, VERSION};

/// The tag of a cluster's name that every datagram carries: the stable
/// hash ([`tollgate_core::hash`], FNV-1a-64) of its UTF-8 bytes, so every
/// process of every version computes the same tag. It tells clusters
/// apart; it is not secret and authenticates nothing.
pub const fn cluster_tag(name: &str) -> u64 {
    tollgate_core::hash::fnv1a64(name.as_bytes())
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

/// The header after the fixed part (magic, version, cluster tag).
pub(super) fn read_header(r: &mut Reader<'_>, cluster: u64) -> Result<Header, WireError> {
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
    let mut r = Reader::new(bytes.get(FIXED_HEADER..)?);
    read_header(&mut r, cluster).ok()
}

/// Writes the clear part of a datagram, the header and a fresh random
/// salt, and answers its length (where the plaintext starts).
pub(super) fn put_clear(out: &mut Vec<u8>, h: &Header) -> usize {
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

pub(super) fn header_len(h: &Header, seq: u64) -> usize {
    FIXED_HEADER
        + varint_len(h.from.0)
        + varint_len(h.incarnation)
        + varint_len(seq)
        + varint_len(h.sent_at.as_u64())
        + varint_len(h.to.0)
        + varint_len(h.to_incarnation)
}
