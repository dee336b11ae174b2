//! The web service's side of the signing helper: [`SignerClient`] starts
//! the supervised helper (`mprov-control signer`), sends it requests and
//! waits for their answers; while the helper is down a request fails at
//! once with [`SignerError::Unavailable`].
//!
//! Requests are pipelined: one task writes whole request lines to the
//! helper in the order they come, and the reader hands each answer to the
//! request with its id. No lock is held while a request waits, and each
//! wait is bounded ([`SIGN_TIMEOUT`]), so a request the helper never
//! answers delays nobody else. A request line longer than the helper reads
//! ([`MAX_REQUEST`]) is refused here, never sent.

use std::path::Path;
use std::time::Duration;

use super::ca::TlsError;
use super::helper::Signer;
use super::protocol::{Incoming, MAX_REQUEST, SignReply, SignRequest, SignerError};

/// How the helper is started.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    /// The `mprov-control` executable.
    pub exe: std::path::PathBuf,
    /// The TLS folder.
    pub tls_dir: std::path::PathBuf,
    /// The control host's name (for a new CA's name).
    pub hostname: String,
    /// The system user it drops to when started as root.
    pub user: Option<String>,
}

impl SpawnSpec {
    /// `mprov-control <subcommand>` with the helper's arguments: the TLS
    /// folder, the host's name and, when set, the user to become. The
    /// supervisor (`signer`) and its worker (`signer-worker`) take the same.
    pub fn command(&self, subcommand: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.arg(subcommand)
            .arg("--tls-dir")
            .arg(&self.tls_dir)
            .arg("--hostname")
            .arg(&self.hostname);
        if let Some(user) = &self.user {
            cmd.arg("--user").arg(user);
        }
        cmd
    }
}

/// Where the answer to a request in flight goes.
type Waiter = tokio::sync::oneshot::Sender<Result<SignReply, SignerError>>;

/// What the reader task and the callers share.
#[derive(Debug)]
struct Link {
    /// Whether a worker is ready.
    up: std::sync::atomic::AtomicBool,
    /// Why it is not, when it is not.
    why_down: std::sync::Mutex<String>,
    /// The requests waiting for their answers, by id.
    pending: std::sync::Mutex<std::collections::HashMap<u64, Waiter>>,
    /// Fires when the supervisor is gone for good.
    lost: tokio_util::sync::CancellationToken,
}

impl Link {
    fn set_down(&self, why: &str) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        why.clone_into(&mut self.why_down.lock().unwrap_or_else(|e| e.into_inner()));
        let pending = std::mem::take(&mut *self.pending());
        for (_, tx) in pending {
            let _ = tx.send(Err(SignerError::Unavailable(why.to_owned())));
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Waiter>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A request's place among the pending ones, given up when dropped (the
/// answer came, the wait ended, or the caller went away).
struct Pending<'a> {
    link: &'a Link,
    id: u64,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.link.pending().remove(&self.id);
    }
}

/// Request lines queued for the writer task at most.
const QUEUE: usize = 256;

#[derive(Debug)]
enum Backend {
    /// The supervised helper over its socket pair.
    Process {
        child: tokio::sync::Mutex<tokio::process::Child>,
        /// Whole request lines, for the task that writes them.
        lines: tokio::sync::mpsc::Sender<(u64, String)>,
        link: std::sync::Arc<Link>,
        next_id: std::sync::atomic::AtomicU64,
    },
    /// The same checks inside this process, for in-process API tests that
    /// have no helper binary to start. The serving process never uses it.
    InProcess(Signer),
}

/// The web service's handle on the signing helper.
#[derive(Debug)]
pub struct SignerClient {
    ca_pem: String,
    backend: Backend,
}

/// How long the helper may take to start (making a CA included).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one request may wait for its answer.
pub const SIGN_TIMEOUT: Duration = Duration::from_secs(10);

impl SignerClient {
    /// Starts the supervised helper and waits until it is ready.
    pub async fn spawn(spec: SpawnSpec) -> Result<SignerClient, SignerError> {
        use tokio::io::AsyncBufReadExt as _;
        let fail = |what| move |err| SignerError::StartIo { what, err };
        let (ours, theirs) =
            std::os::unix::net::UnixStream::pair().map_err(fail("making its socket pair"))?;
        let theirs_out = theirs.try_clone().map_err(fail("making its socket pair"))?;
        let mut cmd = tokio::process::Command::from(spec.command("signer"));
        cmd.stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            theirs,
        )))
        .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            theirs_out,
        )))
        .kill_on_drop(true);
        let child = cmd.spawn().map_err(fail("running it"))?;
        // The command holds the child's ends of the pair: close ours now, or a
        // helper that dies would never read as closed.
        drop(cmd);
        ours.set_nonblocking(true)
            .map_err(fail("setting up its socket"))?;
        let (read, writer) = tokio::net::UnixStream::from_std(ours)
            .map_err(fail("setting up its socket"))?
            .into_split();
        let mut reader = tokio::io::BufReader::new(read);
        let mut first = String::new();
        let n = tokio::time::timeout(START_TIMEOUT, reader.read_line(&mut first))
            .await
            .map_err(|_| SignerError::Start(format!("not ready within {START_TIMEOUT:?}")))?
            .map_err(fail("reading its first line"))?;
        if n == 0 {
            return Err(SignerError::Start(
                "it exited before it was ready; the log above says why".into(),
            ));
        }
        let ca_pem = match serde_json::from_str::<Incoming>(&first) {
            Ok(Incoming::Ready(r)) => r.ready.ca_pem,
            Ok(Incoming::Down(d)) => return Err(SignerError::Start(d.down.reason)),
            _ => return Err(SignerError::Start("unexpected first line".into())),
        };
        let link = std::sync::Arc::new(Link {
            up: std::sync::atomic::AtomicBool::new(true),
            why_down: std::sync::Mutex::new(String::new()),
            pending: std::sync::Mutex::new(std::collections::HashMap::new()),
            lost: tokio_util::sync::CancellationToken::new(),
        });
        tokio::spawn(read_loop(reader, link.clone()));
        let (lines, queued) = tokio::sync::mpsc::channel(QUEUE);
        tokio::spawn(write_loop(writer, queued, link.clone()));
        Ok(SignerClient {
            ca_pem,
            backend: Backend::Process {
                child: tokio::sync::Mutex::new(child),
                lines,
                link,
                next_id: std::sync::atomic::AtomicU64::new(1),
            },
        })
    }

    /// A signer inside this process (in-process tests only).
    pub fn in_process(tls_dir: &Path, hostname: &str) -> Result<SignerClient, TlsError> {
        let signer = Signer::open(tls_dir, hostname)?;
        Ok(SignerClient {
            ca_pem: signer.ca_pem.clone(),
            backend: Backend::InProcess(signer),
        })
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The supervisor's process id, if it runs as a process.
    pub async fn pid(&self) -> Option<u32> {
        match &self.backend {
            Backend::Process { child, .. } => child.lock().await.id(),
            Backend::InProcess(_) => None,
        }
    }

    /// A token that fires when the supervisor is gone for good: the web
    /// service cannot start it again, so it must exit.
    pub fn lost(&self) -> tokio_util::sync::CancellationToken {
        match &self.backend {
            Backend::Process { link, .. } => link.lost.clone(),
            Backend::InProcess(_) => tokio_util::sync::CancellationToken::new(),
        }
    }

    /// Asks for a signature; fails at once while the helper is down, and
    /// after [`SIGN_TIMEOUT`] without an answer.
    pub async fn request_certificate(&self, req: &SignRequest) -> Result<SignReply, SignerError> {
        use std::sync::atomic::Ordering;
        let (lines, link, next_id) = match &self.backend {
            Backend::InProcess(signer) => {
                let line = serde_json::to_string(req).map_err(SignerError::Encode)?;
                return Ok(signer.answer(&line).reply);
            }
            Backend::Process {
                lines,
                link,
                next_id,
                ..
            } => (lines, link, next_id),
        };
        if !link.up.load(Ordering::SeqCst) {
            let why = link
                .why_down
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            return Err(SignerError::Unavailable(why));
        }
        let id = next_id.fetch_add(1, Ordering::SeqCst);
        let mut req = req.clone();
        req.id = id;
        let mut line = serde_json::to_string(&req).map_err(SignerError::Encode)?;
        if line.len() >= MAX_REQUEST {
            return Ok(SignReply::Refused {
                reason: format!(
                    "the request is {} bytes, more than the signing helper reads ({MAX_REQUEST})",
                    line.len()
                ),
            });
        }
        line.push('\n');
        let (tx, rx) = tokio::sync::oneshot::channel();
        link.pending().insert(id, tx);
        let _pending = Pending { link, id };
        let answered = tokio::time::timeout(SIGN_TIMEOUT, async {
            lines
                .send((id, line))
                .await
                .map_err(|_| SignerError::Unavailable("the helper went away".into()))?;
            rx.await
                .map_err(|_| SignerError::Unavailable("the helper went away".into()))?
        })
        .await;
        answered.unwrap_or_else(|_| {
            tracing::error!(
                "the signing helper did not answer request {id} within {SIGN_TIMEOUT:?}"
            );
            Err(SignerError::Unavailable(format!(
                "it did not answer within {SIGN_TIMEOUT:?}"
            )))
        })
    }
}

/// Writes request lines to the helper, each whole, in the order they were
/// queued, until the client is dropped. A line that cannot be written fails
/// its request.
async fn write_loop(
    mut writer: tokio::net::unix::OwnedWriteHalf,
    mut queued: tokio::sync::mpsc::Receiver<(u64, String)>,
    link: std::sync::Arc<Link>,
) {
    use tokio::io::AsyncWriteExt as _;
    while let Some((id, line)) = queued.recv().await {
        if let Err(e) = writer.write_all(line.as_bytes()).await {
            tracing::warn!("signer: writing request {id}: {e}");
            if let Some(tx) = link.pending().remove(&id) {
                let _ = tx.send(Err(SignerError::Write(e)));
            }
        }
    }
}

/// Reads the helper's side: answers go to the waiting request, `Down` and
/// `Ready` switch the link, the end of the socket means the supervisor is
/// gone.
async fn read_loop(
    mut reader: tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>,
    link: std::sync::Arc<Link>,
) {
    use tokio::io::AsyncBufReadExt as _;
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line).await {
            Ok(0) | Err(_) => {
                tracing::error!("the signing helper's supervisor is gone");
                link.set_down("the signing helper's supervisor is gone; the service restarts");
                link.lost.cancel();
                return;
            }
            Ok(_) => {}
        }
        match serde_json::from_str::<Incoming>(&line) {
            Ok(Incoming::Answer(answer)) => match link.pending().remove(&answer.id) {
                Some(tx) => {
                    let _ = tx.send(Ok(answer.reply));
                }
                None => tracing::debug!(id = answer.id, "signer: an answer nobody waits for"),
            },
            Ok(Incoming::Ready(_)) => {
                link.up.store(true, std::sync::atomic::Ordering::SeqCst);
                tracing::info!("the signing helper is back");
            }
            Ok(Incoming::Down(d)) => {
                tracing::error!("{}", d.down.reason);
                link.set_down(&d.down.reason);
            }
            Err(e) => tracing::warn!("signer: a line that is not understood: {e}"),
        }
    }
}
