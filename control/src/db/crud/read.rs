//! Lists and gets: filters, sorting and cursors, references resolved from
//! slugs, relations and children embedded a page at a time.

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::validate::{null_of, parse_field, query_value};
use super::{DEFAULT_LIMIT, MAX_LIMIT, Obj, Pending, RefKey, StoreError, invalid, unique};
use crate::db::kinds::{self, Access, Field, Kind, Ty};
use crate::db::{Db, MAX_BINDS, Sql, Val, int, opt_bool, opt_int};
use crate::secrets::SecretBox;

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

    pub(super) async fn get_by_id(
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
    pub(super) async fn resolve(
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
        if items.is_empty()
            || (kind.m2m.is_empty() && kind.children.is_empty() && kind.reported.is_empty())
        {
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
        for rep in kind.reported {
            let mut by_owner: HashMap<i64, Vec<Value>> = HashMap::new();
            let cols: Vec<String> = rep.fields.iter().map(Field::column).collect();
            for chunk in ids.chunks(MAX_BINDS) {
                let mut sql = self.sql();
                sql.push("SELECT id, ")
                    .push(rep.parent)
                    .push(" AS owner, ")
                    .push(&cols.join(", "))
                    .push(" FROM ")
                    .push(rep.table)
                    .push(" WHERE ")
                    .push(rep.parent)
                    .push(" IN ");
                sql.bind_list(chunk.iter().map(|i| Val::Int(Some(*i))));
                sql.push(" ORDER BY ").push(rep.order);
                for r in sql.query().fetch_all(&mut *conn).await? {
                    let row = decode_fields(rep.fields, &r)?;
                    by_owner
                        .entry(int(&r, "owner")?)
                        .or_default()
                        .push(Value::Object(row));
                }
            }
            for o in items.iter_mut() {
                let id = o.get("id").and_then(Value::as_i64).unwrap_or_default();
                o.insert(
                    rep.name.into(),
                    Value::Array(by_owner.remove(&id).unwrap_or_default()),
                );
            }
        }
        Ok(())
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
    let mut o = decode_fields(kind.fields, row)?;
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

/// The `id` column and `fields` of a row, as the API shows them.
fn decode_fields(fields: &[Field], row: &AnyRow) -> Result<Obj, StoreError> {
    let mut o = Obj::new();
    o.insert("id".into(), json!(int(row, "id")?));
    for f in fields {
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
    Ok(o)
}
