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
//! Paths are confined to the root the way a container runtime does it: a
//! name with a `..` component is an error ([`UnpackError::PathEscapes`]), and
//! symlinks met on the way to an entry's parent are resolved as if the root
//! were `/` (an absolute target, or `..` at the top, stays inside). A hard
//! link's target is confined the same way.
//!
//! Whiteouts (OCI image spec, "Representation of Changes"): `.wh.NAME`
//! deletes `NAME` from the lower layers, `.wh..wh..opq` empties its directory
//! of everything the lower layers put there. Neither is written out.
//!
//! Metadata is applied in the order that keeps it: owner first (a `chown`
//! clears setuid bits and file capabilities), then mode, then xattrs, then
//! mtime; directory mtimes last, deepest first, once nothing more is written
//! inside them. A file that its creation already gives the right owner and
//! mode (the common case of a root unpacked by root into folders it made) is
//! created with its mode and skips the `fchown` and `fchmod`, two of the six
//! system calls per file.

#![warn(missing_docs)]

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, BufRead, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, lchown, symlink};
use std::path::{Component, Path, PathBuf};

use nix::sys::stat::{Mode, SFlag, lutimes, makedev, mknod};
use nix::sys::time::TimeVal;
use tar::EntryType;

/// The OCI whiteout prefix.
const WHITEOUT: &str = ".wh.";
/// The OCI opaque-directory marker.
const OPAQUE: &str = ".wh..wh..opq";
/// How many symlinks a path may pass through (Linux's `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

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

/// Writer threads at most.
pub const MAX_WRITERS: usize = 4;
/// The largest file handed to a writer (bigger ones are written in place,
/// streamed, so memory stays bounded: the queue holds a few batches of
/// about a MiB per writer).
pub const JOB_MAX: u64 = 1024 * 1024;

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
            EntryType::Regular | EntryType::Continuous
                if pool.is_some() && header.size().is_ok_and(|n| n <= JOB_MAX) =>
            {
                let mut data = Vec::with_capacity(header.size().unwrap_or(0) as usize);
                entry.read_to_end(&mut data).map_err(read_err)?;
                let creator = creator_in(creator, &parent, &fresh, &odd);
                let meta = FileMeta::of(&header, xattrs, &dest, options, creator)?;
                if let Some(writers) = pool {
                    writers.send(FileJob { dest, data, meta });
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

/// Waits for the writers, if any, to finish what they were given.
fn drain(pool: Option<&Writers>) {
    if let Some(writers) = pool {
        writers.drain();
    }
}

/// A regular file's metadata, read from its header before it is handed on.
#[derive(Debug)]
struct FileMeta {
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
    fn of(
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
    fn born_mode(&self) -> u32 {
        if self.born { self.mode } else { 0o600 }
    }

    /// Sets it on the open file, in the order that keeps it (owner first: a
    /// `chown` clears setuid bits and file capabilities), through the
    /// descriptor: no path lookups.
    fn apply(&self, file: &File) -> io::Result<()> {
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

/// Creates a regular file that must not exist yet (never following a
/// symlink), with `mode` (less the umask).
///
/// `openat` rather than `open` (what `std::fs::OpenOptions` calls): musl's
/// `open` follows every `O_CLOEXEC` open with an `fcntl(F_SETFD)` for old
/// kernels, one more system call per file of the root in the static agent.
fn create_file(path: &Path, mode: u32) -> io::Result<File> {
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

/// Who creates the files. A new file in a directory without the setgid bit
/// or a default ACL belongs to the creating process's effective user and
/// group and gets the mode asked for, less the umask; such a file needs no
/// `fchown` or `fchmod` when that is already its entry's metadata.
#[derive(Debug, Clone, Copy)]
struct Creator {
    uid: u32,
    gid: u32,
    /// The bits the umask takes away.
    umask: u32,
}

impl Creator {
    /// This process, as `/proc/self/status` tells its umask (reading it with
    /// `umask(2)` would change it for every thread a moment). Without
    /// `/proc`, no file takes the short way.
    fn current() -> Option<Creator> {
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
fn creator_in(
    creator: Option<Creator>,
    parent: &Path,
    fresh: &HashSet<PathBuf>,
    odd: &HashSet<PathBuf>,
) -> Option<Creator> {
    creator.filter(|_| fresh.contains(parent) && !odd.contains(parent))
}

/// A regular file for a writer thread.
#[derive(Debug)]
struct FileJob {
    dest: PathBuf,
    data: Vec<u8>,
    meta: FileMeta,
}

impl FileJob {
    fn write(&self) -> Result<(), UnpackError> {
        let c = |err| create_err(self.dest.clone(), err);
        let mut file = create_file(&self.dest, self.meta.born_mode()).map_err(c)?;
        file.write_all(&self.data).map_err(c)?;
        self.meta.apply(&file).map_err(c)
    }
}

/// The writer threads' shared state: the batch being filled, a bounded
/// queue of batches, how many batches are not yet written, and the first
/// error.
///
/// Files go to the writers in batches ([`Writers::BATCH_FILES`] files or
/// [`Writers::BATCH_BYTES`] of data, whichever comes first), not one by one:
/// most files of a root are a few KiB, and handing each over on its own
/// cost a wake-up and a context switch per file, more CPU than writing it.
#[derive(Debug)]
struct Writers {
    batch: std::sync::Mutex<Batch>,
    queue: std::sync::Mutex<Option<std::sync::mpsc::SyncSender<Vec<FileJob>>>>,
    jobs: std::sync::Mutex<std::sync::mpsc::Receiver<Vec<FileJob>>>,
    pending: std::sync::Mutex<usize>,
    idle: std::sync::Condvar,
    error: std::sync::Mutex<Option<UnpackError>>,
    failed: std::sync::atomic::AtomicBool,
}

/// The files not yet handed to a writer, and their bytes.
#[derive(Debug, Default)]
struct Batch {
    jobs: Vec<FileJob>,
    bytes: usize,
}

impl Writers {
    /// Batches queued per writer at most (each holds up to about
    /// [`Writers::BATCH_BYTES`] + [`JOB_MAX`] of data).
    const DEPTH: usize = 4;
    /// Files in a batch at most.
    const BATCH_FILES: usize = 64;
    /// A batch is handed on once it holds this much data.
    const BATCH_BYTES: usize = 1024 * 1024;

    fn new(writers: usize) -> Writers {
        let (tx, rx) = std::sync::mpsc::sync_channel(Self::DEPTH * writers);
        Writers {
            batch: std::sync::Mutex::new(Batch::default()),
            queue: std::sync::Mutex::new(Some(tx)),
            jobs: std::sync::Mutex::new(rx),
            pending: std::sync::Mutex::new(0),
            idle: std::sync::Condvar::new(),
            error: std::sync::Mutex::new(None),
            failed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        mutex.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a writer failed (its error is kept for [`Writers::take_error`]).
    fn failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Adds a file to the batch, handing the batch on once it is full
    /// (waiting while the queue is full).
    fn send(&self, job: FileJob) {
        let full = {
            let mut batch = Self::lock(&self.batch);
            batch.bytes += job.data.len();
            batch.jobs.push(job);
            (batch.jobs.len() >= Self::BATCH_FILES || batch.bytes >= Self::BATCH_BYTES)
                .then(|| std::mem::take(&mut *batch))
        };
        if let Some(batch) = full {
            self.queue_batch(batch.jobs);
        }
    }

    /// Hands on the batch being filled, if it holds anything.
    fn flush(&self) {
        let batch = std::mem::take(&mut *Self::lock(&self.batch));
        if !batch.jobs.is_empty() {
            self.queue_batch(batch.jobs);
        }
    }

    fn queue_batch(&self, jobs: Vec<FileJob>) {
        *Self::lock(&self.pending) += 1;
        let sent = Self::lock(&self.queue)
            .as_ref()
            .map(|tx| tx.clone())
            .map(|tx| tx.send(jobs));
        if !matches!(sent, Some(Ok(()))) {
            self.finished();
        }
    }

    fn finished(&self) {
        let mut pending = Self::lock(&self.pending);
        *pending = pending.saturating_sub(1);
        if *pending == 0 {
            self.idle.notify_all();
        }
    }

    /// Waits until every file sent is written (or failed).
    fn drain(&self) {
        self.flush();
        let mut pending = Self::lock(&self.pending);
        while *pending > 0 {
            pending = self.idle.wait(pending).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The unpack failed: queued files are dropped unwritten.
    fn abandon(&self) {
        self.failed
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// No more files: the writers stop once the queue is empty.
    fn close(&self) {
        self.flush();
        Self::lock(&self.queue).take();
    }

    fn take_error(&self) -> Option<UnpackError> {
        Self::lock(&self.error).take()
    }

    /// A writer thread's loop: writes queued batches until the queue
    /// closes. After a failure the rest are dropped unwritten.
    fn work(&self) {
        loop {
            let jobs = Self::lock(&self.jobs).recv();
            let Ok(jobs) = jobs else {
                return;
            };
            for job in jobs {
                if self.failed() {
                    break;
                }
                if let Err(err) = job.write() {
                    Self::lock(&self.error).get_or_insert(err);
                    self.failed
                        .store(true, std::sync::atomic::Ordering::Release);
                }
            }
            self.finished();
        }
    }
}

/// A reader fed by another thread, a few chunks ahead: decompression (and,
/// in the agent, the download and its hash) on a thread of its own, so it
/// overlaps with the system calls that create the files (as `zstd -dc | tar
/// x` overlaps two processes).
pub struct ReadAhead {
    chunks: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    /// Read chunks go back to the feeder to be filled again: no allocation
    /// (and, with musl, no `mmap` and page faults) per chunk.
    spare: std::sync::mpsc::Sender<Vec<u8>>,
    current: io::Cursor<Vec<u8>>,
}

impl ReadAhead {
    /// Chunks in flight at most.
    const DEPTH: usize = 4;
    /// The size of one chunk.
    pub const CHUNK: usize = 1024 * 1024;

    /// The reader, and the function that feeds it from `source` until the
    /// end, an error, or the reader is dropped (run it on another thread).
    pub fn new<R: Read + Send>(mut source: R) -> (Self, impl FnOnce() + Send) {
        let (tx, chunks) = std::sync::mpsc::sync_channel(Self::DEPTH);
        let (spare, spares) = std::sync::mpsc::channel::<Vec<u8>>();
        let feeder = move || {
            loop {
                let mut chunk = match spares.try_recv() {
                    Ok(mut chunk) => {
                        chunk.resize(Self::CHUNK, 0);
                        chunk
                    }
                    Err(_) => vec![0u8; Self::CHUNK],
                };
                let mut filled = 0;
                let result = loop {
                    match source.read(&mut chunk[filled..]) {
                        Ok(0) => break Ok(()),
                        Ok(n) => {
                            filled += n;
                            if filled == chunk.len() {
                                break Ok(());
                            }
                        }
                        Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                        Err(err) => break Err(err),
                    }
                };
                chunk.truncate(filled);
                let end = filled < Self::CHUNK;
                let sent = match result {
                    Ok(()) if chunk.is_empty() => break,
                    Ok(()) => tx.send(Ok(chunk)),
                    Err(err) => {
                        let _ = tx.send(Ok(chunk));
                        tx.send(Err(err))
                    }
                };
                if sent.is_err() || end {
                    break;
                }
            }
        };
        let reader = Self {
            chunks,
            spare,
            current: io::Cursor::new(Vec::new()),
        };
        (reader, feeder)
    }
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAhead")
            .field(
                "buffered",
                &(self.current.get_ref().len() as u64 - self.current.position()),
            )
            .finish_non_exhaustive()
    }
}

impl Read for ReadAhead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

/// Its chunks as the buffer: a reader that wants one (zstd's decoder) needs
/// no copy of its own.
impl BufRead for ReadAhead {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.current.position() >= self.current.get_ref().len() as u64 {
            match self.chunks.recv() {
                Ok(chunk) => {
                    let used = std::mem::replace(&mut self.current, io::Cursor::new(chunk?));
                    // The feeder may be gone: then the chunk is just freed.
                    let _ = self.spare.send(used.into_inner());
                }
                // The feeder is done: end of stream.
                Err(_) => break,
            }
        }
        let at = usize::try_from(self.current.position()).unwrap_or(usize::MAX);
        Ok(self.current.get_ref().get(at..).unwrap_or(&[]))
    }

    fn consume(&mut self, n: usize) {
        self.current.consume(n);
    }
}

fn create_err(path: PathBuf, err: io::Error) -> UnpackError {
    UnpackError::Create { path, err }
}

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
fn resolve(root: &Path, rel: &Path, follow_last: bool) -> io::Result<Option<PathBuf>> {
    resolve_in(root, rel, follow_last, None)
}

/// [`resolve`] for an entry's parent, adding the directories it creates to
/// `fresh` and `created`.
fn resolve_noting(
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

/// Copies a sparse entry's data, seeking over zero blocks so holes stay holes.
fn copy_sparse<R: Read>(from: &mut R, to: &mut File) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut len = 0u64;
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().all(|b| *b == 0) {
            to.seek(SeekFrom::Current(n as i64))?;
        } else {
            to.write_all(&buf[..n])?;
        }
        len += n as u64;
    }
    to.set_len(len)
}

/// The size of the buffer file data is copied through.
const COPY_BUF: usize = 256 * 1024;

/// Copies an entry's data to `to` through `buf`, writing only full buffers
/// (and the rest at the end).
fn copy_data<R: Read>(from: &mut R, to: &mut File, buf: &mut [u8]) -> io::Result<()> {
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            match from.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        to.write_all(&buf[..filled])?;
        if filled < buf.len() {
            return Ok(());
        }
    }
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
fn apply_meta(
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
fn pax_xattrs<R: Read>(entry: &mut tar::Entry<'_, R>) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
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
fn set_mtime(path: &Path, mtime: u64) -> io::Result<()> {
    let t = TimeVal::new(mtime as i64, 0);
    lutimes(path, &t, &t).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn read_ahead_passes_every_byte_and_the_error() {
        let chunk = ReadAhead::CHUNK;
        for len in [0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 17] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let out = std::thread::scope(|scope| {
                let (mut reader, feeder) = ReadAhead::new(&data[..]);
                scope.spawn(feeder);
                let mut out = Vec::new();
                reader.read_to_end(&mut out).map(|_| out)
            });
            assert!(out.unwrap() == data, "{len} bytes");
        }

        // A source that fails after some bytes: those bytes, then the error.
        let failing = (&[7u8; 10][..]).chain(FailingRead);
        let result = std::thread::scope(|scope| {
            let (mut reader, feeder) = ReadAhead::new(failing);
            scope.spawn(feeder);
            let mut out = Vec::new();
            let err = reader.read_to_end(&mut out).unwrap_err();
            (out, err)
        });
        assert_eq!(result.0, [7u8; 10]);
        assert_eq!(result.1.to_string(), "corrupt frame");

        // The reader going away early stops the feeder (the scope ends).
        let endless = io::repeat(1);
        std::thread::scope(|scope| {
            let (mut reader, feeder) = ReadAhead::new(endless);
            scope.spawn(feeder);
            let mut first = [0u8; 100];
            reader.read_exact(&mut first).unwrap();
        });
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

    /// Every path under `root` with what it is: mode, mtime (of a
    /// directory only if the archive set it), kind, content or link target,
    /// and for a file the first path (by name) sharing its inode.
    fn snapshot(root: &Path) -> io::Result<Vec<String>> {
        use std::os::unix::fs::MetadataExt;
        let mut found = Vec::new();
        let mut todo = vec![root.to_path_buf()];
        while let Some(dir) = todo.pop() {
            for entry in fs::read_dir(&dir)? {
                let path = entry?.path();
                let meta = fs::symlink_metadata(&path)?;
                if meta.is_dir() {
                    todo.push(path.clone());
                }
                let rel = path.strip_prefix(root).map_err(io::Error::other)?;
                found.push((rel.display().to_string(), path.clone(), meta));
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        let mut inodes: HashMap<u64, String> = HashMap::new();
        let mut out = Vec::new();
        for (rel, path, meta) in &found {
            let what = if meta.is_dir() {
                if meta.mtime() == 7 {
                    "dir 7".to_owned()
                } else {
                    "dir (implicit)".to_owned()
                }
            } else if meta.file_type().is_symlink() {
                format!("-> {}", fs::read_link(path)?.display())
            } else {
                let first = inodes.entry(meta.ino()).or_insert_with(|| rel.clone());
                format!(
                    "{} file {:?} (inode of {first})",
                    meta.mtime(),
                    fs::read(path)?
                )
            };
            out.push(format!("{rel} {:o} {what}", meta.mode() & 0o7777));
        }
        Ok(out)
    }

    /// The writer threads give the sequential result, entry for entry, on a
    /// stream that reuses names: a file written twice, a file replaced by a
    /// directory and back, a directory with files replaced by a file, a
    /// symlink replaced by a file with an entry under its name after, hard
    /// links to files just handed to a writer; and many small files in many
    /// directories, so the writers are busy.
    #[test]
    fn writer_threads_unpack_what_one_thread_does() -> io::Result<()> {
        let mut tar = tar::Builder::new(Vec::new());
        let header = |kind: EntryType, size: u64, mode: u32, mtime: u64| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(size);
            h.set_mtime(mtime);
            h
        };
        let dir = |tar: &mut tar::Builder<Vec<u8>>, name: &str| {
            tar.append_data(
                &mut header(EntryType::Directory, 0, 0o755, 7),
                name,
                io::empty(),
            )
        };
        let file = |tar: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8], mode: u32| {
            tar.append_data(
                &mut header(
                    EntryType::Regular,
                    data.len() as u64,
                    mode,
                    1000 + data.len() as u64,
                ),
                name,
                data,
            )
        };
        let link = |tar: &mut tar::Builder<Vec<u8>>, kind: EntryType, name: &str, target: &str| {
            tar.append_link(&mut header(kind, 0, 0o777, 9), name, target)
        };
        for d in 0..20 {
            dir(&mut tar, &format!("d{d}/"))?;
            for f in 0..30 {
                let data = format!("{d}-{f}").repeat(f + 1);
                file(
                    &mut tar,
                    &format!("d{d}/f{f}"),
                    data.as_bytes(),
                    0o640 + (f as u32 % 2),
                )?;
            }
            link(
                &mut tar,
                EntryType::Link,
                &format!("d{d}/hard"),
                &format!("d{d}/f29"),
            )?;
        }
        // A file beyond what goes to a writer, in a new directory.
        dir(&mut tar, "big/")?;
        file(
            &mut tar,
            "big/blob",
            &vec![3u8; JOB_MAX as usize + 5],
            0o600,
        )?;
        // The same name twice: the second wins.
        file(&mut tar, "d1/f3", b"second", 0o600)?;
        // A file, then a directory of that name, then a file again.
        file(&mut tar, "d2/x", b"file", 0o644)?;
        dir(&mut tar, "d2/x/")?;
        file(&mut tar, "d2/x/inner", b"inner", 0o644)?;
        file(&mut tar, "d2/x", b"file again", 0o644)?;
        // A directory full of files replaced by a file.
        file(&mut tar, "d3", b"no longer a directory", 0o644)?;
        // A symlink, a file through it, the symlink replaced by a file.
        link(&mut tar, EntryType::Symlink, "d4/l", "../d5")?;
        file(&mut tar, "d4/l/through", b"through the link", 0o644)?;
        file(&mut tar, "d4/l", b"not a link", 0o644)?;
        // A hard link to a file just written, and to one rewritten.
        file(&mut tar, "d6/new", b"new", 0o644)?;
        link(&mut tar, EntryType::Link, "d6/new-link", "d6/new")?;
        link(&mut tar, EntryType::Link, "d6/second-link", "d1/f3")?;
        // Directories named after a file inside them (made on the way).
        file(&mut tar, "late/inner/f", b"early", 0o644)?;
        dir(&mut tar, "late/inner/")?;
        dir(&mut tar, "late/")?;
        // More files than a batch holds, and files that fill a batch by
        // their bytes, each then rewritten once (a drain mid-batch).
        for f in 0..(2 * Writers::BATCH_FILES + 3) {
            file(
                &mut tar,
                &format!("many/s{f}"),
                f.to_string().as_bytes(),
                0o644,
            )?;
        }
        for f in 0..3u8 {
            let data = vec![f; Writers::BATCH_BYTES * 2 / 3];
            file(&mut tar, &format!("many/b{f}"), &data, 0o644)?;
        }
        file(&mut tar, "many/s5", b"rewritten", 0o600)?;
        file(&mut tar, "many/b1", b"rewritten too", 0o600)?;
        let stream = tar.into_inner()?;

        let work = tempfile::tempdir()?;
        let mut snapshots = Vec::new();
        for writers in [0, 1, 3] {
            let root = work.path().join(format!("w{writers}"));
            fs::create_dir(&root)?;
            let done = unpack_with(&stream[..], &root, UnpackOptions::default(), writers)
                .map_err(io::Error::other)?;
            snapshots.push((writers, done, snapshot(&root)?));
        }
        let (_, first_done, first) = &snapshots[0];
        assert!(
            first
                .iter()
                .any(|l| l.starts_with("d1/f3 600 ") && l.contains("115, 101, 99, 111, 110, 100"))
        );
        assert!(first.iter().any(|l| l.starts_with("d3 644 ")), "{first:#?}");
        assert!(
            first.iter().any(|l| l == "late/inner 755 dir 7"),
            "{first:#?}"
        );
        assert!(
            first.iter().any(|l| l.starts_with("d2/x 644 ")),
            "{first:#?}"
        );
        assert!(
            first.iter().any(|l| l.starts_with("d5/through 644 ")),
            "{first:#?}"
        );
        assert!(
            first
                .iter()
                .any(|l| l.starts_with("d6/second-link ") && l.contains("inode of d1/f3")),
            "{first:#?}"
        );
        for (writers, done, snap) in &snapshots[1..] {
            assert_eq!(done, first_done, "{writers} writers");
            assert!(
                snap == first,
                "{writers} writers:\n{snap:#?}\nvs one thread:\n{first:#?}"
            );
        }
        Ok(())
    }

    /// A writer's failure is the unpack's error, and nothing hangs.
    #[test]
    fn a_writers_failure_is_reported() -> io::Result<()> {
        let mut tar = tar::Builder::new(Vec::new());
        for f in 0..200 {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(1);
            tar.append_data(&mut h, format!("f{f}"), &b"x"[..])?;
        }
        let stream = tar.into_inner()?;
        let work = tempfile::tempdir()?;
        // A root that is not a directory: every file fails.
        let root = work.path().join("not-a-dir");
        fs::write(&root, "")?;
        let err = unpack_with(&stream[..], &root, UnpackOptions::default(), 2)
            .expect_err("a root that is a file");
        assert!(matches!(err, UnpackError::Create { .. }), "{err:?}");
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

    struct FailingRead;

    impl Read for FailingRead {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::other("corrupt frame"))
        }
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
}
