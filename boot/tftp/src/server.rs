//! The listener: receives requests on the bound socket and starts one
//! transfer task per accepted RRQ.
//!
//! Shape: the caller binds the socket and owns the
//! shutdown token; `select!` between `recv_from` and cancellation; a
//! semaphore bounds concurrent transfers (a request beyond it gets an ERROR
//! packet at once, so the client can retry instead of timing out); every
//! transfer runs in a [`TaskTracker`] and shutdown drains it for a bounded
//! time, then cancels what is left.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mprov_process::metrics::Prefixed;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::codec::{self, ErrorCode, Packet};
use crate::pktinfo;
use crate::transfer::{self, OwnedRequest};

/// Default cap on concurrent transfers.
pub const DEFAULT_MAX_TRANSFERS: usize = 256;
/// Default number of retransmissions of one packet before giving up.
pub const DEFAULT_RETRIES: u32 = 5;
/// Default retransmission timeout, when the client does not negotiate one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default deadline for a whole transfer.
pub const DEFAULT_TRANSFER_DEADLINE: Duration = Duration::from_secs(300);
/// Default block-size cap: 1468 bytes of data fit a 1500-byte Ethernet MTU
/// with IPv4, UDP and TFTP headers, which is also what EDK2 asks for.
pub const DEFAULT_MAX_BLKSIZE: u16 = 1468;
/// Default window cap: RFC 7440 measured no gain above 64, and tftp-hpa's
/// client misbehaves above it.
pub const DEFAULT_MAX_WINDOWSIZE: u16 = 64;
/// Default time shutdown waits for running transfers before cancelling them.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

/// Server settings. [`TftpConfig::new`] fills in the defaults above.
#[derive(Debug, Clone)]
pub struct TftpConfig {
    /// Directory served; nothing outside it is ever read.
    pub root: PathBuf,
    /// Concurrent transfers; requests beyond it get a "server busy" error.
    pub max_transfers: usize,
    /// Retransmissions of one packet (or window) before a transfer fails.
    pub retries: u32,
    /// Retransmission timeout, unless the client negotiates one (RFC 2349).
    pub timeout: Duration,
    /// Deadline of a whole transfer, whatever its progress.
    pub transfer_deadline: Duration,
    /// Largest block size granted (RFC 2348 allows 8..=65464).
    pub max_blksize: u16,
    /// Largest window granted (RFC 7440).
    pub max_windowsize: u16,
    /// How long shutdown waits for running transfers.
    pub drain_timeout: Duration,
}

impl TftpConfig {
    /// Defaults for serving `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        TftpConfig {
            root: root.into(),
            max_transfers: DEFAULT_MAX_TRANSFERS,
            retries: DEFAULT_RETRIES,
            timeout: DEFAULT_TIMEOUT,
            transfer_deadline: DEFAULT_TRANSFER_DEADLINE,
            max_blksize: DEFAULT_MAX_BLKSIZE,
            max_windowsize: DEFAULT_MAX_WINDOWSIZE,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

/// The server's Prometheus metrics, all prefixed `tftp_`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Metrics {
    pub(crate) started: Counter,
    pub(crate) completed: Counter,
    pub(crate) failed: Counter,
    pub(crate) aborted: Counter,
    pub(crate) busy: Counter,
    pub(crate) bytes_sent: Counter,
    pub(crate) active: Gauge,
}

impl Metrics {
    fn register(registry: &mut Registry) -> Self {
        let mut r = Prefixed::new(registry, "tftp");
        Metrics {
            started: r.metric("transfers_started", "Read requests accepted"),
            completed: r.metric(
                "transfers_completed",
                "Transfers whose last block was acknowledged",
            ),
            failed: r.metric(
                "transfers_failed",
                "Transfers that ended in an error or a timeout",
            ),
            aborted: r.metric(
                "transfers_aborted",
                "Transfers the client ended after the option acknowledgement (UEFI size probes)",
            ),
            busy: r.metric(
                "requests_busy",
                "Read requests refused because max_transfers were running",
            ),
            bytes_sent: r.metric(
                "bytes_sent",
                "DATA payload bytes sent, retransmissions included",
            ),
            active: r.metric("transfers_active", "Transfers running now"),
        }
    }
}

/// Why [`Server::run`] stopped early.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The socket has no local address.
    #[error("cannot read the listening socket's address")]
    LocalAddr(#[source] io::Error),
}

/// A transfer whose last block the client acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The client.
    pub peer: SocketAddr,
    /// The file name as the client asked for it.
    pub file: String,
    /// The file's size.
    pub bytes: u64,
}

/// What hears of every completed transfer (see [`Server::on_sent`]).
type OnSent = Box<dyn Fn(&Sent) + Send + Sync>;

/// State shared by the listener and every transfer.
pub(crate) struct Inner {
    pub(crate) config: TftpConfig,
    pub(crate) metrics: Metrics,
    pub(crate) on_sent: Option<OnSent>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("config", &self.config)
            .field("metrics", &self.metrics)
            .field("on_sent", &self.on_sent.is_some())
            .finish()
    }
}

/// A TFTP server for one listening socket.
#[derive(Debug)]
pub struct Server {
    inner: Inner,
}

impl Server {
    /// Builds a server and registers its metrics into `registry`.
    pub fn new(config: TftpConfig, registry: &mut Registry) -> Self {
        let metrics = Metrics::register(registry);
        Server {
            inner: Inner {
                config,
                metrics,
                on_sent: None,
            },
        }
    }

    /// Calls `f` with every completed transfer, on the transfer's task (so
    /// `f` must not block: the job server hands it to a queue).
    pub fn on_sent(mut self, f: impl Fn(&Sent) + Send + Sync + 'static) -> Self {
        self.inner.on_sent = Some(Box::new(f));
        self
    }

    /// Serves requests arriving on `socket` until `shutdown` is cancelled,
    /// then drains running transfers for at most `drain_timeout`.
    ///
    /// Each transfer replies from its own socket, bound to `socket`'s local
    /// IP (on a wildcard listener: the address the request was sent to) and
    /// an ephemeral port (the RFC 1350 transfer ID).
    pub async fn run(self, socket: UdpSocket, shutdown: CancellationToken) -> Result<(), RunError> {
        let this = RunningServer {
            inner: Arc::new(self.inner),
        };
        this.run(socket, shutdown).await
    }
}

/// A server while it runs: its state shared with the transfers.
struct RunningServer {
    inner: Arc<Inner>,
}

impl RunningServer {
    async fn run(self, socket: UdpSocket, shutdown: CancellationToken) -> Result<(), RunError> {
        let local = socket.local_addr().map_err(RunError::LocalAddr)?;
        // A wildcard listener learns each request's destination, so that
        // the transfer replies from the address the node asked.
        let wildcard = local.ip().is_unspecified();
        if wildcard && let Err(err) = pktinfo::enable(&socket) {
            tracing::warn!(error = %err, "tftp: cannot learn request destinations; replies come from the routed address");
        }
        let permits = Arc::new(Semaphore::new(self.inner.config.max_transfers));
        let tracker = TaskTracker::new();
        let transfers = shutdown.child_token();
        // Large enough for any RRQ, however many options it carries.
        let mut buf = vec![0u8; 65536];
        tracing::info!(%local, root = %self.inner.config.root.display(), "tftp: listening");

        loop {
            let (len, peer, asked) = tokio::select! {
                () = shutdown.cancelled() => break,
                received = receive(&socket, wildcard, &mut buf) => match received {
                    Ok(received) => received,
                    Err(err) => {
                        // An ICMP error from an earlier reply can surface
                        // here; it concerns one peer, not the listener.
                        tracing::debug!(error = %err, "tftp: recv failed");
                        continue;
                    }
                },
            };
            // Nothing can be sent back to port 0, and a packet "from"
            // ourselves is a reflection: drop both before any work.
            if peer.port() == 0 || peer == local {
                continue;
            }
            let Some(datagram) = buf.get(..len) else {
                continue;
            };
            match codec::parse(datagram) {
                Ok(Packet::Rrq(req)) => {
                    let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                        self.inner.metrics.busy.inc();
                        tracing::info!(%peer, file = req.filename, "tftp: busy, request refused");
                        reply_error(
                            &socket,
                            peer,
                            ErrorCode::NotDefined,
                            "server busy, retry later",
                        )
                        .await;
                        continue;
                    };
                    let req = OwnedRequest::from(&req);
                    let local_ip = pktinfo::reply_from(local.ip(), asked);
                    let inner = Arc::clone(&self.inner);
                    let cancel = transfers.clone();
                    tracker.spawn(async move {
                        transfer::run(inner, local_ip, peer, req, cancel).await;
                        drop(permit);
                    });
                }
                Ok(Packet::Wrq(req)) => {
                    tracing::info!(%peer, file = req.filename, "tftp: write request refused");
                    reply_error(
                        &socket,
                        peer,
                        ErrorCode::AccessViolation,
                        "write requests are not accepted",
                    )
                    .await;
                }
                // Never answer an ERROR, so two confused peers cannot loop.
                Ok(Packet::Error { .. }) => {}
                Ok(other) => {
                    tracing::debug!(%peer, packet = ?other, "tftp: unexpected packet on the listening port");
                    reply_error(
                        &socket,
                        peer,
                        ErrorCode::IllegalOperation,
                        "expected a read request",
                    )
                    .await;
                }
                Err(err) => tracing::debug!(%peer, error = %err, "tftp: malformed packet dropped"),
            }
        }

        tracker.close();
        if tokio::time::timeout(self.inner.config.drain_timeout, tracker.wait())
            .await
            .is_err()
        {
            tracing::info!(
                active = tracker.len(),
                "tftp: drain timed out, cancelling transfers"
            );
            transfers.cancel();
            tracker.wait().await;
        }
        tracing::info!(%local, "tftp: stopped");
        Ok(())
    }
}

/// Receives one datagram; on a wildcard listener also the address it was
/// sent to.
async fn receive(
    socket: &UdpSocket,
    wildcard: bool,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, Option<IpAddr>)> {
    if wildcard {
        pktinfo::recv(socket, buf).await
    } else {
        let (len, peer) = socket.recv_from(buf).await?;
        Ok((len, peer, None))
    }
}

/// Sends an ERROR packet; a failure is only logged, since the peer gets
/// nothing else either way.
pub(crate) async fn reply_error(
    socket: &UdpSocket,
    peer: SocketAddr,
    code: ErrorCode,
    message: &str,
) {
    let packet = Packet::Error {
        code,
        message: message.into(),
    };
    match packet.to_vec() {
        Ok(wire) => {
            if let Err(err) = socket.send_to(&wire, peer).await {
                tracing::debug!(%peer, error = %err, "tftp: cannot send error packet");
            }
        }
        Err(err) => tracing::debug!(error = %err, "tftp: cannot encode error packet"),
    }
}
