//! `mash discovery list|assign|dismiss`: the discovered nodes the control
//! service parked for an admin (`/api/v1/discovery/`).

use std::io::Write;

use anyhow::{Context, Result};
use comfy_table::Cell;
use mprov_api::client::Client;
use serde_json::Value;

use crate::DiscoveryAction;
use crate::output::{self, Format};

/// How many parked nodes one request asks for.
const PAGE: u32 = 500;

/// Runs `action`.
pub(crate) async fn run(
    client: &Client,
    action: &DiscoveryAction,
    format: Format,
    out: &mut dyn Write,
) -> Result<()> {
    match action {
        DiscoveryAction::List { json } => {
            let format = if *json { Format::Json } else { format };
            list(client, format, out).await
        }
        DiscoveryAction::Assign {
            mac,
            system,
            nic,
            replace,
        } => {
            let v = client
                .assign_discovered(mac, system, nic, *replace)
                .await
                .with_context(|| format!("could not assign {mac} to {system} NIC {nic}"))?;
            if format == Format::Json {
                write!(out, "{}", output::json(&v))?;
                return Ok(());
            }
            let host = v["hostname"].as_str().unwrap_or(system);
            let replaced = v["replaced"]
                .as_str()
                .map(|m| format!(" (replacing {m})"))
                .unwrap_or_default();
            writeln!(
                out,
                "{mac} is now {host}'s NIC {nic}{replaced}; its next boot is a normal one."
            )?;
            Ok(())
        }
        DiscoveryAction::Dismiss { mac } => {
            client
                .dismiss_discovered(mac)
                .await
                .with_context(|| format!("could not dismiss {mac}"))?;
            writeln!(out, "dismissed {mac}")?;
            Ok(())
        }
    }
}

/// Every parked node, a page at a time.
async fn list(client: &Client, format: Format, out: &mut dyn Write) -> Result<()> {
    let mut items = Vec::new();
    let mut after = 0;
    loop {
        let page = client
            .discovered(after, PAGE)
            .await
            .context("could not list the discovered nodes")?;
        items.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["next"].as_i64() {
            Some(next) if next > after => after = next,
            _ => break,
        }
    }
    if format == Format::Json {
        write!(out, "{}", output::json(&Value::Array(items)))?;
        return Ok(());
    }
    let mut table = output::new_table();
    table.set_header(["mac", "heard on", "hardware", "matches", "last seen", "why"]);
    for p in &items {
        let report = &p["report"];
        let boot = report["boot_mac"].as_str().unwrap_or_default();
        let heard = report["links"]
            .as_array()
            .and_then(|links| links.iter().find(|l| l["mac"].as_str() == Some(boot)))
            .map_or("-".to_owned(), |l| match l["neighbour"].as_object() {
                Some(n) => format!(
                    "{} {}",
                    n.get("system_name")
                        .and_then(Value::as_str)
                        .or_else(|| n.get("chassis_id").and_then(Value::as_str))
                        .unwrap_or("?"),
                    n.get("port_id").and_then(Value::as_str).unwrap_or("?")
                ),
                None => "nothing heard".to_owned(),
            });
        let hw: Vec<&str> = ["vendor", "model", "serial"]
            .iter()
            .filter_map(|k| report["hardware"][k].as_str())
            .collect();
        let matches = match p["candidate"].as_object() {
            Some(c) => format!(
                "{} {}",
                c.get("hostname").and_then(Value::as_str).unwrap_or("?"),
                c.get("nic_name").and_then(Value::as_str).unwrap_or("?")
            ),
            None => "-".to_owned(),
        };
        table.add_row([
            Cell::new(p["mac"].as_str().unwrap_or_default()),
            Cell::new(heard),
            Cell::new(if hw.is_empty() {
                "-".to_owned()
            } else {
                hw.join(" ")
            }),
            Cell::new(matches),
            Cell::new(p["last_seen"].as_str().unwrap_or_default()),
            Cell::new(p["reason"].as_str().unwrap_or_default()),
        ]);
    }
    out.write_all(output::render(table).as_bytes())?;
    writeln!(
        out,
        "{} parked; assign one with: mash discovery assign MAC SYSTEM NIC",
        items.len()
    )?;
    Ok(())
}
