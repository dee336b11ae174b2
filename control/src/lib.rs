//! The mProv control service: the inventory database, the REST API under
//! `/api/v1/`, first start, the version lock, the install's own certificate
//! authority with the HTTPS listener, `/ipxe/` and enrollment. Not written
//! yet: the admin pages and the job queue.
//!
//! Layers, outside in: [`cli`] (subcommands) → [`http`] (router, auth, errors,
//! OpenAPI) → [`db`] (kind descriptors, generic CRUD, migrations). [`effective`]
//! is the pure config-layering logic; [`secrets`] the key material;
//! [`first_start`] what a new install makes once; [`tls`] the CA and the HTTPS
//! certificate; [`signer`] the helper process that alone reads the CA key;
//! [`privileges`] the switch from root to the service's own users. Only this crate touches the
//! database: every other component goes through the API (`mprov-api`).

#![warn(missing_docs)]

pub mod backup;
pub mod boot;
pub mod bootconfig;
pub mod cli;
pub mod config;
pub mod db;
pub mod effective;
pub mod enroll;
pub mod first_start;
pub mod fuzz;
pub mod http;
pub mod netboot;
pub mod privileges;
pub mod secrets;
pub mod signer;
pub mod tls;
