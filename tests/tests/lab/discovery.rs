//! Discovery end to end (issue 25): a lab VM whose MAC no one typed finds
//! its own switch port over LLDP, is matched to its system by that port,
//! reboots, and netboots normally to ready.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use mprov_api::boot::BootPhase;
use mprov_tests::lldpd::Lldpd;
use mprov_tests::netboot::{Machine, Node, Stack, StackOptions, tail};
use mprov_tests::netns::{Netns, veth};

use crate::e2e::{HEALTHY, agent_network, phases, print_event, ready_with_timeline};
use crate::netboot::{VM_TURN, image};

/// The unknown node's MAC.
const MAC: &str = "52:54:00:e2:50:07";
/// The address its system's NIC reserves.
const RESERVED_IP: &str = "10.99.0.57";
/// The switch as LLDP names it, and as the inventory does.
const SWITCH: &str = "leaf01";
/// The port as the inventory spells it; lldpd says `Eth1/7` (the same
/// port in another vendor's spelling).
const PORT: &str = "Ethernet1/7";

/// The inventory: switch [`SWITCH`] with port [`PORT`], and system d01
/// whose NIC is cabled to that port, with a reserved address and no MAC
/// (no one typed it), booting the lab image.
fn inventory(stack: &Stack) -> Result<()> {
    let api = |path: &str, body: serde_json::Value| {
        stack
            .control
            .api("POST", path, Some(&body))
            .with_context(|| format!("POST {path} {body}"))
    };
    api(
        "/api/v1/switches/",
        serde_json::json!({"hostname": SWITCH, "mgmt_mac": "52:54:00:5e:00:01"}),
    )?;
    let port = api(
        "/api/v1/switchports/",
        serde_json::json!({"switch": SWITCH, "name": PORT}),
    )?;
    api(
        "/api/v1/systems/",
        serde_json::json!({
            "hostname": "d01", "image": stack.image.slug, "netboot": true,
            "nics": [{"name": "eth0", "mac": null, "ipv4": RESERVED_IP, "bootable": true,
                "network": "lab", "switch_port": port["id"]}]
        }),
    )?;
    Ok(())
}

/// lldpd speaking for [`SWITCH`] on the lab bridge: from its own
/// namespace, over a veth whose other end is a port of `br0`, which
/// forwards LLDP's group address (`group_fwd_mask` 0x4000) to the VM's tap,
/// as a switch's port would hand it to the node cabled to it.
fn switch_on_the_bridge(stack: &Stack, dir: &std::path::Path) -> Result<(Netns, Lldpd)> {
    let switch = Netns::new("lldsw")?;
    let v = veth(&switch, &stack.net.ns)?;
    stack.net.ns.ip(&["link", "set", &v.b, "master", "br0"])?;
    stack.net.ns.up(&v.b)?;
    stack.net.ns.forward_lldp("br0")?;
    let lldpd = Lldpd::start(
        &switch,
        dir,
        &[&v.a],
        &["-S", "Arista EOS"],
        &[
            &format!("configure system hostname {SWITCH}"),
            &format!(
                "configure ports {} lldp portidsubtype local Eth1/7 description d01-eth0",
                v.a
            ),
        ],
    )?;
    Ok((switch, lldpd))
}

/// SeaBIOS + iPXE, on the real stack, with discovery policy `open` and the
/// lab image as the discovery image, and lldpd speaking for the switch on
/// the lab bridge. A VM with a MAC the inventory does not know powers on:
/// - our DHCP leases it a pool address; `/ipxe/` boots it into discovery
///   (the image's kernel and agent initramfs, a one-time discovery nonce);
///   the agent hears `leaf01` port `Eth1/7` and reports; the control
///   service matches the port to d01's NIC (`Ethernet1/7`, no MAC), binds
///   the MAC, and the agent says so and reboots (QEMU runs with
///   `-no-reboot`, so the reboot ends the VM; the test powers the same
///   machine on again);
/// - the discovery boot enrolled nothing and no certificate names d01;
/// - the next boot is a normal one: d01's reserved address from DHCP, its
///   image to ready, the whole healthy timeline under d01.
#[test]
fn vm_unknown_node_discovers_its_switch_port_and_boots_to_ready() -> Result<()> {
    let _turn = VM_TURN.lock().unwrap_or_else(|e| e.into_inner());
    let (bins, image) = image()?;
    let run = tempfile::tempdir()?;
    let stack = Stack::start(
        &bins,
        &image,
        run.path(),
        &StackOptions {
            control_env: vec![
                ("MPROV_DISCOVERY_POLICY", "open".to_owned()),
                ("MPROV_DISCOVERY_IMAGE", image.slug.clone()),
            ],
            ..StackOptions::default()
        },
    )?;
    inventory(&stack)?;
    let (_switch, lldpd) = switch_on_the_bridge(&stack, run.path())?;
    let node = Node {
        hostname: "d01".to_owned(),
        mac: MAC.to_owned(),
        ip: RESERVED_IP.to_owned(),
    };

    // The discovery boot.
    let started = Instant::now();
    let mut vm = stack.power_on(&node, Machine::BiosIpxe)?;
    vm.wait_for("discovery: matched to d01", Duration::from_secs(420))
        .with_context(|| {
            format!(
                "lldpd:\n{}\ncontrol:\n{}\njs1:\n{}",
                lldpd.log(),
                tail(&stack.control.log(), 30),
                tail(&stack.jobservers[0].log(), 20)
            )
        })?;
    eprintln!("d01 discovered after {:.0?}", started.elapsed());
    let status = vm.wait_exit(Duration::from_secs(120))?;
    eprintln!("the discovery boot rebooted ({status})");
    // The whole console, to the reboot.
    let console = vm.console();
    // What the agent heard and said, on its console.
    for line in [
        "discovery: the CA certificate at",
        SWITCH,
        "Eth1/7",
        "discovery: matched to d01: its MAC is bound; rebooting into a normal boot",
    ] {
        ensure!(
            console.contains(line),
            "{line:?} on the discovery boot's console:\n{}",
            tail(&console, 60)
        );
    }
    ensure!(
        !console.contains("step 2: enrolled") && !console.contains("step 5: switch_root"),
        "a discovery boot enrolls nothing and boots no image:\n{}",
        tail(&console, 60)
    );
    // The control service bound the MAC by the port.
    let log = stack.control.log();
    ensure!(
        log.lines()
            .any(|l| l.contains("discovery: MAC bound by switch port") && l.contains(MAC)),
        "the control service logged the bind:\n{}",
        tail(&log, 30)
    );
    let system = stack.control.api("GET", "/api/v1/systems/d01", None)?;
    let nic = &system["nics"][0];
    ensure!(
        nic["mac"] == MAC && nic["ipv4"] == RESERVED_IP,
        "d01's NIC has the discovered MAC: {system:#}"
    );
    // The discovery boot's timeline: the pool lease and the discovery
    // script, nothing of an enrollment; no certificate for d01.
    let events = stack.timeline_of_mac(MAC)?;
    let script = events
        .iter()
        .find(|e| e.phase == BootPhase::ScriptServed)
        .with_context(|| format!("no script_served: {:?}", phases(&events)))?;
    ensure!(
        script.detail.starts_with("discovery script: image"),
        "the discovery script was served: {script:?}"
    );
    ensure!(
        !events
            .iter()
            .any(|e| matches!(e.phase, BootPhase::Enrolled | BootPhase::ImageStarted)),
        "the discovery boot enrolled: {:?}",
        phases(&events)
    );
    let creds = stack
        .control
        .api("GET", "/api/v1/credentials/?kind=node&identity=d01", None)?;
    ensure!(
        creds["items"].as_array().is_some_and(Vec::is_empty),
        "no certificate for d01 from a discovery boot: {creds:#}"
    );

    // The same machine powered on again: a normal boot to ready.
    let booted = stack.boot(&node, Machine::BiosIpxe, print_event)?;
    eprintln!(
        "d01: ready {:.0?} after power-on, {:.0?} after the discovery boot's",
        booted.ready_after,
        started.elapsed()
    );
    let events = ready_with_timeline(&stack, &node, &booted, HEALTHY)?;
    let acked = events
        .iter()
        .find(|e| e.phase == BootPhase::DhcpAcked)
        .context("dhcp_acked")?;
    ensure!(
        acked.ip.map(|ip| ip.to_string()).as_deref() == Some(RESERVED_IP),
        "the second boot's DHCP gave d01's reserved address: {acked:?}"
    );
    let (agent, _) = agent_network(&events)?;
    ensure!(
        agent.detail.contains(RESERVED_IP),
        "the agent's address is d01's: {agent:?}"
    );
    drop(booted);
    drop(lldpd);
    Ok(())
}
