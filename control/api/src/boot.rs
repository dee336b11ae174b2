//! The boot config snapshot: everything a job server needs to answer a booting
//! node before its kernel runs (DHCP reservations and pools, DNS names, boot
//! files), as one document with the inventory revision it was read at.
//!
//! The control service serves it at `GET /api/v1/bootconfig` with a long-poll
//! (`?after=<revision>&wait=<seconds>`), so a job server learns of a new node
//! within a second and keeps serving the last snapshot while the control
//! service is away. Standalone job servers read the same document from a file
//! (JSON or YAML).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// The path of the snapshot endpoint.
pub const BOOTCONFIG_PATH: &str = "/api/v1/bootconfig";

/// One consistent view of the inventory, as the boot services need it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootConfig {
    /// The inventory revision this snapshot was read at.
    pub revision: i64,
    /// The provisioning and other networks.
    #[serde(default)]
    pub networks: Vec<BootNetwork>,
    /// Every known interface with a MAC or an address: DHCP reservations and
    /// DNS names.
    #[serde(default)]
    pub hosts: Vec<BootHost>,
    /// Resolvers for names outside the cluster's domains; none means refuse.
    #[serde(default)]
    pub upstream_resolvers: Vec<IpAddr>,
    /// Where nodes fetch their boot script and images.
    #[serde(default)]
    pub boot: BootServices,
}

/// A network, with what the job server serves on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootNetwork {
    /// The network's slug.
    pub slug: String,
    /// Its network address.
    pub subnet: Ipv4Addr,
    /// Its prefix length.
    pub prefix: u8,
    /// The default gateway handed out.
    #[serde(default)]
    pub gateway: Option<Ipv4Addr>,
    /// DNS servers handed out.
    #[serde(default)]
    pub nameservers: Vec<Ipv4Addr>,
    /// The DNS domain of hosts on it ("" for none).
    #[serde(default)]
    pub domain: String,
    /// The dynamic pool for unknown nodes: first and last address.
    #[serde(default)]
    pub pool: Option<(Ipv4Addr, Ipv4Addr)>,
    /// Serve DHCP here.
    #[serde(default)]
    pub dhcp: bool,
    /// Serve DNS for its hosts.
    #[serde(default)]
    pub dns: bool,
    /// Allow network boot here.
    #[serde(default = "yes")]
    pub netboot: bool,
    /// MTU handed out, if not the default.
    #[serde(default)]
    pub mtu: Option<u16>,
    /// The boot URL UEFI HTTP boot clients (architecture 16) on this network
    /// get, overriding the job server's `--http-boot-url`. The control
    /// service's inventory has no such field yet, so it sends none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_boot_url: Option<String>,
}

fn yes() -> bool {
    true
}

/// One interface of a system (or a switch, or a BMC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootHost {
    /// Lowercase `aa:bb:cc:dd:ee:ff`, if known.
    #[serde(default)]
    pub mac: Option<String>,
    /// The reserved IPv4 address, if any.
    #[serde(default)]
    pub ipv4: Option<Ipv4Addr>,
    /// Its IPv6 address, if any (DNS only).
    #[serde(default)]
    pub ipv6: Option<Ipv6Addr>,
    /// Its short host name.
    pub hostname: String,
    /// Further names.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// The slug of its network, if known.
    #[serde(default)]
    pub network: Option<String>,
    /// Whether it may boot from the network (false: answer DHCP, no boot file).
    #[serde(default = "yes")]
    pub netboot: bool,
    /// Whether this is the interface the system boots from.
    #[serde(default)]
    pub bootable: bool,
}

/// Where nodes go once they have an address.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootServices {
    /// The URL iPXE chains to for its boot script, e.g.
    /// `http://10.0.0.1:8080/ipxe/`; `${net0/mac}` and the like are appended
    /// by the job server.
    #[serde(default)]
    pub ipxe_script_url: Option<String>,
}

// ---------------------------------------------------------------------------
// The contract between the control service, the job servers and the agent.
// Both sides of every hand-off below use these items, so a URL or a path is
// written in exactly one place.
// ---------------------------------------------------------------------------

/// The port a job server's HTTP image server listens on unless told otherwise
/// (`mprov-jobserver --http-listen`), and the port `/ipxe/` puts in the URLs
/// it renders when a job server's row names none.
pub const DEFAULT_HTTP_PORT: u16 = 8081;

/// The path the control service serves iPXE boot scripts at.
pub const IPXE_PATH: &str = "/ipxe/";

/// What iPXE must fill in on the chain URL: the boot script is chosen by the
/// MAC that booted, and the firmware platform tells BIOS from UEFI.
pub const IPXE_CHAIN_QUERY: &str = "?mac=${net0/mac}&platform=${platform}&buildarch=${buildarch}";

/// The chain URL of the boot config for a control service reachable at
/// `public_url` (no trailing slash needed): `<public_url>/ipxe/?mac=${net0/mac}&...`.
pub fn ipxe_chain_url(public_url: &str) -> String {
    format!(
        "{}{IPXE_PATH}{IPXE_CHAIN_QUERY}",
        public_url.trim_end_matches('/')
    )
}

/// The folder, under a job server's export and its URL root, that holds the
/// image versions: `images/<slug>/<version>/<file>`.
pub const IMAGES_DIR: &str = "images";

/// The files of one image version, on disk under the export and on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFile {
    /// The image's kernel.
    Kernel,
    /// The agent initramfs built for that kernel (the agent as `/init`, plus
    /// the NIC modules).
    Initramfs,
    /// The root filesystem, a zstd-compressed tar.
    Rootfs,
    /// The image's manifest (sizes and sha256 of every file).
    Manifest,
}

impl ImageFile {
    /// Every file of a version.
    pub const ALL: [ImageFile; 4] = [
        ImageFile::Kernel,
        ImageFile::Initramfs,
        ImageFile::Rootfs,
        ImageFile::Manifest,
    ];

    /// The file's name in the version's folder.
    pub fn file_name(self) -> &'static str {
        match self {
            ImageFile::Kernel => "vmlinuz",
            ImageFile::Initramfs => "initramfs.img",
            ImageFile::Rootfs => "rootfs.tar.zst",
            ImageFile::Manifest => "manifest.json",
        }
    }
}

/// The path of an image file relative to a job server's export folder and
/// URL root: `images/<slug>/<version>/<file>` (no leading slash).
pub fn image_file_path(slug: &str, version: i64, file: ImageFile) -> String {
    format!("{IMAGES_DIR}/{slug}/{version}/{}", file.file_name())
}

/// The base URL of a job server's image server: `http://<host>:<port>`, the
/// port [`DEFAULT_HTTP_PORT`] when none is given. An IPv6 literal is bracketed.
pub fn jobserver_base_url(host: &str, port: Option<u16>) -> String {
    let port = port.unwrap_or(DEFAULT_HTTP_PORT);
    if host.contains(':') && !host.starts_with('[') {
        format!("http://[{host}]:{port}")
    } else {
        format!("http://{host}:{port}")
    }
}

/// The URL of an image file on a job server whose base URL is `base`
/// (see [`jobserver_base_url`]).
pub fn image_file_url(base: &str, slug: &str, version: i64, file: ImageFile) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        image_file_path(slug, version, file)
    )
}

/// Where a node, with its own client certificate, reads its boot manifest.
pub const MANIFEST_PATH: &str = "/api/v1/boot/manifest";

/// What a node needs to fetch and verify its image, read from the control
/// service over mTLS. The checksum is the one the control service recorded
/// when the version was published: a job server never vouches for its own
/// bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootManifest {
    /// The system's id.
    pub system_id: i64,
    /// The system's host name (short).
    pub hostname: String,
    /// The image's slug.
    pub image: String,
    /// The image version to boot.
    pub version: i64,
    /// The size of `rootfs.tar.zst` in bytes.
    pub size: u64,
    /// Its sha256, lowercase hex.
    pub sha256: String,
    /// Where to fetch `rootfs.tar.zst`, best first; the agent falls back in
    /// this order.
    pub sources: Vec<String>,
    /// The size of the staging tmpfs (e.g. `"4G"` or `"50%"`), from the
    /// effective config; `None` for the agent's default.
    #[serde(default)]
    pub tmpfs_size: Option<String>,
}

/// Where boot events are written (job servers and nodes, each with its own
/// certificate) and read: `?system=<hostname or id>` for a node's last boot
/// (`&boot=all` for every boot), `?mac=` for a node the inventory does not
/// know, nothing for the latest event of every node.
pub const EVENTS_PATH: &str = "/api/v1/boot/events";

/// Where many boot events are written at once (`POST`, a JSON array of
/// [`BootEventReport`]s, at most [`MAX_BATCH`]): a job server drains its
/// queue into it, and a node its reports made while a post was in flight.
/// Each event is judged as [`EVENTS_PATH`] would judge it alone; the
/// refused ones are named in the answer ([`BatchOutcome`]), the others are
/// stored in order, in one transaction. The budget of boot events a
/// certificate may report counts each event of a batch.
pub const EVENTS_BATCH_PATH: &str = "/api/v1/boot/events/batch";

/// The most events one batch carries (no more than a node's budget of boot
/// events a minute by default, so a whole batch always fits in it).
pub const MAX_BATCH: usize = 100;

/// The answer to a batch of boot events ([`EVENTS_BATCH_PATH`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchOutcome {
    /// How many were stored.
    pub stored: usize,
    /// The ones refused, each as [`EVENTS_PATH`] would have refused it.
    #[serde(default)]
    pub refused: Vec<BatchRefusal>,
}

/// One refused event of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRefusal {
    /// Its place in the batch, from 0.
    pub index: usize,
    /// The HTTP status [`EVENTS_PATH`] would have answered (4xx).
    pub status: u16,
    /// The stable error code.
    pub error: String,
    /// What is wrong and what to do.
    pub message: String,
}

/// How recent a job server's lease report (`dhcp_acked`, `proxy_answered`)
/// must be to attest a node's `/ipxe/` request; a job server that started
/// again reports the leases it bound within it once more.
pub const ATTEST_WINDOW: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// Where a job server reports its load ([`Heartbeat`]) with its own
/// certificate, which names the row written: the control service stores it
/// (`load_avg`, `heartbeat_at` of the job server), and `/ipxe/` lists the
/// least loaded job server first. Nothing else of its row is the job
/// server's to write.
pub const HEARTBEAT_PATH: &str = "/api/v1/boot/heartbeat";

/// A job server's heartbeat, one per address it serves
/// ([`crate::jobs::Registration::addresses`]): the control service sends a
/// node only to an address whose heartbeat is fresh.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// Its one-minute load average.
    pub load_avg: f64,
    /// The address this heartbeat is for; `None` (a job server that has not
    /// registered addresses) stamps only the row.
    #[serde(default)]
    pub address: Option<std::net::IpAddr>,
    /// Image streams it is serving now.
    #[serde(default)]
    pub streams: u32,
}

/// A step of a node's boot. The timeline orders events by time; the phases
/// are listed here in the order a healthy boot passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BootPhase {
    /// Job server: a DHCPOFFER went to the node's MAC.
    DhcpOffered,
    /// Job server: a DHCPACK went to the node's MAC (the lease is durable).
    /// With the leased address in `ip`, it attests the node's `/ipxe/`
    /// request from that address.
    DhcpAcked,
    /// Job server in proxyDHCP mode: boot information went to the node's
    /// MAC beside the site's own DHCP server (the address, if known, in
    /// `ip`). It attests `/ipxe/` in place of `dhcp_acked`.
    ProxyAnswered,
    /// Job server: the iPXE binary went out over TFTP.
    BootFileSent,
    /// Control: `/ipxe/` served the boot script (with a nonce).
    ScriptServed,
    /// Job server: the kernel was fetched.
    KernelFetched,
    /// Job server: the agent initramfs was fetched.
    InitramfsFetched,
    /// Agent: its own DHCP lease.
    AgentDhcp,
    /// Agent: enrolled with the nonce; from now on it has a certificate.
    Enrolled,
    /// Agent: started streaming the image from a job server.
    ImageStarted,
    /// Agent: streaming progress.
    Progress,
    /// Agent: the image's sha256 matched.
    Verified,
    /// Agent: the image's sha256 did not match (the detail names the source).
    ChecksumMismatch,
    /// Agent: about to switch_root into the image.
    SwitchRoot,
    /// The booted node: its post-boot scripts started (the detail lists them).
    Scripts,
    /// Control, from the node's run report: one post-boot script ended (the
    /// detail: its status, exit code, duration and output tail).
    Script,
    /// Agent or control: a failure (the detail says which and what next).
    Failed,
    /// The booted node: up, scripts run.
    Ready,
}

impl BootPhase {
    /// Every phase, in boot order (`failed` and `ready` last).
    pub const ALL: &[BootPhase] = &[
        BootPhase::DhcpOffered,
        BootPhase::DhcpAcked,
        BootPhase::ProxyAnswered,
        BootPhase::BootFileSent,
        BootPhase::ScriptServed,
        BootPhase::KernelFetched,
        BootPhase::InitramfsFetched,
        BootPhase::AgentDhcp,
        BootPhase::Enrolled,
        BootPhase::ImageStarted,
        BootPhase::Progress,
        BootPhase::Verified,
        BootPhase::ChecksumMismatch,
        BootPhase::SwitchRoot,
        BootPhase::Scripts,
        BootPhase::Script,
        BootPhase::Failed,
        BootPhase::Ready,
    ];

    /// The phase's wire name, e.g. `dhcp_acked`.
    pub fn as_str(self) -> &'static str {
        match self {
            BootPhase::DhcpOffered => "dhcp_offered",
            BootPhase::DhcpAcked => "dhcp_acked",
            BootPhase::ProxyAnswered => "proxy_answered",
            BootPhase::BootFileSent => "boot_file_sent",
            BootPhase::ScriptServed => "script_served",
            BootPhase::KernelFetched => "kernel_fetched",
            BootPhase::InitramfsFetched => "initramfs_fetched",
            BootPhase::AgentDhcp => "agent_dhcp",
            BootPhase::Enrolled => "enrolled",
            BootPhase::ImageStarted => "image_started",
            BootPhase::Progress => "progress",
            BootPhase::Verified => "verified",
            BootPhase::ChecksumMismatch => "checksum_mismatch",
            BootPhase::SwitchRoot => "switch_root",
            BootPhase::Scripts => "scripts",
            BootPhase::Script => "script",
            BootPhase::Failed => "failed",
            BootPhase::Ready => "ready",
        }
    }
}

impl BootPhase {
    /// The cell of the boot board this phase puts a node in. Every phase
    /// has one: the `match` is exhaustive, so a new phase must be placed.
    pub fn board_state(self) -> BoardState {
        match self {
            BootPhase::DhcpOffered | BootPhase::DhcpAcked | BootPhase::ProxyAnswered => {
                BoardState::Dhcp
            }
            BootPhase::BootFileSent | BootPhase::ScriptServed => BoardState::Ipxe,
            BootPhase::KernelFetched | BootPhase::InitramfsFetched | BootPhase::AgentDhcp => {
                BoardState::Kernel
            }
            BootPhase::Enrolled => BoardState::Enrolled,
            BootPhase::ImageStarted
            | BootPhase::Progress
            | BootPhase::Verified
            | BootPhase::SwitchRoot => BoardState::Image,
            BootPhase::Scripts | BootPhase::Script => BoardState::Scripts,
            BootPhase::Ready => BoardState::Ready,
            BootPhase::Failed | BootPhase::ChecksumMismatch => BoardState::Failed,
        }
    }
}

/// Where a node stands on the boot board: the phases of a boot folded into
/// the eight steps an admin watches ([`BootPhase::board_state`]). Each has
/// a wire name and a letter, so a cell never says its state by colour
/// alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoardState {
    /// DHCP: the firmware got (or is getting) its address.
    Dhcp,
    /// iPXE: the boot file and the boot script went out.
    Ipxe,
    /// The kernel and the agent initramfs were fetched; the agent's own
    /// DHCP.
    Kernel,
    /// The agent enrolled and holds its certificate.
    Enrolled,
    /// The image is streaming (with a percentage), verified, switching
    /// root.
    Image,
    /// The post-boot scripts run.
    Scripts,
    /// Up, scripts run: the boot ended well.
    Ready,
    /// A failure (or a checksum mismatch): the boot ended badly, unless a
    /// later step shows it went on.
    Failed,
}

impl BoardState {
    /// Every state, in boot order (`ready` and `failed` last).
    pub const ALL: [BoardState; 8] = [
        BoardState::Dhcp,
        BoardState::Ipxe,
        BoardState::Kernel,
        BoardState::Enrolled,
        BoardState::Image,
        BoardState::Scripts,
        BoardState::Ready,
        BoardState::Failed,
    ];

    /// The wire name, e.g. `enrolled`.
    pub fn as_str(self) -> &'static str {
        match self {
            BoardState::Dhcp => "dhcp",
            BoardState::Ipxe => "ipxe",
            BoardState::Kernel => "kernel",
            BoardState::Enrolled => "enrolled",
            BoardState::Image => "image",
            BoardState::Scripts => "scripts",
            BoardState::Ready => "ready",
            BoardState::Failed => "failed",
        }
    }

    /// The state of a wire name.
    pub fn from_wire(name: &str) -> Option<BoardState> {
        BoardState::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The one letter a cell shows (all distinct): D, I, K, E, M (iMage),
    /// S, R, F.
    pub fn letter(self) -> char {
        match self {
            BoardState::Dhcp => 'D',
            BoardState::Ipxe => 'I',
            BoardState::Kernel => 'K',
            BoardState::Enrolled => 'E',
            BoardState::Image => 'M',
            BoardState::Scripts => 'S',
            BoardState::Ready => 'R',
            BoardState::Failed => 'F',
        }
    }

    /// A name for a person, e.g. `iPXE`.
    pub fn label(self) -> &'static str {
        match self {
            BoardState::Dhcp => "DHCP",
            BoardState::Ipxe => "iPXE",
            BoardState::Kernel => "kernel",
            BoardState::Enrolled => "enrolled",
            BoardState::Image => "image",
            BoardState::Scripts => "scripts",
            BoardState::Ready => "ready",
            BoardState::Failed => "failed",
        }
    }

    /// Whether the state ends a boot (`ready`, `failed`): a node there is
    /// neither slow nor stuck.
    pub fn is_final(self) -> bool {
        matches!(self, BoardState::Ready | BoardState::Failed)
    }
}

/// `POST /api/v1/boot/events`: one event. A node writes events for itself
/// only (its certificate names the system, so it sends neither `mac` nor
/// `system`); a job server names the node by `mac` (or `system`) and may
/// send the address it leased (`ip`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootEventReport {
    /// The step.
    pub phase: BootPhase,
    /// The node's MAC (job servers), lowercase `aa:bb:..`.
    #[serde(default)]
    pub mac: Option<String>,
    /// The node's host name or id (job servers, when the MAC is unknown to them).
    #[serde(default)]
    pub system: Option<String>,
    /// The address involved (the leased address for DHCP events).
    #[serde(default)]
    pub ip: Option<std::net::IpAddr>,
    /// Free text for a person: what happened, what next.
    #[serde(default)]
    pub detail: String,
}

/// One stored event of a boot timeline, as `GET /api/v1/boot/events` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootEvent {
    /// The event's id (increasing).
    pub id: i64,
    /// The system's id, if the node is known.
    #[serde(default)]
    pub system: Option<i64>,
    /// The system's host name, if the node is known.
    #[serde(default)]
    pub hostname: Option<String>,
    /// The node's MAC, if reported.
    #[serde(default)]
    pub mac: Option<String>,
    /// The boot this event belongs to (a new boot starts at a DHCP offer or
    /// at `/ipxe/` after the last `ready` or `failed`).
    pub boot_id: i64,
    /// The step.
    pub phase: BootPhase,
    /// When the control service recorded it (RFC 3339, UTC).
    pub at: String,
    /// Who wrote it: `jobserver:<name>`, `node:<hostname>` or `control`.
    pub source: String,
    /// The address involved, if any.
    #[serde(default)]
    pub ip: Option<std::net::IpAddr>,
    /// Free text.
    #[serde(default)]
    pub detail: String,
}

#[cfg(test)]
mod contract_tests {
    use super::*;

    #[test]
    fn urls_follow_the_layout() {
        assert_eq!(
            image_file_path("compute", 3, ImageFile::Rootfs),
            "images/compute/3/rootfs.tar.zst"
        );
        let base = jobserver_base_url("10.0.0.2", None);
        assert_eq!(base, "http://10.0.0.2:8081");
        assert_eq!(
            image_file_url(&base, "compute", 3, ImageFile::Kernel),
            "http://10.0.0.2:8081/images/compute/3/vmlinuz"
        );
        assert_eq!(
            jobserver_base_url("fd00::2", Some(80)),
            "http://[fd00::2]:80"
        );
        assert!(
            ipxe_chain_url("http://c:8080/").starts_with("http://c:8080/ipxe/?mac=${net0/mac}")
        );
    }

    #[test]
    fn every_phase_has_its_board_state() {
        use BoardState::*;
        let want = [
            (BootPhase::DhcpOffered, Dhcp),
            (BootPhase::DhcpAcked, Dhcp),
            (BootPhase::ProxyAnswered, Dhcp),
            (BootPhase::BootFileSent, Ipxe),
            (BootPhase::ScriptServed, Ipxe),
            (BootPhase::KernelFetched, Kernel),
            (BootPhase::InitramfsFetched, Kernel),
            (BootPhase::AgentDhcp, Kernel),
            (BootPhase::Enrolled, Enrolled),
            (BootPhase::ImageStarted, Image),
            (BootPhase::Progress, Image),
            (BootPhase::Verified, Image),
            (BootPhase::ChecksumMismatch, Failed),
            (BootPhase::SwitchRoot, Image),
            (BootPhase::Scripts, Scripts),
            (BootPhase::Script, Scripts),
            (BootPhase::Failed, Failed),
            (BootPhase::Ready, Ready),
        ];
        assert_eq!(want.len(), BootPhase::ALL.len());
        for (&phase, (listed, state)) in BootPhase::ALL.iter().zip(want) {
            assert_eq!(phase, listed);
            assert_eq!(phase.board_state(), state, "{phase:?}");
        }
        // Every board state is reached by some phase.
        for state in BoardState::ALL {
            assert!(
                BootPhase::ALL.iter().any(|p| p.board_state() == state),
                "{state:?}"
            );
        }
    }

    #[test]
    fn board_states_have_distinct_letters_and_round_trip() {
        let letters: std::collections::BTreeSet<char> =
            BoardState::ALL.iter().map(|s| s.letter()).collect();
        assert_eq!(letters.len(), BoardState::ALL.len());
        for state in BoardState::ALL {
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
            assert_eq!(BoardState::from_wire(state.as_str()), Some(state));
            assert!(state.letter().is_ascii_uppercase());
        }
        assert_eq!(BoardState::from_wire("booting"), None);
        let finals: Vec<BoardState> = BoardState::ALL
            .into_iter()
            .filter(|s| s.is_final())
            .collect();
        assert_eq!(finals, [BoardState::Ready, BoardState::Failed]);
    }

    #[test]
    fn phases_round_trip_by_their_wire_names() {
        for &phase in BootPhase::ALL {
            let json = serde_json::to_string(&phase).unwrap();
            assert_eq!(json, format!("\"{}\"", phase.as_str()));
        }
    }
}
