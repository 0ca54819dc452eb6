//! The message kinds and each kind's body: what a datagram says once it is
//! decrypted.
//!
//! Apart from the framing ([`super::datagram`]) so that adding or changing a
//! message touches this file alone: its [`Body`] variant, its kind number,
//! and its arm in [`put_body`] and [`read_body`]. Item bodies (delta, full
//! state, repair) write their items through [`super::items`].

use tollgate_core::replicated::strategy::Payload;
use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;
use tollgate_store::Key;

use super::bytes::{put_varint, Reader};
use super::header::Header;
use super::items::{put_all_items, read_items};
use super::WireError;
#[cfg(doc)]
use super::MAX_MEMBERSHIP;

const KIND_MEMBERSHIP: u8 = 1;
pub(super) const KIND_DELTA: u8 = 2;
const KIND_FULL_REQUEST: u8 = 3;
pub(super) const KIND_FULL: u8 = 4;
const KIND_PING: u8 = 5;
const KIND_PONG: u8 = 6;
const KIND_OUTDATED: u8 = 7;
const KIND_UNAUTHENTICATED: u8 = 8;
const KIND_DIGEST: u8 = 9;
const KIND_PULL: u8 = 10;
pub(super) const KIND_REPAIR: u8 = 11;
const KIND_GRAFT: u8 = 12;

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

/// The head of a [`Body::Full`] chunk: its stream, its index and whether
/// it is the last.
pub(super) fn put_full_meta(out: &mut Vec<u8>, stream: u64, index: u32, last: bool) {
    put_varint(out, stream);
    put_varint(out, u64::from(index));
    out.push(u8::from(last));
}

/// Writes `body`: its kind, then what that kind carries (the plaintext
/// of a datagram), interning items against `header`.
pub(super) fn put_body(out: &mut Vec<u8>, header: &Header, body: &Body) -> Result<(), WireError> {
    out.push(body.kind());
    match body {
        Body::Membership(bytes) => {
            put_varint(out, bytes.len() as u64);
            out.extend_from_slice(bytes);
        }
        Body::Delta { items } => put_all_items(out, header, items)?,
        Body::FullRequest => {}
        Body::Full {
            stream,
            index,
            last,
            items,
        } => {
            put_full_meta(out, *stream, *index, *last);
            put_all_items(out, header, items)?;
        }
        Body::Ping { t1 } => put_varint(out, t1.as_u64()),
        Body::Pong { t1, t2, t3 } => {
            for t in [t1, t2, t3] {
                put_varint(out, t.as_u64());
            }
        }
        Body::Outdated { incarnation, seq } => {
            put_varint(out, *incarnation);
            put_varint(out, *seq);
        }
        Body::Unauthenticated => {}
        Body::Graft { except } => {
            put_varint(out, except.len() as u64);
            for n in except {
                put_varint(out, n.0);
            }
        }
        Body::Digest { at, buckets } => {
            put_varint(out, at.as_u64());
            put_varint(out, buckets.len() as u64);
            for (b, h) in buckets {
                out.push(*b);
                out.extend_from_slice(&h.to_le_bytes());
            }
        }
        Body::Pull { buckets } => out.extend_from_slice(&buckets.to_le_bytes()),
        Body::Repair { items } => put_all_items(out, header, items)?,
    }
    Ok(())
}

/// Reads a decrypted body strictly: a known kind, what it carries, and
/// no trailing bytes.
pub(super) fn read_body(mut r: Reader<'_>, header: &Header) -> Result<Body, WireError> {
    let body = match r.u8()? {
        KIND_MEMBERSHIP => {
            let len = r.varint()?;
            Body::Membership(r.take(len)?.to_vec())
        }
        KIND_DELTA => Body::Delta {
            items: read_items(&mut r, header)?,
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
                items: read_items(&mut r, header)?,
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
            items: read_items(&mut r, header)?,
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
    Ok(body)
}
