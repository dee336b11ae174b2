//! The Neighbor Discovery codec for the two messages the advertiser needs:
//! Router Solicitation (RFC 4861 §4.1) and Router Advertisement (§4.2), with
//! their options (§4.6).
//!
//! Bytes here are the ICMPv6 message only, from the type byte on, as a raw
//! ICMPv6 socket delivers and takes them: the kernel strips the IPv6 header,
//! verifies the checksum of what it delivers, and computes the checksum of
//! what we send (it always does for `IPPROTO_ICMPV6` raw sockets, RFC 3542
//! §3.1), so [`Message::encode`] leaves the checksum zero and
//! [`Message::decode`] does not look at it.
//!
//! Decoding is total: any byte string gives a message or a small
//! [`DecodeError`], never a panic, and `decode(encode(m)) == m` for every `m`
//! that `decode` returns. Fields that receivers must ignore (the Reserved
//! fields) are not kept, so they are zero when re-encoded; options a
//! receiver does not know, or known ones with an unexpected length, are kept
//! as [`NdOption::Other`] so that they round-trip unchanged (§4.6: "receivers
//! MUST silently ignore any options they do not recognize").

use std::net::Ipv6Addr;

/// ICMPv6 type of a Router Solicitation.
pub const ROUTER_SOLICITATION: u8 = 133;
/// ICMPv6 type of a Router Advertisement.
pub const ROUTER_ADVERTISEMENT: u8 = 134;

/// RA flag: addresses are available from DHCPv6 ("Managed").
pub const FLAG_MANAGED: u8 = 0x80;
/// RA flag: other configuration is available from DHCPv6.
pub const FLAG_OTHER: u8 = 0x40;
/// Prefix Information flag: the prefix is on-link (L).
pub const PREFIX_ON_LINK: u8 = 0x80;
/// Prefix Information flag: hosts may form addresses in it (A, RFC 4862).
pub const PREFIX_AUTONOMOUS: u8 = 0x40;

/// Option type: Source Link-Layer Address.
const OPT_SOURCE_LINK_LAYER: u8 = 1;
/// Option type: Prefix Information.
const OPT_PREFIX: u8 = 3;
/// Option type: MTU.
const OPT_MTU: u8 = 5;
/// Length of the fixed part of a Router Solicitation (type, code, checksum,
/// reserved).
const RS_HEADER: usize = 8;
/// Length of the fixed part of a Router Advertisement.
const RA_HEADER: usize = 16;
/// The most data an option can carry: 255 units of 8 bytes, less type and
/// length.
const MAX_OPTION_DATA: usize = 255 * 8 - 2;

/// Why bytes are not a Router Solicitation or Advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// The ICMPv6 code is not 0 (§6.1.1, §6.1.2).
    BadCode,
    /// An option's length runs past the end of the message.
    OptionOverrun,
    /// Shorter than the message's fixed part.
    Truncated,
    /// Neither a Router Solicitation nor an Advertisement.
    UnknownType,
    /// An option with length 0 (§4.6: "Nodes MUST silently discard an ND
    /// packet that contains an option with length zero").
    ZeroLengthOption,
}

impl DecodeError {
    /// A short name, for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadCode => "bad_code",
            Self::OptionOverrun => "option_overrun",
            Self::Truncated => "truncated",
            Self::UnknownType => "unknown_type",
            Self::ZeroLengthOption => "zero_length_option",
        }
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for DecodeError {}

/// A Router Solicitation or Advertisement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Type 134.
    RouterAdvertisement(RouterAdvertisement),
    /// Type 133.
    RouterSolicitation(RouterSolicitation),
}

/// A Router Solicitation (§4.1): only options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouterSolicitation {
    /// The options, in wire order.
    pub options: Vec<NdOption>,
}

/// A Router Advertisement (§4.2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouterAdvertisement {
    /// Hop limit hosts should use; 0 leaves theirs unchanged.
    pub cur_hop_limit: u8,
    /// The flags byte as sent: [`FLAG_MANAGED`], [`FLAG_OTHER`], and bits of
    /// later RFCs (home agent, router preference, proxy).
    pub flags: u8,
    /// Seconds this router may be a default router; 0: never.
    pub router_lifetime: u16,
    /// Milliseconds; 0: unspecified.
    pub reachable_time: u32,
    /// Milliseconds; 0: unspecified.
    pub retrans_timer: u32,
    /// The options, in wire order.
    pub options: Vec<NdOption>,
}

/// One Neighbor Discovery option (§4.6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NdOption {
    /// MTU (type 5, length 1).
    Mtu(u32),
    /// Any other option, or a known one of an unexpected length: the bytes
    /// after type and length.
    Other {
        /// The option type.
        kind: u8,
        /// Its data, a multiple of 8 bytes less 2.
        data: Vec<u8>,
    },
    /// Prefix Information (type 3, length 4).
    Prefix(PrefixInformation),
    /// Source Link-Layer Address (type 1): the address and any padding (6
    /// bytes on Ethernet).
    SourceLinkLayer(Vec<u8>),
}

/// A Prefix Information option (§4.6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixInformation {
    /// Significant leading bits of `prefix`.
    pub prefix_len: u8,
    /// [`PREFIX_ON_LINK`], [`PREFIX_AUTONOMOUS`] and any other bits as sent.
    pub flags: u8,
    /// Seconds the prefix stays valid for on-link determination.
    pub valid_lifetime: u32,
    /// Seconds addresses formed in it stay preferred.
    pub preferred_lifetime: u32,
    /// The prefix (bits past `prefix_len` as sent).
    pub prefix: Ipv6Addr,
}

impl Message {
    /// Decodes an ICMPv6 message (type byte first).
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let (&kind, rest) = bytes.split_first().ok_or(DecodeError::Truncated)?;
        let header = match kind {
            ROUTER_SOLICITATION => RS_HEADER,
            ROUTER_ADVERTISEMENT => RA_HEADER,
            _ => return Err(DecodeError::UnknownType),
        };
        if bytes.len() < header {
            return Err(DecodeError::Truncated);
        }
        if rest[0] != 0 {
            return Err(DecodeError::BadCode);
        }
        let options = decode_options(&bytes[header..])?;
        Ok(match kind {
            ROUTER_SOLICITATION => Self::RouterSolicitation(RouterSolicitation { options }),
            _ => Self::RouterAdvertisement(RouterAdvertisement {
                cur_hop_limit: bytes[4],
                flags: bytes[5],
                router_lifetime: u16::from_be_bytes([bytes[6], bytes[7]]),
                reachable_time: be32(&bytes[8..12]),
                retrans_timer: be32(&bytes[12..16]),
                options,
            }),
        })
    }

    /// Encodes the message with a zero checksum (the kernel fills it in).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        let options = match self {
            Self::RouterSolicitation(rs) => {
                out.extend_from_slice(&[ROUTER_SOLICITATION, 0, 0, 0, 0, 0, 0, 0]);
                &rs.options
            }
            Self::RouterAdvertisement(ra) => {
                out.extend_from_slice(&[ROUTER_ADVERTISEMENT, 0, 0, 0]);
                out.push(ra.cur_hop_limit);
                out.push(ra.flags);
                out.extend_from_slice(&ra.router_lifetime.to_be_bytes());
                out.extend_from_slice(&ra.reachable_time.to_be_bytes());
                out.extend_from_slice(&ra.retrans_timer.to_be_bytes());
                &ra.options
            }
        };
        for option in options {
            option.encode_into(&mut out);
        }
        out
    }
}

impl RouterSolicitation {
    /// The Source Link-Layer Address option's data, if the message has one.
    pub fn source_link_layer(&self) -> Option<&[u8]> {
        self.options.iter().find_map(|o| match o {
            NdOption::SourceLinkLayer(addr) => Some(addr.as_slice()),
            _ => None,
        })
    }
}

impl NdOption {
    /// Appends the option: type, length in units of 8 bytes, data padded
    /// with zeros to a whole unit. Data longer than an option can carry
    /// (2038 bytes) is cut there; [`Message::decode`] never returns such.
    fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        match self {
            Self::Mtu(mtu) => {
                out.extend_from_slice(&[OPT_MTU, 1, 0, 0]);
                out.extend_from_slice(&mtu.to_be_bytes());
            }
            Self::Prefix(p) => {
                out.extend_from_slice(&[OPT_PREFIX, 4, p.prefix_len, p.flags]);
                out.extend_from_slice(&p.valid_lifetime.to_be_bytes());
                out.extend_from_slice(&p.preferred_lifetime.to_be_bytes());
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&p.prefix.octets());
            }
            Self::SourceLinkLayer(data) => raw_option(out, OPT_SOURCE_LINK_LAYER, data),
            Self::Other { kind, data } => raw_option(out, *kind, data),
        }
        debug_assert_eq!((out.len() - start) % 8, 0);
    }
}

fn raw_option(out: &mut Vec<u8>, kind: u8, data: &[u8]) {
    let data = &data[..data.len().min(MAX_OPTION_DATA)];
    let units = (data.len() + 2).div_ceil(8);
    // At most 255 by the cut above.
    out.extend_from_slice(&[kind, u8::try_from(units).unwrap_or(u8::MAX)]);
    out.extend_from_slice(data);
    out.resize(out.len() + units * 8 - 2 - data.len(), 0);
}

/// Decodes the options area: type-length-value in units of 8 bytes, which
/// must fill it exactly.
fn decode_options(mut bytes: &[u8]) -> Result<Vec<NdOption>, DecodeError> {
    let mut options = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < 2 {
            return Err(DecodeError::OptionOverrun);
        }
        let (kind, units) = (bytes[0], usize::from(bytes[1]));
        if units == 0 {
            return Err(DecodeError::ZeroLengthOption);
        }
        let len = units * 8;
        if bytes.len() < len {
            return Err(DecodeError::OptionOverrun);
        }
        let data = &bytes[2..len];
        options.push(match (kind, units) {
            (OPT_SOURCE_LINK_LAYER, _) => NdOption::SourceLinkLayer(data.to_vec()),
            (OPT_MTU, 1) => NdOption::Mtu(be32(&data[2..6])),
            (OPT_PREFIX, 4) => {
                let mut prefix = [0u8; 16];
                prefix.copy_from_slice(&data[14..30]);
                NdOption::Prefix(PrefixInformation {
                    prefix_len: data[0],
                    flags: data[1],
                    valid_lifetime: be32(&data[2..6]),
                    preferred_lifetime: be32(&data[6..10]),
                    prefix: Ipv6Addr::from(prefix),
                })
            }
            _ => NdOption::Other {
                kind,
                data: data.to_vec(),
            },
        });
        bytes = &bytes[len..];
    }
    Ok(options)
}

/// A big-endian u32 from exactly four bytes (callers slice them).
fn be32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    u32::from_be_bytes(a)
}
