//! The `mprov-control` command line: `serve`, `migrate`, `superuser`, `apikey`,
//! `backup`, `restore`.
//!
//! Every subcommand reads the same settings (flags or the original mProv's
//! environment variables, see `--help`), so `mprov-control apikey list` talks to
//! the database `serve` uses without further flags.

use std::io::BufRead;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Settings};
use crate::db::crud::{self, ListQuery, Mode};
use crate::db::{Db, kinds};
use crate::first_start;
use crate::http;
use crate::pki::{SignerClient, SpawnSpec, ca, helper, https};
use crate::privileges;
use crate::secrets::{self, SecretBox};

/// The mProv control service: inventory, REST API and boot configuration of an
/// HPC cluster.
///
/// With no configuration it keeps an SQLite database in /var/lib/mprov and its
/// secrets in /etc/mprov. Set DB_ENGINE=mysql or postgres (with DB_HOST, DB_PORT,
/// DB_NAME, DB_USER, DB_PASS) for a real site.
#[derive(Debug, Parser)]
#[command(name = "mprov-control", version, propagate_version = true)]
pub struct Cli {
    /// Log filter, e.g. info, debug, or mprov_control=debug,sqlx=warn.
    ///
    /// Each line is tagged [E], [W], [I] or [D] with its module, and
    /// stamped unless standard error is journald's (JOURNAL_STREAM names
    /// it), which stamps lines itself; there each line also carries its
    /// syslog priority, so `journalctl -p warning` shows warnings and
    /// errors only. Colour only on a terminal.
    #[arg(
        long,
        env = "MPROV_LOG",
        default_value = "info,sqlx=warn",
        global = true
    )]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the control service (migrates the database and does the first-start
    /// set-up first).
    Serve {
        #[command(flatten)]
        settings: Settings,
    },
    /// Bring the database schema up to date, then exit.
    Migrate {
        #[command(flatten)]
        settings: Settings,
    },
    /// Create an admin user or set a user's password.
    Superuser {
        #[command(subcommand)]
        action: SuperuserAction,
        #[command(flatten)]
        settings: Settings,
    },
    /// The signing helper's supervisor: `serve` starts it before dropping
    /// root; it runs `signer-worker` and starts it again when it dies. Not
    /// meant to be run by hand.
    #[command(hide = true)]
    Signer {
        /// The worker's arguments, passed on to it.
        #[command(flatten)]
        args: SignerArgs,
    },
    /// The signing helper: the only process that reads the CA key. It
    /// answers on its standard input and output.
    #[command(hide = true)]
    SignerWorker {
        /// Where the CA is and whom to become.
        #[command(flatten)]
        args: SignerArgs,
    },
    /// Make a one-time enrollment token for a job server; it is printed once
    /// and only its hash is kept.
    EnrollToken {
        /// The job server's name: only that name can enroll with the token.
        #[arg(long)]
        name: String,
        /// Replace the certificate of a job server that has one (without
        /// this, the token enrolls only a name with no valid certificate).
        #[arg(long)]
        replace: bool,
        /// Hours until it expires.
        #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u32).range(1..=720))]
        hours: u32,
        #[command(flatten)]
        settings: Settings,
    },
    /// Write a backup: every table (scripts and uploaded files included) of one
    /// consistent snapshot, taken while the service keeps serving, as one
    /// archive (mode 0600, in a 0700 folder) with a manifest of versions, row
    /// counts and SHA-256 sums.
    Backup {
        /// The folder to write into (default: MPROV_BACKUP_DIR, i.e.
        /// STATE_DIR/backups). Folders the network is served from are refused.
        #[arg(long)]
        output_dir: Option<std::path::PathBuf>,
        /// Also put the secret key and the TLS folder (the CA key) in the
        /// archive, so another host can open the BMC credentials and keep the
        /// CA. The archive is then a credential: keep it like the CA key.
        #[arg(long)]
        with_secrets: bool,
        #[command(flatten)]
        settings: Settings,
    },
    /// Restore a backup into the configured database (SQLite, MariaDB or
    /// PostgreSQL, whichever the backup came from). The archive is checked
    /// first; a database that holds data is refused without --force; an older
    /// backup is migrated; a newer one is refused. Stop the control service
    /// first.
    Restore {
        /// The archive `mprov-control backup` wrote.
        file: std::path::PathBuf,
        /// Replace a database that holds data (and a different secret key).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        settings: Settings,
    },
    /// Create, list or revoke API keys.
    Apikey {
        #[command(subcommand)]
        action: ApikeyAction,
        #[command(flatten)]
        settings: Settings,
    },
}

#[derive(Debug, Subcommand)]
enum SuperuserAction {
    /// Create an admin user. Without --password-stdin a random password is
    /// made and printed once.
    Create {
        /// The user name.
        username: String,
        /// Read the password from the first line of standard input.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Set a user's password. Without --password-stdin a random password is
    /// made and printed once.
    SetPassword {
        /// The user name.
        username: String,
        /// Read the password from the first line of standard input.
        #[arg(long)]
        password_stdin: bool,
    },
}

#[derive(Debug, Subcommand)]
enum ApikeyAction {
    /// Create an API key and print it (only its hash is kept: it cannot be
    /// shown again).
    Create {
        /// What the key is for.
        name: String,
        /// Days until it expires (default: never).
        #[arg(long)]
        expires_in_days: Option<u32>,
    },
    /// List the API keys (never the keys themselves).
    List,
    /// Revoke an API key by id or prefix.
    Revoke {
        /// The key's id, or its prefix (the part before the dot).
        key: String,
    },
}

/// Runs the command line; the process's exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    mprov_process::logging::init(&cli.log);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    mprov_process::exit(runtime.block_on(run(cli.command)))
}

/// What the signing helper (`signer` and its `signer-worker`) is told.
#[derive(Debug, Args)]
pub struct SignerArgs {
    /// The TLS folder holding the CA.
    #[arg(long)]
    tls_dir: std::path::PathBuf,
    /// The control host's name, for a new CA's name.
    #[arg(long, default_value = "mprov")]
    hostname: String,
    /// The system user the worker becomes once the CA key is read (when
    /// started as root).
    #[arg(long)]
    user: Option<String>,
}

/// What every subcommand starts with: the configuration, the folders, the
/// secret key and the migrated database.
async fn open(settings: Settings) -> Result<(Config, Db, SecretBox)> {
    let config = Config::from_settings(settings)?;
    mprov_process::logging::set_time_zone(config.time_zone.1.clone());
    first_start::make_dirs(&config)?;
    let key = first_start::secret_key(&config)?;
    let db = Db::open(&config.database_url).await?;
    Ok((config, db, SecretBox::new(&key)))
}

async fn run(command: Command) -> Result<()> {
    // Everything the service and its commands write is the owner's alone;
    // the few files meant for others (certificates) get their mode set.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    match command {
        Command::Serve { settings } => serve(settings).await,
        Command::Migrate { settings } => migrate(settings).await,
        Command::Superuser { action, settings } => superuser(settings, action).await,
        Command::Signer { args } => {
            let worker = SpawnSpec {
                exe: std::env::current_exe().context("cannot find this program's path")?,
                tls_dir: args.tls_dir,
                hostname: args.hostname,
                user: args.user,
            };
            helper::supervise(|| worker.command("signer-worker")).context("signer")
        }
        Command::SignerWorker { args } => {
            run_signer(&args.tls_dir, &args.hostname, args.user.as_deref())
        }
        Command::EnrollToken {
            name,
            replace,
            hours,
            settings,
        } => enroll_token(settings, &name, replace, hours).await,
        Command::Apikey { action, settings } => apikey(settings, action).await,
        Command::Backup {
            output_dir,
            with_secrets,
            settings,
        } => backup(settings, output_dir, with_secrets).await,
        Command::Restore {
            file,
            force,
            settings,
        } => restore(settings, &file, force).await,
    }
}

/// `migrate`: opening the database runs the migrations.
async fn migrate(settings: Settings) -> Result<()> {
    let (config, db, _) = open(settings).await?;
    println!(
        "database {} is up to date",
        crate::db::redact_url(&config.database_url)
    );
    drop(db);
    Ok(())
}

/// `enroll-token`: a one-time token that enrolls the job server `name`.
async fn enroll_token(settings: Settings, name: &str, replace: bool, hours: u32) -> Result<()> {
    if !crate::enrollment::valid_name(name) {
        bail!("--name {name:?} is not a job server's name (letters, digits, '-', '.', '_')");
    }
    let (_, db, _) = open(settings).await?;
    let ttl = std::time::Duration::from_secs(u64::from(hours) * 3600);
    let purpose = if replace {
        crate::enrollment::Purpose::Replace
    } else {
        crate::enrollment::Purpose::New
    };
    let token = crate::enrollment::create_token_for(&db, name, ttl, purpose).await?;
    eprintln!(
        "enrollment token (single use, expires {}; it cannot be shown again):",
        token.expires_at
    );
    println!("{}", token.token);
    Ok(())
}

async fn backup(
    settings: Settings,
    output_dir: Option<std::path::PathBuf>,
    with_secrets: bool,
) -> Result<()> {
    let config = Config::from_settings(settings)?;
    mprov_process::logging::set_time_zone(config.time_zone.1.clone());
    let out = output_dir.unwrap_or_else(|| config.backup_dir.clone());
    // A served folder is refused before anything is opened or made.
    crate::backup::check_output_dir(&out, &crate::backup::served_dirs(&config))?;
    first_start::make_dirs(&config)?;
    let key = first_start::secret_key(&config)?;
    // Migrated like every subcommand: the archive records the current level.
    let db = crate::db::Db::open(&config.database_url).await?;
    let report = crate::backup::backup(&config, &db, &key, &out, with_secrets).await?;
    let rows: u64 = report.manifest.parts.iter().filter_map(|p| p.rows).sum();
    println!(
        "wrote {} ({} bytes, {} tables, {rows} rows, revision {}, schema level {}, {})",
        report.path.display(),
        report.bytes,
        report
            .manifest
            .parts
            .iter()
            .filter(|p| p.rows.is_some())
            .count(),
        report.manifest.revision,
        report.manifest.schema_level,
        db.engine()
    );
    if with_secrets {
        eprintln!(
            "warning: this archive holds the secret key and the CA key: anyone who has it can open the BMC passwords and issue certificates this cluster trusts. Keep it like the CA key."
        );
    } else {
        eprintln!(
            "note: the secret key is not in this archive. BMC passwords restored on another host open only with this install's secret key ({}): keep a copy of it, or use --with-secrets.",
            config
                .config_dir
                .join(first_start::SECRET_KEY_FILE)
                .display()
        );
    }
    db.pool().close().await;
    Ok(())
}

async fn restore(settings: Settings, file: &std::path::Path, force: bool) -> Result<()> {
    let config = Config::from_settings(settings)?;
    mprov_process::logging::set_time_zone(config.time_zone.1.clone());
    // The folders are made by the restore, once the archive is found sound.
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let report = crate::backup::restore(&config, bytes, force).await?;
    let rows: u64 = report.rows.iter().map(|(_, n)| n).sum();
    println!(
        "restored {rows} rows in {} tables into {} (schema level {} migrated to {}); inventory revision {}",
        report.rows.len(),
        crate::db::redact_url(&config.database_url),
        report.from_level,
        report.to_level,
        report.revision
    );
    if report.secrets_restored {
        println!(
            "restored the secret key into {} and the TLS folder {}",
            config.config_dir.display(),
            config.tls_dir.display()
        );
    } else if !report.key_matches {
        eprintln!(
            "warning: the backup holds no secret key and this host's key is not the one it was made with: BMC passwords cannot be decrypted here. Copy the original install's {} to {} (or restore a backup made with --with-secrets), or set the BMC passwords again.",
            first_start::SECRET_KEY_FILE,
            config.config_dir.display()
        );
    }
    Ok(())
}

async fn serve(settings: Settings) -> Result<()> {
    // Catch SIGTERM and SIGINT from the start: the listen files below tell
    // supervisors and tests that the service is up, and a stop sent right
    // after must shut it down cleanly, not kill it.
    let signals = mprov_process::Signals::new()?;
    raise_file_limit();
    let (config, db, sb) = open(settings).await?;
    let report = set_up(&config, &db, &sb).await?;
    let web_user = service_user(&config)?;
    close_first_start_pool(db).await;
    tighten_folders(&config, web_user.as_ref())?;
    let (signer, tls) = spawn_signer(&config).await?;
    let listeners = bind(&config, &tls, &report).await?;
    drop_privileges(&config, web_user.as_ref())?;
    let db = reopen_pool(&config).await?;
    let state = Arc::new(
        http::Inner::new(db, Arc::new(config), sb)
            .with_ca(tls.ca_pem.clone())
            .with_signer(signer),
    );
    run_servers(state, listeners, signals).await
}

/// Start-up step: the soft open-file limit raised to the hard one, so that
/// connections have room (`http::listen` fits its cap to what is left).
fn raise_file_limit() {
    match mprov_process::raise_file_limit() {
        Ok(l) if l.now > l.was => {
            tracing::info!("open-file limit raised from {} to {}", l.was, l.now);
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
    }
}

/// Start-up step: the first start's set-up with the database opened as the
/// starting user (schema, admin account, secrets), the token the local job
/// server enrolls with, and the site certificate's settings checked.
async fn set_up(config: &Config, db: &Db, sb: &SecretBox) -> Result<first_start::Report> {
    tracing::info!(
        "database: {} ({}); time zone {}",
        crate::db::redact_url(&config.database_url),
        db.engine(),
        config.time_zone.0
    );
    if config.skip_version_check {
        tracing::warn!(
            "MPROV_SKIP_VERSION_CHECK=1: the API version check is off; never do this in production"
        );
    }
    let report = first_start::run(config, db, sb).await?;
    if config.shared_key_mode == crate::config::SharedKeyMode::All {
        tracing::warn!(
            "MPROV_SHARED_KEY_MODE=all: the shared API key still works everywhere; enroll job servers and nodes with certificates, then set it to nodes or off"
        );
    }
    local_enroll_token(config, db).await?;
    https::site_cert(config).context("cannot set up TLS")?;
    Ok(report)
}

/// Start-up step: the user this service becomes. Started as root, the
/// helper and this service each become their own system user;
/// MPROV_SERVICE_USER=root keeps this service root (not advised). `None`:
/// this service keeps the user it runs as.
fn service_user(config: &Config) -> Result<Option<nix::unistd::User>> {
    Ok(match &config.user {
        Some(name) if privileges::is_root() => Some(privileges::system_user(name)?),
        _ => None,
    })
}

/// Start-up step: the first start is done with the database; the service's
/// own pool is opened by [`reopen_pool`], once the files are the service
/// user's and this process is that user. Setting owners and modes opens and
/// closes the SQLite files, which would drop the pool's locks (see
/// `Db::close`).
async fn close_first_start_pool(db: Db) {
    db.close().await;
}

/// Start-up step, before the signer reads the CA: the folders are root's
/// again, and only the database's own folder is the service user's.
fn tighten_folders(config: &Config, web_user: Option<&nix::unistd::User>) -> Result<()> {
    secure_folders(config, web_user)?;
    ca::ensure_dir(&config.tls_dir).context("cannot set up TLS")?;
    Ok(())
}

/// Start-up step: the signing helper, started (as its own user when this
/// process is root), and the TLS set-up it signs.
async fn spawn_signer(config: &Config) -> Result<(SignerClient, https::Tls)> {
    let signer = SignerClient::spawn(SpawnSpec {
        exe: std::env::current_exe().context("cannot find this program's path")?,
        tls_dir: config.tls_dir.clone(),
        hostname: config.hostname.clone(),
        user: if privileges::is_root() {
            config.signer_user.clone()
        } else {
            None
        },
    })
    .await?;
    let tls = https::prepare(config, &signer)
        .await
        .context("cannot set up TLS")?;
    match &tls.server {
        https::ServerCert::Site => {
            tracing::info!("HTTPS serves the site certificate from MPROV_TLS_CERT");
        }
        https::ServerCert::Kept => tracing::debug!("the HTTPS certificate is still good"),
        https::ServerCert::Made(_) => {}
    }
    tracing::info!(
        "CA certificate {} (sha256 {})",
        tls.dir.join(ca::CA_CERT).display(),
        tls.ca_fingerprint()
    );
    Ok((signer, tls))
}

/// What [`bind`] bound: the HTTP listener, and the HTTPS one with its TLS
/// configuration.
struct Listeners {
    http: tokio::net::TcpListener,
    https: Option<(std::net::TcpListener, Arc<rustls::ServerConfig>)>,
}

/// Start-up step: binds the listeners (ports under 1024 need root, so before
/// the switch of user) and writes the listen files, where only root may
/// write.
async fn bind(
    config: &Config,
    tls: &https::Tls,
    report: &first_start::Report,
) -> Result<Listeners> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    let https = match config.https_listen {
        Some(at) => {
            let l = std::net::TcpListener::bind(at).with_context(|| {
                format!(
                    "cannot listen on {at} for HTTPS (MPROV_HTTPS_LISTEN; `off` turns HTTPS off)"
                )
            })?;
            Some((l.local_addr()?, l, https::server_config(tls)?))
        }
        None => None,
    };
    tracing::info!(
        "mprov-control {} listening on http://{addr}/api/v1/",
        env!("CARGO_PKG_VERSION")
    );
    if let Some((at, _, _)) = &https {
        tracing::info!("HTTPS on https://{at}/api/v1/ (client certificates from the CA accepted)");
    }
    if let Some(p) = &report.password_file {
        tracing::info!("the admin password is in {}", p.display());
    }
    if let Some(path) = &config.listen_file {
        write_address(path, addr)?;
    }
    if let (Some(path), Some((at, _, _))) = (&config.https_listen_file, &https) {
        write_address(path, *at)?;
    }
    Ok(Listeners {
        http: listener,
        https: https.map(|(_, l, server_config)| (l, server_config)),
    })
}

/// Start-up step: becomes the service user, and checks it can open the
/// SQLite database.
fn drop_privileges(config: &Config, web_user: Option<&nix::unistd::User>) -> Result<()> {
    match web_user {
        Some(user) => {
            privileges::drop_to(user)?;
            if let Some(db) = crate::db::sqlite_path(&config.database_url) {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&db)
                    .with_context(|| {
                        format!(
                            "the web service's user {} cannot open {}: make the folders above it searchable by that user (chmod o+x), or set MPROV_SERVICE_USER=root",
                            user.name,
                            db.display()
                        )
                    })?;
            }
            tracing::info!(
                "running as {}; the signing helper as {}",
                user.name,
                config.signer_user.as_deref().unwrap_or("root")
            );
        }
        None if privileges::is_root() => {
            tracing::warn!("MPROV_SERVICE_USER=root: the web service keeps running as root")
        }
        None => tracing::info!(
            "not started as root: the web service and the signing helper share this user"
        ),
    }
    Ok(())
}

/// Start-up step: the service's own pool, opened as the user that serves,
/// after every file of the database was handled (so any -wal and -shm files
/// it makes are that user's too).
async fn reopen_pool(config: &Config) -> Result<Db> {
    Ok(Db::connect(&config.database_url).await?)
}

/// The last step: serves on `listeners` until a signal (or the loss of the
/// signing helper) stops it.
async fn run_servers(
    state: http::AppState,
    listeners: Listeners,
    signals: mprov_process::Signals,
) -> Result<()> {
    let shutdown = CancellationToken::new();
    signals.cancel_on_signal(shutdown.clone());
    let mut servers = JoinSet::new();
    if let Some(signer) = &state.signer {
        let (lost, stop) = (signer.lost(), shutdown.clone());
        servers.spawn(async move {
            tokio::select! {
                // Once a stop was asked for, dropping the helper's socket
                // ends it on purpose: only a loss while serving counts.
                biased;
                () = stop.cancelled() => Ok(()),
                () = lost.cancelled() => bail!(
                    "the signing helper's supervisor is gone and this service cannot start it again (it runs without root); exiting so that the service is started again (systemd Restart=on-failure)"
                ),
            }
        });
    }
    let (db, stop) = (state.db.clone(), shutdown.clone());
    let keep_days = state.config.writes.boot_events_keep_days;
    let session_idle = state.config.pages.session_idle;
    servers.spawn(async move {
        boot_events_retention(&db, keep_days, session_idle, &stop).await;
        Ok(())
    });
    let (db, stop) = (state.db.clone(), shutdown.clone());
    let silence = state.config.silence;
    servers.spawn(async move {
        silent_jobservers(&db, silence, &stop).await;
        Ok(())
    });
    // One look a second for lease reports other replicas stored, for the
    // `/ipxe/` requests waiting on them.
    let (watched, stop) = (state.clone(), shutdown.clone());
    servers.spawn(async move {
        http::ipxe::recheck(watched, stop).await;
        Ok(())
    });
    let (plain, stop) = (state.clone(), shutdown.clone());
    let http_listener = listeners.http;
    servers.spawn(async move {
        http::serve(http_listener, plain, stop)
            .await
            .context("HTTP server failed")
    });
    if let Some((l, server_config)) = listeners.https {
        let stop = shutdown.clone();
        servers.spawn(async move {
            http::serve_tls(l, server_config, state, stop)
                .await
                .context("HTTPS server failed")
        });
    }
    mprov_process::run_servers(servers, shutdown).await
}

/// How often `serve` removes old boot events.
const RETENTION_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes boot events older than `keep_days` at start and every
/// [`RETENTION_EVERY`] until `stop`, and the admin sessions idle for longer
/// than `session_idle`; a failure is logged and tried again at the next round.
async fn boot_events_retention(
    db: &Db,
    keep_days: u32,
    session_idle: std::time::Duration,
    stop: &CancellationToken,
) {
    loop {
        match crate::boot::prune(db, jiff::Timestamp::now(), keep_days).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                removed = n,
                keep_days,
                "boot events: removed {n} events older than {keep_days} days (MPROV_BOOT_EVENTS_KEEP_DAYS)"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "boot events: the retention failed; trying again in an hour")
            }
        }
        if let Err(e) = crate::sessions::prune(db, session_idle, jiff::Timestamp::now()).await {
            tracing::warn!(error = %e, "admin sessions: removing idle ones failed; trying again in an hour");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RETENTION_EVERY) => {}
        }
    }
}

/// How often `serve` looks for silent job servers.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Fails the running jobs of silent job servers and deletes long-silent
/// ones ([`crate::jobs::sweep`]) at start and every [`SWEEP_EVERY`] until
/// `stop`; a failure is logged and tried again at the next round.
async fn silent_jobservers(
    db: &Db,
    silence: crate::config::JobServerSilence,
    stop: &CancellationToken,
) {
    if silence.fail_jobs_after_minutes == 0 && silence.delete_after_days == 0 {
        return;
    }
    loop {
        match crate::jobs::sweep(db, jiff::Timestamp::now(), silence).await {
            Ok(swept) => {
                for id in &swept.failed_jobs {
                    tracing::warn!(
                        job = id,
                        minutes = silence.fail_jobs_after_minutes,
                        "jobs: failed job {id}: its job server sent no heartbeat for {} minutes (JOBSERVER_FAIL_JOBS_AFTER_MINUTES)",
                        silence.fail_jobs_after_minutes
                    );
                }
                for name in &swept.deleted_jobservers {
                    tracing::warn!(
                        jobserver = %name,
                        days = silence.delete_after_days,
                        "jobs: deleted job server {name} and revoked its certificates: no heartbeat for {} days (JOBSERVER_DELETE_AFTER_DAYS)",
                        silence.delete_after_days
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "jobs: the sweep of silent job servers failed; trying again in a minute")
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(SWEEP_EVERY) => {}
        }
    }
}

async fn local_enroll_token(config: &Config, db: &Db) -> Result<()> {
    let path = config.config_dir.join(crate::enrollment::TOKEN_FILE);
    if crate::enrollment::jobserver_enrolled(db).await? {
        if path.exists() {
            std::fs::remove_file(&path)
                .with_context(|| format!("cannot remove {}", path.display()))?;
        }
        return Ok(());
    }
    // Bound to this host's name: the job server on this host enrolls under
    // it (its --name defaults to the host name).
    let name = config.hostname.split('.').next().unwrap_or_default();
    if let Ok(kept) = std::fs::read_to_string(&path)
        && crate::enrollment::token_usable(db, kept.trim(), name).await?
    {
        return Ok(());
    }
    let token =
        crate::enrollment::create_token(db, name, crate::enrollment::DEFAULT_TOKEN_TTL).await?;
    ca::write_file(&path, format!("{}\n", token.token).as_bytes(), 0o600)?;
    tracing::info!(
        "no job server has enrolled yet: a one-time token for the local one (named {name}) is in {} (expires {})",
        path.display(),
        token.expires_at
    );
    Ok(())
}

/// Sets the owners and modes of the service's folders at every start, so
/// that what the web service's user may change cannot reach root:
/// - the config folder and its files: this process's user (root), 0700 and
///   owner-only files;
/// - the state folder: root's, 0711 (passed through, never listed); the TLS
///   folder inside it is checked by [`ca::ensure_dir`] and never handed over;
/// - an SQLite database's folder and files: the web service's user's, 0700
///   and 0600; that folder must hold nothing else of mProv's, and the user
///   must be able to reach it (checked here, before the switch).
///
/// Links are never followed (see [`privileges`]).
fn secure_folders(config: &Config, user: Option<&nix::unistd::User>) -> Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let me: privileges::Owner = privileges::is_root()
        .then(|| (nix::unistd::Uid::from_raw(0), nix::unistd::Gid::from_raw(0)));
    privileges::tighten_tree(&config.config_dir, me, 0o700)?;
    let state_mode = if user.is_some() { 0o711 } else { 0o700 };
    privileges::own_folder(&config.state_dir, me, state_mode)?;
    let Some(db) = crate::db::sqlite_path(&config.database_url) else {
        return Ok(());
    };
    let db = std::path::absolute(&db).with_context(|| format!("the path {}", db.display()))?;
    let Some(dir) = db.parent() else {
        return Ok(());
    };
    let owner = match user {
        Some(u) => Some((u.uid, u.gid)),
        None => me,
    };
    let mode = std::fs::metadata(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .mode();
    let abs = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_owned());
    let keep = [
        abs(&config.config_dir),
        abs(&config.state_dir),
        abs(&config.tls_dir),
    ];
    let keep: Vec<&std::path::Path> = keep.iter().map(|p| p.as_path()).collect();
    if let Some(why) = privileges::db_folder_problem(dir, &keep, mode) {
        return Err(privileges::PrivError::SharedDbFolder {
            dir: dir.to_owned(),
            why,
            suggested: config
                .state_dir
                .join(crate::config::DB_DIR)
                .join(crate::config::DB_FILE),
        }
        .into());
    }
    privileges::own_folder(dir, owner, 0o700)?;
    for suffix in crate::config::DB_SUFFIXES {
        let mut p = db.clone().into_os_string();
        p.push(suffix);
        let p = std::path::PathBuf::from(p);
        match privileges::set_owner_mode(&p, owner, 0o600)? {
            privileges::Kind::File | privileges::Kind::Missing => {}
            _ => bail!(
                "{} is a symbolic link or not a regular file; mProv never follows links: move it aside (restore the database from a backup if it was replaced)",
                p.display()
            ),
        }
    }
    if let Some(u) = user {
        privileges::check_reachable(&db, u)?;
    }
    Ok(())
}

/// `mprov-control signer`: make or load the CA, become `user`, then sign
/// what `serve` asks over standard input and output.
fn run_signer(tls_dir: &std::path::Path, hostname: &str, user: Option<&str>) -> Result<()> {
    let signer = match helper::Signer::open(tls_dir, hostname) {
        Ok(s) => s,
        Err(e) => {
            // The supervisor gives up on this exit code, and the reason is
            // in the log.
            tracing::error!("signer: {e:#}");
            eprintln!("error: signer: {e}");
            std::process::exit(helper::WORKER_CANNOT_OPEN);
        }
    };
    if let Some(name) = user
        && privileges::is_root()
    {
        let user = privileges::system_user(name)?;
        privileges::drop_to(&user)?;
        tracing::debug!("signer: running as {name}");
    }
    helper::announce(&signer, std::io::stdout().lock()).context("signer: hand-shake")?;
    helper::serve(&signer, std::io::stdin().lock(), std::io::stdout().lock()).context("signer")
}

/// Writes `addr` to `path` whole, so a reader never sees half an address.
fn write_address(path: &std::path::Path, addr: std::net::SocketAddr) -> Result<()> {
    mprov_process::write_atomic(path, format!("{addr}\n").as_bytes(), 0o644)
        .with_context(|| format!("cannot write {}", path.display()))
}

fn read_password(from_stdin: bool) -> Result<(String, bool)> {
    if !from_stdin {
        return Ok((secrets::random_token(18), true));
    }
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the password from standard input")?;
    let pw = line.trim_end_matches(['\n', '\r']).to_owned();
    if pw.is_empty() {
        bail!("standard input held no password");
    }
    Ok((pw, false))
}

fn kind(name: &str) -> Result<&'static kinds::Kind> {
    kinds::kind(name).with_context(|| format!("no kind {name}"))
}

fn validated(
    k: &'static kinds::Kind,
    body: &Value,
    mode: Mode,
    sb: &SecretBox,
) -> Result<crud::Prepared> {
    Ok(crud::validate_value(k, body, mode, sb)?)
}

async fn superuser(settings: Settings, action: SuperuserAction) -> Result<()> {
    let (_, db, sb) = open(settings).await?;
    let users = kind("users")?;
    match action {
        SuperuserAction::Create {
            username,
            password_stdin,
        } => {
            let (password, random) = read_password(password_stdin)?;
            let body = json!({"username": username, "password": password, "is_admin": true});
            db.create(users, validated(users, &body, Mode::Create, &sb)?)
                .await?;
            println!("created admin user {username}");
            if random {
                println!("password: {password}");
            }
        }
        SuperuserAction::SetPassword {
            username,
            password_stdin,
        } => {
            let (password, random) = read_password(password_stdin)?;
            let body = json!({"password": password});
            db.update(
                users,
                &username,
                validated(users, &body, Mode::Update, &sb)?,
            )
            .await?;
            println!("set the password of {username}");
            if random {
                println!("password: {password}");
            }
        }
    }
    Ok(())
}

async fn apikey(settings: Settings, action: ApikeyAction) -> Result<()> {
    let (_, db, sb) = open(settings).await?;
    let keys = kind("apikeys")?;
    match action {
        ApikeyAction::Create {
            name,
            expires_in_days,
        } => {
            let mut body = json!({"name": name});
            if let Some(days) = expires_in_days {
                let at = jiff::Timestamp::now()
                    .checked_add(jiff::SignedDuration::from_hours(i64::from(days) * 24))
                    .context("expiry out of range")?;
                body["expires_at"] = json!(crate::time::format_ts(at));
            }
            let row = db
                .create(keys, validated(keys, &body, Mode::Create, &sb)?)
                .await?;
            let key = row
                .get("key")
                .and_then(Value::as_str)
                .context("the new API key came back without its key")?;
            println!(
                "created API key {} (id {}); it is shown only now:",
                name, row["id"]
            );
            println!("{key}");
        }
        ApikeyAction::List => {
            let mut q = ListQuery {
                limit: Some(crud::MAX_LIMIT),
                ..Default::default()
            };
            println!(
                "{:>6}  {:<10}  {:<8}  {:<21}  NAME",
                "ID", "PREFIX", "REVOKED", "EXPIRES"
            );
            loop {
                let page = db.list(keys, &q).await?;
                for k in &page.items {
                    println!(
                        "{:>6}  {:<10}  {:<8}  {:<21}  {}",
                        k["id"],
                        k["prefix"].as_str().unwrap_or_default(),
                        k["revoked"],
                        k["expires_at"].as_str().unwrap_or("never"),
                        k["name"].as_str().unwrap_or_default()
                    );
                }
                match page.next {
                    Some(next) => q.cursor = Some(next),
                    None => break,
                }
            }
        }
        ApikeyAction::Revoke { key } => {
            // A prefix first (older keys' prefixes may be all digits), then an id.
            let q = ListQuery {
                filters: vec![("prefix".into(), key.clone())],
                ..Default::default()
            };
            let by_prefix = db
                .list(keys, &q)
                .await?
                .items
                .first()
                .map(|row| row["id"].to_string());
            let id = match by_prefix {
                Some(id) => id,
                None if key.chars().all(|c| c.is_ascii_digit()) => key.clone(),
                None => bail!("no API key has id or prefix {key:?}"),
            };
            let body = json!({"revoked": true});
            db.update(keys, &id, validated(keys, &body, Mode::Update, &sb)?)
                .await?;
            println!("revoked API key {id}");
        }
    }
    Ok(())
}
