//! Prometheus metrics of the DHCP server.
//!
//! The caller owns the `Registry` (the job server serves it on its own
//! metrics listener); [`Metrics::register`] adds ours
//! under the `dhcp_` prefix. An unregistered [`Metrics::default`] counts into
//! the void, which is what unit tests want.

use mprov_process::metrics::Prefixed;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::handler::{PoolEvent, Reason, ReplyKind};

/// The label of a drop.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DropLabels {
    /// Why.
    pub reason: &'static str,
}

/// The label of a pool's metrics.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PoolLabels {
    /// The network's slug.
    pub network: String,
}

/// The server's counters and gauges. Clones share the values.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// DHCPOFFERs sent.
    pub offers: Counter,
    /// DHCPACKs sent.
    pub acks: Counter,
    /// DHCPNAKs sent.
    pub naks: Counter,
    /// proxyDHCP: ACKs to PXE boot server requests on port 4011 (the
    /// second exchange, which names the boot file).
    pub pxe_acks: Counter,
    /// Packets not answered, by reason.
    pub drops: Family<DropLabels, Counter>,
    /// Packets that did not decode.
    pub malformed: Counter,
    /// Bound, unexpired leases.
    pub leases: Gauge,
    /// 1 while a network's pool has no free address, else 0.
    pub pool_exhausted: Family<PoolLabels, Gauge>,
    /// Episodes of a pool without a free address.
    pub pool_exhaustions: Family<PoolLabels, Counter>,
    /// Unconfirmed OFFERs whose address went to another client because the
    /// pool was full.
    pub offers_reclaimed: Family<PoolLabels, Counter>,
}

impl Metrics {
    /// New metrics, registered into `registry` with the `dhcp` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let mut r = Prefixed::new(registry, "dhcp");
        Metrics {
            offers: r.metric("offers", "DHCPOFFERs sent"),
            acks: r.metric("acks", "DHCPACKs sent"),
            naks: r.metric("naks", "DHCPNAKs sent"),
            pxe_acks: r.metric(
                "pxe_acks",
                "proxyDHCP ACKs to PXE boot server requests on port 4011",
            ),
            drops: r.metric("drops", "Packets not answered, by reason"),
            malformed: r.metric("malformed", "Packets that did not decode"),
            leases: r.metric("leases", "Bound, unexpired leases"),
            pool_exhausted: r.metric(
                "pool_exhausted",
                "1 while the network's pool has no free address",
            ),
            pool_exhaustions: r.metric(
                "pool_exhaustions",
                "Episodes of the network's pool without a free address",
            ),
            offers_reclaimed: r.metric(
                "offers_reclaimed",
                "Unconfirmed offers whose address was given to another client because the pool was full",
            ),
        }
    }

    /// Counts what happened to a pool.
    pub fn pool(&self, event: &PoolEvent) {
        let labels = |network: &str| PoolLabels {
            network: network.to_owned(),
        };
        match event {
            PoolEvent::Exhausted {
                network, reclaimed, ..
            } => {
                let l = labels(network);
                self.pool_exhausted.get_or_create(&l).set(1);
                self.pool_exhaustions.get_or_create(&l).inc();
                if *reclaimed {
                    self.offers_reclaimed.get_or_create(&l).inc();
                }
            }
            PoolEvent::Reclaimed { network } => {
                self.offers_reclaimed.get_or_create(&labels(network)).inc();
            }
            PoolEvent::Recovered { network } => {
                self.pool_exhausted.get_or_create(&labels(network)).set(0);
            }
        }
    }

    /// Counts a sent reply.
    pub fn sent(&self, kind: ReplyKind) {
        match kind {
            ReplyKind::Ack => self.acks.inc(),
            ReplyKind::Nak => self.naks.inc(),
            ReplyKind::Offer => self.offers.inc(),
        };
    }

    /// Counts a packet not answered.
    pub fn dropped(&self, reason: Reason) {
        if reason == Reason::Malformed {
            self.malformed.inc();
        }
        if reason.is_drop() {
            self.drops
                .get_or_create(&DropLabels {
                    reason: reason.as_str(),
                })
                .inc();
        }
    }
}
