//! One record per node download, and the log line an operator reads.
//!
//! The provisioning log is the operator's view of a cluster-wide boot: which
//! node got which image, how much and how fast, or why it stopped. The line is
//! built by a pure function ([`Download::log_line`]) so it is tested without a
//! subscriber, and the same [`Download`] value is handed to an optional hook
//! (see [`crate::ImageState::on_download`]) so tests and other consumers
//! assert on data, not on log text.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use mprov_api::boot::BootConfig;

/// A finished (or abandoned) response body stream under `/images/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Download {
    /// The client's address, if the server knew it (it always does under
    /// [`crate::serve`]).
    pub client: Option<IpAddr>,
    /// The node name found for `client` in the boot config snapshot.
    pub node: Option<String>,
    /// The request path, e.g. `/images/compute/3/rootfs.tar.zst`.
    pub path: String,
    /// Body bytes sent.
    pub bytes: u64,
    /// Time from the response being ready to the stream ending.
    pub elapsed: Duration,
    /// How it ended.
    pub outcome: Outcome,
}

/// How a download stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every byte of the body was handed to the connection.
    Completed,
    /// The stream stopped early; the reason is for humans.
    Failed(String),
}

impl Download {
    /// The image slug: the first path segment after `/images/`.
    pub fn image(&self) -> &str {
        image_slug(&self.path).unwrap_or(&self.path)
    }

    fn who(&self) -> Who<'_> {
        Who {
            node: self.node.as_deref(),
            client: self.client,
        }
    }

    /// The line logged when the download starts, e.g. `provisioning: c01
    /// (10.0.0.21) started getting image compute (1.2 GB)`: `len` is what
    /// this request asked for.
    pub fn start_line(&self, len: u64) -> String {
        let who = self.who();
        format!(
            "provisioning: {who} started getting {} ({})",
            What(&self.path),
            HumanBytes(len)
        )
    }

    /// The log line for this download, without the level.
    ///
    /// ```text
    /// provisioning: c01 (10.0.0.21) got image compute (1.2 GB in 41 s)
    /// provisioning: c01 (10.0.0.21) stopped getting image compute after 300 MB in 12 s: client went away
    /// ```
    ///
    /// Files other than the root filesystem are named: `kernel of image
    /// compute`, `initramfs of image compute`, `manifest.json of image compute`.
    pub fn log_line(&self) -> String {
        let who = self.who();
        let what = What(&self.path);
        let bytes = HumanBytes(self.bytes);
        let secs = HumanSecs(self.elapsed);
        match &self.outcome {
            Outcome::Completed => format!("provisioning: {who} got {what} ({bytes} in {secs})"),
            Outcome::Failed(reason) => format!(
                "provisioning: {who} stopped getting {what} after {bytes} in {secs}: {reason}"
            ),
        }
    }
}

/// The node name for `ip` in the snapshot, matching IPv4 (also as an
/// IPv4-mapped IPv6 address) and IPv6 interface addresses.
pub fn node_name(config: &BootConfig, ip: IpAddr) -> Option<String> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    config
        .hosts
        .iter()
        .find(|host| match ip {
            IpAddr::V4(v4) => host.ipv4 == Some(v4),
            IpAddr::V6(v6) => host.ipv6 == Some(v6),
        })
        .map(|host| host.hostname.clone())
}

/// `compute` for `/images/compute/3/rootfs.tar.zst`; `None` outside `/images/`.
pub(crate) fn image_slug(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/images/")?;
    rest.split('/').next().filter(|slug| !slug.is_empty())
}

/// `c01 (10.0.0.21)`, or the address alone, or `unknown client`.
struct Who<'a> {
    node: Option<&'a str>,
    client: Option<IpAddr>,
}

impl fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.node, self.client) {
            (Some(node), Some(ip)) => write!(f, "{node} ({ip})"),
            (Some(node), None) => f.write_str(node),
            (None, Some(ip)) => write!(f, "{ip}"),
            (None, None) => f.write_str("unknown client"),
        }
    }
}

/// `image compute`, `kernel of image compute`, ...
struct What<'a>(&'a str);

impl fmt::Display for What<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(slug) = image_slug(self.0) else {
            return f.write_str(self.0);
        };
        let file = self.0.rsplit('/').next().unwrap_or_default();
        match file {
            "rootfs.tar.zst" => write!(f, "image {slug}"),
            "vmlinuz" => write!(f, "kernel of image {slug}"),
            "initramfs.img" => write!(f, "initramfs of image {slug}"),
            "" => write!(f, "image {slug}"),
            other => write!(f, "{other} of image {slug}"),
        }
    }
}

/// Decimal units, as disks and links are sold: `512 B`, `1.2 GB`, `300 MB`.
/// One decimal below 10, none above.
struct HumanBytes(u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
        if self.0 < 1000 {
            return write!(f, "{} B", self.0);
        }
        // Precision loss above 2^53 bytes is irrelevant for a log line.
        #[allow(clippy::cast_precision_loss)]
        let mut value = self.0 as f64 / 1000.0;
        let mut unit = 0;
        while value >= 999.5 && unit + 1 < UNITS.len() {
            value /= 1000.0;
            unit += 1;
        }
        if value < 9.95 {
            write!(f, "{value:.1} {}", UNITS[unit])
        } else {
            write!(f, "{value:.0} {}", UNITS[unit])
        }
    }
}

/// `0.4 s`, `41 s`: one decimal below 10 s.
struct HumanSecs(Duration);

impl fmt::Display for HumanSecs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.as_secs_f64();
        if secs < 9.95 {
            write!(f, "{secs:.1} s")
        } else {
            write!(f, "{secs:.0} s")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use mprov_api::boot::BootHost;

    use super::*;

    fn download(path: &str, bytes: u64, millis: u64, outcome: Outcome) -> Download {
        Download {
            client: Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 21))),
            node: Some("c01".into()),
            path: path.into(),
            bytes,
            elapsed: Duration::from_millis(millis),
            outcome,
        }
    }

    #[test]
    fn completed_line() {
        let d = download(
            "/images/compute/3/rootfs.tar.zst",
            1_200_000_000,
            41_200,
            Outcome::Completed,
        );
        assert_eq!(
            d.log_line(),
            "provisioning: c01 (10.0.0.21) got image compute (1.2 GB in 41 s)"
        );
        assert_eq!(d.image(), "compute");
    }

    #[test]
    fn failed_line() {
        let d = download(
            "/images/compute/3/rootfs.tar.zst",
            300_000_000,
            12_000,
            Outcome::Failed("client went away".into()),
        );
        assert_eq!(
            d.log_line(),
            "provisioning: c01 (10.0.0.21) stopped getting image compute after 300 MB in 12 s: client went away"
        );
    }

    #[test]
    fn other_files_and_unknown_nodes() {
        let mut d = download("/images/gpu/1/vmlinuz", 12_345_678, 420, Outcome::Completed);
        d.node = None;
        assert_eq!(
            d.log_line(),
            "provisioning: 10.0.0.21 got kernel of image gpu (12 MB in 0.4 s)"
        );
        d.path = "/images/gpu/1/initramfs.img".into();
        d.client = None;
        d.bytes = 999;
        assert_eq!(
            d.log_line(),
            "provisioning: unknown client got initramfs of image gpu (999 B in 0.4 s)"
        );
        d.path = "/images/gpu/1/manifest.json".into();
        assert!(d.log_line().contains("manifest.json of image gpu"));
    }

    #[test]
    fn starts_are_logged_with_what_was_asked() {
        let d = download("/images/compute/3/rootfs.tar.zst", 0, 0, Outcome::Completed);
        assert_eq!(
            d.start_line(1_234_000_000),
            "provisioning: c01 (10.0.0.21) started getting image compute (1.2 GB)"
        );
    }

    #[test]
    fn human_bytes() {
        let check = |n: u64, want: &str| assert_eq!(HumanBytes(n).to_string(), want, "{n}");
        check(0, "0 B");
        check(999, "999 B");
        check(1000, "1.0 kB");
        check(9_949, "9.9 kB");
        check(10_000, "10 kB");
        check(999_499, "999 kB");
        check(999_500, "1.0 MB");
        check(2 * 1024 * 1024 * 1024, "2.1 GB");
        check(u64::MAX, "18447 PB");
    }

    #[test]
    fn image_slugs() {
        assert_eq!(image_slug("/images/compute/3/vmlinuz"), Some("compute"));
        assert_eq!(image_slug("/images/compute"), Some("compute"));
        assert_eq!(image_slug("/images/"), None);
        assert_eq!(image_slug("/boot/ipxe.efi"), None);
    }

    #[test]
    fn node_names() {
        let host = |name: &str, v4: Option<Ipv4Addr>, v6: Option<Ipv6Addr>| BootHost {
            mac: None,
            ipv4: v4,
            ipv6: v6,
            hostname: name.into(),
            aliases: vec![],
            network: None,
            netboot: true,
            bootable: true,
        };
        let config = BootConfig {
            hosts: vec![
                host("c01", Some(Ipv4Addr::new(10, 0, 0, 21)), None),
                host(
                    "c02",
                    None,
                    Some(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)),
                ),
            ],
            ..BootConfig::default()
        };
        let v4 = Ipv4Addr::new(10, 0, 0, 21);
        assert_eq!(node_name(&config, v4.into()).as_deref(), Some("c01"));
        assert_eq!(
            node_name(&config, v4.to_ipv6_mapped().into()).as_deref(),
            Some("c01")
        );
        assert_eq!(
            node_name(&config, "fd00::2".parse().unwrap()).as_deref(),
            Some("c02")
        );
        assert_eq!(node_name(&config, "10.0.0.22".parse().unwrap()), None);
    }
}
