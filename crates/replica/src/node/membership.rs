//! Membership: foca's configuration, the seeds (normalized to this node's
//! address family), announces to them, and acting on what foca asks for
//! (sends, timers, members up and down).
//!
//! Apart so that everything that depends on foca, and on how seeds are
//! found and cut, is one file.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::num::NonZeroUsize;
use std::time::Duration;

use foca::OwnedNotification;
use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;

use super::{Node, NodeTimer, Output, Peer, FOCA_PACKET, MAX_SEEDS};
use crate::wire::Body;

impl Node {
    /// Announces this node to every seed that is not a live member, and
    /// answers how many there were. Called at start and every second
    /// after: an announce lost because a seed was not up yet, or the
    /// network was cut, is sent again, so a node that started alone joins
    /// its cluster as soon as a seed answers.
    pub(super) fn announce_to_seeds(&mut self) -> usize {
        let seeds: Vec<SocketAddr> = self
            .config
            .seeds
            .iter()
            .copied()
            .filter(|s| *s != self.config.addr && !self.members.contains_key(s))
            .collect();
        for &seed in &seeds {
            // The seed's id is unknown: announce to a placeholder with its
            // address, which loses to the real identity when it answers.
            let placeholder = Peer {
                addr: seed,
                node: 0,
                bump: 0,
            };
            if let Err(e) = self.foca.announce(placeholder, &mut self.runtime) {
                tracing::debug!(%seed, error = %e, "cannot announce to a seed");
            }
        }
        seeds.len()
    }

    /// Acts on what foca asked for: sends, timers, membership changes.
    pub(super) fn drain_membership(&mut self, now: Nanos, out: &mut Output) {
        while let Some(n) = self.runtime.to_notify() {
            match n {
                OwnedNotification::MemberUp(p) => self.member_up(p, now, out),
                OwnedNotification::MemberDown(p) if self.members.get(&p.addr) == Some(&p) => {
                    tracing::info!(peer = %p.addr, node = p.node, "member down");
                    self.members.remove(&p.addr);
                    self.grafted.remove(&p.addr);
                    self.replica.remove_peer(p.addr);
                    if self.asked == Some(p.addr) {
                        self.asked = None;
                    }
                }
                // A restarted member: its old state is gone, so its delta
                // starts over (it fetches a full state itself).
                OwnedNotification::Rename(before, after)
                    if self.members.remove(&before.addr).is_some() =>
                {
                    self.replica.remove_peer(before.addr);
                    self.member_up(after, now, out);
                }
                // foca renewed this node's identity after it was declared
                // down (a partition): datagrams carry the new incarnation.
                OwnedNotification::Rejoin(me) => {
                    tracing::info!(
                        incarnation = me.bump,
                        "declared down by the cluster: rejoined"
                    );
                    self.incarnation = me.bump;
                }
                OwnedNotification::Defunct if !self.leaving => {
                    tracing::warn!("declared down by the cluster: rejoining");
                    let _ = self.foca.reuse_down_identity();
                }
                _ => {}
            }
        }
        while let Some((peer, data)) = self.runtime.to_send() {
            // A seed not met yet is a placeholder of node 0: anyone there.
            let to = (NodeId(peer.node), peer.bump);
            self.send(peer.addr, to, Body::Membership(data.to_vec()), now, out);
        }
        while let Some((after, timer)) = self.runtime.to_schedule() {
            out.timers.push((after, NodeTimer::Membership(timer)));
        }
        self.ask_full(now, out);
    }

    pub(super) fn member_up(&mut self, peer: Peer, now: Nanos, out: &mut Output) {
        if peer.node == self.config.node.0 && peer.addr != self.config.addr {
            tracing::error!(
                peer = %peer.addr,
                node = peer.node,
                "another member uses this node's id: their grants would be counted as ours"
            );
            self.count_drop("conflicting_node_id", 1);
        }
        tracing::info!(peer = %peer.addr, node = peer.node, "member up");
        let addr = peer.addr;
        self.replica.add_peer(addr);
        self.members.insert(addr, peer);
        // A new member (or a new life of one) is given the probes' grace
        // before it counts as out of reach, and whatever it was asked to
        // relay is asked again: a restarted member relays nothing.
        self.heard.insert(addr, now);
        self.grafted.remove(&addr);
        if self.replica.is_synced() {
            // A member that was away (a partition, a restart, a node that
            // started alone) missed what was granted meanwhile, and its
            // delta starts empty: it gets everything. Both sides of a
            // healed partition do this, so each merges the other's grants.
            self.send_full(addr, now, out);
        }
        self.ask_full(now, out);
    }
}

/// Membership's settings for a cluster of about `size` members: foca's
/// LAN defaults (its piggybacking grows with the size), with faster
/// probes and a 2 s suspicion, packets that fit a datagram, and frequent
/// announces so a node that started alone finds its seeds soon.
pub(super) fn foca_config(size: u32) -> foca::Config {
    let size = NonZeroU32::new(size).unwrap_or(NonZeroU32::MIN);
    let mut config = foca::Config::new_lan(size);
    config.max_packet_size = NonZeroUsize::new(FOCA_PACKET).unwrap_or(NonZeroUsize::MIN);
    config.probe_period = Duration::from_millis(500);
    config.probe_rtt = Duration::from_millis(200);
    config.suspect_to_down_after = Duration::from_secs(2);
    config.periodic_announce = Some(foca::PeriodicParams {
        frequency: Duration::from_secs(2),
        num_members: NonZeroUsize::MIN,
    });
    config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
        frequency: Duration::from_secs(3),
        num_members: NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN),
    });
    config
}

/// `seed` written in `own`'s address family (an IPv4 address plain or
/// mapped into IPv6, as `own` is), or `None` if it is of the other family.
pub(super) fn same_family(seed: SocketAddr, own: SocketAddr) -> Option<SocketAddr> {
    use std::net::IpAddr;
    let ip = match (seed.ip().to_canonical(), own.ip()) {
        (IpAddr::V4(v4), IpAddr::V4(_)) => IpAddr::V4(v4),
        (IpAddr::V4(v4), IpAddr::V6(o)) if o.to_ipv4_mapped().is_some() => {
            IpAddr::V6(v4.to_ipv6_mapped())
        }
        (IpAddr::V6(v6), IpAddr::V6(o)) if o.to_ipv4_mapped().is_none() => IpAddr::V6(v6),
        _ => return None,
    };
    Some(SocketAddr::new(ip, seed.port()))
}

/// `seeds` in `own`'s address family ([`same_family`]), sorted, without
/// duplicates and without `own` (this node's address), cut to
/// [`MAX_SEEDS`]. The family matters because a dual-stack Service lists
/// every pod under both families, this node included, and the node's
/// socket speaks only its advertised address's family.
pub(super) fn normalize_seeds(seeds: Vec<SocketAddr>, own: SocketAddr) -> Vec<SocketAddr> {
    let listed = seeds.len();
    let mut seeds: Vec<SocketAddr> = seeds
        .into_iter()
        .filter_map(|s| same_family(s, own))
        .collect();
    if listed > 0 && seeds.is_empty() {
        tracing::warn!(
            listed,
            own = %own,
            "every seed is of the other address family than --gossip-advertise: none kept"
        );
    }
    seeds.retain(|s| *s != own);
    seeds.sort_unstable();
    seeds.dedup();
    if seeds.len() > MAX_SEEDS {
        tracing::warn!(
            seeds = seeds.len(),
            kept = MAX_SEEDS,
            "more seed peers than a node keeps: the lowest addresses are kept"
        );
        seeds.truncate(MAX_SEEDS);
    }
    seeds
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::same_family;
    use std::net::SocketAddr;

    /// A seed is kept only in the node's own family, written as the
    /// node's own address is (plain IPv4, or IPv4 mapped into IPv6 for a
    /// dual-stack socket).
    #[test]
    fn seeds_are_written_in_the_nodes_own_family() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let v4 = a("10.0.0.1:7946");
        let mapped = a("[::ffff:10.0.0.1]:7946");
        let v6 = a("[fd00::1]:7946");
        let seed_v4 = a("10.0.0.2:7946");
        let seed_mapped = a("[::ffff:10.0.0.2]:7946");
        let seed_v6 = a("[fd00::2]:7946");
        assert_eq!(same_family(seed_v4, v4), Some(seed_v4));
        assert_eq!(same_family(seed_mapped, v4), Some(seed_v4));
        assert_eq!(same_family(seed_v6, v4), None);
        assert_eq!(same_family(seed_v4, mapped), Some(seed_mapped));
        assert_eq!(same_family(seed_v6, mapped), None);
        assert_eq!(same_family(seed_v6, v6), Some(seed_v6));
        assert_eq!(same_family(seed_v4, v6), None);
        assert_eq!(same_family(seed_mapped, v6), None);
    }
}
