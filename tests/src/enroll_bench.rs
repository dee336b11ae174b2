//! The enrollment benchmark (`cargo xtask bench enroll`): how many nodes a
//! control service enrolls per second, and how long one enrollment takes,
//! over HTTPS with a new TLS connection per node (as real nodes make them).
//!
//! Before the clock starts: N systems with a NIC each, an image on a job
//! server, one `/ipxe/` nonce per node (after the enrolled job server's
//! report of the node's lease, which `/ipxe/` requires), and one key pair and CSR per node
//! (the node's own work). Timed: N `POST /enroll/node/` from C concurrent
//! clients. Reported: enrollments per second, latency p50/p99, and the CPU
//! time of the service plus its signing helper per enrollment. No incumbent
//! issues certificates here (the original has no CA), so the figures are
//! absolute. Goal from the issue: at least 200 per second, p99 under 50 ms.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use mprov_api::boot::{BootEventReport, BootPhase};
use mprov_api::client::{Auth, Client};
use mprov_api::enroll::{JobserverEnrollment, NodeEnrollment};
use serde_json::{Value, json};

use crate::control::{Control, build};

/// Runs the benchmark; `smoke` makes it small.
pub fn run(smoke: bool) -> Result<()> {
    // (nodes, concurrent clients): a few nodes at a time shows the latency
    // of one issuance; many at once the rate under a power-on surge.
    let rounds: &[(usize, usize)] = if smoke {
        &[(20, 2), (40, 4)]
    } else {
        &[(1_000, 4), (2_000, 16)]
    };
    let bin = build(&["mprov-control"], smoke)?;
    let dir = tempfile::tempdir()?;
    // The service becomes the `mprov` user when started as root.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let control = Control::start(&bin, &dir.path().join("sqlite"), None)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let jobserver = match rt.block_on(setup(&control)) {
        Ok(client) => client,
        Err(e) => {
            control.stop()?;
            return Err(e);
        }
    };
    let mut results = Vec::new();
    let mut first = 0;
    for &(nodes, concurrency) in rounds {
        let r = rt.block_on(measure(&control, &jobserver, first, nodes, concurrency));
        first += nodes;
        match r {
            Ok(f) => results.push((nodes, concurrency, f)),
            Err(e) => {
                control.stop()?;
                return Err(e);
            }
        }
    }
    control.stop()?;
    println!("enroll: POST /enroll/node/ over HTTPS, one new TLS connection per node (SQLite)");
    println!(
        "| nodes | concurrent clients | enrollments/s | p50 | p99 | max | service + signer CPU per enrollment |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (nodes, concurrency, f) in results {
        println!(
            "| {nodes} | {concurrency} | {:.0} | {:.1} ms | {:.1} ms | {:.1} ms | {:.2} ms |",
            f.rate,
            f.p50.as_secs_f64() * 1e3,
            f.p99.as_secs_f64() * 1e3,
            f.max.as_secs_f64() * 1e3,
            f.cpu_per.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

struct Figures {
    rate: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    cpu_per: Duration,
}

fn mac(i: usize) -> String {
    format!(
        "02:e0:00:{:02x}:{:02x}:{:02x}",
        i >> 16 & 0xff,
        i >> 8 & 0xff,
        i & 0xff
    )
}

/// What every round shares: job server `js1` hosting the published image
/// `compute`, and js1's own client.
async fn setup(control: &Control) -> Result<Client> {
    let admin = Client::new(&control.http, Auth::ApiKey(control.api_key()?))?;
    // A job server vouches only for leases inside its network, for nodes
    // of that network: loopback, where the nodes' requests come from.
    admin
        .create(
            "networks",
            &json!({"slug": "lo", "subnet": "127.0.0.0", "netmask": 8}),
        )
        .await?;
    let js = admin
        .create(
            "jobservers",
            &json!({"name": "js1", "addresses": ["10.0.0.2"], "network": "lo"}),
        )
        .await?;
    // /ipxe/ boots only a published image: one with its rootfs checksum.
    admin
        .create(
            "images",
            &json!({"slug": "compute", "rootfs_sha256": "0".repeat(64), "rootfs_size": 4096}),
        )
        .await?;
    admin
        .update("images", "compute", &json!({"jobservers": [js["id"]]}))
        .await?;
    jobserver_client(control, &admin).await
}

async fn measure(
    control: &Control,
    jobserver: &Client,
    first: usize,
    nodes: usize,
    concurrency: usize,
) -> Result<Figures> {
    let admin = Client::new(&control.http, Auth::ApiKey(control.api_key()?))?;
    let rows: Vec<Value> = (first..first + nodes)
        .map(|i| json!({"hostname": format!("e{i:05}"), "image": "compute", "nics": [{"mac": mac(i), "network": "lo"}]}))
        .collect();
    for chunk in rows.chunks(1_000) {
        admin.bulk_create("systems", chunk).await?;
    }

    // Each node's nonce (from /ipxe/, as iPXE gets it) and its CSR.
    let anonymous = Client::new(&control.http, Auth::None)?;
    let mut work = Vec::with_capacity(nodes);
    for i in first..first + nodes {
        // The job server reports the lease it gave this node, as its DHCP
        // server does: only then does /ipxe/ hand out a nonce.
        jobserver
            .report_boot_event(&BootEventReport {
                phase: BootPhase::DhcpAcked,
                mac: Some(mac(i)),
                system: None,
                ip: Some(Ipv4Addr::LOCALHOST.into()),
                detail: String::new(),
            })
            .await?;
        let script = anonymous
            .get_text(&format!("/ipxe/?mac={}", mac(i)))
            .await?;
        let nonce = script
            .split_whitespace()
            .find_map(|w| w.strip_prefix("mprov_enroll="))
            .with_context(|| format!("no nonce in {script}"))?
            .to_owned();
        let (_key, csr) = key_and_csr()?;
        work.push(NodeEnrollment { nonce, csr });
    }

    let ca = control.ca_pem()?;
    let queue = Arc::new(std::sync::Mutex::new(work));
    let cpu0 = control.cpu()?;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (queue, ca, base) = (queue.clone(), ca.clone(), control.https.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            // The guard moves into the closure and is dropped there.
            while let Some(item) = queue.lock().ok().and_then(|mut q| q.pop()) {
                // A new client per node: a new TLS connection and handshake.
                let client = Client::builder(&base, Auth::None)
                    .ca_certificates_pem(ca.as_bytes().to_vec())
                    .build()?;
                let start = Instant::now();
                let enrolled = client.enroll_node(&item).await?;
                latencies.push(start.elapsed());
                ensure!(
                    enrolled.certificate.contains("BEGIN CERTIFICATE"),
                    "no certificate"
                );
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::with_capacity(nodes);
    for t in tasks {
        latencies.extend(t.await??);
    }
    let elapsed = t0.elapsed();
    let cpu = control.cpu()? - cpu0;
    ensure!(
        latencies.len() == nodes,
        "{} of {nodes} enrolled",
        latencies.len()
    );
    latencies.sort();
    let pick = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q).round() as usize];
    let n = u32::try_from(nodes).unwrap_or(u32::MAX);
    Ok(Figures {
        rate: nodes as f64 / elapsed.as_secs_f64(),
        p50: pick(0.50),
        p99: pick(0.99),
        max: pick(1.0),
        cpu_per: cpu / n,
    })
}

/// A new key pair and a CSR for it that names nothing (the CA names the
/// certificate).
fn key_and_csr() -> Result<(rcgen::KeyPair, String)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params.serialize_request(&key)?.pem()?;
    Ok((key, csr))
}

/// Job server `js1`, enrolled with a one-time token like `mprov-jobserver`
/// does: a client that presents its own certificate over HTTPS.
async fn jobserver_client(control: &Control, admin: &Client) -> Result<Client> {
    let token = admin
        .create("enroll-tokens", &json!({"name": "js1"}))
        .await?["token"]
        .as_str()
        .context("no token in the enroll-tokens answer")?
        .to_owned();
    let ca = control.ca_pem()?;
    let (key, csr) = key_and_csr()?;
    let enrolled = Client::builder(&control.https, Auth::None)
        .ca_certificates_pem(ca.as_bytes().to_vec())
        .build()?
        .enroll_jobserver(&JobserverEnrollment {
            token,
            name: "js1".to_owned(),
            csr,
        })
        .await?;
    let identity = format!("{}{}", enrolled.certificate, key.serialize_pem());
    Ok(Client::builder(&control.https, Auth::None)
        .ca_certificates_pem(ca.into_bytes())
        .identity_pem(identity.into_bytes())
        .build()?)
}
