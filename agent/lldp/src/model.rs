//! The parsed form of a frame and its TLVs, and how their values read as
//! text.

use std::net::{Ipv4Addr, Ipv6Addr};

/// An Ethernet frame carrying an LLDPDU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The destination MAC (one of the three LLDP group addresses, for a
    /// frame that follows §7.1).
    pub destination: [u8; 6],
    /// The sender's MAC.
    pub source: [u8; 6],
    /// The 802.1Q tag's TCI, when the frame was tagged (a raw socket on
    /// Linux usually sees the tag stripped).
    pub tci: Option<u16>,
    /// The LLDPDU.
    pub lldpdu: Lldpdu,
}

/// One LLDPDU: the three mandatory TLVs, then the optional ones in the
/// order they came (End excluded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lldpdu {
    /// The chassis ID TLV (§8.5.2).
    pub chassis_id: ChassisId,
    /// The port ID TLV (§8.5.3).
    pub port_id: PortId,
    /// The time to live in seconds (§8.5.4); 0 announces a shutdown.
    pub ttl: u16,
    /// Every other TLV, in order.
    pub tlvs: Vec<Tlv>,
}

/// The chassis ID TLV: a subtype and 1 to 255 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChassisId {
    /// How to read [`ChassisId::id`].
    pub subtype: ChassisSubtype,
    /// The ID's bytes.
    pub id: Vec<u8>,
}

/// The chassis ID subtypes of §8.5.2.2 (table 8-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChassisSubtype {
    /// 1: `entPhysicalAlias` of a chassis (RFC 6933).
    ChassisComponent,
    /// 2: `ifAlias` (RFC 2863).
    InterfaceAlias,
    /// 6: `ifName` (RFC 2863).
    InterfaceName,
    /// 7: locally assigned text.
    Local,
    /// 4: a MAC address.
    MacAddress,
    /// 5: an IANA address family number, then the address.
    NetworkAddress,
    /// 3: `entPhysicalAlias` of a port or backplane.
    PortComponent,
    /// 0 and 8-255: reserved, kept by number.
    Reserved(u8),
}

/// The port ID TLV: a subtype and 1 to 255 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortId {
    /// How to read [`PortId::id`].
    pub subtype: PortSubtype,
    /// The ID's bytes.
    pub id: Vec<u8>,
}

/// The port ID subtypes of §8.5.3.2 (table 8-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSubtype {
    /// 6: an agent circuit ID (RFC 3046).
    AgentCircuitId,
    /// 1: `ifAlias` (RFC 2863).
    InterfaceAlias,
    /// 5: `ifName` (RFC 2863).
    InterfaceName,
    /// 7: locally assigned text.
    Local,
    /// 3: a MAC address.
    MacAddress,
    /// 4: an IANA address family number, then the address.
    NetworkAddress,
    /// 2: `entPhysicalAlias` of a port.
    PortComponent,
    /// 0 and 8-255: reserved, kept by number.
    Reserved(u8),
}

/// An optional TLV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tlv {
    /// System capabilities (§8.5.8, type 7).
    Capabilities(Capabilities),
    /// Link aggregation (802.3 subtype 3, or 802.1 subtype 7 before 2009).
    LinkAggregation(LinkAggregation),
    /// MAC/PHY configuration and status (802.3 subtype 1).
    MacPhy(MacPhy),
    /// A management address (§8.5.9, type 8); a sender may give several.
    ManagementAddress(ManagementAddress),
    /// The maximum frame size in bytes (802.3 subtype 4).
    MaxFrameSize(u16),
    /// Any other organisationally specific TLV (type 127), or a known one
    /// whose contents do not fit, raw.
    Org {
        /// The organisation's OUI.
        oui: [u8; 3],
        /// Its subtype.
        subtype: u8,
        /// The information string after OUI and subtype (0 to 507 bytes).
        info: Vec<u8>,
    },
    /// A TLV of a reserved type, or a known optional TLV whose contents do
    /// not fit its type (§9.2.7.7.2), raw.
    Other {
        /// The TLV type, 4 to 127.
        kind: u8,
        /// Its information string (0 to 511 bytes).
        value: Vec<u8>,
    },
    /// The port description (§8.5.5, type 4), 0 to 255 bytes.
    PortDescription(Vec<u8>),
    /// A port-and-protocol VLAN ID (802.1 subtype 2).
    PortProtocolVlanId {
        /// Bit 1: supported; bit 2: enabled.
        flags: u8,
        /// The VLAN ID (0 when not known).
        vlan: u16,
    },
    /// The port VLAN ID, the untagged VLAN (802.1 subtype 1); 0 when the
    /// port does not know or has none.
    PortVlanId(u16),
    /// The system description (§8.5.7, type 6), 0 to 255 bytes.
    SystemDescription(Vec<u8>),
    /// The system name (§8.5.6, type 5), 0 to 255 bytes.
    SystemName(Vec<u8>),
    /// A VLAN's name (802.1 subtype 3).
    VlanName {
        /// The VLAN ID.
        vlan: u16,
        /// Its name, 0 to 32 bytes.
        name: Vec<u8>,
    },
}

/// System capabilities (§8.5.8): two bitmaps of table 8-4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// What the system can do.
    pub available: u16,
    /// What of it is enabled.
    pub enabled: u16,
}

/// A management address (§8.5.9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagementAddress {
    /// The IANA address family number (1 IPv4, 2 IPv6, 6 802 MAC...).
    pub family: u8,
    /// The address, 1 to 31 bytes.
    pub address: Vec<u8>,
    /// How [`ManagementAddress::interface`] counts: 1 unknown, 2
    /// `ifIndex`, 3 system port number.
    pub interface_subtype: u8,
    /// The interface number.
    pub interface: u32,
    /// An object identifier, BER-encoded, 0 to 128 bytes.
    pub oid: Vec<u8>,
}

/// Link aggregation status (802.3-2018 79.3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkAggregation {
    /// Which organisation's TLV carried it.
    pub oui: AggregationOui,
    /// Bit 0: capable; bit 1: enabled (and bits 2-3 the port type, in
    /// the 802.1 form).
    pub status: u8,
    /// The aggregated port's `ifIndex` (0 when not aggregated).
    pub port: u32,
}

/// Where a link aggregation TLV came from: 802.1AB-2005 put it under 802.3's
/// OUI, 802.1AB-2009 moved it to 802.1's; senders use both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregationOui {
    /// 00-80-C2, subtype 7.
    Ieee8021,
    /// 00-12-0F, subtype 3.
    Ieee8023,
}

/// MAC/PHY configuration and status (802.3-2018 79.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacPhy {
    /// Bit 0: auto-negotiation supported; bit 1: enabled.
    pub autoneg: u8,
    /// The PMD auto-negotiation advertised capabilities.
    pub advertised: u16,
    /// The operational MAU type (RFC 4836).
    pub mau_type: u16,
}

impl ChassisSubtype {
    /// The subtype from its number.
    pub fn from_number(n: u8) -> Self {
        match n {
            1 => Self::ChassisComponent,
            2 => Self::InterfaceAlias,
            3 => Self::PortComponent,
            4 => Self::MacAddress,
            5 => Self::NetworkAddress,
            6 => Self::InterfaceName,
            7 => Self::Local,
            n => Self::Reserved(n),
        }
    }

    /// Its number.
    pub fn number(self) -> u8 {
        match self {
            Self::ChassisComponent => 1,
            Self::InterfaceAlias => 2,
            Self::PortComponent => 3,
            Self::MacAddress => 4,
            Self::NetworkAddress => 5,
            Self::InterfaceName => 6,
            Self::Local => 7,
            Self::Reserved(n) => n,
        }
    }

    /// Its name in the NADS report (`mac-address`, `local`...).
    pub fn name(self) -> String {
        match self {
            Self::ChassisComponent => "chassis-component".into(),
            Self::InterfaceAlias => "interface-alias".into(),
            Self::PortComponent => "port-component".into(),
            Self::MacAddress => "mac-address".into(),
            Self::NetworkAddress => "network-address".into(),
            Self::InterfaceName => "interface-name".into(),
            Self::Local => "local".into(),
            Self::Reserved(n) => format!("reserved-{n}"),
        }
    }
}

impl PortSubtype {
    /// The subtype from its number.
    pub fn from_number(n: u8) -> Self {
        match n {
            1 => Self::InterfaceAlias,
            2 => Self::PortComponent,
            3 => Self::MacAddress,
            4 => Self::NetworkAddress,
            5 => Self::InterfaceName,
            6 => Self::AgentCircuitId,
            7 => Self::Local,
            n => Self::Reserved(n),
        }
    }

    /// Its number.
    pub fn number(self) -> u8 {
        match self {
            Self::InterfaceAlias => 1,
            Self::PortComponent => 2,
            Self::MacAddress => 3,
            Self::NetworkAddress => 4,
            Self::InterfaceName => 5,
            Self::AgentCircuitId => 6,
            Self::Local => 7,
            Self::Reserved(n) => n,
        }
    }

    /// Its name in the NADS report (`interface-name`, `local`...).
    pub fn name(self) -> String {
        match self {
            Self::InterfaceAlias => "interface-alias".into(),
            Self::PortComponent => "port-component".into(),
            Self::MacAddress => "mac-address".into(),
            Self::NetworkAddress => "network-address".into(),
            Self::InterfaceName => "interface-name".into(),
            Self::AgentCircuitId => "agent-circuit-id".into(),
            Self::Local => "local".into(),
            Self::Reserved(n) => format!("reserved-{n}"),
        }
    }
}

impl ChassisId {
    /// The ID as text: a MAC as `aa:bb:cc:dd:ee:ff`, a network address as
    /// an IP address, anything else as (lossy UTF-8) text.
    pub fn text(&self) -> String {
        match self.subtype {
            ChassisSubtype::MacAddress => mac_text(&self.id),
            ChassisSubtype::NetworkAddress => network_address_text(&self.id),
            _ => text(&self.id),
        }
    }
}

impl PortId {
    /// The ID as text, as for [`ChassisId::text`].
    pub fn text(&self) -> String {
        match self.subtype {
            PortSubtype::MacAddress => mac_text(&self.id),
            PortSubtype::NetworkAddress => network_address_text(&self.id),
            _ => text(&self.id),
        }
    }
}

impl ManagementAddress {
    /// The address as text: an IP address for families 1 and 2, a MAC for
    /// 6 (802), else the family and the bytes in hex.
    pub fn text(&self) -> String {
        family_address_text(self.family, &self.address)
    }
}

impl Capabilities {
    /// The names of the bits set in `bits` (table 8-4).
    pub fn names(bits: u16) -> Vec<&'static str> {
        const NAMES: [&str; 11] = [
            "other",
            "repeater",
            "bridge",
            "wlan-access-point",
            "router",
            "telephone",
            "docsis-cable-device",
            "station-only",
            "c-vlan",
            "s-vlan",
            "two-port-mac-relay",
        ];
        NAMES
            .iter()
            .enumerate()
            .filter(|(bit, _)| bits & (1 << bit) != 0)
            .map(|(_, name)| *name)
            .collect()
    }
}

impl Lldpdu {
    /// The system name, as text, when sent.
    pub fn system_name(&self) -> Option<String> {
        self.tlvs.iter().find_map(|t| match t {
            Tlv::SystemName(v) => Some(text(v)),
            _ => None,
        })
    }

    /// The port description, as text, when sent.
    pub fn port_description(&self) -> Option<String> {
        self.tlvs.iter().find_map(|t| match t {
            Tlv::PortDescription(v) => Some(text(v)),
            _ => None,
        })
    }

    /// The system description, as text, when sent.
    pub fn system_description(&self) -> Option<String> {
        self.tlvs.iter().find_map(|t| match t {
            Tlv::SystemDescription(v) => Some(text(v)),
            _ => None,
        })
    }

    /// The system capabilities, when sent.
    pub fn capabilities(&self) -> Option<Capabilities> {
        self.tlvs.iter().find_map(|t| match t {
            Tlv::Capabilities(c) => Some(*c),
            _ => None,
        })
    }

    /// Every management address, in order.
    pub fn management_addresses(&self) -> Vec<&ManagementAddress> {
        self.tlvs
            .iter()
            .filter_map(|t| match t {
                Tlv::ManagementAddress(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    /// The port VLAN ID (802.1), when sent and not 0 ("unknown").
    pub fn port_vlan(&self) -> Option<u16> {
        self.tlvs.iter().find_map(|t| match t {
            Tlv::PortVlanId(v) if *v != 0 => Some(*v),
            _ => None,
        })
    }

    /// Every VLAN name (802.1), as VLAN ID and text.
    pub fn vlan_names(&self) -> Vec<(u16, String)> {
        self.tlvs
            .iter()
            .filter_map(|t| match t {
                Tlv::VlanName { vlan, name } => Some((*vlan, text(name))),
                _ => None,
            })
            .collect()
    }

    /// The maximum frame size (802.3), when sent.
    pub fn max_frame_size(&self) -> Option<u16> {
        self.tlvs.iter().find_map(|t| match t {
            Tlv::MaxFrameSize(v) => Some(*v),
            _ => None,
        })
    }
}

/// Bytes as colon-separated lower-case hex: `aa:bb:cc:dd:ee:ff` for a MAC.
pub fn mac_text(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Text as a sender wrote it: lossy UTF-8, trailing NULs (some senders
/// terminate strings) dropped.
fn text(bytes: &[u8]) -> String {
    let end = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// A network address subtype's bytes: the family number, then the address.
fn network_address_text(bytes: &[u8]) -> String {
    match bytes.split_first() {
        Some((family, address)) => family_address_text(*family, address),
        None => String::new(),
    }
}

fn family_address_text(family: u8, address: &[u8]) -> String {
    match (family, address.len()) {
        (1, 4) => Ipv4Addr::new(address[0], address[1], address[2], address[3]).to_string(),
        (2, 16) => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(address);
            Ipv6Addr::from(octets).to_string()
        }
        (6, 6) => mac_text(address),
        _ => format!("family-{family}:{}", mac_text(address)),
    }
}
