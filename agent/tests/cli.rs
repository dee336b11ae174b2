//! The agent's binary as a process: `node` tells systemd it is up after its
//! first turn and ends at SIGTERM while it waits, and `script-runner`
//! without an identity exits non-zero saying why.

use std::io::{BufRead as _, BufReader, Read as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const AGENT: &str = env!("CARGO_BIN_EXE_mprov-agent");

#[test]
fn the_node_agent_is_up_after_its_first_turn_and_stops_at_sigterm_while_it_waits() {
    let dir = tempfile::tempdir().expect("tempdir");
    // systemd's side of Type=notify: a datagram socket named by NOTIFY_SOCKET.
    let notify_path = dir.path().join("notify");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).expect("binds");
    notify
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut child = Command::new(AGENT)
        .env("NOTIFY_SOCKET", &notify_path)
        .arg("node")
        .arg("--root")
        .arg(dir.path())
        .arg("--work")
        .arg(dir.path().join("work"))
        .args(["--poll", "3600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    // No identity under the root: it says so, then waits to try again.
    let mut first = String::new();
    stderr.read_line(&mut first).expect("reads");
    assert!(first.contains("reading the identity"), "{first}");
    // Its first turn is over (it could not run anything): systemd may go on.
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("a notification within 20 s");
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.lines().any(|l| l == "READY=1"), "{text:?}");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signals");
    let until = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("waits") {
            break Some(status);
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = status.expect("the agent did not stop within 10 s of SIGTERM");
    assert!(status.success(), "{status}");
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).expect("reads");
    assert!(rest.contains("mprov-agent: stopped"), "{rest}");
}

#[test]
fn the_script_runner_without_an_identity_fails_saying_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(AGENT)
        .args(["script-runner", "-s", "-b", "-r", "-d", "--root"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("reading the identity"), "{text}");
    assert!(text.contains("etc/mprov/node.key"), "{text}");
    // Nothing was held while it failed.
    assert!(!dir.path().join("etc/nologin").exists());
}
