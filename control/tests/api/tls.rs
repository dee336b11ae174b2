//! The install's CA and the HTTPS listener, judged from the outside with
//! openssl and curl: file modes, the certificate's names and validity, the
//! chain, the optional client certificate, renewal when the names change, a
//! site certificate, and the settings that must stop the start.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::{P256, STATUS_ONLY, on_sqlite};
use crate::process::{Server, mode, serve_to_exit};

/// Runs a tool that must be installed (`cargo xtask test` installs it).
fn tool(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} (is it installed?): {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `openssl verify` accepts `cert` as issued under `ca`.
fn assert_verifies(ca: &Path, cert: &Path) {
    let verify = text(&tool(
        "openssl",
        &[
            "verify",
            "-CAfile",
            ca.to_str().unwrap(),
            cert.to_str().unwrap(),
        ],
    ));
    assert!(verify.contains(": OK"), "{verify}");
}

fn x509(cert: &Path, args: &[&str]) -> String {
    let mut all = vec!["x509", "-in", cert.to_str().unwrap(), "-noout"];
    all.extend_from_slice(args);
    let out = tool("openssl", &all);
    assert!(
        out.status.success(),
        "openssl x509 {args:?}: {}",
        text(&out)
    );
    text(&out)
}

/// A self-signed P-256 certificate made by openssl, valid `days`, with
/// `subject` and one subjectAltName.
fn self_signed(key: &Path, cert: &Path, days: &str, subject: &str, san: &str) {
    let san = format!("subjectAltName={san}");
    let (key, cert) = (key.to_str().unwrap(), cert.to_str().unwrap());
    let args = [
        &["req", "-x509"][..],
        &P256,
        &["-nodes", "-days", days, "-subj", subject, "-addext", &san],
        &["-keyout", key, "-out", cert],
    ]
    .concat();
    let out = tool("openssl", &args);
    assert!(out.status.success(), "{}", text(&out));
}

/// `openssl s_client` against the HTTPS port, trusting `ca`.
fn s_client(port: u16, ca: &Path) -> String {
    let connect = format!("127.0.0.1:{port}");
    text(&tool(
        "openssl",
        &[
            "s_client",
            "-connect",
            &connect,
            "-CAfile",
            ca.to_str().unwrap(),
            "-verify_return_error",
            "-servername",
            "localhost",
        ],
    ))
}

fn curl(args: &[&str]) -> (bool, String) {
    let out = tool("curl", args);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_certificates_from_outside() {
    on_sqlite(check_https).await;
}

fn check_https(dir: &Path, url: &str) {
    let mut s = Server::start(dir, url, 1, &[]);
    let tls = dir.join("var/tls");
    let (ca, crt) = (tls.join("ca.crt"), tls.join("server.crt"));
    assert_eq!(mode(&tls), 0o700);
    for (file, want) in [
        ("ca.key", 0o600),
        ("server.key", 0o600),
        ("ca.crt", 0o644),
        ("server.crt", 0o644),
    ] {
        assert_eq!(mode(&tls.join(file)), want, "{file}");
    }

    // Privilege separation: the web service and the signing helper run as
    // their own users, and the web service's user cannot open the CA key.
    // The helper's supervisor keeps root (to start the helper again); the
    // helper itself, its only child, runs as mprov-signer.
    // The listen file is written just before the service drops to its user
    // (it may be where only root writes), so wait for the switch.
    let web_uid = settled_uid(s.pid());
    let supervisor = children(s.pid());
    assert_eq!(
        supervisor.len(),
        1,
        "one signing supervisor: {supervisor:?}"
    );
    assert_eq!(uid_of(supervisor[0]), 0, "the supervisor stays root");
    let helper = children(supervisor[0]);
    assert_eq!(helper.len(), 1, "one signing helper: {helper:?}");
    let helper_uid = uid_of(helper[0]);
    assert_eq!(web_uid, user_id("mprov"), "the web service runs as mprov");
    assert_eq!(
        helper_uid,
        user_id("mprov-signer"),
        "the helper runs as mprov-signer"
    );
    let as_web = tool(
        "setpriv",
        &[
            &format!("--reuid={web_uid}"),
            &format!("--regid={web_uid}"),
            "--clear-groups",
            "cat",
            tls.join("ca.key").to_str().unwrap(),
        ],
    );
    assert!(
        !as_web.status.success() && text(&as_web).contains("Permission denied"),
        "the web service's user must not read the CA key: {}",
        text(&as_web)
    );
    let owner = std::fs::metadata(tls.join("ca.key")).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&owner),
        0,
        "ca.key stays root's"
    );

    // The chain, the names, a year's validity, a CA that is a CA.
    assert_verifies(&ca, &crt);
    let san = x509(&crt, &["-ext", "subjectAltName"]);
    for name in [
        "DNS:localhost",
        "DNS:mpcc",
        "DNS:mpcc.cluster",
        "IP Address:10.0.0.1",
        "IP Address:127.0.0.1",
        "IP Address:FD00:0:0:0:0:0:0:1",
    ] {
        assert!(san.contains(name), "{name} missing from {san}");
    }
    assert!(
        !san.contains("fd00::2") && !san.contains("10.0.0.2"),
        "{san}"
    );
    let day = 86_400;
    let ends_after = |secs: u64| {
        tool(
            "openssl",
            &[
                "x509",
                "-in",
                crt.to_str().unwrap(),
                "-noout",
                "-checkend",
                &secs.to_string(),
            ],
        )
        .status
        .success()
    };
    assert!(ends_after(364 * day), "valid for about a year");
    assert!(!ends_after(366 * day), "valid for no more than a year");
    let ca_text = x509(&ca, &["-text"]);
    assert!(ca_text.contains("CA:TRUE"), "{ca_text}");
    assert!(x509(&crt, &["-text"]).contains("TLS Web Server Authentication"));

    // A real TLS client: the chain verifies, and the server asks for an
    // optional client certificate from our CA.
    let hello = s_client(s.https_port, &ca);
    assert!(hello.contains("Verify return code: 0 (ok)"), "{hello}");
    let ca_subject = x509(&ca, &["-subject", "-nameopt", "RFC2253"]);
    let ca_cn = ca_subject
        .split("CN=")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap()
        .trim()
        .to_owned();
    assert!(
        hello.contains("Acceptable client certificate CA names") && hello.contains(&ca_cn),
        "the server must ask for a client certificate from {ca_cn}:\n{hello}"
    );

    // curl without a client certificate: the CA is public, the API needs a key.
    let base = format!("https://127.0.0.1:{}", s.https_port);
    let ca_arg = ca.to_str().unwrap();
    let (ok, body) = curl(&[
        "-sS",
        "--fail",
        "--cacert",
        ca_arg,
        &format!("{base}/ca.crt"),
    ]);
    assert!(ok, "anonymous /ca.crt over HTTPS");
    assert_eq!(body, std::fs::read_to_string(&ca).unwrap());
    let systems = format!("{base}/api/v1/systems/");
    let (_, code) = curl(&[&STATUS_ONLY[..], &["--cacert", ca_arg, &systems]].concat());
    assert_eq!(code, "401");
    let key = std::fs::read_to_string(dir.join("etc/apikey")).unwrap();
    let key = key.trim().trim_start_matches("export MPROV_APIKEY=");
    let (ok, body) = curl(&[
        "-sS",
        "--fail",
        "--cacert",
        ca_arg,
        "-H",
        &format!("Authorization: Api-Key {key}"),
        "-H",
        &mprov_api::version_header_line(),
        &format!("{base}/api/v1/systems/mpcc"),
    ]);
    assert!(ok && body.contains("\"mpcc\""), "{body}");
    // Plain HTTP serves the same CA.
    let (ok, plain) = curl(&[
        "-sS",
        "--fail",
        &format!("http://127.0.0.1:{}/ca.crt", s.port),
    ]);
    assert!(ok && plain == body_of(&ca));
    let serial = x509(&crt, &["-serial"]);
    let fingerprint = x509(&ca, &["-fingerprint", "-sha256"]);
    let log = s.stop();
    assert!(
        log.contains("made this install's certificate authority"),
        "{log}"
    );
    let sha = fingerprint
        .trim()
        .rsplit('=')
        .next()
        .unwrap()
        .replace(':', "")
        .to_ascii_lowercase();
    assert!(
        log.contains(&sha),
        "the log names the CA fingerprint {sha}:\n{log}"
    );

    // Second start, same names: the same certificate is kept.
    let mut s = Server::start(dir, url, 2, &[]);
    assert_eq!(x509(&crt, &["-serial"]), serial, "kept while names hold");
    let log = s.stop();
    assert!(
        !log.contains("made this install's certificate authority"),
        "{log}"
    );

    // Another address: made again at start, from the same CA.
    let mut s = Server::start(dir, url, 3, &[("MPROV_MPCC_IPs", "10.0.0.2,fd00::1")]);
    assert_ne!(
        x509(&crt, &["-serial"]),
        serial,
        "renewed when the names change"
    );
    let san = x509(&crt, &["-ext", "subjectAltName"]);
    assert!(
        san.contains("IP Address:10.0.0.2") && !san.contains("IP Address:10.0.0.1,"),
        "{san}"
    );
    assert_eq!(
        x509(&ca, &["-fingerprint", "-sha256"]),
        fingerprint,
        "the CA stays"
    );
    assert!(s_client(s.https_port, &ca).contains("Verify return code: 0 (ok)"));
    let log = s.stop();
    assert!(log.contains("host names or addresses changed"), "{log}");

    // A certificate with 10 days left (same names, same CA, put in place
    // from outside): made again at start, valid a year.
    let names = x509(&crt, &["-ext", "subjectAltName"]);
    {
        let ca_key = rcgen::KeyPair::from_pem(&body_of(&tls.join("ca.key"))).unwrap();
        let issuer = rcgen::Issuer::from_ca_cert_pem(&body_of(&ca), ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec![
            "localhost".to_owned(),
            "mpcc".to_owned(),
            "mpcc.cluster".to_owned(),
            "10.0.0.2".to_owned(),
            "fd00::1".to_owned(),
            "127.0.0.1".to_owned(),
        ])
        .unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, "mpcc");
        let now = std::time::SystemTime::now();
        p.not_before = now.into();
        p.not_after = (now + std::time::Duration::from_secs(10 * 86_400)).into();
        let cert = p.signed_by(&key, &issuer).unwrap();
        std::fs::write(&crt, cert.pem()).unwrap();
        std::fs::write(tls.join("server.key"), key.serialize_pem()).unwrap();
    }
    assert!(
        !ends_after(11 * day),
        "the planted certificate ends in 10 days"
    );
    let planted = x509(&crt, &["-serial"]);
    let mut s = Server::start(dir, url, 4, &[("MPROV_MPCC_IPs", "10.0.0.2,fd00::1")]);
    assert_ne!(x509(&crt, &["-serial"]), planted, "renewed under 30 days");
    assert!(ends_after(364 * day), "valid a year again");
    assert_eq!(x509(&crt, &["-ext", "subjectAltName"]), names);
    let log = s.stop();
    assert!(log.contains("under 30 days left"), "{log}");
}

/// The real user id of process `pid` once it has left root, or root after
/// 10 s of waiting.
fn settled_uid(pid: u32) -> u32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let uid = uid_of(pid);
        if uid != 0 || std::time::Instant::now() > deadline {
            return uid;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The real user id of process `pid`.
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// The child processes of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = task.unwrap().path().join("children");
        if let Ok(list) = std::fs::read_to_string(path) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

fn user_id(name: &str) -> u32 {
    let out = tool("id", &["-u", name]);
    assert!(out.status.success(), "no user {name}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn body_of(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn site_certificate_and_settings_that_stop_the_start() {
    on_sqlite(check_site).await;
}

fn check_site(dir: &Path, url: &str) {
    let site = dir.join("site");
    std::fs::create_dir(&site).unwrap();
    let (cert, key, other_key) = (site.join("c.pem"), site.join("k.pem"), site.join("o.pem"));
    self_signed(&key, &cert, "30", "/CN=site.example", "IP:127.0.0.1");
    let out = tool(
        "openssl",
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            other_key.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let (c, k, o) = (
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
        other_key.to_str().unwrap(),
    );

    // Half a site certificate: refused with the reason.
    for (var, value, missing) in [
        ("MPROV_TLS_CERT", c, "MPROV_TLS_KEY"),
        ("MPROV_TLS_KEY", k, "MPROV_TLS_CERT"),
    ] {
        let (ok, log) = serve_to_exit(dir, url, &[(var, value)]);
        assert!(!ok, "{log}");
        assert!(
            log.contains(&format!("{var} is set but {missing} is not")),
            "{log}"
        );
    }
    // A key that is not the certificate's.
    let (ok, log) = serve_to_exit(dir, url, &[("MPROV_TLS_CERT", c), ("MPROV_TLS_KEY", o)]);
    assert!(!ok && log.contains("cannot be used together"), "{log}");
    // A TLS folder that cannot be made (under a regular file).
    let blocker = dir.join("not-a-folder");
    std::fs::write(&blocker, "x").unwrap();
    let bad = blocker.join("tls");
    let (ok, log) = serve_to_exit(dir, url, &[("MPROV_TLS_DIR", bad.to_str().unwrap())]);
    assert!(
        !ok && log.contains("cannot create the TLS folder") && log.contains("not-a-folder"),
        "{log}"
    );

    // Both: the site certificate is served, and the CA is made all the same.
    let mut s = Server::start(dir, url, 1, &[("MPROV_TLS_CERT", c), ("MPROV_TLS_KEY", k)]);
    let hello = s_client(s.https_port, &cert);
    assert!(
        hello.contains("site.example") && hello.contains("Verify return code: 0 (ok)"),
        "{hello}"
    );
    assert!(dir.join("var/tls/ca.crt").exists() && dir.join("var/tls/ca.key").exists());
    assert!(
        !dir.join("var/tls/server.crt").exists(),
        "no own HTTPS certificate needed"
    );
    let log = s.stop();
    assert!(log.contains("site certificate"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_server_enrollment_and_mtls() {
    on_sqlite(check_enrollment).await;
}

/// A key and CSR made by openssl; `extra` adds `-addext` arguments.
fn openssl_csr(dir: &Path, name: &str, subject: &str, extra: &[&str]) -> String {
    let key = dir.join(format!("{name}.key"));
    let csr = dir.join(format!("{name}.csr"));
    let mut args = vec!["req", "-new"];
    args.extend_from_slice(&P256);
    args.extend_from_slice(&[
        "-nodes",
        "-subj",
        subject,
        "-keyout",
        key.to_str().unwrap(),
        "-out",
        csr.to_str().unwrap(),
    ]);
    for e in extra {
        args.extend_from_slice(&["-addext", e]);
    }
    let out = tool("openssl", &args);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::read_to_string(csr).unwrap()
}

/// POSTs JSON to `path` over HTTPS; the status and the body.
fn post_json(
    port: u16,
    ca: &Path,
    path: &str,
    body: &serde_json::Value,
    dir: &Path,
) -> (String, String) {
    let file = dir.join("body.json");
    std::fs::write(&file, body.to_string()).unwrap();
    let out = tool(
        "curl",
        &[
            "-sS",
            "-w",
            "\n%{http_code}",
            "--cacert",
            ca.to_str().unwrap(),
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &format!("@{}", file.display()),
            &format!("https://127.0.0.1:{port}{path}"),
        ],
    );
    let all = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = all.rsplit_once('\n').unwrap_or((&all, ""));
    (code.to_owned(), body.to_owned())
}

/// A GET of `/api/v1/systems/` over HTTPS with a client certificate and the
/// version header; the status code.
fn systems_with_cert(port: u16, ca: &Path, cert: &Path, key: &Path) -> String {
    curl_with_cert(port, ca, cert, key, "/api/v1/systems/", true, &[])
}

/// curl over HTTPS with a client certificate, the version header when
/// `version` and `extra` arguments; the status code.
fn curl_with_cert(
    port: u16,
    ca: &Path,
    cert: &Path,
    key: &Path,
    path: &str,
    version: bool,
    extra: &[&str],
) -> String {
    let v = mprov_api::version_header_line();
    let mut args = STATUS_ONLY.to_vec();
    args.extend_from_slice(&[
        "--cacert",
        ca.to_str().unwrap(),
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    if version {
        args.extend_from_slice(&["-H", &v]);
    }
    args.extend_from_slice(extra);
    let url = format!("https://127.0.0.1:{port}{path}");
    args.push(&url);
    let out = tool("curl", &args);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn check_enrollment(dir: &Path, url: &str) {
    let mut s = Server::start(dir, url, 1, &[]);
    let ca = dir.join("var/tls/ca.crt");
    let work = dir.join("js");
    std::fs::create_dir(&work).unwrap();

    // The local job server's token, owner-only, kept across a restart.
    let token_file = dir.join("etc/enroll_token");
    assert_eq!(mode(&token_file), 0o600);
    let local = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();
    let make_token = |name: &str, extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_mprov-control"))
            .args(["enroll-token", "--name", name, "--hours", "2"])
            .args(extra)
            .env("MPROV_CONFIG_DIR", dir.join("etc"))
            .env("MPROV_STATE_DIR", dir.join("var"))
            .env("MPROV_DATABASE_URL", url)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let token = make_token("js1", &[]);

    let csr = openssl_csr(&work, "js1", "/CN=js1", &[]);
    let enroll = |token: &str, name: &str, csr: &str| {
        post_json(
            s.https_port,
            &ca,
            "/enroll/jobserver/",
            &serde_json::json!({"token": token, "name": name, "csr": csr}),
            &work,
        )
    };
    // A CSR asking for CA rights or for another name: refused, and the
    // token is not spent.
    let ca_csr = openssl_csr(
        &work,
        "bad",
        "/CN=js1",
        &["basicConstraints=critical,CA:TRUE"],
    );
    let (code, body) = enroll(&token, "js1", &ca_csr);
    assert!(code == "400" && body.contains("CA rights"), "{code} {body}");
    let other = openssl_csr(&work, "other", "/CN=js2", &[]);
    let (code, body) = enroll(&token, "js1", &other);
    assert!(code == "400" && body.contains("js2"), "{code} {body}");

    // The local token is for this host's job server (mpcc) only.
    let (code, body) = enroll(&local, "js1", &csr);
    assert!(
        code == "403" && body.contains("made for") && body.contains("mpcc"),
        "{code} {body}"
    );
    let (code, body) = enroll(&token, "js1", &csr);
    assert_eq!(code, "200", "{body}");
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
    let cert = work.join("js1.crt");
    std::fs::write(&cert, reply["certificate"].as_str().unwrap()).unwrap();
    assert_eq!(reply["ca"].as_str().unwrap(), body_of(&ca));
    assert_verifies(&ca, &cert);
    let ext = x509(
        &cert,
        &["-ext", "subjectAltName,extendedKeyUsage,basicConstraints"],
    );
    assert!(ext.contains("URI:urn:mprov:jobserver:js1"), "{ext}");
    assert!(
        ext.contains("TLS Web Client Authentication") && !ext.contains("Server"),
        "{ext}"
    );
    assert!(ext.contains("CA:FALSE"), "{ext}");

    // The token is single-use.
    let (code, body) = enroll(&token, "js1", &csr);
    assert!(
        code == "401" && body.contains("already used"),
        "{code} {body}"
    );
    let (code, body) = enroll("mpe00000000.nope", "js1", &csr);
    assert!(code == "401" && body.contains("not valid"), "{code} {body}");

    // mTLS: reads with the version header; no version is 426; writes are 403.
    let key = work.join("js1.key");
    assert_eq!(systems_with_cert(s.https_port, &ca, &cert, &key), "200");
    assert_eq!(
        curl_with_cert(
            s.https_port,
            &ca,
            &cert,
            &key,
            "/api/v1/systems/",
            false,
            &[]
        ),
        "426"
    );
    let code = curl_with_cert(
        s.https_port,
        &ca,
        &cert,
        &key,
        "/api/v1/systems/",
        true,
        &[
            "-H",
            "Content-Type: application/json",
            "--data",
            "{\"name\":\"x\"}",
        ],
    );
    assert_eq!(code, "403");

    // An expired token, made by the CLI and aged in the database: one that
    // may replace js1's live certificate.
    let second = make_token("js1", &["--replace"]);
    assert!(second.starts_with("mpe"));
    let db_file = mprov_control::db::sqlite_path(url).unwrap();
    let prefix = second.split('.').next().unwrap();
    let aged = tool(
        "sqlite3",
        &[
            db_file.to_str().unwrap(),
            &format!(
                "UPDATE enroll_tokens SET expires_at = '2000-01-01T00:00:00Z' WHERE prefix = '{prefix}'"
            ),
        ],
    );
    assert!(aged.status.success(), "{}", text(&aged));
    let (code, body) = enroll(&second, "js1", &csr);
    assert!(code == "401" && body.contains("expired"), "{code} {body}");
    let aged = tool(
        "sqlite3",
        &[
            db_file.to_str().unwrap(),
            &format!(
                "UPDATE enroll_tokens SET expires_at = '2999-01-01T00:00:00Z' WHERE prefix = '{prefix}'"
            ),
        ],
    );
    assert!(aged.status.success());

    // Enrolling again revokes the old certificate.
    let csr2 = openssl_csr(&work, "js1b", "/CN=js1", &[]);
    let (code, body) = enroll(&second, "js1", &csr2);
    assert_eq!(code, "200", "{body}");
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
    let cert2 = work.join("js1b.crt");
    std::fs::write(&cert2, reply["certificate"].as_str().unwrap()).unwrap();
    assert_eq!(systems_with_cert(s.https_port, &ca, &cert, &key), "401");
    assert_eq!(
        systems_with_cert(s.https_port, &ca, &cert2, &work.join("js1b.key")),
        "200"
    );

    // A certificate from another CA never gets past the handshake.
    let foreign = work.join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    self_signed(
        &foreign.join("k"),
        &foreign.join("c"),
        "2",
        "/CN=js1",
        "URI:urn:mprov:jobserver:js1",
    );
    let code = systems_with_cert(s.https_port, &ca, &foreign.join("c"), &foreign.join("k"));
    assert_ne!(code, "200", "a foreign certificate must be refused");
    assert!(
        code.is_empty() || code == "000",
        "refused in the TLS handshake, got HTTP {code}"
    );

    // An expired certificate from our own CA: refused in the handshake too.
    let expired = foreign.join("expired");
    {
        let ca_pem = body_of(&ca);
        let ca_key = rcgen::KeyPair::from_pem(&body_of(&dir.join("var/tls/ca.key"))).unwrap();
        let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, "js1");
        p.subject_alt_names = vec![rcgen::SanType::URI(
            "urn:mprov:jobserver:js1".try_into().unwrap(),
        )];
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let cert = p.signed_by(&key, &issuer).unwrap();
        std::fs::write(expired.with_extension("crt"), cert.pem()).unwrap();
        std::fs::write(expired.with_extension("key"), key.serialize_pem()).unwrap();
    }
    let code = systems_with_cert(
        s.https_port,
        &ca,
        &expired.with_extension("crt"),
        &expired.with_extension("key"),
    );
    assert!(
        code.is_empty() || code == "000",
        "an expired certificate is refused in the handshake, got HTTP {code}"
    );

    // Once a job server has enrolled, the local token file is gone.
    let log = s.stop();
    assert!(log.contains("job server enrolled"), "{log}");
    let mut s = Server::start(dir, url, 2, &[]);
    assert!(
        !token_file.exists(),
        "no token file once a job server enrolled"
    );
    s.stop();
}
