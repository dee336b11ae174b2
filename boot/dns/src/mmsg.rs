//! Batched UDP receive and send: `recvmmsg(2)` and `sendmmsg(2)` through
//! nix, on the tokio socket.
//!
//! Under dnsperf the UDP loop found a full batch queued most of the time, and
//! after the fast path (`src/fast.rs`) the two syscalls per query were most of
//! our CPU per query (`tests/bench/dns.sh`). One receive and one send per
//! batch of up to [`BATCH`] datagrams removes most of that fixed cost; the
//! per-datagram work in the kernel stays.
//!
//! Both calls go through `UdpSocket::try_io`, so tokio's readiness is cleared
//! when the kernel says `EAGAIN` and `readable().await` keeps working. nix's
//! `MultiHeaders` holds raw pointers and is not `Send`, so it is built per
//! call and never held across an `.await`: a few allocations per batch, none
//! per datagram.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrLike, SockaddrStorage, recvmmsg, sendmmsg};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Datagrams per receive and per send.
pub(crate) const BATCH: usize = 64;

/// Receives up to `bufs.len()` datagrams without blocking, appending each
/// one's length and source to `received` (cleared first). `WouldBlock` when
/// none is queued.
pub(crate) fn recv(
    socket: &UdpSocket,
    bufs: &mut [Vec<u8>],
    received: &mut Vec<(usize, SocketAddr)>,
) -> io::Result<()> {
    received.clear();
    socket.try_io(Interest::READABLE, || {
        let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(bufs.len(), None);
        let mut slices: Vec<[IoSliceMut<'_>; 1]> = bufs
            .iter_mut()
            .map(|b| [IoSliceMut::new(b.as_mut_slice())])
            .collect();
        let messages = recvmmsg(
            socket.as_raw_fd(),
            &mut headers,
            slices.iter_mut(),
            MsgFlags::MSG_DONTWAIT,
            None,
        )
        .map_err(io::Error::from)?;
        for message in messages {
            // A datagram without a usable source cannot be answered; keep
            // its slot so that indices match the buffers, with a source the
            // listener drops.
            let src = message
                .address
                .as_ref()
                .and_then(std_addr)
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
            received.push((message.bytes, src));
        }
        Ok(())
    })
}

/// Sends `replies` (index into `bufs`, destination) with one `sendmmsg`
/// without blocking. Returns how many were sent, in order from the first (at
/// least one); an error is the first datagram's.
pub(crate) fn send(
    socket: &UdpSocket,
    bufs: &[Vec<u8>],
    replies: &[(usize, SocketAddr)],
) -> io::Result<usize> {
    socket.try_io(Interest::WRITABLE, || {
        let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(replies.len(), None);
        let slices: Vec<[IoSlice<'_>; 1]> = replies
            .iter()
            .map(|&(i, _)| [IoSlice::new(&bufs[i])])
            .collect();
        let addrs: Vec<Option<SockaddrStorage>> = replies
            .iter()
            .map(|&(_, dst)| Some(SockaddrStorage::from(dst)))
            .collect();
        let results = sendmmsg(
            socket.as_raw_fd(),
            &mut headers,
            slices.iter(),
            addrs,
            [],
            MsgFlags::MSG_DONTWAIT,
        )
        .map_err(io::Error::from)?;
        Ok(results.count())
    })
}

fn std_addr(addr: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::V4((*v4).into()));
    }
    addr.as_sockaddr_in6()
        .map(|v6| SocketAddr::V6((*v6).into()))
        .filter(|_| addr.len() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten datagrams from two clients come out of one `recv` with their
    /// lengths and sources, and one `send` answers them all.
    #[tokio::test]
    async fn batch_round_trip() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        let clients = [
            UdpSocket::bind("127.0.0.1:0").await.unwrap(),
            UdpSocket::bind("127.0.0.1:0").await.unwrap(),
        ];
        for i in 0..10u8 {
            let client = &clients[usize::from(i % 2)];
            client
                .send_to(&vec![i; usize::from(i) + 1], addr)
                .await
                .unwrap();
        }
        let mut bufs = vec![vec![0u8; 512]; BATCH];
        let mut received = Vec::new();
        // Bounded: the datagrams are on loopback, queued before this.
        for _ in 0..100 {
            server.readable().await.unwrap();
            let mut more = Vec::new();
            match recv(&server, &mut bufs[received.len()..], &mut more) {
                Ok(()) => received.extend(more),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => panic!("{err}"),
            }
            if received.len() == 10 {
                break;
            }
        }
        assert_eq!(received.len(), 10);
        for (i, &(len, src)) in received.iter().enumerate() {
            let want = clients[i % 2].local_addr().unwrap();
            assert_eq!((len, src), (i + 1, want), "datagram {i}");
            assert!(bufs[i][..len].iter().all(|&b| usize::from(b) == i));
        }
        let replies: Vec<(usize, SocketAddr)> = received
            .iter()
            .enumerate()
            .map(|(i, &(_, src))| (i, src))
            .collect();
        let mut sent = 0;
        for _ in 0..100 {
            if sent == replies.len() {
                break;
            }
            server.writable().await.unwrap();
            match send(&server, &bufs, &replies[sent..]) {
                Ok(n) => sent += n,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => panic!("{err}"),
            }
        }
        assert_eq!(sent, 10);
        let mut buf = [0u8; 4096];
        for i in 0..10 {
            let (len, from) = clients[i % 2].recv_from(&mut buf).await.unwrap();
            assert_eq!((len, from), (bufs[i].len(), addr), "reply {i}");
        }
    }
}
