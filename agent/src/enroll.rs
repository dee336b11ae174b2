//! Step 2 and what follows it: the control service's CA checked against
//! `mprov_ca`, the node's own key pair and CSR (rcgen; the key never leaves
//! the node), enrollment with the one-time nonce, then mTLS only: the boot
//! manifest and the boot events. After `switch_root`, `mprov-agent ready`
//! reads the identity back from the new root.
//!
//! What the agent writes into the new root (step 4), and nothing else
//! secret: [`KEY_FILE`] (0600), [`CERT_FILE`], [`CA_FILE`] and
//! [`CONTROL_URL_FILE`], all under `/etc/mprov/`.

use std::path::Path;
use std::time::Duration;

use mprov_api::boot::{
    BatchOutcome, BootEventReport, BootPhase, EVENTS_BATCH_PATH, EVENTS_PATH, MANIFEST_PATH,
};
use mprov_api::enroll::{Enrolled, NODE_PATH, NodeEnrollment};
use sha2::{Digest, Sha256};

use crate::http::{self, Client, ClientError};
use crate::manifest::{self, Checked};

/// The node's private key in the booted root (mode 0600).
pub const KEY_FILE: &str = "etc/mprov/node.key";
/// The node's certificate in the booted root.
pub const CERT_FILE: &str = "etc/mprov/node.crt";
/// The control service's CA certificate in the booted root.
pub const CA_FILE: &str = "etc/mprov/ca.crt";
/// The control service's URL in the booted root (one line).
pub const CONTROL_URL_FILE: &str = "etc/mprov/control-url";

/// How long a request to the control service may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The node's credentials.
#[derive(Clone)]
pub struct Identity {
    /// The private key, PEM.
    pub key_pem: String,
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The CA certificate, PEM.
    pub ca_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("key_pem", &"(secret)")
            .finish_non_exhaustive()
    }
}

/// Why a step with the control service failed; each says what to check.
#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    /// The CA certificate does not hash to `mprov_ca`.
    #[error(
        "the control service's CA certificate has sha256 {got}, the kernel command line pins {want}: someone else answered at {url}, or the CA changed since the boot script was made"
    )]
    CaMismatch {
        /// The URL asked.
        url: String,
        /// What it hashed to.
        got: String,
        /// The pin.
        want: String,
    },
    /// The CA certificate is not a PEM certificate.
    #[error("{url}/ca.crt is not a PEM certificate")]
    CaNotPem {
        /// The URL asked.
        url: String,
    },
    /// The HTTP client could not be made.
    #[error("{what} at {url}")]
    Client {
        /// What was being done.
        what: &'static str,
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        err: ClientError,
    },
    /// A request failed.
    #[error("{what} at {url}")]
    Http {
        /// What was being done.
        what: &'static str,
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        err: reqwest::Error,
    },
    /// The control service answered something this agent cannot read (a
    /// control service of another version).
    #[error("{what} at {url}: the answer is not what this agent expects")]
    Answer {
        /// What was being done.
        what: &'static str,
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        err: serde_json::Error,
    },
    /// The control service refused.
    #[error("{what} at {url}: HTTP {status}: {body}")]
    Refused {
        /// What was being done.
        what: &'static str,
        /// The URL.
        url: String,
        /// The status.
        status: u16,
        /// The start of its body (the API's error message).
        body: String,
    },
    /// The key pair or the CSR could not be made.
    #[error("making the node's key pair and CSR")]
    Key(#[source] rcgen::Error),
    /// The manifest was refused.
    #[error(transparent)]
    Manifest(#[from] manifest::ManifestError),
    /// Writing or reading the identity in a root failed.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: String,
        /// The cause.
        #[source]
        err: std::io::Error,
    },
}

fn base(url: &str) -> &str {
    url.trim_end_matches('/')
}

fn builder() -> reqwest::ClientBuilder {
    http::builder().timeout(TIMEOUT)
}

/// The DER of the first certificate in `pem`.
fn pem_der(pem: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let start = pem.find("-----BEGIN CERTIFICATE-----")? + "-----BEGIN CERTIFICATE-----".len();
    let end = start + pem[start..].find("-----END CERTIFICATE-----")?;
    let b64: String = pem[start..end]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(b64).ok()
}

/// `GET <url>/ca.crt` and checks its sha256 (of the DER, as `mprov_ca`
/// carries it). The transport is not trusted for this request (there is
/// nothing to trust it with yet); the pin is what counts. The PEM.
pub fn fetch_ca(url: &str, pin: &[u8; 32]) -> Result<String, EnrollError> {
    let ca_url = format!("{}/ca.crt", base(url));
    let http = |err| EnrollError::Http {
        what: "fetching the CA certificate",
        url: ca_url.clone(),
        err,
    };
    let client = Client::new(builder().danger_accept_invalid_certs(true)).map_err(|err| {
        EnrollError::Client {
            what: "fetching the CA certificate",
            url: ca_url.clone(),
            err,
        }
    })?;
    let response = client.send(client.get(&ca_url)).map_err(http)?;
    let status = response.status().as_u16();
    let pem = client.wait(response.text()).map_err(http)?;
    if status != 200 {
        return Err(EnrollError::Refused {
            what: "fetching the CA certificate",
            url: ca_url,
            status,
            body: pem.chars().take(200).collect(),
        });
    }
    let der = pem_der(&pem).ok_or_else(|| EnrollError::CaNotPem {
        url: base(url).to_owned(),
    })?;
    let got: [u8; 32] = Sha256::digest(&der).into();
    if &got != pin {
        return Err(EnrollError::CaMismatch {
            url: base(url).to_owned(),
            got: hex::encode(got),
            want: hex::encode(pin),
        });
    }
    Ok(pem)
}

/// Makes the node's key pair and enrolls with `nonce` at `url`, trusting
/// only `ca_pem`.
pub fn enroll(url: &str, ca_pem: &str, nonce: &str) -> Result<Identity, EnrollError> {
    let (key_pem, csr) = key_and_csr()?;
    let enroll_url = format!("{}{NODE_PATH}", base(url));
    let http = |err| EnrollError::Http {
        what: "enrolling",
        url: enroll_url.clone(),
        err,
    };
    let client = trusting(ca_pem, None).map_err(|err| EnrollError::Client {
        what: "enrolling",
        url: enroll_url.clone(),
        err,
    })?;
    let request = client.post(&enroll_url).json(&NodeEnrollment {
        nonce: nonce.to_owned(),
        csr,
    });
    let response = client.send(request).map_err(http)?;
    let enrolled: Enrolled = json_reply(&client, response, "enrolling", &enroll_url)?;
    Ok(Identity {
        key_pem,
        cert_pem: enrolled.certificate,
        ca_pem: ca_pem.to_owned(),
    })
}

/// `POST path` with `body` as JSON, authenticated by a one-time `nonce` in
/// the `header` and trusting only `ca_pem` (the NADS discovery report of
/// an unknown node, which has no certificate): the reply's body on any
/// `2xx`.
pub fn post_with_nonce<B: serde::Serialize>(
    url: &str,
    ca_pem: &str,
    path: &str,
    header: &str,
    nonce: &crate::cmdline::Nonce,
    body: &B,
) -> Result<Vec<u8>, EnrollError> {
    let what = "reporting with the discovery nonce";
    let client = trusting(ca_pem, None).map_err(|err| EnrollError::Client {
        what,
        url: base(url).to_owned(),
        err,
    })?;
    let control = Control {
        client,
        url: base(url).to_owned(),
    };
    let target = format!("{}{path}", control.url);
    let request = control
        .client
        .post(&target)
        .header(header, nonce.expose_secret())
        .json(body);
    control.exchange(request, target, what, |status| (200..300).contains(&status))
}

/// A new key pair (PEM) and a CSR for it (PEM), as enrollment and renewal
/// send it.
pub fn key_and_csr() -> Result<(String, String), EnrollError> {
    let key = rcgen::KeyPair::generate().map_err(EnrollError::Key)?;
    let mut params =
        rcgen::CertificateParams::new(Vec::<String>::new()).map_err(EnrollError::Key)?;
    // An empty subject: the control service names the certificate after
    // the system the nonce (or the current certificate) belongs to (the
    // agent does not know its host name at enrollment), and refuses a CSR
    // that asks for any other name.
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params
        .serialize_request(&key)
        .and_then(|csr| csr.pem())
        .map_err(EnrollError::Key)?;
    Ok((key.serialize_pem(), csr))
}

/// A client that trusts only `ca_pem`, with `identity` as its client
/// certificate if given.
fn trusting(ca_pem: &str, identity: Option<&Identity>) -> Result<Client, ClientError> {
    let certs = reqwest::Certificate::from_pem_bundle(ca_pem.as_bytes())?;
    let mut builder = builder().tls_certs_only(certs);
    if let Some(identity) = identity {
        let pem = format!("{}\n{}", identity.key_pem, identity.cert_pem);
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes())?);
    }
    Client::new(builder)
}

/// The JSON of a `200` or `201` reply; any other status is
/// [`EnrollError::Refused`] with the start of the body.
fn json_reply<T: serde::de::DeserializeOwned>(
    client: &Client,
    response: reqwest::Response,
    what: &'static str,
    url: &str,
) -> Result<T, EnrollError> {
    let status = response.status().as_u16();
    let http = |err| EnrollError::Http {
        what,
        url: url.to_owned(),
        err,
    };
    if status != 200 && status != 201 {
        let body = client.wait(response.text()).map_err(http)?;
        return Err(EnrollError::Refused {
            what,
            url: url.to_owned(),
            status,
            body: body.chars().take(300).collect(),
        });
    }
    client.wait(response.json()).map_err(http)
}

/// Tries per boot event ([`Control::report`]): about 25 s of pauses in
/// all, longer than a restart of the control service takes.
pub const REPORT_TRIES: u32 = 6;

/// The pause after the `attempt`-th failed try of a boot event: 0.5 s
/// doubling each time, plus up to half again from `random`, so nodes that
/// failed together do not come back together.
pub fn report_pause(attempt: u32, random: u32) -> Duration {
    let base = Duration::from_millis(500) * (1 << attempt.clamp(1, 6).saturating_sub(1));
    base + base.mul_f64(f64::from(random % 1000) / 2000.0)
}

/// Whether a failed exchange may succeed if tried again.
fn transient(err: &EnrollError) -> bool {
    match err {
        EnrollError::Http { .. } => true,
        EnrollError::Refused { status, .. } => *status >= 500 || *status == 429,
        _ => false,
    }
}

/// The node's mTLS session with the control service.
#[derive(Debug, Clone)]
pub struct Control {
    client: Client,
    url: String,
}

impl Control {
    /// A session at `url` as `identity`.
    pub fn new(url: &str, identity: &Identity) -> Result<Control, EnrollError> {
        let client =
            trusting(&identity.ca_pem, Some(identity)).map_err(|err| EnrollError::Client {
                what: "setting up mTLS",
                url: url.to_owned(),
                err,
            })?;
        Ok(Control {
            client,
            url: base(url).to_owned(),
        })
    }

    /// `GET MANIFEST_PATH`, checked.
    pub fn manifest(&self) -> Result<Checked, EnrollError> {
        let body = self.get_bytes(MANIFEST_PATH, "reading the boot manifest")?;
        Ok(manifest::parse(&body)?)
    }

    /// `GET path`: the body of a `200`.
    pub fn get_bytes(&self, path: &str, what: &'static str) -> Result<Vec<u8>, EnrollError> {
        let url = format!("{}{path}", self.url);
        let request = self.client.get(&url);
        self.exchange(request, url, what, |status| status == 200)
    }

    /// `POST path` with `body` as JSON: the reply's body on any `2xx`.
    pub fn post_json<B: serde::Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
        what: &'static str,
    ) -> Result<Vec<u8>, EnrollError> {
        let url = format!("{}{path}", self.url);
        let request = self.client.post(&url).json(body);
        self.exchange(request, url, what, |status| (200..300).contains(&status))
    }

    /// `POST EVENTS_PATH`: one step of this node's boot. A failure that
    /// may pass (no connection, a `5xx`, a `429`: the control service
    /// restarting or busy) is tried again, [`REPORT_TRIES`] times in all,
    /// after a growing, jittered pause ([`report_pause`]), so a restart of
    /// the control service loses no event of a booting node; a refusal is
    /// not.
    pub fn report(&self, phase: BootPhase, detail: &str) -> Result<(), EnrollError> {
        let report = BootEventReport {
            phase,
            mac: None,
            system: None,
            ip: None,
            detail: detail.to_owned(),
        };
        self.retried(|| self.post_json(EVENTS_PATH, &report, "reporting a boot event"))
            .map(drop)
    }

    /// `POST EVENTS_BATCH_PATH`: many steps of this node's boot at once
    /// (at most [`MAX_BATCH`](mprov_api::boot::MAX_BATCH)), tried again as [`Self::report`] is: what
    /// was stored, and which were refused and why.
    pub fn report_all(&self, reports: &[BootEventReport]) -> Result<BatchOutcome, EnrollError> {
        const WHAT: &str = "reporting boot events";
        let body = self.retried(|| self.post_json(EVENTS_BATCH_PATH, reports, WHAT))?;
        serde_json::from_slice(&body).map_err(|err| EnrollError::Answer {
            what: WHAT,
            url: format!("{}{EVENTS_BATCH_PATH}", self.url),
            err,
        })
    }

    /// `send`, tried again while it fails in a way that may pass (no
    /// connection, a `5xx`, a `429`): [`REPORT_TRIES`] times in all, after
    /// a growing, jittered pause ([`report_pause`]).
    fn retried<T>(
        &self,
        mut send: impl FnMut() -> Result<T, EnrollError>,
    ) -> Result<T, EnrollError> {
        let mut attempt = 1;
        loop {
            match send() {
                Err(err) if attempt < REPORT_TRIES && transient(&err) => {
                    std::thread::sleep(report_pause(attempt, getrandom::u32().unwrap_or(0)));
                    attempt += 1;
                }
                done => return done,
            }
        }
    }

    /// Sends `request` (to `url`) with the version header: the reply's body
    /// when `ok` accepts its status, else the refusal with the body's start.
    fn exchange(
        &self,
        request: reqwest::RequestBuilder,
        url: String,
        what: &'static str,
        ok: fn(u16) -> bool,
    ) -> Result<Vec<u8>, EnrollError> {
        let http = |err| EnrollError::Http {
            what,
            url: url.clone(),
            err,
        };
        let request = request.header(mprov_api::VERSION_HEADER, mprov_api::api_version());
        let response = self.client.send(request).map_err(http)?;
        let status = response.status().as_u16();
        let body = self.client.wait(response.bytes()).map_err(http)?;
        if !ok(status) {
            return Err(EnrollError::Refused {
                what,
                url,
                status,
                body: String::from_utf8_lossy(&body).chars().take(300).collect(),
            });
        }
        Ok(body.to_vec())
    }
}

/// Step 4: the identity and the control URL into the new root (the key
/// 0600, created so; the folder 0700).
pub fn write_identity(root: &Path, identity: &Identity, url: &str) -> Result<(), EnrollError> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let io = |what: &'static str, path: &Path| {
        let path = path.display().to_string();
        move |err| EnrollError::Io { what, path, err }
    };
    let dir = root.join("etc/mprov");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io("creating", &dir))?;
    for (file, contents, mode) in [
        (KEY_FILE, identity.key_pem.as_str(), 0o600),
        (CERT_FILE, identity.cert_pem.as_str(), 0o644),
        (CA_FILE, identity.ca_pem.as_str(), 0o644),
        (CONTROL_URL_FILE, url, 0o644),
    ] {
        let path = root.join(file);
        let _ = std::fs::remove_file(&path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .and_then(|mut f| {
                f.write_all(contents.trim_end().as_bytes())
                    .and_then(|()| f.write_all(b"\n"))
            })
            .map_err(io("writing", &path))?;
    }
    Ok(())
}

/// The identity and control URL [`write_identity`] left in `root`.
pub fn read_identity(root: &Path) -> Result<(Identity, String), EnrollError> {
    let read = |file: &str| {
        let path = root.join(file);
        std::fs::read_to_string(&path).map_err(|err| EnrollError::Io {
            what: "reading",
            path: path.display().to_string(),
            err,
        })
    };
    Ok((
        Identity {
            key_pem: read(KEY_FILE)?,
            cert_pem: read(CERT_FILE)?,
            ca_pem: read(CA_FILE)?,
        },
        read(CONTROL_URL_FILE)?.trim().to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn the_identity_round_trips_with_the_key_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let identity = Identity {
            key_pem: "KEY".to_owned(),
            cert_pem: "CERT".to_owned(),
            ca_pem: "CA".to_owned(),
        };
        write_identity(dir.path(), &identity, "https://ctl:8443").expect("writes");
        let mode = |f: &str| {
            std::fs::metadata(dir.path().join(f))
                .expect("exists")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(KEY_FILE), 0o600);
        assert_eq!(mode("etc/mprov"), 0o700);
        let (back, url) = read_identity(dir.path()).expect("reads");
        assert_eq!(back.key_pem.trim(), "KEY");
        assert_eq!(back.cert_pem.trim(), "CERT");
        assert_eq!(url, "https://ctl:8443");
        assert!(!format!("{back:?}").contains("KEY"));
        // Written again (a second boot into the same staging), still 0600.
        write_identity(dir.path(), &identity, "https://ctl:8443").expect("writes again");
        assert_eq!(mode(KEY_FILE), 0o600);
    }

    #[test]
    fn pem_to_der() {
        let pem = "-----BEGIN CERTIFICATE-----\nAAEC\nAw==\n-----END CERTIFICATE-----\n";
        assert_eq!(pem_der(pem), Some(vec![0, 1, 2, 3]));
        assert_eq!(pem_der("junk"), None);
    }

    #[test]
    fn a_boot_event_is_retried_only_when_it_may_pass_and_for_a_bounded_time() {
        let refused = |status| EnrollError::Refused {
            what: "reporting a boot event",
            url: "https://ctl/api/v1/boot/events".to_owned(),
            status,
            body: String::new(),
        };
        assert!(transient(&refused(503)));
        assert!(transient(&refused(429)));
        assert!(!transient(&refused(403)));
        assert!(!transient(&refused(400)));
        // The pauses grow, differ by node, and all the tries together end
        // within a minute whatever the random draws.
        assert!(report_pause(2, 0) > report_pause(1, 999));
        assert_ne!(report_pause(3, 0), report_pause(3, 999));
        let longest: Duration = (1..REPORT_TRIES).map(|a| report_pause(a, 999)).sum();
        let shortest: Duration = (1..REPORT_TRIES).map(|a| report_pause(a, 0)).sum();
        assert!(shortest >= Duration::from_secs(15), "{shortest:?}");
        assert!(longest <= Duration::from_secs(60), "{longest:?}");
    }
}
