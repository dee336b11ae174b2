//! The job server's DHCPv4 server: reservations from inventory, dynamic pools
//! for unknown nodes, PXE/iPXE boot files, proxyDHCP, and durable leases.
//!
//! Why our own server and not dnsmasq or Kea: the answers come from the live
//! inventory snapshot (a new node is answered within a second, without a
//! restart or a config file rewrite), the boot file depends on who asks
//! (firmware PXE, UEFI HTTP boot, or iPXE itself, which must not loop), and
//! leases must survive `kill -9` without dnsmasq's whole-file rewrite per
//! change. dhcproto provides only the codec (RFC 2131 / RFC 2132 messages);
//! everything else is here.
//!
//! Map:
//! - [`handler`]: the protocol decisions, a pure function (no sockets).
//! - [`server`]: the UDP listener; commits leases, then replies.
//! - [`store`]: the append-only lease log with group commit.
//! - [`table`]: who holds which address, in memory.
//! - [`ra`]: IPv6 router advertisements (no default route), so that iPXE
//!   does not wait for IPv6 autoconfiguration; its own socket and loop.
//! - [`inventory`]: the boot config snapshot, indexed by MAC and address.
//! - [`config`], [`metrics`].
//!
//! Architecture invariant: no ACK leaves before its lease record is durable.

#![warn(missing_docs)]

pub mod config;
pub mod handler;
pub mod inventory;
pub mod metrics;
pub mod ra;
pub mod server;
pub mod store;
pub mod table;

use std::net::{Ipv4Addr, SocketAddr};

pub use config::DhcpConfig;
pub use handler::{Action, Context, Outcome, PoolEvent, Reason, Reply, ReplyKind, handle};
pub use inventory::Inventory;
pub use metrics::Metrics;
pub use server::Server;
pub use store::{LeaseRecord, LeaseStore, StoreOptions};
pub use table::LeaseTable;

/// Fuzzing entry point: decodes arbitrary bytes and, if they decode, runs the
/// handler on them against a small fixed inventory and encodes any reply.
/// Must never panic.
pub fn fuzz_packet(data: &[u8]) {
    use dhcproto::Encodable;
    let _ = handler::prefilter(data);
    let Ok(msg) = handler::decode(data) else {
        return;
    };
    let _ = msg.to_vec();
    let inventory = Inventory::new(&fuzz_snapshot());
    let mut config = DhcpConfig::new(Ipv4Addr::new(10, 0, 0, 1));
    config.http_boot_url = Some("http://10.0.0.1/snponly.efi".into());
    let mut table = LeaseTable::default();
    for proxy in [false, true] {
        config.proxy = proxy;
        for local_port in [handler::SERVER_PORT, handler::PXE_PORT] {
            let ctx = Context {
                config: &config,
                inventory: &inventory,
                now: 1_000_000,
                src: SocketAddr::from(([10, 0, 0, 50], 68)),
                local_port,
            };
            if let Action::Respond(reply) = handle(&msg, &ctx, &mut table).action {
                let _ = handler::encode(&reply.msg);
            }
        }
    }
}

fn fuzz_snapshot() -> mprov_api::boot::BootConfig {
    use mprov_api::boot::{BootConfig, BootHost, BootNetwork, BootServices};
    BootConfig {
        revision: 1,
        networks: vec![BootNetwork {
            slug: "prov".into(),
            subnet: Ipv4Addr::new(10, 0, 0, 0),
            prefix: 24,
            gateway: Some(Ipv4Addr::new(10, 0, 0, 1)),
            nameservers: vec![Ipv4Addr::new(10, 0, 0, 1)],
            domain: "cluster".into(),
            pool: Some((Ipv4Addr::new(10, 0, 0, 100), Ipv4Addr::new(10, 0, 0, 103))),
            dhcp: true,
            dns: false,
            netboot: true,
            mtu: None,
            http_boot_url: None,
        }],
        hosts: vec![BootHost {
            mac: Some("02:00:00:00:00:01".into()),
            ipv4: Some(Ipv4Addr::new(10, 0, 0, 10)),
            ipv6: None,
            hostname: "n01".into(),
            aliases: vec![],
            network: Some("prov".into()),
            netboot: true,
            bootable: true,
        }],
        upstream_resolvers: vec![],
        boot: BootServices {
            ipxe_script_url: Some(mprov_api::boot::ipxe_chain_url("http://10.0.0.1")),
        },
    }
}
