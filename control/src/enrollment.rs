//! Enrollment: how a job server gets its own client certificate, and the
//! allow-list every certificate-authenticated request is checked against.
//!
//! - An admin makes a one-time token (`mprov-control enroll-token`, or
//!   `POST /api/v1/enroll-tokens/`): printed once, stored as a SHA-256,
//!   single-use, 24 h by default. Until a job server has enrolled, every start
//!   of the service leaves a fresh one in `/etc/mprov/enroll_token` for the
//!   job server on the same host.
//! - The job server makes its own key and posts `{token, name, csr}` to
//!   `POST /enroll/jobserver/`. The signing helper signs the CSR for that
//!   name only; the reply carries the certificate and the CA certificate.
//! - Without a token, an admin's API key (the seed's `apikey`) in the
//!   request's `Authorization` enrolls the job server the same way
//!   ([`enroll_jobserver_by_admin`]): for a name that holds no valid
//!   certificate, from a CSR. Only the enrollment takes the key; every
//!   later request of the job server needs its certificate.
//! - Every issued certificate is recorded in `credentials`. A request with a
//!   client certificate is accepted only if its serial is there, unrevoked,
//!   for the identity the certificate names; enrolling again revokes the
//!   identity's older certificates.
//!
//! A token is consumed only after the signature succeeded, so a bad CSR does
//! not burn it; two racing uses of one token cannot both be recorded (the
//! consuming UPDATE is conditional), and an unrecorded certificate is
//! refused by the allow-list, so the loser gets nothing usable.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::Row as _;

use crate::db::{Db, Sql, Val};
use crate::identity::Machine;
use crate::pki::{Profile, SignReply, SignRequest, SignerClient, SignerError};
use crate::secrets;
use crate::time::{format_ts, now};
use mprov_api::enroll::{Enrolled, JobserverEnrollment, NodeEnrollment};

/// Why an enrollment, a token or a credential operation failed: the facts,
/// which the HTTP layer alone turns into statuses and messages
/// (`From<EnrollError> for ApiError`).
#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    /// No credential has this id.
    #[error("no credential {0}")]
    CredentialUnknown(i64),
    /// The helper refused the CSR, with its reason.
    #[error("the signing helper refused the CSR: {0}")]
    CsrRefused(String),
    /// The CSR is longer than any the CA signs; it never reaches the
    /// signing helper.
    #[error(
        "the CSR is {size} bytes; the CA signs CSRs of at most {MAX_CSR_BYTES} bytes (a P-256 CSR is under 1 KiB)"
    )]
    CsrTooLarge {
        /// Its length in bytes.
        size: usize,
    },
    /// The database failed.
    #[error("enrollment database")]
    Db(#[from] sqlx::Error),
    /// Other requests kept enrolling the same identity at the same time,
    /// past every retry.
    #[error("{identity} is being enrolled by other requests at the same time")]
    EnrollmentCollided {
        /// The identity.
        identity: String,
    },
    /// A list of credentials was filtered by a field that has no filter.
    #[error("credentials have no filter {0:?}")]
    FilterUnknown(String),
    /// A new-server token was presented for a job server that already holds
    /// a valid certificate.
    #[error("job server {name:?} already has a valid certificate")]
    JobServerLive {
        /// The job server's name.
        name: String,
    },
    /// The job server's name cannot be one (see [`valid_name`]).
    #[error("{0:?} is not a job server's name")]
    NameInvalid(String),
    /// The nonce expired at this time.
    #[error("the enrollment nonce expired at {0}")]
    NonceExpired(String),
    /// Another request spent the nonce while this one was being signed.
    #[error("the enrollment nonce was spent by a concurrent request")]
    NonceRaced,
    /// No nonce has this hash: never minted, cancelled by a newer one (each
    /// boot through `/ipxe/` cancels the system's earlier unused nonces), or
    /// expired long ago and deleted.
    #[error("the enrollment nonce is unknown")]
    NonceUnknown,
    /// The nonce was already used at this time (a replay).
    #[error("the enrollment nonce was already used at {0}")]
    NonceUsed(String),
    /// This service runs without a signing helper.
    #[error("no signing helper")]
    NoSigner,
    /// The helper is down for now; nothing was enrolled.
    #[error("the signing helper is down")]
    SignerDown(#[source] SignerError),
    /// A time could not be computed.
    #[error("enrollment time")]
    Time(#[from] jiff::Error),
    /// The token expired at this time.
    #[error("the enrollment token expired at {0}")]
    TokenExpired(String),
    /// The token was made for another job server's name.
    #[error("the enrollment token was made for {made_for:?}, not {asked:?}")]
    TokenForAnotherName {
        /// The name it was made for.
        made_for: String,
        /// The name asked for.
        asked: String,
    },
    /// A token's lifetime out of range, in hours.
    #[error("a token cannot last {0} hours")]
    TokenHoursOutOfRange(u32),
    /// Another request spent the token while this one was being signed.
    #[error("the enrollment token was spent by a concurrent request")]
    TokenRaced,
    /// No token has this prefix and secret.
    #[error("the enrollment token is unknown")]
    TokenUnknown,
    /// The token was already used at this time.
    #[error("the enrollment token was already used at {0}")]
    TokenUsed(String),
}

/// The longest a token may last, in hours (30 days).
pub const MAX_TOKEN_HOURS: u32 = 24 * 30;

/// The longest CSR (PEM, bytes) sent to the signing helper: far above
/// the largest key the CA accepts (an RSA-8192 CSR is about 3.5 KiB) and
/// well below the helper's request line.
pub const MAX_CSR_BYTES: usize = 16 * 1024;
const _: () = assert!(2 * MAX_CSR_BYTES < crate::pki::protocol::MAX_REQUEST);

/// How long an enrollment token is valid unless said otherwise.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// The file a fresh token is left in for the local job server.
pub const TOKEN_FILE: &str = "enroll_token";

/// A token just made: shown once.
#[derive(Debug, Clone, Serialize)]
pub struct NewToken {
    /// The token itself (`<prefix>.<secret>`).
    pub token: String,
    /// When it stops working.
    pub expires_at: String,
}

/// What a token may do: enroll a name that has no valid certificate, or
/// replace the certificate of a live job server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Purpose {
    /// A job server that has no valid certificate yet.
    New,
    /// A new certificate for a job server that has one (which is revoked).
    Replace,
}

impl Purpose {
    fn as_str(self) -> &'static str {
        match self {
            Purpose::New => "new",
            Purpose::Replace => "replace",
        }
    }
}

/// Whether `name` can be a job server's name in a token and a certificate
/// (the signer's identity rule: letters, digits, '-', '.', '_').
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        && !name.starts_with(['-', '.'])
}

/// Makes a one-time enrollment token for the new job server `name`, valid
/// for `ttl`.
pub async fn create_token(db: &Db, name: &str, ttl: Duration) -> Result<NewToken, sqlx::Error> {
    create_token_for(db, name, ttl, Purpose::New).await
}

/// Makes a one-time enrollment token for job server `name` and `purpose`,
/// valid for `ttl`. Only that name can enroll with it.
pub async fn create_token_for(
    db: &Db,
    name: &str,
    ttl: Duration,
    purpose: Purpose,
) -> Result<NewToken, sqlx::Error> {
    let key = secrets::new_api_key();
    let prefix = format!("mpe{}", &key.prefix[2..]);
    let token = format!("{prefix}{}", &key.key[key.prefix.len()..]);
    let expires = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::try_from(ttl).unwrap_or(jiff::SignedDuration::ZERO))
        .unwrap_or(jiff::Timestamp::MAX);
    let expires_at = format_ts(expires);
    let mut sql = db.sql();
    sql.push(
        "INSERT INTO enroll_tokens (name, prefix, hash, created_at, expires_at, purpose) VALUES ",
    )
    .bind_list([
        Val::Text(Some(name.to_owned())),
        Val::Text(Some(prefix)),
        Val::Text(Some(key.hash)),
        Val::Text(Some(now())),
        Val::Text(Some(expires_at.clone())),
        Val::Text(Some(purpose.as_str().to_owned())),
    ]);
    sql.query().execute(db.pool()).await?;
    Ok(NewToken { token, expires_at })
}

/// What a presented enrollment token is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// Not one of ours (or the secret does not match).
    Unknown,
    /// Already used, at this time.
    Used(String),
    /// Good until this time (it may have passed).
    Unused {
        /// The token's prefix.
        prefix: String,
        /// When it expires.
        expires_at: String,
        /// The job server's name it was made for.
        name: String,
        /// Whether it may replace a live certificate.
        purpose: Purpose,
    },
}

async fn token_state(db: &Db, token: &str) -> Result<Token, sqlx::Error> {
    let Some((prefix, secret)) = secrets::split_api_key(token.trim()) else {
        return Ok(Token::Unknown);
    };
    let select =
        "SELECT hash, expires_at, used_at, name, purpose FROM enroll_tokens WHERE prefix = ";
    let Some(row) = db.row_where(select, prefix).await? else {
        return Ok(Token::Unknown);
    };
    let hash: String = row.try_get("hash")?;
    if !secrets::hashes_equal(&secrets::hash_api_secret(secret), &hash) {
        return Ok(Token::Unknown);
    }
    Ok(
        match row.try_get::<Option<String>, _>("used_at").unwrap_or(None) {
            Some(at) => Token::Used(at),
            None => Token::Unused {
                prefix: prefix.to_owned(),
                expires_at: row.try_get("expires_at")?,
                name: row.try_get("name")?,
                purpose: match row.try_get::<String, _>("purpose")?.as_str() {
                    "replace" => Purpose::Replace,
                    _ => Purpose::New,
                },
            },
        },
    )
}

/// Whether `token` is known, unused, made for `name`, and good for at
/// least another hour.
pub async fn token_usable(db: &Db, token: &str, name: &str) -> Result<bool, sqlx::Error> {
    let soon = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_hours(1))
        .map(format_ts)
        .unwrap_or_default();
    Ok(
        matches!(token_state(db, token).await?, Token::Unused { expires_at, name: n, .. } if expires_at > soon && n == name),
    )
}

/// Whether any job server holds a certificate that is not revoked.
pub async fn jobserver_enrolled(db: &Db) -> Result<bool, sqlx::Error> {
    let mut sql = db.sql();
    sql.push("SELECT COUNT(*) AS n FROM credentials WHERE kind = ");
    sql.bind(Val::Text(Some("jobserver".into())));
    sql.push(" AND revoked_at IS NULL");
    let row = sql.query().fetch_one(db.pool()).await?;
    Ok(crate::db::int(&row, "n")? > 0)
}

/// `POST /enroll/jobserver/`: spends the token made for `body.name` and
/// has the helper sign the job server's CSR, valid `cert_seconds`.
pub async fn enroll_jobserver(
    db: &Db,
    signer: Option<&SignerClient>,
    cert_seconds: u64,
    body: JobserverEnrollment,
) -> Result<Enrolled, EnrollError> {
    let prefix = match token_state(db, &body.token).await? {
        Token::Unknown => return Err(EnrollError::TokenUnknown),
        Token::Used(at) => {
            tracing::warn!("enrollment: a used token was presented again");
            return Err(EnrollError::TokenUsed(at));
        }
        Token::Unused { expires_at, .. } if expires_at <= now() => {
            return Err(EnrollError::TokenExpired(expires_at));
        }
        Token::Unused {
            name,
            purpose,
            prefix,
            ..
        } => {
            if name != body.name {
                tracing::warn!(token_for = %name, asked = %body.name, "enrollment: a token was presented for another name");
                return Err(EnrollError::TokenForAnotherName {
                    made_for: name,
                    asked: body.name,
                });
            }
            if purpose == Purpose::New && live_certificate(db, "jobserver", &body.name).await? {
                tracing::warn!(name = %body.name, "enrollment: a new-server token was presented for a live job server");
                return Err(EnrollError::JobServerLive { name: body.name });
            }
            prefix
        }
    };
    // Consume the token and record the certificate in one transaction.
    let consume = Consume::Token {
        prefix,
        by: body.name.clone(),
    };
    let (enrolled, serial) = issue_jobserver(
        db,
        signer,
        cert_seconds,
        &body.name,
        body.csr,
        Some(consume),
    )
    .await?;
    tracing::info!(name = %body.name, %serial, "enrollment: job server enrolled");
    Ok(enrolled)
}

/// `POST /enroll/jobserver/` without a token, on an admin's credentials
/// (`admin`, the name [`crate::access::may_enroll_jobserver`] gave, for the
/// log): the seed's `apikey` enrolls its job server. As a token for a new
/// job server would: the name must be one, and a name that holds a valid
/// certificate is not taken over ([`EnrollError::JobServerLive`]); the
/// helper signs the job server's CSR (its key stays with it), valid
/// `cert_seconds`, and the certificate is recorded.
pub async fn enroll_jobserver_by_admin(
    db: &Db,
    signer: Option<&SignerClient>,
    cert_seconds: u64,
    admin: &str,
    body: JobserverEnrollment,
) -> Result<Enrolled, EnrollError> {
    if !valid_name(&body.name) {
        return Err(EnrollError::NameInvalid(body.name));
    }
    if live_certificate(db, "jobserver", &body.name).await? {
        tracing::warn!(name = %body.name, %admin, "enrollment: an admin's enrollment was presented for a live job server");
        return Err(EnrollError::JobServerLive { name: body.name });
    }
    let (enrolled, serial) =
        issue_jobserver(db, signer, cert_seconds, &body.name, body.csr, None).await?;
    tracing::info!(name = %body.name, %serial, %admin, "enrollment: job server enrolled on an admin's credentials");
    Ok(enrolled)
}

/// Signs job server `name`'s CSR, valid `cert_seconds`, and records the
/// certificate (consuming `consume` in the same transaction); the
/// certificate and its serial.
async fn issue_jobserver(
    db: &Db,
    signer: Option<&SignerClient>,
    cert_seconds: u64,
    name: &str,
    csr: String,
    consume: Option<Consume>,
) -> Result<(Enrolled, String), EnrollError> {
    let (enrolled, serial) = issue_agent_certificate(
        signer,
        Profile::Jobserver,
        name,
        csr,
        Validity::Seconds(cert_seconds),
    )
    .await?;
    commit_enrollment(
        db,
        consume,
        Profile::Jobserver,
        name,
        &serial,
        &enrolled.not_after,
    )
    .await?;
    Ok((enrolled, serial))
}

/// Whether `identity` holds a certificate that is not revoked.
async fn live_certificate(db: &Db, kind: &str, identity: &str) -> Result<bool, sqlx::Error> {
    let mut sql = db.sql();
    sql.push("SELECT COUNT(*) AS n FROM credentials WHERE revoked_at IS NULL AND kind = ");
    sql.bind(Val::Text(Some(kind.to_owned())));
    sql.push(" AND identity = ");
    sql.bind(Val::Text(Some(identity.to_owned())));
    let row = sql.query().fetch_one(db.pool()).await?;
    Ok(crate::db::int(&row, "n")? > 0)
}

/// `UPDATE credentials` marking unrevoked rows revoked now for `reason`;
/// the caller appends `AND ...` conditions that pick the rows.
fn revoke_sql(db: &Db, reason: &str) -> Sql {
    let mut sql = db.sql();
    sql.push("UPDATE credentials SET revoked_at = ");
    sql.bind(Val::Text(Some(now())));
    sql.push(", revoke_reason = ");
    sql.bind(Val::Text(Some(reason.to_owned())));
    sql.push(" WHERE revoked_at IS NULL");
    sql
}

/// Revokes the certificate with `serial`; whether one was revoked.
pub async fn revoke_serial(db: &Db, serial: &str, reason: &str) -> Result<bool, sqlx::Error> {
    let mut sql = revoke_sql(db, reason);
    sql.push(" AND serial = ");
    sql.bind(Val::Text(Some(serial.to_ascii_lowercase())));
    Ok(sql.query().execute(db.pool()).await?.rows_affected() == 1)
}

/// How long a node's enrollment nonce is good for.
pub const NONCE_TTL: Duration = Duration::from_secs(15 * 60);
/// How long a node's certificate is valid by default
/// (`MPROV_NODE_CERT_SECONDS` sets it).
pub const NODE_DAYS: u32 = crate::config::NODE_DAYS;

/// Mints a one-time enrollment nonce bound to `system_id`; only its hash
/// is kept. In the same transaction it cancels the system's earlier unused
/// nonces (only the newest boot can enroll) and deletes every expired row,
/// so the table holds at most one live nonce per system plus the used ones
/// of the last [`NONCE_TTL`] (kept to recognise a replay).
pub async fn mint_nonce(db: &Db, system_id: i64) -> Result<String, EnrollError> {
    db.mint_nonce(
        "enroll_nonces",
        "system_id",
        Val::Int(Some(system_id)),
        NONCE_TTL,
    )
    .await
}

/// `POST /enroll/node/`: a certificate naming the system the nonce was
/// minted for, and only it.
/// The certificate lasts `cert_seconds`.
pub async fn enroll_node(
    db: &Db,
    signer: Option<&SignerClient>,
    cert_seconds: u64,
    body: NodeEnrollment,
) -> Result<Enrolled, EnrollError> {
    let hash = secrets::hash_api_secret(body.nonce.trim());
    let select = "SELECT n.system_id AS system_id, n.expires_at AS expires_at, n.used_at AS used_at, s.hostname AS hostname FROM enroll_nonces n JOIN systems s ON s.id = n.system_id WHERE n.hash = ";
    let row = db
        .row_where(select, &hash)
        .await?
        .ok_or(EnrollError::NonceUnknown)?;
    let used: Option<String> = row.try_get("used_at").unwrap_or(None);
    if let Some(at) = used {
        tracing::warn!("enrollment: a used nonce was presented again");
        // On the node's timeline: a replayed boot command line.
        let replay = crate::boot::NewEvent {
            system_id: crate::db::int(&row, "system_id").ok(),
            mac: None,
            phase: mprov_api::boot::BootPhase::Failed,
            source: "control".into(),
            jobserver_id: None,
            ip: None,
            detail: format!(
                "refused an enrollment with a nonce already used at {at}: a replayed boot command line? Boot the node through /ipxe/ for a new one"
            ),
        };
        if let Err(e) = crate::boot::record(db, replay).await {
            tracing::warn!(error = %e, "cannot record the refused replay");
        }
        return Err(EnrollError::NonceUsed(at));
    }
    let expires: String = row.try_get("expires_at")?;
    if expires <= now() {
        return Err(EnrollError::NonceExpired(expires));
    }
    let hostname: String = row.try_get("hostname")?;
    let (enrolled, serial) = issue_agent_certificate(
        signer,
        Profile::Node,
        &hostname,
        body.csr,
        Validity::Seconds(cert_seconds),
    )
    .await?;
    let replaced = commit_enrollment(
        db,
        Some(Consume::Nonce { hash }),
        Profile::Node,
        &hostname,
        &serial,
        &enrolled.not_after,
    )
    .await?;
    tracing::info!(%hostname, %serial, "enrollment: node enrolled");
    // On the node's timeline: a live certificate replaced by this one (a
    // reinstall, or someone else holding the node's nonce).
    for (old, issued) in replaced {
        tracing::warn!(%hostname, serial = %old, "enrollment: a live node certificate was replaced by a new enrollment");
        let event = crate::boot::NewEvent {
            system_id: crate::db::int(&row, "system_id").ok(),
            mac: None,
            phase: mprov_api::boot::BootPhase::Enrolled,
            source: "control".into(),
            jobserver_id: None,
            ip: None,
            detail: format!(
                "replaced certificate serial {old} issued at {issued} (revoked) with serial {serial}"
            ),
        };
        if let Err(e) = crate::boot::record(db, event).await {
            tracing::warn!(error = %e, "cannot record the replaced certificate");
        }
    }
    Ok(enrolled)
}

/// `POST /enroll/renew/`: over mTLS, a new certificate for the same
/// identity as `machine`'s; the one presented (and any other of the
/// identity's) is revoked in the same transaction as the new one is
/// recorded. A node's lasts `node_seconds`, a job server's
/// `jobserver_seconds`.
pub async fn renew(
    db: &Db,
    signer: Option<&SignerClient>,
    node_seconds: u64,
    jobserver_seconds: u64,
    machine: &Machine,
    csr: String,
) -> Result<Enrolled, EnrollError> {
    let validity = match machine.profile {
        Profile::Node => Validity::Seconds(node_seconds),
        _ => Validity::Seconds(jobserver_seconds),
    };
    let (enrolled, serial) =
        issue_agent_certificate(signer, machine.profile, &machine.identity, csr, validity).await?;
    commit_enrollment(
        db,
        None,
        machine.profile,
        &machine.identity,
        &serial,
        &enrolled.not_after,
    )
    .await?;
    tracing::info!(kind = %machine.profile.as_str(), identity = %machine.identity, %serial, "enrollment: renewed");
    Ok(enrolled)
}

/// How long a certificate asked of the helper lasts, in seconds (each kind's
/// validity is a setting: `MPROV_NODE_CERT_SECONDS`,
/// `MPROV_JOBSERVER_CERT_SECONDS`).
#[derive(Debug, Clone, Copy)]
enum Validity {
    Seconds(u64),
}

/// Has the helper sign `csr` for the agent `identity` (a node or a job
/// server, per `profile`): the reply for the agent, and the certificate's
/// serial. A refusal carries the helper's reason.
async fn issue_agent_certificate(
    signer: Option<&SignerClient>,
    profile: Profile,
    identity: &str,
    csr: String,
    validity: Validity,
) -> Result<(Enrolled, String), EnrollError> {
    let signer = signer.ok_or(EnrollError::NoSigner)?;
    if csr.len() > MAX_CSR_BYTES {
        tracing::warn!(
            kind = %profile.as_str(),
            %identity,
            size = csr.len(),
            "enrollment: a CSR over the size limit is refused"
        );
        return Err(EnrollError::CsrTooLarge { size: csr.len() });
    }
    let request = SignRequest {
        profile,
        identity: identity.to_owned(),
        names: Vec::new(),
        csr_pem: csr,
        days: match validity {
            Validity::Seconds(s) => u32::try_from(s.div_ceil(86_400)).unwrap_or(u32::MAX),
        },
        seconds: match validity {
            Validity::Seconds(s) => Some(s),
        },
        id: 0,
    };
    match signer.request_certificate(&request).await {
        Ok(SignReply::Signed {
            cert_pem,
            serial,
            not_after,
        }) => Ok((
            Enrolled {
                certificate: cert_pem,
                ca: signer.ca_pem().to_owned(),
                not_after: jiff::Timestamp::from_second(not_after)
                    .map(format_ts)
                    .unwrap_or_default(),
            },
            serial,
        )),
        Ok(SignReply::Refused { reason }) => Err(EnrollError::CsrRefused(reason)),
        Err(err) => {
            tracing::error!("enrollment: {err}");
            Err(EnrollError::SignerDown(err))
        }
    }
}

/// What an enrollment spends, in the same transaction as the record.
#[derive(Debug, Clone)]
enum Consume {
    /// A job server's token, by prefix, used by `by`.
    Token { prefix: String, by: String },
    /// A node's nonce, by hash.
    Nonce { hash: String },
}

/// How often a collision with a concurrent enrollment of the same identity
/// is tried again.
const COLLISION_RETRIES: u32 = 8;

/// How many revoked certificates of one identity are kept (the newest);
/// older rows are deleted when it gets a new one, so renewals cannot grow
/// the table without bound.
pub const KEEP_REVOKED: i64 = 10;

/// Spends `consume` (if any), revokes `identity`'s other certificates and
/// records the new one, in one transaction; returns the serials and issue
/// times of the live certificates it revoked. Revoked rows beyond
/// [`KEEP_REVOKED`] are deleted in the same transaction. The unique index over live rows
/// (migration 0003) makes two concurrent enrollments of one identity
/// collide instead of both leaving a valid certificate; the loser runs
/// again and then revokes the winner's, so exactly one stays valid.
async fn commit_enrollment(
    db: &Db,
    consume: Option<Consume>,
    profile: Profile,
    identity: &str,
    serial: &str,
    not_after: &str,
) -> Result<Vec<(String, String)>, EnrollError> {
    let kind = profile.as_str();
    let mut attempt = 0;
    loop {
        attempt += 1;
        match try_commit(db, consume.as_ref(), kind, identity, serial, not_after).await {
            Ok(Some(replaced)) => return Ok(replaced),
            Ok(None) => {
                return Err(match consume {
                    Some(Consume::Token { .. }) => EnrollError::TokenRaced,
                    _ => EnrollError::NonceRaced,
                });
            }
            Err(e) if crate::db::health::collision(&e) && attempt < COLLISION_RETRIES => {
                tracing::debug!(%identity, attempt, "enrollment: collided with another enrollment; again");
                tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
            }
            Err(e) if crate::db::health::collision(&e) => {
                return Err(EnrollError::EnrollmentCollided {
                    identity: identity.to_owned(),
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// One attempt of [`commit_enrollment`]: `None` if `consume` was already
/// spent, else the live certificates it revoked.
async fn try_commit(
    db: &Db,
    consume: Option<&Consume>,
    kind: &str,
    identity: &str,
    serial: &str,
    not_after: &str,
) -> Result<Option<Vec<(String, String)>>, sqlx::Error> {
    let mut tx = db.pool().begin().await?;
    if let Some(consume) = consume {
        let mut sql = db.sql();
        match consume {
            Consume::Token { prefix, by } => {
                sql.push("UPDATE enroll_tokens SET used_at = ");
                sql.bind(Val::Text(Some(now())));
                sql.push(", used_by = ");
                sql.bind(Val::Text(Some(by.clone())));
                sql.push(" WHERE prefix = ");
                sql.bind(Val::Text(Some(prefix.clone())));
            }
            Consume::Nonce { hash } => {
                sql.push("UPDATE enroll_nonces SET used_at = ");
                sql.bind(Val::Text(Some(now())));
                sql.push(" WHERE hash = ");
                sql.bind(Val::Text(Some(hash.clone())));
            }
        }
        sql.push(" AND used_at IS NULL");
        if sql.query().execute(&mut *tx).await?.rows_affected() != 1 {
            return Ok(None);
        }
    }
    let mut live = db.sql();
    live.push("SELECT serial, created_at FROM credentials WHERE revoked_at IS NULL AND kind = ")
        .bind(Val::Text(Some(kind.to_owned())))
        .push(" AND identity = ")
        .bind(Val::Text(Some(identity.to_owned())));
    let mut replaced = Vec::new();
    for r in live.query().fetch_all(&mut *tx).await? {
        replaced.push((
            r.try_get::<String, _>("serial")?,
            r.try_get::<Option<String>, _>("created_at")?
                .unwrap_or_default(),
        ));
    }
    let mut sql = revoke_sql(db, "enrolled again");
    sql.push(" AND kind = ");
    sql.bind(Val::Text(Some(kind.to_owned())));
    sql.push(" AND identity = ");
    sql.bind(Val::Text(Some(identity.to_owned())));
    sql.query().execute(&mut *tx).await?;
    let mut sql = db.sql();
    sql.push("INSERT INTO credentials (serial, kind, identity, not_after, created_at) VALUES ")
        .bind_list([
            Val::Text(Some(serial.to_owned())),
            Val::Text(Some(kind.to_owned())),
            Val::Text(Some(identity.to_owned())),
            Val::Text(Some(not_after.to_owned())),
            Val::Text(Some(now())),
        ]);
    sql.query().execute(&mut *tx).await?;
    // The newest KEEP_REVOKED revoked rows stay, as history; the derived
    // table lets MariaDB read the table it deletes from.
    let mut prune = db.sql();
    let who = |q: &mut Sql| {
        q.push(" kind = ")
            .bind(Val::Text(Some(kind.to_owned())))
            .push(" AND identity = ")
            .bind(Val::Text(Some(identity.to_owned())))
            .push(" AND revoked_at IS NOT NULL");
    };
    prune.push("DELETE FROM credentials WHERE");
    who(&mut prune);
    prune.push(" AND id NOT IN (SELECT id FROM (SELECT id FROM credentials WHERE");
    who(&mut prune);
    prune.push(&format!(" ORDER BY id DESC LIMIT {KEEP_REVOKED}) AS kept)"));
    prune.query().execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(Some(replaced))
}

/// `POST /api/v1/enroll-tokens/` (admin): a new token, shown once.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// The job server's name: only it can enroll with the token.
    #[serde(default)]
    pub name: String,
    /// Hours until it expires (default 24).
    #[serde(default)]
    pub hours: Option<u32>,
    /// `new` (default) or `replace` (a new certificate for a live job
    /// server).
    #[serde(default)]
    pub purpose: Option<Purpose>,
}

/// `POST /api/v1/enroll-tokens/`: checks the request and makes the token.
pub async fn new_token(db: &Db, body: TokenRequest) -> Result<NewToken, EnrollError> {
    let hours = body.hours.unwrap_or(24);
    if hours == 0 || hours > MAX_TOKEN_HOURS {
        return Err(EnrollError::TokenHoursOutOfRange(hours));
    }
    if !valid_name(&body.name) {
        return Err(EnrollError::NameInvalid(body.name));
    }
    let ttl = Duration::from_secs(u64::from(hours) * 3600);
    Ok(create_token_for(db, &body.name, ttl, body.purpose.unwrap_or(Purpose::New)).await?)
}

/// One issued certificate, as the API lists it.
#[derive(Debug, Serialize)]
pub struct Credential {
    /// Row id.
    pub id: i64,
    /// Serial number, hex.
    pub serial: String,
    /// `node` or `jobserver`.
    pub kind: String,
    /// The node's or job server's name.
    pub identity: String,
    /// When it ends.
    pub not_after: String,
    /// When it was issued.
    pub created_at: String,
    /// When it was revoked, if it was.
    pub revoked_at: Option<String>,
    /// Why.
    pub revoke_reason: Option<String>,
}

/// `GET /api/v1/credentials/`: every certificate issued to an agent,
/// newest first; the `identity` and `kind` filters narrow it.
pub async fn list_credentials<'a>(
    db: &Db,
    filters: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<Vec<Credential>, EnrollError> {
    let mut sql = db.sql();
    sql.push("SELECT id, serial, kind, identity, not_after, created_at, revoked_at, revoke_reason FROM credentials WHERE 1 = 1");
    for (field, value) in filters {
        match field.as_str() {
            "identity" | "kind" => {
                sql.push(&format!(" AND {field} = "));
                sql.bind(Val::Text(Some(value.clone())));
            }
            other => {
                return Err(EnrollError::FilterUnknown(other.to_owned()));
            }
        }
    }
    sql.push(" ORDER BY id DESC");
    let rows = sql.query().fetch_all(db.pool()).await?;
    let mut items = Vec::with_capacity(rows.len());
    for row in &rows {
        items.push(Credential {
            id: crate::db::int(row, "id")?,
            serial: row.try_get("serial")?,
            kind: row.try_get("kind")?,
            identity: row.try_get("identity")?,
            not_after: row.try_get("not_after")?,
            created_at: row.try_get("created_at")?,
            revoked_at: row.try_get("revoked_at").unwrap_or(None),
            revoke_reason: row.try_get("revoke_reason").unwrap_or(None),
        });
    }
    Ok(items)
}

/// `POST /api/v1/credentials/{id}/revoke`: the certificate stops working at
/// once (every request checks the allow-list). Its serial, and whether it
/// was revoked now (not already).
pub async fn revoke_credential(db: &Db, id: i64) -> Result<(String, bool), EnrollError> {
    let mut sql = db.sql();
    sql.push("SELECT serial FROM credentials WHERE id = ");
    sql.bind(Val::Int(Some(id)));
    let serial: String = sql
        .query()
        .fetch_optional(db.pool())
        .await?
        .ok_or(EnrollError::CredentialUnknown(id))?
        .try_get("serial")?;
    let revoked = revoke_serial(db, &serial, "revoked by an administrator").await?;
    if revoked {
        tracing::info!(%serial, "credential revoked by an administrator");
    }
    Ok((serial, revoked))
}
