//! Bulk actions on every system a filter matches, and the audit log they
//! write. No HTTP here: the API (`POST /api/v1/systems/actions`), the admin
//! pages (`/admin/systems/bulk`) and `mash systems bulk` all come through
//! [`preview`] and [`apply`].
//!
//! The rule: **an action is applied only to a count the caller has seen.**
//!
//! 1. [`preview`] counts the systems the [`Filter`] matches and names the
//!    first [`PREVIEW_HOSTS`] by host name; it changes nothing, and it
//!    already refuses an action whose group or image does not exist.
//! 2. [`apply`] takes the count the caller confirms. In one transaction it
//!    bumps the inventory revision (its first statement, as every inventory
//!    write's: on SQLite that takes the write lock up front), lists the
//!    matching ids again, and if their number is not the confirmed count it
//!    changes nothing and says [`BulkError::CountChanged`]. Otherwise it
//!    changes exactly those systems and writes one `audit_log` row (who,
//!    when, the action, the filter as written, the count, what was set)
//!    before it commits: the entry and the change stand or fall together.
//!
//! The actions: add to a group, remove from a group (each a no-op for a
//! system already in, or not in, the group), set the image, set netboot on
//! or off, and run the post-boot scripts again (the statement
//! [`scripts::request_run`] runs for one system, here for each). Who may
//! apply one is not decided here: the access rules refuse every write of a
//! read-only account before a handler runs.

use mprov_api::bulk::{AuditEntry, AuditPage};
use sqlx::{AnyConnection, Row as _};

use crate::db::crud::filter::Filter;
use crate::db::{Db, MAX_BINDS, Sql, Val, int};
use crate::scripts;

/// How many host names a preview shows.
pub const PREVIEW_HOSTS: usize = 10;
/// The most audit entries one page lists.
pub const MAX_AUDIT_LIMIT: u64 = 1000;
/// The audit page size when none is asked for.
pub const DEFAULT_AUDIT_LIMIT: u64 = 100;

/// What to do to each matching system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Make it a member of the group (by slug).
    AddToGroup(String),
    /// End its membership of the group (by slug).
    RemoveFromGroup(String),
    /// Ask its agent to run the post-boot scripts again.
    RunScripts,
    /// Boot the image (by slug).
    SetImage(String),
    /// Boot from the network (`true`) or locally.
    SetNetboot(bool),
}

/// The action names, as the API, the pages and `mash` write them.
pub const ACTIONS: [&str; 5] = [
    "add_to_group",
    "remove_from_group",
    "run_scripts",
    "set_image",
    "set_netboot",
];

impl Action {
    /// The action of a name and its argument: the group's or image's slug,
    /// or `on`/`off` (also `true`/`false`) for netboot.
    pub fn parse(name: &str, arg: Option<&str>) -> Result<Action, BulkError> {
        let arg = arg.map(str::trim).filter(|a| !a.is_empty());
        let need = |field: &'static str, what: &str| {
            arg.map(str::to_owned).ok_or_else(|| BulkError::Invalid {
                field,
                message: format!("{name} needs {what}"),
            })
        };
        Ok(match name {
            "add_to_group" => Action::AddToGroup(need("group", "the group's slug")?),
            "remove_from_group" => Action::RemoveFromGroup(need("group", "the group's slug")?),
            "run_scripts" => Action::RunScripts,
            "set_image" => Action::SetImage(need("image", "the image's slug")?),
            "set_netboot" => Action::SetNetboot(match need("netboot", "on or off")?.as_str() {
                "on" | "true" => true,
                "off" | "false" => false,
                other => {
                    return Err(BulkError::Invalid {
                        field: "netboot",
                        message: format!("set_netboot takes on or off, not {other:?}"),
                    });
                }
            }),
            other => {
                return Err(BulkError::Invalid {
                    field: "action",
                    message: format!(
                        "unknown action {other:?}; the actions are: {}",
                        ACTIONS.join(", ")
                    ),
                });
            }
        })
    }

    /// The action's name.
    pub fn name(&self) -> &'static str {
        match self {
            Action::AddToGroup(_) => "add_to_group",
            Action::RemoveFromGroup(_) => "remove_from_group",
            Action::RunScripts => "run_scripts",
            Action::SetImage(_) => "set_image",
            Action::SetNetboot(_) => "set_netboot",
        }
    }

    /// What it sets, as the audit log shows it (`group compute`).
    pub fn detail(&self) -> String {
        match self {
            Action::AddToGroup(g) | Action::RemoveFromGroup(g) => format!("group {g}"),
            Action::RunScripts => String::new(),
            Action::SetImage(i) => format!("image {i}"),
            Action::SetNetboot(on) => format!("netboot {}", if *on { "on" } else { "off" }),
        }
    }
}

/// What an action would touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    /// How many systems the filter matches now.
    pub count: u64,
    /// The first [`PREVIEW_HOSTS`] of them, by host name.
    pub hosts: Vec<String>,
}

/// Why a bulk action was not applied.
#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    /// The filter matches another number of systems than was confirmed.
    #[error(
        "the filter now matches {now} systems, not the {confirmed} confirmed; nothing was changed, preview again"
    )]
    CountChanged {
        /// The count the caller confirmed.
        confirmed: u64,
        /// The count now.
        now: u64,
    },
    /// The database failed.
    #[error("database error")]
    Db(#[from] sqlx::Error),
    /// The request is wrong: `field` says where.
    #[error("{message}")]
    Invalid {
        /// The field at fault.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// The condition of `filter` on `systems`.
fn matching(db: &Db, select: &str, filter: &Filter) -> Sql {
    let mut sql = db.sql();
    sql.push(select).push(" FROM systems WHERE ");
    filter.push_condition(&mut sql);
    sql
}

/// Counts the systems `filter` matches and names the first few; checks that
/// the group or image `action` names exists. Changes nothing.
pub async fn preview(db: &Db, filter: &Filter, action: &Action) -> Result<Preview, BulkError> {
    let mut conn = db.pool().acquire().await?;
    target_id(&mut conn, db, action).await?;
    let count = int(
        &matching(db, "SELECT COUNT(*) AS n", filter)
            .query()
            .fetch_one(&mut *conn)
            .await?,
        "n",
    )?;
    let mut names = matching(db, "SELECT hostname", filter);
    names.push(&format!(" ORDER BY hostname LIMIT {PREVIEW_HOSTS}"));
    let hosts = names
        .query()
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|r| r.try_get::<String, _>("hostname"))
        .collect::<Result<_, _>>()?;
    Ok(Preview {
        count: u64::try_from(count).unwrap_or(0),
        hosts,
    })
}

/// Applies `action` to the systems `filter` (written as `filter_text`)
/// matches, if they are `confirmed` many, and writes the audit entry for
/// `who`, all in one transaction; the count applied.
pub async fn apply(
    db: &Db,
    who: &str,
    filter_text: &str,
    filter: &Filter,
    action: &Action,
    confirmed: u64,
) -> Result<u64, BulkError> {
    let mut tx = db.pool().begin().await?;
    // As every inventory write (crud::write): the revision first, so on
    // SQLite the write lock is taken before anything is read.
    sqlx::query("UPDATE inventory_revision SET revision = revision + 1 WHERE id = 1")
        .execute(&mut *tx)
        .await?;
    let target = target_id(&mut tx, db, action).await?;
    let mut ids_sql = matching(db, "SELECT id", filter);
    ids_sql.push(" ORDER BY id");
    let ids: Vec<i64> = ids_sql
        .query()
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| int(r, "id"))
        .collect::<Result<_, _>>()?;
    let now = ids.len() as u64;
    if now != confirmed {
        return Err(BulkError::CountChanged { confirmed, now });
    }
    let stamp = crate::time::now();
    for chunk in ids.chunks(MAX_BINDS / 2) {
        let list = || chunk.iter().map(|i| Val::Int(Some(*i)));
        match action {
            Action::AddToGroup(_) => {
                let group = Val::Int(target);
                let mut have = db.sql();
                have.push("SELECT system_id FROM group_members WHERE group_id = ")
                    .bind(group.clone())
                    .push(" AND system_id IN ")
                    .bind_list(list());
                let members: Vec<i64> = have
                    .query()
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| int(r, "system_id"))
                    .collect::<Result<_, _>>()?;
                let new: Vec<i64> = chunk
                    .iter()
                    .copied()
                    .filter(|i| !members.contains(i))
                    .collect();
                if new.is_empty() {
                    continue;
                }
                let mut ins = db.sql();
                ins.push("INSERT INTO group_members (group_id, system_id) VALUES ");
                for (n, id) in new.iter().enumerate() {
                    if n > 0 {
                        ins.push(", ");
                    }
                    ins.push("(")
                        .bind(group.clone())
                        .push(", ")
                        .bind(Val::Int(Some(*id)))
                        .push(")");
                }
                ins.query().execute(&mut *tx).await?;
            }
            Action::RemoveFromGroup(_) => {
                let mut del = db.sql();
                del.push("DELETE FROM group_members WHERE group_id = ")
                    .bind(Val::Int(target))
                    .push(" AND system_id IN ")
                    .bind_list(list());
                del.query().execute(&mut *tx).await?;
            }
            Action::RunScripts => {
                let mut upd = scripts::run_request_bump(db);
                upd.push(" IN ").bind_list(list());
                upd.query().execute(&mut *tx).await?;
            }
            Action::SetImage(_) | Action::SetNetboot(_) => {
                let mut upd = db.sql();
                match action {
                    Action::SetNetboot(on) => upd
                        .push("UPDATE systems SET netboot = ")
                        .bind(Val::Bool(Some(*on))),
                    _ => upd
                        .push("UPDATE systems SET image_id = ")
                        .bind(Val::Int(target)),
                };
                upd.push(", updated_at = ")
                    .bind(Val::Text(Some(stamp.clone())))
                    .push(" WHERE id IN ")
                    .bind_list(list());
                upd.query().execute(&mut *tx).await?;
            }
        }
    }
    let mut audit = db.sql();
    audit.push("INSERT INTO audit_log (at, who, action, filter_text, affected, detail) VALUES (");
    for (n, v) in [
        Val::Text(Some(stamp)),
        Val::Text(Some(who.chars().take(255).collect())),
        Val::Text(Some(action.name().to_owned())),
        Val::Text(Some(filter_text.to_owned())),
        Val::Int(Some(i64::try_from(now).unwrap_or(i64::MAX))),
        Val::Text(Some(action.detail())),
    ]
    .into_iter()
    .enumerate()
    {
        if n > 0 {
            audit.push(", ");
        }
        audit.bind(v);
    }
    audit.push(")");
    audit.query().execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(now)
}

/// The id of the group or image `action` names (`None` when it names
/// neither); an error naming the field when there is no such row.
async fn target_id(
    conn: &mut AnyConnection,
    db: &Db,
    action: &Action,
) -> Result<Option<i64>, BulkError> {
    let (table, field, slug) = match action {
        Action::AddToGroup(g) | Action::RemoveFromGroup(g) => ("system_groups", "group", g),
        Action::SetImage(i) => ("system_images", "image", i),
        Action::RunScripts | Action::SetNetboot(_) => return Ok(None),
    };
    let mut sql = db.sql();
    sql.push("SELECT id FROM ")
        .push(table)
        .push(" WHERE slug = ")
        .bind(Val::Text(Some(slug.clone())));
    match sql.query().fetch_optional(&mut *conn).await? {
        Some(row) => Ok(Some(int(&row, "id")?)),
        None => Err(BulkError::Invalid {
            field,
            message: format!("there is no {field} {slug:?}"),
        }),
    }
}

/// A page of the audit log, newest first: `limit` entries (1 to
/// [`MAX_AUDIT_LIMIT`]) older than the entry `cursor` names.
pub async fn audit(
    db: &Db,
    limit: Option<u64>,
    cursor: Option<&str>,
) -> Result<AuditPage, BulkError> {
    let limit = limit.unwrap_or(DEFAULT_AUDIT_LIMIT);
    if limit == 0 || limit > MAX_AUDIT_LIMIT {
        return Err(BulkError::Invalid {
            field: "limit",
            message: format!("limit: must be between 1 and {MAX_AUDIT_LIMIT}"),
        });
    }
    let before = match cursor {
        None => None,
        Some(c) => Some(c.parse::<i64>().map_err(|_| BulkError::Invalid {
            field: "cursor",
            message: "cursor: is not a cursor this server gave out; start again without it".into(),
        })?),
    };
    let mut sql = db.sql();
    sql.push("SELECT id, at, who, action, filter_text, affected, detail FROM audit_log");
    if let Some(before) = before {
        sql.push(" WHERE id < ").bind(Val::Int(Some(before)));
    }
    sql.push(&format!(" ORDER BY id DESC LIMIT {}", limit + 1));
    let rows = db.fetch_all(&sql).await?;
    let text = |r: &sqlx::any::AnyRow, c: &str| r.try_get::<String, _>(c);
    let mut items = Vec::with_capacity(rows.len());
    for r in rows.iter().take(limit as usize) {
        items.push(AuditEntry {
            id: int(r, "id")?,
            at: text(r, "at")?,
            who: text(r, "who")?,
            action: text(r, "action")?,
            filter: text(r, "filter_text")?,
            count: int(r, "affected")?,
            detail: text(r, "detail")?,
        });
    }
    let next = (rows.len() as u64 > limit)
        .then(|| items.last().map(|e| e.id.to_string()))
        .flatten();
    Ok(AuditPage { items, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_parse_with_their_argument() {
        assert_eq!(
            Action::parse("add_to_group", Some("gpu")).unwrap(),
            Action::AddToGroup("gpu".into())
        );
        assert_eq!(
            Action::parse("set_netboot", Some("off")).unwrap(),
            Action::SetNetboot(false)
        );
        assert_eq!(
            Action::parse("run_scripts", None).unwrap(),
            Action::RunScripts
        );
        for name in ACTIONS {
            // Every listed name is known (with an argument where it needs one).
            assert!(Action::parse(name, Some("on")).is_ok(), "{name}");
        }
        let msg = |r: Result<Action, BulkError>| r.unwrap_err().to_string();
        assert!(msg(Action::parse("add_to_group", None)).contains("the group's slug"));
        assert!(msg(Action::parse("set_netboot", Some("maybe"))).contains("on or off"));
        assert!(msg(Action::parse("reboot", None)).contains("add_to_group, remove_from_group"));
    }
}
