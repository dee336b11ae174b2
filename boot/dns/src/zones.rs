//! The records of the zones, computed from a boot config snapshot as plain
//! data ([`ZoneRecords`]); the server turns them into the zones it serves
//! (`ServedZones` in `src/server/live.rs`).
//!
//! Every network with `dns: true` and a non-empty `domain` gets an
//! authoritative forward zone (RFC 1034 §4.3, RFC 1035 §5) holding:
//!
//! * a SOA at the apex (`ns.<domain>` / `hostmaster.<domain>`, serial = the
//!   snapshot revision) and one NS record naming `ns.<domain>`;
//! * `A` (RFC 1035 §3.4.1) and `AAAA` (RFC 3596) records for
//!   `<hostname>.<domain>` of every host on that network;
//! * a `CNAME` (RFC 1035 §3.3.1) for each alias, pointing at the host's name.
//!   CNAMEs rather than extra address records keep one place to change an
//!   address and make it visible in `dig` which name is canonical. An alias
//!   that collides with another name is skipped (a CNAME cannot coexist with
//!   other data, RFC 1034 §3.6.2).
//!
//! Reverse zones (RFC 1035 §3.5, RFC 3596 §2.5) hold a PTR for every address
//! record. An IPv4 network `a.b.c.0/p` gets the zone at the octet boundary at
//! or above its prefix (`/24` → `c.b.a.in-addr.arpa`, `/16` or `/22` →
//! `b.a.in-addr.arpa`); addresses outside their network's subnet get their
//! `/24` zone. IPv6 addresses get their `/64` nibble zone in `ip6.arpa`. Each
//! PTR goes into the most specific reverse zone that contains it.
//!
//! Names that do not parse are skipped with a warning: one bad inventory entry
//! must not take the cluster's DNS down.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use hickory_server::proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA};
use hickory_server::proto::rr::{LowerName, Name, RData, Record, RecordType};
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneHandler, ZoneType};
use mprov_api::boot::BootConfig;
use tracing::warn;

/// SOA refresh, retry and expire (RFC 1035 §3.3.13). Nobody transfers these
/// zones (AXFR is denied), so they only need to be sane.
const SOA_REFRESH: i32 = 3600;
const SOA_RETRY: i32 = 600;
const SOA_EXPIRE: i32 = 86_400;

/// The records of every zone we are authoritative for, before they are put
/// into hickory zone handlers (the server's `ServedZones`). Kept separate so
/// it can be unit-tested as plain data.
#[derive(Debug, Default)]
pub(crate) struct ZoneRecords {
    /// Zone origin → records (including SOA and NS).
    pub(crate) zones: BTreeMap<Name, Vec<Record>>,
}

impl ZoneRecords {
    /// The origins of all authoritative zones.
    pub(crate) fn origins(&self) -> impl Iterator<Item = &Name> {
        self.zones.keys()
    }

    /// The A, AAAA and PTR record sets by owner name and type: the fast
    /// path for the queries a cluster sends most (`src/fast.rs`).
    pub(crate) fn exact(&self) -> HashMap<(LowerName, RecordType), Vec<Record>> {
        let mut map: HashMap<(LowerName, RecordType), Vec<Record>> = HashMap::new();
        for record in self.zones.values().flatten() {
            let rtype = record.record_type();
            if matches!(rtype, RecordType::A | RecordType::AAAA | RecordType::PTR) {
                let set = map
                    .entry((LowerName::new(&record.name), rtype))
                    .or_default();
                if !set.contains(record) {
                    set.push(record.clone());
                }
            }
        }
        map
    }

    /// Builds a catalog of in-memory zone handlers, plus `forwarder` at the
    /// root if there is one.
    pub(crate) fn into_catalog(
        self,
        serial: u32,
        forwarder: Option<Arc<dyn ZoneHandler>>,
    ) -> Catalog {
        let mut catalog = Catalog::new();
        for (origin, records) in self.zones {
            let mut zone =
                InMemoryZoneHandler::<hickory_server::net::runtime::TokioRuntimeProvider>::empty(
                    origin.clone(),
                    ZoneType::Primary,
                    AxfrPolicy::Deny,
                );
            for record in records {
                if !zone.upsert_mut(record.clone(), serial) {
                    warn!(zone = %origin, name = %record.name, "record not added to zone");
                }
            }
            catalog.upsert(LowerName::new(&origin), vec![Arc::new(zone)]);
        }
        if let Some(forwarder) = forwarder {
            catalog.upsert(LowerName::new(&Name::root()), vec![forwarder]);
        }
        catalog
    }
}

/// The SOA serial for a snapshot: its revision, clamped into `u32`.
pub(crate) fn serial(config: &BootConfig) -> u32 {
    u32::try_from(config.revision.max(0)).unwrap_or(u32::MAX)
}

/// Computes every authoritative zone for `config`; `ttl` is used for all
/// records and as the negative-caching TTL (SOA minimum, RFC 2308 §4).
pub(crate) fn build(config: &BootConfig, ttl: u32) -> ZoneRecords {
    let serial = serial(config);
    let mut set = ZoneRecords::default();

    // Forward zones, and the reverse zone each network implies.
    let mut domains: HashMap<&str, Name> = HashMap::new();
    let mut reverse: BTreeMap<Name, Name> = BTreeMap::new(); // reverse origin → its mname's zone
    for net in config
        .networks
        .iter()
        .filter(|n| n.dns && !n.domain.is_empty())
    {
        let Some(origin) = absolute(&net.domain) else {
            warn!(network = %net.slug, domain = %net.domain, "invalid DNS domain, skipped");
            continue;
        };
        domains.insert(net.slug.as_str(), origin.clone());
        set.zones
            .entry(origin.clone())
            .or_insert_with(|| apex(&origin, &origin, serial, ttl));
        let octets = usize::from(net.prefix.clamp(8, 24) / 8);
        reverse
            .entry(reverse_origin(IpAddr::V4(net.subnet), octets))
            .or_insert(origin);
    }

    // Address records, then aliases once every primary name is known.
    let mut ptrs: Vec<(IpAddr, Name, Name)> = Vec::new(); // address, target, zone for mname
    let mut names: HashSet<Name> = HashSet::new();
    let mut hosts = Vec::new();
    for host in &config.hosts {
        let Some(origin) = host.network.as_deref().and_then(|n| domains.get(n)) else {
            continue;
        };
        let Some(fqdn) = relative(&host.hostname, origin) else {
            warn!(hostname = %host.hostname, "invalid host name, skipped");
            continue;
        };
        let addrs: Vec<IpAddr> = host
            .ipv4
            .map(IpAddr::V4)
            .into_iter()
            .chain(host.ipv6.map(IpAddr::V6))
            .collect();
        if addrs.is_empty() {
            continue;
        }
        let records = set.zones.entry(origin.clone()).or_default();
        for &ip in &addrs {
            let rdata = match ip {
                IpAddr::V4(ip) => RData::A(A(ip)),
                IpAddr::V6(ip) => RData::AAAA(AAAA(ip)),
            };
            records.push(Record::from_rdata(fqdn.clone(), ttl, rdata));
            ptrs.push((ip, fqdn.clone(), origin.clone()));
            if let IpAddr::V4(v4) = ip {
                // Addresses outside every network's subnet still get a zone.
                let net = config
                    .networks
                    .iter()
                    .find(|n| Some(&n.slug) == host.network.as_ref());
                if !net.is_some_and(|n| in_subnet(v4, n.subnet, n.prefix)) {
                    reverse
                        .entry(reverse_origin(ip, 3))
                        .or_insert_with(|| origin.clone());
                }
            } else {
                reverse
                    .entry(reverse_origin(ip, 16))
                    .or_insert_with(|| origin.clone());
            }
        }
        names.insert(fqdn.clone());
        hosts.push((host, fqdn, origin.clone()));
    }
    for (host, fqdn, origin) in hosts {
        for alias in &host.aliases {
            let Some(name) = relative(alias, &origin) else {
                warn!(alias = %alias, "invalid alias, skipped");
                continue;
            };
            if !origin.zone_of(&name) || name == origin {
                warn!(alias = %name, zone = %origin, "alias outside its zone, skipped");
                continue;
            }
            if !names.insert(name.clone()) {
                warn!(alias = %name, "alias collides with another name, skipped");
                continue;
            }
            let records = set.zones.entry(origin.clone()).or_default();
            records.push(Record::from_rdata(
                name,
                ttl,
                RData::CNAME(CNAME(fqdn.clone())),
            ));
        }
    }

    // Reverse zones and their PTRs: each PTR into the most specific zone.
    for (rev, mzone) in &reverse {
        set.zones
            .entry(rev.clone())
            .or_insert_with(|| apex(rev, mzone, serial, ttl));
    }
    for (ip, target, _) in ptrs {
        let name = Name::from(ip);
        let zone = reverse
            .keys()
            .filter(|z| z.zone_of(&name))
            .max_by_key(|z| z.num_labels());
        if let Some(records) = zone.and_then(|z| set.zones.get_mut(z)) {
            records.push(Record::from_rdata(name, ttl, RData::PTR(PTR(target))));
        }
    }
    set
}

/// SOA and NS records for a zone apex. `mzone` is the forward zone whose
/// `ns.` and `hostmaster.` names appear in them.
fn apex(origin: &Name, mzone: &Name, serial: u32, ttl: u32) -> Vec<Record> {
    let ns = relative("ns", mzone).unwrap_or_else(|| mzone.clone());
    let hostmaster = relative("hostmaster", mzone).unwrap_or_else(|| mzone.clone());
    let soa = SOA::new(
        ns.clone(),
        hostmaster,
        serial,
        SOA_REFRESH,
        SOA_RETRY,
        SOA_EXPIRE,
        ttl,
    );
    vec![
        Record::from_rdata(origin.clone(), ttl, RData::SOA(soa)),
        Record::from_rdata(origin.clone(), ttl, RData::NS(NS(ns))),
    ]
}

/// Parses a domain as an absolute name.
fn absolute(domain: &str) -> Option<Name> {
    let mut name = Name::from_ascii(domain.trim_end_matches('.')).ok()?;
    name.set_fqdn(true);
    Some(name)
}

/// A host name or alias: relative to `origin` unless it ends with a dot.
fn relative(label: &str, origin: &Name) -> Option<Name> {
    if label.is_empty() || label == "." {
        return None;
    }
    let name = Name::from_ascii(label).ok()?;
    if name.is_fqdn() {
        Some(name)
    } else {
        name.append_domain(origin).ok()
    }
}

/// The reverse zone holding `ip`, keeping `units` leading octets (IPv4) or
/// nibbles (IPv6).
fn reverse_origin(ip: IpAddr, units: usize) -> Name {
    Name::from(ip).trim_to(units + 2)
}

fn in_subnet(ip: Ipv4Addr, subnet: Ipv4Addr, prefix: u8) -> bool {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0);
    u32::from(ip) & mask == u32::from(subnet) & mask
}

#[cfg(test)]
mod tests;
