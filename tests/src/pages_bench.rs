//! The admin pages' benchmark (`cargo xtask bench pages`): list pages of
//! the inventory with 10,000 systems (the first page, a deep page reached
//! through the keyset cursor, a search, a sorted page) on SQLite, MariaDB
//! and PostgreSQL: the server's time per page (from the page's
//! `Server-Timing`), the round trip, the server's CPU per request, and the
//! statements each page ran. Goal from the issue: under 200 ms a page, and
//! statements that do not grow with the rows.
//!
//! There is no incumbent to run beside it: the original's admin is a
//! Django site we do not install, so the figures are absolute.
//!
//! The parts are [`PARTS`]: each measures some pages of a running service.
//! The **boot board** part adds `nodes` systems (1,000) beside the list
//! part's, then has every one of them report a boot step at once, three
//! times over (DHCP, kernel, ready), while [`FEED_CLIENTS`] browsers'
//! worth of live feeds (`/admin/board/events`) watch: it prints, per feed,
//! the updates it got and the most in any one second (goal: at most one a
//! second, coalesced), the shortest gap between two, and when the last
//! change showed; then the time a reconnecting feed takes to receive its
//! full snapshot; and the board page's own time and statements (which
//! `tests/api/board.rs` holds constant whatever the number of systems).
//! `MPROV_BENCH_ENGINES=sqlite` (a comma list of sqlite, mariadb,
//! postgres) runs only those engines.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mprov_api::client::{Auth, Client};
use serde_json::{Value, json};

use crate::control::{Control, SUPERUSER_PASSWORD, build, cpu_time, markdown_table};
use crate::db::{MariaDb, Postgres};

/// The goal for the server's time per page.
const GOAL: Duration = Duration::from_millis(200);

/// Sizes of a run.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Systems in the inventory.
    pub systems: usize,
    /// Requests of each page; the median counts.
    pub rounds: usize,
    /// Nodes of the boot board part that change at once.
    pub nodes: usize,
}

/// One page's figures.
#[derive(Debug)]
pub struct Figure {
    /// The engine.
    pub engine: &'static str,
    /// What was asked.
    pub page: String,
    /// The server's time (median).
    pub server: Duration,
    /// The round trip (median).
    pub round_trip: Duration,
    /// The server's CPU per request (mean).
    pub cpu: Duration,
    /// The statements the page ran.
    pub statements: u64,
}

/// What a part measured: each page's name and samples.
pub type Measured = Result<Vec<(String, Sample)>>;

/// A part of the benchmark: measures pages of a seeded service.
#[derive(Debug)]
pub struct Part {
    /// Its name.
    pub name: &'static str,
    /// Seeds the service (through the API) and measures its pages.
    pub run: fn(&Session, &Client, &tokio::runtime::Runtime, Sizes) -> Measured,
}

/// The parts, run in order on each engine.
pub const PARTS: &[Part] = &[
    Part {
        name: "inventory lists",
        run: inventory_lists,
    },
    Part {
        name: "boot board",
        run: boot_board,
    },
];

/// Runs the benchmark; `smoke` makes it small.
pub fn run(smoke: bool) -> Result<()> {
    let sizes = if smoke {
        Sizes {
            systems: 300,
            rounds: 3,
            nodes: 50,
        }
    } else {
        Sizes {
            systems: 10_000,
            rounds: 15,
            nodes: 1_000,
        }
    };
    let bin = build(&["mprov-control"], smoke)?;
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    // `MPROV_BENCH_ENGINES=sqlite` (a comma list) runs only those engines.
    let only = std::env::var("MPROV_BENCH_ENGINES").unwrap_or_default();
    let wanted = |e: &str| only.is_empty() || only.split(',').any(|o| o.trim() == e);
    let mut figures = Vec::new();
    if wanted("sqlite") {
        figures.extend(engine_run(&bin, dir.path(), "sqlite", None, sizes)?);
    }
    if wanted("mariadb") {
        let maria = MariaDb::start()?;
        maria.query("CREATE DATABASE bench")?;
        let url = maria
            .url()
            .rsplit_once('/')
            .map(|(base, _)| format!("{base}/bench"))
            .context("url")?;
        figures.extend(engine_run(&bin, dir.path(), "mariadb", Some(url), sizes)?);
    }
    if wanted("postgres") {
        let pg = Postgres::start()?;
        pg.query("CREATE DATABASE bench")?;
        let url = pg
            .url()
            .rsplit_once('/')
            .map(|(base, _)| format!("{base}/bench"))
            .context("url")?;
        figures.extend(engine_run(&bin, dir.path(), "postgres", Some(url), sizes)?);
    }
    let rows: Vec<Vec<String>> = figures
        .iter()
        .map(|f| {
            vec![
                f.engine.to_owned(),
                f.page.clone(),
                format!("{:.1} ms", f.server.as_secs_f64() * 1000.0),
                format!("{:.1} ms", f.round_trip.as_secs_f64() * 1000.0),
                format!("{:.1} ms", f.cpu.as_secs_f64() * 1000.0),
                f.statements.to_string(),
            ]
        })
        .collect();
    println!(
        "{}",
        markdown_table(
            &format!(
                "pages: admin list pages with {} systems (median of {}); no incumbent (the original's Django admin is not installed here), figures are absolute; goal: under {} ms a page",
                sizes.systems,
                sizes.rounds,
                GOAL.as_millis()
            ),
            &[
                "engine",
                "page",
                "server time",
                "round trip",
                "server CPU / request",
                "statements"
            ],
            &rows,
        )
    );
    let slow: Vec<String> = figures
        .iter()
        .filter(|f| f.server > GOAL)
        .map(|f| format!("{} {}", f.engine, f.page))
        .collect();
    if !slow.is_empty() && !smoke {
        println!("over the {} ms goal: {}", GOAL.as_millis(), slow.join(", "));
    }
    Ok(())
}

fn engine_run(
    bin: &Path,
    dir: &Path,
    engine: &'static str,
    url: Option<String>,
    sizes: Sizes,
) -> Result<Vec<Figure>> {
    let control = Control::start(bin, &dir.join(engine), url.as_deref())?;
    let key = control.api_key()?;
    let client = Client::new(&control.http, Auth::ApiKey(key))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let addr = control
        .http
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let session = Session::sign_in(&addr, control.pid, "admin", SUPERUSER_PASSWORD)?;
    let mut out = Vec::new();
    for part in PARTS {
        for (page, s) in (part.run)(&session, &client, &rt, sizes)? {
            out.push(Figure {
                engine,
                page: format!("{}: {page}", part.name),
                server: s.server,
                round_trip: s.round_trip,
                cpu: s.cpu,
                statements: s.statements,
            });
        }
    }
    control.stop()?;
    Ok(out)
}

/// One page's measurements.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    server: Duration,
    round_trip: Duration,
    cpu: Duration,
    statements: u64,
}

/// A signed-in session of the admin pages, over plain HTTP/1.1.
#[derive(Debug)]
pub struct Session {
    addr: String,
    pid: u32,
    cookie: String,
}

/// An answer: status, headers (lowercase names) and body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn exchange(addr: &str, head: &str, body: &str) -> Result<Answer> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "{head}Host: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (top, body) = text.split_once("\r\n\r\n").context("no header end")?;
    let mut lines = top.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .context("no status")?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}

fn hidden(body: &str, name: &str) -> Result<String> {
    let marker = format!("name=\"{name}\" value=\"");
    let at = body.find(&marker).context("no hidden field")? + marker.len();
    Ok(body[at..at + body[at..].find('"').context("quote")?].to_owned())
}

fn form(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

impl Session {
    fn sign_in(addr: &str, pid: u32, user: &str, password: &str) -> Result<Session> {
        let page = exchange(addr, "GET /admin/signin HTTP/1.1\r\n", "")?;
        let csrf = hidden(&page.body, "csrf")?;
        let body = form(&[("csrf", &csrf), ("username", user), ("password", password)]);
        let done = exchange(
            addr,
            &format!(
                "POST /admin/signin HTTP/1.1\r\nCookie: mprov_signin={csrf}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            ),
            &body,
        )?;
        let cookie = done
            .headers
            .iter()
            .filter(|(k, _)| k == "set-cookie")
            .find_map(|(_, v)| v.strip_prefix("mprov_session="))
            .and_then(|v| v.split(';').next())
            .with_context(|| format!("no session: {} {}", done.status, done.body))?;
        Ok(Session {
            addr: addr.to_owned(),
            pid,
            cookie: format!("mprov_session={cookie}"),
        })
    }

    fn get(&self, path: &str) -> Result<Answer> {
        let a = exchange(
            &self.addr,
            &format!("GET {path} HTTP/1.1\r\nCookie: {}\r\n", self.cookie),
            "",
        )?;
        if a.status != 200 {
            bail!("GET {path}: {} {}", a.status, a.body);
        }
        Ok(a)
    }

    /// `rounds` requests of `path`: the medians and the statements.
    pub fn measure(&self, path: &str, rounds: usize) -> Result<Sample> {
        let (mut server, mut trip, mut statements) = (Vec::new(), Vec::new(), Vec::new());
        let cpu0 = cpu_time(self.pid)?;
        for _ in 0..rounds {
            let t0 = Instant::now();
            let a = self.get(path)?;
            trip.push(t0.elapsed());
            let timing = a.header("server-timing").context("no Server-Timing")?;
            let ms: f64 = timing
                .split("dur=")
                .nth(1)
                .and_then(|r| r.split(',').next())
                .and_then(|r| r.parse().ok())
                .context("no dur")?;
            server.push(Duration::try_from_secs_f64(ms / 1000.0).context("a negative time")?);
            let n: u64 = timing
                .split("desc=\"")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .and_then(|r| r.parse().ok())
                .context("no statements")?;
            statements.push(n);
        }
        let cpu = (cpu_time(self.pid)? - cpu0) / rounds.max(1) as u32;
        server.sort();
        trip.sort();
        statements.sort_unstable();
        Ok(Sample {
            server: server[server.len() / 2],
            round_trip: trip[trip.len() / 2],
            cpu,
            statements: statements[statements.len() - 1],
        })
    }
}

/// The next page's link on a list page.
fn next_link(body: &str) -> Result<String> {
    let end = body.find("\" rel=\"next\"").context("no next link")?;
    let start = body[..end].rfind("href=\"").context("href")? + "href=\"".len();
    Ok(body[start..end].replace("&amp;", "&"))
}

fn inventory_lists(
    s: &Session,
    client: &Client,
    rt: &tokio::runtime::Runtime,
    sizes: Sizes,
) -> Measured {
    rt.block_on(async {
        for g in ["compute", "rack1", "rack2"] {
            client.create("groups", &json!({"slug": g})).await?;
        }
        let rows: Vec<Value> = (0..sizes.systems)
            .map(|i| {
                json!({
                    "hostname": format!("n{i:05}"),
                    "groups": ["compute", if i.is_multiple_of(2) { "rack1" } else { "rack2" }],
                })
            })
            .collect();
        for chunk in rows.chunks(2_000) {
            client.bulk_create("systems", chunk).await?;
        }
        anyhow::Ok(())
    })?;
    let mut out = Vec::new();
    let first = s.get("/admin/systems/")?;
    out.push((
        "first page".to_owned(),
        s.measure("/admin/systems/", sizes.rounds)?,
    ));
    // Deep: follow the keyset links to the middle of the list.
    let mut path = format!("/admin/systems/{}", next_link(&first.body)?);
    let hops = (sizes.systems / 50 / 2).max(1);
    for _ in 1..hops {
        path = format!("/admin/systems/{}", next_link(&s.get(&path)?.body)?);
    }
    ensure!(path.contains("cursor="), "{path}");
    out.push((
        format!("page {} (keyset)", hops + 1),
        s.measure(&path, sizes.rounds)?,
    ));
    out.push((
        "search q=n0042".to_owned(),
        s.measure("/admin/systems/?q=n0042", sizes.rounds)?,
    ));
    out.push((
        "sorted -hostname, in rack2".to_owned(),
        s.measure("/admin/systems/?sort=-hostname&groups=rack2", sizes.rounds)?,
    ));
    out.push((
        "groups (member counts)".to_owned(),
        s.measure("/admin/groups/", sizes.rounds)?,
    ));
    out.push((
        "group members page".to_owned(),
        s.measure("/admin/groups/rack1/systems/?aq=n00", sizes.rounds)?,
    ));
    Ok(out)
}

/// Live feeds that watch the board while the nodes change.
pub const FEED_CLIENTS: usize = 2;
/// Boot events in flight at once while the nodes report.
const IN_FLIGHT: usize = 64;
/// How long a feed waits for every change to show.
const FEED_WAIT: Duration = Duration::from_secs(120);

/// One server-sent event: when it arrived, its name, its data.
struct FeedEvent {
    at: Instant,
    name: String,
    data: String,
}

/// Follows `/admin/board/events` over HTTP/1.0 (so the body is the bare
/// stream, not chunked), calling `seen` with each event until it returns
/// true or `wait` passes; every event, in order.
fn follow_feed(
    addr: &str,
    cookie: &str,
    wait: Duration,
    mut seen: impl FnMut(&FeedEvent) -> bool,
) -> Result<Vec<FeedEvent>> {
    use std::io::BufRead as _;
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    write!(
        s,
        "GET /admin/board/events?by=group HTTP/1.0\r\nHost: {addr}\r\nCookie: {cookie}\r\nAccept: text/event-stream\r\n\r\n"
    )?;
    let deadline = Instant::now() + wait;
    let mut r = std::io::BufReader::new(s);
    let (mut line, mut head_done) = (String::new(), false);
    let (mut name, mut data) = (String::new(), String::new());
    let mut out = Vec::new();
    while Instant::now() < deadline {
        match r.read_line(&mut line) {
            Ok(0) => bail!("the feed closed"),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        let l = line.trim_end_matches(['\r', '\n']).to_owned();
        line.clear();
        if !head_done {
            if l.starts_with("HTTP/") {
                ensure!(l.contains(" 200"), "the feed answered {l}");
            }
            head_done = l.is_empty();
            continue;
        }
        if let Some(v) = l.strip_prefix("event:") {
            name = v.trim().to_owned();
        } else if let Some(v) = l.strip_prefix("data:") {
            data.push_str(v.trim_start());
        } else if l.is_empty() && !data.is_empty() {
            let ev = FeedEvent {
                at: Instant::now(),
                name: std::mem::take(&mut name),
                data: std::mem::take(&mut data),
            };
            let done = seen(&ev);
            out.push(ev);
            if done {
                return Ok(out);
            }
        }
    }
    bail!("the feed did not show every change within {wait:?}")
}

/// The hosts of a feed message whose class has `state` (`s-ready`).
fn hosts_in(data: &str, state: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
    v["cells"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["class"]
                .as_str()
                .is_some_and(|k| k.split(' ').any(|w| w == state))
        })
        .filter_map(|c| c["host"].as_str().map(str::to_owned))
        .collect()
}

fn boot_board(
    s: &Session,
    client: &Client,
    rt: &tokio::runtime::Runtime,
    sizes: Sizes,
) -> Measured {
    use mprov_api::boot::{BootEventReport, BootPhase};
    let n = sizes.nodes;
    let hosts: Vec<String> = (0..n).map(|i| format!("b{i:04}")).collect();
    rt.block_on(async {
        client.create("groups", &json!({"slug": "board"})).await?;
        let rows: Vec<Value> = hosts
            .iter()
            .map(|h| json!({"hostname": h, "groups": ["board"]}))
            .collect();
        for chunk in rows.chunks(2_000) {
            client.bulk_create("systems", chunk).await?;
        }
        anyhow::Ok(())
    })?;
    let mut out = Vec::new();
    out.push((
        format!("board page, {} systems", sizes.systems + n),
        s.measure("/admin/board/", sizes.rounds)?,
    ));

    // The feeds connect (each first gets its snapshot), then every node
    // reports three steps, each step from all of them at once.
    let mut feeds = Vec::new();
    for _ in 0..FEED_CLIENTS {
        let (addr, cookie) = (s.addr.clone(), s.cookie.clone());
        let want: std::collections::HashSet<String> = hosts.iter().cloned().collect();
        feeds.push(std::thread::spawn(move || {
            let mut ready = std::collections::HashSet::new();
            follow_feed(&addr, &cookie, FEED_WAIT, |ev| {
                if ev.name == "update" || ev.name == "snapshot" {
                    ready.extend(
                        hosts_in(&ev.data, "s-ready")
                            .into_iter()
                            .filter(|h| want.contains(h)),
                    );
                }
                ready.len() == want.len()
            })
        }));
    }
    // Let the feeds take their snapshots first.
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    rt.block_on(async {
        let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
        for phase in [
            BootPhase::DhcpOffered,
            BootPhase::KernelFetched,
            BootPhase::Ready,
        ] {
            let mut tasks = tokio::task::JoinSet::new();
            for h in &hosts {
                let (client, limit) = (client.clone(), limit.clone());
                let report = BootEventReport {
                    phase,
                    mac: None,
                    system: Some(h.clone()),
                    ip: None,
                    detail: "bench".into(),
                };
                tasks.spawn(async move {
                    let _slot = limit.acquire_owned().await?;
                    client.report_boot_event(&report).await?;
                    anyhow::Ok(())
                });
            }
            while let Some(r) = tasks.join_next().await {
                r??;
            }
        }
        anyhow::Ok(())
    })?;
    let posted = started.elapsed();
    let mut lines = Vec::new();
    for (i, f) in feeds.into_iter().enumerate() {
        let events = f.join().map_err(|_| anyhow::anyhow!("a feed panicked"))??;
        let updates: Vec<&FeedEvent> = events
            .iter()
            .filter(|e| e.name == "update" && e.at >= started)
            .collect();
        let last = events
            .last()
            .map_or(Duration::ZERO, |e| e.at.saturating_duration_since(started));
        let mut most = 0;
        for (j, u) in updates.iter().enumerate() {
            let within = updates[j..]
                .iter()
                .take_while(|v| v.at.duration_since(u.at) < Duration::from_secs(1))
                .count();
            most = most.max(within);
        }
        let gap = updates
            .windows(2)
            .map(|w| w[1].at.duration_since(w[0].at))
            .min()
            .map_or_else(
                || "none (fewer than two)".to_owned(),
                |g| format!("{:.2} s", g.as_secs_f64()),
            );
        let per_s = updates.len() as f64 / last.as_secs_f64().max(0.001);
        lines.push(format!(
            "feed {}: {} updates in {:.1} s ({per_s:.2}/s), at most {most} in any second, shortest gap {gap}, every change shown {:.1} s after the first report",
            i + 1,
            updates.len(),
            last.as_secs_f64(),
            last.as_secs_f64(),
        ));
    }
    // A reconnect: the time until its full snapshot has arrived.
    let mut snaps = Vec::new();
    for _ in 0..sizes.rounds.min(5) {
        let t0 = Instant::now();
        let first = follow_feed(&s.addr, &s.cookie, FEED_WAIT, |ev| ev.name == "snapshot")?;
        ensure!(first.len() == 1, "the first event is the snapshot");
        snaps.push(t0.elapsed());
    }
    snaps.sort();
    let snap = snaps[snaps.len() / 2];
    println!(
        "boot board: {n} nodes x 3 steps reported at once ({} events in {:.1} s, {IN_FLIGHT} in flight), {FEED_CLIENTS} live feeds:\n  {}\n  snapshot on reconnect ({} systems): {:.1} ms (median of {})",
        n * 3,
        posted.as_secs_f64(),
        lines.join("\n  "),
        sizes.systems + n,
        snap.as_secs_f64() * 1000.0,
        snaps.len()
    );
    out.push((
        format!(
            "board page after the changes, {} systems",
            sizes.systems + n
        ),
        s.measure("/admin/board/", sizes.rounds)?,
    ));
    Ok(out)
}
