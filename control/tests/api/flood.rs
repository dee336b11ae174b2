//! Connection floods against the real `mprov-control serve`, started under a
//! 1,024-file limit (a systemd service's default): idle TCP connections,
//! slowloris request heads and TLS sessions that never speak must neither
//! stop the service accepting nor outlive their deadline. Every loop here is
//! bounded in count and time.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mprov_control::db::Engine;

use crate::common::{STATUS_ONLY, on_engine};
use crate::process::Server;

/// The file limit the service runs under.
const NOFILE: u64 = 1024;
/// Idle connections opened: more than the limit allows open at once.
const FLOOD: usize = 1_100;
/// Seconds a new connection has to start a request, in this test: long
/// enough that the flood, whose connects the listen backlog slows, is all
/// open at once.
const FIRST_REQUEST: u64 = 15;
const PASSWORD: &str = "flood-admin-password";

/// Raises this test process's own soft file limit to its hard one: the
/// flood needs more than 1,024 descriptors on the client side.
fn raise_own_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(
        hard >= FLOOD as u64 + 200,
        "the test needs a hard file limit above {FLOOD}"
    );
}

/// `curl` of `url` as the admin; the HTTP status.
fn curl_status(dir: &Path, url: &str) -> String {
    let out = Command::new("curl")
        .args(STATUS_ONLY)
        .args(["--max-time", "20", "--cacert"])
        .arg(dir.join("var/tls/ca.crt"))
        .args(["-u", &format!("admin:{PASSWORD}")])
        .args(["-H", &mprov_api::version_header_line()])
        .arg(url)
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether the server closed `s`: a read sees the end or a reset within
/// `within`, not a timeout.
fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            // A reply (408 or the like) before the close is fine.
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_neither_stops_the_service_nor_outlives_its_deadline() {
    on_engine(Engine::Sqlite, |dir, url| {
        raise_own_file_limit();
        let first = FIRST_REQUEST.to_string();
        let s = Server::start_limited(
            dir,
            url,
            1,
            &[
                ("MPROV_SUPERUSER_PASSWORD", PASSWORD),
                ("MPROV_FIRST_REQUEST_SECONDS", &first),
                ("MPROV_IDLE_SECONDS", "20"),
            ],
            Some(NOFILE),
        );
        let http = format!("http://127.0.0.1:{}", s.port);
        let https = format!("https://127.0.0.1:{}", s.https_port);

        // TLS sessions that finish the handshake and send nothing: real
        // openssl clients, whose standard input stays open and silent.
        let mut tls_idle: Vec<_> = (0..4)
            .map(|_| {
                Command::new("openssl")
                    .args(["s_client", "-quiet", "-connect"])
                    .arg(format!("127.0.0.1:{}", s.https_port))
                    .arg("-CAfile")
                    .arg(dir.join("var/tls/ca.crt"))
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("openssl")
            })
            .collect();
        // A slowloris: a request head trickled a line a second.
        let mut slow = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        slow.write_all(b"GET /api/v1/ HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        let slow_started = Instant::now();

        // The flood: more idle connections than the file limit allows.
        let mut idle = Vec::with_capacity(FLOOD);
        for _ in 0..FLOOD {
            idle.push(TcpStream::connect(("127.0.0.1", s.port)).unwrap());
        }

        // While the flood is held, nodes and admins are still served.
        assert_eq!(curl_status(dir, &format!("{http}/api/v1/")), "200");
        assert_eq!(curl_status(dir, &format!("{https}/api/v1/")), "200");
        let ipxe = Command::new("curl")
            .args(["-sS", "--max-time", "20"])
            .arg(format!("{http}/ipxe/?mac=52:54:00:00:00:01"))
            .output()
            .unwrap();
        let script = String::from_utf8_lossy(&ipxe.stdout);
        assert!(script.starts_with("#!ipxe"), "no iPXE script: {script}");

        // The slowloris keeps trickling, and is closed all the same: a head
        // that never ends never starts a request.
        let mut slow_closed = false;
        for i in 0..(FIRST_REQUEST * 4) {
            if slow
                .write_all(format!("X-Slow-{i}: x\r\n").as_bytes())
                .is_err()
            {
                slow_closed = true;
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        let slow_closed = slow_closed || closed_by_server(&mut slow, Duration::from_secs(5));
        assert!(
            slow_closed,
            "a head trickled for {:?} kept its connection",
            slow_started.elapsed()
        );

        // Past the deadline, every idle connection still open is closed by
        // the service (those the cap closed earlier are closed too).
        let mut kept = 0;
        for c in idle.iter_mut().rev().take(50) {
            if !closed_by_server(c, Duration::from_secs(FIRST_REQUEST + 5)) {
                kept += 1;
            }
        }
        assert_eq!(kept, 0, "idle connections outlived their deadline");
        // The silent TLS clients were closed: openssl exits by itself.
        let deadline = Instant::now() + Duration::from_secs(FIRST_REQUEST + 10);
        for c in &mut tls_idle {
            loop {
                if c.try_wait().unwrap().is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    panic!("a silent TLS session was kept open");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        drop(idle);

        // The cap was reached and said so; the service still answers.
        let log = s.log_text();
        assert!(
            log.contains("the most allowed (MPROV_MAX_CONNECTIONS)"),
            "no warning that the connection cap was reached:\n{log}"
        );
        assert!(
            log.contains("lowered to fit the file limit of 1024"),
            "the cap was not fitted to the file limit:\n{log}"
        );
        assert_eq!(curl_status(dir, &format!("{http}/api/v1/")), "200");
    })
    .await;
}
