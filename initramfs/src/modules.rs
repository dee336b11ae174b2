//! Kernel modules: which `.ko` files a set of wanted modules needs, in the
//! order to load them, read from the kernel's own module tree
//! (`lib/modules/<release>/`).
//!
//! Two sources, as `modprobe` has them:
//!
//! - **depmod's index**, when the tree has `modules.dep`: dependencies from it,
//!   aliases from `modules.alias`, soft dependencies from `modules.softdep`,
//!   built-in modules from `modules.builtin`. No module file is opened.
//! - **each module's `.modinfo`** ELF section otherwise, as in a Debian kernel
//!   package, which ships no `modules.dep` (its postinst runs depmod):
//!   `depends=`, `softdep=` and `alias=` entries. Only the modules the
//!   resolution reaches are read, except for PCI matching, which reads all.
//!   Compressed modules (`.ko.gz`, `.ko.xz`, `.ko.zst`) are decompressed first.
//!
//! Load order: a depth-first walk from each wanted module, in the order given.
//! Before a module come its pre soft dependencies and the caller's extra ones
//! (in the order given), then its dependencies (by name, so that the order does
//! not depend on how the tree lists them); after it come its post soft
//! dependencies. So e1000 and virtio_net, with virtio_pci as virtio_net's extra
//! dependency, load as `e1000 virtio_ring virtio virtio_pci_legacy_dev
//! virtio_pci_modern_dev virtio_pci failover net_failover virtio_net`.
//!
//! Extra dependencies exist because some needs are declared nowhere: virtio_net
//! binds to virtio devices, which appear only once a transport such as
//! virtio_pci is loaded, and neither module names the other.
//!
//! Names are compared with `-` and `_` as the same character, as the kernel
//! does. A missing module or hard dependency is an error; a missing soft
//! dependency is skipped (and reported), as modprobe does. The only I/O is
//! reading the tree given.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use object::{Object, ObjectSection};
use thiserror::Error;

/// Why modules could not be resolved or read.
#[derive(Debug, Error)]
pub enum ModuleError {
    /// Modules depend on each other in a circle.
    #[error("dependency cycle: {}", modules.join(" -> "))]
    Cycle {
        /// The modules of the circle, the first repeated at the end.
        modules: Vec<String>,
    },
    /// A compressed module could not be decompressed.
    #[error("decompressing {path}")]
    Decompress {
        /// The module file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// A module file is not an ELF object this reader understands.
    #[error("reading the ELF sections of {path}")]
    Elf {
        /// The module file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: object::Error,
    },
    /// A line of one of depmod's files could not be understood.
    #[error("{path} line {line}: {reason}")]
    Index {
        /// The file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A module needs one (a dependency, or an extra one the caller named)
    /// that the tree does not have.
    #[error("{module} needs {dependency}, which is not in {tree}")]
    MissingDependency {
        /// The module.
        module: String,
        /// What it needs.
        dependency: String,
        /// The module tree.
        tree: PathBuf,
    },
    /// A module file has no `.modinfo` section.
    #[error("{path} has no .modinfo section: is it a kernel module?")]
    NoModinfo {
        /// The module file.
        path: PathBuf,
    },
    /// The folder is not a module tree.
    #[error(
        "{path} is not a kernel module tree: it has no modules.dep and no .ko files \
         (give lib/modules/<release>)"
    )]
    NotATree {
        /// The folder.
        path: PathBuf,
    },
    /// A wanted module is neither in the tree nor built in.
    #[error("no module {name} in {tree}")]
    NotFound {
        /// The module.
        name: String,
        /// The module tree.
        tree: PathBuf,
    },
    /// A PCI ID could not be parsed.
    #[error("PCI ID {0:?}: expected VENDOR:DEVICE[:SUBVENDOR:SUBDEVICE[:CLASS]] in hex")]
    PciId(String),
    /// A file or folder of the tree could not be read.
    #[error("reading {path}")]
    Read {
        /// The file or folder.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The folder holds `lib/modules/` with several releases (or none).
    #[error("{path}/lib/modules holds {} kernel releases; give lib/modules/<release>", releases.len())]
    Releases {
        /// The folder.
        path: PathBuf,
        /// The releases found.
        releases: Vec<String>,
    },
}

/// How a module file is compressed, from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleCompression {
    /// `.ko.gz`
    Gzip,
    /// `.ko`
    None,
    /// `.ko.xz`
    Xz,
    /// `.ko.zst`
    Zstd,
}

impl ModuleCompression {
    const ALL: [(&'static str, Self); 4] = [
        (".ko", Self::None),
        (".ko.gz", Self::Gzip),
        (".ko.xz", Self::Xz),
        (".ko.zst", Self::Zstd),
    ];

    /// The compression and the module name of a file name, if it is a module.
    fn of(file_name: &str) -> Option<(Self, String)> {
        Self::ALL.iter().find_map(|(suffix, c)| {
            let stem = file_name.strip_suffix(suffix)?;
            (!stem.is_empty()).then(|| (*c, normalize(stem)))
        })
    }

    fn suffix(self) -> &'static str {
        match self {
            Self::Gzip => ".ko.gz",
            Self::None => ".ko",
            Self::Xz => ".ko.xz",
            Self::Zstd => ".ko.zst",
        }
    }
}

/// What a module declares: from depmod's files or its `.modinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleInfo {
    /// The module name (with `_`, never `-`).
    pub name: String,
    /// The module file, relative to the tree.
    pub path: PathBuf,
    /// Its hard dependencies.
    pub depends: Vec<String>,
    /// Its soft dependencies to load before it.
    pub softdep_pre: Vec<String>,
    /// Its soft dependencies to load after it.
    pub softdep_post: Vec<String>,
    /// Its aliases, e.g. `pci:v00008086d0000100Esv*sd*bc*sc*i*`.
    pub aliases: Vec<String>,
}

/// One module of a resolution, in load order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModule {
    /// The module name.
    pub name: String,
    /// The module file, relative to the tree, as the tree has it.
    pub path: PathBuf,
    /// How that file is compressed.
    pub compression: ModuleCompression,
}

impl ResolvedModule {
    /// The file's path relative to the tree once decompressed (`.ko`).
    pub fn uncompressed_path(&self) -> PathBuf {
        let text = self.path.to_string_lossy();
        let stem = text
            .strip_suffix(self.compression.suffix())
            .unwrap_or(&text);
        PathBuf::from(format!("{stem}.ko"))
    }
}

/// What [`ModuleTree::resolve`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolution {
    /// The modules to load, dependencies first.
    pub modules: Vec<ResolvedModule>,
    /// Wanted modules or dependencies that are built into the kernel, so need
    /// no file.
    pub builtin: Vec<String>,
    /// Soft dependencies that the tree does not have, skipped.
    pub skipped_soft: Vec<String>,
}

impl Resolution {
    /// The module names in load order.
    pub fn names(&self) -> Vec<&str> {
        self.modules.iter().map(|m| m.name.as_str()).collect()
    }
}

/// A PCI device to support: vendor and device, optionally the subsystem and
/// the class (base class, subclass, programming interface as `0xBBSSII`).
/// Fields left out match any value in an alias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciId {
    /// Vendor ID, e.g. `0x8086`.
    pub vendor: u16,
    /// Device ID, e.g. `0x100e`.
    pub device: u16,
    /// Subsystem vendor ID.
    pub subvendor: Option<u16>,
    /// Subsystem device ID.
    pub subdevice: Option<u16>,
    /// Class code, e.g. `0x020000` for an Ethernet controller.
    pub class: Option<u32>,
}

impl PciId {
    /// Vendor and device only.
    pub const fn new(vendor: u16, device: u16) -> Self {
        Self {
            vendor,
            device,
            subvendor: None,
            subdevice: None,
            class: None,
        }
    }

    /// Whether a module alias (`pci:v…d…sv…sd…bc…sc…i…`, with `*` and `?`
    /// wildcards) matches this device.
    pub fn matches(&self, alias: &str) -> bool {
        let Some(fields) = PciAlias::parse(alias) else {
            return false;
        };
        let hex8 = |v: u16| format!("{:08X}", u32::from(v));
        let class = self.class.map(|c| {
            [
                format!("{:02X}", (c >> 16) & 0xff),
                format!("{:02X}", (c >> 8) & 0xff),
                format!("{:02X}", c & 0xff),
            ]
        });
        let ours: [Option<String>; 7] = [
            Some(hex8(self.vendor)),
            Some(hex8(self.device)),
            self.subvendor.map(hex8),
            self.subdevice.map(hex8),
            class.as_ref().map(|c| c[0].clone()),
            class.as_ref().map(|c| c[1].clone()),
            class.as_ref().map(|c| c[2].clone()),
        ];
        fields
            .0
            .iter()
            .zip(ours)
            .all(|(pattern, value)| value.is_none_or(|v| glob(pattern, &v)))
    }
}

impl FromStr for PciId {
    type Err = ModuleError;

    /// `8086:100e`, `1af4:1041:1af4:1100`, `1af4:1041:1af4:1100:020000`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ModuleError::PciId(s.to_owned());
        let parts: Vec<&str> = s.split(':').collect();
        let hex16 = |p: &str| {
            (p.len() <= 4)
                .then(|| u16::from_str_radix(p, 16).ok())
                .flatten()
                .ok_or_else(bad)
        };
        let mut id = match parts.as_slice() {
            [v, d] | [v, d, _, _] | [v, d, _, _, _] => Self::new(hex16(v)?, hex16(d)?),
            _ => return Err(bad()),
        };
        if let [_, _, sv, sd, ..] = parts.as_slice() {
            id.subvendor = Some(hex16(sv)?);
            id.subdevice = Some(hex16(sd)?);
        }
        if let [_, _, _, _, class] = parts.as_slice() {
            if class.len() != 6 {
                return Err(bad());
            }
            id.class = Some(u32::from_str_radix(class, 16).map_err(|_| bad())?);
        }
        Ok(id)
    }
}

impl fmt::Display for PciId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:04x}", self.vendor, self.device)?;
        if let (Some(sv), Some(sd)) = (self.subvendor, self.subdevice) {
            write!(f, ":{sv:04x}:{sd:04x}")?;
            if let Some(class) = self.class {
                write!(f, ":{class:06x}")?;
            }
        }
        Ok(())
    }
}

/// The seven patterns of a PCI alias: vendor, device, subvendor, subdevice,
/// base class, subclass, interface.
struct PciAlias([String; 7]);

impl PciAlias {
    fn parse(alias: &str) -> Option<Self> {
        let mut rest = alias.strip_prefix("pci:")?;
        let markers = ["v", "d", "sv", "sd", "bc", "sc", "i"];
        let mut fields: [String; 7] = Default::default();
        for (i, marker) in markers.iter().enumerate() {
            rest = rest.strip_prefix(marker)?;
            // Patterns hold hex digits in upper case and wildcards; the
            // markers are lower case, so the next one ends this field.
            let end = match markers.get(i + 1) {
                Some(next) => rest.find(next)?,
                None => rest.len(),
            };
            fields[i] = rest[..end].to_ascii_uppercase();
            rest = &rest[end..];
        }
        Some(Self(fields))
    }
}

/// fnmatch with `*` and `?`, as modalias patterns use.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(c) if *c == b'?' || *c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == b'*')
}

/// `virtio-net` → `virtio_net`.
pub fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

/// A kernel's module tree.
#[derive(Debug, Clone)]
pub struct ModuleTree {
    root: PathBuf,
    release: String,
    builtin: BTreeSet<String>,
    index: Index,
}

#[derive(Debug, Clone)]
enum Index {
    /// From depmod's files: everything known up front.
    Depmod(BTreeMap<String, ModuleInfo>),
    /// From a scan: the files, each module's `.modinfo` read when needed.
    Scan(BTreeMap<String, PathBuf>),
}

impl ModuleTree {
    /// Opens `lib/modules/<release>/`. A folder holding `lib/modules/` with
    /// exactly one release (an unpacked kernel package) is accepted too.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, ModuleError> {
        let root = find_root(dir.as_ref())?;
        let release = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let builtin = read_optional(&root.join("modules.builtin"))?
            .map(|text| {
                text.lines()
                    .filter_map(|l| l.rsplit('/').next())
                    .filter_map(ModuleCompression::of)
                    .map(|(_, name)| name)
                    .collect()
            })
            .unwrap_or_default();
        let index = match read_optional(&root.join("modules.dep"))? {
            Some(dep) => Index::Depmod(read_depmod(&root, &release, &dep)?),
            None => {
                let mut files = BTreeMap::new();
                scan(&root, &root, &mut files)?;
                if files.is_empty() {
                    return Err(ModuleError::NotATree { path: root });
                }
                Index::Scan(files)
            }
        };
        Ok(Self {
            root,
            release,
            builtin,
            index,
        })
    }

    /// The tree's folder, `…/lib/modules/<release>`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The kernel release, the tree folder's name (e.g. `6.1.0-57-amd64`).
    pub fn release(&self) -> &str {
        &self.release
    }

    /// Whether the tree has depmod's `modules.dep` (else `.modinfo` is read).
    pub fn has_modules_dep(&self) -> bool {
        matches!(self.index, Index::Depmod(_))
    }

    /// Every module name of the tree, sorted.
    pub fn names(&self) -> Vec<&str> {
        match &self.index {
            Index::Depmod(m) => m.keys().map(String::as_str).collect(),
            Index::Scan(m) => m.keys().map(String::as_str).collect(),
        }
    }

    /// What a module declares, or `None` if the tree has no such module.
    pub fn info(&self, name: &str) -> Result<Option<Cow<'_, ModuleInfo>>, ModuleError> {
        let name = normalize(name);
        match &self.index {
            Index::Depmod(m) => Ok(m.get(&name).map(Cow::Borrowed)),
            Index::Scan(m) => match m.get(&name) {
                Some(path) => Ok(Some(Cow::Owned(self.read_modinfo(&name, path)?))),
                None => Ok(None),
            },
        }
    }

    /// The modules whose PCI aliases match any of `devices`, sorted by name.
    /// Without `modules.alias` this reads every module of the tree.
    pub fn match_pci(&self, devices: &[PciId]) -> Result<Vec<String>, ModuleError> {
        let mut found = Vec::new();
        if devices.is_empty() {
            return Ok(found);
        }
        for name in self.names() {
            let Some(info) = self.info(name)? else {
                continue;
            };
            let matches = info
                .aliases
                .iter()
                .any(|alias| devices.iter().any(|d| d.matches(alias)));
            if matches {
                found.push(name.to_owned());
            }
        }
        Ok(found)
    }

    /// The modules to load for `wanted`, dependencies first. `extra` adds
    /// dependencies the modules do not declare: `(module, needs)` loads
    /// `needs` before `module`.
    pub fn resolve<S: AsRef<str>>(
        &self,
        wanted: &[S],
        extra: &[(S, S)],
    ) -> Result<Resolution, ModuleError> {
        let mut extras: HashMap<String, Vec<String>> = HashMap::new();
        for (module, needs) in extra {
            extras
                .entry(normalize(module.as_ref()))
                .or_default()
                .push(normalize(needs.as_ref()));
        }
        let mut walk = Walk {
            tree: self,
            extras,
            state: HashMap::new(),
            stack: Vec::new(),
            out: Resolution::default(),
        };
        for name in wanted {
            let name = normalize(name.as_ref());
            walk.visit(&name, Need::Wanted)?;
        }
        Ok(walk.out)
    }

    /// A resolved module's file, decompressed: the `.ko` to put in an
    /// initramfs.
    pub fn load(&self, module: &ResolvedModule) -> Result<Vec<u8>, ModuleError> {
        read_module(&self.root.join(&module.path))
    }

    fn read_modinfo(&self, name: &str, path: &Path) -> Result<ModuleInfo, ModuleError> {
        let full = self.root.join(path);
        let data = read_module(&full)?;
        let file = object::File::parse(data.as_slice()).map_err(|source| ModuleError::Elf {
            path: full.clone(),
            source,
        })?;
        let section = file
            .section_by_name(".modinfo")
            .ok_or_else(|| ModuleError::NoModinfo { path: full.clone() })?;
        let bytes = section.data().map_err(|source| ModuleError::Elf {
            path: full.clone(),
            source,
        })?;
        let mut info = ModuleInfo {
            name: name.to_owned(),
            path: path.to_path_buf(),
            depends: Vec::new(),
            softdep_pre: Vec::new(),
            softdep_post: Vec::new(),
            aliases: Vec::new(),
        };
        for entry in bytes.split(|b| *b == 0) {
            let entry = String::from_utf8_lossy(entry);
            let Some((key, value)) = entry.split_once('=') else {
                continue;
            };
            match key {
                "depends" => info
                    .depends
                    .extend(value.split(',').filter(|d| !d.is_empty()).map(normalize)),
                "softdep" => add_softdeps(&mut info, value),
                "alias" => info.aliases.push(value.to_owned()),
                _ => {}
            }
        }
        Ok(info)
    }
}

/// Why a module is visited, for the error when it is missing.
#[derive(Debug, Clone, Copy)]
enum Need<'a> {
    /// A hard dependency, or an extra one the caller named, of this module.
    Hard(&'a str),
    /// A soft dependency: skipped when missing.
    Soft,
    /// Asked for by the caller.
    Wanted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Done,
    Visiting,
}

struct Walk<'t> {
    tree: &'t ModuleTree,
    extras: HashMap<String, Vec<String>>,
    state: HashMap<String, State>,
    stack: Vec<String>,
    out: Resolution,
}

impl Walk<'_> {
    fn visit(&mut self, name: &str, need: Need<'_>) -> Result<(), ModuleError> {
        match self.state.get(name) {
            Some(State::Done) => return Ok(()),
            Some(State::Visiting) => {
                let start = self.stack.iter().position(|n| n == name).unwrap_or(0);
                let mut modules = self.stack[start..].to_vec();
                modules.push(name.to_owned());
                return Err(ModuleError::Cycle { modules });
            }
            None => {}
        }
        let Some(info) = self.tree.info(name)? else {
            self.state.insert(name.to_owned(), State::Done);
            if self.tree.builtin.contains(name) {
                self.out.builtin.push(name.to_owned());
                return Ok(());
            }
            let tree = self.tree.root.clone();
            return match need {
                Need::Soft => {
                    self.out.skipped_soft.push(name.to_owned());
                    Ok(())
                }
                Need::Hard(module) => Err(ModuleError::MissingDependency {
                    module: module.to_owned(),
                    dependency: name.to_owned(),
                    tree,
                }),
                Need::Wanted => Err(ModuleError::NotFound {
                    name: name.to_owned(),
                    tree,
                }),
            };
        };
        let info = info.into_owned();
        self.state.insert(name.to_owned(), State::Visiting);
        self.stack.push(name.to_owned());

        let extras = self.extras.get(name).cloned().unwrap_or_default();
        for extra in &extras {
            self.visit(extra, Need::Hard(name))?;
        }
        for pre in &info.softdep_pre {
            self.visit(pre, Need::Soft)?;
        }
        let mut depends = info.depends.clone();
        depends.sort();
        for dep in &depends {
            self.visit(dep, Need::Hard(name))?;
        }

        self.stack.pop();
        self.state.insert(name.to_owned(), State::Done);
        let compression = info
            .path
            .file_name()
            .and_then(|f| ModuleCompression::of(&f.to_string_lossy()))
            .map_or(ModuleCompression::None, |(c, _)| c);
        self.out.modules.push(ResolvedModule {
            name: name.to_owned(),
            path: info.path.clone(),
            compression,
        });
        for post in &info.softdep_post {
            self.visit(post, Need::Soft)?;
        }
        Ok(())
    }
}

/// `pre: a b post: c` (from `.modinfo` or `modules.softdep`).
fn add_softdeps(info: &mut ModuleInfo, spec: &str) {
    let mut post = false;
    for word in spec.split_whitespace() {
        match word {
            "pre:" => post = false,
            "post:" => post = true,
            name if post => info.softdep_post.push(normalize(name)),
            name => info.softdep_pre.push(normalize(name)),
        }
    }
}

fn find_root(dir: &Path) -> Result<PathBuf, ModuleError> {
    let nested = dir.join("lib/modules");
    if !nested.is_dir() {
        return Ok(dir.to_path_buf());
    }
    let read = |source| ModuleError::Read {
        path: nested.clone(),
        source,
    };
    let mut releases = Vec::new();
    for entry in fs::read_dir(&nested).map_err(read)? {
        let entry = entry.map_err(read)?;
        if entry.file_type().map_err(read)?.is_dir() {
            releases.push(entry.path());
        }
    }
    releases.sort();
    match releases.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(ModuleError::Releases {
            path: dir.to_path_buf(),
            releases: releases
                .iter()
                .filter_map(|r| r.file_name())
                .map(|r| r.to_string_lossy().into_owned())
                .collect(),
        }),
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, ModuleError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ModuleError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Reads `modules.dep` (`path: dep dep…`), then `modules.alias` and
/// `modules.softdep` when present.
fn read_depmod(
    root: &Path,
    release: &str,
    dep: &str,
) -> Result<BTreeMap<String, ModuleInfo>, ModuleError> {
    let dep_path = root.join("modules.dep");
    let absolute_prefix = format!("/lib/modules/{release}/");
    let module = |text: &str, line: usize| {
        let text = text.strip_prefix(&absolute_prefix).unwrap_or(text);
        let file = text.rsplit('/').next().unwrap_or(text);
        match ModuleCompression::of(file) {
            Some((_, name)) if !text.starts_with('/') => Ok((name, PathBuf::from(text))),
            _ => Err(ModuleError::Index {
                path: dep_path.clone(),
                line,
                reason: format!("{text:?} is not a module path in the tree"),
            }),
        }
    };
    let mut modules = BTreeMap::new();
    for (i, line) in dep.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let Some((path, deps)) = line.split_once(':') else {
            return Err(ModuleError::Index {
                path: dep_path.clone(),
                line: i + 1,
                reason: "no `:` after the module path".to_owned(),
            });
        };
        let (name, path) = module(path.trim(), i + 1)?;
        let depends = deps
            .split_whitespace()
            .map(|d| module(d, i + 1).map(|(n, _)| n))
            .collect::<Result<_, _>>()?;
        modules.insert(
            name.clone(),
            ModuleInfo {
                name,
                path,
                depends,
                softdep_pre: Vec::new(),
                softdep_post: Vec::new(),
                aliases: Vec::new(),
            },
        );
    }
    if let Some(text) = read_optional(&root.join("modules.alias"))? {
        for line in text.lines() {
            let mut words = line.split_whitespace();
            if let (Some("alias"), Some(alias), Some(name)) =
                (words.next(), words.next(), words.next())
                && let Some(info) = modules.get_mut(&normalize(name))
            {
                info.aliases.push(alias.to_owned());
            }
        }
    }
    if let Some(text) = read_optional(&root.join("modules.softdep"))? {
        for line in text.lines() {
            let mut words = line.splitn(3, char::is_whitespace);
            if let (Some("softdep"), Some(name), Some(spec)) =
                (words.next(), words.next(), words.next())
                && let Some(info) = modules.get_mut(&normalize(name))
            {
                add_softdeps(info, spec);
            }
        }
    }
    Ok(modules)
}

/// Collects every module file under `dir` (symlinks not followed: a tree's
/// `build` and `source` point at headers). Where a name is in two places,
/// `updates/` wins, as in depmod's default search order, then the first path.
fn scan(root: &Path, dir: &Path, files: &mut BTreeMap<String, PathBuf>) -> Result<(), ModuleError> {
    let read = |source| ModuleError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries = fs::read_dir(dir)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let kind = entry.file_type().map_err(read)?;
        let path = entry.path();
        if kind.is_dir() {
            scan(root, &path, files)?;
        } else if kind.is_file()
            && let Some((_, name)) = ModuleCompression::of(&entry.file_name().to_string_lossy())
        {
            let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
            let rank = |p: &Path| (!p.starts_with("updates"), p.to_path_buf());
            match files.get(&name) {
                Some(old) if rank(old) <= rank(&relative) => {}
                _ => {
                    files.insert(name, relative);
                }
            }
        }
    }
    Ok(())
}

/// A module file's bytes, decompressed by its name's suffix.
fn read_module(path: &Path) -> Result<Vec<u8>, ModuleError> {
    let data = fs::read(path).map_err(|source| ModuleError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let compression = ModuleCompression::of(&file_name).map_or(ModuleCompression::None, |c| c.0);
    let decompress = |source| ModuleError::Decompress {
        path: path.to_path_buf(),
        source,
    };
    match compression {
        ModuleCompression::None => Ok(data),
        ModuleCompression::Gzip => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(data.as_slice())
                .read_to_end(&mut out)
                .map_err(decompress)?;
            Ok(out)
        }
        ModuleCompression::Xz => {
            let mut out = Vec::new();
            lzma_rs::xz_decompress(&mut data.as_slice(), &mut out)
                .map_err(|e| decompress(io::Error::new(io::ErrorKind::InvalidData, e)))?;
            Ok(out)
        }
        ModuleCompression::Zstd => zstd::decode_all(data.as_slice()).map_err(decompress),
    }
}

#[cfg(test)]
mod tests;
