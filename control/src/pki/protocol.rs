//! What the web service and the signing helper say to each other: one JSON
//! [`SignRequest`] per line in, one JSON [`Answer`] per line out, and the
//! helper side's hand-shake lines (`Ready`, [`Down`]).

use serde::{Deserialize, Serialize};

/// What kind of certificate is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// A booted node's client certificate.
    Node,
    /// A job server's client certificate.
    Jobserver,
    /// The control service's own HTTPS certificate.
    Server,
}

impl Profile {
    /// The longest validity the helper grants, in days.
    pub fn max_days(self) -> u32 {
        match self {
            Profile::Node => 30,
            Profile::Jobserver => 90,
            Profile::Server => 398,
        }
    }

    /// The agent profile a credential's kind names (`node`, `jobserver`).
    pub fn agent(kind: &str) -> Option<Profile> {
        match kind {
            "node" => Some(Profile::Node),
            "jobserver" => Some(Profile::Jobserver),
            _ => None,
        }
    }

    /// Its name: in identity URIs and as the kind of a credential.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Node => "node",
            Profile::Jobserver => "jobserver",
            Profile::Server => "server",
        }
    }
}

/// The URI an agent certificate names its identity by, e.g.
/// `urn:mprov:node:c01`; the web service reads it back to know who asks.
pub fn identity_uri(profile: Profile, identity: &str) -> String {
    format!("urn:mprov:{}:{identity}", profile.as_str())
}

/// The longest request line the helper reads; a longer one is refused
/// (with its id) unread. The web service refuses to send one.
pub const MAX_REQUEST: usize = 64 * 1024;

/// One request to the helper.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignRequest {
    /// The request's number, echoed in the [`Answer`]. First, so that it
    /// is at the start of the line: the helper finds it even in a line it
    /// cannot parse or read whole.
    #[serde(default)]
    pub id: u64,
    /// The kind of certificate.
    pub profile: Profile,
    /// Who it is for: a system's name, a job server's name, or for
    /// [`Profile::Server`] the host name (the subject's CN).
    pub identity: String,
    /// [`Profile::Server`] only: the DNS names and IP addresses it covers.
    #[serde(default)]
    pub names: Vec<String>,
    /// The certificate signing request, PEM.
    pub csr_pem: String,
    /// How many days it is valid.
    pub days: u32,
    /// The validity in seconds instead of `days`, when set (a short-lived
    /// job-server certificate, `MPROV_JOBSERVER_CERT_SECONDS`); at least
    /// [`MIN_SECONDS`], at most the profile's maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<u64>,
}

/// The id of a request line that is not a valid request: from the JSON
/// object if it is one, else from the line's start (`{"id":N,`, as
/// [`SignRequest`] is written), so even a line cut at [`MAX_REQUEST`] keeps
/// it. 0 when it has none. Pure.
pub fn request_id(line: &str) -> u64 {
    #[derive(Deserialize)]
    struct Id {
        #[serde(default)]
        id: u64,
    }
    if let Ok(Id { id }) = serde_json::from_str::<Id>(line) {
        return id;
    }
    let digits = line
        .trim_start()
        .strip_prefix('{')
        .map(str::trim_start)
        .and_then(|rest| rest.strip_prefix("\"id\""))
        .map(str::trim_start)
        .and_then(|rest| rest.strip_prefix(':'))
        .map(str::trim_start)
        .unwrap_or_default();
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().unwrap_or(0)
}

/// One line the helper writes: the reply to request `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The request's number.
    pub id: u64,
    /// The reply.
    pub reply: SignReply,
}

/// The shortest validity the helper grants, in seconds.
pub const MIN_SECONDS: u64 = 60;

/// The helper's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "lowercase")]
pub enum SignReply {
    /// Signed.
    Signed {
        /// The certificate, PEM.
        cert_pem: String,
        /// Its serial number, lower-case hex.
        serial: String,
        /// When it ends, Unix seconds.
        not_after: i64,
    },
    /// Refused, and why.
    Refused {
        /// The reason, for the log and the client.
        reason: String,
    },
}

/// Why the helper refuses a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The request is not JSON of the expected shape.
    #[error("the request is not understood: {0}")]
    Malformed(String),
    /// The identity is not a name the helper signs.
    #[error("{0:?} is not a valid identity (letters, digits, '-', '.', '_', at most 253)")]
    Identity(String),
    /// The CSR cannot be parsed, or its signature does not verify.
    #[error("the CSR cannot be used: {0}")]
    Csr(String),
    /// The CSR asks for CA rights.
    #[error("the CSR asks for CA rights; agents never get a CA certificate")]
    CaRights,
    /// The CSR's key is too weak.
    #[error("the CSR's key is too weak: {0}; use ECDSA P-256 (or RSA of at least 2048 bits)")]
    WeakKey(String),
    /// The CSR's key or signature algorithm is not one the CA accepts.
    #[error(
        "the CSR's algorithm is not accepted: {0}; use ECDSA P-256 or P-384, Ed25519, or RSA of 2048 to 8192 bits, signed with SHA-256 or better"
    )]
    Algorithm(String),
    /// The CSR asks for a name this credential may not carry.
    #[error("the CSR asks for the name {asked:?}; this certificate may only name {allowed:?}")]
    OtherName {
        /// What the CSR asked for.
        asked: String,
        /// What this credential may name.
        allowed: String,
    },
    /// The CSR asks for a use the profile does not allow.
    #[error("the CSR asks for {asked}; a {profile} certificate is only for {allowed}")]
    Usage {
        /// The profile.
        profile: &'static str,
        /// What the CSR asked for.
        asked: &'static str,
        /// What the profile allows.
        allowed: &'static str,
    },
    /// The validity is out of bounds.
    #[error("{days} days is outside 1..={max} for a {profile} certificate")]
    Validity {
        /// Asked.
        days: u32,
        /// The bound.
        max: u32,
        /// The profile.
        profile: &'static str,
    },
    /// The validity in seconds is out of bounds.
    #[error("{secs} s is outside {MIN_SECONDS}..={max} s for a {profile} certificate")]
    Seconds {
        /// Asked.
        secs: u64,
        /// The bound.
        max: u64,
        /// The profile.
        profile: &'static str,
    },
    /// Signing itself failed.
    #[error("signing failed: {0}")]
    Signing(String),
}

/// The first line the helper writes once it holds the CA key (and has
/// dropped its privileges): the CA certificate.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Ready {
    pub(super) ready: ReadyInfo,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ReadyInfo {
    pub(super) ca_pem: String,
}

/// What the supervisor writes when the helper stopped.
#[derive(Debug, Serialize, Deserialize)]
pub struct Down {
    pub(super) down: DownInfo,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct DownInfo {
    pub(super) reason: String,
    /// The supervisor gives up (the CA cannot be opened): it exits next.
    #[serde(default)]
    pub(super) fatal: bool,
}

/// Any line from the helper's side of the socket.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Incoming {
    Answer(Answer),
    Ready(Ready),
    Down(Down),
}

/// The web service cannot reach the helper.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    /// The helper cannot be started, or exited before it was ready: why,
    /// as the helper or the wait for it says.
    #[error("cannot start the signing helper: {0}")]
    Start(String),
    /// Starting the helper failed in the operating system.
    #[error("cannot start the signing helper: {what}")]
    StartIo {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        err: std::io::Error,
    },
    /// The helper is down for now (being started again); try later.
    #[error("the signing helper is not available: {0}")]
    Unavailable(String),
    /// The request could not be written to the helper.
    #[error("the signing helper is not available: writing the request")]
    Write(#[source] std::io::Error),
    /// The request could not be encoded.
    #[error("the signing request cannot be encoded")]
    Encode(#[source] serde_json::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_comes_first_and_is_found_in_any_line() {
        let req = SignRequest {
            id: 42,
            profile: Profile::Node,
            identity: "c01".into(),
            names: Vec::new(),
            csr_pem: "x".repeat(100),
            days: 1,
            seconds: None,
        };
        let line = serde_json::to_string(&req).unwrap();
        assert!(line.starts_with("{\"id\":42,"), "{line}");
        // Cut anywhere after the id, or of the wrong shape: still 42.
        assert_eq!(request_id(&line[..20]), 42);
        assert_eq!(request_id(r#"{"id": 42, "profile": "nothing"}"#), 42);
        assert_eq!(request_id(r#" { "id" : 7"#), 7);
        // No id to be found.
        assert_eq!(request_id("not json"), 0);
        assert_eq!(request_id(r#"{"profile":"node","id":9"#), 0);
        assert_eq!(request_id(""), 0);
    }
}
