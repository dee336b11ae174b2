//! Serves a boot config snapshot (JSON) with mprov-dns until Ctrl-C or
//! SIGTERM, for benchmarks and manual testing.
//!
//! Usage: `serve_snapshot <bootconfig.json> <listen addr, e.g. 127.0.0.1:5300>`
//!
//! UDP and TCP are bound on the same address. The upstream port for
//! forwarding is taken from `MPROV_DNS_UPSTREAM_PORT` (default 53). Prints
//! `listening <addr>` on stdout once the sockets are bound.
//!
//! It runs on a current-thread runtime, like the single-threaded dnsmasq it
//! is compared with in `tests/bench/dns.sh`: on the 2-core bench machine the
//! multi-threaded runtime cost about 30 % more CPU per query (worker wake-ups
//! and cross-thread handoff), for no gain in queries per second.

use std::sync::Arc;

use anyhow::{Context, Result};
use mprov_api::boot::BootConfig;
use mprov_dns::{DnsConfig, Server};
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, UdpSocket};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    if let Err(err) = run().await {
        eprintln!("serve_snapshot: {err:#}");
        std::process::exit(1);
    }
    Ok(())
}

async fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(listen)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: serve_snapshot <bootconfig.json> <addr:port>");
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let snapshot: BootConfig =
        serde_json::from_str(&text).with_context(|| format!("parse {path}"))?;
    let mut config = DnsConfig::default();
    if let Ok(port) = std::env::var("MPROV_DNS_UPSTREAM_PORT") {
        config.upstream_port = port.parse().context("MPROV_DNS_UPSTREAM_PORT")?;
    }
    let udp = UdpSocket::bind(&listen)
        .await
        .with_context(|| format!("bind udp {listen}"))?;
    let addr = udp.local_addr()?;
    let tcp = TcpListener::bind(addr)
        .await
        .with_context(|| format!("bind tcp {addr}"))?;
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(snapshot));
    let mut registry = Registry::with_prefix("mprov");
    let server = Server::new(config, rx, &mut registry);
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        stop.cancel();
    });
    println!("listening {addr}");
    server.run(udp, Some(tcp), shutdown).await?;
    Ok(())
}
