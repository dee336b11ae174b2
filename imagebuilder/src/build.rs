//! Building one image version: the root from its source, the image-gen
//! scripts in it, the optional agent hook, then `rootfs.tar.zst`, the kernel
//! and `manifest.json` in `<out>/<slug>/<version>/`.
//!
//! Invariant: a version folder either is complete or does not exist. All work
//! happens in a temporary folder beside it (`<out>/<slug>/.build-<version>-*`,
//! same file system) and the finished version folder is renamed into place as
//! the last step, after its files are synced. A failed build removes its
//! temporary folder and leaves every existing version untouched; an existing
//! version is never overwritten.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{PermissionsExt, lchown, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::manifest::{self, Artifact, FORMAT, INITRAMFS, KERNEL, MANIFEST, Manifest, ROOTFS};
use crate::oci::{self, OciError};
use crate::pack::{self, PackError, PackOptions};
use crate::progress::Steps;
use crate::recipe::{Bootstrap, BootstrapTool, Recipe, RecipeError, Script, Source};
use crate::unpack::UnpackOptions;
use mprov_api::scripts::{PlannedScript, RunOutcome, RunReport, ScriptMode, ScriptPlan};
use sha2::Digest as _;

/// Where the `--agent` hook installs the agent binary in the image.
pub const AGENT_PATH: &str = "usr/libexec/mprov/mprov-agent";
/// The agent's systemd unit in the image.
pub const AGENT_UNIT: &str = "etc/systemd/system/mprov-agent.service";
/// The symlink that enables the unit.
pub const AGENT_WANTS: &str = "etc/systemd/system/multi-user.target.wants/mprov-agent.service";

/// The agent's unit: after boot, it records the boot's `mprov_*`
/// parameters in the journal (nonce redacted), then runs the node's agent
/// (`mprov-agent node`) with the certificate `/init` enrolled and left in
/// `/etc/mprov`: the post-boot scripts, "ready" only when they all
/// succeeded, the scripts again on `mash systems run-scripts`, and the
/// certificate's renewal. It tells systemd it is up once the first run is
/// over (`Type=notify`), so `multi-user.target` and the units after it
/// follow the post-boot scripts (which have their own timeouts, hence no
/// start timeout). Stopping the unit sends SIGTERM to the agent and any
/// script still running (`KillMode=control-group`).
const UNIT: &str = "\
[Unit]
Description=mProv node agent: post-boot scripts, ready, certificate renewal
Wants=network-online.target
After=network-online.target

[Service]
Type=notify
TimeoutStartSec=infinity
ExecStartPre=-/usr/libexec/mprov/mprov-agent cmdline
ExecStart=/usr/libexec/mprov/mprov-agent node
Restart=on-failure
RestartSec=10

[Install]
WantedBy=multi-user.target
";

/// The NIC drivers an image's agent initramfs carries, where its kernel has
/// them (as modules; built-in drivers need nothing): QEMU's and the
/// common server NICs.
pub const NIC_MODULES: &[&str] = &[
    "virtio_net",
    "e1000",
    "e1000e",
    "igb",
    "igc",
    "ixgbe",
    "i40e",
    "ice",
    "bnxt_en",
    "tg3",
    "r8169",
    "mlx4_en",
    "mlx5_core",
    "vmxnet3",
];

/// What [`BuildError::Io`] says when copying the root fails.
const COPYING_ROOT: &str = "copying the root to";

/// Lines of a failing command's output kept in the error.
const OUTPUT_TAIL: usize = 20;

/// Which kernel the image gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelChoice {
    /// This file.
    File(PathBuf),
    /// The newest `/boot/vmlinuz-*` of the root; none is an error.
    FromRoot,
    /// No kernel (a container-style root, or tests).
    Without,
}

/// How to build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The images folder: versions go to `<out>/<slug>/<version>/`.
    pub out: PathBuf,
    /// The version number; default one more than the highest present.
    pub version: Option<u64>,
    /// Which kernel the image gets.
    pub kernel: KernelChoice,
    /// Install this agent binary and its enabled unit (see [`AGENT_PATH`]).
    pub agent: Option<PathBuf>,
    /// How to pack the root.
    pub pack: PackOptions,
    /// Report each step (and the packing's progress) as lines of text.
    pub steps: Option<Steps>,
    /// The image-gen scripts as the control service planned them for an
    /// inventory image, run in place of the recipe's (which must have none).
    pub scripts: Option<ImageGenRun>,
}

/// Image-gen scripts to run: the plan and each script's content by slug
/// (checked against the plan's checksums before anything runs).
#[derive(Debug, Clone)]
pub struct ImageGenRun {
    /// The plan.
    pub plan: ScriptPlan,
    /// The contents.
    pub contents: BTreeMap<String, Vec<u8>>,
}

/// A built version.
#[derive(Debug, Clone)]
pub struct Built {
    /// Its folder.
    pub dir: PathBuf,
    /// Its manifest, as written.
    pub manifest: Manifest,
    /// Paths left out of the archive (sockets).
    pub skipped: Vec<PathBuf>,
    /// The image-gen scripts' results, when any ran.
    pub scripts: Option<RunReport>,
}

/// Why a build failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Installing the agent hook failed.
    #[error("installing the agent {path}")]
    Agent {
        /// The agent binary given.
        path: PathBuf,
        /// The cause.
        #[source]
        err: io::Error,
    },
    /// The distro bootstrap failed.
    #[error("{tool} failed ({status}):\n{output}")]
    Bootstrap {
        /// The tool.
        tool: &'static str,
        /// Its exit status.
        status: String,
        /// The end of its output.
        output: String,
    },
    /// A file or folder of the build could not be handled.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        err: io::Error,
    },
    /// The agent initramfs could not be built.
    #[error("building initramfs.img")]
    Initramfs(#[source] mprov_initramfs::BuildError),
    /// The file system of the images folder filled up. The temporary folder
    /// is gone by the time this is returned; `free` is what is left then.
    #[error(
        "no space left on device while {doing} in {}: free {} MiB, needs more",
        dir.display(),
        free >> 20
    )]
    NoSpace {
        /// What was being written (`writing rootfs.tar.zst`).
        doing: String,
        /// The image's folder, where the version was being built.
        dir: PathBuf,
        /// Bytes available there after the failed build was removed.
        free: u64,
        /// The error as it happened.
        #[source]
        err: Box<BuildError>,
    },
    /// The root has no kernel and none was given.
    #[error(
        "no /boot/vmlinuz-* in the root; give one with --kernel, or build without with --no-kernel"
    )]
    NoKernel,
    /// The container image could not be applied.
    #[error("reading the container image")]
    Oci(#[source] OciError),
    /// Packing the root failed.
    #[error("packing the root")]
    Pack(#[source] PackError),
    /// The recipe is unusable.
    #[error("checking the recipe")]
    Recipe(#[source] RecipeError),
    /// Both the recipe and the options give image-gen scripts.
    #[error("the recipe lists scripts and the build was given a plan too: give one or the other")]
    TwoScriptLists,
    /// The image-gen scripts could not be run (their files, the mounts).
    #[error("running the image-gen scripts")]
    Scripts(#[source] mprov_agent::scripts::exec::ExecError),
    /// An image-gen script failed, or the run was refused before any ran.
    #[error("image-gen script {slug} failed ({status}):\n{output}")]
    Script {
        /// The script.
        slug: String,
        /// Its exit status.
        status: String,
        /// The end of its output.
        output: String,
        /// The whole run's results.
        report: Box<RunReport>,
    },
    /// The slug cannot name a folder.
    #[error(
        "{slug:?} is not a valid image slug (letters, digits, `-`, `_`, `.`; not starting with `.`)"
    )]
    Slug {
        /// The slug.
        slug: String,
    },
    /// A tool the build needs is not installed.
    #[error("{tool} is not installed (it is needed for {why})")]
    ToolMissing {
        /// The tool.
        tool: &'static str,
        /// What needs it.
        why: &'static str,
    },
    /// The version already exists.
    #[error("{} already exists; versions are never overwritten", dir.display())]
    VersionExists {
        /// Its folder.
        dir: PathBuf,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> BuildError + use<> {
    let path = path.to_path_buf();
    move |err| BuildError::Io { what, path, err }
}

/// Builds one version of `recipe`'s image. A full disk is
/// [`BuildError::NoSpace`], reported once the temporary folder is removed.
pub fn build(recipe: &Recipe, options: &BuildOptions) -> Result<Built, BuildError> {
    let scripts = recipe.script_order().map_err(BuildError::Recipe)?;
    check_slug(&recipe.slug)?;
    let image_dir = options.out.join(&recipe.slug);
    // The temporary folder lives inside `build_in`: gone when it returns.
    build_in(recipe, &scripts, options, &image_dir).map_err(|err| no_space(err, &image_dir))
}

fn build_in(
    recipe: &Recipe,
    scripts: &[&Script],
    options: &BuildOptions,
    image_dir: &Path,
) -> Result<Built, BuildError> {
    let step = |line: &str| {
        if let Some(steps) = &options.steps {
            steps.line(line);
        }
    };
    fs::create_dir_all(image_dir).map_err(io_err("creating", image_dir))?;
    let version = match options.version {
        Some(v) => v,
        None => next_version(image_dir)?,
    };
    let final_dir = image_dir.join(version.to_string());
    if fs::symlink_metadata(&final_dir).is_ok() {
        return Err(BuildError::VersionExists { dir: final_dir });
    }
    let staging = tempfile::Builder::new()
        .prefix(&format!(".build-{version}-"))
        .tempdir_in(image_dir)
        .map_err(io_err("creating a temporary folder in", image_dir))?;
    step(&format!(
        "building {} version {version} in {}",
        recipe.slug,
        staging.path().display()
    ));
    let work_root = staging.path().join("root");
    let out_dir = staging.path().join("out");
    fs::create_dir(&out_dir).map_err(io_err("creating", &out_dir))?;

    let from_recipe;
    let run = match &options.scripts {
        Some(_) if !scripts.is_empty() => return Err(BuildError::TwoScriptLists),
        Some(run) => run,
        None => {
            from_recipe = recipe_run(scripts, &recipe.slug);
            &from_recipe
        }
    };
    let changes = !run.plan.scripts.is_empty() || options.agent.is_some();
    let (root, source) = match &recipe.source {
        Source::Dir(dir) => {
            if !dir.is_dir() {
                return Err(BuildError::Pack(PackError::NotADirectory {
                    path: dir.clone(),
                }));
            }
            if changes {
                step(&format!("copying the root {}", dir.display()));
                copy_tree(dir, &work_root)?;
                (work_root.clone(), format!("dir:{}", dir.display()))
            } else {
                // Nothing will change the tree: pack it where it is.
                (dir.clone(), format!("dir:{}", dir.display()))
            }
        }
        Source::Oci { path, reference } => {
            let scratch = staging.path().join("scratch");
            fs::create_dir(&scratch).map_err(io_err("creating", &scratch))?;
            fs::create_dir(&work_root).map_err(io_err("creating", &work_root))?;
            step(&format!("applying the container image {}", path.display()));
            let unpack = UnpackOptions {
                whiteouts: true,
                preserve_owner: nix::unistd::geteuid().is_root(),
            };
            oci::apply(
                path,
                reference.as_deref(),
                &work_root,
                &scratch,
                unpack,
                options.pack.progress,
            )
            .map_err(BuildError::Oci)?;
            fs::remove_dir_all(&scratch).map_err(io_err("removing", &scratch))?;
            let mut source = format!("oci:{}", path.display());
            if let Some(r) = reference {
                source.push('@');
                source.push_str(r);
            }
            (work_root.clone(), source)
        }
        Source::Bootstrap(bootstrap) => {
            let tool = match bootstrap.tool {
                BootstrapTool::Dnf => "dnf",
                BootstrapTool::Mmdebstrap => "mmdebstrap",
            };
            step(&format!("bootstrapping {} with {tool}", bootstrap.suite));
            bootstrap_root(bootstrap, &work_root)?;
            (work_root.clone(), format!("{tool}:{}", bootstrap.suite))
        }
    };

    let scripts = if run.plan.scripts.is_empty() {
        None
    } else {
        Some(run_scripts(&root, run, &recipe.slug, version, &step)?)
    };
    if let Some(agent) = &options.agent {
        step(&format!("installing the agent {}", agent.display()));
        install_agent(&root, agent).map_err(|err| BuildError::Agent {
            path: agent.clone(),
            err,
        })?;
    }
    let kernel = match &options.kernel {
        KernelChoice::Without => None,
        KernelChoice::File(path) => {
            let version = kernel_release(path).map_err(io_err("reading the kernel", path))?;
            Some((path.clone(), version))
        }
        KernelChoice::FromRoot => Some(find_kernel(&root)?.ok_or(BuildError::NoKernel)?),
    };

    let rootfs = out_dir.join(ROOTFS);
    step(&format!("packing {ROOTFS}"));
    let pack_options = PackOptions {
        steps: options.steps.clone().or_else(|| options.pack.steps.clone()),
        ..options.pack.clone()
    };
    let packed = pack::pack(&root, &rootfs, &pack_options).map_err(BuildError::Pack)?;
    step(&format!(
        "packed {} entries: {ROOTFS} {} MiB ({} MiB before compression), sha256 {}",
        packed.entries,
        packed.size >> 20,
        packed.uncompressed_size >> 20,
        packed.sha256
    ));
    let mut artifacts = vec![Artifact {
        name: ROOTFS.to_string(),
        size: packed.size,
        sha256: packed.sha256.clone(),
    }];
    let mut kernel_version = None;
    if let Some((path, release)) = kernel {
        let dest = out_dir.join(KERNEL);
        fs::copy(&path, &dest).map_err(io_err("copying the kernel", &path))?;
        let (size, sha256) = manifest::hash_file(&dest).map_err(io_err("reading", &dest))?;
        artifacts.push(Artifact {
            name: KERNEL.to_string(),
            size,
            sha256,
        });
        if let Some(agent) = &options.agent {
            step(&format!("building {INITRAMFS}"));
            let image = agent_initramfs(&root, agent, release.as_deref())?;
            let dest = out_dir.join(INITRAMFS);
            write_synced(&dest, &image)?;
            artifacts.push(Artifact {
                name: INITRAMFS.to_string(),
                size: image.len() as u64,
                sha256: hex::encode(sha2::Sha256::digest(&image)),
            });
        }
        kernel_version = release;
    }
    let manifest = Manifest {
        format: FORMAT,
        slug: recipe.slug.clone(),
        version,
        created: jiff::Timestamp::now()
            .round(jiff::Unit::Second)
            .unwrap_or(jiff::Timestamp::now())
            .to_string(),
        source,
        kernel_version,
        uncompressed_size: packed.uncompressed_size,
        file_count: packed.entries,
        artifacts,
    };
    let manifest_path = out_dir.join(MANIFEST);
    write_synced(&manifest_path, manifest.to_json().as_bytes())?;
    // The archive was synced by the packer, the manifest above; the kernel
    // copy still needs it.
    let kernel_copy = out_dir.join(KERNEL);
    if kernel_copy.exists() {
        File::open(&kernel_copy)
            .and_then(|f| f.sync_all())
            .map_err(io_err("syncing", &kernel_copy))?;
    }
    sync_dir(&out_dir)?;
    fs::rename(&out_dir, &final_dir).map_err(io_err("renaming into place", &final_dir))?;
    sync_dir(image_dir)?;
    step(&format!("published {}", final_dir.display()));
    drop(staging);
    Ok(Built {
        dir: final_dir,
        manifest,
        skipped: packed.skipped,
        scripts,
    })
}

/// The image's own agent initramfs: `agent` as `/init`, plus the
/// [`NIC_MODULES`] the root's module tree for `release` has, with their
/// dependencies. Without a module tree (a kernel given from outside the
/// root), the initramfs holds no modules.
fn agent_initramfs(
    root: &Path,
    agent: &Path,
    release: Option<&str>,
) -> Result<Vec<u8>, BuildError> {
    let tree = release.and_then(|release| {
        ["usr/lib/modules", "lib/modules"]
            .iter()
            .map(|dir| root.join(dir).join(release))
            .find(|dir| dir.is_dir())
    });
    let mut builder = mprov_initramfs::Initramfs::builder().init(agent.to_path_buf());
    if let Some(tree) = tree {
        let modules = mprov_initramfs::ModuleTree::open(&tree)
            .map_err(|err| BuildError::Initramfs(err.into()))?;
        let present = modules.names();
        let wanted: Vec<&str> = NIC_MODULES
            .iter()
            .copied()
            .filter(|name| present.contains(name))
            .collect();
        builder = builder
            .modules(tree.clone(), wanted)
            .extra_dependency("virtio_net", "virtio_pci");
    }
    let built = builder
        .build(mprov_initramfs::Compression::Zstd)
        .map_err(BuildError::Initramfs)?;
    Ok(built.image)
}

/// `err` as [`BuildError::NoSpace`] when a full file system caused it
/// (ENOSPC or EDQUOT anywhere in its chain), with what is free in `dir` now.
fn no_space(err: BuildError, dir: &Path) -> BuildError {
    if !is_no_space(&err) {
        return err;
    }
    let doing = match &err {
        BuildError::Pack(PackError::Write { path, .. }) => format!(
            "writing {}",
            path.file_name().map_or(path.as_os_str(), |n| n).display()
        ),
        // The temporary folder is gone: name what was written, not where.
        BuildError::Io {
            what: COPYING_ROOT, ..
        } => "copying the root".to_string(),
        BuildError::Io { what, path, .. } => format!(
            "{what} {}",
            path.file_name().map_or(path.as_os_str(), |n| n).display()
        ),
        other => other.to_string(),
    };
    let free = nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(0);
    BuildError::NoSpace {
        doing,
        dir: dir.to_path_buf(),
        free,
        err: Box::new(err),
    }
}

/// Whether a full file system is behind `err`.
pub fn is_no_space(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            let full = matches!(
                io.raw_os_error(),
                Some(nix::libc::ENOSPC) | Some(nix::libc::EDQUOT)
            ) || io.kind() == io::ErrorKind::StorageFull
                || io.kind() == io::ErrorKind::QuotaExceeded;
            if full {
                return true;
            }
            // An io::Error wrapping another error (the tar crate does).
            if let Some(inner) = io.get_ref()
                && is_no_space(inner)
            {
                return true;
            }
        }
        next = e.source();
    }
    false
}

fn check_slug(slug: &str) -> Result<(), BuildError> {
    let ok = !slug.is_empty()
        && !slug.starts_with('.')
        && slug
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(BuildError::Slug {
            slug: slug.to_string(),
        })
    }
}

/// One more than the highest numbered version folder, or 1.
fn next_version(image_dir: &Path) -> Result<u64, BuildError> {
    let mut highest = 0;
    for entry in fs::read_dir(image_dir).map_err(io_err("listing", image_dir))? {
        let entry = entry.map_err(io_err("listing", image_dir))?;
        if let Some(v) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u64>().ok())
        {
            highest = highest.max(v);
        }
    }
    Ok(highest + 1)
}

/// Copies a tree with everything a root holds (GNU `cp -a`: owners, modes,
/// hard links, devices, xattrs; reflinks where the file system has them).
fn copy_tree(from: &Path, to: &Path) -> Result<(), BuildError> {
    fs::create_dir(to).map_err(io_err("creating", to))?;
    let mut cmd = Command::new("cp");
    cmd.args(["-a", "--reflink=auto", "--"])
        .arg(from.join("."))
        .arg(to)
        .env("LC_ALL", "C");
    let output = run(&mut cmd, "cp", "copying the root")?;
    if !output.status.success() {
        let text = tail(&output);
        // cp's own words, in the C locale: the error kind is what callers
        // (and `no_space`) act on.
        let err = if text.contains("No space left on device") {
            io::Error::from_raw_os_error(nix::libc::ENOSPC)
        } else {
            io::Error::other(text)
        };
        return Err(BuildError::Io {
            what: COPYING_ROOT,
            path: to.to_path_buf(),
            err,
        });
    }
    Ok(())
}

/// Runs the distro bootstrap into `root` (which must not exist yet).
fn bootstrap_root(bootstrap: &Bootstrap, root: &Path) -> Result<(), BuildError> {
    let (tool, mut cmd) = match bootstrap.tool {
        BootstrapTool::Mmdebstrap => {
            let mut cmd = Command::new("mmdebstrap");
            cmd.arg(format!(
                "--variant={}",
                bootstrap.variant.as_deref().unwrap_or("minbase")
            ));
            if !bootstrap.include.is_empty() {
                cmd.arg(format!("--include={}", bootstrap.include.join(",")));
            }
            cmd.arg(&bootstrap.suite).arg(root).args(&bootstrap.mirrors);
            ("mmdebstrap", cmd)
        }
        BootstrapTool::Dnf => {
            let mut cmd = Command::new("dnf");
            cmd.arg(format!("--installroot={}", root.display()))
                .arg(format!("--releasever={}", bootstrap.suite))
                .args(["-y", "--setopt=install_weak_deps=False", "install"]);
            if bootstrap.include.is_empty() {
                cmd.arg("@core");
            } else {
                cmd.args(&bootstrap.include);
            }
            ("dnf", cmd)
        }
    };
    let output = run(&mut cmd, tool, "the distro bootstrap")?;
    if !output.status.success() {
        return Err(BuildError::Bootstrap {
            tool,
            status: output.status.to_string(),
            output: tail(&output),
        });
    }
    Ok(())
}

/// Runs a command to completion, its output captured; a missing program is
/// [`BuildError::ToolMissing`].
fn run(cmd: &mut Command, tool: &'static str, why: &'static str) -> Result<Output, BuildError> {
    cmd.stdin(Stdio::null()).output().map_err(|err| {
        if err.kind() == io::ErrorKind::NotFound {
            BuildError::ToolMissing { tool, why }
        } else {
            BuildError::Io {
                what: "running",
                path: PathBuf::from(tool),
                err,
            }
        }
    })
}

/// The last lines of a command's stdout and stderr.
fn tail(output: &Output) -> String {
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(OUTPUT_TAIL)..].join("\n")
}

/// Runs the image-gen scripts in `root` through the script-runner's
/// executor (`mprov_agent::scripts::exec`, as the job server's
/// `script-runner -i` runs an inventory image's): `chroot`ed, with `/proc`,
/// `/sys` and `/dev` mounted where the root has those folders, by
/// dependency layers (a layer's scripts at once), each with the default
/// timeout and its process group killed at it. The first failure stops the
/// build.
fn run_scripts(
    root: &Path,
    run: &ImageGenRun,
    slug: &str,
    version: u64,
    step: &(dyn Fn(&str) + Sync),
) -> Result<RunReport, BuildError> {
    use mprov_agent::scripts::exec;
    use mprov_api::scripts::ScriptStatus;
    let mut options = exec::Options::new(exec::Target::Image(root.to_path_buf()), false);
    options.env = vec![
        ("MPROV_IMAGE_SLUG".to_owned(), slug.to_owned()),
        ("MPROV_IMAGE_VERSION".to_owned(), version.to_string()),
    ];
    let observe = |event: &exec::Event<'_>| match event {
        exec::Event::Layer { slugs, .. } => {
            step(&format!("running image-gen scripts {}", slugs.join(", ")));
        }
        exec::Event::Ended(result) if result.status == ScriptStatus::Success => {
            let lines: Vec<&str> = result.output_tail.lines().collect();
            for line in &lines[lines.len().saturating_sub(OUTPUT_TAIL)..] {
                step(&format!("  {}: {line}", result.slug));
            }
        }
        exec::Event::Warning(warning) => step(&format!("warning: {warning}")),
        exec::Event::Ended(_) => {}
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let report = exec::execute(&run.plan, &run.contents, &options, &stop, &observe)
        .map_err(BuildError::Scripts)?;
    if report.outcome == RunOutcome::Success {
        return Ok(report);
    }
    let failed = report
        .results
        .iter()
        .find(|r| matches!(r.status, ScriptStatus::Failed | ScriptStatus::TimedOut));
    let (slug, status, output) = match failed {
        Some(result) => {
            let lines: Vec<&str> = result.output_tail.lines().collect();
            (
                result.slug.clone(),
                match (result.status, result.exit_code) {
                    (ScriptStatus::TimedOut, _) => "timed out".to_owned(),
                    (_, Some(code)) => format!("exit status: {code}"),
                    _ => "killed by a signal".to_owned(),
                },
                lines[lines.len().saturating_sub(OUTPUT_TAIL)..].join("\n"),
            )
        }
        None => (
            slug.to_owned(),
            format!("{:?}", report.outcome),
            report.detail.clone(),
        ),
    };
    Err(BuildError::Script {
        slug,
        status,
        output,
        report: Box::new(report),
    })
}

/// A recipe's scripts (in [`Recipe::script_order`]) as the plan the
/// script-runner's executor takes: their contents, checksummed here, the
/// default timeout, nothing disabled.
fn recipe_run(scripts: &[&Script], slug: &str) -> ImageGenRun {
    let contents: BTreeMap<String, Vec<u8>> = scripts
        .iter()
        .map(|s| {
            let content = s.content.clone().unwrap_or_default().into_bytes();
            (s.slug.clone(), content)
        })
        .collect();
    let plan = ScriptPlan {
        mode: ScriptMode::ImageGen,
        host: None,
        image: Some(slug.to_owned()),
        groups: Vec::new(),
        params: serde_json::json!({}),
        scripts: scripts
            .iter()
            .map(|s| PlannedScript {
                slug: s.slug.clone(),
                version: 1,
                sha256: hex::encode(sha2::Sha256::digest(&contents[&s.slug])),
                depends_on: s.depends_on.clone(),
                timeout_seconds: None,
                layer: "recipe".to_owned(),
            })
            .collect(),
        disabled: Vec::new(),
        run_request: 0,
    };
    ImageGenRun { plan, contents }
}

/// The `--agent` hook: the binary at [`AGENT_PATH`], its unit at
/// [`AGENT_UNIT`], enabled by the [`AGENT_WANTS`] symlink.
fn install_agent(root: &Path, agent: &Path) -> io::Result<()> {
    let bin = root.join(AGENT_PATH);
    let unit = root.join(AGENT_UNIT);
    let wants = root.join(AGENT_WANTS);
    for path in [&bin, &unit, &wants] {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
    }
    fs::copy(agent, &bin)?;
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755))?;
    fs::write(&unit, UNIT)?;
    fs::set_permissions(&unit, fs::Permissions::from_mode(0o644))?;
    if fs::symlink_metadata(&wants).is_ok() {
        fs::remove_file(&wants)?;
    }
    symlink(Path::new("/").join(AGENT_UNIT), &wants)?;
    if nix::unistd::geteuid().is_root() {
        for path in [&bin, &unit, &wants] {
            lchown(path, Some(0), Some(0))?;
        }
    }
    Ok(())
}

/// The newest `/boot/vmlinuz-<release>` of the root (a symlink is followed
/// inside the root) and its release.
fn find_kernel(root: &Path) -> Result<Option<(PathBuf, Option<String>)>, BuildError> {
    let boot = root.join("boot");
    let entries = match fs::read_dir(&boot) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(io_err("listing", &boot)(err)),
    };
    let mut found: Vec<String> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err("listing", &boot))?;
        if let Some(release) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_prefix("vmlinuz-"))
        {
            found.push(release.to_string());
        }
    }
    found.sort_by(|a, b| version_cmp(a, b));
    let Some(release) = found.pop() else {
        return Ok(None);
    };
    let mut path = boot.join(format!("vmlinuz-{release}"));
    // Debian's /boot holds files, but a symlink must not lead out of the root.
    for _ in 0..8 {
        match fs::read_link(&path) {
            Ok(target) if target.is_absolute() => {
                path = root.join(target.strip_prefix("/").unwrap_or(&target));
            }
            Ok(target) => path = path.parent().unwrap_or(root).join(target),
            Err(_) => break,
        }
    }
    Ok(Some((path, Some(release))))
}

/// Compares kernel releases: runs of digits numerically, the rest as bytes.
fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for ((da, xa), (db, xb)) in ca.iter().zip(&cb) {
        let ord = if *da && *db {
            let (na, nb) = (xa.trim_start_matches('0'), xb.trim_start_matches('0'));
            na.len().cmp(&nb.len()).then(na.cmp(nb))
        } else {
            xa.cmp(xb)
        };
        if ord.is_ne() {
            return ord;
        }
    }
    ca.len().cmp(&cb.len())
}

/// The release of a given kernel file: from its name (`vmlinuz-<release>`),
/// else from the x86 boot protocol header (the `kernel_version` string that
/// `file` prints), else unknown.
pub fn kernel_release(path: &Path) -> io::Result<Option<String>> {
    let mut head = Vec::new();
    File::open(path)?.take(64 * 1024).read_to_end(&mut head)?;
    if let Some(release) = path
        .file_name()
        .and_then(OsStr::to_str)
        .and_then(|n| n.strip_prefix("vmlinuz-"))
    {
        return Ok(Some(release.to_string()));
    }
    Ok(bzimage_release(&head))
}

/// The release from a bzImage's setup header: "HdrS" at 0x202, and at 0x20e
/// the offset (from 0x200) of a NUL-terminated version string.
fn bzimage_release(head: &[u8]) -> Option<String> {
    if head.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let offset = u16::from_le_bytes([*head.get(0x20e)?, *head.get(0x20f)?]) as usize;
    if offset == 0 {
        return None;
    }
    let text = head.get(0x200 + offset..)?;
    let end = text.iter().position(|b| *b == 0)?;
    let version = std::str::from_utf8(&text[..end]).ok()?;
    version.split_whitespace().next().map(str::to_string)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    let mut file = File::create(path).map_err(io_err("writing", path))?;
    io::Write::write_all(&mut file, bytes).map_err(io_err("writing", path))?;
    file.sync_all().map_err(io_err("syncing", path))
}

fn sync_dir(dir: &Path) -> Result<(), BuildError> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io_err("syncing", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_sort_numerically() {
        let mut v = vec![
            "6.1.0-9-amd64",
            "6.1.0-10-amd64",
            "5.10.0-28-amd64",
            "6.1.0-10-rt-amd64",
        ];
        v.sort_by(|a, b| version_cmp(a, b));
        assert_eq!(
            v,
            [
                "5.10.0-28-amd64",
                "6.1.0-9-amd64",
                "6.1.0-10-amd64",
                "6.1.0-10-rt-amd64"
            ]
        );
    }

    #[test]
    fn bzimage_header_gives_the_release() {
        let mut head = vec![0u8; 0x400];
        head[0x202..0x206].copy_from_slice(b"HdrS");
        head[0x20e..0x210].copy_from_slice(&0x100u16.to_le_bytes());
        head[0x300..0x300 + 29].copy_from_slice(b"6.1.0-57-amd64 (debian@x) #1\0");
        assert_eq!(bzimage_release(&head).as_deref(), Some("6.1.0-57-amd64"));
        head[0x202] = b'X';
        assert_eq!(bzimage_release(&head), None);
    }

    #[test]
    fn slugs_name_one_folder() {
        for good in ["compute", "nads", "gpu-node_2.1"] {
            assert!(check_slug(good).is_ok(), "{good}");
        }
        for bad in ["", ".hidden", "a/b", "..", "a b"] {
            assert!(check_slug(bad).is_err(), "{bad:?}");
        }
    }
}
