//! Scripts: what the script-runner runs (a node's post-boot scripts, or an
//! image's image-gen scripts on the job server that builds it) and what it
//! reports back.
//!
//! The exchange, with the caller's own certificate:
//! 1. `GET` [`plan_path`]: the [`ScriptPlan`]. A node gets its own system's
//!    post-boot plan (it names no system: its certificate does); a job server
//!    asks for an image's image-gen plan.
//! 2. `GET` [`content_path`] for each script: its bytes, which the runner
//!    checks against the plan's `sha256` before running anything. A node may
//!    fetch only the scripts of its own plan.
//! 3. `POST` [`RESULTS_PATH`] a [`RunReport`]: each script's status, exit code,
//!    duration and output tail. For a node, the control service writes them on
//!    its boot timeline ([`crate::boot::BootPhase::Script`] per script, and
//!    `failed` when the run failed or was refused).
//!
//! The runner decides the order (dependency layers) and refuses a plan whose
//! dependencies cannot be met; the control service only gathers.

use serde::{Deserialize, Serialize};

/// `GET` the plan: `?mode=post-boot` (a node, for itself) or
/// `?mode=image-gen&image=<slug>` (a job server).
pub const PLAN_PATH: &str = "/api/v1/scripts/plan";
/// The route of a script's content (axum syntax): `GET`, raw bytes.
pub const CONTENT_ROUTE: &str = "/api/v1/scripts/{slug}/content";
/// `POST` a [`RunReport`].
pub const RESULTS_PATH: &str = "/api/v1/scripts/results";
/// The route that asks a node to run its post-boot scripts again (axum
/// syntax): `POST`, admin only; it bumps the system's
/// [`ScriptPlan::run_request`].
pub const RUN_ROUTE: &str = "/api/v1/systems/{key}/run-scripts";

/// The most output kept per script: the tail, in bytes.
pub const MAX_OUTPUT_TAIL: usize = 16 * 1024;
/// A script's timeout when the script sets none.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 600;

/// When scripts run (the scripts kind's `script_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScriptMode {
    /// Inside an image's root while the image is built.
    ImageGen,
    /// On the booted node.
    PostBoot,
}

impl ScriptMode {
    /// The wire name, as in `script_type`: `image-gen` or `post-boot`.
    pub fn as_str(self) -> &'static str {
        match self {
            ScriptMode::ImageGen => "image-gen",
            ScriptMode::PostBoot => "post-boot",
        }
    }
}

/// The path of the plan for `mode` (and, for image-gen, the image's slug).
pub fn plan_path(mode: ScriptMode, image: Option<&str>) -> String {
    match image {
        Some(image) => format!("{PLAN_PATH}?mode={}&image={image}", mode.as_str()),
        None => format!("{PLAN_PATH}?mode={}", mode.as_str()),
    }
}

/// The path of one script's content.
pub fn content_path(slug: &str) -> String {
    CONTENT_ROUTE.replace("{slug}", slug)
}

/// The path that queues a new post-boot run on the system `key`.
pub fn run_path(key: &str) -> String {
    RUN_ROUTE.replace("{key}", key)
}

/// What to run, gathered by the control service from every layer (distro,
/// groups, image, system) of the effective configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptPlan {
    /// Which scripts these are.
    pub mode: ScriptMode,
    /// The node's host name (post-boot).
    #[serde(default)]
    pub host: Option<String>,
    /// The image's slug.
    #[serde(default)]
    pub image: Option<String>,
    /// The node's groups, by name (post-boot).
    #[serde(default)]
    pub groups: Vec<String>,
    /// The effective config params (the JSON object each script gets on its
    /// standard input and in the file named by `MPROV_PARAMS`), without
    /// secrets.
    #[serde(default)]
    pub params: serde_json::Value,
    /// The scripts of this mode from every layer, in layer order, without
    /// the disabled ones.
    pub scripts: Vec<PlannedScript>,
    /// `disable_scripts` from every layer, combined (slugs).
    #[serde(default)]
    pub disabled: Vec<String>,
    /// Bumped by each run-scripts request; a node's agent runs again when it
    /// sees a value above the one it last ran.
    #[serde(default)]
    pub run_request: i64,
}

/// One script of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedScript {
    /// The script's slug (unique).
    pub slug: String,
    /// Its content version.
    pub version: i64,
    /// The hex sha256 of its content, which the runner checks.
    pub sha256: String,
    /// Slugs of the scripts that must run before it.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// Its timeout; `None`: [`DEFAULT_TIMEOUT_SECONDS`].
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// The layer that listed it: `distro`, `group:<name>`, `image` or `system`.
    #[serde(default)]
    pub layer: String,
}

/// The answer to a run-scripts request ([`RUN_ROUTE`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequested {
    /// The system's host name.
    pub system: String,
    /// Its new [`ScriptPlan::run_request`].
    pub run_request: i64,
}

/// How one script ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScriptStatus {
    /// Exit status 0.
    Success,
    /// A non-zero exit status, or killed by a signal.
    Failed,
    /// Killed, with its process group, at its timeout.
    TimedOut,
    /// Not run: an earlier layer failed, or the run was refused.
    NotRun,
}

/// One script's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptResult {
    /// The script's slug.
    pub slug: String,
    /// How it ended.
    pub status: ScriptStatus,
    /// Its exit code, if it exited.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// How long it ran, in milliseconds.
    #[serde(default)]
    pub duration_ms: u64,
    /// The tail of its standard output and error, interleaved, at most
    /// [`MAX_OUTPUT_TAIL`] bytes.
    #[serde(default)]
    pub output_tail: String,
}

/// How a whole run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// Every script succeeded.
    Success,
    /// A script failed or timed out; later layers did not run.
    Failed,
    /// Nothing ran: the plan's dependencies cannot be met, or a script's
    /// content did not match its checksum.
    Refused,
}

/// `POST` [`RESULTS_PATH`]: a run's results.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunReport {
    /// Which scripts ran.
    pub mode: ScriptMode,
    /// The image (image-gen).
    #[serde(default)]
    pub image: Option<String>,
    /// The plan's `run_request` this run answers.
    #[serde(default)]
    pub run_request: i64,
    /// How it ended.
    pub outcome: RunOutcome,
    /// For a person: why it was refused or failed, naming the scripts.
    #[serde(default)]
    pub detail: String,
    /// Each script of the plan, in the order run (not-run ones last).
    pub results: Vec<ScriptResult>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_the_script_types() {
        for mode in [ScriptMode::ImageGen, ScriptMode::PostBoot] {
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{}\"", mode.as_str()));
        }
        assert_eq!(
            plan_path(ScriptMode::ImageGen, Some("compute")),
            "/api/v1/scripts/plan?mode=image-gen&image=compute"
        );
        assert_eq!(content_path("a-b"), "/api/v1/scripts/a-b/content");
        assert_eq!(run_path("n01"), "/api/v1/systems/n01/run-scripts");
    }
}
