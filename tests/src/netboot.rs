//! Netbooting the lab's Debian image in a QEMU VM, three ways:
//!
//! - [`Way::Mprov`]: our stack. The control service and one or two job
//!   servers (following it, enrolled with one-time tokens) run in the lab
//!   namespace; the node is registered through the API; the VM's firmware
//!   takes a lease from our DHCP, chains to `/ipxe/`, fetches the kernel and
//!   the image's agent initramfs, and the agent enrolls, streams and verifies
//!   `rootfs.tar.zst` and switches root; the root's `mprov-agent` unit reports
//!   `ready`. The timeline is read back through the API.
//! - [`Way::Cpio`] and [`Way::Stream`]: the incumbents (see [`crate::lab`]),
//!   served by a standalone job server (our DHCP, TFTP and HTTP: the same
//!   transport, so only the boot method differs).
//!
//! "Ready" is the root's [`READY_MARKER`] on the serial console (multi-user
//! reached, after the agent's unit), timed from QEMU's start.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mprov_api::boot::{BootEvent, BootPhase, EVENTS_PATH, ImageFile};

use crate::lab::{
    self, Binaries, BootConfigSource, DEBIAN_NODE, Image, JobServer, JobServerSpec, LabControl,
    LabNet, POWEROFF_ARG, READY_MARKER, SECOND_SERVER_IP, SERVER_IP,
};
use crate::vm::{Firmware, Vm, VmSpec};

/// How long a real-root boot may take under TCG before we call it stuck.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(600);

/// A way of booting the lab root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Our stack, end to end.
    Mprov,
    /// Our stack with `MPROV_IPXE_CARRY_LEASE=0`: the agent asks DHCP
    /// itself in the initramfs (what the lease iPXE carries saves).
    MprovAgentDhcp,
    /// The whole root as one cpio initrd.
    Cpio,
    /// busybox `wget | zstd -d | tar x` into a tmpfs, then switch_root.
    Stream,
}

impl Way {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Way::Mprov => "mprov (agent: enroll, stream, verify, switch_root)",
            Way::MprovAgentDhcp => "mprov, the agent's own DHCP (lease not carried)",
            Way::Cpio => "whole root as one cpio initrd",
            Way::Stream => "busybox wget | zstd -d | tar x",
        }
    }
}

/// The firmware and NIC of one boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Machine {
    /// SeaBIOS with the NIC's iPXE ROM (virtio).
    BiosIpxe,
    /// OVMF with the NIC's iPXE-EFI ROM (virtio).
    UefiIpxe,
    /// OVMF's own PXE client on virtio (`romfile=`): TFTP `snponly.efi`,
    /// then iPXE, then HTTP.
    UefiNativePxe,
}

impl Machine {
    fn firmware(self) -> Firmware {
        match self {
            Machine::BiosIpxe => Firmware::Bios,
            _ => Firmware::Uefi,
        }
    }

    fn nic(self) -> &'static str {
        match self {
            Machine::UefiNativePxe => "virtio-net-pci,romfile=",
            _ => "virtio-net-pci",
        }
    }
}

/// A boot that reached ready.
#[derive(Debug)]
pub struct Booted {
    /// From QEMU's start to the ready marker.
    pub ready_after: Duration,
    /// The serial console.
    pub console: String,
    /// The VM, still running unless it powered off.
    pub vm: Vm,
}

/// What a console shows when a boot has failed for good: the firmware gave
/// up, or the kernel panicked.
const DEAD_ENDS: &[&str] = &[
    "No bootable device",
    // The busybox smoke root (`lab::busybox_image`).
    "LAB-SMOKE: mprov-agent ready failed",
    "BdsDxe: No bootable option",
    "Kernel panic - not syncing",
];

/// The dead end `console` shows, if any.
pub fn dead_end(console: &str) -> Option<&'static str> {
    DEAD_ENDS.iter().copied().find(|d| console.contains(d))
}

/// Waits for the ready marker, failing early at a dead end.
pub fn wait_ready(vm: &mut Vm) -> Result<String> {
    let deadline = Instant::now() + BOOT_TIMEOUT;
    loop {
        match vm.wait_for(READY_MARKER, Duration::from_secs(2)) {
            Ok(console) => return Ok(console),
            Err(err) => {
                let console = vm.console();
                if let Some(end) = dead_end(&console) {
                    bail!(
                        "the boot failed ({end:?}); console:\n{}",
                        tail(&console, 60)
                    );
                }
                if Instant::now() > deadline || vm.exited()?.is_some() {
                    return Err(err);
                }
            }
        }
    }
}

/// Starts a VM and waits for the ready marker.
fn boot_vm(net: &LabNet, machine: Machine, mac: &str, run: &Path) -> Result<Booted> {
    let tap = net.tap()?;
    let started = Instant::now();
    let mut vm = Vm::boot_sized(
        &VmSpec {
            netns: net.name().to_owned(),
            tap,
            mac: mac.to_owned(),
            firmware: machine.firmware(),
            nic: machine.nic().to_owned(),
            run_dir: run.to_owned(),
        },
        DEBIAN_NODE,
    )?;
    let console = wait_ready(&mut vm)?;
    Ok(Booted {
        ready_after: started.elapsed(),
        console,
        vm,
    })
}

/// The incumbents' lab: a standalone job server serving per-MAC iPXE
/// scripts, the image's kernel and the two incumbent initrds.
#[derive(Debug)]
pub struct IncumbentLab {
    /// The network.
    pub net: LabNet,
    jobserver: JobServer,
    lab_files: PathBuf,
    image: Image,
    run: PathBuf,
}

/// The folder under the export with the incumbents' files.
const LAB_FILES: &str = "images/lab";

impl IncumbentLab {
    /// Builds the incumbents' initrds and starts the job server; `macs` get
    /// reservations.
    pub fn start(
        bins: &Binaries,
        image: &Image,
        run: &Path,
        macs: &[&str],
    ) -> Result<IncumbentLab> {
        let net = LabNet::new("bench")?;
        let export = run.join("export");
        let lab_files = export.join(LAB_FILES);
        fs::create_dir_all(&lab_files)?;
        lab::export_image(image, &export)?;
        lab::link_or_copy(&image.file(ImageFile::Kernel), &lab_files.join("vmlinuz"))?;
        lab::link_or_copy(&lab::cpio_initrd(image)?, &lab_files.join("root.cpio.zst"))?;
        lab::busybox_stream_initrd(image, &lab_files.join("stream.gz"))?;
        fs::write(
            lab_files.join("boot.ipxe"),
            format!(
                "#!ipxe\nchain http://{SERVER_IP}:8081/{LAB_FILES}/${{net0/mac:hexhyp}}.ipxe\n"
            ),
        )?;
        let hosts: Vec<serde_json::Value> = macs
            .iter()
            .enumerate()
            .map(|(i, mac)| {
                serde_json::json!({"mac": mac, "ipv4": format!("10.99.0.{}", 21 + i),
                    "hostname": format!("bench{:02}", i + 1), "network": "lab", "bootable": true})
            })
            .collect();
        let snapshot = serde_json::json!({
            "revision": 1,
            "networks": [{"slug": "lab", "subnet": lab::LAB_SUBNET, "prefix": lab::LAB_PREFIX,
                          "domain": "lab", "pool": ["10.99.0.100", "10.99.0.199"], "dhcp": true}],
            "hosts": hosts,
            "boot": {"ipxe_script_url": format!("http://{SERVER_IP}:8081/{LAB_FILES}/boot.ipxe")}
        });
        let config = run.join("boot.json");
        fs::write(&config, snapshot.to_string())?;
        let jobserver = JobServer::start(
            &net,
            bins,
            &JobServerSpec {
                config: BootConfigSource::File(config),
                ip: SERVER_IP.to_owned(),
                dhcp: true,
                bridge: "br0",
                args: Vec::new(),
                export,
                home: run.join("jobserver"),
                metrics_port: 9102,
                file_limit: None,
            },
        )?;
        Ok(IncumbentLab {
            net,
            jobserver,
            lab_files,
            image: image.clone(),
            run: run.to_owned(),
        })
    }

    /// The serving process (the job server), for counting its CPU time.
    pub fn server_pids(&self) -> Vec<u32> {
        vec![self.jobserver.pid]
    }

    /// Boots `mac` the incumbent `way` to ready; the VM powers off after.
    pub fn boot(&self, way: Way, machine: Machine, mac: &str) -> Result<Booted> {
        let hex = mac.replace(':', "-");
        let base = format!("http://{SERVER_IP}:8081/{LAB_FILES}");
        let (initrd, extra) = match way {
            Way::Cpio => ("root.cpio.zst", String::new()),
            Way::Stream => (
                "stream.gz",
                format!(
                    " lab_root=http://{SERVER_IP}:8081/{}",
                    mprov_api::boot::image_file_path(
                        &self.image.slug,
                        self.image.version,
                        ImageFile::Rootfs
                    )
                ),
            ),
            Way::Mprov | Way::MprovAgentDhcp => {
                bail!("the incumbents' lab does not boot our stack")
            }
        };
        fs::write(
            self.lab_files.join(format!("{hex}.ipxe")),
            format!(
                "#!ipxe\nkernel {base}/vmlinuz initrd={initrd} console=ttyS0 panic=-1 quiet {POWEROFF_ARG}{extra}\ninitrd {base}/{initrd}\nboot\n"
            ),
        )?;
        let run = self.run.join(format!(
            "vm-{}-{hex}",
            if way == Way::Cpio { "cpio" } else { "stream" }
        ));
        boot_vm(&self.net, machine, mac, &run).with_context(|| {
            format!(
                "{} ({machine:?}); job server log:\n{}",
                way.name(),
                tail(&self.jobserver.log(), 40)
            )
        })
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Options of [`Stack::start`].
#[derive(Debug, Clone, Default)]
pub struct StackOptions {
    /// Start a second job server on [`SECOND_SERVER_IP`] (no DHCP) hosting
    /// the image too. The two report no load (no heartbeat), so js1 stays
    /// the first source, by name.
    pub second_jobserver: bool,
    /// The first job server serves a corrupted `rootfs.tar.zst`.
    pub corrupt_first: bool,
    /// The control service's and the job servers' open-file limit, soft
    /// and hard (`prlimit --nofile`); `None`: the test's own.
    pub file_limit: Option<u64>,
    /// More settings in the control service's environment.
    pub control_env: Vec<(&'static str, String)>,
}

/// Our stack in the lab: the control service and its job servers.
#[derive(Debug)]
pub struct Stack {
    /// The network.
    pub net: LabNet,
    /// The control service.
    pub control: LabControl,
    /// The job servers, the DHCP one first.
    pub jobservers: Vec<JobServer>,
    /// The image.
    pub image: Image,
    /// Each job server's name and export folder.
    exports: Vec<(String, PathBuf)>,
    run: PathBuf,
}

/// A node of the lab inventory.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its host name.
    pub hostname: String,
    /// Its MAC.
    pub mac: String,
    /// Its reserved address.
    pub ip: String,
}

impl Stack {
    /// Starts the control service, registers the lab network, job servers and
    /// image through the API, and starts the job servers, enrolled with
    /// one-time tokens.
    pub fn start(
        bins: &Binaries,
        image: &Image,
        run: &Path,
        options: &StackOptions,
    ) -> Result<Stack> {
        let net = LabNet::new("mprov")?;
        let env: Vec<(&str, &str)> = options
            .control_env
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        let control =
            LabControl::start_with(&net, bins, &run.join("control"), options.file_limit, &env)?;
        control
            .api(
                "POST",
                "/api/v1/networks/",
                Some(&serde_json::json!({
                    "slug": "lab", "name": "the lab bridge", "subnet": lab::LAB_SUBNET,
                    "netmask": lab::LAB_PREFIX, "domain": "lab",
                    "dhcp_start": "10.99.0.100", "dhcp_end": "10.99.0.199",
                    "isdhcp": true, "isbootable": true
                })),
            )
            .context("registering the lab network")?;
        let mut servers = vec![("js1", SERVER_IP, true)];
        if options.second_jobserver {
            net.add_server_ip(SECOND_SERVER_IP)?;
            servers.push(("js2", SECOND_SERVER_IP, false));
        }
        for (name, ip, _) in &servers {
            control
                .api(
                    "POST",
                    "/api/v1/jobservers/",
                    Some(&serde_json::json!({
                        "name": name, "addresses": [ip], "port": mprov_api::boot::DEFAULT_HTTP_PORT,
                        "network": "lab"
                    })),
                )
                .with_context(|| format!("registering job server {name}"))?;
        }
        let mut exports = Vec::new();
        let mut jobservers = Vec::new();
        for (i, (name, ip, dhcp)) in servers.iter().enumerate() {
            let export = run.join(format!("export-{name}"));
            fs::create_dir_all(&export)?;
            exports.push(((*name).to_owned(), export.clone()));
            let token = control.enroll_token(bins, name)?;
            jobservers.push(JobServer::start(
                &net,
                bins,
                &JobServerSpec {
                    config: BootConfigSource::Control {
                        url: control.https_url(),
                        ca: control.ca(),
                        token,
                        name: (*name).to_owned(),
                        // Two job servers: js1 first, by name.
                        heartbeat: !options.second_jobserver,
                    },
                    ip: (*ip).to_owned(),
                    dhcp: *dhcp,
                    bridge: "br0",
                    args: Vec::new(),
                    export,
                    home: run.join(format!("jobserver-{name}")),
                    metrics_port: 9102 + u16::try_from(i)?,
                    file_limit: options.file_limit,
                },
            )?);
        }
        let stack = Stack {
            net,
            control,
            jobservers,
            exports,
            image: image.clone(),
            run: run.to_owned(),
        };
        stack.host_image(image, options.corrupt_first)?;
        Ok(stack)
    }

    /// A stack a test put together itself (its own networks and job
    /// servers): the job servers with their names and export folders.
    pub fn assemble(
        net: LabNet,
        control: LabControl,
        jobservers: Vec<(String, PathBuf, JobServer)>,
        image: &Image,
        run: &Path,
    ) -> Stack {
        let (exports, jobservers) = jobservers
            .into_iter()
            .map(|(name, export, js)| ((name, export), js))
            .unzip();
        Stack {
            net,
            control,
            jobservers,
            exports,
            image: image.clone(),
            run: run.to_owned(),
        }
    }

    /// Puts `image` on every job server (corrupting the first one's
    /// `rootfs.tar.zst` if asked) and registers it, hosted by them all, with
    /// its published checksum.
    pub fn host_image(&self, image: &Image, corrupt_first: bool) -> Result<()> {
        for (i, (_, export)) in self.exports.iter().enumerate() {
            let dir = lab::export_image(image, export)?;
            if i == 0 && corrupt_first {
                corrupt(&dir.join(ImageFile::Rootfs.file_name()))?;
            }
        }
        let names: Vec<&str> = self.exports.iter().map(|(n, _)| n.as_str()).collect();
        self.control
            .api(
                "POST",
                "/api/v1/images/",
                Some(&serde_json::json!({
                    "slug": image.slug,
                    // The console on the serial port (the tests read it), the
                    // lab root's export (its certificate, never its key) on the second one, and no
                    // IO-APIC timer check: under TCG on a loaded host the kernel
                    // can find the timer "not working" and panic (seen on OVMF).
                    "install_kernel_cmdline": format!("console=ttyS0 quiet no_timer_check {}", lab::EXPORT_ARG),
                    "jobservers": names
                })),
            )
            .with_context(|| format!("registering the image {}", image.slug))?;
        publish_checksum(&self.control, image)
    }

    /// The serving processes (the control service, whose signing helper is
    /// its child, and the job servers), for counting their CPU time.
    pub fn server_pids(&self) -> Vec<u32> {
        self.control
            .pid()
            .into_iter()
            .chain(self.jobservers.iter().map(|js| js.pid))
            .collect()
    }

    /// Registers a node booting the lab image from the network.
    pub fn register(&self, hostname: &str, mac: &str, ip: &str, netboot: bool) -> Result<Node> {
        self.register_with(hostname, mac, ip, netboot, &self.image.slug)
    }

    /// Registers a node booting the lab image from `network` (a slug).
    pub fn register_on(&self, hostname: &str, mac: &str, ip: &str, network: &str) -> Result<Node> {
        self.control
            .api(
                "POST",
                "/api/v1/systems/",
                Some(&serde_json::json!({
                    "hostname": hostname, "image": self.image.slug, "netboot": true,
                    "nics": [{"name": "eth0", "mac": mac, "ipv4": ip, "bootable": true, "network": network}]
                })),
            )
            .with_context(|| format!("registering node {hostname}"))?;
        Ok(Node {
            hostname: hostname.to_owned(),
            mac: mac.to_owned(),
            ip: ip.to_owned(),
        })
    }

    /// Registers a node booting `image` (a slug) from the network.
    pub fn register_with(
        &self,
        hostname: &str,
        mac: &str,
        ip: &str,
        netboot: bool,
        image: &str,
    ) -> Result<Node> {
        self.control
            .api(
                "POST",
                "/api/v1/systems/",
                Some(&serde_json::json!({
                    "hostname": hostname, "image": image, "netboot": netboot,
                    "nics": [{"name": "eth0", "mac": mac, "ipv4": ip, "bootable": true, "network": "lab"}]
                })),
            )
            .with_context(|| format!("registering node {hostname}"))?;
        Ok(Node {
            hostname: hostname.to_owned(),
            mac: mac.to_owned(),
            ip: ip.to_owned(),
        })
    }

    /// The node's boot timeline as the API serves it.
    pub fn timeline(&self, node: &Node) -> Result<Vec<BootEvent>> {
        let reply = self.control.api(
            "GET",
            &format!("{EVENTS_PATH}?system={}", node.hostname),
            None,
        )?;
        let items = reply.get("items").cloned().unwrap_or(reply);
        serde_json::from_value(items).context("reading the boot timeline")
    }

    /// The boot events of a MAC the inventory does not know, as the API
    /// serves them (`?mac=`).
    pub fn timeline_of_mac(&self, mac: &str) -> Result<Vec<BootEvent>> {
        let reply = self
            .control
            .api("GET", &format!("{EVENTS_PATH}?mac={mac}"), None)?;
        let items = reply.get("items").cloned().unwrap_or(reply);
        serde_json::from_value(items).context("reading the boot timeline")
    }

    /// Powers on a VM for `node` on `machine` (on a new tap of the bridge).
    pub fn power_on(&self, node: &Node, machine: Machine) -> Result<Vm> {
        Vm::boot_sized(&self.vm_spec(node, machine)?, DEBIAN_NODE)
    }

    /// Powers on a VM for `node` on `machine` on a new tap of `bridge`
    /// (a network [`LabNet::add_network`] added).
    pub fn power_on_at(&self, node: &Node, machine: Machine, bridge: &str) -> Result<Vm> {
        let spec = VmSpec {
            tap: self.net.tap_on(bridge)?,
            ..self.vm_spec(node, machine)?
        };
        Vm::boot_sized(&spec, DEBIAN_NODE)
    }

    /// Powers on a SeaBIOS + iPXE VM for `node` with `disk` (a raw image,
    /// see [`crate::vm::local_disk`]) as its local disk, booted after the
    /// network.
    pub fn power_on_with_disk(&self, node: &Node, disk: &Path) -> Result<Vm> {
        Vm::boot_with_disk(
            &self.vm_spec(node, Machine::BiosIpxe)?,
            crate::vm::Size::SMALL,
            disk,
        )
    }

    /// Boots the image's kernel and agent initramfs directly (QEMU
    /// `-kernel`, no firmware, no DHCP boot) with `cmdline`, on a new tap of
    /// the bridge with `node`'s MAC: a boot that did not come through
    /// `/ipxe/`, such as a replayed command line.
    pub fn boot_direct(&self, node: &Node, cmdline: &str) -> Result<Vm> {
        let tap = self.net.tap()?;
        Vm::boot_kernel_on(
            &crate::vm::DirectBoot {
                kernel: self.image.file(ImageFile::Kernel),
                initrd: self.image.file(ImageFile::Initramfs),
                append: cmdline.to_owned(),
                nics: vec![("virtio-net-pci".to_owned(), node.mac.clone())],
                run_dir: self.run.join(format!("vm-{}-direct", node.hostname)),
            },
            self.net.name(),
            &tap,
            crate::vm::Size {
                memory_mib: 1024,
                ..DEBIAN_NODE
            },
        )
    }

    fn vm_spec(&self, node: &Node, machine: Machine) -> Result<VmSpec> {
        Ok(VmSpec {
            netns: self.net.name().to_owned(),
            tap: self.net.tap()?,
            mac: node.mac.clone(),
            firmware: machine.firmware(),
            nic: machine.nic().to_owned(),
            run_dir: self.run.join(format!("vm-{}", node.hostname)),
        })
    }

    /// The CA fingerprint the control service logged at start, as `/ipxe/`
    /// puts it in `mprov_ca=`.
    pub fn ca_fingerprint(&self) -> Result<String> {
        let log = self.control.log();
        log.lines()
            .filter(|l| l.contains("CA certificate"))
            .find_map(|l| l.split("(sha256 ").nth(1))
            .and_then(|rest| rest.split(')').next())
            .map(str::to_owned)
            .context("the control service logged no CA fingerprint")
    }

    /// Boots `node` on `machine` until the ready marker; `on_event` sees each
    /// new timeline event as it arrives (when the control service serves the
    /// timeline).
    pub fn boot(
        &self,
        node: &Node,
        machine: Machine,
        on_event: impl FnMut(&BootEvent),
    ) -> Result<Booted> {
        let vm = self.power_on(node, machine)?;
        self.until_ready(node, vm, on_event)
    }

    /// Waits for the VM `vm` booting `node` to reach the ready marker;
    /// `on_event` sees each new timeline event as it arrives.
    pub fn until_ready(
        &self,
        node: &Node,
        mut vm: Vm,
        mut on_event: impl FnMut(&BootEvent),
    ) -> Result<Booted> {
        let started = Instant::now();
        let mut seen = 0usize;
        let deadline = started + BOOT_TIMEOUT;
        loop {
            if let Ok(events) = self.timeline(node) {
                for event in events.iter().skip(seen) {
                    on_event(event);
                }
                seen = seen.max(events.len());
            }
            let console = vm.console();
            if console.contains(READY_MARKER) {
                return Ok(Booted {
                    ready_after: started.elapsed(),
                    console,
                    vm,
                });
            }
            if let Some(end) = dead_end(&console) {
                bail!(
                    "the boot failed ({end:?}); console:\n{}\n{}",
                    tail(&console, 60),
                    self.where_it_stopped(node)
                );
            }
            if let Some(status) = vm.exited()? {
                bail!(
                    "the VM exited ({status}) before ready; console:\n{}\n{}",
                    tail(&console, 60),
                    self.where_it_stopped(node)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "no {READY_MARKER} within {BOOT_TIMEOUT:?}; console:\n{}\n{}",
                    tail(&console, 60),
                    self.where_it_stopped(node)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// What the servers logged, for a failed boot.
    pub fn where_it_stopped(&self, node: &Node) -> String {
        let mut text = format!("{} did not reach ready.", node.hostname);
        match self.timeline(node) {
            Ok(events) => {
                text.push_str("\ntimeline:");
                for e in events {
                    text.push_str(&format!(
                        "\n  {} {} {} {}",
                        e.at,
                        e.phase.as_str(),
                        e.source,
                        e.detail
                    ));
                }
            }
            Err(err) => text.push_str(&format!("\nno timeline from the API: {err:#}")),
        }
        text.push_str(&format!(
            "\ncontrol log:\n{}",
            tail(&self.control.log(), 30)
        ));
        for (i, js) in self.jobservers.iter().enumerate() {
            text.push_str(&format!(
                "\njob server {} log:\n{}",
                i + 1,
                tail(&js.log(), 30)
            ));
        }
        text
    }
}

/// Records the published version's rootfs checksum and size on the image,
/// under whatever names the control service's image kind has for them.
fn publish_checksum(control: &LabControl, image: &Image) -> Result<()> {
    let openapi = control.api("GET", "/api/v1/openapi.json", None)?;
    let props = &openapi["components"]["schemas"]["Image"]["properties"];
    let Some(props) = props.as_object() else {
        return Ok(());
    };
    let mut patch = serde_json::Map::new();
    let size = fs::metadata(image.file(ImageFile::Rootfs))?.len();
    for name in props.keys() {
        if name.contains("sha256") {
            patch.insert(name.clone(), image.rootfs_sha256()?.into());
        } else if name.contains("size") && name.contains("rootfs") {
            patch.insert(name.clone(), size.into());
        }
    }
    if !patch.is_empty() {
        control
            .api(
                "PATCH",
                &format!("/api/v1/images/{}/", image.slug),
                Some(&serde_json::Value::Object(patch)),
            )
            .context("recording the image's checksum")?;
    }
    Ok(())
}

/// Flips bytes in the middle of a file copy (breaking a hard link first).
fn corrupt(path: &Path) -> Result<()> {
    let mut bytes = fs::read(path)?;
    ensure!(
        bytes.len() > 1024,
        "{} is too small to corrupt",
        path.display()
    );
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b ^= 0xa5;
    }
    fs::remove_file(path)?;
    fs::write(path, bytes)?;
    Ok(())
}

/// Whether `events` pass `phases` in this order (others may come between).
pub fn in_order(events: &[BootEvent], phases: &[BootPhase]) -> Result<()> {
    let mut rest = events.iter();
    for want in phases {
        rest.find(|e| e.phase == *want).with_context(|| {
            let got: Vec<&str> = events.iter().map(|e| e.phase.as_str()).collect();
            format!("no {} (in order) in the timeline {got:?}", want.as_str())
        })?;
    }
    Ok(())
}
