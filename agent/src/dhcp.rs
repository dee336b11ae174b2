//! The agent's DHCPv4 client, the pure part: the messages it sends and what
//! a reply means, on dhcproto (codec only), as a small state machine
//! (RFC 2131 section 4.4: DISCOVER, OFFER, REQUEST, ACK).
//!
//! Replies are untrusted bytes from the network (the `agent_dhcp` fuzz
//! target): the fixed header is checked on the raw bytes (a BOOTREPLY for
//! a 6-byte Ethernet address), then they are decoded through the guard the
//! job server's DHCP server uses ([`mprov_dhcp_decode::decode`]: lengths
//! dhcproto would trip over are refused before it sees them), and anything that is not a
//! BOOTREPLY to our transaction and our MAC, with a message type, a server
//! identifier and a usable address, is ignored rather than believed.

use std::net::Ipv4Addr;
use std::time::Duration;

use dhcproto::Encodable;
use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};

/// Tries before the client gives up (the caller reports and starts over).
pub const MAX_TRIES: u32 = 8;
/// The first retransmission timeout; it doubles up to [`MAX_TIMEOUT`].
pub const FIRST_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest retransmission timeout.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(16);

/// An address the server handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Our address.
    pub address: Ipv4Addr,
    /// The prefix length (from the subnet mask; 24 if none is given).
    pub prefix: u8,
    /// The server that gave it (its identifier).
    pub server: Ipv4Addr,
    /// The default gateway, if any.
    pub router: Option<Ipv4Addr>,
    /// DNS servers.
    pub dns: Vec<Ipv4Addr>,
    /// The DNS domain, if any.
    pub domain: Option<String>,
    /// The host name the server gave, if any.
    pub hostname: Option<String>,
    /// The lease time, if given.
    pub lease_time: Option<Duration>,
    /// The interface MTU, if given.
    pub mtu: Option<u16>,
}

/// A reply that concerns us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// DHCPOFFER.
    Offer(Lease),
    /// DHCPACK.
    Ack(Lease),
    /// DHCPNAK from this server.
    Nak(Ipv4Addr),
}

/// Parses `bytes` as a reply to transaction `xid` of `mac`; `None` for
/// anything else (not ours, malformed, no usable address).
pub fn parse_reply(bytes: &[u8], xid: u32, mac: [u8; 6]) -> Option<Reply> {
    // The fixed header first, on the raw bytes, as the job server's
    // prefilter does: BOOTREPLY (2), Ethernet (1), a 6-byte address, and
    // the whole header and magic cookie there.
    if !matches!(bytes, [2, 1, 6, ..]) || bytes.len() < 240 {
        return None;
    }
    let msg = mprov_dhcp_decode::decode(bytes).ok()?;
    if msg.opcode() != Opcode::BootReply || msg.xid() != xid || msg.chaddr().get(..6)? != mac {
        return None;
    }
    let opts = msg.opts();
    let kind = opts.msg_type()?;
    let server = match opts.get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(ip)) => *ip,
        _ => return None,
    };
    if kind == MessageType::Nak {
        return Some(Reply::Nak(server));
    }
    let address = msg.yiaddr();
    if address.is_unspecified()
        || address.is_broadcast()
        || address.is_multicast()
        || address.is_loopback()
    {
        return None;
    }
    let prefix = match opts.get(OptionCode::SubnetMask) {
        Some(DhcpOption::SubnetMask(mask)) => {
            let bits = u32::from(*mask);
            // A mask is ones then zeros; anything else is not a mask.
            if bits.leading_ones() + bits.trailing_zeros() != 32 || bits == 0 {
                return None;
            }
            u8::try_from(bits.leading_ones()).ok()?
        }
        _ => 24,
    };
    let text = |code| {
        match opts.get(code) {
            Some(DhcpOption::DomainName(s) | DhcpOption::Hostname(s)) => Some(s.clone()),
            _ => None,
        }
        .filter(|s: &String| {
            !s.is_empty()
                && s.len() <= 253
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        })
    };
    let lease = Lease {
        address,
        prefix,
        server,
        router: match opts.get(OptionCode::Router) {
            Some(DhcpOption::Router(list)) => list.first().copied().filter(|r| !r.is_unspecified()),
            _ => None,
        },
        dns: match opts.get(OptionCode::DomainNameServer) {
            Some(DhcpOption::DomainNameServer(list)) => list.iter().take(3).copied().collect(),
            _ => Vec::new(),
        },
        domain: text(OptionCode::DomainName),
        hostname: text(OptionCode::Hostname),
        lease_time: match opts.get(OptionCode::AddressLeaseTime) {
            Some(DhcpOption::AddressLeaseTime(secs)) => Some(Duration::from_secs(u64::from(*secs))),
            _ => None,
        },
        mtu: match opts.get(OptionCode::InterfaceMtu) {
            Some(DhcpOption::InterfaceMtu(mtu)) if *mtu >= 576 => Some(*mtu),
            _ => None,
        },
    };
    match kind {
        MessageType::Offer => Some(Reply::Offer(lease)),
        MessageType::Ack => Some(Reply::Ack(lease)),
        _ => None,
    }
}

/// Where the exchange is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Selecting,
    Requesting(Lease),
    Bound(Lease),
}

/// What the client does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Broadcast these bytes, then wait up to this long for a reply.
    Send(Vec<u8>, Duration),
    /// Keep waiting (the reply was not for us, or changed nothing).
    Wait,
    /// Bound: configure this lease.
    Bound(Lease),
    /// Out of tries.
    GiveUp,
}

/// The client's state machine: feed it replies and timeouts.
#[derive(Debug, Clone)]
pub struct Client {
    xid: u32,
    mac: [u8; 6],
    state: State,
    tries: u32,
}

impl Client {
    /// A client for `mac` with transaction id `xid`, and its first DISCOVER.
    pub fn new(mac: [u8; 6], xid: u32) -> (Client, Action) {
        let mut client = Client {
            xid,
            mac,
            state: State::Selecting,
            tries: 0,
        };
        let first = client.send();
        (client, first)
    }

    /// The transaction id.
    pub fn xid(&self) -> u32 {
        self.xid
    }

    fn timeout(&self) -> Duration {
        FIRST_TIMEOUT
            .saturating_mul(1 << self.tries.saturating_sub(1).min(4))
            .min(MAX_TIMEOUT)
    }

    fn send(&mut self) -> Action {
        self.tries += 1;
        if self.tries > MAX_TRIES {
            return Action::GiveUp;
        }
        let bytes = match &self.state {
            State::Selecting => self.message(MessageType::Discover, None),
            State::Requesting(offer) => self.message(MessageType::Request, Some(offer)),
            State::Bound(lease) => return Action::Bound(lease.clone()),
        };
        Action::Send(bytes, self.timeout())
    }

    /// The wait ran out with no reply for us.
    pub fn timed_out(&mut self) -> Action {
        self.send()
    }

    /// A datagram arrived.
    pub fn received(&mut self, bytes: &[u8]) -> Action {
        let Some(reply) = parse_reply(bytes, self.xid, self.mac) else {
            return Action::Wait;
        };
        match (&self.state, reply) {
            (State::Selecting, Reply::Offer(offer)) => {
                self.state = State::Requesting(offer);
                self.tries = 0;
                self.send()
            }
            (State::Requesting(offer), Reply::Ack(lease)) if lease.server == offer.server => {
                self.state = State::Bound(lease.clone());
                Action::Bound(lease)
            }
            (State::Requesting(offer), Reply::Nak(server)) if server == offer.server => {
                // Start over (RFC 2131 section 3.1, step 5).
                self.state = State::Selecting;
                self.xid = self.xid.wrapping_add(1);
                self.send()
            }
            _ => Action::Wait,
        }
    }

    /// A DISCOVER or REQUEST with the broadcast flag (we have no address
    /// yet to receive a unicast on).
    fn message(&self, kind: MessageType, offer: Option<&Lease>) -> Vec<u8> {
        let mut msg = Message::new_with_id(
            self.xid,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &self.mac,
        );
        msg.set_flags(Flags::default().set_broadcast());
        let opts = msg.opts_mut();
        opts.insert(DhcpOption::MessageType(kind));
        opts.insert(DhcpOption::ClassIdentifier(
            concat!("mprov-agent/", env!("CARGO_PKG_VERSION"))
                .as_bytes()
                .to_vec(),
        ));
        opts.insert(DhcpOption::MaxMessageSize(1500));
        opts.insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::SubnetMask,
            OptionCode::Router,
            OptionCode::DomainNameServer,
            OptionCode::DomainName,
            OptionCode::Hostname,
            OptionCode::InterfaceMtu,
        ]));
        if let Some(offer) = offer {
            opts.insert(DhcpOption::RequestedIpAddress(offer.address));
            opts.insert(DhcpOption::ServerIdentifier(offer.server));
        }
        // Encoding a message we built cannot fail; an empty datagram is
        // harmless if it ever did.
        msg.to_vec().unwrap_or_default()
    }
}

/// Runs the exchange on `interface` (up, no address yet) for `mac`: a UDP
/// socket on port 68 bound to the interface, broadcasts to port 67, the
/// [`Client`]'s retries and backoff. `None` if every try went unanswered.
pub fn obtain(interface: &str, mac: [u8; 6], xid: u32) -> std::io::Result<Option<Lease>> {
    use std::io::ErrorKind;
    use std::net::UdpSocket;
    use std::time::Instant;

    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 68))?;
    socket.set_broadcast(true)?;
    nix::sys::socket::setsockopt(
        &socket,
        nix::sys::socket::sockopt::BindToDevice,
        &std::ffi::OsString::from(interface),
    )?;
    let (mut client, mut action) = Client::new(mac, xid);
    let mut deadline = Instant::now();
    let mut buf = vec![0u8; 1500];
    loop {
        match action {
            Action::Send(bytes, wait) => {
                socket.send_to(&bytes, (Ipv4Addr::BROADCAST, 67))?;
                deadline = Instant::now() + wait;
            }
            Action::Bound(lease) => return Ok(Some(lease)),
            Action::GiveUp => return Ok(None),
            Action::Wait => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            action = client.timed_out();
            continue;
        }
        socket.set_read_timeout(Some(left))?;
        action = match socket.recv_from(&mut buf) {
            Ok((n, _)) => client.received(&buf[..n]),
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                client.timed_out()
            }
            Err(err) if err.kind() == ErrorKind::Interrupted => Action::Wait,
            Err(err) => return Err(err),
        };
    }
}

#[cfg(test)]
mod tests {
    use dhcproto::Decodable;

    use super::*;

    const MAC: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];

    fn reply(req: &[u8], kind: MessageType, yiaddr: Ipv4Addr) -> Vec<u8> {
        let req = Message::from_bytes(req).expect("our request decodes");
        let mut msg = Message::new_with_id(
            req.xid(),
            Ipv4Addr::UNSPECIFIED,
            yiaddr,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &req.chaddr()[..6],
        );
        msg.set_opcode(Opcode::BootReply);
        let opts = msg.opts_mut();
        opts.insert(DhcpOption::MessageType(kind));
        opts.insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 0, 0, 1)));
        opts.insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
        opts.insert(DhcpOption::Router(vec![Ipv4Addr::new(10, 0, 0, 254)]));
        opts.insert(DhcpOption::Hostname("n01".to_owned()));
        msg.to_vec().expect("encodes")
    }

    #[test]
    fn discover_offer_request_ack() {
        let (mut client, first) = Client::new(MAC, 42);
        let Action::Send(discover, wait) = first else {
            panic!("{first:?}")
        };
        assert_eq!(wait, FIRST_TIMEOUT);
        let msg = Message::from_bytes(&discover).expect("decodes");
        assert_eq!(msg.opts().msg_type(), Some(MessageType::Discover));
        assert!(msg.flags().broadcast());

        let addr = Ipv4Addr::new(10, 0, 0, 21);
        let Action::Send(request, _) = client.received(&reply(&discover, MessageType::Offer, addr))
        else {
            panic!("no request")
        };
        let msg = Message::from_bytes(&request).expect("decodes");
        assert_eq!(msg.opts().msg_type(), Some(MessageType::Request));
        assert_eq!(
            msg.opts().get(OptionCode::RequestedIpAddress),
            Some(&DhcpOption::RequestedIpAddress(addr))
        );
        // A late second offer changes nothing.
        assert_eq!(
            client.received(&reply(&discover, MessageType::Offer, addr)),
            Action::Wait
        );
        let Action::Bound(lease) = client.received(&reply(&request, MessageType::Ack, addr)) else {
            panic!("not bound")
        };
        assert_eq!(lease.address, addr);
        assert_eq!(lease.prefix, 24);
        assert_eq!(lease.router, Some(Ipv4Addr::new(10, 0, 0, 254)));
        assert_eq!(lease.hostname.as_deref(), Some("n01"));
    }

    #[test]
    fn replies_not_for_us_are_ignored_and_timeouts_back_off() {
        let (mut client, first) = Client::new(MAC, 7);
        let Action::Send(discover, _) = first else {
            panic!()
        };
        let addr = Ipv4Addr::new(10, 0, 0, 21);
        let mut other = reply(&discover, MessageType::Offer, addr);
        other[4] ^= 1; // another transaction
        assert_eq!(client.received(&other), Action::Wait);
        assert_eq!(
            client.received(&reply(&discover, MessageType::Offer, Ipv4Addr::BROADCAST)),
            Action::Wait
        );
        assert_eq!(client.received(b"garbage"), Action::Wait);
        let mut waits = vec![];
        loop {
            match client.timed_out() {
                Action::Send(_, wait) => waits.push(wait),
                Action::GiveUp => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(waits.len() as u32, MAX_TRIES - 1);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(waits.last(), Some(&MAX_TIMEOUT));
    }

    /// An offer for us (our transaction, our MAC, a usable address) with an
    /// option 81 (client FQDN) one byte long: dhcproto subtracts 3 from
    /// that length unchecked, so an unguarded decode panics a debug or
    /// fuzzing build. The client must ignore it, in every state.
    #[test]
    fn a_crafted_option_length_is_ignored_not_a_panic() {
        let (mut client, first) = Client::new(MAC, 9);
        let Action::Send(discover, _) = first else {
            panic!("{first:?}")
        };
        let addr = Ipv4Addr::new(10, 0, 0, 21);
        let crafted = |good: Vec<u8>| {
            let end = good.iter().rposition(|&b| b == 255).expect("end option");
            let mut bytes = good[..end].to_vec();
            bytes.extend_from_slice(&[81, 1, 0, 255]);
            bytes
        };
        let offer = reply(&discover, MessageType::Offer, addr);
        let bad_offer = crafted(offer.clone());
        #[cfg(debug_assertions)]
        assert!(
            std::panic::catch_unwind(|| Message::from_bytes(&bad_offer)).is_err(),
            "dhcproto no longer panics on it: this test shows nothing"
        );
        assert_eq!(parse_reply(&bad_offer, 9, MAC), None);
        assert_eq!(client.received(&bad_offer), Action::Wait);
        // The offer without it is taken; while requesting, a crafted ACK is
        // ignored and the real one binds.
        let Action::Send(request, _) = client.received(&offer) else {
            panic!("no request")
        };
        let ack = reply(&request, MessageType::Ack, addr);
        assert_eq!(client.received(&crafted(ack.clone())), Action::Wait);
        assert!(matches!(client.received(&ack), Action::Bound(_)));
    }

    /// Found by the `agent_dhcp` fuzzer (its corpus keeps it as
    /// `crash-hlen`): a reply for our transaction with `hlen` 86; dhcproto
    /// decodes it, and `chaddr()` then panics, in a release build too.
    #[test]
    fn a_hardware_length_beyond_chaddr_is_ignored_not_a_panic() {
        let (mut client, first) = Client::new(MAC, 9);
        let Action::Send(discover, _) = first else {
            panic!("{first:?}")
        };
        let mut offer = reply(&discover, MessageType::Offer, Ipv4Addr::new(10, 0, 0, 21));
        offer[2] = 86;
        let unguarded = Message::from_bytes(&offer).expect("dhcproto decodes it");
        assert!(std::panic::catch_unwind(|| unguarded.chaddr().len()).is_err());
        assert_eq!(parse_reply(&offer, 9, MAC), None);
        assert_eq!(client.received(&offer), Action::Wait);
    }
}
