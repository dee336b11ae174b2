//! The UDP listener: batched receives, the fast path answered inline, the
//! general path inline for our own zones and in a task for forwarded names,
//! and batched sends.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use hickory_server::net::NetError;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::ResponseCode;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

use super::Shared;
use super::handler::{Deliver, Responder, answerable, precheck};
use crate::{ServeError, mmsg};

/// Largest UDP datagram we read. EDNS(0) (RFC 6891) allows up to 65535 bytes;
/// a query is never that large, so anything longer is truncated by the kernel
/// and then fails to parse.
const UDP_BUFFER: usize = 4096;

/// Serves `socket` until `shutdown` is cancelled or the socket fails.
pub(super) async fn listen(
    shared: &Arc<Shared>,
    socket: Arc<UdpSocket>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> Result<(), ServeError> {
    let mut bufs = vec![vec![0u8; UDP_BUFFER]; mmsg::BATCH];
    let mut outs: Vec<Vec<u8>> = (0..mmsg::BATCH).map(|_| Vec::with_capacity(512)).collect();
    let mut received = Vec::with_capacity(mmsg::BATCH);
    let mut replies = Vec::with_capacity(mmsg::BATCH);
    let (mut generation, mut zones) = shared.live.current();
    loop {
        match mmsg::recv(&socket, &mut bufs, &mut received) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                tokio::select! {
                    ready = socket.readable() => ready.map_err(ServeError::Udp)?,
                    () = shutdown.cancelled() => return Ok(()),
                }
                continue;
            }
            Err(err) if transient(&err) => {
                debug!(%err, "UDP receive error");
                continue;
            }
            Err(err) => return Err(ServeError::Udp(err)),
        }
        if shared.live.generation() != generation {
            (generation, zones) = shared.live.current();
        }
        replies.clear();
        for (i, &(len, src)) in received.iter().enumerate() {
            let packet = &bufs[i][..len];
            if !answerable(src) {
                shared.metrics.drop("source");
                continue;
            }
            if let Err(reason) = precheck(packet) {
                shared.metrics.drop(reason);
                continue;
            }
            if zones.fast.answer(packet, Protocol::Udp, &mut outs[i]) {
                shared.metrics.queries.inc();
                replies.push((i, src));
                continue;
            }
            general(shared, &socket, packet, src, tracker).await;
        }
        flush(shared, &socket, &outs, &replies).await;
        if shutdown.is_cancelled() {
            return Ok(());
        }
        if received.len() == mmsg::BATCH {
            tokio::task::yield_now().await;
        }
    }
}

/// Sends the fast path's replies of one batch, waiting (bounded by the
/// request timeout) only if the socket buffer is full.
async fn flush(
    shared: &Shared,
    socket: &UdpSocket,
    outs: &[Vec<u8>],
    replies: &[(usize, SocketAddr)],
) {
    let mut done = 0;
    // Every round moves `done` forward by at least one.
    while done < replies.len() {
        match mmsg::send(socket, outs, &replies[done..]) {
            Ok(sent) if sent > 0 => {
                for _ in 0..sent {
                    shared.metrics.response(ResponseCode::NoError);
                }
                done += sent;
            }
            Ok(_) => {
                debug!("DNS responses not sent");
                shared.metrics.drop("send");
                done += 1;
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                let (i, dst) = replies[done];
                let timeout = shared.config.request_timeout;
                match tokio::time::timeout(timeout, socket.send_to(&outs[i], dst)).await {
                    Ok(Ok(_)) => shared.metrics.response(ResponseCode::NoError),
                    Ok(Err(error)) => {
                        debug!(%error, "cannot send DNS response");
                        shared.metrics.drop("send");
                    }
                    Err(_) => shared.metrics.drop("timeout"),
                }
                done += 1;
            }
            Err(error) => {
                debug!(%error, "cannot send DNS response");
                shared.metrics.drop("send");
                done += 1;
            }
        }
    }
}

/// Handles a datagram the fast path did not take: parsed by hickory and
/// answered inline, or handed to a task if it is forwarded.
async fn general(
    shared: &Arc<Shared>,
    socket: &Arc<UdpSocket>,
    packet: &[u8],
    src: SocketAddr,
    tracker: &TaskTracker,
) {
    let Ok(permit) = shared.permits.clone().try_acquire_owned() else {
        shared.metrics.drop("overload");
        return;
    };
    let Some(parsed) = shared.parse(packet.to_vec(), src, Protocol::Udp) else {
        return;
    };
    let responder = Responder(UdpClient {
        socket: socket.clone(),
        dst: src,
    });
    let timeout = shared.config.request_timeout;
    if !parsed.forwarded {
        // Our own zones are answered from memory without waiting on
        // anything but the send, so we answer inline: a task per
        // query would cost more than the lookup (see tests/bench/dns.sh).
        if tokio::time::timeout(timeout, shared.answer(parsed, responder))
            .await
            .is_err()
        {
            shared.metrics.drop("timeout");
        }
        drop(permit);
        return;
    }
    let shared = shared.clone();
    tracker.spawn(async move {
        let _permit = permit;
        if tokio::time::timeout(timeout, shared.answer(parsed, responder))
            .await
            .is_err()
        {
            shared.metrics.drop("timeout");
        }
    });
}

/// Errors after which the UDP socket is still usable (ICMP errors reported
/// on the next receive, interrupted calls).
fn transient(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Sends a response back to the UDP client.
#[derive(Clone)]
struct UdpClient {
    socket: Arc<UdpSocket>,
    dst: SocketAddr,
}

#[async_trait::async_trait]
impl Deliver for UdpClient {
    fn protocol(&self) -> Protocol {
        Protocol::Udp
    }

    async fn deliver(&mut self, bytes: Vec<u8>) -> Result<(), NetError> {
        self.socket.send_to(&bytes, self.dst).await?;
        Ok(())
    }
}
