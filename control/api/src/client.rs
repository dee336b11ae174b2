//! A typed async client for the control service's REST API.
//!
//! The client is deliberately generic over kinds: resources travel as
//! [`serde_json::Value`], so a field added to the server's kind descriptors
//! needs no release of this crate, and `mash` can show whatever the server
//! returns. What the client does type is the protocol around the bodies: the
//! URL layout (`/api/v1/<kind>/<id or slug>`), the [`List`] envelope and its
//! cursors, the [`ApiError`] body, authentication and the version lock.
//!
//! The version lock: every request carries [`VERSION_HEADER`] with
//! [`api_version`], and every reply must carry the same value. A reply from
//! another version, or one without the header, is refused with
//! [`ClientError::VersionMismatch`] before its body is looked at, because a
//! body from another version may mean something else (ARCHITECTURE.md,
//! "Cross-cutting concerns"). The server answers a request from another version with 426 Upgrade
//! Required, which becomes the same error. Only
//! [`SKIP_VERSION_CHECK_ENV`]`=1` turns the check off, for development.
//!
//! TLS: the workspace uses one rustls crypto provider, ring. reqwest is built
//! without a provider, so [`ClientBuilder::build`] installs ring as the
//! process-wide default when nothing else has installed one yet; a process
//! that installed its own provider first keeps it. Plain `http://` needs none
//! of this and works as well.

use std::fmt;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use url::Url;

use crate::nads::DISCOVERY_PATH;
use crate::{
    API_PREFIX, ApiError, BulkCreated, List, SKIP_VERSION_CHECK_ENV, VERSION_HEADER, api_version,
};

/// The page size [`Client::list_all`] asks for.
pub const LIST_ALL_PAGE: u32 = 1000;

/// How long a whole request may take by default. Bulk creates of many
/// thousands of rows are the slowest calls; they finish well inside this.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// How long connecting may take by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How a client proves who it is.
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    /// `Authorization: Api-Key <key>`.
    ApiKey(String),
    /// HTTP Basic with a user name and password.
    Basic {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
    /// No credentials: only anonymous endpoints will answer.
    None,
}

// Hand-written so that secrets never reach a log line.
impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::ApiKey(_) => f.write_str("ApiKey(<redacted>)"),
            Auth::Basic { user, .. } => f
                .debug_struct("Basic")
                .field("user", user)
                .field("password", &"<redacted>")
                .finish(),
            Auth::None => f.write_str("None"),
        }
    }
}

/// Everything that can go wrong talking to the control service.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error status and an [`ApiError`] body.
    #[error("{}", api_message(*status, body))]
    Api {
        /// The HTTP status.
        status: StatusCode,
        /// The error body (synthesised when the server sent none).
        body: ApiError,
    },
    /// The base URL is unusable.
    #[error("invalid server URL {url:?}: {reason}")]
    BadBaseUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The credentials cannot be put in a header.
    #[error("the API key contains characters that cannot go in an HTTP header")]
    BadCredentials,
    /// A path given to [`Client::get_path`] does not stay on the server.
    #[error("{path:?} is not an absolute path on the server")]
    BadPath {
        /// The path as given.
        path: String,
    },
    /// The HTTP client could not be built.
    #[error("could not build the HTTP client")]
    Build {
        /// What reqwest reported.
        #[source]
        source: reqwest::Error,
    },
    /// A CA certificate given to [`ClientBuilder::ca_certificates_pem`] is invalid.
    #[error("invalid CA certificate")]
    Certificate {
        /// What reqwest reported.
        #[source]
        source: reqwest::Error,
    },
    /// A client certificate given to [`ClientBuilder::identity_pem`] is
    /// invalid.
    #[error("invalid client certificate or key")]
    Identity {
        /// What reqwest reported.
        #[source]
        source: reqwest::Error,
    },
    /// A successful reply's body is not what the API promises.
    #[error("could not decode the reply to {method} {url}")]
    Decode {
        /// The request method.
        method: Method,
        /// The request URL.
        url: Url,
        /// What serde reported.
        #[source]
        source: serde_json::Error,
    },
    /// The request did not complete: connection, TLS, timeout or body errors.
    #[error("{method} {url} failed")]
    Http {
        /// The request method.
        method: Method,
        /// The request URL.
        url: Url,
        /// What reqwest reported.
        #[source]
        source: reqwest::Error,
    },
    /// The server runs another API version than this client, or sent none.
    #[error("{}", version_message(server.as_deref(), ours))]
    VersionMismatch {
        /// The version the server sent, if any.
        server: Option<String>,
        /// The version this client speaks.
        ours: &'static str,
    },
}

impl ClientError {
    /// The HTTP status of an [`ClientError::Api`] error.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

fn api_message(status: StatusCode, body: &ApiError) -> String {
    let mut out = format!("the server answered {status}: {}", body.message);
    if body.message.is_empty() {
        out.push_str(&body.error);
    }
    if let Some(field) = &body.field {
        out.push_str(&format!(" (field {field})"));
    }
    out
}

fn version_message(server: Option<&str>, ours: &str) -> String {
    match server {
        Some(server) if server == ours => format!(
            "the server refused this client's version ({ours}) although it speaks the same \
             (426 Upgrade Required); a proxy between them may be dropping the {VERSION_HEADER} header"
        ),
        Some(server) => format!(
            "the server speaks mProv API version {server} but this client speaks {ours}; \
             upgrade mash and the server together so they run the same major.minor version"
        ),
        None => format!(
            "the server sent no {VERSION_HEADER} header (is the URL an mProv control service?); \
             this client speaks mProv API version {ours}; \
             upgrade mash and the server together so they run the same major.minor version"
        ),
    }
}

/// Checks a reply's status and version header against `ours`: 426 Upgrade
/// Required, a missing header and another version are all refused.
fn check_version(
    status: StatusCode,
    header: Option<&HeaderValue>,
    ours: &'static str,
) -> Result<(), ClientError> {
    let server = header.map(|h| String::from_utf8_lossy(h.as_bytes()).trim().to_owned());
    if status == StatusCode::UPGRADE_REQUIRED || server.as_deref() != Some(ours) {
        return Err(ClientError::VersionMismatch { server, ours });
    }
    Ok(())
}

/// Turns an error reply's body into an [`ApiError`], making one up from the
/// status and text when the body is not one (a proxy's HTML page, say).
fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
    let body = serde_json::from_slice::<ApiError>(body).unwrap_or_else(|_| {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        let mut message: String = text.chars().take(500).collect();
        if message.is_empty() {
            message = status.canonical_reason().unwrap_or("no message").to_owned();
        }
        ApiError {
            error: format!("http_{}", status.as_u16()),
            message,
            field: None,
        }
    });
    ClientError::Api { status, body }
}

/// Configures a [`Client`]; made by [`Client::builder`].
#[derive(Debug)]
pub struct ClientBuilder {
    base_url: String,
    auth: Auth,
    ca_pem: Option<Vec<u8>>,
    identity_pem: Option<Vec<u8>>,
    timeout: Duration,
    skip_version_check: bool,
    local_address: Option<std::net::IpAddr>,
}

impl ClientBuilder {
    /// Connect from this local address (a job server's heartbeat on one of
    /// its addresses goes out from that address).
    pub fn local_address(mut self, address: std::net::IpAddr) -> Self {
        self.local_address = Some(address);
        self
    }

    /// Trust only the CA certificates in this PEM bundle (the install's own CA,
    /// `ca.crt`), instead of the system's roots.
    pub fn ca_certificates_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Present this client certificate (PEM: the certificate, then its
    /// private key) over HTTPS: an enrolled agent's identity.
    pub fn identity_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.identity_pem = Some(pem.into());
        self
    }

    /// How long a whole request may take; [`DEFAULT_TIMEOUT`] otherwise.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Turn the version check off (on by default, unless
    /// [`SKIP_VERSION_CHECK_ENV`] is exactly `1`). For development only.
    pub fn danger_skip_version_check(mut self, skip: bool) -> Self {
        self.skip_version_check = skip;
        self
    }

    /// Builds the client.
    pub fn build(self) -> Result<Client, ClientError> {
        let base = parse_base_url(&self.base_url)?;
        let api_key = match &self.auth {
            Auth::ApiKey(key) => {
                let mut value = HeaderValue::from_str(&format!("Api-Key {key}"))
                    .map_err(|_| ClientError::BadCredentials)?;
                value.set_sensitive(true);
                Some(value)
            }
            Auth::Basic { .. } | Auth::None => None,
        };
        ensure_crypto_provider();
        let mut http = reqwest::Client::builder()
            .user_agent(concat!("mprov-api/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(DEFAULT_CONNECT_TIMEOUT)
            .timeout(self.timeout);
        if let Some(pem) = &self.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|source| ClientError::Certificate { source })?;
            http = http.tls_certs_only(certs);
        }
        if let Some(pem) = &self.identity_pem {
            let identity = reqwest::Identity::from_pem(pem)
                .map_err(|source| ClientError::Identity { source })?;
            http = http.identity(identity);
        }
        if let Some(address) = self.local_address {
            http = http.local_address(address);
        }
        let http = http
            .build()
            .map_err(|source| ClientError::Build { source })?;
        Ok(Client {
            http,
            base,
            auth: self.auth.clone(),
            api_key,
            check_version: !self.skip_version_check,
            tls: Tls {
                ca_pem: self.ca_pem,
                identity_pem: self.identity_pem,
                timeout: self.timeout,
            },
        })
    }
}

/// Installs ring as the process's rustls crypto provider unless one is
/// installed already. Losing a race to another installer is fine: either way
/// a provider is in place.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

fn parse_base_url(raw: &str) -> Result<Url, ClientError> {
    let bad = |reason: String| ClientError::BadBaseUrl {
        url: raw.to_owned(),
        reason,
    };
    let url = Url::parse(raw.trim()).map_err(|e| bad(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https".to_owned()));
    }
    if url.cannot_be_a_base() || url.host().is_none() {
        return Err(bad("it has no host".to_owned()));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("it must not have a query or fragment".to_owned()));
    }
    Ok(url)
}

/// A client of one control service, cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    auth: Auth,
    api_key: Option<HeaderValue>,
    check_version: bool,
    /// What [`Client::elsewhere`] builds another client with.
    tls: Tls,
}

/// The TLS settings a client was built with.
#[derive(Clone)]
struct Tls {
    ca_pem: Option<Vec<u8>>,
    identity_pem: Option<Vec<u8>>,
    timeout: Duration,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca_pem", &self.ca_pem.is_some())
            .field("identity_pem", &self.identity_pem.is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Client {
    /// A client of the control service at `base_url` (`https://mpcc:8443`, or
    /// with a path prefix, `https://host/mprov/`), with default settings.
    pub fn new(base_url: &str, auth: Auth) -> Result<Client, ClientError> {
        Client::builder(base_url, auth).build()
    }

    /// A builder for a client with non-default settings.
    pub fn builder(base_url: &str, auth: Auth) -> ClientBuilder {
        ClientBuilder {
            identity_pem: None,
            base_url: base_url.to_owned(),
            auth,
            ca_pem: None,
            timeout: DEFAULT_TIMEOUT,
            local_address: None,
            skip_version_check: crate::skip_version_check(
                std::env::var(SKIP_VERSION_CHECK_ENV).ok().as_deref(),
            ),
        }
    }

    /// A client with the same credentials and TLS settings, of the control
    /// service at `base_url` (`None`: this one's), connecting from the
    /// local address `local` if given.
    pub fn elsewhere(
        &self,
        base_url: Option<&str>,
        local: Option<std::net::IpAddr>,
    ) -> Result<Client, ClientError> {
        let base = base_url.map_or_else(|| self.base.to_string(), str::to_owned);
        let mut builder = Client::builder(&base, self.auth.clone())
            .timeout(self.tls.timeout)
            .danger_skip_version_check(!self.check_version);
        builder.ca_pem.clone_from(&self.tls.ca_pem);
        builder.identity_pem.clone_from(&self.tls.identity_pem);
        if let Some(address) = local {
            builder = builder.local_address(address);
        }
        builder.build()
    }

    /// The base URL.
    pub fn base_url(&self) -> &Url {
        &self.base
    }

    /// One page of `kind`, filtered by `query`: fields, `limit`, `cursor` and
    /// `sort` (`field` or `-field`) as query parameters.
    pub async fn list<K, V>(&self, kind: &str, query: &[(K, V)]) -> Result<List<Value>, ClientError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let url = self.kind_url(kind, None, query);
        self.call(Method::GET, url, None::<&()>).await
    }

    /// Every row of `kind` matching `filters`, following the `next` cursors
    /// with pages of [`LIST_ALL_PAGE`]. A `limit` or `cursor` in `filters` is
    /// ignored.
    pub async fn list_all<K, V>(
        &self,
        kind: &str,
        filters: &[(K, V)],
    ) -> Result<Vec<Value>, ClientError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let limit = LIST_ALL_PAGE.to_string();
        let mut query: Vec<(&str, &str)> = filters
            .iter()
            .map(|(k, v)| (k.as_ref(), v.as_ref()))
            .filter(|(k, _)| *k != "limit" && *k != "cursor")
            .collect();
        query.push(("limit", &limit));
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut page_query = query.clone();
            if let Some(cursor) = &cursor {
                page_query.push(("cursor", cursor));
            }
            let page = self.list(kind, &page_query).await?;
            let empty = page.items.is_empty();
            items.extend(page.items);
            // An empty page that still points further would loop forever; a
            // correct server never sends one, so stop rather than spin.
            match page.next {
                Some(next) if !empty && cursor.as_deref() != Some(next.as_str()) => {
                    cursor = Some(next)
                }
                _ => break,
            }
        }
        Ok(items)
    }

    /// The row of `kind` with this id or slug.
    pub async fn get(&self, kind: &str, key: &str) -> Result<Value, ClientError> {
        let url = self.kind_url(kind, Some(key), &[] as &[(&str, &str)]);
        self.call(Method::GET, url, None::<&()>).await
    }

    /// Creates a row of `kind`; returns it as stored.
    pub async fn create(&self, kind: &str, body: &Value) -> Result<Value, ClientError> {
        let url = self.kind_url(kind, Some(""), &[] as &[(&str, &str)]);
        self.call(Method::POST, url, Some(body)).await
    }

    /// Creates all `rows` of `kind` in one transaction: all or none.
    pub async fn bulk_create(
        &self,
        kind: &str,
        rows: &[Value],
    ) -> Result<BulkCreated, ClientError> {
        let url = self.kind_url(kind, Some("bulk"), &[] as &[(&str, &str)]);
        self.call(Method::POST, url, Some(rows)).await
    }

    /// Changes the fields in `patch` of the row with this id or slug; returns
    /// the row as stored.
    pub async fn update(&self, kind: &str, key: &str, patch: &Value) -> Result<Value, ClientError> {
        let url = self.kind_url(kind, Some(key), &[] as &[(&str, &str)]);
        self.call(Method::PATCH, url, Some(patch)).await
    }

    /// Deletes the row with this id or slug.
    pub async fn delete(&self, kind: &str, key: &str) -> Result<(), ClientError> {
        let url = self.kind_url(kind, Some(key), &[] as &[(&str, &str)]);
        self.send(Method::DELETE, url, None::<&()>).await?;
        Ok(())
    }

    /// `GET` any other endpoint, by its absolute path on the server with an
    /// optional query, such as `/api/v1/systems/n001/config`.
    pub async fn get_path(&self, path: &str) -> Result<Value, ClientError> {
        let url = self.path_url(path)?;
        self.call(Method::GET, url, None::<&()>).await
    }

    /// The boot config snapshot once the inventory revision is past `after`,
    /// waiting up to `wait` for a change (the server caps it at 60 s); `None`
    /// when nothing changed in that time.
    pub async fn boot_config(
        &self,
        after: i64,
        wait: Duration,
    ) -> Result<Option<crate::boot::BootConfig>, ClientError> {
        let path = format!(
            "{}?after={after}&wait={}",
            crate::boot::BOOTCONFIG_PATH,
            wait.as_secs()
        );
        let url = self.path_url(&path)?;
        let bytes = self.send(Method::GET, url.clone(), None::<&()>).await?;
        if bytes.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| ClientError::Decode {
                method: Method::GET,
                url,
                source,
            })
    }

    /// `GET` an endpoint that answers text (an iPXE script), by its absolute
    /// path on the server.
    pub async fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let url = self.path_url(path)?;
        let bytes = self.send(Method::GET, url, None::<&()>).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Reports one step of a boot (`POST /api/v1/boot/events`): a node for
    /// itself, with its own certificate; a job server for the node it names.
    pub async fn report_boot_event(
        &self,
        report: &crate::boot::BootEventReport,
    ) -> Result<crate::boot::BootEvent, ClientError> {
        let url = self.path_url(crate::boot::EVENTS_PATH)?;
        self.call(Method::POST, url, Some(report)).await
    }

    /// Reports many steps of boots at once
    /// (`POST /api/v1/boot/events/batch`, at most
    /// [`MAX_BATCH`](crate::boot::MAX_BATCH)): what was stored and what
    /// was refused, event by event.
    pub async fn report_boot_events(
        &self,
        reports: &[crate::boot::BootEventReport],
    ) -> Result<crate::boot::BatchOutcome, ClientError> {
        let url = self.path_url(crate::boot::EVENTS_BATCH_PATH)?;
        self.call(Method::POST, url, Some(reports)).await
    }

    /// Reports this job server's load (`POST /api/v1/boot/heartbeat`), with
    /// its own certificate.
    pub async fn heartbeat(&self, beat: &crate::boot::Heartbeat) -> Result<(), ClientError> {
        let url = self.path_url(crate::boot::HEARTBEAT_PATH)?;
        self.send(Method::POST, url, Some(beat)).await.map(drop)
    }

    /// Registers this job server's row (`POST /api/v1/jobserver/register`),
    /// with its own certificate.
    pub async fn register(
        &self,
        registration: &crate::jobs::Registration,
    ) -> Result<crate::jobs::Registered, ClientError> {
        let url = self.path_url(crate::jobs::REGISTER_PATH)?;
        self.call(Method::POST, url, Some(registration)).await
    }

    /// Claims the oldest pending job of `claim`'s modules
    /// (`POST /api/v1/jobserver/claim`); `None` when there is none.
    pub async fn claim_job(
        &self,
        claim: &crate::jobs::Claim,
    ) -> Result<Option<crate::jobs::Job>, ClientError> {
        let url = self.path_url(crate::jobs::CLAIM_PATH)?;
        let bytes = self.send(Method::POST, url.clone(), Some(claim)).await?;
        if bytes.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| ClientError::Decode {
                method: Method::POST,
                url,
                source,
            })
    }

    /// Says this job server hosts an image version
    /// (`POST /api/v1/jobserver/hosting`).
    pub async fn record_hosting(&self, hosting: &crate::jobs::Hosting) -> Result<(), ClientError> {
        let url = self.path_url(crate::jobs::HOSTING_PATH)?;
        self.send(Method::POST, url, Some(hosting)).await.map(drop)
    }

    /// The files recorded for `version` of `image` (`None`: its current
    /// version): what a copy is verified against.
    pub async fn image_files(
        &self,
        image: &str,
        version: Option<i64>,
    ) -> Result<crate::jobs::ImageFiles, ClientError> {
        let mut url = self.path_url(&crate::jobs::image_files_path(image))?;
        if let Some(v) = version {
            url.query_pairs_mut().append_pair("version", &v.to_string());
        }
        self.call(Method::GET, url, None::<&()>).await
    }

    /// The script plan of `mode` (`GET /api/v1/scripts/plan`): a node's own
    /// post-boot plan, or (job servers, administrators) an image's
    /// image-gen plan.
    pub async fn script_plan(
        &self,
        mode: crate::scripts::ScriptMode,
        image: Option<&str>,
    ) -> Result<crate::scripts::ScriptPlan, ClientError> {
        let url = self.path_url(&crate::scripts::plan_path(mode, image))?;
        self.call(Method::GET, url, None::<&()>).await
    }

    /// A script's content, as bytes (`GET /api/v1/scripts/{slug}/content`).
    pub async fn script_content(&self, slug: &str) -> Result<Vec<u8>, ClientError> {
        let url = self.path_url(&crate::scripts::content_path(slug))?;
        self.send(Method::GET, url, None::<&()>).await
    }

    /// Reports a script run's results (`POST /api/v1/scripts/results`).
    pub async fn report_scripts(
        &self,
        report: &crate::scripts::RunReport,
    ) -> Result<(), ClientError> {
        let url = self.path_url(crate::scripts::RESULTS_PATH)?;
        self.send(Method::POST, url, Some(report)).await.map(drop)
    }

    /// A node's last boot, oldest event first (`all`: every boot); with no
    /// `system`, the latest event of every node.
    pub async fn boot_events(
        &self,
        system: Option<&str>,
        all: bool,
    ) -> Result<Vec<crate::boot::BootEvent>, ClientError> {
        let mut url = self.path_url(crate::boot::EVENTS_PATH)?;
        {
            let mut pairs = url.query_pairs_mut();
            if let Some(s) = system {
                pairs.append_pair("system", s);
            }
            if all {
                pairs.append_pair("boot", "all");
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        self.call(Method::GET, url, None::<&()>).await
    }

    /// The node's own boot manifest (with its certificate).
    pub async fn boot_manifest(&self) -> Result<crate::boot::BootManifest, ClientError> {
        let url = self.path_url(crate::boot::MANIFEST_PATH)?;
        self.call(Method::GET, url, None::<&()>).await
    }

    /// Asks the node `system` (host name or id) to run its post-boot
    /// scripts again (`POST /api/v1/systems/{key}/run-scripts`,
    /// administrators): its new run request.
    pub async fn run_scripts(
        &self,
        system: &str,
    ) -> Result<crate::scripts::RunRequested, ClientError> {
        let mut url = self.kind_url::<&str, &str>("systems", Some(system), &[]);
        // As in `kind_url`: the base can be one, so this cannot fail.
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.push("run-scripts");
        }
        self.call(Method::POST, url, None::<&()>).await
    }

    /// A bulk action on the systems a filter matches
    /// (`POST /api/v1/systems/actions`): without `confirm_count` the
    /// preview, with it the action applied (a 409 when the count changed).
    pub async fn bulk_action(
        &self,
        request: &crate::bulk::BulkRequest,
    ) -> Result<crate::bulk::BulkAnswer, ClientError> {
        let url = self.path_url(crate::bulk::ACTIONS_PATH)?;
        self.call(Method::POST, url, Some(request)).await
    }

    /// One page of the audit log, newest first: at most `limit` entries
    /// older than `cursor` (the previous page's `next`).
    pub async fn audit(
        &self,
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Result<crate::bulk::AuditPage, ClientError> {
        let mut url = self.path_url(crate::bulk::AUDIT_PATH)?;
        {
            let mut q = url.query_pairs_mut();
            if let Some(limit) = limit {
                q.append_pair("limit", &limit.to_string());
            }
            if let Some(cursor) = cursor {
                q.append_pair("cursor", cursor);
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        self.call(Method::GET, url, None::<&()>).await
    }

    /// Enrolls a node with the nonce from its kernel command line.
    pub async fn enroll_node(
        &self,
        request: &crate::enroll::NodeEnrollment,
    ) -> Result<crate::enroll::Enrolled, ClientError> {
        let url = self.path_url(crate::enroll::NODE_PATH)?;
        self.call(Method::POST, url, Some(request)).await
    }

    /// Enrolls a job server with a one-time token.
    pub async fn enroll_jobserver(
        &self,
        request: &crate::enroll::JobserverEnrollment,
    ) -> Result<crate::enroll::Enrolled, ClientError> {
        let url = self.path_url(crate::enroll::JOBSERVER_PATH)?;
        self.call(Method::POST, url, Some(request)).await
    }

    /// Renews the certificate this client presents (`POST /enroll/renew/`,
    /// over mTLS with it): a certificate for the CSR's key, the old one
    /// revoked.
    pub async fn renew(
        &self,
        request: &crate::enroll::Renewal,
    ) -> Result<crate::enroll::Enrolled, ClientError> {
        let url = self.path_url(crate::enroll::RENEW_PATH)?;
        self.call(Method::POST, url, Some(request)).await
    }

    /// `<base>/api/v1/<kind>/` and, with a key, `<base>/api/v1/<kind>/<key>`;
    /// the key is percent-encoded as one path segment.
    fn kind_url<K, V>(&self, kind: &str, key: Option<&str>, query: &[(K, V)]) -> Url
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut url = self.base.clone();
        {
            // `parse_base_url` refused URLs that cannot be a base, so this
            // cannot fail; keep the base unchanged if it somehow does.
            if let Ok(mut segments) = url.path_segments_mut() {
                segments.pop_if_empty();
                segments.extend(API_PREFIX.split('/').filter(|s| !s.is_empty()));
                segments.push(kind);
                segments.push(key.unwrap_or(""));
            }
        }
        if !query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in query {
                pairs.append_pair(k.as_ref(), v.as_ref());
            }
        }
        url
    }

    /// The discovered nodes parked for an admin: one page, after row id
    /// `after` (the previous page's `next`), at most `limit`.
    pub async fn discovered(&self, after: i64, limit: u32) -> Result<Value, ClientError> {
        let url = self.path_url(&format!("{DISCOVERY_PATH}?after={after}&limit={limit}"))?;
        self.call(Method::GET, url, None::<&()>).await
    }

    /// Binds the parked node `mac` to `system`'s NIC `nic` (an id, or its
    /// name on the system), replacing the NIC's MAC only if `replace`.
    pub async fn assign_discovered(
        &self,
        mac: &str,
        system: &str,
        nic: &str,
        replace: bool,
    ) -> Result<Value, ClientError> {
        let mut url = self.path_url(DISCOVERY_PATH)?;
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().push(mac).push("assign");
        }
        let body = serde_json::json!({"system": system, "nic": nic, "replace": replace});
        self.call(Method::POST, url, Some(&body)).await
    }

    /// Forgets the parked node `mac`.
    pub async fn dismiss_discovered(&self, mac: &str) -> Result<(), ClientError> {
        let mut url = self.path_url(DISCOVERY_PATH)?;
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().push(mac);
        }
        self.send(Method::DELETE, url, None::<&()>).await?;
        Ok(())
    }

    /// `<base><path>` for an absolute `path`, refusing anything that would
    /// leave the server (and so send our credentials elsewhere).
    fn path_url(&self, path: &str) -> Result<Url, ClientError> {
        let bad = || ClientError::BadPath {
            path: path.to_owned(),
        };
        let relative = path.strip_prefix('/').ok_or_else(bad)?;
        if relative.starts_with('/') {
            return Err(bad());
        }
        let mut base = self.base.clone();
        if !base.path().ends_with('/') {
            let with_slash = format!("{}/", base.path());
            base.set_path(&with_slash);
        }
        let url = base.join(relative).map_err(|_| bad())?;
        if url.origin() != self.base.origin() || !url.path().starts_with(base.path()) {
            return Err(bad());
        }
        Ok(url)
    }

    /// Sends a request and decodes a successful reply's JSON body.
    async fn call<B, T>(&self, method: Method, url: Url, body: Option<&B>) -> Result<T, ClientError>
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        let bytes = self.send(method.clone(), url.clone(), body).await?;
        serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
            method,
            url,
            source,
        })
    }

    /// Sends a request; checks the version, then the status. Returns the body
    /// of a successful reply.
    async fn send<B>(
        &self,
        method: Method,
        url: Url,
        body: Option<&B>,
    ) -> Result<Vec<u8>, ClientError>
    where
        B: Serialize + ?Sized,
    {
        let http_error = |source: reqwest::Error| ClientError::Http {
            method: method.clone(),
            url: url.clone(),
            source: source.without_url(),
        };
        let mut request = self
            .http
            .request(method.clone(), url.clone())
            .header(VERSION_HEADER, api_version());
        request = match &self.auth {
            Auth::ApiKey(_) => match &self.api_key {
                Some(value) => request.header(AUTHORIZATION, value.clone()),
                None => request,
            },
            Auth::Basic { user, password } => request.basic_auth(user, Some(password)),
            Auth::None => request,
        };
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(http_error)?;
        let status = response.status();
        if self.check_version {
            check_version(
                status,
                response.headers().get(VERSION_HEADER),
                api_version(),
            )?;
        }
        let bytes = response.bytes().await.map_err(http_error)?;
        if !status.is_success() {
            return Err(api_error(status, &bytes));
        }
        Ok(bytes.to_vec())
    }
}

#[cfg(test)]
mod tests;
