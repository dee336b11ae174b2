//! First start: everything a new install needs, made once.
//!
//! - the secret key (`<config>/secret_key`, mode 0600), unless `SECRET_KEY` is set;
//! - the superuser `admin`, with `MPROV_SUPERUSER_PASSWORD` or a random password
//!   that is logged once and kept in `<config>/superuser_password` (mode 0600);
//! - the control host's own System entry (`MPROV_MPCC_HOSTNAME`, `MPROV_MPCC_IPs`);
//! - an API key for the job server on this host, in `<config>/apikey` (mode 0600);
//! - the default scripts and data, from files built into the binary, so first
//!   start needs no network.
//!
//! Each step checks whether its result exists, and the whole is marked done in
//! the database, so a second start changes nothing, and an admin's later edits
//! (a deleted default script, say) are never undone.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

use crate::config::{Config, DB_DIR, DB_FILE, DB_SUFFIXES};
use crate::db::Db;
use crate::db::crud::{self, Mode};
use crate::db::kinds;
use crate::privileges::make_dir;
use crate::secrets::{self, SecretBox};

/// The file that keeps the generated secret key.
pub const SECRET_KEY_FILE: &str = "secret_key";
/// The file that keeps the random superuser password.
pub const SUPERUSER_PASSWORD_FILE: &str = "superuser_password";
/// The file with the local job server's API key, as `export MPROV_APIKEY=...`.
pub const APIKEY_FILE: &str = "apikey";
/// The setting naming the prefix of the shared API key made at first start
/// (the one `MPROV_SHARED_KEY_MODE` narrows).
pub const SHARED_KEY_SETTING: &str = "shared_api_key_prefix";
/// The superuser's name.
pub const SUPERUSER: &str = "admin";

const DONE_SETTING: &str = "first_start_done";
const DATA: &str = include_str!("../defaults/data.yaml");
const SCRIPT_FILES: &[(&str, &str)] = &[
    (
        "set-hostname.sh",
        include_str!("../defaults/scripts/set-hostname.sh"),
    ),
    (
        "enable-serial-console.sh",
        include_str!("../defaults/scripts/enable-serial-console.sh"),
    ),
];

/// What a start did, for the log and the tests.
#[derive(Debug, Default)]
pub struct Report {
    /// The superuser was made now.
    pub created_superuser: bool,
    /// Where the random superuser password is kept, when one was made now.
    pub password_file: Option<PathBuf>,
    /// The defaults and own System entry were loaded now.
    pub loaded_defaults: bool,
    /// The job server API key file was written now.
    pub wrote_apikey: bool,
}

/// Makes the config folder (0700), the state folder (0711: the service
/// user passes through it to its database, and lists nothing) and the
/// SQLite database's folder (0700) if they are missing, and moves a
/// database from where earlier versions kept it (`state/mprov.sqlite3`) into
/// `state/db/`, so the state folder can stay root's. A database file that
/// is a link, has more than one link, or belongs to someone other than root,
/// this user or the service user stops it before anything opens the file.
pub fn make_dirs(config: &Config) -> Result<()> {
    make_dir(&config.config_dir, 0o700)?;
    make_dir(&config.state_dir, 0o711)?;
    if let Some(db) = crate::db::sqlite_path(&config.database_url) {
        if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
            make_dir(dir, 0o700)?;
        }
        // Opened as root, a link planted by the service user would let it
        // have root read or write any file: never open one.
        for suffix in DB_SUFFIXES {
            let mut p = db.clone().into_os_string();
            p.push(suffix);
            let p = PathBuf::from(p);
            if !matches!(
                crate::privileges::kind_of(&p)?,
                crate::privileges::Kind::File | crate::privileges::Kind::Missing
            ) {
                bail!(
                    "{} is a symbolic link or not a regular file; mProv never opens a link as its database: move it aside (and restore the database from a backup if it was replaced)",
                    p.display()
                );
            }
        }
        let legacy = config.state_dir.join(DB_FILE);
        if db == config.state_dir.join(DB_DIR).join(DB_FILE)
            && !db.exists()
            && crate::privileges::kind_of(&legacy)? == crate::privileges::Kind::File
        {
            for suffix in DB_SUFFIXES {
                let (mut from, mut to) =
                    (legacy.clone().into_os_string(), db.clone().into_os_string());
                from.push(suffix);
                to.push(suffix);
                if crate::privileges::kind_of(Path::new(&from))? == crate::privileges::Kind::File {
                    fs::rename(&from, &to).with_context(|| {
                        format!(
                            "cannot move {} to {}",
                            Path::new(&from).display(),
                            Path::new(&to).display()
                        )
                    })?;
                }
            }
            tracing::info!(
                "moved the database from {} to {} (the state folder stays root's)",
                legacy.display(),
                db.display()
            );
        }
        // Opened as root next, and handed to the service user: a hard link
        // to another file, or another user's file, is neither.
        let mut allowed = vec![0, nix::unistd::Uid::effective().as_raw()];
        if let Some(name) = &config.user
            && let Ok(Some(user)) = nix::unistd::User::from_name(name)
        {
            allowed.push(user.uid.as_raw());
        }
        for suffix in DB_SUFFIXES {
            let mut p = db.clone().into_os_string();
            p.push(suffix);
            crate::privileges::check_handover(Path::new(&p), &allowed)?;
        }
    }
    Ok(())
}

/// Writes a new owner-only file; fails if it exists.
fn write_private(path: &Path, content: &str) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(content.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// The install's secret key: `SECRET_KEY`, else the kept one, else a new one.
pub fn secret_key(config: &Config) -> Result<String> {
    if let Some(k) = &config.secret_key {
        return Ok(k.clone());
    }
    let path = config.config_dir.join(SECRET_KEY_FILE);
    match fs::read_to_string(&path) {
        Ok(k) if !k.trim().is_empty() => {
            let mode = fs::metadata(&path)?.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(
                    "{} is readable by others (mode {mode:o}); run chmod 600 on it",
                    path.display()
                );
            }
            Ok(k.trim().to_owned())
        }
        Ok(_) => bail!(
            "{} is empty; remove it to have a new key made",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = secrets::random_token(48);
            write_private(&path, &format!("{key}\n"))?;
            tracing::info!("generated the install's secret key in {}", path.display());
            Ok(key)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Runs every first-start step that has not happened yet.
pub async fn run(config: &Config, db: &Db, secrets: &SecretBox) -> Result<Report> {
    let mut report = Report::default();
    superuser(config, db, secrets, &mut report).await?;
    if db.setting(DONE_SETTING).await?.is_none() {
        own_system(config, db, secrets).await?;
        defaults(db, secrets).await?;
        db.set_setting(DONE_SETTING, &crate::time::now()).await?;
        report.loaded_defaults = true;
        tracing::info!("first start: loaded the default scripts and data");
    }
    apikey_file(config, db, &mut report).await?;
    Ok(report)
}

async fn superuser(config: &Config, db: &Db, sb: &SecretBox, report: &mut Report) -> Result<()> {
    let users = kind("users")?;
    if db
        .list(
            users,
            &crud::ListQuery {
                limit: Some(1),
                ..Default::default()
            },
        )
        .await?
        .total
        > 0
    {
        return Ok(());
    }
    let (password, random) = match &config.superuser_password {
        Some(p) => (p.clone(), false),
        None => (secrets::random_token(18), true),
    };
    let body = json!({"username": SUPERUSER, "password": password, "is_admin": true});
    create(db, users, &body, sb)
        .await
        .context("creating the superuser")?;
    report.created_superuser = true;
    if random {
        let path = config.config_dir.join(SUPERUSER_PASSWORD_FILE);
        if path.exists() {
            fs::remove_file(&path).with_context(|| format!("cannot replace {}", path.display()))?;
        }
        write_private(&path, &format!("{password}\n"))?;
        tracing::warn!(
            "first start: created the superuser {SUPERUSER:?} with password {password} (shown once; kept in {}, readable by root only)",
            path.display()
        );
        report.password_file = Some(path);
    } else {
        tracing::info!(
            "first start: created the superuser {SUPERUSER:?} with the password from MPROV_SUPERUSER_PASSWORD"
        );
    }
    Ok(())
}

async fn own_system(config: &Config, db: &Db, sb: &SecretBox) -> Result<()> {
    let systems = kind("systems")?;
    let hostname = crud::parse_hostname(&config.hostname).map_err(anyhow::Error::msg)?;
    if db.get(systems, &hostname).await.is_ok() {
        return Ok(());
    }
    let nics: Vec<Value> = config
        .ips
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            let mut nic = Map::new();
            nic.insert("name".into(), json!(format!("net{i}")));
            nic.insert(
                if ip.is_ipv4() { "ipv4" } else { "ipv6" }.into(),
                json!(ip.to_string()),
            );
            if !config.domain.is_empty() {
                nic.insert(
                    "hostname".into(),
                    json!(format!("{hostname}.{}", config.domain)),
                );
            }
            Value::Object(nic)
        })
        .collect();
    let body = json!({"hostname": hostname, "netboot": false, "nics": nics});
    create(db, systems, &body, sb)
        .await
        .context("creating the control host's own System entry")?;
    tracing::info!("first start: created the System entry of this control host, {hostname}");
    Ok(())
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    scripts: Vec<Map<String, Value>>,
    distros: Vec<Map<String, Value>>,
    images: Vec<Map<String, Value>>,
}

async fn defaults(db: &Db, sb: &SecretBox) -> Result<()> {
    let data: Defaults = serde_saphyr::from_str(DATA).context("the built-in defaults/data.yaml")?;
    for mut script in data.scripts {
        let file = script
            .remove("file")
            .and_then(|f| f.as_str().map(str::to_owned))
            .unwrap_or_default();
        let content = SCRIPT_FILES
            .iter()
            .find(|(name, _)| *name == file)
            .map(|(_, c)| *c)
            .with_context(|| {
                format!("defaults/data.yaml names a script file {file:?} that is not built in")
            })?;
        script.insert("content".into(), json!(content));
        create_if_missing(db, "scripts", script, sb).await?;
    }
    for distro in data.distros {
        create_if_missing(db, "distros", distro, sb).await?;
    }
    for image in data.images {
        create_if_missing(db, "images", image, sb).await?;
    }
    Ok(())
}

async fn create_if_missing(
    db: &Db,
    kind_name: &str,
    body: Map<String, Value>,
    sb: &SecretBox,
) -> Result<()> {
    let k = kind(kind_name)?;
    let slug = body
        .get("slug")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if db.get(k, &slug).await.is_ok() {
        return Ok(());
    }
    create(db, k, &Value::Object(body), sb)
        .await
        .with_context(|| format!("loading the default {kind_name} {slug:?}"))
}

async fn apikey_file(config: &Config, db: &Db, report: &mut Report) -> Result<()> {
    let path = config.config_dir.join(APIKEY_FILE);
    if path.exists() {
        return Ok(());
    }
    let body = json!({"name": "local job server"});
    let keys = kind("apikeys")?;
    let prepared = crud::validate_value(keys, &body, Mode::Create, &SecretBox::new(""))?;
    let row = db
        .create(keys, prepared)
        .await
        .context("creating the job server's API key")?;
    let (Some(prefix), Some(key)) = (
        row.get("prefix").and_then(Value::as_str),
        row.get("key").and_then(Value::as_str),
    ) else {
        bail!("the new API key came back without its prefix or key");
    };
    db.set_setting(SHARED_KEY_SETTING, prefix)
        .await
        .context("recording the shared API key")?;
    write_private(&path, &format!("export MPROV_APIKEY={key}\n"))?;
    tracing::info!("wrote the local job server's API key to {}", path.display());
    report.wrote_apikey = true;
    Ok(())
}

fn kind(name: &str) -> Result<&'static kinds::Kind> {
    kinds::kind(name).with_context(|| format!("no kind {name}"))
}

async fn create(db: &Db, k: &'static kinds::Kind, body: &Value, sb: &SecretBox) -> Result<()> {
    let prepared = crud::validate_value(k, body, Mode::Create, sb)?;
    db.create(k, prepared).await?;
    Ok(())
}
