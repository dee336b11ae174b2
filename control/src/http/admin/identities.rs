//! Agent Identities (the original's names, which users know): Job Server
//! Enrollment Tokens (each shown once), Agent Credentials (with revoke) and
//! API Keys (each shown once, with revoke). Every action is the API's own
//! (`enrollment::new_token`, `enrollment::revoke_credential`, the
//! `apikeys` kind) under the API's own access rule ([`page::allow`]).

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::page::{self, Chrome, PageError, Posted};
use crate::access::Method;
use crate::db::crud::{self, ListQuery, Mode};
use crate::db::kinds;
use crate::enrollment::{self, Credential, Purpose, TokenRequest};
use crate::http::AppState;
use crate::sessions::Session;

/// How many credentials the page lists (newest first); `?identity=`
/// narrows the list to one node or job server.
const CREDENTIALS_SHOWN: usize = 200;

struct ApiKeyRow {
    id: i64,
    name: String,
    prefix: String,
    created: String,
    expires: String,
    revoked: bool,
}

/// A secret just made, shown on this one answer only.
struct Shown {
    what: &'static str,
    secret: String,
    note: String,
}

#[derive(Template)]
#[template(path = "admin/identities.html")]
struct IdentitiesPage {
    chrome: Chrome,
    shown: Option<Shown>,
    error: Option<String>,
    identity: String,
    credentials: Vec<Credential>,
    more_credentials: bool,
    apikeys: Vec<ApiKeyRow>,
}

/// The query of the page.
#[derive(Debug, Default, Deserialize)]
pub struct IdentitiesQuery {
    /// Only this node's or job server's credentials.
    #[serde(default)]
    identity: Option<String>,
}

fn text(o: &Map<String, Value>, k: &str) -> String {
    match o.get(k) {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    }
}

async fn page(
    state: &AppState,
    session: &Session,
    identity: Option<&str>,
    shown: Option<Shown>,
    error: Option<String>,
) -> Result<Response, PageError> {
    page::allow(state, session, Method::Get, "credentials", None, None).await?;
    let filter: Vec<(String, String)> = identity
        .filter(|i| !i.is_empty())
        .map(|i| vec![("identity".to_owned(), i.to_owned())])
        .unwrap_or_default();
    let mut credentials =
        enrollment::list_credentials(&state.db, filter.iter().map(|(k, v)| (k, v))).await?;
    let more_credentials = credentials.len() > CREDENTIALS_SHOWN;
    credentials.truncate(CREDENTIALS_SHOWN);
    let kind = kinds::kind("apikeys").ok_or_else(|| PageError::not_found("apikeys"))?;
    let apikeys = state
        .db
        .list(
            kind,
            &ListQuery {
                sort: Some("-id".into()),
                limit: Some(crud::MAX_LIMIT),
                ..ListQuery::default()
            },
        )
        .await?
        .items
        .iter()
        .map(|o| ApiKeyRow {
            id: o.get("id").and_then(Value::as_i64).unwrap_or_default(),
            name: text(o, "name"),
            prefix: text(o, "prefix"),
            created: text(o, "created_at"),
            expires: text(o, "expires_at"),
            revoked: o.get("revoked").and_then(Value::as_bool).unwrap_or(false),
        })
        .collect();
    let failed = error.is_some();
    let mut resp = page::render(&IdentitiesPage {
        chrome: Chrome::new(state, session, "Agent identities", "identities"),
        shown,
        error,
        identity: identity.unwrap_or_default().to_owned(),
        credentials,
        more_credentials,
        apikeys,
    });
    if failed {
        *resp.status_mut() = axum::http::StatusCode::BAD_REQUEST;
    }
    Ok(resp)
}

/// `GET /admin/identities/`.
pub async fn show(
    State(state): State<AppState>,
    session: Session,
    Query(q): Query<IdentitiesQuery>,
) -> Result<Response, PageError> {
    page(&state, &session, q.identity.as_deref(), None, None).await
}

/// `POST /admin/identities/tokens`: a Job Server Enrollment Token for one
/// job server name, shown on this answer only (`no-store`: never cached).
pub async fn new_token(
    State(state): State<AppState>,
    posted: Posted,
) -> Result<Response, PageError> {
    let Posted { session, fields } = posted;
    page::allow(&state, &session, Method::Post, "enroll-tokens", None, None).await?;
    let name = fields.get("name").unwrap_or_default().trim().to_owned();
    let hours = match fields.get("hours").map(str::trim).filter(|h| !h.is_empty()) {
        None => None,
        Some(h) => match h.parse::<u32>() {
            Ok(h) => Some(h),
            Err(_) => {
                return page(
                    &state,
                    &session,
                    None,
                    None,
                    Some(format!("hours: {h:?} is not a whole number of hours")),
                )
                .await;
            }
        },
    };
    let purpose = match fields.get("purpose") {
        Some("replace") => Purpose::Replace,
        _ => Purpose::New,
    };
    let request = TokenRequest {
        name: name.clone(),
        hours,
        purpose: Some(purpose),
    };
    match enrollment::new_token(&state.db, request).await {
        Ok(token) => {
            let shown = Shown {
                what: "Job server enrollment token",
                secret: token.token,
                note: format!(
                    "for job server {name}, valid until {} ({}). It is shown only now: copy it into the job server's config (enroll_token) or pass it to `mprov-jobserver --enroll-token`.",
                    token.expires_at,
                    if purpose == Purpose::Replace {
                        "replaces its certificate"
                    } else {
                        "a new job server"
                    },
                ),
            };
            page(&state, &session, None, Some(shown), None).await
        }
        Err(e) => {
            let (_, _, message, _) = crate::http::error::ApiError::from(e).parts();
            page(&state, &session, None, None, Some(message)).await
        }
    }
}

/// `POST /admin/identities/credentials/{id}/revoke`: the certificate stops
/// working at once.
pub async fn revoke_credential(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    posted: Posted,
) -> Result<Response, PageError> {
    let key = id.to_string();
    page::allow(
        &state,
        &posted.session,
        Method::Post,
        "credentials",
        Some(&key),
        Some("revoke"),
    )
    .await?;
    enrollment::revoke_credential(&state.db, id).await?;
    let back = posted.fields.get("identity").unwrap_or_default();
    let q: String = url::form_urlencoded::byte_serialize(back.as_bytes()).collect();
    Ok(Redirect::to(&format!("/admin/identities/?identity={q}#credentials")).into_response())
}

/// `POST /admin/identities/apikeys`: a new API key, shown on this answer only.
pub async fn new_apikey(
    State(state): State<AppState>,
    posted: Posted,
) -> Result<Response, PageError> {
    let Posted { session, fields } = posted;
    page::allow(&state, &session, Method::Post, "apikeys", None, None).await?;
    let kind = kinds::kind("apikeys").ok_or_else(|| PageError::not_found("apikeys"))?;
    let mut body = Map::new();
    body.insert(
        "name".into(),
        Value::String(fields.get("name").unwrap_or_default().trim().to_owned()),
    );
    if let Some(exp) = fields
        .get("expires_at")
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        body.insert("expires_at".into(), Value::String(exp.to_owned()));
    }
    let prepared = match crud::validate(kind, &body, Mode::Create, &state.secrets, "") {
        Ok(p) => p,
        Err(errors) => {
            let message = errors
                .iter()
                .map(|e| format!("{}: {}", e.path, e.message))
                .collect::<Vec<_>>()
                .join("; ");
            return page(&state, &session, None, None, Some(message)).await;
        }
    };
    let obj = state.db.create(kind, prepared).await?;
    state.changed.notify_waiters();
    let field = kind.issues.map(|i| i.field()).unwrap_or("key");
    let shown = Shown {
        what: "API key",
        secret: text(&obj, field),
        note: format!(
            "named {}. It is shown only now: the control service keeps only its hash. Use it as `Authorization: Api-Key <key>` or in mash's config.",
            text(&obj, "name")
        ),
    };
    let mut resp = page(&state, &session, None, Some(shown), None).await?;
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    Ok(resp)
}

/// `POST /admin/identities/apikeys/{id}/revoke`.
pub async fn revoke_apikey(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    posted: Posted,
) -> Result<Response, PageError> {
    let key = id.to_string();
    page::allow(
        &state,
        &posted.session,
        Method::Patch,
        "apikeys",
        Some(&key),
        None,
    )
    .await?;
    let kind = kinds::kind("apikeys").ok_or_else(|| PageError::not_found("apikeys"))?;
    let mut body = Map::new();
    body.insert("revoked".into(), Value::Bool(true));
    let prepared = crud::validate(kind, &body, Mode::Update, &state.secrets, "")
        .map_err(|e| PageError(crud::field_errors(e).into()))?;
    state.db.update(kind, &key, prepared).await?;
    state.changed.notify_waiters();
    Ok(Redirect::to("/admin/identities/#apikeys").into_response())
}
