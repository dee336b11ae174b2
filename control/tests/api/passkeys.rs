//! Passkeys (the domain of `src/passkeys.rs`) on every engine, with a
//! software authenticator written here on ring: a P-256 (or Ed25519) key,
//! authenticatorData and an attestation object of fmt `none` built by hand,
//! assertions signed as an authenticator signs them. Registered then used
//! to sign in; then each way a response can be wrong, each refused with its
//! own error.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ciborium::Value;
use mprov_control::db::{Db, Engine, Val};
use mprov_control::passkeys::{
    self, AuthenticationResponse, CreationOptions, PasskeyError, RegistrationResponse,
    RequestOptions, Site,
};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::common::Ctx;

/// The host the pages are served under in these tests (always allowed).
const HOST: &str = "localhost:8443";
/// Its origin.
const ORIGIN: &str = "https://localhost:8443";

/// Whether an error is the one a case expects.
type Expected = fn(&PasskeyError) -> bool;

const UP: u8 = 0x01;
const UV: u8 = 0x04;
const AT: u8 = 0x40;

/// A key the software authenticator signs with.
enum Key {
    P256(EcdsaKeyPair),
    Ed25519(Ed25519KeyPair),
}

/// A software authenticator holding one credential.
struct Authenticator {
    key: Key,
    id: Vec<u8>,
    counter: u32,
    /// The user handle it stored at registration.
    user_handle: Vec<u8>,
}

impl Authenticator {
    fn p256() -> Authenticator {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_ASN1_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        Authenticator::with(Key::P256(key))
    }

    fn ed25519() -> Authenticator {
        let rng = SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let key = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        Authenticator::with(Key::Ed25519(key))
    }

    fn with(key: Key) -> Authenticator {
        Authenticator {
            key,
            id: mprov_control::secrets::random_bytes::<16>().to_vec(),
            counter: 0,
            user_handle: Vec::new(),
        }
    }

    /// The credential's COSE key, CBOR.
    fn cose_key(&self) -> Vec<u8> {
        let map = match &self.key {
            Key::P256(k) => {
                let point = k.public_key().as_ref();
                Value::Map(vec![
                    (1.into(), 2.into()),
                    (3.into(), (-7).into()),
                    ((-1).into(), 1.into()),
                    ((-2).into(), Value::Bytes(point[1..33].to_vec())),
                    ((-3).into(), Value::Bytes(point[33..65].to_vec())),
                ])
            }
            Key::Ed25519(k) => Value::Map(vec![
                (1.into(), 1.into()),
                (3.into(), (-8).into()),
                ((-1).into(), 6.into()),
                ((-2).into(), Value::Bytes(k.public_key().as_ref().to_vec())),
            ]),
        };
        cbor(&map)
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        match &self.key {
            Key::P256(k) => k
                .sign(&SystemRandom::new(), message)
                .unwrap()
                .as_ref()
                .to_vec(),
            Key::Ed25519(k) => k.sign(message).as_ref().to_vec(),
        }
    }

    /// authenticatorData for `rp_id`, with the attested credential when
    /// `attested`.
    fn auth_data(&self, rp_id: &str, flags: u8, counter: u32, attested: bool) -> Vec<u8> {
        let mut out = Sha256::digest(rp_id.as_bytes()).to_vec();
        out.push(flags | if attested { AT } else { 0 });
        out.extend_from_slice(&counter.to_be_bytes());
        if attested {
            out.extend_from_slice(&[0; 16]);
            out.extend_from_slice(&u16::try_from(self.id.len()).unwrap().to_be_bytes());
            out.extend_from_slice(&self.id);
            out.extend_from_slice(&self.cose_key());
        }
        out
    }

    /// A registration answering `options` as a browser at `origin` would
    /// send it, built from its parts.
    fn create(&mut self, options: &CreationOptions) -> Registration {
        self.user_handle = B64.decode(&options.user.id).unwrap();
        Registration {
            kind: "webauthn.create".into(),
            challenge: options.challenge.clone(),
            origin: ORIGIN.into(),
            auth_data: self.auth_data(&options.rp.id, UP | UV, 0, true),
            id: self.id.clone(),
        }
    }

    /// An assertion answering `options`, the counter moved on by one.
    fn get(&mut self, options: &RequestOptions) -> Assertion {
        self.counter += 1;
        Assertion {
            kind: "webauthn.get".into(),
            challenge: options.challenge.clone(),
            origin: ORIGIN.into(),
            auth_data: self.auth_data(&options.rp_id, UP | UV, self.counter, false),
            id: self.id.clone(),
            user_handle: Some(self.user_handle.clone()),
            bad_signature: false,
        }
    }

    /// The JSON a browser posts answering `options`, nothing changed.
    fn answer(&mut self, options: &RequestOptions) -> AuthenticationResponse {
        let a = self.get(options);
        self.assertion_json(&a)
    }

    /// The JSON a browser posts for `a`, signed.
    fn assertion_json(&self, a: &Assertion) -> AuthenticationResponse {
        let client = client_data(&a.kind, &a.challenge, &a.origin);
        let mut signed = a.auth_data.clone();
        signed.extend_from_slice(&Sha256::digest(&client));
        let mut sig = self.sign(&signed);
        if a.bad_signature {
            let last = sig.len() - 1;
            sig[last] ^= 1;
        }
        serde_json::from_value(json!({
            "id": B64.encode(&a.id),
            "rawId": B64.encode(&a.id),
            "type": "public-key",
            "response": {
                "clientDataJSON": B64.encode(&client),
                "authenticatorData": B64.encode(&a.auth_data),
                "signature": B64.encode(&sig),
                "userHandle": a.user_handle.as_ref().map(|h| B64.encode(h)),
            },
            "clientExtensionResults": {},
        }))
        .unwrap()
    }
}

/// The parts of a registration, to be changed by a test.
#[derive(Clone)]
struct Registration {
    kind: String,
    challenge: String,
    origin: String,
    auth_data: Vec<u8>,
    id: Vec<u8>,
}

impl Registration {
    /// The JSON a browser posts, attestation fmt none.
    fn json(&self) -> RegistrationResponse {
        let att = cbor(&Value::Map(vec![
            ("fmt".into(), "none".into()),
            ("attStmt".into(), Value::Map(vec![])),
            ("authData".into(), Value::Bytes(self.auth_data.clone())),
        ]));
        self.json_with(&att)
    }

    fn json_with(&self, attestation_object: &[u8]) -> RegistrationResponse {
        let client = client_data(&self.kind, &self.challenge, &self.origin);
        serde_json::from_value(json!({
            "id": B64.encode(&self.id),
            "rawId": B64.encode(&self.id),
            "type": "public-key",
            "response": {
                "clientDataJSON": B64.encode(&client),
                "attestationObject": B64.encode(attestation_object),
                "transports": ["internal"],
            },
            "authenticatorAttachment": "platform",
            "clientExtensionResults": {},
        }))
        .unwrap()
    }
}

/// The parts of an assertion, to be changed by a test.
#[derive(Clone)]
struct Assertion {
    kind: String,
    challenge: String,
    origin: String,
    auth_data: Vec<u8>,
    id: Vec<u8>,
    user_handle: Option<Vec<u8>>,
    bad_signature: bool,
}

fn cbor(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::into_writer(v, &mut out).unwrap();
    out
}

fn client_data(kind: &str, challenge: &str, origin: &str) -> Vec<u8> {
    json!({"type": kind, "challenge": challenge, "origin": origin, "crossOrigin": false})
        .to_string()
        .into_bytes()
}

/// Makes a user; its id.
async fn user(db: &Db, name: &str, is_admin: bool) -> i64 {
    let now = Val::Text(Some("2026-01-01T00:00:00Z".into()));
    let mut sql = db.sql();
    sql.push("INSERT INTO users (username, password, is_admin, created_at, updated_at) VALUES ")
        .bind_list([
            Val::Text(Some(name.into())),
            Val::Text(Some("!".into())),
            Val::Bool(Some(is_admin)),
            now.clone(),
            now,
        ]);
    sql.query().execute(db.pool()).await.unwrap();
    let row = db
        .row_where("SELECT id FROM users WHERE username = ", name)
        .await
        .unwrap()
        .unwrap();
    mprov_control::db::int(&row, "id").unwrap()
}

/// Registers a passkey `name` of `auth` for `username`.
async fn register(db: &Db, site: &Site, username: &str, auth: &mut Authenticator, name: &str) {
    let opts = passkeys::registration_options(db, site, username)
        .await
        .unwrap();
    let reg = auth.create(&opts);
    passkeys::register(db, site, username, name, &reg.json())
        .await
        .unwrap();
}

async fn register_then_sign_in(engine: Engine) {
    let c = Ctx::new(engine).await;
    let db = &c.state.db;
    let site = Site::new(&c.state.config, true, HOST).unwrap();
    user(db, "alice", true).await;
    user(db, "bob", false).await;

    let opts = passkeys::registration_options(db, &site, "alice")
        .await
        .unwrap();
    assert_eq!(opts.rp.id, "localhost");
    assert_eq!(B64.decode(&opts.challenge).unwrap().len(), 32);
    assert!(opts.exclude_credentials.is_empty());
    let mut laptop = Authenticator::p256();
    let reg = laptop.create(&opts);
    let made = passkeys::register(db, &site, "alice", " laptop ", &reg.json())
        .await
        .unwrap();
    assert_eq!(made.name, "laptop");
    assert_eq!(made.last_used_at, None);

    // A second passkey, Ed25519; the options now exclude the first.
    let opts = passkeys::registration_options(db, &site, "alice")
        .await
        .unwrap();
    assert_eq!(opts.exclude_credentials.len(), 1);
    assert_eq!(opts.exclude_credentials[0].id, B64.encode(&laptop.id));
    let mut key = Authenticator::ed25519();
    let reg = key.create(&opts);
    passkeys::register(db, &site, "alice", "security key", &reg.json())
        .await
        .unwrap();

    // Sign in with each; the role is the user row's.
    for auth in [&mut laptop, &mut key] {
        let opts = passkeys::sign_in_options(db, &site).await.unwrap();
        assert!(opts.allow_credentials.is_empty());
        let a = auth.get(&opts);
        let who = passkeys::sign_in(db, &site, &auth.assertion_json(&a))
            .await
            .unwrap();
        assert_eq!(who.username, "alice");
        assert!(who.is_admin);
    }
    let mine = passkeys::list(db, "alice").await.unwrap();
    assert_eq!(mine.len(), 2);
    assert!(mine.iter().all(|p| p.last_used_at.is_some()));
    assert!(passkeys::list(db, "bob").await.unwrap().is_empty());

    // A read-only user signs in read-only; made admin later, as admin.
    let mut phone = Authenticator::p256();
    register(db, &site, "bob", &mut phone, "phone").await;
    let opts = passkeys::sign_in_options(db, &site).await.unwrap();
    let who = passkeys::sign_in(db, &site, &phone.answer(&opts))
        .await
        .unwrap();
    assert_eq!((who.username.as_str(), who.is_admin), ("bob", false));
    let mut sql = db.sql();
    sql.push("UPDATE users SET is_admin = ")
        .bind(Val::Bool(Some(true)))
        .push(" WHERE username = ")
        .bind(Val::Text(Some("bob".into())));
    sql.query().execute(db.pool()).await.unwrap();
    let opts = passkeys::sign_in_options(db, &site).await.unwrap();
    let who = passkeys::sign_in(db, &site, &phone.answer(&opts))
        .await
        .unwrap();
    assert!(who.is_admin);

    // Deleting: not someone else's, then one's own, which then cannot sign in.
    let bobs = passkeys::list(db, "bob").await.unwrap();
    assert!(matches!(
        passkeys::delete(db, "alice", bobs[0].id).await,
        Err(PasskeyError::PasskeyNotFound)
    ));
    passkeys::delete(db, "bob", bobs[0].id).await.unwrap();
    let opts = passkeys::sign_in_options(db, &site).await.unwrap();
    assert!(matches!(
        passkeys::sign_in(db, &site, &phone.answer(&opts)).await,
        Err(PasskeyError::CredentialUnknown)
    ));
    c.cleanup().await;
}

/// Every wrong registration, each with its own error.
async fn registrations_refused(engine: Engine) {
    let c = Ctx::new(engine).await;
    let db = &c.state.db;
    let site = Site::new(&c.state.config, true, HOST).unwrap();
    user(db, "alice", true).await;
    user(db, "bob", true).await;
    let mut auth = Authenticator::p256();

    // Each case: a change to a good registration, and the error it gives.
    type Change = fn(&mut Registration, &Authenticator);
    let cases: Vec<(&str, Change, Expected)> = vec![
        (
            "wrong origin",
            |r, _| r.origin = "https://evil.example".into(),
            |e| matches!(e, PasskeyError::OriginMismatch { .. }),
        ),
        (
            "http instead of https",
            |r, _| r.origin = "http://localhost:8443".into(),
            |e| matches!(e, PasskeyError::OriginMismatch { .. }),
        ),
        (
            "wrong RP id",
            |r, a| r.auth_data = a.auth_data("evil.example", UP | UV, 0, true),
            |e| matches!(e, PasskeyError::RpIdMismatch),
        ),
        (
            "wrong type",
            |r, _| r.kind = "webauthn.get".into(),
            |e| matches!(e, PasskeyError::TypeMismatch { .. }),
        ),
        (
            "user not present",
            |r, a| r.auth_data = a.auth_data("localhost", UV, 0, true),
            |e| matches!(e, PasskeyError::UserNotPresent),
        ),
        (
            "user not verified",
            |r, a| r.auth_data = a.auth_data("localhost", UP, 0, true),
            |e| matches!(e, PasskeyError::UserNotVerified),
        ),
        (
            "no attested credential",
            |r, a| r.auth_data = a.auth_data("localhost", UP | UV, 0, false),
            |e| matches!(e, PasskeyError::AuthenticatorDataMalformed(_)),
        ),
        (
            "id not the attested one",
            |r, _| r.id = vec![9; 16],
            |e| matches!(e, PasskeyError::CredentialIdMismatch),
        ),
        (
            "authenticator data cut short",
            |r, _| r.auth_data.truncate(50),
            |e| matches!(e, PasskeyError::AuthenticatorDataMalformed(_)),
        ),
    ];
    for (what, change, want) in cases {
        let opts = passkeys::registration_options(db, &site, "alice")
            .await
            .unwrap();
        let mut reg = auth.create(&opts);
        change(&mut reg, &auth);
        let err = passkeys::register(db, &site, "alice", "k", &reg.json())
            .await
            .expect_err(what);
        assert!(want(&err), "{what}: {err:?}");
    }
    assert!(passkeys::list(db, "alice").await.unwrap().is_empty());

    // An unsupported algorithm (ES384).
    let opts = passkeys::registration_options(db, &site, "alice")
        .await
        .unwrap();
    let mut reg = auth.create(&opts);
    let es384 = cbor(&Value::Map(vec![
        (1.into(), 2.into()),
        (3.into(), (-35).into()),
        ((-1).into(), 2.into()),
        ((-2).into(), Value::Bytes(vec![1; 48])),
        ((-3).into(), Value::Bytes(vec![2; 48])),
    ]));
    let key_at = reg.auth_data.len() - auth.cose_key().len();
    reg.auth_data.truncate(key_at);
    reg.auth_data.extend_from_slice(&es384);
    let err = passkeys::register(db, &site, "alice", "k", &reg.json())
        .await
        .unwrap_err();
    assert!(
        matches!(err, PasskeyError::AlgorithmUnsupported(-35)),
        "{err:?}"
    );

    // Malformed CBOR, JSON and base64.
    let opts = passkeys::registration_options(db, &site, "alice")
        .await
        .unwrap();
    let reg = auth.create(&opts);
    let err = passkeys::register(db, &site, "alice", "k", &reg.json_with(b"\xa3\x63fmt"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, PasskeyError::AttestationMalformed(_)),
        "{err:?}"
    );
    let mut bad_json = reg.json();
    bad_json.response.client_data_json = B64.encode(b"{\"type\": \"webauthn.create\"");
    let err = passkeys::register(db, &site, "alice", "k", &bad_json)
        .await
        .unwrap_err();
    assert!(
        matches!(err, PasskeyError::ClientDataMalformed(_)),
        "{err:?}"
    );
    // The malformed attestation object spent the challenge; malformed
    // client data is refused before the challenge can be read.
    let err = passkeys::register(db, &site, "alice", "k", &reg.json())
        .await
        .unwrap_err();
    assert!(matches!(err, PasskeyError::ChallengeUsed), "{err:?}");
    let opts = passkeys::registration_options(db, &site, "alice")
        .await
        .unwrap();
    let mut bad_b64 = auth.create(&opts).json();
    bad_b64.response.attestation_object = "not base64!".into();
    let err = passkeys::register(db, &site, "alice", "k", &bad_b64)
        .await
        .unwrap_err();
    assert!(
        matches!(err, PasskeyError::Base64("attestationObject")),
        "{err:?}"
    );
    // Attestation fmt none with a statement, and a format we refuse.
    for (fmt, stmt, want) in [
        (
            "none",
            Value::Map(vec![("sig".into(), Value::Bytes(vec![1]))]),
            "none with a statement",
        ),
        ("tpm", Value::Map(vec![]), "tpm"),
    ] {
        let opts = passkeys::registration_options(db, &site, "alice")
            .await
            .unwrap();
        let reg = auth.create(&opts);
        let att = cbor(&Value::Map(vec![
            ("fmt".into(), fmt.into()),
            ("attStmt".into(), stmt),
            ("authData".into(), Value::Bytes(reg.auth_data.clone())),
        ]));
        let err = passkeys::register(db, &site, "alice", "k", &reg.json_with(&att))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                PasskeyError::AttestationMalformed(_) | PasskeyError::AttestationFormat(_)
            ),
            "{want}: {err:?}"
        );
    }

    // A replayed challenge, an expired one, one of another user, one of the
    // other ceremony, one never made.
    let opts = passkeys::registration_options(db, &site, "alice")
        .await
        .unwrap();
    let reg = auth.create(&opts);
    passkeys::register(db, &site, "alice", "laptop", &reg.json())
        .await
        .unwrap();
    let err = passkeys::register(db, &site, "alice", "again", &reg.json())
        .await
        .unwrap_err();
    assert!(matches!(err, PasskeyError::ChallengeUsed), "{err:?}");

    let mut other = Authenticator::p256();
    let opts = passkeys::registration_options(db, &site, "alice")
        .await
        .unwrap();
    expire(db, &opts.challenge).await;
    let err = passkeys::register(db, &site, "alice", "k", &other.create(&opts).json())
        .await
        .unwrap_err();
    assert!(matches!(err, PasskeyError::ChallengeExpired), "{err:?}");

    let opts = passkeys::registration_options(db, &site, "bob")
        .await
        .unwrap();
    let err = passkeys::register(db, &site, "alice", "k", &other.create(&opts).json())
        .await
        .unwrap_err();
    assert!(matches!(err, PasskeyError::ChallengeOtherUser), "{err:?}");

    let get = passkeys::sign_in_options(db, &site).await.unwrap();
    let mut reg = other.create(
        &passkeys::registration_options(db, &site, "alice")
            .await
            .unwrap(),
    );
    reg.challenge = get.challenge;
    let err = passkeys::register(db, &site, "alice", "k", &reg.json())
        .await
        .unwrap_err();
    assert!(
        matches!(err, PasskeyError::ChallengeOtherCeremony),
        "{err:?}"
    );
    reg.challenge = B64.encode([0u8; 32]);
    let err = passkeys::register(db, &site, "alice", "k", &reg.json())
        .await
        .unwrap_err();
    assert!(matches!(err, PasskeyError::ChallengeUnknown), "{err:?}");

    // The same credential registered twice (to the same user or another).
    for who in ["alice", "bob"] {
        let opts = passkeys::registration_options(db, &site, who)
            .await
            .unwrap();
        let err = passkeys::register(db, &site, who, "twice", &auth.create(&opts).json())
            .await
            .unwrap_err();
        assert!(
            matches!(err, PasskeyError::CredentialRegistered),
            "{who}: {err:?}"
        );
    }

    // Names: empty or too long.
    for name in ["  ", &"x".repeat(101)] {
        let opts = passkeys::registration_options(db, &site, "alice")
            .await
            .unwrap();
        let err = passkeys::register(db, &site, "alice", name, &other.create(&opts).json())
            .await
            .unwrap_err();
        assert!(matches!(err, PasskeyError::NameInvalid), "{err:?}");
    }
    assert_eq!(passkeys::list(db, "alice").await.unwrap().len(), 1);

    // The options of a user that does not exist; a host not served.
    assert!(matches!(
        passkeys::registration_options(db, &site, "nobody").await,
        Err(PasskeyError::UserUnknown(_))
    ));
    assert!(matches!(
        Site::new(&c.state.config, true, "evil.example"),
        Err(PasskeyError::HostNotAllowed(_))
    ));
    c.cleanup().await;
}

/// Every wrong sign-in, each with its own error.
async fn sign_ins_refused(engine: Engine) {
    let c = Ctx::new(engine).await;
    let db = &c.state.db;
    let site = Site::new(&c.state.config, true, HOST).unwrap();
    user(db, "alice", true).await;
    user(db, "bob", true).await;
    let mut auth = Authenticator::p256();
    register(db, &site, "alice", &mut auth, "laptop").await;

    type Change = fn(&mut Assertion, &Authenticator);
    let cases: Vec<(&str, Change, Expected)> = vec![
        (
            "wrong origin",
            |a, _| a.origin = "https://localhost:9999".into(),
            |e| matches!(e, PasskeyError::OriginMismatch { .. }),
        ),
        (
            "wrong RP id",
            |a, au| a.auth_data = au.auth_data("evil.example", UP | UV, au.counter, false),
            |e| matches!(e, PasskeyError::RpIdMismatch),
        ),
        (
            "wrong type",
            |a, _| a.kind = "webauthn.create".into(),
            |e| matches!(e, PasskeyError::TypeMismatch { .. }),
        ),
        (
            "user not present",
            |a, au| a.auth_data = au.auth_data("localhost", UV, au.counter, false),
            |e| matches!(e, PasskeyError::UserNotPresent),
        ),
        (
            "bad signature",
            |a, _| a.bad_signature = true,
            |e| matches!(e, PasskeyError::SignatureInvalid),
        ),
        (
            "unknown credential",
            |a, _| a.id = vec![7; 16],
            |e| matches!(e, PasskeyError::CredentialUnknown),
        ),
        (
            "another user's handle",
            |a, _| a.user_handle = Some(passkeys::user_handle("bob").to_vec()),
            |e| matches!(e, PasskeyError::UserHandleMismatch),
        ),
        (
            "authenticator data with trailing bytes",
            |a, _| a.auth_data.push(0),
            |e| matches!(e, PasskeyError::AuthenticatorDataMalformed(_)),
        ),
    ];
    for (what, change, want) in cases {
        let opts = passkeys::sign_in_options(db, &site).await.unwrap();
        let mut a = auth.get(&opts);
        change(&mut a, &auth);
        let err = passkeys::sign_in(db, &site, &auth.assertion_json(&a))
            .await
            .expect_err(what);
        assert!(want(&err), "{what}: {err:?}");
    }
    // No user handle is fine (a credential given in allowCredentials).
    let opts = passkeys::sign_in_options(db, &site).await.unwrap();
    let mut a = auth.get(&opts);
    a.user_handle = None;
    passkeys::sign_in(db, &site, &auth.assertion_json(&a))
        .await
        .unwrap();

    // A replayed assertion: its challenge is spent.
    let opts = passkeys::sign_in_options(db, &site).await.unwrap();
    let a = auth.get(&opts);
    let json = auth.assertion_json(&a);
    passkeys::sign_in(db, &site, &json).await.unwrap();
    let err = passkeys::sign_in(db, &site, &json).await.unwrap_err();
    assert!(matches!(err, PasskeyError::ChallengeUsed), "{err:?}");

    // An expired challenge.
    let opts = passkeys::sign_in_options(db, &site).await.unwrap();
    expire(db, &opts.challenge).await;
    let err = passkeys::sign_in(db, &site, &auth.answer(&opts))
        .await
        .unwrap_err();
    assert!(matches!(err, PasskeyError::ChallengeExpired), "{err:?}");

    // A registration's challenge used to sign in.
    let reg = passkeys::registration_options(db, &site, "alice")
        .await
        .unwrap();
    let mut a = auth.get(&passkeys::sign_in_options(db, &site).await.unwrap());
    a.challenge = reg.challenge;
    let err = passkeys::sign_in(db, &site, &auth.assertion_json(&a))
        .await
        .unwrap_err();
    assert!(
        matches!(err, PasskeyError::ChallengeOtherCeremony),
        "{err:?}"
    );

    // The counter standing still, or going backwards.
    let opts = passkeys::sign_in_options(db, &site).await.unwrap();
    passkeys::sign_in(db, &site, &auth.answer(&opts))
        .await
        .unwrap();
    let stored = auth.counter;
    for counter in [stored, stored - 1] {
        let opts = passkeys::sign_in_options(db, &site).await.unwrap();
        let mut a = auth.get(&opts);
        a.auth_data = auth.auth_data("localhost", UP | UV, counter, false);
        let err = passkeys::sign_in(db, &site, &auth.assertion_json(&a))
            .await
            .unwrap_err();
        assert!(
            matches!(err, PasskeyError::CounterNotIncreased { got, .. } if got == counter),
            "{err:?}"
        );
    }

    // Malformed client data JSON and base64.
    let opts = passkeys::sign_in_options(db, &site).await.unwrap();
    let mut json = auth.answer(&opts);
    json.response.client_data_json = B64.encode(b"[1, 2]");
    let err = passkeys::sign_in(db, &site, &json).await.unwrap_err();
    assert!(
        matches!(err, PasskeyError::ClientDataMalformed(_)),
        "{err:?}"
    );
    json.response.client_data_json = "***".into();
    let err = passkeys::sign_in(db, &site, &json).await.unwrap_err();
    assert!(
        matches!(err, PasskeyError::Base64("clientDataJSON")),
        "{err:?}"
    );

    // The credential of a deleted user: gone with the user.
    let mut bobs = Authenticator::p256();
    register(db, &site, "bob", &mut bobs, "bob's").await;
    let mut sql = db.sql();
    sql.push("DELETE FROM users WHERE username = ")
        .bind(Val::Text(Some("bob".into())));
    sql.query().execute(db.pool()).await.unwrap();
    let opts = passkeys::sign_in_options(db, &site).await.unwrap();
    let err = passkeys::sign_in(db, &site, &bobs.answer(&opts))
        .await
        .unwrap_err();
    assert!(matches!(err, PasskeyError::CredentialUnknown), "{err:?}");
    // A user made again under the same name does not inherit it.
    user(db, "bob", true).await;
    assert!(passkeys::list(db, "bob").await.unwrap().is_empty());
    let opts = passkeys::sign_in_options(db, &site).await.unwrap();
    let err = passkeys::sign_in(db, &site, &bobs.answer(&opts))
        .await
        .unwrap_err();
    assert!(matches!(err, PasskeyError::CredentialUnknown), "{err:?}");
    c.cleanup().await;
}

/// Sets a challenge's expiry in the past.
async fn expire(db: &Db, challenge: &str) {
    let mut sql = db.sql();
    sql.push("UPDATE passkey_challenges SET expires_at = ")
        .bind(Val::Text(Some("2000-01-01T00:00:00Z".into())))
        .push(" WHERE challenge = ")
        .bind(Val::Text(Some(challenge.into())));
    assert_eq!(
        sql.query()
            .execute(db.pool())
            .await
            .unwrap()
            .rows_affected(),
        1
    );
}

crate::engine_tests!(
    register_then_sign_in,
    registrations_refused,
    sign_ins_refused
);
