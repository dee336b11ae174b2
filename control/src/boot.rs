//! The boot timeline and the boot manifest.
//!
//! - `POST /api/v1/boot/events` ([`EVENTS_PATH`](mprov_api::boot::EVENTS_PATH)): one step of a boot. Job
//!   servers report what they served (DHCP offered/acked, proxyDHCP, boot
//!   file, kernel, initramfs) with their own certificate and name the node
//!   by MAC, host name or the address they leased; a node reports its own
//!   steps with its certificate and can name no other node; `/ipxe/` records
//!   `script_served` itself.
//! - `GET /api/v1/boot/events?system=<host|id>[&boot=all]`: a node's last
//!   boot (or all its events), oldest first; without `system`, the latest
//!   event of every node. `mac=` reads a node the inventory does not know.
//! - `GET /api/v1/boot/manifest` ([`MANIFEST_PATH`](mprov_api::boot::MANIFEST_PATH)): with a node's
//!   certificate, what it boots: image, version, the rootfs checksum the
//!   control service recorded, and the job servers to fetch it from, best
//!   first.
//!
//! Events are grouped into boots: a new boot starts at a node's first event,
//! after its `ready`, after a pause of [`BOOT_GAP`], or at a second
//! `script_served` ([`starts_new_boot`]).
//!
//! The same events attest `/ipxe/` requests: see [`attests`].

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mprov_api::boot::{
    BootEvent, BootEventReport, BootManifest, BootPhase, ImageFile, image_file_url,
    jobserver_base_url,
};
use sqlx::Row as _;
use sqlx::any::AnyRow;

use crate::db::crud::{format_ts, now};
use crate::db::{Db, Engine, Val, int, opt_int};
use crate::http::AppState;
use crate::http::auth::Principal;
use crate::http::error::ApiError;
use crate::http::scope::SharedKeyMode;

/// A pause after which a node's next event starts a new boot.
pub const BOOT_GAP: Duration = Duration::from_secs(30 * 60);
/// How recent a job server's lease report must be to attest `/ipxe/`.
pub const ATTEST_WINDOW: Duration = Duration::from_secs(5 * 60);
/// The most events one read returns.
const MAX_EVENTS: i64 = 1000;

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(e.to_string())
}

fn text(row: &AnyRow, col: &str) -> Option<String> {
    row.try_get::<Option<String>, _>(col).ok().flatten()
}

fn phase_of(s: &str) -> Option<BootPhase> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
}

/// A time `ago` before now, in the stored form.
fn since(ago: Duration) -> String {
    let ago = jiff::SignedDuration::try_from(ago).unwrap_or_default();
    format_ts(
        jiff::Timestamp::now()
            .checked_sub(ago)
            .unwrap_or(jiff::Timestamp::MIN),
    )
}

/// An event to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// The system, if known.
    pub system_id: Option<i64>,
    /// The MAC, if reported.
    pub mac: Option<String>,
    /// The step.
    pub phase: BootPhase,
    /// `jobserver:<name>`, `node:<host>`, `control` or `admin:<name>`.
    pub source: String,
    /// The reporting job server's row, if a job server reported it.
    pub jobserver_id: Option<i64>,
    /// The address involved.
    pub ip: Option<IpAddr>,
    /// Free text.
    pub detail: String,
}

/// Whether an event of `phase` at `now` starts a new boot, given the node's
/// previous event (its phase and time) and whether the current boot already
/// has a `script_served`.
pub fn starts_new_boot(
    previous: Option<(BootPhase, &str)>,
    boot_has_script: bool,
    phase: BootPhase,
    gap_start: &str,
) -> bool {
    match previous {
        None => true,
        Some((BootPhase::Ready, _)) => true,
        Some((_, at)) if at < gap_start => true,
        Some(_) => phase == BootPhase::ScriptServed && boot_has_script,
    }
}

/// Stores an event, in the boot it belongs to.
pub async fn record(db: &Db, ev: NewEvent) -> Result<BootEvent, sqlx::Error> {
    let mut tx = db.pool().begin().await?;
    let key = |sql: &mut crate::db::Sql| match (&ev.system_id, &ev.mac) {
        (Some(id), _) => {
            sql.push(" system_id = ").bind(Val::Int(Some(*id)));
        }
        (None, mac) => {
            sql.push(" system_id IS NULL AND mac = ")
                .bind(Val::Text(Some(mac.clone().unwrap_or_default())));
        }
    };
    let mut prev = db.sql();
    prev.push("SELECT boot_id, phase, at FROM boot_events WHERE");
    key(&mut prev);
    prev.push(" ORDER BY id DESC LIMIT 1");
    let previous = prev.query().fetch_optional(&mut *tx).await?;
    let now = now();
    let gap_start = since(BOOT_GAP);
    let (prev_boot, prev_phase, prev_at) = match &previous {
        Some(r) => (
            Some(int(r, "boot_id")?),
            text(r, "phase").and_then(|p| phase_of(&p)),
            text(r, "at").unwrap_or_default(),
        ),
        None => (None, None, String::new()),
    };
    let boot_has_script = match prev_boot {
        Some(b) if ev.phase == BootPhase::ScriptServed => {
            let mut q = db.sql();
            q.push("SELECT COUNT(*) AS n FROM boot_events WHERE boot_id = ")
                .bind(Val::Int(Some(b)))
                .push(" AND phase = ")
                .bind(Val::Text(Some(BootPhase::ScriptServed.as_str().into())))
                .push(" AND");
            key(&mut q);
            int(&q.query().fetch_one(&mut *tx).await?, "n")? > 0
        }
        _ => false,
    };
    let previous_step =
        prev_boot.map(|_| (prev_phase.unwrap_or(BootPhase::Failed), prev_at.as_str()));
    let boot_id = match prev_boot {
        Some(b) if !starts_new_boot(previous_step, boot_has_script, ev.phase, &gap_start) => b,
        _ => {
            let r = sqlx::query("SELECT COALESCE(MAX(id), 0) + 1 AS next_id FROM boot_events")
                .fetch_one(&mut *tx)
                .await?;
            int(&r, "next_id")?
        }
    };
    let mut ins = db.sql();
    ins.push("INSERT INTO boot_events (system_id, mac, boot_id, phase, at, source, jobserver_id, ip, detail) VALUES ")
        .bind_list([
            Val::Int(ev.system_id),
            Val::Text(ev.mac.clone()),
            Val::Int(Some(boot_id)),
            Val::Text(Some(ev.phase.as_str().into())),
            Val::Text(Some(now.clone())),
            Val::Text(Some(ev.source.clone())),
            Val::Int(ev.jobserver_id),
            Val::Text(ev.ip.map(|i| i.to_string())),
            Val::Text(Some(ev.detail.clone())),
        ]);
    let id = if db.engine() == Engine::Mysql {
        let done = ins.query().execute(&mut *tx).await?;
        done.last_insert_id()
            .ok_or_else(|| sqlx::Error::Protocol("the insert returned no id".into()))?
    } else {
        ins.push(" RETURNING id");
        int(&ins.query().fetch_one(&mut *tx).await?, "id")?
    };
    let hostname = match ev.system_id {
        Some(sid) => {
            let mut q = db.sql();
            q.push("SELECT hostname FROM systems WHERE id = ")
                .bind(Val::Int(Some(sid)));
            q.query()
                .fetch_optional(&mut *tx)
                .await?
                .and_then(|r| text(&r, "hostname"))
        }
        None => None,
    };
    tx.commit().await?;
    Ok(BootEvent {
        id,
        system: ev.system_id,
        hostname,
        mac: ev.mac,
        boot_id,
        phase: ev.phase,
        at: now,
        source: ev.source,
        ip: ev.ip,
        detail: ev.detail,
    })
}

/// A lease a job server reported for a MAC, for attestation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The leased (or, proxyDHCP, the client's) address, if reported.
    pub ip: Option<IpAddr>,
    /// A proxyDHCP exchange rather than a lease.
    pub proxy: bool,
    /// The reporting job server's network.
    pub network: Option<i64>,
    /// That network's subnet and prefix.
    pub subnet: Option<(Ipv4Addr, u8)>,
}

/// The leases job servers reported for `mac` within [`ATTEST_WINDOW`],
/// newest first.
pub async fn recent_leases(db: &Db, mac: &str) -> Result<Vec<Lease>, sqlx::Error> {
    let mut q = db.sql();
    q.push("SELECT e.ip, e.phase, j.network_id, n.subnet, n.netmask FROM boot_events e JOIN jobservers j ON j.id = e.jobserver_id LEFT JOIN networks n ON n.id = j.network_id WHERE e.mac = ")
        .bind(Val::Text(Some(mac.to_owned())))
        .push(" AND e.phase IN (")
        .bind(Val::Text(Some(BootPhase::DhcpAcked.as_str().into())))
        .push(", ")
        .bind(Val::Text(Some(BootPhase::ProxyAnswered.as_str().into())))
        .push(") AND e.at >= ")
        .bind(Val::Text(Some(since(ATTEST_WINDOW))))
        .push(" ORDER BY e.id DESC LIMIT 20");
    let mut out = Vec::new();
    for r in q.query().fetch_all(db.pool()).await? {
        let subnet = text(&r, "subnet").and_then(|s| s.parse().ok());
        let prefix = opt_int(&r, "netmask")?.and_then(|p| u8::try_from(p).ok());
        out.push(Lease {
            ip: text(&r, "ip").and_then(|s| s.parse().ok()),
            proxy: text(&r, "phase").as_deref() == Some(BootPhase::ProxyAnswered.as_str()),
            network: opt_int(&r, "network_id")?,
            subnet: subnet.zip(prefix),
        });
    }
    Ok(out)
}

fn in_subnet(ip: IpAddr, (net, prefix): (Ipv4Addr, u8)) -> bool {
    let IpAddr::V4(ip) = ip else { return false };
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

/// Whether `leases` attest a request from `source`: a lease of exactly that
/// address, or a proxyDHCP exchange whose job server's subnet holds it; for a
/// known node (`node_network` is `Some`) only from a job server on the
/// node's network, when the node's NIC names one.
pub fn attests(leases: &[Lease], source: IpAddr, node_network: Option<Option<i64>>) -> bool {
    leases.iter().any(|l| {
        let network_ok = match node_network {
            None | Some(None) => true,
            Some(Some(n)) => l.network == Some(n),
        };
        let address_ok = l.ip == Some(source)
            || (l.proxy
                && l.ip.is_none_or(|i| i.is_unspecified())
                && l.subnet.is_some_and(|s| in_subnet(source, s)));
        network_ok && address_ok
    })
}

/// Who is asking, for the timeline and the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    /// Admin users and API keys: read and write for any node.
    Admin(String),
    /// Read-only users and job servers read everything.
    Reader,
    /// A job server, by name: writes events for nodes.
    JobServer(String),
    /// A node, by host name: its own events and manifest only.
    Node(String),
}

fn role(st: &AppState, p: &Principal) -> Result<Role, ApiError> {
    match p {
        Principal::Anonymous => Err(ApiError::Unauthorized(
            "boot events need a node's or a job server's certificate, or an admin's credentials"
                .into(),
        )),
        Principal::User { username, is_admin } => Ok(if *is_admin {
            Role::Admin(format!("user:{username}"))
        } else {
            Role::Reader
        }),
        Principal::ApiKey { name, shared, .. } => {
            if !*shared || st.config.shared_key_mode == SharedKeyMode::All {
                Ok(Role::Admin(format!("apikey:{name}")))
            } else {
                Err(ApiError::Forbidden(
                    "the shared API key cannot say which node it speaks for; use the node's certificate".into(),
                ))
            }
        }
        Principal::Agent(a) if a.kind == "node" => Ok(Role::Node(a.identity.clone())),
        Principal::Agent(a) => Ok(Role::JobServer(a.identity.clone())),
    }
}

/// A system's id and host name from its host name or id.
async fn system_by_key(db: &Db, key: &str) -> Result<Option<(i64, String)>, ApiError> {
    let mut q = db.sql();
    q.push("SELECT id, hostname FROM systems WHERE hostname = ")
        .bind(Val::Text(Some(key.to_ascii_lowercase())));
    if let Ok(id) = key.parse::<i64>() {
        q.push(" OR id = ").bind(Val::Int(Some(id)));
    }
    let r = q
        .query()
        .fetch_optional(db.pool())
        .await
        .map_err(internal)?;
    match r {
        Some(r) => Ok(Some((
            int(&r, "id").map_err(internal)?,
            text(&r, "hostname").unwrap_or_default(),
        ))),
        None => Ok(None),
    }
}

/// The system owning `mac`, if any.
async fn system_by_mac(db: &Db, mac: &str) -> Result<Option<i64>, ApiError> {
    let mut q = db.sql();
    q.push("SELECT system_id FROM network_interfaces WHERE mac = ")
        .bind(Val::Text(Some(mac.to_owned())));
    let r = q
        .query()
        .fetch_optional(db.pool())
        .await
        .map_err(internal)?;
    r.map(|r| opt_int(&r, "system_id").map_err(internal))
        .transpose()
        .map(Option::flatten)
}

/// The MAC and system the latest recent lease of `ip` went to.
async fn by_leased_ip(db: &Db, ip: IpAddr) -> Result<Option<(Option<i64>, String)>, ApiError> {
    let mut q = db.sql();
    q.push("SELECT system_id, mac FROM boot_events WHERE ip = ")
        .bind(Val::Text(Some(ip.to_string())))
        .push(" AND phase = ")
        .bind(Val::Text(Some(BootPhase::DhcpAcked.as_str().into())))
        .push(" AND mac IS NOT NULL AND at >= ")
        .bind(Val::Text(Some(since(BOOT_GAP))))
        .push(" ORDER BY id DESC LIMIT 1");
    let r = q
        .query()
        .fetch_optional(db.pool())
        .await
        .map_err(internal)?;
    match r {
        Some(r) => Ok(Some((
            opt_int(&r, "system_id").map_err(internal)?,
            text(&r, "mac").unwrap_or_default(),
        ))),
        None => Ok(None),
    }
}

fn normal_mac(mac: &str) -> Result<String, ApiError> {
    crate::db::crud::parse_mac(mac).map_err(|e| ApiError::invalid("mac", e))
}

/// The phases a job server may report.
fn jobserver_phase(p: BootPhase) -> bool {
    matches!(
        p,
        BootPhase::DhcpOffered
            | BootPhase::DhcpAcked
            | BootPhase::ProxyAnswered
            | BootPhase::BootFileSent
            | BootPhase::KernelFetched
            | BootPhase::InitramfsFetched
            | BootPhase::Failed
    )
}

/// The phases a node reports about itself.
fn node_phase(p: BootPhase) -> bool {
    matches!(
        p,
        BootPhase::AgentDhcp
            | BootPhase::Enrolled
            | BootPhase::ImageStarted
            | BootPhase::Progress
            | BootPhase::Verified
            | BootPhase::ChecksumMismatch
            | BootPhase::SwitchRoot
            | BootPhase::Failed
            | BootPhase::Ready
    )
}

/// The longest detail kept.
const MAX_DETAIL: usize = 4096;

/// `POST /api/v1/boot/events`.
pub async fn post_event(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    Json(body): Json<BootEventReport>,
) -> Result<Response, ApiError> {
    let db = &st.db;
    let role = role(&st, &principal)?;
    if body.detail.len() > MAX_DETAIL {
        return Err(ApiError::invalid(
            "detail",
            format!("at most {MAX_DETAIL} bytes"),
        ));
    }
    let mac = body.mac.as_deref().map(normal_mac).transpose()?;
    let ev = match role {
        Role::Reader => {
            return Err(ApiError::Forbidden(
                "this account may read boot events but not write them".into(),
            ));
        }
        Role::Node(host) => {
            if !node_phase(body.phase) {
                return Err(ApiError::invalid(
                    "phase",
                    format!("a node does not report {}", body.phase.as_str()),
                ));
            }
            let (id, _) = system_by_key(db, &host)
                .await?
                .ok_or_else(|| ApiError::Forbidden(format!("no system {host}")))?;
            // A node writes for itself only: naming another is refused, not
            // silently rewritten.
            let other_system = match &body.system {
                Some(s) => system_by_key(db, s).await?.map(|(i, _)| i) != Some(id),
                None => false,
            };
            let other_mac = match &mac {
                Some(m) => system_by_mac(db, m).await? != Some(id),
                None => false,
            };
            if other_system || other_mac {
                tracing::warn!(node = %host, "refused a boot event a node wrote for another node");
                return Err(ApiError::Forbidden(format!(
                    "a node's certificate writes boot events for its own system ({host}) only"
                )));
            }
            NewEvent {
                system_id: Some(id),
                mac,
                phase: body.phase,
                source: format!("node:{host}"),
                jobserver_id: None,
                ip: body.ip,
                detail: body.detail,
            }
        }
        Role::JobServer(ref name) | Role::Admin(ref name) => {
            let jobserver = matches!(role, Role::JobServer(_));
            if jobserver && !jobserver_phase(body.phase) {
                return Err(ApiError::invalid(
                    "phase",
                    format!("a job server does not report {}", body.phase.as_str()),
                ));
            }
            if !jobserver && body.phase == BootPhase::ScriptServed {
                return Err(ApiError::invalid(
                    "phase",
                    "script_served is recorded by /ipxe/ itself",
                ));
            }
            let (system_id, mac) = match (&body.system, &mac, body.ip) {
                (Some(s), _, _) => {
                    let (id, _) = system_by_key(db, s)
                        .await?
                        .ok_or_else(|| ApiError::invalid("system", format!("no system {s}")))?;
                    (Some(id), mac.clone())
                }
                (None, Some(m), _) => (system_by_mac(db, m).await?, Some(m.clone())),
                (None, None, Some(ip)) => match by_leased_ip(db, ip).await? {
                    Some((id, m)) => (id, Some(m)),
                    None => {
                        return Err(ApiError::invalid(
                            "ip",
                            format!(
                                "no recent DHCP lease of {ip} is known; name the node by mac or system"
                            ),
                        ));
                    }
                },
                (None, None, None) => {
                    return Err(ApiError::invalid(
                        "mac",
                        "name the node: mac, system or the ip it was leased",
                    ));
                }
            };
            // Only a job server's own certificate says which job server
            // reports, so only its reports can attest `/ipxe/` requests.
            let jobserver_id = if jobserver {
                let mut q = db.sql();
                q.push("SELECT id FROM jobservers WHERE name = ")
                    .bind(Val::Text(Some(name.clone())));
                q.query()
                    .fetch_optional(db.pool())
                    .await
                    .map_err(internal)?
                    .map(|r| int(&r, "id"))
                    .transpose()
                    .map_err(internal)?
            } else {
                None
            };
            NewEvent {
                system_id,
                mac,
                phase: body.phase,
                source: if jobserver {
                    format!("jobserver:{name}")
                } else {
                    name.clone()
                },
                jobserver_id,
                ip: body.ip,
                detail: body.detail,
            }
        }
    };
    let stored = record(db, ev).await.map_err(internal)?;
    st.boot_events.notify_waiters();
    Ok((StatusCode::CREATED, Json(stored)).into_response())
}

fn event_of(r: &AnyRow) -> Result<BootEvent, sqlx::Error> {
    Ok(BootEvent {
        id: int(r, "id")?,
        system: opt_int(r, "system_id")?,
        hostname: text(r, "hostname"),
        mac: text(r, "mac"),
        boot_id: int(r, "boot_id")?,
        phase: text(r, "phase")
            .and_then(|p| phase_of(&p))
            .unwrap_or(BootPhase::Failed),
        at: text(r, "at").unwrap_or_default(),
        source: text(r, "source").unwrap_or_default(),
        ip: text(r, "ip").and_then(|s| s.parse().ok()),
        detail: text(r, "detail").unwrap_or_default(),
    })
}

const EVENT_COLUMNS: &str = "SELECT e.id, e.system_id, s.hostname, e.mac, e.boot_id, e.phase, e.at, e.source, e.ip, e.detail FROM boot_events e LEFT JOIN systems s ON s.id = e.system_id WHERE ";

/// `GET /api/v1/boot/events`.
pub async fn get_events(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    RawQuery(q): RawQuery,
) -> Result<Json<Vec<BootEvent>>, ApiError> {
    let db = &st.db;
    let role = role(&st, &principal)?;
    let (mut system, mut mac, mut all) = (None, None, false);
    for (k, v) in url::form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "system" => system = Some(v.into_owned()),
            "mac" => mac = Some(normal_mac(&v)?),
            "boot" if v == "all" => all = true,
            "boot" if v == "last" => all = false,
            _ => {
                return Err(ApiError::invalid(
                    &k,
                    "unknown query parameter; boot events take system, mac and boot=last|all",
                ));
            }
        }
    }
    if let Role::Node(host) = &role {
        // A node reads its own timeline only.
        let own = match &system {
            None => mac.is_none(),
            Some(s) => {
                system_by_key(db, s).await?.map(|(_, h)| h).as_deref() == Some(host.as_str())
            }
        };
        if !own {
            return Err(ApiError::Forbidden(format!(
                "a node's certificate reads its own boot events ({host}) only"
            )));
        }
        if system.is_none() {
            system = Some(host.clone());
        }
    }
    let mut sql = db.sql();
    sql.push(EVENT_COLUMNS);
    match (&system, &mac) {
        (Some(s), _) => {
            let (id, _) = system_by_key(db, s)
                .await?
                .ok_or_else(|| ApiError::NotFound(format!("no system {s}")))?;
            sql.push("e.system_id = ").bind(Val::Int(Some(id)));
            if !all {
                sql.push(
                    " AND e.boot_id = (SELECT MAX(boot_id) FROM boot_events WHERE system_id = ",
                )
                .bind(Val::Int(Some(id)))
                .push(")");
            }
        }
        (None, Some(m)) => {
            sql.push("e.system_id IS NULL AND e.mac = ")
                .bind(Val::Text(Some(m.clone())));
            if !all {
                sql.push(" AND e.boot_id = (SELECT MAX(boot_id) FROM boot_events WHERE system_id IS NULL AND mac = ")
                    .bind(Val::Text(Some(m.clone())))
                    .push(")");
            }
        }
        (None, None) => {
            // The latest event of every node, known or not.
            sql.push("e.id IN (SELECT MAX(id) FROM boot_events WHERE system_id IS NOT NULL GROUP BY system_id) OR e.id IN (SELECT MAX(id) FROM boot_events WHERE system_id IS NULL GROUP BY mac)");
        }
    }
    sql.push(&format!(" ORDER BY e.id LIMIT {MAX_EVENTS}"));
    let rows = sql.query().fetch_all(db.pool()).await.map_err(internal)?;
    rows.iter()
        .map(event_of)
        .collect::<Result<Vec<_>, _>>()
        .map(Json)
        .map_err(internal)
}

/// `GET /api/v1/boot/manifest`: a node's own manifest (admins: `?system=`).
pub async fn manifest(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    RawQuery(q): RawQuery,
) -> Result<Json<BootManifest>, ApiError> {
    let asked = url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "system")
        .map(|(_, v)| v.into_owned());
    let host = match (role(&st, &principal)?, asked) {
        (Role::Node(h), None) => h,
        (Role::Node(h), Some(s)) if s == h => h,
        (Role::Admin(_), Some(s)) => s,
        (Role::Admin(_), None) => {
            return Err(ApiError::invalid("system", "name the node: ?system=<host>"));
        }
        _ => {
            return Err(ApiError::Forbidden(
                "a boot manifest is for the node itself, with its own certificate".into(),
            ));
        }
    };
    let lookup =
        crate::http::ipxe::load_node(&st.db, crate::http::ipxe::NodeKey::Host(&host)).await?;
    let crate::netboot::Lookup::Known(view) = lookup.lookup else {
        return Err(ApiError::NotFound(format!("no system {host}")));
    };
    let Some(image) = &view.image else {
        return Err(ApiError::Conflict {
            message: format!("{host} has no image; set one in the inventory"),
            field: Some("image".into()),
        });
    };
    let sha = &image.rootfs_sha256;
    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::Conflict {
            message: format!(
                "image {} version {} has no recorded rootfs checksum; set rootfs_sha256 and rootfs_size from its manifest.json",
                image.slug, image.version
            ),
            field: Some("rootfs_sha256".into()),
        });
    }
    let sources: Vec<String> = crate::netboot::choose_jobservers(&view)
        .iter()
        .filter_map(|j| {
            let base = jobserver_base_url(j.address.as_deref()?, j.port);
            Some(image_file_url(
                &base,
                &image.slug,
                image.version,
                ImageFile::Rootfs,
            ))
        })
        .collect();
    if sources.is_empty() {
        return Err(ApiError::Conflict {
            message: format!(
                "image {} version {} is on no job server of {host}'s network",
                image.slug, image.version
            ),
            field: None,
        });
    }
    Ok(Json(BootManifest {
        system_id: view.system_id,
        hostname: view.hostname.clone(),
        image: image.slug.clone(),
        version: image.version,
        size: lookup.rootfs_size,
        sha256: sha.to_ascii_lowercase(),
        sources,
        tmpfs_size: (lookup.tmpfs_gib > 0).then(|| format!("{}G", lookup.tmpfs_gib)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boots_start_at_the_first_event_after_ready_a_pause_or_a_second_script() {
        let t = "2026-01-01T10:00:00Z";
        let gap = "2026-01-01T09:30:00Z";
        assert!(starts_new_boot(None, false, BootPhase::DhcpOffered, gap));
        assert!(starts_new_boot(
            Some((BootPhase::Ready, t)),
            true,
            BootPhase::DhcpOffered,
            gap
        ));
        assert!(starts_new_boot(
            Some((BootPhase::Progress, "2026-01-01T09:00:00Z")),
            true,
            BootPhase::AgentDhcp,
            gap
        ));
        // The agent's own DHCP, after the kernel: the same boot.
        assert!(!starts_new_boot(
            Some((BootPhase::InitramfsFetched, t)),
            true,
            BootPhase::DhcpOffered,
            gap
        ));
        assert!(starts_new_boot(
            Some((BootPhase::KernelFetched, t)),
            true,
            BootPhase::ScriptServed,
            gap
        ));
        assert!(!starts_new_boot(
            Some((BootPhase::DhcpAcked, t)),
            false,
            BootPhase::ScriptServed,
            gap
        ));
    }

    #[test]
    fn only_a_fresh_lease_of_the_source_on_the_nodes_network_attests() {
        let src: IpAddr = "10.0.0.50".parse().unwrap();
        let lease = |ip: &str, net: Option<i64>| Lease {
            ip: Some(ip.parse().unwrap()),
            proxy: false,
            network: net,
            subnet: Some(("10.0.0.0".parse().unwrap(), 24)),
        };
        assert!(attests(&[lease("10.0.0.50", Some(1))], src, Some(Some(1))));
        assert!(!attests(&[lease("10.0.0.51", Some(1))], src, Some(Some(1))));
        assert!(!attests(&[lease("10.0.0.50", Some(2))], src, Some(Some(1))));
        assert!(attests(&[lease("10.0.0.50", Some(2))], src, None));
        assert!(!attests(&[], src, None));
        let proxy = Lease {
            ip: None,
            proxy: true,
            ..lease("10.0.0.1", Some(1))
        };
        assert!(attests(std::slice::from_ref(&proxy), src, Some(Some(1))));
        assert!(!attests(
            &[proxy],
            "10.9.0.50".parse().unwrap(),
            Some(Some(1))
        ));
    }
}
