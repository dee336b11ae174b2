//! The REST handlers: generic ones for every kind, and the few endpoints that
//! are not a kind (index, revision, effective config, OpenAPI).

use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::AppState;
pub use super::body::JsonBody;
use super::error::ApiError;
use crate::db::crud::{self, ListQuery, Mode, Obj};
use crate::db::kinds::{self, KINDS, Kind};
use crate::netboot::{self, Lookup, NodeKey};

/// The most rows one bulk create takes.
pub const MAX_BULK_ROWS: usize = 20_000;

impl JsonBody {
    fn object(self) -> Result<Obj, ApiError> {
        match self.0 {
            Value::Object(o) => Ok(o),
            other => Err(ApiError::bad_request(
                "malformed_json",
                format!("expected a JSON object, got {}", type_name(&other)),
            )),
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Adds the routes of one kind.
pub fn kind_routes(router: Router<AppState>, kind: &'static Kind) -> Router<AppState> {
    let base = format!("/api/v1/{}", kind.name);
    let collection =
        get(
            move |State(st): State<AppState>, RawQuery(q): RawQuery| async move {
                list(&st, kind, q).await
            },
        )
        .post(
            move |State(st): State<AppState>, body: JsonBody| async move {
                create(&st, kind, body).await
            },
        );
    let item = get(
        move |State(st): State<AppState>, Path(key): Path<String>| async move {
            st.db
                .get(kind, &key)
                .await
                .map(Json)
                .map_err(ApiError::from)
        },
    )
    .patch(
        move |State(st): State<AppState>,
              Path(key): Path<String>,
              principal: Option<axum::Extension<crate::identity::Principal>>,
              body: JsonBody| async move {
            update(&st, kind, &key, principal.map(|p| p.0), body).await
        },
    )
    .delete(
        move |State(st): State<AppState>, Path(key): Path<String>| async move {
            st.db
                .delete(kind, &key)
                .await
                .map(|()| StatusCode::NO_CONTENT)
                .map_err(ApiError::from)
        },
    );
    let bulk_route = post(
        move |State(st): State<AppState>, body: JsonBody| async move { bulk(&st, kind, body).await },
    );
    router
        .route(&base, collection.clone())
        .route(&format!("{base}/"), collection)
        .route(&format!("{base}/bulk"), bulk_route)
        .route(&format!("{base}/{{key}}"), item.clone())
        .route(&format!("{base}/{{key}}/"), item)
}

fn query_pairs(q: Option<String>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

async fn list(
    st: &AppState,
    kind: &'static Kind,
    q: Option<String>,
) -> Result<Json<Value>, ApiError> {
    let page = st
        .db
        .list(kind, &ListQuery::from_pairs(query_pairs(q)))
        .await?;
    Ok(Json(
        json!({"items": page.items, "total": page.total, "next": page.next}),
    ))
}

fn invalid_rows(errors: Vec<crud::FieldError>) -> ApiError {
    crud::field_errors(errors).into()
}

async fn create(st: &AppState, kind: &'static Kind, body: JsonBody) -> Result<Response, ApiError> {
    let body = body.object()?;
    let prepared =
        crud::validate(kind, &body, Mode::Create, &st.secrets, "").map_err(invalid_rows)?;
    // A secret the kind issues (an API key) is in this answer only.
    let obj = st.db.create(kind, prepared).await?;
    st.changed.notify_waiters();
    Ok((StatusCode::CREATED, Json(obj)).into_response())
}

async fn bulk(st: &AppState, kind: &'static Kind, body: JsonBody) -> Result<Response, ApiError> {
    if let Some(issued) = kind.issues {
        return Err(ApiError::bad_request(
            "not_supported",
            issued.one_at_a_time(),
        ));
    }
    let Value::Array(rows) = body.0 else {
        return Err(ApiError::bad_request(
            "malformed_json",
            "a bulk create takes a JSON list of objects",
        ));
    };
    if rows.is_empty() || rows.len() > MAX_BULK_ROWS {
        return Err(ApiError::bad_request(
            "bad_size",
            format!(
                "a bulk create takes 1 to {MAX_BULK_ROWS} rows; got {}",
                rows.len()
            ),
        ));
    }
    let mut prepared = Vec::with_capacity(rows.len());
    let mut errors = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let path = format!("rows[{i}]");
        match row.as_object() {
            Some(obj) => match crud::validate(kind, obj, Mode::Create, &st.secrets, &path) {
                Ok(p) => prepared.push(p),
                Err(mut e) => errors.append(&mut e),
            },
            None => errors.push(crud::FieldError {
                path,
                message: "expected an object".into(),
            }),
        }
    }
    if !errors.is_empty() {
        return Err(invalid_rows(errors));
    }
    let ids = st.db.create_many(kind, prepared).await?;
    st.changed.notify_waiters();
    Ok((StatusCode::CREATED, Json(mprov_api::BulkCreated { ids })).into_response())
}

async fn update(
    st: &AppState,
    kind: &'static Kind,
    key: &str,
    principal: Option<crate::identity::Principal>,
    body: JsonBody,
) -> Result<Json<Obj>, ApiError> {
    let body = body.object()?;
    // The auth layer always sets the principal; without one, nothing is
    // written.
    let principal =
        principal.ok_or_else(|| ApiError::Unauthorized("no credentials were checked".into()))?;
    crate::access::check_fields(
        &principal,
        st.config.shared_key_mode,
        kind,
        body.keys().map(String::as_str),
    )?;
    let prepared =
        crud::validate(kind, &body, Mode::Update, &st.secrets, "").map_err(invalid_rows)?;
    let obj = st.db.update(kind, key, prepared).await?;
    st.changed.notify_waiters();
    Ok(Json(obj))
}

/// `PUT` / `DELETE /api/v1/images/{key}/hosts/{jobserver}`: a job server
/// says it holds (or no longer holds) an image's current version. Idempotent;
/// the image with its hosts.
pub async fn image_host(
    State(st): State<AppState>,
    method: axum::http::Method,
    Path((key, jobserver)): Path<(String, String)>,
) -> Result<Json<Obj>, ApiError> {
    let kind = |n| kinds::kind(n).ok_or_else(|| ApiError::internal(format!("no kind {n}")));
    let images = kind("images")?;
    // The relation that lists the hosts, and the job servers' kind, as the
    // images' descriptor says.
    let kinds::JobServerWrite::Hosts(relation) = images.jobserver_writes else {
        return Err(ApiError::internal("images have no hosts relation"));
    };
    let hosted_by = images
        .relation(relation)
        .ok_or_else(|| ApiError::internal(format!("images have no relation {relation}")))?;
    let js = st.db.get(kind(hosted_by.kind)?, &jobserver).await?;
    let js_id = js
        .get("id")
        .and_then(Value::as_i64)
        .ok_or_else(|| ApiError::internal("a job server without an id"))?;
    let image = st.db.get(images, &key).await?;
    let mut hosts: Vec<i64> = image
        .get(relation)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_i64)
        .collect();
    let before = hosts.clone();
    if method == axum::http::Method::DELETE {
        hosts.retain(|h| *h != js_id);
    } else if !hosts.contains(&js_id) {
        hosts.push(js_id);
    }
    if hosts == before {
        return Ok(Json(image));
    }
    let mut body = Obj::new();
    body.insert(relation.into(), json!(hosts));
    let prepared =
        crud::validate(images, &body, Mode::Update, &st.secrets, "").map_err(invalid_rows)?;
    let obj = st.db.update(images, &key, prepared).await?;
    st.changed.notify_waiters();
    Ok(Json(obj))
}

/// `GET /api/v1/`: what the API has.
pub async fn index() -> Json<Value> {
    let kinds: Vec<Value> = KINDS
        .iter()
        .map(|k| json!({"kind": k.name, "path": format!("/api/v1/{}/", k.name), "doc": k.doc}))
        .collect();
    Json(json!({
        "version": mprov_api::api_version(),
        "kinds": kinds,
        "openapi": "/api/v1/openapi.json",
    }))
}

/// `GET /api/v1/revision`: the inventory revision.
pub async fn revision(State(st): State<AppState>) -> Result<Json<mprov_api::Revision>, ApiError> {
    let revision = st.db.revision().await.map_err(ApiError::internal)?;
    Ok(Json(mprov_api::Revision { revision }))
}

/// `GET /ca.crt`: this install's CA certificate (PEM), for anyone: clients
/// need it before they can trust the HTTPS certificate. 404 when the service
/// runs without TLS (in-process tests).
pub async fn ca_cert(State(st): State<AppState>) -> Result<Response, ApiError> {
    let pem = st.ca_pem.clone().ok_or_else(|| {
        ApiError::NotFound("this service runs without its certificate authority".into())
    })?;
    Ok(([(header::CONTENT_TYPE, "application/x-pem-file")], pem).into_response())
}

/// `GET /api/v1/systems/{key}/config`: the merged distro → groups → image →
/// system configuration, from the node's view.
pub async fn effective_config(
    State(st): State<AppState>,
    Path(key): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let Lookup::Known(view) = netboot::view::load(&st.db, NodeKey::System(&key)).await? else {
        return Err(ApiError::NotFound(format!(
            "no systems has id or name {key:?}"
        )));
    };
    let cfg = view.effective().map_err(|e| ApiError::Conflict {
        message: e.to_string(),
        field: None,
    })?;
    serde_json::to_value(cfg)
        .map(Json)
        .map_err(ApiError::internal)
}

/// The longest a boot config long-poll waits.
pub const MAX_LONG_POLL: Duration = Duration::from_secs(60);
/// How often a long-poll rereads the revision, for writes made through other
/// control service replicas sharing the database.
const LONG_POLL_RECHECK: Duration = Duration::from_secs(1);

/// `GET /api/v1/bootconfig?after=<revision>&wait=<seconds>`: the boot config
/// snapshot once the revision is past `after`, waiting up to `wait` seconds
/// (at most 60) for a change; 204 when none came.
pub async fn bootconfig(
    State(st): State<AppState>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let mut after = -1i64;
    let mut wait = Duration::ZERO;
    for (k, v) in query_pairs(q) {
        match k.as_str() {
            "after" => {
                after = v
                    .parse()
                    .map_err(|_| ApiError::invalid("after", "expected a revision number"))?
            }
            "wait" => {
                let secs: u64 = v
                    .parse()
                    .map_err(|_| ApiError::invalid("wait", "expected whole seconds"))?;
                wait = Duration::from_secs(secs).min(MAX_LONG_POLL);
            }
            _ => {
                return Err(ApiError::invalid(
                    &k,
                    "unknown query parameter; bootconfig takes after and wait",
                ));
            }
        }
    }
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        // Listen before reading, so a write between the two is not missed.
        let notified = st.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let revision = st.db.revision().await.map_err(ApiError::internal)?;
        if revision > after {
            let cfg = &st.config;
            let url = mprov_api::boot::ipxe_chain_url(&cfg.public_url);
            let snap = crate::bootconfig::snapshot(&st.db, &cfg.dns_upstreams, Some(&url))
                .await
                .map_err(|e| ApiError::internal_in("boot config", e))?;
            return Ok(Json(snap).into_response());
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        let nap = (deadline - now).min(LONG_POLL_RECHECK);
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep(nap) => {}
        }
    }
}

/// Any path the API does not have.
pub async fn not_found() -> ApiError {
    ApiError::NotFound("no such endpoint; the API index is at /api/v1/".into())
}

/// A path that exists, with a method it does not take.
pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
