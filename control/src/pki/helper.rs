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
//! the supervisor itself is gone, [`SignerClient::lost`](super::client::SignerClient::lost) fires and `serve`
//! exits, so that systemd starts the whole service again. Requests carry an
//! id, so an answer a new worker gives to a request sent before the restart
//! is never taken for the answer to a later one; a refusal keeps the id even
//! of a line that is not a valid request or is longer than the helper reads
//! ([`request_id`]), so no request waits for an
//! answer that was given.
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

use super::BACKDATE;
use super::ca::{self, TlsError};
use super::protocol::{
    Answer, Down, DownInfo, MIN_SECONDS, Profile, Ready, ReadyInfo, Refusal, SignReply,
    SignRequest, SignerError, identity_uri, request_id,
};

/// Longest request line read from the web service.
const MAX_REQUEST: u64 = super::protocol::MAX_REQUEST as u64;

/// The CA, loaded once by the helper.
#[derive(Debug)]
pub struct Signer {
    issuer: Issuer<'static, KeyPair>,
    pub(super) ca_pem: String,
}

impl Signer {
    /// Makes the CA in `tls_dir` if it has none, and loads its key.
    pub fn open(tls_dir: &Path, hostname: &str) -> Result<Signer, TlsError> {
        ca::ensure_dir(tls_dir)?;
        let (ca_pem, _) = ca::ensure_ca(tls_dir, hostname)?;
        let key_path = tls_dir.join(ca::CA_KEY);
        let key_pem = ca::read_private(&key_path, true)?;
        let key = KeyPair::from_pem(&key_pem).map_err(|err| TlsError::Cert {
            what: format!("{} is not a usable key", key_path.display()),
            err,
        })?;
        let der = CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(|_| TlsError::Pem {
            what: "certificate",
            path: tls_dir.join(ca::CA_CERT),
        })?;
        let issuer = Issuer::from_ca_cert_der(&der, key).map_err(|err| TlsError::Cert {
            what: "cannot read the CA certificate".into(),
            err,
        })?;
        Ok(Signer { issuer, ca_pem })
    }

    /// Checks `req` against its profile and signs it.
    pub fn sign_csr(&self, req: &SignRequest) -> Result<SignReply, Refusal> {
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
        let serial = ca::serial().map_err(|e| Refusal::Signing(e.to_string()))?;
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
        let id = parsed.as_ref().map_or_else(|_| request_id(line), |r| r.id);
        let result = parsed
            .map_err(|e| Refusal::Malformed(e.to_string()))
            .and_then(|req| {
                self.sign_csr(&req).inspect_err(|why| {
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
                id: request_id(&line),
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
            .map_err(|err| SignerError::StartIo {
                what: "running the signing worker",
                err,
            })?;
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
        match s.sign_csr(req) {
            Err(why) => why.to_string(),
            Ok(reply) => panic!("signed what must be refused: {reply:?}"),
        }
    }

    #[test]
    fn a_node_certificate_names_one_node_for_client_auth_only() {
        use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};
        let (_dir, s) = signer();
        let reply = s.sign_csr(&node("c01", csr(blank()), 30)).unwrap();
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
        assert!(s.sign_csr(&node("c01", csr(own), 1)).is_ok());
    }

    #[test]
    fn validity_in_seconds_is_honoured_within_bounds() {
        use x509_parser::prelude::{FromDer as _, X509Certificate};
        let (_dir, s) = signer();
        let mut req = node("js1", csr(blank()), 1);
        req.profile = Profile::Jobserver;
        req.seconds = Some(300);
        let SignReply::Signed { cert_pem, .. } = s.sign_csr(&req).unwrap() else {
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
        // Refusals keep the request's id, even of a line too long to read.
        let mut long = node("c01", "x".repeat(70_000), 7);
        long.id = 9;
        let long = serde_json::to_string(&long).unwrap();
        let input = format!(
            "{good}\nnot json\n{huge}\n{{\"id\":8,\"profile\":\"nothing\"}}\n{long}\n{good}\n"
        );
        let mut out = Vec::new();
        serve(&s, input.as_bytes(), &mut out).unwrap();
        let answers: Vec<Answer> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Answer>(l).unwrap())
            .collect();
        let ids: Vec<u64> = answers.iter().map(|a| a.id).collect();
        assert_eq!(ids, [0, 0, 0, 8, 9, 0]);
        let replies: Vec<SignReply> = answers.into_iter().map(|a| a.reply).collect();
        assert!(matches!(replies[0], SignReply::Signed { .. }));
        assert!(
            matches!(&replies[1], SignReply::Refused { reason } if reason.contains("not understood"))
        );
        assert!(
            matches!(&replies[2], SignReply::Refused { reason } if reason.contains("longer than"))
        );
        assert!(
            matches!(&replies[3], SignReply::Refused { reason } if reason.contains("not understood"))
        );
        assert!(
            matches!(&replies[4], SignReply::Refused { reason } if reason.contains("longer than"))
        );
        assert!(matches!(replies[5], SignReply::Signed { .. }));
    }
}
