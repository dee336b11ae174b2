//! `libgenders`: the genders file pdsh and `nodeattr` read, written from the
//! inventory and rewritten whenever it changes.
//!
//! One line per system, by host name:
//!
//! ```text
//! c01 os=rocky9,image=compute,gpu,rack4,all
//! ```
//!
//! `os` is the slug of the distro of the system's image and `image` the
//! image's slug (each left out when the system has none), then the slug of
//! each group it belongs to, then `all`: `nodeattr -f FILE -n image=compute`
//! lists the systems booting `compute`, `pdsh -g gpu` reaches the group
//! `gpu`. The file is written whole beside its place, then renamed over it,
//! so a reader never sees half of one.
//!
//! It is not a queued job but a follower: the boot config's revision is the
//! inventory's, and each new one (the job server follows it anyway)
//! rebuilds the file from the systems, images, distros and groups, writing
//! it only when its text changed. Failures are logged once and retried.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use mprov_api::client::Client;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::daemon::retry::{Failure, Retry};
use crate::start::Snapshot;

/// Where the genders file goes unless the plugin file says otherwise.
pub const DEFAULT_FILE: &str = "/etc/genders";

/// The shortest time between two rebuilds.
pub const REBUILD_GAP: std::time::Duration = std::time::Duration::from_secs(1);

/// The file's first line.
pub const HEADER: &str =
    "# Written by mprov-jobserver (libgenders) from the inventory; edits are lost.";

/// The rows of the inventory the file is made of, as the API lists them.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// `systems`: `hostname`, `image` (an id), `groups` (ids).
    pub systems: Vec<Value>,
    /// `images`: `id`, `slug`, `distro` (an id).
    pub images: Vec<Value>,
    /// `distros`: `id`, `slug`.
    pub distros: Vec<Value>,
    /// `groups`: `id`, `slug`.
    pub groups: Vec<Value>,
}

/// Whether `text` can stand as a genders node name, attribute or value: no
/// space, comma, `=` or comment sign.
fn genders_word(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_graphic() && !matches!(c, ',' | '=' | '#' | '\\'))
}

/// The slugs of `rows` by id.
fn slugs(rows: &[Value]) -> BTreeMap<i64, &str> {
    rows.iter()
        .filter_map(|r| Some((r.get("id")?.as_i64()?, r.get("slug")?.as_str()?)))
        .collect()
}

/// The genders file of `inventory`: [`HEADER`], then one line per system
/// in host name order.
pub fn render(inventory: &Inventory) -> String {
    let (images, distros, groups) = (
        slugs(&inventory.images),
        slugs(&inventory.distros),
        slugs(&inventory.groups),
    );
    let image_distro: BTreeMap<i64, i64> = inventory
        .images
        .iter()
        .filter_map(|r| Some((r.get("id")?.as_i64()?, r.get("distro")?.as_i64()?)))
        .collect();
    let mut lines: BTreeMap<&str, String> = BTreeMap::new();
    for system in &inventory.systems {
        let Some(host) = system.get("hostname").and_then(Value::as_str) else {
            continue;
        };
        if !genders_word(host) {
            tracing::warn!("libgenders: host name {host:?} cannot go in a genders file; left out");
            continue;
        }
        let mut attrs: Vec<String> = Vec::new();
        let image = system.get("image").and_then(Value::as_i64);
        let distro = image.and_then(|i| image_distro.get(&i));
        if let Some(os) = distro
            .and_then(|d| distros.get(d))
            .filter(|s| genders_word(s))
        {
            attrs.push(format!("os={os}"));
        }
        if let Some(slug) = image
            .and_then(|i| images.get(&i))
            .filter(|s| genders_word(s))
        {
            attrs.push(format!("image={slug}"));
        }
        let members = system.get("groups").and_then(Value::as_array);
        for group in members.into_iter().flatten().filter_map(Value::as_i64) {
            if let Some(slug) = groups.get(&group).filter(|s| genders_word(s))
                && !attrs.iter().any(|a| a == slug)
                && *slug != "all"
            {
                attrs.push((*slug).to_owned());
            }
        }
        attrs.push("all".into());
        lines.insert(host, format!("{host} {}", attrs.join(",")));
    }
    let mut out = String::from(HEADER);
    out.push('\n');
    for line in lines.values() {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Reads what the file is made of.
pub async fn read(client: &Client) -> Result<Inventory> {
    let none: &[(&str, &str)] = &[];
    let (systems, images, distros, groups) = tokio::try_join!(
        client.list_all("systems", none),
        client.list_all("images", none),
        client.list_all("distros", none),
        client.list_all("groups", none),
    )
    .context("reading the systems, images, distros and groups")?;
    Ok(Inventory {
        systems,
        images,
        distros,
        groups,
    })
}

/// Writes `text` to `path`: whole to a file beside it, synced, then
/// renamed over it (mode 0644).
pub fn write_atomically(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map_or_else(|| "genders".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::Error::new(e).context(format!("cannot write {}", path.display()))
    })
}

/// Reads the inventory with `client` and writes the file at `path` if its
/// text is not `last`; the text now in place.
pub async fn update(client: &Client, path: &Path, last: Option<&str>) -> Result<String> {
    let text = render(&read(client).await?);
    if last != Some(text.as_str()) {
        let (p, t) = (path.to_owned(), text.clone());
        tokio::task::spawn_blocking(move || write_atomically(&p, &t))
            .await
            .context("the genders writer task")??;
        let systems = text.lines().count().saturating_sub(1);
        tracing::info!("libgenders: wrote {} ({systems} systems)", path.display());
    }
    Ok(text)
}

/// Keeps the file at `path` up to date until `stop`: rebuilt with the
/// client `clients` holds for every new boot config revision in
/// `snapshot` (the inventory's). A failure is logged once per kind and
/// retried with a growing pause, or sooner at the next revision.
pub async fn follow(
    clients: watch::Receiver<mprov_api::client::Client>,
    mut snapshot: Snapshot,
    path: PathBuf,
    stop: CancellationToken,
) {
    let mut last: Option<String> = None;
    let mut done_at: Option<i64> = None;
    let mut retry = Retry::new();
    let mut pause: Option<std::time::Duration> = None;
    let now = std::time::Instant::now();
    let mut last_try = now.checked_sub(REBUILD_GAP).unwrap_or(now);
    loop {
        // A burst of writes moves the revision many times: one rebuild per
        // second at most.
        if let Some(wait) = REBUILD_GAP.checked_sub(last_try.elapsed()) {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
        let revision = snapshot.borrow_and_update().revision;
        // -1: no snapshot from the control service yet.
        if revision >= 0 && done_at != Some(revision) {
            last_try = std::time::Instant::now();
            let client = clients.borrow().clone();
            match update(&client, &path, last.as_deref()).await {
                Ok(text) => {
                    if retry.succeeded() {
                        tracing::info!("libgenders: {} is up to date again", path.display());
                    }
                    last = Some(text);
                    done_at = Some(revision);
                    pause = None;
                }
                Err(err) => {
                    let (log, wait) = retry.failed(Failure::of(&err));
                    if log {
                        tracing::warn!(
                            "libgenders: cannot update {} ({err:#}); retrying",
                            path.display()
                        );
                    }
                    pause = Some(wait);
                }
            }
        }
        let retry_later = async {
            match pause {
                Some(p) => tokio::time::sleep(p).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            changed = snapshot.changed() => if changed.is_err() { return },
            () = retry_later => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn one_line_per_system_with_os_image_groups_and_all() {
        let inventory = Inventory {
            systems: vec![
                json!({"hostname": "c02", "image": 1, "groups": [2]}),
                json!({"hostname": "c01", "image": 1, "groups": [2, 3]}),
                json!({"hostname": "login1", "image": 2, "groups": []}),
                json!({"hostname": "bare", "image": null, "groups": [3]}),
                json!({"hostname": "all-dup", "image": null, "groups": [4]}),
            ],
            images: vec![
                json!({"id": 1, "slug": "compute", "distro": 7}),
                json!({"id": 2, "slug": "login", "distro": null}),
            ],
            distros: vec![json!({"id": 7, "slug": "rocky9"})],
            groups: vec![
                json!({"id": 2, "slug": "gpu"}),
                json!({"id": 3, "slug": "rack4"}),
                json!({"id": 4, "slug": "all"}),
            ],
        };
        assert_eq!(
            render(&inventory),
            format!(
                "{HEADER}\n\
                 all-dup all\n\
                 bare rack4,all\n\
                 c01 os=rocky9,image=compute,gpu,rack4,all\n\
                 c02 os=rocky9,image=compute,gpu,all\n\
                 login1 image=login,all\n"
            )
        );
        assert_eq!(render(&Inventory::default()), format!("{HEADER}\n"));
    }

    #[test]
    fn written_whole_then_renamed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("genders");
        write_atomically(&path, "a all\n").unwrap();
        write_atomically(&path, "b all\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b all\n");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["genders"], "no temporary file left");
        assert!(write_atomically(&dir.path().join("no/such/genders"), "x").is_err());
    }
}
