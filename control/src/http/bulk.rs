//! `POST /api/v1/systems/actions` (a bulk action on the systems a filter
//! matches: a preview, or with `confirm_count` the change) and
//! `GET /api/v1/audit/` (the log those changes write). The handlers parse
//! and map errors; [`crate::bulk`] decides and writes. Read-only accounts
//! never reach the POST: the inventory layer refuses their writes.

use axum::Json;
use axum::extract::{RawQuery, State};
use mprov_api::bulk::{AuditPage, BulkAnswer, BulkRequest};

use super::AppState;
use super::body::JsonBody;
use super::error::ApiError;
use crate::bulk::{self, Action};
use crate::db::crud::filter::Filter;
use crate::identity::Principal;

/// `POST /api/v1/systems/actions`.
pub async fn actions(
    State(st): State<AppState>,
    principal: Option<axum::Extension<Principal>>,
    body: JsonBody,
) -> Result<Json<BulkAnswer>, ApiError> {
    let req: BulkRequest = serde_json::from_value(body.0).map_err(|e| {
        ApiError::bad_request(
            "malformed_json",
            format!("the body is not a bulk action ({{filter, action, group, image, netboot, confirm_count}}): {e}"),
        )
    })?;
    let filter =
        Filter::parse(&req.filter).map_err(|e| ApiError::invalid("filter", e.to_string()))?;
    let action = Action::parse(&req.action, argument(&req).as_deref())?;
    let Some(confirmed) = req.confirm_count else {
        let preview = bulk::preview(&st.db, &filter, &action).await?;
        return Ok(Json(BulkAnswer {
            applied: false,
            count: preview.count,
            hosts: preview.hosts,
        }));
    };
    let principal =
        principal.ok_or_else(|| ApiError::Unauthorized("no credentials were checked".into()))?;
    let who = principal.0.label();
    let count = bulk::apply(&st.db, &who, &req.filter, &filter, &action, confirmed).await?;
    tracing::info!(%who, action = action.name(), filter = %req.filter, count, "bulk action applied");
    st.changed.notify_waiters();
    Ok(Json(BulkAnswer {
        applied: true,
        count,
        hosts: Vec::new(),
    }))
}

/// The argument of the request's action, from the field that action reads.
pub fn argument(req: &BulkRequest) -> Option<String> {
    match req.action.as_str() {
        "add_to_group" | "remove_from_group" => req.group.clone(),
        "set_image" => req.image.clone(),
        "set_netboot" => req
            .netboot
            .map(|on| if on { "on" } else { "off" }.to_owned()),
        _ => None,
    }
}

/// `GET /api/v1/audit/?limit=&cursor=`: newest first.
pub async fn audit(
    State(st): State<AppState>,
    RawQuery(q): RawQuery,
) -> Result<Json<AuditPage>, ApiError> {
    let mut limit = None;
    let mut cursor = None;
    for (k, v) in url::form_urlencoded::parse(q.unwrap_or_default().as_bytes()).into_owned() {
        match k.as_str() {
            "limit" => {
                limit =
                    Some(v.parse().map_err(|_| {
                        ApiError::invalid("limit", "limit: expected a whole number")
                    })?)
            }
            "cursor" => cursor = Some(v),
            _ => {
                return Err(ApiError::invalid(
                    &k,
                    "unknown query parameter; the audit log takes limit and cursor",
                ));
            }
        }
    }
    Ok(Json(bulk::audit(&st.db, limit, cursor.as_deref()).await?))
}
