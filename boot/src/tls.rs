//! TLS between job servers: the image server's HTTPS listener (`--https`)
//! and the `image-sync` module that copies from it.
//!
//! Both ends use the certificate the job server enrolled for
//! ([`crate::identity`]), signed by the control service's CA. The control
//! service issues a job server a certificate for client authentication
//! naming it by a URI, `urn:mprov:jobserver:<name>`, and no DNS name or IP
//! address; so neither end checks a host name. Instead:
//!
//! * **The listener** ([`server_config`]) presents its own certificate and
//!   requires a client certificate that chains to the control CA and names
//!   a job server ([`JobserverClients`]): a node's certificate
//!   (`urn:mprov:node:...`), a certificate of another CA and no certificate
//!   are refused in the handshake.
//! * **The copying side** ([`client_config`]) presents its own certificate
//!   and accepts the server's only if it chains to the control CA (checked
//!   by webpki, with the certificate's own usage, client authentication, as
//!   the control service issued it) and names the job server it means to
//!   copy from ([`SourceVerifier`]). The handshake's signatures are checked
//!   as usual, so the peer holds that certificate's key.
//!
//! Not checked: revocation. The control service revokes a job server's old
//! certificate when it renews, and only it keeps that list; a revoked but
//! unexpired job server certificate is still taken here. The bytes copied
//! are verified against the control service's checksums in any case.
//!
//! The listener's certificate follows renewals: [`Reloading`] reads the
//! identity folder again whenever its certificate file changed.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{Context as _, Result, bail};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::identity::{self, Identity};

/// The start of the URI a job server's certificate names it by.
pub const JOBSERVER_URI: &str = "urn:mprov:jobserver:";

/// The default port of the HTTPS image listener: not 8443, the control
/// service's, which often runs on the same host.
pub const DEFAULT_HTTPS_PORT: u16 = 8444;

fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// The job server a certificate names (its `urn:mprov:jobserver:` URI), if
/// it names one.
pub fn jobserver_name(der: &[u8]) -> Option<String> {
    use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|n| match n {
        GeneralName::URI(u) => u
            .strip_prefix(JOBSERVER_URI)
            .filter(|name| !name.is_empty())
            .map(str::to_owned),
        _ => None,
    })
}

fn roots(ca_pem: &str) -> Result<Arc<rustls::RootCertStore>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.context("reading the CA bundle")?)
            .context("adding a CA certificate")?;
    }
    if roots.is_empty() {
        bail!("the CA bundle holds no certificate");
    }
    Ok(Arc::new(roots))
}

/// Checks a certificate chain against the control CA for client
/// authentication (the usage job server certificates have).
fn chain_verifier(ca_pem: &str) -> Result<Arc<dyn ClientCertVerifier>> {
    WebPkiClientVerifier::builder_with_provider(roots(ca_pem)?, provider())
        .build()
        .context("building the certificate verifier")
}

fn not_a_jobserver() -> rustls::Error {
    rustls::Error::InvalidCertificate(rustls::CertificateError::ApplicationVerificationFailure)
}

/// The listener's check of its clients: the chain to the control CA, and a
/// job server's name (see the module doc).
#[derive(Debug)]
pub struct JobserverClients {
    chain: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for JobserverClients {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .chain
            .verify_client_cert(end_entity, intermediates, now)?;
        match jobserver_name(end_entity) {
            Some(_) => Ok(verified),
            None => Err(not_a_jobserver()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

/// The copying side's check of the server: the chain to the control CA,
/// and the name of the job server it copies from (see the module doc). The
/// host name or address it was reached at is not in the certificate, so it
/// is not checked.
#[derive(Debug)]
pub struct SourceVerifier {
    chain: Arc<dyn ClientCertVerifier>,
    expected: String,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for SourceVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.chain
            .verify_client_cert(end_entity, intermediates, now)?;
        match jobserver_name(end_entity) {
            Some(name) if name == self.expected => Ok(ServerCertVerified::assertion()),
            Some(name) => Err(rustls::Error::General(format!(
                "the server is job server {name}, not {}",
                self.expected
            ))),
            None => Err(not_a_jobserver()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

type Pair = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn pem_pair(me: &Identity) -> Result<Pair> {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(me.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .context("reading the job server certificate")?;
    if chain.is_empty() {
        bail!("the job server certificate file holds no certificate");
    }
    let key = PrivateKeyDer::from_pem_slice(me.key_pem.as_bytes())
        .context("reading the job server key")?;
    Ok((chain, key))
}

fn certified_key(me: &Identity) -> Result<Arc<CertifiedKey>> {
    let (chain, key) = pem_pair(me)?;
    let key = provider()
        .key_provider
        .load_private_key(key)
        .context("loading the job server key")?;
    Ok(Arc::new(CertifiedKey::new(chain, key)))
}

/// The listener's certificate: the identity folder's, read again when its
/// certificate file changed (a renewal). A failed reread keeps the last one.
#[derive(Debug)]
pub struct Reloading {
    dir: PathBuf,
    kept: Mutex<(Option<SystemTime>, Arc<CertifiedKey>)>,
}

impl Reloading {
    /// The identity in `dir`, which must be there.
    pub fn new(dir: PathBuf) -> Result<Reloading> {
        let me = identity::load(&dir)?
            .with_context(|| format!("no job server certificate in {}", dir.display()))?;
        let stamp = Self::stamp(&dir);
        Ok(Reloading {
            kept: Mutex::new((stamp, certified_key(&me)?)),
            dir,
        })
    }

    fn stamp(dir: &std::path::Path) -> Option<SystemTime> {
        std::fs::metadata(dir.join(identity::CERT_FILE))
            .and_then(|m| m.modified())
            .ok()
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let stamp = Self::stamp(&self.dir);
        if stamp != kept.0 {
            match identity::load(&self.dir)
                .and_then(|me| me.context("the certificate is gone"))
                .and_then(|me| certified_key(&me))
            {
                Ok(key) => *kept = (stamp, key),
                Err(err) => tracing::warn!(
                    "HTTPS images: cannot read the renewed certificate in {} ({err:#}); keeping the last one",
                    self.dir.display()
                ),
            }
        }
        Some(kept.1.clone())
    }
}

/// The HTTPS image listener's TLS: the certificate in the identity folder
/// `dir`, client certificates of job servers under `ca_pem` required.
pub fn server_config(ca_pem: &str, dir: PathBuf) -> Result<Arc<rustls::ServerConfig>> {
    let clients = Arc::new(JobserverClients {
        chain: chain_verifier(ca_pem)?,
    });
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("the TLS protocol versions")?
        .with_client_cert_verifier(clients)
        .with_cert_resolver(Arc::new(Reloading::new(dir)?));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The TLS `image-sync` copies from job server `source` with: `me` as the
/// client certificate, the server's checked by [`SourceVerifier`].
pub fn client_config(ca_pem: &str, me: &Identity, source: &str) -> Result<rustls::ClientConfig> {
    let provider = provider();
    let verifier = Arc::new(SourceVerifier {
        chain: chain_verifier(ca_pem)?,
        expected: source.to_owned(),
        algorithms: provider.signature_verification_algorithms,
    });
    let (chain, key) = pem_pair(me)?;
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("the TLS protocol versions")?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .context("the job server certificate and key")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with_uri(uri: &str) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![rcgen::SanType::URI(uri.try_into().unwrap())];
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn only_a_jobserver_uri_names_a_jobserver() {
        assert_eq!(
            jobserver_name(&cert_with_uri("urn:mprov:jobserver:js1")).as_deref(),
            Some("js1")
        );
        assert_eq!(jobserver_name(&cert_with_uri("urn:mprov:node:c01")), None);
        assert_eq!(jobserver_name(&cert_with_uri("urn:mprov:jobserver:")), None);
        assert_eq!(jobserver_name(b"not a certificate"), None);
    }
}
