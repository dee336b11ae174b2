//! `jobserver.yaml` and the logs, with the real `mprov-jobserver`: a
//! seed-style setup (the file rendered from `MPROV_*`, a `dnsmasq` plugin
//! file pulled in by `!include plugins/*.yaml`, the seed's module names)
//! starts exactly the servers it asks for; `-r` runs once and exits 0; a
//! broken file (malformed YAML, an unknown key, a wrong type, a missing
//! include) stops the start with its file and line; and the log, written
//! to a file, has no colour escapes and, when `JOURNAL_STREAM` names that
//! file, a syslog priority on every line, so that what `journalctl -p
//! warning` keeps is the warnings and errors only. (journald itself does not
//! run in the test container: the priorities are read from the stream.)

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use mprov_tests::netns::Netns;

use crate::{spawn_standalone, standalone_jobserver};

/// A folder with an empty boot config, an iPXE folder and a config folder
/// (`cfg/`, with `plugins/dnsmasq.yaml` turning DNS off).
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Result<Setup> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("cfg/plugins"))?;
        std::fs::create_dir_all(dir.path().join("ipxe"))?;
        std::fs::write(dir.path().join("boot.json"), r#"{"revision": 1}"#)?;
        std::fs::write(
            dir.path().join("cfg/plugins/dnsmasq.yaml"),
            "# the seed's plugin file\n- dnsmasq:\n    enableDHCP: true\n    enableDNS: false\n    enableTFTP: true\n",
        )?;
        Ok(Setup { dir })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `mprov-jobserver` in `ns` on the standalone boot config, every
    /// server on 127.0.0.1 port 0, its config folder `cfg/`, the
    /// environment of a seed-style container, its log in `log`.
    fn jobserver(&self, ns: &Netns, log: &Path) -> Result<Command> {
        let mut cmd = standalone_jobserver(ns, &self.path("boot.json"), log)?;
        cmd.env("MPROV_CONFIG_DIR", self.path("cfg"))
            .env("MPROV_URL", "http://127.0.0.1:9/")
            .env("MPROV_APIKEY", "seed-secret-key")
            .env("MPROV_ADDRESS", "127.0.0.1")
            .env(
                "MPROV_MODS",
                "repo-update dnsmasq mprov-webserver image-delete",
            )
            .env_remove("MPROV_ARGS")
            .env_remove("MPROV_LOG")
            .env_remove("JOURNAL_STREAM")
            .args(["--no-ra", "--dhcp", "127.0.0.1:0", "--tftp", "127.0.0.1:0"])
            .args(["--dns", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .args(["--metrics", "127.0.0.1:0"])
            .arg("--tftp-root")
            .arg(self.path("ipxe"))
            .arg("--export")
            .arg(self.path("export"))
            .arg("--state-dir")
            .arg(self.path("state"));
        Ok(cmd)
    }
}

/// Waits (up to 20 s) for `child` to exit.
fn exit_status(child: &mut std::process::Child) -> Result<ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        ensure!(Instant::now() < deadline, "still running after 20 s");
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn a_seed_style_config_starts_exactly_the_servers_it_asks_for() -> Result<()> {
    let ns = Netns::new("jsconfig")?;
    let setup = Setup::new()?;
    let log = setup.path("jobserver.log");
    let cmd = setup.jobserver(&ns, &log)?;
    let (_js, bound) = spawn_standalone(cmd, &log)?;
    // dnsmasq without DNS, and mprov-webserver: DHCP, TFTP and HTTP.
    assert_eq!(
        bound.servers().collect::<Vec<_>>(),
        ["dhcp", "http", "metrics", "tftp"],
        "{}",
        std::fs::read_to_string(&log)?
    );
    // The file it rendered: the key is not for others to read, the header
    // says edits are lost, the plugins are included at the end.
    let rendered = setup.path("cfg/jobserver.yaml");
    let text = std::fs::read_to_string(&rendered)?;
    let mode = std::fs::metadata(&rendered)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{text}");
    assert!(text.starts_with("# Written by mprov-jobserver"), "{text}");
    assert!(text.contains("edits here are lost"), "{text}");
    assert!(text.contains("apikey: \"seed-secret-key\""), "{text}");
    assert!(text.contains("      - \"repo-update\"\n"), "{text}");
    assert!(
        text.trim_end().ends_with("- !include plugins/*.yaml"),
        "{text}"
    );
    // The module this release does not have: one warning, with its place.
    let log_text = std::fs::read_to_string(&log)?;
    let warning = log_text
        .lines()
        .find(|l| l.contains("`repo-update` is not in this release"))
        .with_context(|| format!("no warning about repo-update:\n{log_text}"))?;
    assert!(warning.contains("[W] "), "{warning}");
    assert!(
        warning.contains(&format!("{}:", rendered.display())),
        "{warning}"
    );
    assert!(!log_text.contains('\x1b'), "colour in a file: {log_text:?}");

    // -m on the command line wins over jobmodules: the image server only.
    let log = setup.path("only-http.log");
    let mut cmd = setup.jobserver(&ns, &log)?;
    cmd.args(["-m", "mprov-webserver"]);
    let (_js, bound) = spawn_standalone(cmd, &log)?;
    assert_eq!(bound.servers().collect::<Vec<_>>(), ["http", "metrics"]);

    // A config of one's own through MPROV_ARGS: the environment is not
    // rendered, and no dnsmasq means no DHCP, DNS or TFTP.
    let own = setup.path("cfg/jobserver-local.yaml");
    std::fs::write(
        &own,
        "- global:\n    logLevel: warning\n    jobmodules: [mprov-webserver, libgenders]\n",
    )?;
    std::fs::remove_file(&rendered)?;
    let log = setup.path("own.log");
    let mut cmd = setup.jobserver(&ns, &log)?;
    cmd.env("MPROV_ARGS", format!("-c '{}'", own.display()));
    let (_js, bound) = spawn_standalone(cmd, &log)?;
    assert_eq!(bound.servers().collect::<Vec<_>>(), ["http", "metrics"]);
    assert!(!rendered.exists(), "rendered although -c was given");
    // `--log info` on the command line wins over `logLevel: warning`.
    let text = std::fs::read_to_string(&log)?;
    assert!(text.contains("[I] "), "{text}");
    Ok(())
}

#[test]
fn run_once_binds_writes_the_listen_file_and_exits_0() -> Result<()> {
    let ns = Netns::new("jsonce")?;
    let setup = Setup::new()?;
    let log = setup.path("once.log");
    let mut cmd = setup.jobserver(&ns, &log)?;
    // The boot services only: -r with job modules runs the jobs pending
    // now instead (the daemon's tests).
    cmd.args(["-r", "-m", "dnsmasq,mprov-webserver"]);
    let mut child = mprov_tests::KillOnDrop(cmd.spawn()?);
    let status = exit_status(&mut child.0)?;
    let text = std::fs::read_to_string(&log)?;
    ensure!(status.success(), "-r exited with {status}: {text}");
    let listen = std::fs::read_to_string(crate::listen_file_of(&log))
        .with_context(|| format!("no listen file: {text}"))?;
    let bound = mprov_tests::listen::Listening::parse(&listen)?;
    assert_eq!(
        bound.servers().collect::<Vec<_>>(),
        ["dhcp", "http", "metrics", "tftp"]
    );
    // runonce in the file does the same.
    std::fs::write(setup.path("cfg/plugins/once.yaml"), "- image-delete: {}\n")?;
    let own = setup.path("own.yaml");
    std::fs::write(
        &own,
        "- global:\n    runonce: True\n    jobmodules: [mprov-webserver]\n",
    )?;
    let log = setup.path("once-file.log");
    let mut cmd = setup.jobserver(&ns, &log)?;
    cmd.arg("-c").arg(&own);
    let mut child = mprov_tests::KillOnDrop(cmd.spawn()?);
    let status = exit_status(&mut child.0)?;
    ensure!(
        status.success(),
        "runonce exited with {status}: {}",
        std::fs::read_to_string(&log)?
    );
    Ok(())
}

/// Runs the job server with `-c main` (in `dir`) to its end; its exit
/// status and what it printed.
fn run_with_config(dir: &Path, main: &Path) -> Result<(ExitStatus, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_mprov-jobserver"))
        .env_clear()
        .env("MPROV_CONFIG_DIR", dir)
        .arg("-c")
        .arg(main)
        .args(["--boot-config", "/nonexistent/boot.json", "--listen-file"])
        .arg(dir.join("listen.json"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status, text))
}

#[test]
fn a_broken_config_stops_the_start_naming_file_and_line() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    std::fs::create_dir_all(d.join("plugins"))?;
    let cases: [(&str, &str, &str, &str); 5] = [
        (
            "wrong-type.yaml",
            "- global:\n    heartbeatInterval: often\n",
            "wrong-type.yaml:2:",
            "often",
        ),
        (
            "malformed.yaml",
            "- global:\n    mprovURL: \"http://x/\n    apikey: k\n",
            "malformed.yaml:2:",
            "",
        ),
        (
            "unknown-key.yaml",
            "- global:\n    mprovURL: \"http://x/\"\n    heartbeat: 10\n",
            "unknown-key.yaml:3:",
            "heartbeat",
        ),
        (
            "missing-include.yaml",
            "- global: {}\n- !include none/*.yaml\n- !include site.yaml\n",
            "missing-include.yaml:3:",
            "site.yaml does not exist",
        ),
        (
            "bad-plugin.yaml",
            "- !include plugins/*.yaml\n",
            "plugins/dnsmasq.yaml:3:",
            "enableDNSSEC",
        ),
    ];
    std::fs::write(
        d.join("plugins/dnsmasq.yaml"),
        "- dnsmasq:\n    enableDNS: false\n    enableDNSSEC: true\n",
    )?;
    for (name, text, place, what) in cases {
        let main = d.join(name);
        std::fs::write(&main, text)?;
        let (status, out) = run_with_config(d, &main)?;
        ensure!(!status.success(), "{name} started: {out}");
        ensure!(
            status.code() == Some(1),
            "{name}: {status} (a panic?): {out}"
        );
        ensure!(
            out.contains(&format!("{}/{place}", d.display())),
            "{name}: no {place} in: {out}"
        );
        ensure!(out.contains(what), "{name}: no {what:?} in: {out}");
        ensure!(!out.contains("panicked"), "{name}: {out}");
        ensure!(!d.join("listen.json").exists(), "{name} bound servers");
    }
    // The plugin file alone is fine once fixed; then the (missing) boot
    // config is what stops it: the config was read through.
    std::fs::write(
        d.join("plugins/dnsmasq.yaml"),
        "- dnsmasq:\n    enableDNS: false\n",
    )?;
    let (status, out) = run_with_config(d, &d.join("bad-plugin.yaml"))?;
    ensure!(
        !status.success() && out.contains("/nonexistent/boot.json"),
        "{out}"
    );
    // A -c file that does not exist is an error, not "no config".
    let (status, out) = run_with_config(d, &d.join("nothing.yaml"))?;
    ensure!(!status.success() && out.contains("nothing.yaml"), "{out}");
    Ok(())
}

#[test]
fn under_journald_every_line_carries_its_priority() -> Result<()> {
    let ns = Netns::new("jsjournal")?;
    let setup = Setup::new()?;
    let log = setup.path("journal.log");
    std::fs::File::create(&log)?;
    let meta = std::fs::metadata(&log)?;
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    // The stream is the log file itself: opened again (the same inode) as
    // the job server's standard error.
    let mut cmd = setup.jobserver(&ns, &log)?;
    cmd.env("JOURNAL_STREAM", &stream)
        .args(["-r", "-m", "dnsmasq,mprov-webserver"])
        .stderr(std::fs::OpenOptions::new().append(true).open(&log)?);
    let mut child = mprov_tests::KillOnDrop(cmd.spawn()?);
    let status = exit_status(&mut child.0)?;
    let text = std::fs::read_to_string(&log)?;
    ensure!(status.success(), "{status}: {text}");
    check_journal_lines(&text, true)?;

    // An error that ends the start is a priority-3 line too.
    let bad = setup.path("bad.yaml");
    std::fs::write(&bad, "- global:\n    colour: blue\n")?;
    let log = setup.path("journal-error.log");
    std::fs::File::create(&log)?;
    let meta = std::fs::metadata(&log)?;
    let mut cmd = setup.jobserver(&ns, &log)?;
    cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .arg("-c")
        .arg(&bad)
        .stderr(std::fs::OpenOptions::new().append(true).open(&log)?);
    let status = cmd.status()?;
    let text = std::fs::read_to_string(&log)?;
    ensure!(!status.success(), "{text}");
    ensure!(
        text.starts_with("<3>error: ") && text.contains("bad.yaml:2:"),
        "{text:?}"
    );

    // JOURNAL_STREAM naming another file: plain lines, with stamps.
    let log = setup.path("not-journal.log");
    let mut cmd = setup.jobserver(&ns, &log)?;
    cmd.env("JOURNAL_STREAM", &stream)
        .args(["-r", "-m", "dnsmasq,mprov-webserver"]);
    let mut child = mprov_tests::KillOnDrop(cmd.spawn()?);
    let status = exit_status(&mut child.0)?;
    let text = std::fs::read_to_string(&log)?;
    ensure!(status.success(), "{status}: {text}");
    check_journal_lines(&text, false)?;
    Ok(())
}

/// Every line of `text` is `[<N>]` (journald) then, without journald, a
/// stamp, then the tag; no colour. With journald: `<0>`..`<4>` (what
/// `journalctl -p warning` keeps) is exactly the [W] and [E] lines, and
/// there is at least one of them and one other.
fn check_journal_lines(text: &str, journald: bool) -> Result<()> {
    ensure!(!text.contains('\x1b'), "colour: {text:?}");
    let (mut kept, mut dropped) = (0, 0);
    for line in text.lines() {
        let rest = if journald {
            let Some(rest) = line.strip_prefix('<') else {
                anyhow::bail!("no priority: {line:?}\n{text}");
            };
            let (priority, rest) = rest.split_once('>').context("priority")?;
            let priority: u8 = priority.parse()?;
            let tag = rest.get(..3).unwrap_or_default();
            let expected = match tag {
                "[E]" => 3,
                "[W]" => 4,
                "[I]" => 6,
                "[D]" => 7,
                _ => anyhow::bail!("no tag right after the priority: {line:?}"),
            };
            ensure!(priority == expected, "{line:?}");
            if priority <= 4 {
                ensure!(tag == "[W]" || tag == "[E]", "{line:?}");
                kept += 1;
            } else {
                dropped += 1;
            }
            rest
        } else {
            ensure!(!line.starts_with('<'), "a priority off journald: {line:?}");
            let (stamp, rest) = line.split_once(' ').context("stamp")?;
            ensure!(
                stamp.len() >= 23 && stamp.as_bytes()[4] == b'-',
                "no stamp: {line:?}"
            );
            rest
        };
        let module = rest.get(4..).unwrap_or_default();
        ensure!(module.contains(": "), "no module: {line:?}");
    }
    if journald {
        ensure!(
            kept >= 1 && dropped >= 1,
            "kept {kept}, dropped {dropped}:\n{text}"
        );
    }
    Ok(())
}
