//! Fuzzing entry point for the kernel command line, shared by the cargo-fuzz
//! target `agent_cmdline` (`tests/fuzz/fuzz_targets/agent_cmdline.rs`) and
//! the stable test below, which replays `tests/fuzz/corpus/agent_cmdline/` on
//! every `cargo test`.
//!
//! Besides "no panic" it checks, for every input:
//! - the parameters it accepts, written out plainly, parse back to
//!   themselves (what the control service will write, we read);
//! - the console form of the line is printable, and of a word the kernel
//!   sees as `mprov_enroll=<value>` it shows only a short prefix.

use crate::cmdline::{self, BootParams, Param};

/// The fuzz target: any bytes as a kernel command line.
pub fn agent_cmdline(data: &[u8]) {
    let params = BootParams::parse(data);

    let mut plain = String::new();
    if let Some(nonce) = params.enroll() {
        plain.push_str(&format!(" mprov_enroll={}", nonce.expose_secret()));
    }
    if let Some(ca) = params.ca() {
        plain.push_str(&format!(" mprov_ca={ca}"));
    }
    if let Some(url) = params.url() {
        plain.push_str(&format!(" mprov_url={url}"));
    }
    let again = BootParams::parse(plain.as_bytes());
    assert_eq!(again.enroll(), params.enroll());
    assert_eq!(again.ca(), params.ca());
    assert_eq!(again.url(), params.url());
    assert!(again.errors().is_empty(), "{:?}", again.errors());

    // `…` is the only character outside printable ASCII the console sees.
    let shown = cmdline::redacted(data);
    assert!(
        shown
            .chars()
            .all(|c| c == ' ' || c.is_ascii_graphic() || c == '…'),
        "{shown:?}"
    );
    // Of a nonce, at most a quarter and at most 4 bytes are shown.
    for word in cmdline::words(data) {
        let Some(value) = word.value else { continue };
        if Param::from_name(word.name) != Some(Param::Enroll) {
            continue;
        }
        let shown = cmdline::redacted(word.raw);
        let name = format!("{}=", cmdline::printable(word.name));
        let rest = shown
            .strip_prefix(&name)
            .unwrap_or_else(|| panic!("{shown:?}"));
        let (prefix, tail) = rest.split_once('…').unwrap_or_else(|| panic!("{shown:?}"));
        assert_eq!(tail, format!(" ({} characters)", value.len()));
        let revealed = (value.len() / 4).min(4);
        assert_eq!(prefix, cmdline::printable(&value[..revealed]));
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Replays the fuzz corpus (seeds and what the fuzzer kept) on stable,
    /// with every truncation of each file.
    #[test]
    fn fuzz_corpus_replays() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/corpus/agent_cmdline");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("the agent_cmdline corpus") {
            let data = std::fs::read(entry.expect("entry").path()).expect("read");
            for len in 0..=data.len() {
                agent_cmdline(&data[..len]);
            }
            n += 1;
        }
        assert!(n >= 5, "corpus has only {n} files");
    }
}
