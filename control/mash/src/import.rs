//! `mash import`: a CSV of systems to one bulk create.
//!
//! The CSV has a header row naming any of [`COLUMNS`] (only `hostname` is
//! required) and one NIC per row; rows with the same hostname add NICs to one
//! system, so a sheet exported from a spreadsheet of cabling imports as is.
//! Blank cells are left out of the body, so the server's defaults apply.
//!
//! The whole file goes in one `POST /api/v1/systems/bulk`: the server checks
//! every row and creates all of them or none, in one transaction. When it
//! refuses, it names bad rows by their index in the array we sent
//! (`rows[3].nics[0].mac`); [`LineMap`] turns those back into CSV line
//! numbers, which is what the person holding the file needs.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Read;

use anyhow::{Context, Result, bail};
use mprov_api::ApiError;
use serde_json::{Map, Value};

use crate::values::id_or_slug;

/// The columns an import file may have.
pub(crate) const COLUMNS: &[&str] = &[
    "hostname", "image", "groups", "nic", "mac", "ipv4", "ipv6", "network", "bootable",
];

/// A CSV turned into a bulk body, with where each part came from.
#[derive(Debug, PartialEq)]
pub(crate) struct Import {
    /// The systems, in order of first appearance: the body of the bulk call.
    pub(crate) rows: Vec<Value>,
    /// Where each system and NIC came from.
    pub(crate) lines: LineMap,
}

/// The CSV lines behind each system of the bulk body and each of its NICs.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct LineMap {
    systems: Vec<SystemLines>,
}

#[derive(Debug, PartialEq)]
struct SystemLines {
    hostname: String,
    /// Every line of the system, in order.
    lines: Vec<u64>,
    /// The line of each NIC, by its index in `nics`.
    nics: Vec<u64>,
}

/// A column's meaning.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Col {
    Hostname,
    Image,
    Groups,
    Nic(&'static str),
    Bootable,
    Network,
}

fn column(name: &str) -> Option<Col> {
    Some(match name {
        "hostname" => Col::Hostname,
        "image" => Col::Image,
        "groups" => Col::Groups,
        "nic" => Col::Nic("name"),
        "mac" => Col::Nic("mac"),
        "ipv4" => Col::Nic("ipv4"),
        "ipv6" => Col::Nic("ipv6"),
        "network" => Col::Network,
        "bootable" => Col::Bootable,
        _ => return None,
    })
}

/// Reads an import CSV into a bulk body. Errors name the CSV line.
pub(crate) fn from_csv(input: impl Read) -> Result<Import> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .from_reader(input);
    let header = reader
        .headers()
        .context("could not read the header row")?
        .clone();
    let mut cols = Vec::with_capacity(header.len());
    for (i, name) in header.iter().enumerate() {
        let name = name.to_ascii_lowercase();
        let Some(col) = column(&name) else {
            bail!(
                "line 1: unknown column {name:?}; the columns are {}",
                COLUMNS.join(",")
            );
        };
        if header.iter().take(i).any(|n| n.eq_ignore_ascii_case(&name)) {
            bail!("line 1: column {name:?} appears twice");
        }
        cols.push(col);
    }
    if !cols.contains(&Col::Hostname) {
        bail!(
            "line 1: the header has no hostname column (columns: {})",
            COLUMNS.join(",")
        );
    }

    let mut rows: Vec<Map<String, Value>> = Vec::new();
    let mut lines = LineMap::default();
    let mut by_host: HashMap<String, usize> = HashMap::new();
    // Which line set each system-level field, to name both lines of a conflict.
    let mut set_on: HashMap<(usize, &'static str), u64> = HashMap::new();
    for record in reader.records() {
        let record = record.map_err(csv_error)?;
        let line = record.position().map_or(0, |p| p.line());
        if record.iter().all(str::is_empty) {
            continue;
        }
        let mut hostname = "";
        let mut system: Vec<(&'static str, Value)> = Vec::new();
        let mut nic = Map::new();
        for (col, cell) in cols.iter().zip(record.iter()) {
            if cell.is_empty() {
                continue;
            }
            match col {
                Col::Hostname => hostname = cell,
                Col::Image => system.push(("image", id_or_slug(cell))),
                Col::Groups => {
                    let groups = cell
                        .split(';')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(id_or_slug)
                        .collect();
                    system.push(("groups", Value::Array(groups)));
                }
                Col::Nic(field) => {
                    nic.insert((*field).to_owned(), Value::from(cell));
                }
                Col::Network => {
                    nic.insert("network".to_owned(), id_or_slug(cell));
                }
                Col::Bootable => {
                    let value = parse_bool(cell).with_context(|| {
                        format!("line {line}: bootable {cell:?} is not true or false")
                    })?;
                    nic.insert("bootable".to_owned(), Value::Bool(value));
                }
            }
        }
        if hostname.is_empty() {
            bail!("line {line}: the hostname is blank");
        }
        let index = *by_host.entry(hostname.to_owned()).or_insert_with(|| {
            let mut row = Map::new();
            row.insert("hostname".to_owned(), Value::from(hostname));
            rows.push(row);
            lines.systems.push(SystemLines {
                hostname: hostname.to_owned(),
                lines: Vec::new(),
                nics: Vec::new(),
            });
            rows.len() - 1
        });
        let row = &mut rows[index];
        lines.systems[index].lines.push(line);
        for (field, value) in system {
            match row.get(field) {
                Some(old) if *old != value => {
                    let first = set_on.get(&(index, field)).copied().unwrap_or(0);
                    bail!(
                        "line {line}: {hostname} has {field} {} here but {} on line {first}",
                        show(&value),
                        show(old)
                    );
                }
                Some(_) => {}
                None => {
                    set_on.insert((index, field), line);
                    row.insert(field.to_owned(), value);
                }
            }
        }
        if !nic.is_empty() {
            let nics = row
                .entry("nics")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(nics) = nics {
                nics.push(Value::Object(nic));
            }
            lines.systems[index].nics.push(line);
        }
    }
    Ok(Import {
        rows: rows.into_iter().map(Value::Object).collect(),
        lines,
    })
}

/// A CSV reader's error, named by its line like ours.
fn csv_error(err: csv::Error) -> anyhow::Error {
    let line = err.position().map_or(0, |p| p.line());
    match err.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => anyhow::anyhow!("line {line}: {len} cells, but the header has {expected_len}"),
        _ => anyhow::Error::new(err).context(format!("line {line}: invalid CSV")),
    }
}

fn show(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(show).collect::<Vec<_>>().join(";"),
        other => other.to_string(),
    }
}

fn parse_bool(cell: &str) -> Option<bool> {
    match cell.to_ascii_lowercase().as_str() {
        "true" | "yes" | "y" | "1" => Some(true),
        "false" | "no" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// A reference to part of the bulk body found in a server message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowRef {
    /// The index of the system in the body.
    pub(crate) row: usize,
    /// The index of the NIC in that system's `nics`, when the error is in one.
    pub(crate) nic: Option<usize>,
}

/// Every `rows[N]` (or `[N]` at the start, or `row N`), with an optional
/// `.nics[M]` after it, in `text`, in order.
pub(crate) fn row_refs(text: &str) -> Vec<RowRef> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        let after = if let Some(r) = rest.strip_prefix("rows[") {
            Some(r)
        } else if i == 0 && rest.starts_with('[') {
            Some(&rest[1..])
        } else if let Some(r) = rest.strip_prefix("row ") {
            // "row 3" only when "row" starts a word.
            (i == 0 || !bytes[i - 1].is_ascii_alphanumeric()).then_some(r)
        } else {
            None
        };
        let Some(after) = after else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let Ok(row) = after[..digits].parse::<usize>() else {
            i += 1;
            continue;
        };
        let mut tail = &after[digits..];
        tail = tail.strip_prefix(']').unwrap_or(tail);
        let nic = tail.strip_prefix(".nics[").and_then(|t| {
            let n = t.bytes().take_while(u8::is_ascii_digit).count();
            t[..n].parse::<usize>().ok()
        });
        out.push(RowRef { row, nic });
        i = text.len() - tail.len();
    }
    out
}

impl LineMap {
    /// A reference as a place in the CSV: `line 7 (n004)`, or for a NIC,
    /// `line 9 (n004, its 2nd NIC)`. `None` when the index is out of range.
    pub(crate) fn describe(&self, r: RowRef) -> Option<String> {
        let system = self.systems.get(r.row)?;
        Some(
            match r.nic.and_then(|n| system.nics.get(n).map(|line| (n, line))) {
                Some((_, line)) => format!("line {line} ({})", system.hostname),
                None => {
                    let lines: Vec<String> = system.lines.iter().map(u64::to_string).collect();
                    let word = if lines.len() == 1 { "line" } else { "lines" };
                    format!("{word} {} ({})", lines.join(","), system.hostname)
                }
            },
        )
    }

    /// The server's refusal with every bad row it names mapped to CSV lines:
    /// one line of output per part of the message, at most `max` of them
    /// (0: all), then how many more there are.
    pub(crate) fn explain(&self, body: &ApiError, max: usize) -> String {
        let mut out = String::new();
        let mut parts: Vec<&str> = body
            .message
            .split(['\n', ';'])
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        // The server lists several errors as "3 errors: a; b; c".
        if let Some(first) = parts.first_mut()
            && let Some((count, rest)) = first.split_once(" errors: ")
            && count.bytes().all(|b| b.is_ascii_digit())
        {
            *first = rest;
        }
        if parts.is_empty() {
            parts.push(body.error.as_str());
        }
        let field_refs = body.field.as_deref().map(row_refs).unwrap_or_default();
        let mut mapped_any = false;
        let total = parts.len();
        if max > 0 && total > max {
            parts.truncate(max);
        }
        let shown = parts.len();
        for part in parts {
            let mut refs = row_refs(part);
            if refs.is_empty() && field_refs.len() == 1 {
                refs = field_refs.clone();
            }
            let places: Vec<String> = refs.iter().filter_map(|r| self.describe(*r)).collect();
            mapped_any |= !places.is_empty();
            if places.is_empty() {
                let _ = writeln!(out, "  {part}");
            } else {
                let _ = writeln!(out, "  {}: {part}", places.join(", "));
            }
        }
        if shown < total {
            let _ = writeln!(
                out,
                "  ... and {} more (--max-errors 0 shows all)",
                total - shown
            );
        }
        if let Some(field) = &body.field
            && !mapped_any
        {
            let places: Vec<String> = field_refs
                .iter()
                .filter_map(|r| self.describe(*r))
                .collect();
            if places.is_empty() {
                let _ = writeln!(out, "  (field {field})");
            } else {
                let _ = writeln!(out, "  {}: field {field}", places.join(", "));
            }
        }
        out.trim_end().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(csv: &str, expected: Result<Value, &str>) {
        match (from_csv(csv.as_bytes()), expected) {
            (Ok(got), Ok(rows)) => assert_eq!(Value::Array(got.rows), rows, "{csv}"),
            (Err(err), Err(message)) => {
                let err = format!("{err:#}");
                assert!(err.contains(message), "{csv}\n{err}");
            }
            (got, expected) => panic!("{csv}\ngot {got:?}\nexpected {expected:?}"),
        }
    }

    #[test]
    fn csv_to_bulk_body() {
        // One NIC per row; rows of one host add NICs; blank cells are omitted.
        check(
            "hostname,image,groups,nic,mac,ipv4,ipv6,network,bootable\n\
             n001,rocky9,compute;gpu,eth0,AA:BB:CC:00:00:01,10.0.0.1,,prov,true\n\
             n001,,,ib0,,10.1.0.1,,ib,false\n\
             n002,7,3, eth0 ,aa:bb:cc:00:00:02,10.0.0.2,fd00::2,5,\n",
            Ok(json!([
                {
                    "hostname": "n001",
                    "image": "rocky9",
                    "groups": ["compute", "gpu"],
                    "nics": [
                        {"name": "eth0", "mac": "AA:BB:CC:00:00:01", "ipv4": "10.0.0.1", "network": "prov", "bootable": true},
                        {"name": "ib0", "ipv4": "10.1.0.1", "network": "ib", "bootable": false},
                    ],
                },
                {
                    "hostname": "n002",
                    "image": 7,
                    "groups": [3],
                    "nics": [
                        {"name": "eth0", "mac": "aa:bb:cc:00:00:02", "ipv4": "10.0.0.2", "ipv6": "fd00::2", "network": 5},
                    ],
                },
            ])),
        );
        // Columns in any order, any case, only hostname required; a row of blank
        // cells, blank lines and comments are skipped; no NIC cells, no NIC.
        check(
            "MAC,Hostname\n# a comment\n\n,\n,n1\naa:bb:cc:dd:ee:ff,n2\n,n1\n",
            Ok(json!([
                {"hostname": "n1"},
                {"hostname": "n2", "nics": [{"mac": "aa:bb:cc:dd:ee:ff"}]},
            ])),
        );
        check("hostname\n", Ok(json!([])));
        // The same system fields repeated on later rows are fine.
        check(
            "hostname,image,groups,nic\nn1,img,a;b,eth0\nn1,img,a; b;,eth1\n",
            Ok(
                json!([{"hostname": "n1", "image": "img", "groups": ["a", "b"], "nics": [{"name": "eth0"}, {"name": "eth1"}]}]),
            ),
        );
        check(
            "hostname,bootable\nn1,Yes\nn2,0\n",
            Ok(json!([
                {"hostname": "n1", "nics": [{"bootable": true}]},
                {"hostname": "n2", "nics": [{"bootable": false}]},
            ])),
        );
    }

    #[test]
    fn csv_errors_name_lines() {
        check("name,mac\nx,y\n", Err("line 1: unknown column \"name\""));
        check(
            "hostname,mac,MAC\n",
            Err("line 1: column \"mac\" appears twice"),
        );
        check(
            "mac,ipv4\n",
            Err("line 1: the header has no hostname column"),
        );
        check(
            "hostname,mac\nn1,aa\n,bb\n",
            Err("line 3: the hostname is blank"),
        );
        check(
            "hostname,bootable\nn1,maybe\n",
            Err("line 2: bootable \"maybe\" is not true or false"),
        );
        check(
            "hostname,image\nn1,a\nn2,b\nn1,c\n",
            Err("line 4: n1 has image c here but a on line 2"),
        );
        check(
            "hostname,mac\nn1,aa\nn1,aa,extra\n",
            Err("line 3: 3 cells, but the header has 2"),
        );
        let err = from_csv(&b"hostname,mac\nn1,\xff\n"[..]).expect_err("not UTF-8");
        assert!(
            format!("{err:#}").starts_with("line 2: invalid CSV: "),
            "{err:#}"
        );
        check("", Err("the header has no hostname column"));
    }

    #[test]
    fn finding_row_references() {
        let check = |text: &str, expected: &[(usize, Option<usize>)]| {
            let expected: Vec<RowRef> = expected
                .iter()
                .map(|&(row, nic)| RowRef { row, nic })
                .collect();
            assert_eq!(row_refs(text), expected, "{text}");
        };
        check("rows[3].nics[0].mac: invalid MAC", &[(3, Some(0))]);
        check("rows[3].hostname", &[(3, None)]);
        check("[12].nics[2]", &[(12, Some(2))]);
        check(
            "rows[0].hostname: taken; rows[10].nics[1].mac: duplicate of rows[2].nics[0]",
            &[(0, None), (10, Some(1)), (2, Some(0))],
        );
        check("row 4: hostname taken", &[(4, None)]);
        check("arrow 4, rows[x], [5]", &[]);
        check("no rows here", &[]);
        check("ünïcode rows[1]", &[(1, None)]);
    }

    #[test]
    fn server_errors_map_to_lines() {
        let import =
            from_csv("hostname,nic,mac\nn1,eth0,aa\nn2,eth0,bb\nn2,eth1,cc\nn3,,\n".as_bytes())
                .expect("csv");
        assert_eq!(import.rows.len(), 3);
        let explain = |message: &str, field: Option<&str>| {
            import.lines.explain(
                &ApiError {
                    error: "invalid_field".into(),
                    message: message.into(),
                    field: field.map(Into::into),
                },
                0,
            )
        };
        assert_eq!(
            explain(
                "rows[1].nics[1].mac: \"cc\" is not a MAC",
                Some("rows[1].nics[1].mac")
            ),
            "  line 4 (n2): rows[1].nics[1].mac: \"cc\" is not a MAC"
        );
        assert_eq!(
            explain(
                "3 errors: rows[0].nics[0].mac: bad\nrows[1].hostname: taken; rows[9].x: out of range",
                None
            ),
            "  line 2 (n1): rows[0].nics[0].mac: bad\n  lines 3,4 (n2): rows[1].hostname: taken\n  rows[9].x: out of range"
        );
        // The row only in `field`.
        assert_eq!(
            explain("hostname is already taken", Some("rows[2].hostname")),
            "  line 5 (n3): hostname is already taken"
        );
        assert_eq!(
            explain("the body is not a list", None),
            "  the body is not a list"
        );
        assert_eq!(explain("bad", Some("body")), "  bad\n  (field body)");
        let many = ApiError {
            error: "conflict".into(),
            message: "3 errors: rows[0].hostname: taken; rows[1].hostname: taken; rows[2].hostname: taken".into(),
            field: Some("rows[0].hostname".into()),
        };
        assert_eq!(
            import.lines.explain(&many, 2),
            "  line 2 (n1): rows[0].hostname: taken\n  lines 3,4 (n2): rows[1].hostname: taken\n  ... and 1 more (--max-errors 0 shows all)"
        );
    }
}
