//! The job server's daemon work beside its boot services: it registers its
//! row, heartbeats on each address it registered, runs the jobs of its
//! modules and follows the inventory for `libgenders`.
//!
//! In order, once enrolled (a client certificate: only that names the job
//! server to the control service):
//!
//! 1. **Registration** (unless `--no-register`): its host id
//!    ([`host_id`]), its modules, its image server's port and its addresses
//!    ([`addresses`]), posted until the control service takes them; every
//!    failure is retried like enrollment ([`retry`]): an unreachable,
//!    mismatched or older (404) control service is logged once and asked
//!    again, from 1 s doubling to 60 s. It registers at start only.
//! 2. **Heartbeats**, every `--heartbeat` seconds, one per registered
//!    address (or one without an address when it has none), each with the
//!    load average and the image streams being served
//!    ([`crate::events::heartbeat`]), each from its address to its own
//!    `mprovURL` if the config gives one ([`addresses::Senders`]).
//! 3. **Jobs** of the job modules it runs and has an implementation of
//!    ([`jobs`], [`crate::modules`]).
//! 4. **libgenders**, if listed: the genders file rewritten at each new
//!    inventory revision ([`crate::modules::libgenders`]).
//!
//! `--run-once` enrolls and registers the same way, writes the genders file
//! once if `libgenders` is listed, runs the jobs pending now and exits; the
//! boot services (`dnsmasq`, `mprov-webserver`) are not started then.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use mprov_api::client::Client;
use mprov_api::jobs::{AddressRegistration, Registration, module};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cli::Cli;
use crate::daemon::retry::Failure;
use crate::modules::{Registry, Settings, libgenders};
use crate::start::Snapshot;

pub mod addresses;
pub mod host_id;
pub mod jobs;
pub mod retry;

/// The folder of the job server's config, where the host id is kept: the
/// `-c` file's, else the default config's (`MPROV_CONFIG_DIR`, else
/// /etc/mprov).
pub fn config_dir(cli: &Cli) -> PathBuf {
    cli.config
        .as_deref()
        .and_then(std::path::Path::parent)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map_or_else(crate::config::command_line::config_dir, PathBuf::from)
}

/// The image streams the image server is serving now, if it runs.
#[derive(Debug, Clone, Default)]
pub struct Streams(Option<mprov_fileserver::Metrics>);

impl Streams {
    /// Of the image server whose metrics are `metrics`.
    pub fn of(metrics: &mprov_fileserver::Metrics) -> Streams {
        Streams(Some(metrics.clone()))
    }

    /// How many are open now (0 without an image server).
    pub fn now(&self) -> u32 {
        self.0.as_ref().map_or(0, |m| {
            u32::try_from(m.active_streams().max(0)).unwrap_or(u32::MAX)
        })
    }
}

/// What the daemon does, from the command line (and the config mapped
/// onto it).
#[derive(Debug, Clone)]
pub struct Daemon {
    /// The modules listed (`--modules`).
    pub modules: Vec<String>,
    /// Those to claim jobs of.
    pub job_modules: Vec<String>,
    /// Register, with this registration (`None`: `--no-register`).
    pub registration: Option<Registration>,
    /// Heartbeat addresses when not registering: those `--address` gives
    /// (the interfaces' are not known to the control service then).
    pub given: Vec<AddressRegistration>,
    /// Between heartbeats; zero: none.
    pub heartbeat: Duration,
    /// Each address's own control-service URL for its heartbeats.
    pub address_urls: Vec<(IpAddr, String)>,
    /// The job modules' implementations.
    pub registry: Registry,
    /// The modules' settings.
    pub settings: Settings,
}

impl Daemon {
    /// From `cli`, its image server on `port`: the addresses given, and
    /// when registering (`enrolled`, and not `--no-register`) the host id
    /// made or read and the addresses to register (given, or else read from
    /// the interfaces).
    pub fn from_cli(cli: &Cli, port: u16, enrolled: bool) -> Result<Daemon> {
        let settings = Settings::from_cli(cli);
        let registry = Registry::new(&settings);
        let (job_modules, unknown) = registry.split(&cli.modules);
        if !unknown.is_empty() {
            tracing::warn!(
                "no such module here: {}; its jobs are not taken",
                unknown.join(", ")
            );
        }
        // Checked whether or not it registers.
        let given = addresses::parse(&cli.addresses)?.unwrap_or_default();
        let registration = if cli.no_register {
            None
        } else if !enrolled {
            tracing::warn!(
                "no client certificate: not registering (only an enrolled job server can)"
            );
            None
        } else {
            let dir = config_dir(cli);
            let host_id = host_id::load_or_make(cli.host_id.as_deref(), &dir)
                .with_context(|| format!("the host id (kept in {})", dir.display()))?;
            Some(Registration {
                host_id,
                modules: cli.modules.clone(),
                port,
                addresses: addresses::to_register(&cli.addresses)?,
            })
        };
        Ok(Daemon {
            modules: cli.modules.clone(),
            job_modules,
            registration,
            given,
            heartbeat: Duration::from_secs(cli.heartbeat),
            address_urls: cli.address_urls.clone(),
            registry,
            settings,
        })
    }

    /// Whether `libgenders` is listed.
    pub fn genders(&self) -> bool {
        self.modules.iter().any(|m| m.trim() == module::LIBGENDERS)
    }

    /// Registers (unless not asked to), retried until the control service
    /// takes it or fails in a way `retried` says not to retry: the
    /// addresses to heartbeat on; `None` on `stop`.
    pub async fn register(
        &self,
        clients: &watch::Receiver<Client>,
        stop: &CancellationToken,
        retried: fn(Failure) -> bool,
    ) -> Option<Result<Vec<IpAddr>>> {
        let Some(registration) = &self.registration else {
            return Some(Ok(self.given.iter().map(|a| a.address).collect()));
        };
        let url = clients.borrow().base_url().to_string();
        let registered = retry::until_ok("registering", &url, stop, retried, || async {
            let client = clients.borrow().clone();
            Ok(client.register(registration).await?)
        })
        .await?;
        let registered = match registered {
            Ok(r) => r,
            Err(e) => return Some(Err(e.context("registering"))),
        };
        let shown: Vec<String> = registered
            .addresses
            .iter()
            .map(|a| match a.network {
                Some(n) => format!("{} (network {n})", a.address),
                None => format!("{} (no network)", a.address),
            })
            .collect();
        tracing::info!(
            "registered as job server {} (id {}, host id {}) with modules [{}] on {}",
            registered.name,
            registered.id,
            registration.host_id,
            registration.modules.join(", "),
            if shown.is_empty() {
                "no address".to_owned()
            } else {
                shown.join(", ")
            }
        );
        Some(Ok(registered.addresses.iter().map(|a| a.address).collect()))
    }

    /// Runs the daemon until `stop`: registers, then heartbeats, takes jobs
    /// and follows the inventory for `libgenders` (with `snapshot`).
    pub async fn run(
        self,
        clients: watch::Receiver<Client>,
        snapshot: Snapshot,
        streams: Streams,
        stop: CancellationToken,
    ) {
        let mut tasks = tokio::task::JoinSet::new();
        if self.genders() {
            let path = self.settings.genders_file.clone();
            let (c, s, st) = (clients.clone(), snapshot.clone(), stop.clone());
            tasks.spawn(libgenders::follow(c, s, path, st));
        }
        // Heartbeats from the start (an older control service, which does
        // not know registration, still gets its address-less one), on the
        // registered addresses once registered.
        let (addresses_tx, addresses) = watch::channel(Vec::new());
        if !self.heartbeat.is_zero() {
            let (c, st, every) = (clients.clone(), stop.clone(), self.heartbeat);
            let senders = addresses::Senders::new(self.address_urls.clone());
            tasks.spawn(crate::events::heartbeat(
                c, addresses, senders, streams, every, st,
            ));
        }
        // Every failure is retried: the admin may fix what the control
        // service refuses, or upgrade it.
        let Some(Ok(registered)) = self.register(&clients, &stop, |_| true).await else {
            return;
        };
        addresses_tx.send_replace(registered);
        if !self.job_modules.is_empty() {
            let (c, st) = (clients.clone(), stop.clone());
            tasks.spawn(jobs::run(
                c,
                self.registry.clone(),
                self.job_modules.clone(),
                st,
            ));
        }
        while tasks.join_next().await.is_some() {}
        drop(addresses_tx);
    }
}

/// `--run-once`: enrolls (retrying), registers (unless `--no-register`),
/// writes the genders file once if `libgenders` is listed, runs the jobs
/// pending now and returns. No boot service starts.
pub async fn run_once(cli: &Cli, stop: &CancellationToken) -> Result<()> {
    let url = cli
        .control_url
        .clone()
        .context("--run-once needs --control-url (MPROV_URL)")?;
    let (client, renewal) = tokio::select! {
        found = crate::cli::control_client(cli, &url, stop) => match found {
            Err(_) if stop.is_cancelled() => return Ok(()),
            found => found?,
        },
        () = stop.cancelled() => return Ok(()),
    };
    let (_keep, clients) = watch::channel(client);
    let daemon = Daemon::from_cli(cli, cli.http.port(), renewal.is_some())?;
    // Only what waiting can change is retried: a refusal, or a control
    // service without registration (404), ends the run.
    let retried = |kind: Failure| kind.transient() && kind != Failure::NotFound;
    match daemon.register(&clients, stop, retried).await {
        None => return Ok(()),
        Some(registered) => drop(registered?),
    }
    if daemon.genders() {
        let client = clients.borrow().clone();
        libgenders::update(&client, &daemon.settings.genders_file, None).await?;
    }
    if !daemon.job_modules.is_empty() {
        let ran = jobs::drain(&clients, &daemon.registry, daemon.job_modules.clone(), stop).await?;
        tracing::info!("run once: {ran} jobs ran; exiting");
    }
    Ok(())
}
