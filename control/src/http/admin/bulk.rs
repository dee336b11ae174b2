//! `/admin/systems/bulk`: a bulk action on the systems a filter matches,
//! and `/admin/audit/`: the log those actions write.
//!
//! The page follows [`crate::bulk`]'s rule: the GET shows the preview (the
//! count and the first host names) and, to admins, a form that carries
//! that count with the session's CSRF token; the POST applies the action
//! only if the filter still matches that many systems, then shows the
//! audit log. A changed count shows the new preview with the reason (409).
//! Read-only users see the preview and no button, and their POST is
//! refused by the access rules (403) like an API write.

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};

use super::page::query_string;
use super::page::{self, Chrome, PageError, Posted};
use crate::access::Method;
use crate::bulk::{self, Action, BulkError};
use crate::db::crud::filter::Filter;
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::sessions::Session;

/// How many audit entries one page shows.
const AUDIT_ROWS: u64 = 50;

/// An action as the form offers it.
struct Choice {
    name: &'static str,
    label: &'static str,
}

const CHOICES: [Choice; 5] = [
    Choice {
        name: "add_to_group",
        label: "Add to group",
    },
    Choice {
        name: "remove_from_group",
        label: "Remove from group",
    },
    Choice {
        name: "set_image",
        label: "Set image",
    },
    Choice {
        name: "set_netboot",
        label: "Set netboot (on or off)",
    },
    Choice {
        name: "run_scripts",
        label: "Run post-boot scripts again",
    },
];

#[derive(Template)]
#[template(path = "admin/bulk.html")]
struct BulkPage {
    chrome: Chrome,
    filter: String,
    action: String,
    arg: String,
    choices: &'static [Choice],
    /// Why the filter, the action or the apply failed.
    error: String,
    /// Which box the error is about (`filter`, `arg`, or empty).
    error_field: String,
    /// The preview, once an action is chosen and valid.
    preview: Option<bulk::Preview>,
    /// The systems list of this filter.
    list_href: String,
}

/// The form's values: the filter, the action and its argument.
struct Asked {
    filter: String,
    action: String,
    arg: String,
}

impl Asked {
    fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Asked {
        let mut a = Asked {
            filter: String::new(),
            action: String::new(),
            arg: String::new(),
        };
        for (k, v) in pairs {
            match k.as_str() {
                "filter" => a.filter = v,
                "action" => a.action = v,
                "arg" => a.arg = v,
                _ => {}
            }
        }
        a
    }

    /// The parsed filter and action; the error with the box it is about.
    fn parse(&self) -> Result<(Filter, Action), (String, &'static str)> {
        let filter = Filter::parse(&self.filter).map_err(|e| (e.to_string(), "filter"))?;
        let action = Action::parse(&self.action, Some(&self.arg)).map_err(|e| {
            let field = match &e {
                BulkError::Invalid {
                    field: "action", ..
                } => "action",
                _ => "arg",
            };
            (e.to_string(), field)
        })?;
        Ok((filter, action))
    }
}

/// The page for `asked`: its preview when the filter and action are
/// valid, and `error` (else the reason they are not) with the status to
/// send.
async fn show_page(
    st: &AppState,
    session: &Session,
    asked: Asked,
    mut error: Option<(String, &'static str, StatusCode)>,
) -> Result<Response, PageError> {
    let mut preview = None;
    let invalid = |message, field| Some((message, field, StatusCode::BAD_REQUEST));
    if asked.action.is_empty() {
        if let Err(e) = Filter::parse(&asked.filter) {
            error = error.or(invalid(e.to_string(), "filter"));
        }
    } else {
        match asked.parse() {
            Err((message, field)) => error = error.or(invalid(message, field)),
            Ok((filter, action)) => match bulk::preview(&st.db, &filter, &action).await {
                Ok(p) => preview = Some(p),
                Err(BulkError::Invalid { message, .. }) => {
                    error = error.or(invalid(message, "arg"))
                }
                Err(e) => return Err(PageError(ApiError::from(e))),
            },
        }
    }
    let status = error.as_ref().map_or(StatusCode::OK, |e| e.2);
    let (error, error_field) = error.map(|(m, f, _)| (m, f.to_owned())).unwrap_or_default();
    let mut response = page::render(&BulkPage {
        chrome: Chrome::new(st, session, "Bulk action on systems", "systems"),
        list_href: format!(
            "/admin/systems/{}",
            query_string([("filter", asked.filter.as_str())])
        ),
        filter: asked.filter,
        action: asked.action,
        arg: asked.arg,
        choices: &CHOICES,
        error,
        error_field,
        preview,
    });
    if response.status().is_success() {
        *response.status_mut() = status;
    }
    Ok(response)
}

/// `GET /admin/systems/bulk?filter=&action=&arg=`.
pub async fn form(
    State(st): State<AppState>,
    session: Session,
    RawQuery(raw): RawQuery,
) -> Result<Response, PageError> {
    let raw = raw.unwrap_or_default();
    let pairs = url::form_urlencoded::parse(raw.as_bytes()).into_owned();
    show_page(&st, &session, Asked::from_pairs(pairs), None).await
}

/// `POST /admin/systems/bulk`: applies the action if the filter still
/// matches `confirm_count` systems, then shows the audit log.
pub async fn apply(State(st): State<AppState>, posted: Posted) -> Result<Response, PageError> {
    let Posted { session, fields } = posted;
    page::allow(
        &st,
        &session,
        Method::Post,
        "systems",
        Some("actions"),
        None,
    )
    .await?;
    let asked = Asked::from_pairs(fields.0.iter().cloned());
    let confirmed = match fields.get("confirm_count").map(str::parse::<u64>) {
        Some(Ok(n)) => n,
        _ => {
            let e = (
                "confirm_count: the form carries no count; preview the action again".to_owned(),
                "",
                StatusCode::BAD_REQUEST,
            );
            return show_page(&st, &session, asked, Some(e)).await;
        }
    };
    let (filter, action) = match asked.parse() {
        Ok(parsed) => parsed,
        Err(_) => return show_page(&st, &session, asked, None).await,
    };
    match bulk::apply(
        &st.db,
        &session.username,
        &asked.filter,
        &filter,
        &action,
        confirmed,
    )
    .await
    {
        Ok(count) => {
            tracing::info!(who = %session.username, action = action.name(), filter = %asked.filter, count, "bulk action applied");
            st.changed.notify_waiters();
            Ok(Redirect::to("/admin/audit/").into_response())
        }
        Err(e @ BulkError::CountChanged { .. }) => {
            // The new preview, with why nothing was applied.
            show_page(
                &st,
                &session,
                asked,
                Some((e.to_string(), "", StatusCode::CONFLICT)),
            )
            .await
        }
        Err(BulkError::Invalid { message, .. }) => {
            show_page(
                &st,
                &session,
                asked,
                Some((message, "arg", StatusCode::BAD_REQUEST)),
            )
            .await
        }
        Err(e) => Err(PageError(ApiError::from(e))),
    }
}

struct AuditRow {
    id: i64,
    at: String,
    who: String,
    action: String,
    detail: String,
    count: i64,
    filter: String,
    filter_href: String,
}

#[derive(Template)]
#[template(path = "admin/audit.html")]
struct AuditPage {
    chrome: Chrome,
    rows: Vec<AuditRow>,
    next: String,
    deep: bool,
}

/// `GET /admin/audit/?cursor=`: newest first.
pub async fn audit(
    State(st): State<AppState>,
    session: Session,
    RawQuery(raw): RawQuery,
) -> Result<Response, PageError> {
    let cursor = url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .into_owned()
        .find(|(k, _)| k == "cursor")
        .map(|(_, v)| v);
    let page = bulk::audit(&st.db, Some(AUDIT_ROWS), cursor.as_deref()).await?;
    let chrome = Chrome::new(&st, &session, "Audit log", "audit");
    let rows = page
        .items
        .into_iter()
        .map(|e| AuditRow {
            id: e.id,
            at: chrome.time(&e.at),
            who: e.who,
            action: e.action,
            detail: e.detail,
            count: e.count,
            filter_href: format!(
                "/admin/systems/{}",
                query_string([("filter", e.filter.as_str())])
            ),
            filter: e.filter,
        })
        .collect();
    Ok(page::render(&AuditPage {
        chrome,
        rows,
        next: page
            .next
            .map(|c| query_string([("cursor", c.as_str())]))
            .unwrap_or_default(),
        deep: cursor.is_some(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bulk::ACTIONS;

    /// The form offers every action the domain knows, once.
    #[test]
    fn the_form_offers_every_action() {
        let mut offered: Vec<&str> = CHOICES.iter().map(|c| c.name).collect();
        offered.sort_unstable();
        assert_eq!(offered, ACTIONS);
    }
}
