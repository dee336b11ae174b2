//! The image-sync module against a real image server (`mprov_fileserver` on
//! 127.0.0.1:0 over a folder holding a version `mprov-image` built): the
//! copy is byte-identical; a partial file left by an earlier attempt is
//! continued with a `Range` request (the server's download record shows only
//! the missing bytes sent); a partial file that does not belong is noticed
//! and downloaded again; a corrupted source fails the job and leaves no
//! folder behind. The source job server's address and port come from the
//! inventory of a real control service.

use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Result, bail, ensure};
use mprov_api::boot::BootConfig;
use mprov_boot::modules::image_sync::{
    SyncContext, SyncError, copy_version, http_client, source_urls,
};
use mprov_boot::modules::image_update::hosted_files;
use mprov_fileserver::{Config, Download, ImageState, serve};
use mprov_image::{BuildOptions, KernelChoice, PackOptions, Recipe, Source};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::admin_control;
use crate::image_update::{names, root, snapshot};

/// A progress sink that keeps the lines.
fn lines() -> (
    Arc<Mutex<Vec<String>>>,
    impl Fn(&str) + Send + Sync + 'static,
) {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let sink = kept.clone();
    (kept, move |line: &str| {
        sink.lock().unwrap().push(line.to_string())
    })
}

fn said(kept: &Arc<Mutex<Vec<String>>>, what: &str) -> bool {
    kept.lock().unwrap().iter().any(|l| l.contains(what))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_sync_copies_resumes_and_refuses_a_bad_source() -> Result<()> {
    let dir = tempfile::tempdir()?;

    // The source job server's export: version 1 of `compute`, with a kernel.
    let source = dir.path().join("source");
    let src_root = dir.path().join("root");
    root(&src_root, 1, 3)?;
    let kernel = dir.path().join("vmlinuz-6.1.0-test");
    fs::write(&kernel, mprov_tests::loopfs::noise(99, 300_000))?;
    let built = mprov_image::build(
        &Recipe {
            slug: "compute".into(),
            source: Source::Dir(src_root),
            scripts: Vec::new(),
        },
        &BuildOptions {
            out: source.join("images"),
            version: Some(1),
            kernel: KernelChoice::File(kernel),
            agent: None,
            pack: PackOptions {
                threads: 2,
                ..PackOptions::default()
            },
            steps: None,
            scripts: None,
        },
    )?;
    let files = hosted_files(&built.manifest);
    ensure!(files.len() == 2, "{files:?}");
    let original = snapshot(&built.dir)?;
    let rootfs = &original[Path::new("rootfs.tar.zst")];

    // Its image server, recording every download.
    let downloads = Arc::new(Mutex::new(Vec::<Download>::new()));
    let sink = downloads.clone();
    let (_tx, rx) = watch::channel(Arc::new(BootConfig::default()));
    let state = ImageState::new(Config::new(&source), rx)
        .on_download(move |d: &Download| sink.lock().unwrap().push(d.clone()));
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let port = listener.local_addr()?.port();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(listener, state, shutdown.clone()));

    // Where it is, as the inventory says (a real control service).
    let (client, stop, task) = admin_control(dir.path()).await;
    client
        .create(
            "jobservers",
            &json!({"name": "js1", "addresses": ["127.0.0.1"], "port": port}),
        )
        .await?;
    let sources = source_urls(&client, "js1").await?;
    ensure!(
        sources == [format!("http://127.0.0.1:{port}")],
        "{sources:?}"
    );
    stop.cancel();
    task.await?;

    let http = http_client()?;
    let rootfs_sent = |downloads: &Arc<Mutex<Vec<Download>>>| -> Vec<u64> {
        downloads
            .lock()
            .unwrap()
            .iter()
            .filter(|d| d.path == "/images/compute/1/rootfs.tar.zst")
            .map(|d| d.bytes)
            .collect()
    };

    // 1. An earlier attempt left the first half of the root archive.
    let target = dir.path().join("target1");
    let ctx = SyncContext::new(&target);
    let temp = target.join("images/compute/.sync-1");
    fs::create_dir_all(&temp)?;
    let half = rootfs.len() / 2;
    fs::write(temp.join("rootfs.tar.zst"), &rootfs[..half])?;
    let (kept, sink) = lines();
    let copied = copy_version(&ctx, &http, &sources, "compute", 1, &files, &sink).await?;
    ensure!(copied == target.join("images/compute/1"));
    ensure!(snapshot(&copied)? == original, "the copy differs");
    ensure!(names(&target.join("images/compute"))? == ["1"]);
    ensure!(
        rootfs_sent(&downloads) == [(rootfs.len() - half) as u64],
        "the server sent {:?} of the root archive; only the missing {} bytes were due",
        rootfs_sent(&downloads),
        rootfs.len() - half
    );
    ensure!(
        said(&kept, &format!("rootfs.tar.zst: resuming at {half} of")),
        "{:?}",
        kept.lock().unwrap()
    );
    // Run again: it is there, checked, and nothing is downloaded.
    downloads.lock().unwrap().clear();
    let (kept, sink) = lines();
    copy_version(&ctx, &http, &sources, "compute", 1, &files, &sink).await?;
    ensure!(said(&kept, "is already here and matches the record"));
    ensure!(downloads.lock().unwrap().is_empty());

    // 2. A partial file that is not the source's: resumed, found wrong, and
    // downloaded again from its start.
    let target = dir.path().join("target2");
    let ctx = SyncContext::new(&target);
    let temp = target.join("images/compute/.sync-1");
    fs::create_dir_all(&temp)?;
    fs::write(temp.join("rootfs.tar.zst"), vec![0x55u8; half])?;
    let (kept, sink) = lines();
    let copied = copy_version(&ctx, &http, &sources, "compute", 1, &files, &sink).await?;
    ensure!(snapshot(&copied)? == original, "the copy differs");
    ensure!(
        said(&kept, "does not match the record after resuming"),
        "{:?}",
        kept.lock().unwrap()
    );
    ensure!(
        rootfs_sent(&downloads) == [(rootfs.len() - half) as u64, rootfs.len() as u64],
        "{:?}",
        rootfs_sent(&downloads)
    );

    // 3. The source's copy goes bad (same size, one byte flipped): the job
    // fails naming the file, and leaves nothing behind.
    let mut bad = rootfs.clone();
    bad[rootfs.len() / 3] ^= 0x01;
    fs::write(built.dir.join("rootfs.tar.zst"), &bad)?;
    let target = dir.path().join("target3");
    let ctx = SyncContext::new(&target);
    let (_, sink) = lines();
    match copy_version(&ctx, &http, &sources, "compute", 1, &files, &sink).await {
        Ok(dir) => bail!("a corrupt source was copied to {}", dir.display()),
        Err(SyncError::Corrupt { name, .. }) => ensure!(name == "rootfs.tar.zst"),
        Err(other) => bail!("not a checksum failure: {other}"),
    }
    ensure!(
        names(&target.join("images/compute"))?.is_empty(),
        "left behind: {:?}",
        names(&target.join("images/compute"))?
    );

    shutdown.cancel();
    server.await??;
    Ok(())
}
