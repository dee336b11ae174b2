//! `mprov-control backup` and `mprov-control restore`.
//!
//! Scripts and uploaded files live in the database, so one archive holds the
//! whole install: every table of one consistent snapshot, taken while the
//! service keeps serving (see [`store`]), in the engine-neutral format of
//! [`archive`]. The rules, in the order they are applied:
//!
//! **Backup.**
//! 1. The output folder (`--output-dir`, else `MPROV_BACKUP_DIR`, else
//!    `STATE_DIR/backups`) must not be, or be inside, a folder that is served
//!    to the network ([`served_dirs`]): the TLS folder (`/ca.crt` comes from
//!    it), the job server's export folder under the state folder, and any of
//!    `MPROV_SERVED_DIRS`. Symbolic links are resolved first.
//! 2. The folder is made 0700 when missing; an existing one that others can
//!    enter is refused (the archive holds password hashes and sealed BMC
//!    credentials). The file is written 0600 under a temporary name, synced,
//!    then renamed, so a crash never leaves half a backup under the real name.
//! 3. `--with-secrets` adds the secret key and the TLS folder's files (the CA
//!    key among them): the archive is then a credential and the command says
//!    so. Without them, BMC passwords restored on another host stay sealed
//!    with this install's key, and the command says that too.
//!
//! **Restore.**
//! 1. The whole archive is checked ([`archive::open`]) before anything else:
//!    a damaged, truncated or altered archive is refused.
//! 2. A backup from a newer mProv (a newer schema level or program version)
//!    is refused.
//! 3. A database that holds data is refused unless `--force`.
//! 4. The target's tables are dropped, the schema is rebuilt up to the
//!    backup's level, the rows are loaded in one transaction (parents first,
//!    each value bound as the target column's type, so any engine restores
//!    any engine's backup), then the remaining migrations run: an older
//!    backup is migrated like an old database.
//! 5. The inventory revision moves forward to at least the restore's time in
//!    milliseconds, so it is past any revision a job server saw from the old
//!    database (unless that one made over a thousand writes a second since it
//!    was set up) and every job server picks up the restored state.

pub mod archive;
pub mod store;

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use sqlx::Connection;

use crate::config::Config;
use crate::db::{Db, Engine};
use archive::{Contents, FORMAT, FORMAT_VERSION, Manifest, Secrets};

/// The setting that records the last backup (JSON: at, file, bytes), for the
/// admin pages.
pub const LAST_BACKUP_SETTING: &str = "last_backup";
pub use crate::config::BACKUP_DIR_NAME;
/// The job server's export folder's name inside the state folder, which its
/// HTTP server serves when it runs on the control host.
pub const EXPORT_DIR_NAME: &str = "export";

/// What `backup` wrote.
#[derive(Debug)]
pub struct BackupReport {
    /// The archive's path.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// Its manifest.
    pub manifest: Manifest,
}

/// What `restore` did.
#[derive(Debug)]
pub struct RestoreReport {
    /// The rows loaded per table.
    pub rows: Vec<(String, u64)>,
    /// The schema level of the backup.
    pub from_level: i64,
    /// The schema level after migrating.
    pub to_level: i64,
    /// The inventory revision after the restore.
    pub revision: i64,
    /// Whether the secret key and TLS folder were restored.
    pub secrets_restored: bool,
    /// Whether this host's secret key opens the restored BMC credentials.
    pub key_matches: bool,
}

/// The folders whose files are served to the network, which a backup must
/// never be written into.
pub fn served_dirs(config: &Config) -> Vec<PathBuf> {
    let mut dirs = vec![
        config.tls_dir.clone(),
        config.state_dir.join(EXPORT_DIR_NAME),
    ];
    dirs.extend(config.served_dirs.iter().cloned());
    dirs
}

/// `path` with symbolic links resolved, also when its last components do not
/// exist yet.
fn resolve(path: &Path) -> std::io::Result<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    loop {
        match existing.canonicalize() {
            Ok(real) => {
                let mut out = real;
                for c in rest.iter().rev() {
                    out.push(c);
                }
                return Ok(out);
            }
            Err(_) => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_owned());
                    existing = parent;
                }
                _ => return Ok(abs),
            },
        }
    }
}

/// Refuses an output folder that is, or is inside, a served folder.
pub fn check_output_dir(dir: &Path, served: &[PathBuf]) -> Result<PathBuf> {
    let real = resolve(dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
    for s in served {
        let served_real = resolve(s).with_context(|| format!("cannot resolve {}", s.display()))?;
        if real.starts_with(&served_real) {
            bail!(
                "refusing to write a backup into {} : it is inside {}, which is served to the network, and a backup holds password hashes and sealed credentials. Choose another folder with --output-dir or MPROV_BACKUP_DIR (default: the state folder's backups/)",
                real.display(),
                served_real.display()
            );
        }
    }
    Ok(real)
}

/// Makes `dir` 0700 when missing; refuses one that others may enter.
fn private_dir(dir: &Path) -> Result<()> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        // The umask may have narrowed it further, never widened: set it exactly.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot restrict {}", dir.display()))?;
    }
    let meta = std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    ensure!(meta.is_dir(), "{} is not a folder", dir.display());
    let mode = meta.permissions().mode() & 0o777;
    ensure!(
        mode & 0o077 == 0,
        "{} has mode {mode:o}, so others may read the backups in it: run chmod 700 on it, or choose another folder",
        dir.display()
    );
    Ok(())
}

/// Takes the snapshot: every table, in load order, in one read transaction.
pub async fn snapshot(db: &Db, secret_key: &str) -> Result<Contents> {
    let engine = db.engine();
    let mut conn = db.pool().acquire().await.context("database")?;
    store::begin_snapshot(&mut conn, engine)
        .await
        .context("cannot start the snapshot transaction")?;
    let read = async {
        let level = store::schema_level(&mut conn, engine).await?;
        let tables = store::schema(&mut conn, engine).await?;
        let mut out = Vec::with_capacity(tables.len());
        for t in &tables {
            out.push(store::read_table(&mut conn, engine, t).await?);
        }
        anyhow::Ok((level, out))
    }
    .await;
    let ended = store::end_snapshot(&mut conn).await;
    let (level, tables) = read.context("cannot read the database")?;
    ended.context("cannot end the snapshot transaction")?;
    let revision = tables
        .iter()
        .find(|t| t.table == "inventory_revision")
        .and_then(|t| {
            let col = t.columns.iter().position(|c| c == "revision")?;
            t.rows.first()?.get(col)?.as_i64()
        })
        .unwrap_or(0);
    Ok(Contents {
        manifest: Manifest {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            mprov_version: env!("CARGO_PKG_VERSION").into(),
            engine: engine.to_string(),
            schema_level: level,
            revision,
            created_at: crate::time::now(),
            secret_key_id: archive::secret_key_id(secret_key),
            with_secrets: false,
            parts: Vec::new(),
        },
        tables,
        secrets: None,
    })
}

/// The TLS folder's regular files.
fn tls_files(dir: &Path) -> Result<Vec<(String, u32, Vec<u8>)>> {
    let mut files = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(files),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    for entry in entries {
        let entry = entry?;
        let meta = entry.metadata()?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !meta.is_file() || name.ends_with(".tmp") || name.starts_with('.') {
            continue;
        }
        let data = std::fs::read(entry.path())
            .with_context(|| format!("cannot read {}", entry.path().display()))?;
        files.push((name, meta.permissions().mode() & 0o777, data));
    }
    files.sort();
    Ok(files)
}

/// `mprov-control backup`: writes one archive into `out` (see the module
/// doc).
pub async fn backup(
    config: &Config,
    db: &Db,
    secret_key: &str,
    out: &Path,
    with_secrets: bool,
) -> Result<BackupReport> {
    let dir = check_output_dir(out, &served_dirs(config))?;
    private_dir(&dir)?;
    let mut contents = snapshot(db, secret_key).await?;
    if with_secrets {
        contents.manifest.with_secrets = true;
        contents.secrets = Some(Secrets {
            secret_key: secret_key.to_owned(),
            tls_files: tls_files(&config.tls_dir)?,
        });
    }
    let stamp = jiff::Timestamp::now()
        .strftime("%Y%m%dT%H%M%S%.3fZ")
        .to_string();
    let path = dir.join(format!("mprov-backup-{stamp}.tar"));
    let (bytes, manifest) = tokio::task::spawn_blocking(move || -> Result<(Vec<u8>, Manifest)> {
        let mut manifest = contents.manifest.clone();
        let bytes = archive::pack(contents).context("cannot pack the archive")?;
        // pack fills in the parts; read them back for the report.
        manifest.parts = archive::open(&bytes)
            .context("the archive just written does not verify")?
            .manifest
            .parts;
        Ok((bytes, manifest))
    })
    .await
    .context("the packing thread failed")??;
    mprov_process::write_atomic(&path, &bytes, 0o600)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let record = serde_json::json!({
        "at": manifest.created_at,
        "file": path.display().to_string(),
        "bytes": bytes.len(),
        "with_secrets": with_secrets,
    });
    if let Err(e) = db
        .set_setting(LAST_BACKUP_SETTING, &record.to_string())
        .await
    {
        tracing::warn!("the backup is written, but its time could not be recorded: {e}");
    }
    Ok(BackupReport {
        path,
        bytes: bytes.len() as u64,
        manifest,
    })
}

/// A version `a.b.c` as numbers (a pre-release suffix is ignored).
fn version_numbers(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.split(['-', '+']).next()?;
    let mut it = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
}

/// Refuses a backup from a newer mProv: a newer schema level than this
/// build's migrations reach, or a newer program version.
pub fn check_version(m: &Manifest, known_level: i64, ours: &str) -> Result<()> {
    let newer_program = match (version_numbers(&m.mprov_version), version_numbers(ours)) {
        (Some(theirs), Some(mine)) => theirs > mine,
        (None, _) => bail!(
            "the backup names mProv version {:?}, which is not a version number",
            m.mprov_version
        ),
        (_, None) => false,
    };
    if m.schema_level > known_level || newer_program {
        bail!(
            "this backup was written by mProv {} (schema level {}), newer than this mProv {ours} (schema level {known_level}): restore it with mProv {} or newer",
            m.mprov_version,
            m.schema_level,
            m.mprov_version
        );
    }
    Ok(())
}

/// Checks the secret key before anything is written: with secrets in the
/// archive, an existing different key is refused without `force`. Whether
/// this host's key (after the restore) opens the restored credentials.
fn plan_secret_key(config: &Config, v: &archive::Verified, force: bool) -> Result<bool> {
    let path = config.config_dir.join(crate::first_start::SECRET_KEY_FILE);
    let local = match &config.secret_key {
        Some(k) => Some(k.clone()),
        None => std::fs::read_to_string(&path)
            .ok()
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty()),
    };
    match &v.secrets {
        Some(s) => {
            if config.secret_key.is_some() {
                bail!(
                    "SECRET_KEY is set in the environment and would override the restored secret key: unset it, or restore without the secrets"
                );
            }
            if let Some(k) = &local
                && *k != s.secret_key
                && !force
            {
                bail!(
                    "{} holds another secret key than the backup's; pass --force to replace it (BMC credentials sealed with the current key would no longer open)",
                    path.display()
                );
            }
            Ok(true)
        }
        None => Ok(local.is_some_and(|k| archive::secret_key_id(&k) == v.manifest.secret_key_id)),
    }
}

/// Whether a database holds anything a restore would destroy; the tables
/// that do, with their row counts.
async fn occupied(
    conn: &mut sqlx::AnyConnection,
    engine: Engine,
    tables: &[store::TableSchema],
) -> Result<Vec<(String, i64)>> {
    let mut out = Vec::new();
    for t in tables {
        // The migrations' own seed row is not data.
        if t.name == "inventory_revision" {
            continue;
        }
        let n = store::count(conn, engine, &t.name).await?;
        if n > 0 {
            out.push((t.name.clone(), n));
        }
    }
    Ok(out)
}

/// The inventory revision, if the table is there.
async fn current_revision(conn: &mut sqlx::AnyConnection) -> Option<i64> {
    let row = sqlx::query("SELECT revision FROM inventory_revision WHERE id = 1")
        .fetch_optional(&mut *conn)
        .await
        .ok()??;
    crate::db::int(&row, "revision").ok()
}

/// `mprov-control restore`: checks `bytes` and loads them into the database
/// at `config.database_url` (see the module doc).
pub async fn restore(config: &Config, bytes: Vec<u8>, force: bool) -> Result<RestoreReport> {
    let v = tokio::task::spawn_blocking(move || archive::open(&bytes))
        .await
        .context("the checking thread failed")?
        .map_err(|e| {
            let advice = match e {
                archive::ArchiveError::NewerFormat { .. } => "",
                _ => {
                    ". Copy the archive again from where it was written, or restore another backup"
                }
            };
            anyhow::anyhow!("refusing to restore, nothing was changed: {e}{advice}")
        })?;
    let url = &config.database_url;
    let engine = Engine::from_url(url).with_context(|| {
        format!(
            "unsupported database URL {}: use sqlite:, mysql: or postgres:",
            crate::db::redact_url(url)
        )
    })?;
    let migrator = crate::db::migrator(engine);
    let known_level = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    check_version(&v.manifest, known_level, env!("CARGO_PKG_VERSION"))?;
    let key_matches = plan_secret_key(config, &v, force)?;

    // Only now, with the archive found sound, is anything made.
    crate::first_start::make_dirs(config)?;
    let db = Db::connect(url).await?;
    let mut conn = db.pool().acquire().await.context("database")?;
    let mut previous_revision = 0;
    if store::is_migrated(&mut conn, engine).await? {
        let live = store::schema(&mut conn, engine).await?;
        let full = occupied(&mut conn, engine, &live).await?;
        if !full.is_empty() && !force {
            let what: Vec<String> = full.iter().map(|(t, n)| format!("{t}: {n}")).collect();
            bail!(
                "the database {} is not empty ({}); a restore replaces everything in it: pass --force to overwrite it (take a backup of it first)",
                crate::db::redact_url(url),
                what.join(", ")
            );
        }
        previous_revision = current_revision(&mut conn).await.unwrap_or(0);
        // Only our own tables go: anything else sharing the database stays.
        let ours = crate::db::known_tables(engine);
        let drop: Vec<store::TableSchema> = live
            .into_iter()
            .filter(|t| ours.contains(&t.name))
            .collect();
        store::drop_tables(&mut conn, engine, &drop).await?;
    }
    migrator
        .run_to(v.manifest.schema_level, db.pool())
        .await
        .with_context(|| {
            format!(
                "cannot build the schema up to the backup's level {}",
                v.manifest.schema_level
            )
        })?;

    let target = store::schema(&mut conn, engine).await?;
    let mut tx = conn.begin().await?;
    for t in target.iter().rev() {
        store::delete_all(&mut tx, engine, t).await?;
    }
    let mut rows = Vec::new();
    for t in &target {
        let Some(table) = v.tables.iter().find(|x| x.table == t.name) else {
            continue;
        };
        store::insert_rows(&mut tx, engine, t, table)
            .await
            .with_context(|| format!("cannot load table {}", t.name))?;
        let n = store::count(&mut tx, engine, &t.name).await?;
        ensure!(
            n as usize == table.rows.len(),
            "table {} holds {n} rows after loading {}",
            t.name,
            table.rows.len()
        );
        rows.push((t.name.clone(), n as u64));
    }
    if let Some(extra) = v
        .tables
        .iter()
        .find(|x| !target.iter().any(|t| t.name == x.table))
    {
        bail!(
            "the backup has table {}, which schema level {} does not: the archive does not match its manifest",
            extra.table,
            v.manifest.schema_level
        );
    }
    let now_ms = jiff::Timestamp::now().as_millisecond();
    let revision = (v.manifest.revision.max(previous_revision) + 1).max(now_ms);
    let mut q = crate::db::Sql::new(engine);
    q.push("UPDATE inventory_revision SET revision = ")
        .bind(crate::db::Val::Int(Some(revision)))
        .push(" WHERE id = 1");
    let updated = q.query().execute(&mut *tx).await?.rows_affected();
    if updated == 0 {
        let mut q = crate::db::Sql::new(engine);
        q.push("INSERT INTO inventory_revision (id, revision) VALUES ")
            .bind_list([
                crate::db::Val::Int(Some(1)),
                crate::db::Val::Int(Some(revision)),
            ]);
        q.query().execute(&mut *tx).await?;
    }
    store::reset_sequences(&mut tx, engine, &target).await?;
    tx.commit()
        .await
        .context("cannot commit the restored rows")?;
    drop(conn);
    db.migrate().await?;

    let secrets_restored = match &v.secrets {
        Some(s) => {
            write_secrets(config, s)?;
            true
        }
        None => false,
    };
    db.pool().close().await;
    Ok(RestoreReport {
        rows,
        from_level: v.manifest.schema_level,
        to_level: known_level,
        revision,
        secrets_restored,
        key_matches,
    })
}

fn write_secrets(config: &Config, s: &Secrets) -> Result<()> {
    crate::first_start::make_dirs(config)?;
    let key = config.config_dir.join(crate::first_start::SECRET_KEY_FILE);
    crate::pki::ca::write_file(&key, format!("{}\n", s.secret_key).as_bytes(), 0o600)?;
    if !s.tls_files.is_empty() {
        crate::pki::ca::ensure_dir(&config.tls_dir)?;
        for (name, mode, data) in &s.tls_files {
            crate::pki::ca::write_file(&config.tls_dir.join(name), data, *mode & 0o644)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(version: &str, level: i64) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            mprov_version: version.into(),
            engine: "sqlite".into(),
            schema_level: level,
            revision: 1,
            created_at: String::new(),
            secret_key_id: String::new(),
            with_secrets: false,
            parts: Vec::new(),
        }
    }

    #[test]
    fn newer_backups_are_refused() {
        assert!(check_version(&manifest("0.2.0", 2), 2, "0.2.0").is_ok());
        assert!(check_version(&manifest("0.1.9", 1), 2, "0.2.0").is_ok());
        assert!(check_version(&manifest("0.2.0", 3), 2, "0.2.0").is_err());
        let err = check_version(&manifest("0.10.0", 2), 2, "0.9.1").unwrap_err();
        assert!(
            err.to_string().contains("restore it with mProv 0.10.0"),
            "{err}"
        );
        assert!(check_version(&manifest("x", 1), 2, "0.2.0").is_err());
        assert_eq!(version_numbers("1.2.3-rc1"), Some((1, 2, 3)));
    }

    #[test]
    fn served_folders_are_refused_through_links() {
        let d = tempfile::tempdir().unwrap();
        let served = d.path().join("tls");
        std::fs::create_dir(&served).unwrap();
        std::os::unix::fs::symlink(&served, d.path().join("link")).unwrap();
        let served = vec![served];
        assert!(check_output_dir(&d.path().join("tls"), &served).is_err());
        assert!(check_output_dir(&d.path().join("tls/sub/deeper"), &served).is_err());
        assert!(check_output_dir(&d.path().join("link/x"), &served).is_err());
        assert!(check_output_dir(&d.path().join("backups"), &served).is_ok());
        // A sibling whose name starts the same is not inside.
        assert!(check_output_dir(&d.path().join("tls-backups"), &served).is_ok());
    }
}
