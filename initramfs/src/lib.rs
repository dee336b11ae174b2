//! Writes cpio `newc` archives and builds the agent's initramfs with the NIC
//! driver modules (and their dependencies) taken from a kernel's own module
//! tree.
//!
//! - [`cpio`]: the `newc` writer: deterministic, no root needed (device nodes
//!   are headers), gzip or zstd compression.
//! - [`modules`]: which `.ko` files a set of wanted modules (or PCI devices)
//!   needs, in load order, from `modules.dep` or each module's `.modinfo`.
//! - [`Initramfs::builder`]: the agent's initramfs: `/init`, the modules, their
//!   load order in [`MODULE_LIST`], and the minimal folders and device nodes.
//!
//! ```no_run
//! use mprov_initramfs::{Compression, Initramfs};
//!
//! let built = Initramfs::builder()
//!     .init(std::path::PathBuf::from("target/x86_64-unknown-linux-musl/release/mprov-agent"))
//!     .modules("/lib/modules/6.1.0-57-amd64", ["e1000", "virtio_net"])
//!     .extra_dependency("virtio_net", "virtio_pci")
//!     .build(Compression::Zstd)?;
//! std::fs::write("initrd.img", &built.image)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Architecture invariant: this is a pure library. No async runtime, no
//! sockets: everything here is a function from inputs to bytes. The only I/O
//! is reading the inputs it is given (files named as contents, a module tree)
//! and writing the output to the writer given; it needs no root and no
//! network, so it is tested anywhere. Callers in async code run it on a
//! blocking thread. The `mprov-initramfs` binary is a thin CLI over it.

#![warn(missing_docs)]

mod builder;
pub mod cpio;
pub mod modules;

pub use builder::{BuildError, Builder, Initramfs, MODULE_LIST};
pub use cpio::{Archive, Compression, Contents, Device, Meta};
pub use modules::{ModuleTree, PciId, Resolution};
