//! NADS (node attachment discovery): what a node heard over LLDP on each of
//! its links, and the hardware facts it read, reported to the control service
//! so it can be matched to its system by switch port.
//!
//! The exchange:
//! 1. `/ipxe/` answers an unknown MAC with the discovery script, which boots
//!    the agent in discovery mode with a one-time discovery nonce on the
//!    kernel command line (`mprov_discover=<nonce>`), bound to the MAC that
//!    booted and good only for reporting.
//! 2. `mprov-agent nads` listens for LLDP on every link that is up, then
//!    `POST`s a [`NadsReport`] to [`REPORT_PATH`] with the nonce in
//!    [`NONCE_HEADER`] (a booted node may report with its own certificate
//!    instead).
//! 3. The control service answers a [`ReportOutcome`]: matched (the MAC is
//!    bound; the node's next boot is a normal one), or parked as discovered
//!    for an admin to assign.

use serde::{Deserialize, Serialize};

/// `POST` a [`NadsReport`].
pub const REPORT_PATH: &str = "/api/v1/discovery/report";
/// The discovered nodes parked for an admin (`GET`), each at
/// `<DISCOVERY_PATH><mac>` (`DELETE`) and `<DISCOVERY_PATH><mac>/assign`
/// (`POST`).
pub const DISCOVERY_PATH: &str = "/api/v1/discovery/";
/// The header that carries the one-time discovery nonce.
pub const NONCE_HEADER: &str = "mProv-Discovery-Nonce";
/// The kernel command-line parameter that carries the discovery nonce.
pub const NONCE_PARAM: &str = "mprov_discover";
/// How long the agent listens when it is not told otherwise.
pub const DEFAULT_WINDOW_SECONDS: u64 = 60;

/// Everything a node reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NadsReport {
    /// The MAC the node booted from (the one the discovery nonce is bound
    /// to), lower-case `aa:bb:cc:dd:ee:ff`.
    pub boot_mac: String,
    /// One entry per link that was up while the agent listened.
    pub links: Vec<LinkReport>,
    /// Vendor, model and serial from DMI.
    pub hardware: Hardware,
}

/// One link and what was heard on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LinkReport {
    /// The kernel's interface name (`eth0`, `enp1s0`).
    pub interface: String,
    /// The link's MAC, lower-case `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// The LLDP neighbour heard, or `None` when nothing was heard in the
    /// window (some NICs swallow LLDP in firmware).
    pub neighbour: Option<Neighbour>,
}

/// What one LLDP frame said about the switch port at the other end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Neighbour {
    /// The chassis ID as text (a MAC as `aa:bb:...`, an address, or the
    /// bytes as text), with its subtype.
    pub chassis_id: String,
    /// The chassis ID subtype's name (`mac-address`, `network-address`,
    /// `interface-name`, `local`...).
    pub chassis_id_subtype: String,
    /// The port ID as text, with its subtype.
    pub port_id: String,
    /// The port ID subtype's name (`interface-name`, `mac-address`,
    /// `local`, `interface-alias`...).
    pub port_id_subtype: String,
    /// The system name TLV, when sent.
    pub system_name: Option<String>,
    /// The port description TLV, when sent.
    pub port_description: Option<String>,
    /// Management addresses, as text.
    pub management_addresses: Vec<String>,
    /// The port VLAN ID (802.1 organisational TLV), when sent.
    pub vlan: Option<u16>,
}

/// Hardware facts read from DMI (`/sys/class/dmi/id`); empty where unreadable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Hardware {
    /// `sys_vendor`.
    pub vendor: Option<String>,
    /// `product_name`.
    pub model: Option<String>,
    /// `product_serial`.
    pub serial: Option<String>,
}

/// The control service's answer to a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum ReportOutcome {
    /// The node's MAC is bound to this system; its next boot is a normal one.
    Matched {
        /// The system's host name.
        hostname: String,
    },
    /// No match, or the policy says wait: parked for an admin to assign.
    Parked {
        /// Why, in words an admin reads.
        reason: String,
    },
}
