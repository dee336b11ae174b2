//! The boot board on every engine: systems placed in racks (validated and
//! filtered like every field), node states kept by the boot events in
//! their transaction, the board's cells by group, switch and rack in a
//! fixed number of statements, the flags, the change feed and a node's
//! timeline; and migration 0017's backfill against
//! `BootPhase::board_state`.

use axum::http::StatusCode;
use jiff::{SignedDuration, Timestamp};
use mprov_api::boot::{BoardState, BootPhase};
use mprov_control::board::{self, Feed, Grouping, Rules};
use mprov_control::boot::{NewEvent, record_at};
use mprov_control::db::{Db, Engine, Sql, Val, int};
use serde_json::json;

use crate::common::{Ctx, INSERT_BARE_SYSTEMS, bind_bare_system};

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// Records `phase` for system `id` (or, with no id, for MAC `mac`) at `t`.
async fn event(db: &Db, id: Option<i64>, phase: BootPhase, t: &str, detail: &str) {
    record_at(
        db,
        NewEvent {
            system_id: id,
            mac: id.is_none().then(|| "52:54:00:99:99:99".to_owned()),
            phase,
            source: "control".into(),
            jobserver_id: None,
            ip: None,
            detail: detail.into(),
        },
        at(t),
    )
    .await
    .expect("record");
}

async fn rows(db: &Db, table: &str) -> i64 {
    let r = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) AS n FROM {table}"
    )))
    .fetch_one(db.pool())
    .await
    .unwrap();
    int(&r, "n").unwrap()
}

/// The board's groups as (key, host names).
fn shown(s: &board::Snapshot) -> Vec<(String, Vec<String>)> {
    s.groups
        .iter()
        .map(|g| {
            (
                g.key.clone(),
                g.cells.iter().map(|c| c.hostname.clone()).collect(),
            )
        })
        .collect()
}

pub(crate) async fn states_snapshot_feed_and_timeline(engine: Engine) {
    let c = Ctx::new(engine).await;
    // Racks are fields like any other: bounded, nullable, filterable.
    for bad in [
        json!({"hostname": "x", "rack_unit": 0}),
        json!({"hostname": "x", "rack_unit": 101}),
        json!({"hostname": "x", "rack": "r".repeat(65)}),
    ] {
        let (status, body) = c.call("POST", "/api/v1/systems/", Some(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    }
    c.post("groups", json!({"slug": "gpu", "priority": 5}))
        .await;
    c.post("groups", json!({"slug": "all", "priority": 9}))
        .await;
    let sw = c.post("switches", json!({"hostname": "sw1"})).await;
    let p10 = c
        .post(
            "switchports",
            json!({"switch": sw["id"], "name": "Eth1/10"}),
        )
        .await;
    let p9 = c
        .post("switchports", json!({"switch": sw["id"], "name": "Eth1/9"}))
        .await;
    let c01 = c
        .post(
            "systems",
            json!({"hostname": "c01", "groups": ["all", "gpu"], "rack": "r1", "rack_unit": 3,
                "nics": [{"mac": "52:54:00:00:00:01", "switch_port": p10["id"], "bootable": true}]}),
        )
        .await;
    let c02 = c
        .post(
            "systems",
            json!({"hostname": "c02", "rack": "r1", "rack_unit": 1,
                "nics": [{"mac": "52:54:00:00:00:02", "switch_port": p9["id"]}]}),
        )
        .await;
    let c10 = c.post("systems", json!({"hostname": "c10"})).await;
    assert_eq!(
        (c01["rack"].as_str(), c01["rack_unit"].as_i64()),
        (Some("r1"), Some(3))
    );
    assert_eq!(c10["rack"], json!(null));
    let in_r1 = c.ok("GET", "/api/v1/systems/?rack=r1", None).await;
    assert_eq!(in_r1["total"], 2);
    let (id1, id2, id10) = (
        c01["id"].as_i64().unwrap(),
        c02["id"].as_i64().unwrap(),
        c10["id"].as_i64().unwrap(),
    );

    let db = &c.state.db;
    let rules = Rules::new(600);
    let t0 = at("2026-03-01T10:00:00Z");
    let empty = board::snapshot(db, Grouping::Group, t0, rules)
        .await
        .unwrap();
    assert!(
        empty
            .cells()
            .all(|c| c.state().is_none() && c.letter() == '-')
    );
    let cursor = empty.seq;

    // A boot of c01 up to 40% of its image; an unknown MAC has no row.
    event(
        db,
        Some(id1),
        BootPhase::DhcpOffered,
        "2026-03-01T10:00:00Z",
        "",
    )
    .await;
    event(
        db,
        Some(id1),
        BootPhase::ScriptServed,
        "2026-03-01T10:00:05Z",
        "",
    )
    .await;
    event(
        db,
        Some(id1),
        BootPhase::ImageStarted,
        "2026-03-01T10:01:00Z",
        "streaming js1",
    )
    .await;
    event(
        db,
        Some(id1),
        BootPhase::Progress,
        "2026-03-01T10:02:00Z",
        "320 of 800 MiB (40%)",
    )
    .await;
    event(db, None, BootPhase::DhcpOffered, "2026-03-01T10:02:00Z", "").await;
    assert_eq!(rows(db, "node_states").await, 1);

    let now = at("2026-03-01T10:03:00Z");
    let by_group = board::snapshot(db, Grouping::Group, now, rules)
        .await
        .unwrap();
    // c01 shows once, under its first group in layering order.
    assert_eq!(
        shown(&by_group),
        [
            ("gpu".to_owned(), vec!["c01".to_owned()]),
            (String::new(), vec!["c02".to_owned(), "c10".to_owned()])
        ]
    );
    let cell = by_group.cells().find(|c| c.id == id1).unwrap();
    assert_eq!(
        (cell.state(), cell.letter(), cell.percent()),
        (Some(BoardState::Image), 'M', Some(40))
    );
    assert_eq!(cell.in_state(now), Some(SignedDuration::from_mins(2)));
    assert_eq!(by_group.flags.slowest, [id1]);
    assert!(by_group.flags.stuck.is_empty());
    assert_eq!(by_group.revision, c.revision().await);
    let by_rack = board::snapshot(db, Grouping::Rack, now, rules)
        .await
        .unwrap();
    assert_eq!(
        shown(&by_rack),
        [
            ("r1".to_owned(), vec!["c02".to_owned(), "c01".to_owned()]),
            (String::new(), vec!["c10".to_owned()])
        ]
    );
    let by_switch = board::snapshot(db, Grouping::Switch, now, rules)
        .await
        .unwrap();
    assert_eq!(
        shown(&by_switch),
        [
            ("sw1".to_owned(), vec!["c02".to_owned(), "c01".to_owned()]),
            (String::new(), vec!["c10".to_owned()])
        ]
    );
    // Ten quiet minutes later, c01 is stuck.
    let later = board::flags(db, at("2026-03-01T10:12:00Z"), rules)
        .await
        .unwrap();
    assert_eq!((later.stuck, later.slowest), (vec![id1], vec![id1]));

    // The feed: c01's four updates since the empty board, then c02's.
    let Feed::Changes { cells, seq } = board::changes(db, Grouping::Rack, cursor, 100)
        .await
        .unwrap()
    else {
        panic!("behind")
    };
    assert_eq!(cells.iter().map(|c| c.id).collect::<Vec<_>>(), [id1]);
    assert_eq!(cells[0].group, "r1");
    assert_eq!(seq, by_group.seq);
    assert_eq!(
        board::changes(db, Grouping::Rack, seq, 100).await.unwrap(),
        Feed::Changes {
            cells: Vec::new(),
            seq
        }
    );
    event(
        db,
        Some(id2),
        BootPhase::DhcpOffered,
        "2026-03-01T10:04:00Z",
        "",
    )
    .await;
    event(
        db,
        Some(id1),
        BootPhase::Verified,
        "2026-03-01T10:04:00Z",
        "",
    )
    .await;
    let Feed::Changes { cells, seq: next } =
        board::changes(db, Grouping::Group, seq, 100).await.unwrap()
    else {
        panic!("behind")
    };
    assert_eq!(cells.iter().map(|c| c.id).collect::<Vec<_>>(), [id2, id1]);
    assert_eq!(cells[1].percent(), Some(100));
    assert_eq!(next, seq + 2);
    // Too far behind for the bound, or ahead of the feed: a snapshot.
    assert_eq!(
        board::changes(db, Grouping::Group, seq, 1).await.unwrap(),
        Feed::Behind
    );
    assert_eq!(
        board::changes(db, Grouping::Group, next + 1, 100)
            .await
            .unwrap(),
        Feed::Behind
    );

    // c01 ends its boot; a lease renewal changes nothing, a reboot starts over.
    event(
        db,
        Some(id1),
        BootPhase::Script,
        "2026-03-01T10:05:00Z",
        "a: ok, exit 0, 0.1 s\nhello",
    )
    .await;
    event(db, Some(id1), BootPhase::Ready, "2026-03-01T10:05:10Z", "").await;
    let ended = board::snapshot(db, Grouping::Group, at("2026-03-01T11:00:00Z"), rules)
        .await
        .unwrap();
    assert_eq!(ended.flags.stuck, [id2], "ready is never stuck");
    event(
        db,
        Some(id1),
        BootPhase::DhcpAcked,
        "2026-03-01T10:40:00Z",
        "",
    )
    .await;
    assert_eq!(
        board::changes(db, Grouping::Group, ended.seq, 100)
            .await
            .unwrap(),
        Feed::Changes {
            cells: Vec::new(),
            seq: ended.seq
        },
        "a renewal is no update"
    );
    event(
        db,
        Some(id1),
        BootPhase::DhcpOffered,
        "2026-03-01T11:00:00Z",
        "",
    )
    .await;
    event(
        db,
        Some(id1),
        BootPhase::ChecksumMismatch,
        "2026-03-01T11:01:00Z",
        "js1: sha256 differs",
    )
    .await;
    let reboot = board::snapshot(db, Grouping::Group, at("2026-03-01T11:02:00Z"), rules)
        .await
        .unwrap();
    let node = reboot
        .cells()
        .find(|c| c.id == id1)
        .unwrap()
        .node
        .clone()
        .unwrap();
    assert_eq!(
        (
            node.state,
            node.boot_started.as_str(),
            node.last_error.as_str()
        ),
        (
            BoardState::Failed,
            "2026-03-01T11:00:00Z",
            "js1: sha256 differs"
        )
    );

    // The timeline: newest boot first, each step timed, errors and output.
    let boots = board::timeline(db, id1, 5).await.unwrap();
    // (The renewal after ready opened the boot the reboot joined: boots are
    // cut by `boot::starts_new_boot`.)
    assert_eq!(boots.len(), 2, "{boots:#?}");
    assert_eq!(
        boots[0].errors().collect::<Vec<_>>(),
        ["js1: sha256 differs"]
    );
    let first = &boots[1];
    assert_eq!(first.state(), Some(BoardState::Ready));
    assert_eq!(first.steps[0].took, Some(SignedDuration::from_secs(5)));
    let output: Vec<&str> = first.steps.iter().filter_map(|s| s.output()).collect();
    assert_eq!(output, ["a: ok, exit 0, 0.1 s\nhello"]);
    assert_eq!(board::timeline(db, id1, 1).await.unwrap().len(), 1);
    assert!(board::timeline(db, id10, 5).await.unwrap().is_empty());

    // A deleted system's row goes with it.
    c.ok("DELETE", &format!("/api/v1/systems/{id1}"), None)
        .await;
    assert_eq!(rows(db, "node_states").await, 1);
    c.cleanup().await;
}

/// Inserts `n` bare systems named `<prefix><i>`; their ids.
async fn bare_systems(db: &Db, prefix: &str, n: usize) -> Vec<i64> {
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let mut sql = db.sql();
        sql.push(INSERT_BARE_SYSTEMS);
        for (k, i) in chunk.iter().enumerate() {
            if k > 0 {
                sql.push(", ");
            }
            bind_bare_system(&mut sql, format!("{prefix}{i}"));
        }
        sql.query()
            .execute(db.pool())
            .await
            .expect("insert systems");
    }
    let mut q = db.sql();
    q.push("SELECT id FROM systems WHERE hostname LIKE ")
        .bind(Val::Text(Some(format!("{prefix}%"))))
        .push(" ORDER BY id");
    q.query()
        .fetch_all(db.pool())
        .await
        .unwrap()
        .iter()
        .map(|r| int(r, "id").unwrap())
        .collect()
}

pub(crate) async fn statements_do_not_grow_with_systems(engine: Engine) {
    let c = Ctx::new(engine).await;
    let db = &c.state.db;
    let now = at("2026-03-01T10:10:00Z");
    let one = bare_systems(db, "a", 1).await;
    event(
        db,
        Some(one[0]),
        BootPhase::Enrolled,
        "2026-03-01T10:00:00Z",
        "",
    )
    .await;
    let cost = |grouping| async move {
        let before = db.statements();
        let s = board::snapshot(db, grouping, now, Rules::default())
            .await
            .unwrap();
        (db.statements() - before, s.cells().count())
    };
    let mut small = Vec::new();
    for g in Grouping::ALL {
        small.push(cost(g).await);
    }
    let many = bare_systems(db, "b", 999).await;
    for (k, id) in many.iter().take(20).enumerate() {
        event(
            db,
            Some(*id),
            BootPhase::KernelFetched,
            &format!("2026-03-01T10:00:{k:02}Z"),
            "",
        )
        .await;
    }
    for (g, (n_small, cells_small)) in Grouping::ALL.into_iter().zip(small) {
        let (n_large, cells_large) = cost(g).await;
        assert_eq!((cells_small, cells_large), (1, 1000));
        assert_eq!(
            n_small, n_large,
            "{g:?}: 1 system {n_small} statements, 1000: {n_large}"
        );
        assert!((1..=3).contains(&n_large), "{g:?}: {n_large}");
    }
    let before = db.statements();
    let Feed::Changes { cells, .. } = board::changes(db, Grouping::Switch, 0, 100).await.unwrap()
    else {
        panic!("behind")
    };
    assert_eq!(cells.len(), 21);
    let flags = board::flags(db, now, Rules::default()).await.unwrap();
    assert_eq!(flags.slowest.len(), board::SLOWEST);
    assert_eq!(flags.slowest[0], one[0], "the earliest boot is the slowest");
    assert_eq!(
        db.statements() - before,
        3,
        "the feed takes two, the flags one"
    );
    c.cleanup().await;
}

/// Migration 0017 fills `node_states` from the events stored before it;
/// its mapping of phases must be `BootPhase::board_state`'s. The
/// statement is run again here over one system per phase.
pub(crate) async fn migration_backfill_maps_phases_as_the_code_does(engine: Engine) {
    let c = Ctx::new(engine).await;
    let db = &c.state.db;
    let ids = bare_systems(db, "p", BootPhase::ALL.len()).await;
    for (k, (&id, phase)) in ids.iter().zip(BootPhase::ALL).enumerate() {
        let mut ins = db.sql();
        ins.push("INSERT INTO boot_events (system_id, mac, boot_id, phase, at, source, jobserver_id, ip, detail) VALUES ");
        for (j, (p, t)) in [
            (BootPhase::DhcpOffered, "2026-03-01T10:00:00Z"),
            (*phase, "2026-03-01T10:05:00Z"),
        ]
        .into_iter()
        .enumerate()
        {
            if j > 0 {
                ins.push(", ");
            }
            ins.bind_list([
                Val::Int(Some(id)),
                Val::Text(None),
                Val::Int(Some(100 + k as i64)),
                Val::Text(Some(p.as_str().into())),
                Val::Text(Some(t.into())),
                Val::Text(Some("control".into())),
                Val::Int(None),
                Val::Text(None),
                Val::Text(Some(p.as_str().to_owned())),
            ]);
        }
        ins.query().execute(db.pool()).await.unwrap();
    }
    let dir = match engine {
        Engine::Sqlite => "sqlite",
        Engine::Mysql => "mysql",
        Engine::Postgres => "postgres",
    };
    let path = format!(
        "{}/migrations/{dir}/0017_board.sql",
        env!("CARGO_MANIFEST_DIR")
    );
    let migration = std::fs::read_to_string(path).unwrap();
    let backfill = migration
        .split(';')
        .map(|s| {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .find(|s| s.trim_start().starts_with("INSERT INTO node_states"))
        .expect("the backfill statement");
    sqlx::query(sqlx::AssertSqlSafe(backfill))
        .execute(db.pool())
        .await
        .unwrap();
    let mut q = Sql::new(engine);
    q.push("SELECT system_id, state, phase, boot_started, state_since FROM node_states ORDER BY system_id");
    let got = q.query().fetch_all(db.pool()).await.unwrap();
    assert_eq!(got.len(), BootPhase::ALL.len());
    for (r, phase) in got.iter().zip(BootPhase::ALL) {
        let state: String = sqlx::Row::get(r, "state");
        let stored: String = sqlx::Row::get(r, "phase");
        let started: String = sqlx::Row::get(r, "boot_started");
        assert_eq!(stored, phase.as_str());
        assert_eq!(state, phase.board_state().as_str(), "{phase:?}");
        assert_eq!(started, "2026-03-01T10:00:00Z");
    }
    c.cleanup().await;
}

/// A signed-in admin's session cookie, started on the database itself.
async fn session_cookie(db: &Db) -> String {
    let started = mprov_control::sessions::start(
        db,
        "admin",
        true,
        mprov_control::sessions::Method::Password,
        Timestamp::now(),
    )
    .await
    .unwrap();
    format!("mprov_session={}", started.token)
}

/// The board and a node's timeline as pages, through the router: every
/// cell a link with its letter and its state in words, the legend, the
/// grouping refused when unknown, a timeline's errors and script output.
pub(crate) async fn pages_show_the_board_and_a_timeline(engine: Engine) {
    use axum::body::Body;
    use axum::http::{Request, header};
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    let c = Ctx::new(engine).await;
    let c01 = c
        .post(
            "systems",
            json!({"hostname": "c01", "rack": "r7", "rack_unit": 2}),
        )
        .await;
    c.post("systems", json!({"hostname": "c02"})).await;
    let id = c01["id"].as_i64().unwrap();
    let db = &c.state.db;
    let t = |s: u32| format!("2026-03-01T10:00:{s:02}Z");
    event(db, Some(id), BootPhase::DhcpOffered, &t(0), "").await;
    event(db, Some(id), BootPhase::ImageStarted, &t(10), "").await;
    event(
        db,
        Some(id),
        BootPhase::Progress,
        &t(20),
        "1 of 2 MiB (50%)",
    )
    .await;
    event(db, Some(id), BootPhase::Failed, &t(30), "js1: <refused>").await;
    event(
        db,
        Some(id),
        BootPhase::Script,
        &t(40),
        "a: ok\nhello & bye",
    )
    .await;
    let cookie = session_cookie(db).await;
    let get = |path: &str| {
        let req = Request::get(path)
            .header(header::COOKIE, &cookie)
            .body(Body::empty())
            .unwrap();
        let app = c.app.clone();
        async move {
            let resp = app.oneshot(req).await.unwrap();
            let status = resp.status();
            let csp = resp
                .headers()
                .get(header::CONTENT_SECURITY_POLICY)
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, csp, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let (status, csp, html) = get("/admin/board/?by=rack").await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    assert!(
        !html.contains("<script>") && !html.contains("style="),
        "no inline script or style"
    );
    assert!(html.contains("/admin/static/board.js"), "{html}");
    assert!(
        html.contains(&format!(
            "<a id=\"n{id}\" class=\"cell s-scripts slow stuck\" href=\"/admin/systems/{id}/timeline\""
        )),
        "{html}"
    );
    assert!(html.contains("aria-label=\"c01: scripts"), "{html}");
    assert!(html.contains("aria-label=\"c02: no boot seen\""), "{html}");
    assert!(html.contains("r7") && html.contains("(no rack)"), "{html}");
    for state in BoardState::ALL {
        assert!(
            html.contains(&format!("{}: {}</li>", state.letter(), state.label())),
            "legend of {state:?}"
        );
    }
    let (status, _, html) = get("/admin/board/?by=row").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{html}");
    assert!(html.contains("group, switch or rack"), "{html}");
    let (status, _, html) = get("/admin/systems/c01/timeline").await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(
        html.contains("js1: &#60;refused&#62;"),
        "the error, escaped: {html}"
    );
    assert!(
        html.contains("<pre class=\"out\">a: ok\nhello &#38; bye</pre>"),
        "{html}"
    );
    assert!(
        html.contains("<td>10 s</td>"),
        "each step's duration: {html}"
    );
    let (status, _, _) = get("/admin/systems/nope/timeline").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Without a session, the sign-in form.
    let resp = c
        .app
        .clone()
        .oneshot(Request::get("/admin/board/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    c.cleanup().await;
}

/// One server-sent event.
#[derive(Debug)]
struct Sent {
    name: String,
    id: String,
    data: serde_json::Value,
    at: std::time::Instant,
}

/// Reads server-sent events from a response, one at a time.
struct EventReader {
    resp: reqwest::Response,
    buf: String,
}

impl EventReader {
    async fn next(&mut self) -> Sent {
        let deadline = std::time::Duration::from_secs(20);
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut name, mut id, mut data) = (String::new(), String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if name.is_empty() {
                    continue; // a keep-alive comment
                }
                return Sent {
                    name,
                    id,
                    data: serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}")),
                    at: std::time::Instant::now(),
                };
            }
            let chunk = tokio::time::timeout(deadline, self.resp.chunk())
                .await
                .expect("an event within 20 s")
                .expect("the stream")
                .expect("the stream still open");
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

/// The cell of `host` in a message, as (letter, sub).
fn cell_of(msg: &serde_json::Value, host: &str) -> Option<(String, String)> {
    msg["cells"]
        .as_array()?
        .iter()
        .find(|c| c["host"] == host)
        .map(|c| {
            (
                c["letter"].as_str().unwrap_or_default().to_owned(),
                c["sub"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

/// The live feed of a real `mprov-control serve`, read with reqwest while
/// boot events are posted to it: a snapshot first, coalesced updates at
/// most one a second, a snapshot again on a reconnect with
/// `Last-Event-ID`, and a snapshot when the inventory changes.
pub(crate) fn feed_on_a_real_service(dir: &std::path::Path, url: &str) {
    use crate::attacks::ADMIN_PASSWORD;
    use crate::process::Server;

    let mut s = Server::start(dir, url, 1, &[("MPROV_SUPERUSER_PASSWORD", ADMIN_PASSWORD)]);
    let base = format!("http://127.0.0.1:{}", s.port);
    let url = url.to_owned();
    tokio::runtime::Handle::current().block_on(async move {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::new();
        let api = |method: reqwest::Method, path: &str, body: serde_json::Value| {
            http.request(method, format!("{base}{path}"))
                .basic_auth("admin", Some(ADMIN_PASSWORD))
                .header(mprov_api::VERSION_HEADER, mprov_api::api_version())
                .json(&body)
                .send()
        };
        for host in ["c01", "c02"] {
            let r = api(
                reqwest::Method::POST,
                "/api/v1/systems/",
                json!({"hostname": host}),
            )
            .await
            .unwrap();
            assert!(r.status().is_success(), "{:?}", r.text().await);
        }
        let db = Db::connect(&url).await.unwrap();
        let cookie = session_cookie(&db).await;
        let open = |last: Option<String>| {
            let mut req = http
                .get(format!("{base}/admin/board/events?by=group"))
                .header("cookie", &cookie);
            if let Some(id) = last {
                req = req.header("last-event-id", id);
            }
            async move {
                let resp = req.send().await.unwrap();
                assert_eq!(resp.status(), reqwest::StatusCode::OK);
                let ty = resp.headers()["content-type"].to_str().unwrap().to_owned();
                assert!(ty.starts_with("text/event-stream"), "{ty}");
                EventReader {
                    resp,
                    buf: String::new(),
                }
            }
        };
        let mut feed = open(None).await;
        let first = feed.next().await;
        assert_eq!(first.name, "snapshot");
        // (First start made the control host's own system too.)
        let systems = first.data["cells"].as_array().unwrap().len();
        assert!(systems >= 2, "{first:?}");
        assert_eq!(
            cell_of(&first.data, "c01"),
            Some(("-".into(), String::new()))
        );

        // Five events in a burst: they arrive as coalesced updates, at
        // least a second apart.
        let post = |host: &str, phase: &str, detail: &str| {
            api(
                reqwest::Method::POST,
                "/api/v1/boot/events",
                json!({"system": host, "phase": phase, "detail": detail}),
            )
        };
        for (host, phase, detail) in [
            ("c01", "dhcp_offered", ""),
            ("c01", "kernel_fetched", ""),
            ("c01", "image_started", ""),
            ("c01", "progress", "40 of 100 MiB (40%)"),
            ("c02", "dhcp_offered", ""),
        ] {
            let r = post(host, phase, detail).await.unwrap();
            assert!(r.status().is_success(), "{:?}", r.text().await);
        }
        let mut updates = Vec::new();
        let mut seen = std::collections::HashMap::new();
        while seen.get("c01") != Some(&("M".to_owned(), "40%".to_owned()))
            || seen.get("c02") != Some(&("D".to_owned(), String::new()))
        {
            let ev = feed.next().await;
            assert_eq!(ev.name, "update", "{ev:?}");
            for host in ["c01", "c02"] {
                if let Some(cell) = cell_of(&ev.data, host) {
                    seen.insert(host, cell);
                }
            }
            updates.push(ev);
            assert!(
                updates.len() <= 3,
                "five events, {} updates: {updates:?}",
                updates.len()
            );
        }
        for pair in updates.windows(2) {
            let gap = pair[1].at - pair[0].at;
            assert!(
                gap >= std::time::Duration::from_millis(900),
                "updates {gap:?} apart"
            );
        }
        let last_id = updates.last().unwrap().id.clone();
        assert!(last_id.parse::<i64>().unwrap() > first.id.parse::<i64>().unwrap());

        // A reconnect naming the last event it saw gets a snapshot.
        drop(feed);
        let mut again = open(Some(last_id)).await;
        let snap = again.next().await;
        assert_eq!(snap.name, "snapshot");
        assert_eq!(cell_of(&snap.data, "c01"), Some(("M".into(), "40%".into())));
        assert_eq!(
            cell_of(&snap.data, "c02"),
            Some(("D".into(), String::new()))
        );
        // An inventory change: a snapshot with the new system.
        let r = api(
            reqwest::Method::POST,
            "/api/v1/systems/",
            json!({"hostname": "c03"}),
        )
        .await
        .unwrap();
        assert!(r.status().is_success());
        let next = again.next().await;
        assert_eq!(next.name, "snapshot", "{next:?}");
        assert_eq!(next.data["cells"].as_array().unwrap().len(), systems + 1);
        db.close().await;
    });
    s.stop();
}
