//! The inventory benchmark (`cargo xtask bench inventory`): how long `mash
//! import` takes for 1,000 systems with NICs, and how long a client takes to
//! page through 10,000 systems with their NICs and groups, on SQLite, MariaDB
//! and PostgreSQL, with the server's CPU time for each.
//!
//! Nothing incumbent can run here (the original is a Django site we do not
//! install), so the figures are absolute. Goals from the issue: under 5 s for
//! the import, under 1 s for the paging.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use mprov_api::client::{Auth, Client};
use serde_json::{Value, json};

use crate::control::{Control, build, cpu_time, markdown_table};
use crate::db::{MariaDb, Postgres};

/// Sizes of a run.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Systems present before the paging run.
    seeded: usize,
    /// Systems in the imported CSV.
    imported: usize,
    /// Paging runs; the best counts.
    rounds: usize,
}

/// One engine's figures.
#[derive(Debug)]
struct Figures {
    engine: &'static str,
    import: Duration,
    import_cpu: Duration,
    paging: Duration,
    paging_cpu: Duration,
    pages: usize,
    systems: usize,
}

/// Runs the benchmark; `smoke` makes it small.
pub fn run(smoke: bool) -> Result<()> {
    let sizes = if smoke {
        Sizes {
            seeded: 400,
            imported: 100,
            rounds: 1,
        }
    } else {
        Sizes {
            seeded: 9_000,
            imported: 1_000,
            rounds: 5,
        }
    };
    let bin = build(&["mprov-control", "mash"], smoke)?;

    let mut results = Vec::new();
    let dir = tempfile::tempdir()?;
    // The service becomes the `mprov` user when started as root: it must
    // reach its folders.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    results.push(engine_run(&bin, dir.path(), "sqlite", None, sizes)?);
    {
        let maria = MariaDb::start()?;
        maria.query("CREATE DATABASE bench")?;
        let url = maria
            .url()
            .rsplit_once('/')
            .map(|(base, _)| format!("{base}/bench"))
            .context("url")?;
        results.push(engine_run(&bin, dir.path(), "mariadb", Some(url), sizes)?);
    }
    {
        let pg = Postgres::start()?;
        pg.query("CREATE DATABASE bench")?;
        let url = pg
            .url()
            .rsplit_once('/')
            .map(|(base, _)| format!("{base}/bench"))
            .context("url")?;
        results.push(engine_run(&bin, dir.path(), "postgres", Some(url), sizes)?);
    }
    println!("{}", table(&results, sizes));
    Ok(())
}

fn table(results: &[Figures], sizes: Sizes) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|f| {
            vec![
                f.engine.to_owned(),
                format!("{:.2} s", f.import.as_secs_f64()),
                format!("{:.2} s", f.import_cpu.as_secs_f64()),
                f.systems.to_string(),
                f.pages.to_string(),
                format!("{:.3} s", f.paging.as_secs_f64()),
                format!("{:.3} s", f.paging_cpu.as_secs_f64()),
            ]
        })
        .collect();
    markdown_table(
        &format!(
            "inventory: mash import of {} systems (1 NIC, 2 groups each); paging all systems with NICs and groups, 1,000 a page (best of {})",
            sizes.imported, sizes.rounds
        ),
        &[
            "engine",
            "import",
            "server CPU",
            "systems paged",
            "pages",
            "paging",
            "server CPU",
        ],
        &rows,
    )
}

fn engine_run(
    bin: &Path,
    dir: &Path,
    engine: &'static str,
    url: Option<String>,
    sizes: Sizes,
) -> Result<Figures> {
    let control = Control::start(bin, &dir.join(engine), url.as_deref())?;
    let (pid, home, key) = (control.pid, control.home.clone(), control.api_key()?);
    let base = control.http.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = Client::new(&base, Auth::ApiKey(key.clone()))?;

    // Seed: groups, then systems with a NIC and two groups each, in bulk.
    rt.block_on(async {
        for g in ["compute", "rack1", "rack2"] {
            client.create("groups", &json!({"slug": g})).await?;
        }
        let rows: Vec<Value> = (0..sizes.seeded).map(|i| system(i, "s")).collect();
        for chunk in rows.chunks(2_000) {
            client.bulk_create("systems", chunk).await?;
        }
        anyhow::Ok(())
    })?;

    // mash import of a CSV, a real client run end to end.
    let csv = home.join("import.csv");
    let mut text = String::from("hostname,groups,nic,mac,ipv4,bootable\n");
    for i in 0..sizes.imported {
        let _ = writeln!(
            text,
            "imp{i:05},compute;rack2,eth0,06:00:00:{:02x}:{:02x}:{:02x},10.200.{}.{},true",
            i >> 16 & 0xff,
            i >> 8 & 0xff,
            i & 0xff,
            i / 250,
            i % 250 + 1
        );
    }
    std::fs::write(&csv, text)?;
    let cpu0 = cpu_time(pid)?;
    let t0 = Instant::now();
    let out = Command::new(bin.join("mash"))
        .args(["import"])
        .arg(&csv)
        .env("MPROV_URL", &base)
        .env("MPROV_APIKEY", &key)
        .output()
        .context("running mash import")?;
    let import = t0.elapsed();
    let import_cpu = cpu_time(pid)? - cpu0;
    ensure!(
        out.status.success(),
        "mash import failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Paging through everything, as a client that mirrors the inventory would.
    let mut best = (Duration::MAX, Duration::ZERO, 0, 0);
    for _ in 0..sizes.rounds {
        let cpu0 = cpu_time(pid)?;
        let t0 = Instant::now();
        let (pages, systems) = rt.block_on(page_all(&client))?;
        let took = t0.elapsed();
        let cpu = cpu_time(pid)? - cpu0;
        if took < best.0 {
            best = (took, cpu, pages, systems);
        }
    }
    let want = sizes.seeded + sizes.imported + 1;
    ensure!(
        best.3 == want,
        "{engine}: paged {} systems, expected {want}",
        best.3
    );
    control.stop()?;
    Ok(Figures {
        engine,
        import,
        import_cpu,
        paging: best.0,
        paging_cpu: best.1,
        pages: best.2,
        systems: best.3,
    })
}

fn system(i: usize, prefix: &str) -> Value {
    json!({
        "hostname": format!("{prefix}{i:05}"),
        "groups": ["compute", if i.is_multiple_of(2) { "rack1" } else { "rack2" }],
        "nics": [{
            "name": "eth0",
            "mac": format!("02:00:00:{:02x}:{:02x}:{:02x}", i >> 16 & 0xff, i >> 8 & 0xff, i & 0xff),
            "ipv4": format!("10.{}.{}.{}", 100 + (i >> 16 & 0xff), i >> 8 & 0xff, i & 0xff),
            "bootable": true
        }]
    })
}

/// Pages through every system; the number of pages and of systems. Checks that
/// each has its NICs and groups embedded.
async fn page_all(client: &Client) -> Result<(usize, usize)> {
    let mut cursor: Option<String> = None;
    let (mut pages, mut systems) = (0, 0);
    loop {
        let mut q = vec![("limit", "1000".to_owned())];
        if let Some(c) = &cursor {
            q.push(("cursor", c.clone()));
        }
        let page = client.list("systems", &q).await?;
        pages += 1;
        for s in &page.items {
            ensure!(
                s["nics"].is_array() && s["groups"].is_array(),
                "no NICs or groups in {s}"
            );
        }
        systems += page.items.len();
        match page.next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    Ok((pages, systems))
}
