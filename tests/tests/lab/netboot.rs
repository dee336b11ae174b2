//! End to end, from power-on to "ready", on the lab's real Debian root
//! (systemd to multi-user) through our own stack only: the control service
//! and job servers in a lab namespace, a QEMU VM under TCG.
//!
//! VM tests take a minute or two each under TCG on 2 cores, so they take
//! turns ([`VM_TURN`]) and share one booted stack between assertions.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Result, ensure};
use mprov_tests::lab::{self, Binaries, Image, READY_MARKER};
use mprov_tests::netboot::{IncumbentLab, Machine, Way};

/// One real-root VM at a time: two cores cannot emulate more quickly.
pub(crate) static VM_TURN: Mutex<()> = Mutex::new(());

/// The lab image with the static agent, built once per content.
pub(crate) fn image() -> Result<(Binaries, Image)> {
    let bins = Binaries::debug();
    let agent = mprov_tests::agent::build_static()?;
    let image = lab::debian_image(&bins, &agent.path)?;
    Ok((bins, image))
}

/// The lab's Debian image (mmdebstrap, systemd, the Debian kernel, built by
/// `mprov-image build`) boots to multi-user from our job server's DHCP and
/// HTTP the two incumbent ways the netboot benchmark compares us with: the
/// whole root as one cpio initrd, and a busybox initramfs streaming
/// `rootfs.tar.zst` through `wget | zstd -d | tar x`.
#[test]
fn debian_image_boots_to_multi_user_the_incumbent_ways() -> Result<()> {
    let _turn = VM_TURN.lock().unwrap_or_else(|e| e.into_inner());
    let (bins, image) = image()?;
    let run = tempfile::tempdir()?;
    let mac = "52:54:00:e2:10:01";
    let lab = IncumbentLab::start(&bins, &image, run.path(), &[mac])?;
    for way in [Way::Cpio, Way::Stream] {
        let mut booted = lab.boot(way, Machine::BiosIpxe, mac)?;
        ensure!(
            booted
                .console
                .contains(&format!("{READY_MARKER}: lab-node multi-user")),
            "{}: no multi-user on the console:\n{}",
            way.name(),
            booted.console
        );
        if way == Way::Stream {
            ensure!(
                booted
                    .console
                    .contains("LAB-STREAM: unpacked, switching root"),
                "{}",
                booted.console
            );
        }
        // The root powers the VM off by itself (mprov_lab_poweroff).
        let status = booted.vm.wait_exit(Duration::from_secs(300))?;
        ensure!(status.success(), "QEMU exited with {status}");
        eprintln!("{}: ready after {:.0?}", way.name(), booted.ready_after);
    }
    Ok(())
}
