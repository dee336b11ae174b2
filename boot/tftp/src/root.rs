//! Mapping a requested file name onto the served root, so that no request can
//! read outside it.
//!
//! Three layers, each cheap:
//! 1. Lexical: the name is split on `/`; empty and `.` components are dropped
//!    (so an absolute `/ipxe.efi` means `<root>/ipxe.efi`, as tftp-hpa's
//!    `--secure` does), and any `..` component refuses the request outright.
//! 2. Canonical: the joined path is canonicalized (resolving every symlink)
//!    and must still start with the canonical root. This catches symlinks
//!    that point outside the root, which an operator may create by accident.
//! 3. Type: only regular files are served.
//!
//! TODO-security: a symlink swapped between the canonicalize and the open is
//! not caught (a TOCTOU race); closing it needs `openat2(RESOLVE_BENEATH)`,
//! which needs `unsafe` or a new dependency. The root is operator-owned, so
//! an attacker would already need write access to it.
//!
//! Everything here blocks; callers run it in `spawn_blocking`.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// Why a requested file cannot be served.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    /// The name contains a `..` component or a NUL.
    #[error("file name {name:?} is not allowed")]
    BadName {
        /// The name as requested.
        name: String,
    },
    /// The file resolves (through a symlink) to a place outside the root.
    #[error("{path} is outside the TFTP root")]
    Escapes {
        /// The canonical path it resolved to.
        path: PathBuf,
    },
    /// The file does not exist.
    #[error("{path} not found")]
    NotFound {
        /// The path under the root.
        path: PathBuf,
    },
    /// It exists but is a directory or a device.
    #[error("{path} is not a regular file")]
    NotAFile {
        /// The path under the root.
        path: PathBuf,
    },
    /// Any other I/O failure (permissions, a missing root).
    #[error("cannot open {path}")]
    Io {
        /// The path under the root.
        path: PathBuf,
        /// The cause.
        #[source]
        err: io::Error,
    },
}

/// Opens `name` under `root` for reading, returning the file and its size.
pub(crate) fn open(root: &Path, name: &str) -> Result<(File, u64), OpenError> {
    let path = resolve(root, name)?;
    let io_err = |path: &Path, err: io::Error| match err.kind() {
        io::ErrorKind::NotFound => OpenError::NotFound {
            path: path.to_path_buf(),
        },
        _ => OpenError::Io {
            path: path.to_path_buf(),
            err,
        },
    };
    let canonical_root = root.canonicalize().map_err(|err| io_err(root, err))?;
    let canonical = path.canonicalize().map_err(|err| io_err(&path, err))?;
    if !canonical.starts_with(&canonical_root) {
        return Err(OpenError::Escapes { path: canonical });
    }
    // O_NONBLOCK: a FIFO must not hold the thread until a writer comes (it is
    // refused just below); for a regular file the flag changes nothing.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&canonical)
        .map_err(|err| io_err(&path, err))?;
    let meta = file.metadata().map_err(|err| io_err(&path, err))?;
    if !meta.is_file() {
        return Err(OpenError::NotAFile { path });
    }
    Ok((file, meta.len()))
}

/// The lexical step: `root` joined with the normal components of `name`.
fn resolve(root: &Path, name: &str) -> Result<PathBuf, OpenError> {
    let bad = || OpenError::BadName {
        name: name.to_owned(),
    };
    if name.contains('\0') {
        return Err(bad());
    }
    let mut path = root.to_path_buf();
    let mut any = false;
    for component in Path::new(name).components() {
        match component {
            Component::Normal(part) => {
                path.push(part);
                any = true;
            }
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return Err(bad()),
        }
    }
    if !any {
        // The root itself: a directory, never served.
        return Err(OpenError::NotAFile { path });
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, expected: Result<&str, ()>) {
        let got = resolve(Path::new("/srv/tftp"), name);
        match (got, expected) {
            (Ok(path), Ok(want)) => assert_eq!(path, Path::new(want), "name {name:?}"),
            (Err(OpenError::BadName { .. } | OpenError::NotAFile { .. }), Err(())) => {}
            (got, want) => panic!("name {name:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn lexical_resolution() {
        check("ipxe.efi", Ok("/srv/tftp/ipxe.efi"));
        check("/ipxe.efi", Ok("/srv/tftp/ipxe.efi"));
        check("/etc/passwd", Ok("/srv/tftp/etc/passwd"));
        check("./a//b/./c", Ok("/srv/tftp/a/b/c"));
        check("../etc/passwd", Err(()));
        check("a/../../etc/passwd", Err(()));
        check("a/..", Err(()));
        check("", Err(()));
        check("/", Err(()));
        check("a\0b", Err(()));
    }

    #[test]
    fn symlinks_out_of_the_root_are_refused() {
        let outside = tempfile::tempdir().expect("tempdir");
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret"), b"no").expect("write");
        std::fs::write(root.path().join("ok"), b"yes").expect("write");
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("out"))
            .expect("symlink");
        std::os::unix::fs::symlink(root.path().join("ok"), root.path().join("in"))
            .expect("symlink");
        std::fs::create_dir(root.path().join("dir")).expect("mkdir");

        assert!(matches!(
            open(root.path(), "out"),
            Err(OpenError::Escapes { .. })
        ));
        assert!(matches!(
            open(root.path(), "missing"),
            Err(OpenError::NotFound { .. })
        ));
        assert!(matches!(
            open(root.path(), "dir"),
            Err(OpenError::NotAFile { .. })
        ));
        nix::unistd::mkfifo(&root.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU)
            .expect("mkfifo");
        assert!(matches!(
            open(root.path(), "fifo"),
            Err(OpenError::NotAFile { .. })
        ));
        let (_, len) = open(root.path(), "in").expect("symlink inside the root");
        assert_eq!(len, 3);
        let (_, len) = open(root.path(), "/ok").expect("absolute name under the root");
        assert_eq!(len, 3);
    }
}
