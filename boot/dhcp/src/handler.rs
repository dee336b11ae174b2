//! The DHCP protocol logic: one request in, one decision out, no sockets.
//!
//! [`handle`] is a pure function of the request, the indexed snapshot, the
//! config, the clock and the lease table, so every rule below is unit-tested
//! without a network. The listener ([`crate::server`]) commits the decision's
//! lease record and only then sends the reply.
//!
//! Rules, with their sources:
//! - Message flow DISCOVER→OFFER, REQUEST→ACK/NAK, RELEASE, DECLINE, INFORM:
//!   RFC 2131 §3 and §4.3. A REQUEST naming another server (option 54) is not
//!   ours and is dropped (§4.3.2, SELECTING state).
//! - Which network: the one containing giaddr for relayed packets (RFC 2131
//!   §4.3.1), else the one containing our own address.
//! - Where the reply goes: RFC 2131 §4.1 (see [`destination`]).
//! - Replies are padded to the 300-byte BOOTP minimum (RFC 1542 §3.1.5):
//!   some relays and PXE ROMs drop shorter packets.
//! - Relay agent information (option 82) is echoed (RFC 3046 §2.2).
//! - PXE boot files by client architecture (option 93, RFC 4578 §2.1), iPXE
//!   recognised by user class "iPXE" (option 77, RFC 3004) or its
//!   encapsulated option 175, so it is sent its script and never loops back
//!   to loading iPXE. UEFI HTTP boot (architecture 16) gets a URL and class
//!   `HTTPClient` (UEFI 2.x §24.7).
//! - proxyDHCP (PXE 2.1 §2.2.5): boot information only, no `yiaddr`; the
//!   OFFER on port 67 names no boot file (except for HTTP boot), so PXE
//!   clients ask again on port 4011 and get it in that ACK.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use dhcproto::v4::{
    Architecture, DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode,
};

use crate::config::DhcpConfig;
use crate::inventory::{Host, Inventory, Mac, Network};
use crate::store::{LeaseKind, LeaseRecord};
use crate::table::{LeaseTable, Pick, State};

/// The BOOTP minimum message size (RFC 1542 §3.1.5).
pub const MIN_REPLY_LEN: usize = 300;
/// The DHCP server port.
pub const SERVER_PORT: u16 = 67;
/// The DHCP client port.
pub const CLIENT_PORT: u16 = 68;
/// The PXE boot server port (proxyDHCP's second exchange).
pub const PXE_PORT: u16 = 4011;
/// How long a DECLINEd address stays quarantined, seconds.
const DECLINE_HOLD: u64 = 10 * 60;
/// iPXE's encapsulated options.
const IPXE_ENCAP: u8 = 175;

/// What the handler knows about the packet besides its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The server's config.
    pub config: &'a DhcpConfig,
    /// The current snapshot, indexed.
    pub inventory: &'a Inventory,
    /// Now, Unix seconds.
    pub now: u64,
    /// Who sent the packet.
    pub src: SocketAddr,
    /// The port the packet arrived on: off 67, replies go back to `src`.
    pub local_port: u16,
}

/// The kind of reply, for metrics and the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    /// DHCPACK.
    Ack,
    /// DHCPNAK.
    Nak,
    /// DHCPOFFER.
    Offer,
}

impl ReplyKind {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ack => "ack",
            Self::Nak => "nak",
            Self::Offer => "offer",
        }
    }
}

/// A reply to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// What kind.
    pub kind: ReplyKind,
    /// The message.
    pub msg: Message,
    /// Where to.
    pub dest: SocketAddr,
}

/// Why a packet got no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Hardware type is not Ethernet or length is not 6.
    BadHardware,
    /// A DHCPDECLINE was recorded.
    Declined,
    /// The lease could not be made durable, so the ACK was not sent.
    LeaseLogFailed,
    /// The packet did not decode.
    Malformed,
    /// A message type we do not handle here.
    NoMessageType,
    /// No network here serves DHCP for this packet.
    NotServed,
    /// A BOOTREPLY, not a request.
    NotRequest,
    /// Addressed to another server (option 54).
    OtherServer,
    /// proxyDHCP: not a PXE client, or nothing to boot.
    NotPxe,
    /// The pool has no free address.
    PoolExhausted,
    /// A DHCPRELEASE was recorded (or ignored as not matching).
    Released,
    /// A REQUEST with no address in it.
    NoRequestedAddress,
    /// Handling took longer than the configured limit.
    Timeout,
    /// A message type we do not answer.
    Unsupported,
}

impl Reason {
    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadHardware => "bad_hardware",
            Self::Declined => "declined",
            Self::LeaseLogFailed => "lease_log_failed",
            Self::Malformed => "malformed",
            Self::NoMessageType => "no_message_type",
            Self::NoRequestedAddress => "no_requested_address",
            Self::NotPxe => "not_pxe",
            Self::NotRequest => "not_request",
            Self::NotServed => "not_served",
            Self::OtherServer => "other_server",
            Self::PoolExhausted => "pool_exhausted",
            Self::Released => "released",
            Self::Timeout => "timeout",
            Self::Unsupported => "unsupported",
        }
    }

    /// Whether this counts as a drop (and not as a handled RELEASE/DECLINE).
    pub fn is_drop(self) -> bool {
        !matches!(self, Self::Declined | Self::Released)
    }
}

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send nothing.
    NoResponse(Reason),
    /// Send this reply.
    Respond(Box<Reply>),
}

/// The decision for one packet: first make `commit` durable, then act.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The action, taken only after `commit` is durable.
    pub action: Action,
    /// A lease change to log first.
    pub commit: Option<LeaseRecord>,
    /// What happened to a pool, for the log and the metrics.
    pub pool: Option<PoolEvent>,
}

impl Outcome {
    fn drop(reason: Reason) -> Self {
        Self {
            action: Action::NoResponse(reason),
            commit: None,
            pool: None,
        }
    }
}

/// A pool's change of state, reported by [`handle`] for the listener to log
/// and count (the handler itself does no I/O).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolEvent {
    /// The pool had no free address, for the first time in this episode:
    /// the one warning an admin sees.
    Exhausted {
        /// The network's slug.
        network: String,
        /// The pool's first and last address.
        pool: (Ipv4Addr, Ipv4Addr),
        /// Addresses in the pool.
        size: u64,
        /// Of those, bound to a client.
        bound: u64,
        /// Of those, held by an OFFER not yet confirmed.
        offered: u64,
        /// Whether an unconfirmed OFFER's address was reclaimed for this
        /// client (else it got no answer: every address is bound).
        reclaimed: bool,
    },
    /// No free address, so the oldest unconfirmed OFFER's address was offered
    /// to this client instead (counted).
    Reclaimed {
        /// The network's slug.
        network: String,
    },
    /// A full pool has a free address again: the episode is over.
    Recovered {
        /// The network's slug.
        network: String,
    },
}

/// Checks the fixed BOOTP header on raw bytes, before any decoding: op must
/// be BOOTREQUEST (1), htype Ethernet (1), hlen 6 (RFC 2131 §2).
pub fn prefilter(bytes: &[u8]) -> Result<(), Reason> {
    match bytes {
        [1, 1, 6, ..] if bytes.len() >= 240 => Ok(()),
        [op, ..] if *op != 1 => Err(Reason::NotRequest),
        [_, 1, 6, ..] => Err(Reason::Malformed),
        [_, _, _, ..] => Err(Reason::BadHardware),
        _ => Err(Reason::Malformed),
    }
}

/// Decodes a request that passed [`prefilter`], through the guard the
/// agent's DHCP client shares ([`mprov_dhcp_decode::decode`]: option
/// lengths dhcproto would trip over are refused, and a panic of dhcproto is
/// caught), so that no packet can take the server down.
pub fn decode(bytes: &[u8]) -> Result<Message, Reason> {
    use mprov_dhcp_decode::DecodeError;
    mprov_dhcp_decode::decode(bytes).map_err(|err| {
        match err {
            DecodeError::Panicked => tracing::warn!("dhcproto panicked on a packet; dropped"),
            err => tracing::debug!(error = %mprov_process::chain(&err), "malformed DHCP packet"),
        }
        Reason::Malformed
    })
}

/// Decides what to do with `req`; see the module docs.
pub fn handle(req: &Message, ctx: &Context<'_>, table: &mut LeaseTable) -> Outcome {
    if req.opcode() != Opcode::BootRequest {
        return Outcome::drop(Reason::NotRequest);
    }
    if req.htype() != HType::Eth || req.hlen() != 6 {
        return Outcome::drop(Reason::BadHardware);
    }
    let Some(mtype) = req.opts().msg_type() else {
        return Outcome::drop(Reason::NoMessageType);
    };
    let mut mac: Mac = [0; 6];
    mac.copy_from_slice(&req.chaddr()[..6]);
    if let Some(DhcpOption::ServerIdentifier(id)) = req.opts().get(OptionCode::ServerIdentifier)
        && *id != ctx.config.server_ip
    {
        // RFC 2131 §4.3.2: a REQUEST naming another server means our OFFER
        // was declined; stop holding the address for this client.
        if mtype == MessageType::Request
            && let Some((ip, b)) = table.of_mac(&mac)
            && b.state == State::Offered
        {
            table.release(ip, &mac);
        }
        return Outcome::drop(Reason::OtherServer);
    }
    let host = ctx.inventory.hosts.get(&mac);

    if ctx.config.proxy {
        return proxy(req, ctx, mtype, host);
    }

    let relayed = !req.giaddr().is_unspecified();
    let anchor = if relayed {
        req.giaddr()
    } else {
        ctx.config.server_ip
    };
    let Some(net) = ctx.inventory.network_of(anchor).filter(|n| n.dhcp) else {
        return Outcome::drop(Reason::NotServed);
    };
    // A reservation counts on the network it belongs to only.
    let reserved = host.and_then(|h| h.ip).filter(|ip| net.contains(*ip));
    let requested = match req.opts().get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
        _ => None,
    };

    match mtype {
        MessageType::Discover => {
            let mut event = None;
            let (ip, lease) = if let Some(ip) = reserved {
                (ip, ctx.config.reserved_lease.as_secs())
            } else {
                let (ip, ev) = pick_pool_address(ctx, table, net, &mac, requested);
                event = ev;
                let Some(ip) = ip else {
                    return Outcome {
                        pool: event,
                        ..Outcome::drop(Reason::PoolExhausted)
                    };
                };
                (ip, ctx.config.pool_lease.as_secs())
            };
            table.offer(ip, mac, ctx.now + ctx.config.offer_hold.as_secs());
            let mut msg = reply(req, MessageType::Offer, ctx);
            msg.set_yiaddr(ip);
            add_lease_options(&mut msg, net, host, lease);
            add_boot(&mut msg, req, ctx, net, host);
            Outcome {
                pool: event,
                ..respond(req, ctx, ReplyKind::Offer, msg, None)
            }
        }
        MessageType::Request => {
            let ciaddr = req.ciaddr();
            let Some(ip) = requested.or((!ciaddr.is_unspecified()).then_some(ciaddr)) else {
                return Outcome::drop(Reason::NoRequestedAddress);
            };
            let ok = match reserved {
                Some(r) => r == ip,
                None => {
                    net.in_pool(ip)
                        && !ctx.inventory.reserved_for_other(ip, &mac)
                        && table.free_for(ip, &mac, ctx.now)
                }
            };
            if !ok {
                let mut msg = reply(req, MessageType::Nak, ctx);
                msg.set_flags(Flags::default().set_broadcast());
                return respond(req, ctx, ReplyKind::Nak, msg, None);
            }
            let lease = if reserved.is_some() {
                ctx.config.reserved_lease.as_secs()
            } else {
                ctx.config.pool_lease.as_secs()
            };
            let expires = ctx.now + lease;
            table.set(ip, mac, expires, State::Bound);
            let mut msg = reply(req, MessageType::Ack, ctx);
            msg.set_yiaddr(ip);
            msg.set_ciaddr(ciaddr);
            add_lease_options(&mut msg, net, host, lease);
            add_boot(&mut msg, req, ctx, net, host);
            let commit = LeaseRecord {
                kind: LeaseKind::Bound,
                mac,
                ip,
                expires,
            };
            respond(req, ctx, ReplyKind::Ack, msg, Some(commit))
        }
        MessageType::Release => {
            let ip = req.ciaddr();
            let commit = table.release(ip, &mac).then_some(LeaseRecord {
                kind: LeaseKind::Free,
                mac,
                ip,
                expires: ctx.now,
            });
            Outcome {
                action: Action::NoResponse(Reason::Released),
                commit,
                pool: None,
            }
        }
        MessageType::Decline => {
            if let Some(ip) = requested
                && table.binding(ip).is_some_and(|b| b.mac == mac)
            {
                tracing::warn!(%ip, "client declined an address: in use by someone else?");
                table.set(ip, mac, ctx.now + DECLINE_HOLD, State::Declined);
            }
            Outcome::drop(Reason::Declined)
        }
        MessageType::Inform => {
            // RFC 2131 §4.3.5: configuration only; no yiaddr, no lease time.
            let mut msg = reply(req, MessageType::Ack, ctx);
            msg.set_ciaddr(req.ciaddr());
            add_lease_options(&mut msg, net, host, 0);
            msg.opts_mut().remove(OptionCode::AddressLeaseTime);
            add_boot(&mut msg, req, ctx, net, host);
            respond(req, ctx, ReplyKind::Ack, msg, None)
        }
        _ => Outcome::drop(Reason::Unsupported),
    }
}

/// A pool address for a client without a reservation: the one it holds, the
/// one it asks for, the next free one, or else the oldest unconfirmed offer's
/// (see [`LeaseTable::allocate`]). Addresses the inventory assigns to any
/// host are never used. Also what this did to the pool's exhaustion episode.
fn pick_pool_address(
    ctx: &Context<'_>,
    table: &mut LeaseTable,
    net: &Network,
    mac: &Mac,
    requested: Option<Ipv4Addr>,
) -> (Option<Ipv4Addr>, Option<PoolEvent>) {
    let Some(pool) = net.pool else {
        return (None, None);
    };
    let usable = |ip: Ipv4Addr, table: &LeaseTable| {
        net.in_pool(ip)
            && !ctx.inventory.reserved.contains_key(&ip)
            && table.free_for(ip, mac, ctx.now)
    };
    if let Some((ip, _)) = table.of_mac(mac)
        && usable(ip, table)
    {
        return (Some(ip), None);
    }
    if let Some(ip) = requested
        && usable(ip, table)
    {
        return (Some(ip), None);
    }
    let network = || net.slug.clone();
    match table.allocate(pool, mac, ctx.now, |ip| {
        ctx.inventory.reserved.contains_key(&ip)
    }) {
        Pick::Free(ip) => {
            let ended = table.mark_available(pool);
            (
                Some(ip),
                ended.then(|| PoolEvent::Recovered { network: network() }),
            )
        }
        full => {
            let event = if table.mark_exhausted(pool) {
                let (bound, offered, _) = table.census(pool, ctx.now);
                Some(PoolEvent::Exhausted {
                    network: network(),
                    pool,
                    size: u64::from(u32::from(pool.1).saturating_sub(u32::from(pool.0))) + 1,
                    bound,
                    offered,
                    reclaimed: matches!(full, Pick::Reclaimed(_)),
                })
            } else if let Pick::Reclaimed(_) = full {
                Some(PoolEvent::Reclaimed { network: network() })
            } else {
                None
            };
            match full {
                Pick::Reclaimed(ip) => (Some(ip), event),
                _ => (None, event),
            }
        }
    }
}

/// proxyDHCP: answer PXE clients with boot information and nothing else.
fn proxy(req: &Message, ctx: &Context<'_>, mtype: MessageType, host: Option<&Host>) -> Outcome {
    let kind = match mtype {
        MessageType::Discover => ReplyKind::Offer,
        MessageType::Request | MessageType::Inform => ReplyKind::Ack,
        _ => return Outcome::drop(Reason::Unsupported),
    };
    let anchor = if req.giaddr().is_unspecified() {
        ctx.config.server_ip
    } else {
        req.giaddr()
    };
    let net = ctx.inventory.network_of(anchor);
    let Some(boot) = boot_file(req, ctx, net, host, true) else {
        return Outcome::drop(Reason::NotPxe);
    };
    let mtype = match kind {
        ReplyKind::Offer => MessageType::Offer,
        _ => MessageType::Ack,
    };
    let mut msg = reply(req, mtype, ctx);
    msg.set_ciaddr(req.ciaddr());
    // PXE 2.1 §2.2.5, the "BINL" way of a proxy on another host than the
    // site's DHCP server: the OFFER on port 67 carries class PXEClient, no
    // boot file and no PXE discovery options (option 43); the client then
    // asks the proxy again on port 4011 (iPXE's ProxyDHCPREQUEST, EDK2's
    // BINL retry), and that ACK names the boot file. Discovery options
    // would make EDK2 (OVMF) look for a boot menu, and a missing menu means
    // "boot locally" to it (PXE-E21). HTTP boot has no second exchange: its
    // OFFER carries the URL.
    let second_phase = ctx.local_port == PXE_PORT;
    if boot.http || second_phase || kind == ReplyKind::Ack {
        apply_boot(&mut msg, ctx, &boot);
    }
    if !boot.http {
        msg.opts_mut()
            .insert(DhcpOption::ClassIdentifier(b"PXEClient".to_vec()));
        // A boot server request (port 4011) that names a boot item
        // (sub-option 71) gets it echoed, as PXE 2.1 §2.2.6 asks of a boot
        // server.
        if let Some(item) = boot_item(req).filter(|_| second_phase) {
            msg.opts_mut().insert(DhcpOption::VendorExtensions(
                [&[71, 4][..], &item, &[255]].concat(),
            ));
        }
    }
    respond(req, ctx, kind, msg, None)
}

/// The PXE boot item (type and layer, PXE 2.1 Table 2-1 sub-option 71) a
/// PXE client's vendor options (option 43) name, if any.
fn boot_item(req: &Message) -> Option<[u8; 4]> {
    let Some(DhcpOption::VendorExtensions(v)) = req.opts().get(OptionCode::VendorExtensions) else {
        return None;
    };
    let mut rest = v.as_slice();
    while let [code, tail @ ..] = rest {
        match *code {
            0 => rest = tail,
            255 => return None,
            code => {
                let [len, tail @ ..] = tail else {
                    return None;
                };
                let value = tail.get(..usize::from(*len))?;
                if code == 71 {
                    return value.try_into().ok();
                }
                rest = &tail[value.len()..];
            }
        }
    }
    None
}

/// The skeleton of a reply to `req` (RFC 2131 Table 3).
fn reply(req: &Message, mtype: MessageType, ctx: &Context<'_>) -> Message {
    let mut msg = Message::new_with_id(
        req.xid(),
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        req.giaddr(),
        &req.chaddr()[..6],
    );
    msg.set_opcode(Opcode::BootReply);
    msg.set_flags(req.flags());
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::MessageType(mtype));
    opts.insert(DhcpOption::ServerIdentifier(ctx.config.server_ip));
    if let Some(relay) = req.opts().get(OptionCode::RelayAgentInformation) {
        opts.insert(relay.clone());
    }
    msg
}

fn add_lease_options(msg: &mut Message, net: &Network, host: Option<&Host>, lease: u64) {
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::SubnetMask(net.mask));
    if let Some(gw) = net.gateway {
        opts.insert(DhcpOption::Router(vec![gw]));
    }
    if !net.nameservers.is_empty() {
        opts.insert(DhcpOption::DomainNameServer(net.nameservers.clone()));
    }
    if !net.domain.is_empty() {
        opts.insert(DhcpOption::DomainName(net.domain.clone()));
    }
    if let Some(h) = host.filter(|h| !h.hostname.is_empty()) {
        opts.insert(DhcpOption::Hostname(h.hostname.clone()));
    }
    let lease = u32::try_from(lease).unwrap_or(u32::MAX);
    opts.insert(DhcpOption::AddressLeaseTime(lease));
    // T1 and T2 at the RFC 2131 §4.4.5 defaults (0.5 and 0.875).
    opts.insert(DhcpOption::Renewal(lease / 2));
    opts.insert(DhcpOption::Rebinding(lease / 8 * 7));
}

/// What a client boots.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Boot {
    file: String,
    /// UEFI HTTP boot: the file is a URL and the reply says `HTTPClient`.
    http: bool,
}

/// The boot file for this client, if it is a network-boot client and may boot.
fn boot_file(
    req: &Message,
    ctx: &Context<'_>,
    net: Option<&Network>,
    host: Option<&Host>,
    proxy: bool,
) -> Option<Boot> {
    if host.is_some_and(|h| !h.netboot) {
        return None;
    }
    let opts = req.opts();
    let class = match opts.get(OptionCode::ClassIdentifier) {
        Some(DhcpOption::ClassIdentifier(c)) => c.as_slice(),
        _ => &[],
    };
    let user_class_ipxe = match opts.get(OptionCode::UserClass) {
        Some(DhcpOption::UserClass(u)) => u.windows(4).any(|w| w == b"iPXE"),
        _ => false,
    };
    if user_class_ipxe || opts.get(OptionCode::from(IPXE_ENCAP)).is_some() {
        return ctx
            .inventory
            .ipxe_script_url
            .clone()
            .map(|file| Boot { file, http: false });
    }
    let arch = match opts.get(OptionCode::ClientSystemArchitecture) {
        Some(DhcpOption::ClientSystemArchitecture(a)) => Some(*a),
        _ => None,
    };
    let pxe = class.starts_with(b"PXEClient");
    let http = class.starts_with(b"HTTPClient");
    if arch.is_none() && !pxe && !http {
        return None;
    }
    if proxy && !pxe && !http {
        return None;
    }
    if http || arch == Some(Architecture::X64_Http) {
        // The network's URL first, then the server's.
        return net
            .and_then(|n| n.http_boot_url.clone())
            .or_else(|| ctx.config.http_boot_url.clone())
            .map(|file| Boot { file, http: true });
    }
    let file = match arch.unwrap_or(Architecture::X86_Bios) {
        Architecture::X86_Bios => &ctx.config.bios_file,
        Architecture::X64 | Architecture::BC => &ctx.config.x64_efi_file,
        Architecture::Arm64 => &ctx.config.arm64_efi_file,
        _ => return None,
    };
    Some(Boot {
        file: file.clone(),
        http: false,
    })
}

fn add_boot(
    msg: &mut Message,
    req: &Message,
    ctx: &Context<'_>,
    net: &Network,
    host: Option<&Host>,
) {
    if !net.netboot {
        return;
    }
    if let Some(boot) = boot_file(req, ctx, Some(net), host, false) {
        apply_boot(msg, ctx, &boot);
    }
}

fn apply_boot(msg: &mut Message, ctx: &Context<'_>, boot: &Boot) {
    msg.set_siaddr(ctx.config.next_server());
    // `file` holds 128 bytes with its NUL; longer names (URLs) travel in
    // option 67 only (RFC 2132 §9.5).
    if boot.file.len() < 128 {
        msg.set_fname_str(&boot.file);
    }
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::BootfileName(boot.file.as_bytes().to_vec()));
    if boot.http {
        opts.insert(DhcpOption::ClassIdentifier(b"HTTPClient".to_vec()));
    }
}

fn respond(
    req: &Message,
    ctx: &Context<'_>,
    kind: ReplyKind,
    msg: Message,
    commit: Option<LeaseRecord>,
) -> Outcome {
    let dest = destination(req, ctx, kind);
    Outcome {
        action: Action::Respond(Box::new(Reply { kind, msg, dest })),
        commit,
        pool: None,
    }
}

/// Where a reply goes (RFC 2131 §4.1): to the relay (giaddr, port 67); a NAK
/// is broadcast; to `ciaddr` if the client has one; otherwise broadcast.
/// A request that arrived on another port than 67 (PXE port 4011, or a test
/// server on port 0) is answered at its source address and port.
///
/// TODO-robustness: without the broadcast flag, RFC 2131 lets a server
/// unicast to `yiaddr` at `chaddr`, which needs an ARP entry injected
/// (`SIOCSARP`, unsafe here); we broadcast instead, which every client accepts.
pub fn destination(req: &Message, ctx: &Context<'_>, kind: ReplyKind) -> SocketAddr {
    if ctx.local_port != SERVER_PORT {
        return ctx.src;
    }
    let v4 = |ip, port| SocketAddr::V4(SocketAddrV4::new(ip, port));
    if !req.giaddr().is_unspecified() {
        return v4(req.giaddr(), SERVER_PORT);
    }
    if kind != ReplyKind::Nak && !req.ciaddr().is_unspecified() {
        return v4(req.ciaddr(), CLIENT_PORT);
    }
    v4(Ipv4Addr::BROADCAST, CLIENT_PORT)
}

/// Encodes a reply, padded to [`MIN_REPLY_LEN`].
pub fn encode(msg: &Message) -> Result<Vec<u8>, dhcproto::error::EncodeError> {
    use dhcproto::Encodable;
    let mut bytes = msg.to_vec()?;
    if bytes.len() < MIN_REPLY_LEN {
        bytes.resize(MIN_REPLY_LEN, 0);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests;
