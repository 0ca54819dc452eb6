//! Processes a test starts: free loopback ports to give them, a guard that
//! kills a child when the test ends (also when it panics), and a wait
//! until a started server answers.
//!
//! The crate-specific harnesses (redis-server in `tollgate-redis`,
//! PostgreSQL in `tollgate-configapi`, `tollgate serve` in the binary's
//! tests) build on these, so each knows only how to start and ask its own
//! program.

use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::ops::{Deref, DerefMut};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// How often [`wait_ready`] asks again.
const READY_POLL: Duration = Duration::from_millis(20);

/// A free TCP port on loopback. The listener is dropped just before use:
/// a clash with another process in that instant makes the start fail
/// loudly (or the harness retries), never a test pass wrongly.
///
/// # Panics
///
/// When no loopback port can be bound at all.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback TCP port: {e}"))
}

/// A loopback address where nothing listens, for tests of what a client
/// does when a server cannot be reached: a port free on `127.0.0.2`,
/// bound and released. Not on `127.0.0.1`, where the servers the tests
/// start bind their free ports: one of them could take the port in the
/// meantime and answer (a flaky CI run did). A connection to it is
/// refused.
///
/// # Panics
///
/// When no such port can be bound at all.
pub fn refused_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.2:0")
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("no free port on 127.0.0.2: {e}"))
}

/// A free UDP address on loopback (bound, then released), for a gossip
/// socket a test must name before the node starts.
///
/// # Panics
///
/// When no loopback port can be bound at all.
pub fn free_udp_addr() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .unwrap_or_else(|e| panic!("no free loopback UDP port: {e}"))
}

/// Whether something accepts TCP connections at `addr` (within a second).
pub fn accepts(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
}

/// Waits until `ready` holds for the server `child` runs: `Err` says
/// why not, that the child exited (and how) or that `within` passed
/// first, for the harness to add the server's log.
pub fn wait_ready(
    child: &mut Child,
    within: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("it exited ({status})"));
        }
        if ready() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("no answer within {within:?}"));
        }
        std::thread::sleep(READY_POLL);
    }
}

/// Sends signal `name` (`TERM`, `STOP`, `CONT`...) to process `pid`;
/// whether `kill` did.
pub fn signal(pid: u32, name: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success())
}

/// A child process that is killed (SIGKILL) and reaped when the guard is
/// dropped, so a failing test leaves no server behind. Derefs to the
/// [`Child`] for `id`, `try_wait` and its pipes.
#[derive(Debug)]
pub struct KillOnDrop(Child);

impl KillOnDrop {
    /// Spawns `cmd` under a guard.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<KillOnDrop> {
        cmd.spawn().map(KillOnDrop)
    }

    /// Guards a child already spawned.
    pub fn new(child: Child) -> KillOnDrop {
        KillOnDrop(child)
    }
}

impl Deref for KillOnDrop {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
