//! `mash boot status [HOST]`: a node's boot timeline, each step with how long
//! it took until the next one; without a host, where every node is.

use std::io::Write;

use anyhow::{Context, Result};
use comfy_table::Cell;
use mprov_api::boot::{BootEvent, BootPhase};
use mprov_api::client::Client;

use crate::output::{self, Format};

/// Seconds since the epoch of a stored time (`YYYY-MM-DDTHH:MM:SSZ`).
pub(crate) fn epoch(at: &str) -> Option<i64> {
    let b = at.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[10] != b'T' || b[19] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| at.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// `1m05s`, `7s`.
fn took(secs: i64) -> String {
    if secs >= 60 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{secs}s")
    }
}

/// One boot as a table: step, time, how long until the next step, who said
/// so, and the detail; then the whole boot's duration.
pub(crate) fn timeline_table(events: &[BootEvent]) -> String {
    let mut table = output::new_table();
    table.set_header(["step", "at", "took", "source", "ip", "detail"]);
    for (i, e) in events.iter().enumerate() {
        let next = events.get(i + 1);
        let duration = match (epoch(&e.at), next.and_then(|n| epoch(&n.at))) {
            (Some(a), Some(b)) => took(b - a),
            _ => "-".to_owned(),
        };
        table.add_row([
            Cell::new(e.phase.as_str()),
            Cell::new(&e.at),
            Cell::new(duration),
            Cell::new(&e.source),
            Cell::new(e.ip.map_or_else(|| "-".to_owned(), |i| i.to_string())),
            Cell::new(if e.detail.is_empty() { "-" } else { &e.detail }),
        ]);
    }
    let mut out = output::render(table);
    if let (Some(first), Some(last)) = (events.first(), events.last()) {
        let total = epoch(&first.at)
            .zip(epoch(&last.at))
            .map(|(a, b)| took(b - a));
        let state = match last.phase {
            BootPhase::Ready => "ready",
            BootPhase::Failed | BootPhase::ChecksumMismatch => "failing",
            _ => "booting",
        };
        let who = last
            .hostname
            .clone()
            .or_else(|| last.mac.clone())
            .unwrap_or_default();
        out.push_str(&format!(
            "{who}: {state}, {} from {} to {}\n",
            total.unwrap_or_else(|| "-".into()),
            first.phase.as_str(),
            last.phase.as_str()
        ));
        for failed in failed_scripts(events) {
            out.push_str(&format!("script failed: {failed}\n"));
        }
    }
    out
}

/// The first line of each `script` step of a script that failed or timed
/// out (`<slug>: failed, exit <code>, <duration>`): its output's tail is in
/// the table.
fn failed_scripts(events: &[BootEvent]) -> Vec<&str> {
    events
        .iter()
        .filter(|e| e.phase == BootPhase::Script)
        .filter_map(|e| e.detail.lines().next())
        .map(|line| line.strip_suffix("; output tail:").unwrap_or(line))
        .filter(|line| {
            line.split_once(": ").is_some_and(|(_, rest)| {
                rest.starts_with("failed") || rest.starts_with("timed out")
            })
        })
        .collect()
}

/// The latest event of every node.
pub(crate) fn summary_table(events: &[BootEvent]) -> String {
    let mut table = output::new_table();
    table.set_header(["node", "mac", "last step", "at", "source"]);
    for e in events {
        table.add_row([
            e.hostname.clone().unwrap_or_else(|| "(unknown)".into()),
            e.mac.clone().unwrap_or_else(|| "-".into()),
            e.phase.as_str().to_owned(),
            e.at.clone(),
            e.source.clone(),
        ]);
    }
    output::render(table)
}

/// `mash boot status [HOST]`.
pub(crate) async fn status(
    client: &Client,
    host: Option<&str>,
    all: bool,
    format: Format,
    out: &mut dyn Write,
) -> Result<()> {
    let events = client
        .boot_events(host, all)
        .await
        .with_context(|| match host {
            Some(h) => format!("could not read the boot timeline of {h}"),
            None => "could not read the boot timelines".to_owned(),
        })?;
    if format == Format::Json {
        let v = serde_json::to_value(&events)?;
        write!(out, "{}", output::json(&v))?;
        return Ok(());
    }
    match host {
        None if events.is_empty() => writeln!(out, "no node has reported a boot yet")?,
        None => write!(out, "{}", summary_table(&events))?,
        Some(h) if events.is_empty() => writeln!(
            out,
            "{h} has no boot events yet: power it on; its job server reports DHCP and downloads, the node the rest"
        )?,
        Some(_) if all => {
            let mut boot = Vec::new();
            for e in events {
                if boot
                    .last()
                    .is_some_and(|l: &BootEvent| l.boot_id != e.boot_id)
                {
                    writeln!(out, "{}", timeline_table(&boot))?;
                    boot.clear();
                }
                boot.push(e);
            }
            write!(out, "{}", timeline_table(&boot))?;
        }
        Some(_) => write!(out, "{}", timeline_table(&events))?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(phase: BootPhase, at: &str) -> BootEvent {
        BootEvent {
            id: 1,
            system: Some(1),
            hostname: Some("c01".into()),
            mac: None,
            boot_id: 1,
            phase,
            at: at.into(),
            source: "node:c01".into(),
            ip: None,
            detail: String::new(),
        }
    }

    #[test]
    fn a_failed_script_shows_its_name_exit_code_and_tail() {
        let mut ok = ev(BootPhase::Script, "2026-01-01T10:00:01Z");
        ok.detail = "mount: success, exit 0, 0.2 s; output tail:\nmounted".into();
        let mut bad = ev(BootPhase::Script, "2026-01-01T10:00:03Z");
        bad.detail = "join: failed, exit 3, 2.0 s; output tail:\nno scheduler\nbye".into();
        let mut failed = ev(BootPhase::Failed, "2026-01-01T10:00:03Z");
        failed.detail = "post-boot scripts failed (join): join exited 3".into();
        let t = timeline_table(&[
            ev(BootPhase::Scripts, "2026-01-01T10:00:00Z"),
            ok,
            bad,
            failed,
        ]);
        assert!(t.contains("no scheduler") && t.contains("bye"), "{t}");
        assert!(t.contains("post-boot scripts failed (join)"), "{t}");
        assert!(
            t.ends_with(
                "c01: failing, 3s from scripts to failed\nscript failed: join: failed, exit 3, 2.0 s\n"
            ),
            "{t}"
        );
    }

    #[test]
    fn each_step_shows_how_long_it_took() {
        assert_eq!(epoch("1970-01-02T00:00:01Z"), Some(86_401));
        assert_eq!(epoch("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(epoch("garbage"), None);
        let t = timeline_table(&[
            ev(BootPhase::DhcpAcked, "2026-01-01T10:00:00Z"),
            ev(BootPhase::Enrolled, "2026-01-01T10:00:07Z"),
            ev(BootPhase::Ready, "2026-01-01T10:01:12Z"),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[1].starts_with("dhcp_acked") && lines[1].contains(" 7s "),
            "{t}"
        );
        assert!(lines[2].contains(" 1m05s "), "{t}");
        assert!(
            t.ends_with("c01: ready, 1m12s from dhcp_acked to ready\n"),
            "{t}"
        );
    }
}
