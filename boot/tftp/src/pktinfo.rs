//! The local address a request was sent to, on a wildcard listener.
//!
//! A TFTP transfer replies from a new socket (RFC 1350: the server's transfer
//! ID). If the listener is bound to `0.0.0.0` and that socket is too, the
//! kernel picks the reply's source address by route, which on a multi-homed
//! job server (one address per provisioning network, or a secondary address)
//! can differ from the address the node asked; the node's firmware then drops
//! every DATA packet as coming from a stranger. So a wildcard listener asks
//! the kernel for each datagram's destination (`IP_PKTINFO`,
//! `IPV6_RECVPKTINFO`) and the transfer binds to it.
//!
//! tokio has no `recvmsg` with control messages, and socket2 only exposes it
//! with raw buffers; nix's safe `recvmsg` decodes the control messages, so
//! this is a thin, safe wrapper over it driven by tokio's readiness.

use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg, setsockopt, sockopt,
};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Asks the kernel to report each datagram's destination address on `socket`.
pub(crate) fn enable(socket: &UdpSocket) -> io::Result<()> {
    match socket.local_addr()? {
        SocketAddr::V4(_) => setsockopt(socket, sockopt::Ipv4PacketInfo, &true)?,
        SocketAddr::V6(_) => setsockopt(socket, sockopt::Ipv6RecvPacketInfo, &true)?,
    }
    Ok(())
}

/// One received datagram: its length, its sender, and the local address it
/// was sent to when the kernel reported one.
pub(crate) async fn recv(
    socket: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, Option<IpAddr>)> {
    socket
        .async_io(Interest::READABLE, || recv_now(socket, buf))
        .await
}

fn recv_now(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Option<IpAddr>)> {
    let mut control = nix::cmsg_space!(nix::libc::in6_pktinfo);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<SockaddrStorage>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut control),
        MsgFlags::MSG_DONTWAIT,
    )?;
    let peer = msg
        .address
        .as_ref()
        .and_then(to_socket_addr)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "datagram without a sender"))?;
    let mut local = None;
    for cmsg in msg.cmsgs()? {
        match cmsg {
            ControlMessageOwned::Ipv4PacketInfo(info) => {
                // `ipi_spec_dst` is the local address the kernel would reply
                // from; for a unicast request it is the address asked.
                local = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    info.ipi_spec_dst.s_addr,
                ))));
            }
            ControlMessageOwned::Ipv6PacketInfo(info) => {
                local = Some(IpAddr::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr)));
            }
            _ => {}
        }
    }
    Ok((msg.bytes, peer, local))
}

fn to_socket_addr(addr: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::V4((*v4).into()));
    }
    let v6 = addr.as_sockaddr_in6()?;
    // Keep the scope: a link-local peer is only reachable on its interface.
    Some(SocketAddr::V6((*v6).into()))
}

/// The address a transfer answering a request sent to `asked` binds to:
/// the address asked, unless it is one no reply can come from.
pub(crate) fn reply_from(listener: IpAddr, asked: Option<IpAddr>) -> IpAddr {
    match asked {
        Some(ip) if !ip.is_unspecified() && !ip.is_multicast() && ip != Ipv4Addr::BROADCAST => ip,
        _ => listener,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_come_from_the_address_asked() {
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let asked = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(reply_from(any, Some(asked)), asked);
        assert_eq!(reply_from(any, None), any);
        assert_eq!(reply_from(any, Some(IpAddr::V4(Ipv4Addr::BROADCAST))), any);
        assert_eq!(reply_from(any, Some(any)), any);
    }
}
