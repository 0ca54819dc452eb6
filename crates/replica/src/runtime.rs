//! The node on a real UDP socket: a tokio task that feeds the sans-IO
//! [`Node`] what arrives, the timers it set and the replica's wake-ups,
//! and sends what it asks.
//!
//! # Fault injection
//!
//! Tests cut the network between nodes with a *fault file*: one gossip
//! address per line. Datagrams to or from a listed address are dropped in
//! both directions, as a partition would drop them. The file is re-read
//! every 100 ms; an absent file blocks nothing. It is a local file, not a
//! network surface, so it opens nothing to strangers.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::time::Instant;
use tollgate_core::Nanos;

use crate::metrics as m;
use crate::node::{Node, NodeTimer, Output};
use crate::replica::Replica;

/// Reads the time the node works with: the server's clock, as a function
/// (this crate knows no clock type of its own; the binary passes the
/// server's, shifted by its test hook).
pub type NowFn = Arc<dyn Fn() -> Nanos + Send + Sync>;

/// How often the fault file is re-read.
const FAULT_POLL: Duration = Duration::from_millis(100);

/// Timers ordered by deadline (ties by the order they were set).
#[derive(Default)]
struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    timers: HashMap<u64, NodeTimer>,
    next: u64,
}

impl Timers {
    fn push(&mut self, after: Duration, timer: NodeTimer) {
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        self.heap.push(Reverse((Instant::now() + after, id)));
        self.timers.insert(id, timer);
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    fn pop_due(&mut self, now: Instant) -> Option<NodeTimer> {
        match self.heap.peek() {
            Some(Reverse((at, id))) if *at <= now => {
                let id = *id;
                self.heap.pop();
                self.timers.remove(&id)
            }
            _ => None,
        }
    }
}

/// Runs `node` on `socket` until `stop` turns true, then leaves the
/// cluster. `faults` is the fault file, if any (see the module docs).
/// `seeds`, when given, sends the node new seed lists
/// ([`Node::set_seeds`]): DNS discovery
/// ([`crate::discovery::Discovery::run`]); it stops when the node does.
pub async fn run(
    mut node: Node,
    socket: UdpSocket,
    clock: NowFn,
    mut stop: watch::Receiver<bool>,
    faults: Option<PathBuf>,
    mut seeds: Option<watch::Receiver<Vec<SocketAddr>>>,
) {
    let replica: Arc<Replica> = Arc::clone(node.replica());
    let mut timers = Timers::default();
    let mut blocked: HashSet<SocketAddr> = HashSet::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut fault_tick = tokio::time::interval(FAULT_POLL);
    fault_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if let Some(path) = &faults {
        blocked = read_faults(path);
    }
    let out = node.start(clock());
    apply(&socket, out, &mut timers, &blocked).await;
    loop {
        let deadline = timers
            .next_deadline()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            received = socket.recv_from(&mut buf) => {
                let (n, from) = match received {
                    Ok(r) => r,
                    Err(e) => {
                        // An ICMP "port unreachable" from a peer that is
                        // down surfaces here on some systems: not fatal.
                        tracing::debug!(error = %e, "gossip receive failed");
                        continue;
                    }
                };
                if blocked.contains(&from) {
                    metrics::counter!(m::DROPPED, "reason" => "fault_injected").increment(1);
                    continue;
                }
                let out = node.handle_datagram(from, &buf[..n], clock());
                apply(&socket, out, &mut timers, &blocked).await;
            }
            () = tokio::time::sleep_until(deadline) => {
                let now = Instant::now();
                while let Some(timer) = timers.pop_due(now) {
                    let out = node.handle_timer(timer, clock());
                    apply(&socket, out, &mut timers, &blocked).await;
                }
            }
            () = replica.wake.notified() => {
                let out = node.flush_urgent(clock());
                apply(&socket, out, &mut timers, &blocked).await;
            }
            update = next_seeds(&mut seeds) => match update {
                Some(list) => {
                    let out = node.set_seeds(list, clock());
                    apply(&socket, out, &mut timers, &blocked).await;
                }
                // Discovery ended: the node keeps the seeds it has.
                None => seeds = None,
            },
            _ = fault_tick.tick(), if faults.is_some() => {
                if let Some(path) = &faults {
                    let now = read_faults(path);
                    if now != blocked {
                        tracing::warn!(blocked = ?now, "fault file changed: gossip with these peers is cut");
                        blocked = now;
                    }
                }
            }
            changed = stop.changed() => {
                // A closed channel means the server is gone: stop too.
                if changed.is_ok() && !*stop.borrow() {
                    continue;
                }
                let out = node.leave(clock());
                apply(&socket, out, &mut timers, &blocked).await;
                return;
            }
        }
    }
}

/// The next seed list `seeds` sends; `None` once its sender is gone.
/// Without a receiver, never ready.
async fn next_seeds(
    seeds: &mut Option<watch::Receiver<Vec<SocketAddr>>>,
) -> Option<Vec<SocketAddr>> {
    let Some(rx) = seeds.as_mut() else {
        return std::future::pending().await;
    };
    rx.changed().await.ok()?;
    let list = rx.borrow_and_update().clone();
    Some(list)
}

async fn apply(
    socket: &UdpSocket,
    out: Output,
    timers: &mut Timers,
    blocked: &HashSet<SocketAddr>,
) {
    for (after, timer) in out.timers {
        timers.push(after, timer);
    }
    for (to, bytes) in out.sends {
        if blocked.contains(&to) {
            metrics::counter!(m::DROPPED, "reason" => "fault_injected").increment(1);
            continue;
        }
        if let Err(e) = socket.send_to(&bytes, to).await {
            metrics::counter!(m::DROPPED, "reason" => "send_failed").increment(1);
            tracing::debug!(%to, error = %e, "gossip send failed");
        }
    }
}

fn read_faults(path: &PathBuf) -> HashSet<SocketAddr> {
    std::fs::read_to_string(path)
        .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}
