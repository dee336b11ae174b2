//! What mash knows about each inventory kind: the columns its table shows and
//! how a `field=value` argument turns into JSON.
//!
//! The server is the authority on kinds (its descriptors in
//! `control/src/db/kinds.rs` validate every write), so this table holds only
//! what a command line needs and cannot ask the server for: which fields are
//! lists, booleans or numbers, so that `groups=a,b` becomes a list while
//! `install_kernel_cmdline=console=ttyS0,115200` stays a string. A field
//! missing here is text: a value is sent as a string, never guessed at, so
//! `name=2024` stays `"2024"`. For a field the server learned after this mash
//! was built, `field:=<json>` sends any JSON, and the server still says what
//! is wrong with it.

/// How an argument's text becomes a JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// `true` or `false`.
    Bool,
    /// A floating-point number.
    Float,
    /// A list of ids or slugs, comma-separated: digits become ids.
    IdList,
    /// An integer.
    Int,
    /// Any JSON; text that does not parse is sent as a string.
    Json,
    /// An id or a slug: digits become an id.
    Ref,
    /// A list of strings, comma-separated.
    StrList,
    /// A string.
    Text,
}

/// One kind, as mash sees it.
#[derive(Debug)]
pub(crate) struct KindInfo {
    /// The resource name in `/api/v1/<name>/`.
    pub(crate) name: &'static str,
    /// The columns of its table, `id` first.
    pub(crate) columns: &'static [&'static str],
    /// The fields that are not plain text.
    pub(crate) typed: &'static [(&'static str, Class)],
}

impl KindInfo {
    /// How values of the field `name` are parsed: [`Class::Text`] unless the
    /// table says otherwise.
    pub(crate) fn class(&self, name: &str) -> Class {
        self.typed
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(Class::Text, |(_, c)| *c)
    }
}

use Class::*;

/// The fields every config layer has (distro, group, image, system).
const LAYER: [(&str, Class); 1] = [("tmpfs_root_size", Int)];

/// Every kind mash knows, in the order of the API index.
pub(crate) static KINDS: &[KindInfo] = &[
    KindInfo {
        name: "systems",
        columns: &[
            "id", "hostname", "image", "groups", "netboot", "stateful", "nics",
        ],
        typed: &[
            LAYER[0],
            ("image", Ref),
            ("stateful", Bool),
            ("netboot", Bool),
            ("run_request", Int),
            ("rack_unit", Int),
            ("groups", IdList),
            ("scripts", IdList),
            ("nics", Json),
        ],
    },
    KindInfo {
        name: "groups",
        columns: &[
            "id",
            "slug",
            "name",
            "priority",
            "tmpfs_root_size",
            "prov_interface",
        ],
        typed: &[
            LAYER[0],
            ("priority", Int),
            ("systems", IdList),
            ("scripts", IdList),
        ],
    },
    KindInfo {
        name: "nics",
        columns: &[
            "id", "system", "name", "mac", "ipv4", "ipv6", "network", "bootable",
        ],
        typed: &[
            ("system", Ref),
            ("aliases", StrList),
            ("mtu", Int),
            ("bootable", Bool),
            ("is_gateway", Bool),
            ("network", Ref),
            ("switch_port", Ref),
        ],
    },
    KindInfo {
        name: "networks",
        columns: &[
            "id",
            "slug",
            "subnet",
            "netmask",
            "vlan",
            "gateway",
            "domain",
            "isdhcp",
            "managedns",
        ],
        typed: &[
            ("vlan", Int),
            ("netmask", Int),
            ("isdhcp", Bool),
            ("managedns", Bool),
            ("isbootable", Bool),
        ],
    },
    KindInfo {
        name: "switches",
        columns: &["id", "hostname", "network", "mgmt_ip", "mgmt_mac"],
        typed: &[("network", Ref)],
    },
    KindInfo {
        name: "switchports",
        columns: &["id", "switch", "name", "network"],
        typed: &[("switch", Ref), ("network", Ref)],
    },
    KindInfo {
        name: "bmcs",
        columns: &["id", "system", "ipv4", "mac", "network", "vlan"],
        typed: &[
            ("system", Ref),
            ("network", Ref),
            ("switch_port", Ref),
            ("vlan", Int),
        ],
    },
    KindInfo {
        name: "distros",
        columns: &["id", "slug", "name", "vendor", "version", "arch"],
        typed: &[LAYER[0], ("scripts", IdList), ("repos", IdList)],
    },
    KindInfo {
        name: "images",
        columns: &[
            "id",
            "slug",
            "distro",
            "version",
            "needs_rebuild",
            "jobservers",
        ],
        typed: &[
            LAYER[0],
            ("distro", Ref),
            ("version", Int),
            ("needs_rebuild", Bool),
            ("rootfs_size", Int),
            ("scripts", IdList),
            ("jobservers", IdList),
        ],
    },
    KindInfo {
        name: "repos",
        columns: &["id", "slug", "name", "url", "managed", "version"],
        typed: &[("managed", Bool), ("version", Int)],
    },
    KindInfo {
        name: "scripts",
        columns: &[
            "id",
            "slug",
            "name",
            "script_type",
            "version",
            "timeout_seconds",
            "depends_on",
        ],
        typed: &[
            ("version", Int),
            ("timeout_seconds", Int),
            ("depends_on", IdList),
        ],
    },
    KindInfo {
        name: "jobservers",
        columns: &[
            "id",
            "name",
            "addresses",
            "port",
            "modules",
            "network",
            "heartbeat_at",
            "load_avg",
        ],
        typed: &[
            ("addresses", StrList),
            ("port", Int),
            ("modules", StrList),
            ("network", Ref),
            ("load_avg", Float),
        ],
    },
    KindInfo {
        name: "jobs",
        columns: &[
            "id",
            "module",
            "status",
            "jobserver",
            "return_code",
            "created_at",
            "ended_at",
        ],
        typed: &[
            ("params", Json),
            ("jobserver", Ref),
            ("return_code", Int),
            ("for_jobserver", Ref),
        ],
    },
    KindInfo {
        name: "apikeys",
        columns: &["id", "name", "prefix", "expires_at", "revoked"],
        typed: &[("revoked", Bool)],
    },
    KindInfo {
        name: "users",
        columns: &["id", "username", "is_admin"],
        typed: &[("is_admin", Bool)],
    },
];

/// The kind called `name`.
pub(crate) fn kind(name: &str) -> Option<&'static KindInfo> {
    KINDS.iter().find(|k| k.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_consistent() {
        for k in KINDS {
            assert_eq!(k.columns.first(), Some(&"id"), "{}", k.name);
            for (i, (name, _)) in k.typed.iter().enumerate() {
                assert!(
                    !k.typed[..i].iter().any(|(n, _)| n == name),
                    "{}.{name} twice",
                    k.name
                );
            }
        }
        assert_eq!(kind("systems").map(|k| k.class("groups")), Some(IdList));
        assert_eq!(kind("systems").map(|k| k.class("hostname")), Some(Text));
        assert!(kind("nope").is_none());
    }

    /// The server's OpenAPI document is the authority: every kind it serves
    /// is here, every column exists, and every non-text field it takes is
    /// parsed as the type it expects.
    #[test]
    fn table_matches_the_servers_openapi() {
        let doc = mprov_control::http::openapi::document();
        let schemas = &doc["components"]["schemas"];
        for server_kind in mprov_control::db::kinds::KINDS {
            let k = kind(server_kind.name)
                .unwrap_or_else(|| panic!("mash does not know kind {}", server_kind.name));
            let read = &schemas[server_kind.schema]["properties"];
            for col in k.columns {
                assert!(read.get(col).is_some(), "{}: no column {col}", k.name);
            }
            let create = schemas[format!("{}Create", server_kind.schema)]["properties"]
                .as_object()
                .expect("create schema");
            for (field, schema) in create {
                let ty = schema["type"].as_str().or_else(|| {
                    schema["type"]
                        .as_array()
                        .and_then(|t| t.first())
                        .and_then(|t| t.as_str())
                });
                let want: &[Class] = match (ty, schema.get("oneOf")) {
                    (Some("boolean"), _) => &[Bool],
                    (Some("integer"), _) => &[Int],
                    (Some("number"), _) => &[Float],
                    (Some("array"), _) if schema["items"].get("oneOf").is_some() => &[IdList],
                    (Some("array"), _) if schema["items"].get("$ref").is_some() => &[Json],
                    (Some("array"), _) => &[StrList],
                    (None, Some(_)) => &[Ref],
                    (None, None) => &[Json, Text],
                    _ => &[Text],
                };
                assert!(
                    want.contains(&k.class(field)),
                    "{}.{field}: mash parses it as {:?}, the server takes {schema}",
                    k.name,
                    k.class(field)
                );
            }
        }
    }
}
