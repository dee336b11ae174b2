//! The forwarder to the snapshot's upstream resolvers.
//!
//! Names outside our zones go through hickory's `ForwardZoneHandler` (a
//! caching resolver). It is rebuilt only when the upstream list changes, so
//! its cache survives the zone rebuilds that every inventory edit causes.

use std::net::IpAddr;
use std::sync::Arc;

use hickory_server::resolver::config::NameServerConfig;
use hickory_server::store::forwarder::{ForwardConfig, ForwardZoneHandler};
use hickory_server::zone_handler::{ZoneHandler, ZoneType};
use tracing::warn;

/// The forwarder for the current upstream list.
#[derive(Default)]
pub(super) struct Upstream {
    current: Option<(Vec<IpAddr>, Arc<dyn ZoneHandler>)>,
}

impl Upstream {
    /// The forwarder to `resolvers` on `port`, the previous one if the list
    /// did not change; `None` with no resolvers (outside names are then
    /// REFUSED) or if it cannot be built.
    pub(super) fn forwarder(
        &mut self,
        resolvers: &[IpAddr],
        port: u16,
    ) -> Option<Arc<dyn ZoneHandler>> {
        if resolvers.is_empty() {
            self.current = None;
            return None;
        }
        if let Some((ips, fwd)) = &self.current
            && ips == resolvers
        {
            return Some(fwd.clone());
        }
        let name_servers = resolvers
            .iter()
            .map(|&ip| {
                let mut ns = NameServerConfig::udp_and_tcp(ip);
                for conn in &mut ns.connections {
                    conn.port = port;
                }
                ns
            })
            .collect();
        let built = ForwardZoneHandler::builder_tokio(ForwardConfig {
            name_servers,
            options: None,
        })
        .build();
        match built {
            Ok(fwd) => {
                let fwd: Arc<dyn ZoneHandler> = Arc::new(fwd);
                debug_assert_eq!(fwd.zone_type(), ZoneType::External);
                self.current = Some((resolvers.to_vec(), fwd.clone()));
                Some(fwd)
            }
            Err(error) => {
                warn!(%error, "cannot build the DNS forwarder; refusing outside names");
                self.current = None;
                None
            }
        }
    }
}
