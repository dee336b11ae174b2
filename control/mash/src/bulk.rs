//! `mash systems bulk` and `mash audit`: bulk actions on the systems a
//! filter matches, shown first as a preview (the count and the first host
//! names) and applied only with `--confirm N`, N the count the preview
//! showed; and the audit log those actions write.

use std::io::Write;

use anyhow::{Context, Result};
use comfy_table::Cell;
use mprov_api::bulk::{AuditEntry, BulkRequest};
use mprov_api::client::Client;

use crate::output::{self, Format};

/// `mash systems bulk ACTION [ARG] --filter F [--confirm N]`.
pub(crate) async fn bulk(
    client: &Client,
    action: &str,
    arg: Option<&str>,
    filter: &str,
    confirm: Option<u64>,
    format: Format,
    out: &mut dyn Write,
) -> Result<()> {
    // add-to-group reads as add_to_group: both spellings work.
    let action = action.replace('-', "_");
    let mut request = BulkRequest {
        filter: filter.to_owned(),
        action: action.clone(),
        group: None,
        image: None,
        netboot: None,
        confirm_count: confirm,
    };
    match action.as_str() {
        "add_to_group" | "remove_from_group" => request.group = arg.map(str::to_owned),
        "set_image" => request.image = arg.map(str::to_owned),
        "set_netboot" => {
            request.netboot = match arg {
                Some("on" | "true") => Some(true),
                Some("off" | "false") => Some(false),
                Some(other) => anyhow::bail!("set_netboot takes on or off, not {other:?}"),
                None => None,
            }
        }
        _ => {}
    }
    let answer = client.bulk_action(&request).await.with_context(|| {
        format!(
            "could not {} the systems matching {filter:?}",
            verb(&action)
        )
    })?;
    if format == Format::Json {
        out.write_all(output::json(&serde_json::to_value(&answer)?).as_bytes())?;
        return Ok(());
    }
    let what = describe(&request);
    if answer.applied {
        writeln!(
            out,
            "{what}: applied to {} systems. The audit log has the entry: mash audit",
            answer.count
        )?;
        return Ok(());
    }
    let shown = answer.hosts.join(", ");
    let more = if answer.count > answer.hosts.len() as u64 {
        ", ..."
    } else {
        ""
    };
    writeln!(
        out,
        "{} systems match {filter:?}{}{shown}{more}",
        answer.count,
        if answer.hosts.is_empty() { "" } else { ": " }
    )?;
    writeln!(
        out,
        "{what}: nothing changed yet. To apply it to these {n} systems, run again with --confirm {n}",
        n = answer.count
    )?;
    Ok(())
}

fn verb(action: &str) -> String {
    action.replace('_', " ")
}

/// The action and its argument, in words.
fn describe(r: &BulkRequest) -> String {
    let arg = r
        .group
        .as_deref()
        .or(r.image.as_deref())
        .map(str::to_owned)
        .or(r.netboot.map(|on| if on { "on" } else { "off" }.to_owned()));
    match arg {
        Some(a) => format!("{} {a}", r.action),
        None => r.action.clone(),
    }
}

const COLUMNS: [&str; 7] = ["id", "at", "who", "action", "detail", "count", "filter"];

/// `mash audit`: the newest entries first, every page unless `--limit`.
pub(crate) async fn audit(
    client: &Client,
    limit: Option<u32>,
    format: Format,
    out: &mut dyn Write,
) -> Result<()> {
    let mut entries: Vec<AuditEntry> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .audit(limit.or(Some(1000)), cursor.as_deref())
            .await
            .context("could not read the audit log")?;
        entries.extend(page.items);
        match (page.next, limit) {
            (Some(next), None) => cursor = Some(next),
            _ => break,
        }
    }
    if format == Format::Json {
        out.write_all(output::json(&serde_json::to_value(&entries)?).as_bytes())?;
        return Ok(());
    }
    if entries.is_empty() {
        writeln!(out, "no bulk actions yet")?;
        return Ok(());
    }
    let mut t = output::new_table();
    t.set_header(COLUMNS);
    for e in &entries {
        let v = serde_json::to_value(e)?;
        t.add_row(COLUMNS.map(|c| Cell::new(output::cell(v.get(c), false))));
    }
    out.write_all(output::render(t).as_bytes())?;
    Ok(())
}
