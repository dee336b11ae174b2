//! The kind-specific work of a write, run by [`write`](super::write) inside
//! the write's transaction, so it lands with the row or not at all.

use serde_json::json;
use sqlx::{AnyConnection, Row};

use super::{Pending, Prepared, StoreError, now};
use crate::db::kinds::Kind;
use crate::db::{Db, Val, int};

impl Db {
    /// Kind-specific work before an update's own statement.
    pub(super) async fn before_update(
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
    pub(super) async fn after_write(
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
