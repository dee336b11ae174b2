//! One HTTP/1.1 connection: read a request head, answer it, repeat while the
//! client keeps the connection alive. The connection is plain TCP or TLS
//! ([`Transport`]): over TLS, file bodies are read here and encrypted, as
//! the kernel cannot `sendfile` into a TLS session.
//!
//! # Why not hyper
//!
//! File bodies leave with `sendfile(2)`: the kernel hands page-cache pages to
//! the socket and the bytes never pass through this process. hyper (under
//! axum) only writes bodies it is given as buffers, so every gigabyte it sent
//! was first read into memory and then copied into the socket; measured
//! against nginx (`tests/bench/http.sh`), that was half its throughput at four
//! times its CPU per gigabyte. A file server needs little of HTTP/1.1: no
//! request bodies, no trailers, no upgrades, so the protocol side here is
//! small: `httparse` parses the head ([`crate::request`]), [`crate::file`]
//! decides what to send, and this module writes the status line and fields
//! itself.
//!
//! # Rules
//!
//! * A head must arrive within [`Config::head_timeout`](crate::Config::head_timeout) (also the keep-alive
//!   idle time) and fit [`crate::request::MAX_HEAD`]; otherwise 408/431 and
//!   the connection closes. Garbage gets 400 and a close.
//! * Methods other than GET and HEAD get 405; a request with a body gets 400
//!   (we would not know where the next request starts), both with a close.
//! * Requests may be pipelined: bytes after a head are the next request.
//! * While it waits for a head the connection is idle and may be closed to
//!   make room for a new one at the connection cap (`crate::limit`).
//! * A body whose client stops reading for [`Config::stall_timeout`](crate::Config::stall_timeout) is
//!   abandoned, so a hung node does not hold an admission permit for ever.
//! * `sendfile` reads the file in the calling thread, like nginx without
//!   `aio threads`: from the page cache that is instant, and a cold read
//!   stalls one runtime worker for the duration of a disk read. Image files
//!   are opened with `POSIX_FADV_SEQUENTIAL` so the kernel reads ahead.

use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::fs::File;
use std::hash::BuildHasher;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::pin::pin;
use std::time::{Duration, Instant, SystemTime};

use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
use nix::sys::sendfile::sendfile64;
use nix::sys::socket::{MsgFlags, send};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::beneath::open_beneath;
use crate::download::{Download, Outcome, node_name};
use crate::file::{Area, FileMeta, Plan, plan, resolve};
use crate::limit::Slot;
use crate::request::{self, Head, HeadError, Method};
use crate::stream::{Permit, Stream};
use crate::{ImageState, retry_after_secs};

/// Most bytes one `sendfile` call is asked for: half of Linux's default
/// largest send buffer (`net.ipv4.tcp_wmem`, 4 MiB), so a call rarely fills
/// the socket, and after each call the task yields to the other
/// connections on its worker, as nginx does with `sendfile_max_chunk` (2m).
/// A worker then goes round its connections while their buffers drain
/// instead of filling one socket, finding it full (`EAGAIN`) and sleeping
/// until it drains. Measured (`tests/bench/http.sh`, RESULTS.md, 2026-12-04,
/// a loaded machine): 4 MiB without yielding gave about 0.5× nginx's
/// throughput; 2 MiB with yielding about 0.8×, and 4 MiB with yielding
/// about 0.65×.
const SENDFILE_CHUNK: usize = 2 * 1024 * 1024;

/// Serves requests on `stream` until the client closes, a response ends the
/// connection, `shutdown` is requested (between requests) or `abort` is
/// cancelled (at once, even mid-body).
pub(crate) async fn serve_connection<S: Transport>(
    mut stream: S,
    peer: SocketAddr,
    mut slot: Slot,
    state: ImageState,
    shutdown: CancellationToken,
    abort: CancellationToken,
) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        // Waiting for a head, the connection may be closed for room.
        slot.idle();
        let head = tokio::select! {
            head = read_head(&mut stream, &mut buf, state.inner.config.head_timeout, &shutdown) => head,
            () = abort.cancelled() => return,
            () = slot.evicted() => return,
        };
        if !slot.busy() {
            return;
        }
        let head = match head {
            Ok(Some(head)) => head,
            Ok(None) => return,
            Err(status) => {
                let _ = write_reply(&mut stream, &state, Reply::status(status), false).await;
                return;
            }
        };
        let keep_alive = head.keep_alive && !shutdown.is_cancelled();
        match respond(&mut stream, peer, &state, &head, keep_alive, &abort).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => {
                tracing::debug!(%peer, "HTTP connection: {err}");
                return;
            }
        }
    }
}

/// Reads until `buf` starts with a whole head. `Ok(None)`: the client closed,
/// or shutdown came while the connection was idle. `Err(status)`: answer with
/// that error status and close.
async fn read_head<S: Transport>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    timeout: Duration,
    shutdown: &CancellationToken,
) -> Result<Option<Head>, u16> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match request::parse(buf) {
            Ok(Some((head, n))) => {
                buf.drain(..n);
                return Ok(Some(head));
            }
            Ok(None) => {}
            Err(HeadError::Malformed) => return Err(400),
            Err(HeadError::TooLarge) => return Err(431),
        }
        let idle = buf.is_empty();
        let read = tokio::select! {
            read = tokio::time::timeout_at(deadline, read_some(stream, buf)) => read,
            () = shutdown.cancelled(), if idle => return Ok(None),
        };
        match read {
            Ok(Ok(0) | Err(_)) => return Ok(None),
            Ok(Ok(_)) => {}
            Err(_elapsed) if idle => return Ok(None),
            Err(_elapsed) => return Err(408),
        }
    }
}

/// Appends at most 4 KiB, so a head never grows `buf` far past its limit.
async fn read_some<S: Transport>(stream: &mut S, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut chunk = [0u8; 4096];
    let n = stream.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// Answers one request. `Ok(true)`: the connection may carry another.
async fn respond<S: Transport>(
    stream: &mut S,
    peer: SocketAddr,
    state: &ImageState,
    head: &Head,
    keep_alive: bool,
    abort: &CancellationToken,
) -> io::Result<bool> {
    let (reply, body) = match answer(peer, state, head) {
        Answer::Reply(mut reply) => {
            reply.head_only = head.method() == Method::Head;
            let keep_alive = keep_alive && !reply.close;
            return write_reply(stream, state, reply, keep_alive).await;
        }
        Answer::File(reply, body) => (reply, body),
    };
    let FileBody {
        file,
        start,
        len,
        download,
    } = body;
    let mut sent = 0;
    let result = async {
        write_reply_head(&mut *stream, state, &reply, keep_alive, len > 0).await?;
        send_file(&mut *stream, &file, start, len, &mut sent, state, abort).await
    }
    .await;
    if let Some(mut download) = download {
        download.download.bytes = sent;
        download.finish(match &result {
            Ok(()) => Outcome::Completed,
            Err(err) => Outcome::Failed(failure(err)),
        });
    }
    result.map(|()| keep_alive)
}

/// What a request gets: a reply without a file body, or a file body.
enum Answer {
    Reply(Reply),
    File(Reply, FileBody),
}

/// The bytes of a file to send after the reply's head.
struct FileBody {
    file: File,
    start: u64,
    len: u64,
    /// The download's bookkeeping, for `/images/` GETs.
    download: Option<Stream>,
}

/// Decides the answer to `head` (see the module comment for the rules).
fn answer(peer: SocketAddr, state: &ImageState, head: &Head) -> Answer {
    let method = head.method();
    if method == Method::Other {
        let mut reply = Reply::text(405, "only GET and HEAD are served here\n");
        reply.field("Allow", "GET, HEAD");
        reply.close = true;
        return Answer::Reply(reply);
    }
    if head.has_body {
        let mut reply = Reply::text(400, "a request body is not accepted here\n");
        reply.close = true;
        return Answer::Reply(reply);
    }
    let config = &state.inner.config;
    let Some((area, path)) = resolve(&head.target, &config.root, &config.ipxe_dir) else {
        return Answer::Reply(Reply::status(404));
    };
    let (file, meta) = match open(area, &path, &config.root.join("images")) {
        Ok(opened) => opened,
        Err(status) => return Answer::Reply(Reply::status(status)),
    };

    let (reply, body) = file_reply(head, &meta);
    let Some((start, len)) = body else {
        return Answer::Reply(reply);
    };
    if area == Area::Boot {
        return Answer::File(
            reply,
            FileBody {
                file,
                start,
                len,
                download: None,
            },
        );
    }

    let permit = if len >= config.stream_threshold {
        let Ok(permit) = state.inner.streams.clone().try_acquire_owned() else {
            return Answer::Reply(refuse(peer, state, head));
        };
        Some(Permit::new(
            permit,
            state.inner.metrics.active_streams.clone(),
        ))
    } else {
        None
    };
    let _ = posix_fadvise(&file, 0, 0, PosixFadviseAdvice::POSIX_FADV_SEQUENTIAL);
    let download = Stream {
        permit,
        download: Download {
            client: Some(peer.ip()),
            node: node_name(&state.inner.boot_config.borrow(), peer.ip()),
            path: head.target.split('?').next().unwrap_or_default().to_owned(),
            bytes: 0,
            elapsed: Duration::ZERO,
            outcome: Outcome::Completed,
        },
        started: Instant::now(),
        hook: state.hook.clone(),
    };
    tracing::info!("{}", download.download.start_line(len));
    Answer::File(
        reply,
        FileBody {
            file,
            start,
            len,
            download: Some(download),
        },
    )
}

/// The reply to a GET or HEAD of an existing file, and the part of the file
/// that follows it (`(start, len)`; `None` when no file bytes follow).
pub(crate) fn file_reply(head: &Head, meta: &FileMeta) -> (Reply, Option<(u64, u64)>) {
    let (start, len, mut reply) = match plan(head, meta) {
        Plan::Full => (0, meta.len, Reply::new(200)),
        Plan::Partial { start, end } => {
            let mut reply = Reply::new(206);
            reply.field(
                "Content-Range",
                &format!("bytes {start}-{end}/{}", meta.len),
            );
            (start, end - start + 1, reply)
        }
        Plan::NotModified => {
            let mut reply = Reply::new(304);
            reply.validators(meta);
            return (reply, None);
        }
        Plan::PreconditionFailed => return (Reply::status(412), None),
        Plan::Unsatisfiable => {
            let mut reply = Reply::status(416);
            reply.field("Content-Range", &format!("bytes */{}", meta.len));
            return (reply, None);
        }
    };
    reply.validators(meta);
    reply.field("Accept-Ranges", "bytes");
    reply.field("Content-Type", content_type(&head.target));
    reply.content_length = len;
    if head.method() == Method::Head {
        return (reply, None);
    }
    (reply, Some((start, len)))
}

/// 503 with `Retry-After`: every permit is taken.
fn refuse(peer: SocketAddr, state: &ImageState, head: &Head) -> Reply {
    state.inner.metrics.rejected_streams.inc();
    let config = &state.inner.config;
    let secs = retry_after_secs(
        config.retry_after,
        config.retry_jitter,
        RandomState::new().hash_one(Instant::now()),
    );
    tracing::debug!(%peer, target = %head.target, "image stream refused, retry after {secs} s");
    let mut reply = Reply::status(503);
    reply.field("Retry-After", &secs.to_string());
    reply
}

/// Opens a regular file; the error is the status to answer with. Files
/// under `/images/` are opened beneath the export's `images/` folder
/// (`images`), never through a link that leads out of it
/// ([`crate::beneath`]); `/boot/` files from the iPXE folder follow links
/// (Debian's `ipxe.efi` is a link to `/boot/ipxe.efi`).
///
/// `O_NONBLOCK`: opening a FIFO that found its way into an export must not
/// wait for a writer (it is then refused as not a regular file); for regular
/// files the flag changes nothing.
fn open(area: Area, path: &Path, images: &Path) -> Result<(File, FileMeta), u16> {
    let opened = match area {
        Area::Boot => std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(path),
        Area::Images => match path.strip_prefix(images) {
            Ok(rel) => open_beneath(images, rel).map_err(io::Error::from),
            Err(_) => Err(io::ErrorKind::NotFound.into()),
        },
    }
    .and_then(|file| {
        let metadata = file.metadata()?;
        Ok((file, metadata))
    });
    match opened {
        Ok((file, metadata)) if metadata.is_file() => Ok((file, FileMeta::new(&metadata))),
        Ok(_) => Err(404),
        Err(err)
            if matches!(
                err.raw_os_error(),
                Some(nix::libc::EXDEV | nix::libc::ELOOP)
            ) =>
        {
            tracing::warn!(
                "HTTP file server: {} is reached through a link that leads out of {} (or a link where links cannot be checked): not served",
                path.display(),
                images.display()
            );
            Err(404)
        }
        Err(err) => match err.kind() {
            io::ErrorKind::NotFound
            | io::ErrorKind::NotADirectory
            | io::ErrorKind::InvalidFilename => Err(404),
            io::ErrorKind::PermissionDenied => Err(403),
            _ => {
                tracing::warn!("HTTP file server: opening {}: {err}", path.display());
                Err(500)
            }
        },
    }
}

/// Sends `len` bytes of `file` from `start`, adding to `sent` as they go.
async fn send_file<S: Transport>(
    stream: &mut S,
    file: &File,
    start: u64,
    len: u64,
    sent: &mut u64,
    state: &ImageState,
    abort: &CancellationToken,
) -> io::Result<()> {
    let mut offset = i64::try_from(start).map_err(io::Error::other)?;
    let stall = state.inner.config.stall_timeout;
    let mut aborted = pin!(abort.cancelled());
    let mut stalled = pin!(tokio::time::sleep(stall));
    while *sent < len {
        let count = usize::try_from(len - *sent).map_or(SENDFILE_CHUNK, |n| n.min(SENDFILE_CHUNK));
        let n = tokio::select! {
            n = stream.send_chunk(file, &mut offset, count) => n?,
            () = &mut aborted => return Err(io::Error::other(SHUTDOWN)),
            () = &mut stalled => {
                let why = format!("the client stopped reading for {} s", stall.as_secs_f32());
                return Err(io::Error::new(io::ErrorKind::TimedOut, why));
            }
        };
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, SHRANK));
        }
        *sent += n as u64;
        state.inner.metrics.bytes_served.inc_by(n as u64);
        stalled.as_mut().reset(tokio::time::Instant::now() + stall);
        if *sent < len {
            // The other connections on this worker take their turn.
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

const SHUTDOWN: &str = "the server shut down";
const SHRANK: &str = "the file shrank while it was sent";

/// The reason of a failed download, for the provisioning log.
fn failure(err: &io::Error) -> String {
    match err.kind() {
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted => "connection closed".into(),
        _ => err.to_string(),
    }
}

/// A response: status, fields, and either a short text body or (with
/// `content_length` set by the caller) a file body sent separately.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    fields: String,
    pub(crate) content_length: u64,
    text: &'static str,
    /// The answer to a HEAD: `Content-Length` as for a GET, but no bytes.
    head_only: bool,
    /// Close the connection after this reply.
    close: bool,
}

impl Reply {
    fn new(status: u16) -> Self {
        Self {
            status,
            fields: String::new(),
            content_length: 0,
            text: "",
            head_only: false,
            close: false,
        }
    }

    fn text(status: u16, text: &'static str) -> Self {
        let mut reply = Self::new(status);
        reply.field("Content-Type", "text/plain; charset=utf-8");
        reply.content_length = text.len() as u64;
        reply.text = text;
        reply
    }

    /// An error status with its standard text.
    fn status(status: u16) -> Self {
        Self::text(status, status_text(status))
    }

    fn field(&mut self, name: &str, value: &str) {
        let _ = write!(self.fields, "{name}: {value}\r\n");
    }

    fn validators(&mut self, meta: &FileMeta) {
        self.field("ETag", &format!("\"{}\"", meta.etag()));
        self.field("Last-Modified", &meta.last_modified());
    }

    /// The status line and fields. A 304 carries no `Content-Length` (it
    /// would describe the body not sent, RFC 9110 §15.4.5).
    pub(crate) fn head(&self, keep_alive: bool, now: SystemTime) -> String {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nDate: {}\r\n",
            self.status,
            reason(self.status),
            httpdate::fmt_http_date(now)
        );
        head.push_str(&self.fields);
        if self.status != 304 {
            let _ = write!(head, "Content-Length: {}\r\n", self.content_length);
        }
        if !keep_alive {
            head.push_str("Connection: close\r\n");
        }
        head.push_str("\r\n");
        head
    }
}

/// Writes a reply that has no file body: its head, and its text unless the
/// request was a HEAD. Returns `keep_alive`.
async fn write_reply<S: Transport>(
    stream: &mut S,
    state: &ImageState,
    reply: Reply,
    keep_alive: bool,
) -> io::Result<bool> {
    let mut bytes = reply.head(keep_alive, SystemTime::now()).into_bytes();
    let text = if reply.head_only { "" } else { reply.text };
    bytes.extend_from_slice(text.as_bytes());
    state.inner.metrics.count_status(reply.status);
    state.inner.metrics.bytes_served.inc_by(text.len() as u64);
    stream.write_all(&bytes).await?;
    if !keep_alive {
        linger(stream).await;
    }
    Ok(keep_alive)
}

/// Closes our side, then reads and drops what the client still sends (a
/// refused body, pipelined requests) for a moment before the socket closes:
/// closing with unread bytes makes the kernel send a reset, which can
/// destroy the reply before the client reads it.
async fn linger<S: Transport>(stream: &mut S) {
    const LINGER_TIME: Duration = Duration::from_secs(1);
    const LINGER_BYTES: usize = 64 * 1024;
    if stream.shutdown().await.is_err() {
        return;
    }
    let mut chunk = [0u8; 4096];
    let mut drained = 0;
    let _ = tokio::time::timeout(LINGER_TIME, async {
        while drained < LINGER_BYTES {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

/// Writes the head of a file reply; `more`: a file body follows, so the
/// kernel may hold the head back to share a segment with it.
async fn write_reply_head<S: Transport>(
    stream: &mut S,
    state: &ImageState,
    reply: &Reply,
    keep_alive: bool,
    more: bool,
) -> io::Result<()> {
    state.inner.metrics.count_status(reply.status);
    let head = reply.head(keep_alive, SystemTime::now());
    stream.write_head(head.as_bytes(), more).await
}

/// A connection a reply goes out on: plain TCP, where file bodies leave with
/// `sendfile(2)`, or TLS, where they are read and encrypted here.
pub(crate) trait Transport: AsyncRead + AsyncWrite + Unpin + Send {
    /// Writes a reply's head; `more`: a file body follows.
    fn write_head(
        &mut self,
        head: &[u8],
        more: bool,
    ) -> impl Future<Output = io::Result<()>> + Send;
    /// Sends at most `count` bytes of `file` from `offset` (advanced by what
    /// was sent); how many. 0: the file ends there.
    fn send_chunk(
        &mut self,
        file: &File,
        offset: &mut i64,
        count: usize,
    ) -> impl Future<Output = io::Result<usize>> + Send;
}

impl Transport for TcpStream {
    async fn write_head(&mut self, head: &[u8], more: bool) -> io::Result<()> {
        let mut rest = head;
        let flags = if more {
            // nix has no name for MSG_MORE (Linux, 2.4.4).
            MsgFlags::from_bits_retain(nix::libc::MSG_MORE) | MsgFlags::MSG_NOSIGNAL
        } else {
            MsgFlags::MSG_NOSIGNAL
        };
        while !rest.is_empty() {
            let stream = &*self;
            let n = stream
                .async_io(Interest::WRITABLE, || {
                    send(std::os::fd::AsRawFd::as_raw_fd(stream), rest, flags)
                        .map_err(io::Error::from)
                })
                .await?;
            rest = &rest[n..];
        }
        Ok(())
    }

    async fn send_chunk(
        &mut self,
        file: &File,
        offset: &mut i64,
        count: usize,
    ) -> io::Result<usize> {
        let stream = &*self;
        stream
            .async_io(Interest::WRITABLE, || {
                sendfile64(stream, file, Some(&mut *offset), count).map_err(io::Error::from)
            })
            .await
    }
}

/// The most bytes of a file read and encrypted at once over TLS.
const TLS_CHUNK: usize = 256 * 1024;

impl Transport for tokio_rustls::server::TlsStream<TcpStream> {
    async fn write_head(&mut self, head: &[u8], more: bool) -> io::Result<()> {
        self.write_all(head).await?;
        if !more {
            self.flush().await?;
        }
        Ok(())
    }

    async fn send_chunk(
        &mut self,
        file: &File,
        offset: &mut i64,
        count: usize,
    ) -> io::Result<usize> {
        use std::os::unix::fs::FileExt as _;
        let mut chunk = vec![0u8; count.min(TLS_CHUNK)];
        let at = u64::try_from(*offset).map_err(io::Error::other)?;
        // Read in the calling thread, as sendfile does (see the module doc).
        let n = file.read_at(&mut chunk, at)?;
        self.write_all(&chunk[..n]).await?;
        self.flush().await?;
        *offset += i64::try_from(n).map_err(io::Error::other)?;
        Ok(n)
    }
}

fn content_type(target: &str) -> &'static str {
    let path = target.split('?').next().unwrap_or_default();
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("json") => "application/json",
        Some("txt" | "ipxe" | "cfg") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

pub(crate) fn status_text(status: u16) -> &'static str {
    match status {
        400 => "malformed request\n",
        403 => "forbidden\n",
        404 => "not found\n",
        408 => "request head not received in time\n",
        412 => "precondition failed\n",
        416 => "range not satisfiable\n",
        431 => "request head too large\n",
        503 => "too many image streams, retry later\n",
        _ => "internal error, see the job server's log\n",
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        304 => "Not Modified",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        412 => "Precondition Failed",
        416 => "Range Not Satisfiable",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_heads_parse_back() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut reply = Reply::text(503, "busy\n");
        reply.field("Retry-After", "7");
        let head = reply.head(false, now);
        assert_eq!(
            head,
            "HTTP/1.1 503 Service Unavailable\r\nDate: Tue, 14 Nov 2023 22:13:20 GMT\r\n\
             Content-Type: text/plain; charset=utf-8\r\nRetry-After: 7\r\n\
             Content-Length: 5\r\nConnection: close\r\n\r\n"
        );
        let mut fields = [httparse::EMPTY_HEADER; 16];
        let mut parsed = httparse::Response::new(&mut fields);
        assert!(parsed.parse(head.as_bytes()).unwrap().is_complete());
        assert_eq!(parsed.code, Some(503));

        let not_modified = Reply::new(304).head(true, now);
        assert!(!not_modified.contains("Content-Length"));
        assert!(!not_modified.contains("Connection"));
    }

    #[test]
    fn failures_read_well() {
        let closed = io::Error::from(io::ErrorKind::BrokenPipe);
        assert_eq!(failure(&closed), "connection closed");
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(failure(&reset), "connection closed");
        assert_eq!(failure(&io::Error::other(SHUTDOWN)), SHUTDOWN);
    }
}
