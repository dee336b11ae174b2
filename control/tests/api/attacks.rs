//! Attacks on the trust model (ARCHITECTURE.md), each performed against the
//! real `mprov-control serve` (started as root, dropping to the `mprov` user)
//! and shown refused, with the data untouched. Steps that the attacker takes
//! as the service user run as that user (`setpriv`), not as root pretending.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::{Command, Output};

use mprov_control::db::Engine;

use crate::common::{P256, STATUS_ONLY, on_engine, on_sqlite};
use crate::process::{Server, serve_to_exit};

/// Runs `program args` as the `mprov` user.
fn as_mprov(program: &str, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args([
            "--reuid",
            "mprov",
            "--regid",
            "mprov",
            "--clear-groups",
            "--",
        ])
        .arg(program)
        .args(args)
        .output()
        .expect("setpriv (util-linux) must be installed")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn uid_of_user(name: &str) -> u32 {
    let out = Command::new("id").args(["-u", name]).output().unwrap();
    assert!(out.status.success(), "no user {name}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Owner uid and mode (permission bits) of `p`, not following a link.
fn owner_mode(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.mode() & 0o7777)
}

/// Runs `check` with the service started as in [`start_admin`] on a fresh
/// database on `engine`, and a client for it.
async fn on_admin(engine: Engine, check: fn(&Path, &str, &mut Server, &Client)) {
    on_engine(engine, move |dir, url| {
        let mut s = start_admin(dir, url, 1);
        let c = Client::new(&s, dir);
        check(dir, url, &mut s, &c);
    })
    .await;
}

/// The URL of the default SQLite database under `dir/var`.
fn default_db(dir: &Path) -> String {
    format!("sqlite://{}/var/db/mprov.sqlite3?mode=rwc", dir.display())
}

/// A first start on the default SQLite database, stopped: the folders, the
/// CA and the database exist. The database's URL.
fn started_once(dir: &Path) -> String {
    let url = default_db(dir);
    Server::start(dir, &url, 1, &[]).stop();
    url
}

/// Attack 1: a link planted where the service hands files over, then a
/// restart. The root-only file stays root's and unreadable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_1_a_planted_link_never_hands_a_root_file_over() {
    on_sqlite(|dir, _| {
        let url = started_once(dir);
        let secret = dir.join("root-only");
        std::fs::write(&secret, "root's secret\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

        // As mprov, the attack as written: a link in conf/ (and state/).
        for target in ["etc/x", "var/x"] {
            let link = dir.join(target);
            let out = as_mprov(
                "ln",
                &["-s", secret.to_str().unwrap(), link.to_str().unwrap()],
            );
            assert!(
                !out.status.success() && text(&out).contains("Permission denied"),
                "mprov could write in {target}: {}",
                text(&out)
            );
        }
        // Where mprov may write (its database folder), and where an older
        // version had let it (conf/, planted here as root): links are
        // skipped, never followed.
        std::os::unix::fs::symlink(&secret, dir.join("etc/x")).unwrap();
        let db_link = dir.join("var/db/x");
        let out = as_mprov(
            "ln",
            &["-s", secret.to_str().unwrap(), db_link.to_str().unwrap()],
        );
        assert!(out.status.success(), "{}", text(&out));
        let mut s = Server::start(dir, &url, 2, &[]);
        let log = s.stop();
        assert!(
            log.contains("etc/x is a symbolic link; it is left alone"),
            "{log}"
        );
        assert_eq!(
            owner_mode(&secret),
            (0, 0o600),
            "the root file is untouched"
        );
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's secret\n");
        let out = as_mprov("cat", &[secret.to_str().unwrap()]);
        assert!(!out.status.success(), "mprov read it: {}", text(&out));

        // The database file itself swapped for a link: the start is refused.
        let db = dir.join("var/db/mprov.sqlite3");
        std::fs::rename(&db, dir.join("var/db/real")).unwrap();
        let out = as_mprov(
            "ln",
            &["-s", secret.to_str().unwrap(), db.to_str().unwrap()],
        );
        assert!(out.status.success(), "{}", text(&out));
        let (ok, log) = serve_to_exit(dir, &url, &[]);
        assert!(!ok && log.contains("is a symbolic link"), "{log}");
        assert_eq!(owner_mode(&secret), (0, 0o600));
    })
    .await;
}

/// Attack 2: the service user replaces the CA. It cannot move the TLS
/// folder; and a TLS folder or CA key that someone else could have changed
/// stops the start with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_2_the_service_user_cannot_replace_the_ca() {
    on_sqlite(|dir, _| {
        let url = started_once(dir);
        let tls = dir.join("var/tls");
        let ca = std::fs::read_to_string(tls.join("ca.crt")).unwrap();

        // As mprov: move tls/ aside, or make another beside it.
        let aside = dir.join("var/tls.aside");
        let out = as_mprov("mv", &[tls.to_str().unwrap(), aside.to_str().unwrap()]);
        assert!(!out.status.success(), "{}", text(&out));
        let out = as_mprov("mkdir", &[dir.join("var/tls2").to_str().unwrap()]);
        assert!(!out.status.success(), "{}", text(&out));
        assert_eq!(std::fs::read_to_string(tls.join("ca.crt")).unwrap(), ca);

        // Had it managed to: a TLS folder of the attacker's with its own CA.
        std::fs::rename(&tls, &aside).unwrap();
        std::fs::create_dir(&tls).unwrap();
        let made = Command::new("openssl")
            .args(["req", "-x509"])
            .args(P256)
            .args(["-nodes", "-days", "2", "-subj", "/CN=evil CA"])
            .arg("-keyout")
            .arg(tls.join("ca.key"))
            .arg("-out")
            .arg(tls.join("ca.crt"))
            .output()
            .unwrap();
        assert!(made.status.success(), "{}", text(&made));
        let mprov = uid_of_user("mprov");
        for f in ["", "ca.key", "ca.crt"] {
            std::os::unix::fs::lchown(tls.join(f), Some(mprov), Some(mprov)).unwrap();
        }
        std::fs::set_permissions(&tls, std::fs::Permissions::from_mode(0o700)).unwrap();
        let (ok, log) = serve_to_exit(dir, &url, &[]);
        assert!(
            !ok && log.contains(&format!("belongs to uid {mprov}")) && log.contains("var/tls"),
            "{log}"
        );
        // Root's folder, but the attacker's key file.
        std::os::unix::fs::lchown(&tls, Some(0), Some(0)).unwrap();
        let (ok, log) = serve_to_exit(dir, &url, &[]);
        assert!(
            !ok && log.contains("ca.key") && log.contains(&format!("belongs to uid {mprov}")),
            "{log}"
        );
        std::fs::remove_dir_all(&tls).unwrap();

        // A link to a folder elsewhere.
        std::os::unix::fs::symlink(&aside, &tls).unwrap();
        let (ok, log) = serve_to_exit(dir, &url, &[]);
        assert!(!ok && log.contains("is a symbolic link"), "{log}");
        std::fs::remove_file(&tls).unwrap();
        std::fs::rename(&aside, &tls).unwrap();

        // A key others may read; a folder others may enter.
        std::fs::set_permissions(tls.join("ca.key"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        let (ok, log) = serve_to_exit(dir, &url, &[]);
        assert!(
            !ok && log.contains("ca.key") && log.contains("open to its group or others"),
            "{log}"
        );
        std::fs::set_permissions(tls.join("ca.key"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::fs::set_permissions(&tls, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (ok, log) = serve_to_exit(dir, &url, &[]);
        assert!(!ok && log.contains("open to its group or others"), "{log}");
        std::fs::set_permissions(&tls, std::fs::Permissions::from_mode(0o700)).unwrap();

        // Put right, the same CA is served.
        let mut s = Server::start(dir, &url, 2, &[]);
        let out = Command::new("curl")
            .args(["-sS", &format!("http://127.0.0.1:{}/ca.crt", s.port)])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), ca);
        s.stop();
    })
    .await;
}

/// Every folder and file the service writes, with its owner and mode.
fn walk(root: &Path, out: &mut Vec<(String, u32, u32)>) {
    let (uid, mode) = owner_mode(root);
    out.push((root.display().to_string(), uid, mode));
    if std::fs::symlink_metadata(root).unwrap().is_dir() {
        for e in sorted_entries(root) {
            walk(&e, out);
        }
    }
}

/// The paths in the folder `dir`, sorted.
fn sorted_entries(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    entries
}

/// What each path must be: owner and mode.
fn expected_owner_mode(path: &str, mprov: u32) -> Option<(u32, u32)> {
    let name = Path::new(path).file_name()?.to_str()?;
    Some(if path.ends_with("/etc") {
        (0, 0o700)
    } else if path.contains("/etc/") {
        (0, 0o600)
    } else if path.ends_with("/var") {
        (0, 0o711)
    } else if path.ends_with("/var/tls") {
        (0, 0o700)
    } else if path.contains("/var/tls/") {
        (0, if name.ends_with(".crt") { 0o644 } else { 0o600 })
    } else if path.ends_with("/var/db") {
        (mprov, 0o700)
    } else if path.contains("/var/db/") {
        (mprov, 0o600)
    } else {
        return None;
    })
}

/// Checks every folder and file under `root` (not `root` itself) against
/// [`expected_owner_mode`]: what is wrong, and how many paths were seen.
fn wrong_modes(root: &Path, mprov: u32) -> (Vec<String>, Vec<String>) {
    let mut seen = Vec::new();
    for e in sorted_entries(root) {
        walk(&e, &mut seen);
    }
    let mut wrong = Vec::new();
    for (path, uid, mode) in &seen {
        match expected_owner_mode(path, mprov) {
            Some(want) if want == (*uid, *mode) => {}
            want => wrong.push(format!("{path}: uid {uid} mode {mode:04o}, want {want:?}")),
        }
    }
    (wrong, seen.into_iter().map(|(p, _, _)| p).collect())
}

/// Attack 9 and the file-mode rules: on a fresh machine (an empty root
/// folder) and on a second start, every file and folder the service wrote
/// has its owner and mode, while it runs and after it stopped; existing
/// loose folders are tightened; a new deep path gets the private mode on
/// its last folder only; a state folder under a parent the service user
/// cannot enter stops the start with what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_9_file_modes_on_first_and_second_start() {
    on_sqlite(|dir, _| {
        let mprov = uid_of_user("mprov");
        // A fresh machine: the root folder is empty, so everything in it
        // afterwards was written by the service.
        let root = dir.join("fresh");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let fresh_url = format!("sqlite://{}/var/db/mprov.sqlite3?mode=rwc", root.display());
        let (etc, var) = (root.join("etc"), root.join("var"));
        let env = [
            ("MPROV_CONFIG_DIR", etc.to_str().unwrap()),
            ("MPROV_STATE_DIR", var.to_str().unwrap()),
        ];
        for run in [1, 2] {
            let mut env = env.to_vec();
            env.push(("MPROV_SUPERUSER_PASSWORD", ADMIN_PASSWORD));
            let mut s = Server::start(dir, &fresh_url, run, &env);
            // While it serves (a request read the database), the database's
            // -wal and -shm files are there too.
            let out = Command::new("curl")
                .args(["-sSf", "-o", "/dev/null", "-u"])
                .arg(format!("admin:{ADMIN_PASSWORD}"))
                .args(["-H", &mprov_api::version_header_line()])
                .arg(format!("http://127.0.0.1:{}/api/v1/systems/", s.port))
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", text(&out));
            let (wrong, seen) = wrong_modes(&root, mprov);
            s.stop();
            assert!(
                wrong.is_empty(),
                "start {run}, running:\n{}",
                wrong.join("\n")
            );
            for must in [
                "etc/secret_key",
                "var/tls/ca.key",
                "var/tls/ca.crt",
                "var/db/mprov.sqlite3",
                "var/db/mprov.sqlite3-wal",
                "var/db/mprov.sqlite3-shm",
            ] {
                let p = root.join(must).display().to_string();
                assert!(seen.contains(&p), "start {run}: no {must} in {seen:#?}");
            }
            let (wrong, seen) = wrong_modes(&root, mprov);
            assert!(
                wrong.is_empty(),
                "start {run}, stopped:\n{}",
                wrong.join("\n")
            );
            assert!(seen.len() >= 8, "{seen:#?}");
        }

        // Loose folders and a readable file from before are tightened.
        let url = default_db(dir);
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        std::fs::create_dir_all(dir.join("var")).unwrap();
        std::fs::set_permissions(dir.join("etc"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.join("var"), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(
            dir.join("etc/secret_key"),
            "an old key of 40 characters or more....\n",
        )
        .unwrap();
        std::fs::set_permissions(
            dir.join("etc/secret_key"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        for run in [3, 4] {
            let mut s = Server::start(dir, &url, run, &[]);
            s.stop();
            let mut seen = Vec::new();
            walk(&dir.join("etc"), &mut seen);
            walk(&dir.join("var"), &mut seen);
            let mut wrong = Vec::new();
            for (path, uid, mode) in &seen {
                match expected_owner_mode(path, mprov) {
                    Some(want) if want == (*uid, *mode) => {}
                    want => wrong.push(format!("{path}: uid {uid} mode {mode:04o}, want {want:?}")),
                }
            }
            assert!(seen.len() >= 10, "{seen:?}");
            assert!(wrong.is_empty(), "start {run}:\n{}", wrong.join("\n"));
            let db = dir.join("var/db/mprov.sqlite3");
            assert!(db.exists(), "the database is where the service keeps it");
        }
        // The database file is not readable by anyone else.
        let out = Command::new("setpriv")
            .args([
                "--reuid",
                "nobody",
                "--regid",
                "nogroup",
                "--clear-groups",
                "--",
            ])
            .args(["cat", dir.join("var/db/mprov.sqlite3").to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success());

        // A new deep path: its parents are passable, its last folder private.
        let deep = dir.join("new/a/b");
        let deep_url = format!("sqlite://{}/db/mprov.sqlite3?mode=rwc", deep.display());
        let mut s = Server::start(
            dir,
            &deep_url,
            5,
            &[
                ("MPROV_STATE_DIR", deep.to_str().unwrap()),
                ("MPROV_CONFIG_DIR", dir.join("new/etc").to_str().unwrap()),
            ],
        );
        s.stop();
        for (p, want) in [
            ("new", (0, 0o755)),
            ("new/a", (0, 0o755)),
            ("new/a/b", (0, 0o711)),
            ("new/a/b/db", (mprov, 0o700)),
            ("new/etc", (0, 0o700)),
        ] {
            assert_eq!(owner_mode(&dir.join(p)), want, "{p}");
        }

        // Under root's home (0700): refused, with the folder and what to do.
        let home = dir.join("root-home");
        std::fs::create_dir(&home).unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
        let state = home.join("clone/var");
        let (ok, log) = serve_to_exit(
            dir,
            &format!("sqlite://{}/db/mprov.sqlite3?mode=rwc", state.display()),
            &[
                ("MPROV_STATE_DIR", state.to_str().unwrap()),
                ("MPROV_CONFIG_DIR", home.join("clone/etc").to_str().unwrap()),
            ],
        );
        assert!(
            !ok && log.contains(&format!("{} (mode 0700", home.display()))
                && log.contains("chmod o+x")
                && log.contains("MPROV_STATE_DIR"),
            "{log}"
        );
        // A database folder that holds the TLS folder is never handed over.
        let (ok, log) = serve_to_exit(
            dir,
            &format!("sqlite://{}/var/mprov.sqlite3?mode=rwc", dir.display()),
            &[],
        );
        assert!(
            !ok && log.contains("holds") && log.contains("a folder of its own"),
            "{log}"
        );
        assert_eq!(owner_mode(&dir.join("var")), (0, 0o711));
    })
    .await;
}

/// `serve` started with an empty environment (no PATH) makes its service
/// user when it does not exist yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_no_path_makes_its_user() {
    on_sqlite(|dir, _| {
        let user = "mprov-t11";
        let _ = Command::new("/usr/sbin/userdel").arg(user).status();
        let url = default_db(dir);
        let mut s = Server::start(dir, &url, 1, &[("PATH", ""), ("MPROV_SERVICE_USER", user)]);
        let log = s.stop();
        assert!(
            log.contains(&format!("made the system user {user}")),
            "{log}"
        );
        assert!(log.contains(&format!("running as {user}")), "{log}");
        let del = Command::new("/usr/sbin/userdel")
            .arg(user)
            .status()
            .unwrap();
        assert!(del.success());
    })
    .await;
}

/// How a curl request authenticates.
#[derive(Clone)]
pub(crate) enum As {
    Nobody,
    Admin,
    /// Another account, by user name and password (HTTP Basic).
    User(&'static str, &'static str),
    /// An API key (an admin's).
    Key(String),
    Cert(std::path::PathBuf),
}

/// A client of the real service: curl over HTTPS with the service's CA.
pub(crate) struct Client {
    pub(crate) https: u16,
    pub(crate) ca: std::path::PathBuf,
    pub(crate) work: std::path::PathBuf,
}

pub(crate) const ADMIN_PASSWORD: &str = "attack-admin-password";

impl Client {
    pub(crate) fn new(s: &Server, dir: &Path) -> Client {
        let work = dir.join("client");
        std::fs::create_dir_all(&work).unwrap();
        Client {
            https: s.https_port,
            ca: dir.join("var/tls/ca.crt"),
            work,
        }
    }

    /// The curl command for one request; the body goes in `body_file`.
    pub(crate) fn command(
        &self,
        method: &str,
        path: &str,
        who: &As,
        body: Option<&serde_json::Value>,
        tag: &str,
    ) -> Command {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "-X", method, "-w", "\n%{http_code}", "-D"])
            .arg(self.work.join(format!("{tag}.headers")))
            .arg("--cacert")
            .arg(&self.ca)
            .args(["-H", &mprov_api::version_header_line()]);
        match who {
            As::Nobody => {}
            As::Admin => {
                cmd.args(["-u", &format!("admin:{ADMIN_PASSWORD}")]);
            }
            As::User(user, password) => {
                cmd.args(["-u", &format!("{user}:{password}")]);
            }
            As::Key(key) => {
                cmd.args(["-H", &format!("Authorization: Api-Key {key}")]);
            }
            As::Cert(base) => {
                cmd.arg("--cert")
                    .arg(base.with_extension("crt"))
                    .arg("--key")
                    .arg(base.with_extension("key"));
            }
        }
        if let Some(b) = body {
            let file = self.work.join(format!("{tag}.json"));
            std::fs::write(&file, b.to_string()).unwrap();
            cmd.args(["-H", "Content-Type: application/json", "--data-binary"])
                .arg(format!("@{}", file.display()));
        }
        cmd.arg(format!("https://127.0.0.1:{}{path}", self.https));
        cmd
    }

    pub(crate) fn parse(out: &Output) -> (u16, serde_json::Value, String) {
        let all = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = all.rsplit_once('\n').unwrap_or((&all, ""));
        let v = serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.to_owned()));
        (code.parse().unwrap_or(0), v, body.to_owned())
    }

    /// Runs a request made by [`Client::command`]: the status and body.
    fn call_with(mut cmd: Command) -> (u16, serde_json::Value) {
        let (code, v, _) = Client::parse(&cmd.output().unwrap());
        (code, v)
    }

    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        who: &As,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let out = self
            .command(method, path, who, body.as_ref(), "one")
            .output()
            .unwrap();
        let (code, v, _) = Client::parse(&out);
        (code, v)
    }

    pub(crate) fn ok(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> serde_json::Value {
        let (code, v) = self.call(method, path, &As::Admin, body);
        assert!((200..300).contains(&code), "{method} {path}: {code} {v}");
        v
    }

    /// Creates one object of `kind` as the admin; the created object.
    pub(crate) fn post(&self, kind: &str, body: serde_json::Value) -> serde_json::Value {
        self.ok("POST", &format!("/api/v1/{kind}/"), Some(body))
    }

    /// A P-256 key and a CSR with `subject` and `-addext` items.
    pub(crate) fn csr(&self, name: &str, newkey: &[&str], extra: &[&str]) -> String {
        let key = self.work.join(format!("{name}.key"));
        let csr = self.work.join(format!("{name}.csr"));
        let mut cmd = Command::new("openssl");
        cmd.args(["req", "-new", "-nodes", "-subj", "/"])
            .args(newkey)
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&csr);
        for e in extra {
            cmd.args(["-addext", e]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        std::fs::read_to_string(csr).unwrap()
    }

    /// Enrolls a node with `nonce`; its certificate at `work/<name>.crt`.
    pub(crate) fn enroll_node(&self, name: &str, nonce: &str) -> std::path::PathBuf {
        let csr = self.csr(name, &P256, &[]);
        let (code, v) = self.call(
            "POST",
            "/enroll/node/",
            &As::Nobody,
            Some(serde_json::json!({"nonce": nonce, "csr": csr})),
        );
        assert_eq!(code, 200, "{v}");
        let base = self.work.join(name);
        std::fs::write(
            base.with_extension("crt"),
            v["certificate"].as_str().unwrap(),
        )
        .unwrap();
        base
    }

    /// The enrollment nonce on a fresh /ipxe/ script for `mac`, once the
    /// job server `jsx` ([`hosted_image`]) has reported leasing loopback's
    /// address to it: without that lease /ipxe/ hands out no nonce.
    pub(crate) fn nonce(&self, db_url: &str, mac: &str) -> String {
        let (db_url, leased) = (db_url.to_owned(), mac.to_owned());
        tokio::runtime::Handle::current().block_on(async move {
            let db = mprov_control::db::Db::connect(&db_url).await.unwrap();
            crate::scopes::attest_on(&db, "jsx", &leased, [127, 0, 0, 1].into()).await;
        });
        let (code, v) = self.call("GET", &format!("/ipxe/?mac={mac}"), &As::Nobody, None);
        assert_eq!(code, 200, "{v}");
        let script = v.as_str().unwrap_or_default().to_owned();
        script
            .split_whitespace()
            .find_map(|w| w.strip_prefix("mprov_enroll="))
            .unwrap_or_else(|| panic!("no nonce in {script}"))
            .to_owned()
    }

    pub(crate) fn token(&self, name: &str, purpose: &str) -> String {
        self.post(
            "enroll-tokens",
            serde_json::json!({"name": name, "purpose": purpose}),
        )["token"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Enrolls job server `name` with `token`: status and body.
    pub(crate) fn enroll_js(&self, token: &str, name: &str, csr: &str) -> (u16, serde_json::Value) {
        self.call(
            "POST",
            "/enroll/jobserver/",
            &As::Nobody,
            Some(serde_json::json!({"token": token, "name": name, "csr": csr})),
        )
    }

    /// Enrolls job server `name` (its row exists) with a new token: its
    /// certificate's base path (the key beside it).
    pub(crate) fn enrolled_jobserver(&self, name: &str) -> std::path::PathBuf {
        let (code, v) = self.enroll_js(&self.token(name, "new"), name, &self.csr(name, &P256, &[]));
        assert_eq!(code, 200, "{v}");
        let base = self.work.join(name);
        std::fs::write(
            base.with_extension("crt"),
            v["certificate"].as_str().unwrap(),
        )
        .unwrap();
        base
    }

    /// Certificates of `identity` that are not revoked.
    pub(crate) fn live(&self, identity: &str) -> usize {
        let v = self.ok(
            "GET",
            &format!("/api/v1/credentials/?identity={identity}"),
            None,
        );
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["revoked_at"].is_null())
            .count()
    }
}

/// An image `compute` on job server `jsx` of network `lo` (127.0.0.0/8,
/// where the test's requests come from), so /ipxe/ boots nodes of `lo`
/// with it.
pub(crate) fn hosted_image(c: &Client) -> serde_json::Value {
    c.post(
        "networks",
        serde_json::json!({"slug": "lo", "subnet": "127.0.0.0", "netmask": 8}),
    );
    let js = c.post(
        "jobservers",
        serde_json::json!({"name": "jsx", "addresses": ["10.0.0.2"], "network": "lo"}),
    );
    let image = c.post("images", serde_json::json!({"slug": "compute", "rootfs_sha256": crate::scopes::SHA, "rootfs_size": 4096}));
    c.ok(
        "PATCH",
        "/api/v1/images/compute",
        Some(serde_json::json!({"jobservers": [js["id"]]})),
    );
    image
}

pub(crate) fn start_admin(dir: &Path, url: &str, run: usize) -> Server {
    Server::start(
        dir,
        url,
        run,
        &[("MPROV_SUPERUSER_PASSWORD", ADMIN_PASSWORD)],
    )
}

/// Attack 3: node c01, with its own certificate, tries each change of the
/// issue against the real service. Every one is refused; c01, c02, their
/// NICs and BMCs and the inventory revision are unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_3_a_node_cannot_change_who_it_is() {
    on_admin(Engine::Sqlite, |_, url, s, c| {
        let group = c.post("groups", serde_json::json!({"slug": "secret-group", "config_params": "db_password: hunter2\n"}));
        let image = c.post("images", serde_json::json!({"slug": "other-image"}));
        let own_image = hosted_image(c);
        let mut sys = Vec::new();
        for (host, mac) in [("c01", "aa:bb:cc:00:01:01"), ("c02", "aa:bb:cc:00:01:02")] {
            let v = c.post("systems", serde_json::json!({"hostname": host, "image": own_image["id"], "nics": [{"mac": mac, "network": "lo"}]}));
            let bmc = c.post("bmcs", serde_json::json!({"system": v["id"], "password": "bmc-secret"}));
            sys.push((v["id"].as_i64().unwrap(), v["nics"][0]["id"].as_i64().unwrap(), bmc["id"].as_i64().unwrap()));
        }
        let nonce = c.nonce(url, "aa:bb:cc:00:01:01");
        let me = As::Cert(c.enroll_node("c01", &nonce));
        let ((_, nic1, bmc1), (id2, _, _)) = (sys[0], sys[1]);
        let snapshot = |c: &Client| {
            [
                "/api/v1/systems/c01".to_owned(),
                "/api/v1/systems/c02".to_owned(),
                format!("/api/v1/nics/{nic1}"),
                format!("/api/v1/bmcs/{bmc1}"),
                "/api/v1/revision".to_owned(),
            ]
            .map(|p| c.ok("GET", &p, None))
        };
        let before = snapshot(c);
        // It reads its own row: the certificate works.
        assert_eq!(c.call("GET", "/api/v1/systems/c01", &me, None).0, 200);
        let attacks = [
            ("PATCH", "/api/v1/systems/c01".to_owned(), serde_json::json!({"groups": [group["id"]]})),
            ("PATCH", "/api/v1/systems/c01".to_owned(), serde_json::json!({"image": image["id"]})),
            ("PATCH", "/api/v1/systems/c01".to_owned(), serde_json::json!({"install_kernel_cmdline": "init=/bin/sh"})),
            ("PATCH", "/api/v1/systems/c01".to_owned(), serde_json::json!({"hostname": "c09"})),
            ("PATCH", format!("/api/v1/nics/{nic1}"), serde_json::json!({"system": "c02"})),
            ("PATCH", format!("/api/v1/nics/{nic1}"), serde_json::json!({"system": id2})),
            ("PATCH", format!("/api/v1/nics/{nic1}"), serde_json::json!({"hostname": "mpcc", "aliases": ["mpcc", "js1"]})),
            ("PATCH", format!("/api/v1/bmcs/{bmc1}"), serde_json::json!({"system": id2})),
            ("PATCH", format!("/api/v1/bmcs/{bmc1}"), serde_json::json!({"password": "attacker"})),
        ];
        for (method, path, body) in attacks {
            let (code, v) = c.call(method, &path, &me, Some(body.clone()));
            assert_eq!(code, 403, "{method} {path} {body}: {code} {v}");
            assert!(v["message"].as_str().unwrap_or_default().contains("may not write"), "{v}");
        }
        // Its effective config shows no group's secrets.
        let (_, cfg) = c.call("GET", "/api/v1/systems/c01/config", &me, None);
        assert!(!cfg.to_string().contains("hunter2"), "{cfg}");
        assert_eq!(snapshot(c), before, "the attacks changed data");
        // /ipxe/ for c01's MAC still boots c01, never c02.
        let (_, script) = c.call("GET", "/ipxe/?mac=aa:bb:cc:00:01:01", &As::Nobody, None);
        let script = script.as_str().unwrap_or_default().to_owned();
        // Whole words, not substrings: the CA fingerprint's hex may hold "c02".
        let words: Vec<&str> = script.split(|c: char| !c.is_ascii_alphanumeric()).collect();
        assert!(
            script.contains("booting c01")
                && script.contains("mprov_mac=aa:bb:cc:00:01:01")
                && !words.contains(&"c02")
                && !script.contains("aa:bb:cc:00:01:02"),
            "{script}"
        );
        s.stop();
    })
    .await;
}

/// Attack 18 (issue 23): node c01, with its own certificate, reaches for
/// c02's scripts through every script-runner endpoint and through the
/// inventory: c02's plan (naming it with `system=`, by id, with `host=`),
/// the content of a script only c02 runs, a run report naming c02, c02's
/// effective config, and asking either node to run its scripts again. All
/// are refused and nothing of c02's shows in any answer; c02's timeline
/// stays empty while c01's own report lands on c01's. The job server's
/// certificate cannot queue a run either; the admin can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_18_a_node_reaches_only_its_own_scripts() {
    use serde_json::json;
    on_admin(Engine::Sqlite, |_, url, s, c| {
        let image = hosted_image(c);
        let mine = c.post("scripts", json!({"slug": "mine", "script_type": "post-boot", "content": "echo mine\n"}));
        let theirs = c.post("scripts", json!({"slug": "theirs", "script_type": "post-boot", "content": "echo c02-script-body\n"}));
        let mut ids = Vec::new();
        for (host, mac, script, params) in [
            ("c01", "aa:bb:cc:00:18:01", &mine, "site: c01\n"),
            ("c02", "aa:bb:cc:00:18:02", &theirs, "c02_only: sekrit-c02\n"),
        ] {
            let v = c.post("systems", json!({"hostname": host, "image": image["id"], "scripts": [script["id"]],
                "config_params": params, "nics": [{"mac": mac, "network": "lo"}]}));
            ids.push(v["id"].as_i64().unwrap());
        }
        let nonce = c.nonce(url, "aa:bb:cc:00:18:01");
        let me = As::Cert(c.enroll_node("c01", &nonce));
        let js = As::Cert(c.enrolled_jobserver("jsx"));
        let leaked = |v: &serde_json::Value| {
            let t = v.to_string();
            t.contains("sekrit-c02") || t.contains("c02-script-body")
        };

        // Its own plan works, and holds nothing of c02's.
        let (code, plan) = c.call("GET", "/api/v1/scripts/plan?mode=post-boot", &me, None);
        assert_eq!(code, 200, "{plan}");
        assert_eq!(plan["host"], "c01");
        assert_eq!(plan["scripts"][0]["slug"], "mine");
        assert!(!leaked(&plan) && !plan.to_string().contains("theirs"), "{plan}");

        let c02_id = ids[1].to_string();
        let attacks: [(&str, String, Option<serde_json::Value>, u16); 9] = [
            ("GET", "/api/v1/scripts/plan?mode=post-boot&system=c02".into(), None, 403),
            ("GET", format!("/api/v1/scripts/plan?mode=post-boot&system={c02_id}"), None, 403),
            ("GET", "/api/v1/scripts/plan?mode=post-boot&host=c02".into(), None, 400),
            ("GET", "/api/v1/scripts/plan?system=c02&mode=post-boot&system=c01".into(), None, 403),
            ("GET", "/api/v1/scripts/theirs/content".into(), None, 403),
            ("GET", "/api/v1/systems/c02/config".into(), None, 403),
            ("GET", format!("/api/v1/systems/{c02_id}/config"), None, 403),
            ("POST", "/api/v1/systems/c02/run-scripts".into(), None, 403),
            ("POST", "/api/v1/systems/c01/run-scripts".into(), None, 403),
        ];
        for (method, path, body, want) in attacks {
            let (code, v) = c.call(method, &path, &me, body);
            assert_eq!(code, want, "{method} {path}: {v}");
            assert!(!leaked(&v), "{method} {path} leaked: {v}");
        }
        // A report naming another node is refused whole.
        let report = json!({"mode": "post-boot", "outcome": "failed", "detail": "mine exited 1",
            "results": [{"slug": "mine", "status": "failed", "exit_code": 1, "duration_ms": 10, "output_tail": "forged\n"}]});
        for field in ["system", "host", "hostname"] {
            let mut forged = report.clone();
            forged[field] = json!("c02");
            let (code, v) = c.call("POST", "/api/v1/scripts/results", &me, Some(forged));
            assert_eq!(code, 400, "{field}: {v}");
        }
        let c02_events = c.ok("GET", "/api/v1/boot/events?system=c02", None);
        assert_eq!(c02_events, json!([]), "nothing landed on c02's timeline");
        // Its own report lands on its own timeline only.
        let (code, v) = c.call("POST", "/api/v1/scripts/results", &me, Some(report));
        assert_eq!(code, 201, "{v}");
        let c01_events = c.ok("GET", "/api/v1/boot/events?system=c01", None);
        let phases: Vec<&str> = c01_events.as_array().unwrap().iter().map(|e| e["phase"].as_str().unwrap()).collect();
        assert!(phases.ends_with(&["script", "failed"]), "{c01_events}");
        assert_eq!(c.ok("GET", "/api/v1/boot/events?system=c02", None), json!([]));

        // Queuing a run: the job server no more than the node; the admin yes.
        for who in [&js, &me] {
            let (code, v) = c.call("POST", "/api/v1/systems/c02/run-scripts", who, None);
            assert_eq!(code, 403, "{v}");
        }
        let (code, v) = c.call("POST", "/api/v1/systems/c02/run-scripts", &As::Admin, None);
        assert_eq!((code, &v["run_request"]), (200, &json!(1)), "{v}");
        let c02 = c.ok("GET", "/api/v1/systems/c02", None);
        assert_eq!(c02["run_request"], 1);
        assert_eq!(c.ok("GET", "/api/v1/systems/c01", None)["run_request"], 0);
        s.stop();
    })
    .await;
}

/// Attack 4: a token made for new-js9 enrolls as the live js1: refused, and
/// js1's certificate keeps working. A new-server token for a live name is
/// refused too; a replace token for that name works (and revokes the old).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_4_a_token_works_only_for_its_name() {
    on_admin(Engine::Sqlite, |_, _, s, c| {
        let csr = c.csr("js1", &P256, &[]);
        let (code, v) = c.enroll_js(&c.token("js1", "new"), "js1", &csr);
        assert_eq!(code, 200, "{v}");
        let js1 = c.work.join("js1");
        std::fs::write(
            js1.with_extension("crt"),
            v["certificate"].as_str().unwrap(),
        )
        .unwrap();
        let me = As::Cert(js1.clone());
        assert_eq!(c.call("GET", "/api/v1/systems/", &me, None).0, 200);

        let t9 = c.token("new-js9", "new");
        let (code, v) = c.enroll_js(&t9, "js1", &c.csr("evil", &P256, &[]));
        assert_eq!(code, 403, "{v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("made for \"new-js9\""),
            "{v}"
        );
        assert_eq!(
            c.call("GET", "/api/v1/systems/", &me, None).0,
            200,
            "js1 still works"
        );
        assert_eq!(c.live("js1"), 1);
        // The token was not spent: new-js9 itself still enrolls with it.
        let (code, v) = c.enroll_js(&t9, "new-js9", &c.csr("new-js9", &P256, &[]));
        assert_eq!(code, 200, "{v}");

        let again = c.token("js1", "new");
        let (code, v) = c.enroll_js(&again, "js1", &c.csr("evil2", &P256, &[]));
        assert_eq!(code, 409, "{v}");
        assert!(v["message"].as_str().unwrap().contains("--replace"), "{v}");
        assert_eq!(c.call("GET", "/api/v1/systems/", &me, None).0, 200);
        // A token without a name cannot be made.
        let (code, _) = c.call(
            "POST",
            "/api/v1/enroll-tokens/",
            &As::Admin,
            Some(serde_json::json!({})),
        );
        assert_eq!(code, 400);

        let replace = c.token("js1", "replace");
        let (code, v) = c.enroll_js(&replace, "js1", &c.csr("js1b", &P256, &[]));
        assert_eq!(code, 200, "{v}");
        assert_eq!(
            c.call("GET", "/api/v1/systems/", &me, None).0,
            401,
            "the old one is revoked"
        );
        assert_eq!(c.live("js1"), 1);
        s.stop();
    })
    .await;
}

/// Attack 11: job server js1, with its own certificate, tries to rewrite
/// its own row (its network, addresses, port, name: where nodes would be
/// sent) and to report a load for js2. Every one is refused and both rows
/// are unchanged; its heartbeat stores its load and time on its own row
/// only, and nobody else can send one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_11_a_job_server_writes_only_its_own_load() {
    on_admin(Engine::Sqlite, |_, url, s, c| {
        let other = c.post("networks", serde_json::json!({"slug": "elsewhere", "subnet": "10.9.0.0", "netmask": 24}));
        for (name, address) in [("js1", "10.0.0.2"), ("js2", "10.0.0.3")] {
            c.post("jobservers", serde_json::json!({"name": name, "addresses": [address]}));
        }
        let js1 = As::Cert(c.enrolled_jobserver("js1"));
        let rows = |c: &Client| {
            ["js1", "js2"].map(|n| c.ok("GET", &format!("/api/v1/jobservers/{n}"), None))
        };
        let before = rows(c);
        assert!(before[0]["heartbeat_at"].is_null(), "{}", before[0]);
        let heartbeat = mprov_api::boot::HEARTBEAT_PATH;
        let attacks = [
            ("PATCH", "/api/v1/jobservers/js1", serde_json::json!({"network": other["id"]})),
            ("PATCH", "/api/v1/jobservers/js1", serde_json::json!({"addresses": ["10.9.0.66"]})),
            ("PATCH", "/api/v1/jobservers/js1", serde_json::json!({"port": 8443})),
            ("PATCH", "/api/v1/jobservers/js1", serde_json::json!({"name": "js9"})),
            ("PATCH", "/api/v1/jobservers/js1", serde_json::json!({"load_avg": 0})),
            ("PATCH", "/api/v1/jobservers/js2", serde_json::json!({"addresses": ["10.9.0.66"]})),
        ];
        for (method, path, body) in attacks {
            let (code, v) = c.call(method, path, &js1, Some(body.clone()));
            assert_eq!(code, 403, "{method} {path} {body}: {code} {v}");
        }
        // Naming another job server in a heartbeat, or a load that is no
        // load, is refused too.
        for body in [
            serde_json::json!({"load_avg": 0.5, "name": "js2"}),
            serde_json::json!({"load_avg": -1.0}),
            serde_json::json!({"load_avg": "low"}),
        ] {
            let (code, v) = c.call("POST", heartbeat, &js1, Some(body.clone()));
            assert!((400..500).contains(&code) && code != 401 && code != 403, "{body}: {code} {v}");
        }
        assert_eq!(rows(c), before, "the attacks changed a job server's row");

        // The heartbeat itself: load and time on js1's row, nothing else.
        let (code, v) = c.call("POST", heartbeat, &js1, Some(serde_json::json!({"load_avg": 2.5})));
        assert_eq!(code, 204, "{v}");
        let after = rows(c);
        assert_eq!(after[0]["load_avg"], 2.5, "{}", after[0]);
        assert!(after[0]["heartbeat_at"].is_string(), "{}", after[0]);
        assert_eq!(after[1], before[1], "js2 untouched");
        for field in ["name", "addresses", "port", "network", "updated_at"] {
            assert_eq!(after[0][field], before[0][field], "{field}");
        }
        // Nobody else can say which job server they speak for.
        let nonce = {
            let image = hosted_image(c);
            c.post("systems", serde_json::json!({"hostname": "c01", "image": image["id"], "nics": [{"mac": "aa:bb:cc:00:11:01", "network": "lo"}]}));
            c.nonce(url, "aa:bb:cc:00:11:01")
        };
        let node = As::Cert(c.enroll_node("c01", &nonce));
        for (who, want) in [(&node, 403), (&As::Admin, 403), (&As::Nobody, 401)] {
            let (code, v) = c.call("POST", heartbeat, who, Some(serde_json::json!({"load_avg": 0.0})));
            assert_eq!(code, want, "{v}");
        }
        assert_eq!(rows(c)[0]["load_avg"], 2.5);
        s.stop();
    })
    .await;
}

/// Attack 16: job servers register themselves, and each registers only
/// itself. A registration names no row: the certificate's name is the
/// row's. A second job server sending the first's host id cannot take the
/// first's row over while the first's certificate is valid (409, saying
/// what to do); once an administrator revoked it (the host was renamed),
/// the new name takes the row over with its id and hosting records, and
/// its own certificate stays valid. A row made by hand is claimed by the
/// first host that registers under its name, and by no other host later.
/// A node's certificate, an admin's password and an admin's API key
/// cannot register or heartbeat as a job server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_16_a_job_server_registers_only_itself() {
    on_admin(Engine::Sqlite, |_, url, s, c| {
        use serde_json::json;
        let register = mprov_api::jobs::REGISTER_PATH;
        let heartbeat = mprov_api::boot::HEARTBEAT_PATH;
        let image = hosted_image(c);
        c.post("networks", json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 24}));
        let body = |host: &str, address: &str| {
            json!({"host_id": host, "modules": ["dnsmasq"], "port": 8081,
                "addresses": [{"address": address}]})
        };
        let rows = |c: &Client| c.ok("GET", "/api/v1/jobservers/?sort=id", None)["items"].clone();

        // js1 registers itself: no row made by hand.
        let js1 = As::Cert(c.enrolled_jobserver("js1"));
        let (code, v) = c.call("POST", register, &js1, Some(body("host-a", "10.0.0.2")));
        assert_eq!(code, 200, "{v}");
        let js1_id = v["id"].clone();
        assert_eq!(v["name"], "js1");
        let jsx = c.ok("GET", "/api/v1/jobservers/jsx", None)["id"].clone();
        c.ok(
            "PATCH",
            "/api/v1/images/compute",
            Some(json!({"jobservers": [jsx.clone(), js1_id.clone()]})),
        );
        let (code, v) = c.call("POST", heartbeat, &js1, Some(json!({"load_avg": 0.5, "address": "10.0.0.2", "streams": 1})));
        assert_eq!(code, 204, "{v}");

        // The body cannot name a row.
        for named in [
            json!({"name": "js9", "host_id": "host-a", "modules": [], "port": 8081, "addresses": []}),
            json!({"id": 1, "host_id": "host-a", "modules": [], "port": 8081, "addresses": []}),
        ] {
            let (code, v) = c.call("POST", register, &js1, Some(named.clone()));
            assert!((400..500).contains(&code) && code != 401, "{named}: {code} {v}");
        }

        // js2 sends js1's host id: refused, js1's row untouched, no js2 row.
        let before = rows(c);
        let js2 = As::Cert(c.enrolled_jobserver("js2"));
        let (code, v) = c.call("POST", register, &js2, Some(body("host-a", "10.0.0.66")));
        assert_eq!(code, 409, "{v}");
        let message = v["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("js1") && message.contains("certificate is still valid") && message.contains("revoke"),
            "{v}"
        );
        assert_eq!(rows(c), before, "a refused registration changed a row");
        // Nor can it heartbeat js1's address, or any: it has no row.
        let (code, v) = c.call("POST", heartbeat, &js2, Some(json!({"load_avg": 0.0, "address": "10.0.0.2"})));
        assert_eq!(code, 403, "{v}");
        assert_eq!(c.live("js1"), 1);

        // A node's certificate, an admin (password or API key), nobody.
        let nonce = {
            c.post("systems", json!({"hostname": "c01", "image": image["id"], "nics": [{"mac": "aa:bb:cc:00:16:01", "network": "lo"}]}));
            c.nonce(url, "aa:bb:cc:00:16:01")
        };
        let node = As::Cert(c.enroll_node("c01", &nonce));
        let key = As::Key(c.post("apikeys", json!({"name": "ops"}))["key"].as_str().unwrap().to_owned());
        for (who, want) in [(&node, 403), (&As::Admin, 403), (&key, 403), (&As::Nobody, 401)] {
            let (code, v) = c.call("POST", register, who, Some(body("host-x", "10.0.0.77")));
            assert_eq!(code, want, "register: {v}");
            let (code, v) = c.call("POST", heartbeat, who, Some(json!({"load_avg": 0.0, "address": "10.0.0.2"})));
            assert_eq!(code, want, "heartbeat: {v}");
        }
        assert_eq!(rows(c), before, "a refused call changed a row");

        // The host was renamed js1 → js2: once js1's certificate is
        // revoked, js2 takes the row over, with its id and hosting record;
        // js2's own certificate stays valid.
        let creds = c.ok("GET", "/api/v1/credentials/?identity=js1", None);
        let id = creds["items"][0]["id"].as_i64().unwrap();
        c.ok("POST", &format!("/api/v1/credentials/{id}/revoke"), None);
        let (code, v) = c.call("POST", register, &js2, Some(body("host-a", "10.0.0.3")));
        assert_eq!(code, 200, "{v}");
        assert_eq!((v["id"].clone(), v["name"].clone()), (js1_id.clone(), json!("js2")));
        let row = c.ok("GET", "/api/v1/jobservers/js2", None);
        assert_eq!(row["host_id"], "host-a");
        assert_eq!(row["addresses"], json!(["10.0.0.3"]));
        let (code, _) = c.call("GET", "/api/v1/jobservers/js1", &As::Admin, None);
        assert_eq!(code, 404);
        assert_eq!(c.ok("GET", "/api/v1/images/compute", None)["jobservers"], json!([jsx, js1_id]));
        assert_eq!(c.live("js2"), 1);
        let (code, v) = c.call("POST", heartbeat, &js2, Some(json!({"load_avg": 0.1, "address": "10.0.0.3"})));
        assert_eq!(code, 204, "{v}");
        // The old certificate is of no use.
        let (code, v) = c.call("POST", heartbeat, &js1, Some(json!({"load_avg": 0.1})));
        assert!(code == 401 || code == 403, "{code} {v}");

        // A row made by hand is claimed by the first host registering under
        // its name; another host under that name later is refused.
        let made = c.post("jobservers", json!({"name": "js3", "addresses": ["10.0.0.9"], "network": "prov"}));
        let js3 = As::Cert(c.enrolled_jobserver("js3"));
        let (code, v) = c.call("POST", register, &js3, Some(body("host-c", "10.0.0.9")));
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["id"], made["id"]);
        let (code, v) = c.call("POST", register, &js3, Some(body("host-d", "10.0.0.9")));
        assert_eq!(code, 409, "{v}");
        assert!(v["message"].as_str().unwrap_or_default().contains("another host"), "{v}");
        assert_eq!(c.ok("GET", "/api/v1/jobservers/js3", None)["host_id"], "host-c");
        s.stop();
    })
    .await;
}

/// Attack 12: a deleted or renamed row's certificate. A job server whose
/// row was deleted read the whole inventory for the rest of its 90 days; a
/// deleted node's certificate became the certificate of the next system
/// given its host name. Deleting or renaming a row now revokes its
/// certificates in the same transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_12_a_deleted_or_renamed_row_keeps_no_certificate() {
    on_admin(Engine::Sqlite, |_, url, s, c| {
        let image = hosted_image(c);
        let node = |c: &Client, host: &str, mac: &str| {
            c.post(
                "systems",
                serde_json::json!({"hostname": host, "image": image["id"], "nics": [{"mac": mac, "network": "lo"}]}),
            );
            As::Cert(c.enroll_node(host, &c.nonce(url, mac)))
        };
        let c01 = node(c, "c01", "aa:bb:cc:00:12:01");
        let c02 = node(c, "c02", "aa:bb:cc:00:12:02");
        c.post(
            "jobservers",
            serde_json::json!({"name": "js1", "addresses": ["10.0.0.5"]}),
        );
        let (code, v) = c.enroll_js(&c.token("js1", "new"), "js1", &c.csr("js1", &P256, &[]));
        assert_eq!(code, 200, "{v}");
        let crt = c.work.join("js1");
        std::fs::write(
            crt.with_extension("crt"),
            v["certificate"].as_str().unwrap(),
        )
        .unwrap();
        let js1 = As::Cert(crt);
        // Each works before.
        for (who, path) in [
            (&c01, "/api/v1/systems/c01"),
            (&c02, "/api/v1/systems/c02"),
            (&js1, "/api/v1/systems/"),
        ] {
            let (code, v) = c.call("GET", path, who, None);
            assert_eq!(code, 200, "{path}: {v}");
        }
        let refused = |who: &As, path: &str| {
            let (code, v) = c.call("GET", path, who, None);
            assert!(code == 401 || code == 403, "{path}: {code} {v}");
            assert!(
                v.get("items").is_none() && v.get("hostname").is_none(),
                "{v}"
            );
        };

        // The job server's row deleted: its certificate reads nothing.
        c.ok("DELETE", "/api/v1/jobservers/js1", None);
        refused(&js1, "/api/v1/systems/");
        refused(&js1, mprov_api::boot::BOOTCONFIG_PATH);
        assert_eq!(c.live("js1"), 0);

        // A node's row deleted, then new hardware given its name: the old
        // certificate is not the new system's.
        c.ok("DELETE", "/api/v1/systems/c01", None);
        c.post(
            "systems",
            serde_json::json!({"hostname": "c01", "nics": [{"mac": "aa:bb:cc:00:12:99"}]}),
        );
        refused(&c01, "/api/v1/systems/c01");
        assert_eq!(c.live("c01"), 0);

        // A node renamed: its certificate named the old name, which another
        // system may take next.
        c.ok(
            "PATCH",
            "/api/v1/systems/c02",
            Some(serde_json::json!({"hostname": "c03"})),
        );
        c.post(
            "systems",
            serde_json::json!({"hostname": "c02", "nics": [{"mac": "aa:bb:cc:00:12:98"}]}),
        );
        refused(&c02, "/api/v1/systems/c02");
        refused(&c02, "/api/v1/systems/c03");
        assert_eq!(c.live("c02"), 0);
        let creds = c.ok("GET", "/api/v1/credentials/?identity=c02", None);
        assert_eq!(
            creds["items"][0]["revoke_reason"], "renamed to c03",
            "{creds}"
        );
        s.stop();
    })
    .await;
}

/// Attack 13: a job server rewrites a job it claimed: which job server owns
/// it, its module, its parameters. It may write only the job's status,
/// output, exit code and times, and nothing of a job it did not claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_13_a_job_server_writes_only_the_status_of_its_jobs() {
    on_admin(Engine::Sqlite, |_, _, s, c| {
        let mut ids = Vec::new();
        for (name, address) in [("js1", "10.0.0.2"), ("js2", "10.0.0.3")] {
            ids.push(c.post("jobservers", serde_json::json!({"name": name, "addresses": [address]}))["id"].clone());
        }
        let js1 = As::Cert(c.enrolled_jobserver("js1"));
        let own = c.post("jobs", serde_json::json!({"module": "image-update", "params": {"image": "compute"}, "jobserver": ids[0]}));
        let other = c.post("jobs", serde_json::json!({"module": "image-update", "jobserver": ids[1]}));
        let path = |job: &serde_json::Value| format!("/api/v1/jobs/{}", job["id"]);
        let before = [c.ok("GET", &path(&own), None), c.ok("GET", &path(&other), None)];
        for body in [
            serde_json::json!({"jobserver": ids[1]}),
            serde_json::json!({"module": "image-delete"}),
            serde_json::json!({"params": {"image": "other"}}),
            serde_json::json!({"status": "running", "jobserver": null}),
        ] {
            let (code, v) = c.call("PATCH", &path(&own), &js1, Some(body.clone()));
            assert_eq!(code, 403, "{body}: {v}");
        }
        let (code, v) = c.call("PATCH", &path(&other), &js1, Some(serde_json::json!({"status": "failed"})));
        assert_eq!(code, 403, "another's job: {v}");
        assert_eq!(
            [c.ok("GET", &path(&own), None), c.ok("GET", &path(&other), None)],
            before,
            "the attacks changed a job"
        );
        // What it may write: its own job's status, output, exit code and
        // times.
        let (code, v) = c.call(
            "PATCH",
            &path(&own),
            &js1,
            Some(serde_json::json!({"status": "success", "output": "built", "return_code": 0, "started_at": "2026-12-01T10:00:00Z", "ended_at": "2026-12-01T10:05:00Z"})),
        );
        assert_eq!(code, 200, "{v}");
        let after = c.ok("GET", &path(&own), None);
        assert_eq!((&after["status"], &after["output"], &after["return_code"]), (&"success".into(), &"built".into(), &0.into()));
        for field in ["jobserver", "module", "params"] {
            assert_eq!(after[field], before[0][field], "{field}");
        }
        s.stop();
    })
    .await;
}

/// Attack 17: the jobs queue against the real service. Job server js2
/// tries to write js1's claimed job, to claim in js1's name, to take a job
/// for js1 and to record hosting of a version that is not the current one;
/// a node's certificate, a read-only account and an admin try to claim.
/// Every one is refused and every job is as it was; js1's own claim and
/// report work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_17_a_job_server_claims_and_reports_only_for_itself() {
    on_admin(Engine::Sqlite, |_, url, s, c| {
        let image = hosted_image(c);
        let mut ids = Vec::new();
        // js2 serves network lo, where c01 boots compute: it copies what js1 publishes.
        for (name, modules, addresses) in [("js1", ["image-update", "image-sync"], vec![]), ("js2", ["image-update", "image-sync"], vec!["127.0.0.12"])] {
            let network = if addresses.is_empty() { serde_json::Value::Null } else { "lo".into() };
            ids.push(c.post("jobservers", serde_json::json!({"name": name, "modules": modules, "addresses": addresses, "network": network}))["id"].clone());
        }
        let js1 = As::Cert(c.enrolled_jobserver("js1"));
        let js2 = As::Cert(c.enrolled_jobserver("js2"));
        c.post("systems", serde_json::json!({"hostname": "c01", "image": image["id"], "nics": [{"mac": "aa:bb:cc:00:16:01", "network": "lo"}]}));
        let node = As::Cert(c.enroll_node("c01", &c.nonce(url, "aa:bb:cc:00:16:01")));
        c.post("users", serde_json::json!({"username": "ro", "password": "read-only-password", "is_admin": false}));
        c.ok("PATCH", "/api/v1/images/compute", Some(serde_json::json!({"needs_rebuild": true})));
        let for_js1 = c.post("jobs", serde_json::json!({"module": "image-sync", "for_jobserver": ids[0]}));
        let claim_path = mprov_api::jobs::CLAIM_PATH;
        let claim = |who: &As, body: serde_json::Value| c.call("POST", claim_path, who, Some(body));
        let update = serde_json::json!({"modules": ["image-update"]});

        // js1 claims the rebuild.
        let (code, build) = claim(&js1, update.clone());
        assert_eq!(code, 200, "{build}");
        assert_eq!(build["params"]["version"], 2, "{build}");
        let build_path = format!("/api/v1/jobs/{}", build["id"]);
        let jobs = |c: &Client| c.ok("GET", "/api/v1/jobs/?sort=id", None);
        let before = jobs(c);

        // Nobody else claims: not a node, a read-only account or an admin.
        for who in [&node, &As::User("ro", "read-only-password"), &As::Admin] {
            let (code, v) = claim(who, update.clone());
            assert_eq!(code, 403, "{v}");
        }
        // js2 writes nothing of js1's job.
        for body in [
            serde_json::json!({"status": "failed"}),
            serde_json::json!({"output": "js2 was here", "return_code": 1}),
            serde_json::json!({"jobserver": ids[1]}),
        ] {
            let (code, v) = c.call("PATCH", &build_path, &js2, Some(body.clone()));
            assert_eq!(code, 403, "{body}: {v}");
        }
        // It cannot claim in js1's name, nor take the job that is js1's.
        let (code, v) = claim(&js2, serde_json::json!({"modules": ["image-sync"], "jobserver": "js1"}));
        assert!((400..500).contains(&code) && code != 401 && code != 403, "{code} {v}");
        let (code, v) = claim(&js2, serde_json::json!({"modules": ["image-sync", "image-update"]}));
        assert_eq!(code, 204, "the only pending job is js1's: {v}");
        // Nor record hosting of a version that is not the current one.
        let files = serde_json::json!([{"name": "rootfs.tar.zst", "size": 1, "sha256": crate::scopes::SHA}]);
        for (who, version) in [(&js2, 1), (&js2, 3), (&js1, 1)] {
            let (code, v) = c.call("POST", mprov_api::jobs::HOSTING_PATH, who, Some(serde_json::json!({"image": "compute", "version": version, "files": files})));
            assert_eq!(code, 409, "version {version}: {v}");
        }
        let (code, v) = c.call("POST", mprov_api::jobs::HOSTING_PATH, &node, Some(serde_json::json!({"image": "compute", "version": 2, "files": files})));
        assert_eq!(code, 403, "{v}");
        assert_eq!(jobs(c), before, "the attacks changed a job");
        let img = c.ok("GET", "/api/v1/images/compute", None);
        assert_eq!((&img["rootfs_sha256"], &img["jobservers"]), (&serde_json::json!(""), &serde_json::json!([])), "{img}");

        // What js1 may do: its own job for it, its report, its publishing.
        let (code, v) = claim(&js1, serde_json::json!({"modules": ["image-sync"]}));
        assert_eq!((code, &v["id"]), (200, &for_js1["id"]), "{v}");
        let (code, v) = c.call("PATCH", &build_path, &js1, Some(serde_json::json!({"status": "success", "output": "built", "return_code": 0})));
        assert_eq!(code, 200, "{v}");
        assert!(v["ended_at"].is_string(), "{v}");
        let (code, v) = c.call("POST", mprov_api::jobs::HOSTING_PATH, &js1, Some(serde_json::json!({"image": "compute", "version": 2, "files": files})));
        assert_eq!(code, 204, "{v}");
        let img = c.ok("GET", "/api/v1/images/compute", None);
        assert_eq!(img["jobservers"], serde_json::json!([ids[0]]), "{img}");
        let syncs = c.ok("GET", "/api/v1/jobs/?module=image-sync&status=pending", None);
        assert_eq!(syncs["total"], 1, "{syncs}");
        assert_eq!(syncs["items"][0]["for_jobserver"], ids[1], "{syncs}");
        s.stop();
    })
    .await;
}

/// `serve` sweeps silent job servers at start: js1, silent since 2020,
/// has its running job failed with the reason
/// (`JOBSERVER_FAIL_JOBS_AFTER_MINUTES`, default 10) and, with
/// `JOBSERVER_DELETE_AFTER_DAYS=1`, its row deleted and its certificate
/// revoked; js2, heard from now, keeps its job and its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_sweeps_silent_job_servers() {
    on_admin(Engine::Sqlite, |dir, url, s, c| {
        for name in ["js1", "js2"] {
            c.post(
                "jobservers",
                serde_json::json!({"name": name, "modules": ["libgenders"]}),
            );
        }
        let certs = ["js1", "js2"].map(|n| As::Cert(c.enrolled_jobserver(n)));
        let mut jobs = Vec::new();
        for (cert, n) in certs.iter().zip(1..) {
            c.post(
                "jobs",
                serde_json::json!({"module": "libgenders", "params": {"n": n}}),
            );
            let (code, v) = c.call(
                "POST",
                mprov_api::jobs::CLAIM_PATH,
                cert,
                Some(serde_json::json!({"modules": ["libgenders"]})),
            );
            assert_eq!(code, 200, "{v}");
            jobs.push(format!("/api/v1/jobs/{}", v["id"]));
        }
        s.stop();
        // The controlled clock: js1 was last heard from in 2020, js2 now.
        let db_url = url.to_owned();
        tokio::runtime::Handle::current().block_on(async move {
            let db = mprov_control::db::Db::connect(&db_url).await.unwrap();
            for (name, at) in [
                ("js1", "2020-01-01T00:00:00Z".to_owned()),
                ("js2", mprov_control::time::now()),
            ] {
                let mut sql = db.sql();
                sql.push("UPDATE jobservers SET heartbeat_at = ")
                    .bind(mprov_control::db::Val::Text(Some(at)))
                    .push(" WHERE name = ")
                    .bind(mprov_control::db::Val::Text(Some(name.into())));
                sql.query().execute(db.pool()).await.unwrap();
            }
            db.close().await;
        });
        *s = Server::start(
            dir,
            url,
            2,
            &[
                ("MPROV_SUPERUSER_PASSWORD", ADMIN_PASSWORD),
                ("JOBSERVER_DELETE_AFTER_DAYS", "1"),
            ],
        );
        let c = Client::new(s, dir);
        // The sweep runs as `serve` starts: bounded polling, no sleep guess.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let failed = loop {
            let job = c.ok("GET", &jobs[0], None);
            if job["status"] == "failed" {
                break job;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not swept: {job}
{}",
                s.log_text()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let output = failed["output"].as_str().unwrap();
        assert!(
            output.contains("job server js1 was last heard from at 2020-01-01T00:00:00Z")
                && output.contains("JOBSERVER_FAIL_JOBS_AFTER_MINUTES"),
            "{output}"
        );
        assert!(failed["ended_at"].is_string(), "{failed}");
        assert_eq!(
            c.ok("GET", &jobs[1], None)["status"],
            "running",
            "js2 was heard from"
        );
        let (code, _) = c.call("GET", "/api/v1/jobservers/js1", &As::Admin, None);
        assert_eq!(code, 404, "js1 was silent for more than a day");
        assert_eq!(c.live("js1"), 0, "its certificate was revoked");
        let (code, _) = c.call("GET", "/api/v1/systems/", &certs[0], None);
        assert!(code == 401 || code == 403, "{code}");
        assert_eq!(c.live("js2"), 1);
        c.ok("GET", "/api/v1/jobservers/js2", None);
        let log = s.stop();
        assert!(
            log.contains("deleted job server js1") && log.contains("failed job"),
            "{log}"
        );
    })
    .await;
}

/// The process ids of `pid`'s children.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        if let Ok(list) = std::fs::read_to_string(task.unwrap().path().join("children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// Attack 5: the signing helper is killed. Enrollments get 503 with a
/// clear message and Retry-After (never 500, token not spent), no helper is
/// started per request, and the supervisor brings it back: the same token
/// then enrolls. Killing the supervisor makes the service exit for systemd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_5_the_signer_comes_back() {
    on_admin(Engine::Sqlite, |_, _, s, c| {
        let token = c.token("js1", "new");
        let csr = c.csr("js1", &P256, &[]);
        let supervisor = children(s.pid());
        assert_eq!(supervisor.len(), 1, "{supervisor:?}");
        let worker = children(supervisor[0]);
        assert_eq!(worker.len(), 1, "{worker:?}");
        let killed = Command::new("kill")
            .args(["-KILL", &worker[0].to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut unavailable = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let out = c
                .command(
                    "POST",
                    "/enroll/jobserver/",
                    &As::Nobody,
                    Some(&serde_json::json!({"token": token, "name": "js1", "csr": csr})),
                    "sig",
                )
                .output()
                .unwrap();
            let (code, v, _) = Client::parse(&out);
            match code {
                503 => {
                    unavailable += 1;
                    assert!(
                        v["message"].as_str().unwrap().contains("signing helper"),
                        "{v}"
                    );
                    let headers = std::fs::read_to_string(c.work.join("sig.headers")).unwrap();
                    assert!(
                        headers.to_ascii_lowercase().contains("retry-after: 5"),
                        "{headers}"
                    );
                }
                200 => break,
                other => panic!("{other} {v}"),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the signer did not come back"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(unavailable >= 1, "the kill was not seen");
        assert_eq!(children(s.pid()), supervisor, "the same supervisor");
        assert_ne!(children(supervisor[0]), worker, "a new helper");
        // Several 503s, one restart: no helper is started per request.
        let log = s.log_text();
        assert_eq!(
            log.matches("the signing helper is back").count(),
            1,
            "{log}"
        );

        // The supervisor itself killed, then its helper: nobody can start
        // the helper again, so the service exits (for systemd to start it
        // again) with the reason.
        let worker = children(supervisor[0]);
        assert_eq!(worker.len(), 1, "{worker:?}");
        for pid in [supervisor[0], worker[0]] {
            let killed = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()
                .unwrap();
            assert!(killed.success());
        }
        let (status, log) = s.wait_exit();
        assert!(!status, "{log}");
        assert!(log.contains("supervisor is gone"), "{log}");
    })
    .await;
}

/// Attack 10: refusals name the problem; an explicit CA:FALSE is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_10_csr_refusals_name_the_problem() {
    on_admin(Engine::Sqlite, |_, _, s, c| {
        let token = c.token("js1", "new");
        for (name, newkey, extra, want) in [
            (
                "rsa1024",
                vec!["-newkey", "rsa:1024"],
                vec![],
                "too weak: an RSA key of 1024 bits",
            ),
            (
                "k1",
                vec!["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:secp256k1"],
                vec![],
                "not accepted: ECDSA on secp256k1",
            ),
            (
                "ed448",
                vec!["-newkey", "ed448"],
                vec![],
                "not accepted: Ed448",
            ),
            (
                "ca",
                P256.to_vec(),
                vec!["basicConstraints=critical,CA:TRUE"],
                "asks for CA rights",
            ),
        ] {
            let csr = c.csr(name, &newkey, &extra);
            let (code, v) = c.enroll_js(&token, "js1", &csr);
            assert!(
                code == 400 && v["message"].as_str().unwrap().contains(want),
                "{name}: {code} {v}"
            );
        }
        let csr = c.csr("nofalse", &P256, &["basicConstraints=critical,CA:FALSE"]);
        let (code, v) = c.enroll_js(&token, "js1", &csr);
        assert_eq!(code, 200, "an explicit CA:FALSE is fine: {v}");
        s.stop();
    })
    .await;
}

/// Attack 7: a flood of wrong passwords. Past the limit, 429 with
/// Retry-After; argon2 runs one at a time, so the API still answers an API
/// key at once while the flood runs; the right password is refused from the
/// flooding address until the window ends, but a stranger locks nobody
/// out: the owner's right password from another address is accepted, even
/// after wrong passwords for the name from many addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_7_password_checks_are_throttled() {
    on_admin(Engine::Sqlite, |dir, _, s, c| {
        let key = std::fs::read_to_string(dir.join("etc/apikey")).unwrap();
        let key = key
            .trim()
            .strip_prefix("export MPROV_APIKEY=")
            .unwrap()
            .to_owned();
        // 32 parallel wrong passwords for admin, as the attack did.
        let flood: Vec<_> = (0..32)
            .map(|i| {
                Command::new("curl")
                    .args(STATUS_ONLY)
                    .arg("--cacert")
                    .arg(&c.ca)
                    .args(["-u", &format!("admin:wrong-{i}")])
                    .args(["-H", &mprov_api::version_header_line()])
                    .arg(format!("https://127.0.0.1:{}/api/v1/systems/", c.https))
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        // While the flood runs, an API key is answered.
        let out = Command::new("curl")
            .args(STATUS_ONLY)
            .args(["--max-time", "5", "--cacert"])
            .arg(&c.ca)
            .args(["-H", &format!("Authorization: Api-Key {key}")])
            .args(["-H", &mprov_api::version_header_line()])
            .arg(format!("https://127.0.0.1:{}/api/v1/systems/", c.https))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "200",
            "the API starved"
        );
        let codes: Vec<String> = flood
            .into_iter()
            .map(|ch| String::from_utf8_lossy(&ch.wait_with_output().unwrap().stdout).into_owned())
            .collect();
        let wrong = codes.iter().filter(|c| *c == "401").count();
        let limited = codes.iter().filter(|c| *c == "429").count();
        assert_eq!(wrong + limited, 32, "{codes:?}");
        assert!(wrong <= 10 && limited >= 22, "{codes:?}");
        // The right password now gets 429 too (the name is limited), with
        // Retry-After; nothing was let through.
        let (code, v) = c.call("GET", "/api/v1/systems/", &As::Admin, None);
        assert_eq!(code, 429, "{v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("too many wrong passwords"),
            "{v}"
        );
        let headers = std::fs::read_to_string(c.work.join("one.headers")).unwrap();
        assert!(
            headers.to_ascii_lowercase().contains("retry-after:"),
            "{headers}"
        );
        // The flood locked out nobody else: the owner's right password,
        // from another address, is accepted at once.
        let mut owner = c.command("GET", "/api/v1/systems/", &As::Admin, None, "owner");
        owner.args(["--interface", "127.0.0.2"]);
        let (code, v) = Client::call_with(owner);
        assert_eq!(code, 200, "the flood locked the admin out: {v}");
        // Nor do 12 wrong passwords for admin from many addresses, one each.
        for i in 3..15 {
            let mut cmd = c.command("GET", "/api/v1/systems/", &As::Nobody, None, "spread");
            cmd.args(["-u", &format!("admin:wrong-{i}")])
                .args(["--interface", &format!("127.0.1.{i}")]);
            let (code, _) = Client::call_with(cmd);
            assert_eq!(code, 401);
        }
        let mut owner = c.command("GET", "/api/v1/systems/", &As::Admin, None, "owner");
        owner.args(["--interface", "127.0.0.2"]);
        let (code, v) = Client::call_with(owner);
        assert_eq!(
            code, 200,
            "wrong passwords from many addresses locked the admin out: {v}"
        );
        s.stop();
    })
    .await;
}

/// Runs the `sqlite3` shell on `db` with `sql`: its output.
fn sqlite3(db: &Path, sql: &str) -> String {
    let out = Command::new("sqlite3")
        .arg(db)
        .arg(sql)
        .output()
        .expect("sqlite3 must be installed");
    assert!(out.status.success(), "sqlite3 {sql}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The seam between the service and another process on one SQLite file
/// (the cause of the SQLite races' 500s and of attack 3's lost nonce): the
/// service once opened and closed the database file itself while its pool
/// was open, which drops every POSIX lock the process holds on it. The next
/// other process to close a connection then believed it was the last,
/// checkpointed and deleted the WAL the service was still writing to: the
/// service's writes went into a deleted file and later reads failed with
/// SQLITE_IOERR_SHORT_READ. Here the real `sqlite3` shell reads and closes
/// between the service's writes; every write is seen by both and the file
/// stays sound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_shared_with_another_process_stays_sound() {
    on_admin(Engine::Sqlite, |_, url, s, c| {
        let db = mprov_control::db::sqlite_path(url).unwrap();
        for n in 1..=3 {
            let host = format!("shared{n}");
            c.post("systems", serde_json::json!({"hostname": host}));
            // The shell sees what the service wrote, then closes its
            // connection: the service still holds the database, so the WAL
            // must stay.
            let seen = sqlite3(&db, "SELECT hostname FROM systems ORDER BY hostname");
            assert!(seen.lines().any(|l| l == host), "{seen}");
            let mut wal = db.clone().into_os_string();
            wal.push("-wal");
            assert!(
                Path::new(&wal).exists(),
                "another process closing its connection deleted the WAL of the running service"
            );
            // And the service sees every row, in a fresh read.
            let listed = c.ok("GET", "/api/v1/systems/", None).to_string();
            for k in 1..=n {
                assert!(listed.contains(&format!("shared{k}")), "{listed}");
            }
        }
        assert_eq!(sqlite3(&db, "PRAGMA integrity_check").trim(), "ok");
        let log = s.log_text();
        assert!(!log.contains("disk I/O error"), "{log}");
        s.stop();
    })
    .await;
}

/// The races on one engine, against the real service: one nonce ×20, one
/// token ×20 and one identity ×20 (20 replace tokens for js1) concurrent
/// enrollments; exactly one valid certificate each time.
pub(crate) async fn races(engine: Engine) {
    on_admin(engine, |_, url, s, c| {
        let image = hosted_image(c);
        c.post("systems", serde_json::json!({"hostname": "c01", "image": image["id"], "nics": [{"mac": "aa:bb:cc:00:02:01", "network": "lo"}]}));
        let csr = c.csr("racer", &P256, &[]);
        // Each request's status; a failure shows every answer and the log.
        let answers = std::cell::RefCell::new(String::new());
        let race = |bodies: Vec<(&str, serde_json::Value)>| -> Vec<u16> {
            let children: Vec<_> = bodies
                .iter()
                .enumerate()
                .map(|(i, (path, b))| {
                    c.command("POST", path, &As::Nobody, Some(b), &format!("race{i}"))
                        .stdout(std::process::Stdio::piped())
                        .spawn()
                        .unwrap()
                })
                .collect();
            let mut seen = answers.borrow_mut();
            seen.clear();
            children
                .into_iter()
                .map(|ch| {
                    let (code, v, _) = Client::parse(&ch.wait_with_output().unwrap());
                    seen.push_str(&format!("{code} {}\n", v["message"]));
                    code
                })
                .collect()
        };
        let why = |codes: &[u16]| format!("{codes:?}\n{}\n{}", answers.borrow(), s.log_text());
        // One nonce ×20.
        let nonce = c.nonce(url, "aa:bb:cc:00:02:01");
        let codes = race(
            (0..20)
                .map(|_| {
                    (
                        "/enroll/node/",
                        serde_json::json!({"nonce": nonce, "csr": csr}),
                    )
                })
                .collect(),
        );
        assert_eq!(codes.iter().filter(|c| **c == 200).count(), 1, "{}", why(&codes));
        // The losers are told the nonce is spent, never a 500.
        assert!(codes.iter().all(|c| matches!(c, 200 | 401)), "{}", why(&codes));
        assert!(
            answers
                .borrow()
                .lines()
                .filter(|l| l.starts_with("401"))
                .all(|l| l.contains("nonce was already used")
                    || l.contains("nonce was used by another request")),
            "{}",
            why(&codes)
        );
        assert_eq!(c.live("c01"), 1);
        // One token ×20.
        let token = c.token("js1", "new");
        let codes = race(
            (0..20)
                .map(|_| {
                    (
                        "/enroll/jobserver/",
                        serde_json::json!({"token": token, "name": "js1", "csr": csr}),
                    )
                })
                .collect(),
        );
        assert_eq!(codes.iter().filter(|c| **c == 200).count(), 1, "{}", why(&codes));
        assert!(codes.iter().all(|c| matches!(c, 200 | 401 | 409)), "{}", why(&codes));
        assert_eq!(c.live("js1"), 1);
        // One identity ×20: each with its own replace token.
        let tokens: Vec<String> = (0..20).map(|_| c.token("js1", "replace")).collect();
        let codes = race(
            tokens
                .iter()
                .map(|t| {
                    (
                        "/enroll/jobserver/",
                        serde_json::json!({"token": t, "name": "js1", "csr": csr}),
                    )
                })
                .collect(),
        );
        assert!(codes.iter().all(|c| *c == 200 || *c == 409), "{}", why(&codes));
        assert!(codes.contains(&200), "{}", why(&codes));
        assert_eq!(
            c.live("js1"),
            1,
            "exactly one valid certificate for js1: {codes:?}"
        );
        s.stop();
    })
    .await;
}

/// Issue 21: a hard link defeats no hand-over. A root-owned file
/// hard-linked as the database's `-wal`, or as the database itself, in the
/// service user's folder (where `fs.protected_hardlinks=0` lets that user
/// make one; root plants it here) stops the start with what to do, before
/// the database is opened; another user's file does too. Each keeps its
/// owner, mode and bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_hard_links_are_never_handed_over() {
    on_sqlite(|dir, _| {
        let url = started_once(dir);
        let folder = dir.join("var/db");
        let db = folder.join("mprov.sqlite3");
        let secret = dir.join("root-only");
        let bytes = b"root's secret, not a database\n".repeat(200);
        std::fs::write(&secret, &bytes).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let untouched = |p: &Path, owner: u32| {
            assert_eq!(owner_mode(p), (owner, 0o600), "{}", p.display());
            assert_eq!(std::fs::read(p).unwrap(), bytes, "{}", p.display());
        };

        // As the -wal (after a clean stop there is none).
        let wal = folder.join("mprov.sqlite3-wal");
        let _ = std::fs::remove_file(&wal);
        std::fs::hard_link(&secret, &wal).unwrap();
        let (ok, log) = serve_to_exit(dir, &url, &[]);
        assert!(
            !ok && log.contains("mprov.sqlite3-wal: it has 2 hard links")
                && log.contains("move it aside"),
            "{log}"
        );
        untouched(&secret, 0);
        std::fs::remove_file(&wal).unwrap();

        // As the database itself.
        let aside = folder.join("real");
        std::fs::rename(&db, &aside).unwrap();
        std::fs::hard_link(&secret, &db).unwrap();
        let (ok, log) = serve_to_exit(dir, &url, &[]);
        assert!(
            !ok && log.contains("mprov.sqlite3: it has 2 hard links"),
            "{log}"
        );
        untouched(&secret, 0);
        std::fs::remove_file(&db).unwrap();
        std::fs::rename(&aside, &db).unwrap();

        // Another user's file, one link, as the -shm.
        let shm = folder.join("mprov.sqlite3-shm");
        let _ = std::fs::remove_file(&shm);
        std::fs::write(&shm, &bytes).unwrap();
        std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::lchown(&shm, Some(65534), Some(65534)).unwrap();
        let (ok, log) = serve_to_exit(dir, &url, &[]);
        assert!(
            !ok && log.contains("mprov.sqlite3-shm: it belongs to uid 65534"),
            "{log}"
        );
        untouched(&shm, 65534);
        std::fs::remove_file(&shm).unwrap();

        // Put right, the service starts on its database.
        let mut s = Server::start(dir, &url, 2, &[]);
        s.stop();
        untouched(&secret, 0);
    })
    .await;
}

/// Issue 21: oversized CSRs do not stall enrollment. With its certificate,
/// node c01 sends three CSRs larger than the signing helper reads to
/// `/enroll/renew/` at once with node c02's enrollment. Each gets a 400
/// that names the limit without reaching the helper (before, each held the
/// helper's one-at-a-time lock for its whole timeout and came back 503);
/// c02 is enrolled, and c01's certificate is neither renewed nor revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_oversized_csrs_do_not_stall_enrollment() {
    on_admin(Engine::Sqlite, |_, url, s, c| {
        let image = hosted_image(c);
        let (mac1, mac2) = ("aa:bb:cc:00:21:01", "aa:bb:cc:00:21:02");
        for (host, mac) in [("c01", mac1), ("c02", mac2)] {
            c.post(
                "systems",
                serde_json::json!({"hostname": host, "image": image["id"], "nics": [{"mac": mac, "network": "lo"}]}),
            );
        }
        let node = As::Cert(c.enroll_node("c01", &c.nonce(url, mac1)));
        let nonce = c.nonce(url, mac2);
        let csr = c.csr("c02", &P256, &[]);
        let huge = format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            "QUFB".repeat(20 * 1024)
        );
        let spawn = |path: &str, who: &As, body: serde_json::Value, tag: &str| {
            c.command("POST", path, who, Some(&body), tag)
                .args(["--max-time", "60"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let floods: Vec<_> = (0..3)
            .map(|i| {
                spawn(
                    "/enroll/renew/",
                    &node,
                    serde_json::json!({"csr": huge}),
                    &format!("huge{i}"),
                )
            })
            .collect();
        let enrolling = spawn(
            "/enroll/node/",
            &As::Nobody,
            serde_json::json!({"nonce": nonce, "csr": csr}),
            "c02",
        );
        let (code, v, _) = Client::parse(&enrolling.wait_with_output().unwrap());
        assert_eq!(code, 200, "c02's enrollment: {v}");
        for flood in floods {
            let (code, v, _) = Client::parse(&flood.wait_with_output().unwrap());
            assert!(
                code == 400
                    && v["field"] == "csr"
                    && v["message"]
                        .as_str()
                        .unwrap_or_default()
                        .contains("at most 16384 bytes"),
                "{code} {v}"
            );
        }
        assert_eq!(c.live("c01"), 1);
        assert_eq!(c.call("GET", "/api/v1/systems/c01", &node, None).0, 200);
        let log = s.log_text();
        assert!(!log.contains("did not answer"), "{log}");
        assert!(
            log.contains("a CSR over the size limit is refused"),
            "{log}"
        );
        s.stop();
    })
    .await;
}

/// Backdates every lease report past the attestation window: what an
/// earlier, legitimate boot left no longer attests anything.
fn age_lease_reports(db_url: &str) {
    let db_url = db_url.to_owned();
    tokio::runtime::Handle::current().block_on(async move {
        let db = mprov_control::db::Db::connect(&db_url).await.unwrap();
        sqlx::query("UPDATE boot_events SET at = '2000-01-01T00:00:00Z'")
            .execute(db.pool())
            .await
            .unwrap();
    });
}

/// Enrolls job server `name` (its row made first); its certificate.
fn enrolled_js(c: &Client, name: &str, address: &str, network: &str) -> As {
    c.post(
        "jobservers",
        serde_json::json!({"name": name, "addresses": [address], "network": network}),
    );
    As::Cert(c.enrolled_jobserver(name))
}

/// The /ipxe/ script for `mac` from loopback, and its nonce if it has one.
fn ipxe_script(c: &Client, mac: &str) -> (String, Option<String>) {
    let (code, v) = c.call("GET", &format!("/ipxe/?mac={mac}"), &As::Nobody, None);
    assert_eq!(code, 200, "{v}");
    let script = v.as_str().unwrap_or_default().to_owned();
    let nonce = script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("mprov_enroll="))
        .map(str::to_owned);
    (script, nonce)
}

/// Attack 14: a job server's certificate took over any node. It reported a
/// node's MAC leased to an address it controls (outside its own network),
/// fetched the node's nonce from there and enrolled as the node, revoking
/// the real node's certificate; and a job server of any network vouched
/// for a node of another. A lease report now counts only inside the
/// reporting job server's network, and only for a node of that network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_14_a_job_server_vouches_only_for_its_own_network() {
    on_admin(Engine::Sqlite, |_, url, s, c| {
        let image = hosted_image(c);
        let node = |host: &str, mac: &str, nic: serde_json::Value| {
            let mut nic = nic;
            nic["mac"] = mac.into();
            c.post(
                "systems",
                serde_json::json!({"hostname": host, "image": image["id"], "nics": [nic]}),
            )
        };
        let (m1, m2, m3) = (
            "aa:bb:cc:00:13:01",
            "aa:bb:cc:00:13:02",
            "aa:bb:cc:00:13:03",
        );
        node("c01", m1, serde_json::json!({"network": "lo"}));
        let c01 = As::Cert(c.enroll_node("c01", &c.nonce(url, m1)));
        node("c02", m2, serde_json::json!({"network": "lo"}));
        let c03 = node("c03", m3, serde_json::json!({}));
        age_lease_reports(url);
        // A job server of network `side` (127.0.0.0/16), not `lo`.
        c.post(
            "networks",
            serde_json::json!({"slug": "side", "subnet": "127.0.0.0", "netmask": 16}),
        );
        let jsb = enrolled_js(c, "jsb", "127.0.0.2", "side");
        let timeline = |host: &str| {
            c.ok(
                "GET",
                &format!("/api/v1/boot/events?system={host}&boot=all"),
                None,
            )
        };
        let report = |mac: &str, ip: &str, phase: &str| {
            c.call(
                "POST",
                mprov_api::boot::EVENTS_PATH,
                &jsb,
                Some(serde_json::json!({"phase": phase, "mac": mac, "ip": ip})),
            )
        };

        // 1. c01's MAC leased to an address outside jsb's network: refused,
        // nothing written, no nonce for c01, its certificate kept.
        let before = timeline("c01");
        for (ip, phase) in [
            ("10.0.0.66", "dhcp_acked"),
            ("192.168.7.7", "proxy_answered"),
        ] {
            let (code, v) = report(m1, ip, phase);
            assert_eq!(code, 400, "{phase} {ip}: {v}");
            assert!(
                v.to_string().contains("outside job server jsb's network"),
                "{v}"
            );
        }
        assert_eq!(timeline("c01"), before, "a refused lease report wrote");
        let (script, nonce) = ipxe_script(c, m1);
        assert!(nonce.is_none(), "c01 got a nonce: {script}");
        assert_eq!(c.live("c01"), 1);
        let (code, v) = c.call("GET", "/api/v1/systems/c01", &c01, None);
        assert_eq!(code, 200, "c01 lost its certificate: {v}");

        // 2. A job server of network `side` vouching for c02 of network
        // `lo`, with an address inside its own network: stored (it is a
        // lease), but it attests nothing for a node of another network.
        let (code, v) = report(m2, "127.0.0.1", "dhcp_acked");
        assert_eq!(code, 201, "{v}");
        let (script, nonce) = ipxe_script(c, m2);
        assert!(nonce.is_none(), "jsb vouched for c02: {script}");
        assert_eq!(c.live("c02"), 0);

        // 3. c03's NIC names no network and no address: no job server can
        // vouch for it; the retry script says what to set.
        let (code, v) = report(m3, "127.0.0.1", "dhcp_acked");
        assert_eq!(code, 201, "{v}");
        let (script, nonce) = ipxe_script(c, m3);
        assert!(nonce.is_none(), "{script}");
        assert!(script.contains("set the NIC's network"), "{script}");
        // Its reserved address outside jsb's network: still no nonce;
        // inside it: jsb vouches for it.
        let nic = c03["nics"][0]["id"].as_i64().unwrap();
        c.ok(
            "PATCH",
            &format!("/api/v1/nics/{nic}"),
            Some(serde_json::json!({"ipv4": "127.1.0.5"})),
        );
        let (script, nonce) = ipxe_script(c, m3);
        assert!(nonce.is_none(), "{script}");
        c.ok(
            "PATCH",
            &format!("/api/v1/nics/{nic}"),
            Some(serde_json::json!({"ipv4": "127.0.0.5"})),
        );
        let (script, nonce) = ipxe_script(c, m3);
        assert!(nonce.is_some(), "c03 by its reserved address: {script}");

        // A job server whose row names no network reports no lease at all.
        let jsn = {
            c.post(
                "jobservers",
                serde_json::json!({"name": "jsn", "addresses": ["127.0.0.3"]}),
            );
            let (code, v) = c.enroll_js(&c.token("jsn", "new"), "jsn", &c.csr("jsn", &P256, &[]));
            assert_eq!(code, 200, "{v}");
            let crt = c.work.join("jsn");
            std::fs::write(
                crt.with_extension("crt"),
                v["certificate"].as_str().unwrap(),
            )
            .unwrap();
            As::Cert(crt)
        };
        let before = timeline("c02");
        let (code, v) = c.call(
            "POST",
            mprov_api::boot::EVENTS_PATH,
            &jsn,
            Some(serde_json::json!({"phase": "dhcp_acked", "mac": m2, "ip": "127.0.0.1"})),
        );
        assert_eq!(code, 403, "{v}");
        assert_eq!(timeline("c02"), before);
        s.stop();
    })
    .await;
}

/// One plain-HTTP `GET /ipxe/?mac=<mac>` to `port`: the status line and body.
async fn raw_ipxe(port: u16, mac: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(
        format!("GET /ipxe/?mac={mac} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// Attack 15: an `/ipxe/` flood of unattested requests held a task each
/// polling the database, and delayed a real node's boot script. Waiting
/// requests now poll nothing: 2,000 unattested requests wait out their
/// time while an attested node's script is answered at once, before any
/// of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_15_an_ipxe_flood_does_not_delay_a_real_boot() {
    on_admin(Engine::Sqlite, |_, url, s, c| {
        const FLOOD: usize = 2000;
        hosted_image(c);
        let mac = "aa:bb:cc:00:14:01";
        c.post(
            "systems",
            serde_json::json!({"hostname": "c01", "image": "compute", "nics": [{"mac": mac, "network": "lo"}]}),
        );
        let port = s.port;
        let url = url.to_owned();
        tokio::runtime::Handle::current().block_on(async move {
            let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut flood = tokio::task::JoinSet::new();
            for i in 0..FLOOD {
                let done = done.clone();
                flood.spawn(async move {
                    let out = raw_ipxe(port, &format!("02:ff:00:00:{:02x}:{:02x}", i >> 8, i & 0xff)).await;
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    out
                });
            }
            // Let the flood reach the service and start waiting.
            tokio::time::sleep(std::time::Duration::from_millis(3000)).await;
            let db = mprov_control::db::Db::connect(&url).await.unwrap();
            crate::scopes::attest_on(&db, "jsx", mac, [127, 0, 0, 1].into()).await;
            let script = raw_ipxe(port, mac).await;
            let finished = done.load(std::sync::atomic::Ordering::SeqCst);
            assert!(script.contains("mprov_enroll="), "{script}");
            assert_eq!(finished, 0, "the real node waited behind {finished} flood requests");
            // The flood itself ends, bounded: every request gets the retry
            // script (or the 429 of the rate limit), none an error.
            let all = tokio::time::timeout(std::time::Duration::from_secs(60), async {
                let mut outs = Vec::new();
                while let Some(out) = flood.join_next().await {
                    outs.push(out.unwrap());
                }
                outs
            })
            .await
            .expect("the flood did not end in 60 s");
            assert_eq!(all.len(), FLOOD);
            for out in &all {
                assert!(
                    (out.starts_with("HTTP/1.1 200") || out.starts_with("HTTP/1.1 429"))
                        && !out.contains("mprov_enroll="),
                    "{out}"
                );
            }
        });
        s.stop();
    })
    .await;
}

/// Attack 18: enrolling a job server without a token, on an API key (the
/// seed's `apikey`). An admin's key enrolls a name that holds no valid
/// certificate, from a CSR, once; a read-only account, the shared key in
/// `nodes` mode, a revoked key and no key at all are refused, each saying
/// what is needed; a live name is not taken over; and an API key never
/// stands in for the certificate it got (a claim with it is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_18_an_api_key_enrolls_a_job_server_only_as_an_admin() {
    on_engine(Engine::Sqlite, |dir, url| {
        let mut s = Server::start(
            dir,
            url,
            1,
            &[
                ("MPROV_SUPERUSER_PASSWORD", ADMIN_PASSWORD),
                ("MPROV_SHARED_KEY_MODE", "nodes"),
            ],
        );
        use serde_json::json;
        let c = Client::new(&s, dir);
        c.post("users", json!({"username": "ro", "password": "read-only-password", "is_admin": false}));
        let admin_key = c.post("apikeys", json!({"name": "seed"}))["key"].as_str().unwrap().to_owned();
        let revoked = c.post("apikeys", json!({"name": "old"}));
        c.ok("PATCH", &format!("/api/v1/apikeys/{}", revoked["id"]), Some(json!({"revoked": true})));
        let revoked = revoked["key"].as_str().unwrap().to_owned();
        let shared = std::fs::read_to_string(dir.join("etc/apikey")).unwrap();
        let shared = shared.trim().trim_start_matches("export MPROV_APIKEY=").to_owned();
        // Each try makes its own key, kept at work/<name>.key for the one
        // that succeeds, at work/try-<name>.key for the others.
        let enroll_keeping = |who: &As, name: &str, keep: bool| {
            let file = if keep { name.to_owned() } else { format!("try-{name}") };
            let body = json!({"name": name, "csr": c.csr(&file, &P256, &[])});
            c.call("POST", "/enroll/jobserver/", who, Some(body))
        };
        let enroll = |who: &As, name: &str| enroll_keeping(who, name, false);

        for (who, code, needs) in [
            (As::Nobody, 401, "admin's API key"),
            (As::Key(revoked), 401, "revoked"),
            (As::User("ro", "read-only-password"), 403, "admin's API key"),
            (As::Key(shared), 403, "admin's API key"),
        ] {
            let (got, v) = enroll(&who, "js1");
            assert_eq!(got, code, "{v}");
            assert!(v["message"].as_str().unwrap().contains(needs), "{v}");
        }
        // An empty token is no token.
        let (got, v) = c.call("POST", "/enroll/jobserver/", &As::Nobody, Some(json!({"token": "", "name": "js1", "csr": c.csr("js1", &P256, &[])})));
        assert_eq!(got, 401, "{v}");
        assert_eq!(c.live("js1"), 0, "the refusals issued a certificate");

        // The admin's key: a certificate for js1's own key.
        let key = As::Key(admin_key);
        let (got, v) = enroll_keeping(&key, "js1", true);
        assert_eq!(got, 200, "{v}");
        let base = c.work.join("js1");
        std::fs::write(base.with_extension("crt"), v["certificate"].as_str().unwrap()).unwrap();
        assert_eq!(c.live("js1"), 1);
        // A bad name, and a live name, are refused; js1 keeps its certificate.
        let (got, v) = enroll(&key, "-bad");
        assert_eq!(got, 400, "{v}");
        let (got, v) = enroll(&key, "js1");
        assert_eq!(got, 409, "{v}");
        assert!(v["message"].as_str().unwrap().contains("--replace"), "{v}");
        assert_eq!(c.live("js1"), 1);

        // The key never stands in for the certificate: it registers and
        // claims nothing; the certificate does both.
        c.post("jobs", json!({"module": "image-update"}));
        let registration = json!({"host_id": "host-js1", "modules": ["image-update"], "port": 8081, "addresses": []});
        let (got, v) = c.call("POST", mprov_api::jobs::REGISTER_PATH, &key, Some(registration.clone()));
        assert_eq!(got, 403, "{v}");
        let (got, v) = c.call("POST", mprov_api::jobs::CLAIM_PATH, &key, Some(json!({"modules": ["image-update"]})));
        assert_eq!(got, 403, "{v}");
        let js1 = As::Cert(base);
        let (got, v) = c.call("POST", mprov_api::jobs::REGISTER_PATH, &js1, Some(registration));
        assert_eq!(got, 200, "{v}");
        let (got, v) = c.call("POST", mprov_api::jobs::CLAIM_PATH, &js1, Some(json!({"modules": ["image-update"]})));
        assert_eq!((got, v["module"].as_str()), (200, Some("image-update")), "{v}");
        s.stop();
    })
    .await;
}
