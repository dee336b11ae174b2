//! The inventory pages: for every kind of [`KINDS`] (but users and the
//! kinds that issue a secret, which the identities pages handle), a list
//! with search, filters, sort and keyset pagination, and create, edit and
//! delete forms, all generated from the kind's descriptor, so a new field
//! appears here as it does in the API.
//!
//! A page parses, calls the same domain as the API (the list's
//! [`ListQuery`], [`crud::validate()`], the store's writes) and asks the same
//! access rules ([`access::check`] with the session's principal), then
//! renders: no rule is written twice. Many-to-many relations (a group's
//! thousands of systems) have a page of their own, edited one link at a
//! time by search-and-add ([`Db::link`](crate::db::Db::link)).

use std::collections::HashMap;

use askama::Template;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::Value;

use super::page::query_string;
use super::page::{self, Chrome, PageError, Posted};
use crate::access::{self, Method, Target};
use crate::db::crud::{self, ListQuery, Mode, Obj, StoreError, read};
use crate::db::kinds::{self, Access, Field, KINDS, Kind, ManyToMany, Ty};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::sessions::Session;

/// Rows on a list page.
pub const PAGE_ROWS: u64 = 50;
/// Rows of a relation's page (members, and candidates to add).
const MEMBER_ROWS: u64 = 25;
/// Up to this many rows of a referenced kind, a reference is a select;
/// beyond, a text box taking an id or a slug.
const SELECT_MAX: u64 = 200;
/// The most columns a list shows besides the id.
const MAX_COLUMNS: usize = 8;

/// The kind a page names, if it has generic pages.
fn page_kind(name: &str) -> Result<&'static Kind, PageError> {
    KINDS
        .iter()
        .find(|k| k.name == name && has_pages(k))
        .ok_or_else(|| PageError::not_found(format!("no page for {name:?}")))
}

/// Whether a kind has the generic pages: not users, not a kind that issues
/// a secret (both are the identities pages').
pub fn has_pages(kind: &Kind) -> bool {
    kind.issues.is_none() && !kind.fields.iter().any(|f| f.ty == Ty::Password)
}

fn pairs(q: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

/// A value as a form shows it.
fn shown(v: Option<&Value>, ty: Ty) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) if ty == Ty::StrList => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| i.to_string())
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Some(v) if ty == Ty::Json => serde_json::to_string_pretty(v).unwrap_or_default(),
        Some(v) => v.to_string(),
    }
}

fn label(name: &str) -> String {
    let s = name.replace('_', " ");
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => s,
    }
}

fn title(kind: &Kind) -> String {
    label(kind.name)
}

fn row_key(kind: &Kind, row: &Obj) -> String {
    kind.slug
        .and_then(|s| row.get(s))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| row.get("id").map(Value::to_string).unwrap_or_default())
}

fn row_id(row: &Obj) -> i64 {
    row.get("id").and_then(Value::as_i64).unwrap_or_default()
}

/// Asks the access rules whether the session may make this change, as the
/// API's inventory layer asks for `/api/v1/<kind>[/<key>[/<rest>]]`.
async fn allowed(
    st: &AppState,
    session: &Session,
    method: Method,
    kind: &Kind,
    key: Option<&str>,
    rest: Option<&str>,
) -> Result<(), PageError> {
    access::check(
        &st.db,
        st.config.shared_key_mode,
        &session.principal(),
        method,
        Target::Inventory {
            kind: kind.name,
            key,
            rest,
        },
        None,
    )
    .await
    .map_err(|e| PageError(ApiError::from(e)))
}

/// One row by id or slug, without its relations (a group's members are
/// on their own page).
async fn find(st: &AppState, kind: &'static Kind, key: &str) -> Result<Obj, PageError> {
    let filter = match (key.parse::<i64>(), kind.slug) {
        (Ok(_), _) | (_, None) => ("id".to_owned(), key.to_owned()),
        (Err(_), Some(slug)) => (slug.to_owned(), key.to_owned()),
    };
    let q = ListQuery {
        filters: vec![filter],
        limit: Some(1),
        bare: true,
        ..ListQuery::default()
    };
    let not_found = || PageError::not_found(format!("no {} matches {key:?}", kind.name));
    let page = st.db.list(kind, &q).await.map_err(|e| match e {
        StoreError::Invalid { .. } => not_found(),
        e => PageError::from(e),
    })?;
    page.items.into_iter().next().ok_or_else(not_found)
}

// ---------------------------------------------------------------- list

struct Column {
    label: String,
    /// The link that sorts by it (toggling the direction when it already does).
    href: String,
    /// `ascending`, `descending` or empty.
    sorted: &'static str,
}

struct Cell {
    text: String,
    href: String,
}

struct Row {
    href: String,
    cells: Vec<Cell>,
}

struct Filter {
    name: String,
    label: String,
    value: String,
    /// Empty: a text box (an id or a slug); else a select of these.
    options: Vec<String>,
}

#[derive(Template)]
#[template(path = "admin/inventory_list.html")]
struct ListPage {
    chrome: Chrome,
    kind: &'static str,
    search: String,
    searchable: bool,
    sort: String,
    filters: Vec<Filter>,
    /// Whether the kind takes a filter expression (systems).
    filterable: bool,
    /// The filter expression as given.
    filter: String,
    /// Why it did not parse, shown next to its box (the page is a 400).
    filter_error: String,
    /// The bulk actions page for this filter.
    bulk_href: String,
    columns: Vec<Column>,
    rows: Vec<Row>,
    total: u64,
    next: String,
    first: String,
    deep: bool,
}

fn columns_of(kind: &Kind) -> Vec<&'static Field> {
    kind.fields
        .iter()
        .filter(|f| read::sortable(f) && !matches!(f.ty, Ty::Text { max } if max > 255))
        .take(MAX_COLUMNS)
        .collect()
}

/// `GET /admin/{kind}/`.
pub async fn list(
    State(st): State<AppState>,
    session: Session,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, PageError> {
    let kind = page_kind(&name)?;
    // Empty boxes of the filter form mean no filter.
    let given: Vec<(String, String)> = pairs(raw.as_deref())
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect();
    let mut q = ListQuery::from_pairs(given.clone());
    q.bare = true;
    q.limit = Some(q.limit.unwrap_or(PAGE_ROWS));
    // A filter that does not parse is shown with its message next to its
    // box, on a 400 page with no rows.
    let mut filter_error = String::new();
    let page = match st.db.list(kind, &q).await {
        Err(StoreError::Invalid {
            field: Some(f),
            message,
        }) if f == "filter" => {
            filter_error = message;
            crud::Page {
                items: Vec::new(),
                total: 0,
                next: None,
            }
        }
        other => other?,
    };
    let cols = columns_of(kind);

    // The references' names and the relations' sizes: one statement each
    // for the whole page.
    let ids: Vec<i64> = page.items.iter().map(row_id).collect();
    let mut names: HashMap<&str, HashMap<i64, String>> = HashMap::new();
    for f in &cols {
        if let Ty::Ref(target) = f.ty
            && let Some(tk) = kinds::kind(target)
        {
            let refs: Vec<i64> = page
                .items
                .iter()
                .filter_map(|r| r.get(f.name).and_then(Value::as_i64))
                .collect();
            if !refs.is_empty() {
                names.insert(f.name, st.db.names(tk, &refs).await?);
            }
        }
    }
    let mut counts: Vec<(&ManyToMany, HashMap<i64, i64>)> = Vec::new();
    if !ids.is_empty() {
        for rel in kind.m2m {
            counts.push((rel, st.db.link_counts(rel, &ids).await?));
        }
    }

    let sort = q.sort.clone().unwrap_or_default();
    let keep: Vec<(&str, &str)> = given
        .iter()
        .filter(|(k, _)| k != "cursor" && k != "sort")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut columns = Vec::new();
    for name in std::iter::once("id").chain(cols.iter().map(|f| f.name)) {
        let (sorted, toggled) = if sort == name {
            ("ascending", format!("-{name}"))
        } else if sort == format!("-{name}") || (sort.is_empty() && name == "id") {
            if sort.is_empty() {
                ("ascending", format!("-{name}"))
            } else {
                ("descending", name.to_owned())
            }
        } else {
            ("", name.to_owned())
        };
        let mut p = keep.clone();
        p.push(("sort", &toggled));
        columns.push(Column {
            label: if name == "id" {
                "Id".into()
            } else {
                label(name)
            },
            href: query_string(p),
            sorted,
        });
    }
    for (rel, _) in &counts {
        columns.push(Column {
            label: label(rel.name),
            href: String::new(),
            sorted: "",
        });
    }
    let rows = page
        .items
        .iter()
        .map(|r| {
            let id = row_id(r);
            let mut cells = vec![Cell {
                text: id.to_string(),
                href: String::new(),
            }];
            for f in &cols {
                let mut text = shown(r.get(f.name), f.ty);
                let mut href = String::new();
                if let (Ty::Ref(target), Some(rid)) = (f.ty, r.get(f.name).and_then(Value::as_i64))
                {
                    text = names
                        .get(f.name)
                        .and_then(|m| m.get(&rid))
                        .cloned()
                        .unwrap_or_else(|| rid.to_string());
                    href = format!("/admin/{target}/{rid}/");
                }
                if f.ty == Ty::Bool {
                    text = match r.get(f.name).and_then(Value::as_bool) {
                        Some(true) => "yes".into(),
                        Some(false) => "no".into(),
                        None => String::new(),
                    };
                }
                cells.push(Cell { text, href });
            }
            for (rel, by) in &counts {
                cells.push(Cell {
                    text: by.get(&id).copied().unwrap_or(0).to_string(),
                    href: format!("/admin/{}/{id}/{}/", kind.name, rel.name),
                });
            }
            Row {
                href: format!("/admin/{}/{id}/", kind.name),
                cells,
            }
        })
        .collect();
    let value = |n: &str| {
        given
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let mut filters = Vec::new();
    for f in kind.fields {
        let options: Vec<String> = match f.ty {
            Ty::Enum(allowed) => allowed.iter().map(|s| (*s).to_owned()).collect(),
            Ty::Bool => vec!["true".into(), "false".into()],
            Ty::Ref(_) => Vec::new(),
            _ => continue,
        };
        if f.access == Access::WriteOnly {
            continue;
        }
        filters.push(Filter {
            name: f.name.into(),
            label: label(f.name),
            value: value(f.name),
            options,
        });
    }
    for rel in kind.m2m {
        filters.push(Filter {
            name: rel.name.into(),
            label: format!("In {}", rel.name),
            value: value(rel.name),
            options: Vec::new(),
        });
    }
    let next = match &page.next {
        Some(c) => {
            let mut p: Vec<(&str, &str)> = given
                .iter()
                .filter(|(k, _)| k != "cursor")
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            p.push(("cursor", c));
            query_string(p)
        }
        None => String::new(),
    };
    let first = query_string(
        given
            .iter()
            .filter(|(k, _)| k != "cursor")
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    let chrome = Chrome::new(&st, &session, title(kind), kind.name);
    let filter = q.filter.clone().unwrap_or_default();
    let bulk_href = query_string([("filter", filter.as_str())]);
    let mut response = page::render(&ListPage {
        chrome,
        kind: kind.name,
        search: q.search.clone().unwrap_or_default(),
        searchable: kind.fields.iter().any(read::searched),
        sort,
        filters,
        filterable: kind.name == "systems",
        filter,
        filter_error: filter_error.clone(),
        bulk_href: format!("/admin/systems/bulk{bulk_href}"),
        columns,
        rows,
        total: page.total,
        next,
        first: if first.is_empty() { "?".into() } else { first },
        deep: q.cursor.is_some(),
    });
    if !filter_error.is_empty() && response.status().is_success() {
        *response.status_mut() = StatusCode::BAD_REQUEST;
    }
    Ok(response)
}

// ---------------------------------------------------------------- forms

/// One field of a form.
struct Input {
    name: &'static str,
    label: String,
    doc: &'static str,
    /// `text`, `number`, `checkbox`, `select`, `textarea`, `secret` or
    /// `readonly`.
    widget: &'static str,
    value: String,
    checked: bool,
    /// A select's choices: value and label.
    options: Vec<(String, String)>,
    required: bool,
    maxlength: String,
    min: String,
    max: String,
    step: &'static str,
    /// A read-only reference's page.
    href: String,
    error: String,
    /// A textarea holding code (a script, JSON, YAML): monospace, and
    /// taller for long text.
    code: bool,
    rows: u32,
}

struct ChildList {
    label: String,
    add: String,
    rows: Vec<(String, String)>,
    total: u64,
    more: String,
}

struct Relation {
    label: String,
    href: String,
    count: i64,
}

#[derive(Template)]
#[template(path = "admin/inventory_form.html")]
struct FormPage {
    chrome: Chrome,
    kind: &'static str,
    /// The row's key (empty on create).
    key: String,
    action: String,
    inputs: Vec<Input>,
    errors: Vec<(String, String)>,
    general: String,
    children: Vec<ChildList>,
    relations: Vec<Relation>,
    created: String,
    updated: String,
    saved: bool,
    /// The kind's own section beneath the form ([`details::section`]),
    /// rendered.
    details: String,
}

/// The widget of a field.
fn widget(f: &Field) -> &'static str {
    if f.access == Access::ReadOnly || f.ty == Ty::Timestamp {
        return "readonly";
    }
    match f.ty {
        Ty::Bool => "checkbox",
        Ty::Enum(_) | Ty::Ref(_) => "select",
        Ty::Int { .. } | Ty::Float => "number",
        Ty::Json | Ty::Yaml | Ty::StrList => "textarea",
        Ty::Text { max } if max > 255 => "textarea",
        Ty::Secret => "secret",
        _ => "text",
    }
}

/// The form's inputs for `kind`, holding `values` (a stored row, or what
/// was posted), with `errors` by field.
async fn inputs(
    st: &AppState,
    kind: &'static Kind,
    values: &HashMap<String, String>,
    row: Option<&Obj>,
    errors: &HashMap<String, String>,
) -> Result<Vec<Input>, PageError> {
    let mut out = Vec::new();
    for f in kind.fields {
        if f.ty == Ty::Password {
            continue;
        }
        let mut w = widget(f);
        let value = values.get(f.name).cloned().unwrap_or_default();
        let mut options = Vec::new();
        let mut href = String::new();
        match f.ty {
            Ty::Enum(allowed) => {
                if f.nullable {
                    options.push((String::new(), "(none)".into()));
                }
                options.extend(allowed.iter().map(|a| ((*a).to_owned(), (*a).to_owned())));
            }
            Ty::Ref(target) => {
                let Some(tk) = kinds::kind(target) else {
                    continue;
                };
                if w == "readonly" {
                    if let Ok(id) = value.parse::<i64>() {
                        href = format!("/admin/{target}/{id}/");
                    }
                } else {
                    let q = ListQuery {
                        limit: Some(SELECT_MAX),
                        bare: true,
                        sort: tk.slug.map(str::to_owned),
                        ..ListQuery::default()
                    };
                    let page = st.db.list(tk, &q).await?;
                    if page.next.is_some() {
                        w = "text";
                    } else {
                        if f.nullable {
                            options.push((String::new(), "(none)".into()));
                        }
                        options.extend(
                            page.items
                                .iter()
                                .map(|r| (row_id(r).to_string(), row_key(tk, r))),
                        );
                        // A value typed as a slug selects its row.
                        if !value.is_empty() && !options.iter().any(|(v, _)| *v == value) {
                            options.push((value.clone(), value.clone()));
                        }
                    }
                }
            }
            _ => {}
        }
        let (min, max, step) = match f.ty {
            Ty::Int { min, max } => (min.to_string(), max.to_string(), "1"),
            Ty::Float => (String::new(), String::new(), "any"),
            _ => (String::new(), String::new(), ""),
        };
        let maxlength = match f.ty {
            Ty::Text { max } => max.to_string(),
            Ty::Hostname => "253".into(),
            _ => String::new(),
        };
        let checked = matches!(value.as_str(), "true" | "on");
        let value = if f.ty == Ty::Secret {
            // Never shown; whether one is set is.
            match row.and_then(|r| r.get(&format!("{}_set", f.name))) {
                Some(Value::Bool(true)) => "set".into(),
                _ => String::new(),
            }
        } else {
            value
        };
        out.push(Input {
            name: f.name,
            label: label(f.name),
            doc: f.doc,
            widget: w,
            value,
            checked,
            options,
            required: f.required() && w != "checkbox",
            maxlength,
            min,
            max,
            step,
            href,
            error: errors.get(f.name).cloned().unwrap_or_default(),
            code: matches!(f.ty, Ty::Json | Ty::Yaml | Ty::Text { max: 4096.. }),
            rows: match f.ty {
                Ty::Text { max: 4096.. } => 20,
                Ty::Json | Ty::Yaml => 8,
                _ => 4,
            },
        });
    }
    Ok(out)
}

/// A stored row's values, as the form shows them.
fn row_values(kind: &Kind, row: &Obj) -> HashMap<String, String> {
    kind.fields
        .iter()
        .map(|f| (f.name.to_owned(), shown(row.get(f.name), f.ty)))
        .collect()
}

/// A posted form's values, as typed (a checkbox: its last value).
fn posted_values(kind: &Kind, fields: &page::Fields) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for f in kind.fields {
        let v = match f.ty {
            Ty::Bool => fields.all(f.name).last().map(str::to_owned),
            _ => fields.get(f.name).map(str::to_owned),
        };
        if let Some(v) = v {
            out.insert(f.name.to_owned(), v);
        }
    }
    out
}

/// A posted form as the API's JSON body, and the errors of fields that are
/// wrong before validation sees them (JSON that does not parse). Fields
/// the kind does not have go in as they are, so validation names them.
fn body_of(kind: &Kind, fields: &page::Fields, mode: Mode) -> (Obj, Vec<crud::FieldError>) {
    let mut body = Obj::new();
    let mut errors = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for (name, raw) in &fields.0 {
        if name.starts_with('_') || seen.contains(&name.as_str()) {
            continue;
        }
        seen.push(name);
        let Some(f) = kind.field(name) else {
            body.insert(name.clone(), Value::String(raw.clone()));
            continue;
        };
        let empty = raw.trim().is_empty();
        let value = match f.ty {
            Ty::Bool => {
                let last = fields.all(name).last().unwrap_or_default();
                match last {
                    "true" | "on" => Value::Bool(true),
                    "false" => Value::Bool(false),
                    other => Value::String(other.to_owned()),
                }
            }
            Ty::Secret if empty => continue,
            _ if empty && f.nullable => Value::Null,
            Ty::Int { .. }
            | Ty::Float
            | Ty::Ref(_)
            | Ty::Enum(_)
            | Ty::Ipv4
            | Ty::Ipv6
            | Ty::Mac
            | Ty::Timestamp
                if empty && mode == Mode::Create =>
            {
                continue;
            }
            Ty::Int { .. } => raw
                .trim()
                .parse::<i64>()
                .map(Value::from)
                .unwrap_or_else(|_| Value::String(raw.clone())),
            Ty::Float => raw
                .trim()
                .parse::<f64>()
                .map(Value::from)
                .unwrap_or_else(|_| Value::String(raw.clone())),
            Ty::Ref(_) => match crud::RefKey::parse_str(raw.trim()) {
                crud::RefKey::Id(i) => Value::from(i),
                crud::RefKey::Slug(s) => Value::String(s),
            },
            Ty::StrList => Value::Array(
                raw.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(|l| Value::String(l.to_owned()))
                    .collect(),
            ),
            Ty::Json if empty => Value::Null,
            Ty::Json => match serde_json::from_str(raw) {
                Ok(v) => v,
                Err(e) => {
                    errors.push(crud::FieldError {
                        path: name.clone(),
                        message: format!("is not valid JSON: {e}"),
                    });
                    continue;
                }
            },
            // A browser sends a textarea's lines ended by CRLF; stored text
            // (a script above all) keeps Unix line ends.
            _ => Value::String(raw.replace("\r\n", "\n")),
        };
        body.insert(name.clone(), value);
    }
    (body, errors)
}

/// A form re-shown with what was typed and each message at its field.
async fn reshow(
    st: &AppState,
    session: &Session,
    kind: &'static Kind,
    stored: Option<(&str, &Obj)>,
    fields: &page::Fields,
    err: ApiError,
    field_errors: Vec<crud::FieldError>,
) -> Result<Response, PageError> {
    let (key, row) = (stored.map(|s| s.0), stored.map(|s| s.1));
    let (status, _, message, field) = err.parts();
    if status.is_server_error() {
        return Err(PageError(err));
    }
    let mut by_field: HashMap<String, String> = HashMap::new();
    let mut listed = Vec::new();
    let mut general = String::new();
    for e in field_errors {
        let top = e
            .path
            .split(['.', '['])
            .next()
            .unwrap_or_default()
            .to_owned();
        if kind.field(&top).is_some() {
            by_field
                .entry(top.clone())
                .and_modify(|m| {
                    m.push_str("; ");
                    m.push_str(&e.message);
                })
                .or_insert(e.message.clone());
            listed.push((top, e.message));
        } else {
            general.push_str(&format!("{}: {}. ", e.path, e.message));
        }
    }
    if by_field.is_empty() && general.is_empty() {
        match field.filter(|f| kind.field(f).is_some()) {
            Some(f) => {
                let msg = message
                    .strip_prefix(&format!("{f}: "))
                    .unwrap_or(&message)
                    .to_owned();
                by_field.insert(f.clone(), msg.clone());
                listed.push((f, msg));
            }
            None => general = message,
        }
    }
    let values = posted_values(kind, fields);
    let inputs = inputs(st, kind, &values, row, &by_field).await?;
    let page = FormPage {
        chrome: Chrome::new(
            st,
            session,
            match key {
                Some(k) => format!("{} {k}", title(kind)),
                None => format!("New {}", kind.name),
            },
            kind.name,
        ),
        kind: kind.name,
        key: key.unwrap_or_default().to_owned(),
        action: match key {
            Some(k) => format!("/admin/{}/{k}/", kind.name),
            None => format!("/admin/{}/new", kind.name),
        },
        inputs,
        errors: listed,
        general,
        children: Vec::new(),
        relations: Vec::new(),
        created: String::new(),
        updated: String::new(),
        saved: false,
        details: String::new(),
    };
    let mut resp = page::render(&page);
    *resp.status_mut() = if status.is_client_error() {
        status
    } else {
        StatusCode::BAD_REQUEST
    };
    Ok(resp)
}

/// `GET /admin/{kind}/new`: the create form, filled from the query
/// (`/admin/nics/new?system=12`).
pub async fn new_form(
    State(st): State<AppState>,
    session: Session,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, PageError> {
    let kind = page_kind(&name)?;
    if !session.admin {
        return Err(PageError::forbidden(
            "this account may read the inventory but not change it",
        ));
    }
    let mut values: HashMap<String, String> = kind
        .fields
        .iter()
        .filter_map(|f| {
            let v = match f.default {
                kinds::Default::Bool(b) => b.to_string(),
                kinds::Default::Int(i) => i.to_string(),
                kinds::Default::Str(s) => s.to_owned(),
                _ => return None,
            };
            Some((f.name.to_owned(), v))
        })
        .collect();
    for (k, v) in pairs(raw.as_deref()) {
        if kind.field(&k).is_some() {
            values.insert(k, v);
        }
    }
    let inputs = inputs(&st, kind, &values, None, &HashMap::new()).await?;
    Ok(page::render(&FormPage {
        chrome: Chrome::new(&st, &session, format!("New {}", kind.name), kind.name),
        kind: kind.name,
        key: String::new(),
        action: format!("/admin/{}/new", kind.name),
        inputs,
        errors: Vec::new(),
        general: String::new(),
        children: Vec::new(),
        relations: Vec::new(),
        created: String::new(),
        updated: String::new(),
        saved: false,
        details: String::new(),
    }))
}

/// `POST /admin/{kind}/new`: creates the row, or re-shows the form with
/// each message at its field.
pub async fn create(
    State(st): State<AppState>,
    Path(name): Path<String>,
    posted: Posted,
) -> Result<Response, PageError> {
    let kind = page_kind(&name)?;
    allowed(&st, &posted.session, Method::Post, kind, None, None).await?;
    let (body, mut errors) = body_of(kind, &posted.fields, Mode::Create);
    let prepared = match crud::validate(kind, &body, Mode::Create, &st.secrets, "") {
        Ok(p) if errors.is_empty() => p,
        other => {
            if let Err(mut e) = other {
                errors.append(&mut e);
            }
            let err = ApiError::from(crud::field_errors(errors.clone()));
            return reshow(
                &st,
                &posted.session,
                kind,
                None,
                &posted.fields,
                err,
                errors,
            )
            .await;
        }
    };
    match st.db.create(kind, prepared).await {
        Ok(obj) => {
            st.changed.notify_waiters();
            Ok(
                Redirect::to(&format!("/admin/{}/{}/?saved=1", kind.name, row_id(&obj)))
                    .into_response(),
            )
        }
        Err(e) => {
            let err = ApiError::from(e);
            reshow(
                &st,
                &posted.session,
                kind,
                None,
                &posted.fields,
                err,
                Vec::new(),
            )
            .await
        }
    }
}

/// `GET /admin/{kind}/{key}/`: the row, as a form for those who may
/// change it.
pub async fn edit_form(
    State(st): State<AppState>,
    session: Session,
    Path((name, key)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Response, PageError> {
    let kind = page_kind(&name)?;
    let row = find(&st, kind, &key).await?;
    let id = row_id(&row);
    let values = row_values(kind, &row);
    let inputs = inputs(&st, kind, &values, Some(&row), &HashMap::new()).await?;
    let mut children = Vec::new();
    for child in kind.children {
        let Some(ck) = kinds::kind(child.kind) else {
            continue;
        };
        let q = ListQuery {
            filters: vec![(child.parent_field.to_owned(), id.to_string())],
            limit: Some(MEMBER_ROWS),
            bare: true,
            ..ListQuery::default()
        };
        let page = st.db.list(ck, &q).await?;
        let describe = |r: &Obj| {
            ck.fields
                .iter()
                .filter(|f| f.name != child.parent_field && read::searched(f) || f.ty == Ty::Mac)
                .filter_map(|f| {
                    r.get(f.name)
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                })
                .collect::<Vec<_>>()
                .join(" · ")
        };
        children.push(ChildList {
            label: label(child.name),
            add: format!("/admin/{}/new?{}={id}", ck.name, child.parent_field),
            rows: page
                .items
                .iter()
                .map(|r| {
                    let d = describe(r);
                    (
                        format!("/admin/{}/{}/", ck.name, row_id(r)),
                        if d.is_empty() {
                            format!("#{}", row_id(r))
                        } else {
                            d
                        },
                    )
                })
                .collect(),
            total: page.total,
            more: format!("/admin/{}/?{}={id}", ck.name, child.parent_field),
        });
    }
    let mut relations = Vec::new();
    for rel in kind.m2m {
        let n = st.db.link_counts(rel, &[id]).await?;
        relations.push(Relation {
            label: label(rel.name),
            href: format!("/admin/{}/{id}/{}/", kind.name, rel.name),
            count: n.get(&id).copied().unwrap_or(0),
        });
    }
    let text = |k: &str| {
        row.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let chrome = Chrome::new(
        &st,
        &session,
        format!("{} {}", title(kind), row_key(kind, &row)),
        kind.name,
    );
    let created = if kind.timestamps {
        chrome.time(&text("created_at"))
    } else {
        String::new()
    };
    let updated = if kind.timestamps {
        chrome.time(&text("updated_at"))
    } else {
        String::new()
    };
    let query = pairs(raw.as_deref());
    let details = super::sections::section(&st, &chrome, kind.name, &row, &query).await?;
    Ok(page::render(&FormPage {
        chrome,
        kind: kind.name,
        key: id.to_string(),
        action: format!("/admin/{}/{id}/", kind.name),
        inputs,
        errors: Vec::new(),
        general: String::new(),
        children,
        relations,
        created,
        updated,
        saved: query.iter().any(|(k, _)| k == "saved"),
        details,
    }))
}

/// `POST /admin/{kind}/{key}/`: saves the row, or re-shows the form with
/// each message at its field.
pub async fn update(
    State(st): State<AppState>,
    Path((name, key)): Path<(String, String)>,
    posted: Posted,
) -> Result<Response, PageError> {
    let kind = page_kind(&name)?;
    allowed(&st, &posted.session, Method::Patch, kind, Some(&key), None).await?;
    let row = find(&st, kind, &key).await?;
    let id = row_id(&row).to_string();
    let (body, mut errors) = body_of(kind, &posted.fields, Mode::Update);
    access::check_fields(
        &posted.session.principal(),
        st.config.shared_key_mode,
        kind,
        body.keys().map(String::as_str),
    )
    .map_err(|e| PageError(ApiError::from(e)))?;
    let prepared = match crud::validate(kind, &body, Mode::Update, &st.secrets, "") {
        Ok(p) if errors.is_empty() => p,
        other => {
            if let Err(mut e) = other {
                errors.append(&mut e);
            }
            let err = ApiError::from(crud::field_errors(errors.clone()));
            return reshow(
                &st,
                &posted.session,
                kind,
                Some((&id, &row)),
                &posted.fields,
                err,
                errors,
            )
            .await;
        }
    };
    match st.db.update(kind, &id, prepared).await {
        Ok(_) => {
            st.changed.notify_waiters();
            Ok(Redirect::to(&format!("/admin/{}/{id}/?saved=1", kind.name)).into_response())
        }
        Err(e) => {
            let err = ApiError::from(e);
            reshow(
                &st,
                &posted.session,
                kind,
                Some((&id, &row)),
                &posted.fields,
                err,
                Vec::new(),
            )
            .await
        }
    }
}

#[derive(Template)]
#[template(path = "admin/inventory_delete.html")]
struct DeletePage {
    chrome: Chrome,
    kind: &'static str,
    id: i64,
    name: String,
    links: Vec<Relation>,
}

/// `GET /admin/{kind}/{key}/delete`: asks to confirm (no JavaScript needed).
pub async fn delete_form(
    State(st): State<AppState>,
    session: Session,
    Path((name, key)): Path<(String, String)>,
) -> Result<Response, PageError> {
    let kind = page_kind(&name)?;
    if !session.admin {
        return Err(PageError::forbidden(
            "this account may read the inventory but not change it",
        ));
    }
    let row = find(&st, kind, &key).await?;
    let id = row_id(&row);
    let mut links = Vec::new();
    for rel in kind.m2m {
        let n = st.db.link_counts(rel, &[id]).await?;
        links.push(Relation {
            label: rel.name.to_owned(),
            href: format!("/admin/{}/{id}/{}/", kind.name, rel.name),
            count: n.get(&id).copied().unwrap_or(0),
        });
    }
    let name = row_key(kind, &row);
    Ok(page::render(&DeletePage {
        chrome: Chrome::new(
            &st,
            &session,
            format!("Delete {} {name}", kind.name),
            kind.name,
        ),
        kind: kind.name,
        id,
        name,
        links,
    }))
}

/// `POST /admin/{kind}/{key}/delete`: deletes the row.
pub async fn delete(
    State(st): State<AppState>,
    Path((name, key)): Path<(String, String)>,
    posted: Posted,
) -> Result<Response, PageError> {
    let kind = page_kind(&name)?;
    allowed(&st, &posted.session, Method::Delete, kind, Some(&key), None).await?;
    if let Some(extra) = posted.fields.0.iter().find(|(k, _)| !k.starts_with('_')) {
        return Err(PageError::invalid(
            &extra.0,
            "unknown field; a delete takes none",
        ));
    }
    st.db.delete(kind, &key).await?;
    st.changed.notify_waiters();
    Ok(Redirect::to(&format!("/admin/{}/", kind.name)).into_response())
}

// ---------------------------------------------------------------- relations

struct Member {
    id: i64,
    name: String,
    href: String,
}

#[derive(Template)]
#[template(path = "admin/inventory_members.html")]
struct MembersPage {
    chrome: Chrome,
    owner: String,
    owner_href: String,
    rel: &'static str,
    other: &'static str,
    action: String,
    members: Vec<Member>,
    /// Links in all.
    all: i64,
    /// Links matching the search.
    total: u64,
    mq: String,
    aq: String,
    next: String,
    first: String,
    candidates: Vec<Member>,
    candidates_total: u64,
}

fn relation_of(
    kind: &'static Kind,
    rel: &str,
) -> Result<(&'static ManyToMany, &'static Kind), PageError> {
    let r = kind
        .relation(rel)
        .ok_or_else(|| PageError::not_found(format!("{} have no relation {rel:?}", kind.name)))?;
    let other =
        kinds::kind(r.kind).ok_or_else(|| PageError::not_found(format!("no kind {:?}", r.kind)))?;
    Ok((r, other))
}

/// `GET /admin/{kind}/{key}/{rel}/`: the row's links in a relation, a page
/// at a time (`mq` searches them, `mc` is the cursor), and the rows to
/// add (`aq` searches them).
pub async fn members(
    State(st): State<AppState>,
    session: Session,
    Path((name, key, rel)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Response, PageError> {
    let kind = page_kind(&name)?;
    let (rel, other) = relation_of(kind, &rel)?;
    let row = find(&st, kind, &key).await?;
    let id = row_id(&row);
    let given = pairs(raw.as_deref());
    let get = |n: &str| {
        given
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    let (mq, aq, mc) = (get("mq"), get("aq"), get("mc"));
    let sort = other.slug.map(str::to_owned);
    let q = ListQuery {
        search: mq.clone(),
        sort: sort.clone(),
        limit: Some(MEMBER_ROWS),
        cursor: mc.clone(),
        related: Some((rel, id, true)),
        bare: true,
        ..ListQuery::default()
    };
    let page = st.db.list(other, &q).await?;
    let as_member = |r: &Obj| Member {
        id: row_id(r),
        name: row_key(other, r),
        href: format!("/admin/{}/{}/", other.name, row_id(r)),
    };
    let (candidates, candidates_total) = if session.admin {
        let q = ListQuery {
            search: aq.clone(),
            sort,
            limit: Some(MEMBER_ROWS),
            related: Some((rel, id, false)),
            bare: true,
            ..ListQuery::default()
        };
        let c = st.db.list(other, &q).await?;
        (c.items.iter().map(as_member).collect(), c.total)
    } else {
        (Vec::new(), 0)
    };
    let keep = |cursor: Option<&str>| {
        let mut p: Vec<(&str, &str)> = Vec::new();
        if let Some(v) = &mq {
            p.push(("mq", v));
        }
        if let Some(v) = &aq {
            p.push(("aq", v));
        }
        if let Some(c) = cursor {
            p.push(("mc", c));
        }
        query_string(p)
    };
    let all = st.db.link_counts(rel, &[id]).await?;
    let owner = row_key(kind, &row);
    let path = format!("/admin/{}/{id}/{}/", kind.name, rel.name);
    Ok(page::render(&MembersPage {
        chrome: Chrome::new(
            &st,
            &session,
            format!("{} of {} {owner}", label(rel.name), kind.name),
            kind.name,
        ),
        owner_href: format!("/admin/{}/{id}/", kind.name),
        owner,
        rel: rel.name,
        other: other.name,
        action: format!("{path}{}", keep(mc.as_deref())),
        members: page.items.iter().map(as_member).collect(),
        all: all.get(&id).copied().unwrap_or(0),
        total: page.total,
        next: page
            .next
            .as_deref()
            .map(|c| keep(Some(c)))
            .unwrap_or_default(),
        first: if mc.is_some() {
            format!("{path}{}", keep(None))
        } else {
            String::new()
        },
        mq: mq.unwrap_or_default(),
        aq: aq.unwrap_or_default(),
        candidates,
        candidates_total,
    }))
}

/// `POST /admin/{kind}/{key}/{rel}/`: adds (`_op=add`) or removes
/// (`_op=remove`) the link to `target`, then back to the page as it was.
pub async fn link(
    State(st): State<AppState>,
    Path((name, key, rel)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
    posted: Posted,
) -> Result<Response, PageError> {
    let kind = page_kind(&name)?;
    let (relation, _) = relation_of(kind, &rel)?;
    allowed(&st, &posted.session, Method::Patch, kind, Some(&key), None).await?;
    let add = match posted.fields.get("_op") {
        Some("add") => true,
        Some("remove") => false,
        _ => return Err(PageError::invalid("_op", "expected add or remove")),
    };
    let target = posted
        .fields
        .get("target")
        .filter(|t| !t.is_empty())
        .ok_or_else(|| PageError::invalid("target", "is required: the row to add or remove"))?;
    st.db.link(kind, &key, relation, target, add).await?;
    st.changed.notify_waiters();
    let back = raw.map(|q| format!("?{q}")).unwrap_or_default();
    Ok(Redirect::to(&format!("/admin/{}/{key}/{rel}/{back}", kind.name)).into_response())
}
