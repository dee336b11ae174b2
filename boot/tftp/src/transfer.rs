//! One read transfer: open the file, negotiate options, send DATA windows
//! and retransmit on timeout.
//!
//! - The transfer gets its own socket on the listener's IP and an ephemeral
//!   port: that port is the server's transfer ID (RFC 1350 §4). The socket is
//!   `connect`ed to the client, so the kernel drops datagrams from any other
//!   TID, and an ICMP "port unreachable" (the client went away) ends the
//!   transfer at once instead of after every retry.
//! - Sending is windowed (RFC 7440): up to `windowsize` DATA blocks, then
//!   wait for an ACK. An ACK inside the window means the client lost the
//!   block after it, so sending restarts there (go-back-N). Duplicate and
//!   stale ACKs are ignored (the Sorcerer's Apprentice fix of RFC 1123
//!   §4.2.3.1): only the timeout retransmits. With windowsize 1 this is the
//!   plain lock-step of RFC 1350.
//! - Block numbers are 16 bits on the wire and wrap from 65535 to 0; the
//!   transfer counts blocks in `u64` and maps ACKs back onto the window.
//! - Opening the file and the option exchange run as async tasks; the DATA
//!   phase runs on a blocking thread of its own (tokio's blocking pool, one
//!   per transfer, so at most `max_transfers`), sending and then sleeping in
//!   `recv` until the ACK (`SO_RCVTIMEO` of at most 200 ms, to notice
//!   cancellation and the deadline). Lock-step (windowsize 1) is one send
//!   and one wake-up per block, as in tftp-hpa; through tokio it also cost a
//!   `recv` returning EAGAIN, an epoll round and a timer per block.
//! - The file is read with positional reads on that thread, a chunk at a
//!   time, so memory per transfer stays bounded whatever the file size.
//!   netascii transfers are converted in memory (they are rare and small).
//! - If the client sends ERROR right after our OACK, it was a size probe
//!   (UEFI firmware does this before every download): logged at debug and
//!   counted as aborted, not failed.

use std::fs::File;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use crate::codec::{self, ErrorCode, Mode, Packet, Request, TftpOption};
use crate::options::{self, Limits, Negotiated};
use crate::root::{self, OpenError};
use crate::server::Inner;

/// Bytes read from the file at a time (at least one window's worth).
const READ_AHEAD: usize = 128 * 1024;

/// An RRQ copied out of the listener's receive buffer.
#[derive(Debug, Clone)]
pub(crate) struct OwnedRequest {
    filename: String,
    mode: Mode,
    options: Vec<(String, String)>,
}

impl From<&Request<'_>> for OwnedRequest {
    fn from(req: &Request<'_>) -> Self {
        OwnedRequest {
            filename: req.filename.to_owned(),
            mode: req.mode,
            options: req
                .options
                .iter()
                .map(|o| (o.name.to_owned(), o.value.clone().into_owned()))
                .collect(),
        }
    }
}

/// Why a transfer did not complete.
#[derive(Debug, thiserror::Error)]
enum TransferError {
    #[error("cannot bind a transfer socket on {ip}")]
    Bind {
        ip: IpAddr,
        #[source]
        err: io::Error,
    },
    #[error("shut down")]
    Cancelled,
    #[error("client sent error {code}: {message}")]
    Client { code: u16, message: String },
    #[error("transfer deadline of {0:?} passed")]
    Deadline(Duration),
    #[error("refused")]
    Refused(#[source] OpenError),
    #[error("cannot read the file")]
    Read(#[source] io::Error),
    #[error("socket error")]
    Socket(#[source] io::Error),
    #[error("no answer after {retries} retransmissions of block {block}")]
    TimedOut { block: u64, retries: u32 },
    #[error("mail mode is not supported")]
    UnsupportedMode,
}

/// How a transfer ended, for metrics and logs.
enum Outcome {
    Completed {
        bytes: u64,
    },
    /// The client ended it after the OACK.
    Aborted {
        code: u16,
        message: String,
    },
}

/// Runs one transfer to its end, logging and counting the outcome.
pub(crate) async fn run(
    inner: Arc<Inner>,
    local_ip: IpAddr,
    peer: SocketAddr,
    req: OwnedRequest,
    cancel: CancellationToken,
) {
    let metrics = &inner.metrics;
    metrics.started.inc();
    metrics.active.inc();
    let start = Instant::now();
    let deadline = inner.config.transfer_deadline;
    let result = match tokio::time::timeout(
        deadline,
        serve(&inner, local_ip, peer, &req, &cancel, start + deadline),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(TransferError::Deadline(deadline)),
    };
    metrics.active.dec();
    let file = req.filename.as_str();
    match result {
        Ok(Outcome::Completed { bytes }) => {
            // Told before it is counted: whoever sees the count sees the
            // report too.
            if let Some(on_sent) = &inner.on_sent {
                on_sent(&crate::server::Sent {
                    peer,
                    file: file.to_owned(),
                    bytes,
                });
            }
            metrics.completed.inc();
            tracing::info!(%peer, file, bytes, elapsed = ?start.elapsed(), "tftp: sent");
        }
        Ok(Outcome::Aborted { code, message }) => {
            metrics.aborted.inc();
            tracing::debug!(%peer, file, code, message, "tftp: client ended the transfer after the option acknowledgement");
        }
        Err(err @ TransferError::Refused(_)) => {
            metrics.failed.inc();
            tracing::info!(%peer, file, error = %DisplayChain(&err), "tftp: request refused");
        }
        Err(err) => {
            metrics.failed.inc();
            tracing::warn!(%peer, file, error = %DisplayChain(&err), "tftp: transfer failed");
        }
    }
}

async fn serve(
    inner: &Inner,
    local_ip: IpAddr,
    peer: SocketAddr,
    req: &OwnedRequest,
    cancel: &CancellationToken,
    deadline: Instant,
) -> Result<Outcome, TransferError> {
    let config = &inner.config;
    let socket = UdpSocket::bind((local_ip, 0))
        .await
        .map_err(|err| TransferError::Bind { ip: local_ip, err })?;
    socket.connect(peer).await.map_err(TransferError::Socket)?;
    let mut conn = Conn {
        socket,
        send_buf: Vec::new(),
        recv_buf: vec![0u8; 65536],
        cancel,
    };

    if req.mode == Mode::Mail {
        conn.send_error(ErrorCode::IllegalOperation, "mail mode is not supported")
            .await;
        return Err(TransferError::UnsupportedMode);
    }
    let root_dir = config.root.clone();
    let filename = req.filename.clone();
    let opened = tokio::task::spawn_blocking(move || root::open(&root_dir, &filename))
        .await
        .map_err(|err| TransferError::Read(io::Error::other(err)))?;
    let (file, size) = match opened {
        Ok(opened) => opened,
        Err(err) => {
            let (code, message) = match &err {
                OpenError::NotFound { .. } | OpenError::NotAFile { .. } => {
                    (ErrorCode::FileNotFound, "file not found")
                }
                OpenError::BadName { .. } | OpenError::Escapes { .. } => {
                    (ErrorCode::AccessViolation, "access violation")
                }
                OpenError::Io { err, .. } if err.kind() == io::ErrorKind::PermissionDenied => {
                    (ErrorCode::AccessViolation, "access violation")
                }
                OpenError::Io { .. } => (ErrorCode::NotDefined, "cannot read file"),
            };
            conn.send_error(code, message).await;
            return Err(TransferError::Refused(err));
        }
    };
    let source = match req.mode {
        Mode::Netascii => Source::memory(read_netascii(file).await?),
        _ => Source::file(file, size),
    };

    let requested: Vec<TftpOption<'_>> = req
        .options
        .iter()
        .map(|(name, value)| TftpOption {
            name,
            value: value.as_str().into(),
        })
        .collect();
    let limits = Limits {
        max_blksize: config.max_blksize,
        max_windowsize: config.max_windowsize,
    };
    let negotiated = options::negotiate(&requested, limits, source.size());
    let timeout = negotiated.timeout.unwrap_or(config.timeout);
    let retries = config.retries;

    if !negotiated.oack.is_empty()
        && let Some(outcome) = conn.send_oack(&negotiated, timeout, retries).await?
    {
        return Ok(outcome);
    }
    send_file(inner, conn, source, &negotiated, timeout, retries, deadline).await
}

/// The transfer socket and its buffers.
struct Conn<'a> {
    socket: UdpSocket,
    send_buf: Vec<u8>,
    recv_buf: Vec<u8>,
    cancel: &'a CancellationToken,
}

impl Conn<'_> {
    async fn send_error(&mut self, code: ErrorCode, message: &str) {
        self.send_buf.clear();
        let packet = Packet::Error {
            code,
            message: message.into(),
        };
        if packet.encode(&mut self.send_buf).is_ok() {
            // Best effort: the transfer ends either way.
            let _ = self.socket.send(&self.send_buf).await;
        }
    }

    /// Waits up to `timeout` for one datagram; `None` on timeout.
    async fn recv(&mut self, timeout: Duration) -> Result<Option<usize>, TransferError> {
        tokio::select! {
            () = self.cancel.cancelled() => Err(TransferError::Cancelled),
            received = tokio::time::timeout(timeout, self.socket.recv(&mut self.recv_buf)) => {
                match received {
                    Ok(Ok(len)) => Ok(Some(len)),
                    Ok(Err(err)) => Err(TransferError::Socket(err)),
                    Err(_) => Ok(None),
                }
            }
        }
    }

    /// Sends the OACK and waits for ACK 0. `Some(Aborted)` if the client
    /// answers with an ERROR instead.
    async fn send_oack(
        &mut self,
        negotiated: &Negotiated,
        timeout: Duration,
        retries: u32,
    ) -> Result<Option<Outcome>, TransferError> {
        let options = negotiated
            .oack
            .iter()
            .map(|(name, value)| TftpOption {
                name,
                value: value.as_str().into(),
            })
            .collect();
        let mut wire = Vec::new();
        // Names are constants and values are digits: encoding cannot fail,
        // but a failure still ends the transfer cleanly.
        Packet::Oack { options }
            .encode(&mut wire)
            .map_err(|err| TransferError::Socket(io::Error::other(err)))?;
        for _ in 0..=retries {
            self.socket
                .send(&wire)
                .await
                .map_err(TransferError::Socket)?;
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let Some(len) = self.recv(left).await? else {
                    break;
                };
                match codec::parse(self.recv_buf.get(..len).unwrap_or_default()) {
                    Ok(Packet::Ack { block: 0 }) => return Ok(None),
                    Ok(Packet::Error { code, message }) => {
                        return Ok(Some(Outcome::Aborted {
                            code: code.code(),
                            message: message.into_owned(),
                        }));
                    }
                    // Anything else is noise; keep waiting for this round.
                    _ => {}
                }
            }
        }
        Err(TransferError::TimedOut { block: 0, retries })
    }
}

/// How often a transfer thread blocked in `recv` looks at the cancellation
/// token (the socket's `SO_RCVTIMEO`).
const CANCEL_POLL: Duration = Duration::from_millis(200);

/// What the sending thread needs besides the socket and the file.
struct Sending {
    blksize: u16,
    windowsize: u16,
    timeout: Duration,
    retries: u32,
    deadline: Instant,
    transfer_deadline: Duration,
    bytes_sent: prometheus_client::metrics::counter::Counter,
    cancel: CancellationToken,
}

/// Hands the DATA phase to a blocking thread ([`send_blocking`]): after the
/// options are settled, a transfer is a tight send/recv loop, and a thread
/// that sleeps in `recv` until the ACK arrives costs one wake-up per ACK,
/// where the async socket cost a failed `recv` (EAGAIN), an epoll
/// registration, a timer and a task wake-up per block (the lock-step
/// profile in `tests/bench/RESULTS.md`).
async fn send_file(
    inner: &Inner,
    conn: Conn<'_>,
    source: Source,
    negotiated: &Negotiated,
    timeout: Duration,
    retries: u32,
    deadline: Instant,
) -> Result<Outcome, TransferError> {
    let socket = conn.socket.into_std().map_err(TransferError::Socket)?;
    socket
        .set_nonblocking(false)
        .map_err(TransferError::Socket)?;
    socket
        .set_read_timeout(Some(timeout.min(CANCEL_POLL).max(Duration::from_millis(1))))
        .map_err(TransferError::Socket)?;
    let sending = Sending {
        blksize: negotiated.blksize,
        windowsize: negotiated.windowsize,
        timeout,
        retries,
        deadline,
        transfer_deadline: inner.config.transfer_deadline,
        bytes_sent: inner.metrics.bytes_sent.clone(),
        cancel: conn.cancel.clone(),
    };
    tokio::task::spawn_blocking(move || send_blocking(&socket, source, &sending))
        .await
        .map_err(|err| TransferError::Read(io::Error::other(err)))?
}

/// Waits for one datagram until `until`; `None` on timeout.
fn recv_until(
    socket: &std::net::UdpSocket,
    buf: &mut [u8],
    until: Instant,
    sending: &Sending,
) -> Result<Option<usize>, TransferError> {
    loop {
        match socket.recv(buf) {
            Ok(len) => return Ok(Some(len)),
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(err) => return Err(TransferError::Socket(err)),
        }
        if sending.cancel.is_cancelled() {
            return Err(TransferError::Cancelled);
        }
        let now = Instant::now();
        if now >= sending.deadline {
            return Err(TransferError::Deadline(sending.transfer_deadline));
        }
        if now >= until {
            return Ok(None);
        }
    }
}

/// Sends every block, windowed, until the last one is acknowledged; on a
/// blocking socket whose read timeout is at most [`CANCEL_POLL`].
fn send_blocking(
    socket: &std::net::UdpSocket,
    mut source: Source,
    sending: &Sending,
) -> Result<Outcome, TransferError> {
    let blksize = u64::from(sending.blksize);
    let window = u64::from(sending.windowsize.max(1));
    let size = source.size();
    // The last block is shorter than blksize, and empty if size is a
    // multiple of it (RFC 1350 §6).
    let last = size / blksize + 1;
    // First block not yet acknowledged.
    let mut base: u64 = 1;
    let mut attempts: u32 = 0;
    let mut send_buf = Vec::with_capacity(usize::from(sending.blksize) + 4);
    let mut recv_buf = vec![0u8; 65536];

    loop {
        let high = last.min(base + window - 1);
        let window_off = (base - 1) * blksize;
        let window_len = usize::try_from((high - base + 1) * blksize).unwrap_or(usize::MAX);
        source.ensure(window_off, window_len)?;
        for block in base..=high {
            let off = (block - 1) * blksize;
            let data = source
                .slice(off, usize::from(sending.blksize))
                .ok_or_else(|| {
                    TransferError::Read(io::Error::other("read buffer does not cover the window"))
                })?;
            send_buf.clear();
            // Truncation is the wire format: block numbers wrap at 2^16.
            codec::encode_data(block as u16, data, &mut send_buf);
            socket.send(&send_buf).map_err(TransferError::Socket)?;
            sending.bytes_sent.inc_by(data.len() as u64);
        }

        // Wait for an ACK that moves the window; duplicates do not count.
        let until = Instant::now() + sending.timeout;
        let acked = loop {
            let Some(len) = recv_until(socket, &mut recv_buf, until, sending)? else {
                break None;
            };
            match codec::parse(recv_buf.get(..len).unwrap_or_default()) {
                Ok(Packet::Ack { block }) => {
                    if let Some(acked) = ack_in_window(base, high, block) {
                        break Some(acked);
                    }
                }
                Ok(Packet::Error { code, message }) => {
                    return Err(TransferError::Client {
                        code: code.code(),
                        message: message.into_owned(),
                    });
                }
                _ => {}
            }
        };
        match acked {
            Some(acked) if acked == last => return Ok(Outcome::Completed { bytes: size }),
            Some(acked) => {
                base = acked + 1;
                attempts = 0;
            }
            None => {
                attempts += 1;
                if attempts > sending.retries {
                    return Err(TransferError::TimedOut {
                        block: base,
                        retries: sending.retries,
                    });
                }
            }
        }
    }
}

/// Maps a 16-bit ACK onto the window `base..=high` of absolute block
/// numbers: `Some(block)` if it acknowledges at least block `base`.
fn ack_in_window(base: u64, high: u64, wire: u16) -> Option<u64> {
    // Distance from `base` modulo 2^16; windows are at most 65535 blocks, so
    // this is unambiguous.
    let delta = u64::from(wire.wrapping_sub(base as u16));
    let block = base + delta;
    (block <= high).then_some(block)
}

/// Where DATA comes from: the file, read a chunk at a time, or a converted
/// copy in memory.
enum Source {
    File {
        file: File,
        size: u64,
        buf: Vec<u8>,
        /// File offset of `buf[0]`.
        buf_off: u64,
    },
    Memory(Vec<u8>),
}

impl Source {
    fn file(file: File, size: u64) -> Self {
        Source::File {
            file,
            size,
            buf: Vec::new(),
            buf_off: 0,
        }
    }

    fn memory(data: Vec<u8>) -> Self {
        Source::Memory(data)
    }

    fn size(&self) -> u64 {
        match self {
            Source::File { size, .. } => *size,
            Source::Memory(data) => data.len() as u64,
        }
    }

    /// Makes `off..off + len` (clipped to the file) available to `slice`;
    /// reads the file (blocking: called on the transfer's thread).
    fn ensure(&mut self, off: u64, len: usize) -> Result<(), TransferError> {
        let Source::File {
            file,
            size,
            buf,
            buf_off,
        } = self
        else {
            return Ok(());
        };
        let want = (len as u64).min(size.saturating_sub(off));
        if off >= *buf_off && off + want <= *buf_off + buf.len() as u64 {
            return Ok(());
        }
        let read_len = want.max(READ_AHEAD as u64).min(size.saturating_sub(off));
        let read_len =
            usize::try_from(read_len).map_err(|err| TransferError::Read(io::Error::other(err)))?;
        buf.resize(read_len, 0);
        // A file that shrinks under us fails here with UnexpectedEof.
        file.read_exact_at(buf, off).map_err(TransferError::Read)?;
        *buf_off = off;
        Ok(())
    }

    /// Up to `len` bytes at `off`; `None` if `ensure` did not cover them.
    fn slice(&self, off: u64, len: usize) -> Option<&[u8]> {
        let (data, base) = match self {
            Source::File { buf, buf_off, .. } => (buf.as_slice(), *buf_off),
            Source::Memory(data) => (data.as_slice(), 0),
        };
        let start = usize::try_from(off.checked_sub(base)?).ok()?;
        let end = start.saturating_add(len).min(data.len());
        data.get(start..end)
    }
}

/// Reads the whole file and converts it to netascii (RFC 764): LF becomes
/// CR LF and a bare CR becomes CR NUL, as tftp-hpa's server does.
async fn read_netascii(file: File) -> Result<Vec<u8>, TransferError> {
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut raw = Vec::new();
        (&file).read_to_end(&mut raw)?;
        Ok(to_netascii(&raw))
    })
    .await
    .map_err(|err| TransferError::Read(io::Error::other(err)))?
    .map_err(TransferError::Read)
}

fn to_netascii(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() + raw.len() / 16);
    for &b in raw {
        match b {
            b'\n' => out.extend_from_slice(b"\r\n"),
            b'\r' => out.extend_from_slice(b"\r\0"),
            b => out.push(b),
        }
    }
    out
}

/// Displays an error with its sources, like anyhow's `{:#}`.
struct DisplayChain<'a>(&'a dyn std::error::Error);

impl std::fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(err) = source {
            write!(f, ": {err}")?;
            source = err.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_map_onto_the_window_across_rollover() {
        // (base, high, wire ack, expected)
        let table = [
            (1, 1, 1, Some(1)),
            (1, 16, 8, Some(8)),
            (1, 16, 0, None),  // the ACK before the window: a duplicate
            (1, 16, 17, None), // beyond what was sent
            (65530, 65545, 65535, Some(65535)),
            (65530, 65545, 0, Some(65536)),
            (65530, 65545, 9, Some(65545)),
            (65530, 65545, 10, None),
            (65536, 65536, 0, Some(65536)),
            (65537, 65537, 0, None),
            (131072, 131080, 0, Some(131072)),
        ];
        for (base, high, wire, expected) in table {
            assert_eq!(
                ack_in_window(base, high, wire),
                expected,
                "{base} {high} {wire}"
            );
        }
    }

    #[test]
    fn netascii_conversion() {
        assert_eq!(to_netascii(b"a\nb\r\nc\r"), b"a\r\nb\r\0\r\nc\r\0");
        assert_eq!(to_netascii(b""), b"");
    }

    #[test]
    fn file_source_reads_windows_in_chunks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).expect("write");
        let mut source = Source::file(File::open(&path).expect("open"), data.len() as u64);
        for off in [0u64, 1000, 200_000, 131_072, 299_990, 0] {
            source.ensure(off, 4096).expect("ensure");
            let got = source.slice(off, 4096).expect("covered");
            let end = (off as usize + 4096).min(data.len());
            assert_eq!(got, &data[off as usize..end]);
        }
        source
            .ensure(data.len() as u64, 512)
            .expect("ensure at end");
        assert_eq!(source.slice(data.len() as u64, 512), Some(&[][..]));
    }
}
