//! Job servers as the seed describes them (issue 22), in the lab: three job
//! servers on two networks register themselves (no row made by hand),
//! heartbeat per address, build an image from the inventory, copy it to
//! each other, and a node on the second network boots from its own job
//! server. Killing one makes `/ipxe/` skip it once its heartbeat is stale,
//! and fails the job it was running. One VM, booted once.
//!
//! The lab namespace holds both networks: `lab` on `br0` (10.99.0.0/24:
//! js1 with DHCP on 10.99.0.1, js3 without on 10.99.0.3) and `lab2` on
//! `br1` (10.98.0.0/24: js2 with DHCP on 10.98.0.1, the nodes' gateway to
//! the control service on 10.99.0.1).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mprov_api::boot::{BootPhase, ImageFile};
use mprov_tests::lab::{
    self, BootConfigSource, JobServer, JobServerSpec, LabControl, LabNet, SERVER_IP,
};
use mprov_tests::netboot::{Machine, Stack, tail};
use serde_json::{Value, json};

use crate::netboot::{VM_TURN, image};

/// The second network's bridge.
const BRIDGE2: &str = "br1";
/// The namespace's (and js2's) address on it.
const JS2_IP: &str = "10.98.0.1";
/// js3's address, on the first network.
const JS3_IP: &str = "10.99.0.3";
/// Seconds between heartbeats.
const HEARTBEAT: &str = "2";
/// How old a heartbeat may be before `/ipxe/` skips the address.
const STALE_SECONDS: &str = "8";
/// How long a silent job server's running jobs stay running.
const FAIL_JOBS_AFTER_MINUTES: &str = "1";

/// Polls `probe` every half second until it gives a value, up to `limit`;
/// the error names `what` and the last reason `probe` gave.
pub(crate) fn wait_for<T>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + limit;
    let mut last = String::from("nothing yet");
    loop {
        match probe() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {limit:?} (last: {last})");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The job servers' rows, by name.
fn jobservers(control: &LabControl) -> Result<BTreeMap<String, Value>> {
    let list = control.api("GET", "/api/v1/jobservers/?limit=100", None)?;
    Ok(list["items"]
        .as_array()
        .context("a list")?
        .iter()
        .map(|js| {
            (
                js["name"].as_str().unwrap_or_default().to_owned(),
                js.clone(),
            )
        })
        .collect())
}

/// The jobs, oldest first.
fn jobs(control: &LabControl) -> Result<Vec<Value>> {
    let list = control.api("GET", "/api/v1/jobs/?limit=100&sort=id", None)?;
    Ok(list["items"].as_array().context("a list")?.clone())
}

/// One job server of the test: its name, address, network bridge (DHCP
/// on it, or none) and modules.
struct Spec {
    name: &'static str,
    ip: &'static str,
    dhcp_on: Option<&'static str>,
    modules: &'static str,
}

fn start_jobserver(
    net: &LabNet,
    control: &LabControl,
    bins: &lab::Binaries,
    agent: &Path,
    run: &Path,
    spec: &Spec,
    metrics_port: u16,
) -> Result<(String, PathBuf, JobServer)> {
    let export = run.join(format!("export-{}", spec.name));
    fs::create_dir_all(&export)?;
    let token = control.enroll_token(bins, spec.name)?;
    let js = JobServer::start(
        net,
        bins,
        &JobServerSpec {
            config: BootConfigSource::Control {
                url: control.https_url(),
                ca: control.ca(),
                token,
                name: spec.name.to_owned(),
                heartbeat: true,
            },
            ip: spec.ip.to_owned(),
            dhcp: spec.dhcp_on.is_some(),
            bridge: spec.dhcp_on.unwrap_or("br0"),
            args: jobserver_args(spec, agent),
            export: export.clone(),
            home: run.join(format!("jobserver-{}", spec.name)),
            metrics_port,
            file_limit: None,
        },
    )
    .with_context(|| format!("starting {}", spec.name))?;
    Ok((spec.name.to_owned(), export, js))
}

/// The job server's arguments beyond the lab's (which register it on its
/// one address): its modules, its heartbeat and the agent binary
/// image-update puts in images.
fn jobserver_args(spec: &Spec, agent: &Path) -> Vec<String> {
    vec![
        "-m".into(),
        spec.modules.into(),
        "--heartbeat".into(),
        HEARTBEAT.into(),
        "--agent".into(),
        agent.display().to_string(),
    ]
}

/// The inventory: the second network, a distro whose image source is the
/// lab's prepared Debian root, the lab's image-gen scripts, and the image
/// `debian` using them (not built yet).
fn inventory(control: &LabControl, root: &Path, slug: &str) -> Result<()> {
    control.api(
        "POST",
        "/api/v1/distros/",
        Some(&json!({
            "slug": "debian-lab", "vendor": "Debian", "version": "13",
            "config_params": format!("image_source:\n  dir: '{}'\n", root.display())
        })),
    )?;
    let mut scripts = Vec::new();
    for (script, content) in lab::debian_scripts() {
        control.api(
            "POST",
            "/api/v1/scripts/",
            Some(&json!({"slug": script, "content": content, "script_type": "image-gen"})),
        )?;
        scripts.push(script);
    }
    control.api(
        "POST",
        "/api/v1/images/",
        Some(&json!({
            "slug": slug, "distro": "debian-lab", "scripts": scripts,
            "install_kernel_cmdline": format!("console=ttyS0 quiet no_timer_check {}", lab::EXPORT_ARG),
        })),
    )?;
    Ok(())
}

/// The job-server addresses `/ipxe/` names for a client with `mac` on
/// `bridge`, which takes a lease first (the job server on its network
/// attests it).
fn ipxe_sources(net: &LabNet, bridge: &str, mac: &str) -> Result<String> {
    let client = net.client_on(mac, bridge)?;
    client.dhcp()?;
    let out = client
        .ns
        .command("curl")
        .args(["-sS", "-m", "20"])
        .arg(format!(
            "http://{SERVER_IP}:{}/ipxe/?mac={mac}",
            lab::CONTROL_PORT
        ))
        .output()?;
    ensure!(
        out.status.success(),
        "curl /ipxe/: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn job_servers_register_build_sync_and_serve_their_own_network() -> Result<()> {
    let _turn = VM_TURN.lock().unwrap_or_else(|e| e.into_inner());
    let (bins, image) = image()?;
    let agent = mprov_tests::agent::build_static()?;
    let root = lab::debian_bootstrap()?;
    let run = tempfile::tempdir()?;
    let net = LabNet::new("mprov")?;
    net.add_network(BRIDGE2, &format!("{JS2_IP}/24"))?;
    net.add_server_ip(JS3_IP)?;
    let control = LabControl::start_with(
        &net,
        &bins,
        &run.path().join("control"),
        None,
        &[
            ("MPROV_JOBSERVER_STALE_SECONDS", STALE_SECONDS),
            ("JOBSERVER_FAIL_JOBS_AFTER_MINUTES", FAIL_JOBS_AFTER_MINUTES),
        ],
    )?;
    for (slug, subnet, gateway, pool) in [
        ("lab", "10.99.0.0", None, ("10.99.0.100", "10.99.0.199")),
        (
            "lab2",
            "10.98.0.0",
            Some(JS2_IP),
            ("10.98.0.100", "10.98.0.199"),
        ),
    ] {
        control.api(
            "POST",
            "/api/v1/networks/",
            Some(&json!({
                "slug": slug, "subnet": subnet, "netmask": 24, "domain": slug,
                "gateway": gateway, "dhcp_start": pool.0, "dhcp_end": pool.1,
                "isdhcp": true, "isbootable": true
            })),
        )?;
    }
    inventory(&control, &root, &image.slug)?;

    // Three job servers, no rows made by hand.
    let specs = [
        Spec {
            name: "js1",
            ip: SERVER_IP,
            dhcp_on: Some("br0"),
            modules: "dnsmasq,mprov-webserver,image-update,image-sync,image-delete",
        },
        Spec {
            name: "js2",
            ip: JS2_IP,
            dhcp_on: Some(BRIDGE2),
            modules: "dnsmasq,mprov-webserver,image-sync,image-delete",
        },
        Spec {
            name: "js3",
            ip: JS3_IP,
            dhcp_on: None,
            modules: "mprov-webserver,image-sync,image-update",
        },
    ];
    ensure!(
        jobservers(&control)?.is_empty(),
        "no job server row before they start"
    );
    let mut started = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        started.push(start_jobserver(
            &net,
            &control,
            &bins,
            &agent.path,
            run.path(),
            spec,
            9102 + i as u16,
        )?);
    }
    let stack = Stack::assemble(net, control, started, &image, run.path());
    let control = &stack.control;

    // Each registered itself, placed on its network, heartbeating there.
    wait_for(
        "three job servers registered, each address heartbeating",
        Duration::from_secs(60),
        || {
            let rows = jobservers(control)?;
            for (spec, network) in specs.iter().zip(["lab", "lab2", "lab"]) {
                let Some(row) = rows.get(spec.name) else {
                    return Ok(None);
                };
                ensure!(
                    row["host_id"].as_str().is_some_and(|h| !h.is_empty()),
                    "{}: a host id: {row}",
                    spec.name
                );
                let modules: Vec<&str> = spec.modules.split(',').collect();
                ensure!(
                    row["modules"] == json!(modules),
                    "{}: its modules: {row}",
                    spec.name
                );
                let addresses = row["addresses"].as_array().context("addresses")?;
                ensure!(
                    addresses == &vec![json!(spec.ip)],
                    "{}: its one address: {row}",
                    spec.name
                );
                if row["heartbeat_at"].is_null() {
                    return Ok(None);
                }
                let _ = network;
            }
            Ok(Some(()))
        },
    )?;
    let listed = control.mash(&bins, &["jobservers", "list"])?;
    for spec in &specs {
        ensure!(
            listed.contains(spec.name) && listed.contains(spec.ip),
            "mash jobservers lists {}:\n{listed}",
            spec.name
        );
    }

    // A node of each network uses the image: its new versions are copied to
    // the job servers of both networks.
    let n11 = stack.register_on("n11", "52:54:00:16:00:11", "10.99.0.51", "lab")?;
    let node = stack.register_on("n21", "52:54:00:16:00:21", "10.98.0.41", "lab2")?;

    // A rebuild through the API: image-update on js1 or js3, then image-sync
    // to the others.
    control.api(
        "PATCH",
        &format!("/api/v1/images/{}", image.slug),
        Some(&json!({"needs_rebuild": true})),
    )?;
    let (img, jobs_done) = wait_for(
        "the image built and copied to every job server",
        Duration::from_secs(900),
        || {
            let jobs = jobs(control)?;
            if let Some(failed) = jobs.iter().find(|j| j["status"] == "failed") {
                bail!("a job failed: {failed:#}");
            }
            let img = control.api("GET", &format!("/api/v1/images/{}", image.slug), None)?;
            let hosts = img["jobservers"].as_array().context("hosts")?.len();
            let ended = jobs.len() == 3 && jobs.iter().all(|j| j["status"] == "success");
            Ok((hosts == 3 && ended).then_some((img, jobs)))
        },
    )?;
    let version = img["version"].as_i64().context("version")?;
    // Job servers by row id, as a job names the one that claimed it.
    let names: BTreeMap<i64, String> = jobservers(control)?
        .into_iter()
        .filter_map(|(name, row)| Some((row["id"].as_i64()?, name)))
        .collect();
    let claimer = |job: &Value| {
        job["jobserver"]
            .as_i64()
            .and_then(|id| names.get(&id).cloned())
            .unwrap_or_default()
    };
    let built_by: Vec<&Value> = jobs_done
        .iter()
        .filter(|j| j["module"] == "image-update")
        .collect();
    ensure!(built_by.len() == 1, "one image-update job: {jobs_done:#?}");
    let builder = claimer(built_by[0]);
    let mut synced: Vec<String> = jobs_done
        .iter()
        .filter(|j| j["module"] == "image-sync")
        .map(claimer)
        .collect();
    synced.sort();
    let mut others: Vec<String> = ["js1", "js2", "js3"]
        .into_iter()
        .filter(|n| *n != builder)
        .map(str::to_owned)
        .collect();
    others.sort();
    ensure!(
        synced == others,
        "the two others synced from {builder}: {jobs_done:#?}"
    );
    ensure!(
        built_by[0]["output"]
            .as_str()
            .unwrap_or_default()
            .lines()
            .count()
            > 3,
        "image-update's output shows its progress: {}",
        built_by[0]["output"]
    );
    // Byte-identical copies.
    let dir = |name: &str| {
        stack_export(run.path(), name).join(format!("images/{}/{version}", image.slug))
    };
    for file in ImageFile::ALL {
        let want = fs::read(dir(&builder).join(file.file_name()))?;
        for other in ["js1", "js2", "js3"] {
            ensure!(
                fs::read(dir(other).join(file.file_name()))? == want,
                "{other}'s {} is the builder's",
                file.file_name()
            );
        }
    }

    // Each network's nodes go to their own job servers.
    let on_lab = ipxe_sources(&stack.net, "br0", &n11.mac)?;
    ensure!(
        on_lab.contains(&served(SERVER_IP))
            && on_lab.contains(&served(JS3_IP))
            && !on_lab.contains(&served(JS2_IP)),
        "lab: js1 and js3:\n{on_lab}"
    );

    // A VM on lab2 boots from js2, watched on the admin pages' boot board
    // in Chromium (inside the lab namespace) as it happens.
    let board = crate::pages::watch_board(
        stack.net.name(),
        control.url(),
        control.password.clone(),
        node.hostname.clone(),
        Duration::from_secs(600),
    );
    let vm = stack.power_on_at(&node, Machine::BiosIpxe, BRIDGE2)?;
    let booted = stack.until_ready(&node, vm, |_| {})?;
    ensure!(booted.console.contains(lab::READY_MARKER), "ready");
    let seen = board
        .join()
        .map_err(|_| anyhow::anyhow!("the board watcher panicked"))??;
    eprintln!("boot board: {} went {:?}", node.hostname, seen.letters);
    ensure!(
        seen.letters.last().map(String::as_str) == Some("R") && seen.live_changes >= 2,
        "the board followed the boot live to ready: {seen:?}"
    );
    let events = stack.timeline(&node)?;
    for phase in [
        BootPhase::DhcpAcked,
        BootPhase::KernelFetched,
        BootPhase::InitramfsFetched,
    ] {
        let e = events
            .iter()
            .find(|e| e.phase == phase)
            .with_context(|| format!("{phase:?} on the timeline"))?;
        ensure!(e.source.contains("js2"), "{phase:?} from js2: {events:#?}");
    }
    drop(booted);

    // js3 takes a long job (a second image, only its to build), and dies
    // in it.
    control.api("POST", "/api/v1/images/", Some(&json!({"slug": "debian-b", "distro": "debian-lab", "scripts": ["lab-slim", "lab-ready"]})))?;
    let job = control.api("POST", "/api/v1/jobs/", Some(&json!({"module": "image-update", "params": {"image": "debian-b"}, "for_jobserver": "js3"})))?;
    let id = job["id"].as_i64().context("job id")?;
    wait_for("js3 running the build", Duration::from_secs(120), || {
        let job = control.api("GET", &format!("/api/v1/jobs/{id}"), None)?;
        Ok(
            (job["status"] == "running" && !job["output"].as_str().unwrap_or_default().is_empty())
                .then_some(()),
        )
    })?;
    stack.jobservers[2].kill()?;
    let killed = Instant::now();
    wait_for(
        "/ipxe/ skipping js3 once its heartbeat is stale",
        Duration::from_secs(60),
        || {
            let script = ipxe_sources(&stack.net, "br0", "52:54:00:16:00:11")?;
            ensure!(
                script.contains(&served(SERVER_IP)),
                "js1 is still there:\n{script}"
            );
            Ok((!script.contains(&served(JS3_IP))).then_some(()))
        },
    )?;
    let failed = wait_for("js3's running job failed", Duration::from_secs(240), || {
        let job = control.api("GET", &format!("/api/v1/jobs/{id}"), None)?;
        Ok((job["status"] == "failed").then_some(job))
    })?;
    eprintln!("js3's job failed {:.0?} after the kill", killed.elapsed());
    ensure!(
        failed["output"]
            .as_str()
            .unwrap_or_default()
            .contains("JOBSERVER_FAIL_JOBS_AFTER_MINUTES"),
        "the reason names the setting: {}",
        tail(failed["output"].as_str().unwrap_or_default(), 5)
    );
    Ok(())
}

/// A job server's image server as `/ipxe/` names it.
fn served(ip: &str) -> String {
    mprov_api::boot::jobserver_base_url(ip, Some(mprov_api::boot::DEFAULT_HTTP_PORT))
}

/// A job server's export folder, as [`start_jobserver`] made it.
fn stack_export(run: &Path, name: &str) -> PathBuf {
    run.join(format!("export-{name}"))
}
