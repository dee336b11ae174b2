//! Frames lldpd sent (captured, in `testdata/`), a matrix of chassis and
//! port ID subtypes, and the errors of broken frames.

use crate::*;

fn testdata(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// What a captured frame says, as the agent reads it.
struct Expected {
    file: &'static str,
    chassis: (&'static str, &'static str),
    port: (&'static str, &'static str),
    system_name: &'static str,
    system_description: &'static str,
    port_description: &'static str,
    management: &'static [&'static str],
    vlan: Option<u16>,
    vlan_names: &'static [(u16, &'static str)],
    max_frame_size: Option<u16>,
}

const SWITCH_MAC: &str = "52:54:00:aa:00:01";
const LLDPD_MANAGEMENT: &[&str] = &["192.0.2.1", "fe80::5054:ff:feaa:1"];

const CAPTURED: &[Expected] = &[
    Expected {
        file: "portid-mac.bin",
        chassis: ("mac-address", SWITCH_MAC),
        port: ("mac-address", SWITCH_MAC),
        system_name: "leaf01",
        system_description: "mProv-lab-switch",
        port_description: "swp7",
        management: LLDPD_MANAGEMENT,
        vlan: None,
        vlan_names: &[],
        max_frame_size: None,
    },
    Expected {
        file: "portid-ifname-vlan.bin",
        chassis: ("mac-address", SWITCH_MAC),
        port: ("interface-name", "swp7"),
        system_name: "cumulus-leaf",
        system_description: "mProv-lab-switch",
        port_description: "swp7",
        management: LLDPD_MANAGEMENT,
        vlan: Some(100),
        vlan_names: &[(100, "compute")],
        max_frame_size: Some(9216),
    },
    Expected {
        file: "portid-ifname-default.bin",
        chassis: ("mac-address", SWITCH_MAC),
        port: ("interface-name", "swp7"),
        system_name: "sonic",
        system_description: "mProv-lab-switch",
        port_description: "Ethernet28",
        management: LLDPD_MANAGEMENT,
        vlan: None,
        vlan_names: &[],
        max_frame_size: None,
    },
    Expected {
        file: "portid-local-arista.bin",
        chassis: ("mac-address", SWITCH_MAC),
        port: ("local", "Ethernet1/7"),
        system_name: "arista-leaf",
        system_description: "Arista-EOS",
        port_description: "node-n07",
        management: LLDPD_MANAGEMENT,
        vlan: Some(200),
        vlan_names: &[],
        max_frame_size: None,
    },
    Expected {
        file: "portid-local-junos.bin",
        chassis: ("local", "ex4300-chassis-1"),
        port: ("local", "ge-0/0/7"),
        system_name: "ex4300",
        system_description: "Junos",
        port_description: "n07-eth0",
        management: &["198.51.100.7"],
        vlan: None,
        vlan_names: &[],
        max_frame_size: None,
    },
    Expected {
        file: "portid-local-cisco-med.bin",
        chassis: ("mac-address", SWITCH_MAC),
        port: ("local", "Gi1/0/7"),
        system_name: "c9300",
        system_description: "IOS",
        port_description: "GigabitEthernet1/0/7",
        management: LLDPD_MANAGEMENT,
        vlan: None,
        vlan_names: &[],
        max_frame_size: None,
    },
];

#[test]
fn captured_frames_parse_to_what_lldpd_was_told() {
    for want in CAPTURED {
        let bytes = testdata(want.file);
        let frame = Frame::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", want.file));
        assert_eq!(frame.destination, NEAREST_BRIDGE, "{}", want.file);
        assert_eq!(mac_text(&frame.source), SWITCH_MAC, "{}", want.file);
        let l = &frame.lldpdu;
        let got_chassis = (l.chassis_id.subtype.name(), l.chassis_id.text());
        assert_eq!(
            (got_chassis.0.as_str(), got_chassis.1.as_str()),
            want.chassis,
            "{}",
            want.file
        );
        let got_port = (l.port_id.subtype.name(), l.port_id.text());
        assert_eq!(
            (got_port.0.as_str(), got_port.1.as_str()),
            want.port,
            "{}",
            want.file
        );
        assert_eq!(l.system_name().as_deref(), Some(want.system_name));
        assert_eq!(
            l.system_description().as_deref(),
            Some(want.system_description)
        );
        assert_eq!(l.port_description().as_deref(), Some(want.port_description));
        let management: Vec<String> = l.management_addresses().iter().map(|m| m.text()).collect();
        assert_eq!(management, want.management, "{}", want.file);
        assert_eq!(l.port_vlan(), want.vlan, "{}", want.file);
        let names: Vec<(u16, String)> = want
            .vlan_names
            .iter()
            .map(|(v, n)| (*v, n.to_string()))
            .collect();
        assert_eq!(l.vlan_names(), names, "{}", want.file);
        assert_eq!(l.max_frame_size(), want.max_frame_size, "{}", want.file);
        // lldpd sends its TTL as 4 × the 1 s interval, capabilities, and
        // the 802.3 MAC/PHY and link aggregation TLVs on every port.
        assert_eq!(l.ttl, 4, "{}", want.file);
        assert!(l.capabilities().is_some(), "{}", want.file);
        assert!(l.tlvs.iter().any(|t| matches!(t, Tlv::MacPhy(_))));
        assert!(l.tlvs.iter().any(|t| matches!(
            t,
            Tlv::LinkAggregation(LinkAggregation {
                oui: AggregationOui::Ieee8023,
                ..
            })
        )));
    }
}

#[test]
fn captured_frames_encode_to_the_same_bytes() {
    for want in CAPTURED {
        let bytes = testdata(want.file);
        let frame = Frame::parse(&bytes).expect("parses");
        assert_eq!(frame.encode().expect("encodes"), bytes, "{}", want.file);
    }
}

#[test]
fn lldp_med_tlvs_are_kept_raw() {
    let frame = Frame::parse(&testdata("portid-local-cisco-med.bin")).expect("parses");
    let med: Vec<u8> = frame
        .lldpdu
        .tlvs
        .iter()
        .filter_map(|t| match t {
            Tlv::Org {
                oui: [0x00, 0x12, 0xbb],
                subtype,
                ..
            } => Some(*subtype),
            _ => None,
        })
        .collect();
    // The MED capabilities (1) and at least one inventory TLV (5-11).
    assert!(med.contains(&1), "{med:?}");
    assert!(med.iter().any(|s| (5..=11).contains(s)), "{med:?}");
    // Its port ID and description are two spellings of one port.
    let l = &frame.lldpdu;
    assert_eq!(
        normalise_port(&l.port_id.text()),
        normalise_port(&l.port_description().expect("sent"))
    );
}

fn lldpdu(chassis: ChassisId, port: PortId, tlvs: Vec<Tlv>) -> Lldpdu {
    Lldpdu {
        chassis_id: chassis,
        port_id: port,
        ttl: 120,
        tlvs,
    }
}

fn round_trip(l: &Lldpdu) -> Lldpdu {
    let bytes = l.encode().expect("encodes");
    let again = Lldpdu::parse(&bytes).expect("parses");
    assert_eq!(&again, l);
    again
}

#[test]
fn every_port_id_subtype_round_trips_and_reads() {
    let chassis = ChassisId {
        subtype: ChassisSubtype::MacAddress,
        id: vec![0x52, 0x54, 0, 0xaa, 0, 1],
    };
    let cases: &[(u8, &[u8], &str, &str)] = &[
        (0, b"x", "reserved-0", "x"),
        (1, b"uplink to n07", "interface-alias", "uplink to n07"),
        (2, b"Gi1/0/7", "port-component", "Gi1/0/7"),
        (
            3,
            &[0x52, 0x54, 0, 0xbb, 0, 7],
            "mac-address",
            "52:54:00:bb:00:07",
        ),
        (4, &[1, 192, 0, 2, 7], "network-address", "192.0.2.7"),
        (
            4,
            &[2, 0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7],
            "network-address",
            "2001:db8::7",
        ),
        (5, b"swp7", "interface-name", "swp7"),
        (6, b"circuit-7", "agent-circuit-id", "circuit-7"),
        (7, b"Ethernet1/7", "local", "Ethernet1/7"),
        (7, b"ge-0/0/7\0", "local", "ge-0/0/7"),
        (8, b"\xff\xfe", "reserved-8", "\u{fffd}\u{fffd}"),
        (255, &[0xaa; 255], "reserved-255", ""),
    ];
    for (subtype, id, name, text) in cases {
        let l = lldpdu(
            chassis.clone(),
            PortId {
                subtype: PortSubtype::from_number(*subtype),
                id: id.to_vec(),
            },
            vec![],
        );
        let again = round_trip(&l);
        assert_eq!(again.port_id.subtype.number(), *subtype);
        assert_eq!(again.port_id.subtype.name(), *name);
        if *subtype != 255 {
            assert_eq!(again.port_id.text(), *text, "subtype {subtype}");
        }
    }
}

#[test]
fn every_chassis_id_subtype_round_trips_and_reads() {
    let port = PortId {
        subtype: PortSubtype::InterfaceName,
        id: b"swp1".to_vec(),
    };
    let cases: &[(u8, &[u8], &str, &str)] = &[
        (1, b"chassis-1", "chassis-component", "chassis-1"),
        (2, b"leaf01", "interface-alias", "leaf01"),
        (3, b"backplane", "port-component", "backplane"),
        (
            4,
            &[0, 0x11, 0x22, 0x33, 0x44, 0x55],
            "mac-address",
            "00:11:22:33:44:55",
        ),
        (5, &[1, 10, 0, 0, 1], "network-address", "10.0.0.1"),
        (5, &[9, 1, 2], "network-address", "family-9:01:02"),
        (6, b"eth0", "interface-name", "eth0"),
        (7, b"ex4300-chassis-1", "local", "ex4300-chassis-1"),
        (9, b"?", "reserved-9", "?"),
    ];
    for (subtype, id, name, text) in cases {
        let l = lldpdu(
            ChassisId {
                subtype: ChassisSubtype::from_number(*subtype),
                id: id.to_vec(),
            },
            port.clone(),
            vec![],
        );
        let again = round_trip(&l);
        assert_eq!(again.chassis_id.subtype.name(), *name);
        assert_eq!(again.chassis_id.text(), *text);
    }
}

#[test]
fn every_optional_tlv_round_trips() {
    let l = lldpdu(
        ChassisId {
            subtype: ChassisSubtype::Local,
            id: b"sw".to_vec(),
        },
        PortId {
            subtype: PortSubtype::Local,
            id: b"1".to_vec(),
        },
        vec![
            Tlv::PortDescription(vec![]),
            Tlv::SystemName(b"leaf01".to_vec()),
            Tlv::SystemDescription(vec![b'd'; 255]),
            Tlv::Capabilities(Capabilities {
                available: 0x14,
                enabled: 0x04,
            }),
            Tlv::ManagementAddress(ManagementAddress {
                family: 1,
                address: vec![192, 0, 2, 1],
                interface_subtype: 2,
                interface: 7,
                oid: vec![0x2b, 6, 1],
            }),
            Tlv::ManagementAddress(ManagementAddress {
                family: 6,
                address: vec![0x52, 0x54, 0, 0xaa, 0, 1],
                interface_subtype: 1,
                interface: 0,
                oid: vec![],
            }),
            Tlv::PortVlanId(100),
            Tlv::PortProtocolVlanId {
                flags: 6,
                vlan: 200,
            },
            Tlv::VlanName {
                vlan: 100,
                name: b"compute".to_vec(),
            },
            Tlv::LinkAggregation(LinkAggregation {
                oui: AggregationOui::Ieee8021,
                status: 3,
                port: 12,
            }),
            Tlv::LinkAggregation(LinkAggregation {
                oui: AggregationOui::Ieee8023,
                status: 1,
                port: 0,
            }),
            Tlv::MacPhy(MacPhy {
                autoneg: 3,
                advertised: 0x6c01,
                mau_type: 30,
            }),
            Tlv::MaxFrameSize(9216),
            Tlv::Org {
                oui: [0x00, 0x12, 0xbb],
                subtype: 1,
                info: vec![0, 0x33, 4],
            },
            Tlv::Other {
                kind: 9,
                value: vec![1, 2, 3],
            },
        ],
    );
    let again = round_trip(&l);
    assert_eq!(again.port_vlan(), Some(100));
    assert_eq!(
        again
            .management_addresses()
            .iter()
            .map(|m| m.text())
            .collect::<Vec<_>>(),
        ["192.0.2.1", "52:54:00:aa:00:01"]
    );
    assert_eq!(
        Capabilities::names(again.capabilities().expect("sent").available),
        ["bridge", "router"]
    );
}

/// An LLDPDU of the three mandatory TLVs, then `rest`.
fn with(rest: &[u8]) -> Vec<u8> {
    let mut b = vec![0x02, 0x07, 0x04, 0x52, 0x54, 0, 0xaa, 0, 1]; // chassis: MAC
    b.extend_from_slice(&[0x04, 0x05, 0x05, b's', b'w', b'p', b'7']); // port: ifname
    b.extend_from_slice(&[0x06, 0x02, 0x00, 0x78]); // TTL 120
    b.extend_from_slice(rest);
    b
}

#[test]
fn broken_frames_are_refused_naming_the_tlv_and_offset() {
    let cases: Vec<(Vec<u8>, ParseError)> = vec![
        (
            vec![],
            ParseError::Missing {
                expected: TlvKind::CHASSIS_ID,
                found: TlvKind::END,
                offset: 0,
            },
        ),
        (
            vec![0x02],
            ParseError::Truncated {
                what: "TLV header",
                offset: 0,
            },
        ),
        (
            vec![0x02, 0x07, 0x04],
            ParseError::Overrun {
                tlv: TlvKind::CHASSIS_ID,
                offset: 0,
                length: 7,
                available: 1,
            },
        ),
        (
            vec![0x02, 0x01, 0x04],
            ParseError::Length {
                tlv: TlvKind::CHASSIS_ID,
                offset: 0,
                length: 1,
                allowed: "2 to 256",
            },
        ),
        (
            vec![0x04, 0x02, 0x05, b'x'],
            ParseError::Missing {
                expected: TlvKind::CHASSIS_ID,
                found: TlvKind::PORT_ID,
                offset: 0,
            },
        ),
        (
            with(&[0x02, 0x02, 0x04, 0x01]),
            ParseError::Duplicate {
                tlv: TlvKind::CHASSIS_ID,
                offset: 20,
            },
        ),
        (
            with(&[0x06, 0x02, 0x00, 0x01]),
            ParseError::Duplicate {
                tlv: TlvKind::TTL,
                offset: 20,
            },
        ),
        (
            with(&[0x00, 0x01, 0x00]),
            ParseError::EndLength {
                offset: 20,
                length: 1,
            },
        ),
        (
            with(&[0x0a, 0x05, b'l', b'e']),
            ParseError::Overrun {
                tlv: TlvKind::SYSTEM_NAME,
                offset: 20,
                length: 5,
                available: 2,
            },
        ),
        (
            {
                let mut b = with(&[]);
                b[17] = 0x03; // a TTL of 3 bytes
                b.push(0);
                b
            },
            ParseError::Length {
                tlv: TlvKind::TTL,
                offset: 16,
                length: 3,
                allowed: "2",
            },
        ),
    ];
    for (bytes, want) in cases {
        assert_eq!(Lldpdu::parse(&bytes), Err(want.clone()), "{bytes:02x?}");
        assert!(!want.to_string().is_empty());
    }
    // In a frame the offsets count from the Ethernet header.
    let mut frame = testdata("portid-mac.bin");
    frame.truncate(30);
    let err = Frame::parse(&frame).expect_err("cut short");
    assert!(
        matches!(err, ParseError::Overrun { offset: 14.., .. }),
        "{err}"
    );
    assert!(err.to_string().contains("offset"), "{err}");
    assert_eq!(
        Frame::parse(&[0u8; 13]),
        Err(ParseError::Truncated {
            what: "Ethernet header",
            offset: 0
        })
    );
    let mut ipv4 = testdata("portid-mac.bin");
    ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
    assert_eq!(
        Frame::parse(&ipv4),
        Err(ParseError::NotLldp { ethertype: 0x0800 })
    );
}

#[test]
fn an_optional_tlv_that_does_not_fit_is_kept_raw() {
    let bytes = with(&[
        0x0e, 0x03, 0, 4, 0, // capabilities of 3 bytes
        0xfe, 0x07, 0x00, 0x80, 0xc2, 0x03, 0, 100, 9, // VLAN name whose length lies
        0xfe, 0x05, 0x00, 0x80, 0xc2, 0x01, 0x64, // PVID of 1 byte
        0x10, 0x03, 0x09, 0x01, 0x0a, // management address cut short
        0xfe, 0x06, 0x00, 0x80, 0xc2, 0x01, 0x00, 0x0a, // a good PVID
        0, 0,
    ]);
    let l = Lldpdu::parse(&bytes).expect("the rest is kept");
    assert_eq!(l.tlvs.len(), 5);
    assert!(matches!(l.tlvs[0], Tlv::Other { kind: 7, .. }));
    assert!(matches!(l.tlvs[1], Tlv::Org { subtype: 3, .. }));
    assert!(matches!(l.tlvs[2], Tlv::Org { subtype: 1, .. }));
    assert!(matches!(l.tlvs[3], Tlv::Other { kind: 8, .. }));
    assert_eq!(l.port_vlan(), Some(10));
    assert!(l.capabilities().is_none());
    assert_eq!(l.encode().expect("encodes"), bytes);
}

#[test]
fn what_follows_end_is_padding_and_end_may_be_missing() {
    let mut padded = with(&[0x0a, 0x01, b'n', 0, 0]);
    padded.extend_from_slice(&[0xff; 10]);
    let l = Lldpdu::parse(&padded).expect("parses");
    assert_eq!(l.system_name().as_deref(), Some("n"));
    let bare = with(&[0x0a, 0x01, b'n']);
    assert_eq!(Lldpdu::parse(&bare), Ok(l));
}

#[test]
fn a_tagged_frame_keeps_its_tag() {
    let mut bytes = testdata("portid-mac.bin");
    bytes.splice(12..12, [0x81, 0x00, 0x20, 0x64]);
    let frame = Frame::parse(&bytes).expect("parses");
    assert_eq!(frame.tci, Some(0x2064));
    assert_eq!(frame.encode().expect("encodes"), bytes);
}

#[test]
fn values_no_tlv_holds_are_refused_by_the_encoder() {
    let base = lldpdu(
        ChassisId {
            subtype: ChassisSubtype::Local,
            id: b"sw".to_vec(),
        },
        PortId {
            subtype: PortSubtype::Local,
            id: b"1".to_vec(),
        },
        vec![],
    );
    let refused = |tlvs: Vec<Tlv>| {
        let mut l = base.clone();
        l.tlvs = tlvs;
        l.encode().expect_err("refused")
    };
    assert!(matches!(
        refused(vec![Tlv::SystemName(vec![b'x'; 256])]),
        EncodeError::TooLong { max: 255, .. }
    ));
    assert_eq!(
        refused(vec![Tlv::Other {
            kind: 1,
            value: vec![]
        }]),
        EncodeError::RawKind(1)
    );
    assert!(matches!(
        refused(vec![Tlv::VlanName {
            vlan: 1,
            name: vec![b'v'; 33]
        }]),
        EncodeError::TooLong { max: 32, .. }
    ));
    let mut empty = base.clone();
    empty.port_id.id.clear();
    assert_eq!(empty.encode(), Err(EncodeError::EmptyId(TlvKind::PORT_ID)));
}
