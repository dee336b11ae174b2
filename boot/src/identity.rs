//! The job server's own client certificate.
//!
//! Over HTTPS the job server authenticates to the control service with a
//! certificate naming it alone. It gets one once: it makes its key pair here
//! (the key never leaves the host), posts a CSR with a one-time enrollment
//! token to `/enroll/jobserver/`, and keeps the certificate and key in its
//! state folder (`identity/`, key mode 0600). Later starts reuse them; the
//! shared API key is only a fallback for installs that have not enrolled.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use mprov_api::client::{Auth, Client};
use mprov_api::enroll::JobserverEnrollment;

/// The certificate's file name in the identity folder.
pub const CERT_FILE: &str = "jobserver.crt";
/// The key's file name (mode 0600).
pub const KEY_FILE: &str = "jobserver.key";

/// A certificate and its key, PEM.
#[derive(Clone)]
pub struct Identity {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

impl Identity {
    /// Certificate then key, as the HTTP client takes them.
    pub fn pem_bundle(&self) -> Vec<u8> {
        format!("{}\n{}", self.cert_pem.trim_end(), self.key_pem).into_bytes()
    }
}

/// The identity folder inside the state folder.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("identity")
}

/// The kept identity, if the job server has enrolled.
pub fn load(dir: &Path) -> Result<Option<Identity>> {
    let (cert, key) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
    if !cert.exists() && !key.exists() {
        return Ok(None);
    }
    let read = |p: &Path| {
        std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
    };
    Ok(Some(Identity {
        cert_pem: read(&cert)?,
        key_pem: read(&key)?,
    }))
}

/// Enrolls with `token` as `name` at the control service `url` (trusting
/// `ca_pem`) and keeps the result in `dir`.
pub async fn enroll(
    url: &str,
    ca_pem: &str,
    token: &str,
    name: &str,
    dir: &Path,
) -> Result<Identity> {
    let key = rcgen::KeyPair::generate().context("cannot make a key pair")?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let csr = params.serialize_request(&key)?.pem()?;
    let client = Client::builder(url, Auth::None)
        .ca_certificates_pem(ca_pem.as_bytes().to_vec())
        .build()?;
    let enrolled = client
        .enroll_jobserver(&JobserverEnrollment {
            token: token.trim().to_owned(),
            name: name.to_owned(),
            csr,
        })
        .await
        .with_context(|| format!("enrolling as job server {name} at {url}"))?;
    let identity = Identity {
        cert_pem: enrolled.certificate,
        key_pem: key.serialize_pem(),
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    write(&dir.join(KEY_FILE), identity.key_pem.as_bytes(), 0o600)?;
    write(&dir.join(CERT_FILE), identity.cert_pem.as_bytes(), 0o644)?;
    tracing::info!(
        "enrolled as job server {name}; certificate valid until {}, kept in {}",
        enrolled.not_after,
        dir.display()
    );
    Ok(identity)
}

/// Writes through a temporary file renamed into place.
fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("cannot write {}", path.display()))
}
