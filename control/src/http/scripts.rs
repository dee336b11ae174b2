//! The script-runner's endpoints over HTTP; what they serve is
//! [`crate::scripts`], and who may ask for what is decided by
//! [`crate::access`] (`plan_scope`, `content_scope`, `results_from`): these
//! handlers parse, ask and call.
//!
//! - `GET /api/v1/scripts/plan?mode=post-boot` ([`PLAN_PATH`](mprov_api::scripts::PLAN_PATH)): with a
//!   node's certificate, its own system's plan (it names no system);
//!   `?mode=image-gen&image=<slug>`: an image's image-gen plan, for job
//!   servers; admins and readers name a node with `&system=<host>`.
//! - `GET /api/v1/scripts/{slug}/content` ([`CONTENT_ROUTE`](mprov_api::scripts::CONTENT_ROUTE)): the script's
//!   bytes; a node's certificate only for the scripts of its own plan.
//! - `POST /api/v1/scripts/results` ([`RESULTS_PATH`](mprov_api::scripts::RESULTS_PATH)): a run's report
//!   ([`RunReport`], unknown fields refused): a node's goes on its own boot
//!   timeline, a job server's image-gen run is stored.
//! - `POST /api/v1/systems/{key}/run-scripts` ([`RUN_ROUTE`](mprov_api::scripts::RUN_ROUTE)): an admin asks
//!   the node to run its post-boot scripts again.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use mprov_api::scripts::{RunReport, ScriptMode, ScriptPlan};

use super::AppState;
use super::error::ApiError;
use crate::access::{self, BootRole, PlanScope, RunReporter};
use crate::boot::{NewEvent, record, system_by_key};
use crate::identity::Principal;
use crate::netboot::NodeKey;
use crate::scripts::{self, ScriptsError};

fn role(st: &AppState, p: &Principal) -> Result<BootRole, ApiError> {
    Ok(access::boot_role(p, st.config.shared_key_mode)?)
}

/// `GET /api/v1/scripts/plan`.
pub async fn plan(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    RawQuery(q): RawQuery,
) -> Result<Json<ScriptPlan>, ApiError> {
    let (mut mode, mut system, mut image) = (None, None, None);
    for (k, v) in url::form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "mode" => {
                mode = Some(match v.as_ref() {
                    "post-boot" => ScriptMode::PostBoot,
                    "image-gen" => ScriptMode::ImageGen,
                    _ => return Err(ApiError::invalid("mode", "post-boot or image-gen")),
                });
            }
            "system" => system = Some(v.into_owned()),
            "image" => image = Some(v.into_owned()),
            _ => {
                return Err(ApiError::invalid(
                    &k,
                    "unknown query parameter; a plan takes mode, image (image-gen) and, for administrators, system (post-boot)",
                ));
            }
        }
    }
    let mode = mode.ok_or_else(|| ApiError::invalid("mode", "post-boot or image-gen"))?;
    match (mode, &system, &image) {
        (ScriptMode::PostBoot, _, Some(_)) => {
            return Err(ApiError::invalid(
                "image",
                "a post-boot plan is a node's: it takes no image",
            ));
        }
        (ScriptMode::ImageGen, Some(_), _) => {
            return Err(ApiError::invalid(
                "system",
                "an image-gen plan is an image's: it takes no system",
            ));
        }
        _ => {}
    }
    let role = role(&st, &principal)?;
    let plan = match access::plan_scope(&role, mode, system, image)? {
        PlanScope::Node(host) => scripts::node_plan(&st.db, NodeKey::Host(&host)).await,
        PlanScope::System(key) => scripts::node_plan(&st.db, NodeKey::System(&key)).await,
        PlanScope::Image(key) => scripts::image_plan(&st.db, &key).await,
    };
    // A node whose system row is gone is told so, as its boot events are.
    match (plan, &role) {
        (Err(ScriptsError::NoSystem(_)), BootRole::Node(host)) => {
            Err(access::AccessError::NodeHasNoSystem { host: host.clone() }.into())
        }
        (plan, _) => Ok(Json(plan?)),
    }
}

/// `GET /api/v1/scripts/{slug}/content`.
pub async fn content(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    Path(slug): Path<String>,
) -> Result<Response, ApiError> {
    let role = role(&st, &principal)?;
    if let Some(host) = access::content_scope(&role) {
        let plan = match scripts::node_plan(&st.db, NodeKey::Host(host)).await {
            Err(ScriptsError::NoSystem(_)) => {
                return Err(access::AccessError::NodeHasNoSystem {
                    host: host.to_owned(),
                }
                .into());
            }
            plan => plan?,
        };
        if !scripts::in_plan(&plan, &slug) {
            return Err(ScriptsError::NotInPlan {
                host: host.to_owned(),
                slug,
            }
            .into());
        }
    }
    let body = scripts::content(&st.db, &slug).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
}

/// `POST /api/v1/scripts/results`: the body is read here, not by axum's
/// JSON reader, so every way it can be wrong is a 400 that says what.
pub async fn results(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or_default().to_ascii_lowercase();
        if !ct.starts_with("application/json") {
            return Err(ApiError::UnsupportedMediaType);
        }
    }
    let role = role(&st, &principal)?;
    match &role {
        BootRole::Node(host) => st.within_budget(
            &st.node_events_limiter,
            &format!("node:{host}"),
            "boot events",
        )?,
        BootRole::JobServer(name) => st.within_budget(
            &st.jobserver_events_limiter,
            &format!("jobserver:{name}"),
            "boot events",
        )?,
        BootRole::Admin(_) | BootRole::Reader => {}
    }
    let report: RunReport = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "malformed_json",
            format!("the body is not a run report: {e}"),
        )
    })?;
    scripts::check_report(&report)?;
    let recorded = match access::results_from(&role, report.mode)? {
        RunReporter::Node(host) => {
            let (id, _) = system_by_key(&st.db, host).await?.ok_or_else(|| {
                access::AccessError::NodeHasNoSystem {
                    host: host.to_owned(),
                }
            })?;
            let events = scripts::timeline(&report);
            let n = events.len();
            for (phase, detail) in events {
                record(
                    &st.db,
                    NewEvent {
                        system_id: Some(id),
                        mac: None,
                        phase,
                        source: format!("node:{host}"),
                        jobserver_id: None,
                        ip: None,
                        detail,
                    },
                )
                .await?;
            }
            st.boot_events.notify_waiters();
            tracing::info!(node = %host, outcome = ?report.outcome, scripts = report.results.len(), "scripts: a node reported its post-boot run");
            n
        }
        RunReporter::JobServer(name) => {
            scripts::store_image_run(&st.db, &format!("jobserver:{name}"), &report).await?;
            tracing::info!(jobserver = %name, image = report.image.as_deref().unwrap_or("-"), outcome = ?report.outcome, "scripts: a job server reported an image-gen run");
            report.results.len()
        }
    };
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "recorded": recorded })),
    )
        .into_response())
}

/// `POST /api/v1/systems/{key}/run-scripts` (admins: [`access::check`]):
/// the system's new run request.
pub async fn run_scripts(
    State(st): State<AppState>,
    Path(key): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (hostname, run_request) = scripts::request_run(&st.db, &key).await?;
    tracing::info!(system = %hostname, run_request, "scripts: a new post-boot run was requested");
    Ok(Json(serde_json::json!({
        "system": hostname,
        "run_request": run_request,
    })))
}
