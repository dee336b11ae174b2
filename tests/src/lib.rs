//! The lab: helpers that start real servers (MariaDB and PostgreSQL now; later
//! network namespaces and QEMU VMs) for the end-to-end tests and benchmarks, and
//! the `cargo xtask` commands.
//!
//! Everything here serves tests and developers, never production: the servers
//! listen on loopback only and use fixed test passwords.

#![warn(missing_docs)]

pub mod agent;
pub mod backup_bench;
mod control;
pub mod db;
pub mod enroll_bench;
pub mod inventory_bench;
pub mod lab;
pub mod netboot;
pub mod netns;
mod process;
pub mod vm;
pub mod xtask;
