//! `cargo xtask install`: puts mProv's binaries on `PATH`, with `cargo
//! install --path` for each binary crate.
//!
//! [`INSTALLED`] names what is installed and [`NOT_INSTALLED`] every other
//! binary of the workspace with the reason; a test compares both lists with
//! `cargo metadata`, so a new binary has to be placed in one of them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::{cargo, run, step, target_dir, workspace_root};

/// A binary that `cargo xtask install` installs.
#[derive(Debug, Clone, Copy)]
pub struct Installed {
    /// The binary's name.
    pub bin: &'static str,
    /// Its crate's folder, from the workspace root.
    pub path: &'static str,
    /// What it is, for `--help` and messages.
    pub what: &'static str,
}

/// What `cargo xtask install` installs, in this order.
pub const INSTALLED: &[Installed] = &[
    Installed {
        bin: "mprov-control",
        path: "control",
        what: "the control service (serve, migrate, enroll-token, signer)",
    },
    Installed {
        bin: "mash",
        path: "control/mash",
        what: "the admin shell over the REST API",
    },
    Installed {
        bin: "mprov-jobserver",
        path: "boot",
        what: "the job server: DHCP, DNS, TFTP and HTTP for booting nodes",
    },
    Installed {
        bin: "mprov-image",
        path: "imagebuilder",
        what: "builds, verifies and inspects node images",
    },
    Installed {
        bin: "mprov-initramfs",
        path: "initramfs",
        what: "builds the agent's initramfs",
    },
];

/// The workspace's other binaries, and why they are not installed.
pub const NOT_INSTALLED: &[(&str, &str)] = &[
    (
        "mprov-agent",
        "runs on the nodes as /init; `cargo xtask agent` builds its static binary",
    ),
    (
        "mprov-dhcp-testserver",
        "a fixture of the DHCP tests, not a product",
    ),
    ("xtask", "the project's own commands, run as `cargo xtask`"),
];

/// Options of `cargo xtask install`.
#[derive(Debug, Clone, Default)]
pub struct InstallOptions {
    /// The install root (binaries go to `<root>/bin`); cargo's default
    /// (`$CARGO_INSTALL_ROOT`, else `~/.cargo`) when `None`.
    pub root: Option<PathBuf>,
    /// Build with the dev profile instead of release (faster to build).
    pub debug: bool,
    /// Install only these binaries; all of [`INSTALLED`] when empty.
    pub bins: Vec<String>,
}

/// Installs the selected binaries, then says where they went and how to put
/// that folder on `PATH` if it is not.
pub fn install(options: &InstallOptions) -> Result<()> {
    let selected = select(&options.bins)?;
    let root = workspace_root();
    for installed in &selected {
        step(&format!("install: {} ({})", installed.bin, installed.what));
        let mut cmd = cargo();
        cmd.args(install_args(&root, installed, options));
        run(&mut cmd).with_context(|| format!("installing {}", installed.bin))?;
    }
    let bin_dir = bin_dir(options.root.as_deref());
    let names: Vec<&str> = selected.iter().map(|i| i.bin).collect();
    eprintln!(
        "\ninstalled {} into {}",
        names.join(", "),
        bin_dir.display()
    );
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|p| p == bin_dir));
    if !on_path {
        eprintln!(
            "{} is not on PATH; add it, for example in ~/.profile:\n    export PATH=\"{}:$PATH\"",
            bin_dir.display(),
            bin_dir.display()
        );
    }
    Ok(())
}

/// The entries of [`INSTALLED`] named in `bins`, in that list's order (all
/// when `bins` is empty); an unknown name is an error that lists the known
/// ones.
fn select(bins: &[String]) -> Result<Vec<&'static Installed>> {
    for bin in bins {
        if !INSTALLED.iter().any(|i| i.bin == bin) {
            let known: Vec<&str> = INSTALLED.iter().map(|i| i.bin).collect();
            match NOT_INSTALLED.iter().find(|(name, _)| name == bin) {
                Some((_, why)) => bail!("{bin} is not installed: {why}"),
                None => bail!(
                    "no binary {bin}; the installable ones are {}",
                    known.join(", ")
                ),
            }
        }
    }
    Ok(INSTALLED
        .iter()
        .filter(|i| bins.is_empty() || bins.iter().any(|b| b == i.bin))
        .collect())
}

/// The arguments of `cargo` that install `installed` from the workspace at
/// `root`: the lock file's versions (`--locked`), our target folder so that
/// builds are shared, and `--force` so that a changed source replaces an
/// installed binary of the same version.
fn install_args(root: &Path, installed: &Installed, options: &InstallOptions) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "install".into(),
        "--locked".into(),
        "--force".into(),
        "--path".into(),
        root.join(installed.path).into(),
        "--bin".into(),
        installed.bin.into(),
        "--target-dir".into(),
        target_dir().into(),
    ];
    if options.debug {
        args.push("--debug".into());
    }
    if let Some(dir) = &options.root {
        args.push("--root".into());
        args.push(dir.into());
    }
    args
}

/// Where cargo puts the binaries for `root`: `<root>/bin`, else
/// `$CARGO_INSTALL_ROOT/bin`, else `$CARGO_HOME/bin`, else `~/.cargo/bin`.
fn bin_dir(root: Option<&Path>) -> PathBuf {
    let root = root
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("CARGO_INSTALL_ROOT").map(PathBuf::from))
        .or_else(|| std::env::var_os("CARGO_HOME").map(PathBuf::from))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from(".cargo"));
    root.join("bin")
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn every_workspace_binary_is_placed() -> Result<()> {
        let out = cargo()
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .output()
            .context("running cargo metadata")?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let metadata: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let mut bins = Vec::new();
        for package in metadata["packages"].as_array().context("packages")? {
            for target in package["targets"].as_array().context("targets")? {
                let is_bin = target["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "bin"));
                if is_bin {
                    bins.push(target["name"].as_str().context("name")?.to_string());
                }
            }
        }
        bins.sort();
        let mut placed: Vec<String> = INSTALLED
            .iter()
            .map(|i| i.bin)
            .chain(NOT_INSTALLED.iter().map(|(b, _)| *b))
            .map(String::from)
            .collect();
        placed.sort();
        assert_eq!(
            bins, placed,
            "place every binary in INSTALLED or NOT_INSTALLED"
        );
        for installed in INSTALLED {
            assert!(
                workspace_root()
                    .join(installed.path)
                    .join("Cargo.toml")
                    .is_file(),
                "{installed:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn selection_names_what_it_refuses() {
        let all = select(&[]).unwrap();
        assert_eq!(all.len(), INSTALLED.len());
        let one = select(&["mash".into()]).unwrap();
        assert_eq!(one.iter().map(|i| i.bin).collect::<Vec<_>>(), ["mash"]);
        let err = select(&["mprov-agent".into()]).unwrap_err().to_string();
        assert!(err.contains("cargo xtask agent"), "{err}");
        let err = select(&["nope".into()]).unwrap_err().to_string();
        assert!(err.contains("mprov-jobserver"), "{err}");
    }

    #[test]
    fn bin_dir_is_under_the_root() {
        assert_eq!(
            bin_dir(Some(Path::new("/opt/mprov"))),
            Path::new("/opt/mprov/bin")
        );
    }

    /// A real `cargo install` into a temporary root, then the installed
    /// binary runs. One small crate keeps it short; the others take the same
    /// path.
    #[test]
    fn installs_into_a_temporary_root() -> Result<()> {
        let root = tempfile::tempdir()?;
        install(&InstallOptions {
            root: Some(root.path().to_path_buf()),
            debug: true,
            bins: vec!["mprov-initramfs".into()],
        })?;
        let bin = root.path().join("bin").join("mprov-initramfs");
        assert!(bin.is_file(), "{} missing", bin.display());
        let out = Command::new(&bin).arg("--help").output()?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("--kernel-modules"), "{help}");
        Ok(())
    }
}
