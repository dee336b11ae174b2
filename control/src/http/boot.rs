//! The boot timeline and the boot manifest over HTTP; the timeline itself
//! is [`crate::boot`].
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
//! - `POST /api/v1/boot/heartbeat` ([`HEARTBEAT_PATH`](mprov_api::boot::HEARTBEAT_PATH)): a job
//!   server's load, with its own certificate (which names the row).
//! - `GET /api/v1/boot/manifest` ([`MANIFEST_PATH`](mprov_api::boot::MANIFEST_PATH)): with a node's
//!   certificate, what it boots: image, version, the rootfs checksum the
//!   control service recorded, and the job servers to fetch it from, best
//!   first.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mprov_api::boot::{
    BootEvent, BootEventReport, BootManifest, BootPhase, Heartbeat, ImageFile, image_file_url,
    jobserver_base_url,
};

use super::AppState;
use super::error::ApiError;
use crate::boot::{
    MAX_DETAIL, NewEvent, Timeline, by_leased_ip, jobserver_phase, node_phase, record,
    system_by_key, system_by_mac,
};
use crate::config::SharedKeyMode;
use crate::identity::Principal;
use crate::netboot::{Lookup, NodeKey};

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
        Principal::Machine(m) if m.is_node() => Ok(Role::Node(m.identity.clone())),
        Principal::Machine(m) => Ok(Role::JobServer(m.identity.clone())),
    }
}

fn normal_mac(mac: &str) -> Result<String, ApiError> {
    crate::db::crud::parse_mac(mac).map_err(|e| ApiError::invalid("mac", e))
}

/// The highest load average a heartbeat may carry: anything above is a
/// broken report, not a busy machine.
const MAX_LOAD: f64 = 1e6;

/// `POST /api/v1/boot/heartbeat`: a job server's load, stored on the row its
/// certificate names. Only a job server's certificate reports one: nobody
/// else can say which job server it speaks for.
pub async fn heartbeat(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    Json(beat): Json<Heartbeat>,
) -> Result<StatusCode, ApiError> {
    let Role::JobServer(name) = role(&st, &principal)? else {
        return Err(ApiError::Forbidden(
            "a heartbeat comes from a job server's own certificate, which names it".into(),
        ));
    };
    if !(0.0..=MAX_LOAD).contains(&beat.load_avg) {
        return Err(ApiError::invalid(
            "load_avg",
            format!("a load average from 0 to {MAX_LOAD}"),
        ));
    }
    if crate::boot::heartbeat(&st.db, &name, beat.load_avg).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::Forbidden(format!(
            "no job server named {name} is registered (was its row deleted?)"
        )))
    }
}

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
                crate::boot::jobserver_id(db, name).await?
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
    let stored = record(db, ev).await?;
    st.boot_events.notify_waiters();
    Ok((StatusCode::CREATED, Json(stored)).into_response())
}

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
    let timeline = match (&system, &mac) {
        (Some(s), _) => {
            let (id, _) = system_by_key(db, s)
                .await?
                .ok_or_else(|| ApiError::NotFound(format!("no system {s}")))?;
            Timeline::System(id)
        }
        (None, Some(m)) => Timeline::Mac(m),
        (None, None) => Timeline::Latest,
    };
    Ok(Json(crate::boot::events(db, timeline, all).await?))
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
    // The node's view, by the host name its certificate names; the same
    // bootability rule as `/ipxe/`.
    let Lookup::Known(view) = crate::netboot::view::load(&st.db, NodeKey::Host(&host)).await?
    else {
        return Err(ApiError::NotFound(format!("no system {host}")));
    };
    let boot = crate::netboot::bootable(&view)?;
    let image = boot.image;
    let sources: Vec<String> = boot
        .jobservers
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
    let tmpfs_gib = view.effective().map(|e| e.tmpfs_root_size).unwrap_or(0);
    Ok(Json(BootManifest {
        system_id: view.system_id,
        hostname: view.hostname.clone(),
        image: image.slug.clone(),
        version: image.version,
        size: boot.size,
        sha256: boot.sha256.to_string(),
        sources,
        tmpfs_size: (tmpfs_gib > 0).then(|| format!("{tmpfs_gib}G")),
    }))
}
