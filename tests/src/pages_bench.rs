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
//! The parts are [`PARTS`]: each measures some pages of a running service;
//! another part (the boot board) is one more entry.

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
pub const PARTS: &[Part] = &[Part {
    name: "inventory lists",
    run: inventory_lists,
}];

/// Runs the benchmark; `smoke` makes it small.
pub fn run(smoke: bool) -> Result<()> {
    let sizes = if smoke {
        Sizes {
            systems: 300,
            rounds: 3,
        }
    } else {
        Sizes {
            systems: 10_000,
            rounds: 15,
        }
    };
    let bin = build(&["mprov-control"], smoke)?;
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let mut figures = engine_run(&bin, dir.path(), "sqlite", None, sizes)?;
    {
        let maria = MariaDb::start()?;
        maria.query("CREATE DATABASE bench")?;
        let url = maria
            .url()
            .rsplit_once('/')
            .map(|(base, _)| format!("{base}/bench"))
            .context("url")?;
        figures.extend(engine_run(&bin, dir.path(), "mariadb", Some(url), sizes)?);
    }
    {
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
