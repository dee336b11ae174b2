//! The job server's DNS: authoritative for the cluster's names from
//! inventory, forwarding everything else.
//!
//! # Design
//!
//! The zones come from a [`BootConfig`] snapshot received through a
//! `tokio::sync::watch` channel. Each network with `dns: true` and a domain
//! becomes an authoritative zone (RFC 1034 §4.3.2 lookup semantics, RFC 1035
//! wire format) with A (RFC 1035 §3.4.1), AAAA (RFC 3596) and CNAME records
//! for host aliases, and reverse zones with PTR records in `in-addr.arpa`
//! (RFC 1035 §3.5) and `ip6.arpa` (RFC 3596 §2.5). `src/zones.rs` documents
//! the exact rules. A new snapshot rebuilds every zone off
//! the runtime threads and swaps them in atomically; requests in flight
//! finish on the generation they started with.
//!
//! Names outside our zones go to the snapshot's `upstream_resolvers` through
//! hickory's `ForwardZoneHandler` (a caching resolver), on
//! [`DnsConfig::upstream_port`]. With no upstream resolvers they are answered
//! REFUSED (RFC 1035 §4.1.1), which is what a non-recursive server should do.
//!
//! The lookup logic (NXDOMAIN vs NODATA, SOA in the authority section, CNAME
//! chasing, EDNS, truncation) is hickory-server's `Catalog`, except that
//! plain A, AAAA and PTR queries for names we hold are answered by
//! `src/fast.rs` from wire-format answers precomputed with the zones, with
//! no parsing into hickory types and no allocation (hickory's in-memory
//! zone lookup and message codec dominated the profile; see
//! `tests/bench/dns.sh`). The receive loops are ours, so that unanswerable
//! packets are dropped before any work and the work in flight is bounded;
//! see `src/server.rs` and its submodules (one per job: UDP, TCP, request
//! handling, the zone swap, the forwarder). `fuzz_query` is the fuzzing
//! entry point: request bytes through both paths, checking that they agree.
//!
//! # Metrics
//!
//! Registered under `dns_` (`mprov_dns_` in the job server's registry, prefixed `mprov`): `queries_total`, `responses_total{rcode}`,
//! `forwarded_total`, `refused_total`, `dropped_total{reason}` (reasons:
//! `source`, `short`, `response`, `malformed`, `overload`, `timeout`,
//! `send`) and
//! `zone_reloads_total`.
//!
//! [`BootConfig`]: mprov_api::boot::BootConfig

#![warn(missing_docs)]

use std::time::Duration;

mod fast;
#[cfg(any(test, feature = "fuzz"))]
mod fuzz;
mod metrics;
mod mmsg;
pub mod sample;
mod server;
mod zones;

#[cfg(any(test, feature = "fuzz"))]
pub use fuzz::fuzz_query;
pub use server::Server;

/// Tries at most this many UDP ports when port 0 was asked for and the
/// kernel's pick is taken for TCP.
const BIND_TRIES: u32 = 16;

/// Binds UDP and TCP on the same port of `addr`, as DNS clients expect.
///
/// With port 0 the kernel picks the UDP port, and that number may already
/// be in use for TCP by another process: then another UDP port is tried, a
/// bounded number of times. A fixed port that is taken is an error at once.
pub async fn bind(
    addr: std::net::SocketAddr,
) -> std::io::Result<(tokio::net::UdpSocket, tokio::net::TcpListener)> {
    let mut tries = 0;
    loop {
        let udp = tokio::net::UdpSocket::bind(addr).await?;
        let bound = udp.local_addr()?;
        match tokio::net::TcpListener::bind(bound).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if addr.port() == 0 && e.kind() == std::io::ErrorKind::AddrInUse => {
                tries += 1;
                if tries >= BIND_TRIES {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Default for [`DnsConfig::upstream_port`].
pub const DEFAULT_UPSTREAM_PORT: u16 = 53;
/// Default for [`DnsConfig::max_in_flight`]: enough to keep a forwarder with
/// slow upstreams busy, small enough that a flood cannot exhaust memory.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;
/// Default for [`DnsConfig::max_tcp_connections`].
pub const DEFAULT_MAX_TCP_CONNECTIONS: usize = 128;
/// Default for [`DnsConfig::request_timeout`]: longer than the forwarder's
/// own upstream timeout (5 s, two attempts) would be pointless for clients,
/// which give up after about 5 s themselves.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(6);
/// Default for [`DnsConfig::tcp_idle_timeout`].
pub const DEFAULT_TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default for [`DnsConfig::drain_timeout`].
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// Default for [`DnsConfig::ttl`]: short, because inventory changes are
/// served within a second and caches should follow soon after.
pub const DEFAULT_TTL: u32 = 60;

/// Process knobs of the DNS server (the data comes from the snapshot).
#[derive(Debug, Clone)]
pub struct DnsConfig {
    /// The port of the upstream resolvers; the snapshot lists only their
    /// addresses.
    pub upstream_port: u16,
    /// Requests handled at once; further UDP queries are dropped (the client
    /// retries) and TCP queries wait.
    pub max_in_flight: usize,
    /// TCP connections open at once; further ones are closed at accept.
    pub max_tcp_connections: usize,
    /// Upper bound on handling one request, forwarding included.
    pub request_timeout: Duration,
    /// A TCP connection with no complete query for this long is closed.
    pub tcp_idle_timeout: Duration,
    /// How long shutdown waits for requests in flight.
    pub drain_timeout: Duration,
    /// TTL of every record, and the negative-caching TTL in the SOA.
    pub ttl: u32,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            upstream_port: DEFAULT_UPSTREAM_PORT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_tcp_connections: DEFAULT_MAX_TCP_CONNECTIONS,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            tcp_idle_timeout: DEFAULT_TCP_IDLE_TIMEOUT,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            ttl: DEFAULT_TTL,
        }
    }
}

/// Why [`Server::run`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Building the zones from a snapshot failed (a panic in the builder).
    #[error("building the DNS zones failed")]
    Build(#[source] tokio::task::JoinError),
    /// The UDP socket failed in a way that does not recover.
    #[error("the DNS UDP socket failed")]
    Udp(#[source] std::io::Error),
}
