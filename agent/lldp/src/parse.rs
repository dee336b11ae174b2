//! Bytes to [`Frame`] and [`Lldpdu`]. The rules (what is refused, what is
//! kept raw) are in the crate's doc.

use std::fmt;

use crate::model::{
    AggregationOui, Capabilities, ChassisId, ChassisSubtype, Frame, LinkAggregation, Lldpdu,
    MacPhy, ManagementAddress, PortId, PortSubtype, Tlv,
};
use crate::{ETHERTYPE, OUI_IEEE_8021, OUI_IEEE_8023};

/// Why bytes are not an LLDP frame. Offsets count from the start of what
/// was given to the parser (the Ethernet frame for [`Frame::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A chassis ID, port ID or TTL TLV after the first of its kind.
    #[error("a second {tlv} TLV at offset {offset}")]
    Duplicate {
        /// The TLV's type.
        tlv: TlvKind,
        /// Where its header starts.
        offset: usize,
    },
    /// An End of LLDPDU TLV whose length is not 0.
    #[error("the End of LLDPDU TLV at offset {offset} has length {length}, not 0")]
    EndLength {
        /// Where its header starts.
        offset: usize,
        /// The length it gives.
        length: usize,
    },
    /// A mandatory TLV of a length the standard does not allow.
    #[error("the {tlv} TLV at offset {offset} has length {length}, not {allowed}")]
    Length {
        /// The TLV's type.
        tlv: TlvKind,
        /// Where its header starts.
        offset: usize,
        /// The length it gives.
        length: usize,
        /// The lengths allowed, in words.
        allowed: &'static str,
    },
    /// The first three TLVs are not chassis ID, port ID and TTL, in that
    /// order.
    #[error("expected the {expected} TLV at offset {offset}, found {found}")]
    Missing {
        /// The TLV that belongs there.
        expected: TlvKind,
        /// What is there instead (End when the LLDPDU stops).
        found: TlvKind,
        /// Where.
        offset: usize,
    },
    /// An Ethernet frame of another type.
    #[error("Ethernet type {ethertype:#06x} is not LLDP (0x88cc)")]
    NotLldp {
        /// The frame's Ethernet type.
        ethertype: u16,
    },
    /// A TLV whose length runs past the end of the bytes.
    #[error(
        "the {tlv} TLV at offset {offset} has length {length}, but only {available} bytes follow"
    )]
    Overrun {
        /// The TLV's type.
        tlv: TlvKind,
        /// Where its header starts.
        offset: usize,
        /// The length it gives.
        length: usize,
        /// The bytes after its header.
        available: usize,
    },
    /// Too few bytes for a header (Ethernet, or a TLV's 2 bytes).
    #[error("the {what} at offset {offset} is cut short")]
    Truncated {
        /// Which header.
        what: &'static str,
        /// Where it starts.
        offset: usize,
    },
}

/// A TLV type (the 7-bit number), named in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TlvKind(pub u8);

impl TlvKind {
    /// End of LLDPDU.
    pub const END: Self = Self(0);
    /// Chassis ID.
    pub const CHASSIS_ID: Self = Self(1);
    /// Port ID.
    pub const PORT_ID: Self = Self(2);
    /// Time to live.
    pub const TTL: Self = Self(3);
    /// Port description.
    pub const PORT_DESCRIPTION: Self = Self(4);
    /// System name.
    pub const SYSTEM_NAME: Self = Self(5);
    /// System description.
    pub const SYSTEM_DESCRIPTION: Self = Self(6);
    /// System capabilities.
    pub const CAPABILITIES: Self = Self(7);
    /// Management address.
    pub const MANAGEMENT_ADDRESS: Self = Self(8);
    /// Organisationally specific.
    pub const ORG: Self = Self(127);
}

impl fmt::Display for TlvKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            0 => "End of LLDPDU",
            1 => "chassis ID",
            2 => "port ID",
            3 => "time to live",
            4 => "port description",
            5 => "system name",
            6 => "system description",
            7 => "system capabilities",
            8 => "management address",
            127 => "organisationally specific",
            _ => "reserved",
        };
        write!(f, "{name} ({})", self.0)
    }
}

impl Frame {
    /// Parses an Ethernet frame (without FCS): destination, source, an
    /// optional 802.1Q tag, Ethernet type 0x88cc, then the LLDPDU. Never
    /// panics.
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let header = |at: usize| -> Result<u16, ParseError> {
            match bytes.get(at..at + 2) {
                Some(b) => Ok(u16::from_be_bytes([b[0], b[1]])),
                None => Err(ParseError::Truncated {
                    what: "Ethernet header",
                    offset: 0,
                }),
            }
        };
        let mut ethertype = header(12)?;
        let mut at = 14;
        let mut tci = None;
        if ethertype == 0x8100 {
            tci = Some(header(14)?);
            ethertype = header(16)?;
            at = 18;
        }
        if ethertype != ETHERTYPE {
            return Err(ParseError::NotLldp { ethertype });
        }
        let mut destination = [0u8; 6];
        destination.copy_from_slice(&bytes[..6]);
        let mut source = [0u8; 6];
        source.copy_from_slice(&bytes[6..12]);
        Ok(Self {
            destination,
            source,
            tci,
            lldpdu: Lldpdu::parse_at(&bytes[at..], at)?,
        })
    }
}

impl Lldpdu {
    /// Parses an LLDPDU (the bytes after the Ethernet type). Never panics.
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        Self::parse_at(bytes, 0)
    }

    /// Parses, with offsets in errors counted from `base`.
    fn parse_at(bytes: &[u8], base: usize) -> Result<Self, ParseError> {
        const MANDATORY: [TlvKind; 3] = [TlvKind::CHASSIS_ID, TlvKind::PORT_ID, TlvKind::TTL];
        let mut chassis_id = None;
        let mut port_id = None;
        let mut ttl = None;
        let mut tlvs = Vec::new();
        let mut at = 0;
        let mut index = 0;
        while at < bytes.len() {
            let offset = base + at;
            let Some(head) = bytes.get(at..at + 2) else {
                return Err(ParseError::Truncated {
                    what: "TLV header",
                    offset,
                });
            };
            let head = u16::from_be_bytes([head[0], head[1]]);
            let kind = TlvKind((head >> 9) as u8);
            let length = usize::from(head & 0x1ff);
            let available = bytes.len() - at - 2;
            if length > available {
                return Err(ParseError::Overrun {
                    tlv: kind,
                    offset,
                    length,
                    available,
                });
            }
            let value = &bytes[at + 2..at + 2 + length];
            at += 2 + length;
            if let Some(expected) = MANDATORY.get(index)
                && kind != *expected
            {
                return Err(ParseError::Missing {
                    expected: *expected,
                    found: kind,
                    offset,
                });
            }
            index += 1;
            let id_length = |value: &[u8]| {
                if (2..=256).contains(&value.len()) {
                    Ok(())
                } else {
                    Err(ParseError::Length {
                        tlv: kind,
                        offset,
                        length,
                        allowed: "2 to 256",
                    })
                }
            };
            let duplicate = Err(ParseError::Duplicate { tlv: kind, offset });
            match kind.0 {
                0 if length != 0 => return Err(ParseError::EndLength { offset, length }),
                0 => break,
                1 if chassis_id.is_some() => return duplicate,
                1 => {
                    id_length(value)?;
                    chassis_id = Some(ChassisId {
                        subtype: ChassisSubtype::from_number(value[0]),
                        id: value[1..].to_vec(),
                    });
                }
                2 if port_id.is_some() => return duplicate,
                2 => {
                    id_length(value)?;
                    port_id = Some(PortId {
                        subtype: PortSubtype::from_number(value[0]),
                        id: value[1..].to_vec(),
                    });
                }
                3 if ttl.is_some() => return duplicate,
                3 => match value {
                    [a, b] => ttl = Some(u16::from_be_bytes([*a, *b])),
                    _ => {
                        return Err(ParseError::Length {
                            tlv: kind,
                            offset,
                            length,
                            allowed: "2",
                        });
                    }
                },
                kind => tlvs.push(optional(kind, value)),
            }
        }
        match (chassis_id, port_id, ttl) {
            (Some(chassis_id), Some(port_id), Some(ttl)) => Ok(Self {
                chassis_id,
                port_id,
                ttl,
                tlvs,
            }),
            _ => Err(ParseError::Missing {
                expected: MANDATORY[index.min(2)],
                found: TlvKind::END,
                offset: base + at,
            }),
        }
    }
}

/// An optional TLV (type 4 to 127); one whose contents do not fit its type
/// is kept raw (§9.2.7.7.2).
fn optional(kind: u8, value: &[u8]) -> Tlv {
    let raw = || Tlv::Other {
        kind,
        value: value.to_vec(),
    };
    match kind {
        4..=6 if value.len() > 255 => raw(),
        4 => Tlv::PortDescription(value.to_vec()),
        5 => Tlv::SystemName(value.to_vec()),
        6 => Tlv::SystemDescription(value.to_vec()),
        7 => match value {
            [a, b, c, d] => Tlv::Capabilities(Capabilities {
                available: u16::from_be_bytes([*a, *b]),
                enabled: u16::from_be_bytes([*c, *d]),
            }),
            _ => raw(),
        },
        8 => management_address(value).map_or_else(raw, Tlv::ManagementAddress),
        127 => match value {
            [a, b, c, subtype, info @ ..] => org([*a, *b, *c], *subtype, info),
            _ => raw(),
        },
        _ => raw(),
    }
}

/// §8.5.9: address string length (1 + address), family, address, interface
/// numbering subtype, interface number, OID length, OID; the lengths must
/// add up to the TLV's exactly.
fn management_address(value: &[u8]) -> Option<ManagementAddress> {
    let (&string_length, rest) = value.split_first()?;
    let string_length = usize::from(string_length);
    if !(2..=32).contains(&string_length) || rest.len() < string_length + 6 {
        return None;
    }
    let (string, rest) = rest.split_at(string_length);
    let (interface_subtype, rest) = rest.split_first()?;
    let (interface, rest) = rest.split_at(4);
    let (&oid_length, oid) = rest.split_first()?;
    if oid.len() != usize::from(oid_length) || oid.len() > 128 {
        return None;
    }
    Some(ManagementAddress {
        family: string[0],
        address: string[1..].to_vec(),
        interface_subtype: *interface_subtype,
        interface: u32::from_be_bytes([interface[0], interface[1], interface[2], interface[3]]),
        oid: oid.to_vec(),
    })
}

/// An organisationally specific TLV: the 802.1 and 802.3 ones we know, of
/// exactly their length, else raw.
fn org(oui: [u8; 3], subtype: u8, info: &[u8]) -> Tlv {
    let aggregation = |oui, info: &[u8]| match info {
        [status, a, b, c, d] => Some(Tlv::LinkAggregation(LinkAggregation {
            oui,
            status: *status,
            port: u32::from_be_bytes([*a, *b, *c, *d]),
        })),
        _ => None,
    };
    let known = match (oui, subtype, info) {
        (OUI_IEEE_8021, 1, [a, b]) => Some(Tlv::PortVlanId(u16::from_be_bytes([*a, *b]))),
        (OUI_IEEE_8021, 2, [flags, a, b]) => Some(Tlv::PortProtocolVlanId {
            flags: *flags,
            vlan: u16::from_be_bytes([*a, *b]),
        }),
        (OUI_IEEE_8021, 3, [a, b, length, name @ ..])
            if usize::from(*length) == name.len() && name.len() <= 32 =>
        {
            Some(Tlv::VlanName {
                vlan: u16::from_be_bytes([*a, *b]),
                name: name.to_vec(),
            })
        }
        (OUI_IEEE_8021, 7, info) => aggregation(AggregationOui::Ieee8021, info),
        (OUI_IEEE_8023, 1, [autoneg, a, b, c, d]) => Some(Tlv::MacPhy(MacPhy {
            autoneg: *autoneg,
            advertised: u16::from_be_bytes([*a, *b]),
            mau_type: u16::from_be_bytes([*c, *d]),
        })),
        (OUI_IEEE_8023, 3, info) => aggregation(AggregationOui::Ieee8023, info),
        (OUI_IEEE_8023, 4, [a, b]) => Some(Tlv::MaxFrameSize(u16::from_be_bytes([*a, *b]))),
        _ => None,
    };
    known.unwrap_or_else(|| Tlv::Org {
        oui,
        subtype,
        info: info.to_vec(),
    })
}
