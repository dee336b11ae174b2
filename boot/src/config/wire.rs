//! The YAML as written: one serde type per section, every key spelled as in
//! the seed (`mprovURL`, `heartbeatInterval`, `enableDHCP`...), unknown keys
//! refused. [`super::load`] turns these into a [`super::Config`].

use std::net::IpAddr;
use std::path::PathBuf;

use serde::de::{self, IgnoredAny, MapAccess, Visitor, value::MapAccessDeserializer};
use serde::{Deserialize, Deserializer};
use serde_saphyr::{Spanned, Tagged};

/// One file: a list of one-key maps (`- global: {...}`, `- dnsmasq: {...}`)
/// and `- !include PATTERN` entries, each with its tag (`!include`) and
/// place.
pub(crate) type File = Vec<Spanned<Tagged<Item>>>;

/// One entry of a file's list: a section, or a scalar (an `!include`'s
/// pattern, when tagged so).
#[derive(Debug)]
pub(crate) enum Item {
    Scalar(String),
    Section(Entry),
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ItemVisitor;

        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = Item;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a one-key map naming a section (`- global: ...`) or `!include PATTERN`",
                )
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Item, E> {
                Ok(Item::Scalar(v.to_owned()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Item, A::Error> {
                Entry::deserialize(MapAccessDeserializer::new(map)).map(Item::Section)
            }
        }

        deserializer.deserialize_any(ItemVisitor)
    }
}

/// A section, named by its one key.
#[derive(Debug, Deserialize)]
pub(crate) enum Entry {
    #[serde(rename = "global")]
    Global(Option<Box<Global>>),
    #[serde(rename = "dnsmasq")]
    Dnsmasq(Option<Dnsmasq>),
    #[serde(rename = "mprov-webserver")]
    Webserver(#[serde(deserialize_with = "no_settings")] ()),
    #[serde(rename = "image-update")]
    ImageUpdate(#[serde(deserialize_with = "no_settings")] ()),
    #[serde(rename = "image-sync")]
    ImageSync(#[serde(deserialize_with = "no_settings")] ()),
    #[serde(rename = "image-delete")]
    ImageDelete(#[serde(deserialize_with = "no_settings")] ()),
    #[serde(rename = "libgenders")]
    Libgenders(#[serde(deserialize_with = "no_settings")] ()),
    // The seed's modules that this release does not have: their settings
    // are read past, and a warning says so.
    #[serde(rename = "repo-update")]
    RepoUpdate(IgnoredAny),
    #[serde(rename = "repo-sync")]
    RepoSync(IgnoredAny),
    #[serde(rename = "repo-delete")]
    RepoDelete(IgnoredAny),
    #[serde(rename = "nads")]
    Nads(IgnoredAny),
    #[serde(rename = "script-runner")]
    ScriptRunner(IgnoredAny),
}

impl Entry {
    /// The section's name, as written.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Entry::Global(_) => "global",
            Entry::Dnsmasq(_) => "dnsmasq",
            Entry::Webserver(_) => "mprov-webserver",
            Entry::ImageUpdate(_) => "image-update",
            Entry::ImageSync(_) => "image-sync",
            Entry::ImageDelete(_) => "image-delete",
            Entry::Libgenders(_) => "libgenders",
            Entry::RepoUpdate(_) => "repo-update",
            Entry::RepoSync(_) => "repo-sync",
            Entry::RepoDelete(_) => "repo-delete",
            Entry::Nads(_) => "nads",
            Entry::ScriptRunner(_) => "script-runner",
        }
    }
}

/// The `global:` section.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Global {
    #[serde(rename = "mprovURL")]
    pub(crate) mprov_url: Option<String>,
    pub(crate) apikey: Option<String>,
    pub(crate) heartbeat_interval: Option<u64>,
    pub(crate) runonce: Option<bool>,
    pub(crate) ca_bundle: Option<PathBuf>,
    pub(crate) log_level: Option<LogLevel>,
    pub(crate) host_id: Option<String>,
    pub(crate) log_timestamps: Option<bool>,
    pub(crate) myaddress: Option<Spanned<String>>,
    pub(crate) addresses: Option<Vec<Address>>,
    pub(crate) jobmodules: Option<Vec<Spanned<String>>>,
    pub(crate) https_port: Option<u16>,
}

/// `logLevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warning,
    /// What happens, warnings and errors (the default).
    Info,
    /// Everything.
    Debug,
}

impl LogLevel {
    /// The log filter it stands for.
    pub fn filter(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warning => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

/// The `dnsmasq:` plugin section: which of the boot services run.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Dnsmasq {
    #[serde(rename = "enableDHCP", default = "yes")]
    pub(crate) enable_dhcp: bool,
    #[serde(rename = "enableDNS", default = "yes")]
    pub(crate) enable_dns: bool,
    #[serde(rename = "enableTFTP", default = "yes")]
    pub(crate) enable_tftp: bool,
}

impl Default for Dnsmasq {
    fn default() -> Self {
        Dnsmasq {
            enable_dhcp: true,
            enable_dns: true,
            enable_tftp: true,
        }
    }
}

fn yes() -> bool {
    true
}

/// A plugin section for a module that takes no settings yet: an empty map
/// (or nothing); any key is an error.
fn no_settings<'de, D: Deserializer<'de>>(deserializer: D) -> Result<(), D::Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NoSettings {}

    Option::<NoSettings>::deserialize(deserializer).map(|_| ())
}

/// One of `addresses:`: a bare address, or `{address, network, mprovURL}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// The address nodes reach this job server at.
    pub address: IpAddr,
    /// The control service's network id (`None`: the network whose subnet
    /// holds the address).
    pub network: Option<i64>,
    /// The control service's URL from that network, if the global one is
    /// not reachable from it.
    pub mprov_url: Option<String>,
}

impl std::str::FromStr for Address {
    type Err = std::net::AddrParseError;

    /// A bare address (`--address 10.0.0.5`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Address {
            address: s.trim().parse()?,
            network: None,
            mprov_url: None,
        })
    }
}

impl<'de> Deserialize<'de> for Address {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Long {
            address: IpAddr,
            network: Option<i64>,
            #[serde(rename = "mprovURL")]
            mprov_url: Option<String>,
        }

        struct AddressVisitor;

        impl<'de> Visitor<'de> for AddressVisitor {
            type Value = Address;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an IP address, or a map of address, network and mprovURL")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Address, E> {
                v.parse()
                    .map_err(|_| E::custom(format!("{v:?} is not an IP address")))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Address, A::Error> {
                let long = Long::deserialize(MapAccessDeserializer::new(map))?;
                Ok(Address {
                    address: long.address,
                    network: long.network,
                    mprov_url: long.mprov_url,
                })
            }
        }

        deserializer.deserialize_any(AddressVisitor)
    }
}
