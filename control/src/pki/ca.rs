//! The install's own certificate authority: the TLS folder, which must be
//! this user's alone, the CA certificate and key made there at the first
//! start (never at build time, so no two installs share one) and kept
//! afterwards, and the file helpers the rest of [`super`] writes keys with.
//! Losing the CA means a new one, and every enrolled agent must enroll
//! again.

use std::fs;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SerialNumber,
};
use sha2::{Digest as _, Sha256};

use super::BACKDATE;

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
    #[error("no randomness from the operating system")]
    Random(#[source] getrandom::Error),
    /// The signing helper refused.
    #[error("the signing helper refused to sign the HTTPS certificate: {0}")]
    SignerRefused(String),
    /// The signing helper could not be reached.
    #[error("the signing helper did not sign the HTTPS certificate")]
    Signer(#[source] crate::pki::SignerError),
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

/// The SHA-256 of a certificate's DER, lower-case hex.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
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
        crate::privileges::make_dir(dir, 0o700).map_err(|err| TlsError::Io {
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
    getrandom::fill(&mut b).map_err(TlsError::Random)?;
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
