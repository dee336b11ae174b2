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
//!    `TRUSTED_PROXIES` only), from a job server the node's placement
//!    accepts ([`crate::boot::attests`]), waited for up to [`ATTEST_WAIT`]
//!    without polling: one look, then a sleep on the MAC's
//!    [`LeaseWaiters`] entry, woken by the lease report (or by
//!    [`recheck`], one look a second for the whole process, for reports
//!    other replicas stored);
//! 4. for a boot, a fresh nonce ([`crate::enrollment::mint_nonce`], which
//!    cancels the system's earlier ones) and the `script_served` event.
//!
//! Every refusal the decision makes (an image that is not bootable, a value
//! that cannot go into a script, no CA certificate) is a retry script with
//! its reason, and mints nothing.
//!
//! iPXE cannot authenticate, so this is public; what it hands out (a nonce)
//! goes only to a node booting now on its own provisioning segment.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mprov_api::boot::{BootPhase, ipxe_chain_url};

use tokio::sync::Notify;

use super::AppState;
use super::error::ApiError;
use crate::boot::{Attestation, Placement};
use crate::netboot::{self, Decision, Lookup, NodeKey};

/// How long `/ipxe/` waits for the job server's lease report to arrive.
pub const ATTEST_WAIT: Duration = Duration::from_secs(5);
/// How often [`recheck`] looks for lease reports other replicas stored,
/// while requests wait.
pub const RECHECK_EVERY: Duration = Duration::from_secs(1);
/// The most `/ipxe/` requests waiting for a lease report at once; beyond it
/// a request looks once and does not wait.
pub const MAX_WAITERS: usize = 4096;
/// `/ipxe/`'s rate limit: per MAC and in total.
pub use crate::ratelimit::Limiter;

/// The `/ipxe/` requests waiting for a lease report, by MAC: woken by
/// `POST /api/v1/boot/events` when a job server's lease report for that MAC
/// is stored in this process ([`LeaseWaiters::wake`]), and by [`recheck`]
/// for reports other replicas stored. A waiting request costs no database
/// statement until it is woken.
#[derive(Debug, Default)]
pub struct LeaseWaiters {
    state: Mutex<Waiting>,
}

#[derive(Debug, Default)]
struct Waiting {
    total: usize,
    by_mac: HashMap<String, (Arc<Notify>, usize)>,
}

/// A request's place among the [`LeaseWaiters`], given up on drop.
struct Waiter<'a> {
    waiters: &'a LeaseWaiters,
    mac: String,
    notify: Arc<Notify>,
}

impl LeaseWaiters {
    /// A place to wait on `mac`, unless [`MAX_WAITERS`] requests wait
    /// already.
    fn join(&self, mac: &str) -> Option<Waiter<'_>> {
        let mut s = self.state.lock().ok()?;
        if s.total >= MAX_WAITERS {
            return None;
        }
        s.total += 1;
        let entry = s
            .by_mac
            .entry(mac.to_owned())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        let notify = entry.0.clone();
        Some(Waiter {
            waiters: self,
            mac: mac.to_owned(),
            notify,
        })
    }

    /// Wakes the requests waiting on `mac`.
    pub fn wake(&self, mac: &str) {
        if let Ok(s) = self.state.lock()
            && let Some((n, _)) = s.by_mac.get(mac)
        {
            n.notify_waiters();
        }
    }

    /// How many requests wait.
    pub fn waiting(&self) -> usize {
        self.state.lock().map_or(0, |s| s.total)
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.waiters.state.lock() {
            s.total = s.total.saturating_sub(1);
            if let Some(e) = s.by_mac.get_mut(&self.mac) {
                e.1 = e.1.saturating_sub(1);
                if e.1 == 0 {
                    s.by_mac.remove(&self.mac);
                }
            }
        }
    }
}

/// Wakes the `/ipxe/` requests whose lease report another replica stored:
/// once every [`RECHECK_EVERY`], while any request waits, one statement for
/// the whole process (the lease reports stored since the last look), never
/// one per request. Runs until `shutdown`.
pub async fn recheck(st: AppState, shutdown: tokio_util::sync::CancellationToken) {
    let mut last: Option<i64> = None;
    let mut tick = tokio::time::interval(RECHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let read = match last {
            // The newest event at start: what came before was seen by the
            // requests' own first look.
            None => crate::boot::newest_event(&st.db)
                .await
                .map(|id| (id, Vec::new())),
            Some(_) if st.lease_waiters.waiting() == 0 => continue,
            Some(after) => crate::boot::lease_reports_since(&st.db, after).await,
        };
        match read {
            Ok((newest, macs)) => {
                last = Some(newest);
                for mac in macs {
                    st.lease_waiters.wake(&mac);
                }
            }
            Err(e) => tracing::warn!(error = %e, "ipxe: cannot read new lease reports; retrying"),
        }
    }
}

/// Waits up to [`ATTEST_WAIT`] for a job server's report attesting a request
/// for `mac` from `source`: reads the lease reports once on entry and once
/// after each wake-up (a report for this MAC), never on a timer.
async fn attested(
    st: &AppState,
    mac: &str,
    source: Option<IpAddr>,
    node: Placement,
) -> Result<Attestation, ApiError> {
    let Some(source) = source else {
        return Ok(Attestation::Unattested);
    };
    let check = || async {
        let leases = crate::boot::recent_leases(&st.db, mac)
            .await
            .map_err(ApiError::internal)?;
        Ok::<_, ApiError>(crate::boot::attests(&leases, source, node))
    };
    let Some(waiter) = st.lease_waiters.join(mac) else {
        // Too many wait already: one look, no wait.
        return check().await;
    };
    let deadline = tokio::time::Instant::now() + ATTEST_WAIT;
    loop {
        let notified = waiter.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let found = check().await?;
        if found != Attestation::Unattested {
            return Ok(found);
        }
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep_until(deadline) => return Ok(Attestation::Unattested),
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
        stale_after: st.config.jobserver_stale,
        carry_lease: st.config.ipxe_carry_lease,
    };
    let throttled = !st.ipxe_limiter.allow(&mac, Instant::now());
    let (lookup, attested) = if throttled {
        (Lookup::Unknown, Attestation::Unattested)
    } else {
        let lookup = netboot::view::load(&st.db, NodeKey::Mac(&mac)).await?;
        let found = attested(&st, &mac, source, netboot::placement(&lookup)).await?;
        (lookup, found)
    };
    let decision = match attested {
        Attestation::Unplaced => Decision::Retry(crate::boot::UNPLACED.to_owned()),
        found => netboot::decide(
            &lookup,
            &mac,
            found == Attestation::Attested,
            throttled,
            &settings,
        ),
    };
    let attested = attested != Attestation::Unattested;
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
                tracing::info!(%mac, source = %source_text, "ipxe: no job server on the node's network reported leasing this address to this MAC in the last minutes (is the job server reporting boot events with its own certificate, i.e. following an https:// control URL, and is this address inside a network it registered, or its row's network?); sent the retry script");
            } else {
                tracing::info!(%mac, "ipxe: {why}");
            }
            Ok(script(StatusCode::OK, render(&decision, None)?))
        }
        Decision::Discovery => match &st.config.discovery_image {
            None => {
                tracing::info!(%mac, "ipxe: unknown node; sent the discovery script (no MPROV_DISCOVERY_IMAGE to boot it into discovery)");
                Ok(script(StatusCode::OK, render(&decision, None)?))
            }
            Some(image) => discovery_boot(&st, &mac, source, image, &settings).await,
        },
        Decision::DiscoveryBoot(_) => Err(ApiError::internal(
            "the /ipxe/ decision never boots discovery itself",
        )),
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

/// The discovery boot of the attested unknown `mac` from `source`: the
/// discovery image's kernel and agent initramfs from a job server of the
/// network whose job server leased the address
/// ([`crate::boot::lease_network`]), with a fresh one-time discovery nonce
/// bound to the MAC ([`crate::discovery::store::mint_nonce`]) and the
/// `script_served` event on the MAC's timeline. A refusal is a retry script
/// with its reason, and mints nothing.
async fn discovery_boot(
    st: &AppState,
    mac: &str,
    source: Option<IpAddr>,
    image: &str,
    settings: &netboot::Settings<'_>,
) -> Result<Response, ApiError> {
    let network = match source {
        Some(source) => crate::boot::lease_network(
            &crate::boot::recent_leases(&st.db, mac)
                .await
                .map_err(ApiError::internal)?,
            source,
        ),
        None => None,
    };
    let view = netboot::view::load_image(&st.db, image, network).await?;
    let decision = netboot::discovery(view.as_ref(), image, mac, settings);
    let render = |d: &Decision, nonce: Option<&str>| {
        netboot::render(d, nonce, settings).map_err(|e| ApiError::internal_in("iPXE script", e))
    };
    let Decision::DiscoveryBoot(plan) = &decision else {
        tracing::info!(%mac, "ipxe: unknown node, no discovery boot: {decision:?}");
        return Ok(script(StatusCode::OK, render(&decision, None)?));
    };
    let nonce = crate::discovery::store::mint_nonce(&st.db, mac).await?;
    let body = render(&decision, Some(&nonce))?;
    let event = crate::boot::NewEvent {
        system_id: None,
        mac: Some(mac.to_owned()),
        phase: BootPhase::ScriptServed,
        source: "control".into(),
        jobserver_id: None,
        ip: source,
        detail: format!(
            "discovery script: image {image}, job servers {}",
            plan.jobservers.join(", ")
        ),
    };
    if let Err(e) = crate::boot::record(&st.db, event).await {
        tracing::warn!(error = %e, "ipxe: cannot record the script_served event");
    }
    st.boot_events.notify_waiters();
    tracing::info!(%mac, %image, jobservers = %plan.jobservers.join(","), "ipxe: unknown node; discovery boot with a fresh discovery nonce");
    Ok(script(StatusCode::OK, body))
}
