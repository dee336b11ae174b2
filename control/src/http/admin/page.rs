//! What every admin page shares: the session layer (the cookie, the
//! cross-site check, the security headers), the page chrome every template
//! extends, rendering, the HTML error page, and posted forms (the field cap
//! and the CSRF token).
//!
//! Errors are the API's [`ApiError`]: the domain's errors map to it once
//! (`http/error.rs`), and a page shows the same status and message as HTML
//! ([`PageError`]), so no rule about what went wrong is written twice.

use std::sync::Arc;

use askama::Template;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use crate::http::AppState;
use crate::http::error::{ApiError, Failure};
use crate::sessions::{self, Session};

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "mprov_session";

/// The sign-in form's own CSRF cookie (there is no session yet to hold it).
pub const SIGNIN_COOKIE: &str = "mprov_signin";

/// What every page's frame shows: who is signed in, the CSRF token its
/// forms carry, where in the navigation it is, and the time zone its
/// times are shown in.
#[derive(Debug, Clone)]
pub struct Chrome {
    /// The page's title.
    pub title: String,
    /// The navigation entry to mark as current.
    pub active: &'static str,
    /// The signed-in user.
    pub user: String,
    /// Whether they may change things.
    pub admin: bool,
    /// This session's CSRF token, for every form.
    pub csrf: String,
    /// The time zone's name (`TIME_ZONE`, else `TZ`, else UTC).
    pub tz_name: String,
    tz: jiff::tz::TimeZone,
    /// Appended to static asset URLs, so a new release is fetched anew.
    pub asset_version: &'static str,
}

impl Chrome {
    /// The frame of a page titled `title` under the navigation entry
    /// `active`, for `session`.
    pub fn new(
        state: &AppState,
        session: &Session,
        title: impl Into<String>,
        active: &'static str,
    ) -> Chrome {
        let (tz_name, tz) = state.config.time_zone.clone();
        Chrome {
            title: title.into(),
            active,
            user: session.username.clone(),
            admin: session.admin,
            csrf: session.csrf.clone(),
            tz_name,
            tz,
            asset_version: env!("CARGO_PKG_VERSION"),
        }
    }

    /// A stored time stamp (`2026-01-31T12:00:00Z`) in the configured time
    /// zone, e.g. `2026-01-31 13:00:00 CET`; anything else as it is.
    pub fn time(&self, stored: &str) -> String {
        local_time(stored, &self.tz)
    }
}

/// A stored time stamp in `tz`, to the second with the zone's abbreviation.
pub fn local_time(stored: &str, tz: &jiff::tz::TimeZone) -> String {
    match stored.parse::<jiff::Timestamp>() {
        Ok(ts) => ts
            .to_zoned_datetime(tz.clone())
            .strftime("%Y-%m-%d %H:%M:%S %Z")
            .to_string(),
        Err(_) => stored.to_owned(),
    }
}

/// Renders a template as a page; a template that fails to render (it
/// cannot, short of a bug in a filter) is a 500.
pub fn render(page: &impl Template) -> Response {
    match page.render() {
        Ok(html) => html_response(StatusCode::OK, html),
        Err(e) => PageError(ApiError::internal_in("rendering a page", e)).into_response(),
    }
}

/// An HTML body with `status`.
pub fn html_response(status: StatusCode, html: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html,
    )
        .into_response()
}

/// The error page, standalone so that it renders with or without a session.
#[derive(Template)]
#[template(path = "admin/error.html")]
struct ErrorPage<'a> {
    status: u16,
    reason: &'a str,
    message: &'a str,
    field: Option<&'a str>,
    signed_in: bool,
}

/// A page's failure: the API's error (its status and message), shown as
/// HTML. The response keeps what the outage layer reads (an internal
/// error's cause, a database outage).
#[derive(Debug)]
pub struct PageError(pub ApiError);

impl<E: Into<ApiError>> From<E> for PageError {
    fn from(e: E) -> PageError {
        PageError(e.into())
    }
}

impl PageError {
    /// 403 with `message`.
    pub fn forbidden(message: impl Into<String>) -> PageError {
        PageError(ApiError::Forbidden(message.into()))
    }

    /// 404 with `message`.
    pub fn not_found(message: impl Into<String>) -> PageError {
        PageError(ApiError::NotFound(message.into()))
    }

    /// 400 naming `field`.
    pub fn invalid(field: &str, message: impl Into<String>) -> PageError {
        PageError(ApiError::invalid(field, message))
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let (status, _, message, field) = self.0.parts();
        let resp = self.0.into_response();
        let message = match resp.extensions().get::<Failure>() {
            Some(Failure::Internal { request_id, .. }) => {
                format!("{message} (request id {request_id})")
            }
            _ => message,
        };
        let (mut parts, _) = resp.into_parts();
        parts.headers.remove(header::WWW_AUTHENTICATE);
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        let page = ErrorPage {
            status: status.as_u16(),
            reason: status.canonical_reason().unwrap_or("Error"),
            message: &message,
            field: field.as_deref(),
            signed_in: parts.extensions.get::<Session>().is_some(),
        };
        let html = page
            .render()
            .unwrap_or_else(|_| format!("{} {message}", status.as_u16()));
        Response::from_parts(parts, Body::from(html))
    }
}

/// The value of the cookie `name` in `headers`, if sent.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Strict, for `path`, Secure when
/// the page was served over HTTPS; `max_age` 0 deletes it.
pub fn set_cookie(
    name: &str,
    value: &str,
    path: &str,
    secure: bool,
    max_age: Option<u64>,
) -> HeaderValue {
    let mut c = format!("{name}={value}; Path={path}; HttpOnly; SameSite=Strict");
    if secure {
        c.push_str("; Secure");
    }
    if let Some(age) = max_age {
        c.push_str(&format!("; Max-Age={age}"));
    }
    HeaderValue::from_str(&c).unwrap_or_else(|_| HeaderValue::from_static("invalid=1"))
}

/// Whether the request came over HTTPS (this service's TLS listener).
pub fn over_https(extensions: &axum::http::Extensions) -> bool {
    extensions.get::<Arc<axum_server::tls::TlsInfo>>().is_some()
}

/// The passkey site of a request: the host it was sent to (`Host`) and
/// whether over HTTPS; a host the service does not answer to, or an
/// address, is refused by `crate::passkeys::Site::new`.
pub fn passkey_site(
    state: &AppState,
    headers: &HeaderMap,
    extensions: &axum::http::Extensions,
) -> Result<crate::passkeys::Site, PageError> {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    Ok(crate::passkeys::Site::new(
        &state.config,
        over_https(extensions),
        host,
    )?)
}

/// Whether a request comes from another site: its `Sec-Fetch-Site` says
/// so, or its `Origin` names a host other than the one it was sent to.
/// Browsers send both with every cross-site form post.
pub fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && site.eq_ignore_ascii_case("cross-site")
    {
        return true;
    }
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // `null` (a sandboxed or privacy-stripped origin) is never ours.
    let origin_host = origin
        .split_once("://")
        .map(|(_, rest)| rest.trim_end_matches('/'))
        .unwrap_or("");
    !origin_host.eq_ignore_ascii_case(host)
}

/// The admin pages' outer layer: refuses a cross-site post before anything
/// else, finds the session of the cookie (as [`Session`] in the request's
/// extensions, and its principal), and sets the security headers on every
/// answer.
pub async fn session_layer(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    if req.method() != Method::GET && req.method() != Method::HEAD && cross_site(req.headers()) {
        tracing::warn!(path = %req.uri().path(), "admin pages: refused a cross-site post (CSRF)");
        return with_security_headers(
            PageError::forbidden(
                "this form was posted from another site, and cross-site posts are refused (CSRF protection); open the page on this service and submit it from there",
            )
            .into_response(),
        );
    }
    if let Some(token) = cookie(req.headers(), SESSION_COOKIE) {
        match sessions::resume(
            &state.db,
            &token,
            state.config.pages.session_idle,
            jiff::Timestamp::now(),
        )
        .await
        {
            Ok(Some(session)) => {
                req.extensions_mut().insert(session.principal());
                req.extensions_mut().insert(session);
            }
            Ok(None) => {}
            Err(e) => return with_security_headers(PageError::from(e).into_response()),
        }
    }
    with_security_headers(next.run(req).await)
}

/// The headers every admin answer carries: nothing from another origin,
/// no framing, no sniffing, and (but for static assets) no caching.
fn with_security_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

/// The layer of the pages that need a session: without one, a page is a
/// redirect to the sign-in form (which comes back here afterwards), and a
/// post a 403 that says to sign in again (what it carried is not replayed).
pub async fn require_session(req: Request, next: Next) -> Response {
    if req.extensions().get::<Session>().is_some() {
        return next.run(req).await;
    }
    if req.method() == Method::GET || req.method() == Method::HEAD {
        let here = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/admin/".into());
        let next_param: String = url::form_urlencoded::byte_serialize(here.as_bytes()).collect();
        return Redirect::to(&format!("/admin/signin?next={next_param}")).into_response();
    }
    PageError(ApiError::Unauthorized(
        "your session has ended (signed out, or idle for longer than SESSION_EXPIRE_SECONDS); sign in again and repeat what you did".into(),
    ))
    .into_response()
}

/// The signed-in session, for a page handler.
impl<S: Send + Sync> FromRequestParts<S> for Session {
    type Rejection = PageError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Session, PageError> {
        parts.extensions.get::<Session>().cloned().ok_or_else(|| {
            PageError(ApiError::Unauthorized(
                "sign in to use the admin pages".into(),
            ))
        })
    }
}

/// Whether `session` may do `method` to what the API names
/// `/api/v1/<kind>[/<key>[/<rest>]]`: the API's own access rule
/// ([`crate::access::check`]), so a page allows exactly what the API does.
pub async fn allow(
    state: &AppState,
    session: &Session,
    method: crate::access::Method,
    kind: &str,
    key: Option<&str>,
    rest: Option<&str>,
) -> Result<(), PageError> {
    crate::access::check(
        &state.db,
        state.config.shared_key_mode,
        &session.principal(),
        method,
        crate::access::Target::Inventory { kind, key, rest },
        None,
    )
    .await
    .map_err(PageError::from)
}

/// A posted form's fields, in order (a name may repeat).
#[derive(Debug, Clone, Default)]
pub struct Fields(pub Vec<(String, String)>);

impl Fields {
    /// The first value of `name`, if sent.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `name`.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses an `application/x-www-form-urlencoded` body, refusing more than
/// `max` fields with a message that says how to raise the cap.
pub fn parse_fields(body: &[u8], max: usize) -> Result<Fields, PageError> {
    let mut out = Vec::new();
    for (i, (k, v)) in url::form_urlencoded::parse(body).enumerate() {
        if i >= max {
            let sent = body.split(|&b| b == b'&').filter(|p| !p.is_empty()).count();
            return Err(PageError(ApiError::BadRequest {
                code: "too_many_fields",
                message: format!(
                    "this form sent {sent} fields, more than the {max} the control service accepts; raise DATA_UPLOAD_MAX_NUMBER_FIELDS in its environment (or change fewer rows at once)"
                ),
                field: None,
            }));
        }
        out.push((k.into_owned(), v.into_owned()));
    }
    Ok(Fields(out))
}

/// A form posted from a signed-in session: its fields, checked against the
/// field cap and this session's CSRF token (the `csrf` field).
#[derive(Debug)]
pub struct Posted {
    /// Who posted it.
    pub session: Session,
    /// The fields, without `csrf`.
    pub fields: Fields,
}

impl FromRequest<AppState> for Posted {
    type Rejection = PageError;

    async fn from_request(req: Request, state: &AppState) -> Result<Posted, PageError> {
        let session = req.extensions().get::<Session>().cloned().ok_or_else(|| {
            PageError(ApiError::Unauthorized(
                "sign in to use the admin pages".into(),
            ))
        })?;
        let fields = read_form(req, state).await?;
        if !fields.get("csrf").is_some_and(|t| session.csrf_matches(t)) {
            return Err(stale());
        }
        let fields = Fields(fields.0.into_iter().filter(|(k, _)| k != "csrf").collect());
        Ok(Posted { session, fields })
    }
}

/// A form whose CSRF token does not match.
pub fn stale() -> PageError {
    PageError::forbidden(
        "this form's security token does not match your session (the page is stale, or it was posted from elsewhere: CSRF protection); reload the page and submit it again",
    )
}

/// Reads a form body (urlencoded) within the field cap.
pub async fn read_form(req: Request, state: &AppState) -> Result<Fields, PageError> {
    if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or_default().to_ascii_lowercase();
        if !ct.starts_with("application/x-www-form-urlencoded") {
            return Err(PageError(ApiError::UnsupportedMediaType));
        }
    }
    let body = Bytes::from_request(req, state).await.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            PageError(ApiError::PayloadTooLarge(crate::http::BODY_LIMIT))
        } else {
            PageError(ApiError::bad_request(
                "bad_body",
                format!("could not read the form: {}", e.body_text()),
            ))
        }
    })?;
    parse_fields(&body, state.config.pages.max_fields)
}

/// `?k=v&...` of `pairs`, URL-encoded; empty for none.
pub(super) fn query_string<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let s = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish();
    if s.is_empty() { s } else { format!("?{s}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_post_from_another_origin_is_cross_site() {
        let ours = headers(&[("host", "ctl:8080"), ("origin", "http://ctl:8080")]);
        assert!(!cross_site(&ours));
        let theirs = headers(&[("host", "ctl:8080"), ("origin", "http://evil.example")]);
        assert!(cross_site(&theirs));
        let null = headers(&[("host", "ctl:8080"), ("origin", "null")]);
        assert!(cross_site(&null));
        let fetch = headers(&[("host", "ctl:8080"), ("sec-fetch-site", "cross-site")]);
        assert!(cross_site(&fetch));
        let none = headers(&[("host", "ctl:8080")]);
        assert!(!cross_site(&none));
    }

    #[test]
    fn cookies_are_found_by_name() {
        let h = headers(&[("cookie", "a=1; mprov_session=tok; b=2")]);
        assert_eq!(cookie(&h, SESSION_COOKIE).as_deref(), Some("tok"));
        assert_eq!(cookie(&h, "c"), None);
    }

    #[test]
    fn forms_over_the_field_cap_say_how_to_raise_it() {
        let f = parse_fields(b"a=1&b=2&a=3", 3).unwrap();
        assert_eq!(f.all("a").collect::<Vec<_>>(), ["1", "3"]);
        let err = parse_fields(b"a=1&b=2&c=3&d=4", 3).unwrap_err();
        let (status, code, message, _) = err.0.parts();
        assert_eq!((status.as_u16(), code), (400, "too_many_fields"));
        assert!(
            message.contains("DATA_UPLOAD_MAX_NUMBER_FIELDS"),
            "{message}"
        );
        assert!(message.contains("sent 4 fields"), "{message}");
    }

    #[test]
    fn times_show_in_the_configured_zone() {
        let paris = jiff::tz::TimeZone::get("Europe/Paris").unwrap();
        assert_eq!(
            local_time("2026-12-03T10:00:00Z", &paris),
            "2026-12-03 11:00:00 CET"
        );
        assert_eq!(local_time("never", &paris), "never");
    }
}
