//! The image-update module against a real control service (in process,
//! SQLite) with the export on a small loop-mounted ext4: the inventory's
//! image is built from the directory its config_params name; a new version
//! larger than the free space fails with the full disk's reason, leaves no
//! temporary folder and the previous version byte for byte; a version that
//! fits is built and reaches publishing. Needs root (mount).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Result, bail, ensure};
use mprov_boot::modules::image_update::{
    UpdateContext, build_version, host_arch, image_update, plan, read_inventory,
};
use mprov_image::PackOptions;
use mprov_tests::loopfs::{LoopFs, noise};
use serde_json::json;

use crate::admin_control;

/// A root of `files` incompressible files of `mib` MiB each.
pub(crate) fn root(dir: &Path, files: u64, mib: usize) -> Result<()> {
    fs::create_dir_all(dir.join("etc"))?;
    fs::write(dir.join("etc/hostname"), "node\n")?;
    for i in 0..files {
        let mut f = fs::File::create(dir.join("etc").join(format!("blob{i}")))?;
        f.write_all(&noise(i + 7, mib << 20))?;
    }
    Ok(())
}

/// Every file below `dir`, with its bytes.
pub(crate) fn snapshot(dir: &Path) -> Result<BTreeMap<PathBuf, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(snapshot(&path)?);
        } else {
            out.insert(path.strip_prefix(dir)?.to_path_buf(), fs::read(&path)?);
        }
    }
    Ok(out)
}

/// The names in a folder, sorted.
pub(crate) fn names(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    Ok(names)
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_update_on_a_full_disk_fails_and_keeps_the_previous_version() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (client, stop, task) = admin_control(dir.path()).await;

    let small = dir.path().join("small");
    root(&small, 1, 2)?;
    let big = dir.path().join("big");
    let disk = LoopFs::new(64)?;
    root(&big, disk.available()? / (8 << 20) + 2, 8)?;
    let agent = dir.path().join("mprov-agent");
    fs::write(&agent, "#!/bin/sh\n")?;
    let ctx = UpdateContext {
        export: disk.path().to_path_buf(),
        agent: Some(agent),
        pack: PackOptions {
            threads: 2,
            ..PackOptions::default()
        },
    };
    let source = |root: &Path| format!("image_source:\n  dir: {}\n", root.display());

    client
        .create(
            "distros",
            &json!({"slug": "deb", "vendor": "Debian", "version": "12", "config_params": "image_kernel: none\n"}),
        )
        .await?;
    client
        .create(
            "images",
            &json!({"slug": "compute", "distro": "deb", "config_params": source(&small)}),
        )
        .await?;

    // Version 1, from the inventory, built and kept.
    let (kept, sink) = lines();
    let inventory = read_inventory(&client, "compute").await?;
    let v1 = plan(&inventory, host_arch())?;
    ensure!(v1.version == 1);
    let (manifest, _) = build_version(&ctx, &v1, &sink).await?;
    ensure!(manifest.version == 1 && manifest.slug == "compute");
    let image_dir = ctx.images_dir().join("compute");
    let before = snapshot(&image_dir.join("1"))?;
    ensure!(before.contains_key(Path::new("rootfs.tar.zst")));
    ensure!(
        kept.lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("copying the root")),
        "{:?}",
        kept.lock().unwrap()
    );

    // A rebuild from a root larger than the disk's free space.
    client
        .update(
            "images",
            "compute",
            &json!({"config_params": source(&big), "needs_rebuild": true}),
        )
        .await?;
    let (kept, sink) = lines();
    let err = match image_update(&ctx, &client, &json!({"image": "compute"}), &sink).await {
        Ok(()) => bail!("version 2 fit on the disk"),
        Err(err) => format!("{err:#}"),
    };
    eprintln!("image-update failed as it should: {err}");
    let want = format!(
        "no space left on device while copying the root in {}: free ",
        image_dir.display()
    );
    ensure!(err.contains(&want), "{err}\nwanted {want:?}");
    ensure!(err.contains(" MiB, needs more"), "{err}");
    ensure!(
        kept.lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("building compute version 2")),
        "{:?}",
        kept.lock().unwrap()
    );
    ensure!(
        names(&image_dir)? == ["1"],
        "left: {:?}",
        names(&image_dir)?
    );
    ensure!(
        snapshot(&image_dir.join("1"))? == before,
        "version 1 changed"
    );

    // A superseded job says so and builds nothing.
    let err = image_update(
        &ctx,
        &client,
        &json!({"image": "compute", "version": 1}),
        &sink,
    )
    .await
    .expect_err("superseded");
    ensure!(format!("{err:#}").contains("superseded"), "{err:#}");

    // Version 2 that fits: built, verified, and handed to publishing (which
    // an API key may not do: only a job server records what it hosts).
    client
        .update(
            "images",
            "compute",
            &json!({"config_params": source(&small)}),
        )
        .await?;
    let err = image_update(
        &ctx,
        &client,
        &json!({"image": "compute", "version": 2}),
        &sink,
    )
    .await
    .expect_err("an API key is not a job server");
    ensure!(
        format!("{err:#}").contains("recording that this job server hosts compute version 2"),
        "{err:#}"
    );
    ensure!(names(&image_dir)? == ["1", "2"]);
    mprov_image::verify(&image_dir.join("2"))?;
    // A retry finds the version built and goes straight to publishing.
    let (kept, sink) = lines();
    let _ = image_update(&ctx, &client, &json!({"image": "compute"}), &sink).await;
    ensure!(
        kept.lock()
            .unwrap()
            .first()
            .is_some_and(|l| l.ends_with("exists: verifying it against its manifest")),
        "{:?}",
        kept.lock().unwrap()
    );

    stop.cancel();
    task.await?;
    Ok(())
}
