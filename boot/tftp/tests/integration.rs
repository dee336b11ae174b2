//! Integration tests: the server runs in-process on 127.0.0.1:0 and real
//! clients nobody here wrote (tftp-hpa's `tftp`, `atftp`) fetch from it; the
//! fetched files are byte-compared. A small raw client built on the crate's
//! codec covers what those clients cannot do on purpose (abort after the
//! OACK, stop acknowledging, send a WRQ).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use mprov_tftp::codec::{self, ErrorCode, Mode, Packet, Request, TftpOption};
use mprov_tftp::{RunError, Server, TftpConfig};
use prometheus_client::registry::Registry;
use tempfile::TempDir;
use tokio::net::UdpSocket;
use tokio::process::Command;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Guard against a hung client; never an assertion about speed.
const CLIENT_GUARD: Duration = Duration::from_secs(120);
/// How long the raw client waits for one packet before failing the test.
const RECV_GUARD: Duration = Duration::from_secs(10);

struct TestContext {
    addr: SocketAddr,
    /// The address clients send to: the listener's, or on a wildcard
    /// listener 127.0.0.2, a second loopback address, so that a reply from
    /// the routed address (127.0.0.1) instead of the one asked shows.
    host: IpAddr,
    root: TempDir,
    out: TempDir,
    registry: Registry,
    shutdown: CancellationToken,
    handle: JoinHandle<Result<(), RunError>>,
}

impl TestContext {
    async fn start(configure: impl FnOnce(&mut TftpConfig)) -> Result<Self> {
        Self::start_at("127.0.0.1:0", configure).await
    }

    async fn start_at(bind: &str, configure: impl FnOnce(&mut TftpConfig)) -> Result<Self> {
        Self::start_hooked(bind, configure, |server| server).await
    }

    /// Like [`TestContext::start_at`], `hook` adding to the server.
    async fn start_hooked(
        bind: &str,
        configure: impl FnOnce(&mut TftpConfig),
        hook: impl FnOnce(Server) -> Server,
    ) -> Result<Self> {
        let root = tempfile::tempdir()?;
        let out = tempfile::tempdir()?;
        let mut config = TftpConfig::new(root.path());
        configure(&mut config);
        let mut registry = Registry::default();
        let server = hook(Server::new(config, &mut registry));
        let socket = UdpSocket::bind(bind).await?;
        let addr = socket.local_addr()?;
        let host = if addr.ip().is_unspecified() {
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))
        } else {
            addr.ip()
        };
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(server.run(socket, shutdown.clone()));
        Ok(TestContext {
            addr,
            host,
            root,
            out,
            registry,
            shutdown,
            handle,
        })
    }

    /// Stops the server and checks it shut down cleanly.
    async fn cleanup(self) -> Result<()> {
        self.shutdown.cancel();
        tokio::time::timeout(CLIENT_GUARD, self.handle)
            .await
            .context("server did not stop")???;
        Ok(())
    }

    fn write(&self, name: &str, data: &[u8]) -> Result<()> {
        let path = self.root.path().join(name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, data).with_context(|| format!("write {}", path.display()))
    }

    fn out(&self, name: &str) -> PathBuf {
        self.out.path().join(name)
    }

    /// The value of one metric in the text exposition, 0 if absent.
    fn metric(&self, name: &str) -> f64 {
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            return f64::NAN;
        }
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    /// Bounded polling until `name` reaches `want` (the server updates
    /// metrics after the client has finished).
    async fn wait_metric(&self, name: &str, want: f64) -> Result<()> {
        for _ in 0..500 {
            if self.metric(name) == want {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("{name} is {}, want {want}", self.metric(name))
    }

    async fn tftp_hpa(&self, mode: &str, remote: &str, local: &Path) -> Result<Output> {
        let mut cmd = Command::new("tftp");
        cmd.arg(self.host.to_string())
            .arg(self.addr.port().to_string())
            .args(["-m", mode, "-c", "get", remote])
            .arg(local);
        run(cmd).await
    }

    async fn atftp(&self, options: &[&str], remote: &str, local: &Path) -> Result<Output> {
        let mut cmd = Command::new("atftp");
        for opt in options {
            cmd.args(["--option", opt]);
        }
        cmd.args(["-g", "-r", remote, "-l"])
            .arg(local)
            .arg(self.host.to_string())
            .arg(self.addr.port().to_string());
        run(cmd).await
    }
}

async fn run(mut cmd: Command) -> Result<Output> {
    cmd.kill_on_drop(true).stdin(std::process::Stdio::null());
    let child = cmd.output();
    let output = tokio::time::timeout(CLIENT_GUARD, child)
        .await
        .with_context(|| format!("{cmd:?} hung"))?
        .with_context(|| format!("{cmd:?}"))?;
    Ok(output)
}

fn describe(output: &Output) -> String {
    format!(
        "status {}, stdout {:?}, stderr {:?}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A client run that succeeded and fetched exactly `want`.
fn check_fetched(output: &Output, local: &Path, want: &[u8]) -> Result<()> {
    ensure!(
        output.status.success(),
        "client failed: {}",
        describe(output)
    );
    let got = std::fs::read(local).with_context(|| format!("read {}", local.display()))?;
    ensure!(
        got.len() == want.len(),
        "fetched {} bytes, want {}: {}",
        got.len(),
        want.len(),
        describe(output)
    );
    ensure!(got == want, "fetched bytes differ");
    Ok(())
}

/// A client run that did not fetch anything: it reported the error, and no
/// file content came through.
fn check_refused(output: &Output, local: &Path, expect: &str) -> Result<()> {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        text.contains(expect),
        "want {expect:?} in the client's output: {}",
        describe(output)
    );
    let len = std::fs::metadata(local).map(|m| m.len()).unwrap_or(0);
    ensure!(len == 0, "{len} bytes were fetched");
    Ok(())
}

/// Deterministic pseudo-random bytes (xorshift64*), so failures reproduce.
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A raw client on the crate's codec, for behaviour real clients do not show.
struct RawClient {
    socket: UdpSocket,
    server: SocketAddr,
    buf: Vec<u8>,
}

impl RawClient {
    async fn new(server: SocketAddr) -> Result<Self> {
        Ok(RawClient {
            socket: UdpSocket::bind("127.0.0.1:0").await?,
            server,
            buf: vec![0; 65536],
        })
    }

    async fn send_to(&self, packet: &Packet<'_>, to: SocketAddr) -> Result<()> {
        self.socket.send_to(&packet.to_vec()?, to).await?;
        Ok(())
    }

    async fn rrq(&self, filename: &str, options: &[(&str, &str)]) -> Result<()> {
        let options = options
            .iter()
            .map(|(name, value)| TftpOption {
                name,
                value: (*value).into(),
            })
            .collect();
        let packet = Packet::Rrq(Request {
            filename,
            mode: Mode::Octet,
            options,
        });
        self.send_to(&packet, self.server).await
    }

    /// The next packet, as an owned debug-friendly value, and its sender.
    async fn recv(&mut self) -> Result<(Packet<'_>, SocketAddr)> {
        let (len, from) = tokio::time::timeout(RECV_GUARD, self.socket.recv_from(&mut self.buf))
            .await
            .context("no packet from the server")??;
        let packet = codec::parse(&self.buf[..len]).context("server sent a malformed packet")?;
        Ok((packet, from))
    }

    async fn expect_error(&mut self, code: ErrorCode) -> Result<()> {
        match self.recv().await? {
            (Packet::Error { code: got, .. }, _) if got == code => Ok(()),
            (other, _) => bail!("want error {code:?}, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tftp_hpa_fetches_small_file_in_octet_and_netascii() -> Result<()> {
    let ctx = TestContext::start(|_| {}).await?;
    let data = random_bytes(1500, 1);
    ctx.write("small.bin", &data)?;
    let local = ctx.out("small.bin");
    check_fetched(
        &ctx.tftp_hpa("binary", "small.bin", &local).await?,
        &local,
        &data,
    )?;

    // netascii: the client turns CR LF back into LF and CR NUL back into CR.
    let text = b"line one\nline two\r\nbare\rcarriage\n".repeat(100);
    ctx.write("text.txt", &text)?;
    let local = ctx.out("text.txt");
    check_fetched(
        &ctx.tftp_hpa("netascii", "text.txt", &local).await?,
        &local,
        &text,
    )?;

    // An absolute name resolves under the root.
    ctx.write("sub/dir/file", b"nested")?;
    let local = ctx.out("nested");
    check_fetched(
        &ctx.tftp_hpa("binary", "/sub/dir/file", &local).await?,
        &local,
        b"nested",
    )?;

    // An empty file is one empty DATA block.
    ctx.write("empty", b"")?;
    let local = ctx.out("empty");
    check_fetched(&ctx.tftp_hpa("binary", "empty", &local).await?, &local, b"")?;
    // A file of exactly one block needs a second, empty block.
    let block = random_bytes(512, 2);
    ctx.write("block", &block)?;
    let local = ctx.out("block");
    check_fetched(
        &ctx.tftp_hpa("binary", "block", &local).await?,
        &local,
        &block,
    )?;

    ctx.wait_metric("tftp_transfers_completed_total", 5.0)
        .await?;
    ensure!(ctx.metric("tftp_transfers_failed_total") == 0.0);
    ensure!(ctx.metric("tftp_transfers_active") == 0.0);
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atftp_fetches_5mib_with_windowsize_1_16_64() -> Result<()> {
    let ctx = TestContext::start(|_| {}).await?;
    let data = random_bytes(5 * 1024 * 1024, 3);
    ctx.write("big.bin", &data)?;
    for window in ["1", "16", "64"] {
        let local = ctx.out(&format!("big-{window}"));
        let windowsize = format!("windowsize {window}");
        let output = ctx
            .atftp(&["blksize 1468", &windowsize, "tsize 0"], "big.bin", &local)
            .await?;
        check_fetched(&output, &local, &data).with_context(|| format!("windowsize {window}"))?;
    }
    ctx.wait_metric("tftp_transfers_completed_total", 3.0)
        .await?;
    ensure!(ctx.metric("tftp_bytes_sent_total") >= 3.0 * data.len() as f64);
    ctx.cleanup().await
}

/// On a wildcard listener every reply leaves from the address the request
/// was sent to (`IP_PKTINFO`), not from the routed one: firmware drops DATA
/// from any other address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_listener_replies_from_the_address_asked() -> Result<()> {
    let ctx = TestContext::start_at("0.0.0.0:0", |_| {}).await?;
    let data = random_bytes(300_000, 11);
    ctx.write("kpxe", &data)?;
    let asked = SocketAddr::new(ctx.host, ctx.addr.port());

    let mut client = RawClient::new(asked).await?;
    client.rrq("kpxe", &[]).await?;
    let (packet, from) = client.recv().await?;
    ensure!(
        matches!(packet, Packet::Data { block: 1, .. }),
        "want DATA 1, got {packet:?}"
    );
    ensure!(
        from.ip() == ctx.host,
        "DATA came from {from}, the request went to {asked}"
    );
    ensure!(
        from.port() != ctx.addr.port(),
        "DATA must come from a new transfer ID"
    );

    // A real client, over the same wildcard listener.
    let local = ctx.out("kpxe");
    let output = ctx.atftp(&["blksize 1468"], "kpxe", &local).await?;
    check_fetched(&output, &local, &data)?;
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atftp_fetches_the_ipxe_binaries() -> Result<()> {
    let ctx = TestContext::start(|_| {}).await?;
    for name in ["undionly.kpxe", "snponly.efi", "ipxe.efi"] {
        let data = std::fs::read(Path::new("/usr/lib/ipxe").join(name))
            .with_context(|| format!("the Debian ipxe package provides {name}"))?;
        ctx.write(name, &data)?;
        let local = ctx.out(name);
        // The options EDK2 sends.
        let output = ctx
            .atftp(&["tsize 0", "blksize 1468"], name, &local)
            .await?;
        check_fetched(&output, &local, &data).with_context(|| name.to_owned())?;
    }
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atftp_block_numbers_roll_over() -> Result<()> {
    let ctx = TestContext::start(|_| {}).await?;
    // 600 KiB in 8-byte blocks is 76,801 blocks: past 65,535.
    let data = random_bytes(600 * 1024, 4);
    ctx.write("roll.bin", &data)?;
    let local = ctx.out("roll.bin");
    let output = ctx
        .atftp(&["blksize 8", "windowsize 16"], "roll.bin", &local)
        .await?;
    check_fetched(&output, &local, &data)?;
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blksize_and_windowsize_are_capped() -> Result<()> {
    let ctx = TestContext::start(|c| c.max_windowsize = 8).await?;
    let data = random_bytes(100_000, 5);
    ctx.write("f", &data)?;
    let mut client = RawClient::new(ctx.addr).await?;
    client
        .rrq(
            "f",
            &[
                ("blksize", "65464"),
                ("windowsize", "1000"),
                ("tsize", "0"),
                ("foo", "1"),
            ],
        )
        .await?;
    let (packet, _) = client.recv().await?;
    let want = Packet::Oack {
        options: vec![
            TftpOption {
                name: "blksize",
                value: "1468".into(),
            },
            TftpOption {
                name: "windowsize",
                value: "8".into(),
            },
            TftpOption {
                name: "tsize",
                value: "100000".into(),
            },
        ],
    };
    ensure!(packet == want, "got {packet:?}");
    // A real client gets the capped values too and still fetches the file.
    let local = ctx.out("f");
    let output = ctx
        .atftp(&["blksize 65464", "windowsize 1000"], "f", &local)
        .await?;
    check_fetched(&output, &local, &data)?;
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_cannot_escape_the_root() -> Result<()> {
    let ctx = TestContext::start(|_| {}).await?;
    let outside = tempfile::tempdir()?;
    std::fs::write(outside.path().join("secret"), b"secret")?;
    std::os::unix::fs::symlink(outside.path().join("secret"), ctx.root.path().join("out"))?;
    std::os::unix::fs::symlink(outside.path(), ctx.root.path().join("outdir"))?;

    // Real clients: each refused request leaves them with an error.
    for (i, name) in [
        "../etc/passwd",
        "/etc/passwd",
        "out",
        "outdir/secret",
        "a/../../etc/passwd",
    ]
    .into_iter()
    .enumerate()
    {
        let local = ctx.out(&format!("hpa-{i}"));
        let output = ctx.tftp_hpa("binary", name, &local).await?;
        check_refused(&output, &local, "Error code").with_context(|| name.to_owned())?;
        let local = ctx.out(&format!("atftp-{i}"));
        let output = ctx.atftp(&[], name, &local).await?;
        ensure!(
            !output.status.success(),
            "atftp fetched {name}: {}",
            describe(&output)
        );
        check_refused(&output, &local, "").with_context(|| name.to_owned())?;
    }

    // The raw client sees the exact codes.
    let mut client = RawClient::new(ctx.addr).await?;
    for (name, code) in [
        ("../etc/passwd", ErrorCode::AccessViolation),
        ("out", ErrorCode::AccessViolation),
        ("outdir/secret", ErrorCode::AccessViolation),
        ("/etc/passwd", ErrorCode::FileNotFound),
        ("/", ErrorCode::FileNotFound),
    ] {
        client.rrq(name, &[]).await?;
        client
            .expect_error(code)
            .await
            .with_context(|| name.to_owned())?;
    }
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_file_is_an_error() -> Result<()> {
    let ctx = TestContext::start(|_| {}).await?;
    let local = ctx.out("missing-hpa");
    let output = ctx.tftp_hpa("binary", "missing", &local).await?;
    check_refused(&output, &local, "Error code 1")?;
    let local = ctx.out("missing-atftp");
    let output = ctx.atftp(&["tsize 0"], "missing", &local).await?;
    ensure!(!output.status.success(), "atftp: {}", describe(&output));
    check_refused(&output, &local, "")?;
    let mut client = RawClient::new(ctx.addr).await?;
    client.rrq("missing", &[("tsize", "0")]).await?;
    client.expect_error(ErrorCode::FileNotFound).await?;
    ctx.wait_metric("tftp_transfers_failed_total", 3.0).await?;
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_requests_are_refused() -> Result<()> {
    let ctx = TestContext::start(|_| {}).await?;
    let local = ctx.out("upload");
    std::fs::write(&local, b"upload")?;
    let mut cmd = Command::new("atftp");
    cmd.args(["-p", "-r", "upload", "-l"])
        .arg(&local)
        .arg("127.0.0.1")
        .arg(ctx.addr.port().to_string());
    let output = run(cmd).await?;
    ensure!(!output.status.success(), "atftp put: {}", describe(&output));
    ensure!(!ctx.root.path().join("upload").exists());

    let mut client = RawClient::new(ctx.addr).await?;
    let wrq = Packet::Wrq(Request {
        filename: "upload",
        mode: Mode::Octet,
        options: vec![],
    });
    client.send_to(&wrq, ctx.addr).await?;
    client.expect_error(ErrorCode::AccessViolation).await?;
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_probe_abort_is_not_a_failure() -> Result<()> {
    let ctx = TestContext::start(|_| {}).await?;
    ctx.write("ipxe.efi", &random_bytes(4000, 6))?;
    let mut client = RawClient::new(ctx.addr).await?;
    // What EDK2 does: ask for the size, then abort.
    client
        .rrq("ipxe.efi", &[("tsize", "0"), ("blksize", "1468")])
        .await?;
    let (packet, tid) = client.recv().await?;
    let want = Packet::Oack {
        options: vec![
            TftpOption {
                name: "tsize",
                value: "4000".into(),
            },
            TftpOption {
                name: "blksize",
                value: "1468".into(),
            },
        ],
    };
    ensure!(packet == want, "got {packet:?}");
    ensure!(tid != ctx.addr, "the transfer must come from its own port");
    ensure!(
        tid.ip() == ctx.addr.ip(),
        "the transfer must come from the listener's IP"
    );
    let abort = Packet::Error {
        code: ErrorCode::OptionRefused,
        message: "User aborted".into(),
    };
    client.send_to(&abort, tid).await?;
    ctx.wait_metric("tftp_transfers_aborted_total", 1.0).await?;
    ctx.wait_metric("tftp_transfers_active", 0.0).await?;
    ensure!(ctx.metric("tftp_transfers_failed_total") == 0.0);
    ctx.cleanup().await
}

/// `on_sent` hears of each transfer a client completed (the job server puts
/// it on the boot timeline), with the client's address and the size, and
/// not of a size probe the client aborted after the OACK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_transfers_are_told_and_size_probes_are_not() -> Result<()> {
    let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::<mprov_tftp::Sent>::new()));
    let heard = std::sync::Arc::clone(&sent);
    let ctx = TestContext::start_hooked(
        "127.0.0.1:0",
        |_| {},
        move |server| {
            server.on_sent(move |s| {
                heard
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(s.clone());
            })
        },
    )
    .await?;
    let data = random_bytes(300_000, 9);
    ctx.write("snponly.efi", &data)?;
    let mut client = RawClient::new(ctx.addr).await?;
    client.rrq("snponly.efi", &[("tsize", "0")]).await?;
    let (_, tid) = client.recv().await?;
    let abort = Packet::Error {
        code: ErrorCode::OptionRefused,
        message: "User aborted".into(),
    };
    client.send_to(&abort, tid).await?;
    ctx.wait_metric("tftp_transfers_aborted_total", 1.0).await?;
    let local = ctx.out("snponly.efi");
    let output = ctx.atftp(&["blksize 1468"], "snponly.efi", &local).await?;
    check_fetched(&output, &local, &data)?;
    ctx.wait_metric("tftp_transfers_completed_total", 1.0)
        .await?;
    let told = sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
    ensure!(told.len() == 1, "one completed transfer told: {told:?}");
    ensure!(
        told[0].file == "snponly.efi"
            && told[0].bytes == data.len() as u64
            && told[0].peer.ip() == ctx.host,
        "{told:?}"
    );
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacknowledged_blocks_are_retransmitted_then_the_transfer_fails() -> Result<()> {
    let ctx = TestContext::start(|c| {
        c.retries = 2;
        c.timeout = Duration::from_millis(100);
    })
    .await?;
    ctx.write("f", &random_bytes(2000, 7))?;
    let mut client = RawClient::new(ctx.addr).await?;
    client.rrq("f", &[]).await?;
    let mut tids = Vec::new();
    // The first send and two retransmissions of block 1, never acknowledged.
    for _ in 0..3 {
        match client.recv().await? {
            (Packet::Data { block: 1, data }, tid) if data.len() == 512 => tids.push(tid),
            (other, _) => bail!("want DATA 1, got {other:?}"),
        }
    }
    ensure!(
        tids.iter().all(|t| *t == tids[0]),
        "retransmissions changed TID: {tids:?}"
    );
    ctx.wait_metric("tftp_transfers_failed_total", 1.0).await?;
    ctx.wait_metric("tftp_transfers_active", 0.0).await?;
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_server_refuses_with_an_error() -> Result<()> {
    let ctx = TestContext::start(|c| c.max_transfers = 1).await?;
    ctx.write("f", &random_bytes(2000, 8))?;
    let mut first = RawClient::new(ctx.addr).await?;
    first.rrq("f", &[]).await?;
    let tid = match first.recv().await? {
        (Packet::Data { block: 1, .. }, tid) => tid,
        (other, _) => bail!("want DATA 1, got {other:?}"),
    };
    let mut second = RawClient::new(ctx.addr).await?;
    second.rrq("f", &[]).await?;
    second.expect_error(ErrorCode::NotDefined).await?;
    ensure!(ctx.metric("tftp_requests_busy_total") == 1.0);
    // Once the first transfer ends, the slot is free again.
    let abort = Packet::Error {
        code: ErrorCode::NotDefined,
        message: "bye".into(),
    };
    first.send_to(&abort, tid).await?;
    ctx.wait_metric("tftp_transfers_active", 0.0).await?;
    let local = ctx.out("f");
    let output = ctx.tftp_hpa("binary", "f", &local).await?;
    check_fetched(&output, &local, &random_bytes(2000, 8))?;
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_packets_do_not_stop_the_server() -> Result<()> {
    let ctx = TestContext::start(|_| {}).await?;
    ctx.write("f", b"still here")?;
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
    let junk: [(&str, &[u8]); 6] = [
        ("an empty datagram", b""),
        ("half an opcode", b"\0"),
        ("a read request without its NUL", b"\0\x01no-nul"),
        ("an unknown opcode", b"\0\x09"),
        ("an ACK outside any transfer", b"\0\x04\0\x01"),
        ("an ERROR outside any transfer", b"\0\x05\0\0x\0"),
    ];
    for (what, packet) in junk {
        socket
            .send_to(packet, ctx.addr)
            .await
            .with_context(|| format!("sending {what}"))?;
    }
    let local = ctx.out("f");
    check_fetched(
        &ctx.tftp_hpa("binary", "f", &local).await?,
        &local,
        b"still here",
    )?;
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_fetches_all_succeed() -> Result<()> {
    let ctx = TestContext::start(|_| {}).await?;
    let data = random_bytes(1024 * 1024, 9);
    ctx.write("one.bin", &data)?;
    let mut fetches = tokio::task::JoinSet::new();
    for i in 0..200 {
        let local = ctx.out(&format!("one-{i}"));
        let port = ctx.addr.port().to_string();
        fetches.spawn(async move {
            let mut cmd = Command::new("atftp");
            cmd.args(["--option", "blksize 1468", "--option", "windowsize 16"])
                .args(["-g", "-r", "one.bin", "-l"])
                .arg(&local)
                .args(["127.0.0.1", &port]);
            (local, run(cmd).await)
        });
    }
    let mut failures = Vec::new();
    while let Some(joined) = fetches.join_next().await {
        let (local, output) = joined?;
        if let Err(err) = output.and_then(|o| check_fetched(&o, &local, &data)) {
            failures.push(format!("{}: {err:#}", local.display()));
        }
    }
    ensure!(
        failures.is_empty(),
        "{} failed: {failures:#?}",
        failures.len()
    );
    ctx.wait_metric("tftp_transfers_completed_total", 200.0)
        .await?;
    ensure!(ctx.metric("tftp_transfers_failed_total") == 0.0);
    ensure!(ctx.metric("tftp_requests_busy_total") == 0.0);
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_stalled_transfers() -> Result<()> {
    let ctx = TestContext::start(|c| {
        c.drain_timeout = Duration::from_millis(50);
        c.timeout = Duration::from_secs(100);
    })
    .await?;
    ctx.write("f", &random_bytes(2000, 10))?;
    let mut client = RawClient::new(ctx.addr).await?;
    client.rrq("f", &[]).await?;
    let (packet, _) = client.recv().await?;
    ensure!(
        matches!(packet, Packet::Data { block: 1, .. }),
        "got {packet:?}"
    );
    ctx.wait_metric("tftp_transfers_active", 1.0).await?;
    // The transfer would wait 100 s for its ACK; shutdown must not.
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockstep_block_numbers_wrap_to_zero() -> Result<()> {
    let ctx = TestContext::start(|_| {}).await?;
    // 530,000 bytes in 8-byte blocks: 66,251 blocks, so block 65,536 is
    // numbered 0 on the wire.
    let data = random_bytes(530_000, 11);
    ctx.write("f", &data)?;
    let mut client = RawClient::new(ctx.addr).await?;
    client.rrq("f", &[("blksize", "8")]).await?;
    let tid = match client.recv().await? {
        (Packet::Oack { .. }, tid) => tid,
        (other, _) => bail!("want OACK, got {other:?}"),
    };
    client.send_to(&Packet::Ack { block: 0 }, tid).await?;
    let mut got = Vec::with_capacity(data.len());
    let mut expected_block: u64 = 1;
    loop {
        let (block, last) = match client.recv().await? {
            (Packet::Data { block, data }, from) if from == tid => {
                got.extend_from_slice(data);
                (block, data.len() < 8)
            }
            (other, _) => bail!("want DATA {expected_block}, got {other:?}"),
        };
        ensure!(
            u64::from(block) == expected_block % 65536,
            "block {block} at {expected_block}"
        );
        client.send_to(&Packet::Ack { block }, tid).await?;
        if last {
            break;
        }
        expected_block += 1;
    }
    ensure!(expected_block > 65536, "did not roll over");
    ensure!(got == data, "fetched bytes differ");
    ctx.wait_metric("tftp_transfers_completed_total", 1.0)
        .await?;
    ctx.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_inside_a_window_restarts_after_it() -> Result<()> {
    let ctx = TestContext::start(|_| {}).await?;
    let data = random_bytes(512 * 9 + 100, 12);
    ctx.write("f", &data)?;
    let mut client = RawClient::new(ctx.addr).await?;
    client.rrq("f", &[("windowsize", "4")]).await?;
    let tid = match client.recv().await? {
        (Packet::Oack { .. }, tid) => tid,
        (other, _) => bail!("want OACK, got {other:?}"),
    };
    client.send_to(&Packet::Ack { block: 0 }, tid).await?;
    let mut blocks = Vec::new();
    for _ in 0..4 {
        match client.recv().await? {
            (Packet::Data { block, .. }, _) => blocks.push(block),
            (other, _) => bail!("want DATA, got {other:?}"),
        }
    }
    ensure!(blocks == [1, 2, 3, 4], "first window {blocks:?}");
    // Pretend block 3 was lost: acknowledge 2, the last in-order block
    // (RFC 7440 §4). The server goes back to 3.
    client.send_to(&Packet::Ack { block: 2 }, tid).await?;
    // A duplicate ACK must not trigger a retransmission of its own.
    client.send_to(&Packet::Ack { block: 2 }, tid).await?;
    let mut got = data[..1024].to_vec();
    let mut blocks = Vec::new();
    loop {
        match client.recv().await? {
            (Packet::Data { block, data }, _) => {
                blocks.push(block);
                got.extend_from_slice(data);
                let last = data.len() < 512;
                if block % 4 == 2 || last {
                    client.send_to(&Packet::Ack { block }, tid).await?;
                }
                if last {
                    break;
                }
            }
            (other, _) => bail!("want DATA, got {other:?}"),
        }
    }
    ensure!(
        blocks == [3, 4, 5, 6, 7, 8, 9, 10],
        "blocks after the ACK {blocks:?}"
    );
    ensure!(got == data, "fetched bytes differ");
    ctx.wait_metric("tftp_transfers_completed_total", 1.0)
        .await?;
    ctx.cleanup().await
}

#[test]
fn fuzz_corpus_replays() -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fuzz/corpus/tftp_packet");
    let mut seeds = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
        let data = std::fs::read(entry?.path())?;
        mprov_tftp::fuzz_packet(&data);
        seeds.push(data);
    }
    ensure!(!seeds.is_empty(), "no seeds in {}", dir.display());
    // A cheap stand-in for the fuzzer on stable: every truncation and
    // single-byte mutation of every seed, and random datagrams.
    for seed in &seeds {
        for len in 0..=seed.len() {
            mprov_tftp::fuzz_packet(&seed[..len]);
        }
        for (i, byte) in random_bytes(seed.len() * 8, seed.len() as u64)
            .into_iter()
            .enumerate()
        {
            let mut mutated = seed.clone();
            let at = i % mutated.len().max(1);
            if let Some(b) = mutated.get_mut(at) {
                *b = byte;
            }
            mprov_tftp::fuzz_packet(&mutated);
        }
    }
    for i in 0..20_000u64 {
        let mut data = random_bytes((i % 64) as usize, i);
        // Make most of them start with a valid opcode.
        if data.len() >= 2 {
            data[0] = 0;
            data[1] = (i % 7) as u8;
        }
        mprov_tftp::fuzz_packet(&data);
    }
    Ok(())
}
