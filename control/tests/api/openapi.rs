//! The OpenAPI document against what the router really answers: every
//! operation it lists is sent a bad query, a body of the wrong content type,
//! malformed JSON and a body of the wrong shape, and each status that comes
//! back must be one the operation's entry lists, with the content type the
//! entry gives it. A client generated from the document is then never
//! surprised by a status or a body.

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use mprov_control::db::Engine;
use serde_json::Value;
use tower::ServiceExt;

use crate::common::{Ctx, VERSION};

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// One request to send: what it is, for the failure message, and its parts.
struct Probe {
    what: String,
    method: String,
    uri: String,
    content_type: Option<&'static str>,
    body: String,
}

/// The probes of one operation: each query parameter it declares with a
/// value no parameter takes, and, when it takes a body, the three bad bodies.
fn probes(method: &str, path: &str, op: &Value) -> Vec<Probe> {
    // Path parameters name no row: a handler may answer 404 before it reads
    // the body, and then 404 must be listed.
    let mut concrete = path.to_owned();
    for name in ["key", "jobserver", "id"] {
        concrete = concrete.replace(&format!("{{{name}}}"), "9999");
    }
    let method = method.to_ascii_uppercase();
    let mut out = Vec::new();
    let params = op["parameters"].as_array().into_iter().flatten();
    for p in params.filter(|p| p["in"] == "query") {
        let name = p["name"].as_str().expect("parameter name");
        out.push(Probe {
            what: format!("?{name}= a bad value"),
            method: method.clone(),
            // Not a NUL: PostgreSQL's text cannot hold one, and a NUL in a
            // filter or a text field still answers 500 there (not fixed yet).
            uri: format!("{concrete}?{name}=-%FFx"),
            content_type: None,
            body: String::new(),
        });
    }
    if op.get("requestBody").is_some() {
        for (what, content_type, body) in [
            ("a text/plain body", "text/plain", "{}"),
            ("malformed JSON", "application/json", "not json"),
            ("a body of the wrong shape", "application/json", "[[\"x\"]]"),
            (
                "an object of unknown fields",
                "application/json",
                "{\"no_such_field\":[1]}",
            ),
        ] {
            out.push(Probe {
                what: what.into(),
                method: method.clone(),
                uri: concrete.clone(),
                content_type: Some(content_type),
                body: body.into(),
            });
        }
    }
    out
}

/// The media type of a `Content-Type` value, without its parameters.
fn media_type(value: &str) -> &str {
    value.split(';').next().unwrap_or_default().trim()
}

pub(crate) async fn every_status_answered_is_documented(engine: Engine) {
    let c = Ctx::new(engine).await;
    let doc = mprov_control::http::openapi::document();
    let paths = doc["paths"].as_object().expect("paths");
    let mut seen = BTreeSet::new();
    let mut sent = 0;
    let mut problems = Vec::new();
    for (path, item) in paths {
        for method in METHODS {
            let Some(op) = item.get(method) else { continue };
            for probe in probes(method, path, op) {
                let mut req = Request::builder()
                    .method(probe.method.as_str())
                    .uri(&probe.uri)
                    .header(header::AUTHORIZATION, format!("Api-Key {}", c.key))
                    .header(VERSION, mprov_api::api_version());
                if let Some(ct) = probe.content_type {
                    req = req.header(header::CONTENT_TYPE, ct);
                }
                let req = req.body(Body::from(probe.body)).expect("request");
                let resp = c.app.clone().oneshot(req).await.expect("infallible");
                let status = resp.status();
                let content_type = resp
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .map(|v| media_type(v.to_str().expect("ASCII")).to_owned());
                let bytes = resp.into_body().collect().await.expect("body").to_bytes();
                sent += 1;
                let at = format!(
                    "{} {} with {}: {status}",
                    probe.method, probe.uri, probe.what
                );
                if status.is_server_error() {
                    problems.push(format!("{at}: {}", String::from_utf8_lossy(&bytes)));
                    continue;
                }
                let code = status.as_u16().to_string();
                let body = String::from_utf8_lossy(&bytes);
                match op["responses"].get(&code) {
                    None => problems.push(format!(
                        "{at}, which the entry does not list (it lists {:?}); body: {body}",
                        op["responses"]
                            .as_object()
                            .map(|r| r.keys().collect::<Vec<_>>()),
                    )),
                    Some(entry) => {
                        if let Some(content) = entry.get("content").and_then(Value::as_object)
                            && !bytes.is_empty()
                        {
                            let ct = content_type.unwrap_or_default();
                            if !content.contains_key(&ct) {
                                problems.push(format!(
                                    "{at} came as {ct:?}; the entry gives {:?}; body: {body}",
                                    content.keys().collect::<Vec<_>>()
                                ));
                            }
                        }
                    }
                }
                seen.insert(status);
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} answers disagree with the OpenAPI document:\n{}",
        problems.len(),
        problems.join("\n")
    );
    // The probes reached the query and body checks, not only the router's
    // and the authentication's refusals.
    for expected in [
        StatusCode::BAD_REQUEST,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        StatusCode::UNPROCESSABLE_ENTITY,
    ] {
        assert!(
            seen.contains(&expected),
            "no probe got {expected} (of {sent} sent, the statuses were {seen:?})"
        );
    }
    c.cleanup().await;
}
