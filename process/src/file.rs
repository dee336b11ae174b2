//! Atomic file writes.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` with `mode`: into `<path>.tmp` (created with the
/// mode, so it is never readable by others even for a moment, then set to it
/// exactly, whatever the umask), synced, renamed over `path`, and the folder
/// synced so the rename itself survives a crash. A reader sees the old file
/// or the new one, never a part. A stale `.tmp` from a crash is replaced.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let tmp = tmp_path(path);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, path)?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// `<path>.tmp`, beside it (the same file system, so the rename is atomic).
fn tmp_path(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    PathBuf::from(tmp)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::write_atomic;

    #[test]
    fn replaces_the_file_whole_with_the_mode_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.key");
        std::fs::write(&path, "old").unwrap();
        // A crash left a temporary file behind, readable by anyone.
        std::fs::write(dir.path().join("ca.key.tmp"), "half").unwrap();
        write_atomic(&path, b"new key", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new key");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!dir.path().join("ca.key.tmp").exists());
    }

    #[test]
    fn the_mode_is_exact_whatever_the_old_file_had() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        write_atomic(&path, b"cert", 0o644).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
    }

    #[test]
    fn a_missing_folder_is_an_error_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent").join("file");
        assert!(write_atomic(&path, b"x", 0o600).is_err());
        assert!(!dir.path().join("absent").exists());
    }
}
