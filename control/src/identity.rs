//! Who is asking: the principals a request can be made by, and the checks
//! that establish one: a client certificate against the allow-list of
//! enrollment, an API key, a user's password (argon2, remembered for a
//! while, and throttled per client and per user name).
//!
//! Nothing here knows HTTP: [`crate::http::auth`] reads the credentials
//! off a request and calls these checks; an [`IdentityError`] becomes its
//! status there.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::db::{Db, Val, opt_bool};
use crate::first_start::SHARED_KEY_SETTING;
use crate::pki::Profile;
use crate::secrets;
use crate::time::now;

/// Why a principal could not be established.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The credentials are not valid (401), and what to do.
    #[error("{0}")]
    Refused(String),
    /// Too many wrong passwords or checks at once (429).
    #[error("{message}")]
    Throttled {
        /// What was limited.
        message: String,
        /// Seconds until a new try.
        retry_after: u32,
    },
    /// The database failed.
    #[error("identity database")]
    Db(#[from] sqlx::Error),
    /// The password check did not finish.
    #[error("password check")]
    Join(#[from] tokio::task::JoinError),
}

fn refused(message: &str) -> IdentityError {
    IdentityError::Refused(message.to_owned())
}

/// A node or a job server, as its client certificate names it once checked
/// against the allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// [`Profile::Node`] or [`Profile::Jobserver`].
    pub profile: Profile,
    /// The node's or job server's name.
    pub identity: String,
    /// The certificate's serial, hex.
    pub serial: String,
}

impl Machine {
    /// Whether it is a node (not a job server).
    pub fn is_node(&self) -> bool {
        self.profile == Profile::Node
    }
}

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// No credentials.
    Anonymous,
    /// An API key: admin rights, except the old shared key, which
    /// `MPROV_SHARED_KEY_MODE` narrows (see [`crate::access`]).
    ApiKey {
        /// The key's row id.
        id: i64,
        /// Its name.
        name: String,
        /// Whether it is the shared key made at first start.
        shared: bool,
    },
    /// A machine (a node or a job server) with a client certificate from
    /// enrollment.
    Machine(Machine),
    /// A user who sent a password (HTTP Basic).
    User {
        /// The user's name.
        username: String,
        /// Whether the user may change things.
        is_admin: bool,
    },
}

impl Principal {
    /// Who this is, as the audit log names it: the account, the API key or
    /// the certificate's identity.
    pub fn label(&self) -> String {
        match self {
            Principal::Anonymous => "anonymous".into(),
            Principal::ApiKey { name, .. } => format!("api key {name}"),
            Principal::Machine(m) => m.identity.clone(),
            Principal::User { username, .. } => username.clone(),
        }
    }

    /// Whether this principal may write to the inventory.
    pub fn is_admin(&self) -> bool {
        match self {
            Principal::Anonymous | Principal::Machine(_) => false,
            Principal::ApiKey { shared, .. } => !shared,
            Principal::User { is_admin, .. } => *is_admin,
        }
    }
}

/// How long a checked password is remembered, so a client making many requests
/// with Basic auth pays for argon2 once, not on every request.
const PASSWORD_CACHE_TTL: Duration = Duration::from_secs(300);
/// At most this many remembered passwords; the cache is cleared when full.
const PASSWORD_CACHE_MAX: usize = 1024;

/// Remembers recently verified (user, password, stored hash) triples.
#[derive(Debug, Default)]
pub struct PasswordCache {
    entries: Mutex<HashMap<[u8; 32], Instant>>,
}

impl PasswordCache {
    fn key(username: &str, password: &str, stored: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        for part in [username, password, stored] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().into()
    }

    fn hit(&self, key: &[u8; 32]) -> bool {
        let Ok(map) = self.entries.lock() else {
            return false;
        };
        map.get(key)
            .is_some_and(|t| t.elapsed() < PASSWORD_CACHE_TTL)
    }

    fn remember(&self, key: [u8; 32]) {
        if let Ok(mut map) = self.entries.lock() {
            if map.len() >= PASSWORD_CACHE_MAX {
                map.clear();
            }
            map.insert(key, Instant::now());
        }
    }
}

/// Wrong passwords allowed per client address, and per user name from one
/// address, before password checks answer 429; the count starts over once a
/// [`FAILURE_WINDOW`] passed without a wrong password, so a flood, however
/// slow its checks, never gets more than this many through from one
/// address. Right passwords are not counted. A user name is never limited
/// for every address at once: a stranger's wrong passwords must not lock
/// its owner out (guessing from many addresses is bounded by argon2 running
/// [`ARGON2_AT_ONCE`] at a time).
pub const MAX_FAILURES: u32 = 10;
/// The quiet time after which the count of wrong passwords starts over.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// argon2 checks running at once: one, so a flood of passwords holds at
/// most one of the cores and the API keeps answering on the others.
pub const ARGON2_AT_ONCE: usize = 1;
/// Password checks that may wait for their turn; more get 429 at once.
pub const ARGON2_QUEUE: usize = 16;
/// Counters kept at most; older windows are dropped first.
const THROTTLE_MAX_KEYS: usize = 10_000;

/// Bounds password checking: argon2 runs [`ARGON2_AT_ONCE`] at a time with
/// at most [`ARGON2_QUEUE`] waiting, and wrong passwords are counted per
/// client address and per user name and address ([`MAX_FAILURES`] per
/// [`FAILURE_WINDOW`]).
#[derive(Debug)]
pub struct PasswordThrottle {
    argon2: tokio::sync::Semaphore,
    waiting: std::sync::atomic::AtomicUsize,
    failures: Mutex<HashMap<String, (Instant, u32)>>,
}

impl Default for PasswordThrottle {
    fn default() -> Self {
        PasswordThrottle {
            argon2: tokio::sync::Semaphore::new(ARGON2_AT_ONCE),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            failures: Mutex::new(HashMap::new()),
        }
    }
}

/// The throttle's decision for one key: how long until it may try again.
/// Pure: `entry` is the last wrong password's time and the count.
pub fn throttled(entry: Option<(Instant, u32)>, now: Instant) -> Option<Duration> {
    let (last, count) = entry?;
    let end = last + FAILURE_WINDOW;
    (count >= MAX_FAILURES && now < end).then(|| end - now)
}

impl PasswordThrottle {
    fn keys(client: Option<IpAddr>, username: &str) -> Vec<String> {
        let name = username.to_ascii_lowercase();
        match client {
            Some(ip) => vec![format!("user:{name}@{ip}"), format!("ip:{ip}")],
            // No address to tell clients apart (an in-process caller): the
            // name alone.
            None => vec![format!("user:{name}")],
        }
    }

    /// Refuses with 429 if this client or user name had too many wrong
    /// passwords lately.
    fn check(&self, client: Option<IpAddr>, username: &str) -> Result<(), IdentityError> {
        let now = Instant::now();
        let map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        for key in Self::keys(client, username) {
            if let Some(wait) = throttled(map.get(&key).copied(), now) {
                let secs = u32::try_from(wait.as_secs() + 1).unwrap_or(u32::MAX);
                let who = if key.starts_with("ip:") {
                    "from this address"
                } else {
                    "for this user name from this address"
                };
                return Err(IdentityError::Throttled {
                    message: format!(
                        "too many wrong passwords {who} ({MAX_FAILURES} without {}s between them); try again in {secs}s",
                        FAILURE_WINDOW.as_secs()
                    ),
                    retry_after: secs,
                });
            }
        }
        Ok(())
    }

    fn failed(&self, client: Option<IpAddr>, username: &str) {
        let now = Instant::now();
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= THROTTLE_MAX_KEYS {
            map.retain(|_, (start, _)| now.duration_since(*start) < FAILURE_WINDOW);
            if map.len() >= THROTTLE_MAX_KEYS {
                map.clear();
            }
        }
        for key in Self::keys(client, username) {
            let e = map.entry(key).or_insert((now, 0));
            if now.duration_since(e.0) >= FAILURE_WINDOW {
                e.1 = 0;
            }
            *e = (now, e.1.saturating_add(1));
        }
    }

    /// Takes back one wrong password counted for `username` from
    /// `client`: the admin pages' sign-in asks the directory after the
    /// local check says no, and the directory's yes makes that no a
    /// sign-in, not a guess.
    pub fn forgive(&self, client: Option<IpAddr>, username: &str) {
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        for key in Self::keys(client, username) {
            if let Some(e) = map.get_mut(&key) {
                e.1 = e.1.saturating_sub(1);
            }
        }
    }

    /// Runs one argon2 check on the blocking pool, in turn. The limits are
    /// checked again once it is this check's turn, and a wrong password is
    /// counted before the next check may start, so no flood gets more than
    /// [`MAX_FAILURES`] checks through.
    async fn verify(
        &self,
        client: Option<IpAddr>,
        username: &str,
        password: String,
        stored: String,
    ) -> Result<bool, IdentityError> {
        use std::sync::atomic::Ordering;
        let busy = || IdentityError::Throttled {
            message: format!(
                "too many password checks at once (over {ARGON2_QUEUE} waiting); try again in a second, or use an API key"
            ),
            retry_after: 1,
        };
        self.check(client, username)?;
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= ARGON2_QUEUE {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(busy());
        }
        let permit = self.argon2.acquire().await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        let _permit = permit.map_err(|_| busy())?;
        self.check(client, username)?;
        let ok = tokio::task::spawn_blocking(move || secrets::verify_password(&password, &stored))
            .await?;
        if !ok {
            self.failed(client, username);
        }
        Ok(ok)
    }
}

/// Checks a client certificate (DER, already verified to chain to the CA
/// by the TLS layer) against the allow-list.
pub async fn check_certificate(db: &Db, der: &[u8]) -> Result<Machine, IdentityError> {
    use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};
    let bad = refused;
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|_| bad("the client certificate cannot be read"))?;
    let serial = hex::encode(cert.raw_serial());
    let uri = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .and_then(|san| {
            san.value.general_names.iter().find_map(|n| match n {
                GeneralName::URI(u) => Some((*u).to_owned()),
                _ => None,
            })
        })
        .ok_or_else(|| bad("the client certificate names no mProv identity"))?;
    let (kind, identity) = uri
        .strip_prefix("urn:mprov:")
        .and_then(|r| r.split_once(':'))
        .ok_or_else(|| bad("the client certificate names no mProv identity"))?;
    let row = db
        .row_where(
            "SELECT kind, identity, revoked_at FROM credentials WHERE serial = ",
            &serial,
        )
        .await?
        .ok_or_else(|| bad("this client certificate was not issued by enrollment"))?;
    let revoked: Option<String> = row.try_get("revoked_at").unwrap_or(None);
    if let Some(at) = revoked {
        return Err(bad(&format!(
            "this client certificate was revoked at {at}; enroll again"
        )));
    }
    let (k, i): (String, String) = (row.try_get("kind")?, row.try_get("identity")?);
    if k != kind || i != identity {
        return Err(bad("the client certificate does not match its record"));
    }
    let profile =
        Profile::agent(&k).ok_or_else(|| bad("the client certificate names no mProv identity"))?;
    Ok(Machine {
        profile,
        identity: i,
        serial,
    })
}

/// Checks an API key (`Authorization: Api-Key <key>`): a live key, and
/// whether it is the shared key made at first start.
pub async fn check_api_key(db: &Db, key: &str) -> Result<Principal, IdentityError> {
    let bad = || refused("the API key is not valid");
    let (prefix, secret) = secrets::split_api_key(key).ok_or_else(bad)?;
    let mut sql = db.sql();
    // The shared key's prefix comes along in the same query: no second
    // round trip on every request.
    sql.push(
        "SELECT id, name, hash, expires_at, revoked, (SELECT value FROM settings WHERE name = ",
    );
    sql.bind(Val::Text(Some(SHARED_KEY_SETTING.to_owned())));
    sql.push(") AS shared_prefix FROM api_keys WHERE prefix = ");
    sql.bind(Val::Text(Some(prefix.to_owned())));
    let row = sql
        .query()
        .fetch_optional(db.pool())
        .await?
        .ok_or_else(bad)?;
    let hash: String = row.try_get("hash")?;
    if !secrets::hashes_equal(&secrets::hash_api_secret(secret), &hash) {
        return Err(bad());
    }
    if opt_bool(&row, "revoked").ok().flatten().unwrap_or(true) {
        return Err(refused("this API key was revoked; make a new one"));
    }
    let expires: Option<String> = row.try_get("expires_at").unwrap_or(None);
    if let Some(exp) = expires
        && exp <= now()
    {
        return Err(IdentityError::Refused(format!(
            "this API key expired at {exp}; make a new one"
        )));
    }
    let id = crate::db::int(&row, "id")?;
    let name: String = row.try_get("name").unwrap_or_default();
    let shared_prefix: Option<String> = row.try_get("shared_prefix").unwrap_or(None);
    let shared = shared_prefix.as_deref() == Some(prefix);
    Ok(Principal::ApiKey { id, name, shared })
}

/// Checks HTTP Basic credentials (`cred`, base64 `user:password`) against
/// the users table, through `cache` and the `throttle`; `client` is the
/// caller's address, for the throttle.
pub async fn check_password(
    db: &Db,
    cache: &PasswordCache,
    throttle: &PasswordThrottle,
    cred: &str,
    client: Option<IpAddr>,
) -> Result<Principal, IdentityError> {
    let bad = || refused("wrong user name or password");
    let decoded = STANDARD.decode(cred).map_err(|_| bad())?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
    let (username, password) = decoded.split_once(':').ok_or_else(bad)?;
    check_user_password(db, cache, throttle, username, password, client).await
}

/// Checks a user name and password against the `users` table, within the
/// throttle: the API's HTTP Basic and the admin pages' sign-in form.
pub async fn check_user_password(
    db: &Db,
    cache: &PasswordCache,
    throttle: &PasswordThrottle,
    username: &str,
    password: &str,
    client: Option<IpAddr>,
) -> Result<Principal, IdentityError> {
    let bad = || refused("wrong user name or password");
    let select = "SELECT password, is_admin FROM users WHERE username = ";
    let row = db.row_where(select, &username.to_ascii_lowercase()).await?;
    let Some(row) = row else {
        // Spend the same time as a real check, so timing does not tell which
        // user names exist; it counts as a wrong password.
        throttle
            .verify(client, username, password.to_owned(), DUMMY_HASH.to_owned())
            .await?;
        return Err(bad());
    };
    let stored: String = row.try_get("password")?;
    let is_admin = opt_bool(&row, "is_admin").ok().flatten().unwrap_or(false);
    let key = PasswordCache::key(username, password, &stored);
    if !cache.hit(&key) {
        let ok = throttle
            .verify(client, username, password.to_owned(), stored.clone())
            .await?;
        if !ok {
            return Err(bad());
        }
        cache.remember(key);
    }
    Ok(Principal::User {
        username: username.to_ascii_lowercase(),
        is_admin,
    })
}

/// An argon2 hash of a random string, verified against when a user does not
/// exist.
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$W2M7YV0R6Rk3dn1rRRwT0ZbXJc8nKOWkqf5NjVj2b3s";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_throttle_counts_until_a_quiet_window() {
        let t0 = Instant::now();
        assert_eq!(throttled(None, t0), None);
        assert_eq!(throttled(Some((t0, MAX_FAILURES - 1)), t0), None);
        assert_eq!(
            throttled(Some((t0, MAX_FAILURES)), t0),
            Some(FAILURE_WINDOW)
        );
        assert_eq!(
            throttled(Some((t0, MAX_FAILURES)), t0 + FAILURE_WINDOW),
            None
        );
    }

    /// Directory users sign in through a local check that says no first:
    /// each such no taken back, any number of sign-ins never throttle.
    #[test]
    fn forgiven_misses_never_add_up() {
        let t = PasswordThrottle::default();
        let ip = Some(IpAddr::from([10, 0, 0, 9]));
        for _ in 0..MAX_FAILURES * 3 {
            t.failed(ip, "dirk");
            t.forgive(ip, "dirk");
        }
        assert!(t.check(ip, "dirk").is_ok());
        for _ in 0..MAX_FAILURES {
            t.failed(ip, "dirk");
        }
        assert!(matches!(
            t.check(ip, "dirk"),
            Err(IdentityError::Throttled { .. })
        ));
    }

    /// The stand-in hash must parse, or an unknown user would be refused
    /// faster than a wrong password and timing would tell names apart.
    #[test]
    fn dummy_hash_is_a_real_argon2_hash() {
        assert!(argon2::password_hash::phc::PasswordHash::new(DUMMY_HASH).is_ok());
        assert!(!secrets::verify_password("anything", DUMMY_HASH));
    }
}
