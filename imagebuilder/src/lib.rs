//! `mprov-image`: builds node images from a root directory, an OCI or
//! `docker save` archive, or a distro bootstrap plus image-gen scripts, and
//! packs `rootfs.tar.zst`, the kernel, the image's own agent initramfs
//! (`initramfs.img`: the agent as `/init` plus the NIC modules of that
//! kernel) and `manifest.json` into
//! `<images>/<slug>/<version>/`, the layout the job servers serve
//! (`mprov_api::boot::image_file_path`).
//!
//! - [`recipe`]: what to build (source, image-gen scripts in dependency
//!   order), from YAML or the command line.
//! - [`build`](mod@build): one version, built in a temporary folder beside the output
//!   and renamed into place only when complete.
//! - [`oci`]: OCI layouts and `docker save` archives, layers applied in order
//!   with whiteouts, every blob checked against its digest.
//! - [`pack`](mod@pack): the deterministic tar writer (modes, owners, hard links,
//!   devices, FIFOs, xattrs, sparse files, long names) with multithreaded
//!   zstd.
//! - [`unpack`](mod@unpack): the tar reader that applies layers and unpacks images,
//!   confined to its root.
//! - [`manifest`]: `manifest.json`, and verifying an image against it.
//!
//! Everything here is synchronous and blocking (file trees, compression, child
//! processes); an async caller runs it on a blocking thread. The
//! `mprov-image` binary is a thin CLI over it.

#![warn(missing_docs)]

pub mod build;
pub mod manifest;
pub mod oci;
pub mod pack;
mod progress;
pub mod recipe;
pub mod unpack;

pub use build::{BuildError, BuildOptions, Built, ImageGenRun, KernelChoice, build, is_no_space};
pub use manifest::{Artifact, Manifest, VerifyError, verify};
pub use pack::{PackError, PackOptions, Packed, pack};
pub use progress::Steps;
pub use recipe::{Bootstrap, BootstrapTool, Recipe, RecipeError, Script, Source};
pub use unpack::{UnpackError, UnpackOptions, Unpacked, unpack, unpack_file};
