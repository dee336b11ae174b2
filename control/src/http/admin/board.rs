//! The boot board (`/admin/board/`), its live feed (`/admin/board/events`)
//! and a node's timeline (`/admin/systems/{key}/timeline`). What a cell
//! shows and which nodes are flagged is [`crate::board`]'s; these handlers
//! parse, read it and render.
//!
//! The page is a server-rendered snapshot and works without JavaScript;
//! `board.js` then follows the server-sent events: a full snapshot first
//! (also after a reconnect, whatever `Last-Event-ID` says, and when the
//! connection falls more than [`board::FEED_LIMIT`] updates behind or the
//! inventory changes), then at most one `update` a second with the cells
//! that changed, woken by the service's boot events and writes, and every
//! [`TICK`] anyway (time alone makes a node stuck, and another replica's
//! events wake nothing here). Each connection keeps its cells, so the
//! flags are decided again on every update without a query.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::{Deserialize, Serialize};

use super::page::{self, Chrome, PageError};
use crate::board::{self, Cell, Feed, Flags, Grouping, Rules, Snapshot};
use crate::boot;
use crate::http::AppState;
use crate::sessions::Session;
use mprov_api::boot::BoardState;

/// The shortest time between two updates of one connection.
pub const COALESCE: Duration = Duration::from_secs(1);
/// How often a connection looks again without being woken.
pub const TICK: Duration = Duration::from_secs(5);

/// `?by=`.
#[derive(Debug, Default, Deserialize)]
pub struct By {
    by: Option<String>,
}

fn grouping(by: &By) -> Result<Grouping, PageError> {
    match by.by.as_deref() {
        None | Some("") => Ok(Grouping::default()),
        Some(name) => Grouping::from_name(name)
            .ok_or_else(|| PageError::invalid("by", "group the board by group, switch or rack")),
    }
}

/// One cell as the page and the feed show it: the same text for both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CellView {
    /// The system's id (the element is `n<id>`).
    pub id: i64,
    /// Its host name.
    pub host: String,
    /// The state's letter, `-` for none.
    pub letter: char,
    /// The percentage streamed, while streaming (`40%`), else empty.
    pub sub: String,
    /// The classes: `cell`, `s-<state>`, `slow`, `stuck`.
    pub class: String,
    /// Everything it says, for a person (its `title` and `aria-label`).
    pub label: String,
}

/// A duration for a person: `42 s`, `5 min`, `3 h 5 min`, `2 d`.
pub fn short(d: jiff::SignedDuration) -> String {
    let s = d.as_secs().max(0);
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86_400 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        _ => format!("{} d {} h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// What `cell` shows at `now` given the `flags`.
pub fn view(cell: &Cell, flags: &Flags, now: jiff::Timestamp) -> CellView {
    let state = cell.state();
    let slow = flags.slowest.contains(&cell.id);
    let stuck = flags.stuck.contains(&cell.id);
    let mut class = format!("cell s-{}", state.map_or("none", BoardState::as_str));
    let mut label = format!(
        "{}: {}",
        cell.hostname,
        state.map_or("no boot seen", BoardState::label)
    );
    let sub = cell.percent().map(|p| format!("{p}%")).unwrap_or_default();
    if !sub.is_empty() {
        label.push_str(&format!(" {sub}"));
    }
    if let Some(d) = cell.in_state(now) {
        label.push_str(&format!(", for {}", short(d)));
    }
    if slow {
        class.push_str(" slow");
        label.push_str(", among the slowest");
    }
    if stuck {
        class.push_str(" stuck");
        label.push_str(", stuck (no event lately)");
    }
    CellView {
        id: cell.id,
        host: cell.hostname.clone(),
        letter: cell.letter(),
        sub,
        class,
        label,
    }
}

struct GroupView {
    key: String,
    cells: Vec<CellView>,
}

struct Legend {
    letter: char,
    state: &'static str,
    label: &'static str,
}

struct Flagged {
    id: i64,
    host: String,
    what: String,
}

#[derive(Template)]
#[template(path = "admin/board.html")]
struct BoardPage {
    chrome: Chrome,
    by: &'static str,
    groupings: [&'static str; 3],
    revision: i64,
    seq: i64,
    groups: Vec<GroupView>,
    legend: Vec<Legend>,
    slowest: Vec<Flagged>,
    stuck: Vec<Flagged>,
    stuck_after: String,
}

fn rules(state: &AppState) -> Rules {
    Rules::new(state.config.board_stuck_seconds)
}

/// `GET /admin/board/?by=group|switch|rack`.
pub async fn show(
    State(state): State<AppState>,
    session: Session,
    Query(by): Query<By>,
) -> Result<Response, PageError> {
    let grouping = grouping(&by)?;
    let rules = rules(&state);
    let snap = board::snapshot(&state.db, grouping, jiff::Timestamp::now(), rules).await?;
    let now = snap.now;
    let cells: HashMap<i64, &Cell> = snap.cells().map(|c| (c.id, c)).collect();
    let flagged = |ids: &[i64], what: &dyn Fn(&Cell) -> String| -> Vec<Flagged> {
        ids.iter()
            .filter_map(|id| cells.get(id))
            .map(|c| Flagged {
                id: c.id,
                host: c.hostname.clone(),
                what: what(c),
            })
            .collect()
    };
    let slowest = flagged(&snap.flags.slowest, &|c| {
        c.in_boot(now)
            .map(|d| format!("booting for {}", short(d)))
            .unwrap_or_default()
    });
    let stuck = flagged(&snap.flags.stuck, &|c| {
        c.node
            .as_ref()
            .and_then(|n| n.last_at.parse::<jiff::Timestamp>().ok())
            .map(|t| format!("quiet for {}", short(now.duration_since(t))))
            .unwrap_or_default()
    });
    let groups = snap
        .groups
        .iter()
        .map(|g| GroupView {
            key: g.key.clone(),
            cells: g.cells.iter().map(|c| view(c, &snap.flags, now)).collect(),
        })
        .collect();
    let legend = BoardState::ALL
        .into_iter()
        .map(|s| Legend {
            letter: s.letter(),
            state: s.as_str(),
            label: s.label(),
        })
        .collect();
    let page = BoardPage {
        chrome: Chrome::new(&state, &session, "Boot board", "board"),
        by: grouping.as_str(),
        groupings: Grouping::ALL.map(Grouping::as_str),
        revision: snap.revision,
        seq: snap.seq,
        groups,
        legend,
        slowest,
        stuck,
        stuck_after: short(rules.stuck_after),
    };
    Ok(page::render(&page))
}

/// What one feed message carries.
#[derive(Debug, Serialize)]
struct Message {
    by: &'static str,
    /// When it was sent, in the configured time zone (`TIME_ZONE`, else
    /// `TZ`, else UTC), as the pages show times: the page says "Updated
    /// <at>", never in the browser's own zone.
    at: String,
    seq: i64,
    revision: i64,
    cells: Vec<CellView>,
}

/// What a connection knows: the cells it last sent, their flags, the
/// feed's cursor and the inventory revision.
struct Follower {
    grouping: Grouping,
    rules: Rules,
    cells: HashMap<i64, Cell>,
    flags: Flags,
    seq: i64,
    revision: i64,
    /// The time zone the pages show times in.
    tz: jiff::tz::TimeZone,
}

impl Follower {
    /// A full snapshot, as a `snapshot` event.
    fn take(&mut self, snap: Snapshot) -> Event {
        self.seq = snap.seq;
        self.revision = snap.revision;
        self.flags = snap.flags.clone();
        let views: Vec<CellView> = snap
            .cells()
            .map(|c| view(c, &snap.flags, snap.now))
            .collect();
        self.cells = snap
            .groups
            .into_iter()
            .flat_map(|g| g.cells)
            .map(|c| (c.id, c))
            .collect();
        self.event("snapshot", views)
    }

    fn event(&self, name: &str, cells: Vec<CellView>) -> Event {
        let msg = Message {
            by: self.grouping.as_str(),
            at: page::local_time(&crate::time::format_ts(jiff::Timestamp::now()), &self.tz),
            seq: self.seq,
            revision: self.revision,
            cells,
        };
        Event::default()
            .event(name)
            .id(self.seq.to_string())
            .json_data(&msg)
            .unwrap_or_else(|_| Event::default().event(name).data("{}"))
    }

    /// The next message, if anything changed: the changed cells (their
    /// state, or their flags at `now`), or a new snapshot when the feed
    /// says so or the inventory changed.
    async fn next(&mut self, state: &AppState) -> Result<Option<Event>, board::BoardError> {
        let now = jiff::Timestamp::now();
        let revision = current_revision(state).await?;
        if revision != self.revision {
            let snap = board::snapshot(&state.db, self.grouping, now, self.rules).await?;
            return Ok(Some(self.take(snap)));
        }
        let changed =
            match board::changes(&state.db, self.grouping, self.seq, board::FEED_LIMIT).await? {
                Feed::Behind => {
                    let snap = board::snapshot(&state.db, self.grouping, now, self.rules).await?;
                    return Ok(Some(self.take(snap)));
                }
                Feed::Changes { cells, seq } => {
                    self.seq = seq;
                    cells
                }
            };
        let mut ids: Vec<i64> = changed.iter().map(|c| c.id).collect();
        for c in changed {
            self.cells.insert(c.id, c);
        }
        let flags = board::flags_of(self.cells.values(), now, self.rules);
        let marks = |f: &Flags, id: &i64| (f.slowest.contains(id), f.stuck.contains(id));
        let flagged: Vec<i64> = (flags.slowest.iter().chain(&flags.stuck))
            .chain(self.flags.slowest.iter().chain(&self.flags.stuck))
            .filter(|id| marks(&flags, id) != marks(&self.flags, id))
            .copied()
            .collect();
        ids.extend(flagged);
        ids.sort_unstable();
        ids.dedup();
        let views: Vec<CellView> = ids
            .iter()
            .filter_map(|id| self.cells.get(id))
            .map(|c| view(c, &flags, now))
            .collect();
        self.flags = flags;
        if views.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.event("update", views)))
    }
}

async fn current_revision(state: &AppState) -> Result<i64, board::BoardError> {
    Ok(state.db.revision().await?)
}

/// `GET /admin/board/events?by=`: the live feed (server-sent events).
/// A reconnect's `Last-Event-ID` is read only to log it: the first event
/// is always a full snapshot, so nothing missed meanwhile is lost.
pub async fn events(
    State(state): State<AppState>,
    _session: Session,
    Query(by): Query<By>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, PageError> {
    let grouping = grouping(&by)?;
    let rules = rules(&state);
    if let Some(last) = headers.get("last-event-id").and_then(|v| v.to_str().ok()) {
        tracing::debug!(
            last,
            "boot board: a feed reconnected; it starts with a snapshot"
        );
    }
    let snap = board::snapshot(&state.db, grouping, jiff::Timestamp::now(), rules).await?;
    let mut follower = Follower {
        grouping,
        rules,
        cells: HashMap::new(),
        flags: Flags::default(),
        seq: 0,
        revision: 0,
        tz: state.config.time_zone.1.clone(),
    };
    let first = follower.take(snap);
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(2);
    tokio::spawn(async move {
        if tx.send(first).await.is_err() {
            return;
        }
        loop {
            // Armed before the read, so a wake-up during it is not lost.
            let woken = state.boot_events.notified();
            let changed = state.changed.notified();
            tokio::pin!(woken, changed);
            woken.as_mut().enable();
            changed.as_mut().enable();
            tokio::select! {
                () = &mut woken => {}
                () = &mut changed => {}
                () = tokio::time::sleep(TICK) => {}
                () = tx.closed() => return,
            }
            // Coalesce: what else happens within the second goes along.
            tokio::select! {
                () = tokio::time::sleep(COALESCE) => {}
                () = tx.closed() => return,
            }
            match follower.next(&state).await {
                Ok(Some(ev)) => {
                    if tx.send(ev).await.is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "boot board: the feed could not read the board; trying again");
                }
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|ev| (Ok(ev), rx))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

struct StepView {
    phase: &'static str,
    at: String,
    took: String,
    source: String,
    detail: String,
    error: bool,
    output: bool,
}

struct BootView {
    boot_id: i64,
    started: String,
    took: String,
    state: &'static str,
    letter: char,
    label: &'static str,
    errors: usize,
    steps: Vec<StepView>,
}

#[derive(Template)]
#[template(path = "admin/timeline.html")]
struct TimelinePage {
    chrome: Chrome,
    host: String,
    boots: Vec<BootView>,
}

/// `GET /admin/systems/{key}/timeline`: the node's latest boots.
pub async fn timeline(
    State(state): State<AppState>,
    session: Session,
    Path(key): Path<String>,
) -> Result<Response, PageError> {
    let Some((id, host)) = boot::system_by_key(&state.db, &key).await? else {
        return Err(PageError::not_found(format!("no system {key:?}")));
    };
    let boots = board::timeline(&state.db, id, board::TIMELINE_BOOTS).await?;
    let chrome = Chrome::new(&state, &session, format!("Timeline of {host}"), "board");
    let boots = boots
        .iter()
        .map(|b| {
            let st = b.state().unwrap_or(BoardState::Failed);
            BootView {
                boot_id: b.boot_id,
                started: chrome.time(b.started().unwrap_or_default()),
                took: b.took().map(short).unwrap_or_default(),
                state: st.as_str(),
                letter: st.letter(),
                label: st.label(),
                errors: b.errors().count(),
                steps: b
                    .steps
                    .iter()
                    .map(|s| StepView {
                        phase: s.event.phase.as_str(),
                        at: chrome.time(&s.event.at),
                        took: s.took.map(short).unwrap_or_default(),
                        source: s.event.source.clone(),
                        detail: s.event.detail.clone(),
                        error: s.error().is_some(),
                        output: s.output().is_some(),
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(page::render(&TimelinePage {
        chrome,
        host,
        boots,
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_a_person_says_them() {
        let s = jiff::SignedDuration::from_secs;
        assert_eq!(short(s(42)), "42 s");
        assert_eq!(short(s(305)), "5 min 5 s");
        assert_eq!(short(s(3 * 3600 + 300)), "3 h 5 min");
        assert_eq!(short(s(2 * 86_400 + 3600)), "2 d 1 h");
        assert_eq!(short(s(-5)), "0 s");
    }

    #[test]
    fn a_cell_says_its_state_in_words_not_colour_alone() {
        let now: jiff::Timestamp = "2026-01-01T10:00:00Z".parse().unwrap();
        let node = crate::boot::NodeState {
            boot_id: 1,
            state: BoardState::Image,
            phase: mprov_api::boot::BootPhase::Progress,
            percent: Some(40),
            boot_started: "2026-01-01T09:50:00Z".into(),
            state_since: "2026-01-01T09:58:00Z".into(),
            last_at: "2026-01-01T09:59:00Z".into(),
            detail: String::new(),
            last_error: String::new(),
        };
        let cell = Cell {
            id: 7,
            hostname: "c07".into(),
            group: String::new(),
            rack_unit: None,
            port: None,
            node: Some(node),
            seq: 3,
        };
        let flags = Flags {
            slowest: vec![7],
            stuck: vec![7],
        };
        let v = view(&cell, &flags, now);
        assert_eq!((v.letter, v.sub.as_str()), ('M', "40%"));
        assert_eq!(v.class, "cell s-image slow stuck");
        assert_eq!(
            v.label,
            "c07: image 40%, for 2 min 0 s, among the slowest, stuck (no event lately)"
        );
        let none = Cell { node: None, ..cell };
        let v = view(&none, &Flags::default(), now);
        assert_eq!((v.letter, v.class.as_str()), ('-', "cell s-none"));
        assert_eq!(v.label, "c07: no boot seen");
    }
}
