//! The job server (`mprov-jobserver`): pure-Rust DHCPv4, DNS, TFTP and HTTP image
//! servers that answer everything a node asks before its kernel runs, fed live
//! from the control service's inventory. It runs no jobs yet: the job modules
//! (image build, sync, delete, genders) are not written.
//!
//! The servers live in their own crates under `boot/` (`mprov-dhcp`,
//! `mprov-dns`, `mprov-tftp`, `mprov-fileserver`), each taking bound sockets, a
//! shutdown token and a `watch` receiver of the current [`BootConfig`]. This
//! crate owns where that snapshot comes from ([`snapshot`]) and the job
//! server's own client certificate ([`identity`]).
//!
//! [`BootConfig`]: mprov_api::boot::BootConfig

pub mod cli;
pub mod events;
pub mod identity;
pub mod snapshot;
