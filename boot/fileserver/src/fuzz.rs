//! The fuzzing entry point: request bytes through everything the file server
//! does with them before it touches a file.
//!
//! [`fuzz_request`] parses the bytes as a request head (and, pipelined, the
//! heads after it), maps each target onto two fixed folders and plans the
//! reply for files of several sizes, asserting:
//!
//! * nothing panics;
//! * a head never claims more bytes than it was given, nor more than the
//!   head limit;
//! * a resolved path stays under its folder and has no `.`, `..` or empty
//!   segment;
//! * a planned range lies inside the file, and the reply's head parses back
//!   with `httparse` with the status and `Content-Length` we meant.
//!
//! A broken assertion is the bug the fuzzer reports. The stable test suite
//! replays the corpus in `tests/fuzz/corpus/http_request/` through this too.

use std::path::{Component, Path};
use std::time::{Duration, SystemTime};

use crate::conn::{Reply, file_reply, status_text};
use crate::file::{FileMeta, Plan, plan, resolve};
use crate::request::{self, MAX_HEAD};

/// Fuzzing entry point: see the module comment. Panics only on a bug.
pub fn fuzz_request(data: &[u8]) {
    let (root, boot) = (Path::new("/srv/export"), Path::new("/usr/lib/ipxe"));
    let mut rest = data;
    // At most a few pipelined heads: each one is checked in full.
    for _ in 0..4 {
        let Ok(Some((head, n))) = request::parse(rest) else {
            return;
        };
        assert!(n <= rest.len() && n <= MAX_HEAD, "head of {n} bytes");
        rest = &rest[n..];

        if let Some((_, path)) = resolve(&head.target, root, boot) {
            assert!(path.starts_with(root) || path.starts_with(boot), "{path:?}");
            assert!(
                path.components()
                    .all(|c| matches!(c, Component::RootDir | Component::Normal(_))),
                "{path:?}"
            );
        }
        for len in [0, 1, 4096, u64::MAX] {
            let meta = FileMeta {
                len,
                modified: SystemTime::UNIX_EPOCH + Duration::new(1_764_000_000, 5),
                inode: 7,
            };
            let (status, length) = match plan(&head, &meta) {
                Plan::Full => (200, len),
                Plan::Partial { start, end } => {
                    assert!(start <= end && end < len, "{start}-{end} of {len}");
                    (206, end - start + 1)
                }
                Plan::NotModified => (304, 0),
                Plan::PreconditionFailed => (412, status_text(412).len() as u64),
                Plan::Unsatisfiable => (416, status_text(416).len() as u64),
            };
            let (reply, body) = file_reply(&head, &meta);
            if let Some((start, body_len)) = body {
                assert_eq!(body_len, length);
                assert!(start.checked_add(body_len).is_some_and(|end| end <= len));
            }
            check_head(&reply, status, length);
        }
    }
}

fn check_head(reply: &Reply, status: u16, length: u64) {
    let text = reply.head(true, SystemTime::UNIX_EPOCH);
    let mut fields = [httparse::EMPTY_HEADER; 16];
    let mut parsed = httparse::Response::new(&mut fields);
    let complete = parsed.parse(text.as_bytes()).expect("our head parses");
    assert_eq!(complete, httparse::Status::Complete(text.len()));
    assert_eq!(parsed.code, Some(status));
    let content_length = parsed
        .headers
        .iter()
        .find(|f| f.name.eq_ignore_ascii_case("content-length"))
        .map(|f| std::str::from_utf8(f.value).expect("ASCII").parse::<u64>());
    if status == 304 {
        assert!(content_length.is_none());
    } else {
        assert_eq!(content_length.map(Result::ok), Some(Some(length)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays the fuzz corpus (seeds and what the fuzzer kept) on stable,
    /// so every input the fuzzer ever found interesting stays a test.
    #[test]
    fn fuzz_corpus_replays() {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fuzz/corpus/http_request");
        let (mut files, mut seeds) = (0, 0);
        for entry in std::fs::read_dir(&dir).expect("the http_request corpus") {
            let path = entry.expect("a corpus entry").path();
            let data = std::fs::read(&path).expect("a corpus file");
            fuzz_request(&data);
            files += 1;
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name.starts_with("seed-") {
                seeds += 1;
            }
        }
        assert!(seeds >= 5, "corpus has only {seeds} seeds");
        assert!(files > seeds, "corpus has nothing the fuzzer found");
    }
}
