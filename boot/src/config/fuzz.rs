//! The fuzzing entry point for the config parser: [`fuzz_config`].
//!
//! The input is up to four files separated by NUL bytes, read as UTF-8
//! (lossily): `/etc/mprov/jobserver.yaml`, then `plugins/a.yaml`,
//! `plugins/b.yaml` and `other.yaml` beside it, all in memory ([`Memory`]);
//! no real file is touched. It asserts:
//!
//! * nothing panics, whatever the includes do (cycles, depth, globs);
//! * an error names one of the four files, with a line and column of 1 or
//!   more;
//! * a config that loads lists only this release's modules, once each,
//!   and warns only about the seed's modules that are not in it;
//! * the first line, taken as the values of `MPROV_URL`, `MPROV_APIKEY`
//!   and `MPROV_ADDRESS` (split on `|`), rendered into `jobserver.yaml`
//!   ([`render::text`]) loads back to exactly those values.
//!
//! The stable tests replay `tests/fuzz/corpus/jobserver_config/` through it.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use super::{ConfigError, Files, MODULES, NOT_IN_THIS_RELEASE, load, load_text, render};

/// The files of the fuzz input, in memory.
#[derive(Debug, Default)]
pub struct Memory(BTreeMap<PathBuf, String>);

impl Memory {
    /// `files`, by path.
    pub fn new<P: Into<PathBuf>, T: Into<String>>(
        files: impl IntoIterator<Item = (P, T)>,
    ) -> Memory {
        Memory(
            files
                .into_iter()
                .map(|(p, t)| (p.into(), t.into()))
                .collect(),
        )
    }
}

impl Files for Memory {
    fn read(&self, path: &Path) -> io::Result<String> {
        self.0
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let names: Vec<String> = self
            .0
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect();
        if names.is_empty() {
            return Err(io::ErrorKind::NotFound.into());
        }
        Ok(names)
    }
}

const PATHS: [&str; 4] = [
    "/etc/mprov/jobserver.yaml",
    "/etc/mprov/plugins/a.yaml",
    "/etc/mprov/plugins/b.yaml",
    "/etc/mprov/other.yaml",
];

/// Fuzzing entry point: see the module comment. Panics only on a bug.
pub fn fuzz_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let files = Memory::new(PATHS.iter().zip(text.split('\0')).map(|(p, t)| (*p, t)));
    let main = Path::new(PATHS[0]);
    match load(main, &files) {
        Ok(config) => {
            let modules = config.modules.unwrap_or_default();
            for (i, m) in modules.iter().enumerate() {
                assert!(MODULES.contains(&m.as_str()), "module {m}");
                assert!(!modules[..i].contains(m), "{m} twice");
            }
            for w in &config.warnings {
                assert!(
                    NOT_IN_THIS_RELEASE
                        .iter()
                        .any(|m| w.contains(&format!("`{m}`"))),
                    "warning {w}"
                );
            }
        }
        Err(ConfigError::At { at, message }) => {
            assert!(
                PATHS.contains(&at.file.to_str().unwrap_or_default()),
                "{at}"
            );
            assert!(at.line >= 1 && at.column >= 1, "{at}: {message}");
        }
        Err(ConfigError::Read { file, .. }) => {
            // Only the main file can be missing this way (an empty input
            // still has it).
            panic!("cannot read {}", file.display());
        }
    }
    let first = text.lines().next().unwrap_or_default();
    let mut parts = first.splitn(3, '|');
    let value = |s: Option<&str>| {
        s.map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let env = render::Environment {
        url: value(parts.next()),
        apikey: value(parts.next()),
        address: value(parts.next()),
        modules: Some(
            MODULES
                .iter()
                .take(data.len() % 7)
                .map(|m| (*m).to_owned())
                .collect(),
        ),
        heartbeat: None,
    };
    let rendered = render::text(&env, 15);
    let config = match load_text(main, &rendered, &Memory::default()) {
        Ok(config) => config,
        Err(e) => panic!("the rendered file does not load: {e}\n{rendered}"),
    };
    assert_eq!(config.mprov_url, env.url);
    assert_eq!(config.apikey, env.apikey);
    assert_eq!(config.myaddress.map(|(a, _)| a), env.address);
    assert_eq!(config.modules, env.modules);
    assert_eq!(config.heartbeat_interval, Some(15));
}
