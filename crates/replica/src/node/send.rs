//! The send path: the next header (sequence number, recipient), sealing
//! through the wire codec, and counting what was sent by kind.
//!
//! Apart so that every datagram leaves through one place, where the
//! recipient rule (answers go only to members, at the address membership
//! knows them by) and the counts are applied.

use std::net::SocketAddr;

use tollgate_core::replicated::strategy::Payload;
use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;
use tollgate_store::Key;

use super::{kind, Node, Output};
use crate::metrics as m;
use crate::wire::{self, Batch, Body, Header};

impl Node {
    /// The header of the next datagram, for `to` in `to_incarnation`.
    pub(super) fn header(&mut self, now: Nanos, to: NodeId, to_incarnation: u64) -> Header {
        self.seq = self.seq.wrapping_add(1);
        Header {
            cluster: self.tag,
            from: self.config.node,
            incarnation: self.incarnation,
            seq: self.seq,
            sent_at: now,
            to,
            to_incarnation,
        }
    }

    /// The identity datagrams to the member at `addr` are addressed to;
    /// `None` (counted) when it is not a member: only members are sent
    /// gossip, full states and answers.
    pub(super) fn recipient(&mut self, addr: SocketAddr) -> Option<(NodeId, u64)> {
        let to = self.members.get(&addr).map(|p| (NodeId(p.node), p.bump));
        if to.is_none() {
            self.count_drop("not_a_member", 1);
        }
        to
    }

    pub(super) fn send_to_member(
        &mut self,
        addr: SocketAddr,
        body: Body,
        now: Nanos,
        out: &mut Output,
    ) {
        if let Some(to) = self.recipient(addr) {
            self.send(addr, to, body, now, out);
        }
    }

    pub(super) fn send(
        &mut self,
        addr: SocketAddr,
        (to, to_incarnation): (NodeId, u64),
        body: Body,
        now: Nanos,
        out: &mut Output,
    ) {
        let header = self.header(now, to, to_incarnation);
        let kind = kind(&body);
        match wire::encode(&self.config.key, &header, &body) {
            Ok(bytes) => {
                metrics::counter!(m::MESSAGES_SENT, "kind" => kind).increment(1);
                metrics::counter!(m::BYTES_SENT).increment(bytes.len() as u64);
                // Anti-entropy and relay requests are state gossip; the
                // rest (membership, probes, notices) is counted apart.
                if matches!(
                    body,
                    Body::Digest { .. }
                        | Body::Pull { .. }
                        | Body::Repair { .. }
                        | Body::Graft { .. }
                ) {
                    self.sent.gossip_datagrams += 1;
                    self.sent.gossip_bytes += bytes.len() as u64;
                } else {
                    self.sent.other_datagrams += 1;
                    self.sent.other_bytes += bytes.len() as u64;
                }
                out.sends.push((addr, bytes));
            }
            Err(e) => {
                self.count_drop(e.reason(), 1);
                tracing::warn!(%addr, error = %e, "cannot encode a gossip message");
            }
        }
    }

    /// Sends `items` to `to` as `batch` (deltas, repairs, or the chunks of
    /// a full state), in as many datagrams as they need.
    pub(super) fn send_items(
        &mut self,
        to: SocketAddr,
        items: Vec<(Key, Payload)>,
        batch: Batch,
        now: Nanos,
        out: &mut Output,
    ) {
        let full = matches!(batch, Batch::Full { .. });
        if items.is_empty() && !full {
            return;
        }
        let Some((node, incarnation)) = self.recipient(to) else {
            return;
        };
        let template = self.header(now, node, incarnation);
        let mut seq = self.seq;
        let packed = wire::encode_items(&self.config.key, &template, &mut seq, batch, &items);
        self.sent.gossip_updates += items.iter().map(|(_, p)| p.updates() as u64).sum::<u64>();
        self.seq = seq;
        if packed.dropped > 0 {
            self.count_drop("unencodable", packed.dropped as u64);
        }
        let kind = match batch {
            Batch::Full { .. } => "full",
            Batch::Repair => "repair",
            Batch::Delta => "delta",
        };
        for bytes in packed.datagrams {
            metrics::counter!(m::MESSAGES_SENT, "kind" => kind).increment(1);
            metrics::counter!(m::BYTES_SENT).increment(bytes.len() as u64);
            self.sent.gossip_datagrams += 1;
            self.sent.gossip_bytes += bytes.len() as u64;
            out.sends.push((to, bytes));
        }
    }
}
