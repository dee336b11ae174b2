//! `cargo xtask demo`: build and run `mprov-control serve` on its embedded
//! defaults, with its config and state under `/var/lib/mprov-demo/` (as root)
//! or the clone's `target/demo/` (as anyone else), until Ctrl-C.
//!
//! `--check` stops it again right after the API answered, so a test or CI can
//! run the demo end to end.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use signal_hook::consts::{SIGCHLD, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use super::{cargo, describe, step, workspace_root};
use crate::process::Process;

/// Where `mprov-control` listens unless `--listen` or `MPROV_LISTEN` says
/// otherwise; the same default as the service's own.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The path that answers once the API is up.
const OPENAPI_PATH: &str = "/api/v1/openapi.json";
/// How often we try the API while the service starts, and the pause between
/// tries: 600 × 100 ms is one minute.
const READY_TRIES: u32 = 600;
const READY_INTERVAL: Duration = Duration::from_millis(100);
/// How long one readiness request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the service may take to stop after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// Options of `cargo xtask demo`.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Where the API listens (`MPROV_LISTEN`).
    pub listen: SocketAddr,
    /// Stop right after the API answered, and succeed.
    pub check: bool,
}

/// Where the demo keeps its config and state. As root, the service drops to
/// its own user, which must reach its database: a clone under a folder only
/// root may enter (root's home) cannot hold it, so root's demo lives in
/// `/var/lib/mprov-demo`. Anyone else keeps it in the clone's `target/demo`.
fn demo_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        PathBuf::from("/var/lib/mprov-demo")
    } else {
        workspace_root().join("target").join("demo")
    }
}

/// Builds and runs the service; see the module docs.
pub fn demo(options: &DemoOptions) -> Result<()> {
    if options.listen.port() == 0 {
        bail!("--listen needs a fixed port, so the demo knows where to look");
    }
    let demo_dir = demo_dir();
    let config_dir = demo_dir.join("etc");
    let state_dir = demo_dir.join("var");
    for dir in [&config_dir, &state_dir] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }

    step("build: cargo build -p mprov-control --bin mprov-control");
    let exe = build_control()?;

    // Catch the signals before the service starts: a Ctrl-C or SIGTERM that
    // comes while it starts then waits for us, instead of killing us and leaving
    // the service behind. These are handlers, not a signal mask, so the service
    // starts with the default dispositions (exec resets handlers; it would keep
    // a mask). SIGCHLD tells us when the service exits by itself.
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGCHLD]).context("catching signals")?;

    step("serve: mprov-control serve");
    let mut cmd = Command::new(&exe);
    cmd.arg("serve")
        .env("MPROV_CONFIG_DIR", &config_dir)
        .env("MPROV_STATE_DIR", &state_dir)
        .env("MPROV_LISTEN", options.listen.to_string())
        .stdin(Stdio::null());
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", describe(&cmd)))?;
    let mut service = Process::new("mprov-control", child, STOP_TIMEOUT);

    let target = connect_address(options.listen);
    wait_ready(&mut service, target)?;
    println!("mProv control API: http://{target}/api/v1/ (OpenAPI: http://{target}{OPENAPI_PATH})");
    println!(
        "admin password file: {}",
        config_dir.join("superuser_password").display()
    );

    if options.check {
        step("stop: --check passed");
        let status = service.stop()?;
        eprintln!("mprov-control exited: {status}");
        return Ok(());
    }

    eprintln!("running; Ctrl-C stops it");
    for signal in signals.forever() {
        if signal == SIGCHLD {
            // Some child changed state; it ends the demo only if it is ours.
            if let Some(status) = service.try_wait()? {
                bail!("mprov-control exited by itself: {status}");
            }
            continue;
        }
        let name = if signal == SIGINT {
            "SIGINT"
        } else {
            "SIGTERM"
        };
        eprintln!("{name}: stopping mprov-control");
        let status = service.stop()?;
        eprintln!("mprov-control exited: {status}");
        return Ok(());
    }
    bail!("stopped waiting for signals")
}

/// Builds `mprov-control` and returns the path of its binary, as cargo reports
/// it, so a custom target folder works too.
fn build_control() -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--package",
        "mprov-control",
        "--bin",
        "mprov-control",
    ])
    .arg("--message-format=json-render-diagnostics")
    .stdout(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running {}", describe(&cmd)))?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut exe = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's output")?;
        if let Some(path) = control_executable(&line) {
            exe = Some(path);
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!("{} failed ({status})", describe(&cmd));
    }
    exe.context("cargo built no mprov-control binary")
}

/// The binary's path if `line`, one of cargo's JSON messages, announces it.
fn control_executable(line: &str) -> Option<PathBuf> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" || message["target"]["name"] != "mprov-control" {
        return None;
    }
    message["executable"].as_str().map(PathBuf::from)
}

/// Where to connect to reach a listener on `listen`: loopback for a wildcard.
fn connect_address(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// Polls the OpenAPI document a bounded number of times while the service runs.
fn wait_ready(service: &mut Process, target: SocketAddr) -> Result<()> {
    let mut last = String::from("no try yet");
    for _ in 0..READY_TRIES {
        if let Some(status) = service.try_wait()? {
            bail!("mprov-control exited before its API answered: {status}");
        }
        match http_status(target, OPENAPI_PATH) {
            Ok(200) => return Ok(()),
            Ok(code) => last = format!("HTTP status {code}"),
            Err(err) => last = format!("{err:#}"),
        }
        thread::sleep(READY_INTERVAL);
    }
    let waited = READY_INTERVAL * READY_TRIES;
    bail!("GET http://{target}{OPENAPI_PATH} did not answer 200 within {waited:?}; last: {last}")
}

/// Sends `GET path` over HTTP/1.0 and returns the response's status code.
fn http_status(target: SocketAddr, path: &str) -> Result<u16> {
    let mut stream = TcpStream::connect_timeout(&target, REQUEST_TIMEOUT)
        .with_context(|| format!("connecting to {target}"))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {target}\r\nConnection: close\r\n\r\n"
    )?;
    // The status line is all we need; read at most a small prefix.
    let mut head = Vec::new();
    stream.take(256).read_to_end(&mut head)?;
    parse_status(&head).context("not an HTTP response")
}

/// The status code of an HTTP response that starts with `head`.
fn parse_status(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_status_reads_the_status_line() {
        assert_eq!(
            parse_status(b"HTTP/1.1 200 OK\r\ncontent-type: x\r\n"),
            Some(200)
        );
        assert_eq!(parse_status(b"HTTP/1.0 404 Not Found\r\n"), Some(404));
        assert_eq!(parse_status(b"HTTP/1.1 503"), Some(503));
        assert_eq!(parse_status(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(parse_status(b""), None);
    }

    #[test]
    fn control_executable_reads_cargo_messages() {
        let artifact = r#"{"reason":"compiler-artifact","target":{"name":"mprov-control","kind":["bin"]},"executable":"/w/target/debug/mprov-control"}"#;
        assert_eq!(
            control_executable(artifact),
            Some(PathBuf::from("/w/target/debug/mprov-control"))
        );
        let library = r#"{"reason":"compiler-artifact","target":{"name":"mprov-control","kind":["lib"]},"executable":null}"#;
        assert_eq!(control_executable(library), None);
        let other =
            r#"{"reason":"compiler-artifact","target":{"name":"mash"},"executable":"/w/mash"}"#;
        assert_eq!(control_executable(other), None);
        assert_eq!(control_executable("not json"), None);
    }

    #[test]
    fn connect_address_replaces_wildcards() {
        let check = |listen: &str, expected: &str| {
            let listen: SocketAddr = listen.parse().expect("test address");
            assert_eq!(connect_address(listen).to_string(), expected);
        };
        check("0.0.0.0:8080", "127.0.0.1:8080");
        check("[::]:8080", "[::1]:8080");
        check("127.0.0.2:9000", "127.0.0.2:9000");
    }

    #[test]
    fn http_status_talks_http_1_0() -> Result<()> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let target = listener.local_addr()?;
        let server = thread::spawn(move || -> Result<String> {
            let (mut conn, _) = listener.accept()?;
            let mut request = Vec::new();
            let mut buf = [0u8; 512];
            while !request.ends_with(b"\r\n\r\n") {
                let n = conn.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            conn.write_all(b"HTTP/1.0 200 OK\r\n\r\n{}")?;
            Ok(String::from_utf8(request)?)
        });
        assert_eq!(http_status(target, OPENAPI_PATH)?, 200);
        let request = server.join().expect("server thread")?;
        assert!(
            request.starts_with("GET /api/v1/openapi.json HTTP/1.0\r\n"),
            "{request}"
        );
        Ok(())
    }
}
