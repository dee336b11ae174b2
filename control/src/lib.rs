//! The mProv control service: the inventory database, the REST API under
//! `/api/v1/`, first start, the version lock, the install's own certificate
//! authority with the HTTPS listener, the signing helper, enrollment of job
//! servers and nodes, `/ipxe/`, the boot timeline and manifest, the jobs
//! queue, the script-runner's plans and reports, and backups. Not written yet: the admin pages.
//!
//! Layered bottom-up; a module names only its own layer and those below,
//! only [`http`] and [`cli`] name HTTP types, and `cargo xtask layering
//! --deny` (a step of `cargo xtask test`) enforces both:
//!
//! 1. [`config`] (the typed configuration), [`secrets`] (key material),
//!    [`effective`] (the pure config-layering logic), [`privileges`] (the
//!    switch from root to the service's own users), [`time`] (time stamps
//!    in the stored form), [`ratelimit`] (the token buckets per key);
//! 2. [`db`] (kind descriptors, generic CRUD, migrations),
//!    [`bootconfig`] (the job servers' boot config), [`pki`] (the CA, the
//!    signing helper that alone reads the CA key, and its client);
//! 3. the domain: [`identity`] (principals; certificate, API key and
//!    password checks), [`enrollment`] (tokens, nonces, credentials),
//!    [`boot`] (the boot timeline), [`board`] (the boot board: cells,
//!    flags, change feed, a node's timeline), [`jobs`] (the jobs queue),
//!    [`jobservers`] (a job server's registration and heartbeats) and
//!    [`netboot`] (the node view, the bootability rule and the pure
//!    `/ipxe/` decision), [`discovery`] (a node's NADS report matched by
//!    switch port, the discovery nonce, the parked nodes), [`scripts`] (the script-runner's plans, content
//!    and run reports), [`passkeys`] (WebAuthn registration and sign-in,
//!    checked with ring), [`first_start`] (what a new install makes once),
//!    [`backup`], [`ldap`] (LDAP sign-in: a user's password and role
//!    checked against a directory);
//! 4. [`access`]: what each principal may reach;
//! 5. [`http`]: router, middleware, thin handlers, the one `ApiError`;
//!    `fuzz`: the fuzz targets' entry points, built only for tests and
//!    with the `fuzz` feature (which `tests/fuzz` enables);
//! 6. [`cli`]: the subcommands.
//!
//! Only this crate touches the database: every other component goes
//! through the API (`mprov-api`).

#![warn(missing_docs)]

pub mod access;
pub mod backup;
pub mod board;
pub mod boot;
pub mod bootconfig;
pub mod bulk;
pub mod cli;
pub mod config;
pub mod db;
pub mod discovery;
pub mod effective;
pub mod enrollment;
pub mod first_start;
#[cfg(any(test, feature = "fuzz"))]
pub mod fuzz;
pub mod http;
pub mod identity;
pub mod jobs;
pub mod jobservers;
pub mod ldap;
pub mod netboot;
pub mod passkeys;
pub mod pki;
pub mod privileges;
pub mod ratelimit;
pub mod scripts;
pub mod secrets;
pub mod sessions;
pub mod time;
