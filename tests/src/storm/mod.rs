//! The boot storm (`cargo xtask storm --nodes N`): N simulated nodes power
//! on at once against one job server and the control service, all real
//! processes in the lab, and every node runs the agent's own code
//! ([`node`]).
//!
//! The network: the lab namespace ([`LabNet`]) holds the servers; a second
//! namespace holds the nodes, joined to the lab bridge by one veth pair
//! shaped with `tc` (HTB, [`StormOptions::rate_mbit`] both ways), so the
//! bandwidth bound of a run is known: the bytes that crossed the link over
//! its rate. The nodes' network ([`STORM_SUBNET`]/[`STORM_PREFIX`], room
//! for 4,000 nodes) is routed over a /30 between the two ends ([`LINK_LAB`],
//! [`LINK_NODES`]), so each side keeps one neighbour entry whatever the
//! number of nodes; DHCP still crosses the bridge as broadcasts, and each
//! node's HTTP requests to `/ipxe/` and the job server come from its own
//! leased address (added to the nodes' end as a /32), which is what
//! `/ipxe/`'s attestation checks.
//!
//! The servers: `mprov-control serve` and `mprov-jobserver` following it
//! (enrolled with a one-time token, its DHCP serving the lab bridge), N
//! systems with reserved addresses bulk-created through the API, and a
//! small image ([`lab::busybox_image`], or the lab's Debian one) hosted by
//! the job server and published. The job server runs its default stream
//! threshold (64 MiB): the kernel and the initramfs, which iPXE fetches and
//! does not retry on a 503, stay out of its admission control, as does the
//! small image's 2 MB root; the Debian image's root is under it. (A
//! threshold of 1 MiB, used before, put the 8 MB kernel and the initramfs
//! under it too: 4,251 of them were refused with 503 in one 1,000-node
//! run, each refused node backing off up to 16 s.)
//!
//! The figures ([`Report`]): nodes ready and lost; p50/p95/p99
//! time-to-ready from the control service's boot timeline (its time
//! stamps are to the second), from the storm's start; the run against the
//! bandwidth bound; the servers' CPU per node (`/proc/<pid>/stat`, the
//! control service with its signing helper); the boot events stored per
//! second and any the nodes were told were stored but the timeline lacks;
//! the agent-side DHCP packets after the `/ipxe/` script (goal 0: the
//! agent takes the lease iPXE carried). A picture of nodes per phase over
//! time is written as SVG ([`plot`]).
//!
//! Faults ([`Fault`]): the job server killed with SIGKILL mid-storm and
//! started again on the same state, or the control service stopped and
//! started again; the report then also checks that no address was handed
//! to two nodes and that every node kept the one address it was leased.
//!
//! Bounded: every node gives up at the storm's deadline; traffic stays
//! inside the two namespaces, which go when the run ends.

pub mod node;
pub mod plot;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, ensure};
use mprov_api::boot::{BootEvent, BootPhase, EVENTS_PATH};
use serde_json::json;

use crate::lab::{
    self, Binaries, BootConfigSource, JobServer, JobServerSpec, LabControl, LabNet, SERVER_IP,
};
use crate::netboot::Stack;
use crate::netns::{Netns, Veth};

pub use node::Phase;

/// The nodes' network.
pub const STORM_SUBNET: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 0);
/// Its prefix length: 4,094 addresses.
pub const STORM_PREFIX: u8 = 20;
/// The job server's address on it.
pub const JOBSERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 1);
/// The lab's end of the shaped link.
pub const LINK_LAB: Ipv4Addr = Ipv4Addr::new(10, 101, 0, 1);
/// The nodes' end of the shaped link.
pub const LINK_NODES: Ipv4Addr = Ipv4Addr::new(10, 101, 0, 2);
/// The most nodes a storm takes (the addresses of [`STORM_SUBNET`] past
/// the first 16, without those ending in .0 or .255).
pub const MAX_NODES: usize = 3_800;

/// Which image the nodes boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageChoice {
    /// The busybox smoke root: a few MB.
    Small,
    /// The lab's Debian root (mmdebstrap; built once and cached).
    Debian,
}

/// A fault injected mid-storm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The job server killed with SIGKILL, then started again.
    KillJobServer,
    /// The control service stopped, then started again.
    RestartControl,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct StormOptions {
    /// Nodes powered on at once.
    pub nodes: usize,
    /// The link's rate, Mbit/s.
    pub rate_mbit: u64,
    /// The image.
    pub image: ImageChoice,
    /// Where the summary and the picture go.
    pub out: PathBuf,
    /// Release builds of the servers (the full run); debug otherwise.
    pub release: bool,
    /// A fault to inject: the job server's once a third of the nodes
    /// hold a lease, the control service's once a third are enrolled.
    pub fault: Option<Fault>,
    /// How long nodes may take before they count as lost.
    pub limit: Duration,
}

impl StormOptions {
    /// The CI smoke: `nodes` nodes, debug builds, 1 Gbit/s, the small image.
    pub fn smoke(nodes: usize, out: &Path) -> StormOptions {
        StormOptions {
            nodes,
            rate_mbit: 1000,
            image: ImageChoice::Small,
            out: out.to_owned(),
            release: false,
            fault: None,
            limit: Duration::from_secs(600),
        }
    }
}

/// A storm's figures.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Nodes powered on.
    pub nodes: usize,
    /// Nodes that reported ready (and whose timeline holds it).
    pub ready: usize,
    /// Nodes lost, with why.
    pub lost: Vec<(String, String)>,
    /// Time-to-ready percentiles from the timeline: p50, p95, p99.
    pub p50: Duration,
    /// p95.
    pub p95: Duration,
    /// p99.
    pub p99: Duration,
    /// From the first DHCP packet to the last node ready.
    pub run: Duration,
    /// Bytes that crossed the link towards the nodes, and from them.
    pub bytes_down: u64,
    /// From the nodes.
    pub bytes_up: u64,
    /// The bound: the larger direction's bytes over the rate.
    pub bound: Duration,
    /// The link's rate, Mbit/s.
    pub rate_mbit: u64,
    /// CPU of the control service (with its signer) per node.
    pub control_cpu_per_node: Duration,
    /// CPU of the job server per node.
    pub jobserver_cpu_per_node: Duration,
    /// Boot events stored during the run.
    pub events_stored: usize,
    /// Per second of the run.
    pub events_per_sec: f64,
    /// Node events accepted (2xx) but missing from the timeline.
    pub events_missing: usize,
    /// Node events that failed every try.
    pub events_failed: usize,
    /// The agents' stream events, and the requests that carried them.
    pub stream_events: (usize, usize),
    /// Nodes whose timeline lacks a job server event of theirs (the lease
    /// report, the kernel or initramfs download).
    pub jobserver_events_missing: usize,
    /// Agent-side DHCP packets after the `/ipxe/` script (goal 0).
    pub dhcp_after_ipxe: u64,
    /// DHCP packets before it (iPXE's).
    pub dhcp_before_ipxe: u64,
    /// Addresses handed to more than one node.
    pub duplicate_addresses: Vec<Ipv4Addr>,
    /// Nodes handed more than one address.
    pub moved_nodes: Vec<String>,
    /// Ready nodes whose lease the job server's lease log (replayed as
    /// its next start would) does not hold, bound to their MAC.
    pub leases_missing: Vec<String>,
    /// Retries the nodes made, by kind (the first words of why).
    pub retries: BTreeMap<String, usize>,
    /// The fault injected, and when.
    pub fault: Option<(Fault, Duration)>,
    /// The picture.
    pub picture: Option<PathBuf>,
}

impl Report {
    /// The summary, as printed and saved.
    pub fn summary(&self) -> String {
        let ms = |d: Duration| format!("{:.1} s", d.as_secs_f64());
        let ratio = if self.bound.is_zero() {
            0.0
        } else {
            self.run.as_secs_f64() / self.bound.as_secs_f64()
        };
        let mut s = String::new();
        s.push_str(&format!(
            "storm: {} nodes, {} ready, {} lost\n",
            self.nodes,
            self.ready,
            self.lost.len()
        ));
        s.push_str(&format!(
            "time-to-ready (boot timeline, 1 s resolution, from power-on): p50 {}, p95 {}, p99 {}\n",
            ms(self.p50),
            ms(self.p95),
            ms(self.p99)
        ));
        s.push_str(&format!(
            "run: {} (first DHCP packet to last ready); bandwidth bound {} ({:.1} MB down, {:.1} MB up at {} Mbit/s): {:.2}x the bound\n",
            ms(self.run),
            ms(self.bound),
            self.bytes_down as f64 / 1e6,
            self.bytes_up as f64 / 1e6,
            self.rate_mbit,
            ratio
        ));
        s.push_str(&format!(
            "CPU per node: control service {:.1} ms, job server {:.1} ms\n",
            self.control_cpu_per_node.as_secs_f64() * 1e3,
            self.jobserver_cpu_per_node.as_secs_f64() * 1e3
        ));
        s.push_str(&format!(
            "boot events: {} stored, {:.1}/s over the run; {} accepted but missing, {} failed every try, {} nodes missing a job server event\n",
            self.events_stored,
            self.events_per_sec,
            self.events_missing,
            self.events_failed,
            self.jobserver_events_missing
        ));
        s.push_str(&format!(
            "the agents' stream events: {} in {} requests (batched while a post is in flight)\n",
            self.stream_events.0, self.stream_events.1
        ));
        s.push_str(&format!(
            "DHCP packets: {} before the /ipxe/ script (iPXE's), {} after (the agent's; goal 0)\n",
            self.dhcp_before_ipxe, self.dhcp_after_ipxe
        ));
        s.push_str(&format!(
            "addresses: {} handed to two nodes, {} nodes handed two addresses, {} leases missing from the job server's lease log\n",
            self.duplicate_addresses.len(),
            self.moved_nodes.len(),
            self.leases_missing.len()
        ));
        if let Some((fault, at)) = self.fault {
            s.push_str(&format!("fault: {fault:?} at {}\n", ms(at)));
        }
        if !self.retries.is_empty() {
            let r: Vec<String> = self
                .retries
                .iter()
                .map(|(k, n)| format!("{n}x {k}"))
                .collect();
            s.push_str(&format!("retries: {}\n", r.join("; ")));
        }
        for (host, why) in self.lost.iter().take(10) {
            s.push_str(&format!("lost {host}: {why}\n"));
        }
        if let Some(p) = &self.picture {
            s.push_str(&format!("picture: {}\n", p.display()));
        }
        s
    }

    /// Whether nothing was lost: every node ready, no event missing, no
    /// address handed out twice or changed.
    pub fn clean(&self) -> bool {
        self.lost.is_empty()
            && self.ready == self.nodes
            && self.events_missing == 0
            && self.events_failed == 0
            && self.jobserver_events_missing == 0
            && self.duplicate_addresses.is_empty()
            && self.moved_nodes.is_empty()
            && self.leases_missing.is_empty()
    }
}

/// The `n`-th node's address: past the first 16 of the network, skipping
/// those ending in .0 or .255.
fn node_ip(n: usize) -> Ipv4Addr {
    let base = u32::from(STORM_SUBNET) + 16;
    let ip = (base..)
        .filter(|a| !matches!(a & 0xff, 0 | 255))
        .nth(n)
        .unwrap_or(base);
    Ipv4Addr::from(ip)
}

/// The `n`-th node's MAC.
fn node_mac(n: usize) -> [u8; 6] {
    let n = u32::try_from(n).unwrap_or(0);
    [0x02, 0x5e, 0x00, (n >> 16) as u8, (n >> 8) as u8, n as u8]
}

/// The lab of a storm: the servers, the nodes' namespace and the link.
struct StormLab {
    stack: Stack,
    nodes: Netns,
    link: Veth,
    jobserver_spec: JobServerSpec,
    bins: Binaries,
}

/// Runs a storm; the report (also written to `<out>/storm.txt`).
pub fn run(options: &StormOptions) -> Result<Report> {
    ensure!(
        (1..=MAX_NODES).contains(&options.nodes),
        "--nodes must be 1 to {MAX_NODES}"
    );
    fs::create_dir_all(&options.out)?;
    let bins = Binaries::in_dir(crate::control::build(
        &[
            "mprov-control",
            "mprov-boot",
            "mprov-image",
            "mprov-initramfs",
        ],
        !options.release,
    )?);
    let agent = crate::agent::build_static()?;
    let work = tempfile::Builder::new()
        .prefix("mprov-storm-")
        .tempdir_in(crate::xtask::target_dir())?;
    // The service becomes the `mprov` user when started as root.
    fs::set_permissions(
        work.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    eprintln!("storm: building the image");
    let image = match options.image {
        ImageChoice::Small => lab::busybox_image(&bins, &agent.path, &work.path().join("images"))?,
        ImageChoice::Debian => lab::debian_image(&bins, &agent.path)?,
    };
    eprintln!("storm: starting the servers");
    let mut lab = start_lab(&bins, &image, work.path(), options)?;
    let result = storm(&mut lab, options);
    if result.is_err() {
        eprintln!(
            "storm: control log:\n{}\njob server log:\n{}",
            crate::netboot::tail(&lab.stack.control.log(), 30),
            crate::netboot::tail(
                &lab.stack
                    .jobservers
                    .first()
                    .map(JobServer::log)
                    .unwrap_or_default(),
                30
            )
        );
    }
    let report = result?;
    let summary = report.summary();
    fs::write(options.out.join("storm.txt"), &summary)?;
    println!("{summary}");
    Ok(report)
}

/// The servers, the network, the systems and the image.
fn start_lab(
    bins: &Binaries,
    image: &lab::Image,
    work: &Path,
    options: &StormOptions,
) -> Result<StormLab> {
    let net = LabNet::new("storm")?;
    // The job server's address on the bridge, alone (/32): the nodes'
    // network is routed over the link (see the module docs).
    net.ns
        .add_addr("br0", &format!("{JOBSERVER_IP}/32"))
        .context("the job server's address")?;
    net.ns.add_addr("br0", &format!("{LINK_LAB}/30"))?;
    let nodes = Netns::new("stormn")?;
    let link = crate::netns::veth(&net.ns, &nodes)?;
    net.ns.ip(&["link", "set", &link.a, "master", "br0"])?;
    nodes.add_addr(&link.b, &format!("{LINK_NODES}/30"))?;
    net.ns.ip(&[
        "route",
        "add",
        &format!("{STORM_SUBNET}/{STORM_PREFIX}"),
        "via",
        &LINK_NODES.to_string(),
    ])?;
    nodes.ip(&["route", "add", "default", "via", &LINK_LAB.to_string()])?;
    // The shaped link, both ways.
    for (ns, dev) in [(&net.ns, &link.a), (&nodes, &link.b)] {
        shape(ns, dev, options.rate_mbit)?;
    }

    let control = LabControl::start(&net, bins, &work.join("control"), None)?;
    control
        .api(
            "POST",
            "/api/v1/networks/",
            Some(&json!({
                "slug": "storm", "name": "the storm's nodes", "subnet": STORM_SUBNET.to_string(),
                "netmask": STORM_PREFIX, "domain": "storm",
                "dhcp_start": "10.100.15.200", "dhcp_end": "10.100.15.250",
                "isdhcp": true, "isbootable": true
            })),
        )
        .context("registering the storm network")?;
    control
        .api(
            "POST",
            "/api/v1/jobservers/",
            Some(&json!({
                "name": "js1", "addresses": [JOBSERVER_IP.to_string()],
                "port": mprov_api::boot::DEFAULT_HTTP_PORT, "network": "storm"
            })),
        )
        .context("registering the job server")?;
    let export = work.join("export-js1");
    fs::create_dir_all(&export)?;
    let token = control.enroll_token(bins, "js1")?;
    let jobserver_spec = JobServerSpec {
        config: BootConfigSource::Control {
            url: control.https_url(),
            ca: control.ca(),
            token,
            name: "js1".to_owned(),
            heartbeat: true,
        },
        ip: JOBSERVER_IP.to_string(),
        dhcp: true,
        bridge: "br0",
        // The default stream threshold: the kernel and the initramfs
        // (iPXE's) stay out of admission control.
        args: Vec::new(),
        export: export.clone(),
        home: work.join("jobserver-js1"),
        metrics_port: 9102,
        file_limit: None,
    };
    let jobserver = JobServer::start(&net, bins, &jobserver_spec)?;
    let stack = Stack::assemble(
        net,
        control,
        vec![("js1".to_owned(), export, jobserver)],
        image,
        work,
    );
    stack.host_image(image, false)?;
    // The systems, in bulk.
    let rows: Vec<serde_json::Value> = (0..options.nodes)
        .map(|i| {
            json!({
                "hostname": hostname(i), "image": image.slug, "netboot": true,
                "nics": [{"name": "eth0", "mac": node::mac_text(node_mac(i)),
                          "ipv4": node_ip(i).to_string(), "bootable": true, "network": "storm"}]
            })
        })
        .collect();
    for chunk in rows.chunks(200) {
        stack
            .control
            .api(
                "POST",
                "/api/v1/systems/bulk",
                Some(&serde_json::Value::Array(chunk.to_vec())),
            )
            .context("creating the systems")?;
    }
    Ok(StormLab {
        stack,
        nodes,
        link,
        jobserver_spec,
        bins: bins.clone(),
    })
}

/// The `i`-th node's host name.
fn hostname(i: usize) -> String {
    format!("s{i:04}")
}

/// Shapes `dev`'s egress to `mbit` Mbit/s with HTB.
fn shape(ns: &Netns, dev: &str, mbit: u64) -> Result<()> {
    let rate = format!("{mbit}mbit");
    ns.exec(
        "tc",
        &[
            "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1",
        ],
    )
    .context("tc qdisc add (install iproute2)")?;
    ns.exec(
        "tc",
        &[
            "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", &rate,
            "ceil", &rate,
        ],
    )?;
    Ok(())
}

/// `dev`'s transmitted bytes, from `ip -s -j link`.
fn tx_bytes(ns: &Netns, dev: &str) -> Result<u64> {
    let out = ns.ip(&["-s", "-j", "link", "show", "dev", dev])?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    v[0]["stats64"]["tx"]["bytes"]
        .as_u64()
        .with_context(|| format!("no tx bytes for {dev}"))
}

/// The CPU time of a process and its children.
fn cpu(pid: Option<u32>) -> Duration {
    let Some(pid) = pid else {
        return Duration::ZERO;
    };
    let mut total = crate::control::cpu_time(pid).unwrap_or_default();
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let children = fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|p| p.parse().ok()) {
                total += crate::control::cpu_time(child).unwrap_or_default();
            }
        }
    }
    total
}

/// The storm itself: the nodes on threads inside their namespace, the
/// fault if asked, then the figures.
fn storm(lab: &mut StormLab, options: &StormOptions) -> Result<Report> {
    let staging = PathBuf::from("/dev/shm").join(format!("mprov-storm-{}", std::process::id()));
    fs::create_dir_all(&staging)?;
    let ns_file = fs::File::open(lab.nodes.path())?;
    let device = lab.link.b.clone();
    let started = Instant::now();
    let wall = SystemTime::now();
    let shared = Arc::new(node::Shared {
        dhcp: bind_dhcp(&ns_file, &device)?,
        interface: interface_index(&ns_file, &device)?,
        control_url: format!("http://{SERVER_IP}:{}", lab::CONTROL_PORT),
        staging: staging.clone(),
        started,
        deadline: started + options.limit,
        random: Default::default(),
        ipxe_bytes: AtomicU64::new(0),
        leased: AtomicU64::new(0),
        enrolled: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let down0 = tx_bytes(&lab.stack.net.ns, &lab.link.a)?;
    let up0 = tx_bytes(&lab.nodes, &lab.link.b)?;
    let control_cpu0 = cpu(lab.stack.control.pid());
    let js_pid = lab.stack.jobservers.first().map(|j| j.pid);
    let js_cpu0 = cpu(js_pid);

    let serving = Arc::new(AtomicBool::new(false));
    let dhcp_thread = {
        let (shared, stop) = (shared.clone(), serving.clone());
        std::thread::spawn(move || shared.dhcp.serve(&stop))
    };
    let specs: Vec<node::Spec> = (0..options.nodes)
        .map(|i| node::Spec {
            hostname: hostname(i),
            mac: node_mac(i),
        })
        .collect();
    let driver = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("storm-nodes".to_owned())
            .spawn(move || -> Result<Vec<(node::Spec, node::Outcome)>> {
                nix::sched::setns(&ns_file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .context("setns")?;
                node::boot_all(&shared, specs)
            })?
    };
    eprintln!("storm: {} nodes powered on", options.nodes);
    // The fault (see `StormOptions::fault` for when).
    let mut fault = None;
    // CPU of servers that were replaced, counted before they went.
    let mut lost_cpu = (Duration::ZERO, Duration::ZERO);
    if let Some(kind) = options.fault {
        let until = started + options.limit;
        // The job server while leases are being handed out; the control
        // service while nodes enroll and report their boot events.
        let counter = match kind {
            Fault::KillJobServer => &shared.leased,
            Fault::RestartControl => &shared.enrolled,
        };
        while (counter.load(Ordering::Relaxed) as usize) * 3 < options.nodes
            && Instant::now() < until
            && !driver.is_finished()
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        let at = started.elapsed();
        eprintln!("storm: injecting {kind:?} at {at:.1?}");
        match kind {
            Fault::KillJobServer => {
                let js = &mut lab.stack.jobservers[0];
                lost_cpu.1 = cpu(Some(js.pid)).saturating_sub(js_cpu0);
                js.kill()?;
                std::thread::sleep(Duration::from_secs(2));
                *js = JobServer::start(&lab.stack.net, &lab.bins, &lab.jobserver_spec)?;
            }
            Fault::RestartControl => {
                lost_cpu.0 = cpu(lab.stack.control.pid()).saturating_sub(control_cpu0);
                lab.stack.control.restart(&lab.stack.net, &lab.bins, None)?;
            }
        }
        fault = Some((kind, at));
    }
    let outcomes = driver
        .join()
        .map_err(|_| anyhow::anyhow!("the storm's driver panicked"))??;
    let run = started.elapsed();
    serving.store(true, Ordering::Relaxed);
    let _ = dhcp_thread.join();
    let _ = fs::remove_dir_all(&staging);

    let restarted = fault.map(|(kind, _)| kind);
    let control_cpu = if restarted == Some(Fault::RestartControl) {
        lost_cpu.0 + cpu(lab.stack.control.pid())
    } else {
        cpu(lab.stack.control.pid()).saturating_sub(control_cpu0)
    };
    let js_cpu = if restarted == Some(Fault::KillJobServer) {
        lost_cpu.1 + cpu(lab.stack.jobservers.first().map(|j| j.pid))
    } else {
        cpu(js_pid).saturating_sub(js_cpu0)
    };
    let down = tx_bytes(&lab.stack.net.ns, &lab.link.a)? - down0;
    let up = tx_bytes(&lab.nodes, &lab.link.b)? - up0;

    let leases = lease_log(&lab.jobserver_spec.home.join("state").join("dhcp.leases"))?;
    figures(
        &lab.stack.control,
        options,
        &outcomes,
        &leases,
        Figures {
            wall,
            run,
            down,
            up,
            control_cpu,
            js_cpu,
            fault,
        },
    )
}

/// Measurements of the run that are not per node.
struct Figures {
    wall: SystemTime,
    run: Duration,
    down: u64,
    up: u64,
    control_cpu: Duration,
    js_cpu: Duration,
    fault: Option<(Fault, Duration)>,
}

/// Binds the storm's DHCP socket inside the nodes' namespace.
fn bind_dhcp(ns: &fs::File, device: &str) -> Result<node::DhcpMux> {
    let ns = ns.try_clone()?;
    let device = device.to_owned();
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
        node::DhcpMux::bind(&device)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the DHCP bind thread panicked"))?
}

/// `device`'s index inside the nodes' namespace.
fn interface_index(ns: &fs::File, device: &str) -> Result<u32> {
    let ns = ns.try_clone()?;
    let device = device.to_owned();
    std::thread::spawn(move || -> Result<u32> {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
        Ok(nix::net::if_::if_nametoindex(device.as_str())?)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the index thread panicked"))?
}

/// The figures from the nodes' outcomes and the control service's
/// timeline.
fn figures(
    control: &LabControl,
    options: &StormOptions,
    outcomes: &[(node::Spec, node::Outcome)],
    leases: &HashMap<[u8; 6], Ipv4Addr>,
    m: Figures,
) -> Result<Report> {
    let n = u32::try_from(options.nodes.max(1)).unwrap_or(u32::MAX);
    let t0 = m
        .wall
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut report = Report {
        nodes: options.nodes,
        rate_mbit: options.rate_mbit,
        bytes_down: m.down,
        bytes_up: m.up,
        control_cpu_per_node: m.control_cpu / n,
        jobserver_cpu_per_node: m.js_cpu / n,
        fault: m.fault,
        ..Report::default()
    };
    let bits = m.down.max(m.up) as f64 * 8.0;
    report.bound =
        Duration::try_from_secs_f64(bits / (options.rate_mbit as f64 * 1e6)).unwrap_or_default();
    let mut ready_times = Vec::new();
    let mut last_ready = Duration::ZERO;
    let mut owners: HashMap<Ipv4Addr, Vec<String>> = HashMap::new();
    let mut first_at = u64::MAX;
    let mut last_at = 0u64;
    for (spec, outcome) in outcomes {
        report.dhcp_before_ipxe += outcome.dhcp_before;
        report.dhcp_after_ipxe += outcome.dhcp_after;
        report.events_failed += outcome.events_failed;
        report.stream_events.0 += outcome.stream_events;
        report.stream_events.1 += outcome.event_posts;
        for r in &outcome.retries {
            let kind: String = r.split(':').next().unwrap_or(r).to_owned();
            *report.retries.entry(kind).or_default() += 1;
        }
        for a in &outcome.addresses {
            owners.entry(*a).or_default().push(spec.hostname.clone());
        }
        if outcome.addresses.len() > 1 {
            report.moved_nodes.push(spec.hostname.clone());
        }
        if outcome.lost.is_none() && leases.get(&spec.mac) != outcome.address.as_ref() {
            report.leases_missing.push(spec.hostname.clone());
        }
        let timeline = timeline(control, &spec.hostname)
            .with_context(|| format!("the timeline of {}", spec.hostname))?;
        report.events_stored += timeline.len();
        for e in &timeline {
            if let Some(at) = seconds(&e.at) {
                first_at = first_at.min(at);
                last_at = last_at.max(at);
            }
        }
        // Each event the node was told was stored is in the timeline.
        let mut sent: HashMap<BootPhase, usize> = HashMap::new();
        for p in &outcome.events_sent {
            *sent.entry(*p).or_default() += 1;
        }
        for (phase, count) in &sent {
            let have = timeline.iter().filter(|e| e.phase == *phase).count();
            if have < *count {
                report.events_missing += count - have;
            }
        }
        let has = |phase| timeline.iter().any(|e: &BootEvent| e.phase == phase);
        if outcome.lost.is_none()
            && !(has(BootPhase::DhcpAcked)
                && has(BootPhase::KernelFetched)
                && has(BootPhase::InitramfsFetched))
        {
            report.jobserver_events_missing += 1;
        }
        match (
            &outcome.lost,
            timeline.iter().rfind(|e| e.phase == BootPhase::Ready),
        ) {
            (None, Some(ready)) => {
                report.ready += 1;
                if let Some(at) = seconds(&ready.at) {
                    ready_times.push(Duration::from_secs(at.saturating_sub(t0)));
                }
                last_ready = last_ready.max(outcome.at(Phase::Ready).unwrap_or_default());
            }
            (Some(why), _) => report.lost.push((spec.hostname.clone(), why.clone())),
            (None, None) => report.lost.push((
                spec.hostname.clone(),
                "ready accepted, but not in the timeline".to_owned(),
            )),
        }
    }
    for (ip, hosts) in owners {
        if hosts.len() > 1 {
            report.duplicate_addresses.push(ip);
        }
    }
    ready_times.sort();
    let pick = |q: f64| {
        if ready_times.is_empty() {
            return Duration::ZERO;
        }
        ready_times[((ready_times.len() as f64 - 1.0) * q).round() as usize]
    };
    report.p50 = pick(0.50);
    report.p95 = pick(0.95);
    report.p99 = pick(0.99);
    let first_dhcp = outcomes
        .iter()
        .filter_map(|(_, o)| o.at(Phase::Dhcp))
        .min()
        .unwrap_or_default();
    report.run = last_ready
        .saturating_sub(first_dhcp)
        .max(if report.ready == 0 {
            m.run
        } else {
            Duration::ZERO
        });
    let span = last_at.saturating_sub(first_at).max(1);
    report.events_per_sec = report.events_stored as f64 / span as f64;
    let picture = options.out.join("storm.svg");
    plot::phases(&picture, outcomes, m.run, options.nodes)?;
    report.picture = Some(picture);
    Ok(report)
}

/// The bound leases of a job server's lease log, replayed in order as
/// its next start replays them: MAC to address.
fn lease_log(path: &Path) -> Result<HashMap<[u8; 6], Ipv4Addr>> {
    use mprov_dhcp::store::{LeaseKind, LeaseRecord, RECORD_LEN};
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut bound = HashMap::new();
    for chunk in bytes.chunks_exact(RECORD_LEN) {
        // A torn or corrupt record ends the log, as on replay.
        let Some(record) = LeaseRecord::decode(chunk) else {
            break;
        };
        match record.kind {
            LeaseKind::Bound => {
                bound.insert(record.mac, record.ip);
            }
            LeaseKind::Free => {
                bound.remove(&record.mac);
            }
        }
    }
    Ok(bound)
}

/// Unix seconds of an RFC 3339 time stamp.
fn seconds(at: &str) -> Option<u64> {
    let ts: jiff::Timestamp = at.parse().ok()?;
    u64::try_from(ts.as_second()).ok()
}

/// One node's whole timeline (every boot), as the API serves it.
fn timeline(control: &LabControl, host: &str) -> Result<Vec<BootEvent>> {
    let reply = control.api(
        "GET",
        &format!("{EVENTS_PATH}?system={host}&boot=all"),
        None,
    )?;
    let items = reply.get("items").cloned().unwrap_or(reply);
    serde_json::from_value(items).context("reading the boot timeline")
}

/// A link rate as `tc` writes it (`1gbit`, `500mbit`) or a plain number
/// of Mbit/s; in Mbit/s.
pub fn parse_rate(text: &str) -> Result<u64> {
    let t = text.trim().to_ascii_lowercase();
    let (number, scale) = if let Some(n) = t.strip_suffix("gbit") {
        (n, 1000)
    } else if let Some(n) = t.strip_suffix("mbit") {
        (n, 1)
    } else {
        (t.as_str(), 1)
    };
    let n: u64 = number
        .trim()
        .parse()
        .with_context(|| format!("{text:?} is not a rate like 1gbit or 500mbit"))?;
    ensure!(n > 0, "the rate must be above 0");
    Ok(n * scale)
}

/// `cargo xtask bench storm [--smoke]`: the smoke is 30 nodes on debug
/// builds; the full run is [`StormOptions`]' 1,000 nodes on release builds.
pub fn bench(smoke: bool) -> Result<()> {
    let out = crate::xtask::target_dir().join("storm");
    let options = if smoke {
        StormOptions::smoke(30, &out)
    } else {
        StormOptions {
            nodes: 1_000,
            release: true,
            limit: Duration::from_secs(3_600),
            ..StormOptions::smoke(1_000, &out)
        }
    };
    let report = run(&options)?;
    ensure!(
        report.clean(),
        "the storm lost something:\n{}",
        report.summary()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_tc_writes_them() {
        assert_eq!(parse_rate("1gbit").unwrap(), 1000);
        assert_eq!(parse_rate("250mbit").unwrap(), 250);
        assert_eq!(parse_rate("100").unwrap(), 100);
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
    }

    #[test]
    fn node_addresses_are_distinct_usable_and_inside_the_network() {
        let mut seen = std::collections::HashSet::new();
        for n in 0..MAX_NODES {
            let ip = node_ip(n);
            let bits = u32::from(ip);
            assert!(!matches!(bits & 0xff, 0 | 255), "{ip}");
            assert_eq!(
                bits >> (32 - STORM_PREFIX),
                u32::from(STORM_SUBNET) >> (32 - STORM_PREFIX),
                "{ip}"
            );
            assert!(
                ip > JOBSERVER_IP && ip < Ipv4Addr::new(10, 100, 15, 200),
                "{ip}"
            );
            assert!(seen.insert(ip));
        }
    }
}
