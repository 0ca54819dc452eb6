//! Gossip rounds and relays: each class's round of deltas, and, under
//! origin dissemination, grafting members to relay the news of nodes this
//! node cannot hear ([`Body::Graft`]).
//!
//! Apart so that the rule for when a member is out of reach (three probe
//! intervals unheard) and what is asked of the others is one file.

use std::net::SocketAddr;

use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;

#[cfg(doc)]
use super::RELAY_FOR;
use super::{Node, Output};
use crate::deltas::{Class, Dissemination, Round};
use crate::metrics as m;
use crate::wire::{self, Batch, Body};

impl Node {
    pub(super) fn gossip_round(&mut self, class: Class, now: Nanos, out: &mut Output) {
        for round in self.replica.take_round(class, now, &mut self.rng) {
            match round {
                Round::Delta(peer, items) => {
                    metrics::gauge!(m::DELTA_SIZE).set(items.len() as f64);
                    self.send_items(peer, items, Batch::Delta, now, out);
                }
                Round::Resync(peer) => self.send_full(peer, now, out),
            }
        }
    }

    /// Whether `member` was heard from in the last three probe intervals:
    /// every member answers each probe, so one that did not is out of
    /// this node's reach (a partial mesh, a broken link), or down.
    pub(super) fn reachable(&self, member: SocketAddr, now: Nanos) -> bool {
        let recent = self.gap_after();
        self.heard
            .get(&member)
            .is_some_and(|at| now.saturating_sub(*at) <= recent)
    }

    /// How long a member goes unheard before it counts as out of reach:
    /// three probe intervals (also how often a gap's grafts are repeated).
    pub(super) fn gap_after(&self) -> Nanos {
        self.config.probe_interval.saturating_mul(3)
    }

    /// Under origin dissemination, news from a node this node cannot hear
    /// comes only through others: when some member is out of reach, this
    /// node asks every member it hears to relay what it learns of every
    /// node's updates but those it hears itself (which of its members hear
    /// the missing ones it cannot tell, and membership may not even list
    /// them; those that do not hear them have nothing to relay). The
    /// request is repeated every three probe intervals while the gap
    /// lasts, so a lost graft or a relay that restarted is asked again
    /// within seconds. In a full mesh nobody asks, and nothing is relayed.
    pub(super) fn graft_around_gaps(&mut self, now: Nanos, out: &mut Output) {
        if self.replica.dissemination() != Dissemination::Origin {
            return;
        }
        let (heard, gap): (Vec<SocketAddr>, Vec<SocketAddr>) = self
            .members
            .keys()
            .copied()
            .partition(|m| self.reachable(*m, now));
        if gap.is_empty() {
            return;
        }
        let mut heard = heard;
        heard.sort_unstable();
        let every = self.gap_after();
        for peer in heard {
            self.graft(peer, every, now, out);
        }
    }

    /// The nodes whose updates this node hears itself: itself and the
    /// members it heard from lately (at most [`wire::MAX_GRAFT_EXCEPT`];
    /// beyond that, none are named and relays pass on every node's news).
    pub(super) fn heard_nodes(&self, now: Nanos) -> Vec<NodeId> {
        let mut nodes: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(addr, _)| self.reachable(**addr, now))
            .map(|(_, p)| NodeId(p.node))
            .chain(std::iter::once(self.config.node))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        if nodes.len() > wire::MAX_GRAFT_EXCEPT {
            nodes.clear();
        }
        nodes
    }

    /// Asks `peer` to relay to this node, for [`RELAY_FOR`], what it
    /// learns of every node's updates but those this node hears itself.
    /// Asked again only after `every`, unless the nodes it hears changed.
    /// Only under origin dissemination: under the epidemic rule everything
    /// is relayed anyway.
    pub(super) fn graft(&mut self, peer: SocketAddr, every: Nanos, now: Nanos, out: &mut Output) {
        if self.replica.dissemination() != Dissemination::Origin {
            return;
        }
        let except = self.heard_nodes(now);
        if let Some((at, asked)) = self.grafted.get(&peer) {
            if now.saturating_sub(*at) < every && *asked == except {
                return;
            }
        }
        tracing::debug!(%peer, hears = except.len(), "asking a member to relay");
        self.grafted.insert(peer, (now, except.clone()));
        self.grafted.retain(|a, _| self.members.contains_key(a));
        self.send_to_member(peer, Body::Graft { except }, now, out);
    }
}
