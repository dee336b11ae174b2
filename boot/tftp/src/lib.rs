//! mProv's TFTP server: a small tokio-native read-only server for the iPXE
//! binaries (`undionly.kpxe`, `snponly.efi`, `ipxe.efi`) that firmware fetches
//! before chainloading everything else over HTTP.
//!
//! Protocol coverage:
//! - RFC 1350: RRQ in octet and netascii modes; WRQ is refused with an ERROR
//!   packet; block numbers roll over from 65535 to 0.
//! - RFC 2347: option negotiation with OACK.
//! - RFC 2348 blksize (8..=65464, capped by [`TftpConfig::max_blksize`]).
//! - RFC 2349 timeout and tsize (the reply carries the file size).
//! - RFC 7440 windowsize (capped by [`TftpConfig::max_windowsize`], 64 by
//!   default).
//!
//! # Why not a crate
//!
//! `async-tftp` 0.4 runs its own single-threaded executor (smol) beside
//! tokio, keeps its packet codec private (so it cannot be fuzzed or reused in
//! tests) and sends replies from sockets bound to `0.0.0.0`, so on a
//! multi-homed job server the reply can leave from the wrong address.
//! `tftpd` (rs-tftpd) is thread-per-client on std sockets. Neither takes a
//! bound socket and a cancellation token, nor exposes metrics. The server is
//! a few hundred lines, so we own it.
//!
//! # Architecture
//!
//! - [`codec`]: pure packet parsing and encoding; never panics.
//! - [`options`]: pure option negotiation.
//! - `root`: maps a requested name onto the root; nothing outside the
//!   root can be read (`..` refused, absolute names resolved under the root,
//!   symlinks canonicalized and checked).
//! - [`server`]: the listener loop, bounded by a semaphore, with graceful
//!   shutdown.
//! - `pktinfo`: on a wildcard listener, the address each request was sent
//!   to (`IP_PKTINFO` / `IPV6_RECVPKTINFO`), so replies leave from it.
//! - `transfer`: one task and one socket per transfer (the RFC 1350 TID),
//!   bound to the address the request was sent to, with windowed sending,
//!   retransmission and a deadline.

#![warn(missing_docs)]

pub mod codec;
pub mod options;
mod pktinfo;
mod root;
pub mod server;
mod transfer;

pub use server::{RunError, Sent, Server, TftpConfig};

/// Fuzz entry point: parses `data` and checks that whatever parses also
/// encodes and parses back to the same packet, and that negotiating a parsed
/// request's options never panics.
///
/// # Panics
///
/// Only when that round-trip property is broken: that is the bug the fuzzer
/// looks for.
pub fn fuzz_packet(data: &[u8]) {
    let Ok(packet) = codec::parse(data) else {
        return;
    };
    let wire = match packet.to_vec() {
        Ok(wire) => wire,
        Err(err) => panic!("a parsed packet does not encode: {err}"),
    };
    assert_eq!(
        codec::parse(&wire).as_ref(),
        Ok(&packet),
        "round trip changed the packet"
    );
    if let codec::Packet::Rrq(req) = &packet {
        let limits = options::Limits {
            max_blksize: 65464,
            max_windowsize: 64,
        };
        let negotiated = options::negotiate(&req.options, limits, u64::MAX);
        assert!((8..=65464).contains(&negotiated.blksize) || negotiated.blksize == 512);
        assert!((1..=64).contains(&negotiated.windowsize));
    }
}
