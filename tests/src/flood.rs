//! A bounded connection flood from inside a lab namespace: many idle TCP
//! connections and a few slow request heads held against each target, for
//! the test that boots a node while the servers are at their connection
//! caps.
//!
//! One thread enters the namespace (`setns` changes only the calling
//! thread; its sockets stay there) and keeps [`FloodSpec::idle`] idle
//! connections and [`FloodSpec::slow`] slow heads open per target: a server
//! that closes one (its deadline, or to make room under its cap) sees it
//! opened again on the next round. Every round is bounded: at most
//! [`FloodSpec::reopen_per_round`] connections opened per target, a round
//! every [`ROUND`], and the whole flood stops after [`FloodSpec::limit`] or
//! when dropped, closing every socket.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// The pause between two rounds of checking and reopening connections.
pub const ROUND: Duration = Duration::from_secs(1);
/// How long one connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What to hold against each target.
#[derive(Debug, Clone)]
pub struct FloodSpec {
    /// The targets (inside the namespace).
    pub targets: Vec<SocketAddr>,
    /// Idle connections per target: opened, never written to.
    pub idle: usize,
    /// Slow heads per target: an HTTP request head sent one byte a round.
    pub slow: usize,
    /// The most connections opened per target in one round.
    pub reopen_per_round: usize,
    /// When the flood stops on its own.
    pub limit: Duration,
}

/// What the flood did, per target: connections opened, and opens that failed.
#[derive(Debug, Default)]
pub struct Counts {
    /// Connections opened.
    pub opened: AtomicU64,
    /// Connects that failed or timed out.
    pub failed: AtomicU64,
    /// The most connections held open at once.
    pub held: AtomicU64,
}

/// A running flood; stopped (its sockets closed) on [`Flood::stop`] or drop.
#[derive(Debug)]
pub struct Flood {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
    /// Per target, in [`FloodSpec::targets`] order.
    pub counts: Arc<Vec<Counts>>,
}

/// The request head a slow connection trickles, never finished.
const SLOW_HEAD: &[u8] = b"GET /api/v1/ HTTP/1.1\r\nHost: lab\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// One held connection.
#[derive(Debug)]
struct Held {
    stream: TcpStream,
    /// How much of [`SLOW_HEAD`] it sent; `None` for an idle one.
    sent: Option<usize>,
}

impl Held {
    /// Whether the server still holds it open (a non-blocking read that
    /// would block); sends a slow head's next byte.
    fn alive(&mut self) -> bool {
        let mut buf = [0u8; 512];
        let open = match self.stream.read(&mut buf) {
            Ok(0) => false,
            Ok(_) => true,
            Err(err) => err.kind() == ErrorKind::WouldBlock,
        };
        if !open {
            return false;
        }
        if let Some(sent) = self.sent.as_mut() {
            let byte = SLOW_HEAD[*sent % SLOW_HEAD.len()];
            match self.stream.write(&[byte]) {
                Ok(_) => *sent += 1,
                Err(err) if err.kind() == ErrorKind::WouldBlock => {}
                Err(_) => return false,
            }
        }
        true
    }
}

impl Flood {
    /// Starts the flood inside the namespace whose file is `netns` (see
    /// [`crate::netns::Netns::path`]).
    pub fn start(netns: &Path, spec: FloodSpec) -> Result<Flood> {
        let file =
            std::fs::File::open(netns).with_context(|| format!("opening {}", netns.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let counts: Arc<Vec<Counts>> =
            Arc::new(spec.targets.iter().map(|_| Counts::default()).collect());
        let (flag, tally) = (stop.clone(), counts.clone());
        let thread = std::thread::Builder::new()
            .name("lab-flood".to_owned())
            .spawn(move || -> Result<()> {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
                run(&spec, &flag, &tally);
                Ok(())
            })?;
        Ok(Flood {
            stop,
            thread: Some(thread),
            counts,
        })
    }

    /// Stops it and closes its sockets; fails if its thread failed.
    pub fn stop(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| anyhow::anyhow!("the flood thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Opens one connection to `target`, non-blocking once connected.
fn open(target: &SocketAddr, slow: bool) -> Option<Held> {
    let stream = TcpStream::connect_timeout(target, CONNECT_TIMEOUT).ok()?;
    stream.set_nonblocking(true).ok()?;
    Some(Held {
        stream,
        sent: slow.then_some(0),
    })
}

/// The rounds, until `stop` or the spec's limit.
fn run(spec: &FloodSpec, stop: &AtomicBool, counts: &[Counts]) {
    let until = Instant::now() + spec.limit;
    let mut held: Vec<Vec<Held>> = spec.targets.iter().map(|_| Vec::new()).collect();
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        for ((target, conns), count) in spec.targets.iter().zip(&mut held).zip(counts) {
            conns.retain_mut(Held::alive);
            let slow_now = conns.iter().filter(|c| c.sent.is_some()).count();
            let want = spec.idle + spec.slow;
            let missing = want.saturating_sub(conns.len()).min(spec.reopen_per_round);
            for i in 0..missing {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let slow = slow_now + i < spec.slow;
                match open(target, slow) {
                    Some(conn) => {
                        conns.push(conn);
                        count.opened.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {
                        count.failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            count.held.fetch_max(
                u64::try_from(conns.len()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
        std::thread::sleep(ROUND);
    }
}
