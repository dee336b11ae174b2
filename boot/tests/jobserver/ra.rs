//! `mprov-jobserver` sends router advertisements by default, on the
//! provisioning interfaces it picks itself (an IPv4 address in one of the
//! boot config's networks), and on no other: rdisc6 (ndisc6) in a client
//! namespace on each side checks.

use std::process::Stdio;
use std::time::Duration;

use crate::{spawn_standalone, standalone_jobserver};
use anyhow::{Context as _, Result};
use mprov_tests::netns::{Netns, veth};

/// Runs rdisc6 in `ns` on `dev`, `tries` solicitations a second apart; its
/// output and whether it got an advertisement.
fn rdisc6(ns: &Netns, dev: &str, tries: u32) -> Result<(bool, String)> {
    let out = ns
        .command("rdisc6")
        .args(["-1", "-n", "-r", &tries.to_string(), "-w", "1000", dev])
        .stdin(Stdio::null())
        .output()
        .context("running rdisc6 (Debian package ndisc6)")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

/// Polls until `dev` in `ns` has a usable (not tentative) link-local
/// address, which rdisc6 needs to send from.
fn wait_link_local(ns: &Netns, dev: &str) -> Result<()> {
    for _ in 0..200 {
        let out = ns.ip(&["-6", "addr", "show", "dev", dev, "scope", "link"])?;
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("inet6 fe80") && !text.contains("tentative") {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!("{dev} has no usable link-local address")
}

/// The value of rdisc6's `key : value` line for `key`.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
}

#[test]
fn jobserver_advertises_on_provisioning_interfaces_only() -> Result<()> {
    let server = Netns::new("jsra")?;
    let node = Netns::new("jsrn")?;
    let site = Netns::new("jsrs")?;
    let prov = veth(&server, &node)?;
    let other = veth(&server, &site)?;
    server.add_addr(&prov.a, "10.78.0.1/24")?;
    server.ip(&["-6", "addr", "add", "fd78::1/64", "dev", &prov.a, "nodad"])?;
    server.add_addr(&other.a, "192.168.78.1/24")?;
    server.ip(&["-6", "addr", "add", "fd79::1/64", "dev", &other.a, "nodad"])?;

    let dir = tempfile::tempdir()?;
    let snapshot = dir.path().join("boot.json");
    std::fs::write(
        &snapshot,
        r#"{"revision": 1, "networks": [{"slug": "prov", "subnet": "10.78.0.0", "prefix": 24, "domain": "lab", "dhcp": true}]}"#,
    )?;
    let log_path = dir.path().join("jobserver.log");
    let mut cmd = standalone_jobserver(&server, &snapshot, &log_path)?;
    cmd.args(["--no-dhcp", "--no-tftp", "--no-dns", "--no-http"])
        .args(["--metrics", "127.0.0.1:0"]);
    let (child, _) = spawn_standalone(cmd, &log_path)?;
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    // rdisc6 retries while the job server starts and the server's
    // link-local address leaves duplicate address detection.
    wait_link_local(&node, &prov.b)?;
    wait_link_local(&site, &other.b)?;
    let (got, text) = rdisc6(&node, &prov.b, 5)?;
    assert!(
        got,
        "no RA on the provisioning network: {text}\njob server log:\n{}",
        log()
    );
    assert_eq!(
        field(&text, "Router lifetime"),
        Some("0 (0x00000000) seconds"),
        "{text}"
    );
    assert_eq!(field(&text, "Prefix"), Some("fd78::/64"), "{text}");

    let (got, text) = rdisc6(&site, &other.b, 2)?;
    assert!(!got, "an RA on a network not in the boot config: {text}");

    std::thread::sleep(Duration::from_millis(100));
    let log = log();
    let line = log
        .lines()
        .find(|l| l.contains("IPv6 router advertisements"))
        .with_context(|| format!("no RA log line: {log}"))?;
    assert!(line.contains("[I]"), "{line}");
    assert!(
        line.contains(&format!("{} (prefix fd78::/64)", prov.a)),
        "{line}"
    );
    assert!(!line.contains(&other.a), "{line}");
    drop(child);
    Ok(())
}
