//! A TCP fault proxy: listens on a free loopback port and forwards every
//! connection to a target, misbehaving on demand.
//!
//! Put between `tollgate serve --store redis://PROXY` and a real
//! redis-server, it produces the failures a network and a busy Redis
//! produce, at the moment a test chooses:
//!
//! - [`TcpMode::Latency`]: every chunk waits before it is forwarded;
//! - [`TcpMode::Stall`]: nothing is forwarded (bytes wait in the proxy and
//!   the kernel) until the mode changes; a stall longer than the server's
//!   Redis timeout is a slow Redis: the server gives up, and Redis may
//!   still apply the command once the stall ends;
//! - [`TcpMode::Refuse`]: new connections are reset as soon as they are
//!   accepted (existing ones go on);
//! - [`TcpProxy::drop_all`]: every open connection is closed on both sides
//!   (FIN), and what was in flight is lost;
//! - [`TcpProxy::reset_all`]: the same with a reset (RST, `SO_LINGER` 0).
//!
//! One task per connection forwards both directions, each through a delay
//! line: a chunk read at `t` is written at `t + latency`, so latency
//! delays a busy connection without slowing it down chunk after chunk,
//! and a stall holds both directions where they are.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::collections::VecDeque;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::time::Instant;

/// Errors starting a proxy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The proxy's runtime could not be built.
    #[error("cannot start the proxy's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The proxy could not listen.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Where it tried.
        addr: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

/// How the proxy treats traffic now.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TcpMode {
    /// Forward at once.
    Pass,
    /// Forward every chunk after this delay.
    Latency(Duration),
    /// Forward nothing until the mode changes.
    Stall,
    /// Reset new connections at once; open ones behave as in `Pass`.
    Refuse,
}

/// What the proxy did, counted since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TcpStats {
    /// Connections accepted and forwarded.
    pub connections: u64,
    /// Connections refused ([`TcpMode::Refuse`]).
    pub refused: u64,
    /// Times a stall began.
    pub stalls: u64,
    /// Times added latency began.
    pub latencies: u64,
    /// Connections closed by [`TcpProxy::drop_all`].
    pub dropped: u64,
    /// Connections reset by [`TcpProxy::reset_all`].
    pub reset: u64,
    /// Bytes forwarded, both directions.
    pub bytes: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    refused: AtomicU64,
    stalls: AtomicU64,
    latencies: AtomicU64,
    dropped: AtomicU64,
    reset: AtomicU64,
    bytes: AtomicU64,
}

/// How open connections must end: a generation number that grows with
/// every [`TcpProxy::drop_all`] or [`TcpProxy::reset_all`], and whether
/// the last one resets.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
struct Cut {
    generation: u64,
    reset: bool,
}

/// A running TCP fault proxy; stops when dropped.
pub struct TcpProxy {
    addr: SocketAddr,
    target: SocketAddr,
    mode: watch::Sender<TcpMode>,
    cut: watch::Sender<Cut>,
    counters: Arc<Counters>,
    runtime: Option<Runtime>,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards to `target`, in
    /// [`TcpMode::Pass`].
    pub fn start(target: SocketAddr) -> Result<TcpProxy, ProxyError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tcp-fault-proxy")
            .enable_all()
            .build()
            .map_err(ProxyError::Runtime)?;
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .map_err(|source| ProxyError::Bind {
                addr: "127.0.0.1:0".to_owned(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ProxyError::Bind {
            addr: "127.0.0.1:0".to_owned(),
            source,
        })?;
        let (mode, mode_rx) = watch::channel(TcpMode::Pass);
        let (cut, cut_rx) = watch::channel(Cut::default());
        let counters = Arc::new(Counters::default());
        runtime.spawn(accept_loop(
            listener,
            target,
            mode_rx,
            cut_rx,
            Arc::clone(&counters),
        ));
        Ok(TcpProxy {
            addr,
            target,
            mode,
            cut,
            counters,
            runtime: Some(runtime),
        })
    }

    /// Where the proxy listens: what the server is told Redis is.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where it forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Switches the mode; counted as a fault when it starts a stall or a
    /// latency that was not already on.
    pub fn set_mode(&self, mode: TcpMode) {
        let before = *self.mode.borrow();
        match mode {
            TcpMode::Stall if before != TcpMode::Stall => {
                self.counters.stalls.fetch_add(1, Ordering::Relaxed);
            }
            TcpMode::Latency(_) if !matches!(before, TcpMode::Latency(_)) => {
                self.counters.latencies.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        self.mode.send_replace(mode);
    }

    /// The mode now.
    pub fn mode(&self) -> TcpMode {
        *self.mode.borrow()
    }

    /// Closes every open connection on both sides (FIN); what was in
    /// flight in the proxy is lost.
    pub fn drop_all(&self) {
        self.cut_all(false);
    }

    /// Resets every open connection on both sides (RST).
    pub fn reset_all(&self) {
        self.cut_all(true);
    }

    fn cut_all(&self, reset: bool) {
        self.cut.send_modify(|c| {
            c.generation += 1;
            c.reset = reset;
        });
    }

    /// What the proxy did so far.
    pub fn stats(&self) -> TcpStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TcpStats {
            connections: get(&c.connections),
            refused: get(&c.refused),
            stalls: get(&c.stalls),
            latencies: get(&c.latencies),
            dropped: get(&c.dropped),
            reset: get(&c.reset),
            bytes: get(&c.bytes),
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            // Not `drop(rt)`: that blocks, and panics inside another
            // runtime's context.
            rt.shutdown_background();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    mode: watch::Receiver<TcpMode>,
    cut: watch::Receiver<Cut>,
    counters: Arc<Counters>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors, for instance: try again shortly.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if *mode.borrow() == TcpMode::Refuse {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            reset(&client);
            drop(client);
            continue;
        }
        counters.connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(connection(
            client,
            target,
            mode.clone(),
            cut.clone(),
            Arc::clone(&counters),
        ));
    }
}

/// Arms a reset: closing the socket now sends RST instead of FIN.
fn reset(s: &TcpStream) {
    let _ = s.set_zero_linger();
}

/// Forwards one connection until either side closes or the proxy cuts it.
async fn connection(
    mut client: TcpStream,
    target: SocketAddr,
    mode: watch::Receiver<TcpMode>,
    mut cut: watch::Receiver<Cut>,
    counters: Arc<Counters>,
) {
    let born = cut.borrow_and_update().generation;
    let Ok(mut server) = TcpStream::connect(target).await else {
        // The target is down: the client sees its connection reset, as
        // it would connecting to the target itself.
        reset(&client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_r, mut client_w) = client.split();
    let (mut server_r, mut server_w) = server.split();
    let ended = tokio::select! {
        () = pump(&mut client_r, &mut server_w, mode.clone(), &counters) => None,
        () = pump(&mut server_r, &mut client_w, mode.clone(), &counters) => None,
        c = cut_after(&mut cut, born) => Some(c),
    };
    match ended {
        Some(Cut { reset: true, .. }) => {
            reset(client_r.as_ref());
            reset(server_r.as_ref());
            counters.reset.fetch_add(1, Ordering::Relaxed);
        }
        Some(_) => {
            counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
        // One side closed: the other is closed too (Redis's protocol
        // has no use for half-closed connections).
        None => {}
    }
}

/// Waits for the first cut after generation `born`.
async fn cut_after(cut: &mut watch::Receiver<Cut>, born: u64) -> Cut {
    loop {
        let c = *cut.borrow_and_update();
        if c.generation != born {
            return c;
        }
        if cut.changed().await.is_err() {
            // The proxy is gone: no cut will come.
            std::future::pending::<()>().await;
        }
    }
}

/// Chunks a direction holds at most while delayed or stalled; beyond it
/// the proxy stops reading, as a full network buffer would.
const MAX_QUEUED: usize = 1024;

/// Forwards one direction. Each chunk read is due `latency` after it was
/// read, as on a long wire: a busy connection is delayed, not slowed down
/// chunk after chunk. While stalled, nothing is read or written.
async fn pump(
    from: &mut ReadHalf<'_>,
    to: &mut WriteHalf<'_>,
    mut mode: watch::Receiver<TcpMode>,
    counters: &Counters,
) {
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut eof = false;
    loop {
        if eof && queue.is_empty() {
            return;
        }
        let now_mode = *mode.borrow_and_update();
        let stalled = now_mode == TcpMode::Stall;
        let due = queue.front().map(|(at, _)| *at);
        tokio::select! {
            r = from.read(&mut buf), if !stalled && !eof && queue.len() < MAX_QUEUED => match r {
                Ok(n) if n > 0 => {
                    let delay = match now_mode {
                        TcpMode::Latency(d) => d,
                        _ => Duration::ZERO,
                    };
                    queue.push_back((Instant::now() + delay, buf[..n].to_vec()));
                }
                _ => eof = true,
            },
            () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() && !stalled => {
                let Some((_, bytes)) = queue.pop_front() else { continue };
                // Counted before it is written, so a peer that got the
                // bytes sees them counted.
                counters
                    .bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                if to.write_all(&bytes).await.is_err() {
                    return;
                }
            },
            changed = mode.changed() => {
                if changed.is_err() {
                    // The proxy is gone.
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::io::{ErrorKind, Read, Write};

    /// An echo server on a free port, for the proxy to forward to.
    fn echo() -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    fn roundtrip(s: &mut std::net::TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(msg)?;
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got)?;
        Ok(got)
    }

    fn connect(p: &TcpProxy) -> std::net::TcpStream {
        let s = std::net::TcpStream::connect(p.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    }

    #[test]
    fn passes_bytes_both_ways() {
        let p = TcpProxy::start(echo()).unwrap();
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"hello").unwrap(), b"hello");
        assert_eq!(p.stats().connections, 1);
        assert_eq!(p.stats().bytes, 10);
    }

    #[test]
    fn a_stall_holds_bytes_until_it_ends_and_loses_none() {
        let p = TcpProxy::start(echo()).unwrap();
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"a").unwrap(), b"a");
        p.set_mode(TcpMode::Stall);
        s.write_all(b"held").unwrap();
        // Nothing comes back while stalled: a short read timeout expires.
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = [0u8; 4];
        let e = s.read(&mut buf).unwrap_err();
        assert!(matches!(
            e.kind(),
            ErrorKind::WouldBlock | ErrorKind::TimedOut
        ));
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        p.set_mode(TcpMode::Pass);
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"held");
        assert_eq!(p.stats().stalls, 1);
    }

    #[test]
    fn drop_all_closes_and_reset_all_resets_open_connections() {
        let p = TcpProxy::start(echo()).unwrap();
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"x").unwrap(), b"x");
        p.drop_all();
        let mut buf = [0u8; 1];
        assert_eq!(s.read(&mut buf).unwrap(), 0, "closed: end of stream");
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"y").unwrap(), b"y");
        p.reset_all();
        let e = s.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionReset);
        // New connections are unaffected by an earlier cut.
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"z").unwrap(), b"z");
        let st = p.stats();
        assert_eq!((st.dropped, st.reset), (1, 1));
    }

    #[test]
    fn refuse_resets_new_connections_only() {
        let p = TcpProxy::start(echo()).unwrap();
        let mut open = connect(&p);
        assert_eq!(roundtrip(&mut open, b"1").unwrap(), b"1");
        p.set_mode(TcpMode::Refuse);
        let mut s = connect(&p);
        let r = roundtrip(&mut s, b"2");
        assert!(r.is_err(), "a refused connection echoed {r:?}");
        assert_eq!(roundtrip(&mut open, b"3").unwrap(), b"3");
        assert_eq!(p.stats().refused, 1);
        p.set_mode(TcpMode::Pass);
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"4").unwrap(), b"4");
    }

    #[test]
    fn latency_delays_but_delivers() {
        let p = TcpProxy::start(echo()).unwrap();
        p.set_mode(TcpMode::Latency(Duration::from_millis(20)));
        let mut s = connect(&p);
        assert_eq!(roundtrip(&mut s, b"slow").unwrap(), b"slow");
        assert_eq!(p.stats().latencies, 1);
    }
}
