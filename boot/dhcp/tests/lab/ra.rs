//! Router advertisements against clients nobody here wrote, in network
//! namespaces: rdisc6 (ndisc6) solicits and prints what it got; the Linux
//! kernel of the client namespace configures an address from the advertised
//! prefix (SLAAC) and must install no default route. Also: a flood of
//! solicitations is answered by a bounded number of advertisements, and
//! malformed ones are counted, not fatal.

use std::collections::HashMap;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use mprov_dhcp::metrics::DropLabels;
use mprov_dhcp::ra::{self, Interface, RaConfig, RaMetrics, SentLabels};
use mprov_tests::netns::{Netns, veth};
use tokio_util::sync::CancellationToken;

/// The upper bound on any wait here; each normally takes about a second
/// (duplicate address detection).
const LIMIT: Duration = Duration::from_secs(20);

/// A server namespace advertising on one end of a veth pair, a client
/// namespace on the other end.
struct RaLab {
    client: Netns,
    client_dev: String,
    /// The advertising interface as the server saw it.
    iface: Interface,
    metrics: RaMetrics,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    _server_ns: Netns,
}

impl RaLab {
    /// Starts the advertiser with `config` on an interface that has
    /// `prefix` (a /64 address, e.g. `fd77:1::1/64`) if given. The client's
    /// kernel sends its own solicitations unless `quiet_client`.
    async fn start(config: RaConfig, prefix: Option<&str>, quiet_client: bool) -> Result<Self> {
        let server_ns = Netns::new("ras")?;
        let client = Netns::new("rac")?;
        // The client is a host: it takes RAs and forms addresses from them.
        let v = veth(&server_ns, &client)?;
        client.exec(
            "sysctl",
            &[
                "-qw",
                &format!("net.ipv6.conf.{}.forwarding=0", v.b),
                &format!("net.ipv6.conf.{}.accept_ra=2", v.b),
                &format!("net.ipv6.conf.{}.autoconf=1", v.b),
                &format!(
                    "net.ipv6.conf.{}.router_solicitations={}",
                    v.b,
                    if quiet_client { 0 } else { 3 }
                ),
            ],
        )?;
        if let Some(p) = prefix {
            server_ns.ip(&["-6", "addr", "add", p, "dev", &v.a, "nodad"])?;
        }
        // An RA needs a link-local source; the kernel makes one when the
        // link comes up and may use it once duplicate address detection ends.
        wait_link_local(&server_ns, &v.a).await?;
        wait_link_local(&client, &v.b).await?;
        let dev = v.a.clone();
        let (iface, socket) = in_ns(&server_ns, move || {
            let iface = Interface::list()?
                .into_iter()
                .find(|i| i.name == dev)
                .with_context(|| format!("{dev} is not listed"))?;
            let socket = ra::open_socket(&iface)?;
            Ok((iface, socket))
        })?;
        ensure!(iface.mac.is_some(), "a veth has a MAC address");
        ensure!(
            iface.link_local().is_some(),
            "the link-local address is listed"
        );
        let metrics = RaMetrics::default();
        let shutdown = CancellationToken::new();
        let server = ra::Server::new(config).with_metrics(metrics.clone());
        let server = tokio::spawn(server.run(vec![(iface.clone(), socket)], shutdown.clone()));
        Ok(Self {
            client,
            client_dev: v.b,
            iface,
            metrics,
            shutdown,
            server,
            _server_ns: server_ns,
        })
    }

    async fn cleanup(self) -> Result<()> {
        ensure!(
            !self.server.is_finished(),
            "the advertiser stopped on its own"
        );
        self.shutdown.cancel();
        tokio::time::timeout(LIMIT, self.server)
            .await
            .context("the advertiser did not stop")???;
        Ok(())
    }

    fn sent(&self, kind: &'static str) -> u64 {
        self.metrics.sent.get_or_create(&SentLabels { kind }).get()
    }

    /// Runs rdisc6 once in the client namespace: one solicitation, the
    /// first advertisement printed as `key: value` lines.
    async fn rdisc6(&self) -> Result<(HashMap<String, String>, String)> {
        let mut cmd = self.client.command("rdisc6");
        cmd.args(["-1", "-n", "-r", "3", "-w", "2000", &self.client_dev]);
        let out = tokio::time::timeout(LIMIT, tokio::process::Command::from(cmd).output())
            .await
            .context("rdisc6 took too long")?
            .context("running rdisc6 (Debian package ndisc6)")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "rdisc6 failed ({}): {text}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let fields = text
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect();
        Ok((fields, text))
    }
}

/// Runs `f` on a thread inside `ns` (`setns` moves only the calling thread;
/// sockets it opens stay in that namespace).
fn in_ns<T: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let path = ns.path();
    std::thread::spawn(move || -> Result<T> {
        let file =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
        f()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("namespace thread panicked"))?
}

/// Polls until `dev` in `ns` has a usable (not tentative) link-local address.
async fn wait_link_local(ns: &Netns, dev: &str) -> Result<()> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let out = ns.ip(&["-6", "addr", "show", "dev", dev, "scope", "link"])?;
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("inet6 fe80") && !text.contains("tentative") {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{dev} has no usable link-local address: {text}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `cond` every 50 ms until it holds or [`LIMIT`] passes.
async fn wait_for(what: &str, mut cond: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + LIMIT;
    while !cond()? {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn mac_text(mac: [u8; 6]) -> String {
    mac.map(|b| format!("{b:02X}")).join(":")
}

/// Only the answers to solicitations: the one unsolicited RA at start, then
/// none for an hour.
fn solicited_only() -> RaConfig {
    RaConfig {
        interval: Duration::from_secs(3600),
        initial_advertisements: 0,
        ..RaConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdisc6_sees_lifetime_0_the_prefix_and_our_link_layer_address() -> Result<()> {
    let lab = RaLab::start(solicited_only(), Some("fd77:1::1/64"), false).await?;
    let (ra, text) = lab.rdisc6().await?;
    let field = |k: &str| {
        ra.get(k)
            .map(String::as_str)
            .with_context(|| format!("rdisc6 printed no {k:?}: {text}"))
    };
    assert_eq!(
        field("Router lifetime")?,
        "0 (0x00000000) seconds",
        "{text}"
    );
    assert_eq!(field("Stateful address conf.")?, "No", "{text}");
    assert_eq!(field("Stateful other conf.")?, "No", "{text}");
    assert_eq!(field("Prefix")?, "fd77:1::/64", "{text}");
    assert_eq!(field("On-link")?, "Yes", "{text}");
    assert_eq!(field("Autonomous address conf.")?, "Yes", "{text}");
    let mac = lab.iface.mac.context("MAC")?;
    assert_eq!(field("Source link-layer address")?, mac_text(mac), "{text}");
    let from = lab.iface.link_local().context("link-local")?;
    assert!(
        text.lines().any(|l| l.trim() == format!("from {from}")),
        "not from our link-local {from}: {text}"
    );
    // rdisc6 printed an answer to its solicitation, not the RA at start.
    assert!(lab.metrics.solicitations.get() >= 1);
    assert!(lab.sent("solicited") >= 1);
    lab.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdisc6_without_a_prefix_sees_no_prefix() -> Result<()> {
    let lab = RaLab::start(solicited_only(), None, false).await?;
    let (ra, text) = lab.rdisc6().await?;
    assert_eq!(
        ra.get("Router lifetime").map(String::as_str),
        Some("0 (0x00000000) seconds"),
        "{text}"
    );
    assert!(!ra.contains_key("Prefix"), "{text}");
    lab.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linux_client_forms_a_slaac_address_and_no_default_route() -> Result<()> {
    let lab = RaLab::start(RaConfig::default(), Some("fd77:2::1/64"), false).await?;
    let dev = lab.client_dev.clone();
    let addr_text = || -> Result<String> {
        let out = lab
            .client
            .ip(&["-6", "addr", "show", "dev", &dev, "scope", "global"])?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    wait_for("a SLAAC address in fd77:2::/64", || {
        let text = addr_text()?;
        Ok(text.lines().any(|l| {
            l.trim_start().starts_with("inet6 fd77:2:")
                && l.contains("/64")
                && !l.contains("tentative")
        }))
    })
    .await?;
    // The address is the client's own (EUI-64 or stable privacy), and the
    // kernel marks it as made from an RA ("dynamic", with lifetimes).
    let text = addr_text()?;
    assert!(text.contains("dynamic"), "{text}");
    let routes = lab.client.ip(&["-6", "route", "show", "table", "all"])?;
    let routes = String::from_utf8_lossy(&routes.stdout);
    assert!(
        routes
            .lines()
            .any(|l| l.starts_with("fd77:2::/64") && l.contains(&dev)),
        "the prefix is on-link: {routes}"
    );
    assert!(
        !routes.lines().any(|l| l.starts_with("default")),
        "router lifetime 0 must not give a default route: {routes}"
    );
    lab.cleanup().await
}

/// A raw ICMPv6 socket in the client namespace on `dev`, sending with
/// `hops` as the IPv6 hop limit.
fn client_socket(ns: &Netns, dev: &str, hops: u32) -> Result<(socket2::Socket, u32)> {
    let dev = dev.to_owned();
    in_ns(ns, move || {
        use socket2::{Domain, Protocol, Socket, Type};
        let index = nix::net::if_::if_nametoindex(dev.as_str())?;
        let s = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
        s.bind_device(Some(dev.as_bytes()))?;
        s.set_multicast_if_v6(index)?;
        s.set_multicast_hops_v6(hops)?;
        Ok((s, index))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_solicitations_gets_few_answers_and_bad_ones_are_counted() -> Result<()> {
    let lab = RaLab::start(solicited_only(), Some("fd77:3::1/64"), true).await?;
    let (good, index) = client_socket(&lab.client, &lab.client_dev, 255)?;
    let (routed, _) = client_socket(&lab.client, &lab.client_dev, 64)?;
    let to = socket2::SockAddr::from(SocketAddrV6::new(
        "ff02::2".parse::<Ipv6Addr>()?,
        0,
        0,
        index,
    ));
    let rs = [133, 0, 0, 0, 0, 0, 0, 0];
    for _ in 0..20 {
        good.send_to(&rs, &to)?;
    }
    // Invalid (RFC 4861 §6.1.1): code 1; an option of length 0; an option
    // running past the end; not from this link (hop limit 64).
    good.send_to(&[133, 1, 0, 0, 0, 0, 0, 0], &to)?;
    good.send_to(&[133, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0], &to)?;
    good.send_to(&[133, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0], &to)?;
    routed.send_to(&rs, &to)?;
    wait_for("every solicitation counted", || {
        Ok(lab.metrics.solicitations.get() == 20 && lab.metrics.malformed.get() == 4)
    })
    .await?;
    let hop_limit = lab
        .metrics
        .drops
        .get_or_create(&DropLabels {
            reason: "hop_limit",
        })
        .get();
    assert_eq!(hop_limit, 1);
    // Give the answers time: with a 500 ms gap, 20 solicitations that
    // arrive within a few milliseconds get one answer at once (or when the
    // gap after the RA at start ends) and one more at most; nothing else
    // solicits here (the client's kernel is told not to).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let answered = lab.sent("solicited");
    assert!(
        (1..=2).contains(&answered),
        "{answered} answers to a flood of 20 solicitations"
    );
    // Still serving: rdisc6 gets its answer.
    let (ra, text) = lab.rdisc6().await?;
    assert_eq!(
        ra.get("Prefix").map(String::as_str),
        Some("fd77:3::/64"),
        "{text}"
    );
    lab.cleanup().await
}
