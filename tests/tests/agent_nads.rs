//! `mprov-agent nads` against a real LLDP agent: `lldpd` speaks for a
//! switch in one network namespace, and the real agent binary listens in
//! another, over a veth pair, through a Linux bridge that forwards LLDP
//! (`group_fwd_mask` 0x4000), and with a link that hears nothing. lldpd is
//! configured as switches of several vendors would name their ports
//! (`lldpcli` port ID subtypes `local` and `ifname`, a chassis ID of its
//! own, custom 802.1 VLAN TLVs; the MAC subtype is among the captured
//! frames of `agent/lldp/testdata`), and each report must name
//! the switch, port, system name and VLAN it was told.
//!
//! The agent prints its report as JSON (`--json`), which the tests read as
//! the wire type the control service reads. DMI comes from a fake
//! `sys/class/dmi/id` under `--root`. Needs root (namespaces, raw sockets)
//! and lldpd (`cargo xtask test` installs it).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mprov_api::nads::NadsReport;
use mprov_tests::lldpd::Lldpd;
use mprov_tests::netns::{Netns, veth};

const SWITCH_MAC: &str = "52:54:00:aa:00:01";
const NODE_MAC: &str = "52:54:00:bb:00:07";

/// A fake root with DMI facts, as a server's firmware writes them.
fn dmi_root() -> Result<tempfile::TempDir> {
    let root = tempfile::tempdir()?;
    let dir = root.path().join("sys/class/dmi/id");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("sys_vendor"), "Supermicro\n")?;
    std::fs::write(dir.join("product_name"), "SYS-1029U-TRT\n")?;
    std::fs::write(dir.join("product_serial"), "S123456X\n")?;
    Ok(root)
}

fn agent() -> Result<PathBuf> {
    let path = mprov_tests::xtask::target_dir().join("debug/mprov-agent");
    ensure!(
        path.is_file(),
        "{} is missing: `cargo build --workspace --bins` builds it",
        path.display()
    );
    Ok(path)
}

/// Runs `mprov-agent nads --json --window <window>` in `ns` and reads its
/// report. It must exit by itself within `bound` (far below the window
/// when every link should be heard, which shows the window ended early).
fn nads(ns: &Netns, root: &Path, window: u64, bound: Duration) -> Result<NadsReport> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("report.json");
    let err = dir.path().join("stderr");
    let cmdline = dir.path().join("cmdline");
    std::fs::write(&cmdline, format!("quiet mprov_mac={NODE_MAC}\n"))?;
    let mut child = ns
        .command(agent()?.to_str().context("path")?)
        .args(["nads", "--json", "--window", &window.to_string()])
        .arg("--root")
        .arg(root)
        .arg("--cmdline")
        .arg(&cmdline)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(&err)?)
        .spawn()
        .context("starting mprov-agent nads")?;
    let until = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "mprov-agent nads did not end within {bound:?} (window {window} s): {}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    ensure!(
        status.success(),
        "mprov-agent nads failed ({status}): {stderr}"
    );
    let json = std::fs::read_to_string(&out)?;
    serde_json::from_str(&json).with_context(|| format!("the report: {json}\n{stderr}"))
}

/// The bound for a run whose window should end early: far below the
/// 3600 s window it is given.
const EARLY: Duration = Duration::from_secs(120);

#[test]
fn nads_over_a_veth_names_switch_port_and_vlan() -> Result<()> {
    let switch = Netns::new("ndsw")?;
    let node = Netns::new("ndnode")?;
    let v = veth(&switch, &node)?;
    switch.set_mac(&v.a, SWITCH_MAC)?;
    node.set_mac(&v.b, NODE_MAC)?;
    let dir = tempfile::tempdir()?;
    let lldpd = Lldpd::start(
        &switch,
        dir.path(),
        &[&v.a],
        &["-S", "Arista EOS"],
        &[
            "configure system hostname leaf01",
            &format!(
                "configure ports {} lldp portidsubtype local Ethernet1/7 description n07-eth0",
                v.a
            ),
            // The port's VLAN (802.1 PVID) and its name, as a switch sends them.
            &format!(
                "configure ports {} lldp custom-tlv oui 00,80,c2 subtype 1 oui-info 00,64",
                v.a
            ),
            &format!(
                "configure ports {} lldp custom-tlv add oui 00,80,c2 subtype 3 oui-info 00,64,07,63,6f,6d,70,75,74,65",
                v.a
            ),
        ],
    )?;
    let root = dmi_root()?;
    let report = nads(&node, root.path(), 3600, EARLY).with_context(|| lldpd.log())?;

    assert_eq!(report.boot_mac, NODE_MAC);
    assert_eq!(report.links.len(), 1, "{report:?}");
    let link = &report.links[0];
    assert_eq!(
        (link.interface.as_str(), link.mac.as_str()),
        (v.b.as_str(), NODE_MAC)
    );
    let n = link.neighbour.as_ref().context("nothing heard")?;
    assert_eq!(
        (n.chassis_id.as_str(), n.chassis_id_subtype.as_str()),
        (SWITCH_MAC, "mac-address")
    );
    assert_eq!(
        (n.port_id.as_str(), n.port_id_subtype.as_str()),
        ("Ethernet1/7", "local")
    );
    assert_eq!(n.system_name.as_deref(), Some("leaf01"));
    assert_eq!(n.port_description.as_deref(), Some("n07-eth0"));
    assert_eq!(n.vlan, Some(100));
    assert_eq!(
        (
            report.hardware.vendor.as_deref(),
            report.hardware.model.as_deref(),
            report.hardware.serial.as_deref()
        ),
        (Some("Supermicro"), Some("SYS-1029U-TRT"), Some("S123456X"))
    );
    Ok(())
}

#[test]
fn nads_through_a_bridge_that_forwards_lldp() -> Result<()> {
    let switch = Netns::new("ndbsw")?;
    let lan = Netns::new("ndblan")?;
    let node = Netns::new("ndbnode")?;
    let up = veth(&switch, &lan)?;
    let down = veth(&lan, &node)?;
    switch.set_mac(&up.a, SWITCH_MAC)?;
    node.set_mac(&down.b, NODE_MAC)?;
    lan.add_bridge("br0")?;
    for port in [&up.b, &down.a] {
        lan.ip(&["link", "set", port, "master", "br0"])?;
    }
    lan.up("br0")?;
    let dir = tempfile::tempdir()?;
    let lldpd = Lldpd::start(
        &switch,
        dir.path(),
        &[&up.a],
        &["-S", "Juniper Networks EX4300", "-m", "198.51.100.7"],
        &[
            "configure system hostname ex4300",
            "configure system chassisid ex4300-chassis-1",
            &format!(
                "configure ports {} lldp portidsubtype local ge-0/0/7 description n07",
                up.a
            ),
        ],
    )?;
    let root = dmi_root()?;

    // An 802.1D bridge never forwards the nearest-bridge group address:
    // the node hears nothing, and says so.
    let report = nads(&node, root.path(), 4, EARLY).with_context(|| lldpd.log())?;
    assert_eq!(report.links.len(), 1, "{report:?}");
    assert_eq!(report.links[0].neighbour, None, "{report:?}");

    // With bit 14 (01-80-C2-00-00-0E) in group_fwd_mask it does.
    lan.forward_lldp("br0")?;
    let report = nads(&node, root.path(), 3600, EARLY).with_context(|| lldpd.log())?;
    let n = report.links[0]
        .neighbour
        .as_ref()
        .context("nothing heard")?;
    assert_eq!(
        (n.chassis_id.as_str(), n.chassis_id_subtype.as_str()),
        ("ex4300-chassis-1", "local")
    );
    assert_eq!(
        (n.port_id.as_str(), n.port_id_subtype.as_str()),
        ("ge-0/0/7", "local")
    );
    assert_eq!(n.system_name.as_deref(), Some("ex4300"));
    assert_eq!(n.management_addresses, ["198.51.100.7"]);
    assert_eq!(n.vlan, None);
    Ok(())
}

#[test]
fn nads_reports_a_silent_link_and_ends_early_once_all_are_heard() -> Result<()> {
    let switch = Netns::new("ndmsw")?;
    let silent = Netns::new("ndmquiet")?;
    let node = Netns::new("ndmnode")?;
    let a = veth(&switch, &node)?;
    let b = veth(&switch, &node)?;
    let c = veth(&silent, &node)?;
    node.set_mac(&a.b, NODE_MAC)?;
    let dir = tempfile::tempdir()?;
    // One switch, two ports: one names its port by interface name, the
    // other by a local name in the Aruba style.
    let lldpd = Lldpd::start(
        &switch,
        dir.path(),
        &[&a.a, &b.a],
        &["-S", "Cumulus Linux"],
        &[
            "configure system hostname cumulus-leaf",
            "configure lldp portidsubtype ifname",
            &format!("configure ports {} lldp portidsubtype local 1/1/2", b.a),
        ],
    )?;
    let root = dmi_root()?;
    let report = nads(&node, root.path(), 8, EARLY).with_context(|| lldpd.log())?;
    let by_name = |name: &str| {
        report
            .links
            .iter()
            .find(|l| l.interface == name)
            .with_context(|| format!("{name} is not in {report:?}"))
    };
    assert_eq!(report.links.len(), 3, "{report:?}");
    let heard_a = by_name(&a.b)?
        .neighbour
        .as_ref()
        .context("a heard nothing")?;
    assert_eq!(
        (heard_a.port_id.as_str(), heard_a.port_id_subtype.as_str()),
        (a.a.as_str(), "interface-name")
    );
    assert_eq!(heard_a.system_name.as_deref(), Some("cumulus-leaf"));
    let heard_b = by_name(&b.b)?
        .neighbour
        .as_ref()
        .context("b heard nothing")?;
    assert_eq!(
        (heard_b.port_id.as_str(), heard_b.port_id_subtype.as_str()),
        ("1/1/2", "local")
    );
    assert_eq!(heard_a.chassis_id, heard_b.chassis_id, "one switch");
    assert_eq!(by_name(&c.b)?.neighbour, None, "{report:?}");

    // With the silent link down, every link that is up is heard: the
    // window ends early, and the down link is not listed.
    node.ip(&["link", "set", "dev", &c.b, "down"])?;
    let report = nads(&node, root.path(), 3600, EARLY).with_context(|| lldpd.log())?;
    let names: Vec<&str> = report.links.iter().map(|l| l.interface.as_str()).collect();
    assert_eq!(names.len(), 2, "{report:?}");
    assert!(names.contains(&a.b.as_str()) && names.contains(&b.b.as_str()));
    assert!(
        report.links.iter().all(|l| l.neighbour.is_some()),
        "{report:?}"
    );
    Ok(())
}

/// The agent needs the raw socket it asks for: run unprivileged it fails,
/// naming the link and the capability, rather than reporting silence.
#[test]
fn nads_without_raw_sockets_fails_clearly() -> Result<()> {
    let node = Netns::new("ndunpriv")?;
    let peer = Netns::new("ndunpeer")?;
    let _v = veth(&peer, &node)?;
    let out = Command::new("ip")
        .args(["netns", "exec", node.name()])
        .arg("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(agent()?)
        .args(["nads", "--window", "5", "--cmdline", "/dev/null"])
        .output()
        .context("running setpriv")?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("CAP_NET_RAW"), "{stderr}");
    Ok(())
}
