use std::io::Read;

use super::*;

/// One parsed entry of a `newc` archive: the fields the tests look at.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Parsed {
    name: String,
    /// Its header's fields, as the writer holds them.
    header: Header,
    data: Vec<u8>,
    /// Where its header starts.
    offset: usize,
}

fn field(bytes: &[u8], at: usize, index: usize) -> u32 {
    let start = at + 6 + index * 8;
    let text = std::str::from_utf8(&bytes[start..start + 8]).expect("hex field");
    u32::from_str_radix(text, 16).expect("hex field")
}

fn align(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// Parses a bare archive up to and including its trailer.
fn parse(bytes: &[u8]) -> Vec<Parsed> {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        assert_eq!(at % 4, 0, "header at {at} is not aligned");
        assert_eq!(&bytes[at..at + 6], MAGIC, "magic at {at}");
        let namesize = field(bytes, at, 11) as usize;
        let filesize = field(bytes, at, 6) as usize;
        let name_start = at + HEADER_LEN;
        let name = &bytes[name_start..name_start + namesize];
        assert_eq!(name.last(), Some(&0), "name is NUL-terminated");
        let name = String::from_utf8(name[..namesize - 1].to_vec()).expect("utf-8 name");
        let data_start = align(name_start + namesize);
        let data = bytes[data_start..data_start + filesize].to_vec();
        assert!(
            bytes[name_start + namesize..data_start]
                .iter()
                .all(|b| *b == 0),
            "name padding is zeros"
        );
        let header = Header {
            ino: field(bytes, at, 0),
            mode: field(bytes, at, 1),
            uid: field(bytes, at, 2),
            gid: field(bytes, at, 3),
            nlink: field(bytes, at, 4),
            mtime: field(bytes, at, 5),
            filesize: filesize as u32,
            rdev: (field(bytes, at, 9), field(bytes, at, 10)),
        };
        out.push(Parsed {
            name: name.clone(),
            header,
            data,
            offset: at,
        });
        at = align(data_start + filesize);
        if name == TRAILER {
            assert_eq!(at, bytes.len(), "nothing follows the trailer");
            return out;
        }
    }
}

fn names(entries: &[Parsed]) -> Vec<&str> {
    entries.iter().map(|e| e.name.as_str()).collect()
}

#[test]
fn one_file_is_exactly_the_newc_bytes() {
    let mut archive = Archive::new();
    archive
        .file("init", "hi\n", Meta::new(0o755).mtime(0x6500_0000))
        .expect("add");
    let bytes = archive.to_bytes(Compression::None).expect("write");
    let header = |fields: [&str; 13]| format!("070701{}", fields.concat()).into_bytes();
    let zero = "00000000";
    let mut expected = Vec::new();
    // ino 1, mode 0100755, uid 0, gid 0, nlink 1, mtime, size 3, dev 0:0,
    // rdev 0:0, namesize 5 ("init" + NUL), check 0.
    expected.extend(header([
        "00000001", "000081ED", zero, zero, "00000001", "65000000", "00000003", zero, zero, zero,
        zero, "00000005", zero,
    ]));
    expected.extend_from_slice(b"init\0"); // 110 + 5 = 115: one byte of padding
    expected.push(0);
    expected.extend_from_slice(b"hi\n\0");
    expected.extend(header([
        zero, zero, zero, zero, "00000001", zero, zero, zero, zero, zero, zero, "0000000B", zero,
    ]));
    expected.extend_from_slice(b"TRAILER!!!\0"); // 110 + 11 = 121: three of padding
    expected.extend_from_slice(&[0, 0, 0]);
    assert_eq!(
        String::from_utf8_lossy(&bytes),
        String::from_utf8_lossy(&expected)
    );
    assert_eq!(bytes, expected);
}

#[test]
fn same_entries_in_any_order_give_the_same_bytes() {
    let build = |order: &[usize]| {
        let mut archive = Archive::new();
        for i in order {
            match i {
                0 => archive.file("etc/motd", "hello", Meta::new(0o644)),
                1 => archive.dir("etc", Meta::new(0o755)),
                2 => archive.symlink("bin/sh", "busybox", (0, 0)),
                3 => archive.device("dev/null", Device::Char(1, 3), Meta::new(0o666)),
                _ => archive.hard_link("etc/motd.link", "etc/motd"),
            }
            .expect("add");
        }
        archive.to_bytes(Compression::None).expect("write")
    };
    let first = build(&[0, 1, 2, 3, 4]);
    assert_eq!(first, build(&[4, 3, 2, 1, 0]));
    assert_eq!(first, build(&[2, 4, 0, 3, 1]));
    let entries = parse(&first);
    assert_eq!(
        names(&entries),
        [
            "bin",
            "bin/sh",
            "dev",
            "dev/null",
            "etc",
            "etc/motd",
            "etc/motd.link",
            TRAILER
        ]
    );
    // Inode numbers follow the name order; the hard link shares its target's.
    let inos: Vec<u32> = entries.iter().map(|e| e.header.ino).collect();
    assert_eq!(inos, [1, 2, 3, 4, 5, 6, 6, 0]);
}

#[test]
fn missing_parents_are_root_owned_0755_directories() {
    let mut archive = Archive::new().with_mtime(1234);
    archive
        .file("a/b/c", "x", Meta::new(0o600).owner(1000, 100))
        .expect("add");
    archive.dir("a/d", Meta::new(0o700).mtime(7)).expect("add");
    let entries = parse(&archive.to_bytes(Compression::None).expect("write"));
    assert_eq!(names(&entries), ["a", "a/b", "a/b/c", "a/d", TRAILER]);
    let a = &entries[0];
    assert_eq!(
        (a.header.mode, a.header.uid, a.header.gid, a.header.mtime),
        (0o040_755, 0, 0, 1234)
    );
    // `a` has two subdirectories, `a/b` none.
    assert_eq!((entries[0].header.nlink, entries[1].header.nlink), (4, 2));
    let c = &entries[2];
    assert_eq!(
        (c.header.mode, c.header.uid, c.header.gid, c.header.mtime),
        (0o100_600, 1000, 100, 1234)
    );
    assert_eq!(
        (entries[3].header.mode, entries[3].header.mtime),
        (0o040_700, 7)
    );
}

#[test]
fn hard_links_share_the_inode_and_the_last_name_carries_the_data() {
    let mut archive = Archive::new();
    archive
        .file("m", "shared data", Meta::new(0o640).owner(5, 6).mtime(99))
        .expect("add");
    archive.hard_link("z", "m").expect("add");
    archive.hard_link("a", "m").expect("add");
    archive.file("n", "alone", Meta::new(0o644)).expect("add");
    let entries = parse(&archive.to_bytes(Compression::None).expect("write"));
    assert_eq!(names(&entries), ["a", "m", "n", "z", TRAILER]);
    let (a, m, n, z) = (&entries[0], &entries[1], &entries[2], &entries[3]);
    for link in [a, m, z] {
        assert_eq!(link.header.ino, a.header.ino);
        assert_eq!(link.header.nlink, 3);
        assert_eq!(
            (
                link.header.mode,
                link.header.uid,
                link.header.gid,
                link.header.mtime
            ),
            (0o100_640, 5, 6, 99)
        );
    }
    assert!(a.data.is_empty() && m.data.is_empty());
    assert_eq!(z.data, b"shared data");
    assert_ne!(n.header.ino, a.header.ino);
    assert_eq!(
        (n.header.nlink, n.data.as_slice()),
        (1, b"alone".as_slice())
    );
}

#[test]
fn every_kind_has_its_type_bits_and_device_numbers() {
    let mut archive = Archive::new();
    archive
        .device("b", Device::Block(8, 1), Meta::new(0o660).owner(0, 6))
        .expect("add");
    archive
        .device("c", Device::Char(5, 1), Meta::new(0o600))
        .expect("add");
    archive.dir("d", Meta::new(0o1777)).expect("add");
    archive
        .file("f", Vec::new(), Meta::new(0o4755))
        .expect("add");
    archive.fifo("p", Meta::new(0o644)).expect("add");
    archive
        .symlink("s", "/does/not/matter", (1, 2))
        .expect("add");
    let entries = parse(&archive.to_bytes(Compression::None).expect("write"));
    type Row<'a> = (&'a str, u32, (u32, u32), &'a [u8]);
    let got: Vec<Row<'_>> = entries
        .iter()
        .map(|e| {
            (
                e.name.as_str(),
                e.header.mode,
                e.header.rdev,
                e.data.as_slice(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("b", 0o060_660, (8, 1), b"".as_slice()),
            ("c", 0o020_600, (5, 1), b""),
            ("d", 0o041_777, (0, 0), b""),
            ("f", 0o104_755, (0, 0), b""),
            ("p", 0o010_644, (0, 0), b""),
            ("s", 0o120_777, (0, 0), b"/does/not/matter"),
            (TRAILER, 0, (0, 0), b""),
        ]
    );
    assert_eq!((entries[5].header.uid, entries[5].header.gid), (1, 2));
}

#[test]
fn names_are_checked_when_added() {
    let too_long = "x".repeat(NAME_MAX + 1);
    let check = |name: &str, expected: NameError| {
        let err = Archive::new()
            .file(name, "", Meta::new(0o644))
            .map(|_| ())
            .expect_err(name);
        match err {
            EntryError::Name(got) => assert_eq!(got, expected, "{name:?}"),
            other => panic!("{name:?}: {other:?}"),
        }
    };
    check("", NameError::Empty);
    check("/init", NameError::Absolute("/init".into()));
    check("a/../b", NameError::ParentComponent("a/../b".into()));
    check("..", NameError::ParentComponent("..".into()));
    check("a\0b", NameError::Nul("a\0b".into()));
    check("./init", NameError::EmptyComponent("./init".into()));
    check("a//b", NameError::EmptyComponent("a//b".into()));
    check("a/", NameError::EmptyComponent("a/".into()));
    check(
        &too_long,
        NameError::TooLong {
            name: too_long.clone(),
            len: NAME_MAX + 1,
        },
    );
    // The longest accepted name is written and read back whole.
    let longest = "y".repeat(NAME_MAX);
    let mut archive = Archive::new();
    archive.file(&longest, "", Meta::new(0o644)).expect("add");
    let entries = parse(&archive.to_bytes(Compression::None).expect("write"));
    assert_eq!(entries[0].name, longest);
    // Error messages name the entry.
    let message = Archive::new()
        .dir("/abs", Meta::new(0o755))
        .map(|_| ())
        .expect_err("absolute")
        .to_string();
    assert!(message.contains("\"/abs\" is absolute"), "{message}");
}

#[test]
fn bad_entries_are_refused() {
    let mut archive = Archive::new();
    archive.dir("d", Meta::new(0o755)).expect("add");
    let dup = archive.file("d", "", Meta::new(0o644)).map(|_| ());
    assert!(matches!(dup, Err(EntryError::Duplicate(n)) if n == "d"));
    let mode = archive.file("f", "", Meta::new(0o100_644)).map(|_| ());
    assert!(matches!(
        mode,
        Err(EntryError::InvalidMode {
            mode: 0o100_644,
            ..
        })
    ));
    let target = archive.symlink("s", "", (0, 0)).map(|_| ());
    assert!(matches!(target, Err(EntryError::SymlinkTarget { .. })));
    let link = archive.hard_link("l", "/etc/x").map(|_| ());
    assert!(matches!(
        link,
        Err(EntryError::Name(NameError::Absolute(_)))
    ));
}

#[test]
fn inconsistent_archives_are_refused_when_written() {
    let mut archive = Archive::new();
    archive.file("f", "", Meta::new(0o644)).expect("add");
    archive.file("f/g", "", Meta::new(0o644)).expect("add");
    let err = archive.to_bytes(Compression::None).expect_err("not a dir");
    assert!(
        matches!(&err, WriteError::NotADirectory { name, parent } if name == "f/g" && parent == "f"),
        "{err:?}"
    );

    let mut archive = Archive::new();
    archive.hard_link("l", "missing").expect("add");
    let err = archive.to_bytes(Compression::None).expect_err("no target");
    assert!(matches!(&err, WriteError::LinkTarget { target, .. } if target == "missing"));

    let mut archive = Archive::new();
    archive.dir("d", Meta::new(0o755)).expect("add");
    archive.hard_link("l", "d").expect("add");
    let err = archive.to_bytes(Compression::None).expect_err("dir target");
    assert!(matches!(&err, WriteError::LinkTarget { .. }));

    let mut archive = Archive::new();
    archive
        .file("f", PathBuf::from("/nonexistent/mprov"), Meta::new(0o644))
        .expect("add");
    let err = archive.to_bytes(Compression::None).expect_err("no source");
    assert!(matches!(&err, WriteError::Source { name, .. } if name == "f"));

    let mut archive = Archive::new();
    archive
        .file("f", PathBuf::from("/"), Meta::new(0o644))
        .expect("add");
    let err = archive.to_bytes(Compression::None).expect_err("dir source");
    assert!(matches!(&err, WriteError::SourceNotAFile { .. }));
}

#[test]
fn files_given_by_path_are_streamed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big");
    // Larger than the copy buffer, and not a multiple of four.
    let data: Vec<u8> = (0..200_003u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).expect("write");
    let mut archive = Archive::new();
    archive.file("big", path, Meta::new(0o644)).expect("add");
    archive.file("small", "s", Meta::new(0o644)).expect("add");
    let entries = parse(&archive.to_bytes(Compression::None).expect("write"));
    assert_eq!(entries[0].data, data);
    assert_eq!(entries[1].data, b"s");
    assert!(entries.iter().all(|e| e.offset % 4 == 0));
}

#[test]
fn compressed_archives_decompress_to_the_bare_one() {
    let mut archive = Archive::new();
    archive
        .file("init", "#!/bin/sh\n", Meta::new(0o755))
        .expect("add");
    archive
        .file("etc/x", "x".repeat(10_000).as_str(), Meta::new(0o644))
        .expect("add");
    let bare = archive.to_bytes(Compression::None).expect("bare");

    let gz = archive.to_bytes(Compression::Gzip).expect("gzip");
    assert_eq!(&gz[..2], [0x1f, 0x8b]);
    assert_eq!(&gz[4..8], [0, 0, 0, 0], "gzip mtime is zero");
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice())
        .read_to_end(&mut out)
        .expect("gunzip");
    assert_eq!(out, bare);
    assert_eq!(gz, archive.to_bytes(Compression::Gzip).expect("gzip again"));

    let zst = archive.to_bytes(Compression::Zstd).expect("zstd");
    assert_eq!(&zst[..4], [0x28, 0xb5, 0x2f, 0xfd]);
    assert_eq!(zstd::decode_all(zst.as_slice()).expect("unzstd"), bare);
    assert_eq!(
        zst,
        archive.to_bytes(Compression::Zstd).expect("zstd again")
    );
    assert!(zst.len() < bare.len() / 4 && gz.len() < bare.len() / 4);
}

#[test]
fn compression_names_parse() {
    for (text, c) in [
        ("gzip", Compression::Gzip),
        ("none", Compression::None),
        ("zstd", Compression::Zstd),
    ] {
        assert_eq!(text.parse::<Compression>().expect(text), c);
        assert_eq!(c.to_string(), text);
    }
    let err = "xz".parse::<Compression>().expect_err("xz");
    assert_eq!(
        err.to_string(),
        "unknown compression \"xz\": use gzip, zstd or none"
    );
}
