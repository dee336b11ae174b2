//! TFTP packet codec: RFC 1350 packets plus the RFC 2347 option extension.
//!
//! Every packet starts with a 2-byte big-endian opcode (RFC 1350 §5):
//!
//! ```text
//! RRQ/WRQ  | 01/02 | filename | 0 | mode | 0 | opt1 | 0 | value1 | 0 | ...
//! DATA     | 03    | block #  | data (0..=blksize bytes)
//! ACK      | 04    | block #
//! ERROR    | 05    | code     | message | 0
//! OACK     | 06    | opt1 | 0 | value1 | 0 | ...          (RFC 2347)
//! ```
//!
//! [`parse`] works on untrusted bytes straight from the wire: it borrows from
//! the input, returns a small [`ParseError`] and never panics (it has a fuzz
//! target, see `tests/fuzz/fuzz_targets/tftp_packet.rs`). [`Packet::encode`]
//! refuses values that would not parse back (an interior NUL) instead of
//! writing a malformed packet, so `parse(encode(p)) == p` for every packet
//! `encode` accepts.

use std::borrow::Cow;

/// Opcodes of RFC 1350 §5 and RFC 2347.
const OP_RRQ: u16 = 1;
const OP_WRQ: u16 = 2;
const OP_DATA: u16 = 3;
const OP_ACK: u16 = 4;
const OP_ERROR: u16 = 5;
const OP_OACK: u16 = 6;

/// A decoded TFTP packet, borrowing from the datagram it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet<'a> {
    /// Acknowledgement of a DATA block (or of an OACK, with block 0).
    Ack {
        /// Block number, wrapping at 65535 (RFC 1350 leaves rollover open;
        /// we wrap to 0 as tftp-hpa and atftp do).
        block: u16,
    },
    /// One block of file data.
    Data {
        /// Block number, starting at 1.
        block: u16,
        /// The payload; shorter than the block size on the last block.
        data: &'a [u8],
    },
    /// An error; it ends the transfer (RFC 1350 §7).
    Error {
        /// The error code.
        code: ErrorCode,
        /// Human-readable message; decoded lossily since it is only logged.
        message: Cow<'a, str>,
    },
    /// Option acknowledgement (RFC 2347).
    Oack {
        /// The options the server accepted, with their final values.
        options: Vec<TftpOption<'a>>,
    },
    /// Read request.
    Rrq(Request<'a>),
    /// Write request (we refuse them, but still decode them).
    Wrq(Request<'a>),
}

/// The body of an RRQ or WRQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// The file name, as sent.
    pub filename: &'a str,
    /// The transfer mode.
    pub mode: Mode,
    /// RFC 2347 options, in the order the client sent them.
    pub options: Vec<TftpOption<'a>>,
}

/// One RFC 2347 option: a name (case-insensitive) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TftpOption<'a> {
    /// Option name, as sent.
    pub name: &'a str,
    /// Option value, as sent (decimal ASCII for every option we know).
    pub value: Cow<'a, str>,
}

/// Transfer modes of RFC 1350 §1, matched case-insensitively.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Obsolete "mail" mode; decoded so the server can refuse it by name.
    Mail,
    /// Text with CR LF line ends (RFC 764 NVT ASCII).
    Netascii,
    /// Raw bytes.
    Octet,
}

impl Mode {
    /// The mode's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Mail => "mail",
            Mode::Netascii => "netascii",
            Mode::Octet => "octet",
        }
    }
}

/// TFTP error codes (RFC 1350 appendix, RFC 2347 for code 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// 2: access violation.
    AccessViolation,
    /// 3: disk full or allocation exceeded.
    DiskFull,
    /// 6: file already exists.
    FileExists,
    /// 1: file not found.
    FileNotFound,
    /// 4: illegal TFTP operation.
    IllegalOperation,
    /// 0: not defined, see the message.
    NotDefined,
    /// 7: no such user.
    NoSuchUser,
    /// 8: option negotiation refused (RFC 2347).
    OptionRefused,
    /// 5: unknown transfer ID.
    UnknownTid,
    /// Any other code; kept so that decoding never fails on it.
    Other(u16),
}

impl ErrorCode {
    /// The numeric code.
    pub fn code(self) -> u16 {
        match self {
            ErrorCode::NotDefined => 0,
            ErrorCode::FileNotFound => 1,
            ErrorCode::AccessViolation => 2,
            ErrorCode::DiskFull => 3,
            ErrorCode::IllegalOperation => 4,
            ErrorCode::UnknownTid => 5,
            ErrorCode::FileExists => 6,
            ErrorCode::NoSuchUser => 7,
            ErrorCode::OptionRefused => 8,
            ErrorCode::Other(c) => c,
        }
    }

    /// The code for a number; numbers above 8 become [`ErrorCode::Other`].
    pub fn from_code(code: u16) -> Self {
        match code {
            0 => ErrorCode::NotDefined,
            1 => ErrorCode::FileNotFound,
            2 => ErrorCode::AccessViolation,
            3 => ErrorCode::DiskFull,
            4 => ErrorCode::IllegalOperation,
            5 => ErrorCode::UnknownTid,
            6 => ErrorCode::FileExists,
            7 => ErrorCode::NoSuchUser,
            8 => ErrorCode::OptionRefused,
            c => ErrorCode::Other(c),
        }
    }
}

/// Why a datagram is not a TFTP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A name or value is not NUL-terminated.
    #[error("{field} is not NUL-terminated")]
    MissingNul {
        /// Which field.
        field: &'static str,
    },
    /// An option name came without its value.
    #[error("option without a value")]
    OptionWithoutValue,
    /// The packet ends before its fixed header does.
    #[error("packet too short: {len} bytes")]
    TooShort {
        /// The datagram length.
        len: usize,
    },
    /// A field that must be text is not UTF-8.
    #[error("{field} is not UTF-8")]
    NotUtf8 {
        /// Which field.
        field: &'static str,
    },
    /// Bytes follow the last field of an ACK or ERROR packet.
    #[error("{extra} trailing bytes")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// The opcode is not 1 to 6.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u16),
    /// The mode is not netascii, octet or mail.
    #[error("unknown transfer mode")]
    UnknownMode,
}

/// Why a packet cannot be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A string field holds a NUL byte, which would end it early on the wire.
    #[error("{field} contains a NUL byte")]
    InteriorNul {
        /// Which field.
        field: &'static str,
    },
}

/// Decodes one datagram. Never panics, whatever the input.
pub fn parse(buf: &[u8]) -> Result<Packet<'_>, ParseError> {
    let (op, body) = split_u16(buf).ok_or(ParseError::TooShort { len: buf.len() })?;
    match op {
        OP_RRQ => parse_request(body).map(Packet::Rrq),
        OP_WRQ => parse_request(body).map(Packet::Wrq),
        OP_DATA => {
            let (block, data) = split_u16(body).ok_or(ParseError::TooShort { len: buf.len() })?;
            Ok(Packet::Data { block, data })
        }
        OP_ACK => {
            let (block, rest) = split_u16(body).ok_or(ParseError::TooShort { len: buf.len() })?;
            // Some clients pad ACKs; RFC 1350 does not allow it, and a strict
            // parser lets the fuzzer's round-trip property hold.
            if !rest.is_empty() {
                return Err(ParseError::TrailingBytes { extra: rest.len() });
            }
            Ok(Packet::Ack { block })
        }
        OP_ERROR => {
            let (code, rest) = split_u16(body).ok_or(ParseError::TooShort { len: buf.len() })?;
            // A missing terminator on the message is tolerated: the packet is
            // only logged, and refusing it would hide the client's reason.
            let (message, extra) = match rest.iter().position(|&b| b == 0) {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &[][..]),
            };
            if !extra.is_empty() {
                return Err(ParseError::TrailingBytes { extra: extra.len() });
            }
            Ok(Packet::Error {
                code: ErrorCode::from_code(code),
                message: String::from_utf8_lossy(message),
            })
        }
        OP_OACK => Ok(Packet::Oack {
            options: parse_options(body)?,
        }),
        other => Err(ParseError::UnknownOpcode(other)),
    }
}

fn parse_request(body: &[u8]) -> Result<Request<'_>, ParseError> {
    let (filename, rest) = take_str(body, "filename")?;
    let (mode, rest) = take_str(rest, "mode")?;
    let mode = if mode.eq_ignore_ascii_case("octet") {
        Mode::Octet
    } else if mode.eq_ignore_ascii_case("netascii") {
        Mode::Netascii
    } else if mode.eq_ignore_ascii_case("mail") {
        Mode::Mail
    } else {
        return Err(ParseError::UnknownMode);
    };
    Ok(Request {
        filename,
        mode,
        options: parse_options(rest)?,
    })
}

fn parse_options(mut rest: &[u8]) -> Result<Vec<TftpOption<'_>>, ParseError> {
    let mut options = Vec::new();
    while !rest.is_empty() {
        let (name, after) = take_str(rest, "option name")?;
        if after.is_empty() {
            return Err(ParseError::OptionWithoutValue);
        }
        let (value, after) = take_str(after, "option value")?;
        options.push(TftpOption {
            name,
            value: Cow::Borrowed(value),
        });
        rest = after;
    }
    Ok(options)
}

fn split_u16(buf: &[u8]) -> Option<(u16, &[u8])> {
    let (head, rest) = buf.split_first_chunk::<2>()?;
    Some((u16::from_be_bytes(*head), rest))
}

fn take_str<'a>(buf: &'a [u8], field: &'static str) -> Result<(&'a str, &'a [u8]), ParseError> {
    let end = buf
        .iter()
        .position(|&b| b == 0)
        .ok_or(ParseError::MissingNul { field })?;
    let text = std::str::from_utf8(&buf[..end]).map_err(|_| ParseError::NotUtf8 { field })?;
    Ok((text, &buf[end + 1..]))
}

impl Packet<'_> {
    /// Appends the wire form of the packet to `out`.
    ///
    /// On error `out` may hold a partial packet; callers clear it first.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        match self {
            Packet::Rrq(req) => encode_request(OP_RRQ, req, out),
            Packet::Wrq(req) => encode_request(OP_WRQ, req, out),
            Packet::Data { block, data } => {
                encode_data(*block, data, out);
                Ok(())
            }
            Packet::Ack { block } => {
                out.extend_from_slice(&OP_ACK.to_be_bytes());
                out.extend_from_slice(&block.to_be_bytes());
                Ok(())
            }
            Packet::Error { code, message } => {
                out.extend_from_slice(&OP_ERROR.to_be_bytes());
                out.extend_from_slice(&code.code().to_be_bytes());
                put_str(out, message, "error message")
            }
            Packet::Oack { options } => {
                out.extend_from_slice(&OP_OACK.to_be_bytes());
                encode_options(options, out)
            }
        }
    }

    /// The wire form of the packet in a new buffer.
    pub fn to_vec(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }
}

/// Writes a DATA packet into `out` without building a [`Packet`]: the hot
/// path of a transfer.
pub fn encode_data(block: u16, data: &[u8], out: &mut Vec<u8>) {
    out.reserve(4 + data.len());
    out.extend_from_slice(&OP_DATA.to_be_bytes());
    out.extend_from_slice(&block.to_be_bytes());
    out.extend_from_slice(data);
}

fn encode_request(op: u16, req: &Request<'_>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    out.extend_from_slice(&op.to_be_bytes());
    put_str(out, req.filename, "filename")?;
    put_str(out, req.mode.as_str(), "mode")?;
    encode_options(&req.options, out)
}

fn encode_options(options: &[TftpOption<'_>], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    for opt in options {
        put_str(out, opt.name, "option name")?;
        put_str(out, &opt.value, "option value")?;
    }
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str, field: &'static str) -> Result<(), EncodeError> {
    if s.as_bytes().contains(&0) {
        return Err(EncodeError::InteriorNul { field });
    }
    out.extend_from_slice(s.as_bytes());
    out.push(0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt<'a>(name: &'a str, value: &'a str) -> TftpOption<'a> {
        TftpOption {
            name,
            value: Cow::Borrowed(value),
        }
    }

    /// Table test helper: `input` decodes to `expected`.
    fn check(input: &[u8], expected: Result<Packet<'_>, ParseError>) {
        assert_eq!(parse(input), expected, "input {input:02x?}");
    }

    #[test]
    fn parses_captured_packets() {
        // An RRQ as sent by atftp 0.8 with blksize, tsize and windowsize.
        check(
            b"\0\x01undionly.kpxe\0octet\0blksize\x001468\0tsize\x000\0windowsize\x0016\0",
            Ok(Packet::Rrq(Request {
                filename: "undionly.kpxe",
                mode: Mode::Octet,
                options: vec![
                    opt("blksize", "1468"),
                    opt("tsize", "0"),
                    opt("windowsize", "16"),
                ],
            })),
        );
        // A plain tftp-hpa RRQ, mode in its own case.
        check(
            b"\0\x01a/b\0NetASCII\0",
            Ok(Packet::Rrq(Request {
                filename: "a/b",
                mode: Mode::Netascii,
                options: vec![],
            })),
        );
        check(
            b"\0\x02up\0mail\0",
            Ok(Packet::Wrq(Request {
                filename: "up",
                mode: Mode::Mail,
                options: vec![],
            })),
        );
        check(
            b"\0\x03\xff\xffhello",
            Ok(Packet::Data {
                block: 65535,
                data: b"hello",
            }),
        );
        check(
            b"\0\x03\0\x01",
            Ok(Packet::Data {
                block: 1,
                data: b"",
            }),
        );
        check(b"\0\x04\0\0", Ok(Packet::Ack { block: 0 }));
        // The error UEFI firmware sends after its tsize probe.
        check(
            b"\0\x05\0\x08User aborted the transfer\0",
            Ok(Packet::Error {
                code: ErrorCode::OptionRefused,
                message: Cow::Borrowed("User aborted the transfer"),
            }),
        );
        check(
            b"\0\x05\0\x01no NUL",
            Ok(Packet::Error {
                code: ErrorCode::FileNotFound,
                message: Cow::Borrowed("no NUL"),
            }),
        );
        check(
            b"\0\x06tsize\x00123\0",
            Ok(Packet::Oack {
                options: vec![opt("tsize", "123")],
            }),
        );
    }

    #[test]
    fn rejects_malformed_packets() {
        check(b"", Err(ParseError::TooShort { len: 0 }));
        check(b"\0", Err(ParseError::TooShort { len: 1 }));
        check(b"\0\x03\0", Err(ParseError::TooShort { len: 3 }));
        check(
            b"\0\x04\0\x01x",
            Err(ParseError::TrailingBytes { extra: 1 }),
        );
        check(
            b"\0\x05\0\x01m\0x",
            Err(ParseError::TrailingBytes { extra: 1 }),
        );
        check(b"\0\x07", Err(ParseError::UnknownOpcode(7)));
        check(
            b"\0\x01file",
            Err(ParseError::MissingNul { field: "filename" }),
        );
        check(
            b"\0\x01file\0octet",
            Err(ParseError::MissingNul { field: "mode" }),
        );
        check(b"\0\x01file\0binary\0", Err(ParseError::UnknownMode));
        check(
            b"\0\x01f\xff\0octet\0",
            Err(ParseError::NotUtf8 { field: "filename" }),
        );
        check(
            b"\0\x01f\0octet\0blksize\0",
            Err(ParseError::OptionWithoutValue),
        );
        check(
            b"\0\x01f\0octet\0blksize\x001",
            Err(ParseError::MissingNul {
                field: "option value",
            }),
        );
    }

    #[test]
    fn round_trips() {
        let packets = [
            Packet::Rrq(Request {
                filename: "ipxe.efi",
                mode: Mode::Octet,
                options: vec![opt("blksize", "1468"), opt("tsize", "0")],
            }),
            Packet::Wrq(Request {
                filename: "x",
                mode: Mode::Netascii,
                options: vec![],
            }),
            Packet::Data {
                block: 7,
                data: &[0, 1, 2, 0],
            },
            Packet::Ack { block: 65535 },
            Packet::Error {
                code: ErrorCode::Other(42),
                message: Cow::Borrowed("why"),
            },
            Packet::Oack {
                options: vec![opt("windowsize", "64")],
            },
            Packet::Oack { options: vec![] },
        ];
        for packet in packets {
            let wire = packet.to_vec().expect("encodes");
            assert_eq!(parse(&wire), Ok(packet));
        }
    }

    #[test]
    fn encode_refuses_interior_nul() {
        let packet = Packet::Error {
            code: ErrorCode::NotDefined,
            message: Cow::Borrowed("a\0b"),
        };
        assert_eq!(
            packet.to_vec(),
            Err(EncodeError::InteriorNul {
                field: "error message"
            })
        );
        let packet = Packet::Rrq(Request {
            filename: "a\0",
            mode: Mode::Octet,
            options: vec![],
        });
        assert_eq!(
            packet.to_vec(),
            Err(EncodeError::InteriorNul { field: "filename" })
        );
    }

    #[test]
    fn error_codes_round_trip() {
        for code in 0..=20u16 {
            assert_eq!(ErrorCode::from_code(code).code(), code);
        }
    }
}
