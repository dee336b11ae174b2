//! The signing helper: the only process that reads the CA key.
//!
//! `mprov-control serve` starts `mprov-control signer` as a child and talks
//! to it over a private socket pair (the child's standard input and output):
//! one JSON [`SignRequest`] per line in, one JSON [`SignReply`] per line out.
//! No file-system socket exists, so no other process can ask it to sign.
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
        let key_pem = std::fs::read_to_string(&key_path).map_err(|err| TlsError::Io {
            what: "cannot read the CA key",
            path: key_path.clone(),
            err,
        })?;
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
        let csr = CertificateSigningRequestParams::from_pem(&req.csr_pem)
            .map_err(|e| Refusal::Csr(e.to_string()))?;
        if csr.params.is_ca != IsCa::NoCa {
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
    pub fn answer(&self, line: &str) -> SignReply {
        let result = serde_json::from_str::<SignRequest>(line)
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
        match result {
            Ok(reply) => reply,
            Err(why) => SignReply::Refused {
                reason: why.to_string(),
            },
        }
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
            SignReply::Refused {
                reason: format!("the request is longer than {MAX_REQUEST} bytes"),
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

/// The web service cannot reach the helper.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    /// The helper cannot be started, or exited before it was ready.
    #[error("cannot start the signing helper: {0}")]
    Start(String),
    /// The helper stopped answering.
    #[error("the signing helper is gone: {0}")]
    Gone(String),
}

/// How the helper is started again if it dies.
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

#[derive(Debug)]
struct Conn {
    child: tokio::process::Child,
    reader: tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: tokio::net::unix::OwnedWriteHalf,
}

#[derive(Debug)]
enum Backend {
    /// The helper process over its socket pair.
    Process {
        spec: SpawnSpec,
        conn: tokio::sync::Mutex<Option<Conn>>,
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
    /// Starts the helper process and waits until it is ready.
    pub async fn spawn(spec: SpawnSpec) -> Result<SignerClient, SignerError> {
        let (conn, ca_pem) = start(&spec).await?;
        Ok(SignerClient {
            ca_pem,
            backend: Backend::Process {
                spec,
                conn: tokio::sync::Mutex::new(Some(conn)),
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

    /// The helper's process id, if it runs as a process.
    pub async fn pid(&self) -> Option<u32> {
        match &self.backend {
            Backend::Process { conn, .. } => conn.lock().await.as_ref().and_then(|c| c.child.id()),
            Backend::InProcess(_) => None,
        }
    }

    /// Asks for a signature. A helper that died is started again once.
    pub async fn sign(&self, req: &SignRequest) -> Result<SignReply, SignerError> {
        let (spec, conn) = match &self.backend {
            Backend::InProcess(signer) => {
                let line =
                    serde_json::to_string(req).map_err(|e| SignerError::Gone(e.to_string()))?;
                return Ok(signer.answer(&line));
            }
            Backend::Process { spec, conn } => (spec, conn),
        };
        let mut line = serde_json::to_string(req).map_err(|e| SignerError::Gone(e.to_string()))?;
        line.push('\n');
        let mut guard = conn.lock().await;
        for attempt in 0..2 {
            if guard.is_none() {
                let (c, _) = start(spec).await?;
                *guard = Some(c);
            }
            let Some(c) = guard.as_mut() else { continue };
            match tokio::time::timeout(SIGN_TIMEOUT, exchange(c, &line)).await {
                Ok(Ok(reply)) => return Ok(reply),
                Ok(Err(err)) if attempt == 0 => {
                    tracing::error!("the signing helper stopped ({err}); starting it again");
                }
                Ok(Err(err)) => return Err(SignerError::Gone(err.to_string())),
                Err(_) => {
                    tracing::error!("the signing helper did not answer within {SIGN_TIMEOUT:?}");
                }
            }
            if let Some(mut dead) = guard.take() {
                let _ = dead.child.start_kill();
                let _ = dead.child.wait().await;
            }
        }
        Err(SignerError::Gone("it failed twice in a row".into()))
    }
}

async fn exchange(conn: &mut Conn, line: &str) -> std::io::Result<SignReply> {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    conn.writer.write_all(line.as_bytes()).await?;
    let mut reply = String::new();
    if conn.reader.read_line(&mut reply).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    serde_json::from_str(&reply).map_err(std::io::Error::other)
}

/// Starts the helper on one end of a fresh socket pair and reads its
/// ready line.
async fn start(spec: &SpawnSpec) -> Result<(Conn, String), SignerError> {
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
    let ready: Ready = serde_json::from_str(&first)
        .map_err(|e| SignerError::Start(format!("unexpected first line: {e}")))?;
    Ok((
        Conn {
            child,
            reader,
            writer,
        },
        ready.ready.ca_pem,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> (tempfile::TempDir, Signer) {
        let dir = tempfile::tempdir().unwrap();
        let s = Signer::open(dir.path(), "mpcc").unwrap();
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
            .map(|l| serde_json::from_str(l).unwrap())
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
