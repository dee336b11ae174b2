//! Where the job server's boot config comes from: followed live from the
//! control service, or read from a file (standalone mode, and tests).
//!
//! Following is a long-poll on the inventory revision
//! (`GET /api/v1/bootconfig?after=<rev>&wait=<s>`): the control service answers
//! as soon as anything changed, so a new node is answerable within a second,
//! and nothing restarts. When the control service is away, the last snapshot
//! keeps serving and the follower retries with a capped, jittered backoff.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mprov_api::boot::BootConfig;
use mprov_api::client::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long one long-poll asks the server to wait for a change.
pub const POLL_WAIT: Duration = Duration::from_secs(30);
/// The longest pause between retries while the control service is away.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// A snapshot file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// It could not be read.
    #[error("cannot read boot config {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        err: std::io::Error,
    },
    /// It is neither valid JSON nor valid YAML of a boot config.
    #[error("boot config {path} is not a valid snapshot: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// What the parser said.
        reason: String,
    },
}

/// Parses a snapshot from JSON, or YAML when it is not JSON.
pub fn parse(text: &str) -> Result<BootConfig, String> {
    match serde_json::from_str(text) {
        Ok(cfg) => Ok(cfg),
        Err(json_err) if text.trim_start().starts_with('{') => Err(json_err.to_string()),
        Err(_) => serde_saphyr::from_str(text).map_err(|e| e.to_string()),
    }
}

/// Reads a snapshot file (standalone mode).
pub fn read_file(path: &Path) -> Result<BootConfig, FileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|err| FileError::Read {
        path: shown.clone(),
        err,
    })?;
    parse(&text).map_err(|reason| FileError::Parse {
        path: shown,
        reason,
    })
}

/// Follows the control service until `shutdown`, publishing every new snapshot
/// on `tx`. Never gives up: errors are logged and retried, and the last good
/// snapshot stays published.
pub async fn follow(
    client: Client,
    tx: watch::Sender<Arc<BootConfig>>,
    shutdown: CancellationToken,
) {
    let (_keep, clients) = watch::channel(client);
    follow_with(clients, tx, shutdown).await;
}

/// [`follow`] with the client `clients` holds at each poll: the job server
/// swaps in a client with its renewed certificate there.
pub async fn follow_with(
    clients: watch::Receiver<Client>,
    tx: watch::Sender<Arc<BootConfig>>,
    shutdown: CancellationToken,
) {
    let mut failures: u32 = 0;
    loop {
        let after = tx.borrow().revision;
        let client = clients.borrow().clone();
        let poll = client.boot_config(after, POLL_WAIT);
        let result = tokio::select! {
            () = shutdown.cancelled() => return,
            r = poll => r,
        };
        match result {
            Ok(Some(cfg)) => {
                if failures > 0 {
                    tracing::info!("control service reachable again");
                }
                failures = 0;
                tracing::info!(
                    revision = cfg.revision,
                    hosts = cfg.hosts.len(),
                    networks = cfg.networks.len(),
                    "new boot config"
                );
                tx.send_replace(Arc::new(cfg));
            }
            Ok(None) => failures = 0,
            Err(err) => {
                failures = failures.saturating_add(1);
                let pause = backoff(failures);
                // The first failure is worth a warning; repeats only at debug,
                // so an outage does not flood the log.
                if failures == 1 {
                    tracing::warn!(
                        "cannot follow the control service ({err}); serving boot config revision {after} and retrying"
                    );
                } else {
                    tracing::debug!("still cannot reach the control service: {err}");
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// The pause after `failures` failures in a row: doubling from 250 ms, capped,
/// with up to 25 % jitter so job servers do not retry in step.
pub fn backoff(failures: u32) -> Duration {
    let base = Duration::from_millis(250).saturating_mul(1u32 << failures.min(8).saturating_sub(1));
    let capped = base.min(MAX_BACKOFF);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    capped + capped.mul_f64(f64::from(nanos % 1000) / 4000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_json_and_yaml() {
        let json = r#"{"revision": 3, "hosts": [{"hostname": "c01", "mac": "52:54:00:00:00:01", "ipv4": "10.0.0.21"}]}"#;
        let cfg = parse(json).unwrap();
        assert_eq!(cfg.revision, 3);
        assert_eq!(cfg.hosts[0].ipv4, Some("10.0.0.21".parse().unwrap()));
        assert!(cfg.hosts[0].netboot, "netboot defaults to true");
        let yaml = "revision: 4\nnetworks:\n  - slug: prov\n    subnet: 10.0.0.0\n    prefix: 24\n    dhcp: true\n";
        let cfg = parse(yaml).unwrap();
        assert_eq!(cfg.networks[0].slug, "prov");
        assert!(
            parse("{\"revision\": 1, \"colour\": 2}")
                .unwrap_err()
                .contains("colour")
        );
        assert!(parse("revision: [").is_err());
        assert!(parse("hosts:\n  - hostname: x\n    ipv4: 10.0.0.300\n").is_err());
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert!(
            backoff(1) >= Duration::from_millis(250) && backoff(1) < Duration::from_millis(320)
        );
        assert!(backoff(3) >= Duration::from_secs(1));
        for n in [10, 100, u32::MAX] {
            assert!(backoff(n) <= MAX_BACKOFF + MAX_BACKOFF / 4, "{n}");
        }
    }
}
