//! Packing many items into as many datagrams as they need
//! ([`encode_items`]): deltas, repairs and the chunks of a full-state
//! transfer.
//!
//! Apart from [`super::datagram`] because it is a policy on top of the
//! format, not part of it: greedy packing in order, each datagram's byte
//! budget computed from its own header, and a queue too large for one
//! datagram split into runs of its elements.

use tollgate_core::replicated::queue::Element;
use tollgate_core::replicated::strategy::Payload;
use tollgate_store::Key;

use super::bytes::varint_len;
use super::header::{header_len, put_clear, Header};
use super::items::{check_key, ItemWriter};
use super::message::{put_full_meta, KIND_DELTA, KIND_FULL, KIND_REPAIR};
use super::seal::{seal, ClusterKey};
#[cfg(doc)]
use super::{Body, MAX_DOMAIN};
use super::{MAX_DATAGRAM, OVERHEAD, TAG_LEN};

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
        if w.put_queue(k, q.generation(), q.interval(), &elements, false)
            .is_some()
        {
            continue;
        }
        if !w.is_empty() {
            next_chunk(&mut w, &mut chunks);
            if w.put_queue(k, q.generation(), q.interval(), &elements, false)
                .is_some()
            {
                continue;
            }
        }
        // Too large for a datagram of its own: runs of elements, each
        // filling a datagram.
        let mut rest = &elements[..];
        loop {
            match w.put_queue(k, q.generation(), q.interval(), rest, true) {
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
