//! Prometheus counters of the DNS server, registered into the caller's
//! registry under the `mprov_dns_` prefix.

use hickory_server::proto::op::ResponseCode;
use mprov_process::metrics::Prefixed;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

type Labels = [(&'static str, &'static str); 1];

/// The server's counters. Cheap to clone (shared atomics).
#[derive(Debug, Clone, Default)]
pub(crate) struct Metrics {
    /// Queries that were parsed and handed to the zones.
    pub(crate) queries: Counter,
    /// Responses sent, by `rcode`.
    pub(crate) responses: Family<Labels, Counter>,
    /// Queries for names outside our zones, sent to the upstream resolvers.
    pub(crate) forwarded: Counter,
    /// Queries answered REFUSED.
    pub(crate) refused: Counter,
    /// Packets dropped before or during handling, by `reason`.
    pub(crate) dropped: Family<Labels, Counter>,
    /// Zone rebuilds from a new snapshot.
    pub(crate) reloads: Counter,
    /// The `responses` series per rcode, resolved once: `Family` lookups take
    /// a lock and hash the labels, which showed under dnsperf.
    by_rcode: RcodeCounters,
}

/// Handles on the `responses` series, sharing their atomics.
#[derive(Debug, Clone, Default)]
struct RcodeCounters {
    noerror: Counter,
    formerr: Counter,
    servfail: Counter,
    nxdomain: Counter,
    notimp: Counter,
    refused: Counter,
    other: Counter,
}

impl Metrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let mut r = Prefixed::new(registry, "dns");
        let mut m = Metrics {
            queries: r.metric("queries", "DNS queries handled"),
            responses: r.metric("responses", "DNS responses sent, by rcode"),
            forwarded: r.metric("forwarded", "DNS queries forwarded to upstream resolvers"),
            refused: r.metric("refused", "DNS queries answered REFUSED"),
            dropped: r.metric(
                "dropped",
                "DNS packets dropped without an answer, by reason",
            ),
            reloads: r.metric(
                "zone_reloads",
                "DNS zone rebuilds from a new boot config snapshot",
            ),
            by_rcode: RcodeCounters::default(),
        };
        let series = |rcode| m.responses.get_or_create(&[("rcode", rcode)]).clone();
        m.by_rcode = RcodeCounters {
            noerror: series("noerror"),
            formerr: series("formerr"),
            servfail: series("servfail"),
            nxdomain: series("nxdomain"),
            notimp: series("notimp"),
            refused: series("refused"),
            other: series("other"),
        };
        m
    }

    pub(crate) fn drop(&self, reason: &'static str) {
        self.dropped.get_or_create(&[("reason", reason)]).inc();
    }

    pub(crate) fn response(&self, code: ResponseCode) {
        let c = &self.by_rcode;
        let counter = match code {
            ResponseCode::NoError => &c.noerror,
            ResponseCode::FormErr => &c.formerr,
            ResponseCode::ServFail => &c.servfail,
            ResponseCode::NXDomain => &c.nxdomain,
            ResponseCode::NotImp => &c.notimp,
            ResponseCode::Refused => &c.refused,
            _ => &c.other,
        };
        counter.inc();
        if code == ResponseCode::Refused {
            self.refused.inc();
        }
    }
}
