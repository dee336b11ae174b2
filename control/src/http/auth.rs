//! Who is asking: authentication, the version lock, and the edge checks every
//! request passes (allowed Host, the version header on every response).
//!
//! Order matters and is part of the API contract: the Host check, then
//! authentication (401), then the version (426), then the handler. Handlers
//! only ever see a [`Principal`], never the transport.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};
use sqlx::Row;

use super::AppState;
use super::error::ApiError;
use crate::db::{Val, opt_bool};
use crate::secrets;

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// No credentials.
    Anonymous,
    /// An API key: admin rights, except the old shared key, which
    /// `MPROV_SHARED_KEY_MODE` narrows (see [`super::scope`]).
    ApiKey {
        /// The key's row id.
        id: i64,
        /// Its name.
        name: String,
        /// Whether it is the shared key made at first start.
        shared: bool,
    },
    /// A node or job server with a client certificate from enrollment.
    Agent(crate::enroll::Agent),
    /// A user who sent a password (HTTP Basic).
    User {
        /// The user's name.
        username: String,
        /// Whether the user may change things.
        is_admin: bool,
    },
}

impl Principal {
    /// Whether this principal may write to the inventory.
    pub fn is_admin(&self) -> bool {
        match self {
            Principal::Anonymous | Principal::Agent(_) => false,
            Principal::ApiKey { shared, .. } => !shared,
            Principal::User { is_admin, .. } => *is_admin,
        }
    }
}

/// How long a checked password is remembered, so a client making many requests
/// with Basic auth pays for argon2 once, not on every request.
const PASSWORD_CACHE_TTL: Duration = Duration::from_secs(300);
/// At most this many remembered passwords; the cache is cleared when full.
const PASSWORD_CACHE_MAX: usize = 1024;

/// Remembers recently verified (user, password, stored hash) triples.
#[derive(Debug, Default)]
pub struct PasswordCache {
    entries: Mutex<HashMap<[u8; 32], Instant>>,
}

impl PasswordCache {
    fn key(username: &str, password: &str, stored: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        for part in [username, password, stored] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().into()
    }

    fn hit(&self, key: &[u8; 32]) -> bool {
        let Ok(map) = self.entries.lock() else {
            return false;
        };
        map.get(key)
            .is_some_and(|t| t.elapsed() < PASSWORD_CACHE_TTL)
    }

    fn remember(&self, key: [u8; 32]) {
        if let Ok(mut map) = self.entries.lock() {
            if map.len() >= PASSWORD_CACHE_MAX {
                map.clear();
            }
            map.insert(key, Instant::now());
        }
    }
}

/// Wrong passwords allowed per client address, and per user name, before
/// password checks answer 429; the count starts over once a
/// [`FAILURE_WINDOW`] passed without a wrong password, so a flood, however
/// slow its checks, never gets more than this many through. Right passwords
/// are not counted.
pub const MAX_FAILURES: u32 = 10;
/// The quiet time after which the count of wrong passwords starts over.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// argon2 checks running at once: one, so a flood of passwords holds at
/// most one of the cores and the API keeps answering on the others.
pub const ARGON2_AT_ONCE: usize = 1;
/// Password checks that may wait for their turn; more get 429 at once.
pub const ARGON2_QUEUE: usize = 16;
/// Counters kept at most; older windows are dropped first.
const THROTTLE_MAX_KEYS: usize = 10_000;

/// Bounds password checking: argon2 runs [`ARGON2_AT_ONCE`] at a time with
/// at most [`ARGON2_QUEUE`] waiting, and wrong passwords are counted per
/// client address and per user name ([`MAX_FAILURES`] per [`FAILURE_WINDOW`]).
#[derive(Debug)]
pub struct PasswordThrottle {
    argon2: tokio::sync::Semaphore,
    waiting: std::sync::atomic::AtomicUsize,
    failures: Mutex<HashMap<String, (Instant, u32)>>,
}

impl Default for PasswordThrottle {
    fn default() -> Self {
        PasswordThrottle {
            argon2: tokio::sync::Semaphore::new(ARGON2_AT_ONCE),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            failures: Mutex::new(HashMap::new()),
        }
    }
}

/// The throttle's decision for one key: how long until it may try again.
/// Pure: `entry` is the last wrong password's time and the count.
pub fn throttled(entry: Option<(Instant, u32)>, now: Instant) -> Option<Duration> {
    let (last, count) = entry?;
    let end = last + FAILURE_WINDOW;
    (count >= MAX_FAILURES && now < end).then(|| end - now)
}

impl PasswordThrottle {
    fn keys(client: Option<IpAddr>, username: &str) -> Vec<String> {
        let mut keys = vec![format!("user:{}", username.to_ascii_lowercase())];
        if let Some(ip) = client {
            keys.push(format!("ip:{ip}"));
        }
        keys
    }

    /// Refuses with 429 if this client or user name had too many wrong
    /// passwords lately.
    fn check(&self, client: Option<IpAddr>, username: &str) -> Result<(), ApiError> {
        let now = Instant::now();
        let map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        for key in Self::keys(client, username) {
            if let Some(wait) = throttled(map.get(&key).copied(), now) {
                let secs = u32::try_from(wait.as_secs() + 1).unwrap_or(u32::MAX);
                let who = if key.starts_with("ip:") {
                    "from this address"
                } else {
                    "for this user name"
                };
                return Err(ApiError::TooManyRequests {
                    message: format!(
                        "too many wrong passwords {who} ({MAX_FAILURES} without {}s between them); try again in {secs}s",
                        FAILURE_WINDOW.as_secs()
                    ),
                    retry_after: secs,
                });
            }
        }
        Ok(())
    }

    fn failed(&self, client: Option<IpAddr>, username: &str) {
        let now = Instant::now();
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= THROTTLE_MAX_KEYS {
            map.retain(|_, (start, _)| now.duration_since(*start) < FAILURE_WINDOW);
            if map.len() >= THROTTLE_MAX_KEYS {
                map.clear();
            }
        }
        for key in Self::keys(client, username) {
            let e = map.entry(key).or_insert((now, 0));
            if now.duration_since(e.0) >= FAILURE_WINDOW {
                e.1 = 0;
            }
            *e = (now, e.1.saturating_add(1));
        }
    }

    /// Runs one argon2 check on the blocking pool, in turn. The limits are
    /// checked again once it is this check's turn, and a wrong password is
    /// counted before the next check may start, so no flood gets more than
    /// [`MAX_FAILURES`] checks through.
    async fn verify(
        &self,
        client: Option<IpAddr>,
        username: &str,
        password: String,
        stored: String,
    ) -> Result<bool, ApiError> {
        use std::sync::atomic::Ordering;
        let busy = || ApiError::TooManyRequests {
            message: format!(
                "too many password checks at once (over {ARGON2_QUEUE} waiting); try again in a second, or use an API key"
            ),
            retry_after: 1,
        };
        self.check(client, username)?;
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= ARGON2_QUEUE {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(busy());
        }
        let permit = self.argon2.acquire().await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        let _permit = permit.map_err(|_| busy())?;
        self.check(client, username)?;
        let ok = tokio::task::spawn_blocking(move || secrets::verify_password(&password, &stored))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        if !ok {
            self.failed(client, username);
        }
        Ok(ok)
    }
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
            Some(der) => Ok(Principal::Agent(
                crate::enroll::check_certificate(&state.db, der).await?,
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
        api_key(state, cred).await
    } else if scheme.eq_ignore_ascii_case("basic") {
        basic(state, cred, client).await
    } else {
        Err(ApiError::Unauthorized(format!(
            "unsupported Authorization scheme {scheme:?}; use 'Api-Key <key>' or HTTP Basic"
        )))
    }
}

async fn api_key(state: &AppState, key: &str) -> Result<Principal, ApiError> {
    let bad = || ApiError::Unauthorized("the API key is not valid".into());
    let (prefix, secret) = secrets::split_api_key(key).ok_or_else(bad)?;
    let db = &state.db;
    let mut sql = db.sql();
    // The shared key's prefix comes along in the same query: no second
    // round trip on every request.
    sql.push(
        "SELECT id, name, hash, expires_at, revoked, (SELECT value FROM settings WHERE name = ",
    );
    sql.bind(Val::Text(Some(
        crate::first_start::SHARED_KEY_SETTING.to_owned(),
    )));
    sql.push(") AS shared_prefix FROM api_keys WHERE prefix = ");
    sql.bind(Val::Text(Some(prefix.to_owned())));
    let row = sql
        .query()
        .fetch_optional(db.pool())
        .await
        .map_err(|e| ApiError::Internal(format!("api key lookup: {e}")))?
        .ok_or_else(bad)?;
    let hash: String = row
        .try_get("hash")
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    if !secrets::hashes_equal(&secrets::hash_api_secret(secret), &hash) {
        return Err(bad());
    }
    if opt_bool(&row, "revoked").ok().flatten().unwrap_or(true) {
        return Err(ApiError::Unauthorized(
            "this API key was revoked; make a new one".into(),
        ));
    }
    let expires: Option<String> = row.try_get("expires_at").unwrap_or(None);
    if let Some(exp) = expires
        && exp <= crate::db::crud::now()
    {
        return Err(ApiError::Unauthorized(format!(
            "this API key expired at {exp}; make a new one"
        )));
    }
    let id = crate::db::int(&row, "id").map_err(|e| ApiError::Internal(e.to_string()))?;
    let name: String = row.try_get("name").unwrap_or_default();
    let shared_prefix: Option<String> = row.try_get("shared_prefix").unwrap_or(None);
    let shared = shared_prefix.as_deref() == Some(prefix);
    Ok(Principal::ApiKey { id, name, shared })
}

async fn basic(
    state: &AppState,
    cred: &str,
    client: Option<IpAddr>,
) -> Result<Principal, ApiError> {
    let bad = || ApiError::Unauthorized("wrong user name or password".into());
    let decoded = STANDARD.decode(cred).map_err(|_| bad())?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
    let (username, password) = decoded.split_once(':').ok_or_else(bad)?;
    let db = &state.db;
    let mut sql = db.sql();
    sql.push("SELECT password, is_admin FROM users WHERE username = ");
    sql.bind(Val::Text(Some(username.to_ascii_lowercase())));
    let row = sql
        .query()
        .fetch_optional(db.pool())
        .await
        .map_err(|e| ApiError::Internal(format!("user lookup: {e}")))?;
    let throttle = &state.throttle;
    let Some(row) = row else {
        // Spend the same time as a real check, so timing does not tell which
        // user names exist; it counts as a wrong password.
        throttle
            .verify(client, username, password.to_owned(), DUMMY_HASH.to_owned())
            .await?;
        return Err(bad());
    };
    let stored: String = row
        .try_get("password")
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let is_admin = opt_bool(&row, "is_admin").ok().flatten().unwrap_or(false);
    let key = PasswordCache::key(username, password, &stored);
    if !state.passwords.hit(&key) {
        let ok = throttle
            .verify(client, username, password.to_owned(), stored.clone())
            .await?;
        if !ok {
            return Err(bad());
        }
        state.passwords.remember(key);
    }
    Ok(Principal::User {
        username: username.to_ascii_lowercase(),
        is_admin,
    })
}

/// An argon2 hash of a random string, verified against when a user does not
/// exist.
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$W2M7YV0R6Rk3dn1rRRwT0ZbXJc8nKOWkqf5NjVj2b3s";

/// Whether a path is served to anyone.
pub(crate) fn is_public(path: &str) -> bool {
    matches!(
        path,
        "/api/v1/openapi.json" | "/ca.crt" | "/ipxe/" | "/enroll/jobserver/" | "/enroll/node/"
    )
}

/// Authentication, authorisation and the version lock.
pub async fn auth_layer(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let tls = req
        .extensions()
        .get::<std::sync::Arc<axum_server::tls::TlsInfo>>()
        .cloned();
    let client = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .map(|peer| {
            let xff = req
                .headers()
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok());
            state.config.client_ip(peer, xff)
        });
    let principal = match authenticate(&state, req.headers(), tls.as_deref(), client).await {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let path = req.uri().path().to_owned();
    if principal == Principal::Anonymous {
        if !is_public(&path) {
            return ApiError::Unauthorized(
                "authenticate with 'Authorization: Api-Key <key>' or HTTP Basic".into(),
            )
            .into_response();
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
                return ApiError::UpgradeRequired { client: sent }.into_response();
            }
        }
        if let Err(e) =
            super::scope::check(&state, &principal, req.method(), &path, req.uri().query()).await
        {
            return e.into_response();
        }
    }
    req.extensions_mut().insert(principal);
    next.run(req).await
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
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let client = peer.map(|p| {
        let xff = req
            .headers()
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok());
        state.config.client_ip(p, xff)
    });
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

    #[test]
    fn the_throttle_counts_until_a_quiet_window() {
        let t0 = Instant::now();
        assert_eq!(throttled(None, t0), None);
        assert_eq!(throttled(Some((t0, MAX_FAILURES - 1)), t0), None);
        assert_eq!(
            throttled(Some((t0, MAX_FAILURES)), t0),
            Some(FAILURE_WINDOW)
        );
        assert_eq!(
            throttled(Some((t0, MAX_FAILURES)), t0 + FAILURE_WINDOW),
            None
        );
    }

    /// The stand-in hash must parse, or an unknown user would be refused
    /// faster than a wrong password and timing would tell names apart.
    #[test]
    fn dummy_hash_is_a_real_argon2_hash() {
        assert!(argon2::password_hash::phc::PasswordHash::new(DUMMY_HASH).is_ok());
        assert!(!secrets::verify_password("anything", DUMMY_HASH));
    }
}
