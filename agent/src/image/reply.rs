//! What a job server's reply head means for the image stream: a pure
//! function of the status and a few headers, so the fuzz target
//! (`agent_http_head`) and the tests drive it without a socket.
//!
//! The heads come from the network (anyone on the provisioning segment can
//! answer), so nothing here trusts them further than it must: a `206` must
//! start exactly where we asked, a length must agree with the size the
//! control service recorded, and a `Retry-After` is capped.

use std::time::{Duration, SystemTime};

/// The longest wait a `Retry-After` can ask for; longer asks wait this long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(120);
/// The wait on a `503` or `429` without a usable `Retry-After`.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(5);

/// One reply head, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The body is the file from `start` (0 for a `200`).
    Body {
        /// The offset the body starts at.
        start: u64,
        /// The validator to resume with (`ETag`, else `Last-Modified`).
        validator: Option<String>,
    },
    /// The server is busy (`503` or `429`): ask again after this long.
    Busy {
        /// How long to wait (capped at [`MAX_RETRY_AFTER`]).
        wait: Duration,
    },
    /// This source cannot serve the image; the reason is for a person.
    Refused {
        /// Why, e.g. `HTTP 404` or `206 from 0, asked from 4096`.
        reason: String,
    },
}

/// Classifies a reply to `GET` with `Range: bytes=<asked_from>-` (none when
/// `asked_from` is 0) for a file of `size` bytes. `header` looks a header up
/// by its lowercase name.
pub fn classify<'h>(
    status: u16,
    header: impl Fn(&str) -> Option<&'h [u8]>,
    asked_from: u64,
    size: u64,
    now: SystemTime,
) -> Reply {
    let validator = header("etag")
        .or_else(|| header("last-modified"))
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty() && v.len() <= 256 && v.bytes().all(|b| b.is_ascii_graphic()));
    let refused = |reason: String| Reply::Refused { reason };
    match status {
        200 => {
            if let Some(length) = header("content-length").and_then(parse_u64)
                && length != size
            {
                return refused(format!(
                    "the server's file has {length} bytes, the control service recorded {size}"
                ));
            }
            Reply::Body {
                start: 0,
                validator,
            }
        }
        206 => {
            let Some(range) = header("content-range").and_then(parse_content_range) else {
                return refused("206 without a usable Content-Range".to_owned());
            };
            if range.start != asked_from {
                return refused(format!(
                    "206 from byte {}, asked from {asked_from}",
                    range.start
                ));
            }
            if range.total.is_some_and(|total| total != size) || range.end + 1 != size {
                return refused(format!(
                    "206 for bytes {}-{} of {}, the control service recorded {size}",
                    range.start,
                    range.end,
                    range.total.map_or("*".to_owned(), |t| t.to_string())
                ));
            }
            Reply::Body {
                start: range.start,
                validator,
            }
        }
        503 | 429 => Reply::Busy {
            wait: header("retry-after")
                .and_then(|v| parse_retry_after(v, now))
                .unwrap_or(DEFAULT_RETRY_AFTER)
                .min(MAX_RETRY_AFTER),
        },
        416 => refused(format!("416: the server has fewer than {asked_from} bytes")),
        _ => refused(format!("HTTP {status}")),
    }
}

/// A `Content-Range: bytes <start>-<end>/<total or *>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    /// The first byte.
    pub start: u64,
    /// The last byte (inclusive).
    pub end: u64,
    /// The file's size, if given.
    pub total: Option<u64>,
}

/// Parses a `Content-Range` value (RFC 9110 section 14.4); `None` for an
/// unsatisfied range or anything malformed.
pub fn parse_content_range(value: &[u8]) -> Option<ContentRange> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let rest = value.strip_prefix("bytes ")?.trim_start();
    let (span, total) = rest.split_once('/')?;
    let (start, end) = span.split_once('-')?;
    let start = parse_u64(start.as_bytes())?;
    let end = parse_u64(end.as_bytes())?;
    let total = match total {
        "*" => None,
        total => Some(parse_u64(total.as_bytes())?),
    };
    if end < start || total.is_some_and(|t| end >= t) {
        return None;
    }
    Some(ContentRange { start, end, total })
}

/// Parses a `Retry-After` value: delay seconds, or an HTTP date (a date in
/// the past means now).
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if let Some(seconds) = parse_u64(text.as_bytes()) {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A decimal number of at most 19 digits, nothing else.
fn parse_u64(value: &[u8]) -> Option<u64> {
    let value = std::str::from_utf8(value).ok()?.trim();
    if value.is_empty() || value.len() > 19 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers<'a>(list: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a [u8]> {
        move |name| {
            list.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_bytes())
        }
    }

    #[test]
    fn a_whole_file_and_a_resumed_one_are_bodies() {
        let now = SystemTime::UNIX_EPOCH;
        let h = [("content-length", "100"), ("etag", "\"abc\"")];
        assert_eq!(
            classify(200, headers(&h), 0, 100, now),
            Reply::Body {
                start: 0,
                validator: Some("\"abc\"".to_owned())
            }
        );
        let h = [("content-range", "bytes 40-99/100")];
        assert_eq!(
            classify(206, headers(&h), 40, 100, now),
            Reply::Body {
                start: 40,
                validator: None
            }
        );
    }

    #[test]
    fn lengths_and_ranges_must_agree_with_the_recorded_size() {
        let now = SystemTime::UNIX_EPOCH;
        let refused = |r: Reply| matches!(r, Reply::Refused { .. });
        assert!(refused(classify(
            200,
            headers(&[("content-length", "99")]),
            0,
            100,
            now
        )));
        // A 206 that starts elsewhere, ends early or names another size.
        for range in [
            "bytes 0-99/100",
            "bytes 40-98/100",
            "bytes 40-99/101",
            "bytes */100",
        ] {
            assert!(
                refused(classify(
                    206,
                    headers(&[("content-range", range)]),
                    40,
                    100,
                    now
                )),
                "{range}"
            );
        }
        assert!(refused(classify(206, headers(&[]), 40, 100, now)));
        assert!(refused(classify(404, headers(&[]), 0, 100, now)));
    }

    #[test]
    fn busy_waits_as_told_within_bounds() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let busy = |h: &[(&str, &str)]| classify(503, headers(h), 0, 1, now);
        assert_eq!(
            busy(&[("retry-after", "7")]),
            Reply::Busy {
                wait: Duration::from_secs(7)
            }
        );
        assert_eq!(
            busy(&[("retry-after", "99999")]),
            Reply::Busy {
                wait: MAX_RETRY_AFTER
            }
        );
        assert_eq!(
            busy(&[("retry-after", "soon")]),
            Reply::Busy {
                wait: DEFAULT_RETRY_AFTER
            }
        );
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            busy(&[("retry-after", &date)]),
            Reply::Busy {
                wait: Duration::from_secs(30)
            }
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(
            busy(&[("retry-after", &past)]),
            Reply::Busy {
                wait: Duration::ZERO
            }
        );
    }

    #[test]
    fn content_ranges_parse_strictly() {
        assert_eq!(
            parse_content_range(b"bytes 0-9/10"),
            Some(ContentRange {
                start: 0,
                end: 9,
                total: Some(10)
            })
        );
        assert_eq!(
            parse_content_range(b"bytes 5-9/*").map(|r| r.total),
            Some(None)
        );
        for bad in [
            &b"bytes 9-5/10"[..],
            b"bytes 0-10/10",
            b"bytes -5/10",
            b"items 0-9/10",
            b"bytes 0-99999999999999999999/1",
            b"bytes +1-9/10",
            b"\xff",
        ] {
            assert_eq!(parse_content_range(bad), None, "{bad:?}");
        }
    }
}
