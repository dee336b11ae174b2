//! Network namespaces for lab tests: a private network per test, joined by
//! veth pairs, where real clients (udhcpc, dhclient, tftp, dig) talk to our
//! servers without touching the host's network.
//!
//! Everything goes through `ip` (iproute2), so no unsafe code is needed here.
//! Names are unique per process and per call (`<prefix>-<pid>-<n>`), so tests
//! run in parallel; a namespace is deleted on `Drop`, which also destroys the
//! veth ends inside it. Addresses are only ever added inside namespaces this
//! module created. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN).

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique suffix: process id and a per-process counter.
fn unique() -> String {
    format!(
        "{:x}{:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs a command and fails with its stderr if it fails.
fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// A network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates a namespace named `<prefix>-<unique>` with loopback up.
    pub fn new(prefix: &str) -> Result<Self> {
        let name = format!("{prefix}-{}", unique());
        run(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file to `setns(2)` into.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Runs `ip -n <ns> <args>`.
    pub fn ip(&self, args: &[&str]) -> Result<Output> {
        run(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// A command that runs `program` inside the namespace (`ip netns exec`,
    /// which execs the program in place, so the child's PID is the program's).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `program args` inside the namespace to completion; fails if it fails.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<Output> {
        run(self.command(program).args(args))
    }

    /// Adds bridge `dev`, without STP and with no forward delay, so its ports
    /// forward at once.
    pub fn add_bridge(&self, dev: &str) -> Result<()> {
        self.ip(&[
            "link",
            "add",
            dev,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ])
        .map(drop)
    }

    /// Adds `cidr` (e.g. `10.1.0.1/24`) to `dev`.
    pub fn add_addr(&self, dev: &str, cidr: &str) -> Result<()> {
        self.ip(&["addr", "add", cidr, "dev", dev]).map(drop)
    }

    /// Sets `dev`'s MAC address.
    pub fn set_mac(&self, dev: &str, mac: &str) -> Result<()> {
        self.ip(&["link", "set", "dev", dev, "address", mac])
            .map(drop)
    }

    /// Brings `dev` up.
    pub fn up(&self, dev: &str) -> Result<()> {
        self.ip(&["link", "set", "dev", dev, "up"]).map(drop)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(err) = run(Command::new("ip").args(["netns", "del", &self.name])) {
            eprintln!("cleaning up netns {}: {err:#}", self.name);
        }
    }
}

/// The two ends of a veth pair, each inside its namespace (interface names
/// are at most 15 bytes, so they are short and unique).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Veth {
    /// The end in the first namespace.
    pub a: String,
    /// The end in the second namespace.
    pub b: String,
}

/// Joins `a` and `b` with a veth pair, both ends up. The pair goes when
/// either namespace is deleted.
pub fn veth(a: &Netns, b: &Netns) -> Result<Veth> {
    let id = unique();
    let v = Veth {
        a: format!("va{id}").chars().take(15).collect(),
        b: format!("vb{id}").chars().take(15).collect(),
    };
    run(Command::new("ip").args([
        "link",
        "add",
        &v.a,
        "netns",
        a.name(),
        "type",
        "veth",
        "peer",
        "name",
        &v.b,
        "netns",
        b.name(),
    ]))?;
    a.up(&v.a)?;
    b.up(&v.b)?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_private_and_cleaned_up() -> Result<()> {
        let (path, name) = {
            let a = Netns::new("nstest")?;
            let b = Netns::new("nstest")?;
            assert_ne!(a.name(), b.name());
            let v = veth(&a, &b)?;
            a.add_addr(&v.a, "10.250.0.1/30")?;
            b.add_addr(&v.b, "10.250.0.2/30")?;
            b.exec("busybox", &["ping", "-c", "1", "-W", "5", "10.250.0.1"])?;
            (a.path(), a.name().to_owned())
        };
        assert!(!path.exists(), "{name} was not deleted");
        Ok(())
    }
}
