//! `GET /ipxe/?mac=<mac>`: the script a booting node's iPXE runs.
//!
//! The answer is decided by [`crate::netboot::decide`] (pure); this handler
//! does the I/O around it:
//! 1. the rate limit, per MAC and in total ([`Limiter`]): beyond it, 429
//!    with a retry script;
//! 2. the node's view, loaded with a fixed number of queries ([`load_node`]),
//!    however many job servers host its image;
//! 3. the attestation: a job server's report that it just leased the
//!    request's source address to this MAC (the source counts through
//!    `TRUSTED_PROXIES` only), waited for up to [`ATTEST_WAIT`];
//! 4. for a boot, a fresh nonce ([`crate::enrollment::mint_nonce`], which
//!    cancels the system's earlier ones) and the `script_served` event.
//!
//! iPXE cannot authenticate, so this is public; what it hands out (a nonce)
//! goes only to a node booting now on its own provisioning segment.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mprov_api::boot::{BootPhase, ipxe_chain_url};
use serde_json::{Map, Value};
use sqlx::Row as _;

use super::AppState;
use super::error::ApiError;
use crate::db::kinds;
use crate::db::{Db, Val, int, opt_int};
use crate::netboot::{self, Decision, Image, JobServer, Lookup, Node};

/// How long `/ipxe/` waits for the job server's lease report to arrive.
pub const ATTEST_WAIT: Duration = Duration::from_secs(5);
/// How often it looks again while waiting (other replicas write too).
const ATTEST_RECHECK: Duration = Duration::from_millis(250);
/// The most MACs the limiter remembers; beyond it, full buckets are dropped.
const LIMITER_MACS: usize = 65_536;

/// Token buckets: one per MAC and one for everything.
#[derive(Debug)]
pub struct Limiter {
    per_mac: u32,
    total: u32,
    state: Mutex<(Bucket, HashMap<String, Bucket>)>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(capacity: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: capacity,
            at: now,
        }
    }

    /// Refills at `per_min` a minute up to `capacity`, then takes one.
    fn take(&mut self, capacity: f64, per_min: f64, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_min / 60.0).min(capacity);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl Limiter {
    /// `per_mac` and `total` requests a minute; a MAC may burst to its whole
    /// minute, the total to a tenth of it.
    pub fn new(per_mac: u32, total: u32) -> Limiter {
        let now = Instant::now();
        let me = Limiter {
            per_mac: per_mac.max(1),
            total: total.max(1),
            state: Mutex::new((Bucket::full(0.0, now), HashMap::new())),
        };
        if let Ok(mut s) = me.state.lock() {
            s.0 = Bucket::full(me.total_capacity(), now);
        }
        me
    }

    fn total_capacity(&self) -> f64 {
        (f64::from(self.total) / 10.0).max(1.0)
    }

    /// Whether a request for `mac` may go on now.
    pub fn allow(&self, mac: &str, now: Instant) -> bool {
        let Ok(mut s) = self.state.lock() else {
            return false;
        };
        let (per_mac, total) = (f64::from(self.per_mac), f64::from(self.total));
        let total_cap = self.total_capacity();
        let (all, macs) = &mut *s;
        if macs.len() >= LIMITER_MACS {
            macs.retain(|_, b| {
                let mut probe = *b;
                probe.take(per_mac, per_mac, now);
                probe.tokens + 1.0 < per_mac
            });
            if macs.len() >= LIMITER_MACS {
                return false;
            }
        }
        let bucket = macs
            .entry(mac.to_owned())
            .or_insert_with(|| Bucket::full(per_mac, now));
        // The MAC's own limit first: one node retrying fast must not use up
        // everyone's budget.
        bucket.take(per_mac, per_mac, now) && all.take(total_cap, total, now)
    }
}

/// How a node is looked up.
#[derive(Debug, Clone, Copy)]
pub enum NodeKey<'a> {
    /// By the MAC that booted.
    Mac(&'a str),
    /// By host name (the manifest).
    Host(&'a str),
}

/// A node's view and what the manifest needs besides.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The view the decision takes.
    pub lookup: Lookup,
    /// The image's rootfs size.
    pub rootfs_size: u64,
    /// The effective tmpfs size in GiB (0: the agent's default).
    pub tmpfs_gib: i64,
}

fn text(row: &sqlx::any::AnyRow, col: &str) -> Option<String> {
    row.try_get::<Option<String>, _>(col).ok().flatten()
}

/// The layer object without its scripts: the kernel command line and the
/// tmpfs size do not depend on them.
fn layer(mut obj: Map<String, Value>) -> Map<String, Value> {
    obj.remove("scripts");
    obj
}

/// Loads a node's view with a fixed number of queries: its NIC, system,
/// image, distro, groups and the job servers hosting the image.
pub async fn load_node(db: &Db, key: NodeKey<'_>) -> Result<Loaded, ApiError> {
    let unknown = Loaded {
        lookup: Lookup::Unknown,
        rootfs_size: 0,
        tmpfs_gib: 0,
    };
    let kind = |n| kinds::kind(n).ok_or_else(|| ApiError::internal(format!("no kind {n}")));
    // 1. The NIC and its network (a switch port's network first).
    let mut q = db.sql();
    q.push("SELECT s.id AS system_id, n.network_id, p.network_id AS port_network_id FROM systems s JOIN network_interfaces n ON n.system_id = s.id LEFT JOIN switch_ports p ON p.id = n.switch_port_id WHERE ");
    match key {
        NodeKey::Mac(mac) => {
            q.push("n.mac = ").bind(Val::Text(Some(mac.to_owned())));
        }
        NodeKey::Host(host) => {
            q.push("s.hostname = ")
                .bind(Val::Text(Some(host.to_ascii_lowercase())));
        }
    }
    q.push(" ORDER BY n.bootable DESC, n.id LIMIT 1");
    let row = q
        .query()
        .fetch_optional(db.pool())
        .await
        .map_err(ApiError::internal)?;
    let (system_id, network) = match row {
        Some(r) => (
            int(&r, "system_id").map_err(ApiError::internal)?,
            opt_int(&r, "port_network_id")
                .map_err(ApiError::internal)?
                .or(opt_int(&r, "network_id").map_err(ApiError::internal)?),
        ),
        // A system without NICs is still found by name for its manifest.
        None => match key {
            NodeKey::Mac(_) => return Ok(unknown),
            NodeKey::Host(h) => match db.get(kind("systems")?, h).await {
                Ok(s) => match s.get("id").and_then(Value::as_i64) {
                    Some(id) => (id, None),
                    None => return Ok(unknown),
                },
                Err(_) => return Ok(unknown),
            },
        },
    };
    // 2-4. The system, its image and distro, as the API shows them.
    let system = db.get(kind("systems")?, &system_id.to_string()).await?;
    let image = match system.get("image").and_then(Value::as_i64) {
        Some(id) => Some(db.get(kind("images")?, &id.to_string()).await?),
        None => None,
    };
    let distro = match image
        .as_ref()
        .and_then(|i| i.get("distro"))
        .and_then(Value::as_i64)
    {
        Some(id) => Some(db.get(kind("distros")?, &id.to_string()).await?),
        None => None,
    };
    // 5. Its groups' layer fields, in one query.
    let mut q = db.sql();
    q.push("SELECT g.id, g.slug, g.priority, g.install_kernel_cmdline, g.initial_mods, g.tmpfs_root_size, g.prov_interface, g.config_params FROM system_groups g JOIN group_members m ON m.group_id = g.id WHERE m.system_id = ")
        .bind(Val::Int(Some(system_id)));
    let mut groups = Vec::new();
    for r in q
        .query()
        .fetch_all(db.pool())
        .await
        .map_err(ApiError::internal)?
    {
        let mut g = Map::new();
        g.insert(
            "id".into(),
            int(&r, "id").map_err(ApiError::internal)?.into(),
        );
        g.insert(
            "priority".into(),
            int(&r, "priority").map_err(ApiError::internal)?.into(),
        );
        g.insert(
            "tmpfs_root_size".into(),
            int(&r, "tmpfs_root_size")
                .map_err(ApiError::internal)?
                .into(),
        );
        for col in [
            "slug",
            "install_kernel_cmdline",
            "initial_mods",
            "prov_interface",
            "config_params",
        ] {
            g.insert(col.into(), text(&r, col).unwrap_or_default().into());
        }
        groups.push(g);
    }
    // 6. The job servers hosting the image, in one query.
    let mut jobservers = Vec::new();
    if let Some(id) = image
        .as_ref()
        .and_then(|i| i.get("id"))
        .and_then(Value::as_i64)
    {
        let mut q = db.sql();
        q.push("SELECT j.name, j.addresses, j.port, j.network_id, j.load_avg FROM jobservers j JOIN image_hosts h ON h.jobserver_id = j.id WHERE h.image_id = ")
            .bind(Val::Int(Some(id)));
        for r in q
            .query()
            .fetch_all(db.pool())
            .await
            .map_err(ApiError::internal)?
        {
            let addresses: Vec<String> = text(&r, "addresses")
                .and_then(|a| serde_json::from_str(&a).ok())
                .unwrap_or_default();
            jobservers.push(JobServer {
                name: text(&r, "name").unwrap_or_default(),
                address: addresses.into_iter().find(|a| !a.is_empty()),
                port: opt_int(&r, "port")
                    .map_err(ApiError::internal)?
                    .and_then(|p| u16::try_from(p).ok()),
                network: opt_int(&r, "network_id").map_err(ApiError::internal)?,
                load_avg: r
                    .try_get::<f64, _>("load_avg")
                    .or_else(|_| r.try_get::<f32, _>("load_avg").map(f64::from))
                    .unwrap_or(0.0),
            });
        }
    }
    let (system_l, image_l, distro_l) = (
        layer(system.clone()),
        image.clone().map(layer),
        distro.map(layer),
    );
    let effective = crate::effective::effective(
        &crate::effective::Layers {
            distro: distro_l.as_ref(),
            groups: groups.iter().collect(),
            image: image_l.as_ref(),
            system: &system_l,
        },
        &HashMap::new(),
    );
    let tmpfs_gib = effective.as_ref().map(|e| e.tmpfs_root_size).unwrap_or(0);
    let rootfs_size = image
        .as_ref()
        .and_then(|i| i.get("rootfs_size"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let node = Node {
        system_id,
        hostname: system
            .get("hostname")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        netboot: system.get("netboot").and_then(Value::as_bool) != Some(false),
        network,
        image: image.as_ref().map(|i| Image {
            slug: i
                .get("slug")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            version: i.get("version").and_then(Value::as_i64).unwrap_or(1),
            rootfs_sha256: i
                .get("rootfs_sha256")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        }),
        jobservers,
        kernel_cmdline: effective
            .map(|e| e.kernel_cmdline)
            .map_err(|e| e.to_string()),
    };
    Ok(Loaded {
        lookup: Lookup::Known(node),
        rootfs_size,
        tmpfs_gib,
    })
}

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
        let loaded = load_node(&st.db, NodeKey::Mac(&mac)).await?;
        let network = match &loaded.lookup {
            Lookup::Unknown => None,
            Lookup::Known(n) => Some(n.network),
        };
        let ok = attested(&st, &mac, source, network).await?;
        (loaded.lookup, ok)
    };
    let decision = netboot::decide(&lookup, &mac, attested, throttled, &settings);
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
        Decision::Boot(_) if fingerprint.is_empty() => Err(ApiError::internal(
            "no CA certificate to pin on the boot line",
        )),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limiter_holds_per_mac_and_in_total() {
        let t0 = Instant::now();
        let l = Limiter::new(3, 100);
        let allowed = (0..10).filter(|_| l.allow("aa", t0)).count();
        assert_eq!(allowed, 3, "one MAC bursts to its minute");
        // 20 s later: a third of a minute, one more.
        assert!(l.allow("aa", t0 + Duration::from_secs(20)));
        assert!(!l.allow("aa", t0 + Duration::from_secs(20)));
        // The total: a tenth of the minute's budget at once, then refused.
        let l = Limiter::new(1000, 100);
        let allowed = (0..50).filter(|i| l.allow(&format!("m{i}"), t0)).count();
        assert_eq!(allowed, 10);
    }
}
