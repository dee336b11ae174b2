//! The backup benchmark (`cargo xtask bench backup`): how long `mprov-control
//! backup` and `mprov-control restore` take for the populated install
//! described below, on SQLite, MariaDB and PostgreSQL, side by side with the
//! original's backup, a database dump of the same data (`sqlite3 .backup` /
//! `.restore`, `mariadb-dump` / `mariadb <dump`, `pg_dump` / `psql -f dump`).
//!
//! The install: 70,000 systems in one group (a group's members are systems),
//! 10,000 of them with two NICs and a BMC, five scripts on every layer, three
//! API keys, an admin user, a credential and a job server. It is written
//! into SQLite in one transaction by the `sqlite3` client (after `mprov-control
//! migrate`), so it is ready in seconds; MariaDB and PostgreSQL get it by our
//! restore of the SQLite backup, which is the timed restore of those engines.
//! The BMC passwords are opaque text of a sealed secret's length (the
//! benchmark does not link the control service's key code).
//!
//! Timed: wall time of each command, the CPU time of the command itself (its
//! rusage as a waited child) and of the database server (MariaDB's process,
//! PostgreSQL's postmaster with its exited backends). The ratio is our time /
//! the dump's time. `--smoke` uses 700 systems and the debug build.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::control::build;
use crate::db::{MariaDb, PASSWORD, Postgres, USER};

/// The secret key both commands use, so the restored BMC passwords open.
const KEY: &str = "bench secret key";

/// Sizes of a run.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Systems in all, every one in the group.
    members: usize,
    /// Systems with two NICs and a BMC.
    full: usize,
}

/// One command's cost.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    wall: Duration,
    tool_cpu: Duration,
    server_cpu: Duration,
}

/// One engine's figures.
#[derive(Debug)]
struct Figures {
    engine: &'static str,
    backup: Cost,
    dump: Cost,
    restore: Cost,
    dump_restore: Cost,
    archive_bytes: u64,
    dump_bytes: u64,
}

/// Runs the benchmark; `smoke` makes it small.
pub fn run(smoke: bool) -> Result<()> {
    let sizes = if smoke {
        Sizes {
            members: 700,
            full: 100,
        }
    } else {
        Sizes {
            members: 70_000,
            full: 10_000,
        }
    };
    let bin = build(&["mprov-control"], smoke)?.join("mprov-control");
    for tool in ["sqlite3", "mariadb-dump", "mariadb", "pg_dump", "psql"] {
        which(tool)?;
    }
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    let sqlite_url = |name: &str| format!("sqlite://{}?mode=rwc", root.join(name).display());

    // The populated install, in SQLite.
    let src = sqlite_url("src.sqlite3");
    control(&bin, root, &src, &["migrate"])?;
    control(&bin, root, &src, &["superuser", "create", "admin"])?;
    for i in 0..3 {
        control(&bin, root, &src, &["apikey", "create", &format!("key {i}")])?;
    }
    let sql = populate_sql(sizes);
    let mut sqlite3 = Command::new("sqlite3");
    sqlite3
        .arg(root.join("src.sqlite3"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
    let mut child = sqlite3.spawn().context("sqlite3")?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().context("stdin")?;
        stdin.write_all(sql.as_bytes())?;
    }
    ensure!(
        child.wait()?.success(),
        "sqlite3 could not load the install"
    );
    let rows = total_rows_sqlite(&root.join("src.sqlite3"))?;

    let mut results = Vec::new();
    // SQLite.
    {
        let (backup, archive) = backup(&bin, root, &src, None, "sqlite")?;
        let dump_file = root.join("dump.sqlite3");
        let dump = timed(
            Command::new("sqlite3")
                .arg(root.join("src.sqlite3"))
                .arg(format!(".backup '{}'", dump_file.display())),
            None,
        )?;
        let restore = restore(
            &bin,
            root,
            &sqlite_url("restored.sqlite3"),
            &archive,
            None,
            rows,
        )?;
        let dump_restore = timed(
            Command::new("sqlite3")
                .arg(root.join("dump-restored.sqlite3"))
                .arg(format!(".restore '{}'", dump_file.display())),
            None,
        )?;
        results.push(Figures {
            engine: "SQLite",
            backup,
            dump,
            restore,
            dump_restore,
            archive_bytes: std::fs::metadata(&archive)?.len(),
            dump_bytes: std::fs::metadata(&dump_file)?.len(),
        });
        // MariaDB and PostgreSQL restore this archive.
        std::fs::rename(&archive, root.join("from-sqlite.tar"))?;
    }
    let archive = root.join("from-sqlite.tar");
    {
        let maria = MariaDb::start()?;
        maria.query("CREATE DATABASE bench")?;
        maria.query("CREATE DATABASE bench2")?;
        let url = format!("mysql://{USER}:{PASSWORD}@127.0.0.1:{}/bench", maria.port());
        let pid = maria.pid();
        let restore = restore(&bin, root, &url, &archive, pid, rows)?;
        let (backup, ours) = backup(&bin, root, &url, pid, "mariadb")?;
        let dump_file = root.join("dump-mariadb.sql");
        let port = maria.port().to_string();
        let client = |cmd: &mut Command| {
            cmd.args(["--host=127.0.0.1", "--port", &port, "--user", USER])
                .env("MYSQL_PWD", PASSWORD);
        };
        let mut dump_cmd = Command::new("mariadb-dump");
        client(&mut dump_cmd);
        dump_cmd
            .args(["--single-transaction", "bench"])
            .stdout(std::fs::File::create(&dump_file)?);
        let dump = timed(&mut dump_cmd, pid)?;
        let mut load = Command::new("mariadb");
        client(&mut load);
        load.arg("bench2").stdin(std::fs::File::open(&dump_file)?);
        let dump_restore = timed(&mut load, pid)?;
        results.push(Figures {
            engine: "MariaDB",
            backup,
            dump,
            restore,
            dump_restore,
            archive_bytes: std::fs::metadata(&ours)?.len(),
            dump_bytes: std::fs::metadata(&dump_file)?.len(),
        });
        maria.stop()?;
    }
    {
        let pg = Postgres::start()?;
        pg.query("CREATE DATABASE bench")?;
        pg.query("CREATE DATABASE bench2")?;
        let url = format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{}/bench", pg.port());
        let pid = pg.pid();
        let restore = restore(&bin, root, &url, &archive, pid, rows)?;
        let (backup, ours) = backup(&bin, root, &url, pid, "postgres")?;
        let dump_file = root.join("dump-postgres.sql");
        let port = pg.port().to_string();
        let dump = timed(
            Command::new("pg_dump")
                .args(["-h", "127.0.0.1", "-p", &port, "-U", USER, "-d", "bench"])
                .arg("-f")
                .arg(&dump_file)
                .env("PGPASSWORD", PASSWORD),
            pid,
        )?;
        let dump_restore = timed(
            Command::new("psql")
                .args(["-h", "127.0.0.1", "-p", &port, "-U", USER, "-d", "bench2"])
                .args(["-q", "-v", "ON_ERROR_STOP=1", "-f"])
                .arg(&dump_file)
                .env("PGPASSWORD", PASSWORD)
                .stdout(Stdio::null()),
            pid,
        )?;
        results.push(Figures {
            engine: "PostgreSQL",
            backup,
            dump,
            restore,
            dump_restore,
            archive_bytes: std::fs::metadata(&ours)?.len(),
            dump_bytes: std::fs::metadata(&dump_file)?.len(),
        });
        pg.stop()?;
    }
    println!("{}", table(&results, sizes, rows));
    Ok(())
}

/// `mprov-control ARGS` with its folders under `root` and its database at
/// `url`; fails with its output unless it succeeds.
fn control(bin: &Path, root: &Path, url: &str, args: &[&str]) -> Result<String> {
    let out = command(bin, root, url, args).output()?;
    if !out.status.success() {
        bail!(
            "mprov-control {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn command(bin: &Path, root: &Path, url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env("MPROV_CONFIG_DIR", root.join("etc"))
        .env("MPROV_STATE_DIR", root.join("var"))
        .env("MPROV_DATABASE_URL", url)
        .env("SECRET_KEY", KEY)
        .env("MPROV_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// Times `mprov-control backup` into a folder of its own; the archive.
fn backup(
    bin: &Path,
    root: &Path,
    url: &str,
    server: Option<u32>,
    name: &str,
) -> Result<(Cost, PathBuf)> {
    let out = root.join(format!("backups-{name}"));
    let cost = timed(
        &mut command(
            bin,
            root,
            url,
            &["backup", "--output-dir", out.to_str().context("path")?],
        ),
        server,
    )?;
    let archive = std::fs::read_dir(&out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "tar"))
        .context("backup wrote no archive")?;
    Ok((cost, archive))
}

/// Times `mprov-control restore` of `archive` into `url`, and checks that
/// every row arrived.
fn restore(
    bin: &Path,
    root: &Path,
    url: &str,
    archive: &Path,
    server: Option<u32>,
    rows: u64,
) -> Result<Cost> {
    let mut cmd = command(
        bin,
        root,
        url,
        &["restore", archive.to_str().context("path")?],
    );
    let log = root.join("restore.out");
    cmd.stdout(std::fs::File::create(&log)?);
    let cost = timed(&mut cmd, server)?;
    let said = std::fs::read_to_string(&log)?;
    let restored: u64 = said
        .strip_prefix("restored ")
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("unexpected restore output: {said}"))?;
    ensure!(
        restored == rows,
        "restored {restored} rows, the install has {rows}"
    );
    Ok(cost)
}

/// Runs `cmd` to success: its wall time, its own CPU time, and the server's.
fn timed(cmd: &mut Command, server: Option<u32>) -> Result<Cost> {
    let server_before = server.map(server_cpu).transpose()?.unwrap_or_default();
    let children_before = children_cpu()?;
    let start = Instant::now();
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    let wall = start.elapsed();
    ensure!(status.success(), "{cmd:?} failed: {status}");
    let tool_cpu = children_cpu()?.saturating_sub(children_before);
    let server_cpu = server
        .map(server_cpu)
        .transpose()?
        .unwrap_or_default()
        .saturating_sub(server_before);
    Ok(Cost {
        wall,
        tool_cpu,
        server_cpu,
    })
}

/// Fields of `/proc/<pid>/stat` after the command name, in clock ticks of
/// 1/100 s: (utime + stime, cutime + cstime).
fn stat_ticks(pid: &str) -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed stat")?;
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    ensure!(f.len() == 4, "malformed stat");
    Ok((f[0] + f[1], f[2] + f[3]))
}

/// The CPU time of our waited-for children.
fn children_cpu() -> Result<Duration> {
    Ok(Duration::from_millis(stat_ticks("self")?.1 * 10))
}

/// A server's CPU time with that of its exited children (PostgreSQL's
/// backends).
fn server_cpu(pid: u32) -> Result<Duration> {
    let (own, children) = stat_ticks(&pid.to_string())?;
    Ok(Duration::from_millis((own + children) * 10))
}

fn which(tool: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    ensure!(
        found,
        "{tool} is missing: install the Debian packages sqlite3, mariadb-client and postgresql-client (cargo xtask test does)"
    );
    Ok(())
}

/// The rows of every table of a SQLite database (without sqlx's own).
fn total_rows_sqlite(db: &Path) -> Result<u64> {
    let out = Command::new("sqlite3")
        .arg(db)
        .arg("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> '_sqlx_migrations'")
        .output()?;
    ensure!(out.status.success(), "sqlite3 could not list the tables");
    let tables = String::from_utf8(out.stdout)?;
    let query: Vec<String> = tables
        .lines()
        .map(|t| format!("SELECT COUNT(*) FROM \"{t}\""))
        .collect();
    let out = Command::new("sqlite3")
        .arg(db)
        .arg(query.join(" UNION ALL "))
        .output()?;
    ensure!(out.status.success(), "sqlite3 could not count the rows");
    Ok(String::from_utf8(out.stdout)?
        .lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .sum())
}

/// The install as SQL for `sqlite3`, in one transaction.
fn populate_sql(sizes: Sizes) -> String {
    const TS: &str = "'2026-01-01T00:00:00Z'";
    let mut sql = String::from("BEGIN;\n");
    for i in 1..=5 {
        let _ = writeln!(
            sql,
            "INSERT INTO scripts (id, slug, name, script_type, version, content, created_at, updated_at) VALUES ({i}, 's{i}', 'Script {i}', '{}', 1, '#!/bin/sh\n# ünïcode, ''quotes''\necho {i} > /tmp/x\n', {TS}, {TS});",
            if i % 2 == 0 { "post-boot" } else { "image-gen" }
        );
    }
    let _ = writeln!(
        sql,
        "INSERT INTO networks (id, slug, name, net_type, vlan, subnet, netmask, domain, isdhcp, managedns, isbootable) VALUES (1, 'prov', 'prov', 'provisioning', 0, '10.0.0.0', 16, 'cluster', 1, 1, 1);"
    );
    let _ = writeln!(
        sql,
        "INSERT INTO system_images (id, slug, version, needs_rebuild, install_kernel_cmdline, initial_mods, tmpfs_root_size, prov_interface, config_params, created_at, updated_at) VALUES (1, 'compute', 1, 0, '', '', 0, '', '', {TS}, {TS});\n\
         INSERT INTO image_scripts (image_id, script_id) VALUES (1, 2), (1, 3);\n\
         INSERT INTO jobservers (id, name, addresses, port, modules, load_avg, created_at, updated_at) VALUES (1, 'js1', '[\"10.0.0.2\"]', 8081, '[\"dhcp\",\"dns\"]', 0.25, {TS}, {TS});\n\
         INSERT INTO credentials (serial, kind, identity, not_after, created_at) VALUES ('0a1b2c', 'jobserver', 'js1', {TS}, {TS});\n\
         INSERT INTO system_groups (id, slug, name, priority, install_kernel_cmdline, initial_mods, tmpfs_root_size, prov_interface, config_params, created_at, updated_at) VALUES (1, 'everyone', 'everyone', 3, '', '', 0, '', '', {TS}, {TS});\n\
         INSERT INTO group_scripts (group_id, script_id) VALUES (1, 4);"
    );
    let batch = |sql: &mut String, head: &str, n: usize, row: &dyn Fn(usize) -> String| {
        for start in (0..n).step_by(500) {
            let rows: Vec<String> = (start..n.min(start + 500)).map(row).collect();
            let _ = writeln!(sql, "{head} VALUES {};", rows.join(", "));
        }
    };
    batch(
        &mut sql,
        "INSERT INTO systems (id, hostname, image_id, install_kernel_cmdline, initial_mods, tmpfs_root_size, prov_interface, config_params, stateful, netboot, created_at, updated_at)",
        sizes.members,
        &|i| {
            format!(
                "({}, 'n{i:05}', 1, 'console=ttyS0 n={i}', '', {}, 'eth0', 'rack: {}\n', {}, {}, {TS}, {TS})",
                i + 1,
                i * 1024,
                i / 40,
                u8::from(i % 7 == 0),
                u8::from(i % 3 != 0)
            )
        },
    );
    batch(
        &mut sql,
        "INSERT INTO group_members (group_id, system_id)",
        sizes.members,
        &|i| format!("(1, {})", i + 1),
    );
    batch(
        &mut sql,
        "INSERT INTO network_interfaces (system_id, name, mac, ipv4, aliases, mtu, bootable, is_gateway, network_id)",
        sizes.full * 2,
        &|k| {
            let (n, nic) = (k / 2, k % 2);
            format!(
                "({}, 'eth{nic}', '52:54:{nic:02x}:{:02x}:{:02x}:{:02x}', {}, '', 1500, {}, 0, 1)",
                n + 1,
                n >> 16 & 255,
                n >> 8 & 255,
                n & 255,
                if nic == 0 {
                    format!("'10.0.{}.{}'", n / 250, n % 250 + 1)
                } else {
                    "NULL".into()
                },
                u8::from(nic == 0)
            )
        },
    );
    batch(
        &mut sql,
        "INSERT INTO bmcs (system_id, ipv4, username, password, vlan)",
        sizes.full,
        &|n| {
            format!(
                "({}, '10.1.{}.{}', 'root', 'v1:{:064x}', 0)",
                n + 1,
                n / 250,
                n % 250 + 1,
                n * 0x9e37_79b9
            )
        },
    );
    sql.push_str("INSERT INTO system_scripts (system_id, script_id) VALUES (1, 5);\nUPDATE inventory_revision SET revision = 1000 WHERE id = 1;\nCOMMIT;\n");
    sql
}

fn table(results: &[Figures], sizes: Sizes, rows: u64) -> String {
    let secs = |d: Duration| d.as_secs_f64();
    let ratio = |a: Duration, b: Duration| {
        if b.is_zero() {
            "-".to_owned()
        } else {
            format!("{:.1}", a.as_secs_f64() / b.as_secs_f64())
        }
    };
    let cpu = |c: &Cost| format!("{:.2} + {:.2} s", secs(c.tool_cpu), secs(c.server_cpu));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "backup: the populated install ({} systems in one group, {} with 2 NICs and a BMC; {rows} rows): mprov-control backup / restore vs the engine's dump (CPU: the command + the database server)",
        sizes.members, sizes.full
    );
    let _ = writeln!(
        out,
        "| engine | mprov backup | CPU | dump | CPU | ratio | archive / dump size | mprov restore | CPU | dump restore | CPU | ratio |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for f in results {
        let _ = writeln!(
            out,
            "| {} | {:.2} s | {} | {:.2} s | {} | {} | {:.0} / {:.0} kB | {:.2} s | {} | {:.2} s | {} | {} |",
            f.engine,
            secs(f.backup.wall),
            cpu(&f.backup),
            secs(f.dump.wall),
            cpu(&f.dump),
            ratio(f.backup.wall, f.dump.wall),
            f.archive_bytes as f64 / 1e3,
            f.dump_bytes as f64 / 1e3,
            secs(f.restore.wall),
            cpu(&f.restore),
            secs(f.dump_restore.wall),
            cpu(&f.dump_restore),
            ratio(f.restore.wall, f.dump_restore.wall),
        );
    }
    out
}
