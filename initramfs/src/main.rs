//! `mprov-initramfs`: builds the agent's initramfs from the command line. A
//! thin shell over the library: parse the flags, build, write the file.

#![warn(missing_docs)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use mprov_initramfs::{Compression, Initramfs, MODULE_LIST, PciId};

const EXAMPLES: &str = "\
Examples:
  # The lab's kernel: e1000, and virtio_net with its PCI transport.
  mprov-initramfs --init target/release/mprov-agent \\
      --kernel-modules lab-cache/6.1.0-57-amd64/lib/modules/6.1.0-57-amd64 \\
      --module e1000 --module virtio_net --extra virtio_net=virtio_pci \\
      --compress zstd -o initrd.img

  # The drivers of the NICs a cluster has, by PCI ID.
  mprov-initramfs --init agent --kernel-modules /lib/modules/$(uname -r) \\
      --pci 8086:100e --pci 15b3:1017 -o initrd.img

The archive is deterministic: the same inputs give the same bytes. Modules are
stored decompressed at their tree paths; /etc/mprov/modules lists them in load
order, dependencies first.";

/// Builds the mProv agent's initramfs: the agent as /init, the kernel modules
/// the NICs need (with their dependencies, from the kernel's own module tree),
/// and /dev/console, /dev/null, /proc, /sys, /run, /tmp, /etc. Needs no root.
#[derive(Debug, Parser)]
#[command(version, after_help = EXAMPLES)]
struct Args {
    /// The agent binary to run as /init (a static executable, mode 0755).
    #[arg(long, value_name = "PATH")]
    init: PathBuf,

    /// The kernel's module tree: lib/modules/<release>, or an unpacked kernel
    /// package holding one. Uses modules.dep when it has one, else reads each
    /// module's .modinfo (compressed .ko.gz/.ko.xz/.ko.zst too).
    #[arg(long, value_name = "DIR")]
    kernel_modules: Option<PathBuf>,

    /// A module to include with its dependencies; repeat for more. `-` and `_`
    /// are the same.
    #[arg(long = "module", value_name = "NAME", requires = "kernel_modules")]
    modules: Vec<String>,

    /// A dependency that no module declares: NEEDS is included and loaded
    /// before MODULE; repeat for more. virtio_net needs virtio_pci (or another
    /// virtio transport) but does not say so.
    #[arg(
        long = "extra",
        value_name = "MODULE=NEEDS",
        value_parser = parse_extra,
        requires = "kernel_modules"
    )]
    extra: Vec<(String, String)>,

    /// Also include the modules whose aliases match this PCI device:
    /// VENDOR:DEVICE[:SUBVENDOR:SUBDEVICE[:CLASS]] in hex, as `lspci -nn`
    /// shows it (e.g. 8086:100e); repeat for more.
    #[arg(long = "pci", value_name = "ID", requires = "kernel_modules")]
    pci: Vec<PciId>,

    /// Add a file to the image, DEST=SRC (e.g. /etc/mprov/agent.toml=./agent.toml),
    /// root-owned, mode 0644; repeat for more.
    #[arg(long = "file", value_name = "DEST=SRC", value_parser = parse_extra)]
    files: Vec<(String, String)>,

    /// How to compress the archive: zstd, gzip or none.
    #[arg(long, value_name = "HOW", default_value = "zstd")]
    compress: Compression,

    /// The mtime of every entry, in seconds since the epoch.
    #[arg(
        long,
        value_name = "SECONDS",
        env = "SOURCE_DATE_EPOCH",
        default_value_t = 0
    )]
    mtime: u32,

    /// Where to write the image (replaced atomically).
    #[arg(short, long, value_name = "OUT")]
    output: PathBuf,
}

fn parse_extra(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_owned(), b.to_owned())),
        _ => Err(format!("expected A=B, got {s:?}")),
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mprov-initramfs: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    anyhow::ensure!(
        args.init.is_file(),
        "--init {}: no such file",
        args.init.display()
    );
    let mut builder = Initramfs::builder()
        .init(args.init.clone())
        .mtime(args.mtime);
    if let Some(tree) = &args.kernel_modules {
        builder = builder
            .modules(tree, args.modules.iter().cloned())
            .pci_devices(args.pci.iter().copied());
        for (module, needs) in &args.extra {
            builder = builder.extra_dependency(module, needs);
        }
    }
    for (dest, src) in &args.files {
        builder = builder.extra_file(dest.as_str(), PathBuf::from(src), 0o644);
    }
    let built = builder
        .build(args.compress)
        .context("building the initramfs")?;

    let mut tmp = args.output.clone().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, &built.image).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &args.output)
        .with_context(|| format!("renaming {} to {}", tmp.display(), args.output.display()))?;

    eprintln!(
        "wrote {} ({} bytes, {})",
        args.output.display(),
        built.image.len(),
        args.compress
    );
    if let Some(release) = &built.release {
        eprintln!(
            "modules for {release}, in load order ({MODULE_LIST}): {}",
            built.modules.names().join(" ")
        );
    }
    if !built.modules.builtin.is_empty() {
        eprintln!("built into the kernel: {}", built.modules.builtin.join(" "));
    }
    if !built.modules.skipped_soft.is_empty() {
        eprintln!(
            "soft dependencies not in the tree, skipped: {}",
            built.modules.skipped_soft.join(" ")
        );
    }
    Ok(())
}
