//! Path confinement: the security boundary of the unpacker. Whatever the
//! archive says, nothing is created, removed, linked to or changed outside
//! the root, the way a container runtime unpacks a layer. The rules:
//!
//! 1. **Names.** An entry's name (and a hard link's target) is taken as
//!    relative to the root: leading `/` and `.` components are dropped, as
//!    GNU tar does, and a name with a `..` component is refused
//!    ([`crate::UnpackError::PathEscapes`]) — [`confine`].
//! 2. **Parents.** The directories on the way to an entry are resolved
//!    inside the root as if it were `/`: a symlink met there is followed,
//!    an absolute target starts again at the root, and `..` at the top stays
//!    at the top. More than 40 symlinks (Linux's `MAXSYMLINKS`) is a loop,
//!    refused as an escape. A directory missing on the way is created
//!    (0755). The entry loop caches a resolved parent only until something
//!    that exists is removed (see `unpack_entries` in `lib.rs`).
//! 3. **The last component is never followed.** Whatever is at the entry's
//!    name is looked at with `lstat` and removed first (a symlink as a
//!    symlink), unless it is a directory and the entry is one too. Then the
//!    entry is created where nothing is: regular files with
//!    `O_CREAT | O_EXCL` ([`create_file`], which fails on any name that
//!    exists, a dangling symlink included), directories, symlinks and
//!    device nodes by calls that fail the same way.
//! 4. **Hard links.** The target is confined as a name (rule 1), and its
//!    parents resolved as in rule 2; its last component is not followed, so
//!    a link to a symlink links the symlink.
//! 5. **Symlinks' targets are data.** They are written as the archive gives
//!    them, absolute or with `..`; rules 2 to 4 make sure nothing is ever
//!    written through one to outside the root.
//! 6. **Metadata does not follow symlinks either:** owners with `lchown`,
//!    xattrs with `lsetxattr`, times with `lutimes`, and a symlink's mode is
//!    not set (`meta.rs`).
//!
//! The agent's `agent_tar` fuzz target (`tests/fuzz/`) checks these rules on
//! any stream: nothing is written outside the scratch root or beside it.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use nix::sys::stat::Mode;

/// How many symlinks a path may pass through (Linux's `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

/// The archive name as a relative path with no `.` components, or `None` if a
/// `..` leads out of the root. Leading `/` are dropped, as GNU tar does.
pub fn confine(raw: &[u8]) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in Path::new(OsStr::from_bytes(raw)).components() {
        match part {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => return None,
        }
    }
    Some(out)
}

/// `rel` resolved inside `root` as if `root` were `/`: symlinks on the way are
/// followed and clamped to the root; the last component is followed too only
/// if `follow_last`. Missing directories on the way are created (0755) when
/// `follow_last` is set (an entry's parent). `None` if the symlinks loop.
pub(crate) fn resolve(root: &Path, rel: &Path, follow_last: bool) -> io::Result<Option<PathBuf>> {
    resolve_in(root, rel, follow_last, None)
}

/// [`resolve`] for an entry's parent, adding the directories it creates to
/// `fresh` and `created`.
pub(crate) fn resolve_noting(
    root: &Path,
    rel: &Path,
    fresh: &mut HashSet<PathBuf>,
    created: &mut HashSet<PathBuf>,
) -> io::Result<Option<PathBuf>> {
    resolve_in(root, rel, true, Some((fresh, created)))
}

fn resolve_in(
    root: &Path,
    rel: &Path,
    follow_last: bool,
    mut noted: Option<(&mut HashSet<PathBuf>, &mut HashSet<PathBuf>)>,
) -> io::Result<Option<PathBuf>> {
    // The components still to walk, last first.
    let mut todo: Vec<PathBuf> = rel
        .components()
        .rev()
        .map(|c| PathBuf::from(c.as_os_str()))
        .collect();
    let mut at: Vec<PathBuf> = Vec::new();
    let mut jumps = 0;
    while let Some(part) = todo.pop() {
        match part.to_str() {
            Some(".") => continue,
            Some("..") => {
                at.pop();
                continue;
            }
            _ => {}
        }
        let here: PathBuf = root.join(at.iter().collect::<PathBuf>()).join(&part);
        let last = todo.is_empty();
        match fs::symlink_metadata(&here) {
            Ok(meta) if meta.file_type().is_symlink() && (!last || follow_last) => {
                jumps += 1;
                if jumps > MAX_SYMLINKS {
                    return Ok(None);
                }
                let target = fs::read_link(&here)?;
                if target.is_absolute() {
                    at.clear();
                }
                for c in target.components().rev() {
                    if !matches!(c, Component::RootDir) {
                        todo.push(PathBuf::from(c.as_os_str()));
                    }
                }
            }
            Ok(_) => at.push(part),
            Err(err) if err.kind() == io::ErrorKind::NotFound && follow_last => {
                fs::create_dir(&here)?;
                fs::set_permissions(&here, fs::Permissions::from_mode(0o755))?;
                if let Some((fresh, created)) = noted.as_mut() {
                    created.insert(here.clone());
                    fresh.insert(here);
                }
                at.push(part);
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound && last => at.push(part),
            Err(err) => return Err(err),
        }
    }
    Ok(Some(root.join(at.iter().collect::<PathBuf>())))
}

/// Creates a regular file that must not exist yet (never following a
/// symlink), with `mode` (less the umask).
///
/// `openat` rather than `open` (what `std::fs::OpenOptions` calls): musl's
/// `open` follows every `O_CLOEXEC` open with an `fcntl(F_SETFD)` for old
/// kernels, one more system call per file of the root in the static agent.
pub(crate) fn create_file(path: &Path, mode: u32) -> io::Result<File> {
    use nix::fcntl::{AT_FDCWD, OFlag, openat};
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_CLOEXEC;
    loop {
        match openat(AT_FDCWD, path, flags, Mode::from_bits_truncate(mode)) {
            Ok(fd) => return Ok(File::from(fd)),
            Err(nix::errno::Errno::EINTR) => {}
            Err(err) => return Err(io::Error::from(err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::symlink;

    use tar::EntryType;

    use super::*;
    use crate::{UnpackOptions, unpack};

    #[test]
    fn confine_strips_and_rejects() {
        let check = |raw: &str, want: Option<&str>| {
            assert_eq!(confine(raw.as_bytes()), want.map(PathBuf::from), "{raw}");
        };
        check("./usr/bin", Some("usr/bin"));
        check("/etc/passwd", Some("etc/passwd"));
        check("./", Some(""));
        check("a/./b/", Some("a/b"));
        check("../etc/passwd", None);
        check("a/../../b", None);
    }

    #[test]
    fn resolve_clamps_symlinks_to_the_root() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        fs::create_dir_all(root.join("usr/lib"))?;
        symlink("/usr/lib", root.join("lib"))?;
        symlink("../../../../..", root.join("up"))?;
        assert_eq!(
            resolve(root, Path::new("lib/x"), true)?,
            Some(root.join("usr/lib/x"))
        );
        // `..` past the top stays at the root.
        assert_eq!(
            resolve(root, Path::new("up/etc"), true)?,
            Some(root.join("etc"))
        );
        // The last component is not followed for a hard link's target.
        assert_eq!(
            resolve(root, Path::new("lib"), false)?,
            Some(root.join("lib"))
        );
        symlink("loop", root.join("loop"))?;
        assert_eq!(resolve(root, Path::new("loop/x"), true)?, None);
        Ok(())
    }

    /// A new file is made private and writable; an existing name, a
    /// symlink (even a dangling one) included, is refused and left as it is.
    #[test]
    fn create_file_makes_only_new_files() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let new = dir.path().join("new");
        let mut file = create_file(&new, 0o600)?;
        file.write_all(b"data")?;
        drop(file);
        assert_eq!(fs::read(&new)?, b"data");
        assert_eq!(fs::metadata(&new)?.permissions().mode() & 0o777, 0o600);
        let err = create_file(&new, 0o600).expect_err("an existing file");
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&new)?, b"data");
        let link = dir.path().join("link");
        symlink(dir.path().join("target"), &link)?;
        let err = create_file(&link, 0o600).expect_err("a dangling symlink");
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert!(!dir.path().join("target").exists());
        Ok(())
    }

    /// A directory replaced by a symlink later in the same stream: entries
    /// under it resolve through the symlink, clamped to the root, and never
    /// through what was resolved (and cached) for the directory.
    #[test]
    fn a_directory_replaced_by_a_symlink_stays_confined() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        fs::create_dir_all(&root)?;
        fs::create_dir_all(&outside)?;
        let mut tar = tar::Builder::new(Vec::new());
        let header = |kind: EntryType, size: u64| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(0o755);
            h.set_size(size);
            h
        };
        tar.append_data(&mut header(EntryType::Directory, 0), "a/", io::empty())?;
        tar.append_data(&mut header(EntryType::Regular, 1), "a/x", &b"x"[..])?;
        tar.append_link(&mut header(EntryType::Symlink, 0), "a", &outside)?;
        tar.append_data(&mut header(EntryType::Regular, 1), "a/y", &b"y"[..])?;
        let stream = tar.into_inner()?;

        let done =
            unpack(&stream[..], &root, UnpackOptions::default()).map_err(io::Error::other)?;
        assert_eq!(done.entries, 4);
        assert!(!outside.join("y").exists(), "wrote outside the root");
        let clamped = root.join(outside.strip_prefix("/").map_err(io::Error::other)?);
        assert_eq!(fs::read(clamped.join("y"))?, b"y");
        assert_eq!(fs::read_link(root.join("a"))?, outside);
        Ok(())
    }
}
