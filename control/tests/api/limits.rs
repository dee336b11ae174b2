//! Per-identity write budgets and the boot events' retention, against the
//! real `mprov-control serve` (issue 21): a node flooding boot events or
//! renewals is cut off with 429 while others go on, the rows it leaves stay
//! bounded, old events are removed by `serve`, and a replaced node
//! certificate shows on the node's timeline.

use std::path::Path;
use std::process::Command;

use mprov_control::db::{Db, Engine, Val};

use crate::attacks::{ADMIN_PASSWORD, As, Client, hosted_image, start_admin};
use crate::common::{P256, on_engine};
use crate::process::Server;

/// Runs a blocking future on the test's runtime.
fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Handle::current().block_on(f)
}

/// Rows of `boot_events` for `system_id`.
fn events_of(url: &str, system_id: i64) -> i64 {
    block(async {
        let db = Db::connect(url).await.unwrap();
        let mut q = db.sql();
        q.push("SELECT COUNT(*) AS n FROM boot_events WHERE system_id = ")
            .bind(Val::Int(Some(system_id)));
        mprov_control::db::int(&q.query().fetch_one(db.pool()).await.unwrap(), "n").unwrap()
    })
}

/// A system `host` with NIC `mac` on network `lo` booting the hosted
/// image; its id.
fn system(c: &Client, image: &serde_json::Value, host: &str, mac: &str) -> i64 {
    c.post(
        "systems",
        serde_json::json!({"hostname": host, "image": image["id"], "nics": [{"mac": mac, "network": "lo"}]}),
    )["id"]
        .as_i64()
        .unwrap()
}

/// `n` POSTs of `body` to `path` with `cert`, 8 at a time in one curl:
/// how many answered each status.
fn flood(c: &Client, cert: &Path, path: &str, body: &serde_json::Value, n: usize) -> Vec<u16> {
    let file = c.work.join("flood.json");
    std::fs::write(&file, body.to_string()).unwrap();
    let url = format!("https://127.0.0.1:{}{path}", c.https);
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--parallel", "--parallel-max", "8", "-X", "POST"])
        .args(["-w", "\nCODE:%{http_code}\n", "--cacert"])
        .arg(&c.ca)
        .args(["-H", &mprov_api::version_header_line()])
        .arg("--cert")
        .arg(cert.with_extension("crt"))
        .arg("--key")
        .arg(cert.with_extension("key"))
        .args(["-H", "Content-Type: application/json", "--data-binary"])
        .arg(format!("@{}", file.display()));
    for _ in 0..n {
        cmd.arg(&url);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let codes: Vec<u16> = text
        .lines()
        .filter_map(|l| l.strip_prefix("CODE:"))
        .map(|c| c.parse().unwrap())
        .collect();
    assert_eq!(codes.len(), n, "{text}");
    codes
}

fn count(codes: &[u16], code: u16) -> usize {
    codes.iter().filter(|c| **c == code).count()
}

/// A node flooding boot events with its own certificate is cut off after
/// its budget (429, `Retry-After`, one warning naming it); another node
/// and a job server still report, and the node's rows stay bounded.
async fn a_node_flooding_boot_events_is_cut_off(engine: Engine) {
    on_engine(engine, |dir, url| {
        let mut s = Server::start(
            dir,
            url,
            1,
            &[
                ("MPROV_SUPERUSER_PASSWORD", ADMIN_PASSWORD),
                ("MPROV_BOOT_EVENTS_PER_MINUTE", "50"),
            ],
        );
        let c = Client::new(&s, dir);
        let image = hosted_image(&c);
        let c01 = system(&c, &image, "c01", "aa:bb:cc:00:02:01");
        let c02 = system(&c, &image, "c02", "aa:bb:cc:00:02:02");
        let n1 = As::Cert(c.enroll_node("c01", &c.nonce(url, "aa:bb:cc:00:02:01")));
        let n2 = c.enroll_node("c02", &c.nonce(url, "aa:bb:cc:00:02:02"));
        let js = c.enrolled_jobserver("js1");
        let before = events_of(url, c01);
        let As::Cert(n1_path) = &n1 else {
            unreachable!()
        };
        let big = "x".repeat(4000);
        let codes = flood(
            &c,
            n1_path,
            "/api/v1/boot/events",
            &serde_json::json!({"phase": "progress", "detail": big}),
            300,
        );
        let (created, refused) = (count(&codes, 201), count(&codes, 429));
        let errors = |s: &Server| {
            s.log_text()
                .lines()
                .filter(|l| l.contains("ERROR") || l.contains("error"))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(created + refused, 300, "{codes:?} {}", errors(&s));
        // The budget (50) plus what refills while the flood runs.
        assert!((50..=60).contains(&created), "{created} created");
        let stored = events_of(url, c01) - before;
        assert!(stored <= 63, "{stored} stored");
        // A few more (one may find a token refilled meanwhile): 429 with
        // Retry-After.
        let (code, v) = (0..3)
            .map(|_| {
                c.call(
                    "POST",
                    "/api/v1/boot/events",
                    &n1,
                    Some(serde_json::json!({"phase": "progress"})),
                )
            })
            .find(|(code, _)| *code == 429)
            .unwrap_or_default();
        assert_eq!(code, 429, "{v}");
        assert!(v["message"].as_str().unwrap().contains("node:c01"), "{v}");
        let headers = std::fs::read_to_string(c.work.join("one.headers")).unwrap();
        assert!(
            headers.to_ascii_lowercase().contains("retry-after: "),
            "{headers}"
        );
        // The other node and the job server are not held back.
        let (code, v) = c.call(
            "POST",
            "/api/v1/boot/events",
            &As::Cert(n2),
            Some(serde_json::json!({"phase": "ready"})),
        );
        assert_eq!(code, 201, "{v}");
        let codes = flood(
            &c,
            &js,
            "/api/v1/boot/events",
            &serde_json::json!({"phase": "kernel_fetched", "system": "c02"}),
            100,
        );
        assert_eq!(count(&codes, 201), 100, "{codes:?} {}", errors(&s));
        assert!(events_of(url, c02) >= 101);
        // The warning names the node, once (it is rate-limited itself).
        let log = s.log_text();
        let warnings = log.matches("rate limit: node:c01 sent boot events").count();
        assert_eq!(warnings, 1, "{log}");
        s.stop();
    })
    .await;
}

/// A node renewing again and again with each new certificate is cut off
/// after its budget, and its revoked rows stay bounded.
async fn a_renewal_flood_is_cut_off_and_its_rows_bounded(engine: Engine) {
    on_engine(engine, |dir, url| {
        let mut s = Server::start(
            dir,
            url,
            1,
            &[
                ("MPROV_SUPERUSER_PASSWORD", ADMIN_PASSWORD),
                ("MPROV_RENEWALS_PER_HOUR", "15"),
            ],
        );
        let c = Client::new(&s, dir);
        let image = hosted_image(&c);
        system(&c, &image, "c01", "aa:bb:cc:00:03:01");
        let mut cert = c.enroll_node("c01", &c.nonce(url, "aa:bb:cc:00:03:01"));
        let (mut renewed, mut refused) = (0, 0);
        for i in 0..20 {
            let name = format!("c01-r{i}");
            let csr = c.csr(&name, &P256, &[]);
            let (code, v) = c.call(
                "POST",
                "/enroll/renew/",
                &As::Cert(cert.clone()),
                Some(serde_json::json!({"csr": csr})),
            );
            match code {
                200 => {
                    renewed += 1;
                    cert = c.work.join(&name);
                    std::fs::write(
                        cert.with_extension("crt"),
                        v["certificate"].as_str().unwrap(),
                    )
                    .unwrap();
                }
                429 => {
                    refused += 1;
                    let headers = std::fs::read_to_string(c.work.join("one.headers")).unwrap();
                    assert!(
                        headers.to_ascii_lowercase().contains("retry-after: "),
                        "{headers}"
                    );
                }
                other => panic!("{other} {v}"),
            }
        }
        assert_eq!((renewed, refused), (15, 5));
        // The last certificate still works; 16 were issued, and at most
        // the live one and 10 revoked ones are kept.
        let (code, _) = c.call("GET", "/api/v1/systems/c01", &As::Cert(cert), None);
        assert_eq!(code, 200);
        let rows = c.ok("GET", "/api/v1/credentials/?identity=c01", None)["items"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(rows, 11);
        assert_eq!(c.live("c01"), 1);
        assert!(
            s.log_text()
                .contains("rate limit: node:c01 sent renewals beyond its budget")
        );
        s.stop();
    })
    .await;
}

/// Events older than `MPROV_BOOT_EVENTS_KEEP_DAYS` are removed by `serve`
/// (at start, then hourly); newer ones stay.
async fn serve_removes_old_boot_events(engine: Engine) {
    on_engine(engine, |dir, url| {
        let mut s = start_admin(dir, url, 1);
        let c = Client::new(&s, dir);
        let image = hosted_image(&c);
        let id = system(&c, &image, "c01", "aa:bb:cc:00:04:01");
        s.stop();
        let now = jiff::Timestamp::now();
        block(async {
            let db = Db::connect(url).await.unwrap();
            for days in [40, 35, 31, 29, 1] {
                let at = now - jiff::SignedDuration::from_hours(24 * days);
                let ev = mprov_control::boot::NewEvent {
                    system_id: Some(id),
                    mac: None,
                    phase: mprov_api::boot::BootPhase::Ready,
                    source: "control".into(),
                    jobserver_id: None,
                    ip: None,
                    detail: format!("{days} days ago"),
                };
                mprov_control::boot::record_at(&db, ev, at).await.unwrap();
            }
        });
        assert_eq!(events_of(url, id), 5);
        let mut s = start_admin(dir, url, 2);
        let c = Client::new(&s, dir);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !s.log_text().contains("boot events: removed") {
            assert!(std::time::Instant::now() < deadline, "{}", s.log_text());
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(
            s.log_text().contains("removed 3 events older than 30 days"),
            "{}",
            s.log_text()
        );
        let left = c.ok("GET", "/api/v1/boot/events?system=c01&boot=all", None);
        let details: Vec<&str> = left
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["detail"].as_str().unwrap())
            .collect();
        assert_eq!(details, ["29 days ago", "1 days ago"]);
        s.stop();
    })
    .await;
}

/// A node enrolling again while its certificate is live: the old one is
/// revoked and the replacement is on the node's timeline.
async fn a_replaced_node_certificate_shows_on_the_timeline(engine: Engine) {
    on_engine(engine, |dir, url| {
        let mut s = start_admin(dir, url, 1);
        let c = Client::new(&s, dir);
        let image = hosted_image(&c);
        system(&c, &image, "c01", "aa:bb:cc:00:05:01");
        let first = c.enroll_node("c01", &c.nonce(url, "aa:bb:cc:00:05:01"));
        let timeline = |c: &Client| {
            c.ok("GET", "/api/v1/boot/events?system=c01&boot=all", None)
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| {
                    e["phase"] == "enrolled"
                        && e["detail"]
                            .as_str()
                            .unwrap()
                            .starts_with("replaced certificate")
                })
                .map(|e| e["detail"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert!(
            timeline(&c).is_empty(),
            "a first enrollment replaces nothing"
        );
        c.enroll_node("c01-again", &c.nonce(url, "aa:bb:cc:00:05:01"));
        let revoked = c.ok("GET", "/api/v1/credentials/?identity=c01", None)["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| !r["revoked_at"].is_null())
            .unwrap()
            .clone();
        let serial = revoked["serial"].as_str().unwrap();
        let events = timeline(&c);
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(
            events[0].contains(&format!(
                "replaced certificate serial {serial} issued at {}",
                revoked["created_at"].as_str().unwrap()
            )),
            "{events:?}"
        );
        let (code, _) = c.call("GET", "/api/v1/systems/c01", &As::Cert(first), None);
        assert!(
            code == 401 || code == 403,
            "the replaced certificate no longer works: {code}"
        );
        s.stop();
    })
    .await;
}

crate::engine_tests!(
    a_node_flooding_boot_events_is_cut_off,
    a_renewal_flood_is_cut_off_and_its_rows_bounded,
    serve_removes_old_boot_events,
    a_replaced_node_certificate_shows_on_the_timeline,
);
