//! Each address's heartbeat goes out from that address, to that address's
//! own `mprovURL`: the real `mprov-jobserver` with `addresses:` 127.0.0.2
//! and 127.0.0.3 in its config, each with its own URL, and a real control
//! service on HTTPS. Each URL is a TCP relay in front of the control
//! service (TLS stays end to end: the control service still checks the
//! job server's certificate and stamps each address's heartbeat) that
//! notes the source address of every connection: the relay of 127.0.0.2
//! sees only 127.0.0.2, that of 127.0.0.3 only 127.0.0.3. The control
//! service does not record a heartbeat's source address, so the relays
//! are what sees it.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mprov_control::db::kinds;
use tokio::net::{TcpListener, TcpStream};

use crate::{TlsControl, plain};

/// Job server js1's row, as the API shows it.
async fn js1_row(control: &TlsControl) -> Option<serde_json::Value> {
    let jobservers = kinds::kind("jobservers").unwrap();
    control
        .db
        .get(jobservers, "js1")
        .await
        .ok()
        .map(serde_json::Value::Object)
}

/// Whether `row` has a heartbeat stamped on its registered `address`.
fn stamped(row: &serde_json::Value, address: &str) -> bool {
    row["registered_addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|a| a["address"] == address && a["heartbeat_at"].is_string())
}

/// The source address of every connection a relay took.
type Seen = Arc<Mutex<Vec<IpAddr>>>;

/// A TCP relay on 127.0.0.1 to `to`, noting each connection's source
/// address; its address.
async fn relay(to: SocketAddr) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let noted = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, peer)) = listener.accept().await {
            noted.lock().unwrap().push(peer.ip());
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_address_heartbeats_from_itself_to_its_own_url() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let control = TlsControl::start(&d, &[]).await;
    let control_addr: SocketAddr = control.url.trim_start_matches("https://").parse().unwrap();
    let (relay2, seen2) = relay(control_addr).await;
    let (relay3, seen3) = relay(control_addr).await;
    let config = d.join("jobserver.yaml");
    std::fs::write(
        &config,
        format!(
            "- global:\n    addresses:\n      - address: 127.0.0.2\n        mprovURL: \"https://{relay2}\"\n      - address: 127.0.0.3\n        mprovURL: \"https://{relay3}\"\n"
        ),
    )
    .unwrap();
    let log = d.join("js.log");
    let config = config.display().to_string();
    let js = control
        .start_jobserver(&d, &log, &["-c", &config, "--heartbeat", "1"])
        .await;

    // Both addresses heartbeat (stamped by the control service), each
    // through its own relay.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = js1_row(&control).await;
        let both = row
            .as_ref()
            .is_some_and(|r| stamped(r, "127.0.0.2") && stamped(r, "127.0.0.3"));
        if both && !seen2.lock().unwrap().is_empty() && !seen3.lock().unwrap().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no heartbeat on each address through its relay: {row:?}, relays saw {:?} and {:?}\n{}",
            seen2.lock().unwrap(),
            seen3.lock().unwrap(),
            plain(&std::fs::read_to_string(&log).unwrap_or_default())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A few more beats, then: every connection from its own address.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (two, three) = (seen2.lock().unwrap().clone(), seen3.lock().unwrap().clone());
    let a2: IpAddr = "127.0.0.2".parse().unwrap();
    let a3: IpAddr = "127.0.0.3".parse().unwrap();
    assert!(two.iter().all(|ip| *ip == a2), "{two:?}");
    assert!(three.iter().all(|ip| *ip == a3), "{three:?}");
    let text = plain(&std::fs::read_to_string(&log).unwrap());
    // (One address-less heartbeat before registering may be refused.)
    assert!(
        !text.contains("cannot send this job server's heartbeat on"),
        "{text}"
    );
    drop(js);
    control.stop().await;
}

/// A job server that registers heartbeats on its addresses at once, not a
/// whole period later: with `--heartbeat 600`, the registered address is
/// stamped long before the first period ends (`/ipxe/` sends nodes only to
/// an address with a fresh heartbeat; a storm powered on just after a
/// registration waited out the period).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_heartbeats_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let control = TlsControl::start(&d, &[]).await;
    let config = d.join("jobserver.yaml");
    std::fs::write(
        &config,
        "- global:\n    addresses:\n      - address: 127.0.0.2\n",
    )
    .unwrap();
    let log = d.join("js.log");
    let config = config.display().to_string();
    let js = control
        .start_jobserver(&d, &log, &["-c", &config, "--heartbeat", "600"])
        .await;
    // Well inside the 600 s period: only a heartbeat sent on registering
    // arrives by then.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row = js1_row(&control).await;
        if row.as_ref().is_some_and(|r| stamped(r, "127.0.0.2")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no heartbeat on the registered address: {row:?}\n{}",
            plain(&std::fs::read_to_string(&log).unwrap_or_default())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(js);
    control.stop().await;
}
