//! The job server's own calls to the control service, each made with its
//! enrolled client certificate (which names the job server: no body names
//! it): registering its row, taking jobs, and publishing or recording the
//! image versions it hosts. Its heartbeat is
//! [`HEARTBEAT_PATH`](crate::boot::HEARTBEAT_PATH).
//!
//! A job's progress (status, output, exit code, times) is written with
//! `PATCH /api/v1/jobs/{id}` on a job it claimed.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// Where a job server registers itself ([`Registration`] → [`Registered`]).
pub const REGISTER_PATH: &str = "/api/v1/jobserver/register";

/// Where a job server claims the oldest pending job of its modules
/// ([`Claim`] → `200` with a [`Job`], or `204` when there is none).
pub const CLAIM_PATH: &str = "/api/v1/jobserver/claim";

/// Where a job server says it hosts an image version ([`Hosting`]): after
/// building it (with its manifest: the control service records the
/// checksums) or after copying and verifying it (without).
pub const HOSTING_PATH: &str = "/api/v1/jobserver/hosting";

/// The job modules of the seed, by the names a config lists them.
pub mod module {
    /// Builds an image version from the inventory.
    pub const IMAGE_UPDATE: &str = "image-update";
    /// Copies an image version from a job server that hosts it.
    pub const IMAGE_SYNC: &str = "image-sync";
    /// Removes an image's files.
    pub const IMAGE_DELETE: &str = "image-delete";
    /// Writes the genders file for pdsh.
    pub const LIBGENDERS: &str = "libgenders";
    /// The boot services (DHCP, DNS, TFTP), named as in the seed.
    pub const DNSMASQ: &str = "dnsmasq";
    /// The HTTP image server, named as in the seed.
    pub const WEBSERVER: &str = "mprov-webserver";
}

/// A job server's registration: who it is beyond its certificate's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    /// A stable id of the host, kept beside its config, so a renamed host
    /// keeps its row (its hosting records and jobs).
    pub host_id: String,
    /// The job modules it runs.
    pub modules: Vec<String>,
    /// The HTTP port of its image server.
    pub port: u16,
    /// The addresses it serves nodes on; each heartbeats on its own.
    pub addresses: Vec<AddressRegistration>,
}

/// One address a job server serves on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddressRegistration {
    /// The address nodes reach it at.
    pub address: IpAddr,
    /// The control service's network id; `None`: the network whose subnet
    /// holds the address, if one does.
    #[serde(default)]
    pub network: Option<i64>,
}

/// What the control service made of a [`Registration`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    /// The job server's row id.
    pub id: i64,
    /// Its name (its certificate's).
    pub name: String,
    /// Its addresses, each with the network it was placed on (`None`: no
    /// network holds it; nodes are not sent there).
    pub addresses: Vec<AddressRegistration>,
}

/// A claim: the modules this job server runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// The job modules it takes jobs of.
    pub modules: Vec<String>,
}

/// A claimed job, as the job server runs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// The job's id (`PATCH /api/v1/jobs/{id}` reports on it).
    pub id: i64,
    /// The module that runs it.
    pub module: String,
    /// The module's parameters (e.g. `{"image": "compute", "version": 3}`).
    #[serde(default)]
    pub params: serde_json::Value,
}

/// A job server hosts an image version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hosting {
    /// The image's slug.
    pub image: String,
    /// The version it hosts; refused (409) unless it is the image's current
    /// version.
    pub version: i64,
    /// The files of the version it built, as its `manifest.json` lists them:
    /// only the job server that built the version sends them, and the
    /// control service records them (the rootfs checksum and size among
    /// them). A copy is verified against those and sends none.
    #[serde(default)]
    pub files: Option<Vec<HostedFile>>,
}

/// One file of an image version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostedFile {
    /// Its name in the version folder (`rootfs.tar.zst`, `vmlinuz`, ...).
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, lowercase hex.
    pub sha256: String,
}

/// The most characters a job's output holds: a longer report is refused
/// (400), so a job server sends the tail of what its job printed.
pub const MAX_OUTPUT: usize = 1 << 20;

/// Where a job server reads the files recorded for an image's version
/// (`GET`, [`ImageFiles`]; `?version=N`, else the current version).
pub fn image_files_path(image: &str) -> String {
    format!("/api/v1/images/{image}/files")
}

/// The route of [`image_files_path`], as the control service serves it.
pub const IMAGE_FILES_ROUTE: &str = "/api/v1/images/{key}/files";

/// Where an administrator queues a failed job again (the route's template).
pub const RETRY_ROUTE: &str = "/api/v1/jobs/{key}/retry";

/// The files recorded for an image version: what a copy is verified
/// against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageFiles {
    /// The image's slug.
    pub image: String,
    /// The version.
    pub version: i64,
    /// Its files, by name; empty when none were recorded.
    pub files: Vec<HostedFile>,
}
