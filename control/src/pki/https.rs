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
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{CertificateParams, DistinguishedName, KeyPair};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::ca::{CA_CERT, SERVER_CERT, SERVER_KEY, TlsError, fingerprint, write_file};
use super::client::SignerClient;
use super::protocol::{Profile, SignReply, SignRequest};
use crate::config::Config;

/// How long an HTTPS certificate is valid.
pub const SERVER_VALIDITY: Duration = Duration::from_secs(365 * 86_400);
/// An HTTPS certificate with less than this left is made again at start.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 86_400);

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
    let cert_pem = match signer.request_certificate(&request).await {
        Ok(SignReply::Signed { cert_pem, .. }) => cert_pem,
        Ok(SignReply::Refused { reason }) => return Err(TlsError::SignerRefused(reason)),
        Err(err) => return Err(TlsError::Signer(err)),
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

#[cfg(test)]
mod tests {
    use super::super::ca::ensure_ca;
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
        let signer = super::super::helper::Signer::open(dir, "mpcc").unwrap();
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
        match signer.sign_csr(&req).unwrap() {
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
}
