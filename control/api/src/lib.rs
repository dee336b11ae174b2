//! Wire types shared by every mProv component that talks to the control service,
//! the version header they all send, and (behind the `client` feature) a typed
//! async client.
//!
//! The conventions (see `ARCHITECTURE.md`):
//! - Every resource lives under [`API_PREFIX`] (`/api/v1/`), has an integer `id`
//!   and, where users name things, a unique `slug`; `GET /api/v1/<kind>/<id or slug>`.
//! - Lists return a [`List`] envelope, with `limit`, `cursor`, `sort=field` or
//!   `sort=-field`, and filters as query parameters named after fields.
//! - Errors are an [`ApiError`] body.
//! - Every request and response carries [`VERSION_HEADER`] with [`api_version`];
//!   an authenticated client that sends another version gets 426 Upgrade Required,
//!   and clients refuse replies from another version.
//!
//! Architecture invariant: serde only, no async and no HTTP stack unless the
//! `client` feature is on, so the agent and the pure libraries can share these
//! types cheaply.

#![warn(missing_docs)]

use serde::{Deserialize, Serialize};

pub mod boot;
pub mod bulk;
#[cfg(feature = "client")]
pub mod client;
pub mod enroll;
pub mod jobs;
pub mod nads;
pub mod scripts;

/// The path prefix of the REST API.
pub const API_PREFIX: &str = "/api/v1";

/// The header every request and response carries: the `major.minor` version.
pub const VERSION_HEADER: &str = "mProv-Version";

/// The version header as one `Name: value` line, as `curl -H` takes it.
pub fn version_header_line() -> String {
    format!("{VERSION_HEADER}: {}", api_version())
}

/// The environment variable that turns the version check off, only when it is
/// exactly `1` (read the same way by every component: see [`skip_version_check`]).
pub const SKIP_VERSION_CHECK_ENV: &str = "MPROV_SKIP_VERSION_CHECK";

/// The `major.minor` of this build: what goes in [`VERSION_HEADER`].
pub fn api_version() -> &'static str {
    // CARGO_PKG_VERSION is "major.minor.patch"; the lock ignores the patch level.
    const FULL: &str = env!("CARGO_PKG_VERSION");
    match FULL.match_indices('.').nth(1) {
        Some((end, _)) => &FULL[..end],
        None => FULL,
    }
}

/// Whether a value of [`SKIP_VERSION_CHECK_ENV`] turns the check off: only the
/// exact string `1` does. `true`, `yes` and everything else leave it on, so every
/// component agrees on what a setting means.
pub fn skip_version_check(value: Option<&str>) -> bool {
    value == Some("1")
}

/// The list envelope: one page of items, the total matching the filters, and the
/// cursor of the next page (`None` on the last page).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct List<T> {
    /// The rows of this page.
    pub items: Vec<T>,
    /// How many rows match the filters, across all pages.
    pub total: u64,
    /// Pass as `cursor=` to get the next page; `null` on the last page.
    pub next: Option<String>,
}

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// A stable, machine-readable code such as `not_found` or `invalid_field`.
    pub error: String,
    /// What was wrong and what to do about it, for a person.
    pub message: String,
    /// The field at fault, when one field is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// The answer to a successful bulk create: the ids of the new rows, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkCreated {
    /// The ids of the created rows, in the order they were sent.
    pub ids: Vec<i64>,
}

/// The inventory revision: bumped by every write, in the same transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revision {
    /// The current revision number.
    pub revision: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_major_minor() {
        let v = api_version();
        assert_eq!(v.split('.').count(), 2, "{v}");
        assert!(env!("CARGO_PKG_VERSION").starts_with(v));
    }

    #[test]
    fn only_exact_one_skips() {
        for (value, skip) in [
            (Some("1"), true),
            (Some("true"), false),
            (Some("yes"), false),
            (Some(" 1"), false),
            (Some(""), false),
            (Some("0"), false),
            (None, false),
        ] {
            assert_eq!(skip_version_check(value), skip, "{value:?}");
        }
    }
}
