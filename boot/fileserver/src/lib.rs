//! The job server's HTTP file server: node images, kernels and initramfs files
//! under `/images/`, iPXE binaries under `/boot/`; over plain HTTP
//! ([`serve`]) for nodes, and over TLS ([`serve_tls`]) for other job
//! servers.
//!
//! # What it serves
//!
//! * `/images/<slug>/<version>/{rootfs.tar.zst, vmlinuz, initramfs.img,
//!   manifest.json}` from `<root>/images/...` (the export layout of
//!   `mprov_api::boot`).
//! * `/boot/<file>` from the iPXE folder (default `/usr/lib/ipxe`, the Debian
//!   `ipxe` package).
//!
//! `/ipxe/` (boot scripts) belongs to the control service and `/metrics` to a
//! listener of its own ([`metrics_router`]); neither is served here.
//!
//! # HTTP
//!
//! The server speaks HTTP/1.1 itself (`src/conn.rs` says why hyper
//! is not used): `httparse` reads request heads, file bodies leave with
//! `sendfile(2)` straight from the page cache. What a request gets is decided
//! in `file.rs`: `Range` → `206 Partial Content` with `Content-Range`
//! (RFC 9110 §14), a range past the end → `416`, a strong `ETag` plus
//! `Last-Modified`, `If-None-Match`/`If-Modified-Since` → `304`,
//! `If-Match`/`If-Unmodified-Since` → `412`, `If-Range` honoured (so a
//! resumed download of a replaced image never splices two files), exact
//! `Content-Length`, and `HEAD`. Several ranges in one request are not
//! served as `multipart/byteranges`: the whole file comes back with `200`,
//! which RFC 9110 §14.2 allows and every client handles. Paths are
//! percent-decoded and any empty, `.` or `..` segment is refused (404), so a
//! request cannot leave its folder. Under `/images/` no link leads out
//! either: files are opened with `openat2(RESOLVE_BENEATH)` below the
//! export's `images/` folder (`src/beneath.rs`), so a link to `/etc/shadow`
//! placed in an export is a 404 (and a warning in the log), while a relative
//! link that stays inside is served. `/boot/` follows links: the iPXE folder
//! is the distribution's (Debian links `ipxe.efi` to `/boot/ipxe.efi`).
//!
//! # Connections
//!
//! A request head must arrive within [`Config::head_timeout`] (a slow,
//! slowloris head gets 408 and a close), and at most
//! [`Config::max_connections`] connections are open at once, lowered to what
//! the open-file limit carries. At the cap a new connection closes the one
//! idle longest, so a flood of idle connections cannot keep a node's
//! download out; see `src/limit.rs`.
//!
//! # Admission control
//!
//! Image streams (GET responses under `/images/` whose body is at least
//! [`Config::stream_threshold`] bytes) need one of [`Config::max_streams`]
//! permits. When none is free the request gets `503 Service Unavailable` with
//! `Retry-After` (base plus random jitter, so a rack that was refused together
//! does not come back together) at once: nothing queues, and streams already
//! running keep their bandwidth. The permit is held while the body is sent
//! and released when it ends, however it ends: completed, the client gone,
//! the client not reading for a minute, or shutdown.
//!
//! The threshold exists because iPXE does not retry on 503: kernels and
//! initramfs files fetched by iPXE should stay below it, while the root
//! filesystem stream is above it: its client must wait out `Retry-After` and
//! ask again (`curl --retry` does; the agent does not stream images yet). A
//! threshold of 0 puts every `/images/` download under admission control.
//!
//! # Provisioning log
//!
//! Every GET body under `/images/` reports a [`Download`] when it ends: one
//! line at info (`provisioning: c01 (10.0.0.21) got image compute (1.2 GB in
//! 41 s)`) or warn (`... stopped getting image compute after 300 MB in 12 s:
//! connection closed`), and a call of the hook set with
//! [`ImageState::on_download`]. The node name is looked up in the current
//! [`BootConfig`] snapshot.

#![warn(missing_docs)]

mod beneath;
mod conn;
mod download;
mod file;
#[cfg(any(test, feature = "fuzz"))]
mod fuzz;
mod limit;
mod metrics;
mod request;
mod stream;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mprov_api::boot::BootConfig;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::download::{Download, Outcome, node_name};
#[cfg(any(test, feature = "fuzz"))]
pub use crate::fuzz::fuzz_request;
pub use crate::limit::{RESERVED_FILES, connections_for};
pub use crate::metrics::{Metrics, metrics_router};
use crate::stream::DownloadHook;

/// Default iPXE binary folder (Debian's `ipxe` package).
pub const DEFAULT_IPXE_DIR: &str = "/usr/lib/ipxe";
/// Default number of concurrent image streams. About what one 10 GbE link
/// feeds at a useful per-node rate (≥150 Mbit/s each).
pub const DEFAULT_MAX_STREAMS: usize = 64;
/// Default size from which an `/images/` body needs a permit: above kernels
/// and small initramfs files, which iPXE fetches and cannot retry.
pub const DEFAULT_STREAM_THRESHOLD: u64 = 64 * 1024 * 1024;
/// Default base of `Retry-After`.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(5);
/// Default maximum jitter added to `Retry-After`.
pub const DEFAULT_RETRY_JITTER: Duration = Duration::from_secs(10);
/// Default time a client gets to send a request head (and the keep-alive
/// idle time).
pub const DEFAULT_HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time a body may go without the client taking a byte before it is
/// abandoned.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Default cap on open connections (see [`Config::max_connections`]).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default time streams get to finish after shutdown is requested.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);

/// The file server's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The export root; `/images/...` is served from `<root>/images/...`.
    pub root: PathBuf,
    /// The folder served as `/boot/`.
    pub ipxe_dir: PathBuf,
    /// Concurrent image streams admitted.
    pub max_streams: usize,
    /// Body size (bytes) from which an `/images/` GET needs a permit; 0 for
    /// every one.
    pub stream_threshold: u64,
    /// Base of the `Retry-After` sent with 503 (whole seconds, at least 1).
    pub retry_after: Duration,
    /// Random extra `Retry-After`, from 0 up to this (whole seconds).
    pub retry_jitter: Duration,
    /// How long [`serve`] lets open connections finish after shutdown.
    pub drain: Duration,
    /// Time a client gets to send a request head, and to start the next one
    /// on a kept-alive connection.
    pub head_timeout: Duration,
    /// Time a body may go without the client taking a byte; then the
    /// download is abandoned and its permit freed.
    pub stall_timeout: Duration,
    /// Connections open at once. At the cap a new connection closes the
    /// one idle longest (waiting for a request head), or is closed itself
    /// when every connection is answering a request. [`serve`] lowers it to
    /// what the open-file limit carries ([`connections_for`]).
    pub max_connections: usize,
}

impl Config {
    /// Defaults for serving the export at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            ipxe_dir: PathBuf::from(DEFAULT_IPXE_DIR),
            max_streams: DEFAULT_MAX_STREAMS,
            stream_threshold: DEFAULT_STREAM_THRESHOLD,
            retry_after: DEFAULT_RETRY_AFTER,
            retry_jitter: DEFAULT_RETRY_JITTER,
            drain: DEFAULT_DRAIN,
            head_timeout: DEFAULT_HEAD_TIMEOUT,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Errors of [`serve`].
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Accepting connections failed for good.
    #[error("accepting HTTP connections")]
    Accept(#[source] std::io::Error),
}

/// The shared state of the file server; cheap to clone.
#[derive(Clone)]
pub struct ImageState {
    inner: Arc<Inner>,
    hook: Option<DownloadHook>,
}

struct Inner {
    config: Config,
    streams: Arc<Semaphore>,
    boot_config: watch::Receiver<Arc<BootConfig>>,
    metrics: Metrics,
}

impl std::fmt::Debug for ImageState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageState")
            .field("config", &self.inner.config)
            .field("free_permits", &self.inner.streams.available_permits())
            .field("hook", &self.hook.is_some())
            .finish_non_exhaustive()
    }
}

impl ImageState {
    /// State for `config`, naming nodes from the `boot_config` snapshots.
    pub fn new(config: Config, boot_config: watch::Receiver<Arc<BootConfig>>) -> Self {
        Self {
            inner: Arc::new(Inner {
                streams: Arc::new(Semaphore::new(config.max_streams)),
                config,
                boot_config,
                metrics: Metrics::default(),
            }),
            hook: None,
        }
    }

    /// Calls `hook` with every finished `/images/` download (after logging
    /// it). It runs on the connection's task: keep it short.
    pub fn on_download(mut self, hook: impl Fn(&Download) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// The server's metrics; register them with [`Metrics::register`].
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }
}

/// Serves `/images/` and `/boot/` on `listener` until `shutdown` is
/// cancelled, then lets responses under way finish for [`Config::drain`] and
/// drops the rest (idle connections close at once). Nodes (iPXE, the agent,
/// curl) speak HTTP/1.1, so HTTP/2 is not offered.
pub async fn serve(
    listener: TcpListener,
    state: ImageState,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    serve_with(listener, None, state, shutdown).await
}

/// [`serve`] over TLS with `tls` (which decides what client certificates
/// it asks for and takes: a refused handshake is logged at info and the
/// connection closed, before any request is read). A handshake must end
/// within [`Config::head_timeout`]. File bodies are read and encrypted
/// here, not sent with `sendfile(2)`; everything else (ranges, admission,
/// the download log) is as over plain HTTP.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: ImageState,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    serve_with(listener, Some(acceptor), state, shutdown).await
}

async fn serve_with(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: ImageState,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let drain = state.inner.config.drain;
    let conns = limit::Conns::new(
        connection_cap(state.inner.config.max_connections),
        state.inner.metrics.clone(),
    );
    let tracker = TaskTracker::new();
    let abort = CancellationToken::new();
    let result = loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) if is_transient(&err) => {
                    // Out of descriptors or a connection reset before accept:
                    // back off briefly instead of spinning.
                    tracing::warn!("HTTP file server: accepting a connection: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(err) => break Err(ServeError::Accept(err)),
            },
        };
        // At the cap with every connection busy: closed at once.
        let Some(slot) = conns.admit() else {
            drop(stream);
            continue;
        };
        // Latency of small files matters more than packet count here; a file
        // reply's head still shares a segment with its body (MSG_MORE).
        let _ = stream.set_nodelay(true);
        let (state, shutdown, abort) = (state.clone(), shutdown.clone(), abort.clone());
        match &tls {
            None => {
                tracker.spawn(conn::serve_connection(
                    stream, peer, slot, state, shutdown, abort,
                ));
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                tracker.spawn(async move {
                    let limit = state.inner.config.head_timeout;
                    let shaken = tokio::select! {
                        s = tokio::time::timeout(limit, acceptor.accept(stream)) => s,
                        () = abort.cancelled() => return,
                    };
                    match shaken {
                        Ok(Ok(stream)) => {
                            conn::serve_connection(stream, peer, slot, state, shutdown, abort)
                                .await;
                        }
                        Ok(Err(err)) => {
                            tracing::info!("HTTPS file server: refused {peer}: {err}");
                        }
                        Err(_) => {
                            tracing::info!(
                                "HTTPS file server: {peer} did not finish its TLS handshake within {limit:?}"
                            );
                        }
                    }
                });
            }
        }
    };
    tracker.close();
    if tokio::time::timeout(drain, tracker.wait()).await.is_err() {
        tracing::warn!(
            "HTTP file server: {} connections still open after {drain:?}, dropping them",
            tracker.len()
        );
        abort.cancel();
        tracker.wait().await;
    }
    result
}

/// `configured`, lowered to what the open-file limit carries (logged).
fn connection_cap(configured: usize) -> usize {
    let files = match mprov_process::open_file_limit() {
        Ok(files) => files,
        Err(err) => {
            tracing::warn!("HTTP file server: cannot read the open-file limit: {err}");
            return configured;
        }
    };
    let fits = connections_for(files);
    if configured > fits {
        tracing::warn!(
            "HTTP file server: at most {fits} connections (not {configured}): the open-file limit is {files}; raise it (LimitNOFILE=) for more"
        );
        return fits;
    }
    tracing::info!("HTTP file server: at most {configured} connections");
    configured
}

fn is_transient(err: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted};
    // EMFILE and ENFILE: out of file descriptors, which frees up.
    matches!(
        err.kind(),
        ConnectionAborted | ConnectionReset | Interrupted
    ) || matches!(err.raw_os_error(), Some(23 | 24))
}

/// Whole seconds: `base` (at least 1) plus `random` folded into `0..=jitter`.
pub(crate) fn retry_after_secs(base: Duration, jitter: Duration, random: u64) -> u64 {
    base.as_secs().max(1) + random % (jitter.as_secs() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after() {
        let s = Duration::from_secs;
        assert_eq!(retry_after_secs(s(5), s(10), 0), 5);
        assert_eq!(retry_after_secs(s(5), s(10), 10), 15);
        assert_eq!(retry_after_secs(s(5), s(10), 11), 5);
        assert_eq!(retry_after_secs(s(0), s(0), 12345), 1);
        for random in 0..100 {
            assert!((5..=15).contains(&retry_after_secs(s(5), s(10), random)));
        }
    }
}
