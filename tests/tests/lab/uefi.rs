//! The two UEFI ways of reaching our stack, each to ready on the real Debian
//! root, each sharing its boot with a job-server fault (a real-root boot
//! takes minutes under TCG, so every boot carries two assertions):
//! - OVMF with the NIC's iPXE-EFI ROM, while the first job server serves a
//!   corrupted `rootfs.tar.zst`;
//! - OVMF's own PXE client (virtio, `romfile=`: TFTP `snponly.efi`, then
//!   iPXE, then HTTP), while the job server streaming the image is killed
//!   mid-stream.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use mprov_api::boot::{BootEvent, BootPhase};
use mprov_tests::lab::{SECOND_SERVER_IP, SERVER_IP};
use mprov_tests::netboot::{Machine, Stack, StackOptions, in_order, tail};

use crate::e2e::{HEALTHY, agent_network, phases, ready_with_timeline};
use crate::netboot::{VM_TURN, image};

/// A two-job-server stack: js1 (DHCP, TFTP, HTTP) on [`SERVER_IP`], js2
/// (HTTP) on [`SECOND_SERVER_IP`], both hosting the image; js1's copy of
/// `rootfs.tar.zst` corrupted if asked; the boot script carrying iPXE's
/// lease to the agent unless told not to (`MPROV_IPXE_CARRY_LEASE=0`).
fn two_jobservers(run: &std::path::Path, corrupt_first: bool, carry_lease: bool) -> Result<Stack> {
    let (bins, image) = image()?;
    let control_env = if carry_lease {
        Vec::new()
    } else {
        vec![("MPROV_IPXE_CARRY_LEASE", "0".to_owned())]
    };
    Stack::start(
        &bins,
        &image,
        run,
        &StackOptions {
            second_jobserver: true,
            corrupt_first,
            control_env,
            ..StackOptions::default()
        },
    )
}

/// The events of `phase`, in order.
fn all(events: &[BootEvent], phase: BootPhase) -> Vec<&BootEvent> {
    events.iter().filter(|e| e.phase == phase).collect()
}

/// OVMF + the NIC's iPXE-EFI ROM to ready on the real Debian root, the
/// timeline complete and in order; on the same boot, the first job server
/// (first in the manifest) serves a corrupted `rootfs.tar.zst`: the agent
/// reads it to its end, finds the sha256 the control service published does
/// not match, wipes the staging area, streams the good copy from the second
/// job server and boots it. The timeline shows the mismatch naming js1's
/// URL, then a fresh start from js2 and its verification.
#[test]
fn vm_boots_on_ovmf_ipxe_falling_back_from_a_corrupted_image() -> Result<()> {
    let _turn = VM_TURN.lock().unwrap_or_else(|e| e.into_inner());
    let run = tempfile::tempdir()?;
    let stack = two_jobservers(run.path(), true, false)?;
    let node = stack.register("uefi01", "52:54:00:e2:30:01", "10.99.0.51", true)?;
    let started = Instant::now();
    let booted = stack.boot(&node, Machine::UefiIpxe, |_| {})?;
    eprintln!(
        "OVMF + iPXE, corrupted first copy: ready after {:.0?}",
        started.elapsed()
    );
    // iPXE-EFI, not SeaBIOS, ran the script.
    ensure!(
        booted.console.contains("mProv: booting uefi01"),
        "{}",
        tail(&booted.console, 80)
    );
    let events = ready_with_timeline(&stack, &node, &booted, HEALTHY)?;
    // With the lease not carried (switched off for this stack), the agent
    // falls back to its own DHCP, and js1 answered it.
    let (agent, replies) = agent_network(&events)?;
    ensure!(
        agent.detail.contains("from DHCP server") && agent.detail.contains("mprov_lease not given"),
        "the agent asked DHCP, saying why: {agent:?}"
    );
    ensure!(
        replies >= 2,
        "js1 offered and acked the agent's DHCP: {:?}",
        phases(&events)
    );
    in_order(
        &events,
        &[
            BootPhase::Enrolled,
            BootPhase::ImageStarted,
            BootPhase::ChecksumMismatch,
            BootPhase::ImageStarted,
            BootPhase::Verified,
            BootPhase::SwitchRoot,
            BootPhase::Ready,
        ],
    )
    .with_context(|| stack.where_it_stopped(&node))?;
    let mismatches = all(&events, BootPhase::ChecksumMismatch);
    ensure!(
        mismatches.len() == 1,
        "one mismatch, js1's: {:?}",
        phases(&events)
    );
    let corrupted = format!("http://{SERVER_IP}:8081/");
    ensure!(
        mismatches[0].detail.contains(&corrupted) && mismatches[0].detail.contains("staging wiped"),
        "the mismatch names the corrupted job server and the wipe: {:?}",
        mismatches[0]
    );
    let starts = all(&events, BootPhase::ImageStarted);
    ensure!(
        starts.len() == 2
            && starts[0].detail.contains(&corrupted)
            && starts[1]
                .detail
                .contains(&format!("http://{SECOND_SERVER_IP}:8081/")),
        "js1 first, then the good copy from js2: {starts:#?}"
    );
    let verified = all(&events, BootPhase::Verified);
    ensure!(
        verified.len() == 1 && verified[0].detail.contains(SECOND_SERVER_IP),
        "verified from js2: {verified:#?}"
    );
    ensure!(
        all(&events, BootPhase::Failed).is_empty(),
        "a mismatch is not a failure of the boot: {events:#?}"
    );
    ensure!(
        booted
            .console
            .contains("checksum mismatch: the bytes are not the published image"),
        "the mismatch on the console:\n{}",
        tail(&booted.console, 80)
    );
    drop(booted);
    Ok(())
}

/// OVMF's own PXE client on virtio (`romfile=`, no option ROM): our DHCP,
/// `snponly.efi` over our TFTP, iPXE's DHCP, `/ipxe/`, then the kernel and
/// agent initramfs over HTTP, to ready on the real Debian root with the
/// timeline complete and in order (the TFTP download on it). On the same
/// boot, the job server streaming the image (js1) is killed by its PID at
/// the first progress report: the agent's resumes find it dead, it wipes
/// the staging area, streams from the second job server and boots.
#[test]
fn vm_boots_through_ovmfs_own_pxe_surviving_a_jobserver_killed_mid_stream() -> Result<()> {
    let _turn = VM_TURN.lock().unwrap_or_else(|e| e.into_inner());
    let run = tempfile::tempdir()?;
    let stack = two_jobservers(run.path(), false, true)?;
    let node = stack.register("pxe01", "52:54:00:e2:31:01", "10.99.0.61", true)?;
    let started = Instant::now();
    let mut killed_at: Option<BootEvent> = None;
    let mut kill_error = None;
    let booted = stack.boot(&node, Machine::UefiNativePxe, |event| {
        if killed_at.is_none() && event.phase == BootPhase::Progress {
            killed_at = Some(event.clone());
            eprintln!(
                "killing js1 (PID {}) mid-stream at {:?}",
                stack.jobservers[0].pid, event.detail
            );
            if let Err(err) = stack.jobservers[0].kill() {
                kill_error = Some(err);
            }
        }
    })?;
    if let Some(err) = kill_error {
        return Err(err.context("killing js1"));
    }
    eprintln!(
        "OVMF PXE, js1 killed: ready after {:.0?}",
        started.elapsed()
    );
    let killed_at = killed_at.with_context(|| {
        format!(
            "no progress report to kill js1 at: {}",
            stack.where_it_stopped(&node)
        )
    })?;
    // OVMF's PXE, not an iPXE ROM, started: the firmware's line, then
    // snponly.efi's iPXE.
    ensure!(
        booted.console.contains("Start PXE over IPv4"),
        "{}",
        tail(&booted.console, 80)
    );
    let mut want = HEALTHY.to_vec();
    want.insert(2, BootPhase::BootFileSent);
    let events = ready_with_timeline(&stack, &node, &booted, &want)?;
    // iPXE-EFI carried its lease too: no DHCP from the agent.
    let (agent, replies) = agent_network(&events)?;
    ensure!(
        agent.detail.contains("from the lease iPXE carried") && replies == 0,
        "the agent used the carried lease ({replies} DHCP replies after the initramfs): {agent:?}"
    );
    let sent = all(&events, BootPhase::BootFileSent);
    ensure!(
        sent.iter()
            .any(|e| e.detail.contains("snponly.efi") && e.source.contains("js1")),
        "js1 sent snponly.efi over TFTP: {sent:#?}"
    );
    // The stream from js1 broke off where we killed it, and the good copy
    // came from js2.
    let starts = all(&events, BootPhase::ImageStarted);
    ensure!(
        starts.len() == 2
            && starts[0]
                .detail
                .contains(&format!("http://{SERVER_IP}:8081/"))
            && starts[1]
                .detail
                .contains(&format!("http://{SECOND_SERVER_IP}:8081/")),
        "js1 first, then js2 (killed at {killed_at:?}): {starts:#?}"
    );
    let failed = all(&events, BootPhase::Failed);
    ensure!(
        failed.len() == 1
            && failed[0].detail.contains(SERVER_IP)
            && failed[0].detail.contains("not answering"),
        "one failure: js1 not answering: {failed:#?}"
    );
    in_order(
        &events,
        &[
            BootPhase::ImageStarted,
            BootPhase::Progress,
            BootPhase::Failed,
            BootPhase::ImageStarted,
            BootPhase::Verified,
            BootPhase::SwitchRoot,
            BootPhase::Ready,
        ],
    )
    .with_context(|| stack.where_it_stopped(&node))?;
    ensure!(
        all(&events, BootPhase::ChecksumMismatch).is_empty(),
        "{events:#?}"
    );
    let verified = all(&events, BootPhase::Verified);
    ensure!(
        verified.len() == 1 && verified[0].detail.contains(SECOND_SERVER_IP),
        "verified from js2: {verified:#?}"
    );
    // The agent tried to resume first: its console says so.
    ensure!(
        booted.console.contains("resuming"),
        "{}",
        tail(&booted.console, 80)
    );
    drop(booted);
    Ok(())
}
