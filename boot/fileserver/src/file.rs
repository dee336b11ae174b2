//! Which file a request names, and what to send of it: the conditional
//! request and range rules of RFC 9110, as pure functions of the request head
//! and the file's metadata (so the fuzz target and the unit tests reach every
//! branch without a socket).
//!
//! * Paths are percent-decoded, then every segment must be a plain name: an
//!   empty, `.` or `..` segment, or a NUL byte, names nothing (404), so a
//!   request cannot leave its folder. Links in the export are dealt with
//!   where the file is opened (`beneath.rs`).
//! * Validators: a strong `ETag` from the inode, size and modification time
//!   (to the nanosecond), and `Last-Modified`.
//! * Preconditions in the order of RFC 9110 §13.2.2: `If-Match` (strong
//!   comparison) or else `If-Unmodified-Since` → 412; `If-None-Match` (weak
//!   comparison) or else `If-Modified-Since` → 304.
//! * `Range` (GET only, RFC 9110 §14): one range of `bytes` → 206, or 416
//!   when it starts beyond the end. `If-Range` (§13.1.5) keeps the range only
//!   for the current strong `ETag` or the exact `Last-Modified` date, so a
//!   resumed download of a replaced image never splices two files. A `Range`
//!   we do not take (several ranges, other units, bad syntax) is ignored and
//!   the whole file is sent with 200, as §14.2 allows; every client handles
//!   that, and none of ours asks for `multipart/byteranges`.
//!
//! The `bytes=` syntax is parsed by the `http-range-header` crate; mapping
//! the range onto the file is ours, because the crate refuses a suffix longer
//! than the file, which §14.1.2 says means the whole file.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use http_range_header::{EndPosition, StartPosition};

use crate::request::{Head, Method};

/// The folder a request path maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Area {
    /// `/images/...` from `<root>/images/...`: downloads are logged and
    /// admission-controlled.
    Images,
    /// `/boot/...` from the iPXE folder.
    Boot,
}

/// Maps a request target onto `images_root` (which holds `images/`) or
/// `boot_dir`; `None` when it names nothing we serve.
pub(crate) fn resolve(
    target: &str,
    images_root: &Path,
    boot_dir: &Path,
) -> Option<(Area, PathBuf)> {
    let path = target.split(['?', '#']).next().unwrap_or_default();
    let (area, mut full, rest) = if let Some(rest) = path.strip_prefix("/images/") {
        (Area::Images, images_root.join("images"), rest)
    } else if let Some(rest) = path.strip_prefix("/boot/") {
        (Area::Boot, boot_dir.to_path_buf(), rest)
    } else {
        return None;
    };
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(rest).collect();
    for segment in decoded.split(|&b| b == b'/') {
        if segment.is_empty() || segment == b"." || segment == b".." || segment.contains(&0) {
            return None;
        }
        full.push(OsStr::from_bytes(segment));
    }
    Some((area, full))
}

/// What the preconditions and ranges need to know of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileMeta {
    pub(crate) len: u64,
    pub(crate) modified: SystemTime,
    pub(crate) inode: u64,
}

impl FileMeta {
    pub(crate) fn new(metadata: &std::fs::Metadata) -> Self {
        Self {
            len: metadata.len(),
            modified: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            inode: metadata.ino(),
        }
    }

    /// The entity tag without its quotes.
    pub(crate) fn etag(&self) -> String {
        let nanos = self
            .modified
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        format!("{:x}-{:x}-{nanos:x}", self.inode, self.len)
    }

    pub(crate) fn last_modified(&self) -> String {
        httpdate::fmt_http_date(self.modified)
    }

    /// The modification time to the second, as HTTP dates carry it.
    fn modified_secs(&self) -> SystemTime {
        let secs = self
            .modified
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }
}

/// What to answer for a GET or HEAD of an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// 200 with the whole file.
    Full,
    /// 206 with bytes `start..=end` (both within the file).
    Partial { start: u64, end: u64 },
    /// 304.
    NotModified,
    /// 412.
    PreconditionFailed,
    /// 416.
    Unsatisfiable,
}

/// Evaluates the preconditions, then the range (see the module comment).
pub(crate) fn plan(head: &Head, meta: &FileMeta) -> Plan {
    let etag = meta.etag();
    if let Some(list) = &head.if_match {
        if !list_matches(list, &etag, Comparison::Strong) {
            return Plan::PreconditionFailed;
        }
    } else if let Some(date) = head.if_unmodified_since
        && meta.modified_secs() > date
    {
        return Plan::PreconditionFailed;
    }
    if let Some(list) = &head.if_none_match {
        if list_matches(list, &etag, Comparison::Weak) {
            return Plan::NotModified;
        }
    } else if let Some(date) = head.if_modified_since
        && meta.modified_secs() <= date
    {
        return Plan::NotModified;
    }

    let Some(range) = head
        .range
        .as_deref()
        .filter(|_| head.method() == Method::Get)
    else {
        return Plan::Full;
    };
    if let Some(validator) = &head.if_range
        && !if_range_matches(validator, &etag, &meta.last_modified())
    {
        return Plan::Full;
    }
    match http_range_header::parse_range_header(range) {
        Ok(parsed) if parsed.ranges.len() == 1 => {
            let range = parsed.ranges[0];
            map_range(range.start, range.end, meta.len)
        }
        _ => Plan::Full,
    }
}

/// One syntactically valid range onto a file of `len` bytes (RFC 9110
/// §14.1.2): a first position at or past the end is unsatisfiable, a last
/// position past the end is cut to it, a suffix longer than the file means
/// all of it, and a last position before the first makes the range invalid
/// (ignored).
fn map_range(start: StartPosition, end: EndPosition, len: u64) -> Plan {
    let (start, end) = match (start, end) {
        (StartPosition::Index(first), EndPosition::Index(last)) if last < first => {
            return Plan::Full;
        }
        (StartPosition::Index(first), _) if first >= len => return Plan::Unsatisfiable,
        (StartPosition::Index(first), EndPosition::Index(last)) => (first, last.min(len - 1)),
        (StartPosition::Index(first), EndPosition::LastByte) => (first, len - 1),
        (StartPosition::FromLast(_), _) if len == 0 => return Plan::Unsatisfiable,
        (StartPosition::FromLast(n), _) => (len - n.min(len), len - 1),
    };
    Plan::Partial { start, end }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comparison {
    Strong,
    Weak,
}

/// Whether `etag` (without quotes) is in the `If-Match`/`If-None-Match`
/// list: `*`, or comma-separated entity tags. Parsing stops at the first
/// malformed element, which then matches nothing.
fn list_matches(list: &str, etag: &str, comparison: Comparison) -> bool {
    if list.trim() == "*" {
        return true;
    }
    let mut rest = list;
    loop {
        rest = rest.trim_start_matches([',', ' ', '\t']);
        if rest.is_empty() {
            return false;
        }
        let Some((weak, opaque, after)) = entity_tag(rest) else {
            return false;
        };
        if opaque == etag && (comparison == Comparison::Weak || !weak) {
            return true;
        }
        rest = after;
    }
}

/// `W/"x"` or `"x"` at the start of `text`: (weak, `x`, the rest).
fn entity_tag(text: &str) -> Option<(bool, &str, &str)> {
    let (weak, text) = match text.strip_prefix("W/") {
        Some(text) => (true, text),
        None => (false, text),
    };
    let text = text.strip_prefix('"')?;
    let end = text.find('"')?;
    Some((weak, &text[..end], &text[end + 1..]))
}

/// RFC 9110 §13.1.5: an entity tag matches by strong comparison, a date only
/// when it is exactly `Last-Modified`.
fn if_range_matches(validator: &str, etag: &str, last_modified: &str) -> bool {
    let validator = validator.trim();
    if validator.starts_with("W/") || validator.starts_with('"') {
        entity_tag(validator)
            .is_some_and(|(weak, opaque, rest)| !weak && opaque == etag && rest.trim().is_empty())
    } else {
        validator == last_modified
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> FileMeta {
        FileMeta {
            len: 1000,
            modified: SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123),
            inode: 42,
        }
    }

    fn get(range: Option<&str>) -> Head {
        Head {
            method: Some(Method::Get),
            target: "/images/x".into(),
            keep_alive: true,
            range: range.map(str::to_owned),
            ..Head::default()
        }
    }

    #[test]
    fn resolves_plain_names_only() {
        let (root, boot) = (Path::new("/srv"), Path::new("/ipxe"));
        let ok = |target: &str| resolve(target, root, boot);
        assert_eq!(
            ok("/images/c/1/rootfs.tar.zst?x=1"),
            Some((
                Area::Images,
                PathBuf::from("/srv/images/c/1/rootfs.tar.zst")
            ))
        );
        assert_eq!(
            ok("/boot/ipxe%2Eefi"),
            Some((Area::Boot, PathBuf::from("/ipxe/ipxe.efi")))
        );
        for bad in [
            "/images/../etc/passwd",
            "/images/%2e%2e/x",
            "/images/a%2f..%2f..%2fx",
            "/images//etc/passwd",
            "/images/a/./b",
            "/images/a/",
            "/images/",
            "/images/a%00b",
            "/boot/../images/x",
            "/nothing",
            "*",
            "http://host/images/x",
        ] {
            assert_eq!(ok(bad), None, "{bad}");
        }
    }

    #[test]
    fn ranges() {
        let m = meta();
        let p = |range: &str| plan(&get(Some(range)), &m);
        assert_eq!(p("bytes=0-99"), Plan::Partial { start: 0, end: 99 });
        assert_eq!(
            p("bytes=990-2000"),
            Plan::Partial {
                start: 990,
                end: 999
            }
        );
        assert_eq!(
            p("bytes=100-"),
            Plan::Partial {
                start: 100,
                end: 999
            }
        );
        assert_eq!(
            p("bytes=-10"),
            Plan::Partial {
                start: 990,
                end: 999
            }
        );
        assert_eq!(p("bytes=-5000"), Plan::Partial { start: 0, end: 999 });
        assert_eq!(p("bytes=1000-"), Plan::Unsatisfiable);
        assert_eq!(p("bytes=5-3"), Plan::Full);
        assert_eq!(p("bytes=0-9,20-29"), Plan::Full);
        assert_eq!(p("items=0-9"), Plan::Full);
        assert_eq!(p("bytes=x-"), Plan::Full);
        assert_eq!(p(""), Plan::Full);
        let empty = FileMeta { len: 0, ..m };
        assert_eq!(plan(&get(Some("bytes=0-")), &empty), Plan::Unsatisfiable);
        assert_eq!(plan(&get(Some("bytes=-1")), &empty), Plan::Unsatisfiable);
        // HEAD ignores Range.
        let mut head = get(Some("bytes=0-9"));
        head.method = Some(Method::Head);
        assert_eq!(plan(&head, &m), Plan::Full);
    }

    #[test]
    fn preconditions() {
        let m = meta();
        let etag = format!("\"{}\"", m.etag());
        let with = |f: &dyn Fn(&mut Head)| {
            let mut head = get(None);
            f(&mut head);
            plan(&head, &m)
        };
        let later = m.modified + Duration::from_secs(10);
        let earlier = m.modified - Duration::from_secs(10);
        assert_eq!(with(&|h| h.if_match = Some(etag.clone())), Plan::Full);
        assert_eq!(with(&|h| h.if_match = Some("*".into())), Plan::Full);
        assert_eq!(
            with(&|h| h.if_match = Some(format!("W/{etag}"))),
            Plan::PreconditionFailed
        );
        assert_eq!(
            with(&|h| h.if_match = Some("\"x\", \"y\"".into())),
            Plan::PreconditionFailed
        );
        assert_eq!(
            with(&|h| h.if_unmodified_since = Some(earlier)),
            Plan::PreconditionFailed
        );
        assert_eq!(with(&|h| h.if_unmodified_since = Some(later)), Plan::Full);
        assert_eq!(
            with(&|h| h.if_none_match = Some(format!("\"x\", W/{etag}"))),
            Plan::NotModified
        );
        assert_eq!(
            with(&|h| h.if_none_match = Some("\"x\"".into())),
            Plan::Full
        );
        // The sub-second part of the mtime does not count against a date.
        assert_eq!(
            with(&|h| h.if_modified_since = Some(m.modified_secs())),
            Plan::NotModified
        );
        assert_eq!(with(&|h| h.if_modified_since = Some(earlier)), Plan::Full);
        // If-None-Match wins over If-Modified-Since.
        assert_eq!(
            with(&|h| {
                h.if_none_match = Some("\"x\"".into());
                h.if_modified_since = Some(later);
            }),
            Plan::Full
        );
    }

    #[test]
    fn if_range() {
        let m = meta();
        let with = |validator: &str| {
            let mut head = get(Some("bytes=0-9"));
            head.if_range = Some(validator.to_owned());
            plan(&head, &m)
        };
        let range = Plan::Partial { start: 0, end: 9 };
        assert_eq!(with(&format!("\"{}\"", m.etag())), range);
        assert_eq!(with(&format!("W/\"{}\"", m.etag())), Plan::Full);
        assert_eq!(with("\"stale\""), Plan::Full);
        assert_eq!(with(&m.last_modified()), range);
        assert_eq!(with("Mon, 30 Nov 2026 02:00:01 GMT"), Plan::Full);
        assert_eq!(with(""), Plan::Full);
    }

    #[test]
    fn validators_change_with_the_file() {
        let m = meta();
        assert_ne!(FileMeta { len: 999, ..m }.etag(), m.etag());
        assert_ne!(FileMeta { inode: 43, ..m }.etag(), m.etag());
        let touched = FileMeta {
            modified: m.modified + Duration::from_nanos(1),
            ..m
        };
        assert_ne!(touched.etag(), m.etag());
        assert_eq!(m.last_modified(), "Tue, 14 Nov 2023 22:13:20 GMT");
    }
}
