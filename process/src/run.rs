//! Main's ending, signals, and the runner of bound servers.

use std::process::ExitCode;

use anyhow::{Context, Result, anyhow};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Main's exit code for `result`. An error is printed once, on standard
/// error, with its whole cause chain (`error: cannot open ...: permission
/// denied`); the log, also on standard error, does not repeat it. On
/// journald's stream the line carries the error priority (`<3>`), as the
/// log's error lines do.
pub fn exit(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let priority = if crate::logging::stderr_is_journald() {
                "<3>"
            } else {
                ""
            };
            eprintln!("{priority}error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// SIGTERM (systemd, `docker stop`) and SIGINT (Ctrl-C). Create it first
/// thing in a service's start-up: from then on a stop asked for during a
/// slow start (enrollment, migrations) ends the service cleanly instead of
/// killing it. Needs a Tokio runtime.
#[derive(Debug)]
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Catches both signals from now on.
    pub fn new() -> Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("cannot catch SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot catch SIGINT")?,
        })
    }

    /// Waits for either signal (one that came before this call counts).
    pub async fn wait(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }

    /// Cancels `shutdown` on the first signal, from a task of its own: what
    /// the start-up does meanwhile can watch the token.
    pub fn cancel_on_signal(mut self, shutdown: CancellationToken) {
        tokio::spawn(async move {
            tokio::select! {
                () = self.wait() => {
                    tracing::info!("shutting down");
                    shutdown.cancel();
                }
                () = shutdown.cancelled() => {}
            }
        });
    }
}

/// Runs `servers` (each bound already, each ending when `shutdown` is
/// cancelled) until `shutdown` is cancelled (by a signal, see
/// [`Signals::cancel_on_signal`]) or one of them ends: a server that stops on
/// its own or fails stops the others too, and its error is the result. The
/// others' errors while stopping are logged.
pub async fn run_servers(
    mut servers: JoinSet<Result<()>>,
    shutdown: CancellationToken,
) -> Result<()> {
    let mut failure = None;
    tokio::select! {
        // A server that ends because the stop was asked for is no failure.
        biased;
        () = shutdown.cancelled() => {}
        Some(done) = servers.join_next() => {
            failure = Some(match done {
                Ok(Ok(())) => anyhow!("a server stopped on its own"),
                Ok(Err(e)) => e,
                Err(e) => anyhow!("a server task failed: {e}"),
            });
        }
    }
    shutdown.cancel();
    while let Some(done) = servers.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("while stopping: {e:#}"),
            Err(e) => tracing::warn!("while stopping: a server task failed: {e}"),
        }
    }
    failure.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use anyhow::bail;
    use tokio::task::JoinSet;
    use tokio_util::sync::CancellationToken;

    use super::run_servers;

    #[tokio::test]
    async fn a_failing_server_stops_the_others_and_is_the_result() {
        let shutdown = CancellationToken::new();
        let mut servers = JoinSet::new();
        let stop = shutdown.clone();
        servers.spawn(async move {
            stop.cancelled().await;
            Ok(())
        });
        servers.spawn(async { bail!("cannot bind 0.0.0.0:67") });
        let err = run_servers(servers, shutdown.clone()).await.unwrap_err();
        assert_eq!(err.to_string(), "cannot bind 0.0.0.0:67");
        assert!(shutdown.is_cancelled());
    }

    #[tokio::test]
    async fn a_cancelled_token_stops_every_server_cleanly() {
        let shutdown = CancellationToken::new();
        let mut servers = JoinSet::new();
        for _ in 0..3 {
            let stop = shutdown.clone();
            servers.spawn(async move {
                stop.cancelled().await;
                Ok(())
            });
        }
        shutdown.cancel();
        run_servers(servers, shutdown).await.unwrap();
    }

    #[tokio::test]
    async fn a_server_that_ends_by_itself_is_a_failure() {
        let mut servers = JoinSet::new();
        servers.spawn(async { Ok(()) });
        let err = run_servers(servers, CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "a server stopped on its own");
    }
}
