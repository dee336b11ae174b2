//! A job server's own row: its registration and its heartbeats, each made
//! with its enrolled certificate, whose name is the row's name (the HTTP
//! side is `http::boot`; who may call is [`crate::access::own_jobserver`] and
//! [`crate::access::heartbeat_from`]).
//!
//! **Registration** (`POST /api/v1/jobserver/register`,
//! [`REGISTER_PATH`](mprov_api::jobs::REGISTER_PATH)) is one transaction
//! that bumps the inventory revision. The row is found ([`plan`], pure):
//!
//! 1. by the host id the job server keeps beside its config: a host renamed
//!    since (its new certificate names another name) keeps its row, id,
//!    hosting records and jobs, renamed to the new name. Only a row whose
//!    name holds no live certificate (unrevoked and unexpired) is taken over
//!    so: otherwise a second machine sending the first's host id would take
//!    its row, and the first still holds a valid certificate for it;
//! 2. else by name: a row an administrator made by hand, which gets the
//!    host id; a row of that name registered from another host id is a
//!    conflict (the message says what the administrator can do);
//! 3. else a new row.
//!
//! Then its modules, port and addresses are set. An address names its
//! network, or is placed on the network whose subnet holds it (the most
//! specific; [`place`]), or on none (nodes are never sent there). The
//! addresses are kept in `jobserver_addresses`, one row each with its own
//! heartbeat; an address registered again keeps its heartbeat. The row's
//! `addresses` list mirrors them and its `network` is the first placed
//! address's (unchanged when none is placed), so readers of the row alone
//! keep working. A job server registers at most
//! [`REGISTRATIONS_PER_MINUTE`] times a minute (the HTTP layer's budget).
//!
//! **Heartbeats** ([`heartbeat`]): one per address, each stamping that
//! address's row (time, load, image streams) and the job server's row (time,
//! load). A heartbeat naming an address the job server did not register is
//! refused ([`Beat::NotRegistered`]); one naming none stamps the row only,
//! as before registration existed. Heartbeats are no edits: no revision, no
//! `updated_at`.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};

use mprov_api::boot::Heartbeat;
use mprov_api::jobs::{AddressRegistration, Registered, Registration};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use crate::boot::in_subnet;
use crate::db::{Db, Engine, Val, int, opt_int};
use crate::time::now;

/// How many registrations a minute one job server may make (it registers
/// at start and when its addresses change); beyond it, 429. Each bumps the
/// inventory revision, which wakes every job server's long-poll, so a job
/// server looping on it must not churn the others.
pub const REGISTRATIONS_PER_MINUTE: u32 = 6;
/// The most addresses one job server registers.
pub const MAX_ADDRESSES: usize = 64;
/// The most job modules one job server registers.
pub const MAX_MODULES: usize = 64;
/// The longest host id.
pub const MAX_HOST_ID: usize = 255;
/// The longest module name.
pub const MAX_MODULE: usize = 64;

/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The database failed.
    #[error("job server registration database")]
    Db(#[from] sqlx::Error),
    /// The host id is another row's, whose certificate is still valid.
    #[error(
        "this host id is registered as job server {old}, whose certificate is still valid, so {new} cannot take its row over: if this host was renamed from {old} to {new}, an administrator revokes {old}'s certificate (POST /api/v1/credentials/{{id}}/revoke) and the job server registers again; if it is another machine, give it its own hostId"
    )]
    HostIdHeld {
        /// The row's name.
        old: String,
        /// The certificate's name.
        new: String,
    },
    /// The host id is one row's and the name another's.
    #[error(
        "this host id is registered as job server {old}, and a job server row named {new} exists too: an administrator deletes one of them (mash jobservers delete NAME) and the job server registers again"
    )]
    HostIdAndNameSplit {
        /// The row the host id names.
        old: String,
        /// The certificate's name, another row's.
        new: String,
    },
    /// A field is wrong.
    #[error("{field}: {message}")]
    Invalid {
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A row of this name was registered from another host.
    #[error(
        "job server {name} is registered from another host (another host id): if this machine replaces it, set its hostId to the old one, or have an administrator delete the row {name} (its hosting records and jobs go with it) so it registers afresh; if it is another machine, enroll it under another name"
    )]
    NameHeld {
        /// The name.
        name: String,
    },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> RegisterError {
    RegisterError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// A job-server row, as registration finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// Its host id, once registered.
    pub host_id: Option<String>,
}

/// What a registration does to the rows ([`plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// A new row.
    Create,
    /// The row renamed from `from` to the certificate's name.
    Rename {
        /// Its id.
        id: i64,
        /// Its old name.
        from: String,
    },
    /// The row as it is named (its host id set, if it had none).
    Update(i64),
}

/// Which row the job server named `name` registers as, given the row its
/// host id names (`by_host`), the row its name names (`by_name`) and
/// whether `by_host`'s name still holds a live certificate (see the module
/// docs). Pure.
pub fn plan(
    name: &str,
    by_host: Option<&Found>,
    by_name: Option<&Found>,
    by_host_live: bool,
) -> Result<Plan, RegisterError> {
    match (by_host, by_name) {
        (Some(h), _) if h.name == name => Ok(Plan::Update(h.id)),
        (Some(h), Some(_)) => Err(RegisterError::HostIdAndNameSplit {
            old: h.name.clone(),
            new: name.to_owned(),
        }),
        (Some(h), None) if by_host_live => Err(RegisterError::HostIdHeld {
            old: h.name.clone(),
            new: name.to_owned(),
        }),
        (Some(h), None) => Ok(Plan::Rename {
            id: h.id,
            from: h.name.clone(),
        }),
        (None, Some(n)) if n.host_id.is_none() => Ok(Plan::Update(n.id)),
        (None, Some(n)) => Err(RegisterError::NameHeld {
            name: n.name.clone(),
        }),
        (None, None) => Ok(Plan::Create),
    }
}

/// Checks a registration's values. Pure.
pub fn check(reg: &Registration) -> Result<(), RegisterError> {
    let id = &reg.host_id;
    if id.is_empty() || id.len() > MAX_HOST_ID || !id.chars().all(|c| c.is_ascii_graphic()) {
        return Err(invalid(
            "host_id",
            format!("1 to {MAX_HOST_ID} printable ASCII characters without spaces"),
        ));
    }
    if reg.port == 0 {
        return Err(invalid("port", "a port from 1 to 65535"));
    }
    if reg.modules.len() > MAX_MODULES {
        return Err(invalid("modules", format!("at most {MAX_MODULES}")));
    }
    for (i, m) in reg.modules.iter().enumerate() {
        if m.is_empty() || m.len() > MAX_MODULE || !m.chars().all(|c| c.is_ascii_graphic()) {
            return Err(invalid(
                format!("modules[{i}]"),
                format!("1 to {MAX_MODULE} printable ASCII characters without spaces"),
            ));
        }
    }
    if reg.addresses.len() > MAX_ADDRESSES {
        return Err(invalid("addresses", format!("at most {MAX_ADDRESSES}")));
    }
    let mut seen = HashSet::new();
    for (i, a) in reg.addresses.iter().enumerate() {
        if a.address.is_unspecified() || a.address.is_multicast() {
            return Err(invalid(
                format!("addresses[{i}].address"),
                format!("{} is no address nodes can reach", a.address),
            ));
        }
        if !seen.insert(a.address) {
            return Err(invalid(
                format!("addresses[{i}].address"),
                format!("{} is listed twice", a.address),
            ));
        }
    }
    Ok(())
}

/// A network as placement reads it: id, subnet, prefix.
pub type Subnet = (i64, Ipv4Addr, u8);

/// The network `address` is placed on when it names none: the most specific
/// one whose subnet holds it (the lowest id among equals); `None` when none
/// does (an IPv6 address, say). Pure.
pub fn place(address: IpAddr, networks: &[Subnet]) -> Option<i64> {
    networks
        .iter()
        .filter(|(_, net, prefix)| in_subnet(address, (*net, *prefix)))
        .max_by(|a, b| a.2.cmp(&b.2).then(b.0.cmp(&a.0)))
        .map(|(id, _, _)| *id)
}

fn text(row: &AnyRow, col: &str) -> Result<Option<String>, sqlx::Error> {
    row.try_get::<Option<String>, _>(col)
}

async fn find(
    db: &Db,
    conn: &mut AnyConnection,
    column: &str,
    value: &str,
) -> Result<Option<Found>, sqlx::Error> {
    let mut q = db.sql();
    q.push("SELECT id, name, host_id FROM jobservers WHERE ")
        .push(column)
        .push(" = ")
        .bind(Val::Text(Some(value.to_owned())));
    let Some(r) = q.query().fetch_optional(&mut *conn).await? else {
        return Ok(None);
    };
    Ok(Some(Found {
        id: int(&r, "id")?,
        name: text(&r, "name")?.unwrap_or_default(),
        host_id: text(&r, "host_id")?.filter(|h| !h.is_empty()),
    }))
}

/// Whether job server `name` holds a certificate that is neither revoked
/// nor expired.
async fn live_certificate(
    db: &Db,
    conn: &mut AnyConnection,
    name: &str,
) -> Result<bool, sqlx::Error> {
    let mut q = db.sql();
    q.push("SELECT COUNT(*) AS n FROM credentials WHERE revoked_at IS NULL AND kind = ")
        .bind(Val::Text(Some("jobserver".into())))
        .push(" AND identity = ")
        .bind(Val::Text(Some(name.to_owned())))
        .push(" AND not_after > ")
        .bind(Val::Text(Some(now())));
    Ok(int(&q.query().fetch_one(&mut *conn).await?, "n")? > 0)
}

/// Registers the job server whose certificate names `name` (see the module
/// docs): its row, found or made, with the addresses placed on networks.
pub async fn register(
    db: &Db,
    name: &str,
    reg: &Registration,
) -> Result<Registered, RegisterError> {
    check(reg)?;
    let mut tx = db.pool().begin().await?;
    // First, as every inventory write does (`db::crud`): on SQLite it takes
    // the write lock up front, so two writers queue instead of deadlocking.
    sqlx::query("UPDATE inventory_revision SET revision = revision + 1 WHERE id = 1")
        .execute(&mut *tx)
        .await?;
    let by_host = find(db, &mut tx, "host_id", &reg.host_id).await?;
    let by_name = find(db, &mut tx, "name", name).await?;
    let by_host_live = match &by_host {
        Some(h) if h.name != name => live_certificate(db, &mut tx, &h.name).await?,
        _ => false,
    };
    let plan = plan(name, by_host.as_ref(), by_name.as_ref(), by_host_live)?;

    let mut q = db.sql();
    q.push("SELECT id, subnet, netmask FROM networks ORDER BY id");
    let mut networks: Vec<Subnet> = Vec::new();
    for r in q.query().fetch_all(&mut *tx).await? {
        let subnet = text(&r, "subnet")?.and_then(|s| s.parse().ok());
        let prefix = opt_int(&r, "netmask")?.and_then(|p| u8::try_from(p).ok());
        if let (Some(subnet), Some(prefix)) = (subnet, prefix) {
            networks.push((int(&r, "id")?, subnet, prefix));
        }
    }
    let known: HashSet<i64> = networks.iter().map(|n| n.0).collect();
    let mut placed = Vec::with_capacity(reg.addresses.len());
    for (i, a) in reg.addresses.iter().enumerate() {
        let network = match a.network {
            Some(id) if known.contains(&id) => Some(id),
            Some(id) => {
                return Err(invalid(
                    format!("addresses[{i}].network"),
                    format!("no network has id {id}"),
                ));
            }
            None => place(a.address, &networks),
        };
        placed.push(AddressRegistration {
            address: a.address,
            network,
        });
    }
    let listed: Vec<String> = placed.iter().map(|a| a.address.to_string()).collect();
    let addresses = serde_json::to_string(&listed).unwrap_or_else(|_| "[]".into());
    let modules = serde_json::to_string(&reg.modules).unwrap_or_else(|_| "[]".into());
    let network = placed.iter().find_map(|a| a.network);
    let stamp = now();

    let id = match &plan {
        Plan::Create => {
            let mut ins = db.sql();
            ins.push("INSERT INTO jobservers (name, host_id, addresses, port, modules, network_id, load_avg, created_at, updated_at) VALUES ")
                .bind_list([
                    Val::Text(Some(name.to_owned())),
                    Val::Text(Some(reg.host_id.clone())),
                    Val::Text(Some(addresses)),
                    Val::Int(Some(i64::from(reg.port))),
                    Val::Text(Some(modules)),
                    Val::Int(network),
                    Val::Float(Some(0.0)),
                    Val::Text(Some(stamp.clone())),
                    Val::Text(Some(stamp)),
                ]);
            if db.engine() == Engine::Mysql {
                let done = ins.query().execute(&mut *tx).await?;
                done.last_insert_id()
                    .ok_or_else(|| sqlx::Error::Protocol("the insert returned no id".into()))?
            } else {
                ins.push(" RETURNING id");
                int(&ins.query().fetch_one(&mut *tx).await?, "id")?
            }
        }
        Plan::Rename { id, .. } | Plan::Update(id) => {
            let mut up = db.sql();
            up.push("UPDATE jobservers SET name = ")
                .bind(Val::Text(Some(name.to_owned())))
                .push(", host_id = ")
                .bind(Val::Text(Some(reg.host_id.clone())))
                .push(", addresses = ")
                .bind(Val::Text(Some(addresses)))
                .push(", port = ")
                .bind(Val::Int(Some(i64::from(reg.port))))
                .push(", modules = ")
                .bind(Val::Text(Some(modules)))
                .push(", updated_at = ")
                .bind(Val::Text(Some(stamp)));
            if network.is_some() {
                up.push(", network_id = ").bind(Val::Int(network));
            }
            up.push(" WHERE id = ").bind(Val::Int(Some(*id)));
            up.query().execute(&mut *tx).await?;
            *id
        }
    };
    if let Plan::Rename { from, .. } = &plan {
        // The old name's certificates, which are dead already (else the
        // plan refused): revoked, as a rename through the API does, so none
        // can pass for a row named so later. The caller's certificate
        // names the new name and stays valid.
        let mut rv = db.sql();
        rv.push("UPDATE credentials SET revoked_at = ")
            .bind(Val::Text(Some(now())))
            .push(", revoke_reason = ")
            .bind(Val::Text(Some(format!("renamed to {name}"))))
            .push(" WHERE revoked_at IS NULL AND kind = ")
            .bind(Val::Text(Some("jobserver".into())))
            .push(" AND identity = ")
            .bind(Val::Text(Some(from.clone())));
        rv.query().execute(&mut *tx).await?;
        tracing::info!(from = %from, to = %name, "jobservers: a registered host was renamed; its row follows it");
    }
    sync_addresses(db, &mut tx, id, &placed).await?;
    tx.commit().await?;
    Ok(Registered {
        id,
        name: name.to_owned(),
        addresses: placed,
    })
}

/// Makes job server `id`'s address rows `placed`: those no longer listed go,
/// new ones come (never heartbeated), and those listed again keep their
/// heartbeat with their network updated.
async fn sync_addresses(
    db: &Db,
    conn: &mut AnyConnection,
    id: i64,
    placed: &[AddressRegistration],
) -> Result<(), sqlx::Error> {
    let mut q = db.sql();
    q.push("SELECT id, address FROM jobserver_addresses WHERE jobserver_id = ")
        .bind(Val::Int(Some(id)));
    let mut stored: Vec<(i64, String)> = Vec::new();
    for r in q.query().fetch_all(&mut *conn).await? {
        stored.push((int(&r, "id")?, text(&r, "address")?.unwrap_or_default()));
    }
    let wanted: Vec<String> = placed.iter().map(|a| a.address.to_string()).collect();
    let gone: Vec<Val> = stored
        .iter()
        .filter(|(_, a)| !wanted.contains(a))
        .map(|(row, _)| Val::Int(Some(*row)))
        .collect();
    if !gone.is_empty() {
        let mut del = db.sql();
        del.push("DELETE FROM jobserver_addresses WHERE id IN ")
            .bind_list(gone);
        del.query().execute(&mut *conn).await?;
    }
    for (a, text) in placed.iter().zip(&wanted) {
        let mut w = db.sql();
        match stored.iter().find(|(_, s)| s == text) {
            Some((row, _)) => {
                w.push("UPDATE jobserver_addresses SET network_id = ")
                    .bind(Val::Int(a.network))
                    .push(" WHERE id = ")
                    .bind(Val::Int(Some(*row)));
            }
            None => {
                w.push("INSERT INTO jobserver_addresses (jobserver_id, address, network_id, load_avg, streams) VALUES ")
                    .bind_list([
                        Val::Int(Some(id)),
                        Val::Text(Some(text.clone())),
                        Val::Int(a.network),
                        Val::Float(Some(0.0)),
                        Val::Int(Some(0)),
                    ]);
            }
        }
        w.query().execute(&mut *conn).await?;
    }
    Ok(())
}

/// What a heartbeat stamped ([`heartbeat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// No job server has the name (its row was deleted).
    NoJobServer,
    /// The job server did not register the address it names.
    NotRegistered(IpAddr),
    /// Stored.
    Stamped,
}

/// Stores a heartbeat of the job server named `name` (see the module docs).
pub async fn heartbeat(db: &Db, name: &str, beat: &Heartbeat) -> Result<Beat, sqlx::Error> {
    let at = now();
    if let Some(address) = beat.address {
        let mut q = db.sql();
        q.push("UPDATE jobserver_addresses SET heartbeat_at = ")
            .bind(Val::Text(Some(at.clone())))
            .push(", load_avg = ")
            .bind(Val::Float(Some(beat.load_avg)))
            .push(", streams = ")
            .bind(Val::Int(Some(i64::from(beat.streams))))
            .push(" WHERE address = ")
            .bind(Val::Text(Some(address.to_string())))
            .push(" AND jobserver_id IN (SELECT id FROM jobservers WHERE name = ")
            .bind(Val::Text(Some(name.to_owned())))
            .push(")");
        if q.query().execute(db.pool()).await?.rows_affected() == 0 {
            let mut known = db.sql();
            known
                .push("SELECT id FROM jobservers WHERE name = ")
                .bind(Val::Text(Some(name.to_owned())));
            return Ok(match known.query().fetch_optional(db.pool()).await? {
                Some(_) => Beat::NotRegistered(address),
                None => Beat::NoJobServer,
            });
        }
    }
    let mut q = db.sql();
    q.push("UPDATE jobservers SET load_avg = ")
        .bind(Val::Float(Some(beat.load_avg)))
        .push(", heartbeat_at = ")
        .bind(Val::Text(Some(at)))
        .push(" WHERE name = ")
        .bind(Val::Text(Some(name.to_owned())));
    let done = q.query().execute(db.pool()).await?;
    Ok(if done.rows_affected() == 1 {
        Beat::Stamped
    } else {
        Beat::NoJobServer
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, name: &str, host: Option<&str>) -> Found {
        Found {
            id,
            name: name.into(),
            host_id: host.map(str::to_owned),
        }
    }

    #[test]
    fn a_registration_finds_its_row_by_host_id_then_by_name() {
        let mine = row(1, "js1", Some("h1"));
        // Registered before: the same row.
        assert_eq!(
            plan("js1", Some(&mine), Some(&mine), false).unwrap(),
            Plan::Update(1)
        );
        // Renamed host, the old name's certificate dead: the row follows.
        assert_eq!(
            plan("js9", Some(&mine), None, false).unwrap(),
            Plan::Rename {
                id: 1,
                from: "js1".into()
            }
        );
        // ... but not while the old name's certificate lives: a second
        // machine cannot take a row over by sending its host id.
        let err = plan("js9", Some(&mine), None, true).unwrap_err();
        assert!(matches!(err, RegisterError::HostIdHeld { .. }));
        assert!(
            err.to_string().contains("revokes js1's certificate"),
            "{err}"
        );
        // The host id names one row, the name another.
        let other = row(2, "js9", None);
        assert!(matches!(
            plan("js9", Some(&mine), Some(&other), false),
            Err(RegisterError::HostIdAndNameSplit { .. })
        ));
        // A row made by hand: it gets the host id.
        assert_eq!(
            plan("js9", None, Some(&other), false).unwrap(),
            Plan::Update(2)
        );
        // A row of that name registered from another host.
        let theirs = row(3, "js3", Some("h3"));
        let err = plan("js3", None, Some(&theirs), false).unwrap_err();
        assert!(matches!(err, RegisterError::NameHeld { .. }));
        assert!(err.to_string().contains("hostId"), "{err}");
        assert_eq!(plan("js4", None, None, false).unwrap(), Plan::Create);
    }

    #[test]
    fn addresses_go_on_the_most_specific_network_holding_them() {
        let nets: &[Subnet] = &[
            (1, "10.0.0.0".parse().unwrap(), 16),
            (2, "10.0.5.0".parse().unwrap(), 24),
            (3, "10.0.5.0".parse().unwrap(), 24),
            (4, "192.168.1.0".parse().unwrap(), 24),
        ];
        let at = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(place(at("10.0.5.9"), nets), Some(2));
        assert_eq!(place(at("10.0.6.9"), nets), Some(1));
        assert_eq!(place(at("192.168.1.1"), nets), Some(4));
        assert_eq!(place(at("172.16.0.1"), nets), None);
        assert_eq!(place(at("fd00::1"), nets), None);
    }

    #[test]
    fn registrations_are_checked() {
        let good = Registration {
            host_id: "5f0c2a".into(),
            modules: vec!["dnsmasq".into()],
            port: 8081,
            addresses: vec![AddressRegistration {
                address: "10.0.0.2".parse().unwrap(),
                network: None,
            }],
        };
        assert!(check(&good).is_ok());
        let field = |r: Registration| match check(&r) {
            Err(RegisterError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        for bad in ["", "a b", &"x".repeat(256)] {
            let r = Registration {
                host_id: bad.into(),
                ..good.clone()
            };
            assert_eq!(field(r), "host_id");
        }
        let mut r = good.clone();
        r.port = 0;
        assert_eq!(field(r), "port");
        let mut r = good.clone();
        r.modules.push(String::new());
        assert_eq!(field(r), "modules[1]");
        let mut r = good.clone();
        r.addresses.push(r.addresses[0].clone());
        assert_eq!(field(r), "addresses[1].address");
        for nowhere in ["0.0.0.0", "224.0.0.1", "::"] {
            let mut r = good.clone();
            r.addresses[0].address = nowhere.parse().unwrap();
            assert_eq!(field(r), "addresses[0].address");
        }
        let mut r = good.clone();
        r.addresses = (0..=MAX_ADDRESSES)
            .map(|i| AddressRegistration {
                address: IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i as u32 + 1)),
                network: None,
            })
            .collect();
        assert_eq!(field(r), "addresses");
    }
}
