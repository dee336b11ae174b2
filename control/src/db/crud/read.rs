//! Lists and gets: filters, sorting and cursors, references resolved from
//! slugs, relations and children embedded a page at a time.

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::filter::Filter;
use super::validate::{null_of, parse_field, query_value};
use super::{DEFAULT_LIMIT, MAX_LIMIT, Obj, Pending, RefKey, StoreError, invalid, unique};
use crate::db::kinds::{self, Access, Field, Kind, ManyToMany, Ty};
use crate::db::{Db, MAX_BINDS, Sql, Val, int, opt_bool, opt_int};
use crate::secrets::SecretBox;

/// The kind a [`ListQuery::filter`] applies to.
const SYSTEMS: &str = "systems";

/// The parsed query of a list request.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// `field=value` filters, as given.
    pub filters: Vec<(String, String)>,
    /// `q`: rows whose slug or short text fields contain this (any case).
    pub search: Option<String>,
    /// `field` or `-field`.
    pub sort: Option<String>,
    /// The page size.
    pub limit: Option<u64>,
    /// The cursor from the previous page.
    pub cursor: Option<String>,
    /// Only the rows linked (`true`) or not linked (`false`) to the row of
    /// this id through this relation of another kind, whose other side is
    /// the listed kind (a group's member systems, or the systems to add).
    pub related: Option<(&'static ManyToMany, i64, bool)>,
    /// Whether to leave out the relations and children of each row (a page
    /// that shows counts instead).
    pub bare: bool,
    /// `filter`: a [filter](super::filter) over systems, as written.
    pub filter: Option<String>,
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
                "q" => q.search = Some(v).filter(|v| !v.trim().is_empty()),
                "filter" => q.filter = Some(v).filter(|v| !v.trim().is_empty()),
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

/// Where a page ended: the sort it was listed by, the last row's value of
/// the sort's field and its id. The next page starts after it (keyset), so
/// a deep page costs what the first does.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Cursor {
    /// The sort, as the query gave it (`""` for none).
    pub s: String,
    /// The last row's value of the sort field (`null` for `id`, or a null value).
    pub v: Value,
    /// The last row's id.
    pub i: i64,
}

pub(crate) fn encode_cursor(c: &Cursor) -> String {
    let json = serde_json::to_string(c).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(format!("k{json}"))
}

/// The place a list cursor encodes; `None` for anything we did not give out.
pub(crate) fn decode_cursor(c: &str) -> Option<Cursor> {
    let raw = URL_SAFE_NO_PAD.decode(c).ok()?;
    let json = std::str::from_utf8(&raw).ok()?.strip_prefix('k')?;
    let cursor: Cursor = serde_json::from_str(json).ok()?;
    matches!(
        cursor.v,
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_)
    )
    .then_some(cursor)
}

/// What a list is ordered by: a column (none: `id` alone), its direction,
/// and whether it may be null (nulls come last ascending, first
/// descending, on every engine); ties are broken by `id`.
#[derive(Debug, Clone)]
struct SortKey {
    column: Option<String>,
    name: String,
    desc: bool,
    nullable: bool,
}

impl SortKey {
    fn order_by(&self) -> String {
        let dir = if self.desc { " DESC" } else { "" };
        match &self.column {
            None => format!("id{dir}"),
            Some(c) if self.nullable => {
                format!("CASE WHEN {c} IS NULL THEN 1 ELSE 0 END{dir}, {c}{dir}, id{dir}")
            }
            Some(c) => format!("{c}{dir}, id{dir}"),
        }
    }

    /// The condition for the rows after `after` in this order.
    fn after(&self, after: &Cursor, out: &mut Sql) {
        let op = if self.desc { " < " } else { " > " };
        let id = Val::Int(Some(after.i));
        let Some(c) = &self.column else {
            out.push("id").push(op).bind(id);
            return;
        };
        let c = c.as_str();
        match json_val(&after.v) {
            None if self.desc => {
                out.push("(").push(c).push(" IS NOT NULL OR (");
                out.push(c).push(" IS NULL AND id < ").bind(id).push("))");
            }
            None => {
                out.push("(").push(c).push(" IS NULL AND id > ").bind(id);
                out.push(")");
            }
            Some(v) => {
                out.push("(").push(c).push(op).bind(v.clone());
                out.push(" OR (").push(c).push(" = ").bind(v);
                out.push(" AND id").push(op).bind(id).push(")");
                if self.nullable && !self.desc {
                    out.push(" OR ").push(c).push(" IS NULL");
                }
                out.push(")");
            }
        }
    }

    /// The cursor that ends a page at `row`.
    fn cursor_at(&self, sort: &str, row: &Obj) -> Cursor {
        Cursor {
            s: sort.to_owned(),
            v: match self.column {
                None => Value::Null,
                Some(_) => row.get(&self.name).cloned().unwrap_or(Value::Null),
            },
            i: row.get("id").and_then(Value::as_i64).unwrap_or_default(),
        }
    }
}

/// A cursor's value as a bound value; `None` for null.
fn json_val(v: &Value) -> Option<Val> {
    match v {
        Value::Bool(b) => Some(Val::Bool(Some(*b))),
        Value::Number(n) => Some(match n.as_i64() {
            Some(i) => Val::Int(Some(i)),
            None => Val::Float(n.as_f64()),
        }),
        Value::String(s) => Some(Val::Text(Some(s.clone()))),
        _ => None,
    }
}

/// Whether a field is searched by `q`: slugs, host names and short text.
pub fn searched(f: &Field) -> bool {
    f.access != Access::WriteOnly
        && match f.ty {
            Ty::Slug | Ty::Hostname => true,
            Ty::Text { max } => max <= 255,
            _ => false,
        }
}

/// `needle` as a `LIKE` pattern that matches it anywhere, `!` escaping.
fn like_pattern(needle: &str) -> String {
    let mut p = String::from("%");
    for ch in needle.trim().to_lowercase().chars() {
        if matches!(ch, '%' | '_' | '!') {
            p.push('!');
        }
        p.push(ch);
    }
    p.push('%');
    p
}

impl Db {
    /// Lists rows of a kind: one statement for the count, one for the
    /// page, and one per relation and child kind embedded (none when the
    /// query is [`bare`](ListQuery::bare)); how many rows or how deep the
    /// page does not change that.
    pub async fn list(&self, kind: &'static Kind, q: &ListQuery) -> Result<Page, StoreError> {
        let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
        if limit == 0 || limit > MAX_LIMIT {
            return Err(invalid(
                "limit",
                format!("must be between 1 and {MAX_LIMIT}"),
            ));
        }
        let sort = q.sort.clone().unwrap_or_default();
        let key = sort_key(kind, q.sort.as_deref())?;
        let after = match &q.cursor {
            Some(c) => Some(decode_cursor(c).filter(|c| c.s == sort).ok_or_else(|| {
                invalid(
                    "cursor",
                    "is not a cursor this server gave out for this sort; start again without it",
                )
            })?),
            None => None,
        };
        let mut conn = self.pool().acquire().await?;
        let mut filter = self.sql();
        let mut first = true;
        self.where_clause(&mut conn, kind, &q.filters, &mut filter, &mut first)
            .await?;
        if let Some(needle) = &q.search {
            let cols: Vec<String> = kind
                .fields
                .iter()
                .filter(|f| searched(f))
                .map(Field::column)
                .collect();
            conj(&mut filter, &mut first);
            if cols.is_empty() {
                return Err(invalid(
                    "q",
                    format!("{} has no field to search", kind.name),
                ));
            }
            filter.push("(");
            for (i, c) in cols.iter().enumerate() {
                if i > 0 {
                    filter.push(" OR ");
                }
                filter.push("LOWER(").push(c).push(") LIKE ");
                filter.bind(Val::Text(Some(like_pattern(needle))));
                filter.push(" ESCAPE '!'");
            }
            filter.push(")");
        }
        if let Some(text) = &q.filter {
            if kind.name != SYSTEMS {
                return Err(invalid(
                    "filter",
                    format!(
                        "only {SYSTEMS} lists take a filter; {} lists take q and field filters",
                        kind.name
                    ),
                ));
            }
            let parsed = Filter::parse(text).map_err(|e| invalid("filter", e.to_string()))?;
            conj(&mut filter, &mut first);
            filter.push("(");
            parsed.push_condition(&mut filter);
            filter.push(")");
        }
        if let Some((rel, owner, linked)) = q.related {
            conj(&mut filter, &mut first);
            filter.push(if linked {
                "id IN (SELECT "
            } else {
                "id NOT IN (SELECT "
            });
            filter.push(rel.other).push(" FROM ").push(rel.table);
            filter.push(" WHERE ").push(rel.this).push(" = ");
            filter.bind(Val::Int(Some(owner))).push(")");
        }

        let mut count = Sql::new(self.engine());
        count.push("SELECT COUNT(*) AS n FROM ").push(kind.table);
        count.append(&filter);
        self.count();
        let total = int(&count.query().fetch_one(&mut *conn).await?, "n")?;

        let mut sql = self.sql();
        sql.push("SELECT ")
            .push(&select_list(kind))
            .push(" FROM ")
            .push(kind.table);
        sql.append(&filter);
        if let Some(after) = &after {
            conj(&mut sql, &mut first);
            key.after(after, &mut sql);
        }
        sql.push(" ORDER BY ").push(&key.order_by());
        // One row more than the page says whether there is a next one.
        sql.push(&format!(" LIMIT {}", limit + 1));
        self.count();
        let rows = sql.query().fetch_all(&mut *conn).await?;
        let more = rows.len() as u64 > limit;
        let mut items = rows
            .iter()
            .take(limit as usize)
            .map(|r| decode_row(kind, r))
            .collect::<Result<Vec<_>, _>>()?;
        if !q.bare {
            self.embed(&mut conn, kind, &mut items).await?;
        }
        let total = u64::try_from(total).unwrap_or(0);
        let next = items
            .last()
            .filter(|_| more)
            .map(|last| encode_cursor(&key.cursor_at(&sort, last)));
        Ok(Page { items, total, next })
    }

    /// The slug (else the id, as text) of each of `ids` of `kind`: one
    /// statement per [`MAX_BINDS`] ids.
    pub async fn names(
        &self,
        kind: &'static Kind,
        ids: &[i64],
    ) -> Result<HashMap<i64, String>, StoreError> {
        let mut out = HashMap::new();
        let Some(slug) = kind.slug else {
            return Ok(ids.iter().map(|i| (*i, i.to_string())).collect());
        };
        for chunk in unique(ids.iter().copied()).chunks(MAX_BINDS) {
            let mut sql = self.sql();
            sql.push("SELECT id, ").push(slug).push(" AS slug FROM ");
            sql.push(kind.table).push(" WHERE id IN ");
            sql.bind_list(chunk.iter().map(|i| Val::Int(Some(*i))));
            for r in self.fetch_all(&sql).await? {
                out.insert(int(&r, "id")?, r.try_get::<String, _>("slug")?);
            }
        }
        Ok(out)
    }

    /// How many links each of `ids` has in the relation `rel`: one
    /// statement per [`MAX_BINDS`] ids.
    pub async fn link_counts(
        &self,
        rel: &ManyToMany,
        ids: &[i64],
    ) -> Result<HashMap<i64, i64>, StoreError> {
        let mut out = HashMap::new();
        for chunk in unique(ids.iter().copied()).chunks(MAX_BINDS) {
            let mut sql = self.sql();
            sql.push("SELECT ")
                .push(rel.this)
                .push(" AS a, COUNT(*) AS n FROM ");
            sql.push(rel.table)
                .push(" WHERE ")
                .push(rel.this)
                .push(" IN ");
            sql.bind_list(chunk.iter().map(|i| Val::Int(Some(*i))));
            sql.push(" GROUP BY ").push(rel.this);
            for r in self.fetch_all(&sql).await? {
                out.insert(int(&r, "a")?, int(&r, "n")?);
            }
        }
        Ok(out)
    }

    /// Appends ` WHERE ...` for the filters to `out` (nothing when there are none).
    async fn where_clause(
        &self,
        conn: &mut AnyConnection,
        kind: &'static Kind,
        filters: &[(String, String)],
        out: &mut Sql,
        first: &mut bool,
    ) -> Result<(), StoreError> {
        for (name, raw) in filters {
            conj(out, first);
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
        self.count();
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
            self.count();
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
                self.count();
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
                self.count();
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
                self.count();
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
                self.count();
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

/// ` WHERE ` before the first condition, ` AND ` before the others.
fn conj(out: &mut Sql, first: &mut bool) {
    out.push(if *first { " WHERE " } else { " AND " });
    *first = false;
}

fn sort_key(kind: &Kind, sort: Option<&str>) -> Result<SortKey, StoreError> {
    let Some(sort) = sort else {
        return Ok(SortKey {
            column: None,
            name: "id".into(),
            desc: false,
            nullable: false,
        });
    };
    let (name, desc) = match sort.strip_prefix('-') {
        Some(n) => (n, true),
        None => (sort, false),
    };
    let key = |column: Option<String>, nullable| SortKey {
        column,
        name: name.to_owned(),
        desc,
        nullable,
    };
    if name == "id" {
        return Ok(key(None, false));
    }
    if kind.timestamps && (name == "created_at" || name == "updated_at") {
        return Ok(key(Some(name.to_owned()), true));
    }
    match kind.field(name) {
        Some(f) if sortable(f) => Ok(key(Some(f.column()), f.nullable)),
        _ => {
            let sortable: Vec<&str> = kind
                .fields
                .iter()
                .filter(|f| sortable(f))
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

/// Whether a list may be sorted by a field.
pub fn sortable(f: &Field) -> bool {
    !matches!(
        f.ty,
        Ty::Password | Ty::Secret | Ty::Json | Ty::StrList | Ty::Yaml
    ) && f.access != Access::WriteOnly
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
