//! The jobs queue: job servers claim jobs, publish and record the image
//! versions they host, and the sweeps of silent job servers. The HTTP
//! endpoints over it are in `crate::http::jobs`; who may call them is
//! [`crate::access::own_jobserver`] (a job server's own certificate).
//!
//! - **Claiming** ([`claim`]) is atomic on every engine: a conditional
//!   `UPDATE ... WHERE id = ? AND status = 'pending'` whose row count says
//!   who won, in a transaction that bumps the inventory revision first (which
//!   also serializes it with every other write). A loser takes the next
//!   candidate. The oldest pending job of the claimer's modules comes first;
//!   a job for one job server (`for_jobserver`) is taken only by it, and a
//!   job server takes only jobs of the modules it registered ([`claimable`]:
//!   naming another in its claim gets it nothing of that module).
//! - **Publishing** ([`record_hosting`]): the job server that built the
//!   image's current version sends its files; they are recorded (the rootfs
//!   checksum and size onto the image), the rebuild request is cleared, the
//!   builder becomes a host, and every other job server running
//!   `image-sync` on a network the image is used on gets a job to copy it
//!   ([`sync_targets`]: a network one of the image's systems boots on, by
//!   the rule that sends a node to a job server). A copy sends no files: it becomes
//!   a host only of a version whose files were recorded.
//! - **Sweeps** ([`sweep`]), with the time passed in: the running jobs of a
//!   job server silent for `JOBSERVER_FAIL_JOBS_AFTER_MINUTES` are failed
//!   with the reason; job servers silent for `JOBSERVER_DELETE_AFTER_DAYS`
//!   are deleted, with their certificates revoked.
//!
//! - **Retrying** ([`retry`]): an admin queues a failed job again (one the
//!   job server reported failed, or one a sweep failed because its job
//!   server fell silent: a timed-out job is a failed one). Any other job is
//!   refused (409) with its state: a pending or running job is still on its
//!   way, and a successful one is done.
//! - **An image's builds** ([`image_builds`]): its versions, each with the
//!   image-update jobs that built it, the recorded rootfs checksum, and for
//!   the current version the job servers that host it; what the admin
//!   pages show, in a fixed number of statements.
//!
//! A job's output is bounded by [`MAX_OUTPUT`] characters: a longer report
//! is refused (400) by the field's validation, so the job server sends the
//! tail of what it printed.

use std::collections::{HashMap, HashSet};

use mprov_api::jobs::{HostedFile, Hosting, Job, module};
use serde_json::{Map, Value};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use crate::config::JobServerSilence;
use crate::db::crud::{StoreError, parse_sha256};
use crate::db::{Db, Val, int, kinds, opt_int};
use crate::netboot::view::{JOBSERVER_COLUMNS, JOBSERVER_ORDER, jobservers_of};
use crate::netboot::{JobServer, node_network, serves_network};
use crate::time::format_ts;

pub use mprov_api::jobs::MAX_OUTPUT;

/// The file of a version whose checksum and size are the image's.
pub const ROOTFS: &str = "rootfs.tar.zst";
/// The most files one version may list.
pub const MAX_FILES: usize = 1000;
/// How many pending jobs one claim tries per look (each a conditional
/// update that a concurrent claimer may win first).
const CANDIDATES: i64 = 16;
/// How many looks one claim takes before it answers "nothing" (each look
/// found candidates that all went to others).
const LOOKS: usize = 8;

/// A job's states: waiting, taken, and the two ends.
pub mod status {
    /// Waiting for a job server.
    pub const PENDING: &str = "pending";
    /// Claimed and running.
    pub const RUNNING: &str = "running";
    /// Ended well.
    pub const SUCCESS: &str = "success";
    /// Ended badly.
    pub const FAILED: &str = "failed";
    /// The states a job ends in.
    pub const FINAL: &[&str] = &[SUCCESS, FAILED];
}

fn text(v: impl Into<String>) -> Val {
    Val::Text(Some(v.into()))
}

fn conflict(message: String) -> StoreError {
    StoreError::Conflict {
        field: None,
        message,
    }
}

fn invalid(field: &str, message: String) -> StoreError {
    StoreError::Invalid {
        field: Some(field.to_owned()),
        message: format!("{field}: {message}"),
    }
}

/// Bumps the inventory revision: the first statement of every write, as in
/// the generic writes (on SQLite it takes the write lock up front).
async fn bump_revision(conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE inventory_revision SET revision = revision + 1 WHERE id = 1")
        .execute(&mut *conn)
        .await
        .map(drop)
}

/// The id of the job server named `name`, if it is registered.
pub async fn jobserver_id(db: &Db, name: &str) -> Result<Option<i64>, sqlx::Error> {
    let row = db
        .row_where("SELECT id FROM jobservers WHERE name = ", name)
        .await?;
    row.map(|r| int(&r, "id")).transpose()
}

/// Inserts a pending job of `module` with `params`, for the job server
/// `for_jobserver` alone (`None`: any running the module), in `conn`'s
/// transaction.
pub async fn queue(
    db: &Db,
    conn: &mut AnyConnection,
    module: &str,
    params: &Value,
    for_jobserver: Option<i64>,
    now: &str,
) -> Result<(), sqlx::Error> {
    let mut insert = db.sql();
    insert.push(
        "INSERT INTO jobs (module, params, status, output, for_jobserver_id, created_at, updated_at) VALUES ",
    );
    insert.bind_list([
        text(module),
        text(params.to_string()),
        text(status::PENDING),
        text(""),
        Val::Int(for_jobserver),
        text(now),
        text(now),
    ]);
    insert.query().execute(&mut *conn).await.map(drop)
}

/// The modules a claim may take jobs of: those it names that the job
/// server registered (its row's `modules`), each once, in the order named.
/// A module named but not registered is left out, so a job server takes
/// only jobs of what it said it runs. Pure.
pub fn claimable<'a>(asked: &'a [String], registered: &[String]) -> Vec<&'a str> {
    let mut seen = HashSet::new();
    asked
        .iter()
        .map(|m| m.trim())
        .filter(|m| registered.iter().any(|r| r.trim() == *m) && seen.insert(*m))
        .collect()
}

/// The modules job server `jobserver` (row id) registered; none for a row
/// that lists none, or that no longer exists.
async fn registered_modules(db: &Db, jobserver: i64) -> Result<Vec<String>, sqlx::Error> {
    let mut sel = db.sql();
    sel.push("SELECT modules FROM jobservers WHERE id = ")
        .bind(Val::Int(Some(jobserver)));
    let Some(row) = db.fetch_optional(&sel).await? else {
        return Ok(Vec::new());
    };
    let modules: Option<String> = row.try_get("modules")?;
    Ok(modules
        .and_then(|m| serde_json::from_str(&m).ok())
        .unwrap_or_default())
}

/// Claims the oldest pending job of `modules` for the job server
/// `jobserver` (its row id), taking only jobs of the modules it registered
/// ([`claimable`]) and only jobs for anyone or for it: marks it running,
/// claimed by it, started `now`. `None` when there is none. Under
/// concurrent claims each job goes to exactly one claimer.
pub async fn claim(
    db: &Db,
    jobserver: i64,
    modules: &[String],
    now: jiff::Timestamp,
) -> Result<Option<Job>, StoreError> {
    let registered = registered_modules(db, jobserver).await?;
    let modules = claimable(modules, &registered);
    if modules.is_empty() {
        return Ok(None);
    }
    let now = format_ts(now);
    for _ in 0..LOOKS {
        let mut sel = db.sql();
        sel.push("SELECT id, module, params FROM jobs WHERE status = ")
            .bind(text(status::PENDING))
            .push(" AND module IN ");
        sel.bind_list(modules.iter().map(|m| text(*m)));
        sel.push(" AND (for_jobserver_id IS NULL OR for_jobserver_id = ")
            .bind(Val::Int(Some(jobserver)))
            .push(") ORDER BY id LIMIT ")
            .bind(Val::Int(Some(CANDIDATES)));
        let candidates = db.fetch_all(&sel).await?;
        if candidates.is_empty() {
            return Ok(None);
        }
        for row in &candidates {
            let id = int(row, "id")?;
            let mut tx = db.pool().begin().await?;
            bump_revision(&mut tx).await?;
            let mut upd = db.sql();
            upd.push("UPDATE jobs SET status = ")
                .bind(text(status::RUNNING))
                .push(", jobserver_id = ")
                .bind(Val::Int(Some(jobserver)))
                .push(", started_at = ")
                .bind(text(now.clone()))
                .push(", updated_at = ")
                .bind(text(now.clone()))
                .push(" WHERE id = ")
                .bind(Val::Int(Some(id)))
                .push(" AND status = ")
                .bind(text(status::PENDING));
            if upd.query().execute(&mut *tx).await?.rows_affected() == 1 {
                tx.commit().await?;
                return Ok(Some(job_of(row, id)?));
            }
            // Another claimer won it: nothing written, not even the revision.
            tx.rollback().await?;
        }
    }
    Ok(None)
}

fn job_of(row: &AnyRow, id: i64) -> Result<Job, sqlx::Error> {
    let params: Option<String> = row.try_get("params")?;
    Ok(Job {
        id,
        module: row.try_get("module")?,
        params: params
            .and_then(|p| serde_json::from_str(&p).ok())
            .unwrap_or(Value::Null),
    })
}

/// An image's id, slug and current version, found by id or slug.
async fn image(
    conn: &mut AnyConnection,
    db: &Db,
    key: &str,
) -> Result<(i64, String, i64), StoreError> {
    let mut sel = db.sql();
    sel.push("SELECT id, slug, version FROM system_images WHERE slug = ")
        .bind(text(key));
    if let Ok(id) = key.parse::<i64>() {
        sel.push(" OR id = ").bind(Val::Int(Some(id)));
    }
    let row = sel
        .query()
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| StoreError::NotFound {
            kind: "images",
            key: key.to_owned(),
        })?;
    Ok((
        int(&row, "id")?,
        row.try_get("slug")?,
        int(&row, "version")?,
    ))
}

/// Checks a version's file list: names that stay inside the version folder,
/// SHA-256 digests, each name once, a rootfs among them. The rootfs entry.
pub fn check_files(files: &[HostedFile]) -> Result<&HostedFile, StoreError> {
    if files.len() > MAX_FILES {
        return Err(invalid(
            "files",
            format!("at most {MAX_FILES} files; got {}", files.len()),
        ));
    }
    let mut seen = HashSet::new();
    for (i, f) in files.iter().enumerate() {
        let at = format!("files[{i}]");
        let name_ok = !f.name.is_empty()
            && f.name.len() <= 255
            && f.name != "."
            && f.name != ".."
            && !f.name.contains(['/', '\\', '\0']);
        if !name_ok {
            return Err(invalid(
                &format!("{at}.name"),
                format!("{:?} is not a file name inside the version folder", f.name),
            ));
        }
        if !seen.insert(f.name.as_str()) {
            return Err(invalid(
                &format!("{at}.name"),
                format!("{:?} is listed twice", f.name),
            ));
        }
        if f.sha256.is_empty() {
            return Err(invalid(
                &format!("{at}.sha256"),
                "a SHA-256 is required".into(),
            ));
        }
        parse_sha256(&f.sha256).map_err(|e| invalid(&format!("{at}.sha256"), e))?;
        if i64::try_from(f.size).is_err() {
            return Err(invalid(&format!("{at}.size"), "too large".into()));
        }
    }
    files.iter().find(|f| f.name == ROOTFS).ok_or_else(|| {
        invalid(
            "files",
            format!("no {ROOTFS}: the version's root file system must be among its files"),
        )
    })
}

/// Job server `jobserver` (row id) hosts `hosting.version` of an image:
/// refused (409) unless that is the image's current version. With files
/// (the builder): records them, sets the image's rootfs checksum and size,
/// clears its rebuild request, and queues an `image-sync` of it for every
/// other job server that runs that module on a network the image is used
/// on ([`sync_targets`]). Without (a copy): only for a
/// version whose files were recorded (else 409). Either way it becomes one
/// of the image's hosts. One transaction, bumping the revision.
pub async fn record_hosting(
    db: &Db,
    jobserver: i64,
    hosting: &Hosting,
    now: jiff::Timestamp,
) -> Result<(), StoreError> {
    let rootfs = hosting.files.as_deref().map(check_files).transpose()?;
    let now = format_ts(now);
    let mut tx = db.pool().begin().await?;
    bump_revision(&mut tx).await?;
    let (image_id, slug, current) = image(&mut tx, db, &hosting.image).await?;
    if hosting.version != current {
        return Err(conflict(format!(
            "image {slug} is at version {current}, not {}: only the current version is hosted",
            hosting.version
        )));
    }
    let mut count = db.sql();
    count
        .push("SELECT COUNT(*) AS n FROM image_files WHERE image_id = ")
        .bind(Val::Int(Some(image_id)))
        .push(" AND version = ")
        .bind(Val::Int(Some(current)));
    let recorded = int(&count.query().fetch_one(&mut *tx).await?, "n")? > 0;
    match (&hosting.files, rootfs) {
        (Some(files), Some(rootfs)) => {
            let mut del = db.sql();
            del.push("DELETE FROM image_files WHERE image_id = ")
                .bind(Val::Int(Some(image_id)))
                .push(" AND version = ")
                .bind(Val::Int(Some(current)));
            del.query().execute(&mut *tx).await?;
            for chunk in files.chunks(crate::db::MAX_BINDS / 5) {
                let mut ins = db.sql();
                ins.push("INSERT INTO image_files (image_id, version, name, size, sha256) VALUES ");
                for (i, f) in chunk.iter().enumerate() {
                    if i > 0 {
                        ins.push(", ");
                    }
                    ins.bind_list([
                        Val::Int(Some(image_id)),
                        Val::Int(Some(current)),
                        text(f.name.clone()),
                        Val::Int(Some(i64::try_from(f.size).unwrap_or(i64::MAX))),
                        text(f.sha256.to_ascii_lowercase()),
                    ]);
                }
                ins.query().execute(&mut *tx).await?;
            }
            let mut upd = db.sql();
            upd.push("UPDATE system_images SET rootfs_sha256 = ")
                .bind(text(rootfs.sha256.to_ascii_lowercase()))
                .push(", rootfs_size = ")
                .bind(Val::Int(Some(
                    i64::try_from(rootfs.size).unwrap_or(i64::MAX),
                )))
                .push(", needs_rebuild = ")
                .bind(Val::Bool(Some(false)))
                .push(", updated_at = ")
                .bind(text(now.clone()))
                .push(" WHERE id = ")
                .bind(Val::Int(Some(image_id)));
            upd.query().execute(&mut *tx).await?;
            // A version published again (a retried build) is not copied twice.
            if !recorded {
                queue_syncs(db, &mut tx, jobserver, (image_id, &slug), current, &now).await?;
            }
        }
        _ if !recorded => {
            return Err(conflict(format!(
                "no files are recorded for version {current} of image {slug}: the job server that built it publishes them first"
            )));
        }
        _ => {}
    }
    let mut has = db.sql();
    has.push("SELECT COUNT(*) AS n FROM image_hosts WHERE image_id = ")
        .bind(Val::Int(Some(image_id)))
        .push(" AND jobserver_id = ")
        .bind(Val::Int(Some(jobserver)));
    if int(&has.query().fetch_one(&mut *tx).await?, "n")? == 0 {
        let mut ins = db.sql();
        ins.push("INSERT INTO image_hosts (image_id, jobserver_id) VALUES ")
            .bind_list([Val::Int(Some(image_id)), Val::Int(Some(jobserver))]);
        ins.query().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The job servers a new version of an image is copied to: every one but
/// `publisher` that registered `image-sync` and serves one of the networks
/// the image's systems boot on (`used`, each by
/// [`node_network`]; `None`: a system that
/// names no network, served on any), by the rule that sends a node to a
/// job server ([`serves_network`]). Ids in
/// the order given. Pure.
pub fn sync_targets(
    publisher: i64,
    candidates: &[(JobServer, Vec<String>)],
    used: &[Option<i64>],
) -> Vec<i64> {
    candidates
        .iter()
        .filter(|(j, modules)| {
            j.id != publisher
                && modules.iter().any(|m| m.trim() == module::IMAGE_SYNC)
                && used.iter().any(|n| serves_network(j, *n))
        })
        .map(|(j, _)| j.id)
        .collect()
}

/// Queues an `image-sync` of image `image_id` (`slug`) at `version` for
/// each of [`sync_targets`], naming the publisher as the source.
async fn queue_syncs(
    db: &Db,
    conn: &mut AnyConnection,
    publisher: i64,
    (image_id, slug): (i64, &str),
    version: i64,
    now: &str,
) -> Result<(), StoreError> {
    let mut sel = db.sql();
    sel.push("SELECT ")
        .push(JOBSERVER_COLUMNS)
        .push(", j.modules FROM jobservers j LEFT JOIN jobserver_addresses a ON a.jobserver_id = j.id")
        .push(JOBSERVER_ORDER);
    let rows = sel.query().fetch_all(&mut *conn).await?;
    let mut modules: HashMap<i64, Vec<String>> = HashMap::new();
    for r in &rows {
        let listed: String = r.try_get("modules")?;
        modules.insert(
            int(r, "id")?,
            serde_json::from_str(&listed).unwrap_or_default(),
        );
    }
    let candidates: Vec<(JobServer, Vec<String>)> = jobservers_of(&rows, jiff::Timestamp::now())?
        .into_iter()
        .map(|j| {
            let m = modules.remove(&j.id).unwrap_or_default();
            (j, m)
        })
        .collect();
    let from = candidates
        .iter()
        .find(|(j, _)| j.id == publisher)
        .map(|(j, _)| j.name.clone())
        .unwrap_or_default();
    // A system without NICs comes back as one row of NULLs: any network.
    let mut nets = db.sql();
    nets.push("SELECT DISTINCT n.network_id, p.network_id AS port_network_id FROM systems s LEFT JOIN network_interfaces n ON n.system_id = s.id LEFT JOIN switch_ports p ON p.id = n.switch_port_id WHERE s.image_id = ")
        .bind(Val::Int(Some(image_id)));
    let used = nets
        .query()
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|r| {
            Ok(node_network(
                opt_int(r, "port_network_id")?,
                opt_int(r, "network_id")?,
            ))
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    let mut params = Map::new();
    params.insert("image".into(), slug.into());
    params.insert("version".into(), version.into());
    params.insert("from".into(), from.into());
    let params = Value::Object(params);
    for id in sync_targets(publisher, &candidates, &used) {
        queue(db, conn, module::IMAGE_SYNC, &params, Some(id), now).await?;
    }
    Ok(())
}

/// The files recorded for an image's `version` (`None`: its current one):
/// the image's slug, the version and its files by name.
pub async fn files(
    db: &Db,
    key: &str,
    version: Option<i64>,
) -> Result<mprov_api::jobs::ImageFiles, StoreError> {
    let mut conn = db.pool().acquire().await?;
    let (image_id, slug, current) = image(&mut conn, db, key).await?;
    let version = version.unwrap_or(current);
    let mut sel = db.sql();
    sel.push("SELECT name, size, sha256 FROM image_files WHERE image_id = ")
        .bind(Val::Int(Some(image_id)))
        .push(" AND version = ")
        .bind(Val::Int(Some(version)))
        .push(" ORDER BY name");
    let rows = sel.query().fetch_all(&mut *conn).await?;
    let files = rows
        .iter()
        .map(|r| {
            Ok(HostedFile {
                name: r.try_get("name")?,
                size: u64::try_from(int(r, "size")?).unwrap_or_default(),
                sha256: r.try_get("sha256")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(mprov_api::jobs::ImageFiles {
        image: slug,
        version,
        files,
    })
}

/// Queues the failed job `key` (its id) again, at `now`: pending, claimed
/// by nobody, its start, end and return code cleared, its output kept with
/// a line saying it was queued again (the next run's report replaces it).
/// A job for one job server stays for it. Refused (409) unless the job
/// failed, naming its state; 404 when there is no such job. One
/// transaction, bumping the revision; the job's id.
pub async fn retry(db: &Db, key: &str, now: jiff::Timestamp) -> Result<i64, StoreError> {
    let not_found = || StoreError::NotFound {
        kind: "jobs",
        key: key.to_owned(),
    };
    let id = key.trim().parse::<i64>().map_err(|_| not_found())?;
    let stamp = format_ts(now);
    let mut tx = db.pool().begin().await?;
    bump_revision(&mut tx).await?;
    let mut sel = db.sql();
    sel.push("SELECT status, output FROM jobs WHERE id = ")
        .bind(Val::Int(Some(id)));
    let row = sel
        .query()
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(not_found)?;
    let state: String = row.try_get("status")?;
    if let Some(refusal) = retry_refusal(id, &state) {
        return Err(conflict(refusal));
    }
    let output: Option<String> = row.try_get("output")?;
    let note = format!("queued again at {stamp} (retry after it failed)");
    let mut upd = db.sql();
    upd.push("UPDATE jobs SET status = ")
        .bind(text(status::PENDING))
        .push(", jobserver_id = ")
        .bind(Val::Int(None))
        .push(", started_at = ")
        .bind(Val::Text(None))
        .push(", ended_at = ")
        .bind(Val::Text(None))
        .push(", return_code = ")
        .bind(Val::Int(None))
        .push(", output = ")
        .bind(text(append_bounded(
            output.as_deref().unwrap_or_default(),
            &note,
        )))
        .push(", updated_at = ")
        .bind(text(stamp))
        .push(" WHERE id = ")
        .bind(Val::Int(Some(id)))
        .push(" AND status = ")
        .bind(text(status::FAILED));
    if upd.query().execute(&mut *tx).await?.rows_affected() != 1 {
        // Changed between the read and the write (on engines whose read
        // does not lock the row): say what it is now.
        tx.rollback().await?;
        return Err(conflict(format!(
            "job {id} changed while it was being queued again; reload and retry if it still failed"
        )));
    }
    tx.commit().await?;
    Ok(id)
}

/// Requests a rebuild of the image `key` (slug or id): the write the API's
/// `PATCH /api/v1/images/{key}` with the kind's rebuild flag true makes, so
/// the descriptor's [`Hook::Rebuild`](crate::db::kinds::Hook::Rebuild) does
/// what a rebuild does (a new version, hosts and checksum cleared, an
/// image-update job queued). The image as stored after.
pub async fn rebuild(
    db: &Db,
    secrets: &crate::secrets::SecretBox,
    key: &str,
) -> Result<crate::db::crud::Obj, StoreError> {
    let missing = |what: &str| StoreError::NotFound {
        kind: "kinds",
        key: what.to_owned(),
    };
    let images = kinds::kind("images").ok_or_else(|| missing("images"))?;
    let flag = images
        .hooks
        .iter()
        .find_map(|h| match h {
            kinds::Hook::Rebuild { flag, .. } => Some(*flag),
            _ => None,
        })
        .ok_or_else(|| missing("images' rebuild hook"))?;
    let mut body = Map::new();
    body.insert(flag.into(), Value::Bool(true));
    let prepared =
        crate::db::crud::validate(images, &body, crate::db::crud::Mode::Update, secrets, "")
            .map_err(crate::db::crud::field_errors)?;
    db.update(images, key, prepared).await
}

/// Why job `id` in state `state` may not be retried; `None` when it may
/// (it failed). Pure.
pub fn retry_refusal(id: i64, state: &str) -> Option<String> {
    match state {
        status::FAILED => None,
        status::PENDING => Some(format!(
            "job {id} is pending: it is already waiting for a job server; only a failed job is retried"
        )),
        status::RUNNING => Some(format!(
            "job {id} is running; only a failed job is retried (a job whose job server falls silent is failed by the sweep, then it can be)"
        )),
        status::SUCCESS => Some(format!(
            "job {id} succeeded; only a failed job is retried (to build an image again, request a rebuild)"
        )),
        other => Some(format!("job {id} is {other}; only a failed job is retried")),
    }
}

/// The most versions [`image_builds`] lists, newest first.
pub const BUILDS_SHOWN: i64 = 20;

/// One job of an image's builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildJob {
    /// The job's id.
    pub id: i64,
    /// Its state (see [`status`]).
    pub status: String,
    /// The job server that claimed it, by name.
    pub jobserver: Option<String>,
    /// When it started and ended (stored form).
    pub started_at: Option<String>,
    /// When it ended.
    pub ended_at: Option<String>,
    /// Its exit status, once reported.
    pub return_code: Option<i64>,
}

/// One version of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageVersion {
    /// The version number.
    pub version: i64,
    /// The rootfs's SHA-256 recorded when it was published; `None`: not
    /// published (yet).
    pub rootfs_sha256: Option<String>,
    /// The rootfs's size in bytes, when published.
    pub rootfs_size: Option<i64>,
    /// The image-update jobs that built (or are building) it, newest first.
    pub jobs: Vec<BuildJob>,
    /// The job servers that host it, by name: only the current version has
    /// hosts (a rebuild clears them).
    pub hosts: Vec<String>,
}

/// An image's builds: what its page shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageBuilds {
    /// The image's slug.
    pub slug: String,
    /// Its current version.
    pub current: i64,
    /// Whether a rebuild was requested and not published yet.
    pub needs_rebuild: bool,
    /// Its versions, newest first, at most [`BUILDS_SHOWN`]: every version
    /// with recorded files or a build job, and the current one.
    pub versions: Vec<ImageVersion>,
}

/// The builds of the image `key` (slug or id), in four statements whatever
/// the number of versions, jobs or hosts.
pub async fn image_builds(db: &Db, key: &str) -> Result<ImageBuilds, StoreError> {
    let mut conn = db.pool().acquire().await?;
    let (image_id, slug, current) = image(&mut conn, db, key).await?;
    let mut sel = db.sql();
    sel.push("SELECT needs_rebuild FROM system_images WHERE id = ")
        .bind(Val::Int(Some(image_id)));
    let row = sel.query().fetch_one(&mut *conn).await?;
    let needs_rebuild = crate::db::opt_bool(&row, "needs_rebuild")?.unwrap_or(false);
    let floor = current.saturating_sub(BUILDS_SHOWN - 1);

    // The recorded rootfs of each version.
    let mut files = db.sql();
    files
        .push("SELECT version, size, sha256 FROM image_files WHERE image_id = ")
        .bind(Val::Int(Some(image_id)))
        .push(" AND name = ")
        .bind(text(ROOTFS))
        .push(" AND version >= ")
        .bind(Val::Int(Some(floor)));
    let mut versions: std::collections::BTreeMap<i64, ImageVersion> = Default::default();
    let blank = |version| ImageVersion {
        version,
        rootfs_sha256: None,
        rootfs_size: None,
        jobs: Vec::new(),
        hosts: Vec::new(),
    };
    for r in files.query().fetch_all(&mut *conn).await? {
        let v = int(&r, "version")?;
        let e = versions.entry(v).or_insert_with(|| blank(v));
        e.rootfs_sha256 = r.try_get("sha256")?;
        e.rootfs_size = opt_int(&r, "size")?;
    }
    versions.entry(current).or_insert_with(|| blank(current));

    // Its image-update jobs: the text match narrows, the parameters decide
    // (a slug's `_` matches any character in LIKE).
    let mut jobs = db.sql();
    jobs.push("SELECT j.id, j.status, j.params, j.started_at, j.ended_at, j.return_code, s.name AS jobserver FROM jobs j LEFT JOIN jobservers s ON s.id = j.jobserver_id WHERE j.module = ")
        .bind(text(module::IMAGE_UPDATE))
        .push(" AND j.params LIKE ")
        .bind(text(format!("%{slug}%")))
        .push(" ORDER BY j.id DESC LIMIT ")
        .bind(Val::Int(Some(BUILDS_SHOWN * 4)));
    for r in jobs.query().fetch_all(&mut *conn).await? {
        let params: Option<String> = r.try_get("params")?;
        let params: Value = params
            .and_then(|p| serde_json::from_str(&p).ok())
            .unwrap_or(Value::Null);
        if params.get("image").and_then(Value::as_str) != Some(slug.as_str()) {
            continue;
        }
        let Some(v) = params.get("version").and_then(Value::as_i64) else {
            continue;
        };
        if v < floor {
            continue;
        }
        versions
            .entry(v)
            .or_insert_with(|| blank(v))
            .jobs
            .push(BuildJob {
                id: int(&r, "id")?,
                status: r.try_get("status")?,
                jobserver: r.try_get("jobserver")?,
                started_at: r.try_get("started_at")?,
                ended_at: r.try_get("ended_at")?,
                return_code: opt_int(&r, "return_code")?,
            });
    }

    // The current version's hosts.
    let mut hosts = db.sql();
    hosts
        .push("SELECT s.name FROM image_hosts h JOIN jobservers s ON s.id = h.jobserver_id WHERE h.image_id = ")
        .bind(Val::Int(Some(image_id)))
        .push(" ORDER BY s.name");
    let names = hosts
        .query()
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|r| r.try_get::<String, _>("name"))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(v) = versions.get_mut(&current) {
        v.hosts = names;
    }
    Ok(ImageBuilds {
        slug,
        current,
        needs_rebuild,
        versions: versions.into_values().rev().collect(),
    })
}

/// What a [`sweep`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// The jobs failed, by id.
    pub failed_jobs: Vec<i64>,
    /// The job servers deleted, by name.
    pub deleted_jobservers: Vec<String>,
}

/// The time `minutes` before `now`, in the stored form.
fn before(now: jiff::Timestamp, minutes: i64) -> String {
    format_ts(
        now.checked_sub(jiff::SignedDuration::from_mins(minutes))
            .unwrap_or(jiff::Timestamp::MIN),
    )
}

/// `text` with `line` added, keeping its last [`MAX_OUTPUT`] characters.
pub fn append_bounded(text: &str, line: &str) -> String {
    let mut out = String::with_capacity(text.len() + line.len() + 1);
    out.push_str(text);
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(line);
    let over = out.chars().count().saturating_sub(MAX_OUTPUT);
    match out.char_indices().nth(over) {
        Some((at, _)) if over > 0 => out[at..].to_owned(),
        _ => out,
    }
}

/// The job servers last heard from before `cutoff` (never heard from:
/// registered before it): id, name, and when they were last heard from.
async fn silent_since(db: &Db, cutoff: &str) -> Result<Vec<(i64, String, String)>, sqlx::Error> {
    let mut sel = db.sql();
    sel.push(
        "SELECT id, name, COALESCE(heartbeat_at, created_at) AS heard FROM jobservers WHERE COALESCE(heartbeat_at, created_at) < ",
    )
    .bind(text(cutoff))
    .push(" ORDER BY id");
    db.fetch_all(&sel)
        .await?
        .iter()
        .map(|r| Ok((int(r, "id")?, r.try_get("name")?, r.try_get("heard")?)))
        .collect()
}

/// At `now`: fails the running jobs of every job server silent for
/// `limits.fail_jobs_after_minutes`, with the reason at the end of their
/// output and their end time; deletes every job server silent for
/// `limits.delete_after_days` (revoking its certificates, as deleting its
/// row through the API does). Each failed job is written in its own
/// transaction, which bumps the revision, and only if it is still running.
pub async fn sweep(
    db: &Db,
    now: jiff::Timestamp,
    limits: JobServerSilence,
) -> Result<Swept, StoreError> {
    let mut swept = Swept::default();
    let stamp = format_ts(now);
    if limits.fail_jobs_after_minutes > 0 {
        let minutes = i64::from(limits.fail_jobs_after_minutes);
        for (id, name, heard) in silent_since(db, &before(now, minutes)).await? {
            let mut sel = db.sql();
            sel.push("SELECT id, output FROM jobs WHERE status = ")
                .bind(text(status::RUNNING))
                .push(" AND jobserver_id = ")
                .bind(Val::Int(Some(id)))
                .push(" ORDER BY id");
            let reason = format!(
                "failed by the control service at {stamp}: job server {name} was last heard from at {heard}, more than {minutes} minutes before (JOBSERVER_FAIL_JOBS_AFTER_MINUTES)"
            );
            for job in db.fetch_all(&sel).await? {
                let job_id = int(&job, "id")?;
                let output: String = job.try_get("output")?;
                let mut tx = db.pool().begin().await?;
                bump_revision(&mut tx).await?;
                let mut upd = db.sql();
                upd.push("UPDATE jobs SET status = ")
                    .bind(text(status::FAILED))
                    .push(", output = ")
                    .bind(text(append_bounded(&output, &reason)))
                    .push(", ended_at = ")
                    .bind(text(stamp.clone()))
                    .push(", updated_at = ")
                    .bind(text(stamp.clone()))
                    .push(" WHERE id = ")
                    .bind(Val::Int(Some(job_id)))
                    .push(" AND status = ")
                    .bind(text(status::RUNNING));
                if upd.query().execute(&mut *tx).await?.rows_affected() == 1 {
                    tx.commit().await?;
                    swept.failed_jobs.push(job_id);
                } else {
                    tx.rollback().await?;
                }
            }
        }
    }
    if limits.delete_after_days > 0 {
        let minutes = i64::from(limits.delete_after_days) * 24 * 60;
        let jobservers = kinds::kind("jobservers").ok_or_else(|| StoreError::NotFound {
            kind: "kinds",
            key: "jobservers".into(),
        })?;
        for (_, name, _) in silent_since(db, &before(now, minutes)).await? {
            match db.delete(jobservers, &name).await {
                Ok(()) => swept.deleted_jobservers.push(name),
                // Deleted meanwhile (by an admin): nothing left to do.
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, sha: &str) -> HostedFile {
        HostedFile {
            name: name.into(),
            size: 10,
            sha256: sha.into(),
        }
    }

    const SHA: &str = "5e0a0d1c9f2b7e3a4d6c8b0a1f3e5d7c9b1a3f5e7d9c1b3a5f7e9d1c3b5a7f90";

    #[test]
    fn file_lists_name_their_rootfs_and_stay_in_their_folder() {
        let good = [file(ROOTFS, SHA), file("vmlinuz", SHA)];
        assert_eq!(check_files(&good).unwrap().name, ROOTFS);
        let msg = |files: &[HostedFile]| check_files(files).unwrap_err().to_string();
        assert!(msg(&[file("vmlinuz", SHA)]).contains("no rootfs.tar.zst"));
        assert!(msg(&[file(ROOTFS, SHA), file("../etc", SHA)]).contains("files[1].name"));
        assert!(msg(&[file(ROOTFS, SHA), file("..", SHA)]).contains("files[1].name"));
        assert!(msg(&[file(ROOTFS, SHA), file(ROOTFS, SHA)]).contains("listed twice"));
        assert!(msg(&[file(ROOTFS, "abc")]).contains("files[0].sha256"));
        assert!(msg(&[file(ROOTFS, "")]).contains("files[0].sha256"));
        let mut huge = file(ROOTFS, SHA);
        huge.size = u64::MAX;
        assert!(msg(&[huge]).contains("files[0].size"));
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|m| (*m).to_owned()).collect()
    }

    #[test]
    fn a_claim_takes_only_modules_the_job_server_registered() {
        let registered = names(&["image-sync", "libgenders"]);
        let check = |asked: &[&str], want: &[&str]| {
            assert_eq!(claimable(&names(asked), &registered), want, "{asked:?}");
        };
        check(&["image-update"], &[]);
        check(&["image-update", "image-sync"], &["image-sync"]);
        check(
            &["libgenders", "image-sync", "libgenders"],
            &["libgenders", "image-sync"],
        );
        check(&[" image-sync "], &["image-sync"]);
        check(&[], &[]);
        assert!(claimable(&names(&["image-sync"]), &[]).is_empty());
    }

    fn js(id: i64, network: Option<i64>, addresses: &[Option<i64>]) -> JobServer {
        JobServer {
            id,
            name: format!("js{id}"),
            address: Some(format!("10.0.{id}.2")),
            port: None,
            network,
            load_avg: 0.0,
            heartbeat_age: None,
            addresses: addresses
                .iter()
                .map(|n| crate::netboot::ServedAddress {
                    address: format!("10.0.{id}.3"),
                    network: *n,
                    load_avg: 0.0,
                    heartbeat_age: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_new_version_is_copied_to_the_job_servers_of_the_networks_that_use_it() {
        let sync = names(&["image-sync"]);
        let candidates = vec![
            // The publisher, on network 1.
            (js(1, None, &[Some(1)]), sync.clone()),
            // Registered on network 1, and on 1 and 3.
            (js(2, None, &[Some(1)]), sync.clone()),
            (js(3, None, &[Some(3), Some(1)]), sync.clone()),
            // On network 2 only.
            (js(4, None, &[Some(2)]), sync.clone()),
            // On network 1 without image-sync.
            (js(5, None, &[Some(1)]), names(&["image-update"])),
            // A row made by hand on network 1, never registered.
            (js(6, Some(1), &[]), sync.clone()),
            // Registered, but no network holds its address.
            (js(7, Some(1), &[None]), sync.clone()),
        ];
        assert_eq!(sync_targets(1, &candidates, &[Some(1)]), [2, 3, 6]);
        assert_eq!(sync_targets(1, &candidates, &[Some(2)]), [4]);
        assert_eq!(
            sync_targets(1, &candidates, &[Some(2), Some(1)]),
            [2, 3, 4, 6]
        );
        // Nobody uses the image: no copies.
        assert!(sync_targets(1, &candidates, &[]).is_empty());
        // A system that names no network may boot anywhere.
        assert_eq!(sync_targets(1, &candidates, &[None]), [2, 3, 4, 6, 7]);
    }

    #[test]
    fn appended_output_keeps_its_tail() {
        assert_eq!(append_bounded("", "x"), "x");
        assert_eq!(append_bounded("a", "x"), "a\nx");
        assert_eq!(append_bounded("a\n", "x"), "a\nx");
        let long = "é".repeat(MAX_OUTPUT);
        let out = append_bounded(&long, "the reason");
        assert_eq!(out.chars().count(), MAX_OUTPUT);
        assert!(out.ends_with("\nthe reason"));
        assert!(out.starts_with('é'));
    }

    #[test]
    fn only_a_failed_job_is_retried() {
        assert_eq!(retry_refusal(1, status::FAILED), None);
        for (state, says) in [
            (status::PENDING, "already waiting"),
            (status::RUNNING, "is running"),
            (status::SUCCESS, "succeeded"),
        ] {
            let why = retry_refusal(7, state).expect(state);
            assert!(why.starts_with("job 7 "), "{why}");
            assert!(why.contains(says), "{why}");
        }
    }

    #[test]
    fn before_counts_back_in_minutes() {
        let now: jiff::Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        assert_eq!(before(now, 10), "2026-12-01T09:50:00Z");
        assert_eq!(before(now, 2 * 24 * 60), "2026-11-29T10:00:00Z");
    }
}
