//! Handler rules, table-driven, no sockets; plus round trips of captured and
//! crafted client packets in `src/testdata/`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use dhcproto::v4::{
    Architecture, DhcpOption, Flags, Message, MessageType, OptionCode, UnknownOption,
};
use dhcproto::{Decodable, Encodable};
use mprov_api::boot::{BootConfig, BootHost, BootNetwork, BootServices};

use super::*;

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const KNOWN: Mac = [2, 0, 0, 0, 0, 1];
const NOBOOT: Mac = [2, 0, 0, 0, 0, 2];
const UNKNOWN: Mac = [2, 0, 0, 0, 0, 0x99];
const NOW: u64 = 1_000_000;

fn ip(a: u8, b: u8, c: u8, d: u8) -> Ipv4Addr {
    Ipv4Addr::new(a, b, c, d)
}

fn network(slug: &str, third: u8, netboot: bool) -> BootNetwork {
    BootNetwork {
        slug: slug.into(),
        subnet: ip(10, 0, third, 0),
        prefix: 24,
        gateway: Some(ip(10, 0, third, 254)),
        nameservers: vec![ip(10, 0, third, 1), ip(10, 0, third, 2)],
        domain: format!("{slug}.cluster"),
        // The pool deliberately covers the reserved .100.
        pool: Some((ip(10, 0, third, 100), ip(10, 0, third, 102))),
        dhcp: true,
        dns: true,
        netboot,
        mtu: None,
        http_boot_url: None,
    }
}

fn host(mac: &str, addr: Ipv4Addr, name: &str, netboot: bool) -> BootHost {
    BootHost {
        mac: Some(mac.into()),
        ipv4: Some(addr),
        ipv6: None,
        hostname: name.into(),
        aliases: vec![],
        network: None,
        netboot,
        bootable: true,
    }
}

fn snapshot() -> BootConfig {
    BootConfig {
        revision: 7,
        networks: vec![
            network("prov", 0, true),
            network("rack2", 2, true),
            network("bmc", 3, false),
        ],
        hosts: vec![
            host("02:00:00:00:00:01", ip(10, 0, 0, 100), "n01", true),
            host("02:00:00:00:00:02", ip(10, 0, 0, 20), "n02", false),
        ],
        upstream_resolvers: vec![],
        boot: BootServices {
            ipxe_script_url: Some(mprov_api::boot::ipxe_chain_url("http://10.0.0.1:8080")),
        },
    }
}

struct Env {
    config: DhcpConfig,
    inventory: Inventory,
    table: LeaseTable,
    local_port: u16,
}

impl Env {
    fn new() -> Self {
        let mut config = DhcpConfig::new(SERVER);
        config.http_boot_url = Some("http://10.0.0.1:8080/snponly.efi".into());
        Self {
            config,
            inventory: Inventory::new(&snapshot()),
            table: LeaseTable::default(),
            local_port: SERVER_PORT,
        }
    }

    fn run(&mut self, req: &Message) -> Outcome {
        let ctx = Context {
            config: &self.config,
            inventory: &self.inventory,
            now: NOW,
            src: SocketAddr::from(([10, 0, 0, 77], 68)),
            local_port: self.local_port,
        };
        handle(req, &ctx, &mut self.table)
    }

    fn reply(&mut self, req: &Message) -> Reply {
        match self.run(req).action {
            Action::Respond(r) => *r,
            Action::NoResponse(reason) => panic!("no reply: {reason:?}"),
        }
    }
}

fn request(mac: Mac, mtype: MessageType) -> Message {
    let mut m = Message::new_with_id(
        0x1234,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &mac,
    );
    m.opts_mut().insert(DhcpOption::MessageType(mtype));
    m
}

fn with(mut m: Message, opt: DhcpOption) -> Message {
    m.opts_mut().insert(opt);
    m
}

fn opt(m: &Message, code: OptionCode) -> Option<&DhcpOption> {
    m.opts().get(code)
}

fn boot_name(m: &Message) -> Option<String> {
    match opt(m, OptionCode::BootfileName) {
        Some(DhcpOption::BootfileName(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

#[test]
fn reserved_host_gets_its_address_and_options() {
    let mut env = Env::new();
    let offer = env.reply(&request(KNOWN, MessageType::Discover));
    assert_eq!(offer.kind, ReplyKind::Offer);
    let m = &offer.msg;
    assert_eq!(m.opcode(), Opcode::BootReply);
    assert_eq!(m.xid(), 0x1234);
    assert_eq!(m.yiaddr(), ip(10, 0, 0, 100));
    assert_eq!(
        opt(m, OptionCode::MessageType),
        Some(&DhcpOption::MessageType(MessageType::Offer))
    );
    assert_eq!(
        opt(m, OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(SERVER))
    );
    assert_eq!(
        opt(m, OptionCode::SubnetMask),
        Some(&DhcpOption::SubnetMask(ip(255, 255, 255, 0)))
    );
    assert_eq!(
        opt(m, OptionCode::Router),
        Some(&DhcpOption::Router(vec![ip(10, 0, 0, 254)]))
    );
    assert_eq!(
        opt(m, OptionCode::DomainNameServer),
        Some(&DhcpOption::DomainNameServer(vec![
            ip(10, 0, 0, 1),
            ip(10, 0, 0, 2)
        ]))
    );
    assert_eq!(
        opt(m, OptionCode::DomainName),
        Some(&DhcpOption::DomainName("prov.cluster".into()))
    );
    assert_eq!(
        opt(m, OptionCode::Hostname),
        Some(&DhcpOption::Hostname("n01".into()))
    );
    let lease = env.config.reserved_lease.as_secs() as u32;
    assert_eq!(
        opt(m, OptionCode::AddressLeaseTime),
        Some(&DhcpOption::AddressLeaseTime(lease))
    );
    assert_eq!(offer.dest, SocketAddr::from(([255, 255, 255, 255], 68)));
    assert!(encode(m).unwrap().len() >= MIN_REPLY_LEN);
    // A plain DHCP client (no architecture, no PXEClient) gets no boot file.
    assert_eq!(boot_name(m), None);

    let req = with(
        with(
            request(KNOWN, MessageType::Request),
            DhcpOption::RequestedIpAddress(ip(10, 0, 0, 100)),
        ),
        DhcpOption::ServerIdentifier(SERVER),
    );
    let out = env.run(&req);
    let commit = out.commit.expect("an ACK commits its lease");
    assert_eq!(
        (commit.ip, commit.mac, commit.kind),
        (ip(10, 0, 0, 100), KNOWN, LeaseKind::Bound)
    );
    let Action::Respond(ack) = out.action else {
        panic!("no ACK")
    };
    assert_eq!(ack.kind, ReplyKind::Ack);
    assert_eq!(ack.msg.yiaddr(), ip(10, 0, 0, 100));
}

#[test]
fn unknown_mac_gets_a_pool_address_never_a_reserved_one() {
    let mut env = Env::new();
    let offer = env.reply(&request(UNKNOWN, MessageType::Discover));
    // .100 is reserved for n01 although it lies in the pool.
    assert_eq!(offer.msg.yiaddr(), ip(10, 0, 0, 101));
    let lease = env.config.pool_lease.as_secs() as u32;
    assert_eq!(
        opt(&offer.msg, OptionCode::AddressLeaseTime),
        Some(&DhcpOption::AddressLeaseTime(lease))
    );
    assert_eq!(opt(&offer.msg, OptionCode::Hostname), None);
    // Asking for the reserved address is refused, as is anything off the pool.
    for bad in [ip(10, 0, 0, 100), ip(10, 0, 0, 50), ip(10, 0, 2, 101)] {
        let req = with(
            request(UNKNOWN, MessageType::Request),
            DhcpOption::RequestedIpAddress(bad),
        );
        let nak = env.reply(&req);
        assert_eq!(nak.kind, ReplyKind::Nak, "{bad}");
        assert!(nak.msg.flags().broadcast());
    }
    // A second unknown client is offered another address while the first
    // one's offer is held.
    let other = env.reply(&request([2, 0, 0, 0, 0, 0x98], MessageType::Discover));
    assert_eq!(other.msg.yiaddr(), ip(10, 0, 0, 102));
    // The pool is full now: a third client gets the oldest unconfirmed
    // offer's address, and the episode is reported once.
    let third = env.run(&request([2, 0, 0, 0, 0, 0x97], MessageType::Discover));
    let Action::Respond(reply) = &third.action else {
        panic!("{third:?}")
    };
    assert_eq!(reply.msg.yiaddr(), ip(10, 0, 0, 101));
    assert_eq!(
        third.pool,
        Some(PoolEvent::Exhausted {
            network: "prov".into(),
            pool: (ip(10, 0, 0, 100), ip(10, 0, 0, 102)),
            size: 3,
            bound: 0,
            offered: 2,
            reclaimed: true,
        })
    );
}

/// Clients that DISCOVER and never REQUEST cannot starve the pool: new
/// clients reuse their offers; confirmed leases are never taken; the
/// exhaustion is reported once per episode.
#[test]
fn offers_never_starve_the_pool_and_leases_are_never_taken() {
    let mut env = Env::new();
    let flooder = |n: u32| [6, 0, 0, (n >> 16) as u8, (n >> 8) as u8, n as u8];
    // One real client takes .101 for good.
    let ack = env.reply(&with(
        request(UNKNOWN, MessageType::Request),
        DhcpOption::RequestedIpAddress(ip(10, 0, 0, 101)),
    ));
    assert_eq!(ack.kind, ReplyKind::Ack);
    let mut events = Vec::new();
    for n in 0..1000 {
        let out = env.run(&request(flooder(n), MessageType::Discover));
        let Action::Respond(offer) = &out.action else {
            panic!("flood DISCOVER {n} got no offer: {out:?}")
        };
        assert_eq!(offer.msg.yiaddr(), ip(10, 0, 0, 102), "the lease was taken");
        events.extend(out.pool);
    }
    assert!(
        matches!(
            &events[0],
            PoolEvent::Exhausted {
                bound: 1,
                offered: 1,
                size: 3,
                ..
            }
        ),
        "{events:?}"
    );
    assert_eq!(events.len(), 999, "{events:?}");
    assert!(
        events[1..].iter().all(|e| *e
            == PoolEvent::Reclaimed {
                network: "prov".into()
            }),
        "{events:?}"
    );
    // A newcomer still gets an offer and can confirm it.
    let offer = env.reply(&request([2, 0, 0, 0, 0, 0x55], MessageType::Discover));
    let ack = env.reply(&with(
        request([2, 0, 0, 0, 0, 0x55], MessageType::Request),
        DhcpOption::RequestedIpAddress(offer.msg.yiaddr()),
    ));
    assert_eq!(ack.kind, ReplyKind::Ack);
    // Both pool addresses are leased now: nothing to give, and no second warning.
    let out = env.run(&request(flooder(5000), MessageType::Discover));
    assert_eq!(out.action, Action::NoResponse(Reason::PoolExhausted));
    assert_eq!(out.pool, None);
    // The first client leaves: the pool has room again and the episode ends.
    env.run(&{
        let mut r = request(UNKNOWN, MessageType::Release);
        r.set_ciaddr(ip(10, 0, 0, 101));
        r
    });
    let out = env.run(&request(flooder(5001), MessageType::Discover));
    assert_eq!(
        out.pool,
        Some(PoolEvent::Recovered {
            network: "prov".into()
        })
    );
}

/// An address the inventory gives a host without a MAC (a BMC, a switch)
/// is never handed out from a pool, and the overlap is found at load.
#[test]
fn addresses_of_hosts_without_a_mac_never_come_from_a_pool() {
    let mut snap = snapshot();
    let mut bmc = host("02:00:00:00:00:09", ip(10, 0, 0, 101), "bmc01", false);
    bmc.mac = None;
    let mut bad = host("not-a-mac", ip(10, 0, 0, 102), "sw01", false);
    bad.network = Some("prov".into());
    snap.hosts.extend([bmc, bad]);
    let mut env = Env::new();
    env.inventory = Inventory::new(&snap);
    assert_eq!(
        env.inventory.pool_overlaps(),
        vec![crate::inventory::Overlap {
            network: "prov".into(),
            pool: (ip(10, 0, 0, 100), ip(10, 0, 0, 102)),
            addresses: vec![ip(10, 0, 0, 100), ip(10, 0, 0, 101), ip(10, 0, 0, 102)],
        }]
    );
    // The whole pool is assigned: nothing to offer.
    assert_eq!(
        env.run(&request(UNKNOWN, MessageType::Discover)).action,
        Action::NoResponse(Reason::PoolExhausted)
    );
    let nak = env.reply(&with(
        request(UNKNOWN, MessageType::Request),
        DhcpOption::RequestedIpAddress(ip(10, 0, 0, 101)),
    ));
    assert_eq!(nak.kind, ReplyKind::Nak);
    assert_eq!(Inventory::new(&snapshot()).pool_overlaps().len(), 1);
}

/// A network's own HTTP boot URL wins over the server's.
#[test]
fn http_boot_url_per_network() {
    let mut snap = snapshot();
    snap.networks[0].http_boot_url = Some("http://10.0.0.9/boot/net.efi".into());
    let mut env = Env::new();
    env.inventory = Inventory::new(&snap);
    let http = pxe(UNKNOWN, Some(16), Some("HTTPClient:Arch:00016:UNDI:003001"));
    let offer = env.reply(&http);
    assert_eq!(
        boot_name(&offer.msg).as_deref(),
        Some("http://10.0.0.9/boot/net.efi")
    );
    // Relayed from rack2, which has none: the server's.
    let mut relayed = http.clone();
    relayed.set_giaddr(ip(10, 0, 2, 254));
    let offer = env.reply(&relayed);
    assert_eq!(
        boot_name(&offer.msg).as_deref(),
        Some("http://10.0.0.1:8080/snponly.efi")
    );
    // Nothing configured anywhere: no boot file.
    env.config.http_boot_url = None;
    assert_eq!(boot_name(&env.reply(&relayed).msg), None);
    // proxyDHCP follows the network too.
    env.config.proxy = true;
    assert_eq!(
        boot_name(&env.reply(&http).msg).as_deref(),
        Some("http://10.0.0.9/boot/net.efi")
    );
}

#[test]
fn an_address_is_never_acked_to_two_clients() {
    let mut env = Env::new();
    let a = with(
        request(UNKNOWN, MessageType::Request),
        DhcpOption::RequestedIpAddress(ip(10, 0, 0, 101)),
    );
    assert_eq!(env.reply(&a).kind, ReplyKind::Ack);
    let b = with(
        request([2, 0, 0, 0, 0, 0x98], MessageType::Request),
        DhcpOption::RequestedIpAddress(ip(10, 0, 0, 101)),
    );
    assert_eq!(env.reply(&b).kind, ReplyKind::Nak);
    // After a RELEASE the address is free again; the release is logged.
    let mut rel = request(UNKNOWN, MessageType::Release);
    rel.set_ciaddr(ip(10, 0, 0, 101));
    let out = env.run(&rel);
    assert_eq!(out.action, Action::NoResponse(Reason::Released));
    assert_eq!(out.commit.map(|c| c.kind), Some(LeaseKind::Free));
    assert_eq!(env.reply(&b).kind, ReplyKind::Ack);
}

#[test]
fn choosing_another_server_frees_our_offer() {
    let mut env = Env::new();
    let offer = env.reply(&request(UNKNOWN, MessageType::Discover));
    assert_eq!(offer.msg.yiaddr(), ip(10, 0, 0, 101));
    let elsewhere = with(
        with(
            request(UNKNOWN, MessageType::Request),
            DhcpOption::ServerIdentifier(ip(10, 0, 0, 9)),
        ),
        DhcpOption::RequestedIpAddress(ip(10, 0, 0, 150)),
    );
    assert_eq!(
        env.run(&elsewhere).action,
        Action::NoResponse(Reason::OtherServer)
    );
    assert_eq!(env.table.binding(ip(10, 0, 0, 101)), None);
}

#[test]
fn renewal_is_unicast_to_ciaddr_and_decline_quarantines() {
    let mut env = Env::new();
    let a = with(
        request(UNKNOWN, MessageType::Request),
        DhcpOption::RequestedIpAddress(ip(10, 0, 0, 101)),
    );
    env.reply(&a);
    let mut renew = request(UNKNOWN, MessageType::Request);
    renew.set_ciaddr(ip(10, 0, 0, 101));
    let ack = env.reply(&renew);
    assert_eq!(ack.kind, ReplyKind::Ack);
    assert_eq!(ack.dest, SocketAddr::from(([10, 0, 0, 101], 68)));
    let dec = with(
        request(UNKNOWN, MessageType::Decline),
        DhcpOption::RequestedIpAddress(ip(10, 0, 0, 101)),
    );
    assert_eq!(env.run(&dec).action, Action::NoResponse(Reason::Declined));
    // The declined address is skipped for the next client.
    let next = env.reply(&request([2, 0, 0, 0, 0, 0x98], MessageType::Discover));
    assert_eq!(next.msg.yiaddr(), ip(10, 0, 0, 102));
}

#[test]
fn inform_gets_options_without_a_lease() {
    let mut env = Env::new();
    let mut inf = request(UNKNOWN, MessageType::Inform);
    inf.set_ciaddr(ip(10, 0, 0, 50));
    let out = env.run(&inf);
    assert_eq!(out.commit, None);
    let Action::Respond(ack) = out.action else {
        panic!()
    };
    assert_eq!(ack.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(opt(&ack.msg, OptionCode::AddressLeaseTime), None);
    assert!(opt(&ack.msg, OptionCode::Router).is_some());
    assert_eq!(ack.dest, SocketAddr::from(([10, 0, 0, 50], 68)));
}

#[test]
fn relayed_requests_use_the_relays_network_and_go_back_to_it() {
    let mut env = Env::new();
    let mut d = request(UNKNOWN, MessageType::Discover);
    d.set_giaddr(ip(10, 0, 2, 254));
    let offer = env.reply(&d);
    assert_eq!(offer.msg.yiaddr(), ip(10, 0, 2, 100));
    assert_eq!(offer.msg.giaddr(), ip(10, 0, 2, 254));
    assert_eq!(
        opt(&offer.msg, OptionCode::Router),
        Some(&DhcpOption::Router(vec![ip(10, 0, 2, 254)]))
    );
    assert_eq!(offer.dest, SocketAddr::from(([10, 0, 2, 254], 67)));
    // A relay on a network we do not know is not served.
    d.set_giaddr(ip(192, 168, 9, 1));
    assert_eq!(env.run(&d).action, Action::NoResponse(Reason::NotServed));
}

#[test]
fn off_port_requests_are_answered_at_their_source() {
    let mut env = Env::new();
    env.local_port = 40_000;
    let offer = env.reply(&request(UNKNOWN, MessageType::Discover));
    assert_eq!(offer.dest, SocketAddr::from(([10, 0, 0, 77], 68)));
}

#[test]
fn unanswerable_packets_are_dropped() {
    let mut env = Env::new();
    let mut reply = request(KNOWN, MessageType::Discover);
    reply.set_opcode(Opcode::BootReply);
    let mut no_type = request(KNOWN, MessageType::Discover);
    no_type.opts_mut().remove(OptionCode::MessageType);
    let other = with(
        request(KNOWN, MessageType::Request),
        DhcpOption::ServerIdentifier(ip(10, 0, 0, 9)),
    );
    let long_hw = Message::new_with_id(
        1,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &[1; 8],
    );
    let offer = request(KNOWN, MessageType::Offer);
    let no_addr = request(UNKNOWN, MessageType::Request);
    let cases = [
        (reply, Reason::NotRequest),
        (no_type, Reason::NoMessageType),
        (other, Reason::OtherServer),
        (long_hw, Reason::BadHardware),
        (offer, Reason::Unsupported),
        (no_addr, Reason::NoRequestedAddress),
    ];
    for (msg, want) in cases {
        let out = env.run(&msg);
        assert_eq!(out.action, Action::NoResponse(want));
        assert_eq!(out.commit, None);
    }
    // The server's own network must have DHCP on.
    env.config.server_ip = ip(10, 0, 9, 1);
    assert_eq!(
        env.run(&request(KNOWN, MessageType::Discover)).action,
        Action::NoResponse(Reason::NotServed)
    );
}

#[test]
fn prefilter_checks_the_raw_header() {
    let good = request(KNOWN, MessageType::Discover).to_vec().unwrap();
    assert_eq!(prefilter(&good), Ok(()));
    let mut b = good.clone();
    b[0] = 2;
    assert_eq!(prefilter(&b), Err(Reason::NotRequest));
    let mut b = good.clone();
    b[2] = 8;
    assert_eq!(prefilter(&b), Err(Reason::BadHardware));
    assert_eq!(prefilter(&good[..100]), Err(Reason::Malformed));
    assert_eq!(prefilter(&[]), Err(Reason::Malformed));
}

fn pxe(mac: Mac, arch: Option<u16>, class: Option<&str>) -> Message {
    let mut m = request(mac, MessageType::Discover);
    if let Some(a) = arch {
        m = with(m, DhcpOption::ClientSystemArchitecture(Architecture(a)));
    }
    if let Some(c) = class {
        m = with(m, DhcpOption::ClassIdentifier(c.as_bytes().to_vec()));
    }
    m
}

fn ipxe(mac: Mac, how: &str) -> Message {
    let m = pxe(mac, Some(0), Some("PXEClient:Arch:00000:UNDI:002001"));
    match how {
        "77" => with(m, DhcpOption::UserClass(b"iPXE".to_vec())),
        _ => with(
            m,
            DhcpOption::Unknown(UnknownOption::new(
                OptionCode::from(175),
                vec![177, 5, 1, 0x80, 0x86, 0x10, 0x0e],
            )),
        ),
    }
}

#[test]
fn boot_file_follows_the_client() {
    let script = &mprov_api::boot::ipxe_chain_url("http://10.0.0.1:8080");
    let cases: Vec<(&str, Message, Option<&str>)> = vec![
        (
            "bios",
            pxe(UNKNOWN, Some(0), Some("PXEClient:Arch:00000:UNDI:002001")),
            Some("undionly.kpxe"),
        ),
        (
            "efi x64 (7)",
            pxe(UNKNOWN, Some(7), Some("PXEClient:Arch:00007:UNDI:003016")),
            Some("snponly.efi"),
        ),
        (
            "efi bc (9)",
            pxe(UNKNOWN, Some(9), Some("PXEClient:Arch:00009:UNDI:003016")),
            Some("snponly.efi"),
        ),
        (
            "arm64",
            pxe(UNKNOWN, Some(11), Some("PXEClient:Arch:00011:UNDI:003000")),
            Some("snponly-arm64.efi"),
        ),
        (
            "http boot",
            pxe(UNKNOWN, Some(16), Some("HTTPClient:Arch:00016:UNDI:003001")),
            Some("http://10.0.0.1:8080/snponly.efi"),
        ),
        (
            "unknown arch",
            pxe(UNKNOWN, Some(0x25), Some("PXEClient")),
            None,
        ),
        ("ipxe by user class", ipxe(UNKNOWN, "77"), Some(script)),
        ("ipxe by option 175", ipxe(UNKNOWN, "175"), Some(script)),
        (
            "host says no netboot",
            pxe(NOBOOT, Some(0), Some("PXEClient")),
            None,
        ),
        (
            "plain dhcp client",
            pxe(UNKNOWN, None, Some("udhcp 1.35.0")),
            None,
        ),
    ];
    for (name, req, want) in cases {
        let mut env = Env::new();
        let offer = env.reply(&req);
        assert_eq!(boot_name(&offer.msg).as_deref(), want, "{name}");
        if let Some(file) = want {
            assert_eq!(offer.msg.siaddr(), SERVER, "{name}");
            if file.len() < 128 {
                assert_eq!(
                    offer.msg.fname_str().and_then(|r| r.ok()),
                    Some(file),
                    "{name}"
                );
            }
        }
        let http = opt(&offer.msg, OptionCode::ClassIdentifier)
            == Some(&DhcpOption::ClassIdentifier(b"HTTPClient".to_vec()));
        assert_eq!(http, name == "http boot", "{name}");
    }
}

#[test]
fn no_boot_file_on_a_network_without_netboot() {
    let mut env = Env::new();
    let mut d = pxe(UNKNOWN, Some(0), Some("PXEClient"));
    d.set_giaddr(ip(10, 0, 3, 254));
    let offer = env.reply(&d);
    assert_eq!(offer.msg.yiaddr(), ip(10, 0, 3, 100));
    assert_eq!(boot_name(&offer.msg), None);
}

#[test]
fn proxy_dhcp_gives_boot_information_only() {
    let mut env = Env::new();
    env.config.proxy = true;
    let offer = env.reply(&pxe(
        UNKNOWN,
        Some(7),
        Some("PXEClient:Arch:00007:UNDI:003016"),
    ));
    assert_eq!(offer.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    // The OFFER on port 67 names no boot file, so the client asks on 4011.
    assert_eq!(boot_name(&offer.msg), None);
    assert!(offer.msg.fname().is_none_or(|f| f.is_empty()));
    assert_eq!(
        opt(&offer.msg, OptionCode::ClassIdentifier),
        Some(&DhcpOption::ClassIdentifier(b"PXEClient".to_vec()))
    );
    // No PXE discovery options: EDK2 would look for a boot menu.
    assert_eq!(opt(&offer.msg, OptionCode::VendorExtensions), None);
    assert_eq!(opt(&offer.msg, OptionCode::AddressLeaseTime), None);
    assert_eq!(env.table.bound_entries(), 0);
    // Not a PXE client: not our business.
    assert_eq!(
        env.run(&request(UNKNOWN, MessageType::Discover)).action,
        Action::NoResponse(Reason::NotPxe)
    );
    // The second exchange on port 4011 is answered at its source.
    env.local_port = PXE_PORT;
    let mut req = pxe(UNKNOWN, Some(7), Some("PXEClient:Arch:00007:UNDI:003016"));
    req.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Request));
    req.set_ciaddr(ip(10, 0, 0, 160));
    let ack = env.reply(&req);
    assert_eq!(ack.kind, ReplyKind::Ack);
    assert_eq!(ack.dest, SocketAddr::from(([10, 0, 0, 77], 68)));
    assert_eq!(boot_name(&ack.msg).as_deref(), Some("snponly.efi"));
    assert_eq!(opt(&ack.msg, OptionCode::VendorExtensions), None);
    // A boot server request naming a boot item gets it echoed.
    req.opts_mut().insert(DhcpOption::VendorExtensions(vec![
        71, 4, 0x80, 0x00, 0, 0, 255,
    ]));
    let ack = env.reply(&req);
    assert_eq!(
        opt(&ack.msg, OptionCode::VendorExtensions),
        Some(&DhcpOption::VendorExtensions(vec![
            71, 4, 0x80, 0, 0, 0, 255
        ]))
    );
    assert_eq!(boot_name(&ack.msg).as_deref(), Some("snponly.efi"));
}

#[test]
fn relay_agent_information_is_echoed() {
    let mut env = Env::new();
    let raw = request(UNKNOWN, MessageType::Discover).to_vec().unwrap();
    // Insert option 82 (circuit id "p1") before the end option by hand.
    let end = raw.iter().rposition(|&b| b == 255).unwrap();
    let mut bytes = raw[..end].to_vec();
    bytes.extend_from_slice(&[82, 4, 1, 2, b'p', b'1', 255]);
    let mut d = Message::from_bytes(&bytes).unwrap();
    d.set_giaddr(ip(10, 0, 2, 254));
    let offer = env.reply(&d);
    assert!(opt(&offer.msg, OptionCode::RelayAgentInformation).is_some());
}

#[test]
fn flags_are_copied() {
    let mut env = Env::new();
    let mut d = request(UNKNOWN, MessageType::Discover);
    d.set_flags(Flags::default().set_broadcast());
    assert!(env.reply(&d).msg.flags().broadcast());
}

/// Client packets kept in `src/testdata/`: two captured from real clients in
/// the lab (busybox udhcpc, ISC dhclient) and four laid out byte by byte after
/// firmware and iPXE captures (BIOS PXE, x86-64 UEFI PXE, UEFI HTTP boot,
/// iPXE with options 77 and 175). Each must decode, survive an encode/decode
/// round trip, and get the expected boot file.
#[test]
fn captured_packets_round_trip() {
    let script = mprov_api::boot::ipxe_chain_url("http://10.0.0.1:8080");
    let cases: &[(&str, &[u8], MessageType, Option<&str>)] = &[
        (
            "udhcpc-discover",
            include_bytes!("../testdata/udhcpc-discover.bin"),
            MessageType::Discover,
            None,
        ),
        (
            "dhclient-discover",
            include_bytes!("../testdata/dhclient-discover.bin"),
            MessageType::Discover,
            None,
        ),
        (
            "pxe-bios-discover",
            include_bytes!("../testdata/pxe-bios-discover.bin"),
            MessageType::Discover,
            Some("undionly.kpxe"),
        ),
        (
            "pxe-efi64-request",
            include_bytes!("../testdata/pxe-efi64-request.bin"),
            MessageType::Request,
            Some("snponly.efi"),
        ),
        (
            "uefi-http-discover",
            include_bytes!("../testdata/uefi-http-discover.bin"),
            MessageType::Discover,
            Some("http://10.0.0.1:8080/snponly.efi"),
        ),
        (
            "ipxe-discover",
            include_bytes!("../testdata/ipxe-discover.bin"),
            MessageType::Discover,
            Some(script.as_str()),
        ),
    ];
    for (name, bytes, mtype, boot) in cases {
        assert_eq!(prefilter(bytes), Ok(()), "{name}");
        let msg = Message::from_bytes(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(msg.opts().msg_type(), Some(*mtype), "{name}");
        let again = Message::from_bytes(&msg.to_vec().unwrap()).unwrap();
        assert_eq!(again, msg, "{name}");
        let mut env = Env::new();
        // Answer as a server whose address the captured REQUEST names.
        if let Some(DhcpOption::ServerIdentifier(id)) = msg.opts().get(OptionCode::ServerIdentifier)
        {
            env.config.server_ip = *id;
        }
        let reply = env.reply(&msg);
        if *mtype == MessageType::Discover {
            assert_eq!(reply.kind, ReplyKind::Offer, "{name}");
        }
        assert_eq!(boot_name(&reply.msg).as_deref(), *boot, "{name}");
    }
}

#[test]
fn options_dhcproto_would_assert_on_are_rejected() {
    let base = request(UNKNOWN, MessageType::Discover).to_vec().unwrap();
    let end = base.iter().rposition(|&b| b == 255).unwrap();
    for bad in [
        &[94u8, 2, 1, 2][..],
        &[80, 1, 0],
        &[81, 1, 0],
        &[152, 1, 0],
        &[151, 0],
    ] {
        let mut b = base[..end].to_vec();
        b.extend_from_slice(bad);
        b.push(255);
        assert_eq!(decode(&b), Err(Reason::Malformed), "{bad:?}");
    }
    assert!(decode(&base).is_ok());
}

/// Replays the fuzz corpus (seeds and anything the fuzzer kept) on stable.
#[test]
fn fuzz_corpus_replays() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fuzz/corpus/dhcp_packet");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the dhcp_packet corpus") {
        crate::fuzz_packet(&std::fs::read(entry.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n >= 6, "corpus has only {n} files");
}

#[test]
fn fuzz_entry_survives_garbage_and_mutations() {
    crate::fuzz_packet(&[]);
    crate::fuzz_packet(&[1, 1, 6]);
    let base = include_bytes!("../testdata/ipxe-discover.bin");
    for i in 0..base.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut b = base.to_vec();
            b[i] ^= flip;
            crate::fuzz_packet(&b);
            crate::fuzz_packet(&b[..i]);
        }
    }
}
