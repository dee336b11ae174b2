//! What every connection to an HTTP service may hold, and for how long: the
//! control service's HTTP and HTTPS listeners and the job server's metrics
//! listener take it (the job server's image server, which speaks HTTP
//! itself, has its own cap in `mprov-fileserver`).
//!
//! A service is reachable from a whole provisioning network, so a client
//! that opens connections and sends nothing, or trickles a request head a
//! byte at a time, must not use up the process's file descriptors (a
//! systemd service gets 1,024 by default) and stop `/ipxe/`, enrollment and
//! the job servers' long-polls. Three rules, over HTTP and HTTPS alike
//! ([`Guard`], an [`axum_server`] acceptor that runs before the TLS
//! handshake, so a silent TLS client is covered too):
//!
//! - **A connection with no request in flight has a deadline**: its first
//!   request must start within [`Limits::first_request`] of the accept, and
//!   each later one within [`Limits::idle`] of the last one's end. A request
//!   starts when its head is complete, so a head trickled slowly, an idle
//!   keep-alive and a TLS session that never speaks all close at the
//!   deadline. Reading bytes does not move it; sending a reply's bytes does,
//!   so a slow download is not cut.
//! - **A request in flight has none** (a job server's long-poll waits
//!   minutes by design; its own timeouts bound it).
//! - **At most [`Limits::max`] connections are open.** A connection beyond
//!   it closes the longest-idle one (no request in flight), so a flood of
//!   idle connections cannot keep a booting node out; if every connection
//!   is busy the new one is closed at once. Either way a warning says so,
//!   at most once per [`WARN_EVERY`].
//!
//! Hand-written because neither hyper nor axum-server bounds idle HTTP/2
//! connections or caps connections; hyper's `header_read_timeout` covers
//! HTTP/1 heads only.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// The fewest seconds between two warnings that the cap was reached.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// The limits every connection to a service is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most connections open at once.
    pub max: usize,
    /// How long a new connection may take to start its first request (the
    /// TLS handshake included).
    pub first_request: Duration,
    /// How long a connection may stay open with no request in flight.
    pub idle: Duration,
}

/// The connections open, shared by every listener of a service.
#[derive(Debug)]
pub struct Registry {
    limits: Limits,
    /// The setting that raises the cap, for the warnings.
    setting: &'static str,
    /// Open connections by number.
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    /// When the last cap warning was logged.
    warned: Mutex<Option<Instant>>,
}

impl Registry {
    /// A registry enforcing `limits`, the cap lowered to what the process's
    /// file limit leaves room for (see [`fit_file_limit`]); `setting` names
    /// what raises the cap, in its warnings.
    pub fn new(limits: Limits, setting: &'static str) -> Arc<Registry> {
        let soft = crate::open_file_limit().unwrap_or(u64::MAX);
        let fitted = fit_file_limit(limits, soft);
        if fitted.max < limits.max {
            tracing::info!(
                "at most {} connections at once ({setting}={}, lowered to fit the file limit of {soft})",
                fitted.max,
                limits.max
            );
        }
        Arc::new(Registry {
            limits: fitted,
            setting,
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            warned: Mutex::new(None),
        })
    }

    /// The limits it enforces.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// How many connections are open.
    pub fn open(&self) -> usize {
        self.open.lock().map_or(0, |o| o.len())
    }

    /// Admits a connection from `peer`, closing the longest-idle one when
    /// the cap is reached; `None` when every open connection is busy.
    fn admit(self: &Arc<Self>, peer: SocketAddr) -> Option<Arc<Conn>> {
        let now = Instant::now();
        let mut open = self.open.lock().ok()?;
        if open.len() >= self.limits.max {
            let idlest = open
                .iter()
                .filter(|(_, c)| c.in_flight.load(Ordering::Acquire) == 0)
                .min_by_key(|(_, c)| c.last_active())
                .map(|(id, c)| (*id, c.clone()));
            match idlest {
                Some((id, victim)) => {
                    open.remove(&id);
                    victim.close();
                    self.warn(format_args!(
                        "{} connections open, the most allowed ({}); closed the longest idle one (from {}, idle {} s) for a new one from {peer}",
                        self.limits.max,
                        self.setting,
                        victim.peer,
                        now.saturating_duration_since(victim.last_active()).as_secs()
                    ));
                }
                None => {
                    self.warn(format_args!(
                        "{} connections open, the most allowed ({}), each with a request in flight; refused a new one from {peer} (raise {} and the service's file limit)",
                        self.limits.max, self.setting, self.setting
                    ));
                    return None;
                }
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            peer,
            started: now,
            active_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        });
        open.insert(id, conn.clone());
        Some(conn)
    }

    fn forget(&self, id: u64) {
        if let Ok(mut open) = self.open.lock() {
            open.remove(&id);
        }
    }

    fn warn(&self, message: std::fmt::Arguments<'_>) {
        let now = Instant::now();
        let Ok(mut warned) = self.warned.lock() else {
            return;
        };
        if warned.is_none_or(|at| now.saturating_duration_since(at) >= WARN_EVERY) {
            *warned = Some(now);
            tracing::warn!("{message}");
        }
    }
}

/// `limits` with the cap lowered so that connections leave file
/// descriptors for everything else (the database, the signing helper, the
/// listeners, logs) under a soft file limit of `soft`.
pub fn fit_file_limit(limits: Limits, soft: u64) -> Limits {
    let room = soft.saturating_sub(128).max(soft / 2).max(1);
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    Limits {
        max: limits.max.min(room),
        ..limits
    }
}

/// One open connection's state, shared by its stream and its service.
#[derive(Debug)]
struct Conn {
    id: u64,
    peer: SocketAddr,
    started: Instant,
    /// Milliseconds after `started` of the last activity that moves the
    /// deadline (a request's start or end, reply bytes sent).
    active_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// Whether a request has started on it.
    served: AtomicBool,
    /// Closed to make room for another.
    closed: AtomicBool,
    /// The task reading the connection, woken to close it.
    waker: AtomicWaker,
}

impl Conn {
    fn last_active(&self) -> Instant {
        self.started + Duration::from_millis(self.active_ms.load(Ordering::Acquire))
    }

    fn touch(&self) {
        let ms = u64::try_from(
            Instant::now()
                .saturating_duration_since(self.started)
                .as_millis(),
        )
        .unwrap_or(u64::MAX);
        self.active_ms.fetch_max(ms, Ordering::AcqRel);
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// When the connection closes if nothing starts, given `limits`.
    fn deadline(&self, limits: &Limits) -> Instant {
        let wait = if self.served.load(Ordering::Acquire) {
            limits.idle
        } else {
            limits.first_request
        };
        self.last_active() + wait
    }
}

/// The acceptor that applies a [`Registry`]'s rules to each TCP connection
/// before `inner` (TLS or nothing) sees it.
#[derive(Debug, Clone)]
pub struct Guard<A> {
    registry: Arc<Registry>,
    inner: A,
}

impl<A> Guard<A> {
    /// Guards `inner` with `registry`.
    pub fn new(registry: Arc<Registry>, inner: A) -> Guard<A> {
        Guard { registry, inner }
    }
}

impl<A, S> axum_server::accept::Accept<TcpStream, S> for Guard<A>
where
    A: axum_server::accept::Accept<Guarded<TcpStream>, GuardedService<S>> + Clone + Send + 'static,
    A::Future: Send + 'static,
    S: Send + 'static,
{
    type Stream = A::Stream;
    type Service = A::Service;
    type Future = Pin<Box<dyn Future<Output = io::Result<(A::Stream, A::Service)>> + Send>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let registry = self.registry.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            // TCP_NODELAY: an enrollment is a few small writes each way, and
            // Nagle's algorithm against the peer's delayed ACK added about
            // 40 ms to each.
            if let Err(err) = stream.set_nodelay(true) {
                tracing::debug!(error = %err, "cannot set TCP_NODELAY");
            }
            let peer = stream.peer_addr()?;
            let conn = registry.admit(peer).ok_or_else(|| {
                io::Error::new(io::ErrorKind::ConnectionRefused, "connection cap reached")
            })?;
            let sleep = Box::pin(tokio::time::sleep_until(conn.deadline(&registry.limits)));
            let stream = Guarded {
                inner: stream,
                conn: conn.clone(),
                registry: registry.clone(),
                sleep,
            };
            let service = GuardedService {
                inner: service,
                conn,
            };
            inner.accept(stream, service).await
        })
    }
}

/// A connection's stream under its deadline.
#[derive(Debug)]
pub struct Guarded<T> {
    inner: T,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
    sleep: Pin<Box<Sleep>>,
}

impl<T> Drop for Guarded<T> {
    fn drop(&mut self) {
        self.registry.forget(self.conn.id);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.conn.waker.register(cx.waker());
        if this.conn.closed.load(Ordering::Acquire) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed for a new connection (the connection cap was reached)",
            )));
        }
        let ready = Pin::new(&mut this.inner).poll_read(cx, buf);
        if ready.is_ready() || this.conn.in_flight.load(Ordering::Acquire) > 0 {
            return ready;
        }
        // Nothing to read and nothing in flight: the deadline runs.
        let deadline = this.conn.deadline(&this.registry.limits);
        if this.sleep.deadline() != deadline {
            this.sleep.as_mut().reset(deadline);
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no request in time (idle connection)",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written
            && n > 0
        {
            self.conn.touch();
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = written
            && n > 0
        {
            self.conn.touch();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A connection's service: counts the requests in flight.
#[derive(Debug, Clone)]
pub struct GuardedService<S> {
    inner: S,
    conn: Arc<Conn>,
}

/// Ends a request's flight when dropped (answered, or abandoned).
#[derive(Debug)]
struct InFlight(Arc<Conn>);

impl InFlight {
    fn start(conn: Arc<Conn>) -> InFlight {
        conn.served.store(true, Ordering::Release);
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        conn.touch();
        InFlight(conn)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        // The reader may be parked on a deadline computed while this request
        // was in flight: let it compute the new one.
        self.0.waker.wake();
    }
}

impl<S, R> tower::Service<R> for GuardedService<S>
where
    S: tower::Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let flight = InFlight::start(self.conn.clone());
        let future = self.inner.call(req);
        Box::pin(async move {
            let response = future.await;
            drop(flight);
            response
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize) -> Limits {
        Limits {
            max,
            first_request: Duration::from_secs(10),
            idle: Duration::from_secs(60),
        }
    }

    fn peer(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn the_cap_leaves_room_under_the_file_limit() {
        assert_eq!(fit_file_limit(limits(16_384), 1024).max, 896);
        assert_eq!(fit_file_limit(limits(16_384), 200).max, 100);
        assert_eq!(fit_file_limit(limits(100), 1024).max, 100);
        assert_eq!(fit_file_limit(limits(16_384), u64::MAX).max, 16_384);
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_longest_idle_connection_makes_room() {
        let r = Registry::new(limits(2), "MAX");
        let a = r.admit(peer(1)).expect("first");
        tokio::time::advance(Duration::from_secs(1)).await;
        let b = r.admit(peer(2)).expect("second");
        let _busy = InFlight::start(b.clone());
        tokio::time::advance(Duration::from_secs(1)).await;
        let c = r.admit(peer(3)).expect("third, in place of the idle first");
        assert!(a.closed.load(Ordering::Acquire), "the idle one is closed");
        assert!(!b.closed.load(Ordering::Acquire), "the busy one is kept");
        assert_eq!(r.open(), 2);
        // Now both open ones are busy: a fourth is refused, nobody closed.
        let _busy_c = InFlight::start(c.clone());
        assert!(r.admit(peer(4)).is_none());
        assert!(!b.closed.load(Ordering::Acquire) && !c.closed.load(Ordering::Acquire));
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_moves_with_requests_not_with_reads() {
        let r = Registry::new(limits(8), "MAX");
        let c = r.admit(peer(1)).expect("admitted");
        let t0 = c.started;
        assert_eq!(c.deadline(&r.limits), t0 + Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(3)).await;
        drop(InFlight::start(c.clone()));
        // After a request, the idle wait counts from its end.
        assert_eq!(
            c.deadline(&r.limits),
            t0 + Duration::from_secs(3) + Duration::from_secs(60)
        );
    }
}
