//! The boot board: every system as a cell showing where its boot stands,
//! so an admin can watch a whole rack boot. No HTTP here: the admin pages
//! render what this module reads and decides.
//!
//! - **The state** of each node is not computed here: `node_states` holds
//!   it, one row per system, written by [`boot::record`] in the
//!   transaction of every event ([`boot::next_state`] decides it), so a
//!   board of thousands of nodes never scans `boot_events`.
//! - **A snapshot** ([`snapshot`]) lists every system as a [`Cell`],
//!   grouped by its first group (layering order: priority, then slug), by
//!   the switch its NIC's port is on (the bootable NIC first), or by rack
//!   (ordered by unit). It takes the same few statements for one system or
//!   for thousands ([`Db::statements`] counts them; a test holds it to
//!   that).
//! - **The flags**: the slowest nodes ([`slowest`]: the longest-running
//!   boots among those not ended) and the stuck ones ([`is_stuck`]: no
//!   event for [`Rules::stuck_after`] while not ended,
//!   `MPROV_BOARD_STUCK_SECONDS`, [`DEFAULT_STUCK_SECONDS`] by default) are
//!   decided by pure functions given the time. They change with time
//!   alone, so a live view asks [`flags`] again on every update: one
//!   statement over the nodes still booting.
//! - **The change feed** ([`changes`]): every update of `node_states`
//!   takes the next `seq`, in commit order (see `boot::keep_node_state`),
//!   so the cells changed since a cursor are the rows with a higher `seq`.
//!   A reader too far behind (more than its bound) or ahead (a restored
//!   database) is told [`Feed::Behind`] and starts over from a snapshot.
//! - **A node's timeline** ([`timeline`]): its latest boots, each step
//!   with how long it took (until the next step), its errors (`failed`,
//!   `checksum_mismatch`) and its scripts' output (`script` details).

use std::cmp::Ordering;

use jiff::{SignedDuration, Timestamp};
use mprov_api::boot::{BoardState, BootEvent, BootPhase};
use sqlx::Row as _;
use sqlx::any::AnyRow;

use crate::boot::{self, BootError, NodeState};
use crate::db::{Db, Sql, Val, int, opt_int};

/// How long a node still booting may go without an event before the board
/// flags it stuck, unless `MPROV_BOARD_STUCK_SECONDS` says otherwise.
pub const DEFAULT_STUCK_SECONDS: u64 = crate::config::DEFAULT_BOARD_STUCK_SECONDS;
/// How many of the slowest nodes the board flags.
pub const SLOWEST: usize = 10;
/// The most changed cells one read of the feed returns; a reader further
/// behind takes a snapshot instead.
pub const FEED_LIMIT: usize = 2000;
/// How many of a node's boots its timeline shows.
pub const TIMELINE_BOOTS: u32 = 5;

/// Why the board could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BoardError {
    /// The database failed.
    #[error("boot board database")]
    Db(#[from] sqlx::Error),
    /// Reading the boot timeline failed.
    #[error(transparent)]
    Boot(#[from] BootError),
}

/// How the board groups its cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Grouping {
    /// By the system's first group, in layering order (priority, then
    /// slug); a system shows once.
    #[default]
    Group,
    /// By rack, each ordered by unit.
    Rack,
    /// By the switch of its NIC's port (the bootable NIC first), each
    /// ordered by port.
    Switch,
}

impl Grouping {
    /// Every grouping, in the order a page offers them.
    pub const ALL: [Grouping; 3] = [Grouping::Group, Grouping::Switch, Grouping::Rack];

    /// The name in URLs (`?by=`).
    pub fn as_str(self) -> &'static str {
        match self {
            Grouping::Group => "group",
            Grouping::Rack => "rack",
            Grouping::Switch => "switch",
        }
    }

    /// The grouping of a URL name.
    pub fn from_name(name: &str) -> Option<Grouping> {
        Grouping::ALL.into_iter().find(|g| g.as_str() == name)
    }
}

/// What the flags are decided by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// How long a node still booting may go without an event before it is
    /// stuck.
    pub stuck_after: SignedDuration,
    /// How many of the slowest nodes to flag.
    pub slowest: usize,
}

impl Rules {
    /// The rules with a stuck limit of `stuck_seconds` (the configured
    /// `MPROV_BOARD_STUCK_SECONDS`) and [`SLOWEST`] slowest nodes.
    pub fn new(stuck_seconds: u64) -> Rules {
        Rules {
            stuck_after: SignedDuration::from_secs(
                i64::try_from(stuck_seconds).unwrap_or(i64::MAX),
            ),
            slowest: SLOWEST,
        }
    }
}

impl std::default::Default for Rules {
    fn default() -> Rules {
        Rules::new(DEFAULT_STUCK_SECONDS)
    }
}

/// One system on the board.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    /// The system's id.
    pub id: i64,
    /// Its host name.
    pub hostname: String,
    /// The key of the group it shows in: a group's slug, a switch's host
    /// name or a rack; empty when it has none.
    pub group: String,
    /// Its rack unit, if set.
    pub rack_unit: Option<i64>,
    /// Its switch port's name, if it has one.
    pub port: Option<String>,
    /// Where its boot stands; `None` for a node never seen booting.
    pub node: Option<NodeState>,
    /// The `seq` of its latest update (0 for none).
    pub seq: i64,
}

impl Cell {
    /// Its state, if it ever reported.
    pub fn state(&self) -> Option<BoardState> {
        self.node.as_ref().map(|n| n.state)
    }

    /// The letter the cell shows: its state's, `-` for a node never seen.
    pub fn letter(&self) -> char {
        self.state().map_or('-', BoardState::letter)
    }

    /// How much of its image has streamed, while it streams.
    pub fn percent(&self) -> Option<u8> {
        let n = self.node.as_ref()?;
        if n.state == BoardState::Image {
            n.percent
        } else {
            None
        }
    }

    /// How long it has been in its current state at `now`.
    pub fn in_state(&self, now: Timestamp) -> Option<SignedDuration> {
        since(&self.node.as_ref()?.state_since, now)
    }

    /// How long its current boot has run at `now`, while not ended.
    pub fn in_boot(&self, now: Timestamp) -> Option<SignedDuration> {
        let n = self.node.as_ref().filter(|n| !n.state.is_final())?;
        since(&n.boot_started, now)
    }
}

/// The time from a stored time stamp to `now` (never negative).
fn since(stored: &str, now: Timestamp) -> Option<SignedDuration> {
    let at: Timestamp = stored.parse().ok()?;
    Some(now.duration_since(at).max(SignedDuration::ZERO))
}

/// A group of cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Its key (see [`Cell::group`]); empty for the systems without one.
    pub key: String,
    /// Its cells, in order.
    pub cells: Vec<Cell>,
}

/// Which nodes the board flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// The slowest nodes, slowest first.
    pub slowest: Vec<i64>,
    /// The stuck nodes, by id.
    pub stuck: Vec<i64>,
}

/// The whole board at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// How it is grouped.
    pub grouping: Grouping,
    /// The groups, by key (the systems without one last).
    pub groups: Vec<Group>,
    /// The flagged nodes.
    pub flags: Flags,
    /// The change feed's cursor: [`changes`] after it gives what changed
    /// since this snapshot.
    pub seq: i64,
    /// The inventory revision it was read at.
    pub revision: i64,
    /// The time its flags and durations were decided at.
    pub now: Timestamp,
}

impl Snapshot {
    /// Every cell, group by group.
    pub fn cells(&self) -> impl Iterator<Item = &Cell> {
        self.groups.iter().flat_map(|g| g.cells.iter())
    }
}

/// Whether `cell` is stuck at `now`: still booting, and no event for
/// `after` or longer. Pure.
pub fn is_stuck(cell: &Cell, now: Timestamp, after: SignedDuration) -> bool {
    let Some(n) = cell.node.as_ref().filter(|n| !n.state.is_final()) else {
        return false;
    };
    since(&n.last_at, now).is_some_and(|quiet| quiet >= after)
}

/// The ids of the `n` nodes whose boots have run longest at `now`, among
/// those not ended, slowest first (ties by id). Pure.
pub fn slowest<'a>(
    cells: impl IntoIterator<Item = &'a Cell>,
    now: Timestamp,
    n: usize,
) -> Vec<i64> {
    let mut running: Vec<(SignedDuration, i64)> = cells
        .into_iter()
        .filter_map(|c| Some((c.in_boot(now)?, c.id)))
        .collect();
    running.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    running.into_iter().take(n).map(|(_, id)| id).collect()
}

/// The flags of `cells` at `now` under `rules`. Pure.
pub fn flags_of<'a>(
    cells: impl IntoIterator<Item = &'a Cell> + Clone,
    now: Timestamp,
    rules: Rules,
) -> Flags {
    let mut stuck: Vec<i64> = cells
        .clone()
        .into_iter()
        .filter(|c| is_stuck(c, now, rules.stuck_after))
        .map(|c| c.id)
        .collect();
    stuck.sort_unstable();
    Flags {
        slowest: slowest(cells, now, rules.slowest),
        stuck,
    }
}

/// Orders two names the way people count: digit runs by their value, so
/// `c2` comes before `c10`.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        match (a.is_empty(), b.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (da, db) = (digits(a), digits(b));
        let ord = if da > 0 && db > 0 {
            let (na, nb) = (
                a[..da].trim_start_matches('0'),
                b[..db].trim_start_matches('0'),
            );
            na.len()
                .cmp(&nb.len())
                .then_with(|| na.cmp(nb))
                .then(da.cmp(&db))
        } else {
            let ca = a.chars().next().unwrap_or_default();
            let cb = b.chars().next().unwrap_or_default();
            ca.cmp(&cb)
        };
        if ord != Ordering::Equal {
            return ord;
        }
        let step = |s: &str, d: usize| {
            if d > 0 {
                d
            } else {
                s.chars().next().map_or(0, char::len_utf8)
            }
        };
        let (sa, sb) = (step(a, da), step(b, db));
        a = &a[sa..];
        b = &b[sb..];
    }
}

/// The order of cells within a group under `grouping`: by rack unit, by
/// switch port, or by host name; host name breaks ties.
fn cell_order(grouping: Grouping, x: &Cell, y: &Cell) -> Ordering {
    let first = match grouping {
        // Cells without a unit after those with one.
        Grouping::Rack => match (x.rack_unit, y.rack_unit) {
            (Some(a), Some(b)) => a.cmp(&b),
            (a, b) => b.is_some().cmp(&a.is_some()),
        },
        Grouping::Switch => natural_cmp(
            x.port.as_deref().unwrap_or_default(),
            y.port.as_deref().unwrap_or_default(),
        ),
        Grouping::Group => Ordering::Equal,
    };
    first
        .then_with(|| natural_cmp(&x.hostname, &y.hostname))
        .then(x.id.cmp(&y.id))
}

/// Puts `cells` into their groups, in order: groups by key (the keyless
/// last), cells by `cell_order`. Pure.
pub fn arrange(grouping: Grouping, mut cells: Vec<Cell>) -> Vec<Group> {
    cells.sort_by(|x, y| {
        (x.group.is_empty().cmp(&y.group.is_empty()))
            .then_with(|| natural_cmp(&x.group, &y.group))
            .then_with(|| cell_order(grouping, x, y))
    });
    let mut groups: Vec<Group> = Vec::new();
    for cell in cells {
        match groups.last_mut() {
            Some(g) if g.key == cell.group => g.cells.push(cell),
            _ => groups.push(Group {
                key: cell.group.clone(),
                cells: vec![cell],
            }),
        }
    }
    groups
}

/// The statement reading cells under `grouping`: every system with its
/// node state, its group key (`grp`) and its switch port (`port`).
fn cells_sql(db: &Db, grouping: Grouping) -> Sql {
    let (grp, port, joins) = match grouping {
        Grouping::Group => (
            "(SELECT g.slug FROM group_members m JOIN system_groups g ON g.id = m.group_id WHERE m.system_id = s.id ORDER BY g.priority, g.slug LIMIT 1)",
            "NULL",
            "",
        ),
        Grouping::Rack => ("s.rack", "NULL", ""),
        Grouping::Switch => (
            "w.hostname",
            "p.name",
            " LEFT JOIN network_interfaces n ON n.id = (SELECT n2.id FROM network_interfaces n2 WHERE n2.system_id = s.id AND n2.switch_port_id IS NOT NULL ORDER BY n2.bootable DESC, n2.id LIMIT 1) LEFT JOIN switch_ports p ON p.id = n.switch_port_id LEFT JOIN switches w ON w.id = p.switch_id",
        ),
    };
    let mut sql = db.sql();
    sql.push(&format!(
        "SELECT s.id, s.hostname, s.rack_unit, {grp} AS grp, {port} AS port, ns.seq, ns.boot_id, ns.state, ns.phase, ns.percent, ns.boot_started, ns.state_since, ns.last_at, ns.detail, ns.last_error FROM systems s LEFT JOIN node_states ns ON ns.system_id = s.id{joins}"
    ));
    sql
}

fn text(row: &AnyRow, col: &str) -> Option<String> {
    row.try_get::<Option<String>, _>(col).ok().flatten()
}

fn cell_of(r: &AnyRow) -> Result<Cell, sqlx::Error> {
    Ok(Cell {
        id: int(r, "id")?,
        hostname: text(r, "hostname").unwrap_or_default(),
        group: text(r, "grp").unwrap_or_default(),
        rack_unit: opt_int(r, "rack_unit")?,
        port: text(r, "port"),
        node: boot::node_state_of(r)?,
        seq: opt_int(r, "seq")?.unwrap_or(0),
    })
}

/// The feed's cursor now: the `seq` of the latest update.
async fn current_seq(db: &Db) -> Result<i64, sqlx::Error> {
    let mut q = db.sql();
    q.push("SELECT seq FROM board_seq WHERE id = 1");
    match db.fetch_optional(&q).await? {
        Some(r) => int(&r, "seq"),
        None => Ok(0),
    }
}

/// Every system as a cell under `grouping`, with the flags at `now`: three
/// statements however many systems there are (the feed's cursor first, so
/// a change committed while the cells are read is sent again, never lost).
pub async fn snapshot(
    db: &Db,
    grouping: Grouping,
    now: Timestamp,
    rules: Rules,
) -> Result<Snapshot, BoardError> {
    let seq = current_seq(db).await?;
    let mut rev = db.sql();
    rev.push("SELECT revision FROM inventory_revision WHERE id = 1");
    let revision = match db.fetch_optional(&rev).await? {
        Some(r) => int(&r, "revision")?,
        None => 0,
    };
    let cells = db
        .fetch_all(&cells_sql(db, grouping))
        .await?
        .iter()
        .map(cell_of)
        .collect::<Result<Vec<_>, _>>()?;
    let flags = flags_of(&cells, now, rules);
    Ok(Snapshot {
        grouping,
        groups: arrange(grouping, cells),
        flags,
        seq,
        revision,
        now,
    })
}

/// The flags at `now`, read afresh: one statement over the nodes still
/// booting.
pub async fn flags(db: &Db, now: Timestamp, rules: Rules) -> Result<Flags, BoardError> {
    let mut q = db.sql();
    q.push(&format!(
        "SELECT system_id AS id, '' AS hostname, seq, {} FROM node_states WHERE state NOT IN (",
        boot::NODE_STATE_COLUMNS
    ))
    .bind(Val::Text(Some(BoardState::Ready.as_str().into())))
    .push(", ")
    .bind(Val::Text(Some(BoardState::Failed.as_str().into())))
    .push(")");
    let cells = db
        .fetch_all(&q)
        .await?
        .iter()
        .map(|r| {
            Ok(Cell {
                id: int(r, "id")?,
                hostname: String::new(),
                group: String::new(),
                rack_unit: None,
                port: None,
                node: boot::node_state_of(r)?,
                seq: int(r, "seq")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(flags_of(&cells, now, rules))
}

/// What changed since a cursor ([`changes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Feed {
    /// The cells updated since, oldest update first, and the cursor to ask
    /// from next.
    Changes {
        /// The changed cells (each once, as it is now).
        cells: Vec<Cell>,
        /// The next cursor.
        seq: i64,
    },
    /// The cursor is more than the bound behind, or ahead of the feed (a
    /// restored database): take a new [`snapshot`].
    Behind,
}

/// The cells under `grouping` whose node state changed after cursor
/// `after`, at most `limit` of them (more: [`Feed::Behind`]). Two
/// statements.
pub async fn changes(
    db: &Db,
    grouping: Grouping,
    after: i64,
    limit: usize,
) -> Result<Feed, BoardError> {
    let current = current_seq(db).await?;
    if after > current {
        return Ok(Feed::Behind);
    }
    if after == current {
        return Ok(Feed::Changes {
            cells: Vec::new(),
            seq: current,
        });
    }
    let mut sql = cells_sql(db, grouping);
    sql.push(" WHERE ns.seq > ")
        .bind(Val::Int(Some(after)))
        .push(&format!(
            " ORDER BY ns.seq LIMIT {}",
            limit.saturating_add(1)
        ));
    let cells = db
        .fetch_all(&sql)
        .await?
        .iter()
        .map(cell_of)
        .collect::<Result<Vec<_>, _>>()?;
    if cells.len() > limit {
        return Ok(Feed::Behind);
    }
    let seq = cells.iter().map(|c| c.seq).fold(current, i64::max);
    Ok(Feed::Changes { cells, seq })
}

/// One step of a boot on a node's timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The event.
    pub event: BootEvent,
    /// How long until the next step; `None` for the last one.
    pub took: Option<SignedDuration>,
}

impl Step {
    /// The error it reports (`failed`, `checksum_mismatch`), if any.
    pub fn error(&self) -> Option<&str> {
        matches!(
            self.event.phase,
            BootPhase::Failed | BootPhase::ChecksumMismatch
        )
        .then_some(self.event.detail.as_str())
    }

    /// The script output it carries (a `script` event's detail), if any.
    pub fn output(&self) -> Option<&str> {
        (self.event.phase == BootPhase::Script).then_some(self.event.detail.as_str())
    }
}

/// One boot on a node's timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    /// The boot's id.
    pub boot_id: i64,
    /// Its steps, oldest first.
    pub steps: Vec<Step>,
}

impl Boot {
    /// Where it ended or stands: its last step's state.
    pub fn state(&self) -> Option<BoardState> {
        self.steps.last().map(|s| s.event.phase.board_state())
    }

    /// When it started (stored form).
    pub fn started(&self) -> Option<&str> {
        self.steps.first().map(|s| s.event.at.as_str())
    }

    /// How long from its first step to its last.
    pub fn took(&self) -> Option<SignedDuration> {
        let first: Timestamp = self.started()?.parse().ok()?;
        let last: Timestamp = self.steps.last()?.event.at.parse().ok()?;
        Some(last.duration_since(first))
    }

    /// Its errors, in order.
    pub fn errors(&self) -> impl Iterator<Item = &str> {
        self.steps.iter().filter_map(Step::error)
    }
}

/// Events (oldest first) cut into boots, newest boot first, each step
/// with its duration until the next step of its boot. Pure.
pub fn boots_of(events: Vec<BootEvent>) -> Vec<Boot> {
    let mut boots: Vec<Boot> = Vec::new();
    for event in events {
        match boots.last_mut() {
            Some(b) if b.boot_id == event.boot_id => {
                if let Some(last) = b.steps.last_mut() {
                    last.took = between(&last.event.at, &event.at);
                }
                b.steps.push(Step { event, took: None });
            }
            _ => boots.push(Boot {
                boot_id: event.boot_id,
                steps: vec![Step { event, took: None }],
            }),
        }
    }
    boots.reverse();
    boots
}

fn between(from: &str, to: &str) -> Option<SignedDuration> {
    let (from, to): (Timestamp, Timestamp) = (from.parse().ok()?, to.parse().ok()?);
    Some(to.duration_since(from).max(SignedDuration::ZERO))
}

/// System `id`'s latest `boots` boots, newest first: one statement.
pub async fn timeline(db: &Db, id: i64, boots: u32) -> Result<Vec<Boot>, BoardError> {
    Ok(boots_of(boot::latest_boots(db, id, boots).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn cell(id: i64, state: Option<(BoardState, &str, &str)>) -> Cell {
        Cell {
            id,
            hostname: format!("n{id}"),
            group: String::new(),
            rack_unit: None,
            port: None,
            node: state.map(|(state, started, last)| NodeState {
                boot_id: id,
                state,
                phase: BootPhase::Enrolled,
                percent: None,
                boot_started: started.into(),
                state_since: last.into(),
                last_at: last.into(),
                detail: String::new(),
                last_error: String::new(),
            }),
            seq: id,
        }
    }

    #[test]
    fn stuck_is_quiet_too_long_while_booting() {
        let now = ts("2026-01-01T10:00:00Z");
        let ten = SignedDuration::from_mins(10);
        let quiet = |state, last| cell(1, Some((state, "2026-01-01T09:00:00Z", last)));
        assert!(is_stuck(
            &quiet(BoardState::Kernel, "2026-01-01T09:50:00Z"),
            now,
            ten
        ));
        assert!(!is_stuck(
            &quiet(BoardState::Kernel, "2026-01-01T09:50:01Z"),
            now,
            ten
        ));
        // An ended boot is never stuck, nor a node never seen.
        assert!(!is_stuck(
            &quiet(BoardState::Ready, "2026-01-01T01:00:00Z"),
            now,
            ten
        ));
        assert!(!is_stuck(
            &quiet(BoardState::Failed, "2026-01-01T01:00:00Z"),
            now,
            ten
        ));
        assert!(!is_stuck(&cell(2, None), now, ten));
    }

    #[test]
    fn the_slowest_are_the_longest_boots_not_ended() {
        let now = ts("2026-01-01T10:00:00Z");
        let cells = [
            cell(
                1,
                Some((
                    BoardState::Image,
                    "2026-01-01T09:50:00Z",
                    "2026-01-01T09:59:00Z",
                )),
            ),
            cell(
                2,
                Some((
                    BoardState::Ready,
                    "2026-01-01T08:00:00Z",
                    "2026-01-01T08:10:00Z",
                )),
            ),
            cell(
                3,
                Some((
                    BoardState::Dhcp,
                    "2026-01-01T09:40:00Z",
                    "2026-01-01T09:41:00Z",
                )),
            ),
            cell(
                4,
                Some((
                    BoardState::Kernel,
                    "2026-01-01T09:55:00Z",
                    "2026-01-01T09:56:00Z",
                )),
            ),
            cell(
                5,
                Some((
                    BoardState::Kernel,
                    "2026-01-01T09:55:00Z",
                    "2026-01-01T09:57:00Z",
                )),
            ),
            cell(6, None),
        ];
        assert_eq!(slowest(&cells, now, 2), [3, 1]);
        assert_eq!(slowest(&cells, now, 10), [3, 1, 4, 5]);
        assert_eq!(slowest(&cells, now, 0), Vec::<i64>::new());
        let rules = Rules {
            stuck_after: SignedDuration::from_mins(10),
            slowest: 1,
        };
        assert_eq!(
            flags_of(&cells, now, rules),
            Flags {
                slowest: vec![3],
                stuck: vec![3]
            }
        );
    }

    #[test]
    fn cells_tell_their_state_by_letter_and_their_times() {
        let now = ts("2026-01-01T10:00:00Z");
        let mut c = cell(
            1,
            Some((
                BoardState::Image,
                "2026-01-01T09:50:00Z",
                "2026-01-01T09:58:00Z",
            )),
        );
        c.node.as_mut().unwrap().percent = Some(40);
        assert_eq!((c.letter(), c.percent()), ('M', Some(40)));
        assert_eq!(c.in_state(now), Some(SignedDuration::from_mins(2)));
        assert_eq!(c.in_boot(now), Some(SignedDuration::from_mins(10)));
        c.node.as_mut().unwrap().state = BoardState::Ready;
        assert_eq!((c.letter(), c.percent(), c.in_boot(now)), ('R', None, None));
        assert_eq!(cell(2, None).letter(), '-');
    }

    #[test]
    fn names_sort_as_people_count() {
        let mut names = ["c10", "c2", "c1", "b", "c02", "r1u10", "r1u9", ""];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(names, ["", "b", "c1", "c2", "c02", "c10", "r1u9", "r1u10"]);
        assert_eq!(natural_cmp("Eth1/10", "Eth1/9"), Ordering::Greater);
    }

    #[test]
    fn racks_order_by_unit_and_keyless_cells_come_last() {
        let place = |id, group: &str, unit| Cell {
            group: group.into(),
            rack_unit: unit,
            ..cell(id, None)
        };
        let groups = arrange(
            Grouping::Rack,
            vec![
                place(1, "r10", Some(3)),
                place(2, "", None),
                place(3, "r2", Some(40)),
                place(4, "r2", Some(1)),
                place(5, "r2", None),
            ],
        );
        let shown: Vec<(&str, Vec<i64>)> = groups
            .iter()
            .map(|g| (g.key.as_str(), g.cells.iter().map(|c| c.id).collect()))
            .collect();
        assert_eq!(
            shown,
            [("r2", vec![4, 3, 5]), ("r10", vec![1]), ("", vec![2])]
        );
    }

    #[test]
    fn a_timeline_cuts_boots_and_times_each_step() {
        let ev = |id, boot_id, phase, at: &str, detail: &str| BootEvent {
            id,
            system: Some(1),
            hostname: Some("c01".into()),
            mac: None,
            boot_id,
            phase,
            at: at.into(),
            source: "control".into(),
            ip: None,
            detail: detail.into(),
        };
        let boots = boots_of(vec![
            ev(1, 1, BootPhase::DhcpOffered, "2026-01-01T09:00:00Z", ""),
            ev(2, 1, BootPhase::Failed, "2026-01-01T09:00:30Z", "no image"),
            ev(3, 3, BootPhase::DhcpOffered, "2026-01-01T10:00:00Z", ""),
            ev(
                4,
                3,
                BootPhase::Script,
                "2026-01-01T10:02:00Z",
                "a: ok\nhello",
            ),
            ev(5, 3, BootPhase::Ready, "2026-01-01T10:02:05Z", ""),
        ]);
        assert_eq!(boots.len(), 2);
        let (newest, oldest) = (&boots[0], &boots[1]);
        assert_eq!(newest.boot_id, 3);
        let took: Vec<Option<SignedDuration>> = newest.steps.iter().map(|s| s.took).collect();
        assert_eq!(
            took,
            [
                Some(SignedDuration::from_secs(120)),
                Some(SignedDuration::from_secs(5)),
                None
            ]
        );
        assert_eq!(newest.steps[1].output(), Some("a: ok\nhello"));
        assert_eq!(newest.state(), Some(BoardState::Ready));
        assert_eq!(newest.took(), Some(SignedDuration::from_secs(125)));
        assert_eq!(oldest.errors().collect::<Vec<_>>(), ["no image"]);
        assert_eq!(oldest.state(), Some(BoardState::Failed));
        assert!(boots_of(Vec::new()).is_empty());
    }

    #[test]
    fn groupings_round_trip_by_name() {
        for g in Grouping::ALL {
            assert_eq!(Grouping::from_name(g.as_str()), Some(g));
        }
        assert_eq!(Grouping::from_name("row"), None);
    }
}
