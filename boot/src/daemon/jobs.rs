//! The jobs loop: claim a job of the modules this job server runs, run it
//! through its [`Module`](crate::modules::Module), report how it goes, and
//! claim the next one at once; with none pending, ask again every
//! [`CLAIM_EVERY`].
//!
//! A job's progress is written with `PATCH /api/v1/jobs/{id}`: `running`
//! with its start time as it starts, its output (the tail, see
//! [`Output`](crate::modules::Output)) at most every [`REPORT_EVERY`] while
//! it grows, then `success` with return code 0, or `failed` with the reason
//! at the end of the output and a non-zero code (1 for an error, 101 for a
//! panic), with its end time. A module's error or panic fails its job,
//! never the job server. A control service without the claim endpoint (an
//! older one answers 404) is logged once and asked again later.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use mprov_api::client::Client;
use mprov_api::jobs::{Claim, Job};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::daemon::retry::{self, Failure, Retry};
use crate::modules::{ExitInfo, Progress, Registry};

/// How often a job server with nothing to do asks for a job.
pub const CLAIM_EVERY: Duration = Duration::from_secs(5);
/// The shortest time between two output reports of a running job.
pub const REPORT_EVERY: Duration = Duration::from_secs(2);
/// The return code of a job whose module panicked.
pub const PANICKED: i64 = 101;
/// Tries of a job's final report.
const FINAL_TRIES: u32 = 5;

/// How a job ended, as its last report says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// `success` or `failed`.
    pub status: &'static str,
    /// Its return code.
    pub return_code: i64,
    /// Why it failed, if it did.
    pub reason: Option<String>,
}

/// The end of a job from its module's result: an error or a non-zero code
/// fails it with the reason.
pub fn ended(result: Result<Result<ExitInfo>, tokio::task::JoinError>) -> Ended {
    let fail = |code: i64, reason: String| Ended {
        status: "failed",
        return_code: code,
        reason: Some(reason),
    };
    match result {
        Ok(Ok(exit)) if exit.return_code == 0 => Ended {
            status: "success",
            return_code: 0,
            reason: None,
        },
        Ok(Ok(exit)) => {
            let reason = exit
                .reason
                .unwrap_or_else(|| format!("the module ended with code {}", exit.return_code));
            fail(exit.return_code, reason)
        }
        Ok(Err(err)) => fail(1, format!("{err:#}")),
        Err(join) if join.is_panic() => {
            let payload = join.into_panic();
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            fail(PANICKED, format!("the module panicked: {what}"))
        }
        Err(_) => fail(
            1,
            "the job was stopped: the job server is shutting down".into(),
        ),
    }
}

/// The last report of a job that ended as `end`, with its `output` so far.
pub fn final_patch(end: &Ended, output: &str, now: &str) -> Value {
    let mut output = output.to_owned();
    if let Some(reason) = &end.reason {
        if !output.is_empty() && !output.ends_with('\n') {
            output.push('\n');
        }
        output.push_str(&format!("job failed: {reason}\n"));
    }
    json!({
        "status": end.status,
        "return_code": end.return_code,
        "ended_at": now,
        "output": output,
    })
}

fn now() -> String {
    jiff::Timestamp::now().to_string()
}

/// Runs the jobs of `modules` (each with an implementation in `registry`)
/// until `stop`, calling the control service with the client `clients`
/// holds.
pub async fn run(
    clients: watch::Receiver<Client>,
    registry: Registry,
    modules: Vec<String>,
    stop: CancellationToken,
) {
    let claim = Claim { modules };
    let names = claim.modules.join(", ");
    tracing::info!("taking jobs of {names}");
    let mut retry = Retry::new();
    loop {
        let client = clients.borrow().clone();
        let claimed = tokio::select! {
            () = stop.cancelled() => return,
            c = client.claim_job(&claim) => c,
        };
        let wait = match claimed {
            Ok(Some(job)) => {
                if retry.succeeded() {
                    tracing::info!("claiming jobs works again");
                }
                run_job(&clients, &registry, job, &stop).await;
                continue;
            }
            Ok(None) => {
                if retry.succeeded() {
                    tracing::info!("claiming jobs works again");
                }
                CLAIM_EVERY
            }
            Err(err) => {
                let kind = Failure::of_client(&err);
                let (log, pause) = retry.failed(kind);
                if log {
                    let url = client.base_url().to_string();
                    tracing::warn!("{}", retry::describe("claiming a job", &url, kind, &err));
                }
                pause.max(CLAIM_EVERY)
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Runs the jobs of `modules` pending now, one after the other, until none
/// is left (`--run-once`); how many ran.
pub async fn drain(
    clients: &watch::Receiver<Client>,
    registry: &Registry,
    modules: Vec<String>,
    stop: &CancellationToken,
) -> Result<usize> {
    let claim = Claim { modules };
    let mut ran = 0;
    while !stop.is_cancelled() {
        let client = clients.borrow().clone();
        let Some(job) = client.claim_job(&claim).await.context("claiming a job")? else {
            break;
        };
        run_job(clients, registry, job, stop).await;
        ran += 1;
    }
    Ok(ran)
}

/// Runs one claimed job and reports it; never fails (a failure to report
/// is logged).
pub async fn run_job(
    clients: &watch::Receiver<Client>,
    registry: &Registry,
    job: Job,
    stop: &CancellationToken,
) -> Ended {
    let (id, key) = (job.id, job.id.to_string());
    tracing::info!("job {id}: {} {}", job.module, job.params);
    let patch = |body: Value| {
        let client = clients.borrow().clone();
        let key = key.clone();
        async move { client.update("jobs", &key, &body).await }
    };
    if let Err(e) = patch(json!({"status": "running", "started_at": now()})).await {
        tracing::warn!("job {id}: cannot report that it started ({e})");
    }
    let progress = Progress::new(clients.clone(), stop.clone());
    let Some(module) = registry.get(&job.module) else {
        let end = Ended {
            status: "failed",
            return_code: 1,
            reason: Some(format!("this job server has no module {}", job.module)),
        };
        finish(id, &patch, &end, "", FINAL_TRIES).await;
        return end;
    };
    let task = {
        let (job, progress) = (Arc::new(job), progress.clone());
        tokio::spawn(async move { module.run(&job, &progress).await })
    };
    let abort = task.abort_handle();
    let mut task = std::pin::pin!(task);
    let mut sent = 0;
    let mut every = tokio::time::interval(REPORT_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let result = loop {
        tokio::select! {
            r = &mut task => break r,
            () = stop.cancelled() => {
                abort.abort();
                break (&mut task).await;
            }
            _ = every.tick() => {
                let output = progress.output();
                if output.version() != sent {
                    sent = output.version();
                    if let Err(e) = patch(json!({"output": output.render()})).await {
                        tracing::debug!("job {id}: cannot report its output ({e})");
                    }
                }
            }
        }
    };
    let end = ended(result);
    match &end.reason {
        None => tracing::info!("job {id}: done"),
        Some(reason) => tracing::warn!("job {id} failed: {reason}"),
    }
    // Stopping: one try, the job server must not linger.
    let tries = if stop.is_cancelled() { 1 } else { FINAL_TRIES };
    finish(id, &patch, &end, &progress.output().render(), tries).await;
    end
}

/// Sends a job's last report, with up to `tries` tries: a job left
/// `running` is failed only by the control service's timeout.
async fn finish<F, Fut>(id: i64, patch: &F, end: &Ended, output: &str, tries: u32)
where
    F: Fn(Value) -> Fut,
    Fut: std::future::Future<Output = Result<Value, mprov_api::client::ClientError>>,
{
    let body = final_patch(end, output, &now());
    for attempt in 1..=tries {
        match patch(body.clone()).await {
            Ok(_) => return,
            Err(e) if attempt >= tries => {
                tracing::warn!("job {id}: cannot report that it ended ({e}); giving up");
            }
            Err(_) => tokio::time::sleep(retry::pause(attempt)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_module_error_or_panic_fails_its_job_not_the_caller() {
        let ok = tokio::spawn(async { Ok(ExitInfo::success()) }).await;
        assert_eq!(ended(ok).status, "success");
        let code = tokio::spawn(async { Ok(ExitInfo::failed(3, "disk full")) }).await;
        assert_eq!(
            ended(code),
            Ended {
                status: "failed",
                return_code: 3,
                reason: Some("disk full".into())
            }
        );
        let err = tokio::spawn(async { Err(anyhow::anyhow!("no space").context("writing")) }).await;
        let end = ended(err);
        assert_eq!((end.status, end.return_code), ("failed", 1));
        assert_eq!(end.reason.as_deref(), Some("writing: no space"));
        let panic = tokio::spawn(async {
            if true {
                panic!("index out of bounds");
            }
            Ok(ExitInfo::success())
        })
        .await;
        let end = ended(panic);
        assert_eq!((end.status, end.return_code), ("failed", PANICKED));
        assert!(end.reason.unwrap().contains("index out of bounds"));
    }

    #[test]
    fn the_final_report_carries_status_code_time_and_reason() {
        let end = Ended {
            status: "failed",
            return_code: 3,
            reason: Some("disk full".into()),
        };
        let body = final_patch(&end, "copying", "2026-01-01T00:00:00Z");
        assert_eq!(
            body,
            json!({"status": "failed", "return_code": 3, "ended_at": "2026-01-01T00:00:00Z",
                   "output": "copying\njob failed: disk full\n"})
        );
        let ok = Ended {
            status: "success",
            return_code: 0,
            reason: None,
        };
        assert_eq!(final_patch(&ok, "", "t")["output"], "");
        assert_eq!(final_patch(&ok, "", "t")["status"], "success");
    }
}
