//! A standalone server for benchmarks and manual tests:
//! `serve <root> <listen-addr> [max_windowsize] [max_blksize]`.
//!
//! It prints its bound address on stdout once it is listening, so a script
//! can bind port 0 and read the port back, and stops on SIGINT or SIGTERM.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use mprov_tftp::{Server, TftpConfig};
use prometheus_client::registry::Registry;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, listen, rest @ ..] = args.as_slice() else {
        anyhow::bail!("usage: serve <root> <listen-addr> [max_windowsize] [max_blksize]");
    };
    let mut config = TftpConfig::new(root);
    if let Some(w) = rest.first() {
        config.max_windowsize = w.parse().context("max_windowsize")?;
    }
    if let Some(b) = rest.get(1) {
        config.max_blksize = b.parse().context("max_blksize")?;
    }
    let listen: SocketAddr = listen.parse().context("listen address")?;
    let socket = UdpSocket::bind(listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    println!("{}", socket.local_addr()?);
    let mut registry = Registry::default();
    let server = Server::new(config, &mut registry);
    let shutdown = CancellationToken::new();
    mprov_process::Signals::new()?.cancel_on_signal(shutdown.clone());
    server.run(socket, shutdown).await?;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    eprint!("{text}");
    Ok(())
}
