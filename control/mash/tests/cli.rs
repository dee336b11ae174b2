//! mash against a real control service: `mprov-control serve` on a loopback
//! port with its folders in a temporary directory, and the `mash` binary run
//! as a user would, with Basic authentication.
//!
//! The server binary is the workspace's `target/<profile>/mprov-control`
//! (beside this package's `mash`), or `MPROV_CONTROL_BIN`. Cargo builds it for
//! `cargo test --workspace` when the control package has integration tests;
//! otherwise run `cargo build -p mprov-control` first. A missing binary fails
//! the tests with that instruction rather than skipping them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

const PASSWORD: &str = "mash-test-password";
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running control service and a folder for it and for the test's files.
struct TestContext {
    dir: tempfile::TempDir,
    server: Child,
    url: String,
}

impl TestContext {
    fn start() -> Result<TestContext> {
        let bin = server_binary()?;
        let dir = tempfile::tempdir()?;
        // The service becomes the `mprov` user when started as root: it must
        // reach its folders.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        let log = std::fs::File::create(dir.path().join("server.log"))?;
        let port_file = dir.path().join("listen");
        let server = Command::new(&bin)
            .arg("serve")
            .env_clear()
            .env("MPROV_CONFIG_DIR", dir.path().join("etc"))
            .env("MPROV_STATE_DIR", dir.path().join("var"))
            // Port 0, and the bound address in a file: no port race between
            // tests running at once.
            .env("MPROV_LISTEN", "127.0.0.1:0")
            .env("MPROV_LISTEN_FILE", &port_file)
            .env("MPROV_HTTPS_LISTEN", "127.0.0.1:0")
            .env("MPROV_HTTPS_LISTEN_FILE", dir.path().join("listen-https"))
            .env("MPROV_SUPERUSER_PASSWORD", PASSWORD)
            .env("MPROV_MPCC_HOSTNAME", "mpcc")
            .env("MPROV_LOG", "warn")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("could not start {}", bin.display()))?;
        let mut ctx = TestContext {
            dir,
            server,
            url: String::new(),
        };
        let addr = ctx.wait_until_listening(&port_file)?;
        ctx.url = format!("http://{addr}");
        Ok(ctx)
    }

    /// Waits (bounded) until the server wrote the address it listens on;
    /// no sleep guesses, no log scraping.
    fn wait_until_listening(&mut self, port_file: &std::path::Path) -> Result<String> {
        let started = Instant::now();
        loop {
            if let Ok(addr) = std::fs::read_to_string(port_file)
                && !addr.trim().is_empty()
            {
                return Ok(addr.trim().to_owned());
            }
            if let Some(status) = self.server.try_wait()? {
                bail!("mprov-control exited with {status}:\n{}", self.log());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "mprov-control did not listen within {START_TIMEOUT:?}:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// `mash` with only the variables we give it, authenticated as admin.
    fn mash(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mash"));
        cmd.env_clear()
            .env("HOME", self.dir.path())
            .env("XDG_CONFIG_HOME", self.dir.path().join("xdg"))
            .env("MPROV_URL", &self.url)
            .env("MPROV_USER", "admin")
            .env("MPROV_PASSWORD", PASSWORD)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs mash with `args`; returns stdout, failing on a non-zero exit.
    fn ok(&self, args: &[&str]) -> String {
        let out = run(self.mash().args(args));
        assert!(
            out.status.success(),
            "mash {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8(out.stdout).expect("UTF-8 output")
    }

    /// Runs mash with `args`, expecting it to fail; returns stderr.
    fn fails(&self, cmd: &mut Command) -> String {
        let out = run(cmd);
        assert!(
            !out.status.success(),
            "expected failure, got: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).expect("UTF-8 output")
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("mash {args:?}: {e}: {out}"))
    }

    /// The image `rocky9` and the network `prov` (10.0.0.0/16) that a
    /// test's systems boot and sit on.
    fn add_image_and_network(&self) {
        self.ok(&["images", "add", "slug=rocky9"]);
        self.ok(&[
            "networks",
            "add",
            "slug=prov",
            "subnet=10.0.0.0",
            "netmask=16",
        ]);
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Stops the server; keeps the folder (and its log) when the test failed.
    fn cleanup(mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

impl Drop for TestContext {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        if std::thread::panicking() {
            let kept = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"));
            eprintln!("server folder and log kept in {}", kept.keep().display());
        }
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run mash")
}

fn server_binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("MPROV_CONTROL_BIN") {
        return Ok(bin.into());
    }
    let mash = Path::new(env!("CARGO_BIN_EXE_mash"));
    let bin = mash.with_file_name("mprov-control");
    if !bin.exists() {
        bail!(
            "{} is missing: run `cargo build -p mprov-control` first, or set MPROV_CONTROL_BIN",
            bin.display()
        );
    }
    Ok(bin)
}

fn ids(items: &Value) -> Vec<&str> {
    items
        .as_array()
        .expect("a list")
        .iter()
        .map(|i| i["hostname"].as_str().expect("hostname"))
        .collect()
}

#[test]
fn add_list_show_edit_delete() {
    let ctx = TestContext::start().expect("server");
    ctx.ok(&["groups", "add", "slug=compute", "priority=5"]);
    ctx.ok(&[
        "groups",
        "add",
        "--json",
        r#"{"slug":"gpu","name":"GPU nodes"}"#,
    ]);
    ctx.add_image_and_network();

    let added = ctx.json(&[
        "systems",
        "add",
        "hostname=n001",
        "image=rocky9",
        "groups=compute,gpu",
        "netboot=false",
        r#"nics:=[{"name":"eth0","mac":"AA:BB:CC:DD:EE:01","ipv4":"10.0.0.1","bootable":true,"network":"prov"}]"#,
        "-o",
        "json",
    ]);
    assert_eq!(added["hostname"], "n001");
    assert_eq!(added["netboot"], false);
    assert_eq!(added["groups"].as_array().map(Vec::len), Some(2));
    assert_eq!(added["nics"][0]["mac"], "aa:bb:cc:dd:ee:01");
    ctx.ok(&["systems", "add", "hostname=n002", "image=rocky9"]);

    // The table: a header, then the rows, with the system's NICs summarised.
    let table = ctx.ok(&[
        "systems",
        "list",
        "--filter",
        "image=rocky9",
        "--sort",
        "hostname",
    ]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("id") && lines[0].contains("hostname"),
        "{table}"
    );
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[1].contains("n001") && lines[1].contains("eth0=aa:bb:cc:dd:ee:01"),
        "{table}"
    );
    assert!(lines[2].contains("n002"), "{table}");

    let sorted = ctx.json(&[
        "systems",
        "list",
        "--sort",
        "-hostname",
        "--json",
        "-f",
        "image=rocky9",
    ]);
    assert_eq!(ids(&sorted), ["n002", "n001"]);
    let limited = ctx.json(&[
        "systems",
        "list",
        "--sort",
        "hostname",
        "--limit",
        "1",
        "--json",
        "-f",
        "image=rocky9",
    ]);
    assert_eq!(ids(&limited), ["n001"]);

    let shown = ctx.json(&["systems", "show", "n001", "--json"]);
    assert_eq!(shown["id"], added["id"]);
    let by_id = ctx.json(&["systems", "show", &added["id"].to_string(), "--json"]);
    assert_eq!(by_id["hostname"], "n001");
    let table = ctx.ok(&["systems", "show", "n001"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("hostname") && l.ends_with("n001")),
        "{table}"
    );

    let edited = ctx.json(&[
        "systems",
        "edit",
        "n001",
        "netboot=true",
        "groups=gpu",
        "-o",
        "json",
    ]);
    assert_eq!(edited["netboot"], true);
    assert_eq!(edited["groups"].as_array().map(Vec::len), Some(1));

    assert_eq!(
        ctx.ok(&["systems", "delete", "n002"]),
        "deleted systems n002\n"
    );
    let err = ctx.fails(ctx.mash().args(["systems", "show", "n002"]));
    assert!(
        err.starts_with("mash: could not show systems n002: ") && err.contains("404"),
        "{err}"
    );

    // Bad values never reach the server; the server's own refusals are shown.
    let err = ctx.fails(
        ctx.mash()
            .args(["systems", "edit", "n001", "netboot=maybe"]),
    );
    assert!(err.contains("invalid value for netboot"), "{err}");
    let err = ctx.fails(ctx.mash().args(["systems", "add", "hostname=bad_name!"]));
    assert!(err.contains("400 Bad Request"), "{err}");
    ctx.cleanup();
}

/// mash over HTTPS, trusting the install's own CA: the optional client
/// certificate the listener asks for does not get in its way.
#[test]
fn over_https_with_the_install_ca() {
    let mut ctx = TestContext::start().expect("server");
    let https = ctx
        .wait_until_listening(&ctx.dir.path().join("listen-https"))
        .expect("https address");
    let ca = ctx.dir.path().join("var/tls/ca.crt");
    let out = run(ctx
        .mash()
        .env("MPROV_URL", format!("https://{https}"))
        .env("MPROV_CA_CERT", &ca)
        .args(["systems", "list", "--json"]));
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        ctx.log()
    );
    let listed: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(ids(&listed).contains(&"mpcc"), "{listed}");
    // Without the CA, the certificate is not trusted: a clear refusal.
    let err = ctx.fails(
        ctx.mash()
            .env("MPROV_URL", format!("https://{https}"))
            .args(["systems", "list"]),
    );
    assert!(err.to_lowercase().contains("certificate"), "{err}");
}

#[test]
fn credentials_and_config_files() {
    let ctx = TestContext::start().expect("server");
    let err = ctx.fails(
        ctx.mash()
            .env("MPROV_PASSWORD", "wrong")
            .args(["systems", "list"]),
    );
    assert!(err.contains("401"), "{err}");

    // No URL anywhere (no default config file yet).
    let err = ctx.fails(ctx.mash().env_remove("MPROV_URL").args(["systems", "list"]));
    assert!(err.contains("no server URL"), "{err}");

    // Everything from a config file.
    let config = ctx.path("mash.toml");
    std::fs::write(
        &config,
        format!(
            "url = \"{}\"\nuser = \"admin\"\npassword = \"{PASSWORD}\"\n",
            ctx.url
        ),
    )
    .expect("write");
    let mut cmd = ctx.mash();
    cmd.env_remove("MPROV_URL")
        .env_remove("MPROV_USER")
        .env_remove("MPROV_PASSWORD")
        .args([
            "--config",
            config.to_str().expect("path"),
            "groups",
            "list",
            "--json",
        ]);
    let out = run(&mut cmd);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The default file, under XDG_CONFIG_HOME.
    let xdg = ctx.path("xdg/mprov");
    std::fs::create_dir_all(&xdg).expect("mkdir");
    std::fs::copy(&config, xdg.join("mash.toml")).expect("copy");
    let mut cmd = ctx.mash();
    cmd.env_remove("MPROV_URL")
        .env_remove("MPROV_USER")
        .env_remove("MPROV_PASSWORD");
    let out = run(cmd.args(["images", "list"]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    std::fs::write(&config, "url = \"http://x\"\napi_key = \"k\"\n").expect("write");
    let err =
        ctx.fails(
            ctx.mash()
                .args(["--config", config.to_str().expect("path"), "groups", "list"]),
        );
    assert!(err.contains("unknown field `api_key`"), "{err}");

    ctx.cleanup();
}

#[test]
fn import_a_thousand_systems() {
    let ctx = TestContext::start().expect("server");
    ctx.ok(&["groups", "add", "slug=compute"]);
    ctx.ok(&["groups", "add", "slug=gpu"]);
    ctx.add_image_and_network();
    ctx.ok(&[
        "networks",
        "add",
        "slug=ib",
        "subnet=10.2.0.0",
        "netmask=16",
    ]);

    // Two NICs per system, on two rows each.
    let mut csv = String::from("hostname,image,groups,nic,mac,ipv4,ipv6,network,bootable\n");
    for i in 0..1000 {
        csv.push_str(&format!(
            "c{i:04},rocky9,compute;gpu,eth0,02:00:00:00:{:02x}:{:02x},10.0.{}.{},,prov,true\n",
            i / 256,
            i % 256,
            i / 250 + 1,
            i % 250 + 1
        ));
        csv.push_str(&format!(
            "c{i:04},,,ib0,,10.2.{}.{},,ib,false\n",
            i / 250,
            i % 250 + 1
        ));
    }
    let file = ctx.path("nodes.csv");
    std::fs::write(&file, &csv).expect("write");
    let out = ctx.ok(&["import", file.to_str().expect("path")]);
    assert!(
        out.starts_with("imported 1000 systems in ") && out.ends_with(" s\n"),
        "{out}"
    );

    let all = ctx.json(&["systems", "list", "--json", "-f", "image=rocky9"]);
    assert_eq!(all.as_array().map(Vec::len), Some(1000));
    let one = ctx.json(&["systems", "show", "c0999", "--json"]);
    assert_eq!(one["nics"].as_array().map(Vec::len), Some(2));
    assert_eq!(one["nics"][0]["mac"], "02:00:00:00:03:e7");
    assert_eq!(one["nics"][1]["bootable"], false);

    // A refused import names CSV lines and creates nothing.
    let bad = "hostname,mac,ipv4\n\
               x1,02:00:00:01:00:01,10.0.9.1\n\
               x2,zz:zz,10.0.9.2\n\
               x3,02:00:00:01:00:03,10.0.9.3\n\
               x3,02:00:00:01:00:04,300.0.0.1\n";
    let file = ctx.path("bad.csv");
    std::fs::write(&file, bad).expect("write");
    let err = ctx.fails(ctx.mash().args(["import", file.to_str().expect("path")]));
    assert!(err.contains("nothing was created"), "{err}");
    assert!(err.contains("line 3 (x2)"), "{err}");
    assert!(err.contains("line 5 (x3)"), "{err}");
    let err = ctx.fails(ctx.mash().args(["systems", "show", "x1"]));
    assert!(err.contains("404"), "{err}");

    // Importing the same hosts again conflicts, row by row, capped.
    let err = ctx.fails(
        ctx.mash()
            .args(["import", ctx.path("nodes.csv").to_str().expect("path")]),
    );
    assert!(err.contains("lines 2,3 (c0000)"), "{err}");
    assert!(err.contains("more (--max-errors 0 shows all)"), "{err}");
    ctx.cleanup();
}

/// `mash jobs`: the queue newest first with its filters, one job with its
/// whole output, and the end time the control service stamps on a job that
/// ended without one.
#[test]
fn jobs_list_filter_and_show() {
    let ctx = TestContext::start().expect("server");
    ctx.ok(&["jobservers", "add", "name=js1"]);
    ctx.ok(&[
        "jobs",
        "add",
        "module=image-update",
        r#"params:={"image":"rocky9","version":2}"#,
    ]);
    ctx.ok(&["jobs", "add", "module=libgenders"]);
    let output = (1..=300)
        .map(|i| format!("step {i} of 300\n"))
        .collect::<String>();
    ctx.ok(&[
        "jobs",
        "edit",
        "1",
        "status=failed",
        "jobserver=js1",
        "return_code=2",
        &format!("output={output}"),
    ]);

    let table = ctx.ok(&["jobs"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("id") && lines[0].contains("return_code"),
        "{table}"
    );
    assert!(
        lines[1].starts_with('2') && lines[1].contains("pending"),
        "newest first: {table}"
    );
    assert!(
        lines[2].contains("image-update")
            && lines[2].contains("failed")
            && lines[2].contains("js1"),
        "{table}"
    );
    let failed = ctx.ok(&["jobs", "--status", "failed"]);
    assert_eq!(failed.lines().count(), 2, "{failed}");
    assert!(failed.contains("image-update"), "{failed}");
    let listed = ctx.ok(&["jobs", "list", "--module", "libgenders"]);
    assert_eq!(listed.lines().count(), 2, "{listed}");
    assert!(
        listed.contains("libgenders") && listed.contains("pending"),
        "{listed}"
    );
    assert_eq!(ctx.ok(&["jobs", "--status", "running"]), "no jobs\n");

    let shown = ctx.ok(&["jobs", "show", "1"]);
    assert!(shown.ends_with(&format!("output:\n{output}")), "{shown}");
    assert!(shown.contains("js1 ("), "{shown}");
    let job = ctx.json(&["jobs", "show", "1", "--json"]);
    assert_eq!(job["output"], output.as_str());
    assert!(
        job["ended_at"].is_string(),
        "a failed job gets its end time: {job}"
    );
    let err = ctx.fails(ctx.mash().args(["jobs", "show", "99"]));
    assert!(err.contains("could not show job 99"), "{err}");
    ctx.cleanup();
}

/// A job server enrolls and registers itself with its own certificate and
/// heartbeats on one of its two addresses; `mash jobservers` shows each
/// address with its network, heartbeat age, load, streams and modules, and
/// its help says so.
#[test]
fn jobservers_show_each_address_with_its_heartbeat() {
    use mprov_api::client::{Auth, Client};

    let mut ctx = TestContext::start().expect("server");
    let https = ctx
        .wait_until_listening(&ctx.dir.path().join("listen-https"))
        .expect("https address");
    ctx.ok(&[
        "networks",
        "add",
        "slug=prov",
        "subnet=10.0.0.0",
        "netmask=24",
    ]);
    // The job server's key and CSR, by openssl as an operator would.
    let key = ctx.path("js1.key");
    let csr = ctx.path("js1.csr");
    let made = run(Command::new("openssl")
        .args(["req", "-new", "-nodes", "-subj", "/"])
        .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&csr));
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let ca = std::fs::read(ctx.dir.path().join("var/tls/ca.crt")).expect("ca");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let admin = Client::builder(
            &ctx.url,
            Auth::Basic {
                user: "admin".into(),
                password: PASSWORD.into(),
            },
        )
        .build()
        .expect("admin client");
        let token = admin
            .create("enroll-tokens", &serde_json::json!({"name": "js1"}))
            .await
            .expect("token")["token"]
            .as_str()
            .expect("token text")
            .to_owned();
        let enrolled = admin
            .enroll_jobserver(&mprov_api::enroll::JobserverEnrollment {
                token,
                name: "js1".into(),
                csr: std::fs::read_to_string(&csr).expect("csr"),
            })
            .await
            .expect("enrolled");
        let mut identity = enrolled.certificate.into_bytes();
        identity.extend(std::fs::read(&key).expect("key"));
        let js1 = Client::builder(&format!("https://{https}"), Auth::None)
            .ca_certificates_pem(ca)
            .identity_pem(identity)
            .build()
            .expect("job server client");
        let registered = js1
            .register(&mprov_api::jobs::Registration {
                host_id: "host-1".into(),
                modules: vec!["dnsmasq".into(), "image-update".into()],
                port: 8081,
                addresses: ["10.0.0.2", "192.0.2.9"]
                    .map(|a| mprov_api::jobs::AddressRegistration {
                        address: a.parse().expect("address"),
                        network: None,
                    })
                    .to_vec(),
            })
            .await
            .expect("registered");
        assert_eq!(registered.name, "js1");
        js1.heartbeat(&mprov_api::boot::Heartbeat {
            load_avg: 0.75,
            address: Some("10.0.0.2".parse().expect("address")),
            streams: 3,
        })
        .await
        .expect("heartbeat");
    });

    let listed = ctx.ok(&["jobservers", "list"]);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 3, "{listed}");
    let words = |line: &str| {
        line.split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        words(lines[0]),
        [
            "id",
            "name",
            "address",
            "network",
            "heartbeat",
            "load",
            "streams",
            "modules"
        ]
    );
    let heard = words(lines[1]);
    assert_eq!(heard[1..4], ["js1", "10.0.0.2", "prov"], "{listed}");
    assert!(heard[4].parse::<u64>().is_ok_and(|s| s < 60), "{listed}");
    assert_eq!(
        heard[5..],
        ["s", "ago", "0.75", "3", "dnsmasq,image-update"],
        "{listed}"
    );
    assert_eq!(
        words(lines[2])[1..],
        [
            "js1",
            "192.0.2.9",
            "-",
            "never",
            "-",
            "-",
            "dnsmasq,image-update"
        ],
        "{listed}"
    );
    let shown = ctx.ok(&["jobservers", "show", "js1"]);
    assert!(
        shown.contains("host-1") && shown.contains("192.0.2.9"),
        "{shown}"
    );
    assert!(!shown.contains("registered_addresses"), "{shown}");
    let json = ctx.json(&["jobservers", "show", "js1", "--json"]);
    assert_eq!(json["registered_addresses"][0]["streams"], 3, "{json}");
    let help = ctx.ok(&["jobservers", "--help"]);
    for needle in ["heartbeat", "network", "streams", "modules", "never"] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
    ctx.cleanup();
}

/// `mash systems run-scripts` bumps the node's run request each time, says
/// what happens next, and names an unknown node; `mash systems show` keeps
/// working after the systems command grew its own action.
#[test]
fn systems_run_scripts_queues_a_new_run() {
    let ctx = TestContext::start().expect("server");
    ctx.ok(&["systems", "add", "hostname=c01"]);
    let first = ctx.ok(&["systems", "run-scripts", "c01"]);
    assert!(
        first.starts_with("c01: a new run of its post-boot scripts is queued (run request 1).")
            && first.contains("mash boot status c01"),
        "{first}"
    );
    let again = ctx.json(&["systems", "run-scripts", "c01", "-o", "json"]);
    assert_eq!(again["run_request"], 2, "{again}");
    assert_eq!(again["system"], "c01", "{again}");
    let shown = ctx.json(&["systems", "show", "c01", "--json"]);
    assert_eq!(shown["run_request"], 2, "{shown}");
    let err = ctx.fails(ctx.mash().args(["systems", "run-scripts", "c09"]));
    assert!(
        err.contains("could not ask c09 to run its scripts again") && err.contains("c09"),
        "{err}"
    );
    ctx.cleanup();
}

/// A node parked by discovery, as the report path leaves it (a discovery
/// nonce minted and spent by the store, under `manual`), through the
/// service's own database: `mash discovery list` shows it with the port it
/// heard, `assign` binds its MAC to the NIC cabled there, `dismiss` forgets
/// another.
#[test]
fn discovery_list_assign_dismiss() {
    use mprov_api::nads::{LinkReport, NadsReport, Neighbour};
    use mprov_control::discovery::{Policy, store};
    let ctx = TestContext::start().expect("server");
    ctx.add_image_and_network();
    ctx.ok(&["switches", "add", "hostname=sw1"]);
    let port = ctx.json(&[
        "switchports",
        "add",
        "switch=sw1",
        "name=Ethernet1/1",
        "-o",
        "json",
    ]);
    let port = port["id"].to_string();
    ctx.ok(&["systems", "add", "hostname=c01"]);
    ctx.ok(&[
        "nics",
        "add",
        "system=c01",
        "name=eno1",
        &format!("switch_port={port}"),
    ]);
    let url = format!(
        "sqlite://{}?mode=rwc",
        ctx.dir.path().join("var/db/mprov.sqlite3").display()
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let db = mprov_control::db::Db::open(&url)
            .await
            .expect("the service's database");
        for (mac, port) in [
            ("52:54:00:d1:00:01", "Eth1/1"),
            ("52:54:00:d1:00:02", "Eth1/9"),
        ] {
            let nonce = store::mint_nonce(&db, mac).await.unwrap();
            let report = NadsReport {
                boot_mac: mac.into(),
                links: vec![LinkReport {
                    interface: "eth0".into(),
                    mac: mac.into(),
                    neighbour: Some(Neighbour {
                        chassis_id: "00:11:22:33:44:55".into(),
                        chassis_id_subtype: "mac-address".into(),
                        port_id: port.into(),
                        port_id_subtype: "interface-name".into(),
                        system_name: Some("sw1".into()),
                        ..Neighbour::default()
                    }),
                }],
                hardware: Default::default(),
            };
            store::report(&db, Some(&nonce), report, Policy::Manual)
                .await
                .unwrap();
        }
        db.close().await;
    });
    let list = ctx.ok(&["discovery", "list"]);
    assert!(
        list.contains("52:54:00:d1:00:01")
            && list.contains("sw1 Eth1/1")
            && list.contains("c01 eno1")
            && list.contains("2 parked"),
        "{list}"
    );
    let json = ctx.json(&["discovery", "list", "--json"]);
    assert_eq!(json.as_array().map(Vec::len), Some(2), "{json}");
    let out = ctx.ok(&["discovery", "assign", "52:54:00:d1:00:01", "c01", "eno1"]);
    assert!(
        out.contains("52:54:00:d1:00:01 is now c01's NIC eno1"),
        "{out}"
    );
    let nics = ctx.json(&["nics", "list", "--filter", "system=c01", "--json"]);
    assert_eq!(nics[0]["mac"], "52:54:00:d1:00:01", "{nics}");
    let err =
        ctx.fails(
            ctx.mash()
                .args(["discovery", "assign", "52:54:00:d1:00:02", "c01", "eno1"]),
        );
    assert!(err.contains("already") || err.contains("has MAC"), "{err}");
    ctx.ok(&["discovery", "dismiss", "52:54:00:d1:00:02"]);
    let json = ctx.json(&["discovery", "list", "--json"]);
    assert_eq!(json, serde_json::json!([]));
    let err = ctx.fails(
        ctx.mash()
            .args(["discovery", "dismiss", "52:54:00:d1:00:02"]),
    );
    assert!(err.contains("could not dismiss"), "{err}");
    ctx.cleanup();
}

/// `mash systems list --filter` takes the filter language (and still
/// FIELD=VALUE), `mash systems bulk` previews, refuses a stale count and
/// applies a confirmed one, and `mash audit` shows the entry.
#[test]
fn systems_filter_bulk_and_audit() {
    let ctx = TestContext::start().expect("server");
    ctx.add_image_and_network();
    ctx.ok(&["groups", "add", "slug=compute"]);
    ctx.ok(&["groups", "add", "slug=gpu"]);
    for (host, rack) in [("n001", "r1"), ("n002", "r1"), ("n003", "r2")] {
        ctx.ok(&[
            "systems",
            "add",
            &format!("hostname={host}"),
            &format!("rack={rack}"),
            "groups=compute",
            "image=rocky9",
        ]);
    }
    ctx.ok(&["systems", "add", "hostname=n004"]);

    let listed = ctx.json(&[
        "systems",
        "list",
        "--filter",
        "group:compute rack:r1",
        "--sort",
        "hostname",
        "--json",
    ]);
    assert_eq!(ids(&listed), ["n001", "n002"]);
    // The service's own system (mpcc) is in no group either.
    let negated = ctx.json(&[
        "systems",
        "list",
        "-f",
        "-group:compute hostname:n*",
        "--json",
    ]);
    assert_eq!(ids(&negated), ["n004"]);
    // An expression and a FIELD=VALUE filter narrow together.
    let both = ctx.json(&[
        "systems",
        "list",
        "-f",
        "rack:r*",
        "-f",
        "hostname=n003",
        "--json",
    ]);
    assert_eq!(ids(&both), ["n003"]);
    let err = ctx.fails(
        ctx.mash()
            .args(["systems", "list", "--filter", "colour:red"]),
    );
    assert!(
        err.contains("unknown key \"colour\"") && err.contains("bmc, group, hostname"),
        "{err}"
    );

    // The preview changes nothing and says how to apply.
    let preview = ctx.ok(&[
        "systems",
        "bulk",
        "add-to-group",
        "gpu",
        "--filter",
        "rack:r1",
    ]);
    assert!(
        preview.contains("2 systems match \"rack:r1\": n001, n002")
            && preview.contains("--confirm 2"),
        "{preview}"
    );
    let gpu = ctx.json(&["systems", "list", "-f", "group:gpu", "--json"]);
    assert_eq!(ids(&gpu), Vec::<&str>::new());
    // A count that is not the filter's now: refused, nothing applied.
    let err = ctx.fails(ctx.mash().args([
        "systems",
        "bulk",
        "add-to-group",
        "gpu",
        "--filter",
        "rack:r1",
        "--confirm",
        "3",
    ]));
    assert!(err.contains("now matches 2 systems, not the 3"), "{err}");
    let applied = ctx.ok(&[
        "systems",
        "bulk",
        "add-to-group",
        "gpu",
        "--filter",
        "rack:r1",
        "--confirm",
        "2",
    ]);
    assert!(applied.contains("applied to 2 systems"), "{applied}");
    let gpu = ctx.json(&[
        "systems",
        "list",
        "-f",
        "group:gpu",
        "--json",
        "-s",
        "hostname",
    ]);
    assert_eq!(ids(&gpu), ["n001", "n002"]);
    let off = ctx.ok(&[
        "systems",
        "bulk",
        "set-netboot",
        "off",
        "-f",
        "-rack:r1 hostname:n*",
        "--confirm",
        "2",
    ]);
    assert!(
        off.contains("set_netboot off: applied to 2 systems"),
        "{off}"
    );
    assert_eq!(
        ctx.json(&["systems", "show", "n004", "--json"])["netboot"],
        false
    );
    assert_eq!(
        ctx.json(&["systems", "show", "n001", "--json"])["netboot"],
        true
    );

    let audit = ctx.json(&["audit", "--json"]);
    let entries = audit.as_array().expect("a list");
    assert_eq!(entries.len(), 2, "{audit}");
    assert_eq!(entries[1]["action"], "add_to_group");
    assert_eq!(entries[1]["filter"], "rack:r1");
    assert_eq!(entries[1]["detail"], "group gpu");
    assert_eq!(entries[1]["count"], 2);
    assert_eq!(entries[1]["who"], "admin");
    let table = ctx.ok(&["audit"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("id") && lines[0].contains("filter"),
        "{table}"
    );
    assert!(
        lines[1].contains("set_netboot") && lines[2].contains("add_to_group"),
        "{table}"
    );
    ctx.cleanup();
}
