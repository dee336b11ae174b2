//! Creates, updates and deletes: each one transaction that bumps the
//! inventory revision first, checks unique values and resolves references
//! for the whole batch, then writes the rows, their links and children, and
//! runs the kind's hooks.

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use sqlx::{AnyConnection, Row};

use super::hooks::issue;
use super::{Extra, FieldError, Obj, Pending, Prepared, RefKey, StoreError, field_errors, unique};
use crate::db::kinds::{self, Field, Kind, ManyToMany, Ty};
use crate::db::{Db, Engine, MAX_BINDS, Val, int};
use crate::time::now;

impl Db {
    /// Creates one row (and its children), returning it as the API shows
    /// it; for a kind that [issues](Kind::issues) a secret, with the secret
    /// made for this row under its field: the one time it is shown.
    pub async fn create(&self, kind: &'static Kind, prepared: Prepared) -> Result<Obj, StoreError> {
        let (shown, extra) = match kind.issues {
            Some(issued) => {
                let (secret, columns) = issue(issued);
                (Some((issued.field(), secret)), columns)
            }
            None => (None, Vec::new()),
        };
        let ids = self.insert_many(kind, vec![prepared], &extra).await?;
        let mut conn = self.pool().acquire().await?;
        let id = ids.first().copied().unwrap_or_default();
        let mut obj = self.get_by_id(&mut conn, kind, id).await?;
        if let Some((field, secret)) = shown {
            obj.insert(field.into(), Value::String(secret));
        }
        Ok(obj)
    }

    /// Creates many rows in one transaction: all or none. Every row that is
    /// wrong is named in the error. A kind that [issues](Kind::issues) a
    /// secret is refused: its rows are created one at a time.
    pub async fn create_many(
        &self,
        kind: &'static Kind,
        rows: Vec<Prepared>,
    ) -> Result<Vec<i64>, StoreError> {
        if let Some(issued) = kind.issues {
            return Err(StoreError::Invalid {
                field: None,
                message: issued.one_at_a_time(),
            });
        }
        self.insert_many(kind, rows, &[]).await
    }

    /// Inserts rows, with the server-set columns `extra` in each, in one
    /// transaction.
    async fn insert_many(
        &self,
        kind: &'static Kind,
        rows: Vec<Prepared>,
        extra: &[Extra],
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
            let id = self.insert_row(&mut tx, kind, row, extra, &now).await?;
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
        let before = self.get_by_id(&mut tx, kind, id).await?;
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
        // An update that changes nothing writes nothing: no revision, so no
        // job server wakes to fetch the boot config again (a node's empty
        // PATCH of its own row did that 200 times a second). A write-only
        // field (a password) cannot be compared, so it always writes.
        let secret = row
            .cols
            .iter()
            .any(|(f, _)| f.access == kinds::Access::WriteOnly);
        if !secret && same_but_update_time(&before, &out) {
            tx.rollback().await?;
            return Ok(before);
        }
        if let (Some(profile), Some(slug)) = (kind.certificates, kind.slug)
            && let Some(old) = before.get(slug).and_then(Value::as_str)
            && out.get(slug) != before.get(slug)
        {
            let new = out.get(slug).and_then(Value::as_str).unwrap_or_default();
            self.revoke_identity(&mut tx, profile, old, &format!("renamed to {new}"))
                .await?;
        }
        tx.commit().await?;
        Ok(out)
    }

    /// Deletes a row (its children and links go with it).
    pub async fn delete(&self, kind: &'static Kind, key: &str) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await?;
        bump_revision(&mut tx).await?;
        let id = self.find_id(&mut tx, kind, key).await?;
        if let (Some(profile), Some(slug)) = (kind.certificates, kind.slug) {
            let row = self.get_by_id(&mut tx, kind, id).await?;
            if let Some(name) = row.get(slug).and_then(Value::as_str) {
                self.revoke_identity(&mut tx, profile, name, "its row was deleted")
                    .await?;
            }
        }
        self.before_delete(&mut tx, kind, id).await?;
        let mut sql = self.sql();
        sql.push("DELETE FROM ")
            .push(kind.table)
            .push(" WHERE id = ")
            .bind(Val::Int(Some(id)));
        sql.query().execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Adds (`add`) or removes one link of the relation `rel` of the row
    /// `key`: the row `target` (an id or slug of the relation's kind). One
    /// small transaction whatever the relation's size, so a group of
    /// thousands of systems gains or loses a member without its whole list
    /// being sent; a link already there (or already gone) changes nothing.
    pub async fn link(
        &self,
        kind: &'static Kind,
        key: &str,
        rel: &'static ManyToMany,
        target: &str,
        add: bool,
    ) -> Result<(), StoreError> {
        let other = kinds::kind(rel.kind).ok_or_else(|| StoreError::NotFound {
            kind: kind.name,
            key: rel.kind.to_owned(),
        })?;
        let mut tx = self.pool().begin().await?;
        bump_revision(&mut tx).await?;
        let id = self.find_id(&mut tx, kind, key).await?;
        let tid = self.find_id(&mut tx, other, target).await?;
        let pair = |sql: &mut crate::db::Sql| {
            sql.push(" WHERE ").push(rel.this).push(" = ");
            sql.bind(Val::Int(Some(id)));
            sql.push(" AND ").push(rel.other).push(" = ");
            sql.bind(Val::Int(Some(tid)));
        };
        let mut there = self.sql();
        there.push("SELECT COUNT(*) AS n FROM ").push(rel.table);
        pair(&mut there);
        let linked = int(&there.query().fetch_one(&mut *tx).await?, "n")? > 0;
        if linked == add {
            tx.rollback().await?;
            return Ok(());
        }
        let mut sql = self.sql();
        if add {
            sql.push("INSERT INTO ").push(rel.table).push(" (");
            sql.push(rel.this)
                .push(", ")
                .push(rel.other)
                .push(") VALUES ");
            sql.bind_list([Val::Int(Some(id)), Val::Int(Some(tid))]);
        } else {
            sql.push("DELETE FROM ").push(rel.table);
            pair(&mut sql);
        }
        sql.query().execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Revokes the unrevoked certificates of `profile` (`node`,
    /// `jobserver`) issued to `identity`, for `reason`, in `conn`'s
    /// transaction.
    async fn revoke_identity(
        &self,
        conn: &mut AnyConnection,
        profile: &str,
        identity: &str,
        reason: &str,
    ) -> Result<(), StoreError> {
        let mut sql = self.sql();
        sql.push("UPDATE credentials SET revoked_at = ")
            .bind(Val::Text(Some(now())));
        sql.push(", revoke_reason = ")
            .bind(Val::Text(Some(reason.to_owned())));
        sql.push(" WHERE revoked_at IS NULL AND kind = ")
            .bind(Val::Text(Some(profile.to_owned())));
        sql.push(" AND identity = ")
            .bind(Val::Text(Some(identity.to_owned())));
        sql.query().execute(&mut *conn).await?;
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
}

/// Whether two views of one row differ in nothing but `updated_at`.
fn same_but_update_time(a: &Obj, b: &Obj) -> bool {
    let shown = |o: &Obj| {
        o.iter()
            .filter(|(k, _)| k.as_str() != "updated_at")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<HashMap<String, Value>>()
    };
    shown(a) == shown(b)
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
