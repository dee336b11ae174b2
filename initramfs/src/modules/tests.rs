use std::io::Write;

use super::*;

/// The lab kernel's NIC modules and their declared dependencies (as its
/// `.modinfo` has them), with their paths in the tree.
const LAB: &[(&str, &str, &str)] = &[
    (
        "kernel/drivers/net/ethernet/intel/e1000/e1000.ko",
        "",
        "pci:v00008086d0000100Esv*sd*bc*sc*i*",
    ),
    ("kernel/drivers/net/net_failover.ko", "failover", ""),
    (
        "kernel/drivers/net/virtio_net.ko",
        "virtio_ring,virtio,net_failover",
        "virtio:d00000001v*",
    ),
    ("kernel/drivers/virtio/virtio.ko", "virtio_ring", ""),
    (
        "kernel/drivers/virtio/virtio_pci.ko",
        "virtio_ring,virtio_pci_modern_dev,virtio_pci_legacy_dev,virtio",
        "pci:v00001AF4d*sv*sd*bc*sc*i*",
    ),
    ("kernel/drivers/virtio/virtio_pci_legacy_dev.ko", "", ""),
    ("kernel/drivers/virtio/virtio_pci_modern_dev.ko", "", ""),
    ("kernel/drivers/virtio/virtio_ring.ko", "", ""),
    ("kernel/net/core/failover.ko", "", ""),
];

const LAB_ORDER: &[&str] = &[
    "e1000",
    "virtio_ring",
    "virtio",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    "failover",
    "net_failover",
    "virtio_net",
];

/// A minimal ELF64 relocatable object with a `.modinfo` section holding
/// `entries`, NUL-separated, as the kernel's modpost writes it.
fn elf_with_modinfo(entries: &[String]) -> Vec<u8> {
    let mut modinfo = Vec::new();
    for e in entries {
        modinfo.extend_from_slice(e.as_bytes());
        modinfo.push(0);
    }
    let shstrtab = b"\0.modinfo\0.shstrtab\0";
    let modinfo_at = 64u64;
    let shstrtab_at = modinfo_at + modinfo.len() as u64;
    let shoff = (shstrtab_at + shstrtab.len() as u64).div_ceil(8) * 8;

    let mut elf = Vec::new();
    elf.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    elf.extend_from_slice(&1u16.to_le_bytes()); // ET_REL
    elf.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    elf.extend_from_slice(&1u32.to_le_bytes()); // version
    elf.extend_from_slice(&0u64.to_le_bytes()); // entry
    elf.extend_from_slice(&0u64.to_le_bytes()); // phoff
    elf.extend_from_slice(&shoff.to_le_bytes());
    elf.extend_from_slice(&0u32.to_le_bytes()); // flags
    for half in [64u16, 0, 0, 64, 3, 2] {
        // ehsize, phentsize, phnum, shentsize, shnum, shstrndx
        elf.extend_from_slice(&half.to_le_bytes());
    }
    assert_eq!(elf.len(), 64);
    elf.extend_from_slice(&modinfo);
    elf.extend_from_slice(shstrtab);
    elf.resize(shoff as usize, 0);
    let section = |elf: &mut Vec<u8>, name: u32, kind: u32, offset: u64, size: u64| {
        elf.extend_from_slice(&name.to_le_bytes());
        elf.extend_from_slice(&kind.to_le_bytes());
        elf.extend_from_slice(&0u64.to_le_bytes()); // flags
        elf.extend_from_slice(&0u64.to_le_bytes()); // addr
        elf.extend_from_slice(&offset.to_le_bytes());
        elf.extend_from_slice(&size.to_le_bytes());
        elf.extend_from_slice(&0u32.to_le_bytes()); // link
        elf.extend_from_slice(&0u32.to_le_bytes()); // info
        elf.extend_from_slice(&1u64.to_le_bytes()); // addralign
        elf.extend_from_slice(&0u64.to_le_bytes()); // entsize
    };
    section(&mut elf, 0, 0, 0, 0);
    section(&mut elf, 1, 1, modinfo_at, modinfo.len() as u64); // PROGBITS
    section(&mut elf, 10, 3, shstrtab_at, shstrtab.len() as u64); // STRTAB
    elf
}

fn write(path: &Path, data: &[u8]) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, data).expect("write");
}

fn modinfo_entries(name: &str, depends: &str, alias: &str, softdep: Option<&str>) -> Vec<String> {
    let mut entries = vec![
        "license=GPL".to_owned(),
        format!("depends={depends}"),
        format!("name={name}"),
    ];
    if !alias.is_empty() {
        entries.push(format!("alias={alias}"));
    }
    if let Some(s) = softdep {
        entries.push(format!("softdep={s}"));
    }
    entries.push("vermagic=6.1.0-57-amd64 SMP preempt mod_unload modversions ".to_owned());
    entries
}

/// The lab's modules as a tree without `modules.dep`: real-looking ELF files.
fn modinfo_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("lib/modules/6.1.0-57-amd64");
    for (path, depends, alias) in LAB {
        let name = path
            .rsplit('/')
            .next()
            .and_then(|f| f.strip_suffix(".ko"))
            .expect("name");
        write(
            &root.join(path),
            &elf_with_modinfo(&modinfo_entries(name, depends, alias, None)),
        );
    }
    // Symlinks like a real tree's `build` are not followed.
    std::os::unix::fs::symlink("/nonexistent", root.join("build")).expect("symlink");
    dir
}

/// The lab's modules as a tree with depmod's files (module files are not
/// opened for resolution, so they hold only a marker).
fn depmod_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("lib/modules/6.1.0-57-amd64");
    let path_of = |name: &str| {
        LAB.iter()
            .map(|(p, _, _)| *p)
            .find(|p| p.ends_with(&format!("/{name}.ko")))
            .expect("lab module")
    };
    let mut dep = String::new();
    let mut alias = String::new();
    for (path, depends, a) in LAB {
        write(&root.join(path), path.as_bytes());
        let deps: Vec<&str> = depends
            .split(',')
            .filter(|d| !d.is_empty())
            .map(path_of)
            .collect();
        dep.push_str(&format!("{path}: {}\n", deps.join(" ")));
        if !a.is_empty() {
            let name = path
                .rsplit('/')
                .next()
                .and_then(|f| f.strip_suffix(".ko"))
                .expect("name");
            alias.push_str(&format!("alias {a} {name}\n"));
        }
    }
    write(&root.join("modules.dep"), dep.as_bytes());
    write(&root.join("modules.alias"), alias.as_bytes());
    write(
        &root.join("modules.softdep"),
        b"# Soft dependencies extracted from modules themselves.\nsoftdep e1000 pre: crc32c post: failover\n",
    );
    write(
        &root.join("modules.builtin"),
        b"kernel/net/packet/af_packet.ko\n",
    );
    dir
}

fn extra() -> Vec<(&'static str, &'static str)> {
    vec![("virtio_net", "virtio_pci")]
}

#[test]
fn depmod_tree_resolves_in_load_order() {
    let dir = depmod_tree();
    let tree = ModuleTree::open(dir.path()).expect("open");
    assert!(tree.has_modules_dep());
    assert_eq!(tree.release(), "6.1.0-57-amd64");

    // Without the extra dependency virtio_pci is not loaded: nothing declares it.
    let plain = tree.resolve(&["virtio-net"], &[]).expect("resolve");
    assert_eq!(
        plain.names(),
        [
            "failover",
            "net_failover",
            "virtio_ring",
            "virtio",
            "virtio_net"
        ]
    );

    let r = tree
        .resolve(&["virtio_net", "af_packet"], &extra())
        .expect("resolve");
    assert_eq!(r.names(), LAB_ORDER[1..]);
    assert_eq!(r.builtin, ["af_packet"]);
    assert_eq!(
        r.modules[7].path,
        PathBuf::from("kernel/drivers/net/virtio_net.ko")
    );
}

#[test]
fn depmod_softdeps_load_before_and_after_and_missing_ones_are_skipped() {
    let dir = depmod_tree();
    let tree = ModuleTree::open(dir.path()).expect("open");
    // modules.softdep: e1000 pre: crc32c (not in the tree) post: failover.
    let r = tree.resolve(&["e1000"], &[]).expect("resolve");
    assert_eq!(r.names(), ["e1000", "failover"]);
    assert_eq!(r.skipped_soft, ["crc32c"]);
    // The whole lab set: failover is already loaded after e1000, so it is not
    // repeated before net_failover.
    let r = tree
        .resolve(&["e1000", "virtio_net"], &extra())
        .expect("resolve");
    assert_eq!(
        r.names(),
        [
            "e1000",
            "failover",
            "virtio_ring",
            "virtio",
            "virtio_pci_legacy_dev",
            "virtio_pci_modern_dev",
            "virtio_pci",
            "net_failover",
            "virtio_net"
        ]
    );
}

#[test]
fn a_tree_inside_an_unpacked_package_is_found() {
    let dir = modinfo_tree();
    let tree = ModuleTree::open(dir.path()).expect("open");
    assert_eq!(tree.release(), "6.1.0-57-amd64");
    assert_eq!(tree.root(), dir.path().join("lib/modules/6.1.0-57-amd64"));
}

#[test]
fn modinfo_tree_resolves_like_depmod() {
    let dir = modinfo_tree();
    let tree = ModuleTree::open(dir.path().join("lib/modules/6.1.0-57-amd64")).expect("open");
    assert!(!tree.has_modules_dep());
    assert_eq!(tree.names().len(), LAB.len());
    let r = tree
        .resolve(&["e1000", "virtio_net"], &extra())
        .expect("resolve");
    assert_eq!(r.names(), LAB_ORDER);
    assert!(
        r.modules
            .iter()
            .all(|m| m.compression == ModuleCompression::None)
    );

    let info = tree.info("virtio-pci").expect("read").expect("present");
    assert_eq!(
        info.depends,
        [
            "virtio_ring",
            "virtio_pci_modern_dev",
            "virtio_pci_legacy_dev",
            "virtio"
        ]
    );
    assert_eq!(info.aliases, ["pci:v00001AF4d*sv*sd*bc*sc*i*"]);
    assert!(tree.info("nope").expect("read").is_none());
}

#[test]
fn compressed_modules_are_read_and_loaded_decompressed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("6.12.0-1-amd64");
    let elf = |name: &str, depends: &str, softdep: Option<&str>| {
        elf_with_modinfo(&modinfo_entries(name, depends, "", softdep))
    };
    let a = elf("mod_a", "mod_b", Some("pre: mod_c post: mod-d gone"));
    let b = elf("mod_b", "", None);
    let c = elf("mod_c", "", None);
    let d = elf("mod_d", "", None);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&b).expect("gzip");
    let mut xz = Vec::new();
    lzma_rs::xz_compress(&mut c.as_slice(), &mut xz).expect("xz");
    write(
        &root.join("kernel/mod_a.ko.zst"),
        &zstd::encode_all(a.as_slice(), 3).expect("zstd"),
    );
    write(
        &root.join("kernel/mod_b.ko.gz"),
        &gz.finish().expect("gzip"),
    );
    write(&root.join("kernel/mod_c.ko.xz"), &xz);
    write(&root.join("kernel/sub/mod-d.ko"), &d);
    // updates/ wins over kernel/, as in depmod's search order.
    write(&root.join("updates/mod_b.ko"), &b);

    let tree = ModuleTree::open(&root).expect("open");
    let r = tree.resolve(&["mod-a"], &[]).expect("resolve");
    assert_eq!(r.names(), ["mod_c", "mod_b", "mod_a", "mod_d"]);
    assert_eq!(r.skipped_soft, ["gone"]);
    let compressions: Vec<_> = r.modules.iter().map(|m| m.compression).collect();
    assert_eq!(
        compressions,
        [
            ModuleCompression::Xz,
            ModuleCompression::None,
            ModuleCompression::Zstd,
            ModuleCompression::None
        ]
    );
    assert_eq!(r.modules[1].path, PathBuf::from("updates/mod_b.ko"));
    assert_eq!(
        r.modules[0].uncompressed_path(),
        PathBuf::from("kernel/mod_c.ko")
    );
    assert_eq!(
        r.modules[2].uncompressed_path(),
        PathBuf::from("kernel/mod_a.ko")
    );
    assert_eq!(tree.load(&r.modules[0]).expect("load"), c);
    assert_eq!(tree.load(&r.modules[2]).expect("load"), a);

    // A gzip'd module too.
    fs::remove_file(root.join("updates/mod_b.ko")).expect("rm");
    let tree = ModuleTree::open(&root).expect("open");
    let r = tree.resolve(&["mod_b"], &[]).expect("resolve");
    assert_eq!(r.modules[0].compression, ModuleCompression::Gzip);
    assert_eq!(tree.load(&r.modules[0]).expect("load"), b);
}

#[test]
fn cycles_and_missing_modules_name_the_module() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("6.1.0-test");
    write(
        &root.join("modules.dep"),
        b"kernel/a.ko: kernel/b.ko\nkernel/b.ko: kernel/c.ko\nkernel/c.ko: kernel/a.ko\n\
          kernel/d.ko: kernel/missing.ko\nkernel/e.ko:\n",
    );
    let tree = ModuleTree::open(&root).expect("open");

    let err = tree.resolve(&["e", "b"], &[]).expect_err("cycle");
    assert!(matches!(&err, ModuleError::Cycle { modules } if modules == &["b", "c", "a", "b"]));
    assert_eq!(err.to_string(), "dependency cycle: b -> c -> a -> b");

    let err = tree.resolve(&["d"], &[]).expect_err("missing dependency");
    assert!(
        matches!(&err, ModuleError::MissingDependency { module, dependency, .. }
            if module == "d" && dependency == "missing"),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("d needs missing, which is not in ")
    );

    let err = tree.resolve(&["e1000"], &[]).expect_err("not found");
    assert!(matches!(&err, ModuleError::NotFound { name, .. } if name == "e1000"));

    let err = tree
        .resolve(&["e"], &[("e", "virtio_pci")])
        .expect_err("missing extra");
    assert!(
        matches!(&err, ModuleError::MissingDependency { module, dependency, .. }
            if module == "e" && dependency == "virtio_pci")
    );

    // An extra dependency can close a cycle too.
    let err = tree.resolve(&["e"], &[("e", "e")]).expect_err("self");
    assert!(matches!(&err, ModuleError::Cycle { modules } if modules == &["e", "e"]));
}

#[test]
fn bad_trees_and_files_are_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = ModuleTree::open(dir.path()).expect_err("empty");
    assert!(matches!(err, ModuleError::NotATree { .. }));

    write(
        &dir.path().join("modules.dep"),
        b"kernel/a.ko kernel/b.ko\n",
    );
    let err = ModuleTree::open(dir.path()).expect_err("bad dep");
    assert!(matches!(err, ModuleError::Index { line: 1, .. }), "{err:?}");

    let dir = tempfile::tempdir().expect("tempdir");
    fs::create_dir_all(dir.path().join("lib/modules/6.1.0-a")).expect("mkdir");
    fs::create_dir_all(dir.path().join("lib/modules/6.1.0-b")).expect("mkdir");
    let err = ModuleTree::open(dir.path()).expect_err("two releases");
    assert!(
        matches!(&err, ModuleError::Releases { releases, .. } if releases == &["6.1.0-a", "6.1.0-b"]),
        "{err:?}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    write(&dir.path().join("kernel/junk.ko"), b"not an ELF file");
    write(&dir.path().join("kernel/bare.ko"), &elf_with_modinfo(&[]));
    let tree = ModuleTree::open(dir.path()).expect("open");
    let err = tree.resolve(&["junk"], &[]).expect_err("junk");
    assert!(matches!(err, ModuleError::Elf { .. }), "{err:?}");
    // An ELF file with an empty .modinfo has no dependencies.
    assert_eq!(
        tree.resolve(&["bare"], &[]).expect("bare").names(),
        ["bare"]
    );

    write(&dir.path().join("kernel/bad.ko.xz"), b"not xz");
    let tree = ModuleTree::open(dir.path()).expect("open");
    let err = tree.resolve(&["bad"], &[]).expect_err("bad xz");
    assert!(matches!(err, ModuleError::Decompress { .. }), "{err:?}");
}

#[test]
fn pci_devices_pick_the_modules_whose_aliases_match() {
    for dir in [modinfo_tree(), depmod_tree()] {
        let tree = ModuleTree::open(dir.path()).expect("open");
        let found = |ids: &[&str]| {
            let ids: Vec<PciId> = ids.iter().map(|i| i.parse().expect(i)).collect();
            tree.match_pci(&ids).expect("match")
        };
        assert_eq!(found(&["8086:100e"]), ["e1000"]);
        // virtio_net matches the virtio bus, not PCI: the transport is what a
        // PCI ID finds.
        assert_eq!(found(&["1af4:1000"]), ["virtio_pci"]);
        assert_eq!(found(&["1af4:1041", "8086:100E"]), ["e1000", "virtio_pci"]);
        assert!(found(&["8086:1234"]).is_empty());
        assert!(found(&[]).is_empty());
    }
}

#[test]
fn pci_alias_matching() {
    let check = |id: &str, alias: &str, expected: bool| {
        let id: PciId = id.parse().expect(id);
        assert_eq!(id.matches(alias), expected, "{id} vs {alias}");
    };
    let e1000 = "pci:v00008086d0000100Esv*sd*bc*sc*i*";
    check("8086:100e", e1000, true);
    check("8086:100E", e1000, true);
    check("8086:100f", e1000, false);
    check("1af4:100e", e1000, false);
    let sub = "pci:v000014E4d00001639sv0000103Csd00007055bc*sc*i*";
    check("14e4:1639", sub, true); // subsystem unknown: any
    check("14e4:1639:103c:7055", sub, true);
    check("14e4:1639:103c:7056", sub, false);
    let class = "pci:v*d*sv*sd*bc02sc00i*";
    check("1234:5678:0000:0000:020000", class, true);
    check("1234:5678:0000:0000:010000", class, false);
    check("1234:5678", class, true); // class unknown: any
    check("8086:100e", "pci:v00008086d0000100?sv*sd*bc*sc*i*", true);
    check("8086:100e", "virtio:d00000001v*", false);
    check("8086:100e", "pci:garbage", false);
}

#[test]
fn pci_ids_parse_and_print() {
    let id: PciId = "1af4:1041:1af4:1100:020000".parse().expect("full");
    assert_eq!(
        id,
        PciId {
            vendor: 0x1af4,
            device: 0x1041,
            subvendor: Some(0x1af4),
            subdevice: Some(0x1100),
            class: Some(0x02_0000),
        }
    );
    assert_eq!(id.to_string(), "1af4:1041:1af4:1100:020000");
    assert_eq!(
        "8086:100e".parse::<PciId>().expect("short"),
        PciId::new(0x8086, 0x100e)
    );
    for bad in [
        "8086",
        "8086:100e:1",
        "80866:100e",
        "zz:100e",
        "1:2:3:4:0200",
        "",
    ] {
        let err = bad.parse::<PciId>().expect_err(bad);
        assert!(err.to_string().contains("VENDOR:DEVICE"), "{err}");
    }
}

#[test]
fn glob_matches_like_fnmatch() {
    for (pattern, text, expected) in [
        ("*", "", true),
        ("*", "ABC", true),
        ("A*C", "ABBBC", true),
        ("A*C", "ABBB", false),
        ("A?C", "ABC", true),
        ("A?C", "AC", false),
        ("00008086", "00008086", true),
        ("0000808*", "00008086", true),
        ("*86", "00008086", true),
        ("*87", "00008086", false),
        ("", "", true),
        ("", "A", false),
    ] {
        assert_eq!(glob(pattern, text), expected, "{pattern:?} {text:?}");
    }
}
