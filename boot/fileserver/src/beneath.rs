//! Opening a file of the export without leaving it.
//!
//! A request path is made of plain names (`file.rs` refuses `.`, `..` and
//! empty segments), but a name may be a symbolic link, and a link in the
//! export could point anywhere: `/etc/shadow` served to the provisioning
//! network by a job server running as root. So files under `/images/` are
//! opened with `openat2(2)` and `RESOLVE_BENEATH` relative to the export's
//! `images/` folder: the kernel resolves every component and refuses any
//! that leaves the folder (an absolute link, a `..` in a link, a magic link
//! in `/proc`) with `EXDEV`, in the same call that opens the file, so no
//! link swapped in between a check and the open can escape. A relative link
//! that stays inside the folder is followed.
//!
//! Kernels before 5.6 (and sandboxes that refuse the call) have no
//! `openat2`: there every component is opened with `O_NOFOLLOW`, one
//! `openat` at a time, so no link is followed at all.
//!
//! A hard link is the file itself, not a path to it, and cannot be told
//! apart; only someone who may already write the export and (with
//! `fs.protected_hardlinks=1`) owns the file can make one.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat, openat2};
use nix::sys::stat::Mode;

/// Opens `rel` (plain names only) under the folder `dir` for reading,
/// never resolving a component outside `dir`. `Errno::EXDEV` or
/// `Errno::ELOOP`: a link would lead out (or, without `openat2`, a link).
pub(crate) fn open_beneath(dir: &Path, rel: &Path) -> nix::Result<File> {
    // The folder itself may be a link (an export on another disk): it is the
    // administrator's setting, not a request's.
    let dir = open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    let how = OpenHow::new()
        .flags(flags)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    match openat2(&dir, rel, how) {
        Err(Errno::ENOSYS | Errno::EPERM) => open_nofollow(dir, rel, flags),
        opened => opened.map(File::from),
    }
}

/// Opens `rel` under `dir` one component at a time, each with `O_NOFOLLOW`.
fn open_nofollow(dir: OwnedFd, rel: &Path, flags: OFlag) -> nix::Result<File> {
    let names: Vec<&std::ffi::OsStr> = rel
        .components()
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            _ => Err(Errno::EXDEV),
        })
        .collect::<nix::Result<_>>()?;
    let Some((last, folders)) = names.split_last() else {
        return Err(Errno::ENOENT);
    };
    let mut at = dir;
    for name in folders {
        at = openat(
            at.as_fd(),
            *name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
    }
    openat(at.as_fd(), *last, flags | OFlag::O_NOFOLLOW, Mode::empty()).map(File::from)
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;
    use std::os::unix::fs::symlink;

    use super::*;

    fn read(file: nix::Result<File>) -> nix::Result<String> {
        let mut text = String::new();
        file?.read_to_string(&mut text).map_err(|_| Errno::EIO)?;
        Ok(text)
    }

    #[test]
    fn links_out_of_the_folder_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "secret").unwrap();
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("images");
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/file"), "inside").unwrap();
        symlink(outside.path().join("secret"), dir.join("a/abs")).unwrap();
        symlink("../../../secret-nope", dir.join("a/b/up")).unwrap();
        symlink(outside.path(), dir.join("a/outdir")).unwrap();
        symlink("b/file", dir.join("a/rel")).unwrap();
        symlink("b", dir.join("a/reldir")).unwrap();

        assert_eq!(
            read(open_beneath(&dir, Path::new("a/b/file"))).unwrap(),
            "inside"
        );
        for out in ["a/abs", "a/b/up", "a/outdir/secret"] {
            let err = open_beneath(&dir, Path::new(out)).unwrap_err();
            assert!(matches!(err, Errno::EXDEV | Errno::ELOOP), "{out}: {err}");
        }
        // Links that stay inside: followed by openat2, refused without it.
        for inside in ["a/rel", "a/reldir/file"] {
            assert_eq!(
                read(open_beneath(&dir, Path::new(inside))).unwrap(),
                "inside"
            );
            let dirfd = open(&dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
            let err = open_nofollow(dirfd, Path::new(inside), OFlag::O_RDONLY).unwrap_err();
            assert!(
                matches!(err, Errno::ELOOP | Errno::ENOTDIR),
                "{inside}: {err}"
            );
        }
        for out in ["a/abs", "a/outdir/secret"] {
            let dirfd = open(&dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
            let err = open_nofollow(dirfd, Path::new(out), OFlag::O_RDONLY).unwrap_err();
            assert!(matches!(err, Errno::ELOOP | Errno::ENOTDIR), "{out}: {err}");
        }
        let dirfd = open(&dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        assert_eq!(
            read(open_nofollow(dirfd, Path::new("a/b/file"), OFlag::O_RDONLY)).unwrap(),
            "inside"
        );
    }
}
