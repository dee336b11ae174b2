//! The lab's own tests: its database servers start, answer through the CLI
//! clients and through sqlx with the URLs they give, and leave nothing behind.
//!
//! The one integration-test binary of this crate (one binary links once).

use std::future::Future;

#[path = "lab/outage.rs"]
mod outage;

use anyhow::{Context, Result};
use mprov_tests::db::{MariaDb, Postgres};

#[path = "lab/decisions.rs"]
mod decisions;
#[path = "lab/discovery.rs"]
mod discovery;
#[path = "lab/e2e.rs"]
mod e2e;
#[path = "lab/idle_flood.rs"]
mod idle_flood;
#[path = "lab/jobservers.rs"]
mod jobservers;
#[path = "lab/netboot.rs"]
mod netboot;
#[path = "lab/pages.rs"]
mod pages;
#[path = "lab/passkeys.rs"]
mod passkeys;
#[path = "lab/seam.rs"]
mod seam;
#[path = "lab/storm.rs"]
mod storm;
#[path = "lab/uefi.rs"]
mod uefi;

/// Runs `future` to completion on a fresh current-thread runtime.
fn block_on<T>(future: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building a tokio runtime")?
        .block_on(future)
}

/// Over sqlx with the admin URL `url`: `SELECT 1` answers 1 (as a `T`), and
/// the admin may create and drop a database.
async fn sqlx_answers<DB, T>(url: String) -> Result<()>
where
    DB: sqlx::Database,
    T: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB> + From<u8> + PartialEq + std::fmt::Debug,
    T: Send + Unpin,
    (T,): for<'r> sqlx::FromRow<'r, DB::Row>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
{
    let pool = sqlx::Pool::<DB>::connect(&url).await?;
    let one: T = sqlx::query_scalar("SELECT 1").fetch_one(&pool).await?;
    assert_eq!(one, T::from(1));
    sqlx::query("CREATE DATABASE lab_sqlx")
        .execute(&pool)
        .await?;
    sqlx::query("DROP DATABASE lab_sqlx").execute(&pool).await?;
    pool.close().await;
    Ok(())
}

/// Dropping the server `db` removes its folder `dir`.
fn gone_when_dropped<S>(db: S, dir: &std::path::Path) -> Result<()> {
    drop(db);
    assert!(!dir.exists(), "{} is still there", dir.display());
    Ok(())
}

#[test]
fn mariadb_starts_answers_and_cleans_up() -> Result<()> {
    let db = MariaDb::start()?;
    let dir = db.dir().to_path_buf();
    assert!(dir.join("data").is_dir(), "{}", dir.display());
    assert_eq!(
        db.url(),
        format!("mysql://mprov:mprov@127.0.0.1:{}/mysql", db.port())
    );

    assert_eq!(db.query("SELECT 1")?, "1\n");
    // The admin user may create databases, as each test case will.
    db.query("CREATE DATABASE lab_cli; DROP DATABASE lab_cli")?;
    // MariaDB speaks utf8mb4 as Debian configures it, although we skip /etc/mysql.
    assert_eq!(db.query("SELECT @@character_set_server")?, "utf8mb4\n");

    block_on(sqlx_answers::<sqlx::MySql, i64>(db.url()))?;
    gone_when_dropped(db, &dir)
}

#[test]
fn postgres_starts_answers_and_cleans_up() -> Result<()> {
    let db = Postgres::start()?;
    let dir = db.dir().to_path_buf();
    assert!(dir.join("data").is_dir(), "{}", dir.display());
    assert_eq!(
        db.url(),
        format!("postgres://mprov:mprov@127.0.0.1:{}/postgres", db.port())
    );

    assert_eq!(db.query("SELECT 1")?, "1\n");
    db.query("CREATE DATABASE lab_cli")?;
    db.query("DROP DATABASE lab_cli")?;
    assert_eq!(db.query("SHOW server_encoding")?, "UTF8\n");

    block_on(sqlx_answers::<sqlx::Postgres, i32>(db.url()))?;
    gone_when_dropped(db, &dir)
}

#[test]
fn stop_shuts_down_cleanly_and_removes_the_folder() -> Result<()> {
    let mariadb = MariaDb::start()?;
    let postgres = Postgres::start()?;
    assert_ne!(mariadb.port(), postgres.port());
    let dirs = [mariadb.dir().to_path_buf(), postgres.dir().to_path_buf()];

    // `stop` fails unless each server exits 0 on SIGTERM.
    mariadb.stop()?;
    postgres.stop()?;
    for dir in dirs {
        assert!(!dir.exists(), "{} is still there", dir.display());
    }
    Ok(())
}

/// A QEMU VM network-boots from our own job server, nothing else: DHCP (the
/// reservation), TFTP (the iPXE binary, for UEFI's native PXE), HTTP (iPXE
/// script, kernel, initramfs), then DHCP and HTTP again from the booted
/// initramfs. SeaBIOS with the NIC's iPXE ROM, and OVMF's own PXE.
#[test]
fn vm_netboots_from_our_job_server() -> Result<()> {
    use std::time::Duration;

    use mprov_tests::netns::Netns;
    use mprov_tests::vm::{self, Firmware, Vm, VmSpec};

    let target = mprov_tests::xtask::target_dir();
    let jobserver = target.join("debug/mprov-jobserver");
    anyhow::ensure!(
        jobserver.is_file(),
        "{} is missing: `cargo test --workspace` builds it (or run cargo build -p mprov-boot)",
        jobserver.display()
    );
    let kernel = vm::lab_kernel(&target.join("lab-cache"))?;
    let run = tempfile::tempdir()?;
    let export = run.path().join("export");
    let images = export.join("images/lab");
    std::fs::create_dir_all(&images)?;
    std::fs::copy(&kernel.vmlinuz, images.join("vmlinuz"))?;
    std::fs::write(images.join("hello.txt"), "hello-from-the-job-server\n")?;
    let init = r#"#!/bin/sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
echo "LAB-INIT: started"
for m in $(cat /lib/modules/order); do insmod /lib/modules/$m 2>/dev/null; done
ip link set eth0 up
i=0; while [ "$(cat /sys/class/net/eth0/carrier 2>/dev/null)" != 1 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
udhcpc -i eth0 -s /etc/udhcpc.script -n -q -t 10 -T 2
wget -q -O /tmp/hello http://10.99.0.1:8081/images/lab/hello.txt && echo "LAB-NET-OK: $(cat /tmp/hello)"
poweroff -f
"#;
    vm::busybox_initramfs(&kernel, init, &images.join("initrd.gz"))?;
    std::fs::write(
        images.join("boot.ipxe"),
        "#!ipxe\necho LAB-IPXE: ${ip} from ${dhcp-server} platform ${platform}\n\
         kernel http://10.99.0.1:8081/images/lab/vmlinuz initrd=initrd.gz console=ttyS0 panic=-1 quiet\n\
         initrd http://10.99.0.1:8081/images/lab/initrd.gz\nboot\n",
    )?;
    let snapshot = serde_json::json!({
        "revision": 1,
        "networks": [{"slug": "lab", "subnet": "10.99.0.0", "prefix": 24, "domain": "lab",
                      "pool": ["10.99.0.100", "10.99.0.199"], "dhcp": true}],
        "hosts": [
            {"mac": "52:54:00:99:00:01", "ipv4": "10.99.0.21", "hostname": "n01", "network": "lab", "bootable": true},
            {"mac": "52:54:00:99:00:02", "ipv4": "10.99.0.22", "hostname": "n02", "network": "lab", "bootable": true}
        ],
        "boot": {"ipxe_script_url": "http://10.99.0.1:8081/images/lab/boot.ipxe"}
    });
    let snap_file = run.path().join("boot.json");
    std::fs::write(&snap_file, snapshot.to_string())?;

    let ns = Netns::new("boot")?;
    ns.add_bridge("br0")?;
    ns.add_addr("br0", "10.99.0.1/24")?;
    ns.up("br0")?;
    ns.up("lo")?;
    for tap in ["tap0", "tap1"] {
        ns.ip(&["tuntap", "add", "dev", tap, "mode", "tap"])?;
        ns.ip(&["link", "set", tap, "master", "br0"])?;
        ns.up(tap)?;
    }
    let log = std::fs::File::create(run.path().join("jobserver.log"))?;
    let mut server = ns
        .command(jobserver.to_str().context("path")?)
        .args(["--boot-config"])
        .arg(&snap_file)
        .args([
            "--server-ip",
            "10.99.0.1",
            "--dhcp",
            "0.0.0.0:67",
            "--dhcp-interface",
            "br0",
            "--tftp",
            "10.99.0.1:69",
        ])
        .args([
            "--no-dns",
            "--http",
            "10.99.0.1:8081",
            "--metrics",
            "127.0.0.1:9102",
        ])
        .arg("--export")
        .arg(&export)
        .arg("--state-dir")
        .arg(run.path().join("state"))
        .arg("--listen-file")
        .arg(run.path().join("listen.json"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting mprov-jobserver")?;
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let guard = Kill(&mut server);
    let server_log =
        || std::fs::read_to_string(run.path().join("jobserver.log")).unwrap_or_default();
    // Every server bound before the first VM powers on.
    mprov_tests::listen::wait(
        &run.path().join("listen.json"),
        guard.0,
        Duration::from_secs(20),
    )
    .with_context(server_log)?;

    for (firmware, tap, mac, nic, ip) in [
        (
            Firmware::Bios,
            "tap0",
            "52:54:00:99:00:01",
            "e1000",
            "10.99.0.21",
        ),
        // No option ROM: OVMF's own PXE fetches snponly.efi over TFTP.
        (
            Firmware::Uefi,
            "tap1",
            "52:54:00:99:00:02",
            "virtio-net-pci,romfile=",
            "10.99.0.22",
        ),
    ] {
        let mut machine = Vm::boot(&VmSpec {
            netns: ns.name().to_owned(),
            tap: tap.to_owned(),
            mac: mac.to_owned(),
            firmware,
            nic: nic.to_owned(),
            run_dir: run.path().join(format!("vm-{tap}")),
        })?;
        let console = machine
            .wait_for("LAB-NET-OK", Duration::from_secs(240))
            .with_context(|| format!("{firmware:?} boot; job server log:\n{}", server_log()))?;
        assert!(
            console.contains("LAB-NET-OK: hello-from-the-job-server"),
            "{console}"
        );
        assert!(
            console.contains(&format!("LAB: lease {ip}")),
            "the reservation, from our DHCP: {console}"
        );
        machine.wait_exit(Duration::from_secs(60))?;
    }
    drop(guard);
    let log = server_log();
    assert!(
        log.contains("snponly.efi") || log.contains("TFTP"),
        "UEFI fetched iPXE over our TFTP:\n{log}"
    );
    // iPXE and busybox wget downloaded over our HTTP server, one
    // provisioning line per file, naming the node from the reservation.
    for node in ["n01 (10.99.0.21)", "n02 (10.99.0.22)"] {
        for what in [
            "kernel of image lab",
            "initrd.gz of image lab",
            "hello.txt of image lab",
        ] {
            let line = format!("provisioning: {node} got {what} (");
            assert!(log.contains(&line), "{line} missing from\n{log}");
        }
    }
    Ok(())
}

/// The lab kernel's real module tree, from Debian's package, which ships no
/// `modules.dep`: mprov-initramfs reads each module's `.modinfo` and gives the
/// NIC modules in the load order of `netboot-lab.md`, finds the PCI drivers of
/// QEMU's NICs, and packs the modules byte for byte.
#[test]
fn initramfs_resolves_the_lab_kernels_nic_modules() -> Result<()> {
    use std::io::Write;
    use std::process::{Command, Stdio};

    use mprov_initramfs::{Compression, Initramfs, ModuleTree, PciId};
    use mprov_tests::vm;

    let target = mprov_tests::xtask::target_dir();
    let cache = target.join("lab-cache");
    let kernel = vm::lab_kernel(&cache)?;
    // The unpacked package: the tree is found under lib/modules/<release>.
    let package = cache.join(&kernel.release);
    let tree = ModuleTree::open(&package)?;
    assert_eq!(tree.release(), kernel.release);
    assert!(!tree.has_modules_dep(), "the package ships no modules.dep");

    let extra = [("virtio_net", "virtio_pci")];
    let resolved = tree.resolve(&["e1000", "virtio_net"], &extra)?;
    // The load order of `vm::LAB_MODULES` (e1000, virtio_ring, virtio,
    // virtio_pci_legacy_dev, virtio_pci_modern_dev, virtio_pci, failover,
    // net_failover, virtio_net), by name.
    let lab_order: Vec<&str> = vm::LAB_MODULES
        .iter()
        .map(|path| {
            path.rsplit('/')
                .next()
                .unwrap_or(path)
                .trim_end_matches(".ko")
        })
        .collect();
    assert_eq!(resolved.names(), lab_order);
    let paths: Vec<_> = resolved
        .modules
        .iter()
        .map(|m| tree.root().join(&m.path))
        .collect();
    assert_eq!(paths, kernel.modules, "the files the lab VM boots with");
    // virtio_net does not declare its PCI transport.
    let plain = tree.resolve(&["virtio_net"], &[])?;
    assert!(
        !plain.names().contains(&"virtio_pci"),
        "{:?}",
        plain.names()
    );

    let by_pci = |id: &str| -> Result<Vec<String>> { Ok(tree.match_pci(&[id.parse::<PciId>()?])?) };
    assert_eq!(by_pci("8086:100e")?, ["e1000"]); // QEMU's e1000
    assert_eq!(by_pci("1af4:1000")?, ["virtio_pci"]); // virtio-net-pci, legacy
    assert_eq!(by_pci("1af4:1041")?, ["virtio_pci"]); // virtio-net-pci, modern
    assert!(
        by_pci("10ec:8139")?.is_empty(),
        "8139too is not in the lab's extract"
    );

    let built = Initramfs::builder()
        .init(b"#!/bin/sh\n".as_slice())
        .modules(&package, ["e1000", "virtio-net"])
        .extra_dependency("virtio_net", "virtio_pci")
        .build(Compression::Gzip)?;
    let work = tempfile::tempdir()?;
    let mut child = Command::new("sh")
        .args(["-c", "gzip -dc | cpio -idm --quiet --no-absolute-filenames"])
        .current_dir(work.path())
        .stdin(Stdio::piped())
        .spawn()
        .context("running gzip and cpio")?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(&built.image)?;
    anyhow::ensure!(child.wait()?.success(), "gzip -dc | cpio -idm failed");
    let list = std::fs::read_to_string(work.path().join("etc/mprov/modules"))?;
    let listed: Vec<&str> = list.lines().collect();
    assert_eq!(listed.len(), kernel.modules.len());
    for (line, source) in listed.iter().zip(&kernel.modules) {
        let unpacked = work.path().join(line.trim_start_matches('/'));
        assert!(
            line.starts_with(&format!("/lib/modules/{}/kernel/", kernel.release)),
            "{line}"
        );
        assert_eq!(std::fs::read(&unpacked)?, std::fs::read(source)?, "{line}");
    }
    Ok(())
}

/// The static agent as `/init` of an initramfs from `mprov-initramfs`, the
/// lab kernel booted directly by QEMU with an e1000 and a virtio-net NIC (on
/// a QEMU hub of their own: no host networking): the agent mounts, loads the
/// NIC modules and reports what it sees; told to boot from a MAC no NIC has,
/// it says so as a fatal error of step 1 and retries (PID 1 does not exit).
#[test]
fn agent_boots_as_init_in_qemu() -> Result<()> {
    use std::time::Duration;

    use mprov_initramfs::{Compression, Initramfs};
    use mprov_tests::vm::{self, DirectBoot, Vm};

    const CA: &str = "4f3c2b1a00112233445566778899aabbccddeeff0123456789abcdef01234567";
    const URL: &str = "http://10.99.0.1:8080";
    const NONCE: &str = "abc123";
    const ABSENT_MAC: &str = "52:54:00:12:34:99";
    let nics = [
        ("e1000", "52:54:00:12:34:01"),
        ("virtio-net-pci", "52:54:00:12:34:02"),
    ];

    let agent = mprov_tests::agent::build_static()?;
    eprintln!(
        "static agent: {} ({}, {} bytes): {}",
        agent.path.display(),
        agent.target,
        agent.size,
        agent.file_type
    );

    let target = mprov_tests::xtask::target_dir();
    let cache = target.join("lab-cache");
    let kernel = vm::lab_kernel(&cache)?;
    let built = Initramfs::builder()
        .init(agent.path.clone())
        .modules(cache.join(&kernel.release), ["e1000", "virtio_net"])
        .extra_dependency("virtio_net", "virtio_pci")
        .build(Compression::Gzip)?;
    let run = tempfile::tempdir()?;
    let initrd = run.path().join("initrd.gz");
    std::fs::write(&initrd, &built.image)?;

    // `quiet` keeps the kernel's own log (which would echo the command line,
    // nonce included) off the console, so the agent's lines are what we see.
    let append = format!(
        "console=ttyS0 panic=-1 quiet mprov_enroll={NONCE} mprov_ca={CA} mprov_url={URL} mprov_mac={ABSENT_MAC}"
    );
    let mut machine = Vm::boot_kernel(&DirectBoot {
        kernel: kernel.vmlinuz.clone(),
        initrd,
        append: append.clone(),
        nics: nics
            .iter()
            .map(|(model, mac)| ((*model).to_owned(), (*mac).to_owned()))
            .collect(),
        run_dir: run.path().join("vm"),
    })?;
    let console = machine.wait_for("mprov-agent: retrying in", Duration::from_secs(180))?;

    let banner = format!("mprov-agent {} starting", env!("CARGO_PKG_VERSION"));
    let expected = [
        banner,
        format!(
            "kernel command line: console=ttyS0 panic=-1 quiet mprov_enroll=a… (6 characters) mprov_ca={CA} mprov_url={URL}"
        ),
        "modules: loaded e1000, virtio_ring, virtio, virtio_pci_legacy_dev, \
         virtio_pci_modern_dev, virtio_pci, failover, net_failover, virtio_net; failed none"
            .to_owned(),
        "network interfaces: 2".to_owned(),
        format!("eth0 mac {} driver e1000", nics[0].1),
        format!("eth1 mac {} driver virtio_net", nics[1].1),
        "parameters:".to_owned(),
        "mprov_enroll: a… (6 characters)".to_owned(),
        format!("mprov_ca: {CA}"),
        format!("mprov_url: {URL}"),
        format!("mprov_mac: {ABSENT_MAC}"),
        "mprov_image: not given".to_owned(),
        "mprov_rescue: not given".to_owned(),
        format!("mprov-agent: FATAL: step 1: no interface has MAC {ABSENT_MAC} (the kernel has 2)"),
        "mprov-agent: retrying in 20 s (attempt 2)".to_owned(),
    ];
    // Each line, in this order.
    let mut rest = console.as_str();
    for want in &expected {
        let at = rest
            .find(want.as_str())
            .with_context(|| format!("{want:?} (in order) on the console:\n{console}"))?;
        rest = &rest[at + want.len()..];
    }
    // Nothing failed on the way: no mount, module or parameter complaint.
    for bad in [
        "mprov-agent: mounting",
        "mprov-agent: module",
        "refused:",
        "BUG:",
    ] {
        assert!(!console.contains(bad), "{bad:?} on the console:\n{console}");
    }
    // PID 1 is still there (no panic), and the nonce never reached the
    // console whole.
    assert!(machine.exited()?.is_none(), "the VM stopped:\n{console}");
    assert!(!console.contains("Kernel panic"), "{console}");
    assert!(!console.contains(&format!("={NONCE}")), "{console}");
    Ok(())
}
