//! The boot config snapshot, indexed for DHCP.
//!
//! The snapshot is a list of hosts and networks, fit for JSON. A DHCP packet
//! needs "which host has this MAC" and "who holds this reserved address" in
//! O(1), so each new snapshot is indexed once ([`Inventory::new`]) and the
//! index is shared read-only by every packet until the next snapshot.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use mprov_api::boot::BootConfig;

/// A MAC address.
pub type Mac = [u8; 6];

/// A served network.
#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    /// Its slug.
    pub slug: String,
    /// Network address.
    pub subnet: Ipv4Addr,
    /// Netmask.
    pub mask: Ipv4Addr,
    /// Default gateway.
    pub gateway: Option<Ipv4Addr>,
    /// DNS servers.
    pub nameservers: Vec<Ipv4Addr>,
    /// DNS domain ("" for none).
    pub domain: String,
    /// Dynamic pool, first and last address.
    pub pool: Option<(Ipv4Addr, Ipv4Addr)>,
    /// DHCP is served here.
    pub dhcp: bool,
    /// Network boot is allowed here.
    pub netboot: bool,
}

impl Network {
    /// Whether `ip` is inside this network.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & u32::from(self.mask) == u32::from(self.subnet) & u32::from(self.mask)
    }

    /// Whether `ip` is inside this network's pool.
    pub fn in_pool(&self, ip: Ipv4Addr) -> bool {
        self.pool
            .is_some_and(|(a, b)| (u32::from(a)..=u32::from(b)).contains(&u32::from(ip)))
    }
}

/// A known interface.
#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    /// Reserved address.
    pub ip: Option<Ipv4Addr>,
    /// Short host name.
    pub hostname: String,
    /// Network boot allowed.
    pub netboot: bool,
}

/// One snapshot, indexed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    /// The snapshot's revision.
    pub revision: i64,
    /// Networks, in snapshot order.
    pub networks: Vec<Network>,
    /// Hosts by MAC.
    pub hosts: HashMap<Mac, Host>,
    /// Reserved addresses and who holds them.
    pub reserved: HashMap<Ipv4Addr, Mac>,
    /// Where iPXE gets its script.
    pub ipxe_script_url: Option<String>,
}

impl Inventory {
    /// Indexes a snapshot. Hosts with an unparsable MAC are skipped (logged):
    /// one bad row must not stop every other node from booting.
    pub fn new(config: &BootConfig) -> Self {
        let networks = config
            .networks
            .iter()
            .filter(|n| n.prefix <= 32)
            .map(|n| {
                let mask = if n.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(n.prefix))
                };
                Network {
                    slug: n.slug.clone(),
                    subnet: n.subnet,
                    mask: Ipv4Addr::from(mask),
                    gateway: n.gateway,
                    nameservers: n.nameservers.clone(),
                    domain: n.domain.clone(),
                    pool: n.pool,
                    dhcp: n.dhcp,
                    netboot: n.netboot,
                }
            })
            .collect();
        let mut hosts = HashMap::new();
        let mut reserved = HashMap::new();
        for h in &config.hosts {
            let Some(mac) = h.mac.as_deref() else {
                continue;
            };
            let Some(mac) = parse_mac(mac) else {
                tracing::warn!(host = %h.hostname, mac, "skipping host with a bad MAC");
                continue;
            };
            if let Some(ip) = h.ipv4 {
                reserved.insert(ip, mac);
            }
            hosts.insert(
                mac,
                Host {
                    ip: h.ipv4,
                    hostname: h.hostname.clone(),
                    netboot: h.netboot,
                },
            );
        }
        Self {
            revision: config.revision,
            networks,
            hosts,
            reserved,
            ipxe_script_url: config.boot.ipxe_script_url.clone(),
        }
    }

    /// The network containing `ip`.
    pub fn network_of(&self, ip: Ipv4Addr) -> Option<&Network> {
        self.networks.iter().find(|n| n.contains(ip))
    }

    /// Whether `ip` is reserved for a MAC other than `mac`.
    pub fn reserved_for_other(&self, ip: Ipv4Addr, mac: &Mac) -> bool {
        self.reserved.get(&ip).is_some_and(|m| m != mac)
    }
}

/// Parses `aa:bb:cc:dd:ee:ff` (or with `-`), any case.
pub fn parse_mac(s: &str) -> Option<Mac> {
    let mut mac = [0u8; 6];
    let mut parts = s.split([':', '-']);
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse() {
        let check = |s: &str, want: Option<Mac>| assert_eq!(parse_mac(s), want, "{s}");
        check("02:00:00:00:00:0a", Some([2, 0, 0, 0, 0, 10]));
        check(
            "AA-BB-CC-DD-EE-FF",
            Some([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]),
        );
        check("02:00:00:00:00", None);
        check("02:00:00:00:00:00:00", None);
        check("zz:00:00:00:00:00", None);
        check("", None);
    }
}
