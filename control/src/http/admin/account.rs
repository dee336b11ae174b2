//! The signed-in user's account (`/admin/account/`): their passkeys (name,
//! registered, last used), registering a new one, deleting one.
//!
//! Registering needs the browser's WebAuthn API, so it is the one form here
//! that needs JavaScript (`/admin/static/passkeys.js`): the script posts the
//! form's CSRF token for the options ([`options`]), asks the authenticator
//! (`navigator.credentials.create`), puts its answer in the form's hidden
//! `response` field and submits the form ([`register`]). The checks are
//! all `crate::passkeys`'s; deleting is a plain form.

use askama::Template;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{Extensions, HeaderMap};
use axum::response::{IntoResponse, Redirect, Response};

use super::page::{self, Chrome, PageError, Posted};
use crate::http::AppState;
use crate::passkeys::{self, RegistrationResponse};
use crate::sessions::Session;

struct Row {
    id: i64,
    name: String,
    created: String,
    last_used: String,
}

#[derive(Template)]
#[template(path = "admin/account.html")]
struct AccountPage {
    chrome: Chrome,
    passkeys: Vec<Row>,
    max_name: usize,
}

/// `GET /admin/account/`.
pub async fn show(State(state): State<AppState>, session: Session) -> Result<Response, PageError> {
    let list = passkeys::list(&state.db, &session.username).await?;
    let chrome = Chrome::new(&state, &session, "Your account", "account");
    let rows = list
        .into_iter()
        .map(|p| Row {
            id: p.id,
            name: p.name,
            created: chrome.time(&p.created_at),
            last_used: p
                .last_used_at
                .map(|t| chrome.time(&t))
                .unwrap_or_else(|| "never".into()),
        })
        .collect();
    Ok(page::render(&AccountPage {
        chrome,
        passkeys: rows,
        max_name: passkeys::MAX_NAME,
    }))
}

/// `POST /admin/account/passkeys/options`: the options for
/// `navigator.credentials.create`, as JSON.
pub async fn options(
    State(state): State<AppState>,
    headers: HeaderMap,
    extensions: Extensions,
    posted: Posted,
) -> Result<Response, PageError> {
    let site = page::passkey_site(&state, &headers, &extensions)?;
    let opts = passkeys::registration_options(&state.db, &site, &posted.session.username).await?;
    Ok(Json(opts).into_response())
}

/// `POST /admin/account/passkeys`: registers the passkey in the form's
/// `response` (the authenticator's answer as JSON) under `name`.
pub async fn register(
    State(state): State<AppState>,
    headers: HeaderMap,
    extensions: Extensions,
    posted: Posted,
) -> Result<Response, PageError> {
    let site = page::passkey_site(&state, &headers, &extensions)?;
    let name = posted.fields.get("name").unwrap_or_default();
    let response: RegistrationResponse =
        serde_json::from_str(posted.fields.get("response").unwrap_or_default()).map_err(|e| {
            PageError::invalid(
                "response",
                format!(
                    "no passkey came with the form ({e}): registering a passkey needs JavaScript and a browser with passkeys"
                ),
            )
        })?;
    passkeys::register(&state.db, &site, &posted.session.username, name, &response).await?;
    Ok(Redirect::to("/admin/account/").into_response())
}

/// `POST /admin/account/passkeys/{id}/delete`: deletes one of the user's
/// own passkeys.
pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    posted: Posted,
) -> Result<Response, PageError> {
    passkeys::delete(&state.db, &posted.session.username, id).await?;
    Ok(Redirect::to("/admin/account/").into_response())
}
