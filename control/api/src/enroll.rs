//! Enrollment: what a job server or a node sends to get its own client
//! certificate, and what it gets back.

use serde::{Deserialize, Serialize};

/// Where a job server enrolls (anonymous: the token is the credential; or
/// without a token, with an admin's API key).
pub const JOBSERVER_PATH: &str = "/enroll/jobserver/";
/// Where a node enrolls (anonymous; the nonce is the credential).
pub const NODE_PATH: &str = "/enroll/node/";
/// Where an agent renews its certificate (over mTLS with the current one).
pub const RENEW_PATH: &str = "/enroll/renew/";

/// `POST /enroll/jobserver/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobserverEnrollment {
    /// The one-time token; empty (or left out): the request carries an
    /// admin's API key instead (`Authorization: Api-Key <key>`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// The job server's name (its certificate names only this).
    pub name: String,
    /// Its certificate signing request, PEM.
    pub csr: String,
}

/// `POST /enroll/node/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEnrollment {
    /// The nonce from the kernel command line (`mprov_enroll=`).
    pub nonce: String,
    /// Its certificate signing request, PEM (the key never leaves the node).
    pub csr: String,
}

/// `POST /enroll/renew/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Renewal {
    /// A new CSR, PEM.
    pub csr: String,
}

/// What an enrolled agent gets back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enrolled {
    /// Its certificate, PEM.
    pub certificate: String,
    /// The CA certificate, PEM.
    pub ca: String,
    /// When the certificate ends (RFC 3339).
    pub not_after: String,
}
