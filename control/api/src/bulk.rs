//! The wire types of bulk actions on the systems a filter matches
//! (`POST /api/v1/systems/actions`) and of the audit log they write
//! (`GET /api/v1/audit/`). The filter language itself is the control
//! service's (`mprov_control::db::crud::filter`); clients pass it as text.

use serde::{Deserialize, Serialize};

/// Where a bulk action is posted.
pub const ACTIONS_PATH: &str = "/api/v1/systems/actions";
/// Where the audit log is listed.
pub const AUDIT_PATH: &str = "/api/v1/audit/";

/// A bulk action: without `confirm_count` a preview, with it the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    /// The systems filter (empty: every system).
    pub filter: String,
    /// `add_to_group`, `remove_from_group`, `set_image`, `set_netboot` or
    /// `run_scripts`.
    pub action: String,
    /// The group's slug, for the group actions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The image's slug, for `set_image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// On or off, for `set_netboot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netboot: Option<bool>,
    /// The count the preview showed: the action is applied only if the
    /// filter still matches exactly this many systems (409 otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_count: Option<u64>,
}

/// The answer to a [`BulkRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkAnswer {
    /// Whether the action was applied (false: this is a preview).
    pub applied: bool,
    /// How many systems the filter matches (and, applied, were changed).
    pub count: u64,
    /// The first few of them by host name (a preview only).
    #[serde(default)]
    pub hosts: Vec<String>,
}

/// One audit log entry: a bulk action applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Its id (newer entries have higher ids).
    pub id: i64,
    /// When (RFC 3339, UTC).
    pub at: String,
    /// Who applied it: the account or API key.
    pub who: String,
    /// The action's name.
    pub action: String,
    /// The filter as written.
    pub filter: String,
    /// How many systems it changed.
    pub count: i64,
    /// What it set (`group compute`).
    pub detail: String,
}

/// One page of the audit log, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditPage {
    /// The entries.
    pub items: Vec<AuditEntry>,
    /// The cursor of the next (older) page, if there is one.
    pub next: Option<String>,
}
