//! `mash jobs`: the jobs queue. A list shows each job's module, state, the
//! job server that claimed it, its times and exit code; `mash jobs show ID`
//! prints a job with its whole output, as the job server reported it.

use std::collections::HashMap;
use std::io::Write;

use anyhow::{Context, Result};
use comfy_table::Cell;
use mprov_api::client::Client;
use serde_json::Value;

use crate::output::{self, Format, cell};

/// The columns of a job list.
const COLUMNS: [&str; 7] = [
    "id",
    "module",
    "status",
    "jobserver",
    "started_at",
    "ended_at",
    "return_code",
];

/// What a list asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Filters {
    /// Only jobs in this state.
    pub status: Option<String>,
    /// Only jobs of this module.
    pub module: Option<String>,
    /// Only jobs claimed by this job server (id or name).
    pub jobserver: Option<String>,
    /// At most this many, newest first.
    pub limit: Option<u32>,
}

/// The job servers' names by id, to show who claimed a job.
async fn jobserver_names(client: &Client) -> Result<HashMap<i64, String>> {
    let rows = client
        .list_all("jobservers", &[] as &[(&str, &str)])
        .await
        .context("could not list the job servers")?;
    Ok(rows
        .iter()
        .filter_map(|r| Some((r.get("id")?.as_i64()?, r.get("name")?.as_str()?.to_owned())))
        .collect())
}

/// A job's job server by name (its id when the name is unknown).
fn who(job: &Value, names: &HashMap<i64, String>) -> String {
    match job.get("jobserver").and_then(Value::as_i64) {
        Some(id) => names.get(&id).cloned().unwrap_or_else(|| id.to_string()),
        None => "-".to_owned(),
    }
}

/// Jobs as a table of [`COLUMNS`], the job server by name.
pub(crate) fn table(jobs: &[Value], names: &HashMap<i64, String>) -> String {
    let mut t = output::new_table();
    t.set_header(COLUMNS);
    for job in jobs {
        t.add_row(COLUMNS.map(|c| {
            Cell::new(match c {
                "jobserver" => who(job, names),
                _ => cell(job.get(c), false),
            })
        }));
    }
    output::render(t)
}

/// `mash jobs [list]`: newest first.
pub(crate) async fn list(
    client: &Client,
    filters: &Filters,
    format: Format,
    out: &mut dyn Write,
) -> Result<()> {
    let mut query: Vec<(String, String)> = vec![("sort".into(), "-id".into())];
    for (name, value) in [
        ("status", &filters.status),
        ("module", &filters.module),
        ("jobserver", &filters.jobserver),
    ] {
        if let Some(v) = value {
            query.push((name.into(), v.clone()));
        }
    }
    let jobs = match filters.limit {
        Some(limit) => {
            query.push(("limit".into(), limit.to_string()));
            client.list("jobs", &query).await.map(|p| p.items)
        }
        None => client.list_all("jobs", &query).await,
    }
    .context("could not list the jobs")?;
    if format == Format::Json {
        out.write_all(output::json(&Value::Array(jobs)).as_bytes())?;
        return Ok(());
    }
    if jobs.is_empty() {
        writeln!(out, "no jobs")?;
        return Ok(());
    }
    let names = jobserver_names(client).await?;
    out.write_all(table(&jobs, &names).as_bytes())?;
    Ok(())
}

/// One job: every field but its output as a table, then the whole output.
pub(crate) fn show_text(job: &Value, names: &HashMap<i64, String>) -> String {
    let mut fields = job.as_object().cloned().unwrap_or_default();
    let output = fields.remove("output");
    for name in ["jobserver", "for_jobserver"] {
        if let Some(v) = fields.get_mut(name)
            && let Some(id) = v.as_i64()
            && let Some(n) = names.get(&id)
        {
            *v = Value::String(format!("{n} ({id})"));
        }
    }
    let mut text = output::object_table(&Value::Object(fields));
    match output.as_ref().and_then(Value::as_str) {
        Some(o) if !o.is_empty() => {
            text.push_str("output:\n");
            text.push_str(o);
            if !o.ends_with('\n') {
                text.push('\n');
            }
        }
        _ => text.push_str("output: (none yet)\n"),
    }
    text
}

/// `mash jobs show ID`.
pub(crate) async fn show(
    client: &Client,
    id: &str,
    format: Format,
    out: &mut dyn Write,
) -> Result<()> {
    let job = client
        .get("jobs", id)
        .await
        .with_context(|| format!("could not show job {id}"))?;
    if format == Format::Json {
        out.write_all(output::json(&job).as_bytes())?;
        return Ok(());
    }
    let names = jobserver_names(client).await?;
    out.write_all(show_text(&job, &names).as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_list_names_the_job_server_and_a_show_prints_the_whole_output() {
        let names = HashMap::from([(3, "js1".to_owned())]);
        let jobs = [
            json!({"id": 2, "module": "image-sync", "status": "pending", "jobserver": null, "started_at": null, "ended_at": null, "return_code": null}),
            json!({"id": 1, "module": "image-update", "status": "failed", "jobserver": 3, "started_at": "2026-12-01T10:00:00Z", "ended_at": "2026-12-01T10:05:00Z", "return_code": 2}),
        ];
        let t = table(&jobs, &names);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("id") && lines[0].contains("return_code"),
            "{t}"
        );
        assert!(
            lines[2].contains("image-update") && lines[2].contains("js1"),
            "{t}"
        );
        assert!(lines[2].trim_end().ends_with('2'), "{t}");
        let output = "line 1\n".repeat(500) + "the end";
        let shown = show_text(
            &json!({"id": 1, "module": "image-update", "jobserver": 3, "output": output}),
            &names,
        );
        assert!(shown.contains("js1 (3)"), "{shown}");
        assert!(shown.ends_with(&format!("output:\n{output}\n")), "{shown}");
        assert!(
            show_text(&json!({"id": 1, "output": ""}), &names).ends_with("output: (none yet)\n")
        );
    }
}
