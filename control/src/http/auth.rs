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

/// Which part of the router a request was routed to, and so what is checked
/// before its handler: the router's structure says which paths are public
/// ([`super::router`]), not a list here or in [`crate::access`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Served to anyone: credentials, if sent, are still checked (and the
    /// version lock with them), so a handler may tell who asks.
    Public,
    /// Needs credentials; the handler asks [`crate::access`] itself, with
    /// what the request names (the boot timeline, manifest, heartbeat and
    /// renewal).
    Authenticated,
    /// Needs credentials and [`access::check`] on the path: the inventory.
    Inventory,
}

/// The layer of the router's public part.
pub async fn public_layer(State(state): State<AppState>, req: Request, next: Next) -> Response {
    gate(&state, Part::Public, req, next).await
}

/// The layer of the part whose handlers decide access themselves.
pub async fn authenticated_layer(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    gate(&state, Part::Authenticated, req, next).await
}

/// The layer of the inventory.
pub async fn inventory_layer(State(state): State<AppState>, req: Request, next: Next) -> Response {
    gate(&state, Part::Inventory, req, next).await
}

/// Authentication, the version lock and, for the inventory, authorisation;
/// the handler finds the [`Principal`] in the request's extensions.
async fn gate(state: &AppState, part: Part, mut req: Request, next: Next) -> Response {
    let tls = req
        .extensions()
        .get::<std::sync::Arc<axum_server::tls::TlsInfo>>()
        .cloned();
    let client = client_ip(state, &req);
    let principal = match authenticate(state, req.headers(), tls.as_deref(), client).await {
        Ok(p) => p,
        Err(e) => return refuse(req, e).await,
    };
    let path = req.uri().path().to_owned();
    if principal == Principal::Anonymous {
        if part != Part::Public {
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
        if part == Part::Inventory
            && let Err(e) = access::check(
                &state.db,
                state.config.shared_key_mode,
                &principal,
                access::Method::from_name(req.method().as_str()),
                target(&path),
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

/// What an inventory path reaches: `<kind>[/<key>[/<rest>]]` under
/// [`mprov_api::API_PREFIX`], its root, or anything else.
fn target(path: &str) -> access::Target<'_> {
    let Some(under) = path.strip_prefix(mprov_api::API_PREFIX) else {
        return access::Target::Elsewhere;
    };
    if under.is_empty() || under == "/" {
        return access::Target::Index;
    }
    let Some(under) = under.strip_prefix('/') else {
        return access::Target::Elsewhere;
    };
    let mut it = under.trim_end_matches('/').splitn(3, '/');
    match it.next().filter(|k| !k.is_empty()) {
        Some(kind) => access::Target::Inventory {
            kind,
            key: it.next().filter(|k| !k.is_empty()),
            rest: it.next(),
        },
        None => access::Target::Elsewhere,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use access::Target;

    #[test]
    fn inventory_paths_become_targets() {
        let inventory = |kind, key, rest| Target::Inventory { kind, key, rest };
        for (path, want) in [
            ("/api/v1", Target::Index),
            ("/api/v1/", Target::Index),
            ("/api/v1/systems/", inventory("systems", None, None)),
            (
                "/api/v1/systems/c01",
                inventory("systems", Some("c01"), None),
            ),
            (
                "/api/v1/systems/c01/config",
                inventory("systems", Some("c01"), Some("config")),
            ),
            (
                "/api/v1/images/x/hosts/js1",
                inventory("images", Some("x"), Some("hosts/js1")),
            ),
            ("/api/v1//", Target::Elsewhere),
            ("/api/v1x/systems", Target::Elsewhere),
            ("/elsewhere", Target::Elsewhere),
        ] {
            assert_eq!(target(path), want, "{path}");
        }
    }
}
