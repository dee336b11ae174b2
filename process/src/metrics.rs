//! Prometheus registration in one call a metric.
//!
//! Every boot service keeps its counters in a struct whose `Default` counts
//! into the void (what unit tests want) and registers them into the caller's
//! registry under its own prefix. [`Prefixed`] is that registration, once:
//! the name, the help and the metric in one call, the metric created there
//! ([`Prefixed::metric`]) or already held ([`Prefixed::share`]).

use prometheus_client::registry::{Metric, Registry};

/// A registry's sub-registry under one prefix (`dhcp`, `mprov_dns`, ...).
#[derive(Debug)]
pub struct Prefixed<'a>(&'a mut Registry);

impl<'a> Prefixed<'a> {
    /// Metrics registered through this are named `<prefix>_<name>`.
    pub fn new(registry: &'a mut Registry, prefix: &str) -> Self {
        Prefixed(registry.sub_registry_with_prefix(prefix))
    }

    /// A new metric (counter, gauge, family of them), registered as `name`
    /// with `help`: the returned handle shares its values with the registry.
    #[track_caller]
    pub fn metric<M: Metric + Clone + Default>(&mut self, name: &str, help: &str) -> M {
        let metric = M::default();
        self.share(name, help, &metric);
        metric
    }

    /// Registers a handle on `metric` (sharing its values) as `name` with
    /// `help`.
    #[track_caller]
    pub fn share<M: Metric + Clone>(&mut self, name: &str, help: &str, metric: &M) {
        self.0.register(name, help, metric.clone());
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::registry::Registry;

    use super::Prefixed;

    #[test]
    fn registered_handles_share_their_values_under_the_prefix() {
        let mut registry = Registry::default();
        let mut r = Prefixed::new(&mut registry, "svc");
        let sent: Counter = r.metric("sent", "Things sent");
        let open = Gauge::<i64>::default();
        r.share("open", "Things open", &open);
        sent.inc();
        open.set(3);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(text.contains("# HELP svc_sent Things sent.\n"), "{text}");
        assert!(text.contains("svc_sent_total 1\n"), "{text}");
        assert!(text.contains("svc_open 3\n"), "{text}");
    }
}
