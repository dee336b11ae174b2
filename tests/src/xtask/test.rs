//! `cargo xtask test`: install what the tests need, then run fmt, clippy and
//! every test of the workspace against real database servers.
//!
//! It must work as root on a fresh Debian machine with `CI=true` and no terminal,
//! since `.ci/run` is just this command: installs are non-interactive and
//! idempotent, and `apt-get update` runs only when a package is missing.

use anyhow::{Context, Result, anyhow, bail};
use nix::unistd::geteuid;
use std::process::Command;

use super::{cargo, describe, run, step};
use crate::db::{MariaDb, Postgres};

/// The Debian packages that the tests need. Add to this list when a test needs a
/// new program; `cargo xtask test` installs what is missing.
pub const PACKAGES: &[&str] = &[
    // databases
    "mariadb-server",
    "mariadb-client",
    "postgresql",
    "postgresql-client",
    "sqlite3",
    "tzdata",
    // the lab: namespaces, clients nobody here wrote, the incumbents
    "iproute2",
    "curl",
    "wget",
    "file",
    "tcpdump",
    "ndisc6",
    "udhcpc",
    "isc-dhcp-client",
    "kea-admin",
    "kea-dhcp4-server",
    "dnsmasq-base",
    "dnsutils",
    "dnsperf",
    "tftp-hpa",
    "tftpd-hpa",
    "atftp",
    "nginx-light",
    // pdsh's genders file as libgenders writes it, read by nodeattr
    "genders",
    // benchmarks: the servers' exact CPU time (tests/bench/tftp.sh)
    "linux-perf",
    // TLS: the CA and HTTPS checked from outside
    "openssl",
    // LDAP sign-in: a real directory server and its clients (tests/src/ldap.rs)
    "slapd",
    "ldap-utils",
    // netbooting VMs
    "qemu-system-x86",
    "ipxe",
    "ipxe-qemu",
    "ovmf",
    "busybox-static",
    // the static agent: ring (rustls) compiles C for the musl target
    "musl-tools",
    "cpio",
    "kmod",
    // initramfs: the archives we write, decompressed by the system's tools
    "gzip",
    "zstd",
    // image builder: GNU tar and attr check what we pack, umoci makes OCI
    // images we did not, mmdebstrap bootstraps a real Debian root
    "tar",
    "attr",
    "umoci",
    "mmdebstrap",
    // the admin pages' browser tests: headless Chromium over WebDriver
    "chromium",
    "chromium-driver",
    // NADS: a real LLDP agent speaks for the switch (tests/tests/agent_nads.rs);
    // its own service is masked before it installs ([`SERVICES_KEPT_DOWN`])
    "lldpd",
];

/// Services that come with [`PACKAGES`] and must not run in the host's
/// network namespace: lldpd would announce this machine on every link, and
/// the tests start their own inside namespaces. Masked before `apt-get
/// install` (so the package's postinst does not start them on a systemd
/// machine) and stopped after it (on a machine without systemd, whose
/// init script may have started them).
pub(super) const SERVICES_KEPT_DOWN: &[&str] = &["lldpd"];

/// The rustup components that the checks need.
pub const RUSTUP_COMPONENTS: &[&str] = &["rustfmt", "clippy"];

/// The environment variable that gives the tests a MariaDB admin URL.
pub const MYSQL_URL_VAR: &str = "MPROV_TEST_MYSQL_URL";
/// The environment variable that gives the tests a PostgreSQL admin URL.
pub const PG_URL_VAR: &str = "MPROV_TEST_PG_URL";

/// Options of `cargo xtask test`.
#[derive(Debug, Clone, Default)]
pub struct TestOptions {
    /// Extra arguments for `cargo test --workspace`.
    pub cargo_test_args: Vec<String>,
}

/// Runs every step, even after one fails, except that nothing runs when the
/// install fails. Fails if any step failed.
pub fn test(options: &TestOptions) -> Result<()> {
    step("install: Debian packages and rustup components");
    install().context("install")?;

    let mut results = Steps::default();

    step("fmt: cargo fmt --all -- --check");
    results.push(("fmt", run(cargo().args(["fmt", "--all", "--", "--check"]))));

    step("clippy: cargo clippy --workspace --all-targets -- -D warnings");
    results.push((
        "clippy",
        run(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])),
    ));

    step("doc: cargo doc --workspace --no-deps with RUSTDOCFLAGS=-D warnings");
    results.push((
        "doc",
        run(cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings")),
    ));

    step("databases: start MariaDB and PostgreSQL");
    match start_databases() {
        Ok((mariadb, postgres)) => {
            results.push(("databases", Ok(())));
            eprintln!("{MYSQL_URL_VAR}={}", mariadb.url());
            eprintln!("{PG_URL_VAR}={}", postgres.url());

            step("test: cargo test --workspace --no-fail-fast");
            let urls = [(MYSQL_URL_VAR, mariadb.url()), (PG_URL_VAR, postgres.url())];
            results.push(("test", cargo_test(&options.cargo_test_args, &urls)));

            step("stop databases");
            let stopped_mariadb = mariadb.stop().context("MariaDB");
            let stopped_postgres = postgres.stop().context("PostgreSQL");
            results.push(("stop databases", stopped_mariadb.and(stopped_postgres)));
        }
        Err(err) => {
            results.push(("databases", Err(err)));
            results.push(("test", Err(anyhow!("not run: the databases did not start"))));
        }
    }

    step("tidy: workspace lints and dependency versions declared once");
    results.push(("tidy", tidy()));

    results.push((
        "layering",
        super::layering::layering(&super::layering::LayeringOptions { deny: true }),
    ));

    step("bench: every benchmark's --smoke run");
    results.push((
        "bench smoke",
        super::bench::bench(&super::bench::BenchOptions {
            name: None,
            smoke: true,
        }),
    ));

    step("demo: cargo xtask demo --check");
    results.push(("demo", demo_check()));

    let mut failed = Vec::new();
    eprintln!();
    for (name, result, took) in &results.done {
        let took = took.as_secs();
        match result {
            Ok(()) => eprintln!("xtask test: {name}: ok ({took} s)"),
            Err(err) => {
                eprintln!("xtask test: {name}: FAILED ({took} s): {err:#}");
                failed.push(*name);
            }
        }
    }
    if !failed.is_empty() {
        bail!("failed steps: {}", failed.join(", "));
    }
    Ok(())
}

/// The package of the lab's VM tests.
const LAB_PACKAGE: &str = "mprov-tests";

/// `cargo test --workspace --no-fail-fast` with `urls` in the environment.
///
/// Without extra arguments, the lab's package (its VM tests take most of the
/// run, mostly on one core under TCG) runs beside the rest of the workspace,
/// after one build of everything: its output is kept in a file and printed
/// when both are done, so neither interleaves with the other.
fn cargo_test(extra: &[String], urls: &[(&str, String)]) -> Result<()> {
    let test = || {
        let mut cmd = cargo();
        cmd.args(["test", "--no-fail-fast"]);
        for (var, url) in urls {
            cmd.env(var, url);
        }
        cmd
    };
    if !extra.is_empty() {
        return run(test().arg("--workspace").args(extra));
    }
    run(test().args(["--workspace", "--no-run"]))?;
    let log_path = super::target_dir().join("xtask-test-lab.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let mut lab = test()
        .args(["--package", LAB_PACKAGE])
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the lab's tests")?;
    eprintln!(
        "the lab's tests ({LAB_PACKAGE}) run beside the rest; their output follows them, from {}",
        log_path.display()
    );
    let rest = run(test().args(["--workspace", "--exclude", LAB_PACKAGE]));
    let lab_status = lab.wait().context("waiting for the lab's tests")?;
    eprintln!("\n==> the lab's tests ({LAB_PACKAGE}):");
    let text = std::fs::read(&log_path).unwrap_or_default();
    eprintln!("{}", String::from_utf8_lossy(&text));
    let lab = if lab_status.success() {
        Ok(())
    } else {
        Err(anyhow!(
            "cargo test --package {LAB_PACKAGE} failed ({lab_status})"
        ))
    };
    match (rest, lab) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
        (Err(a), Err(b)) => Err(anyhow!("{a:#}; {b:#}")),
    }
}

/// Each step's result and how long it took (the time since the previous
/// step ended), so that a slow CI run says where its time went.
struct Steps {
    done: Vec<(&'static str, Result<()>, std::time::Duration)>,
    mark: std::time::Instant,
}

impl Default for Steps {
    fn default() -> Self {
        Self {
            done: Vec::new(),
            mark: std::time::Instant::now(),
        }
    }
}

impl Steps {
    fn push(&mut self, (name, result): (&'static str, Result<()>)) {
        self.done.push((name, result, self.mark.elapsed()));
        self.mark = std::time::Instant::now();
    }
}

/// The README's main command, end to end: the service starts on its embedded
/// defaults and answers.
fn demo_check() -> Result<()> {
    super::demo::demo(&super::demo::DemoOptions { check: true })
}

/// Every crate takes the workspace lints, and takes every dependency's version
/// from the root manifest, so versions and lints are declared once.
fn tidy() -> Result<()> {
    let root = super::workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))?;
    let members: Vec<String> = manifest
        .split("members = [")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .context("no members list in the root Cargo.toml")?
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect();
    let mut problems = Vec::new();
    for member in &members {
        let path = root.join(member).join("Cargo.toml");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        if !text.contains("[lints]\nworkspace = true") {
            problems.push(format!("{member}: missing `[lints] workspace = true`"));
        }
        let mut section = String::new();
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                section = line.to_owned();
                continue;
            }
            let in_deps = section.ends_with("dependencies]");
            if in_deps
                && !line.is_empty()
                && !line.starts_with('#')
                && !line.contains("workspace = true")
            {
                problems.push(format!(
                    "{member}: {section} {line}: declare it in the root [workspace.dependencies]"
                ));
            }
        }
    }
    if problems.is_empty() {
        eprintln!("{} crates checked", members.len());
        Ok(())
    } else {
        bail!("{}", problems.join("\n"))
    }
}

fn start_databases() -> Result<(MariaDb, Postgres)> {
    let mariadb = MariaDb::start().context("starting MariaDB")?;
    let postgres = Postgres::start().context("starting PostgreSQL")?;
    Ok((mariadb, postgres))
}

/// Installs the missing Debian packages and the rustup components.
pub(super) fn install() -> Result<()> {
    let missing = missing_packages()?;
    if missing.is_empty() {
        eprintln!("Debian packages installed: {}", PACKAGES.join(" "));
    } else {
        let list = missing.join(" ");
        if !geteuid().is_root() {
            bail!(
                "missing Debian packages: {list}; as root run \
                 `apt-get install --no-install-recommends {list}`"
            );
        }
        eprintln!("Debian packages missing: {list}");
        run(apt_get().arg("update"))?;
        keep_services_down(&missing, false);
        run(apt_get()
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing))?;
        keep_services_down(&missing, true);
        let still = missing_packages()?;
        if !still.is_empty() {
            bail!("still missing after apt-get install: {}", still.join(" "));
        }
    }

    install_axe()?;

    let mut rustup = Command::new("rustup");
    rustup.args(["component", "add"]).args(RUSTUP_COMPONENTS);
    match rustup.status() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => bail!("{} failed ({status})", describe(&rustup)),
        // A toolchain without rustup (a distribution's cargo) may still have them.
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            for tool in ["fmt", "clippy"] {
                run(cargo().args([tool, "--version"]))
                    .with_context(|| format!("no rustup, and no `cargo {tool}`"))?;
            }
            Ok(())
        }
        Err(err) => Err(err).with_context(|| format!("running {}", describe(&rustup))),
    }
}

/// Masks (`installed` false: before the install) or stops and disables
/// (after it) each of [`SERVICES_KEPT_DOWN`] that is among `missing`. With
/// systemd, a masked unit is never started, by the package or at boot;
/// without it, the init script is stopped and its links removed. Best
/// effort: a failure is printed, and the tests that need the package still
/// run their own copy in a namespace.
fn keep_services_down(missing: &[&str], installed: bool) {
    let systemd = std::path::Path::new("/run/systemd/system").is_dir();
    for service in SERVICES_KEPT_DOWN.iter().filter(|s| missing.contains(s)) {
        let script = format!("/etc/init.d/{service}");
        let commands: Vec<Vec<&str>> = match (systemd, installed) {
            (true, false) => vec![vec!["systemctl", "mask", service]],
            (true, true) => vec![vec!["systemctl", "stop", service]],
            (false, false) => vec![],
            (false, true) if std::path::Path::new(&script).is_file() => vec![
                vec!["update-rc.d", service, "disable"],
                vec![script.as_str(), "stop"],
            ],
            (false, true) => vec![],
        };
        for command in commands {
            let mut cmd = Command::new(command[0]);
            cmd.args(&command[1..]);
            match cmd.status() {
                Ok(status) if status.success() => {}
                Ok(status) => eprintln!("{} failed ({status})", describe(&cmd)),
                Err(err) => eprintln!("running {}: {err}", describe(&cmd)),
            }
        }
    }
}

/// Installs axe-core (pinned, [`crate::browser::AXE_VERSION`]) under the
/// build folder with the machine's npm, for the pages' accessibility audit.
fn install_axe() -> Result<()> {
    let js = crate::browser::axe_js();
    let dir = crate::browser::npm_dir();
    let wanted = crate::browser::AXE_VERSION;
    let manifest = dir.join("node_modules/axe-core/package.json");
    let installed = std::fs::read_to_string(&manifest)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["version"].as_str().map(str::to_owned));
    if js.is_file() && installed.as_deref() == Some(wanted) {
        eprintln!("axe-core {wanted} installed in {}", dir.display());
        return Ok(());
    }
    std::fs::create_dir_all(&dir)?;
    let mut npm = Command::new("npm");
    npm.args([
        "install",
        "--no-audit",
        "--no-fund",
        "--save-exact",
        "--prefix",
    ])
    .arg(&dir)
    .arg(format!("axe-core@{wanted}"));
    match npm.status() {
        Ok(status) if status.success() && js.is_file() => Ok(()),
        Ok(status) => bail!(
            "{} failed ({status}) or left no {}",
            describe(&npm),
            js.display()
        ),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            bail!(
                "npm is missing: install Node.js with npm (the pages' accessibility audit runs axe-core from the npm registry)"
            )
        }
        Err(err) => Err(err).with_context(|| format!("running {}", describe(&npm))),
    }
}

/// The packages of [`PACKAGES`] that dpkg does not list as installed.
fn missing_packages() -> Result<Vec<&'static str>> {
    let mut missing = Vec::new();
    for package in PACKAGES {
        let out = Command::new("dpkg-query")
            .args(["--show", "--showformat=${Status}", package])
            .output()
            .context("running dpkg-query (this command expects Debian)")?;
        // dpkg-query fails for a package it has never heard of.
        if !(out.status.success() && is_installed(&String::from_utf8_lossy(&out.stdout))) {
            missing.push(*package);
        }
    }
    Ok(missing)
}

/// Whether a dpkg `${Status}` says "installed".
fn is_installed(status: &str) -> bool {
    status.trim() == "install ok installed"
}

fn apt_get() -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.env("DEBIAN_FRONTEND", "noninteractive").arg("-q");
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_workspace_is_tidy() {
        tidy().unwrap();
    }

    #[test]
    fn is_installed_reads_dpkg_status() {
        assert!(is_installed("install ok installed"));
        assert!(!is_installed("deinstall ok config-files"));
        assert!(!is_installed("install ok unpacked"));
        assert!(!is_installed(""));
    }
}
