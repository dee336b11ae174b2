//! The kind-specific work of a write, as its descriptor's
//! [`hooks`](crate::db::kinds::Kind::hooks) ask: run by [`write`](super::write)
//! inside the write's transaction, so it lands with the row or not at all.
//! Everything a hook touches is named by the descriptor (its table, fields and
//! relations), none by a kind's name here.

use serde_json::{Map, Value};
use sqlx::{AnyConnection, Row};

use super::validate::default_of;
use super::{Extra, Pending, Prepared, StoreError};
use crate::db::kinds::{Hook, Issued, Kind};
use crate::db::{Db, Val, int};
use crate::time::now;

/// The secret a create makes for a kind that [issues](Kind::issues) one:
/// the secret itself, to answer once, and the server-set columns that keep
/// what checks it later.
pub(super) fn issue(issued: Issued) -> (String, Vec<Extra>) {
    match issued {
        Issued::ApiKey => {
            let key = crate::secrets::new_api_key();
            let columns = vec![
                ("prefix", Val::Text(Some(key.prefix))),
                ("hash", Val::Text(Some(key.hash))),
            ];
            (key.key, columns)
        }
    }
}

impl Db {
    /// The hooks that run before an update's own statement, while the stored
    /// row still has its old values: [`Hook::VersionCounts`].
    pub(super) async fn before_update(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        id: i64,
        row: &Prepared,
    ) -> Result<(), StoreError> {
        for hook in kind.hooks {
            if let Hook::VersionCounts(name) = *hook
                && let (Some(field), Some(Pending::Val(value))) =
                    (kind.field(name), row.value(name))
            {
                let mut sql = self.sql();
                sql.push("UPDATE ")
                    .push(kind.table)
                    .push(" SET version = version + 1 WHERE id = ")
                    .bind(Val::Int(Some(id)));
                sql.push(" AND ")
                    .push(&field.column())
                    .push(" <> ")
                    .bind(value.clone());
                sql.query().execute(&mut *conn).await?;
            }
        }
        Ok(())
    }

    /// The hooks that run once a row was written (`created` or updated):
    /// [`Hook::Rebuild`], [`Hook::Ends`].
    pub(super) async fn after_write(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        id: i64,
        row: &Prepared,
        created: bool,
    ) -> Result<(), StoreError> {
        for hook in kind.hooks {
            if let Hook::Ends {
                status,
                finals,
                stamp,
            } = *hook
            {
                self.stamp_end(conn, kind, id, row, (status, finals, stamp))
                    .await?;
                continue;
            }
            let Hook::Rebuild {
                flag,
                resets,
                hosts,
                job,
                param,
            } = *hook
            else {
                continue;
            };
            if row.bool(flag) != Some(true) {
                continue;
            }
            if !created {
                // A new version: not built yet, so nothing describes or holds it.
                let mut bump = self.sql();
                bump.push("UPDATE ")
                    .push(kind.table)
                    .push(" SET version = version + 1");
                for name in resets {
                    if let Some(field) = kind.field(name)
                        && let Some(Pending::Val(value)) = default_of(field)
                    {
                        bump.push(", ")
                            .push(&field.column())
                            .push(" = ")
                            .bind(value);
                    }
                }
                bump.push(" WHERE id = ").bind(Val::Int(Some(id)));
                bump.query().execute(&mut *conn).await?;
                if let Some(rel) = kind.relation(hosts) {
                    let mut clear = self.sql();
                    clear
                        .push("DELETE FROM ")
                        .push(rel.table)
                        .push(" WHERE ")
                        .push(rel.this)
                        .push(" = ")
                        .bind(Val::Int(Some(id)));
                    clear.query().execute(&mut *conn).await?;
                }
            }
            self.queue_for_row(conn, kind, id, job, param).await?;
        }
        Ok(())
    }

    /// The hooks that run before a delete, while the row is still there:
    /// [`Hook::Deleted`].
    pub(super) async fn before_delete(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        id: i64,
    ) -> Result<(), StoreError> {
        for hook in kind.hooks {
            if let Hook::Deleted { job, param } = *hook {
                self.queue_for_row(conn, kind, id, job, param).await?;
            }
        }
        Ok(())
    }

    /// Queues a pending job of the module `job` with the parameters
    /// `{"<param>": slug, "version": version}` of the row `id`.
    async fn queue_for_row(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        id: i64,
        job: &str,
        param: &str,
    ) -> Result<(), StoreError> {
        // The kinds' tests check that such a kind has a slug.
        let Some(slug) = kind.slug else {
            return Ok(());
        };
        let mut sel = self.sql();
        sel.push("SELECT ")
            .push(slug)
            .push(" AS slug, version FROM ")
            .push(kind.table)
            .push(" WHERE id = ")
            .bind(Val::Int(Some(id)));
        let r = sel.query().fetch_one(&mut *conn).await?;
        let mut params = Map::new();
        params.insert(param.into(), Value::String(r.try_get("slug")?));
        params.insert("version".into(), int(&r, "version")?.into());
        let now = now();
        let mut insert = self.sql();
        insert.push(
            "INSERT INTO jobs (module, params, status, output, created_at, updated_at) VALUES ",
        );
        insert.bind_list([
            Val::Text(Some(job.into())),
            Val::Text(Some(Value::Object(params).to_string())),
            Val::Text(Some("pending".into())),
            Val::Text(Some(String::new())),
            Val::Text(Some(now.clone())),
            Val::Text(Some(now)),
        ]);
        insert.query().execute(&mut *conn).await?;
        Ok(())
    }

    /// [`Hook::Ends`]: a write that set `status` to one of `finals` without
    /// giving `stamp` sets `stamp` to now where it is unset.
    async fn stamp_end(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        id: i64,
        row: &Prepared,
        (status, finals, stamp): (&str, &[&str], &str),
    ) -> Result<(), StoreError> {
        let ended = matches!(
            row.value(status),
            Some(Pending::Val(Val::Text(Some(s)))) if finals.contains(&s.as_str())
        );
        let (Some(field), true, None) = (kind.field(stamp), ended, row.value(stamp)) else {
            return Ok(());
        };
        let mut sql = self.sql();
        sql.push("UPDATE ")
            .push(kind.table)
            .push(" SET ")
            .push(&field.column())
            .push(" = ")
            .bind(Val::Text(Some(now())));
        sql.push(" WHERE id = ")
            .bind(Val::Int(Some(id)))
            .push(" AND ")
            .push(&field.column())
            .push(" IS NULL");
        sql.query().execute(&mut *conn).await?;
        Ok(())
    }
}
