//! What the pages of an image, a script and a job show beneath their
//! inventory form (the inventory page renders it through [`section`]; the
//! buttons are `super::details`'s):
//!
//! - **An image**: its versions, newest first, each with its recorded
//!   rootfs checksum, the image-update jobs that built it, and for the
//!   current version the job servers that host it ([`jobs::image_builds`]),
//!   and a Rebuild button.
//! - **A script**: its dependencies, and who runs it: the systems that list
//!   it through a layer, a page at a time, each with whether its effective
//!   configuration keeps it ([`scripts::runners`], the plan's own rule).
//! - **A job**: its state, where and when it ran, its output, and a Retry
//!   button for a failed job.
//!
//! Read-only rendering shared by the pages' handlers, so the layering
//! check counts it with the folder's plumbing.

use askama::Template;
use serde_json::Value;

use super::page::{Chrome, PageError};
use crate::db::crud::Obj;
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::{jobs, scripts};

/// The section a kind's page shows beneath its form, rendered; empty for
/// kinds without one. `query` is the page's query (a script's runners
/// page through `after`).
pub async fn section(
    st: &AppState,
    chrome: &Chrome,
    kind: &str,
    row: &Obj,
    query: &[(String, String)],
) -> Result<String, PageError> {
    let id = row.get("id").and_then(Value::as_i64).unwrap_or_default();
    let html = match kind {
        "images" => image_section(st, chrome, id, query).await?.render(),
        "scripts" => script_section(st, chrome, id, query).await?.render(),
        "jobs" => job_section(st, chrome, row, query).await?.render(),
        _ => return Ok(String::new()),
    };
    html.map_err(|e| PageError(ApiError::internal_in("rendering a page", e)))
}

fn flag(query: &[(String, String)], name: &str) -> bool {
    query.iter().any(|(k, _)| k == name)
}

// ---------------------------------------------------------------- images

struct BuildRow {
    href: String,
    id: i64,
    status: String,
    jobserver: String,
    ended: String,
    return_code: String,
}

struct VersionRow {
    version: i64,
    current: bool,
    sha256: String,
    size: String,
    jobs: Vec<BuildRow>,
    hosts: Vec<String>,
}

#[derive(Template)]
#[template(path = "admin/image_builds.html")]
struct ImageSection<'a> {
    chrome: &'a Chrome,
    id: i64,
    current: i64,
    needs_rebuild: bool,
    rebuilt: bool,
    versions: Vec<VersionRow>,
}

async fn image_section<'a>(
    st: &AppState,
    chrome: &'a Chrome,
    id: i64,
    query: &[(String, String)],
) -> Result<ImageSection<'a>, PageError> {
    let builds = jobs::image_builds(&st.db, &id.to_string()).await?;
    let versions = builds
        .versions
        .into_iter()
        .map(|v| VersionRow {
            version: v.version,
            current: v.version == builds.current,
            sha256: v.rootfs_sha256.unwrap_or_default(),
            size: v.rootfs_size.map(|s| s.to_string()).unwrap_or_default(),
            jobs: v
                .jobs
                .into_iter()
                .map(|j| BuildRow {
                    href: format!("/admin/jobs/{}/", j.id),
                    id: j.id,
                    status: j.status,
                    jobserver: j.jobserver.unwrap_or_default(),
                    ended: j.ended_at.map(|t| chrome.time(&t)).unwrap_or_default(),
                    return_code: j.return_code.map(|c| c.to_string()).unwrap_or_default(),
                })
                .collect(),
            hosts: v.hosts,
        })
        .collect();
    Ok(ImageSection {
        chrome,
        id,
        current: builds.current,
        needs_rebuild: builds.needs_rebuild,
        rebuilt: flag(query, "rebuilt"),
        versions,
    })
}

// ---------------------------------------------------------------- scripts

struct RunnerRow {
    href: String,
    hostname: String,
    /// `yes`, `disabled` or `broken`.
    state: &'static str,
    detail: String,
}

#[derive(Template)]
#[template(path = "admin/script_runners.html")]
struct ScriptSection {
    depends_on: Vec<(String, String)>,
    post_boot: bool,
    listed: u64,
    runners: Vec<RunnerRow>,
    next: String,
    first: String,
}

async fn script_section(
    st: &AppState,
    _chrome: &Chrome,
    id: i64,
    query: &[(String, String)],
) -> Result<ScriptSection, PageError> {
    let after = match query.iter().find(|(k, _)| k == "after") {
        Some((_, v)) => Some(v.trim().parse::<i64>().map_err(|_| {
            PageError::invalid("after", "a system id to continue after, such as 120")
        })?),
        None => None,
    };
    let rows = scripts::script_rows(&st.db, &[id]).await?;
    let depends_on = rows
        .get(&id)
        .map(|r| {
            r.depends_on
                .iter()
                .map(|slug| (format!("/admin/scripts/{slug}/"), slug.clone()))
                .collect()
        })
        .unwrap_or_default();
    let runners = scripts::runners(&st.db, &id.to_string(), after).await?;
    let rows = runners
        .systems
        .into_iter()
        .map(|r| {
            let (state, detail) = match r.runs {
                scripts::Runs::Yes { layer } => ("yes", format!("from {layer}")),
                scripts::Runs::Disabled => ("disabled", "switched off by disable_scripts".into()),
                scripts::Runs::Broken(why) => ("broken", why),
            };
            RunnerRow {
                href: format!("/admin/systems/{}/", r.system_id),
                hostname: r.hostname,
                state,
                detail,
            }
        })
        .collect();
    Ok(ScriptSection {
        depends_on,
        post_boot: runners.post_boot,
        listed: runners.listed,
        runners: rows,
        next: runners
            .next
            .map(|n| format!("/admin/scripts/{id}/?after={n}#runners"))
            .unwrap_or_default(),
        first: if after.is_some() {
            format!("/admin/scripts/{id}/#runners")
        } else {
            String::new()
        },
    })
}

// ---------------------------------------------------------------- jobs

#[derive(Template)]
#[template(path = "admin/job_status.html")]
struct JobSection<'a> {
    chrome: &'a Chrome,
    id: i64,
    status: String,
    jobserver: String,
    jobserver_href: String,
    started: String,
    ended: String,
    return_code: String,
    output: String,
    retryable: bool,
    retried: bool,
}

async fn job_section<'a>(
    st: &AppState,
    chrome: &'a Chrome,
    row: &Obj,
    query: &[(String, String)],
) -> Result<JobSection<'a>, PageError> {
    let text = |k: &str| {
        row.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let id = row.get("id").and_then(Value::as_i64).unwrap_or_default();
    let status = text("status");
    let (jobserver, jobserver_href) = match row.get("jobserver").and_then(Value::as_i64) {
        Some(js) => {
            let names = match crate::db::kinds::kind("jobservers") {
                Some(k) => st.db.names(k, &[js]).await?,
                None => Default::default(),
            };
            (
                names.get(&js).cloned().unwrap_or_else(|| js.to_string()),
                format!("/admin/jobservers/{js}/"),
            )
        }
        None => (String::new(), String::new()),
    };
    let time = |k: &str| {
        let t = text(k);
        if t.is_empty() { t } else { chrome.time(&t) }
    };
    Ok(JobSection {
        chrome,
        id,
        retryable: jobs::retry_refusal(id, &status).is_none(),
        status,
        jobserver,
        jobserver_href,
        started: time("started_at"),
        ended: time("ended_at"),
        return_code: row
            .get("return_code")
            .and_then(Value::as_i64)
            .map(|c| c.to_string())
            .unwrap_or_default(),
        output: text("output"),
        retried: flag(query, "retried"),
    })
}
