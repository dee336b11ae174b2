//! `mprov-jobserver`'s image server as an operator configures it: with
//! `--http-max-streams 1 --http-stream-mib 1`, a second image stream is
//! refused with 503 and `Retry-After` while a small kernel still downloads,
//! the metrics listener counts the refusal, and the provisioning log names
//! the node. curl is the client, in a namespace of its own (loopback only).

use std::process::Stdio;
use std::time::Duration;

use crate::{KillOnDrop, spawn_standalone, standalone_jobserver};
use anyhow::{Context as _, Result, bail, ensure};
use mprov_api::boot::ImageFile;
use mprov_tests::netns::Netns;

/// The image server's base URL, as the contract builds it.
fn base() -> String {
    mprov_api::boot::jobserver_base_url("127.0.0.1", None)
}

/// The URL of one file of image `compute` version 1, as the contract builds it.
fn url(file: ImageFile) -> String {
    mprov_api::boot::image_file_url(&base(), "compute", 1, file)
}
const METRICS: &str = "http://127.0.0.1:9102/metrics";

/// curl in `ns`: (status code, response headers).
fn curl(ns: &Netns, args: &[&str]) -> Result<(u16, String)> {
    let out = ns
        .command("curl")
        .args(["-sS", "--max-time", "30", "-D", "-", "-o", "/dev/null"])
        .args(["-w", "%{http_code}"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running curl")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = text.get(text.len().saturating_sub(3)..).unwrap_or_default();
    Ok((code.parse().unwrap_or(0), text))
}

/// The metrics text, or "" while the listener is not up.
fn metrics(ns: &Netns) -> String {
    ns.command("curl")
        .args(["-s", "--max-time", "5", METRICS])
        .stdin(Stdio::null())
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default()
}

/// Polls `check` every 50 ms for up to 20 s.
fn wait_for(what: &str, mut check: impl FnMut() -> Result<bool>) -> Result<()> {
    for _ in 0..400 {
        if check()? {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("timed out waiting for {what}")
}

#[test]
fn jobserver_admits_image_streams_as_configured() -> Result<()> {
    let ns = Netns::new("jshttp")?;
    ns.up("lo")?;
    let dir = tempfile::tempdir()?;
    let export = dir.path().join("export");
    let image = export.join(
        std::path::Path::new(&mprov_api::boot::image_file_path(
            "compute",
            1,
            ImageFile::Kernel,
        ))
        .parent()
        .context("an image file's folder")?,
    );
    std::fs::create_dir_all(&image)?;
    // Sparse: far more than socket buffers hold, so a slow client keeps its
    // stream open; the kernel stays under the 1 MiB stream size.
    std::fs::File::create(image.join(ImageFile::Rootfs.file_name()))?.set_len(1 << 30)?;
    std::fs::write(
        image.join(ImageFile::Kernel.file_name()),
        vec![0x4d; 512 * 1024],
    )?;
    let snapshot = dir.path().join("boot.json");
    std::fs::write(
        &snapshot,
        r#"{"revision": 1, "hosts": [{"ipv4": "127.0.0.1", "hostname": "c01", "bootable": true}]}"#,
    )?;

    let log_path = dir.path().join("jobserver.log");
    let mut cmd = standalone_jobserver(&ns, &snapshot, &log_path)?;
    cmd.args(["--no-dhcp", "--no-tftp", "--no-dns", "--no-ra"])
        .args(["--http", "127.0.0.1:8081", "--metrics", "127.0.0.1:9102"])
        .args(["--http-max-streams", "1", "--http-stream-mib", "1"])
        .arg("--export")
        .arg(&export);
    let (server, bound) = spawn_standalone(cmd, &log_path)?;
    ensure!(bound.get("http")? == "127.0.0.1:8081".parse()?, "{bound:?}");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    ensure!(
        curl(&ns, &[&url(ImageFile::Kernel)])?.0 == 200,
        "the image server, once bound:\n{}",
        log()
    );

    // One slow stream takes the only permit.
    let slow = KillOnDrop(
        ns.command("curl")
            .args(["-sS", "--limit-rate", "256k", "-o", "/dev/null"])
            .arg(url(ImageFile::Rootfs))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning curl")?,
    );
    wait_for("one active stream", || {
        Ok(metrics(&ns).contains("mprov_http_active_streams 1\n"))
    })?;

    let (code, headers) = curl(&ns, &[&url(ImageFile::Rootfs)])?;
    assert_eq!(code, 503, "{headers}");
    let retry: u64 = headers
        .lines()
        .find_map(|l| l.strip_prefix("Retry-After: "))
        .context("no Retry-After")?
        .trim()
        .parse()?;
    ensure!((5..=15).contains(&retry), "Retry-After {retry}");
    // The kernel is below the stream size: served while streams are full.
    assert_eq!(curl(&ns, &[&url(ImageFile::Kernel)])?.0, 200);
    let text = metrics(&ns);
    assert!(
        text.contains("mprov_http_rejected_streams_total 1\n"),
        "{text}"
    );

    drop(slow);
    wait_for("the permit back", || {
        Ok(metrics(&ns).contains("mprov_http_active_streams 0\n"))
    })?;
    let log = log();
    assert!(
        log.contains("provisioning: c01 (127.0.0.1) got kernel of image compute (524 kB in "),
        "{log}"
    );
    assert!(
        log.contains("provisioning: c01 (127.0.0.1) stopped getting image compute after "),
        "{log}"
    );
    drop(server);
    Ok(())
}
