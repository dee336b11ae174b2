//! Integration tests: real clients nobody here wrote (busybox udhcpc, ISC
//! dhclient) against our server in network namespaces; lease durability
//! across `kill -9`; the ACK-after-fsync ordering; metrics. Module `ra`: the
//! IPv6 router advertisements against rdisc6 and the Linux kernel.
//!
//! The namespace tests need root (CAP_NET_ADMIN); they always run.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use dhcproto::v4::{DhcpOption, Message, MessageType};
use dhcproto::{Decodable, Encodable};
use mprov_api::boot::{BootConfig, BootHost, BootNetwork, BootServices};
use mprov_dhcp::store::{LeaseRecord, Probe};
use mprov_dhcp::{DhcpConfig, LeaseStore, Metrics, Server, StoreOptions};
use mprov_tests::KillOnDrop;
use mprov_tests::netns::{Netns, parse_env, veth, write_script};
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[path = "lab/ra.rs"]
mod ra;

const RESERVED_MAC: &str = "02:00:5e:10:00:01";
const UNKNOWN_MAC: &str = "02:00:5e:10:00:99";
/// The upper bound on any one client run; they normally finish in well under a second.
const CLIENT_LIMIT: Duration = Duration::from_secs(20);

fn snapshot(server: Ipv4Addr, hosts: Vec<BootHost>) -> BootConfig {
    let [a, b, c, _] = server.octets();
    BootConfig {
        revision: 1,
        networks: vec![BootNetwork {
            slug: "prov".into(),
            subnet: Ipv4Addr::new(a, b, c, 0),
            prefix: 24,
            gateway: Some(Ipv4Addr::new(a, b, c, 254)),
            nameservers: vec![server, Ipv4Addr::new(a, b, c, 2)],
            domain: "lab.cluster".into(),
            pool: Some((Ipv4Addr::new(a, b, c, 10), Ipv4Addr::new(a, b, c, 250))),
            dhcp: true,
            dns: true,
            netboot: true,
            mtu: None,
            http_boot_url: None,
        }],
        hosts,
        upstream_resolvers: vec![],
        boot: BootServices {
            ipxe_script_url: Some(mprov_api::boot::ipxe_chain_url(&format!(
                "http://{server}:8080"
            ))),
        },
    }
}

fn reservation(mac: &str, ip: Ipv4Addr, name: &str) -> BootHost {
    BootHost {
        mac: Some(mac.into()),
        ipv4: Some(ip),
        ipv6: None,
        hostname: name.into(),
        aliases: vec![],
        network: Some("prov".into()),
        netboot: true,
        bootable: true,
    }
}

/// Two namespaces joined by a veth pair, our server on port 67 in one.
struct Lab {
    client: Netns,
    client_dev: String,
    snapshot: watch::Sender<Arc<BootConfig>>,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    dir: tempfile::TempDir,
    _server_ns: Netns,
}

const LAB_SERVER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

impl Lab {
    async fn start(hosts: Vec<BootHost>) -> Result<Self> {
        let server_ns = Netns::new("dhcps")?;
        let client = Netns::new("dhcpc")?;
        let v = veth(&server_ns, &client)?;
        server_ns.add_addr(&v.a, &format!("{LAB_SERVER}/24"))?;
        let socket = server_ns.bind_udp(SocketAddr::from(([0, 0, 0, 0], 67)), &v.a)?;
        socket.set_nonblocking(true)?;
        let dir = tempfile::tempdir()?;
        let store = LeaseStore::open(&dir.path().join("leases.log"), StoreOptions::default())?;
        let (tx, rx) = watch::channel(Arc::new(snapshot(LAB_SERVER, hosts)));
        let server = Server::new(DhcpConfig::new(LAB_SERVER), rx, store);
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(server.run(UdpSocket::from_std(socket)?, shutdown.clone()));
        Ok(Self {
            client,
            client_dev: v.b,
            snapshot: tx,
            shutdown,
            server,
            dir,
            _server_ns: server_ns,
        })
    }

    async fn cleanup(self) -> Result<()> {
        self.shutdown.cancel();
        self.server.await??;
        Ok(())
    }

    fn set_client_mac(&self, mac: &str) -> Result<()> {
        self.client.set_mac(&self.client_dev, mac)
    }

    /// Runs busybox udhcpc once; returns the variables its script saw on `bound`.
    async fn udhcpc(&self) -> Result<HashMap<String, String>> {
        let script = self.dir.path().join("udhcpc.sh");
        write_script(&script, "#!/bin/sh\n[ \"$1\" = bound ] && env\nexit 0\n")?;
        let mut cmd = self.client.command("udhcpc");
        cmd.args([
            "-q",
            "-n",
            "-f",
            "-t",
            "5",
            "-T",
            "2",
            "-i",
            &self.client_dev,
            "-s",
        ])
        .arg(&script)
        .stdin(Stdio::null());
        let out = tokio::time::timeout(CLIENT_LIMIT, tokio::process::Command::from(cmd).output())
            .await
            .context("udhcpc took too long")??;
        if !out.status.success() {
            bail!("udhcpc failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(parse_env(&String::from_utf8_lossy(&out.stdout)))
    }

    /// Runs ISC dhclient until its script sees BOUND, then stops it (by PID).
    async fn dhclient(&self) -> Result<HashMap<String, String>> {
        // A blocking wait, on this worker thread only: the server runs on
        // the other.
        tokio::task::block_in_place(|| {
            self.client
                .dhclient(&self.client_dev, self.dir.path(), CLIENT_LIMIT)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udhcpc_gets_its_reservation_and_options() -> Result<()> {
    let ip = Ipv4Addr::new(10, 77, 0, 42);
    let lab = Lab::start(vec![reservation(RESERVED_MAC, ip, "n042")]).await?;
    lab.set_client_mac(RESERVED_MAC)?;
    let env = lab.udhcpc().await?;
    assert_eq!(
        env.get("ip").map(String::as_str),
        Some("10.77.0.42"),
        "{env:?}"
    );
    assert_eq!(env.get("subnet").map(String::as_str), Some("255.255.255.0"));
    assert_eq!(env.get("router").map(|s| s.trim()), Some("10.77.0.254"));
    assert_eq!(
        env.get("dns").map(|s| s.trim()),
        Some("10.77.0.1 10.77.0.2")
    );
    assert_eq!(env.get("domain").map(String::as_str), Some("lab.cluster"));
    assert_eq!(env.get("hostname").map(String::as_str), Some("n042"));
    assert_eq!(env.get("serverid").map(String::as_str), Some("10.77.0.1"));
    lab.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dhclient_gets_its_reservation_and_options() -> Result<()> {
    let ip = Ipv4Addr::new(10, 77, 0, 43);
    let lab = Lab::start(vec![reservation(RESERVED_MAC, ip, "n043")]).await?;
    lab.set_client_mac(RESERVED_MAC)?;
    let env = lab.dhclient().await?;
    let get = |k: &str| env.get(k).map(|s| s.trim().to_owned());
    assert_eq!(
        get("new_ip_address").as_deref(),
        Some("10.77.0.43"),
        "{env:?}"
    );
    assert_eq!(get("new_subnet_mask").as_deref(), Some("255.255.255.0"));
    assert_eq!(get("new_routers").as_deref(), Some("10.77.0.254"));
    assert_eq!(
        get("new_domain_name_servers").as_deref(),
        Some("10.77.0.1 10.77.0.2")
    );
    // dhclient quotes string options in the environment on some builds.
    assert_eq!(
        get("new_domain_name")
            .map(|s| s.trim_matches('\'').to_owned())
            .as_deref(),
        Some("lab.cluster")
    );
    assert_eq!(
        get("new_host_name")
            .map(|s| s.trim_matches('\'').to_owned())
            .as_deref(),
        Some("n043")
    );
    lab.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_mac_gets_a_pool_address_then_a_new_reservation_live() -> Result<()> {
    let lab = Lab::start(vec![reservation(
        RESERVED_MAC,
        Ipv4Addr::new(10, 77, 0, 10),
        "n010",
    )])
    .await?;
    lab.set_client_mac(UNKNOWN_MAC)?;
    let env = lab.udhcpc().await?;
    let pool_ip: Ipv4Addr = env.get("ip").context("no ip")?.parse()?;
    // .10 opens the pool but is reserved: the unknown node gets .11.
    assert_eq!(pool_ip, Ipv4Addr::new(10, 77, 0, 11));
    assert_eq!(env.get("hostname"), None);

    // The inventory learns this node: the next DHCP run gets the reservation,
    // with no restart.
    let mut next = snapshot(
        LAB_SERVER,
        vec![
            reservation(RESERVED_MAC, Ipv4Addr::new(10, 77, 0, 10), "n010"),
            reservation(UNKNOWN_MAC, Ipv4Addr::new(10, 77, 0, 77), "n077"),
        ],
    );
    next.revision = 2;
    lab.snapshot.send(Arc::new(next))?;
    let env = lab.udhcpc().await?;
    assert_eq!(env.get("ip").map(String::as_str), Some("10.77.0.77"));
    assert_eq!(env.get("hostname").map(String::as_str), Some("n077"));
    lab.cleanup().await
}

/// A minimal DHCP client over loopback, for durability and ordering tests:
/// the server runs on a non-standard port, so it answers at our address.
struct TestClient {
    socket: UdpSocket,
    server: SocketAddr,
}

/// A reply must come within this bound, or the exchange counts as unanswered.
const REPLY_LIMIT: Duration = Duration::from_secs(5);

impl TestClient {
    async fn new(server: SocketAddr) -> Result<Self> {
        Ok(Self {
            socket: UdpSocket::bind("127.0.0.1:0").await?,
            server,
        })
    }

    async fn send(
        &self,
        mac: [u8; 6],
        xid: u32,
        mtype: MessageType,
        opts: Vec<DhcpOption>,
    ) -> Result<Option<Message>> {
        // A client's message: no addresses yet, `mac` as the hardware address.
        let mut m = Message::default();
        m.set_xid(xid).set_chaddr(&mac);
        m.opts_mut().insert(DhcpOption::MessageType(mtype));
        for o in opts {
            m.opts_mut().insert(o);
        }
        self.socket.send_to(&m.to_vec()?, self.server).await?;
        let mut buf = [0u8; 1500];
        loop {
            let Ok(r) = tokio::time::timeout(REPLY_LIMIT, self.socket.recv_from(&mut buf)).await
            else {
                return Ok(None);
            };
            let (n, _) = r?;
            let reply = Message::from_bytes(&buf[..n])?;
            if reply.xid() == xid {
                return Ok(Some(reply));
            }
        }
    }

    /// DISCOVER, REQUEST: the ACKed address, if the server ACKed.
    async fn dora(&self, mac: [u8; 6], server_id: Ipv4Addr) -> Result<Option<Ipv4Addr>> {
        let xid = u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]);
        let Some(offer) = self.send(mac, xid, MessageType::Discover, vec![]).await? else {
            return Ok(None);
        };
        let ip = offer.yiaddr();
        let opts = vec![
            DhcpOption::RequestedIpAddress(ip),
            DhcpOption::ServerIdentifier(server_id),
        ];
        let Some(ack) = self.send(mac, xid, MessageType::Request, opts).await? else {
            return Ok(None);
        };
        Ok((ack.opts().msg_type() == Some(MessageType::Ack)).then_some(ack.yiaddr()))
    }
}

fn mac(n: u32) -> [u8; 6] {
    let b = n.to_be_bytes();
    [2, 0x11, b[0], b[1], b[2], b[3]]
}

/// Starts the test server binary on `log`; returns the child and its port.
fn start_child(log: &Path, config: &Path) -> Result<(KillOnDrop, u16)> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mprov-dhcp-testserver"))
        .arg(log)
        .arg(config)
        .arg("10.88.0.1")
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().context("no stdout")?;
    let child = KillOnDrop(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let port = line
        .trim()
        .strip_prefix("port ")
        .context("no port line")?
        .parse()?;
    Ok((child, port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acked_lease_and_duplicates_none() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("leases.log");
    let config = dir.path().join("boot.json");
    let server_ip = Ipv4Addr::new(10, 88, 0, 1);
    let mut snap = snapshot(
        server_ip,
        vec![reservation(
            "02:11:00:00:ff:ff",
            Ipv4Addr::new(10, 88, 0, 12),
            "r",
        )],
    );
    snap.networks[0].pool = Some((Ipv4Addr::new(10, 88, 0, 10), Ipv4Addr::new(10, 88, 3, 250)));
    snap.networks[0].prefix = 16;
    snap.networks[0].subnet = Ipv4Addr::new(10, 88, 0, 0);
    std::fs::write(&config, serde_json::to_vec(&snap)?)?;

    // Phase 1: a burst of 400 clients, 16 at a time; kill -9 after 150 ACKs.
    let (child, port) = start_child(&log, &config)?;
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    let acked: Arc<Mutex<HashMap<[u8; 6], Ipv4Addr>>> = Arc::default();
    let child = Arc::new(Mutex::new(Some(child)));
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..16u32 {
        let (acked, child) = (acked.clone(), child.clone());
        tasks.spawn(async move {
            let client = TestClient::new(server).await?;
            for i in 0..25u32 {
                let m = mac(worker * 1000 + i);
                let Some(ip) = client.dora(m, server_ip).await? else {
                    break; // the server is gone
                };
                let mut a = acked.lock().unwrap();
                a.insert(m, ip);
                if a.len() == 150 {
                    // SIGKILL mid-burst: other workers have requests in flight.
                    drop(child.lock().unwrap().take());
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    drop(child.lock().unwrap().take());
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 150,
        "only {} ACKs before the kill",
        acked.len()
    );
    assert!(acked.len() < 400, "the kill did not interrupt the burst");
    let unique: HashSet<_> = acked.values().collect();
    assert_eq!(unique.len(), acked.len(), "an address was ACKed twice");
    assert!(
        !unique.contains(&Ipv4Addr::new(10, 88, 0, 12)),
        "a reserved address went to a pool client"
    );

    // Phase 2: restart on the same log.
    let (_child, port) = start_child(&log, &config)?;
    let client = TestClient::new(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    // Every ACKed lease is still known: its client is offered the same address.
    for (m, ip) in &acked {
        let xid = u32::from_be_bytes([m[2], m[3], m[4], m[5]]) ^ 0x5555_0000;
        let offer = client
            .send(*m, xid, MessageType::Discover, vec![])
            .await?
            .context("no offer after restart")?;
        assert_eq!(offer.yiaddr(), *ip, "lease of {m:02x?} forgotten");
    }
    // New clients never get an address someone already holds.
    let mut all: HashSet<Ipv4Addr> = acked.values().copied().collect();
    for i in 0..100u32 {
        let ip = client
            .dora(mac(900_000 + i), server_ip)
            .await?
            .context("new client not served")?;
        assert!(all.insert(ip), "{ip} handed to two clients");
    }
    Ok(())
}

#[derive(Default)]
struct Recorder(Mutex<Vec<(&'static str, Ipv4Addr)>>);

impl Probe for Recorder {
    fn durable(&self, rec: &LeaseRecord) {
        self.0.lock().unwrap().push(("durable", rec.ip));
    }
    fn sending(&self, kind: &str, ip: Ipv4Addr) {
        let kind = if kind == "ack" { "ack" } else { "other" };
        self.0.lock().unwrap().push((kind, ip));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_leave_only_after_their_lease_is_durable_and_are_counted() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let recorder = Arc::new(Recorder::default());
    let probe: Arc<dyn Probe> = recorder.clone();
    let store = LeaseStore::open_with_probe(
        &dir.path().join("leases.log"),
        StoreOptions::default(),
        Some(probe),
    )?;
    let server_ip = Ipv4Addr::new(10, 89, 0, 1);
    let (_tx, rx) = watch::channel(Arc::new(snapshot(server_ip, vec![])));
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let server = Server::new(DhcpConfig::new(server_ip), rx, store).with_metrics(metrics);
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
    let addr = socket.local_addr()?;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.run(socket, shutdown.clone()));

    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..8u32 {
        tasks.spawn(async move {
            let client = TestClient::new(addr).await?;
            let mut n = 0;
            for i in 0..10 {
                n += usize::from(
                    client
                        .dora(mac(worker * 100 + i), server_ip)
                        .await?
                        .is_some(),
                );
            }
            anyhow::Ok(n)
        });
    }
    let mut acks = 0;
    while let Some(r) = tasks.join_next().await {
        acks += r??;
    }
    assert_eq!(acks, 80);
    // Junk is dropped and counted, never answered.
    let junk = UdpSocket::bind("127.0.0.1:0").await?;
    junk.send_to(&[1, 1, 6, 0, 1, 2, 3], addr).await?;
    let mut reply = Message::new_with_id(
        9,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &[2; 6],
    );
    reply.set_opcode(dhcproto::v4::Opcode::BootReply);
    junk.send_to(&reply.to_vec()?, addr).await?;
    // A DISCOVER after the junk: once it is answered, the junk was handled.
    let client = TestClient::new(addr).await?;
    client
        .send(mac(7777), 7777, MessageType::Discover, vec![])
        .await?
        .context("no offer")?;
    shutdown.cancel();
    task.await??;

    let events = recorder.0.lock().unwrap().clone();
    let mut durable = HashSet::new();
    let mut acked = 0;
    for (kind, ip) in events {
        match kind {
            "durable" => {
                durable.insert(ip);
            }
            "ack" => {
                assert!(
                    durable.contains(&ip),
                    "ACK for {ip} sent before its lease was durable"
                );
                acked += 1;
            }
            _ => {}
        }
    }
    assert_eq!(acked, 80);

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    for want in [
        "dhcp_acks_total 80",
        "dhcp_offers_total 81",
        "dhcp_leases 80",
        "dhcp_malformed_total 1",
        "dhcp_drops_total{reason=\"not_request\"} 1",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    Ok(())
}

/// A job server that starts again on its lease log reports again the
/// leases it bound within `/ipxe/`'s attestation window, and only those,
/// oldest first: a reserved address's lease began its reserved length
/// before its end, a pool address's the pool's. No namespace needed.
#[test]
fn leases_bound_within_the_attestation_window_are_reported_again() -> Result<()> {
    use mprov_dhcp::ReplyKind;
    use mprov_dhcp::store::{LeaseKind, unix_now};
    let mut config = DhcpConfig::new(LAB_SERVER);
    config.pool_lease = Duration::from_secs(3600);
    config.reserved_lease = Duration::from_secs(12 * 3600);
    let now = unix_now();
    let at = |last: u8| Ipv4Addr::new(10, 77, 0, last);
    let mac = |last: u8| [2, 0, 0, 0, 0, last];
    let bound = |last: u8, began: u64, lease: Duration| LeaseRecord {
        kind: LeaseKind::Bound,
        mac: mac(last),
        ip: at(last),
        expires: began + lease.as_secs(),
    };
    let records = [
        // Reserved, bound a minute ago: again.
        bound(5, now - 60, config.reserved_lease),
        // Reserved, bound an hour ago (its lease runs 11 more hours): not.
        bound(6, now - 3600, config.reserved_lease),
        // Pool, bound half a minute ago: again.
        bound(20, now - 30, config.pool_lease),
        // Pool, bound 20 minutes ago: not.
        bound(21, now - 1200, config.pool_lease),
        // Pool, bound and freed: not.
        bound(22, now - 10, config.pool_lease),
        LeaseRecord {
            kind: LeaseKind::Free,
            ..bound(22, now - 10, config.pool_lease)
        },
    ];
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("leases.log");
    std::fs::write(
        &log,
        records
            .iter()
            .flat_map(LeaseRecord::encode)
            .collect::<Vec<u8>>(),
    )?;
    let store = LeaseStore::open(&log, StoreOptions::default())?;
    let hosts = vec![
        reservation("02:00:00:00:00:05", at(5), "r5"),
        reservation("02:00:00:00:00:06", at(6), "r6"),
    ];
    let (_tx, rx) = watch::channel(Arc::new(snapshot(LAB_SERVER, hosts)));
    let server = Server::new(config, rx, store);
    let again = server.recent_acks(now, mprov_api::boot::ATTEST_WINDOW);
    let got: Vec<(String, Option<Ipv4Addr>)> =
        again.iter().map(|s| (s.mac.clone(), s.ip)).collect();
    assert_eq!(
        got,
        [
            ("02:00:00:00:00:05".to_owned(), Some(at(5))),
            ("02:00:00:00:00:14".to_owned(), Some(at(20))),
        ]
    );
    assert!(again.iter().all(|s| s.kind == ReplyKind::Ack && !s.proxy));
    Ok(())
}
