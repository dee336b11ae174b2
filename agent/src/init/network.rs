//! The network interfaces the kernel has, read from sysfs.
//!
//! With no udev in the initramfs, names are the kernel's (`eth0`, `eth1`, in
//! probe order), so the agent will pick its NIC by MAC address, never by name.

use std::fmt;
use std::path::Path;

/// Where the kernel lists its interfaces.
const SYS_CLASS_NET: &str = "/sys/class/net";

/// One interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// The kernel's name, e.g. `eth0`.
    pub name: String,
    /// Its MAC address as sysfs writes it (lowercase, `:`-separated).
    pub mac: String,
    /// The driver bound to its device, e.g. `e1000` or `virtio_net`.
    pub driver: Option<String>,
}

impl fmt::Display for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} mac {}", self.name, self.mac)?;
        if let Some(driver) = &self.driver {
            write!(f, " driver {driver}")?;
        }
        Ok(())
    }
}

/// The interfaces except loopback, sorted by name.
pub fn interfaces() -> std::io::Result<Vec<Interface>> {
    interfaces_in(Path::new(SYS_CLASS_NET))
}

/// [`interfaces`] from another sysfs folder (tests).
pub fn interfaces_in(dir: &Path) -> std::io::Result<Vec<Interface>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "lo" {
            continue;
        }
        let path = entry.path();
        let mac = std::fs::read_to_string(path.join("address"))
            .map(|m| m.trim().to_owned())
            .unwrap_or_else(|err| format!("unknown ({err})"));
        let driver = std::fs::read_link(path.join("device/driver"))
            .ok()
            .and_then(|link| Some(link.file_name()?.to_string_lossy().into_owned()));
        found.push(Interface { name, mac, driver });
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn reads_name_mac_and_driver() {
        let sys = tempfile::tempdir().expect("tempdir");
        let net = sys.path().join("class/net");
        let driver = sys.path().join("bus/pci/drivers/e1000");
        std::fs::create_dir_all(&driver).expect("mkdir");
        for (name, mac) in [
            ("lo", "00:00:00:00:00:00"),
            ("eth1", "52:54:00:00:00:02"),
            ("eth0", "52:54:00:00:00:01"),
        ] {
            std::fs::create_dir_all(net.join(name)).expect("mkdir");
            std::fs::write(net.join(name).join("address"), format!("{mac}\n")).expect("write");
        }
        std::fs::create_dir_all(net.join("eth0/device")).expect("mkdir");
        symlink(&driver, net.join("eth0/device/driver")).expect("symlink");
        let found = interfaces_in(&net).expect("read");
        assert_eq!(
            found,
            [
                Interface {
                    name: "eth0".to_owned(),
                    mac: "52:54:00:00:00:01".to_owned(),
                    driver: Some("e1000".to_owned()),
                },
                Interface {
                    name: "eth1".to_owned(),
                    mac: "52:54:00:00:00:02".to_owned(),
                    driver: None,
                },
            ]
        );
        assert_eq!(
            found[0].to_string(),
            "eth0 mac 52:54:00:00:00:01 driver e1000"
        );
        assert!(interfaces_in(&sys.path().join("missing")).is_err());
    }
}
