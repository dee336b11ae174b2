//! One simulated node of the storm, on a thread of its own inside the
//! nodes' namespace: what iPXE does (a DHCP exchange, `/ipxe/`, the kernel
//! and the initramfs, from the node's own address), then what `/init`
//! does, with the agent's own code: the carried lease or a second DHCP
//! (counted), the CA pin, enrollment with a key the node makes, the
//! manifest, the verified stream into a folder of its own, the identity
//! written into the root, `switch_root`'s report and `mprov-agent ready`'s.
//!
//! Only what a real node's firmware and kernel do is done here instead of
//! by them: the DHCP exchange goes over the storm's shared socket
//! ([`DhcpMux`], demultiplexed by MAC) with the agent's own state machine
//! ([`mprov_agent::dhcp::Client`]), the leased address is added to the
//! nodes' interface with the agent's own rtnetlink messages, and no
//! `switch_root` happens (the verified root is deleted instead, to bound
//! the memory a thousand roots would take).
//!
//! Every wait is bounded: the node gives up at its deadline and counts as
//! lost. Retries are jittered, as the agent's own are.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mprov_agent::cmdline::BootParams;
use mprov_agent::dhcp::{self, Action, Lease};
use mprov_agent::enroll::{self, Control, EnrollError};
use mprov_agent::events::{Reporter, StreamSteps};
use mprov_agent::image::{self, Event};
use mprov_agent::init::chain;
use mprov_api::boot::BootPhase;

/// The phases a node goes through, in order, for the report and the
/// picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Waiting for a lease (iPXE's DHCP).
    Dhcp,
    /// Asking `/ipxe/` for its script.
    Script,
    /// Downloading the kernel and the initramfs.
    Kernel,
    /// The agent: CA, enrollment, manifest.
    Enroll,
    /// The agent streaming and verifying the image.
    Image,
    /// Reported ready.
    Ready,
}

impl Phase {
    /// Every phase, in order.
    pub const ALL: [Phase; 6] = [
        Phase::Dhcp,
        Phase::Script,
        Phase::Kernel,
        Phase::Enroll,
        Phase::Image,
        Phase::Ready,
    ];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Dhcp => "dhcp",
            Phase::Script => "ipxe script",
            Phase::Kernel => "kernel+initramfs",
            Phase::Enroll => "enroll+manifest",
            Phase::Image => "image stream",
            Phase::Ready => "ready",
        }
    }
}

/// What every node shares.
#[derive(Debug)]
pub struct Shared {
    /// The DHCP socket and its demultiplexer.
    pub dhcp: DhcpMux,
    /// The nodes' interface (its index, for rtnetlink).
    pub interface: u32,
    /// The control service's HTTP URL (`/ipxe/` is there).
    pub control_url: String,
    /// Where each node's root is unpacked, in a folder of its own.
    pub staging: PathBuf,
    /// When the storm started.
    pub started: Instant,
    /// When every node gives up.
    pub deadline: Instant,
    /// Jitter's seed.
    pub random: RandomState,
    /// Nodes that hold a lease.
    pub leased: AtomicU64,
    /// Nodes enrolled (reporting their boot events from then on).
    pub enrolled: AtomicU64,
    /// Bytes the nodes downloaded as iPXE (kernel and initramfs).
    pub ipxe_bytes: AtomicU64,
    /// Whether to stop at once (the driver failed).
    pub stop: AtomicBool,
}

/// One node to boot.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Its host name.
    pub hostname: String,
    /// Its MAC.
    pub mac: [u8; 6],
}

/// What one node did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// When it entered each phase, from the storm's start.
    pub phases: Vec<(Phase, Duration)>,
    /// Its address (the last lease).
    pub address: Option<Ipv4Addr>,
    /// Every address it was handed (more than one would be a fault).
    pub addresses: Vec<Ipv4Addr>,
    /// DHCP packets it sent before its first `/ipxe/` script.
    pub dhcp_before: u64,
    /// DHCP packets it sent after (the agent's own; the goal is 0).
    pub dhcp_after: u64,
    /// Boot events the control service accepted from it, by phase.
    pub events_sent: Vec<BootPhase>,
    /// Boot events it could not report (every try failed).
    pub events_failed: usize,
    /// Its stream's events (the agent's reporter thread's).
    pub stream_events: usize,
    /// Requests that carried them (batched while a post was in flight).
    pub event_posts: usize,
    /// Attempts that failed and were retried, with why.
    pub retries: Vec<String>,
    /// Why it was lost, if it was.
    pub lost: Option<String>,
}

impl Outcome {
    /// When it reached `phase`, if it did.
    pub fn at(&self, phase: Phase) -> Option<Duration> {
        self.phases
            .iter()
            .find(|(p, _)| *p == phase)
            .map(|(_, t)| *t)
    }
}

/// The storm's one DHCP client socket (port 68 on the nodes' interface),
/// its replies handed to the node whose MAC they carry.
#[derive(Debug)]
pub struct DhcpMux {
    socket: UdpSocket,
    waiting: Mutex<HashMap<[u8; 6], mpsc::Sender<Vec<u8>>>>,
}

impl DhcpMux {
    /// Binds port 68 on `device` (in the calling thread's namespace).
    pub fn bind(device: &str) -> Result<DhcpMux> {
        use socket2::{Domain, Protocol, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        s.set_reuse_address(true)?;
        s.set_broadcast(true)?;
        s.bind_device(Some(device.as_bytes()))?;
        s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 68)).into())?;
        // Large enough for a thousand replies arriving together.
        let _ = s.set_recv_buffer_size(8 << 20);
        let socket: UdpSocket = s.into();
        socket.set_read_timeout(Some(Duration::from_millis(200)))?;
        Ok(DhcpMux {
            socket,
            waiting: Mutex::new(HashMap::new()),
        })
    }

    /// Hands each reply to its node until `stop` (run on a thread).
    pub fn serve(&self, stop: &AtomicBool) {
        let mut buf = vec![0u8; 1500];
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, _)) = self.socket.recv_from(&mut buf) else {
                continue;
            };
            // chaddr: bytes 28 to 34 of a BOOTP message.
            let Some(mac) = buf.get(28..34).and_then(|m| <[u8; 6]>::try_from(m).ok()) else {
                continue;
            };
            let waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(tx) = waiting.get(&mac) {
                let _ = tx.send(buf[..n].to_vec());
            }
        }
    }

    /// One DHCP exchange for `mac` with the agent's state machine; the lease
    /// and the packets sent. `None` when the state machine gave up.
    fn obtain(&self, mac: [u8; 6], xid: u32, until: Instant) -> Result<(Option<Lease>, u64)> {
        let (tx, rx) = mpsc::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(mac, tx);
        let result = self.exchange(mac, xid, &rx, until);
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&mac);
        result
    }

    fn exchange(
        &self,
        mac: [u8; 6],
        xid: u32,
        rx: &mpsc::Receiver<Vec<u8>>,
        until: Instant,
    ) -> Result<(Option<Lease>, u64)> {
        let (mut client, mut action) = dhcp::Client::new(mac, xid);
        let mut sent = 0;
        let mut wait_until = Instant::now();
        loop {
            match action {
                Action::Send(bytes, wait) => {
                    self.socket
                        .send_to(&bytes, (Ipv4Addr::BROADCAST, 67))
                        .context("sending a DHCP packet")?;
                    sent += 1;
                    wait_until = Instant::now() + wait;
                }
                Action::Bound(lease) => return Ok((Some(lease), sent)),
                Action::GiveUp => return Ok((None, sent)),
                Action::Wait => {}
            }
            if Instant::now() > until {
                return Ok((None, sent));
            }
            let left = wait_until.saturating_duration_since(Instant::now());
            action = match rx.recv_timeout(left) {
                Ok(bytes) => client.received(&bytes),
                Err(_) => client.timed_out(),
            };
        }
    }
}

/// A lost node's error.
struct Lost(String);

/// Boots one node to ready, or until the deadline; never panics.
pub fn boot(shared: &Shared, spec: &Spec) -> Outcome {
    let mut outcome = Outcome::default();
    if let Err(Lost(why)) = run(shared, spec, &mut outcome) {
        outcome.lost = Some(why);
    }
    outcome
}

/// What `/ipxe/` told the node to boot.
struct Script {
    kernel: String,
    initrd: String,
    cmdline: String,
}

/// A jittered wait: `base` plus up to half of it again, from the node and
/// the attempt.
fn jitter(shared: &Shared, spec: &Spec, attempt: u32, base: Duration) -> Duration {
    let r = shared.random.hash_one((&spec.hostname, attempt)) % 1000;
    base + base.mul_f64(r as f64 / 2000.0)
}

/// Sleeps `wait`, or fails once the deadline would pass.
fn pause(shared: &Shared, wait: Duration, why: &str) -> Result<(), Lost> {
    if shared.stop.load(Ordering::Relaxed) {
        return Err(Lost(format!("the storm stopped ({why})")));
    }
    if Instant::now() + wait > shared.deadline {
        return Err(Lost(format!("the deadline passed: {why}")));
    }
    std::thread::sleep(wait);
    Ok(())
}

fn enter(shared: &Shared, outcome: &mut Outcome, phase: Phase) {
    if outcome.at(phase).is_none() {
        outcome.phases.push((phase, shared.started.elapsed()));
    }
}

fn run(shared: &Shared, spec: &Spec, outcome: &mut Outcome) -> Result<(), Lost> {
    let mut attempt = 0u32;
    let mut lease: Option<Lease> = None;
    let mut session: Option<(enroll::Identity, Control, String)> = None;
    let mut carried_checked = false;
    loop {
        attempt += 1;
        // The backoff between two whole attempts, growing to 16 s.
        let backoff = |attempt: u32| {
            jitter(
                shared,
                spec,
                attempt,
                Duration::from_secs(1 << attempt.clamp(1, 4)),
            )
        };
        if session.is_none() {
            // iPXE: a lease (once), the script, the kernel and initramfs.
            let leased = match &lease {
                Some(l) => l.clone(),
                None => {
                    enter(shared, outcome, Phase::Dhcp);
                    let l = dhcp_once(shared, spec, outcome, true)?;
                    lease = Some(l.clone());
                    l
                }
            };
            enter(shared, outcome, Phase::Script);
            let script = match ipxe(shared, spec, &leased, outcome) {
                Ok(s) => s,
                Err(e) => {
                    outcome.retries.push(format!("/ipxe/ (error): {e:#}"));
                    pause(shared, backoff(attempt), "/ipxe/")?;
                    continue;
                }
            };
            enter(shared, outcome, Phase::Kernel);
            if let Err(e) = download(shared, &leased, &script.kernel)
                .and_then(|()| download(shared, &leased, &script.initrd))
            {
                // iPXE's script goes to its next source, then chains
                // `/ipxe/` again after a pause.
                // Counted by what failed: a status, or the connection.
                let text = format!("{e:#}");
                let kind = match text.rsplit_once("HTTP ") {
                    Some((_, status)) => format!("HTTP {status}"),
                    None => "no answer".to_owned(),
                };
                outcome
                    .retries
                    .push(format!("kernel/initramfs ({kind}): {text}"));
                pause(shared, backoff(attempt), "kernel/initramfs")?;
                continue;
            }
            // /init from here on, with the agent's own code.
            enter(shared, outcome, Phase::Enroll);
            let params = BootParams::parse(script.cmdline.as_bytes());
            if !carried_checked {
                carried_checked = true;
                if let Err(why) = mprov_agent::init::boot::carried(&params) {
                    // The agent would ask DHCP again: count it.
                    outcome
                        .retries
                        .push(format!("mprov_lease {why}: the agent asks DHCP"));
                    let l = dhcp_once(shared, spec, outcome, false)?;
                    lease = Some(l);
                }
            }
            match enroll_node(&params) {
                Ok(s) => {
                    shared.enrolled.fetch_add(1, Ordering::Relaxed);
                    session = Some(s);
                }
                Err(e) => {
                    outcome.retries.push(format!("enrolling: {e}"));
                    pause(shared, backoff(attempt), "enrolling")?;
                    continue;
                }
            }
            let (_, control, _) = session.as_ref().expect("just set");
            let leased = lease.as_ref().expect("leased");
            report(
                outcome,
                control,
                BootPhase::AgentDhcp,
                &format!(
                    "{}/{}, from the lease iPXE carried (no DHCP sent)",
                    leased.address, leased.prefix
                ),
            );
            report(outcome, control, BootPhase::Enrolled, "certificate issued");
        }
        let (identity, control, url) = session.as_ref().expect("enrolled");
        match stream(shared, spec, outcome, identity, control, url) {
            Ok(()) => {
                enter(shared, outcome, Phase::Ready);
                return Ok(());
            }
            Err(StreamError::Lost(lost)) => return Err(lost),
            Err(StreamError::Retry(why)) => {
                outcome.retries.push(why);
                pause(shared, backoff(attempt), "the image")?;
            }
        }
    }
}

/// A DHCP exchange until bound (the state machine's own retries, then again
/// after a pause, until the deadline); adds the address to the interface.
fn dhcp_once(
    shared: &Shared,
    spec: &Spec,
    outcome: &mut Outcome,
    before: bool,
) -> Result<Lease, Lost> {
    for round in 0u32.. {
        let xid = u32::try_from(shared.random.hash_one((&spec.hostname, "xid", round)) >> 32)
            .unwrap_or(round);
        let (lease, sent) = shared
            .dhcp
            .obtain(spec.mac, xid, shared.deadline)
            .map_err(|e| Lost(format!("DHCP: {e:#}")))?;
        if before {
            outcome.dhcp_before += sent;
        } else {
            outcome.dhcp_after += sent;
        }
        if let Some(lease) = lease {
            add_address(shared.interface, lease.address)
                .map_err(|e| Lost(format!("adding {}: {e:#}", lease.address)))?;
            if outcome.address.is_none() {
                shared.leased.fetch_add(1, Ordering::Relaxed);
            }
            outcome.address = Some(lease.address);
            if !outcome.addresses.contains(&lease.address) {
                outcome.addresses.push(lease.address);
            }
            return Ok(lease);
        }
        pause(
            shared,
            jitter(shared, spec, round, Duration::from_secs(2)),
            "DHCP",
        )?;
    }
    Err(Lost("DHCP never bound".to_owned()))
}

/// Adds `address`/32 to the interface with the agent's rtnetlink message
/// (an address already there is fine: a node leased it again).
fn add_address(interface: u32, address: Ipv4Addr) -> Result<()> {
    use mprov_agent::init::netlink::{self, Netlink};
    let mut nl = Netlink::open().context("opening rtnetlink")?;
    let seq = nl.next_seq();
    match nl.request(&netlink::add_address(interface, address, 32, seq), seq) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(nix::libc::EEXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// An HTTP client as iPXE is one: from the node's own address.
fn ipxe_client(lease: &Lease) -> Result<mprov_agent::http::Client> {
    Ok(mprov_agent::http::Client::new(
        mprov_agent::http::builder()
            .local_address(std::net::IpAddr::V4(lease.address))
            .timeout(Duration::from_secs(120)),
    )?)
}

/// `GET /ipxe/?mac=` until it is a boot script (a retry script's `sleep`
/// is waited out, as iPXE does); the script's kernel, initramfs and
/// command line, with `${net0/...}` expanded from the lease as iPXE does.
fn ipxe(shared: &Shared, spec: &Spec, lease: &Lease, outcome: &mut Outcome) -> Result<Script> {
    let client = ipxe_client(lease)?;
    let mac = mac_text(spec.mac);
    let url = format!("{}/ipxe/?mac={mac}", shared.control_url);
    for round in 0u32.. {
        let response = client.send(client.get(&url))?;
        let status = response.status().as_u16();
        let text = client.wait(response.text())?;
        if status == 200
            && let Some(script) = parse_script(&text, lease)
        {
            return Ok(script);
        }
        // A retry script: iPXE sleeps as told, then chains /ipxe/ again.
        // Counted by its status and the first words of what it says.
        let says: String = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("echo mProv: "))
            .unwrap_or_default()
            .split_whitespace()
            .take(6)
            .collect::<Vec<_>>()
            .join(" ")
            .replace(':', "");
        outcome.retries.push(format!(
            "/ipxe/ retry script, HTTP {status} ({says}): slept"
        ));
        let secs: u64 = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("sleep "))
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(5);
        if Instant::now() + Duration::from_secs(secs) > shared.deadline {
            bail!("no boot script before the deadline (HTTP {status}): {text}");
        }
        std::thread::sleep(jitter(
            shared,
            spec,
            round,
            Duration::from_secs(secs.max(1)),
        ));
    }
    bail!("unreachable")
}

/// The first source's kernel and initrd lines of a boot script.
fn parse_script(text: &str, lease: &Lease) -> Option<Script> {
    let mut kernel = None;
    let mut initrd = None;
    for line in text.lines().map(str::trim) {
        let line = line.split(" || ").next().unwrap_or(line);
        if kernel.is_none()
            && let Some(rest) = line.strip_prefix("kernel ")
        {
            let (url, args) = rest.split_once(' ').unwrap_or((rest, ""));
            kernel = Some((url.to_owned(), expand(args, lease)));
        } else if initrd.is_none()
            && let Some(url) = line.strip_prefix("initrd ")
        {
            initrd = Some(url.trim().to_owned());
        }
    }
    let (kernel, cmdline) = kernel?;
    Some(Script {
        kernel,
        initrd: initrd?,
        cmdline,
    })
}

/// iPXE's expansion of the `${net0/...}` settings the boot script uses,
/// from the lease; a setting the lease lacks expands to nothing, as in iPXE.
fn expand(args: &str, lease: &Lease) -> String {
    let mask = Ipv4Addr::from(
        u32::MAX
            .checked_shl(32 - u32::from(lease.prefix))
            .unwrap_or(0),
    );
    let settings = [
        ("net0/ip", lease.address.to_string()),
        ("net0/netmask", mask.to_string()),
        (
            "net0/gateway",
            lease.router.map(|r| r.to_string()).unwrap_or_default(),
        ),
        (
            "net0/dns",
            lease.dns.first().map(|d| d.to_string()).unwrap_or_default(),
        ),
        ("net0/dhcp-server", lease.server.to_string()),
        (
            "net0/mtu",
            lease.mtu.map(|m| m.to_string()).unwrap_or_default(),
        ),
        ("net0/domain", lease.domain.clone().unwrap_or_default()),
    ];
    let mut out = args.to_owned();
    for (name, value) in settings {
        out = out.replace(&format!("${{{name}}}"), &value);
    }
    out
}

/// Downloads `url` as iPXE does (into nothing: only its bytes count).
fn download(shared: &Shared, lease: &Lease, url: &str) -> Result<()> {
    let client = ipxe_client(lease)?;
    let mut response = client.send(client.get(url))?;
    let status = response.status().as_u16();
    if status != 200 {
        bail!("{url}: HTTP {status}");
    }
    while let Some(chunk) = client.wait(response.chunk())? {
        shared
            .ipxe_bytes
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// Step 2 of `/init`: the CA checked against `mprov_ca`, a key made here,
/// enrollment with `mprov_enroll`.
fn enroll_node(params: &BootParams) -> Result<(enroll::Identity, Control, String), String> {
    let url = params
        .url()
        .ok_or("no mprov_url= in the script")?
        .as_str()
        .to_owned();
    let pin = params.ca().ok_or("no mprov_ca= in the script")?;
    let nonce = params.enroll().ok_or("no mprov_enroll= in the script")?;
    let why = |e: EnrollError| chain(&e);
    let ca = enroll::fetch_ca(&url, pin.as_bytes()).map_err(why)?;
    let identity = enroll::enroll(&url, &ca, nonce.expose_secret()).map_err(why)?;
    let control = Control::new(&url, &identity).map_err(why)?;
    Ok((identity, control, url))
}

/// One boot event with the agent's own [`Control::report`] (which tries
/// again while the control service is restarting); counts it sent or
/// failed.
fn report(outcome: &mut Outcome, control: &Control, phase: BootPhase, detail: &str) {
    match control.report(phase, detail) {
        Ok(()) => outcome.events_sent.push(phase),
        Err(e) => {
            outcome
                .retries
                .push(format!("reporting {}: {}", phase.as_str(), chain(&e)));
            outcome.events_failed += 1;
        }
    }
}

enum StreamError {
    /// Try again after a pause.
    Retry(String),
    /// Give up.
    Lost(Lost),
}

impl From<Lost> for StreamError {
    fn from(lost: Lost) -> Self {
        StreamError::Lost(lost)
    }
}

/// Step 3 to 5 of `/init` and `mprov-agent ready`: the manifest, the
/// stream (as `/init` observes it), the identity in the new root, the
/// `switch_root` and `ready` reports; the root is deleted after.
fn stream(
    shared: &Shared,
    spec: &Spec,
    outcome: &mut Outcome,
    identity: &enroll::Identity,
    control: &Control,
    url: &str,
) -> Result<(), StreamError> {
    let retry =
        |what: &str, e: &dyn std::error::Error| StreamError::Retry(format!("{what}: {}", chain(e)));
    let manifest = control.manifest().map_err(|e| retry("the manifest", &e))?;
    enter(shared, outcome, Phase::Image);
    let staging = shared.staging.join(&spec.hostname);
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| retry("the staging folder", &e))?;
    let client =
        image::client_trusting(&identity.ca_pem).map_err(|e| retry("the image client", &e))?;
    // The agent's reports while streaming, as /init makes them: each phase
    // once, progress every tenth of the image, sent as they happen by the
    // agent's own reporter thread (batched while a post is in flight).
    let events = Reporter::start(control.clone());
    let steps = StreamSteps::default();
    let observe = |event: &Event<'_>| {
        if let Some(phase) = steps.phase(event) {
            events.report(phase, &image::describe(event));
        }
    };
    let options = mprov_unpack::UnpackOptions {
        whiteouts: false,
        preserve_owner: true,
    };
    let fetched = image::fetch(
        &client,
        &manifest.sources,
        &manifest.expected,
        &staging,
        options,
        &observe,
    );
    let tally = events.finish();
    outcome.stream_events += tally.sent.len() + tally.failed.len();
    outcome.events_sent.extend(tally.sent);
    outcome.events_failed += tally.failed.len();
    outcome.event_posts += tally.posts;
    for (phase, why) in tally.failed {
        outcome
            .retries
            .push(format!("reporting {}: {why}", phase.as_str()));
    }
    let root = match fetched {
        Ok(root) => root,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(retry("the image", &e));
        }
    };
    let done = write_and_ready(outcome, root.path(), identity, url, &manifest);
    let _ = std::fs::remove_dir_all(&staging);
    done
}

/// Step 4 (the identity into the root), step 5's report, and `mprov-agent
/// ready` reading the identity back from the root, as the booted image's
/// unit does.
fn write_and_ready(
    outcome: &mut Outcome,
    root: &Path,
    identity: &enroll::Identity,
    url: &str,
    manifest: &mprov_agent::manifest::Checked,
) -> Result<(), StreamError> {
    let retry =
        |what: &str, e: &dyn std::error::Error| StreamError::Retry(format!("{what}: {}", chain(e)));
    enroll::write_identity(root, identity, url).map_err(|e| retry("writing the identity", &e))?;
    let (_, control) = session_of(root).map_err(|e| retry("reading the identity", &*e))?;
    report(
        outcome,
        &control,
        BootPhase::SwitchRoot,
        &format!("into {}", manifest.image),
    );
    let before = outcome.events_failed;
    report(outcome, &control, BootPhase::Ready, "storm node ready");
    if outcome.events_failed > before {
        return Err(StreamError::Retry("ready was not accepted".to_owned()));
    }
    Ok(())
}

/// The identity `mprov-agent ready` reads back from a root, and its session.
fn session_of(root: &Path) -> Result<(enroll::Identity, Control), Box<dyn std::error::Error>> {
    let (identity, url) = enroll::read_identity(root)?;
    let control = Control::new(&url, &identity)?;
    Ok((identity, control))
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Runs `nodes` on threads of their own (inside the calling thread's
/// namespace: threads inherit it) and waits for them all.
pub fn boot_all(shared: &Arc<Shared>, nodes: Vec<Spec>) -> Result<Vec<(Spec, Outcome)>> {
    let mut threads = Vec::with_capacity(nodes.len());
    for spec in nodes {
        let shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("storm-{}", spec.hostname))
            .stack_size(1 << 20)
            .spawn(move || {
                let outcome = boot(&shared, &spec);
                (spec, outcome)
            })
            .context("starting a node's thread")?;
        threads.push(thread);
    }
    threads
        .into_iter()
        .map(|t| {
            t.join()
                .map_err(|_| anyhow::anyhow!("a node's thread panicked"))
        })
        .collect()
}
