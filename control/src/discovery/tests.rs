use mprov_api::nads::{Hardware, LinkReport, NadsReport, Neighbour};

use super::*;

const BOOT: &str = "52:54:00:aa:00:01";

/// Switch 1 `sw1` (management MAC 00:11:22:33:44:55), switch 2 `sw2.lab`;
/// c01 eno1 on sw1 Ethernet1/1 without a MAC, c02 eno1 on sw1 Ethernet1/2
/// with one, c03 eno1 on sw2 port `7` (the seed's style), c04 eno1 on sw1
/// Ethernet1/3 with model and serial set, c05 eno1 with MAC 52:54:00:aa:00:05
/// on sw1 Ethernet1/5.
fn inventory() -> Inventory {
    let nic = |id: i64, host: &str, switch: i64, port: &str, mac: Option<&str>| Nic {
        id,
        name: "eno1".into(),
        system_id: id * 10,
        hostname: host.into(),
        mac: mac.map(str::to_owned),
        switch_id: Some(switch),
        port: Some(port.into()),
        model: None,
        serial: None,
    };
    let mut c04 = nic(4, "c04", 1, "Ethernet1/3", None);
    c04.model = Some("PowerEdge R650".into());
    c04.serial = Some("ABC123".into());
    Inventory {
        switches: vec![
            Switch {
                id: 1,
                hostname: "sw1".into(),
                mgmt_mac: Some("00:11:22:33:44:55".into()),
                mgmt_ip: Some("10.0.9.1".into()),
            },
            Switch {
                id: 2,
                hostname: "sw2.lab".into(),
                mgmt_mac: None,
                mgmt_ip: None,
            },
        ],
        nics: vec![
            nic(1, "c01", 1, "Ethernet1/1", None),
            nic(2, "c02", 1, "Ethernet1/2", Some("52:54:00:aa:00:02")),
            nic(3, "c03", 2, "7", None),
            c04,
            nic(5, "c05", 1, "Ethernet1/5", Some("52:54:00:aa:00:05")),
        ],
    }
}

fn heard(system: Option<&str>, chassis: &str, port: &str) -> Neighbour {
    Neighbour {
        chassis_id: chassis.into(),
        chassis_id_subtype: "mac-address".into(),
        port_id: port.into(),
        port_id_subtype: "interface-name".into(),
        system_name: system.map(str::to_owned),
        ..Neighbour::default()
    }
}

fn report(mac: &str, neighbour: Option<Neighbour>) -> NadsReport {
    NadsReport {
        boot_mac: mac.into(),
        links: vec![LinkReport {
            interface: "eth0".into(),
            mac: mac.into(),
            neighbour,
        }],
        hardware: Hardware::default(),
    }
}

fn on(port: &str) -> NadsReport {
    report(BOOT, Some(heard(Some("sw1"), "00:11:22:33:44:55", port)))
}

fn bound_to(o: &Outcome) -> Option<(i64, Option<&str>)> {
    match &o.decision {
        Decision::Bind {
            target, replaces, ..
        } => Some((target.nic, replaces.as_deref())),
        _ => None,
    }
}

fn parked(o: &Outcome) -> (&str, Option<i64>) {
    match &o.decision {
        Decision::Park { reason, candidate } => (reason, candidate.as_ref().map(|c| c.nic)),
        other => panic!("not parked: {other:?}"),
    }
}

#[test]
fn manual_parks_every_match_naming_it() {
    let inv = inventory();
    for port in ["Ethernet1/1", "Ethernet1/2"] {
        let o = decide(&on(port), &inv, Policy::Manual);
        let (reason, candidate) = parked(&o);
        assert!(reason.contains("policy manual"), "{reason}");
        assert!(candidate.is_some(), "{o:?}");
        assert!(o.warnings.is_empty(), "{o:?}");
    }
    assert_eq!(
        parked(&decide(&on("Ethernet1/1"), &inv, Policy::Manual)).1,
        Some(1)
    );
}

#[test]
fn open_binds_only_to_a_nic_without_a_mac() {
    let inv = inventory();
    let o = decide(&on("Ethernet1/1"), &inv, Policy::Open);
    assert_eq!(bound_to(&o), Some((1, None)));
    assert!(o.warnings.is_empty());
    match &o.decision {
        Decision::Bind { mac, target, .. } => {
            assert_eq!(mac, BOOT);
            assert_eq!((target.system_id, target.hostname.as_str()), (10, "c01"));
        }
        other => panic!("{other:?}"),
    }
    let o = decide(&on("Ethernet1/2"), &inv, Policy::Open);
    let (reason, candidate) = parked(&o);
    assert!(
        reason.contains("52:54:00:aa:00:02") && reason.contains("policy open"),
        "{reason}"
    );
    assert_eq!(candidate, Some(2));
    assert!(o.warnings.is_empty());
}

#[test]
fn permissive_replaces_a_mac_with_a_warning() {
    let inv = inventory();
    let o = decide(&on("Ethernet1/2"), &inv, Policy::Permissive);
    assert_eq!(bound_to(&o), Some((2, Some("52:54:00:aa:00:02"))));
    assert!(
        matches!(&o.warnings[..], [Warning::Replaced { old, new, target }]
            if old == "52:54:00:aa:00:02" && new == BOOT && target.system_id == 20),
        "{o:?}"
    );
    // A NIC without a MAC: bound, no warning.
    let o = decide(&on("Ethernet1/1"), &inv, Policy::Permissive);
    assert_eq!(bound_to(&o), Some((1, None)));
    assert!(o.warnings.is_empty());
}

#[test]
fn a_known_mac_on_another_port_is_never_rebound() {
    let inv = inventory();
    // c05's MAC heard on c01's port (free under open) and c02's (taken).
    for port in ["Ethernet1/1", "Ethernet1/2", "Ethernet1/9"] {
        for policy in [Policy::Manual, Policy::Open, Policy::Permissive] {
            let r = report("52:54:00:AA:00:05", Some(heard(Some("sw1"), "x", port)));
            let o = decide(&r, &inv, policy);
            let (reason, candidate) = parked(&o);
            assert!(reason.contains("recabled"), "{reason}");
            assert_eq!(candidate, None);
            match &o.warnings[..] {
                [
                    w @ Warning::Recabled {
                        holder,
                        known,
                        heard,
                        mac,
                    },
                ] => {
                    assert_eq!(holder.system_id, 50);
                    assert_eq!(mac, "52:54:00:aa:00:05");
                    assert_eq!(known.as_deref(), Some("switch sw1 port Ethernet1/5"));
                    assert_eq!(
                        heard.as_deref(),
                        Some(format!("switch sw1 port {port}").as_str())
                    );
                    assert_eq!(w.system_id(), Some(50));
                    assert!(w.to_string().contains("Not rebound"), "{w}");
                }
                other => panic!("{policy}: {other:?}"),
            }
        }
    }
    // Heard on its own port: matched, nothing changes, no warning.
    let r = report("52:54:00:aa:00:05", Some(heard(Some("sw1"), "x", "Eth1/5")));
    let o = decide(&r, &inv, Policy::Permissive);
    assert!(
        matches!(&o.decision, Decision::AlreadyBound(t) if t.nic == 5),
        "{o:?}"
    );
    assert!(o.warnings.is_empty());
    // A known MAC that heard nothing is parked with the warning too.
    let o = decide(&report("52:54:00:aa:00:05", None), &inv, Policy::Open);
    assert!(matches!(
        &o.warnings[..],
        [Warning::Recabled { heard: None, .. }]
    ));
    parked(&o);
}

#[test]
fn a_duplicate_mac_in_the_report_parks_with_a_warning() {
    let inv = inventory();
    let mut r = on("Ethernet1/1");
    r.links.push(LinkReport {
        interface: "eth1".into(),
        mac: BOOT.to_uppercase(),
        neighbour: Some(heard(Some("sw1"), "x", "Ethernet1/1")),
    });
    for policy in [Policy::Manual, Policy::Open, Policy::Permissive] {
        let o = decide(&r, &inv, policy);
        parked(&o);
        assert!(
            matches!(&o.warnings[..], [w @ Warning::DuplicateInReport { links: 2, .. }] if w.system_id().is_none()),
            "{o:?}"
        );
    }
}

#[test]
fn model_and_serial_must_match_where_set() {
    let inv = inventory();
    let hw = |model: Option<&str>, serial: Option<&str>| Hardware {
        vendor: Some("Dell Inc.".into()),
        model: model.map(str::to_owned),
        serial: serial.map(str::to_owned),
    };
    let with = |h: Hardware| {
        let mut r = on("Ethernet1/3");
        r.hardware = h;
        decide(&r, &inv, Policy::Open)
    };
    // Both match (case and spaces aside): bound.
    let o = with(hw(Some(" poweredge r650 "), Some("ABC123")));
    assert_eq!(bound_to(&o), Some((4, None)), "{o:?}");
    for (h, what) in [
        (hw(Some("PowerEdge R750"), Some("ABC123")), "model"),
        (hw(Some("PowerEdge R650"), Some("XYZ")), "serial"),
        (hw(None, Some("ABC123")), "model"),
        (hw(Some("PowerEdge R650"), None), "serial"),
    ] {
        let o = with(h);
        let (reason, candidate) = parked(&o);
        assert!(reason.contains(what), "{reason}");
        assert_eq!(candidate, Some(4));
        assert!(
            matches!(&o.warnings[..], [Warning::HardwareMismatch { what: w, .. }] if *w == what),
            "{o:?}"
        );
    }
    // A system without model or serial takes any hardware.
    let mut r = on("Ethernet1/1");
    r.hardware = hw(Some("anything"), Some("any"));
    assert_eq!(bound_to(&decide(&r, &inv, Policy::Open)), Some((1, None)));
}

#[test]
fn what_matches_no_switch_or_port_is_parked_with_the_reason() {
    let inv = inventory();
    let check = |r: NadsReport, says: &str| {
        for policy in [Policy::Manual, Policy::Open, Policy::Permissive] {
            let o = decide(&r, &inv, policy);
            let (reason, candidate) = parked(&o);
            assert!(reason.contains(says), "{says:?} not in {reason:?}");
            assert_eq!(candidate, None);
            assert!(o.warnings.is_empty());
        }
    };
    check(
        report(
            BOOT,
            Some(heard(Some("sw9"), "aa:aa:aa:aa:aa:aa", "Ethernet1/1")),
        ),
        "switch sw9",
    );
    check(
        on("Ethernet1/99"),
        "no NIC in the inventory is cabled to switch sw1 port Ethernet1/99",
    );
    check(report(BOOT, None), "heard no LLDP neighbour");
    let mut other_link = report("52:54:00:aa:00:99", None);
    other_link.boot_mac = BOOT.into();
    check(other_link, "no link with the boot MAC");
}

#[test]
fn the_switch_is_found_by_system_name_or_chassis_id() {
    let inv = inventory();
    let bind = |n: Neighbour| {
        bound_to(&decide(&report(BOOT, Some(n)), &inv, Policy::Open)).map(|(nic, _)| nic)
    };
    // System name, in any case, with or without the domain.
    assert_eq!(bind(heard(Some("SW1"), "", "Ethernet1/1")), Some(1));
    assert_eq!(bind(heard(Some("sw1.cluster"), "", "Ethernet1/1")), Some(1));
    assert_eq!(bind(heard(Some("sw2"), "", "Ethernet7")), Some(3));
    // No system name: the chassis ID as the management MAC (any spelling),
    // address or name.
    assert_eq!(
        bind(heard(None, "00-11-22-33-44-55", "Ethernet1/1")),
        Some(1)
    );
    let mut by_ip = heard(None, "10.0.9.1", "Ethernet1/1");
    by_ip.chassis_id_subtype = "network-address".into();
    assert_eq!(bind(by_ip), Some(1));
    let mut by_name = heard(None, "sw2.lab", "7");
    by_name.chassis_id_subtype = "local".into();
    assert_eq!(bind(by_name), Some(3));
    // A system name that names no switch falls back to the chassis ID.
    assert_eq!(
        bind(heard(Some("leaf-a"), "00:11:22:33:44:55", "Ethernet1/1")),
        Some(1)
    );
}

#[test]
fn the_port_description_names_the_port_when_the_port_id_is_a_mac() {
    let inv = inventory();
    let mut n = heard(Some("sw1"), "x", "00:11:22:33:44:71");
    n.port_id_subtype = "mac-address".into();
    n.port_description = Some("Ethernet1/1".into());
    assert_eq!(
        bound_to(&decide(&report(BOOT, Some(n)), &inv, Policy::Open)),
        Some((1, None))
    );
}

#[test]
fn two_nics_on_one_port_name_are_ambiguous() {
    let mut inv = inventory();
    // c06 typed as eth1/1 on sw1: the same port as c01's Ethernet1/1.
    inv.nics.push(Nic {
        id: 6,
        name: "eno1".into(),
        system_id: 60,
        hostname: "c06".into(),
        switch_id: Some(1),
        port: Some("eth1/1".into()),
        ..Nic::default()
    });
    let o = decide(&on("Ethernet1/1"), &inv, Policy::Open);
    let (reason, _) = parked(&o);
    assert!(
        reason.contains("several NICs") && reason.contains("c01") && reason.contains("c06"),
        "{reason}"
    );
}

#[test]
fn port_names_match_across_spellings_and_not_across_ports() {
    let m = |inv: &str, heard: &str| port_match(inv, heard);
    // The same port, spelled by different vendors or typed by an admin.
    for (inv, heard) in [
        ("Ethernet1/1", "Eth1/1"),
        ("eth1/1", "Ethernet1/1"),
        ("1/1", "Ethernet1/1"),
        ("Gi1/0/1", "GigabitEthernet1/0/1"),
        ("ge-0/0/1", "ge-0/0/1"),
        ("swp1", "swp1"),
        ("7", "Port 7"),
        ("1/1/1", "1/1/1"),
        ("veth-sw1", "veth-sw1"),
    ] {
        assert_eq!(m(inv, heard), Some(Strength::Exact), "{inv} ~ {heard}");
    }
    // The seed's rule: the number after the last '/'.
    assert_eq!(m("7", "Ethernet1/7"), Some(Strength::Suffix));
    assert_eq!(m("1", "ge-0/0/1"), Some(Strength::Suffix));
    // Other ports, or other interface types on one switch.
    for (inv, heard) in [
        ("Ethernet1/1", "Ethernet1/10"),
        ("Ethernet1/1", "Ethernet2/1"),
        ("ge-0/0/1", "xe-0/0/1"),
        ("swp1", "swp10"),
        ("swp1", "Ethernet1"),
        ("Ethernet1/7", "7"),
        ("1/1", "Ethernet1/1/1"),
        ("mgmt", "eth"),
        ("", ""),
    ] {
        assert_eq!(m(inv, heard), None, "{inv} !~ {heard}");
    }
}

#[test]
fn an_exact_port_wins_over_a_suffix() {
    let mut inv = inventory();
    // sw2 has "7" (c03) and "1/7" (c07): the port heard as 1/7 is c07's.
    inv.nics.push(Nic {
        id: 7,
        name: "eno1".into(),
        system_id: 70,
        hostname: "c07".into(),
        switch_id: Some(2),
        port: Some("1/7".into()),
        ..Nic::default()
    });
    let r = report(BOOT, Some(heard(Some("sw2"), "", "Ethernet1/7")));
    assert_eq!(bound_to(&decide(&r, &inv, Policy::Open)), Some((7, None)));
}

#[test]
fn policies_parse_and_print() {
    for p in [Policy::Manual, Policy::Open, Policy::Permissive] {
        assert_eq!(p.as_str().parse::<Policy>(), Ok(p));
        assert_eq!(p.to_string().to_uppercase().parse::<Policy>(), Ok(p));
    }
    assert_eq!("".parse::<Policy>(), Ok(Policy::Manual));
    assert_eq!(Policy::default(), Policy::Manual);
    let e = "loose".parse::<Policy>().unwrap_err();
    assert!(e.contains("manual, open or permissive"), "{e}");
}

#[test]
fn hardware_reads_as_text() {
    let h = Hardware {
        vendor: Some("Dell Inc.".into()),
        model: Some("PowerEdge R650".into()),
        serial: Some("ABC123".into()),
    };
    assert_eq!(
        hardware_text(&h),
        "Dell Inc. PowerEdge R650 (serial ABC123)"
    );
    assert_eq!(hardware_text(&Hardware::default()), "");
}
