//! The zones being served and their swap.
//!
//! [`ServedZones`] is one generation: built from a snapshot (off the runtime
//! threads), then immutable. [`LiveZones`] holds the current generation
//! behind a lock taken only to clone the `Arc`, plus a counter bumped after
//! each swap so that the UDP loop can keep its own `Arc` and check one atomic
//! per packet. [`watch_snapshots`] rebuilds and swaps on every new snapshot;
//! a failed rebuild keeps the old generation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use hickory_server::proto::rr::LowerName;
use hickory_server::zone_handler::{Catalog, ZoneHandler};
use mprov_api::boot::BootConfig;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Shared;
use super::forward::Upstream;
use crate::fast::FastAnswers;
use crate::{DnsConfig, ServeError, zones};

/// One generation of zones as served: the catalog, the fast-path answers
/// and whether it forwards. Built from the [`zones::ZoneRecords`] of one
/// snapshot.
pub(super) struct ServedZones {
    pub(super) catalog: Catalog,
    /// A, AAAA and PTR sets, precomputed in wire format. hickory's in-memory
    /// zone keeps records in a `BTreeMap` ordered label by label, and its
    /// message codec allocates per query; both showed as the largest
    /// user-space costs under dnsperf. Everything else (CNAME chasing,
    /// NXDOMAIN, NODATA, SOA, NS) still goes through the catalog.
    pub(super) fast: FastAnswers,
    origins: Vec<LowerName>,
    forwarding: bool,
}

impl ServedZones {
    /// Builds the zones for `snapshot`, reusing the forwarder (and its
    /// cache) when the upstream list did not change.
    pub(super) async fn build(
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
    pub(super) fn from_snapshot(
        snapshot: &BootConfig,
        ttl: u32,
        forwarder: Option<Arc<dyn ZoneHandler>>,
    ) -> Self {
        let records = zones::build(snapshot, ttl);
        let origins = records.origins().map(LowerName::new).collect();
        let exact = records.exact();
        let fast = FastAnswers::new(
            exact
                .iter()
                .map(|((name, rtype), records)| ((&**name, *rtype), records.as_slice())),
        );
        Self {
            forwarding: forwarder.is_some(),
            catalog: records.into_catalog(zones::serial(snapshot), forwarder),
            fast,
            origins,
        }
    }

    /// Whether a query for `name` goes to the upstream resolvers: we forward
    /// and it is in none of our zones.
    pub(super) fn is_forwarded(&self, name: &LowerName) -> bool {
        self.forwarding && !self.origins.iter().any(|o| o.zone_of(name))
    }
}

/// The current [`ServedZones`] and a counter of swaps.
pub(super) struct LiveZones {
    zones: RwLock<Arc<ServedZones>>,
    /// Bumped after every swap of `zones`.
    generation: AtomicU64,
}

impl LiveZones {
    /// Serving `zones` as generation 0.
    pub(super) fn new(zones: ServedZones) -> Self {
        Self {
            zones: RwLock::new(Arc::new(zones)),
            generation: AtomicU64::new(0),
        }
    }

    /// The zones being served now.
    pub(super) fn get(&self) -> Arc<ServedZones> {
        // A poisoned lock only means a writer panicked between two
        // statements that cannot leave the Arc half-written.
        self.zones.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The number of swaps so far: one atomic load, for the UDP loop's
    /// per-packet check.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current zones and their generation. The generation is read
    /// first, so a swap in between only causes one more refresh.
    pub(super) fn current(&self) -> (u64, Arc<ServedZones>) {
        let generation = self.generation();
        (generation, self.get())
    }

    /// Serves `zones` from now on; requests running keep their old `Arc`.
    fn swap(&self, zones: ServedZones) {
        *self.zones.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(zones);
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// Rebuilds and swaps the zones on every new snapshot.
pub(super) async fn watch_snapshots(
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
        match ServedZones::build(snapshot, &shared.config, &mut upstream).await {
            Ok(zones) => {
                shared.live.swap(zones);
                shared.metrics.reloads.inc();
                info!(revision, "DNS zones reloaded");
            }
            Err(error) => {
                warn!(revision, error = %error, "DNS zone rebuild failed; keeping the old zones")
            }
        }
    }
}
