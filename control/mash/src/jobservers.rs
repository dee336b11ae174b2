//! `mash jobservers list` and `mash jobservers show NAME` as tables: each
//! job server's registered addresses, one a line, with the network it
//! serves there, how long ago its heartbeat came from there ("12 s ago",
//! "never"), the load and image streams that heartbeat carried, and the job
//! server's modules. The control service sends a node only to an address on
//! the node's network heard from within `MPROV_JOBSERVER_STALE_SECONDS`
//! (45 s by default), so a stale age here is why nodes skip one.
//!
//! A job server that registered no addresses (a row made by hand) shows its
//! row's addresses, network and heartbeat on one line, with no streams.
//! `--json` prints the rows as the API returns them (the per-address rows
//! under `registered_addresses`).

use std::collections::HashMap;

use comfy_table::Cell;
use serde_json::Value;

use crate::boot::epoch;
use crate::output;

/// The table's header.
const HEADER: [&str; 8] = [
    "id",
    "name",
    "address",
    "network",
    "heartbeat",
    "load",
    "streams",
    "modules",
];

/// How long before `now` (seconds since the epoch) the stored time `at`
/// was: `12 s ago`, `3 min ago`, `2 h ago`, `4 d ago`; `never` without one.
pub(crate) fn age(at: Option<&str>, now: i64) -> String {
    let Some(at) = at else {
        return "never".to_owned();
    };
    let Some(then) = epoch(at) else {
        return at.to_owned();
    };
    let secs = (now - then).max(0);
    match secs {
        0..120 => format!("{secs} s ago"),
        120..7200 => format!("{} min ago", secs / 60),
        7200..172_800 => format!("{} h ago", secs / 3600),
        _ => format!("{} d ago", secs / 86_400),
    }
}

/// A text, or `-`.
fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => "-".to_owned(),
    }
}

/// A load average with two decimals, or `-`.
fn load(v: Option<&Value>) -> String {
    v.and_then(Value::as_f64)
        .map_or_else(|| "-".to_owned(), |l| format!("{l:.2}"))
}

/// A network by its slug (`networks`: id → slug), else its id; `-` for none.
fn network(v: Option<&Value>, networks: &HashMap<i64, String>) -> String {
    match v.and_then(Value::as_i64) {
        Some(id) => networks.get(&id).cloned().unwrap_or_else(|| id.to_string()),
        None => "-".to_owned(),
    }
}

/// Job servers as the table described in the module docs, at `now`
/// (seconds since the epoch).
pub(crate) fn table(items: &[Value], networks: &HashMap<i64, String>, now: i64) -> String {
    let mut table = output::new_table();
    table.set_header(HEADER);
    for j in items {
        let modules = j["modules"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "-".to_owned());
        let registered = j["registered_addresses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let (id, name) = (text(j.get("id")), text(j.get("name")));
        if registered.is_empty() {
            let addresses = j["addresses"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .filter(|a| !a.is_empty())
                .unwrap_or_else(|| "-".to_owned());
            table.add_row([
                Cell::new(id),
                Cell::new(name),
                Cell::new(addresses),
                Cell::new(network(j.get("network"), networks)),
                Cell::new(age(j["heartbeat_at"].as_str(), now)),
                Cell::new(load(j.get("load_avg"))),
                Cell::new("-"),
                Cell::new(&modules),
            ]);
            continue;
        }
        for a in &registered {
            let heard = a["heartbeat_at"].as_str();
            table.add_row([
                Cell::new(&id),
                Cell::new(&name),
                Cell::new(text(a.get("address"))),
                Cell::new(network(a.get("network"), networks)),
                Cell::new(age(heard, now)),
                Cell::new(if heard.is_some() {
                    load(a.get("load_avg"))
                } else {
                    "-".to_owned()
                }),
                Cell::new(if heard.is_some() {
                    text(a.get("streams"))
                } else {
                    "-".to_owned()
                }),
                Cell::new(&modules),
            ]);
        }
    }
    output::render(table)
}

/// One job server: its row's fields (the per-address rows left to the
/// table below them), then its addresses as [`table`] shows them.
pub(crate) fn show(item: &Value, networks: &HashMap<i64, String>, now: i64) -> String {
    let mut row = item.clone();
    if let Value::Object(fields) = &mut row {
        fields.remove("registered_addresses");
    }
    let mut out = output::object_table(&row);
    out.push('\n');
    out.push_str(&table(std::slice::from_ref(item), networks, now));
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const NOW: i64 = 1_780_000_000;

    fn at(secs_ago: i64) -> String {
        // 1_780_000_000 is 2026-05-28T20:26:40Z.
        let base = epoch("2026-05-28T20:26:40Z").unwrap();
        assert_eq!(base, NOW);
        let t = NOW - secs_ago;
        let (d, s) = (
            t.div_euclid(86_400) - base.div_euclid(86_400),
            t.rem_euclid(86_400),
        );
        assert_eq!(d, 0, "keep the test's times within the day");
        format!(
            "2026-05-28T{:02}:{:02}:{:02}Z",
            s / 3600,
            s % 3600 / 60,
            s % 60
        )
    }

    #[test]
    fn ages() {
        assert_eq!(age(None, NOW), "never");
        assert_eq!(age(Some(&at(12)), NOW), "12 s ago");
        assert_eq!(age(Some(&at(0)), NOW), "0 s ago");
        assert_eq!(age(Some(&at(119)), NOW), "119 s ago");
        assert_eq!(age(Some(&at(600)), NOW), "10 min ago");
        assert_eq!(age(Some(&at(3 * 3600)), NOW), "3 h ago");
        assert_eq!(age(Some("2026-05-20T20:26:40Z"), NOW), "8 d ago");
        // A clock ahead of ours is no negative age.
        assert_eq!(age(Some("2026-05-28T20:27:00Z"), NOW), "0 s ago");
        assert_eq!(age(Some("soon"), NOW), "soon");
    }

    #[test]
    fn one_line_per_registered_address_and_one_for_a_row_made_by_hand() {
        let networks = HashMap::from([(1, "prov".to_owned()), (2, "rack2".to_owned())]);
        let items = [
            json!({"id": 3, "name": "js1", "modules": ["dnsmasq", "image-update"],
            "addresses": ["10.0.0.2", "10.0.2.2", "192.0.2.9"], "network": 1,
            "heartbeat_at": at(3), "load_avg": 0.5,
            "registered_addresses": [
                {"id": 1, "address": "10.0.0.2", "network": 1, "heartbeat_at": at(12), "load_avg": 0.5, "streams": 4},
                {"id": 2, "address": "10.0.2.2", "network": 2, "heartbeat_at": at(600), "load_avg": 1.25, "streams": 0},
                {"id": 3, "address": "192.0.2.9", "network": null, "heartbeat_at": null, "load_avg": 0.0, "streams": 0}
            ]}),
            json!({"id": 4, "name": "old", "modules": [], "addresses": ["10.0.0.9"], "network": 7,
                "heartbeat_at": null, "load_avg": 0.0, "registered_addresses": []}),
        ];
        assert_eq!(
            table(&items, &networks, NOW),
            "\
id  name  address    network  heartbeat   load  streams  modules
3   js1   10.0.0.2   prov     12 s ago    0.50  4        dnsmasq,image-update
3   js1   10.0.2.2   rack2    10 min ago  1.25  0        dnsmasq,image-update
3   js1   192.0.2.9  -        never       -     -        dnsmasq,image-update
4   old   10.0.0.9   7        never       0.00  -        -
"
        );
        let shown = show(&items[1], &networks, NOW);
        assert!(shown.starts_with("field"), "{shown}");
        assert!(!shown.contains("registered_addresses"), "{shown}");
        assert!(
            shown.ends_with(&format!("\n{}", table(&items[1..], &networks, NOW))),
            "{shown}"
        );
    }
}
