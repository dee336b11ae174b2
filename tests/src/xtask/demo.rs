//! `cargo xtask demo`: the whole product on one machine. It installs what is
//! missing, builds, makes a real Debian image (mmdebstrap, systemd, the
//! Debian kernel) with `mprov-image build`, starts the control service and a
//! job server on a lab bridge inside a network namespace, registers a node
//! through the API, netboots a QEMU VM (TCG) to "ready" printing its boot
//! timeline as it happens, and then leaves the stack up until Ctrl-C, saying
//! how to reach the API, mash and the admin password file.
//!
//! `--check` is the short form CI runs: the same, ending by itself once the
//! node is ready (or failing, saying where the chain stopped).

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mprov_api::boot::{BootEvent, BootPhase};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use super::{cargo, run, step};
use crate::lab::{self, Binaries, SERVER_IP};
use crate::netboot::{Machine, Stack, StackOptions};

/// The demo node: host name, MAC, reserved address.
const NODE: (&str, &str, &str) = ("n01", "52:54:00:4d:50:01", "10.99.0.21");

/// Options of `cargo xtask demo`.
#[derive(Debug, Clone, Default)]
pub struct DemoOptions {
    /// Stop once the node is ready, and succeed; fail if it does not get there.
    pub check: bool,
}

/// Where the demo keeps the stack's folders. The control service drops to
/// its own user, which must reach its database: a clone under a folder only
/// root may enter (root's home) cannot hold it, so the stack lives in
/// `/var/lib/mprov-demo/lab`, made afresh for each run.
fn demo_dir() -> PathBuf {
    PathBuf::from("/var/lib/mprov-demo")
}

/// Runs the demo; see the module docs.
pub fn demo(options: &DemoOptions) -> Result<()> {
    ensure_root()?;
    // Catch Ctrl-C before anything starts, so every process we start is
    // stopped by our destructors rather than left behind.
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("catching signals")?;

    step("install: Debian packages and rustup components");
    super::test::install().context("install")?;

    step("build: mprov-control, mprov-jobserver, mprov-image, mash and the static agent");
    run(cargo().args([
        "build",
        "--quiet",
        "-p",
        "mprov-control",
        "-p",
        "mash",
        "-p",
        "mprov-boot",
        "-p",
        "mprov-image",
        "-p",
        "mprov-initramfs",
    ]))?;
    let bins = Binaries::debug();
    let agent = crate::agent::build_static()?;
    eprintln!(
        "static agent: {} ({} bytes)",
        agent.path.display(),
        agent.size
    );

    step("image: a Debian root (mmdebstrap: systemd, the Debian kernel) through mprov-image build");
    let image = lab::debian_image(&bins, &agent.path)?;
    eprintln!(
        "image {} version {}: {} (kernel {})",
        image.slug,
        image.version,
        image.dir.display(),
        image.kernel_release
    );

    let home = demo_dir().join("lab");
    if home.exists() {
        fs::remove_dir_all(&home)
            .with_context(|| format!("removing the last demo's {}", home.display()))?;
    }
    fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
    for dir in [demo_dir(), home.clone()] {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    }

    step("lab: the control service and a job server on a bridge in a network namespace");
    let stack = Stack::start(&bins, &image, &home, &StackOptions::default())?;
    eprintln!(
        "namespace {}: control service http://{SERVER_IP}:{} (HTTPS :{}), job server {SERVER_IP} (DHCP, TFTP, HTTP :{})",
        stack.net.name(),
        lab::CONTROL_PORT,
        lab::CONTROL_HTTPS_PORT,
        mprov_api::boot::DEFAULT_HTTP_PORT
    );

    step("register: a node through the API");
    let (hostname, mac, ip) = NODE;
    let node = stack.register(hostname, mac, ip, true)?;
    eprintln!(
        "node {hostname}: MAC {mac}, address {ip}, image {}",
        image.slug
    );

    step("netboot: a QEMU VM (SeaBIOS + iPXE, TCG) to ready; its timeline as it happens");
    let booted = stack
        .boot(&node, Machine::BiosIpxe, print_event)
        .context("the node did not reach ready")?;
    // The console shows multi-user; the node's own report may trail it.
    let mut shown = stack.timeline(&node)?.len();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let events = stack.timeline(&node)?;
        events.iter().skip(shown).for_each(print_event);
        shown = shown.max(events.len());
        if events.iter().any(|e| e.phase == BootPhase::Ready) {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the console shows multi-user, but the node reported no ready within 2 minutes:\n{}",
                stack.where_it_stopped(&node)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "{hostname} is ready, {:.0?} after power-on",
        booted.ready_after
    );

    let ns = stack.net.name().to_owned();
    let password_file = stack.control.home.join("etc/superuser_password");
    let mash = bins.get("mash")?;
    println!("\nThe stack is up. From this machine (as root):");
    println!(
        "  API:   ip netns exec {ns} {}",
        api_example(
            &format!("http://{SERVER_IP}:{}", lab::CONTROL_PORT),
            &password_file
        )
    );
    println!(
        "  mash:  ip netns exec {ns} env MPROV_URL=http://{SERVER_IP}:{} MPROV_USER=admin MPROV_PASSWORD=\"$(cat {})\" {} boot status {hostname}",
        lab::CONTROL_PORT,
        password_file.display(),
        mash.display()
    );
    println!("  admin password file: {}", password_file.display());
    println!("  node console: {}", booted.vm.serial_path().display());
    println!("  logs: {}", home.display());

    if options.check {
        step("stop: --check passed");
        return Ok(());
    }
    eprintln!("running; Ctrl-C stops it");
    if let Some(signal) = signals.forever().next() {
        let name = if signal == SIGINT {
            "SIGINT"
        } else {
            "SIGTERM"
        };
        eprintln!("{name}: stopping the VM, the job server and the control service");
    }
    drop(booted);
    drop(stack);
    Ok(())
}

/// The API example the demo prints, a shell line: curl listing the
/// systems of the control service at `base` (`http://host:port`) as the
/// admin, the password read from `password_file`, with the API version
/// header every authenticated request needs.
pub(crate) fn api_example(base: &str, password_file: &Path) -> String {
    format!(
        "curl -sS -H '{}' -u admin:\"$(cat {})\" {base}{}/systems/",
        mprov_api::version_header_line(),
        password_file.display(),
        mprov_api::API_PREFIX
    )
}

/// One line of the node's timeline, as the demo prints it.
fn print_event(event: &BootEvent) {
    println!(
        "  {:<27} {:<18} {:<16} {}",
        event.at,
        event.phase.as_str(),
        event.source,
        event.detail
    );
}

/// The lab needs root: namespaces, taps, DHCP on port 67.
fn ensure_root() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "cargo xtask demo needs root (network namespaces, tap devices, DHCP on a lab bridge): run it as root"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::api_example;
    use crate::control::{Control, SUPERUSER_PASSWORD};

    /// The API line the demo prints, run by a shell as a user would paste
    /// it, against a real control service: 200 and a JSON list.
    #[test]
    fn the_demos_api_example_answers() -> anyhow::Result<()> {
        let bin = crate::xtask::target_dir().join("debug");
        anyhow::ensure!(
            bin.join("mprov-control").is_file(),
            "{} is missing: cargo build -p mprov-control",
            bin.join("mprov-control").display()
        );
        let home = tempfile::tempdir()?;
        let control = Control::start(&bin, &home.path().join("control"), None)?;
        let password_file = home.path().join("superuser_password");
        std::fs::write(&password_file, format!("{SUPERUSER_PASSWORD}\n"))?;
        let line = api_example(&control.http, &password_file);
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("{line} -w '\\n%{{http_code}}'"))
            .stdin(Stdio::null())
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{line}: {text}");
        let (body, code) = text.rsplit_once('\n').expect("the status line");
        assert_eq!(code, "200", "{line}: {body}");
        let json: serde_json::Value = serde_json::from_str(body)?;
        assert!(json.is_array() || json.is_object(), "{body}");
        control.stop()
    }
}
