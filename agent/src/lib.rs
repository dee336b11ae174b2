//! The node side of mProv (`mprov-agent`).
//!
//! As `/init` in the initramfs it loads the NIC drivers, runs DHCP, enrolls
//! with the one-time nonce, streams and verifies the compressed root image and
//! `switch_root`s into it; in the booted system, `mprov-agent ready` reports
//! the node ready with the certificate it enrolled for, and `mprov-agent
//! node` (the image's unit) runs the post-boot scripts, reports `ready` only
//! when they all succeeded, runs them again when asked and renews the node's
//! certificate; `mprov-agent nads` finds the switch port each link is
//! cabled to over LLDP and reports it (NADS). ARCHITECTURE.md, "A node's boot" and "After boot",
//! walks through the whole flow.
//!
//! - [`init`]: PID 1, its steps in order (mounts, modules, the command line,
//!   the interfaces, then [`init::boot`]). Never panics on purpose, never
//!   exits: a failed boot is printed on the console, reported and retried
//!   with a growing wait (a PID 1 that exits or panics is a kernel panic,
//!   which tells the operator nothing).
//! - [`cmdline`]: the kernel command line, split the way the kernel splits it,
//!   and the typed `mprov_*` parameters. The line is untrusted input (anyone on
//!   the provisioning network can serve a node an iPXE script), so the parser
//!   takes any bytes and is fuzzed (`fuzz`).
//! - [`image`]: `rootfs.tar.zst` streamed, hashed, decompressed and unpacked
//!   in one pass, resumed, waited for and fallen back as the pure
//!   [`image::plan`] decides; only a verified root comes out.
//! - [`manifest`]: the boot manifest, checked before use.
//! - [`dhcp`]: the DHCP client's pure state machine on dhcproto.
//! - [`enroll`]: the node's key pair and CSR, enrollment with the nonce, and
//!   the identity files written into the new root.
//! - [`http`]: the one HTTP client (reqwest's async client, driven on the
//!   calling thread by one current-thread runtime), used by [`enroll`] and
//!   [`image`] alike.
//! - [`scripts`]: the script-runner: the plan's order or its refusal
//!   ([`scripts::plan`], pure), the checks and the run itself
//!   ([`scripts::exec`]: layers in parallel, process groups, timeouts,
//!   output tails, `/etc/nologin`), and the exchange with the control
//!   service around them.
//! - [`node`]: the booted node's loop: scripts once, again on request, and
//!   certificate renewal, until SIGTERM.
//! - [`nads`]: LLDP heard on every link that is up (raw packet sockets,
//!   frames parsed by `mprov-lldp`), DMI facts, and the report to the
//!   control service with the discovery nonce; the decisions pure.
//! - [`cli`]: what the binary does when it is not PID 1 (`--help`, `version`,
//!   `cmdline`, `fetch`, `ready`, `script-runner`, `node`, `nads`).
//!
//! The binary is built static (musl, or glibc with `+crt-static`) with the
//! workspace's `agent` profile, so it needs nothing else in the initramfs;
//! `mprov_tests::agent::build_static` builds it. Keep its dependencies few:
//! tokio only as the one current-thread runtime [`http`] needs, no thread
//! of its own (the script-runner's threads are plain std threads, one per
//! running script and its output).
//!
//! The modules depend on each other without a cycle (`cargo xtask
//! layering` checks it), lowest first: [`cmdline`], [`dhcp`] and [`http`];
//! [`image`]; [`manifest`]; [`enroll`]; [`init`]; [`scripts`]; [`node`];
//! [`nads`]; [`cli`].

#![warn(missing_docs)]

pub mod cli;
pub mod cmdline;
pub mod dhcp;
pub mod enroll;
pub mod events;
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub mod fuzz;
pub mod http;
pub mod image;
pub mod init;
pub mod manifest;
pub mod nads;
pub mod node;
pub mod scripts;

/// The agent's version: the workspace version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
