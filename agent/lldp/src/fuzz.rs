//! The fuzz entry point `lldp_frame`, shared by the cargo-fuzz target
//! (`tests/fuzz/fuzz_targets/lldp_frame.rs`) and the stable test below,
//! which replays `tests/fuzz/corpus/lldp_frame/` on every `cargo test`.
//!
//! Besides "no panic", for every input read as an Ethernet frame and as a
//! bare LLDPDU:
//! - whatever parses encodes, and the encoding parses to the same value;
//! - an encoded frame is at least the 60 bytes Ethernet needs;
//! - the port ID and description normalise to a form that normalises to
//!   itself, and split ([`port_parts`]) into the same word and path as
//!   that form does, the form being the word then the path.

use crate::{Frame, Lldpdu, normalise_port, port_parts};

/// The fuzz target: any bytes as an LLDP Ethernet frame and as an LLDPDU.
pub fn lldp_frame(data: &[u8]) {
    if let Ok(frame) = Frame::parse(data) {
        let bytes = frame.encode().expect("a parsed frame encodes");
        assert!(bytes.len() >= 60);
        let again = Frame::parse(&bytes).expect("an encoded frame parses");
        assert_eq!(again, frame);
        check_names(&frame.lldpdu);
    }
    if let Ok(lldpdu) = Lldpdu::parse(data) {
        let bytes = lldpdu.encode().expect("a parsed LLDPDU encodes");
        let again = Lldpdu::parse(&bytes).expect("an encoded LLDPDU parses");
        assert_eq!(again, lldpdu);
        check_names(&lldpdu);
    }
}

fn check_names(lldpdu: &Lldpdu) {
    let names = [Some(lldpdu.port_id.text()), lldpdu.port_description()];
    for name in names.into_iter().flatten() {
        let once = normalise_port(&name);
        assert_eq!(normalise_port(&once), once, "{name:?}");
        let (word, path) = port_parts(&name);
        assert_eq!(port_parts(&once), (word.clone(), path.clone()), "{name:?}");
        assert!(
            path.is_empty() || path.starts_with(|c: char| c.is_ascii_digit()),
            "{name:?}: path {path:?}"
        );
        assert!(once.starts_with(&word) && once.ends_with(&path), "{name:?}");
    }
    let _ = lldpdu.chassis_id.text();
    let _ = lldpdu.system_name();
    for address in lldpdu.management_addresses() {
        assert!(!address.text().is_empty());
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Replays the corpus (seeds and what the fuzzer kept) with every
    /// truncation of each file.
    #[test]
    fn fuzz_corpus_replays() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fuzz/corpus/lldp_frame");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let data = std::fs::read(entry.expect("entry").path()).expect("read");
            for len in 0..=data.len() {
                lldp_frame(&data[..len]);
            }
            n += 1;
        }
        assert!(n >= 6, "the lldp_frame corpus has only {n} files");
    }
}
