//! Discovery (NADS on the control side): what a node that booted unknown
//! reported about its links is matched against, and what the admin's
//! policy lets that match do. The decision is a pure function, [`decide`];
//! [`store`] does the I/O around it (the discovery nonce, loading the
//! inventory, applying a bind in one transaction, the parked nodes).
//!
//! The rules, in the order [`decide`] applies them:
//! 1. Only the **boot MAC** (the one the discovery nonce is bound to) is
//!    ever bound: the nonce proves only that this MAC booted through
//!    `/ipxe/` on a provisioning segment. Its link is the report's link
//!    with that MAC; two links with it are a **duplicate** (a warning) and
//!    the node is parked.
//! 2. A boot MAC the inventory already holds on a NIC is bound already: on
//!    the NIC cabled to the port it was heard on, the node is matched
//!    (nothing changes); anywhere else it is **recabled** (or a cloned MAC):
//!    a warning on that system's timeline, and the node is parked. No
//!    policy rebinds a known MAC.
//! 3. The switch is found by the LLDP system name (the switch row's
//!    `hostname`, with or without its domain) or by the chassis ID (the
//!    row's management MAC or address, or its host name for a chassis ID
//!    that is a name). The port is found among the NICs cabled to that
//!    switch by [`mprov_lldp::port_parts`]: first by the port ID, then by the port
//!    description (a switch that sends a MAC or a local number as its port
//!    ID usually names the port there).
//! 4. Where the matched system has a `model` or `serial` set, the DMI facts
//!    reported must equal it (case and surrounding spaces aside); a
//!    mismatch is a warning and the node is parked.
//! 5. The [`Policy`]: `manual` parks everything (naming the match, for the
//!    admin); `open` binds the MAC to a matched NIC that has none;
//!    `permissive` also replaces a matched NIC's MAC, with a warning on
//!    the system's timeline. Anything else is parked with its reason.
//!
//! Port names are compared on `mprov_lldp`'s one comparable form (the
//! agent's pure LLDP crate, whose module `port` documents the rule: no
//! crate knows the vendors' spellings): the same path and media word, or
//! the same path where one side names no media; or, the seed's rule, a
//! typed bare number that is the heard path's last part.

pub mod store;

use std::fmt;

use mprov_api::nads::{Hardware, NadsReport, Neighbour};

/// What a match may bind without an admin: the process knob
/// `MPROV_DISCOVERY_POLICY`, defined with the configuration.
pub use crate::config::DiscoveryPolicy as Policy;

/// A switch of the inventory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Switch {
    /// Its id.
    pub id: i64,
    /// Its host name (its LLDP system name).
    pub hostname: String,
    /// Its management MAC, lower-case with colons.
    pub mgmt_mac: Option<String>,
    /// Its management address.
    pub mgmt_ip: Option<String>,
}

/// A NIC of the inventory, with where it is cabled and its system's
/// hardware facts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Nic {
    /// Its id.
    pub id: i64,
    /// Its name (`eno1`); may be empty.
    pub name: String,
    /// Its system's id.
    pub system_id: i64,
    /// Its system's host name.
    pub hostname: String,
    /// Its MAC, lower-case with colons.
    pub mac: Option<String>,
    /// The switch of its switch port.
    pub switch_id: Option<i64>,
    /// Its switch port's name.
    pub port: Option<String>,
    /// Its system's model, if set.
    pub model: Option<String>,
    /// Its system's serial, if set.
    pub serial: Option<String>,
}

impl Nic {
    fn label(&self) -> String {
        if self.name.is_empty() {
            format!("{} NIC {}", self.hostname, self.id)
        } else {
            format!("{} {}", self.hostname, self.name)
        }
    }
}

/// What [`decide`] reads of the inventory: every switch, and the NICs that
/// are cabled to a switch port or hold the report's boot MAC.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inventory {
    /// The switches.
    pub switches: Vec<Switch>,
    /// The NICs.
    pub nics: Vec<Nic>,
}

/// The NIC a report was matched to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The NIC's id.
    pub nic: i64,
    /// Its system's id.
    pub system_id: i64,
    /// Its system's host name.
    pub hostname: String,
    /// A label for people: `c01 eno1`.
    pub label: String,
}

impl Target {
    fn of(n: &Nic) -> Target {
        Target {
            nic: n.id,
            system_id: n.system_id,
            hostname: n.hostname.clone(),
            label: n.label(),
        }
    }
}

/// What a report leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The boot MAC is already on the NIC cabled to the port it was heard
    /// on: nothing changes.
    AlreadyBound(Target),
    /// Bind `mac` to the target NIC (replacing `replaces`, under
    /// `permissive`).
    Bind {
        /// The NIC.
        target: Target,
        /// The boot MAC.
        mac: String,
        /// The MAC the NIC had, which the bind replaces.
        replaces: Option<String>,
    },
    /// Park the node for an admin, saying why; `candidate` is the NIC it
    /// matched, if it matched one.
    Park {
        /// Why, in words an admin reads.
        reason: String,
        /// The match, for the admin's assignment.
        candidate: Option<Target>,
    },
}

/// Something an admin should see on a system's timeline (or, for no
/// system, the MAC's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// The report names the boot MAC on more than one link.
    DuplicateInReport {
        /// The MAC.
        mac: String,
        /// On how many links.
        links: usize,
    },
    /// The system's model or serial differs from what the node reported.
    HardwareMismatch {
        /// The matched NIC.
        target: Target,
        /// `model` or `serial`.
        what: &'static str,
        /// What the inventory says.
        expected: String,
        /// What the node reported (`None`: nothing).
        reported: Option<String>,
    },
    /// A MAC the inventory holds was heard somewhere else than its NIC's
    /// port.
    Recabled {
        /// The MAC.
        mac: String,
        /// The NIC that holds it.
        holder: Target,
        /// Where the inventory cables that NIC, if anywhere.
        known: Option<String>,
        /// Where it was heard, if anywhere.
        heard: Option<String>,
    },
    /// Under `permissive`, a NIC's MAC was replaced.
    Replaced {
        /// The NIC.
        target: Target,
        /// Its MAC before.
        old: String,
        /// Its MAC now.
        new: String,
    },
}

impl Warning {
    /// The system whose timeline shows it, if one.
    pub fn system_id(&self) -> Option<i64> {
        match self {
            Warning::DuplicateInReport { .. } => None,
            Warning::HardwareMismatch { target, .. }
            | Warning::Replaced { target, .. }
            | Warning::Recabled { holder: target, .. } => Some(target.system_id),
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::DuplicateInReport { mac, links } => write!(
                f,
                "discovery: the report names MAC {mac} on {links} links (a cloned or bonded MAC?); not bound, an admin decides"
            ),
            Warning::HardwareMismatch {
                target,
                what,
                expected,
                reported,
            } => write!(
                f,
                "discovery: a node heard on the port of {} reported {what} {}, but the system's {what} is {expected:?}; not bound, an admin decides",
                target.label,
                reported
                    .as_deref()
                    .map_or("nothing".to_owned(), |r| format!("{r:?}")),
            ),
            Warning::Recabled {
                mac,
                holder,
                known,
                heard,
            } => write!(
                f,
                "discovery: MAC {mac} of {} (cabled to {}) was heard on {}: recabled, or a duplicate MAC? Not rebound; fix the inventory or the cabling",
                holder.label,
                known.as_deref().unwrap_or("no switch port"),
                heard.as_deref().unwrap_or("no LLDP neighbour"),
            ),
            Warning::Replaced { target, old, new } => write!(
                f,
                "discovery: policy permissive replaced the MAC of {} ({old}) with {new}",
                target.label
            ),
        }
    }
}

/// The decision and what to warn about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What to do.
    pub decision: Decision,
    /// What goes on the timelines, whatever the decision.
    pub warnings: Vec<Warning>,
}

impl Outcome {
    fn park(reason: String, candidate: Option<Target>, warnings: Vec<Warning>) -> Outcome {
        Outcome {
            decision: Decision::Park { reason, candidate },
            warnings,
        }
    }
}

/// A MAC in the stored form (lower-case, colons), or the text lower-cased.
fn mac_form(s: &str) -> String {
    crate::db::crud::parse_mac(s).unwrap_or_else(|_| s.trim().to_ascii_lowercase())
}

/// Where a neighbour is, for people: `switch sw1 port Ethernet1/1`.
fn place(n: &Neighbour) -> String {
    let switch = n
        .system_name
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or(&n.chassis_id);
    format!("switch {switch} port {}", n.port_id)
}

/// Decides what `report` leads to under `policy`, given `inventory`.
/// Pure; see the module docs for the rules.
pub fn decide(report: &NadsReport, inventory: &Inventory, policy: Policy) -> Outcome {
    let mac = mac_form(&report.boot_mac);
    let boot_links: Vec<_> = report
        .links
        .iter()
        .filter(|l| mac_form(&l.mac) == mac)
        .collect();
    let mut warnings = Vec::new();
    if boot_links.len() > 1 {
        warnings.push(Warning::DuplicateInReport {
            mac: mac.clone(),
            links: boot_links.len(),
        });
        return Outcome::park(
            format!(
                "the boot MAC {mac} is on {} links of the report",
                boot_links.len()
            ),
            None,
            warnings,
        );
    }
    let heard = boot_links.first().and_then(|l| l.neighbour.as_ref());
    let matched = heard.map(|n| match_port(inventory, n));

    // A MAC the inventory holds is never rebound.
    if let Some(holder) = inventory
        .nics
        .iter()
        .find(|n| n.mac.as_deref() == Some(&mac))
    {
        if let Some(Ok(nic)) = &matched
            && nic.id == holder.id
        {
            return Outcome {
                decision: Decision::AlreadyBound(Target::of(holder)),
                warnings,
            };
        }
        let known = cabled(inventory, holder);
        warnings.push(Warning::Recabled {
            mac: mac.clone(),
            holder: Target::of(holder),
            known: known.clone(),
            heard: heard.map(place),
        });
        return Outcome::park(
            format!(
                "MAC {mac} belongs to {} (cabled to {}) but was heard on {}: recabled? Not rebound",
                holder.label(),
                known.as_deref().unwrap_or("no switch port"),
                heard.map_or("no LLDP neighbour".to_owned(), place),
            ),
            None,
            warnings,
        );
    }

    let Some(neighbour) = heard else {
        let why = if boot_links.is_empty() {
            format!("the report has no link with the boot MAC {mac}")
        } else {
            format!(
                "the boot link ({}) heard no LLDP neighbour (its NIC may swallow LLDP in firmware)",
                boot_links[0].interface
            )
        };
        return Outcome::park(why, None, warnings);
    };
    let nic = match match_port(inventory, neighbour) {
        Ok(nic) => nic,
        Err(why) => return Outcome::park(why, None, warnings),
    };
    let target = Target::of(nic);

    for (what, expected, reported) in [
        ("model", &nic.model, &report.hardware.model),
        ("serial", &nic.serial, &report.hardware.serial),
    ] {
        let Some(expected) = expected.as_deref().map(str::trim).filter(|e| !e.is_empty()) else {
            continue;
        };
        let same = reported
            .as_deref()
            .is_some_and(|r| r.trim().eq_ignore_ascii_case(expected));
        if !same {
            warnings.push(Warning::HardwareMismatch {
                target: target.clone(),
                what,
                expected: expected.to_owned(),
                reported: reported.clone(),
            });
            return Outcome::park(
                format!(
                    "heard on the port of {}, but its {what} {expected:?} does not match the reported {}",
                    target.label,
                    reported
                        .as_deref()
                        .map_or("(none)".to_owned(), |r| format!("{r:?}"))
                ),
                Some(target),
                warnings,
            );
        }
    }

    match (policy, &nic.mac) {
        (Policy::Manual, _) => Outcome::park(
            format!(
                "matches {} at {}; policy manual: waiting for an admin to assign it",
                target.label,
                place(neighbour)
            ),
            Some(target),
            warnings,
        ),
        (Policy::Open | Policy::Permissive, None) => Outcome {
            decision: Decision::Bind {
                target,
                mac,
                replaces: None,
            },
            warnings,
        },
        (Policy::Open, Some(old)) => Outcome::park(
            format!(
                "matches {} at {}, which has MAC {old} already; policy open binds only to a NIC without one",
                target.label,
                place(neighbour)
            ),
            Some(target),
            warnings,
        ),
        (Policy::Permissive, Some(old)) => {
            warnings.push(Warning::Replaced {
                target: target.clone(),
                old: old.clone(),
                new: mac.clone(),
            });
            Outcome {
                decision: Decision::Bind {
                    target,
                    mac,
                    replaces: Some(old.clone()),
                },
                warnings,
            }
        }
    }
}

/// Where the inventory cables `nic`, for people.
fn cabled(inventory: &Inventory, nic: &Nic) -> Option<String> {
    let switch = inventory
        .switches
        .iter()
        .find(|s| Some(s.id) == nic.switch_id)?;
    Some(format!(
        "switch {} port {}",
        switch.hostname,
        nic.port.as_deref().unwrap_or("?")
    ))
}

/// The switches `n` names, by system name first, else by chassis ID.
fn find_switches<'a>(inventory: &'a Inventory, n: &Neighbour) -> Vec<&'a Switch> {
    let short = |s: &str| s.split('.').next().unwrap_or(s).to_ascii_lowercase();
    if let Some(name) = n
        .system_name
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let found: Vec<&Switch> = inventory
            .switches
            .iter()
            .filter(|s| s.hostname.eq_ignore_ascii_case(name) || short(&s.hostname) == short(name))
            .collect();
        if !found.is_empty() {
            return found;
        }
    }
    let chassis = n.chassis_id.trim();
    if chassis.is_empty() {
        return Vec::new();
    }
    let as_mac = crate::db::crud::parse_mac(chassis).ok();
    inventory
        .switches
        .iter()
        .filter(|s| {
            (as_mac.is_some() && s.mgmt_mac.as_deref().map(mac_form) == as_mac)
                || s.mgmt_ip.as_deref() == Some(chassis)
                || s.hostname.eq_ignore_ascii_case(chassis)
                || short(&s.hostname) == short(chassis)
        })
        .collect()
}

/// The NIC cabled to the port `n` describes, or why there is none.
fn match_port<'a>(inventory: &'a Inventory, n: &Neighbour) -> Result<&'a Nic, String> {
    let switches = find_switches(inventory, n);
    let switch = match switches.as_slice() {
        [] => {
            return Err(format!(
                "switch {} (chassis ID {} {}) is not in the inventory",
                n.system_name.as_deref().unwrap_or("(no system name)"),
                n.chassis_id_subtype,
                n.chassis_id
            ));
        }
        [one] => *one,
        many => {
            let names: Vec<&str> = many.iter().map(|s| s.hostname.as_str()).collect();
            return Err(format!(
                "the LLDP neighbour matches several switches ({}); not bound",
                names.join(", ")
            ));
        }
    };
    let on_switch: Vec<&Nic> = inventory
        .nics
        .iter()
        .filter(|nic| nic.switch_id == Some(switch.id))
        .collect();
    let spellings = std::iter::once(n.port_id.as_str()).chain(n.port_description.as_deref());
    for heard in spellings {
        for strength in [Strength::Exact, Strength::Suffix] {
            let found: Vec<&Nic> = on_switch
                .iter()
                .copied()
                .filter(|nic| {
                    nic.port
                        .as_deref()
                        .is_some_and(|p| port_match(p, heard) >= Some(strength))
                })
                .collect();
            match found.as_slice() {
                [] => {}
                [one] => return Ok(one),
                many => {
                    let labels: Vec<String> = many.iter().map(|n| n.label()).collect();
                    return Err(format!(
                        "port {heard} of switch {} matches several NICs ({}); not bound",
                        switch.hostname,
                        labels.join(", ")
                    ));
                }
            }
        }
    }
    Err(format!(
        "no NIC in the inventory is cabled to switch {} port {}{}",
        switch.hostname,
        n.port_id,
        n.port_description
            .as_deref()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default()
    ))
}

/// How well two port names match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Strength {
    /// The inventory names only the last number of the port heard (the
    /// seed's rule: "the port id after the last `/`").
    Suffix,
    /// The same port, whatever the vendor's spelling; or the same numbers
    /// where one side names no interface type.
    Exact,
}

/// How `inventory` (a switch port's name as typed) matches `heard` (as
/// LLDP said it), if at all, on the parts of their one comparable form
/// ([`mprov_lldp::port_parts`], the rule the agent's crate documents).
fn port_match(inventory: &str, heard: &str) -> Option<Strength> {
    let (ti, pi) = mprov_lldp::port_parts(inventory);
    let (th, ph) = mprov_lldp::port_parts(heard);
    if pi.is_empty() || ph.is_empty() {
        // No numbers: only the same words match.
        return (!ti.is_empty() && ti == th && pi == ph).then_some(Strength::Exact);
    }
    let typeless = ti.is_empty() || th.is_empty();
    if pi == ph && (ti == th || typeless) {
        return Some(Strength::Exact);
    }
    let last = ph.rsplit('/').next();
    if ti.is_empty() && pi.chars().all(|c| c.is_ascii_digit()) && last == Some(pi.as_str()) {
        return Some(Strength::Suffix);
    }
    None
}

/// The text of a [`Hardware`] for people: `vendor model (serial)`.
pub fn hardware_text(h: &Hardware) -> String {
    let mut out: Vec<&str> = [&h.vendor, &h.model]
        .into_iter()
        .filter_map(|v| v.as_deref())
        .filter(|v| !v.is_empty())
        .collect();
    let serial = h.serial.as_deref().filter(|s| !s.is_empty());
    let serial = serial.map(|s| format!("(serial {s})"));
    if let Some(s) = &serial {
        out.push(s);
    }
    out.join(" ")
}

#[cfg(test)]
mod tests;
