//! Who is asking: authentication, the version lock, and the edge checks every
//! request passes (allowed Host, the version header on every response).
//!
//! Order matters and is part of the API contract: the Host check, then
//! authentication (401), then the version (426), then the handler. Handlers
//! only ever see a [`Principal`] (from [`crate::identity`]), never the
//! transport.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use crate::access;
use crate::identity::{self, Principal};

/// The address a request comes from: the peer's, or for a peer that is a
/// trusted proxy the one its `X-Forwarded-For` names
/// ([`crate::config::Config::client_ip`]); `None` without a peer address.
pub fn client_ip(state: &AppState, req: &Request) -> Option<IpAddr> {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>()?.0.ip();
    let xff = req
        .headers()
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok());
    Some(state.config.client_ip(peer, xff))
}

/// Reads the credentials of a request, if any, and checks them: the
/// `Authorization` header, else a client certificate presented over TLS.
/// `client` is the caller's address, for the password throttle.
pub async fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    tls: Option<&axum_server::tls::TlsInfo>,
    client: Option<IpAddr>,
) -> Result<Principal, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return match tls.and_then(|t| t.peer_certificates.first()) {
            Some(der) => Ok(Principal::Machine(
                identity::check_certificate(&state.db, der).await?,
            )),
            None => Ok(Principal::Anonymous),
        };
    };
    let value = value
        .to_str()
        .map_err(|_| ApiError::Unauthorized("the Authorization header is not text".into()))?;
    let (scheme, cred) = value.split_once(' ').unwrap_or((value, ""));
    let cred = cred.trim();
    if scheme.eq_ignore_ascii_case("api-key") {
        Ok(identity::check_api_key(&state.db, cred).await?)
    } else if scheme.eq_ignore_ascii_case("basic") {
        Ok(
            identity::check_password(&state.db, &state.passwords, &state.throttle, cred, client)
                .await?,
        )
    } else {
        Err(ApiError::Unauthorized(format!(
            "unsupported Authorization scheme {scheme:?}; use 'Api-Key <key>' or HTTP Basic"
        )))
    }
}

/// Authentication, authorisation and the version lock.
pub async fn auth_layer(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let tls = req
        .extensions()
        .get::<std::sync::Arc<axum_server::tls::TlsInfo>>()
        .cloned();
    let client = client_ip(&state, &req);
    let principal = match authenticate(&state, req.headers(), tls.as_deref(), client).await {
        Ok(p) => p,
        Err(e) => return refuse(req, e).await,
    };
    let path = req.uri().path().to_owned();
    if principal == Principal::Anonymous {
        if !access::is_public(&path) {
            return refuse(
                req,
                ApiError::Unauthorized(
                    "authenticate with 'Authorization: Api-Key <key>' or HTTP Basic".into(),
                ),
            )
            .await;
        }
    } else {
        let exempt = state.config.skip_version_check
            || state
                .config
                .version_exempt
                .iter()
                .any(|p| path.starts_with(p.as_str()));
        if !exempt {
            let sent = req
                .headers()
                .get(mprov_api::VERSION_HEADER)
                .map(|v| v.to_str().unwrap_or("?").to_owned());
            if sent.as_deref() != Some(mprov_api::api_version()) {
                return refuse(req, ApiError::UpgradeRequired { client: sent }).await;
            }
        }
        if let Err(e) = access::check(
            &state.db,
            state.config.shared_key_mode,
            &principal,
            access::Method::from_name(req.method().as_str()),
            &path,
            req.uri().query(),
        )
        .await
        {
            return refuse(req, ApiError::from(e)).await;
        }
    }
    req.extensions_mut().insert(principal);
    next.run(req).await
}

/// How much of a refused request's body is read before the refusal.
const DRAIN_LIMIT: usize = 64 * 1024;

/// A refusal before the handler, sent once the request's body (up to
/// [`DRAIN_LIMIT`]) has been read: an answer sent while the client is still
/// uploading reaches some HTTP/2 clients as a reset stream instead (curl
/// 7.88 reported no status at all for an anonymous POST, about one time in
/// two), and the message saying what to do is lost.
async fn refuse(req: Request, error: ApiError) -> Response {
    let _ = axum::body::to_bytes(req.into_body(), DRAIN_LIMIT).await;
    error.into_response()
}

/// The edge: the Host check, the version header on every response, one log line
/// per request with the client's address.
pub async fn edge_layer(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.to_string()));
    let client = client_ip(&state, &req);
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let mut resp = match host {
        Some(h) if !state.config.host_allowed(&h) => {
            tracing::warn!(host = %h, "refused a request for a host name not in ALLOWED_HOSTS");
            ApiError::bad_request(
                "host_not_allowed",
                format!("Host {h:?} is not allowed; add it to ALLOWED_HOSTS"),
            )
            .into_response()
        }
        _ => next.run(req).await,
    };
    resp.headers_mut().insert(
        mprov_api::VERSION_HEADER,
        HeaderValue::from_static(mprov_api::api_version()),
    );
    let client = client
        .map(|c: IpAddr| c.to_string())
        .unwrap_or_else(|| "-".into());
    tracing::debug!(%client, %method, %path, status = resp.status().as_u16(), "request");
    resp
}
