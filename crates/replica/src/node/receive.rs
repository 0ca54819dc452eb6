//! The receive path: one datagram in, checked in order (authentication,
//! replay, recipient), then dispatched by kind to the part of the node that
//! handles it.
//!
//! Apart so that the order of the checks, which decides what a forged,
//! replayed or misaddressed datagram can do, reads in one place.

use std::net::SocketAddr;

use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;

use super::{kind, Node, Output, MAX_STREAMS, RELAY_FOR};
use crate::metrics as m;
use crate::wire::{self, Admission, Batch, Body, Header, Message, WireError};

impl Node {
    /// Handles a datagram from `from`: authenticated, checked for its
    /// recipient and for replay, then acted on. Anything wrong is dropped
    /// and counted; nothing here can fail the node.
    pub fn handle_datagram(&mut self, from: SocketAddr, data: &[u8], now: Nanos) -> Output {
        let mut out = Output::default();
        metrics::counter!(m::BYTES_RECEIVED).increment(data.len() as u64);
        let message = match wire::decode(&self.config.key, self.tag, data) {
            Ok(message) => message,
            Err(e) => {
                self.count_drop(e.reason(), 1);
                tracing::debug!(%from, error = %e, "gossip datagram dropped");
                if e == WireError::BadMac {
                    self.unauthenticated(from, data, now, &mut out);
                }
                return out;
            }
        };
        let Message { header, body } = message;
        if !self.is_for_me(&header, &body) {
            self.count_drop(WireError::Misaddressed.reason(), 1);
            tracing::debug!(
                %from,
                to = header.to.0,
                to_incarnation = header.to_incarnation,
                "gossip datagram for another node dropped"
            );
            return out;
        }
        match self
            .replay
            .admit(header.from, header.incarnation, header.seq)
        {
            Admission::Fresh => {}
            Admission::Duplicate => {
                self.count_drop(WireError::Replayed.reason(), 1);
                return out;
            }
            Admission::Outdated { incarnation, top } => {
                self.count_drop("outdated", 1);
                let known = Body::Outdated {
                    incarnation,
                    seq: top,
                };
                self.answer_outdated(from, &header, known, data.len(), now, &mut out);
                return out;
            }
        }
        self.heard_authentic(now);
        metrics::counter!(m::MESSAGES_RECEIVED, "kind" => kind(&body)).increment(1);
        // The sender as membership knows it. Answers go to the address it
        // gave the cluster, never to the one a datagram claims to come
        // from: an authentic datagram raced to this node with a forged
        // source reflects nothing to that source.
        let member = self.member_addr(header.from, header.incarnation);
        let peer = member.unwrap_or(from);
        if let Some(member) = member {
            self.heard.insert(member, now);
        }
        match body {
            Body::Membership(bytes) => {
                if let Err(e) = self.foca.handle_data(&bytes, &mut self.runtime) {
                    self.count_drop("membership", 1);
                    tracing::debug!(%from, error = %e, "membership message refused");
                }
                self.drain_membership(now, &mut out);
            }
            Body::Delta { items } => {
                let absorbed = self.replica.absorb(peer, header.from, items, now);
                // Under origin dissemination a peer sends third nodes'
                // news only as a relay this node asked for: news it did
                // not have otherwise keeps the relay going.
                if !absorbed.relayed.is_empty() && member.is_some() {
                    self.graft(peer, RELAY_FOR.div_floor(2), now, &mut out);
                }
            }
            Body::Digest { at, buckets } => match member {
                Some(member) => self.answer_digest(member, at, buckets, now, &mut out),
                None => self.count_drop("not_a_member", 1),
            },
            Body::Pull { buckets } => match member {
                Some(member) if self.may_repair(member, now) => {
                    let items = self.replica.items_in(buckets, now);
                    self.send_items(member, items, Batch::Repair, now, &mut out);
                }
                Some(_) => self.count_drop("repair_throttled", 1),
                None => self.count_drop("not_a_member", 1),
            },
            Body::Repair { items } => {
                let absorbed = self.replica.absorb(peer, header.from, items, now);
                if !absorbed.late.is_empty() && member.is_some() {
                    self.graft(peer, RELAY_FOR.div_floor(2), now, &mut out);
                }
            }
            Body::Graft { except } => match member {
                Some(member) => {
                    let until = now.saturating_add(RELAY_FOR);
                    if self.replica.graft(member, &except, now, until) {
                        tracing::debug!(peer = %member, "relaying to a member that cannot hear some nodes");
                        // What this node learnt before the graft has not
                        // reached the member: a digest lets it pull that.
                        if self.replica.is_synced() {
                            self.send_digest(member, now, &mut out);
                        }
                    }
                }
                None => self.count_drop("not_a_member", 1),
            },
            Body::FullRequest => match member {
                Some(member) => self.answer_full_request(member, now, &mut out),
                None => self.count_drop("not_a_member", 1),
            },
            Body::Full {
                stream,
                index,
                last,
                items,
            } => {
                self.replica.absorb(peer, header.from, items, now);
                if self.replica.is_synced() {
                    // A member sent its state after a partition, or as
                    // anti-entropy: merged, nothing to count.
                    return out;
                }
                if self.streams.len() >= MAX_STREAMS && !self.streams.contains_key(&(peer, stream))
                {
                    self.streams.clear();
                }
                let seen = self.streams.entry((peer, stream)).or_insert(0);
                *seen = seen.saturating_add(1);
                if last {
                    let complete = *seen == index.saturating_add(1);
                    self.streams.remove(&(peer, stream));
                    metrics::counter!(m::FULL_STATES, "direction" => "received").increment(1);
                    if complete {
                        tracing::info!(peer = %peer, "full state received: deciding");
                        self.replica.set_synced(true);
                        self.streams.clear();
                    }
                    // Otherwise a chunk was lost: the join timer asks
                    // again.
                }
            }
            // Only members are answered: a stranger (or a forged source)
            // gets nothing.
            Body::Ping { t1 } => match member {
                Some(member) => {
                    let t = now;
                    self.send_to_member(member, Body::Pong { t1, t2: t, t3: t }, now, &mut out);
                }
                None => self.count_drop("not_a_member", 1),
            },
            // Only the answer to the last ping sent to that member counts,
            // so a replayed pong cannot fake an offset.
            Body::Pong { t1, t2, t3 }
                if member.is_some_and(|m| self.pings.get(&m) == Some(&t1)) =>
            {
                self.pings.remove(&peer);
                let t = |n: Nanos| i128::from(n.as_u64());
                let offset = ((t(t2) - t(t1)) + (t(t3) - t(now))) / 2;
                self.offsets.insert(peer, offset);
                self.check_clocks();
            }
            Body::Pong { .. } => self.count_drop("unexpected_pong", 1),
            Body::Outdated { incarnation, seq } => {
                self.outdated(from, incarnation, seq, now, &mut out);
            }
            Body::Unauthenticated => {
                // This node shares the key, so its datagram was damaged on
                // the way, or the peer's key changed since.
                tracing::debug!(%from, "a peer could not authenticate a datagram of ours");
            }
        }
        out
    }

    /// Whether a datagram that passed authentication is for this node:
    /// addressed to this very incarnation, or, for the bodies that may be,
    /// to anyone at this address. foca checks membership messages further
    /// (an announce must name this node's address, anything else this
    /// exact identity), so those may also be for an earlier incarnation
    /// (an announce to a member some node saw go down).
    pub(super) fn is_for_me(&self, header: &Header, body: &Body) -> bool {
        if header.is_for(self.config.node, self.incarnation) {
            return true;
        }
        match body {
            Body::Membership(_) => header.is_for_anyone() || header.to == self.config.node,
            Body::Unauthenticated => header.is_for_anyone(),
            _ => false,
        }
    }

    /// The address of the member `node` in `incarnation`, if it is one.
    pub(super) fn member_addr(&self, node: NodeId, incarnation: u64) -> Option<SocketAddr> {
        self.members
            .values()
            .find(|p| p.node == node.0 && p.bump == incarnation)
            .map(|p| p.addr)
    }
}
