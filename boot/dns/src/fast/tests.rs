//! Tests of the fast path, mostly against hickory's catalog on the same
//! zone (`crate::sample::snapshot`), starting from queries `dig` 9.18 sent
//! (captured with a UDP/TCP listener on loopback, kept in `src/testdata/`).

use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::{Message, ResponseCode};
use hickory_server::proto::rr::RecordType;
use mprov_api::boot::BootConfig;

use super::*;
use crate::fuzz::{assert_same_meaning, checked};
use crate::sample::{host, snapshot};
use crate::server::{Responses, Shared};

/// The captured queries: file, whether TCP (length-prefixed as captured).
const CAPTURED: [(&str, &[u8], bool); 7] = [
    (
        "a-edns-cookie",
        include_bytes!("../testdata/a-edns-cookie.bin"),
        false,
    ),
    (
        "a-noedns",
        include_bytes!("../testdata/a-noedns.bin"),
        false,
    ),
    ("a-tcp", include_bytes!("../testdata/a-tcp.bin"), true),
    (
        "aaaa-mixed-case",
        include_bytes!("../testdata/aaaa-mixed-case.bin"),
        false,
    ),
    ("any-tcp", include_bytes!("../testdata/any-tcp.bin"), true),
    ("ptr-v4", include_bytes!("../testdata/ptr-v4.bin"), false),
    (
        "ptr-v6-dnssec",
        include_bytes!("../testdata/ptr-v6-dnssec.bin"),
        false,
    ),
];

/// The DNS message of a captured query, without the TCP length prefix.
fn message_bytes(raw: &'static [u8], tcp: bool) -> (&'static [u8], Protocol) {
    if !tcp {
        return (raw, Protocol::Udp);
    }
    let len = usize::from(u16::from_be_bytes([raw[0], raw[1]]));
    assert_eq!(len, raw.len() - 2, "TCP length prefix");
    (&raw[2..], Protocol::Tcp)
}

fn responses(shared: &Shared, request: &[u8], protocol: Protocol) -> Responses {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(shared.responses(request, protocol))
}

/// Answer records as `name TYPE rdata` lines.
fn answers(message: &Message) -> Vec<String> {
    message
        .answers
        .iter()
        .map(|r| format!("{} {} {}", r.name, r.record_type(), r.data))
        .collect()
}

/// A query for `name` (dotted, without the final dot) and `qtype`, ID
/// 0x1234, RD set; `opt` is an OPT record's payload size, flags and options.
fn query(name: &str, qtype: RecordType, opt: Option<(u16, u16, &[u8])>) -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    q[11] = u8::from(opt.is_some());
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&u16::from(qtype).to_be_bytes());
    q.extend_from_slice(&[0, 1]);
    if let Some((payload, flags, options)) = opt {
        q.extend_from_slice(&[0, 0, 41]);
        q.extend_from_slice(&payload.to_be_bytes());
        q.extend_from_slice(&[0, 0]);
        q.extend_from_slice(&flags.to_be_bytes());
        q.extend_from_slice(&(options.len() as u16).to_be_bytes());
        q.extend_from_slice(options);
    }
    q
}

/// Captured query → hickory's codec → bytes → codec again: the same
/// message, so the captures are what we think they are.
#[test]
fn captured_queries_round_trip() {
    for (name, raw, tcp) in CAPTURED {
        let (bytes, _) = message_bytes(raw, tcp);
        let parsed = Message::from_vec(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let again = Message::from_vec(&parsed.to_vec().unwrap()).unwrap();
        assert_eq!(parsed.metadata, again.metadata, "{name}");
        assert_eq!(parsed.queries, again.queries, "{name}");
        assert_eq!(parsed.edns, again.edns, "{name}");
        assert_eq!(parsed.queries.len(), 1, "{name}");
    }
}

/// Each captured query answered by both paths; where the fast path takes
/// it, the catalog means the same. Table: file, fast path taken, rcode,
/// answers, DO bit in the response (never set: see the module comment of
/// `fast`).
#[test]
fn captured_queries_answered() {
    let shared = Shared::fixture(&snapshot());
    let check = |file: &str, fast: bool, rcode: ResponseCode, want: &[&str], dnssec_ok: bool| {
        let (_, raw, tcp) = CAPTURED.iter().find(|c| c.0 == file).unwrap();
        let (request, protocol) = message_bytes(raw, *tcp);
        let got = responses(&shared, request, protocol);
        assert_eq!(got.fast.is_some(), fast, "{file}: fast path taken");
        let general = checked(request, &got.general.unwrap(), protocol);
        if let Some(bytes) = &got.fast {
            let fast = checked(request, bytes, protocol);
            assert_same_meaning(&fast, &general);
            assert!(fast.metadata.authoritative, "{file}");
            assert!(!fast.metadata.authentic_data, "{file}: dig sets AD");
            assert!(fast.metadata.recursion_desired, "{file}");
        }
        assert_eq!(general.metadata.response_code, rcode, "{file}");
        if want.first() != Some(&"*") {
            assert_eq!(answers(&general), want, "{file}");
        }
        let edns = Message::from_vec(request).unwrap().edns;
        assert_eq!(general.edns.is_some(), edns.is_some(), "{file}: OPT echo");
        if let (Some(req), Some(resp)) = (edns, &general.edns) {
            assert_eq!(resp.max_payload(), req.max_payload().max(512), "{file}");
            assert_eq!(resp.flags().dnssec_ok, dnssec_ok, "{file}");
        }
    };
    let noerror = ResponseCode::NoError;
    check(
        "a-edns-cookie",
        true,
        noerror,
        &["c01.cluster.test. A 10.0.0.21"],
        false,
    );
    check(
        "a-noedns",
        true,
        noerror,
        &["c01.cluster.test. A 10.0.0.21"],
        false,
    );
    check(
        "a-tcp",
        true,
        noerror,
        &["c03.cluster.test. A 10.0.0.23"],
        false,
    );
    check(
        "ptr-v4",
        true,
        noerror,
        &["23.0.0.10.in-addr.arpa. PTR c03.cluster.test."],
        false,
    );
    check(
        "ptr-v6-dnssec",
        true,
        noerror,
        &[
            "1.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa. PTR c01.cluster.test.",
        ],
        false,
    );
    // c02 has no AAAA: NODATA, left to the catalog (SOA in authority).
    check("aaaa-mixed-case", false, noerror, &[], false);
    // ANY at the apex: the catalog's business.
    check("any-tcp", false, noerror, &["*"], false);
}

#[test]
fn nodata_and_nxdomain_carry_the_soa() {
    let shared = Shared::fixture(&snapshot());
    for (name, rcode) in [
        ("c02.cluster.test", ResponseCode::NoError),
        ("nope.cluster.test", ResponseCode::NXDomain),
    ] {
        let request = query(name, RecordType::AAAA, None);
        let got = responses(&shared, &request, Protocol::Udp);
        assert!(got.fast.is_none(), "{name}");
        let general = checked(&request, &got.general.unwrap(), Protocol::Udp);
        assert_eq!(general.metadata.response_code, rcode, "{name}");
        assert!(general.answers.is_empty(), "{name}");
        assert!(
            general
                .authorities
                .iter()
                .any(|r| r.record_type() == RecordType::SOA),
            "{name}"
        );
    }
    // With no upstream, outside names are refused.
    let request = query("example.org", RecordType::A, None);
    let got = responses(&shared, &request, Protocol::Udp);
    assert!(got.fast.is_none());
    let general = checked(&request, &got.general.unwrap(), Protocol::Udp);
    assert_eq!(general.metadata.response_code, ResponseCode::Refused);
}

/// Names are matched case-insensitively (RFC 4343) and the answer keeps
/// the client's spelling of the owner name.
#[test]
fn any_case_matches() {
    let shared = Shared::fixture(&snapshot());
    for name in ["C01.CLUSTER.TEST", "c01.Cluster.test", "c01.cluster.test"] {
        let request = query(name, RecordType::A, Some((4096, 0, &[])));
        let got = responses(&shared, &request, Protocol::Udp);
        let fast = checked(&request, &got.fast.unwrap(), Protocol::Udp);
        assert_same_meaning(
            &fast,
            &checked(&request, &got.general.unwrap(), Protocol::Udp),
        );
        assert_eq!(fast.answers[0].name.to_string(), format!("{name}."));
    }
}

/// Requests the fast path must leave to the catalog, each a small change
/// from one it answers.
#[test]
fn unusual_requests_take_the_general_path() {
    let shared = Shared::fixture(&snapshot());
    let base = query("c01.cluster.test", RecordType::A, None);
    // An empty table answers nothing.
    assert!(!FastAnswers::default().answer(&base, Protocol::Udp, &mut Vec::new()));
    let taken = |request: &[u8]| responses(&shared, request, Protocol::Udp).fast.is_some();
    assert!(taken(&base));
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut q = base.clone();
        f(&mut q);
        q
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("response", edit(&|q| q[2] |= 0x80)),
        ("opcode NOTIFY", edit(&|q| q[2] |= 4 << 3)),
        ("two questions", edit(&|q| q[5] = 2)),
        ("an answer record", edit(&|q| q[7] = 1)),
        ("an authority record", edit(&|q| q[9] = 1)),
        ("class CH", edit(&|q| *q.last_mut().unwrap() = 3)),
        ("trailing byte", edit(&|q| q.push(0))),
        ("truncated", edit(&|q| q.truncate(q.len() - 1))),
        (
            "compression pointer",
            edit(&|q| {
                q.truncate(12);
                q.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
            }),
        ),
        ("type MX", query("c01.cluster.test", RecordType::MX, None)),
        ("alias", query("login.cluster.test", RecordType::A, None)),
        (
            "EDNS version 1",
            edit(&|q| {
                q[11] = 1;
                q.extend_from_slice(&[0, 0, 41, 4, 0, 0, 1, 0, 0, 0, 0]);
            }),
        ),
        (
            "OPT not at the root",
            edit(&|q| {
                q[11] = 1;
                q.extend_from_slice(&[1, b'x', 0, 0, 41, 4, 0, 0, 0, 0, 0, 0, 0]);
            }),
        ),
        (
            "client subnet option",
            query(
                "c01.cluster.test",
                RecordType::A,
                Some((1232, 0, &[0, 8, 0, 4, 0, 1, 0, 0])),
            ),
        ),
        (
            "option longer than the OPT",
            query(
                "c01.cluster.test",
                RecordType::A,
                Some((1232, 0, &[0, 10, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8])),
            ),
        ),
    ];
    for (what, request) in cases {
        assert!(!taken(&request), "{what}");
        // The listeners' own check on the same request: whatever comes
        // back is well formed.
        let got = responses(&shared, &request, Protocol::Udp);
        if let Some(general) = got.general {
            checked(&request, &general, Protocol::Udp);
        }
    }
    // Options the catalog ignores, like a cookie and padding, are fine.
    let cookie = query(
        "c01.cluster.test",
        RecordType::A,
        Some((1232, 0, &[0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0, 12, 0, 0])),
    );
    assert!(taken(&cookie));
}

/// A PTR set too big for 512 bytes: without EDNS over UDP it is sent with
/// TC and no answers (and the client retries over TCP); with a big enough
/// EDNS payload, or over TCP, it is sent whole.
#[test]
fn big_answers_truncate_over_udp() {
    let mut config: BootConfig = snapshot();
    let long = "a".repeat(60);
    for i in 0..10 {
        let name = format!("{long}{i}");
        config.hosts.push(host(&name, "prov", [10, 0, 0, 99], &[]));
    }
    let shared = Shared::fixture(&config);
    let name = "99.0.0.10.in-addr.arpa";
    let cases = [
        (None, Protocol::Udp, true),
        (Some((512, 0, &[][..])), Protocol::Udp, true),
        (Some((4096, 0, &[][..])), Protocol::Udp, false),
        (None, Protocol::Tcp, false),
    ];
    for (opt, protocol, truncated) in cases {
        let request = query(name, RecordType::PTR, opt);
        let got = responses(&shared, &request, protocol);
        let fast = checked(&request, &got.fast.unwrap(), protocol);
        assert_eq!(fast.metadata.truncation, truncated, "{opt:?} {protocol}");
        assert_eq!(
            fast.answers.len(),
            if truncated { 0 } else { 10 },
            "{opt:?} {protocol}"
        );
        assert_eq!(
            fast.edns.is_some(),
            opt.is_some(),
            "OPT kept when truncated"
        );
    }
}
