//! The TCP listener: a bounded number of connections, each serving
//! length-prefixed queries (RFC 1035 §4.2.2) one at a time.

use std::net::SocketAddr;
use std::sync::Arc;

use hickory_server::net::NetError;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::ResponseCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

use super::Shared;
use super::handler::{Deliver, Responder, answerable, precheck};

/// Accepts connections on `listener` until `shutdown` is cancelled; each
/// runs in a task on `tracker`.
pub(super) async fn listen(
    shared: Arc<Shared>,
    listener: TcpListener,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let connections = Arc::new(Semaphore::new(shared.config.max_tcp_connections.max(1)));
    loop {
        let (stream, src) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(err) => {
                    // Out of descriptors and the like: keep listening, but
                    // not in a hot loop while the condition lasts.
                    debug!(%err, "TCP accept error");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        if !answerable(src) {
            shared.metrics.drop("source");
            continue;
        }
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            shared.metrics.drop("overload");
            continue;
        };
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let _permit = permit;
            tokio::select! {
                () = connection(&shared, stream, src) => {}
                () = shutdown.cancelled() => {}
            }
        });
    }
}

/// Serves length-prefixed queries (RFC 1035 §4.2.2) on one connection, one
/// at a time, until the client closes it or is idle too long.
async fn connection(shared: &Arc<Shared>, stream: TcpStream, src: SocketAddr) {
    let (mut reader, writer) = stream.into_split();
    let writer = Arc::new(tokio::sync::Mutex::new(writer));
    let idle = shared.config.tcp_idle_timeout;
    let mut out = Vec::new();
    loop {
        let len = match tokio::time::timeout(idle, reader.read_u16()).await {
            Ok(Ok(len)) => usize::from(len),
            _ => return,
        };
        let mut raw = vec![0u8; len];
        match tokio::time::timeout(idle, reader.read_exact(&mut raw)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        if let Err(reason) = precheck(&raw) {
            shared.metrics.drop(reason);
            continue;
        }
        if shared.live.get().fast.answer(&raw, Protocol::Tcp, &mut out) {
            shared.metrics.queries.inc();
            // The fast path never exceeds the TCP limit of 65535 bytes.
            let len = u16::try_from(out.len()).unwrap_or(u16::MAX);
            out.splice(0..0, len.to_be_bytes());
            let write = async { writer.lock().await.write_all(&out).await };
            match tokio::time::timeout(idle, write).await {
                Ok(Ok(())) => shared.metrics.response(ResponseCode::NoError),
                _ => {
                    shared.metrics.drop("send");
                    return;
                }
            }
            continue;
        }
        let timeout = shared.config.request_timeout;
        let responder = Responder(TcpClient {
            writer: writer.clone(),
        });
        let handling = async {
            let Ok(_permit) = shared.permits.acquire().await else {
                return;
            };
            shared.handle(raw, src, Protocol::Tcp, responder).await;
        };
        if tokio::time::timeout(timeout, handling).await.is_err() {
            shared.metrics.drop("timeout");
            return;
        }
    }
}

/// Sends a length-prefixed response on the TCP connection.
#[derive(Clone)]
struct TcpClient {
    writer: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
}

#[async_trait::async_trait]
impl Deliver for TcpClient {
    fn protocol(&self) -> Protocol {
        Protocol::Tcp
    }

    async fn deliver(&mut self, bytes: Vec<u8>) -> Result<(), NetError> {
        let len = u16::try_from(bytes.len()).map_err(|_| NetError::from("response too long"))?;
        let mut framed = Vec::with_capacity(bytes.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&bytes);
        self.writer.lock().await.write_all(&framed).await?;
        Ok(())
    }
}
