//! Passkeys: WebAuthn credentials as a second way for a user to sign in to
//! the admin pages, registered from a session the user already has
//! (W3C Web Authentication Level 3, the relying party's side: §7.1
//! "Registering a New Credential" and §7.2 "Verifying an Authentication
//! Assertion"; COSE keys per RFC 9052/9053).
//!
//! **Why a verifier of our own.** ring is the workspace's one crypto
//! provider. `webauthn-rs` needs OpenSSL; `webauthn_rp`, pure Rust, brings
//! a second signature stack (the RustCrypto `p256`, `p384`,
//! `ed25519-dalek` and `rsa` crates, with `rand`) and its own model of the
//! server's state; no well-kept crate verifies with ring alone. What an RP
//! that does not judge attestations must check is short (the steps below),
//! so it is written here on ring for the signatures and `ciborium` for CBOR.
//! Algorithms: ES256 (ECDSA P-256 with SHA-256, what nearly every
//! authenticator makes), EdDSA (Ed25519) and RS256 (RSA PKCS#1 v1.5 with
//! SHA-256, 2048 bits or more: Windows Hello), each a ring verifier.
//!
//! **Attestation.** We ask for none and do not judge authenticators: fmt
//! `none` is taken (its statement must be empty); `packed` self-attestation
//! (no certificate) has its signature checked with the new credential's own
//! key, which proves nothing about the maker but refuses a corrupt response;
//! `packed` with a certificate chain is taken as if it were `none` (§7.1
//! lets an RP that asked for none do so); any other format is refused.
//!
//! **The rules**, in the order they are applied:
//!
//! * The site ([`Site`]) is the host name the page was served under, which
//!   must be one the service answers to ([`Config::host_allowed`]) and a
//!   name, not an address (browsers refuse an address as RP id). Its RP id
//!   is that name; its origin is exactly `https://host[:port]` or
//!   `http://host[:port]`, the scheme's default port left out as browsers
//!   do.
//! * A challenge is 32 random bytes, good for [`CHALLENGE_TTL`] and for one
//!   ceremony (`create` or `get`); a registration's is also bound to the
//!   user it was made for. It is spent before anything else of the response
//!   is checked, so a response that fails still spends it.
//! * Challenges live in the database (`passkey_challenges`), not in memory:
//!   a restart or a second control process behind the same name finds them,
//!   and spending one is a conditional `UPDATE`, so two requests cannot both
//!   spend it. A spent one is kept until it expires, so a replay is told
//!   apart from an unknown challenge. Expired rows are deleted whenever a
//!   challenge is made, and at most [`MAX_PENDING`] rows exist: sign-in
//!   options are asked for before anyone is signed in.
//! * clientDataJSON: `type` is the ceremony's, `challenge` is ours and
//!   unspent, `origin` equals the site's exactly, `crossOrigin` is not true.
//! * authenticatorData: the RP id hash is SHA-256 of the site's RP id; the
//!   user was present (UP) and verified (UV: a passkey replaces the
//!   password, so it must be two factors itself, the device and its PIN or
//!   biometric).
//! * Registration: the attested credential's id (at most 1,023 bytes) is
//!   the response's and is not registered yet (to anyone), and its key is of
//!   a supported algorithm.
//! * Sign-in: the credential is registered, the user handle, if the
//!   authenticator returned one, is its user's, the signature over
//!   `authenticatorData || SHA-256(clientDataJSON)` verifies with the stored
//!   key, and the signature counter increases unless it is zero both stored
//!   and now (authenticators that keep no counter send zero).
//! * The user handle is SHA-256 of a fixed label and the user name: stable
//!   per name, so a device keeps one passkey per user and site, and no
//!   table is needed for it. A passkey belongs to a user row (deleted with
//!   it), so a user made again under the same name does not inherit them.
//! * Whether the signed-in user is an admin comes from the `users` row at
//!   sign-in, never from the passkey.
//!
//! The parsers ([`parse_client_data`], [`parse_attestation_object`],
//! [`parse_authenticator_data`], [`CoseKey::parse`]) are pure and fuzzed
//! (`fuzz::passkey_responses`); the functions that touch the database wrap
//! them.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use ciborium::Value;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::config::Config;
use crate::db::{self, Db, Val};
use crate::secrets;
use crate::time::{format_ts, now};

/// How long a challenge may be answered.
pub const CHALLENGE_TTL: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// How many challenges may exist at once (spent or not, until they
/// expire): ten thousand in five minutes is over thirty sign-in starts a
/// second, far past what people do, and the table stays small.
pub const MAX_PENDING: i64 = 10_000;

/// Passkey sign-ins one client address may start a minute: a person
/// starts a few; a flood from one address holds at most this many times
/// five of the [`MAX_PENDING`] challenges, so it cannot lock out the rest.
pub const SIGN_IN_STARTS_PER_MINUTE: u32 = 20;

/// The longest credential id an authenticator may make (§5.8.3).
pub const MAX_CREDENTIAL_ID: usize = 1023;

/// The longest name a user may give a passkey, in characters.
pub const MAX_NAME: usize = 100;

/// The COSE algorithm ids we verify (RFC 9053; RS256 from RFC 8812), in
/// the order of preference offered to the authenticator.
pub const ALGORITHMS: [i64; 3] = [ES256, EDDSA, RS256];

/// ECDSA with P-256 and SHA-256.
pub const ES256: i64 = -7;
/// EdDSA (Ed25519 here).
pub const EDDSA: i64 = -8;
/// RSASSA-PKCS1-v1_5 with SHA-256.
pub const RS256: i64 = -257;

/// Flag bits of authenticatorData (§6.1).
const FLAG_UP: u8 = 0x01;
const FLAG_UV: u8 = 0x04;
const FLAG_AT: u8 = 0x40;
const FLAG_ED: u8 = 0x80;

/// The label hashed with a user name into its user handle.
const USER_HANDLE_LABEL: &[u8] = b"mProv passkey user handle\0";

/// base64url as WebAuthn's JSON forms use it: no padding written, padding
/// accepted when read.
const B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a passkey operation was refused. Each variant is one fact about the
/// request or the stored state; the handlers choose the status.
#[derive(Debug, thiserror::Error)]
pub enum PasskeyError {
    /// The credential's key is of an algorithm we do not verify.
    #[error("the passkey's algorithm {0} is not supported (ES256, EdDSA or RS256)")]
    AlgorithmUnsupported(i64),
    /// The attestation statement's format is neither `none` nor `packed`.
    #[error("attestation format {0:?} is not accepted (none or packed)")]
    AttestationFormat(String),
    /// The attestation object is not the CBOR map WebAuthn defines.
    #[error("malformed attestation object: {0}")]
    AttestationMalformed(&'static str),
    /// A packed self-attestation's signature does not verify with the
    /// credential's key.
    #[error("the packed self-attestation's signature does not verify")]
    AttestationSignature,
    /// authenticatorData is not what §6.1 defines.
    #[error("malformed authenticator data: {0}")]
    AuthenticatorDataMalformed(&'static str),
    /// A field that must be base64url is not.
    #[error("{0} is not base64url")]
    Base64(&'static str),
    /// The challenge expired before it was answered.
    #[error("the challenge expired")]
    ChallengeExpired,
    /// The challenge was made for the other ceremony (a sign-in's used to
    /// register, or the reverse).
    #[error("the challenge was made for another ceremony")]
    ChallengeOtherCeremony,
    /// The registration challenge was made for another user.
    #[error("the challenge was made for another user")]
    ChallengeOtherUser,
    /// No challenge of ours has this value (never made, or expired and
    /// deleted).
    #[error("the challenge is unknown")]
    ChallengeUnknown,
    /// The challenge was already answered once (a replay).
    #[error("the challenge was already used")]
    ChallengeUsed,
    /// clientDataJSON is not the JSON object §5.8.1 defines.
    #[error("malformed client data: {0}")]
    ClientDataMalformed(String),
    /// The COSE key is not one we can read.
    #[error("malformed COSE key: {0}")]
    CoseKeyMalformed(&'static str),
    /// The signature counter did not increase (a cloned authenticator, or a
    /// replayed assertion).
    #[error("the signature counter went from {stored} to {got}")]
    CounterNotIncreased {
        /// The counter stored at the last sign-in.
        stored: u32,
        /// The counter in this assertion.
        got: u32,
    },
    /// The credential id in the response is not the one in the
    /// authenticator's data.
    #[error("the credential id does not match the authenticator data")]
    CredentialIdMismatch,
    /// A passkey with this credential id is registered already.
    #[error("this passkey is registered already")]
    CredentialRegistered,
    /// No passkey has this credential id (never registered, deleted, or its
    /// user deleted).
    #[error("no passkey has this credential id")]
    CredentialUnknown,
    /// The client data says the ceremony ran in a cross-origin frame.
    #[error("the ceremony ran in a cross-origin frame")]
    CrossOrigin,
    /// The database failed.
    #[error("database error")]
    Db(#[from] sqlx::Error),
    /// The page was served under an address, not a name: no RP id.
    #[error("passkeys need a host name, not the address {0}")]
    HostIsAddress(String),
    /// The page was served under a host name the service does not answer to.
    #[error("host {0:?} is not one this service answers to")]
    HostNotAllowed(String),
    /// The name given to a passkey is empty or too long.
    #[error("a passkey's name has 1 to {MAX_NAME} characters")]
    NameInvalid,
    /// The client data's origin is not the site's.
    #[error("origin {got:?} is not {expected:?}")]
    OriginMismatch {
        /// The site's origin.
        expected: String,
        /// The client data's.
        got: String,
    },
    /// The user has no passkey with this id.
    #[error("no such passkey")]
    PasskeyNotFound,
    /// The authenticator data is for another RP id.
    #[error("the authenticator data is for another RP id")]
    RpIdMismatch,
    /// The assertion's signature does not verify with the stored key.
    #[error("the signature does not verify")]
    SignatureInvalid,
    /// Too many challenges are pending.
    #[error("too many passkey challenges are pending; try again in a few minutes")]
    TooManyPending,
    /// The clock is out of the range of time stamps.
    #[error("the clock is out of range")]
    TimeOutOfRange,
    /// The client data's type is not the ceremony's.
    #[error("client data type {got:?} is not {expected:?}")]
    TypeMismatch {
        /// The ceremony's type.
        expected: &'static str,
        /// The client data's.
        got: String,
    },
    /// The user handle the authenticator returned is not the credential's
    /// user's.
    #[error("the user handle is not the passkey owner's")]
    UserHandleMismatch,
    /// The authenticator says the user was not present.
    #[error("the user was not present")]
    UserNotPresent,
    /// The authenticator says the user was not verified.
    #[error("the user was not verified (no PIN or biometric)")]
    UserNotVerified,
    /// No user has this name.
    #[error("no user {0:?}")]
    UserUnknown(String),
}

/// The site a ceremony runs for: the RP id and the one origin accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    rp_id: String,
    origin: String,
}

impl Site {
    /// The site of a page served over `https` (or not) under `host` (the
    /// request's `Host`, `name[:port]`), if the service answers to it.
    pub fn new(config: &Config, https: bool, host: &str) -> Result<Site, PasskeyError> {
        let host = host.trim().to_ascii_lowercase();
        if host.is_empty() || !config.host_allowed(&host) {
            return Err(PasskeyError::HostNotAllowed(host));
        }
        Site::for_host(https, &host)
    }

    /// The site for `host`, without asking the configuration.
    fn for_host(https: bool, host: &str) -> Result<Site, PasskeyError> {
        if host.starts_with('[') {
            return Err(PasskeyError::HostIsAddress(host.to_owned()));
        }
        let (name, port) = match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        };
        let port = match port {
            Some(p) => Some(
                p.parse::<u16>()
                    .map_err(|_| PasskeyError::HostNotAllowed(host.to_owned()))?,
            ),
            None => None,
        };
        if name.parse::<std::net::IpAddr>().is_ok() {
            return Err(PasskeyError::HostIsAddress(name.to_owned()));
        }
        if name.is_empty() || name.ends_with('.') {
            return Err(PasskeyError::HostNotAllowed(host.to_owned()));
        }
        let (scheme, default) = if https { ("https", 443) } else { ("http", 80) };
        let origin = match port {
            Some(p) if p != default => format!("{scheme}://{name}:{p}"),
            _ => format!("{scheme}://{name}"),
        };
        Ok(Site {
            rp_id: name.to_owned(),
            origin,
        })
    }

    /// The RP id: the host name.
    pub fn rp_id(&self) -> &str {
        &self.rp_id
    }

    /// The one origin whose client data is accepted.
    pub fn origin(&self) -> &str {
        &self.origin
    }
}

/// `PublicKeyCredentialCreationOptionsJSON` (§5.4), for
/// `PublicKeyCredential.parseCreationOptionsFromJSON`: binary values are
/// base64url.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreationOptions {
    /// The challenge.
    pub challenge: String,
    /// The relying party.
    pub rp: RpEntity,
    /// The user.
    pub user: UserEntity,
    /// The algorithms we verify, preferred first.
    pub pub_key_cred_params: Vec<CredentialParameter>,
    /// How long the browser may wait, in milliseconds.
    pub timeout: u64,
    /// The user's passkeys already registered, so a device does not make a
    /// second one.
    pub exclude_credentials: Vec<CredentialDescriptor>,
    /// A discoverable credential (sign-in needs no user name) with user
    /// verification.
    pub authenticator_selection: AuthenticatorSelection,
    /// `none`: we do not judge authenticators.
    pub attestation: &'static str,
}

/// The relying party in [`CreationOptions`].
#[derive(Debug, Clone, Serialize)]
pub struct RpEntity {
    /// The RP id (the host name).
    pub id: String,
    /// What the authenticator shows.
    pub name: &'static str,
}

/// The user in [`CreationOptions`].
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserEntity {
    /// The user handle, base64url.
    pub id: String,
    /// The user name.
    pub name: String,
    /// The user name again (we keep no display name).
    pub display_name: String,
}

/// One algorithm in [`CreationOptions`].
#[derive(Debug, Clone, Serialize)]
pub struct CredentialParameter {
    /// Always `public-key`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The COSE algorithm id.
    pub alg: i64,
}

/// A credential named in options.
#[derive(Debug, Clone, Serialize)]
pub struct CredentialDescriptor {
    /// Always `public-key`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The credential id, base64url.
    pub id: String,
}

/// What the authenticator must be able to do.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticatorSelection {
    /// `required`.
    pub resident_key: &'static str,
    /// `true` (the Level 1 name of the same wish).
    pub require_resident_key: bool,
    /// `required`.
    pub user_verification: &'static str,
}

/// `PublicKeyCredentialRequestOptionsJSON` (§5.5), for
/// `PublicKeyCredential.parseRequestOptionsFromJSON`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestOptions {
    /// The challenge.
    pub challenge: String,
    /// The RP id (the host name).
    pub rp_id: String,
    /// How long the browser may wait, in milliseconds.
    pub timeout: u64,
    /// Empty: the authenticator offers its discoverable credentials for
    /// this site.
    pub allow_credentials: Vec<CredentialDescriptor>,
    /// `required`.
    pub user_verification: &'static str,
}

/// A registration's result as `PublicKeyCredential.toJSON()` gives it
/// (`RegistrationResponseJSON`, §5.1); other members are ignored.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationResponse {
    /// The credential id, base64url.
    pub id: String,
    /// The authenticator's response.
    pub response: AttestationResponse,
}

/// The `response` member of a [`RegistrationResponse`].
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttestationResponse {
    /// clientDataJSON, base64url.
    #[serde(rename = "clientDataJSON")]
    pub client_data_json: String,
    /// The attestation object, base64url.
    pub attestation_object: String,
}

/// A sign-in's result as `PublicKeyCredential.toJSON()` gives it
/// (`AuthenticationResponseJSON`, §5.1); other members are ignored.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticationResponse {
    /// The credential id, base64url.
    pub id: String,
    /// The authenticator's response.
    pub response: AssertionResponse,
}

/// The `response` member of an [`AuthenticationResponse`].
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssertionResponse {
    /// clientDataJSON, base64url.
    #[serde(rename = "clientDataJSON")]
    pub client_data_json: String,
    /// authenticatorData, base64url.
    pub authenticator_data: String,
    /// The signature, base64url.
    pub signature: String,
    /// The user handle, base64url, if the authenticator returned one.
    #[serde(default)]
    pub user_handle: Option<String>,
}

/// A registered passkey, as its owner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Passkey {
    /// Its row id.
    pub id: i64,
    /// The name its owner gave it.
    pub name: String,
    /// When it was registered (stored form).
    pub created_at: String,
    /// When it was last used to sign in.
    pub last_used_at: Option<String>,
}

/// Who signed in with a passkey, with the role their user row gives now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedIn {
    /// The user name.
    pub username: String,
    /// Whether the user may change things (`users.is_admin`).
    pub is_admin: bool,
}

/// The two ceremonies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ceremony {
    Create,
    Get,
}

impl Ceremony {
    /// Its name in the table.
    fn stored(self) -> &'static str {
        match self {
            Ceremony::Create => "create",
            Ceremony::Get => "get",
        }
    }

    /// clientDataJSON's `type` for it.
    fn client_type(self) -> &'static str {
        match self {
            Ceremony::Create => "webauthn.create",
            Ceremony::Get => "webauthn.get",
        }
    }
}

/// The members of clientDataJSON (§5.8.1) we check.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientData {
    /// `webauthn.create` or `webauthn.get`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The challenge, base64url.
    pub challenge: String,
    /// The page's origin.
    pub origin: String,
    /// Whether the ceremony ran in a cross-origin frame.
    #[serde(default)]
    pub cross_origin: Option<bool>,
}

/// A parsed attestation object (§6.5).
#[derive(Debug, Clone)]
pub struct AttestationObject {
    /// The statement's format.
    pub fmt: String,
    /// The statement, a CBOR map.
    pub statement: Vec<(Value, Value)>,
    /// authenticatorData, raw.
    pub auth_data: Vec<u8>,
}

/// Parsed authenticatorData (§6.1).
#[derive(Debug, Clone, PartialEq)]
pub struct AuthenticatorData {
    /// SHA-256 of the RP id.
    pub rp_id_hash: [u8; 32],
    /// The flags byte.
    pub flags: u8,
    /// The signature counter.
    pub sign_count: u32,
    /// The attested credential, present when the AT flag is.
    pub credential: Option<AttestedCredential>,
}

/// The attested credential data of a registration (§6.5.1).
#[derive(Debug, Clone, PartialEq)]
pub struct AttestedCredential {
    /// The authenticator's model id (zero under attestation `none`).
    pub aaguid: [u8; 16],
    /// The credential id.
    pub id: Vec<u8>,
    /// Its public key.
    pub key: CoseKey,
    /// The key as the authenticator encoded it, which we store.
    pub key_cbor: Vec<u8>,
}

/// A credential public key we can verify with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoseKey {
    /// ES256: the uncompressed point `04 || x || y`.
    Es256(Vec<u8>),
    /// EdDSA over Ed25519: the 32-byte public key.
    EdDsa(Vec<u8>),
    /// RS256: the modulus and exponent, big-endian.
    Rs256 {
        /// The modulus.
        n: Vec<u8>,
        /// The public exponent.
        e: Vec<u8>,
    },
}

/// The user handle of `username`: stable per name (see the module doc).
pub fn user_handle(username: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(USER_HANDLE_LABEL);
    h.update(username.as_bytes());
    h.finalize().into()
}

/// Parses clientDataJSON.
pub fn parse_client_data(bytes: &[u8]) -> Result<ClientData, PasskeyError> {
    serde_json::from_slice(bytes).map_err(|e| PasskeyError::ClientDataMalformed(e.to_string()))
}

/// Parses an attestation object: a CBOR map with `fmt` (text), `attStmt`
/// (a map) and `authData` (bytes), and nothing after it.
pub fn parse_attestation_object(bytes: &[u8]) -> Result<AttestationObject, PasskeyError> {
    let mut rest = bytes;
    let value: Value = ciborium::from_reader(&mut rest)
        .map_err(|_| PasskeyError::AttestationMalformed("not CBOR"))?;
    if !rest.is_empty() {
        return Err(PasskeyError::AttestationMalformed("bytes after the map"));
    }
    let Value::Map(entries) = value else {
        return Err(PasskeyError::AttestationMalformed("not a map"));
    };
    let (mut fmt, mut statement, mut auth_data) = (None, None, None);
    for (k, v) in entries {
        match (k.as_text(), v) {
            (Some("fmt"), Value::Text(t)) => fmt = Some(t),
            (Some("attStmt"), Value::Map(m)) => statement = Some(m),
            (Some("authData"), Value::Bytes(b)) => auth_data = Some(b),
            (Some("fmt" | "attStmt" | "authData"), _) => {
                return Err(PasskeyError::AttestationMalformed(
                    "a member of the wrong type",
                ));
            }
            _ => {}
        }
    }
    match (fmt, statement, auth_data) {
        (Some(fmt), Some(statement), Some(auth_data)) => Ok(AttestationObject {
            fmt,
            statement,
            auth_data,
        }),
        _ => Err(PasskeyError::AttestationMalformed(
            "fmt, attStmt or authData missing",
        )),
    }
}

/// Parses authenticatorData: the RP id hash, flags, counter, then the
/// attested credential data when AT is set and an extensions map when ED
/// is, and nothing after.
pub fn parse_authenticator_data(bytes: &[u8]) -> Result<AuthenticatorData, PasskeyError> {
    use PasskeyError::AuthenticatorDataMalformed as Bad;
    let (Some(rp_id_hash), Some(&flags), Some(count)) =
        (bytes.get(..32), bytes.get(32), bytes.get(33..37))
    else {
        return Err(Bad("shorter than 37 bytes"));
    };
    let rp_id_hash: [u8; 32] = rp_id_hash.try_into().map_err(|_| Bad("RP id hash"))?;
    let sign_count = u32::from_be_bytes(count.try_into().map_err(|_| Bad("counter"))?);
    let mut rest = &bytes[37..];
    let credential = if flags & FLAG_AT != 0 {
        let (Some(aaguid), Some(len)) = (rest.get(..16), rest.get(16..18)) else {
            return Err(Bad("attested credential data cut short"));
        };
        let aaguid: [u8; 16] = aaguid.try_into().map_err(|_| Bad("AAGUID"))?;
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        if len == 0 || len > MAX_CREDENTIAL_ID {
            return Err(Bad("credential id length out of range"));
        }
        let Some(id) = rest.get(18..18 + len) else {
            return Err(Bad("credential id cut short"));
        };
        let id = id.to_vec();
        rest = &rest[18 + len..];
        let before = rest;
        let key_value: Value =
            ciborium::from_reader(&mut rest).map_err(|_| Bad("credential public key not CBOR"))?;
        let key_cbor = before[..before.len() - rest.len()].to_vec();
        let key = CoseKey::from_value(&key_value)?;
        Some(AttestedCredential {
            aaguid,
            id,
            key,
            key_cbor,
        })
    } else {
        None
    };
    if flags & FLAG_ED != 0 {
        let ext: Value =
            ciborium::from_reader(&mut rest).map_err(|_| Bad("extensions not CBOR"))?;
        if !ext.is_map() {
            return Err(Bad("extensions not a map"));
        }
    }
    if !rest.is_empty() {
        return Err(Bad("bytes after the data its flags announce"));
    }
    Ok(AuthenticatorData {
        rp_id_hash,
        flags,
        sign_count,
        credential,
    })
}

impl CoseKey {
    /// Parses a COSE_Key (RFC 9052 §7) of a supported algorithm, and
    /// nothing after it.
    pub fn parse(bytes: &[u8]) -> Result<CoseKey, PasskeyError> {
        let mut rest = bytes;
        let value: Value = ciborium::from_reader(&mut rest)
            .map_err(|_| PasskeyError::CoseKeyMalformed("not CBOR"))?;
        if !rest.is_empty() {
            return Err(PasskeyError::CoseKeyMalformed("bytes after the key"));
        }
        CoseKey::from_value(&value)
    }

    /// Reads a COSE_Key map: kty (1), alg (3) and the curve or RSA
    /// parameters (negative labels).
    fn from_value(value: &Value) -> Result<CoseKey, PasskeyError> {
        use PasskeyError::CoseKeyMalformed as Bad;
        let Value::Map(entries) = value else {
            return Err(Bad("not a map"));
        };
        let label = |l: i64| {
            entries.iter().find_map(|(k, v)| match k {
                Value::Integer(i) if i128::from(*i) == i128::from(l) => Some(v),
                _ => None,
            })
        };
        let int = |l: i64| -> Option<i64> {
            match label(l)? {
                Value::Integer(i) => i64::try_from(*i).ok(),
                _ => None,
            }
        };
        let bytes = |l: i64| -> Option<&Vec<u8>> {
            match label(l)? {
                Value::Bytes(b) => Some(b),
                _ => None,
            }
        };
        let kty = int(1).ok_or(Bad("kty missing"))?;
        let alg = int(3).ok_or(Bad("alg missing"))?;
        match (kty, alg) {
            (2, ES256) => {
                if int(-1) != Some(1) {
                    return Err(Bad("ES256 key not on P-256"));
                }
                let (Some(x), Some(y)) = (bytes(-2), bytes(-3)) else {
                    return Err(Bad("EC2 key without x and y as bytes"));
                };
                if x.len() != 32 || y.len() != 32 {
                    return Err(Bad("P-256 coordinates not 32 bytes"));
                }
                let mut point = Vec::with_capacity(65);
                point.push(4);
                point.extend_from_slice(x);
                point.extend_from_slice(y);
                Ok(CoseKey::Es256(point))
            }
            (1, EDDSA) => {
                if int(-1) != Some(6) {
                    return Err(Bad("EdDSA key not on Ed25519"));
                }
                match bytes(-2) {
                    Some(x) if x.len() == 32 => Ok(CoseKey::EdDsa(x.clone())),
                    _ => Err(Bad("Ed25519 key not 32 bytes")),
                }
            }
            (3, RS256) => {
                let (Some(n), Some(e)) = (bytes(-1), bytes(-2)) else {
                    return Err(Bad("RSA key without n and e as bytes"));
                };
                Ok(CoseKey::Rs256 {
                    n: n.clone(),
                    e: e.clone(),
                })
            }
            (1..=3, alg) => Err(PasskeyError::AlgorithmUnsupported(alg)),
            _ => Err(Bad("unknown key type")),
        }
    }

    /// Its COSE algorithm id.
    pub fn alg(&self) -> i64 {
        match self {
            CoseKey::Es256(_) => ES256,
            CoseKey::EdDsa(_) => EDDSA,
            CoseKey::Rs256 { .. } => RS256,
        }
    }

    /// Whether `signature` is this key's over `message` (ES256 signatures
    /// are ASN.1 DER, as WebAuthn sends them).
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        use ring::signature;
        match self {
            CoseKey::Es256(point) => {
                signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, point)
                    .verify(message, signature)
                    .is_ok()
            }
            CoseKey::EdDsa(key) => signature::UnparsedPublicKey::new(&signature::ED25519, key)
                .verify(message, signature)
                .is_ok(),
            CoseKey::Rs256 { n, e } => signature::RsaPublicKeyComponents { n, e }
                .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, signature)
                .is_ok(),
        }
    }
}

/// Checks the client data against the ceremony and the site (§7.1 steps
/// 7-10, §7.2 steps 10-13), the challenge apart.
fn check_client_data(
    data: &ClientData,
    ceremony: Ceremony,
    site: &Site,
) -> Result<(), PasskeyError> {
    if data.kind != ceremony.client_type() {
        return Err(PasskeyError::TypeMismatch {
            expected: ceremony.client_type(),
            got: data.kind.clone(),
        });
    }
    if data.origin != site.origin {
        return Err(PasskeyError::OriginMismatch {
            expected: site.origin.clone(),
            got: data.origin.clone(),
        });
    }
    if data.cross_origin == Some(true) {
        return Err(PasskeyError::CrossOrigin);
    }
    Ok(())
}

/// Checks authenticatorData's RP id hash and the UP and UV flags.
fn check_auth_data(data: &AuthenticatorData, site: &Site) -> Result<(), PasskeyError> {
    let want: [u8; 32] = Sha256::digest(site.rp_id.as_bytes()).into();
    if !secrets_equal(&data.rp_id_hash, &want) {
        return Err(PasskeyError::RpIdMismatch);
    }
    if data.flags & FLAG_UP == 0 {
        return Err(PasskeyError::UserNotPresent);
    }
    if data.flags & FLAG_UV == 0 {
        return Err(PasskeyError::UserNotVerified);
    }
    Ok(())
}

/// Constant-time comparison (the hash is public, but it costs nothing).
fn secrets_equal(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// Checks an attestation statement (see the module doc) for the new
/// credential's `key`, over `auth_data || client_data_hash`.
fn check_statement(
    att: &AttestationObject,
    key: &CoseKey,
    client_data_hash: &[u8; 32],
) -> Result<(), PasskeyError> {
    match att.fmt.as_str() {
        "none" => {
            if att.statement.is_empty() {
                Ok(())
            } else {
                Err(PasskeyError::AttestationMalformed(
                    "fmt none with a statement",
                ))
            }
        }
        "packed" => {
            let get = |name: &str| {
                att.statement
                    .iter()
                    .find_map(|(k, v)| (k.as_text() == Some(name)).then_some(v))
            };
            if get("x5c").is_some() {
                // A certificate chain we would have to judge: taken as
                // `none`, since we asked for none.
                return Ok(());
            }
            let alg = match get("alg") {
                Some(Value::Integer(i)) => i64::try_from(*i).ok(),
                _ => None,
            };
            let Some(Value::Bytes(sig)) = get("sig") else {
                return Err(PasskeyError::AttestationMalformed("packed without sig"));
            };
            if alg != Some(key.alg()) {
                return Err(PasskeyError::AttestationMalformed(
                    "packed alg is not the credential's",
                ));
            }
            let mut signed = att.auth_data.clone();
            signed.extend_from_slice(client_data_hash);
            if key.verify(&signed, sig) {
                Ok(())
            } else {
                Err(PasskeyError::AttestationSignature)
            }
        }
        other => Err(PasskeyError::AttestationFormat(other.to_owned())),
    }
}

/// What a registration response holds once checked, to be stored.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedRegistration {
    /// The challenge the client data answers, base64url (to be spent).
    pub challenge: String,
    /// The credential id.
    pub credential_id: Vec<u8>,
    /// The COSE key as the authenticator encoded it.
    pub key_cbor: Vec<u8>,
    /// The signature counter at registration.
    pub sign_count: u32,
}

/// Checks a registration response for `site`: everything but the
/// challenge's state and the credential's uniqueness, which need the
/// database (§7.1 steps 5-24, attestation trust left out).
pub fn check_registration(
    site: &Site,
    response: &RegistrationResponse,
) -> Result<CheckedRegistration, PasskeyError> {
    let client_json = decode(&response.response.client_data_json, "clientDataJSON")?;
    let client = parse_client_data(&client_json)?;
    let challenge = canonical_challenge(&client.challenge)?;
    check_client_data(&client, Ceremony::Create, site)?;
    let att = parse_attestation_object(&decode(
        &response.response.attestation_object,
        "attestationObject",
    )?)?;
    let auth = parse_authenticator_data(&att.auth_data)?;
    check_auth_data(&auth, site)?;
    let Some(cred) = auth.credential else {
        return Err(PasskeyError::AuthenticatorDataMalformed(
            "no attested credential data",
        ));
    };
    if decode(&response.id, "id")? != cred.id {
        return Err(PasskeyError::CredentialIdMismatch);
    }
    let client_hash: [u8; 32] = Sha256::digest(&client_json).into();
    check_statement(&att, &cred.key, &client_hash)?;
    Ok(CheckedRegistration {
        challenge,
        credential_id: cred.id,
        key_cbor: cred.key_cbor,
        sign_count: auth.sign_count,
    })
}

/// What an assertion holds once parsed and checked against the site, to be
/// checked against the stored credential.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedAssertion {
    /// The challenge the client data answers, base64url (to be spent).
    pub challenge: String,
    /// The credential id.
    pub credential_id: Vec<u8>,
    /// The user handle, if any.
    pub user_handle: Option<Vec<u8>>,
    /// The signature counter.
    pub sign_count: u32,
    /// `authenticatorData || SHA-256(clientDataJSON)`: what was signed.
    pub signed: Vec<u8>,
    /// The signature.
    pub signature: Vec<u8>,
}

/// Parses an assertion and checks it against `site` (§7.2 steps 5-16 but
/// the challenge's state).
pub fn check_assertion(
    site: &Site,
    response: &AuthenticationResponse,
) -> Result<ParsedAssertion, PasskeyError> {
    let r = &response.response;
    let client_json = decode(&r.client_data_json, "clientDataJSON")?;
    let client = parse_client_data(&client_json)?;
    let challenge = canonical_challenge(&client.challenge)?;
    check_client_data(&client, Ceremony::Get, site)?;
    let auth_raw = decode(&r.authenticator_data, "authenticatorData")?;
    let auth = parse_authenticator_data(&auth_raw)?;
    check_auth_data(&auth, site)?;
    let credential_id = decode(&response.id, "id")?;
    let user_handle = match &r.user_handle {
        Some(h) if !h.is_empty() => Some(decode(h, "userHandle")?),
        _ => None,
    };
    let mut signed = auth_raw;
    signed.extend_from_slice(&Sha256::digest(&client_json));
    Ok(ParsedAssertion {
        challenge,
        credential_id,
        user_handle,
        sign_count: auth.sign_count,
        signed,
        signature: decode(&r.signature, "signature")?,
    })
}

/// Checks a parsed assertion against the stored passkey: the user handle,
/// the signature, then the counter (§7.2 steps 6, 21-22).
fn check_against_stored(
    assertion: &ParsedAssertion,
    username: &str,
    key: &CoseKey,
    stored_count: u32,
) -> Result<(), PasskeyError> {
    if let Some(handle) = &assertion.user_handle
        && !secrets_equal(handle, &user_handle(username))
    {
        return Err(PasskeyError::UserHandleMismatch);
    }
    if !key.verify(&assertion.signed, &assertion.signature) {
        return Err(PasskeyError::SignatureInvalid);
    }
    let got = assertion.sign_count;
    if (got != 0 || stored_count != 0) && got <= stored_count {
        return Err(PasskeyError::CounterNotIncreased {
            stored: stored_count,
            got,
        });
    }
    Ok(())
}

/// A challenge row as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StoredChallenge {
    ceremony: String,
    user_id: Option<i64>,
    expires_at: String,
    used_at: Option<String>,
}

/// Whether a stored challenge may be spent for `ceremony` by `user_id` at
/// `now` (stored form).
fn check_challenge(
    stored: &StoredChallenge,
    ceremony: Ceremony,
    user_id: Option<i64>,
    now: &str,
) -> Result<(), PasskeyError> {
    if stored.ceremony != ceremony.stored() {
        return Err(PasskeyError::ChallengeOtherCeremony);
    }
    if stored.user_id != user_id {
        return Err(PasskeyError::ChallengeOtherUser);
    }
    if stored.used_at.is_some() {
        return Err(PasskeyError::ChallengeUsed);
    }
    if stored.expires_at.as_str() <= now {
        return Err(PasskeyError::ChallengeExpired);
    }
    Ok(())
}

/// Decodes a base64url field.
fn decode(text: &str, field: &'static str) -> Result<Vec<u8>, PasskeyError> {
    B64.decode(text.trim())
        .map_err(|_| PasskeyError::Base64(field))
}

/// The stored form of a challenge from the client data: decoded and
/// encoded again, so padding does not make a second spelling.
fn canonical_challenge(text: &str) -> Result<String, PasskeyError> {
    Ok(B64.encode(decode(text, "challenge")?))
}

/// How long a ceremony may take, for the options.
fn timeout_ms() -> u64 {
    u64::try_from(CHALLENGE_TTL.as_millis()).unwrap_or(u64::MAX)
}

/// The id and admin flag of `username`.
async fn user_row(db: &Db, username: &str) -> Result<(i64, bool), PasskeyError> {
    let row = db
        .row_where("SELECT id, is_admin FROM users WHERE username = ", username)
        .await?
        .ok_or_else(|| PasskeyError::UserUnknown(username.to_owned()))?;
    Ok((
        db::int(&row, "id")?,
        db::opt_bool(&row, "is_admin")?.unwrap_or(false),
    ))
}

/// Deletes expired challenges, refuses when [`MAX_PENDING`] remain, and
/// stores a new one for `ceremony` (and `user_id`); the challenge,
/// base64url.
async fn mint_challenge(
    db: &Db,
    ceremony: Ceremony,
    user_id: Option<i64>,
) -> Result<String, PasskeyError> {
    let now_ts = jiff::Timestamp::now();
    let expires = jiff::SignedDuration::try_from(CHALLENGE_TTL)
        .ok()
        .and_then(|ttl| now_ts.checked_add(ttl).ok())
        .map(format_ts)
        .ok_or(PasskeyError::TimeOutOfRange)?;
    let mut gone = db.sql();
    gone.push("DELETE FROM passkey_challenges WHERE expires_at <= ")
        .bind(Val::Text(Some(format_ts(now_ts))));
    gone.query().execute(db.pool()).await?;
    let mut count = db.sql();
    count.push("SELECT COUNT(*) AS n FROM passkey_challenges");
    let pending = match db.fetch_optional(&count).await? {
        Some(row) => db::int(&row, "n")?,
        None => 0,
    };
    if pending >= MAX_PENDING {
        return Err(PasskeyError::TooManyPending);
    }
    let challenge = B64.encode(secrets::random_bytes::<32>());
    let mut sql = db.sql();
    sql.push("INSERT INTO passkey_challenges (challenge, ceremony, user_id, expires_at) VALUES ")
        .bind_list([
            Val::Text(Some(challenge.clone())),
            Val::Text(Some(ceremony.stored().to_owned())),
            Val::Int(user_id),
            Val::Text(Some(expires)),
        ]);
    sql.query().execute(db.pool()).await?;
    Ok(challenge)
}

/// Spends `challenge` for `ceremony` (and `user_id`): it must exist, be
/// of that ceremony and user, unspent and unexpired; the conditional update
/// lets only one request spend it.
async fn spend_challenge(
    db: &Db,
    challenge: &str,
    ceremony: Ceremony,
    user_id: Option<i64>,
) -> Result<(), PasskeyError> {
    let row = db
        .row_where(
            "SELECT ceremony, user_id, expires_at, used_at FROM passkey_challenges WHERE challenge = ",
            challenge,
        )
        .await?
        .ok_or(PasskeyError::ChallengeUnknown)?;
    let stored = StoredChallenge {
        ceremony: row.try_get("ceremony")?,
        user_id: db::opt_int(&row, "user_id")?,
        expires_at: row.try_get("expires_at")?,
        used_at: row.try_get("used_at")?,
    };
    let at = now();
    check_challenge(&stored, ceremony, user_id, &at)?;
    let mut sql = db.sql();
    sql.push("UPDATE passkey_challenges SET used_at = ")
        .bind(Val::Text(Some(at)))
        .push(" WHERE challenge = ")
        .bind(Val::Text(Some(challenge.to_owned())))
        .push(" AND used_at IS NULL");
    if sql.query().execute(db.pool()).await?.rows_affected() != 1 {
        return Err(PasskeyError::ChallengeUsed);
    }
    Ok(())
}

/// The credential ids of a user's passkeys, base64url.
async fn credential_ids(db: &Db, user_id: i64) -> Result<Vec<String>, PasskeyError> {
    let mut sql = db.sql();
    sql.push("SELECT credential_id FROM passkeys WHERE user_id = ")
        .bind(Val::Int(Some(user_id)))
        .push(" ORDER BY id");
    db.fetch_all(&sql)
        .await?
        .iter()
        .map(|r| r.try_get::<String, _>("credential_id").map_err(Into::into))
        .collect()
}

/// Options for registering a new passkey of the signed-in `username` on
/// `site`.
pub async fn registration_options(
    db: &Db,
    site: &Site,
    username: &str,
) -> Result<CreationOptions, PasskeyError> {
    let (user_id, _) = user_row(db, username).await?;
    let challenge = mint_challenge(db, Ceremony::Create, Some(user_id)).await?;
    let exclude = credential_ids(db, user_id)
        .await?
        .into_iter()
        .map(|id| CredentialDescriptor {
            kind: "public-key",
            id,
        })
        .collect();
    Ok(CreationOptions {
        challenge,
        rp: RpEntity {
            id: site.rp_id.clone(),
            name: "mProv",
        },
        user: UserEntity {
            id: B64.encode(user_handle(username)),
            name: username.to_owned(),
            display_name: username.to_owned(),
        },
        pub_key_cred_params: ALGORITHMS
            .iter()
            .map(|&alg| CredentialParameter {
                kind: "public-key",
                alg,
            })
            .collect(),
        timeout: timeout_ms(),
        exclude_credentials: exclude,
        authenticator_selection: AuthenticatorSelection {
            resident_key: "required",
            require_resident_key: true,
            user_verification: "required",
        },
        attestation: "none",
    })
}

/// Registers the passkey of `response` for the signed-in `username` under
/// `name`: the challenge is spent first, then the response checked and the
/// passkey stored.
pub async fn register(
    db: &Db,
    site: &Site,
    username: &str,
    name: &str,
    response: &RegistrationResponse,
) -> Result<Passkey, PasskeyError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME {
        return Err(PasskeyError::NameInvalid);
    }
    let (user_id, _) = user_row(db, username).await?;
    // The challenge is read from the client data before the rest is
    // checked, so that a response failing any check still spends it.
    let client_json = decode(&response.response.client_data_json, "clientDataJSON")?;
    let client = parse_client_data(&client_json)?;
    let challenge = canonical_challenge(&client.challenge)?;
    if client.kind != Ceremony::Create.client_type() {
        return Err(PasskeyError::TypeMismatch {
            expected: Ceremony::Create.client_type(),
            got: client.kind,
        });
    }
    spend_challenge(db, &challenge, Ceremony::Create, Some(user_id)).await?;
    let checked = check_registration(site, response)?;
    let id = B64.encode(&checked.credential_id);
    if db
        .row_where("SELECT id FROM passkeys WHERE credential_id = ", &id)
        .await?
        .is_some()
    {
        return Err(PasskeyError::CredentialRegistered);
    }
    let created_at = now();
    let mut sql = db.sql();
    sql.push("INSERT INTO passkeys (user_id, credential_id, public_key, sign_count, name, created_at) VALUES ")
        .bind_list([
            Val::Int(Some(user_id)),
            Val::Text(Some(id.clone())),
            Val::Text(Some(B64.encode(&checked.key_cbor))),
            Val::Int(Some(i64::from(checked.sign_count))),
            Val::Text(Some(name.to_owned())),
            Val::Text(Some(created_at.clone())),
        ]);
    match sql.query().execute(db.pool()).await {
        Ok(_) => {}
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            return Err(PasskeyError::CredentialRegistered);
        }
        Err(e) => return Err(e.into()),
    }
    let row = db
        .row_where("SELECT id FROM passkeys WHERE credential_id = ", &id)
        .await?
        .ok_or(PasskeyError::CredentialUnknown)?;
    Ok(Passkey {
        id: db::int(&row, "id")?,
        name: name.to_owned(),
        created_at,
        last_used_at: None,
    })
}

/// Options for signing in on `site` with any discoverable passkey.
pub async fn sign_in_options(db: &Db, site: &Site) -> Result<RequestOptions, PasskeyError> {
    let challenge = mint_challenge(db, Ceremony::Get, None).await?;
    Ok(RequestOptions {
        challenge,
        rp_id: site.rp_id.clone(),
        timeout: timeout_ms(),
        allow_credentials: Vec::new(),
        user_verification: "required",
    })
}

/// Checks a sign-in with a passkey: the challenge is spent first, then the
/// assertion checked against the site and the stored passkey, whose
/// counter and last use are updated. Who signed in, with the role their
/// user row gives now.
pub async fn sign_in(
    db: &Db,
    site: &Site,
    response: &AuthenticationResponse,
) -> Result<SignedIn, PasskeyError> {
    let client_json = decode(&response.response.client_data_json, "clientDataJSON")?;
    let client = parse_client_data(&client_json)?;
    let challenge = canonical_challenge(&client.challenge)?;
    if client.kind != Ceremony::Get.client_type() {
        return Err(PasskeyError::TypeMismatch {
            expected: Ceremony::Get.client_type(),
            got: client.kind,
        });
    }
    spend_challenge(db, &challenge, Ceremony::Get, None).await?;
    let assertion = check_assertion(site, response)?;
    let id = B64.encode(&assertion.credential_id);
    let row = db
        .row_where(
            "SELECT p.id AS id, p.public_key AS public_key, p.sign_count AS sign_count, u.username AS username, u.is_admin AS is_admin FROM passkeys p JOIN users u ON u.id = p.user_id WHERE p.credential_id = ",
            &id,
        )
        .await?
        .ok_or(PasskeyError::CredentialUnknown)?;
    let passkey_id = db::int(&row, "id")?;
    let username: String = row.try_get("username")?;
    let is_admin = db::opt_bool(&row, "is_admin")?.unwrap_or(false);
    let key = CoseKey::parse(&decode(
        &row.try_get::<String, _>("public_key")?,
        "public_key",
    )?)?;
    // A stored counter out of u32's range cannot come from us; reading it
    // as the largest makes every later counter fail, which is the safe side.
    let stored_count = u32::try_from(db::int(&row, "sign_count")?).unwrap_or(u32::MAX);
    check_against_stored(&assertion, &username, &key, stored_count)?;
    let mut sql = db.sql();
    sql.push("UPDATE passkeys SET sign_count = ")
        .bind(Val::Int(Some(i64::from(assertion.sign_count))))
        .push(", last_used_at = ")
        .bind(Val::Text(Some(now())))
        .push(" WHERE id = ")
        .bind(Val::Int(Some(passkey_id)));
    sql.query().execute(db.pool()).await?;
    Ok(SignedIn { username, is_admin })
}

/// The passkeys of `username`, oldest first.
pub async fn list(db: &Db, username: &str) -> Result<Vec<Passkey>, PasskeyError> {
    let (user_id, _) = user_row(db, username).await?;
    let mut sql = db.sql();
    sql.push("SELECT id, name, created_at, last_used_at FROM passkeys WHERE user_id = ")
        .bind(Val::Int(Some(user_id)))
        .push(" ORDER BY id");
    db.fetch_all(&sql)
        .await?
        .iter()
        .map(|r| {
            Ok(Passkey {
                id: db::int(r, "id")?,
                name: r.try_get("name")?,
                created_at: r.try_get("created_at")?,
                last_used_at: r.try_get("last_used_at")?,
            })
        })
        .collect()
}

/// Deletes the passkey `id` of `username` (another user's is not found).
pub async fn delete(db: &Db, username: &str, id: i64) -> Result<(), PasskeyError> {
    let (user_id, _) = user_row(db, username).await?;
    let mut sql = db.sql();
    sql.push("DELETE FROM passkeys WHERE id = ")
        .bind(Val::Int(Some(id)))
        .push(" AND user_id = ")
        .bind(Val::Int(Some(user_id)));
    if sql.query().execute(db.pool()).await?.rows_affected() == 1 {
        Ok(())
    } else {
        Err(PasskeyError::PasskeyNotFound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_from_host() {
        let s = Site::for_host(true, "mpcc.example").unwrap();
        assert_eq!(
            (s.rp_id(), s.origin()),
            ("mpcc.example", "https://mpcc.example")
        );
        let s = Site::for_host(true, "mpcc.example:443").unwrap();
        assert_eq!(s.origin(), "https://mpcc.example");
        let s = Site::for_host(true, "mpcc.example:8443").unwrap();
        assert_eq!(s.origin(), "https://mpcc.example:8443");
        let s = Site::for_host(false, "localhost:8080").unwrap();
        assert_eq!(
            (s.rp_id(), s.origin()),
            ("localhost", "http://localhost:8080")
        );
        assert!(matches!(
            Site::for_host(true, "10.0.0.1:443"),
            Err(PasskeyError::HostIsAddress(_))
        ));
        assert!(matches!(
            Site::for_host(true, "[::1]:443"),
            Err(PasskeyError::HostIsAddress(_))
        ));
        assert!(matches!(
            Site::for_host(true, "x:notaport"),
            Err(PasskeyError::HostNotAllowed(_))
        ));
    }

    #[test]
    fn challenge_rules() {
        let row = StoredChallenge {
            ceremony: "get".into(),
            user_id: None,
            expires_at: "2026-01-01T00:05:00Z".into(),
            used_at: None,
        };
        let before = "2026-01-01T00:04:59Z";
        assert!(check_challenge(&row, Ceremony::Get, None, before).is_ok());
        assert!(matches!(
            check_challenge(&row, Ceremony::Get, None, "2026-01-01T00:05:00Z"),
            Err(PasskeyError::ChallengeExpired)
        ));
        assert!(matches!(
            check_challenge(&row, Ceremony::Create, None, before),
            Err(PasskeyError::ChallengeOtherCeremony)
        ));
        assert!(matches!(
            check_challenge(&row, Ceremony::Get, Some(1), before),
            Err(PasskeyError::ChallengeOtherUser)
        ));
        let used = StoredChallenge {
            used_at: Some(before.into()),
            ..row
        };
        assert!(matches!(
            check_challenge(&used, Ceremony::Get, None, before),
            Err(PasskeyError::ChallengeUsed)
        ));
    }

    #[test]
    fn authenticator_data_layout() {
        let mut data = vec![7u8; 32];
        data.push(FLAG_UP | FLAG_UV);
        data.extend_from_slice(&5u32.to_be_bytes());
        let parsed = parse_authenticator_data(&data).unwrap();
        assert_eq!(parsed.sign_count, 5);
        assert_eq!(parsed.credential, None);
        // Trailing bytes the flags do not announce are refused.
        data.push(0);
        assert!(matches!(
            parse_authenticator_data(&data),
            Err(PasskeyError::AuthenticatorDataMalformed(_))
        ));
        assert!(parse_authenticator_data(&data[..36]).is_err());
        // AT announced without the data.
        let mut at = data[..37].to_vec();
        at[32] |= FLAG_AT;
        assert!(parse_authenticator_data(&at).is_err());
    }

    #[test]
    fn cose_keys() {
        let ed = Value::Map(vec![
            (Value::from(1), Value::from(1)),
            (Value::from(3), Value::from(EDDSA)),
            (Value::from(-1), Value::from(6)),
            (Value::from(-2), Value::Bytes(vec![1; 32])),
        ]);
        let mut cbor = Vec::new();
        ciborium::into_writer(&ed, &mut cbor).unwrap();
        assert_eq!(CoseKey::parse(&cbor).unwrap(), CoseKey::EdDsa(vec![1; 32]));
        let es384 = Value::Map(vec![
            (Value::from(1), Value::from(2)),
            (Value::from(3), Value::from(-35)),
        ]);
        cbor.clear();
        ciborium::into_writer(&es384, &mut cbor).unwrap();
        assert!(matches!(
            CoseKey::parse(&cbor),
            Err(PasskeyError::AlgorithmUnsupported(-35))
        ));
        assert!(matches!(
            CoseKey::parse(b"\xff"),
            Err(PasskeyError::CoseKeyMalformed(_))
        ));
    }

    #[test]
    fn user_handles_are_stable_and_distinct() {
        assert_eq!(user_handle("root"), user_handle("root"));
        assert_ne!(user_handle("root"), user_handle("roo"));
    }
}
