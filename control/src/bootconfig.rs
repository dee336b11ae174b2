//! Builds the boot config snapshot ([`mprov_api::boot::BootConfig`]) that job
//! servers follow, from one read transaction so the snapshot is consistent with
//! the revision it carries.
//!
//! The snapshot is read with a handful of whole-table queries (networks,
//! interfaces with their systems, BMCs, switches): a job server asks for it
//! only when the revision changed, and 10,000 nodes fit in a few megabytes.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mprov_api::boot::{BootConfig, BootHost, BootNetwork, BootServices};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::db::{Db, int, opt_bool, opt_int};

fn text(row: &AnyRow, col: &str) -> Option<String> {
    row.try_get::<Option<String>, _>(col)
        .ok()
        .flatten()
        .filter(|s| !s.is_empty())
}

fn v4(row: &AnyRow, col: &str) -> Option<Ipv4Addr> {
    text(row, col).and_then(|s| s.parse().ok())
}

fn v6(row: &AnyRow, col: &str) -> Option<Ipv6Addr> {
    text(row, col).and_then(|s| s.parse().ok())
}

/// Reads the snapshot.
pub async fn snapshot(
    db: &Db,
    upstream_resolvers: &[IpAddr],
    ipxe_script_url: Option<&str>,
) -> Result<BootConfig, sqlx::Error> {
    let mut tx = db.pool().begin().await?;
    let revision = int(
        &sqlx::query("SELECT revision FROM inventory_revision WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?,
        "revision",
    )?;

    let mut slugs: HashMap<i64, String> = HashMap::new();
    let mut networks = Vec::new();
    for r in sqlx::query(
        "SELECT id, slug, subnet, netmask, gateway, nameserver, domain, dhcp_start, dhcp_end, isdhcp, managedns, isbootable FROM networks ORDER BY id",
    )
    .fetch_all(&mut *tx)
    .await?
    {
        let slug = text(&r, "slug").unwrap_or_default();
        slugs.insert(int(&r, "id")?, slug.clone());
        let (Some(subnet), Some(prefix)) = (v4(&r, "subnet"), opt_int(&r, "netmask")?) else { continue };
        networks.push(BootNetwork {
            slug,
            subnet,
            prefix: u8::try_from(prefix).unwrap_or(32),
            gateway: v4(&r, "gateway"),
            nameservers: v4(&r, "nameserver").into_iter().collect(),
            domain: text(&r, "domain").unwrap_or_default(),
            pool: v4(&r, "dhcp_start").zip(v4(&r, "dhcp_end")),
            dhcp: opt_bool(&r, "isdhcp")?.unwrap_or(false),
            dns: opt_bool(&r, "managedns")?.unwrap_or(false),
            netboot: opt_bool(&r, "isbootable")?.unwrap_or(true),
            mtu: None,
            http_boot_url: None,
        });
    }
    let net = |id: Option<i64>| id.and_then(|i| slugs.get(&i).cloned());

    let mut hosts = Vec::new();
    // A switch port's network takes precedence over the interface's own.
    for r in sqlx::query(
        "SELECT n.mac, n.ipv4, n.ipv6, n.hostname AS nic_hostname, n.aliases, n.network_id, n.bootable, \
         p.network_id AS port_network_id, s.hostname, s.netboot \
         FROM network_interfaces n JOIN systems s ON s.id = n.system_id \
         LEFT JOIN switch_ports p ON p.id = n.switch_port_id ORDER BY n.id",
    )
    .fetch_all(&mut *tx)
    .await?
    {
        let aliases: Vec<String> =
            text(&r, "aliases").and_then(|a| serde_json::from_str(&a).ok()).unwrap_or_default();
        let system = text(&r, "hostname").unwrap_or_default();
        // A NIC's own DNS name, when set, names it; its system's name otherwise.
        let (hostname, aliases) = match text(&r, "nic_hostname") {
            Some(h) if h != system => {
                let short = h.split('.').next().unwrap_or(&h).to_owned();
                (short, aliases)
            }
            _ => (system, aliases),
        };
        hosts.push(BootHost {
            mac: text(&r, "mac"),
            ipv4: v4(&r, "ipv4"),
            ipv6: v6(&r, "ipv6"),
            hostname,
            aliases,
            network: net(opt_int(&r, "port_network_id")?.or(opt_int(&r, "network_id")?)),
            netboot: opt_bool(&r, "netboot")?.unwrap_or(true),
            bootable: opt_bool(&r, "bootable")?.unwrap_or(false),
        });
    }
    // Management addresses, BMCs then switches: a name and an address,
    // never a boot. A BMC is named after its node with `-bmc`, so it never
    // shadows the node's own name.
    for (query, suffix) in [
        (
            "SELECT b.mac AS mac, b.ipv4 AS ipv4, b.network_id AS network_id, s.hostname AS hostname \
             FROM bmcs b JOIN systems s ON s.id = b.system_id ORDER BY b.id",
            "-bmc",
        ),
        (
            "SELECT mgmt_mac AS mac, mgmt_ip AS ipv4, network_id, hostname FROM switches ORDER BY id",
            "",
        ),
    ] {
        for r in sqlx::query(query).fetch_all(&mut *tx).await? {
            hosts.push(BootHost {
                mac: text(&r, "mac"),
                ipv4: v4(&r, "ipv4"),
                ipv6: None,
                hostname: format!("{}{suffix}", text(&r, "hostname").unwrap_or_default()),
                aliases: Vec::new(),
                network: net(opt_int(&r, "network_id")?),
                netboot: false,
                bootable: false,
            });
        }
    }
    tx.commit().await?;
    Ok(BootConfig {
        revision,
        networks,
        hosts,
        upstream_resolvers: upstream_resolvers.to_vec(),
        boot: BootServices {
            ipxe_script_url: ipxe_script_url.map(str::to_owned),
        },
    })
}
