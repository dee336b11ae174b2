//! A control service whose database goes away: MariaDB and PostgreSQL, each
//! a dedicated server this test starts (never the shared ones), are stopped
//! and started again under a running `mprov-control serve` with a
//! `mprov-jobserver` following it. MariaDB is also frozen (SIGSTOP), which is
//! what a network cut looks like to the service: connections stay open and
//! nothing answers.
//!
//! What must hold, checked with clients nobody here wrote (curl, dig):
//! * every request during the outage gets a 503 with the documented body
//!   and a `Retry-After` (never a 500, never a hang: curl gives up after
//!   `CURL_MAX_SECS`);
//! * the job server keeps answering DNS from its last snapshot throughout;
//! * the service serves again by itself (same process) once the database is
//!   back, no acknowledged write is lost, a new write reaches the job server;
//! * the outage is logged once, and its end once.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mprov_tests::db::{DbServer, Flavor, MariaDb, Postgres};
use mprov_tests::lab::{FollowerFiles, follower_command};
use serde_json::{Value, json};

/// curl's bound on one request: well past the service's 5 s pool wait and
/// its 10 s watchdog plus a 3 s probe; reaching it is a hang.
const CURL_MAX_SECS: &str = "40";
/// How long anything we wait for may take.
const WAIT: Duration = Duration::from_secs(90);

/// A child we started, stopped (SIGTERM, then SIGKILL) by its PID on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).unwrap_or(0));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        for _ in 0..100 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `f` until it gives `Some`, for at most [`WAIT`].
fn wait_for<T>(what: &str, mut f: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The control service and the job server following it.
struct Install {
    home: tempfile::TempDir,
    control: Proc,
    _jobserver: Proc,
    http: String,
    key: String,
    dns_port: u16,
}

impl Install {
    fn start(database_url: &str) -> Result<Install> {
        let bin = mprov_tests::xtask::target_dir().join("debug");
        for b in ["mprov-control", "mprov-jobserver"] {
            ensure!(
                bin.join(b).is_file(),
                "{} is missing: `cargo test --workspace` builds it",
                bin.join(b).display()
            );
        }
        let home = tempfile::tempdir()?;
        let h = home.path();
        let listen_file = h.join("listen");
        let control = Command::new(bin.join("mprov-control"))
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("MPROV_CONFIG_DIR", h.join("etc"))
            .env("MPROV_STATE_DIR", h.join("var"))
            .env("MPROV_LISTEN", "127.0.0.1:0")
            .env("MPROV_LISTEN_FILE", &listen_file)
            .env("MPROV_HTTPS_LISTEN", "off")
            .env("MPROV_DATABASE_URL", database_url)
            .env("MPROV_SERVICE_USER", "root")
            .env("MPROV_SIGNER_USER", "root")
            .env("MPROV_SUPERUSER_PASSWORD", "outage-test")
            .env("MPROV_LOG", "info,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(h.join("control.log"))?)
            .spawn()
            .context("starting mprov-control")?;
        let control = Proc(control);
        let addr = wait_for("the control service's address", || {
            Ok(std::fs::read_to_string(&listen_file)
                .ok()
                .map(|a| a.trim().to_owned())
                .filter(|a| !a.is_empty()))
        })?;
        let http = format!("http://{addr}");
        let apikey_file = h.join("etc/apikey");
        let key = std::fs::read_to_string(&apikey_file)?
            .trim()
            .trim_start_matches("export MPROV_APIKEY=")
            .to_owned();
        let files = FollowerFiles {
            ca: &h.join("no-ca.crt"),
            apikey: &apikey_file,
            enroll_token: &h.join("no-token"),
            state: &h.join("js"),
        };
        let exe = bin.join("mprov-jobserver");
        let js_listen = h.join("jobserver-listen.json");
        let mut jobserver = follower_command(&exe, &http, files, &h.join("jobserver.log"))?
            .args(["--no-dhcp", "--no-tftp", "--no-http", "--no-ra"])
            .args(["--dns", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
            .arg("--listen-file")
            .arg(&js_listen)
            .spawn()
            .context("starting mprov-jobserver")?;
        let dns_port = mprov_tests::listen::wait(&js_listen, &mut jobserver, WAIT)
            .with_context(|| std::fs::read_to_string(h.join("jobserver.log")).unwrap_or_default())?
            .get("dns")?
            .port();
        Ok(Install {
            home,
            control,
            _jobserver: Proc(jobserver),
            http,
            key,
            dns_port,
        })
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.home.path().join(name)).unwrap_or_default()
    }

    /// One request with curl: status, headers, JSON body.
    fn curl(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, String, Value)> {
        let headers = self.home.path().join("headers");
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", CURL_MAX_SECS, "-X", method])
            .arg("-D")
            .arg(&headers)
            .args(["-o", "-", "-w", "\n%{http_code}"])
            .args(["-H", &format!("Authorization: Api-Key {}", self.key)])
            .args(["-H", &mprov_api::version_header_line()]);
        if let Some(b) = body {
            cmd.args([
                "-H",
                "Content-Type: application/json",
                "--data",
                &b.to_string(),
            ]);
        }
        let out = cmd
            .arg(format!("{}{path}", self.http))
            .output()
            .context("running curl")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "curl {method} {path} failed ({}), a hang or a dropped connection: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let (body, code) = text.rsplit_once('\n').context("curl output")?;
        let status: u16 = code.trim().parse().context("curl status")?;
        let body = if body.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(body).with_context(|| format!("not JSON: {body}"))?
        };
        Ok((
            status,
            std::fs::read_to_string(&headers).unwrap_or_default(),
            body,
        ))
    }

    fn ok(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let (status, _, v) = self.curl(method, path, body)?;
        ensure!(
            (200..300).contains(&status),
            "{method} {path}: {status} {v}"
        );
        Ok(v)
    }

    /// `name.cluster` through the job server's DNS, with dig.
    fn resolve(&self, name: &str) -> Result<String> {
        let out = Command::new("dig")
            .args(["@127.0.0.1", "-p", &self.dns_port.to_string()])
            .args(["+short", "+time=2", "+tries=1"])
            .arg(format!("{name}.cluster"))
            .arg("A")
            .output()
            .context("running dig")?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    fn add_system(&self, name: &str, n: u8) -> Result<()> {
        self.ok(
            "POST",
            "/api/v1/systems/",
            Some(&json!({"hostname": name, "nics": [{"name": "eth0",
                "mac": format!("52:54:00:00:10:{n:02x}"), "ipv4": format!("10.0.0.{n}"), "network": "prov"}]})),
        )?;
        Ok(())
    }

    fn wait_resolves(&self, name: &str, ip: &str) -> Result<()> {
        wait_for(&format!("the job server to resolve {name}"), || {
            Ok((self.resolve(name)? == ip).then_some(()))
        })
    }

    /// Every request during an outage: 503, the documented body, Retry-After;
    /// the job server still answers from its snapshot.
    fn check_outage(&self, known: &[(&str, &str)]) -> Result<()> {
        let attempts: [(&str, &str, Option<Value>); 4] = [
            ("GET", "/api/v1/systems/", None),
            ("GET", "/api/v1/revision", None),
            (
                "POST",
                "/api/v1/systems/",
                Some(json!({"hostname": "during"})),
            ),
            ("GET", "/api/v1/bootconfig?after=0", None),
        ];
        for (method, path, body) in &attempts {
            let (status, headers, v) = self.curl(method, path, body.as_ref())?;
            ensure!(
                status == 503,
                "{method} {path} during the outage: {status} {v}"
            );
            ensure!(v["error"] == "database_unavailable", "{v}");
            ensure!(
                v["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("database"),
                "{v}"
            );
            ensure!(
                headers.to_ascii_lowercase().contains("retry-after:"),
                "no Retry-After: {headers}"
            );
        }
        for (name, ip) in known {
            ensure!(
                self.resolve(name)? == *ip,
                "the job server lost {name} during the outage:\n{}",
                self.log("jobserver.log")
            );
        }
        Ok(())
    }

    /// Waits until the same control process serves again.
    fn wait_serving(&mut self) -> Result<()> {
        wait_for("the control service to serve again", || {
            ensure!(
                self.control.0.try_wait()?.is_none(),
                "the control service exited:\n{}",
                self.log("control.log")
            );
            let (status, _, _) = self.curl("GET", "/api/v1/revision", None)?;
            Ok((status == 200).then_some(()))
        })
    }
}

/// Stops and restarts the database under the install, twice over with
/// `outage`, checking everything the module doc lists.
fn ride_out(database_url: &str, outages: &mut [&mut dyn FnMut(bool) -> Result<()>]) -> Result<()> {
    let mut inst = Install::start(database_url)?;
    inst.ok(
        "POST",
        "/api/v1/networks/",
        Some(&json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 24,
            "domain": "cluster", "managedns": true, "isdhcp": true})),
    )?;
    let mut known: Vec<(String, String)> = Vec::new();
    for (round, outage) in outages.iter_mut().enumerate() {
        let n = u8::try_from(10 + round * 2).unwrap_or(10);
        let name = format!("acked{round}");
        // Acknowledged before the outage; the job server has it.
        inst.add_system(&name, n)?;
        known.push((name.clone(), format!("10.0.0.{n}")));
        inst.wait_resolves(&name, &format!("10.0.0.{n}"))?;
        outage(false)?;
        let pairs: Vec<(&str, &str)> = known
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        inst.check_outage(&pairs)
            .with_context(|| format!("round {round}; control log:\n{}", inst.log("control.log")))?;
        outage(true)?;
        inst.wait_serving()?;
        for (name, _) in &known {
            inst.ok("GET", &format!("/api/v1/systems/{name}"), None)
                .with_context(|| format!("{name}, acknowledged before the outage, is lost"))?;
        }
        let (status, _, _) = inst.curl("GET", "/api/v1/systems/during", None)?;
        ensure!(
            status == 404,
            "a write refused during the outage was made: {status}"
        );
        let after = format!("after{round}");
        inst.add_system(&after, n + 1)?;
        known.push((after.clone(), format!("10.0.0.{}", n + 1)));
        inst.wait_resolves(&after, &format!("10.0.0.{}", n + 1))?;
        let log = inst.log("control.log");
        let downs = log.matches("the database stopped answering").count();
        let ups = log.matches("the database answers again").count();
        ensure!(
            downs == round + 1 && ups == round + 1,
            "outage {round}: logged {downs} outages and {ups} recoveries:\n{log}"
        );
    }
    Ok(())
}

/// A fresh database named `mprov` on the admin URL `admin`.
fn database_url(admin: &str) -> String {
    match admin.rsplit_once('/') {
        Some((base, _)) => format!("{base}/mprov"),
        None => admin.to_owned(),
    }
}

fn signal(pid: Option<u32>, sig: nix::sys::signal::Signal) -> Result<()> {
    let pid = pid.context("the server is not running")?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid)?), sig)?;
    Ok(())
}

/// The control service on database `mprov` of `db` rides out a restart of
/// the server and, with `cut`, a SIGSTOP (the server keeps its connections
/// and answers nothing).
fn rides_out<F: Flavor>(db: DbServer<F>, cut: bool) -> Result<()> {
    let db = std::cell::RefCell::new(db);
    db.borrow().query("CREATE DATABASE mprov")?;
    let url = database_url(&db.borrow().url());
    let mut restart = |back: bool| {
        if back {
            db.borrow_mut().start_again()
        } else {
            db.borrow_mut().shut_down()
        }
    };
    let mut stop_cont = |back: bool| {
        let pid = db.borrow().pid();
        signal(
            pid,
            if back {
                nix::sys::signal::Signal::SIGCONT
            } else {
                nix::sys::signal::Signal::SIGSTOP
            },
        )
    };
    if cut {
        ride_out(&url, &mut [&mut restart, &mut stop_cont])?;
    } else {
        ride_out(&url, &mut [&mut restart])?;
    }
    db.into_inner().stop()
}

#[test]
fn control_rides_out_a_mariadb_restart_and_a_cut() -> Result<()> {
    rides_out(MariaDb::start()?, true)
}

#[test]
fn control_rides_out_a_postgres_restart() -> Result<()> {
    rides_out(Postgres::start()?, false)
}
