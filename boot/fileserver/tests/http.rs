//! The file server against curl, a client nobody here wrote, on 127.0.0.1:0.
//!
//! Each test starts its own server in-process over a fresh export folder and
//! stops it through [`TestContext::cleanup`]. Waiting is bounded polling on
//! the server's own state (metrics, the download hook), never a bare sleep, and
//! no test asserts a duration.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use axum::body::Body;
use axum::http::Request;
use mprov_api::boot::{BootConfig, BootHost};
use mprov_fileserver::{Config, Download, ImageState, Outcome, metrics_router, serve};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

const IMAGE: &str = "images/compute/3/rootfs.tar.zst";
const IMAGE_LEN: usize = 3 * 1024 * 1024 + 12345;
/// Sparse, so it costs no disk; far larger than any socket buffer, so a
/// rate-limited client keeps its stream open.
const BIG: &str = "images/compute/3/big.bin";
const BIG_LEN: u64 = 4 * 1024 * 1024 * 1024;
const IPXE: &str = "ipxe.efi";

struct TestContext {
    dir: tempfile::TempDir,
    addr: SocketAddr,
    state: ImageState,
    downloads: Arc<Mutex<Vec<Download>>>,
    shutdown: CancellationToken,
    server: JoinHandle<Result<(), mprov_fileserver::ServeError>>,
    /// Deterministic pseudo-random contents of `IMAGE`.
    image: Vec<u8>,
}

impl TestContext {
    async fn new(max_streams: usize) -> Result<Self> {
        Self::with(max_streams, |_| {}).await
    }

    async fn with(max_streams: usize, tune: impl FnOnce(&mut Config)) -> Result<Self> {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter("mprov_fileserver=debug")
            .try_init();
        let dir = tempfile::tempdir()?;
        let image = pseudo_random(IMAGE_LEN);
        write(&dir.path().join(IMAGE), &image)?;
        let big = std::fs::File::create(dir.path().join(BIG))?;
        big.set_len(BIG_LEN)?;
        write(
            &dir.path().join("ipxe").join(IPXE),
            b"MZ not really an EFI binary",
        )?;

        let mut config = Config::new(dir.path());
        config.ipxe_dir = dir.path().join("ipxe");
        config.max_streams = max_streams;
        config.stream_threshold = 0;
        config.drain = Duration::from_secs(1);
        tune(&mut config);
        let boot_config = BootConfig {
            hosts: vec![BootHost {
                mac: None,
                ipv4: Some(Ipv4Addr::LOCALHOST),
                ipv6: None,
                hostname: "c01".into(),
                aliases: vec![],
                network: None,
                netboot: true,
                bootable: true,
            }],
            ..BootConfig::default()
        };
        // The sender may go: the receiver keeps the last snapshot.
        let (_tx, rx) = watch::channel(Arc::new(boot_config));
        let downloads = Arc::new(Mutex::new(Vec::new()));
        let sink = downloads.clone();
        let state = ImageState::new(config, rx).on_download(move |d: &Download| {
            sink.lock().unwrap().push(d.clone());
        });

        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, state.clone(), shutdown.clone()));
        Ok(Self {
            dir,
            addr,
            state,
            downloads,
            shutdown,
            server,
            image,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.addr, path.trim_start_matches('/'))
    }

    fn out(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Polls `check` every 20 ms for up to 20 s.
    async fn wait_for(&self, what: &str, check: impl Fn(&Self) -> bool) -> Result<()> {
        for _ in 0..1000 {
            if check(self) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("timed out waiting for {what}")
    }

    fn downloads(&self) -> Vec<Download> {
        self.downloads.lock().unwrap().clone()
    }

    async fn cleanup(self) -> Result<()> {
        self.shutdown.cancel();
        self.server.await??;
        Ok(())
    }
}

fn write(path: &Path, data: &[u8]) -> Result<()> {
    std::fs::create_dir_all(path.parent().context("no parent")?)?;
    std::fs::write(path, data).with_context(|| format!("writing {}", path.display()))
}

/// xorshift64*: enough to make every byte position distinct in practice.
fn pseudo_random(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// Runs curl with `args`, returning (status code, headers) from `-w`/`-D`.
async fn curl(args: &[&str]) -> Result<(u16, String)> {
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "60", "-D", "-", "-w", "\n%{http_code}"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .context("running curl")?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(
        output.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (headers, code) = stdout.rsplit_once('\n').context("no status")?;
    Ok((code.trim().parse()?, headers.to_owned()))
}

fn header<'a>(headers: &'a str, name: &str) -> Option<&'a str> {
    // The last header block wins (curl prints one per response).
    headers.lines().rev().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// A rate-limited download of the big file that stays open until killed.
fn slow_stream(ctx: &TestContext) -> Result<Child> {
    Command::new("curl")
        .args(["-sS", "--limit-rate", "256k", "-o", "/dev/null"])
        .arg(ctx.url(BIG))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("spawning curl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_download_is_byte_identical_and_logged() -> Result<()> {
    let ctx = TestContext::new(4).await?;
    let out = ctx.out("full");
    let (code, headers) = curl(&["-o", out.to_str().unwrap(), &ctx.url(IMAGE)]).await?;
    assert_eq!(code, 200);
    assert_eq!(
        header(&headers, "content-length"),
        Some(IMAGE_LEN.to_string().as_str())
    );
    assert!(std::fs::read(&out)? == ctx.image, "downloaded bytes differ");

    ctx.wait_for("the download record", |c| !c.downloads().is_empty())
        .await?;
    let d = &ctx.downloads()[0];
    assert_eq!(d.outcome, Outcome::Completed);
    assert_eq!(d.bytes, IMAGE_LEN as u64);
    assert_eq!(d.client, Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    assert_eq!(d.node.as_deref(), Some("c01"));
    assert_eq!(d.image(), "compute");
    assert!(
        d.log_line()
            .starts_with("provisioning: c01 (127.0.0.1) got image compute (3.2 MB in "),
        "{}",
        d.log_line()
    );
    ctx.wait_for("the permit back", |c| {
        c.state.metrics().active_streams() == 0
    })
    .await?;
    assert!(ctx.state.metrics().bytes_served() >= IMAGE_LEN as u64);
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_and_resume() -> Result<()> {
    let ctx = TestContext::new(4).await?;
    let url = ctx.url(IMAGE);

    // A single range.
    let out = ctx.out("range");
    let (code, headers) = curl(&["-r", "1000-1999", "-o", out.to_str().unwrap(), &url]).await?;
    assert_eq!(code, 206);
    assert_eq!(
        header(&headers, "content-range"),
        Some(format!("bytes 1000-1999/{IMAGE_LEN}").as_str())
    );
    assert!(std::fs::read(&out)? == ctx.image[1000..2000]);

    // An open-ended range from the end.
    let (code, _) = curl(&["-r", "-100", "-o", out.to_str().unwrap(), &url]).await?;
    assert_eq!(code, 206);
    assert!(std::fs::read(&out)? == ctx.image[IMAGE_LEN - 100..]);

    // Multiple ranges: ignored, the whole file comes back (documented).
    let (code, _) = curl(&["-r", "0-9,100-109", "-o", out.to_str().unwrap(), &url]).await?;
    assert_eq!(code, 200);
    assert!(std::fs::read(&out)? == ctx.image);

    // Unsatisfiable.
    let (code, _) = curl(&["-r", "999999999-", "-o", "/dev/null", &url]).await?;
    assert_eq!(code, 416);

    // A partial download by curl, then `curl -C -` finishes it.
    let resumed = ctx.out("resumed");
    let resumed = resumed.to_str().unwrap();
    let (code, _) = curl(&["-r", "0-1048575", "-o", resumed, &url]).await?;
    assert_eq!(code, 206);
    assert_eq!(std::fs::metadata(resumed)?.len(), 1_048_576);
    let (code, headers) = curl(&["-C", "-", "-o", resumed, &url]).await?;
    assert_eq!(code, 206);
    assert_eq!(
        header(&headers, "content-range"),
        Some(format!("bytes 1048576-{}/{IMAGE_LEN}", IMAGE_LEN - 1).as_str())
    );
    assert!(std::fs::read(resumed)? == ctx.image, "resumed file differs");

    // If-Range: the current ETag keeps the range, a stale one gets it all.
    let (_, headers) = curl(&["-I", &url]).await?;
    let etag = header(&headers, "etag").context("no etag")?.to_owned();
    let (code, _) = curl(&[
        "-r",
        "0-9",
        "-H",
        &format!("If-Range: {etag}"),
        "-o",
        out.to_str().unwrap(),
        &url,
    ])
    .await?;
    assert_eq!(code, 206);
    assert!(std::fs::read(&out)? == ctx.image[..10]);
    let (code, _) = curl(&[
        "-r",
        "0-9",
        "-H",
        "If-Range: \"stale\"",
        "-o",
        out.to_str().unwrap(),
        &url,
    ])
    .await?;
    assert_eq!(code, 200);
    assert!(std::fs::read(&out)? == ctx.image);
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etag_head_and_conditional_get() -> Result<()> {
    let ctx = TestContext::new(4).await?;
    let url = ctx.url(IMAGE);
    let (code, headers) = curl(&["-I", &url]).await?;
    assert_eq!(code, 200);
    assert_eq!(
        header(&headers, "content-length"),
        Some(IMAGE_LEN.to_string().as_str())
    );
    assert_eq!(header(&headers, "accept-ranges"), Some("bytes"));
    let etag = header(&headers, "etag").context("no etag")?.to_owned();
    let modified = header(&headers, "last-modified")
        .context("no last-modified")?
        .to_owned();

    let (code, _) = curl(&["-H", &format!("If-None-Match: {etag}"), &url]).await?;
    assert_eq!(code, 304);
    let (code, _) = curl(&["-H", &format!("If-Modified-Since: {modified}"), &url]).await?;
    assert_eq!(code, 304);
    let (code, _) = curl(&["-H", "If-None-Match: \"other\"", "-o", "/dev/null", &url]).await?;
    assert_eq!(code, 200);
    let (code, _) = curl(&["-H", "If-Match: \"other\"", "-o", "/dev/null", &url]).await?;
    assert_eq!(code, 412);

    // HEAD and conditional hits stream nothing: no download records.
    assert!(ctx.downloads().iter().all(|d| d.bytes == IMAGE_LEN as u64));
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_files_and_no_escape() -> Result<()> {
    let ctx = TestContext::new(4).await?;
    let out = ctx.out("ipxe.out");
    let (code, _) = curl(&["-o", out.to_str().unwrap(), &ctx.url("/boot/ipxe.efi")]).await?;
    assert_eq!(code, 200);
    assert_eq!(std::fs::read(&out)?, b"MZ not really an EFI binary");

    // A FIFO is not a file to serve, and opening it must not wait for a
    // writer.
    nix::unistd::mkfifo(
        &ctx.dir.path().join("images/compute/3/pipe"),
        nix::sys::stat::Mode::S_IRWXU,
    )?;
    let (code, _) = curl(&["-o", "/dev/null", &ctx.url("/images/compute/3/pipe")]).await?;
    assert_eq!(code, 404);

    for path in [
        "/images/../../etc/passwd",
        "/images/../../../../../../etc/passwd",
        "/images/%2e%2e/%2e%2e/etc/passwd",
        "/images/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/images/..%2f..%2f..%2f..%2fetc/passwd",
        "/images//etc/passwd",
        "/boot/../images/compute/3/rootfs.tar.zst",
        "/boot/%2e%2e/%2e%2e/etc/passwd",
        "/images/compute/3/",
        "/nothing",
    ] {
        let body = ctx.out("escape");
        let (code, _) = curl(&[
            "--path-as-is",
            "-o",
            body.to_str().unwrap(),
            &format!("http://{}{path}", ctx.addr),
        ])
        .await?;
        assert!((400..500).contains(&code), "{path}: {code}");
        let body = std::fs::read(&body).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&body).contains("root:"),
            "{path} leaked"
        );
    }
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_refuses_beyond_the_limit_and_frees_on_disconnect() -> Result<()> {
    let ctx = TestContext::new(2).await?;
    let mut registry = Registry::with_prefix("mprov");
    ctx.state.metrics().register(&mut registry);
    let metrics = metrics_router(Arc::new(registry));

    let mut first = slow_stream(&ctx)?;
    let mut second = slow_stream(&ctx)?;
    ctx.wait_for("two open streams", |c| {
        c.state.metrics().active_streams() == 2
    })
    .await?;

    // The third is refused at once, with a Retry-After within base + jitter.
    let (code, headers) = curl(&["-o", "/dev/null", &ctx.url(IMAGE)]).await?;
    assert_eq!(code, 503);
    let retry: u64 = header(&headers, "retry-after")
        .context("no retry-after")?
        .parse()?;
    assert!((5..=15).contains(&retry), "retry-after {retry}");
    assert_eq!(ctx.state.metrics().rejected_streams(), 1);
    // Small files outside /images/ are not streams.
    let (code, _) = curl(&["-o", "/dev/null", &ctx.url("/boot/ipxe.efi")]).await?;
    assert_eq!(code, 200);

    // One client goes away: its permit comes back and the download is
    // reported as stopped.
    first.kill().await?;
    ctx.wait_for("a freed permit", |c| {
        c.state.metrics().active_streams() == 1
    })
    .await?;
    ctx.wait_for("the stopped download", |c| {
        c.downloads()
            .iter()
            .any(|d| matches!(d.outcome, Outcome::Failed(_)))
    })
    .await?;
    let stopped = ctx.downloads();
    let stopped = stopped
        .iter()
        .find(|d| matches!(d.outcome, Outcome::Failed(_)))
        .unwrap();
    assert!(stopped.bytes < BIG_LEN);
    assert!(
        stopped.log_line().starts_with(
            "provisioning: c01 (127.0.0.1) stopped getting big.bin of image compute after "
        ),
        "{}",
        stopped.log_line()
    );

    // Now a new stream is admitted and completes.
    let out = ctx.out("admitted");
    let (code, _) = curl(&["-o", out.to_str().unwrap(), &ctx.url(IMAGE)]).await?;
    assert_eq!(code, 200);
    assert!(std::fs::read(&out)? == ctx.image);

    second.kill().await?;
    ctx.wait_for("no open streams", |c| {
        c.state.metrics().active_streams() == 0
    })
    .await?;

    // The metrics listener's router exposes the counters.
    let response = metrics
        .oneshot(Request::get("/metrics").body(Body::empty())?)
        .await?;
    assert_eq!(response.status(), 200);
    let text = axum::body::to_bytes(response.into_body(), 1 << 20).await?;
    let text = String::from_utf8(text.to_vec())?;
    for line in [
        "mprov_http_rejected_streams_total 1",
        "mprov_http_active_streams 0",
        "mprov_http_requests_total{class=\"5xx\"} 1",
        "mprov_http_served_bytes_total ",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drops_open_streams_after_the_drain() -> Result<()> {
    let ctx = TestContext::new(2).await?;
    let mut stream = slow_stream(&ctx)?;
    ctx.wait_for("an open stream", |c| {
        c.state.metrics().active_streams() == 1
    })
    .await?;
    // `serve` returns although a client is still reading (the drain is 1 s;
    // 30 s only bounds the test). curl itself may take a while to notice, as
    // megabytes sit in its socket buffer.
    let TestContext {
        state,
        downloads,
        shutdown,
        server,
        dir,
        ..
    } = ctx;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .context("serve did not return")???;
    assert_eq!(state.metrics().active_streams(), 0);
    let downloads = downloads.lock().unwrap().clone();
    assert_eq!(downloads.len(), 1);
    assert_eq!(
        downloads[0].outcome,
        Outcome::Failed("the server shut down".into())
    );
    stream.kill().await?;
    drop(dir);
    Ok(())
}

/// Sends `request` on a fresh connection and reads until the server closes
/// it (bounded by 20 s).
async fn raw(addr: SocketAddr, request: &[u8]) -> Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(request).await?;
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut reply))
        .await
        .context("the server did not close the connection")??;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_200_parallel_downloads_and_wget_resume() -> Result<()> {
    // Enough permits for every parallel image download below.
    let ctx = TestContext::new(64).await?;
    // One curl run, two downloads: the second reuses the connection.
    let (first, second) = (ctx.out("first"), ctx.out("second"));
    let output = Command::new("curl")
        .args(["-sS", "-v", "--max-time", "60"])
        .args(["-o", first.to_str().unwrap(), &ctx.url(IMAGE)])
        .args(["-o", second.to_str().unwrap(), &ctx.url("/boot/ipxe.efi")])
        .stdin(Stdio::null())
        .output()
        .await?;
    ensure!(output.status.success(), "curl failed");
    let verbose = String::from_utf8_lossy(&output.stderr);
    assert!(
        verbose.contains("Re-using existing connection"),
        "{verbose}"
    );
    assert!(std::fs::read(&first)? == ctx.image);
    assert_eq!(std::fs::read(&second)?, b"MZ not really an EFI binary");

    // 200 downloads at once (curl --parallel, URL globbing): all complete
    // and byte-identical, the image ones each logged.
    let many = ctx.out("many");
    std::fs::create_dir(&many)?;
    let output = Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "120", "--parallel"])
        .args(["--parallel-max", "200"])
        .arg("-o")
        .arg(many.join("boot#1"))
        .arg(format!("{}?n=[1-180]", ctx.url("/boot/ipxe.efi")))
        .arg("-o")
        .arg(many.join("image#1"))
        .arg(format!("{}?n=[1-20]", ctx.url(IMAGE)))
        .stdin(Stdio::null())
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "curl --parallel failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    for n in 1..=180 {
        assert_eq!(
            std::fs::read(many.join(format!("boot{n}")))?,
            b"MZ not really an EFI binary"
        );
    }
    for n in 1..=20 {
        assert!(std::fs::read(many.join(format!("image{n}")))? == ctx.image);
    }
    ctx.wait_for("21 image downloads logged", |c| c.downloads().len() == 21)
        .await?;
    assert!(
        ctx.downloads()
            .iter()
            .all(|d| d.outcome == Outcome::Completed)
    );

    // wget -c finishes a partial file with a range request.
    let partial = ctx.out("partial");
    std::fs::write(&partial, &ctx.image[..1_000_000])?;
    let status = Command::new("wget")
        .args(["-q", "-c", "-O", partial.to_str().unwrap(), &ctx.url(IMAGE)])
        .stdin(Stdio::null())
        .status()
        .await?;
    ensure!(status.success(), "wget -c failed: {status}");
    assert!(
        std::fs::read(&partial)? == ctx.image,
        "resumed file differs"
    );
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelining_and_refused_requests() -> Result<()> {
    let ctx = TestContext::new(4).await?;
    // Three pipelined requests in one write: answered in order, the HEAD of
    // a missing file with no body (else the third reply would be garbled).
    let reply = raw(
        ctx.addr,
        b"GET /boot/ipxe.efi HTTP/1.1\r\nHost: x\r\n\r\n\
          HEAD /boot/missing HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /boot/ipxe.efi HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await?;
    let parts: Vec<&str> = reply.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(parts.len(), 3, "{reply}");
    assert!(parts[0].starts_with("200 OK\r\n"), "{reply}");
    assert!(
        parts[0].ends_with("\r\n\r\nMZ not really an EFI binary"),
        "{reply}"
    );
    assert!(parts[1].starts_with("404 Not Found\r\n"), "{reply}");
    assert!(parts[1].ends_with("\r\n\r\n"), "{reply}");
    assert!(parts[2].contains("Connection: close\r\n"), "{reply}");
    assert!(parts[2].ends_with("MZ not really an EFI binary"), "{reply}");

    for (request, status) in [
        (
            &b"POST /images/x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"[..],
            "405",
        ),
        (
            b"GET /boot/ipxe.efi HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            "400",
        ),
        (
            b"GET /boot/ipxe.efi HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "400",
        ),
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", "400"),
        (
            b"GET /boot/ipxe.efi HTTP/1.1\r\nConnection: close\r\n\r\n",
            "200",
        ),
    ] {
        let reply = raw(ctx.addr, request).await?;
        assert!(
            reply.starts_with(&format!("HTTP/1.1 {status} ")),
            "{request:?}: {reply}"
        );
        if status == "405" {
            assert!(reply.contains("\r\nAllow: GET, HEAD\r\n"), "{reply}");
        }
    }
    // A client that sends a body along with a refused request still reads
    // its 405 (the server drains what it did not read before closing).
    let mut put = b"PUT /images/x HTTP/1.1\r\nContent-Length: 32768\r\n\r\n".to_vec();
    put.resize(put.len() + 32768, b'x');
    let reply = raw(ctx.addr, &put).await?;
    assert!(reply.starts_with("HTTP/1.1 405 "), "{reply}");
    // curl uploading 3 MB gets the 405, not a reset.
    let upload = format!("@{}", ctx.dir.path().join(IMAGE).display());
    let (code, headers) = curl(&["-X", "PUT", "--data-binary", &upload, &ctx.url(IMAGE)]).await?;
    assert_eq!(code, 405);
    assert_eq!(header(&headers, "allow"), Some("GET, HEAD"));

    let huge = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(20_000));
    assert!(
        raw(ctx.addr, huge.as_bytes())
            .await?
            .starts_with("HTTP/1.1 431 ")
    );
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_and_stalled_readers_are_dropped() -> Result<()> {
    let ctx = TestContext::with(2, |config| {
        config.head_timeout = Duration::from_secs(1);
        config.stall_timeout = Duration::from_secs(1);
    })
    .await?;
    // Half a head, then nothing: 408 and a close after the head timeout.
    let reply = raw(ctx.addr, b"GET /boot/ipxe.efi HTTP/1.1\r\nHost:").await?;
    assert!(reply.starts_with("HTTP/1.1 408 "), "{reply}");

    // A client that asks for the big file and never reads: abandoned, and
    // its permit comes back.
    let mut stream = TcpStream::connect(ctx.addr).await?;
    stream
        .write_all(format!("GET /{BIG} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await?;
    ctx.wait_for("the abandoned download", |c| !c.downloads().is_empty())
        .await?;
    let d = &ctx.downloads()[0];
    assert_eq!(
        d.outcome,
        Outcome::Failed("the client stopped reading for 1 s".into())
    );
    assert!(d.bytes > 0 && d.bytes < BIG_LEN, "{} bytes", d.bytes);
    assert_eq!(ctx.state.metrics().active_streams(), 0);
    drop(stream);
    ctx.cleanup().await
}
