//! The `cargo xtask` commands: `test`, `demo`, `bench`, `install`,
//! `databases` and `layering`.
//!
//! `cargo xtask` is an alias (`.cargo/config.toml`) for the `xtask` binary of
//! this crate, whose `main` only parses arguments and calls into here. The
//! commands drive other programs (apt-get, rustup, cargo, the servers), so they
//! report errors with `anyhow`, and print the name of each step as it starts.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};

use anyhow::{Context, Result, bail};

mod bench;
mod databases;
mod demo;
mod install;
pub mod layering;
mod test;

pub use bench::{BenchOptions, RUST_BENCHES, RustBench, bench};
pub use databases::{DatabasesOptions, databases};
pub use demo::{DemoOptions, demo};
pub use install::{INSTALLED, InstallOptions, Installed, NOT_INSTALLED, install};
pub use layering::{LayeringOptions, layering};
pub use test::{MYSQL_URL_VAR, PACKAGES, PG_URL_VAR, RUSTUP_COMPONENTS, TestOptions, test};

/// The workspace root: the folder above this crate's.
///
/// `cargo run` (and so `cargo xtask`) tells the binary its crate's folder at run
/// time. We prefer that to the path compiled in, since cargo may reuse a binary
/// built from another checkout that shares the target folder; but only when it
/// is this crate's folder, since another crate's test may have run us.
pub fn workspace_root() -> PathBuf {
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.join("src/bin/xtask.rs").is_file())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    match crate_dir.parent() {
        Some(root) => root.to_path_buf(),
        None => crate_dir,
    }
}

/// Cargo's target folder: `CARGO_TARGET_DIR` when set (CI sets it), else
/// `target/` in the workspace root.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// A `cargo` command run in the workspace root, with the same cargo that runs
/// us when there is one (`cargo xtask` sets `CARGO`).
fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root());
    cmd
}

/// Prints the name of a step as it starts.
fn step(name: &str) {
    eprintln!("\n==> {name}");
}

/// Runs `cmd` with inherited stdio and fails unless it exits 0.
fn run(cmd: &mut Command) -> Result<()> {
    let status = status(cmd)?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

fn status(cmd: &mut Command) -> Result<ExitStatus> {
    cmd.status()
        .with_context(|| format!("running {}", describe(cmd)))
}

/// `program arg arg`, for messages.
fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}
