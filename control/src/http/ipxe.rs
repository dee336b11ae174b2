//! `GET /ipxe/?mac=<mac>`: the script a booting node's iPXE runs.
//!
//! The answer is decided by [`crate::netboot::decide`] (pure); this handler
//! does the I/O around it:
//! 1. the rate limit, per MAC and in total ([`Limiter`], the service's one
//!    token-bucket type in [`crate::ratelimit`]): beyond it, 429
//!    with a retry script;
//! 2. the node's view ([`crate::netboot::view::load`], a fixed number of
//!    statements whatever its groups and job servers);
//! 3. the attestation: a job server's report that it just leased the
//!    request's source address to this MAC (the source counts through
//!    `TRUSTED_PROXIES` only), waited for up to [`ATTEST_WAIT`];
//! 4. for a boot, a fresh nonce ([`crate::enrollment::mint_nonce`], which
//!    cancels the system's earlier ones) and the `script_served` event.
//!
//! Every refusal the decision makes (an image that is not bootable, a value
//! that cannot go into a script, no CA certificate) is a retry script with
//! its reason, and mints nothing.
//!
//! iPXE cannot authenticate, so this is public; what it hands out (a nonce)
//! goes only to a node booting now on its own provisioning segment.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mprov_api::boot::{BootPhase, ipxe_chain_url};

use super::AppState;
use super::error::ApiError;
use crate::netboot::{self, Decision, Lookup, NodeKey};

/// How long `/ipxe/` waits for the job server's lease report to arrive.
pub const ATTEST_WAIT: Duration = Duration::from_secs(5);
/// How often it looks again while waiting (other replicas write too).
const ATTEST_RECHECK: Duration = Duration::from_millis(250);
/// `/ipxe/`'s rate limit: per MAC and in total.
pub use crate::ratelimit::Limiter;

/// Waits up to [`ATTEST_WAIT`] for a job server's report attesting a request
/// for `mac` from `source`.
async fn attested(
    st: &AppState,
    mac: &str,
    source: Option<IpAddr>,
    node_network: Option<Option<i64>>,
) -> Result<bool, ApiError> {
    let Some(source) = source else {
        return Ok(false);
    };
    let deadline = tokio::time::Instant::now() + ATTEST_WAIT;
    loop {
        let notified = st.boot_events.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let leases = crate::boot::recent_leases(&st.db, mac)
            .await
            .map_err(ApiError::internal)?;
        if crate::boot::attests(&leases, source, node_network) {
            return Ok(true);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        let nap = (deadline - now).min(ATTEST_RECHECK);
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep(nap) => {}
        }
    }
}

fn script(status: StatusCode, body: String) -> Response {
    let mut resp = (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response();
    if status == StatusCode::TOO_MANY_REQUESTS {
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(netboot::RETRY_SECS * 3),
        );
    }
    resp
}

/// `GET /ipxe/`.
pub async fn ipxe(State(st): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let mac = url::form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "mac")
        .map(|(_, v)| v.into_owned())
        .ok_or_else(|| ApiError::invalid("mac", "add ?mac=${net0/mac} to the chain URL"))?;
    let mac = crate::db::crud::parse_mac(&mac).map_err(|e| ApiError::invalid("mac", e))?;
    let source = super::auth::client_ip(&st, &req).map(|ip| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    });
    let chain_url = ipxe_chain_url(&st.config.public_url);
    let fingerprint = st.ca_fingerprint.as_deref().unwrap_or_default();
    let node_url = st.config.node_url();
    let settings = netboot::Settings {
        chain_url: &chain_url,
        control_url: &node_url,
        ca_fingerprint: fingerprint,
    };
    let throttled = !st.ipxe_limiter.allow(&mac, Instant::now());
    let (lookup, attested) = if throttled {
        (Lookup::Unknown, false)
    } else {
        let lookup = netboot::view::load(&st.db, NodeKey::Mac(&mac)).await?;
        let network = match &lookup {
            Lookup::Unknown => None,
            Lookup::Known(n) => Some(n.network),
        };
        let ok = attested(&st, &mac, source, network).await?;
        (lookup, ok)
    };
    let decision = netboot::decide(&lookup, &mac, attested, throttled, &settings);
    // Nothing fails here in practice: `decide` turned every refusal into a
    // retry (dry-rendering a boot before any nonce), and the chain URL every
    // script ends with was checked at start (`ConfigError::PublicUrl`).
    let render = |d: &Decision, nonce: Option<&str>| {
        netboot::render(d, nonce, &settings).map_err(|e| ApiError::internal_in("iPXE script", e))
    };
    let source_text = source.map_or_else(|| "-".to_owned(), |s| s.to_string());
    match &decision {
        Decision::Throttled => {
            tracing::warn!(%mac, source = %source_text, "ipxe: rate limit reached; answered 429 with a retry script");
            Ok(script(
                StatusCode::TOO_MANY_REQUESTS,
                render(&decision, None)?,
            ))
        }
        Decision::Retry(why) => {
            if !attested {
                tracing::info!(%mac, source = %source_text, "ipxe: no job server on the node's network reported leasing this address to this MAC in the last minutes (is the job server reporting boot events with its own certificate, i.e. following an https:// control URL, and does its row name its network?); sent the retry script");
            } else {
                tracing::info!(%mac, "ipxe: {why}");
            }
            Ok(script(StatusCode::OK, render(&decision, None)?))
        }
        Decision::Discovery => {
            tracing::info!(%mac, "ipxe: unknown node; sent the discovery script");
            Ok(script(StatusCode::OK, render(&decision, None)?))
        }
        Decision::LocalBoot => Ok(script(StatusCode::OK, render(&decision, None)?)),
        Decision::Boot(plan) => {
            let nonce = crate::enrollment::mint_nonce(&st.db, plan.system_id).await?;
            let body = render(&decision, Some(&nonce))?;
            let event = crate::boot::NewEvent {
                system_id: Some(plan.system_id),
                mac: Some(mac.clone()),
                phase: BootPhase::ScriptServed,
                source: "control".into(),
                jobserver_id: None,
                ip: source,
                detail: format!("boot script: job servers {}", plan.jobservers.join(", ")),
            };
            if let Err(e) = crate::boot::record(&st.db, event).await {
                tracing::warn!(error = %e, "ipxe: cannot record the script_served event");
            }
            st.boot_events.notify_waiters();
            tracing::info!(hostname = %plan.hostname, %mac, jobservers = %plan.jobservers.join(","), "ipxe: boot script with a fresh enrollment nonce");
            Ok(script(StatusCode::OK, body))
        }
    }
}
