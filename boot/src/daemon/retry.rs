//! Retrying a call to the control service until it answers: a pause
//! doubling from 1 s to 60 s, and one log line per kind of failure, not one
//! per try: "not reachable" once, then quiet until the failure changes kind
//! or the call succeeds.

use std::time::Duration;

use mprov_api::client::ClientError;
use tokio_util::sync::CancellationToken;

/// The first pause after a failure.
pub const FIRST_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);

/// What kind of failure a call to the control service met: a new kind is
/// logged, a repeat is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No answer: connection refused, TLS, timeout.
    Unreachable,
    /// It answered with another mProv API version (or none).
    VersionMismatch,
    /// It does not know the endpoint (404): an older control service.
    NotFound,
    /// It answered with this HTTP status.
    Status(u16),
    /// Anything else (a reply that does not decode, a local error).
    Other,
}

impl Failure {
    /// The kind of `err`, looking through its causes for a [`ClientError`].
    pub fn of(err: &anyhow::Error) -> Failure {
        err.chain()
            .find_map(|e| e.downcast_ref::<ClientError>())
            .map_or(Failure::Other, Failure::of_client)
    }

    /// The kind of a client error.
    pub fn of_client(err: &ClientError) -> Failure {
        match err {
            ClientError::Http { .. } => Failure::Unreachable,
            ClientError::VersionMismatch { .. } => Failure::VersionMismatch,
            ClientError::Api { status, .. } if status.as_u16() == 404 => Failure::NotFound,
            ClientError::Api { status, .. } => Failure::Status(status.as_u16()),
            _ => Failure::Other,
        }
    }

    /// Whether trying again may help: the control service may come up, be
    /// upgraded or recover. A refusal (4xx other than 404, e.g. a spent
    /// enrollment token) or a local error will not change by waiting.
    pub fn transient(self) -> bool {
        match self {
            Failure::Unreachable | Failure::VersionMismatch | Failure::NotFound => true,
            Failure::Status(s) => s >= 500 || s == 429 || s == 408,
            Failure::Other => false,
        }
    }
}

/// The pause after `failures` failures in a row: 1 s, 2 s, 4 s ... 60 s.
pub fn pause(failures: u32) -> Duration {
    let doubled = FIRST_PAUSE.saturating_mul(1u32 << failures.clamp(1, 7).saturating_sub(1));
    doubled.min(MAX_PAUSE)
}

/// The failures of one repeated call: decides what is logged and how long
/// to wait.
#[derive(Debug, Default)]
pub struct Retry {
    failures: u32,
    last: Option<Failure>,
}

impl Retry {
    /// No failure yet.
    pub fn new() -> Retry {
        Retry::default()
    }

    /// Notes a failure of kind `kind`: whether to log it (a kind not seen
    /// just before), and the pause before the next try.
    pub fn failed(&mut self, kind: Failure) -> (bool, Duration) {
        self.failures = self.failures.saturating_add(1);
        let log = self.last != Some(kind);
        self.last = Some(kind);
        (log, pause(self.failures))
    }

    /// Notes a success: whether it had been failing (worth an "again" line).
    pub fn succeeded(&mut self) -> bool {
        self.failures = 0;
        self.last.take().is_some()
    }
}

/// The log line for a failure of kind `kind` calling `what` at `url`.
pub fn describe(what: &str, url: &str, kind: Failure, err: &dyn std::fmt::Display) -> String {
    match kind {
        Failure::Unreachable => {
            format!("{what}: control service at {url} not reachable ({err}); retrying")
        }
        Failure::VersionMismatch => {
            format!("{what}: control service at {url}: {err}; retrying until the versions match")
        }
        Failure::NotFound => format!(
            "{what}: control service at {url} does not know this call ({err}): it is older than this job server; retrying until it is upgraded"
        ),
        Failure::Status(_) | Failure::Other => format!("{what} at {url} failed ({err}); retrying"),
    }
}

/// Calls `call` until it succeeds, a failure `retried` says not to retry
/// (returned; [`Failure::transient`] for most calls), or `stop` (`None`).
/// Failures are logged at warning level once per kind, with `what` and
/// `url`.
pub async fn until_ok<T, F, Fut>(
    what: &str,
    url: &str,
    stop: &CancellationToken,
    retried: fn(Failure) -> bool,
    mut call: F,
) -> Option<anyhow::Result<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let mut retry = Retry::new();
    loop {
        let result = tokio::select! {
            () = stop.cancelled() => return None,
            r = call() => r,
        };
        let err = match result {
            Ok(v) => {
                if retry.succeeded() {
                    tracing::info!("{what}: control service at {url} answers again");
                }
                return Some(Ok(v));
            }
            Err(err) => err,
        };
        let kind = Failure::of(&err);
        if !retried(kind) {
            return Some(Err(err));
        }
        let (log, wait) = retry.failed(kind);
        if log {
            tracing::warn!("{}", describe(what, url, kind, &format!("{err:#}")));
        } else {
            tracing::debug!("{what}: still failing ({err:#}); next try in {wait:?}");
        }
        tokio::select! {
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_doubles_from_one_second_to_a_minute() {
        let secs: Vec<u64> = (1..=9).map(|n| pause(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(pause(u32::MAX), MAX_PAUSE);
    }

    #[test]
    fn each_kind_of_failure_is_logged_once_until_it_changes_or_succeeds() {
        let mut r = Retry::new();
        let logged = |r: &mut Retry, k| r.failed(k).0;
        assert!(logged(&mut r, Failure::Unreachable));
        assert!(!logged(&mut r, Failure::Unreachable));
        assert!(!logged(&mut r, Failure::Unreachable));
        assert!(logged(&mut r, Failure::VersionMismatch));
        assert!(!logged(&mut r, Failure::VersionMismatch));
        assert!(logged(&mut r, Failure::Unreachable));
        assert!(r.succeeded());
        assert!(!r.succeeded());
        assert!(logged(&mut r, Failure::Unreachable));
        // The pause started over after the success.
        assert_eq!(r.failed(Failure::Unreachable).1, Duration::from_secs(2));
    }

    #[test]
    fn only_failures_that_waiting_can_change_are_retried() {
        assert!(Failure::Unreachable.transient());
        assert!(Failure::VersionMismatch.transient());
        assert!(Failure::NotFound.transient());
        assert!(Failure::Status(503).transient());
        assert!(!Failure::Status(403).transient());
        assert!(!Failure::Status(422).transient());
        assert!(!Failure::Other.transient());
        let mismatch = anyhow::Error::new(ClientError::VersionMismatch {
            server: Some("0.0".into()),
            ours: "1.0",
        })
        .context("enrolling");
        assert_eq!(Failure::of(&mismatch), Failure::VersionMismatch);
        assert_eq!(Failure::of(&anyhow::anyhow!("disk")), Failure::Other);
    }
}
