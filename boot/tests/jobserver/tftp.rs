//! `mprov-jobserver`'s TFTP server, the real process in a namespace: the
//! lock-step clients of old PXE ROMs (tftp-hpa's `tftp`, which has no
//! windowsize at all, and atftp at windowsize 1) and atftp's windowed modes
//! fetch a 3 MiB file byte for byte, and `/metrics` counts every transfer.

use std::process::Stdio;

use crate::{spawn_standalone, standalone_jobserver};
use anyhow::{Context as _, Result, ensure};
use mprov_tests::netns::Netns;

/// A client run in `ns`, bounded by 60 s; fails unless it succeeded.
fn fetch(ns: &Netns, program: &str, args: &[&str]) -> Result<()> {
    let out = ns
        .command("timeout")
        .arg("60")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    ensure!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn jobserver_tftp_serves_lock_step_and_windowed_clients() -> Result<()> {
    let ns = Netns::new("jstftp")?;
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("ipxe");
    std::fs::create_dir_all(&root)?;
    // Deterministic bytes, not a multiple of the block size.
    let data: Vec<u8> = (0..3 * 1024 * 1024 + 777u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(root.join("snponly.efi"), &data)?;
    let log = dir.path().join("jobserver.log");
    let snapshot = dir.path().join("boot.json");
    std::fs::write(&snapshot, r#"{"revision": 1}"#)?;
    let mut cmd = standalone_jobserver(&ns, &snapshot, &log)?;
    cmd.args(["--no-dhcp", "--no-dns", "--no-http", "--no-ra"])
        .args(["--tftp", "127.0.0.1:69", "--metrics", "127.0.0.1:9102"])
        .arg("--tftp-root")
        .arg(&root);
    let (_js, bound) = spawn_standalone(cmd, &log)?;
    ensure!(bound.get("tftp")? == "127.0.0.1:69".parse()?, "{bound:?}");

    let out = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let mut fetched = Vec::new();
    // tftp-hpa: lock-step, 512-byte blocks (6,000+ blocks).
    let local = out("hpa.bin");
    fetch(
        &ns,
        "tftp",
        &[
            "127.0.0.1",
            "69",
            "-m",
            "binary",
            "-c",
            "get",
            "snponly.efi",
            &local,
        ],
    )?;
    fetched.push(local);
    // atftp lock-step and windowed, with the block size EDK2 asks for.
    for window in [1, 16, 64] {
        let local = out(&format!("atftp-{window}.bin"));
        let windowsize = format!("windowsize {window}");
        fetch(
            &ns,
            "atftp",
            &[
                "--option",
                "blksize 1468",
                "--option",
                &windowsize,
                "--option",
                "tsize 0",
                "-g",
                "-r",
                "snponly.efi",
                "-l",
                &local,
                "127.0.0.1",
                "69",
            ],
        )?;
        fetched.push(local);
    }
    for path in &fetched {
        ensure!(
            std::fs::read(path)? == data,
            "{path} differs from the file served"
        );
    }
    let metrics = ns
        .command("curl")
        .args(["-sS", "--max-time", "5", "http://127.0.0.1:9102/metrics"])
        .stdin(Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&metrics.stdout);
    ensure!(
        text.contains("mprov_tftp_transfers_completed_total 4"),
        "{text}"
    );
    ensure!(
        text.contains("mprov_tftp_transfers_failed_total 0"),
        "{text}"
    );
    Ok(())
}
