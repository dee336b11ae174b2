//! The real `mprov-jobserver`'s daemon against a control service on HTTPS:
//! started before the control service, it retries its enrollment (logged
//! once) and enrolls once the service is up; against a service speaking
//! another API version it logs that once, retries, and sends nothing else
//! until the versions match; enrolled, it registers itself, heartbeats on
//! its address and runs `image-delete` jobs. A seed-style config with only
//! an admin's API key enrolls on that key, then does the same.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mprov_control::db::{crud, kinds};
use mprov_control::secrets::SecretBox;
use serde_json::json;

use crate::{PreparedControl, TlsControl, jobserver, jobserver_with, plain, wait_log};

/// A free port on 127.0.0.1 (bound, then let go).
fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `addr` bound again (bounded retries: the port was just let go).
fn bind_again(addr: SocketAddr) -> std::net::TcpListener {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(l) => return l,
            Err(e) => assert!(Instant::now() < deadline, "cannot bind {addr} again: {e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How many lines of `log` hold `what`.
fn count(log: &Path, what: &str) -> usize {
    plain(&std::fs::read_to_string(log).unwrap_or_default())
        .lines()
        .filter(|l| l.contains(what))
        .count()
}

/// Waits (in a blocking task) until the log holds `what`.
async fn wait_for(log: &Path, what: &'static str, limit: Duration) -> String {
    let log = log.to_owned();
    tokio::task::spawn_blocking(move || plain(&wait_log(&log, what, limit)))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_service_started_after_the_jobserver_is_enrolled_with_once_up() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let prepared: PreparedControl = TlsControl::prepare(&d, &[]).await;
    let addr = free_port();
    let url = format!("https://{addr}");
    let log = d.join("js.log");
    let js = jobserver_with(&url, &d, &log, Some(&prepared.token), &["--no-register"]);
    wait_for(&log, "not reachable", Duration::from_secs(20)).await;
    // Tries at 0, 1 and 3 s: at least three, logged once.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        count(&log, "not reachable"),
        1,
        "{}",
        plain(&std::fs::read_to_string(&log).unwrap())
    );
    let mut alive = js;
    assert!(
        alive.0.try_wait().unwrap().is_none(),
        "the job server exited while the control service was away"
    );

    let control = prepared.serve(bind_again(addr));
    let text = wait_for(&log, "new boot config", Duration::from_secs(60)).await;
    assert!(text.contains("enrolled as job server js1"), "{text}");
    assert!(text.contains("answers again"), "{text}");
    assert_eq!(count(&log, "not reachable"), 1, "{text}");
    drop(alive);
    control.stop().await;
}

/// What the stand-in saw: the path of every request.
type Seen = Arc<Mutex<Vec<String>>>;

/// A stand-in for a control service of another API version, on `listener`
/// with the real service's TLS set-up: every request is answered `200 {}`
/// with `mProv-Version: 0.0`, and its path noted. The real control service
/// cannot be made to speak another version, so this fault needs a
/// stand-in.
fn other_version(
    listener: std::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
) -> (Seen, axum_server::Handle<SocketAddr>) {
    let seen: Seen = Arc::default();
    let noted = seen.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let noted = noted.clone();
        async move {
            noted.lock().unwrap().push(uri.path().to_owned());
            ([(mprov_api::VERSION_HEADER, "0.0")], axum::Json(json!({})))
        }
    });
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(
        listener,
        axum_server::tls_rustls::RustlsConfig::from_config(tls),
    )
    .unwrap()
    .handle(handle.clone());
    tokio::spawn(server.serve(app.into_make_service()));
    (seen, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_api_version_is_logged_once_and_retried_and_nothing_registers() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let prepared = TlsControl::prepare(&d, &[]).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, handle) = other_version(listener, prepared.server_config.clone());
    let log = d.join("js.log");
    let url = format!("https://{addr}");
    let js = jobserver_with(
        &url,
        &d,
        &log,
        Some(&prepared.token),
        &["-m", "image-delete"],
    );
    let text = wait_for(
        &log,
        "retrying until the versions match",
        Duration::from_secs(20),
    )
    .await;
    assert!(text.contains("0.0"), "{text}");
    // Retried (1 s, then 2 s later), still logged once.
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.lock().unwrap().len() < 3 {
        assert!(
            Instant::now() < deadline,
            "not retried: {:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(count(&log, "retrying until the versions match"), 1);
    let paths = seen.lock().unwrap().clone();
    assert!(
        paths.iter().all(|p| p == mprov_api::enroll::JOBSERVER_PATH),
        "only enrollment was tried, never registration or anything else: {paths:?}"
    );
    let text = plain(&std::fs::read_to_string(&log).unwrap());
    assert!(!text.contains("enrolled as"), "{text}");

    // The versions match once the real service is there: it enrolls.
    handle.shutdown();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let control = prepared.serve(bind_again(addr));
    let text = wait_for(&log, "new boot config", Duration::from_secs(60)).await;
    assert!(text.contains("enrolled as job server js1"), "{text}");
    assert_eq!(
        count(&log, "retrying until the versions match"),
        1,
        "{text}"
    );
    drop(js);
    control.stop().await;
}

/// Needs the control service's register and claim endpoints
/// (`/api/v1/jobserver/register`, `/api/v1/jobserver/claim`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_registers_heartbeats_on_its_address_and_runs_image_delete_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let control = TlsControl::start(&d, &[]).await;
    let export = d.join("export");
    for image in ["old", "keep"] {
        std::fs::create_dir_all(export.join("images").join(image).join("1")).unwrap();
        std::fs::write(export.join("images").join(image).join("1/vmlinuz"), "k").unwrap();
    }
    let log = d.join("js.log");
    let export_arg = export.to_str().unwrap().to_owned();
    let js = control
        .start_jobserver(
            &d,
            &log,
            &[
                "-m",
                "image-delete,dnsmasq",
                "--address",
                "127.0.0.1",
                "--heartbeat",
                "1",
                "--export",
                &export_arg,
            ],
        )
        .await;
    let text = wait_for(
        &log,
        "registered as job server js1",
        Duration::from_secs(30),
    )
    .await;
    assert!(text.contains("127.0.0.1"), "{text}");

    // Its row: made by the registration, with its modules and a heartbeat.
    let db = &control.db;
    let jobservers = kinds::kind("jobservers").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let row = loop {
        let row = db.get(jobservers, "js1").await.unwrap();
        if row["heartbeat_at"].is_string() || Instant::now() > deadline {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(row["heartbeat_at"].is_string(), "{row:?}");
    assert!(
        format!("{:?}", row["modules"]).contains("image-delete"),
        "{row:?}"
    );

    // Two jobs: one removes exactly its image, one is refused.
    let jobs = kinds::kind("jobs").unwrap();
    let mut ids = Vec::new();
    for params in [json!({"image": "old"}), json!({"image": "../keep"})] {
        let row = crud::validate_value(
            jobs,
            &json!({"module": "image-delete", "params": params}),
            crud::Mode::Create,
            &SecretBox::new("k"),
        )
        .unwrap();
        let made = db.create(jobs, row).await.unwrap();
        ids.push(made["id"].as_i64().unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let ended = loop {
        let mut rows = Vec::new();
        for id in &ids {
            rows.push(db.get(jobs, &id.to_string()).await.unwrap());
        }
        if rows.iter().all(|r| r["ended_at"].is_string()) || Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (ok, refused) = (&ended[0], &ended[1]);
    assert_eq!(ok["status"], "success", "{ok:?}");
    assert_eq!(ok["return_code"], 0, "{ok:?}");
    assert!(ok["output"].as_str().unwrap().contains("removed"), "{ok:?}");
    assert_eq!(refused["status"], "failed", "{refused:?}");
    assert_eq!(refused["return_code"], 1, "{refused:?}");
    assert!(
        refused["output"]
            .as_str()
            .unwrap()
            .contains("not a plain slug"),
        "{refused:?}"
    );
    assert!(!export.join("images/old").exists());
    assert!(export.join("images/keep/1/vmlinuz").exists());
    drop(js);
    control.stop().await;
}

/// A stop while the control service is away ends the waiting job server
/// cleanly (the enrollment retry listens for it).
#[test]
fn a_stop_while_the_control_service_is_away_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("tls")).unwrap();
    let ca = rcgen::CertificateParams::new(vec!["ca".to_owned()])
        .unwrap()
        .self_signed(&rcgen::KeyPair::generate().unwrap())
        .unwrap();
    std::fs::write(d.join("tls/ca.crt"), ca.pem()).unwrap();
    let url = format!("https://{}", free_port());
    let log = d.join("js.log");
    let mut js = jobserver(&url, d, &log, Some("a-token"));
    wait_log(&log, "not reachable", Duration::from_secs(20));
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
}

/// Waits (bounded) until `js` exits; its status and log.
fn wait_exit(js: &mut mprov_tests::KillOnDrop, log: &Path) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = js.0.try_wait().unwrap() {
            return (status, plain(&std::fs::read_to_string(log).unwrap()));
        }
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "-r did not exit:\n{}",
            plain(&text)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_enrolls_and_exits_without_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let control = TlsControl::start(&d, &[]).await;
    let (url, token) = (control.url.clone(), control.token.clone());
    let dd = d.clone();
    tokio::task::spawn_blocking(move || {
        let log = dd.join("js.log");
        let mut js = jobserver_with(&url, &dd, &log, Some(&token), &["-r", "-d"]);
        let (status, text) = wait_exit(&mut js, &log);
        assert!(status.success(), "{status:?}:\n{text}");
        assert!(text.contains("enrolled as job server js1"), "{text}");
        assert!(
            !crate::listen_file(&dd).exists(),
            "no server was started: {text}"
        );
    })
    .await
    .unwrap();
    control.stop().await;
}

/// A job server that neither registers, heartbeats nor takes jobs (`-d
/// --heartbeat 0`, no job modules) goes on serving: its daemon, with
/// nothing to do, does not end the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_daemon_leaves_the_job_server_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let control = TlsControl::start(&d, &[]).await;
    let (url, token) = (control.url.clone(), control.token.clone());
    let dd = d.clone();
    tokio::task::spawn_blocking(move || {
        let log = dd.join("js.log");
        let mut js = jobserver_with(&url, &dd, &log, Some(&token), &["-d", "--heartbeat", "0"]);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !crate::listen_file(&dd).exists() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                js.0.try_wait().unwrap().is_none(),
                "it ended:\n{}",
                plain(&text)
            );
            assert!(Instant::now() < deadline, "not up:\n{}", plain(&text));
            std::thread::sleep(Duration::from_millis(100));
        }
        // Well past the moment an idle daemon returns.
        std::thread::sleep(Duration::from_secs(3));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            js.0.try_wait().unwrap().is_none(),
            "it ended on its own:\n{}",
            plain(&text)
        );
    })
    .await
    .unwrap();
    control.stop().await;
}

/// Needs the control service's register and claim endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_runs_the_pending_jobs_then_exits() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let control = TlsControl::start(&d, &[]).await;
    let export = d.join("export");
    for image in ["a", "b", "keep"] {
        std::fs::create_dir_all(export.join("images").join(image).join("1")).unwrap();
    }
    let jobs = kinds::kind("jobs").unwrap();
    let mut ids = Vec::new();
    for image in ["a", "b"] {
        let row = crud::validate_value(
            jobs,
            &json!({"module": "image-delete", "params": {"image": image}}),
            crud::Mode::Create,
            &SecretBox::new("k"),
        )
        .unwrap();
        ids.push(
            control.db.create(jobs, row).await.unwrap()["id"]
                .as_i64()
                .unwrap(),
        );
    }
    let (url, token, dd) = (control.url.clone(), control.token.clone(), d.clone());
    let export_arg = export.to_str().unwrap().to_owned();
    tokio::task::spawn_blocking(move || {
        let log = dd.join("js.log");
        let args = [
            "-r",
            "-m",
            "image-delete",
            "--address",
            "none",
            "--export",
            &export_arg,
        ];
        let mut js = jobserver_with(&url, &dd, &log, Some(&token), &args);
        let (status, text) = wait_exit(&mut js, &log);
        assert!(status.success(), "{status:?}:\n{text}");
        assert!(text.contains("2 jobs ran"), "{text}");
    })
    .await
    .unwrap();
    for id in ids {
        let row = control.db.get(jobs, &id.to_string()).await.unwrap();
        assert_eq!(row["status"], "success", "{row:?}");
    }
    assert!(!export.join("images/a").exists() && !export.join("images/b").exists());
    assert!(export.join("images/keep/1").exists());
    control.stop().await;
}

/// A module that writes more output than a job keeps, pausing past a
/// progress report, then panics.
struct Chatty;

#[async_trait::async_trait]
impl mprov_boot::modules::Module for Chatty {
    async fn run(
        &self,
        _job: &mprov_api::jobs::Job,
        progress: &mprov_boot::modules::Progress,
    ) -> anyhow::Result<mprov_boot::modules::ExitInfo> {
        progress.line("line 0: the first");
        for i in 1..=400 {
            progress.line(format!("line {i}: {}", "x".repeat(1000)));
        }
        // Long enough for a running report with the output so far.
        tokio::time::sleep(mprov_boot::daemon::jobs::REPORT_EVERY * 2).await;
        panic!("chatty gave up");
    }
}

/// The jobs runner against the real control service, with js1's own
/// certificate, on jobs the control service records as js1's (set up
/// straight in its database, as a claim leaves them): each report is one
/// js1 may write, and the rows say how each job went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_report_running_output_and_their_end_on_the_real_service() {
    use mprov_boot::daemon::jobs;
    use mprov_boot::modules::{Registry, Settings};

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let control = TlsControl::start(&d, &[]).await;
    let db = &control.db;
    let me = mprov_boot::identity::enroll(
        &control.url,
        &control.ca_pem,
        &control.token,
        "js1",
        &d.join("identity"),
    )
    .await
    .unwrap();
    let js_control = mprov_boot::identity::Control {
        url: control.url.clone(),
        ca_pem: control.ca_pem.clone(),
        name: "js1".into(),
        dir: d.join("identity"),
    };
    let (_keep, clients) = tokio::sync::watch::channel(js_control.client(&me).unwrap());
    let jobservers = kinds::kind("jobservers").unwrap();
    let row = crud::validate_value(
        jobservers,
        &json!({"name": "js1"}),
        crud::Mode::Create,
        &SecretBox::new("k"),
    )
    .unwrap();
    let js1 = db.create(jobservers, row).await.unwrap()["id"]
        .as_i64()
        .unwrap();
    let jobs_kind = kinds::kind("jobs").unwrap();
    let job = |module: &'static str, params: serde_json::Value| async move {
        let row = crud::validate_value(
            jobs_kind,
            &json!({"module": module, "params": params.clone(), "jobserver": js1}),
            crud::Mode::Create,
            &SecretBox::new("k"),
        )
        .unwrap();
        let id = db.create(jobs_kind, row).await.unwrap()["id"]
            .as_i64()
            .unwrap();
        mprov_api::jobs::Job {
            id,
            module: module.into(),
            params,
        }
    };
    let export = d.join("export");
    std::fs::create_dir_all(export.join("images/old/1")).unwrap();
    std::fs::create_dir_all(export.join("images/keep/1")).unwrap();
    let mut registry = Registry::new(&Settings::new(&export));
    registry.insert("chatty", Arc::new(Chatty));
    let stop = tokio_util::sync::CancellationToken::new();
    let get = |id: i64| async move { db.get(jobs_kind, &id.to_string()).await.unwrap() };

    // Removes exactly its image.
    let ok = job("image-delete", json!({"image": "old"})).await;
    let end = jobs::run_job(&clients, &registry, ok.clone(), &stop).await;
    assert_eq!(end.status, "success");
    let row = get(ok.id).await;
    assert_eq!(row["status"], "success", "{row:?}");
    assert_eq!(row["return_code"], 0, "{row:?}");
    assert!(
        row["started_at"].is_string() && row["ended_at"].is_string(),
        "{row:?}"
    );
    assert!(
        row["output"].as_str().unwrap().contains("removed"),
        "{row:?}"
    );
    assert!(!export.join("images/old").exists());
    assert!(export.join("images/keep/1").exists());

    // A slug that is not one: failed, with the reason.
    let bad = job("image-delete", json!({"image": "../keep"})).await;
    jobs::run_job(&clients, &registry, bad.clone(), &stop).await;
    let row = get(bad.id).await;
    assert_eq!(row["status"], "failed", "{row:?}");
    assert_eq!(row["return_code"], 1, "{row:?}");
    assert!(
        row["output"].as_str().unwrap().contains("not a plain slug"),
        "{row:?}"
    );
    assert!(export.join("images/keep/1").exists());

    // Output reported while it runs (the tail), then a panic fails the job
    // and not the runner.
    let chatty = job("chatty", json!(null)).await;
    let run = {
        let (clients, registry, chatty, stop) = (
            clients.clone(),
            registry.clone(),
            chatty.clone(),
            stop.clone(),
        );
        tokio::spawn(async move { jobs::run_job(&clients, &registry, chatty, &stop).await })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let running = loop {
        let row = get(chatty.id).await;
        // The first report may catch the module mid-write: the next has
        // all of it.
        if row["status"] == "running" && row["output"].as_str().unwrap_or("").contains("line 400: ")
        {
            break row;
        }
        assert!(
            Instant::now() < deadline,
            "never reported running with output: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let output = running["output"].as_str().unwrap();
    assert!(
        output.starts_with('['),
        "the dropped start is said: {}",
        &output[..80]
    );
    assert!(!output.contains("line 0: the first"));
    assert!(output.len() <= mprov_boot::modules::OUTPUT_TAIL + 200);
    let end = run.await.unwrap();
    assert_eq!((end.status, end.return_code), ("failed", jobs::PANICKED));
    let row = get(chatty.id).await;
    assert_eq!(row["status"], "failed", "{row:?}");
    assert_eq!(row["return_code"], jobs::PANICKED, "{row:?}");
    assert!(
        row["output"].as_str().unwrap().contains("chatty gave up"),
        "{:?}",
        &row["output"].as_str().unwrap()[..200]
    );
    control.stop().await;
}

/// The seed's setup, with only an API key: `MPROV_URL`, `MPROV_APIKEY`,
/// `MPROV_ADDRESS` and `MPROV_MODS` rendered into `jobserver.yaml`, no
/// token and no certificate. The key is an admin's, so the job server
/// enrolls with it (its own key pair, a CSR), registers its row with the
/// certificate it got and claims and runs an `image-delete` job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_style_config_with_only_an_apikey_enrolls_registers_and_claims() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let control = TlsControl::start(&d, &[]).await;
    let key = crate::insert_api_key(&control.db, "seed").await;
    let export = d.join("export");
    std::fs::create_dir_all(export.join("images/old/1")).unwrap();
    let cfg = d.join("cfg");
    std::fs::create_dir_all(&cfg).unwrap();
    let log = d.join("js.log");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mprov-jobserver"));
    cmd.env_clear()
        .env("MPROV_CONFIG_DIR", &cfg)
        .env("MPROV_URL", &control.url)
        .env("MPROV_APIKEY", &key.key)
        .env("MPROV_ADDRESS", "127.0.0.1")
        .env("MPROV_MODS", "image-delete")
        .args(["--name", "seedjs", "--log", "info", "--heartbeat", "1"])
        .arg("--ca-file")
        .arg(d.join("tls/ca.crt"))
        .arg("--enroll-token-file")
        .arg(d.join("no-token-file"))
        .arg("--state-dir")
        .arg(d.join("js"))
        .arg("--export")
        .arg(&export)
        .args(["--no-dhcp", "--no-tftp", "--no-dns", "--no-http", "--no-ra"])
        .args(["--metrics", "127.0.0.1:0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let js = mprov_tests::KillOnDrop(cmd.spawn().unwrap());

    // Its row, made by its registration with its certificate.
    let db = &control.db;
    let jobservers = kinds::kind("jobservers").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let row = loop {
        if let Ok(row) = db.get(jobservers, "seedjs").await {
            break row;
        }
        assert!(
            Instant::now() < deadline,
            "no registration:\n{}",
            plain(&std::fs::read_to_string(&log).unwrap_or_default())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        format!("{:?}", row["modules"]).contains("image-delete"),
        "{row:?}"
    );
    let text = plain(&std::fs::read_to_string(&log).unwrap());
    assert!(
        text.contains("enrolled as job server seedjs with the API key"),
        "{text}"
    );
    assert!(text.contains("(client certificate)"), "{text}");
    let rendered = std::fs::read_to_string(cfg.join("jobserver.yaml")).unwrap();
    assert!(
        rendered.contains(&key.key),
        "the key came from MPROV_APIKEY"
    );
    assert!(d.join("js/identity/jobserver.crt").exists());
    assert!(
        mprov_control::enrollment::jobserver_enrolled(db)
            .await
            .unwrap()
    );

    // A job: it claims it with its certificate and runs it.
    let jobs = kinds::kind("jobs").unwrap();
    let row = crud::validate_value(
        jobs,
        &json!({"module": "image-delete", "params": {"image": "old"}}),
        crud::Mode::Create,
        &SecretBox::new("k"),
    )
    .unwrap();
    let id = db.create(jobs, row).await.unwrap()["id"].as_i64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let ended = loop {
        let job = db.get(jobs, &id.to_string()).await.unwrap();
        if job["ended_at"].is_string() || Instant::now() > deadline {
            break job;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(ended["status"], "success", "{ended:?}");
    assert_eq!(
        ended["jobserver"],
        json!(row_id(db, "seedjs").await),
        "{ended:?}"
    );
    assert!(!export.join("images/old").exists());
    drop(js);
    control.stop().await;
}

/// The row id of job server `name`.
async fn row_id(db: &mprov_control::db::Db, name: &str) -> i64 {
    let jobservers = kinds::kind("jobservers").unwrap();
    db.get(jobservers, name).await.unwrap()["id"]
        .as_i64()
        .unwrap()
}
