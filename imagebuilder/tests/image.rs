//! The image builder from outside: images built here are unpacked with GNU
//! tar and compared entry by entry with their source; OCI images come from
//! umoci (not ours); bad input fails clearly and leaves earlier versions
//! alone. Needs root (device nodes, owners, chroot) and the Debian packages
//! tar, zstd, attr, umoci, busybox-static and mmdebstrap, which `cargo xtask
//! test` installs; a missing one fails the test.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use mprov_image::{
    BuildError, BuildOptions, KernelChoice, PackOptions, Recipe, Script, Source, build, verify,
};
use sha2::{Digest, Sha256};

/// Runs a command, failing with its output if it fails.
fn sh(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("running {cmd:?} (is its Debian package installed?)"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn options(out: &Path) -> BuildOptions {
    BuildOptions {
        out: out.to_path_buf(),
        version: None,
        kernel: KernelChoice::Without,
        agent: None,
        pack: PackOptions {
            threads: 2,
            ..PackOptions::default()
        },
        steps: None,
        scripts: None,
    }
}

fn recipe(slug: &str, source: Source) -> Recipe {
    Recipe {
        slug: slug.into(),
        source,
        scripts: Vec::new(),
    }
}

/// A tree with one of everything a root holds.
fn fixture(root: &Path) -> Result<()> {
    for dir in ["etc", "empty", "dev", "run", "usr/bin", "var"] {
        fs::create_dir_all(root.join(dir))?;
    }
    fs::write(root.join("etc/file"), "hello\n")?;
    fs::set_permissions(root.join("etc/file"), fs::Permissions::from_mode(0o640))?;
    std::os::unix::fs::chown(root.join("etc/file"), Some(1000), Some(100))?;
    fs::hard_link(root.join("etc/file"), root.join("etc/file.link"))?;
    // The unpacker's short way (creation gives the owner and mode) and its
    // edges: modes root's creation gets right (0644, 0600), one the umask
    // would cut (0664), and a root-owned file in a setgid folder, where a new
    // file takes the folder's group.
    for (name, mode) in [
        ("etc/plain", 0o644),
        ("etc/private", 0o600),
        ("etc/shared", 0o664),
    ] {
        fs::write(root.join(name), name)?;
        fs::set_permissions(root.join(name), fs::Permissions::from_mode(mode))?;
    }
    fs::create_dir(root.join("var/mail"))?;
    std::os::unix::fs::chown(root.join("var/mail"), Some(0), Some(8))?;
    fs::set_permissions(root.join("var/mail"), fs::Permissions::from_mode(0o2775))?;
    fs::write(root.join("var/mail/root"), "mail")?;
    std::os::unix::fs::chown(root.join("var/mail/root"), Some(0), Some(0))?;
    symlink("file", root.join("etc/sym"))?;
    std::os::unix::fs::lchown(root.join("etc/sym"), Some(7), Some(8))?;
    sh(Command::new("mknod")
        .arg(root.join("dev/null2"))
        .args(["c", "1", "3"]))?;
    sh(Command::new("mknod")
        .arg(root.join("dev/loop9"))
        .args(["b", "7", "9"]))?;
    sh(Command::new("mkfifo").arg(root.join("run/fifo")))?;
    fs::write(root.join("usr/bin/su"), b"\x7fELF not really")?;
    fs::set_permissions(root.join("usr/bin/su"), fs::Permissions::from_mode(0o4755))?;
    fs::write(root.join("usr/bin/ping"), "cap")?;
    sh(Command::new("setfattr")
        .args(["-n", "user.mprov", "-v", "labelled"])
        .arg(root.join("usr/bin/ping")))?;
    sh(Command::new("setfattr")
        .args(["-n", "trusted.mprov", "-v", "0x00ff10"])
        .arg(root.join("usr/bin/ping")))?;
    // 64 MiB with a hole before a few bytes at the end.
    let mut sparse = File::create(root.join("var/sparse"))?;
    sparse.seek(SeekFrom::Start(64 << 20))?;
    sparse.write_all(b"end")?;
    fs::set_permissions(root.join("empty"), fs::Permissions::from_mode(0o1777))?;
    std::os::unix::fs::chown(root.join("empty"), Some(1234), Some(5678))?;
    let long = root
        .join("a".repeat(60))
        .join("b".repeat(60))
        .join("c".repeat(40));
    fs::create_dir_all(&long)?;
    fs::write(long.join("file-with-a-long-path"), "deep")?;
    symlink(
        format!("{}/{}", "x".repeat(80), "y".repeat(80)),
        root.join("long-target"),
    )?;
    // Fixed mtimes, files and directories, deepest first.
    let mut all = Vec::new();
    collect(root, Path::new(""), &mut all)?;
    all.reverse();
    for rel in all {
        sh(Command::new("touch")
            .args(["-h", "-d", "@1700000000"])
            .arg(root.join(&rel)))?;
    }
    Ok(())
}

fn collect(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    out.push(rel.to_path_buf());
    let full = root.join(rel);
    if fs::symlink_metadata(&full)?.is_dir() {
        let mut names: Vec<_> = fs::read_dir(&full)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        names.sort();
        for name in names {
            collect(root, &rel.join(name), out)?;
        }
    }
    Ok(())
}

/// Everything compared about one entry.
#[derive(Debug, PartialEq, Eq)]
struct Snap {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    sha256: Option<String>,
    target: Option<PathBuf>,
    rdev: u64,
    xattrs: BTreeMap<String, Vec<u8>>,
    mtime: Option<i64>,
    /// The other paths sharing this inode (hard links).
    links: Vec<PathBuf>,
}

/// Snapshot of a tree; `dir_mtimes` compares directory mtimes too.
fn snapshot(root: &Path, dir_mtimes: bool) -> Result<BTreeMap<PathBuf, Snap>> {
    let mut paths = Vec::new();
    collect(root, Path::new(""), &mut paths)?;
    let mut inodes: BTreeMap<u64, Vec<PathBuf>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for rel in &paths {
        let full = root.join(rel);
        let m = fs::symlink_metadata(&full)?;
        let ft = m.file_type();
        let kind = match () {
            _ if ft.is_dir() => "dir",
            _ if ft.is_file() => "file",
            _ if ft.is_symlink() => "symlink",
            _ if ft.is_char_device() => "char",
            _ if ft.is_block_device() => "block",
            _ if ft.is_fifo() => "fifo",
            _ => "other",
        };
        if ft.is_file() && m.nlink() > 1 {
            inodes.entry(m.ino()).or_default().push(rel.clone());
        }
        let mut xattrs = BTreeMap::new();
        for name in xattr::list(&full)? {
            let value = xattr::get(&full, &name)?.unwrap_or_default();
            xattrs.insert(name.to_string_lossy().into_owned(), value);
        }
        out.insert(
            rel.clone(),
            Snap {
                kind,
                mode: m.mode() & 0o7777,
                uid: m.uid(),
                gid: m.gid(),
                size: if ft.is_dir() { 0 } else { m.len() },
                sha256: ft
                    .is_file()
                    .then(|| fs::read(&full).map(|b| hex::encode(Sha256::digest(b))))
                    .transpose()?,
                target: ft.is_symlink().then(|| fs::read_link(&full)).transpose()?,
                rdev: m.rdev(),
                xattrs,
                mtime: (dir_mtimes || !ft.is_dir()).then_some(m.mtime()),
                links: Vec::new(),
            },
        );
    }
    for group in inodes.values() {
        for path in group {
            if let Some(snap) = out.get_mut(path) {
                snap.links = group.iter().filter(|p| *p != path).cloned().collect();
            }
        }
    }
    Ok(out)
}

/// Unpacks a rootfs.tar.zst with zstd and GNU tar (as root: owners, modes,
/// xattrs, devices).
fn gnu_unpack(archive: &Path, dest: &Path) -> Result<()> {
    fs::create_dir_all(dest)?;
    sh(Command::new("sh").arg("-c").arg(format!(
        "zstd -dc '{}' | tar --xattrs --xattrs-include='*' --numeric-owner -xpf - -C '{}'",
        archive.display(),
        dest.display()
    )))?;
    Ok(())
}

fn assert_same(a: &BTreeMap<PathBuf, Snap>, b: &BTreeMap<PathBuf, Snap>) {
    let keys_a: Vec<_> = a.keys().collect();
    let keys_b: Vec<_> = b.keys().collect();
    assert_eq!(keys_a, keys_b, "the trees hold different paths");
    for (path, snap) in a {
        assert_eq!(Some(snap), b.get(path), "{} differs", path.display());
    }
}

/// No temporary build folders left beside the versions.
fn leftovers(image_dir: &Path) -> Result<Vec<String>> {
    Ok(fs::read_dir(image_dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|n| n.starts_with('.'))
        .collect())
}

#[test]
fn dir_round_trip_through_gnu_tar() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let src = tmp.path().join("src");
    fixture(&src)?;
    let out = tmp.path().join("images");
    let built = build(&recipe("round", Source::Dir(src.clone())), &options(&out))?;
    assert_eq!(built.dir, out.join("round/1"));
    let manifest = verify(&built.dir)?;
    assert_eq!(manifest, built.manifest);
    assert_eq!(manifest.slug, "round");
    assert_eq!(manifest.version, 1);
    assert_eq!(manifest.source, format!("dir:{}", src.display()));

    let dest = tmp.path().join("gnu");
    gnu_unpack(&built.dir.join("rootfs.tar.zst"), &dest)?;
    let want = snapshot(&src, true)?;
    assert_same(&want, &snapshot(&dest, true)?);
    assert_eq!(manifest.file_count, want.len() as u64);
    // Every kind of entry is in the fixture (and so was compared).
    for kind in ["dir", "file", "symlink", "char", "block", "fifo"] {
        assert!(want.values().any(|s| s.kind == kind), "no {kind}");
    }
    assert!(want.keys().any(|p| p.as_os_str().len() > 100));
    // The hole survived: GNU tar recreates it from our sparse entry.
    let sparse = fs::metadata(dest.join("var/sparse"))?;
    assert!(
        sparse.blocks() * 512 < 1 << 20,
        "{} blocks",
        sparse.blocks()
    );

    // The same tree gives the same bytes.
    let again = build(&recipe("round", Source::Dir(src.clone())), &options(&out))?;
    assert_eq!(again.manifest.version, 2);
    assert_eq!(again.manifest.artifacts, manifest.artifacts);

    // Our own unpacker gives the same tree too.
    let ours = tmp.path().join("ours");
    mprov_image::unpack_file(&built.dir.join("rootfs.tar.zst"), &ours, false)?;
    assert_same(&want, &snapshot(&ours, true)?);
    Ok(())
}

/// An OCI layout made by umoci: the fixture, plus a layer deleting a file and
/// a folder (whiteouts). Returns the layout and umoci's own unpacking of it.
fn umoci_image(work: &Path) -> Result<(PathBuf, PathBuf)> {
    let layout = work.join("layout");
    let bundle = work.join("bundle");
    let image = format!("{}:t", layout.display());
    sh(Command::new("umoci")
        .args(["init", "--layout"])
        .arg(&layout))?;
    sh(Command::new("umoci").args(["new", "--image", &image]))?;
    sh(Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(&bundle))?;
    let rootfs = bundle.join("rootfs");
    fixture(&rootfs)?;
    fs::create_dir_all(rootfs.join("gone/sub"))?;
    fs::write(rootfs.join("gone/sub/f"), "x")?;
    fs::write(rootfs.join("etc/removed"), "y")?;
    sh(Command::new("umoci")
        .args(["repack", "--refresh-bundle", "--image", &image])
        .arg(&bundle))?;
    fs::remove_dir_all(rootfs.join("gone"))?;
    fs::remove_file(rootfs.join("etc/removed"))?;
    sh(Command::new("umoci")
        .args(["repack", "--image", &image])
        .arg(&bundle))?;
    let expected = work.join("expected");
    sh(Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(&expected))?;
    Ok((layout, expected.join("rootfs")))
}

#[test]
fn oci_archive_from_umoci_with_whiteouts() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (layout, expected) = umoci_image(tmp.path())?;
    // The layer listing proves the whiteouts are really there.
    let listing = sh(Command::new("sh").arg("-c").arg(format!(
        // Blobs that are not layers (the config, the manifest) are skipped:
        // the loop's status must not depend on which blob sorts last.
        "for f in '{}'/blobs/sha256/*; do tar -tzf \"$f\" 2>/dev/null || true; done",
        layout.display()
    )))?;
    assert!(
        listing.lines().any(|l| l.ends_with(".wh.gone")),
        "{listing}"
    );
    assert!(
        listing.lines().any(|l| l.ends_with(".wh.removed")),
        "{listing}"
    );

    // An oci-archive: the layout in a tar made by GNU tar.
    let archive = tmp.path().join("image.tar");
    sh(Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&archive)
        .arg("."))?;
    let out = tmp.path().join("images");
    let source = Source::Oci {
        path: archive.clone(),
        reference: Some("t".into()),
    };
    let built = build(&recipe("oci", source), &options(&out))?;
    verify(&built.dir)?;
    let dest = tmp.path().join("gnu");
    gnu_unpack(&built.dir.join("rootfs.tar.zst"), &dest)?;
    assert!(!dest.join("gone").exists() && !dest.join("etc/removed").exists());
    // Directory mtimes are left out: a whiteout touches its folder at apply
    // time, differently in each tool.
    assert_same(&snapshot(&expected, false)?, &snapshot(&dest, false)?);

    // The layout directory works as a source too, and gives the same root.
    let from_dir = build(
        &recipe(
            "oci",
            Source::Oci {
                path: layout,
                reference: None,
            },
        ),
        &options(&out),
    )?;
    assert_eq!(from_dir.manifest.file_count, built.manifest.file_count);
    Ok(())
}

/// The older `docker save` format (before Docker 25), assembled with GNU
/// tar: `manifest.json` naming `<id>/layer.tar` files, bottom layer first,
/// the top one deleting a file and a folder with whiteouts.
#[test]
fn legacy_docker_save_archive_with_whiteouts() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let work = tmp.path();
    // Layer 1: the fixture plus what layer 2 deletes.
    let base = work.join("base");
    fixture(&base)?;
    fs::create_dir_all(base.join("gone/sub"))?;
    fs::write(base.join("gone/sub/f"), "x")?;
    fs::write(base.join("etc/removed"), "y")?;
    // Layer 2: whiteouts, and one new file.
    let top = work.join("top");
    fs::create_dir_all(top.join("etc"))?;
    fs::write(top.join(".wh.gone"), "")?;
    fs::write(top.join("etc/.wh.removed"), "")?;
    fs::write(top.join("etc/added"), "z")?;
    let image = work.join("image");
    for (id, dir) in [("aaaa", &base), ("bbbb", &top)] {
        fs::create_dir_all(image.join(id))?;
        sh(Command::new("tar")
            .args(["--xattrs", "--xattrs-include=*", "--numeric-owner", "-C"])
            .arg(dir)
            .arg("-cf")
            .arg(image.join(id).join("layer.tar"))
            .arg("."))?;
    }
    fs::write(
        image.join("cfg.json"),
        r#"{"architecture":"amd64","os":"linux"}"#,
    )?;
    fs::write(
        image.join("manifest.json"),
        r#"[{"Config":"cfg.json","RepoTags":["legacy:latest"],"Layers":["aaaa/layer.tar","bbbb/layer.tar"]}]"#,
    )?;
    let archive = work.join("legacy.tar");
    sh(Command::new("tar")
        .arg("-C")
        .arg(&image)
        .arg("-cf")
        .arg(&archive)
        .args(["manifest.json", "cfg.json", "aaaa", "bbbb"]))?;

    let out = work.join("images");
    let built = build(
        &recipe(
            "legacy",
            Source::Oci {
                path: archive.clone(),
                reference: Some("legacy:latest".into()),
            },
        ),
        &options(&out),
    )?;
    verify(&built.dir)?;
    let dest = work.join("gnu");
    gnu_unpack(&built.dir.join("rootfs.tar.zst"), &dest)?;
    assert!(!dest.join("gone").exists(), "the folder whiteout applied");
    assert!(
        !dest.join("etc/removed").exists(),
        "the file whiteout applied"
    );
    assert_eq!(fs::read_to_string(dest.join("etc/added"))?, "z");
    assert!(!dest.join(".wh.gone").exists() && !dest.join("etc/.wh.removed").exists());
    // Everything else is the fixture, entry by entry.
    let expected = work.join("expected");
    fixture(&expected)?;
    fs::write(expected.join("etc/added"), "z")?;
    // The same mtime as the layer's copy.
    sh(Command::new("touch")
        .arg("-r")
        .arg(top.join("etc/added"))
        .arg(expected.join("etc/added")))?;
    assert_same(&snapshot(&expected, false)?, &snapshot(&dest, false)?);

    // A tag that is not there is named, with the ones that are.
    let err = build(
        &recipe(
            "legacy",
            Source::Oci {
                path: archive,
                reference: Some("other:1".into()),
            },
        ),
        &options(&out),
    )
    .unwrap_err();
    let mut chain = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        chain = format!("{chain}: {s}");
        source = s.source();
    }
    assert!(
        chain.contains("other:1") && chain.contains("legacy:latest"),
        "{chain}"
    );
    Ok(())
}

/// Writes an OCI layout by hand with one layer, GNU tar and sha256 style.
fn layout_with_layer(dir: &Path, layer: &[u8]) -> Result<()> {
    let blobs = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs)?;
    let put = |bytes: &[u8]| -> Result<String> {
        let hex = hex::encode(Sha256::digest(bytes));
        fs::write(blobs.join(&hex), bytes)?;
        Ok(format!("sha256:{hex}"))
    };
    let layer_digest = put(layer)?;
    let config =
        put(br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#)?;
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config}","size":1}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{layer_digest}","size":{}}}]}}"#,
        layer.len()
    );
    let manifest_digest = put(manifest.as_bytes())?;
    fs::write(
        dir.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{manifest_digest}","size":{}}}]}}"#,
            manifest.len()
        ),
    )?;
    fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(())
}

/// A tar holding one file whose name is written raw (the tar crate's setter
/// refuses `..`, as it should).
fn tar_with_name(name: &str) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(1_700_000_000);
    header.set_size(4);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    builder.append(&header, &b"evil"[..])?;
    Ok(builder.into_inner()?)
}

#[test]
fn bad_input_fails_clearly_and_keeps_the_previous_version() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("images");
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("etc"))?;
    fs::write(src.join("etc/hostname"), "node\n")?;
    let first = build(&recipe("img", Source::Dir(src.clone())), &options(&out))?;
    let image_dir = out.join("img");
    let before = fs::read(first.dir.join("rootfs.tar.zst"))?;
    let check_untouched = |what: &str| -> Result<()> {
        ensure!(
            !image_dir.join("2").exists(),
            "{what}: a version 2 appeared"
        );
        ensure!(
            fs::read(first.dir.join("rootfs.tar.zst"))? == before,
            "{what}: version 1 changed"
        );
        verify(&first.dir)?;
        let left = leftovers(&image_dir)?;
        ensure!(left.is_empty(), "{what}: left behind {left:?}");
        Ok(())
    };
    let message = |err: BuildError| {
        let mut text = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        text
    };

    // A missing root.
    let err = build(
        &recipe("img", Source::Dir(tmp.path().join("nope"))),
        &options(&out),
    )
    .expect_err("missing root");
    assert!(message(err).contains("nope is not a directory"));
    check_untouched("missing root")?;

    // A layer with a path escaping the root.
    let escape = tmp.path().join("escape");
    layout_with_layer(&escape, &tar_with_name("../../etc/evil")?)?;
    let err = build(
        &recipe(
            "img",
            Source::Oci {
                path: escape,
                reference: None,
            },
        ),
        &options(&out),
    )
    .expect_err("escaping path");
    let text = message(err);
    assert!(
        text.contains("../../etc/evil leads out of the root"),
        "{text}"
    );
    assert!(!tmp.path().join("etc/evil").exists());
    check_untouched("escaping path")?;

    // A broken archive: a layer whose bytes do not match its digest.
    let broken = tmp.path().join("broken");
    layout_with_layer(&broken, &tar_with_name("etc/ok")?)?;
    for entry in fs::read_dir(broken.join("blobs/sha256"))? {
        let path = entry?.path();
        let mut bytes = fs::read(&path)?;
        if bytes.len() > 1024 {
            bytes[600] ^= 0xff; // inside the layer's file data
            fs::write(&path, bytes)?;
        }
    }
    let err = build(
        &recipe(
            "img",
            Source::Oci {
                path: broken,
                reference: None,
            },
        ),
        &options(&out),
    )
    .expect_err("corrupt layer");
    let text = message(err);
    assert!(text.contains("is corrupt: its content hashes to"), "{text}");
    check_untouched("corrupt layer")?;

    // A truncated archive file.
    let truncated = tmp.path().join("truncated.tar");
    fs::write(&truncated, &b"not a tar archive at all"[..])?;
    let err = build(
        &recipe(
            "img",
            Source::Oci {
                path: truncated,
                reference: None,
            },
        ),
        &options(&out),
    )
    .expect_err("not an archive");
    let text = message(err);
    assert!(text.contains("truncated.tar"), "{text}");
    check_untouched("not an archive")?;

    // An image-gen script that fails.
    let mut failing = recipe("img", Source::Dir(busybox_root(tmp.path())?));
    failing.scripts = vec![
        script("ok", "echo fine > /etc/motd", &[]),
        script("bad", "echo oops >&2; exit 3", &["ok"]),
    ];
    let err = build(&failing, &options(&out)).expect_err("failing script");
    let text = message(err);
    assert!(
        text.contains("image-gen script bad failed (exit status: 3)"),
        "{text}"
    );
    assert!(text.contains("oops"), "{text}");
    check_untouched("failing script")?;

    // An existing version is never overwritten.
    let mut again = options(&out);
    again.version = Some(1);
    let err = build(&recipe("img", Source::Dir(src)), &again).expect_err("version exists");
    assert!(message(err).contains("already exists"));
    check_untouched("existing version")?;
    Ok(())
}

fn script(slug: &str, content: &str, deps: &[&str]) -> Script {
    Script {
        slug: slug.into(),
        content: Some(content.into()),
        file: None,
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
    }
}

/// A small root: busybox-static and its applets, enough for `/bin/sh`
/// scripts in a chroot.
fn busybox_root(parent: &Path) -> Result<PathBuf> {
    let root = parent.join("busybox-root");
    if root.exists() {
        return Ok(root);
    }
    for dir in ["bin", "etc", "tmp", "proc", "sys", "dev", "boot"] {
        fs::create_dir_all(root.join(dir))?;
    }
    let busybox = Path::new("/bin/busybox");
    ensure!(
        busybox.exists(),
        "busybox is missing (apt-get install busybox-static)"
    );
    fs::copy(busybox, root.join("bin/busybox"))?;
    for applet in ["sh", "echo", "cat", "ls", "mkdir", "touch"] {
        symlink("busybox", root.join("bin").join(applet))?;
    }
    Ok(root)
}

#[test]
fn busybox_root_with_scripts_kernel_and_agent() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = busybox_root(tmp.path())?;
    // A fake kernel: enough of a bzImage header for its release.
    let mut kernel = vec![0u8; 0x400];
    kernel[0x202..0x206].copy_from_slice(b"HdrS");
    kernel[0x20e..0x210].copy_from_slice(&0x100u16.to_le_bytes());
    kernel[0x300..0x310].copy_from_slice(b"6.1.0-test #1\0\0\0");
    fs::write(root.join("boot/vmlinuz-6.1.0-9-amd64"), &kernel)?;
    fs::write(root.join("boot/vmlinuz-6.1.0-10-amd64"), &kernel)?;
    let agent = tmp.path().join("dummy-agent");
    fs::write(&agent, "#!/bin/sh\necho agent\n")?;

    let mut r = recipe("bb", Source::Dir(root.clone()));
    // Listed out of order: `first` must run before `second`.
    r.scripts = vec![
        script(
            "second",
            "echo second >> /log; echo $MPROV_IMAGE_SLUG-$MPROV_IMAGE_VERSION >> /log",
            &["first"],
        ),
        script(
            "first",
            "#!/bin/sh\necho first > /log; test -e /proc/self && echo proc >> /log",
            &[],
        ),
    ];
    let out = tmp.path().join("images");
    let mut opts = options(&out);
    opts.kernel = KernelChoice::FromRoot;
    opts.agent = Some(agent.clone());
    let built = build(&r, &opts)?;
    verify(&built.dir)?;
    assert_eq!(
        built.manifest.kernel_version.as_deref(),
        Some("6.1.0-10-amd64")
    );
    let names: Vec<&str> = built
        .manifest
        .artifacts
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    assert_eq!(names, ["rootfs.tar.zst", "vmlinuz", "initramfs.img"]);
    assert_eq!(fs::read(built.dir.join("vmlinuz"))?, kernel);
    // The image's own agent initramfs: the agent as /init, read by GNU cpio
    // (the root has no module tree for its kernel, so no modules).
    let listed = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "zstd -dc '{}' | cpio -t --quiet",
            built.dir.join("initramfs.img").display()
        ))
        .output()?;
    ensure!(listed.status.success(), "cpio -t failed");
    let listed = String::from_utf8_lossy(&listed.stdout);
    for entry in ["init", "dev/console", "etc/mprov/modules"] {
        assert!(listed.lines().any(|l| l == entry), "{entry} in {listed}");
    }
    let extracted = tmp.path().join("initramfs");
    fs::create_dir(&extracted)?;
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "zstd -dc '{}' | (cd '{}' && cpio -id --quiet init)",
            built.dir.join("initramfs.img").display(),
            extracted.display()
        ))
        .status()?;
    ensure!(status.success(), "cpio -i failed");
    assert_eq!(fs::read(extracted.join("init"))?, fs::read(&agent)?);
    // The source tree itself was not changed: the scripts ran in a copy.
    assert!(!root.join("log").exists());

    let dest = tmp.path().join("gnu");
    gnu_unpack(&built.dir.join("rootfs.tar.zst"), &dest)?;
    assert_eq!(
        fs::read_to_string(dest.join("log"))?,
        "first\nproc\nsecond\nbb-1\n"
    );
    // The mounts were not packed, and the scripts removed themselves.
    assert_eq!(fs::read_dir(dest.join("proc"))?.count(), 0);
    assert_eq!(fs::read_dir(dest.join("tmp"))?.count(), 0);
    // The agent hook.
    let bin = dest.join("usr/libexec/mprov/mprov-agent");
    assert_eq!(fs::read(&bin)?, fs::read(&agent)?);
    assert_eq!(fs::metadata(&bin)?.mode() & 0o7777, 0o755);
    let unit = fs::read_to_string(dest.join("etc/systemd/system/mprov-agent.service"))?;
    assert!(unit.contains("ExecStart=/usr/libexec/mprov/mprov-agent node"));
    assert!(unit.contains("WantedBy=multi-user.target"));
    assert_eq!(
        fs::read_link(dest.join("etc/systemd/system/multi-user.target.wants/mprov-agent.service"))?,
        Path::new("/etc/systemd/system/mprov-agent.service")
    );

    // A kernel given by path, its release from the bzImage header.
    let given = tmp.path().join("bzImage");
    fs::write(&given, &kernel)?;
    let mut opts = options(&out);
    opts.kernel = KernelChoice::File(given);
    let built = build(&recipe("bb", Source::Dir(root)), &opts)?;
    assert_eq!(built.manifest.kernel_version.as_deref(), Some("6.1.0-test"));
    Ok(())
}

#[test]
fn cli_build_verify_inspect_and_tamper() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = busybox_root(tmp.path())?;
    let out = tmp.path().join("images");
    let exe = env!("CARGO_BIN_EXE_mprov-image");
    sh(Command::new(exe)
        .args([
            "build",
            "--quiet",
            "--no-kernel",
            "--no-agent",
            "--slug",
            "cli",
            "--root",
        ])
        .arg(&root)
        .arg("--out")
        .arg(&out))?;
    let dir = out.join("cli/1");
    let verified = sh(Command::new(exe).arg("verify").arg(&dir))?;
    assert!(verified.starts_with("cli version 1: OK"), "{verified}");
    let json = sh(Command::new(exe).args(["inspect", "--json"]).arg(&dir))?;
    let manifest = mprov_image::Manifest::from_slice(json.as_bytes())?;
    assert_eq!(manifest.slug, "cli");
    let text = sh(Command::new(exe).arg("inspect").arg(&dir))?;
    assert!(text.contains("image:        cli version 1"), "{text}");

    // Tamper with the archive: verify names the artefact and fails.
    let rootfs = dir.join("rootfs.tar.zst");
    let mut bytes = fs::read(&rootfs)?;
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    fs::write(&rootfs, bytes)?;
    let failed = Command::new(exe).arg("verify").arg(&dir).output()?;
    assert!(!failed.status.success());
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(stderr.contains("rootfs.tar.zst: sha256"), "{stderr}");

    // Without an agent binary, the build says how to get one; with one
    // beside the program, every image carries it. (A copy of the program in
    // a folder of its own: target/ may hold a debug mprov-agent.)
    let alone = tmp.path().join("alone");
    fs::create_dir(&alone)?;
    let copy = alone.join("mprov-image");
    fs::copy(exe, &copy)?;
    let build = |slug: &str| {
        Command::new(&copy)
            .env_remove("MPROV_AGENT")
            .args(["build", "--quiet", "--no-kernel", "--slug", slug, "--root"])
            .arg(&root)
            .arg("--out")
            .arg(&out)
            .output()
    };
    let no_agent = build("noagent")?;
    assert!(!no_agent.status.success());
    let stderr = String::from_utf8_lossy(&no_agent.stderr);
    assert!(
        stderr.contains("--agent PATH") && stderr.contains("--no-agent"),
        "{stderr}"
    );
    assert!(!out.join("noagent").exists(), "nothing built");
    fs::write(alone.join("mprov-agent"), b"#!/bin/sh\necho agent\n")?;
    let with_agent = build("withagent")?;
    assert!(
        with_agent.status.success(),
        "{}",
        String::from_utf8_lossy(&with_agent.stderr)
    );
    let listing = sh(Command::new("sh").arg("-c").arg(format!(
        "zstd -dc '{}' | tar -t",
        out.join("withagent/1/rootfs.tar.zst").display()
    )))?;
    for entry in [
        "usr/libexec/mprov/mprov-agent",
        "etc/systemd/system/mprov-agent.service",
        "etc/systemd/system/multi-user.target.wants/mprov-agent.service",
    ] {
        assert!(
            listing.lines().any(|l| l == entry),
            "{entry} missing:\n{listing}"
        );
    }

    // No source at all.
    let none = Command::new(exe)
        .args(["build", "--slug", "x", "--out"])
        .arg(&out)
        .output()?;
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("give a source"));
    Ok(())
}

/// A real Debian root from mmdebstrap (minbase, about 30 s here), with the
/// host's own apt sources as its mirror, and an image-gen script in it.
#[test]
fn debian_bootstrap_with_mmdebstrap() -> Result<()> {
    let sources = Path::new("/etc/apt/sources.list.d/debian.sources");
    let mirror = if sources.exists() {
        sources.to_path_buf()
    } else {
        PathBuf::from("/etc/apt/sources.list")
    };
    if !mirror.exists() {
        bail!("no apt sources on this machine to bootstrap from");
    }
    let tmp = tempfile::tempdir()?;
    let recipe_path = tmp.path().join("recipe.yaml");
    fs::write(
        tmp.path().join("motd.sh"),
        "#!/bin/sh\nset -e\necho \"built by mprov-image from $(. /etc/os-release; echo $ID)\" > /etc/motd\n",
    )?;
    fs::write(
        &recipe_path,
        format!(
            "slug: debian\nsource:\n  bootstrap:\n    tool: mmdebstrap\n    suite: bookworm\n    variant: minbase\n    mirrors: ['{}']\nscripts:\n  - slug: motd\n    file: motd.sh\n",
            mirror.display()
        ),
    )?;
    let r = Recipe::read(&recipe_path)?;
    let out = tmp.path().join("images");
    let built = build(&r, &options(&out))?;
    let manifest = verify(&built.dir)?;
    assert_eq!(manifest.source, "mmdebstrap:bookworm");
    assert!(manifest.file_count > 3000, "{}", manifest.file_count);
    let dest = tmp.path().join("gnu");
    gnu_unpack(&built.dir.join("rootfs.tar.zst"), &dest)?;
    assert_eq!(
        fs::read_to_string(dest.join("etc/motd"))?,
        "built by mprov-image from debian\n"
    );
    assert!(fs::read_to_string(dest.join("etc/os-release"))?.contains("bookworm"));
    // dpkg's database came through: the root is a working Debian.
    let dpkg = sh(Command::new("chroot").arg(&dest).args([
        "dpkg-query",
        "-W",
        "-f",
        "${Package}\n",
        "dpkg",
    ]))?;
    assert_eq!(dpkg, "dpkg\n");
    Ok(())
}
