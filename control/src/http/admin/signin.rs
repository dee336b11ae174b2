//! Signing in and out of the admin pages.
//!
//! The sign-in form has no session yet to hold a CSRF token, so it carries
//! its own: a random value in a cookie scoped to the form (SameSite=Strict)
//! and the same value in a hidden field, which must match (a login CSRF
//! would otherwise sign a victim in as the attacker).

use askama::Template;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::page::{self, PageError, Posted, SESSION_COOKIE, SIGNIN_COOKIE};
use crate::http::AppState;
use crate::http::auth::client_ip;
use crate::http::error::ApiError;
use crate::identity::{self, IdentityError, Principal};
use crate::ldap::{self, LdapError, LdapRole};
use crate::passkeys::{self, AuthenticationResponse};
use crate::sessions::{self, Method, Session};

/// Where the sign-in cookie is sent.
const SIGNIN_PATH: &str = "/admin/signin";

#[derive(Template)]
#[template(path = "admin/signin.html")]
struct SignInPage {
    csrf: String,
    next: String,
    username: String,
    message: Option<String>,
    error: Option<String>,
    asset_version: &'static str,
}

/// The query of the sign-in page.
#[derive(Debug, Deserialize)]
pub struct SignInQuery {
    /// Where to go once signed in.
    #[serde(default)]
    next: Option<String>,
    /// Set after signing out.
    #[serde(default)]
    signed_out: Option<String>,
}

/// Only a page of ours is a place to go back to: a path under `/admin/`,
/// never another host (`//evil`, `/\evil`).
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with("/admin/")
                && !n.contains("//")
                && !n.contains('\\')
                && !n.chars().any(char::is_control) =>
        {
            n.to_owned()
        }
        _ => "/admin/".to_owned(),
    }
}

fn form_page(
    status: StatusCode,
    next: String,
    username: String,
    message: Option<String>,
    error: Option<String>,
    secure: bool,
) -> Response {
    let csrf = crate::secrets::random_token(32);
    let page = SignInPage {
        csrf: csrf.clone(),
        next,
        username,
        message,
        error,
        asset_version: env!("CARGO_PKG_VERSION"),
    };
    let mut resp = page::render(&page);
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::SET_COOKIE,
        page::set_cookie(SIGNIN_COOKIE, &csrf, SIGNIN_PATH, secure, None),
    );
    resp
}

/// `GET /admin/signin`: the form (or, already signed in, where it leads).
pub async fn form(Query(q): Query<SignInQuery>, req: Request) -> Response {
    let next = safe_next(q.next.as_deref());
    if req.extensions().get::<Session>().is_some() {
        return Redirect::to(&next).into_response();
    }
    let message = q.signed_out.map(|_| "You signed out.".to_owned());
    form_page(
        StatusCode::OK,
        next,
        String::new(),
        message,
        None,
        page::over_https(req.extensions()),
    )
}

/// `POST /admin/signin`: checks the password (the API's own check and
/// throttle), starts a session and goes where the form came from.
pub async fn submit(State(state): State<AppState>, req: Request) -> Response {
    let secure = page::over_https(req.extensions());
    let client = client_ip(&state, &req);
    let cookie = page::cookie(req.headers(), SIGNIN_COOKIE);
    let fields = match page::read_form(req, &state).await {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    if !form_token_matches(cookie.as_deref(), &fields) {
        return page::stale().into_response();
    }
    let next = safe_next(fields.get("next"));
    let username = fields.get("username").unwrap_or_default().trim().to_owned();
    let password = fields.get("password").unwrap_or_default();
    let again = |status, error: String| {
        form_page(
            status,
            next.clone(),
            username.clone(),
            None,
            Some(error),
            secure,
        )
    };
    if username.is_empty() || password.is_empty() {
        return again(
            StatusCode::BAD_REQUEST,
            "enter your user name and password".into(),
        );
    }
    let checked = identity::check_user_password(
        &state.db,
        &state.passwords,
        &state.throttle,
        &username,
        password,
        client,
    )
    .await;
    let (name, admin, method) = match checked {
        Ok(Principal::User { username, is_admin }) => (username, is_admin, Method::Password),
        Ok(_) => {
            return again(
                StatusCode::UNAUTHORIZED,
                "wrong user name or password".into(),
            );
        }
        // Not a local user (or not its password): the directory, when one
        // is configured. The attempt went through the password throttle
        // above first, so directory guesses are limited the same way.
        Err(IdentityError::Refused(m)) => match &state.config.ldap {
            None => return again(StatusCode::UNAUTHORIZED, m),
            Some(cfg) => match ldap::authenticate(cfg, &username, password).await {
                Ok(user) => {
                    // The local check counted this attempt as a wrong
                    // password; the directory's yes takes it back.
                    state.throttle.forgive(client, &username);
                    (user.name, user.role == LdapRole::Admin, Method::Ldap)
                }
                Err(
                    e @ (LdapError::BadCredentials
                    | LdapError::EmptyPassword
                    | LdapError::InvalidUserName(_)),
                ) => {
                    return again(StatusCode::UNAUTHORIZED, e.to_string());
                }
                Err(e @ LdapError::NotInGroup { .. }) => {
                    return again(StatusCode::FORBIDDEN, e.to_string());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "admin sign-in: the LDAP directory could not be asked");
                    return again(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "the directory could not be asked ({e}); local accounts still sign in"
                        ),
                    );
                }
            },
        },
        Err(IdentityError::Throttled { message, .. }) => {
            return again(StatusCode::TOO_MANY_REQUESTS, message);
        }
        Err(e) => return PageError::from(e).into_response(),
    };
    match sessions::start(&state.db, &name, admin, method, jiff::Timestamp::now()).await {
        Ok(started) => signed_in(&started.token, &next, secure),
        Err(e) => PageError::from(e).into_response(),
    }
}

/// Whether the sign-in form's `csrf` field is the value of its cookie.
fn form_token_matches(cookie: Option<&str>, fields: &page::Fields) -> bool {
    match (cookie, fields.get("csrf")) {
        (Some(c), Some(f)) => crate::secrets::hashes_equal(c, f),
        _ => false,
    }
}

/// `POST /admin/signin/passkey/options`: the options for
/// `navigator.credentials.get` (JSON), for the sign-in form's token.
pub async fn passkey_options(State(state): State<AppState>, req: Request) -> Response {
    let client = client_ip(&state, &req)
        .map_or_else(|| "an unknown address".to_owned(), |ip| ip.to_string());
    if let Err(e) = state.within_budget(&state.passkey_limiter, &client, "passkey sign-in starts") {
        return PageError::from(e).into_response();
    }
    let cookie = page::cookie(req.headers(), SIGNIN_COOKIE);
    let site = page::passkey_site(&state, req.headers(), req.extensions());
    let fields = match page::read_form(req, &state).await {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    if !form_token_matches(cookie.as_deref(), &fields) {
        return page::stale().into_response();
    }
    let site = match site {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    match passkeys::sign_in_options(&state.db, &site).await {
        Ok(opts) => axum::Json(opts).into_response(),
        Err(e) => PageError::from(e).into_response(),
    }
}

/// `POST /admin/signin/passkey`: checks the passkey's answer in the form's
/// `response` and starts the same session a password does, with the role
/// the user's row gives now.
pub async fn passkey_submit(State(state): State<AppState>, req: Request) -> Response {
    let secure = page::over_https(req.extensions());
    let cookie = page::cookie(req.headers(), SIGNIN_COOKIE);
    let site = page::passkey_site(&state, req.headers(), req.extensions());
    let fields = match page::read_form(req, &state).await {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    if !form_token_matches(cookie.as_deref(), &fields) {
        return page::stale().into_response();
    }
    let next = safe_next(fields.get("next"));
    let again = |status, error: String| {
        form_page(
            status,
            next.clone(),
            String::new(),
            None,
            Some(error),
            secure,
        )
    };
    let site = match site {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let response: AuthenticationResponse = match serde_json::from_str(
        fields.get("response").unwrap_or_default(),
    ) {
        Ok(r) => r,
        Err(_) => {
            return again(
                    StatusCode::BAD_REQUEST,
                    "no passkey came with the form: signing in with a passkey needs JavaScript and a browser with passkeys".into(),
                );
        }
    };
    let who = match passkeys::sign_in(&state.db, &site, &response).await {
        Ok(who) => who,
        Err(e) => {
            let err = ApiError::from(e);
            let (status, _, message, _) = err.parts();
            if status.is_server_error() {
                return PageError(err).into_response();
            }
            tracing::warn!(%message, "admin pages: a passkey sign-in was refused");
            return again(status, message);
        }
    };
    match sessions::start(
        &state.db,
        &who.username,
        who.is_admin,
        Method::Passkey,
        jiff::Timestamp::now(),
    )
    .await
    {
        Ok(started) => signed_in(&started.token, &next, secure),
        Err(e) => PageError::from(e).into_response(),
    }
}

/// The answer to a successful sign-in: the session cookie (a browser
/// session's: no expiry of its own; the server ends it), the sign-in
/// form's cookie removed, and on to `next`.
pub fn signed_in(token: &str, next: &str, secure: bool) -> Response {
    let mut resp = Redirect::to(next).into_response();
    let h = resp.headers_mut();
    h.append(
        header::SET_COOKIE,
        page::set_cookie(SESSION_COOKIE, token, "/admin", secure, None),
    );
    h.append(
        header::SET_COOKIE,
        page::set_cookie(SIGNIN_COOKIE, "", SIGNIN_PATH, secure, Some(0)),
    );
    resp
}

/// `POST /admin/signout`: ends the session on the server and drops the cookie.
pub async fn sign_out(
    State(state): State<AppState>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    _posted: Posted,
) -> Result<Response, PageError> {
    if let Some(token) = page::cookie(&headers, SESSION_COOKIE) {
        sessions::end(&state.db, &token)
            .await
            .map_err(PageError::from)?;
    }
    let mut resp = Redirect::to("/admin/signin?signed_out=1").into_response();
    resp.headers_mut().insert(
        header::SET_COOKIE,
        page::set_cookie(
            SESSION_COOKIE,
            "",
            "/admin",
            page::over_https(&extensions),
            Some(0),
        ),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_pages_are_places_to_return_to() {
        assert_eq!(
            safe_next(Some("/admin/board/?by=rack")),
            "/admin/board/?by=rack"
        );
        for bad in [
            "//evil.example/",
            "/admin//evil",
            "https://evil.example/admin/",
            "/admin/\\evil",
            "/api/v1/",
            "/admin/\nx",
        ] {
            assert_eq!(safe_next(Some(bad)), "/admin/", "{bad:?}");
        }
        assert_eq!(safe_next(None), "/admin/");
    }
}
