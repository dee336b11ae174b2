//! The real `mprov-jobserver` against a control service on HTTPS: its first
//! start enrolls with a one-time token and follows the boot config with its
//! own certificate; a restart reuses the certificate without a token; a
//! revoked certificate stops it from reading anything.

use std::time::{Duration, Instant};

use mprov_control::db::{crud, kinds};
use mprov_control::enrollment;
use mprov_control::secrets::SecretBox;
use rustls::pki_types::pem::PemObject as _;

use crate::{TlsControl, jobserver, wait_log};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobserver_enrolls_then_follows_with_its_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let control = TlsControl::start(&d, &[]).await;
    let (url, token, db) = (control.url.clone(), control.token.clone(), &control.db);

    // Its row in the inventory, which its heartbeat writes to.
    let jobservers = kinds::kind("jobservers").unwrap();
    let row = crud::validate_value(
        jobservers,
        &serde_json::json!({"name": "js1"}),
        crud::Mode::Create,
        &SecretBox::new("k"),
    )
    .unwrap();
    db.create(jobservers, row).await.unwrap();

    let (u, dd) = (url.clone(), d.clone());
    let js = tokio::task::spawn_blocking(move || {
        // First start: enrolls with the token, then follows over mTLS.
        let log = dd.join("js-1.log");
        let js = jobserver(&u, &dd, &log, Some(&token));
        let text = wait_log(&log, "new boot config", Duration::from_secs(30));
        assert!(text.contains("enrolled as job server js1"), "{text}");
        assert!(
            text.contains("as job server js1 (client certificate)"),
            "{text}"
        );
        js
    })
    .await
    .unwrap();
    // Its heartbeat reaches its row: the machine's load, with the time.
    let deadline = Instant::now() + Duration::from_secs(20);
    let row = loop {
        let row = db.get(jobservers, "js1").await.unwrap();
        if row["heartbeat_at"].is_string() || Instant::now() > deadline {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let here =
        mprov_boot::events::load_avg(&std::fs::read_to_string("/proc/loadavg").unwrap()).unwrap();
    let reported = row["load_avg"].as_f64().unwrap_or(-1.0);
    assert!(
        row["heartbeat_at"].is_string() && (reported - here).abs() < 1.0,
        "js1 reported load {reported} (this machine's: {here}): {row:?}"
    );
    drop(js);

    let (u, dd) = (url.clone(), d.clone());
    tokio::task::spawn_blocking(move || {
        let key = dd.join("js/identity/jobserver.key");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&key).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "the key is owner-only");

        // Second start: no token, the kept certificate.
        let log = dd.join("js-2.log");
        let js = jobserver(&u, &dd, &log, None);
        let text = wait_log(&log, "new boot config", Duration::from_secs(30));
        assert!(
            !text.contains("enrolled as"),
            "no second enrollment: {text}"
        );
        drop(js);
    })
    .await
    .unwrap();

    // The credential is on record; revoked, the job server reads nothing.
    assert!(enrollment::jobserver_enrolled(db).await.unwrap());
    let cert = std::fs::read(d.join("js/identity/jobserver.crt")).unwrap();
    let der = rustls::pki_types::CertificateDer::from_pem_slice(&cert).unwrap();
    let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
    let serial = hex::encode(parsed.raw_serial());
    assert!(
        enrollment::revoke_serial(db, &serial, "test")
            .await
            .unwrap()
    );
    let (u, dd) = (url.clone(), d.clone());
    tokio::task::spawn_blocking(move || {
        let log = dd.join("js-3.log");
        let js = jobserver(&u, &dd, &log, None);
        let text = wait_log(&log, "revoked", Duration::from_secs(30));
        assert!(
            !text.contains("new boot config"),
            "a revoked job server got the inventory: {text}"
        );
        drop(js);
    })
    .await
    .unwrap();
    control.stop().await;
}

/// A stop sent while the job server is still enrolling (the control service
/// is slow to answer) ends it cleanly, as a stop: the signals are caught
/// before start-up, not only once the servers run.
#[test]
fn a_stop_during_enrollment_ends_the_job_server_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("tls")).unwrap();
    let ca = rcgen::CertificateParams::new(vec!["ca".to_owned()])
        .unwrap()
        .self_signed(&rcgen::KeyPair::generate().unwrap())
        .unwrap();
    std::fs::write(d.join("tls/ca.crt"), ca.pem()).unwrap();
    // A "control service" that accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", silent.local_addr().unwrap());
    let log = d.join("js.log");
    let mut js = jobserver(&url, d, &log, Some("a-token"));
    // Enrollment has begun once the control service has a connection.
    let (_conn, _) = silent.accept().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(js.0.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = js.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still running after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status:?}:\n{text}");
    assert!(text.contains("shutting down"), "{text}");
}
