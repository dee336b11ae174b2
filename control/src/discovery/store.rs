//! The I/O around [`super::decide`]: the one-time discovery nonce, a
//! report's application, and the parked (discovered) nodes an admin lists,
//! assigns and dismisses.
//!
//! **The discovery nonce** is minted by `/ipxe/` for an unknown MAC it
//! sends the discovery boot ([`mint_nonce`]), stored as a SHA-256 and bound
//! to that MAC, good for [`NONCE_TTL`]. Its own table keeps it apart from
//! the enrollment nonces: `POST /enroll/node/` never finds it, and no
//! other route reads its header. A report ([`report`]) spends it as the
//! first statement of its transaction, only for the MAC it was minted for
//! and only while unused and unexpired; anything else is refused before a
//! thing is stored ([`DiscoveryError`]), and a nonce presented for another
//! MAC stays good for its own.
//!
//! **A report's application** happens in that same transaction: the
//! inventory [`super::decide`] reads (every switch; the NICs cabled to a
//! switch port or holding the boot MAC), then either the bind (the NIC's
//! MAC set, only if it is still what the decision saw, and the inventory
//! revision bumped so the job servers' boot config follows) or the parked
//! row. Warnings go on the timelines after the commit.

use mprov_api::nads::{NadsReport, ReportOutcome};
use serde::Serialize;
use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};
use std::time::Duration;

use super::{Decision, Inventory, Nic, Outcome, Policy, Switch, Warning};
use crate::db::{Db, Val, int, opt_int};
use crate::secrets;
use crate::time::now;

/// How long a discovery nonce is good for: the boot, the agent's listening
/// window and the report, with room to spare.
pub const NONCE_TTL: Duration = Duration::from_secs(15 * 60);

/// The most parked nodes one list page holds.
pub const MAX_PAGE: i64 = 500;

/// Why a report, an assignment or a dismissal failed: the facts, which the
/// HTTP layer alone turns into statuses (`From<DiscoveryError> for
/// ApiError`).
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The database failed.
    #[error("discovery database")]
    Db(#[from] sqlx::Error),
    /// The report's boot MAC is not a MAC.
    #[error("the report's boot_mac {0:?} is not a MAC address")]
    MacInvalid(String),
    /// The MAC an admin assigns is on a NIC already.
    #[error("MAC {mac} is already on {holder}")]
    MacTaken {
        /// The MAC.
        mac: String,
        /// Who holds it (`c01 eno1`).
        holder: String,
    },
    /// The NIC an admin names has a MAC, and the assignment does not
    /// replace it.
    #[error("{nic} has MAC {mac} already")]
    NicHasMac {
        /// The NIC (`c01 eno1`).
        nic: String,
        /// Its MAC.
        mac: String,
    },
    /// The NIC an admin names is not one of the system's.
    #[error("system {system} has no NIC {nic:?}")]
    NicUnknown {
        /// The system's host name.
        system: String,
        /// The NIC asked for.
        nic: String,
    },
    /// The NIC the decision bound changed under it (another write won).
    #[error("the NIC's MAC changed while the report was applied")]
    NicRaced,
    /// The report came without a nonce.
    #[error("no discovery nonce")]
    NonceMissing,
    /// The nonce expired at this time.
    #[error("the discovery nonce expired at {0}")]
    NonceExpired(String),
    /// The nonce was minted for another MAC than the report's boot MAC.
    #[error("the discovery nonce was minted for another MAC")]
    NonceForAnotherMac,
    /// No nonce has this hash: never minted, or cancelled by a newer boot.
    #[error("the discovery nonce is unknown")]
    NonceUnknown,
    /// The nonce was used already, at this time.
    #[error("the discovery nonce was already used at {0}")]
    NonceUsed(String),
    /// No node with this MAC is parked.
    #[error("no discovered node has MAC {0}")]
    NotParked(String),
    /// The system an admin names does not exist.
    #[error("no system {0:?}")]
    SystemUnknown(String),
    /// A time could not be computed.
    #[error("discovery time")]
    Time(#[from] jiff::Error),
}

/// Mints a one-time discovery nonce for `mac` (lower-case, colons); only
/// its hash is kept. In the same transaction it cancels the MAC's earlier
/// unused nonces (only the newest boot reports) and deletes every expired
/// row.
pub async fn mint_nonce(db: &Db, mac: &str) -> Result<String, DiscoveryError> {
    db.mint_nonce(
        "discovery_nonces",
        "mac",
        Val::Text(Some(mac.to_owned())),
        NONCE_TTL,
    )
    .await
}

/// What a report led to.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The answer to the node.
    pub outcome: ReportOutcome,
    /// What [`super::decide`] decided, and warned about (recorded on the
    /// timelines already).
    pub decided: Outcome,
}

/// `POST /api/v1/discovery/report`: spends `nonce` for the report's boot
/// MAC, decides under `policy` and applies the decision, all in one
/// transaction; then records the warnings on the timelines.
pub async fn report(
    db: &Db,
    nonce: Option<&str>,
    mut body: NadsReport,
    policy: Policy,
) -> Result<Applied, DiscoveryError> {
    let nonce = nonce
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .ok_or(DiscoveryError::NonceMissing)?;
    let mac = crate::db::crud::parse_mac(&body.boot_mac)
        .map_err(|_| DiscoveryError::MacInvalid(body.boot_mac.clone()))?;
    body.boot_mac = mac.clone();
    let hash = secrets::hash_api_secret(nonce);
    let mut tx = db.pool().begin().await?;
    // First statement: spends the nonce and, on SQLite, takes the write
    // lock before anything is read.
    let mut spend = db.sql();
    spend
        .push("UPDATE discovery_nonces SET used_at = ")
        .bind(Val::Text(Some(now())))
        .push(" WHERE hash = ")
        .bind(Val::Text(Some(hash.clone())))
        .push(" AND mac = ")
        .bind(Val::Text(Some(mac.clone())))
        .push(" AND used_at IS NULL AND expires_at > ")
        .bind(Val::Text(Some(now())));
    if spend.query().execute(&mut *tx).await?.rows_affected() != 1 {
        tx.rollback().await?;
        return Err(refusal(db, &hash, &mac).await?);
    }
    let inventory = load_inventory(db, &mut tx, &mac).await?;
    let decided = super::decide(&body, &inventory, policy);
    let outcome = match &decided.decision {
        Decision::AlreadyBound(target) => {
            forget(db, &mut tx, &mac).await?;
            ReportOutcome::Matched {
                hostname: target.hostname.clone(),
            }
        }
        Decision::Bind {
            target,
            mac,
            replaces,
        } => {
            bind(db, &mut tx, target.nic, mac, replaces.as_deref()).await?;
            forget(db, &mut tx, mac).await?;
            ReportOutcome::Matched {
                hostname: target.hostname.clone(),
            }
        }
        Decision::Park { reason, candidate } => {
            let report = serde_json::to_string(&body).unwrap_or_default();
            park(
                db,
                &mut tx,
                &mac,
                &report,
                reason,
                candidate.as_ref().map(|c| c.nic),
            )
            .await?;
            ReportOutcome::Parked {
                reason: reason.clone(),
            }
        }
    };
    tx.commit().await?;
    match &decided.decision {
        Decision::Bind { target, .. } => {
            tracing::info!(%mac, nic = %target.label, %policy, "discovery: MAC bound by switch port");
        }
        Decision::Park { reason, .. } => {
            tracing::info!(%mac, %policy, "discovery: node parked: {reason}");
        }
        Decision::AlreadyBound(target) => {
            tracing::info!(%mac, nic = %target.label, "discovery: the MAC is bound already");
        }
    }
    record_warnings(db, &mac, &decided.warnings).await;
    Ok(Applied { outcome, decided })
}

/// Why the nonce `hash` is refused for `mac`, read after the spending
/// statement found nothing to spend.
async fn refusal(db: &Db, hash: &str, mac: &str) -> Result<DiscoveryError, DiscoveryError> {
    let Some(row) = db
        .row_where(
            "SELECT mac, expires_at, used_at FROM discovery_nonces WHERE hash = ",
            hash,
        )
        .await?
    else {
        return Ok(DiscoveryError::NonceUnknown);
    };
    let minted_for: String = row.try_get("mac")?;
    if minted_for != mac {
        tracing::warn!(%mac, minted_for = %minted_for, "discovery: a nonce was presented for another MAC");
        return Ok(DiscoveryError::NonceForAnotherMac);
    }
    if let Some(at) = row.try_get::<Option<String>, _>("used_at")? {
        tracing::warn!(%mac, "discovery: a used nonce was presented again");
        return Ok(DiscoveryError::NonceUsed(at));
    }
    Ok(DiscoveryError::NonceExpired(row.try_get("expires_at")?))
}

fn text(row: &AnyRow, col: &str) -> Result<Option<String>, sqlx::Error> {
    Ok(row
        .try_get::<Option<String>, _>(col)?
        .filter(|s| !s.trim().is_empty()))
}

/// What [`super::decide`] reads: every switch, and the NICs cabled to a
/// switch port or holding `mac`.
async fn load_inventory(
    db: &Db,
    conn: &mut AnyConnection,
    mac: &str,
) -> Result<Inventory, sqlx::Error> {
    let mut q = db.sql();
    q.push("SELECT id, hostname, mgmt_mac, mgmt_ip FROM switches ORDER BY id");
    let mut inventory = Inventory::default();
    for r in q.query().fetch_all(&mut *conn).await? {
        inventory.switches.push(Switch {
            id: int(&r, "id")?,
            hostname: text(&r, "hostname")?.unwrap_or_default(),
            mgmt_mac: text(&r, "mgmt_mac")?,
            mgmt_ip: text(&r, "mgmt_ip")?,
        });
    }
    let mut q = db.sql();
    q.push(NIC_SELECT)
        .push("n.switch_port_id IS NOT NULL OR n.mac = ")
        .bind(Val::Text(Some(mac.to_owned())))
        .push(" ORDER BY n.id");
    for r in q.query().fetch_all(&mut *conn).await? {
        inventory.nics.push(nic_of(&r)?);
    }
    Ok(inventory)
}

/// The NICs [`nic_of`] reads, with their systems and switch ports; the
/// caller appends the condition.
const NIC_SELECT: &str = "SELECT n.id, n.name, n.mac, n.system_id, s.hostname, s.model, s.serial, p.switch_id, p.name AS port FROM network_interfaces n JOIN systems s ON s.id = n.system_id LEFT JOIN switch_ports p ON p.id = n.switch_port_id WHERE ";

fn nic_of(r: &AnyRow) -> Result<Nic, sqlx::Error> {
    Ok(Nic {
        id: int(r, "id")?,
        name: text(r, "name")?.unwrap_or_default(),
        system_id: int(r, "system_id")?,
        hostname: text(r, "hostname")?.unwrap_or_default(),
        mac: text(r, "mac")?,
        switch_id: opt_int(r, "switch_id")?,
        port: text(r, "port")?,
        model: text(r, "model")?,
        serial: text(r, "serial")?,
    })
}

/// Sets NIC `nic`'s MAC to `mac` if it still is `was`, and bumps the
/// inventory revision.
async fn bind(
    db: &Db,
    conn: &mut AnyConnection,
    nic: i64,
    mac: &str,
    was: Option<&str>,
) -> Result<(), DiscoveryError> {
    let mut q = db.sql();
    q.push("UPDATE network_interfaces SET mac = ")
        .bind(Val::Text(Some(mac.to_owned())))
        .push(" WHERE id = ")
        .bind(Val::Int(Some(nic)));
    match was {
        Some(old) => q.push(" AND mac = ").bind(Val::Text(Some(old.to_owned()))),
        None => q.push(" AND mac IS NULL"),
    };
    if q.query().execute(&mut *conn).await?.rows_affected() != 1 {
        return Err(DiscoveryError::NicRaced);
    }
    sqlx::query("UPDATE inventory_revision SET revision = revision + 1 WHERE id = 1")
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Deletes `mac`'s parked row, if any; whether there was one.
async fn forget(db: &Db, conn: &mut AnyConnection, mac: &str) -> Result<bool, sqlx::Error> {
    let mut q = db.sql();
    q.push("DELETE FROM discovered_nodes WHERE mac = ")
        .bind(Val::Text(Some(mac.to_owned())));
    Ok(q.query().execute(&mut *conn).await?.rows_affected() > 0)
}

/// Parks `mac` with its report: a new row, or the MAC's row updated (its
/// first sighting kept).
async fn park(
    db: &Db,
    conn: &mut AnyConnection,
    mac: &str,
    report: &str,
    reason: &str,
    candidate: Option<i64>,
) -> Result<(), sqlx::Error> {
    let at = now();
    let mut q = db.sql();
    q.push("UPDATE discovered_nodes SET report = ")
        .bind(Val::Text(Some(report.to_owned())))
        .push(", reason = ")
        .bind(Val::Text(Some(reason.to_owned())))
        .push(", candidate_nic_id = ")
        .bind(Val::Int(candidate))
        .push(", last_seen = ")
        .bind(Val::Text(Some(at.clone())))
        .push(" WHERE mac = ")
        .bind(Val::Text(Some(mac.to_owned())));
    if q.query().execute(&mut *conn).await?.rows_affected() == 1 {
        return Ok(());
    }
    let mut q = db.sql();
    q.push("INSERT INTO discovered_nodes (mac, report, reason, candidate_nic_id, first_seen, last_seen) VALUES ")
        .bind_list([
            Val::Text(Some(mac.to_owned())),
            Val::Text(Some(report.to_owned())),
            Val::Text(Some(reason.to_owned())),
            Val::Int(candidate),
            Val::Text(Some(at.clone())),
            Val::Text(Some(at)),
        ]);
    q.query().execute(&mut *conn).await?;
    Ok(())
}

/// Records each warning as a `failed` boot event (what went wrong, and
/// what next) on its system's timeline, or the MAC's.
async fn record_warnings(db: &Db, mac: &str, warnings: &[Warning]) {
    for w in warnings {
        tracing::warn!(%mac, "{w}");
        let event = crate::boot::NewEvent {
            system_id: w.system_id(),
            mac: Some(mac.to_owned()),
            phase: mprov_api::boot::BootPhase::Failed,
            source: "control".into(),
            jobserver_id: None,
            ip: None,
            detail: w.to_string(),
        };
        if let Err(e) = crate::boot::record(db, event).await {
            tracing::warn!(error = %e, "discovery: cannot record a warning on the timeline");
        }
    }
}

/// The NIC a parked node matched.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Candidate {
    /// The NIC's id.
    pub nic: i64,
    /// Its name.
    pub nic_name: String,
    /// Its system's id.
    pub system: i64,
    /// Its system's host name.
    pub hostname: String,
}

/// A parked (discovered) node, as the API lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Parked {
    /// Its row's id (the list's keyset).
    pub id: i64,
    /// Its boot MAC.
    pub mac: String,
    /// Why it waits.
    pub reason: String,
    /// The NIC it matched, if any.
    pub candidate: Option<Candidate>,
    /// Everything it reported (a `NadsReport`).
    pub report: Value,
    /// When it first reported.
    pub first_seen: String,
    /// When it last reported.
    pub last_seen: String,
}

/// One page of parked nodes, in id order.
#[derive(Debug, Clone, Serialize)]
pub struct Page {
    /// The nodes.
    pub items: Vec<Parked>,
    /// The `after` of the next page, when there is one.
    pub next: Option<i64>,
}

/// The parked nodes after id `after`, at most `limit` (1 to [`MAX_PAGE`]).
pub async fn list(db: &Db, after: i64, limit: i64) -> Result<Page, sqlx::Error> {
    let limit = limit.clamp(1, MAX_PAGE);
    let mut q = db.sql();
    q.push("SELECT d.id, d.mac, d.reason, d.report, d.first_seen, d.last_seen, n.id AS nic_id, n.name AS nic_name, s.id AS system_id, s.hostname FROM discovered_nodes d LEFT JOIN network_interfaces n ON n.id = d.candidate_nic_id LEFT JOIN systems s ON s.id = n.system_id WHERE d.id > ")
        .bind(Val::Int(Some(after)))
        .push(&format!(" ORDER BY d.id LIMIT {}", limit + 1));
    let rows = db.fetch_all(&q).await?;
    let mut items = Vec::with_capacity(rows.len());
    for r in &rows {
        let candidate = match (opt_int(r, "nic_id")?, opt_int(r, "system_id")?) {
            (Some(nic), Some(system)) => Some(Candidate {
                nic,
                nic_name: text(r, "nic_name")?.unwrap_or_default(),
                system,
                hostname: text(r, "hostname")?.unwrap_or_default(),
            }),
            _ => None,
        };
        let report: String = r.try_get("report")?;
        items.push(Parked {
            id: int(r, "id")?,
            mac: r.try_get("mac")?,
            reason: r.try_get("reason")?,
            candidate,
            report: serde_json::from_str(&report).unwrap_or(Value::Null),
            first_seen: r.try_get("first_seen")?,
            last_seen: r.try_get("last_seen")?,
        });
    }
    let more = items.len() > usize::try_from(limit).unwrap_or(usize::MAX);
    items.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let next = if more {
        items.last().map(|p| p.id)
    } else {
        None
    };
    Ok(Page { items, next })
}

/// What an admin assigned.
#[derive(Debug, Clone, Serialize)]
pub struct Assigned {
    /// The MAC.
    pub mac: String,
    /// The system's host name.
    pub hostname: String,
    /// The NIC's id.
    pub nic: i64,
    /// The MAC the NIC had before, if the assignment replaced one.
    pub replaced: Option<String>,
}

/// `POST /api/v1/discovery/{mac}/assign`: binds the parked `mac` to
/// `system`'s NIC `nic` (its id, or its name), replacing a MAC it has only
/// if `replace`; the parked row goes, the inventory revision is bumped.
/// `by` (the admin, for the timeline) is logged.
pub async fn assign(
    db: &Db,
    mac: &str,
    system: &str,
    nic: &str,
    replace: bool,
    by: &str,
) -> Result<Assigned, DiscoveryError> {
    let mut tx = db.pool().begin().await?;
    // First statement: a write, so SQLite takes its lock before the reads.
    if !forget(db, &mut tx, mac).await? {
        return Err(DiscoveryError::NotParked(mac.to_owned()));
    }
    let mut q = db.sql();
    q.push(NIC_SELECT)
        .push("n.mac = ")
        .bind(Val::Text(Some(mac.to_owned())));
    if let Some(r) = q.query().fetch_optional(&mut *tx).await? {
        return Err(DiscoveryError::MacTaken {
            mac: mac.to_owned(),
            holder: nic_of(&r)?.label(),
        });
    }
    let mut q = db.sql();
    q.push(NIC_SELECT);
    match crate::db::crud::RefKey::parse_str(system) {
        crate::db::crud::RefKey::Id(id) => q.push("s.id = ").bind(Val::Int(Some(id))),
        crate::db::crud::RefKey::Slug(host) => q
            .push("s.hostname = ")
            .bind(Val::Text(Some(host.to_ascii_lowercase()))),
    };
    q.push(" ORDER BY n.id");
    let nics: Vec<Nic> = q
        .query()
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(nic_of)
        .collect::<Result<_, _>>()?;
    if nics.is_empty() && !system_exists(db, &mut tx, system).await? {
        return Err(DiscoveryError::SystemUnknown(system.to_owned()));
    }
    let wanted = nic.trim();
    let Some(target) = nics
        .iter()
        .find(|n| n.id.to_string() == wanted || (!wanted.is_empty() && n.name == wanted))
    else {
        return Err(DiscoveryError::NicUnknown {
            system: system.to_owned(),
            nic: nic.to_owned(),
        });
    };
    if let Some(old) = &target.mac
        && !replace
    {
        return Err(DiscoveryError::NicHasMac {
            nic: target.label(),
            mac: old.clone(),
        });
    }
    bind(db, &mut tx, target.id, mac, target.mac.as_deref()).await?;
    tx.commit().await?;
    tracing::info!(%mac, nic = %target.label(), %by, "discovery: a parked node was assigned");
    Ok(Assigned {
        mac: mac.to_owned(),
        hostname: target.hostname.clone(),
        nic: target.id,
        replaced: target.mac.clone(),
    })
}

async fn system_exists(db: &Db, conn: &mut AnyConnection, key: &str) -> Result<bool, sqlx::Error> {
    let mut q = db.sql();
    q.push("SELECT id FROM systems WHERE ");
    match crate::db::crud::RefKey::parse_str(key) {
        crate::db::crud::RefKey::Id(id) => q.push("id = ").bind(Val::Int(Some(id))),
        crate::db::crud::RefKey::Slug(host) => q
            .push("hostname = ")
            .bind(Val::Text(Some(host.to_ascii_lowercase()))),
    };
    Ok(q.query().fetch_optional(&mut *conn).await?.is_some())
}

/// `DELETE /api/v1/discovery/{mac}`: forgets the parked node (its next
/// discovery boot parks it again).
pub async fn dismiss(db: &Db, mac: &str) -> Result<(), DiscoveryError> {
    let mut conn = db.pool().acquire().await?;
    if forget(db, &mut conn, mac).await? {
        Ok(())
    } else {
        Err(DiscoveryError::NotParked(mac.to_owned()))
    }
}
