//! Streaming the root image: `rootfs.tar.zst` from the job servers of the
//! boot manifest, hashed, decompressed and unpacked into the staging area in
//! one pass, and handed on only once verified.
//!
//! Threads share the work, each a few chunks ahead of the next
//! ([`mprov_unpack::ReadAhead`], bounded): the body's reader (the socket and
//! its sha256), zstd's, and the caller's (the shared unpacker,
//! [`mprov_unpack::unpack`], with its writer threads creating the files).
//! The body's reader waits for each chunk on its own thread
//! ([`crate::http::Client::wait`]), so the socket is read on the thread
//! that hashes it (see [`crate::http`] for why). The decisions (resume,
//! wait, next source, give up) are the pure [`plan::Plan`]'s; reply heads
//! are classified by the pure [`reply::classify`].
//!
//! Invariant: the only way to a [`VerifiedRoot`] is a stream whose every
//! byte hashed to the sha256 the control service recorded when the version
//! was published (never one a job server supplies), read to its end, and an
//! unpack that succeeded. A failed attempt wipes the staging area before the
//! next one starts, so nothing of a bad stream survives.

pub mod plan;
pub mod reply;

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use mprov_unpack::{ReadAhead, UnpackOptions, Unpacked};

use self::plan::{Next, Plan, SourceFailure};
use self::reply::Reply;
use crate::http::{Client, ClientError};

/// What the control service recorded for the image version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The size of `rootfs.tar.zst` in bytes.
    pub size: u64,
    /// Its sha256.
    pub sha256: [u8; 32],
}

/// A progress event is sent every this many bytes.
pub const PROGRESS_STEP: u64 = 1 << 20;

/// What happened, for the console and the control service. Sent from the
/// feeder thread and the caller's thread.
#[derive(Debug)]
pub enum Event<'a> {
    /// A request was answered with the image's bytes from `from`.
    Started {
        /// The source's URL.
        source: &'a str,
        /// The first byte (0, or where a resume starts).
        from: u64,
    },
    /// The source answered `503`/`429`; waiting `wait`.
    Busy {
        /// The source's URL.
        source: &'a str,
        /// How long.
        wait: Duration,
    },
    /// The connection dropped (or could not be made) after `at` bytes; a
    /// resume follows.
    Dropped {
        /// The source's URL.
        source: &'a str,
        /// Bytes received so far.
        at: u64,
        /// The error.
        why: &'a str,
    },
    /// `bytes` of `size` received (every [`PROGRESS_STEP`]).
    Progress {
        /// Bytes received.
        bytes: u64,
        /// Of the image's size.
        size: u64,
    },
    /// The source was given up on; the staging area is wiped and `next`
    /// happens.
    SourceFailed {
        /// The source's URL.
        source: &'a str,
        /// Why.
        why: &'a SourceFailure,
        /// What the plan does next.
        next: &'a Next,
    },
    /// Every byte hashed to the recorded sha256 and the root is unpacked.
    Verified {
        /// The source's URL.
        source: &'a str,
        /// What was unpacked.
        unpacked: Unpacked,
    },
}

/// A staging area holding a root that passed verification. Only [`fetch`]
/// makes one.
#[derive(Debug)]
pub struct VerifiedRoot {
    path: PathBuf,
    source: String,
    unpacked: Unpacked,
}

impl VerifiedRoot {
    /// The staging area.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The URL the image came from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// What was unpacked.
    pub fn unpacked(&self) -> Unpacked {
        self.unpacked
    }
}

/// Why the fetch gave up.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The manifest listed no job server.
    #[error("the boot manifest lists no job server for the image")]
    NoSources,
    /// Every source failed, [`plan::MAX_ROUNDS`] times over.
    #[error(
        "every job server failed {} times; the last, {source_url}: {last}",
        plan::MAX_ROUNDS
    )]
    GaveUp {
        /// The last source tried.
        source_url: String,
        /// Its failure.
        last: SourceFailure,
    },
    /// The staging area could not be emptied.
    #[error("wiping the staging area {}", path.display())]
    Wipe {
        /// The staging area.
        path: PathBuf,
        /// The cause.
        #[source]
        err: io::Error,
    },
}

/// Fetches `sources` (best first) into `staging` (an existing, empty
/// folder), verified against `expected`. `observe` hears of every step.
pub fn fetch(
    client: &Client,
    sources: &[String],
    expected: &Expected,
    staging: &Path,
    options: UnpackOptions,
    observe: &(dyn Fn(&Event<'_>) + Sync),
) -> Result<VerifiedRoot, FetchError> {
    let Some((mut plan, _)) = Plan::new(sources.len()) else {
        return Err(FetchError::NoSources);
    };
    loop {
        wipe(staging).map_err(|err| FetchError::Wipe {
            path: staging.to_path_buf(),
            err,
        })?;
        let source = plan.source();
        let outcome = Mutex::new(Outcome::default());
        let unpacked = std::thread::scope(|scope| {
            let stream = Stream {
                client,
                sources,
                plan: &mut plan,
                expected,
                hasher: ring::digest::Context::new(&ring::digest::SHA256),
                offset: 0,
                body: None,
                validator: None,
                outcome: &outcome,
                observe,
                next_progress: PROGRESS_STEP,
            };
            let (body, fetcher) = ReadAhead::new(stream);
            scope.spawn(fetcher);
            // The body's chunks are zstd's buffer: no copy between.
            let decoder = zstd::Decoder::with_buffer(body)
                .map_err(|err| mprov_unpack::UnpackError::Read { err })?;
            let (mut reader, feeder) = ReadAhead::new(Pipeline {
                decoder,
                outcome: &outcome,
            });
            scope.spawn(feeder);
            let result = mprov_unpack::unpack(&mut reader, staging, options);
            // Read the stream to its end either way: the tar end marker
            // comes before the end of the stream, and after a failure the
            // hash tells a bad source from a bad image.
            let drained = io::copy(&mut reader, &mut io::sink());
            result.and_then(|unpacked| {
                drained
                    .map(|_| unpacked)
                    .map_err(|err| mprov_unpack::UnpackError::Read { err })
            })
        });
        let outcome = outcome.into_inner().unwrap_or_else(|e| e.into_inner());
        let (why, next) = match (unpacked, outcome) {
            (
                Ok(unpacked),
                Outcome {
                    verified: true,
                    failure: None,
                },
            ) => {
                observe(&Event::Verified {
                    source: &sources[source],
                    unpacked,
                });
                return Ok(VerifiedRoot {
                    path: staging.to_path_buf(),
                    source: sources[source].clone(),
                    unpacked,
                });
            }
            (
                _,
                Outcome {
                    failure: Some(failure),
                    ..
                },
            ) => failure,
            (Err(err), _) => {
                let why = SourceFailure::BadImage(mprov_process::chain(&err));
                let next = plan.failed(&why, random());
                (why, next)
            }
            (Ok(_), _) => {
                let why = SourceFailure::BadImage("the stream ended unverified".to_owned());
                let next = plan.failed(&why, random());
                (why, next)
            }
        };
        observe(&Event::SourceFailed {
            source: &sources[source],
            why: &why,
            next: &next,
        });
        match next {
            Next::Restart { after, .. } | Next::Request { after, .. } => std::thread::sleep(after),
            Next::GiveUp => {
                // Nothing of a failed stream stays behind.
                let _ = wipe(staging);
                return Err(FetchError::GaveUp {
                    source_url: sources[source].clone(),
                    last: why,
                });
            }
        }
    }
}

/// The HTTP client for job servers: plain HTTP (the bytes are verified
/// against the manifest, not trusted for their transport), the shared
/// connect timeout, and [`STALL_TIMEOUT`] on every read.
pub fn client() -> Result<Client, ClientError> {
    Client::new(builder())
}

/// A client for the stream as `/init` makes it: an initramfs has no system
/// CA certificates, so an HTTPS job server is trusted only when the
/// install's CA (`ca_pem`) signed its certificate.
pub fn client_trusting(ca_pem: &str) -> Result<Client, ClientError> {
    let certs = reqwest::Certificate::from_pem_bundle(ca_pem.as_bytes())?;
    Client::new(builder().tls_certs_only(certs))
}

fn builder() -> reqwest::ClientBuilder {
    crate::http::builder().read_timeout(STALL_TIMEOUT)
}

/// How long a read may wait for bytes before the connection counts as
/// dropped.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// One line for the console about `event`.
pub fn describe(event: &Event<'_>) -> String {
    match event {
        Event::Started { source, from: 0 } => format!("streaming {source}"),
        Event::Started { source, from } => format!("resuming {source} at byte {from}"),
        Event::Busy { source, wait } => {
            format!("{source} is busy: waiting {} s as told", wait.as_secs_f32())
        }
        Event::Dropped { source, at, why } => {
            format!("{source}: connection lost after {at} bytes ({why}); resuming")
        }
        Event::Progress { bytes, size } => format!(
            "{} of {} MiB ({}%)",
            bytes >> 20,
            size >> 20,
            if *size == 0 { 100 } else { bytes * 100 / size }
        ),
        Event::SourceFailed { source, why, next } => {
            let next = match next {
                Next::Restart { source: _, after } => format!(
                    "staging wiped; next job server in {:.1} s",
                    after.as_secs_f32()
                ),
                Next::Request { .. } => "retrying".to_owned(),
                Next::GiveUp => "no job server left to try".to_owned(),
            };
            format!("{source}: {why}; {next}")
        }
        Event::Verified { source, unpacked } => format!(
            "verified {source}: sha256 matches the published image, {} entries unpacked",
            unpacked.entries
        ),
    }
}

/// Empties `dir`, keeping the folder itself (it may be a mount point).
pub fn wipe(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// A random number for backoff jitter; a fixed one if the kernel has no
/// randomness to give (the jitter only spreads nodes out).
fn random() -> u32 {
    getrandom::u32().unwrap_or(u32::MAX / 2)
}

/// How one attempt ended, as the stream saw it.
#[derive(Debug, Default)]
struct Outcome {
    /// Every byte arrived and hashed to the recorded sha256.
    verified: bool,
    /// The stream gave the source up: why, and what the plan does next.
    failure: Option<(SourceFailure, Next)>,
}

/// The image's bytes from one source, resumed as the plan says, hashed as
/// they pass. The read that completes the image fails if the hash differs.
struct Stream<'a> {
    client: &'a Client,
    sources: &'a [String],
    plan: &'a mut Plan,
    expected: &'a Expected,
    /// ring's sha256: its SHA-extension code hashed the stream in about
    /// three quarters of the CPU time sha2's took (tests/bench/RESULTS.md,
    /// "agent").
    hasher: ring::digest::Context,
    offset: u64,
    body: Option<Body>,
    validator: Option<String>,
    outcome: &'a Mutex<Outcome>,
    observe: &'a (dyn Fn(&Event<'_>) + Sync),
    next_progress: u64,
}

impl Stream<'_> {
    fn url(&self) -> &str {
        &self.sources[self.plan.source()]
    }

    /// Records that the source is given up on; the error ends the attempt.
    fn give_up(&self, failure: SourceFailure, next: Next) -> io::Error {
        let err = io::Error::other(failure.to_string());
        let mut outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        outcome.failure.get_or_insert((failure, next));
        err
    }

    /// Acts on `next` after a drop, a refused connection or a busy reply:
    /// waits and carries on, or ends the attempt.
    fn follow(&mut self, next: Next, failure: SourceFailure) -> io::Result<()> {
        match next {
            Next::Request { after, .. } => {
                std::thread::sleep(after);
                Ok(())
            }
            next => Err(self.give_up(failure, next)),
        }
    }

    fn dropped(&mut self, why: String) -> io::Result<()> {
        self.body = None;
        (self.observe)(&Event::Dropped {
            source: self.url(),
            at: self.offset,
            why: &why,
        });
        let next = self.plan.dropped(self.offset, &why, random());
        self.follow(next, SourceFailure::Dead(why))
    }

    /// Sends requests until one answers with the image's bytes from
    /// `self.offset`.
    fn open(&mut self) -> io::Result<()> {
        loop {
            let url = self.url().to_owned();
            let mut request = self.client.get(&url);
            if self.offset > 0 {
                request = request.header(reqwest::header::RANGE, format!("bytes={}-", self.offset));
                if let Some(validator) = &self.validator {
                    request = request.header(reqwest::header::IF_RANGE, validator);
                }
            }
            let response = match self.client.send(request) {
                Ok(response) => response,
                Err(err) => {
                    self.dropped(mprov_process::chain(&err))?;
                    continue;
                }
            };
            let headers = response.headers();
            let reply = reply::classify(
                response.status().as_u16(),
                |name| headers.get(name).map(|v| v.as_bytes()),
                self.offset,
                self.expected.size,
                SystemTime::now(),
            );
            match reply {
                Reply::Body { start, validator } if start == self.offset => {
                    (self.observe)(&Event::Started {
                        source: &url,
                        from: start,
                    });
                    if start == 0 {
                        self.validator = validator;
                    }
                    self.body = Some(Body {
                        response,
                        rest: bytes::Bytes::new(),
                    });
                    return Ok(());
                }
                Reply::Body { .. } => {
                    // A 200 to a Range request: the file changed under us
                    // (If-Range), so what we have is of no use.
                    let why = SourceFailure::Refused(
                        "the file changed while resuming (200 to a Range request)".to_owned(),
                    );
                    let next = self.plan.failed(&why, random());
                    return Err(self.give_up(why, next));
                }
                Reply::Busy { wait } => {
                    (self.observe)(&Event::Busy { source: &url, wait });
                    let next = self.plan.busy(self.offset, wait, random());
                    self.follow(next, SourceFailure::Busy)?;
                }
                Reply::Refused { reason } => {
                    let why = SourceFailure::Refused(reason);
                    let next = self.plan.failed(&why, random());
                    return Err(self.give_up(why, next));
                }
            }
        }
    }
}

impl Read for Stream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let size = self.expected.size;
        loop {
            let left = size - self.offset;
            if left == 0 || buf.is_empty() {
                return Ok(0);
            }
            if self.body.is_none() {
                self.open()?;
            }
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let Some(body) = self.body.as_mut() else {
                continue;
            };
            match body.read(self.client, &mut buf[..want]) {
                Ok(0) => self.dropped(format!(
                    "the connection closed after {} of {size} bytes",
                    self.offset
                ))?,
                Ok(n) => {
                    self.hasher.update(&buf[..n]);
                    self.offset += n as u64;
                    if self.offset >= self.next_progress || self.offset == size {
                        self.next_progress = self.offset + PROGRESS_STEP;
                        (self.observe)(&Event::Progress {
                            bytes: self.offset,
                            size,
                        });
                    }
                    if self.offset == size {
                        self.body = None;
                        let digest = self.hasher.clone().finish();
                        if digest.as_ref() != self.expected.sha256 {
                            let why = SourceFailure::Mismatch;
                            let next = self.plan.failed(&why, random());
                            return Err(self.give_up(why, next));
                        }
                        self.outcome
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .verified = true;
                    }
                    return Ok(n);
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => self.dropped(mprov_process::chain(&err))?,
            }
        }
    }
}

/// A response being read: its body's chunks, and what is left of the last
/// one.
struct Body {
    response: reqwest::Response,
    rest: bytes::Bytes,
}

impl Body {
    /// Reads into `buf` from the last chunk, or from the next one, waiting
    /// for it on this thread; `Ok(0)` at the end of the body.
    fn read(&mut self, client: &Client, buf: &mut [u8]) -> io::Result<usize> {
        if self.rest.is_empty() {
            match client
                .wait(self.response.chunk())
                .map_err(io::Error::other)?
            {
                Some(chunk) => self.rest = chunk,
                None => return Ok(0),
            }
        }
        let n = self.rest.len().min(buf.len());
        buf[..n].copy_from_slice(&self.rest.split_to(n));
        Ok(n)
    }
}

/// The decompressed image. When zstd fails, the rest of the stream is still
/// read and hashed, so a source that sent wrong bytes is told apart from a
/// published image that is broken.
struct Pipeline<'a> {
    decoder: zstd::Decoder<'static, ReadAhead>,
    /// The stream's outcome: whether it gave the source up.
    outcome: &'a Mutex<Outcome>,
}

impl Read for Pipeline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.decoder.read(buf) {
            Ok(0) if !buf.is_empty() => {
                // The end of the zstd stream: bytes after it still count.
                io::copy(self.decoder.get_mut(), &mut io::sink())?;
                Ok(0)
            }
            Ok(n) => Ok(n),
            Err(err) => {
                let stream_failed = self
                    .outcome
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .failure
                    .is_some();
                if !stream_failed {
                    io::copy(self.decoder.get_mut(), &mut io::sink())?;
                }
                Err(err)
            }
        }
    }
}
