//! Generic list, get, create, update and delete for every kind in [`KINDS`].
//!
//! Requests arrive as JSON objects and leave as JSON objects. The work is
//! split along its jobs:
//!
//! - [`validate`](mod@validate) (pure): a body against its kind's
//!   descriptor, into a [`Prepared`] of typed values; the field parsers (MAC,
//!   host name, slug).
//! - [`read`]: lists (filters, sorting, cursors) and gets. A page of rows is
//!   loaded with one query, then each relation of the whole page with one
//!   more query per relation: never a query per row.
//! - [`write`](mod@write): creates, updates and deletes, each in one transaction that
//!   bumps the inventory revision, resolves references given by slug and
//!   checks unique values first.
//! - `hooks`: the kind-specific work a descriptor's
//!   [`hooks`](super::kinds::Kind::hooks) ask of a write (version bumps,
//!   rebuild jobs), in the write's transaction.
//!
//! This layer knows nothing of HTTP: errors are [`StoreError`], which the HTTP
//! layer maps to status codes.
//!
//! [`KINDS`]: super::kinds::KINDS

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::Val;
use super::kinds::{Children, Field, ManyToMany};

pub mod filter;
mod hooks;
pub mod read;
#[cfg(test)]
mod tests;
pub mod validate;
pub mod write;

pub use read::{ListQuery, Page};
// The cursor codec is only named outside `read` by the tests and `fuzz`.
#[cfg(any(test, feature = "fuzz"))]
pub(crate) use read::{decode_cursor, encode_cursor};
pub use validate::{
    Sha256, parse_hostname, parse_mac, parse_sha256, parse_slug, validate, validate_value,
    writable_names,
};

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

/// A server-side value a create sets besides the body (an API key's hash).
type Extra = (&'static str, Val);

fn unique<T: Clone + Eq + std::hash::Hash>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut seen = HashSet::new();
    items
        .into_iter()
        .filter(|i| seen.insert(i.clone()))
        .collect()
}
