//! `mprov-image`: builds, verifies, inspects and unpacks node images. A thin
//! shell over the library: parse the flags, call it, print the outcome.

#![warn(missing_docs)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use mprov_image::{
    BuildOptions, KernelChoice, Manifest, PackOptions, Recipe, Source, build, unpack_file, verify,
};

const EXAMPLES: &str = "\
Examples:
  # From a root directory, with its own /boot/vmlinuz-*:
  mprov-image build --slug compute --root /srv/roots/compute --out /srv/mprov/images

  # From a container image (docker save, skopeo/umoci OCI archive or layout):
  docker save compute:1 -o compute.tar
  mprov-image build --slug compute --oci compute.tar --kernel vmlinuz --out images

  # From a distro bootstrap plus image-gen scripts (see the recipe format in
  # the crate docs):
  mprov-image build --recipe compute.yaml --out images

  mprov-image verify images/compute/3
  mprov-image inspect images/compute/3";

/// Builds mProv node images: rootfs.tar.zst, the kernel, the agent
/// initramfs (initramfs.img) and manifest.json in <out>/<slug>/<version>/.
#[derive(Debug, Parser)]
#[command(version, after_help = EXAMPLES)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Build a new image version.
    Build(BuildArgs),
    /// Print an image version's manifest.
    Inspect {
        /// The version folder (<out>/<slug>/<version>).
        dir: PathBuf,
        /// Print the manifest as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Unpack a rootfs.tar.zst into a folder (owners kept when run as root).
    Unpack {
        /// The archive.
        archive: PathBuf,
        /// The folder to unpack into (created if missing).
        dest: PathBuf,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Check an image version against its manifest.
    Verify {
        /// The version folder (<out>/<slug>/<version>).
        dir: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct BuildArgs {
    /// A YAML recipe: source and image-gen scripts.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["root", "oci"])]
    recipe: Option<PathBuf>,
    /// Build from this root directory.
    #[arg(long, value_name = "DIR", conflicts_with = "oci")]
    root: Option<PathBuf>,
    /// Build from an OCI image layout or archive, or a docker save archive.
    #[arg(long, value_name = "PATH")]
    oci: Option<PathBuf>,
    /// The image to take when the OCI source holds several (ref name or tag).
    #[arg(long = "ref", value_name = "NAME", requires = "oci")]
    reference: Option<String>,
    /// The image's slug (overrides the recipe's).
    #[arg(long)]
    slug: Option<String>,
    /// The images folder.
    #[arg(long, short, value_name = "DIR")]
    out: PathBuf,
    /// The version number (default: one more than the highest present).
    #[arg(long)]
    version: Option<u64>,
    /// The kernel to ship (default: the newest /boot/vmlinuz-* of the root).
    #[arg(long, value_name = "FILE", conflicts_with = "no_kernel")]
    kernel: Option<PathBuf>,
    /// Build an image without a kernel.
    #[arg(long)]
    no_kernel: bool,
    /// The mprov-agent binary to install at /usr/libexec/mprov/mprov-agent with
    /// an enabled systemd unit (default: MPROV_AGENT, else `mprov-agent` beside
    /// this program, else the build host's /usr/libexec/mprov/mprov-agent).
    /// With a kernel, the same binary is /init of the image's initramfs.img,
    /// with the NIC modules of that kernel. It must be static: build one with
    /// `cargo xtask agent`.
    #[arg(
        long,
        value_name = "PATH",
        env = "MPROV_AGENT",
        conflicts_with = "no_agent"
    )]
    agent: Option<PathBuf>,
    /// Build an image without the agent (and so without initramfs.img: such
    /// an image cannot be netbooted by mProv).
    #[arg(long)]
    no_agent: bool,
    /// zstd level.
    #[arg(long, default_value_t = mprov_image::pack::DEFAULT_LEVEL, value_parser = clap::value_parser!(i32).range(1..=19))]
    level: i32,
    /// zstd worker threads (default: the number of CPUs; 0: none).
    #[arg(long)]
    threads: Option<u32>,
    /// No progress bars.
    #[arg(long, short)]
    quiet: bool,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("mprov-image: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    match args.command {
        Cmd::Build(b) => build_cmd(b),
        Cmd::Inspect { dir, json } => {
            let m = Manifest::read(&dir)?;
            if json {
                print!("{}", m.to_json());
            } else {
                print!("{}", describe(&m));
            }
            Ok(())
        }
        Cmd::Unpack {
            archive,
            dest,
            quiet,
        } => {
            let done = unpack_file(&archive, &dest, !quiet)
                .with_context(|| format!("unpacking {}", archive.display()))?;
            eprintln!("{} entries unpacked into {}", done.entries, dest.display());
            Ok(())
        }
        Cmd::Verify { dir } => {
            let m = verify(&dir)?;
            println!(
                "{} version {}: OK ({} artefacts, {} entries)",
                m.slug,
                m.version,
                m.artifacts.len(),
                m.file_count
            );
            Ok(())
        }
    }
}

fn build_cmd(b: BuildArgs) -> Result<()> {
    let mut recipe = match (&b.recipe, &b.root, &b.oci) {
        (Some(path), _, _) => Recipe::read(path)?,
        (None, Some(root), _) => Recipe {
            slug: String::new(),
            source: Source::Dir(root.clone()),
            scripts: Vec::new(),
        },
        (None, None, Some(oci)) => Recipe {
            slug: String::new(),
            source: Source::Oci {
                path: oci.clone(),
                reference: b.reference.clone(),
            },
            scripts: Vec::new(),
        },
        (None, None, None) => bail!("give a source: --root, --oci or --recipe"),
    };
    if let Some(slug) = b.slug {
        recipe.slug = slug;
    }
    if recipe.slug.is_empty() {
        bail!("give the image a --slug");
    }
    let kernel = match (b.kernel, b.no_kernel) {
        (Some(path), _) => KernelChoice::File(path),
        (None, true) => KernelChoice::Without,
        (None, false) => KernelChoice::FromRoot,
    };
    let mut pack = PackOptions {
        level: b.level,
        progress: !b.quiet && std::io::stderr().is_terminal(),
        ..PackOptions::default()
    };
    if let Some(threads) = b.threads {
        pack.threads = threads;
    }
    let agent = if b.no_agent {
        None
    } else {
        Some(find_agent(b.agent)?)
    };
    let options = BuildOptions {
        out: b.out,
        version: b.version,
        kernel,
        agent,
        pack,
        steps: None,
        scripts: None,
    };
    let built = build(&recipe, &options)?;
    for path in &built.skipped {
        eprintln!("warning: {} left out (a socket)", path.display());
    }
    eprintln!("built {}", built.dir.display());
    print!("{}", describe(&built.manifest));
    Ok(())
}

/// The agent binary every image carries: the one given, else one beside
/// this program, else the build host's installed one.
fn find_agent(given: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path);
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("mprov-agent")));
    let installed = PathBuf::from("/").join(mprov_image::build::AGENT_PATH);
    beside
        .into_iter()
        .chain([installed])
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "every node image carries the mprov agent, and none was found beside this program or at /{}: give --agent PATH (build a static one with `cargo xtask agent`), or --no-agent",
                mprov_image::build::AGENT_PATH
            )
        })
}

/// The manifest for people.
fn describe(m: &Manifest) -> String {
    let mut out = format!(
        "image:        {} version {}\n\
         created:      {}\n\
         source:       {}\n\
         kernel:       {}\n\
         entries:      {}\n\
         uncompressed: {} bytes\n",
        m.slug,
        m.version,
        m.created,
        m.source,
        m.kernel_version.as_deref().unwrap_or("(none)"),
        m.file_count,
        m.uncompressed_size,
    );
    for a in &m.artifacts {
        out.push_str(&format!(
            "{:<15} {:>12} bytes  sha256 {}\n",
            a.name, a.size, a.sha256
        ));
    }
    out
}
