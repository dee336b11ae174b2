//! The install's secrets: the secret key and what is derived from it, API keys,
//! and admin passwords.
//!
//! - BMC credentials are encrypted at rest with ChaCha20-Poly1305 under a key
//!   derived (HKDF-SHA256) from the install's secret key, which lives in the
//!   config folder, never beside the database: a stolen database or backup alone
//!   does not reveal them.
//! - API keys are 32 random bytes; only the SHA-256 of the secret part is stored.
//!   A slow hash buys nothing for a random 256-bit secret, and a fast one keeps
//!   every API request cheap.
//! - Admin passwords are chosen by people, so they get argon2id (PHC strings, so
//!   parameters can be raised later). Hashing is CPU work: callers run it on a
//!   blocking thread.

use std::fmt;

use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Random bytes from the operating system.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    // The OS generator failing means the machine cannot run anything secure.
    #[allow(clippy::expect_used)]
    getrandom::fill(&mut buf).expect("the operating system's random generator failed");
    buf
}

/// A random string of `n_bytes` bytes of entropy, URL-safe.
pub fn random_token(n_bytes: usize) -> String {
    let mut buf = vec![0u8; n_bytes];
    #[allow(clippy::expect_used)]
    getrandom::fill(&mut buf).expect("the operating system's random generator failed");
    URL_SAFE_NO_PAD.encode(buf)
}

/// Encrypts and decrypts secrets stored in the database.
pub struct SecretBox {
    cipher: ChaCha20Poly1305,
}

impl fmt::Debug for SecretBox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretBox(<redacted>)")
    }
}

/// The stored form's version tag, so the scheme can change later.
const BOX_PREFIX: &str = "v1:";

/// A stored secret could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenSecretError {
    /// Not in our stored format.
    #[error("stored secret is not in the v1 format")]
    Format,
    /// The key does not open it: a different secret key, or tampering.
    #[error("stored secret does not open with this install's secret key")]
    Key,
}

impl SecretBox {
    /// The box for an install's secret key.
    pub fn new(secret_key: &str) -> SecretBox {
        let hk = hkdf::Hkdf::<Sha256>::new(Some(b"mprov secrets"), secret_key.as_bytes());
        let mut key = [0u8; 32];
        // 32 bytes is far below HKDF-SHA256's 8160-byte output limit.
        #[allow(clippy::expect_used)]
        hk.expand(b"bmc credentials v1", &mut key)
            .expect("32 bytes is a valid HKDF length");
        SecretBox {
            cipher: ChaCha20Poly1305::new(&Key::from(key)),
        }
    }

    /// Encrypts `plain` with a fresh random nonce.
    pub fn seal(&self, plain: &str) -> String {
        let nonce_bytes = random_bytes::<12>();
        let nonce = Nonce::from(nonce_bytes);
        // Encryption only fails for inputs beyond 256 GiB.
        #[allow(clippy::expect_used)]
        let ct = self
            .cipher
            .encrypt(&nonce, plain.as_bytes())
            .expect("secret too large");
        let mut out = nonce_bytes.to_vec();
        out.extend_from_slice(&ct);
        format!("{BOX_PREFIX}{}", STANDARD.encode(out))
    }

    /// Decrypts what [`SecretBox::seal`] made.
    pub fn open(&self, stored: &str) -> Result<String, OpenSecretError> {
        let b64 = stored
            .strip_prefix(BOX_PREFIX)
            .ok_or(OpenSecretError::Format)?;
        let raw = STANDARD.decode(b64).map_err(|_| OpenSecretError::Format)?;
        if raw.len() < 12 {
            return Err(OpenSecretError::Format);
        }
        let (nonce, ct) = raw.split_at(12);
        let nonce = Nonce::try_from(nonce).map_err(|_| OpenSecretError::Format)?;
        let plain = self
            .cipher
            .decrypt(&nonce, ct)
            .map_err(|_| OpenSecretError::Key)?;
        String::from_utf8(plain).map_err(|_| OpenSecretError::Format)
    }
}

/// A new API key: what the user is shown once, and what is stored.
#[derive(Debug)]
pub struct NewApiKey {
    /// The full key, `<prefix>.<secret>`, shown once.
    pub key: String,
    /// The public prefix, stored in clear to find the row.
    pub prefix: String,
    /// SHA-256 of the secret, hex.
    pub hash: String,
}

/// Makes a new API key.
pub fn new_api_key() -> NewApiKey {
    // A letter first, so a prefix never reads as a row id.
    let prefix = format!("mp{}", hex::encode(random_bytes::<4>()));
    let secret = random_token(32);
    let hash = hash_api_secret(&secret);
    NewApiKey {
        key: format!("{prefix}.{secret}"),
        prefix,
        hash,
    }
}

/// SHA-256 of an API key's secret part, hex.
pub fn hash_api_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Splits `<prefix>.<secret>`.
pub fn split_api_key(key: &str) -> Option<(&str, &str)> {
    let (prefix, secret) = key.split_once('.')?;
    (!prefix.is_empty() && !secret.is_empty()).then_some((prefix, secret))
}

/// Compares two stored hashes in constant time.
pub fn hashes_equal(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Hashes a password with argon2id. CPU-heavy: call from a blocking thread.
pub fn hash_password(password: &str) -> Result<String, argon2::password_hash::Error> {
    let hash: argon2::password_hash::phc::PasswordHash =
        argon2::Argon2::default().hash_password(password.as_bytes())?;
    Ok(hash.to_string())
}

/// Checks a password against its stored hash. CPU-heavy: call from a blocking
/// thread. A malformed stored hash never matches.
pub fn verify_password(password: &str, stored: &str) -> bool {
    match argon2::password_hash::phc::PasswordHash::new(stored) {
        Ok(parsed) => argon2::Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_secrets_round_trip_and_differ_each_time() {
        let b = SecretBox::new("install secret");
        let a1 = b.seal("hunter2");
        let a2 = b.seal("hunter2");
        assert_ne!(a1, a2, "nonces must differ");
        assert!(!a1.contains("hunter2"));
        assert_eq!(b.open(&a1).unwrap(), "hunter2");
        assert!(matches!(
            SecretBox::new("other").open(&a1),
            Err(OpenSecretError::Key)
        ));
        assert!(matches!(b.open("plain"), Err(OpenSecretError::Format)));
        assert!(matches!(b.open("v1:!!"), Err(OpenSecretError::Format)));
        assert!(matches!(b.open("v1:AAAA"), Err(OpenSecretError::Format)));
    }

    #[test]
    fn api_keys_split_and_hash() {
        let k = new_api_key();
        let (prefix, secret) = split_api_key(&k.key).unwrap();
        assert_eq!(prefix, k.prefix);
        assert!(hashes_equal(&hash_api_secret(secret), &k.hash));
        assert!(!hashes_equal(&hash_api_secret("wrong"), &k.hash));
        assert_eq!(split_api_key("nodot"), None);
        assert_eq!(split_api_key(".x"), None);
    }

    #[test]
    fn passwords_verify() {
        let h = hash_password("correct horse").unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", &h));
        assert!(!verify_password("wrong", &h));
        assert!(!verify_password("x", "not a hash"));
    }
}
