//! Admin page sessions: who signed in to the pages, how, and until when.
//!
//! A sign-in (password, LDAP or passkey: each is checked elsewhere) starts a
//! session: the browser gets a random token in a cookie, the `sessions` row
//! keeps only its SHA-256, so a copy of the database signs nobody in. A
//! session ends after `SESSION_EXPIRE_SECONDS` without a request (its
//! `seen_at`, moved forward at most once a second) or when signed out, on
//! the server: the token is then worth nothing even if kept. Each session
//! has its own CSRF token, which every form it posts must carry.
//!
//! No HTTP here: `http/admin/` reads the cookie and calls these.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::db::{Db, Val};
use crate::identity::Principal;
use crate::secrets;

/// How someone signed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// A user name and password from the `users` table.
    Password,
    /// A directory bind (`LDAP_*`).
    Ldap,
    /// A passkey registered from an earlier session.
    Passkey,
}

impl Method {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Password => "password",
            Method::Ldap => "ldap",
            Method::Passkey => "passkey",
        }
    }

    fn parse(s: &str) -> Method {
        match s {
            "ldap" => Method::Ldap,
            "passkey" => Method::Passkey,
            _ => Method::Password,
        }
    }
}

/// A live session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Who.
    pub username: String,
    /// Whether they may change things (else they only read).
    pub admin: bool,
    /// How they signed in.
    pub method: Method,
    /// The token every form of this session carries.
    pub csrf: String,
}

impl Session {
    /// The principal the access rules see: the same as the user's password
    /// on the API, so the pages and the API share every rule.
    pub fn principal(&self) -> Principal {
        Principal::User {
            username: self.username.clone(),
            is_admin: self.admin,
        }
    }

    /// Whether `sent` is this session's CSRF token (in constant time).
    pub fn csrf_matches(&self, sent: &str) -> bool {
        secrets::hashes_equal(&self.csrf, sent)
    }
}

/// A session just started: the cookie's token (shown once) and the session.
#[derive(Debug, Clone)]
pub struct Started {
    /// The cookie's value.
    pub token: String,
    /// The session.
    pub session: Session,
}

fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Starts a session for `username`.
pub async fn start(
    db: &Db,
    username: &str,
    admin: bool,
    method: Method,
    now: jiff::Timestamp,
) -> Result<Started, sqlx::Error> {
    let token = secrets::random_token(32);
    let csrf = secrets::random_token(32);
    let at = crate::time::format_ts(now);
    let mut ins = db.sql();
    ins.push(
        "INSERT INTO sessions (id, username, role, method, csrf, created_at, seen_at) VALUES ",
    )
    .bind_list([
        Val::Text(Some(token_hash(&token))),
        Val::Text(Some(username.to_owned())),
        Val::Text(Some(role(admin).to_owned())),
        Val::Text(Some(method.as_str().to_owned())),
        Val::Text(Some(csrf.clone())),
        Val::Text(Some(at.clone())),
        Val::Text(Some(at)),
    ]);
    ins.query().execute(db.pool()).await?;
    Ok(Started {
        token,
        session: Session {
            username: username.to_owned(),
            admin,
            method,
            csrf,
        },
    })
}

fn role(admin: bool) -> &'static str {
    if admin { "admin" } else { "readonly" }
}

/// Whether a session last seen at `seen_at` has ended by `now`.
pub fn expired(seen_at: jiff::Timestamp, now: jiff::Timestamp, idle: Duration) -> bool {
    let idle = jiff::SignedDuration::try_from(idle).unwrap_or(jiff::SignedDuration::MAX);
    now.duration_since(seen_at) >= idle
}

/// The live session of the cookie `token`, if any, marked as seen at `now`.
/// An idle one is deleted, so it cannot come back.
pub async fn resume(
    db: &Db,
    token: &str,
    idle: Duration,
    now: jiff::Timestamp,
) -> Result<Option<Session>, sqlx::Error> {
    let id = token_hash(token);
    let mut q = db.sql();
    q.push("SELECT username, role, method, csrf, seen_at FROM sessions WHERE id = ")
        .bind(Val::Text(Some(id.clone())));
    let Some(row) = db.fetch_optional(&q).await? else {
        return Ok(None);
    };
    use sqlx::Row as _;
    let seen_at: String = row.try_get("seen_at")?;
    let seen = seen_at.parse::<jiff::Timestamp>().unwrap_or_default();
    if expired(seen, now, idle) {
        end_by_id(db, &id).await?;
        return Ok(None);
    }
    let at = crate::time::format_ts(now);
    if at != seen_at {
        let mut upd = db.sql();
        upd.push("UPDATE sessions SET seen_at = ")
            .bind(Val::Text(Some(at)))
            .push(" WHERE id = ")
            .bind(Val::Text(Some(id)));
        upd.query().execute(db.pool()).await?;
    }
    let role: String = row.try_get("role")?;
    let method: String = row.try_get("method")?;
    Ok(Some(Session {
        username: row.try_get("username")?,
        admin: role == "admin",
        method: Method::parse(&method),
        csrf: row.try_get("csrf")?,
    }))
}

/// Ends the session of the cookie `token` (signing out).
pub async fn end(db: &Db, token: &str) -> Result<(), sqlx::Error> {
    end_by_id(db, &token_hash(token)).await
}

async fn end_by_id(db: &Db, id: &str) -> Result<(), sqlx::Error> {
    let mut del = db.sql();
    del.push("DELETE FROM sessions WHERE id = ")
        .bind(Val::Text(Some(id.to_owned())));
    del.query().execute(db.pool()).await?;
    Ok(())
}

/// Deletes the sessions idle for longer than `idle` at `now`; how many.
pub async fn prune(db: &Db, idle: Duration, now: jiff::Timestamp) -> Result<u64, sqlx::Error> {
    let idle = jiff::SignedDuration::try_from(idle).unwrap_or(jiff::SignedDuration::MAX);
    let cutoff = now.checked_sub(idle).unwrap_or(jiff::Timestamp::MIN);
    let mut del = db.sql();
    del.push("DELETE FROM sessions WHERE seen_at <= ")
        .bind(Val::Text(Some(crate::time::format_ts(cutoff))));
    Ok(del.query().execute(db.pool()).await?.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_ends_after_its_idle_time() {
        let seen: jiff::Timestamp = "2026-12-03T10:00:00Z".parse().unwrap();
        let idle = Duration::from_secs(1800);
        let at = |s: &str| s.parse::<jiff::Timestamp>().unwrap();
        assert!(!expired(seen, at("2026-12-03T10:29:59Z"), idle));
        assert!(expired(seen, at("2026-12-03T10:30:00Z"), idle));
        assert!(!expired(seen, seen, idle));
    }

    #[test]
    fn the_stored_id_is_not_the_token() {
        let t = secrets::random_token(32);
        assert_ne!(token_hash(&t), t);
        assert_eq!(token_hash(&t).len(), 64);
    }
}
