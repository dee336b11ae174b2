//! QEMU VMs for the netboot tests: the lab kernel (Debian's, downloaded with
//! apt, never installed), a busybox initramfs, and a VM that network-boots on a
//! tap device inside one of the lab's network namespaces, with its serial
//! console in a file we read.
//!
//! KVM does not work on these machines, so VMs run under TCG: a PXE boot to a
//! shell takes 20 to 40 s.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::process::Process;

/// The NIC drivers the lab kernel needs, in load order. virtio_pci is not a
/// declared dependency of virtio_net, so the order is spelled out.
pub const LAB_MODULES: &[&str] = &[
    "kernel/drivers/net/ethernet/intel/e1000/e1000.ko",
    "kernel/drivers/virtio/virtio_ring.ko",
    "kernel/drivers/virtio/virtio.ko",
    "kernel/drivers/virtio/virtio_pci_legacy_dev.ko",
    "kernel/drivers/virtio/virtio_pci_modern_dev.ko",
    "kernel/drivers/virtio/virtio_pci.ko",
    "kernel/net/core/failover.ko",
    "kernel/drivers/net/net_failover.ko",
    "kernel/drivers/net/virtio_net.ko",
];

/// The lab kernel and its NIC modules.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The kernel image.
    pub vmlinuz: PathBuf,
    /// The kernel release, e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// The NIC modules, in load order.
    pub modules: Vec<PathBuf>,
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Debian's current kernel package, extracted (kernel and NIC modules only)
/// into `cache`, downloaded once.
pub fn lab_kernel(cache: &Path) -> Result<Kernel> {
    let mut depends = run(Command::new("apt-cache").args(["depends", "linux-image-amd64"]))?;
    if !depends.contains("Depends: linux-image-") {
        // A machine whose package lists were never fetched.
        run(Command::new("apt-get")
            .args(["update", "-q"])
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
        depends = run(Command::new("apt-cache").args(["depends", "linux-image-amd64"]))?;
    }
    let package = depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| {
            p.starts_with("linux-image-") && p.chars().nth(12).is_some_and(|c| c.is_ascii_digit())
        })
        .context(
            "apt-cache names no linux-image-<version> for linux-image-amd64; run apt-get update",
        )?
        .to_owned();
    let release = package.trim_start_matches("linux-image-").to_owned();
    let dir = cache.join(&release);
    let vmlinuz = dir.join(format!("boot/vmlinuz-{release}"));
    let moddir = dir.join(format!("lib/modules/{release}"));
    let modules: Vec<PathBuf> = LAB_MODULES.iter().map(|m| moddir.join(m)).collect();
    if vmlinuz.is_file() && modules.iter().all(|m| m.is_file()) {
        return Ok(Kernel {
            vmlinuz,
            release,
            modules,
        });
    }
    fs::create_dir_all(&dir)?;
    run(Command::new("apt-get")
        .current_dir(&dir)
        .args(["download", &package]))?;
    let deb = fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    let mut wanted = vec![format!("./boot/vmlinuz-{release}")];
    wanted.extend(
        LAB_MODULES
            .iter()
            .map(|m| format!("./lib/modules/{release}/{m}")),
    );
    let script = format!(
        "dpkg-deb --fsys-tarfile {} | tar -x -C {} {}",
        deb.display(),
        dir.display(),
        wanted.join(" ")
    );
    run(Command::new("sh").args(["-c", &script]))?;
    fs::remove_file(&deb)?;
    ensure!(vmlinuz.is_file(), "no kernel in {package}");
    Ok(Kernel {
        vmlinuz,
        release,
        modules,
    })
}

/// Builds a gzip'd newc initramfs with static busybox, the kernel's NIC
/// modules and `init` as `/init`.
pub fn busybox_initramfs(kernel: &Kernel, init: &str, out: &Path) -> Result<()> {
    let stage = tempfile::tempdir()?;
    let s = stage.path();
    for d in ["bin", "dev", "proc", "sys", "tmp", "etc", "lib/modules"] {
        fs::create_dir_all(s.join(d))?;
    }
    let busybox = Path::new("/bin/busybox");
    let ldd = Command::new("file")
        .arg(busybox)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if ldd.as_deref().is_ok_and(|t| t.contains("dynamically")) {
        bail!("/bin/busybox is not static: install the Debian package busybox-static");
    }
    fs::copy(busybox, s.join("bin/busybox"))?;
    std::os::unix::fs::symlink("busybox", s.join("bin/sh"))?;
    let mut order = String::new();
    for m in &kernel.modules {
        let name = m.file_name().context("module name")?;
        fs::copy(m, s.join("lib/modules").join(name))?;
        order.push_str(&name.to_string_lossy());
        order.push('\n');
    }
    fs::write(s.join("lib/modules/order"), order)?;
    fs::write(s.join("init"), init)?;
    fs::write(
        s.join("etc/udhcpc.script"),
        "#!/bin/sh\ncase \"$1\" in bound|renew)\n  ip addr add \"$ip/$mask\" dev \"$interface\"\n  [ -n \"$router\" ] && ip route add default via \"$router\"\n  echo \"LAB: lease $ip router $router dns $dns domain $domain hostname $hostname\";;\nesac\nexit 0\n",
    )?;
    for f in ["init", "etc/udhcpc.script"] {
        run(Command::new("chmod").args(["0755"]).arg(s.join(f)))?;
    }
    run(Command::new("mknod")
        .arg(s.join("dev/console"))
        .args(["c", "5", "1"]))?;
    run(Command::new("mknod")
        .arg(s.join("dev/null"))
        .args(["c", "1", "3"]))?;
    let script = format!(
        "cd {} && find . -print0 | sort -z | cpio --null -o -H newc --owner=0:0 --quiet | gzip -9 > {}",
        s.display(),
        out.display()
    );
    run(Command::new("sh").args(["-c", &script]))?;
    Ok(())
}

/// What the lab's local disk ([`local_disk`]) prints on the serial port
/// when the firmware boots it.
pub const LOCAL_DISK_MARKER: &str = "MPROV-LAB-LOCAL-DISK: booted from the local disk";

/// Writes a raw disk image of 64 KiB whose boot sector prints
/// [`LOCAL_DISK_MARKER`] on COM1 and halts: proof that the firmware booted
/// the local disk (a VM has no other).
pub fn local_disk(path: &Path) -> Result<()> {
    // 16-bit real mode at 0000:7C00.
    let mut sector: Vec<u8> = vec![
        0xFA, // cli
        0xFC, // cld
        0x31, 0xC0, // xor ax, ax
        0x8E, 0xD8, // mov ds, ax
        0xBE, 0x17, 0x7C, // mov si, 0x7c17 (the message, below)
        0xBA, 0xF8, 0x03, // mov dx, 0x3f8 (COM1)
        0xAC, // next: lodsb
        0x84, 0xC0, // test al, al
        0x74, 0x03, // jz done
        0xEE, // out dx, al
        0xEB, 0xF8, // jmp next
        0xF4, // done: hlt
        0xEB, 0xFD, // jmp done
    ];
    ensure!(
        sector.len() == 0x17,
        "the boot code's length moved its message"
    );
    sector.extend_from_slice(b"\r\n");
    sector.extend_from_slice(LOCAL_DISK_MARKER.as_bytes());
    sector.extend_from_slice(b"\r\n\0");
    ensure!(sector.len() <= 510, "the boot sector is too long");
    sector.resize(510, 0);
    sector.extend_from_slice(&[0x55, 0xAA]);
    sector.resize(64 * 1024, 0);
    fs::write(path, sector).with_context(|| format!("writing {}", path.display()))
}

/// Which firmware a VM starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Firmware {
    /// SeaBIOS with the NIC's iPXE option ROM.
    Bios,
    /// OVMF (UEFI) with the NIC's iPXE-EFI option ROM.
    Uefi,
}

/// A running VM; stopped when dropped.
#[derive(Debug)]
pub struct Vm {
    process: Process,
    serial: PathBuf,
}

/// What a VM boots with.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// The network namespace holding the tap device.
    pub netns: String,
    /// The tap device (made beforehand, attached to the lab bridge).
    pub tap: String,
    /// The VM's MAC address.
    pub mac: String,
    /// Its firmware.
    pub firmware: Firmware,
    /// The QEMU NIC model, e.g. `e1000` or `virtio-net-pci`.
    pub nic: String,
    /// A folder for its serial log and firmware variables.
    pub run_dir: PathBuf,
}

/// What a VM boots with when QEMU loads the kernel itself (`-kernel`,
/// `-initrd`, `-append`): no firmware network boot, no netns. Its NICs sit on
/// a QEMU hub of their own with no host side, so the guest sees real devices
/// and nothing it sends leaves QEMU.
#[derive(Debug, Clone)]
pub struct DirectBoot {
    /// The kernel image.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// The kernel command line.
    pub append: String,
    /// The NICs: `(QEMU device model, MAC)`, e.g. `("e1000", "52:54:00:…")`.
    pub nics: Vec<(String, String)>,
    /// A folder for its serial log.
    pub run_dir: PathBuf,
}

/// A VM's memory and CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// RAM in MiB.
    pub memory_mib: u32,
    /// Virtual CPUs (TCG runs one host thread for each).
    pub cpus: u32,
}

impl Size {
    /// The default: 512 MiB, one CPU (busybox roots, firmware checks).
    pub const SMALL: Size = Size {
        memory_mib: 512,
        cpus: 1,
    };
}

/// QEMU under TCG with the lab's common options: no default devices (no
/// SLIRP NIC), serial console to `serial`, the second serial port to the
/// export file beside it (made afresh, mode 0600), and an exit instead of
/// a reboot.
fn qemu(cmd: &mut Command, serial: &Path, size: Size) -> Result<()> {
    // A run folder booted before holds the last boot's console: read before
    // QEMU opens the file anew, its ready marker would end the wait at once.
    let export = serial.with_file_name(EXPORT_FILE);
    for old in [serial, export.as_path()] {
        let _ = fs::remove_file(old);
    }
    private_file(&export)?;
    cmd.args(["-accel", "tcg", "-m", &size.memory_mib.to_string()]);
    cmd.args([
        "-smp",
        &size.cpus.to_string(),
        "-nodefaults",
        "-nographic",
        "-monitor",
        "none",
        "-no-reboot",
    ]);
    cmd.arg("-serial").arg(format!("file:{}", serial.display()));
    // COM2: the lab root's export channel (see `lab::EXPORT_ARG`).
    cmd.arg("-serial").arg(format!("file:{}", export.display()));
    Ok(())
}

/// Makes `path` an empty file only its owner may read (0600, whatever the
/// umask): QEMU's `file:` serial backend keeps the mode of a file that
/// exists. The lab root's export holds the node's certificate and command
/// line, and the demo's run folder is world-readable.
fn private_file(path: &Path) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// The second serial port's file, beside the console's.
const EXPORT_FILE: &str = "export.log";

/// The lab root's export (`MPROV-LAB-EXPORT <name> <value>` lines, values
/// base64 but for `key-mode` and `hostname`), decoded, once its `end` line
/// is in `text`; `None` before. The file is read while the guest still
/// writes it, so nothing is decoded until the `end` line shows every line
/// before it is whole.
pub fn parse_export(text: &str) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
    use base64::Engine as _;
    let is_end = |line: &str| line.trim_end_matches('\r') == "MPROV-LAB-EXPORT end";
    let Some(end) = text
        .split_inclusive('\n')
        .position(|line| line.ends_with('\n') && is_end(line.trim_end_matches('\n')))
    else {
        return Ok(None);
    };
    let mut items = BTreeMap::new();
    for line in text.lines().take(end) {
        let mut parts = line.trim_end_matches('\r').splitn(3, ' ');
        if parts.next() != Some("MPROV-LAB-EXPORT") {
            continue;
        }
        let name = parts.next().unwrap_or_default().to_owned();
        let value = parts.next().unwrap_or_default().trim();
        let bytes = if matches!(name.as_str(), "key-mode" | "hostname") {
            value.as_bytes().to_vec()
        } else {
            base64::engine::general_purpose::STANDARD
                .decode(value)
                .with_context(|| format!("the export's {name} is not base64"))?
        };
        items.insert(name, bytes);
    }
    Ok(Some(items))
}

impl Vm {
    /// Starts QEMU (TCG, [`Size::SMALL`]) network-booting from `spec.tap`.
    pub fn boot(spec: &VmSpec) -> Result<Vm> {
        Vm::boot_sized(spec, Size::SMALL)
    }

    /// Starts QEMU (TCG) of `size` network-booting from `spec.tap`.
    pub fn boot_sized(spec: &VmSpec, size: Size) -> Result<Vm> {
        Vm::boot_machine(spec, size, None)
    }

    /// Like [`Vm::boot_sized`] (SeaBIOS only), with `disk` (a raw image) as
    /// the local disk the firmware boots after the network.
    pub fn boot_with_disk(spec: &VmSpec, size: Size, disk: &Path) -> Result<Vm> {
        ensure!(
            spec.firmware == Firmware::Bios,
            "a local disk is for SeaBIOS VMs"
        );
        Vm::boot_machine(spec, size, Some(disk))
    }

    fn boot_machine(spec: &VmSpec, size: Size, disk: Option<&Path>) -> Result<Vm> {
        fs::create_dir_all(&spec.run_dir)?;
        let serial = spec.run_dir.join("serial.log");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &spec.netns, "qemu-system-x86_64"]);
        qemu(&mut cmd, &serial, size)?;
        cmd.args([
            "-netdev",
            &format!("tap,id=n0,ifname={},script=no,downscript=no", spec.tap),
        ]);
        match spec.firmware {
            Firmware::Bios => {
                cmd.args(["-machine", "pc", "-boot", "n"]);
            }
            Firmware::Uefi => {
                let vars = spec.run_dir.join("OVMF_VARS.fd");
                fs::copy("/usr/share/OVMF/OVMF_VARS_4M.fd", &vars)
                    .context("OVMF is missing: install ovmf")?;
                cmd.args(["-machine", "q35", "-drive"]);
                cmd.arg(
                    "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
                );
                cmd.arg("-drive").arg(format!(
                    "if=pflash,format=raw,unit=1,file={}",
                    vars.display()
                ));
            }
        }
        cmd.args([
            "-device",
            &format!("{},netdev=n0,mac={},bootindex=1", spec.nic, spec.mac),
        ]);
        if let Some(disk) = disk {
            cmd.arg("-drive").arg(format!(
                "if=none,id=disk0,format=raw,file={}",
                disk.display()
            ));
            cmd.args(["-device", "ide-hd,drive=disk0,bootindex=2"]);
        }
        Vm::spawn(cmd, &spec.run_dir, serial)
    }

    /// Starts QEMU (TCG, SeaBIOS) loading `spec.kernel` and `spec.initrd`
    /// itself. Needs no root.
    pub fn boot_kernel(spec: &DirectBoot) -> Result<Vm> {
        Vm::direct(spec, None, Size::SMALL)
    }

    /// Like [`Vm::boot_kernel`], of `size`, but the first NIC
    /// is on the tap device `tap` (made beforehand, on a bridge) inside the
    /// network namespace `netns`: a direct kernel boot on a real network.
    pub fn boot_kernel_on(spec: &DirectBoot, netns: &str, tap: &str, size: Size) -> Result<Vm> {
        Vm::direct(spec, Some((netns, tap)), size)
    }

    fn direct(spec: &DirectBoot, tap: Option<(&str, &str)>, size: Size) -> Result<Vm> {
        fs::create_dir_all(&spec.run_dir)?;
        let serial = spec.run_dir.join("serial.log");
        let mut cmd = match tap {
            Some((netns, _)) => {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", netns, "qemu-system-x86_64"]);
                cmd
            }
            None => Command::new("qemu-system-x86_64"),
        };
        qemu(&mut cmd, &serial, size)?;
        cmd.args(["-machine", "pc", "-kernel"]).arg(&spec.kernel);
        cmd.arg("-initrd").arg(&spec.initrd);
        cmd.arg("-append").arg(&spec.append);
        for (i, (model, mac)) in spec.nics.iter().enumerate() {
            let netdev = match tap {
                Some((_, tap)) if i == 0 => {
                    format!("tap,id=n{i},ifname={tap},script=no,downscript=no")
                }
                _ => format!("hubport,id=n{i},hubid=0"),
            };
            cmd.args(["-netdev", &netdev]);
            // No option ROM: nothing boots from the network here.
            cmd.args([
                "-device",
                &format!("{model},netdev=n{i},mac={mac},romfile="),
            ]);
        }
        Vm::spawn(cmd, &spec.run_dir, serial)
    }

    fn spawn(mut cmd: Command, run_dir: &Path, serial: PathBuf) -> Result<Vm> {
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        cmd.stderr(fs::File::create(run_dir.join("qemu.log"))?);
        let child = cmd
            .spawn()
            .context("starting qemu-system-x86_64 (install qemu-system-x86)")?;
        Ok(Vm {
            process: Process::new("qemu", child, Duration::from_secs(5)),
            serial,
        })
    }

    /// QEMU's exit status if it has exited, without waiting.
    pub fn exited(&mut self) -> Result<Option<ExitStatus>> {
        self.process.try_wait()
    }

    /// Where the serial console is written.
    pub fn serial_path(&self) -> &Path {
        &self.serial
    }

    /// The serial console so far.
    pub fn console(&self) -> String {
        fs::read(&self.serial)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// What the lab root wrote on the second serial port
    /// (`MPROV-LAB-EXPORT <name> <base64>` lines, see `lab::EXPORT_ARG`),
    /// decoded, once its `end` line is there; waits up to `timeout`.
    pub fn export(&self, timeout: Duration) -> Result<BTreeMap<String, Vec<u8>>> {
        let path = self.serial.with_file_name(EXPORT_FILE);
        let deadline = Instant::now() + timeout;
        loop {
            let text = fs::read(&path)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            if let Some(items) = parse_export(&text)? {
                return Ok(items);
            }
            ensure!(
                Instant::now() < deadline,
                "the lab root wrote no export on the second serial port within {timeout:?} ({}): is {} on the kernel command line?",
                path.display(),
                crate::lab::EXPORT_ARG
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until the console shows `marker`, the VM exits, or `timeout`.
    pub fn wait_for(&mut self, marker: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let console = self.console();
            if console.contains(marker) {
                return Ok(console);
            }
            if let Some(status) = self.process.try_wait()? {
                bail!("the VM exited ({status}) before {marker:?}; console:\n{console}");
            }
            if Instant::now() > deadline {
                bail!("no {marker:?} on the console within {timeout:?}; console:\n{console}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits for the VM to power itself off; QEMU's exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.try_wait()? {
                return Ok(status);
            }
            ensure!(
                Instant::now() < deadline,
                "the VM did not power off within {timeout:?}; console:\n{}",
                self.console()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::process::Command;
    use std::time::{Duration, Instant};

    use super::{EXPORT_FILE, Size, qemu};

    /// QEMU, paused (`-S`), opens both serial files: the export it writes
    /// is the fresh 0600 file, not a stale world-readable one.
    #[test]
    fn the_export_file_stays_private_once_qemu_opens_it() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let serial = dir.path().join("serial.log");
        let export = serial.with_file_name(EXPORT_FILE);
        std::fs::write(&export, "MPROV-LAB-EXPORT node.crt b2xk\n")?;
        std::fs::set_permissions(&export, std::fs::Permissions::from_mode(0o644))?;
        let mut cmd = Command::new("qemu-system-x86_64");
        qemu(&mut cmd, &serial, Size::SMALL)?;
        let mut child = crate::KillOnDrop(
            cmd.arg("-S")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .spawn()?,
        );
        // QEMU makes the console's file once it opens its serial ports.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !serial.exists() {
            anyhow::ensure!(child.0.try_wait()?.is_none(), "qemu exited");
            anyhow::ensure!(Instant::now() < deadline, "qemu opened no serial file");
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(child);
        let meta = std::fs::metadata(&export)?;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), 0, "the last boot's export is gone");
        Ok(())
    }
}
