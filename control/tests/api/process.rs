//! The real `mprov-control serve` process: first start and second start, judged
//! by the files it writes (content and mode), its log, and its API.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mprov_control::db::Engine;
use serde_json::Value;

use crate::common::{TestDb, on_engine};

pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
    pub(crate) https_port: u16,
    log: PathBuf,
}

/// `mprov-control serve` with the tests' environment plus `env`, not yet
/// started; its log goes to `log`. With `nofile`, it starts under that file
/// limit (soft and hard), as `prlimit` sets it.
fn serve_command(
    dir: &Path,
    db_url: &str,
    run: usize,
    log: &Path,
    env: &[(&str, &str)],
    nofile: Option<u64>,
) -> Command {
    // Started as root, the service becomes the `mprov` user, which must be
    // able to reach its folders.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = env!("CARGO_BIN_EXE_mprov-control");
    let mut cmd = match nofile {
        None => Command::new(exe),
        Some(n) => {
            // prlimit execs the service: the child's PID is the service's.
            let mut c = Command::new("prlimit");
            c.arg(format!("--nofile={n}:{n}")).arg("--").arg(exe);
            c
        }
    };
    cmd.arg("serve")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("MPROV_CONFIG_DIR", dir.join("etc"))
        .env("MPROV_STATE_DIR", dir.join("var"))
        // Port 0, and the bound address in a file: no port race.
        .env("MPROV_LISTEN", "127.0.0.1:0")
        .env("MPROV_LISTEN_FILE", dir.join(format!("listen-{run}")))
        .env("MPROV_HTTPS_LISTEN", "127.0.0.1:0")
        .env("MPROV_HTTPS_LISTEN_FILE", dir.join(format!("https-{run}")))
        .env("MPROV_DATABASE_URL", db_url)
        .env("MPROV_MPCC_HOSTNAME", "mpcc")
        .env("MPROV_MPCC_IPs", "10.0.0.1,fd00::1")
        .env("MPROV_DOMAINNAME", "cluster")
        .env("MPROV_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// The port written to `file`, once it is there.
fn port_in(file: &Path) -> Option<u16> {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|a| a.trim().parse::<std::net::SocketAddr>().ok())
        .map(|a| a.port())
}

/// Runs `serve` with `env` expecting it to refuse to start: its exit
/// success and its log.
pub(crate) fn serve_to_exit(dir: &Path, db_url: &str, env: &[(&str, &str)]) -> (bool, String) {
    let log = dir.join("serve-exit.log");
    let mut child = serve_command(dir, db_url, 0, &log, env, None)
        .spawn()
        .expect("start mprov-control");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (
                status.success(),
                std::fs::read_to_string(&log).unwrap_or_default(),
            );
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "mprov-control kept running:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Server {
    pub(crate) fn start(dir: &Path, db_url: &str, run: usize, env: &[(&str, &str)]) -> Server {
        Server::start_limited(dir, db_url, run, env, None)
    }

    /// [`Server::start`] under a file limit of `nofile`, if given.
    pub(crate) fn start_limited(
        dir: &Path,
        db_url: &str,
        run: usize,
        env: &[(&str, &str)],
        nofile: Option<u64>,
    ) -> Server {
        let log = dir.join(format!("serve-{run}.log"));
        let child = serve_command(dir, db_url, run, &log, env, nofile)
            .spawn()
            .expect("start mprov-control");
        let mut server = Server {
            child,
            port: 0,
            https_port: 0,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let (Some(port), Some(https)) = (
                port_in(&dir.join(format!("listen-{run}"))),
                port_in(&dir.join(format!("https-{run}"))),
            ) {
                server.port = port;
                server.https_port = https;
                break;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("mprov-control exited with {status}:\n{}", server.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "mprov-control did not listen within 60 s:\n{}",
                server.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// The service's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A GET with an API key; the status and the JSON body.
    fn get(&self, path: &str, auth: &str) -> (u16, Value) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.0\r\nHost: localhost\r\nAuthorization: {auth}\r\nmProv-Version: {}\r\n\r\n",
            mprov_api::api_version()
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let status = resp
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = resp
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .unwrap_or_default();
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    /// Waits (at most 30 s) for it to exit by itself: success, and its log.
    pub(crate) fn wait_exit(&mut self) -> (bool, String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status.success(), self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "mprov-control did not exit:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops it with SIGTERM, as systemd would, and waits.
    pub(crate) fn stop(&mut self) -> String {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "exit status {status} after SIGTERM:\n{}",
                    self.log_text()
                );
                break;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("mprov-control did not stop within 20 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.log_text()
    }
}

impl Drop for Server {
    /// A failed assertion must not leave the server running.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub(crate) fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn snapshot(dir: &Path) -> Vec<(String, String, std::time::SystemTime, u32)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let meta = std::fs::metadata(&p).unwrap();
            (
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap(),
                meta.modified().unwrap(),
                mode(&p),
            )
        })
        .collect();
    out.sort();
    out
}

pub(crate) async fn first_start(engine: Engine) {
    on_engine(engine, check_first_and_second_start).await;

    // With MPROV_SUPERUSER_PASSWORD, no password file and no password in the log.
    on_engine(engine, |d, url| {
        let mut s = Server::start(
            d,
            url,
            1,
            &[("MPROV_SUPERUSER_PASSWORD", "given password 1")],
        );
        use base64::Engine as _;
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("admin:given password 1")
        );
        assert_eq!(s.get("/api/v1/systems/mpcc", &basic).0, 200);
        let log = s.stop();
        assert!(!d.join("etc/superuser_password").exists());
        assert!(!log.contains("given password 1"), "{log}");
        assert!(log.contains("MPROV_SUPERUSER_PASSWORD"), "{log}");
    })
    .await;
}

fn check_first_and_second_start(dir: &Path, url: &str) {
    let etc = dir.join("etc");
    let mut s = Server::start(dir, url, 1, &[]);
    let password = std::fs::read_to_string(etc.join("superuser_password")).unwrap();
    let password = password.trim();
    assert!(password.len() >= 20, "a long random password: {password:?}");
    let secret = std::fs::read_to_string(etc.join("secret_key")).unwrap();
    assert!(secret.trim().len() >= 40 && secret.ends_with('\n'));
    let apikey = std::fs::read_to_string(etc.join("apikey")).unwrap();
    let key = apikey
        .strip_prefix("export MPROV_APIKEY=")
        .and_then(|k| k.strip_suffix('\n'))
        .expect("apikey file format");
    assert!(key.contains('.'));
    for f in ["superuser_password", "secret_key", "apikey"] {
        assert_eq!(mode(&etc.join(f)), 0o600, "{f}");
    }
    assert_eq!(mode(&etc), 0o700);

    // The job server key works; the control host's own entry and the defaults exist.
    let auth = format!("Api-Key {key}");
    let (status, me) = s.get("/api/v1/systems/mpcc", &auth);
    assert_eq!(status, 200, "{me}");
    let nics = me["nics"].as_array().unwrap();
    assert_eq!(nics.len(), 2);
    assert_eq!(nics[0]["ipv4"], "10.0.0.1");
    assert_eq!(nics[1]["ipv6"], "fd00::1");
    assert_eq!(nics[0]["hostname"], "mpcc.cluster");
    let (_, scripts) = s.get("/api/v1/scripts/", &auth);
    assert!(scripts["total"].as_u64().unwrap() >= 2, "{scripts}");
    let (_, nads) = s.get("/api/v1/images/nads", &auth);
    assert_eq!(nads["slug"], "nads");
    let (_, rev1) = s.get("/api/v1/revision", &auth);
    let log1 = s.stop();
    assert_eq!(
        log1.matches(password).count(),
        1,
        "the password is logged once:\n{log1}"
    );
    let files1 = snapshot(&etc);

    // Second start: nothing changes, nothing is logged again.
    let mut s = Server::start(dir, url, 2, &[]);
    let (_, rev2) = s.get("/api/v1/revision", &auth);
    let log2 = s.stop();
    assert_eq!(rev1, rev2, "a second start writes nothing to the inventory");
    assert!(
        !log2.contains(password),
        "the password is not logged again:\n{log2}"
    );
    assert!(!log2.contains("first start"), "{log2}");
    assert_eq!(snapshot(&etc), files1, "a second start changes no file");
}

/// Runs `mprov-control` with `args` on `db_url`, feeding `stdin`; exit success,
/// stdout, stderr.
fn control(dir: &Path, db_url: &str, args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mprov-control"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("MPROV_CONFIG_DIR", dir.join("etc"))
        .env("MPROV_STATE_DIR", dir.join("var"))
        .env("MPROV_DATABASE_URL", db_url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mprov-control");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub(crate) async fn subcommands(engine: Engine) {
    let tdb = TestDb::new(engine).await;
    let url = tdb.url.clone();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let (key_line, alice_pw) = tokio::task::spawn_blocking(move || {
        let (ok, out, err) = control(&d, &url, &["migrate"], "");
        assert!(ok && out.contains("up to date"), "{out}{err}");

        let (ok, out, err) = control(
            &d,
            &url,
            &["superuser", "create", "alice", "--password-stdin"],
            "pw-alice-123\n",
        );
        assert!(ok && out.contains("created admin user alice"), "{out}{err}");
        assert!(
            !out.contains("pw-alice-123"),
            "a given password is not echoed"
        );
        let (ok, _, err) = control(
            &d,
            &url,
            &["superuser", "create", "alice", "--password-stdin"],
            "again-1234\n",
        );
        assert!(
            !ok && err.contains("alice"),
            "a second alice is refused: {err}"
        );
        let (ok, out, err) = control(&d, &url, &["superuser", "set-password", "alice"], "");
        assert!(ok, "{err}");
        let random = out
            .lines()
            .find_map(|l| l.strip_prefix("password: "))
            .expect("random password shown")
            .to_owned();
        let (ok, _, err) = control(&d, &url, &["superuser", "set-password", "nobody"], "");
        assert!(!ok && err.contains("nobody"), "{err}");

        let (ok, out, err) = control(
            &d,
            &url,
            &["apikey", "create", "ci", "--expires-in-days", "3"],
            "",
        );
        assert!(ok, "{err}");
        let key = out.lines().last().unwrap().to_owned();
        let prefix = key.split('.').next().unwrap().to_owned();
        let (ok, out, _) = control(&d, &url, &["apikey", "list"], "");
        assert!(
            ok && out.contains(&prefix) && out.contains("ci") && !out.contains(&key),
            "{out}"
        );
        let (ok, out, err) = control(&d, &url, &["apikey", "revoke", &prefix], "");
        assert!(ok && out.contains("revoked"), "{out}{err}");
        let (ok, _, err) = control(&d, &url, &["apikey", "revoke", "nosuch"], "");
        assert!(!ok && err.contains("nosuch"), "{err}");

        let (ok, _, err) = control(
            &d,
            &url,
            &["serve", "--db-engine", "oracle", "--database-url", ""],
            "",
        );
        assert!(!ok, "a bad engine stops the start: {err}");
        let (ok, out, _) = control(&d, &url, &["--help"], "");
        assert!(
            ok && out.contains("serve") && out.contains("apikey"),
            "{out}"
        );
        (key, random)
    })
    .await
    .unwrap();

    // What the commands wrote is what the service reads.
    let db = mprov_control::db::Db::open(&tdb.url).await.unwrap();
    let row = sqlx::query("SELECT password FROM users WHERE username = 'alice'")
        .fetch_one(db.pool())
        .await
        .unwrap();
    let hash: String = sqlx::Row::try_get(&row, "password").unwrap();
    assert!(mprov_control::secrets::verify_password(&alice_pw, &hash));
    assert!(!mprov_control::secrets::verify_password(
        "pw-alice-123",
        &hash
    ));
    let prefix = key_line.split('.').next().unwrap();
    let mut sql = db.sql();
    sql.push("SELECT revoked, expires_at FROM api_keys WHERE prefix = ")
        .bind(mprov_control::db::Val::Text(Some(prefix.into())));
    let row = sql.query().fetch_one(db.pool()).await.unwrap();
    assert_eq!(
        mprov_control::db::opt_bool(&row, "revoked").unwrap(),
        Some(true)
    );
    let expires: Option<String> = sqlx::Row::try_get(&row, "expires_at").unwrap();
    assert!(expires.is_some_and(|e| e > mprov_control::time::now()));
    db.pool().close().await;
    tdb.cleanup().await;
}
