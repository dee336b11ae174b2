//! Serves a folder with the image server, for benchmarks and manual tries.
//!
//! ```text
//! cargo run --release -p mprov-fileserver --example serve_dir -- <root> <port> [max_streams]
//! ```
//!
//! `<root>/images/...` is served as `/images/...`; every `/images/` body is a
//! stream under admission control (threshold 0) with `max_streams` permits
//! (default 1024, i.e. effectively unlimited for a benchmark). Binds
//! 127.0.0.1 only, and stops on Ctrl-C or SIGTERM.

use std::sync::Arc;

use anyhow::{Context, Result};
use mprov_api::boot::BootConfig;
use mprov_fileserver::{Config, ImageState, serve};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "mprov_fileserver=warn".into()),
        )
        .init();
    let mut args = std::env::args().skip(1);
    let usage = "usage: serve_dir <root> <port> [max_streams]";
    let root = args.next().context(usage)?;
    let port: u16 = args.next().context(usage)?.parse().context("port")?;
    let max_streams: usize = match args.next() {
        Some(n) => n.parse().context("max_streams")?,
        None => 1024,
    };

    let mut config = Config::new(root);
    config.max_streams = max_streams;
    config.stream_threshold = 0;
    let (_tx, rx) = watch::channel(Arc::new(BootConfig::default()));
    let state = ImageState::new(config, rx);
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("binding 127.0.0.1:{port}"))?;
    let shutdown = CancellationToken::new();
    mprov_process::Signals::new()?.cancel_on_signal(shutdown.clone());
    eprintln!("serving on {}", listener.local_addr()?);
    serve(listener, state, shutdown).await?;
    Ok(())
}
