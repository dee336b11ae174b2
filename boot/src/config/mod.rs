//! `jobserver.yaml`: the job server's configuration file, in the seed's
//! format.
//!
//! The rules, implemented plainly below:
//!
//! - A file is a YAML list. Each entry is a one-key map naming a section
//!   (`- global: {...}`, `- dnsmasq: {...}`, `- image-update: {...}`), or
//!   `- !include PATTERN`.
//! - `PATTERN` is relative to the including file's folder. Its file name
//!   may hold `*` and `?` (`plugins/*.yaml`); its folders may not. A
//!   pattern that matches nothing is fine (no plugin files yet); a plain
//!   path that does not exist is an error. Matches are read in name order,
//!   skipping names that start with a dot. An included file has the same
//!   format and may include in turn, up to [`MAX_INCLUDE_DEPTH`] deep; a
//!   file that includes itself, directly or not, is an error.
//! - Each section appears at most once across all the files. Unknown
//!   sections and unknown keys are errors; so is a value of the wrong type.
//! - `jobmodules` takes the seed's module names. `dnsmasq` is our DHCP, DNS
//!   and TFTP servers (`enableDHCP`, `enableDNS`, `enableTFTP` in its
//!   plugin section, each on by default), `mprov-webserver` our HTTP image
//!   server; then `image-update`, `image-sync`, `image-delete` and
//!   `libgenders`. The seed's `repo-update`, `repo-sync`, `repo-delete`,
//!   `nads` and `script-runner` are not in this release: each is skipped
//!   with a warning (so a seed-style config runs unchanged), as is a plugin
//!   section of theirs. Any other name is an error.
//! - Every error names the file, line and column: [`ConfigError`].
//!
//! Reading is split from parsing: [`load`] takes a [`Files`], the real
//! filesystem ([`Disk`]) or, in tests and the fuzz target, files in memory.
//! How the settings meet the command line is `crate::cli`'s business
//! (flags given on the command line win over the file, the file over
//! environment variables and defaults); writing the file from the
//! environment is [`render`].

pub mod command_line;
#[cfg(any(test, feature = "fuzz"))]
pub mod fuzz;
pub mod render;
mod wire;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};

pub use command_line::ca_bundle;
use serde_saphyr::Tagged;
pub use wire::{Address, LogLevel};
use wire::{Dnsmasq, Entry, Item};

/// Where the configuration lives unless told otherwise.
pub const DEFAULT_DIR: &str = "/etc/mprov";

/// The configuration file's name in that folder.
pub const FILE_NAME: &str = "jobserver.yaml";

/// How deep `!include`s nest: the main file's includes are depth 1.
pub const MAX_INCLUDE_DEPTH: usize = 8;

/// At most this many YAML nodes per file: a config is small, and the
/// budget stops alias amplification before it costs memory.
const MAX_YAML_NODES: usize = 20_000;

/// The job modules this release runs.
pub const MODULES: [&str; 6] = [
    mprov_api::jobs::module::DNSMASQ,
    mprov_api::jobs::module::WEBSERVER,
    mprov_api::jobs::module::IMAGE_UPDATE,
    mprov_api::jobs::module::IMAGE_SYNC,
    mprov_api::jobs::module::IMAGE_DELETE,
    mprov_api::jobs::module::LIBGENDERS,
];

/// The seed's job modules that this release does not have.
pub const NOT_IN_THIS_RELEASE: [&str; 5] = [
    "repo-update",
    "repo-sync",
    "repo-delete",
    "nads",
    "script-runner",
];

/// The configuration, as read from a file and the files it includes.
/// `None` is "not set": the command line's value or default stands.
#[derive(Clone, Default, PartialEq)]
pub struct Config {
    /// `mprovURL`: the control service.
    pub mprov_url: Option<String>,
    /// `apikey`.
    pub apikey: Option<String>,
    /// `heartbeatInterval`, in seconds.
    pub heartbeat_interval: Option<u64>,
    /// `runonce`.
    pub runonce: Option<bool>,
    /// `caBundle`, relative paths taken from the file's folder.
    pub ca_bundle: Option<PathBuf>,
    /// `logLevel`.
    pub log_level: Option<LogLevel>,
    /// `hostId`.
    pub host_id: Option<String>,
    /// `logTimestamps`.
    pub log_timestamps: Option<bool>,
    /// `myaddress`, as written (an address or a host name), and where.
    pub myaddress: Option<(String, Where)>,
    /// `addresses`; `Some(vec![])` registers none.
    pub addresses: Option<Vec<Address>>,
    /// `httpsPort`: the HTTPS image listener's port, for other job
    /// servers' `image-sync` (the same on every job server).
    pub https_port: Option<u16>,
    /// `jobmodules`: the ones this release runs, in the order given,
    /// without duplicates.
    pub modules: Option<Vec<String>>,
    /// The `dnsmasq` plugin section's switches.
    pub boot_services: BootServices,
    /// What to tell the operator once the log is up (modules skipped).
    pub warnings: Vec<String>,
}

impl fmt::Debug for Config {
    /// As derived, with the API key redacted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("mprov_url", &self.mprov_url)
            .field("apikey", &self.apikey.as_ref().map(|_| "<redacted>"))
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("runonce", &self.runonce)
            .field("ca_bundle", &self.ca_bundle)
            .field("log_level", &self.log_level)
            .field("host_id", &self.host_id)
            .field("log_timestamps", &self.log_timestamps)
            .field("myaddress", &self.myaddress)
            .field("addresses", &self.addresses)
            .field("https_port", &self.https_port)
            .field("modules", &self.modules)
            .field("boot_services", &self.boot_services)
            .field("warnings", &self.warnings)
            .finish()
    }
}

/// Which of `dnsmasq`'s services run when it is listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootServices {
    /// `enableDHCP`.
    pub dhcp: bool,
    /// `enableDNS`.
    pub dns: bool,
    /// `enableTFTP`.
    pub tftp: bool,
}

impl Default for BootServices {
    fn default() -> Self {
        let d = Dnsmasq::default();
        BootServices {
            dhcp: d.enable_dhcp,
            dns: d.enable_dns,
            tftp: d.enable_tftp,
        }
    }
}

/// A place in a config file, 1-based.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Where {
    /// The file.
    pub file: PathBuf,
    /// Its line.
    pub line: u64,
    /// Its column.
    pub column: u64,
}

impl fmt::Display for Where {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
    }
}

impl Where {
    fn new(file: &Path, at: serde_saphyr::Location) -> Where {
        Where {
            file: file.to_owned(),
            line: at.line(),
            column: at.column(),
        }
    }
}

/// Why a configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is wrong at a place: malformed YAML, an unknown key or
    /// section, a wrong type, a missing include, a cycle.
    #[error("{at}: {message}")]
    At {
        /// Where.
        at: Where,
        /// What is wrong, and what to do.
        message: String,
    },
    /// The file cannot be read at all.
    #[error("cannot read the config file {}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        #[source]
        err: io::Error,
    },
}

/// What [`load`] reads files through.
pub trait Files {
    /// The text of `path`.
    fn read(&self, path: &Path) -> io::Result<String>;
    /// The names of the entries in `dir` (not sorted).
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
}

/// The real filesystem.
#[derive(Debug, Clone, Copy)]
pub struct Disk;

impl Files for Disk {
    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect()
    }
}

/// Reads the config file `path` and what it includes.
pub fn load(path: &Path, files: &dyn Files) -> Result<Config, ConfigError> {
    let text = files.read(path).map_err(|err| ConfigError::Read {
        file: path.to_owned(),
        err,
    })?;
    load_text(path, &text, files)
}

/// [`load`] with the main file's text already at hand (read, or rendered
/// from the environment); `path` is where it lives, for messages and for
/// resolving its includes.
pub fn load_text(path: &Path, text: &str, files: &dyn Files) -> Result<Config, ConfigError> {
    let path = normalize(path);
    let mut reader = Reader {
        files,
        chain: vec![path.clone()],
        sections: BTreeMap::new(),
        global: None,
        dnsmasq: None,
        warnings: Vec::new(),
    };
    reader.file(&path, text)?;
    reader.finish()
}

/// The state of one [`load`].
struct Reader<'a> {
    files: &'a dyn Files,
    /// The file being read, and the files that include it.
    chain: Vec<PathBuf>,
    /// Each section seen, and where.
    sections: BTreeMap<&'static str, Where>,
    global: Option<(wire::Global, PathBuf)>,
    dnsmasq: Option<Dnsmasq>,
    warnings: Vec<String>,
}

impl Reader<'_> {
    fn file(&mut self, path: &Path, text: &str) -> Result<(), ConfigError> {
        for entry in parse(path, text)? {
            let at = Where::new(path, entry.referenced);
            let Tagged(item, tag) = entry.value;
            let entry = match (item, tag.as_deref()) {
                (Item::Scalar(pattern), Some("!include")) => {
                    self.include(path, &pattern, at)?;
                    continue;
                }
                (Item::Section(entry), None) => entry,
                (Item::Section(entry), Some(tag)) => {
                    return Err(ConfigError::At {
                        at,
                        message: format!(
                            "`{tag}` on the `{}` section: the only tag is `!include PATTERN`",
                            entry.name()
                        ),
                    });
                }
                (Item::Scalar(text), _) => {
                    return Err(ConfigError::At {
                        at,
                        message: format!(
                            "{text:?} on its own: a section is a one-key map (`- global:` and its settings below), an include is `- !include plugins/*.yaml`"
                        ),
                    });
                }
            };
            let name = entry.name();
            if let Some(first) = self.sections.get(name) {
                return Err(ConfigError::At {
                    at,
                    message: format!(
                        "a second `{name}` section; the first is at {first}. Merge them into one"
                    ),
                });
            }
            self.sections.insert(name, at.clone());
            match entry {
                Entry::Global(global) => {
                    self.global = Some((*global.unwrap_or_default(), path.to_owned()));
                }
                Entry::Dnsmasq(dnsmasq) => self.dnsmasq = Some(dnsmasq.unwrap_or_default()),
                Entry::RepoUpdate(_)
                | Entry::RepoSync(_)
                | Entry::RepoDelete(_)
                | Entry::Nads(_)
                | Entry::ScriptRunner(_) => self.warnings.push(format!(
                    "{at}: the `{name}` module is not in this release of mProv; its settings are ignored"
                )),
                Entry::Webserver(_)
                | Entry::ImageUpdate(_)
                | Entry::ImageSync(_)
                | Entry::ImageDelete(_)
                | Entry::Libgenders(_) => {}
            }
        }
        Ok(())
    }

    /// Reads the files `pattern` names, relative to `from`'s folder.
    fn include(&mut self, from: &Path, pattern: &str, at: Where) -> Result<(), ConfigError> {
        let error = |message: String| ConfigError::At {
            at: at.clone(),
            message,
        };
        if self.chain.len() > MAX_INCLUDE_DEPTH {
            return Err(error(format!(
                "includes nest more than {MAX_INCLUDE_DEPTH} deep ({})",
                chain_text(&self.chain)
            )));
        }
        let base = from.parent().unwrap_or(Path::new("/"));
        let targets = expand(base, pattern, self.files).map_err(error)?;
        for target in targets {
            if self.chain.contains(&target) {
                let mut chain = self.chain.clone();
                chain.push(target);
                return Err(error(format!(
                    "the include makes a cycle: {}",
                    chain_text(&chain)
                )));
            }
            let text = match self.files.read(&target) {
                Ok(text) => text,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(error(format!(
                        "the included file {} does not exist (a pattern with * may match nothing; a plain path must exist)",
                        target.display()
                    )));
                }
                Err(e) => {
                    return Err(error(format!(
                        "cannot read the included file {}: {e}",
                        target.display()
                    )));
                }
            };
            self.chain.push(target.clone());
            self.file(&target, &text)?;
            self.chain.pop();
        }
        Ok(())
    }

    fn finish(self) -> Result<Config, ConfigError> {
        let mut warnings = self.warnings;
        let mut config = Config {
            boot_services: self
                .dnsmasq
                .map(|d| BootServices {
                    dhcp: d.enable_dhcp,
                    dns: d.enable_dns,
                    tftp: d.enable_tftp,
                })
                .unwrap_or_default(),
            ..Config::default()
        };
        let Some((global, file)) = self.global else {
            config.warnings = warnings;
            return Ok(config);
        };
        let base = file.parent().unwrap_or(Path::new("/"));
        config.mprov_url = global.mprov_url;
        config.apikey = global.apikey;
        config.heartbeat_interval = global.heartbeat_interval;
        config.runonce = global.runonce;
        config.ca_bundle = global.ca_bundle.map(|p| base.join(p));
        config.log_level = global.log_level;
        config.host_id = global.host_id;
        config.log_timestamps = global.log_timestamps;
        config.myaddress = global
            .myaddress
            .map(|a| (a.value, Where::new(&file, a.referenced)));
        config.addresses = global.addresses;
        config.https_port = global.https_port;
        if let Some(listed) = global.jobmodules {
            let mut modules: Vec<String> = Vec::new();
            for m in listed {
                let name = m.value.trim();
                let at = Where::new(&file, m.referenced);
                if NOT_IN_THIS_RELEASE.contains(&name) {
                    warnings.push(format!(
                        "{at}: the job module `{name}` is not in this release of mProv; it does not run (take it out of jobmodules to silence this)"
                    ));
                } else if !MODULES.contains(&name) {
                    return Err(ConfigError::At {
                        at,
                        message: format!(
                            "unknown job module `{name}`; the job modules are {}",
                            MODULES.join(", ")
                        ),
                    });
                } else if !modules.iter().any(|n| n == name) {
                    modules.push(name.to_owned());
                }
            }
            config.modules = Some(modules);
        }
        config.warnings = warnings;
        Ok(config)
    }
}

/// One file's entries. An empty file (or one with comments only) has
/// none.
fn parse(path: &Path, text: &str) -> Result<wire::File, ConfigError> {
    // The snippet is left out: the message names the file and line, and a
    // plugin file's snippet would quote the main file's lines around it.
    let options = serde_saphyr::options! {
        with_snippet: false,
        budget: serde_saphyr::budget! { max_nodes: MAX_YAML_NODES },
    };
    let parsed: Result<Option<wire::File>, _> = serde_saphyr::from_str_with_options(text, options);
    match parsed {
        Ok(entries) => Ok(entries.unwrap_or_default()),
        Err(err) => {
            let at = err
                .location()
                .map(|l| Where::new(path, l))
                .unwrap_or(Where {
                    file: path.to_owned(),
                    line: 1,
                    column: 1,
                });
            let message = err
                .without_snippet()
                .render_with_formatter(&serde_saphyr::UserMessageFormatter);
            let mut message = strip_location(&message).to_owned();
            // The line itself, so that "invalid u64" shows what was read;
            // never the API key's line, as the message goes to the log.
            let line = usize::try_from(at.line)
                .ok()
                .and_then(|l| l.checked_sub(1))
                .and_then(|l| text.lines().nth(l));
            if let Some(line) = line.map(str::trim).filter(|l| !l.is_empty())
                && !line.contains("apikey")
            {
                let shown: String = line.chars().take(80).collect();
                message.push_str(&format!(" (in `{shown}`)"));
            }
            Err(ConfigError::At { at, message })
        }
    }
}

/// The message without its trailing " at line L, column C": [`Where`]
/// says it first.
fn strip_location(message: &str) -> &str {
    match message.rfind(" at line ") {
        Some(i) if message[i..].contains(", column ") => message[..i].trim_end(),
        _ => message,
    }
}

/// The files `pattern` names, relative to `base`: one path, or the
/// matches of a wildcard file name in name order.
fn expand(base: &Path, pattern: &str, files: &dyn Files) -> Result<Vec<PathBuf>, String> {
    let pattern = pattern.trim();
    if pattern.is_empty() {
        return Err("`!include` needs a path or pattern, e.g. `!include plugins/*.yaml`".into());
    }
    let path = normalize(&base.join(pattern));
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Err(format!("`!include {pattern}` names no file"));
    };
    let dir = path.parent().unwrap_or(Path::new("/")).to_owned();
    if dir.to_string_lossy().contains(['*', '?', '[']) {
        return Err(format!(
            "`!include {pattern}`: only the file name may hold wildcards, not its folders"
        ));
    }
    if !name.contains(['*', '?']) {
        return Ok(vec![path]);
    }
    let mut names = match files.list(&dir) {
        Ok(names) => names,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("cannot list {}: {e}", dir.display())),
    };
    names.retain(|n| !n.starts_with('.') && wildcard_match(&name, n));
    names.sort();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

/// Whether `name` matches `pattern`, where `*` is any run of characters
/// and `?` any one. Only a file name is matched, so no crate is needed:
/// the classic two-pointer walk, linear with one backtrack point.
fn wildcard_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// `path` with `.` and `..` taken out by their names (not following
/// symlinks), so that the include chain compares like with like.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if out.file_name().is_some() {
                    out.pop();
                } else if !out.has_root() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

fn chain_text(chain: &[PathBuf]) -> String {
    chain
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" → ")
}

#[cfg(test)]
mod tests;
