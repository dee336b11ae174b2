//! IPv6 Router Advertisements on the provisioning interfaces (RFC 4861 §6.2).
//!
//! Why a DHCPv4 crate sends RAs: iPXE configures IPv6 as well as IPv4 and,
//! with no router advertisement on the link, waits about 13 s for IPv6
//! autoconfiguration before it runs the boot script (the netboot lab's
//! gotcha 3). An RA ends that wait. It is the same provisioning network and
//! the same job server, so it lives beside the DHCP server, in this module,
//! rather than in a crate of its own.
//!
//! What we advertise, like dnsmasq's `enable-ra` with
//! `dhcp-range=::,constructor:<if>,ra-only`:
//! - router lifetime 0: we are never anybody's default router (§4.2, §6.3.4);
//! - M and O clear: there is no DHCPv6 here;
//! - a Source Link-Layer Address option, so hosts need no Neighbor
//!   Solicitation to reach us;
//! - a Prefix Information option, on-link and autonomous (SLAAC, RFC 4862),
//!   for each /64 prefix (other than link-local) configured on the interface,
//!   or none when it has none: an RA without prefixes still ends iPXE's wait.
//!
//! When (§6.2.4, §6.2.6): [`INITIAL_ADVERTISEMENTS`] fast unsolicited RAs at
//! start, then one about every [`INTERVAL`] with ±25 % jitter, and one in
//! answer to every valid Router Solicitation, multicast to all nodes so one
//! answer serves every host that asked at about the same time. Answers are
//! spaced at least [`MIN_GAP`] apart per interface. RFC 4861 says 3 s
//! (MIN_DELAY_BETWEEN_RAS) and a random delay of up to 0.5 s before each
//! answer; both exist so that several routers on a shared link do not
//! flood it or answer in lockstep. Here we are the only advertiser on a
//! provisioning network and a booting iPXE is waiting on the answer, so we
//! answer at once and keep only a short gap, which still bounds our output
//! to two RAs a second per interface whatever a flood of solicitations
//! does. A solicitation inside the gap is not dropped: it is answered when
//! the gap ends.
//!
//! Validation (§6.1.1) comes before any work: the ICMPv6 type byte is
//! checked first (a raw ICMPv6 socket also receives neighbor discovery and
//! MLD traffic; we set no `ICMP6_FILTER`, which would need unsafe code for a
//! `setsockopt` the socket crates do not wrap, and a one-byte compare is as
//! cheap), then the IPv6 hop limit must be 255 (read with
//! `IPV6_RECVHOPLIMIT`: a smaller one came from off-link), then the message
//! decodes (code 0, at least 8 bytes, every option non-empty and inside
//! the message; the kernel has verified the checksum), then a solicitation
//! from the unspecified address must carry no link-layer address option.
//! Invalid ones are counted in [`RaMetrics`] and logged at debug.
//!
//! The codec is ours ([`wire`]): we need to decode one message with a
//! type-length-value options list and to encode another with two option
//! kinds, about 150 lines. The crates that do ICMPv6 neighbor discovery
//! either keep a single prefix per advertisement (smoltcp's `NdiscRepr`,
//! part of a whole TCP/IP stack), come with macro and runtime crates
//! (pnet_packet), or are shaped around parsing whole Ethernet/IP frames with
//! NDP options added only recently (etherparse), while a raw socket hands
//! us the bare ICMPv6 message.
//!
//! Sockets: one raw ICMPv6 socket per interface (`SO_BINDTODEVICE`), hop
//! limit 255 on multicast and unicast sends (hosts drop RAs with any other,
//! §6.1.2), member of ff02::2 (all-routers, where solicitations go), no
//! multicast loopback (our own RAs would come back to us and to the local
//! kernel). The caller opens them with [`open_socket`], as the other servers
//! get bound sockets, so tests open them inside a network namespace.
//!
//! TODO-robustness: an interface's link-layer address and prefixes are read
//! once, when the caller lists interfaces; a prefix added later is
//! advertised after a restart.

pub mod wire;

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use mprov_process::metrics::Prefixed;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::DropLabels;
use wire::{
    Message, NdOption, PREFIX_AUTONOMOUS, PREFIX_ON_LINK, PrefixInformation, ROUTER_SOLICITATION,
    RouterAdvertisement, RouterSolicitation,
};

/// All-nodes multicast: where advertisements go.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
/// All-routers multicast: where solicitations come to.
pub const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
/// The hop limit of every neighbor discovery packet (§6.1).
pub const ND_HOP_LIMIT: u8 = 255;
/// Mean time between unsolicited advertisements (RFC 4861 allows 4 to
/// 1800 s; a short one helps a host that missed the answer to its
/// solicitation, and costs one small multicast per interval).
pub const INTERVAL: Duration = Duration::from_secs(10);
/// Unsolicited advertisements sent fast at start (RFC 4861's
/// MAX_INITIAL_RTR_ADVERTISEMENTS).
pub const INITIAL_ADVERTISEMENTS: u32 = 3;
/// Time between those first advertisements (RFC 4861 allows up to 16 s).
pub const INITIAL_INTERVAL: Duration = Duration::from_secs(1);
/// The least time between two advertisements on one interface; see the
/// module comment for why it is shorter than RFC 4861's 3 s.
pub const MIN_GAP: Duration = Duration::from_millis(500);
/// Valid lifetime of advertised prefixes, seconds. Re-advertised every
/// [`INTERVAL`], so this only says how long a host keeps its address after
/// the job server stops.
pub const VALID_LIFETIME: u32 = 3600;
/// Preferred lifetime of advertised prefixes, seconds.
pub const PREFERRED_LIFETIME: u32 = 1800;
/// Largest packet read; a solicitation is 8 bytes plus a few options.
const MAX_PACKET: usize = 2048;
/// How long the loop pauses after a receive error that is not "would
/// block", so a persistent one cannot spin.
const ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Timing and lifetimes of the advertiser; [`Default`] is the constants
/// above. Tests shorten them.
#[derive(Debug, Clone)]
pub struct RaConfig {
    /// See [`INTERVAL`].
    pub interval: Duration,
    /// See [`INITIAL_ADVERTISEMENTS`].
    pub initial_advertisements: u32,
    /// See [`INITIAL_INTERVAL`].
    pub initial_interval: Duration,
    /// See [`MIN_GAP`].
    pub min_gap: Duration,
    /// See [`VALID_LIFETIME`].
    pub valid_lifetime: u32,
    /// See [`PREFERRED_LIFETIME`].
    pub preferred_lifetime: u32,
}

impl Default for RaConfig {
    fn default() -> Self {
        Self {
            interval: INTERVAL,
            initial_advertisements: INITIAL_ADVERTISEMENTS,
            initial_interval: INITIAL_INTERVAL,
            min_gap: MIN_GAP,
            valid_lifetime: VALID_LIFETIME,
            preferred_lifetime: PREFERRED_LIFETIME,
        }
    }
}

/// A network interface as the advertiser needs it: read with
/// `getifaddrs(3)` in the calling thread's network namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    /// Its name, e.g. `eth1`.
    pub name: String,
    /// Its index (the scope of its link-local addresses).
    pub index: u32,
    /// Its Ethernet address, if it has one.
    pub mac: Option<[u8; 6]>,
    /// Administratively up.
    pub up: bool,
    /// The loopback interface.
    pub loopback: bool,
    /// Can send and receive multicast.
    pub multicast: bool,
    /// Its IPv4 addresses with their prefix lengths.
    pub ipv4: Vec<(Ipv4Addr, u8)>,
    /// Its IPv6 addresses with their prefix lengths.
    pub ipv6: Vec<(Ipv6Addr, u8)>,
}

impl Interface {
    /// Every interface of the calling thread's network namespace, by name.
    pub fn list() -> io::Result<Vec<Self>> {
        use nix::net::if_::InterfaceFlags;
        let mut out: Vec<Self> = Vec::new();
        for ifa in nix::ifaddrs::getifaddrs().map_err(io::Error::from)? {
            let pos = match out.iter().position(|i| i.name == ifa.interface_name) {
                Some(p) => p,
                None => {
                    out.push(Self {
                        name: ifa.interface_name.clone(),
                        ..Self::default()
                    });
                    out.len() - 1
                }
            };
            let iface = &mut out[pos];
            iface.up = ifa.flags.contains(InterfaceFlags::IFF_UP);
            iface.loopback = ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK);
            iface.multicast = ifa.flags.contains(InterfaceFlags::IFF_MULTICAST);
            let Some(addr) = ifa.address else { continue };
            let mask = ifa.netmask;
            if let Some(link) = addr.as_link_addr() {
                iface.index = u32::try_from(link.ifindex()).unwrap_or(0);
                iface.mac = link.addr().filter(|m| m.iter().any(|&b| b != 0));
            } else if let Some(v4) = addr.as_sockaddr_in() {
                let len = mask
                    .as_ref()
                    .and_then(|m| m.as_sockaddr_in())
                    .map_or(32, |m| prefix_len(&m.ip().octets()));
                iface.ipv4.push((v4.ip(), len));
            } else if let Some(v6) = addr.as_sockaddr_in6() {
                let len = mask
                    .as_ref()
                    .and_then(|m| m.as_sockaddr_in6())
                    .map_or(128, |m| prefix_len(&m.ip().octets()));
                iface.ipv6.push((v6.ip(), len));
            }
        }
        for iface in out.iter_mut().filter(|i| i.index == 0) {
            iface.index = nix::net::if_::if_nametoindex(iface.name.as_str()).unwrap_or(0);
        }
        Ok(out)
    }

    /// Its first link-local IPv6 address: the source of every RA (hosts
    /// drop RAs from any other, §6.1.2).
    pub fn link_local(&self) -> Option<Ipv6Addr> {
        self.ipv6
            .iter()
            .map(|(a, _)| *a)
            .find(Ipv6Addr::is_unicast_link_local)
    }

    /// The /64 prefixes to advertise: of every non-link-local, unicast /64
    /// address, without duplicates, in address order.
    pub fn prefixes(&self) -> Vec<Ipv6Addr> {
        let mut out: Vec<Ipv6Addr> = self
            .ipv6
            .iter()
            .filter(|(a, len)| {
                *len == 64 && !a.is_unicast_link_local() && !a.is_multicast() && !a.is_loopback()
            })
            .map(|(a, _)| Ipv6Addr::from(a.to_bits() & !u128::from(u64::MAX)))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Whether one of its IPv4 addresses is inside `subnet/prefix`.
    pub fn has_ipv4_in(&self, subnet: Ipv4Addr, prefix: u8) -> bool {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(prefix.min(32)))
            .unwrap_or(0);
        self.ipv4
            .iter()
            .any(|(a, _)| a.to_bits() & mask == subnet.to_bits() & mask)
    }
}

/// The interfaces to advertise on when none is named: up, not loopback,
/// multicast-capable, with an IPv4 address inside one of `networks`
/// (`(subnet, prefix length)`, the boot config's networks). Sending RAs on
/// any other interface (a site or management network) could hand its hosts
/// our prefixes.
pub fn provisioning_interfaces(all: &[Interface], networks: &[(Ipv4Addr, u8)]) -> Vec<Interface> {
    all.iter()
        .filter(|i| i.up && !i.loopback && i.multicast)
        .filter(|i| networks.iter().any(|&(s, p)| i.has_ipv4_in(s, p)))
        .cloned()
        .collect()
}

/// Opens the raw ICMPv6 socket for `iface`: bound to it, hop limit 255,
/// member of all-routers, hop limits of received packets reported. Needs
/// CAP_NET_RAW, and runs in the namespace of the calling thread, which must
/// be the interface's.
pub fn open_socket(iface: &Interface) -> io::Result<Socket> {
    let socket = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    socket.bind_device(Some(iface.name.as_bytes()))?;
    socket.set_multicast_if_v6(iface.index)?;
    socket.set_multicast_hops_v6(u32::from(ND_HOP_LIMIT))?;
    socket.set_unicast_hops_v6(u32::from(ND_HOP_LIMIT))?;
    socket.set_multicast_loop_v6(false)?;
    socket.set_recv_hoplimit_v6(true)?;
    socket.join_multicast_v6(&ALL_ROUTERS, iface.index)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// The advertisement for `iface`: never a default router, no DHCPv6, our
/// link-layer address, its /64 prefixes for SLAAC.
pub fn advertisement(iface: &Interface, config: &RaConfig) -> RouterAdvertisement {
    let mut options = Vec::new();
    if let Some(mac) = iface.mac {
        options.push(NdOption::SourceLinkLayer(mac.to_vec()));
    }
    for prefix in iface.prefixes() {
        options.push(NdOption::Prefix(PrefixInformation {
            prefix_len: 64,
            flags: PREFIX_ON_LINK | PREFIX_AUTONOMOUS,
            valid_lifetime: config.valid_lifetime,
            preferred_lifetime: config.preferred_lifetime,
            prefix,
        }));
    }
    RouterAdvertisement {
        cur_hop_limit: 0,
        flags: 0,
        router_lifetime: 0,
        reachable_time: 0,
        retrans_timer: 0,
        options,
    }
}

/// Why a received packet is not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The IPv6 hop limit is not 255: it was routed, so not from this link.
    HopLimit,
    /// Not a valid Router Solicitation (see [`wire::DecodeError`]).
    Malformed(wire::DecodeError),
    /// Another ICMPv6 type (neighbor discovery, MLD, echo, other routers'
    /// advertisements, ...).
    NotSolicitation,
    /// Larger than the receive buffer.
    Oversized,
    /// From the unspecified address but with a link-layer address option
    /// (§6.1.1).
    UnspecifiedWithLinkLayer,
}

impl Reason {
    /// A short name, for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HopLimit => "hop_limit",
            Self::Malformed(_) => "malformed",
            Self::NotSolicitation => "not_solicitation",
            Self::Oversized => "oversized",
            Self::UnspecifiedWithLinkLayer => "unspecified_with_link_layer",
        }
    }

    /// Whether the packet was an invalid solicitation (counted as malformed),
    /// rather than simply not for us.
    pub fn is_malformed(self) -> bool {
        !matches!(self, Self::NotSolicitation)
    }
}

/// Checks a received ICMPv6 message per RFC 4861 §6.1.1, cheapest test
/// first: a Router Solicitation from `src`, received with IPv6 hop limit
/// `hop_limit` (`None`: the kernel did not say, which it always does once
/// `IPV6_RECVHOPLIMIT` is set).
pub fn check_solicitation(
    packet: &[u8],
    src: Ipv6Addr,
    hop_limit: Option<u8>,
) -> Result<RouterSolicitation, Reason> {
    if packet.first() != Some(&ROUTER_SOLICITATION) {
        return Err(Reason::NotSolicitation);
    }
    if hop_limit.is_some_and(|h| h != ND_HOP_LIMIT) {
        return Err(Reason::HopLimit);
    }
    let rs = match Message::decode(packet) {
        Ok(Message::RouterSolicitation(rs)) => rs,
        Ok(Message::RouterAdvertisement(_)) => return Err(Reason::NotSolicitation),
        Err(err) => return Err(Reason::Malformed(err)),
    };
    if src.is_unspecified() && rs.source_link_layer().is_some() {
        return Err(Reason::UnspecifiedWithLinkLayer);
    }
    Ok(rs)
}

/// The label of a sent advertisement.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct SentLabels {
    /// `solicited` or `unsolicited`.
    pub kind: &'static str,
}

/// The advertiser's counters, in the style of [`crate::Metrics`]. Clones
/// share the values; [`RaMetrics::default`] counts into the void.
#[derive(Debug, Clone, Default)]
pub struct RaMetrics {
    /// Advertisements sent, solicited or not.
    pub sent: Family<SentLabels, Counter>,
    /// Valid Router Solicitations received.
    pub solicitations: Counter,
    /// Packets not answered, by reason.
    pub drops: Family<DropLabels, Counter>,
    /// Invalid Router Solicitations.
    pub malformed: Counter,
    /// Advertisements the kernel refused to send.
    pub send_errors: Counter,
}

impl RaMetrics {
    /// New metrics, registered into `registry` with the `ra` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let mut r = Prefixed::new(registry, "ra");
        RaMetrics {
            sent: r.metric("sent", "Router advertisements sent"),
            solicitations: r.metric("solicitations", "Valid router solicitations received"),
            drops: r.metric("drops", "Packets not answered, by reason"),
            malformed: r.metric("malformed", "Invalid router solicitations"),
            send_errors: r.metric(
                "send_errors",
                "Router advertisements the kernel refused to send",
            ),
        }
    }

    /// Counts a packet not answered.
    pub fn dropped(&self, reason: Reason) {
        if reason.is_malformed() {
            self.malformed.inc();
        }
        self.drops
            .get_or_create(&DropLabels {
                reason: reason.as_str(),
            })
            .inc();
    }
}

/// The advertiser. Clones share config and metrics.
#[derive(Debug, Clone, Default)]
pub struct Server {
    config: Arc<RaConfig>,
    metrics: RaMetrics,
}

impl Server {
    /// An advertiser with `config`.
    pub fn new(config: RaConfig) -> Self {
        Self {
            config: Arc::new(config),
            metrics: RaMetrics::default(),
        }
    }

    /// Uses `metrics` (usually from [`RaMetrics::register`]).
    pub fn with_metrics(mut self, metrics: RaMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The metrics.
    pub fn metrics(&self) -> &RaMetrics {
        &self.metrics
    }

    /// Advertises on every `(interface, socket)` pair (sockets from
    /// [`open_socket`]) until `shutdown` is cancelled. Fails only if a
    /// socket cannot join the runtime; send and receive errors are logged
    /// and counted, and the advertiser goes on.
    pub async fn run(
        self,
        links: Vec<(Interface, Socket)>,
        shutdown: CancellationToken,
    ) -> io::Result<()> {
        let tracker = TaskTracker::new();
        for (iface, socket) in links {
            // Tokio's UDP socket is its plain datagram-socket wrapper; a raw
            // ICMPv6 socket is a datagram socket too, and `try_io` lets us
            // call `recvmsg` on it for the hop limit.
            let fd = UdpSocket::from_std(std::net::UdpSocket::from(socket))?;
            let this = self.clone();
            let stop = shutdown.clone();
            tracker.spawn(async move { this.advertise(iface, fd, stop).await });
        }
        tracker.close();
        tracker.wait().await;
        Ok(())
    }

    /// The loop of one interface: a timer for the next advertisement and
    /// the socket for solicitations.
    async fn advertise(self, iface: Interface, fd: UdpSocket, shutdown: CancellationToken) {
        let ra = Message::RouterAdvertisement(advertisement(&iface, &self.config)).encode();
        let dest = SocketAddr::V6(SocketAddrV6::new(ALL_NODES, 0, 0, iface.index));
        let mut buf = vec![0u8; MAX_PACKET];
        let mut initial_left = self.config.initial_advertisements;
        let mut last_sent: Option<Instant> = None;
        let mut unsolicited_at = Instant::now();
        let mut solicited_at: Option<Instant> = None;
        let mut failing = false;
        loop {
            let next = solicited_at.map_or(unsolicited_at, |s| s.min(unsolicited_at));
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep_until(next) => {
                    let now = Instant::now();
                    let kind = if solicited_at.is_some_and(|s| s <= now) {
                        "solicited"
                    } else {
                        "unsolicited"
                    };
                    match fd.send_to(&ra, dest).await {
                        Ok(_) => {
                            if failing {
                                tracing::info!(interface = %iface.name, "router advertisements go out again");
                                failing = false;
                            }
                            tracing::debug!(interface = %iface.name, kind, "router advertisement sent");
                            self.metrics.sent.get_or_create(&SentLabels { kind }).inc();
                        }
                        Err(err) => {
                            // Typically while the link-local address is
                            // still tentative (duplicate address detection)
                            // or the link is down; the next one may pass.
                            if !failing {
                                tracing::warn!(interface = %iface.name, error = %err, "cannot send a router advertisement");
                                failing = true;
                            } else {
                                tracing::debug!(interface = %iface.name, error = %err, "cannot send a router advertisement");
                            }
                            self.metrics.send_errors.inc();
                        }
                    }
                    // One multicast RA answers every solicitation so far and
                    // restarts the unsolicited timer.
                    last_sent = Some(now);
                    solicited_at = None;
                    let mean = if initial_left > 0 {
                        initial_left -= 1;
                        self.config.initial_interval
                    } else {
                        self.config.interval
                    };
                    unsolicited_at = now + jitter(mean);
                }
                r = fd.readable() => {
                    let received = r.and_then(|()| {
                        fd.try_io(Interest::READABLE, || receive(&fd, &mut buf))
                    });
                    let received = match received {
                        Ok(r) => r,
                        Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(err) => {
                            tracing::debug!(interface = %iface.name, error = %err, "receive failed");
                            tokio::time::sleep(ERROR_PAUSE).await;
                            continue;
                        }
                    };
                    let Some((len, src, hop_limit)) = received else {
                        self.metrics.dropped(Reason::Oversized);
                        tracing::debug!(interface = %iface.name, "oversized ICMPv6 packet dropped");
                        continue;
                    };
                    match check_solicitation(&buf[..len], src, hop_limit) {
                        Ok(_) => {
                            self.metrics.solicitations.inc();
                            let now = Instant::now();
                            let earliest = last_sent.map_or(now, |t| (t + self.config.min_gap).max(now));
                            solicited_at = Some(solicited_at.map_or(earliest, |s| s.min(earliest)));
                            tracing::debug!(interface = %iface.name, %src, "router solicitation");
                        }
                        Err(Reason::NotSolicitation) => {
                            self.metrics.dropped(Reason::NotSolicitation);
                        }
                        Err(reason) => {
                            tracing::debug!(interface = %iface.name, %src, ?hop_limit, reason = reason.as_str(), detail = ?reason, "invalid router solicitation dropped");
                            self.metrics.dropped(reason);
                        }
                    }
                }
            }
        }
    }
}

/// Reads one packet: its length, source and IPv6 hop limit; `None` when it
/// did not fit the buffer.
fn receive(
    socket: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<Option<(usize, Ipv6Addr, Option<u8>)>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, SockaddrIn6, recvmsg};
    let mut iov = [io::IoSliceMut::new(buf)];
    let mut cmsg = nix::cmsg_space!(std::ffi::c_int);
    let msg = recvmsg::<SockaddrIn6>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::empty(),
    )
    .map_err(io::Error::from)?;
    if msg.flags.contains(MsgFlags::MSG_TRUNC) {
        return Ok(None);
    }
    let hop_limit = msg.cmsgs().ok().and_then(|mut c| {
        c.find_map(|m| match m {
            ControlMessageOwned::Ipv6HopLimit(h) => u8::try_from(h).ok(),
            _ => None,
        })
    });
    let src = msg.address.map_or(Ipv6Addr::UNSPECIFIED, |a| a.ip());
    Ok(Some((msg.bytes, src, hop_limit)))
}

/// `mean` ± 25 %, uniformly (RFC 4861 §6.2.4 wants unsolicited RAs at
/// random intervals, so that routers do not synchronise).
fn jitter(mean: Duration) -> Duration {
    let r = getrandom::u32().unwrap_or(u32::MAX / 2);
    // 750..=1250 thousandths of the mean.
    let per_mille = 750 + r % 501;
    mean * per_mille / 1000
}

/// The prefix length of a netmask: its leading one bits.
fn prefix_len(mask: &[u8]) -> u8 {
    let full = mask.iter().take_while(|&&b| b == 0xff).count();
    let partial = mask.get(full).map_or(0, |b| b.leading_ones());
    u8::try_from(full * 8 + partial as usize).unwrap_or(u8::MAX)
}

/// Fuzzing entry point: decodes arbitrary bytes as a Router Solicitation or
/// Advertisement and checks that whatever decodes re-encodes to a message
/// that decodes to the same value; also runs the solicitation checks.
/// Panics only if that property fails.
pub fn fuzz_packet(data: &[u8]) {
    if let Ok(msg) = Message::decode(data) {
        let again = Message::decode(&msg.encode());
        assert_eq!(again.as_ref(), Ok(&msg), "decode(encode(x)) != x");
    }
    for src in [
        Ipv6Addr::UNSPECIFIED,
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1),
    ] {
        for hop_limit in [None, Some(ND_HOP_LIMIT), Some(1)] {
            let _ = check_solicitation(data, src, hop_limit);
        }
    }
}

#[cfg(test)]
mod tests;
