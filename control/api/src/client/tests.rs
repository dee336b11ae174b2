//! The client's URLs, version checks, error bodies and redacted `Debug`, and
//! whole requests against a one-shot HTTP server on loopback.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::thread;

use serde_json::json;

use super::*;

fn client(base: &str) -> Client {
    Client::builder(base, Auth::None)
        .danger_skip_version_check(false)
        .build()
        .expect("client")
}

#[test]
fn version_check() {
    let ours = api_version();
    let other = "0.0";
    let ok = HeaderValue::from_static(ours);
    let wrong = HeaderValue::from_static(other);
    let check =
        |status: StatusCode, header: Option<&HeaderValue>, expected: Result<(), Option<&str>>| {
            let got = check_version(status, header, ours).map_err(|e| match e {
                ClientError::VersionMismatch { server, ours: o } => {
                    assert_eq!(o, ours);
                    server
                }
                other => panic!("unexpected {other:?}"),
            });
            assert_eq!(
                got,
                expected.map_err(|s| s.map(str::to_owned)),
                "{status} {header:?}"
            );
        };
    check(StatusCode::OK, Some(&ok), Ok(()));
    check(StatusCode::NOT_FOUND, Some(&ok), Ok(()));
    check(StatusCode::UNAUTHORIZED, Some(&ok), Ok(()));
    check(StatusCode::OK, Some(&wrong), Err(Some(other)));
    check(StatusCode::BAD_REQUEST, Some(&wrong), Err(Some(other)));
    check(StatusCode::OK, None, Err(None));
    check(StatusCode::UPGRADE_REQUIRED, Some(&wrong), Err(Some(other)));
    check(StatusCode::UPGRADE_REQUIRED, None, Err(None));
    // A 426 is a refusal even if the header happens to match.
    check(StatusCode::UPGRADE_REQUIRED, Some(&ok), Err(Some(ours)));
}

#[test]
fn version_messages_name_both_versions_and_the_fix() {
    let e = ClientError::VersionMismatch {
        server: Some("9.9".to_owned()),
        ours: "0.1",
    };
    let msg = e.to_string();
    assert!(msg.contains("9.9") && msg.contains("0.1"), "{msg}");
    assert!(
        msg.contains("upgrade mash and the server together"),
        "{msg}"
    );
    let e = ClientError::VersionMismatch {
        server: None,
        ours: "0.1",
    };
    let msg = e.to_string();
    assert!(msg.contains(VERSION_HEADER) && msg.contains("0.1"), "{msg}");
    assert!(
        msg.contains("upgrade mash and the server together"),
        "{msg}"
    );
    let e = ClientError::VersionMismatch {
        server: Some("0.1".to_owned()),
        ours: "0.1",
    };
    assert!(e.to_string().contains("proxy"), "{e}");
}

#[test]
fn kind_urls() {
    let check =
        |base: &str, kind: &str, key: Option<&str>, query: &[(&str, &str)], expected: &str| {
            let url = client(base).kind_url(kind, key, query);
            assert_eq!(url.as_str(), expected, "{base} {kind} {key:?} {query:?}");
        };
    check(
        "http://mpcc:8080",
        "systems",
        None,
        &[],
        "http://mpcc:8080/api/v1/systems/",
    );
    check(
        "http://mpcc:8080/",
        "systems",
        None,
        &[],
        "http://mpcc:8080/api/v1/systems/",
    );
    check(
        "https://h/mprov",
        "groups",
        Some("gpu"),
        &[],
        "https://h/mprov/api/v1/groups/gpu",
    );
    check(
        "https://h/mprov/",
        "groups",
        Some("12"),
        &[],
        "https://h/mprov/api/v1/groups/12",
    );
    check(
        "http://h",
        "systems",
        Some("bulk"),
        &[],
        "http://h/api/v1/systems/bulk",
    );
    check(
        "http://h",
        "systems",
        Some(""),
        &[],
        "http://h/api/v1/systems/",
    );
    // A key is one path segment, whatever it contains.
    check(
        "http://h",
        "systems",
        Some("a b/../c?d#e"),
        &[],
        "http://h/api/v1/systems/a%20b%2F..%2Fc%3Fd%23e",
    );
    check(
        "http://h",
        "systems",
        None,
        &[("hostname", "n 1&x=y"), ("sort", "-id"), ("limit", "5")],
        "http://h/api/v1/systems/?hostname=n+1%26x%3Dy&sort=-id&limit=5",
    );
}

#[test]
fn path_urls() {
    let c = client("https://h:8443/mprov");
    let ok = |path: &str, expected: &str| {
        assert_eq!(c.path_url(path).expect(path).as_str(), expected);
    };
    ok(
        "/api/v1/systems/n1/config",
        "https://h:8443/mprov/api/v1/systems/n1/config",
    );
    ok(
        "/api/v1/revision?wait=30",
        "https://h:8443/mprov/api/v1/revision?wait=30",
    );
    for bad in [
        "api/v1/x",
        "//evil.example/x",
        "/x:y",
        "/../etc",
        "/https://evil.example/",
    ] {
        match c.path_url(bad) {
            Err(ClientError::BadPath { .. }) => {}
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn base_urls() {
    for good in [
        "http://h",
        "https://h:8443/",
        "http://127.0.0.1:1234/prefix/",
    ] {
        assert!(parse_base_url(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        "h:8080",
        "ftp://h/",
        "mailto:x@y",
        "http://h/?x=1",
        "http://h/#f",
        "not a url",
    ] {
        match parse_base_url(bad) {
            Err(ClientError::BadBaseUrl { .. }) => {}
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn error_bodies() {
    let body = br#"{"error":"invalid_field","message":"bad MAC","field":"rows[3].nics[0].mac"}"#;
    match api_error(StatusCode::BAD_REQUEST, body) {
        ClientError::Api { status, body } => {
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert_eq!(body.error, "invalid_field");
            assert_eq!(body.field.as_deref(), Some("rows[3].nics[0].mac"));
        }
        other => panic!("{other:?}"),
    }
    let e = api_error(StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>");
    assert_eq!(e.status(), Some(StatusCode::BAD_GATEWAY));
    assert!(e.to_string().contains("<html>bad gateway</html>"), "{e}");
    let e = api_error(StatusCode::NOT_FOUND, b"");
    assert!(e.to_string().contains("404 Not Found: Not Found"), "{e}");
}

#[test]
fn auth_debug_redacts() {
    let key = format!("{:?}", Auth::ApiKey("sekrit".into()));
    let basic = format!(
        "{:?}",
        Auth::Basic {
            user: "admin".into(),
            password: "sekrit".into()
        }
    );
    assert!(
        !key.contains("sekrit") && !basic.contains("sekrit"),
        "{key} {basic}"
    );
    assert!(basic.contains("admin"));
    assert!(matches!(
        Client::new("http://h", Auth::ApiKey("bad\nkey".into())),
        Err(ClientError::BadCredentials)
    ));
}

/// Answers one HTTP request with `response` on a loopback port; returns the
/// base URL and a handle yielding the request head it read.
fn one_shot_server(response: String) -> (String, thread::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let handle = thread::spawn(move || {
        let (stream, _) = listener.accept().expect("accept");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut head = String::new();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("read");
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().expect("length");
            }
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("body");
        head.push_str(&String::from_utf8_lossy(&body));
        let mut stream = stream;
        stream.write_all(response.as_bytes()).expect("write");
        head
    });
    (base, handle)
}

fn reply(status: &str, version: Option<&str>, body: &str) -> String {
    let version = version
        .map(|v| format!("{VERSION_HEADER}: {v}\r\n"))
        .unwrap_or_default();
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{version}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn run<T>(f: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

#[test]
fn sends_version_and_auth_and_decodes() {
    let body = r#"{"items":[{"id":1,"hostname":"n1"}],"total":1,"next":null}"#;
    let (base, server) = one_shot_server(reply("200 OK", Some(api_version()), body));
    let c = Client::builder(&base, Auth::ApiKey("k.secret".into()))
        .danger_skip_version_check(false)
        .build()
        .expect("client");
    let list = run(c.list("systems", &[("hostname", "n1")])).expect("list");
    assert_eq!(list.items, vec![json!({"id": 1, "hostname": "n1"})]);
    let head = server.join().expect("server").to_ascii_lowercase();
    assert!(
        head.starts_with("get /api/v1/systems/?hostname=n1 http/1.1"),
        "{head}"
    );
    assert!(
        head.contains(&format!("mprov-version: {}\r\n", api_version())),
        "{head}"
    );
    assert!(
        head.contains("authorization: api-key k.secret\r\n"),
        "{head}"
    );
}

#[test]
fn refuses_replies_from_another_version() {
    let (base, server) = one_shot_server(reply("200 OK", Some("99.0"), "{}"));
    let err = run(client(&base).get("systems", "n1")).expect_err("refused");
    server.join().expect("server");
    assert!(
        matches!(&err, ClientError::VersionMismatch { server: Some(v), .. } if v == "99.0"),
        "{err:?}"
    );

    let (base, server) = one_shot_server(reply("200 OK", None, "{}"));
    let err = run(client(&base).get("systems", "n1")).expect_err("refused");
    server.join().expect("server");
    assert!(
        matches!(&err, ClientError::VersionMismatch { server: None, .. }),
        "{err:?}"
    );

    let body = r#"{"error":"upgrade_required","message":"send mProv-Version 99.0"}"#;
    let (base, server) = one_shot_server(reply("426 Upgrade Required", Some("99.0"), body));
    let err = run(client(&base).delete("systems", "n1")).expect_err("refused");
    server.join().expect("server");
    assert!(err.to_string().contains("99.0"), "{err}");
    assert!(err.to_string().contains(api_version()), "{err}");
}

#[test]
fn skipping_the_check_accepts_any_version() {
    let (base, server) = one_shot_server(reply("200 OK", None, r#"{"id":3}"#));
    let c = Client::builder(&base, Auth::None)
        .danger_skip_version_check(true)
        .build()
        .expect("client");
    assert_eq!(run(c.get("images", "3")).expect("get"), json!({"id": 3}));
    server.join().expect("server");
}

#[test]
fn api_errors_and_bulk_bodies() {
    let body = r#"{"error":"invalid_field","message":"rows[1].hostname: taken","field":"rows[1].hostname"}"#;
    let (base, server) = one_shot_server(reply("400 Bad Request", Some(api_version()), body));
    let rows = [json!({"hostname": "a"}), json!({"hostname": "b"})];
    let err = run(client(&base).bulk_create("systems", &rows)).expect_err("400");
    let head = server.join().expect("server");
    assert!(
        head.to_ascii_lowercase()
            .starts_with("post /api/v1/systems/bulk "),
        "{head}"
    );
    assert!(
        head.ends_with(r#"[{"hostname":"a"},{"hostname":"b"}]"#),
        "{head}"
    );
    match err {
        ClientError::Api { status, body } => {
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert_eq!(body.field.as_deref(), Some("rows[1].hostname"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn connection_errors_are_http_errors() {
    // Bind then drop, so nothing listens on the port.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let err =
        run(client(&format!("http://127.0.0.1:{port}")).get("systems", "x")).expect_err("refused");
    assert!(matches!(err, ClientError::Http { .. }), "{err:?}");
    assert!(
        err.to_string().starts_with("GET http://127.0.0.1:"),
        "{err}"
    );
}

#[test]
fn https_clients_build_with_ring() {
    let c = Client::new("https://mpcc.example:8443", Auth::None).expect("client");
    assert_eq!(c.base_url().scheme(), "https");
    assert!(rustls::crypto::CryptoProvider::get_default().is_some());
}
