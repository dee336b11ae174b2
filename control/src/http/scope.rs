//! What each principal may reach, checked after authentication and the
//! version lock, before any handler runs.
//!
//! - Admins (admin users, API keys other than the shared one): everything.
//! - Read-only users: every read.
//! - A **node's** certificate: only what a node does to itself: its own
//!   system row and effective config, its own NICs and BMC entries (read),
//!   and renewing its certificate. It may write only the fields in
//!   [`NODE_WRITABLE`] of its own objects, checked on the body by
//!   [`check_fields`]: what a node reports about itself (boot events, script
//!   results, status and facts), never who it is or what it boots (its
//!   system, host name, groups, image, kernel command line, aliases, NIC
//!   ownership or BMC settings).
//! - A **job server's** certificate: every inventory read except accounts
//!   and credentials, its own job-server row (heartbeats), the jobs it
//!   claimed, which images it hosts (`/api/v1/images/{key}/hosts/{itself}`),
//!   and renewing its certificate.
//! - The old **shared API key**, per `MPROV_SHARED_KEY_MODE`: `all` as an
//!   admin (the default, warned about at start), `nodes` only the node-self
//!   paths above (for any node: the key cannot say which), `off` refused.
//!
//! Paths are matched on the router's shapes (`/api/v1/<kind>/<key>`); an
//! object a node does not own is answered 403 without saying whether it
//! exists elsewhere.

use axum::http::Method;
use serde_json::Value;

use super::AppState;
use super::auth::Principal;
use super::error::ApiError;
use crate::db::crud::ListQuery;
use crate::db::kinds::{self, NodeAccess};

/// Where the old shared API key is still accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedKeyMode {
    /// Everywhere, as an admin (as before certificates).
    All,
    /// Only for what a node does to itself.
    Nodes,
    /// Nowhere.
    Off,
}

impl std::str::FromStr for SharedKeyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "all" | "" => Ok(SharedKeyMode::All),
            "nodes" => Ok(SharedKeyMode::Nodes),
            "off" => Ok(SharedKeyMode::Off),
            other => Err(format!(
                "MPROV_SHARED_KEY_MODE={other:?} is not all, nodes or off"
            )),
        }
    }
}

/// The fields a node may write on its own objects, per kind. The inventory
/// has no node-reported field yet (boot events and script results have
/// their own endpoints), so today no field is listed: a node's PATCH of its
/// own system, NIC or BMC is refused field by field, with the field named.
pub const NODE_WRITABLE: &[(&str, &[&str])] = &[("systems", &[]), ("nics", &[]), ("bmcs", &[])];

/// Whether `principal` may write `fields` of an object of `kind` it was
/// already allowed to reach by [`check`]: admins and users yes; a node's
/// certificate (and the shared key in `nodes` mode, which acts for any node)
/// only the fields of [`NODE_WRITABLE`]. Pure.
pub fn check_fields<'a>(
    principal: &Principal,
    mode: SharedKeyMode,
    kind: &str,
    mut fields: impl Iterator<Item = &'a str>,
) -> Result<(), ApiError> {
    let node = match principal {
        Principal::Agent(agent) if agent.kind == "node" => true,
        Principal::ApiKey { shared: true, .. } => mode == SharedKeyMode::Nodes,
        _ => false,
    };
    if !node {
        return Ok(());
    }
    let allowed: &[&str] = NODE_WRITABLE
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(&[], |(_, f)| *f);
    match fields.find(|f| !allowed.contains(f)) {
        None => Ok(()),
        Some(field) => Err(forbid(&format!(
            "a node may not write {field:?} of its {kind}: a node reports only what it does (boot events, script results, status and facts); who it is, what it boots and its NICs and BMC are set by an administrator"
        ))),
    }
}

fn forbid(msg: &str) -> ApiError {
    ApiError::Forbidden(msg.to_owned())
}

/// The path split after `/api/v1/`: kind, key, rest.
fn api_parts(path: &str) -> Option<(&str, Option<&str>, Option<&str>)> {
    let rest = path.strip_prefix("/api/v1/")?;
    let mut it = rest.trim_end_matches('/').splitn(3, '/');
    let kind = it.next().filter(|k| !k.is_empty())?;
    Some((kind, it.next().filter(|k| !k.is_empty()), it.next()))
}

/// Checks that `principal` may make this request.
pub async fn check(
    st: &AppState,
    principal: &Principal,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Result<(), ApiError> {
    let read = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    // What anyone may reach, anyone authenticated may too.
    if super::auth::is_public(path) {
        return Ok(());
    }
    // The boot timeline and manifest decide per identity themselves (a node
    // writes and reads its own, a job server writes for nodes): crate::boot.
    if path == mprov_api::boot::EVENTS_PATH || path == mprov_api::boot::MANIFEST_PATH {
        return Ok(());
    }
    match principal {
        Principal::Anonymous => Ok(()),
        Principal::User { is_admin, .. } => {
            if read || *is_admin {
                Ok(())
            } else {
                Err(forbid("this account may read the inventory but not change it"))
            }
        }
        Principal::ApiKey { shared, .. } => match (shared, st.config.shared_key_mode) {
            (false, _) | (true, SharedKeyMode::All) => Ok(()),
            (true, SharedKeyMode::Off) => Err(ApiError::Unauthorized(
                "the shared API key is turned off (MPROV_SHARED_KEY_MODE=off); enroll with a token instead".into(),
            )),
            (true, SharedKeyMode::Nodes) => node_self(st, None, method, path, query)
                .await
                .map_err(|_| {
                    forbid("MPROV_SHARED_KEY_MODE=nodes: the shared API key only reaches what a node does to itself")
                }),
        },
        Principal::Agent(agent) if agent.kind == "node" => {
            if path == "/enroll/renew/" {
                return Ok(());
            }
            node_self(st, Some(&agent.identity), method, path, query)
                .await
                .map_err(|()| {
                    forbid(&format!(
                        "a node's certificate reaches only its own system ({})",
                        agent.identity
                    ))
                })
        }
        Principal::Agent(agent) => jobserver(st, &agent.identity, method, path, read).await,
    }
}

/// Node-self requests; `hostname` is the node's (None: any node, for the
/// shared key).
async fn node_self(
    st: &AppState,
    hostname: Option<&str>,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Result<(), ()> {
    let allowed_method = matches!(*method, Method::GET | Method::HEAD | Method::PATCH);
    let Some((kind, key, rest)) = api_parts(path) else {
        return Err(());
    };
    if !allowed_method {
        return Err(());
    }
    let own_id = match hostname {
        Some(h) => Some(system_id(st, h).await.ok_or(())?),
        None => None,
    };
    let is_own = |id: Option<i64>| match own_id {
        None => id.is_some(),
        Some(own) => id == Some(own),
    };
    match (kinds::visibility(kind).nodes, key, rest) {
        (NodeAccess::Itself, Some(key), None | Some("config")) => {
            if rest.is_some() && *method != Method::GET {
                return Err(());
            }
            let id = system_id(st, key).await;
            if is_own(id) { Ok(()) } else { Err(()) }
        }
        (NodeAccess::OwnedVia(field), Some(key), None) => {
            let k = kinds::kind(kind).ok_or(())?;
            let obj = st.db.get(k, key).await.map_err(|_| ())?;
            if is_own(obj.get(field).and_then(Value::as_i64)) {
                Ok(())
            } else {
                Err(())
            }
        }
        (NodeAccess::OwnedVia(field), None, None) if *method == Method::GET => {
            // A list only with `<field>=` naming the node itself.
            let q = ListQuery::from_pairs(
                url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                    .into_owned()
                    .collect(),
            );
            let system = q
                .filters
                .iter()
                .find(|(f, _)| f == field)
                .map(|(_, v)| v.clone())
                .ok_or(())?;
            if q.filters.len() != 1 {
                return Err(());
            }
            let id = system_id(st, &system).await;
            if is_own(id) { Ok(()) } else { Err(()) }
        }
        _ => Err(()),
    }
}

/// A system's id from its id or host name.
async fn system_id(st: &AppState, key: &str) -> Option<i64> {
    let k = kinds::kind("systems")?;
    let obj = st.db.get(k, key).await.ok()?;
    obj.get("id").and_then(Value::as_i64)
}

async fn jobserver(
    st: &AppState,
    name: &str,
    method: &Method,
    path: &str,
    read: bool,
) -> Result<(), ApiError> {
    let deny = || {
        forbid(&format!(
            "a job server's certificate ({name}) reads the inventory and writes only its own state"
        ))
    };
    if path == "/enroll/renew/" {
        return Ok(());
    }
    if read && (path == "/api/v1/" || path == "/api/v1") {
        return Ok(());
    }
    let Some((kind, key, rest)) = api_parts(path) else {
        return Err(deny());
    };
    if !kinds::visibility(kind).jobservers {
        return Err(deny());
    }
    if read {
        return Ok(());
    }
    match (kind, key, rest) {
        ("jobservers", Some(key), None) if *method == Method::PATCH => {
            let k = kinds::kind("jobservers").ok_or_else(deny)?;
            let obj = st.db.get(k, key).await.map_err(|_| deny())?;
            if obj.get("name").and_then(Value::as_str) == Some(name) {
                Ok(())
            } else {
                Err(deny())
            }
        }
        // Its own image hosting: /api/v1/images/{key}/hosts/{itself}.
        ("images", Some(_), Some(rest))
            if matches!(*method, Method::PUT | Method::DELETE)
                && rest.strip_prefix("hosts/") == Some(name) =>
        {
            Ok(())
        }
        ("jobs", Some(key), None) if *method == Method::PATCH => {
            let jobs = kinds::kind("jobs").ok_or_else(deny)?;
            let job = st.db.get(jobs, key).await.map_err(|_| deny())?;
            let js = kinds::kind("jobservers").ok_or_else(deny)?;
            let own = st.db.get(js, name).await.map_err(|_| deny())?;
            if job.get("jobserver").and_then(Value::as_i64).is_some()
                && job.get("jobserver") == own.get("id")
            {
                Ok(())
            } else {
                Err(deny())
            }
        }
        _ => Err(deny()),
    }
}
