//! `mprov-jobserver --listen-file`: with every server bound to port 0, the
//! file names the ports the system chose, and those are the ones that
//! answer, to clients nobody here wrote: curl (the image server and
//! `/metrics`), dig (DNS over UDP and TCP) and tftp-hpa (TFTP). A job server
//! that cannot bind exits, and the wait for its file says so at once.

use std::process::Stdio;

use anyhow::{Context as _, Result, ensure};
use mprov_tests::netns::Netns;

use crate::{spawn_standalone, standalone_jobserver};

/// A client run in `ns` (bounded by `timeout`); its standard output, or
/// the failure with everything it printed.
fn client(ns: &Netns, program: &str, args: &[&str]) -> Result<Vec<u8>> {
    let out = ns
        .command("timeout")
        .arg("30")
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
    Ok(out.stdout)
}

#[test]
fn the_listen_file_names_the_port_0_binds_that_answer() -> Result<()> {
    let ns = Netns::new("jslisten")?;
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("ipxe");
    std::fs::create_dir_all(&root)?;
    // Served by TFTP and by the image server's /boot/: the same bytes.
    let efi: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(root.join("snponly.efi"), &efi)?;
    let snapshot = dir.path().join("boot.json");
    std::fs::write(
        &snapshot,
        r#"{"revision": 1,
            "networks": [{"slug": "lab", "subnet": "10.0.0.0", "prefix": 24, "domain": "lab", "dns": true}],
            "hosts": [{"ipv4": "10.0.0.21", "hostname": "n01", "network": "lab", "bootable": true}]}"#,
    )?;
    let log = dir.path().join("jobserver.log");
    let mut cmd = standalone_jobserver(&ns, &snapshot, &log)?;
    cmd.args(["--no-dhcp", "--no-ra"])
        .args(["--tftp", "127.0.0.1:0", "--dns", "127.0.0.1:0"])
        .args(["--http", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
        .arg("--tftp-root")
        .arg(&root)
        .arg("--export")
        .arg(dir.path().join("export"))
        .arg("--state-dir")
        .arg(dir.path().join("state"));
    let (_js, bound) = spawn_standalone(cmd, &log)?;
    assert_eq!(
        bound.servers().collect::<Vec<_>>(),
        ["dns", "http", "metrics", "tftp"],
        "only the servers that run"
    );
    for server in ["dns", "http", "metrics", "tftp"] {
        let at = bound.get(server)?;
        ensure!(
            at.ip().to_string() == "127.0.0.1" && at.port() != 0,
            "{server} at {at}"
        );
    }

    // HTTP: the iPXE binary from the image server.
    let http = bound.get("http")?;
    let got = client(
        &ns,
        "curl",
        &["-sS", &format!("http://{http}/boot/snponly.efi")],
    )?;
    ensure!(got == efi, "the image server's /boot/snponly.efi");
    // Metrics: the image server's own counters, on their own port.
    let metrics = bound.get("metrics")?;
    let text = client(&ns, "curl", &["-sS", &format!("http://{metrics}/metrics")])?;
    let text = String::from_utf8_lossy(&text);
    ensure!(text.contains("\nmprov_http_"), "{text}");
    // Every name carries the one `mprov_` prefix, never two.
    ensure!(!text.contains("mprov_mprov_"), "{text}");

    // DNS, UDP and TCP on the one port the file names.
    let dns = bound.get("dns")?;
    let port = dns.port().to_string();
    for transport in ["+notcp", "+tcp"] {
        let out = client(
            &ns,
            "dig",
            &[
                "@127.0.0.1",
                "-p",
                &port,
                "+short",
                "+time=2",
                "+tries=1",
                transport,
                "n01.lab",
                "A",
            ],
        )?;
        ensure!(
            String::from_utf8_lossy(&out).trim() == "10.0.0.21",
            "dig {transport}: {}",
            String::from_utf8_lossy(&out)
        );
    }

    // TFTP: the same file with tftp-hpa.
    let tftp = bound.get("tftp")?;
    let local = dir.path().join("fetched.efi");
    client(
        &ns,
        "tftp",
        &[
            "127.0.0.1",
            &tftp.port().to_string(),
            "-m",
            "binary",
            "-c",
            "get",
            "snponly.efi",
            local.to_str().context("path")?,
        ],
    )?;
    ensure!(std::fs::read(&local)? == efi, "the file over TFTP");
    Ok(())
}

#[test]
fn a_job_server_that_cannot_bind_ends_the_wait_with_its_log() -> Result<()> {
    let ns = Netns::new("jsbusy")?;
    let dir = tempfile::tempdir()?;
    let snapshot = dir.path().join("boot.json");
    std::fs::write(&snapshot, r#"{"revision": 1}"#)?;
    // The metrics port is taken (by a first job server).
    let first_log = dir.path().join("first.log");
    let mut cmd = standalone_jobserver(&ns, &snapshot, &first_log)?;
    cmd.args(["--no-dhcp", "--no-ra", "--no-tftp", "--no-dns", "--no-http"])
        .args(["--metrics", "127.0.0.1:0"]);
    let (_first, bound) = spawn_standalone(cmd, &first_log)?;
    let taken = bound.get("metrics")?.to_string();

    let log = dir.path().join("second.log");
    let mut cmd = standalone_jobserver(&ns, &snapshot, &log)?;
    cmd.args(["--no-dhcp", "--no-ra", "--no-tftp", "--no-dns", "--no-http"])
        .args(["--metrics", &taken]);
    let started = std::time::Instant::now();
    let err = format!("{:#}", spawn_standalone(cmd, &log).unwrap_err());
    ensure!(
        err.contains("exited") && err.contains(&format!("metrics: cannot bind {taken}")),
        "{err}"
    );
    ensure!(started.elapsed().as_secs() < 15, "{err}");
    Ok(())
}
