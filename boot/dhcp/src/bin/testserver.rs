//! A DHCP server process for the durability test and the benchmark:
//! `mprov-dhcp-testserver <lease-log> <bootconfig.json> <server-ip> [bind]`
//! binds `bind` (default 127.0.0.1 on a free port), prints `port <n>` once it
//! serves, and runs until killed. Not for production: the job server binary
//! wires the same library to its config and the control service.

#![warn(missing_docs)]

use std::net::Ipv4Addr;
use std::sync::Arc;

use anyhow::Context as _;
use mprov_dhcp::{DhcpConfig, LeaseStore, Server, StoreOptions};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (log, config, server_ip, bind) = match args.as_slice() {
        [_, log, config, ip] => (log, config, ip, "127.0.0.1:0"),
        [_, log, config, ip, bind] => (log, config, ip, bind.as_str()),
        _ => anyhow::bail!(
            "usage: mprov-dhcp-testserver <lease-log> <bootconfig.json> <server-ip> [bind]"
        ),
    };
    let server_ip: Ipv4Addr = server_ip.parse().context("server ip")?;
    let snapshot = std::fs::read(config).with_context(|| format!("reading {config}"))?;
    let snapshot = serde_json::from_slice(&snapshot).context("parsing the boot config")?;
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(snapshot));
    let store = LeaseStore::open(log.as_ref(), StoreOptions::default())?;
    let socket = tokio::net::UdpSocket::bind(bind)
        .await
        .with_context(|| format!("binding {bind}"))?;
    println!("port {}", socket.local_addr()?.port());
    let server = Server::new(DhcpConfig::new(server_ip), rx, store);
    server.run(socket, CancellationToken::new()).await?;
    Ok(())
}
