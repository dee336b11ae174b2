//! Unit tests of the advertiser's codec, checks and choices. The captured
//! packets in `src/testdata/` are the ICMPv6 messages (type byte first) that
//! tcpdump saw in a network namespace: `rs-linux.bin` the Linux 6.1 kernel's
//! solicitation on link up, `rs-rdisc6.bin` rdisc6's (ndisc6 1.0.5), and
//! `ra-dnsmasq.bin` dnsmasq 2.89's advertisement for
//! `dhcp-range=::,constructor:<if>,ra-only`, `ns-linux-dad.bin` a duplicate
//! address detection probe (not for us).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use super::wire::{
    DecodeError, FLAG_MANAGED, FLAG_OTHER, Message, NdOption, PrefixInformation,
    RouterAdvertisement, RouterSolicitation,
};
use super::*;

const RS_LINUX: &[u8] = include_bytes!("../testdata/rs-linux.bin");
const RS_RDISC6: &[u8] = include_bytes!("../testdata/rs-rdisc6.bin");
const RA_DNSMASQ: &[u8] = include_bytes!("../testdata/ra-dnsmasq.bin");
const NS_DAD: &[u8] = include_bytes!("../testdata/ns-linux-dad.bin");

const LINK_LOCAL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0xd44d, 0x98ff, 0xfe24, 0x3952);

/// The bytes with the checksum zeroed, as [`Message::encode`] leaves it.
fn unsummed(bytes: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[2] = 0;
    b[3] = 0;
    b
}

/// `decode(captured)` gives `expected`, and encoding it gives the captured
/// bytes back (less the checksum, which the kernel computes).
fn check_captured(captured: &[u8], expected: &Message) {
    let msg = Message::decode(captured).expect("captured packet decodes");
    assert_eq!(&msg, expected);
    assert_eq!(msg.encode(), unsummed(captured));
}

#[test]
fn linux_solicitation_decodes_and_reencodes() {
    check_captured(
        RS_LINUX,
        &Message::RouterSolicitation(RouterSolicitation {
            options: vec![NdOption::SourceLinkLayer(vec![
                0xd6, 0x4d, 0x98, 0x24, 0x39, 0x52,
            ])],
        }),
    );
    let rs = check_solicitation(RS_LINUX, LINK_LOCAL, Some(255)).expect("valid");
    assert_eq!(
        rs.source_link_layer(),
        Some(&[0xd6, 0x4d, 0x98, 0x24, 0x39, 0x52][..])
    );
}

#[test]
fn rdisc6_solicitation_decodes_and_reencodes() {
    check_captured(
        RS_RDISC6,
        &Message::RouterSolicitation(RouterSolicitation::default()),
    );
    let rs = check_solicitation(RS_RDISC6, LINK_LOCAL, Some(255)).expect("valid");
    assert_eq!(rs.source_link_layer(), None);
}

#[test]
fn dnsmasq_advertisement_decodes_and_reencodes() {
    check_captured(
        RA_DNSMASQ,
        &Message::RouterAdvertisement(RouterAdvertisement {
            cur_hop_limit: 64,
            flags: 0,
            router_lifetime: 1800,
            reachable_time: 0,
            retrans_timer: 0,
            options: vec![
                NdOption::Prefix(PrefixInformation {
                    prefix_len: 64,
                    flags: wire::PREFIX_ON_LINK | wire::PREFIX_AUTONOMOUS,
                    valid_lifetime: u32::MAX,
                    preferred_lifetime: u32::MAX,
                    prefix: "fd99:1::".parse().unwrap(),
                }),
                NdOption::Mtu(1500),
                NdOption::SourceLinkLayer(vec![0x16, 0xe0, 0x5a, 0x70, 0x15, 0x8d]),
            ],
        }),
    );
    // An advertisement is never answered.
    assert_eq!(
        check_solicitation(RA_DNSMASQ, LINK_LOCAL, Some(255)).unwrap_err(),
        Reason::NotSolicitation
    );
}

#[test]
fn other_icmpv6_is_dropped_before_decoding() {
    assert_eq!(Message::decode(NS_DAD), Err(DecodeError::UnknownType));
    for packet in [NS_DAD, &[][..], &[128, 0, 0, 0]] {
        assert_eq!(
            check_solicitation(packet, Ipv6Addr::UNSPECIFIED, Some(255)).unwrap_err(),
            Reason::NotSolicitation,
            "{packet:?}"
        );
    }
}

/// A case of [`solicitation_validity`]: name, packet, source, hop limit,
/// expected outcome.
type Case<'a> = (&'a str, &'a [u8], Ipv6Addr, Option<u8>, Result<(), Reason>);

/// RFC 4861 §6.1.1, case by case.
#[test]
fn solicitation_validity() {
    let slla = [133, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 0, 0, 0, 0, 1];
    let cases: &[Case] = &[
        ("plain", RS_RDISC6, LINK_LOCAL, Some(255), Ok(())),
        (
            "hop limit not reported",
            RS_RDISC6,
            LINK_LOCAL,
            None,
            Ok(()),
        ),
        (
            "from ::, no option",
            RS_RDISC6,
            Ipv6Addr::UNSPECIFIED,
            Some(255),
            Ok(()),
        ),
        ("with lladdr", &slla, LINK_LOCAL, Some(255), Ok(())),
        (
            "from ::, with lladdr",
            &slla,
            Ipv6Addr::UNSPECIFIED,
            Some(255),
            Err(Reason::UnspecifiedWithLinkLayer),
        ),
        (
            "routed",
            RS_RDISC6,
            LINK_LOCAL,
            Some(254),
            Err(Reason::HopLimit),
        ),
        (
            "hop limit 1",
            RS_LINUX,
            LINK_LOCAL,
            Some(1),
            Err(Reason::HopLimit),
        ),
        (
            "code 1",
            &[133, 1, 0, 0, 0, 0, 0, 0],
            LINK_LOCAL,
            Some(255),
            Err(Reason::Malformed(DecodeError::BadCode)),
        ),
        (
            "7 bytes",
            &[133, 0, 0, 0, 0, 0, 0],
            LINK_LOCAL,
            Some(255),
            Err(Reason::Malformed(DecodeError::Truncated)),
        ),
        (
            "zero-length option",
            &[133, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
            LINK_LOCAL,
            Some(255),
            Err(Reason::Malformed(DecodeError::ZeroLengthOption)),
        ),
        (
            "option past the end",
            &[133, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0],
            LINK_LOCAL,
            Some(255),
            Err(Reason::Malformed(DecodeError::OptionOverrun)),
        ),
        (
            "one stray byte",
            &[133, 0, 0, 0, 0, 0, 0, 0, 1],
            LINK_LOCAL,
            Some(255),
            Err(Reason::Malformed(DecodeError::OptionOverrun)),
        ),
    ];
    for (name, packet, src, hop_limit, expected) in cases {
        let got = check_solicitation(packet, *src, *hop_limit).map(drop);
        assert_eq!(&got, expected, "{name}");
        if let Err(reason) = got {
            assert!(reason.is_malformed(), "{name}: an invalid solicitation");
        }
    }
}

#[test]
fn unknown_and_odd_options_round_trip() {
    let msg = Message::RouterAdvertisement(RouterAdvertisement {
        cur_hop_limit: 1,
        flags: FLAG_MANAGED | FLAG_OTHER | 0x08,
        router_lifetime: 9000,
        reachable_time: 30_000,
        retrans_timer: 1000,
        options: vec![
            NdOption::Other {
                kind: 25,
                data: vec![7; 22],
            },
            // A prefix option of the wrong length is kept as it came.
            NdOption::Other {
                kind: 3,
                data: vec![1; 6],
            },
            NdOption::SourceLinkLayer(vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]),
            NdOption::Mtu(9000),
        ],
    });
    let bytes = msg.encode();
    assert_eq!(bytes.len(), 16 + 24 + 8 + 16 + 8);
    assert_eq!(Message::decode(&bytes), Ok(msg));
}

#[test]
fn encode_pads_options_to_whole_units() {
    let msg = Message::RouterSolicitation(RouterSolicitation {
        options: vec![NdOption::SourceLinkLayer(vec![0xaa; 3])],
    });
    assert_eq!(
        msg.encode(),
        [133, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0xaa, 0xaa, 0xaa, 0, 0, 0]
    );
}

fn iface(ipv6: &[(&str, u8)]) -> Interface {
    Interface {
        name: "prov0".into(),
        index: 7,
        mac: Some([0x02, 0, 0x5e, 0x10, 0, 1]),
        up: true,
        loopback: false,
        multicast: true,
        ipv4: vec![(Ipv4Addr::new(10, 77, 0, 1), 24)],
        ipv6: ipv6.iter().map(|(a, l)| (a.parse().unwrap(), *l)).collect(),
    }
}

#[test]
fn our_advertisement_is_never_a_default_router() {
    let i = iface(&[
        ("fe80::1", 64),
        ("fd00:77::1", 64),
        ("fd00:77::2", 64),
        ("2001:db8:1::1", 64),
        ("2001:db8:2::1", 48),
        ("fd00:99::1", 128),
    ]);
    let config = RaConfig::default();
    let ra = advertisement(&i, &config);
    assert_eq!(ra.router_lifetime, 0);
    assert_eq!(ra.flags & (FLAG_MANAGED | FLAG_OTHER), 0);
    let prefix = |p: &str| {
        NdOption::Prefix(PrefixInformation {
            prefix_len: 64,
            flags: wire::PREFIX_ON_LINK | wire::PREFIX_AUTONOMOUS,
            valid_lifetime: VALID_LIFETIME,
            preferred_lifetime: PREFERRED_LIFETIME,
            prefix: p.parse().unwrap(),
        })
    };
    assert_eq!(
        ra.options,
        vec![
            NdOption::SourceLinkLayer(vec![0x02, 0, 0x5e, 0x10, 0, 1]),
            prefix("2001:db8:1::"),
            prefix("fd00:77::"),
        ]
    );
    // The exact bytes: header, SLLA, then the first prefix option.
    let bytes = Message::RouterAdvertisement(ra).encode();
    assert_eq!(
        bytes[..24],
        [
            134, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0x02, 0, 0x5e, 0x10, 0, 1
        ]
    );
    assert_eq!(bytes[24..32], [3, 4, 64, 0xc0, 0, 0, 0x0e, 0x10]);
    assert_eq!(bytes.len(), 16 + 8 + 2 * 32);
}

#[test]
fn no_prefix_without_a_global_address() {
    let ra = advertisement(&iface(&[("fe80::1", 64)]), &RaConfig::default());
    assert_eq!(
        ra.options,
        vec![NdOption::SourceLinkLayer(vec![0x02, 0, 0x5e, 0x10, 0, 1])]
    );
    let mut no_mac = iface(&[]);
    no_mac.mac = None;
    assert!(
        advertisement(&no_mac, &RaConfig::default())
            .options
            .is_empty()
    );
}

#[test]
fn link_local_is_found() {
    assert_eq!(
        iface(&[("fd00::1", 64), ("fe80::1", 64)]).link_local(),
        Some("fe80::1".parse().unwrap())
    );
    assert_eq!(iface(&[("fd00::1", 64)]).link_local(), None);
}

#[test]
fn provisioning_interfaces_are_those_on_a_boot_network() {
    let prov = iface(&[]);
    let mut site = iface(&[]);
    site.name = "site0".into();
    site.ipv4 = vec![(Ipv4Addr::new(192, 168, 1, 5), 24)];
    let mut down = iface(&[]);
    down.name = "down0".into();
    down.up = false;
    let mut lo = iface(&[]);
    lo.name = "lo".into();
    lo.loopback = true;
    let mut tun = iface(&[]);
    tun.name = "tun0".into();
    tun.multicast = false;
    let all = [prov, site, down, lo, tun];
    let names = |nets: &[(Ipv4Addr, u8)]| -> Vec<String> {
        provisioning_interfaces(&all, nets)
            .into_iter()
            .map(|i| i.name)
            .collect()
    };
    assert_eq!(names(&[(Ipv4Addr::new(10, 77, 0, 0), 24)]), ["prov0"]);
    assert_eq!(names(&[(Ipv4Addr::new(10, 0, 0, 0), 8)]), ["prov0"]);
    assert_eq!(
        names(&[
            (Ipv4Addr::new(10, 77, 0, 0), 24),
            (Ipv4Addr::new(192, 168, 1, 0), 24)
        ]),
        ["prov0", "site0"]
    );
    assert!(names(&[(Ipv4Addr::new(10, 78, 0, 0), 24)]).is_empty());
    assert!(names(&[]).is_empty());
}

#[test]
fn prefix_len_of_masks() {
    assert_eq!(prefix_len(&[255, 255, 255, 0]), 24);
    assert_eq!(prefix_len(&[255, 255, 240, 0]), 20);
    assert_eq!(prefix_len(&[0; 4]), 0);
    assert_eq!(prefix_len(&[255; 16]), 128);
    let mut m = [0u8; 16];
    m[..8].fill(255);
    assert_eq!(prefix_len(&m), 64);
}

#[test]
fn jitter_stays_within_a_quarter() {
    let mean = Duration::from_secs(10);
    for _ in 0..200 {
        let j = jitter(mean);
        assert!(j >= Duration::from_millis(7500) && j <= Duration::from_millis(12_500));
    }
}

#[test]
fn drops_are_counted_and_malformed_apart() {
    let m = RaMetrics::default();
    m.dropped(Reason::NotSolicitation);
    m.dropped(Reason::HopLimit);
    m.dropped(Reason::Malformed(DecodeError::BadCode));
    assert_eq!(m.malformed.get(), 2);
    let count = |reason| m.drops.get_or_create(&DropLabels { reason }).get();
    assert_eq!(count("not_solicitation"), 1);
    assert_eq!(count("hop_limit"), 1);
    assert_eq!(count("malformed"), 1);
}

/// Replays the fuzz corpus (seeds and what the fuzzer kept) on stable.
#[test]
fn fuzz_corpus_replays() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fuzz/corpus/ndp_packet");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the ndp_packet corpus") {
        fuzz_packet(&std::fs::read(entry.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n >= 4, "corpus has only {n} files");
}

#[test]
fn fuzz_entry_survives_truncations_and_bit_flips() {
    for base in [RS_LINUX, RS_RDISC6, RA_DNSMASQ, NS_DAD] {
        for i in 0..base.len() {
            fuzz_packet(&base[..i]);
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = base.to_vec();
                b[i] ^= flip;
                fuzz_packet(&b);
            }
        }
    }
}
