//! Joining (§5.5): asking a member for its whole state, and streaming this
//! node's whole state to a member that asks.
//!
//! Apart because the transfer has its own bounds (one answer per member
//! per [`FULL_REQUEST_EVERY`]) and its own end (the last chunk of a
//! stream), which the join timer in the parent module waits for.

use std::net::SocketAddr;

use tollgate_core::Nanos;

use super::{once_per, Node, Output, FULL_REQUEST_EVERY};
use crate::metrics as m;
use crate::wire::{Batch, Body};

impl Node {
    pub(super) fn send_full(&mut self, peer: SocketAddr, now: Nanos, out: &mut Output) {
        let items = self.replica.full_state(now);
        let stream = self.next_stream;
        self.next_stream = self.next_stream.wrapping_add(1);
        metrics::counter!(m::FULL_STATES, "direction" => "sent").increment(1);
        self.send_items(peer, items, Batch::Full { stream }, now, out);
    }

    /// A member asks for this node's whole state (`from` is its address
    /// as membership knows it). Answered only when this node is synced (a
    /// joining node's state would let the asker start from nothing), only
    /// to members (a forged source gets nothing sent to a stranger), and at
    /// most once per member every two seconds (a full state is large).
    pub(super) fn answer_full_request(&mut self, from: SocketAddr, now: Nanos, out: &mut Output) {
        let reason = if !self.replica.is_synced() {
            Some("not_synced")
        } else if !self.members.contains_key(&from) {
            Some("not_a_member")
        } else if !once_per(
            &mut self.answered,
            from,
            FULL_REQUEST_EVERY,
            now,
            &self.members,
        ) {
            Some("full_request_throttled")
        } else {
            None
        };
        if let Some(reason) = reason {
            self.count_drop(reason, 1);
            return;
        }
        self.send_full(from, now, out);
    }

    pub(super) fn ask_full(&mut self, now: Nanos, out: &mut Output) {
        if self.replica.is_synced() || self.asked.is_some() {
            return;
        }
        // The member after the one asked last, in address order, so a
        // second attempt asks someone else.
        let mut members: Vec<SocketAddr> = self.members.keys().copied().collect();
        members.sort_unstable();
        let Some(&first) = members.first() else {
            return;
        };
        let peer = self
            .last_asked
            .and_then(|last| members.iter().copied().find(|m| *m > last))
            .unwrap_or(first);
        self.last_asked = Some(peer);
        self.asked = Some(peer);
        tracing::info!(%peer, "asking a peer for a full state");
        self.send_to_member(peer, Body::FullRequest, now, out);
    }
}
