//! `mprov-jobserver`'s DHCP server as a new user meets it, the real process
//! in a namespace, real clients in another:
//! - a flood of DISCOVERs from 1,000 random MACs that never REQUEST, against
//!   a pool of 50, does not starve it: busybox udhcpc still gets an address
//!   within its first retry, a lease taken before the flood keeps its
//!   address, the exhaustion is warned about once and shows on `/metrics`;
//! - an address the inventory gives a host without a MAC (a BMC) never comes
//!   from the pool, and the overlap is warned about when the snapshot loads;
//! - UEFI HTTP boot: the `--http-boot-url` flag and a network's
//!   `http_boot_url` answer a captured OVMF-style HTTP boot DISCOVER (no
//!   QEMU here: see the report) with the URL and class `HTTPClient`;
//! - proxyDHCP beside a site's DHCP server (busybox udhcpd): udhcpc and ISC
//!   dhclient still get their address from the site server, and a PXE
//!   client's boot server request on port 4011 (a captured UEFI PXE
//!   DHCPREQUEST, sent by a scripted client) is answered with the boot file;
//!   real PXE clients (OVMF's, then the iPXE it loads; one VM) take the OFFER
//!   without a boot file, ask on port 4011 and boot what that ACK names.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::{KillOnDrop, plain, spawn_standalone, standalone_jobserver};
use anyhow::{Context as _, Result, bail, ensure};
use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode};
use dhcproto::{Decodable, Encodable};
use mprov_tests::listen::Listening;
use mprov_tests::netns::{Netns, parse_env, veth, write_script};

const METRICS: &str = "http://127.0.0.1:9102/metrics";

/// Starts `mprov-jobserver` in `ns` with DHCP only (and `extra` flags),
/// serving `snapshot`; waits until its DHCP socket is up.
fn start(ns: &Netns, dir: &Path, snapshot: &str, extra: &[&str]) -> Result<(KillOnDrop, Log)> {
    let mut args = vec!["--no-tftp", "--no-ra"];
    args.extend_from_slice(extra);
    start_with_tftp(ns, dir, snapshot, &args)
}

/// [`start`] without `--no-tftp`.
fn start_with_tftp(
    ns: &Netns,
    dir: &Path,
    snapshot: &str,
    extra: &[&str],
) -> Result<(KillOnDrop, Log)> {
    let config = dir.join("boot.json");
    std::fs::write(&config, snapshot)?;
    let path = dir.join("jobserver.log");
    let mut cmd = standalone_jobserver(ns, &config, &path)?;
    cmd.arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--no-dns")
        .args(extra);
    let (child, bound) = spawn_standalone(cmd, &path)?;
    Ok((child, Log { path, bound }))
}

/// The job server's log file, and where it listens.
struct Log {
    path: std::path::PathBuf,
    /// Its listen file.
    bound: Listening,
}

impl Log {
    fn text(&self) -> String {
        std::fs::read_to_string(&self.path).unwrap_or_default()
    }

    /// Polls (bounded, 20 s) until the log has `what`.
    fn wait_for(&self, what: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.text().contains(what) {
            if Instant::now() > deadline {
                bail!("no {what:?} in the job server log:\n{}", self.text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

/// The metrics text, fetched with curl in `ns`.
fn metrics(ns: &Netns) -> Result<String> {
    let out = ns
        .command("curl")
        .args(["-sS", "--max-time", "5", METRICS])
        .stdin(Stdio::null())
        .output()
        .context("running curl")?;
    ensure!(out.status.success(), "curl {METRICS} failed");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The value of the metric line starting with `name` (labels included).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// busybox udhcpc on `dev` in `ns`: `tries` DISCOVERs `pause` seconds apart
/// (so `tries = 2` is the first try and its first retry); the variables its
/// script saw on `bound`, or the reason it failed.
fn udhcpc(
    ns: &Netns,
    dev: &str,
    dir: &Path,
    tries: u32,
    pause: u32,
) -> Result<HashMap<String, String>> {
    let script = dir.join("udhcpc.sh");
    write_script(&script, "#!/bin/sh\n[ \"$1\" = bound ] && env\nexit 0\n")?;
    let out = ns
        .command("udhcpc")
        .args(["-q", "-n", "-f", "-i", dev])
        .args([
            "-t",
            &tries.to_string(),
            "-T",
            &pause.to_string(),
            "-A",
            "1",
        ])
        .arg("-s")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .context("running udhcpc (busybox)")?;
    if !out.status.success() {
        bail!(
            "udhcpc got no lease: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(parse_env(&String::from_utf8_lossy(&out.stdout)))
}

/// Every DHCP reply `socket` receives until it has been quiet for `quiet`.
fn replies(socket: &UdpSocket, quiet: Duration) -> Result<Vec<Message>> {
    socket.set_read_timeout(Some(quiet))?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1500];
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match socket.recv_from(&mut buf) {
            Ok((n, _)) => {
                if let Ok(m) = Message::from_bytes(&buf[..n]) {
                    got.push(m);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(got)
}

/// A DISCOVER from `mac` with transaction id `xid`.
fn discover(mac: [u8; 6], xid: u32) -> Vec<u8> {
    let mut m = Message::new_with_id(
        xid,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &mac,
    );
    m.set_flags(dhcproto::v4::Flags::default().set_broadcast());
    m.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Discover));
    m.to_vec().expect("a DISCOVER encodes")
}

fn string_opt(m: &Message, code: OptionCode) -> Option<String> {
    match m.opts().get(code) {
        Some(DhcpOption::BootfileName(b)) | Some(DhcpOption::ClassIdentifier(b)) => {
            Some(String::from_utf8_lossy(b).into_owned())
        }
        _ => None,
    }
}

/// Sends the captured OVMF-style UEFI HTTP boot DISCOVER from `socket` to
/// `to` and checks the answer (within `wait`): the boot file `url`, class
/// `HTTPClient`.
fn http_boot_answered(socket: &UdpSocket, to: SocketAddr, wait: Duration, url: &str) -> Result<()> {
    let http = Message::from_bytes(include_bytes!(
        "../../dhcp/src/testdata/uefi-http-discover.bin"
    ))?;
    socket.send_to(&http.to_vec()?, to)?;
    let answer = replies(socket, wait)?
        .into_iter()
        .find(|m| m.xid() == http.xid() && m.chaddr()[..6] == http.chaddr()[..6])
        .context("no answer to the HTTP boot DISCOVER")?;
    assert_eq!(
        string_opt(&answer, OptionCode::BootfileName).as_deref(),
        Some(url)
    );
    assert_eq!(
        string_opt(&answer, OptionCode::ClassIdentifier).as_deref(),
        Some("HTTPClient")
    );
    Ok(())
}

/// A namespace for one VM: tap device `tap0` holding `addrs` (CIDR), up.
fn tap_netns(prefix: &str, addrs: &[&str]) -> Result<Netns> {
    let ns = Netns::new(prefix)?;
    ns.ip(&["tuntap", "add", "dev", "tap0", "mode", "tap"])?;
    for addr in addrs {
        ns.add_addr("tap0", addr)?;
    }
    ns.up("tap0")?;
    Ok(ns)
}

/// The folder `root` a VM boots from: Debian's `snponly.efi`, `boot.ipxe`
/// holding `script`, and the file `(name, text)` that only a booted script
/// asks for.
fn boot_root(root: &Path, script: &str, (name, text): (&str, &str)) -> Result<PathBuf> {
    std::fs::create_dir_all(root)?;
    std::fs::copy("/usr/lib/ipxe/snponly.efi", root.join("snponly.efi"))
        .context("/usr/lib/ipxe/snponly.efi is missing: install ipxe")?;
    std::fs::write(root.join("boot.ipxe"), script)?;
    std::fs::write(root.join(name), text)?;
    Ok(root.to_owned())
}

/// A site's own DHCP server beside the job server: busybox udhcpd on
/// `iface` in `ns` (its files in `dir`), leasing `first..=last` on a /24,
/// with the extra `udhcpd.conf` lines `more`.
fn site_udhcpd(
    ns: &Netns,
    dir: &Path,
    iface: &str,
    (first, last): (&str, &str),
    more: &str,
) -> Result<KillOnDrop> {
    let conf = dir.join("udhcpd.conf");
    let leases = dir.join("udhcpd.leases");
    std::fs::write(
        &conf,
        format!(
            "start {first}\nend {last}\ninterface {iface}\nlease_file {}\nopt subnet 255.255.255.0\n{more}",
            leases.display()
        ),
    )?;
    std::fs::write(&leases, "")?;
    Ok(KillOnDrop(
        ns.command("busybox")
            .args(["udhcpd", "-f"])
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting busybox udhcpd")?,
    ))
}

/// Polls `done` every `pause` until it holds, for at most 300 s (a VM's
/// boot under TCG); then fails with `failure`'s text.
fn wait_until(
    pause: Duration,
    done: impl Fn() -> bool,
    failure: impl FnOnce() -> String,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !done() {
        if Instant::now() > deadline {
            bail!(failure());
        }
        std::thread::sleep(pause);
    }
    Ok(())
}

/// A small deterministic generator (xorshift) for the flood's MACs: random
/// enough, and a failure can be replayed.
fn flood_macs(n: usize) -> Vec<[u8; 6]> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_be_bytes();
        // Locally administered, unicast.
        let mac = [(b[0] & 0xfc) | 0x02, b[1], b[2], b[3], b[4], b[5]];
        if seen.insert(mac) {
            out.push(mac);
        }
    }
    out
}

const FLOOD_SNAPSHOT: &str = r#"{
  "revision": 3,
  "networks": [{
    "slug": "prov", "subnet": "10.79.0.0", "prefix": 24, "domain": "lab",
    "gateway": "10.79.0.254", "dhcp": true,
    "pool": ["10.79.0.100", "10.79.0.149"]
  }],
  "hosts": [
    {"hostname": "bmc01", "ipv4": "10.79.0.120", "network": "prov", "netboot": false, "bootable": false}
  ]
}"#;

#[test]
fn jobserver_pool_survives_a_discover_flood() -> Result<()> {
    let server = Netns::new("jsdf")?;
    let client = Netns::new("jsdc")?;
    let v = veth(&server, &client)?;
    server.add_addr(&v.a, "10.79.0.1/24")?;
    let dir = tempfile::tempdir()?;
    let (_js, log) = start(
        &server,
        dir.path(),
        FLOOD_SNAPSHOT,
        &[
            "--server-ip",
            "10.79.0.1",
            "--dhcp-interface",
            &v.a,
            "--no-http",
            "--http-boot-url",
            "http://10.79.0.1:8081/boot/snponly.efi",
            "--metrics",
            "127.0.0.1:9102",
        ],
    )?;
    // The pool covers the BMC's address: warned about when the snapshot loads.
    let text = log.text();
    let overlap = text
        .lines()
        .find(|l| l.contains("covers 1 address(es) the inventory assigns"))
        .with_context(|| format!("no overlap warning:\n{text}"))?;
    assert!(
        overlap.contains("[W]") && overlap.contains("10.79.0.120"),
        "{overlap}"
    );

    // A first client confirms a lease before the flood.
    client.set_mac(&v.b, "02:00:5e:79:00:01")?;
    let first = udhcpc(&client, &v.b, dir.path(), 3, 1)?;
    let leased: Ipv4Addr = first.get("ip").context("no ip")?.parse()?;
    assert!(
        (u32::from(Ipv4Addr::new(10, 79, 0, 100))..=u32::from(Ipv4Addr::new(10, 79, 0, 149)))
            .contains(&u32::from(leased)),
        "{leased}"
    );
    client.ip(&["addr", "flush", "dev", &v.b])?;

    // The flood: 1,000 MACs, one DISCOVER each, never a REQUEST. Sent in
    // bursts of 50 so the server's socket buffer holds every burst.
    client.set_mac(&v.b, "02:00:5e:79:00:02")?;
    client.add_addr(&v.b, "10.79.0.250/24")?;
    let socket = client.bind_udp(SocketAddr::from(([0, 0, 0, 0], 68)), &v.b)?;
    let to = SocketAddr::from(([255, 255, 255, 255], 67));
    let macs = flood_macs(1000);
    let mut offers = Vec::new();
    for (burst, chunk) in macs.chunks(50).enumerate() {
        for (i, mac) in chunk.iter().enumerate() {
            socket.send_to(&discover(*mac, (burst * 50 + i) as u32), to)?;
        }
        offers.extend(replies(&socket, Duration::from_millis(300))?);
    }
    offers.extend(replies(&socket, Duration::from_millis(500))?);
    let flood: HashSet<[u8; 6]> = macs.iter().copied().collect();
    let offers: Vec<&Message> = offers
        .iter()
        .filter(|m| <[u8; 6]>::try_from(&m.chaddr()[..6]).is_ok_and(|mac| flood.contains(&mac)))
        .collect();
    // Every flooding MAC got an offer (none was left unanswered), none of
    // them the confirmed lease's address or the BMC's.
    assert!(
        offers.len() >= 990,
        "only {} offers to the flood",
        offers.len()
    );
    for o in &offers {
        let ip = o.yiaddr();
        assert_ne!(ip, leased, "a confirmed lease was offered to a flooder");
        assert_ne!(
            ip,
            Ipv4Addr::new(10, 79, 0, 120),
            "the BMC's address was offered"
        );
    }

    // A new client right after the flood, while all 49 other addresses
    // are held by offers: udhcpc gets an address within its first retry.
    client.ip(&["addr", "flush", "dev", &v.b])?;
    client.set_mac(&v.b, "02:00:5e:79:00:03")?;
    let newcomer = udhcpc(&client, &v.b, dir.path(), 2, 2)?;
    let got: Ipv4Addr = newcomer.get("ip").context("no ip")?.parse()?;
    assert_ne!(got, leased);
    assert_ne!(got, Ipv4Addr::new(10, 79, 0, 120));

    // One warning for the episode, with the network and the counts.
    let text = log.text();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("is exhausted"))
        .collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(warnings[0].contains("[W]"), "{}", warnings[0]);
    assert!(
        warnings[0].contains("network prov") && warnings[0].contains("of its 50 addresses"),
        "{}",
        warnings[0]
    );
    let m = metrics(&server)?;
    assert_eq!(
        metric(&m, "mprov_dhcp_pool_exhausted{network=\"prov\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "mprov_dhcp_pool_exhaustions_total{network=\"prov\"}"),
        Some(1.0),
        "{m}"
    );
    let reclaimed =
        metric(&m, "mprov_dhcp_offers_reclaimed_total{network=\"prov\"}").unwrap_or(0.0);
    assert!(reclaimed >= 940.0, "{m}");

    // UEFI HTTP boot, from the flag: a captured HTTP boot DISCOVER.
    client.add_addr(&v.b, "10.79.0.250/24")?;
    http_boot_answered(
        &socket,
        to,
        Duration::from_millis(500),
        "http://10.79.0.1:8081/boot/snponly.efi",
    )
}

#[test]
fn jobserver_http_boot_url_from_the_boot_config() -> Result<()> {
    let server = Netns::new("jshb")?;
    let client = Netns::new("jshc")?;
    let v = veth(&server, &client)?;
    server.add_addr(&v.a, "10.79.2.1/24")?;
    let dir = tempfile::tempdir()?;
    let snapshot = r#"{"revision": 1, "networks": [{"slug": "prov", "subnet": "10.79.2.0", "prefix": 24,
        "dhcp": true, "pool": ["10.79.2.100", "10.79.2.110"],
        "http_boot_url": "http://10.79.2.5/efi/boot.efi"}]}"#;
    // No --http-boot-url and no image server: only the network's URL.
    let (_js, _log) = start(
        &server,
        dir.path(),
        snapshot,
        &[
            "--server-ip",
            "10.79.2.1",
            "--dhcp-interface",
            &v.a,
            "--no-http",
            "--metrics",
            "127.0.0.1:0",
        ],
    )?;
    client.add_addr(&v.b, "10.79.2.250/24")?;
    let socket = client.bind_udp(SocketAddr::from(([0, 0, 0, 0], 68)), &v.b)?;
    http_boot_answered(
        &socket,
        SocketAddr::from(([255, 255, 255, 255], 67)),
        Duration::from_millis(1000),
        "http://10.79.2.5/efi/boot.efi",
    )
}

#[test]
fn jobserver_proxy_dhcp_beside_a_site_server_and_on_port_4011() -> Result<()> {
    let server = Netns::new("jspx")?;
    let client = Netns::new("jspc")?;
    let v = veth(&server, &client)?;
    // The site's DHCP server has the link's first address, the job server
    // a second one.
    server.add_addr(&v.a, "10.79.1.1/24")?;
    server.add_addr(&v.a, "10.79.1.2/24")?;
    let dir = tempfile::tempdir()?;
    // The site's own DHCP server: busybox udhcpd, on the same link.
    let _site = site_udhcpd(
        &server,
        dir.path(),
        &v.a,
        ("10.79.1.50", "10.79.1.60"),
        "opt router 10.79.1.254\n",
    )?;
    // The script URL the control service hands out, as the contract builds it.
    let snapshot = serde_json::json!({
        "revision": 1,
        "networks": [{"slug": "prov", "subnet": "10.79.1.0", "prefix": 24, "dhcp": true}],
        "boot": {"ipxe_script_url": mprov_api::boot::ipxe_chain_url("http://10.79.1.1:8080")},
    })
    .to_string();
    let (_js, log) = start(
        &server,
        dir.path(),
        &snapshot,
        &[
            "--server-ip",
            "10.79.1.2",
            "--dhcp-interface",
            &v.a,
            "--proxy-dhcp",
            "--no-http",
            "--metrics",
            "127.0.0.1:9102",
        ],
    )?;
    // 4011 on the server identifier, not on the wildcard.
    assert_eq!(log.bound.get("pxe")?, "10.79.1.2:4011".parse()?);

    // Ordinary clients get their address from the site server, undisturbed.
    client.set_mac(&v.b, "02:00:5e:79:01:01")?;
    let u = udhcpc(&client, &v.b, dir.path(), 3, 1)?;
    assert_eq!(
        u.get("serverid").map(String::as_str),
        Some("10.79.1.1"),
        "{u:?}"
    );
    let ip = u.get("ip").context("udhcpc: no ip")?;
    assert!(ip.starts_with("10.79.1.5") || ip == "10.79.1.60", "{u:?}");
    client.ip(&["addr", "flush", "dev", &v.b])?;
    client.set_mac(&v.b, "02:00:5e:79:01:02")?;
    let d = client.dhclient(&v.b, dir.path(), Duration::from_secs(20))?;
    let ip = d.get("new_ip_address").context("dhclient: no ip")?.clone();
    assert!(ip.starts_with("10.79.1.5") || ip == "10.79.1.60", "{d:?}");
    let m = metrics(&server)?;
    assert!(
        metric(&m, "mprov_dhcp_drops_total{reason=\"not_pxe\"}").unwrap_or(0.0) >= 2.0,
        "the proxy should have left both clients alone: {m}"
    );
    assert_eq!(metric(&m, "mprov_dhcp_acks_total"), Some(0.0), "{m}");

    // A PXE client with its address asks the boot server on port 4011.
    let mut req = Message::from_bytes(include_bytes!(
        "../../dhcp/src/testdata/pxe-efi64-request.bin"
    ))?;
    let ciaddr: Ipv4Addr = ip.parse()?;
    req.set_ciaddr(ciaddr);
    req.opts_mut().remove(OptionCode::ServerIdentifier);
    req.opts_mut().remove(OptionCode::RequestedIpAddress);
    req.opts_mut().insert(DhcpOption::VendorExtensions(vec![
        71, 4, 0x80, 0x00, 0x00, 0x00, 255,
    ]));
    client.add_addr(&v.b, &format!("{ciaddr}/24"))?;
    let socket = client.bind_udp(SocketAddr::from((ciaddr, 68)), &v.b)?;
    socket.send_to(&req.to_vec()?, SocketAddr::from(([10, 79, 1, 2], 4011)))?;
    let ack = replies(&socket, Duration::from_millis(1000))?
        .into_iter()
        .find(|m| m.xid() == req.xid())
        .context("no answer on port 4011")?;
    assert_eq!(ack.opts().msg_type(), Some(MessageType::Ack));
    assert_eq!(ack.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(
        string_opt(&ack, OptionCode::BootfileName).as_deref(),
        Some("snponly.efi")
    );
    assert_eq!(ack.siaddr(), Ipv4Addr::new(10, 79, 1, 2));
    assert_eq!(
        string_opt(&ack, OptionCode::ClassIdentifier).as_deref(),
        Some("PXEClient")
    );
    assert_eq!(
        ack.opts().get(OptionCode::VendorExtensions),
        Some(&DhcpOption::VendorExtensions(vec![
            71, 4, 0x80, 0, 0, 0, 255
        ]))
    );
    Ok(())
}

/// proxyDHCP with real PXE clients, the PXE way: QEMU's OVMF with its own
/// PXE client (EDK2 PxeBcDxe over virtio-net, no option ROM) gets its address
/// from the site server (busybox udhcpd) and from our OFFER on port 67 only
/// class PXEClient and the PXE options, no boot file; so it asks us again on
/// port 4011, and that ACK names `snponly.efi`, which it fetches from our
/// TFTP and starts. That iPXE does its own DHCP, gets the same kind of OFFER,
/// asks on 4011 too and gets its script's URL, runs the script (from our
/// TFTP), which fetches a file only a booted script asks for. The job
/// server's `/metrics` and log show both port-4011 exchanges. (Debian's iPXE
/// has no `poweroff`: the test stops the VM.)
#[test]
fn jobserver_proxy_dhcp_boots_ovmf_and_ipxe_through_port_4011() -> Result<()> {
    use mprov_tests::vm::{Firmware, Vm, VmSpec};
    let ns = tap_netns("jspq", &["10.79.5.1/24", "10.79.5.2/24"])?;
    let dir = tempfile::tempdir()?;
    let root = boot_root(
        &dir.path().join("tftp"),
        "#!ipxe\nimgfetch tftp://10.79.5.2/proxy-ok.txt\n",
        ("proxy-ok.txt", "booted through proxyDHCP\n"),
    )?;
    let _site = site_udhcpd(&ns, dir.path(), "tap0", ("10.79.5.50", "10.79.5.60"), "")?;
    let snapshot = r#"{"revision": 1, "networks": [{"slug": "prov", "subnet": "10.79.5.0", "prefix": 24, "dhcp": true}],
        "boot": {"ipxe_script_url": "tftp://10.79.5.2/boot.ipxe"}}"#;
    let root_arg = root.to_string_lossy().into_owned();
    let (_js, log) = start_with_tftp(
        &ns,
        dir.path(),
        snapshot,
        &[
            "--server-ip",
            "10.79.5.2",
            "--dhcp-interface",
            "tap0",
            "--proxy-dhcp",
            "--no-http",
            "--tftp",
            "10.79.5.2:69",
            "--tftp-root",
            &root_arg,
            "--metrics",
            "127.0.0.1:9102",
        ],
    )?;
    assert_eq!(log.bound.get("pxe")?, "10.79.5.2:4011".parse()?);
    let vm = Vm::boot(&VmSpec {
        netns: ns.name().to_owned(),
        tap: "tap0".into(),
        mac: "52:54:00:79:05:01".into(),
        firmware: Firmware::Uefi,
        // No option ROM: OVMF's own PXE client, not the NIC's iPXE.
        nic: "virtio-net-pci,romfile=".into(),
        run_dir: dir.path().join("vm"),
    })?;
    // The file field, as the log writes it.
    wait_until(
        Duration::from_millis(200),
        || log.text().contains("\"proxy-ok.txt\""),
        || {
            format!(
                "the VM did not run the script from proxyDHCP; console:\n{}\njob server log:\n{}",
                vm.console(),
                log.text()
            )
        },
    )?;
    let m = metrics(&ns)?;
    let text = plain(&log.text());
    // Port 4011 answered twice: OVMF (its boot file) and then iPXE (its
    // script), in that order, and each file then came over TFTP.
    assert!(
        metric(&m, "mprov_dhcp_pxe_acks_total").unwrap_or(0.0) >= 2.0,
        "{m}"
    );
    // The number of the first log line that has all of `what`.
    let at = |what: &[&str]| {
        text.lines()
            .position(|l| what.iter().all(|w| l.contains(w)))
            .with_context(|| format!("no line with {what:?} in the job server log:\n{text}"))
    };
    let sent_4011 = "proxyDHCP: boot file sent";
    let efi_4011 = at(&[sent_4011, "file=snponly.efi"])?;
    let efi_tftp = at(&["tftp: sent", "file=\"snponly.efi\""])?;
    let script_4011 = at(&[sent_4011, "file=tftp://10.79.5.2/boot.ipxe"])?;
    let script_tftp = at(&["tftp: sent", "file=\"boot.ipxe\""])?;
    assert!(
        efi_4011 < efi_tftp && efi_tftp < script_4011 && script_4011 < script_tftp,
        "{text}"
    );
    // Boot information only: OFFERs on 67, ACKs only on 4011 (the REQUEST
    // naming udhcpd left alone), no lease.
    assert!(
        metric(&m, "mprov_dhcp_offers_total").unwrap_or(0.0) >= 2.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "mprov_dhcp_acks_total"),
        metric(&m, "mprov_dhcp_pxe_acks_total"),
        "{m}"
    );
    assert_eq!(metric(&m, "mprov_dhcp_leases"), Some(0.0), "{m}");
    let console = vm.console();
    assert!(console.contains("NBP filename is snponly.efi"), "{console}");
    assert!(
        console.contains("Filename: tftp://10.79.5.2/boot.ipxe"),
        "{console}"
    );
    // The address is the site server's, from its pool.
    assert!(
        console.contains("net0: 10.79.5.5") || console.contains("net0: 10.79.5.60"),
        "{console}"
    );
    drop(vm);
    Ok(())
}

/// UEFI HTTP boot with the real firmware: Debian's OVMF (EDK2 HttpBootDxe
/// over virtio-net, no option ROM; its PXE boot options turned off through
/// fw_cfg so HTTP boot is tried first) sends its HTTP boot DISCOVER
/// (architecture 16, class `HTTPClient`) to our job server, which answers
/// with the `--http-boot-url` default, the x86-64 iPXE binary on its own
/// image server; OVMF downloads it over HTTP and starts it; that iPXE gets
/// its script's URL from the same DHCP server and runs the script, fetched
/// from our image server, which fetches a file only a booted script asks for.
#[test]
fn jobserver_boots_ovmf_over_uefi_http_boot() -> Result<()> {
    let ns = tap_netns("jshv", &["10.79.6.1/24"])?;
    let dir = tempfile::tempdir()?;
    let root = boot_root(
        &dir.path().join("boot"),
        "#!ipxe\nimgfetch http://10.79.6.1:8081/boot/http-ok.txt && echo HTTP-BOOT-SCRIPT-OK\n",
        ("http-ok.txt", "booted through UEFI HTTP boot\n"),
    )?;
    let export = dir.path().join("export");
    std::fs::create_dir_all(&export)?;
    let snapshot = r#"{"revision": 1, "networks": [{"slug": "prov", "subnet": "10.79.6.0", "prefix": 24,
        "dhcp": true, "pool": ["10.79.6.100", "10.79.6.110"]}],
        "boot": {"ipxe_script_url": "http://10.79.6.1:8081/boot/boot.ipxe"}}"#;
    let root_arg = root.to_string_lossy().into_owned();
    let export_arg = export.to_string_lossy().into_owned();
    let (_js, log) = start(
        &ns,
        dir.path(),
        snapshot,
        &[
            "--server-ip",
            "10.79.6.1",
            "--dhcp-interface",
            "tap0",
            "--http",
            "10.79.6.1:8081",
            "--tftp-root",
            &root_arg,
            "--export",
            &export_arg,
            "--metrics",
            "127.0.0.1:9102",
        ],
    )?;
    log.wait_for("UEFI HTTP boot clients get http://10.79.6.1:8081/boot/snponly.efi")?;
    let run = dir.path().join("vm");
    std::fs::create_dir_all(&run)?;
    let vars = run.join("OVMF_VARS.fd");
    std::fs::copy("/usr/share/OVMF/OVMF_VARS_4M.fd", &vars)
        .context("OVMF is missing: install ovmf")?;
    let serial = run.join("serial.log");
    let console =
        || String::from_utf8_lossy(&std::fs::read(&serial).unwrap_or_default()).replace('\r', "");
    let _vm = KillOnDrop(
        ns.command("qemu-system-x86_64")
            .args(["-accel", "tcg", "-m", "512", "-smp", "1", "-nodefaults"])
            .args(["-nographic", "-monitor", "none", "-no-reboot"])
            .arg("-serial")
            .arg(format!("file:{}", serial.display()))
            .args(["-machine", "q35", "-drive"])
            .arg("if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd")
            .arg("-drive")
            .arg(format!(
                "if=pflash,format=raw,unit=1,file={}",
                vars.display()
            ))
            .args(["-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no"])
            .args([
                "-device",
                "virtio-net-pci,romfile=,netdev=n0,mac=52:54:00:79:06:01,bootindex=1",
            ])
            // OVMF's own switches: no PXE boot options, so that the NIC's
            // first boot option is HTTP boot over IPv4.
            .args(["-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n"])
            .args(["-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(run.join("qemu.log"))?)
            .spawn()
            .context("starting qemu-system-x86_64 (install qemu-system-x86)")?,
    );
    wait_until(
        Duration::from_millis(500),
        || console().contains("HTTP-BOOT-SCRIPT-OK"),
        || {
            format!(
                "OVMF did not HTTP-boot our iPXE and its script; console:\n{}\njob server log:\n{}",
                console(),
                log.text()
            )
        },
    )?;
    let text = console();
    assert!(text.contains(">>Start HTTP Boot over IPv4"), "{text}");
    // OVMF names the URL our DHCP server gave it.
    assert!(
        text.contains("http://10.79.6.1:8081/boot/snponly.efi"),
        "{text}"
    );
    // iPXE took its address from our pool.
    assert!(text.contains("net0: 10.79.6.1"), "{text}");
    let m = metrics(&ns)?;
    // The firmware's DORA and iPXE's: two OFFERs and two ACKs at least,
    // and the lease (one MAC) kept.
    assert!(
        metric(&m, "mprov_dhcp_acks_total").unwrap_or(0.0) >= 2.0,
        "{m}"
    );
    assert_eq!(metric(&m, "mprov_dhcp_leases"), Some(1.0), "{m}");
    Ok(())
}
