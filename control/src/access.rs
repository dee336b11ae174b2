//! What each principal may reach, checked after authentication and the
//! version lock, before any handler runs.
//!
//! - Admins (admin users, API keys other than the shared one): everything.
//! - Read-only users: every read.
//! - A **node's** certificate: only what a node does to itself: its own
//!   system row and effective config, its own NICs and BMC entries (read),
//!   and renewing its certificate. It may write only the fields its kind's
//!   [`node_writable`](kinds::Kind::node_writable) lists of its own objects,
//!   checked on the body by
//!   [`check_fields`]: what a node reports about itself (boot events, script
//!   results, status and facts), never who it is or what it boots (its
//!   system, host name, groups, image, kernel command line, aliases, NIC
//!   ownership or BMC settings).
//! - A **job server's** certificate: every inventory read except accounts
//!   and credentials, its heartbeat (its load, on its own row, through
//!   `POST /api/v1/boot/heartbeat`: no other field of the row), the jobs it
//!   claimed, which images it hosts (`/api/v1/images/{key}/hosts/{itself}`),
//!   and renewing its certificate. What it may write of a kind is the
//!   kind's [`jobserver_writes`](kinds::Kind::jobserver_writes).
//! - The old **shared API key**, per `MPROV_SHARED_KEY_MODE`: `all` as an
//!   admin (the default, warned about at start), `nodes` only the node-self
//!   paths above (for any node: the key cannot say which), `off` refused.
//!
//! Paths are matched on the router's shapes (`/api/v1/<kind>/<key>`); an
//! object a node does not own is answered 403 without saying whether it
//! exists elsewhere.

use serde_json::Value;

use crate::config::SharedKeyMode;
use crate::db::Db;
use crate::db::crud::ListQuery;
use crate::db::kinds::{self, JobServerWrite, Kind, NodeAccess, Ty};
use crate::identity::Principal;

/// Why a principal may not make a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// Authenticated, but not allowed (403).
    #[error("{0}")]
    Forbidden(String),
    /// These credentials are turned off (401).
    #[error("{0}")]
    Unauthorized(String),
}

/// A request's method, as the rules tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET.
    Get,
    /// HEAD.
    Head,
    /// OPTIONS.
    Options,
    /// POST.
    Post,
    /// PUT.
    Put,
    /// PATCH.
    Patch,
    /// DELETE.
    Delete,
    /// Any other.
    Other,
}

impl Method {
    /// The method named `name` (upper case, as on the wire).
    pub fn from_name(name: &str) -> Method {
        match name {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "OPTIONS" => Method::Options,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "PATCH" => Method::Patch,
            "DELETE" => Method::Delete,
            _ => Method::Other,
        }
    }
}

/// Whether a path is served to anyone.
pub fn is_public(path: &str) -> bool {
    matches!(
        path,
        "/api/v1/openapi.json" | "/ca.crt" | "/ipxe/" | "/enroll/jobserver/" | "/enroll/node/"
    )
}

/// Whether `principal` may write `fields` of an object of `kind` it was
/// already allowed to reach by [`check`]: admins and users yes; a node's
/// certificate (and the shared key in `nodes` mode, which acts for any node)
/// only the fields the kind's [`node_writable`](Kind::node_writable) lists
/// (none today: a node's PATCH of its own system, NIC or BMC is refused
/// field by field, with the field named). Pure.
pub fn check_fields<'a>(
    principal: &Principal,
    mode: SharedKeyMode,
    kind: &Kind,
    mut fields: impl Iterator<Item = &'a str>,
) -> Result<(), AccessError> {
    let node = match principal {
        Principal::Machine(agent) if agent.is_node() => true,
        Principal::ApiKey { shared: true, .. } => mode == SharedKeyMode::Nodes,
        _ => false,
    };
    if !node {
        return Ok(());
    }
    match fields.find(|f| !kind.node_writable.contains(f)) {
        None => Ok(()),
        Some(field) => Err(forbid(&format!(
            "a node may not write {field:?} of its {}: a node reports only what it does (boot events, script results, status and facts); who it is, what it boots and its NICs and BMC are set by an administrator",
            kind.name
        ))),
    }
}

fn forbid(msg: &str) -> AccessError {
    AccessError::Forbidden(msg.to_owned())
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
    db: &Db,
    mode: SharedKeyMode,
    principal: &Principal,
    method: Method,
    path: &str,
    query: Option<&str>,
) -> Result<(), AccessError> {
    let read = matches!(method, Method::Get | Method::Head | Method::Options);
    // What anyone may reach, anyone authenticated may too.
    if is_public(path) {
        return Ok(());
    }
    // The boot timeline, manifest and heartbeat decide per identity
    // themselves (a node writes and reads its own, a job server writes for
    // nodes and its own load): crate::http::boot.
    if [
        mprov_api::boot::EVENTS_PATH,
        mprov_api::boot::MANIFEST_PATH,
        mprov_api::boot::HEARTBEAT_PATH,
    ]
    .contains(&path)
    {
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
        Principal::ApiKey { shared, .. } => match (shared, mode) {
            (false, _) | (true, SharedKeyMode::All) => Ok(()),
            (true, SharedKeyMode::Off) => Err(AccessError::Unauthorized(
                "the shared API key is turned off (MPROV_SHARED_KEY_MODE=off); enroll with a token instead".into(),
            )),
            (true, SharedKeyMode::Nodes) => node_self(db, None, method, path, query)
                .await
                .map_err(|_| {
                    forbid("MPROV_SHARED_KEY_MODE=nodes: the shared API key only reaches what a node does to itself")
                }),
        },
        Principal::Machine(agent) if agent.is_node() => {
            if path == "/enroll/renew/" {
                return Ok(());
            }
            node_self(db, Some(&agent.identity), method, path, query)
                .await
                .map_err(|()| {
                    forbid(&format!(
                        "a node's certificate reaches only its own system ({})",
                        agent.identity
                    ))
                })
        }
        Principal::Machine(agent) => jobserver(db, &agent.identity, method, path, read).await,
    }
}

/// Node-self requests; `hostname` is the node's (None: any node, for the
/// shared key).
async fn node_self(
    db: &Db,
    hostname: Option<&str>,
    method: Method,
    path: &str,
    query: Option<&str>,
) -> Result<(), ()> {
    let allowed_method = matches!(method, Method::Get | Method::Head | Method::Patch);
    let Some((kind, key, rest)) = api_parts(path) else {
        return Err(());
    };
    if !allowed_method {
        return Err(());
    }
    let own_id = match hostname {
        Some(h) => Some(system_id(db, h).await.ok_or(())?),
        None => None,
    };
    let is_own = |id: Option<i64>| match own_id {
        None => id.is_some(),
        Some(own) => id == Some(own),
    };
    match (kinds::visibility(kind).nodes, key, rest) {
        (NodeAccess::Itself, Some(key), None | Some("config")) => {
            if rest.is_some() && method != Method::Get {
                return Err(());
            }
            let id = system_id(db, key).await;
            if is_own(id) { Ok(()) } else { Err(()) }
        }
        (NodeAccess::OwnedVia(field), Some(key), None) => {
            let k = kinds::kind(kind).ok_or(())?;
            let obj = db.get(k, key).await.map_err(|_| ())?;
            if is_own(obj.get(field).and_then(Value::as_i64)) {
                Ok(())
            } else {
                Err(())
            }
        }
        (NodeAccess::OwnedVia(field), None, None) if method == Method::Get => {
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
            let id = system_id(db, &system).await;
            if is_own(id) { Ok(()) } else { Err(()) }
        }
        _ => Err(()),
    }
}

/// A system's id from its id or host name.
async fn system_id(db: &Db, key: &str) -> Option<i64> {
    let k = kinds::kind("systems")?;
    let obj = db.get(k, key).await.ok()?;
    obj.get("id").and_then(Value::as_i64)
}

async fn jobserver(
    db: &Db,
    name: &str,
    method: Method,
    path: &str,
    read: bool,
) -> Result<(), AccessError> {
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
    let Some((resource, key, rest)) = api_parts(path) else {
        return Err(deny());
    };
    if !kinds::visibility(resource).jobservers {
        return Err(deny());
    }
    if read {
        return Ok(());
    }
    // What it may write of a kind, the kind's descriptor says.
    let Some(k) = kinds::kind(resource) else {
        return Err(deny());
    };
    match (k.jobserver_writes, key, rest) {
        // Its own hosting: /api/v1/<kind>/{key}/hosts/{itself}.
        (JobServerWrite::Hosts(_), Some(_), Some(rest))
            if matches!(method, Method::Put | Method::Delete)
                && rest.strip_prefix("hosts/") == Some(name) =>
        {
            Ok(())
        }
        (JobServerWrite::Claimed(field), Some(key), None) if method == Method::Patch => {
            let row = db.get(k, key).await.map_err(|_| deny())?;
            let Some(Ty::Ref(jobservers)) = k.field(field).map(|f| f.ty) else {
                return Err(deny());
            };
            let js = kinds::kind(jobservers).ok_or_else(deny)?;
            let own = db.get(js, name).await.map_err(|_| deny())?;
            if row.get(field).and_then(Value::as_i64).is_some() && row.get(field) == own.get("id") {
                Ok(())
            } else {
                Err(deny())
            }
        }
        _ => Err(deny()),
    }
}
