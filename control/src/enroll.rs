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

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use sqlx::Row as _;

use crate::db::crud::{format_ts, now};
use crate::db::{Db, Sql, Val};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::secrets;
use crate::signer::{Profile, SignReply, SignRequest};
use mprov_api::enroll::{Enrolled, JobserverEnrollment, NodeEnrollment, Renewal};

/// How long a job-server certificate is valid.
pub const JOBSERVER_DAYS: u32 = 90;
/// The same in seconds: the default and the most `MPROV_JOBSERVER_CERT_SECONDS` may ask.
pub const JOBSERVER_MAX_SECONDS: u64 = JOBSERVER_DAYS as u64 * 86_400;
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

/// Makes a one-time enrollment token named `name`, valid for `ttl`.
pub async fn create_token(db: &Db, name: &str, ttl: Duration) -> Result<NewToken, sqlx::Error> {
    let key = secrets::new_api_key();
    let prefix = format!("mpe{}", &key.prefix[2..]);
    let token = format!("{prefix}{}", &key.key[key.prefix.len()..]);
    let expires = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::try_from(ttl).unwrap_or(jiff::SignedDuration::ZERO))
        .unwrap_or(jiff::Timestamp::MAX);
    let expires_at = format_ts(expires);
    let mut sql = db.sql();
    sql.push("INSERT INTO enroll_tokens (name, prefix, hash, created_at, expires_at) VALUES ")
        .bind_list([
            Val::Text(Some(name.to_owned())),
            Val::Text(Some(prefix)),
            Val::Text(Some(key.hash)),
            Val::Text(Some(now())),
            Val::Text(Some(expires_at.clone())),
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
    },
}

async fn token_state(db: &Db, token: &str) -> Result<Token, sqlx::Error> {
    let Some((prefix, secret)) = secrets::split_api_key(token.trim()) else {
        return Ok(Token::Unknown);
    };
    let mut sql = db.sql();
    sql.push("SELECT hash, expires_at, used_at FROM enroll_tokens WHERE prefix = ");
    sql.bind(Val::Text(Some(prefix.to_owned())));
    let Some(row) = sql.query().fetch_optional(db.pool()).await? else {
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
            },
        },
    )
}

/// Whether `token` is known, unused, and good for at least another hour.
pub async fn token_usable(db: &Db, token: &str) -> Result<bool, sqlx::Error> {
    let soon = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_hours(1))
        .map(format_ts)
        .unwrap_or_default();
    Ok(
        matches!(token_state(db, token).await?, Token::Unused { expires_at, .. } if expires_at > soon),
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

/// `POST /enroll/jobserver/`.
pub async fn enroll_jobserver(
    State(st): State<AppState>,
    Json(body): Json<JobserverEnrollment>,
) -> Result<Json<Enrolled>, ApiError> {
    let refused = |m: &str| ApiError::Unauthorized(m.to_owned());
    let db = &st.db;
    let prefix = match token_state(db, &body.token).await.map_err(internal)? {
        Token::Unknown => return Err(refused("the enrollment token is not valid")),
        Token::Used(at) => {
            tracing::warn!("enrollment: a used token was presented again");
            return Err(refused(&format!(
                "this enrollment token was already used at {at}; make a new one"
            )));
        }
        Token::Unused { expires_at, .. } if expires_at <= now() => {
            return Err(refused(&format!(
                "this enrollment token expired at {expires_at}; make a new one"
            )));
        }
        Token::Unused { prefix, .. } => prefix,
    };
    let (enrolled, serial) = sign(
        &st,
        Profile::Jobserver,
        &body.name,
        body.csr,
        Validity::Seconds(st.config.jobserver_cert_seconds),
    )
    .await?;
    // Consume the token and record the certificate in one transaction.
    let mut tx = db.pool().begin().await.map_err(internal)?;
    let mut sql = db.sql();
    sql.push("UPDATE enroll_tokens SET used_at = ");
    sql.bind(Val::Text(Some(now())));
    sql.push(", used_by = ");
    sql.bind(Val::Text(Some(body.name.clone())));
    sql.push(" WHERE prefix = ");
    sql.bind(Val::Text(Some(prefix)));
    sql.push(" AND used_at IS NULL");
    let consumed = sql.query().execute(&mut *tx).await.map_err(internal)?;
    if consumed.rows_affected() != 1 {
        return Err(refused(
            "this enrollment token was used by another request at the same time",
        ));
    }
    record(
        db,
        &mut tx,
        "jobserver",
        &body.name,
        &serial,
        &enrolled.not_after,
    )
    .await?;
    tx.commit().await.map_err(internal)?;
    tracing::info!(name = %body.name, %serial, "enrollment: job server enrolled");
    Ok(Json(enrolled))
}

async fn revoke_identity(
    db: &Db,
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    kind: &str,
    identity: &str,
    reason: &str,
) -> Result<(), ApiError> {
    let mut sql = revoke_sql(db, reason);
    sql.push(" AND kind = ");
    sql.bind(Val::Text(Some(kind.to_owned())));
    sql.push(" AND identity = ");
    sql.bind(Val::Text(Some(identity.to_owned())));
    sql.query().execute(&mut **tx).await.map_err(internal)?;
    Ok(())
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

/// Who a client certificate names, once checked against the allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    /// `node` or `jobserver`.
    pub kind: String,
    /// The node's or job server's name.
    pub identity: String,
    /// The certificate's serial, hex.
    pub serial: String,
}

/// Checks a client certificate (DER, already verified to chain to the CA
/// by the TLS layer) against the allow-list.
pub async fn check_certificate(db: &Db, der: &[u8]) -> Result<Agent, ApiError> {
    use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};
    let bad = |m: &str| ApiError::Unauthorized(m.to_owned());
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
    let mut sql = db.sql();
    sql.push("SELECT kind, identity, revoked_at FROM credentials WHERE serial = ");
    sql.bind(Val::Text(Some(serial.clone())));
    let row = sql
        .query()
        .fetch_optional(db.pool())
        .await
        .map_err(internal)?
        .ok_or_else(|| bad("this client certificate was not issued by enrollment"))?;
    let revoked: Option<String> = row.try_get("revoked_at").unwrap_or(None);
    if let Some(at) = revoked {
        return Err(bad(&format!(
            "this client certificate was revoked at {at}; enroll again"
        )));
    }
    let (k, i): (String, String) = (
        row.try_get("kind").map_err(internal)?,
        row.try_get("identity").map_err(internal)?,
    );
    if k != kind || i != identity {
        return Err(bad("the client certificate does not match its record"));
    }
    Ok(Agent {
        kind: k,
        identity: i,
        serial,
    })
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(e.to_string())
}

/// How long a node's enrollment nonce is good for.
pub const NONCE_TTL: Duration = Duration::from_secs(15 * 60);
/// How long a node's certificate is valid.
pub const NODE_DAYS: u32 = 30;

/// Mints a one-time enrollment nonce bound to `system_id`; only its hash
/// is kept.
pub async fn mint_nonce(db: &Db, system_id: i64) -> Result<String, ApiError> {
    let nonce = secrets::random_token(24);
    let expires = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::try_from(NONCE_TTL).unwrap_or_default())
        .map(format_ts)
        .map_err(internal)?;
    let mut sql = db.sql();
    sql.push("INSERT INTO enroll_nonces (system_id, hash, created_at, expires_at) VALUES ")
        .bind_list([
            Val::Int(Some(system_id)),
            Val::Text(Some(secrets::hash_api_secret(&nonce))),
            Val::Text(Some(now())),
            Val::Text(Some(expires)),
        ]);
    sql.query().execute(db.pool()).await.map_err(internal)?;
    Ok(nonce)
}

/// `POST /enroll/node/`: a certificate naming the system the nonce was
/// minted for, and only it.
pub async fn enroll_node(
    State(st): State<AppState>,
    Json(body): Json<NodeEnrollment>,
) -> Result<Json<Enrolled>, ApiError> {
    let refused = |m: &str| ApiError::Unauthorized(m.to_owned());
    let db = &st.db;
    let hash = secrets::hash_api_secret(body.nonce.trim());
    let mut sql = db.sql();
    sql.push("SELECT n.system_id AS system_id, n.expires_at AS expires_at, n.used_at AS used_at, s.hostname AS hostname FROM enroll_nonces n JOIN systems s ON s.id = n.system_id WHERE n.hash = ");
    sql.bind(Val::Text(Some(hash.clone())));
    let row = sql
        .query()
        .fetch_optional(db.pool())
        .await
        .map_err(internal)?
        .ok_or_else(|| {
            refused("the enrollment nonce is not valid; boot the node again for a new one")
        })?;
    let used: Option<String> = row.try_get("used_at").unwrap_or(None);
    if let Some(at) = used {
        tracing::warn!("enrollment: a used nonce was presented again");
        return Err(refused(&format!(
            "this enrollment nonce was already used at {at}; boot the node again for a new one"
        )));
    }
    let expires: String = row.try_get("expires_at").map_err(internal)?;
    if expires <= now() {
        return Err(refused(&format!(
            "this enrollment nonce expired at {expires}; boot the node again for a new one"
        )));
    }
    let hostname: String = row.try_get("hostname").map_err(internal)?;
    let (enrolled, serial) = sign(
        &st,
        Profile::Node,
        &hostname,
        body.csr,
        Validity::Days(NODE_DAYS),
    )
    .await?;
    let mut tx = db.pool().begin().await.map_err(internal)?;
    let mut sql = db.sql();
    sql.push("UPDATE enroll_nonces SET used_at = ");
    sql.bind(Val::Text(Some(now())));
    sql.push(" WHERE hash = ");
    sql.bind(Val::Text(Some(hash)));
    sql.push(" AND used_at IS NULL");
    if sql
        .query()
        .execute(&mut *tx)
        .await
        .map_err(internal)?
        .rows_affected()
        != 1
    {
        return Err(refused(
            "this enrollment nonce was used by another request at the same time",
        ));
    }
    record(db, &mut tx, "node", &hostname, &serial, &enrolled.not_after).await?;
    tx.commit().await.map_err(internal)?;
    tracing::info!(%hostname, %serial, "enrollment: node enrolled");
    Ok(Json(enrolled))
}

/// `POST /enroll/renew/`: over mTLS, a new certificate for the same
/// identity; the one presented is revoked.
pub async fn renew(
    State(st): State<AppState>,
    axum::Extension(principal): axum::Extension<crate::http::auth::Principal>,
    Json(body): Json<Renewal>,
) -> Result<Json<Enrolled>, ApiError> {
    let crate::http::auth::Principal::Agent(agent) = principal else {
        return Err(ApiError::Forbidden(
            "renewal needs the client certificate being renewed".into(),
        ));
    };
    let (profile, validity) = match agent.kind.as_str() {
        "node" => (Profile::Node, Validity::Days(NODE_DAYS)),
        _ => (
            Profile::Jobserver,
            Validity::Seconds(st.config.jobserver_cert_seconds),
        ),
    };
    let (enrolled, serial) = sign(&st, profile, &agent.identity, body.csr, validity).await?;
    let db = &st.db;
    let mut tx = db.pool().begin().await.map_err(internal)?;
    record(
        db,
        &mut tx,
        &agent.kind,
        &agent.identity,
        &serial,
        &enrolled.not_after,
    )
    .await?;
    tx.commit().await.map_err(internal)?;
    tracing::info!(kind = %agent.kind, identity = %agent.identity, %serial, "enrollment: renewed");
    Ok(Json(enrolled))
}

/// How long a certificate asked of the helper lasts.
#[derive(Debug, Clone, Copy)]
enum Validity {
    Days(u32),
    Seconds(u64),
}

/// Has the helper sign `csr` for `identity`: the reply for the agent, and
/// the certificate's serial. A refusal is a 400 with the helper's reason.
async fn sign(
    st: &AppState,
    profile: Profile,
    identity: &str,
    csr: String,
    validity: Validity,
) -> Result<(Enrolled, String), ApiError> {
    let signer = st
        .signer
        .as_ref()
        .ok_or_else(|| ApiError::Internal("no signing helper".into()))?;
    let request = SignRequest {
        profile,
        identity: identity.to_owned(),
        names: Vec::new(),
        csr_pem: csr,
        days: match validity {
            Validity::Days(d) => d,
            Validity::Seconds(s) => u32::try_from(s.div_ceil(86_400)).unwrap_or(u32::MAX),
        },
        seconds: match validity {
            Validity::Days(_) => None,
            Validity::Seconds(s) => Some(s),
        },
    };
    match signer.sign(&request).await {
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
        Ok(SignReply::Refused { reason }) => Err(ApiError::bad_request("csr_refused", reason)),
        Err(err) => Err(ApiError::Internal(err.to_string())),
    }
}

/// Records a new certificate of `identity`, revoking its older ones.
async fn record(
    db: &Db,
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    kind: &str,
    identity: &str,
    serial: &str,
    not_after: &str,
) -> Result<(), ApiError> {
    revoke_identity(db, tx, kind, identity, "enrolled again").await?;
    let mut sql = db.sql();
    sql.push("INSERT INTO credentials (serial, kind, identity, not_after, created_at) VALUES ")
        .bind_list([
            Val::Text(Some(serial.to_owned())),
            Val::Text(Some(kind.to_owned())),
            Val::Text(Some(identity.to_owned())),
            Val::Text(Some(not_after.to_owned())),
            Val::Text(Some(now())),
        ]);
    sql.query().execute(&mut **tx).await.map_err(internal)?;
    Ok(())
}

/// `POST /api/v1/enroll-tokens/` (admin): a new token, shown once.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// What the token is for.
    #[serde(default)]
    pub name: String,
    /// Hours until it expires (default 24).
    #[serde(default)]
    pub hours: Option<u32>,
}

/// `POST /api/v1/enroll-tokens/`.
pub async fn new_token(
    State(st): State<AppState>,
    Json(body): Json<TokenRequest>,
) -> Result<Json<NewToken>, ApiError> {
    let hours = body.hours.unwrap_or(24);
    if hours == 0 || hours > 24 * 30 {
        return Err(ApiError::invalid("hours", "between 1 and 720 hours"));
    }
    let ttl = Duration::from_secs(u64::from(hours) * 3600);
    let token = create_token(&st.db, &body.name, ttl)
        .await
        .map_err(internal)?;
    Ok(Json(token))
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
/// newest first; `?identity=` and `?kind=` narrow it.
pub async fn list_credentials(
    State(st): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let db = &st.db;
    let mut sql = db.sql();
    sql.push("SELECT id, serial, kind, identity, not_after, created_at, revoked_at, revoke_reason FROM credentials WHERE 1 = 1");
    for (field, value) in &q {
        match field.as_str() {
            "identity" | "kind" => {
                sql.push(&format!(" AND {field} = "));
                sql.bind(Val::Text(Some(value.clone())));
            }
            other => {
                return Err(ApiError::invalid(other, "filter by identity or kind"));
            }
        }
    }
    sql.push(" ORDER BY id DESC");
    let rows = sql.query().fetch_all(db.pool()).await.map_err(internal)?;
    let mut items = Vec::with_capacity(rows.len());
    for row in &rows {
        items.push(Credential {
            id: crate::db::int(row, "id").map_err(internal)?,
            serial: row.try_get("serial").map_err(internal)?,
            kind: row.try_get("kind").map_err(internal)?,
            identity: row.try_get("identity").map_err(internal)?,
            not_after: row.try_get("not_after").map_err(internal)?,
            created_at: row.try_get("created_at").map_err(internal)?,
            revoked_at: row.try_get("revoked_at").unwrap_or(None),
            revoke_reason: row.try_get("revoke_reason").unwrap_or(None),
        });
    }
    let total = items.len();
    Ok(Json(serde_json::json!({"items": items, "total": total})))
}

/// `POST /api/v1/credentials/{id}/revoke`: the certificate stops working at
/// once (every request checks the allow-list).
pub async fn revoke_credential(
    State(st): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::invalid("id", "a credential's numeric id"))?;
    let db = &st.db;
    let mut sql = db.sql();
    sql.push("SELECT serial FROM credentials WHERE id = ");
    sql.bind(Val::Int(Some(id)));
    let serial: String = sql
        .query()
        .fetch_optional(db.pool())
        .await
        .map_err(internal)?
        .ok_or_else(|| ApiError::NotFound(format!("no credential {id}")))?
        .try_get("serial")
        .map_err(internal)?;
    let revoked = revoke_serial(db, &serial, "revoked by an administrator")
        .await
        .map_err(internal)?;
    if revoked {
        tracing::info!(%serial, "credential revoked by an administrator");
    }
    Ok(Json(
        serde_json::json!({"id": id, "serial": serial, "revoked": true, "already": !revoked}),
    ))
}
