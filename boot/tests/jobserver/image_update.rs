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

/// A root with a static busybox as its shell and tools, for scripts run
/// chrooted in it.
fn busybox_root(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir.join("bin"))?;
    fs::create_dir_all(dir.join("etc"))?;
    fs::copy("/usr/bin/busybox", dir.join("bin/busybox"))
        .map_err(|e| anyhow::anyhow!("/usr/bin/busybox ({e}): install busybox-static"))?;
    for tool in ["sh", "echo", "cat"] {
        std::os::unix::fs::symlink("busybox", dir.join("bin").join(tool))?;
    }
    Ok(())
}

/// The image-gen scripts of an inventory image run through the
/// script-runner: the control service's plan (distro and image layers, one
/// switched off with `disable_scripts` as a single string), in dependency
/// layers (the image's two after the distro's one they depend on, side by
/// side), inside the root; a cycle refuses the build before anything runs,
/// naming its scripts, and builds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_gen_scripts_run_through_the_script_runner_and_a_cycle_builds_nothing() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let (client, stop, task) = admin_control(dir.path()).await;
    let src = dir.path().join("root");
    busybox_root(&src)?;
    let agent = dir.path().join("mprov-agent");
    fs::write(&agent, "#!/bin/sh\n")?;
    let ctx = UpdateContext {
        export: dir.path().join("export"),
        agent: Some(agent),
        pack: PackOptions::default(),
    };
    let script = |slug: &str, deps: &[&str]| {
        json!({"slug": slug, "script_type": "image-gen", "depends_on": deps,
            "content": "echo \"$MPROV_SCRIPT\" >> /order\n"})
    };
    for (slug, deps) in [
        ("g-base", &[][..]),
        ("g-a", &["g-base"][..]),
        ("g-b", &["g-base"][..]),
        ("g-off", &[][..]),
    ] {
        client.create("scripts", &script(slug, deps)).await?;
    }
    client
        .create(
            "distros",
            &json!({"slug": "deb", "vendor": "Debian", "version": "12", "scripts": ["g-base"],
                "config_params": format!("image_kernel: none\nimage_source:\n  dir: {}\n", src.display())}),
        )
        .await?;
    client
        .create(
            "images",
            &json!({"slug": "gen", "distro": "deb", "scripts": ["g-a", "g-b", "g-off"],
                "config_params": "disable_scripts: g-off\n"}),
        )
        .await?;

    let (kept, sink) = lines();
    // Built; publishing is refused to an API key (only a job server
    // records what it hosts), as the disk-full test shows.
    let _ = image_update(&ctx, &client, &json!({"image": "gen"}), &sink).await;
    let lines = kept.lock().unwrap().clone();
    ensure!(
        lines
            .iter()
            .any(|l| l == "running image-gen scripts g-base")
            && lines
                .iter()
                .any(|l| l == "running image-gen scripts g-a, g-b"),
        "the layers: {lines:#?}"
    );
    let rootfs = ctx.images_dir().join("gen/1/rootfs.tar.zst");
    let unpacked = dir.path().join("unpacked");
    fs::create_dir_all(&unpacked)?;
    let out = std::process::Command::new("tar")
        .args(["--zstd", "-xf"])
        .arg(&rootfs)
        .arg("-C")
        .arg(&unpacked)
        .output()?;
    ensure!(out.status.success(), "tar: {out:?}");
    let order = fs::read_to_string(unpacked.join("order"))
        .map_err(|e| anyhow::anyhow!("no /order in the image ({e}): {lines:#?}"))?;
    let order: Vec<&str> = order.lines().collect();
    ensure!(
        order.len() == 3
            && order[0] == "g-base"
            && order[1..].contains(&"g-a")
            && order[1..].contains(&"g-b"),
        "what ran, in order (g-off is switched off): {order:?}"
    );

    // A cycle: refused before anything runs, naming the scripts; no new
    // version.
    client.create("scripts", &script("g-loop1", &[])).await?;
    client
        .create("scripts", &script("g-loop2", &["g-loop1"]))
        .await?;
    client
        .update("scripts", "g-loop1", &json!({"depends_on": ["g-loop2"]}))
        .await?;
    client
        .update(
            "images",
            "gen",
            &json!({"scripts": ["g-a", "g-b", "g-loop1", "g-loop2"], "needs_rebuild": true}),
        )
        .await?;
    let err = match image_update(&ctx, &client, &json!({"image": "gen"}), &sink).await {
        Ok(()) => bail!("a cycle was built"),
        Err(err) => format!("{err:#}"),
    };
    ensure!(
        err.contains("cycle") && err.contains("g-loop1") && err.contains("g-loop2"),
        "{err}"
    );
    ensure!(names(&ctx.images_dir().join("gen"))? == ["1"], "{err}");

    stop.cancel();
    task.await?;
    Ok(())
}
