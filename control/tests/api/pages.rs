//! The admin pages' sessions and forms, on every engine, through the router:
//! sign-in (the form's own CSRF cookie), the session cookie's flags, sign-out
//! ending the session on the server, idle expiry, cross-site and stale
//! posts refused, the field cap, read-only users. The browser tests
//! (`tests/tests/pages/`) drive the same pages in Chromium.

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use http_body_util::BodyExt as _;
use mprov_control::db::{Engine, Val};
use serde_json::json;
use tower::ServiceExt as _;

use super::common::Ctx;

/// An answer: its status, headers and body as text.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

impl Answer {
    pub(crate) fn location(&self) -> &str {
        self.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    /// The `Set-Cookie` value for `name`, whole.
    fn set_cookie(&self, name: &str) -> Option<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with(&format!("{name}=")))
            .map(str::to_owned)
    }

    /// The value of the hidden input `name`.
    pub(crate) fn hidden(&self, name: &str) -> String {
        let marker = format!("name=\"{name}\" value=\"");
        let at = self
            .body
            .find(&marker)
            .unwrap_or_else(|| panic!("no hidden {name} in {}", self.body));
        let rest = &self.body[at + marker.len()..];
        rest[..rest.find('"').expect("closing quote")].to_owned()
    }
}

fn cookie_value(set_cookie: &str) -> String {
    let first = set_cookie.split(';').next().unwrap_or_default();
    first
        .split_once('=')
        .map(|(_, v)| v.to_owned())
        .unwrap_or_default()
}

async fn send(c: &Ctx, req: Request<Body>) -> Answer {
    let resp = c.app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let a = Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    };
    assert!(!status.is_server_error(), "{status}: {}", a.body);
    if a.headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/html"))
    {
        let csp = a
            .headers
            .get(header::CONTENT_SECURITY_POLICY)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(
            csp.starts_with("default-src 'self'"),
            "CSP on every page: {csp:?}"
        );
    }
    a
}

pub(crate) async fn get(c: &Ctx, path: &str, cookie: Option<&str>) -> Answer {
    let mut req = Request::get(path).header(header::HOST, "mpcc");
    if let Some(ck) = cookie {
        req = req.header(header::COOKIE, ck);
    }
    send(c, req.body(Body::empty()).expect("request")).await
}

pub(crate) async fn post(
    c: &Ctx,
    path: &str,
    cookie: Option<&str>,
    extra: &[(&str, &str)],
    form: &[(&str, &str)],
) -> Answer {
    let body: String = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form)
        .finish();
    let mut req = Request::post(path)
        .header(header::HOST, "mpcc")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(ck) = cookie {
        req = req.header(header::COOKIE, ck);
    }
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    send(c, req.body(Body::from(body)).expect("request")).await
}

pub(crate) async fn add_user(c: &Ctx, name: &str, password: &str, admin: bool) {
    c.post(
        "users",
        json!({"username": name, "password": password, "is_admin": admin}),
    )
    .await;
}

/// Signs in through the form; the session cookie (`mprov_session=...`).
pub(crate) async fn sign_in(c: &Ctx, name: &str, password: &str) -> String {
    let form = get(c, "/admin/signin?next=/admin/", None).await;
    assert_eq!(form.status, StatusCode::OK, "{}", form.body);
    let pre = form
        .set_cookie("mprov_signin")
        .expect("the form's own CSRF cookie");
    let csrf = form.hidden("csrf");
    assert_eq!(cookie_value(&pre), csrf);
    let done = post(
        c,
        "/admin/signin",
        Some(&format!("mprov_signin={csrf}")),
        &[],
        &[
            ("csrf", &csrf),
            ("next", "/admin/"),
            ("username", name),
            ("password", password),
        ],
    )
    .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(done.location(), "/admin/");
    let set = done.set_cookie("mprov_session").expect("a session cookie");
    format!("mprov_session={}", cookie_value(&set))
}

async fn pages_sign_in_and_out(engine: Engine) {
    let c = Ctx::new(engine).await;
    add_user(&c, "ada", "correct horse battery", true).await;

    // Without a session, a page leads to the sign-in form and back.
    let away = get(&c, "/admin/board/?by=rack", None).await;
    assert_eq!(away.status, StatusCode::SEE_OTHER);
    assert_eq!(
        away.location(),
        "/admin/signin?next=%2Fadmin%2Fboard%2F%3Fby%3Drack"
    );

    // A wrong password re-shows the form with the message, and no session.
    let form = get(&c, "/admin/signin", None).await;
    let csrf = form.hidden("csrf");
    let wrong = post(
        &c,
        "/admin/signin",
        Some(&format!("mprov_signin={csrf}")),
        &[],
        &[("csrf", &csrf), ("username", "ada"), ("password", "wrong")],
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(
        wrong.body.contains("wrong user name or password"),
        "{}",
        wrong.body
    );
    assert!(wrong.set_cookie("mprov_session").is_none());

    // The form's token must match its cookie (login CSRF).
    let forged = post(
        &c,
        "/admin/signin",
        Some("mprov_signin=someone-elses"),
        &[],
        &[
            ("csrf", &csrf),
            ("username", "ada"),
            ("password", "correct horse battery"),
        ],
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(forged.set_cookie("mprov_session").is_none());

    // The session cookie: HttpOnly, SameSite=Strict, not Secure over HTTP.
    let form = get(&c, "/admin/signin", None).await;
    let csrf = form.hidden("csrf");
    let ok = post(
        &c,
        "/admin/signin",
        Some(&format!("mprov_signin={csrf}")),
        &[],
        &[
            ("csrf", &csrf),
            ("next", "/admin/jobs/"),
            ("username", "ada"),
            ("password", "correct horse battery"),
        ],
    )
    .await;
    assert_eq!(ok.location(), "/admin/jobs/");
    let set = ok.set_cookie("mprov_session").expect("session cookie");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    let mut q = c.state.db.sql();
    q.push("SELECT id FROM sessions WHERE id = ")
        .bind(Val::Text(Some(cookie_value(&set))));
    let stored = c.state.db.fetch_optional(&q).await.expect("query");
    assert!(
        stored.is_none(),
        "the database keeps a hash, never the cookie's token"
    );

    let cookie = format!("mprov_session={}", cookie_value(&set));
    let dash = get(&c, "/admin/", Some(&cookie)).await;
    assert_eq!(dash.status, StatusCode::OK);
    assert!(dash.body.contains("<h1>Dashboard</h1>"), "{}", dash.body);
    assert!(!dash.body.contains("read-only"));

    // Signing out needs the session's token; then the cookie is worth nothing.
    let no_token = post(&c, "/admin/signout", Some(&cookie), &[], &[]).await;
    assert_eq!(no_token.status, StatusCode::FORBIDDEN);
    assert!(
        no_token.body.contains("reload the page"),
        "{}",
        no_token.body
    );
    let csrf = dash.hidden("csrf");
    let out = post(&c, "/admin/signout", Some(&cookie), &[], &[("csrf", &csrf)]).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(
        out.set_cookie("mprov_session")
            .is_some_and(|s| s.contains("Max-Age=0"))
    );
    let after = get(&c, "/admin/", Some(&cookie)).await;
    assert_eq!(
        after.status,
        StatusCode::SEE_OTHER,
        "the server ended the session"
    );
    c.cleanup().await;
}

async fn pages_sessions_end_when_idle(engine: Engine) {
    let c = Ctx::new(engine).await;
    add_user(&c, "ada", "correct horse battery", true).await;
    let cookie = sign_in(&c, "ada", "correct horse battery").await;
    assert_eq!(
        get(&c, "/admin/", Some(&cookie)).await.status,
        StatusCode::OK
    );
    // Idle for longer than SESSION_EXPIRE_SECONDS (1800 by default).
    let mut upd = c.state.db.sql();
    upd.push("UPDATE sessions SET seen_at = ")
        .bind(Val::Text(Some("2026-01-01T00:00:00Z".into())));
    upd.query()
        .execute(c.state.db.pool())
        .await
        .expect("age the session");
    let expired = get(&c, "/admin/", Some(&cookie)).await;
    assert_eq!(expired.status, StatusCode::SEE_OTHER);
    assert!(expired.location().starts_with("/admin/signin"));
    let left = c
        .state
        .db
        .fetch_all(&c.state.db.sql().push("SELECT id FROM sessions").clone())
        .await
        .expect("query");
    assert!(left.is_empty(), "an expired session is deleted, not kept");
    c.cleanup().await;
}

async fn pages_refuse_cross_site_stale_and_oversized_posts(engine: Engine) {
    let c = Ctx::with_args(engine, &["--data-upload-max-number-fields", "20"]).await;
    add_user(&c, "ada", "correct horse battery", true).await;
    let cookie = sign_in(&c, "ada", "correct horse battery").await;
    let csrf = get(&c, "/admin/", Some(&cookie)).await.hidden("csrf");

    // A post from another site, even with the right token, is refused.
    let cross = post(
        &c,
        "/admin/signout",
        Some(&cookie),
        &[("origin", "http://evil.example")],
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(cross.status, StatusCode::FORBIDDEN);
    assert!(cross.body.contains("cross-site"), "{}", cross.body);
    // A stale token is refused with what to do.
    let stale = post(
        &c,
        "/admin/signout",
        Some(&cookie),
        &[],
        &[("csrf", "old-token")],
    )
    .await;
    assert_eq!(stale.status, StatusCode::FORBIDDEN);
    assert!(stale.body.contains("reload the page"));
    // More fields than DATA_UPLOAD_MAX_NUMBER_FIELDS: a 400 saying how to raise it.
    let many: Vec<(String, String)> = (0..25).map(|i| (format!("f{i}"), "x".into())).collect();
    let mut fields: Vec<(&str, &str)> = vec![("csrf", &csrf)];
    fields.extend(many.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let over = post(&c, "/admin/signout", Some(&cookie), &[], &fields).await;
    assert_eq!(over.status, StatusCode::BAD_REQUEST);
    assert!(
        over.body.contains("DATA_UPLOAD_MAX_NUMBER_FIELDS"),
        "{}",
        over.body
    );
    assert!(over.body.contains("sent 26 fields"), "{}", over.body);
    // None of it ended the session.
    assert_eq!(
        get(&c, "/admin/", Some(&cookie)).await.status,
        StatusCode::OK
    );
    // Without a session, a post says to sign in again.
    let gone = post(&c, "/admin/signout", None, &[], &[("csrf", &csrf)]).await;
    assert_eq!(gone.status, StatusCode::UNAUTHORIZED);
    assert!(gone.body.contains("sign in again"));
    c.cleanup().await;
}

async fn pages_show_read_only_users_as_such(engine: Engine) {
    let c = Ctx::new(engine).await;
    add_user(&c, "viewer", "look but do not touch", false).await;
    let cookie = sign_in(&c, "viewer", "look but do not touch").await;
    let dash = get(&c, "/admin/", Some(&cookie)).await;
    assert_eq!(dash.status, StatusCode::OK);
    assert!(dash.body.contains("read-only"), "{}", dash.body);
    // Read-only users see the identities, with no form to change them, and
    // a forged post (with the session's own token) is refused by the
    // access rules, not by the page's looks.
    let ids = get(&c, "/admin/identities/", Some(&cookie)).await;
    assert_eq!(ids.status, StatusCode::OK);
    assert!(
        !ids.body.contains("/admin/identities/tokens"),
        "no form to read-only users"
    );
    let csrf = dash.hidden("csrf");
    for (path, form) in [
        (
            "/admin/identities/tokens",
            vec![("csrf", csrf.as_str()), ("name", "js9")],
        ),
        (
            "/admin/identities/apikeys",
            vec![("csrf", csrf.as_str()), ("name", "mine")],
        ),
    ] {
        let forged = post(&c, path, Some(&cookie), &[], &form).await;
        assert_eq!(
            forged.status,
            StatusCode::FORBIDDEN,
            "{path}: {}",
            forged.body
        );
    }
    let keys = c.ok("GET", "/api/v1/apikeys/", None).await;
    assert_eq!(keys["total"], 1, "only the test's own key: {keys}");
    // Unknown pages are HTML 404s, static files are served with a type.
    let missing = get(&c, "/admin/no-such-page", Some(&cookie)).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let css = get(&c, "/admin/static/mprov.css", None).await;
    assert_eq!(css.status, StatusCode::OK);
    assert_eq!(css.headers[header::CONTENT_TYPE], "text/css; charset=utf-8");
    c.cleanup().await;
}

async fn pages_dashboard_lists_failed_nodes(engine: Engine) {
    let c = Ctx::new(engine).await;
    add_user(&c, "ada", "correct horse battery", true).await;
    let sys = c.post("systems", json!({"hostname": "c07"})).await;
    let id = sys["id"].as_i64().expect("id");
    let cookie = sign_in(&c, "ada", "correct horse battery").await;
    let calm = get(&c, "/admin/", Some(&cookie)).await;
    assert!(
        calm.body.contains("No node has failed or is stuck"),
        "{}",
        calm.body
    );
    mprov_control::boot::record(
        &c.state.db,
        mprov_control::boot::NewEvent {
            system_id: Some(id),
            mac: None,
            phase: mprov_api::boot::BootPhase::Failed,
            source: "node:c07".into(),
            jobserver_id: None,
            ip: None,
            detail: "the image's sha256 did not match: retrying from js2".into(),
        },
    )
    .await
    .expect("record");
    let dash = get(&c, "/admin/", Some(&cookie)).await;
    assert!(
        dash.body
            .contains(&format!("/admin/systems/{id}/timeline\">c07</a>")),
        "{}",
        dash.body
    );
    assert!(dash.body.contains("retrying from js2"), "{}", dash.body);
    c.cleanup().await;
}

/// Each passkey sign-in start stores a challenge: one address may start
/// [`SIGN_IN_STARTS_PER_MINUTE`] a minute, then gets 429 with when to try
/// again, and the form still signs in with a password.
async fn pages_throttle_passkey_sign_in_starts(engine: Engine) {
    use mprov_control::passkeys::SIGN_IN_STARTS_PER_MINUTE;
    let c = Ctx::new(engine).await;
    add_user(&c, "ada", "correct horse battery", true).await;
    let form = get(&c, "/admin/signin", None).await;
    let csrf = form.hidden("csrf");
    let cookie = format!("mprov_signin={csrf}");
    let fields = [("csrf", csrf.as_str())];
    let start = || {
        post(
            &c,
            "/admin/signin/passkey/options",
            Some(&cookie),
            &[],
            &fields,
        )
    };
    for i in 0..SIGN_IN_STARTS_PER_MINUTE {
        let ok = start().await;
        assert_eq!(ok.status, StatusCode::OK, "start {i}: {}", ok.body);
        assert!(ok.body.contains("\"challenge\""), "{}", ok.body);
    }
    let over = start().await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS, "{}", over.body);
    assert!(
        over.body.contains("passkey sign-in starts"),
        "{}",
        over.body
    );
    assert!(
        over.headers.contains_key(header::RETRY_AFTER),
        "{:?}",
        over.headers
    );
    sign_in(&c, "ada", "correct horse battery").await;
    c.cleanup().await;
}

crate::engine_tests!(
    pages_throttle_passkey_sign_in_starts,
    pages_dashboard_lists_failed_nodes,
    pages_sign_in_and_out,
    pages_sessions_end_when_idle,
    pages_refuse_cross_site_stale_and_oversized_posts,
    pages_show_read_only_users_as_such,
);
