//! How mash prints rows: plain tables for people, JSON for programs.
//!
//! Tables have no borders and one row a line, so `grep` and `awk` work on
//! them; lists are joined by commas, and `null` and the empty list show as
//! `-`. Cells with spaces (or empty strings) still break `awk`'s word
//! splitting, which is what `--json` is for. A list's table shows the kind's main columns
//! (`KindInfo::columns`); `show` prints every field the server returned, in
//! its order.

use comfy_table::{Cell, Table, TableStyle};
use serde_json::Value;

use crate::kinds::KindInfo;

/// How mash prints results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    #[default]
    Table,
    /// Pretty-printed JSON for programs.
    Json,
}

/// Rows of `kind` as a table of its main columns.
pub(crate) fn list_table(kind: &KindInfo, items: &[Value]) -> String {
    let mut table = new_table();
    table.set_header(kind.columns.iter().copied());
    for item in items {
        table.add_row(
            kind.columns
                .iter()
                .map(|c| Cell::new(cell(item.get(c), false))),
        );
    }
    render(table)
}

/// One row as a table of field and value, every field in the server's order.
pub(crate) fn object_table(item: &Value) -> String {
    let mut table = new_table();
    table.set_header(["field", "value"]);
    match item {
        Value::Object(fields) => {
            for (name, value) in fields {
                table.add_row([name.clone(), cell(Some(value), true)]);
            }
        }
        other => {
            table.add_row(["value".to_owned(), cell(Some(other), true)]);
        }
    }
    render(table)
}

/// Pretty JSON, newline-terminated.
pub(crate) fn json(value: &Value) -> String {
    let mut out = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    out.push('\n');
    out
}

pub(crate) fn new_table() -> Table {
    let mut table = Table::new();
    table.load_style(TableStyle::new().header_separator(comfy_table::LineStyle::none()));
    table.force_no_tty();
    table
}

pub(crate) fn render(mut table: Table) -> String {
    // Two spaces between columns and none at the line's edges.
    let count = table.column_count();
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, if i + 1 == count { 0 } else { 2 }));
    }
    let mut out = table.trim_fmt();
    out.push('\n');
    out
}

/// One value as table text. In a list, nested objects (a system's NICs) are
/// summarised as `name=mac`; in `show` (`expand`), each is its JSON on a line.
pub(crate) fn cell(value: Option<&Value>, expand: bool) -> String {
    match value {
        None | Some(Value::Null) => "-".to_owned(),
        Some(Value::Array(items)) if items.is_empty() => "-".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) if expand && items.iter().any(Value::is_object) => items
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
        Some(Value::Array(items)) => items.iter().map(item).collect::<Vec<_>>().join(","),
        Some(other) => other.to_string(),
    }
}

/// One list item: scalars as they are, objects summarised.
fn item(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Object(fields) => {
            let text = |k: &str| {
                fields
                    .get(k)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
            };
            match (text("name"), text("mac")) {
                (Some(name), Some(mac)) => format!("{name}={mac}"),
                (Some(one), None) | (None, Some(one)) => one.to_owned(),
                (None, None) => fields
                    .get("id")
                    .map_or_else(|| value.to_string(), Value::to_string),
            }
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kinds::kind;

    #[test]
    fn list_tables() {
        let systems = kind("systems").expect("systems");
        let items = [
            json!({
                "id": 1, "hostname": "n001", "image": 3, "groups": [1, 2], "netboot": true,
                "stateful": false, "created_at": "2026-01-01T00:00:00Z",
                "nics": [{"id": 7, "name": "eth0", "mac": "aa:bb:cc:dd:ee:01"}, {"id": 8, "name": "ib0", "mac": null}],
            }),
            json!({"id": 22, "hostname": "login", "image": null, "groups": [], "netboot": false, "stateful": true, "nics": []}),
        ];
        assert_eq!(
            list_table(systems, &items),
            "\
id  hostname  image  groups  netboot  stateful  nics
1   n001      3      1,2     true     false     eth0=aa:bb:cc:dd:ee:01,ib0
22  login     -      -       false    true      -
"
        );
        let groups = kind("groups").expect("groups");
        assert_eq!(
            list_table(groups, &[]),
            "id  slug  name  priority  tmpfs_root_size  prov_interface\n"
        );
    }

    #[test]
    fn object_tables() {
        let item = json!({
            "id": 5, "hostname": "n5", "groups": ["a", "b"], "image": null,
            "nics": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:05"}],
            "config_params": "",
        });
        assert_eq!(
            object_table(&item),
            "\
field          value
id             5
hostname       n5
groups         a,b
image          -
nics           {\"name\":\"eth0\",\"mac\":\"aa:bb:cc:dd:ee:05\"}
config_params
"
        );
    }

    #[test]
    fn list_items() {
        assert_eq!(item(&json!({"id": 4})), "4");
        assert_eq!(item(&json!({"mac": "m"})), "m");
        assert_eq!(item(&json!({"x": 1})), r#"{"x":1}"#);
        assert_eq!(item(&json!(3)), "3");
        assert_eq!(
            cell(Some(&json!([{"id": 1}, {"id": 2}])), true),
            "{\"id\":1}\n{\"id\":2}"
        );
        assert_eq!(cell(None, false), "-");
    }

    #[test]
    fn json_output() {
        assert_eq!(json(&json!({"a": [1]})), "{\n  \"a\": [\n    1\n  ]\n}\n");
    }
}
