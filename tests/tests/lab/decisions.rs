//! What `/ipxe/` decides for the nodes that do not boot an image, seen on a
//! real VM's console: an unknown MAC gets the discovery script, and once
//! the admin registers it as a node set not to netboot, its next try gets
//! local boot and the firmware boots its disk.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mprov_api::boot::BootPhase;
use mprov_tests::netboot::{Node, Stack, StackOptions, dead_end, tail};
use mprov_tests::vm::{self, LOCAL_DISK_MARKER, Vm};

use crate::e2e::phases;
use crate::netboot::{VM_TURN, image};

/// Waits until the console shows `marker` (at most `timeout`).
fn console_until(vm: &mut Vm, marker: &str, timeout: Duration, stack: &Stack) -> Result<String> {
    vm.wait_for(marker, timeout).with_context(|| {
        format!(
            "control log:\n{}\njob server log:\n{}",
            tail(&stack.control.log(), 20),
            tail(&stack.jobservers[0].log(), 20)
        )
    })
}

/// One SeaBIOS + iPXE VM with a local disk (a boot sector printing
/// [`LOCAL_DISK_MARKER`]) and a MAC the inventory does not know:
/// - our DHCP leases it a pool address and reports it; `/ipxe/`, attested
///   by that report, answers the discovery script, which the console shows
///   naming the MAC; the control service recorded the lease under the MAC
///   (`?mac=`) and logged the discovery, and handed out no nonce;
/// - the admin then registers it, set not to netboot; the discovery
///   script's next chain gets the local boot script (the console says so),
///   iPXE exits, and SeaBIOS boots the local disk.
#[test]
fn vm_unknown_node_gets_discovery_then_local_boot_once_registered() -> Result<()> {
    let _turn = VM_TURN.lock().unwrap_or_else(|e| e.into_inner());
    let (bins, image) = image()?;
    let run = tempfile::tempdir()?;
    let stack = Stack::start(&bins, &image, run.path(), &StackOptions::default())?;
    let disk = run.path().join("local-disk.img");
    vm::local_disk(&disk)?;
    let mac = "52:54:00:e2:40:01";
    let stranger = Node {
        hostname: "stranger".to_owned(),
        mac: mac.to_owned(),
        ip: String::new(),
    };
    let started = Instant::now();
    let mut vm = stack.power_on_with_disk(&stranger, &disk)?;

    // Unknown: the discovery script, on the console.
    let discovery = format!("mProv: this node ({mac}) is not in the inventory");
    let console = console_until(&mut vm, &discovery, Duration::from_secs(180), &stack)?;
    eprintln!("discovery script after {:.0?}", started.elapsed());
    ensure!(
        !console.contains("mProv: booting"),
        "{}",
        tail(&console, 40)
    );
    // What the control service recorded: the job server's lease of a pool
    // address to the MAC, and the discovery in its log; no script_served
    // (that is a boot with a nonce).
    let events = stack.timeline_of_mac(mac)?;
    let acked = events
        .iter()
        .find(|e| e.phase == BootPhase::DhcpAcked)
        .with_context(|| format!("no dhcp_acked for {mac}: {:?}", phases(&events)))?;
    ensure!(
        acked.source.contains("js1") && acked.system.is_none(),
        "the job server reported the unknown MAC's lease: {acked:?}"
    );
    let leased = acked.ip.context("the lease's address")?.to_string();
    ensure!(
        leased.starts_with("10.99.0.1"),
        "a pool address (10.99.0.100-199): {leased}"
    );
    ensure!(
        !events.iter().any(|e| e.phase == BootPhase::ScriptServed),
        "{events:#?}"
    );
    let log = stack.control.log();
    ensure!(
        log.lines().any(
            |l| l.contains("ipxe: unknown node; sent the discovery script") && l.contains(mac)
        ),
        "the control log names the discovery:\n{}",
        tail(&log, 30)
    );

    // Registered, set not to netboot: the next chain gets local boot.
    let node = stack.register("local01", mac, "10.99.0.71", false)?;
    let console = console_until(&mut vm, LOCAL_DISK_MARKER, Duration::from_secs(180), &stack)?;
    eprintln!("local disk booted after {:.0?}", started.elapsed());
    let local = console
        .find("mProv: booting from the local disk")
        .with_context(|| format!("the local boot script: {}", tail(&console, 40)))?;
    let disk_at = console.rfind(LOCAL_DISK_MARKER).context("disk marker")?;
    ensure!(
        local < disk_at && console.find(&discovery) < Some(local),
        "discovery, then local boot, then the disk: {}",
        tail(&console, 40)
    );
    if let Some(end) = dead_end(&console[local..]) {
        bail!("{end} after local boot: {}", tail(&console, 40));
    }
    ensure!(
        !console.contains("mprov-agent"),
        "nothing of the netboot ran: {}",
        tail(&console, 40)
    );
    // No nonce, no boot: the node's timeline has no script_served.
    let events = stack.timeline(&node)?;
    ensure!(
        !events.iter().any(|e| e.phase == BootPhase::ScriptServed),
        "{events:#?}"
    );
    drop(vm);
    Ok(())
}
