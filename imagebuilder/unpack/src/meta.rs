//! Metadata: owner, mode, xattrs and times, from the entry's header and its
//! `SCHILY.xattr.*` PAX records.
//!
//! It is applied in the order that keeps it: owner first (a `chown` clears
//! setuid bits and file capabilities), then mode, then xattrs, then mtime;
//! directory mtimes last, deepest first, once nothing more is written inside
//! them (by [`crate::unpack`]). A file that its creation already gives the
//! right owner and mode (the common case of a root unpacked by root into
//! folders it made) is created with its mode and skips the `fchown` and
//! `fchmod`, two of the six system calls per file ([`Creator`]).
//!
//! Nothing here follows a symlink: `lchown`, `lsetxattr` and `lutimes` by
//! path, and a regular file's metadata through its open descriptor.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, lchown};
use std::path::{Path, PathBuf};

use nix::sys::stat::lutimes;
use nix::sys::time::TimeVal;
use tar::EntryType;

use crate::{UnpackError, UnpackOptions, create_err};

/// A regular file's metadata, read from its header before it is handed on.
#[derive(Debug)]
pub(crate) struct FileMeta {
    /// Owner and group to set (when preserving owners).
    owner: Option<(u32, u32)>,
    /// Permission bits, setuid and the like included.
    mode: u32,
    /// Modification (and access) time.
    mtime: u64,
    /// `SCHILY.xattr.*` records.
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Creating the file gives it its owner and mode already.
    born: bool,
}

impl FileMeta {
    /// The entry's metadata; `creator` is who creates the file, when its
    /// parent is a plain directory this stream made (see [`Creator`]).
    pub(crate) fn of(
        header: &tar::Header,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
        path: &Path,
        options: UnpackOptions,
        creator: Option<Creator>,
    ) -> Result<FileMeta, UnpackError> {
        let owner = if options.preserve_owner {
            Some(owner(header, path)?)
        } else {
            None
        };
        let mode = header.mode().map_err(|err| UnpackError::Read { err })? & 0o7777;
        let born = creator.is_some_and(|c| {
            xattrs.is_empty()
                && mode & 0o7000 == 0
                && mode & c.umask == 0
                && owner.is_none_or(|o| o == (c.uid, c.gid))
        });
        Ok(FileMeta {
            owner,
            mode,
            mtime: header.mtime().unwrap_or(0),
            xattrs,
            born,
        })
    }

    /// The mode to create the file with: its own when creating gives the
    /// file its owner and mode, else private until [`FileMeta::apply`].
    pub(crate) fn born_mode(&self) -> u32 {
        if self.born { self.mode } else { 0o600 }
    }

    /// Sets it on the open file, in the order that keeps it (owner first: a
    /// `chown` clears setuid bits and file capabilities), through the
    /// descriptor: no path lookups.
    pub(crate) fn apply(&self, file: &File) -> io::Result<()> {
        if !self.born {
            if let Some((uid, gid)) = self.owner {
                std::os::unix::fs::fchown(file, Some(uid), Some(gid))?;
            }
            file.set_permissions(fs::Permissions::from_mode(self.mode))?;
        }
        for (name, value) in &self.xattrs {
            xattr::FileExt::set_xattr(file, OsStr::from_bytes(name), value)?;
        }
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(self.mtime);
        file.set_times(fs::FileTimes::new().set_accessed(t).set_modified(t))
    }
}

/// Who creates the files. A new file in a directory without the setgid bit
/// or a default ACL belongs to the creating process's effective user and
/// group and gets the mode asked for, less the umask; such a file needs no
/// `fchown` or `fchmod` when that is already its entry's metadata.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Creator {
    uid: u32,
    gid: u32,
    /// The bits the umask takes away.
    umask: u32,
}

impl Creator {
    /// This process, as `/proc/self/status` tells its umask (reading it with
    /// `umask(2)` would change it for every thread a moment). Without
    /// `/proc`, no file takes the short way.
    pub(crate) fn current() -> Option<Creator> {
        let status = fs::read_to_string("/proc/self/status").ok()?;
        let umask = status
            .lines()
            .find_map(|line| line.strip_prefix("Umask:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())?;
        Some(Creator {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            umask,
        })
    }
}

/// `creator`, for a file in `parent` when that is a plain folder this
/// stream made (in `fresh`, not in `odd`); `None` elsewhere.
pub(crate) fn creator_in(
    creator: Option<Creator>,
    parent: &Path,
    fresh: &HashSet<PathBuf>,
    odd: &HashSet<PathBuf>,
) -> Option<Creator> {
    creator.filter(|_| fresh.contains(parent) && !odd.contains(parent))
}

/// The entry's owner, as uid and gid.
fn owner(header: &tar::Header, path: &Path) -> Result<(u32, u32), UnpackError> {
    let c = |err| create_err(path.to_path_buf(), err);
    let uid = header.uid().map_err(|err| UnpackError::Read { err })?;
    let gid = header.gid().map_err(|err| UnpackError::Read { err })?;
    let uid = u32::try_from(uid).map_err(|_| c(io::Error::other("uid out of range")))?;
    let gid = u32::try_from(gid).map_err(|_| c(io::Error::other("gid out of range")))?;
    Ok((uid, gid))
}

/// Owner, mode, xattrs and (except for directories) mtime from the entry.
pub(crate) fn apply_meta(
    header: &tar::Header,
    xattrs: &[(Vec<u8>, Vec<u8>)],
    path: &Path,
    options: UnpackOptions,
) -> Result<(), UnpackError> {
    let kind = header.entry_type();
    let c = |err| create_err(path.to_path_buf(), err);
    if options.preserve_owner {
        let (uid, gid) = owner(header, path)?;
        lchown(path, Some(uid), Some(gid)).map_err(c)?;
    }
    if kind != EntryType::Symlink {
        let mode = header.mode().map_err(|err| UnpackError::Read { err })? & 0o7777;
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(c)?;
    }
    for (name, value) in xattrs {
        xattr::set(path, OsStr::from_bytes(name), value).map_err(c)?;
    }
    if !kind.is_dir() {
        set_mtime(path, header.mtime().unwrap_or(0)).map_err(c)?;
    }
    Ok(())
}

/// The entry's `SCHILY.xattr.*` PAX records as (name, value) pairs, read
/// before its data (the records come from the header before it).
pub(crate) fn pax_xattrs<R: Read>(
    entry: &mut tar::Entry<'_, R>,
) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    const PREFIX: &[u8] = b"SCHILY.xattr.";
    let Some(records) = entry.pax_extensions()? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for ext in records {
        let ext = ext?;
        if let Some(name) = ext.key_bytes().strip_prefix(PREFIX) {
            out.push((name.to_vec(), ext.value_bytes().to_vec()));
        }
    }
    Ok(out)
}

/// Sets atime and mtime without following a symlink.
pub(crate) fn set_mtime(path: &Path, mtime: u64) -> io::Result<()> {
    let t = TimeVal::new(mtime as i64, 0);
    lutimes(path, &t, &t).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use std::{fs, io};

    use tar::EntryType;

    use crate::{UnpackOptions, unpack};

    /// A folder made for an earlier entry, whose own entry comes later with
    /// the setgid bit: files after it are owned as the archive says, not
    /// by the folder's group (the owner-and-mode short way stops there).
    #[test]
    fn a_setgid_folder_entry_after_its_files_keeps_their_owners() -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            // Owners are kept only by root; the suite runs as root.
            panic!("this test needs root, as the test suite runs");
        }
        let dir = tempfile::tempdir()?;
        let mut tar = tar::Builder::new(Vec::new());
        let header = |kind: EntryType, mode: u32, gid: u64, size: u64| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_uid(0);
            h.set_gid(gid);
            h.set_size(size);
            h
        };
        let file = |mode| header(EntryType::Regular, mode, 0, 1);
        tar.append_data(&mut file(0o644), "mail/before", &b"x"[..])?;
        tar.append_data(
            &mut header(EntryType::Directory, 0o2775, 8, 0),
            "mail/",
            io::empty(),
        )?;
        tar.append_data(&mut file(0o644), "mail/after", &b"y"[..])?;
        let stream = tar.into_inner()?;
        let options = UnpackOptions {
            whiteouts: false,
            preserve_owner: true,
        };
        unpack(&stream[..], dir.path(), options).map_err(io::Error::other)?;
        let mail = fs::metadata(dir.path().join("mail"))?;
        assert_eq!((mail.gid(), mail.mode() & 0o7777), (8, 0o2775));
        for name in ["before", "after"] {
            let meta = fs::metadata(dir.path().join("mail").join(name))?;
            assert_eq!(
                (meta.uid(), meta.gid(), meta.mode() & 0o7777),
                (0, 0, 0o644),
                "{name}"
            );
        }
        Ok(())
    }
}
