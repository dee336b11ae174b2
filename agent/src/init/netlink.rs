//! Step 1's configuration: the booted interface up, its DHCP address and
//! the default route, over rtnetlink (`NETLINK_ROUTE`). The few messages
//! the agent needs are packed here (the layouts of `linux/netlink.h`,
//! `linux/rtnetlink.h`, `linux/if_addr.h`); the socket is nix's. The
//! packing is pure ([`link_up`], [`add_address`], [`add_default_route`])
//! and tested byte for byte; [`Netlink::request`] sends one and reads the
//! kernel's acknowledgement.

use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, sendto,
    socket,
};

const NLM_F_REQUEST: u16 = 0x01;
const NLM_F_ACK: u16 = 0x04;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_REPLACE: u16 = 0x100;
const NLMSG_ERROR: u16 = 2;
const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const IFF_UP: u32 = 0x1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_BROADCAST: u16 = 4;
const IFLA_MTU: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_OIF: u16 = 4;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_DHCP: u8 = 16;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RTN_UNICAST: u8 = 1;

/// A netlink message: header, then `body`, then attributes.
fn message(kind: u16, flags: u16, seq: u32, body: &[u8], attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut out = vec![0u8; 16];
    out.extend_from_slice(body);
    for (kind, data) in attrs {
        let len = 4 + data.len();
        out.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(data);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
    }
    let len = u32::try_from(out.len()).unwrap_or(u32::MAX);
    out[0..4].copy_from_slice(&len.to_ne_bytes());
    out[4..6].copy_from_slice(&kind.to_ne_bytes());
    out[6..8].copy_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    out[8..12].copy_from_slice(&seq.to_ne_bytes());
    out
}

/// `RTM_NEWLINK`: interface `index` up, with `mtu` if given.
pub fn link_up(index: u32, mtu: Option<u16>, seq: u32) -> Vec<u8> {
    // struct ifinfomsg: family, pad, type, index, flags, change.
    let mut body = vec![AF_UNSPEC, 0, 0, 0];
    body.extend_from_slice(&i32::try_from(index).unwrap_or(0).to_ne_bytes());
    body.extend_from_slice(&IFF_UP.to_ne_bytes());
    body.extend_from_slice(&IFF_UP.to_ne_bytes());
    let mtu = mtu.map(|m| u32::from(m).to_ne_bytes());
    let attrs: Vec<(u16, &[u8])> = mtu.iter().map(|m| (IFLA_MTU, &m[..])).collect();
    message(RTM_NEWLINK, 0, seq, &body, &attrs)
}

/// `RTM_NEWADDR`: `address/prefix` on interface `index`, with its
/// broadcast address.
pub fn add_address(index: u32, address: Ipv4Addr, prefix: u8, seq: u32) -> Vec<u8> {
    // struct ifaddrmsg: family, prefixlen, flags, scope, index.
    let mut body = vec![AF_INET, prefix.min(32), 0, RT_SCOPE_UNIVERSE];
    body.extend_from_slice(&index.to_ne_bytes());
    let host_bits = if prefix >= 32 { 0 } else { u32::MAX >> prefix };
    let broadcast = Ipv4Addr::from(u32::from(address) | host_bits).octets();
    let octets = address.octets();
    message(
        RTM_NEWADDR,
        NLM_F_CREATE | NLM_F_REPLACE,
        seq,
        &body,
        &[
            (IFA_LOCAL, &octets),
            (IFA_ADDRESS, &octets),
            (IFA_BROADCAST, &broadcast),
        ],
    )
}

/// `RTM_NEWROUTE`: the default route via `gateway` on interface `index`.
pub fn add_default_route(index: u32, gateway: Ipv4Addr, seq: u32) -> Vec<u8> {
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope,
    // type, flags.
    let mut body = vec![
        AF_INET,
        0,
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_DHCP,
        RT_SCOPE_UNIVERSE,
        RTN_UNICAST,
    ];
    body.extend_from_slice(&0u32.to_ne_bytes());
    let gateway = gateway.octets();
    let oif = index.to_ne_bytes();
    message(
        RTM_NEWROUTE,
        NLM_F_CREATE | NLM_F_EXCL,
        seq,
        &body,
        &[(RTA_GATEWAY, &gateway), (RTA_OIF, &oif)],
    )
}

/// The kernel's answer to one request: `Ok` for an ACK (error 0), the
/// errno otherwise; `None` if `reply` is not an `NLMSG_ERROR` for `seq`.
pub fn ack(reply: &[u8], seq: u32) -> Option<Result<(), i32>> {
    let mut at = 0;
    while reply.len() >= at + 20 {
        let len = u32::from_ne_bytes(reply[at..at + 4].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(reply[at + 4..at + 6].try_into().ok()?);
        let got_seq = u32::from_ne_bytes(reply[at + 8..at + 12].try_into().ok()?);
        if len < 16 || at + len > reply.len() {
            return None;
        }
        if kind == NLMSG_ERROR && got_seq == seq && len >= 20 {
            let errno = i32::from_ne_bytes(reply[at + 16..at + 20].try_into().ok()?);
            return Some(if errno == 0 { Ok(()) } else { Err(-errno) });
        }
        at += (len + 3) & !3;
    }
    None
}

/// An rtnetlink socket.
#[derive(Debug)]
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

impl Netlink {
    /// Opens and binds the socket.
    pub fn open() -> nix::Result<Netlink> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &NetlinkAddr::new(0, 0),
        )?;
        Ok(Netlink { fd, seq: 0 })
    }

    /// The next sequence number.
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends `msg` (made with sequence number `seq`) and waits for its
    /// acknowledgement. `EEXIST` counts as done (an address or route that is
    /// already there).
    pub fn request(&mut self, msg: &[u8], seq: u32) -> std::io::Result<()> {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.fd);
        sendto(fd, msg, &NetlinkAddr::new(0, 0), MsgFlags::empty())?;
        let mut buf = vec![0u8; 8192];
        for _ in 0..16 {
            let n = recv(fd, &mut buf, MsgFlags::empty())?;
            match ack(&buf[..n], seq) {
                Some(Ok(())) => return Ok(()),
                Some(Err(errno)) if errno == nix::errno::Errno::EEXIST as i32 => return Ok(()),
                Some(Err(errno)) => return Err(std::io::Error::from_raw_os_error(errno)),
                None => continue,
            }
        }
        Err(std::io::Error::other("no acknowledgement from the kernel"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_packed_as_the_kernel_reads_them() {
        let msg = link_up(3, Some(9000), 7);
        assert_eq!(msg.len(), 16 + 16 + 8);
        assert_eq!(u32::from_ne_bytes(msg[0..4].try_into().unwrap()), 40);
        assert_eq!(
            u16::from_ne_bytes(msg[4..6].try_into().unwrap()),
            RTM_NEWLINK
        );
        assert_eq!(u32::from_ne_bytes(msg[8..12].try_into().unwrap()), 7);
        assert_eq!(i32::from_ne_bytes(msg[20..24].try_into().unwrap()), 3);

        let msg = add_address(3, Ipv4Addr::new(10, 0, 0, 21), 24, 8);
        assert_eq!(msg.len(), 16 + 8 + 3 * 8);
        assert_eq!(msg[17], 24);
        // The broadcast address is the last attribute.
        assert_eq!(&msg[msg.len() - 4..], &[10, 0, 0, 255]);

        let msg = add_default_route(3, Ipv4Addr::new(10, 0, 0, 254), 9);
        assert_eq!(msg.len(), 16 + 12 + 8 + 8);
        assert_eq!(&msg[32..36], &[10, 0, 0, 254]);
    }

    #[test]
    fn acks_are_read_from_error_messages() {
        let mut reply = vec![0u8; 36];
        reply[0..4].copy_from_slice(&36u32.to_ne_bytes());
        reply[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        reply[8..12].copy_from_slice(&5u32.to_ne_bytes());
        assert_eq!(ack(&reply, 5), Some(Ok(())));
        assert_eq!(ack(&reply, 6), None);
        reply[16..20].copy_from_slice(&(-17i32).to_ne_bytes());
        assert_eq!(ack(&reply, 5), Some(Err(17)));
        assert_eq!(ack(&reply[..10], 5), None);
    }

    /// The real kernel takes the messages: in a network namespace of its
    /// own (root, as every test here), a veth end goes up with an
    /// address and a default route, and `ip` sees them.
    #[test]
    fn the_kernel_takes_them_in_a_namespace() {
        let name = format!("mpagent{}", std::process::id() % 100000);
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .expect("ip (iproute2) runs");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        ip(&["netns", "add", &name]);
        let result = std::panic::catch_unwind(|| {
            ip(&[
                "-n", &name, "link", "add", "d0", "type", "veth", "peer", "name", "d1",
            ]);
            let index: u32 = ip(&["-n", &name, "-o", "link", "show", "d0"])
                .split(':')
                .next()
                .and_then(|i| i.trim().parse().ok())
                .expect("an index");
            // This thread joins the namespace; it ends with the scope.
            let handle = std::thread::spawn(move || {
                let ns = std::fs::File::open(format!("/run/netns/{name}")).expect("the namespace");
                nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                let mut nl = Netlink::open().expect("netlink");
                let seq = nl.next_seq();
                nl.request(&link_up(index, Some(1400), seq), seq)
                    .expect("link up");
                let seq = nl.next_seq();
                nl.request(
                    &add_address(index, Ipv4Addr::new(10, 9, 8, 7), 24, seq),
                    seq,
                )
                .expect("address");
                let seq = nl.next_seq();
                nl.request(
                    &add_address(index, Ipv4Addr::new(10, 9, 8, 7), 24, seq),
                    seq,
                )
                .expect("the same address again");
                let seq = nl.next_seq();
                nl.request(
                    &add_default_route(index, Ipv4Addr::new(10, 9, 8, 1), seq),
                    seq,
                )
                .expect("route");
                let seq = nl.next_seq();
                let err = nl
                    .request(&add_address(999, Ipv4Addr::new(10, 9, 9, 9), 24, seq), seq)
                    .expect_err("no such link");
                assert_eq!(err.raw_os_error(), Some(nix::errno::Errno::ENODEV as i32));
            });
            handle.join().expect("the namespace thread");
        });
        let name = format!("mpagent{}", std::process::id() % 100000);
        let link = ip(&["-n", &name, "-o", "link", "show", "d0"]);
        let addr = ip(&["-n", &name, "-o", "-4", "addr", "show", "d0"]);
        let route = ip(&["-n", &name, "route", "show", "default"]);
        ip(&["netns", "del", &name]);
        result.expect("netlink in the namespace");
        assert!(link.contains("UP") && link.contains("mtu 1400"), "{link}");
        assert!(addr.contains("10.9.8.7/24 brd 10.9.8.255"), "{addr}");
        assert!(
            route.contains("default via 10.9.8.1 dev d0 proto dhcp"),
            "{route}"
        );
    }
}
