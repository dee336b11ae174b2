//! Scripts for the script-runner: what a node (post-boot) or a job server
//! building an image (image-gen) runs, the scripts' content, and what their
//! runs reported. The HTTP endpoints over it are in `crate::http::scripts`;
//! who may ask for what is decided by [`crate::access`] (`plan_scope`,
//! `content_scope`, `results_from`).
//!
//! - **The plan** ([`ScriptPlan`]) is gathered, never ordered: the scripts of
//!   the mode from the layers of the effective configuration
//!   ([`crate::effective`], the one layering rule: distro, groups, image,
//!   system, less `disable_scripts` of every layer), in layer order, each
//!   with its version, the SHA-256 of its content, the slugs it depends on,
//!   its timeout and the layer that listed it. The runner orders them by
//!   their dependencies and refuses a plan that cannot be met. An image's
//!   image-gen plan has the distro and image layers only: no node is
//!   involved, so there are no groups and no system.
//! - **The params** a script gets are the effective `config_params`: the
//!   layers of its own node only. They hold no secret: the install's
//!   secrets (BMC credentials, passwords, API keys) are fields of their own
//!   kinds, write-only, never part of a layer.
//! - **Content** is served as stored; a node gets only the scripts of its
//!   own current plan ([`in_plan`]).
//! - **Results** from a node become its boot timeline ([`timeline`]): one
//!   `script` event per script, and `failed` when the run failed or was
//!   refused. An image-gen run from a job server is stored in `script_runs`
//!   and shows on no node's timeline.
//! - **Who runs it** ([`runners`]): the systems that list a script through
//!   any layer (their own, a group's, their image's or its distro's), a
//!   page at a time by system id, each with whether its effective
//!   configuration keeps the script (the same [`NodeView::effective`] its
//!   plan is built from) or a `disable_scripts` switches it off. Each
//!   system's view costs its fixed statements, so a page is capped at
//!   [`RUNNERS_PAGE`] systems and the total is a count.
//! - **Run again**: [`request_run`] bumps a system's `run_request`, which the
//!   plan carries; the node's agent runs again when it sees a value above
//!   the one it last ran.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use mprov_api::boot::BootPhase;
use mprov_api::scripts::{
    MAX_OUTPUT_TAIL, PlannedScript, RunOutcome, RunReport, ScriptMode, ScriptPlan, ScriptResult,
    ScriptStatus,
};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use sqlx::Row as _;

use crate::boot::MAX_DETAIL;
use crate::db::crud::StoreError;
use crate::db::{Db, Val, int, kinds, opt_int};
use crate::effective::{EffectiveConfig, EffectiveError, Layers};
use crate::netboot::view::{self, Lookup, NodeKey, NodeView};
use crate::time::format_ts;

/// The most scripts one run report may list.
pub const MAX_RESULTS: usize = 1000;
/// The largest run report body accepted: every script's output tail at its
/// limit, for a few hundred scripts.
pub const MAX_REPORT_BYTES: usize = 8 << 20;

/// Why a plan, a script's content or a report could not be served or kept.
#[derive(Debug, thiserror::Error)]
pub enum ScriptsError {
    /// The database failed.
    #[error("scripts database")]
    Db(#[from] sqlx::Error),
    /// The layers do not combine (a layer's `config_params` is invalid).
    #[error(transparent)]
    Effective(#[from] EffectiveError),
    /// No image has this slug (or id).
    #[error("no image {0}")]
    NoImage(String),
    /// No script has this slug.
    #[error("no script {0}")]
    NoScript(String),
    /// No system has this host name (or id).
    #[error("no system {0}")]
    NoSystem(String),
    /// A node asked for a script that is not in its own plan.
    #[error("script {slug} is not among the post-boot scripts of {host}")]
    NotInPlan {
        /// The node's host name.
        host: String,
        /// The script asked for.
        slug: String,
    },
    /// A report that cannot be right (too many scripts, a tail too long,
    /// an image-gen report without its image).
    #[error("{field}: {message}")]
    Report {
        /// The field at fault.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A generic read failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One script row, as a plan lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptRow {
    /// Its slug.
    pub slug: String,
    /// `image-gen` or `post-boot`.
    pub script_type: String,
    /// Its content version.
    pub version: i64,
    /// The hex SHA-256 of its content.
    pub sha256: String,
    /// Its timeout, if it sets one.
    pub timeout_seconds: Option<i64>,
    /// The slugs of the scripts it depends on, sorted.
    pub depends_on: Vec<String>,
}

/// Who a plan is for, besides its scripts and params.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlanFor {
    /// The node's host name (post-boot).
    pub host: Option<String>,
    /// The image's slug.
    pub image: Option<String>,
    /// The node's groups, by slug (post-boot).
    pub groups: Vec<String>,
    /// The system's run request (post-boot).
    pub run_request: i64,
}

/// The hex SHA-256 of a script's content, as the plan lists it and the
/// runner checks it.
pub fn content_sha256(content: &str) -> String {
    hex::encode(Sha256::digest(content.as_bytes()))
}

/// The plan of `mode` from an effective configuration and the rows of its
/// scripts (by id), with the disabled slugs that name no script of any
/// layer (to warn about). Pure.
pub fn plan(
    mode: ScriptMode,
    effective: &EffectiveConfig,
    rows: &HashMap<i64, ScriptRow>,
    all_slugs: &HashSet<String>,
    who: PlanFor,
) -> (ScriptPlan, Vec<String>) {
    let scripts = effective
        .scripts
        .iter()
        .filter_map(|s| {
            let row = rows.get(&s.id)?;
            (row.script_type == mode.as_str()).then(|| PlannedScript {
                slug: row.slug.clone(),
                version: row.version,
                sha256: row.sha256.clone(),
                depends_on: row.depends_on.clone(),
                timeout_seconds: row.timeout_seconds.and_then(|t| u64::try_from(t).ok()),
                layer: s.layer.clone(),
            })
        })
        .collect();
    let unknown = effective
        .disable_scripts
        .iter()
        .filter(|slug| !all_slugs.contains(*slug))
        .cloned()
        .collect();
    let plan = ScriptPlan {
        mode,
        host: who.host,
        image: who.image,
        groups: who.groups,
        params: effective.config_params.clone(),
        scripts,
        disabled: effective.disable_scripts.clone(),
        run_request: who.run_request,
    };
    (plan, unknown)
}

/// Loads the rows of the scripts `ids`, with the slugs of their
/// dependencies, in two statements.
pub async fn script_rows(db: &Db, ids: &[i64]) -> Result<HashMap<i64, ScriptRow>, sqlx::Error> {
    let mut out = HashMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    for chunk in ids.chunks(crate::db::MAX_BINDS) {
        let mut q = db.sql();
        q.push("SELECT id, slug, script_type, version, content, timeout_seconds FROM scripts WHERE id IN ")
            .bind_list(chunk.iter().map(|id| Val::Int(Some(*id))));
        for r in db.fetch_all(&q).await? {
            let content: Option<String> = r.try_get("content")?;
            out.insert(
                int(&r, "id")?,
                ScriptRow {
                    slug: r.try_get::<Option<String>, _>("slug")?.unwrap_or_default(),
                    script_type: r
                        .try_get::<Option<String>, _>("script_type")?
                        .unwrap_or_default(),
                    version: int(&r, "version")?,
                    sha256: content_sha256(content.as_deref().unwrap_or_default()),
                    timeout_seconds: opt_int(&r, "timeout_seconds")?,
                    depends_on: Vec::new(),
                },
            );
        }
        let mut q = db.sql();
        q.push("SELECT d.script_id, s.slug FROM script_deps d JOIN scripts s ON s.id = d.dep_id WHERE d.script_id IN ")
            .bind_list(chunk.iter().map(|id| Val::Int(Some(*id))))
            .push(" ORDER BY d.script_id, s.slug");
        for r in db.fetch_all(&q).await? {
            if let Some(row) = out.get_mut(&int(&r, "script_id")?) {
                row.depends_on
                    .push(r.try_get::<Option<String>, _>("slug")?.unwrap_or_default());
            }
        }
    }
    Ok(out)
}

/// Every script's slug (to tell a disabled slug that names nothing).
async fn all_slugs(db: &Db) -> Result<HashSet<String>, sqlx::Error> {
    let mut q = db.sql();
    q.push("SELECT slug FROM scripts");
    db.fetch_all(&q)
        .await?
        .iter()
        .map(|r| Ok(r.try_get::<Option<String>, _>("slug")?.unwrap_or_default()))
        .collect()
}

/// Builds the plan of `mode` from an effective configuration: loads its
/// scripts' rows, and warns about disabled slugs that name no script.
async fn plan_of(
    db: &Db,
    mode: ScriptMode,
    effective: &EffectiveConfig,
    who: PlanFor,
) -> Result<ScriptPlan, ScriptsError> {
    let ids: Vec<i64> = effective.scripts.iter().map(|s| s.id).collect();
    let rows = script_rows(db, &ids).await?;
    let slugs = if effective.disable_scripts.is_empty() {
        HashSet::new()
    } else {
        all_slugs(db).await?
    };
    let (plan, unknown) = plan(mode, effective, &rows, &slugs, who);
    if !unknown.is_empty() {
        tracing::warn!(
            host = plan.host.as_deref().unwrap_or("-"),
            image = plan.image.as_deref().unwrap_or("-"),
            "scripts: disable_scripts names no script: {}",
            unknown.join(", ")
        );
    }
    Ok(plan)
}

/// The post-boot plan of the system `key` names (a host name, or for an
/// administrator also an id).
pub async fn node_plan(db: &Db, key: NodeKey<'_>) -> Result<ScriptPlan, ScriptsError> {
    let view = load_node(db, key).await?;
    let effective = view.effective()?;
    let who = PlanFor {
        host: Some(view.hostname.clone()),
        image: view.image.as_ref().map(|i| i.slug.clone()),
        groups: sorted_groups(&view),
        run_request: view.run_request,
    };
    plan_of(db, ScriptMode::PostBoot, &effective, who).await
}

/// The node's groups by slug, in the order their layers apply.
fn sorted_groups(view: &NodeView) -> Vec<String> {
    let mut groups: Vec<(i64, &str)> = view
        .layers
        .groups
        .iter()
        .map(|g| (g.priority, g.name.as_str()))
        .collect();
    groups.sort();
    groups.into_iter().map(|(_, g)| g.to_owned()).collect()
}

async fn load_node(db: &Db, key: NodeKey<'_>) -> Result<Box<NodeView>, ScriptsError> {
    let named = match key {
        NodeKey::Host(h) | NodeKey::System(h) | NodeKey::Mac(h) => h.to_owned(),
    };
    match view::load(db, key)
        .await
        .map_err(|view::ViewError::Db(e)| e)?
    {
        Lookup::Known(view) => Ok(view),
        Lookup::Unknown => Err(ScriptsError::NoSystem(named)),
    }
}

/// The image-gen plan of the image `key` (slug or id): its distro's and its
/// own layers.
pub async fn image_plan(db: &Db, key: &str) -> Result<ScriptPlan, ScriptsError> {
    let kind = |name| {
        kinds::kind(name).ok_or_else(|| ScriptsError::Db(sqlx::Error::Protocol(name.into())))
    };
    let image = match db.get(kind("images")?, key).await {
        Ok(image) => image,
        Err(StoreError::NotFound { .. }) => return Err(ScriptsError::NoImage(key.to_owned())),
        Err(e) => return Err(e.into()),
    };
    let distro = match image.get("distro").and_then(Value::as_i64) {
        Some(id) => Some(db.get(kind("distros")?, &id.to_string()).await?),
        None => None,
    };
    let mut ids: Vec<i64> = Vec::new();
    for layer in [distro.as_ref(), Some(&image)].into_iter().flatten() {
        ids.extend(
            layer
                .get("scripts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_i64),
        );
    }
    let rows = script_rows(db, &ids).await?;
    let slugs: HashMap<i64, String> = rows.iter().map(|(id, r)| (*id, r.slug.clone())).collect();
    // No node: a system layer that sets nothing.
    let no_system = Map::new();
    let effective = crate::effective::effective(
        &Layers {
            distro: distro.as_ref(),
            groups: Vec::new(),
            image: Some(&image),
            system: &no_system,
        },
        &slugs,
    )?;
    let who = PlanFor {
        image: image.get("slug").and_then(Value::as_str).map(str::to_owned),
        ..PlanFor::default()
    };
    plan_of(db, ScriptMode::ImageGen, &effective, who).await
}

/// Whether `slug` is among the scripts of `plan`.
pub fn in_plan(plan: &ScriptPlan, slug: &str) -> bool {
    plan.scripts.iter().any(|s| s.slug == slug)
}

/// A script's content, by slug.
pub async fn content(db: &Db, slug: &str) -> Result<String, ScriptsError> {
    let row = db
        .row_where("SELECT content FROM scripts WHERE slug = ", slug)
        .await?
        .ok_or_else(|| ScriptsError::NoScript(slug.to_owned()))?;
    Ok(row
        .try_get::<Option<String>, _>("content")?
        .unwrap_or_default())
}

/// Checks a report before anything is written: its size, and for image-gen
/// its image. Pure.
pub fn check_report(report: &RunReport) -> Result<(), ScriptsError> {
    let bad = |field, message: String| Err(ScriptsError::Report { field, message });
    if report.results.len() > MAX_RESULTS {
        return bad(
            "results",
            format!(
                "at most {MAX_RESULTS} scripts; got {}",
                report.results.len()
            ),
        );
    }
    if let Some(r) = report.results.iter().find(|r| r.slug.is_empty()) {
        return bad("results.slug", format!("a script without a slug ({r:?})"));
    }
    if let Some(r) = report
        .results
        .iter()
        .find(|r| r.output_tail.len() > MAX_OUTPUT_TAIL)
    {
        return bad(
            "results.output_tail",
            format!(
                "{}'s output tail is {} bytes; send at most the last {MAX_OUTPUT_TAIL}",
                r.slug,
                r.output_tail.len()
            ),
        );
    }
    if report.detail.len() > MAX_OUTPUT_TAIL {
        return bad(
            "detail",
            format!(
                "at most {MAX_OUTPUT_TAIL} bytes; got {}",
                report.detail.len()
            ),
        );
    }
    match (report.mode, &report.image) {
        (ScriptMode::ImageGen, None) => {
            bad("image", "an image-gen report names its image".to_owned())
        }
        (ScriptMode::PostBoot, Some(_)) => bad(
            "image",
            "a post-boot report names no image: the node's certificate says whose it is".to_owned(),
        ),
        _ => Ok(()),
    }
}

/// The boot events a node's run report becomes, in order: one `script`
/// event per script, then `failed` when the run failed or was refused.
/// Every detail fits [`MAX_DETAIL`]: a script's output keeps its tail.
/// Pure.
pub fn timeline(report: &RunReport) -> Vec<(BootPhase, String)> {
    let mut out: Vec<(BootPhase, String)> = report
        .results
        .iter()
        .map(|r| (BootPhase::Script, script_detail(r)))
        .collect();
    if matches!(report.outcome, RunOutcome::Failed | RunOutcome::Refused) {
        let culprits: Vec<&str> = report
            .results
            .iter()
            .filter(|r| matches!(r.status, ScriptStatus::Failed | ScriptStatus::TimedOut))
            .map(|r| r.slug.as_str())
            .collect();
        let mut detail = match report.outcome {
            RunOutcome::Refused => "post-boot scripts refused before any ran".to_owned(),
            _ => "post-boot scripts failed".to_owned(),
        };
        if !culprits.is_empty() {
            let _ = write!(detail, " ({})", culprits.join(", "));
        }
        if !report.detail.is_empty() {
            let _ = write!(detail, ": {}", report.detail);
        }
        out.push((BootPhase::Failed, head(&detail, MAX_DETAIL)));
    }
    out
}

/// One script's event detail: `<slug>: <status>, exit <code>, <duration>`,
/// then as much of the end of its output as fits.
fn script_detail(r: &ScriptResult) -> String {
    let status = match r.status {
        ScriptStatus::Success => "success",
        ScriptStatus::Failed => "failed",
        ScriptStatus::TimedOut => "timed out",
        ScriptStatus::NotRun => "not run",
    };
    let mut line = format!("{}: {status}", r.slug);
    match r.exit_code {
        Some(code) => {
            let _ = write!(line, ", exit {code}");
        }
        None if matches!(r.status, ScriptStatus::Failed | ScriptStatus::TimedOut) => {
            line.push_str(", killed");
        }
        None => {}
    }
    if r.status != ScriptStatus::NotRun {
        let _ = write!(line, ", {:.1} s", r.duration_ms as f64 / 1000.0);
    }
    let line = head(&line, MAX_DETAIL / 4);
    if r.output_tail.is_empty() {
        return line;
    }
    let label = "; output tail:\n";
    let room = MAX_DETAIL.saturating_sub(line.len() + label.len());
    format!("{line}{label}{}", tail(&r.output_tail, room))
}

/// The first `max` bytes of `s`, cut at a character boundary.
fn head(s: &str, max: usize) -> String {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// The last `max` bytes of `s`, cut at a character boundary.
fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Stores a job server's image-gen run report (`source`: `jobserver:<name>`)
/// in `script_runs`; its id. Nothing goes on a node's timeline.
pub async fn store_image_run(
    db: &Db,
    source: &str,
    report: &RunReport,
) -> Result<i64, ScriptsError> {
    let image = report.image.clone().unwrap_or_default();
    let image_id = match db
        .row_where("SELECT id FROM system_images WHERE slug = ", &image)
        .await?
    {
        Some(r) => int(&r, "id")?,
        None => return Err(ScriptsError::NoImage(image)),
    };
    let results = serde_json::to_string(&report.results)
        .map_err(|e| sqlx::Error::Protocol(format!("encoding the results: {e}")))?;
    let outcome = serde_json::to_value(report.outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut ins = db.sql();
    ins.push(
        "INSERT INTO script_runs (image_id, image, source, outcome, detail, results, at) VALUES ",
    )
    .bind_list([
        Val::Int(Some(image_id)),
        Val::Text(Some(image)),
        Val::Text(Some(source.to_owned())),
        Val::Text(Some(outcome)),
        Val::Text(Some(report.detail.clone())),
        Val::Text(Some(results)),
        Val::Text(Some(format_ts(jiff::Timestamp::now()))),
    ]);
    ins.query().execute(db.pool()).await?;
    let mut q = db.sql();
    q.push("SELECT MAX(id) AS id FROM script_runs WHERE image_id = ")
        .bind(Val::Int(Some(image_id)));
    let row = db.fetch_optional(&q).await?;
    Ok(row
        .map(|r| opt_int(&r, "id"))
        .transpose()?
        .flatten()
        .unwrap_or(0))
}

/// The image-gen runs stored for `image` (slug), newest first, at most
/// `limit`: `(source, outcome, detail, results)`.
pub async fn image_runs(
    db: &Db,
    image: &str,
    limit: i64,
) -> Result<Vec<(String, String, String, Vec<ScriptResult>)>, ScriptsError> {
    let mut q = db.sql();
    q.push("SELECT source, outcome, detail, results FROM script_runs WHERE image = ")
        .bind(Val::Text(Some(image.to_owned())))
        .push(" ORDER BY id DESC LIMIT ")
        .bind(Val::Int(Some(limit)));
    let text = |r: &sqlx::any::AnyRow, c: &str| -> Result<String, sqlx::Error> {
        Ok(r.try_get::<Option<String>, _>(c)?.unwrap_or_default())
    };
    let mut out = Vec::new();
    for r in db.fetch_all(&q).await? {
        let results = serde_json::from_str(&text(&r, "results")?).unwrap_or_default();
        out.push((
            text(&r, "source")?,
            text(&r, "outcome")?,
            text(&r, "detail")?,
            results,
        ));
    }
    Ok(out)
}

/// The start of the statement that asks systems to run their post-boot
/// scripts again: `UPDATE .. WHERE id`, to which the caller adds ` = ?` for
/// one system ([`request_run`]) or ` IN (..)` for many
/// ([`crate::bulk::apply`]).
pub fn run_request_bump(db: &Db) -> crate::db::Sql {
    let mut upd = db.sql();
    upd.push("UPDATE systems SET run_request = run_request + 1 WHERE id");
    upd
}

/// Bumps the run request of the system `key` (host name or id): its agent
/// runs its post-boot scripts again. The system's host name and the new
/// value.
pub async fn request_run(db: &Db, key: &str) -> Result<(String, i64), ScriptsError> {
    let Some((id, hostname)) = crate::boot::system_by_key(db, key)
        .await
        .map_err(|e| match e {
            crate::boot::BootError::Db(e) => e,
            other => sqlx::Error::Protocol(other.to_string()),
        })?
    else {
        return Err(ScriptsError::NoSystem(key.to_owned()));
    };
    // One statement, so concurrent requests each count.
    let mut upd = run_request_bump(db);
    upd.push(" = ").bind(Val::Int(Some(id)));
    upd.query().execute(db.pool()).await?;
    let mut q = db.sql();
    q.push("SELECT run_request FROM systems WHERE id = ")
        .bind(Val::Int(Some(id)));
    let row = db
        .fetch_optional(&q)
        .await?
        .ok_or_else(|| ScriptsError::NoSystem(key.to_owned()))?;
    Ok((hostname, int(&row, "run_request")?))
}

/// The most systems one page of [`runners`] examines.
pub const RUNNERS_PAGE: usize = 25;

/// Whether a system that lists a script runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runs {
    /// Its plan has the script, from this layer (`distro`, `group:<slug>`,
    /// `image` or `system`).
    Yes {
        /// The first layer that listed it.
        layer: String,
    },
    /// A layer lists it, and a `disable_scripts` of one switches it off.
    Disabled,
    /// Its layers do not combine (a layer's `config_params` is invalid):
    /// it gets no plan at all.
    Broken(String),
}

/// One system that lists a script through a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runner {
    /// The system's id.
    pub system_id: i64,
    /// Its host name.
    pub hostname: String,
    /// Whether it runs the script.
    pub runs: Runs,
}

/// A page of the systems that list a script ([`runners`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runners {
    /// The script's id.
    pub script_id: i64,
    /// Whether it is a post-boot script: only those run on nodes (an
    /// image-gen script runs on the job server that builds an image).
    pub post_boot: bool,
    /// How many systems list it through a layer, in all.
    pub listed: u64,
    /// This page of them, by system id.
    pub systems: Vec<Runner>,
    /// The id to continue after, when there are more.
    pub next: Option<i64>,
}

/// The systems that list the script `slug` through a layer, after system
/// id `after`, at most [`RUNNERS_PAGE`]: each with whether its post-boot
/// plan has the script, as its plan would be built.
pub async fn runners(db: &Db, slug: &str, after: Option<i64>) -> Result<Runners, ScriptsError> {
    let mut q = db.sql();
    q.push("SELECT id, script_type FROM scripts WHERE slug = ")
        .bind(Val::Text(Some(slug.to_owned())));
    if let Ok(id) = slug.parse::<i64>() {
        q.push(" OR id = ").bind(Val::Int(Some(id)));
    }
    let row = db
        .fetch_optional(&q)
        .await?
        .ok_or_else(|| ScriptsError::NoScript(slug.to_owned()))?;
    let script_id = int(&row, "id")?;
    let post_boot = row.try_get::<Option<String>, _>("script_type")?.as_deref()
        == Some(ScriptMode::PostBoot.as_str());
    // The systems that list it through a layer, whatever disables it.
    let listing = |q: &mut crate::db::Sql| {
        let id = || Val::Int(Some(script_id));
        q.push(" FROM systems s WHERE (s.id IN (SELECT system_id FROM system_scripts WHERE script_id = ")
            .bind(id())
            .push(") OR s.id IN (SELECT m.system_id FROM group_members m JOIN group_scripts gs ON gs.group_id = m.group_id WHERE gs.script_id = ")
            .bind(id())
            .push(") OR s.image_id IN (SELECT image_id FROM image_scripts WHERE script_id = ")
            .bind(id())
            .push(") OR s.image_id IN (SELECT i.id FROM system_images i JOIN distro_scripts ds ON ds.distro_id = i.distro_id WHERE ds.script_id = ")
            .bind(id())
            .push("))");
    };
    let mut count = db.sql();
    count.push("SELECT COUNT(*) AS n");
    listing(&mut count);
    let listed = match db.fetch_optional(&count).await? {
        Some(r) => u64::try_from(int(&r, "n")?).unwrap_or(0),
        None => 0,
    };
    let mut page = db.sql();
    page.push("SELECT s.id, s.hostname");
    listing(&mut page);
    if let Some(after) = after {
        page.push(" AND s.id > ").bind(Val::Int(Some(after)));
    }
    page.push(" ORDER BY s.id LIMIT ")
        .bind(Val::Int(Some(RUNNERS_PAGE as i64 + 1)));
    let rows = db.fetch_all(&page).await?;
    let more = rows.len() > RUNNERS_PAGE;
    let mut systems = Vec::new();
    for r in rows.iter().take(RUNNERS_PAGE) {
        let system_id = int(r, "id")?;
        let hostname = r
            .try_get::<Option<String>, _>("hostname")?
            .unwrap_or_default();
        let key = system_id.to_string();
        let runs = match load_node(db, NodeKey::System(&key)).await {
            Ok(view) => runs_of(&view, script_id),
            // Deleted meanwhile.
            Err(ScriptsError::NoSystem(_)) => continue,
            Err(e) => return Err(e),
        };
        systems.push(Runner {
            system_id,
            hostname,
            runs,
        });
    }
    let next = more.then(|| systems.last().map(|r| r.system_id)).flatten();
    Ok(Runners {
        script_id,
        post_boot,
        listed,
        systems,
        next,
    })
}

/// Whether the node of `view` runs the script `script_id`: what its
/// effective configuration keeps, the plan's own source. Pure.
pub fn runs_of(view: &NodeView, script_id: i64) -> Runs {
    match view.effective() {
        Ok(eff) => match eff.scripts.iter().find(|s| s.id == script_id) {
            Some(s) => Runs::Yes {
                layer: s.layer.clone(),
            },
            None => Runs::Disabled,
        },
        Err(e) => Runs::Broken(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effective::ScriptRef;

    fn row(slug: &str, ty: &str, deps: &[&str]) -> ScriptRow {
        ScriptRow {
            slug: slug.into(),
            script_type: ty.into(),
            version: 2,
            sha256: content_sha256(slug),
            timeout_seconds: (slug == "b").then_some(30),
            depends_on: deps.iter().map(|d| (*d).to_owned()).collect(),
        }
    }

    fn effective(scripts: &[(i64, &str, &str)], disabled: &[&str]) -> EffectiveConfig {
        EffectiveConfig {
            kernel_cmdline: String::new(),
            initial_mods: Vec::new(),
            tmpfs_root_size: 0,
            prov_interface: String::new(),
            config_params: serde_json::json!({"ntp": "pool", "disable_scripts": disabled}),
            disable_scripts: disabled.iter().map(|d| (*d).to_owned()).collect(),
            scripts: scripts
                .iter()
                .map(|(id, slug, layer)| ScriptRef {
                    id: *id,
                    slug: (*slug).into(),
                    layer: (*layer).into(),
                })
                .collect(),
            layers: Vec::new(),
        }
    }

    #[test]
    fn a_plan_keeps_its_modes_scripts_in_layer_order() {
        let rows: HashMap<i64, ScriptRow> = [
            (1, row("a", "post-boot", &[])),
            (2, row("g", "image-gen", &[])),
            (3, row("b", "post-boot", &["a", "gone"])),
        ]
        .into();
        let eff = effective(
            &[(3, "b", "group:gpu"), (2, "g", "image"), (1, "a", "system")],
            &["x", "a-disabled"],
        );
        let known: HashSet<String> = ["a", "b", "g", "a-disabled"].map(String::from).into();
        let who = PlanFor {
            host: Some("c01".into()),
            run_request: 4,
            ..PlanFor::default()
        };
        let (plan, unknown) = plan(ScriptMode::PostBoot, &eff, &rows, &known, who);
        let slugs: Vec<&str> = plan.scripts.iter().map(|s| s.slug.as_str()).collect();
        assert_eq!(slugs, ["b", "a"]);
        assert_eq!(plan.scripts[0].layer, "group:gpu");
        assert_eq!(plan.scripts[0].depends_on, ["a", "gone"]);
        assert_eq!(plan.scripts[0].timeout_seconds, Some(30));
        assert_eq!(plan.scripts[1].timeout_seconds, None);
        assert_eq!(plan.scripts[0].sha256, content_sha256("b"));
        assert_eq!(plan.disabled, ["x", "a-disabled"]);
        assert_eq!(plan.params["ntp"], "pool");
        assert_eq!(plan.run_request, 4);
        assert_eq!(unknown, ["x"], "a disabled slug naming nothing is warned");
        let (plan, _) = plan_again(&eff, &rows, &known);
        assert_eq!(plan.scripts.len(), 1);
        assert_eq!(plan.scripts[0].slug, "g");
    }

    fn plan_again(
        eff: &EffectiveConfig,
        rows: &HashMap<i64, ScriptRow>,
        known: &HashSet<String>,
    ) -> (ScriptPlan, Vec<String>) {
        plan(ScriptMode::ImageGen, eff, rows, known, PlanFor::default())
    }

    fn result(slug: &str, status: ScriptStatus, code: Option<i32>, out: &str) -> ScriptResult {
        ScriptResult {
            slug: slug.into(),
            status,
            exit_code: code,
            duration_ms: 1500,
            output_tail: out.into(),
        }
    }

    fn report(outcome: RunOutcome, results: Vec<ScriptResult>, detail: &str) -> RunReport {
        RunReport {
            mode: ScriptMode::PostBoot,
            image: None,
            run_request: 0,
            outcome,
            detail: detail.into(),
            results,
        }
    }

    #[test]
    fn a_report_becomes_script_events_and_failed_names_the_script() {
        let long = format!("{}THE END", "é".repeat(MAX_OUTPUT_TAIL / 2 - 4));
        let r = report(
            RunOutcome::Failed,
            vec![
                result("mount", ScriptStatus::Success, Some(0), "mounted\n"),
                result("join", ScriptStatus::Failed, Some(3), &long),
                result("tune", ScriptStatus::NotRun, None, ""),
            ],
            "join exited 3",
        );
        let events = timeline(&r);
        let phases: Vec<BootPhase> = events.iter().map(|(p, _)| *p).collect();
        assert_eq!(
            phases,
            [
                BootPhase::Script,
                BootPhase::Script,
                BootPhase::Script,
                BootPhase::Failed
            ]
        );
        assert_eq!(
            events[0].1,
            "mount: success, exit 0, 1.5 s; output tail:\nmounted\n"
        );
        assert!(
            events[1]
                .1
                .starts_with("join: failed, exit 3, 1.5 s; output tail:\n")
        );
        assert!(events[1].1.ends_with("THE END"), "the tail is kept");
        assert!(events[1].1.len() <= MAX_DETAIL);
        assert_eq!(events[2].1, "tune: not run");
        assert_eq!(
            events[3].1,
            "post-boot scripts failed (join): join exited 3"
        );
        for (_, d) in &events {
            assert!(d.len() <= MAX_DETAIL);
        }

        let refused = report(
            RunOutcome::Refused,
            vec![result("a", ScriptStatus::NotRun, None, "")],
            "a depends on b, which is disabled",
        );
        let events = timeline(&refused);
        assert_eq!(
            events.last().unwrap(),
            &(
                BootPhase::Failed,
                "post-boot scripts refused before any ran: a depends on b, which is disabled"
                    .to_owned()
            )
        );
        let fine = report(
            RunOutcome::Success,
            vec![result("a", ScriptStatus::TimedOut, None, "")],
            "",
        );
        let events = timeline(&fine);
        assert_eq!(
            events,
            [(BootPhase::Script, "a: timed out, killed, 1.5 s".to_owned())]
        );
    }

    #[test]
    fn reports_out_of_bounds_are_refused() {
        let ok = report(RunOutcome::Success, vec![], "");
        assert!(check_report(&ok).is_ok());
        let too_long = report(
            RunOutcome::Success,
            vec![result(
                "a",
                ScriptStatus::Success,
                Some(0),
                &"x".repeat(MAX_OUTPUT_TAIL + 1),
            )],
            "",
        );
        assert!(matches!(
            check_report(&too_long),
            Err(ScriptsError::Report {
                field: "results.output_tail",
                ..
            })
        ));
        let many = report(
            RunOutcome::Success,
            vec![result("a", ScriptStatus::Success, Some(0), ""); MAX_RESULTS + 1],
            "",
        );
        assert!(check_report(&many).is_err());
        let nameless = report(
            RunOutcome::Success,
            vec![result("", ScriptStatus::Success, Some(0), "")],
            "",
        );
        assert!(check_report(&nameless).is_err());
        let mut image_gen = report(RunOutcome::Success, vec![], "");
        image_gen.mode = ScriptMode::ImageGen;
        assert!(matches!(
            check_report(&image_gen),
            Err(ScriptsError::Report { field: "image", .. })
        ));
        image_gen.image = Some("compute".into());
        assert!(check_report(&image_gen).is_ok());
        let mut post_boot_with_image = report(RunOutcome::Success, vec![], "");
        post_boot_with_image.image = Some("compute".into());
        assert!(check_report(&post_boot_with_image).is_err());
    }
}
