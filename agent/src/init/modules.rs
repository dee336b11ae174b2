//! Loading the kernel modules the initramfs lists.
//!
//! `mprov-initramfs` writes [`MODULE_LIST`]: the absolute paths of the `.ko`
//! files, decompressed, one a line, dependencies first. The agent loads each
//! in turn with `finit_module(2)`, so it needs no `modprobe`, no `modules.dep`
//! and no decompressor. A module that is already loaded (built in, or loaded
//! as another's dependency) is fine; any other failure is reported with the
//! module and errno and the agent goes on, since a NIC whose driver did load
//! may still be enough.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::kmod::{ModuleInitFlags, finit_module};

/// The list `mprov-initramfs` writes (`mprov_initramfs::MODULE_LIST`; not
/// imported, so the agent does not depend on the builder).
pub const MODULE_LIST: &str = "/etc/mprov/modules";

/// The module list, read: the paths to load in order, and the lines refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleList {
    /// Absolute paths, in load order.
    pub modules: Vec<PathBuf>,
    /// `(line number, line)` of each line that is not an absolute path.
    pub refused: Vec<(usize, String)>,
}

impl ModuleList {
    /// Reads the list's text: one absolute path a line; blank lines and
    /// lines starting with `#` are skipped, surrounding whitespace trimmed.
    pub fn parse(text: &str) -> ModuleList {
        let mut list = ModuleList::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if line.starts_with('/') && !line.contains('\0') {
                list.modules.push(PathBuf::from(line));
            } else {
                list.refused.push((n + 1, line.to_owned()));
            }
        }
        list
    }
}

/// The module's name as the kernel knows it: the file name up to `.ko`, with
/// `-` as `_` (`virtio-net.ko` is `virtio_net`).
pub fn module_name(path: &Path) -> String {
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = file.split(".ko").next().unwrap_or_default();
    stem.replace('-', "_")
}

/// What happened to one module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It was loaded already (EEXIST).
    AlreadyLoaded,
    /// finit_module(2) failed.
    Failed(Errno),
    /// Loaded now.
    Loaded,
    /// The file could not be opened.
    Unreadable(String),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::AlreadyLoaded => f.write_str("already loaded"),
            Outcome::Failed(errno) => write!(f, "failed: {errno}"),
            Outcome::Loaded => f.write_str("loaded"),
            Outcome::Unreadable(err) => write!(f, "cannot open: {err}"),
        }
    }
}

/// A module and what happened to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// Its name.
    pub name: String,
    /// Its file.
    pub path: PathBuf,
    /// The outcome.
    pub outcome: Outcome,
}

/// Loads the modules of the list at `list_path` in order and prints each
/// failure; a missing list means no modules (a kernel with built-in drivers).
pub fn load_listed(list_path: &str) -> Vec<Loaded> {
    let text = match std::fs::read_to_string(list_path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            super::say!("mprov-agent: no {list_path}: loading no modules");
            return Vec::new();
        }
        Err(err) => {
            super::say!("mprov-agent: reading {list_path}: {err}");
            return Vec::new();
        }
    };
    let list = ModuleList::parse(&text);
    for (n, line) in &list.refused {
        super::say!(
            "mprov-agent: {list_path} line {n}: not an absolute path: {}",
            crate::cmdline::printable(line.as_bytes())
        );
    }
    list.modules
        .into_iter()
        .map(|path| {
            let outcome = load(&path);
            let name = module_name(&path);
            if !matches!(outcome, Outcome::Loaded | Outcome::AlreadyLoaded) {
                super::say!("mprov-agent: module {name} ({}): {outcome}", path.display());
            }
            Loaded {
                name,
                path,
                outcome,
            }
        })
        .collect()
}

/// Loads one module file with no parameters.
pub fn load(path: &Path) -> Outcome {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(err) => return Outcome::Unreadable(err.to_string()),
    };
    match finit_module(&file, c"", ModuleInitFlags::empty()) {
        Ok(()) => Outcome::Loaded,
        Err(Errno::EEXIST) => Outcome::AlreadyLoaded,
        Err(errno) => Outcome::Failed(errno),
    }
}

/// One line for the console: the modules loaded, already loaded and failed,
/// each in load order, e.g. `loaded e1000, virtio_net; failed: none`.
pub fn summary(loaded: &[Loaded]) -> String {
    if loaded.is_empty() {
        return "none listed".to_owned();
    }
    let names = |keep: fn(&Outcome) -> bool| {
        let names: Vec<&str> = loaded
            .iter()
            .filter(|l| keep(&l.outcome))
            .map(|l| l.name.as_str())
            .collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    };
    let mut line = format!("loaded {}", names(|o| *o == Outcome::Loaded));
    let already = names(|o| *o == Outcome::AlreadyLoaded);
    if already != "none" {
        line.push_str(&format!("; already loaded {already}"));
    }
    line.push_str(&format!(
        "; failed {}",
        names(|o| !matches!(o, Outcome::Loaded | Outcome::AlreadyLoaded))
    ));
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_read_in_order() {
        let text = "/lib/modules/6.1.0-57-amd64/kernel/drivers/net/ethernet/intel/e1000/e1000.ko\n\
                    \n\
                    # virtio\n  /lib/modules/r/kernel/drivers/virtio/virtio_ring.ko  \n\
                    lib/modules/r/relative.ko\n\
                    /lib/modules/r/kernel/drivers/net/virtio-net.ko";
        let list = ModuleList::parse(text);
        assert_eq!(
            list.modules,
            [
                "/lib/modules/6.1.0-57-amd64/kernel/drivers/net/ethernet/intel/e1000/e1000.ko",
                "/lib/modules/r/kernel/drivers/virtio/virtio_ring.ko",
                "/lib/modules/r/kernel/drivers/net/virtio-net.ko",
            ]
            .map(PathBuf::from)
        );
        assert_eq!(list.refused, [(5, "lib/modules/r/relative.ko".to_owned())]);
        let names: Vec<String> = list.modules.iter().map(|p| module_name(p)).collect();
        assert_eq!(names, ["e1000", "virtio_ring", "virtio_net"]);
        assert_eq!(ModuleList::parse(""), ModuleList::default());
        assert_eq!(module_name(Path::new("/x/y/e1000e.ko.xz")), "e1000e");
    }

    #[test]
    fn a_missing_or_unreadable_module_is_reported_not_fatal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let list = dir.path().join("modules");
        let missing = dir.path().join("nope.ko");
        std::fs::write(&list, format!("{}\n", missing.display())).expect("write");
        let loaded = load_listed(list.to_str().expect("utf-8"));
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].name, "nope");
        assert!(
            matches!(&loaded[0].outcome, Outcome::Unreadable(e) if e.contains("No such file")),
            "{:?}",
            loaded[0].outcome
        );
        assert_eq!(summary(&loaded), "loaded none; failed nope");
        // No list at all: nothing to load.
        assert!(load_listed(dir.path().join("none").to_str().expect("utf-8")).is_empty());
    }

    #[test]
    fn the_summary_names_each_outcome_in_order() {
        let m = |name: &str, outcome| Loaded {
            name: name.to_owned(),
            path: PathBuf::from(format!("/{name}.ko")),
            outcome,
        };
        let loaded = [
            m("a", Outcome::Loaded),
            m("b", Outcome::AlreadyLoaded),
            m("c", Outcome::Failed(Errno::ENOEXEC)),
            m("d", Outcome::Loaded),
        ];
        assert_eq!(summary(&loaded), "loaded a, d; already loaded b; failed c");
        assert_eq!(summary(&[]), "none listed");
        assert_eq!(
            Outcome::Failed(Errno::ENOEXEC).to_string(),
            "failed: ENOEXEC: Exec format error"
        );
    }
}
