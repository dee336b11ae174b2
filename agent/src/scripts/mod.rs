//! The script-runner: a node's post-boot scripts, or an image's image-gen
//! scripts on the job server that builds it, run as the control service's
//! plan lists them (`mprov_api::scripts` has the exchange).
//!
//! - [`plan`]: the order (dependency layers) or a refusal naming the
//!   scripts, a pure function of the plan; the image builder's recipes use
//!   its rule too.
//! - [`exec`]: the checks before anything runs (order, checksums), then the
//!   scripts, layer by layer, each in its own process group with its
//!   timeout; `/etc/nologin` held while post-boot scripts run.
//! - This module: the I/O around them with the caller's own certificate
//!   ([`Control`]): [`fetch_plan`], then [`run`] (the contents fetched,
//!   the `scripts` boot phase reported, the scripts run, the [`RunReport`]
//!   posted, and `ready` reported only when every post-boot script
//!   succeeded).

pub mod exec;
pub mod plan;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

use mprov_api::boot::BootPhase;
use mprov_api::scripts::{
    RESULTS_PATH, RunOutcome, RunReport, ScriptMode, ScriptPlan, content_path, plan_path,
};

use crate::enroll::{Control, EnrollError};

/// Why a run could not be carried out or reported (a refused or failed run
/// is not an error: it is its [`RunReport`]).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The run's own files could not be written.
    #[error("running the scripts")]
    Exec(#[from] exec::ExecError),
    /// A script's content could not be fetched.
    #[error("fetching script {slug}")]
    Content {
        /// The script.
        slug: String,
        /// The cause.
        #[source]
        err: EnrollError,
    },
    /// The plan could not be fetched.
    #[error("fetching the {} plan", mode.as_str())]
    Plan {
        /// Which plan.
        mode: ScriptMode,
        /// The cause.
        #[source]
        err: EnrollError,
    },
    /// The plan is not a plan.
    #[error("reading the {} plan", mode.as_str())]
    PlanJson {
        /// Which plan.
        mode: ScriptMode,
        /// The cause.
        #[source]
        err: serde_json::Error,
    },
    /// The results, or a boot phase, could not be sent.
    #[error("reporting the run ({outcome:?})")]
    Report {
        /// How the run ended.
        outcome: RunOutcome,
        /// The cause.
        #[source]
        err: EnrollError,
    },
}

/// `GET` the plan for `mode` (and, for image-gen, `image`).
pub fn fetch_plan(
    control: &Control,
    mode: ScriptMode,
    image: Option<&str>,
) -> Result<ScriptPlan, RunError> {
    let body = control
        .get_bytes(&plan_path(mode, image), "fetching the script plan")
        .map_err(|err| RunError::Plan { mode, err })?;
    parse_plan(&body).map_err(|err| RunError::PlanJson { mode, err })
}

/// A plan from the control service's JSON.
pub fn parse_plan(body: &[u8]) -> Result<ScriptPlan, serde_json::Error> {
    serde_json::from_slice(body)
}

/// Runs `plan`: refuses it before fetching anything when its order cannot
/// be met, fetches each script's content, reports the `scripts` phase
/// (post-boot), runs them, posts the [`RunReport`] and, when every
/// post-boot script succeeded, reports `ready`. `log` gets each step.
pub fn run(
    control: &Control,
    plan: &ScriptPlan,
    options: &exec::Options,
    cancel: &AtomicBool,
    log: &(dyn Fn(&str) + Sync),
) -> Result<RunReport, RunError> {
    let post_boot = plan.mode == ScriptMode::PostBoot;
    let report = match plan::plan(plan) {
        Err(refusal) => exec::refused(plan, refusal.to_string()),
        Ok(layers) if layers.scripts().any(|s| !exec::is_file_name(&s.slug)) => {
            // Refused before any request: a slug is also a URL path segment.
            let bad: Vec<String> = layers
                .scripts()
                .filter(|s| !exec::is_file_name(&s.slug))
                .map(|s| format!("{:?}", s.slug))
                .collect();
            exec::refused(
                plan,
                format!(
                    "refused before anything ran: scripts {} have slugs that are not plain names",
                    bad.join(", ")
                ),
            )
        }
        Ok(layers) => {
            let mut contents = BTreeMap::new();
            for script in layers.scripts() {
                let bytes = control
                    .get_bytes(&content_path(&script.slug), "fetching a script")
                    .map_err(|err| RunError::Content {
                        slug: script.slug.clone(),
                        err,
                    })?;
                contents.insert(script.slug.clone(), bytes);
            }
            match exec::check(plan, &contents) {
                Err(problems) => exec::refused(
                    plan,
                    format!("refused before anything ran: {}", problems.join("; ")),
                ),
                Ok(layers) => {
                    if post_boot {
                        let slugs: Vec<&str> = layers.scripts().map(|s| s.slug.as_str()).collect();
                        let mut detail = if slugs.is_empty() {
                            "no post-boot scripts".to_owned()
                        } else {
                            format!("running {}", slugs.join(", "))
                        };
                        for warning in &layers.warnings {
                            detail.push_str(&format!("; warning: {warning}"));
                        }
                        log(&detail);
                        control.report(BootPhase::Scripts, &detail).map_err(|err| {
                            RunError::Report {
                                outcome: RunOutcome::Success,
                                err,
                            }
                        })?;
                    }
                    let observe = |event: &exec::Event<'_>| match event {
                        exec::Event::Layer { n, slugs } => {
                            log(&format!("layer {n}: {}", slugs.join(", ")));
                        }
                        exec::Event::Ended(result) => log(&format!(
                            "{}: {:?} (exit {:?}, {} ms)",
                            result.slug, result.status, result.exit_code, result.duration_ms
                        )),
                        exec::Event::Warning(warning) => log(&format!("warning: {warning}")),
                    };
                    exec::execute(plan, &contents, options, cancel, &observe)?
                }
            }
        }
    };
    log(&format!("{:?}: {}", report.outcome, report.detail));
    let outcome = report.outcome;
    control
        .post_json(RESULTS_PATH, &report, "posting the scripts' results")
        .map_err(|err| RunError::Report { outcome, err })?;
    if post_boot && outcome == RunOutcome::Success {
        control
            .report(
                BootPhase::Ready,
                &format!("post-boot scripts: {}", report.detail),
            )
            .map_err(|err| RunError::Report { outcome, err })?;
    }
    Ok(report)
}
