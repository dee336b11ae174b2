//! The install's public-key infrastructure: its own certificate authority,
//! the signing helper that alone reads the CA key, and the web service's
//! client of that helper.
//!
//! - [`ca`]: the TLS folder, the CA certificate and key (made once), the
//!   file helpers keys are written with;
//! - [`protocol`]: what the web service and the helper say to each other
//!   (one JSON line each way), and the [`Profile`]s a certificate is made
//!   for;
//! - [`helper`]: the helper process (`mprov-control signer`): it checks a
//!   request against its profile and signs it with rcgen
//!   ([`helper::Signer::sign_csr`]), and the supervisor that starts it again;
//! - [`client`]: the web service's handle on the helper
//!   ([`client::SignerClient::request_certificate`]);
//! - [`https`]: the control service's own HTTPS certificate, made through
//!   the helper, and the listener's TLS configuration.
//!
//! No module here names HTTP types: the enrollment domain
//! (`crate::enrollment`) asks for agent certificates through [`client`].

use std::time::Duration;

pub mod ca;
pub mod client;
pub mod helper;
pub mod https;
pub mod protocol;

pub use ca::TlsError;
pub use client::{SignerClient, SpawnSpec};
pub use protocol::{Profile, SignReply, SignRequest, SignerError};

/// Certificates start this long before they are made, so a node whose clock
/// is a little behind still accepts them.
pub const BACKDATE: Duration = Duration::from_secs(3600);
