//! The job server's HTTP file server: node images, kernels and initramfs files
//! under `/images/`, iPXE binaries under `/boot/`.
//!
//! # What it serves
//!
//! * `/images/<slug>/<version>/{rootfs.tar.zst, vmlinuz, initramfs.img,
//!   manifest.json}` from `<root>/images/...` (the export layout of
//!   `DESIGN.md`).
//! * `/boot/<file>` from the iPXE folder (default `/usr/lib/ipxe`, the Debian
//!   `ipxe` package).
//!
//! `/ipxe/` (boot scripts) belongs to the control service and `/metrics` to a
//! listener of its own ([`metrics_router`]); neither is served here.
//!
//! # HTTP semantics
//!
//! File serving is tower-http's `ServeDir`, not ours: it gives `Range` →
//! `206 Partial Content` with `Content-Range` (RFC 9110 §14), unsatisfiable
//! ranges → `416`, a strong `ETag` from size and mtime plus `Last-Modified`,
//! `If-None-Match`/`If-Modified-Since` → `304` and `If-Match`/
//! `If-Unmodified-Since` → `412` (RFC 9110 §13), exact `Content-Length`, and
//! `HEAD`. Paths are percent-decoded and any `..`, root or prefix component is
//! refused (404), so a request cannot leave its folder; symbolic links inside
//! the folder are followed, so do not put links to elsewhere in an export.
//!
//! Two gaps of `ServeDir` are filled here:
//!
//! * `If-Range` (RFC 9110 §13.1.5) is not evaluated by `ServeDir`; we check a
//!   `206` against the validator (strong ETag comparison, or an exact
//!   `Last-Modified` date) and serve the whole file with `200` when it does
//!   not match, so a resumed download of a replaced image never splices two
//!   files.
//! * Multiple ranges: a `multipart/byteranges` response is not supported, and
//!   instead of `416` we ignore such a `Range` header and send the whole file
//!   with `200`, which RFC 9110 §14.2 allows and every client handles.
//!
//! # Admission control
//!
//! Image streams (GET responses under `/images/` whose body is at least
//! [`Config::stream_threshold`] bytes) need one of [`Config::max_streams`]
//! permits. When none is free the request gets `503 Service Unavailable` with
//! `Retry-After` (base plus random jitter, so a rack that was refused together
//! does not come back together) at once: nothing queues, and streams already
//! running keep their bandwidth. The permit lives in the response body and is
//! released when the body ends or is dropped, which is what happens when the
//! client disconnects.
//!
//! The threshold exists because iPXE does not retry on 503: kernels and
//! initramfs files fetched by iPXE should stay below it, while the agent's
//! root filesystem stream, which honours `Retry-After`, is above it. A
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

mod body;
mod download;
mod metrics;

use std::collections::hash_map::RandomState;
use std::convert::Infallible;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::Request as HttpRequest;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use mprov_api::boot::BootConfig;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;
use tower_http::services::ServeDir;

use crate::body::{DownloadHook, Permit, Stream, TrackedBody};
pub use crate::download::{Download, Outcome, node_name};
pub use crate::metrics::{Metrics, metrics_router};

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
/// Default read size for file bodies: larger than `ServeDir`'s 64 KiB, fewer
/// wake-ups per gigabyte.
pub const DEFAULT_CHUNK_SIZE: usize = 256 * 1024;
/// Default time streams get to finish after shutdown is requested.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);
/// Time a connection gets to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// Read size for file bodies.
    pub chunk_size: usize,
    /// How long [`serve`] lets open connections finish after shutdown.
    pub drain: Duration,
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
            chunk_size: DEFAULT_CHUNK_SIZE,
            drain: DEFAULT_DRAIN,
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
    images: ServeDir,
    boot: ServeDir,
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
        let dir = |path: &PathBuf| {
            ServeDir::new(path)
                .append_index_html_on_directories(false)
                .redirect_to_trailing_slash(false)
                .ignore_multi_range_requests(true)
                .with_buf_chunk_size(config.chunk_size)
        };
        let images = dir(&config.root);
        let boot = dir(&config.ipxe_dir);
        Self {
            inner: Arc::new(Inner {
                streams: Arc::new(Semaphore::new(config.max_streams)),
                images,
                boot,
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

/// The file server's routes.
pub fn router(state: ImageState) -> Router {
    Router::new()
        .route("/images/{*path}", get(images))
        .nest_service("/boot", state.inner.boot.clone())
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

/// Serves [`router`] on `listener` until `shutdown` is cancelled, then lets
/// open connections finish for [`Config::drain`] and drops the rest.
///
/// The accept loop is our own (hyper's HTTP/1.1 connection in a
/// [`TaskTracker`]) rather than `axum::serve`, because `axum::serve`'s
/// connection tasks outlive its future: a node streaming a 2 GB image slowly
/// would hold shutdown for minutes. Nodes (iPXE, the agent, curl) speak
/// HTTP/1.1, so HTTP/2 is not offered.
pub async fn serve(
    listener: TcpListener,
    state: ImageState,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let drain = state.inner.config.drain;
    let app = router(state);
    let tracker = TaskTracker::new();
    let abort = CancellationToken::new();
    let mut http = http1::Builder::new();
    // A client that never finishes its headers must not hold a task forever.
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
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
        // Latency of small files matters more than packet count here.
        let _ = stream.set_nodelay(true);
        let service =
            app.clone()
                .map_request(move |mut req: HttpRequest<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ConnectInfo(peer));
                    req
                });
        let (shutdown, abort, http) = (shutdown.clone(), abort.clone(), http.clone());
        tracker.spawn(async move {
            let conn =
                http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            tokio::pin!(conn);
            let result = tokio::select! {
                result = conn.as_mut() => result,
                () = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    tokio::select! {
                        result = conn.as_mut() => result,
                        () = abort.cancelled() => Ok(()),
                    }
                }
            };
            if let Err(err) = result {
                tracing::debug!(%peer, "HTTP connection: {err}");
            }
        });
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

fn is_transient(err: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted};
    // EMFILE and ENFILE: out of file descriptors, which frees up.
    matches!(
        err.kind(),
        ConnectionAborted | ConnectionReset | Interrupted
    ) || matches!(err.raw_os_error(), Some(23 | 24))
}

/// Counts responses by status class and body bytes, for every route.
async fn count(State(state): State<ImageState>, req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    let metrics = &state.inner.metrics;
    metrics.count_status(response.status());
    let metrics = metrics.clone();
    response.map(|body| Body::new(TrackedBody::new(body, Some(metrics), None)))
}

/// `/images/...`: the file, under admission control, reported when done.
async fn images(State(state): State<ImageState>, req: Request) -> Response {
    let client = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip());
    let is_get = req.method() == Method::GET;
    let path = req.uri().path().to_owned();
    let if_range = req.headers().get(header::IF_RANGE).cloned();
    let whole = (if_range.is_some() && req.headers().contains_key(header::RANGE))
        .then(|| without_range(&req));

    let mut response = serve_file(&state.inner.images, req).await;
    if let (Some(if_range), Some(whole)) = (if_range, whole)
        && response.status() == StatusCode::PARTIAL_CONTENT
        && !if_range_matches(
            &if_range,
            response.headers().get(header::ETAG),
            response.headers().get(header::LAST_MODIFIED),
        )
    {
        response = serve_file(&state.inner.images, whole).await;
    }

    let status = response.status();
    if !is_get || !(status == StatusCode::OK || status == StatusCode::PARTIAL_CONTENT) {
        return response;
    }
    let expected = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());

    let config = &state.inner.config;
    let permit = if expected.unwrap_or(u64::MAX) >= config.stream_threshold {
        match state.inner.streams.clone().try_acquire_owned() {
            Ok(permit) => Some(Permit::new(
                permit,
                state.inner.metrics.active_streams.clone(),
            )),
            Err(_) => {
                state.inner.metrics.rejected_streams.inc();
                let secs = retry_after_secs(
                    config.retry_after,
                    config.retry_jitter,
                    RandomState::new().hash_one(Instant::now()),
                );
                tracing::debug!(?client, %path, "image stream refused, retry after {secs} s");
                return unavailable(secs);
            }
        }
    } else {
        None
    };

    let node = client.and_then(|ip| node_name(&state.inner.boot_config.borrow(), ip));
    let stream = Stream {
        permit,
        download: Download {
            client,
            node,
            path,
            bytes: 0,
            elapsed: Duration::ZERO,
            outcome: Outcome::Completed,
        },
        expected,
        started: Instant::now(),
        hook: state.hook.clone(),
    };
    response.map(|body| Body::new(TrackedBody::new(body, None, Some(stream))))
}

async fn serve_file(dir: &ServeDir, req: Request) -> Response {
    let result: Result<_, Infallible> = dir.clone().oneshot(req).await;
    match result {
        Ok(response) => response.map(Body::new),
        Err(never) => match never {},
    }
}

/// The same GET without its `Range` and `If-Range` headers.
fn without_range(req: &Request) -> Request {
    let mut whole = Request::new(Body::empty());
    *whole.method_mut() = req.method().clone();
    *whole.uri_mut() = req.uri().clone();
    *whole.version_mut() = req.version();
    *whole.headers_mut() = req.headers().clone();
    whole.headers_mut().remove(header::RANGE);
    whole.headers_mut().remove(header::IF_RANGE);
    whole
}

/// RFC 9110 §13.1.5: an entity tag matches by strong comparison (a weak tag
/// never does), a date only when it equals `Last-Modified` exactly.
fn if_range_matches(
    if_range: &HeaderValue,
    etag: Option<&HeaderValue>,
    last_modified: Option<&HeaderValue>,
) -> bool {
    let Ok(validator) = if_range.to_str() else {
        return false;
    };
    let validator = validator.trim();
    if validator.starts_with("W/") {
        false
    } else if validator.starts_with('"') {
        etag.and_then(|v| v.to_str().ok())
            .is_some_and(|etag| !etag.starts_with("W/") && etag == validator)
    } else {
        last_modified
            .and_then(|v| v.to_str().ok())
            .is_some_and(|date| date == validator)
    }
}

/// Whole seconds: `base` (at least 1) plus `random` folded into `0..=jitter`.
fn retry_after_secs(base: Duration, jitter: Duration, random: u64) -> u64 {
    base.as_secs().max(1) + random % (jitter.as_secs() + 1)
}

fn unavailable(retry_after: u64) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, retry_after.to_string())],
        "too many image streams, retry later\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_range() {
        let v = HeaderValue::from_static;
        let etag = Some(v("\"abc\""));
        let date = Some(v("Mon, 30 Nov 2026 02:00:00 GMT"));
        let check = |if_range: &'static str, want: bool| {
            assert_eq!(
                if_range_matches(&v(if_range), etag.as_ref(), date.as_ref()),
                want,
                "{if_range}"
            );
        };
        check("\"abc\"", true);
        check("\"abd\"", false);
        check("W/\"abc\"", false);
        check("Mon, 30 Nov 2026 02:00:00 GMT", true);
        check("Mon, 30 Nov 2026 02:00:01 GMT", false);
        assert!(!if_range_matches(&v("\"abc\""), None, None));
    }

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
