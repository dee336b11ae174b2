//! The job server (`mprov-jobserver`): pure-Rust DHCPv4, DNS, TFTP and HTTP
//! file servers that answer everything a node asks before its kernel runs,
//! fed live from the control service's inventory; and the daemon beside
//! them ([`daemon`]): it registers itself, heartbeats on each of its
//! addresses and runs the jobs queued for its modules ([`modules`]).
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
pub mod daemon;
pub mod events;
pub mod identity;
pub mod modules;
pub mod snapshot;
pub mod start;
pub mod tls;
