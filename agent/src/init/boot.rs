//! Steps 1 to 5 of `/init`, each said on the console and, from enrollment
//! on, reported to the control service:
//!
//! 1. the interface whose MAC booted (`mprov_mac`) up over rtnetlink, and
//!    its address from the lease iPXE carried (`mprov_lease`, no DHCP
//!    sent) or, when there is no usable one, from our own DHCP client;
//! 2. the CA checked against `mprov_ca`, a key pair made here, enrollment
//!    with `mprov_enroll`; mTLS from then on;
//! 3. the boot manifest, then `rootfs.tar.zst` streamed into a tmpfs at
//!    [`STAGING`] (hashed, decompressed, unpacked in one pass);
//! 4. the node's key, certificate, host name and network configuration
//!    written into the new root (the key 0600);
//! 5. `switch_root` to the image's init.
//!
//! Any failure is a [`Fatal`] error: `/init` says it, reports it when it
//! can, and starts over (or drops to a rescue shell, `mprov_rescue=1`).

use std::ffi::CString;
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use mprov_api::boot::BootPhase;
use nix::mount::{MsFlags, mount};

use super::netlink::{self, Netlink};
use super::{network, say};
use crate::cmdline::BootParams;
use crate::dhcp::{self, Lease};
use crate::enroll::{self, Control, Identity};
use crate::events::{Reporter, StreamSteps};
use crate::image::{self, Event, VerifiedRoot};

/// Where the image is unpacked: a tmpfs of its own.
pub const STAGING: &str = "/newroot";
/// The staging tmpfs's size when the manifest sets none.
pub const DEFAULT_TMPFS_SIZE: &str = "75%";
/// The image's init, tried in order.
const INITS: [&str; 3] = [
    "/sbin/init",
    "/lib/systemd/systemd",
    "/usr/lib/systemd/systemd",
];

/// A step failed: which, and why, for a person.
#[derive(Debug)]
pub struct Fatal {
    /// The step, 1 to 5.
    pub step: u8,
    /// What went wrong and what to check.
    pub message: String,
}

impl fmt::Display for Fatal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {}: {}", self.step, self.message)
    }
}

pub(super) fn fatal(step: u8, message: impl Into<String>) -> Fatal {
    Fatal {
        step,
        message: message.into(),
    }
}

/// The node's enrollment, kept across attempts: the nonce is good for one
/// enrollment only, so a retry after a later step failed goes on with the
/// certificate it already has.
pub struct Session {
    /// The node's key and certificate.
    pub identity: Identity,
    /// Its mTLS session with the control service.
    pub control: Control,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("Session")
            .field("control", &self.control)
            .finish_non_exhaustive()
    }
}

/// Runs steps 1 to 5. Returns only on failure (a successful `switch_root`
/// execs the image's init); `session` is set once enrolled, so the caller
/// can report the failure and the next attempt skips the enrollment.
pub fn boot(params: &BootParams, session: &mut Option<Session>) -> Fatal {
    match try_boot(params, session) {
        Ok(never) => match never {},
        Err(fatal) => fatal,
    }
}

enum Never {}

/// The node's network, as step 1 left it.
#[derive(Debug)]
pub struct Network {
    /// The control service (`mprov_url`).
    pub url: String,
    /// The MAC that booted, as sysfs writes it.
    pub mac: String,
    /// The interface with that MAC.
    pub interface: String,
    /// Its lease.
    pub lease: Lease,
    /// Where the lease came from.
    pub source: Source,
}

/// Step 1: the interface whose MAC booted up, with the carried lease or
/// one from DHCP. Shared by the boot and by discovery ([`super::discover`]).
pub fn network_up(params: &BootParams) -> Result<Network, Fatal> {
    let mac = params.mac().ok_or_else(|| {
        fatal(
            1,
            "no valid mprov_mac= on the kernel command line: the boot script names the MAC that booted; is /ipxe/ of this mProv version?",
        )
    })?;
    let url = params
        .url()
        .ok_or_else(|| fatal(1, "no valid mprov_url= on the kernel command line"))?
        .as_str()
        .to_owned();
    let interfaces = network::interfaces()
        .map_err(|err| fatal(1, format!("listing network interfaces: {err}")))?;
    let mac_text = mac.to_string();
    let interface = interfaces
        .iter()
        .find(|i| i.mac == mac_text)
        .ok_or_else(|| {
            fatal(
                1,
                format!(
                    "no interface has MAC {mac_text} (the kernel has {}): is its driver in the initramfs?",
                    interfaces.len()
                ),
            )
        })?;
    say!("step 1: bringing up {interface}");
    let (lease, source) = configure(&interface.name, mac.0, params).map_err(|m| fatal(1, m))?;
    say!(
        "step 1: {} has {}/{} {source}{}",
        interface.name,
        lease.address,
        lease.prefix,
        lease
            .router
            .map(|r| format!(", gateway {r}"))
            .unwrap_or_default()
    );
    Ok(Network {
        url,
        mac: mac_text,
        interface: interface.name.clone(),
        lease,
        source,
    })
}

fn try_boot(params: &BootParams, enrolled: &mut Option<Session>) -> Result<Never, Fatal> {
    // Step 1.
    let Network {
        url,
        mac: mac_text,
        interface,
        lease,
        source: how,
    } = network_up(params)?;

    // Step 2.
    let (identity, session, fresh) = match enrolled.as_ref() {
        Some(done) => {
            say!(
                "step 2: enrolled in an earlier attempt (the nonce is spent); going on with that certificate"
            );
            (done.identity.clone(), done.control.clone(), false)
        }
        None => {
            let pin = params
                .ca()
                .ok_or_else(|| fatal(2, "no valid mprov_ca= on the kernel command line"))?;
            let nonce = params
                .enroll()
                .ok_or_else(|| fatal(2, "no valid mprov_enroll= on the kernel command line"))?;
            let ca = enroll::fetch_ca(&url, pin.as_bytes())
                .map_err(|err| fatal(2, super::chain(&err)))?;
            say!("step 2: the CA certificate at {url} matches mprov_ca");
            let identity = enroll::enroll(&url, &ca, nonce.expose_secret())
                .map_err(|err| fatal(2, super::chain(&err)))?;
            let session =
                Control::new(&url, &identity).map_err(|err| fatal(2, super::chain(&err)))?;
            say!("step 2: enrolled; mTLS from now on");
            *enrolled = Some(Session {
                identity: identity.clone(),
                control: session.clone(),
            });
            (identity, session, true)
        }
    };
    // Sent from a thread of their own, batched while a post is in flight
    // (`crate::events`): the stream never waits for them.
    let events = Reporter::start(session.clone());
    let report = |phase: BootPhase, detail: &str| events.report(phase, detail);
    report(
        BootPhase::AgentDhcp,
        &format!(
            "{} {}/{} on {}, {how}",
            mac_text, lease.address, lease.prefix, interface
        ),
    );
    if fresh {
        report(BootPhase::Enrolled, "certificate issued");
    }

    // Step 3.
    let manifest = session
        .manifest()
        .map_err(|err| fatal(3, super::chain(&err)))?;
    say!(
        "step 3: booting {} as {}: {} bytes from {} job server(s)",
        manifest.image,
        manifest.hostname,
        manifest.expected.size,
        manifest.sources.len()
    );
    let size = manifest.tmpfs_size.as_deref().unwrap_or(DEFAULT_TMPFS_SIZE);
    mount_staging(size).map_err(|m| fatal(3, m))?;
    let client =
        image::client_trusting(&identity.ca_pem).map_err(|err| fatal(3, super::chain(&err)))?;
    let steps = StreamSteps::default();
    let observe = |event: &Event<'_>| {
        let phase = steps.phase(event);
        // Progress only at each tenth, on the console as on the timeline.
        if matches!(event, Event::Progress { .. }) && phase.is_none() {
            return;
        }
        let line = image::describe(event);
        say!("step 3: {line}");
        if let Some(phase) = phase {
            report(phase, &line);
        }
    };
    let options = mprov_unpack::UnpackOptions {
        whiteouts: false,
        preserve_owner: true,
    };
    let root = image::fetch(
        &client,
        &manifest.sources,
        &manifest.expected,
        Path::new(STAGING),
        options,
        &observe,
    )
    .map_err(|err| fatal(3, super::chain(&err)))?;

    // Step 4.
    enroll::write_identity(root.path(), &identity, &url)
        .map_err(|err| fatal(4, super::chain(&err)))?;
    write_host(root.path(), &manifest.hostname, &mac_text, &lease)
        .map_err(|err| fatal(4, format!("writing the host name and network: {err}")))?;
    say!(
        "step 4: identity, host name {} and network written",
        manifest.hostname
    );

    // Step 5.
    report(BootPhase::SwitchRoot, &format!("into {}", manifest.image));
    let tally = events.finish();
    for (phase, why) in &tally.failed {
        say!("mprov-agent: reporting {}: {why}", phase.as_str());
    }
    say!(
        "step 5: {} boot events reported in {} requests",
        tally.sent.len(),
        tally.posts
    );
    say!("step 5: switch_root into {}", manifest.image);
    Err(fatal(5, switch_root(&root)))
}

/// How long a link that was just set up may take to report a carrier.
const CARRIER_WAIT: Duration = Duration::from_secs(5);

/// Waits (at most `limit`) for `name` to report a carrier in sysfs.
fn wait_carrier(name: &str, limit: Duration) -> bool {
    let path = format!("/sys/class/net/{name}/carrier");
    let deadline = Instant::now() + limit;
    loop {
        // Reading fails while the link is still down.
        if std::fs::read_to_string(&path).is_ok_and(|c| c.trim() == "1") {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Where the interface's address came from, as the console and the
/// timeline say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `mprov_lease`: the lease iPXE held; no DHCP was sent.
    Carried,
    /// Our own DHCP exchange, and why the carried lease was not used.
    Dhcp {
        /// The DHCP server that answered.
        server: std::net::Ipv4Addr,
        /// Why not the carried lease.
        why: String,
    },
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Carried => f.write_str("from the lease iPXE carried (no DHCP sent)"),
            Source::Dhcp { server, why } => {
                write!(f, "from DHCP server {server} (mprov_lease {why})")
            }
        }
    }
}

/// The lease the agent configures without DHCP, if the command line
/// carries a usable one; else why not, in words for the console.
pub fn carried(params: &BootParams) -> Result<Lease, String> {
    match params.lease() {
        Ok(c) => Ok(Lease {
            address: c.address,
            prefix: c.prefix,
            server: c.server.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
            router: c.gateway,
            dns: c.dns.into_iter().collect(),
            domain: c.domain.clone(),
            hostname: None,
            lease_time: None,
            mtu: c.mtu,
        }),
        Err(crate::cmdline::ParamError::Empty) => Err("not given".to_owned()),
        Err(err) => Err(format!("refused: {err}")),
    }
}

/// Link up, then the carried lease or DHCP, the MTU, address and route:
/// the lease and where it came from, or what went wrong.
fn configure(name: &str, mac: [u8; 6], params: &BootParams) -> Result<(Lease, Source), String> {
    let index =
        nix::net::if_::if_nametoindex(name).map_err(|err| format!("{name} has no index: {err}"))?;
    let mut nl = Netlink::open().map_err(|err| format!("opening rtnetlink: {err}"))?;
    let seq = nl.next_seq();
    nl.request(&netlink::link_up(index, None, seq), seq)
        .map_err(|err| format!("bringing {name} up: {err}"))?;
    // A DISCOVER sent before the link has come up is lost, and the next
    // waits the first retransmission timeout (a second); a carried lease
    // needs the carrier too before the first request goes out.
    if !wait_carrier(name, CARRIER_WAIT) {
        say!(
            "step 1: no carrier on {name} after {} s; going on anyway",
            CARRIER_WAIT.as_secs()
        );
    }
    let (lease, source) = match carried(params) {
        Ok(lease) => (lease, Source::Carried),
        Err(why) => {
            say!("step 1: mprov_lease {why}: asking DHCP");
            let xid = getrandom::u32().unwrap_or(0x6d70_7276);
            let lease = dhcp::obtain(name, mac, xid)
                .map_err(|err| format!("DHCP on {name}: {err}"))?
                .ok_or_else(|| {
                    format!(
                        "no DHCP answer on {name} after {} tries: is the job server's DHCP serving this network?",
                        dhcp::MAX_TRIES
                    )
                })?;
            let server = lease.server;
            (lease, Source::Dhcp { server, why })
        }
    };
    if let Some(mtu) = lease.mtu {
        let seq = nl.next_seq();
        nl.request(&netlink::link_up(index, Some(mtu), seq), seq)
            .map_err(|err| format!("setting the MTU of {name} to {mtu}: {err}"))?;
    }
    let seq = nl.next_seq();
    nl.request(
        &netlink::add_address(index, lease.address, lease.prefix, seq),
        seq,
    )
    .map_err(|err| format!("adding {}/{} to {name}: {err}", lease.address, lease.prefix))?;
    if let Some(router) = lease.router {
        let seq = nl.next_seq();
        nl.request(&netlink::add_default_route(index, router, seq), seq)
            .map_err(|err| format!("adding the default route via {router}: {err}"))?;
    }
    Ok((lease, source))
}

/// The staging tmpfs at [`STAGING`] (mounted again after a failed attempt:
/// a fresh, empty one).
fn mount_staging(size: &str) -> Result<(), String> {
    let _ = nix::mount::umount2(STAGING, nix::mount::MntFlags::MNT_DETACH);
    match std::fs::create_dir(STAGING) {
        Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(format!("making {STAGING}: {err}"));
        }
        _ => {}
    }
    let data = format!("mode=0755,size={size}");
    mount(
        Some("tmpfs"),
        STAGING,
        Some("tmpfs"),
        MsFlags::empty(),
        Some(data.as_str()),
    )
    .map_err(|err| format!("mounting a tmpfs of {size} at {STAGING}: {err}"))
}

/// `/etc/hostname`, and a systemd-networkd file that keeps the boot
/// interface's address (matched by MAC).
fn write_host(root: &Path, hostname: &str, mac: &str, lease: &Lease) -> std::io::Result<()> {
    std::fs::create_dir_all(root.join("etc/systemd/network"))?;
    std::fs::write(root.join("etc/hostname"), format!("{hostname}\n"))?;
    let mut network = format!(
        "# Written by mprov-agent at boot: the address the node booted with.\n\
         [Match]\nMACAddress={mac}\n\n[Network]\nAddress={}/{}\n",
        lease.address, lease.prefix
    );
    if let Some(router) = lease.router {
        network.push_str(&format!("Gateway={router}\n"));
    }
    for dns in &lease.dns {
        network.push_str(&format!("DNS={dns}\n"));
    }
    if let Some(domain) = &lease.domain {
        network.push_str(&format!("Domains={domain}\n"));
    }
    std::fs::write(
        root.join("etc/systemd/network/10-mprov-boot.network"),
        network,
    )
}

/// Moves the pseudo filesystems into the verified root, makes it `/` and
/// execs its init. Returns only on failure, with why.
fn switch_root(root: &VerifiedRoot) -> String {
    let new = root.path();
    for fs in ["/dev", "/proc", "/sys", "/run"] {
        let target = new.join(fs.trim_start_matches('/'));
        let _ = std::fs::create_dir_all(&target);
        if let Err(err) = mount(
            Some(fs),
            &target,
            None::<&str>,
            MsFlags::MS_MOVE,
            None::<&str>,
        ) {
            say!("mprov-agent: moving {fs} into the new root: {err}");
        }
    }
    if let Err(err) = std::env::set_current_dir(new) {
        return format!("entering {}: {err}", new.display());
    }
    if let Err(err) = mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>) {
        return format!("moving {} to /: {err}", new.display());
    }
    if let Err(err) = nix::unistd::chroot(".") {
        return format!("chroot into the new root: {err}");
    }
    let _ = std::env::set_current_dir("/");
    let mut tried = Vec::new();
    for init in INITS {
        let Ok(path) = CString::new(init) else {
            continue;
        };
        // execv returns only on failure.
        let Err(err) = nix::unistd::execv(&path, std::slice::from_ref(&path));
        tried.push(format!("{init}: {err}"));
    }
    format!("the image has no init to run ({})", tried.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_carried_lease_becomes_the_interfaces_or_says_why_not() {
        let params = BootParams::parse(
            b"mprov_lease=10.99.0.41,255.255.255.0,10.99.0.1,10.99.0.2,10.99.0.2,,lab",
        );
        let lease = carried(&params).expect("carried");
        assert_eq!(lease.address, std::net::Ipv4Addr::new(10, 99, 0, 41));
        assert_eq!(lease.prefix, 24);
        assert_eq!(lease.router, Some(std::net::Ipv4Addr::new(10, 99, 0, 1)));
        assert_eq!(lease.dns, [std::net::Ipv4Addr::new(10, 99, 0, 2)]);
        assert_eq!(lease.server, std::net::Ipv4Addr::new(10, 99, 0, 2));
        assert_eq!((lease.mtu, lease.domain.as_deref()), (None, Some("lab")));
        assert_eq!(
            carried(&BootParams::parse(b"console=ttyS0")).unwrap_err(),
            "not given"
        );
        assert_eq!(
            carried(&BootParams::parse(b"mprov_lease=10.0.0.5,255.255.255.0")).unwrap_err(),
            "refused: not a usable lease (not seven comma-separated fields); the agent asks DHCP instead"
        );
        assert_eq!(
            Source::Carried.to_string(),
            "from the lease iPXE carried (no DHCP sent)"
        );
    }
}
