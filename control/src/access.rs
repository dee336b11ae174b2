//! What each principal may reach, checked after authentication and the
//! version lock, before any handler runs.
//!
//! - Admins (admin users, API keys other than the shared one): everything.
//! - Read-only users: every read.
//! - A **node's** certificate: only what a node does to itself: its own
//!   system row and effective config, its own NICs and BMC entries (read),
//!   and renewing its certificate. It may write only the fields its kind's
//!   [`node_writable`](kinds::Kind::node_writable) lists of its own objects,
//!   checked on the body by
//!   [`check_fields`]: what a node reports about itself (boot events, script
//!   results, status and facts), never who it is or what it boots (its
//!   system, host name, groups, image, kernel command line, aliases, NIC
//!   ownership or BMC settings).
//! - A **job server's** certificate: every inventory read except accounts
//!   and credentials, its registration (its own row, the one its
//!   certificate names, through `POST /api/v1/jobserver/register`), its
//!   heartbeats (load and streams, on its own row and its registered
//!   addresses, through `POST /api/v1/boot/heartbeat`), claiming jobs and
//!   recording the image versions it hosts (for itself only:
//!   [`own_jobserver`]), the jobs it claimed, which images it hosts
//!   (`/api/v1/images/{key}/hosts/{itself}`),
//!   and renewing its certificate. What it may write of a kind is the
//!   kind's [`jobserver_writes`](kinds::Kind::jobserver_writes).
//! - The old **shared API key**, per `MPROV_SHARED_KEY_MODE`: `all` as an
//!   admin (the default, warned about at start), `nodes` only the node-self
//!   paths above (for any node: the key cannot say which), `off` refused.
//!
//! The HTTP layer hands [`check`] the request's [`Target`], parsed from the
//! router's shapes (`<kind>/<key>` under the API root); an object a node
//! does not own is answered 403 without saying whether it exists elsewhere.
//! Which paths anyone may reach is no rule of this module: the router serves
//! them from its public part, which [`check`] never sees
//! ([`crate::http::router`]).
//!
//! The boot timeline, the boot manifest, the heartbeat and renewal are
//! decided per request by the rules below [`BootRole`] and [`may_renew`]:
//! what the request names (a boot phase, a node, a MAC) is in its body or
//! query, so the handler asks these functions once it has parsed them.
//!
//! - A **node** reports the phases [`node_phase`] lists, about its own system
//!   only (naming another system or another system's MAC is refused, not
//!   rewritten); it reads its own timeline and its own manifest.
//! - A **job server** reports the phases [`jobserver_phase`] lists about any
//!   node, and only its reports attest `/ipxe/` requests
//!   ([`Reporter::attesting_jobserver`]): only its own certificate says
//!   which job server reports. It reads every timeline, and it alone
//!   registers and sends heartbeats, for the row its certificate names
//!   ([`own_jobserver`], [`heartbeat_from`]).
//! - **Admins** report any phase but `script_served` (which `/ipxe/` records
//!   itself) about any node, and read any node's manifest by naming it.
//! - **Read-only users** read every timeline and write none.
//! - The **shared API key** in `all` mode is an admin; otherwise it cannot
//!   say which node it speaks for, and is refused.
//! - Renewal is for the holder of an agent certificate only.
//! - A job server enrolls with its one-time token, or without one on an
//!   admin's credentials (the seed's `apikey`): [`may_enroll_jobserver`].
//!
//! The script-runner's calls ([`plan_scope`], [`content_scope`],
//! [`results_from`]) follow the same roles:
//!
//! - A **node** gets its own system's post-boot plan, which its certificate
//!   names (it names no system: naming one, even itself, is refused), the
//!   content of the scripts of that plan only, and reports its own run,
//!   which goes on its own timeline only (a report names no node).
//! - A **job server** gets any image's image-gen plan and any script's
//!   content, and reports image-gen runs (stored, on no node's timeline).
//! - **Admins** and **read-only users** read any plan (a node's by naming
//!   it, `?system=`) and any content, and report nothing: results come from
//!   the certificate that ran the scripts.
//! - Asking a node to run its scripts again
//!   (`POST /api/v1/systems/{key}/run-scripts`) is an inventory write to the
//!   system: [`check`] lets admins only (a node's certificate writes nothing
//!   there, a job server's writes no system).

use mprov_api::boot::BootPhase;
use mprov_api::scripts::ScriptMode;
use serde_json::Value;

use crate::boot::{jobserver_phase, node_phase};
use crate::config::SharedKeyMode;
use crate::db::Db;
use crate::db::crud::ListQuery;
use crate::db::kinds::{self, JobServerWrite, Kind, NodeAccess, Ty};
use crate::identity::{Machine, Principal};

/// Why a principal may not make a request. The HTTP layer maps each to its
/// status and message (`From<AccessError> for ApiError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// A request without credentials reached a rule that needs them.
    #[error("no credentials")]
    Anonymous,
    /// A read-only account tried to write boot events.
    #[error("a read-only account cannot write boot events")]
    BootEventsReadOnly,
    /// An inventory rule refused it, with what the principal may do.
    #[error("{0}")]
    Forbidden(String),
    /// A job server enrolled without a token and without credentials.
    #[error("a job server enrolled without a token or credentials")]
    EnrollNeedsCredential,
    /// A job server enrolled without a token, with the credentials of
    /// `who`, who is no admin.
    #[error("{who} enrolled a job server without a token")]
    EnrollNeedsAdmin {
        /// Who it was: a read-only account, a certificate, the shared key.
        who: &'static str,
    },
    /// Someone other than a job server's certificate sent a heartbeat.
    #[error("a heartbeat not from a job server's certificate")]
    HeartbeatNotFromJobServer,
    /// Someone other than a job server's certificate called what only a
    /// job server does for itself (`what`: claiming a job, recording
    /// hosting).
    #[error("{what} not from a job server's certificate")]
    NotFromJobServer {
        /// What was asked.
        what: &'static str,
    },
    /// An admin asked for a manifest without naming the node.
    #[error("a manifest asked for without naming the node")]
    ManifestNamesNoNode,
    /// A manifest asked for by someone other than the node or an admin.
    #[error("a manifest asked for by someone other than its node")]
    ManifestNotOwn,
    /// A node's certificate whose host name has no system row.
    #[error("no system {host}")]
    NodeHasNoSystem {
        /// The host name the certificate names.
        host: String,
    },
    /// A node's certificate read another node's boot events.
    #[error("node {host} read another node's boot events")]
    NodeReadsAnother {
        /// The node's host name.
        host: String,
    },
    /// A node's certificate wrote a boot event naming another node.
    #[error("node {host} wrote a boot event for another node")]
    NodeWritesAnother {
        /// The node's host name.
        host: String,
    },
    /// A reporter sent a phase its kind does not report.
    #[error("{by} does not report {phase:?}")]
    PhaseNotReportedBy {
        /// Who reported it: `"a node"`, `"a job server"`.
        by: &'static str,
        /// The phase.
        phase: BootPhase,
    },
    /// A plan asked for without naming what it is for (`param`: `system`
    /// or `image`).
    #[error("a plan asked for without {param}")]
    PlanNamesNothing {
        /// The query parameter that names it.
        param: &'static str,
    },
    /// A node's certificate reached for another system's scripts: a plan
    /// naming a system, or a script not in its own plan.
    #[error("node {host} reached for scripts not its own")]
    ScriptsNotOwn {
        /// The node's host name.
        host: String,
    },
    /// A script-runner call its caller does not make (`by` a node, a job
    /// server, an administrator; `what` it asked for).
    #[error("{by} asked for {what}")]
    ScriptsNotFor {
        /// Who asked.
        by: &'static str,
        /// What it asked for, and who does it.
        what: &'static str,
    },
    /// Renewal asked for without an agent's certificate.
    #[error("renewal without an agent certificate")]
    RenewalNeedsCertificate,
    /// An admin reported `script_served`, which `/ipxe/` records itself.
    #[error("script_served reported by an admin")]
    ScriptServedReported,
    /// The shared API key asked for something only a certificate can say
    /// (which node it speaks for).
    #[error("the shared API key cannot say which node it speaks for")]
    SharedKeyNamesNoNode,
    /// The shared API key, turned off (`MPROV_SHARED_KEY_MODE=off`).
    #[error("the shared API key is turned off")]
    SharedKeyOff,
}

/// A request's method, as the rules tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET.
    Get,
    /// HEAD.
    Head,
    /// OPTIONS.
    Options,
    /// POST.
    Post,
    /// PUT.
    Put,
    /// PATCH.
    Patch,
    /// DELETE.
    Delete,
    /// Any other.
    Other,
}

impl Method {
    /// The method named `name` (upper case, as on the wire).
    pub fn from_name(name: &str) -> Method {
        match name {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "OPTIONS" => Method::Options,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "PATCH" => Method::Patch,
            "DELETE" => Method::Delete,
            _ => Method::Other,
        }
    }
}

/// What an authenticated request reaches, as [`check`] tells it apart: the
/// HTTP layer parses it from the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// The API's index (its root).
    Index,
    /// `<kind>[/<key>[/<rest>]]` under the API root.
    Inventory {
        /// The kind (`systems`, `nics`, ...), as in the path.
        kind: &'a str,
        /// The object's id or name.
        key: Option<&'a str>,
        /// What follows the key (`config`, `hosts/<name>`, ...).
        rest: Option<&'a str>,
    },
    /// Anything else (an unknown path: answered 404 to those who may read
    /// the inventory).
    Elsewhere,
}

/// Whether `principal` may write `fields` of an object of `kind` it was
/// already allowed to reach by [`check`]: admins and users yes; a node's
/// certificate (and the shared key in `nodes` mode, which acts for any node)
/// only the fields the kind's [`node_writable`](Kind::node_writable) lists
/// (none today: a node's PATCH of its own system, NIC or BMC is refused
/// field by field, with the field named). Pure.
pub fn check_fields<'a>(
    principal: &Principal,
    mode: SharedKeyMode,
    kind: &Kind,
    mut fields: impl Iterator<Item = &'a str>,
) -> Result<(), AccessError> {
    let node = match principal {
        Principal::Machine(agent) if agent.is_node() => true,
        Principal::Machine(_) => return jobserver_fields(kind, fields),
        Principal::ApiKey { shared: true, .. } => mode == SharedKeyMode::Nodes,
        _ => false,
    };
    if !node {
        return Ok(());
    }
    match fields.find(|f| !kind.node_writable.contains(f)) {
        None => Ok(()),
        Some(field) => Err(forbid(&format!(
            "a node may not write {field:?} of its {}: a node reports only what it does (boot events, script results, status and facts); who it is, what it boots and its NICs and BMC are set by an administrator",
            kind.name
        ))),
    }
}

/// The fields a job server's certificate may write of `kind`: of a row it
/// claimed, those its descriptor lists ([`JobServerWrite::Claimed`]);
/// whether the row is its own, [`check`] decides.
fn jobserver_fields<'a>(
    kind: &Kind,
    mut fields: impl Iterator<Item = &'a str>,
) -> Result<(), AccessError> {
    let allowed: &[&str] = match kind.jobserver_writes {
        JobServerWrite::Claimed { fields, .. } => fields,
        JobServerWrite::Hosts(_) | JobServerWrite::Nothing => &[],
    };
    match fields.find(|f| !allowed.contains(f)) {
        None => Ok(()),
        Some(field) => Err(forbid(&format!(
            "a job server may not write {field:?} of its {}: it reports only {} of what it claimed",
            kind.name,
            allowed.join(", ")
        ))),
    }
}

fn forbid(msg: &str) -> AccessError {
    AccessError::Forbidden(msg.to_owned())
}

/// Checks that `principal` may make this request to the inventory.
pub async fn check(
    db: &Db,
    mode: SharedKeyMode,
    principal: &Principal,
    method: Method,
    target: Target<'_>,
    query: Option<&str>,
) -> Result<(), AccessError> {
    let read = matches!(method, Method::Get | Method::Head | Method::Options);
    match principal {
        Principal::Anonymous => Ok(()),
        Principal::User { is_admin, .. } => {
            if read || *is_admin {
                Ok(())
            } else {
                Err(forbid("this account may read the inventory but not change it"))
            }
        }
        Principal::ApiKey { shared, .. } => match (shared, mode) {
            (false, _) | (true, SharedKeyMode::All) => Ok(()),
            (true, SharedKeyMode::Off) => Err(AccessError::SharedKeyOff),
            (true, SharedKeyMode::Nodes) => node_self(db, None, method, target, query)
                .await
                .map_err(|_| {
                    forbid("MPROV_SHARED_KEY_MODE=nodes: the shared API key only reaches what a node does to itself")
                }),
        },
        Principal::Machine(agent) if agent.is_node() => {
            node_self(db, Some(&agent.identity), method, target, query)
                .await
                .map_err(|()| {
                    forbid(&format!(
                        "a node's certificate reaches only its own system ({})",
                        agent.identity
                    ))
                })
        }
        Principal::Machine(agent) => jobserver(db, &agent.identity, method, target, read).await,
    }
}

/// Node-self requests; `hostname` is the node's (None: any node, for the
/// shared key).
async fn node_self(
    db: &Db,
    hostname: Option<&str>,
    method: Method,
    target: Target<'_>,
    query: Option<&str>,
) -> Result<(), ()> {
    let allowed_method = matches!(method, Method::Get | Method::Head | Method::Patch);
    let Target::Inventory { kind, key, rest } = target else {
        return Err(());
    };
    if !allowed_method {
        return Err(());
    }
    let own_id = match hostname {
        Some(h) => Some(system_id(db, h).await.ok_or(())?),
        None => None,
    };
    let is_own = |id: Option<i64>| match own_id {
        None => id.is_some(),
        Some(own) => id == Some(own),
    };
    match (kinds::visibility(kind).nodes, key, rest) {
        (NodeAccess::Itself, Some(key), None | Some("config")) => {
            if rest.is_some() && method != Method::Get {
                return Err(());
            }
            let id = system_id(db, key).await;
            if is_own(id) { Ok(()) } else { Err(()) }
        }
        (NodeAccess::OwnedVia(field), Some(key), None) => {
            let k = kinds::kind(kind).ok_or(())?;
            let obj = db.get(k, key).await.map_err(|_| ())?;
            if is_own(obj.get(field).and_then(Value::as_i64)) {
                Ok(())
            } else {
                Err(())
            }
        }
        (NodeAccess::OwnedVia(field), None, None) if method == Method::Get => {
            // A list only with `<field>=` naming the node itself.
            let q = ListQuery::from_pairs(
                url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                    .into_owned()
                    .collect(),
            );
            let system = q
                .filters
                .iter()
                .find(|(f, _)| f == field)
                .map(|(_, v)| v.clone())
                .ok_or(())?;
            if q.filters.len() != 1 {
                return Err(());
            }
            let id = system_id(db, &system).await;
            if is_own(id) { Ok(()) } else { Err(()) }
        }
        _ => Err(()),
    }
}

/// A system's id from its id or host name.
async fn system_id(db: &Db, key: &str) -> Option<i64> {
    let k = kinds::kind("systems")?;
    let obj = db.get(k, key).await.ok()?;
    obj.get("id").and_then(Value::as_i64)
}

async fn jobserver(
    db: &Db,
    name: &str,
    method: Method,
    target: Target<'_>,
    read: bool,
) -> Result<(), AccessError> {
    let deny = || {
        forbid(&format!(
            "a job server's certificate ({name}) reads the inventory and writes only its own state"
        ))
    };
    let (resource, key, rest) = match target {
        Target::Index if read => return Ok(()),
        Target::Inventory { kind, key, rest } => (kind, key, rest),
        Target::Index | Target::Elsewhere => return Err(deny()),
    };
    if !kinds::visibility(resource).jobservers {
        return Err(deny());
    }
    if read {
        return Ok(());
    }
    // What it may write of a kind, the kind's descriptor says.
    let Some(k) = kinds::kind(resource) else {
        return Err(deny());
    };
    match (k.jobserver_writes, key, rest) {
        // Its own hosting: /api/v1/<kind>/{key}/hosts/{itself}.
        (JobServerWrite::Hosts(_), Some(_), Some(rest))
            if matches!(method, Method::Put | Method::Delete)
                && rest.strip_prefix("hosts/") == Some(name) =>
        {
            Ok(())
        }
        (JobServerWrite::Claimed { by: field, .. }, Some(key), None) if method == Method::Patch => {
            let row = db.get(k, key).await.map_err(|_| deny())?;
            let Some(Ty::Ref(jobservers)) = k.field(field).map(|f| f.ty) else {
                return Err(deny());
            };
            let js = kinds::kind(jobservers).ok_or_else(deny)?;
            let own = db.get(js, name).await.map_err(|_| deny())?;
            if row.get(field).and_then(Value::as_i64).is_some() && row.get(field) == own.get("id") {
                Ok(())
            } else {
                Err(deny())
            }
        }
        _ => Err(deny()),
    }
}

/// Who a principal is to the boot timeline, the manifest and the heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootRole {
    /// Admin users and API keys, by the name their events carry
    /// (`user:<name>`, `apikey:<name>`): read and write for any node.
    Admin(String),
    /// A job server, by name: writes events for nodes, reads every
    /// timeline, sends its own heartbeat.
    JobServer(String),
    /// A node, by host name: its own events and manifest only.
    Node(String),
    /// Read-only users read every timeline.
    Reader,
}

/// The boot role of `principal` under shared-key `mode`. Pure.
pub fn boot_role(principal: &Principal, mode: SharedKeyMode) -> Result<BootRole, AccessError> {
    match principal {
        Principal::Anonymous => Err(AccessError::Anonymous),
        Principal::User { username, is_admin } => Ok(if *is_admin {
            BootRole::Admin(format!("user:{username}"))
        } else {
            BootRole::Reader
        }),
        Principal::ApiKey { name, shared, .. } => {
            if !*shared || mode == SharedKeyMode::All {
                Ok(BootRole::Admin(format!("apikey:{name}")))
            } else {
                Err(AccessError::SharedKeyNamesNoNode)
            }
        }
        Principal::Machine(m) if m.is_node() => Ok(BootRole::Node(m.identity.clone())),
        Principal::Machine(m) => Ok(BootRole::JobServer(m.identity.clone())),
    }
}

/// Who writes a boot event, once [`may_report`] allowed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reporter<'a> {
    /// An admin, by the name its events carry.
    Admin(&'a str),
    /// A job server, by name.
    JobServer(&'a str),
    /// A node, by host name: about its own system only
    /// ([`node_reports_itself`]).
    Node(&'a str),
}

impl Reporter<'_> {
    /// What the event's `source` says.
    pub fn source(&self) -> String {
        match self {
            Reporter::Admin(name) => (*name).to_owned(),
            Reporter::JobServer(name) => format!("jobserver:{name}"),
            Reporter::Node(host) => format!("node:{host}"),
        }
    }

    /// The job server whose report this is, if it is one: only a job
    /// server's own certificate says which job server reports, so only its
    /// reports attest `/ipxe/` requests.
    pub fn attesting_jobserver(&self) -> Option<&str> {
        match self {
            Reporter::JobServer(name) => Some(name),
            Reporter::Admin(_) | Reporter::Node(_) => None,
        }
    }
}

/// Whether `role` may report boot events at all (a batch is refused
/// whole when it may not). Pure.
pub fn may_report_any(role: &BootRole) -> Result<(), AccessError> {
    match role {
        BootRole::Reader => Err(AccessError::BootEventsReadOnly),
        BootRole::Node(_) | BootRole::JobServer(_) | BootRole::Admin(_) => Ok(()),
    }
}

/// Whether `role` may report `phase`, and as whom. Pure.
pub fn may_report(role: &BootRole, phase: BootPhase) -> Result<Reporter<'_>, AccessError> {
    match role {
        BootRole::Reader => Err(AccessError::BootEventsReadOnly),
        BootRole::Node(_) if !node_phase(phase) => Err(AccessError::PhaseNotReportedBy {
            by: "a node",
            phase,
        }),
        BootRole::Node(host) => Ok(Reporter::Node(host)),
        BootRole::JobServer(_) if !jobserver_phase(phase) => Err(AccessError::PhaseNotReportedBy {
            by: "a job server",
            phase,
        }),
        BootRole::JobServer(name) => Ok(Reporter::JobServer(name)),
        BootRole::Admin(_) if phase == BootPhase::ScriptServed => {
            Err(AccessError::ScriptServedReported)
        }
        BootRole::Admin(name) => Ok(Reporter::Admin(name)),
    }
}

/// A node's event is about its own system: `own` is the system id of its
/// host name `host`, `named_system` and `named_mac` the system the report's
/// `system` and `mac` name (`None`: the report names none; `Some(None)`: no
/// system has it). Naming another node is refused, not silently rewritten.
/// The node's system id, when allowed. Pure.
pub fn node_reports_itself(
    host: &str,
    own: Option<i64>,
    named_system: Option<Option<i64>>,
    named_mac: Option<Option<i64>>,
) -> Result<i64, AccessError> {
    let Some(id) = own else {
        return Err(AccessError::NodeHasNoSystem {
            host: host.to_owned(),
        });
    };
    let other = |named: Option<Option<i64>>| named.is_some_and(|n| n != Some(id));
    if other(named_system) || other(named_mac) {
        tracing::warn!(node = %host, "refused a boot event a node wrote for another node");
        return Err(AccessError::NodeWritesAnother {
            host: host.to_owned(),
        });
    }
    Ok(id)
}

/// Whether `role` may read the timeline a query names: `named_host` is the
/// host name of the system it names (`None`: it names none; `Some(None)`: no
/// such system), `names_mac` whether it names a MAC. A node reads its own
/// only; the host name to read when a node named nothing. Pure.
pub fn may_read_events<'a>(
    role: &'a BootRole,
    named_host: Option<Option<&str>>,
    names_mac: bool,
) -> Result<Option<&'a str>, AccessError> {
    let BootRole::Node(host) = role else {
        return Ok(None);
    };
    match named_host {
        None if !names_mac => Ok(Some(host)),
        Some(Some(named)) if named == host => Ok(None),
        _ => Err(AccessError::NodeReadsAnother { host: host.clone() }),
    }
}

/// Whose manifest `role` may read, given the `system` it asked for: a node
/// its own (naming itself or nobody), an admin anyone it names. Pure.
pub fn manifest_for(role: &BootRole, asked: Option<String>) -> Result<String, AccessError> {
    match (role, asked) {
        (BootRole::Node(h), None) => Ok(h.clone()),
        (BootRole::Node(h), Some(s)) if s == *h => Ok(s),
        (BootRole::Admin(_), Some(s)) => Ok(s),
        (BootRole::Admin(_), None) => Err(AccessError::ManifestNamesNoNode),
        _ => Err(AccessError::ManifestNotOwn),
    }
}

/// The job server a heartbeat from `role` is about: only a job server's own
/// certificate sends one, since nobody else can say which job server it
/// speaks for. Pure.
pub fn heartbeat_from(role: &BootRole) -> Result<&str, AccessError> {
    match role {
        BootRole::JobServer(name) => Ok(name),
        _ => Err(AccessError::HeartbeatNotFromJobServer),
    }
}

/// The job server that registers, claims a job or records hosting
/// (`what`), from
/// `role`: only a job server's own certificate, which names it; nobody
/// else can say which job server it acts for (an admin queues and reads
/// jobs through the inventory instead). Pure.
pub fn own_jobserver<'a>(role: &'a BootRole, what: &'static str) -> Result<&'a str, AccessError> {
    match role {
        BootRole::JobServer(name) => Ok(name),
        _ => Err(AccessError::NotFromJobServer { what }),
    }
}

/// Who enrolls a job server without a one-time token: only an admin (an
/// API key other than the shared one, the shared key in `all` mode, an
/// admin account), by the name its log line carries. The anonymous,
/// read-only accounts, certificates and the shared key in `nodes` mode are
/// refused: an API key lets a job server get its certificate, never act
/// without one. Pure.
pub fn may_enroll_jobserver(
    principal: &Principal,
    mode: SharedKeyMode,
) -> Result<String, AccessError> {
    if let Principal::ApiKey { shared: true, .. } = principal {
        match mode {
            SharedKeyMode::All => {}
            SharedKeyMode::Nodes => {
                return Err(AccessError::EnrollNeedsAdmin {
                    who: "the shared API key in MPROV_SHARED_KEY_MODE=nodes",
                });
            }
            SharedKeyMode::Off => return Err(AccessError::SharedKeyOff),
        }
    }
    match boot_role(principal, mode) {
        Ok(BootRole::Admin(by)) => Ok(by),
        Ok(BootRole::Reader) => Err(AccessError::EnrollNeedsAdmin {
            who: "a read-only account",
        }),
        Ok(BootRole::JobServer(_) | BootRole::Node(_)) => Err(AccessError::EnrollNeedsAdmin {
            who: "a certificate",
        }),
        Err(AccessError::Anonymous) => Err(AccessError::EnrollNeedsCredential),
        Err(e) => Err(e),
    }
}

/// Whose scripts a plan request gets, once [`plan_scope`] allowed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanScope {
    /// The post-boot plan of the node the certificate names (host name).
    Node(String),
    /// The post-boot plan of the system an administrator named (host name or
    /// id).
    System(String),
    /// The image-gen plan of an image (slug or id).
    Image(String),
}

/// Whose plan `role` gets for `mode`, given the `system` and `image` the
/// query named: a node its own post-boot plan only, naming nothing; a job
/// server an image's image-gen plan; admins and readers either, by naming
/// it. Pure.
pub fn plan_scope(
    role: &BootRole,
    mode: ScriptMode,
    system: Option<String>,
    image: Option<String>,
) -> Result<PlanScope, AccessError> {
    let named = |param, v: Option<String>| v.ok_or(AccessError::PlanNamesNothing { param });
    match (role, mode) {
        (BootRole::Node(host), ScriptMode::PostBoot) => match system {
            None => Ok(PlanScope::Node(host.clone())),
            Some(_) => {
                tracing::warn!(node = %host, "refused a script plan a node asked for naming a system");
                Err(AccessError::ScriptsNotOwn { host: host.clone() })
            }
        },
        (BootRole::Node(_), ScriptMode::ImageGen) => Err(AccessError::ScriptsNotFor {
            by: "a node",
            what: "image-gen plans, which are the job servers'",
        }),
        (BootRole::JobServer(_), ScriptMode::PostBoot) => Err(AccessError::ScriptsNotFor {
            by: "a job server",
            what: "a post-boot plan, which is the node's own",
        }),
        (_, ScriptMode::ImageGen) => named("image", image).map(PlanScope::Image),
        (BootRole::Admin(_) | BootRole::Reader, ScriptMode::PostBoot) => {
            named("system", system).map(PlanScope::System)
        }
    }
}

/// Which scripts' content `role` may read: `Some(host)`: only those of that
/// node's own post-boot plan; `None`: any (job servers, admins, readers).
/// Pure.
pub fn content_scope(role: &BootRole) -> Option<&str> {
    match role {
        BootRole::Node(host) => Some(host),
        BootRole::JobServer(_) | BootRole::Admin(_) | BootRole::Reader => None,
    }
}

/// Who reports a script run, once [`results_from`] allowed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunReporter<'a> {
    /// A node, by host name: its own post-boot run, for its own timeline.
    Node(&'a str),
    /// A job server, by name: an image-gen run.
    JobServer(&'a str),
}

/// Whether `role` may report a run of `mode`: a node its own post-boot
/// runs, a job server image-gen runs, nobody else (the certificate that ran
/// the scripts reports them). Pure.
pub fn results_from(role: &BootRole, mode: ScriptMode) -> Result<RunReporter<'_>, AccessError> {
    match (role, mode) {
        (BootRole::Node(host), ScriptMode::PostBoot) => Ok(RunReporter::Node(host)),
        (BootRole::JobServer(name), ScriptMode::ImageGen) => Ok(RunReporter::JobServer(name)),
        (BootRole::Node(_), ScriptMode::ImageGen) => Err(AccessError::ScriptsNotFor {
            by: "a node",
            what: "image-gen results, which job servers report",
        }),
        (BootRole::JobServer(_), ScriptMode::PostBoot) => Err(AccessError::ScriptsNotFor {
            by: "a job server",
            what: "post-boot results, which each node reports for itself",
        }),
        (BootRole::Admin(_) | BootRole::Reader, _) => Err(AccessError::ScriptsNotFor {
            by: "an administrator",
            what: "script results, which the node or job server that ran them reports with its own certificate",
        }),
    }
}

/// The certificate a renewal replaces: only an agent's (a node's or a job
/// server's) is renewed. The shared key turned off is refused as it is
/// everywhere. Pure.
pub fn may_renew(principal: &Principal, mode: SharedKeyMode) -> Result<&Machine, AccessError> {
    match principal {
        Principal::Machine(machine) => Ok(machine),
        Principal::ApiKey { shared: true, .. } if mode == SharedKeyMode::Off => {
            Err(AccessError::SharedKeyOff)
        }
        Principal::Anonymous => Err(AccessError::Anonymous),
        Principal::User { .. } | Principal::ApiKey { .. } => {
            Err(AccessError::RenewalNeedsCertificate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::Profile;

    fn machine(profile: Profile, identity: &str) -> Principal {
        Principal::Machine(Machine {
            profile,
            identity: identity.into(),
            serial: "01".into(),
        })
    }

    fn shared() -> Principal {
        Principal::ApiKey {
            id: 1,
            name: "shared".into(),
            shared: true,
        }
    }

    #[test]
    fn only_an_admin_enrolls_a_job_server_without_a_token() {
        use SharedKeyMode::{All, Nodes, Off};
        let key = Principal::ApiKey {
            id: 2,
            name: "seed".into(),
            shared: false,
        };
        let reader = Principal::User {
            username: "ro".into(),
            is_admin: false,
        };
        assert_eq!(
            may_enroll_jobserver(&key, Off),
            Ok("apikey:seed".to_owned())
        );
        assert_eq!(
            may_enroll_jobserver(&shared(), All),
            Ok("apikey:shared".to_owned())
        );
        let refused = |p: &Principal, mode| may_enroll_jobserver(p, mode).unwrap_err();
        assert!(matches!(
            refused(&shared(), Nodes),
            AccessError::EnrollNeedsAdmin { .. }
        ));
        assert_eq!(refused(&shared(), Off), AccessError::SharedKeyOff);
        assert!(matches!(
            refused(&reader, All),
            AccessError::EnrollNeedsAdmin { .. }
        ));
        assert!(matches!(
            refused(&machine(Profile::Jobserver, "js1"), All),
            AccessError::EnrollNeedsAdmin { .. }
        ));
        assert_eq!(
            refused(&Principal::Anonymous, All),
            AccessError::EnrollNeedsCredential
        );
    }

    #[test]
    fn boot_roles_follow_the_principal_and_the_shared_key_mode() {
        let admin = Principal::User {
            username: "root".into(),
            is_admin: true,
        };
        let reader = Principal::User {
            username: "ro".into(),
            is_admin: false,
        };
        let all = SharedKeyMode::All;
        assert_eq!(
            boot_role(&admin, all),
            Ok(BootRole::Admin("user:root".into()))
        );
        assert_eq!(boot_role(&reader, all), Ok(BootRole::Reader));
        assert_eq!(
            boot_role(&shared(), all),
            Ok(BootRole::Admin("apikey:shared".into()))
        );
        for mode in [SharedKeyMode::Nodes, SharedKeyMode::Off] {
            assert_eq!(
                boot_role(&shared(), mode),
                Err(AccessError::SharedKeyNamesNoNode)
            );
        }
        assert_eq!(
            boot_role(&machine(Profile::Node, "c01"), all),
            Ok(BootRole::Node("c01".into()))
        );
        assert_eq!(
            boot_role(&machine(Profile::Jobserver, "js1"), all),
            Ok(BootRole::JobServer("js1".into()))
        );
        assert_eq!(
            boot_role(&Principal::Anonymous, all),
            Err(AccessError::Anonymous)
        );
    }

    #[test]
    fn who_reports_which_phase_and_who_attests_ipxe() {
        let node = BootRole::Node("c01".into());
        let js = BootRole::JobServer("js1".into());
        let admin = BootRole::Admin("user:root".into());
        assert_eq!(
            may_report(&node, BootPhase::Ready),
            Ok(Reporter::Node("c01"))
        );
        assert_eq!(
            may_report(&node, BootPhase::DhcpAcked),
            Err(AccessError::PhaseNotReportedBy {
                by: "a node",
                phase: BootPhase::DhcpAcked
            })
        );
        assert_eq!(
            may_report(&js, BootPhase::Ready),
            Err(AccessError::PhaseNotReportedBy {
                by: "a job server",
                phase: BootPhase::Ready
            })
        );
        assert_eq!(
            may_report(&admin, BootPhase::ScriptServed),
            Err(AccessError::ScriptServedReported)
        );
        assert_eq!(
            may_report(&BootRole::Reader, BootPhase::Ready),
            Err(AccessError::BootEventsReadOnly)
        );
        // Only a job server's own report attests /ipxe/.
        let by_js = may_report(&js, BootPhase::DhcpAcked).unwrap();
        assert_eq!(by_js.attesting_jobserver(), Some("js1"));
        assert_eq!(by_js.source(), "jobserver:js1");
        let by_admin = may_report(&admin, BootPhase::DhcpAcked).unwrap();
        assert_eq!(by_admin.attesting_jobserver(), None);
        assert_eq!(by_admin.source(), "user:root");
        assert_eq!(Reporter::Node("c01").attesting_jobserver(), None);
    }

    #[test]
    fn a_node_reports_and_reads_only_itself() {
        let mine = |system, mac| node_reports_itself("c01", Some(7), system, mac);
        assert_eq!(mine(None, None), Ok(7));
        assert_eq!(mine(Some(Some(7)), Some(Some(7))), Ok(7));
        let another = Err(AccessError::NodeWritesAnother { host: "c01".into() });
        assert_eq!(mine(Some(Some(8)), None), another);
        assert_eq!(mine(None, Some(Some(8))), another);
        assert_eq!(mine(None, Some(None)), another);
        assert_eq!(
            node_reports_itself("c01", None, None, None),
            Err(AccessError::NodeHasNoSystem { host: "c01".into() })
        );

        let node = BootRole::Node("c01".into());
        assert_eq!(may_read_events(&node, None, false), Ok(Some("c01")));
        assert_eq!(may_read_events(&node, Some(Some("c01")), false), Ok(None));
        let reads_another = Err(AccessError::NodeReadsAnother { host: "c01".into() });
        assert_eq!(
            may_read_events(&node, Some(Some("c02")), false),
            reads_another
        );
        assert_eq!(may_read_events(&node, Some(None), false), reads_another);
        assert_eq!(may_read_events(&node, None, true), reads_another);
        assert_eq!(may_read_events(&BootRole::Reader, None, true), Ok(None));
    }

    #[test]
    fn script_plans_content_and_results_follow_the_roles() {
        let node = BootRole::Node("c01".into());
        let js = BootRole::JobServer("js1".into());
        let admin = BootRole::Admin("user:root".into());
        let post = ScriptMode::PostBoot;
        let image_gen = ScriptMode::ImageGen;
        let s = |v: &str| Some(v.to_owned());
        assert_eq!(
            plan_scope(&node, post, None, None),
            Ok(PlanScope::Node("c01".into()))
        );
        // A node names no system, not even itself.
        for named in ["c02", "c01"] {
            assert_eq!(
                plan_scope(&node, post, s(named), None),
                Err(AccessError::ScriptsNotOwn { host: "c01".into() })
            );
        }
        assert!(matches!(
            plan_scope(&node, image_gen, None, s("compute")),
            Err(AccessError::ScriptsNotFor { by: "a node", .. })
        ));
        assert_eq!(
            plan_scope(&js, image_gen, None, s("compute")),
            Ok(PlanScope::Image("compute".into()))
        );
        assert_eq!(
            plan_scope(&js, image_gen, None, None),
            Err(AccessError::PlanNamesNothing { param: "image" })
        );
        assert!(matches!(
            plan_scope(&js, post, s("c01"), None),
            Err(AccessError::ScriptsNotFor {
                by: "a job server",
                ..
            })
        ));
        for reader in [&admin, &BootRole::Reader] {
            assert_eq!(
                plan_scope(reader, post, s("c02"), None),
                Ok(PlanScope::System("c02".into()))
            );
            assert_eq!(
                plan_scope(reader, post, None, None),
                Err(AccessError::PlanNamesNothing { param: "system" })
            );
            assert_eq!(content_scope(reader), None);
            assert!(results_from(reader, post).is_err());
            assert!(results_from(reader, image_gen).is_err());
        }
        assert_eq!(content_scope(&node), Some("c01"));
        assert_eq!(content_scope(&js), None);
        assert_eq!(results_from(&node, post), Ok(RunReporter::Node("c01")));
        assert_eq!(
            results_from(&js, image_gen),
            Ok(RunReporter::JobServer("js1"))
        );
        assert!(results_from(&node, image_gen).is_err());
        assert!(results_from(&js, post).is_err());
    }

    #[test]
    fn manifests_heartbeats_and_renewals() {
        let node = BootRole::Node("c01".into());
        let admin = BootRole::Admin("apikey:k".into());
        assert_eq!(manifest_for(&node, None), Ok("c01".into()));
        assert_eq!(manifest_for(&node, Some("c01".into())), Ok("c01".into()));
        assert_eq!(
            manifest_for(&node, Some("c02".into())),
            Err(AccessError::ManifestNotOwn)
        );
        assert_eq!(manifest_for(&admin, Some("c02".into())), Ok("c02".into()));
        assert_eq!(
            manifest_for(&admin, None),
            Err(AccessError::ManifestNamesNoNode)
        );
        assert_eq!(
            manifest_for(&BootRole::JobServer("js1".into()), None),
            Err(AccessError::ManifestNotOwn)
        );

        assert_eq!(
            heartbeat_from(&BootRole::JobServer("js1".into())),
            Ok("js1")
        );
        assert_eq!(
            own_jobserver(&BootRole::JobServer("js1".into()), "claims"),
            Ok("js1")
        );
        for role in [node, admin, BootRole::Reader] {
            assert_eq!(
                heartbeat_from(&role),
                Err(AccessError::HeartbeatNotFromJobServer)
            );
            assert_eq!(
                own_jobserver(&role, "claims"),
                Err(AccessError::NotFromJobServer { what: "claims" })
            );
        }

        let js = machine(Profile::Jobserver, "js1");
        assert!(may_renew(&js, SharedKeyMode::All).is_ok());
        assert_eq!(
            may_renew(&shared(), SharedKeyMode::Off).err(),
            Some(AccessError::SharedKeyOff)
        );
        assert_eq!(
            may_renew(&shared(), SharedKeyMode::All).err(),
            Some(AccessError::RenewalNeedsCertificate)
        );
    }
}
