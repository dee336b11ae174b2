//! The dashboard (`/admin/`): how much of each kind there is, the job
//! servers with their heartbeat age, load and modules, and the recent jobs.

use askama::Template;
use axum::extract::State;
use axum::response::Response;
use serde_json::Value;

use super::page::{self, Chrome, PageError};
use crate::board::{self, Grouping, Rules};
use crate::db::crud::ListQuery;
use crate::db::kinds::{self, KINDS};
use crate::http::AppState;
use crate::sessions::Session;
use mprov_api::boot::BoardState;

/// How many recent jobs the dashboard lists.
const RECENT_JOBS: u64 = 15;

struct Count {
    kind: &'static str,
    total: u64,
}

struct JobServer {
    name: String,
    heartbeat: String,
    age: String,
    load: String,
    modules: String,
}

struct Job {
    id: i64,
    module: String,
    status: String,
    created: String,
    output: String,
}

/// A node that needs a look: failed, or stuck (the board's rule).
struct Attention {
    id: i64,
    host: String,
    what: &'static str,
    since: String,
    detail: String,
}

#[derive(Template)]
#[template(path = "admin/dashboard.html")]
struct Dashboard {
    chrome: Chrome,
    counts: Vec<Count>,
    jobservers: Vec<JobServer>,
    jobs: Vec<Job>,
    attention: Vec<Attention>,
}

fn text(o: &serde_json::Map<String, Value>, k: &str) -> String {
    match o.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(v) => v.to_string(),
    }
}

/// How long ago `stored` was, for a person: `42 s`, `5 min`, `3 h`, `2 d`.
pub fn age(stored: &str, now: jiff::Timestamp) -> String {
    let Ok(ts) = stored.parse::<jiff::Timestamp>() else {
        return "never".into();
    };
    let s = now.duration_since(ts).as_secs().max(0);
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// The last `n` characters of `s`.
fn tail(s: &str, n: usize) -> String {
    let count = s.chars().count();
    s.chars().skip(count.saturating_sub(n)).collect()
}

/// `GET /admin/`.
pub async fn show(State(state): State<AppState>, session: Session) -> Result<Response, PageError> {
    let one = ListQuery {
        limit: Some(1),
        ..ListQuery::default()
    };
    let mut counts = Vec::new();
    for kind in KINDS
        .iter()
        .filter(|k| k.issues.is_none() && k.name != "users")
    {
        counts.push(Count {
            kind: kind.name,
            total: state.db.list(kind, &one).await?.total,
        });
    }
    let now = jiff::Timestamp::now();
    let js_kind = kinds::kind("jobservers").ok_or_else(|| PageError::not_found("jobservers"))?;
    let jobservers = state
        .db
        .list(
            js_kind,
            &ListQuery {
                sort: Some("name".into()),
                limit: Some(200),
                ..ListQuery::default()
            },
        )
        .await?
        .items
        .iter()
        .map(|o| {
            let heartbeat = text(o, "heartbeat_at");
            JobServer {
                name: text(o, "name"),
                age: age(&heartbeat, now),
                heartbeat,
                load: text(o, "load_avg"),
                modules: match o.get("modules") {
                    Some(Value::Array(m)) => m
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(", "),
                    _ => String::new(),
                },
            }
        })
        .collect();
    let jobs_kind = kinds::kind("jobs").ok_or_else(|| PageError::not_found("jobs"))?;
    let jobs = state
        .db
        .list(
            jobs_kind,
            &ListQuery {
                sort: Some("-id".into()),
                limit: Some(RECENT_JOBS),
                ..ListQuery::default()
            },
        )
        .await?
        .items
        .iter()
        .map(|o| Job {
            id: o.get("id").and_then(Value::as_i64).unwrap_or_default(),
            module: text(o, "module"),
            status: text(o, "status"),
            created: text(o, "created_at"),
            output: tail(&text(o, "output"), 300),
        })
        .collect();
    let board = board::snapshot(
        &state.db,
        Grouping::Group,
        now,
        Rules::new(state.config.board_stuck_seconds),
    )
    .await?;
    let attention = board
        .cells()
        .filter_map(|c| {
            let n = c.node.as_ref()?;
            let what = if n.state == BoardState::Failed {
                "failed"
            } else if board.flags.stuck.contains(&c.id) {
                "stuck"
            } else {
                return None;
            };
            Some(Attention {
                id: c.id,
                host: c.hostname.clone(),
                what,
                since: n.last_at.clone(),
                detail: if n.last_error.is_empty() {
                    n.detail.clone()
                } else {
                    n.last_error.clone()
                },
            })
        })
        .collect();
    let chrome = Chrome::new(&state, &session, "Dashboard", "dashboard");
    Ok(page::render(&Dashboard {
        chrome,
        counts,
        jobservers,
        jobs,
        attention,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_a_person_says_them() {
        let now: jiff::Timestamp = "2026-12-03T12:00:00Z".parse().unwrap();
        assert_eq!(age("2026-12-03T11:59:18Z", now), "42 s");
        assert_eq!(age("2026-12-03T11:55:00Z", now), "5 min");
        assert_eq!(age("2026-12-03T09:00:00Z", now), "3 h");
        assert_eq!(age("2026-12-01T12:00:00Z", now), "2 d");
        assert_eq!(age("", now), "never");
        assert_eq!(tail("abcdef", 3), "def");
    }
}
