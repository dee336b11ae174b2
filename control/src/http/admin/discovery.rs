//! Discovery (`/admin/discovery/`): the nodes parked for an admin, each
//! with the switch port it heard, its hardware and why it waits, and (for
//! admins) a form to assign it to a system's NIC or dismiss it. The
//! actions are the API's own (`POST /api/v1/discovery/{mac}/assign`,
//! `DELETE /api/v1/discovery/{mac}`) under the API's own access rule
//! ([`page::allow`]): a read-only user sees no form, and a post of theirs
//! is refused.

use askama::Template;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::Value;

use super::page::{self, Chrome, PageError, Posted};
use crate::access::Method;
use crate::discovery::store;
use crate::http::AppState;
use crate::sessions::Session;

/// How many parked nodes the page lists.
const SHOWN: i64 = 200;

struct Row {
    id: i64,
    mac: String,
    links: Vec<String>,
    hardware: String,
    last_seen: String,
    reason: String,
    system: String,
    nic: String,
}

#[derive(Template)]
#[template(path = "admin/discovery.html")]
struct DiscoveryPage {
    chrome: Chrome,
    policy: &'static str,
    nodes: Vec<Row>,
    more: bool,
    shown: i64,
    error: Option<String>,
    done: Option<String>,
}

/// What one link heard, for people.
fn link_text(l: &Value) -> String {
    let name = l["interface"].as_str().unwrap_or("?");
    let mac = l["mac"].as_str().unwrap_or("?");
    match l["neighbour"].as_object() {
        None => format!("{name} ({mac}): nothing heard"),
        Some(n) => {
            let switch = n
                .get("system_name")
                .and_then(Value::as_str)
                .or_else(|| n.get("chassis_id").and_then(Value::as_str))
                .unwrap_or("?");
            let port = n.get("port_id").and_then(Value::as_str).unwrap_or("?");
            let descr = n
                .get("port_description")
                .and_then(Value::as_str)
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            format!("{name} ({mac}): {switch} port {port}{descr}")
        }
    }
}

async fn page(
    state: &AppState,
    session: &Session,
    error: Option<String>,
    done: Option<String>,
) -> Result<Response, PageError> {
    page::allow(state, session, Method::Get, "discovery", None, None).await?;
    let list = store::list(&state.db, 0, SHOWN).await?;
    let nodes = list
        .items
        .into_iter()
        .map(|p| {
            let hardware: mprov_api::nads::Hardware =
                serde_json::from_value(p.report["hardware"].clone()).unwrap_or_default();
            Row {
                id: p.id,
                links: p.report["links"]
                    .as_array()
                    .map(|ls| ls.iter().map(link_text).collect())
                    .unwrap_or_default(),
                hardware: crate::discovery::hardware_text(&hardware),
                last_seen: p.last_seen,
                reason: p.reason,
                system: p
                    .candidate
                    .as_ref()
                    .map(|c| c.hostname.clone())
                    .unwrap_or_default(),
                nic: p
                    .candidate
                    .as_ref()
                    .map(|c| {
                        if c.nic_name.is_empty() {
                            c.nic.to_string()
                        } else {
                            c.nic_name.clone()
                        }
                    })
                    .unwrap_or_default(),
                mac: p.mac,
            }
        })
        .collect();
    let failed = error.is_some();
    let mut resp = page::render(&DiscoveryPage {
        chrome: Chrome::new(state, session, "Discovered nodes", "discovery"),
        policy: state.config.discovery_policy.as_str(),
        nodes,
        more: list.next.is_some(),
        shown: SHOWN,
        error,
        done,
    });
    if failed {
        *resp.status_mut() = axum::http::StatusCode::BAD_REQUEST;
    }
    Ok(resp)
}

/// `GET /admin/discovery/`.
pub async fn show(State(state): State<AppState>, session: Session) -> Result<Response, PageError> {
    page(&state, &session, None, None).await
}

/// `POST /admin/discovery/{mac}/assign`: binds the parked node's MAC to the
/// form's system and NIC.
pub async fn assign(
    State(state): State<AppState>,
    Path(mac): Path<String>,
    posted: Posted,
) -> Result<Response, PageError> {
    let Posted { session, fields } = posted;
    page::allow(
        &state,
        &session,
        Method::Post,
        "discovery",
        Some(&mac),
        Some("assign"),
    )
    .await?;
    let mac = crate::db::crud::parse_mac(&mac).map_err(|e| PageError::invalid("mac", e))?;
    let system = fields.get("system").unwrap_or_default().trim();
    let nic = fields.get("nic").unwrap_or_default().trim();
    let replace = fields.get("replace") == Some("true");
    let by = format!("user:{}", session.username);
    let assigned = store::assign(&state.db, &mac, system, nic, replace, &by).await;
    if assigned.is_ok() {
        state.changed.notify_waiters();
    }
    match assigned {
        Ok(a) => {
            let done = format!(
                "{} is bound to {} (NIC {}): its next boot is a normal one.",
                a.mac, a.hostname, a.nic
            );
            page(&state, &session, None, Some(done)).await
        }
        Err(e) => {
            let (_, _, message, _) = crate::http::error::ApiError::from(e).parts();
            page(&state, &session, Some(message), None).await
        }
    }
}

/// `POST /admin/discovery/{mac}/dismiss`: forgets the parked node.
pub async fn dismiss(
    State(state): State<AppState>,
    Path(mac): Path<String>,
    posted: Posted,
) -> Result<Response, PageError> {
    let Posted { session, .. } = posted;
    page::allow(
        &state,
        &session,
        Method::Delete,
        "discovery",
        Some(&mac),
        None,
    )
    .await?;
    let mac = crate::db::crud::parse_mac(&mac).map_err(|e| PageError::invalid("mac", e))?;
    store::dismiss(&state.db, &mac).await?;
    Ok(Redirect::to("/admin/discovery/").into_response())
}
