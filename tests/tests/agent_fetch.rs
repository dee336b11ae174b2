//! The agent's image stream (`mprov_agent::image::fetch`, what `/init` runs
//! in step 3) against real `mprov-jobserver` processes on loopback, serving
//! an image made by GNU tar and the zstd tool:
//! - one job server serves a corrupted copy: the mismatch is detected, the
//!   staging area wiped, and the next job server's image verifies;
//! - a job server killed mid-stream and started again: the stream resumes
//!   with `Range` where it dropped; killed and left dead: the next one;
//! - a job server at its stream limit answers `503` + `Retry-After`: the
//!   agent waits as told and then streams;
//! - only corrupted copies: the fetch gives up with the staging area empty,
//!   never handing on an unverified root.
//!
//! The unpacked root is compared with the source tree by `diff -r`.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use mprov_agent::image::plan::{Next, SourceFailure};
use mprov_agent::image::{self, Event, Expected, FetchError, VerifiedRoot};
use mprov_unpack::UnpackOptions;
use sha2::{Digest, Sha256};

/// The image's path under a job server's export and URL root.
const IMAGE: &str = "images/compute/1/rootfs.tar.zst";

/// A job server on loopback, killed (SIGKILL, by its PID) when dropped.
struct JobServer {
    child: Option<Child>,
    addr: SocketAddr,
    metrics: SocketAddr,
    export: PathBuf,
    dir: PathBuf,
    extra: Vec<String>,
}

impl JobServer {
    fn start(dir: &Path, export: &Path, extra: &[&str]) -> Result<JobServer> {
        let mut server = JobServer {
            child: None,
            addr: free_port()?,
            metrics: free_port()?,
            export: export.to_path_buf(),
            dir: dir.to_path_buf(),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        server.spawn()?;
        Ok(server)
    }

    fn url(&self) -> String {
        format!("http://{}/{IMAGE}", self.addr)
    }

    /// Starts the process (again, on the same port) and waits until it
    /// accepts connections.
    fn spawn(&mut self) -> Result<()> {
        self.kill();
        let jobserver = mprov_tests::xtask::target_dir().join("debug/mprov-jobserver");
        ensure!(
            jobserver.is_file(),
            "{} is missing: `cargo test --workspace` builds it (or run cargo build -p mprov-boot)",
            jobserver.display()
        );
        let snapshot = self.dir.join("boot.json");
        std::fs::write(
            &snapshot,
            r#"{"revision": 1, "hosts": [{"ipv4": "127.0.0.1", "hostname": "n01", "bootable": true}]}"#,
        )?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("jobserver-{}.log", self.addr.port())))?;
        let listen = self.dir.join(format!("listen-{}.json", self.addr.port()));
        let _ = std::fs::remove_file(&listen);
        let mut child = Command::new(jobserver)
            .arg("--boot-config")
            .arg(&snapshot)
            .args(["--no-dhcp", "--no-tftp", "--no-dns", "--no-ra"])
            .arg("--http")
            .arg(self.addr.to_string())
            .arg("--metrics")
            .arg(self.metrics.to_string())
            .arg("--export")
            .arg(&self.export)
            .arg("--state-dir")
            .arg(self.dir.join(format!("state-{}", self.addr.port())))
            .arg("--listen-file")
            .arg(&listen)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting mprov-jobserver")?;
        let bound = mprov_tests::listen::wait(&listen, &mut child, Duration::from_secs(10));
        self.child = Some(child);
        ensure!(
            bound?.get("http")? == self.addr,
            "bound elsewhere than asked"
        );
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for JobServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port nobody listens on right now.
fn free_port() -> Result<SocketAddr> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?)
}

/// A root tree with `mib` MiB of incompressible files, a symlink and nested
/// folders, packed by GNU tar and zstd: (tree, rootfs.tar.zst).
fn make_image(dir: &Path, mib: usize) -> Result<(PathBuf, PathBuf)> {
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("usr/lib/data"))?;
    std::fs::create_dir_all(tree.join("etc"))?;
    std::fs::write(tree.join("etc/hostname"), "image\n")?;
    std::os::unix::fs::symlink("usr/lib", tree.join("lib"))?;
    let mut random = std::fs::File::open("/dev/urandom")?;
    for i in 0..mib {
        let mut data = vec![0u8; 1 << 20];
        std::io::Read::read_exact(&mut random, &mut data)?;
        std::fs::write(tree.join(format!("usr/lib/data/blob{i:02}")), data)?;
    }
    let archive = dir.join("rootfs.tar.zst");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "tar --numeric-owner -C '{}' -cf - . | zstd -q -3 -o '{}'",
            tree.display(),
            archive.display()
        ))
        .status()
        .context("running tar | zstd")?;
    ensure!(status.success(), "tar | zstd failed");
    Ok((tree, archive))
}

/// An export folder holding `bytes` as the image.
/// Sends `GET path` to `addr` from a socket with a 4 KiB receive buffer and
/// reads nothing: the download stays open on the server until it is dropped.
fn stalled_download(addr: SocketAddr, path: &str) -> Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.set_recv_buffer_size(4096)?;
    socket.connect(&addr.into())?;
    let mut stream = TcpStream::from(socket);
    std::io::Write::write_all(
        &mut stream,
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
    )?;
    Ok(stream)
}

fn export(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    let export = dir.join(name);
    let file = export.join(IMAGE);
    std::fs::create_dir_all(file.parent().context("parent")?)?;
    std::fs::write(&file, bytes)?;
    Ok(export)
}

/// `diff -r` of the source tree and the unpacked root.
fn same_tree(a: &Path, b: &Path) -> Result<()> {
    let out = Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(a)
        .arg(b)
        .output()
        .context("running diff")?;
    ensure!(
        out.status.success(),
        "the unpacked root differs from the image's tree:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}

/// The most a TCP receive and a send buffer can hold, in MiB.
fn socket_buffers_mib() -> Result<usize> {
    let max = |file: &str| -> Result<usize> {
        let text = std::fs::read_to_string(file)?;
        let max = text
            .split_whitespace()
            .last()
            .context("empty")?
            .parse::<usize>()?;
        Ok(max.div_ceil(1 << 20))
    };
    Ok(max("/proc/sys/net/ipv4/tcp_rmem")? + max("/proc/sys/net/ipv4/tcp_wmem")?)
}

/// What the fetch reported, simplified for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Started(String, u64),
    Busy(String, Duration),
    Dropped(String),
    Failed(String, String, bool),
    Verified(String),
}

fn seen(event: &Event<'_>) -> Option<Seen> {
    Some(match event {
        Event::Started { source, from } => Seen::Started((*source).to_owned(), *from),
        Event::Busy { source, wait } => Seen::Busy((*source).to_owned(), *wait),
        Event::Dropped { source, .. } => Seen::Dropped((*source).to_owned()),
        Event::SourceFailed { source, why, next } => Seen::Failed(
            (*source).to_owned(),
            match why {
                SourceFailure::Mismatch => "mismatch".to_owned(),
                SourceFailure::Dead(_) => "dead".to_owned(),
                other => other.to_string(),
            },
            matches!(next, Next::GiveUp),
        ),
        Event::Verified { source, .. } => Seen::Verified((*source).to_owned()),
        Event::Progress { .. } => return None,
    })
}

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    tree: PathBuf,
    good: Vec<u8>,
    expected: Expected,
    options: UnpackOptions,
}

impl Setup {
    /// Fetches the image from `sources` into `staging` with a fresh client,
    /// calling `react` on every event before it is logged: the outcome and
    /// what was seen.
    fn fetch(
        &self,
        sources: &[String],
        staging: &Path,
        react: impl Fn(&Event<'_>) + Sync,
    ) -> Result<(Result<VerifiedRoot, FetchError>, Vec<Seen>)> {
        let log = Mutex::new(Vec::new());
        let observe = |e: &Event<'_>| {
            react(e);
            log.lock().unwrap().extend(seen(e));
        };
        let client = image::client()?;
        let outcome = image::fetch(
            &client,
            sources,
            &self.expected,
            staging,
            self.options,
            &observe,
        );
        Ok((outcome, log.into_inner().unwrap()))
    }
}

/// An image of `mib` MiB.
fn setup(mib: usize) -> Result<Setup> {
    let dir = tempfile::tempdir()?;
    let (tree, archive) = make_image(dir.path(), mib)?;
    let good = std::fs::read(&archive)?;
    let expected = Expected {
        size: good.len() as u64,
        sha256: Sha256::digest(&good).into(),
    };
    Ok(Setup {
        root: dir.path().to_path_buf(),
        _dir: dir,
        tree,
        good,
        expected,
        options: UnpackOptions {
            whiteouts: false,
            preserve_owner: nix::unistd::geteuid().is_root(),
        },
    })
}

#[test]
fn a_corrupted_copy_is_detected_and_the_next_job_server_used() -> Result<()> {
    let s = setup(8)?;
    let mut bad = s.good.clone();
    let middle = bad.len() / 2;
    bad[middle] ^= 0x55;
    let a = JobServer::start(&s.root, &export(&s.root, "bad", &bad)?, &[])?;
    let b = JobServer::start(&s.root, &export(&s.root, "good", &s.good)?, &[])?;
    let staging = s.root.join("staging");
    std::fs::create_dir(&staging)?;

    let (root, log) = s.fetch(&[a.url(), b.url()], &staging, |_| {})?;
    let root = root?;
    assert_eq!(
        log,
        [
            Seen::Started(a.url(), 0),
            Seen::Failed(a.url(), "mismatch".into(), false),
            Seen::Started(b.url(), 0),
            Seen::Verified(b.url()),
        ]
    );
    assert_eq!(root.source(), b.url());
    same_tree(&s.tree, root.path())?;
    Ok(())
}

#[test]
fn only_corrupted_copies_give_up_with_the_staging_area_empty() -> Result<()> {
    let s = setup(8)?;
    let mut bad = s.good.clone();
    let end = bad.len() - 1;
    bad[end] ^= 0x01;
    let a = JobServer::start(&s.root, &export(&s.root, "bad", &bad)?, &[])?;
    let staging = s.root.join("staging");
    std::fs::create_dir(&staging)?;
    std::fs::write(staging.join("left-over"), "from an earlier attempt")?;

    let (result, log) = s.fetch(&[a.url()], &staging, |_| {})?;
    let err = result.expect_err("an image that never verifies");
    assert!(
        matches!(
            &err,
            FetchError::GaveUp {
                last: SourceFailure::Mismatch,
                ..
            }
        ),
        "{err}"
    );
    let failures: Vec<_> = log
        .iter()
        .filter(|e| matches!(e, Seen::Failed(..)))
        .collect();
    assert_eq!(failures.len() as u32, image::plan::MAX_ROUNDS, "{log:?}");
    assert!(!log.iter().any(|e| matches!(e, Seen::Verified(_))));
    assert_eq!(std::fs::read_dir(&staging)?.count(), 0, "staging not wiped");
    Ok(())
}

#[test]
fn a_job_server_killed_mid_stream_is_resumed_with_range_or_left_for_the_next() -> Result<()> {
    // Killed once 4 MiB have arrived, a server has sent at most what the
    // two socket buffers hold beyond that (tcp_rmem and tcp_wmem maxima;
    // 32 + 4 MiB here): an image larger than that is always cut mid-stream.
    let s = setup(4 + socket_buffers_mib()? + 16)?;
    let good = export(&s.root, "good", &s.good)?;
    let staging = s.root.join("staging");
    std::fs::create_dir(&staging)?;

    // Killed at 4 MiB and started again: the stream resumes on it.
    let a = Mutex::new(JobServer::start(&s.root, &good, &[])?);
    let b = JobServer::start(&s.root, &good, &[])?;
    let (a_url, b_url) = (a.lock().unwrap().url(), b.url());
    let killed = Mutex::new(false);
    let react = |e: &Event<'_>| match e {
        Event::Progress { bytes, .. } if *bytes >= 4 << 20 => {
            let mut killed = killed.lock().unwrap();
            if !*killed {
                a.lock().unwrap().kill();
                *killed = true;
            }
        }
        Event::Dropped { .. } => {
            let mut a = a.lock().unwrap();
            if a.child.is_none() {
                a.spawn().expect("restarting the job server");
            }
        }
        _ => {}
    };
    let (root, log) = s.fetch(&[a_url.clone(), b_url.clone()], &staging, react)?;
    let root = root?;
    assert_eq!(root.source(), a_url, "{log:?}");
    assert_eq!(log.first(), Some(&Seen::Started(a_url.clone(), 0)));
    assert_eq!(log.get(1), Some(&Seen::Dropped(a_url.clone())), "{log:?}");
    let resumed = log.iter().find_map(|e| match e {
        Seen::Started(url, from) if *url == a_url && *from > 0 => Some(*from),
        _ => None,
    });
    assert!(
        resumed.is_some_and(|from| from >= 4 << 20 && from < s.expected.size),
        "no Range resume: {log:?}"
    );
    assert!(
        !log.iter().any(|e| matches!(e, Seen::Failed(..))),
        "{log:?}"
    );
    assert_eq!(log.last(), Some(&Seen::Verified(a_url.clone())));
    same_tree(&s.tree, root.path())?;

    // Killed and left dead: after the resumes fail, the next job server.
    ensure!(
        a.lock().unwrap().child.is_some(),
        "the restarted job server"
    );
    let killed = Mutex::new(false);
    let react = |e: &Event<'_>| {
        if let Event::Progress { bytes, .. } = e
            && *bytes >= 4 << 20
        {
            let mut killed = killed.lock().unwrap();
            if !*killed {
                a.lock().unwrap().kill();
                *killed = true;
            }
        }
    };
    let (root, log) = s.fetch(&[a_url.clone(), b_url.clone()], &staging, react)?;
    let root = root?;
    assert_eq!(root.source(), b_url, "{log:?}");
    let drops = log
        .iter()
        .filter(|e| **e == Seen::Dropped(a_url.clone()))
        .count();
    assert_eq!(drops as u32, image::plan::MAX_RESUMES + 1, "{log:?}");
    assert!(
        log.contains(&Seen::Failed(a_url.clone(), "dead".into(), false)),
        "{log:?}"
    );
    assert_eq!(
        &log[log.len() - 2..],
        [
            Seen::Started(b_url.clone(), 0),
            Seen::Verified(b_url.clone())
        ]
    );
    same_tree(&s.tree, root.path())?;
    Ok(())
}

#[test]
fn a_busy_job_server_is_waited_for_as_it_says() -> Result<()> {
    let s = setup(8)?;
    let good = export(&s.root, "good", &s.good)?;
    // One stream at a time; everything from 1 MiB counts as a stream.
    let a = JobServer::start(
        &s.root,
        &good,
        &["--http-max-streams", "1", "--http-stream-mib", "1"],
    )?;
    // A client that asks for the image and then reads nothing holds the only
    // permit. Its receive buffer is pinned small: loopback's autotuned one
    // (up to tcp_rmem's 32 MiB here) would swallow the whole image at once
    // and end the stream on the server's side.
    let holder = Mutex::new(Some(stalled_download(a.addr, &format!("/{IMAGE}"))?));
    let release = || drop(holder.lock().unwrap().take());
    // Until the holder's stream is admitted, the agent's could be the one.
    let metrics = format!("http://{}/metrics", a.metrics);
    let mut last = String::new();
    let admitted = (0..2400).any(|_| {
        std::thread::sleep(Duration::from_millis(25));
        if let Ok(out) = Command::new("curl")
            .args(["-s", "--max-time", "5"])
            .arg(&metrics)
            .output()
        {
            last = String::from_utf8_lossy(&out.stdout).into_owned();
        }
        last.contains("mprov_http_active_streams 1\n")
    });
    if !admitted {
        release();
        bail!("the stalled download was not admitted; last metrics:\n{last}");
    }
    let staging = s.root.join("staging");
    std::fs::create_dir(&staging)?;
    let fetched = s.fetch(&[a.url()], &staging, |e| {
        if let Event::Busy { .. } = e {
            release();
        }
    });
    release();
    let (result, log) = fetched?;
    let root = result?;
    let [Seen::Busy(url, wait), rest @ ..] = &log[..] else {
        bail!("no 503 first: {log:?}");
    };
    assert_eq!(*url, a.url());
    // The job server says 5-15 s.
    assert!(
        (Duration::from_secs(5)..=Duration::from_secs(15)).contains(wait),
        "{wait:?}"
    );
    assert_eq!(
        rest,
        [Seen::Started(a.url(), 0), Seen::Verified(a.url())],
        "{log:?}"
    );
    same_tree(&s.tree, root.path())?;
    Ok(())
}
