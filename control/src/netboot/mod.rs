//! What `GET /ipxe/` answers, decided by a pure function like
//! `mprov_dhcp::handle`: the booting node's typed view goes in
//! ([`view::NodeView`], loaded by [`view::load`] with a fixed number of
//! statements), a [`Decision`] comes out, and [`render`] turns it into the
//! script. The HTTP handler (`http::ipxe`) loads the view, mints the nonce
//! when the decision asks for one and records the boot event; nothing here
//! but [`view::load`] does I/O.
//!
//! **Bootability** is one rule, [`bootable`], which `/ipxe/` and the boot
//! manifest both apply: the node has an image whose recorded rootfs checksum
//! parses as a SHA-256, whose rootfs size is above zero, and whose current
//! version at least one job server hosts at a **fresh** address on the
//! node's network (any network when the node's NIC names none). A node that
//! fails it gets a retry script saying why, and no nonce: enrolling would
//! only spend the nonce and stop at the manifest.
//!
//! **Freshness** ([`offer`]): a job server that registered its addresses is
//! reached at the first of them on the node's network whose own heartbeat
//! is at most `stale_after` old (`MPROV_JOBSERVER_STALE_SECONDS`); an
//! address that never heartbeated is not fresh. A job server that never
//! registered (a row made by hand) is reached at its row's first address on
//! its row's network, as before registration existed, unless its row's
//! heartbeat is older than `stale_after` (a row that never heartbeated
//! stays eligible: nothing says it is gone). When every job server that
//! would serve the node is silent, the retry says so
//! ([`NotBootable::Silent`]).
//!
//! The rules of the decision:
//! - A request is **attested** when a job server on the node's network has
//!   just reported leasing the request's source address to the MAC it names
//!   (the `dhcp_acked` event, or `proxy_answered` in proxyDHCP mode; a job
//!   server reports leases only inside its own network). The node's network
//!   is its switch port's, else its NIC's; a NIC naming none is checked by
//!   its reserved address (the job server's network must hold it), and a
//!   node with neither gets a retry script asking to set the NIC's network
//!   ([`placement`], [`crate::boot::attests`]). Without a report, every MAC,
//!   known or not, gets the same retry script: the answer tells nothing
//!   about the inventory and hands out no nonce.
//! - An attested unknown MAC gets the discovery script; a node set not to
//!   netboot gets local boot; a node whose image is not bootable, or whose
//!   boot line cannot go into a script (a kernel argument, a job server's
//!   address, the service's own URL or missing CA certificate), gets a
//!   retry script saying so. Every refusal is a retry script, never an
//!   error.
//! - Otherwise the node boots its image's kernel and agent initramfs from the
//!   least loaded eligible job server, the others following in the script as
//!   fallbacks, with the effective kernel arguments and the `mprov_*`
//!   arguments the agent reads.

pub mod view;

use mprov_api::boot::{ImageFile, image_file_url, jobserver_base_url};

use std::time::Duration;

pub use view::{ImageView, JobServer, Lookup, NodeKey, NodeView, ServedAddress, ViewError};

use crate::db::crud::Sha256;

/// How long a node waits before chaining to `/ipxe/` again.
pub const RETRY_SECS: u32 = 10;

/// Why a node's image cannot boot now (see [`bootable`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotBootable {
    /// The image's current version is on no job server of the node's
    /// network (with an address).
    #[error("image {image} version {version} is on no job server of this node's network yet")]
    NoJobServer {
        /// The image's slug.
        image: String,
        /// Its current version.
        version: i64,
    },
    /// Job servers of the node's network host the version, but none has
    /// sent a heartbeat there within the staleness limit.
    #[error(
        "image {image} version {version}: every job server of this node's network that hosts it is silent (no heartbeat within {stale_secs} s: {jobservers}); retrying until one is back"
    )]
    Silent {
        /// The image's slug.
        image: String,
        /// Its current version.
        version: i64,
        /// The silent job servers, by name, comma-separated.
        jobservers: String,
        /// The staleness limit, in seconds.
        stale_secs: u64,
    },
    /// The node has no image.
    #[error("{host} has no image: set one in the inventory")]
    NoImage {
        /// The node's host name.
        host: String,
    },
    /// No rootfs checksum is recorded for the current version.
    #[error(
        "image {image} version {version} has no recorded rootfs checksum yet (set rootfs_sha256 and rootfs_size from its manifest.json)"
    )]
    NoChecksum {
        /// The image's slug.
        image: String,
        /// Its current version.
        version: i64,
    },
    /// The recorded rootfs checksum is not a SHA-256.
    #[error(
        "image {image} version {version}: its recorded rootfs checksum {recorded:?} is not a SHA-256 (set rootfs_sha256 from its manifest.json)"
    )]
    NotSha256 {
        /// The image's slug.
        image: String,
        /// Its current version.
        version: i64,
        /// What is recorded.
        recorded: String,
    },
    /// The recorded rootfs size is zero.
    #[error(
        "image {image} version {version} has a rootfs size of 0 (set rootfs_size from its manifest.json)"
    )]
    ZeroSize {
        /// The image's slug.
        image: String,
        /// Its current version.
        version: i64,
    },
}

impl NotBootable {
    /// The inventory field to fix, if one field is at fault.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            NotBootable::NoJobServer { .. } | NotBootable::Silent { .. } => None,
            NotBootable::NoImage { .. } => Some("image"),
            NotBootable::NoChecksum { .. } | NotBootable::NotSha256 { .. } => Some("rootfs_sha256"),
            NotBootable::ZeroSize { .. } => Some("rootfs_size"),
        }
    }
}

/// A bootable node's image: what the agent checks the stream against, and
/// where it is, best job server first.
#[derive(Debug, Clone, PartialEq)]
pub struct Bootable<'a> {
    /// The image.
    pub image: &'a ImageView,
    /// Its rootfs checksum.
    pub sha256: Sha256,
    /// Its rootfs size in bytes, above zero.
    pub size: u64,
    /// Where to fetch it, best first ([`choose_jobservers`]).
    pub jobservers: Vec<Source<'a>>,
}

/// One job server's address a node fetches its image from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Source<'a> {
    /// The job server's name.
    pub name: &'a str,
    /// The address on the node's network.
    pub address: &'a str,
    /// Its image server's port, if its row names one.
    pub port: Option<u16>,
    /// The load its last heartbeat there carried.
    pub load_avg: f64,
}

/// What a job server hosting the image offers a node ([`offer`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Offer<'a> {
    /// An address on the node's network, heard from recently enough.
    Fresh(Source<'a>),
    /// Addresses on the node's network, none heard from recently enough.
    Silent,
    /// No address on the node's network.
    Elsewhere,
}

/// The network of a node that boots from a NIC: its switch port's
/// network (`port`), else the one the NIC names (`nic`); `None`: neither
/// names one, and the node may be served on any network. Pure.
pub fn node_network(port: Option<i64>, nic: Option<i64>) -> Option<i64> {
    port.or(nic)
}

/// Whether `j` serves nodes on `network` (`None`: any network) at all,
/// fresh or not: a registered address of `j` on it, or for a job server
/// that registered none, its row's address on its row's network. The rule
/// behind [`offer`]'s [`Offer::Elsewhere`], and behind where a new image
/// version is copied ([`crate::jobs`]). Pure.
pub fn serves_network(j: &JobServer, network: Option<i64>) -> bool {
    let on_network = |n: Option<i64>| network.is_none() || n == network;
    if j.addresses.is_empty() {
        j.address.is_some() && on_network(j.network)
    } else {
        j.addresses.iter().any(|a| on_network(a.network))
    }
}

/// What `j` offers a node on `network` (`None`: the NIC names none, so any
/// network), with heartbeats older than `stale_after` counting as silence
/// (see the module docs). Pure.
pub fn offer(j: &JobServer, network: Option<i64>, stale_after: Duration) -> Offer<'_> {
    let on_network = |n: Option<i64>| network.is_none() || n == network;
    let fresh = |age: Option<Duration>| age.is_some_and(|a| a <= stale_after);
    if !serves_network(j, network) {
        return Offer::Elsewhere;
    }
    if j.addresses.is_empty() {
        let Some(address) = j.address.as_deref() else {
            return Offer::Elsewhere;
        };
        if j.heartbeat_age.is_some() && !fresh(j.heartbeat_age) {
            return Offer::Silent;
        }
        return Offer::Fresh(Source {
            name: &j.name,
            address,
            port: j.port,
            load_avg: j.load_avg,
        });
    }
    let mut here = j.addresses.iter().filter(|a| on_network(a.network));
    match here.find(|a| fresh(a.heartbeat_age)) {
        Some(a) => Offer::Fresh(Source {
            name: &j.name,
            address: &a.address,
            port: j.port,
            load_avg: a.load_avg,
        }),
        None => Offer::Silent,
    }
}

/// The bootability rule (see the module docs), the one `/ipxe/` and the boot
/// manifest share; heartbeats older than `stale_after` count as silence.
pub fn bootable(node: &NodeView, stale_after: Duration) -> Result<Bootable<'_>, NotBootable> {
    let Some(image) = &node.image else {
        return Err(NotBootable::NoImage {
            host: node.hostname.clone(),
        });
    };
    let (slug, version) = (image.slug.clone(), image.version);
    let sha256 = match &image.rootfs_sha256 {
        Ok(sha) => *sha,
        Err(recorded) if recorded.is_empty() => {
            return Err(NotBootable::NoChecksum {
                image: slug,
                version,
            });
        }
        Err(recorded) => {
            return Err(NotBootable::NotSha256 {
                image: slug,
                version,
                recorded: recorded.clone(),
            });
        }
    };
    if image.rootfs_size == 0 {
        return Err(NotBootable::ZeroSize {
            image: slug,
            version,
        });
    }
    let (jobservers, silent) = choose_jobservers(node, stale_after);
    if jobservers.is_empty() && !silent.is_empty() {
        return Err(NotBootable::Silent {
            image: slug,
            version,
            jobservers: silent.join(", "),
            stale_secs: stale_after.as_secs(),
        });
    }
    if jobservers.is_empty() {
        return Err(NotBootable::NoJobServer {
            image: slug,
            version,
        });
    }
    Ok(Bootable {
        image,
        sha256,
        size: image.rootfs_size,
        jobservers,
    })
}

/// What is fixed for the whole service.
#[derive(Debug, Clone, Copy)]
pub struct Settings<'a> {
    /// The boot config's chain URL (with its `${net0/mac}`).
    pub chain_url: &'a str,
    /// The control service's URL for the agent (`mprov_url`).
    pub control_url: &'a str,
    /// The CA certificate's sha256 (`mprov_ca`).
    pub ca_fingerprint: &'a str,
    /// How old a job server's heartbeat may be before nodes are no longer
    /// sent there (`MPROV_JOBSERVER_STALE_SECONDS`).
    pub stale_after: Duration,
    /// The boot script carries iPXE's lease to the agent
    /// (`MPROV_IPXE_CARRY_LEASE`, [`mprov_ipxe::LEASE_ARG`]).
    pub carry_lease: bool,
}

/// What the node gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Ask again later: the message goes on the node's console.
    Retry(String),
    /// Too many requests: 429 with a retry script.
    Throttled,
    /// The discovery script: no discovery image is configured, so it only
    /// says to add the node.
    Discovery,
    /// Boot the discovery image's kernel and agent initramfs; a discovery
    /// nonce is minted for the MAC and appended.
    DiscoveryBoot(Plan),
    /// Boot the next device.
    LocalBoot,
    /// Boot the image; a nonce is minted for `system_id` and appended.
    Boot(Plan),
}

/// A boot, before its nonce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The system's id (the nonce's owner).
    pub system_id: i64,
    /// Its host name.
    pub hostname: String,
    /// Kernel and initramfs URLs, best job server first.
    pub sources: Vec<(String, String)>,
    /// The job servers in the same order, by name.
    pub jobservers: Vec<String>,
    /// Kernel arguments, except the nonce.
    pub args: Vec<String>,
}

/// The message every unattested request gets, known MAC or not.
pub const UNATTESTED: &str =
    "waiting for the job server's report of this boot's DHCP lease, retrying";

/// Where `node` fetches its image, best first: each hosting job server's
/// fresh address on the node's network ([`offer`]), least loaded first,
/// then by name; and the names of those that would serve it but are
/// silent, in name order.
pub fn choose_jobservers(node: &NodeView, stale_after: Duration) -> (Vec<Source<'_>>, Vec<&str>) {
    let mut eligible = Vec::new();
    let mut silent = Vec::new();
    for j in &node.jobservers {
        match offer(j, node.network, stale_after) {
            Offer::Fresh(source) => eligible.push(source),
            Offer::Silent => silent.push(j.name.as_str()),
            Offer::Elsewhere => {}
        }
    }
    eligible.sort_by(|a, b| {
        a.load_avg
            .total_cmp(&b.load_avg)
            .then_with(|| a.name.cmp(b.name))
    });
    silent.sort_unstable();
    (eligible, silent)
}

/// Where the inventory places the node `lookup` found, for the lease
/// attestation ([`crate::boot::attests`]): its switch port's network, else
/// its NIC's; for a NIC naming none, its reserved address; else unplaced.
pub fn placement(lookup: &Lookup) -> crate::boot::Placement {
    use crate::boot::Placement;
    match lookup {
        Lookup::Unknown => Placement::Unknown,
        Lookup::Known(n) => match (n.network, n.reserved_ip) {
            (Some(net), _) => Placement::Network(net),
            (None, Some(ip)) => Placement::Reserved(ip),
            (None, None) => Placement::Unplaced,
        },
    }
}

/// Decides what a request gets. `attested`: a job server reported this boot's
/// lease (see the module docs); `throttled`: the rate limit refused it.
pub fn decide(
    lookup: &Lookup,
    mac: &str,
    attested: bool,
    throttled: bool,
    s: &Settings<'_>,
) -> Decision {
    if throttled {
        return Decision::Throttled;
    }
    if !attested {
        return Decision::Retry(UNATTESTED.to_owned());
    }
    let node = match lookup {
        Lookup::Unknown => return Decision::Discovery,
        Lookup::Known(node) => node,
    };
    if !node.netboot {
        return Decision::LocalBoot;
    }
    let host = &node.hostname;
    let boot = match bootable(node, s.stale_after) {
        Ok(b) => b,
        Err(why) => return Decision::Retry(why.to_string()),
    };
    let (slug, version) = (&boot.image.slug, boot.image.version);
    let mut args = match agent_args(node, s, mac) {
        Ok(args) => args,
        Err(why) => return Decision::Retry(why),
    };
    args.insert(args.len() - 1, format!("mprov_image={slug}:{version}"));
    let sources = match sources(&boot) {
        Ok(sources) => sources,
        Err(why) => return Decision::Retry(why),
    };
    let plan = Plan {
        system_id: node.system_id,
        hostname: host.clone(),
        sources,
        jobservers: boot.jobservers.iter().map(|j| j.name.to_owned()).collect(),
        args,
    };
    // Whatever else cannot go into the script (the service's own URL, say)
    // is a retry too, found before a nonce is minted: a nonce is safe in a
    // script, so the real rendering cannot fail where this one passed.
    let boot = Decision::Boot(plan);
    match render(&boot, Some("nonce"), s) {
        Ok(_) => boot,
        Err(e) => Decision::Retry(e.to_string()),
    }
}

/// The kernel arguments of `node`'s boot line (its effective command line)
/// and the agent's own after them (`mprov_ca`, `mprov_url`, `mprov_mac`),
/// or why they cannot go into a script.
fn agent_args(node: &NodeView, s: &Settings<'_>, mac: &str) -> Result<Vec<String>, String> {
    let host = &node.hostname;
    let cmdline = node
        .effective()
        .map_err(|e| format!("{host}: {e}"))?
        .kernel_cmdline;
    let mut args: Vec<String> = cmdline.split_whitespace().map(str::to_owned).collect();
    if let Some(bad) = args.iter().find(|a| !mprov_ipxe::safe_word(a)) {
        return Err(format!(
            "{host}: kernel argument {bad} cannot go into an iPXE script, fix install_kernel_cmdline"
        ));
    }
    if s.ca_fingerprint.is_empty() {
        return Err(
            "the control service has no CA certificate to pin on the boot line yet".to_owned(),
        );
    }
    // The agent's own arguments come last, so a layer cannot shadow them.
    args.retain(|a| !a.starts_with("mprov_"));
    args.extend([
        format!("mprov_ca={}", s.ca_fingerprint),
        format!("mprov_url={}", s.control_url),
        format!("mprov_mac={mac}"),
    ]);
    Ok(args)
}

/// The kernel and initramfs URLs of `boot`'s image on each of its job
/// servers, best first, or why one cannot go into a script.
fn sources(boot: &Bootable<'_>) -> Result<Vec<(String, String)>, String> {
    let (slug, version) = (&boot.image.slug, boot.image.version);
    let mut sources = Vec::with_capacity(boot.jobservers.len());
    for j in &boot.jobservers {
        let address = j.address;
        let base = jobserver_base_url(address, j.port);
        let kernel = image_file_url(&base, slug, version, ImageFile::Kernel);
        let initrd = image_file_url(&base, slug, version, ImageFile::Initramfs);
        if !mprov_ipxe::safe_word(&kernel) || !mprov_ipxe::safe_word(&initrd) {
            return Err(format!(
                "job server {}: its address {address} cannot go into an iPXE script, fix its addresses",
                j.name
            ));
        }
        sources.push((kernel, initrd));
    }
    Ok(sources)
}

/// The host name a discovery boot's view carries (no system has it: host
/// names are DNS labels, which have no spaces).
pub const DISCOVERY_HOST: &str = "discovery";

/// What an attested unknown MAC gets when a discovery image is configured
/// (`MPROV_DISCOVERY_IMAGE`): `view` is that image's, as loaded for the
/// network the lease came from ([`view::load_image`]; `None`: no such
/// image). The discovery boot loads the image's kernel and agent initramfs
/// from the least loaded job server of that network, the others as
/// fallbacks, with the image's effective kernel arguments and the agent's
/// (no `mprov_image`: the agent only listens and reports); the handler
/// adds the one-time discovery nonce (`mprov_discover`). An image that
/// cannot boot is a retry script saying why, and no nonce is minted. Pure.
pub fn discovery(view: Option<&NodeView>, image: &str, mac: &str, s: &Settings<'_>) -> Decision {
    let Some(node) = view else {
        return Decision::Retry(format!(
            "the discovery image {image} (MPROV_DISCOVERY_IMAGE) is not in the inventory"
        ));
    };
    let boot = match bootable(node, s.stale_after) {
        Ok(b) => b,
        Err(why) => return Decision::Retry(format!("discovery: {why}")),
    };
    let plan = agent_args(node, s, mac).and_then(|args| {
        Ok(Plan {
            system_id: 0,
            hostname: DISCOVERY_HOST.to_owned(),
            sources: sources(&boot)?,
            jobservers: boot.jobservers.iter().map(|j| j.name.to_owned()).collect(),
            args,
        })
    });
    let decision = match plan {
        Ok(plan) => Decision::DiscoveryBoot(plan),
        Err(why) => return Decision::Retry(format!("discovery: {why}")),
    };
    match render(&decision, Some("nonce"), s) {
        Ok(_) => decision,
        Err(e) => Decision::Retry(e.to_string()),
    }
}

/// The script of a decision; `nonce` is the one minted for a boot.
pub fn render(
    decision: &Decision,
    nonce: Option<&str>,
    s: &Settings<'_>,
) -> Result<String, mprov_ipxe::UnsafeValue> {
    match decision {
        Decision::Retry(message) => mprov_ipxe::retry_script(message, s.chain_url, RETRY_SECS),
        Decision::Throttled => mprov_ipxe::retry_script(
            "too many boot script requests, retrying",
            s.chain_url,
            RETRY_SECS * 3,
        ),
        Decision::Discovery => mprov_ipxe::discovery_script(s.chain_url, RETRY_SECS * 3),
        Decision::LocalBoot => Ok(mprov_ipxe::local_boot_script()),
        Decision::Boot(plan) | Decision::DiscoveryBoot(plan) => {
            let mut args = plan.args.clone();
            // The nonce first, before the effective arguments.
            let param = match decision {
                Decision::DiscoveryBoot(_) => mprov_api::nads::NONCE_PARAM,
                _ => "mprov_enroll",
            };
            if let Some(nonce) = nonce {
                args.insert(0, format!("{param}={nonce}"));
            }
            let sources: Vec<mprov_ipxe::Source<'_>> = plan
                .sources
                .iter()
                .map(|(k, i)| mprov_ipxe::Source {
                    kernel_url: k,
                    initrd_url: i,
                })
                .collect();
            mprov_ipxe::boot_script(&mprov_ipxe::Boot {
                hostname: &plan.hostname,
                sources: &sources,
                args: &args,
                chain_url: s.chain_url,
                retry_secs: RETRY_SECS,
                carry_lease: s.carry_lease,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Settings<'static> = Settings {
        chain_url: "http://c:8080/ipxe/?mac=${net0/mac}",
        control_url: "http://c:8080",
        ca_fingerprint: "ab12",
        stale_after: Duration::from_secs(45),
        carry_lease: true,
    };

    fn js(name: &str, net: i64, load: f64) -> JobServer {
        JobServer {
            id: net,
            name: name.into(),
            address: Some(format!("10.0.{net}.{}", name.len())),
            port: None,
            network: Some(net),
            load_avg: load,
            heartbeat_age: None,
            addresses: Vec::new(),
        }
    }

    fn secs(n: u64) -> Option<Duration> {
        Some(Duration::from_secs(n))
    }

    /// A registered address of job server `j`.
    fn served(address: &str, net: Option<i64>, age: Option<Duration>, load: f64) -> ServedAddress {
        ServedAddress {
            address: address.into(),
            network: net,
            load_avg: load,
            heartbeat_age: age,
        }
    }

    fn boot_plan(n: NodeView) -> Result<Plan, String> {
        match decide(&Lookup::Known(Box::new(n)), "aa:bb", true, false, &S) {
            Decision::Boot(plan) => Ok(plan),
            Decision::Retry(why) => Err(why),
            other => panic!("{other:?}"),
        }
    }

    fn node() -> NodeView {
        NodeView {
            system_id: 7,
            hostname: "c01".into(),
            netboot: true,
            run_request: 0,
            network: Some(1),
            reserved_ip: None,
            image: Some(ImageView {
                id: 1,
                slug: "compute".into(),
                version: 3,
                rootfs_sha256: "0".repeat(64).parse().map_err(|_| String::new()),
                rootfs_size: 4096,
            }),
            jobservers: vec![js("loaded", 1, 4.0), js("far", 2, 0.0), js("idle", 1, 0.5)],
            layers: view::NodeLayers {
                system: view::Layer {
                    id: 7,
                    name: "c01".into(),
                    install_kernel_cmdline: "console=ttyS0 quiet mprov_enroll=spoofed".into(),
                    ..view::Layer::default()
                },
                ..view::NodeLayers::default()
            },
        }
    }

    fn cmdline(n: &mut NodeView, line: &str) {
        n.layers.system.install_kernel_cmdline = line.into();
    }

    #[test]
    fn unattested_requests_get_the_same_answer_known_or_not() {
        let known = decide(&Lookup::Known(Box::new(node())), "aa", false, false, &S);
        let unknown = decide(&Lookup::Unknown, "aa", false, false, &S);
        assert_eq!(known, unknown);
        assert_eq!(known, Decision::Retry(UNATTESTED.into()));
        assert_eq!(
            decide(&Lookup::Known(Box::new(node())), "aa", true, true, &S),
            Decision::Throttled
        );
    }

    #[test]
    fn job_servers_on_the_nodes_network_least_loaded_first() {
        let Decision::Boot(plan) =
            decide(&Lookup::Known(Box::new(node())), "aa:bb", true, false, &S)
        else {
            panic!("no boot")
        };
        assert_eq!(plan.jobservers, ["idle", "loaded"]);
        assert_eq!(
            plan.sources[0],
            (
                "http://10.0.1.4:8081/images/compute/3/vmlinuz".to_owned(),
                "http://10.0.1.4:8081/images/compute/3/initramfs.img".to_owned()
            )
        );
        assert_eq!(
            plan.args,
            [
                "console=ttyS0",
                "quiet",
                "mprov_ca=ab12",
                "mprov_url=http://c:8080",
                "mprov_image=compute:3",
                "mprov_mac=aa:bb"
            ]
        );
        let script = render(&Decision::Boot(plan), Some("n0nce"), &S).unwrap();
        assert!(
            script.contains(" mprov_enroll=n0nce console=ttyS0 quiet "),
            "{script}"
        );
        assert!(
            script.contains("http://10.0.1.6:8081/images/compute/3/vmlinuz"),
            "{script}"
        );
    }

    #[test]
    fn every_other_outcome() {
        assert_eq!(
            decide(&Lookup::Unknown, "aa", true, false, &S),
            Decision::Discovery
        );
        let mut n = node();
        n.netboot = false;
        assert_eq!(
            decide(&Lookup::Known(Box::new(n)), "aa", true, false, &S),
            Decision::LocalBoot
        );
        let retry = |n: NodeView| match decide(&Lookup::Known(Box::new(n)), "aa", true, false, &S) {
            Decision::Retry(m) => m,
            other => panic!("{other:?}"),
        };
        let mut n = node();
        n.image = None;
        assert!(retry(n).contains("no image"));
        let mut n = node();
        n.jobservers.retain(|j| j.network == Some(2));
        assert!(retry(n).contains("on no job server"));
        let mut n = node();
        n.image.as_mut().unwrap().rootfs_sha256 = Err(String::new());
        assert!(retry(n).contains("no recorded rootfs checksum"));
        let mut n = node();
        n.image.as_mut().unwrap().rootfs_sha256 = Err("abc".into());
        assert!(retry(n).contains("\"abc\" is not a SHA-256"));
        let mut n = node();
        n.image.as_mut().unwrap().rootfs_size = 0;
        assert!(retry(n).contains("rootfs size of 0"));
        let mut n = node();
        cmdline(&mut n, "init=$(reboot)");
        assert!(retry(n).contains("cannot go into an iPXE script"));
        // iPXE's command separators, as words or inside one.
        for line in [
            "console=ttyS0 ; chain http://x/",
            "console=ttyS0 && chain http://x/",
            "console=ttyS0 || chain http://x/",
            "console=ttyS0;chain",
        ] {
            let mut n = node();
            cmdline(&mut n, line);
            let why = retry(n);
            assert!(why.contains("fix install_kernel_cmdline"), "{line}: {why}");
            let script = render(&Decision::Retry(why), None, &S).unwrap();
            assert_eq!(script.lines().count(), 4, "{script}");
            assert!(
                script
                    .lines()
                    .nth(1)
                    .unwrap()
                    .split_whitespace()
                    .all(|w| !matches!(w, ";" | "&&" | "||")),
                "{script}"
            );
        }
        // A job server's address that would change the script.
        let mut n = node();
        n.jobservers[2].address = Some("10.0.1.9;reboot".into());
        let why = retry(n);
        assert!(
            why.contains("job server idle") && why.contains("addresses"),
            "{why}"
        );
        // No CA certificate to pin: a retry, before any nonce.
        let no_ca = Settings {
            ca_fingerprint: "",
            ..S
        };
        match decide(&Lookup::Known(Box::new(node())), "aa", true, false, &no_ca) {
            Decision::Retry(m) => assert!(m.contains("no CA certificate"), "{m}"),
            other => panic!("{other:?}"),
        }
        // The service's own URL unfit for a script: a retry too.
        let bad_url = Settings {
            control_url: "http://c:8080/a b",
            ..S
        };
        match decide(
            &Lookup::Known(Box::new(node())),
            "aa",
            true,
            false,
            &bad_url,
        ) {
            Decision::Retry(m) => assert!(m.contains("cannot go into an iPXE script"), "{m}"),
            other => panic!("{other:?}"),
        }
        for d in [
            Decision::Retry("x".into()),
            Decision::Throttled,
            Decision::Discovery,
        ] {
            let s = render(&d, None, &S).unwrap();
            assert!(
                s.contains("chain http://c:8080/ipxe/?mac=${net0/mac}\n"),
                "{s}"
            );
        }
    }

    #[test]
    fn a_registered_job_server_is_reached_at_its_fresh_address_on_the_nodes_network() {
        // js "multi" serves networks 1 and 2; the node is on 1.
        let mut n = node();
        let mut multi = js("multi", 1, 9.0);
        multi.addresses = vec![
            served("10.0.2.5", Some(2), secs(1), 0.0),
            served("10.0.1.5", Some(1), secs(10), 0.1),
        ];
        n.jobservers = vec![multi.clone(), js("loaded", 1, 4.0)];
        let plan = boot_plan(n.clone()).expect("boots");
        // Its own address on network 1, with that address's load (0.1, not
        // the row's 9.0), so it comes first.
        assert_eq!(plan.jobservers, ["multi", "loaded"]);
        assert!(
            plan.sources[0].0.starts_with("http://10.0.1.5:"),
            "{:?}",
            plan.sources
        );

        // Its address on network 1 went silent: the node is not sent there,
        // even though its address on network 2 is fresh.
        n.jobservers[0].addresses[1].heartbeat_age = secs(46);
        let plan = boot_plan(n.clone()).expect("boots");
        assert_eq!(plan.jobservers, ["loaded"]);
        // Exactly at the limit is still fresh.
        n.jobservers[0].addresses[1].heartbeat_age = secs(45);
        assert_eq!(
            boot_plan(n.clone()).unwrap().jobservers,
            ["multi", "loaded"]
        );
        // An address that never heartbeated is not fresh.
        n.jobservers[0].addresses[1].heartbeat_age = None;
        assert_eq!(boot_plan(n.clone()).unwrap().jobservers, ["loaded"]);
        // Only on another network: never, fresh or not.
        n.jobservers[0].addresses.remove(1);
        assert_eq!(boot_plan(n).unwrap().jobservers, ["loaded"]);
    }

    #[test]
    fn a_job_server_that_never_registered_keeps_its_rows_address_unless_its_row_is_stale() {
        let mut n = node();
        // Never heartbeated: eligible, as before registration existed.
        assert_eq!(boot_plan(n.clone()).unwrap().jobservers, ["idle", "loaded"]);
        n.jobservers[2].heartbeat_age = secs(5);
        n.jobservers[0].heartbeat_age = secs(600);
        assert_eq!(boot_plan(n.clone()).unwrap().jobservers, ["idle"]);
        // A longer limit takes it back.
        let patient = Settings {
            stale_after: Duration::from_secs(900),
            ..S
        };
        match decide(&Lookup::Known(Box::new(n)), "aa", true, false, &patient) {
            Decision::Boot(plan) => assert_eq!(plan.jobservers, ["idle", "loaded"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn when_every_job_server_of_the_network_is_silent_the_retry_says_so() {
        let mut n = node();
        for j in &mut n.jobservers {
            j.heartbeat_age = secs(120);
        }
        // "far" is on network 2: not named among the silent ones.
        let why = boot_plan(n.clone()).expect_err("silent");
        assert!(
            why.contains("silent") && why.contains("idle, loaded") && why.contains("45 s"),
            "{why}"
        );
        assert!(!why.contains("far"), "{why}");
        // The manifest's rule is the same one.
        assert!(matches!(
            bootable(&n, S.stale_after),
            Err(NotBootable::Silent { .. })
        ));
        // One registered job server back on the node's network: it boots.
        n.jobservers[1].addresses = vec![served("10.0.1.77", Some(1), secs(2), 1.0)];
        let plan = boot_plan(n.clone()).expect("boots");
        assert_eq!(plan.jobservers, ["far"]);
        assert!(
            plan.sources[0].0.starts_with("http://10.0.1.77:"),
            "{:?}",
            plan.sources
        );
        // No job server on the node's network at all: the old reason.
        n.jobservers.retain(|j| j.network == Some(2));
        n.jobservers[0].addresses.clear();
        assert!(boot_plan(n).expect_err("none").contains("on no job server"));
    }

    #[test]
    fn a_discovery_boot_carries_the_discovery_nonce_and_no_image() {
        let n = node();
        let d = discovery(Some(&n), "compute", "aa:bb", &S);
        let Decision::DiscoveryBoot(plan) = &d else {
            panic!("{d:?}");
        };
        assert_eq!(plan.jobservers, ["idle", "loaded"]);
        let script = render(&d, Some("N0nce"), &S).unwrap();
        let kernel = script.lines().find(|l| l.starts_with("kernel ")).unwrap();
        assert!(
            kernel.contains("initrd=initramfs.img mprov_discover=N0nce ")
                && kernel.contains("mprov_ca=ab12")
                && kernel.contains("mprov_mac=aa:bb")
                && !kernel.contains("mprov_image")
                && !kernel.contains("mprov_enroll"),
            "{script}"
        );
        // No such image, an image that cannot boot, no CA: retries, saying why.
        let why = |d: Decision| match d {
            Decision::Retry(why) => why,
            other => panic!("{other:?}"),
        };
        assert!(why(discovery(None, "disc", "aa:bb", &S)).contains("MPROV_DISCOVERY_IMAGE"));
        let mut no_size = n.clone();
        if let Some(i) = no_size.image.as_mut() {
            i.rootfs_size = 0;
        }
        assert!(why(discovery(Some(&no_size), "compute", "aa:bb", &S)).starts_with("discovery: "));
        let no_ca = Settings {
            ca_fingerprint: "",
            ..S
        };
        assert!(why(discovery(Some(&n), "compute", "aa:bb", &no_ca)).contains("CA certificate"));
    }

    #[test]
    fn offers_follow_the_nodes_network_and_the_heartbeat() {
        let stale = Duration::from_secs(45);
        let mut j = js("a", 1, 0.0);
        assert!(matches!(offer(&j, Some(1), stale), Offer::Fresh(s) if s.address == "10.0.1.1"));
        assert_eq!(offer(&j, Some(2), stale), Offer::Elsewhere);
        // A node whose NIC names no network: any.
        assert!(matches!(offer(&j, None, stale), Offer::Fresh(_)));
        j.address = None;
        assert_eq!(offer(&j, Some(1), stale), Offer::Elsewhere);
        j.addresses = vec![
            served("10.0.1.8", Some(1), secs(50), 0.0),
            served("10.0.1.9", Some(1), secs(3), 0.0),
            served("192.0.2.1", None, secs(1), 0.0),
        ];
        assert!(matches!(offer(&j, Some(1), stale), Offer::Fresh(s) if s.address == "10.0.1.9"));
        assert!(matches!(offer(&j, None, stale), Offer::Fresh(s) if s.address == "10.0.1.9"));
        assert_eq!(offer(&j, Some(3), stale), Offer::Elsewhere);
        j.addresses[1].heartbeat_age = secs(46);
        assert_eq!(offer(&j, Some(1), stale), Offer::Silent);
    }
}
