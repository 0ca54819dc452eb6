//! Anti-entropy: digests of the settled state to a random member heard
//! lately, and answers (repairs and pulls) where digests differ.
//!
//! Apart because it is the backstop for lost datagrams and costs a pass
//! over every key, so its throttle ([`REPAIR_EVERY`]) and its choice of
//! peer are kept together.

use std::net::SocketAddr;

use rand::Rng;
use tollgate_core::Nanos;

use super::{once_per, Node, Output, REPAIR_EVERY};
use crate::digest::Digest;
use crate::metrics as m;
use crate::wire::{Batch, Body};

impl Node {
    /// The member anti-entropy talks to this time: one at random among
    /// those heard from in the last three probe intervals (in a partial
    /// mesh, the ones this node can reach), or among all when none was.
    pub(super) fn anti_entropy_peer(&mut self, now: Nanos) -> Option<SocketAddr> {
        if !self.replica.is_synced() || self.members.is_empty() {
            return None;
        }
        let mut members: Vec<SocketAddr> = self
            .members
            .keys()
            .copied()
            .filter(|m| self.reachable(*m, now))
            .collect();
        if members.is_empty() {
            members = self.members.keys().copied().collect();
        }
        members.sort_unstable();
        Some(members[self.rng.random_range(0..members.len())])
    }

    /// A member's digest: where this node's differs, it sends its keys of
    /// those buckets and pulls the member's. Nothing when they agree.
    pub(super) fn answer_digest(
        &mut self,
        member: SocketAddr,
        at: Nanos,
        buckets: Vec<(u8, u64)>,
        now: Nanos,
        out: &mut Output,
    ) {
        if !self.replica.is_synced() {
            self.count_drop("not_synced", 1);
            return;
        }
        // A digest taken far from this node's time cannot be compared
        // (what is settled differs): a clock this far off is reported
        // unhealthy by the clock checks anyway.
        if at.saturating_sub(now) > self.config.max_clock_skew.max(Nanos::SECOND) {
            self.count_drop("digest_from_the_future", 1);
            return;
        }
        if !self.may_repair(member, now) {
            self.count_drop("repair_throttled", 1);
            return;
        }
        let Some(theirs) = Digest::from_entries(buckets) else {
            self.count_drop("malformed", 1);
            return;
        };
        let differ = self.replica.digest(at).differs(&theirs);
        metrics::counter!(m::ANTI_ENTROPY, "outcome" => if differ == 0 { "agreed" } else { "repaired" })
            .increment(1);
        if differ == 0 {
            return;
        }
        let items = self.replica.items_in(differ, now);
        self.send_items(member, items, Batch::Repair, now, out);
        self.send_to_member(member, Body::Pull { buckets: differ }, now, out);
    }

    /// Whether a member's digest or pull may be answered now (at most once
    /// a [`REPAIR_EVERY`] per member).
    pub(super) fn may_repair(&mut self, member: SocketAddr, now: Nanos) -> bool {
        once_per(&mut self.repaired, member, REPAIR_EVERY, now, &self.members)
    }

    /// Sends `peer` this node's digest, taken now.
    pub(super) fn send_digest(&mut self, peer: SocketAddr, now: Nanos, out: &mut Output) {
        let buckets = self.replica.digest(now).entries().collect();
        self.send_to_member(peer, Body::Digest { at: now, buckets }, now, out);
    }
}
