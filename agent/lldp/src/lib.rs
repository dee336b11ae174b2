//! LLDP (IEEE 802.1AB-2016) frames, parsed and encoded, and switch port
//! names normalised, for NADS: a booting node listens to what the switch at
//! the other end of each cable says about itself, and the control service
//! matches the port it names to a system.
//!
//! An LLDPDU is a run of TLVs in an Ethernet frame of type 0x88cc (§8.1): a
//! 7-bit type and a 9-bit length, then that many bytes. The first three are
//! the chassis ID, the port ID and the time to live (§8.5.2-§8.5.4); an End
//! of LLDPDU TLV (type 0, length 0) closes the run, and whatever follows it
//! is padding. This crate reads:
//! - the chassis ID and port ID with every subtype (§8.5.2.2, §8.5.3.2),
//!   reserved ones kept by number;
//! - the TTL, port description, system name and description, system
//!   capabilities, and every management address (§8.5.5-§8.5.9);
//! - the IEEE 802.1 organisational TLVs port VLAN ID, port-and-protocol VLAN
//!   ID, VLAN name and (the pre-2009 place of) link aggregation
//!   (802.1Q-2018 Annex D), and the IEEE 802.3 ones MAC/PHY
//!   configuration/status, link aggregation and maximum frame size
//!   (802.3-2018 Clause 79);
//! - any other TLV (reserved types, other organisations' TLVs such as
//!   LLDP-MED) raw, in the order it came, so that nothing is lost.
//!
//! Rules, from §9.2.7.7 where the standard has one:
//! - a frame whose structure is broken (a TLV running past the end, the
//!   three mandatory TLVs missing or out of order, a mandatory TLV repeated
//!   or of a length the standard forbids, an End TLV with a length) is
//!   refused with a [`ParseError`] that names the TLV and its offset;
//! - an optional TLV whose contents do not fit its type (a capabilities TLV
//!   of 3 bytes, a VLAN name whose length byte lies) is not an error: §9.2.7.7.2
//!   says to ignore that TLV and keep the rest, so it is kept as
//!   [`Tlv::Other`] or [`Tlv::Org`], raw, and a reader that looks for it does
//!   not find it;
//! - a missing End TLV is tolerated (some senders fill the frame exactly).
//!
//! Whatever [`Lldpdu::parse`] accepts, [`Lldpdu::encode`] writes out again,
//! and that parses to the same value (the `lldp_frame` fuzz target checks
//! it). Text (names, descriptions) stays bytes, as the standard does not
//! promise UTF-8; the readers ([`Lldpdu::system_name`]...) give it as text.
//!
//! [`normalise_port`] maps the many spellings of one switch port to one
//! comparable form, and [`port_parts`] splits it into media word and path
//! (the control service matches ports on them); the rules are in [`port`].
//!
//! Why hand-written: of the published Rust LLDP code, one crate is a 0.1
//! "simple parser" of a few TLVs, one lives inside a DHCP server, and one
//! comes with a whole flow-tracking library (and caps the management
//! addresses it keeps); none both parses every chassis and port ID subtype
//! with the 802.1 and 802.3 TLVs and encodes (which round-trip tests and the
//! fuzz target need), and pnet's packet crate has no LLDP at all. The format
//! is small and fixed, and a parser of untrusted bytes that we fuzz
//! ourselves is worth its few hundred lines.
//!
//! Architecture invariant: pure. No I/O, no runtime, no logging; the agent
//! does the listening (`mprov_agent::nads`).

#![warn(missing_docs)]

mod encode;
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub mod fuzz;
mod model;
mod parse;
pub mod port;
#[cfg(test)]
mod tests;

pub use encode::EncodeError;
pub use model::{
    AggregationOui, Capabilities, ChassisId, ChassisSubtype, Frame, LinkAggregation, Lldpdu,
    MacPhy, ManagementAddress, PortId, PortSubtype, Tlv, mac_text,
};
pub use parse::{ParseError, TlvKind};
pub use port::{normalise_port, port_parts};

/// The Ethernet type of LLDP frames.
pub const ETHERTYPE: u16 = 0x88cc;
/// The nearest-bridge group address (§7.1): the one every LLDP agent sends
/// to, and the only one an 802.1D bridge never forwards by default.
pub const NEAREST_BRIDGE: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e];
/// The nearest non-TPMR bridge group address (§7.1).
pub const NEAREST_NON_TPMR_BRIDGE: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x03];
/// The nearest customer bridge group address (§7.1).
pub const NEAREST_CUSTOMER_BRIDGE: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x00];
/// The IEEE 802.1 OUI of organisational TLVs.
pub const OUI_IEEE_8021: [u8; 3] = [0x00, 0x80, 0xc2];
/// The IEEE 802.3 OUI of organisational TLVs.
pub const OUI_IEEE_8023: [u8; 3] = [0x00, 0x12, 0x0f];
