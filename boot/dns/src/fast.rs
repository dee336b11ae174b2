//! The fast path: plain A, AAAA and PTR queries for names we hold, answered
//! from a precomputed wire-format answer section.
//!
//! # Why hand-written
//!
//! These are nearly all the queries a cluster sends, and under `dnsperf` the
//! general path (hickory's `Request::from_bytes`, a `Message` with owned
//! `Name`s and `Vec`s, then the `BinEncoder` with its label-compression
//! table) cost more user time than dnsmasq spends on a whole query
//! (`tests/bench/dns.sh`). hickory has no borrowed, allocation-free request
//! view, so this module reads the one question in place, looks it up by its
//! lowercased wire-format name, and writes the response by copying: the
//! header's ID and flags, the question as the client sent it, the answer
//! records built with the zones, and an OPT record. No allocation per query.
//!
//! It is deliberately narrow. [`FastAnswers::answer`] accepts only a request
//! it fully understands, and returns `false` for anything else, which then
//! goes through hickory's `Catalog` as before: another opcode or class, more
//! than one question, records in the answer or authority sections, an
//! additional record other than one root OPT of EDNS version 0 (RFC 6891
//! §6.1.1), EDNS options hickory decodes itself (client subnet, NSID), a
//! compression pointer in the question, trailing bytes, or a name and type we
//! do not hold (so NXDOMAIN, NODATA with the SOA, CNAME chasing and
//! REFUSED stay hickory's). The response is the one the catalog gives
//! (RFC 1035 §4.1.1: AA set, RD and CD copied, RA clear; RFC 6891 §6.1.1:
//! an OPT with the client's payload size, at least 512, version 0, DO
//! clear: our zones are unsigned and hickory is built without DNSSEC, so
//! like any server that is not security-aware we do not set it, RFC 3225
//! §3),
//! except that the answer's owner names point at the question (RFC 1035
//! §4.1.4), so they keep the client's spelling, as BIND and dnsmasq answer
//! (RFC 4343 §4.1). The fuzz target `dns_query` checks that equivalence on
//! every input the fast path takes.
//!
//! A response larger than the limit (512 bytes, or the EDNS payload size,
//! over UDP; RFC 1035 §4.2.1, RFC 6891 §6.2.3) is sent with TC set, no
//! answers and the OPT, so the client retries over TCP (RFC 2181 §9).

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};

use hickory_server::net::xfer::Protocol;
use hickory_server::proto::rr::{DNSClass, Name, Record, RecordType};
use hickory_server::proto::serialize::binary::{BinEncodable, BinEncoder};
use tracing::warn;

/// Length of the DNS header (RFC 1035 §4.1.1).
const HEADER: usize = 12;
/// Longest name in wire format (RFC 1035 §2.3.4).
const MAX_NAME: usize = 255;
/// Lookup key: the query type, then the lowercased wire-format name.
const MAX_KEY: usize = 2 + MAX_NAME;
/// An OPT record with no options: root name, type, class, TTL, RDLENGTH.
const OPT_LEN: usize = 11;
/// UDP response limit without EDNS (RFC 1035 §4.2.1).
const UDP_PLAIN: usize = 512;
/// EDNS option codes hickory decodes into typed values (and may reject):
/// NSID (RFC 5001), DAU (RFC 6975) and client subnet (RFC 7871). Requests
/// carrying them take the general path, so both paths agree on them.
const DECODED_OPTIONS: [u16; 3] = [3, 5, 8];

/// One answer set, ready to copy into a response, with its lookup key.
///
/// Key and records share one allocation: with 10,000 names the table does
/// not stay in cache, and the profile showed the lookup's cost as cache
/// misses, one per allocation touched.
#[derive(Debug)]
struct Answer {
    /// The key (see [`MAX_KEY`]), then the records in wire format, each
    /// owner name a pointer to the question's name at offset 12.
    bytes: Box<[u8]>,
    key_len: u16,
    /// Number of records.
    count: u16,
}

impl Answer {
    fn key(&self) -> &[u8] {
        &self.bytes[..usize::from(self.key_len)]
    }

    fn records(&self) -> &[u8] {
        &self.bytes[usize::from(self.key_len)..]
    }
}

/// Hashes and compares as its key, so the set is looked up by key
/// (`Borrow` requires the two to agree).
impl PartialEq for Answer {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Answer {}

impl Hash for Answer {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl Borrow<[u8]> for Answer {
    fn borrow(&self) -> &[u8] {
        self.key()
    }
}

/// Precomputed answers by query type and lowercased wire-format name.
#[derive(Debug, Default)]
pub(crate) struct FastAnswers {
    answers: HashSet<Answer>,
}

impl FastAnswers {
    /// Builds the table from record sets keyed by owner name and type (the
    /// records of one set share both). A set that cannot be encoded is left
    /// out, so it goes through the general path.
    pub(crate) fn new<'a>(
        sets: impl IntoIterator<Item = ((&'a Name, RecordType), &'a [Record])>,
    ) -> Self {
        let mut answers = HashSet::new();
        for ((name, rtype), records) in sets {
            let mut key = Vec::with_capacity(MAX_KEY);
            key.extend_from_slice(&u16::from(rtype).to_be_bytes());
            for label in name.iter() {
                key.push(label.len() as u8);
                key.extend(label.iter().map(u8::to_ascii_lowercase));
            }
            key.push(0);
            match encode_set(key, records) {
                Some(answer) => {
                    answers.replace(answer);
                }
                _ => warn!(%name, %rtype, "record set left to the general DNS path"),
            }
        }
        Self { answers }
    }

    /// Writes the response to `request` into `out` (cleared first) and
    /// returns `true`, or returns `false` if the request is not one this
    /// path answers. `protocol` sets the size limit; `out` is the message
    /// only, without the TCP length prefix.
    pub(crate) fn answer(&self, request: &[u8], protocol: Protocol, out: &mut Vec<u8>) -> bool {
        let mut key = [0u8; MAX_KEY];
        let Some(query) = parse(request, &mut key) else {
            return false;
        };
        let Some(answer) = self.answers.get(&key[..query.key_len]) else {
            return false;
        };
        let limit = match (protocol, query.edns) {
            (Protocol::Udp, Some(edns)) => usize::from(edns.payload),
            (Protocol::Udp, None) => UDP_PLAIN,
            _ => usize::from(u16::MAX),
        };
        let question = &request[HEADER..HEADER + query.question_len];
        let opt_len = if query.edns.is_some() { OPT_LEN } else { 0 };
        let records = answer.records();
        let full = HEADER + question.len() + records.len() + opt_len;
        let truncated = full > limit;

        out.clear();
        out.extend_from_slice(&request[..2]); // ID
        // QR, opcode QUERY, AA, TC, RD copied; RA clear, Z and AD clear, CD
        // copied, RCODE NOERROR.
        out.push(0x84 | if truncated { 0x02 } else { 0 } | (request[2] & 0x01));
        out.push(request[3] & 0x10);
        out.extend_from_slice(&1u16.to_be_bytes());
        let count = if truncated { 0 } else { answer.count };
        out.extend_from_slice(&count.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&u16::from(query.edns.is_some()).to_be_bytes());
        out.extend_from_slice(question);
        if !truncated {
            out.extend_from_slice(records);
        }
        if let Some(edns) = query.edns {
            out.push(0); // root
            out.extend_from_slice(&u16::from(RecordType::OPT).to_be_bytes());
            out.extend_from_slice(&edns.payload.to_be_bytes());
            // Extended RCODE 0, version 0, flags (DO) clear.
            out.extend_from_slice(&[0, 0, 0, 0]);
            out.extend_from_slice(&0u16.to_be_bytes());
        }
        true
    }
}

/// Encodes one record set after its key, with owner names pointing at
/// offset 12.
fn encode_set(key: Vec<u8>, records: &[Record]) -> Option<Answer> {
    if key.len() > MAX_KEY {
        return None;
    }
    let key_len = u16::try_from(key.len()).ok()?;
    let mut bytes = key;
    for record in records {
        let mut rdata = Vec::new();
        record.data.emit(&mut BinEncoder::new(&mut rdata)).ok()?;
        bytes.extend_from_slice(&[0xc0, 0x0c]);
        bytes.extend_from_slice(&u16::from(record.record_type()).to_be_bytes());
        bytes.extend_from_slice(&u16::from(DNSClass::IN).to_be_bytes());
        bytes.extend_from_slice(&record.ttl.to_be_bytes());
        bytes.extend_from_slice(&u16::try_from(rdata.len()).ok()?.to_be_bytes());
        bytes.extend_from_slice(&rdata);
    }
    Some(Answer {
        bytes: bytes.into_boxed_slice(),
        key_len,
        count: u16::try_from(records.len()).ok()?,
    })
}

/// What the fast path needs from a request.
#[derive(Debug)]
struct Query {
    /// Bytes of the question (name, type, class) after the header.
    question_len: usize,
    /// Bytes of the lookup key written.
    key_len: usize,
    edns: Option<EdnsRequest>,
}

#[derive(Debug, Clone, Copy)]
struct EdnsRequest {
    /// The client's UDP payload size, at least 512 (RFC 6891 §6.2.5).
    payload: u16,
}

/// Reads a request the fast path can answer, writing its lookup key into
/// `key`; `None` for anything else (see the module comment).
fn parse(packet: &[u8], key: &mut [u8; MAX_KEY]) -> Option<Query> {
    let header = packet.get(..HEADER)?;
    let count = |i: usize| u16::from_be_bytes([header[i], header[i + 1]]);
    // QR clear and opcode QUERY (RFC 1035 §4.1.1).
    if header[2] & 0xf8 != 0 {
        return None;
    }
    if count(4) != 1 || count(6) != 0 || count(8) != 0 || count(10) > 1 {
        return None;
    }

    // The question name, uncompressed, lowercased into the key after the
    // type (RFC 4343: comparisons are ASCII case-insensitive).
    let mut at = HEADER;
    let mut k = 2;
    loop {
        let len = usize::from(*packet.get(at)?);
        if len > 63 {
            return None; // a pointer or a reserved label type
        }
        let label = packet.get(at..at + 1 + len)?;
        key.get_mut(k..k + 1 + len)?.copy_from_slice(label);
        at += 1 + len;
        k += 1 + len;
        if len == 0 {
            break;
        }
    }
    if k - 2 > MAX_NAME {
        return None;
    }
    key[3..k].make_ascii_lowercase();
    // Label lengths are all below 64, so lowercasing left them alone.
    let qtype = packet.get(at..at + 2)?;
    key[..2].copy_from_slice(qtype);
    if packet.get(at + 2..at + 4)? != u16::from(DNSClass::IN).to_be_bytes() {
        return None;
    }
    at += 4;
    let question_len = at - HEADER;

    let edns = if count(10) == 1 {
        let (edns, end) = parse_opt(packet, at)?;
        at = end;
        Some(edns)
    } else {
        None
    };
    (at == packet.len()).then_some(Query {
        question_len,
        key_len: k,
        edns,
    })
}

/// Reads the OPT record at `at` (RFC 6891 §6.1.2): root owner, version 0,
/// options well formed and none that hickory decodes itself. Returns it and
/// the offset after it.
fn parse_opt(packet: &[u8], at: usize) -> Option<(EdnsRequest, usize)> {
    let fixed = packet.get(at..at + OPT_LEN)?;
    let field = |i: usize| u16::from_be_bytes([fixed[i], fixed[i + 1]]);
    if fixed[0] != 0 || field(1) != u16::from(RecordType::OPT) || fixed[6] != 0 {
        return None;
    }
    let payload = field(3).max(UDP_PLAIN as u16);
    let end = at + OPT_LEN + usize::from(field(9));
    let mut options = packet.get(at + OPT_LEN..end)?;
    while !options.is_empty() {
        let head = options.get(..4)?;
        let code = u16::from_be_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        if DECODED_OPTIONS.contains(&code) {
            return None;
        }
        options = options.get(4 + len..)?;
    }
    Some((EdnsRequest { payload }, end))
}

#[cfg(test)]
mod tests;
