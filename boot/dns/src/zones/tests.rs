//! Tests of the zone records built from snapshots.

use std::net::Ipv6Addr;

use mprov_api::boot::BootNetwork;

use super::*;
use crate::sample::{host, network};

/// Renders a zone set as sorted `name type rdata` lines.
fn dump(set: &ZoneRecords) -> Vec<String> {
    let mut out: Vec<String> = set
        .zones
        .iter()
        .flat_map(|(z, rs)| {
            rs.iter()
                .map(move |r| format!("{z} | {} {} {}", r.name, r.record_type(), r.data))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn builds_forward_reverse_and_aliases() {
    let mut c01 = host("c01", "prov", [10, 0, 0, 21], &["login", "c01"]);
    c01.ipv6 = Some(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x21));
    let config = BootConfig {
        revision: 7,
        networks: vec![
            network("prov", [10, 0, 0, 0], 22, "cluster.test"),
            BootNetwork {
                dns: false,
                ..network("bmc", [10, 1, 0, 0], 24, "bmc.test")
            },
        ],
        hosts: vec![
            c01,
            host("c02", "prov", [10, 0, 0, 22], &["login"]),
            host("c01-bmc", "bmc", [10, 1, 0, 21], &[]),
            host("bad name!", "prov", [10, 0, 0, 99], &[]),
        ],
        ..Default::default()
    };
    let set = build(&config, 60);
    let lines = dump(&set);
    let expect = [
        "0.10.in-addr.arpa. | 21.0.0.10.in-addr.arpa. PTR c01.cluster.test.",
        "0.10.in-addr.arpa. | 22.0.0.10.in-addr.arpa. PTR c02.cluster.test.",
        "cluster.test. | c01.cluster.test. A 10.0.0.21",
        "cluster.test. | c01.cluster.test. AAAA fd00::21",
        "cluster.test. | c02.cluster.test. A 10.0.0.22",
        "cluster.test. | cluster.test. NS ns.cluster.test.",
        "cluster.test. | login.cluster.test. CNAME c01.cluster.test.",
    ];
    for line in expect {
        assert!(
            lines.iter().any(|l| l == line),
            "missing {line}: {lines:#?}"
        );
    }
    // The alias equal to its own host name and the second "login" are
    // skipped; the BMC network has DNS off; the bad name is skipped.
    assert_eq!(lines.iter().filter(|l| l.contains("CNAME")).count(), 1);
    assert!(!lines.iter().any(|l| l.contains("bmc")), "{lines:#?}");
    assert!(!lines.iter().any(|l| l.contains("10.0.0.99")), "{lines:#?}");
    // SOA serial is the revision; the IPv6 /64 zone exists.
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("cluster.test. | cluster.test. SOA") && l.contains(" 7 "))
    );
    assert!(
        set.origins()
            .any(|o| o.to_string() == "0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.")
    );
}

#[test]
fn nested_reverse_zones_take_the_most_specific() {
    let config = BootConfig {
        networks: vec![
            network("a", [10, 0, 0, 0], 16, "a.test"),
            network("b", [10, 0, 5, 0], 24, "b.test"),
        ],
        hosts: vec![
            host("x", "a", [10, 0, 1, 1], &[]),
            host("y", "b", [10, 0, 5, 1], &[]),
        ],
        ..Default::default()
    };
    let lines = dump(&build(&config, 60));
    assert!(lines.contains(&"0.10.in-addr.arpa. | 1.1.0.10.in-addr.arpa. PTR x.a.test.".into()));
    assert!(lines.contains(&"5.0.10.in-addr.arpa. | 1.5.0.10.in-addr.arpa. PTR y.b.test.".into()));
}

#[test]
fn subnet_check() {
    assert!(in_subnet([10, 0, 3, 1].into(), [10, 0, 0, 0].into(), 22));
    assert!(!in_subnet([10, 0, 4, 1].into(), [10, 0, 0, 0].into(), 22));
    assert!(in_subnet([1, 2, 3, 4].into(), [0, 0, 0, 0].into(), 0));
}
