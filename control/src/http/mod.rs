//! The HTTP side of the control service: one [`router`] that reads like the API
//! index, built from the kind descriptors so every kind gets the same list, get,
//! create, bulk create, update and delete.
//!
//! Servers take a bound listener and a shutdown token ([`serve`]), so tests run
//! them on port 0; [`router`] alone serves in-process tests (`oneshot`).

pub mod admin;
pub mod api;
pub mod auth;
pub mod body;
pub mod boot;
pub mod bulk;
pub mod discovery;
pub mod enroll;
pub mod error;
pub mod ipxe;
pub mod jobs;
pub mod openapi;
pub mod outage;
pub mod scripts;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::db::Db;
use crate::db::kinds::KINDS;
use crate::ratelimit::{Limiter, Rate};
use crate::secrets::SecretBox;

/// The largest request body accepted: room for a bulk create of thousands of
/// systems with NICs, or a group of 100,000 members.
pub const BODY_LIMIT: usize = 16 << 20;

/// What every handler shares.
#[derive(Debug)]
pub struct Inner {
    /// The database.
    pub db: Db,
    /// The configuration.
    pub config: Arc<Config>,
    /// Opens and seals stored secrets.
    pub secrets: SecretBox,
    /// Recently verified passwords.
    pub passwords: crate::identity::PasswordCache,
    /// Bounds argon2 work and counts wrong passwords.
    pub throttle: crate::identity::PasswordThrottle,
    /// Woken after every write through this process, for the long-polls.
    pub changed: tokio::sync::Notify,
    /// The CA certificate (PEM) served at `/ca.crt`, once TLS is set up.
    pub ca_pem: Option<String>,
    /// Its SHA-256 fingerprint, which `/ipxe/` pins on every boot line;
    /// set with `ca_pem` by [`Inner::with_ca`].
    pub ca_fingerprint: Option<String>,
    /// The signing helper, once TLS is set up.
    pub signer: Option<crate::pki::SignerClient>,
    /// Woken after every boot event, for `/ipxe/` waiting on a lease report.
    pub boot_events: tokio::sync::Notify,
    /// `/ipxe/`'s rate limit.
    pub ipxe_limiter: ipxe::Limiter,
    /// Boot events per node certificate.
    pub node_events_limiter: Limiter,
    /// Boot events per job-server certificate.
    pub jobserver_events_limiter: Limiter,
    /// Renewals per node or job server.
    pub renew_limiter: Limiter,
    /// Registrations per job server ([`crate::jobservers::REGISTRATIONS_PER_MINUTE`]):
    /// each bumps the inventory revision, which every job server follows.
    pub register_limiter: Limiter,
    /// Passkey sign-in starts per client address
    /// ([`crate::passkeys::SIGN_IN_STARTS_PER_MINUTE`]): each stores a
    /// challenge.
    pub passkey_limiter: Limiter,
    /// The warnings that an identity hit a limit: one a minute each.
    pub limit_warnings: Limiter,
    /// `/ipxe/` requests waiting for a lease report, by MAC.
    pub lease_waiters: ipxe::LeaseWaiters,
    /// The open connections of every listener, and their limits.
    pub connections: Arc<mprov_process::listen::Registry>,
}

impl Inner {
    /// The state of a running service.
    pub fn new(db: Db, config: Arc<Config>, secrets: SecretBox) -> Inner {
        Inner {
            db,
            config: config.clone(),
            secrets,
            passwords: crate::identity::PasswordCache::default(),
            throttle: crate::identity::PasswordThrottle::default(),
            changed: tokio::sync::Notify::new(),
            ca_pem: None,
            ca_fingerprint: None,
            signer: None,
            boot_events: tokio::sync::Notify::new(),
            ipxe_limiter: ipxe::Limiter::new(
                Rate::per_minute(config.ipxe_limit_per_mac),
                // The total bursts to a tenth of its minute.
                Some(
                    Rate::per_minute(config.ipxe_limit_total)
                        .burst(f64::from(config.ipxe_limit_total) / 10.0),
                ),
            ),
            node_events_limiter: Limiter::new(
                Rate::per_minute(config.writes.node_events_per_minute),
                None,
            ),
            jobserver_events_limiter: Limiter::new(
                Rate::per_minute(config.writes.jobserver_events_per_minute),
                None,
            ),
            renew_limiter: Limiter::new(Rate::per_hour(config.writes.renewals_per_hour), None),
            register_limiter: Limiter::new(
                Rate::per_minute(crate::jobservers::REGISTRATIONS_PER_MINUTE),
                None,
            ),
            passkey_limiter: Limiter::new(
                Rate::per_minute(crate::passkeys::SIGN_IN_STARTS_PER_MINUTE),
                None,
            ),
            limit_warnings: Limiter::new(Rate::per_minute(1), None),
            connections: mprov_process::listen::Registry::new(
                config.connections,
                "MPROV_MAX_CONNECTIONS",
            ),
            lease_waiters: ipxe::LeaseWaiters::default(),
        }
    }

    /// Signs agents' certificates through `signer`.
    #[must_use]
    pub fn with_signer(mut self, signer: crate::pki::SignerClient) -> Inner {
        self.signer = Some(signer);
        self
    }

    /// Serves `ca_pem` at `/ca.crt`.
    #[must_use]
    pub fn with_ca(mut self, ca_pem: String) -> Inner {
        use rustls::pki_types::pem::PemObject as _;
        self.ca_fingerprint = rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes())
            .ok()
            .map(|der| crate::pki::ca::fingerprint(&der));
        self.ca_pem = Some(ca_pem);
        self
    }

    /// Takes one of `identity`'s tokens from `limiter` for `what` (`boot
    /// events`, `renewals`): beyond its budget, 429 with `Retry-After`, and
    /// a warning naming the identity (at most one a minute per identity).
    pub fn within_budget(
        &self,
        limiter: &Limiter,
        identity: &str,
        what: &str,
    ) -> Result<(), error::ApiError> {
        self.within_budget_n(limiter, identity, what, 1)
    }

    /// [`Self::within_budget`] for a batch of `count`: all its tokens or
    /// none.
    pub fn within_budget_n(
        &self,
        limiter: &Limiter,
        identity: &str,
        what: &str,
        count: u32,
    ) -> Result<(), error::ApiError> {
        let now = std::time::Instant::now();
        let Err(wait) = limiter.check_n(identity, count, now) else {
            return Ok(());
        };
        let retry_after = crate::ratelimit::retry_after_secs(wait);
        if self
            .limit_warnings
            .allow(&format!("{what} {identity}"), now)
        {
            tracing::warn!(%identity, retry_after, "rate limit: {identity} sent {what} beyond its budget; answered 429 (further refusals for a minute are not logged)");
        }
        Err(error::ApiError::TooManyRequests {
            message: format!("too many {what} from {identity}; try again in {retry_after} s"),
            retry_after,
        })
    }
}

/// The shared state, cheap to clone.
pub type AppState = Arc<Inner>;

/// The whole API, in three parts that differ only in what is checked before
/// their handlers ([`auth`]):
///
/// - **public**: served to anyone; credentials, if sent, are still checked.
///   Being listed here is what makes a path public: nothing else says so.
/// - **own**: needs credentials; the handler asks [`crate::access`] with
///   what the request names (a boot phase, a node, a MAC), which only the
///   handler has parsed.
/// - **inventory**: needs credentials and [`crate::access::check`] on the
///   path before the handler; every other path (the fallback) is here too, so
///   an unknown path is a 401 to the anonymous and a 404 to readers.
pub fn router(state: AppState) -> Router {
    use auth::{authenticated_layer, inventory_layer, public_layer};
    use axum::middleware::from_fn_with_state;
    let public = Router::new()
        .route("/api/v1/openapi.json", get(openapi::serve))
        .route("/ca.crt", get(api::ca_cert))
        .route("/ipxe/", get(ipxe::ipxe))
        .route("/enroll/jobserver/", post(enroll::enroll_jobserver))
        .route("/enroll/node/", post(enroll::enroll_node))
        .route(
            mprov_api::nads::REPORT_PATH,
            post(discovery::report).layer(DefaultBodyLimit::max(discovery::MAX_REPORT_BYTES)),
        )
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(from_fn_with_state(state.clone(), public_layer));
    let own = Router::new()
        .route("/enroll/renew/", post(enroll::renew))
        .route(
            mprov_api::boot::EVENTS_PATH,
            get(boot::get_events).post(boot::post_event),
        )
        .route(mprov_api::boot::EVENTS_BATCH_PATH, post(boot::post_events))
        .route(mprov_api::boot::MANIFEST_PATH, get(boot::manifest))
        .route(mprov_api::boot::HEARTBEAT_PATH, post(boot::heartbeat))
        .route(mprov_api::jobs::CLAIM_PATH, post(jobs::claim))
        .route(mprov_api::jobs::HOSTING_PATH, post(jobs::hosting))
        .route(mprov_api::jobs::REGISTER_PATH, post(boot::register))
        .route(mprov_api::scripts::PLAN_PATH, get(scripts::plan))
        .route(mprov_api::scripts::CONTENT_ROUTE, get(scripts::content))
        .route(
            mprov_api::scripts::RESULTS_PATH,
            post(scripts::results).layer(DefaultBodyLimit::max(crate::scripts::MAX_REPORT_BYTES)),
        )
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(from_fn_with_state(state.clone(), authenticated_layer));
    let mut inventory = Router::new()
        .route("/api/v1/", get(api::index))
        .route("/api/v1/revision", get(api::revision))
        .route("/api/v1/enroll-tokens/", post(enroll::new_token))
        .route("/api/v1/credentials/", get(enroll::list_credentials))
        .route(
            "/api/v1/credentials/{id}/revoke",
            post(enroll::revoke_credential),
        )
        .route(mprov_api::boot::BOOTCONFIG_PATH, get(api::bootconfig))
        .route("/api/v1/systems/{key}/config", get(api::effective_config))
        .route(mprov_api::scripts::RUN_ROUTE, post(scripts::run_scripts))
        .route(mprov_api::bulk::ACTIONS_PATH, post(bulk::actions))
        .route(mprov_api::bulk::AUDIT_PATH, get(bulk::audit))
        .route(mprov_api::jobs::IMAGE_FILES_ROUTE, get(jobs::image_files))
        .route("/api/v1/discovery/", get(discovery::list))
        .route("/api/v1/discovery/{mac}/assign", post(discovery::assign))
        .route(
            "/api/v1/discovery/{mac}",
            axum::routing::delete(discovery::dismiss),
        )
        .route(mprov_api::jobs::RETRY_ROUTE, post(jobs::retry))
        .route(
            "/api/v1/images/{key}/hosts/{jobserver}",
            axum::routing::put(api::image_host).delete(api::image_host),
        );
    for kind in KINDS {
        inventory = api::kind_routes(inventory, kind);
    }
    let inventory = inventory
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(from_fn_with_state(state.clone(), inventory_layer));
    public
        .merge(admin::router(state.clone()))
        .merge(own)
        .merge(inventory)
        .layer(from_fn_with_state(state.clone(), auth::edge_layer))
        .layer(from_fn_with_state(state.clone(), outage::outage_layer))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// How long shutdown waits for requests in flight.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the API over HTTPS on `listener` with `tls` until `shutdown` is
/// cancelled, then lets in-flight requests finish for a bounded time.
/// Requests carry the client's certificates (if it sent any) as
/// `Arc<axum_server::tls::TlsInfo>` (see [`auth`]). Connections are held to
/// the limits of [`mprov_process::listen`].
pub async fn serve_tls(
    listener: std::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: AppState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let guard = mprov_process::listen::Guard::new(
        state.connections.clone(),
        axum_server::accept::DefaultAcceptor,
    );
    let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(
        axum_server::tls_rustls::RustlsConfig::from_config(tls),
    )
    .acceptor(guard);
    let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
    axum_server::from_tcp(listener)?
        .acceptor(acceptor)
        .handle(drain_on(shutdown))
        .serve(app)
        .await
}

/// Serves the API on `listener` until `shutdown` is cancelled, then lets
/// in-flight requests finish for a bounded time. Connections are held to
/// the limits of [`mprov_process::listen`].
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let guard = mprov_process::listen::Guard::new(
        state.connections.clone(),
        axum_server::accept::DefaultAcceptor,
    );
    let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
    axum_server::from_tcp(listener.into_std()?)?
        .acceptor(guard)
        .handle(drain_on(shutdown))
        .serve(app)
        .await
}

/// A server handle that starts a graceful shutdown, bounded by [`DRAIN`],
/// once `shutdown` is cancelled.
fn drain_on(shutdown: CancellationToken) -> axum_server::Handle<SocketAddr> {
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    tokio::spawn(async move {
        shutdown.cancelled().await;
        stopper.graceful_shutdown(Some(DRAIN));
    });
    handle
}
