//! A UDP fault mesh for a gossip cluster: one socket per node, each the
//! address that node advertises (`tollgate serve --gossip-advertise`).
//!
//! A gossip node tells its peers apart by the source address of what they
//! send, and answers to it. So a proxy in front of each node is not
//! enough: node B would see the proxy, not node A, as the sender. The mesh
//! keeps every node's identity: a datagram node A sends to B's advertised
//! address `P_B` leaves the mesh from A's advertised address `P_A`, to
//! B's real socket. B sees it come from `P_A`, A's identity, and answers
//! there, which the mesh forwards to A from `P_B`. Node `i`'s real socket
//! is its `--gossip` address, given with [`UdpMesh::set_node`] (again
//! after a restart on a new port).
//!
//! Faults apply per datagram, per link (sender, receiver):
//!
//! - loss: dropped;
//! - duplication: delivered twice;
//! - reordering: held back a few milliseconds, so later ones overtake it;
//! - replay: an earlier datagram of the same link is delivered again;
//! - replay elsewhere: an earlier datagram of a link A→B is delivered to a
//!   third node C, from A's address (what an attacker on the path can do);
//! - partitions: links between nodes of different groups drop everything.
//!
//! Datagrams from an address that is not a node's are dropped and
//! counted. Decisions come from a seeded [`Rng`], so one seed gives one
//! sequence of decisions (the arrival order of datagrams is the
//! network's, not the seed's).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::runtime::Runtime;

use crate::tcp::ProxyError;
use crate::Rng;

/// Datagrams kept per link for replays.
const HISTORY: usize = 32;

/// Fault rates, in per mille of datagrams, and how long a reordered one
/// is held back at most.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct UdpFaults {
    /// Dropped.
    pub loss: u64,
    /// Delivered twice.
    pub duplicate: u64,
    /// Held back up to `max_delay`.
    pub reorder: u64,
    /// Followed by an earlier datagram of the same link.
    pub replay: u64,
    /// Followed by an earlier datagram of this link, sent to another node.
    pub replay_elsewhere: u64,
    /// The longest a reordered datagram is held.
    pub max_delay: Duration,
}

/// What the mesh did, counted since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams forwarded (duplicates and replays included).
    pub forwarded: u64,
    /// Dropped as lost.
    pub lost: u64,
    /// Delivered a second time.
    pub duplicated: u64,
    /// Held back.
    pub reordered: u64,
    /// Earlier datagrams delivered again to their own receiver.
    pub replayed: u64,
    /// Earlier datagrams delivered to another node.
    pub replayed_elsewhere: u64,
    /// Dropped by a partition.
    pub partitioned: u64,
    /// From an address that is no node's.
    pub unknown_source: u64,
}

#[derive(Default)]
struct Counters {
    forwarded: AtomicU64,
    lost: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    replayed: AtomicU64,
    replayed_elsewhere: AtomicU64,
    partitioned: AtomicU64,
    unknown_source: AtomicU64,
}

struct State {
    /// Each node's real gossip socket, once known.
    real: Vec<Option<SocketAddr>>,
    faults: UdpFaults,
    /// Each node's side of the partition; all equal when healed.
    side: Vec<usize>,
    /// Recent datagrams per link, `history[from][to]`.
    history: Vec<Vec<VecDeque<Vec<u8>>>>,
    rng: Rng,
}

/// What to do with one datagram, decided under the lock and carried out
/// after it.
struct Verdict {
    sends: Vec<(usize, SocketAddr, Vec<u8>, Duration)>,
}

/// A running mesh; stops when dropped.
pub struct UdpMesh {
    advertised: Vec<SocketAddr>,
    state: Arc<Mutex<State>>,
    counters: Arc<Counters>,
    runtime: Option<Runtime>,
}

impl UdpMesh {
    /// Binds one loopback socket per node (`n` nodes), forwarding nothing
    /// until nodes are set, with no faults, decisions drawn from `seed`.
    pub fn start(n: usize, seed: u64) -> Result<UdpMesh, ProxyError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("udp-fault-mesh")
            .enable_all()
            .build()
            .map_err(ProxyError::Runtime)?;
        let mut sockets = Vec::with_capacity(n);
        for _ in 0..n {
            let s = runtime
                .block_on(UdpSocket::bind("127.0.0.1:0"))
                .map_err(|source| ProxyError::Bind {
                    addr: "127.0.0.1:0 (udp)".to_owned(),
                    source,
                })?;
            sockets.push(Arc::new(s));
        }
        let advertised = sockets
            .iter()
            .map(|s| s.local_addr())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| ProxyError::Bind {
                addr: "127.0.0.1:0 (udp)".to_owned(),
                source,
            })?;
        let state = Arc::new(Mutex::new(State {
            real: vec![None; n],
            faults: UdpFaults::default(),
            side: vec![0; n],
            history: vec![vec![VecDeque::new(); n]; n],
            rng: Rng::new(seed),
        }));
        let counters = Arc::new(Counters::default());
        for (i, _) in sockets.iter().enumerate() {
            runtime.spawn(receive_loop(
                i,
                sockets.clone(),
                Arc::clone(&state),
                Arc::clone(&counters),
            ));
        }
        Ok(UdpMesh {
            advertised,
            state,
            counters,
            runtime: Some(runtime),
        })
    }

    /// Node `i`'s advertised address: pass it as `--gossip-advertise`, and
    /// as the seed other nodes name in `--peers`.
    pub fn advertised(&self, i: usize) -> SocketAddr {
        self.advertised[i]
    }

    /// Where node `i` really listens (its `--gossip` address).
    pub fn set_node(&self, i: usize, real: SocketAddr) {
        self.lock().real[i] = Some(real);
    }

    /// Sets the fault rates (all zero: a perfect network).
    pub fn set_faults(&self, faults: UdpFaults) {
        self.lock().faults = faults;
    }

    /// Cuts the nodes into groups: `side[i]` is node `i`'s group, and only
    /// nodes of one group hear each other. Nodes not listed are in group 0.
    pub fn partition(&self, side: &[usize]) {
        let mut s = self.lock();
        for (i, g) in s.side.iter_mut().enumerate() {
            *g = side.get(i).copied().unwrap_or(0);
        }
    }

    /// Ends any partition.
    pub fn heal(&self) {
        let mut s = self.lock();
        s.side.iter_mut().for_each(|g| *g = 0);
    }

    /// No faults and no partition.
    pub fn calm(&self) {
        let mut s = self.lock();
        s.faults = UdpFaults::default();
        s.side.iter_mut().for_each(|g| *g = 0);
    }

    /// What the mesh did so far.
    pub fn stats(&self) -> UdpStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        UdpStats {
            forwarded: get(&c.forwarded),
            lost: get(&c.lost),
            duplicated: get(&c.duplicated),
            reordered: get(&c.reordered),
            replayed: get(&c.replayed),
            replayed_elsewhere: get(&c.replayed_elsewhere),
            partitioned: get(&c.partitioned),
            unknown_source: get(&c.unknown_source),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Plain data, consistent after every statement.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for UdpMesh {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Receives what nodes send to node `to`'s advertised address.
async fn receive_loop(
    to: usize,
    sockets: Vec<Arc<UdpSocket>>,
    state: Arc<Mutex<State>>,
    counters: Arc<Counters>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let Ok((n, source)) = sockets[to].recv_from(&mut buf).await else {
            // ICMP errors from a node that is down surface here.
            continue;
        };
        let verdict = {
            let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
            decide(&mut s, &counters, source, to, &buf[..n])
        };
        for (from, dest, bytes, delay) in verdict.sends {
            let socket = Arc::clone(&sockets[from]);
            let counters = Arc::clone(&counters);
            let send = async move {
                // Counted before it is sent, so a receiver that got it sees
                // it counted; a failed send takes it back.
                counters.forwarded.fetch_add(1, Ordering::Relaxed);
                if socket.send_to(&bytes, dest).await.is_err() {
                    counters.forwarded.fetch_sub(1, Ordering::Relaxed);
                }
            };
            if delay.is_zero() {
                send.await;
            } else {
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    send.await;
                });
            }
        }
    }
}

/// Decides what becomes of one datagram from `source` to node `to`.
fn decide(s: &mut State, c: &Counters, source: SocketAddr, to: usize, bytes: &[u8]) -> Verdict {
    let mut verdict = Verdict { sends: Vec::new() };
    let Some(from) = s.real.iter().position(|r| *r == Some(source)) else {
        c.unknown_source.fetch_add(1, Ordering::Relaxed);
        return verdict;
    };
    let Some(dest) = s.real[to] else {
        // The receiver has not started yet: as if it were down.
        c.lost.fetch_add(1, Ordering::Relaxed);
        return verdict;
    };
    if s.side[from] != s.side[to] {
        c.partitioned.fetch_add(1, Ordering::Relaxed);
        return verdict;
    }
    let f = s.faults;
    // Replays draw from what came before this datagram.
    if !s.history[from][to].is_empty() && s.rng.chance(f.replay) {
        let h = &s.history[from][to];
        let old = h[s.rng.index(h.len())].clone();
        c.replayed.fetch_add(1, Ordering::Relaxed);
        verdict.sends.push((from, dest, old, Duration::ZERO));
    }
    if !s.history[from][to].is_empty() && s.rng.chance(f.replay_elsewhere) {
        let others: Vec<usize> = (0..s.real.len())
            .filter(|&k| k != from && k != to && s.real[k].is_some())
            .collect();
        if !others.is_empty() {
            let k = others[s.rng.index(others.len())];
            let h = &s.history[from][to];
            let old = h[s.rng.index(h.len())].clone();
            if let Some(elsewhere) = s.real[k] {
                c.replayed_elsewhere.fetch_add(1, Ordering::Relaxed);
                verdict.sends.push((from, elsewhere, old, Duration::ZERO));
            }
        }
    }
    let h = &mut s.history[from][to];
    if h.len() == HISTORY {
        h.pop_front();
    }
    h.push_back(bytes.to_vec());
    if s.rng.chance(f.loss) {
        c.lost.fetch_add(1, Ordering::Relaxed);
        return verdict;
    }
    let delay = if s.rng.chance(f.reorder) {
        c.reordered.fetch_add(1, Ordering::Relaxed);
        let max = u64::try_from(f.max_delay.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(s.rng.range(1, max.max(1)))
    } else {
        Duration::ZERO
    };
    verdict.sends.push((from, dest, bytes.to_vec(), delay));
    if s.rng.chance(f.duplicate) {
        c.duplicated.fetch_add(1, Ordering::Relaxed);
        verdict
            .sends
            .push((from, dest, bytes.to_vec(), Duration::ZERO));
    }
    verdict
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::net::UdpSocket as StdSocket;

    fn node() -> StdSocket {
        let s = StdSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    }

    fn recv(s: &StdSocket) -> (Vec<u8>, SocketAddr) {
        let mut buf = [0u8; 1500];
        let (n, from) = s.recv_from(&mut buf).unwrap();
        (buf[..n].to_vec(), from)
    }

    #[test]
    fn a_datagram_arrives_from_the_senders_advertised_address() {
        let mesh = UdpMesh::start(2, 1).unwrap();
        let (a, b) = (node(), node());
        mesh.set_node(0, a.local_addr().unwrap());
        mesh.set_node(1, b.local_addr().unwrap());
        a.send_to(b"ping", mesh.advertised(1)).unwrap();
        let (got, from) = recv(&b);
        assert_eq!((got.as_slice(), from), (&b"ping"[..], mesh.advertised(0)));
        // The answer to that address reaches a, from b's identity.
        b.send_to(b"pong", from).unwrap();
        let (got, from) = recv(&a);
        assert_eq!((got.as_slice(), from), (&b"pong"[..], mesh.advertised(1)));
        assert_eq!(mesh.stats().forwarded, 2);
    }

    #[test]
    fn duplication_and_replay_deliver_again_and_a_partition_drops() {
        let mesh = UdpMesh::start(3, 2).unwrap();
        let (a, b, c) = (node(), node(), node());
        for (i, s) in [&a, &b, &c].iter().enumerate() {
            mesh.set_node(i, s.local_addr().unwrap());
        }
        mesh.set_faults(UdpFaults {
            duplicate: 1000,
            ..UdpFaults::default()
        });
        a.send_to(b"1", mesh.advertised(1)).unwrap();
        assert_eq!(recv(&b).0, b"1");
        assert_eq!(recv(&b).0, b"1");
        mesh.set_faults(UdpFaults {
            replay: 1000,
            replay_elsewhere: 1000,
            ..UdpFaults::default()
        });
        a.send_to(b"2", mesh.advertised(1)).unwrap();
        // The replay of "1" comes before "2"; c gets "1" from a's address.
        assert_eq!(recv(&b).0, b"1");
        assert_eq!(recv(&b).0, b"2");
        assert_eq!(recv(&c), (b"1".to_vec(), mesh.advertised(0)));
        mesh.calm();
        mesh.partition(&[0, 1, 1]);
        a.send_to(b"cut", mesh.advertised(1)).unwrap();
        b.send_to(b"same side", mesh.advertised(2)).unwrap();
        assert_eq!(recv(&c).0, b"same side");
        // The cut datagram went through another of the mesh's sockets,
        // maybe after this one: wait until it is counted.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while mesh.stats().partitioned == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let st = mesh.stats();
        assert_eq!(
            (
                st.duplicated,
                st.replayed,
                st.replayed_elsewhere,
                st.partitioned
            ),
            (1, 1, 1, 1)
        );
    }

    #[test]
    fn strangers_are_dropped() {
        let mesh = UdpMesh::start(1, 3).unwrap();
        let a = node();
        mesh.set_node(0, a.local_addr().unwrap());
        let stranger = node();
        stranger.send_to(b"x", mesh.advertised(0)).unwrap();
        // Sent from the node itself to its own address: forwarded, after
        // the stranger's, which was counted and dropped.
        a.send_to(b"self", mesh.advertised(0)).unwrap();
        assert_eq!(recv(&a).0, b"self");
        assert_eq!(mesh.stats().unknown_source, 1);
    }
}
