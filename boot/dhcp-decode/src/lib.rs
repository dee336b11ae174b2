//! dhcproto's DHCPv4 decode behind a guard, for the job server's DHCP
//! server (`mprov-dhcp`) and the agent's DHCP client alike: both decode
//! untrusted datagrams from the network.
//!
//! dhcproto 0.15 has `debug_assert!`s on the lengths of a few options (80,
//! 94, 152-155, and 81's minimum) and subtracts from the length of 81
//! (and of 151, after reading its first byte) unchecked, so a crafted
//! length panics a debug or fuzzing build, or wraps in a release one. It
//! checks the length of a run of options with one code, which it joins
//! (RFC 3396), not of each. Of other fixed-size options it reads the
//! bytes it expects whatever the length says, or stops decoding options
//! at a wrong one. And its `Message::chaddr` slices the 16-byte field by
//! `hlen` unchecked: an `hlen` above 16 panics any build, release too, on
//! first use. [`decode`] refuses, on the raw bytes first, an `hlen` above
//! 16 and any option (run) whose length dhcproto does not expect, and
//! still decodes under `catch_unwind`, so that no packet, whatever
//! dhcproto does with it, panics the caller where panics unwind.
//!
//! A pure library: no runtime, no I/O, no logging (the caller logs the
//! [`DecodeError`]), so the static agent takes it without the job server's
//! dependencies.

#![warn(missing_docs)]

use dhcproto::Decodable;
use dhcproto::v4::Message;

/// Why a datagram was not decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The hardware address length (`hlen`) is above the 16 bytes of
    /// `chaddr`.
    #[error("hlen {0} is longer than chaddr's 16 bytes")]
    HardwareLength(u8),
    /// An option's length is one dhcproto would trip over.
    #[error("option {code} has a length of {len}, which no valid packet has")]
    OptionLength {
        /// The option's code.
        code: u8,
        /// Its length byte.
        len: u8,
    },
    /// dhcproto refused the bytes.
    #[error("malformed DHCP packet")]
    Malformed(#[source] dhcproto::error::DecodeError),
    /// dhcproto panicked on the bytes (a length the guard does not know
    /// of yet): worth a warning.
    #[error("dhcproto panicked on the packet")]
    Panicked,
}

/// Decodes a DHCPv4 datagram: `hlen` at most 16, no [`bad_option`], then
/// dhcproto under `catch_unwind`.
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    if let Some(&hlen) = bytes.get(2)
        && usize::from(hlen) > MAX_HLEN
    {
        return Err(DecodeError::HardwareLength(hlen));
    }
    if let Some((code, len)) = bad_option(bytes) {
        return Err(DecodeError::OptionLength { code, len });
    }
    match std::panic::catch_unwind(|| Message::from_bytes(bytes)) {
        Ok(Ok(msg)) => Ok(msg),
        Ok(Err(err)) => Err(DecodeError::Malformed(err)),
        Err(_) => Err(DecodeError::Panicked),
    }
}

/// The size of the `chaddr` field.
const MAX_HLEN: usize = 16;

/// Walks the options area (after the 236-byte header and the 4-byte magic
/// cookie) as dhcproto does and returns the first option, code and length,
/// whose length dhcproto does not expect. A truncated area is left to
/// dhcproto, which reports it as an error.
///
/// dhcproto concatenates a run of options with the same code (RFC 3396,
/// long options) before it decodes the value, so the length checked is the
/// run's total: two option 154 of length 4 in a row are one of length 8,
/// which trips its `debug_assert!(len == 4)` (found by the `agent_dhcp`
/// fuzzer). A run's total may exceed 255; it is reported saturated.
pub fn bad_option(bytes: &[u8]) -> Option<(u8, u8)> {
    let mut rest = bytes.get(240..).unwrap_or(&[]);
    // The run being read: its code and total length.
    let mut run: Option<(u8, usize)> = None;
    loop {
        match rest {
            [code @ 1..=254, len, tail @ ..] => {
                let len_here = usize::from(*len);
                run = match run {
                    Some((prev, total)) if prev == *code => Some((prev, total + len_here)),
                    Some((prev, total)) => {
                        if !expected_length(prev).allows(total) {
                            return Some((prev, saturated(total)));
                        }
                        Some((*code, len_here))
                    }
                    None => Some((*code, len_here)),
                };
                rest = tail.get(len_here..).unwrap_or(&[]);
            }
            // A pad or the end closes a run; so does a truncated area or
            // its end, where dhcproto decodes what it has read.
            _ => {
                if let Some((prev, total)) = run.take()
                    && !expected_length(prev).allows(total)
                {
                    return Some((prev, saturated(total)));
                }
                match rest {
                    [0, tail @ ..] => rest = tail,
                    _ => return None,
                }
            }
        }
    }
}

fn saturated(len: usize) -> u8 {
    u8::try_from(len).unwrap_or(u8::MAX)
}

/// The lengths dhcproto 0.15 expects of an option's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Length {
    /// Exactly this many bytes.
    Exactly(usize),
    /// A multiple of this many bytes (none included).
    MultipleOf(usize),
    /// A multiple of this many bytes, at least one.
    ListOf(usize),
    /// At least this many bytes.
    AtLeast(usize),
}

impl Length {
    fn allows(self, len: usize) -> bool {
        match self {
            Length::Exactly(n) => len == n,
            Length::MultipleOf(n) => len.is_multiple_of(n),
            Length::ListOf(n) => len >= n && len.is_multiple_of(n),
            Length::AtLeast(n) => len >= n,
        }
    }
}

/// The length dhcproto 0.15's `decode_inner` expects of option `code`'s
/// value, read off it: `read_ipv4(len)` wants 4 bytes (and stops decoding
/// the options on any other length), `read_ipv4s` a multiple of 4,
/// `read_pair_ipv4s` of 8; `read_u32`, `read_u16`, `read_u8`, `read_bool`
/// read 4, 2, 1, 1 bytes whatever the length says; 80, 94 and 152-155
/// `debug_assert!` theirs; 81 and 151 subtract 3 and 1 from theirs. A
/// fixed-size option with any other length is malformed (RFC 2132 and
/// its successors give each its size), so the packet is refused rather
/// than half-read. The rest (strings, byte strings, domain lists, the
/// relay agent's and the classless routes' own encodings) take any length.
fn expected_length(code: u8) -> Length {
    use Length::{AtLeast, Exactly, ListOf, MultipleOf};
    use dhcproto::v4::OptionCode as C;
    match C::from(code) {
        C::SubnetMask
        | C::SwapServer
        | C::BroadcastAddr
        | C::RouterSolicitationAddr
        | C::RequestedIpAddress
        | C::ServerIdentifier
        | C::SubnetSelection
        | C::TFTPServerAddress => Exactly(4),
        C::Router
        | C::TimeServer
        | C::NameServer
        | C::DomainNameServer
        | C::LogServer
        | C::QuoteServer
        | C::LprServer
        | C::ImpressServer
        | C::ResourceLocationServer
        | C::NisServers
        | C::NtpServers
        | C::NetBiosNameServers
        | C::NetBiosDatagramDistributionServer
        | C::XFontServer
        | C::XDisplayManager
        | C::NispServers
        | C::MobileIpHomeAgent
        | C::SmtpServer
        | C::Pop3Server
        | C::NntpServer
        | C::WwwServer
        | C::DefaultFingerServer
        | C::IrcServer
        | C::StreetTalkServer
        | C::StreetTalkDirectoryAssistance
        | C::BcmsControllerAddrs
        | C::AssociatedIp => MultipleOf(4),
        C::PolicyFilter | C::StaticRoutingTable => MultipleOf(8),
        // `chunks_exact(2)` would drop an odd byte.
        C::PathMtuPlateauTable => MultipleOf(2),
        C::TimeOffset
        | C::PathMtuAgingTimeout
        | C::ArpCacheTimeout
        | C::TcpKeepaliveInterval
        | C::AddressLeaseTime
        | C::Renewal
        | C::Rebinding
        | C::ClientLastTransactionTime
        | C::Ipv6OnlyPreferred
        | C::BulkLeaseQueryBaseTime
        | C::BulkLeasQueryStartTimeOfState
        | C::BulkLeaseQueryQueryStartTime
        | C::BulkLeaseQueryQueryEndTime => Exactly(4),
        C::BootFileSize | C::MaxDatagramSize | C::InterfaceMtu | C::MaxMessageSize => Exactly(2),
        // RFC 4578 makes 93 a list of architecture types; dhcproto keeps
        // the first. A PXE client may list several: let it.
        C::ClientSystemArchitecture => ListOf(2),
        C::IpForwarding
        | C::NonLocalSrcRouting
        | C::DefaultIpTtl
        | C::AllSubnetsLocal
        | C::PerformMaskDiscovery
        | C::MaskSupplier
        | C::PerformRouterDiscovery
        | C::TrailerEncapsulated
        | C::EthernetEncapsulation
        | C::DefaultTcpTtl
        | C::TcpKeepaliveGarbage
        | C::NetBiosNodeType
        | C::OptionOverload
        | C::MessageType
        | C::DisableSLAAC
        | C::BulkLeaseQueryDhcpState
        | C::BulkLeaseQueryDataSource => Exactly(1),
        C::RapidCommit => Exactly(0),
        C::ClientNetworkInterface => Exactly(3),
        C::ClientFQDN => AtLeast(3),
        C::BulkLeaseQueryStatusCode => AtLeast(1),
        _ => AtLeast(0),
    }
}

#[cfg(test)]
mod tests {
    use dhcproto::Encodable;
    use dhcproto::v4::{DhcpOption, MessageType};

    use super::*;

    /// A DISCOVER with `extra` inserted before its end option.
    fn with_option(extra: &[u8]) -> Vec<u8> {
        let mut msg = Message::default();
        msg.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Discover));
        let mut bytes = msg.to_vec().expect("encodes");
        let end = bytes.iter().rposition(|&b| b == 255).expect("end option");
        bytes.truncate(end);
        bytes.extend_from_slice(extra);
        bytes.push(255);
        bytes
    }

    const CRAFTED: [&[u8]; 6] = [
        &[94, 2, 1, 2],
        &[80, 1, 0],
        &[81, 1, 0],
        &[81, 0],
        &[152, 1, 0],
        &[151, 0],
    ];

    #[test]
    fn lengths_dhcproto_trips_over_are_refused() {
        for bad in CRAFTED {
            let err = decode(&with_option(bad)).expect_err("refused");
            assert!(
                matches!(err, DecodeError::OptionLength { code, len } if code == bad[0] && len == bad[1]),
                "{bad:?}: {err:?}"
            );
        }
        // The same options with the lengths dhcproto expects decode.
        for good in [&[94u8, 3, 1, 2, 3][..], &[80, 0], &[81, 3, 0, 0, 0]] {
            decode(&with_option(good)).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
        // Padding is skipped, and the walk stops at the end option.
        let mut padded = with_option(&[0, 0]);
        padded.extend_from_slice(&[81, 1, 0]);
        assert!(decode(&padded).is_ok());
    }

    /// Without the guard, each crafted packet panics dhcproto in a build
    /// with debug assertions (as the tests' and the fuzzer's are): the
    /// guard is what stands between them and the caller.
    #[cfg(debug_assertions)]
    #[test]
    fn unguarded_dhcproto_panics_on_them() {
        // 151 of length 0 fails on reading its first byte before the
        // subtraction: refused all the same, as the job server always has.
        for bad in CRAFTED.into_iter().filter(|bad| bad[0] != 151) {
            let bytes = with_option(bad);
            let unguarded = std::panic::catch_unwind(|| Message::from_bytes(&bytes));
            assert!(unguarded.is_err(), "{bad:?} did not panic dhcproto");
        }
    }

    /// Found by the `agent_dhcp` fuzzer: a reply with `hlen` 86 decodes,
    /// and `chaddr()` then panics even in a release build.
    #[test]
    fn a_hardware_length_beyond_chaddr_is_refused() {
        let mut bytes = with_option(&[]);
        bytes[2] = 17;
        assert!(matches!(
            decode(&bytes),
            Err(DecodeError::HardwareLength(17))
        ));
        let unguarded = Message::from_bytes(&bytes).expect("dhcproto decodes it");
        assert!(std::panic::catch_unwind(|| unguarded.chaddr().len()).is_err());
        bytes[2] = 16;
        assert_eq!(decode(&bytes).expect("decodes").chaddr().len(), 16);
    }

    /// A wrong length for each fixed-size option dhcproto decodes: 4-byte
    /// addresses and numbers, 2-byte numbers, flags and bytes, lists.
    const WRONG_LENGTHS: [(u8, u8); 24] = [
        (1, 3),    // subnet mask
        (2, 6),    // time offset
        (3, 5),    // routers: a multiple of 4
        (21, 12),  // policy filter: a multiple of 8
        (25, 3),   // path MTU plateau table: a multiple of 2
        (13, 1),   // boot file size
        (19, 0),   // IP forwarding
        (26, 4),   // interface MTU
        (50, 5),   // requested address
        (51, 2),   // lease time
        (52, 2),   // overload
        (46, 2),   // NetBIOS node type
        (54, 8),   // server identifier
        (57, 1),   // max message size
        (58, 8),   // renewal
        (59, 10),  // rebinding
        (80, 1),   // rapid commit
        (93, 0),   // client architecture: a list of 2-byte types
        (93, 3),   //
        (94, 4),   // client network interface
        (118, 16), // subnet selection
        (150, 3),  // TFTP server address
        (153, 8),  // bulk lease query start time of state
        (154, 2),  // bulk lease query query start time
    ];

    #[test]
    fn fixed_size_options_with_another_length_are_refused() {
        for (code, len) in WRONG_LENGTHS {
            let mut opt = vec![code, len];
            opt.resize(2 + usize::from(len), 0);
            let err = decode(&with_option(&opt)).expect_err("refused");
            assert!(
                matches!(err, DecodeError::OptionLength { code: c, len: l } if c == code && l == len),
                "{code}/{len}: {err:?}"
            );
        }
        // The lengths dhcproto expects pass, lists of any count.
        for good in [
            &[59u8, 4, 0, 0, 1, 0][..],
            &[3, 8, 10, 0, 0, 1, 10, 0, 0, 2],
            &[3, 0],
            &[93, 4, 0, 7, 0, 9],
            &[57, 2, 5, 220],
            &[154, 4, 0, 0, 0, 1],
        ] {
            decode(&with_option(good)).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
    }

    /// dhcproto decodes each option's value from its own stated bytes, so
    /// a fixed-size option that states more (59 of length 10) does not
    /// throw its walk out of step; it just reads a prefix. Refused all the
    /// same: no sender means it.
    #[test]
    fn dhcproto_reads_a_prefix_of_a_longer_fixed_size_option() {
        let bytes = with_option(&[59, 10, 0, 0, 1, 0, 9, 9, 9, 9, 9, 9]);
        let unguarded = Message::from_bytes(&bytes).expect("dhcproto decodes it");
        assert!(matches!(
            unguarded.opts().get(dhcproto::v4::OptionCode::Rebinding),
            Some(DhcpOption::Rebinding(256))
        ));
        assert!(unguarded.opts().msg_type().is_some());
        assert!(matches!(
            decode(&bytes),
            Err(DecodeError::OptionLength { code: 59, len: 10 })
        ));
    }

    /// dhcproto joins a run of options with one code (RFC 3396) and checks
    /// the run's length: two 154s of 4 bytes are one of 8, two of 2 one
    /// of 4.
    #[test]
    fn a_run_of_one_option_is_checked_as_a_whole() {
        let split = with_option(&[154, 2, 0, 0, 154, 2, 0, 1]);
        assert!(bad_option(&split).is_none());
        decode(&split).expect("a split 154 of 4 bytes decodes");
        let doubled = with_option(&[154, 4, 0, 0, 0, 1, 154, 4, 0, 0, 0, 2]);
        assert!(matches!(
            decode(&doubled),
            Err(DecodeError::OptionLength { code: 154, len: 8 })
        ));
        // A pad between them ends the run: two 154s, the second kept.
        let padded = with_option(&[154, 4, 0, 0, 0, 1, 0, 154, 4, 0, 0, 0, 2]);
        decode(&padded).expect("two runs of 4 bytes decode");
        // A run may pass 255 bytes: reported as 255.
        let mut long = Vec::new();
        for _ in 0..2 {
            long.extend_from_slice(&[1, 200]);
            long.extend_from_slice(&[0; 200]);
        }
        assert!(matches!(
            decode(&with_option(&long)),
            Err(DecodeError::OptionLength { code: 1, len: 255 })
        ));
        #[cfg(debug_assertions)]
        {
            let unguarded = std::panic::catch_unwind(|| Message::from_bytes(&doubled));
            assert!(unguarded.is_err(), "two 154s of 4 did not panic dhcproto");
        }
    }

    /// The `agent_dhcp` fuzzer's crashes (its first 4 bytes pick the
    /// client's transaction id; the packet follows): a reply with two
    /// option 154s of 4 bytes in a row (dhcproto's `debug_assert!(len == 4)`
    /// on the run of 8), and one with `hlen` 86.
    const CRASH_RUN: &[u8] = include_bytes!(
        "../../../tests/fuzz/corpus/agent_dhcp/crash-59bbed0bb7598b2365b19112c7871ea8cfbc0ca2"
    );
    const CRASH_HLEN: &[u8] = include_bytes!(
        "../../../tests/fuzz/corpus/agent_dhcp/crash-e7233a6e6653bf1f9b3c311017d7dd13d3846251"
    );

    #[test]
    fn the_fuzzers_crashes_are_refused() {
        // Its first wrong length is option 57 of 57 bytes, read as 2 by
        // dhcproto; the 154s come later.
        let run = &CRASH_RUN[4..];
        assert!(matches!(
            decode(run),
            Err(DecodeError::OptionLength { code: 57, len: 57 })
        ));
        let hlen = &CRASH_HLEN[4..];
        assert!(matches!(decode(hlen), Err(DecodeError::HardwareLength(86))));
        // Unguarded, dhcproto panics on the first (debug assertions on),
        // and decodes the second into a message whose `chaddr()` panics.
        #[cfg(debug_assertions)]
        assert!(std::panic::catch_unwind(|| Message::from_bytes(run)).is_err());
        let unguarded = Message::from_bytes(hlen).expect("dhcproto decodes it");
        assert!(std::panic::catch_unwind(|| unguarded.chaddr().len()).is_err());
    }

    #[test]
    fn short_and_truncated_datagrams_are_errors() {
        assert!(matches!(decode(&[]), Err(DecodeError::Malformed(_))));
        assert!(matches!(decode(&[2; 100]), Err(DecodeError::Malformed(_))));
        let mut truncated = with_option(&[]);
        truncated.pop();
        truncated.extend_from_slice(&[81]);
        assert!(bad_option(&truncated).is_none());
        assert!(!matches!(
            decode(&truncated),
            Err(DecodeError::OptionLength { .. } | DecodeError::Panicked)
        ));
    }
}
