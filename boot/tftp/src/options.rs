//! Option negotiation (RFC 2347) for blksize (RFC 2348), timeout and tsize
//! (RFC 2349) and windowsize (RFC 7440).
//!
//! The rules, from the RFCs:
//! - Option names are case-insensitive; unknown options are ignored and left
//!   out of the OACK (RFC 2347).
//! - blksize is 8..=65464; the server may answer with a smaller value
//!   (RFC 2348). We cap it at [`Limits::max_blksize`].
//! - timeout is 1..=255 seconds and must be echoed unchanged (RFC 2349).
//! - tsize in an RRQ is 0 and is answered with the file size (RFC 2349).
//! - windowsize is 1..=65535; the server may answer with a smaller value
//!   (RFC 7440). We cap it at [`Limits::max_windowsize`].
//!
//! A value that is out of range or not a number makes us ignore that option
//! rather than refuse the transfer: the client then falls back to the RFC 1350
//! default, which every client supports.
//!
//! When no option is accepted, no OACK is sent and the transfer starts with
//! DATA block 1 (RFC 2347).

use std::time::Duration;

use crate::codec::TftpOption;

/// Default block size of RFC 1350.
pub const DEFAULT_BLKSIZE: u16 = 512;
/// Smallest block size RFC 2348 allows.
pub const MIN_BLKSIZE: u16 = 8;
/// Largest block size RFC 2348 allows.
pub const MAX_BLKSIZE: u16 = 65464;

/// Server-side caps on what a client may negotiate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest block size granted.
    pub max_blksize: u16,
    /// Largest window granted.
    pub max_windowsize: u16,
}

/// The outcome of negotiation for one transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Block size in bytes.
    pub blksize: u16,
    /// Blocks sent before waiting for an ACK.
    pub windowsize: u16,
    /// Retransmission timeout the client asked for, if any.
    pub timeout: Option<Duration>,
    /// The options to put in the OACK, in the client's order; empty means no
    /// OACK.
    pub oack: Vec<(&'static str, String)>,
}

/// Negotiates the client's `requested` options for a file of `file_size`
/// bytes (as it will be sent, after any netascii conversion).
pub fn negotiate(requested: &[TftpOption<'_>], limits: Limits, file_size: u64) -> Negotiated {
    let mut out = Negotiated {
        blksize: DEFAULT_BLKSIZE,
        windowsize: 1,
        timeout: None,
        oack: Vec::new(),
    };
    // RFC 2347 does not say what a repeated option means; the first one wins.
    let mut seen = [false; 4];
    for opt in requested {
        let name = opt.name;
        let value = opt.value.trim();
        if name.eq_ignore_ascii_case("blksize") && !seen[0] {
            seen[0] = true;
            let Some(v) = parse_u64(value) else { continue };
            if v < u64::from(MIN_BLKSIZE) {
                continue;
            }
            let cap = limits.max_blksize.clamp(MIN_BLKSIZE, MAX_BLKSIZE);
            out.blksize = u16::try_from(v).unwrap_or(u16::MAX).min(cap);
            out.oack.push(("blksize", out.blksize.to_string()));
        } else if name.eq_ignore_ascii_case("timeout") && !seen[1] {
            seen[1] = true;
            let Some(v) = parse_u64(value) else { continue };
            if !(1..=255).contains(&v) {
                continue;
            }
            out.timeout = Some(Duration::from_secs(v));
            out.oack.push(("timeout", v.to_string()));
        } else if name.eq_ignore_ascii_case("tsize") && !seen[2] {
            seen[2] = true;
            if parse_u64(value).is_none() {
                continue;
            }
            out.oack.push(("tsize", file_size.to_string()));
        } else if name.eq_ignore_ascii_case("windowsize") && !seen[3] {
            seen[3] = true;
            let Some(v) = parse_u64(value) else { continue };
            if v == 0 {
                continue;
            }
            let cap = limits.max_windowsize.max(1);
            out.windowsize = u16::try_from(v).unwrap_or(u16::MAX).min(cap);
            out.oack.push(("windowsize", out.windowsize.to_string()));
        }
    }
    out
}

/// Decimal digits only: `str::parse` would also accept a leading `+`.
fn parse_u64(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    const LIMITS: Limits = Limits {
        max_blksize: 1468,
        max_windowsize: 64,
    };

    fn check(request: &[(&str, &str)], file_size: u64, expected: Negotiated) {
        let opts: Vec<TftpOption<'_>> = request
            .iter()
            .map(|(name, value)| TftpOption {
                name,
                value: Cow::Borrowed(value),
            })
            .collect();
        assert_eq!(
            negotiate(&opts, LIMITS, file_size),
            expected,
            "request {request:?}"
        );
    }

    fn neg(
        blksize: u16,
        windowsize: u16,
        timeout: Option<u64>,
        oack: &[(&'static str, &str)],
    ) -> Negotiated {
        Negotiated {
            blksize,
            windowsize,
            timeout: timeout.map(Duration::from_secs),
            oack: oack.iter().map(|(n, v)| (*n, v.to_string())).collect(),
        }
    }

    #[test]
    fn no_options_means_rfc1350_defaults_and_no_oack() {
        check(&[], 10, neg(512, 1, None, &[]));
        check(&[("multicast", "1")], 10, neg(512, 1, None, &[]));
    }

    #[test]
    fn uefi_size_probe() {
        check(
            &[("tsize", "0"), ("blksize", "1468")],
            1_048_576,
            neg(1468, 1, None, &[("tsize", "1048576"), ("blksize", "1468")]),
        );
    }

    #[test]
    fn caps_and_ranges() {
        check(
            &[("BLKSIZE", "65464")],
            0,
            neg(1468, 1, None, &[("blksize", "1468")]),
        );
        check(
            &[("blksize", "99999999999")],
            0,
            neg(1468, 1, None, &[("blksize", "1468")]),
        );
        check(&[("blksize", "8")], 0, neg(8, 1, None, &[("blksize", "8")]));
        check(&[("blksize", "7")], 0, neg(512, 1, None, &[]));
        check(&[("blksize", "+9")], 0, neg(512, 1, None, &[]));
        check(&[("blksize", "abc")], 0, neg(512, 1, None, &[]));
        check(
            &[("windowsize", "16")],
            0,
            neg(512, 16, None, &[("windowsize", "16")]),
        );
        check(
            &[("windowsize", "1000")],
            0,
            neg(512, 64, None, &[("windowsize", "64")]),
        );
        check(&[("windowsize", "0")], 0, neg(512, 1, None, &[]));
        check(
            &[("timeout", "3")],
            0,
            neg(512, 1, Some(3), &[("timeout", "3")]),
        );
        check(&[("timeout", "0")], 0, neg(512, 1, None, &[]));
        check(&[("timeout", "256")], 0, neg(512, 1, None, &[]));
    }

    #[test]
    fn first_repeated_option_wins() {
        check(
            &[("blksize", "1024"), ("blksize", "8")],
            0,
            neg(1024, 1, None, &[("blksize", "1024")]),
        );
    }

    #[test]
    fn all_options_in_client_order() {
        check(
            &[
                ("windowsize", "8"),
                ("timeout", "2"),
                ("tsize", "0"),
                ("blksize", "1428"),
            ],
            77,
            neg(
                1428,
                8,
                Some(2),
                &[
                    ("windowsize", "8"),
                    ("timeout", "2"),
                    ("tsize", "77"),
                    ("blksize", "1428"),
                ],
            ),
        );
    }
}
