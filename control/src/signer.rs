//! The signing helper: the only process that reads the CA key.
//!
//! `mprov-control serve` starts `mprov-control signer` as a child and talks
//! to it over a private socket pair (the child's standard input and output):
//! one JSON [`SignRequest`] per line in, one JSON [`Answer`] per line out.
//! No file-system socket exists, so no other process can ask it to sign.
//!
//! `signer` is a small supervisor that keeps the rights to start the helper
//! again (it stays root when started as root, and never reads a request):
//! it runs `signer-worker` on the same socket pair, and when the worker
//! dies it says so on the socket ([`Down`]), waits (1 s, doubling to 60 s),
//! and starts a new one, which announces itself (`Ready`) as the first did.
//! The web service never starts a helper itself: while the helper is down a
//! signature fails at once with [`SignerError::Unavailable`] (a 503), and if
//! the supervisor itself is gone, [`SignerClient::lost`] fires and `serve`
//! exits, so that systemd starts the whole service again. Requests carry an
//! id, so an answer a new worker gives to a request sent before the restart
//! is never taken for the answer to a later one.
//!
//! Started as root, the helper makes the CA if the TLS folder has none, reads
//! the CA key, and then drops to its own system user before it reads a single
//! request; the key file stays root's (mode 0600), and the web service, which
//! drops to another user, cannot open it.
//!
//! The helper decides what a certificate contains; a CSR only contributes its
//! public key. It enforces, per [`Profile`]:
//! - the subject and subject alternative names name exactly the one identity
//!   asked for (a CSR that asks for any other name is refused, not trimmed);
//! - client authentication only for agents (nodes and job servers), server
//!   authentication only for the HTTPS profile;
//! - a bounded validity ([`Profile::max_days`]);
//! - never a CA certificate (a CSR asking for CA rights is refused).
//!
//! Every refusal is logged with its reason and returned to the web service.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType, DnValue,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use serde::{Deserialize, Serialize};

use crate::tls::{self, TlsError};

/// Longest request line read from the web service.
const MAX_REQUEST: u64 = 64 * 1024;
/// Certificates start this long before they are signed (clock skew).
const BACKDATE: Duration = Duration::from_secs(3600);

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

    fn as_str(self) -> &'static str {
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

/// One request to the helper.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignRequest {
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
    /// The request's number, echoed in the [`Answer`].
    #[serde(default)]
    pub id: u64,
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

/// The CA, loaded once by the helper.
#[derive(Debug)]
pub struct Signer {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
}

impl Signer {
    /// Makes the CA in `tls_dir` if it has none, and loads its key.
    pub fn open(tls_dir: &Path, hostname: &str) -> Result<Signer, TlsError> {
        tls::ensure_dir(tls_dir)?;
        let (ca_pem, _) = tls::ensure_ca(tls_dir, hostname)?;
        let key_path = tls_dir.join(tls::CA_KEY);
        let key_pem = tls::read_private(&key_path, true)?;
        let key = KeyPair::from_pem(&key_pem).map_err(|err| TlsError::Cert {
            what: format!("{} is not a usable key", key_path.display()),
            err,
        })?;
        let der = CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(|_| TlsError::Pem {
            what: "certificate",
            path: tls_dir.join(tls::CA_CERT),
        })?;
        let issuer = Issuer::from_ca_cert_der(&der, key).map_err(|err| TlsError::Cert {
            what: "cannot read the CA certificate".into(),
            err,
        })?;
        Ok(Signer { issuer, ca_pem })
    }

    /// Checks `req` against its profile and signs it.
    pub fn sign(&self, req: &SignRequest) -> Result<SignReply, Refusal> {
        let profile = req.profile;
        let max = profile.max_days();
        if req.days == 0 || req.days > max {
            return Err(Refusal::Validity {
                days: req.days,
                max,
                profile: profile.as_str(),
            });
        }
        let validity = match req.seconds {
            None => u64::from(req.days) * 86_400,
            Some(secs) if (MIN_SECONDS..=u64::from(max) * 86_400).contains(&secs) => secs,
            Some(secs) => {
                return Err(Refusal::Seconds {
                    secs,
                    max: u64::from(max) * 86_400,
                    profile: profile.as_str(),
                });
            }
        };
        if !valid_identity(&req.identity) {
            return Err(Refusal::Identity(req.identity.clone()));
        }
        // The key and algorithms first, so that their refusal names them
        // (the signature check below cannot tell a weak key from a bad one).
        check_key(&req.csr_pem)?;
        let csr = CertificateSigningRequestParams::from_pem(&req.csr_pem)
            .map_err(|e| Refusal::Csr(e.to_string()))?;
        // An explicit CA:FALSE is what a careful client sends; only CA:TRUE
        // asks for CA rights.
        if matches!(csr.params.is_ca, IsCa::Ca(_)) {
            return Err(Refusal::CaRights);
        }
        let (allowed_sans, eku) = match profile {
            Profile::Node | Profile::Jobserver => (
                vec![SanType::URI(
                    identity_uri(profile, &req.identity)
                        .try_into()
                        .map_err(|_| Refusal::Identity(req.identity.clone()))?,
                )],
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
            Profile::Server => (
                server_sans(&req.names)?,
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
        };
        check_asked_names(&csr.params, &req.identity, &allowed_sans)?;
        for asked in &csr.params.extended_key_usages {
            if *asked != eku {
                let (profile_name, allowed) = match profile {
                    Profile::Server => ("server", "server authentication"),
                    _ => (profile.as_str(), "client authentication"),
                };
                return Err(Refusal::Usage {
                    profile: profile_name,
                    asked: eku_name(asked),
                    allowed,
                });
            }
        }

        // The certificate is built here; the CSR gives only its public key.
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "mProv");
        dn.push(DnType::CommonName, req.identity.clone());
        params.distinguished_name = dn;
        params.subject_alt_names = allowed_sans;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![eku];
        params.use_authority_key_identifier_extension = true;
        let now = SystemTime::now();
        let not_after = now + Duration::from_secs(validity);
        params.not_before = (now - BACKDATE).into();
        params.not_after = not_after.into();
        let serial = tls::serial().map_err(|e| Refusal::Signing(e.to_string()))?;
        let serial_hex = hex::encode(serial.to_bytes());
        params.serial_number = Some(serial);
        let csr = CertificateSigningRequestParams {
            params,
            public_key: csr.public_key,
        };
        let cert = csr
            .signed_by(&self.issuer)
            .map_err(|e| Refusal::Signing(e.to_string()))?;
        let not_after = not_after
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        Ok(SignReply::Signed {
            cert_pem: cert.pem(),
            serial: serial_hex,
            not_after,
        })
    }

    /// Answers one request line: the reply, logged when refused.
    pub fn answer(&self, line: &str) -> Answer {
        let parsed = serde_json::from_str::<SignRequest>(line);
        let id = parsed.as_ref().map_or(0, |r| r.id);
        let result = parsed
            .map_err(|e| Refusal::Malformed(e.to_string()))
            .and_then(|req| {
                self.sign(&req).inspect_err(|why| {
                    tracing::warn!(
                        profile = req.profile.as_str(),
                        identity = %req.identity,
                        "signer: refused: {why}"
                    );
                })
            });
        let reply = match result {
            Ok(reply) => reply,
            Err(why) => SignReply::Refused {
                reason: why.to_string(),
            },
        };
        Answer { id, reply }
    }
}

/// The helper's loop: one request line in, one reply line out, until the
/// web service closes the socket.
pub fn serve(signer: &Signer, input: impl BufRead, mut output: impl Write) -> std::io::Result<()> {
    let mut input = input.take(MAX_REQUEST);
    let mut line = String::new();
    loop {
        line.clear();
        input.set_limit(MAX_REQUEST);
        let n = input.read_line(&mut line)?;
        if n == 0 {
            return Ok(());
        }
        let reply = if line.ends_with('\n') {
            signer.answer(line.trim_end())
        } else if n as u64 >= MAX_REQUEST {
            // Skip the rest of the oversized line before answering.
            let mut rest = Vec::new();
            input.set_limit(u64::MAX);
            input.read_until(b'\n', &mut rest)?;
            Answer {
                id: 0,
                reply: SignReply::Refused {
                    reason: format!("the request is longer than {MAX_REQUEST} bytes"),
                },
            }
        } else {
            // End of input inside a line: answer what came.
            signer.answer(line.trim_end())
        };
        let mut out = serde_json::to_string(&reply).map_err(std::io::Error::other)?;
        out.push('\n');
        output.write_all(out.as_bytes())?;
        output.flush()?;
    }
}

/// Checks the CSR's public key and signature algorithm, naming what is
/// wrong: a weak RSA key, a curve or algorithm the CA does not accept, a
/// SHA-1 signature. Pure.
pub fn check_key(csr_pem: &str) -> Result<(), Refusal> {
    use x509_parser::prelude::{FromDer as _, X509CertificationRequest};
    use x509_parser::public_key::PublicKey;
    let der = rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes())
        .map_err(|_| Refusal::Csr("it is not a PEM certificate request".into()))?;
    let (_, csr) = X509CertificationRequest::from_der(der.as_ref())
        .map_err(|e| Refusal::Csr(e.to_string()))?;
    let spki = &csr.certification_request_info.subject_pki;
    let key_alg = spki.algorithm.algorithm.to_id_string();
    match key_alg.as_str() {
        // rsaEncryption
        "1.2.840.113549.1.1.1" => {
            let Ok(PublicKey::RSA(rsa)) = spki.parsed() else {
                return Err(Refusal::Csr("its RSA key cannot be read".into()));
            };
            let m = rsa.modulus;
            let m = &m[m.iter().take_while(|b| **b == 0).count()..];
            let bits = m
                .first()
                .map_or(0, |b| m.len() * 8 - b.leading_zeros() as usize);
            if bits < 2048 {
                return Err(Refusal::WeakKey(format!("an RSA key of {bits} bits")));
            }
            if bits > 8192 {
                return Err(Refusal::Algorithm(format!("an RSA key of {bits} bits")));
            }
        }
        // id-ecPublicKey: the curve is the parameter.
        "1.2.840.10045.2.1" => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|o| o.to_id_string())
                .unwrap_or_default();
            match curve.as_str() {
                "1.2.840.10045.3.1.7" | "1.3.132.0.34" => {}
                "1.3.132.0.10" => return Err(Refusal::Algorithm("ECDSA on secp256k1".into())),
                "1.3.132.0.35" => return Err(Refusal::Algorithm("ECDSA on P-521".into())),
                other => {
                    return Err(Refusal::Algorithm(format!("ECDSA on the curve {other}")));
                }
            }
        }
        // Ed25519
        "1.3.101.112" => {}
        "1.3.101.113" => return Err(Refusal::Algorithm("Ed448".into())),
        "1.2.840.10040.4.1" => return Err(Refusal::Algorithm("DSA".into())),
        other => return Err(Refusal::Algorithm(format!("a key of type {other}"))),
    }
    let sig = csr.signature_algorithm.algorithm.to_id_string();
    // sha1WithRSAEncryption, ecdsa-with-SHA1, dsa-with-sha1
    if matches!(
        sig.as_str(),
        "1.2.840.113549.1.1.5" | "1.2.840.10045.4.1" | "1.2.840.10040.4.3"
    ) {
        return Err(Refusal::Algorithm("a SHA-1 signature".into()));
    }
    Ok(())
}

fn valid_identity(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        && !s.starts_with(['-', '.'])
}

/// The HTTPS certificate's names: DNS names and IP addresses, each valid.
fn server_sans(names: &[String]) -> Result<Vec<SanType>, Refusal> {
    let mut seen = BTreeSet::new();
    let mut sans = Vec::new();
    for name in names {
        if !seen.insert(name.to_ascii_lowercase()) {
            continue;
        }
        if let Ok(ip) = name.parse::<IpAddr>() {
            sans.push(SanType::IpAddress(ip));
        } else if valid_identity(name) {
            sans.push(SanType::DnsName(
                name.to_ascii_lowercase()
                    .try_into()
                    .map_err(|_| Refusal::Identity(name.clone()))?,
            ));
        } else {
            return Err(Refusal::Identity(name.clone()));
        }
    }
    if sans.is_empty() {
        return Err(Refusal::Identity(String::new()));
    }
    Ok(sans)
}

/// A CSR may leave its subject and names empty, or ask for exactly what the
/// credential may carry; anything else is refused.
fn check_asked_names(
    asked: &CertificateParams,
    identity: &str,
    allowed: &[SanType],
) -> Result<(), Refusal> {
    for (ty, value) in asked.distinguished_name.iter() {
        if *ty != DnType::CommonName {
            continue;
        }
        let cn = dn_text(value).unwrap_or_default();
        if cn != identity {
            return Err(Refusal::OtherName {
                asked: cn,
                allowed: identity.to_owned(),
            });
        }
    }
    for san in &asked.subject_alt_names {
        if !allowed.contains(san) {
            return Err(Refusal::OtherName {
                asked: san_text(san),
                allowed: allowed.iter().map(san_text).collect::<Vec<_>>().join(", "),
            });
        }
    }
    Ok(())
}

fn dn_text(v: &DnValue) -> Option<String> {
    match v {
        DnValue::Utf8String(s) => Some(s.clone()),
        DnValue::PrintableString(s) => Some(s.as_str().to_owned()),
        DnValue::Ia5String(s) => Some(s.as_str().to_owned()),
        DnValue::TeletexString(s) => Some(s.as_str().to_owned()),
        DnValue::BmpString(_) | DnValue::UniversalString(_) => None,
        _ => None,
    }
}

fn san_text(san: &SanType) -> String {
    match san {
        SanType::DnsName(n) => format!("DNS:{}", n.as_str()),
        SanType::URI(u) => format!("URI:{}", u.as_str()),
        SanType::IpAddress(ip) => format!("IP:{ip}"),
        SanType::Rfc822Name(m) => format!("email:{}", m.as_str()),
        _ => "another name".into(),
    }
}

fn eku_name(eku: &ExtendedKeyUsagePurpose) -> &'static str {
    match eku {
        ExtendedKeyUsagePurpose::ServerAuth => "server authentication",
        ExtendedKeyUsagePurpose::ClientAuth => "client authentication",
        ExtendedKeyUsagePurpose::CodeSigning => "code signing",
        ExtendedKeyUsagePurpose::Any => "any use",
        _ => "another use",
    }
}

/// The first line the helper writes once it holds the CA key (and has
/// dropped its privileges): the CA certificate.
#[derive(Debug, Serialize, Deserialize)]
struct Ready {
    ready: ReadyInfo,
}

#[derive(Debug, Serialize, Deserialize)]
struct ReadyInfo {
    ca_pem: String,
}

/// What the supervisor writes when the helper stopped.
#[derive(Debug, Serialize, Deserialize)]
pub struct Down {
    down: DownInfo,
}

#[derive(Debug, Serialize, Deserialize)]
struct DownInfo {
    reason: String,
    /// The supervisor gives up (the CA cannot be opened): it exits next.
    #[serde(default)]
    fatal: bool,
}

/// Any line from the helper's side of the socket.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Incoming {
    Answer(Answer),
    Ready(Ready),
    Down(Down),
}

/// The helper's side of the hand-shake: announces the CA certificate.
pub fn announce(signer: &Signer, mut output: impl Write) -> std::io::Result<()> {
    let mut line = serde_json::to_string(&Ready {
        ready: ReadyInfo {
            ca_pem: signer.ca_pem.clone(),
        },
    })
    .map_err(std::io::Error::other)?;
    line.push('\n');
    output.write_all(line.as_bytes())?;
    output.flush()
}

/// The exit code of a worker that cannot open the CA: the supervisor gives
/// up rather than retrying what needs an administrator.
pub const WORKER_CANNOT_OPEN: i32 = 3;
/// The first wait before a dead worker is started again; it doubles up to
/// [`MAX_BACKOFF`], and starts over once a worker ran that long.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two starts of the worker.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The wait before the next start, after a worker that ran `ran` and a
/// previous wait of `last`. Pure.
pub fn next_backoff(last: Option<Duration>, ran: Duration) -> Duration {
    match last {
        Some(last) if ran < MAX_BACKOFF => (last * 2).min(MAX_BACKOFF),
        _ => FIRST_BACKOFF,
    }
}

fn write_down(reason: &str, fatal: bool) -> std::io::Result<()> {
    let mut line = serde_json::to_string(&Down {
        down: DownInfo {
            reason: reason.to_owned(),
            fatal,
        },
    })
    .map_err(std::io::Error::other)?;
    line.push('\n');
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes())?;
    out.flush()
}

/// `mprov-control signer`: runs `worker` (a command that becomes the
/// helper on this process's standard input and output) until it exits
/// cleanly (the web service closed the socket), starting it again with a
/// back-off when it dies. Never reads the socket itself.
pub fn supervise(mut worker: impl FnMut() -> std::process::Command) -> Result<(), SignerError> {
    let mut last: Option<Duration> = None;
    loop {
        let started = std::time::Instant::now();
        let status = worker()
            .stdin(std::process::Stdio::inherit())
            .stdout(std::process::Stdio::inherit())
            .status()
            .map_err(|e| SignerError::Start(e.to_string()))?;
        if status.success() {
            return Ok(());
        }
        if status.code() == Some(WORKER_CANNOT_OPEN) {
            let reason = "the signing helper cannot open the CA; the log says why".to_owned();
            let _ = write_down(&reason, true);
            return Err(SignerError::Start(reason));
        }
        let wait = next_backoff(last, started.elapsed());
        last = Some(wait);
        let reason =
            format!("the signing helper stopped ({status}); it is started again in {wait:?}");
        tracing::error!("{reason}");
        if write_down(&reason, false).is_err() {
            // The web service is gone: nobody to sign for.
            return Ok(());
        }
        std::thread::sleep(wait);
    }
}

/// The web service cannot reach the helper.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    /// The helper cannot be started, or exited before it was ready.
    #[error("cannot start the signing helper: {0}")]
    Start(String),
    /// The helper is down for now (being started again); try later.
    #[error("the signing helper is not available: {0}")]
    Unavailable(String),
}

/// How the helper is started.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    /// The `mprov-control` executable.
    pub exe: std::path::PathBuf,
    /// The TLS folder.
    pub tls_dir: std::path::PathBuf,
    /// The control host's name (for a new CA's name).
    pub hostname: String,
    /// The system user it drops to when started as root.
    pub user: Option<String>,
}

/// Where the answer to the request in flight goes.
type Waiter = tokio::sync::oneshot::Sender<Result<SignReply, SignerError>>;

/// What the reader task and the callers share.
#[derive(Debug)]
struct Link {
    /// Whether a worker is ready.
    up: std::sync::atomic::AtomicBool,
    /// Why it is not, when it is not.
    why_down: std::sync::Mutex<String>,
    /// The request waiting for its answer.
    pending: std::sync::Mutex<Option<(u64, Waiter)>>,
    /// Fires when the supervisor is gone for good.
    lost: tokio_util::sync::CancellationToken,
}

impl Link {
    fn set_down(&self, why: &str) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        why.clone_into(&mut self.why_down.lock().unwrap_or_else(|e| e.into_inner()));
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((_, tx)) = pending {
            let _ = tx.send(Err(SignerError::Unavailable(why.to_owned())));
        }
    }
}

#[derive(Debug)]
enum Backend {
    /// The supervised helper over its socket pair.
    Process {
        child: tokio::sync::Mutex<tokio::process::Child>,
        writer: tokio::sync::Mutex<tokio::net::unix::OwnedWriteHalf>,
        link: std::sync::Arc<Link>,
        next_id: std::sync::atomic::AtomicU64,
    },
    /// The same checks inside this process, for in-process API tests that
    /// have no helper binary to start. The serving process never uses it.
    InProcess(Signer),
}

/// The web service's handle on the signing helper.
#[derive(Debug)]
pub struct SignerClient {
    ca_pem: String,
    backend: Backend,
}

/// How long the helper may take to start (making a CA included).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one signature may take.
const SIGN_TIMEOUT: Duration = Duration::from_secs(10);

impl SignerClient {
    /// Starts the supervised helper and waits until it is ready.
    pub async fn spawn(spec: SpawnSpec) -> Result<SignerClient, SignerError> {
        use tokio::io::AsyncBufReadExt as _;
        let fail = |e: std::io::Error| SignerError::Start(e.to_string());
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(fail)?;
        let theirs_out = theirs.try_clone().map_err(fail)?;
        let mut cmd = tokio::process::Command::new(&spec.exe);
        cmd.arg("signer")
            .arg("--tls-dir")
            .arg(&spec.tls_dir)
            .arg("--hostname")
            .arg(&spec.hostname);
        if let Some(user) = &spec.user {
            cmd.arg("--user").arg(user);
        }
        cmd.stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            theirs,
        )))
        .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            theirs_out,
        )))
        .kill_on_drop(true);
        let child = cmd.spawn().map_err(fail)?;
        // The command holds the child's ends of the pair: close ours now, or a
        // helper that dies would never read as closed.
        drop(cmd);
        ours.set_nonblocking(true).map_err(fail)?;
        let (read, writer) = tokio::net::UnixStream::from_std(ours)
            .map_err(fail)?
            .into_split();
        let mut reader = tokio::io::BufReader::new(read);
        let mut first = String::new();
        let n = tokio::time::timeout(START_TIMEOUT, reader.read_line(&mut first))
            .await
            .map_err(|_| SignerError::Start(format!("not ready within {START_TIMEOUT:?}")))?
            .map_err(fail)?;
        if n == 0 {
            return Err(SignerError::Start(
                "it exited before it was ready; the log above says why".into(),
            ));
        }
        let ca_pem = match serde_json::from_str::<Incoming>(&first) {
            Ok(Incoming::Ready(r)) => r.ready.ca_pem,
            Ok(Incoming::Down(d)) => return Err(SignerError::Start(d.down.reason)),
            _ => return Err(SignerError::Start("unexpected first line".into())),
        };
        let link = std::sync::Arc::new(Link {
            up: std::sync::atomic::AtomicBool::new(true),
            why_down: std::sync::Mutex::new(String::new()),
            pending: std::sync::Mutex::new(None),
            lost: tokio_util::sync::CancellationToken::new(),
        });
        tokio::spawn(read_loop(reader, link.clone()));
        Ok(SignerClient {
            ca_pem,
            backend: Backend::Process {
                child: tokio::sync::Mutex::new(child),
                writer: tokio::sync::Mutex::new(writer),
                link,
                next_id: std::sync::atomic::AtomicU64::new(1),
            },
        })
    }

    /// A signer inside this process (in-process tests only).
    pub fn in_process(tls_dir: &Path, hostname: &str) -> Result<SignerClient, TlsError> {
        let signer = Signer::open(tls_dir, hostname)?;
        Ok(SignerClient {
            ca_pem: signer.ca_pem.clone(),
            backend: Backend::InProcess(signer),
        })
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The supervisor's process id, if it runs as a process.
    pub async fn pid(&self) -> Option<u32> {
        match &self.backend {
            Backend::Process { child, .. } => child.lock().await.id(),
            Backend::InProcess(_) => None,
        }
    }

    /// A token that fires when the supervisor is gone for good: the web
    /// service cannot start it again, so it must exit.
    pub fn lost(&self) -> tokio_util::sync::CancellationToken {
        match &self.backend {
            Backend::Process { link, .. } => link.lost.clone(),
            Backend::InProcess(_) => tokio_util::sync::CancellationToken::new(),
        }
    }

    /// Asks for a signature; fails at once while the helper is down.
    pub async fn sign(&self, req: &SignRequest) -> Result<SignReply, SignerError> {
        use std::sync::atomic::Ordering;
        use tokio::io::AsyncWriteExt as _;
        let (writer, link, next_id) = match &self.backend {
            Backend::InProcess(signer) => {
                let line = serde_json::to_string(req)
                    .map_err(|e| SignerError::Unavailable(e.to_string()))?;
                return Ok(signer.answer(&line).reply);
            }
            Backend::Process {
                writer,
                link,
                next_id,
                ..
            } => (writer, link, next_id),
        };
        // One request at a time: the helper answers in order.
        let mut writer = writer.lock().await;
        if !link.up.load(Ordering::SeqCst) {
            let why = link
                .why_down
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            return Err(SignerError::Unavailable(why));
        }
        let id = next_id.fetch_add(1, Ordering::SeqCst);
        let mut req = req.clone();
        req.id = id;
        let mut line =
            serde_json::to_string(&req).map_err(|e| SignerError::Unavailable(e.to_string()))?;
        line.push('\n');
        let (tx, rx) = tokio::sync::oneshot::channel();
        *link.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some((id, tx));
        if let Err(e) = writer.write_all(line.as_bytes()).await {
            link.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            return Err(SignerError::Unavailable(e.to_string()));
        }
        match tokio::time::timeout(SIGN_TIMEOUT, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(SignerError::Unavailable("the helper went away".into())),
            Err(_) => {
                link.pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                tracing::error!("the signing helper did not answer within {SIGN_TIMEOUT:?}");
                Err(SignerError::Unavailable(format!(
                    "it did not answer within {SIGN_TIMEOUT:?}"
                )))
            }
        }
    }
}

/// Reads the helper's side: answers go to the waiting request, `Down` and
/// `Ready` switch the link, the end of the socket means the supervisor is
/// gone.
async fn read_loop(
    mut reader: tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>,
    link: std::sync::Arc<Link>,
) {
    use tokio::io::AsyncBufReadExt as _;
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line).await {
            Ok(0) | Err(_) => {
                tracing::error!("the signing helper's supervisor is gone");
                link.set_down("the signing helper's supervisor is gone; the service restarts");
                link.lost.cancel();
                return;
            }
            Ok(_) => {}
        }
        match serde_json::from_str::<Incoming>(&line) {
            Ok(Incoming::Answer(answer)) => {
                let mut pending = link.pending.lock().unwrap_or_else(|e| e.into_inner());
                match pending.take() {
                    Some((id, tx)) if id == answer.id => {
                        let _ = tx.send(Ok(answer.reply));
                    }
                    other => {
                        *pending = other;
                        tracing::debug!(id = answer.id, "signer: an answer nobody waits for");
                    }
                }
            }
            Ok(Incoming::Ready(_)) => {
                link.up.store(true, std::sync::atomic::Ordering::SeqCst);
                tracing::info!("the signing helper is back");
            }
            Ok(Incoming::Down(d)) => {
                tracing::error!("{}", d.down.reason);
                link.set_down(&d.down.reason);
            }
            Err(e) => tracing::warn!("signer: a line that is not understood: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> (tempfile::TempDir, Signer) {
        let dir = tempfile::tempdir().unwrap();
        let s = Signer::open(&dir.path().join("tls"), "mpcc").unwrap();
        (dir, s)
    }

    /// Parameters with no subject at all (rcgen's default has a CN).
    fn blank() -> CertificateParams {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = DistinguishedName::new();
        p
    }

    fn csr(params: CertificateParams) -> String {
        let key = KeyPair::generate().unwrap();
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn node(identity: &str, csr_pem: String, days: u32) -> SignRequest {
        SignRequest {
            profile: Profile::Node,
            identity: identity.into(),
            names: Vec::new(),
            csr_pem,
            days,
            seconds: None,
            id: 0,
        }
    }

    fn refused(s: &Signer, req: &SignRequest) -> String {
        match s.sign(req) {
            Err(why) => why.to_string(),
            Ok(reply) => panic!("signed what must be refused: {reply:?}"),
        }
    }

    #[test]
    fn a_node_certificate_names_one_node_for_client_auth_only() {
        use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};
        let (_dir, s) = signer();
        let reply = s.sign(&node("c01", csr(blank()), 30)).unwrap();
        let SignReply::Signed {
            cert_pem, serial, ..
        } = reply
        else {
            panic!("{reply:?}")
        };
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        assert_eq!(hex::encode(cert.raw_serial()), serial);
        let cn: Vec<_> = cert
            .subject()
            .iter_common_name()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(cn, ["c01"]);
        let san = cert.subject_alternative_name().unwrap().unwrap();
        assert_eq!(
            san.value.general_names,
            [GeneralName::URI("urn:mprov:node:c01")]
        );
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth && !eku.any);
        assert!(!cert.is_ca());
        let bc = cert.basic_constraints().unwrap().unwrap().value;
        assert!(!bc.ca);
        let days = (cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp())
            / 86_400;
        assert!(days <= 31, "{days}");
        // A CSR that asks for exactly its own name is fine too.
        let mut own = blank();
        own.distinguished_name.push(DnType::CommonName, "c01");
        own.subject_alt_names = vec![SanType::URI("urn:mprov:node:c01".try_into().unwrap())];
        assert!(s.sign(&node("c01", csr(own), 1)).is_ok());
    }

    #[test]
    fn validity_in_seconds_is_honoured_within_bounds() {
        use x509_parser::prelude::{FromDer as _, X509Certificate};
        let (_dir, s) = signer();
        let mut req = node("js1", csr(blank()), 1);
        req.profile = Profile::Jobserver;
        req.seconds = Some(300);
        let SignReply::Signed { cert_pem, .. } = s.sign(&req).unwrap() else {
            panic!("refused")
        };
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let span = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
        // Backdated by an hour, valid for 300 s from signing.
        assert_eq!(span, 3600 + 300);
        req.seconds = Some(59);
        assert!(refused(&s, &req).contains("59 s is outside 60"));
        req.seconds = Some(91 * 86_400);
        assert!(refused(&s, &req).contains("jobserver"));
    }

    #[test]
    fn what_a_profile_forbids_is_refused_with_the_reason() {
        let (_dir, s) = signer();
        // CA rights.
        let mut ca = blank();
        ca.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        assert!(refused(&s, &node("c01", csr(ca), 30)).contains("CA rights"));
        // Another node's name, in the CN or in a SAN.
        let mut other = blank();
        other.distinguished_name.push(DnType::CommonName, "c02");
        let why = refused(&s, &node("c01", csr(other), 30));
        assert!(why.contains("\"c02\"") && why.contains("c01"), "{why}");
        let mut other = CertificateParams::new(vec!["mpcc".to_owned()]).unwrap();
        other.distinguished_name = DistinguishedName::new();
        assert!(refused(&s, &node("c01", csr(other), 30)).contains("DNS:mpcc"));
        // Server authentication for an agent.
        let mut server = blank();
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        assert!(refused(&s, &node("c01", csr(server), 30)).contains("server authentication"));
        // Validity out of bounds.
        assert!(refused(&s, &node("c01", csr(blank()), 31)).contains("1..=30"));
        assert!(refused(&s, &node("c01", csr(blank()), 0)).contains("1..=30"));
        // Identities that are not names.
        for bad in ["", "a/b", "-x", "c01\nCN=admin", &"x".repeat(254)] {
            let why = refused(&s, &node(bad, csr(blank()), 1));
            assert!(why.contains("not a valid identity"), "{bad:?}: {why}");
        }
        // Garbage and a CSR whose signature does not verify.
        assert!(refused(&s, &node("c01", "junk".into(), 1)).contains("CSR cannot be used"));
        let good = csr(blank());
        let mut der =
            rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(good.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec();
        let last = der.len() - 1;
        der[last] ^= 1;
        let tampered = pem_encode("CERTIFICATE REQUEST", &der);
        assert!(refused(&s, &node("c01", tampered, 1)).contains("CSR cannot be used"));
    }

    fn pem_encode(label: &str, der: &[u8]) -> String {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let mut out = format!("-----BEGIN {label}-----\n");
        for chunk in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(chunk).unwrap());
            out.push('\n');
        }
        out.push_str(&format!("-----END {label}-----\n"));
        out
    }

    #[test]
    fn the_loop_answers_line_by_line_and_survives_bad_lines() {
        let (_dir, s) = signer();
        let good = serde_json::to_string(&node("c01", csr(blank()), 7)).unwrap();
        let huge = "x".repeat(70_000);
        let input = format!("{good}\nnot json\n{huge}\n{good}\n");
        let mut out = Vec::new();
        serve(&s, input.as_bytes(), &mut out).unwrap();
        let replies: Vec<SignReply> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Answer>(l).unwrap().reply)
            .collect();
        assert_eq!(replies.len(), 4, "{replies:?}");
        assert!(matches!(replies[0], SignReply::Signed { .. }));
        assert!(
            matches!(&replies[1], SignReply::Refused { reason } if reason.contains("not understood"))
        );
        assert!(
            matches!(&replies[2], SignReply::Refused { reason } if reason.contains("longer than"))
        );
        assert!(matches!(replies[3], SignReply::Signed { .. }));
    }
}
