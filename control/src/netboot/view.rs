//! The node view: what the control service knows about one node that its
//! boot reads, loaded at once, typed, with a fixed number of statements
//! whatever the node's groups. `/ipxe/`, the boot manifest and
//! `GET /api/v1/systems/{key}/config` read it, and so does what comes after
//! them (the script runner, the job queue, discovery).
//!
//! A node is found by the MAC that booted ([`NodeKey::Mac`]), by host name
//! ([`NodeKey::Host`], which is what a node's certificate names), or by the
//! key the API's paths take ([`NodeKey::System`]: an id or a host name).
//! [`load`] runs at most five statements, each through [`Db::fetch_all`] or
//! [`Db::fetch_optional`], which count them (`tests/api/boot.rs` holds it to
//! that with 1 and 50 groups on every engine):
//! 1. the system and the NIC it is found by (by name: its bootable NIC
//!    first, and a system without NICs is found too);
//! 2. its image with the image's distro;
//! 3. its groups;
//! 4. the scripts of every layer, with their slugs;
//! 5. the job servers hosting the image's current version, with the
//!    addresses each registered (their networks and heartbeat ages).
//!
//! A database error is an error ([`ViewError`]), never an unknown node. The
//! rules that read the view are pure and live beside it: bootability and the
//! boot decision in [`super`], the layering in [`crate::effective`].

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Map, Value};
use sqlx::Row as _;
use sqlx::any::AnyRow;

use crate::db::crud::{RefKey, Sha256};
use crate::db::{Db, Val, int, opt_bool, opt_int};
use crate::effective::{EffectiveConfig, EffectiveError, Layers};

/// How a node is looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKey<'a> {
    /// By a MAC of one of its NICs (the one that booted).
    Mac(&'a str),
    /// By host name, in any case: what a node's certificate names.
    Host(&'a str),
    /// By the key of `/api/v1/systems/{key}`: an id, or the host name.
    System(&'a str),
}

/// Why a node's view could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// The database failed (or a column did not decode).
    #[error("loading a node's view")]
    Db(#[from] sqlx::Error),
}

/// A node, found or not.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// No system matches the key.
    Unknown,
    /// The system's view.
    Known(Box<NodeView>),
}

/// One known node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    /// The system's id.
    pub system_id: i64,
    /// Its host name.
    pub hostname: String,
    /// Whether it boots from the network.
    pub netboot: bool,
    /// How many times an administrator asked it to run its post-boot
    /// scripts again (`POST /api/v1/systems/{key}/run-scripts`).
    pub run_request: i64,
    /// The network of the NIC it was found by (its switch port's network
    /// first); `None` when that NIC names none.
    pub network: Option<i64>,
    /// That NIC's reserved IPv4 address, if it has one.
    pub reserved_ip: Option<std::net::Ipv4Addr>,
    /// Its image, if it has one.
    pub image: Option<ImageView>,
    /// The job servers hosting the image's current version, by name.
    pub jobservers: Vec<JobServer>,
    /// Its config layers (distro, groups, image, system).
    pub layers: NodeLayers,
}

/// The image a node boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageView {
    /// Its id.
    pub id: i64,
    /// Its slug.
    pub slug: String,
    /// Its current version.
    pub version: i64,
    /// The current version's rootfs checksum; `Err` holds the recorded
    /// text when it is not a SHA-256 ("" when none is recorded).
    pub rootfs_sha256: Result<Sha256, String>,
    /// The current version's rootfs size in bytes (0 when not recorded).
    pub rootfs_size: u64,
}

/// A job server that hosts the image's current version.
#[derive(Debug, Clone, PartialEq)]
pub struct JobServer {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// Its row's first address: where nodes reach a job server that
    /// registered no addresses.
    pub address: Option<String>,
    /// Its image server's port, if its row names one.
    pub port: Option<u16>,
    /// Its row's network.
    pub network: Option<i64>,
    /// Its load average at its last heartbeat (any address).
    pub load_avg: f64,
    /// How long ago its last heartbeat came (any address), when it sent one.
    pub heartbeat_age: Option<Duration>,
    /// The addresses it registered, in the order it registered them; empty
    /// for a job server that never registered (its row's address, network
    /// and heartbeat stand for it then).
    pub addresses: Vec<ServedAddress>,
}

/// An address a job server registered, with its own heartbeat.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedAddress {
    /// The address.
    pub address: String,
    /// The network it serves there, if one holds it.
    pub network: Option<i64>,
    /// The load average its last heartbeat from here carried.
    pub load_avg: f64,
    /// How long ago that heartbeat came; `None`: none came yet.
    pub heartbeat_age: Option<Duration>,
}

/// One config layer (see [`crate::effective`] for how they combine).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layer {
    /// The row's id.
    pub id: i64,
    /// Its slug (the system's host name).
    pub name: String,
    /// A group's priority (0 for the other layers).
    pub priority: i64,
    /// Kernel arguments it adds (or replaces with, starting with `=`).
    pub install_kernel_cmdline: String,
    /// Initramfs modules it adds (or replaces with).
    pub initial_mods: String,
    /// The root tmpfs size in GiB; 0 inherits.
    pub tmpfs_root_size: i64,
    /// The provisioning interface; empty inherits.
    pub prov_interface: String,
    /// YAML merged into the config.
    pub config_params: String,
    /// Its scripts' ids, in id order.
    pub scripts: Vec<i64>,
}

/// A node's layers and the slugs of their scripts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeLayers {
    /// The distro of its image.
    pub distro: Option<Layer>,
    /// Its groups, in any order.
    pub groups: Vec<Layer>,
    /// Its image.
    pub image: Option<Layer>,
    /// The system itself.
    pub system: Layer,
    /// The slug of every script the layers name, by id.
    pub script_slugs: HashMap<i64, String>,
}

/// The layer columns, in the tables of distros, groups, images and systems.
const LAYER_COLUMNS: [&str; 5] = [
    "install_kernel_cmdline",
    "initial_mods",
    "tmpfs_root_size",
    "prov_interface",
    "config_params",
];

impl Layer {
    /// The layer in the form [`crate::effective`] takes: the JSON object the
    /// API shows, named by `name_key`.
    fn object(&self, name_key: &str, group: bool) -> Map<String, Value> {
        let mut o = Map::new();
        o.insert("id".into(), self.id.into());
        o.insert(name_key.into(), self.name.clone().into());
        if group {
            o.insert("priority".into(), self.priority.into());
        }
        o.insert(
            "install_kernel_cmdline".into(),
            self.install_kernel_cmdline.clone().into(),
        );
        o.insert("initial_mods".into(), self.initial_mods.clone().into());
        o.insert("tmpfs_root_size".into(), self.tmpfs_root_size.into());
        o.insert("prov_interface".into(), self.prov_interface.clone().into());
        o.insert("config_params".into(), self.config_params.clone().into());
        o.insert("scripts".into(), self.scripts.clone().into());
        o
    }

    /// Reads the layer columns of `row`, each prefixed by `prefix`.
    fn from_row(row: &AnyRow, prefix: &str, id: i64, name: String) -> Result<Layer, sqlx::Error> {
        let col = |c: &str| format!("{prefix}{c}");
        Ok(Layer {
            id,
            name,
            priority: 0,
            install_kernel_cmdline: text(row, &col("install_kernel_cmdline"))?,
            initial_mods: text(row, &col("initial_mods"))?,
            tmpfs_root_size: opt_int(row, &col("tmpfs_root_size"))?.unwrap_or(0),
            prov_interface: text(row, &col("prov_interface"))?,
            config_params: text(row, &col("config_params"))?,
            scripts: Vec::new(),
        })
    }
}

impl NodeView {
    /// The node's effective configuration (distro, groups, image, system).
    pub fn effective(&self) -> Result<EffectiveConfig, EffectiveError> {
        let l = &self.layers;
        let distro = l.distro.as_ref().map(|d| d.object("slug", false));
        let groups: Vec<Map<String, Value>> =
            l.groups.iter().map(|g| g.object("slug", true)).collect();
        let image = l.image.as_ref().map(|i| i.object("slug", false));
        let system = l.system.object("hostname", false);
        crate::effective::effective(
            &Layers {
                distro: distro.as_ref(),
                groups: groups.iter().collect(),
                image: image.as_ref(),
                system: &system,
            },
            &l.script_slugs,
        )
    }
}

/// A text column; "" when NULL.
fn text(row: &AnyRow, col: &str) -> Result<String, sqlx::Error> {
    Ok(row.try_get::<Option<String>, _>(col)?.unwrap_or_default())
}

/// A floating-point column whatever width the engine gave it; 0 when NULL.
fn float(row: &AnyRow, col: &str) -> Result<f64, sqlx::Error> {
    row.try_get::<Option<f64>, _>(col)
        .or_else(|_| row.try_get::<Option<f32>, _>(col).map(|v| v.map(f64::from)))
        .map(Option::unwrap_or_default)
}

/// `prefix`-ed layer columns of table alias `alias`, for a SELECT list.
fn layer_columns(alias: &str, prefix: &str) -> String {
    LAYER_COLUMNS
        .iter()
        .map(|c| format!("{alias}.{c} AS {prefix}{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns [`jobservers_of`] reads, of `jobservers j LEFT JOIN
/// jobserver_addresses a ON a.jobserver_id = j.id`: a row per address (one
/// with NULLs for a job server that registered none).
pub(crate) const JOBSERVER_COLUMNS: &str = "j.id, j.name, j.addresses, j.port, j.network_id, j.load_avg, j.heartbeat_at, a.address AS a_address, a.network_id AS a_network_id, a.load_avg AS a_load_avg, a.heartbeat_at AS a_heartbeat_at";
/// The order [`jobservers_of`] needs: each job server's rows together, its
/// addresses in the order it registered them.
pub(crate) const JOBSERVER_ORDER: &str = " ORDER BY j.name, j.id, a.id";

/// The job servers in `rows` ([`JOBSERVER_COLUMNS`] in [`JOBSERVER_ORDER`]),
/// with their heartbeat ages at `now`.
pub(crate) fn jobservers_of(
    rows: &[AnyRow],
    now: jiff::Timestamp,
) -> Result<Vec<JobServer>, sqlx::Error> {
    let age = |at: String| {
        at.parse::<jiff::Timestamp>()
            .ok()
            .map(|at| Duration::try_from(now.duration_since(at)).unwrap_or_default())
    };
    let mut jobservers: Vec<JobServer> = Vec::new();
    for r in rows {
        let id = int(r, "id")?;
        if jobservers.last().is_none_or(|j| j.id != id) {
            let addresses: Vec<String> =
                serde_json::from_str(&text(r, "addresses")?).unwrap_or_default();
            jobservers.push(JobServer {
                id,
                name: text(r, "name")?,
                address: addresses.into_iter().find(|a| !a.is_empty()),
                port: opt_int(r, "port")?.and_then(|p| u16::try_from(p).ok()),
                network: opt_int(r, "network_id")?,
                load_avg: float(r, "load_avg")?,
                heartbeat_age: age(text(r, "heartbeat_at")?),
                addresses: Vec::new(),
            });
        }
        let address = text(r, "a_address")?;
        if let Some(j) = jobservers.last_mut()
            && !address.is_empty()
        {
            j.addresses.push(ServedAddress {
                address,
                network: opt_int(r, "a_network_id")?,
                load_avg: float(r, "a_load_avg")?,
                heartbeat_age: age(text(r, "a_heartbeat_at")?),
            });
        }
    }
    Ok(jobservers)
}

/// Loads the view of the node `key` names, in at most five statements.
pub async fn load(db: &Db, key: NodeKey<'_>) -> Result<Lookup, ViewError> {
    // 1. The system and the NIC it is found by.
    let mut q = db.sql();
    q.push("SELECT s.id, s.hostname, s.netboot, s.run_request, s.image_id, ")
        .push(&layer_columns("s", ""))
        .push(", n.network_id, n.ipv4 AS nic_ipv4, p.network_id AS port_network_id FROM systems s LEFT JOIN network_interfaces n ON n.system_id = s.id LEFT JOIN switch_ports p ON p.id = n.switch_port_id WHERE ");
    match key {
        NodeKey::Mac(mac) => {
            q.push("n.mac = ").bind(Val::Text(Some(mac.to_owned())));
        }
        NodeKey::Host(host) => {
            q.push("s.hostname = ")
                .bind(Val::Text(Some(host.to_ascii_lowercase())));
        }
        NodeKey::System(key) => match RefKey::parse_str(key) {
            RefKey::Id(id) => {
                q.push("s.id = ").bind(Val::Int(Some(id)));
            }
            RefKey::Slug(host) => {
                q.push("s.hostname = ").bind(Val::Text(Some(host)));
            }
        },
    }
    q.push(" ORDER BY n.bootable DESC, n.id LIMIT 1");
    let Some(row) = db.fetch_optional(&q).await? else {
        return Ok(Lookup::Unknown);
    };
    let system_id = int(&row, "id")?;
    let hostname = text(&row, "hostname")?;
    let network = super::node_network(
        opt_int(&row, "port_network_id")?,
        opt_int(&row, "network_id")?,
    );
    let reserved_ip = row
        .try_get::<Option<String>, _>("nic_ipv4")?
        .and_then(|a| a.parse().ok());
    let netboot = opt_bool(&row, "netboot")? != Some(false);
    let run_request = opt_int(&row, "run_request")?.unwrap_or(0);
    let image_id = opt_int(&row, "image_id")?;
    let mut layers = NodeLayers {
        system: Layer::from_row(&row, "", system_id, hostname.clone())?,
        ..NodeLayers::default()
    };

    // 2. The image and its distro.
    let mut image = None;
    if let Some(id) = image_id {
        let mut q = db.sql();
        q.push(&image_select())
            .push("i.id = ")
            .bind(Val::Int(Some(id)));
        if let Some(r) = db.fetch_optional(&q).await? {
            image = Some(image_of(&r, &mut layers)?);
        }
    }

    // 3. Its groups, in one statement.
    let mut q = db.sql();
    q.push("SELECT g.id, g.slug, g.priority, ")
        .push(&layer_columns("g", ""))
        .push(
            " FROM system_groups g JOIN group_members m ON m.group_id = g.id WHERE m.system_id = ",
        )
        .bind(Val::Int(Some(system_id)));
    for r in db.fetch_all(&q).await? {
        let mut g = Layer::from_row(&r, "", int(&r, "id")?, text(&r, "slug")?)?;
        g.priority = opt_int(&r, "priority")?.unwrap_or(0);
        layers.groups.push(g);
    }

    // 4. Every layer's scripts, with their slugs, in one statement. The
    // layer: 0 system, 1 group, 2 image, 3 distro.
    let (image_layer, distro_layer) = (
        layers.image.as_ref().map(|l| l.id),
        layers.distro.as_ref().map(|l| l.id),
    );
    let mut q = db.sql();
    q.push("SELECT x.layer, x.owner, s.id, s.slug FROM (SELECT 0 AS layer, system_id AS owner, script_id FROM system_scripts WHERE system_id = ")
        .bind(Val::Int(Some(system_id)))
        .push(" UNION ALL SELECT 1, gs.group_id, gs.script_id FROM group_scripts gs JOIN group_members m ON m.group_id = gs.group_id WHERE m.system_id = ")
        .bind(Val::Int(Some(system_id)))
        .push(" UNION ALL SELECT 2, image_id, script_id FROM image_scripts WHERE image_id = ")
        .bind(Val::Int(image_layer))
        .push(" UNION ALL SELECT 3, distro_id, script_id FROM distro_scripts WHERE distro_id = ")
        .bind(Val::Int(distro_layer))
        .push(") x JOIN scripts s ON s.id = x.script_id ORDER BY x.layer, x.owner, s.id");
    let mut group_scripts: HashMap<i64, Vec<i64>> = HashMap::new();
    for r in db.fetch_all(&q).await? {
        let (layer, owner, id) = (int(&r, "layer")?, int(&r, "owner")?, int(&r, "id")?);
        layers.script_slugs.insert(id, text(&r, "slug")?);
        let target = match layer {
            0 => Some(&mut layers.system),
            2 => layers.image.as_mut(),
            3 => layers.distro.as_mut(),
            _ => None,
        };
        match target {
            Some(l) => l.scripts.push(id),
            None => group_scripts.entry(owner).or_default().push(id),
        }
    }
    for g in &mut layers.groups {
        g.scripts = group_scripts.remove(&g.id).unwrap_or_default();
    }

    // 5. The job servers hosting the image with their registered
    // addresses, in one statement.
    let jobservers = match &image {
        Some(img) => hosting(db, img.id).await?,
        None => Vec::new(),
    };

    Ok(Lookup::Known(Box::new(NodeView {
        system_id,
        hostname,
        netboot,
        run_request,
        network,
        reserved_ip,
        image,
        jobservers,
        layers,
    })))
}

/// The image columns [`image_of`] reads, with its distro's; the caller
/// appends the condition on `i`.
fn image_select() -> String {
    format!(
        "SELECT i.id, i.slug, i.version, i.rootfs_sha256, i.rootfs_size, {}, d.id AS d_id, d.slug AS d_slug, {} FROM system_images i LEFT JOIN distros d ON d.id = i.distro_id WHERE ",
        layer_columns("i", ""),
        layer_columns("d", "d_")
    )
}

/// The image of a row of [`image_select`], its layer and its distro's put
/// in `layers`.
fn image_of(r: &AnyRow, layers: &mut NodeLayers) -> Result<ImageView, sqlx::Error> {
    let id = int(r, "id")?;
    let slug = text(r, "slug")?;
    let recorded = text(r, "rootfs_sha256")?;
    let image = ImageView {
        id,
        slug: slug.clone(),
        version: int(r, "version")?,
        rootfs_sha256: recorded.parse::<Sha256>().map_err(|_| recorded),
        rootfs_size: opt_int(r, "rootfs_size")?
            .and_then(|s| u64::try_from(s).ok())
            .unwrap_or(0),
    };
    layers.image = Some(Layer::from_row(r, "", id, slug)?);
    if let Some(d) = opt_int(r, "d_id")? {
        layers.distro = Some(Layer::from_row(r, "d_", d, text(r, "d_slug")?)?);
    }
    Ok(image)
}

/// The job servers hosting image `image_id`, with their registered
/// addresses, in one statement.
async fn hosting(db: &Db, image_id: i64) -> Result<Vec<JobServer>, sqlx::Error> {
    let mut q = db.sql();
    q.push("SELECT ")
        .push(JOBSERVER_COLUMNS)
        .push(" FROM jobservers j JOIN image_hosts h ON h.jobserver_id = j.id LEFT JOIN jobserver_addresses a ON a.jobserver_id = j.id WHERE h.image_id = ")
        .bind(Val::Int(Some(image_id)))
        .push(JOBSERVER_ORDER);
    jobservers_of(&db.fetch_all(&q).await?, jiff::Timestamp::now())
}

/// The view a discovery boot reads ([`super::discovery`]): image `slug`
/// (its layer and its distro's, no system's or group's) and the job servers
/// hosting it, for a node on `network` (the network of the job server that
/// leased the node its address; `None`: any). Two statements; `None` when
/// no image has the slug.
pub async fn load_image(
    db: &Db,
    slug: &str,
    network: Option<i64>,
) -> Result<Option<NodeView>, ViewError> {
    let mut q = db.sql();
    q.push(&image_select())
        .push("i.slug = ")
        .bind(Val::Text(Some(slug.to_owned())));
    let Some(r) = db.fetch_optional(&q).await? else {
        return Ok(None);
    };
    let mut layers = NodeLayers {
        system: Layer {
            name: super::DISCOVERY_HOST.to_owned(),
            ..Layer::default()
        },
        ..NodeLayers::default()
    };
    let image = image_of(&r, &mut layers)?;
    let jobservers = hosting(db, image.id).await?;
    Ok(Some(NodeView {
        system_id: 0,
        hostname: super::DISCOVERY_HOST.to_owned(),
        netboot: true,
        run_request: 0,
        network,
        reserved_ip: None,
        image: Some(image),
        jobservers,
        layers,
    }))
}
