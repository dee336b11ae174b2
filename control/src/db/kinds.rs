//! The inventory's kinds, described once as data.
//!
//! Every REST resource, its table, validation, filters, sorting and its part of
//! the OpenAPI document come from these descriptors, so the API cannot drift from
//! the schema kind by kind. A field's JSON name is its `name`; its column is the
//! same, except references, stored as `<name>_id`. The migrations in
//! `migrations/<engine>/` create the matching tables.

/// What a field holds, and so how it is validated, stored and described.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ty {
    /// A boolean (JSON `true`/`false`).
    Bool,
    /// A closed set of strings.
    Enum(&'static [&'static str]),
    /// A floating-point number.
    Float,
    /// A host name: letters, digits, `-` and `.`, at most 253 characters.
    Hostname,
    /// An integer within the bounds.
    Int {
        /// The smallest value accepted.
        min: i64,
        /// The largest value accepted.
        max: i64,
    },
    /// An IPv4 address.
    Ipv4,
    /// An IPv6 address.
    Ipv6,
    /// Any JSON value, stored as text.
    Json,
    /// An Ethernet MAC address, stored as lowercase `aa:bb:cc:dd:ee:ff`.
    Mac,
    /// A password: write-only, stored as an argon2 hash.
    Password,
    /// A reference to a row of another kind, by id (or slug on write).
    Ref(&'static str),
    /// A secret: write-only, encrypted at rest with the install's secret key;
    /// reads show only `<name>_set`.
    Secret,
    /// A SHA-256 digest: 64 hex digits, stored lowercase; empty means none
    /// recorded.
    Sha256,
    /// A URL-safe unique name: lowercase letters, digits, `-` and `_`.
    Slug,
    /// A list of strings, stored as JSON text.
    StrList,
    /// Free text up to `max` characters.
    Text {
        /// The most characters accepted.
        max: usize,
    },
    /// A UTC timestamp in RFC 3339, set by the server.
    Timestamp,
    /// YAML text that must parse to a mapping (or be empty).
    Yaml,
}

/// Who may write a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Clients read it; only the server writes it.
    ReadOnly,
    /// Clients read and write it.
    ReadWrite,
    /// Clients write it and never read it back (secrets and passwords).
    WriteOnly,
}

/// A field's value when a create leaves it out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    /// No default: the field is required (unless nullable).
    None,
    /// `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A string.
    Str(&'static str),
    /// An empty JSON list.
    EmptyList,
}

/// One field of a kind.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The JSON name.
    pub name: &'static str,
    /// What it holds.
    pub ty: Ty,
    /// Who may write it.
    pub access: Access,
    /// Its value when a create leaves it out.
    pub default: Default,
    /// Whether `null` is a valid value.
    pub nullable: bool,
    /// Whether the value is unique across the kind (enforced by the schema too).
    pub unique: bool,
    /// A sentence for the OpenAPI document.
    pub doc: &'static str,
}

impl Field {
    /// The column that stores this field.
    pub fn column(&self) -> String {
        match self.ty {
            Ty::Ref(_) => format!("{}_id", self.name),
            _ => self.name.to_owned(),
        }
    }

    /// Whether a create must carry this field.
    pub fn required(&self) -> bool {
        self.access != Access::ReadOnly && self.default == Default::None && !self.nullable
    }
}

/// A many-to-many relation, shown as a list of ids on both sides.
#[derive(Debug, Clone, Copy)]
pub struct ManyToMany {
    /// The JSON name (a list of ids).
    pub name: &'static str,
    /// The join table.
    pub table: &'static str,
    /// The join column that holds this kind's id.
    pub this: &'static str,
    /// The join column that holds the other kind's id.
    pub other: &'static str,
    /// The other kind's name.
    pub kind: &'static str,
    /// A sentence for the OpenAPI document.
    pub doc: &'static str,
}

/// Rows of another kind that belong to this one, embedded on read and accepted
/// nested on create (a system's NICs).
#[derive(Debug, Clone, Copy)]
pub struct Children {
    /// The JSON name (a list of objects).
    pub name: &'static str,
    /// The child kind's name.
    pub kind: &'static str,
    /// The child's reference field that points back here.
    pub parent_field: &'static str,
}

/// Rows the server keeps about a row from what the row's owner reports (a
/// job server's registered addresses, each with its heartbeat), embedded
/// read-only on read: no resource of their own, never written through the
/// API, so their fields are all [`Access::ReadOnly`].
#[derive(Debug, Clone, Copy)]
pub struct Reported {
    /// The JSON name (a list of objects).
    pub name: &'static str,
    /// The table.
    pub table: &'static str,
    /// The column that holds the owning row's id.
    pub parent: &'static str,
    /// The fields of each row, besides its id, in the order it shows them.
    pub fields: &'static [Field],
    /// The column the rows are ordered by.
    pub order: &'static str,
    /// A sentence for the OpenAPI document.
    pub doc: &'static str,
}

/// What a node's certificate may reach of a kind (see [`Visibility`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAccess {
    /// Nothing.
    None,
    /// The kind is the node's own system: its own row (by id or host name)
    /// and that row's effective config.
    Itself,
    /// The rows whose reference field of this name points at its own
    /// system: each by id, and the list filtered on that field alone naming
    /// itself.
    OwnedVia(&'static str),
}

/// Who besides administrators and read-only users may read a resource under
/// `/api/v1/`: the access rules ask [`visibility`] on every request made
/// with an agent's certificate. What a descriptor does not say is
/// [`Visibility::PRIVATE`], so a new kind is readable by administrators only
/// until its descriptor opens it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Visibility {
    /// Whether a job server's certificate may read every row (it serves
    /// DHCP, DNS, boot files and images from the inventory).
    pub jobservers: bool,
    /// What a node's certificate may reach.
    pub nodes: NodeAccess,
}

impl Visibility {
    /// Administrators only: accounts, credentials, and whatever does not say
    /// otherwise.
    pub const PRIVATE: Visibility = Visibility {
        jobservers: false,
        nodes: NodeAccess::None,
    };
    /// Inventory a job server serves from: every job server reads it; nodes
    /// do not.
    pub const JOBSERVERS: Visibility = Visibility {
        jobservers: true,
        nodes: NodeAccess::None,
    };

    /// The same, with `nodes` reaching what [`NodeAccess`] says.
    const fn nodes(mut self, nodes: NodeAccess) -> Visibility {
        self.nodes = nodes;
        self
    }
}

/// Kind-specific work a write does inside its transaction, besides writing
/// the row; `crud`'s hooks carry it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// An update that gives this field a value other than the stored one
    /// bumps the row's `version` (a script's version counts changes of its
    /// content).
    VersionCounts(&'static str),
    /// A write that sets the boolean field `flag` true is a rebuild
    /// request: an update bumps `version`, puts the fields of `resets` back
    /// to their defaults and empties the relation `hosts` (the new version
    /// is not built, so no job server holds it and it has no checksum yet);
    /// create or update, it queues a job of the module `job` with the
    /// parameters `{"<param>": slug, "version": version}`.
    Rebuild {
        /// The boolean field that requests it.
        flag: &'static str,
        /// Fields that describe the built version, reset to their defaults.
        resets: &'static [&'static str],
        /// The many-to-many relation of those that hold the built version.
        hosts: &'static str,
        /// The job module that builds it.
        job: &'static str,
        /// The job parameter that names the row (by slug).
        param: &'static str,
    },
    /// A delete of a row queues a job of the module `job` with the
    /// parameters `{"<param>": slug, "version": version}`, in the delete's
    /// transaction: the parameters outlive the row (an image deleted: its
    /// files are removed from every job server).
    Deleted {
        /// The job module that cleans up after it.
        job: &'static str,
        /// The job parameter that names the row (by slug).
        param: &'static str,
    },
    /// A write that sets the field `status` to one of `finals` without
    /// giving the time field `stamp` sets `stamp` to now, if it is unset (a
    /// job that ended gets its end time).
    Ends {
        /// The state field.
        status: &'static str,
        /// The states that end the row's work.
        finals: &'static [&'static str],
        /// The time field stamped.
        stamp: &'static str,
    },
}

/// What a job server's certificate may write of a kind: the access rules
/// ask the kind's [`Kind::jobserver_writes`] on every write made with one.
/// What a descriptor does not say is [`JobServerWrite::Nothing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobServerWrite {
    /// Nothing.
    Nothing,
    /// A `PATCH` of a row whose reference field `by` points at its own
    /// job-server row (the jobs it claimed), of the fields `fields` only
    /// (a job's status and output, never which job server owns it, its
    /// module or its parameters).
    Claimed {
        /// The reference to the job server that claimed the row.
        by: &'static str,
        /// The fields it may write.
        fields: &'static [&'static str],
    },
    /// `PUT` and `DELETE` of `/api/v1/<kind>/{key}/hosts/{itself}`: adding
    /// itself to, or taking itself out of, the many-to-many relation of
    /// this name (the images whose current version it holds).
    Hosts(&'static str),
}

/// A secret the server makes for each new row of a kind, keeps only a hash
/// of, and answers once: in the answer to the create, never again. Rows of
/// such a kind are created one at a time, since a bulk create answers only
/// ids and could not show each row its secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Issued {
    /// An API key (`secrets::new_api_key`): its public prefix and its
    /// SHA-256 stored in the columns `prefix` and `hash`, the key itself
    /// answered as `key`.
    ApiKey,
}

impl Issued {
    /// The field of the create's answer that carries the secret.
    pub const fn field(self) -> &'static str {
        match self {
            Issued::ApiKey => "key",
        }
    }

    /// Why a bulk create of such rows is refused.
    pub fn one_at_a_time(self) -> String {
        let rows = match self {
            Issued::ApiKey => "API keys",
        };
        format!(
            "{rows} are created one at a time, so each {} can be shown once",
            self.field()
        )
    }

    /// The answer field's sentence in the OpenAPI document.
    pub const fn doc(self) -> &'static str {
        match self {
            Issued::ApiKey => "The key itself: only in the answer to its creation.",
        }
    }
}

/// One kind of inventory row: a table and a REST resource.
#[derive(Debug)]
pub struct Kind {
    /// The resource name in `/api/v1/<name>/`.
    pub name: &'static str,
    /// The schema name in the OpenAPI document.
    pub schema: &'static str,
    /// The table.
    pub table: &'static str,
    /// The field that names a row in URLs besides its id, if any.
    pub slug: Option<&'static str>,
    /// The fields, besides `id`.
    pub fields: &'static [Field],
    /// Its many-to-many relations.
    pub m2m: &'static [ManyToMany],
    /// Child rows embedded in it.
    pub children: &'static [Children],
    /// Rows the server keeps about it, embedded read-only.
    pub reported: &'static [Reported],
    /// Whether rows carry `created_at`/`updated_at`, set by the server.
    pub timestamps: bool,
    /// A sentence for the OpenAPI document.
    pub doc: &'static str,
    /// Who besides administrators may read it.
    pub visibility: Visibility,
    /// Its write hooks, in the order they run.
    pub hooks: &'static [Hook],
    /// The certificate profile (`node`, `jobserver`) whose identity is this
    /// kind's slug: deleting or renaming a row revokes the certificates of
    /// its old name in the same transaction, so they never pass for a row
    /// given that name later.
    pub certificates: Option<&'static str>,
    /// The fields a node's certificate may write of its own rows of this
    /// kind (those its visibility to nodes lets it reach); a node's `PATCH`
    /// naming any other field is refused, with the field named. The
    /// inventory has no node-reported field yet (boot events and script
    /// results have their own endpoints), so no kind lists one today.
    pub node_writable: &'static [&'static str],
    /// What a job server's certificate may write of it.
    pub jobserver_writes: JobServerWrite,
    /// The secret a create makes and answers once, if any.
    pub issues: Option<Issued>,
}

impl Kind {
    /// What a descriptor leaves to `..Kind::DEFAULTS`: private
    /// ([`Visibility::PRIVATE`]), no hooks, no field a node may write,
    /// nothing a job server may write ([`JobServerWrite::Nothing`]), no
    /// secret issued and no [`Reported`] rows. The other fields are always
    /// written out.
    pub const DEFAULTS: Kind = Kind {
        name: "",
        schema: "",
        table: "",
        slug: None,
        fields: &[],
        m2m: &[],
        children: &[],
        reported: &[],
        timestamps: false,
        doc: "",
        visibility: Visibility::PRIVATE,
        hooks: &[],
        certificates: None,
        node_writable: &[],
        jobserver_writes: JobServerWrite::Nothing,
        issues: None,
    };

    /// The field called `name`, if any.
    pub fn field(&self, name: &str) -> Option<&'static Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The many-to-many relation called `name`, if any.
    pub fn relation(&self, name: &str) -> Option<&'static ManyToMany> {
        self.m2m.iter().find(|m| m.name == name)
    }
}

/// The kind called `name`.
pub fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}

/// The resources under `/api/v1/` that are not kinds, with who may read
/// them. (The OpenAPI document, `/api/v1/` itself and the boot timeline and
/// manifest are decided before visibility is asked.)
pub static OTHER_RESOURCES: &[(&str, Visibility)] = &[
    ("revision", Visibility::JOBSERVERS),
    ("bootconfig", Visibility::JOBSERVERS),
    ("enroll-tokens", Visibility::PRIVATE),
    ("credentials", Visibility::PRIVATE),
];

/// Who may read the resource `/api/v1/<resource>/...`: a kind's descriptor
/// says, or [`OTHER_RESOURCES`]; anything else is private.
pub fn visibility(resource: &str) -> Visibility {
    match kind(resource) {
        Some(k) => k.visibility,
        None => OTHER_RESOURCES
            .iter()
            .find(|(name, _)| *name == resource)
            .map_or(Visibility::PRIVATE, |(_, v)| *v),
    }
}

const fn f(name: &'static str, ty: Ty, doc: &'static str) -> Field {
    Field {
        name,
        ty,
        access: Access::ReadWrite,
        default: Default::None,
        nullable: false,
        unique: false,
        doc,
    }
}

impl Field {
    const fn def(mut self, d: Default) -> Self {
        self.default = d;
        self
    }
    const fn null(mut self) -> Self {
        self.nullable = true;
        self.default = Default::Null;
        self
    }
    const fn unique(mut self) -> Self {
        self.unique = true;
        self
    }
    const fn ro(mut self) -> Self {
        self.access = Access::ReadOnly;
        self
    }
    const fn wo(mut self) -> Self {
        self.access = Access::WriteOnly;
        self
    }
}

const TEXT: Ty = Ty::Text { max: 255 };
const LONG_TEXT: Ty = Ty::Text { max: 4096 };
const CONTENT: Ty = Ty::Text { max: 1 << 20 };
const SIZE_GIB: Ty = Ty::Int {
    min: 0,
    max: 1 << 20,
};
const PRIORITY: Ty = Ty::Int {
    min: -1_000_000,
    max: 1_000_000,
};

/// Network kinds the original knew.
pub const NET_TYPES: &[&str] = &["ethernet", "fiber-channel", "infiniband"];
/// CPU architectures of distros.
pub const ARCHES: &[&str] = &["aarch64", "ppc64le", "s390x", "x86_64"];
/// What a script is for.
pub const SCRIPT_TYPES: &[&str] = &["image-gen", "post-boot"];
/// The longest timeout a script may set: a week.
pub const MAX_SCRIPT_TIMEOUT_SECONDS: i64 = 7 * 86_400;
/// A job's state.
pub const JOB_STATUSES: &[&str] = &["failed", "pending", "running", "success"];

/// A job server's registered address ([`Reported`]).
const JOBSERVER_ADDRESS: [Field; 5] = [
    f("address", Ty::Text { max: 45 }, "The address nodes reach it at.").ro(),
    f(
        "network",
        Ty::Ref("networks"),
        "The network it serves there: the one it named, else the one whose subnet holds the address; null: none does, and no node is sent there.",
    )
    .null()
    .ro(),
    f(
        "heartbeat_at",
        Ty::Timestamp,
        "Its last heartbeat from this address.",
    )
    .null()
    .ro(),
    f(
        "load_avg",
        Ty::Float,
        "Its load average at that heartbeat.",
    )
    .ro(),
    f(
        "streams",
        Ty::Int {
            min: 0,
            max: u32::MAX as i64,
        },
        "Image streams it was serving at that heartbeat.",
    )
    .ro(),
];

/// The fields every layer of the effective config has (distro, group, image,
/// system).
macro_rules! layer_fields {
    () => {
        [
            f("install_kernel_cmdline", LONG_TEXT, "Kernel command line to append (or replace, when it starts with `=`).").def(Default::Str("")),
            f("initial_mods", TEXT, "Comma-separated modules to load in the initramfs; appends, or replaces when it starts with `=`.").def(Default::Str("")),
            f("tmpfs_root_size", SIZE_GIB, "Size of the node's root tmpfs in GiB; 0 inherits.").def(Default::Int(0)),
            f("prov_interface", TEXT, "The provisioning interface; empty inherits.").def(Default::Str("")),
            f("config_params", Ty::Yaml, "YAML mapping merged deeply into the effective config (`disable_scripts` lists combine).").def(Default::Str("")),
        ]
    };
}

const fn cat<const A: usize, const B: usize, const N: usize>(
    a: [Field; A],
    b: [Field; B],
) -> [Field; N] {
    let mut out = [f("", Ty::Bool, ""); N];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    let mut j = 0;
    while j < B {
        out[A + j] = b[j];
        j += 1;
    }
    out
}

const SYSTEM_FIELDS: [Field; 7] = cat::<2, 5, 7>(
    [
        f(
            "hostname",
            Ty::Hostname,
            "The system's short host name, unique in the install.",
        )
        .unique(),
        f("image", Ty::Ref("images"), "The system image it boots.").null(),
    ],
    layer_fields!(),
);
const SYSTEM_EXTRA: [Field; 7] = [
    f(
        "stateful",
        Ty::Bool,
        "Install the image to disk instead of running from memory.",
    )
    .def(Default::Bool(false)),
    f(
        "netboot",
        Ty::Bool,
        "Boot from the network; false sends the local-boot script.",
    )
    .def(Default::Bool(true)),
    f(
        "run_request",
        Ty::Int {
            min: 0,
            max: i64::MAX,
        },
        "Bumped by `POST /api/v1/systems/{key}/run-scripts`: the node's agent runs its post-boot scripts again when its plan shows a value above the one it last ran.",
    )
    .def(Default::Int(0))
    .ro(),
    f(
        "rack",
        Ty::Text { max: 64 },
        "The rack it stands in, e.g. r12: the boot board groups by it.",
    )
    .null(),
    f(
        "rack_unit",
        Ty::Int {
            min: 1,
            max: MAX_RACK_UNIT,
        },
        "Its unit in the rack, as the rack's labels count: the boot board orders a rack by it.",
    )
    .null(),
    f(
        "model",
        Ty::Text { max: 255 },
        "Its model (DMI product_name): when set, a node matched to it by discovery must report the same.",
    )
    .null(),
    f(
        "serial",
        Ty::Text { max: 255 },
        "Its serial number (DMI product_serial): when set, a node matched to it by discovery must report the same.",
    )
    .null(),
];
const SYSTEMS: [Field; 14] = cat::<7, 7, 14>(SYSTEM_FIELDS, SYSTEM_EXTRA);

/// The highest rack unit a system may name: racks stop well below it.
pub const MAX_RACK_UNIT: i64 = 100;

const GROUPS: [Field; 8] = cat::<3, 5, 8>(
    [
        f("slug", Ty::Slug, "The group's unique name in URLs.").unique(),
        f("name", TEXT, "A display name.").def(Default::Str("")),
        f(
            "priority",
            PRIORITY,
            "Layering order: groups apply in ascending priority, then name.",
        )
        .def(Default::Int(0)),
    ],
    layer_fields!(),
);

const DISTROS: [Field; 10] = cat::<5, 5, 10>(
    [
        f("slug", Ty::Slug, "The distro's unique name in URLs.").unique(),
        f("name", TEXT, "A display name.").def(Default::Str("")),
        f("vendor", TEXT, "The vendor, e.g. Debian or Rocky.").def(Default::Str("")),
        f("version", TEXT, "The release, e.g. 12 or 9.4.").def(Default::Str("")),
        f("arch", Ty::Enum(ARCHES), "CPU architecture.").def(Default::Str("x86_64")),
    ],
    layer_fields!(),
);

const IMAGES: [Field; 11] = cat::<6, 5, 11>(
    [
        f("slug", Ty::Slug, "The image's unique name in URLs and on job servers.").unique(),
        f("distro", Ty::Ref("distros"), "The OS distro it is built from.").null(),
        f("version", Ty::Int { min: 1, max: i64::MAX }, "Bumped by every rebuild request.").def(Default::Int(1)).ro(),
        f("needs_rebuild", Ty::Bool, "Set true to request a rebuild: bumps the version, clears the hosting job servers and the rootfs checksum, and queues an image-update job.").def(Default::Bool(false)),
        f("rootfs_sha256", Ty::Sha256, "The sha256 (64 hex digits, stored lowercase) of the current version's rootfs.tar.zst, recorded when it was published (its manifest.json has it). Nodes verify the stream against it; none means the version cannot boot yet.").def(Default::Str("")),
        f("rootfs_size", Ty::Int { min: 0, max: i64::MAX }, "The size in bytes of the current version's rootfs.tar.zst.").def(Default::Int(0)),
    ],
    layer_fields!(),
);

/// Every kind, in the order the API index lists them.
pub static KINDS: &[Kind] = &[
    Kind {
        name: "systems",
        schema: "System",
        table: "systems",
        slug: Some("hostname"),
        certificates: Some("node"),
        fields: &SYSTEMS,
        m2m: &[
            ManyToMany {
                name: "groups",
                table: "group_members",
                this: "system_id",
                other: "group_id",
                kind: "groups",
                doc: "The groups it belongs to.",
            },
            ManyToMany {
                name: "scripts",
                table: "system_scripts",
                this: "system_id",
                other: "script_id",
                kind: "scripts",
                doc: "Scripts of this system's own layer.",
            },
        ],
        children: &[Children {
            name: "nics",
            kind: "nics",
            parent_field: "system",
        }],
        timestamps: true,
        doc: "A machine of the cluster.",
        visibility: Visibility::JOBSERVERS.nodes(NodeAccess::Itself),
        ..Kind::DEFAULTS
    },
    Kind {
        name: "groups",
        schema: "Group",
        table: "system_groups",
        slug: Some("slug"),
        fields: &GROUPS,
        m2m: &[
            ManyToMany {
                name: "systems",
                table: "group_members",
                this: "group_id",
                other: "system_id",
                kind: "systems",
                doc: "The member systems; no size limit.",
            },
            ManyToMany {
                name: "scripts",
                table: "group_scripts",
                this: "group_id",
                other: "script_id",
                kind: "scripts",
                doc: "Scripts of this group's layer.",
            },
        ],
        children: &[],
        timestamps: true,
        doc: "A group of systems sharing config layers.",
        visibility: Visibility::JOBSERVERS,
        ..Kind::DEFAULTS
    },
    Kind {
        name: "nics",
        schema: "Nic",
        table: "network_interfaces",
        slug: None,
        fields: &[
            f("system", Ty::Ref("systems"), "The system it belongs to."),
            f("name", Ty::Text { max: 64 }, "Interface name, e.g. eno1.").def(Default::Str("")),
            f("mac", Ty::Mac, "Hardware address; unique when set.")
                .null()
                .unique(),
            f("ipv4", Ty::Ipv4, "IPv4 address.").null(),
            f("ipv6", Ty::Ipv6, "IPv6 address.").null(),
            f(
                "hostname",
                Ty::Hostname,
                "DNS name of this interface; null uses the system's.",
            )
            .null(),
            f("aliases", Ty::StrList, "Further DNS names.").def(Default::EmptyList),
            f(
                "mtu",
                Ty::Int {
                    min: 68,
                    max: 65535,
                },
                "MTU.",
            )
            .def(Default::Int(1500)),
            f("bootable", Ty::Bool, "The interface the node boots from.").def(Default::Bool(false)),
            f(
                "is_gateway",
                Ty::Bool,
                "Whether the network's gateway is this interface's default route.",
            )
            .def(Default::Bool(true)),
            f("network", Ty::Ref("networks"), "The network it is on.").null(),
            f(
                "switch_port",
                Ty::Ref("switchports"),
                "The switch port it is cabled to; unique when set.",
            )
            .null()
            .unique(),
        ],
        m2m: &[],
        children: &[],
        timestamps: false,
        doc: "A network interface of a system.",
        visibility: Visibility::JOBSERVERS.nodes(NodeAccess::OwnedVia("system")),
        ..Kind::DEFAULTS
    },
    Kind {
        name: "networks",
        schema: "Network",
        table: "networks",
        slug: Some("slug"),
        fields: &[
            f("slug", Ty::Slug, "The network's unique name in URLs.").unique(),
            f("name", TEXT, "A display name.").def(Default::Str("")),
            f("net_type", Ty::Enum(NET_TYPES), "Link type.").def(Default::Str("ethernet")),
            f(
                "vlan",
                Ty::Int { min: 0, max: 4094 },
                "VLAN id; 0 is untagged.",
            )
            .def(Default::Int(0)),
            f("subnet", Ty::Ipv4, "Network address."),
            f("netmask", Ty::Int { min: 1, max: 32 }, "Prefix length."),
            f("gateway", Ty::Ipv4, "Default gateway.").null(),
            f("nameserver", Ty::Ipv4, "DNS server handed out by DHCP.").null(),
            f("domain", TEXT, "DNS domain of hosts on this network.").def(Default::Str("")),
            f("dhcp_start", Ty::Ipv4, "First address of the dynamic pool.").null(),
            f("dhcp_end", Ty::Ipv4, "Last address of the dynamic pool.").null(),
            f("isdhcp", Ty::Bool, "Serve DHCP on this network.").def(Default::Bool(false)),
            f("managedns", Ty::Bool, "Serve DNS for this network's hosts.")
                .def(Default::Bool(false)),
            f(
                "isbootable",
                Ty::Bool,
                "Allow network boot on this network.",
            )
            .def(Default::Bool(true)),
        ],
        m2m: &[],
        children: &[],
        timestamps: false,
        doc: "An IPv4 network of the cluster.",
        visibility: Visibility::JOBSERVERS,
        ..Kind::DEFAULTS
    },
    Kind {
        name: "switches",
        schema: "Switch",
        table: "switches",
        slug: Some("hostname"),
        fields: &[
            f(
                "hostname",
                Ty::Hostname,
                "Must equal the switch's LLDP system name.",
            )
            .unique(),
            f("network", Ty::Ref("networks"), "Management network.").null(),
            f("mgmt_ip", Ty::Ipv4, "Management address.").null(),
            f("mgmt_mac", Ty::Mac, "Management MAC.").null(),
        ],
        m2m: &[],
        children: &[],
        timestamps: true,
        doc: "A network switch.",
        visibility: Visibility::JOBSERVERS,
        ..Kind::DEFAULTS
    },
    Kind {
        name: "switchports",
        schema: "SwitchPort",
        table: "switch_ports",
        slug: None,
        fields: &[
            f("switch", Ty::Ref("switches"), "The switch."),
            f(
                "name",
                Ty::Text { max: 100 },
                "Port id after the last `/`, as LLDP reports it.",
            ),
            f(
                "network",
                Ty::Ref("networks"),
                "Network of the port; takes precedence over the NIC's.",
            )
            .null(),
        ],
        m2m: &[],
        children: &[],
        timestamps: false,
        doc: "A port of a switch.",
        visibility: Visibility::JOBSERVERS,
        ..Kind::DEFAULTS
    },
    Kind {
        name: "bmcs",
        schema: "Bmc",
        table: "bmcs",
        slug: None,
        fields: &[
            f("system", Ty::Ref("systems"), "The system it manages."),
            f("ipv4", Ty::Ipv4, "BMC address.").null(),
            f("mac", Ty::Mac, "BMC MAC.").null(),
            f(
                "username",
                Ty::Secret,
                "Login name, encrypted at rest, never returned.",
            )
            .null()
            .wo(),
            f(
                "password",
                Ty::Secret,
                "Password, encrypted at rest, never returned.",
            )
            .null()
            .wo(),
            f("network", Ty::Ref("networks"), "Network of the BMC.").null(),
            f(
                "switch_port",
                Ty::Ref("switchports"),
                "Switch port of a dedicated BMC link.",
            )
            .null(),
            f(
                "vlan",
                Ty::Int { min: 0, max: 4094 },
                "VLAN id; 0 is untagged.",
            )
            .def(Default::Int(0)),
        ],
        m2m: &[],
        children: &[],
        timestamps: false,
        doc: "A baseboard management controller.",
        visibility: Visibility::JOBSERVERS.nodes(NodeAccess::OwnedVia("system")),
        ..Kind::DEFAULTS
    },
    Kind {
        name: "distros",
        schema: "Distro",
        table: "distros",
        slug: Some("slug"),
        fields: &DISTROS,
        m2m: &[
            ManyToMany {
                name: "scripts",
                table: "distro_scripts",
                this: "distro_id",
                other: "script_id",
                kind: "scripts",
                doc: "Scripts of this distro's layer.",
            },
            ManyToMany {
                name: "repos",
                table: "distro_repos",
                this: "distro_id",
                other: "repo_id",
                kind: "repos",
                doc: "Package repositories.",
            },
        ],
        children: &[],
        timestamps: true,
        doc: "An operating system distribution.",
        visibility: Visibility::JOBSERVERS,
        ..Kind::DEFAULTS
    },
    Kind {
        name: "images",
        schema: "Image",
        table: "system_images",
        slug: Some("slug"),
        fields: &IMAGES,
        m2m: &[
            ManyToMany {
                name: "scripts",
                table: "image_scripts",
                this: "image_id",
                other: "script_id",
                kind: "scripts",
                doc: "Scripts of this image's layer.",
            },
            ManyToMany {
                name: "jobservers",
                table: "image_hosts",
                this: "image_id",
                other: "jobserver_id",
                kind: "jobservers",
                doc: "Job servers that host the current version.",
            },
        ],
        children: &[],
        timestamps: true,
        doc: "A node image.",
        visibility: Visibility::JOBSERVERS,
        hooks: &[Hook::Rebuild {
            flag: "needs_rebuild",
            resets: &["rootfs_sha256", "rootfs_size"],
            hosts: "jobservers",
            job: "image-update",
            param: "image",
        }, Hook::Deleted {
            job: "image-delete",
            param: "image",
        }],
        jobserver_writes: JobServerWrite::Hosts("jobservers"),
        ..Kind::DEFAULTS
    },
    Kind {
        name: "repos",
        schema: "Repo",
        table: "repos",
        slug: Some("slug"),
        fields: &[
            f("slug", Ty::Slug, "The repo's unique name in URLs.").unique(),
            f("name", TEXT, "A display name.").def(Default::Str("")),
            f("url", LONG_TEXT, "Base URL of the repository."),
            f("managed", Ty::Bool, "mProv mirrors it on the job servers.")
                .def(Default::Bool(false)),
            f(
                "version",
                Ty::Int {
                    min: 1,
                    max: i64::MAX,
                },
                "Bumped when the mirror is refreshed.",
            )
            .def(Default::Int(1))
            .ro(),
        ],
        m2m: &[],
        children: &[],
        timestamps: true,
        doc: "A package repository.",
        visibility: Visibility::JOBSERVERS,
        ..Kind::DEFAULTS
    },
    Kind {
        name: "scripts",
        schema: "Script",
        table: "scripts",
        slug: Some("slug"),
        fields: &[
            f("slug", Ty::Slug, "The script's unique name.").unique(),
            f("name", TEXT, "A display name.").def(Default::Str("")),
            f(
                "script_type",
                Ty::Enum(SCRIPT_TYPES),
                "When it runs: while building an image, or after boot.",
            ),
            f(
                "version",
                Ty::Int {
                    min: 1,
                    max: i64::MAX,
                },
                "Bumped when the content changes.",
            )
            .def(Default::Int(1))
            .ro(),
            f("content", CONTENT, "The script itself.").def(Default::Str("")),
            f(
                "timeout_seconds",
                Ty::Int {
                    min: 1,
                    max: MAX_SCRIPT_TIMEOUT_SECONDS,
                },
                "Seconds the script may run before it is killed with its process group and reported as timed out; null: the runner's default (600).",
            )
            .null(),
        ],
        m2m: &[ManyToMany {
            name: "depends_on",
            table: "script_deps",
            this: "script_id",
            other: "dep_id",
            kind: "scripts",
            doc: "Scripts that must run before this one.",
        }],
        children: &[],
        timestamps: true,
        doc: "An image-gen or post-boot script.",
        visibility: Visibility::JOBSERVERS,
        hooks: &[Hook::VersionCounts("content")],
        ..Kind::DEFAULTS
    },
    Kind {
        name: "jobservers",
        schema: "JobServer",
        table: "jobservers",
        slug: Some("name"),
        certificates: Some("jobserver"),
        fields: &[
            f("name", Ty::Hostname, "Short host name, unique.").unique(),
            f(
                "host_id",
                Ty::Text { max: 255 },
                "The stable id of its host, set when it registers (null on a row made by hand until then); a renamed host keeps its row by it.",
            )
            .null()
            .unique()
            .ro(),
            f("addresses", Ty::StrList, "Addresses nodes reach it by (those it registered, when it registers).").def(Default::EmptyList),
            f(
                "port",
                Ty::Int { min: 1, max: 65535 },
                "HTTP port of its image server (mprov-jobserver serves 8081 unless told otherwise).",
            )
            .def(Default::Int(mprov_api::boot::DEFAULT_HTTP_PORT as i64)),
            f("modules", Ty::StrList, "Job modules it runs.").def(Default::EmptyList),
            f(
                "network",
                Ty::Ref("networks"),
                "The provisioning network it serves.",
            )
            .null(),
            f("heartbeat_at", Ty::Timestamp, "Its last heartbeat.")
                .null()
                .ro(),
            f(
                "load_avg",
                Ty::Float,
                "Its load average at the last heartbeat.",
            )
            .def(Default::Int(0))
            .ro(),
        ],
        m2m: &[],
        children: &[],
        reported: &[Reported {
            name: "registered_addresses",
            table: "jobserver_addresses",
            parent: "jobserver_id",
            fields: &JOBSERVER_ADDRESS,
            order: "id",
            doc: "The addresses it registered, each with the network it serves and its own heartbeat; a node is sent only to one on its network whose heartbeat is fresh.",
        }],
        timestamps: true,
        doc: "A job server.",
        visibility: Visibility::JOBSERVERS,
        ..Kind::DEFAULTS
    },
    Kind {
        name: "jobs",
        schema: "Job",
        table: "jobs",
        slug: None,
        fields: &[
            f(
                "module",
                Ty::Text { max: 64 },
                "The job module that runs it.",
            ),
            f("params", Ty::Json, "Module parameters.")
                .def(Default::Null)
                .null(),
            f("status", Ty::Enum(JOB_STATUSES), "Its state.").def(Default::Str("pending")),
            f(
                "jobserver",
                Ty::Ref("jobservers"),
                "The job server that claimed it.",
            )
            .null(),
            f("started_at", Ty::Timestamp, "When it started.").null(),
            f("ended_at", Ty::Timestamp, "When it ended.").null(),
            f(
                "return_code",
                Ty::Int {
                    min: i64::MIN,
                    max: i64::MAX,
                },
                "Exit status.",
            )
            .null(),
            f(
                "output",
                Ty::Text {
                    max: mprov_api::jobs::MAX_OUTPUT,
                },
                "What it printed: at most 1 MiB characters (a longer report is refused; job servers send the tail).",
            )
            .def(Default::Str("")),
            f(
                "for_jobserver",
                Ty::Ref("jobservers"),
                "The one job server that may claim it (an image-sync of a version another published); null: any that runs its module.",
            )
            .null(),
        ],
        m2m: &[],
        children: &[],
        timestamps: true,
        doc: "A unit of work for a job server.",
        visibility: Visibility::JOBSERVERS,
        hooks: &[Hook::Ends {
            status: "status",
            finals: &["failed", "success"],
            stamp: "ended_at",
        }],
        jobserver_writes: JobServerWrite::Claimed {
            by: "jobserver",
            fields: &["status", "output", "return_code", "started_at", "ended_at"],
        },
        ..Kind::DEFAULTS
    },
    Kind {
        name: "apikeys",
        schema: "ApiKey",
        table: "api_keys",
        slug: None,
        fields: &[
            f("name", TEXT, "What it is for."),
            f(
                "prefix",
                Ty::Text { max: 16 },
                "The key's public prefix, to tell keys apart.",
            )
            .def(Default::Str(""))
            .ro(),
            f(
                "expires_at",
                Ty::Timestamp,
                "When it stops working; null never.",
            )
            .null(),
            f("revoked", Ty::Bool, "Set true to revoke it.").def(Default::Bool(false)),
        ],
        m2m: &[],
        children: &[],
        timestamps: true,
        doc: "An API key. Creating one returns the key once; only its hash is kept.",
        issues: Some(Issued::ApiKey),
        ..Kind::DEFAULTS
    },
    Kind {
        name: "users",
        schema: "User",
        table: "users",
        slug: Some("username"),
        fields: &[
            f("username", Ty::Hostname, "Login name.").unique(),
            f(
                "password",
                Ty::Password,
                "Password, stored as an argon2 hash, never returned.",
            )
            .wo(),
            f(
                "is_admin",
                Ty::Bool,
                "Whether the user is an administrator.",
            )
            .def(Default::Bool(true)),
        ],
        m2m: &[],
        children: &[],
        timestamps: true,
        doc: "An administrator account.",
        ..Kind::DEFAULTS
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_relations_name_real_kinds() {
        for k in KINDS {
            for fld in k.fields {
                assert!(!fld.name.is_empty(), "{}: empty field", k.name);
                if let Ty::Ref(target) = fld.ty {
                    assert!(
                        kind(target).is_some(),
                        "{}.{} -> {target}",
                        k.name,
                        fld.name
                    );
                }
            }
            for m in k.m2m {
                assert!(
                    kind(m.kind).is_some(),
                    "{}.{} -> {}",
                    k.name,
                    m.name,
                    m.kind
                );
            }
            for c in k.children {
                let child = kind(c.kind).expect("child kind");
                assert_eq!(
                    child.field(c.parent_field).map(|f| f.ty),
                    Some(Ty::Ref(k.name))
                );
            }
            if let Some(slug) = k.slug {
                assert!(
                    k.field(slug).is_some_and(|f| f.unique),
                    "{}: slug {slug}",
                    k.name
                );
            }
        }
    }

    /// Each resource with what job servers and nodes may read of it, as the
    /// access rules had it when the private kinds were a list of their own:
    /// job servers read every kind but accounts and credentials; a node its
    /// own system, and its own NICs and BMCs through their `system`.
    #[test]
    fn visibility_is_what_the_access_rules_had() {
        use NodeAccess::{Itself, None as Nothing, OwnedVia};
        let want: &[(&str, bool, NodeAccess)] = &[
            ("systems", true, Itself),
            ("groups", true, Nothing),
            ("nics", true, OwnedVia("system")),
            ("networks", true, Nothing),
            ("switches", true, Nothing),
            ("switchports", true, Nothing),
            ("bmcs", true, OwnedVia("system")),
            ("distros", true, Nothing),
            ("images", true, Nothing),
            ("repos", true, Nothing),
            ("scripts", true, Nothing),
            ("jobservers", true, Nothing),
            ("jobs", true, Nothing),
            ("apikeys", false, Nothing),
            ("users", false, Nothing),
            ("revision", true, Nothing),
            ("bootconfig", true, Nothing),
            ("enroll-tokens", false, Nothing),
            ("credentials", false, Nothing),
        ];
        for k in KINDS {
            assert!(
                want.iter().any(|(name, ..)| *name == k.name),
                "{}: say here who may read it",
                k.name
            );
        }
        for (name, _) in OTHER_RESOURCES {
            assert!(kind(name).is_none(), "{name} is a kind and a resource");
            assert!(want.iter().any(|(n, ..)| n == name), "{name} not listed");
        }
        for &(name, jobservers, nodes) in want {
            assert_eq!(visibility(name), Visibility { jobservers, nodes }, "{name}");
        }
        for k in KINDS {
            if let NodeAccess::OwnedVia(field) = k.visibility.nodes {
                assert_eq!(
                    k.field(field).map(|f| f.ty),
                    Some(Ty::Ref("systems")),
                    "{}.{field}",
                    k.name
                );
            }
        }
    }

    /// A kind whose descriptor says nothing of visibility, and a resource
    /// nobody described, are for administrators only.
    #[test]
    fn what_says_nothing_is_private() {
        static UNSAID: Kind = Kind {
            name: "tomorrows-secrets",
            schema: "TomorrowsSecret",
            table: "tomorrows_secrets",
            slug: None,
            fields: &[],
            m2m: &[],
            children: &[],
            timestamps: false,
            doc: "A kind added without a word on who reads it.",
            ..Kind::DEFAULTS
        };
        assert!(!UNSAID.visibility.jobservers);
        assert_eq!(UNSAID.visibility.nodes, NodeAccess::None);
        assert!(UNSAID.hooks.is_empty());
        assert!(UNSAID.node_writable.is_empty());
        assert_eq!(UNSAID.jobserver_writes, JobServerWrite::Nothing);
        assert_eq!(UNSAID.issues, None);
        assert_eq!(visibility("no-such-resource"), Visibility::PRIVATE);
        assert_eq!(visibility(""), Visibility::PRIVATE);
    }

    /// Every hook names fields and relations its kind has, of the types it
    /// needs, so the SQL built from them is well formed.
    #[test]
    fn hooks_name_what_their_kind_has() {
        let mut seen = 0;
        for k in KINDS {
            for hook in k.hooks {
                seen += 1;
                if !matches!(hook, Hook::Ends { .. }) {
                    let version = k.field("version").expect("a versioned kind has a version");
                    assert!(matches!(version.ty, Ty::Int { .. }), "{}", k.name);
                    assert_eq!(version.access, Access::ReadOnly, "{}", k.name);
                }
                match *hook {
                    Hook::VersionCounts(field) => {
                        assert!(k.field(field).is_some(), "{}.{field}", k.name);
                    }
                    Hook::Rebuild {
                        flag,
                        resets,
                        hosts,
                        job,
                        param,
                    } => {
                        assert_eq!(k.field(flag).map(|f| f.ty), Some(Ty::Bool), "{flag}");
                        for r in resets {
                            let f = k.field(r).expect("reset field");
                            assert!(
                                !matches!(f.default, Default::None | Default::Null),
                                "{}.{r} has no default to reset to",
                                k.name
                            );
                        }
                        assert!(k.relation(hosts).is_some(), "{}.{hosts}", k.name);
                        assert!(k.slug.is_some(), "{} has no slug", k.name);
                        assert!(!job.is_empty() && !param.is_empty());
                    }
                    Hook::Deleted { job, param } => {
                        assert!(k.slug.is_some(), "{} has no slug", k.name);
                        assert!(!job.is_empty() && !param.is_empty());
                    }
                    Hook::Ends {
                        status,
                        finals,
                        stamp,
                    } => {
                        let Some(Ty::Enum(states)) = k.field(status).map(|f| f.ty) else {
                            panic!("{}.{status} is no state", k.name);
                        };
                        assert!(finals.iter().all(|f| states.contains(f)), "{}", k.name);
                        let stamp = k.field(stamp).expect("stamp field");
                        assert!(stamp.ty == Ty::Timestamp && stamp.nullable, "{}", k.name);
                    }
                }
            }
        }
        assert_eq!(
            seen, 4,
            "the scripts', the images' (rebuild, delete) and the jobs' hooks"
        );
    }

    /// What a job server may write through the inventory API, kind by
    /// kind: the jobs it claimed and which images it hosts, each rule naming
    /// what its kind has (a reference to the job servers, a relation with
    /// them). Nothing of its own row: its load goes through the heartbeat.
    #[test]
    fn jobserver_writes_are_claimed_jobs_and_hosting_only() {
        use JobServerWrite::{Claimed, Hosts, Nothing};
        for k in KINDS {
            let want = match k.name {
                "jobs" => Claimed {
                    by: "jobserver",
                    fields: &["status", "output", "return_code", "started_at", "ended_at"],
                },
                "images" => Hosts("jobservers"),
                _ => Nothing,
            };
            assert_eq!(k.jobserver_writes, want, "{}", k.name);
            match k.jobserver_writes {
                Claimed { by, fields } => {
                    assert_eq!(
                        k.field(by).map(|f| f.ty),
                        Some(Ty::Ref("jobservers")),
                        "{}.{by}",
                        k.name
                    );
                    for name in fields {
                        assert!(*name != by, "{}: the owner is not writable", k.name);
                        assert!(
                            k.field(name).is_some_and(|f| f.access == Access::ReadWrite),
                            "{}.{name}",
                            k.name
                        );
                    }
                }
                Hosts(rel) => assert_eq!(
                    k.relation(rel).map(|m| m.kind),
                    Some("jobservers"),
                    "{}.{rel}",
                    k.name
                ),
                Nothing => {}
            }
            if want != Nothing {
                assert!(k.visibility.jobservers, "{}: written but not read", k.name);
            }
        }
    }

    /// A node writes no field of any kind today, as the access rules had
    /// it; a field listed later must be one a client writes, of a kind a
    /// node reaches.
    #[test]
    fn node_writable_fields_are_none_yet_and_would_be_real() {
        for k in KINDS {
            assert_eq!(k.node_writable, &[] as &[&str], "{}", k.name);
            for name in k.node_writable {
                assert_ne!(k.visibility.nodes, NodeAccess::None, "{}", k.name);
                assert_eq!(
                    k.field(name).map(|f| f.access),
                    Some(Access::ReadWrite),
                    "{}.{name}",
                    k.name
                );
            }
        }
    }

    /// Only API keys answer a secret once, under a field the kind does not
    /// have otherwise, and the kind stores its prefix.
    #[test]
    fn only_api_keys_issue_a_secret() {
        for k in KINDS {
            match k.issues {
                Some(issued) => {
                    assert_eq!((k.name, issued), ("apikeys", Issued::ApiKey));
                    assert!(k.field(issued.field()).is_none(), "{}", k.name);
                    assert!(
                        k.field("prefix")
                            .is_some_and(|f| f.access == Access::ReadOnly)
                    );
                    assert_eq!(
                        issued.one_at_a_time(),
                        "API keys are created one at a time, so each key can be shown once"
                    );
                }
                None => assert_ne!(k.name, "apikeys"),
            }
        }
    }
}
