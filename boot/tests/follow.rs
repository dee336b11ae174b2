//! The job server follows a real control service: a new node shows up in its
//! snapshot without a restart, and a control outage leaves the last snapshot
//! serving until the service is back. Module `ra`: the job server's IPv6
//! router advertisements, in network namespaces; `dhcp`: its DHCP server
//! against a DISCOVER flood, UEFI HTTP boot and proxyDHCP; `enroll`: its enrollment
//! and certificate over HTTPS; `daemon`: its enrollment retried (control
//! service late, or speaking another version), its registration,
//! heartbeats and jobs; `heartbeat_sources`: each address's heartbeat from
//! that address to its own URL; `libgenders`: the genders file read by the real
//! `nodeattr`; `renew`: its certificate renewal; `tftp`: lock-step and windowed TFTP clients; `images`: its image server's admission limit
//! as set on the command line; `listen`: its `--listen-file` names the
//! port 0 binds that answer; `image_update` and `image_sync`: the job
//! modules that build an image on a full disk and copy one from another job
//! server's image server; `image_sync_https`: the copy over HTTPS between
//! job servers, and who the HTTPS listener refuses. Every test waits for a job server on its
//! listen file, never on its log.

#[path = "jobserver/attacks.rs"]
mod attacks;
#[path = "jobserver/config.rs"]
mod config;
#[path = "jobserver/daemon.rs"]
mod daemon;
#[path = "jobserver/dhcp.rs"]
mod dhcp;
#[path = "jobserver/enroll.rs"]
mod enroll;
#[path = "jobserver/heartbeat_sources.rs"]
mod heartbeat_sources;
#[path = "jobserver/image_sync.rs"]
mod image_sync;
#[path = "jobserver/image_sync_https.rs"]
mod image_sync_https;
#[path = "jobserver/image_update.rs"]
mod image_update;
#[path = "jobserver/images.rs"]
mod images;
#[path = "jobserver/libgenders.rs"]
mod libgenders;
#[path = "jobserver/listen.rs"]
mod listen;
#[path = "jobserver/ra.rs"]
mod ra;
#[path = "jobserver/renew.rs"]
mod renew;
#[path = "jobserver/tftp.rs"]
mod tftp;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mprov_api::boot::BootConfig;
use mprov_api::client::{Auth, Client};
use mprov_control::config::{Config, Settings};
use mprov_control::db::{Db, Val};
use mprov_control::http;
use mprov_control::pki::{SignerClient, https};
use mprov_control::secrets::{self, SecretBox};
use mprov_tests::KillOnDrop;
use mprov_tests::lab::{FollowerFiles, follower_command};
use mprov_tests::listen::Listening;
use mprov_tests::netns::Netns;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Starts job server js1 following `url`, with its CA file and state under
/// `dir`, enrolling with `token` when given and serving metrics on a port
/// of its choosing, written with its other addresses to
/// [`listen_file`]`(dir)`; its log goes to `log`.
fn jobserver(url: &str, dir: &Path, log: &Path, token: Option<&str>) -> KillOnDrop {
    jobserver_with(url, dir, log, token, &[])
}

/// [`jobserver`] with the further arguments `extra`.
fn jobserver_with(
    url: &str,
    dir: &Path,
    log: &Path,
    token: Option<&str>,
    extra: &[&str],
) -> KillOnDrop {
    let files = FollowerFiles {
        ca: &dir.join("tls/ca.crt"),
        apikey: &dir.join("no-apikey-file"),
        enroll_token: &dir.join("no-token-file"),
        state: &dir.join("js"),
    };
    let exe = Path::new(env!("CARGO_BIN_EXE_mprov-jobserver"));
    let mut cmd = follower_command(exe, url, files, log).unwrap();
    let listen = listen_file(dir);
    let _ = std::fs::remove_file(&listen);
    cmd.args(["--no-dhcp", "--no-tftp", "--no-dns", "--no-http", "--no-ra"])
        .args(["--metrics", "127.0.0.1:0", "--listen-file"])
        .arg(listen);
    if let Some(t) = token {
        cmd.args(["--enroll-token", t]);
    }
    cmd.args(extra);
    KillOnDrop(cmd.spawn().expect("start mprov-jobserver"))
}

/// Where [`jobserver`] writes the addresses it bound.
fn listen_file(dir: &Path) -> std::path::PathBuf {
    dir.join("js-listen.json")
}

/// `mprov-jobserver` in `ns` serving the boot config file `config` (no
/// control service), standard output dropped, its log (at `info`) in `log`,
/// the addresses it binds in [`listen_file_of`]`(log)`. The caller adds the
/// servers it runs and starts it with [`spawn_standalone`].
fn standalone_jobserver(ns: &Netns, config: &Path, log: &Path) -> anyhow::Result<Command> {
    let listen = listen_file_of(log);
    let _ = std::fs::remove_file(&listen);
    let mut cmd = ns.command(env!("CARGO_BIN_EXE_mprov-jobserver"));
    cmd.arg("--boot-config")
        .arg(config)
        .args(["--log", "info"])
        .arg("--listen-file")
        .arg(listen)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?);
    Ok(cmd)
}

/// Where a [`standalone_jobserver`] logging to `log` writes the addresses
/// it bound.
fn listen_file_of(log: &Path) -> std::path::PathBuf {
    log.with_extension("listen.json")
}

/// Starts `cmd` (a [`standalone_jobserver`] logging to `log`) and waits
/// until every server it runs is bound: the process and where it listens.
fn spawn_standalone(mut cmd: Command, log: &Path) -> anyhow::Result<(KillOnDrop, Listening)> {
    use anyhow::Context as _;
    let mut child = KillOnDrop(cmd.spawn().context("starting mprov-jobserver")?);
    let bound =
        mprov_tests::listen::wait(&listen_file_of(log), &mut child.0, Duration::from_secs(20))
            .with_context(|| std::fs::read_to_string(log).unwrap_or_default())?;
    Ok((child, bound))
}

/// `text` without its ANSI colour sequences (ESC [ ... letter), as the job
/// server's log has them.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A new API key named `name`, straight in the database (not revoked,
/// created 2026-01-01).
async fn insert_api_key(db: &Db, name: &str) -> secrets::NewApiKey {
    let key = secrets::new_api_key();
    let mut sql = db.sql();
    sql.push("INSERT INTO api_keys (name, prefix, hash, revoked, created_at, updated_at) VALUES ");
    let stamp = Val::Text(Some("2026-01-01T00:00:00Z".into()));
    sql.bind_list([
        Val::Text(Some(name.into())),
        Val::Text(Some(key.prefix.clone())),
        Val::Text(Some(key.hash.clone())),
        Val::Bool(Some(false)),
        stamp.clone(),
        stamp,
    ]);
    sql.query().execute(db.pool()).await.unwrap();
    key
}

/// Polls (bounded by `limit`) until the log holds `what`; the log.
fn wait_log(log: &Path, what: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(what) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no {what:?} in the job server's log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The control service in process over HTTPS, on SQLite in a folder, with
/// its CA and signer under `<folder>/tls`, and a one-time token for job
/// server js1.
struct TlsControl {
    db: Db,
    url: String,
    ca_pem: String,
    token: String,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// A [`TlsControl`] ready to serve: its database, CA (in `<folder>/tls`)
/// and js1's token made, nothing listening yet.
struct PreparedControl {
    db: Db,
    state: Arc<http::Inner>,
    server_config: Arc<rustls::ServerConfig>,
    ca_pem: String,
    token: String,
}

impl PreparedControl {
    /// Serves on `listener`.
    fn serve(self, listener: std::net::TcpListener) -> TlsControl {
        let url = format!("https://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let server = tokio::spawn(http::serve_tls(
            listener,
            self.server_config,
            self.state,
            stop.clone(),
        ));
        TlsControl {
            db: self.db,
            url,
            ca_pem: self.ca_pem,
            token: self.token,
            stop,
            server,
        }
    }
}

impl TlsControl {
    /// Starts it in `dir` with the settings `extra`.
    async fn start(dir: &Path, extra: &[&str]) -> TlsControl {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        TlsControl::prepare(dir, extra).await.serve(listener)
    }

    /// Job server js1 following it over HTTPS and enrolling with its
    /// token ([`jobserver_with`], state under `dir`, its log in `log`),
    /// started from a blocking thread: it waits for its enrollment.
    async fn start_jobserver(&self, dir: &Path, log: &Path, extra: &[&str]) -> KillOnDrop {
        let (url, dir, log, token) = (
            self.url.clone(),
            dir.to_owned(),
            log.to_owned(),
            self.token.clone(),
        );
        let extra: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
        tokio::task::spawn_blocking(move || {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            jobserver_with(&url, &dir, &log, Some(&token), &extra)
        })
        .await
        .expect("starting the job server panicked")
    }

    /// Prepares it in `dir` with the settings `extra`, to serve later.
    async fn prepare(dir: &Path, extra: &[&str]) -> PreparedControl {
        let db_url = format!("sqlite://{}?mode=rwc", dir.join("c.sqlite3").display());
        let tls_dir = dir.join("tls");
        let mut args = vec!["--tls-dir", tls_dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        let config = Arc::new(config_with(&db_url, &args));
        let db = Db::open(&db_url).await.unwrap();
        let signer = SignerClient::in_process(&tls_dir, "mpcc").unwrap();
        let material = https::prepare(&config, &signer).await.unwrap();
        let server_config = https::server_config(&material).unwrap();
        let state = Arc::new(
            http::Inner::new(db.clone(), config, SecretBox::new("k"))
                .with_ca(material.ca_pem.clone())
                .with_signer(signer),
        );
        let token = mprov_control::enrollment::create_token(&db, "js1", Duration::from_secs(3600))
            .await
            .unwrap()
            .token;
        PreparedControl {
            db,
            state,
            server_config,
            ca_pem: material.ca_pem,
            token,
        }
    }

    /// Stops it and waits until it has.
    async fn stop(self) {
        self.stop.cancel();
        self.server.await.unwrap().unwrap();
    }
}

fn config(url: &str) -> Config {
    config_with(url, &[])
}

/// The control service's settings as its command line would give them.
fn config_with(url: &str, extra: &[&str]) -> Config {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        s: Settings,
    }
    let mut argv = vec!["x", "--database-url", url, "--hostname", "mpcc"];
    argv.extend_from_slice(extra);
    Config::from_settings(Cli::try_parse_from(argv).unwrap().s).unwrap()
}

/// A control service on SQLite in `dir`, on 127.0.0.1:0, and a client of
/// it with an admin API key; stop it with the token, then await the task.
async fn admin_control(dir: &Path) -> (Client, CancellationToken, tokio::task::JoinHandle<()>) {
    let url = format!("sqlite://{}?mode=rwc", dir.join("c.sqlite3").display());
    let db = Db::open(&url).await.unwrap();
    let key = insert_api_key(&db, "admin").await;
    db.pool().close().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, task) = control(&url, listener).await;
    let client = Client::new(&format!("http://{addr}"), Auth::ApiKey(key.key)).unwrap();
    (client, stop, task)
}

/// Starts the control service on `listener`; returns its stop token and task.
async fn control(
    url: &str,
    listener: TcpListener,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let db = Db::open(url).await.unwrap();
    let state = Arc::new(http::Inner::new(
        db,
        Arc::new(config(url)),
        SecretBox::new("k"),
    ));
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move {
        http::serve(listener, state, token).await.unwrap();
    });
    (stop, task)
}

/// Waits (bounded) until the published snapshot satisfies `pred`.
async fn until(
    rx: &mut watch::Receiver<Arc<BootConfig>>,
    pred: impl Fn(&BootConfig) -> bool,
) -> Arc<BootConfig> {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if pred(&rx.borrow_and_update()) {
                return rx.borrow().clone();
            }
            rx.changed().await.unwrap();
        }
    })
    .await
    .expect("the follower did not publish the expected snapshot within 30 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_changes_and_survives_an_outage() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("c.sqlite3").display()
    );
    // An API key for the job server, straight in the database.
    let db = Db::open(&url).await.unwrap();
    let key = insert_api_key(&db, "js").await;
    db.pool().close().await;

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, task) = control(&url, listener).await;
    let client = Client::new(&format!("http://{addr}"), Auth::ApiKey(key.key.clone())).unwrap();

    let (tx, mut rx) = watch::channel(Arc::new(BootConfig {
        revision: -1,
        ..Default::default()
    }));
    let shutdown = CancellationToken::new();
    let follower = tokio::spawn(mprov_boot::snapshot::follow(
        client.clone(),
        tx,
        shutdown.clone(),
    ));
    let first = until(&mut rx, |c| c.revision >= 0).await;
    assert!(first.hosts.is_empty());

    // A new node appears without a restart.
    client
        .create("systems", &json!({"hostname": "c01", "nics": [{"mac": "52:54:00:00:00:01", "ipv4": "10.0.0.21"}]}))
        .await
        .unwrap();
    let snap = until(&mut rx, |c| !c.hosts.is_empty()).await;
    assert_eq!(snap.hosts[0].hostname, "c01");
    assert!(snap.revision > first.revision);

    // The control service goes away: the last snapshot stays.
    stop.cancel();
    task.await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        rx.borrow().revision,
        snap.revision,
        "still serving the last snapshot"
    );
    assert_eq!(rx.borrow().hosts.len(), 1);

    // It comes back on the same address; the next change arrives.
    let listener = TcpListener::bind(addr).await.unwrap();
    let (stop, task) = control(&url, listener).await;
    client
        .create(
            "systems",
            &json!({"hostname": "c02", "nics": [{"mac": "52:54:00:00:00:02"}]}),
        )
        .await
        .unwrap();
    let snap = until(&mut rx, |c| c.hosts.len() == 2).await;
    assert!(snap.hosts.iter().any(|h| h.hostname == "c02"));

    shutdown.cancel();
    follower.await.unwrap();
    stop.cancel();
    task.await.unwrap();
}
