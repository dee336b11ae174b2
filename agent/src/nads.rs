//! `mprov-agent nads`: which switch port is each of this node's links
//! cabled to? The agent listens for LLDP on every link that is up, reads the
//! machine's vendor, model and serial from DMI, and reports it all to the
//! control service, which matches the node to its system by switch port
//! (`mprov_api::nads` describes the exchange).
//!
//! The decisions are pure functions, so they are tested without sockets:
//! - [`links_to_listen`]: the links that are up, loopback excluded;
//! - [`neighbour`]: a received frame to the neighbour it names, or nothing
//!   (not LLDP, not to an LLDP group address, or a shutdown with TTL 0);
//! - [`Heard`]: what each link heard, whether every link was heard from
//!   (which ends the window early), and the [`NadsReport`] it makes, where
//!   a link that heard nothing says so (`neighbour: None`: some NICs
//!   swallow LLDP in firmware);
//! - [`boot_mac`], [`discovery_nonce`]: the MAC and nonce the report is
//!   sent with, from the flags or the kernel command line.
//!
//! The I/O around them: [`listen`] opens a raw packet socket per link with
//! pnet's datalink channel (Layer 2, promiscuous for the window, so that a
//! NIC that filters multicast still passes the LLDP group address) and
//! reads each on a thread of its own; [`read_hardware`] reads
//! `sys/class/dmi/id` under a root; [`send`] `POST`s the report to
//! [`REPORT_PATH`] through the agent's one HTTP client, with the discovery
//! nonce in [`NONCE_HEADER`] and trusting only the given CA, or as the
//! booted node with its own certificate.
//!
//! Raw sockets need CAP_NET_RAW: the agent runs as root in the initramfs
//! and under its unit.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mprov_api::nads::{
    Hardware, LinkReport, NONCE_HEADER, NONCE_PARAM, NadsReport, Neighbour, REPORT_PATH,
    ReportOutcome,
};
use mprov_lldp::{Frame, Lldpdu, mac_text};

use crate::cmdline::{self, Nonce, ParamError};
use crate::enroll::{self, Control, EnrollError, Identity};

/// How long one read on a link's socket waits before the thread looks at
/// the clock and the stop flag again.
const READ_TIMEOUT: Duration = Duration::from_millis(200);

/// Where DMI facts live, under the root.
pub const DMI_DIR: &str = "sys/class/dmi/id";

/// A network interface as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Its name.
    pub name: String,
    /// Its MAC, if it has one.
    pub mac: Option<[u8; 6]>,
    /// `IFF_UP`.
    pub up: bool,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
}

/// A link the agent listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The interface's name.
    pub interface: String,
    /// Its MAC.
    pub mac: [u8; 6],
}

/// Why `nads` failed.
#[derive(Debug, thiserror::Error)]
pub enum NadsError {
    /// The interfaces could not be listed.
    #[error("listing the network interfaces")]
    Interfaces(#[source] std::io::Error),
    /// A link's raw socket could not be opened (not root?).
    #[error("opening a raw packet socket on {interface} (needs CAP_NET_RAW)")]
    Open {
        /// The link.
        interface: String,
        /// The cause.
        #[source]
        err: std::io::Error,
    },
    /// pnet offered a channel of another kind than Ethernet.
    #[error("{interface} has no Ethernet channel")]
    NotEthernet {
        /// The link.
        interface: String,
    },
    /// Nothing to report with: no nonce, and no identity under the root.
    #[error(
        "no discovery nonce (--nonce, or {NONCE_PARAM}= on the kernel command line) and no node identity"
    )]
    NoCredentials(#[source] EnrollError),
    /// The boot MAC given is not a MAC.
    #[error("the boot MAC")]
    BootMac(#[source] ParamError),
    /// The nonce given is not one.
    #[error("the discovery nonce")]
    Nonce(#[source] ParamError),
    /// No CA to trust for the report.
    #[error("no CA to trust: give --ca, or mprov_ca= on the kernel command line")]
    NoCa,
    /// Reading a file (the CA, the command line) failed.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        err: std::io::Error,
    },
    /// The exchange with the control service failed.
    #[error("reporting to the control service")]
    Report(#[source] EnrollError),
    /// The control service's answer is not a report outcome.
    #[error("the control service's answer is not a report outcome")]
    Outcome(#[source] serde_json::Error),
}

/// The links to listen on: those up, with a MAC, loopback excluded, in the
/// kernel's order.
pub fn links_to_listen(interfaces: &[Interface]) -> Vec<Link> {
    interfaces
        .iter()
        .filter(|i| i.up && !i.loopback)
        .filter_map(|i| {
            Some(Link {
                interface: i.name.clone(),
                mac: i.mac.filter(|m| *m != [0; 6])?,
            })
        })
        .collect()
}

/// The neighbour a received Ethernet frame names: `None` unless it is an
/// LLDP frame, to one of the three LLDP group addresses, with a TTL above
/// 0 (a TTL of 0 says "forget me", §9.2.7.7.4).
pub fn neighbour(bytes: &[u8]) -> Option<Neighbour> {
    let frame = Frame::parse(bytes).ok()?;
    let group = [
        mprov_lldp::NEAREST_BRIDGE,
        mprov_lldp::NEAREST_NON_TPMR_BRIDGE,
        mprov_lldp::NEAREST_CUSTOMER_BRIDGE,
    ];
    if !group.contains(&frame.destination) || frame.lldpdu.ttl == 0 {
        return None;
    }
    Some(neighbour_of(&frame.lldpdu))
}

/// An LLDPDU as the report's [`Neighbour`].
pub fn neighbour_of(lldpdu: &Lldpdu) -> Neighbour {
    Neighbour {
        chassis_id: lldpdu.chassis_id.text(),
        chassis_id_subtype: lldpdu.chassis_id.subtype.name(),
        port_id: lldpdu.port_id.text(),
        port_id_subtype: lldpdu.port_id.subtype.name(),
        system_name: lldpdu.system_name(),
        port_description: lldpdu.port_description(),
        management_addresses: lldpdu
            .management_addresses()
            .iter()
            .map(|m| m.text())
            .collect(),
        vlan: lldpdu.port_vlan(),
    }
}

/// What the links heard so far.
#[derive(Debug, Clone)]
pub struct Heard {
    links: Vec<Link>,
    neighbours: BTreeMap<String, Neighbour>,
}

impl Heard {
    /// Nothing heard yet on `links`.
    pub fn new(links: Vec<Link>) -> Self {
        Self {
            links,
            neighbours: BTreeMap::new(),
        }
    }

    /// Records what `interface` heard. The first neighbour a link hears is
    /// the one reported (a switch port has one; a later frame on the same
    /// link, through a hub or a bridge that forwards LLDP, does not replace
    /// it). Whether it was the link's first.
    pub fn record(&mut self, interface: &str, neighbour: Neighbour) -> bool {
        if !self.links.iter().any(|l| l.interface == interface)
            || self.neighbours.contains_key(interface)
        {
            return false;
        }
        self.neighbours.insert(interface.to_owned(), neighbour);
        true
    }

    /// Whether every link has been heard from (true when there is no link:
    /// there is nothing to wait for).
    pub fn all_heard(&self) -> bool {
        self.links
            .iter()
            .all(|l| self.neighbours.contains_key(&l.interface))
    }

    /// The report: one entry per link, in order, `None` where nothing was
    /// heard.
    pub fn report(&self, boot_mac: &str, hardware: Hardware) -> NadsReport {
        NadsReport {
            boot_mac: boot_mac.to_owned(),
            links: self
                .links
                .iter()
                .map(|l| LinkReport {
                    interface: l.interface.clone(),
                    mac: mac_text(&l.mac),
                    neighbour: self.neighbours.get(&l.interface).cloned(),
                })
                .collect(),
            hardware,
        }
    }
}

/// The MAC the node booted from, lower-case: the one given (`--boot-mac`,
/// or `mprov_mac` on the command line), else the first link's, else empty.
pub fn boot_mac(given: Option<cmdline::Mac>, links: &[Link]) -> String {
    match given {
        Some(mac) => mac.to_string(),
        None => links.first().map(|l| mac_text(&l.mac)).unwrap_or_default(),
    }
}

/// The discovery nonce on a kernel command line (`mprov_discover=`), if
/// there is one; an error if it is there and not a nonce.
pub fn discovery_nonce(line: &[u8]) -> Option<Result<Nonce, ParamError>> {
    cmdline::words(line)
        .filter(|w| w.name == NONCE_PARAM.as_bytes())
        .last()
        .map(|w| Nonce::parse(w.value.unwrap_or_default()))
}

/// Vendor, model and serial from `<root>/sys/class/dmi/id`; each `None`
/// when unreadable (not root, no DMI) or blank, or a placeholder firmware
/// leaves there ("To Be Filled By O.E.M.", "Default string").
pub fn read_hardware(root: &Path) -> Hardware {
    let dir = root.join(DMI_DIR);
    let read = |file: &str| {
        let text = std::fs::read_to_string(dir.join(file)).ok()?;
        let text = text.trim();
        let placeholder = [
            "",
            "to be filled by o.e.m.",
            "default string",
            "not specified",
        ]
        .contains(&text.to_ascii_lowercase().as_str());
        (!placeholder).then(|| text.to_owned())
    };
    Hardware {
        vendor: read("sys_vendor"),
        model: read("product_name"),
        serial: read("product_serial"),
    }
}

/// The kernel's interfaces, through pnet.
pub fn interfaces() -> Vec<Interface> {
    pnet_datalink::interfaces()
        .into_iter()
        .map(|i| Interface {
            mac: i.mac.map(|m| m.octets()),
            up: i.is_up(),
            loopback: i.is_loopback(),
            name: i.name,
        })
        .collect()
}

/// Listens on `links` for at most `window`, ending as soon as every link
/// has been heard from. `log` hears each link's first neighbour.
pub fn listen(links: Vec<Link>, window: Duration, log: &dyn Fn(&str)) -> Result<Heard, NadsError> {
    let deadline = Instant::now() + window;
    let all = pnet_datalink::interfaces();
    let mut receivers = Vec::new();
    for link in &links {
        let Some(interface) = all.iter().find(|i| i.name == link.interface) else {
            continue;
        };
        let config = pnet_datalink::Config {
            read_timeout: Some(READ_TIMEOUT),
            promiscuous: true,
            ..Default::default()
        };
        match pnet_datalink::channel(interface, config) {
            Ok(pnet_datalink::Channel::Ethernet(_tx, rx)) => {
                receivers.push((link.interface.clone(), rx));
            }
            Ok(_) => {
                return Err(NadsError::NotEthernet {
                    interface: link.interface.clone(),
                });
            }
            Err(err) => {
                return Err(NadsError::Open {
                    interface: link.interface.clone(),
                    err,
                });
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (sender, heard_rx) = mpsc::channel::<(String, Neighbour)>();
    let mut threads = Vec::new();
    for (name, mut rx) in receivers {
        let stop = Arc::clone(&stop);
        let sender = sender.clone();
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let bytes = match rx.next() {
                    Ok(bytes) => bytes,
                    Err(err) => {
                        // A timeout: look at the clock and the flag. Any
                        // other error (the link went down) may repeat at
                        // once: wait a read's time before trying again.
                        if !matches!(
                            err.kind(),
                            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                        ) {
                            std::thread::sleep(READ_TIMEOUT);
                        }
                        continue;
                    }
                };
                let lldp = bytes.get(12..14) == Some(&[0x88, 0xcc])
                    || bytes.get(16..18) == Some(&[0x88, 0xcc]);
                if let Some(n) = lldp.then(|| neighbour(bytes)).flatten()
                    && sender.send((name.clone(), n)).is_err()
                {
                    break;
                }
            }
        }));
    }
    drop(sender);
    let mut heard = Heard::new(links);
    while !heard.all_heard() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match heard_rx.recv_timeout(left) {
            Ok((interface, n)) => {
                let line = format!(
                    "{interface}: heard {} port {} ({})",
                    n.system_name.as_deref().unwrap_or(&n.chassis_id),
                    n.port_id,
                    n.port_id_subtype
                );
                if heard.record(&interface, n) {
                    log(&line);
                }
            }
            Err(_) => break,
        }
    }
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        let _ = thread.join();
    }
    Ok(heard)
}

/// How the report is authenticated.
#[derive(Debug)]
pub enum Credentials {
    /// An unknown node: the one-time discovery nonce, and the CA (PEM) the
    /// control service's certificate must chain to.
    Discovery {
        /// The nonce.
        nonce: Nonce,
        /// The CA, PEM.
        ca_pem: String,
    },
    /// A booted node: its own certificate.
    Node(Identity),
}

/// `POST`s `report` to `<url>` [`REPORT_PATH`]; the control service's
/// answer.
pub fn send(
    url: &str,
    report: &NadsReport,
    credentials: &Credentials,
) -> Result<ReportOutcome, NadsError> {
    let body = match credentials {
        Credentials::Discovery { nonce, ca_pem } => {
            enroll::post_with_nonce(url, ca_pem, REPORT_PATH, NONCE_HEADER, nonce, report)
        }
        Credentials::Node(identity) => Control::new(url, identity)
            .and_then(|c| c.post_json(REPORT_PATH, report, "reporting what NADS heard")),
    }
    .map_err(NadsError::Report)?;
    serde_json::from_slice(&body).map_err(NadsError::Outcome)
}

/// The report as a table a person reads.
pub fn table(report: &NadsReport) -> String {
    let mut rows = vec![[
        "INTERFACE".to_owned(),
        "MAC".to_owned(),
        "SWITCH".to_owned(),
        "PORT".to_owned(),
        "VLAN".to_owned(),
        "PORT DESCRIPTION".to_owned(),
    ]];
    for link in &report.links {
        let row = match &link.neighbour {
            Some(n) => [
                link.interface.clone(),
                link.mac.clone(),
                match &n.system_name {
                    Some(name) => format!("{name} ({})", n.chassis_id),
                    None => format!("{} ({})", n.chassis_id, n.chassis_id_subtype),
                },
                format!("{} ({})", n.port_id, n.port_id_subtype),
                n.vlan.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                n.port_description.clone().unwrap_or_else(|| "-".into()),
            ],
            None => [
                link.interface.clone(),
                link.mac.clone(),
                "(nothing heard)".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ],
        };
        rows.push(row);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    let fact = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    out.push_str(&format!(
        "boot MAC {}; vendor {}, model {}, serial {}\n",
        if report.boot_mac.is_empty() {
            "-"
        } else {
            &report.boot_mac
        },
        fact(&report.hardware.vendor),
        fact(&report.hardware.model),
        fact(&report.hardware.serial),
    ));
    out
}

/// Reads a file for [`NadsError::Read`].
pub fn read_file(path: &Path) -> Result<Vec<u8>, NadsError> {
    std::fs::read(path).map_err(|err| NadsError::Read {
        path: path.display().to_string(),
        err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SWITCH: [u8; 6] = [0x52, 0x54, 0x00, 0xaa, 0x00, 0x01];

    fn testdata(name: &str) -> Vec<u8> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("lldp/testdata")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn link(name: &str, last: u8) -> Link {
        Link {
            interface: name.into(),
            mac: [0x52, 0x54, 0, 0xbb, 0, last],
        }
    }

    #[test]
    fn only_links_that_are_up_and_not_loopback_are_listened_on() {
        let i = |name: &str, mac: Option<[u8; 6]>, up, loopback| Interface {
            name: name.into(),
            mac,
            up,
            loopback,
        };
        let links = links_to_listen(&[
            i("lo", Some([0; 6]), true, true),
            i("eth0", Some([0x52, 0x54, 0, 0xbb, 0, 7]), true, false),
            i("eth1", Some([0x52, 0x54, 0, 0xbb, 0, 8]), false, false),
            i("tun0", None, true, false),
            i("eth2", Some([0x52, 0x54, 0, 0xbb, 0, 9]), true, false),
        ]);
        assert_eq!(links, [link("eth0", 7), link("eth2", 9)]);
    }

    #[test]
    fn a_captured_frame_is_the_neighbour_lldpd_was_told_to_be() {
        let n = neighbour(&testdata("portid-ifname-vlan.bin")).expect("heard");
        assert_eq!(
            n,
            Neighbour {
                chassis_id: "52:54:00:aa:00:01".into(),
                chassis_id_subtype: "mac-address".into(),
                port_id: "swp7".into(),
                port_id_subtype: "interface-name".into(),
                system_name: Some("cumulus-leaf".into()),
                port_description: Some("swp7".into()),
                management_addresses: vec!["192.0.2.1".into(), "fe80::5054:ff:feaa:1".into()],
                vlan: Some(100),
            }
        );
        let n = neighbour(&testdata("portid-local-junos.bin")).expect("heard");
        assert_eq!(
            (n.chassis_id.as_str(), n.chassis_id_subtype.as_str()),
            ("ex4300-chassis-1", "local")
        );
        assert_eq!((n.port_id.as_str(), n.vlan), ("ge-0/0/7", None));
    }

    #[test]
    fn frames_that_name_no_neighbour_are_ignored() {
        let good = testdata("portid-mac.bin");
        assert!(neighbour(&good).is_some());
        // To a unicast address.
        let mut unicast = good.clone();
        unicast[..6].copy_from_slice(&SWITCH);
        assert!(neighbour(&unicast).is_none());
        // A shutdown: TTL 0 (the TTL TLV follows chassis and port: 14 + 9 + 9).
        let mut shutdown = good.clone();
        assert_eq!(&shutdown[32..34], &[0x06, 0x02]);
        shutdown[34..36].copy_from_slice(&[0, 0]);
        assert!(neighbour(&shutdown).is_none());
        // Not LLDP, or broken.
        let mut ipv4 = good.clone();
        ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
        assert!(neighbour(&ipv4).is_none());
        assert!(neighbour(&good[..20]).is_none());
    }

    #[test]
    fn the_window_ends_once_every_link_was_heard_and_silence_is_reported() {
        let mut heard = Heard::new(vec![link("eth0", 7), link("eth1", 8)]);
        assert!(!heard.all_heard());
        let n = neighbour(&testdata("portid-local-arista.bin")).expect("heard");
        assert!(heard.record("eth0", n.clone()));
        // A second frame on the same link, or one on a link not listened
        // on, changes nothing.
        let other = neighbour(&testdata("portid-mac.bin")).expect("heard");
        assert!(!heard.record("eth0", other.clone()));
        assert!(!heard.record("wlan0", other.clone()));
        assert!(!heard.all_heard());
        let hardware = Hardware {
            vendor: Some("QEMU".into()),
            model: None,
            serial: None,
        };
        let report = heard.report("52:54:00:bb:00:07", hardware.clone());
        assert_eq!(report.boot_mac, "52:54:00:bb:00:07");
        assert_eq!(report.links.len(), 2);
        assert_eq!(report.links[0].neighbour.as_ref(), Some(&n));
        assert_eq!(report.links[0].mac, "52:54:00:bb:00:07");
        assert_eq!(report.links[1].interface, "eth1");
        assert_eq!(report.links[1].neighbour, None);
        assert_eq!(report.hardware, hardware);
        assert!(heard.record("eth1", other));
        assert!(heard.all_heard());
        // No link: nothing to wait for.
        assert!(Heard::new(vec![]).all_heard());
    }

    #[test]
    fn the_boot_mac_and_nonce_come_from_the_flags_or_the_command_line() {
        let links = [link("eth0", 7), link("eth1", 8)];
        assert_eq!(boot_mac(None, &links), "52:54:00:bb:00:07");
        let given = cmdline::Mac::parse(b"52-54-00-BB-00-08").expect("a MAC");
        assert_eq!(boot_mac(Some(given), &links), "52:54:00:bb:00:08");
        assert_eq!(boot_mac(None, &[]), "");
        let line = b"quiet mprov_url=https://c mprov_discover=n0nce-A.b_c~ console=ttyS0\n";
        let nonce = discovery_nonce(line).expect("there").expect("a nonce");
        assert_eq!(nonce.expose_secret(), "n0nce-A.b_c~");
        assert!(discovery_nonce(b"quiet mprov_enroll=abc").is_none());
        assert!(matches!(
            discovery_nonce(b"mprov_discover=a/b"),
            Some(Err(_))
        ));
        assert!(matches!(discovery_nonce(b"mprov_discover"), Some(Err(_))));
    }

    #[test]
    fn dmi_facts_are_read_under_a_root_and_placeholders_dropped() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join(DMI_DIR);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("sys_vendor"), "Supermicro\n").expect("write");
        std::fs::write(dir.join("product_name"), "To Be Filled By O.E.M.\n").expect("write");
        assert_eq!(
            read_hardware(root.path()),
            Hardware {
                vendor: Some("Supermicro".into()),
                model: None,
                serial: None,
            }
        );
    }

    #[test]
    fn the_table_names_each_link_and_says_when_nothing_was_heard() {
        let mut heard = Heard::new(vec![link("eth0", 7), link("eth1", 8)]);
        heard.record(
            "eth0",
            neighbour(&testdata("portid-ifname-vlan.bin")).expect("heard"),
        );
        let text = table(&heard.report("52:54:00:bb:00:07", Hardware::default()));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].starts_with("eth0"), "{text}");
        assert!(
            lines[1].contains("cumulus-leaf (52:54:00:aa:00:01)")
                && lines[1].contains("swp7 (interface-name)")
                && lines[1].contains("100"),
            "{text}"
        );
        assert!(lines[2].contains("(nothing heard)"), "{text}");
        assert!(lines[3].contains("vendor -"), "{text}");
    }

    /// The report goes to REPORT_PATH with the nonce header and the
    /// report as JSON, and the answer is read as an outcome.
    #[test]
    fn a_report_is_posted_with_the_nonce() {
        use std::io::{Read as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accepts");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = conn.read(&mut buf).expect("reads");
                assert!(n > 0, "the request ended early");
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length: ")
                                .map(|v| v.trim().parse().expect("a length"))
                        })
                        .unwrap_or(0);
                    if body.len() >= length {
                        break;
                    }
                }
            }
            let answer = br#"{"outcome":"parked","reason":"no system has a NIC on leaf01 swp7"}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                answer.len()
            );
            conn.write_all(head.as_bytes()).expect("writes");
            conn.write_all(answer).expect("writes");
            String::from_utf8_lossy(&got).into_owned()
        });
        let ca = rcgen::CertificateParams::new(vec!["ca".to_owned()])
            .expect("params")
            .self_signed(&rcgen::KeyPair::generate().expect("key"))
            .expect("ca");
        let mut heard = Heard::new(vec![link("eth0", 7)]);
        heard.record(
            "eth0",
            neighbour(&testdata("portid-ifname-vlan.bin")).expect("heard"),
        );
        let report = heard.report("52:54:00:bb:00:07", Hardware::default());
        let credentials = Credentials::Discovery {
            nonce: Nonce::parse(b"the-nonce").expect("nonce"),
            ca_pem: ca.pem(),
        };
        let outcome = send(&url, &report, &credentials).expect("sent");
        assert_eq!(
            outcome,
            ReportOutcome::Parked {
                reason: "no system has a NIC on leaf01 swp7".into()
            }
        );
        let request = server.join().expect("server");
        assert!(
            request.starts_with(&format!("POST {REPORT_PATH} HTTP/1.1\r\n")),
            "{request}"
        );
        assert!(
            request.to_ascii_lowercase().contains(&format!(
                "{}: the-nonce\r\n",
                NONCE_HEADER.to_ascii_lowercase()
            )),
            "{request}"
        );
        let body = request.split_once("\r\n\r\n").expect("a body").1;
        let sent: NadsReport = serde_json::from_str(body).expect("a report");
        assert_eq!(sent, report);
    }
}
