//! The web service's side of the signing helper: [`SignerClient`] starts
//! the supervised helper (`mprov-control signer`), sends it one request at
//! a time and waits for the answer; while the helper is down a request
//! fails at once with [`SignerError::Unavailable`].

use std::path::Path;
use std::time::Duration;

use super::ca::TlsError;
use super::helper::Signer;
use super::protocol::{Incoming, SignReply, SignRequest, SignerError};

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

/// Where the answer to the request in flight goes.
type Waiter = tokio::sync::oneshot::Sender<Result<SignReply, SignerError>>;

/// What the reader task and the callers share.
#[derive(Debug)]
struct Link {
    /// Whether a worker is ready.
    up: std::sync::atomic::AtomicBool,
    /// Why it is not, when it is not.
    why_down: std::sync::Mutex<String>,
    /// The request waiting for its answer.
    pending: std::sync::Mutex<Option<(u64, Waiter)>>,
    /// Fires when the supervisor is gone for good.
    lost: tokio_util::sync::CancellationToken,
}

impl Link {
    fn set_down(&self, why: &str) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        why.clone_into(&mut self.why_down.lock().unwrap_or_else(|e| e.into_inner()));
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((_, tx)) = pending {
            let _ = tx.send(Err(SignerError::Unavailable(why.to_owned())));
        }
    }
}

#[derive(Debug)]
enum Backend {
    /// The supervised helper over its socket pair.
    Process {
        child: tokio::sync::Mutex<tokio::process::Child>,
        writer: tokio::sync::Mutex<tokio::net::unix::OwnedWriteHalf>,
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
/// How long one signature may take.
const SIGN_TIMEOUT: Duration = Duration::from_secs(10);

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
            pending: std::sync::Mutex::new(None),
            lost: tokio_util::sync::CancellationToken::new(),
        });
        tokio::spawn(read_loop(reader, link.clone()));
        Ok(SignerClient {
            ca_pem,
            backend: Backend::Process {
                child: tokio::sync::Mutex::new(child),
                writer: tokio::sync::Mutex::new(writer),
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

    /// Asks for a signature; fails at once while the helper is down.
    pub async fn request_certificate(&self, req: &SignRequest) -> Result<SignReply, SignerError> {
        use std::sync::atomic::Ordering;
        use tokio::io::AsyncWriteExt as _;
        let (writer, link, next_id) = match &self.backend {
            Backend::InProcess(signer) => {
                let line = serde_json::to_string(req).map_err(SignerError::Encode)?;
                return Ok(signer.answer(&line).reply);
            }
            Backend::Process {
                writer,
                link,
                next_id,
                ..
            } => (writer, link, next_id),
        };
        // One request at a time: the helper answers in order.
        let mut writer = writer.lock().await;
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
        line.push('\n');
        let (tx, rx) = tokio::sync::oneshot::channel();
        *link.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some((id, tx));
        if let Err(e) = writer.write_all(line.as_bytes()).await {
            link.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            return Err(SignerError::Write(e));
        }
        match tokio::time::timeout(SIGN_TIMEOUT, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(SignerError::Unavailable("the helper went away".into())),
            Err(_) => {
                link.pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                tracing::error!("the signing helper did not answer within {SIGN_TIMEOUT:?}");
                Err(SignerError::Unavailable(format!(
                    "it did not answer within {SIGN_TIMEOUT:?}"
                )))
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
            Ok(Incoming::Answer(answer)) => {
                let mut pending = link.pending.lock().unwrap_or_else(|e| e.into_inner());
                match pending.take() {
                    Some((id, tx)) if id == answer.id => {
                        let _ = tx.send(Ok(answer.reply));
                    }
                    other => {
                        *pending = other;
                        tracing::debug!(id = answer.id, "signer: an answer nobody waits for");
                    }
                }
            }
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
