//! The addresses a job server registers (and heartbeats on): those given
//! (`--address`, the config's `addresses:`), or else those of the
//! interfaces that are up.
//!
//! From the interfaces, an address counts when it is IPv4, or IPv6 of
//! global scope as Linux means it (unique local `fc00::/7` included: a
//! cluster's provisioning network may use one), and is not loopback,
//! link-local, multicast or unspecified; and its interface is up, not
//! loopback, and not a container's or a VM's bridge or link, by its name's
//! start ([`VIRTUAL_PREFIXES`]).
//!
//! Each address's heartbeat goes out from that address as its source, to
//! that address's own control-service URL when the config gives one
//! (`addresses: [{address, mprovURL}]`), else to the global one
//! ([`Senders`]): the control service, and any firewall on the way, see it
//! come from the network it is about. An address not on this host (given
//! by hand) is logged once and sent from whatever source the kernel picks.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Result, bail};
use mprov_api::client::Client;
use mprov_api::jobs::AddressRegistration;
use mprov_dhcp::ra::Interface;

/// The starts of the interface names left out: Docker (`docker0`,
/// `br-<id>`, `veth*`), libvirt (`virbr*`, `vnet*`), Kubernetes CNIs
/// (`cni*`, `flannel*`, `cali*`, `weave`, `kube-ipvs*`), Podman, LXC and LXD
/// bridges.
pub const VIRTUAL_PREFIXES: &[&str] = &[
    "docker",
    "br-",
    "virbr",
    "veth",
    "vnet",
    "cni",
    "flannel",
    "cali",
    "weave",
    "kube-ipvs",
    "podman",
    "lxcbr",
    "lxdbr",
];

/// What `--address` says: the addresses as given, or none given (then the
/// interfaces decide).
pub fn parse(given: &[String]) -> Result<Option<Vec<AddressRegistration>>> {
    match given {
        [] => Ok(None),
        [one] if one.trim().eq_ignore_ascii_case("none") => Ok(Some(Vec::new())),
        many => many
            .iter()
            .map(|a| parse_one(a))
            .collect::<Result<_>>()
            .map(Some),
    }
}

/// One `ADDR` or `ADDR@NETWORK_ID`.
pub fn parse_one(text: &str) -> Result<AddressRegistration> {
    let text = text.trim();
    let (addr, network) = match text.split_once('@') {
        Some((a, n)) => {
            let Ok(n) = n.trim().parse::<i64>() else {
                bail!("--address {text:?}: the network after @ is not a network id (a number)");
            };
            (a.trim(), Some(n))
        }
        None => (text, None),
    };
    let Ok(address) = addr.parse::<IpAddr>() else {
        if addr.eq_ignore_ascii_case("none") {
            bail!("--address none stands alone: it registers no address");
        }
        bail!("--address {text:?}: {addr:?} is not an IPv4 or IPv6 address");
    };
    Ok(AddressRegistration { address, network })
}

/// Whether an interface named `name` is a container's or VM's.
pub fn is_virtual(name: &str) -> bool {
    VIRTUAL_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether `ip` is one nodes could reach this host at.
pub fn is_servable(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => servable_v4(v4),
        IpAddr::V6(v6) => servable_v6(v6),
    }
}

fn servable_v4(ip: Ipv4Addr) -> bool {
    !(ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_broadcast())
}

fn servable_v6(ip: Ipv6Addr) -> bool {
    !(ip.is_loopback()
        || ip.is_unicast_link_local()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.to_ipv4_mapped().is_some())
}

/// The addresses of `interfaces` to register, in interface then address
/// order, without duplicates; none placed on a network (the control service
/// finds the network whose subnet holds each).
pub fn from_interfaces(interfaces: &[Interface]) -> Vec<AddressRegistration> {
    let mut out: Vec<AddressRegistration> = Vec::new();
    for iface in interfaces
        .iter()
        .filter(|i| i.up && !i.loopback && !is_virtual(&i.name))
    {
        let v4 = iface.ipv4.iter().map(|(a, _)| IpAddr::V4(*a));
        let v6 = iface.ipv6.iter().map(|(a, _)| IpAddr::V6(*a));
        for address in v4.chain(v6).filter(|a| is_servable(*a)) {
            if !out.iter().any(|r| r.address == address) {
                out.push(AddressRegistration {
                    address,
                    network: None,
                });
            }
        }
    }
    out
}

/// The addresses to register: as given, else those of this host's
/// interfaces that are up.
pub fn to_register(given: &[String]) -> Result<Vec<AddressRegistration>> {
    match parse(given)? {
        Some(list) => Ok(list),
        None => Ok(from_interfaces(&Interface::list()?)),
    }
}

/// Whether `address` is one of this host's: a socket binds to it.
pub fn is_local(address: IpAddr) -> bool {
    std::net::UdpSocket::bind((address, 0)).is_ok()
}

/// Where a heartbeat for an address goes and from where: its own URL
/// (else the global client's), from the address itself when it is local.
pub fn heartbeat_route(
    own_url: Option<&str>,
    address: IpAddr,
    local: bool,
) -> (Option<&str>, Option<IpAddr>) {
    (own_url, local.then_some(address))
}

/// The clients the heartbeats go out with, one per address (see the
/// module doc), built from the daemon's client and rebuilt when it changes
/// (a renewed certificate).
#[derive(Debug, Default)]
pub struct Senders {
    urls: BTreeMap<IpAddr, String>,
    clients: HashMap<IpAddr, Client>,
    warned: std::collections::HashSet<IpAddr>,
}

impl Senders {
    /// With each address's own URL, from the config.
    pub fn new(urls: impl IntoIterator<Item = (IpAddr, String)>) -> Senders {
        Senders {
            urls: urls.into_iter().collect(),
            ..Senders::default()
        }
    }

    /// Forgets the clients built: `base` has changed.
    pub fn reset(&mut self) {
        self.clients.clear();
    }

    /// The client for `address`'s heartbeat, made from `base`.
    pub fn client(&mut self, base: &Client, address: IpAddr) -> Result<Client> {
        if let Some(client) = self.clients.get(&address) {
            return Ok(client.clone());
        }
        let local = is_local(address);
        if !local && self.warned.insert(address) {
            tracing::warn!(
                "{address} is not an address of this host: its heartbeats go out from whatever address the kernel picks"
            );
        }
        let own = self.urls.get(&address).map(String::as_str);
        let (url, from) = heartbeat_route(own, address, local);
        let client = base.elsewhere(url, from)?;
        self.clients.insert(address, client.clone());
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, up: bool, v4: &[&str], v6: &[&str]) -> Interface {
        Interface {
            name: name.into(),
            up,
            loopback: name == "lo",
            ipv4: v4.iter().map(|a| (a.parse().unwrap(), 24)).collect(),
            ipv6: v6.iter().map(|a| (a.parse().unwrap(), 64)).collect(),
            ..Interface::default()
        }
    }

    #[test]
    fn given_addresses_with_or_without_a_network() {
        let list = |a: &[&str]| parse(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(list(&[]).unwrap(), None);
        assert_eq!(list(&["none"]).unwrap(), Some(vec![]));
        assert_eq!(list(&[" NONE "]).unwrap(), Some(vec![]));
        let got = list(&["10.0.0.1", "fd00::1@3"]).unwrap().unwrap();
        assert_eq!(
            got,
            vec![
                AddressRegistration {
                    address: "10.0.0.1".parse().unwrap(),
                    network: None
                },
                AddressRegistration {
                    address: "fd00::1".parse().unwrap(),
                    network: Some(3)
                },
            ]
        );
        for bad in [
            &["10.0.0.300"][..],
            &["10.0.0.1@x"],
            &["host.example"],
            &["10.0.0.1", "none"],
        ] {
            assert!(list(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_heartbeat_goes_from_its_address_to_its_own_url() {
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        assert_eq!(
            heartbeat_route(Some("https://c2:8443"), a, true),
            (Some("https://c2:8443"), Some(a))
        );
        assert_eq!(heartbeat_route(None, a, true), (None, Some(a)));
        assert_eq!(heartbeat_route(None, a, false), (None, None));
        assert!(is_local("127.0.0.1".parse().unwrap()));
        assert!(!is_local("192.0.2.77".parse().unwrap()));
    }

    #[test]
    fn interfaces_give_their_servable_addresses_only() {
        let interfaces = [
            iface("lo", true, &["127.0.0.1"], &["::1"]),
            iface(
                "eno1",
                true,
                &["10.0.0.1", "169.254.3.4"],
                &["fe80::1", "2001:db8::1", "fd00::5"],
            ),
            iface("eno2", false, &["10.1.0.1"], &[]),
            iface("docker0", true, &["172.17.0.1"], &[]),
            iface("br-5f3a", true, &["172.18.0.1"], &[]),
            iface("virbr0", true, &["192.168.122.1"], &[]),
            iface("veth12", true, &["172.17.0.9"], &[]),
            iface("cali9", true, &["10.244.0.1"], &[]),
            iface("ib0", true, &["10.2.0.1", "10.0.0.1"], &[]),
        ];
        let got: Vec<String> = from_interfaces(&interfaces)
            .iter()
            .map(|a| a.address.to_string())
            .collect();
        assert_eq!(got, ["10.0.0.1", "2001:db8::1", "fd00::5", "10.2.0.1"]);
        assert!(
            from_interfaces(&interfaces)
                .iter()
                .all(|a| a.network.is_none())
        );
    }
}
