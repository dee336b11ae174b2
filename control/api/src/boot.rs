//! The boot config snapshot: everything a job server needs to answer a booting
//! node before its kernel runs (DHCP reservations and pools, DNS names, boot
//! files), as one document with the inventory revision it was read at.
//!
//! The control service serves it at `GET /api/v1/bootconfig` with a long-poll
//! (`?after=<revision>&wait=<seconds>`), so a job server learns of a new node
//! within a second and keeps serving the last snapshot while the control
//! service is away. Standalone job servers read the same document from a file
//! (JSON or YAML).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// The path of the snapshot endpoint.
pub const BOOTCONFIG_PATH: &str = "/api/v1/bootconfig";

/// One consistent view of the inventory, as the boot services need it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootConfig {
    /// The inventory revision this snapshot was read at.
    pub revision: i64,
    /// The provisioning and other networks.
    #[serde(default)]
    pub networks: Vec<BootNetwork>,
    /// Every known interface with a MAC or an address: DHCP reservations and
    /// DNS names.
    #[serde(default)]
    pub hosts: Vec<BootHost>,
    /// Resolvers for names outside the cluster's domains; none means refuse.
    #[serde(default)]
    pub upstream_resolvers: Vec<IpAddr>,
    /// Where nodes fetch their boot script and images.
    #[serde(default)]
    pub boot: BootServices,
}

/// A network, with what the job server serves on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootNetwork {
    /// The network's slug.
    pub slug: String,
    /// Its network address.
    pub subnet: Ipv4Addr,
    /// Its prefix length.
    pub prefix: u8,
    /// The default gateway handed out.
    #[serde(default)]
    pub gateway: Option<Ipv4Addr>,
    /// DNS servers handed out.
    #[serde(default)]
    pub nameservers: Vec<Ipv4Addr>,
    /// The DNS domain of hosts on it ("" for none).
    #[serde(default)]
    pub domain: String,
    /// The dynamic pool for unknown nodes: first and last address.
    #[serde(default)]
    pub pool: Option<(Ipv4Addr, Ipv4Addr)>,
    /// Serve DHCP here.
    #[serde(default)]
    pub dhcp: bool,
    /// Serve DNS for its hosts.
    #[serde(default)]
    pub dns: bool,
    /// Allow network boot here.
    #[serde(default = "yes")]
    pub netboot: bool,
    /// MTU handed out, if not the default.
    #[serde(default)]
    pub mtu: Option<u16>,
}

fn yes() -> bool {
    true
}

/// One interface of a system (or a switch, or a BMC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootHost {
    /// Lowercase `aa:bb:cc:dd:ee:ff`, if known.
    #[serde(default)]
    pub mac: Option<String>,
    /// The reserved IPv4 address, if any.
    #[serde(default)]
    pub ipv4: Option<Ipv4Addr>,
    /// Its IPv6 address, if any (DNS only).
    #[serde(default)]
    pub ipv6: Option<Ipv6Addr>,
    /// Its short host name.
    pub hostname: String,
    /// Further names.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// The slug of its network, if known.
    #[serde(default)]
    pub network: Option<String>,
    /// Whether it may boot from the network (false: answer DHCP, no boot file).
    #[serde(default = "yes")]
    pub netboot: bool,
    /// Whether this is the interface the system boots from.
    #[serde(default)]
    pub bootable: bool,
}

/// Where nodes go once they have an address.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootServices {
    /// The URL iPXE chains to for its boot script, e.g.
    /// `http://10.0.0.1:8080/ipxe/`; `${net0/mac}` and the like are appended
    /// by the job server.
    #[serde(default)]
    pub ipxe_script_url: Option<String>,
}
