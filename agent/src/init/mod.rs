//! PID 1: the agent as the initramfs's `/init`.
//!
//! The steps so far, each reported on the console (`console=ttyS0` puts it on
//! the serial port; the initramfs holds `/dev/console`, so our stdout is there
//! before anything is mounted):
//!
//! 1. the banner, `mprov-agent <version> starting`;
//! 2. [`mounts`]: proc, sysfs, devtmpfs, tmpfs on `/run` and `/tmp`;
//! 3. the kernel command line, the nonce redacted ([`crate::cmdline`]);
//! 4. [`modules`]: the NIC modules listed in `/etc/mprov/modules`, in order;
//! 5. [`network`]: the interfaces the kernel now has, with MAC and driver;
//! 6. the `mprov_*` parameters;
//! 7. with `mprov_discover` on the command line, [`discover`]: report what
//!    LLDP says of this unknown node, then reboot; else
//! 8. [`boot`]: network, enrollment, the image, the new root, `switch_root`;
//!    a fatal error is printed, reported, and the boot retried with a
//!    growing wait (or, with `mprov_rescue=1`, a rescue shell first).
//!
//! Invariant: PID 1 never exits and never panics on purpose. An exit or a
//! panic of PID 1 is a kernel panic, which says nothing useful and, without
//! `panic=`, hangs the node. So every failure is printed and the agent goes on
//! or retries; a panic hook (which runs even with `panic = "abort"`) prints
//! the panic and powers off too; if powering off fails, PID 1 sleeps forever.

pub mod boot;
pub mod discover;
pub mod modules;
pub mod mounts;
pub mod netlink;
pub mod network;

use std::fmt;
use std::io::Write;
use std::time::Duration;

use nix::sys::reboot::{RebootMode, reboot};

use crate::cmdline::{self, BootParams};

/// Where the kernel command line is read from.
const PROC_CMDLINE: &str = "/proc/cmdline";

/// Prints one line on the console. Write errors are ignored: with no console
/// there is no one to tell, and PID 1 must not stop for it.
pub(crate) fn say_line(line: fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    // Seconds since the kernel started, as the kernel stamps its own lines:
    // how long each step took reads off the console.
    if let Ok(t) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        let _ = write!(out, "[{:5}.{:03}] ", t.tv_sec(), t.tv_nsec() / 1_000_000);
    }
    let _ = out.write_fmt(line);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// `say!("...", args)`: [`say_line`] with `format!` syntax.
macro_rules! say {
    ($($arg:tt)*) => { $crate::init::say_line(format_args!($($arg)*)) };
}
pub(crate) use say;

pub use mprov_process::chain;

/// Runs the `/init` steps ([`boot`]), retrying after a fatal error. Never
/// returns: on success it is the image's init.
pub fn run() -> ! {
    std::panic::set_hook(Box::new(|info| {
        say!("mprov-agent: BUG: {info}");
        power_off()
    }));
    say!("mprov-agent {} starting", crate::VERSION);

    for (mount, result) in mounts::mount_all() {
        if let Err(err) = result {
            say!("mprov-agent: mounting {mount}: {}", chain(&err));
        }
    }

    let line = match std::fs::read(PROC_CMDLINE) {
        Ok(line) => line,
        Err(err) => {
            say!("mprov-agent: reading {PROC_CMDLINE}: {err}");
            Vec::new()
        }
    };
    say!("kernel command line: {}", cmdline::redacted(&line));

    let loaded = modules::load_listed(modules::MODULE_LIST);
    say!("modules: {}", modules::summary(&loaded));

    match network::interfaces() {
        Ok(interfaces) if interfaces.is_empty() => say!("network interfaces: none"),
        Ok(interfaces) => {
            say!("network interfaces: {}", interfaces.len());
            for interface in interfaces {
                say!("  {interface}");
            }
        }
        Err(err) => say!("mprov-agent: listing network interfaces: {err}"),
    }

    let params = BootParams::parse(&line);
    say!("parameters:");
    for param in params.report() {
        say!("  {param}");
    }

    match crate::nads::discovery_nonce(&line) {
        Some(Ok(nonce)) => discover::run(&params, nonce),
        Some(Err(err)) => say!(
            "mprov-agent: {}: refused: {err}; booting normally",
            mprov_api::nads::NONCE_PARAM
        ),
        None => {}
    }

    let mut session: Option<boot::Session> = None;
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let fatal = boot::boot(&params, &mut session);
        say!("mprov-agent: FATAL: {fatal}");
        if let Some(session) = &session
            && let Err(err) = session
                .control
                .report(mprov_api::boot::BootPhase::Failed, &fatal.to_string())
        {
            say!("mprov-agent: reporting the failure: {}", chain(&err));
        }
        if params.rescue() {
            rescue_shell();
        }
        let wait = Duration::from_secs(10u64.saturating_mul(1 << attempt.min(3)).min(60));
        say!(
            "mprov-agent: retrying in {} s (attempt {}); mprov_rescue=1 on the kernel command line drops to a shell instead",
            wait.as_secs(),
            attempt + 1
        );
        std::thread::sleep(wait);
    }
}

/// `mprov_rescue=1`: a shell on the console, if the initramfs has one;
/// when it exits, the agent retries.
fn rescue_shell() {
    const SHELL: &str = "/bin/sh";
    if !std::path::Path::new(SHELL).exists() {
        say!(
            "mprov-agent: rescue: no {SHELL} in this initramfs (add busybox as {SHELL}); retrying instead"
        );
        return;
    }
    say!("mprov-agent: rescue: starting {SHELL}; exit it to retry the boot");
    match std::process::Command::new(SHELL).status() {
        Ok(status) => say!("mprov-agent: rescue shell ended ({status})"),
        Err(err) => say!("mprov-agent: rescue: starting {SHELL}: {err}"),
    }
}

/// Syncs and powers off; if that fails, says so and sleeps forever (PID 1
/// must not exit).
pub fn power_off() -> ! {
    nix::unistd::sync();
    let Err(err) = reboot(RebootMode::RB_POWER_OFF);
    say!("mprov-agent: powering off: {err}; halting here");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
