//! A full disk during a build, on a real (small, loop-mounted) file system:
//! the build fails with [`BuildError::NoSpace`] naming what it was writing,
//! where, and what is free; no temporary folder is left; the previous
//! version's files are byte-identical. Needs root (mount) and e2fsprogs.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Result, bail, ensure};
use mprov_image::{BuildError, BuildOptions, KernelChoice, PackOptions, Recipe, Source, Steps};
use mprov_tests::loopfs::{LoopFs, noise};

/// A root of `files` incompressible files of `mib` MiB each.
fn root(dir: &Path, files: u64, mib: usize) -> Result<()> {
    fs::create_dir_all(dir.join("data"))?;
    fs::write(dir.join("hello"), "hello\n")?;
    for i in 0..files {
        let mut f = fs::File::create(dir.join("data").join(format!("blob{i}")))?;
        f.write_all(&noise(i + 1, mib << 20))?;
    }
    Ok(())
}

/// Every file below `dir` with its bytes.
fn snapshot(dir: &Path) -> Result<BTreeMap<PathBuf, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(snapshot(&path)?);
        } else {
            out.insert(path.clone(), fs::read(&path)?);
        }
    }
    Ok(out)
}

fn options(out: &Path, version: u64, steps: Option<Steps>) -> BuildOptions {
    BuildOptions {
        out: out.to_path_buf(),
        version: Some(version),
        kernel: KernelChoice::Without,
        agent: None,
        pack: PackOptions {
            threads: 2,
            ..PackOptions::default()
        },
        steps,
        scripts: None,
    }
}

fn recipe(source: &Path) -> Recipe {
    Recipe {
        slug: "compute".into(),
        source: Source::Dir(source.to_path_buf()),
        scripts: Vec::new(),
    }
}

/// What is in the image's folder, by name.
fn names(image_dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = fs::read_dir(image_dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    Ok(names)
}

/// Checks a failed build: a `NoSpace` error doing `doing`, only version 1
/// left, byte for byte.
fn check_failure(
    result: Result<mprov_image::Built, BuildError>,
    doing: &str,
    image_dir: &Path,
    before: &BTreeMap<PathBuf, Vec<u8>>,
) -> Result<()> {
    let err = match result {
        Ok(built) => bail!("the build fit: {}", built.dir.display()),
        Err(err) => err,
    };
    let text = err.to_string();
    let BuildError::NoSpace { free, .. } = &err else {
        bail!("not a full disk: {text} ({err:?})");
    };
    let want = format!(
        "no space left on device while {doing} in {}: free ",
        image_dir.display()
    );
    ensure!(text.starts_with(&want), "{text:?} does not start {want:?}");
    ensure!(text.ends_with(" MiB, needs more"), "{text:?}");
    ensure!(
        *free > 0,
        "the temporary folder was removed before measuring"
    );
    ensure!(
        names(image_dir)? == ["1"],
        "left behind: {:?}",
        names(image_dir)?
    );
    ensure!(
        snapshot(&image_dir.join("1"))? == *before,
        "version 1 changed"
    );
    Ok(())
}

#[test]
fn full_disk_fails_the_build_and_keeps_the_previous_version() -> Result<()> {
    let disk = LoopFs::new(64)?;
    let images = disk.path().join("images");
    let image_dir = images.join("compute");
    let work = tempfile::tempdir()?;

    // Version 1 fits; its steps come out as lines.
    let small = work.path().join("small");
    root(&small, 1, 2)?;
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let steps = Steps::new(move |line| sink.lock().unwrap().push(line.to_string()));
    let built = mprov_image::build(&recipe(&small), &options(&images, 1, Some(steps)))?;
    ensure!(built.dir == image_dir.join("1"));
    let lines = lines.lock().unwrap().clone();
    for want in ["building compute version 1", "packing: 100%", "published "] {
        ensure!(
            lines.iter().any(|l| l.starts_with(want)),
            "no {want:?} in {lines:#?}"
        );
    }
    let before = snapshot(&image_dir.join("1"))?;

    // Version 2 is larger than what is free: packing fills the disk.
    let big = work.path().join("big");
    let free = disk.available()?;
    root(&big, (free >> 20) / 8 + 2, 8)?;
    let result = mprov_image::build(&recipe(&big), &options(&images, 2, None));
    check_failure(result, "writing rootfs.tar.zst", &image_dir, &before)?;

    // With the agent hook the root is copied first: that copy fills it.
    let agent = work.path().join("agent");
    fs::write(&agent, "#!/bin/sh\n")?;
    let mut with_agent = options(&images, 2, None);
    with_agent.agent = Some(agent);
    let result = mprov_image::build(&recipe(&big), &with_agent);
    check_failure(result, "copying the root", &image_dir, &before)?;

    // The disk is usable again: the small root builds as version 2.
    mprov_image::build(&recipe(&small), &options(&images, 2, None))?;
    ensure!(names(&image_dir)? == ["1", "2"]);
    Ok(())
}
