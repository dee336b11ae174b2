//! dhcproto's DHCPv4 decode behind a guard, for the job server's DHCP
//! server (`mprov-dhcp`) and the agent's DHCP client alike: both decode
//! untrusted datagrams from the network.
//!
//! dhcproto 0.15 has `debug_assert!`s on the lengths of a few options (80,
//! 81, 94, 152-155) and subtracts from the length of 81 (and of 151, after
//! reading its first byte) unchecked, so a crafted length panics a debug or
//! fuzzing build, or wraps in a release one. And its `Message::chaddr`
//! slices the 16-byte field by `hlen` unchecked: an `hlen` above 16 panics
//! any build, release too, on first use. [`decode`] checks those lengths on the raw
//! bytes first, and still decodes under `catch_unwind`, so that no packet,
//! whatever dhcproto does with it, panics the caller where panics unwind.
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
/// cookie) and returns the first option, code and length, whose length
/// dhcproto would trip over. A truncated area is left to dhcproto, which
/// reports it as an error.
pub fn bad_option(bytes: &[u8]) -> Option<(u8, u8)> {
    let mut rest = bytes.get(240..).unwrap_or(&[]);
    while let [code, tail @ ..] = rest {
        match *code {
            0 => rest = tail,
            255 => return None,
            code => {
                let [len, tail @ ..] = tail else {
                    return None;
                };
                let ok = match code {
                    80 => *len == 0,
                    94 => *len == 3,
                    81 => *len >= 3,
                    151 => *len >= 1,
                    152..=155 => *len == 4,
                    _ => true,
                };
                if !ok {
                    return Some((code, *len));
                }
                rest = tail.get(usize::from(*len)..).unwrap_or(&[]);
            }
        }
    }
    None
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
