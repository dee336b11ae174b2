//! The job server's own client certificate.
//!
//! Over HTTPS the job server authenticates to the control service with a
//! certificate naming it alone. It gets one once: it makes its key pair here
//! (the key never leaves the host), posts a CSR with a one-time enrollment
//! token to `/enroll/jobserver/`, and keeps the certificate and key in its
//! state folder (`identity/`, key mode 0600). Without a token, an API key
//! (the seed's `apikey`) enrolls it the same way if the key is an admin's
//! ([`enroll_with_apikey`]): the key only gets the certificate, which every
//! later request uses. Later starts reuse them; following the boot config
//! with the API key is only a fallback for installs that cannot enroll.
//!
//! The certificate is renewed before it ends ([`keep_renewed`]): when a third
//! of its validity is left ([`renew_at`]), the job server makes a new key,
//! posts a CSR to `/enroll/renew/` over mTLS with the current certificate
//! (the control service revokes that one), keeps the new pair and hands the
//! boot config follower a client with it. A failed renewal is retried with a
//! doubling pause ([`retry_pause`]); once less than a sixth is left
//! ([`near_expiry`]) every failure is a warning and `/metrics` shows it
//! (`mprov_jobserver_cert_near_expiry`). Boot services never stop for any of
//! this: at worst the last boot config keeps being served.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use mprov_api::client::{Auth, Client};
use mprov_api::enroll::{JobserverEnrollment, Renewal};
use mprov_process::metrics::Prefixed;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

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
    enroll_as(url, ca_pem, Auth::None, token.trim(), name, dir).await
}

/// Enrolls without a token, on an admin's API key (the seed's `apikey`),
/// as `name` at the control service `url` (trusting `ca_pem`), and keeps
/// the result in `dir`: as with a token, the key pair is made here and
/// only the CSR is sent. The control service refuses a key that is no
/// admin's (403) and a name that holds a valid certificate (409).
pub async fn enroll_with_apikey(
    url: &str,
    ca_pem: &str,
    apikey: &str,
    name: &str,
    dir: &Path,
) -> Result<Identity> {
    let auth = Auth::ApiKey(apikey.trim().to_owned());
    enroll_as(url, ca_pem, auth, "", name, dir).await
}

/// Posts a CSR for a new key with `token` (empty: none) and credentials
/// `auth`; keeps the certificate and key in `dir`.
async fn enroll_as(
    url: &str,
    ca_pem: &str,
    auth: Auth,
    token: &str,
    name: &str,
    dir: &Path,
) -> Result<Identity> {
    let (key, csr) = key_and_csr(name)?;
    let by = if token.is_empty() {
        "the API key"
    } else {
        "a token"
    };
    let client = Client::builder(url, auth)
        .ca_certificates_pem(ca_pem.as_bytes().to_vec())
        .build()?;
    let enrolled = client
        .enroll_jobserver(&JobserverEnrollment {
            token: token.to_owned(),
            name: name.to_owned(),
            csr,
        })
        .await
        .with_context(|| format!("enrolling as job server {name} at {url} with {by}"))?;
    let identity = Identity {
        cert_pem: enrolled.certificate,
        key_pem: key.serialize_pem(),
    };
    keep(dir, &identity)?;
    tracing::info!(
        "enrolled as job server {name} with {by}; certificate valid until {}, kept in {}",
        enrolled.not_after,
        dir.display()
    );
    Ok(identity)
}

/// A new key pair and a CSR naming `name`, PEM.
fn key_and_csr(name: &str) -> Result<(rcgen::KeyPair, String)> {
    let key = rcgen::KeyPair::generate().context("cannot make a key pair")?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let csr = params.serialize_request(&key)?.pem()?;
    Ok((key, csr))
}

/// Keeps `identity` in `dir`: both files are written in full first, then
/// renamed into place, key first.
fn keep(dir: &Path, identity: &Identity) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (key, cert) = (dir.join(KEY_FILE), dir.join(CERT_FILE));
    let key_new = dir.join(format!("{KEY_FILE}.new"));
    let cert_new = dir.join(format!("{CERT_FILE}.new"));
    write(&key_new, identity.key_pem.as_bytes(), 0o600)?;
    write(&cert_new, identity.cert_pem.as_bytes(), 0o644)?;
    std::fs::rename(&key_new, &key)
        .and_then(|()| std::fs::rename(&cert_new, &cert))
        .with_context(|| format!("cannot replace the certificate in {}", dir.display()))
}

/// When a certificate counts from and when it ends, Unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    /// When it was issued: its notBefore, or the time it was kept here if
    /// later (the signer backdates notBefore for clock skew, which must not
    /// count as validity).
    pub start: u64,
    /// Its notAfter.
    pub end: u64,
}

impl Lifetime {
    /// Of `cert_pem`, kept at `kept` (the certificate file's mtime).
    pub fn of(cert_pem: &str, kept: Option<SystemTime>) -> Result<Self> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| anyhow::anyhow!("the job server certificate is not PEM: {e}"))?;
        let cert = pem
            .parse_x509()
            .map_err(|e| anyhow::anyhow!("the job server certificate does not parse: {e}"))?;
        let secs = |t: i64| u64::try_from(t).unwrap_or(0);
        let not_before = secs(cert.validity().not_before.timestamp());
        let end = secs(cert.validity().not_after.timestamp());
        let kept = kept.map_or(0, unix);
        let start = not_before.max(kept).min(end);
        Ok(Self { start, end })
    }
}

/// When to renew: a third of the validity before its end.
pub fn renew_at(life: Lifetime) -> u64 {
    life.end - (life.end - life.start) / 3
}

/// Whether less than a sixth of the validity is left at `now`: renewal has
/// been failing for a while and an admin should look.
pub fn near_expiry(life: Lifetime, now: u64) -> bool {
    life.end.saturating_sub(now) < (life.end - life.start) / 6
}

/// The pause after `failures` failed renewals in a row with `left` seconds
/// of validity left: doubling from 5 s, at most an hour, and at most an
/// eighth of what is left (so a short certificate gets several tries),
/// never under 5 s.
pub fn retry_pause(failures: u32, left: u64) -> Duration {
    let doubling = 5u64.saturating_mul(1 << failures.clamp(1, 20).saturating_sub(1));
    Duration::from_secs(doubling.min(3600).min(left / 8).max(5))
}

/// Metrics of the job server's certificate.
#[derive(Debug, Clone, Default)]
pub struct CertMetrics {
    /// When the certificate ends, Unix seconds.
    pub not_after: Gauge,
    /// 1 when less than a sixth of its validity is left.
    pub near_expiry: Gauge,
    /// Renewals done.
    pub renewals: Counter,
    /// Renewals that failed.
    pub renewal_failures: Counter,
}

impl CertMetrics {
    /// Registered into `registry` under `jobserver_cert_`.
    pub fn register(registry: &mut Registry) -> Self {
        let mut r = Prefixed::new(registry, "jobserver_cert");
        CertMetrics {
            not_after: r.metric(
                "not_after",
                "When the job server's certificate ends, Unix seconds",
            ),
            near_expiry: r.metric(
                "near_expiry",
                "1 when less than a sixth of the certificate's validity is left (renewal failing)",
            ),
            renewals: r.metric("renewals", "Certificate renewals done"),
            renewal_failures: r.metric("renewal_failures", "Certificate renewals that failed"),
        }
    }
}

/// How to reach the control service for renewals.
#[derive(Debug, Clone)]
pub struct Control {
    /// Its https:// URL.
    pub url: String,
    /// Its CA certificate, PEM.
    pub ca_pem: String,
    /// This job server's name.
    pub name: String,
    /// The identity folder.
    pub dir: PathBuf,
}

impl Control {
    /// A client presenting `me`.
    pub fn client(&self, me: &Identity) -> Result<Client> {
        Ok(Client::builder(&self.url, Auth::None)
            .ca_certificates_pem(self.ca_pem.clone().into_bytes())
            .identity_pem(me.pem_bundle())
            .build()?)
    }

    /// One renewal: a new key, its CSR posted with `me`; the new identity,
    /// kept in the identity folder.
    pub async fn renew(&self, me: &Identity) -> Result<Identity> {
        let (key, csr) = key_and_csr(&self.name)?;
        let renewed = self
            .client(me)?
            .renew(&Renewal { csr })
            .await
            .with_context(|| format!("renewing the certificate at {}", self.url))?;
        let identity = Identity {
            cert_pem: renewed.certificate,
            key_pem: key.serialize_pem(),
        };
        keep(&self.dir, &identity)?;
        Ok(identity)
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn unix_now() -> u64 {
    unix(SystemTime::now())
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Keeps `me` renewed until `stop`, publishing a client with each new
/// certificate on `clients`. Never returns an error: a failure is logged and
/// retried, and the servers keep running.
pub async fn keep_renewed(
    control: Control,
    mut me: Identity,
    clients: watch::Sender<Client>,
    metrics: CertMetrics,
    stop: CancellationToken,
) {
    let mut failures: u32 = 0;
    loop {
        let kept = std::fs::metadata(control.dir.join(CERT_FILE))
            .and_then(|m| m.modified())
            .ok();
        let life = match Lifetime::of(&me.cert_pem, kept) {
            Ok(life) => life,
            Err(err) => {
                tracing::error!(
                    "{err:#}; not renewing it: remove {} and enroll again with `mprov-control enroll-token`",
                    control.dir.display()
                );
                // Returning would stop the job server; its boot services go on.
                stop.cancelled().await;
                return;
            }
        };
        metrics.not_after.set(gauge(life.end));
        let now = unix_now();
        let near = near_expiry(life, now);
        metrics.near_expiry.set(i64::from(near));
        let due = renew_at(life);
        let pause = if failures > 0 {
            retry_pause(failures, life.end.saturating_sub(now))
        } else {
            Duration::from_secs(due.saturating_sub(now))
        };
        if !pause.is_zero() {
            tracing::debug!(seconds = pause.as_secs(), "next certificate renewal");
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
        let renewed = tokio::select! {
            () = stop.cancelled() => return,
            r = control.renew(&me) => r,
        };
        let result = renewed.and_then(|new| {
            let client = control.client(&new)?;
            Ok((new, client))
        });
        match result {
            Ok((new, client)) => {
                failures = 0;
                metrics.renewals.inc();
                let end = Lifetime::of(&new.cert_pem, None).map_or(0, |l| l.end);
                tracing::info!(
                    "renewed the job server certificate; the new one ends at {} (Unix {end})",
                    rfc3339(end)
                );
                me = new;
                clients.send_replace(client);
            }
            Err(err) => {
                failures = failures.saturating_add(1);
                metrics.renewal_failures.inc();
                let now = unix_now();
                let left = life.end.saturating_sub(now);
                if now >= life.end {
                    tracing::error!(
                        "the job server certificate has expired and renewal fails ({err:#}); boot services keep the last boot config. Enroll again: `mprov-control enroll-token`, then remove {} and restart with the token",
                        control.dir.display()
                    );
                } else if near_expiry(life, now) {
                    metrics.near_expiry.set(1);
                    tracing::warn!(
                        "the job server certificate ends in {left} s and renewal keeps failing ({err:#}); retrying"
                    );
                } else if failures == 1 {
                    tracing::warn!(
                        "cannot renew the job server certificate ({err:#}); {left} s left, retrying"
                    );
                } else {
                    tracing::debug!("renewal failed again: {err:#}");
                }
            }
        }
    }
}

/// `end` (Unix seconds) as an RFC 3339 UTC time.
fn rfc3339(end: u64) -> String {
    i64::try_from(end)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .map_or_else(|| end.to_string(), |t| t.to_string())
}

/// Writes through a temporary file renamed into place.
fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    mprov_process::write_atomic(path, bytes, mode)
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_due_with_a_third_left_and_warned_with_a_sixth() {
        let life = Lifetime {
            start: 1_000,
            end: 1_000 + 90 * 86_400,
        };
        assert_eq!(renew_at(life), 1_000 + 60 * 86_400);
        assert!(!near_expiry(life, 1_000 + 74 * 86_400));
        assert!(near_expiry(life, 1_000 + 76 * 86_400));
        assert!(near_expiry(life, life.end + 5));
        let short = Lifetime { start: 0, end: 120 };
        assert_eq!(renew_at(short), 80);
    }

    #[test]
    fn retries_double_within_bounds() {
        let day = 86_400;
        assert_eq!(retry_pause(1, 30 * day), Duration::from_secs(5));
        assert_eq!(retry_pause(2, 30 * day), Duration::from_secs(10));
        assert_eq!(retry_pause(40, 30 * day), Duration::from_secs(3600));
        // A short certificate: at most an eighth of what is left, at least 5 s.
        assert_eq!(retry_pause(10, 80), Duration::from_secs(10));
        assert_eq!(retry_pause(10, 0), Duration::from_secs(5));
    }

    #[test]
    fn lifetime_counts_from_when_it_was_kept() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["js1".to_owned()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2030, 1, 1);
        params.not_after = rcgen::date_time_ymd(2030, 1, 11);
        let pem = params.self_signed(&key).unwrap().pem();
        let nb = 1_893_456_000; // 2030-01-01
        let life = Lifetime::of(&pem, None).unwrap();
        assert_eq!(
            life,
            Lifetime {
                start: nb,
                end: nb + 10 * 86_400
            }
        );
        let kept = UNIX_EPOCH + Duration::from_secs(nb + 86_400);
        assert_eq!(Lifetime::of(&pem, Some(kept)).unwrap().start, nb + 86_400);
        assert!(Lifetime::of("not a certificate", None).is_err());
        assert_eq!(rfc3339(nb), "2030-01-01T00:00:00Z");
    }
}
