//! The agent's static binary, as the initramfs needs it: built for musl when
//! rustup has (or can add) the target, otherwise for glibc with `+crt-static`
//! (`netboot-lab.md` section 8), with the workspace's `agent` profile (size
//! first, LTO, stripped, `panic = "abort"`).
//!
//! A static binary is the point: the initramfs holds no libc. glibc's static
//! build still wants its shared NSS modules for name lookups, so musl is
//! preferred; the agent makes no NSS lookups at this stage, so either works.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::xtask::workspace_root;

/// The preferred target.
pub const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";
/// The fallback: glibc, linked statically.
pub const GNU_TARGET: &str = "x86_64-unknown-linux-gnu";
/// The cargo profile (root `Cargo.toml`).
pub const PROFILE: &str = "agent";

/// A built static agent.
#[derive(Debug, Clone)]
pub struct StaticAgent {
    /// The binary.
    pub path: PathBuf,
    /// The target it was built for.
    pub target: &'static str,
    /// Its size in bytes.
    pub size: u64,
    /// What `file` says about it.
    pub file_type: String,
}

/// Builds `mprov-agent` static (see the module docs) and checks with `file`
/// that it is statically linked.
pub fn build_static() -> Result<StaticAgent> {
    let target = if musl_target_ready() {
        MUSL_TARGET
    } else {
        GNU_TARGET
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root()).args([
        "build",
        "--quiet",
        "--package",
        "mprov-agent",
        "--bin",
        "mprov-agent",
        "--profile",
        PROFILE,
        "--target",
        target,
    ]);
    if target == GNU_TARGET {
        // `--target` keeps these flags off build scripts and proc macros.
        let mut flags = std::env::var("RUSTFLAGS").unwrap_or_default();
        flags.push_str(" -C target-feature=+crt-static");
        cmd.env("RUSTFLAGS", flags.trim());
    }
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "building the static agent ({target}) failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = crate::xtask::target_dir()
        .join(target)
        .join(PROFILE)
        .join("mprov-agent");
    let size = std::fs::metadata(&path)
        .with_context(|| format!("{} after the build", path.display()))?
        .len();
    let file = Command::new("file")
        .arg("--brief")
        .arg(&path)
        .output()
        .context("running file (install the Debian package file)")?;
    ensure!(file.status.success(), "file {} failed", path.display());
    let file_type = String::from_utf8_lossy(&file.stdout).trim().to_owned();
    // `file` says "statically linked", or "static-pie linked" for a static PIE.
    ensure!(
        file_type.contains("statically linked") || file_type.contains("static-pie linked"),
        "{} is not static: {file_type}",
        path.display()
    );
    Ok(StaticAgent {
        path,
        target,
        size,
        file_type,
    })
}

/// Whether the musl target's standard library is installed, adding it with
/// rustup if it is not. False (and the glibc fallback) when rustup is missing
/// or cannot add it, e.g. offline.
fn musl_target_ready() -> bool {
    let rustup = |args: &[&str]| {
        Command::new("rustup")
            .current_dir(workspace_root())
            .args(args)
            .output()
    };
    match rustup(&["target", "list", "--installed"]) {
        Ok(out) if out.status.success() => {
            if String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.trim() == MUSL_TARGET)
            {
                return true;
            }
        }
        _ => return false,
    }
    match rustup(&["target", "add", MUSL_TARGET]) {
        Ok(out) if out.status.success() => true,
        Ok(out) => {
            eprintln!(
                "mprov-tests: rustup target add {MUSL_TARGET} failed, building for glibc with +crt-static: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            false
        }
        Err(err) => {
            eprintln!("mprov-tests: running rustup: {err}; building for glibc with +crt-static");
            false
        }
    }
}
