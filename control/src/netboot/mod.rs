//! What `GET /ipxe/` answers, decided by a pure function like
//! `mprov_dhcp::handle`: a typed view of the booting node goes in (see
//! [`Lookup`]), a [`Decision`] comes out, and [`render`] turns it into the
//! script. The HTTP handler (`http::ipxe`) loads the view with a fixed number
//! of queries, mints the nonce when the decision asks for one and records the
//! boot event; nothing here does I/O.
//!
//! The rules:
//! - A request is **attested** when a job server on the node's network has
//!   just reported leasing the request's source address to the MAC it names
//!   (the `dhcp_acked` event, or `proxy_answered` in proxyDHCP mode). Without
//!   that, every MAC, known or not, gets the same retry script: the answer
//!   tells nothing about the inventory and hands out no nonce.
//! - An attested unknown MAC gets the discovery script; a node set not to
//!   netboot gets local boot; a node without an image, or whose image's
//!   current version no job server on its network hosts (or has no recorded
//!   checksum), gets a retry script saying so.
//! - Otherwise the node boots its image's kernel and agent initramfs from the
//!   least loaded eligible job server, the others following in the script as
//!   fallbacks, with the effective kernel arguments and the `mprov_*`
//!   arguments the agent reads.

use mprov_api::boot::{ImageFile, image_file_url, jobserver_base_url};

/// How long a node waits before chaining to `/ipxe/` again.
pub const RETRY_SECS: u32 = 10;

/// A job server that hosts the image's current version.
#[derive(Debug, Clone, PartialEq)]
pub struct JobServer {
    /// Its name.
    pub name: String,
    /// The address nodes reach it by (its first address).
    pub address: Option<String>,
    /// Its image server's port, if its row names one.
    pub port: Option<u16>,
    /// Its network's id.
    pub network: Option<i64>,
    /// Its load average at its last report.
    pub load_avg: f64,
}

/// The image a node boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Its slug.
    pub slug: String,
    /// Its current version.
    pub version: i64,
    /// The recorded sha256 of the version's rootfs ("" when not published).
    pub rootfs_sha256: String,
}

/// A known node, as `/ipxe/` sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The system's id.
    pub system_id: i64,
    /// Its host name.
    pub hostname: String,
    /// Whether it boots from the network.
    pub netboot: bool,
    /// The network of the NIC that booted (its switch port's first).
    pub network: Option<i64>,
    /// Its image, if it has one.
    pub image: Option<Image>,
    /// The job servers hosting the image's current version, in any order.
    pub jobservers: Vec<JobServer>,
    /// The effective kernel command line (distro, groups, image, system),
    /// or why it could not be computed.
    pub kernel_cmdline: Result<String, String>,
}

/// The MAC that booted, found or not.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// No NIC has this MAC.
    Unknown,
    /// The system that owns it.
    Known(Node),
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
}

/// What the node gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Ask again later: the message goes on the node's console.
    Retry(String),
    /// Too many requests: 429 with a retry script.
    Throttled,
    /// The discovery script.
    Discovery,
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
    "waiting for the job server's report of this boot's DHCP lease; retrying";

/// The eligible job servers of `node`, best first: on the node's network
/// (any network when the NIC names none), with an address, least loaded
/// first, then by name.
pub fn choose_jobservers(node: &Node) -> Vec<&JobServer> {
    let mut eligible: Vec<&JobServer> = node
        .jobservers
        .iter()
        .filter(|j| j.address.is_some())
        .filter(|j| node.network.is_none() || j.network == node.network)
        .collect();
    eligible.sort_by(|a, b| {
        a.load_avg
            .total_cmp(&b.load_avg)
            .then_with(|| a.name.cmp(&b.name))
    });
    eligible
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
    let Some(image) = &node.image else {
        return Decision::Retry(format!("{host} has no image; set one in the inventory"));
    };
    let (slug, version) = (&image.slug, image.version);
    if image.rootfs_sha256.is_empty() {
        return Decision::Retry(format!(
            "image {slug} version {version} has no recorded rootfs checksum yet (publish it: rootfs_sha256)"
        ));
    }
    let chosen = choose_jobservers(node);
    if chosen.is_empty() {
        return Decision::Retry(format!(
            "image {slug} version {version} is on no job server of this node's network yet"
        ));
    }
    let cmdline = match &node.kernel_cmdline {
        Ok(c) => c,
        Err(e) => return Decision::Retry(format!("{host}: {e}")),
    };
    let mut args: Vec<String> = cmdline.split_whitespace().map(str::to_owned).collect();
    if let Some(bad) = args.iter().find(|a| !mprov_ipxe::safe_word(a)) {
        return Decision::Retry(format!(
            "{host}: kernel argument {bad} cannot go into an iPXE script; fix install_kernel_cmdline"
        ));
    }
    // The agent's own arguments come last, so a layer cannot shadow them.
    args.retain(|a| !a.starts_with("mprov_"));
    args.extend([
        format!("mprov_ca={}", s.ca_fingerprint),
        format!("mprov_url={}", s.control_url),
        format!("mprov_image={slug}:{version}"),
        format!("mprov_mac={mac}"),
    ]);
    let sources = chosen
        .iter()
        .filter_map(|j| {
            let base = jobserver_base_url(j.address.as_deref()?, j.port);
            Some((
                image_file_url(&base, slug, version, ImageFile::Kernel),
                image_file_url(&base, slug, version, ImageFile::Initramfs),
            ))
        })
        .collect();
    Decision::Boot(Plan {
        system_id: node.system_id,
        hostname: host.clone(),
        sources,
        jobservers: chosen.iter().map(|j| j.name.clone()).collect(),
        args,
    })
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
            "too many boot script requests; retrying",
            s.chain_url,
            RETRY_SECS * 3,
        ),
        Decision::Discovery => mprov_ipxe::discovery_script(s.chain_url, RETRY_SECS * 3),
        Decision::LocalBoot => Ok(mprov_ipxe::local_boot_script()),
        Decision::Boot(plan) => {
            let mut args = plan.args.clone();
            // The nonce first, before the effective arguments.
            if let Some(nonce) = nonce {
                args.insert(0, format!("mprov_enroll={nonce}"));
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
    };

    fn js(name: &str, net: i64, load: f64) -> JobServer {
        JobServer {
            name: name.into(),
            address: Some(format!("10.0.{net}.{}", name.len())),
            port: None,
            network: Some(net),
            load_avg: load,
        }
    }

    fn node() -> Node {
        Node {
            system_id: 7,
            hostname: "c01".into(),
            netboot: true,
            network: Some(1),
            image: Some(Image {
                slug: "compute".into(),
                version: 3,
                rootfs_sha256: "0".repeat(64),
            }),
            jobservers: vec![js("loaded", 1, 4.0), js("far", 2, 0.0), js("idle", 1, 0.5)],
            kernel_cmdline: Ok("console=ttyS0 quiet mprov_enroll=spoofed".into()),
        }
    }

    #[test]
    fn unattested_requests_get_the_same_answer_known_or_not() {
        let known = decide(&Lookup::Known(node()), "aa", false, false, &S);
        let unknown = decide(&Lookup::Unknown, "aa", false, false, &S);
        assert_eq!(known, unknown);
        assert_eq!(known, Decision::Retry(UNATTESTED.into()));
        assert_eq!(
            decide(&Lookup::Known(node()), "aa", true, true, &S),
            Decision::Throttled
        );
    }

    #[test]
    fn job_servers_on_the_nodes_network_least_loaded_first() {
        let Decision::Boot(plan) = decide(&Lookup::Known(node()), "aa:bb", true, false, &S) else {
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
            decide(&Lookup::Known(n), "aa", true, false, &S),
            Decision::LocalBoot
        );
        let retry = |n: Node| match decide(&Lookup::Known(n), "aa", true, false, &S) {
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
        n.image.as_mut().unwrap().rootfs_sha256.clear();
        assert!(retry(n).contains("no recorded rootfs checksum"));
        let mut n = node();
        n.kernel_cmdline = Ok("init=$(reboot)".into());
        assert!(retry(n).contains("cannot go into an iPXE script"));
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
}
