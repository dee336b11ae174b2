//! The agent's initramfs: the static agent binary as `/init`, the NIC driver
//! modules a kernel needs with their dependencies, and the few folders and
//! device nodes PID 1 needs before it mounts anything.
//!
//! Layout (`netboot-lab.md` section 4, with our agent in place of busybox):
//!
//! | path | what |
//! |---|---|
//! | `/init` | the agent, `0755` |
//! | `/dev/console`, `/dev/null` | `c 5 1` (`0600`) and `c 1 3` (`0666`): PID 1's stdout before devtmpfs is mounted |
//! | `/proc`, `/sys`, `/run`, `/tmp`, `/etc` | mount points and scratch (`/tmp` is `1777`) |
//! | `/lib/modules/<release>/…` | the modules, at their paths in the kernel's tree, decompressed (`.ko`) |
//! | `/etc/mprov/modules` | [`MODULE_LIST`]: the modules' absolute paths, one a line, in load order |
//!
//! Modules are stored decompressed because the whole archive is compressed
//! anyway, and so that the agent can `finit_module` them with no decompressor.
//! The load order is a file, not a `modules.dep`, so that the agent only reads
//! lines and loads them in turn.

use std::path::PathBuf;

use thiserror::Error;

use crate::cpio::{Archive, Compression, Contents, Device, EntryError, Meta, WriteError};
use crate::modules::{ModuleError, ModuleTree, PciId, Resolution};

/// The file listing the modules to load, in order, one absolute path a line
/// (e.g. `/lib/modules/6.1.0-57-amd64/kernel/drivers/net/ethernet/intel/e1000/e1000.ko`).
/// Present, perhaps empty, in every initramfs built here.
pub const MODULE_LIST: &str = "/etc/mprov/modules";

/// Why an initramfs could not be built.
#[derive(Debug, Error)]
pub enum BuildError {
    /// An entry was refused (a bad extra file name, or one that the layout
    /// already has).
    #[error(transparent)]
    Entry(#[from] EntryError),
    /// The modules could not be resolved or read.
    #[error(transparent)]
    Modules(#[from] ModuleError),
    /// No `/init` was given.
    #[error("no /init given: the initramfs needs the agent binary")]
    NoInit,
    /// PCI devices or extra dependencies were given without a module tree.
    #[error("PCI devices or extra module dependencies given without a kernel module tree")]
    NoModuleTree,
    /// The archive could not be written.
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// A built initramfs.
#[derive(Debug, Clone)]
pub struct Initramfs {
    /// The compressed archive.
    pub image: Vec<u8>,
    /// The kernel release of the module tree used, if any.
    pub release: Option<String>,
    /// The modules, in load order, and what was built in or skipped.
    pub modules: Resolution,
}

impl Initramfs {
    /// Starts describing an initramfs.
    pub fn builder() -> Builder {
        Builder::default()
    }
}

/// Describes an initramfs; [`Builder::build`] makes it.
#[derive(Debug, Clone, Default)]
pub struct Builder {
    init: Option<Contents>,
    tree: Option<PathBuf>,
    wanted: Vec<String>,
    extra_deps: Vec<(String, String)>,
    pci: Vec<PciId>,
    files: Vec<(String, Contents, u32)>,
    mtime: u32,
}

impl Builder {
    /// The agent binary, as bytes or a path ([`Contents`]).
    pub fn init(mut self, init: impl Into<Contents>) -> Self {
        self.init = Some(init.into());
        self
    }

    /// The kernel module tree (`lib/modules/<release>`, or an unpacked kernel
    /// package holding one) and the modules wanted from it.
    pub fn modules<S: Into<String>>(
        mut self,
        tree: impl Into<PathBuf>,
        wanted: impl IntoIterator<Item = S>,
    ) -> Self {
        self.tree = Some(tree.into());
        self.wanted.extend(wanted.into_iter().map(Into::into));
        self
    }

    /// A dependency no module declares: `needs` is loaded before `module`
    /// (e.g. `virtio_net` needs `virtio_pci`).
    pub fn extra_dependency(mut self, module: impl Into<String>, needs: impl Into<String>) -> Self {
        self.extra_deps.push((module.into(), needs.into()));
        self
    }

    /// Also wants the modules whose PCI aliases match these devices.
    pub fn pci_devices(mut self, devices: impl IntoIterator<Item = PciId>) -> Self {
        self.pci.extend(devices);
        self
    }

    /// Adds a root-owned regular file. `path` may start with `/`.
    pub fn extra_file(
        mut self,
        path: impl Into<String>,
        contents: impl Into<Contents>,
        mode: u32,
    ) -> Self {
        self.files.push((path.into(), contents.into(), mode));
        self
    }

    /// The mtime of every entry (default 0), e.g. from `SOURCE_DATE_EPOCH`.
    pub fn mtime(mut self, mtime: u32) -> Self {
        self.mtime = mtime;
        self
    }

    /// Resolves the modules and writes the archive, compressed.
    pub fn build(self, compression: Compression) -> Result<Initramfs, BuildError> {
        let (archive, release, modules) = self.archive()?;
        let image = archive.to_bytes(compression)?;
        Ok(Initramfs {
            image,
            release,
            modules,
        })
    }

    /// The archive, before it is written.
    fn archive(self) -> Result<(Archive, Option<String>, Resolution), BuildError> {
        let init = self.init.ok_or(BuildError::NoInit)?;
        let mut archive = Archive::new().with_mtime(self.mtime);
        archive.file("init", init, Meta::new(0o755))?;
        for (dir, mode) in [
            ("dev", 0o755),
            ("etc", 0o755),
            ("etc/mprov", 0o755),
            ("proc", 0o555),
            ("run", 0o755),
            ("sys", 0o555),
            ("tmp", 0o1777),
        ] {
            archive.dir(dir, Meta::new(mode))?;
        }
        archive.device("dev/console", Device::Char(5, 1), Meta::new(0o600))?;
        archive.device("dev/null", Device::Char(1, 3), Meta::new(0o666))?;

        let mut release = None;
        let mut resolution = Resolution::default();
        let mut list = String::new();
        match &self.tree {
            None if !self.pci.is_empty() || !self.extra_deps.is_empty() => {
                return Err(BuildError::NoModuleTree);
            }
            None => {}
            Some(dir) => {
                let tree = ModuleTree::open(dir)?;
                let mut wanted = self.wanted.clone();
                for name in tree.match_pci(&self.pci)? {
                    if !wanted.contains(&name) {
                        wanted.push(name);
                    }
                }
                resolution = tree.resolve(&wanted, &self.extra_deps)?;
                let base = format!("lib/modules/{}", tree.release());
                archive.dir(&base, Meta::new(0o755))?;
                for module in &resolution.modules {
                    let path = format!("{base}/{}", module.uncompressed_path().display());
                    archive.file(&path, tree.load(module)?, Meta::new(0o644))?;
                    list.push('/');
                    list.push_str(&path);
                    list.push('\n');
                }
                release = Some(tree.release().to_owned());
            }
        }
        let list_name = MODULE_LIST.trim_start_matches('/');
        archive.file(list_name, list.as_str(), Meta::new(0o644))?;
        for (path, contents, mode) in self.files {
            let path = path.strip_prefix('/').unwrap_or(&path);
            archive.file(path, contents, Meta::new(mode))?;
        }
        Ok((archive, release, resolution))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_modules_it_has_the_minimal_layout() {
        let built = Initramfs::builder()
            .init(b"\x7fELF agent".as_slice())
            .extra_file("/etc/hostname", "node1\n", 0o644)
            .mtime(42)
            .build(Compression::None)
            .expect("build");
        assert_eq!(built.release, None);
        assert!(built.modules.modules.is_empty());
        let text = String::from_utf8_lossy(&built.image);
        // Names appear in sorted order, each once.
        let names = [
            "dev\0",
            "dev/console\0",
            "dev/null\0",
            "etc\0",
            "etc/hostname\0",
            "etc/mprov\0",
            "etc/mprov/modules\0",
            "init\0",
            "proc\0",
            "run\0",
            "sys\0",
            "tmp\0",
            "TRAILER!!!\0",
        ];
        let mut at = 0;
        for name in names {
            let found = text[at..].find(name).unwrap_or_else(|| panic!("{name:?}"));
            at += found + name.len();
        }
        // The same description gives the same bytes.
        let again = Initramfs::builder()
            .extra_file("etc/hostname", "node1\n", 0o644)
            .init(b"\x7fELF agent".as_slice())
            .mtime(42)
            .build(Compression::None)
            .expect("build");
        assert_eq!(built.image, again.image);
    }

    #[test]
    fn mistakes_are_errors() {
        let err = Initramfs::builder()
            .build(Compression::None)
            .expect_err("no init");
        assert!(matches!(err, BuildError::NoInit));

        let err = Initramfs::builder()
            .init("x")
            .extra_file("init", "y", 0o755)
            .build(Compression::None)
            .expect_err("duplicate");
        assert_eq!(err.to_string(), "\"init\" is already in the archive");

        let err = Initramfs::builder()
            .init("x")
            .extra_file("etc/../x", "y", 0o644)
            .build(Compression::None)
            .expect_err("dotdot");
        assert!(matches!(err, BuildError::Entry(EntryError::Name(_))));

        let err = Initramfs::builder()
            .init("x")
            .pci_devices([PciId::new(0x8086, 0x100e)])
            .build(Compression::None)
            .expect_err("no tree");
        assert!(matches!(err, BuildError::NoModuleTree));

        let dir = tempfile::tempdir().expect("tempdir");
        let err = Initramfs::builder()
            .init("x")
            .modules(dir.path(), ["e1000"])
            .build(Compression::None)
            .expect_err("not a tree");
        assert!(matches!(
            err,
            BuildError::Modules(ModuleError::NotATree { .. })
        ));
    }

    #[test]
    fn modules_are_stored_with_their_load_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("lib/modules/6.1.0-test");
        std::fs::create_dir_all(root.join("kernel/net")).expect("mkdir");
        std::fs::write(
            root.join("modules.dep"),
            "kernel/net/b.ko: kernel/net/a.ko\nkernel/net/a.ko:\nkernel/net/c.ko:\n",
        )
        .expect("write");
        std::fs::write(
            root.join("modules.alias"),
            "alias pci:v00001234d00005678sv*sd*bc*sc*i* c\n",
        )
        .expect("write");
        for m in ["a", "b", "c"] {
            std::fs::write(root.join(format!("kernel/net/{m}.ko")), m).expect("write");
        }
        let built = Initramfs::builder()
            .init("x")
            .modules(dir.path(), ["b"])
            .pci_devices(["1234:5678".parse().expect("pci id")])
            .build(Compression::None)
            .expect("build");
        assert_eq!(built.release.as_deref(), Some("6.1.0-test"));
        assert_eq!(built.modules.names(), ["a", "b", "c"]);
        let text = String::from_utf8_lossy(&built.image);
        let list = "/lib/modules/6.1.0-test/kernel/net/a.ko\n\
                    /lib/modules/6.1.0-test/kernel/net/b.ko\n\
                    /lib/modules/6.1.0-test/kernel/net/c.ko\n";
        assert!(text.contains(list), "{text}");
        assert!(text.contains("lib/modules/6.1.0-test/kernel/net/c.ko\0"));
    }
}
