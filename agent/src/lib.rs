//! The node side of mProv (`mprov-agent`).
//!
//! As `/init` in the initramfs it will load the NIC drivers, run DHCP, enroll
//! with the one-time nonce, stream and verify the compressed root image and
//! `switch_root` into it. After boot it will run the post-boot scripts, renew
//! its certificate and, on unknown nodes, discover the switch port over LLDP
//! (NADS). ARCHITECTURE.md, "A node's boot", walks through the whole flow.
//!
//! Status: the first real steps of `/init` ([`init`]): mount the pseudo
//! filesystems, load the NIC modules the initramfs lists, report the kernel
//! command line, the network interfaces and the `mprov_*` parameters
//! ([`cmdline`]), then power off. The image stream ([`image`]), the boot
//! manifest's checks ([`manifest`]) and the DHCP client's decisions
//! ([`dhcp`]) exist and are tested, but `/init` does not call them yet.
//!
//! - [`init`]: PID 1. Never panics on purpose, never exits: every failure is
//!   printed on the console and the machine is powered off (a PID 1 that exits
//!   or panics is a kernel panic, which tells the operator nothing).
//! - [`cmdline`]: the kernel command line, split the way the kernel splits it,
//!   and the typed `mprov_*` parameters. The line is untrusted input (anyone on
//!   the provisioning network can serve a node an iPXE script), so the parser
//!   takes any bytes and is fuzzed ([`fuzz`]).
//! - [`image`]: `rootfs.tar.zst` streamed, hashed, decompressed and unpacked
//!   in one pass, resumed, waited for and fallen back as the pure
//!   [`image::plan`] decides; only a verified root comes out.
//! - [`manifest`]: the boot manifest, checked before use.
//! - [`dhcp`]: the DHCP client's pure state machine on dhcproto.
//! - [`cli`]: what the binary does when it is not PID 1 (`--help`, `version`,
//!   `cmdline`, `fetch`).
//!
//! The binary is built static (musl, or glibc with `+crt-static`) with the
//! workspace's `agent` profile, so it needs nothing else in the initramfs;
//! `mprov_tests::agent::build_static` builds it. Keep its dependencies few: no
//! async runtime of its own (reqwest's blocking client runs one inside).

#![warn(missing_docs)]

pub mod cli;
pub mod cmdline;
pub mod dhcp;
pub mod enroll;
#[doc(hidden)]
pub mod fuzz;
pub mod image;
pub mod init;
pub mod manifest;

/// The agent's version: the workspace version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
