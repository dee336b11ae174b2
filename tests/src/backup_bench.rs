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
//! migrate`), so it is ready in seconds, and backed up once. On each engine
//! the timed steps are then: our restore of that archive into a new
//! database, our backup of that database, the engine's dump of it and the
//! load of that dump into another new database.
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

use crate::control::{build, markdown_table, stat_cpu};
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

/// What the benchmark needs of an engine: databases by name, and its own
/// dump and load of one.
trait Engine {
    /// Its name in the table.
    const NAME: &'static str;
    /// Makes the empty database `db` (SQLite makes it on first use).
    fn create(&self, _db: &str) -> Result<()> {
        Ok(())
    }
    /// mprov-control's URL of the database `db`.
    fn url(&self, db: &str) -> String;
    /// The database server's process, whose CPU time counts.
    fn server(&self) -> Option<u32>;
    /// The engine's own dump of `db` into `file`.
    fn dump(&self, db: &str, file: &Path) -> Result<Command>;
    /// The engine's own load of the dump `file` into the empty `db`.
    fn load(&self, db: &str, file: &Path) -> Result<Command>;
}

/// SQLite databases: files in a folder; `sqlite3 .backup` and `.restore`.
struct Sqlite(PathBuf);

impl Sqlite {
    fn file(&self, db: &str) -> PathBuf {
        self.0.join(format!("{db}.sqlite3"))
    }

    fn sqlite3(&self, db: &str, dot_command: &str, file: &Path) -> Command {
        let mut cmd = Command::new("sqlite3");
        cmd.arg(self.file(db))
            .arg(format!("{dot_command} '{}'", file.display()));
        cmd
    }
}

impl Engine for Sqlite {
    const NAME: &'static str = "SQLite";
    fn url(&self, db: &str) -> String {
        format!("sqlite://{}?mode=rwc", self.file(db).display())
    }
    fn server(&self) -> Option<u32> {
        None
    }
    fn dump(&self, db: &str, file: &Path) -> Result<Command> {
        Ok(self.sqlite3(db, ".backup", file))
    }
    fn load(&self, db: &str, file: &Path) -> Result<Command> {
        Ok(self.sqlite3(db, ".restore", file))
    }
}

/// A client of the MariaDB server on `db`.
fn mariadb_client(server: &MariaDb, tool: &str, db: &str) -> Command {
    let mut cmd = Command::new(tool);
    cmd.args(["--host=127.0.0.1", "--port", &server.port().to_string()])
        .args(["--user", USER, db])
        .env("MYSQL_PWD", PASSWORD);
    cmd
}

impl Engine for MariaDb {
    const NAME: &'static str = "MariaDB";
    fn create(&self, db: &str) -> Result<()> {
        self.query(&format!("CREATE DATABASE {db}")).map(drop)
    }
    fn url(&self, db: &str) -> String {
        format!("mysql://{USER}:{PASSWORD}@127.0.0.1:{}/{db}", self.port())
    }
    fn server(&self) -> Option<u32> {
        self.pid()
    }
    fn dump(&self, db: &str, file: &Path) -> Result<Command> {
        let mut cmd = mariadb_client(self, "mariadb-dump", db);
        cmd.arg("--single-transaction")
            .stdout(std::fs::File::create(file)?);
        Ok(cmd)
    }
    fn load(&self, db: &str, file: &Path) -> Result<Command> {
        let mut cmd = mariadb_client(self, "mariadb", db);
        cmd.stdin(std::fs::File::open(file)?);
        Ok(cmd)
    }
}

/// A client of the PostgreSQL server on `db`, with a file argument.
fn postgres_client(server: &Postgres, tool: &str, db: &str, file: &Path) -> Command {
    let mut cmd = Command::new(tool);
    cmd.args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args(["-U", USER, "-d", db, "-f"])
        .arg(file)
        .env("PGPASSWORD", PASSWORD);
    cmd
}

impl Engine for Postgres {
    const NAME: &'static str = "PostgreSQL";
    fn create(&self, db: &str) -> Result<()> {
        self.query(&format!("CREATE DATABASE {db}")).map(drop)
    }
    fn url(&self, db: &str) -> String {
        format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{db}",
            self.port()
        )
    }
    fn server(&self) -> Option<u32> {
        self.pid()
    }
    fn dump(&self, db: &str, file: &Path) -> Result<Command> {
        Ok(postgres_client(self, "pg_dump", db, file))
    }
    fn load(&self, db: &str, file: &Path) -> Result<Command> {
        let mut cmd = postgres_client(self, "psql", db, file);
        cmd.args(["-q", "-v", "ON_ERROR_STOP=1"])
            .stdout(Stdio::null());
        Ok(cmd)
    }
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

    // The populated install, in SQLite, and its archive, which every engine
    // restores.
    let files = Sqlite(root.join("sqlite"));
    std::fs::create_dir(&files.0)?;
    let src = files.url("src");
    control(&bin, root, &src, &["migrate"])?;
    control(&bin, root, &src, &["superuser", "create", "admin"])?;
    for i in 0..3 {
        control(&bin, root, &src, &["apikey", "create", &format!("key {i}")])?;
    }
    let mut sqlite3 = Command::new("sqlite3");
    sqlite3
        .arg(files.file("src"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
    let mut child = sqlite3.spawn().context("sqlite3")?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().context("stdin")?;
        stdin.write_all(populate_sql(sizes).as_bytes())?;
    }
    ensure!(
        child.wait()?.success(),
        "sqlite3 could not load the install"
    );
    let rows = total_rows_sqlite(&files.file("src"))?;
    let (_, archive) = backup(&bin, root, &src, None, "install")?;

    let results = vec![
        measure(&files, &bin, root, &archive, rows)?,
        {
            let maria = MariaDb::start()?;
            let figures = measure(&maria, &bin, root, &archive, rows)?;
            maria.stop()?;
            figures
        },
        {
            let pg = Postgres::start()?;
            let figures = measure(&pg, &bin, root, &archive, rows)?;
            pg.stop()?;
            figures
        },
    ];
    println!("{}", table(&results, sizes, rows));
    Ok(())
}

/// One engine's figures: our restore of `archive` into a new database, our
/// backup of it, and the engine's own dump of it and load of that dump into
/// another new database.
fn measure<E: Engine>(
    engine: &E,
    bin: &Path,
    root: &Path,
    archive: &Path,
    rows: u64,
) -> Result<Figures> {
    for db in ["bench", "bench2"] {
        engine.create(db)?;
    }
    let (url, server) = (engine.url("bench"), engine.server());
    let restore = restore(bin, root, &url, archive, server, rows)?;
    let (backup, ours) = backup(bin, root, &url, server, E::NAME)?;
    let dump_file = root.join(format!("dump-{}", E::NAME));
    let dump = timed(&mut engine.dump("bench", &dump_file)?, server)?;
    let dump_restore = timed(&mut engine.load("bench2", &dump_file)?, server)?;
    Ok(Figures {
        engine: E::NAME,
        backup,
        dump,
        restore,
        dump_restore,
        archive_bytes: std::fs::metadata(&ours)?.len(),
        dump_bytes: std::fs::metadata(&dump_file)?.len(),
    })
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
    let children_before = stat_cpu("self")?.1;
    let start = Instant::now();
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    let wall = start.elapsed();
    ensure!(status.success(), "{cmd:?} failed: {status}");
    let tool_cpu = stat_cpu("self")?.1.saturating_sub(children_before);
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

/// A server's CPU time with that of its exited children (PostgreSQL's
/// backends).
fn server_cpu(pid: u32) -> Result<Duration> {
    let (own, children) = stat_cpu(&pid.to_string())?;
    Ok(own + children)
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
    let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    let ratio = |a: Duration, b: Duration| {
        if b.is_zero() {
            "-".to_owned()
        } else {
            format!("{:.1}", a.as_secs_f64() / b.as_secs_f64())
        }
    };
    let cpu = |c: &Cost| {
        format!(
            "{:.2} + {:.2} s",
            c.tool_cpu.as_secs_f64(),
            c.server_cpu.as_secs_f64()
        )
    };
    let rows_out: Vec<Vec<String>> = results
        .iter()
        .map(|f| {
            vec![
                f.engine.to_owned(),
                secs(f.backup.wall),
                cpu(&f.backup),
                secs(f.dump.wall),
                cpu(&f.dump),
                ratio(f.backup.wall, f.dump.wall),
                format!(
                    "{:.0} / {:.0} kB",
                    f.archive_bytes as f64 / 1e3,
                    f.dump_bytes as f64 / 1e3
                ),
                secs(f.restore.wall),
                cpu(&f.restore),
                secs(f.dump_restore.wall),
                cpu(&f.dump_restore),
                ratio(f.restore.wall, f.dump_restore.wall),
            ]
        })
        .collect();
    markdown_table(
        &format!(
            "backup: the populated install ({} systems in one group, {} with 2 NICs and a BMC; {rows} rows): mprov-control backup / restore vs the engine's dump (CPU: the command + the database server)",
            sizes.members, sizes.full
        ),
        &[
            "engine",
            "mprov backup",
            "CPU",
            "dump",
            "CPU",
            "ratio",
            "archive / dump size",
            "mprov restore",
            "CPU",
            "dump restore",
            "CPU",
            "ratio",
        ],
        &rows_out,
    )
}
