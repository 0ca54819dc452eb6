//! Who the node trusts and answers: datagrams that fail authentication (a
//! likely different secret, [`AUTH_GRACE`]), answers to senders that have
//! not proved they are members, and senders from an earlier life
//! ([`Body::Outdated`]).
//!
//! Apart because these are the paths a stranger can reach: each answer is
//! throttled and never larger than what it answers.

use std::net::SocketAddr;

use tollgate_core::Nanos;

use super::{kind, Node, Output, Peer, AUTH_GRACE};
use crate::metrics as m;
#[cfg(doc)]
use crate::wire::Admission;
use crate::wire::{self, Body, Header, ANYONE};

impl Node {
    /// A datagram passed every check: this node shares its cluster's key.
    pub(super) fn heard_authentic(&mut self, now: Nanos) {
        self.last_authentic = Some(now);
        if self.replica.key_mismatch() {
            self.check_key(now);
        }
    }

    /// A datagram from `from` failed authentication. From a seed or a
    /// member, it is evidence of a key mismatch ([`Node::check_key`]).
    /// An announce to anyone at this address (what a node that does not
    /// know this one yet sends its seeds) is answered with
    /// [`Body::Unauthenticated`], so a node with another secret hears a
    /// datagram it cannot authenticate from its seed even when the seed
    /// does not know it (it would otherwise hear nothing at all, as if its
    /// seed were down). The answer is bounded: at most once a second per
    /// address, never larger than the datagram it answers, and sealed
    /// like every other, so it tells a stranger nothing but that a node
    /// of the cluster listens here.
    pub(super) fn unauthenticated(
        &mut self,
        from: SocketAddr,
        data: &[u8],
        now: Nanos,
        out: &mut Output,
    ) {
        let known = self.config.seeds.contains(&from) || self.members.contains_key(&from);
        if known {
            self.last_unauthenticated = Some(now);
            self.check_key(now);
        }
        if self.unauthenticated_warnings.allow(from, now) {
            tracing::warn!(
                peer = %from,
                known,
                "a datagram of this cluster failed authentication: its sender has another \
                 cluster secret (or forged it); it cannot be a member"
            );
        }
        let to_anyone = wire::unauthenticated_header(data).is_some_and(|h| h.is_for_anyone());
        if to_anyone && self.unauthenticated_answers.allow(from, now) {
            let header = self.header(now, ANYONE, 0);
            self.answer(from, &header, &Body::Unauthenticated, data.len(), out);
        }
    }

    /// Whether this node is cut off from its cluster by a different
    /// secret: for [`AUTH_GRACE`] it authenticated nothing, and what it
    /// heard since from its seeds and members failed authentication. A node
    /// whose seeds are simply not up yet heard nothing from them, and
    /// stays ready once it decides alone; a datagram that authenticates
    /// clears the verdict at once.
    pub(super) fn check_key(&mut self, now: Nanos) {
        let since = self.last_authentic.unwrap_or(self.started_at);
        let mismatch = self.last_unauthenticated.is_some_and(|bad| bad >= since)
            && now.saturating_sub(since) >= AUTH_GRACE;
        if mismatch != self.replica.key_mismatch() {
            if mismatch {
                // Names the flags, never the secret.
                tracing::error!(
                    seeds = ?self.config.seeds,
                    cluster = %self.config.cluster,
                    "every datagram from this node's seeds and members fails authentication \
                     and none has authenticated: this node's cluster secret most likely differs \
                     from theirs (compare --cluster-secret-file or TOLLGATE_CLUSTER_SECRET, and \
                     --cluster, on every node); it is cut off from its cluster and reports itself \
                     not ready"
                );
            } else {
                tracing::info!(
                    "a datagram of the cluster authenticated: the cluster secret matches"
                );
            }
        }
        self.replica.set_key_mismatch(mismatch);
        metrics::gauge!(m::KEY_MISMATCH).set(if mismatch { 1.0 } else { 0.0 });
    }

    /// Tells the sender of an authentic datagram from an earlier life than
    /// one seen of it ([`Admission::Outdated`]) which incarnation this node
    /// knows (`known`, a [`Body::Outdated`]): a sender that restarted with a smaller (or equal) boot stamp
    /// then takes a larger one ([`Node::outdated`]). The sender has not
    /// proved it is who it claims (the datagram may be a replay with a
    /// forged source), so the answer goes where the datagram came from,
    /// addressed to the life it claims, at most once a second per sender
    /// and never larger than the datagram it answers.
    pub(super) fn answer_outdated(
        &mut self,
        from: SocketAddr,
        stale: &Header,
        known: Body,
        len: usize,
        now: Nanos,
        out: &mut Output,
    ) {
        if !self.outdated_answers.allow(stale.from, now) {
            return;
        }
        let header = self.header(now, stale.from, stale.incarnation);
        self.answer(from, &header, &known, len, out);
    }

    /// Sends `body` to `to`, which has not proved it is a member, only if
    /// it is no larger than the `len` bytes it answers: whoever forged the
    /// source of that datagram gets no more bytes sent to its victim than
    /// it sent itself.
    pub(super) fn answer(
        &mut self,
        to: SocketAddr,
        header: &Header,
        body: &Body,
        len: usize,
        out: &mut Output,
    ) {
        match wire::encode(&self.config.key, header, body) {
            Ok(bytes) if bytes.len() <= len => {
                metrics::counter!(m::MESSAGES_SENT, "kind" => kind(body)).increment(1);
                metrics::counter!(m::BYTES_SENT).increment(bytes.len() as u64);
                self.sent.other_datagrams += 1;
                self.sent.other_bytes += bytes.len() as u64;
                out.sends.push((to, bytes));
            }
            Ok(_) => self.count_drop("answer_too_large", 1),
            Err(e) => self.count_drop(e.reason(), 1),
        }
    }

    /// A peer says it has seen `seen` (up to sequence number `seen_seq`)
    /// of this node, from an earlier life than this one: this node
    /// restarted with a boot stamp no larger than before (its clock was
    /// stepped back, or it restarted within one stamp), and its peers
    /// refuse it. It takes the next incarnation and announces itself
    /// again. A live node that has itself sent `seen_seq` in `seen` ignores
    /// it: the notice answers a replay of one of its own datagrams.
    pub(super) fn outdated(
        &mut self,
        from: SocketAddr,
        seen: u64,
        seen_seq: u64,
        now: Nanos,
        out: &mut Output,
    ) {
        let earlier_life =
            seen > self.incarnation || (seen == self.incarnation && seen_seq > self.seq);
        if !earlier_life {
            self.count_drop("outdated_notice", 1);
            return;
        }
        let Some(next) = seen.max(self.incarnation).checked_add(1) else {
            tracing::error!(
                seen,
                "a peer knows this node at the last incarnation there is"
            );
            return;
        };
        tracing::warn!(
            peer = %from,
            seen,
            stamp = self.incarnation,
            incarnation = next,
            "a peer knows a later life of this node than its boot stamp (its clock was stepped \
             back, or it restarted within one stamp): rejoining with a larger incarnation"
        );
        self.incarnation = next;
        let me = Peer {
            addr: self.config.addr,
            node: self.config.node.0,
            bump: next,
        };
        if let Err(e) = self.foca.change_identity(me, &mut self.runtime) {
            tracing::debug!(error = %e, "cannot change identity");
        }
        // The peer that told us may not be a seed: announce to it too.
        let placeholder = Peer {
            addr: from,
            node: ANYONE.0,
            bump: 0,
        };
        if let Err(e) = self.foca.announce(placeholder, &mut self.runtime) {
            tracing::debug!(peer = %from, error = %e, "cannot announce to a peer");
        }
        self.announce_to_seeds();
        self.drain_membership(now, out);
    }
}
