//! The agent's step 1 against real DHCP servers, each in a network
//! namespace of its own joined to the agent's by a veth pair: our
//! `mprov-jobserver` (a reservation for the node's MAC) and dnsmasq (a
//! pool). The agent's code runs on a thread that joined the client
//! namespace: its DHCP client gets a lease over a UDP socket bound to the
//! interface, then rtnetlink puts the address and the default route on it,
//! and busybox ping reaches the server through them.

use std::net::Ipv4Addr;
use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mprov_agent::dhcp::{self, Lease};
use mprov_agent::init::netlink::{self, Netlink};
use mprov_tests::netns::{Netns, veth};

const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x21];
const MAC_TEXT: &str = "52:54:00:77:00:21";

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// In `client`'s namespace: DHCP on `dev`, then the lease configured with
/// netlink. The lease.
fn obtain_and_configure(client: &Netns, dev: &str) -> Result<Lease> {
    let path = client.path();
    let dev = dev.to_owned();
    std::thread::spawn(move || -> Result<Lease> {
        let ns = std::fs::File::open(&path)?;
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
        let index = nix::net::if_::if_nametoindex(dev.as_str())?;
        let mut nl = Netlink::open()?;
        let seq = nl.next_seq();
        nl.request(&netlink::link_up(index, None, seq), seq)?;
        let lease = dhcp::obtain(&dev, MAC, 0x5eed)?.context("no DHCP answer")?;
        let seq = nl.next_seq();
        nl.request(
            &netlink::add_address(index, lease.address, lease.prefix, seq),
            seq,
        )?;
        if let Some(router) = lease.router {
            let seq = nl.next_seq();
            nl.request(&netlink::add_default_route(index, router, seq), seq)?;
        }
        Ok(lease)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the client thread panicked"))?
}

/// Two namespaces and the veth between them, the server end at 10.77.0.1/24,
/// the client end with the node's MAC and no address.
fn lab() -> Result<(Netns, Netns, String, String)> {
    let server = Netns::new("agdhs")?;
    let client = Netns::new("agdhc")?;
    let v = veth(&server, &client)?;
    server.add_addr(&v.a, "10.77.0.1/24")?;
    server.up("lo")?;
    client.ip(&["link", "set", &v.b, "down"])?;
    client.set_mac(&v.b, MAC_TEXT)?;
    Ok((server, client, v.a, v.b))
}

fn ping(client: &Netns, to: &str) -> Result<()> {
    client
        .exec("busybox", &["ping", "-c", "1", "-W", "5", to])
        .map(|_| ())
}

#[test]
fn agent_dhcp_from_our_job_server_reservation() -> Result<()> {
    let jobserver = mprov_tests::xtask::target_dir().join("debug/mprov-jobserver");
    ensure!(
        jobserver.is_file(),
        "{} is missing: `cargo test --workspace` builds it (or run cargo build -p mprov-boot)",
        jobserver.display()
    );
    let (server, client, sdev, cdev) = lab()?;
    let dir = tempfile::tempdir()?;
    let snapshot = dir.path().join("boot.json");
    std::fs::write(
        &snapshot,
        serde_json::json!({
            "revision": 1,
            "networks": [{"slug": "lab", "subnet": "10.77.0.0", "prefix": 24, "domain": "lab",
                          "gateway": "10.77.0.1", "dhcp": true}],
            "hosts": [{"mac": MAC_TEXT, "ipv4": "10.77.0.21", "hostname": "n21",
                       "network": "lab", "bootable": true}]
        })
        .to_string(),
    )?;
    let log = dir.path().join("jobserver.log");
    let listen = dir.path().join("listen.json");
    let mut js = server
        .command(jobserver.to_str().context("path")?)
        .arg("--boot-config")
        .arg(&snapshot)
        .args(["--server-ip", "10.77.0.1", "--dhcp", "0.0.0.0:67"])
        .args(["--dhcp-interface", &sdev])
        .args(["--no-tftp", "--no-dns", "--no-http", "--no-ra"])
        .args(["--metrics", "127.0.0.1:9102"])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--listen-file")
        .arg(&listen)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting mprov-jobserver")?;
    let bound = mprov_tests::listen::wait(&listen, &mut js, Duration::from_secs(20));
    let _js = Kill(js);
    bound.with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    let lease = obtain_and_configure(&client, &cdev)
        .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    assert_eq!(lease.address, Ipv4Addr::new(10, 77, 0, 21));
    assert_eq!(lease.prefix, 24);
    assert_eq!(lease.server, Ipv4Addr::new(10, 77, 0, 1));
    assert_eq!(lease.router, Some(Ipv4Addr::new(10, 77, 0, 1)));
    assert_eq!(lease.hostname.as_deref(), Some("n21"));
    ping(&client, "10.77.0.1")?;
    Ok(())
}

#[test]
fn agent_dhcp_from_dnsmasq() -> Result<()> {
    let (server, client, sdev, cdev) = lab()?;
    let dir = tempfile::tempdir()?;
    let _dnsmasq = Kill(
        server
            .command("dnsmasq")
            .args([
                "--keep-in-foreground",
                "--no-daemon",
                "--port=0",
                "--bind-interfaces",
            ])
            .arg(format!("--interface={sdev}"))
            .args(["--dhcp-range=10.77.0.100,10.77.0.150,255.255.255.0,1h"])
            .args(["--dhcp-option=option:router,10.77.0.1"])
            .arg(format!(
                "--dhcp-leasefile={}",
                dir.path().join("leases").display()
            ))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting dnsmasq (apt-get install dnsmasq-base)")?,
    );
    std::thread::sleep(Duration::from_millis(200));
    let lease = obtain_and_configure(&client, &cdev)?;
    let last = lease.address.octets()[3];
    assert!(
        lease.address.octets()[..3] == [10, 77, 0] && (100..=150).contains(&last),
        "{lease:?}"
    );
    assert_eq!(lease.router, Some(Ipv4Addr::new(10, 77, 0, 1)));
    ping(&client, "10.77.0.1")?;
    Ok(())
}
