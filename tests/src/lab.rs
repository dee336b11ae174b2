//! The netboot lab: a real Debian node image and the network a VM boots it on.
//!
//! - [`debian_image`]: a Debian root from mmdebstrap (systemd, the Debian
//!   kernel) built into an image version by `mprov-image build --recipe`,
//!   cached under the target folder by the content of its recipe and of the
//!   agent it carries, so every test, `cargo xtask demo --check` and the
//!   benchmark of one run share one build.
//! - [`LabNet`]: a network namespace holding the lab bridge (`br0`,
//!   [`SERVER_IP`]/24 and an IPv6 /64 so router advertisements have a
//!   prefix), with a tap device per VM; the servers run inside it.
//! - [`JobServer`] and [`LabControl`]: `mprov-jobserver` and `mprov-control
//!   serve`, started inside the namespace and stopped by their PIDs;
//!   [`follower_command`]: a job server following a control service, for
//!   the tests that start one outside the lab's namespace.
//! - [`cpio_initrd`] and [`busybox_stream_initrd`]: the two incumbent ways of
//!   booting the same root, for the time-to-ready benchmark: the whole root as
//!   one cpio initrd (as Warewulf does), and a busybox initramfs that streams
//!   `rootfs.tar.zst` with `wget | zstd -d | tar x` and switches root.
//!
//! The root carries a unit that prints [`READY_MARKER`] on the serial console
//! once `multi-user.target` is reached (after the agent's own `ready` report
//! when the image has the agent), and powers the VM off when the kernel
//! command line says `mprov_lab_poweroff`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use sha2::{Digest, Sha256};

use crate::netns::Netns;
use crate::process::Process;
use crate::xtask::target_dir;

/// The job server's (and the control service's) address on the lab bridge.
pub const SERVER_IP: &str = "10.99.0.1";
/// A second address on the bridge, for a second job server.
pub const SECOND_SERVER_IP: &str = "10.99.0.2";
/// The lab's network, as the inventory records it.
pub const LAB_SUBNET: &str = "10.99.0.0";
/// Its prefix length.
pub const LAB_PREFIX: u8 = 24;
/// The control service's HTTP port on the bridge.
pub const CONTROL_PORT: u16 = 8080;
/// The control service's HTTPS port on the bridge.
pub const CONTROL_HTTPS_PORT: u16 = 8443;
/// The image's slug in the lab.
pub const IMAGE_SLUG: &str = "debian";
/// The image's version in the lab's cache.
pub const IMAGE_VERSION: i64 = 1;
/// What the root prints on the serial console once multi-user is reached.
pub const READY_MARKER: &str = "MPROV-LAB-READY";
/// The kernel argument that makes the root power off once ready.
pub const POWEROFF_ARG: &str = "mprov_lab_poweroff";
/// The kernel argument that makes the root copy its certificate, CA
/// certificate, control URL and command line out on the VM's second serial
/// port ([`crate::vm::Vm::export`]), with the answers to [`NODE_PROBES`]:
/// its private key never leaves it.
pub const EXPORT_ARG: &str = "lab_export";
/// What the lab node asks the control service with its own certificate and
/// key when [`EXPORT_ARG`] is on its command line, for the tests that check
/// what that certificate may do: `(method, path, body)`, where `{HOST}`
/// stands for the node's own host name and `{OTHER}` for [`PROBED_OTHER`].
/// The answer to the `i`-th goes out as `probe-<i>`: the body, a new line
/// and the HTTP status.
pub const NODE_PROBES: &[(&str, &str, Option<&str>)] = &[
    ("GET", "/api/v1/systems/{HOST}/", None),
    ("GET", "/api/v1/systems/{OTHER}/", None),
    ("GET", "/api/v1/systems/{OTHER}/config", None),
    ("GET", "/api/v1/systems/", None),
    ("GET", "/api/v1/nics/?system={OTHER}", None),
    ("GET", "/api/v1/jobservers/", None),
    (
        "POST",
        "/api/v1/boot/events",
        Some(r#"{"system":"{OTHER}","phase":"ready","detail":"forged by another node"}"#),
    ),
];
/// The other node [`NODE_PROBES`] try to reach.
pub const PROBED_OTHER: &str = "n02";
/// The Debian packages of the lab root, beyond mmdebstrap's minbase.
pub const DEBIAN_PACKAGES: &[&str] = &[
    "systemd-sysv",
    "linux-image-amd64",
    "udev",
    "kmod",
    "iproute2",
    // The lab node's own requests with its certificate (NODE_PROBES).
    "curl",
];
/// A node that boots the real root: 3 GiB (the incumbents hold the root in
/// RAM) and 2 CPUs, as the smallest real node has more than one core. TCG
/// runs a host thread per CPU, so on a 2-CPU host it takes both while it
/// works.
pub const DEBIAN_NODE: crate::vm::Size = crate::vm::Size {
    memory_mib: 3072,
    cpus: 2,
};

/// The unit that tells the lab the root is up, and the lab's export
/// ([`EXPORT_ARG`]); `@PROBES@` and `@VERSION_HEADER@` are filled in by
/// [`ready_script`].
const READY_SCRIPT: &str = r#"set -e
cat > /etc/systemd/system/mprov-lab-ready.service <<'EOF'
[Unit]
Description=mProv lab: multi-user reached
After=multi-user.target mprov-agent.service

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "MPROV-LAB-READY: $(hostname) multi-user after $(cut -d" " -f1 /proc/uptime) s of uptime" > /dev/ttyS0'
ExecStart=/bin/sh -c 'if grep -qw lab_export /proc/cmdline; then /usr/local/sbin/mprov-lab-export; fi'
ExecStart=/bin/sh -c 'if grep -qw mprov_lab_poweroff /proc/cmdline; then systemctl --no-block poweroff; fi'

[Install]
WantedBy=multi-user.target
EOF
# The lab only (lab_export on the kernel command line; /ipxe/ passes no
# mprov_* word of the layered arguments): the node's certificate, CA
# certificate, control URL and command line go out on the second serial
# port, which only the test reads, with the answers the control service
# gave the node's own requests made with its certificate. Its private key
# stays here: only its mode goes out.
mkdir -p /usr/local/sbin
cat > /usr/local/sbin/mprov-lab-export <<'EXPORT'
#!/bin/sh
stty -F /dev/ttyS1 raw -echo 2>/dev/null
m=/etc/mprov
url=$(cat $m/control-url 2>/dev/null)
url=${url%/}
host=$(hostname)
# probe INDEX METHOD PATH [BODY]: the body, a new line and the status.
probe() {
  if [ -n "$4" ]; then
    set -- "$1" "$2" "$3" -H 'content-type: application/json' --data-binary "$4"
  fi
  i=$1; method=$2; path=$3; shift 3
  out=$(curl -sS -m 30 --cacert $m/ca.crt --cert $m/node.crt --key $m/node.key \
    -X "$method" -H '@VERSION_HEADER@' -w '\n%{http_code}' "$@" "$url$path" 2>&1)
  echo "MPROV-LAB-EXPORT probe-$i $(printf '%s' "$out" | base64 -w0)"
}
{
  for f in node.crt ca.crt control-url; do
    echo "MPROV-LAB-EXPORT $f $(base64 -w0 $m/$f 2>/dev/null)"
  done
  echo "MPROV-LAB-EXPORT cmdline $(base64 -w0 /proc/cmdline)"
  echo "MPROV-LAB-EXPORT key-mode $(stat -c %a $m/node.key 2>/dev/null)"
  echo "MPROV-LAB-EXPORT hostname $host"
  # What the lab's post-boot scripts left (the agent's first run is over
  # before this unit starts: it is Type=notify).
  for f in /run/mprov-lab/*; do
    [ -f "$f" ] && echo "MPROV-LAB-EXPORT script-${f##*/} $(base64 -w0 "$f")"
  done
@PROBES@
  echo "MPROV-LAB-EXPORT end"
} > /dev/ttyS1
EXPORT
chmod 0755 /usr/local/sbin/mprov-lab-export
mkdir -p /etc/systemd/system/multi-user.target.wants
ln -sf ../mprov-lab-ready.service /etc/systemd/system/multi-user.target.wants/mprov-lab-ready.service
echo lab-node > /etc/hostname
# No login prompt on the serial console: nobody logs in, and its device
# wait costs a 90 s timeout when the root came from an initramfs.
ln -sf /dev/null /etc/systemd/system/serial-getty@ttyS0.service
"#;

/// [`READY_SCRIPT`] with one `probe` line per [`NODE_PROBES`] entry (each
/// argument in single quotes, `{HOST}` left to the shell's `$host`) and
/// this build's API version header.
fn ready_script() -> String {
    let quoted = |text: &str| format!("'{}'", text.replace('\'', r"'\''"));
    let probes: String = NODE_PROBES
        .iter()
        .enumerate()
        .map(|(i, (method, path, body))| {
            let path =
                quoted(&path.replace("{OTHER}", PROBED_OTHER)).replace("{HOST}", "'\"$host\"'");
            let body = body.map_or_else(String::new, |b| {
                format!(" {}", quoted(&b.replace("{OTHER}", PROBED_OTHER)))
            });
            format!("  probe {i} {method} {path}{body}\n")
        })
        .collect();
    READY_SCRIPT
        .replace("@PROBES@\n", &probes)
        .replace("@VERSION_HEADER@", &mprov_api::version_header_line())
}

/// Runs a command to completion; fails with its output if it fails.
pub(crate) fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a shell script to completion.
fn sh(script: &str) -> Result<String> {
    run(Command::new("sh").args(["-ec", script]))
}

/// The lab's binaries: `mprov-control`, `mprov-jobserver`, `mprov-image`,
/// `mash`, as `cargo build` or `cargo test --workspace` left them.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// The debug binaries of the target folder.
    pub fn debug() -> Binaries {
        Binaries {
            dir: target_dir().join("debug"),
        }
    }

    /// The binaries in `dir`.
    pub fn in_dir(dir: PathBuf) -> Binaries {
        Binaries { dir }
    }

    /// The path of `name`; fails with what builds it when it is missing.
    pub fn get(&self, name: &str) -> Result<PathBuf> {
        let path = self.dir.join(name);
        ensure!(
            path.is_file(),
            "{} is missing: `cargo build --workspace` (or `cargo test --workspace`) builds it",
            path.display()
        );
        Ok(path)
    }
}

/// The apt sources mmdebstrap bootstraps from: the machine's own.
fn apt_sources() -> Result<PathBuf> {
    for candidate in [
        "/etc/apt/sources.list.d/debian.sources",
        "/etc/apt/sources.list",
    ] {
        let path = Path::new(candidate);
        if path.is_file() && fs::metadata(path)?.len() > 0 {
            return Ok(path.to_path_buf());
        }
    }
    bail!(
        "no apt sources on this machine to bootstrap the Debian image from (/etc/apt/sources.list.d/debian.sources)"
    )
}

/// The machine's Debian release codename (`bookworm`).
fn codename() -> Result<String> {
    let text = fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|c| c.trim_matches('"').to_owned())
        .filter(|c| !c.is_empty())
        .context("/etc/os-release names no VERSION_CODENAME: the lab needs Debian")
}

/// The image-gen script that slims the root: files no lab boot uses
/// (the distro's own initrd, docs, translations, drivers for hardware a VM
/// lacks). Every way of booting gets the same root, so the comparison stays
/// fair.
const SLIM_SCRIPT: &str = r#"set -e
rm -f /boot/initrd.img-*
rm -rf /usr/share/doc/* /usr/share/man/* /usr/share/locale/* /usr/share/info/*
for m in /usr/lib/modules/*; do
  rm -rf "$m/kernel/drivers/gpu" "$m/kernel/drivers/media" "$m/kernel/drivers/infiniband" \
         "$m/kernel/drivers/staging" "$m/kernel/drivers/iio" "$m/kernel/sound" \
         "$m/kernel/drivers/net/wireless" "$m/kernel/net/wireless" "$m/kernel/net/mac80211"
  depmod -a "$(basename "$m")"
done
"#;

/// The mmdebstrap command of the lab root: minbase plus
/// [`DEBIAN_PACKAGES`], from the machine's own apt sources.
fn bootstrap_args() -> Result<Vec<String>> {
    Ok(vec![
        "--variant=minbase".to_owned(),
        format!("--include={}", DEBIAN_PACKAGES.join(",")),
        codename()?,
    ])
}

/// The recipe of the lab image, from the bootstrapped root in `root`.
pub fn debian_recipe(root: &Path) -> String {
    let indent = |script: &str| {
        script
            .lines()
            .map(|l| format!("      {l}\n"))
            .collect::<String>()
    };
    format!(
        "slug: {IMAGE_SLUG}\nsource:\n  dir: '{}'\nscripts:\n  - slug: lab-slim\n    content: |\n{}  - slug: lab-ready\n    content: |\n{}",
        root.display(),
        indent(SLIM_SCRIPT),
        indent(&ready_script()),
    )
}

/// A built image version of the lab.
#[derive(Debug, Clone)]
pub struct Image {
    /// The images folder (`<out>` of `mprov-image build`): `<slug>/<version>/`.
    pub images: PathBuf,
    /// The version's folder.
    pub dir: PathBuf,
    /// The image's slug.
    pub slug: String,
    /// Its version.
    pub version: i64,
    /// The root, unpacked (owners kept), for the incumbents' initrds.
    pub root: PathBuf,
    /// The kernel release of the image's own kernel.
    pub kernel_release: String,
}

impl Image {
    /// A file of the version.
    pub fn file(&self, file: mprov_api::boot::ImageFile) -> PathBuf {
        self.dir.join(file.file_name())
    }

    /// The sha256 of `rootfs.tar.zst`, lowercase hex.
    pub fn rootfs_sha256(&self) -> Result<String> {
        sha256_file(&self.file(mprov_api::boot::ImageFile::Rootfs))
    }
}

/// The lowercase hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut file, &mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// One build at a time inside this process; across processes a file lock.
static BUILD: Mutex<()> = Mutex::new(());

/// Removes the `<prefix>*` entries of `dir` other than `keep`.
fn remove_others(dir: &Path, prefix: &str, keep: &Path) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(prefix) && path != keep {
            if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            }
            .with_context(|| format!("removing the old {}", path.display()))?;
        }
    }
    Ok(())
}

/// The bootstrapped Debian root (mmdebstrap), unpacked with its owners,
/// cached by the command and the apt sources it used.
fn debian_root(cache: &Path) -> Result<PathBuf> {
    let args = bootstrap_args()?;
    let sources = apt_sources()?;
    let mut key = Sha256::new();
    key.update(args.join(" ").as_bytes());
    key.update(fs::read(&sources)?);
    let key = hex::encode(key.finalize());
    let home = cache.join(format!("bootstrap-{}", &key[..16]));
    let root = home.join("root");
    if home.join("done").is_file() {
        return Ok(root);
    }
    remove_others(cache, "bootstrap-", &home)?;
    if home.exists() {
        fs::remove_dir_all(&home)?;
    }
    fs::create_dir_all(&home)?;
    let tar = home.join("root.tar");
    eprintln!(
        "lab: bootstrapping a Debian root with mmdebstrap ({}), once; cached in {}",
        DEBIAN_PACKAGES.join(", "),
        home.display()
    );
    let started = Instant::now();
    run(Command::new("mmdebstrap")
        .args(&args)
        .arg(&tar)
        .arg(&sources))
    .context("mmdebstrap (install the Debian package mmdebstrap)")?;
    eprintln!("lab: bootstrapped in {:.0?}", started.elapsed());
    fs::create_dir_all(&root)?;
    run(Command::new("tar")
        .args(["--numeric-owner", "-xpf"])
        .arg(&tar)
        .arg("-C")
        .arg(&root))?;
    fs::remove_file(&tar)?;
    fs::write(home.join("done"), &key)?;
    Ok(root)
}

/// The lab image's image-gen scripts, as the inventory holds them: slug
/// and content, in the order they run.
pub fn debian_scripts() -> Vec<(&'static str, String)> {
    vec![
        ("lab-slim", SLIM_SCRIPT.to_owned()),
        ("lab-ready", ready_script()),
    ]
}

/// The lab's bootstrapped Debian root (mmdebstrap, cached under
/// `<target>/lab-cache/`), the root [`debian_image`] builds from: a job
/// server's image-update builds from it as a distro's prepared source.
pub fn debian_bootstrap() -> Result<PathBuf> {
    let _one = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let cache = target_dir().join("lab-cache");
    fs::create_dir_all(&cache)?;
    let lock = fs::File::create(cache.join("debian.lock"))?;
    lock.lock().context("locking the lab image cache")?;
    debian_root(&cache)
}

/// The lab's Debian image: a root bootstrapped with mmdebstrap (systemd,
/// the Debian kernel), built by `mprov-image build --recipe` with the lab's
/// image-gen scripts and `agent` installed; cached under
/// `<target>/lab-cache/` by content (the bootstrap by its command and apt
/// sources, the image by the recipe, the agent and the `mprov-image` binary).
pub fn debian_image(bins: &Binaries, agent: &Path) -> Result<Image> {
    let _one = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let cache = target_dir().join("lab-cache");
    fs::create_dir_all(&cache)?;
    let lock = fs::File::create(cache.join("debian.lock"))?;
    lock.lock().context("locking the lab image cache")?;
    let bootstrapped = debian_root(&cache)?;
    let recipe = debian_recipe(&bootstrapped);
    let tool = bins.get("mprov-image")?;
    let mut key = Sha256::new();
    key.update(recipe.as_bytes());
    key.update(fs::read(agent).with_context(|| format!("reading {}", agent.display()))?);
    key.update(fs::read(&tool)?);
    let key = hex::encode(key.finalize());
    let home = cache.join(format!("debian-{}", &key[..16]));
    let images = home.join("export").join(mprov_api::boot::IMAGES_DIR);
    let dir = images.join(IMAGE_SLUG).join(IMAGE_VERSION.to_string());
    let root = home.join("root");
    let done = home.join("done");
    if !done.is_file() {
        // Older builds go: each is a few hundred MB.
        remove_others(&cache, "debian-", &home)?;
        if home.exists() {
            fs::remove_dir_all(&home)?;
        }
        fs::create_dir_all(&images)?;
        let recipe_file = home.join("recipe.yaml");
        fs::write(&recipe_file, &recipe)?;
        eprintln!(
            "lab: building the Debian image with mprov-image; cached in {}",
            home.display()
        );
        let started = Instant::now();
        run(Command::new(&tool)
            .args(["build", "--quiet", "--recipe"])
            .arg(&recipe_file)
            .arg("--out")
            .arg(&images)
            .args(["--version", &IMAGE_VERSION.to_string()])
            .arg("--agent")
            .arg(agent))
        .context("mprov-image build of the lab's Debian image")?;
        eprintln!("lab: image built in {:.0?}", started.elapsed());
        fs::create_dir_all(&root)?;
        run(Command::new("tar")
            .args(["--zstd", "--numeric-owner", "-xpf"])
            .arg(dir.join("rootfs.tar.zst"))
            .arg("-C")
            .arg(&root))
        .context("unpacking the lab image for the incumbents")?;
        fs::write(&done, &key)?;
    }
    ensure_initramfs(bins, agent, &dir, &root.join("usr/lib/modules"))?;
    let modules = root.join("usr/lib/modules");
    let kernel_release = fs::read_dir(&modules)
        .with_context(|| format!("listing {}", modules.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .max()
        .context("the lab image has no kernel modules")?;
    Ok(Image {
        images,
        dir,
        slug: IMAGE_SLUG.to_owned(),
        version: IMAGE_VERSION,
        root,
        kernel_release,
    })
}

/// Until `mprov-image build` writes the image's `initramfs.img` itself,
/// the lab builds it the same way with `mprov-initramfs` (the agent as
/// `/init`, the NIC modules of the image's kernel from `modules`, its
/// `lib/modules` folder), so the chain can go on; it is then missing from
/// the manifest, and a message says so.
fn ensure_initramfs(bins: &Binaries, agent: &Path, dir: &Path, modules: &Path) -> Result<()> {
    let out = dir.join(mprov_api::boot::ImageFile::Initramfs.file_name());
    if out.is_file() {
        return Ok(());
    }
    let release = fs::read_dir(modules)
        .with_context(|| format!("listing {}", modules.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .max()
        .context("the image has no kernel modules")?;
    eprintln!(
        "lab: mprov-image wrote no {}; building it with mprov-initramfs (not in the manifest)",
        out.display()
    );
    run(Command::new(bins.get("mprov-initramfs")?)
        .arg("--init")
        .arg(agent)
        .arg("--kernel-modules")
        .arg(modules.join(&release))
        .args(["--module", "e1000", "--module", "virtio_net"])
        .args(["--extra", "virtio_net=virtio_pci"])
        .arg("-o")
        .arg(&out))
    .context("building the image's agent initramfs with mprov-initramfs")?;
    Ok(())
}

/// The image's NIC modules, in load order, as a [`crate::vm::Kernel`] for
/// [`crate::vm::busybox_initramfs`].
pub fn image_kernel(image: &Image) -> Result<crate::vm::Kernel> {
    let moddir = image
        .root
        .join("usr/lib/modules")
        .join(&image.kernel_release);
    let modules: Vec<PathBuf> = crate::vm::LAB_MODULES
        .iter()
        .map(|m| moddir.join(m))
        .collect();
    for m in &modules {
        ensure!(m.is_file(), "{} is missing from the image", m.display());
    }
    Ok(crate::vm::Kernel {
        vmlinuz: image.file(mprov_api::boot::ImageFile::Kernel),
        release: image.kernel_release.clone(),
        modules,
    })
}

/// The first incumbent: the whole root as one zstd cpio initrd that the
/// kernel unpacks into its rootfs, `/init` being systemd (cached beside the
/// image).
pub fn cpio_initrd(image: &Image) -> Result<PathBuf> {
    let _one = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let out = image
        .root
        .parent()
        .context("image root")?
        .join("root.cpio.zst");
    if out.is_file() {
        return Ok(out);
    }
    let init = image.root.join("init");
    if fs::symlink_metadata(&init).is_err() {
        std::os::unix::fs::symlink("/sbin/init", &init)?;
    }
    let partial = out.with_extension("partial");
    sh(&format!(
        "cd '{}' && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet | zstd -q -T0 -3 > '{}'",
        image.root.display(),
        partial.display()
    ))
    .context("packing the root as one cpio initrd")?;
    fs::rename(&partial, &out)?;
    Ok(out)
}

/// The second incumbent: a busybox initramfs (plus Debian's zstd and its
/// libraries) whose `/init` loads the NIC modules, takes a lease with
/// udhcpc, streams `lab_root=<URL>` with `wget -O- | zstd -d | tar x` into a
/// tmpfs and switches root to the image's systemd.
pub fn busybox_stream_initrd(image: &Image, out: &Path) -> Result<()> {
    let kernel = image_kernel(image)?;
    let init = r#"#!/bin/sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
echo "LAB-STREAM: init started"
for m in $(cat /lib/modules/order); do insmod /lib/modules/$m 2>/dev/null; done
url=$(sed -n 's/.*lab_root=\([^ ]*\).*/\1/p' /proc/cmdline)
for i in $(ls /sys/class/net); do [ "$i" = lo ] || ip link set "$i" up; done
i=0; while ! grep -qs 1 /sys/class/net/eth0/carrier && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
udhcpc -i eth0 -s /etc/udhcpc.script -n -q -t 10 -T 2 || { echo "LAB-STREAM: no lease"; poweroff -f; }
mkdir -p /newroot
mount -t tmpfs -o size=90% tmpfs /newroot
echo "LAB-STREAM: streaming $url"
if wget -q -O - "$url" | /lib/zstd/zstd -dc | tar -x -C /newroot; then
  echo "LAB-STREAM: unpacked, switching root"
  umount /proc /sys
  mount --move /dev /newroot/dev 2>/dev/null || umount /dev
  exec switch_root /newroot /sbin/init
fi
echo "LAB-STREAM: the stream failed"
poweroff -f
"#;
    let stage = tempfile::tempdir()?;
    let plain = stage.path().join("base.gz");
    crate::vm::busybox_initramfs(&kernel, init, &plain)?;
    // zstd is not a busybox applet: add Debian's, with its libraries, as a
    // second cpio member (the kernel unpacks concatenated archives).
    let extra = stage.path().join("extra");
    let libs = sh("ldd /usr/bin/zstd | awk '/=>/ {print $3} /ld-linux/ {print $1}'")?;
    let zdir = extra.join("lib/zstd");
    fs::create_dir_all(&zdir)?;
    fs::copy("/usr/bin/zstd", zdir.join("zstd")).context("zstd is missing: install zstd")?;
    for lib in libs.lines().map(str::trim).filter(|l| l.starts_with('/')) {
        let dest = extra.join(lib.trim_start_matches('/'));
        fs::create_dir_all(dest.parent().context("lib path")?)?;
        fs::copy(lib, &dest).with_context(|| format!("copying {lib}"))?;
        // Debian's loader path is /lib64/ld-linux-x86-64.so.2 and libs in
        // /lib/x86_64-linux-gnu; both come along as ldd names them.
    }
    sh(&format!(
        "cd '{}' && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --owner=0:0 --quiet | gzip -1 > '{}'",
        extra.display(),
        stage.path().join("extra.gz").display()
    ))?;
    let mut bytes = fs::read(&plain)?;
    bytes.extend(fs::read(stage.path().join("extra.gz"))?);
    fs::write(out, bytes)?;
    Ok(())
}

/// Hard-links (or copies, across file systems) `from` to `to`.
pub fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent)?;
    }
    if fs::hard_link(from, to).is_err() {
        fs::copy(from, to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    Ok(())
}

/// Puts the image's version into an export folder (`<export>/images/...`).
pub fn export_image(image: &Image, export: &Path) -> Result<PathBuf> {
    let dir = export
        .join(mprov_api::boot::IMAGES_DIR)
        .join(&image.slug)
        .join(image.version.to_string());
    fs::create_dir_all(&dir)?;
    for entry in fs::read_dir(&image.dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            link_or_copy(&entry.path(), &dir.join(entry.file_name()))?;
        }
    }
    Ok(dir)
}

static TAPS: AtomicU32 = AtomicU32::new(0);

/// The lab network: a namespace with the bridge, deleted on drop.
#[derive(Debug)]
pub struct LabNet {
    /// The namespace.
    pub ns: Netns,
}

impl LabNet {
    /// A namespace `<prefix>-<unique>` with `br0` at [`SERVER_IP`]/24 and
    /// `fd99::1/64` (so router advertisements carry a prefix).
    pub fn new(prefix: &str) -> Result<LabNet> {
        let ns = Netns::new(prefix)?;
        ns.add_bridge("br0")?;
        ns.add_addr("br0", &format!("{SERVER_IP}/{LAB_PREFIX}"))?;
        ns.ip(&["addr", "add", "fd99::1/64", "dev", "br0", "nodad"])?;
        ns.up("br0")?;
        // The root namespace may have bridge netfilter on; not in ours.
        let _ = ns.exec(
            "sh",
            &[
                "-c",
                "echo 0 > /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || true",
            ],
        );
        Ok(LabNet { ns })
    }

    /// Adds an address to the bridge (e.g. [`SECOND_SERVER_IP`]).
    pub fn add_server_ip(&self, ip: &str) -> Result<()> {
        self.ns.add_addr("br0", &format!("{ip}/{LAB_PREFIX}"))
    }

    /// A new tap device on the bridge, for one VM.
    pub fn tap(&self) -> Result<String> {
        self.tap_on("br0")
    }

    /// A new tap device on `bridge` (see [`LabNet::add_network`]).
    pub fn tap_on(&self, bridge: &str) -> Result<String> {
        let tap = format!("tap{}", TAPS.fetch_add(1, Ordering::Relaxed));
        self.ns.ip(&["tuntap", "add", "dev", &tap, "mode", "tap"])?;
        self.ns.ip(&["link", "set", &tap, "master", bridge])?;
        self.ns.up(&tap)?;
        Ok(tap)
    }

    /// A second lab network in the same namespace: `bridge` with the
    /// namespace's address `cidr` on it. A node there reaches the control
    /// service on [`SERVER_IP`] through that address as its gateway.
    pub fn add_network(&self, bridge: &str, cidr: &str) -> Result<()> {
        self.ns.add_bridge(bridge)?;
        self.ns.add_addr(bridge, cidr)?;
        self.ns.up(bridge)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        self.ns.name()
    }

    /// A client on the bridge: a namespace of its own joined to `br0` by a
    /// veth pair, its end with `mac`, no address until [`LabClient::dhcp`].
    pub fn client(&self, mac: &str) -> Result<LabClient> {
        self.client_on(mac, "br0")
    }

    /// A client on `bridge` (see [`LabNet::client`]).
    pub fn client_on(&self, mac: &str, bridge: &str) -> Result<LabClient> {
        let ns = Netns::new("labcl")?;
        let pair = crate::netns::veth(&self.ns, &ns)?;
        self.ns.ip(&["link", "set", &pair.a, "master", bridge])?;
        ns.set_mac(&pair.b, mac)?;
        Ok(LabClient { ns, dev: pair.b })
    }
}

/// A client namespace on the lab bridge (see [`LabNet::client`]).
#[derive(Debug)]
pub struct LabClient {
    /// Its namespace.
    pub ns: Netns,
    /// Its interface on the bridge.
    pub dev: String,
}

impl LabClient {
    /// Takes a lease with busybox udhcpc (which sets the address and
    /// route); the address leased.
    pub fn dhcp(&self) -> Result<String> {
        let dir = tempfile::tempdir()?;
        let script = dir.path().join("udhcpc.sh");
        fs::write(
            &script,
            "#!/bin/sh
case \"$1\" in bound|renew)
  ip addr add \"$ip/$mask\" dev \"$interface\"
  [ -n \"$router\" ] && ip route add default via \"${router%% *}\" dev \"$interface\"
  echo \"LEASE $ip\";;
esac
exit 0
",
        )?;
        run(Command::new("chmod").arg("0755").arg(&script))?;
        let out = run(self
            .ns
            .command("busybox")
            .args([
                "udhcpc", "-i", &self.dev, "-n", "-q", "-f", "-t", "10", "-T", "2", "-s",
            ])
            .arg(&script))
        .context("busybox udhcpc on the lab bridge (install busybox-static)")?;
        out.lines()
            .find_map(|l| l.strip_prefix("LEASE "))
            .map(|ip| ip.trim().to_owned())
            .with_context(|| format!("udhcpc got no lease: {out}"))
    }
}

/// How a job server learns its boot config.
#[derive(Debug, Clone)]
pub enum BootConfigSource {
    /// A fixed snapshot file (standalone).
    File(PathBuf),
    /// The control service, enrolling with a one-time token over HTTPS.
    Control {
        /// The control service's HTTPS URL.
        url: String,
        /// Its CA certificate.
        ca: PathBuf,
        /// The one-time enrollment token.
        token: String,
        /// The job server's name.
        name: String,
        /// Register itself on its one address and report its load there
        /// (the heartbeat). Off, it neither registers nor heartbeats: its
        /// row is the one the test made, every such job server keeps load 0
        /// and `/ipxe/` orders them by name, what tests that need js1 first
        /// (a corrupted or killed first source) rely on.
        heartbeat: bool,
    },
}

/// What a lab job server serves.
#[derive(Debug, Clone)]
pub struct JobServerSpec {
    /// Its boot config.
    pub config: BootConfigSource,
    /// Its address on the bridge.
    pub ip: String,
    /// Serve DHCP (and router advertisements) on the bridge.
    pub dhcp: bool,
    /// The bridge it serves DHCP on (`br0` unless a test adds a network).
    pub bridge: &'static str,
    /// More arguments (modules, addresses, ...).
    pub args: Vec<String>,
    /// Its export folder.
    pub export: PathBuf,
    /// A folder for its state and log.
    pub home: PathBuf,
    /// Its metrics port on the namespace's loopback (unique per job server).
    pub metrics_port: u16,
    /// Its open-file limit, soft and hard (`prlimit --nofile`); `None`:
    /// the test's own.
    pub file_limit: Option<u64>,
}

/// `exe` run inside `net`, under `file_limit` open files (soft and hard,
/// with `prlimit`, which execs it in place: the child's PID is the
/// server's) when given.
fn server_command(net: &LabNet, exe: &Path, file_limit: Option<u64>) -> Result<Command> {
    let exe = exe.to_str().context("path")?;
    Ok(match file_limit {
        Some(files) => {
            let mut cmd = net.ns.command("prlimit");
            cmd.arg(format!("--nofile={files}:{files}")).arg(exe);
            cmd
        }
        None => net.ns.command(exe),
    })
}

/// What a job server following a control service reads and writes: the
/// files behind `--ca-file`, `--apikey-file` and `--enroll-token-file` (an
/// absent one is fine) and its `--state-dir`.
#[derive(Debug, Clone, Copy)]
pub struct FollowerFiles<'a> {
    /// The control service's CA certificate.
    pub ca: &'a Path,
    /// An API key file (`export MPROV_APIKEY=...`).
    pub apikey: &'a Path,
    /// A one-time enrollment token file.
    pub enroll_token: &'a Path,
    /// Its state folder (its own certificate and key).
    pub state: &'a Path,
}

/// `mprov-jobserver` (the binary `exe`) as job server `js1` following the
/// control service at `url`, outside any namespace: environment cleared,
/// `files` as its credentials and state, standard output dropped, its log
/// (at `info`) in `log`. The caller adds the servers it runs and spawns it.
pub fn follower_command(
    exe: &Path,
    url: &str,
    files: FollowerFiles<'_>,
    log: &Path,
) -> Result<Command> {
    let mut cmd = Command::new(exe);
    cmd.env_clear()
        .args(["--control-url", url, "--name", "js1"])
        .arg("--ca-file")
        .arg(files.ca)
        .arg("--apikey-file")
        .arg(files.apikey)
        .arg("--enroll-token-file")
        .arg(files.enroll_token)
        .arg("--state-dir")
        .arg(files.state)
        .arg("--host-id")
        .arg(host_id(files.state))
        .args(["--log", "info"])
        // Once enrolled, its HTTPS image listener on a port of its own.
        .args(["--https", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(log).with_context(|| format!("creating {}", log.display()))?);
    Ok(cmd)
}

/// A test job server's host id, from its own folder: unique per job
/// server, and never kept in the host's `/etc/mprov`.
pub fn host_id(home: &Path) -> String {
    hex::encode(&Sha256::digest(home.as_os_str().as_encoded_bytes())[..16])
}

/// A running `mprov-jobserver` in the lab.
#[derive(Debug)]
pub struct JobServer {
    process: Mutex<Option<Process>>,
    log: PathBuf,
    /// Its PID.
    pub pid: u32,
}

impl JobServer {
    /// Starts it inside `net`.
    pub fn start(net: &LabNet, bins: &Binaries, spec: &JobServerSpec) -> Result<JobServer> {
        fs::create_dir_all(&spec.home)?;
        let log = spec.home.join("jobserver.log");
        let exe = bins.get("mprov-jobserver")?;
        let mut cmd = server_command(net, &exe, spec.file_limit)?;
        match &spec.config {
            BootConfigSource::File(file) => {
                cmd.arg("--boot-config").arg(file);
            }
            BootConfigSource::Control {
                url,
                ca,
                token,
                name,
                heartbeat,
            } => {
                if *heartbeat {
                    // Registered on its one lab address (not every address
                    // of the shared namespace), heartbeating there.
                    cmd.args(["--address", &spec.ip]);
                } else {
                    // Silent: the row made by hand, never registered (a
                    // registered address that never heartbeats is skipped).
                    cmd.args(["--heartbeat", "0", "--no-register"]);
                }
                cmd.args(["--control-url", url, "--ca-file"])
                    .arg(ca)
                    .args(["--name", name])
                    .env("MPROV_ENROLL_TOKEN", token)
                    .arg("--apikey-file")
                    .arg(spec.home.join("no-apikey"))
                    .arg("--enroll-token-file")
                    .arg(spec.home.join("no-token"));
            }
        }
        cmd.args(["--server-ip", &spec.ip]);
        if spec.dhcp {
            cmd.args(["--dhcp", "0.0.0.0:67", "--dhcp-interface", spec.bridge]);
            cmd.args(["--tftp", &format!("{}:69", spec.ip)]);
        } else {
            cmd.args(["--no-dhcp", "--no-tftp", "--no-ra"]);
        }
        let listen_file = spec.home.join("listen.json");
        let _ = fs::remove_file(&listen_file);
        cmd.args(["--no-dns", "--http", &format!("{}:8081", spec.ip)])
            // Each on its own address; job servers copy images from each
            // other on this port.
            .args(["--https", &format!("{}:8444", spec.ip)])
            .args(["--metrics", &format!("127.0.0.1:{}", spec.metrics_port)])
            .arg("--export")
            .arg(&spec.export)
            .arg("--state-dir")
            .arg(spec.home.join("state"))
            .arg("--host-id")
            .arg(host_id(&spec.home))
            .arg("--listen-file")
            .arg(&listen_file)
            .args(&spec.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?);
        let child = cmd.spawn().context("starting mprov-jobserver")?;
        let pid = child.id();
        let mut process = Process::new("mprov-jobserver", child, Duration::from_secs(10));
        // Up once every server is bound (after enrolling, when following).
        crate::listen::wait_until(&listen_file, crate::listen::LISTEN_WAIT, || {
            process.try_wait()
        })
        .with_context(|| fs::read_to_string(&log).unwrap_or_default())?;
        Ok(JobServer {
            process: Mutex::new(Some(process)),
            log,
            pid,
        })
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills it at once (SIGKILL), as a crash would.
    pub fn kill(&self) -> Result<()> {
        if let Some(process) = self.take_process() {
            process.kill()?;
        }
        Ok(())
    }

    /// Stops it with SIGTERM.
    pub fn stop(self) -> Result<()> {
        if let Some(process) = self.take_process() {
            process.stop()?;
        }
        Ok(())
    }

    /// The process, taken out (once) to be ended.
    fn take_process(&self) -> Option<Process> {
        self.process
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// A running `mprov-control serve` inside the lab namespace, on
/// [`SERVER_IP`] ([`CONTROL_PORT`] HTTP, [`CONTROL_HTTPS_PORT`] HTTPS).
#[derive(Debug)]
pub struct LabControl {
    process: Option<Process>,
    ns: String,
    /// Its folder (`etc/`, `var/`, `serve.log`).
    pub home: PathBuf,
    /// The admin's password, from the file first start wrote.
    pub password: String,
}

impl LabControl {
    /// Starts it inside `net` with its folders under `home`, under
    /// `file_limit` open files (soft and hard) when given.
    pub fn start(
        net: &LabNet,
        bins: &Binaries,
        home: &Path,
        file_limit: Option<u64>,
    ) -> Result<LabControl> {
        Self::start_with(net, bins, home, file_limit, &[])
    }

    /// [`LabControl::start`] with more settings in its environment.
    pub fn start_with(
        net: &LabNet,
        bins: &Binaries,
        home: &Path,
        file_limit: Option<u64>,
        env: &[(&str, &str)],
    ) -> Result<LabControl> {
        fs::create_dir_all(home)?;
        let exe = bins.get("mprov-control")?;
        let log = home.join("serve.log");
        let mut cmd = server_command(net, &exe, file_limit)?;
        cmd.arg("serve")
            .env("MPROV_CONFIG_DIR", home.join("etc"))
            .env("MPROV_STATE_DIR", home.join("var"))
            .env("MPROV_LISTEN", format!("{SERVER_IP}:{CONTROL_PORT}"))
            .env(
                "MPROV_HTTPS_LISTEN",
                format!("{SERVER_IP}:{CONTROL_HTTPS_PORT}"),
            )
            .env(
                "MPROV_PUBLIC_URL",
                format!("http://{SERVER_IP}:{CONTROL_PORT}"),
            )
            .env("MPROV_MPCC_IPs", SERVER_IP)
            .env("ALLOWED_HOSTS", SERVER_IP)
            .env_remove("MPROV_SUPERUSER_PASSWORD")
            .env_remove("MPROV_SKIP_VERSION_CHECK")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?);
        let child = cmd.spawn().context("starting mprov-control")?;
        let mut control = LabControl {
            process: Some(Process::new(
                "mprov-control",
                child,
                Duration::from_secs(20),
            )),
            ns: net.name().to_owned(),
            home: home.to_owned(),
            password: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(process) = control.process.as_mut()
                && let Some(status) = process.try_wait()?
            {
                bail!("mprov-control exited with {status}:\n{}", control.log());
            }
            // First start writes the admin's random password, then serves.
            let file = home.join("etc").join("superuser_password");
            if let Ok(password) = fs::read_to_string(&file) {
                control.password = password.trim().to_owned();
                if control.api("GET", "/api/v1/", None).is_ok() {
                    return Ok(control);
                }
            }
            ensure!(
                Instant::now() < deadline,
                "mprov-control's API did not answer within 90 s:\n{}",
                control.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.home.join("serve.log")).unwrap_or_default()
    }

    /// Its process id, while it runs (its signing helper is a child of it).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(Process::id)
    }

    /// The HTTP base URL.
    pub fn url(&self) -> String {
        format!("http://{SERVER_IP}:{CONTROL_PORT}")
    }

    /// The HTTPS base URL.
    pub fn https_url(&self) -> String {
        format!("https://{SERVER_IP}:{CONTROL_HTTPS_PORT}")
    }

    /// The CA certificate's file.
    pub fn ca(&self) -> PathBuf {
        self.home.join("var/tls/ca.crt")
    }

    /// One API call as the admin, with curl inside the namespace; the JSON
    /// reply (`null` for an empty body). Fails on a status >= 400.
    pub fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, "curl", "-sS", "-m", "30"])
            .args(["-X", method, "-u", &format!("admin:{}", self.password)])
            .args(["-H", &mprov_api::version_header_line()])
            .args(["-H", "content-type: application/json"])
            .args(["-w", "\n%{http_code}"]);
        if let Some(body) = body {
            cmd.args(["--data-binary", &body.to_string()]);
        }
        cmd.arg(format!("{}{path}", self.url()));
        let out = run(&mut cmd)?;
        let (text, code) = out.rsplit_once('\n').context("curl's status line")?;
        let code: u16 = code.trim().parse().context("curl's status code")?;
        if code >= 500 {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            bail!(
                "{method} {path}: HTTP {code}: {text}\ncontrol log:\n{}",
                lines[lines.len().saturating_sub(15)..].join("\n")
            );
        }
        ensure!(code < 400, "{method} {path}: HTTP {code}: {text}");
        if text.trim().is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_str(text).with_context(|| format!("{method} {path}: not JSON: {text}"))
    }

    /// `mash ARGS` as the admin, inside the namespace; what it printed.
    /// Fails if it exits non-zero.
    pub fn mash(&self, bins: &Binaries, args: &[&str]) -> Result<String> {
        run(Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(bins.get("mash")?)
            .args(args)
            .env("MPROV_URL", self.url())
            .env("MPROV_USER", "admin")
            .env("MPROV_PASSWORD", &self.password))
        .with_context(|| format!("mash {}", args.join(" ")))
    }

    /// A one-time job-server enrollment token (`mprov-control enroll-token`).
    pub fn enroll_token(&self, bins: &Binaries, name: &str) -> Result<String> {
        let out = run(Command::new(bins.get("mprov-control")?)
            .args(["enroll-token", "--name", name])
            .env("MPROV_CONFIG_DIR", self.home.join("etc"))
            .env("MPROV_STATE_DIR", self.home.join("var")))?;
        let token = out
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .context("mprov-control enroll-token printed nothing")?;
        Ok(token.to_owned())
    }

    /// Stops it with SIGTERM.
    pub fn stop(mut self) -> Result<()> {
        if let Some(process) = self.process.take() {
            process.stop()?;
        }
        Ok(())
    }

    /// Stops it with SIGTERM and starts it again on the same folders (its
    /// database, CA and password), as an upgrade or a host restart does.
    pub fn restart(
        &mut self,
        net: &LabNet,
        bins: &Binaries,
        file_limit: Option<u64>,
    ) -> Result<()> {
        if let Some(process) = self.process.take() {
            process.stop()?;
        }
        *self = LabControl::start(net, bins, &self.home.clone(), file_limit)?;
        Ok(())
    }
}

/// Writes a file and makes it world-readable.
pub fn write_file(path: &Path, content: impl AsRef<[u8]>) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    let mut file = fs::File::create(path)?;
    file.write_all(content.as_ref())?;
    Ok(())
}

/// The smoke test's image: a busybox root (static busybox, the lab kernel's
/// NIC modules, the agent) whose `/sbin/init` runs `mprov-agent ready`,
/// prints [`READY_MARKER`] and powers off. Built with `mprov-image build
/// --root` into `out` (the fastest boot of our stack: a few MB to stream).
pub fn busybox_image(bins: &Binaries, agent: &Path, out: &Path) -> Result<Image> {
    let kernel = crate::vm::lab_kernel(&target_dir().join("lab-cache"))?;
    let stage = tempfile::tempdir()?;
    let root = stage.path().join("root");
    for d in [
        "bin", "sbin", "dev", "proc", "sys", "tmp", "etc", "run", "var",
    ] {
        fs::create_dir_all(root.join(d))?;
    }
    fs::copy("/bin/busybox", root.join("bin/busybox"))
        .context("busybox is missing: install busybox-static")?;
    std::os::unix::fs::symlink("busybox", root.join("bin/sh"))?;
    let package = target_dir().join("lab-cache").join(&kernel.release);
    for module in &kernel.modules {
        let rel = module.strip_prefix(&package).context("module path")?;
        let dest = root.join(rel);
        fs::create_dir_all(dest.parent().context("module folder")?)?;
        fs::copy(module, &dest)?;
    }
    let init = format!(
        "#!/bin/sh\n/bin/busybox --install -s /bin\nmount -t proc proc /proc 2>/dev/null\nmount -t sysfs sys /sys 2>/dev/null\nmount -t devtmpfs dev /dev 2>/dev/null\necho \"LAB-SMOKE: busybox root up\"\nif /usr/libexec/mprov/mprov-agent ready; then\n  echo \"{READY_MARKER}: busybox root, ready reported\"\nelse\n  echo \"LAB-SMOKE: mprov-agent ready failed\"\nfi\nsync\npoweroff -f\n"
    );
    fs::write(root.join("sbin/init"), init)?;
    run(Command::new("chmod")
        .arg("0755")
        .arg(root.join("sbin/init")))?;
    fs::write(root.join("etc/hostname"), "smoke\n")?;
    fs::create_dir_all(out)?;
    run(Command::new(bins.get("mprov-image")?)
        .args([
            "build",
            "--quiet",
            "--slug",
            "smoke",
            "--version",
            "1",
            "--root",
        ])
        .arg(&root)
        .arg("--kernel")
        .arg(&kernel.vmlinuz)
        .arg("--agent")
        .arg(agent)
        .arg("--out")
        .arg(out))
    .context("mprov-image build of the busybox smoke image")?;
    let dir = out.join("smoke").join("1");
    ensure_initramfs(bins, agent, &dir, &root.join("lib/modules"))?;
    Ok(Image {
        images: out.to_owned(),
        dir,
        slug: "smoke".to_owned(),
        version: 1,
        root,
        kernel_release: kernel.release,
    })
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::{NODE_PROBES, PROBED_OTHER, ready_script};
    use crate::vm::parse_export;

    /// The export script the lab root carries, cut out of its recipe, run
    /// with its identity folder and serial port moved into `dir`.
    fn run_export(dir: &std::path::Path) -> String {
        let script = ready_script();
        let start = script.find("#!/bin/sh\n").unwrap();
        let end = script[start..].find("\nEXPORT\n").unwrap() + start;
        let body = script[start..end]
            .replace("m=/etc/mprov", &format!("m={}/mprov", dir.display()))
            .replace("/dev/ttyS1", &format!("{}/ttyS1", dir.display()));
        let file = dir.join("export.sh");
        std::fs::write(&file, body).unwrap();
        let status = Command::new("sh")
            .arg(&file)
            .stdin(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::read_to_string(dir.join("ttyS1")).unwrap()
    }

    #[test]
    fn the_lab_export_carries_the_certificate_and_the_probes_never_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join("mprov");
        std::fs::create_dir_all(&m).unwrap();
        std::fs::write(m.join("node.crt"), "CERTIFICATE n01\n").unwrap();
        std::fs::write(m.join("ca.crt"), "CA\n").unwrap();
        std::fs::write(m.join("node.key"), "PRIVATE KEY OF n01\n").unwrap();
        // Nobody listens there: each probe's answer is curl's failure.
        std::fs::write(m.join("control-url"), "https://127.0.0.1:1/\n").unwrap();
        let text = run_export(dir.path());
        let export = parse_export(&text).unwrap().expect("the end line");
        assert_eq!(export["node.crt"], b"CERTIFICATE n01\n");
        assert_eq!(export["ca.crt"], b"CA\n");
        for (name, value) in &export {
            assert!(
                !String::from_utf8_lossy(value).contains("PRIVATE KEY"),
                "{name} carries the key"
            );
        }
        assert!(!text.contains("node.key "), "{text}");
        for i in 0..NODE_PROBES.len() {
            let answer = String::from_utf8_lossy(&export[&format!("probe-{i}")]).into_owned();
            assert!(answer.ends_with("\n000"), "probe {i}: {answer}");
        }
        // The test reads the file while the guest writes it: a prefix cut
        // anywhere (mid-line included) is "not yet", never an error.
        for cut in (0..text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(parse_export(&text[..cut]).unwrap(), None, "cut at {cut}");
        }
        let script = ready_script();
        assert!(script.contains(&format!("'/api/v1/systems/{PROBED_OTHER}/'")));
        assert!(script.contains("'/api/v1/systems/'\"$host\"'/'"));
        assert!(script.contains(&mprov_api::version_header_line()));
    }
}
