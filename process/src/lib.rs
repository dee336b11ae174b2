//! `mprov-process`: what every mProv binary's process needs, written once.
//!
//! - [`chain`]: an error with its whole cause chain, on one line.
//! - [`write_atomic`]: a file written whole (mode set before anyone can open
//!   it, synced) and renamed into place, so a crash never leaves half a key,
//!   half a lease log or half an address.
//! - With the `service` feature (the default), for the long-running services:
//!   [`exit`] (main's error printed once, with its causes), [`logging`],
//!   [`Signals`] (SIGTERM and SIGINT, registered before start-up) and
//!   [`run_servers`] (bound servers run until a signal or the first failure,
//!   then stopped together through one shutdown token).
//! - [`raise_file_limit`]: the soft open-file limit raised to the hard
//!   limit at start (both services call it first), and
//!   [`open_file_limit`], which connection caps are sized from.
//! - With the `listen` feature, for HTTP listeners: [`listen`] (a deadline
//!   on every connection with no request in flight, and a connection cap
//!   that makes room by closing the longest-idle one).
//! - With the `metrics` feature, for the boot services' Prometheus counters:
//!   [`metrics::Prefixed`] (a metric registered with its name and help in one
//!   call).
//!
//! The control service (its CLI, backups and CA files), the job server, the
//! DHCP lease log and the agent use it; the agent's static binary takes it
//! without `service`.

#![warn(missing_docs)]

mod file;
mod limits;
#[cfg(feature = "listen")]
pub mod listen;
#[cfg(feature = "service")]
pub mod logging;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "service")]
mod run;

pub use file::write_atomic;
pub use limits::{FileLimit, open_file_limit, raise_file_limit};
#[cfg(feature = "service")]
pub use run::{Signals, exit, run_servers};

/// `err` and each of its sources, joined by `": "`: what an operator needs
/// to see, where `to_string()` alone keeps only the outermost message.
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(err) = source {
        out.push_str(": ");
        out.push_str(&err.to_string());
        source = err.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn chain_joins_every_source() {
        let err = Wrapped(std::io::Error::other("disk full"));
        assert_eq!(super::chain(&err), "writing the key: disk full");
    }

    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("writing the key")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
}
