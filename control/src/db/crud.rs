//! Generic list, get, create, update and delete for every kind in [`KINDS`].
//!
//! Requests arrive as JSON objects and leave as JSON objects; this module turns
//! them into validated, typed values ([`validate`]), resolves references given
//! by slug, and writes them in one transaction that also bumps the inventory
//! revision. Reads load a page of rows with one query, then each relation of the
//! whole page with one more query per relation: never a query per row.
//!
//! This layer knows nothing of HTTP: errors are [`StoreError`], which the HTTP
//! layer maps to status codes.
//!
//! [`KINDS`]: super::kinds::KINDS

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value, json};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::kinds::{self, Access, Children, Default, Field, Kind, ManyToMany, Ty};
use super::{Db, Engine, MAX_BINDS, Sql, Val, int, opt_bool, opt_int};
use crate::secrets::SecretBox;

/// A JSON object: a row as the API shows it, or a request body.
pub type Obj = Map<String, Value>;

/// The most rows one list page returns.
pub const MAX_LIMIT: u64 = 1000;
/// The page size when a list names none.
pub const DEFAULT_LIMIT: u64 = 100;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The row does not exist.
    #[error("no {kind} matches {key:?}")]
    NotFound {
        /// The kind.
        kind: &'static str,
        /// The id or slug asked for.
        key: String,
    },
    /// The request is wrong; `message` says how.
    #[error("{message}")]
    Invalid {
        /// The field at fault, when one is.
        field: Option<String>,
        /// What is wrong and what to do.
        message: String,
    },
    /// The request clashes with existing rows (a unique value taken).
    #[error("{message}")]
    Conflict {
        /// The field at fault, when one is.
        field: Option<String>,
        /// What clashes.
        message: String,
    },
    /// The database failed.
    #[error("database error")]
    Db(#[source] sqlx::Error),
    /// A password could not be hashed.
    #[error("password hashing failed: {0}")]
    Hash(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &err {
            if db.is_unique_violation() {
                return StoreError::Conflict {
                    field: None,
                    message: "a row with one of these unique values already exists".into(),
                };
            }
            if db.is_foreign_key_violation() {
                return StoreError::Conflict {
                    field: None,
                    message: "a referenced row does not exist (or was deleted meanwhile)".into(),
                };
            }
        }
        StoreError::Db(err)
    }
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> StoreError {
    let field = field.into();
    StoreError::Invalid {
        message: format!("{field}: {}", message.into()),
        field: Some(field),
    }
}

/// One field error, with the path to the field (`hostname`, `rows[3].nics[0].mac`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Where.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl FieldError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// One `Invalid` error for every field at fault: the first one's path as the
/// field, and a message naming each path with its problem.
pub fn field_errors(errors: Vec<FieldError>) -> StoreError {
    let field = errors.first().map(|e| e.path.clone());
    let message = match errors.as_slice() {
        [one] => format!("{}: {}", one.path, one.message),
        many => {
            let listed: Vec<String> = many
                .iter()
                .map(|e| format!("{}: {}", e.path, e.message))
                .collect();
            format!("{} errors: {}", many.len(), listed.join("; "))
        }
    };
    StoreError::Invalid { field, message }
}

/// A reference as a client wrote it: an id, or the slug of the target kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RefKey {
    /// A row id.
    Id(i64),
    /// The target kind's slug field.
    Slug(String),
}

impl RefKey {
    fn parse_value(v: &Value) -> Option<RefKey> {
        match v {
            Value::Number(n) => n.as_i64().map(RefKey::Id),
            Value::String(s) => Some(RefKey::parse_str(s)),
            _ => None,
        }
    }

    /// An id when `s` is all digits, else a slug.
    pub fn parse_str(s: &str) -> RefKey {
        match s.parse::<i64>() {
            Ok(id) if !s.starts_with('+') => RefKey::Id(id),
            _ => RefKey::Slug(s.to_owned()),
        }
    }

    fn show(&self) -> String {
        match self {
            RefKey::Id(id) => format!("id {id}"),
            RefKey::Slug(s) => format!("{s:?}"),
        }
    }
}

/// A validated value waiting to be written.
#[derive(Debug, Clone)]
enum Pending {
    Val(Val),
    Ref(Option<RefKey>),
    Password(String),
}

/// A validated request body.
#[derive(Debug, Clone)]
pub struct Prepared {
    cols: Vec<(&'static Field, Pending)>,
    m2m: Vec<(&'static ManyToMany, Vec<RefKey>)>,
    children: Vec<(&'static Children, Vec<Prepared>)>,
}

impl Prepared {
    fn value(&self, name: &str) -> Option<&Pending> {
        self.cols
            .iter()
            .find(|(f, _)| f.name == name)
            .map(|(_, v)| v)
    }

    /// The boolean value given for `name`, if any.
    fn bool(&self, name: &str) -> Option<bool> {
        match self.value(name) {
            Some(Pending::Val(Val::Bool(b))) => *b,
            _ => None,
        }
    }
}

/// Whether a body creates a row or changes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A new row: required fields must be there, defaults fill the rest.
    Create,
    /// A new child row inside its parent's body: the parent reference is implied.
    Child(&'static str),
    /// A change: only the fields given.
    Update,
}

/// Validates a request body against a kind.
pub fn validate(
    kind: &'static Kind,
    body: &Obj,
    mode: Mode,
    secrets: &SecretBox,
    path: &str,
) -> Result<Prepared, Vec<FieldError>> {
    let mut errors = Vec::new();
    let mut out = Prepared {
        cols: Vec::new(),
        m2m: Vec::new(),
        children: Vec::new(),
    };
    let at = |name: &str| {
        if path.is_empty() {
            name.to_owned()
        } else {
            format!("{path}.{name}")
        }
    };
    for (key, value) in body {
        if let Some(field) = kind.field(key) {
            if field.access == Access::ReadOnly {
                errors.push(FieldError::new(at(key), "is read-only; leave it out"));
                continue;
            }
            if mode == Mode::Child(field.name) {
                errors.push(FieldError::new(
                    at(key),
                    "is implied by the enclosing object; leave it out",
                ));
                continue;
            }
            match parse_field(field, value, secrets) {
                Ok(p) => out.cols.push((field, p)),
                Err(msg) => errors.push(FieldError::new(at(key), msg)),
            }
        } else if let Some(rel) = kind.relation(key) {
            match value.as_array() {
                Some(items) => {
                    let mut keys = Vec::with_capacity(items.len());
                    for (i, item) in items.iter().enumerate() {
                        match RefKey::parse_value(item) {
                            Some(k) => keys.push(k),
                            None => errors.push(FieldError::new(
                                format!("{}[{i}]", at(key)),
                                format!("expected the id or slug of one of {}", rel.kind),
                            )),
                        }
                    }
                    out.m2m.push((rel, keys));
                }
                None => errors.push(FieldError::new(
                    at(key),
                    format!("expected a list of ids or slugs of {}", rel.kind),
                )),
            }
        } else if let Some(child) = kind.children.iter().find(|c| c.name == key.as_str()) {
            if mode != Mode::Create {
                errors.push(FieldError::new(
                    at(key),
                    format!(
                        "can only be given on create; change them through /api/v1/{}/",
                        child.kind
                    ),
                ));
                continue;
            }
            let Some(child_kind) = kinds::kind(child.kind) else {
                continue;
            };
            match value.as_array() {
                Some(items) => {
                    let mut rows = Vec::new();
                    for (i, item) in items.iter().enumerate() {
                        let p = format!("{}[{i}]", at(key));
                        match item.as_object() {
                            Some(obj) => match validate(
                                child_kind,
                                obj,
                                Mode::Child(child.parent_field),
                                secrets,
                                &p,
                            ) {
                                Ok(prep) => rows.push(prep),
                                Err(mut e) => errors.append(&mut e),
                            },
                            None => errors.push(FieldError::new(p, "expected an object")),
                        }
                    }
                    out.children.push((child, rows));
                }
                None => errors.push(FieldError::new(at(key), "expected a list of objects")),
            }
        } else if key == "id" || (kind.timestamps && (key == "created_at" || key == "updated_at")) {
            errors.push(FieldError::new(at(key), "is read-only; leave it out"));
        } else {
            let known: Vec<&str> = writable_names(kind).collect();
            errors.push(FieldError::new(
                at(key),
                format!("unknown field; {} takes: {}", kind.name, known.join(", ")),
            ));
        }
    }
    if mode != Mode::Update {
        for field in kind.fields {
            if body.contains_key(field.name) || mode == Mode::Child(field.name) {
                continue;
            }
            let pending = match field.default {
                Default::None if field.access == Access::ReadOnly => continue,
                Default::None => {
                    errors.push(FieldError::new(at(field.name), "is required"));
                    continue;
                }
                Default::Null => match field.ty {
                    Ty::Ref(_) => Pending::Ref(None),
                    _ => Pending::Val(null_of(field.ty)),
                },
                Default::Bool(b) => Pending::Val(Val::Bool(Some(b))),
                Default::Int(i) => match field.ty {
                    Ty::Float => Pending::Val(Val::Float(Some(i as f64))),
                    _ => Pending::Val(Val::Int(Some(i))),
                },
                Default::Str(s) => Pending::Val(Val::Text(Some(s.to_owned()))),
                Default::EmptyList => Pending::Val(Val::Text(Some("[]".into()))),
            };
            out.cols.push((field, pending));
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Validates a body given as any JSON value, for callers that report errors as
/// one message (the command line, first start).
pub fn validate_value(
    kind: &'static Kind,
    body: &Value,
    mode: Mode,
    secrets: &SecretBox,
) -> Result<Prepared, StoreError> {
    let obj = body.as_object().ok_or_else(|| StoreError::Invalid {
        field: None,
        message: "expected a JSON object".into(),
    })?;
    validate(kind, obj, mode, secrets, "").map_err(field_errors)
}

/// The columns the server sets for a new API key: its prefix and hash.
pub fn api_key_columns(key: &crate::secrets::NewApiKey) -> Vec<Extra> {
    vec![
        ("prefix", Val::Text(Some(key.prefix.clone()))),
        ("hash", Val::Text(Some(key.hash.clone()))),
    ]
}

/// The names a client may write for a kind.
pub fn writable_names(kind: &'static Kind) -> impl Iterator<Item = &'static str> {
    kind.fields
        .iter()
        .filter(|f| f.access != Access::ReadOnly)
        .map(|f| f.name)
        .chain(kind.m2m.iter().map(|m| m.name))
        .chain(kind.children.iter().map(|c| c.name))
}

fn null_of(ty: Ty) -> Val {
    match ty {
        Ty::Bool => Val::Bool(None),
        Ty::Float => Val::Float(None),
        Ty::Int { .. } | Ty::Ref(_) => Val::Int(None),
        _ => Val::Text(None),
    }
}

fn parse_field(field: &Field, value: &Value, secrets: &SecretBox) -> Result<Pending, String> {
    if value.is_null() {
        return if field.nullable {
            Ok(match field.ty {
                Ty::Ref(_) => Pending::Ref(None),
                ty => Pending::Val(null_of(ty)),
            })
        } else {
            Err("must not be null".into())
        };
    }
    let text = |v: String| Ok(Pending::Val(Val::Text(Some(v))));
    let string = || value.as_str().ok_or_else(|| "expected a string".to_owned());
    match field.ty {
        Ty::Bool => value
            .as_bool()
            .map(|b| Pending::Val(Val::Bool(Some(b))))
            .ok_or_else(|| "expected true or false".into()),
        Ty::Enum(allowed) => {
            let s = string()?;
            if allowed.contains(&s) {
                text(s.to_owned())
            } else {
                Err(format!("expected one of {}", allowed.join(", ")))
            }
        }
        Ty::Float => value
            .as_f64()
            .filter(|f| f.is_finite())
            .map(|f| Pending::Val(Val::Float(Some(f))))
            .ok_or_else(|| "expected a number".into()),
        Ty::Hostname => text(parse_hostname(string()?)?),
        Ty::Int { min, max } => {
            let i = value
                .as_i64()
                .ok_or_else(|| "expected an integer".to_owned())?;
            if i < min || i > max {
                Err(format!("must be between {min} and {max}"))
            } else {
                Ok(Pending::Val(Val::Int(Some(i))))
            }
        }
        Ty::Ipv4 => {
            let s = string()?;
            let ip: Ipv4Addr = s
                .trim()
                .parse()
                .map_err(|_| format!("{s:?} is not an IPv4 address"))?;
            text(ip.to_string())
        }
        Ty::Ipv6 => {
            let s = string()?;
            let ip: Ipv6Addr = s
                .trim()
                .parse()
                .map_err(|_| format!("{s:?} is not an IPv6 address"))?;
            text(ip.to_string())
        }
        Ty::Json => text(value.to_string()),
        Ty::Mac => text(parse_mac(string()?)?),
        Ty::Password => {
            let s = string()?;
            if s.chars().count() < 8 {
                Err("must be at least 8 characters".into())
            } else {
                Ok(Pending::Password(s.to_owned()))
            }
        }
        Ty::Ref(target) => RefKey::parse_value(value)
            .map(|k| Pending::Ref(Some(k)))
            .ok_or_else(|| format!("expected the id or slug of one of {target}")),
        Ty::Secret => {
            let s = string()?;
            if s.len() > 1024 {
                return Err("must be at most 1024 bytes".into());
            }
            text(secrets.seal(s))
        }
        Ty::Slug => text(parse_slug(string()?)?),
        Ty::StrList => {
            let items = value
                .as_array()
                .ok_or_else(|| "expected a list of strings".to_owned())?;
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                let s = item
                    .as_str()
                    .ok_or_else(|| "expected a list of strings".to_owned())?;
                if s.is_empty() || s.len() > 255 {
                    return Err("each item must be 1 to 255 characters".into());
                }
                out.push(Value::String(s.to_owned()));
            }
            text(Value::Array(out).to_string())
        }
        Ty::Text { max } => {
            let s = string()?;
            if s.chars().count() > max {
                Err(format!("must be at most {max} characters"))
            } else {
                text(s.to_owned())
            }
        }
        Ty::Timestamp => {
            let s = string()?;
            let ts: jiff::Timestamp = s.parse().map_err(|_| {
                format!("{s:?} is not an RFC 3339 time such as 2026-01-31T12:00:00Z")
            })?;
            text(format_ts(ts))
        }
        Ty::Yaml => {
            let s = string()?;
            if s.len() > 1 << 20 {
                return Err("must be at most 1 MiB".into());
            }
            crate::effective::validate_config_params(s)?;
            text(s.to_owned())
        }
    }
}

/// Normalises a MAC address to lowercase `aa:bb:cc:dd:ee:ff`. Accepts `:` or `-`
/// separators, Cisco's `aabb.ccdd.eeff`, or 12 bare hex digits.
pub fn parse_mac(s: &str) -> Result<String, String> {
    let hex: String = s
        .trim()
        .chars()
        .filter(|c| !matches!(c, ':' | '-' | '.'))
        .collect();
    let ok_shape = {
        let t = s.trim();
        let seps: Vec<char> = t.chars().filter(|c| matches!(c, ':' | '-' | '.')).collect();
        seps.is_empty()
            || (seps.len() == 5 && t.split([':', '-']).all(|p| p.len() == 2))
            || (seps.len() == 2 && t.split('.').all(|p| p.len() == 4))
    };
    if hex.len() != 12 || !ok_shape || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "{s:?} is not a MAC address such as 52:54:00:12:34:56"
        ));
    }
    let lower = hex.to_ascii_lowercase();
    let parts: Vec<&str> = (0..6).map(|i| &lower[i * 2..i * 2 + 2]).collect();
    Ok(parts.join(":"))
}

/// Checks a host name (RFC 1123 labels) and lowercases it.
pub fn parse_hostname(s: &str) -> Result<String, String> {
    let t = s.trim_end_matches('.');
    let valid = !t.is_empty()
        && t.len() <= 253
        && t.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
    if valid {
        Ok(t.to_ascii_lowercase())
    } else {
        Err(format!(
            "{s:?} is not a valid host name: use letters, digits and '-', labels of 1 to 63 characters separated by '.'"
        ))
    }
}

/// Checks a slug: lowercase letters, digits, `-` and `_`, not all digits (so it
/// never reads as an id).
pub fn parse_slug(s: &str) -> Result<String, String> {
    let valid = !s.is_empty()
        && s.len() <= 255
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && !s.chars().all(|c| c.is_ascii_digit())
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    if valid {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a valid slug: use lowercase letters, digits, '-' and '_', starting with a letter or digit, not only digits"
        ))
    }
}

/// A time in the stored form: RFC 3339 UTC to the second, so text order is time order.
pub fn format_ts(ts: jiff::Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Now, in the stored form.
pub fn now() -> String {
    format_ts(jiff::Timestamp::now())
}

/// The parsed query of a list request.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// `field=value` filters, as given.
    pub filters: Vec<(String, String)>,
    /// `field` or `-field`.
    pub sort: Option<String>,
    /// The page size.
    pub limit: Option<u64>,
    /// The cursor from the previous page.
    pub cursor: Option<String>,
}

impl ListQuery {
    /// Reads a query string's pairs.
    pub fn from_pairs(pairs: Vec<(String, String)>) -> ListQuery {
        let mut q = ListQuery::default();
        for (k, v) in pairs {
            match k.as_str() {
                "sort" => q.sort = Some(v),
                "limit" => q.limit = Some(v.parse().unwrap_or(u64::MAX)),
                "cursor" => q.cursor = Some(v),
                _ => q.filters.push((k, v)),
            }
        }
        q
    }
}

/// One page of a list.
#[derive(Debug)]
pub struct Page {
    /// The rows.
    pub items: Vec<Obj>,
    /// Rows matching the filters on all pages.
    pub total: u64,
    /// The next page's cursor.
    pub next: Option<String>,
}

pub(crate) fn encode_cursor(offset: u64) -> String {
    URL_SAFE_NO_PAD.encode(format!("o{offset}"))
}

/// The offset a list cursor encodes; `None` for anything we did not give out.
pub(crate) fn decode_cursor(c: &str) -> Option<u64> {
    let raw = URL_SAFE_NO_PAD.decode(c).ok()?;
    std::str::from_utf8(&raw)
        .ok()?
        .strip_prefix('o')?
        .parse()
        .ok()
}

/// A server-side value a create sets besides the body (an API key's hash).
pub type Extra = (&'static str, Val);

impl Db {
    /// Lists rows of a kind.
    pub async fn list(&self, kind: &'static Kind, q: &ListQuery) -> Result<Page, StoreError> {
        let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
        if limit == 0 || limit > MAX_LIMIT {
            return Err(invalid(
                "limit",
                format!("must be between 1 and {MAX_LIMIT}"),
            ));
        }
        let offset = match &q.cursor {
            Some(c) => decode_cursor(c).ok_or_else(|| {
                invalid(
                    "cursor",
                    "is not a cursor this server gave out; start again without it",
                )
            })?,
            None => 0,
        };
        let mut conn = self.pool().acquire().await?;
        let mut filter = self.sql();
        self.where_clause(&mut conn, kind, &q.filters, &mut filter)
            .await?;

        let mut count = Sql::new(self.engine());
        count.push("SELECT COUNT(*) AS n FROM ").push(kind.table);
        count.append(&filter);
        let total = int(&count.query().fetch_one(&mut *conn).await?, "n")?;

        let mut sql = self.sql();
        sql.push("SELECT ")
            .push(&select_list(kind))
            .push(" FROM ")
            .push(kind.table);
        sql.append(&filter);
        sql.push(" ORDER BY ")
            .push(&order_by(kind, q.sort.as_deref())?);
        sql.push(&format!(" LIMIT {limit} OFFSET {offset}"));
        let rows = sql.query().fetch_all(&mut *conn).await?;
        let mut items = rows
            .iter()
            .map(|r| decode_row(kind, r))
            .collect::<Result<Vec<_>, _>>()?;
        self.embed(&mut conn, kind, &mut items).await?;
        let total = u64::try_from(total).unwrap_or(0);
        let next = (offset + (items.len() as u64) < total && !items.is_empty())
            .then(|| encode_cursor(offset + items.len() as u64));
        Ok(Page { items, total, next })
    }

    /// Appends ` WHERE ...` for the filters to `out` (nothing when there are none).
    async fn where_clause(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        filters: &[(String, String)],
        out: &mut Sql,
    ) -> Result<(), StoreError> {
        for (i, (name, raw)) in filters.iter().enumerate() {
            out.push(if i == 0 { " WHERE " } else { " AND " });
            if name == "id" {
                let id = raw
                    .parse::<i64>()
                    .map_err(|_| invalid("id", "expected an integer"))?;
                out.push("id = ").bind(Val::Int(Some(id)));
            } else if let Some(field) = kind.field(name) {
                let val = match field.ty {
                    Ty::Password | Ty::Secret | Ty::Json | Ty::StrList | Ty::Yaml => {
                        return Err(invalid(name.as_str(), "cannot be filtered on"));
                    }
                    Ty::Ref(_) if raw == "null" => Val::Int(None),
                    Ty::Ref(target) => {
                        let target = kinds::kind(target)
                            .ok_or_else(|| invalid(name.as_str(), "unknown kind"))?;
                        let key = RefKey::parse_str(raw);
                        let ids = self.resolve(conn, target, std::slice::from_ref(&key)).await;
                        // An unknown slug matches nothing rather than failing.
                        Val::Int(Some(
                            ids.ok().and_then(|m| m.get(&key).copied()).unwrap_or(-1),
                        ))
                    }
                    _ => {
                        let value = query_value(field.ty, raw);
                        match parse_field(field, &value, &SecretBox::new("")) {
                            Ok(Pending::Val(v)) => v,
                            Ok(_) => return Err(invalid(name.as_str(), "cannot be filtered on")),
                            Err(msg) => return Err(invalid(name.as_str(), msg)),
                        }
                    }
                };
                if val == null_of(field.ty) {
                    out.push(&field.column()).push(" IS NULL");
                } else {
                    out.push(&field.column()).push(" = ").bind(val);
                }
            } else if let Some(rel) = kind.relation(name) {
                let target =
                    kinds::kind(rel.kind).ok_or_else(|| invalid(name.as_str(), "unknown kind"))?;
                let key = RefKey::parse_str(raw);
                let id = self
                    .resolve(conn, target, std::slice::from_ref(&key))
                    .await
                    .ok()
                    .and_then(|m| m.get(&key).copied())
                    .unwrap_or(-1);
                out.push("id IN (SELECT ")
                    .push(rel.this)
                    .push(" FROM ")
                    .push(rel.table);
                out.push(" WHERE ")
                    .push(rel.other)
                    .push(" = ")
                    .bind(Val::Int(Some(id)))
                    .push(")");
            } else {
                let mut known: Vec<&str> = vec!["id"];
                known.extend(
                    kind.fields
                        .iter()
                        .filter(|f| f.access != Access::WriteOnly)
                        .map(|f| f.name),
                );
                known.extend(kind.m2m.iter().map(|m| m.name));
                return Err(invalid(
                    name.as_str(),
                    format!(
                        "unknown query parameter; {} lists take limit, cursor, sort and filters on: {}",
                        kind.name,
                        known.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// One row by id or slug.
    pub async fn get(&self, kind: &'static Kind, key: &str) -> Result<Obj, StoreError> {
        let mut conn = self.pool().acquire().await?;
        let id = self.find_id(&mut conn, kind, key).await?;
        self.get_by_id(&mut conn, kind, id).await
    }

    async fn get_by_id(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        id: i64,
    ) -> Result<Obj, StoreError> {
        let mut sql = self.sql();
        sql.push("SELECT ")
            .push(&select_list(kind))
            .push(" FROM ")
            .push(kind.table);
        sql.push(" WHERE id = ").bind(Val::Int(Some(id)));
        let row = sql
            .query()
            .fetch_optional(&mut *conn)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                kind: kind.name,
                key: id.to_string(),
            })?;
        let mut items = vec![decode_row(kind, &row)?];
        self.embed(conn, kind, &mut items).await?;
        Ok(items.pop().unwrap_or_default())
    }

    /// The id of the row `key` names (an id, or the kind's slug).
    pub async fn find_id(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        key: &str,
    ) -> Result<i64, StoreError> {
        let rk = RefKey::parse_str(key);
        self.resolve(conn, kind, std::slice::from_ref(&rk))
            .await
            .ok()
            .and_then(|m| m.get(&rk).copied())
            .ok_or_else(|| StoreError::NotFound {
                kind: kind.name,
                key: key.to_owned(),
            })
    }

    /// Maps references to ids; any that names no row is an error listing them.
    async fn resolve(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        keys: &[RefKey],
    ) -> Result<HashMap<RefKey, i64>, Vec<RefKey>> {
        let mut found = HashMap::new();
        let ids: Vec<i64> = unique(keys.iter().filter_map(|k| match k {
            RefKey::Id(i) => Some(*i),
            RefKey::Slug(_) => None,
        }));
        let slugs: Vec<String> = unique(keys.iter().filter_map(|k| match k {
            RefKey::Slug(s) => Some(s.clone()),
            RefKey::Id(_) => None,
        }));
        for chunk in ids.chunks(MAX_BINDS) {
            let mut sql = self.sql();
            sql.push("SELECT id FROM ")
                .push(kind.table)
                .push(" WHERE id IN ");
            sql.bind_list(chunk.iter().map(|i| Val::Int(Some(*i))));
            let Ok(rows) = sql.query().fetch_all(&mut *conn).await else {
                return Err(keys.to_vec());
            };
            for r in rows {
                if let Ok(id) = int(&r, "id") {
                    found.insert(RefKey::Id(id), id);
                }
            }
        }
        if let Some(slug_field) = kind.slug {
            for chunk in slugs.chunks(MAX_BINDS) {
                let mut sql = self.sql();
                sql.push("SELECT id, ")
                    .push(slug_field)
                    .push(" AS slug FROM ")
                    .push(kind.table);
                sql.push(" WHERE ").push(slug_field).push(" IN ");
                sql.bind_list(chunk.iter().map(|s| Val::Text(Some(s.clone()))));
                let Ok(rows) = sql.query().fetch_all(&mut *conn).await else {
                    return Err(keys.to_vec());
                };
                for r in rows {
                    if let (Ok(id), Ok(slug)) = (int(&r, "id"), r.try_get::<String, _>("slug")) {
                        found.insert(RefKey::Slug(slug), id);
                    }
                }
            }
        }
        let missing: Vec<RefKey> = unique(keys.iter().filter(|k| !found.contains_key(*k)).cloned());
        if missing.is_empty() {
            Ok(found)
        } else {
            Err(missing)
        }
    }

    /// Loads the relations and children of a page of rows, one query per relation.
    async fn embed(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        items: &mut [Obj],
    ) -> Result<(), StoreError> {
        if items.is_empty() || (kind.m2m.is_empty() && kind.children.is_empty()) {
            return Ok(());
        }
        let ids: Vec<i64> = items
            .iter()
            .filter_map(|o| o.get("id").and_then(Value::as_i64))
            .collect();
        for rel in kind.m2m {
            let mut by_owner: HashMap<i64, Vec<Value>> = HashMap::new();
            for chunk in ids.chunks(MAX_BINDS) {
                let mut sql = self.sql();
                sql.push("SELECT ")
                    .push(rel.this)
                    .push(" AS a, ")
                    .push(rel.other)
                    .push(" AS b FROM ");
                sql.push(rel.table)
                    .push(" WHERE ")
                    .push(rel.this)
                    .push(" IN ");
                sql.bind_list(chunk.iter().map(|i| Val::Int(Some(*i))));
                sql.push(" ORDER BY ").push(rel.other);
                for r in sql.query().fetch_all(&mut *conn).await? {
                    by_owner
                        .entry(int(&r, "a")?)
                        .or_default()
                        .push(json!(int(&r, "b")?));
                }
            }
            for o in items.iter_mut() {
                let id = o.get("id").and_then(Value::as_i64).unwrap_or_default();
                o.insert(
                    rel.name.into(),
                    Value::Array(by_owner.remove(&id).unwrap_or_default()),
                );
            }
        }
        for child in kind.children {
            let Some(ck) = kinds::kind(child.kind) else {
                continue;
            };
            let Some(pf) = ck.field(child.parent_field) else {
                continue;
            };
            let mut by_owner: HashMap<i64, Vec<Value>> = HashMap::new();
            for chunk in ids.chunks(MAX_BINDS) {
                let mut sql = self.sql();
                sql.push("SELECT ")
                    .push(&select_list(ck))
                    .push(" FROM ")
                    .push(ck.table);
                sql.push(" WHERE ").push(&pf.column()).push(" IN ");
                sql.bind_list(chunk.iter().map(|i| Val::Int(Some(*i))));
                sql.push(" ORDER BY id");
                for r in sql.query().fetch_all(&mut *conn).await? {
                    let row = decode_row(ck, &r)?;
                    let owner = row.get(pf.name).and_then(Value::as_i64).unwrap_or_default();
                    by_owner.entry(owner).or_default().push(Value::Object(row));
                }
            }
            for o in items.iter_mut() {
                let id = o.get("id").and_then(Value::as_i64).unwrap_or_default();
                o.insert(
                    child.name.into(),
                    Value::Array(by_owner.remove(&id).unwrap_or_default()),
                );
            }
        }
        Ok(())
    }

    /// Creates one row (and its children), returning it as the API shows it.
    pub async fn create(
        &self,
        kind: &'static Kind,
        prepared: Prepared,
        extra: Vec<Extra>,
    ) -> Result<Obj, StoreError> {
        let ids = self.create_many(kind, vec![prepared], extra).await?;
        let mut conn = self.pool().acquire().await?;
        let id = ids.first().copied().unwrap_or_default();
        self.get_by_id(&mut conn, kind, id).await
    }

    /// Creates many rows in one transaction: all or none. Every row that is
    /// wrong is named in the error.
    pub async fn create_many(
        &self,
        kind: &'static Kind,
        rows: Vec<Prepared>,
        extra: Vec<Extra>,
    ) -> Result<Vec<i64>, StoreError> {
        let mut rows = rows;
        for row in &mut rows {
            hash_passwords(row).await?;
        }
        let mut tx = self.pool().begin().await?;
        bump_revision(&mut tx).await?;
        let bulk = rows.len() > 1;
        self.check_unique(&mut tx, kind, &rows, None, bulk).await?;
        self.resolve_all(&mut tx, &mut rows, bulk).await?;
        let now = now();
        let mut ids = Vec::with_capacity(rows.len());
        let mut child_rows: Vec<(&'static Kind, &'static str, i64, &Prepared)> = Vec::new();
        for row in &rows {
            let id = self.insert_row(&mut tx, kind, row, &extra, &now).await?;
            ids.push(id);
            for (rel, keys) in &row.m2m {
                let targets = resolved_ids(keys);
                self.replace_links(&mut tx, rel, id, &targets).await?;
            }
            for (child, crow) in &row.children {
                if let Some(ck) = kinds::kind(child.kind) {
                    for c in crow {
                        child_rows.push((ck, child.parent_field, id, c));
                    }
                }
            }
            self.after_write(&mut tx, kind, id, row, true).await?;
        }
        for (ck, parent_field, parent_id, c) in child_rows {
            let mut c = c.clone();
            if let Some(pf) = ck.field(parent_field) {
                c.cols.push((pf, Pending::Val(Val::Int(Some(parent_id)))));
            }
            self.insert_row(&mut tx, ck, &c, &[], &now).await?;
        }
        tx.commit().await?;
        Ok(ids)
    }

    /// Changes a row; returns it as the API shows it.
    pub async fn update(
        &self,
        kind: &'static Kind,
        key: &str,
        prepared: Prepared,
    ) -> Result<Obj, StoreError> {
        let mut row = prepared;
        hash_passwords(&mut row).await?;
        let mut tx = self.pool().begin().await?;
        bump_revision(&mut tx).await?;
        let id = self.find_id(&mut tx, kind, key).await?;
        self.check_unique(&mut tx, kind, std::slice::from_ref(&row), Some(id), false)
            .await?;
        self.resolve_all(&mut tx, std::slice::from_mut(&mut row), false)
            .await?;
        self.before_update(&mut tx, kind, id, &row).await?;
        let mut sql = self.sql();
        sql.push("UPDATE ").push(kind.table).push(" SET ");
        let mut first = true;
        for (field, value) in &row.cols {
            if !first {
                sql.push(", ");
            }
            first = false;
            sql.push(&field.column())
                .push(" = ")
                .bind(pending_val(value));
        }
        if kind.timestamps {
            if !first {
                sql.push(", ");
            }
            first = false;
            sql.push("updated_at = ").bind(Val::Text(Some(now())));
        }
        if !first {
            sql.push(" WHERE id = ").bind(Val::Int(Some(id)));
            sql.query().execute(&mut *tx).await?;
        }
        for (rel, keys) in &row.m2m {
            let targets = resolved_ids(keys);
            self.replace_links(&mut tx, rel, id, &targets).await?;
        }
        self.after_write(&mut tx, kind, id, &row, false).await?;
        let out = self.get_by_id(&mut tx, kind, id).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Deletes a row (its children and links go with it).
    pub async fn delete(&self, kind: &'static Kind, key: &str) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await?;
        bump_revision(&mut tx).await?;
        let id = self.find_id(&mut tx, kind, key).await?;
        let mut sql = self.sql();
        sql.push("DELETE FROM ")
            .push(kind.table)
            .push(" WHERE id = ")
            .bind(Val::Int(Some(id)));
        sql.query().execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn insert_row(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        row: &Prepared,
        extra: &[Extra],
        now: &str,
    ) -> Result<i64, StoreError> {
        // Server-set values win over defaults of the same column.
        let given = |col: &str| extra.iter().any(|(c, _)| *c == col);
        let own = row.cols.iter().filter(|(f, _)| !given(&f.column()));
        let mut cols: Vec<String> = own.clone().map(|(f, _)| f.column()).collect();
        let mut vals: Vec<Val> = own.map(|(_, v)| pending_val(v)).collect();
        for (c, v) in extra {
            cols.push((*c).to_owned());
            vals.push(v.clone());
        }
        if kind.timestamps {
            for c in ["created_at", "updated_at"] {
                cols.push(c.into());
                vals.push(Val::Text(Some(now.to_owned())));
            }
        }
        let mut sql = self.sql();
        sql.push("INSERT INTO ")
            .push(kind.table)
            .push(" (")
            .push(&cols.join(", "))
            .push(") VALUES ");
        sql.bind_list(vals);
        if self.engine() == Engine::Mysql {
            let done = sql.query().execute(&mut *conn).await?;
            done.last_insert_id().ok_or_else(|| {
                StoreError::Db(sqlx::Error::Protocol("the insert returned no id".into()))
            })
        } else {
            sql.push(" RETURNING id");
            Ok(int(&sql.query().fetch_one(&mut *conn).await?, "id")?)
        }
    }

    /// Replaces the links of one row in a many-to-many relation.
    async fn replace_links(
        &self,
        conn: &mut AnyConnection,
        rel: &ManyToMany,
        id: i64,
        targets: &[i64],
    ) -> Result<(), StoreError> {
        let mut del = self.sql();
        del.push("DELETE FROM ")
            .push(rel.table)
            .push(" WHERE ")
            .push(rel.this)
            .push(" = ");
        del.bind(Val::Int(Some(id)));
        del.query().execute(&mut *conn).await?;
        let targets = unique(targets.iter().copied());
        for chunk in targets.chunks(MAX_BINDS / 2) {
            let mut ins = self.sql();
            ins.push("INSERT INTO ")
                .push(rel.table)
                .push(" (")
                .push(rel.this)
                .push(", ");
            ins.push(rel.other).push(") VALUES ");
            for (i, t) in chunk.iter().enumerate() {
                if i > 0 {
                    ins.push(", ");
                }
                ins.bind_list([Val::Int(Some(id)), Val::Int(Some(*t))]);
            }
            ins.query().execute(&mut *conn).await?;
        }
        Ok(())
    }

    /// Rejects values of unique fields that are taken, by other rows or by
    /// other rows of the same batch.
    async fn check_unique(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        rows: &[Prepared],
        except: Option<i64>,
        bulk: bool,
    ) -> Result<(), StoreError> {
        let mut errors = Vec::new();
        let mut check = |k: &'static Kind, rows: Vec<(String, &Prepared)>| {
            let mut pending: Vec<(&'static Field, String, String)> = Vec::new();
            for field in k.fields.iter().filter(|f| f.unique) {
                let mut seen: HashMap<String, String> = HashMap::new();
                for (path, row) in &rows {
                    if let Some(Pending::Val(Val::Text(Some(v)))) = row.value(field.name) {
                        let at = format!("{path}{}", field.name);
                        if let Some(first) = seen.insert(v.clone(), at.clone()) {
                            errors.push(FieldError::new(
                                at,
                                format!("{v:?} is also given at {first}"),
                            ));
                        } else {
                            pending.push((field, v.clone(), at));
                        }
                    }
                }
            }
            (k, pending)
        };
        let top: Vec<(String, &Prepared)> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    if bulk {
                        format!("rows[{i}].")
                    } else {
                        String::new()
                    },
                    r,
                )
            })
            .collect();
        let mut lookups = vec![check(kind, top)];
        for child in kind.children {
            if let Some(ck) = kinds::kind(child.kind) {
                let mut crow = Vec::new();
                for (i, r) in rows.iter().enumerate() {
                    for (c, list) in &r.children {
                        if c.name == child.name {
                            for (j, cr) in list.iter().enumerate() {
                                let p = if bulk {
                                    format!("rows[{i}].")
                                } else {
                                    String::new()
                                };
                                crow.push((format!("{p}{}[{j}].", child.name), cr));
                            }
                        }
                    }
                }
                lookups.push(check(ck, crow));
            }
        }
        for (k, pending) in lookups {
            for field in k.fields.iter().filter(|f| f.unique) {
                let wanted: Vec<&(&Field, String, String)> = pending
                    .iter()
                    .filter(|(f, _, _)| f.name == field.name)
                    .collect();
                for chunk in wanted.chunks(MAX_BINDS) {
                    let mut sql = self.sql();
                    sql.push("SELECT id, ")
                        .push(&field.column())
                        .push(" AS v FROM ")
                        .push(k.table);
                    sql.push(" WHERE ").push(&field.column()).push(" IN ");
                    sql.bind_list(chunk.iter().map(|(_, v, _)| Val::Text(Some(v.clone()))));
                    for r in sql.query().fetch_all(&mut *conn).await? {
                        let id = int(&r, "id")?;
                        if Some(id) == except && std::ptr::eq(k, kind) {
                            continue;
                        }
                        let v: String = r.try_get("v")?;
                        if let Some((_, _, at)) = chunk.iter().find(|(_, w, _)| *w == v) {
                            errors.push(FieldError::new(
                                at.clone(),
                                format!("{v:?} is taken by {} id {id}", k.name),
                            ));
                        }
                    }
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            let StoreError::Invalid { field, message } = field_errors(errors) else {
                return Err(StoreError::Conflict {
                    field: None,
                    message: "unique values taken".into(),
                });
            };
            Err(StoreError::Conflict { field, message })
        }
    }

    /// Replaces every reference given by slug or id with a checked id, in
    /// batches; every missing reference is an error naming its row and field.
    async fn resolve_all(
        &self,
        conn: &mut AnyConnection,
        rows: &mut [Prepared],
        bulk: bool,
    ) -> Result<(), StoreError> {
        // Gather every key per target kind, resolve each kind once.
        let mut wanted: HashMap<&'static str, Vec<RefKey>> = HashMap::new();
        fn gather(row: &Prepared, wanted: &mut HashMap<&'static str, Vec<RefKey>>) {
            for (f, v) in &row.cols {
                if let (Ty::Ref(t), Pending::Ref(Some(k))) = (f.ty, v) {
                    wanted.entry(t).or_default().push(k.clone());
                }
            }
            for (rel, keys) in &row.m2m {
                wanted
                    .entry(rel.kind)
                    .or_default()
                    .extend(keys.iter().cloned());
            }
            for (_, children) in &row.children {
                for c in children {
                    gather(c, wanted);
                }
            }
        }
        for row in rows.iter() {
            gather(row, &mut wanted);
        }
        let mut maps: HashMap<&'static str, HashMap<RefKey, i64>> = HashMap::new();
        let mut missing: HashMap<&'static str, HashSet<RefKey>> = HashMap::new();
        for (target, keys) in wanted {
            let Some(tk) = kinds::kind(target) else {
                continue;
            };
            match self.resolve(conn, tk, &keys).await {
                Ok(m) => {
                    maps.insert(target, m);
                }
                Err(miss) => {
                    let miss: HashSet<RefKey> = miss.into_iter().collect();
                    let present: Vec<RefKey> =
                        keys.into_iter().filter(|k| !miss.contains(k)).collect();
                    let m = self.resolve(conn, tk, &present).await.unwrap_or_default();
                    maps.insert(target, m);
                    missing.insert(target, miss);
                }
            }
        }
        let mut errors = Vec::new();
        fn apply(
            row: &mut Prepared,
            path: &str,
            maps: &HashMap<&'static str, HashMap<RefKey, i64>>,
            errors: &mut Vec<FieldError>,
        ) {
            for (f, v) in row.cols.iter_mut() {
                if let (Ty::Ref(t), Pending::Ref(Some(k))) = (f.ty, &*v) {
                    match maps.get(t).and_then(|m| m.get(k)) {
                        Some(id) => *v = Pending::Ref(Some(RefKey::Id(*id))),
                        None => errors.push(FieldError::new(
                            format!("{path}{}", f.name),
                            format!("no {t} with {}", k.show()),
                        )),
                    }
                }
            }
            for (rel, keys) in row.m2m.iter_mut() {
                let mut bad = Vec::new();
                for k in keys.iter_mut() {
                    match maps.get(rel.kind).and_then(|m| m.get(k)) {
                        Some(id) => *k = RefKey::Id(*id),
                        None => bad.push(k.show()),
                    }
                }
                if !bad.is_empty() {
                    let shown: Vec<String> = bad.iter().take(10).cloned().collect();
                    let more = if bad.len() > 10 {
                        format!(" and {} more", bad.len() - 10)
                    } else {
                        String::new()
                    };
                    errors.push(FieldError::new(
                        format!("{path}{}", rel.name),
                        format!("no {} with {}{more}", rel.kind, shown.join(", ")),
                    ));
                }
            }
            for (child, list) in row.children.iter_mut() {
                for (j, c) in list.iter_mut().enumerate() {
                    apply(c, &format!("{path}{}[{j}].", child.name), maps, errors);
                }
            }
        }
        for (i, row) in rows.iter_mut().enumerate() {
            let path = if bulk {
                format!("rows[{i}].")
            } else {
                String::new()
            };
            apply(row, &path, &maps, &mut errors);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(field_errors(errors))
        }
    }

    /// Kind-specific work before an update's own statement.
    async fn before_update(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        id: i64,
        row: &Prepared,
    ) -> Result<(), StoreError> {
        if kind.name == "scripts" {
            // A script's version counts changes of its content.
            if let Some(Pending::Val(content)) = row.value("content") {
                let mut sql = self.sql();
                sql.push("UPDATE scripts SET version = version + 1 WHERE id = ")
                    .bind(Val::Int(Some(id)));
                sql.push(" AND content <> ").bind(content.clone());
                sql.query().execute(&mut *conn).await?;
            }
        }
        Ok(())
    }

    /// Kind-specific work after a row was written, in the same transaction.
    async fn after_write(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        id: i64,
        row: &Prepared,
        created: bool,
    ) -> Result<(), StoreError> {
        if kind.name == "images" && row.bool("needs_rebuild") == Some(true) {
            // A rebuild request: a new version, which no job server hosts yet,
            // and a job to build it.
            if !created {
                let mut bump = self.sql();
                // The new version's rootfs is not published yet: no
                // checksum until it is.
                bump.push("UPDATE system_images SET version = version + 1, rootfs_sha256 = '', rootfs_size = 0 WHERE id = ");
                bump.bind(Val::Int(Some(id)));
                bump.query().execute(&mut *conn).await?;
                let mut clear = self.sql();
                clear
                    .push("DELETE FROM image_hosts WHERE image_id = ")
                    .bind(Val::Int(Some(id)));
                clear.query().execute(&mut *conn).await?;
            }
            let mut sel = self.sql();
            sel.push("SELECT slug, version FROM system_images WHERE id = ")
                .bind(Val::Int(Some(id)));
            let r = sel.query().fetch_one(&mut *conn).await?;
            let params =
                json!({"image": r.try_get::<String, _>("slug")?, "version": int(&r, "version")?});
            let now = now();
            let mut job = self.sql();
            job.push(
                "INSERT INTO jobs (module, params, status, output, created_at, updated_at) VALUES ",
            );
            job.bind_list([
                Val::Text(Some("image-update".into())),
                Val::Text(Some(params.to_string())),
                Val::Text(Some("pending".into())),
                Val::Text(Some(String::new())),
                Val::Text(Some(now.clone())),
                Val::Text(Some(now)),
            ]);
            job.query().execute(&mut *conn).await?;
        }
        Ok(())
    }
}

async fn bump_revision(conn: &mut AnyConnection) -> Result<(), StoreError> {
    // First statement of every write: on SQLite it also takes the write lock up
    // front, so two writers queue instead of deadlocking on a lock upgrade.
    sqlx::query("UPDATE inventory_revision SET revision = revision + 1 WHERE id = 1")
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn hash_passwords(row: &mut Prepared) -> Result<(), StoreError> {
    for (_, v) in row.cols.iter_mut() {
        if let Pending::Password(plain) = v {
            let plain = std::mem::take(plain);
            let hashed = tokio::task::spawn_blocking(move || crate::secrets::hash_password(&plain))
                .await
                .map_err(|e| StoreError::Hash(e.to_string()))?
                .map_err(|e| StoreError::Hash(e.to_string()))?;
            *v = Pending::Val(Val::Text(Some(hashed)));
        }
    }
    Ok(())
}

fn pending_val(p: &Pending) -> Val {
    match p {
        Pending::Val(v) => v.clone(),
        Pending::Ref(Some(RefKey::Id(id))) => Val::Int(Some(*id)),
        // Slugs were resolved before any write; passwords hashed.
        Pending::Ref(_) => Val::Int(None),
        Pending::Password(_) => Val::Text(None),
    }
}

fn resolved_ids(keys: &[RefKey]) -> Vec<i64> {
    keys.iter()
        .filter_map(|k| match k {
            RefKey::Id(i) => Some(*i),
            RefKey::Slug(_) => None,
        })
        .collect()
}

fn unique<T: Clone + Eq + std::hash::Hash>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut seen = HashSet::new();
    items
        .into_iter()
        .filter(|i| seen.insert(i.clone()))
        .collect()
}

fn query_value(ty: Ty, raw: &str) -> Value {
    match ty {
        Ty::Bool => match raw {
            "true" | "True" | "1" => Value::Bool(true),
            "false" | "False" | "0" => Value::Bool(false),
            _ => Value::String(raw.to_owned()),
        },
        Ty::Int { .. } => raw
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(raw.into())),
        Ty::Float => raw
            .parse::<f64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(raw.into())),
        _ if raw == "null" => Value::Null,
        _ => Value::String(raw.to_owned()),
    }
}

fn select_list(kind: &Kind) -> String {
    let mut cols = vec!["id".to_owned()];
    for f in kind.fields {
        if f.ty != Ty::Password {
            cols.push(f.column());
        }
    }
    if kind.timestamps {
        cols.push("created_at".into());
        cols.push("updated_at".into());
    }
    cols.join(", ")
}

fn order_by(kind: &Kind, sort: Option<&str>) -> Result<String, StoreError> {
    let Some(sort) = sort else {
        return Ok("id".into());
    };
    let (name, desc) = match sort.strip_prefix('-') {
        Some(n) => (n, true),
        None => (sort, false),
    };
    let dir = if desc { " DESC" } else { "" };
    if name == "id" {
        return Ok(format!("id{dir}"));
    }
    if kind.timestamps && (name == "created_at" || name == "updated_at") {
        return Ok(format!("{name}{dir}, id{dir}"));
    }
    match kind.field(name) {
        Some(f)
            if !matches!(
                f.ty,
                Ty::Password | Ty::Secret | Ty::Json | Ty::StrList | Ty::Yaml
            ) =>
        {
            Ok(format!("{}{dir}, id{dir}", f.column()))
        }
        _ => {
            let sortable: Vec<&str> = kind
                .fields
                .iter()
                .filter(|f| {
                    !matches!(
                        f.ty,
                        Ty::Password | Ty::Secret | Ty::Json | Ty::StrList | Ty::Yaml
                    )
                })
                .map(|f| f.name)
                .collect();
            Err(invalid(
                "sort",
                format!(
                    "cannot sort {} by {name:?}; use id or one of: {}",
                    kind.name,
                    sortable.join(", ")
                ),
            ))
        }
    }
}

fn decode_row(kind: &Kind, row: &AnyRow) -> Result<Obj, StoreError> {
    let mut o = Obj::new();
    o.insert("id".into(), json!(int(row, "id")?));
    for f in kind.fields {
        let col = f.column();
        let v = match f.ty {
            Ty::Password => continue,
            Ty::Secret => {
                let set = row.try_get::<Option<String>, _>(col.as_str())?.is_some();
                o.insert(format!("{}_set", f.name), Value::Bool(set));
                continue;
            }
            Ty::Bool => opt_bool(row, &col)?.map(Value::Bool).unwrap_or(Value::Null),
            Ty::Int { .. } | Ty::Ref(_) => {
                opt_int(row, &col)?.map(Value::from).unwrap_or(Value::Null)
            }
            Ty::Float => row
                .try_get::<Option<f64>, _>(col.as_str())
                .or_else(|_| {
                    row.try_get::<Option<f32>, _>(col.as_str())
                        .map(|v| v.map(f64::from))
                })?
                .map(Value::from)
                .unwrap_or(Value::Null),
            Ty::Json | Ty::StrList => match row.try_get::<Option<String>, _>(col.as_str())? {
                Some(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
                None => Value::Null,
            },
            _ => row
                .try_get::<Option<String>, _>(col.as_str())?
                .map(Value::String)
                .unwrap_or(Value::Null),
        };
        o.insert(f.name.into(), v);
    }
    if kind.timestamps {
        for c in ["created_at", "updated_at"] {
            o.insert(
                c.into(),
                row.try_get::<Option<String>, _>(c)?
                    .map(Value::String)
                    .unwrap_or(Value::Null),
            );
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_normalise() {
        for (input, want) in [
            ("52:54:00:AB:cd:01", Some("52:54:00:ab:cd:01")),
            ("52-54-00-ab-cd-01", Some("52:54:00:ab:cd:01")),
            ("5254.00ab.cd01", Some("52:54:00:ab:cd:01")),
            ("525400abcd01", Some("52:54:00:ab:cd:01")),
            ("52:54:00:ab:cd", None),
            ("52:54:00:ab:cd:0g", None),
            ("5:254:00:ab:cd:01", None),
            ("", None),
        ] {
            assert_eq!(parse_mac(input).ok().as_deref(), want, "{input}");
        }
    }

    #[test]
    fn hostnames_and_slugs() {
        assert_eq!(parse_hostname("C01.cluster.").unwrap(), "c01.cluster");
        for bad in ["", "-a", "a..b", "a b", &"x".repeat(64)] {
            assert!(parse_hostname(bad).is_err(), "{bad}");
        }
        assert!(parse_slug("compute-2").is_ok());
        for bad in ["", "123", "Compute", "-x", "a/b"] {
            assert!(parse_slug(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cursors_round_trip() {
        assert_eq!(decode_cursor(&encode_cursor(4200)), Some(4200));
        assert_eq!(decode_cursor("garbage!"), None);
        assert_eq!(decode_cursor(""), None);
    }

    #[test]
    fn ref_keys() {
        assert_eq!(RefKey::parse_str("12"), RefKey::Id(12));
        assert_eq!(RefKey::parse_str("+12"), RefKey::Slug("+12".into()));
        assert_eq!(RefKey::parse_str("c01"), RefKey::Slug("c01".into()));
    }

    #[test]
    fn validation_names_every_bad_field() {
        let sb = SecretBox::new("k");
        let systems = kinds::kind("systems").unwrap();
        let body = json!({
            "hostname": "bad host",
            "colour": "blue",
            "id": 3,
            "nics": [{"mac": "zz", "mtu": "big"}, {"system": 1}],
            "tmpfs_root_size": 1.5,
        });
        let errs = validate(systems, body.as_object().unwrap(), Mode::Create, &sb, "").unwrap_err();
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        for want in [
            "hostname",
            "colour",
            "id",
            "nics[0].mac",
            "nics[0].mtu",
            "nics[1].system",
            "tmpfs_root_size",
        ] {
            assert!(paths.contains(&want), "{want} missing from {paths:?}");
        }
    }

    #[test]
    fn create_requires_and_defaults() {
        let sb = SecretBox::new("k");
        let nets = kinds::kind("networks").unwrap();
        let errs = validate(nets, &Obj::new(), Mode::Create, &sb, "").unwrap_err();
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["slug", "subnet", "netmask"]);
        let ok = validate(
            nets,
            json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 24})
                .as_object()
                .unwrap(),
            Mode::Create,
            &sb,
            "",
        )
        .unwrap();
        assert!(ok.value("isdhcp").is_some());
        // Updates take only what is given.
        let upd = validate(
            nets,
            json!({"vlan": 5}).as_object().unwrap(),
            Mode::Update,
            &sb,
            "",
        )
        .unwrap();
        assert_eq!(upd.cols.len(), 1);
    }
}
