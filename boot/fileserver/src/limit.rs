//! The cap on open connections.
//!
//! Every accepted connection takes a [`Slot`]. While a connection waits for
//! a request head (idle between requests, or a head arriving slowly) it is
//! *idle* and may be closed to make room; while it answers a request it is
//! *busy* and is never closed for room. At the cap, a new connection closes
//! the connection that has been idle longest; if every connection is busy,
//! the new one is closed at once. So a flood of idle or slow (slowloris)
//! connections cannot keep a node's download out: each new connection,
//! including the node's, pushes out the oldest idle one, and the node's
//! request makes its connection busy as soon as its head arrives.
//!
//! Reaching the cap is logged at warn, at most once every
//! [`WARN_EVERY`], with how many connections were closed or refused since
//! the last line; the counts are also metrics.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::Metrics;

/// At most one warning about the cap this often.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);

/// Open-file descriptors kept for the rest of the job server (DHCP, DNS,
/// TFTP transfers, the lease log, the control service's connections).
pub const RESERVED_FILES: u64 = 256;

/// The most connections `open_files` (the soft `RLIMIT_NOFILE`) can carry:
/// each may hold its socket and the file it sends, after
/// [`RESERVED_FILES`] are kept aside. At least 16.
pub fn connections_for(open_files: u64) -> usize {
    usize::try_from(open_files.saturating_sub(RESERVED_FILES) / 2)
        .unwrap_or(usize::MAX)
        .max(16)
}

/// The open connections of one server, and how many may be open.
#[derive(Debug)]
pub(crate) struct Conns {
    max: usize,
    state: Mutex<State>,
    metrics: Metrics,
}

#[derive(Debug, Default)]
struct State {
    /// Connections counted against the cap.
    open: usize,
    /// Idle connections by when they became idle (a sequence number), each
    /// with the token that closes it.
    idle: BTreeMap<u64, CancellationToken>,
    next: u64,
    /// When the cap was last logged, and what happened since.
    warned: Option<Instant>,
    closed_since: u64,
    refused_since: u64,
}

impl Conns {
    pub(crate) fn new(max: usize, metrics: Metrics) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            state: Mutex::new(State::default()),
            metrics,
        })
    }

    /// A slot for a connection just accepted: `None` when the cap is
    /// reached and no connection is idle (the new one is to be closed).
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.open >= self.max {
            // The longest idle connection makes room; its slot is no
            // longer counted (it closes on its own task).
            if let Some((_, token)) = state.idle.pop_first() {
                token.cancel();
                state.closed_since += 1;
                self.metrics.closed_connections.inc();
            } else {
                state.refused_since += 1;
                self.metrics.refused_connections.inc();
                self.warn(&mut state);
                return None;
            }
            self.warn(&mut state);
        } else {
            state.open += 1;
            self.metrics.open_connections.inc();
        }
        Some(Slot {
            conns: Arc::clone(self),
            evict: CancellationToken::new(),
            idle_key: None,
        })
    }

    fn warn(&self, state: &mut State) {
        let now = Instant::now();
        if state
            .warned
            .is_some_and(|at| now.duration_since(at) < WARN_EVERY)
        {
            return;
        }
        tracing::warn!(
            "HTTP file server: {} connections open, its limit (--http-max-connections): closed {} idle connections and refused {} new ones{}",
            self.max,
            state.closed_since,
            state.refused_since,
            match state.warned {
                Some(at) => format!(" in the last {} s", now.duration_since(at).as_secs()),
                None => String::new(),
            }
        );
        state.warned = Some(now);
        state.closed_since = 0;
        state.refused_since = 0;
    }
}

/// One connection's place under the cap; freed when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    conns: Arc<Conns>,
    /// Cancelled when the connection is closed to make room.
    evict: CancellationToken,
    /// Its key among the idle connections, while it is idle.
    idle_key: Option<u64>,
}

impl Slot {
    /// The connection waits for a request head: it may be closed for room.
    pub(crate) fn idle(&mut self) {
        if self.idle_key.is_some() || self.evict.is_cancelled() {
            return;
        }
        let mut state = self.conns.state.lock().unwrap_or_else(|e| e.into_inner());
        let key = state.next;
        state.next += 1;
        state.idle.insert(key, self.evict.clone());
        self.idle_key = Some(key);
    }

    /// The connection answers a request: it is not closed for room. `false`
    /// when it was closed for room already (the caller stops).
    pub(crate) fn busy(&mut self) -> bool {
        if let Some(key) = self.idle_key.take() {
            let mut state = self.conns.state.lock().unwrap_or_else(|e| e.into_inner());
            state.idle.remove(&key);
        }
        !self.evict.is_cancelled()
    }

    /// Resolves when the connection was closed to make room.
    pub(crate) async fn evicted(&self) {
        self.evict.cancelled().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.conns.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(key) = self.idle_key.take() {
            state.idle.remove(&key);
        }
        // An evicted slot was handed to the connection that evicted it.
        if !self.evict.is_cancelled() {
            state.open -= 1;
            self.conns.metrics.open_connections.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_idle_connection_makes_room() {
        let conns = Conns::new(2, Metrics::default());
        let mut a = conns.admit().unwrap();
        let mut b = conns.admit().unwrap();
        a.idle();
        b.idle();
        // b became busy and idle again: a is now the longest idle.
        assert!(b.busy());
        b.idle();
        let mut c = conns.admit().unwrap();
        assert!(a.evict.is_cancelled() && !b.evict.is_cancelled());
        assert!(!a.busy(), "an evicted connection stops");
        // b and c busy: nothing to close, the next one is refused.
        assert!(b.busy() && c.busy());
        assert!(conns.admit().is_none());
        drop(a);
        assert!(conns.admit().is_none(), "a's place went to c");
        drop(c);
        let d = conns.admit().unwrap();
        assert_eq!(conns.state.lock().unwrap().open, 2);
        drop((b, d));
        let state = conns.state.lock().unwrap();
        assert_eq!((state.open, state.idle.len()), (0, 0));
        assert_eq!(conns.metrics.closed_connections.get(), 1);
        assert_eq!(conns.metrics.refused_connections.get(), 2);
        assert_eq!(conns.metrics.open_connections.get(), 0);
    }

    #[test]
    fn the_cap_fits_the_file_limit() {
        assert_eq!(connections_for(1024), 384);
        assert_eq!(connections_for(524_288), 262_016);
        assert_eq!(connections_for(100), 16);
    }
}
