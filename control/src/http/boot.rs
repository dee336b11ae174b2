//! The boot timeline and the boot manifest over HTTP; the timeline itself
//! is [`crate::boot`], and who may report, read or fetch what is decided by
//! [`crate::access`] (`boot_role`, `may_report`, `node_reports_itself`,
//! `may_read_events`, `manifest_for`, `heartbeat_from`): these handlers parse,
//! look up what the request names, and ask.
//!
//! - `POST /api/v1/boot/events` ([`EVENTS_PATH`](mprov_api::boot::EVENTS_PATH)): one step of a boot. Job
//!   servers report what they served (DHCP offered/acked, proxyDHCP, boot
//!   file, kernel, initramfs) with their own certificate and name the node
//!   by MAC, host name or the address they leased; a node reports its own
//!   steps with its certificate and can name no other node; `/ipxe/` records
//!   `script_served` itself.
//! - `POST /api/v1/boot/events/batch` ([`EVENTS_BATCH_PATH`](mprov_api::boot::EVENTS_BATCH_PATH)):
//!   up to [`MAX_BATCH`] of them at once (a job server's queue, a node's
//!   reports made while a post was in flight), each judged as alone; the
//!   refused ones are named in the answer, the rest stored in one
//!   transaction.
//! - `GET /api/v1/boot/events?system=<host|id>[&boot=all]`: a node's last
//!   boot (or all its events), oldest first; without `system`, the latest
//!   event of every node. `mac=` reads a node the inventory does not know.
//! - `POST /api/v1/boot/heartbeat` ([`HEARTBEAT_PATH`](mprov_api::boot::HEARTBEAT_PATH)): a job
//!   server's load and image streams on one of its registered addresses,
//!   with its own certificate (which names the row); [`crate::jobservers`].
//! - `POST /api/v1/jobserver/register` ([`REGISTER_PATH`]): a job
//!   server registers its row (host id, modules, port, addresses) with its
//!   own certificate, whose name is the row's; [`crate::jobservers`].
//! - `GET /api/v1/boot/manifest` ([`MANIFEST_PATH`](mprov_api::boot::MANIFEST_PATH)): with a node's
//!   certificate, what it boots: image, version, the rootfs checksum the
//!   control service recorded, and the job servers to fetch it from, best
//!   first.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mprov_api::boot::{
    BatchOutcome, BatchRefusal, BootEvent, BootEventReport, BootManifest, BootPhase, Heartbeat,
    ImageFile, MAX_BATCH, image_file_url, jobserver_base_url,
};
use mprov_api::jobs::{REGISTER_PATH, Registered, Registration};

use super::AppState;
use super::error::ApiError;
use crate::access::{self, BootRole};
use crate::boot::{
    MAX_DETAIL, NewEvent, Timeline, by_leased_ip, record, record_all, system_by_key, system_by_mac,
};
use crate::db::Db;
use crate::identity::Principal;
use crate::jobservers::Beat;
use crate::netboot::{Lookup, NodeKey};

/// The caller's boot role ([`access::boot_role`]).
fn role(st: &AppState, p: &Principal) -> Result<BootRole, ApiError> {
    Ok(access::boot_role(p, st.config.shared_key_mode)?)
}

fn normal_mac(mac: &str) -> Result<String, ApiError> {
    crate::db::crud::parse_mac(mac).map_err(|e| ApiError::invalid("mac", e))
}

/// The highest load average a heartbeat may carry: anything above is a
/// broken report, not a busy machine.
const MAX_LOAD: f64 = 1e6;

/// `POST /api/v1/boot/heartbeat`: a job server's load (and, for one of its
/// registered addresses, its image streams), stored on the row its
/// certificate names. Only a job server's certificate reports one: nobody
/// else can say which job server it speaks for.
pub async fn heartbeat(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    Json(beat): Json<Heartbeat>,
) -> Result<StatusCode, ApiError> {
    let role = role(&st, &principal)?;
    let name = access::heartbeat_from(&role)?;
    if !(0.0..=MAX_LOAD).contains(&beat.load_avg) {
        return Err(ApiError::invalid(
            "load_avg",
            format!("a load average from 0 to {MAX_LOAD}"),
        ));
    }
    let stamped = crate::jobservers::heartbeat(&st.db, name, &beat)
        .await
        .map_err(crate::boot::BootError::from)?;
    match stamped {
        Beat::Stamped => Ok(StatusCode::NO_CONTENT),
        Beat::NoJobServer => Err(ApiError::Forbidden(format!(
            "no job server named {name} is registered (was its row deleted?)"
        ))),
        Beat::NotRegistered(address) => Err(ApiError::Conflict {
            message: format!(
                "job server {name} did not register the address {address}: register first (POST {REGISTER_PATH} with it among its addresses), then send its heartbeats"
            ),
            field: Some("address".into()),
        }),
    }
}

/// `POST /api/v1/jobserver/register`: the job server whose certificate
/// names it registers its row ([`crate::jobservers::register`]).
pub async fn register(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    Json(reg): Json<Registration>,
) -> Result<Json<Registered>, ApiError> {
    let role = role(&st, &principal)?;
    let name = access::own_jobserver(&role, "registrations")?;
    st.within_budget(
        &st.register_limiter,
        &format!("jobserver:{name}"),
        "registrations",
    )?;
    let registered = crate::jobservers::register(&st.db, name, &reg).await?;
    st.changed.notify_waiters();
    tracing::info!(
        jobserver = %name,
        id = registered.id,
        addresses = registered.addresses.len(),
        "jobservers: registered"
    );
    Ok(Json(registered))
}

/// `POST /api/v1/boot/events`.
pub async fn post_event(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    Json(body): Json<BootEventReport>,
) -> Result<Response, ApiError> {
    let role = role(&st, &principal)?;
    take_budget(&st, &role, 1)?;
    let ev = judge(&st.db, &role, body).await?;
    let stored = record(&st.db, ev.clone()).await?;
    announce(&st, std::slice::from_ref(&ev));
    Ok((StatusCode::CREATED, Json(stored)).into_response())
}

/// `POST /api/v1/boot/events/batch`: each event judged as
/// [`post_event`] judges one; the refused ones named by their place, the
/// others stored in one transaction. A failure that is not the event's
/// (the database) fails the whole batch, which the reporter sends again.
pub async fn post_events(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<Principal>,
    Json(body): Json<Vec<BootEventReport>>,
) -> Result<Json<BatchOutcome>, ApiError> {
    let role = role(&st, &principal)?;
    access::may_report_any(&role)?;
    if body.is_empty() || body.len() > MAX_BATCH {
        return Err(ApiError::invalid(
            "events",
            format!(
                "a batch carries 1 to {MAX_BATCH} events, not {}; send the rest in further batches",
                body.len()
            ),
        ));
    }
    take_budget(&st, &role, u32::try_from(body.len()).unwrap_or(u32::MAX))?;
    let mut valid = Vec::with_capacity(body.len());
    let mut refused = Vec::new();
    for (index, report) in body.into_iter().enumerate() {
        match judge(&st.db, &role, report).await {
            Ok(ev) => valid.push(ev),
            Err(err) => {
                let (status, error, message, _) = err.parts();
                if !status.is_client_error() {
                    return Err(err);
                }
                refused.push(BatchRefusal {
                    index,
                    status: status.as_u16(),
                    error: error.to_owned(),
                    message,
                });
            }
        }
    }
    if !valid.is_empty() {
        record_all(&st.db, &valid).await?;
        announce(&st, &valid);
    }
    Ok(Json(BatchOutcome {
        stored: valid.len(),
        refused,
    }))
}

/// Takes `count` boot events from the reporter's budget (each node's and
/// job server's own), before any database work.
fn take_budget(st: &AppState, role: &BootRole, count: u32) -> Result<(), ApiError> {
    match role {
        BootRole::Node(host) => st.within_budget_n(
            &st.node_events_limiter,
            &format!("node:{host}"),
            "boot events",
            count,
        ),
        BootRole::JobServer(name) => st.within_budget_n(
            &st.jobserver_events_limiter,
            &format!("jobserver:{name}"),
            "boot events",
            count,
        ),
        BootRole::Admin(_) | BootRole::Reader => Ok(()),
    }
}

/// The event `body` from `role` stores, with the node it names looked up,
/// or why it may not be stored.
async fn judge(db: &Db, role: &BootRole, body: BootEventReport) -> Result<NewEvent, ApiError> {
    if body.detail.len() > MAX_DETAIL {
        return Err(ApiError::invalid(
            "detail",
            format!("at most {MAX_DETAIL} bytes"),
        ));
    }
    let mac = body.mac.as_deref().map(normal_mac).transpose()?;
    let ev = match access::may_report(role, body.phase)? {
        reporter @ access::Reporter::Node(host) => {
            let own = system_by_key(db, host).await?.map(|(i, _)| i);
            let named_system = match &body.system {
                Some(s) => Some(system_by_key(db, s).await?.map(|(i, _)| i)),
                None => None,
            };
            let named_mac = match &mac {
                Some(m) => Some(system_by_mac(db, m).await?),
                None => None,
            };
            let id = access::node_reports_itself(host, own, named_system, named_mac)?;
            NewEvent {
                system_id: Some(id),
                mac,
                phase: body.phase,
                source: reporter.source(),
                jobserver_id: None,
                ip: body.ip,
                detail: body.detail,
            }
        }
        reporter @ (access::Reporter::JobServer(_) | access::Reporter::Admin(_)) => {
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
            // A job server's lease report attests `/ipxe/`: only for an
            // address inside its own network, else refused before writing.
            let jobserver_id = match reporter.attesting_jobserver() {
                Some(name) => {
                    let row = crate::boot::jobserver_networks(db, name).await?;
                    let subnets: Vec<_> = row
                        .iter()
                        .flat_map(|(_, nets)| nets.iter().map(|(_, subnet)| *subnet))
                        .collect();
                    crate::boot::lease_report_allowed(name, body.phase, body.ip, &subnets)
                        .map_err(crate::boot::BootError::from)?;
                    row.map(|(id, _)| id)
                }
                None => None,
            };
            NewEvent {
                system_id,
                mac,
                phase: body.phase,
                source: reporter.source(),
                jobserver_id,
                ip: body.ip,
                detail: body.detail,
            }
        }
    };
    Ok(ev)
}

/// After `stored` were written: the board's readers wake, and so does an
/// `/ipxe/` request waiting for a job server's lease report of its MAC.
fn announce(st: &AppState, stored: &[NewEvent]) {
    st.boot_events.notify_waiters();
    for ev in stored {
        let attests = ev.jobserver_id.is_some()
            && matches!(ev.phase, BootPhase::DhcpAcked | BootPhase::ProxyAnswered);
        if let (true, Some(mac)) = (attests, &ev.mac) {
            st.lease_waiters.wake(mac);
        }
    }
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
    let named_host = match (&role, &system) {
        (BootRole::Node(_), Some(s)) => Some(system_by_key(db, s).await?.map(|(_, h)| h)),
        _ => None,
    };
    if let Some(own) = access::may_read_events(
        &role,
        named_host.as_ref().map(Option::as_deref),
        mac.is_some(),
    )? {
        system = Some(own.to_owned());
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
    let host = access::manifest_for(&role(&st, &principal)?, asked)?;
    // The node's view, by the host name its certificate names; the same
    // bootability rule as `/ipxe/`.
    let Lookup::Known(view) = crate::netboot::view::load(&st.db, NodeKey::Host(&host)).await?
    else {
        return Err(ApiError::NotFound(format!("no system {host}")));
    };
    let boot = crate::netboot::bootable(&view, st.config.jobserver_stale)?;
    let image = boot.image;
    let sources: Vec<String> = boot
        .jobservers
        .iter()
        .map(|j| {
            let base = jobserver_base_url(j.address, j.port);
            image_file_url(&base, &image.slug, image.version, ImageFile::Rootfs)
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
