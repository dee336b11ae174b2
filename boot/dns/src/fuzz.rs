//! The fuzzing entry point: request bytes through the whole handler over a
//! fixed zone, checking what comes out.
//!
//! [`fuzz_query`] runs the bytes as a UDP datagram and as a TCP message
//! (the length prefix already removed, as the TCP listener does) through the
//! same prechecks and answering paths as the listeners, and asserts:
//!
//! * nothing panics;
//! * every response parses with hickory's codec, carries the request's ID,
//!   has QR set, and over UDP fits the size limit (512 bytes, or the EDNS
//!   payload size; RFC 1035 §4.2.1, RFC 6891 §6.2.5);
//! * whenever the fast path (`src/fast.rs`) answers, hickory's catalog
//!   answers the same request with the same meaning: header flags, rcode,
//!   question, answer records (owner names compared case-insensitively,
//!   RFC 4343), empty authority section and EDNS parameters.
//!
//! A broken assertion is the bug the fuzzer reports. The stable test suite
//! replays the corpus in `tests/fuzz/corpus/dns_query/` through this too.

use std::cell::RefCell;

use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::{Message, MessageType};

use crate::sample::snapshot;
use crate::server::Shared;

/// Fuzzing entry point: see the module comment. Panics only on a bug.
pub fn fuzz_query(data: &[u8]) {
    thread_local! {
        static FIXTURE: RefCell<Option<(tokio::runtime::Runtime, Shared)>> =
            const { RefCell::new(None) };
    }
    FIXTURE.with_borrow_mut(|fixture| {
        let (runtime, shared) = fixture.get_or_insert_with(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a current-thread runtime");
            let shared = runtime.block_on(async { Shared::fixture(&snapshot()) });
            (runtime, shared)
        });
        for protocol in [Protocol::Udp, Protocol::Tcp] {
            let responses = runtime.block_on(shared.responses(data, protocol));
            let fast = responses.fast.map(|r| checked(data, &r, protocol));
            let general = responses.general.map(|r| checked(data, &r, protocol));
            if let Some(fast) = fast {
                let general = general.expect("the catalog answers what the fast path answers");
                assert_same_meaning(&fast, &general);
            }
        }
    });
}

/// Parses `response` and checks what every response must satisfy.
pub(crate) fn checked(request: &[u8], response: &[u8], protocol: Protocol) -> Message {
    let message = match Message::from_vec(response) {
        Ok(message) => message,
        Err(error) => panic!("response does not parse ({error}): {response:02x?}"),
    };
    assert_eq!(response[..2], request[..2], "response ID");
    assert_eq!(message.metadata.message_type, MessageType::Response);
    if protocol == Protocol::Udp {
        let limit = message
            .edns
            .as_ref()
            .map_or(512, |e| usize::from(e.max_payload()).max(512));
        assert!(response.len() <= limit, "{} > {limit}", response.len());
    }
    message
}

/// Asserts that the fast path's response means what the catalog's does.
pub(crate) fn assert_same_meaning(fast: &Message, general: &Message) {
    assert_eq!(fast.metadata, general.metadata, "header");
    assert_eq!(fast.queries, general.queries, "question");
    let rrs = |m: &Message| {
        m.answers
            .iter()
            .map(|r| {
                (
                    r.name.to_lowercase(),
                    r.record_type(),
                    r.dns_class,
                    r.ttl,
                    r.data.clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(rrs(fast), rrs(general), "answers");
    assert!(fast.authorities.is_empty() && general.authorities.is_empty());
    assert!(fast.additionals.is_empty() && general.additionals.is_empty());
    let edns = |m: &Message| {
        m.edns
            .as_ref()
            .map(|e| (e.max_payload(), e.version(), e.flags().dnssec_ok))
    };
    assert_eq!(edns(fast), edns(general), "EDNS");
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// xorshift64: deterministic pseudo-random bytes, so a failure
    /// reproduces.
    fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    /// Replays the fuzz corpus (seeds and what the fuzzer kept) on stable,
    /// with every truncation and some single-byte mutations of each seed
    /// (`seed-*`, the captured dig queries) as a cheap stand-in for the
    /// fuzzer.
    #[test]
    fn fuzz_corpus_replays() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fuzz/corpus/dns_query");
        let mut seeds = 0;
        let mut files = 0;
        for entry in std::fs::read_dir(&dir).expect("the dns_query corpus") {
            let entry = entry.unwrap();
            let data = std::fs::read(entry.path()).unwrap();
            fuzz_query(&data);
            files += 1;
            if !entry.file_name().to_string_lossy().starts_with("seed-") {
                continue;
            }
            seeds += 1;
            for len in 0..data.len() {
                fuzz_query(&data[..len]);
            }
            for (i, byte) in random_bytes(data.len() * 2, data.len() as u64)
                .into_iter()
                .enumerate()
            {
                let mut mutated = data.clone();
                if let Some(b) = mutated.get_mut(i % data.len().max(1)) {
                    *b = byte;
                }
                fuzz_query(&mutated);
            }
        }
        assert!(seeds >= 7, "corpus has only {seeds} seeds");
        assert!(files > seeds, "corpus has nothing the fuzzer found");
    }
}
