//! A node provisioned by our stack alone, from power-on to "ready": one VM,
//! booted once, shared by every assertion (a real-root boot takes minutes
//! under TCG).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mprov_api::boot::{BootEvent, BootPhase};
use mprov_tests::flood::{Flood, FloodSpec};
use mprov_tests::lab::{
    CONTROL_HTTPS_PORT, CONTROL_PORT, NODE_PROBES, PROBED_OTHER, READY_MARKER, SERVER_IP,
};
use mprov_tests::netboot::{Booted, Machine, Node, Stack, StackOptions, in_order, tail};

use crate::netboot::{VM_TURN, image};

/// The phases every healthy netboot passes, in order.
pub(crate) const HEALTHY: &[BootPhase] = &[
    BootPhase::DhcpOffered,
    BootPhase::DhcpAcked,
    BootPhase::ScriptServed,
    BootPhase::KernelFetched,
    BootPhase::InitramfsFetched,
    BootPhase::AgentDhcp,
    BootPhase::Enrolled,
    BootPhase::ImageStarted,
    BootPhase::Verified,
    BootPhase::SwitchRoot,
    BootPhase::Scripts,
    BootPhase::Ready,
];

/// Prints a timeline event as a boot reports it.
pub(crate) fn print_event(e: &BootEvent) {
    eprintln!(
        "timeline: {} {} {} {}",
        e.at,
        e.phase.as_str(),
        e.source,
        e.detail
    );
}

pub(crate) fn phases(events: &[BootEvent]) -> Vec<&'static str> {
    events.iter().map(|e| e.phase.as_str()).collect()
}

/// The node certificates' validity in the end-to-end stack: short, so that
/// the booted node renews its own during the test.
const NODE_CERT_SECONDS: u64 = 300;

/// The post-boot scripts that run on n01: one per layer, and two in the
/// group's layer that wait for each other's start (so they ran at once).
const SCRIPTS_RUN: &[&str] = &[
    "lab-distro",
    "lab-group-a",
    "lab-group-b",
    "lab-image",
    "lab-system",
];

/// A post-boot script writing `<its slug>` under `/run/mprov-lab` with the
/// time it ran (the lab's export copies them out).
fn marker_script(extra: &str) -> String {
    format!(
        "#!/bin/sh\nset -e\nd=/run/mprov-lab\nmkdir -p $d\n{extra}date +%s.%N > $d/$MPROV_SCRIPT\n"
    )
}

/// n01's post-boot scripts from every layer: the distro (a new distro of
/// the lab image), its group (two at once, and one the group switches off
/// with `disable_scripts` as a single string), the image, and the system
/// itself (after the group's, reading its params).
fn post_boot_scripts(stack: &Stack, node: &Node) -> Result<()> {
    let api = |method: &str, path: &str, body: serde_json::Value| {
        stack
            .control
            .api(method, path, Some(&body))
            .with_context(|| format!("{method} {path} {body}"))
    };
    // Each waits (bounded) for the other's start in the same run before it
    // ends: a run's start files are named by its own folder (the runner
    // makes one per run), so a rerun never meets the files of an earlier
    // run. A start file appears only once its time is in it (written
    // aside, renamed).
    let together = |other: &str| {
        marker_script(&format!(
            "run=$(basename \"$(dirname \"$MPROV_PARAMS\")\")\ndate +%s.%N > $d/$MPROV_SCRIPT.t\ncp $d/$MPROV_SCRIPT.t $d/$run.$MPROV_SCRIPT.t\nmv $d/$run.$MPROV_SCRIPT.t $d/$run.$MPROV_SCRIPT.start\nmv $d/$MPROV_SCRIPT.t $d/$MPROV_SCRIPT.start\ni=0\nwhile [ ! -e $d/$run.{other}.start ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n"
        ))
    };
    let scripts = [
        ("lab-distro", marker_script(""), json_list(&[])),
        ("lab-group-a", together("lab-group-b"), json_list(&[])),
        ("lab-group-b", together("lab-group-a"), json_list(&[])),
        ("lab-off", marker_script(""), json_list(&[])),
        ("lab-image", marker_script(""), json_list(&["lab-distro"])),
        (
            "lab-system",
            marker_script(
                "cat > $d/lab-system.stdin\ncp \"$MPROV_PARAMS\" $d/lab-system.params\necho \"$MPROV_HOST $MPROV_GROUPS\" > $d/lab-system.who\n",
            ),
            json_list(&["lab-group-a", "lab-group-b"]),
        ),
    ];
    for (slug, content, deps) in scripts {
        api(
            "POST",
            "/api/v1/scripts/",
            serde_json::json!({"slug": slug, "script_type": "post-boot", "content": content, "depends_on": deps}),
        )?;
    }
    api(
        "POST",
        "/api/v1/distros/",
        serde_json::json!({"slug": "lab-debian", "vendor": "Debian", "version": "13", "scripts": ["lab-distro"]}),
    )?;
    api(
        "PATCH",
        &format!("/api/v1/images/{}", stack.image.slug),
        serde_json::json!({"distro": "lab-debian", "scripts": ["lab-image"]}),
    )?;
    api(
        "POST",
        "/api/v1/groups/",
        serde_json::json!({"slug": "lab-racks", "systems": [node.hostname],
            "scripts": ["lab-group-a", "lab-group-b", "lab-off"],
            "config_params": "disable_scripts: lab-off\n"}),
    )?;
    api(
        "PATCH",
        &format!("/api/v1/systems/{}", node.hostname),
        serde_json::json!({"scripts": ["lab-system"], "config_params": "lab_param: 42\n"}),
    )?;
    Ok(())
}

fn json_list(items: &[&str]) -> serde_json::Value {
    serde_json::json!(items)
}

/// What the scripts left on the node, from its export: every script of
/// every layer ran, the disabled one did not, the group's two overlapped
/// (each started before the other ended: the times they wrote), the
/// dependencies ran first, and the system's script got its own params.
fn scripts_ran_as_planned(export: &BTreeMap<String, Vec<u8>>) -> Result<()> {
    let time = |name: &str| -> Result<f64> {
        let bytes = export
            .get(&format!("script-{name}"))
            .with_context(|| format!("{name} left nothing: {:?}", export.keys()))?;
        String::from_utf8_lossy(bytes)
            .trim()
            .parse()
            .with_context(|| format!("{name}: {:?}", String::from_utf8_lossy(bytes)))
    };
    ensure!(
        !export.contains_key("script-lab-off"),
        "lab-off is disabled by its group, yet it ran"
    );
    let (a0, a1) = (time("lab-group-a.start")?, time("lab-group-a")?);
    let (b0, b1) = (time("lab-group-b.start")?, time("lab-group-b")?);
    ensure!(
        a0 < b1 && b0 < a1,
        "lab-group-a ({a0}..{a1}) and lab-group-b ({b0}..{b1}) did not run at once"
    );
    ensure!(
        time("lab-distro")? < time("lab-image")?,
        "lab-image ran before lab-distro, which it depends on"
    );
    ensure!(
        a1 < time("lab-system")? && b1 < time("lab-system")?,
        "lab-system ran before the group's scripts it depends on"
    );
    let params = export
        .get("script-lab-system.params")
        .context("no params file")?;
    let params: serde_json::Value = serde_json::from_slice(params)?;
    ensure!(params["lab_param"] == 42, "the params: {params}");
    ensure!(
        export.get("script-lab-system.stdin") == export.get("script-lab-system.params"),
        "the params on standard input are not the file's"
    );
    let who =
        String::from_utf8_lossy(export.get("script-lab-system.who").context("who")?).into_owned();
    ensure!(who.trim() == "n01 lab-racks", "host and groups: {who:?}");
    Ok(())
}

/// Waits (bounded) until n01 has renewed its certificate: a revoked one
/// and a newer valid one, both for n01.
fn renewed(stack: &Stack, node: &Node) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(NODE_CERT_SECONDS + 60);
    loop {
        let listed = stack.control.api(
            "GET",
            &format!("/api/v1/credentials/?kind=node&identity={}", node.hostname),
            None,
        )?;
        let mine: Vec<&serde_json::Value> =
            listed["items"].as_array().into_iter().flatten().collect();
        let revoked = mine.iter().filter(|c| !c["revoked_at"].is_null()).count();
        let valid = mine.iter().filter(|c| c["revoked_at"].is_null()).count();
        if revoked >= 1 && valid >= 1 {
            eprintln!("n01 renewed its certificate: {mine:#?}");
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "n01 did not renew its {NODE_CERT_SECONDS} s certificate: {listed:#}\n{}",
            stack.where_it_stopped(node)
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// A failing script added to n01, then `mash systems run-scripts n01`: the
/// node's agent (polling with its renewed certificate) runs it, and the
/// timeline shows the script, its exit code and its output's tail, then
/// `failed`, which `mash boot status` shows too.
fn failing_rerun(stack: &Stack, node: &Node, bins: &mprov_tests::lab::Binaries) -> Result<()> {
    stack.control.api(
        "POST",
        "/api/v1/scripts/",
        Some(
            &serde_json::json!({"slug": "lab-fail", "script_type": "post-boot",
            "content": "#!/bin/sh\necho lab-fail: something went wrong >&2\nexit 3\n"}),
        ),
    )?;
    stack.control.api(
        "PATCH",
        &format!("/api/v1/systems/{}", node.hostname),
        Some(&serde_json::json!({"scripts": ["lab-system", "lab-fail"]})),
    )?;
    let mash = bins.get("mash")?;
    let mash_run = |args: &[&str]| {
        output(
            Command::new("ip")
                .args(["netns", "exec", stack.net.name()])
                .arg(&mash)
                .args(args)
                .env("MPROV_URL", stack.control.url())
                .env("MPROV_USER", "admin")
                .env("MPROV_PASSWORD", &stack.control.password),
        )
    };
    let (ok, text) = mash_run(&["systems", "run-scripts", "n01"])?;
    ensure!(ok, "mash systems run-scripts n01: {text}");
    let deadline = Instant::now() + Duration::from_secs(240);
    let events = loop {
        let events = stack.timeline(node)?;
        let failed_script = events
            .iter()
            .position(|e| e.phase == BootPhase::Script && e.detail.starts_with("lab-fail"));
        if failed_script.is_some_and(|i| events[i..].iter().any(|e| e.phase == BootPhase::Failed)) {
            break events;
        }
        ensure!(
            Instant::now() < deadline,
            "the rerun did not fail on the timeline: {:#?}",
            events
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    let script = events
        .iter()
        .find(|e| e.phase == BootPhase::Script && e.detail.starts_with("lab-fail"))
        .with_context(|| format!("no lab-fail script event: {events:#?}"))?;
    ensure!(
        script.detail.contains("failed, exit 3") && script.detail.contains("something went wrong"),
        "the exit code and the output's tail: {script:?}"
    );
    let after = events
        .iter()
        .skip_while(|e| e.id != script.id)
        .filter(|e| e.phase == BootPhase::Ready)
        .count();
    ensure!(after == 0, "ready after a failed script: {events:#?}");
    let (ok, text) = mash_run(&["boot", "status", "n01"])?;
    ensure!(ok, "mash boot status n01: {text}");
    ensure!(
        text.contains("lab-fail") && text.contains("failed"),
        "mash boot status shows the failed script: {text}"
    );
    Ok(())
}

/// Runs a command; its status and output.
fn output(cmd: &mut Command) -> Result<(bool, String)> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

/// The lab node's answer to its `i`-th request of [`NODE_PROBES`], made
/// on the node with its own certificate and key: the status and body.
fn probe(export: &BTreeMap<String, Vec<u8>>, i: usize) -> Result<(u16, String)> {
    let answer = export
        .get(&format!("probe-{i}"))
        .with_context(|| format!("no probe-{i} in the export"))?;
    let answer = String::from_utf8_lossy(answer);
    let (text, code) = answer
        .rsplit_once('\n')
        .with_context(|| format!("probe {i} {:?}: no status: {answer}", NODE_PROBES[i]))?;
    Ok((code.trim().parse()?, text.to_owned()))
}

/// The timeline once it holds `phase` (reports may trail the console).
pub(crate) fn timeline_with(
    stack: &Stack,
    node: &Node,
    phase: BootPhase,
) -> Result<Vec<BootEvent>> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let events = stack.timeline(node)?;
        if events.iter().any(|e| e.phase == phase) {
            return Ok(events);
        }
        if Instant::now() > deadline {
            bail!(
                "no {} on the timeline {:?}\n{}",
                phase.as_str(),
                phases(&events),
                stack.where_it_stopped(node)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What every boot to ready shows: multi-user under the node's name on the
/// console, the agent's steps, and a timeline holding `want` in order, each
/// step from its source (js1 for the firmware's DHCP and downloads, the
/// control service for the script, the node for its own steps).
/// How the agent's interface got its address, from two sides: the node's
/// own `agent_dhcp` event (which says where the address came from), and the
/// DHCP replies the job server's DHCP server reported sending the node's
/// MAC after its initramfs was fetched and before `switch_root` (one per
/// DISCOVER or REQUEST the agent sent; the firmware's come before).
pub(crate) fn agent_network(events: &[BootEvent]) -> Result<(&BootEvent, usize)> {
    let fetched = events
        .iter()
        .position(|e| e.phase == BootPhase::InitramfsFetched)
        .with_context(|| format!("no initramfs_fetched: {:?}", phases(events)))?;
    let until = events
        .iter()
        .position(|e| e.phase == BootPhase::SwitchRoot)
        .unwrap_or(events.len());
    let agent = events
        .iter()
        .find(|e| e.phase == BootPhase::AgentDhcp)
        .with_context(|| format!("no agent_dhcp: {:?}", phases(events)))?;
    let replies = events[fetched..until.max(fetched)]
        .iter()
        .filter(|e| matches!(e.phase, BootPhase::DhcpOffered | BootPhase::DhcpAcked))
        .count();
    Ok((agent, replies))
}

pub(crate) fn ready_with_timeline(
    stack: &Stack,
    node: &Node,
    booted: &Booted,
    want: &[BootPhase],
) -> Result<Vec<BootEvent>> {
    ensure!(
        booted
            .console
            .contains(&format!("{READY_MARKER}: {} multi-user", node.hostname)),
        "multi-user under the node's own host name on the console:\n{}",
        tail(&booted.console, 60)
    );
    for step in [
        "step 2: enrolled; mTLS from now on",
        "step 3: verified",
        "step 5: switch_root into",
    ] {
        ensure!(
            booted.console.contains(step),
            "{step:?} on the console:\n{}",
            tail(&booted.console, 80)
        );
    }
    let events = timeline_with(stack, node, BootPhase::Ready)?;
    in_order(&events, want).with_context(|| stack.where_it_stopped(node))?;
    let source = |p: BootPhase| {
        events
            .iter()
            .find(|e| e.phase == p)
            .map(|e| e.source.clone())
            .unwrap_or_default()
    };
    for phase in [
        BootPhase::DhcpAcked,
        BootPhase::KernelFetched,
        BootPhase::InitramfsFetched,
    ] {
        ensure!(
            source(phase).contains("js1"),
            "{} comes from the job server js1: {events:#?}",
            phase.as_str()
        );
    }
    ensure!(source(BootPhase::ScriptServed) == "control", "{events:#?}");
    for phase in [BootPhase::Enrolled, BootPhase::Verified, BootPhase::Ready] {
        ensure!(
            source(phase).contains(&node.hostname),
            "{} comes from the node itself: {events:#?}",
            phase.as_str()
        );
    }
    // The agent's own count of what it reported from the initramfs (its
    // reporter thread, batched while a post was in flight) is what the
    // timeline holds from the node up to its switch_root.
    let (told, posts) = events_reported(&booted.console).with_context(|| {
        format!(
            "the agent's count of its boot events on the console:\n{}",
            tail(&booted.console, 80)
        )
    })?;
    let switched = events
        .iter()
        .position(|e| e.phase == BootPhase::SwitchRoot)
        .with_context(|| format!("no switch_root: {events:#?}"))?;
    let stored = events[..=switched]
        .iter()
        .filter(|e| e.source == format!("node:{}", node.hostname))
        .count();
    ensure!(
        told == stored && (1..=told).contains(&posts),
        "the agent says {told} events in {posts} requests; the timeline holds {stored} from it up to switch_root: {events:#?}"
    );
    Ok(events)
}

/// "step 5: N boot events reported in M requests" on the console: (N, M).
fn events_reported(console: &str) -> Option<(usize, usize)> {
    console.lines().find_map(|line| {
        let rest = line.split("step 5: ").nth(1)?;
        let (told, rest) = rest.split_once(" boot events reported in ")?;
        let posts = rest.trim_end().strip_suffix(" requests")?;
        Some((told.parse().ok()?, posts.parse().ok()?))
    })
}

/// Both lab services' open-file limit, soft and hard, in the flooded boot:
/// a systemd service's default soft limit.
const FLOOD_FILE_LIMIT: u64 = 1024;
/// Idle connections held against each flooded port: more than either
/// service's cap under [`FLOOD_FILE_LIMIT`] files.
const FLOOD_IDLE: usize = 1100;
/// Slow request heads held against each flooded port.
const FLOOD_SLOW: usize = 8;
/// The job server's HTTP (image) port.
const JOBSERVER_HTTP_PORT: u16 = mprov_api::boot::DEFAULT_HTTP_PORT;
/// What the control service logs when its connection cap is reached.
const CONTROL_CAP_WARNING: &str = "the most allowed (MPROV_MAX_CONNECTIONS)";
/// What the job server's file server logs when its cap is reached.
const JOBSERVER_CAP_WARNING: &str = "HTTP file server: ";
/// ... followed, on the same line, by this.
const JOBSERVER_CAP_WARNING_TAIL: &str = "connections open, its limit";

/// Floods the control service's HTTP and HTTPS ports and js1's HTTP port
/// from inside the lab namespace, once the flood's sockets fit the test's
/// own file limit (raised to its hard limit).
fn start_flood(stack: &Stack) -> Result<Flood> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let targets: Vec<std::net::SocketAddr> =
        [CONTROL_PORT, CONTROL_HTTPS_PORT, JOBSERVER_HTTP_PORT]
            .iter()
            .map(|port| format!("{SERVER_IP}:{port}").parse())
            .collect::<Result<_, _>>()?;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let need = u64::try_from(targets.len() * (FLOOD_IDLE + FLOOD_SLOW))? + 1024;
    if soft < need && hard > soft {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE)?;
    ensure!(
        soft >= need,
        "the flood needs {need} open files in the test; its limit is {soft}"
    );
    let flood = Flood::start(
        &stack.net.ns.path(),
        FloodSpec {
            targets,
            idle: FLOOD_IDLE,
            slow: FLOOD_SLOW,
            reopen_per_round: 500,
            limit: Duration::from_secs(30 * 60),
        },
    )?;
    // Held before the VM powers on: the first rounds open them all.
    let deadline = Instant::now() + Duration::from_secs(60);
    while flood
        .counts
        .iter()
        .any(|c| c.opened.load(Ordering::Relaxed) < u64::try_from(FLOOD_IDLE).unwrap_or(0))
    {
        ensure!(
            Instant::now() < deadline,
            "the flood did not open {FLOOD_IDLE} connections per port within 60 s: {:?}",
            flood.counts
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("flood: {:?}", flood.counts);
    Ok(flood)
}

/// Stops the flood and checks both services logged their cap warning.
fn stop_flood(stack: &Stack, flood: Flood) -> Result<()> {
    let counts = format!("{:?}", flood.counts);
    flood.stop()?;
    eprintln!("flood, at its end: {counts}");
    let control = stack.control.log();
    ensure!(
        control.contains(CONTROL_CAP_WARNING),
        "the control service logged no connection-cap warning under the flood ({counts}):\n{}",
        tail(&control, 30)
    );
    let js1 = stack.jobservers.first().context("js1")?.log();
    ensure!(
        js1.lines()
            .any(|l| l.contains(JOBSERVER_CAP_WARNING) && l.contains(JOBSERVER_CAP_WARNING_TAIL)),
        "the job server logged no connection-cap warning under the flood ({counts}):\n{}",
        tail(&js1, 30)
    );
    Ok(())
}

/// SeaBIOS + iPXE ROM, on the real Debian root, through our stack only:
/// `mprov-control serve` and `mprov-jobserver` (enrolled with a one-time
/// token, following the control service over HTTPS) in a lab namespace, the
/// node registered through the API. QEMU powers on; our DHCP leases it its
/// address; iPXE chains to `/ipxe/`, which hands out a nonce only because
/// the job server reported that lease; the kernel and the image's agent
/// initramfs come from the job server; the agent takes its own lease,
/// enrolls with the nonce, reads its manifest, streams and verifies the
/// image and switches root; systemd reaches multi-user and `mprov-agent
/// ready` reports with the node's certificate. Then, on the same boot:
/// - the timeline is complete and in order, each event from its source;
/// - the node's certificate (copied out of the VM, its key never) names
///   only itself, its key is 0600, and with them the node itself (the lab
///   root's `NODE_PROBES`, answers copied out) reads its own row but not
///   another node's, and cannot write another node's timeline;
/// - a second boot of the same kernel and agent initramfs with the first
///   boot's command line (its nonce spent), straight from QEMU, is refused:
///   the agent says so on its console and the refusal is on the timeline;
/// - `mash boot status` prints the timeline.
///
/// All of it up to `mash boot status` happens under a connection flood
/// (issue 21): both services run under a 1,024-file limit (soft and hard),
/// and from inside the lab namespace up to [`FLOOD_IDLE`] idle connections
/// and [`FLOOD_SLOW`] slow request heads are held against the control
/// service's HTTP and HTTPS ports and the job server's HTTP port, reopened
/// as the servers close them (their deadlines, their caps), at most 500 a
/// second per port: more than either cap allows. The boot still
/// reaches ready, and both services logged their connection-cap warning.
#[test]
fn vm_is_provisioned_by_our_stack_from_power_on_to_ready() -> Result<()> {
    let _turn = VM_TURN.lock().unwrap_or_else(|e| e.into_inner());
    let (bins, image) = image()?;
    let run = tempfile::tempdir()?;
    let stack = Stack::start(
        &bins,
        &image,
        run.path(),
        &StackOptions {
            file_limit: Some(FLOOD_FILE_LIMIT),
            // Short-lived node certificates: the booted node renews its own.
            control_env: vec![("MPROV_NODE_CERT_SECONDS", NODE_CERT_SECONDS.to_string())],
            ..StackOptions::default()
        },
    )?;
    let node = stack.register("n01", "52:54:00:e2:00:01", "10.99.0.41", true)?;
    // Another node, never booted: n01's certificate must not reach it.
    let other = stack.register("n02", "52:54:00:e2:00:02", "10.99.0.42", true)?;
    post_boot_scripts(&stack, &node)?;
    let flood = start_flood(&stack)?;

    let started = Instant::now();
    let booted = stack.boot(&node, Machine::BiosIpxe, print_event)?;
    eprintln!("n01: {READY_MARKER} after {:.0?}", started.elapsed());
    // Console and timeline: complete, in order, each step from its source.
    let events = ready_with_timeline(&stack, &node, &booted, HEALTHY)?;
    ensure!(
        !events
            .iter()
            .any(|e| matches!(e.phase, BootPhase::Failed | BootPhase::ChecksumMismatch)),
        "a healthy boot reported a failure: {events:#?}"
    );
    // The agent took the lease iPXE carried on the kernel command line and
    // sent no DHCP: the job server answered no DHCP of the node's between
    // the initramfs and switch_root.
    let (agent, replies) = agent_network(&events)?;
    ensure!(
        agent
            .detail
            .contains("from the lease iPXE carried (no DHCP sent)")
            && agent.detail.contains(&node.ip),
        "the agent's address came from the carried lease: {agent:?}"
    );
    ensure!(
        replies == 0,
        "the job server answered {replies} DHCP packets of the agent: {:?}",
        phases(&events)
    );
    // Its post-boot scripts ran before it was ready, each reported.
    let ran: Vec<&BootEvent> = events
        .iter()
        .filter(|e| e.phase == BootPhase::Script)
        .collect();
    for script in SCRIPTS_RUN {
        ensure!(
            ran.iter()
                .any(|e| e.detail.starts_with(&format!("{script}: success"))),
            "no successful {script} on the timeline: {ran:#?}"
        );
    }
    ensure!(
        !ran.iter().any(|e| e.detail.contains("lab-off")),
        "the disabled script ran: {ran:#?}"
    );
    // Nothing of n01 landed on n02's timeline.
    ensure!(
        stack.timeline(&other)?.is_empty(),
        "n02 never booted: {:?}",
        stack.timeline(&other)?
    );

    // What the node shows, copied out of the VM on its second serial port:
    // its certificate, and the answers to its own requests (its key stays
    // on the node).
    let export = booted.vm.export(Duration::from_secs(120))?;
    ensure!(
        !export.contains_key("node.key"),
        "the node's private key left the node"
    );
    let files = run.path().join("node-files");
    std::fs::create_dir_all(&files)?;
    let cert = export
        .get("node.crt")
        .context("no node.crt in the export")?;
    std::fs::write(files.join("node.crt"), cert)?;
    let key_mode =
        String::from_utf8_lossy(export.get("key-mode").context("key mode")?).into_owned();
    ensure!(
        key_mode == "600",
        "the node's key is mode {key_mode}, not 600"
    );

    // The certificate names n01 and nothing else.
    let (ok, text) = output(
        Command::new("openssl")
            .args([
                "x509",
                "-noout",
                "-subject",
                "-ext",
                "subjectAltName",
                "-in",
            ])
            .arg(files.join("node.crt")),
    )?;
    ensure!(ok, "openssl x509: {text}");
    ensure!(
        text.contains(&format!("CN={}", node.hostname))
            || text.contains(&format!("CN = {}", node.hostname)),
        "the certificate's subject names {}: {text}",
        node.hostname
    );
    for line in text
        .lines()
        .filter(|l| l.contains("DNS:") || l.contains("IP"))
    {
        for name in line.split(',').map(str::trim) {
            ensure!(
                name.trim_start_matches("DNS:").starts_with(&node.hostname),
                "the certificate names {name:?} beside {}: {text}",
                node.hostname
            );
        }
    }
    ensure!(!text.contains(&other.hostname), "{text}");

    // With it, on the node: its own row, yes; another node's, no; no admin
    // reads; nor writing n02's timeline.
    ensure!(
        other.hostname == PROBED_OTHER,
        "the probes try {PROBED_OTHER}"
    );
    let (code, body) = probe(&export, 0)?;
    ensure!(code == 200, "n01 reads its own row: HTTP {code} {body}");
    ensure!(body.contains("\"n01\""), "{body}");
    for (i, (method, path, _)) in NODE_PROBES.iter().enumerate().skip(1) {
        let (code, body) = probe(&export, i)?;
        if *method == "GET" {
            ensure!(
                code == 403,
                "n01's certificate must not read {path}: HTTP {code} {body}"
            );
        }
        ensure!(
            !body.contains("52:54:00:e2:00:02"),
            "{method} {path} leaked n02: {body}"
        );
    }
    ensure!(
        stack.timeline(&other)?.is_empty(),
        "n01 wrote n02's timeline: {:?}",
        probe(&export, NODE_PROBES.len() - 1)?
    );

    // mash shows the same timeline (its last boot).
    let mash = bins.get("mash")?;
    let (ok, text) = output(
        Command::new("ip")
            .args(["netns", "exec", stack.net.name()])
            .arg(&mash)
            .args(["boot", "status", "n01"])
            .env("MPROV_URL", stack.control.url())
            .env("MPROV_USER", "admin")
            .env("MPROV_PASSWORD", &stack.control.password),
    )?;
    ensure!(ok, "mash boot status n01: {text}");
    for phase in HEALTHY {
        ensure!(
            text.contains(phase.as_str()),
            "mash boot status shows {}: {text}",
            phase.as_str()
        );
    }
    scripts_ran_as_planned(&export)?;
    // All of that under the flood, which both services felt.
    stop_flood(&stack, flood)?;
    // The node renews its short-lived certificate itself; the old one is
    // revoked; a run asked for afterwards is fetched and reported with the
    // new one, and its failing script leaves the node failed.
    renewed(&stack, &node)?;
    failing_rerun(&stack, &node, &bins)?;
    // The first boot's command line replayed by a second boot: the same
    // kernel, agent initramfs and command line (its nonce spent), straight
    // from QEMU with no firmware and no /ipxe/. The agent takes its lease
    // and tries to enroll; the control service refuses the spent nonce and
    // puts the refusal on the node's timeline; the agent says so on its
    // console and retries, and never gets further.
    let cmdline = String::from_utf8_lossy(export.get("cmdline").context("cmdline")?).into_owned();
    ensure!(
        cmdline
            .split_whitespace()
            .any(|w| w.starts_with("mprov_enroll=")),
        "no mprov_enroll= on {cmdline:?}"
    );
    ensure!(
        cmdline.contains(&format!(
            "mprov_url=https://{SERVER_IP}:{CONTROL_HTTPS_PORT}"
        )),
        "the agent talks to the HTTPS URL: {cmdline}"
    );
    // One VM with n01's MAC at a time.
    drop(booted);
    let mut replay = stack.boot_direct(&node, cmdline.trim())?;
    let console = replay
        .wait_for("mprov-agent: retrying in", Duration::from_secs(300))
        .with_context(|| stack.where_it_stopped(&node))?;
    ensure!(
        console.contains("mprov-agent: FATAL: step 2") && console.contains("already used"),
        "the replayed boot's agent says its enrollment was refused:\n{}",
        tail(&console, 40)
    );
    ensure!(
        !console.contains("step 2: enrolled"),
        "the replayed boot enrolled:\n{}",
        tail(&console, 40)
    );
    // The timeline is the last boot's: the replay's, which the job server
    // opened with its lease. It holds the refusal and no enrollment.
    let events = stack.timeline(&node)?;
    ensure!(
        events.iter().any(|e| e.phase == BootPhase::Failed
            && e.source == "control"
            && e.detail.contains("replayed boot command line")),
        "the replay is not on the timeline: {events:#?}"
    );
    ensure!(
        !events
            .iter()
            .any(|e| matches!(e.phase, BootPhase::Enrolled | BootPhase::Ready)),
        "the replayed boot enrolled: {:?}",
        phases(&events)
    );
    drop(replay);
    Ok(())
}
