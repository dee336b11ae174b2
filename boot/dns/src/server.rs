//! The listeners, the per-request handler and the live zone swap.
//!
//! We run our own receive loops instead of `hickory_server::Server` so that
//! every packet passes our cheap checks before any allocation or task: a
//! source that cannot be answered (port 0, unspecified, broadcast or
//! multicast: reflection), a packet shorter than a DNS header (RFC 1035
//! §4.1.1), or one with the QR bit set (a response, never answered) is
//! dropped and counted. Then a semaphore permit bounds the requests in flight
//! (UDP drops when none is free; TCP waits, bounded by the request timeout),
//! and each request runs under a timeout.
//!
//! Plain A, AAAA and PTR queries for names we hold are answered first by
//! `src/fast.rs` from precomputed wire-format answers, with no allocation;
//! everything else is parsed by hickory and answered by its [`Catalog`]. On
//! UDP, queries for our own zones are answered inline in the receive loop
//! (a memory lookup and a send); only forwarded queries, which wait on
//! upstream resolvers, get a task of their own. The UDP loop receives and
//! sends in batches (`src/mmsg.rs`), goes back to the reactor only when the
//! socket is empty, and yields after every full batch so that the zone swap
//! and the TCP tasks on the same thread still run.
//!
//! Zones are rebuilt off the runtime threads whenever the snapshot changes
//! and swapped in under a `std::sync::RwLock<Arc<Zones>>` held only to clone
//! the `Arc`: requests already running finish on the zones they started with.
//! A generation counter, bumped after each swap, lets the UDP loop keep its
//! own `Arc` and check one atomic per packet instead of taking the lock; a
//! new snapshot is therefore served from the next packet on.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use hickory_server::net::NetError;
use hickory_server::net::runtime::TokioTime;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::{
    Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_server::proto::rr::{LowerName, Record};
use hickory_server::proto::serialize::binary::{BinEncodable, BinEncoder};
use hickory_server::resolver::config::NameServerConfig;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::store::forwarder::{ForwardConfig, ForwardZoneHandler};
use hickory_server::zone_handler::{Catalog, MessageResponse, ZoneHandler, ZoneType};
use mprov_api::boot::BootConfig;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::fast::FastAnswers;
use crate::metrics::Metrics;
use crate::{DnsConfig, ServeError, mmsg, zones};

/// Largest UDP datagram we read. EDNS(0) (RFC 6891) allows up to 65535 bytes;
/// a query is never that large, so anything longer is truncated by the kernel
/// and then fails to parse.
const UDP_BUFFER: usize = 4096;

/// The authoritative-plus-forwarding DNS server.
///
/// Created with [`Server::new`], then [`Server::run`] serves on already-bound
/// sockets until the token is cancelled.
#[derive(Debug)]
pub struct Server {
    config: DnsConfig,
    snapshots: watch::Receiver<Arc<BootConfig>>,
    metrics: Metrics,
}

impl Server {
    /// A server following `snapshots`; its counters go into `registry`.
    pub fn new(
        config: DnsConfig,
        snapshots: watch::Receiver<Arc<BootConfig>>,
        registry: &mut Registry,
    ) -> Self {
        Self {
            config,
            snapshots,
            metrics: Metrics::register(registry),
        }
    }

    /// Serves DNS on `udp` (and `tcp`, if given) until `shutdown` is
    /// cancelled, then waits up to [`DnsConfig::drain_timeout`] for requests
    /// in flight.
    ///
    /// The zones are built from the current snapshot before the first packet
    /// is read and rebuilt on every change. If the sender goes away, the
    /// last snapshot keeps being served.
    pub async fn run(
        self,
        udp: UdpSocket,
        tcp: Option<TcpListener>,
        shutdown: CancellationToken,
    ) -> Result<(), ServeError> {
        let Self {
            config,
            mut snapshots,
            metrics,
        } = self;
        let mut upstream = Upstream::default();
        let first = snapshots.borrow_and_update().clone();
        let zones = Zones::build(first, &config, &mut upstream).await?;
        let shared = Arc::new(Shared {
            zones: RwLock::new(Arc::new(zones)),
            generation: AtomicU64::new(0),
            metrics,
            permits: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
            config,
        });

        let tracker = TaskTracker::new();
        tracker.spawn(watch_snapshots(
            shared.clone(),
            snapshots,
            upstream,
            shutdown.clone(),
        ));
        if let Some(tcp) = tcp {
            tracker.spawn(tcp_listener(
                shared.clone(),
                tcp,
                tracker.clone(),
                shutdown.clone(),
            ));
        }
        let result = udp_listener(&shared, Arc::new(udp), &tracker, &shutdown).await;
        shutdown.cancel();
        tracker.close();
        if tokio::time::timeout(shared.config.drain_timeout, tracker.wait())
            .await
            .is_err()
        {
            warn!("DNS requests still running after the drain timeout");
        }
        result
    }
}

/// What every task shares.
pub(crate) struct Shared {
    config: DnsConfig,
    zones: RwLock<Arc<Zones>>,
    /// Bumped after every swap of `zones`.
    generation: AtomicU64,
    metrics: Metrics,
    permits: Arc<Semaphore>,
}

impl Shared {
    fn zones(&self) -> Arc<Zones> {
        // A poisoned lock only means a writer panicked between two
        // statements that cannot leave the Arc half-written.
        self.zones.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The current zones and their generation. The generation is read
    /// first, so a swap in between only causes one more refresh.
    fn current(&self) -> (u64, Arc<Zones>) {
        let generation = self.generation.load(Ordering::Acquire);
        (generation, self.zones())
    }

    fn swap(&self, zones: Zones) {
        *self.zones.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(zones);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Parses and answers one request. Returns without sending anything if
    /// it does not parse.
    async fn handle<R: ResponseHandler>(
        &self,
        raw: Vec<u8>,
        src: SocketAddr,
        protocol: Protocol,
        responder: R,
    ) {
        if let Some(parsed) = self.parse(raw, src, protocol) {
            self.answer(parsed, responder).await;
        }
    }

    /// Parses a request and picks the zones generation that answers it.
    /// `None` (counted) if it is malformed or a response.
    fn parse(&self, raw: Vec<u8>, src: SocketAddr, protocol: Protocol) -> Option<Parsed> {
        let request = match Request::from_bytes(raw, src, protocol) {
            Ok(request) => request,
            Err(error) => {
                debug!(%src, %error, "malformed DNS packet");
                self.metrics.drop("malformed");
                return None;
            }
        };
        // Checked again after parsing: the header bit test in the listener
        // is the cheap path, this is the authoritative one.
        if request.metadata.message_type == MessageType::Response {
            self.metrics.drop("response");
            return None;
        }
        self.metrics.queries.inc();
        let zones = self.zones();
        let forwarded = request
            .request_info()
            .ok()
            .is_some_and(|info| zones.is_forwarded(info.query.name()));
        Some(Parsed {
            request,
            zones,
            forwarded,
        })
    }

    async fn answer<R: ResponseHandler>(&self, parsed: Parsed, responder: R) {
        let info = parsed
            .zones
            .catalog
            .handle_request::<_, TokioTime>(&parsed.request, responder)
            .await;
        if parsed.forwarded {
            self.metrics.forwarded.inc();
        }
        self.metrics.response(info.response_code);
    }
}

/// A request ready to answer, with the zones it will be answered from.
struct Parsed {
    request: Request,
    zones: Arc<Zones>,
    forwarded: bool,
}

/// One generation of zones: the catalog, the fast-path answers and whether
/// it forwards.
pub(crate) struct Zones {
    catalog: Catalog,
    /// A, AAAA and PTR sets, precomputed in wire format. hickory's in-memory
    /// zone keeps records in a `BTreeMap` ordered label by label, and its
    /// message codec allocates per query; both showed as the largest
    /// user-space costs under dnsperf. Everything else (CNAME chasing,
    /// NXDOMAIN, NODATA, SOA, NS) still goes through the catalog.
    fast: FastAnswers,
    origins: Vec<LowerName>,
    forwarding: bool,
}

impl Zones {
    /// Builds the zones for `snapshot`, reusing the forwarder (and its
    /// cache) when the upstream list did not change.
    async fn build(
        snapshot: Arc<BootConfig>,
        config: &DnsConfig,
        upstream: &mut Upstream,
    ) -> Result<Self, ServeError> {
        let forwarder = upstream.forwarder(&snapshot.upstream_resolvers, config.upstream_port);
        let ttl = config.ttl;
        let build =
            tokio::task::spawn_blocking(move || Self::from_snapshot(&snapshot, ttl, forwarder));
        build.await.map_err(ServeError::Build)
    }

    /// Builds the zones for `snapshot` on the calling thread.
    pub(crate) fn from_snapshot(
        snapshot: &BootConfig,
        ttl: u32,
        forwarder: Option<Arc<dyn ZoneHandler>>,
    ) -> Self {
        let set = zones::build(snapshot, ttl);
        let origins = set.origins().map(LowerName::new).collect();
        let exact = set.exact();
        let fast = FastAnswers::new(
            exact
                .iter()
                .map(|((name, rtype), records)| ((&**name, *rtype), records.as_slice())),
        );
        Self {
            forwarding: forwarder.is_some(),
            catalog: set.into_catalog(zones::serial(snapshot), forwarder),
            fast,
            origins,
        }
    }

    fn is_forwarded(&self, name: &LowerName) -> bool {
        self.forwarding && !self.origins.iter().any(|o| o.zone_of(name))
    }
}

/// The forwarder for the current upstream list.
#[derive(Default)]
struct Upstream {
    current: Option<(Vec<IpAddr>, Arc<dyn ZoneHandler>)>,
}

impl Upstream {
    fn forwarder(&mut self, resolvers: &[IpAddr], port: u16) -> Option<Arc<dyn ZoneHandler>> {
        if resolvers.is_empty() {
            self.current = None;
            return None;
        }
        if let Some((ips, fwd)) = &self.current
            && ips == resolvers
        {
            return Some(fwd.clone());
        }
        let name_servers = resolvers
            .iter()
            .map(|&ip| {
                let mut ns = NameServerConfig::udp_and_tcp(ip);
                for conn in &mut ns.connections {
                    conn.port = port;
                }
                ns
            })
            .collect();
        let built = ForwardZoneHandler::builder_tokio(ForwardConfig {
            name_servers,
            options: None,
        })
        .build();
        match built {
            Ok(fwd) => {
                let fwd: Arc<dyn ZoneHandler> = Arc::new(fwd);
                debug_assert_eq!(fwd.zone_type(), ZoneType::External);
                self.current = Some((resolvers.to_vec(), fwd.clone()));
                Some(fwd)
            }
            Err(error) => {
                warn!(%error, "cannot build the DNS forwarder; refusing outside names");
                self.current = None;
                None
            }
        }
    }
}

/// Rebuilds and swaps the zones on every new snapshot.
async fn watch_snapshots(
    shared: Arc<Shared>,
    mut snapshots: watch::Receiver<Arc<BootConfig>>,
    mut upstream: Upstream,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            changed = snapshots.changed() => {
                if changed.is_err() {
                    info!("boot config source closed; serving the last snapshot");
                    return;
                }
            }
            () = shutdown.cancelled() => return,
        }
        let snapshot = snapshots.borrow_and_update().clone();
        let revision = snapshot.revision;
        match Zones::build(snapshot, &shared.config, &mut upstream).await {
            Ok(zones) => {
                shared.swap(zones);
                shared.metrics.reloads.inc();
                info!(revision, "DNS zones reloaded");
            }
            Err(error) => {
                warn!(revision, error = %error, "DNS zone rebuild failed; keeping the old zones")
            }
        }
    }
}

/// Whether a reply to `src` could go anywhere sensible. Port 0, unspecified,
/// broadcast and multicast sources are spoofed or reflected traffic.
fn answerable(src: SocketAddr) -> bool {
    if src.port() == 0 {
        return false;
    }
    match src.ip() {
        IpAddr::V4(ip) => !(ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast()),
        IpAddr::V6(ip) => !(ip.is_unspecified() || ip.is_multicast()),
    }
}

/// Cheap checks on the raw bytes, before any work: long enough for a header
/// and not a response (QR bit, RFC 1035 §4.1.1).
fn precheck(packet: &[u8]) -> Result<(), &'static str> {
    match packet.get(2) {
        None => Err("short"),
        Some(_) if packet.len() < 12 => Err("short"),
        Some(flags) if flags & 0x80 != 0 => Err("response"),
        Some(_) => Ok(()),
    }
}

async fn udp_listener(
    shared: &Arc<Shared>,
    socket: Arc<UdpSocket>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> Result<(), ServeError> {
    let mut bufs = vec![vec![0u8; UDP_BUFFER]; mmsg::BATCH];
    let mut outs: Vec<Vec<u8>> = (0..mmsg::BATCH).map(|_| Vec::with_capacity(512)).collect();
    let mut received = Vec::with_capacity(mmsg::BATCH);
    let mut replies = Vec::with_capacity(mmsg::BATCH);
    let (mut generation, mut zones) = shared.current();
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
        if shared.generation.load(Ordering::Acquire) != generation {
            (generation, zones) = shared.current();
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
            udp_general(shared, &socket, packet, src, tracker).await;
        }
        udp_flush(shared, &socket, &outs, &replies).await;
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
async fn udp_flush(
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
async fn udp_general(
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
    let responder = UdpResponder {
        socket: socket.clone(),
        dst: src,
    };
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

async fn tcp_listener(
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
                    // Out of descriptors and the like: keep listening.
                    debug!(%err, "TCP accept error");
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
                () = tcp_connection(&shared, stream, src) => {}
                () = shutdown.cancelled() => {}
            }
        });
    }
}

/// Serves length-prefixed queries (RFC 1035 §4.2.2) on one connection, one
/// at a time, until the client closes it or is idle too long.
async fn tcp_connection(shared: &Arc<Shared>, stream: TcpStream, src: SocketAddr) {
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
        if shared.zones().fast.answer(&raw, Protocol::Tcp, &mut out) {
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
        let responder = TcpResponder {
            writer: writer.clone(),
        };
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

/// Serialises a response, truncating to `max_size` (RFC 1035 §4.2.1, RFC
/// 6891 §6.2.5 for EDNS). An encoding failure becomes a bare SERVFAIL, as in
/// hickory's own server.
fn encode<'a>(
    response: MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
    protocol: Protocol,
) -> Result<(ResponseInfo, Vec<u8>), NetError> {
    let id = response.metadata().id;
    let max_size = match (protocol, response.edns()) {
        (Protocol::Udp, Some(edns)) => edns.max_payload().max(512),
        (Protocol::Udp, None) => 512,
        _ => u16::MAX,
    };
    let mut bytes = Vec::with_capacity(512);
    let mut encoder = BinEncoder::new(&mut bytes);
    encoder.set_max_size(max_size);
    match response.destructive_emit(&mut encoder) {
        Ok(info) => Ok((info, bytes)),
        Err(error) => {
            warn!(%error, "cannot encode DNS response; sending SERVFAIL");
            let mut metadata = Metadata::new(id, MessageType::Response, OpCode::Query);
            metadata.response_code = ResponseCode::ServFail;
            let header = Header {
                metadata,
                counts: HeaderCounts::default(),
            };
            let mut bytes = Vec::with_capacity(12);
            header.emit(&mut BinEncoder::new(&mut bytes))?;
            Ok((ResponseInfo::from(header), bytes))
        }
    }
}

/// Sends a response back to the UDP client.
#[derive(Clone)]
struct UdpResponder {
    socket: Arc<UdpSocket>,
    dst: SocketAddr,
}

#[async_trait::async_trait]
impl ResponseHandler for UdpResponder {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let (info, bytes) = encode(response, Protocol::Udp)?;
        self.socket.send_to(&bytes, self.dst).await?;
        Ok(info)
    }
}

/// Sends a length-prefixed response on the TCP connection.
#[derive(Clone)]
struct TcpResponder {
    writer: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
}

#[async_trait::async_trait]
impl ResponseHandler for TcpResponder {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let (info, bytes) = encode(response, Protocol::Tcp)?;
        let len = u16::try_from(bytes.len()).map_err(|_| NetError::from("response too long"))?;
        let mut framed = Vec::with_capacity(bytes.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&bytes);
        self.writer.lock().await.write_all(&framed).await?;
        Ok(info)
    }
}

/// The two paths' responses to one request, as bytes (without the TCP
/// length prefix); `None` where the request is dropped or not taken.
#[derive(Debug)]
pub(crate) struct Responses {
    /// The fast path's response, if it takes the request.
    pub(crate) fast: Option<Vec<u8>>,
    /// The general path's (hickory's catalog), run whether or not the fast
    /// path took the request.
    pub(crate) general: Option<Vec<u8>>,
}

impl Shared {
    /// A server state over `snapshot`'s zones, with no forwarder and no
    /// registered metrics: the fixture of the fuzz target and of tests.
    pub(crate) fn fixture(snapshot: &BootConfig) -> Self {
        let config = DnsConfig::default();
        Self {
            zones: RwLock::new(Arc::new(Zones::from_snapshot(snapshot, config.ttl, None))),
            generation: AtomicU64::new(0),
            metrics: Metrics::default(),
            permits: Arc::new(Semaphore::new(config.max_in_flight)),
            config,
        }
    }

    /// Runs `raw`, as received over `protocol`, through the same checks and
    /// both answering paths the listeners use, collecting the bytes each
    /// would send.
    pub(crate) async fn responses(&self, raw: &[u8], protocol: Protocol) -> Responses {
        if precheck(raw).is_err() {
            return Responses {
                fast: None,
                general: None,
            };
        }
        let mut out = Vec::new();
        let fast = self
            .zones()
            .fast
            .answer(raw, protocol, &mut out)
            .then_some(out);
        let collected = Arc::new(std::sync::Mutex::new(None));
        let responder = CollectResponder {
            protocol,
            sent: collected.clone(),
        };
        let src = SocketAddr::from(([127, 0, 0, 1], 5353));
        self.handle(raw.to_vec(), src, protocol, responder).await;
        let general = collected.lock().unwrap_or_else(|e| e.into_inner()).take();
        Responses { fast, general }
    }
}

/// Keeps the encoded response instead of sending it.
#[derive(Clone)]
struct CollectResponder {
    protocol: Protocol,
    sent: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
}

#[async_trait::async_trait]
impl ResponseHandler for CollectResponder {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let (info, bytes) = encode(response, self.protocol)?;
        *self.sent.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes);
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_unanswerable_sources() {
        let check = |s: &str, ok: bool| assert_eq!(answerable(s.parse().unwrap()), ok, "{s}");
        check("127.0.0.1:5353", true);
        check("[::1]:5353", true);
        check("127.0.0.1:0", false);
        check("0.0.0.0:53", false);
        check("255.255.255.255:53", false);
        check("224.0.0.1:53", false);
        check("[::]:53", false);
        check("[ff02::1]:53", false);
    }

    #[test]
    fn prechecks_header() {
        assert_eq!(precheck(&[]), Err("short"));
        assert_eq!(precheck(&[0; 11]), Err("short"));
        assert_eq!(precheck(&[0; 12]), Ok(()));
        let mut response = [0u8; 12];
        response[2] = 0x80;
        assert_eq!(precheck(&response), Err("response"));
    }
}
