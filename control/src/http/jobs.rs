//! The jobs queue over HTTP; the queue itself is [`crate::jobs`], and who
//! may claim or record hosting is [`crate::access::own_jobserver`] (a job
//! server's own certificate): these handlers parse, ask and call.
//!
//! - `POST /api/v1/jobserver/claim` ([`CLAIM_PATH`](mprov_api::jobs::CLAIM_PATH)):
//!   the oldest pending job of the modules named, for the calling job
//!   server; `204` with an empty body when there is none.
//! - `POST /api/v1/jobserver/hosting` ([`HOSTING_PATH`](mprov_api::jobs::HOSTING_PATH)):
//!   the calling job server hosts an image's current version (with its
//!   files: it built and publishes it).
//! - `GET /api/v1/images/{key}/files[?version=N]`
//!   ([`IMAGE_FILES_ROUTE`](mprov_api::jobs::IMAGE_FILES_ROUTE)): the files
//!   recorded for a version, which a copy is verified against.
//! - `POST /api/v1/jobs/{key}/retry` ([`RETRY_ROUTE`](mprov_api::jobs::RETRY_ROUTE)):
//!   an administrator queues a failed job again ([`crate::jobs::retry`]);
//!   who may is [`crate::access::check`], as for any inventory write.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mprov_api::jobs::{Claim, Hosting, ImageFiles};
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use crate::access;
use crate::identity::Principal;

/// The most modules one claim names.
const MAX_MODULES: usize = 64;

/// The calling job server's row id, from its own certificate (`what` it
/// asked for, for the refusal).
async fn caller(st: &AppState, p: &Principal, what: &'static str) -> Result<i64, ApiError> {
    let role = access::boot_role(p, st.config.shared_key_mode)?;
    let name = access::own_jobserver(&role, what)?;
    crate::jobs::jobserver_id(&st.db, name)
        .await
        .map_err(crate::db::crud::StoreError::from)?
        .ok_or_else(|| {
            ApiError::Forbidden(format!(
                "no job server named {name} is registered (was its row deleted?)"
            ))
        })
}

/// `POST /api/v1/jobserver/claim`.
pub async fn claim(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    Json(claim): Json<Claim>,
) -> Result<Response, ApiError> {
    let id = caller(&st, &principal, "job claims").await?;
    if claim.modules.len() > MAX_MODULES {
        return Err(ApiError::invalid(
            "modules",
            format!("at most {MAX_MODULES} modules"),
        ));
    }
    match crate::jobs::claim(&st.db, id, &claim.modules, jiff::Timestamp::now()).await? {
        Some(job) => {
            st.changed.notify_waiters();
            Ok(Json(job).into_response())
        }
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// `POST /api/v1/jobserver/hosting`.
pub async fn hosting(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    Json(hosting): Json<Hosting>,
) -> Result<StatusCode, ApiError> {
    let id = caller(&st, &principal, "hosting records").await?;
    crate::jobs::record_hosting(&st.db, id, &hosting, jiff::Timestamp::now()).await?;
    st.changed.notify_waiters();
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/v1/images/{key}/files`.
pub async fn image_files(
    State(st): State<AppState>,
    Path(key): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Json<ImageFiles>, ApiError> {
    let mut version = None;
    for (k, v) in url::form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "version" => {
                version =
                    Some(v.parse::<i64>().map_err(|_| {
                        ApiError::invalid("version", "a version number, such as 3")
                    })?);
            }
            _ => {
                return Err(ApiError::invalid(
                    &k,
                    "unknown query parameter; the files of an image take version",
                ));
            }
        }
    }
    Ok(Json(crate::jobs::files(&st.db, &key, version).await?))
}

/// `POST /api/v1/jobs/{key}/retry` (admins: [`access::check`]): the job,
/// pending again.
pub async fn retry(
    State(st): State<AppState>,
    Path(key): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = crate::jobs::retry(&st.db, &key, jiff::Timestamp::now()).await?;
    tracing::info!(job = id, "jobs: a failed job was queued again");
    st.changed.notify_waiters();
    let kind =
        crate::db::kinds::kind("jobs").ok_or_else(|| ApiError::NotFound("no kind jobs".into()))?;
    Ok(Json(Value::Object(st.db.get(kind, &id.to_string()).await?)))
}
