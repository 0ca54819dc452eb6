//! The gRPC port's connections, handed to tonic's
//! `serve_with_incoming_shutdown`: counted against the port's cap from
//! accept to close, TLS handshakes done here under the handshake timeout
//! (tonic's own TLS has none by default, and would leave the bytes after
//! the handshake out of reach), and the HTTP/2 preface required within the
//! header timeout of the connection being ready, so a socket that says
//! nothing cannot hold a place under the cap.
//!
//! Once the preface is in, the connection is tonic's: there is no idle
//! timeout, because session streams are idle by design between
//! operations. A client that vanished fails the server's HTTP/2 pings
//! (`keepalive_interval`, `keepalive_timeout`) and its connection closes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

use super::handshake::{linger, Handshakes};
use super::{accept_failed, timed_out, ConnectionLimits, Gate, Io, Permit, Throttle};

/// What a client sends first on HTTP/2: `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
const PREFACE_LEN: usize = 24;

/// The connections of `tcp` (TCP options already set on it), with TLS
/// when `tls` is given, under `limits`. Accepting runs in a task of its
/// own until tonic drops the stream, which closes the port.
pub fn incoming(
    tcp: TcpIncoming,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: &ConnectionLimits,
) -> impl Stream<Item = std::io::Result<GrpcIo>> + Send + 'static {
    let gate = Gate::new("grpc", limits.max_connections);
    let (ready, rx) = mpsc::channel(64);
    tokio::spawn(accept(
        tcp,
        gate,
        tls.map(TlsAcceptor::from),
        limits.clone(),
        ready,
    ));
    ReceiverStream::new(rx).map(Ok)
}

async fn accept(
    mut tcp: TcpIncoming,
    gate: Gate,
    acceptor: Option<TlsAcceptor>,
    limits: ConnectionLimits,
    ready: mpsc::Sender<GrpcIo>,
) {
    let errors = Throttle::new(std::time::Duration::from_secs(10));
    let handshakes = acceptor
        .as_ref()
        .map(|_| Arc::new(Handshakes::new(gate.listener())));
    loop {
        let next = tokio::select! {
            next = tcp.next() => next,
            // tonic stopped: drop the listener, closing the port.
            () = ready.closed() => return,
        };
        let stream = match next {
            None => return,
            Some(Err(e)) => {
                accept_failed(&errors, gate.listener(), &e).await;
                continue;
            }
            Some(Ok(stream)) => stream,
        };
        let Some(permit) = gate.admit() else {
            continue;
        };
        let info = stream.connect_info();
        let Some(acceptor) = &acceptor else {
            let io = GrpcIo::new(Io::Plain(stream), info, &limits, permit);
            if ready.send(io).await.is_err() {
                return;
            }
            continue;
        };
        // In a task of its own, so a slow handshake holds up no other.
        let (acceptor, ready, limits) = (acceptor.clone(), ready.clone(), limits.clone());
        let handshakes = handshakes.clone();
        tokio::spawn(async move {
            let peer = info.remote_addr;
            let tls = tokio::time::timeout(
                limits.handshake_timeout,
                acceptor.accept(stream).into_fallible(),
            );
            let tls = match tls.await {
                Ok(Ok(tls)) => tls,
                Ok(Err((e, tcp))) => {
                    if let Some(h) = &handshakes {
                        h.failed(peer, &e);
                    }
                    linger(tcp).await;
                    drop(permit);
                    return;
                }
                Err(_) => {
                    timed_out("grpc", "handshake");
                    tracing::debug!(?peer, "TLS handshake timed out");
                    return;
                }
            };
            let io = GrpcIo::new(Io::Tls(Box::new(tls)), info, &limits, permit);
            let _ = ready.send(io).await;
        });
    }
}

/// One connection of the gRPC port, as tonic serves it.
pub struct GrpcIo {
    io: Io,
    info: TcpConnectInfo,
    /// Until the preface is in: its deadline and the bytes still due.
    preface: Option<(Pin<Box<Sleep>>, usize)>,
    _permit: Permit,
}

impl GrpcIo {
    fn new(io: Io, info: TcpConnectInfo, limits: &ConnectionLimits, permit: Permit) -> GrpcIo {
        GrpcIo {
            io,
            info,
            preface: Some((
                Box::pin(tokio::time::sleep(limits.header_timeout)),
                PREFACE_LEN,
            )),
            _permit: permit,
        }
    }
}

/// The TCP addresses, whether or not TLS runs over them
/// (`Request::remote_addr` finds them).
impl Connected for GrpcIo {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for GrpcIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        let Some((deadline, due)) = &mut this.preface else {
            return polled;
        };
        match polled {
            Poll::Ready(Ok(())) => {
                *due = due.saturating_sub(buf.filled().len() - before);
                if *due == 0 {
                    this.preface = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                this.preface = None;
                timed_out("grpc", "header");
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no HTTP/2 preface within the header timeout",
                )))
            }
            other => other,
        }
    }
}

crate::listen::write_through!(GrpcIo);
