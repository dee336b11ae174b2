//! The two actions the pages of an image and a job offer beneath their
//! inventory form (what those pages show is `super::sections`'s):
//!
//! - a Rebuild button (`POST /admin/images/{key}/rebuild`), which makes the
//!   API's rebuild write ([`jobs::rebuild`]);
//! - a Retry button for a failed job (`POST /admin/jobs/{key}/retry`, which
//!   calls [`jobs::retry`], as `POST /api/v1/jobs/{key}/retry` does).
//!
//! The buttons are forms with the session's CSRF token ([`Posted`]), and
//! who may press them is the API's access rule for the same write
//! ([`page::allow`]): read-only users see the pages without them.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::Value;

use super::page::{self, PageError, Posted};
use crate::access::Method;
use crate::http::AppState;
use crate::jobs;

/// Refuses any field a button's form does not send.
fn no_fields(posted: &Posted, what: &str) -> Result<(), PageError> {
    match posted.fields.0.iter().find(|(k, _)| !k.starts_with('_')) {
        Some((k, _)) => Err(PageError::invalid(
            k,
            format!("unknown field; {what} takes none"),
        )),
        None => Ok(()),
    }
}

/// `POST /admin/images/{key}/rebuild`: requests a rebuild, then back to the
/// image's page.
pub async fn rebuild(
    State(st): State<AppState>,
    Path(key): Path<String>,
    posted: Posted,
) -> Result<Response, PageError> {
    page::allow(
        &st,
        &posted.session,
        Method::Patch,
        "images",
        Some(&key),
        None,
    )
    .await?;
    no_fields(&posted, "a rebuild")?;
    let image = jobs::rebuild(&st.db, &st.secrets, &key).await?;
    st.changed.notify_waiters();
    let id = image.get("id").and_then(Value::as_i64).unwrap_or_default();
    tracing::info!(image = %key, user = %posted.session.username, "images: a rebuild was requested from the admin pages");
    Ok(Redirect::to(&format!("/admin/images/{id}/?rebuilt=1")).into_response())
}

/// `POST /admin/jobs/{key}/retry`: queues a failed job again, then back to
/// its page; any other job is refused with its state (409).
pub async fn retry(
    State(st): State<AppState>,
    Path(key): Path<String>,
    posted: Posted,
) -> Result<Response, PageError> {
    page::allow(
        &st,
        &posted.session,
        Method::Post,
        "jobs",
        Some(&key),
        Some("retry"),
    )
    .await?;
    no_fields(&posted, "a retry")?;
    let id = jobs::retry(&st.db, &key, jiff::Timestamp::now()).await?;
    st.changed.notify_waiters();
    tracing::info!(job = id, user = %posted.session.username, "jobs: a failed job was queued again from the admin pages");
    Ok(Redirect::to(&format!("/admin/jobs/{id}/?retried=1")).into_response())
}
