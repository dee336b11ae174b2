//! `cargo xtask bench netboot [--smoke]`: time to ready of the same Debian
//! root on the same VM (SeaBIOS + iPXE, virtio, 3 GiB, 2 CPUs, TCG), from power-on
//! to the root's ready marker, three ways in one run (see [`Way`]):
//!
//! - ours, the whole stack: our DHCP, `/ipxe/` (attested by the lease),
//!   kernel and agent initramfs from the job server, the lease iPXE carried
//!   to the agent (no second DHCP),
//!   enrollment, manifest, streamed and verified `rootfs.tar.zst`,
//!   `switch_root`, and `mprov-agent ready` with the node's certificate;
//! - ours again on a second stack with `MPROV_IPXE_CARRY_LEASE=0`, the
//!   agent asking DHCP itself in the initramfs: what carrying the lease
//!   does to the time to ready (each boot's `agent_dhcp` event is checked
//!   to say which way the agent got its address);
//! - the whole root as one cpio initrd (Warewulf's way);
//! - a busybox initramfs streaming `wget | zstd -d | tar x`.
//!
//! The incumbents are served by a standalone job server (our DHCP, TFTP and
//! HTTP: the same transport, so only the boot method differs). The rounds
//! take turns (cpio, stream, ours, then again), so a change in the machine's
//! load falls on every way alike. Reported: each way's median time to ready,
//! ours / cpio, ours / stream and carried / agent DHCP, and the serving
//! processes' CPU per boot,
//! counted exactly by `perf stat -e task-clock` attached to them (all their
//! threads, the control service's signing helper included) from power-on to
//! ready. Ours is checked to have really verified and reported ready: the
//! timeline, read after the count stops, holds `verified` and `ready`.
//!
//! `--smoke` boots only ours, once each way (lease carried, agent's DHCP),
//! on the busybox smoke root (a few MB to stream), with the same counting
//! and checks: it proves the benchmark runs, its figures mean nothing. `MPROV_NETBOOT_ROUNDS` sets the rounds of a full
//! run (default 3).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mprov_api::boot::BootPhase;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::lab::{self, Binaries};
use crate::netboot::{Booted, IncumbentLab, Machine, Stack, StackOptions, Way, tail, wait_ready};

/// The incumbents' node.
const INCUMBENT_MAC: &str = "52:54:00:99:01:01";

/// One way's boots.
#[derive(Debug)]
struct Series {
    way: Way,
    /// Time to ready and the servers' CPU time of each boot.
    boots: Vec<(Duration, Duration)>,
    /// Why a boot failed (the way's later rounds are skipped).
    failure: Option<String>,
}

/// Runs the benchmark (see the module docs).
pub fn run(smoke: bool) -> Result<()> {
    // Debug builds of the servers, as the lab tests use (and the image
    // cache is keyed by): the CPU figures are upper bounds.
    let bins = Binaries::in_dir(crate::control::build(
        &[
            "mprov-control",
            "mprov-boot",
            "mprov-image",
            "mprov-initramfs",
        ],
        true,
    )?);
    let agent = crate::agent::build_static()?;
    which("perf", "linux-perf")?;
    let tmp = tempfile::tempdir()?;
    let our_stack = |image: &lab::Image, way: Way| {
        let (dir, control_env) = match way {
            Way::MprovAgentDhcp => (
                "mprov-agent-dhcp",
                vec![("MPROV_IPXE_CARRY_LEASE", "0".to_owned())],
            ),
            _ => ("mprov", Vec::new()),
        };
        Stack::start(
            &bins,
            image,
            &tmp.path().join(dir),
            &StackOptions {
                control_env,
                ..StackOptions::default()
            },
        )
    };
    let series = |way: Way| Series {
        way,
        boots: Vec::new(),
        failure: None,
    };
    if smoke {
        let image = lab::busybox_image(&bins, &agent.path, &tmp.path().join("images"))?;
        let mut all = Vec::new();
        for way in [Way::Mprov, Way::MprovAgentDhcp] {
            let stack = our_stack(&image, way)?;
            let mut series = series(way);
            boot_ours(&stack, 0, tmp.path(), &mut series)?;
            all.push(series);
        }
        return report(&all, 1, "busybox smoke root (figures mean nothing)");
    }

    let rounds: usize = match std::env::var("MPROV_NETBOOT_ROUNDS") {
        Ok(n) => n.parse().context("MPROV_NETBOOT_ROUNDS is not a number")?,
        Err(_) => 3,
    };
    ensure!(rounds > 0, "MPROV_NETBOOT_ROUNDS must be at least 1");
    let image = lab::debian_image(&bins, &agent.path)?;
    let incumbents = IncumbentLab::start(
        &bins,
        &image,
        &tmp.path().join("incumbents"),
        &[INCUMBENT_MAC],
    )?;
    let stack = our_stack(&image, Way::Mprov)?;
    let dhcp_stack = our_stack(&image, Way::MprovAgentDhcp)?;
    let mut all: Vec<Series> = [Way::Cpio, Way::Stream, Way::Mprov, Way::MprovAgentDhcp]
        .into_iter()
        .map(series)
        .collect();
    for round in 0..rounds {
        for series in &mut all {
            if series.failure.is_some() {
                continue;
            }
            match series.way {
                Way::Mprov => boot_ours(&stack, round, tmp.path(), series)?,
                Way::MprovAgentDhcp => boot_ours(&dhcp_stack, round, tmp.path(), series)?,
                Way::Cpio | Way::Stream => boot_incumbent(&incumbents, round, tmp.path(), series)?,
            }
        }
    }
    report(&all, rounds, "the lab's Debian root (systemd, multi-user)")?;
    drop(stack);
    drop(dhcp_stack);
    drop(incumbents);
    Ok(())
}

/// One boot of an incumbent way, counted.
fn boot_incumbent(lab: &IncumbentLab, round: usize, tmp: &Path, series: &mut Series) -> Result<()> {
    let counter = CpuCounter::start(&lab.server_pids(), &tmp.join(format!("cpu-{round}.perf")))?;
    let booted = lab.boot(series.way, Machine::BiosIpxe, INCUMBENT_MAC);
    // A boot that failed at once may leave nothing counted: its own error
    // says more than the counter's.
    let cpu = counter.stop();
    match booted {
        Ok(mut booted) => {
            let cpu = cpu?;
            note(series.way, round, &booted, cpu);
            series.boots.push((booted.ready_after, cpu));
            // The root powers the VM off by itself (mprov_lab_poweroff).
            booted.vm.wait_exit(Duration::from_secs(120))?;
        }
        Err(err) => series.failure = Some(format!("{err:#}")),
    }
    Ok(())
}

/// One boot of our stack, counted, on a node of its own (a node's nonce is
/// spent once): power-on to the ready marker, then its timeline checked.
fn boot_ours(stack: &Stack, round: usize, tmp: &Path, series: &mut Series) -> Result<()> {
    let (name, mac_byte) = match series.way {
        Way::MprovAgentDhcp => ("dhcp", 3),
        _ => ("bench", 2),
    };
    let node = stack.register(
        &format!("{name}{:02}", round + 1),
        &format!("52:54:00:99:{mac_byte:02x}:{:02x}", round + 1),
        &format!("10.99.0.{}", 31 + round),
        true,
    )?;
    let counter = CpuCounter::start(
        &stack.server_pids(),
        &tmp.join(format!("cpu-ours-{round}.perf")),
    )?;
    let started = Instant::now();
    let booted = stack.power_on(&node, Machine::BiosIpxe).and_then(|mut vm| {
        let console = wait_ready(&mut vm)?;
        Ok(Booted {
            ready_after: started.elapsed(),
            console,
            vm,
        })
    });
    let cpu = counter.stop();
    let booted = match booted {
        Ok(booted) => booted,
        Err(err) => {
            series.failure = Some(format!("{err:#}\n{}", stack.where_it_stopped(&node)));
            return Ok(());
        }
    };
    let cpu = cpu?;
    // Enrollment, verification and the ready report really happened on this
    // boot (read after the count, so the polling costs nothing counted).
    let events = stack.timeline(&node)?;
    let phases: Vec<BootPhase> = events.iter().map(|e| e.phase).collect();
    for want in [BootPhase::Enrolled, BootPhase::Verified, BootPhase::Ready] {
        if !phases.contains(&want) {
            series.failure = Some(format!(
                "ready on the console but no {} on the timeline:\n{}",
                want.as_str(),
                stack.where_it_stopped(&node)
            ));
            return Ok(());
        }
    }
    // The agent got its address the way this series measures.
    let carried = events
        .iter()
        .find(|e| e.phase == BootPhase::AgentDhcp)
        .map(|e| e.detail.contains("from the lease iPXE carried"));
    let want = series.way == Way::Mprov;
    if carried != Some(want) {
        series.failure = Some(format!(
            "the agent's address did not come {} the carried lease:\n{}",
            if want { "from" } else { "without" },
            stack.where_it_stopped(&node)
        ));
        return Ok(());
    }
    note(series.way, round, &booted, cpu);
    series.boots.push((booted.ready_after, cpu));
    Ok(())
}

/// A line per boot as it happens.
fn note(way: Way, round: usize, booted: &Booted, cpu: Duration) {
    let uptime = booted
        .console
        .lines()
        .find(|l| l.contains(lab::READY_MARKER))
        .unwrap_or("")
        .trim();
    eprintln!(
        "netboot round {}: {}: ready after {:.1} s, servers' CPU {:.3} s ({uptime})",
        round + 1,
        way.name(),
        booted.ready_after.as_secs_f64(),
        cpu.as_secs_f64()
    );
}

/// The median of `values`.
fn median(values: impl Iterator<Item = Duration>) -> Option<Duration> {
    let mut values: Vec<Duration> = values.collect();
    values.sort();
    values.get(values.len() / 2).copied()
}

/// Prints the table; fails if a way did not reach ready.
fn report(all: &[Series], rounds: usize, root: &str) -> Result<()> {
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "\nnetboot, power-on to ready: {root}; SeaBIOS + iPXE, virtio, {} MiB, {} CPUs, TCG; \
         {rounds} round(s), medians; load average {}",
        lab::DEBIAN_NODE.memory_mib,
        lab::DEBIAN_NODE.cpus,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let ready = |way: Way| {
        all.iter()
            .find(|s| s.way == way && s.failure.is_none())
            .and_then(|s| median(s.boots.iter().map(|b| b.0)))
    };
    let ours = ready(Way::Mprov);
    let mut failed = Vec::new();
    for series in all {
        let (Some(time), None) = (median(series.boots.iter().map(|b| b.0)), &series.failure) else {
            println!(
                "  {:<52} did not reach ready: {}",
                series.way.name(),
                series
                    .failure
                    .as_deref()
                    .map(|f| tail(f, 20))
                    .unwrap_or_default()
            );
            failed.push(series.way.name());
            continue;
        };
        let cpu = median(series.boots.iter().map(|b| b.1)).unwrap_or_default();
        let all_times: Vec<String> = series
            .boots
            .iter()
            .map(|b| format!("{:.1}", b.0.as_secs_f64()))
            .collect();
        println!(
            "  {:<52} {:>6.1} s (runs {} s), servers' CPU {:.3} s per boot",
            series.way.name(),
            time.as_secs_f64(),
            all_times.join(" / "),
            cpu.as_secs_f64()
        );
    }
    if let Some(ours) = ours {
        for (way, what) in [
            (Way::Cpio, "cpio"),
            (Way::Stream, "stream"),
            (Way::MprovAgentDhcp, "ours with the agent's DHCP"),
        ] {
            if let Some(theirs) = ready(way) {
                println!(
                    "  ours / {what}: {:.2}x the time to ready{}",
                    ours.as_secs_f64() / theirs.as_secs_f64(),
                    if way == Way::Cpio {
                        " (goal: at most 1.0x)"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    if !failed.is_empty() {
        bail!("did not reach ready: {}", failed.join(", "));
    }
    Ok(())
}

/// Fails when `tool` is not on the PATH, naming its Debian package.
fn which(tool: &str, package: &str) -> Result<()> {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .with_context(|| format!("looking for {tool}"))?;
    ensure!(
        found.success(),
        "{tool} is missing (apt-get install {package})"
    );
    Ok(())
}

/// `pids` and every process below them (the control service's signing
/// helper), from `/proc`.
fn with_descendants(pids: &[u32]) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // `pid (comm) state ppid ...`: comm may hold spaces, so after ')'.
            let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parents.push((pid, ppid));
            }
        }
    }
    let mut out = pids.to_vec();
    let mut i = 0;
    while i < out.len() {
        let parent = out[i];
        for (pid, _) in parents.iter().filter(|(_, ppid)| *ppid == parent) {
            if !out.contains(pid) {
                out.push(*pid);
            }
        }
        i += 1;
    }
    out
}

/// `perf stat -e task-clock` attached to running processes (all their
/// threads, and threads they start while counted): the CPU time they spend
/// between [`CpuCounter::start`] and [`CpuCounter::stop`].
#[derive(Debug)]
struct CpuCounter {
    perf: Child,
    out: PathBuf,
}

impl CpuCounter {
    /// Attaches to `pids` and their descendants.
    fn start(pids: &[u32], out: &Path) -> Result<CpuCounter> {
        let pids = with_descendants(pids);
        ensure!(!pids.is_empty(), "no server process to count");
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        let perf = Command::new("perf")
            .args([
                "stat",
                "-x,",
                "-e",
                "task-clock",
                "-p",
                &list.join(","),
                "-o",
            ])
            .arg(out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting perf stat (apt-get install linux-perf)")?;
        let mut counter = CpuCounter {
            perf,
            out: out.to_owned(),
        };
        // perf has attached once it holds its counters' descriptors
        // (`anon_inode:[perf_event]`); in CSV mode it writes nothing before
        // it stops, so the output file cannot tell.
        let fds = PathBuf::from(format!("/proc/{}/fd", counter.perf.id()));
        let attached = || {
            fs::read_dir(&fds).is_ok_and(|dir| {
                dir.flatten().any(|fd| {
                    fs::read_link(fd.path())
                        .is_ok_and(|target| target.to_string_lossy().contains("perf_event"))
                })
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !attached() {
            if let Some(status) = counter.perf.try_wait()? {
                bail!("perf stat exited with {status} before counting");
            }
            ensure!(
                Instant::now() < deadline,
                "perf stat did not attach within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        Ok(counter)
    }

    /// Stops counting (SIGINT, as Ctrl-C) and returns the CPU time counted.
    fn stop(mut self) -> Result<Duration> {
        let pid = Pid::from_raw(i32::try_from(self.perf.id())?);
        kill(pid, Signal::SIGINT).context("stopping perf stat")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.perf.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = self.perf.kill();
                let _ = self.perf.wait();
                bail!("perf stat did not stop within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let text = fs::read_to_string(&self.out)
            .with_context(|| format!("reading {}", self.out.display()))?;
        task_clock(&text).with_context(|| format!("perf stat counted no task-clock:\n{text}"))
    }
}

/// The task-clock total of `perf stat -x,` output (milliseconds, one line
/// per counted event, or per process).
fn task_clock(text: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut found = false;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() > 2
            && fields[2] == "task-clock"
            && let Ok(ms) = fields[0].parse::<f64>()
        {
            total += ms;
            found = true;
        }
    }
    found
        .then(|| Duration::try_from_secs_f64(total / 1000.0).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_clock_sums_perf_lines() {
        let text = "# started on Wed Dec  2 01:00:00 2026\n\n1234.50,msec,task-clock,1234500000,100.00,0.617,CPUs utilized\n";
        assert_eq!(task_clock(text), Some(Duration::from_micros(1_234_500)));
        // A counter that never ran prints `<not counted>`: no figure.
        assert_eq!(
            task_clock("<not counted>,msec,task-clock,0,100.00,,\n"),
            None
        );
        assert_eq!(task_clock("# started\n"), None);
    }

    #[test]
    fn descendants_include_children() -> Result<()> {
        let mut child = Command::new("sleep").arg("30").spawn()?;
        let me = std::process::id();
        let found = with_descendants(&[me]);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found[0], me);
        assert!(found.contains(&child.id()), "{found:?}");
        Ok(())
    }
}
