//! Network namespaces for lab tests: a private network per test, joined by
//! veth pairs, where real clients (udhcpc, dhclient, tftp, dig) talk to our
//! servers without touching the host's network. The DHCP tests of
//! `mprov-dhcp` and of the job server share what they do there: a UDP socket
//! bound inside ([`Netns::bind_udp`]), ISC dhclient run to a lease
//! ([`Netns::dhclient`]), a client's hook script ([`write_script`]) and what
//! it saw ([`parse_env`]).
//!
//! Namespaces, links and addresses go through `ip` (iproute2), and a socket
//! is bound inside through `setns` on a thread of its own, so no unsafe code
//! is needed here.
//! Names are unique per process and per call (`<prefix>-<pid>-<n>`), so tests
//! run in parallel; a namespace is deleted on `Drop`, which also destroys the
//! veth ends inside it. Addresses are only ever added inside namespaces this
//! module created. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::KillOnDrop;

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

    /// Makes `bridge` forward LLDP (bit 14 of `group_fwd_mask`: the
    /// nearest-bridge group address 01-80-C2-00-00-0E, which an 802.1D
    /// bridge otherwise never forwards).
    pub fn forward_lldp(&self, bridge: &str) -> Result<()> {
        self.ip(&[
            "link",
            "set",
            bridge,
            "type",
            "bridge",
            "group_fwd_mask",
            "0x4000",
        ])
        .map(drop)
    }

    /// A UDP socket inside the namespace, bound to `addr` on `dev`: a helper
    /// thread enters the namespace (`setns` changes only the calling thread)
    /// and creates the socket, which stays in that namespace wherever it is
    /// used afterwards. Broadcast is allowed, and broadcast replies leave
    /// through `dev` without a route. The socket blocks, as a std socket
    /// does: set it non-blocking before handing it to tokio.
    pub fn bind_udp(&self, addr: SocketAddr, dev: &str) -> Result<UdpSocket> {
        use socket2::{Domain, Protocol, Socket, Type};
        let path = self.path();
        let dev = dev.to_owned();
        std::thread::spawn(move || -> Result<UdpSocket> {
            let file = std::fs::File::open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
            let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
            s.set_reuse_address(true)?;
            s.set_broadcast(true)?;
            s.bind_device(Some(dev.as_bytes()))?;
            s.bind(&addr.into())?;
            Ok(s.into())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("bind thread panicked"))?
    }

    /// Runs ISC dhclient on `dev` (its script, lease and PID files in `dir`)
    /// until its script sees BOUND, bounded by `limit`, then kills it (by
    /// its PID); the variables the script saw.
    pub fn dhclient(
        &self,
        dev: &str,
        dir: &Path,
        limit: Duration,
    ) -> Result<HashMap<String, String>> {
        let script = dir.join("dhclient.sh");
        let env_out = dir.join("dhclient.env");
        write_script(
            &script,
            &format!(
                "#!/bin/sh\n[ \"$reason\" = BOUND ] && env > {0}.tmp && mv {0}.tmp {0}\nexit 0\n",
                env_out.display()
            ),
        )?;
        let child = KillOnDrop(
            self.command("dhclient")
                .args(["-1", "-d", "-4", "-sf"])
                .arg(&script)
                .arg("-lf")
                .arg(dir.join("dhclient.leases"))
                .arg("-pf")
                .arg(dir.join("dhclient.pid"))
                .arg(dev)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting dhclient")?,
        );
        let deadline = Instant::now() + limit;
        // Bounded polling for the script's output file.
        while !env_out.exists() {
            if Instant::now() > deadline {
                bail!("dhclient got no lease in time");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(child);
        Ok(parse_env(&std::fs::read_to_string(&env_out)?))
    }
}

/// Writes `text` to `path` as an executable script (mode 0755): a DHCP
/// client's hook.
pub fn write_script(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The `NAME=value` lines of `env`'s output (a DHCP client's hook ran it),
/// as a map.
pub fn parse_env(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
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
