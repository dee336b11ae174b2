//! The job server (`mprov-jobserver`): pure-Rust DHCPv4, DNS, TFTP and HTTP
//! file servers that answer everything a node asks before its kernel runs,
//! fed live from the control service's inventory. It runs no jobs yet: the
//! job modules (image build, sync, delete, genders) are not written.
//!
//! The servers live in their own crates under `boot/` (`mprov-dhcp`,
//! `mprov-dns`, `mprov-tftp`, `mprov-fileserver`), each taking bound sockets, a
//! shutdown token and a `watch` receiver of the current [`BootConfig`]. This
//! crate owns where that snapshot comes from ([`snapshot`]), the job server's
//! own client certificate ([`identity`]), its reports to the boot timeline
//! ([`events`]), the binary's command line ([`cli`]) and its start-up, one
//! step per server, binding the sockets and running it all ([`start`]).
//!
//! [`BootConfig`]: mprov_api::boot::BootConfig

#![warn(missing_docs)]

pub mod cli;
pub mod config;
pub mod events;
pub mod identity;
pub mod snapshot;
pub mod start;
