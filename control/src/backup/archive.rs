//! The backup archive: its format, and the checks a restore makes before it
//! touches anything. Pure: bytes in, bytes or a verified archive out.
//!
//! An archive is a plain tar file (no outer compression, so a damaged tail
//! cannot hide the parts before it):
//!
//! * `manifest.json` comes first: the format and its version, the mProv
//!   version and schema (migration) level that wrote it, the engine it came
//!   from, the inventory revision, and for every other part its path, size,
//!   row count (tables) and SHA-256.
//! * `tables/<table>.json.zst`: one per table, zstd-compressed JSON
//!   `{"table", "columns", "rows"}`, each row an array of JSON scalars (null,
//!   boolean, integer, float, string). Engine-neutral: a restore binds each
//!   value with the type the target engine's column has, so any engine
//!   restores any engine's backup.
//! * `secrets/secret_key` and `secrets/tls/<file>`, only with
//!   `--with-secrets`.
//!
//! [`open`] accepts an archive only when the manifest parses, every part it
//! names is there exactly once with its size and hash, nothing else is there,
//! and every table part decodes to the row count the manifest promises with
//! rows as wide as their columns. A truncated or tampered archive therefore
//! fails here, before the database is opened.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The `format` field of every manifest.
pub const FORMAT: &str = "mprov-backup";
/// The archive format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;
/// The manifest's path, always the first entry.
pub const MANIFEST: &str = "manifest.json";
/// The folder of the table parts.
pub const TABLES: &str = "tables/";
/// The path of the secret key part.
pub const SECRET_KEY_PART: &str = "secrets/secret_key";
/// The folder of the TLS folder's files.
pub const TLS_PARTS: &str = "secrets/tls/";

/// The largest manifest we read.
const MANIFEST_LIMIT: u64 = 4 << 20;
/// The largest decompressed table part we accept (a sanity bound against a
/// decompression bomb; 10,000 systems take a few MiB).
const TABLE_LIMIT: u64 = 4 << 30;
/// The largest secret part (the secret key, a certificate or key).
const SECRET_LIMIT: u64 = 1 << 20;
/// zstd level: the archives are small and backups rare; 3 is zstd's default.
const ZSTD_LEVEL: i32 = 3;

/// What the archive holds, written first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// The archive format's version.
    pub format_version: u32,
    /// The mProv version that wrote it.
    pub mprov_version: String,
    /// The engine the data came from (`sqlite`, `mysql`, `postgres`).
    pub engine: String,
    /// The newest migration applied to that database.
    pub schema_level: i64,
    /// Its inventory revision at the snapshot.
    pub revision: i64,
    /// When the snapshot was taken (RFC 3339, UTC).
    pub created_at: String,
    /// A short fingerprint of the install's secret key (not the key), so a
    /// restore can tell whether this host's key opens the stored secrets.
    pub secret_key_id: String,
    /// Whether the secret key and the TLS folder are inside.
    pub with_secrets: bool,
    /// Every other part, in archive order.
    pub parts: Vec<PartInfo>,
}

/// One part of the archive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartInfo {
    /// Its path inside the archive.
    pub path: String,
    /// Its size in the archive, in bytes.
    pub bytes: u64,
    /// Its size once decompressed (table parts), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_bytes: Option<u64>,
    /// Its row count (table parts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
    /// The file mode to restore it with (secret parts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// SHA-256 of its bytes in the archive, hex.
    pub sha256: String,
}

/// One table's rows, engine-neutral.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    /// The table's name.
    pub table: String,
    /// Its columns, in the order of each row's values.
    pub columns: Vec<String>,
    /// The rows: JSON null, boolean, integer, float or string per column.
    pub rows: Vec<Vec<Value>>,
}

/// What a backup is made of, before packing.
#[derive(Debug, Clone)]
pub struct Contents {
    /// The manifest's fields; `parts` is filled in by [`pack`].
    pub manifest: Manifest,
    /// The tables, in the order a restore loads them.
    pub tables: Vec<Table>,
    /// The secret key and the TLS folder's files (name, mode, bytes), with
    /// `--with-secrets`.
    pub secrets: Option<Secrets>,
}

/// The secret material of a `--with-secrets` backup.
#[derive(Clone, PartialEq)]
pub struct Secrets {
    /// The install's secret key.
    pub secret_key: String,
    /// The TLS folder's files: name, mode, content.
    pub tls_files: Vec<(String, u32, Vec<u8>)>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.tls_files.iter().map(|(n, _, _)| n.as_str()).collect();
        f.debug_struct("Secrets")
            .field("secret_key", &"<redacted>")
            .field("tls_files", &names)
            .finish()
    }
}

/// Why an archive was refused.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The bytes are not a readable tar archive (often: truncated).
    #[error("the archive is damaged or truncated: {0}")]
    Damaged(String),
    /// A part's hash does not match the manifest.
    #[error(
        "part {path} does not match its SHA-256 in the manifest: the archive was altered or damaged"
    )]
    Hash {
        /// The part.
        path: String,
    },
    /// The manifest does not parse or is not ours.
    #[error("the manifest is not a valid mProv backup manifest: {0}")]
    Manifest(String),
    /// A part the manifest names is missing (often: truncated).
    #[error("part {path} named in the manifest is missing: the archive is truncated or incomplete")]
    Missing {
        /// The part.
        path: String,
    },
    /// The archive was written by a newer format.
    #[error(
        "the archive has format version {found}, newer than this mProv reads ({FORMAT_VERSION}): restore it with the mProv version that wrote it ({mprov})"
    )]
    NewerFormat {
        /// Its format version.
        found: u64,
        /// Its mProv version.
        mprov: String,
    },
    /// A table part that does not decode or disagrees with the manifest.
    #[error("table part {path} is invalid: {reason}")]
    Table {
        /// The part.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// An entry the manifest does not name, or one named twice.
    #[error(
        "the archive holds {path}, which the manifest does not name (or names once): the archive was altered"
    )]
    Unexpected {
        /// The entry.
        path: String,
    },
}

/// An archive that passed every check of [`open`].
#[derive(Debug, Clone)]
pub struct Verified {
    /// Its manifest.
    pub manifest: Manifest,
    /// Its tables, in archive (load) order.
    pub tables: Vec<Table>,
    /// Its secrets, if it has them.
    pub secrets: Option<Secrets>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A short, non-reversible fingerprint of a secret key.
pub fn secret_key_id(secret_key: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"mprov backup secret key id v1\0");
    h.update(secret_key.as_bytes());
    hex::encode(&h.finalize()[..8])
}

/// Packs `contents` into archive bytes (CPU work: run it on a blocking
/// thread).
pub fn pack(mut contents: Contents) -> std::io::Result<Vec<u8>> {
    let mut parts: Vec<(PartInfo, Vec<u8>)> = Vec::new();
    for t in &contents.tables {
        let json = serde_json::to_vec(t)?;
        let data = zstd::bulk::compress(&json, ZSTD_LEVEL)?;
        parts.push((
            PartInfo {
                path: format!("{TABLES}{}.json.zst", t.table),
                bytes: data.len() as u64,
                raw_bytes: Some(json.len() as u64),
                rows: Some(t.rows.len() as u64),
                mode: None,
                sha256: sha256_hex(&data),
            },
            data,
        ));
    }
    if let Some(s) = &contents.secrets {
        let mut push = |path: String, mode: u32, data: Vec<u8>| {
            parts.push((
                PartInfo {
                    path,
                    bytes: data.len() as u64,
                    raw_bytes: None,
                    rows: None,
                    mode: Some(mode),
                    sha256: sha256_hex(&data),
                },
                data,
            ));
        };
        push(
            SECRET_KEY_PART.to_owned(),
            0o600,
            format!("{}\n", s.secret_key).into_bytes(),
        );
        for (name, mode, data) in &s.tls_files {
            push(format!("{TLS_PARTS}{name}"), *mode, data.clone());
        }
    }
    contents.manifest.parts = parts.iter().map(|(p, _)| p.clone()).collect();
    let manifest = serde_json::to_vec_pretty(&contents.manifest)?;
    tar_of(
        std::iter::once((MANIFEST, manifest.as_slice())).chain(
            parts
                .iter()
                .map(|(info, data)| (info.path.as_str(), data.as_slice())),
        ),
    )
}

/// A tar of `entries` (path and content), in that order: regular files,
/// mode 0600, time 0, so the same entries give the same bytes.
pub fn tar_of<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> std::io::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, data) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o600);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mtime(0);
        tar.append_data(&mut header, path, data)?;
    }
    tar.into_inner()
}

/// Reads at most `limit` bytes of `r`; `None` when there were more.
fn read_bounded(r: impl Read, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    r.take(limit + 1).read_to_end(&mut buf)?;
    Ok((buf.len() as u64 <= limit).then_some(buf))
}

/// Checks and decodes an archive; see the module doc for what is checked.
pub fn open(bytes: &[u8]) -> Result<Verified, ArchiveError> {
    let damaged = |e: std::io::Error| ArchiveError::Damaged(e.to_string());
    let mut tar = tar::Archive::new(bytes);
    let mut entries = tar.entries().map_err(damaged)?;
    let manifest: Manifest = {
        let first = entries
            .next()
            .ok_or_else(|| ArchiveError::Damaged("it is empty".into()))?
            .map_err(damaged)?;
        let path = entry_path(&first)?;
        if path != MANIFEST {
            return Err(ArchiveError::Manifest(format!(
                "the first entry is {path:?}, not {MANIFEST}"
            )));
        }
        let data = read_bounded(first, MANIFEST_LIMIT)
            .map_err(damaged)?
            .ok_or_else(|| ArchiveError::Manifest("it is too large".into()))?;
        // The format and its version first: a newer format may have fields
        // this build does not know, and deserves that message, not "invalid".
        let value: Value =
            serde_json::from_slice(&data).map_err(|e| ArchiveError::Manifest(e.to_string()))?;
        if value.get("format").and_then(Value::as_str) != Some(FORMAT) {
            return Err(ArchiveError::Manifest(format!(
                "its format is not {FORMAT:?}"
            )));
        }
        let version = value.get("format_version").and_then(Value::as_u64);
        if let Some(found) = version.filter(|v| *v > u64::from(FORMAT_VERSION)) {
            return Err(ArchiveError::NewerFormat {
                found,
                mprov: value
                    .get("mprov_version")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_owned(),
            });
        }
        serde_json::from_value(value).map_err(|e| ArchiveError::Manifest(e.to_string()))?
    };
    let mut wanted: BTreeMap<&str, &PartInfo> = BTreeMap::new();
    for p in &manifest.parts {
        let ok_path = p
            .path
            .strip_prefix(TABLES)
            .is_some_and(|t| t.strip_suffix(".json.zst").is_some_and(is_identifier))
            || p.path == SECRET_KEY_PART
            || p.path.strip_prefix(TLS_PARTS).is_some_and(is_file_name);
        if !ok_path {
            return Err(ArchiveError::Manifest(format!(
                "part path {:?} is not one this format uses",
                p.path
            )));
        }
        if wanted.insert(p.path.as_str(), p).is_some() {
            return Err(ArchiveError::Manifest(format!(
                "part {:?} is named twice",
                p.path
            )));
        }
    }
    let mut found: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(damaged)?;
        let path = entry_path(&entry)?;
        let Some(info) = wanted.get(path.as_str()) else {
            return Err(ArchiveError::Unexpected { path });
        };
        if found.contains_key(&path) {
            return Err(ArchiveError::Unexpected { path });
        }
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(ArchiveError::Unexpected { path });
        }
        let declared = entry.header().size().map_err(damaged)?;
        let data = read_bounded(entry, info.bytes).map_err(damaged)?;
        // The file ended inside this part: say truncated, not altered.
        if let Some(d) = &data
            && (d.len() as u64) < declared.min(info.bytes)
        {
            return Err(ArchiveError::Damaged(format!(
                "part {path} ends after {} of its {} bytes",
                d.len(),
                info.bytes
            )));
        }
        match data {
            Some(d) if d.len() as u64 == info.bytes && sha256_hex(&d) == info.sha256 => {
                found.insert(path, d);
            }
            _ => return Err(ArchiveError::Hash { path }),
        }
    }
    if let Some(missing) = wanted.keys().find(|p| !found.contains_key(**p)) {
        return Err(ArchiveError::Missing {
            path: (*missing).to_owned(),
        });
    }
    let mut tables = Vec::new();
    let mut secret_key = None;
    let mut tls_files = Vec::new();
    let mut names = BTreeSet::new();
    for info in &manifest.parts {
        let Some(data) = found.remove(&info.path) else {
            continue;
        };
        if let Some(name) = info
            .path
            .strip_prefix(TABLES)
            .and_then(|t| t.strip_suffix(".json.zst"))
        {
            let table = decode_table(info, &data)?;
            if table.table != name || !names.insert(name.to_owned()) {
                return Err(table_error(info, "its table name does not match its path"));
            }
            tables.push(table);
        } else if info.path == SECRET_KEY_PART {
            if data.len() as u64 > SECRET_LIMIT {
                return Err(ArchiveError::Manifest("the secret key is too large".into()));
            }
            let key = String::from_utf8(data)
                .map_err(|_| ArchiveError::Manifest("the secret key is not text".into()))?;
            secret_key = Some(key.trim().to_owned());
        } else if let Some(name) = info.path.strip_prefix(TLS_PARTS) {
            if data.len() as u64 > SECRET_LIMIT {
                return Err(ArchiveError::Manifest(format!(
                    "{} is too large",
                    info.path
                )));
            }
            tls_files.push((name.to_owned(), info.mode.unwrap_or(0o600) & 0o777, data));
        }
    }
    let secrets = match (manifest.with_secrets, secret_key) {
        (true, Some(secret_key)) => Some(Secrets {
            secret_key,
            tls_files,
        }),
        (false, None) if tls_files.is_empty() => None,
        _ => {
            return Err(ArchiveError::Manifest(
                "with_secrets disagrees with the parts it holds".into(),
            ));
        }
    };
    Ok(Verified {
        manifest,
        tables,
        secrets,
    })
}

fn table_error(info: &PartInfo, reason: impl Into<String>) -> ArchiveError {
    ArchiveError::Table {
        path: info.path.clone(),
        reason: reason.into(),
    }
}

fn decode_table(info: &PartInfo, data: &[u8]) -> Result<Table, ArchiveError> {
    let (Some(raw), Some(rows)) = (info.raw_bytes, info.rows) else {
        return Err(table_error(info, "the manifest gives no size or row count"));
    };
    if raw > TABLE_LIMIT {
        return Err(table_error(info, "it is larger than a backup table may be"));
    }
    let json = read_bounded(
        zstd::stream::read::Decoder::new(data).map_err(|e| table_error(info, e.to_string()))?,
        raw,
    )
    .map_err(|e| table_error(info, format!("it does not decompress: {e}")))?
    .filter(|j| j.len() as u64 == raw)
    .ok_or_else(|| table_error(info, "its decompressed size differs from the manifest"))?;
    let table: Table =
        serde_json::from_slice(&json).map_err(|e| table_error(info, e.to_string()))?;
    if table.rows.len() as u64 != rows {
        return Err(table_error(
            info,
            format!(
                "it holds {} rows, the manifest says {rows}",
                table.rows.len()
            ),
        ));
    }
    if table.columns.is_empty() || !table.columns.iter().all(|c| is_identifier(c)) {
        return Err(table_error(
            info,
            "its column names are not plain identifiers",
        ));
    }
    let unique: BTreeSet<&String> = table.columns.iter().collect();
    if unique.len() != table.columns.len() {
        return Err(table_error(info, "a column is named twice"));
    }
    for (i, row) in table.rows.iter().enumerate() {
        if row.len() != table.columns.len() {
            return Err(table_error(
                info,
                format!(
                    "row {i} has {} values for {} columns",
                    row.len(),
                    table.columns.len()
                ),
            ));
        }
        if row.iter().any(|v| v.is_array() || v.is_object()) {
            return Err(table_error(
                info,
                format!("row {i} holds a non-scalar value"),
            ));
        }
    }
    Ok(table)
}

fn entry_path<R: Read>(entry: &tar::Entry<'_, R>) -> Result<String, ArchiveError> {
    let path = entry
        .path()
        .map_err(|e| ArchiveError::Damaged(e.to_string()))?;
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| ArchiveError::Damaged("an entry's path is not UTF-8".into()))
}

/// A table or column name: what our migrations use, and nothing a statement
/// could be bent with.
pub fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !s.as_bytes()[0].is_ascii_digit()
}

fn is_file_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sample(with_secrets: bool) -> Contents {
        Contents {
            manifest: Manifest {
                format: FORMAT.into(),
                format_version: FORMAT_VERSION,
                mprov_version: "0.1.0".into(),
                engine: "sqlite".into(),
                schema_level: 2,
                revision: 7,
                created_at: "2026-01-01T00:00:00Z".into(),
                secret_key_id: secret_key_id("k"),
                with_secrets,
                parts: Vec::new(),
            },
            tables: vec![
                Table {
                    table: "scripts".into(),
                    columns: vec!["id".into(), "content".into(), "ratio".into()],
                    rows: vec![
                        vec![json!(1), json!("#!/bin/sh\necho ü\n"), json!(0.5)],
                        vec![json!(2), json!(null), json!(true)],
                    ],
                },
                Table {
                    table: "empty".into(),
                    columns: vec!["id".into()],
                    rows: vec![],
                },
            ],
            secrets: with_secrets.then(|| Secrets {
                secret_key: "k".into(),
                tls_files: vec![("ca.key".into(), 0o600, b"KEY".to_vec())],
            }),
        }
    }

    #[test]
    fn round_trip() {
        for with in [false, true] {
            let c = sample(with);
            let bytes = pack(c.clone()).unwrap();
            let v = open(&bytes).unwrap();
            assert_eq!(v.tables, c.tables);
            assert_eq!(v.secrets, c.secrets);
            assert_eq!(v.manifest.revision, 7);
            assert_eq!(v.manifest.parts.len(), if with { 4 } else { 2 });
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let bytes = pack(sample(true)).unwrap();
        // Each cut that removes real content fails; only the trailing zero
        // blocks of the tar end marker may go.
        let content_end = bytes.len() - bytes.iter().rev().take_while(|b| **b == 0).count();
        for cut in (0..content_end).step_by(97).chain([content_end - 1]) {
            assert!(open(&bytes[..cut]).is_err(), "cut at {cut} accepted");
        }
    }

    #[test]
    fn a_flipped_byte_is_refused() {
        let bytes = pack(sample(true)).unwrap();
        let content_end = bytes.len() - bytes.iter().rev().take_while(|b| **b == 0).count();
        for at in (0..content_end).step_by(13) {
            let mut b = bytes.clone();
            b[at] ^= 0x20;
            if let Ok(v) = open(&b) {
                // Only bytes tar ignores (header padding, mtime, mode) may change.
                let c = sample(true);
                assert_eq!(v.tables, c.tables, "byte {at}");
                assert_eq!(v.secrets, c.secrets, "byte {at}");
            }
        }
    }

    #[test]
    fn a_changed_manifest_count_is_refused() {
        let bytes = pack(sample(false)).unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        assert!(text.contains("\"rows\": 2"));
        // Same length, so tar still parses.
        let bad = text.replacen("\"rows\": 2", "\"rows\": 3", 1).into_bytes();
        if bad.len() == bytes.len() {
            assert!(matches!(open(&bad), Err(ArchiveError::Table { .. })));
        }
    }

    #[test]
    fn names_are_plain() {
        for ok in ["systems", "group_members", "a1"] {
            assert!(is_identifier(ok));
        }
        for bad in ["", "1a", "Systems", "a;drop", "a\"b", "a b"] {
            assert!(!is_identifier(bad), "{bad}");
        }
        assert!(is_file_name("ca.crt"));
        assert!(!is_file_name("../x") && !is_file_name("..") && !is_file_name("a/b"));
    }
}
