//! Discovery over HTTP: thin handlers over [`crate::discovery`].
//!
//! - `POST /api/v1/discovery/report` ([`REPORT_PATH`]): public; the
//!   one-time discovery nonce in [`NONCE_HEADER`] is the credential, and
//!   it is good for this route only (no other handler reads the header).
//!   The body is a [`NadsReport`] (a body that is not one is a 400 saying
//!   why); the answer a [`ReportOutcome`].
//! - `GET /api/v1/discovery/?after=<id>&limit=<n>`: the parked nodes, in
//!   id order, a page at a time (`next` is the next page's `after`).
//! - `POST /api/v1/discovery/{mac}/assign` `{system, nic, replace?}` and
//!   `DELETE /api/v1/discovery/{mac}`: an admin binds or forgets a parked
//!   node. Both are inventory writes, so [`crate::access::check`] lets
//!   admins only; job servers' and nodes' certificates reach none of this.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use mprov_api::nads::{NONCE_HEADER, NadsReport, REPORT_PATH, ReportOutcome};
use serde::Deserialize;

use super::AppState;
use super::error::ApiError;
use crate::discovery::store::{self, Assigned, DiscoveryError, Page};
use crate::identity::Principal;

/// The largest report accepted: a node with dozens of links fits in a few
/// KiB, and the parked row keeps the whole report.
pub const MAX_REPORT_BYTES: usize = 32 * 1024;

/// `POST /api/v1/discovery/report`.
pub async fn report(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<ReportOutcome>), ApiError> {
    let nonce = headers
        .get(NONCE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if nonce.as_deref().is_none_or(|n| n.trim().is_empty()) {
        return Err(DiscoveryError::NonceMissing.into());
    }
    let report: NadsReport = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "invalid_report",
            format!("the body is not a NADS report (see {REPORT_PATH} in the API document): {e}"),
        )
    })?;
    let applied =
        store::report(&st.db, nonce.as_deref(), report, st.config.discovery_policy).await?;
    st.changed.notify_waiters();
    if !applied.decided.warnings.is_empty() {
        st.boot_events.notify_waiters();
    }
    Ok((StatusCode::OK, Json(applied.outcome)))
}

/// `GET /api/v1/discovery/`.
pub async fn list(
    State(st): State<AppState>,
    RawQuery(q): RawQuery,
) -> Result<Json<Page>, ApiError> {
    let (mut after, mut limit) = (0, 100);
    for (k, v) in url::form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        let n = || {
            v.parse::<i64>()
                .map_err(|_| ApiError::invalid(&k, "a whole number"))
        };
        match k.as_ref() {
            "after" => after = n()?,
            "limit" => limit = n()?,
            _ => {
                return Err(ApiError::invalid(
                    &k,
                    "unknown query parameter; the list takes after and limit",
                ));
            }
        }
    }
    if !(1..=store::MAX_PAGE).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            format!("between 1 and {}", store::MAX_PAGE),
        ));
    }
    Ok(Json(store::list(&st.db, after, limit).await?))
}

/// `POST /api/v1/discovery/{mac}/assign`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assign {
    /// The system: its id or host name.
    pub system: StringOrId,
    /// The NIC: its id, or its name on that system.
    pub nic: StringOrId,
    /// Replace the MAC the NIC has, if it has one.
    #[serde(default)]
    pub replace: bool,
}

/// An id or a name.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StringOrId {
    /// An id.
    Id(i64),
    /// A name (or an id as text).
    Name(String),
}

impl StringOrId {
    fn text(&self) -> String {
        match self {
            StringOrId::Id(id) => id.to_string(),
            StringOrId::Name(n) => n.clone(),
        }
    }
}

/// The MAC of a path, in the stored form.
fn path_mac(mac: &str) -> Result<String, ApiError> {
    crate::db::crud::parse_mac(mac).map_err(|e| ApiError::invalid("mac", e))
}

/// `POST /api/v1/discovery/{mac}/assign` (admins).
pub async fn assign(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    Path(mac): Path<String>,
    body: Bytes,
) -> Result<Json<Assigned>, ApiError> {
    let mac = path_mac(&mac)?;
    let body: Assign = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "invalid_body",
            format!("an assignment is {{\"system\": <id or host name>, \"nic\": <id or name>, \"replace\": false}}: {e}"),
        )
    })?;
    let assigned = assign_as(&st, &principal, &mac, &body).await?;
    Ok(Json(assigned))
}

/// Assigns `mac` as `body` says, on behalf of `principal`.
async fn assign_as(
    st: &AppState,
    principal: &Principal,
    mac: &str,
    body: &Assign,
) -> Result<Assigned, ApiError> {
    let by = match principal {
        Principal::User { username, .. } => format!("user:{username}"),
        Principal::ApiKey { name, .. } => format!("apikey:{name}"),
        _ => "?".to_owned(),
    };
    let assigned = store::assign(
        &st.db,
        mac,
        &body.system.text(),
        &body.nic.text(),
        body.replace,
        &by,
    )
    .await?;
    st.changed.notify_waiters();
    Ok(assigned)
}

/// `DELETE /api/v1/discovery/{mac}` (admins).
pub async fn dismiss(
    State(st): State<AppState>,
    Path(mac): Path<String>,
) -> Result<StatusCode, ApiError> {
    let mac = path_mac(&mac)?;
    store::dismiss(&st.db, &mac).await?;
    Ok(StatusCode::NO_CONTENT)
}
