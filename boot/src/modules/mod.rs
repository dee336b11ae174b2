//! The job modules: what runs a job the job server claimed.
//!
//! A module implements [`Module`]: it gets the [`Job`] (its parameters) and
//! a [`Progress`] to write its output to (the jobs loop sends it to the
//! control service as it grows, see [`crate::daemon::jobs`]), and ends with
//! an [`ExitInfo`] or an error (which fails the job; so does a panic, which
//! never stops the job server). [`Registry`] maps a module's name to its
//! implementation: the job server claims only jobs of modules it both runs
//! (`--modules`) and has an implementation of.
//!
//! `image-update` builds an image version from the inventory and publishes
//! it ([`image_update`]); `image-sync` copies a published version from
//! another job server, verified against the control service's record
//! ([`image_sync`]); `image-delete` removes an image's files.
//!
//! `libgenders` is not a job module but a follower of the inventory
//! ([`libgenders::follow`]); `dnsmasq` and `mprov-webserver` are the seed's
//! names of the boot services ([`BOOT_SERVICES`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use mprov_api::client::Client;
use mprov_api::jobs::{Job, module};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

pub mod image_delete;
pub mod image_sync;
pub mod image_update;
pub mod libgenders;

/// The seed's names of the boot services: not job modules.
pub const BOOT_SERVICES: &[&str] = &[module::DNSMASQ, module::WEBSERVER];

/// The modules that follow the inventory instead of taking jobs.
pub const FOLLOWERS: &[&str] = &[module::LIBGENDERS];

/// How a job ended, when its module did not fail with an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    /// 0: success; anything else fails the job with this code.
    pub return_code: i64,
    /// Why it failed (with a non-zero code), added to the job's output.
    pub reason: Option<String>,
}

impl ExitInfo {
    /// Success.
    pub fn success() -> ExitInfo {
        ExitInfo {
            return_code: 0,
            reason: None,
        }
    }

    /// Failure with `code` (non-zero) and `reason`.
    pub fn failed(code: i64, reason: impl Into<String>) -> ExitInfo {
        ExitInfo {
            return_code: if code == 0 { 1 } else { code },
            reason: Some(reason.into()),
        }
    }
}

/// What the modules are set up with: the command line's and the plugin
/// files' settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The export folder: `images/<slug>/<version>/...`.
    pub export: PathBuf,
    /// Where `libgenders` writes the genders file (plugin setting; default
    /// [`libgenders::DEFAULT_FILE`]).
    pub genders_file: PathBuf,
    /// The agent binary `image-update` puts in every image's initramfs
    /// (default [`image_update::DEFAULT_AGENT`]).
    pub agent: PathBuf,
    /// How `image-sync` copies over HTTPS (`None`: over plain HTTP).
    pub sync_tls: Option<image_sync::SyncTls>,
}

impl Settings {
    /// From the command line (and the config mapped onto it): the export
    /// folder, the defaults for the rest. The plugin files' settings
    /// (`libgenders`'s file, ...) are set here when a config gives them.
    pub fn from_cli(cli: &crate::cli::Cli) -> Settings {
        let mut settings = Settings::new(&cli.export);
        if let Some(agent) = &cli.agent {
            settings.agent.clone_from(agent);
        }
        settings.sync_tls = Some(image_sync::SyncTls {
            identity_dir: crate::identity::dir(&cli.state_dir),
            ca_file: cli.ca_file.clone(),
            port: cli.https.port(),
        });
        settings
    }

    /// The defaults for the export folder `export`.
    pub fn new(export: impl Into<PathBuf>) -> Settings {
        Settings {
            export: export.into(),
            genders_file: PathBuf::from(libgenders::DEFAULT_FILE),
            agent: PathBuf::from(image_update::DEFAULT_AGENT),
            sync_tls: None,
        }
    }
}

/// A job module.
#[async_trait::async_trait]
pub trait Module: Send + Sync {
    /// Runs `job`, writing its output to `progress`: how it ended, or why
    /// it failed.
    async fn run(&self, job: &Job, progress: &Progress) -> anyhow::Result<ExitInfo>;
}

/// The modules this job server has an implementation of, by name.
#[derive(Clone, Default)]
pub struct Registry {
    modules: BTreeMap<&'static str, Arc<dyn Module>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.modules.keys()).finish()
    }
}

impl Registry {
    /// Every job module written, set up with `settings`.
    pub fn new(settings: &Settings) -> Registry {
        let mut registry = Registry::default();
        registry.insert(
            module::IMAGE_DELETE,
            Arc::new(image_delete::ImageDelete::new(&settings.export)),
        );
        let update = image_update::UpdateContext {
            agent: Some(settings.agent.clone()),
            ..image_update::UpdateContext::new(&settings.export)
        };
        registry.insert(module::IMAGE_UPDATE, Arc::new(ImageUpdate(update)));
        registry.insert(
            module::IMAGE_SYNC,
            Arc::new(ImageSync(image_sync::SyncContext {
                tls: settings.sync_tls.clone(),
                ..image_sync::SyncContext::new(&settings.export)
            })),
        );
        registry
    }

    /// Adds (or replaces) the implementation of `name`.
    pub fn insert(&mut self, name: &'static str, module: Arc<dyn Module>) {
        self.modules.insert(name, module);
    }

    /// The implementation of `name`, if any.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Module>> {
        self.modules.get(name).cloned()
    }

    /// Of the modules `listed`, those to claim jobs of (those with an
    /// implementation, in the order listed, once each) and the unknown ones
    /// (neither a job module here, nor a follower, nor a boot service).
    pub fn split(&self, listed: &[String]) -> (Vec<String>, Vec<String>) {
        let (mut claim, mut unknown) = (Vec::new(), Vec::new());
        for name in listed.iter().map(|m| m.trim()).filter(|m| !m.is_empty()) {
            if self.modules.contains_key(name) {
                if !claim.iter().any(|c| c == name) {
                    claim.push(name.to_owned());
                }
            } else if !BOOT_SERVICES.contains(&name) && !FOLLOWERS.contains(&name) {
                unknown.push(name.to_owned());
            }
        }
        (claim, unknown)
    }
}

/// `image-update` as a job module.
struct ImageUpdate(image_update::UpdateContext);

#[async_trait::async_trait]
impl Module for ImageUpdate {
    async fn run(&self, job: &Job, progress: &Progress) -> anyhow::Result<ExitInfo> {
        let line = |l: &str| progress.line(l);
        image_update::image_update(&self.0, &progress.client(), &job.params, &line).await?;
        Ok(ExitInfo::success())
    }
}

/// `image-sync` as a job module.
struct ImageSync(image_sync::SyncContext);

#[async_trait::async_trait]
impl Module for ImageSync {
    async fn run(&self, job: &Job, progress: &Progress) -> anyhow::Result<ExitInfo> {
        let line = |l: &str| progress.line(l);
        image_sync::image_sync(&self.0, &progress.client(), &job.params, &line).await?;
        Ok(ExitInfo::success())
    }
}

/// The output kept of a job: its tail, at most this many bytes.
pub const OUTPUT_TAIL: usize = 256 << 10;

/// A job's output so far, bounded to its tail.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Output {
    text: String,
    dropped: u64,
    /// Bumped on every write, so the reporter sends only what changed.
    version: u64,
}

impl Output {
    /// Adds `text`, dropping whole lines from the start past
    /// [`OUTPUT_TAIL`] bytes.
    pub fn push(&mut self, text: &str) {
        self.text.push_str(text);
        self.version += 1;
        if self.text.len() > OUTPUT_TAIL {
            let mut cut = self.text.len() - OUTPUT_TAIL;
            // After the line the cut falls in, if the rest has a line end;
            // else at a character boundary.
            match self.text[cut..].find('\n') {
                Some(nl) if cut + nl + 1 < self.text.len() => cut += nl + 1,
                _ => {
                    while !self.text.is_char_boundary(cut) {
                        cut += 1;
                    }
                }
            }
            self.dropped += cut as u64;
            self.text.drain(..cut);
        }
    }

    /// The output as the job records it: the tail, saying first how much
    /// was dropped before it.
    pub fn render(&self) -> String {
        if self.dropped == 0 {
            return self.text.clone();
        }
        format!(
            "[{} earlier bytes of output dropped; the last {} KiB follow]\n{}",
            self.dropped,
            OUTPUT_TAIL >> 10,
            self.text
        )
    }

    /// How many writes it has had.
    pub fn version(&self) -> u64 {
        self.version
    }
}

/// What a running module reports to, and what it may use.
#[derive(Debug, Clone)]
pub struct Progress {
    output: Arc<Mutex<Output>>,
    changed: Arc<Notify>,
    clients: watch::Receiver<Client>,
    stop: CancellationToken,
}

impl Progress {
    /// A job's progress, its module calling the control service with the
    /// client `clients` holds, and stopping on `stop`.
    pub fn new(clients: watch::Receiver<Client>, stop: CancellationToken) -> Progress {
        Progress {
            output: Arc::default(),
            changed: Arc::default(),
            clients,
            stop,
        }
    }

    /// Adds a line to the job's output (and the job server's log, at
    /// debug level).
    pub fn line(&self, line: impl AsRef<str>) {
        let line = line.as_ref();
        tracing::debug!("job output: {line}");
        let mut text = line.to_owned();
        text.push('\n');
        self.write(&text);
    }

    /// Adds `text` as is.
    pub fn write(&self, text: &str) {
        if let Ok(mut out) = self.output.lock() {
            out.push(text);
        }
        self.changed.notify_one();
    }

    /// The output so far.
    pub fn output(&self) -> Output {
        self.output.lock().map(|o| o.clone()).unwrap_or_default()
    }

    /// Resolves at the next write after the last one seen.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The current client to the control service (renewed certificates
    /// included).
    pub fn client(&self) -> Client {
        self.clients.borrow().clone()
    }

    /// Cancelled when the job server stops: a long module should end then.
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_keeps_its_tail_and_says_what_it_dropped() {
        let mut out = Output::default();
        out.push("first\n");
        assert_eq!(out.render(), "first\n");
        let line = format!("{}\n", "x".repeat(1023));
        for _ in 0..300 {
            out.push(&line);
        }
        out.push("last\n");
        let text = out.render();
        let (head, tail) = text.split_once('\n').unwrap();
        assert!(head.starts_with('['), "{head}");
        assert!(head.contains("earlier bytes of output dropped"), "{head}");
        assert!(tail.len() <= OUTPUT_TAIL, "{}", tail.len());
        assert!(tail.len() > OUTPUT_TAIL - 1024, "{}", tail.len());
        assert!(tail.ends_with("last\n"));
        assert!(!tail.contains("first"));
        // Whole lines only.
        assert!(tail.starts_with('x') && tail.lines().all(|l| l == "last" || l.len() == 1023));
        let dropped: u64 = head
            .trim_start_matches('[')
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(dropped as usize + tail.len(), 6 + 300 * 1024 + 5);
    }

    #[test]
    fn output_without_line_ends_is_cut_at_a_character() {
        let mut out = Output::default();
        out.push(&"é".repeat(OUTPUT_TAIL));
        let text = out.render();
        let tail = text.split_once('\n').unwrap().1;
        assert!(tail.len() <= OUTPUT_TAIL && tail.chars().all(|c| c == 'é'));
    }

    fn is_send<T: Send>(_: &T) {}

    /// The daemon runs jobs on spawned tasks: the modules' futures must be
    /// `Send` (checked by the compiler; the futures are never polled).
    #[test]
    fn module_futures_are_send() {
        use mprov_api::client::Auth;
        let client = Client::new("http://127.0.0.1:9", Auth::None).unwrap();
        let params = serde_json::json!({});
        let update = image_update::UpdateContext::new("/nonexistent");
        let future = image_update::image_update(&update, &client, &params, &|_| {});
        is_send(&future);
        let sync = image_sync::SyncContext::new("/nonexistent");
        let future = image_sync::image_sync(&sync, &client, &params, &|_| {});
        is_send(&future);
    }

    #[test]
    fn claims_only_listed_modules_with_an_implementation() {
        let registry = Registry::new(&Settings::new("/nonexistent"));
        let listed: Vec<String> = [
            "dnsmasq",
            "image-delete",
            "libgenders",
            "mprov-webserver",
            "image-delete",
            "repo-sync",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (claim, unknown) = registry.split(&listed);
        assert_eq!(claim, ["image-delete"]);
        assert!(registry.get("image-update").is_some() && registry.get("image-sync").is_some());
        assert_eq!(unknown, ["repo-sync"]);
        assert!(registry.get("image-delete").is_some());
        assert!(registry.get("libgenders").is_none());
    }
}
