//! The job server's host id: what the control service knows this host by
//! beyond its name, so a renamed host keeps its row. Made once (128 random
//! bits, hex) and kept in `host-id` in the config's folder; `--host-id` (the
//! config's `hostId`) overrides it.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The file's name in the config folder.
pub const FILE: &str = "host-id";

/// The longest host id taken (the file's or `--host-id`).
pub const MAX_LEN: usize = 128;

/// A host id as given or read: trimmed, non-empty, printable ASCII without
/// spaces, at most [`MAX_LEN`] long.
pub fn parse(text: &str) -> Result<String> {
    let id = text.trim();
    if id.is_empty() {
        bail!("the host id is empty");
    }
    if id.len() > MAX_LEN || !id.chars().all(|c| c.is_ascii_graphic()) {
        bail!(
            "the host id {id:?} is not up to {MAX_LEN} printable ASCII characters without spaces"
        );
    }
    Ok(id.to_owned())
}

/// A new random host id: 128 bits, lowercase hex.
pub fn generate() -> Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness for a host id: {e}"))?;
    Ok(hex::encode(bytes))
}

/// The host id: `given` if any, else the one kept in `dir`, else a new one
/// kept there (written whole, then renamed into place).
pub fn load_or_make(given: Option<&str>, dir: &Path) -> Result<String> {
    if let Some(given) = given {
        return parse(given).context("--host-id");
    }
    let path = dir.join(FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => return parse(&text).with_context(|| format!("{}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
    let id = generate()?;
    keep(&path, &id)?;
    tracing::info!("made host id {id}, kept in {}", path.display());
    Ok(id)
}

fn keep(path: &Path, id: &str) -> Result<()> {
    let dir = path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = dir.join(format!(".{FILE}.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        writeln!(f, "{id}")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_then_kept_and_overridden_by_the_given_one() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("etc-mprov");
        let first = load_or_make(None, &sub).unwrap();
        assert_eq!(first.len(), 32);
        assert!(first.chars().all(|c| c.is_ascii_hexdigit()), "{first}");
        assert_eq!(
            std::fs::read_to_string(sub.join(FILE)).unwrap().trim(),
            first
        );
        assert_eq!(load_or_make(None, &sub).unwrap(), first, "kept");
        assert_eq!(
            load_or_make(Some(" rack4-js01 "), &sub).unwrap(),
            "rack4-js01"
        );
        assert_eq!(load_or_make(None, &sub).unwrap(), first, "not replaced");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(load_or_make(None, other.path()).unwrap(), first);
    }

    #[test]
    fn a_bad_host_id_is_refused() {
        for bad in ["", "  ", "a b", "é", &"x".repeat(MAX_LEN + 1)] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "\n").unwrap();
        let err = load_or_make(None, dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("host-id"), "{err:#}");
    }
}
