//! `jobserver.yaml` written from the environment at start, as the seed's
//! container does: `MPROV_URL`, `MPROV_APIKEY`, `MPROV_ADDRESS` and
//! `MPROV_MODS` (space separated) become the global section, with the
//! heartbeat interval, and an `!include plugins/*.yaml` at the end pulls in
//! the per-module files, which are the operator's and never rewritten.
//!
//! [`text`] is the file, a pure function of [`Environment`]; [`write()`]
//! puts it in place atomically, readable by its owner only (it holds the
//! API key).

use std::io;
use std::path::Path;

/// The variables the file is written from.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Environment {
    /// `MPROV_URL`.
    pub url: Option<String>,
    /// `MPROV_APIKEY`.
    pub apikey: Option<String>,
    /// `MPROV_ADDRESS`.
    pub address: Option<String>,
    /// `MPROV_MODS`, split.
    pub modules: Option<Vec<String>>,
    /// `MPROV_HEARTBEAT`, in seconds.
    pub heartbeat: Option<u64>,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("url", &self.url)
            .field("apikey", &self.apikey.as_ref().map(|_| "<redacted>"))
            .field("address", &self.address)
            .field("modules", &self.modules)
            .field("heartbeat", &self.heartbeat)
            .finish()
    }
}

impl Environment {
    /// Read from the process's environment; an empty variable is unset.
    pub fn from_process() -> Environment {
        Environment::from_lookup(|name| std::env::var(name).ok())
    }

    /// Read through `var`.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Environment {
        let var = |name: &str| {
            var(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        Environment {
            url: var("MPROV_URL"),
            apikey: var("MPROV_APIKEY"),
            address: var("MPROV_ADDRESS"),
            modules: var("MPROV_MODS").map(|m| {
                m.split(|c: char| c.is_whitespace() || c == ',')
                    .filter(|m| !m.is_empty())
                    .map(str::to_owned)
                    .collect()
            }),
            heartbeat: var("MPROV_HEARTBEAT").and_then(|h| h.parse().ok()),
        }
    }

    /// Whether any variable the file is written from is set (the heartbeat
    /// alone does not count).
    pub fn is_set(&self) -> bool {
        self.url.is_some()
            || self.apikey.is_some()
            || self.address.is_some()
            || self.modules.is_some()
    }
}

/// The file's text. Values are written as JSON strings, which YAML reads
/// as double-quoted scalars: whatever the variable holds stays one string.
pub fn text(env: &Environment, default_heartbeat: u64) -> String {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let mut out = String::from(
        "# Written by mprov-jobserver at every start from its environment (MPROV_URL,\n\
         # MPROV_APIKEY, MPROV_ADDRESS, MPROV_MODS): edits here are lost.\n\
         # Per-module settings go in plugins/*.yaml beside this file, which are\n\
         # yours and never rewritten (e.g. plugins/dnsmasq.yaml with\n\
         # `- dnsmasq: {enableDNS: false}`). For global settings that have no\n\
         # variable of their own (caBundle, hostId, logLevel, logTimestamps,\n\
         # addresses), copy this file to one of your own, e.g.\n\
         # jobserver-local.yaml, and start with MPROV_ARGS=\"-c <that file>\"; the\n\
         # variables above no longer apply then.\n\
         - global:\n",
    );
    if let Some(url) = &env.url {
        out.push_str(&format!("    mprovURL: {}\n", quote(url)));
    }
    if let Some(key) = &env.apikey {
        out.push_str(&format!("    apikey: {}\n", quote(key)));
    }
    out.push_str(&format!(
        "    heartbeatInterval: {}\n",
        env.heartbeat.unwrap_or(default_heartbeat)
    ));
    if let Some(address) = &env.address {
        out.push_str(&format!("    myaddress: {}\n", quote(address)));
    }
    if let Some(modules) = &env.modules {
        if modules.is_empty() {
            out.push_str("    jobmodules: []\n");
        } else {
            out.push_str("    jobmodules:\n");
            for m in modules {
                out.push_str(&format!("      - {}\n", quote(m)));
            }
        }
    }
    out.push_str("# include any plugin yamls.\n- !include plugins/*.yaml\n");
    out
}

/// Writes `text` to `path` atomically with mode 0600.
pub fn write(path: &Path, text: &str) -> io::Result<()> {
    mprov_process::write_atomic(path, text.as_bytes(), 0o600)
}
