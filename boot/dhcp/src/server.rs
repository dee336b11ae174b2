//! The listener: receives packets, runs the handler, commits, replies.
//!
//! Structure after mini-redis and hickory's `handle_udp`: one loop owns the
//! socket and `select!`s between `recv_from` and the shutdown token; each
//! packet that passes the raw-header [`prefilter`] (so a reflected reply or
//! junk costs no decode and no task) runs in its own task, holding a
//! semaphore permit (at most `max_in_flight` at once; the rest wait in the
//! socket buffer) under a time limit. Shutdown stops receiving and drains
//! running tasks for at most [`DRAIN`].
//!
//! The one ordering rule: a lease record is committed (durable, see
//! [`crate::store`]) **before** the ACK that announces it is sent.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use mprov_api::boot::BootConfig;
use tokio::net::UdpSocket;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::DhcpConfig;
use crate::handler::{
    Action, Context, PXE_PORT, PoolEvent, Reason, ReplyKind, decode, encode, handle, prefilter,
};
use crate::inventory::Inventory;
use crate::metrics::Metrics;
use crate::store::{LeaseStore, unix_now};
use crate::table::LeaseTable;

/// How long shutdown waits for packets in flight.
pub const DRAIN: Duration = Duration::from_secs(3);
/// Largest datagram read; DHCP messages are far smaller (RFC 2131 §2: 576
/// unless option 57 allows more).
const MAX_DATAGRAM: usize = 4096;
/// Receive buffer asked for: when a whole cluster powers on at once, thousands
/// of DISCOVERs arrive within milliseconds, and the default buffer (about
/// 200 KiB, a few hundred packets) drops most of them, so every client waits
/// out its retransmission back-off. The kernel caps it at `net.core.rmem_max`.
pub const RECV_BUFFER: usize = 8 << 20;

/// The DHCP server. Clones share leases, snapshot and metrics, so one server
/// can run on several sockets (ports 67 and 4011 for proxyDHCP).
#[derive(Clone)]
pub struct Server {
    config: Arc<DhcpConfig>,
    snapshot: watch::Receiver<Arc<BootConfig>>,
    inventory: Arc<Mutex<(Arc<BootConfig>, Arc<Inventory>)>>,
    table: Arc<Mutex<LeaseTable>>,
    store: LeaseStore,
    metrics: Metrics,
    events: Option<mpsc::Sender<Sent>>,
}

/// A reply the server sent, for the job server's boot-event reporter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// What it was.
    pub kind: ReplyKind,
    /// The client's MAC, lowercase `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// The address leased (`yiaddr`), or in proxyDHCP the client's own
    /// (`ciaddr`, else the packet's source), if any.
    pub ip: Option<std::net::Ipv4Addr>,
    /// Sent as a proxyDHCP server.
    pub proxy: bool,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("config", &self.config)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A server answering from the snapshots `snapshot` delivers, with the
    /// leases replayed from `leases` and committing new ones there.
    pub fn new(
        config: DhcpConfig,
        snapshot: watch::Receiver<Arc<BootConfig>>,
        leases: LeaseStore,
    ) -> Self {
        let current = snapshot.borrow().clone();
        let inventory = Arc::new(Inventory::new(&current));
        let table = LeaseTable::from_records(leases.replayed());
        let metrics = Metrics::default();
        metrics.leases.set(gauge(table.bound_entries()));
        Self {
            config: Arc::new(config),
            snapshot,
            inventory: Arc::new(Mutex::new((current, inventory))),
            table: Arc::new(Mutex::new(table)),
            store: leases,
            metrics,
            events: None,
        }
    }

    /// Tells `events` of every reply sent (never waiting: when the channel
    /// is full the report is dropped, the reply is not delayed).
    pub fn with_events(mut self, events: mpsc::Sender<Sent>) -> Self {
        self.events = Some(events);
        self
    }

    /// The leases bound within `window` before `now` (Unix seconds), as
    /// the acknowledgements that made them, oldest first: what a job server
    /// that started again on its lease log reports again. A report it had
    /// queued but not posted when it stopped (killed, a power cut) died
    /// with it, and `/ipxe/` attests a node only by a lease reported within
    /// its window; without this the node retries until its lease is old.
    /// A lease began at its end less the lease it was given: a
    /// reservation's for an address the inventory reserves for that MAC,
    /// else the pool's.
    pub fn recent_acks(&self, now: u64, window: Duration) -> Vec<Sent> {
        let inventory = lock(&self.inventory).1.clone();
        let mut recent: Vec<(u64, Sent)> = lock(&self.table)
            .bound_leases(now)
            .filter_map(|(ip, binding)| {
                let lease = if inventory.reserved_for(ip, &binding.mac) {
                    self.config.reserved_lease
                } else {
                    self.config.pool_lease
                };
                let began = binding.until.saturating_sub(lease.as_secs());
                (began + window.as_secs() >= now).then(|| {
                    let mac = binding.mac.map(|b| format!("{b:02x}")).join(":");
                    (
                        began,
                        Sent {
                            kind: ReplyKind::Ack,
                            mac,
                            ip: Some(ip),
                            proxy: false,
                        },
                    )
                })
            })
            .collect();
        recent.sort_by_key(|(began, _)| *began);
        recent.into_iter().map(|(_, sent)| sent).collect()
    }

    /// Uses `metrics` (usually from [`Metrics::register`]).
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        let bound = lock(&self.table).bound_entries();
        metrics.leases.set(gauge(bound));
        self.metrics = metrics;
        self
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Serves on `socket` (already bound) until `shutdown` is cancelled.
    /// Broadcast replies need `SO_BROADCAST`, which this sets; binding to one
    /// interface (`SO_BINDTODEVICE`) is the caller's choice.
    pub async fn run(self, socket: UdpSocket, shutdown: CancellationToken) -> std::io::Result<()> {
        socket.set_broadcast(true)?;
        let sock = socket2::SockRef::from(&socket);
        if let Err(err) = sock.set_recv_buffer_size(RECV_BUFFER) {
            tracing::warn!(error = %err, "cannot enlarge the DHCP receive buffer");
        }
        match sock.recv_buffer_size() {
            Ok(n) if n < RECV_BUFFER => tracing::info!(
                bytes = n,
                "DHCP receive buffer capped by net.core.rmem_max; raise it for faster mass power-on"
            ),
            Ok(n) => tracing::debug!(bytes = n, "DHCP receive buffer"),
            Err(_) => {}
        }
        let local_port = socket.local_addr()?.port();
        let socket = Arc::new(socket);
        let permits = Arc::new(Semaphore::new(self.config.max_in_flight.max(1)));
        let tracker = TaskTracker::new();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            let permit = tokio::select! {
                () = shutdown.cancelled() => break,
                p = permits.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let (len, src) = tokio::select! {
                () = shutdown.cancelled() => break,
                r = socket.recv_from(&mut buf) => match r {
                    Ok(r) => r,
                    Err(err) => {
                        // ICMP errors from earlier sends surface here; not fatal.
                        tracing::debug!(error = %err, "recv_from failed");
                        continue;
                    }
                },
            };
            let data = &buf[..len];
            if let Err(reason) = prefilter(data) {
                tracing::debug!(%src, reason = reason.as_str(), "dropped before decoding");
                self.metrics.dropped(reason);
                continue;
            }
            let data = data.to_vec();
            let this = self.clone();
            let socket = socket.clone();
            tracker.spawn(async move {
                let _permit = permit;
                let limit = this.config.handler_timeout;
                let work = this.process(&data, src, local_port, &socket);
                if tokio::time::timeout(limit, work).await.is_err() {
                    tracing::warn!(%src, "DHCP packet took too long; dropped");
                    this.metrics.dropped(Reason::Timeout);
                }
            });
        }
        tracker.close();
        if tokio::time::timeout(DRAIN, tracker.wait()).await.is_err() {
            tracing::warn!("DHCP shutdown: packets still in flight after the drain time");
        }
        Ok(())
    }

    /// Handles one packet that passed the prefilter.
    async fn process(&self, data: &[u8], src: SocketAddr, local_port: u16, socket: &UdpSocket) {
        let msg = match decode(data) {
            Ok(m) => m,
            Err(reason) => {
                tracing::debug!(%src, "malformed DHCP packet");
                self.metrics.dropped(reason);
                return;
            }
        };
        let inventory = self.inventory();
        let outcome = {
            let ctx = Context {
                config: &self.config,
                inventory: &inventory,
                now: unix_now(),
                src,
                local_port,
            };
            let mut table = lock(&self.table);
            let outcome = handle(&msg, &ctx, &mut table);
            self.metrics.leases.set(gauge(table.bound_entries()));
            outcome
        };
        if let Some(event) = &outcome.pool {
            log_pool(event);
            self.metrics.pool(event);
        }
        if let Some(rec) = outcome.commit
            && let Err(err) = self.store.commit(rec).await
        {
            tracing::error!(error = %err, ip = %rec.ip, "lease not durable; no reply sent");
            self.metrics.dropped(Reason::LeaseLogFailed);
            return;
        }
        match outcome.action {
            Action::NoResponse(reason) => {
                tracing::debug!(%src, reason = reason.as_str(), "no reply");
                self.metrics.dropped(reason);
            }
            Action::Respond(reply) => {
                let bytes = match encode(&reply.msg) {
                    Ok(b) => b,
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot encode reply");
                        self.metrics.dropped(Reason::Malformed);
                        return;
                    }
                };
                if let Some(p) = self.store.probe() {
                    p.sending(reply.kind.as_str(), reply.msg.yiaddr());
                }
                match socket.send_to(&bytes, reply.dest).await {
                    Ok(_) => {
                        tracing::debug!(dest = %reply.dest, kind = reply.kind.as_str(), yiaddr = %reply.msg.yiaddr(), "sent");
                        self.metrics.sent(reply.kind);
                        if local_port == PXE_PORT && reply.kind == ReplyKind::Ack {
                            self.metrics.pxe_acks.inc();
                            tracing::info!(
                                %src,
                                file = %boot_file_name(&reply.msg),
                                "proxyDHCP: boot file sent to a PXE boot server request (port {PXE_PORT})"
                            );
                        }
                        if let Some(events) = &self.events {
                            let _ = events.try_send(sent(&reply, &msg, src, self.config.proxy));
                        }
                    }
                    Err(err) => {
                        tracing::warn!(dest = %reply.dest, error = %err, "cannot send reply");
                    }
                }
            }
        }
    }

    /// The indexed current snapshot, re-indexed when the snapshot changed.
    fn inventory(&self) -> Arc<Inventory> {
        let current = self.snapshot.borrow().clone();
        let mut cache = lock(&self.inventory);
        if !Arc::ptr_eq(&cache.0, &current) {
            tracing::info!(revision = current.revision, "new boot config snapshot");
            let inv = Arc::new(Inventory::new(&current));
            *cache = (current, inv);
        }
        cache.1.clone()
    }
}

/// Logs a pool's change of state: a warning once per exhaustion episode.
fn log_pool(event: &PoolEvent) {
    match event {
        PoolEvent::Exhausted {
            network,
            pool: (first, last),
            size,
            bound,
            offered,
            reclaimed,
        } => tracing::warn!(
            network = %network,
            size,
            bound,
            offered,
            "DHCP pool {first}-{last} of network {network} is exhausted: {bound} of its {size} addresses are leased and {offered} held by offers not yet confirmed; {}. Many DISCOVERs without a REQUEST (unknown nodes, a looping port, a starvation attempt) or a pool too small: enlarge it or give the nodes reservations",
            if *reclaimed {
                "the oldest offers are being given to new clients"
            } else {
                "new clients get no address until a lease ends"
            }
        ),
        PoolEvent::Reclaimed { network } => {
            tracing::debug!(network = %network, "pool full: reclaimed the oldest unconfirmed offer");
        }
        PoolEvent::Recovered { network } => {
            tracing::info!(network = %network, "DHCP pool of network {network} has free addresses again");
        }
    }
}

/// The boot file a reply names (option 67), for the log.
fn boot_file_name(msg: &dhcproto::v4::Message) -> String {
    match msg.opts().get(dhcproto::v4::OptionCode::BootfileName) {
        Some(dhcproto::v4::DhcpOption::BootfileName(name)) => {
            String::from_utf8_lossy(name).into_owned()
        }
        _ => String::new(),
    }
}

/// What the reporter is told of a reply.
fn sent(
    reply: &crate::handler::Reply,
    req: &dhcproto::v4::Message,
    src: SocketAddr,
    proxy: bool,
) -> Sent {
    let mac = reply
        .msg
        .chaddr()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let yiaddr = reply.msg.yiaddr();
    let source = match src.ip() {
        std::net::IpAddr::V4(ip) => ip,
        std::net::IpAddr::V6(_) => std::net::Ipv4Addr::UNSPECIFIED,
    };
    let ip = [
        yiaddr,
        req.ciaddr(),
        if proxy {
            source
        } else {
            std::net::Ipv4Addr::UNSPECIFIED
        },
    ]
    .into_iter()
    .find(|ip| !ip.is_unspecified());
    Sent {
        kind: reply.kind,
        mac,
        ip,
        proxy,
    }
}

/// Locks a mutex; a poisoned one (a panic elsewhere while holding it) still
/// holds consistent data here, since every critical section is a few map
/// operations that cannot panic halfway in a way we rely on.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
