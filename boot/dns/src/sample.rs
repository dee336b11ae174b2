//! Sample zone data, written once: the unit tests, the integration tests
//! (`tests/dns.rs`) and `fuzz_query` build their snapshots from
//! these.

use std::net::Ipv6Addr;

use mprov_api::boot::{BootConfig, BootHost, BootNetwork};

/// A netboot network `slug` on `subnet`/`prefix` with DHCP and DNS on, its
/// zone `domain`.
pub fn network(slug: &str, subnet: [u8; 4], prefix: u8, domain: &str) -> BootNetwork {
    BootNetwork {
        slug: slug.into(),
        subnet: subnet.into(),
        prefix,
        gateway: None,
        nameservers: vec![],
        domain: domain.into(),
        pool: None,
        dhcp: true,
        dns: true,
        netboot: true,
        mtu: None,
        http_boot_url: None,
    }
}

/// A bootable host `name` on network `net` at `ipv4`, with `aliases`.
pub fn host(name: &str, net: &str, ipv4: [u8; 4], aliases: &[&str]) -> BootHost {
    BootHost {
        mac: None,
        ipv4: Some(ipv4.into()),
        ipv6: None,
        hostname: name.into(),
        aliases: aliases.iter().map(|a| a.to_string()).collect(),
        network: Some(net.into()),
        netboot: true,
        bootable: true,
    }
}

/// `cluster.test` (network `prov`, 10.0.0.0/24) with three hosts, `c01`
/// with IPv6 and the aliases `login` and `head`, and its reverse zones;
/// revision 42.
pub fn snapshot() -> BootConfig {
    let mut c01 = host("c01", "prov", [10, 0, 0, 21], &["login", "head"]);
    c01.ipv6 = Some(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x21));
    BootConfig {
        revision: 42,
        networks: vec![network("prov", [10, 0, 0, 0], 24, "cluster.test")],
        hosts: vec![
            c01,
            host("c02", "prov", [10, 0, 0, 22], &[]),
            host("c03", "prov", [10, 0, 0, 23], &[]),
        ],
        ..Default::default()
    }
}
