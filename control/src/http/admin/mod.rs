//! The admin pages under `/admin/`, where most admins meet mProv.
//!
//! Server-rendered HTML from askama templates (`control/templates/admin/`,
//! checked when the crate compiles), a little JavaScript from
//! `/admin/static/` and nothing from any other origin
//! (`Content-Security-Policy: default-src 'self'`); every form works
//! without JavaScript. A page reads the domain (the kinds, the node view,
//! the access rules) like an API handler does and adds no rule of its own.
//!
//! Who is signed in is a session ([`crate::sessions`]): a cookie
//! (HttpOnly, SameSite=Strict, Secure over HTTPS) whose session becomes the
//! same [`crate::identity::Principal::User`] a password on the API would,
//! so read-only users read everything and change nothing by the same rules.
//! Every post carries the session's CSRF token, and a post from another
//! site is refused before it reaches a handler ([`page::session_layer`]).

pub mod account;
pub mod assets;
pub mod board;
pub mod bulk;
pub mod dashboard;
pub mod details;
pub mod discovery;
pub mod identities;
pub mod inventory;
pub mod page;
pub mod sections;
pub mod signin;
pub mod timing;

use axum::Router;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Redirect};
use axum::routing::{get, post};

use super::AppState;
use page::PageError;

/// The pages' routes: the sign-in form and the static files for anyone,
/// everything else for a session.
pub fn router(state: AppState) -> Router<AppState> {
    let open = Router::new()
        .route("/admin", get(|| async { Redirect::permanent("/admin/") }))
        .route("/admin/signin", get(signin::form).post(signin::submit))
        .route("/admin/signin/passkey", post(signin::passkey_submit))
        .route(
            "/admin/signin/passkey/options",
            post(signin::passkey_options),
        )
        .route("/admin/static/{name}", get(assets::serve));
    let signed_in = Router::new()
        .route("/admin/", get(dashboard::show))
        .route("/admin/board/", get(board::show))
        .route("/admin/board/events", get(board::events))
        .route("/admin/systems/{key}/timeline", get(board::timeline))
        .route("/admin/signout", post(signin::sign_out))
        .route("/admin/identities/", get(identities::show))
        .route("/admin/identities/tokens", post(identities::new_token))
        .route("/admin/identities/apikeys", post(identities::new_apikey))
        .route(
            "/admin/identities/apikeys/{id}/revoke",
            post(identities::revoke_apikey),
        )
        .route(
            "/admin/identities/credentials/{id}/revoke",
            post(identities::revoke_credential),
        )
        .route("/admin/discovery/", get(discovery::show))
        .route("/admin/discovery/{mac}/assign", post(discovery::assign))
        .route("/admin/discovery/{mac}/dismiss", post(discovery::dismiss))
        .route("/admin/account/", get(account::show))
        .route("/admin/account/passkeys", post(account::register))
        .route("/admin/account/passkeys/options", post(account::options))
        .route("/admin/account/passkeys/{id}/delete", post(account::delete))
        .route("/admin/systems/bulk", get(bulk::form).post(bulk::apply))
        .route("/admin/audit/", get(bulk::audit))
        .route("/admin/images/{key}/rebuild", post(details::rebuild))
        .route("/admin/jobs/{key}/retry", post(details::retry))
        .route("/admin/{kind}/", get(inventory::list))
        .route(
            "/admin/{kind}/new",
            get(inventory::new_form).post(inventory::create),
        )
        .route(
            "/admin/{kind}/{key}/",
            get(inventory::edit_form).post(inventory::update),
        )
        .route(
            "/admin/{kind}/{key}/delete",
            get(inventory::delete_form).post(inventory::delete),
        )
        .route(
            "/admin/{kind}/{key}/{rel}/",
            get(inventory::members).post(inventory::link),
        )
        // Any other path under a kind's pages (a catch-all would clash with
        // the kinds' routes).
        .route("/admin/{kind}", get(no_page))
        .route("/admin/{kind}/{key}", get(no_page))
        .route("/admin/{kind}/{key}/{rel}/{*rest}", get(no_page))
        .route_layer(from_fn(page::require_session))
        .route_layer(from_fn_with_state(state.clone(), timing::layer));
    open.merge(signed_in)
        .layer(from_fn_with_state(state, page::session_layer))
}

async fn no_page() -> axum::response::Response {
    PageError::not_found("no such page").into_response()
}
