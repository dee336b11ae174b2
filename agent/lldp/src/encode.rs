//! [`Frame`] and [`Lldpdu`] to bytes: the TLVs in order, an End TLV, and for
//! a frame the Ethernet header and padding to the 60-byte minimum. Values
//! that no TLV can hold are refused rather than cut.

use crate::model::{Frame, Lldpdu, Tlv};
use crate::parse::TlvKind;
use crate::{ETHERTYPE, OUI_IEEE_8021, OUI_IEEE_8023};

/// Why a value cannot be written as LLDP.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A raw TLV of a type that would break the LLDPDU's structure (0 to 3)
    /// or that does not fit in 7 bits.
    #[error("a raw TLV cannot be of type {0} (only 4 to 127)")]
    RawKind(u8),
    /// A value longer than its TLV allows.
    #[error("the {tlv} TLV's value is {length} bytes; at most {max} fit")]
    TooLong {
        /// The TLV's type.
        tlv: TlvKind,
        /// The value's length.
        length: usize,
        /// The most it may hold.
        max: usize,
    },
    /// A chassis or port ID with no bytes (the TLV needs at least one).
    #[error("the {0} TLV's ID is empty")]
    EmptyId(TlvKind),
}

impl Frame {
    /// The frame's bytes (without FCS), padded with zeros to 60.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::with_capacity(128);
        out.extend_from_slice(&self.destination);
        out.extend_from_slice(&self.source);
        if let Some(tci) = self.tci {
            out.extend_from_slice(&0x8100u16.to_be_bytes());
            out.extend_from_slice(&tci.to_be_bytes());
        }
        out.extend_from_slice(&ETHERTYPE.to_be_bytes());
        out.extend_from_slice(&self.lldpdu.encode()?);
        if out.len() < 60 {
            out.resize(60, 0);
        }
        Ok(out)
    }
}

impl Lldpdu {
    /// The LLDPDU's bytes: chassis ID, port ID, TTL, the other TLVs in
    /// order, End.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::with_capacity(128);
        id(
            &mut out,
            TlvKind::CHASSIS_ID,
            self.chassis_id.subtype.number(),
            &self.chassis_id.id,
        )?;
        id(
            &mut out,
            TlvKind::PORT_ID,
            self.port_id.subtype.number(),
            &self.port_id.id,
        )?;
        tlv(&mut out, TlvKind::TTL, &self.ttl.to_be_bytes(), 2)?;
        for t in &self.tlvs {
            encode_tlv(&mut out, t)?;
        }
        out.extend_from_slice(&[0, 0]);
        Ok(out)
    }
}

fn encode_tlv(out: &mut Vec<u8>, t: &Tlv) -> Result<(), EncodeError> {
    match t {
        Tlv::PortDescription(v) => tlv(out, TlvKind::PORT_DESCRIPTION, v, 255),
        Tlv::SystemName(v) => tlv(out, TlvKind::SYSTEM_NAME, v, 255),
        Tlv::SystemDescription(v) => tlv(out, TlvKind::SYSTEM_DESCRIPTION, v, 255),
        Tlv::Capabilities(c) => {
            let mut v = c.available.to_be_bytes().to_vec();
            v.extend_from_slice(&c.enabled.to_be_bytes());
            tlv(out, TlvKind::CAPABILITIES, &v, 4)
        }
        Tlv::ManagementAddress(m) => {
            let too_long = |length, max| EncodeError::TooLong {
                tlv: TlvKind::MANAGEMENT_ADDRESS,
                length,
                max,
            };
            if m.address.is_empty() || m.address.len() > 31 {
                return Err(too_long(m.address.len(), 31));
            }
            if m.oid.len() > 128 {
                return Err(too_long(m.oid.len(), 128));
            }
            let mut v = vec![(m.address.len() + 1) as u8, m.family];
            v.extend_from_slice(&m.address);
            v.push(m.interface_subtype);
            v.extend_from_slice(&m.interface.to_be_bytes());
            v.push(m.oid.len() as u8);
            v.extend_from_slice(&m.oid);
            tlv(out, TlvKind::MANAGEMENT_ADDRESS, &v, 511)
        }
        Tlv::PortVlanId(vlan) => org(out, OUI_IEEE_8021, 1, &vlan.to_be_bytes()),
        Tlv::PortProtocolVlanId { flags, vlan } => {
            let [a, b] = vlan.to_be_bytes();
            org(out, OUI_IEEE_8021, 2, &[*flags, a, b])
        }
        Tlv::VlanName { vlan, name } => {
            if name.len() > 32 {
                return Err(EncodeError::TooLong {
                    tlv: TlvKind::ORG,
                    length: name.len(),
                    max: 32,
                });
            }
            let mut v = vlan.to_be_bytes().to_vec();
            v.push(name.len() as u8);
            v.extend_from_slice(name);
            org(out, OUI_IEEE_8021, 3, &v)
        }
        Tlv::LinkAggregation(l) => {
            let (oui, subtype) = match l.oui {
                crate::AggregationOui::Ieee8021 => (OUI_IEEE_8021, 7),
                crate::AggregationOui::Ieee8023 => (OUI_IEEE_8023, 3),
            };
            let mut v = vec![l.status];
            v.extend_from_slice(&l.port.to_be_bytes());
            org(out, oui, subtype, &v)
        }
        Tlv::MacPhy(m) => {
            let mut v = vec![m.autoneg];
            v.extend_from_slice(&m.advertised.to_be_bytes());
            v.extend_from_slice(&m.mau_type.to_be_bytes());
            org(out, OUI_IEEE_8023, 1, &v)
        }
        Tlv::MaxFrameSize(size) => org(out, OUI_IEEE_8023, 4, &size.to_be_bytes()),
        Tlv::Org { oui, subtype, info } => org(out, *oui, *subtype, info),
        Tlv::Other { kind, value } => {
            if !(4..=127).contains(kind) {
                return Err(EncodeError::RawKind(*kind));
            }
            tlv(out, TlvKind(*kind), value, 511)
        }
    }
}

/// A chassis or port ID: the subtype, then 1 to 255 bytes.
fn id(out: &mut Vec<u8>, kind: TlvKind, subtype: u8, id: &[u8]) -> Result<(), EncodeError> {
    if id.is_empty() {
        return Err(EncodeError::EmptyId(kind));
    }
    let mut v = vec![subtype];
    v.extend_from_slice(id);
    tlv(out, kind, &v, 256)
}

fn org(out: &mut Vec<u8>, oui: [u8; 3], subtype: u8, info: &[u8]) -> Result<(), EncodeError> {
    let mut v = oui.to_vec();
    v.push(subtype);
    v.extend_from_slice(info);
    tlv(out, TlvKind::ORG, &v, 511)
}

/// One TLV: the 7-bit type and 9-bit length, then the value of at most
/// `max` bytes.
fn tlv(out: &mut Vec<u8>, kind: TlvKind, value: &[u8], max: usize) -> Result<(), EncodeError> {
    if value.len() > max {
        return Err(EncodeError::TooLong {
            tlv: kind,
            length: value.len(),
            max,
        });
    }
    let head = (u16::from(kind.0) << 9) | value.len() as u16;
    out.extend_from_slice(&head.to_be_bytes());
    out.extend_from_slice(value);
    Ok(())
}
