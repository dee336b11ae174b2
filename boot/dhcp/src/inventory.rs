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
    /// The UEFI HTTP boot URL here, instead of the server's.
    pub http_boot_url: Option<String>,
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

/// A pool covering addresses the inventory assigns to hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The network's slug.
    pub network: String,
    /// The pool's first and last address.
    pub pool: (Ipv4Addr, Ipv4Addr),
    /// The assigned addresses inside it.
    pub addresses: Vec<Ipv4Addr>,
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
    /// Addresses the inventory assigns, and to which MAC (`None`: a host
    /// without one, such as a BMC or a switch with a static address). None of
    /// them is ever handed out from a pool.
    pub reserved: HashMap<Ipv4Addr, Option<Mac>>,
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
                    http_boot_url: n.http_boot_url.clone().filter(|u| !u.is_empty()),
                }
            })
            .collect();
        let mut hosts = HashMap::new();
        let mut reserved = HashMap::new();
        for h in &config.hosts {
            let Some(text) = h.mac.as_deref() else {
                if let Some(ip) = h.ipv4 {
                    reserved.entry(ip).or_insert(None);
                }
                continue;
            };
            let Some(mac) = parse_mac(text) else {
                tracing::warn!(host = %h.hostname, mac = text, "skipping host with a bad MAC");
                // Its address is still taken: never hand it to a pool client.
                if let Some(ip) = h.ipv4 {
                    reserved.entry(ip).or_insert(None);
                }
                continue;
            };
            if let Some(ip) = h.ipv4 {
                reserved.insert(ip, Some(mac));
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
        let inventory = Self {
            revision: config.revision,
            networks,
            hosts,
            reserved,
            ipxe_script_url: config.boot.ipxe_script_url.clone(),
        };
        for o in inventory.pool_overlaps() {
            tracing::warn!(
                network = %o.network,
                count = o.addresses.len(),
                "the DHCP pool {}-{} of network {} covers {} address(es) the inventory assigns to hosts ({}); they are never handed out from the pool, which is that much smaller: move the pool or the hosts",
                o.pool.0,
                o.pool.1,
                o.network,
                o.addresses.len(),
                o.addresses
                    .iter()
                    .take(8)
                    .map(Ipv4Addr::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if o.addresses.len() > 8 { ", ..." } else { "" },
            );
        }
        inventory
    }

    /// The pools that cover addresses the inventory assigns, with those
    /// addresses in order.
    pub fn pool_overlaps(&self) -> Vec<Overlap> {
        let mut assigned: Vec<Ipv4Addr> = self.reserved.keys().copied().collect();
        assigned.sort_unstable();
        self.networks
            .iter()
            .filter(|n| n.dhcp)
            .filter_map(|n| {
                let pool = n.pool?;
                let addresses: Vec<Ipv4Addr> = assigned
                    .iter()
                    .copied()
                    .filter(|ip| n.in_pool(*ip))
                    .collect();
                (!addresses.is_empty()).then(|| Overlap {
                    network: n.slug.clone(),
                    pool,
                    addresses,
                })
            })
            .collect()
    }

    /// The network containing `ip`.
    pub fn network_of(&self, ip: Ipv4Addr) -> Option<&Network> {
        self.networks.iter().find(|n| n.contains(ip))
    }

    /// Whether `ip` is reserved for the host with `mac`.
    pub fn reserved_for(&self, ip: Ipv4Addr, mac: &Mac) -> bool {
        self.reserved
            .get(&ip)
            .is_some_and(|m| m.as_ref() == Some(mac))
    }

    /// Whether `ip` is assigned to a host other than the one with `mac`.
    pub fn reserved_for_other(&self, ip: Ipv4Addr, mac: &Mac) -> bool {
        self.reserved
            .get(&ip)
            .is_some_and(|m| m.as_ref() != Some(mac))
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
