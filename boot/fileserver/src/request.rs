//! The request head: what the file server reads of an HTTP/1.1 request.
//!
//! The bytes are parsed by `httparse` (the parser under hyper); this module
//! only picks out what serving a file needs and applies our limits. A file
//! server has no use for request bodies, so a request that announces one is
//! refused rather than read (see [`Head::has_body`]).

use std::time::SystemTime;

/// Longest request head accepted, request line and headers together.
pub(crate) const MAX_HEAD: usize = 16 * 1024;
/// Most header fields accepted in one request.
const MAX_HEADERS: usize = 64;

/// The request method, as far as a file server cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    Get,
    Head,
    /// Anything else: answered with 405.
    Other,
}

/// One parsed request head.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) method: Option<Method>,
    /// The request target as sent, e.g. `/images/compute/3/rootfs.tar.zst?x`.
    pub(crate) target: String,
    /// Whether the connection may carry another request after this one:
    /// HTTP/1.1 without `Connection: close`. HTTP/1.0 connections close.
    pub(crate) keep_alive: bool,
    /// A `Content-Length` other than 0, or any `Transfer-Encoding`.
    pub(crate) has_body: bool,
    pub(crate) range: Option<String>,
    pub(crate) if_range: Option<String>,
    /// `If-Match` fields, joined with `,` (a list header, RFC 9110 §5.3).
    pub(crate) if_match: Option<String>,
    /// `If-None-Match` fields, joined with `,`.
    pub(crate) if_none_match: Option<String>,
    pub(crate) if_modified_since: Option<SystemTime>,
    pub(crate) if_unmodified_since: Option<SystemTime>,
}

impl Head {
    pub(crate) fn method(&self) -> Method {
        self.method.unwrap_or(Method::Other)
    }
}

/// Why a request head was refused; each maps to one error response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// Not HTTP/1.x syntax: 400.
    Malformed,
    /// Longer than [`MAX_HEAD`] or more than 64 fields: 431.
    TooLarge,
}

/// Parses the head at the start of `buf`.
///
/// `Ok(None)`: incomplete, read more (unless `buf` already holds
/// [`MAX_HEAD`] bytes, which is [`HeadError::TooLarge`]). `Ok(Some((head,
/// n)))`: the head took the first `n` bytes; what follows is the next request
/// (pipelining), since no body is read.
pub(crate) fn parse(buf: &[u8]) -> Result<Option<(Head, usize)>, HeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut fields);
    let n = match request.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err(HeadError::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(_) => return Err(HeadError::Malformed),
    };
    if n > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    let (Some(method), Some(target), Some(minor)) = (request.method, request.path, request.version)
    else {
        return Err(HeadError::Malformed);
    };
    let mut head = Head {
        method: Some(match method {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            _ => Method::Other,
        }),
        target: target.to_owned(),
        keep_alive: minor == 1,
        ..Head::default()
    };
    for field in request.headers.iter() {
        let value = std::str::from_utf8(field.value).map(str::trim);
        let name = field.name;
        if name.eq_ignore_ascii_case("content-length") {
            // Any value but a plain 0 (a body, or a malformed length) means we
            // cannot tell where the next request starts.
            head.has_body |= value != Ok("0");
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            head.has_body = true;
        } else if name.eq_ignore_ascii_case("connection") {
            let close = value.is_ok_and(|v| {
                v.split(',')
                    .any(|token| token.trim().eq_ignore_ascii_case("close"))
            });
            head.keep_alive &= !close;
        } else if let Ok(value) = value {
            if name.eq_ignore_ascii_case("range") {
                set_once(&mut head.range, value);
            } else if name.eq_ignore_ascii_case("if-range") {
                set_once(&mut head.if_range, value);
            } else if name.eq_ignore_ascii_case("if-match") {
                append(&mut head.if_match, value);
            } else if name.eq_ignore_ascii_case("if-none-match") {
                append(&mut head.if_none_match, value);
            } else if name.eq_ignore_ascii_case("if-modified-since") {
                head.if_modified_since = httpdate::parse_http_date(value).ok();
            } else if name.eq_ignore_ascii_case("if-unmodified-since") {
                head.if_unmodified_since = httpdate::parse_http_date(value).ok();
            }
        }
    }
    Ok(Some((head, n)))
}

/// A field that must appear once: a second copy makes it unusable, which
/// reads as an empty value that matches nothing (a `Range` or `If-Range`
/// sent twice is ignored).
fn set_once(slot: &mut Option<String>, value: &str) {
    *slot = Some(if slot.is_some() {
        String::new()
    } else {
        value.to_owned()
    });
}

fn append(slot: &mut Option<String>, value: &str) {
    match slot {
        Some(list) => {
            list.push(',');
            list.push_str(value);
        }
        None => *slot = Some(value.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Head {
        let (head, n) = parse(text.as_bytes()).unwrap().unwrap();
        assert_eq!(n, text.len());
        head
    }

    #[test]
    fn curl_and_ipxe_requests() {
        let h = head(
            "GET /images/c/1/rootfs.tar.zst HTTP/1.1\r\nHost: 10.0.0.1\r\n\
             User-Agent: curl/7.88.1\r\nAccept: */*\r\nRange: bytes=100-\r\n\r\n",
        );
        assert_eq!(h.method(), Method::Get);
        assert_eq!(h.target, "/images/c/1/rootfs.tar.zst");
        assert!(h.keep_alive);
        assert!(!h.has_body);
        assert_eq!(h.range.as_deref(), Some("bytes=100-"));

        let h = head(
            "GET /boot/ipxe.efi HTTP/1.1\r\nConnection: keep-alive\r\n\
             User-Agent: iPXE/1.21.1+ (g4bd064de)\r\nHost: 10.0.0.1\r\n\r\n",
        );
        assert!(h.keep_alive);
    }

    /// The requests captured from real clients (the fuzz seeds) parse to
    /// what those clients meant.
    #[test]
    fn captured_requests() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fuzz/corpus/http_request");
        let seed = |name: &str| -> Vec<Head> {
            let bytes = std::fs::read(dir.join(format!("seed-{name}"))).expect(name);
            let mut rest = &bytes[..];
            let mut heads = Vec::new();
            while !rest.is_empty() {
                let (head, n) = parse(rest).expect(name).expect(name);
                heads.push(head);
                rest = &rest[n..];
            }
            heads
        };
        let one = |name: &str| {
            let mut heads = seed(name);
            assert_eq!(heads.len(), 1, "{name}");
            heads.remove(0)
        };
        let image = "/images/compute/3/rootfs.tar.zst";

        let get = one("curl-get");
        assert_eq!((get.method(), get.target.as_str()), (Method::Get, image));
        assert!(get.keep_alive && !get.has_body && get.range.is_none());
        assert_eq!(one("curl-range").range.as_deref(), Some("bytes=1000-1999"));
        assert_eq!(one("curl-head").method(), Method::Head);
        let conditional = one("curl-conditional");
        assert_eq!(
            conditional.if_none_match.as_deref(),
            Some("\"1a2b-200000-17f0c3a1b2c3d4e5\"")
        );
        assert!(conditional.if_modified_since.is_some());
        let if_range = one("curl-if-range");
        assert_eq!(if_range.range.as_deref(), Some("bytes=0-9"));
        assert_eq!(
            if_range.if_range.as_deref(),
            Some("\"1a2b-200000-17f0c3a1b2c3d4e5\"")
        );
        assert_eq!(one("curl-resume").range.as_deref(), Some("bytes=5120-"));
        assert!(one("wget-keepalive").keep_alive);
        let busybox = one("busybox-wget");
        assert!(!busybox.keep_alive);
        assert_eq!(busybox.target, "/images/compute/3/vmlinuz");
        assert_eq!(
            one("python-urllib-query").target,
            "/images/compute/3/manifest.json?x=1%20y"
        );
        assert_eq!(
            one("curl-path-escape").target,
            "/images/%2e%2e/../etc/passwd"
        );
        let methods: Vec<Method> = seed("curl-pipelined-three")
            .iter()
            .map(Head::method)
            .collect();
        assert_eq!(methods, [Method::Get, Method::Get, Method::Head]);
    }

    #[test]
    fn connection_and_body_rules() {
        assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.1\r\nConnection: Keep-Alive, CLOSE\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n").has_body);
        assert!(head("GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\n").has_body);
        assert!(head("GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n").has_body);
        assert!(head("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").has_body);
        assert_eq!(head("DELETE / HTTP/1.1\r\n\r\n").method(), Method::Other);
    }

    #[test]
    fn conditional_fields() {
        let h = head(
            "HEAD /x HTTP/1.1\r\nIf-None-Match: \"a\"\r\nIf-None-Match: W/\"b\", \"c\"\r\n\
             If-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
             If-Unmodified-Since: yesterday\r\nRange: bytes=0-1\r\nRange: bytes=2-3\r\n\r\n",
        );
        assert_eq!(h.method(), Method::Head);
        assert_eq!(h.if_none_match.as_deref(), Some("\"a\",W/\"b\", \"c\""));
        assert_eq!(
            h.if_modified_since,
            Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(784_111_777))
        );
        assert_eq!(h.if_unmodified_since, None);
        assert_eq!(h.range.as_deref(), Some(""));
    }

    #[test]
    fn partial_malformed_and_too_large() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: x\r\n"), Ok(None));
        assert_eq!(parse(b"GET / HTTP/1.1\r\n\r\nGET /next"), {
            let h = head("GET / HTTP/1.1\r\n\r\n");
            Ok(Some((h, 18)))
        });
        assert_eq!(parse(b"\x16\x03\x01\x02\x00"), Err(HeadError::Malformed));
        assert_eq!(parse(b"GET / HTTP/2.0\r\n\r\n"), Err(HeadError::Malformed));
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(parse(long.as_bytes()), Err(HeadError::TooLarge));
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "X: y\r\n".repeat(MAX_HEADERS + 1)
        );
        assert_eq!(parse(many.as_bytes()), Err(HeadError::TooLarge));
    }
}
