//! `mprov-control backup` and `restore`: round trips across the three
//! engines comparing every row (and, through the API, every object), a
//! populated install, the snapshot's consistency under writes, and the
//! refusals, the last through the real binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mprov_control::backup::{self, store};
use mprov_control::config::Config;
use mprov_control::db::kinds::KINDS;
use mprov_control::db::{Db, Engine, Val};
use serde_json::{Value, json};

use crate::common::{Ctx, INSERT_BARE_SYSTEMS, TestDb, bind_bare_system, config};

/// The secret key every context here seals BMC passwords with.
const KEY: &str = "test secret key";

/// A restore of `archive` with `cfg`, without --force, is refused with an
/// error whose chain says `want`.
async fn restore_refused(cfg: &Config, archive: Vec<u8>, want: &str) {
    let err = backup::restore(cfg, archive, false).await.unwrap_err();
    assert!(format!("{err:#}").contains(want), "{err:#}");
}

/// The tables of the backup `bytes`, without secrets, under a manifest that
/// says mProv 99.0.0 made it.
fn from_newer_mprov(bytes: &[u8]) -> backup::archive::Contents {
    let v = backup::archive::open(bytes).unwrap();
    let mut newer = backup::archive::Contents {
        manifest: v.manifest.clone(),
        tables: v.tables.clone(),
        secrets: None,
    };
    newer.manifest.mprov_version = "99.0.0".into();
    newer
}

/// Folders for one install: config, state, backups.
struct Dirs {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Dirs {
    fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_owned();
        Dirs { _tmp: tmp, root }
    }

    fn config(&self, url: &str) -> Config {
        let etc = self.root.join("etc");
        let var = self.root.join("var");
        config(
            url,
            &[
                "--config-dir",
                etc.to_str().unwrap(),
                "--state-dir",
                var.to_str().unwrap(),
                "--secret-key",
                KEY,
            ],
        )
    }

    fn backups(&self) -> PathBuf {
        self.root.join("backups")
    }

    /// A backup of `c`'s install, without secrets, into [`Dirs::backups`].
    async fn backup(&self, c: &Ctx) -> backup::BackupReport {
        backup::backup(
            &self.config(&c.db.url),
            &c.state.db,
            KEY,
            &self.backups(),
            false,
        )
        .await
        .unwrap()
    }
}

/// Every table's columns and rows, engine-neutral: booleans as 0/1 (SQLite
/// and MariaDB keep them as integers); the setting a backup records and the
/// revision are left out (a restore moves the revision on by design).
type Rows = BTreeMap<String, (Vec<String>, Vec<Vec<Value>>)>;

async fn rows(db: &Db) -> Rows {
    let engine = db.engine();
    let mut conn = db.pool().acquire().await.unwrap();
    let tables = store::schema(&mut conn, engine).await.unwrap();
    let mut out = BTreeMap::new();
    for t in &tables {
        if t.name == "inventory_revision" {
            continue;
        }
        let data = store::read_table(&mut conn, engine, t).await.unwrap();
        let mut rows: Vec<Vec<Value>> = data
            .rows
            .into_iter()
            .map(|r| {
                r.into_iter()
                    .map(|v| match v {
                        Value::Bool(b) => json!(i64::from(b)),
                        v => v,
                    })
                    .collect()
            })
            .collect();
        if t.name == "settings" {
            rows.retain(|r| r[0] != json!(backup::LAST_BACKUP_SETTING));
        }
        out.insert(t.name.clone(), (data.columns, rows));
    }
    out
}

/// Every object of every kind, through the API (db::crud's reading path,
/// not the backup's): each kind's full list, page by page.
async fn objects(c: &Ctx) -> BTreeMap<String, Vec<Value>> {
    let mut out = BTreeMap::new();
    for kind in KINDS {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let path = match &cursor {
                Some(cur) => format!("/api/v1/{}/?limit=1000&cursor={cur}", kind.name),
                None => format!("/api/v1/{}/?limit=1000", kind.name),
            };
            let page = c.ok("GET", &path, None).await;
            all.extend(page["items"].as_array().unwrap().iter().cloned());
            match page["next"].as_str() {
                Some(n) => cursor = Some(n.to_owned()),
                None => break,
            }
        }
        out.insert(kind.name.to_owned(), all);
    }
    out
}

/// A populated install: `full` systems with two NICs and a BMC (sealed
/// password) each, `members` systems in all, every one of them in one group,
/// scripts on systems, groups and an image, API keys, credentials,
/// enrollment tokens and a job server.
async fn populate(c: &Ctx, full: usize, members: usize) {
    let db = &c.state.db;
    let ts = || Val::Text(Some("2026-01-01T00:00:00Z".into()));
    c.post(
        "networks",
        json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 16, "isdhcp": true}),
    )
    .await;
    for i in 0..5 {
        c.post("scripts", json!({"slug": format!("s{i}"), "name": format!("Script {i}"), "script_type": if i % 2 == 0 { "post-boot" } else { "image-gen" },
                "content": format!("#!/bin/sh\n# ünïcode, 'quotes' and \"doubles\"\necho {i} > /tmp/x\n")}))
        .await;
    }
    c.post("distros", json!({"slug": "rocky-9", "scripts": ["s0"]}))
        .await;
    c.post(
        "images",
        json!({"slug": "compute", "distro": "rocky-9", "scripts": ["s1", "s2"]}),
    )
    .await;
    let image_id = c.ok("GET", "/api/v1/images/compute", None).await["id"].clone();
    let mut tx = db.pool().begin().await.unwrap();
    let ids: Vec<usize> = (0..members).collect();
    for chunk in ids.chunks(80) {
        let mut sql = db.sql();
        sql.push("INSERT INTO systems (hostname, image_id, install_kernel_cmdline, initial_mods, tmpfs_root_size, prov_interface, config_params, stateful, netboot, created_at, updated_at) VALUES ");
        for (j, i) in chunk.iter().enumerate() {
            if j > 0 {
                sql.push(", ");
            }
            sql.bind_list([
                Val::Text(Some(format!("n{i:05}"))),
                Val::Int(image_id.as_i64()),
                Val::Text(Some(format!("console=ttyS0 n={i}"))),
                Val::Text(Some(String::new())),
                Val::Int(Some(i64::try_from(*i).unwrap() * 1024)),
                Val::Text(Some("eth0".into())),
                Val::Text(Some(format!("rack: {}\n", i / 40))),
                Val::Bool(Some(i % 7 == 0)),
                Val::Bool(Some(i % 3 != 0)),
                ts(),
                ts(),
            ]);
        }
        sql.query().execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    let first: i64 = {
        let row = sqlx::query("SELECT MIN(id) AS m FROM systems")
            .fetch_one(db.pool())
            .await
            .unwrap();
        mprov_control::db::int(&row, "m").unwrap()
    };
    let mut tx = db.pool().begin().await.unwrap();
    let full_ids: Vec<i64> = (0..i64::try_from(full).unwrap())
        .map(|i| first + i)
        .collect();
    for chunk in full_ids.chunks(60) {
        let mut nics = db.sql();
        nics.push("INSERT INTO network_interfaces (system_id, name, mac, ipv4, hostname, aliases, mtu, bootable, is_gateway) VALUES ");
        let mut bmcs = db.sql();
        bmcs.push("INSERT INTO bmcs (system_id, ipv4, mac, username, password, vlan) VALUES ");
        for (j, id) in chunk.iter().enumerate() {
            let n = id - first;
            for nic in 0..2 {
                if j > 0 || nic > 0 {
                    nics.push(", ");
                }
                nics.bind_list([
                    Val::Int(Some(*id)),
                    Val::Text(Some(format!("eth{nic}"))),
                    Val::Text(Some(format!(
                        "52:54:{nic:02x}:{:02x}:{:02x}:{:02x}",
                        n >> 16 & 255,
                        n >> 8 & 255,
                        n & 255
                    ))),
                    Val::Text((nic == 0).then(|| format!("10.0.{}.{}", n / 250, n % 250 + 1))),
                    Val::Text(None),
                    Val::Text(Some(String::new())),
                    Val::Int(Some(1500)),
                    Val::Bool(Some(nic == 0)),
                    Val::Bool(Some(false)),
                ]);
            }
            if j > 0 {
                bmcs.push(", ");
            }
            bmcs.bind_list([
                Val::Int(Some(*id)),
                Val::Text(Some(format!("10.1.{}.{}", n / 250, n % 250 + 1))),
                Val::Text(None),
                Val::Text(Some("root".into())),
                Val::Text(Some(c.state.secrets.seal(&format!("bmc-pass-{n}")))),
                Val::Int(Some(0)),
            ]);
        }
        nics.query().execute(&mut *tx).await.unwrap();
        bmcs.query().execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    let all: Vec<i64> = (0..i64::try_from(members).unwrap())
        .map(|i| first + i)
        .collect();
    c.post(
        "groups",
        json!({"slug": "everyone", "priority": 3, "systems": all, "scripts": ["s3"]}),
    )
    .await;
    c.patch(
        &format!("/api/v1/systems/{first}"),
        json!({"scripts": ["s4"]}),
    )
    .await;
    for i in 0..3 {
        c.post("apikeys", json!({"name": format!("key {i}")})).await;
    }
    c.post(
        "jobservers",
        json!({"name": "js1", "addresses": ["10.0.0.2"], "port": 8081, "modules": ["dhcp", "dns"]}),
    )
    .await;
    // A float, so the engines' REAL and DOUBLE round-trip too.
    sqlx::query("UPDATE jobservers SET load_avg = 0.25, heartbeat_at = '2026-01-01T00:00:00Z'")
        .execute(db.pool())
        .await
        .unwrap();
    // The jobs queue: a job for one job server, a published version's files.
    c.post(
        "jobs",
        json!({"module": "image-sync", "params": {"image": "compute", "version": 1, "from": "js0"}, "for_jobserver": "js1"}),
    )
    .await;
    let mut files = db.sql();
    files.push("INSERT INTO image_files (image_id, version, name, size, sha256) VALUES ");
    for (i, (name, size)) in [("rootfs.tar.zst", 1_i64 << 40), ("vmlinuz", 12_345)]
        .into_iter()
        .enumerate()
    {
        if i > 0 {
            files.push(", ");
        }
        files.bind_list([
            Val::Int(image_id.as_i64()),
            Val::Int(Some(1)),
            Val::Text(Some(name.into())),
            Val::Int(Some(size)),
            Val::Text(Some("ab".repeat(32))),
        ]);
    }
    files.query().execute(db.pool()).await.unwrap();
    mprov_control::enrollment::create_token(db, "spare", std::time::Duration::from_secs(3600))
        .await
        .unwrap();
    let mut sql = db.sql();
    sql.push("INSERT INTO credentials (serial, kind, identity, not_after, created_at, revoked_at, revoke_reason) VALUES ");
    sql.bind_list([
        Val::Text(Some("0a1b2c".into())),
        Val::Text(Some("jobserver".into())),
        Val::Text(Some("js1".into())),
        ts(),
        ts(),
        Val::Text(None),
        Val::Text(None),
    ]);
    sql.query().execute(db.pool()).await.unwrap();
}

/// Restores `file` into `url` through the library, as `restore` does.
async fn restore_into(dirs: &Dirs, url: &str, file: &Path, force: bool) -> backup::RestoreReport {
    let cfg = dirs.config(url);
    backup::restore(&cfg, std::fs::read(file).unwrap(), force)
        .await
        .unwrap()
}

/// Checks what a restore must give: the same rows (every column of every
/// table: the scripts' and uploads' contents live in them), the same objects
/// through the API when given, BMC passwords that open with the install's
/// key, and a revision past the old one.
async fn same_install(
    want_rows: &Rows,
    want_objects: Option<&BTreeMap<String, Vec<Value>>>,
    old_revision: i64,
    after: &Ctx,
) {
    let got_rows = rows(&after.state.db).await;
    assert_eq!(
        want_rows.keys().collect::<Vec<_>>(),
        got_rows.keys().collect::<Vec<_>>(),
        "{}: tables",
        after.db.engine
    );
    for (table, (cols, want)) in want_rows {
        let (got_cols, got) = &got_rows[table];
        assert_eq!(got_cols, cols, "{table}: columns");
        assert_eq!(
            got.len(),
            want.len(),
            "{}: {table}: row count",
            after.db.engine
        );
        if let Some(i) = (0..want.len()).find(|i| got[*i] != want[*i]) {
            panic!(
                "{}: {table}: row {i} differs:\n  before {:?}\n  after  {:?}",
                after.db.engine, want[i], got[i]
            );
        }
    }
    if let Some(want_objects) = want_objects {
        assert_eq!(
            &objects(after).await,
            want_objects,
            "{}: objects through the API",
            after.db.engine
        );
    }
    let now = after.revision().await;
    assert!(
        now > old_revision,
        "revision {now} is not past {old_revision}"
    );
    let stored = sqlx::query("SELECT password FROM bmcs ORDER BY id")
        .fetch_all(after.state.db.pool())
        .await
        .unwrap();
    for (i, r) in stored.iter().enumerate() {
        let sealed: String = sqlx::Row::try_get(r, "password").unwrap();
        assert_eq!(
            after.state.secrets.open(&sealed).unwrap(),
            format!("bmc-pass-{i}")
        );
    }
}

/// Carries the install of `src` over SQLite → PostgreSQL → MariaDB →
/// SQLite: each hop backs up the previous hop's database, restores that
/// archive into a new database of the next engine, checks it with
/// [`same_install`] against `src`'s rows (and objects, when given), then
/// with `check`.
async fn over_every_engine(
    src: Ctx,
    want_rows: &Rows,
    want_objects: Option<&BTreeMap<String, Vec<Value>>>,
    check: impl AsyncFn(&Ctx, &backup::BackupReport),
) {
    let mut revision = src.revision().await;
    let dirs = Dirs::new();
    let mut from = src;
    for engine in [Engine::Postgres, Engine::Mysql, Engine::Sqlite] {
        let report = dirs.backup(&from).await;
        let tdb = TestDb::new(engine).await;
        let restored = restore_into(&dirs, &tdb.url, &report.path, false).await;
        assert!(restored.key_matches && !restored.secrets_restored);
        std::fs::remove_file(&report.path).unwrap();
        // The admin key was restored with everything else.
        let c = Ctx::on(tdb, from.key.clone()).await;
        same_install(want_rows, want_objects, revision, &c).await;
        check(&c, &report).await;
        revision = c.revision().await;
        from.cleanup().await;
        from = c;
    }
    from.cleanup().await;
}

/// SQLite → PostgreSQL → MariaDB → SQLite, each hop restoring the previous
/// hop's backup and comparing every row and, through the API's own reading
/// path, every object of every kind with the original (at 1,000 systems, so
/// that paging every kind stays quick; the full-size install below takes the
/// same chain comparing every row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_sqlite_postgres_mariadb_sqlite() {
    let src = Ctx::new(Engine::Sqlite).await;
    populate(&src, 300, 1_000).await;
    let want_rows = rows(&src.state.db).await;
    let want_objects = objects(&src).await;
    over_every_engine(src, &want_rows, Some(&want_objects), async |_, _| {}).await;
}

/// The populated install of the issue at full size: 10,000 systems with two
/// NICs and a BMC (sealed password) each, 70,000 systems in one group (a
/// group's members are systems, so the group's 70,000 members are 70,000
/// real systems, 10,000 of them fully described), scripts on every layer,
/// API keys, credentials, an enrollment token and a job server. Made in bulk
/// inside transactions, then carried over the whole chain SQLite →
/// PostgreSQL → MariaDB → SQLite, each hop restoring the previous hop's
/// backup: at every hop every row of every table is compared with the
/// original (the scripts' contents, the API keys' hashes, the credentials
/// and the sealed BMC passwords are columns of those rows), every BMC
/// password opened with the install's key, and the group and the scripts
/// read back through the API with the restored admin key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn populated_install_round_trip() {
    const SYSTEMS: usize = 10_000;
    const MEMBERS: usize = 70_000;
    let src = Ctx::new(Engine::Sqlite).await;
    populate(&src, SYSTEMS, MEMBERS).await;
    let want_rows = rows(&src.state.db).await;
    for (table, n) in [
        ("systems", MEMBERS),
        ("group_members", MEMBERS),
        ("network_interfaces", 2 * SYSTEMS),
        ("bmcs", SYSTEMS),
    ] {
        assert_eq!(want_rows[table].1.len(), n, "{table}");
    }
    for table in [
        "scripts",
        "api_keys",
        "credentials",
        "enroll_tokens",
        "jobservers",
        "jobs",
        "image_files",
    ] {
        assert!(!want_rows[table].1.is_empty(), "{table} is populated");
    }
    let want_group = src.ok("GET", "/api/v1/groups/everyone", None).await;
    let want_scripts = src.ok("GET", "/api/v1/scripts/?limit=100", None).await;
    over_every_engine(src, &want_rows, None, async |c, report| {
        let rows_in_manifest: u64 = report.manifest.parts.iter().filter_map(|p| p.rows).sum();
        assert!(rows_in_manifest >= (MEMBERS * 2 + SYSTEMS * 3) as u64);
        let engine = c.db.engine;
        let group = c.ok("GET", "/api/v1/groups/everyone", None).await;
        assert_eq!(group["systems"].as_array().unwrap().len(), MEMBERS);
        assert_eq!(group, want_group, "{engine}: the group through the API");
        assert_eq!(
            c.ok("GET", "/api/v1/scripts/?limit=100", None).await,
            want_scripts,
            "{engine}: the scripts through the API"
        );
    })
    .await;
}

/// The refusals, each leaving the target as it was: a served folder, a
/// loose folder, a truncated or altered archive, a newer version, a
/// database that holds data without `--force`. And the modes of what is
/// written: 0600 in 0700.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_modes() {
    use std::os::unix::fs::PermissionsExt;

    use mprov_control::backup::archive;

    let src = Ctx::new(Engine::Sqlite).await;
    populate(&src, 20, 50).await;
    let dirs = Dirs::new();
    let cfg = dirs.config(&src.db.url);
    // Served folders: the TLS folder and the job server's export folder.
    for served in [cfg.tls_dir.join("sub"), cfg.state_dir.join("export/images")] {
        let err = backup::backup(&cfg, &src.state.db, KEY, &served, false)
            .await
            .unwrap_err();
        assert!(
            format!("{err:#}").contains("served to the network"),
            "{err:#}"
        );
        assert!(!served.exists(), "{} was made", served.display());
    }
    // A folder others may enter.
    let loose = dirs.root.join("loose");
    std::fs::create_dir(&loose).unwrap();
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = backup::backup(&cfg, &src.state.db, KEY, &loose, false)
        .await
        .unwrap_err();
    assert!(format!("{err:#}").contains("chmod 700"), "{err:#}");
    // The modes.
    let report = backup::backup(&cfg, &src.state.db, KEY, &dirs.backups(), false)
        .await
        .unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&report.path), 0o600);
    assert_eq!(mode(&dirs.backups()), 0o700);
    let good = std::fs::read(&report.path).unwrap();

    let target = TestDb::new(Engine::Sqlite).await;
    let tcfg = dirs.config(&target.url);
    let untouched = || {
        let path = mprov_control::db::sqlite_path(&target.url).unwrap();
        assert!(
            !path.exists(),
            "the refused restore created {}",
            path.display()
        );
    };
    // Truncated anywhere, or one byte altered inside a part.
    for cut in [good.len() / 3, good.len() / 2, good.len() - 1100] {
        restore_refused(&tcfg, good[..cut].to_vec(), "refusing to restore").await;
        untouched();
    }
    let mut altered = good.clone();
    // Inside the first table part (after the zstd magic), not in tar padding.
    let at = good
        .windows(4)
        .position(|w| w == [0x28, 0xb5, 0x2f, 0xfd])
        .unwrap()
        + 12;
    altered[at] ^= 0x01;
    restore_refused(&tcfg, altered, "SHA-256").await;
    untouched();
    // From a newer mProv: a well-formed archive whose manifest says so.
    let mut newer = from_newer_mprov(&good);
    newer.manifest.schema_level = 99_999_999_999_999;
    restore_refused(
        &tcfg,
        archive::pack(newer).unwrap(),
        "newer than this mProv",
    )
    .await;
    untouched();
    // A database that holds data: refused, then replaced with --force.
    restore_refused(&dirs.config(&src.db.url), good.clone(), "--force").await;
    let before = rows(&src.state.db).await;
    assert!(
        backup::restore(&dirs.config(&src.db.url), good.clone(), true)
            .await
            .is_ok()
    );
    assert_eq!(rows(&src.state.db).await, before);
    // An older backup (schema level 1) is migrated to the current level.
    let old = TestDb::new(Engine::Sqlite).await;
    let odb = Db::connect(&old.url).await.unwrap();
    mprov_control::db::migrator(Engine::Sqlite)
        .run_to(1, odb.pool())
        .await
        .unwrap();
    sqlx::query("INSERT INTO settings (name, value) VALUES ('from_level_1', 'yes')")
        .execute(odb.pool())
        .await
        .unwrap();
    let contents = backup::snapshot(&odb, KEY).await.unwrap();
    assert_eq!(contents.manifest.schema_level, 1);
    let restored = backup::restore(&tcfg, archive::pack(contents).unwrap(), false)
        .await
        .unwrap();
    assert_eq!((restored.from_level, restored.to_level > 1), (1, true));
    let tdb = Db::open(&target.url).await.unwrap();
    assert_eq!(
        tdb.setting("from_level_1").await.unwrap().as_deref(),
        Some("yes")
    );
    // The later migration's tables are there.
    sqlx::query("SELECT COUNT(*) FROM enroll_tokens")
        .fetch_one(tdb.pool())
        .await
        .unwrap();
    src.cleanup().await;
}

/// Runs the real `mprov-control` with `args`, its folders under `home` and
/// its database at `url`: exit code, stdout, stderr.
fn cli(home: &Path, url: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mprov-control"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("MPROV_CONFIG_DIR", home.join("etc"))
        .env("MPROV_STATE_DIR", home.join("var"))
        .env("MPROV_DATABASE_URL", url)
        .env("MPROV_LOG", "warn")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run mprov-control");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every file and folder under `dir`: path, size, modification time, mode.
fn tree(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                todo.push(e.path());
            }
            out.push((
                e.path(),
                meta.len(),
                meta.modified().unwrap(),
                meta.permissions().mode(),
            ));
        }
    }
    out.sort();
    out
}

/// A SQLite database's whole content, as the `sqlite3` client dumps it.
fn sqlite_dump(url: &str) -> String {
    let path = mprov_control::db::sqlite_path(url).unwrap();
    let out = std::process::Command::new("sqlite3")
        .arg(&path)
        .arg(".dump")
        .output()
        .expect("sqlite3 (Debian package sqlite3) runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The refusals of the real `mprov-control backup` and `restore`, each with
/// its exit status, a message that names the problem and what to do, and
/// nothing touched: a served folder (the TLS folder, a folder of
/// `MPROV_SERVED_DIRS`), a truncated and a tampered archive, a backup from a
/// newer mProv, a database that holds data without `--force`. Then what the
/// commands say when they succeed: the archive is 0600 in a 0700 folder, the
/// `--with-secrets` warning, the "cannot decrypt BMC passwords" warning on a
/// host with another key, and the revision moving forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_of_the_binaries() {
    use std::os::unix::fs::PermissionsExt;

    use mprov_control::backup::archive;

    let src = Ctx::new(Engine::Sqlite).await;
    populate(&src, 20, 50).await;
    let dirs = Dirs::new();
    let home = dirs.root.join("src");
    let url = src.db.url.clone();
    let run = |args: &[&str], env: &[(&str, &str)]| cli(&home, &url, args, env);
    let key_env = [("SECRET_KEY", KEY)];

    // A served folder: the TLS folder, and one named in MPROV_SERVED_DIRS.
    let www = dirs.root.join("www");
    std::fs::create_dir(&www).unwrap();
    let before = tree(&dirs.root);
    let www_env = [
        ("SECRET_KEY", KEY),
        ("MPROV_SERVED_DIRS", www.to_str().unwrap()),
    ];
    for (out, env) in [
        (home.join("var/tls/backups"), &key_env[..]),
        (www.join("backups"), &www_env[..]),
    ] {
        let (code, stdout, stderr) = run(&["backup", "--output-dir", out.to_str().unwrap()], env);
        assert_eq!(code, 1, "{stdout}{stderr}");
        assert!(
            stderr.contains("served to the network")
                && stderr.contains("Choose another folder with --output-dir"),
            "{stderr}"
        );
        assert_eq!(tree(&dirs.root), before, "a refused backup made something");
    }
    // The default folder (MPROV_BACKUP_DIR), and the modes.
    let backups = dirs.backups();
    let backup_env = [
        ("SECRET_KEY", KEY),
        ("MPROV_BACKUP_DIR", backups.to_str().unwrap()),
    ];
    let (code, stdout, stderr) = run(&["backup"], &backup_env);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stderr.contains("the secret key is not in this archive")
            && stderr.contains("BMC passwords"),
        "{stderr}"
    );
    let file = PathBuf::from(
        stdout
            .strip_prefix("wrote ")
            .and_then(|s| s.split(" (").next())
            .unwrap_or_else(|| panic!("{stdout}")),
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&file), mode(&backups)), (0o600, 0o700));
    let (code, _, stderr) = run(&["backup", "--with-secrets"], &backup_env);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("warning") && stderr.contains("secret key and the CA key"),
        "{stderr}"
    );
    let good = std::fs::read(&file).unwrap();

    // Restores into a fresh install that must stay untouched.
    let target = dirs.root.join("target");
    std::fs::create_dir(&target).unwrap();
    let turl = format!(
        "sqlite://{}?mode=rwc",
        target.join("var/db/mprov.sqlite3").display()
    );
    let bad = dirs.root.join("bad.tar");
    let zstd_at = good
        .windows(4)
        .position(|w| w == [0x28, 0xb5, 0x2f, 0xfd])
        .unwrap();
    let mut tampered = good.clone();
    tampered[zstd_at + 10] ^= 0x01;
    let mut newer = from_newer_mprov(&good);
    newer.manifest.schema_level += 1;
    let cases: [(&str, Vec<u8>, &[&str]); 4] = [
        (
            "truncated",
            good[..good.len() / 2].to_vec(),
            &["truncated", "Copy the archive again"],
        ),
        (
            "cut at a part",
            good[..zstd_at + 100].to_vec(),
            &["truncated", "Copy the archive again"],
        ),
        (
            "tampered",
            tampered,
            &["SHA-256", "altered", "Copy the archive again"],
        ),
        (
            "newer",
            archive::pack(newer).unwrap(),
            &["newer than this mProv", "restore it with mProv 99.0.0"],
        ),
    ];
    let before = tree(&target);
    for (what, bytes, needles) in cases {
        std::fs::write(&bad, bytes).unwrap();
        let (code, stdout, stderr) = cli(&target, &turl, &["restore", bad.to_str().unwrap()], &[]);
        assert_eq!(code, 1, "{what}: {stdout}{stderr}");
        assert!(
            stderr.contains("refusing to restore") || what == "newer",
            "{what}: {stderr}"
        );
        for n in needles {
            assert!(stderr.contains(n), "{what}: no {n:?} in {stderr}");
        }
        assert_eq!(
            tree(&target),
            before,
            "{what}: the refused restore made something"
        );
    }

    // A database that holds data: refused without --force, left as it was.
    let dump = sqlite_dump(&url);
    let (code, stdout, stderr) = run(&["restore", file.to_str().unwrap()], &key_env);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stderr.contains("is not empty") && stderr.contains("pass --force"),
        "{stderr}"
    );
    assert_eq!(
        sqlite_dump(&url),
        dump,
        "the refused restore changed the database"
    );
    // With --force it is replaced by the backup: the same rows, a newer revision.
    let old_revision = src.revision().await;
    let want = rows(&src.state.db).await;
    let (code, stdout, stderr) = run(&["restore", "--force", file.to_str().unwrap()], &key_env);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("restored") && stdout.contains("inventory revision"),
        "{stdout}"
    );
    assert_eq!(rows(&src.state.db).await, want);
    assert!(src.revision().await > old_revision);

    // On a host with another secret key (the fresh install makes its own),
    // the restore works and says BMC passwords cannot be decrypted here.
    let (code, stdout, stderr) = cli(&target, &turl, &["restore", file.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stderr.contains("BMC passwords cannot be decrypted here")
            && stderr.contains("--with-secrets"),
        "{stderr}"
    );
    let restored = Db::open(&turl).await.unwrap();
    assert_eq!(rows(&restored).await, want);
    restored.pool().close().await;
    src.cleanup().await;
}

/// The snapshot is one point in time while the service keeps writing: a
/// writer adds a system and records the count of its systems in one
/// transaction, over and over, while backups are taken; in every archive
/// the recorded count equals the systems there, on every engine. (Read at
/// different times, the systems table, read after the settings, would hold
/// more.)
async fn snapshot_is_consistent_under_writes(engine: Engine) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

    let c = Ctx::new(engine).await;
    let db = c.state.db.clone();
    db.set_setting("writes", "0").await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicI64::new(0));
    let writer = {
        let (db, stop, done) = (db.clone(), stop.clone(), done.clone());
        tokio::spawn(async move {
            let mut n = 0_i64;
            // Bounded: at most 5,000 writes, stopped earlier by the test.
            while !stop.load(Ordering::Relaxed) && n < 5_000 {
                n += 1;
                let mut tx = db.pool().begin().await.unwrap();
                let mut sql = db.sql();
                sql.push(INSERT_BARE_SYSTEMS);
                bind_bare_system(&mut sql, format!("w{n}"));
                sql.query().execute(&mut *tx).await.unwrap();
                let mut sql = db.sql();
                sql.push("UPDATE settings SET value = ")
                    .bind(Val::Text(Some(n.to_string())))
                    .push(" WHERE name = ")
                    .bind(Val::Text(Some("writes".into())));
                sql.query().execute(&mut *tx).await.unwrap();
                tx.commit().await.unwrap();
                done.store(n, Ordering::Relaxed);
            }
            n
        })
    };
    let mut seen = Vec::new();
    for _ in 0..4 {
        // Each backup starts after more writes, while the writer goes on.
        let before = done.load(Ordering::Relaxed);
        while done.load(Ordering::Relaxed) < before + 5 && !writer.is_finished() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let contents = backup::snapshot(&db, KEY).await.unwrap();
        let table = |name: &str| {
            contents
                .tables
                .iter()
                .find(|t| t.table == name)
                .unwrap()
                .clone()
        };
        let systems = table("systems").rows.len();
        let settings = table("settings");
        let writes: usize = settings
            .rows
            .iter()
            .find(|r| r[0] == json!("writes"))
            .and_then(|r| r[1].as_str()?.parse().ok())
            .unwrap();
        assert_eq!(
            systems, writes,
            "{engine}: the snapshot is not one point in time"
        );
        seen.push(writes);
    }
    stop.store(true, Ordering::Relaxed);
    let total = writer.await.unwrap();
    let last = *seen.last().unwrap();
    assert!(last >= 20, "{engine}: {seen:?}");
    assert!(
        usize::try_from(total).unwrap() >= last,
        "{engine}: {seen:?} of {total}"
    );
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_snapshot_is_consistent_under_writes() {
    snapshot_is_consistent_under_writes(Engine::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_snapshot_is_consistent_under_writes() {
    snapshot_is_consistent_under_writes(Engine::Mysql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_snapshot_is_consistent_under_writes() {
    snapshot_is_consistent_under_writes(Engine::Postgres).await;
}
