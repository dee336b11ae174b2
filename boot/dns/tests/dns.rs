//! Integration tests: our server in-process on 127.0.0.1:0, queried by `dig`
//! (BIND's client, which nobody here wrote); dnsmasq plays the upstream
//! resolver for the forwarding test. All traffic stays on loopback.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use mprov_api::boot::BootConfig;
use mprov_dns::sample::{host, snapshot};
use mprov_dns::{DnsConfig, Server};
use prometheus_client::registry::Registry;
use tokio::net::UdpSocket;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Bounded polling: how many tries, and how long between them.
const POLL_TRIES: u32 = 100;
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// One running server and what the test needs to talk to it.
struct TestContext {
    addr: SocketAddr,
    /// `None` once the test closed the snapshot source.
    snapshots: Option<watch::Sender<Arc<BootConfig>>>,
    registry: Registry,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), mprov_dns::ServeError>>,
}

impl TestContext {
    async fn start(snapshot: BootConfig, config: DnsConfig) -> Result<Self> {
        let (udp, tcp) = mprov_dns::bind(([127, 0, 0, 1], 0).into())
            .await
            .context("bind udp and tcp")?;
        let addr = udp.local_addr()?;
        let (snapshots, rx) = watch::channel(Arc::new(snapshot));
        let mut registry = Registry::with_prefix("mprov");
        let server = Server::new(config, rx, &mut registry);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.run(udp, Some(tcp), shutdown.clone()));
        Ok(Self {
            addr,
            snapshots: Some(snapshots),
            registry,
            shutdown,
            task,
        })
    }

    fn send(&self, snapshot: BootConfig) -> Result<()> {
        let tx = self.snapshots.as_ref().context("source closed")?;
        tx.send(Arc::new(snapshot)).context("send snapshot")
    }

    async fn dig(&self, args: &[&str]) -> Result<Dig> {
        dig(self.addr, args).await
    }

    fn metrics(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap_or_default();
        out
    }

    async fn cleanup(self) -> Result<()> {
        self.shutdown.cancel();
        self.task.await.context("server task")?.context("server")?;
        Ok(())
    }
}

/// The parts of a `dig` answer the tests look at.
#[derive(Debug, Default)]
struct Dig {
    status: String,
    flags: Vec<String>,
    answer: Vec<String>,
    authority: Vec<String>,
}

impl Dig {
    /// Answer records as `name TYPE rdata`, without TTL and class.
    fn records(&self) -> Vec<String> {
        self.answer.iter().map(|l| strip_ttl(l)).collect()
    }

    fn has(&self, record: &str) -> bool {
        self.records().iter().any(|r| r == record)
    }
}

fn strip_ttl(line: &str) -> String {
    let f: Vec<&str> = line.split_whitespace().collect();
    match f.as_slice() {
        [name, _ttl, _class, rtype, rest @ ..] => format!("{name} {rtype} {}", rest.join(" ")),
        _ => line.to_string(),
    }
}

async fn dig(addr: SocketAddr, args: &[&str]) -> Result<Dig> {
    let out = Command::new("dig")
        .arg(format!("@{}", addr.ip()))
        .args(["-p", &addr.port().to_string()])
        .args([
            "+tries=1",
            "+time=2",
            "+noall",
            "+comments",
            "+answer",
            "+authority",
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .context("run dig (dnsutils)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "dig {args:?} failed: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut dig = Dig::default();
    let mut section = "";
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(";; ->>HEADER<<-") {
            if let Some(s) = rest.split("status: ").nth(1) {
                dig.status = s.split(',').next().unwrap_or_default().to_string();
            }
        } else if let Some(rest) = line.strip_prefix(";; flags:") {
            let flags = rest.split(';').next().unwrap_or_default();
            dig.flags = flags.split_whitespace().map(String::from).collect();
        } else if line.starts_with(";; ANSWER SECTION") {
            section = "answer";
        } else if line.starts_with(";; AUTHORITY SECTION") {
            section = "authority";
        } else if line.starts_with(';') || line.trim().is_empty() {
            if line.trim().is_empty() {
                section = "";
            }
        } else if section == "answer" {
            dig.answer.push(line.to_string());
        } else if section == "authority" {
            dig.authority.push(line.to_string());
        }
    }
    ensure!(!dig.status.is_empty(), "no status in dig output: {text}");
    Ok(dig)
}

/// Polls `dig` until `done` holds, a bounded number of times.
async fn dig_until(addr: SocketAddr, args: &[&str], done: impl Fn(&Dig) -> bool) -> Result<Dig> {
    let mut last = None;
    for _ in 0..POLL_TRIES {
        match dig(addr, args).await {
            Ok(d) if done(&d) => return Ok(d),
            other => last = Some(other),
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    bail!("condition never held for dig {args:?}; last: {last:?}")
}

#[tokio::test]
async fn authoritative_answers() -> Result<()> {
    let ctx = TestContext::start(snapshot(), DnsConfig::default()).await?;

    let a = ctx.dig(&["c02.cluster.test", "A"]).await?;
    assert_eq!(a.status, "NOERROR", "{a:?}");
    assert!(a.flags.contains(&"aa".to_string()), "authoritative: {a:?}");
    assert_eq!(a.records(), ["c02.cluster.test. A 10.0.0.22"]);

    // Without EDNS, and with the name in another case (RFC 4343).
    let plain = ctx.dig(&["+noedns", "C02.Cluster.TEST", "A"]).await?;
    assert_eq!(plain.status, "NOERROR", "{plain:?}");
    assert!(plain.flags.contains(&"aa".to_string()), "{plain:?}");
    assert_eq!(plain.records().len(), 1, "{plain:?}");
    assert!(plain.records()[0].ends_with(" A 10.0.0.22"), "{plain:?}");

    let aaaa = ctx.dig(&["c01.cluster.test", "AAAA"]).await?;
    assert_eq!(
        aaaa.records(),
        ["c01.cluster.test. AAAA fd00::21"],
        "{aaaa:?}"
    );

    // Aliases are CNAMEs, chased to the host's A record in the same answer.
    let alias = ctx.dig(&["login.cluster.test", "A"]).await?;
    assert_eq!(alias.status, "NOERROR", "{alias:?}");
    assert!(
        alias.has("login.cluster.test. CNAME c01.cluster.test."),
        "{alias:?}"
    );
    assert!(alias.has("c01.cluster.test. A 10.0.0.21"), "{alias:?}");

    let ptr = ctx.dig(&["-x", "10.0.0.23"]).await?;
    assert_eq!(ptr.status, "NOERROR", "{ptr:?}");
    assert_eq!(
        ptr.records(),
        ["23.0.0.10.in-addr.arpa. PTR c03.cluster.test."]
    );

    let ptr6 = ctx.dig(&["-x", "fd00::21"]).await?;
    assert_eq!(ptr6.status, "NOERROR", "{ptr6:?}");
    assert!(
        ptr6.records()[0].ends_with("PTR c01.cluster.test."),
        "{ptr6:?}"
    );

    // Unknown name in our zone: NXDOMAIN with the SOA in the authority
    // section (RFC 2308 §3).
    let nx = ctx.dig(&["nope.cluster.test", "A"]).await?;
    assert_eq!(nx.status, "NXDOMAIN", "{nx:?}");
    assert!(nx.authority.iter().any(|l| l.contains("SOA")), "{nx:?}");

    // A known name without that type: NODATA, not NXDOMAIN.
    let nodata = ctx.dig(&["c02.cluster.test", "AAAA"]).await?;
    assert_eq!(nodata.status, "NOERROR", "{nodata:?}");
    assert!(nodata.answer.is_empty(), "{nodata:?}");

    let soa = ctx.dig(&["cluster.test", "SOA"]).await?;
    let soa_rec = soa.records();
    assert_eq!(soa_rec.len(), 1, "{soa:?}");
    assert!(
        soa_rec[0].starts_with("cluster.test. SOA ns.cluster.test. hostmaster.cluster.test. 42 "),
        "{soa:?}"
    );
    let ns = ctx.dig(&["cluster.test", "NS"]).await?;
    assert_eq!(ns.records(), ["cluster.test. NS ns.cluster.test."]);
    let rsoa = ctx.dig(&["0.0.10.in-addr.arpa", "SOA"]).await?;
    assert_eq!(rsoa.status, "NOERROR", "{rsoa:?}");
    assert_eq!(rsoa.records().len(), 1, "{rsoa:?}");

    // Over TCP too.
    let tcp = ctx.dig(&["+tcp", "c03.cluster.test", "A"]).await?;
    assert_eq!(tcp.records(), ["c03.cluster.test. A 10.0.0.23"], "{tcp:?}");

    // No upstream resolvers: outside names are refused.
    let outside = ctx.dig(&["example.org", "A"]).await?;
    assert_eq!(outside.status, "REFUSED", "{outside:?}");

    let metrics = ctx.metrics();
    for want in [
        "mprov_dns_queries_total 13",
        "mprov_dns_responses_total{rcode=\"noerror\"} 11",
        "mprov_dns_responses_total{rcode=\"nxdomain\"} 1",
        "mprov_dns_responses_total{rcode=\"refused\"} 1",
        "mprov_dns_refused_total 1",
        "mprov_dns_forwarded_total 0",
    ] {
        assert!(metrics.contains(want), "missing {want} in:\n{metrics}");
    }
    ctx.cleanup().await
}

#[tokio::test]
async fn live_update_adds_and_removes_names() -> Result<()> {
    let ctx = TestContext::start(snapshot(), DnsConfig::default()).await?;
    let before = ctx.dig(&["c04.cluster.test", "A"]).await?;
    assert_eq!(before.status, "NXDOMAIN", "{before:?}");

    let mut next = snapshot();
    next.revision = 43;
    next.hosts.retain(|h| h.hostname != "c03");
    next.hosts
        .push(host("c04", "prov", [10, 0, 0, 24], &["new"]));
    ctx.send(next)?;

    let added = dig_until(ctx.addr, &["c04.cluster.test", "A"], |d| {
        d.status == "NOERROR"
    })
    .await?;
    assert_eq!(added.records(), ["c04.cluster.test. A 10.0.0.24"]);
    // The same generation holds the rest of the change.
    let gone = ctx.dig(&["c03.cluster.test", "A"]).await?;
    assert_eq!(gone.status, "NXDOMAIN", "{gone:?}");
    let alias = ctx.dig(&["new.cluster.test", "A"]).await?;
    assert!(alias.has("c04.cluster.test. A 10.0.0.24"), "{alias:?}");
    let ptr = ctx.dig(&["-x", "10.0.0.24"]).await?;
    assert_eq!(
        ptr.records(),
        ["24.0.0.10.in-addr.arpa. PTR c04.cluster.test."]
    );
    let soa = ctx.dig(&["cluster.test", "SOA"]).await?;
    assert!(
        soa.records()[0].contains(" 43 "),
        "serial follows the revision: {soa:?}"
    );
    assert!(ctx.metrics().contains("mprov_dns_zone_reloads_total 1"));

    // The sender going away leaves the last snapshot serving.
    let mut ctx = ctx;
    ctx.snapshots = None;
    let still = ctx.dig(&["c04.cluster.test", "A"]).await?;
    assert_eq!(still.status, "NOERROR", "{still:?}");
    ctx.cleanup().await
}

/// Runs dnsmasq as a fake upstream on a free loopback port.
struct Dnsmasq {
    child: Child,
    addr: SocketAddr,
}

impl Dnsmasq {
    async fn start() -> Result<Self> {
        // Pick a port free for both UDP and TCP, then release it for dnsmasq.
        let port = {
            let (udp, _tcp) = mprov_dns::bind(([127, 0, 0, 1], 0).into()).await?;
            udp.local_addr()?.port()
        };
        let child = Command::new("dnsmasq")
            .args([
                "--no-daemon",
                "--conf-file=/dev/null",
                &format!("--port={port}"),
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                "--no-resolv",
                "--no-hosts",
                "--address=/example.test/192.0.2.7",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("start dnsmasq (dnsmasq-base)")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut this = Self { child, addr };
        // Bounded polling until it answers.
        let ready = dig_until(addr, &["probe.example.test", "A"], |d| {
            d.status == "NOERROR"
        })
        .await;
        if let Err(err) = ready {
            this.stop().await;
            return Err(err.context("dnsmasq did not come up"));
        }
        Ok(this)
    }

    /// Stops the dnsmasq we started, by its PID.
    async fn stop(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

#[tokio::test]
async fn forwards_outside_names_to_upstream() -> Result<()> {
    let mut upstream = Dnsmasq::start().await?;
    let mut config = snapshot();
    config.upstream_resolvers = vec![upstream.addr.ip()];
    let ctx = TestContext::start(
        config,
        DnsConfig {
            upstream_port: upstream.addr.port(),
            ..DnsConfig::default()
        },
    )
    .await?;

    let fwd = ctx.dig(&["www.example.test", "A"]).await?;
    assert_eq!(fwd.status, "NOERROR", "{fwd:?}");
    assert_eq!(fwd.records(), ["www.example.test. A 192.0.2.7"], "{fwd:?}");
    assert!(
        !fwd.flags.contains(&"aa".to_string()),
        "forwarded, not ours: {fwd:?}"
    );
    // Our own zone is still answered by us, not forwarded.
    let own = ctx.dig(&["c01.cluster.test", "A"]).await?;
    assert!(own.flags.contains(&"aa".to_string()), "{own:?}");

    let metrics = ctx.metrics();
    assert!(metrics.contains("mprov_dns_forwarded_total 1"), "{metrics}");

    // Dropping the upstreams live turns forwarding into REFUSED.
    let mut next = snapshot();
    next.revision = 43;
    ctx.send(next)?;
    dig_until(ctx.addr, &["www.example.test", "A"], |d| {
        d.status == "REFUSED"
    })
    .await?;

    ctx.cleanup().await?;
    upstream.stop().await;
    Ok(())
}

#[tokio::test]
async fn drops_garbage_and_keeps_serving() -> Result<()> {
    let ctx = TestContext::start(snapshot(), DnsConfig::default()).await?;
    let client = UdpSocket::bind("127.0.0.1:0").await?;
    // Too short, a response (QR set), and a header promising records that
    // are not there.
    let short = [0u8; 5];
    let mut response = [0u8; 12];
    response[2] = 0x80;
    let mut truncated = [0u8; 12];
    truncated[5] = 1; // one question, missing
    let mut junk = [0xffu8; 512];
    junk[2] = 0x01; // a query (QR clear) with absurd section counts
    for packet in [&short[..], &response[..], &truncated[..], &junk[..]] {
        client.send_to(packet, ctx.addr).await?;
    }
    // Parsing happens in spawned tasks, so poll the counters (bounded).
    let mut metrics = String::new();
    for _ in 0..POLL_TRIES {
        metrics = ctx.metrics();
        if metrics.contains("reason=\"short\"} 1")
            && metrics.contains("reason=\"response\"} 1")
            && metrics.contains("reason=\"malformed\"}")
        {
            break;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    assert!(
        metrics.contains("mprov_dns_dropped_total{reason=\"short\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mprov_dns_dropped_total{reason=\"response\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mprov_dns_dropped_total{reason=\"malformed\"}"),
        "{metrics}"
    );

    // Nothing was answered: a reply would be waiting on the client socket.
    let mut buf = [0u8; 512];
    assert!(
        client.try_recv_from(&mut buf).is_err(),
        "garbage must not be answered"
    );

    let a = ctx.dig(&["c01.cluster.test", "A"]).await?;
    assert_eq!(a.status, "NOERROR", "{a:?}");
    ctx.cleanup().await
}

/// Sums the values of every series of one metric family.
fn sum_metric(metrics: &str, family: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(family) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A wire-format A query for `name` (RFC 1035 §4.1).
fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::new();
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

#[tokio::test]
async fn random_packets_are_all_accounted_for() -> Result<()> {
    // Every packet must end up either dropped (counted by reason) or
    // answered (counted by rcode): a panicking handler would leave a gap.
    // Sent in batches, waiting for each to be accounted for, so that the
    // kernel's socket buffer never overflows.
    let ctx = TestContext::start(snapshot(), DnsConfig::default()).await?;
    let client = UdpSocket::bind("127.0.0.1:0").await?;
    let valid = query(7, "c01.cluster.test");
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift64: deterministic, so a failure reproduces.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut sent = 0u64;
    for _batch in 0..20 {
        for i in 0..25 {
            let packet = if i % 2 == 0 {
                // A valid query with a few bytes mutated.
                let mut p = valid.clone();
                for _ in 0..(next() % 4 + 1) {
                    let at = (next() as usize) % p.len();
                    p[at] = next() as u8;
                }
                p.truncate((next() as usize) % (p.len() + 1));
                p
            } else {
                let len = (next() % 300) as usize;
                (0..len).map(|_| next() as u8).collect()
            };
            client.send_to(&packet, ctx.addr).await?;
            sent += 1;
        }
        let mut accounted = 0;
        for _ in 0..POLL_TRIES {
            let m = ctx.metrics();
            accounted = sum_metric(&m, "mprov_dns_dropped_total")
                + sum_metric(&m, "mprov_dns_responses_total");
            if accounted >= sent {
                break;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        assert_eq!(accounted, sent, "{}", ctx.metrics());
    }
    let a = ctx.dig(&["c01.cluster.test", "A"]).await?;
    assert_eq!(a.status, "NOERROR", "{a:?}");
    ctx.cleanup().await
}
