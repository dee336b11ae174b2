//! The server state without sockets: the fixture of the fuzz target
//! (`src/fuzz.rs`) and of the fast path's tests, which run a request
//! through the same prechecks and both answering paths as the listeners.

use std::net::SocketAddr;
use std::sync::Arc;

use hickory_server::net::NetError;
use hickory_server::net::xfer::Protocol;
use mprov_api::boot::BootConfig;
use tokio::sync::Semaphore;

use super::handler::{Deliver, Responder, precheck};
use super::{LiveZones, ServedZones, Shared};
use crate::DnsConfig;
use crate::metrics::Metrics;

/// The two paths' responses to one request, as bytes (without the TCP
/// length prefix); `None` where the request is dropped or not taken.
#[derive(Debug)]
pub(crate) struct Responses {
    /// The fast path's response, if it takes the request.
    pub(crate) fast: Option<Vec<u8>>,
    /// The general path's (hickory's catalog), run whether or not the fast
    /// path took the request.
    pub(crate) general: Option<Vec<u8>>,
}

impl Shared {
    /// A server state over `snapshot`'s zones, with no forwarder and no
    /// registered metrics: the fixture of the fuzz target and of tests.
    pub(crate) fn fixture(snapshot: &BootConfig) -> Self {
        let config = DnsConfig::default();
        Self {
            live: LiveZones::new(ServedZones::from_snapshot(snapshot, config.ttl, None)),
            metrics: Metrics::default(),
            permits: Arc::new(Semaphore::new(config.max_in_flight)),
            config,
        }
    }

    /// Runs `raw`, as received over `protocol`, through the same checks and
    /// both answering paths the listeners use, collecting the bytes each
    /// would send.
    pub(crate) async fn responses(&self, raw: &[u8], protocol: Protocol) -> Responses {
        if precheck(raw).is_err() {
            return Responses {
                fast: None,
                general: None,
            };
        }
        let mut out = Vec::new();
        let fast = self
            .live
            .get()
            .fast
            .answer(raw, protocol, &mut out)
            .then_some(out);
        let collected = Arc::new(std::sync::Mutex::new(None));
        let responder = Responder(Collect {
            protocol,
            sent: collected.clone(),
        });
        let src = SocketAddr::from(([127, 0, 0, 1], 5353));
        self.handle(raw.to_vec(), src, protocol, responder).await;
        let general = collected.lock().unwrap_or_else(|e| e.into_inner()).take();
        Responses { fast, general }
    }
}

/// Keeps the encoded response instead of sending it.
#[derive(Clone)]
struct Collect {
    protocol: Protocol,
    sent: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
}

#[async_trait::async_trait]
impl Deliver for Collect {
    fn protocol(&self) -> Protocol {
        self.protocol
    }

    async fn deliver(&mut self, bytes: Vec<u8>) -> Result<(), NetError> {
        *self.sent.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes);
        Ok(())
    }
}
