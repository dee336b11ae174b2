//! The real `mprov-jobserver` keeps its identity: the control service gives
//! job servers a certificate of two minutes (`--jobserver-cert-seconds 120`),
//! and the job server renews it through `/enroll/renew/` before it ends.
//! curl, with each certificate in turn, shows the old one revoked and the
//! new one accepted; the job server still follows the boot config after the
//! renewal; its `/metrics` counts the renewal.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mprov_api::client::{Auth, Client};
use rustls::pki_types::pem::PemObject as _;
use serde_json::json;

use crate::{TlsControl, insert_api_key, jobserver, listen_file, plain, wait_log};

const VALIDITY: u64 = 120;

/// curl against the control service: `GET /api/v1/bootconfig` with the
/// certificate and key given (PEM files); the HTTP status.
fn curl_bootconfig(url: &str, ca: &Path, cert: &Path, key: &Path) -> u16 {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg("--cacert")
        .arg(ca)
        .arg("--cert")
        .arg(cert)
        .arg("--key")
        .arg(key)
        .args(["-H", &mprov_api::version_header_line()])
        .arg(format!("{url}/api/v1/bootconfig"))
        .stdin(Stdio::null())
        .output()
        .expect("running curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// The certificate's serial (hex) and notAfter (Unix seconds).
fn serial_and_end(pem: &[u8]) -> (String, u64) {
    let der = rustls::pki_types::CertificateDer::from_pem_slice(pem).unwrap();
    let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
    (
        hex::encode(parsed.raw_serial()),
        parsed.validity().not_after.timestamp() as u64,
    )
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobserver_renews_its_certificate_before_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let control = TlsControl::start(&d, &["--jobserver-cert-seconds", &VALIDITY.to_string()]).await;
    let (url, token, db) = (control.url.clone(), control.token.clone(), &control.db);
    let tls_dir = d.join("tls");
    // An API key, to change the inventory as an admin would.
    let key = insert_api_key(db, "admin").await;
    let admin = Client::builder(&url, Auth::ApiKey(key.key.clone()))
        .ca_certificates_pem(control.ca_pem.clone().into_bytes())
        .build()
        .unwrap();

    let log = d.join("js.log");
    let identity = d.join("js/identity");
    let ca = tls_dir.join("ca.crt");
    let mut js = jobserver(&url, &d, &log, Some(&token));

    let (u, l, id, cafile) = (url.clone(), log.clone(), identity.clone(), ca.clone());
    let (old_serial, old_end) = tokio::task::spawn_blocking(move || {
        wait_log(&l, "new boot config", Duration::from_secs(30));
        // Keep the first certificate and key, to try them after renewal.
        let old_cert = std::fs::read(id.join("jobserver.crt")).unwrap();
        std::fs::write(id.join("old.crt"), &old_cert).unwrap();
        std::fs::copy(id.join("jobserver.key"), id.join("old.key")).unwrap();
        let (serial, end) = serial_and_end(&old_cert);
        let issued = now();
        assert!(
            end <= issued + VALIDITY + 5,
            "the certificate lasts {} s",
            end - issued
        );
        assert_eq!(
            curl_bootconfig(&u, &cafile, &id.join("old.crt"), &id.join("old.key")),
            200
        );
        // Renewed when a third is left: about 80 s after issue.
        let text = wait_log(
            &l,
            "renewed the job server certificate",
            Duration::from_secs(VALIDITY + 30),
        );
        assert!(
            now() < end,
            "renewed only after the old certificate ended:\n{text}"
        );
        (serial, end)
    })
    .await
    .unwrap();

    let new_cert = std::fs::read(identity.join("jobserver.crt")).unwrap();
    let (new_serial, new_end) = serial_and_end(&new_cert);
    assert_ne!(new_serial, old_serial);
    assert!(new_end > old_end);
    // The old certificate is revoked, the new one works (curl, not our client).
    assert_ne!(
        curl_bootconfig(
            &url,
            &ca,
            &identity.join("old.crt"),
            &identity.join("old.key")
        ),
        200,
        "the old certificate still works after renewal"
    );
    assert_eq!(
        curl_bootconfig(
            &url,
            &ca,
            &identity.join("jobserver.crt"),
            &identity.join("jobserver.key")
        ),
        200
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(identity.join("jobserver.key"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the new key is owner-only");

    // The job server still follows the boot config, with the new certificate.
    admin
        .create(
            "systems",
            &json!({"hostname": "c77", "nics": [{"mac": "52:54:00:00:07:77", "ipv4": "10.0.0.77"}]}),
        )
        .await
        .unwrap();
    let l = log.clone();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = plain(&std::fs::read_to_string(&l).unwrap_or_default());
            let after = text
                .split("renewed the job server certificate")
                .nth(1)
                .unwrap_or_default();
            if after.contains("new boot config") && after.contains("hosts=1") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no new boot config after the renewal:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .unwrap();

    // Long written by now: it has followed and renewed.
    let listening =
        mprov_tests::listen::wait(&listen_file(&d), &mut js.0, Duration::from_secs(5)).unwrap();
    let metrics = job_metrics(listening.get("metrics").unwrap());
    assert!(
        metrics.contains("mprov_jobserver_cert_renewals_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mprov_jobserver_cert_near_expiry 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("mprov_jobserver_cert_not_after {new_end}")),
        "{metrics}"
    );
    drop(js);
    control.stop().await;
}

/// The job server's metrics, fetched with curl.
fn job_metrics(at: std::net::SocketAddr) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5"])
        .arg(format!("http://{at}/metrics"))
        .stdin(Stdio::null())
        .output()
        .expect("running curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
