//! The install's own certificate authority and the HTTPS certificate.
//!
//! At every start, before anything listens, [`prepare`] makes sure the TLS
//! folder (`/var/lib/mprov/tls` by default) holds:
//!
//! - `ca.crt` / `ca.key`: this install's CA, made at the first start (never at
//!   build time, so no two installs share one) and kept afterwards. Losing it
//!   means a new CA, and every enrolled agent must enroll again.
//! - `server.crt` / `server.key`: the HTTPS certificate, signed by that CA,
//!   naming the control host (`MPROV_MPCC_HOSTNAME`, `hostname.domain`, every
//!   `MPROV_MPCC_IPs` address, `localhost`, `127.0.0.1`) and valid a year. It
//!   is made again at start when under [`RENEW_BEFORE`] is left, when those
//!   names change, or when it no longer chains to the CA.
//!
//! `MPROV_TLS_CERT` + `MPROV_TLS_KEY` serve a site certificate instead; the CA
//! is still made, as agents' credentials come from it. Keys are written with
//! mode 0600, certificates 0644. Keys are ECDSA P-256 (ring, the workspace's
//! one TLS crypto provider).
//!
//! The HTTPS listener asks every client for an optional certificate from the
//! CA ([`server_config`]): browsers, `mash` and scripts without one are
//! served as before; a presented certificate must chain to the CA.

use std::collections::BTreeSet;
use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SerialNumber,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest as _, Sha256};

use crate::config::Config;
use crate::signer::{Profile, SignReply, SignRequest, SignerClient};

/// The CA certificate's file name in the TLS folder.
pub const CA_CERT: &str = "ca.crt";
/// The CA key's file name (mode 0600; only the signer reads it).
pub const CA_KEY: &str = "ca.key";
/// The HTTPS certificate's file name.
pub const SERVER_CERT: &str = "server.crt";
/// The HTTPS key's file name (mode 0600).
pub const SERVER_KEY: &str = "server.key";
/// How long the CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(20 * 365 * 86_400);
/// How long an HTTPS certificate is valid.
pub const SERVER_VALIDITY: Duration = Duration::from_secs(365 * 86_400);
/// An HTTPS certificate with less than this left is made again at start.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 86_400);
/// Certificates start this long before they are made, so a node whose clock
/// is a little behind still accepts them.
const BACKDATE: Duration = Duration::from_secs(3600);

/// The TLS folder cannot be set up; the service does not start.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Only one of the site certificate's two files is configured.
    #[error(
        "MPROV_TLS_CERT and MPROV_TLS_KEY go together: {set} is set but {missing} is not; set both to serve a site certificate, or neither to use the install's own"
    )]
    HalfSiteCert {
        /// The variable that is set.
        set: &'static str,
        /// The one that is missing.
        missing: &'static str,
    },
    /// A file cannot be read or written.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// Why it failed.
        #[source]
        err: std::io::Error,
    },
    /// A file holds no usable PEM certificate or key.
    #[error("{} holds no usable {what}", path.display())]
    Pem {
        /// Certificate or key.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// Making or reading a certificate failed.
    #[error("{what}")]
    Cert {
        /// What was being made or read.
        what: String,
        /// The library's reason.
        #[source]
        err: rcgen::Error,
    },
    /// The certificate and key do not make a usable TLS configuration (for
    /// a site certificate: the key does not match the certificate).
    #[error("the HTTPS certificate and key cannot be used together")]
    Rustls(#[source] rustls::Error),
    /// The operating system gave no randomness.
    #[error("no randomness from the operating system: {0}")]
    Random(String),
    /// The signing helper refused or failed.
    #[error("the signing helper did not sign the HTTPS certificate: {0}")]
    Signer(String),
    /// The TLS folder or the CA key could be changed by someone else.
    #[error(
        "{} {why}; the CA and its key must be reachable by {who} alone, under folders only {who} can change. Restore it from a backup (see the admin guide), or move it aside to have a new CA made (every agent then enrolls again)",
        path.display()
    )]
    Unsafe {
        /// The file or folder.
        path: PathBuf,
        /// What is wrong.
        why: String,
        /// Who must own it: root, or the user the service runs as.
        who: String,
    },
    /// The client-certificate verifier cannot be built from the CA.
    #[error("the CA certificate cannot verify client certificates")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
}

/// What [`prepare`] did with the HTTPS certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerCert {
    /// Made, with the reason (first start, near expiry, names changed...).
    Made(String),
    /// The one on disk is still good.
    Kept,
    /// A site certificate from `MPROV_TLS_CERT` / `MPROV_TLS_KEY`.
    Site,
}

/// The TLS material the service runs with.
#[derive(Debug)]
pub struct Tls {
    /// The TLS folder.
    pub dir: PathBuf,
    /// The CA certificate, PEM (served at `/ca.crt`).
    pub ca_pem: String,
    /// The CA certificate, DER.
    pub ca_der: CertificateDer<'static>,
    /// What happened to the HTTPS certificate.
    pub server: ServerCert,
    /// The HTTPS certificate chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The HTTPS key.
    pub key: PrivateKeyDer<'static>,
}

impl Tls {
    /// The SHA-256 fingerprint of the CA certificate (lower-case hex of its
    /// DER), as nodes get it on the kernel command line (`mprov_ca=`).
    pub fn ca_fingerprint(&self) -> String {
        fingerprint(&self.ca_der)
    }
}

/// The SHA-256 of a certificate's DER, lower-case hex.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// The names the HTTPS certificate must cover: DNS names and IP addresses.
pub fn wanted_names(config: &Config) -> (BTreeSet<String>, BTreeSet<IpAddr>) {
    let mut dns = BTreeSet::from(["localhost".to_owned()]);
    let mut ips: BTreeSet<IpAddr> = config.ips.iter().copied().collect();
    ips.insert(IpAddr::from([127, 0, 0, 1]));
    let host = config.hostname.to_ascii_lowercase();
    if let Ok(ip) = host.parse::<IpAddr>() {
        ips.insert(ip);
    } else if !host.is_empty() {
        if !config.domain.is_empty() && !host.contains('.') {
            dns.insert(format!("{host}.{}", config.domain.to_ascii_lowercase()));
        }
        dns.insert(host);
    }
    (dns, ips)
}

/// The site certificate's files, if configured; only one of them is an
/// error that stops the start.
pub fn site_cert(config: &Config) -> Result<Option<(PathBuf, PathBuf)>, TlsError> {
    match (&config.tls_cert, &config.tls_key) {
        (Some(c), Some(k)) => Ok(Some((c.clone(), k.clone()))),
        (Some(_), None) => Err(TlsError::HalfSiteCert {
            set: "MPROV_TLS_CERT",
            missing: "MPROV_TLS_KEY",
        }),
        (None, Some(_)) => Err(TlsError::HalfSiteCert {
            set: "MPROV_TLS_KEY",
            missing: "MPROV_TLS_CERT",
        }),
        (None, None) => Ok(None),
    }
}

/// Returns what the HTTPS listener serves (see the module documentation):
/// the CA certificate `ca_pem` that the signer made or loaded, and the HTTPS
/// certificate, which the signer signs again when it must be renewed.
pub async fn prepare(config: &Config, signer: &SignerClient) -> Result<Tls, TlsError> {
    let site = site_cert(config)?;
    let dir = config.tls_dir.clone();
    let ca_pem = signer.ca_pem().to_owned();
    let ca_der = CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(|_| TlsError::Pem {
        what: "certificate",
        path: dir.join(CA_CERT),
    })?;
    let (server, chain, key) = match site {
        Some((cert, key)) => {
            let chain = read_chain(&cert)?;
            let key = read_key(&key)?;
            (ServerCert::Site, chain, key)
        }
        None => {
            let server = ensure_server_cert(&dir, &ca_der, config, signer).await?;
            let chain = read_chain(&dir.join(SERVER_CERT))?;
            let key = read_key(&dir.join(SERVER_KEY))?;
            (server, chain, key)
        }
    };
    Ok(Tls {
        dir,
        ca_pem,
        ca_der,
        server,
        chain,
        key,
    })
}

/// The rustls configuration of the HTTPS listener: the HTTPS certificate,
/// and an optional client certificate that must chain to the CA.
pub fn server_config(tls: &Tls) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(tls.ca_der.clone()).map_err(TlsError::Rustls)?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(TlsError::Verifier)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(tls.chain.clone(), tls.key.clone_key())
        .map_err(TlsError::Rustls)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Creates the TLS folder (mode 0700; folders above it that it makes get
/// 0755) if it is missing, then checks that nobody but this process's user
/// can change it or read the key: see [`check_private_dir`]. Nothing is
/// repaired: a TLS folder that someone else could have changed is refused.
pub(crate) fn ensure_dir(dir: &Path) -> Result<(), TlsError> {
    if !matches!(
        crate::privileges::kind_of(dir),
        Ok(crate::privileges::Kind::Folder | crate::privileges::Kind::Link)
    ) {
        crate::first_start::make_dir(dir, 0o700).map_err(|err| TlsError::Io {
            what: "cannot create the TLS folder",
            path: dir.to_owned(),
            err: std::io::Error::other(format!("{err:#}")),
        })?;
    }
    check_private_dir(dir)?;
    // Fail now, with the folder named, if it cannot be written.
    let probe = dir.join(".write-test");
    let _ = fs::remove_file(&probe);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&probe)
        .and_then(|_| fs::remove_file(&probe))
        .map_err(|err| TlsError::Io {
            what: "cannot write in the TLS folder",
            path: dir.to_owned(),
            err,
        })
}

/// Who this process is, for the messages: `root` or `uid N`.
fn who() -> String {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        "root".into()
    } else {
        format!("uid {uid}")
    }
}

/// The TLS folder must be a real folder (not a link), this process's user's
/// (root's when started as root), closed to group and others, and every
/// folder above it must be root's or this user's and writable by nobody
/// else (a sticky folder such as /tmp aside), so no other user can swap it.
pub fn check_private_dir(dir: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::MetadataExt as _;
    let euid = nix::unistd::geteuid().as_raw();
    let unsafe_ = |path: &Path, why: String| TlsError::Unsafe {
        path: path.to_owned(),
        why,
        who: who(),
    };
    let meta = fs::symlink_metadata(dir).map_err(|err| TlsError::Io {
        what: "cannot read the TLS folder",
        path: dir.to_owned(),
        err,
    })?;
    if meta.file_type().is_symlink() {
        return Err(unsafe_(dir, "is a symbolic link".into()));
    }
    if !meta.is_dir() {
        return Err(unsafe_(dir, "is not a folder".into()));
    }
    if meta.uid() != euid {
        return Err(unsafe_(dir, format!("belongs to uid {}", meta.uid())));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(unsafe_(
            dir,
            format!(
                "is open to its group or others (mode {:04o})",
                meta.mode() & 0o7777
            ),
        ));
    }
    let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    for parent in abs.ancestors().skip(1) {
        let Ok(m) = fs::metadata(parent) else {
            continue;
        };
        if m.uid() != 0 && m.uid() != euid {
            return Err(unsafe_(
                dir,
                format!(
                    "is inside {}, which belongs to uid {}",
                    parent.display(),
                    m.uid()
                ),
            ));
        }
        if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
            return Err(unsafe_(
                dir,
                format!(
                    "is inside {}, which others may write (mode {:04o})",
                    parent.display(),
                    m.mode() & 0o7777
                ),
            ));
        }
    }
    Ok(())
}

/// Reads a file of the TLS folder without following a link; for a key
/// (`private`), it must also be this user's and closed to group and others.
pub(crate) fn read_private(path: &Path, private: bool) -> Result<String, TlsError> {
    use std::io::Read as _;
    use std::os::unix::fs::MetadataExt as _;
    let io = |err| TlsError::Io {
        what: "cannot read",
        path: path.to_owned(),
        err,
    };
    let Some((mut file, meta)) = crate::privileges::open_nofollow(path).map_err(io)? else {
        return Err(TlsError::Unsafe {
            path: path.to_owned(),
            why: "is a symbolic link or not a regular file".into(),
            who: who(),
        });
    };
    if !meta.is_file() {
        return Err(TlsError::Unsafe {
            path: path.to_owned(),
            why: "is not a regular file".into(),
            who: who(),
        });
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(TlsError::Unsafe {
            path: path.to_owned(),
            why: format!("belongs to uid {}", meta.uid()),
            who: who(),
        });
    }
    if private && meta.mode() & 0o077 != 0 {
        return Err(TlsError::Unsafe {
            path: path.to_owned(),
            why: format!(
                "is open to its group or others (mode {:04o})",
                meta.mode() & 0o7777
            ),
            who: who(),
        });
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(io)?;
    Ok(text)
}

/// Loads the CA certificate, making the CA first if the folder has none.
/// Returns its PEM and whether it was made now.
pub(crate) fn ensure_ca(dir: &Path, hostname: &str) -> Result<(String, bool), TlsError> {
    let cert_path = dir.join(CA_CERT);
    let key_path = dir.join(CA_KEY);
    let there = |p: &Path| {
        !matches!(
            crate::privileges::kind_of(p),
            Ok(crate::privileges::Kind::Missing)
        )
    };
    match (there(&cert_path), there(&key_path)) {
        (true, true) => {
            // Both checked: a planted link or a key others can read stops
            // the start.
            read_private(&key_path, true)?;
            let pem = read_private(&cert_path, false)?;
            Ok((pem, false))
        }
        (false, false) => {
            let key = KeyPair::generate().map_err(|err| TlsError::Cert {
                what: "cannot make the CA key".into(),
                err,
            })?;
            let cert = ca_params(hostname)?
                .self_signed(&key)
                .map_err(|err| TlsError::Cert {
                    what: "cannot make the CA certificate".into(),
                    err,
                })?;
            // The key first: a folder with a certificate but no key would
            // otherwise be read as a CA whose key was lost.
            write_file(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
            let pem = cert.pem();
            write_file(&cert_path, pem.as_bytes(), 0o644)?;
            tracing::info!(
                fingerprint = %fingerprint(cert.der()),
                "made this install's certificate authority in {}",
                dir.display()
            );
            Ok((pem, true))
        }
        (true, false) => Err(TlsError::Io {
            what: "the CA key is missing beside its certificate (restore it from a backup, or remove ca.crt to make a new CA, which makes every agent enroll again):",
            path: key_path,
            err: std::io::ErrorKind::NotFound.into(),
        }),
        (false, true) => Err(TlsError::Io {
            what: "the CA certificate is missing beside its key (restore it from a backup, or remove ca.key to make a new CA):",
            path: cert_path,
            err: std::io::ErrorKind::NotFound.into(),
        }),
    }
}

fn ca_params(hostname: &str) -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "mProv");
    // A random suffix: two installs on hosts of the same name still get
    // CAs with different names, so a client never confuses them.
    let id = hex::encode(random_bytes::<4>()?);
    dn.push(DnType::CommonName, format!("mProv CA {hostname} {id}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = SystemTime::now();
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + CA_VALIDITY).into();
    params.serial_number = Some(serial()?);
    Ok(params)
}

/// Has the HTTPS certificate made again, by the signer, unless the one on
/// disk is good.
async fn ensure_server_cert(
    dir: &Path,
    ca_der: &CertificateDer<'_>,
    config: &Config,
    signer: &SignerClient,
) -> Result<ServerCert, TlsError> {
    let (dns, ips) = wanted_names(config);
    let cert_path = dir.join(SERVER_CERT);
    let key_path = dir.join(SERVER_KEY);
    let reason = if !cert_path.exists() || !key_path.exists() {
        Some("none yet".to_owned())
    } else {
        let pem = read_text(&cert_path, "cannot read the HTTPS certificate")?;
        renew_reason(&pem, ca_der, &dns, &ips, SystemTime::now())
    };
    let Some(reason) = reason else {
        return Ok(ServerCert::Kept);
    };
    let key = KeyPair::generate().map_err(|err| TlsError::Cert {
        what: "cannot make the HTTPS key".into(),
        err,
    })?;
    let host = dns
        .iter()
        .find(|n| *n != "localhost")
        .cloned()
        .unwrap_or_else(|| "localhost".into());
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    let csr = params
        .serialize_request(&key)
        .and_then(|csr| csr.pem())
        .map_err(|err| TlsError::Cert {
            what: "cannot make the HTTPS certificate request".into(),
            err,
        })?;
    let names = dns
        .iter()
        .cloned()
        .chain(ips.iter().map(IpAddr::to_string))
        .collect();
    let days = u32::try_from(SERVER_VALIDITY.as_secs() / 86_400).unwrap_or(365);
    let request = SignRequest {
        profile: Profile::Server,
        identity: host,
        names,
        csr_pem: csr,
        days,
        seconds: None,
        id: 0,
    };
    let cert_pem = match signer.sign(&request).await {
        Ok(SignReply::Signed { cert_pem, .. }) => cert_pem,
        Ok(SignReply::Refused { reason }) => return Err(TlsError::Signer(reason)),
        Err(err) => return Err(TlsError::Signer(err.to_string())),
    };
    write_file(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
    write_file(&cert_path, cert_pem.as_bytes(), 0o644)?;
    tracing::info!(%reason, "made the HTTPS certificate, valid for a year");
    Ok(ServerCert::Made(reason))
}

/// Why the HTTPS certificate in `pem` must be made again, or `None` if it
/// is good: it must chain to the CA, name exactly `dns` and `ips`, and have
/// at least [`RENEW_BEFORE`] left at `now`.
pub fn renew_reason(
    pem: &str,
    ca_der: &CertificateDer<'_>,
    dns: &BTreeSet<String>,
    ips: &BTreeSet<IpAddr>,
    now: SystemTime,
) -> Option<String> {
    use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};
    let Ok(der) = CertificateDer::from_pem_slice(pem.as_bytes()) else {
        return Some("the certificate on disk cannot be read".into());
    };
    let Ok((_, cert)) = X509Certificate::from_der(&der) else {
        return Some("the certificate on disk cannot be parsed".into());
    };
    let Ok((_, ca)) = X509Certificate::from_der(ca_der) else {
        return Some("the CA certificate cannot be parsed".into());
    };
    if cert.issuer() != ca.subject() || cert.verify_signature(Some(ca.public_key())).is_err() {
        return Some("it was not signed by this install's CA".into());
    }
    let not_after = cert.validity().not_after.timestamp();
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let renew_secs = i64::try_from(RENEW_BEFORE.as_secs()).unwrap_or(i64::MAX);
    if not_after - now < renew_secs {
        return Some(format!(
            "under 30 days left (it ends {})",
            cert.validity().not_after
        ));
    }
    let mut have_dns = BTreeSet::new();
    let mut have_ips = BTreeSet::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(n) => {
                    have_dns.insert(n.to_ascii_lowercase());
                }
                GeneralName::IPAddress(b) => {
                    if let Ok(a) = <[u8; 4]>::try_from(*b) {
                        have_ips.insert(IpAddr::from(a));
                    } else if let Ok(a) = <[u8; 16]>::try_from(*b) {
                        have_ips.insert(IpAddr::from(a));
                    }
                }
                _ => {}
            }
        }
    }
    if &have_dns != dns || &have_ips != ips {
        return Some("the host names or addresses changed".into());
    }
    None
}

fn read_text(path: &Path, what: &'static str) -> Result<String, TlsError> {
    fs::read_to_string(path).map_err(|err| TlsError::Io {
        what,
        path: path.to_owned(),
        err,
    })
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = fs::read(path).map_err(|err| TlsError::Io {
        what: "cannot read the certificate",
        path: path.to_owned(),
        err,
    })?;
    let chain: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::Pem {
            what: "certificate",
            path: path.to_owned(),
        });
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = fs::read(path).map_err(|err| TlsError::Io {
        what: "cannot read the key",
        path: path.to_owned(),
        err,
    })?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| TlsError::Pem {
        what: "private key",
        path: path.to_owned(),
    })
}

/// Writes `bytes` to `path` with `mode`, through a temporary file renamed
/// over it, so a crash never leaves half a key.
pub(crate) fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    mprov_process::write_atomic(path, bytes, mode).map_err(|err| TlsError::Io {
        what: "cannot write",
        path: path.to_owned(),
        err,
    })
}

fn random_bytes<const N: usize>() -> Result<[u8; N], TlsError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|err| TlsError::Random(err.to_string()))?;
    Ok(b)
}

/// A random, positive 16-byte serial number (RFC 5280 §4.1.2.2).
pub(crate) fn serial() -> Result<SerialNumber, TlsError> {
    let mut s = random_bytes::<16>()?;
    s[0] &= 0x7f;
    s[0] |= 0x01;
    Ok(SerialNumber::from_slice(&s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> (BTreeSet<String>, BTreeSet<IpAddr>) {
        (
            BTreeSet::from(["localhost".to_owned(), "mpcc".to_owned()]),
            BTreeSet::from([IpAddr::from([127, 0, 0, 1])]),
        )
    }

    fn ca_der(dir: &Path) -> CertificateDer<'static> {
        let (pem, _) = ensure_ca(dir, "mpcc").unwrap();
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    /// An HTTPS certificate for `names`, signed by the CA in `dir`.
    fn server_cert(dir: &Path, names: &[&str]) -> String {
        let signer = crate::signer::Signer::open(dir, "mpcc").unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        let csr = params.serialize_request(&key).unwrap().pem().unwrap();
        let req = SignRequest {
            profile: Profile::Server,
            identity: "mpcc".into(),
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            csr_pem: csr,
            days: 365,
            seconds: None,
            id: 0,
        };
        match signer.sign(&req).unwrap() {
            SignReply::Signed { cert_pem, .. } => cert_pem,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn renewal_rules() {
        let dir = tempfile::tempdir().unwrap();
        // A TLS folder must be private to be used.
        fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let ca = ca_der(dir.path());
        let (dns, ips) = names();
        let pem = server_cert(dir.path(), &["localhost", "mpcc", "127.0.0.1"]);
        let now = SystemTime::now();
        assert_eq!(renew_reason(&pem, &ca, &dns, &ips, now), None);
        // 340 days on, under 30 days are left.
        let later = now + Duration::from_secs(340 * 86_400);
        let why = renew_reason(&pem, &ca, &dns, &ips, later).unwrap();
        assert!(why.contains("under 30 days"), "{why}");
        // A name more or less.
        let mut more = dns.clone();
        more.insert("mpcc.cluster".into());
        assert!(renew_reason(&pem, &ca, &more, &ips, now).is_some());
        let fewer = BTreeSet::from([IpAddr::from([10, 0, 0, 1])]);
        assert!(renew_reason(&pem, &ca, &dns, &fewer, now).is_some());
        // Another install's CA.
        let other = tempfile::tempdir().unwrap();
        let other_ca = ca_der(other.path());
        let why = renew_reason(&pem, &other_ca, &dns, &ips, now).unwrap();
        assert!(why.contains("not signed by this install's CA"), "{why}");
        assert!(renew_reason("junk", &ca, &dns, &ips, now).is_some());
    }

    #[test]
    fn a_ca_is_made_once_and_a_half_ca_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (first, made) = ensure_ca(dir.path(), "mpcc").unwrap();
        assert!(made);
        let (again, made) = ensure_ca(dir.path(), "mpcc").unwrap();
        assert!(!made);
        assert_eq!(first, again);
        let other = tempfile::tempdir().unwrap();
        let (second_install, _) = ensure_ca(other.path(), "mpcc").unwrap();
        assert_ne!(first, second_install, "every install has its own CA");
        std::fs::remove_file(dir.path().join(CA_KEY)).unwrap();
        let err = ensure_ca(dir.path(), "mpcc").unwrap_err().to_string();
        assert!(err.contains("CA key is missing"), "{err}");
    }
}
