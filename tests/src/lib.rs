//! The lab and the project's own commands: helpers that start real servers
//! and machines for the end-to-end tests and benchmarks ([`db`]: MariaDB and
//! PostgreSQL; [`ldap`]: an OpenLDAP server (slapd); [`netns`]: network
//! namespaces joined by veth pairs; [`vm`]: QEMU VMs that netboot; [`lab`]
//! and [`netboot`]: the Debian node image and its network; [`agent`]: the
//! agent's static binary; [`listen`]: where a started job server listens,
//! from its listen file; [`lldpd`]: lldpd speaking for a switch; [`loopfs`]: a small loop-mounted file system to
//! fill; [`flood`]: a bounded connection flood inside a lab namespace), the
//! Rust benchmarks (`*_bench`), and the `cargo xtask` commands ([`xtask`]).
//!
//! Everything here serves tests and developers, never production: the servers
//! listen on loopback or inside the lab's own namespaces and bridges, and use
//! fixed test passwords.

#![warn(missing_docs)]

pub mod agent;
pub mod backup_bench;
pub mod browser;
pub mod control;
pub mod db;
pub mod enroll_bench;
pub mod flood;
pub mod inventory_bench;
pub mod lab;
pub mod ldap;
pub mod listen;
pub mod lldpd;
pub mod loopfs;
pub mod netboot;
pub mod netboot_bench;
pub mod netns;
pub mod pages_bench;
mod process;
pub mod storm;
pub mod vm;
pub mod xtask;

pub use process::KillOnDrop;
