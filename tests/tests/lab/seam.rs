//! The seam between the control service and the job servers, without a VM:
//! the boot script the real control service renders through `/ipxe/`, after
//! a real DHCP lease from a real `mprov-jobserver` attested the request,
//! names only URLs the real job servers serve, each with the bytes the
//! image's manifest names.

use std::io::Read;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};
use mprov_api::boot::{BootManifest, BootPhase, ImageFile, MANIFEST_PATH};
use mprov_tests::lab::{CONTROL_PORT, SECOND_SERVER_IP, SERVER_IP};
use mprov_tests::netboot::{Stack, StackOptions};
use sha2::{Digest, Sha256};

use crate::netboot::image;

/// A GET with curl from inside `ns`: the status code and the body's size and
/// sha256 (the body is hashed as it comes, never stored).
fn fetch(ns: &str, url: &str) -> Result<(u16, u64, String)> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-sS", "-m", "300"])
        .args(["-w", "%{stderr}HTTP %{http_code}\n", url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running curl")?;
    let mut body = child.stdout.take().context("curl's stdout")?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = body.read(&mut buf)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(out.status.success(), "curl {url}: {stderr}");
    let code = stderr
        .lines()
        .find_map(|l| l.strip_prefix("HTTP "))
        .with_context(|| format!("curl {url} printed no status: {stderr}"))?
        .trim()
        .parse()?;
    Ok((code, size, hex::encode(hasher.finalize())))
}

/// The image manifest's `(size, sha256)` of `file`.
fn artefact(manifest: &serde_json::Value, file: ImageFile) -> Result<(u64, String)> {
    let entry = manifest["artifacts"]
        .as_array()
        .context("the manifest's artifacts")?
        .iter()
        .find(|a| a["name"] == file.file_name())
        .with_context(|| format!("the image manifest names no {}", file.file_name()))?;
    Ok((
        entry["size"].as_u64().context("size")?,
        entry["sha256"].as_str().context("sha256")?.to_owned(),
    ))
}

/// The control service and two job servers hosting the lab image; a client
/// on the lab bridge with a registered node's MAC takes its lease from
/// js1's DHCP, and js1 reports it. Then, from that client:
/// - `/ipxe/` answers the boot script (a nonce in it, because the lease
///   attests the request), with a kernel and an initramfs URL on each job
///   server, js1 and js2, and the arguments the agent reads;
/// - the node's boot manifest (read as the admin) lists `rootfs.tar.zst` on
///   both, with the checksum and size published for the version;
/// - every one of those URLs answers 200 from the real job server with
///   exactly the bytes (size and sha256) the image's `manifest.json` names.
#[test]
fn ipxe_scripts_name_only_urls_the_job_servers_serve_with_the_manifests_bytes() -> Result<()> {
    let (bins, image) = image()?;
    let run = tempfile::tempdir()?;
    let stack = Stack::start(
        &bins,
        &image,
        run.path(),
        &StackOptions {
            second_jobserver: true,
            corrupt_first: false,
            ..StackOptions::default()
        },
    )?;
    let mac = "52:54:00:e2:50:01";
    let node = stack.register("seam01", mac, "10.99.0.81", true)?;
    let client = stack.net.client(mac)?;
    let leased = client.dhcp()?;
    ensure!(leased == node.ip, "the reservation: {leased}");

    let url =
        format!("http://{SERVER_IP}:{CONTROL_PORT}/ipxe/?mac={mac}&platform=pcbios&buildarch=i386");
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            client.ns.name(),
            "curl",
            "-sS",
            "-m",
            "30",
            "-w",
            "\n%{http_code}",
        ])
        .arg(&url)
        .stdin(Stdio::null())
        .output()
        .context("running curl")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (script, code) = text.rsplit_once('\n').context("curl's status line")?;
    ensure!(code.trim() == "200", "/ipxe/: HTTP {code}: {script}");
    let events = stack.timeline(&node)?;
    ensure!(
        events
            .iter()
            .any(|e| e.phase == BootPhase::DhcpAcked && e.source.contains("js1")),
        "js1 reported the lease: {events:#?}"
    );
    ensure!(
        events.iter().any(|e| e.phase == BootPhase::ScriptServed),
        "{events:#?}"
    );

    // The script: a kernel and an initramfs from each job server, best
    // first, with the agent's arguments.
    let words = |verb: &str| -> Vec<Vec<String>> {
        script
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{verb} ")))
            .map(|rest| rest.split_whitespace().map(str::to_owned).collect())
            .collect()
    };
    let kernels = words("kernel");
    let initrds = words("initrd");
    ensure!(
        kernels.len() == 2 && initrds.len() == 2,
        "a kernel and an initramfs from js1 and js2:\n{script}"
    );
    for (i, ip) in [SERVER_IP, SECOND_SERVER_IP].iter().enumerate() {
        let base = format!("http://{ip}:{}/", mprov_api::boot::DEFAULT_HTTP_PORT);
        ensure!(kernels[i][0].starts_with(&base), "{script}");
        ensure!(initrds[i][0].starts_with(&base), "{script}");
    }
    let ca = stack.ca_fingerprint()?;
    for want in [
        "initrd=initramfs.img".to_owned(),
        format!("mprov_ca={ca}"),
        format!("mprov_image={}:{}", image.slug, image.version),
        format!("mprov_mac={mac}"),
        format!("mprov_url={}", stack.control.https_url()),
    ] {
        ensure!(
            kernels.iter().all(|k| k.contains(&want)),
            "{want} on every kernel line:\n{script}"
        );
    }
    ensure!(
        kernels.iter().all(|k| k
            .iter()
            .any(|w| w.starts_with("mprov_enroll=") && w.len() > 20)),
        "a nonce on the kernel lines:\n{script}"
    );

    // The boot manifest: rootfs.tar.zst on both, with the published checksum.
    let manifest: BootManifest = serde_json::from_value(stack.control.api(
        "GET",
        &format!("{MANIFEST_PATH}?system={}", node.hostname),
        None,
    )?)?;
    ensure!(manifest.sources.len() == 2, "{manifest:?}");
    let image_manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(image.file(ImageFile::Manifest))?)?;
    let rootfs = artefact(&image_manifest, ImageFile::Rootfs)?;
    ensure!(
        (manifest.size, manifest.sha256.clone()) == rootfs,
        "the boot manifest's rootfs is the image manifest's: {manifest:?} vs {rootfs:?}"
    );

    // Every URL: 200, the manifest's bytes.
    let mut urls: Vec<(String, ImageFile)> = Vec::new();
    for k in &kernels {
        urls.push((k[0].clone(), ImageFile::Kernel));
    }
    for i in &initrds {
        urls.push((i[0].clone(), ImageFile::Initramfs));
    }
    for r in &manifest.sources {
        urls.push((r.clone(), ImageFile::Rootfs));
    }
    for (url, file) in &urls {
        let (want_size, want_sha) = artefact(&image_manifest, *file)?;
        let (code, size, sha) = fetch(client.ns.name(), url)?;
        ensure!(code == 200, "{url}: HTTP {code}");
        ensure!(
            size == want_size && sha == want_sha,
            "{url}: {size} bytes, sha256 {sha}; the manifest names {want_size} bytes, {want_sha}"
        );
        eprintln!("{url}: 200, {size} bytes, sha256 as in the manifest");
    }
    Ok(())
}
