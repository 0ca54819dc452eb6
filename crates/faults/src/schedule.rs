//! Seeded fault schedules: from a `u64` seed, a reproducible sequence of
//! client operations and faults for the chaos suite to play against real
//! processes.
//!
//! A schedule names things by index (server 0, resource 1, the hold in
//! slot 7), and the suite maps indices to what exists when the step runs:
//! slot 7 of three live holds is the second one. The steps are a pure
//! function of the seed and the [`Profile`], so a seed always replays the
//! same steps; what the processes answer, and so which hold slot 7 picks,
//! may differ between runs as real processes race. A failing seed is
//! therefore a strong hint, replayed many times if need be, not a
//! deterministic replay of one interleaving.

use crate::Rng;

/// Which system a schedule exercises.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Family {
    /// Servers on one redis-server, each through its own TCP fault proxy.
    Redis,
    /// Servers on a Redis Cluster (no proxy: see the suite's docs).
    RedisCluster,
    /// A `serve --cluster` gossip cluster through a UDP fault mesh.
    Gossip,
}

/// The shape of a schedule.
#[derive(Clone, Debug)]
pub struct Profile {
    /// What runs.
    pub family: Family,
    /// `tollgate serve` processes (gossip nodes).
    pub servers: usize,
    /// Redis nodes (1, or a cluster's masters).
    pub redis_nodes: usize,
    /// Copy-limited resources (none in a gossip cluster).
    pub copy_resources: usize,
    /// Rate-limited resources.
    pub rate_resources: usize,
    /// Domains clients use.
    pub domains: usize,
    /// Steps to draw.
    pub steps: usize,
}

/// Which proxy a fault hits.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FaultTarget {
    /// The proxy of one server.
    One(usize),
    /// Every proxy.
    All,
}

/// How a client makes its call.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// Waits for the answer before the next step.
    Wait,
    /// Runs in a thread of its own; the schedule goes on at once.
    Background,
    /// Sends the request and closes its connection at once, without
    /// reading the answer: a client that vanished mid-call.
    Abandon,
}

/// A client operation. `hold`, `transfer` and `session` are slots,
/// resolved modulo what exists when the step runs (nothing: skipped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `POST /v1/reserve`.
    Reserve {
        /// Which copy resource.
        resource: usize,
        /// Which domain.
        domain: usize,
        /// Copies asked.
        copies: u64,
        /// Fewest accepted.
        min_copies: u64,
        /// The hold's lease.
        lease_ms: u64,
    },
    /// `POST /v1/release` of some copies of a hold.
    Release {
        /// Hold slot.
        hold: u64,
        /// Copies (capped at what the hold holds).
        copies: u64,
    },
    /// `DELETE /v1/holds/{id}`.
    Delete {
        /// Hold slot.
        hold: u64,
    },
    /// `POST /v1/transfer`.
    Transfer {
        /// Hold slot.
        hold: u64,
        /// Copies (capped at what the hold holds).
        copies: u64,
        /// The transfer's TTL.
        ttl_ms: u64,
    },
    /// `POST /v1/seize` of a transfer made earlier.
    Seize {
        /// Transfer slot.
        transfer: u64,
        /// The new hold's lease.
        lease_ms: u64,
    },
    /// `POST /v1/seize` of a transfer id nobody issued (a stranger).
    SeizeUnknown {
        /// The made-up id.
        id: u128,
    },
    /// `POST /v1/holds/{id}/renew`.
    Renew {
        /// Hold slot.
        hold: u64,
        /// The new lease.
        lease_ms: u64,
    },
    /// `POST /v1/request`.
    Rate {
        /// Which rate resource.
        resource: usize,
        /// Which domain.
        domain: usize,
        /// Hits asked.
        hits: u64,
    },
    /// `count` rate requests for as many new domains (`first` on): a
    /// flood of unique keys.
    Flood {
        /// Which rate resource.
        resource: usize,
        /// The first new domain's number.
        first: u64,
        /// How many.
        count: u64,
    },
    /// Opens a native gRPC session.
    SessionOpen,
    /// A reserve on a session.
    SessionReserve {
        /// Session slot.
        session: u64,
        /// Which copy resource.
        resource: usize,
        /// Which domain.
        domain: usize,
        /// Copies asked (all or nothing).
        copies: u64,
    },
    /// A release of what a session holds.
    SessionRelease {
        /// Session slot.
        session: u64,
        /// Copies (capped at what is held).
        copies: u64,
    },
    /// A transfer out of a session.
    SessionTransfer {
        /// Session slot.
        session: u64,
        /// Copies (capped at what is held).
        copies: u64,
        /// The transfer's TTL.
        ttl_ms: u64,
    },
    /// A seize into a session.
    SessionSeize {
        /// Session slot.
        session: u64,
        /// Transfer slot.
        transfer: u64,
    },
    /// `Close` on a session: its holds are released.
    SessionClose {
        /// Session slot.
        session: u64,
    },
    /// The session's connection is cut without a `Close`, right after a
    /// reserve was sent: the server must release what it holds.
    SessionDrop {
        /// Session slot.
        session: u64,
    },
}

/// A fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Added latency on a Redis proxy for a while.
    Latency {
        /// Which proxy.
        target: FaultTarget,
        /// Per chunk.
        ms: u64,
        /// How long.
        for_ms: u64,
    },
    /// A Redis proxy forwards nothing for a while (longer than the
    /// server's Redis timeout).
    Stall {
        /// Which proxy.
        target: FaultTarget,
        /// How long.
        for_ms: u64,
    },
    /// A Redis proxy refuses new connections for a while.
    Refuse {
        /// Which proxy.
        target: FaultTarget,
        /// How long.
        for_ms: u64,
    },
    /// A Redis proxy closes every open connection.
    Drop {
        /// Which proxy.
        target: FaultTarget,
    },
    /// A Redis proxy resets every open connection.
    Reset {
        /// Which proxy.
        target: FaultTarget,
    },
    /// `DEBUG SLEEP` on a Redis node: Redis itself stalls.
    RedisSleep {
        /// Which node.
        node: usize,
        /// How long.
        ms: u64,
    },
    /// `SHUTDOWN NOSAVE` and a fresh start: Redis loses everything.
    RedisRestartEmpty {
        /// Which node.
        node: usize,
    },
    /// SIGKILL of a server.
    KillServer {
        /// Which server.
        server: usize,
    },
    /// A killed server starts again.
    RestartServer {
        /// Which server.
        server: usize,
    },
    /// The gossip network misbehaves for a while (rates per mille).
    Gossip {
        /// Dropped.
        loss: u64,
        /// Delivered twice.
        duplicate: u64,
        /// Held back.
        reorder: u64,
        /// An earlier datagram again.
        replay: u64,
        /// An earlier datagram to another node.
        replay_elsewhere: u64,
        /// How long.
        for_ms: u64,
    },
    /// The gossip network is cut in two for a while: `side[i]` is node
    /// `i`'s side.
    Partition {
        /// Each node's side.
        side: Vec<usize>,
        /// How long.
        for_ms: u64,
    },
}

/// One step of a schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A client calls a server.
    Client {
        /// Which server.
        server: usize,
        /// What.
        op: Op,
        /// How.
        call: Call,
    },
    /// Something breaks.
    Fault(Fault),
    /// Time passes (leases run, gossip flows).
    Pause {
        /// How long.
        ms: u64,
    },
}

/// Draws the schedule of `seed` for `profile`.
pub fn generate(seed: u64, profile: &Profile) -> Vec<Step> {
    // The profile's family is mixed in so that one seed gives unrelated
    // schedules to different families.
    let salt = match profile.family {
        Family::Redis => 0x5eed_0001,
        Family::RedisCluster => 0x5eed_0002,
        Family::Gossip => 0x5eed_0003,
    };
    let mut rng = Rng::new(seed ^ salt);
    let mut steps = Vec::with_capacity(profile.steps + 8);
    let servers = profile.servers.max(1);
    let mut down = vec![false; servers];
    // (step index at which to restart, server)
    let mut restarts: Vec<(usize, usize)> = Vec::new();
    let mut flood_next = 0u64;
    // Client steps left that are likely to give up (see `give_up`).
    let mut impatient = 0u64;
    for i in 0..profile.steps {
        while let Some(pos) = restarts.iter().position(|(at, _)| *at <= i) {
            let (_, server) = restarts.swap_remove(pos);
            down[server] = false;
            steps.push(Step::Fault(Fault::RestartServer { server }));
        }
        let up: Vec<usize> = (0..servers).filter(|s| !down[*s]).collect();
        let kind = rng.weighted(&weights(profile.family));
        let step = match kind {
            0 => {
                let mut step = client_step(&mut rng, profile, &up, &mut flood_next);
                if impatient > 0 {
                    impatient -= 1;
                    give_up(&mut rng, &mut step);
                }
                step
            }
            1 => {
                let f = fault(&mut rng, profile);
                // Clients give up on a slow server: the next few calls
                // that move copies are likely to be abandoned mid-call,
                // while the store call they started is still in flight.
                if matches!(
                    f,
                    Fault::Latency { .. } | Fault::Stall { .. } | Fault::RedisSleep { .. }
                ) {
                    impatient = rng.range(1, 4);
                }
                Step::Fault(f)
            }
            2 => {
                // A kill, if another server stays up to serve.
                if up.len() < 2 {
                    Step::Pause {
                        ms: rng.range(10, 200),
                    }
                } else {
                    let server = up[rng.index(up.len())];
                    down[server] = true;
                    restarts.push((i + rng.range(1, 6) as usize, server));
                    Step::Fault(Fault::KillServer { server })
                }
            }
            _ => Step::Pause {
                ms: rng.range(10, 400),
            },
        };
        steps.push(step);
    }
    restarts.sort_unstable();
    for (_, server) in restarts {
        steps.push(Step::Fault(Fault::RestartServer { server }));
    }
    steps
}

/// Weights of: a client step, a fault, a server kill, a pause.
fn weights(family: Family) -> [u64; 4] {
    match family {
        Family::Redis => [70, 18, 3, 9],
        Family::RedisCluster => [75, 10, 4, 11],
        Family::Gossip => [70, 14, 4, 12],
    }
}

fn call(rng: &mut Rng) -> Call {
    match rng.weighted(&[70, 15, 15]) {
        0 => Call::Wait,
        1 => Call::Background,
        _ => Call::Abandon,
    }
}

/// Makes a call that releases, deletes or transfers copies vanish
/// mid-call, one time in two.
fn give_up(rng: &mut Rng, step: &mut Step) {
    if let Step::Client {
        op: Op::Release { .. } | Op::Delete { .. } | Op::Transfer { .. },
        call,
        ..
    } = step
    {
        if rng.chance(500) {
            *call = Call::Abandon;
        }
    }
}

fn client_step(rng: &mut Rng, p: &Profile, up: &[usize], flood_next: &mut u64) -> Step {
    let server = up[rng.index(up.len())];
    let domain = rng.index(p.domains.max(1));
    let copies_res = rng.index(p.copy_resources.max(1));
    let rate_res = rng.index(p.rate_resources.max(1));
    let slot = rng.next_u64() >> 1;
    let op = if p.copy_resources == 0 {
        // A gossip cluster limits rates only.
        if rng.chance(40) {
            let count = rng.range(20, 120);
            let first = *flood_next;
            *flood_next += count;
            Op::Flood {
                resource: rate_res,
                first,
                count,
            }
        } else {
            Op::Rate {
                resource: rate_res,
                domain,
                hits: rng.range(1, 2),
            }
        }
    } else {
        match rng.weighted(&[22, 10, 8, 8, 7, 4, 5, 8, 1, 6, 8, 4, 3, 3, 4, 4]) {
            0 => Op::Reserve {
                resource: copies_res,
                domain,
                copies: rng.range(1, 3),
                min_copies: rng.range(0, 1),
                lease_ms: rng.range(1500, 4000),
            },
            1 => Op::Release {
                hold: slot,
                copies: rng.range(1, 2),
            },
            2 => Op::Delete { hold: slot },
            3 => Op::Transfer {
                hold: slot,
                copies: rng.range(1, 2),
                ttl_ms: rng.range(300, 2000),
            },
            4 => Op::Seize {
                transfer: slot,
                lease_ms: rng.range(1500, 4000),
            },
            5 => Op::SeizeUnknown {
                id: (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64()),
            },
            6 => Op::Renew {
                hold: slot,
                lease_ms: rng.range(1500, 4000),
            },
            7 => Op::Rate {
                resource: rate_res,
                domain,
                hits: 1,
            },
            8 => {
                let count = rng.range(10, 60);
                let first = *flood_next;
                *flood_next += count;
                Op::Flood {
                    resource: rate_res,
                    first,
                    count,
                }
            }
            9 => Op::SessionOpen,
            10 => Op::SessionReserve {
                session: slot,
                resource: copies_res,
                domain,
                copies: rng.range(1, 2),
            },
            11 => Op::SessionRelease {
                session: slot,
                copies: 1,
            },
            12 => Op::SessionTransfer {
                session: slot,
                copies: 1,
                ttl_ms: rng.range(300, 2000),
            },
            13 => Op::SessionSeize {
                session: slot,
                transfer: rng.next_u64() >> 1,
            },
            14 => Op::SessionClose { session: slot },
            _ => Op::SessionDrop { session: slot },
        }
    };
    // Session operations run in order on their stream; the way a call
    // ends is drawn for HTTP calls only.
    let call = match op {
        Op::SessionOpen
        | Op::SessionReserve { .. }
        | Op::SessionRelease { .. }
        | Op::SessionTransfer { .. }
        | Op::SessionSeize { .. }
        | Op::SessionClose { .. }
        | Op::SessionDrop { .. }
        | Op::Flood { .. } => Call::Wait,
        _ => call(rng),
    };
    Step::Client { server, op, call }
}

fn target(rng: &mut Rng, p: &Profile) -> FaultTarget {
    if rng.chance(300) {
        FaultTarget::All
    } else {
        FaultTarget::One(rng.index(p.servers.max(1)))
    }
}

fn fault(rng: &mut Rng, p: &Profile) -> Fault {
    match p.family {
        Family::Redis => match rng.weighted(&[20, 22, 8, 10, 10, 20, 2]) {
            // Latency stays under half the suite's Redis timeout (300 ms),
            // so a round trip never times out because of it (stalls are
            // the slow Redis): it widens the window in which a client that
            // vanishes catches a call in flight.
            0 => Fault::Latency {
                target: target(rng, p),
                ms: rng.range(10, 120),
                for_ms: rng.range(300, 1500),
            },
            1 => Fault::Stall {
                target: target(rng, p),
                for_ms: rng.range(400, 1500),
            },
            2 => Fault::Refuse {
                target: target(rng, p),
                for_ms: rng.range(200, 1200),
            },
            3 => Fault::Drop {
                target: target(rng, p),
            },
            4 => Fault::Reset {
                target: target(rng, p),
            },
            5 => Fault::RedisSleep {
                node: 0,
                ms: rng.range(400, 1200),
            },
            _ => Fault::RedisRestartEmpty { node: 0 },
        },
        Family::RedisCluster => Fault::RedisSleep {
            node: rng.index(p.redis_nodes.max(1)),
            ms: rng.range(400, 1200),
        },
        Family::Gossip => {
            if rng.chance(300) {
                let n = p.servers.max(1);
                // A non-trivial cut: node 0 on side 0, someone on side 1.
                let mut side: Vec<usize> = (0..n).map(|_| rng.index(2)).collect();
                side[0] = 0;
                if n > 1 && side.iter().all(|s| *s == 0) {
                    side[1 + rng.index(n - 1)] = 1;
                }
                Fault::Partition {
                    side,
                    for_ms: rng.range(500, 3000),
                }
            } else {
                Fault::Gossip {
                    loss: rng.range(0, 400),
                    duplicate: rng.range(0, 300),
                    reorder: rng.range(0, 300),
                    replay: rng.range(0, 200),
                    replay_elsewhere: rng.range(0, 200),
                    for_ms: rng.range(300, 3000),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redis() -> Profile {
        Profile {
            family: Family::Redis,
            servers: 2,
            redis_nodes: 1,
            copy_resources: 2,
            rate_resources: 1,
            domains: 3,
            steps: 200,
        }
    }

    #[test]
    fn a_seed_always_gives_the_same_schedule() {
        assert_eq!(generate(42, &redis()), generate(42, &redis()));
        assert_ne!(generate(42, &redis()), generate(43, &redis()));
    }

    #[test]
    fn every_killed_server_is_restarted_and_one_always_serves() {
        for seed in 0..200 {
            let steps = generate(seed, &redis());
            let mut down = [false; 2];
            for s in &steps {
                match s {
                    Step::Fault(Fault::KillServer { server }) => {
                        assert!(!down[*server]);
                        down[*server] = true;
                        assert!(down.iter().any(|d| !d), "seed {seed}: every server down");
                    }
                    Step::Fault(Fault::RestartServer { server }) => {
                        assert!(down[*server]);
                        down[*server] = false;
                    }
                    Step::Client { server, .. } => {
                        assert!(!down[*server], "seed {seed}: a call to a killed server");
                    }
                    _ => {}
                }
            }
            assert_eq!(down, [false; 2], "seed {seed}");
        }
    }

    #[test]
    fn the_kinds_of_step_all_occur() {
        let steps: Vec<Step> = (0..20).flat_map(|s| generate(s, &redis())).collect();
        let has = |f: &dyn Fn(&Step) -> bool| steps.iter().any(f);
        assert!(has(&|s| matches!(s, Step::Fault(Fault::Stall { .. }))));
        assert!(has(&|s| matches!(
            s,
            Step::Fault(Fault::RedisRestartEmpty { .. })
        )));
        assert!(has(&|s| matches!(
            s,
            Step::Client {
                call: Call::Abandon,
                ..
            }
        )));
        assert!(has(&|s| matches!(
            s,
            Step::Client {
                op: Op::SessionDrop { .. },
                ..
            }
        )));
        assert!(has(&|s| matches!(
            s,
            Step::Client {
                op: Op::SeizeUnknown { .. },
                ..
            }
        )));
        let gossip = Profile {
            family: Family::Gossip,
            servers: 3,
            copy_resources: 0,
            ..redis()
        };
        let steps: Vec<Step> = (0..20).flat_map(|s| generate(s, &gossip)).collect();
        assert!(steps
            .iter()
            .any(|s| matches!(s, Step::Fault(Fault::Partition { .. }))));
        assert!(steps.iter().all(|s| !matches!(
            s,
            Step::Client {
                op: Op::Reserve { .. },
                ..
            }
        )));
    }
}
