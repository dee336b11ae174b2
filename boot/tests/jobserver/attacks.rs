//! Attacks on `mprov-jobserver`'s image server, each against the real
//! process (run as root, as in production) in a network namespace of its
//! own, and shown refused:
//! - a connection flood under a 1024-file limit (`prlimit`, soft and hard):
//!   about 1,100 idle and slow (half a head) connections, then a node's
//!   download (curl) still gets its file, whole;
//! - links in the export that lead out of it: a secret file elsewhere is
//!   never served (404), while a relative link that stays inside is.

use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use mprov_api::boot::ImageFile;
use mprov_tests::KillOnDrop;
use mprov_tests::netns::Netns;

const ADDR: &str = "127.0.0.1:8081";
/// Connections the flood opens: more than the 1024-file limit allows.
const FLOOD: usize = 1100;
/// Of those, how many send half a request head and stop (slowloris).
const SLOW: usize = 100;

/// The image server's URL of `file` of image `slug` version 1.
fn url(slug: &str, file: ImageFile) -> String {
    let base = mprov_api::boot::jobserver_base_url("127.0.0.1", None);
    mprov_api::boot::image_file_url(&base, slug, 1, file)
}

/// The folder of image `slug` version 1 under `export`, made.
fn image_dir(export: &Path, slug: &str) -> Result<std::path::PathBuf> {
    let file = mprov_api::boot::image_file_path(slug, 1, ImageFile::Kernel);
    let dir = export.join(
        Path::new(&file)
            .parent()
            .context("an image file's folder")?,
    );
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `mprov-jobserver` in `ns` with only its image server, serving `export`,
/// under a limit of 1024 open files (soft and hard), its log in `log`.
fn image_server(ns: &Netns, dir: &Path, export: &Path, log: &Path) -> Result<KillOnDrop> {
    let snapshot = dir.join("boot.json");
    std::fs::write(
        &snapshot,
        r#"{"revision": 1, "hosts": [{"ipv4": "127.0.0.1", "hostname": "c01", "bootable": true}]}"#,
    )?;
    // prlimit execs the job server in place: the PID is the job server's.
    let mut cmd = ns.command("prlimit");
    cmd.args(["--nofile=1024:1024", "--"])
        .arg(env!("CARGO_BIN_EXE_mprov-jobserver"))
        .arg("--boot-config")
        .arg(&snapshot)
        .args([
            "--log",
            "info",
            "--no-dhcp",
            "--no-tftp",
            "--no-dns",
            "--no-ra",
        ])
        .args(["--http", ADDR, "--metrics", "127.0.0.1:9102"])
        .arg("--export")
        .arg(export)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?);
    Ok(KillOnDrop(cmd.spawn().context("starting mprov-jobserver")?))
}

/// curl in `ns` fetching `url` into `out`: the status code (0 when it got
/// no answer), bounded by 20 s.
fn curl(ns: &Netns, url: &str, out: &Path) -> Result<u16> {
    let _ = std::fs::remove_file(out);
    let done = ns
        .command("curl")
        .args(["-sS", "--max-time", "20", "-w", "%{http_code}", "-o"])
        .arg(out)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .context("running curl")?;
    Ok(String::from_utf8_lossy(&done.stdout)
        .trim()
        .parse()
        .unwrap_or(0))
}

/// Polls until `url` answers 200 in `ns`, for up to 20 s.
fn wait_served(ns: &Netns, url: &str, out: &Path, log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if curl(ns, url, out)? == 200 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "the image server did not serve {url}:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    )
}

/// Opens `count` connections to `addr` from inside `ns` (a thread enters the
/// namespace; its sockets stay there), each bounded by 2 s and all by 60 s;
/// the first `slow` of them send half a request head. The connections that
/// opened.
fn flood(ns: &Netns, addr: SocketAddr, count: usize, slow: usize) -> Result<Vec<TcpStream>> {
    let path = ns.path();
    std::thread::spawn(move || -> Result<Vec<TcpStream>> {
        let file = std::fs::File::open(&path)?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut open = Vec::with_capacity(count);
        for i in 0..count {
            if Instant::now() > deadline {
                break;
            }
            let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
                continue;
            };
            if i < slow {
                let _ = conn.write_all(b"GET /images/x HTTP/1.1\r\nHost: a\r\nX-Slow: ");
            }
            open.push(conn);
        }
        Ok(open)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the flood thread panicked"))?
}

#[test]
fn a_connection_flood_under_1024_files_does_not_keep_a_node_out() -> Result<()> {
    // The flood's own sockets: this process needs more than 1024 files.
    let limit = mprov_process::raise_file_limit()?;
    ensure!(
        limit.now >= FLOOD as u64 + 256,
        "the test needs an open-file limit of {} (it has {})",
        FLOOD + 256,
        limit.now
    );
    let ns = Netns::new("jsflood")?;
    let dir = tempfile::tempdir()?;
    let export = dir.path().join("export");
    let kernel: Vec<u8> = (0..512 * 1024u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(
        image_dir(&export, "compute")?.join(ImageFile::Kernel.file_name()),
        &kernel,
    )?;
    let log = dir.path().join("jobserver.log");
    let _server = image_server(&ns, dir.path(), &export, &log)?;
    let out = dir.path().join("kernel");
    let kernel_url = url("compute", ImageFile::Kernel);
    wait_served(&ns, &kernel_url, &out, &log)?;

    let held = flood(&ns, ADDR.parse()?, FLOOD, SLOW)?;
    ensure!(
        held.len() == FLOOD,
        "only {} of {FLOOD} connections opened: the server stopped accepting",
        held.len()
    );
    // A node now: its download is served, whole, while the flood is held.
    let code = curl(&ns, &kernel_url, &out)?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    ensure!(code == 200, "the node got {code} during the flood:\n{text}");
    ensure!(
        std::fs::read(&out)? == kernel,
        "the kernel came back changed"
    );
    ensure!(
        text.contains("at most 384 connections (not 4096): the open-file limit is 1024"),
        "{text}"
    );
    ensure!(
        text.contains("connections open, its limit (--http-max-connections): closed "),
        "no warning at the cap:\n{text}"
    );
    // The warning is rate-limited, not one line per connection shed.
    let warnings = text.matches("its limit (--http-max-connections)").count();
    ensure!(warnings <= 3, "{warnings} warnings:\n{text}");
    let metrics = ns
        .command("curl")
        .args(["-s", "--max-time", "5", "http://127.0.0.1:9102/metrics"])
        .stdin(Stdio::null())
        .output()?;
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    let value = |name: &str| -> Result<u64> {
        metrics
            .lines()
            .find_map(|l| l.split_once(' ').filter(|(n, _)| n.ends_with(name)))
            .map(|(_, v)| v)
            .with_context(|| format!("no {name} in\n{metrics}"))?
            .trim()
            .parse()
            .context("a metric's value")
    };
    let open = value("mprov_http_open_connections")?;
    let shed = value("mprov_http_closed_idle_connections_total")?;
    ensure!(open <= 384, "{open} connections open");
    ensure!(
        shed as usize >= FLOOD - 384,
        "only {shed} idle connections closed"
    );
    drop(held);
    Ok(())
}

#[test]
fn links_out_of_the_export_are_never_served() -> Result<()> {
    let ns = Netns::new("jslink")?;
    let dir = tempfile::tempdir()?;
    // The secret, outside the export, root's and private.
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside)?;
    let secret = outside.join("secret");
    let secret_bytes = b"root:the-secret-bytes-5f1c9e\n";
    std::fs::write(&secret, secret_bytes)?;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600))?;
    let before = std::fs::metadata(&secret)?;

    let export = dir.path().join("export");
    let image = image_dir(&export, "compute")?;
    // An absolute link to the secret, a relative one climbing out, a link
    // to the folder that holds it, and a relative link that stays inside.
    symlink(&secret, image.join(ImageFile::Kernel.file_name()))?;
    let up = "../".repeat(image.strip_prefix(dir.path())?.components().count());
    symlink(
        format!("{up}outside/secret"),
        image.join(ImageFile::Initramfs.file_name()),
    )?;
    symlink(
        &outside,
        image.parent().context("the slug's folder")?.join("2"),
    )?;
    std::fs::write(image.join("real-rootfs"), b"the image itself\n")?;
    symlink("real-rootfs", image.join(ImageFile::Rootfs.file_name()))?;
    // Sanity: as the file system resolves them, the links do reach the
    // secret (so the server's refusal is what keeps it).
    assert_eq!(
        std::fs::read(image.join(ImageFile::Initramfs.file_name()))?,
        secret_bytes
    );

    let log = dir.path().join("jobserver.log");
    let _server = image_server(&ns, dir.path(), &export, &log)?;
    let out = dir.path().join("body");
    wait_served(&ns, &url("compute", ImageFile::Rootfs), &out, &log)?;
    assert_eq!(std::fs::read(&out)?, b"the image itself\n");

    let base = mprov_api::boot::jobserver_base_url("127.0.0.1", None);
    for target in [
        url("compute", ImageFile::Kernel),
        url("compute", ImageFile::Initramfs),
        format!("{base}/images/compute/2/secret"),
    ] {
        let code = curl(&ns, &target, &out)?;
        assert!(code == 404 || code == 403, "{target}: {code}");
        let body = std::fs::read(&out).unwrap_or_default();
        assert!(
            !body
                .windows(secret_bytes.len())
                .any(|w| w == secret_bytes.as_slice()),
            "{target} served the secret"
        );
    }
    let text = std::fs::read_to_string(&log)?;
    assert!(text.contains("a link that leads out of"), "{text}");
    // The secret is as it was.
    let after = std::fs::metadata(&secret)?;
    assert_eq!(std::fs::read(&secret)?, secret_bytes);
    assert_eq!(
        (after.uid(), after.mode(), after.ino()),
        (before.uid(), before.mode(), before.ino())
    );
    Ok(())
}
