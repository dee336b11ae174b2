//! Prometheus metrics of the DHCP server.
//!
//! The caller owns the `Registry` (the job server serves it on its own
//! metrics listener); [`Metrics::register`] adds ours
//! under the `dhcp_` prefix. An unregistered [`Metrics::default`] counts into
//! the void, which is what unit tests want.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::handler::{Reason, ReplyKind};

/// The label of a drop.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DropLabels {
    /// Why.
    pub reason: &'static str,
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
    /// Packets not answered, by reason.
    pub drops: Family<DropLabels, Counter>,
    /// Packets that did not decode.
    pub malformed: Counter,
    /// Bound, unexpired leases.
    pub leases: Gauge,
}

impl Metrics {
    /// New metrics, registered into `registry` with the `dhcp` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("dhcp");
        r.register("offers", "DHCPOFFERs sent", m.offers.clone());
        r.register("acks", "DHCPACKs sent", m.acks.clone());
        r.register("naks", "DHCPNAKs sent", m.naks.clone());
        r.register("drops", "Packets not answered, by reason", m.drops.clone());
        r.register(
            "malformed",
            "Packets that did not decode",
            m.malformed.clone(),
        );
        r.register("leases", "Bound, unexpired leases", m.leases.clone());
        m
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
