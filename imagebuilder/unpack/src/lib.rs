//! `mprov-unpack`: unpacks a tar stream into a root directory. One unpacker
//! for every caller: the image builder's OCI and `docker save` layers (with
//! whiteouts), `mprov-image unpack`, and the node agent streaming
//! `rootfs.tar.zst` into its staging tmpfs. Small on purpose (tar, nix,
//! xattr): the agent is a static binary and must not pull in the image
//! builder.
//!
//! The `tar` crate reads the stream (GNU long names, PAX records, GNU sparse
//! entries); creating the entries is done here, because its `Entry::unpack`
//! turns device nodes and FIFOs into empty regular files, links hard links
//! relative to the working directory, and skips (rather than reports) paths
//! that escape the destination.
//!
//! One file per job; this one holds the API and the entry loop, which
//! decides what each entry becomes (and applies whiteouts):
//! - `confine.rs`: the security boundary, where a name of the archive may
//!   lead ([`confine`], parents resolved as if the root were `/`, files
//!   created only where nothing is). Its module comment states the rules.
//! - `writers.rs`: the writer threads that create the small regular files
//!   while this thread reads on, and the data copies of the files written
//!   in place.
//! - `meta.rs`: owner, mode, xattrs and times, in the order that keeps them.
//! - `read_ahead.rs`: [`ReadAhead`], the reader a thread of its own fills
//!   (decompression, and in the agent the download).
//!
//! Whiteouts (OCI image spec, "Representation of Changes"): `.wh.NAME`
//! deletes `NAME` from the lower layers, `.wh..wh..opq` empties its directory
//! of everything the lower layers put there. Neither is written out.

#![warn(missing_docs)]

mod confine;
mod meta;
mod read_ahead;
mod writers;

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::sys::stat::{Mode, SFlag, makedev, mknod};
use tar::EntryType;

pub use crate::confine::confine;
use crate::confine::{create_file, resolve, resolve_noting};
use crate::meta::{Creator, FileMeta, apply_meta, creator_in, pax_xattrs, set_mtime};
pub use crate::read_ahead::ReadAhead;
use crate::writers::{COPY_BUF, Writers, copy_data, copy_sparse, drain};
pub use crate::writers::{JOB_MAX, MAX_WRITERS};

/// The OCI whiteout prefix.
const WHITEOUT: &str = ".wh.";
/// The OCI opaque-directory marker.
const OPAQUE: &str = ".wh..wh..opq";

/// How to unpack.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnpackOptions {
    /// Treat `.wh.*` names as OCI whiteouts.
    pub whiteouts: bool,
    /// Set owners from the archive (needs root); otherwise files belong to
    /// whoever unpacks.
    pub preserve_owner: bool,
}

/// What [`unpack`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unpacked {
    /// Entries written (whiteouts not included).
    pub entries: u64,
    /// Whiteouts applied.
    pub whiteouts: u64,
}

/// Why unpacking failed.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// Creating or changing an entry failed.
    #[error("writing {path}")]
    Create {
        /// The entry's path on disk.
        path: PathBuf,
        /// The cause.
        #[source]
        err: io::Error,
    },
    /// A name or link target leads out of the root.
    #[error("{path} leads out of the root")]
    PathEscapes {
        /// The offending name as the archive spells it.
        path: String,
    },
    /// The stream is not a readable tar archive.
    #[error("reading the archive")]
    Read {
        /// The cause.
        #[source]
        err: io::Error,
    },
    /// An entry of a type a root file system cannot hold.
    #[error("{path}: unsupported entry type {kind:?}")]
    Unsupported {
        /// The entry's name.
        path: String,
        /// Its tar type.
        kind: EntryType,
    },
}

/// Unpacks the tar stream `reader` into `root`, which must exist.
///
/// Regular files of up to [`JOB_MAX`] bytes are written by a few writer
/// threads (one per CPU beyond the first, at most [`MAX_WRITERS`]) while
/// this thread reads on: creating files is the kernel's work and the
/// bottleneck of an unpack, and files do not depend on each other. The
/// result is the sequential one: this thread decides every path (and
/// resolves every parent), writes everything else itself, and waits for the
/// writers to finish before it removes anything, links
/// to a file, or touches a path one of them may still be writing. A file is
/// handed to a writer without a look at its path only when its parent is a
/// directory this stream created and the name is new to the stream; anything
/// else is looked up first, as a sequential unpack does.
pub fn unpack<R: Read>(
    reader: R,
    root: &Path,
    options: UnpackOptions,
) -> Result<Unpacked, UnpackError> {
    let writers = std::thread::available_parallelism()
        .map(|n| n.get().saturating_sub(1).min(MAX_WRITERS))
        .unwrap_or(0);
    unpack_with(reader, root, options, writers)
}

/// [`unpack`] with `writers` writer threads (none: all in this thread).
fn unpack_with<R: Read>(
    reader: R,
    root: &Path,
    options: UnpackOptions,
    writers: usize,
) -> Result<Unpacked, UnpackError> {
    let (done, dirs) = if writers == 0 {
        unpack_entries(reader, root, options, None)?
    } else {
        let pool = Writers::new(writers);
        let result = std::thread::scope(|scope| {
            for _ in 0..writers {
                scope.spawn(|| pool.work());
            }
            let result = unpack_entries(reader, root, options, Some(&pool));
            if result.is_err() {
                // What is still queued is of no use.
                pool.abandon();
            }
            // The writers end once the queue is empty and closed.
            pool.close();
            result
        });
        // A writer's error comes first: its file came earlier in the stream
        // than whatever this thread stopped at.
        if let Some(err) = pool.take_error() {
            return Err(err);
        }
        result?
    };
    // Deepest first, so setting a child's time does not touch its parent's.
    let mut dirs = dirs;
    dirs.sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
    for (dir, mtime) in dirs {
        set_mtime(&dir, mtime).map_err(|err| create_err(dir.clone(), err))?;
    }
    Ok(done)
}

/// The entries of the stream, in order; the directories (and their mtimes)
/// left for the caller to date once every file is written.
fn unpack_entries<R: Read>(
    reader: R,
    root: &Path,
    options: UnpackOptions,
    pool: Option<&Writers>,
) -> Result<(Unpacked, Vec<(PathBuf, u64)>), UnpackError> {
    let mut archive = tar::Archive::new(reader);
    let mut done = Unpacked::default();
    // Paths this stream wrote: an opaque whiteout keeps them.
    let mut ours: HashSet<PathBuf> = HashSet::new();
    let mut dirs: Vec<(PathBuf, u64)> = Vec::new();
    // Resolved parents by their archive path: most entries share their
    // parent with the one before, and resolving walks every component. A
    // resolution stays true until something that exists is removed (every
    // component on its way exists, so nothing new can appear there without
    // a removal first); then the cache is emptied.
    let mut parents: HashMap<PathBuf, PathBuf> = HashMap::new();
    // Directories this stream created, and every path it created or handed
    // to a writer: a new name in a new directory cannot exist yet, so it
    // needs no look-up (the common case of a fresh root). Emptied (for
    // directories) on every removal.
    let mut fresh: HashSet<PathBuf> = HashSet::new();
    let mut created: HashSet<PathBuf> = HashSet::new();
    // Directories this stream created whose new files do not simply get the
    // creator's group and mode (setgid, or xattrs such as a default ACL).
    let mut odd: HashSet<PathBuf> = HashSet::new();
    let creator = Creator::current();
    let read_err = |err| UnpackError::Read { err };
    // One buffer for the data of files written in place: far fewer writes
    // than `io::copy`'s 8 KiB.
    let mut buf = vec![0u8; COPY_BUF];
    for entry in archive.entries().map_err(read_err)? {
        if pool.is_some_and(Writers::failed) {
            // The caller reports the writer's error.
            break;
        }
        let mut entry = entry.map_err(read_err)?;
        let raw = entry.path_bytes().into_owned();
        let rel = confine(&raw).ok_or_else(|| UnpackError::PathEscapes {
            path: String::from_utf8_lossy(&raw).into_owned(),
        })?;
        let shown = || String::from_utf8_lossy(&raw).into_owned();
        // A link entry's target, which it must have.
        let link_target = |target: Option<&[u8]>| {
            target
                .map(<[u8]>::to_vec)
                .ok_or_else(|| read_err(io::Error::other(format!("{}: no link target", shown()))))
        };
        let kind = entry.header().entry_type();
        let xattrs = pax_xattrs(&mut entry).map_err(read_err)?;
        if rel.as_os_str().is_empty() {
            // The root itself (`./`): only its metadata.
            if kind.is_dir() {
                apply_meta(entry.header(), &xattrs, root, options)?;
                dirs.push((root.to_path_buf(), entry.header().mtime().unwrap_or(0)));
            }
            continue;
        }
        let name = rel.file_name().unwrap_or_default().to_os_string();
        let parent_rel = rel.parent().unwrap_or(Path::new(""));
        let parent = match parents.get(parent_rel) {
            Some(parent) => parent.clone(),
            None => {
                let parent = resolve_noting(root, parent_rel, &mut fresh, &mut created)
                    .map_err(|err| create_err(root.join(&rel), err))?
                    .ok_or_else(|| UnpackError::PathEscapes { path: shown() })?;
                parents.insert(parent_rel.to_path_buf(), parent.clone());
                parent
            }
        };

        if options.whiteouts && name.as_bytes().starts_with(WHITEOUT.as_bytes()) {
            drain(pool);
            parents.clear();
            fresh.clear();
            if name == OPAQUE {
                clear_lower(&parent, &ours).map_err(|err| create_err(parent.clone(), err))?;
            } else {
                let victim = parent.join(OsStr::from_bytes(&name.as_bytes()[WHITEOUT.len()..]));
                remove_any(&victim).map_err(|err| create_err(victim.clone(), err))?;
            }
            done.whiteouts += 1;
            continue;
        }

        let dest = parent.join(&name);
        if options.whiteouts {
            ours.insert(dest.clone());
        }
        // Is something there already? Not if the parent is new and the name
        // new to the stream; otherwise look, after the writers are done
        // with the name.
        let new_name = created.insert(dest.clone());
        let existing = if new_name && fresh.contains(&parent) {
            None
        } else {
            if !new_name {
                drain(pool);
            }
            fs::symlink_metadata(&dest).ok()
        };
        let keep_dir = kind.is_dir() && existing.as_ref().is_some_and(|m| m.is_dir());
        if existing.is_some() && !keep_dir {
            drain(pool);
            parents.clear();
            fresh.clear();
            remove_any(&dest).map_err(|err| create_err(dest.clone(), err))?;
        }
        let header = entry.header().clone();
        let c = |err| create_err(dest.clone(), err);
        match kind {
            EntryType::Directory => {
                if !keep_dir {
                    fs::create_dir(&dest).map_err(c)?;
                    fresh.insert(dest.clone());
                }
                // Its metadata is applied below, a kept folder's too (one
                // this stream made for earlier entries, say).
                let mode = header.mode().map_err(read_err)?;
                if mode & 0o2000 != 0 || !xattrs.is_empty() {
                    odd.insert(dest.clone());
                } else {
                    odd.remove(&dest);
                }
                // A real directory now: its entries' parent needs no walk.
                parents.insert(rel.clone(), dest.clone());
            }
            // The entry's size, a PAX `size` record's if it has one.
            EntryType::Regular | EntryType::Continuous
                if pool.is_some() && entry.size() <= JOB_MAX =>
            {
                let creator = creator_in(creator, &parent, &fresh, &odd);
                let meta = FileMeta::of(&header, xattrs, &dest, options, creator)?;
                if let Some(writers) = pool {
                    let size = usize::try_from(entry.size()).unwrap_or(usize::MAX);
                    writers
                        .send(dest, meta, size, |data| entry.read_exact(data))
                        .map_err(read_err)?;
                }
                done.entries += 1;
                continue;
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                let creator = creator_in(creator, &parent, &fresh, &odd);
                let meta = FileMeta::of(&header, xattrs, &dest, options, creator)?;
                let mut file = create_file(&dest, meta.born_mode()).map_err(c)?;
                if kind == EntryType::GNUSparse {
                    copy_sparse(&mut entry, &mut file).map_err(c)?;
                } else {
                    copy_data(&mut entry, &mut file, &mut buf).map_err(c)?;
                }
                meta.apply(&file).map_err(c)?;
                done.entries += 1;
                continue;
            }
            EntryType::Symlink => {
                let target = link_target(entry.link_name_bytes().as_deref())?;
                symlink(OsStr::from_bytes(&target), &dest).map_err(c)?;
            }
            EntryType::Link => {
                let target = link_target(entry.link_name_bytes().as_deref())?;
                let target_rel = confine(&target).ok_or_else(|| UnpackError::PathEscapes {
                    path: String::from_utf8_lossy(&target).into_owned(),
                })?;
                let source = resolve(root, &target_rel, false)
                    .map_err(c)?
                    .ok_or_else(|| UnpackError::PathEscapes {
                        path: String::from_utf8_lossy(&target).into_owned(),
                    })?;
                // The file linked to may still be with a writer.
                drain(pool);
                fs::hard_link(&source, &dest).map_err(c)?;
                // A hard link shares its inode's metadata: nothing to apply.
                done.entries += 1;
                continue;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let flag = match kind {
                    EntryType::Char => SFlag::S_IFCHR,
                    EntryType::Block => SFlag::S_IFBLK,
                    _ => SFlag::S_IFIFO,
                };
                let major = header.device_major().ok().flatten().unwrap_or(0);
                let minor = header.device_minor().ok().flatten().unwrap_or(0);
                mknod(
                    &dest,
                    flag,
                    Mode::from_bits_truncate(0o600),
                    makedev(u64::from(major), u64::from(minor)),
                )
                .map_err(|e| c(io::Error::from(e)))?;
            }
            other => {
                return Err(UnpackError::Unsupported {
                    path: shown(),
                    kind: other,
                });
            }
        }
        apply_meta(&header, &xattrs, &dest, options)?;
        if kind.is_dir() {
            dirs.push((dest, header.mtime().unwrap_or(0)));
        }
        done.entries += 1;
    }
    drain(pool);
    Ok((done, dirs))
}

fn create_err(path: PathBuf, err: io::Error) -> UnpackError {
    UnpackError::Create { path, err }
}

/// Removes whatever is at `path`, if anything.
fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
    }
}

/// An opaque whiteout: removes the children of `dir` that this stream did not
/// write itself.
fn clear_lower(dir: &Path, ours: &HashSet<PathBuf>) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    for entry in entries {
        let path = entry?.path();
        if !ours.contains(&path) {
            remove_any(&path)?;
        }
    }
    Ok(())
}
