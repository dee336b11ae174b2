//! The boot timeline: recording a boot's events, grouping them into
//! boots, and the lease reports that attest `/ipxe/` requests. The HTTP
//! endpoints over it are in `crate::http::boot`:
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
//! The same events attest `/ipxe/` requests ([`attests`]). A job server's
//! networks are those of the addresses it registered, and its row's
//! network ([`jobserver_networks`]): one serving several subnets vouches on
//! each. Its `dhcp_acked` or `proxy_answered` report is stored only for an
//! address inside one of them ([`lease_report_allowed`]; refused, and
//! nothing written, otherwise, and from a job server with no network). A
//! request is attested by such a report of its source address for its MAC,
//! the network holding that address being the node's: the network of the
//! node's switch port, else of its NIC; for a NIC naming none, a network
//! that also holds the NIC's reserved address; a node with neither is
//! refused with a retry script asking to set the NIC's network
//! ([`UNPLACED`]). An unknown MAC is attested by any job server's lease (it
//! gets only the discovery script).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use mprov_api::boot::{BoardState, BootEvent, BootPhase};
use sqlx::Row as _;
use sqlx::any::AnyRow;

use crate::db::{Db, Engine, Sql, Val, int, opt_int};
use crate::time::format_ts;

/// A pause after which a node's next event starts a new boot.
pub const BOOT_GAP: Duration = Duration::from_secs(30 * 60);
pub use mprov_api::boot::ATTEST_WINDOW;
/// The most events one read returns.
pub const MAX_EVENTS: i64 = 1000;
/// The longest detail kept.
pub const MAX_DETAIL: usize = 4096;

/// Why a read or write of the boot timeline failed.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The database failed.
    #[error("boot timeline database")]
    Db(#[from] sqlx::Error),
    /// A job server's lease report was refused.
    #[error(transparent)]
    LeaseRefused(#[from] LeaseRefused),
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
pub async fn record(db: &Db, ev: NewEvent) -> Result<BootEvent, BootError> {
    record_at(db, ev, jiff::Timestamp::now()).await
}

/// How often [`record_at`] tries again after colliding with a concurrent
/// write (a busy SQLite, a deadlock).
const RECORD_RETRIES: u32 = 20;

/// [`record`] as if it were `at` (tests of the retention store old events).
pub async fn record_at(db: &Db, ev: NewEvent, at: jiff::Timestamp) -> Result<BootEvent, BootError> {
    let mut stored = record_all_at(db, std::slice::from_ref(&ev), at).await?;
    stored
        .pop()
        .ok_or_else(|| BootError::Db(sqlx::Error::Protocol("no event was stored".into())))
}

/// Stores events in order, each in the boot it belongs to, in one
/// transaction (a batch: one commit for all). Concurrent reports of one
/// node collide in the database; the batch is tried again, a little later.
pub async fn record_all(db: &Db, evs: &[NewEvent]) -> Result<Vec<BootEvent>, BootError> {
    record_all_at(db, evs, jiff::Timestamp::now()).await
}

async fn record_all_at(
    db: &Db,
    evs: &[NewEvent],
    at: jiff::Timestamp,
) -> Result<Vec<BootEvent>, BootError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let tried = async {
            let mut tx = db.pool().begin().await?;
            let mut stored = Vec::with_capacity(evs.len());
            for ev in evs {
                stored.push(insert(db, &mut tx, ev.clone(), at).await?);
            }
            tx.commit().await?;
            Ok::<_, BootError>(stored)
        };
        match tried.await {
            Err(BootError::Db(e))
                if attempt < RECORD_RETRIES && crate::db::health::collision(&e) =>
            {
                tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
            }
            done => return done,
        }
    }
}

/// Writes one event inside `tx`.
async fn insert(
    db: &Db,
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    ev: NewEvent,
    at: jiff::Timestamp,
) -> Result<BootEvent, BootError> {
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
    let previous = prev.query().fetch_optional(&mut **tx).await?;
    let now = format_ts(at);
    let gap_start = format_ts(
        at.checked_sub(jiff::SignedDuration::try_from(BOOT_GAP).unwrap_or_default())
            .unwrap_or(jiff::Timestamp::MIN),
    );
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
            int(&q.query().fetch_one(&mut **tx).await?, "n")? > 0
        }
        _ => false,
    };
    let previous_step =
        prev_boot.map(|_| (prev_phase.unwrap_or(BootPhase::Failed), prev_at.as_str()));
    let boot_id = match prev_boot {
        Some(b) if !starts_new_boot(previous_step, boot_has_script, ev.phase, &gap_start) => b,
        _ => {
            let r = sqlx::query("SELECT COALESCE(MAX(id), 0) + 1 AS next_id FROM boot_events")
                .fetch_one(&mut **tx)
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
        let done = ins.query().execute(&mut **tx).await?;
        done.last_insert_id()
            .ok_or_else(|| sqlx::Error::Protocol("the insert returned no id".into()))?
    } else {
        ins.push(" RETURNING id");
        int(&ins.query().fetch_one(&mut **tx).await?, "id")?
    };
    if let Some(sid) = ev.system_id {
        keep_node_state(db, tx, sid, boot_id, &ev, &now).await?;
    }
    let hostname = match ev.system_id {
        Some(sid) => {
            let mut q = db.sql();
            q.push("SELECT hostname FROM systems WHERE id = ")
                .bind(Val::Int(Some(sid)));
            q.query()
                .fetch_optional(&mut **tx)
                .await?
                .and_then(|r| text(&r, "hostname"))
        }
        None => None,
    };
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

/// A node's current state on the boot board, as `node_states` keeps it:
/// one row per system that has reported, written with each of its events
/// ([`next_state`]), so the board reads it without scanning `boot_events`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// The boot the latest event belongs to.
    pub boot_id: i64,
    /// Where the node stands.
    pub state: BoardState,
    /// The latest event's phase.
    pub phase: BootPhase,
    /// How much of the image has streamed, while in [`BoardState::Image`].
    pub percent: Option<u8>,
    /// When this boot's first event came (stored form).
    pub boot_started: String,
    /// When the node entered `state`.
    pub state_since: String,
    /// When the latest event came.
    pub last_at: String,
    /// The latest event's detail.
    pub detail: String,
    /// The latest failure's detail in this boot (`failed`,
    /// `checksum_mismatch`); empty without one.
    pub last_error: String,
}

/// The percentage an agent's `progress` detail ends with (`"120 of 800
/// MiB (15%)"`), at most 100.
pub fn progress_percent(detail: &str) -> Option<u8> {
    let (_, tail) = detail.rsplit_once('(')?;
    let n: u8 = tail.trim_end().strip_suffix("%)")?.trim().parse().ok()?;
    Some(n.min(100))
}

/// A node's state after an event of `phase` in boot `boot_id` at `at`,
/// given its state before (`None`: the node's first event). `None` when
/// the event changes nothing: a lease renewal (`dhcp_acked` without an
/// offer before it) of a node whose boot has ended, which a running node
/// sends every half lease and which is no new boot for the board. Pure.
///
/// An event of another boot resets the row: the boot, the state and the
/// error start over. Within a boot the state follows the latest phase
/// ([`BootPhase::board_state`]); `image_started` starts the percentage at
/// 0, `progress` sets it from its detail, `verified` and `switch_root` at
/// 100, any other state clears it.
pub fn next_state(
    prev: Option<&NodeState>,
    boot_id: i64,
    phase: BootPhase,
    at: &str,
    detail: &str,
) -> Option<NodeState> {
    let state = phase.board_state();
    let same_boot = prev.filter(|p| p.boot_id == boot_id);
    if let Some(p) = prev
        && p.state.is_final()
        && phase == BootPhase::DhcpAcked
    {
        return None;
    }
    let since = match same_boot {
        Some(p) if p.state == state => p.state_since.clone(),
        _ => at.to_owned(),
    };
    let percent = match phase {
        BootPhase::ImageStarted => Some(0),
        BootPhase::Progress => progress_percent(detail)
            .or(same_boot.and_then(|p| p.percent))
            .or(Some(0)),
        BootPhase::Verified | BootPhase::SwitchRoot => Some(100),
        _ if state == BoardState::Image => same_boot.and_then(|p| p.percent),
        _ => None,
    };
    let last_error = if state == BoardState::Failed {
        detail.to_owned()
    } else {
        same_boot.map(|p| p.last_error.clone()).unwrap_or_default()
    };
    Some(NodeState {
        boot_id,
        state,
        phase,
        percent,
        boot_started: same_boot.map_or_else(|| at.to_owned(), |p| p.boot_started.clone()),
        state_since: since,
        last_at: at.to_owned(),
        detail: detail.to_owned(),
        last_error,
    })
}

/// The columns of `node_states` a [`NodeState`] is read from.
pub const NODE_STATE_COLUMNS: &str =
    "boot_id, state, phase, percent, boot_started, state_since, last_at, detail, last_error";

/// Reads a [`NodeState`] from a row holding [`NODE_STATE_COLUMNS`] (with
/// any prefix the query gave them: none here). `None` when the row has
/// none (a system that never reported, in a `LEFT JOIN`).
pub fn node_state_of(r: &AnyRow) -> Result<Option<NodeState>, sqlx::Error> {
    let Some(boot_id) = opt_int(r, "boot_id")? else {
        return Ok(None);
    };
    let state = text(r, "state")
        .and_then(|s| BoardState::from_wire(&s))
        .unwrap_or(BoardState::Failed);
    Ok(Some(NodeState {
        boot_id,
        state,
        phase: text(r, "phase")
            .and_then(|p| phase_of(&p))
            .unwrap_or(BootPhase::Failed),
        percent: opt_int(r, "percent")?.and_then(|p| u8::try_from(p.clamp(0, 100)).ok()),
        boot_started: text(r, "boot_started").unwrap_or_default(),
        state_since: text(r, "state_since").unwrap_or_default(),
        last_at: text(r, "last_at").unwrap_or_default(),
        detail: text(r, "detail").unwrap_or_default(),
        last_error: text(r, "last_error").unwrap_or_default(),
    }))
}

/// Keeps system `sid`'s row of `node_states` after its event `ev` of boot
/// `boot_id` at `at`, inside the event's transaction: reads the row
/// (locking it where the engine can), decides ([`next_state`]), and
/// writes it with the next `seq` from `board_seq`. Bumping that one row
/// last makes every writer wait for the one before it to commit, so `seq`
/// order is commit order and the board's change feed
/// (`board::changes`) never skips a row committed late.
async fn keep_node_state(
    db: &Db,
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    sid: i64,
    boot_id: i64,
    ev: &NewEvent,
    at: &str,
) -> Result<(), sqlx::Error> {
    let mut read = db.sql();
    read.push(&format!(
        "SELECT {NODE_STATE_COLUMNS} FROM node_states WHERE system_id = "
    ))
    .bind(Val::Int(Some(sid)));
    if db.engine() != Engine::Sqlite {
        read.push(" FOR UPDATE");
    }
    let prev = match read.query().fetch_optional(&mut **tx).await? {
        Some(r) => node_state_of(&r)?,
        None => None,
    };
    let Some(next) = next_state(prev.as_ref(), boot_id, ev.phase, at, &ev.detail) else {
        return Ok(());
    };
    sqlx::query("UPDATE board_seq SET seq = seq + 1 WHERE id = 1")
        .execute(&mut **tx)
        .await?;
    let seq = int(
        &sqlx::query("SELECT seq FROM board_seq WHERE id = 1")
            .fetch_one(&mut **tx)
            .await?,
        "seq",
    )?;
    let text = |s: &str| Val::Text(Some(s.to_owned()));
    let up = Sql::upsert(
        db.engine(),
        "node_states",
        ("system_id", Val::Int(Some(sid))),
        vec![
            ("seq", Val::Int(Some(seq))),
            ("boot_id", Val::Int(Some(next.boot_id))),
            ("state", text(next.state.as_str())),
            ("phase", text(next.phase.as_str())),
            ("percent", Val::Int(next.percent.map(i64::from))),
            ("boot_started", text(&next.boot_started)),
            ("state_since", text(&next.state_since)),
            ("last_at", text(&next.last_at)),
            ("detail", text(&next.detail)),
            ("last_error", text(&next.last_error)),
        ],
    );
    up.query().execute(&mut **tx).await?;
    Ok(())
}

/// The time before which boot events are removed at `now`, keeping
/// `keep_days` days.
pub fn retention_cutoff(now: jiff::Timestamp, keep_days: u32) -> String {
    let keep = jiff::SignedDuration::from_hours(i64::from(keep_days) * 24);
    format_ts(now.checked_sub(keep).unwrap_or(jiff::Timestamp::MIN))
}

/// Removes the boot events older than `keep_days` days at `now`; how many.
/// `serve` runs it at start and hourly.
pub async fn prune(db: &Db, now: jiff::Timestamp, keep_days: u32) -> Result<u64, BootError> {
    let mut q = db.sql();
    q.push("DELETE FROM boot_events WHERE at < ")
        .bind(Val::Text(Some(retention_cutoff(now, keep_days))));
    Ok(q.query().execute(db.pool()).await?.rows_affected())
}

/// How many boot events are stored (for the retention's tests and log).
pub async fn count(db: &Db) -> Result<i64, BootError> {
    let r = sqlx::query("SELECT COUNT(*) AS n FROM boot_events")
        .fetch_one(db.pool())
        .await?;
    Ok(int(&r, "n")?)
}

/// A network a job server serves: its id, subnet and prefix.
pub type Served = (i64, (Ipv4Addr, u8));

/// A lease a job server reported for a MAC, for attestation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The leased (or, proxyDHCP, the client's) address, if reported.
    pub ip: Option<IpAddr>,
    /// A proxyDHCP exchange rather than a lease.
    pub proxy: bool,
    /// The reporting job server's networks ([`jobserver_networks`]).
    pub networks: Vec<Served>,
}

/// The networks of job servers, by job server id, for a `LEFT JOIN`: those
/// of the addresses each registered, and its row's.
const JOBSERVER_NETWORKS: &str = "(SELECT id AS jobserver_id, network_id FROM jobservers WHERE network_id IS NOT NULL UNION SELECT jobserver_id, network_id FROM jobserver_addresses WHERE network_id IS NOT NULL)";

/// Reads a network's subnet and prefix from `subnet` and `netmask` columns.
fn served(r: &AnyRow) -> Result<Option<Served>, sqlx::Error> {
    let subnet = text(r, "subnet").and_then(|s| s.parse().ok());
    let prefix = opt_int(r, "netmask")?.and_then(|p| u8::try_from(p).ok());
    Ok(opt_int(r, "network_id")?.zip(subnet.zip(prefix)))
}

/// The leases job servers reported for `mac` within [`ATTEST_WINDOW`],
/// newest first (at most 20), each with its job server's networks.
pub async fn recent_leases(db: &Db, mac: &str) -> Result<Vec<Lease>, BootError> {
    let mut q = db.sql();
    q.push("SELECT e.id, e.ip, e.phase, x.network_id, n.subnet, n.netmask FROM (SELECT id, ip, phase, jobserver_id FROM boot_events WHERE jobserver_id IS NOT NULL AND mac = ")
        .bind(Val::Text(Some(mac.to_owned())))
        .push(" AND phase IN (")
        .bind(Val::Text(Some(BootPhase::DhcpAcked.as_str().into())))
        .push(", ")
        .bind(Val::Text(Some(BootPhase::ProxyAnswered.as_str().into())))
        .push(") AND at >= ")
        .bind(Val::Text(Some(since(ATTEST_WINDOW))))
        .push(" ORDER BY id DESC LIMIT 20) e LEFT JOIN ")
        .push(JOBSERVER_NETWORKS)
        .push(" x ON x.jobserver_id = e.jobserver_id LEFT JOIN networks n ON n.id = x.network_id ORDER BY e.id DESC, x.network_id");
    let mut out: Vec<(i64, Lease)> = Vec::new();
    for r in db.fetch_all(&q).await? {
        let id = int(&r, "id")?;
        if out.last().is_none_or(|(last, _)| *last != id) {
            out.push((
                id,
                Lease {
                    ip: text(&r, "ip").and_then(|s| s.parse().ok()),
                    proxy: text(&r, "phase").as_deref() == Some(BootPhase::ProxyAnswered.as_str()),
                    networks: Vec::new(),
                },
            ));
        }
        if let (Some((_, lease)), Some(net)) = (out.last_mut(), served(&r)?) {
            lease.networks.push(net);
        }
    }
    Ok(out.into_iter().map(|(_, l)| l).collect())
}

/// Whether `ip` lies inside the IPv4 network `net/prefix` (an IPv6 address
/// never does).
pub fn in_subnet(ip: IpAddr, (net, prefix): (Ipv4Addr, u8)) -> bool {
    let IpAddr::V4(ip) = ip else { return false };
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

/// Where the inventory places a node, for attestation ([`attests`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The MAC is in no inventory: any job server's lease attests (the node
    /// then gets only the discovery script).
    Unknown,
    /// The network its switch port, else its NIC, names.
    Network(i64),
    /// No network named, but the NIC has a reserved address: the reporting
    /// job server's network must contain it.
    Reserved(Ipv4Addr),
    /// Neither: no job server can vouch for it ([`Attestation::Unplaced`]).
    Unplaced,
}

/// What the lease reports say about an `/ipxe/` request ([`attests`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attestation {
    /// A job server of the node's network leased the source to the MAC.
    Attested,
    /// No such report (yet).
    Unattested,
    /// A job server leased the source to the MAC, but the node names no
    /// network and no reserved address to check it against.
    Unplaced,
}

/// The retry reason for [`Attestation::Unplaced`].
pub const UNPLACED: &str = "this node's NIC names no network (and no switch port or reserved address does): set the NIC's network so the control service knows which job servers may vouch for it";

/// Whether `leases` attest a request from `source`, for a node placed at
/// `node`. A lease counts on a network of its job server that holds the
/// leased address, when that address is the request's source (or, in
/// proxyDHCP mode, the report names no address and the network holds the
/// source). Then the node's placement must match that network: the same
/// network; for a node whose NIC names none, one holding its reserved
/// address too; a node with neither is [`Attestation::Unplaced`]. An
/// unknown MAC is attested by any job server's lease.
pub fn attests(leases: &[Lease], source: IpAddr, node: Placement) -> Attestation {
    let vouched = |l: &Lease, net: &Served| vouches(l, net, source);
    let placed = |&(network, subnet): &Served| match node {
        Placement::Unknown | Placement::Unplaced => true,
        Placement::Network(n) => network == n,
        Placement::Reserved(ip) => in_subnet(IpAddr::V4(ip), subnet),
    };
    let found = leases
        .iter()
        .any(|l| l.networks.iter().any(|net| vouched(l, net) && placed(net)));
    match (found, node) {
        (false, _) => Attestation::Unattested,
        (true, Placement::Unplaced) => Attestation::Unplaced,
        (true, _) => Attestation::Attested,
    }
}

/// The network whose job server's lease attests a request from `source`
/// (the first, newest lease first), for an unknown MAC: where its discovery
/// boot is served ([`crate::netboot::discovery`]). Pure.
pub fn lease_network(leases: &[Lease], source: IpAddr) -> Option<i64> {
    leases.iter().find_map(|l| {
        l.networks
            .iter()
            .find(|net| vouches(l, net, source))
            .map(|&(network, _)| network)
    })
}

/// Whether lease `l`, on its job server's network `net`, vouches for a
/// request from `source` (see [`attests`]).
fn vouches(l: &Lease, &(_, subnet): &Served, source: IpAddr) -> bool {
    match l.ip {
        Some(ip) if !ip.is_unspecified() => ip == source && in_subnet(ip, subnet),
        _ => l.proxy && in_subnet(source, subnet),
    }
}

/// Whether a job server's lease report may be stored as one: a
/// `dhcp_acked` or `proxy_answered` report's address must lie inside one of
/// the reporting job server's networks (`subnets`; [`jobserver_networks`]),
/// so a job server can vouch only for nodes it can actually lease to. A
/// proxyDHCP report may name no address (or `0.0.0.0`): it then attests
/// only sources inside those networks. Other phases are no lease reports
/// and pass. Pure.
pub fn lease_report_allowed(
    jobserver: &str,
    phase: BootPhase,
    ip: Option<IpAddr>,
    subnets: &[(Ipv4Addr, u8)],
) -> Result<(), LeaseRefused> {
    if !matches!(phase, BootPhase::DhcpAcked | BootPhase::ProxyAnswered) {
        return Ok(());
    }
    if subnets.is_empty() {
        return Err(LeaseRefused::NoNetwork {
            jobserver: jobserver.to_owned(),
        });
    }
    match ip {
        Some(ip) if !ip.is_unspecified() && !subnets.iter().any(|s| in_subnet(ip, *s)) => {
            Err(LeaseRefused::Outside {
                jobserver: jobserver.to_owned(),
                ip,
                subnet: subnets
                    .iter()
                    .map(|(net, prefix)| format!("{net}/{prefix}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
        }
        None if phase == BootPhase::DhcpAcked => Err(LeaseRefused::NoAddress),
        _ => Ok(()),
    }
}

/// Why a job server's lease report is refused ([`lease_report_allowed`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseRefused {
    /// The job server has no network with a subnet.
    #[error(
        "job server {jobserver} serves no network with a subnet: register an address inside one (or set its row's network), since a lease report is accepted only for an address inside its networks"
    )]
    NoNetwork {
        /// The job server.
        jobserver: String,
    },
    /// The address lies outside the job server's networks.
    #[error(
        "{ip} is outside job server {jobserver}'s networks ({subnet}): a lease report is accepted only for an address inside one of them"
    )]
    Outside {
        /// The job server.
        jobserver: String,
        /// The address reported.
        ip: IpAddr,
        /// Its networks, as `subnet/prefix`, comma-separated.
        subnet: String,
    },
    /// A `dhcp_acked` report without the leased address.
    #[error("a dhcp_acked report names the leased address (ip)")]
    NoAddress,
}

/// The id and networks of the job server named `name`: those of the
/// addresses it registered, and its row's network. `None` if no job server
/// has that name; no networks when none of them is set.
pub async fn jobserver_networks(
    db: &Db,
    name: &str,
) -> Result<Option<(i64, Vec<Served>)>, BootError> {
    let mut q = db.sql();
    q.push("SELECT j.id, x.network_id, n.subnet, n.netmask FROM jobservers j LEFT JOIN ")
        .push(JOBSERVER_NETWORKS)
        .push(" x ON x.jobserver_id = j.id LEFT JOIN networks n ON n.id = x.network_id WHERE j.name = ")
        .bind(Val::Text(Some(name.to_owned())))
        .push(" ORDER BY x.network_id");
    let rows = db.fetch_all(&q).await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let id = int(first, "id")?;
    let mut networks = Vec::new();
    for r in &rows {
        networks.extend(served(r)?);
    }
    Ok(Some((id, networks)))
}

/// The id of the newest boot event (0 without any).
pub async fn newest_event(db: &Db) -> Result<i64, BootError> {
    let mut q = db.sql();
    q.push("SELECT COALESCE(MAX(id), 0) AS id FROM boot_events");
    match db.fetch_optional(&q).await? {
        Some(r) => Ok(int(&r, "id")?),
        None => Ok(0),
    }
}

/// The MACs of lease reports stored after event `after`, with the newest
/// id seen (`after` when there are none): what a periodic recheck reads to
/// wake `/ipxe/` requests waiting on reports other replicas stored.
pub async fn lease_reports_since(db: &Db, after: i64) -> Result<(i64, Vec<String>), BootError> {
    let mut q = db.sql();
    q.push("SELECT id, mac, phase FROM boot_events WHERE id > ")
        .bind(Val::Int(Some(after)))
        .push(" ORDER BY id LIMIT 10000");
    let mut last = after;
    let mut macs = Vec::new();
    for r in db.fetch_all(&q).await? {
        last = last.max(int(&r, "id")?);
        let lease = text(&r, "phase").and_then(|p| phase_of(&p));
        if matches!(lease, Some(BootPhase::DhcpAcked | BootPhase::ProxyAnswered))
            && let Some(m) = text(&r, "mac")
        {
            macs.push(m);
        }
    }
    Ok((last, macs))
}

/// The first row `q` returns, read by `read`; `None` without one.
async fn one_row<T>(
    db: &Db,
    q: Sql,
    read: impl FnOnce(&AnyRow) -> Result<T, sqlx::Error>,
) -> Result<Option<T>, BootError> {
    let row = q.query().fetch_optional(db.pool()).await?;
    Ok(row.as_ref().map(read).transpose()?)
}

/// A system's id and host name from its host name or id.
pub async fn system_by_key(db: &Db, key: &str) -> Result<Option<(i64, String)>, BootError> {
    let mut q = db.sql();
    q.push("SELECT id, hostname FROM systems WHERE hostname = ")
        .bind(Val::Text(Some(key.to_ascii_lowercase())));
    if let Ok(id) = key.parse::<i64>() {
        q.push(" OR id = ").bind(Val::Int(Some(id)));
    }
    one_row(db, q, |r| {
        Ok((int(r, "id")?, text(r, "hostname").unwrap_or_default()))
    })
    .await
}

/// The system owning `mac`, if any.
pub async fn system_by_mac(db: &Db, mac: &str) -> Result<Option<i64>, BootError> {
    let mut q = db.sql();
    q.push("SELECT system_id FROM network_interfaces WHERE mac = ")
        .bind(Val::Text(Some(mac.to_owned())));
    Ok(one_row(db, q, |r| opt_int(r, "system_id")).await?.flatten())
}

/// The MAC and system the latest recent lease of `ip` went to.
pub async fn by_leased_ip(db: &Db, ip: IpAddr) -> Result<Option<(Option<i64>, String)>, BootError> {
    let mut q = db.sql();
    q.push("SELECT system_id, mac FROM boot_events WHERE ip = ")
        .bind(Val::Text(Some(ip.to_string())))
        .push(" AND phase = ")
        .bind(Val::Text(Some(BootPhase::DhcpAcked.as_str().into())))
        .push(" AND mac IS NOT NULL AND at >= ")
        .bind(Val::Text(Some(since(BOOT_GAP))))
        .push(" ORDER BY id DESC LIMIT 1");
    one_row(db, q, |r| {
        Ok((opt_int(r, "system_id")?, text(r, "mac").unwrap_or_default()))
    })
    .await
}

/// The id of the job server named `name`, if it is registered.
pub async fn jobserver_id(db: &Db, name: &str) -> Result<Option<i64>, BootError> {
    let mut q = db.sql();
    q.push("SELECT id FROM jobservers WHERE name = ")
        .bind(Val::Text(Some(name.to_owned())));
    one_row(db, q, |r| int(r, "id")).await
}

/// The phases a job server may report.
pub fn jobserver_phase(p: BootPhase) -> bool {
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
pub fn node_phase(p: BootPhase) -> bool {
    matches!(
        p,
        BootPhase::AgentDhcp
            | BootPhase::Enrolled
            | BootPhase::ImageStarted
            | BootPhase::Progress
            | BootPhase::Verified
            | BootPhase::ChecksumMismatch
            | BootPhase::SwitchRoot
            | BootPhase::Scripts
            | BootPhase::Failed
            | BootPhase::Ready
    )
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

/// Whose events [`events`] reads.
#[derive(Debug, Clone, Copy)]
pub enum Timeline<'a> {
    /// A known system, by id.
    System(i64),
    /// A MAC the inventory does not know.
    Mac(&'a str),
    /// The latest event of every node, known or not.
    Latest,
}

/// The events of `timeline`, oldest first: the last boot's, or with `all`
/// every one (at most [`MAX_EVENTS`]).
pub async fn events(
    db: &Db,
    timeline: Timeline<'_>,
    all: bool,
) -> Result<Vec<BootEvent>, BootError> {
    let mut sql = db.sql();
    sql.push(EVENT_COLUMNS);
    match timeline {
        Timeline::System(id) => {
            sql.push("e.system_id = ").bind(Val::Int(Some(id)));
            if !all {
                sql.push(
                    " AND e.boot_id = (SELECT MAX(boot_id) FROM boot_events WHERE system_id = ",
                )
                .bind(Val::Int(Some(id)))
                .push(")");
            }
        }
        Timeline::Mac(m) => {
            sql.push("e.system_id IS NULL AND e.mac = ")
                .bind(Val::Text(Some(m.to_owned())));
            if !all {
                sql.push(" AND e.boot_id = (SELECT MAX(boot_id) FROM boot_events WHERE system_id IS NULL AND mac = ")
                    .bind(Val::Text(Some(m.to_owned())))
                    .push(")");
            }
        }
        Timeline::Latest => {
            sql.push("e.id IN (SELECT MAX(id) FROM boot_events WHERE system_id IS NOT NULL GROUP BY system_id) OR e.id IN (SELECT MAX(id) FROM boot_events WHERE system_id IS NULL GROUP BY mac)");
        }
    }
    sql.push(&format!(" ORDER BY e.id LIMIT {MAX_EVENTS}"));
    let rows = sql.query().fetch_all(db.pool()).await?;
    Ok(rows.iter().map(event_of).collect::<Result<Vec<_>, _>>()?)
}

/// The events of system `id`'s latest `boots` boots, oldest first (the
/// newest [`MAX_EVENTS`] of them), in one statement (counted, see
/// [`Db::statements`]).
pub async fn latest_boots(db: &Db, id: i64, boots: u32) -> Result<Vec<BootEvent>, BootError> {
    let mut sql = db.sql();
    sql.push(EVENT_COLUMNS)
        .push("e.system_id = ")
        .bind(Val::Int(Some(id)))
        .push(" AND e.boot_id >= (SELECT COALESCE(MIN(b.boot_id), 0) FROM (SELECT DISTINCT boot_id FROM boot_events WHERE system_id = ")
        .bind(Val::Int(Some(id)))
        .push(&format!(
            " ORDER BY boot_id DESC LIMIT {}) b) ORDER BY e.id DESC LIMIT {MAX_EVENTS}",
            boots.max(1)
        ));
    let mut out = db
        .fetch_all(&sql)
        .await?
        .iter()
        .map(event_of)
        .collect::<Result<Vec<_>, _>>()?;
    out.reverse();
    Ok(out)
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
    fn a_nodes_state_follows_its_boot() {
        let step = |prev: Option<&NodeState>, boot, phase, at: &str, detail: &str| {
            next_state(prev, boot, phase, at, detail).expect("a change")
        };
        let s = step(None, 7, BootPhase::DhcpOffered, "T01", "");
        assert_eq!(
            (s.state, s.boot_started.as_str(), s.state_since.as_str()),
            (BoardState::Dhcp, "T01", "T01")
        );
        // Same state: it keeps when it entered it.
        let s = step(Some(&s), 7, BootPhase::DhcpAcked, "T02", "");
        assert_eq!((s.state_since.as_str(), s.last_at.as_str()), ("T01", "T02"));
        let s = step(Some(&s), 7, BootPhase::ScriptServed, "T03", "");
        assert_eq!((s.state, s.state_since.as_str()), (BoardState::Ipxe, "T03"));
        let s = step(Some(&s), 7, BootPhase::ImageStarted, "T04", "");
        assert_eq!(s.percent, Some(0));
        let s = step(
            Some(&s),
            7,
            BootPhase::Progress,
            "T05",
            "80 of 800 MiB (10%)",
        );
        assert_eq!((s.percent, s.state_since.as_str()), (Some(10), "T04"));
        // A detail without a percentage keeps the last one.
        let s = step(Some(&s), 7, BootPhase::Progress, "T06", "halfway");
        assert_eq!(s.percent, Some(10));
        let s = step(
            Some(&s),
            7,
            BootPhase::ChecksumMismatch,
            "T07",
            "js1: sha256 differs",
        );
        assert_eq!(
            (s.state, s.percent, s.last_error.as_str()),
            (BoardState::Failed, None, "js1: sha256 differs")
        );
        // The agent goes on with the next job server: the same boot, the
        // error kept.
        let s = step(Some(&s), 7, BootPhase::ImageStarted, "T08", "streaming js2");
        assert_eq!(
            (s.state, s.boot_started.as_str(), s.last_error.as_str()),
            (BoardState::Image, "T01", "js1: sha256 differs")
        );
        let s = step(Some(&s), 7, BootPhase::Verified, "T09", "");
        assert_eq!(s.percent, Some(100));
        let s = step(Some(&s), 7, BootPhase::Scripts, "T10", "a, b");
        assert_eq!((s.state, s.percent), (BoardState::Scripts, None));
        let ready = step(Some(&s), 7, BootPhase::Ready, "T11", "");
        assert!(ready.state.is_final());
        // A running node renewing its lease is no new boot.
        assert_eq!(
            next_state(Some(&ready), 9, BootPhase::DhcpAcked, "T12", ""),
            None
        );
        // A reboot is: everything starts over.
        let s = step(Some(&ready), 9, BootPhase::DhcpOffered, "T13", "");
        assert_eq!(
            (
                s.boot_id,
                s.state,
                s.boot_started.as_str(),
                s.last_error.as_str()
            ),
            (9, BoardState::Dhcp, "T13", "")
        );
    }

    #[test]
    fn progress_details_give_their_percentage() {
        assert_eq!(progress_percent("120 of 800 MiB (15%)"), Some(15));
        assert_eq!(progress_percent("0 of 0 MiB (100%)"), Some(100));
        assert_eq!(progress_percent("x (250%)"), Some(100));
        assert_eq!(progress_percent("120 of 800 MiB"), None);
        assert_eq!(progress_percent("(abc%)"), None);
        assert_eq!(progress_percent("(-5%)"), None);
    }

    #[test]
    fn the_retention_cutoff_is_keep_days_before_now() {
        let now: jiff::Timestamp = "2026-03-31T12:00:00Z".parse().unwrap();
        assert_eq!(retention_cutoff(now, 30), "2026-03-01T12:00:00Z");
        assert_eq!(retention_cutoff(now, 1), "2026-03-30T12:00:00Z");
        // Stored times compare as text: an event a second too old goes.
        assert!("2026-03-01T11:59:59Z" < retention_cutoff(now, 30).as_str());
    }

    #[test]
    fn only_a_lease_of_the_source_by_a_job_server_of_the_nodes_network_attests() {
        use Attestation::{Attested, Unattested, Unplaced};
        let src: IpAddr = "10.0.0.50".parse().unwrap();
        let lease = |ip: &str, net: Option<i64>| Lease {
            ip: Some(ip.parse().unwrap()),
            proxy: false,
            networks: net
                .map(|n| vec![(n, ("10.0.0.0".parse().unwrap(), 24))])
                .unwrap_or_default(),
        };
        let on_1 = Placement::Network(1);
        assert_eq!(attests(&[lease("10.0.0.50", Some(1))], src, on_1), Attested);
        assert_eq!(
            attests(&[lease("10.0.0.51", Some(1))], src, on_1),
            Unattested
        );
        assert_eq!(
            attests(&[lease("10.0.0.50", Some(2))], src, on_1),
            Unattested
        );
        assert_eq!(
            attests(&[lease("10.0.0.50", None)], src, Placement::Unknown),
            Unattested
        );
        assert_eq!(
            attests(&[lease("10.0.0.50", Some(2))], src, Placement::Unknown),
            Attested
        );
        assert_eq!(attests(&[], src, Placement::Unknown), Unattested);
        // A lease outside the job server's own network (an old row) never counts.
        let far = "192.168.1.9".parse().unwrap();
        assert_eq!(
            attests(&[lease("192.168.1.9", Some(1))], far, on_1),
            Unattested
        );
        // A node whose NIC names no network: its reserved address decides,
        // and without one no job server can vouch for it.
        let reserved = |ip: &str| Placement::Reserved(ip.parse().unwrap());
        assert_eq!(
            attests(&[lease("10.0.0.50", Some(2))], src, reserved("10.0.0.7")),
            Attested
        );
        assert_eq!(
            attests(&[lease("10.0.0.50", Some(2))], src, reserved("10.9.0.7")),
            Unattested
        );
        assert_eq!(
            attests(&[lease("10.0.0.50", Some(2))], src, Placement::Unplaced),
            Unplaced
        );
        assert_eq!(
            attests(&[lease("10.0.0.51", Some(2))], src, Placement::Unplaced),
            Unattested
        );
        let proxy = Lease {
            ip: None,
            proxy: true,
            ..lease("10.0.0.1", Some(1))
        };
        assert_eq!(attests(std::slice::from_ref(&proxy), src, on_1), Attested);
        assert_eq!(
            attests(&[proxy], "10.9.0.50".parse().unwrap(), on_1),
            Unattested
        );
    }

    #[test]
    fn a_job_server_serving_two_subnets_vouches_on_each_for_its_own_nodes() {
        use Attestation::{Attested, Unattested};
        let both = |ip: &str| Lease {
            ip: Some(ip.parse().unwrap()),
            proxy: false,
            networks: vec![
                (1, ("10.0.1.0".parse().unwrap(), 24)),
                (2, ("10.0.2.0".parse().unwrap(), 24)),
            ],
        };
        let at = |s: &str| -> IpAddr { s.parse().unwrap() };
        // A node on either network, leased inside it: attested.
        assert_eq!(
            attests(&[both("10.0.1.50")], at("10.0.1.50"), Placement::Network(1)),
            Attested
        );
        assert_eq!(
            attests(&[both("10.0.2.50")], at("10.0.2.50"), Placement::Network(2)),
            Attested
        );
        // Leased on network 2 to a node the inventory places on 1: the
        // network holding the lease must be the node's.
        assert_eq!(
            attests(&[both("10.0.2.50")], at("10.0.2.50"), Placement::Network(1)),
            Unattested
        );
        // Reserved addresses: the network holding the lease holds it too.
        let reserved = |ip: &str| Placement::Reserved(ip.parse().unwrap());
        assert_eq!(
            attests(&[both("10.0.2.50")], at("10.0.2.50"), reserved("10.0.2.7")),
            Attested
        );
        assert_eq!(
            attests(&[both("10.0.2.50")], at("10.0.2.50"), reserved("10.0.1.7")),
            Unattested
        );
        // Its reports are accepted inside either network, and only there.
        let subnets = [
            ("10.0.1.0".parse().unwrap(), 24),
            ("10.0.2.0".parse().unwrap(), 24),
        ];
        for ip in ["10.0.1.9", "10.0.2.9"] {
            assert_eq!(
                lease_report_allowed("js1", BootPhase::DhcpAcked, Some(at(ip)), &subnets),
                Ok(())
            );
        }
        let refused =
            lease_report_allowed("js1", BootPhase::DhcpAcked, Some(at("10.0.3.9")), &subnets)
                .unwrap_err();
        assert!(
            refused.to_string().contains("10.0.1.0/24, 10.0.2.0/24"),
            "{refused}"
        );
    }

    #[test]
    fn a_lease_report_lies_inside_its_job_servers_network() {
        let net: &[(Ipv4Addr, u8)] = &[("10.0.0.0".parse().unwrap(), 24)];
        let ip = |s: &str| Some(s.parse().unwrap());
        assert_eq!(
            lease_report_allowed("js1", BootPhase::DhcpAcked, ip("10.0.0.9"), net),
            Ok(())
        );
        assert!(matches!(
            lease_report_allowed("js1", BootPhase::DhcpAcked, ip("127.0.0.1"), net),
            Err(LeaseRefused::Outside { .. })
        ));
        assert!(matches!(
            lease_report_allowed("js1", BootPhase::ProxyAnswered, ip("10.1.0.9"), net),
            Err(LeaseRefused::Outside { .. })
        ));
        assert_eq!(
            lease_report_allowed("js1", BootPhase::ProxyAnswered, None, net),
            Ok(())
        );
        assert_eq!(
            lease_report_allowed("js1", BootPhase::DhcpAcked, None, net),
            Err(LeaseRefused::NoAddress)
        );
        assert!(matches!(
            lease_report_allowed("js1", BootPhase::DhcpAcked, ip("10.0.0.9"), &[]),
            Err(LeaseRefused::NoNetwork { .. })
        ));
        // Not a lease report: anywhere.
        assert_eq!(
            lease_report_allowed("js1", BootPhase::KernelFetched, ip("127.0.0.1"), &[]),
            Ok(())
        );
    }
}
