//! Whether the database answers: a MariaDB or PostgreSQL restart, or a cut
//! network, must turn into quick 503s, one log line, and service again by
//! itself once the database is back, never into hung or 500 requests.
//!
//! The rules:
//! * A request that fails with an error that means "the server is not there"
//!   ([`is_unavailable`]), or an internal error while a fresh connection
//!   cannot be made ([`Health::probe`]), marks the database down.
//! * Marking it down logs once and starts one watcher, which probes with a
//!   fresh connection (not the pool, so a full pool is not mistaken for an
//!   outage) every [`RETRY`] until it answers, then logs once more and marks
//!   it up. While it is down, requests get a 503 at once instead of waiting
//!   for a connection.
//! * A request that waits on the database longer than [`WATCHDOG`] has it
//!   probed; when the probe fails (a server that accepts no more, a network
//!   cut that never resets the connection) the request gets its 503 then.
//! * Pooled connections to the old server are tested before use (sqlx's
//!   `test_before_acquire`), so after a restart they are replaced, not used.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::Connection as _;

/// How long a probe may take before the database counts as not answering.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the watcher probes while the database is down.
pub const RETRY: Duration = Duration::from_millis(500);
/// How long a request may wait before the database is probed under it.
pub const WATCHDOG: Duration = Duration::from_secs(10);

/// The database's state as the service sees it; shared by every clone of a
/// [`super::Db`].
pub struct Health {
    url: String,
    down: AtomicBool,
    /// When the current outage began, and the last good probe.
    times: Mutex<Times>,
}

#[derive(Default)]
struct Times {
    down_since: Option<Instant>,
    last_ok: Option<Instant>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("down", &self.is_down())
            .finish_non_exhaustive()
    }
}

/// Whether `err` means the database server is not reachable or not serving
/// (as opposed to a bad statement or a constraint).
pub fn is_unavailable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(e) => e.code().is_some_and(|c| unavailable_code(&c)),
        _ => false,
    }
}

/// SQLSTATEs of a server going away: class 08 (connection exception),
/// PostgreSQL's 57P01-57P03 (shutdown, crash, cannot connect now) and 53300
/// (too many connections), MariaDB's 70100 (connection killed) and 08S01.
fn unavailable_code(code: &str) -> bool {
    code.starts_with("08") || code.starts_with("57P0") || code == "53300" || code == "70100"
}

impl Health {
    /// The state for the database at `url`, answering.
    pub fn new(url: &str) -> Health {
        Health {
            url: url.to_owned(),
            down: AtomicBool::new(false),
            times: Mutex::new(Times::default()),
        }
    }

    /// Whether the database is known not to answer.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    fn times(&self) -> std::sync::MutexGuard<'_, Times> {
        self.times
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Connects afresh and runs `SELECT 1`, within [`PROBE_TIMEOUT`].
    pub async fn probe(&self) -> Result<(), String> {
        let attempt = async {
            let mut conn = sqlx::AnyConnection::connect(&self.url).await?;
            sqlx::query("SELECT 1").execute(&mut conn).await?;
            conn.close().await
        };
        match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
            Ok(Ok(())) => {
                self.times().last_ok = Some(Instant::now());
                Ok(())
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
        }
    }

    /// Whether a probe succeeded within the last `within`, so a busy service
    /// does not probe for every slow request.
    pub fn recently_ok(&self, within: Duration) -> bool {
        self.times().last_ok.is_some_and(|t| t.elapsed() < within)
    }

    /// Marks the database down: logs once, and starts the watcher that marks
    /// it up again once a probe succeeds. Needs a tokio runtime.
    pub fn mark_down(self: &Arc<Self>, cause: &str) {
        if self.down.swap(true, Ordering::AcqRel) {
            return;
        }
        self.times().down_since = Some(Instant::now());
        tracing::error!(
            "the database stopped answering ({cause}); answering 503 until it is back, retrying every {RETRY:?}"
        );
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RETRY).await;
                if me.probe().await.is_ok() {
                    let since = me.times().down_since.take();
                    me.down.store(false, Ordering::Release);
                    tracing::warn!(
                        "the database answers again after {:.1} s; serving",
                        since.map_or(0.0, |s| s.elapsed().as_secs_f64())
                    );
                    return;
                }
            }
        });
    }
}

/// Whether a database error is two transactions colliding (the live-row
/// unique index, a deadlock, a serialization failure, a busy SQLite), which
/// a new attempt resolves.
pub fn collision(err: &sqlx::Error) -> bool {
    let sqlx::Error::Database(e) = err else {
        return false;
    };
    if e.is_unique_violation() {
        return true;
    }
    let code = e.code().unwrap_or_default();
    // PostgreSQL: serialization failure, deadlock. MariaDB: deadlock, lock
    // wait timeout. SQLite: busy, locked.
    matches!(
        &*code,
        "40001" | "40P01" | "1213" | "1205" | "5" | "6" | "517"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_counts_as_an_outage() {
        assert!(is_unavailable(&sqlx::Error::PoolTimedOut));
        assert!(is_unavailable(&sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused
        ))));
        assert!(!is_unavailable(&sqlx::Error::RowNotFound));
        for code in ["08006", "08S01", "57P01", "57P03", "53300", "70100"] {
            assert!(unavailable_code(code), "{code}");
        }
        for code in ["23505", "42P01", "HY000", "40001"] {
            assert!(!unavailable_code(code), "{code}");
        }
    }

    #[tokio::test]
    async fn down_until_a_probe_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("h.db").display());
        sqlx::any::install_default_drivers();
        let h = Arc::new(Health::new(&url));
        assert!(!h.is_down());
        h.mark_down("test");
        assert!(h.is_down());
        // The watcher's probe reaches the (always present) SQLite file.
        for _ in 0..100 {
            if !h.is_down() {
                break;
            }
            tokio::time::sleep(RETRY).await;
        }
        assert!(!h.is_down());
        assert!(h.recently_ok(Duration::from_secs(60)));
        let gone = Health::new("sqlite:///nonexistent-dir/x.db");
        assert!(gone.probe().await.is_err());
    }
}
