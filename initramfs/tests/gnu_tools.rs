//! The archives we write, read by the tools nobody here wrote: GNU `cpio`
//! lists and extracts them (as root, so owners and device nodes are real),
//! and the system's `gzip` and `zstd` decompress them.
//!
//! The tools are Debian packages that `cargo xtask test` installs; a missing
//! tool fails these tests. Extraction needs root (mknod, chown).
//!
//! The one integration-test binary of this crate (one binary links once).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use mprov_initramfs::{Archive, Compression, Device, Initramfs, Meta};

const MTIME: u32 = 1_700_000_000;

/// Runs `program args` with `input` on stdin in `dir`; its stdout, or a
/// panic naming the program when it is missing or fails.
fn pipe(program: &str, args: &[&str], input: &[u8], dir: Option<&Path>) -> Vec<u8> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!("cannot run {program} ({e}): install it (`cargo xtask test` does)")
    });
    let mut stdin = child.stdin.take().expect("stdin");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().expect("wait");
    writer
        .join()
        .expect("writer thread")
        .expect("writing stdin");
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn assert_root() {
    let uid = fs::metadata("/proc/self").expect("/proc/self").uid();
    assert_eq!(
        uid, 0,
        "extracting with owners and device nodes needs root (run as root, as CI does)"
    );
}

/// An archive with every kind of entry, odd modes and owners, implicit
/// parents, a hard link group and a file streamed from disk.
fn every_kind(streamed: &Path) -> Archive {
    let mut a = Archive::new().with_mtime(MTIME);
    a.dir("data", Meta::new(0o750).owner(1000, 100))
        .expect("add");
    a.file(
        "data/bytes.txt",
        "hello\n",
        Meta::new(0o644).owner(1000, 100).mtime(1_600_000_000),
    )
    .expect("add");
    a.file(
        "data/streamed.bin",
        streamed.to_path_buf(),
        Meta::new(0o600),
    )
    .expect("add");
    a.file("data/suid", "x", Meta::new(0o4755)).expect("add");
    a.file("data/empty", Vec::new(), Meta::new(0o644))
        .expect("add");
    a.device("dev/console", Device::Char(5, 1), Meta::new(0o600))
        .expect("add");
    a.device("dev/big", Device::Char(259, 65_541), Meta::new(0o640))
        .expect("add");
    a.device(
        "dev/sda1",
        Device::Block(8, 1),
        Meta::new(0o660).owner(0, 6),
    )
    .expect("add");
    a.fifo("run/fifo", Meta::new(0o644)).expect("add");
    a.file("links/b", "linked\n", Meta::new(0o640).owner(7, 8))
        .expect("add");
    a.hard_link("links/a", "links/b").expect("add");
    a.hard_link("links/c", "links/b").expect("add");
    a.symlink("bin/sh", "busybox", (0, 0)).expect("add");
    a.symlink("bin/abs", "/etc/passwd", (3, 4)).expect("add");
    a.dir("tmp", Meta::new(0o1777)).expect("add");
    a.file("x/y/z/deep", "deep", Meta::new(0o444)).expect("add");
    a
}

/// `cpio -itvn` lines as (permissions, nlink, uid, gid, size or "major,minor",
/// name with ` -> target` for symlinks).
fn listing(archive: &[u8]) -> Vec<String> {
    let out = pipe("cpio", &["-itvn", "--quiet"], archive, None);
    String::from_utf8(out)
        .expect("utf-8 listing")
        .lines()
        .map(|line| {
            let t: Vec<&str> = line.split_whitespace().collect();
            // perms nlink uid gid (size | major, minor) month day year name...
            let (size, rest) = if t[0].starts_with(['c', 'b']) {
                (format!("{}{}", t[4], t[5]), &t[9..])
            } else {
                (t[4].to_owned(), &t[8..])
            };
            format!(
                "{} {} {} {} {} {}",
                t[0],
                t[1],
                t[2],
                t[3],
                size,
                rest.join(" ")
            )
        })
        .collect()
}

fn streamed_file(dir: &Path) -> (PathBuf, Vec<u8>) {
    let data: Vec<u8> = (0..70_001u32).map(|i| (i * 7 % 256) as u8).collect();
    let path = dir.join("streamed.src");
    fs::write(&path, &data).expect("write");
    (path, data)
}

#[test]
fn gnu_cpio_lists_what_was_written() {
    let src = tempfile::tempdir().expect("tempdir");
    let (path, _) = streamed_file(src.path());
    let bytes = every_kind(&path)
        .to_bytes(Compression::None)
        .expect("write");
    assert_eq!(
        listing(&bytes),
        [
            "drwxr-xr-x 2 0 0 0 bin",
            "lrwxrwxrwx 1 3 4 11 bin/abs -> /etc/passwd",
            "lrwxrwxrwx 1 0 0 7 bin/sh -> busybox",
            "drwxr-x--- 2 1000 100 0 data",
            "-rw-r--r-- 1 1000 100 6 data/bytes.txt",
            "-rw-r--r-- 1 0 0 0 data/empty",
            "-rw------- 1 0 0 70001 data/streamed.bin",
            "-rwsr-xr-x 1 0 0 1 data/suid",
            "drwxr-xr-x 2 0 0 0 dev",
            "crw-r----- 1 0 0 259,65541 dev/big",
            "crw------- 1 0 0 5,1 dev/console",
            "brw-rw---- 1 0 6 8,1 dev/sda1",
            "drwxr-xr-x 2 0 0 0 links",
            "-rw-r----- 3 7 8 0 links/a",
            "-rw-r----- 3 7 8 0 links/b",
            "-rw-r----- 3 7 8 7 links/c",
            "drwxr-xr-x 2 0 0 0 run",
            "prw-r--r-- 1 0 0 0 run/fifo",
            "drwxrwxrwt 2 0 0 0 tmp",
            "drwxr-xr-x 3 0 0 0 x",
            "drwxr-xr-x 3 0 0 0 x/y",
            "drwxr-xr-x 2 0 0 0 x/y/z",
            "-r--r--r-- 1 0 0 4 x/y/z/deep",
        ]
    );
}

#[test]
fn gnu_cpio_extracts_what_was_written() {
    assert_root();
    let src = tempfile::tempdir().expect("tempdir");
    let (path, data) = streamed_file(src.path());
    let bytes = every_kind(&path)
        .to_bytes(Compression::None)
        .expect("write");
    let out = tempfile::tempdir().expect("tempdir");
    pipe(
        "cpio",
        &["-idmv", "--no-absolute-filenames", "--quiet"],
        &bytes,
        Some(out.path()),
    );
    let root = out.path();
    let meta = |name: &str| fs::symlink_metadata(root.join(name)).expect(name);

    // (name, type, permission bits, uid, gid)
    let kinds: &[(&str, char, u32, u32, u32)] = &[
        ("bin", 'd', 0o755, 0, 0),
        ("bin/abs", 'l', 0o777, 3, 4),
        ("bin/sh", 'l', 0o777, 0, 0),
        ("data", 'd', 0o750, 1000, 100),
        ("data/bytes.txt", '-', 0o644, 1000, 100),
        ("data/empty", '-', 0o644, 0, 0),
        ("data/streamed.bin", '-', 0o600, 0, 0),
        ("data/suid", '-', 0o4755, 0, 0),
        ("dev/big", 'c', 0o640, 0, 0),
        ("dev/console", 'c', 0o600, 0, 0),
        ("dev/sda1", 'b', 0o660, 0, 6),
        ("links/a", '-', 0o640, 7, 8),
        ("links/b", '-', 0o640, 7, 8),
        ("links/c", '-', 0o640, 7, 8),
        ("run/fifo", 'p', 0o644, 0, 0),
        ("tmp", 'd', 0o1777, 0, 0),
        ("x/y/z", 'd', 0o755, 0, 0),
        ("x/y/z/deep", '-', 0o444, 0, 0),
    ];
    for (name, kind, mode, uid, gid) in kinds {
        let m = meta(name);
        let ft = m.file_type();
        let got = if ft.is_dir() {
            'd'
        } else if ft.is_symlink() {
            'l'
        } else if ft.is_char_device() {
            'c'
        } else if ft.is_block_device() {
            'b'
        } else if ft.is_fifo() {
            'p'
        } else if ft.is_file() {
            '-'
        } else {
            '?'
        };
        assert_eq!(got, *kind, "{name}: type");
        if *kind != 'l' {
            assert_eq!(m.mode() & 0o7777, *mode, "{name}: mode");
        }
        assert_eq!((m.uid(), m.gid()), (*uid, *gid), "{name}: owner");
    }

    let read = |name: &str| fs::read(root.join(name)).expect(name);
    assert_eq!(read("data/bytes.txt"), b"hello\n");
    assert_eq!(read("data/streamed.bin"), data);
    assert_eq!(read("data/suid"), b"x");
    assert_eq!(read("data/empty"), b"");
    assert_eq!(read("x/y/z/deep"), b"deep");
    assert_eq!(meta("data/bytes.txt").mtime(), 1_600_000_000);
    assert_eq!(meta("data/streamed.bin").mtime(), i64::from(MTIME));

    let link = |name: &str| fs::read_link(root.join(name)).expect(name);
    assert_eq!(link("bin/sh"), Path::new("busybox"));
    assert_eq!(link("bin/abs"), Path::new("/etc/passwd"));

    // One inode for the three names, holding the data.
    let ino = meta("links/b").ino();
    for name in ["links/a", "links/b", "links/c"] {
        assert_eq!((meta(name).ino(), meta(name).nlink()), (ino, 3), "{name}");
        assert_eq!(read(name), b"linked\n", "{name}");
    }

    // Linux's dev_t encoding (glibc's gnu_dev_major/minor).
    let dev = |name: &str| {
        let r = meta(name).rdev();
        (
            ((r >> 8) & 0xfff) | ((r >> 32) & !0xfff),
            (r & 0xff) | ((r >> 12) & !0xff),
        )
    };
    assert_eq!(dev("dev/console"), (5, 1));
    assert_eq!(dev("dev/big"), (259, 65_541));
    assert_eq!(dev("dev/sda1"), (8, 1));
}

#[test]
fn system_gzip_and_zstd_decompress_to_the_bare_archive() {
    let src = tempfile::tempdir().expect("tempdir");
    let (path, _) = streamed_file(src.path());
    let archive = every_kind(&path);
    let bare = archive.to_bytes(Compression::None).expect("bare");

    let gz = archive.to_bytes(Compression::Gzip).expect("gzip");
    pipe("gzip", &["-t"], &gz, None);
    assert_eq!(pipe("gzip", &["-dc"], &gz, None), bare);

    let zst = archive.to_bytes(Compression::Zstd).expect("zstd");
    pipe("zstd", &["-t", "-q"], &zst, None);
    assert_eq!(pipe("zstd", &["-dc", "-q"], &zst, None), bare);

    // Same inputs, same bytes, in every form.
    assert_eq!(archive.to_bytes(Compression::Gzip).expect("gzip"), gz);
    assert_eq!(archive.to_bytes(Compression::Zstd).expect("zstd"), zst);
}

/// A tree like a kernel's with depmod's index: `b` needs `a`.
fn depmod_tree(dir: &Path) -> PathBuf {
    let root = dir.join("lib/modules/6.1.0-test");
    fs::create_dir_all(root.join("kernel/drivers/net")).expect("mkdir");
    fs::write(
        root.join("modules.dep"),
        "kernel/drivers/net/b.ko: kernel/drivers/net/a.ko\nkernel/drivers/net/a.ko:\n",
    )
    .expect("write");
    fs::write(root.join("kernel/drivers/net/a.ko"), "module a").expect("write");
    fs::write(root.join("kernel/drivers/net/b.ko"), "module b").expect("write");
    root
}

#[test]
fn the_built_initramfs_lists_and_extracts_with_gnu_cpio() {
    let dir = tempfile::tempdir().expect("tempdir");
    depmod_tree(dir.path());
    let built = Initramfs::builder()
        .init(b"#!/bin/sh\n".as_slice())
        .modules(dir.path(), ["b"])
        .build(Compression::Zstd)
        .expect("build");
    let bare = pipe("zstd", &["-dc", "-q"], &built.image, None);
    let names: Vec<String> = listing(&bare)
        .iter()
        .map(|l| format!("{} {}", &l[..10], l.rsplit(' ').next().unwrap_or("")))
        .collect();
    assert_eq!(
        names,
        [
            "drwxr-xr-x dev",
            "crw------- dev/console",
            "crw-rw-rw- dev/null",
            "drwxr-xr-x etc",
            "drwxr-xr-x etc/mprov",
            "-rw-r--r-- etc/mprov/modules",
            "-rwxr-xr-x init",
            "drwxr-xr-x lib",
            "drwxr-xr-x lib/modules",
            "drwxr-xr-x lib/modules/6.1.0-test",
            "drwxr-xr-x lib/modules/6.1.0-test/kernel",
            "drwxr-xr-x lib/modules/6.1.0-test/kernel/drivers",
            "drwxr-xr-x lib/modules/6.1.0-test/kernel/drivers/net",
            "-rw-r--r-- lib/modules/6.1.0-test/kernel/drivers/net/a.ko",
            "-rw-r--r-- lib/modules/6.1.0-test/kernel/drivers/net/b.ko",
            "dr-xr-xr-x proc",
            "drwxr-xr-x run",
            "dr-xr-xr-x sys",
            "drwxrwxrwt tmp",
        ]
    );
    let list = pipe(
        "cpio",
        &["-i", "--to-stdout", "--quiet", "etc/mprov/modules"],
        &bare,
        None,
    );
    assert_eq!(
        String::from_utf8(list).expect("utf-8"),
        "/lib/modules/6.1.0-test/kernel/drivers/net/a.ko\n\
         /lib/modules/6.1.0-test/kernel/drivers/net/b.ko\n"
    );
}

#[test]
fn the_cli_builds_an_image_and_explains_mistakes() {
    let bin = env!("CARGO_BIN_EXE_mprov-initramfs");
    let dir = tempfile::tempdir().expect("tempdir");
    depmod_tree(dir.path());
    let init = dir.path().join("agent");
    fs::write(&init, "#!/bin/sh\n").expect("write");
    let out = dir.path().join("initrd.img");
    let run = |args: &[&str]| {
        Command::new(bin)
            .args(args)
            .env_remove("SOURCE_DATE_EPOCH")
            .output()
            .expect("run mprov-initramfs")
    };
    let tree = dir.path().to_str().expect("utf-8 path");
    let (init_arg, out_arg) = (init.to_str().expect("utf-8"), out.to_str().expect("utf-8"));

    let ok = run(&[
        "--init",
        init_arg,
        "--kernel-modules",
        tree,
        "--module",
        "b",
        "--compress",
        "gzip",
        "-o",
        out_arg,
    ]);
    let stderr = String::from_utf8_lossy(&ok.stderr);
    assert!(ok.status.success(), "{stderr}");
    assert!(
        stderr.contains("in load order (/etc/mprov/modules): a b"),
        "{stderr}"
    );
    let bare = pipe("gzip", &["-dc"], &fs::read(&out).expect("image"), None);
    let init_back = pipe(
        "cpio",
        &["-i", "--to-stdout", "--quiet", "init"],
        &bare,
        None,
    );
    assert_eq!(init_back, b"#!/bin/sh\n");

    let missing = run(&[
        "--init",
        init_arg,
        "--kernel-modules",
        tree,
        "--module",
        "e1000",
        "-o",
        out_arg,
    ]);
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("error: building the initramfs: no module e1000 in "),
        "{stderr}"
    );

    let no_tree = run(&["--init", init_arg, "--module", "b", "-o", out_arg]);
    assert!(!no_tree.status.success());
    assert!(String::from_utf8_lossy(&no_tree.stderr).contains("--kernel-modules <DIR>"));

    let help = run(&["--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--init",
        "--kernel-modules",
        "--module",
        "--extra",
        "--pci",
        "--compress",
    ] {
        assert!(text.contains(flag), "--help lacks {flag}: {text}");
    }
}
