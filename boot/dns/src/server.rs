//! The DNS server: its listeners, the per-request handler and the live zone
//! swap, one submodule each.
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
//! and swapped in under a `std::sync::RwLock<Arc<ServedZones>>` held only to
//! clone the `Arc`: requests already running finish on the zones they
//! started with. A generation counter, bumped after each swap, lets the UDP
//! loop keep its own `Arc` and check one atomic per packet instead of taking
//! the lock; a new snapshot is therefore served from the next packet on.
//!
//! Where each job lives:
//!
//! * `server/udp.rs`: the UDP receive loop, its batched sends and its
//!   responder;
//! * `server/tcp.rs`: the TCP accept loop, one task per connection, its
//!   responder;
//! * `server/handler.rs`: what both loops share ([`Shared`]): the cheap
//!   prechecks, parsing, answering through the catalog, encoding;
//! * `server/live.rs`: [`ServedZones`] (one generation of zones as served:
//!   catalog, fast answers, origins) and [`LiveZones`], the swap;
//! * `server/forward.rs`: the forwarder to the upstream resolvers, kept
//!   across snapshots while the upstream list does not change;
//! * `server/fixture.rs`: the server state without sockets that the fuzz
//!   target and the tests drive.
//!
//! The records of the zones themselves are computed from the snapshot in
//! `src/zones.rs` ([`ZoneRecords`]), as plain data.
//!
//! [`Catalog`]: hickory_server::zone_handler::Catalog
//! [`ZoneRecords`]: crate::zones::ZoneRecords

use std::sync::Arc;

use mprov_api::boot::BootConfig;
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::metrics::Metrics;
use crate::{DnsConfig, ServeError};

#[cfg(any(test, feature = "fuzz"))]
mod fixture;
mod forward;
mod handler;
mod live;
mod tcp;
mod udp;

#[cfg(test)]
pub(crate) use fixture::Responses;
pub(crate) use handler::Shared;
use live::{LiveZones, ServedZones};

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
        let mut upstream = forward::Upstream::default();
        let first = snapshots.borrow_and_update().clone();
        let zones = ServedZones::build(first, &config, &mut upstream).await?;
        let shared = Arc::new(Shared {
            live: LiveZones::new(zones),
            metrics,
            permits: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
            config,
        });

        let tracker = TaskTracker::new();
        tracker.spawn(live::watch_snapshots(
            shared.clone(),
            snapshots,
            upstream,
            shutdown.clone(),
        ));
        if let Some(tcp) = tcp {
            tracker.spawn(tcp::listen(
                shared.clone(),
                tcp,
                tracker.clone(),
                shutdown.clone(),
            ));
        }
        let result = udp::listen(&shared, Arc::new(udp), &tracker, &shutdown).await;
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
