//! Writing regular files' data. Small files (up to [`JOB_MAX`] bytes) go, a
//! batch at a time, to a few writer threads ([`Writers`]) while the reading
//! thread reads on; larger and sparse ones are streamed in place by the
//! reading thread ([`copy_data`], [`copy_sparse`]). The entry loop
//! (`lib.rs`) decides every path before a file is handed on, and waits for
//! the writers ([`drain`]) before it removes anything, links to a file, or
//! touches a name one of them may still be writing.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use crate::confine::create_file;
use crate::meta::FileMeta;
use crate::{UnpackError, create_err};

/// Writer threads at most.
pub const MAX_WRITERS: usize = 4;
/// The largest file handed to a writer (bigger ones are written in place,
/// streamed, so memory stays bounded: the queue holds a few batches of
/// about a MiB per writer).
pub const JOB_MAX: u64 = 1024 * 1024;

/// Waits for the writers, if any, to finish what they were given.
pub(crate) fn drain(pool: Option<&Writers>) {
    if let Some(writers) = pool {
        writers.drain();
    }
}

/// A regular file for a writer thread: its data is a range of its batch's
/// buffer.
#[derive(Debug)]
struct FileJob {
    /// Where it goes (its parent already resolved).
    dest: PathBuf,
    /// Its content in [`Batch::data`].
    at: std::ops::Range<usize>,
    /// Its metadata.
    meta: FileMeta,
}

impl FileJob {
    fn write(&self, data: &[u8]) -> Result<(), UnpackError> {
        let c = |err| create_err(self.dest.clone(), err);
        let mut file = create_file(&self.dest, self.meta.born_mode()).map_err(c)?;
        let data = data
            .get(self.at.clone())
            .ok_or_else(|| c(io::Error::other("a file's data outside its batch")))?;
        file.write_all(data).map_err(c)?;
        self.meta.apply(&file).map_err(c)
    }
}

/// Files for the writers, their data back to back in one buffer.
#[derive(Debug, Default)]
struct Batch {
    /// The files' data. Its length is how much of it was ever written to:
    /// a buffer comes back from the writers to be filled again, so only
    /// its first use pays for initializing (and faulting in) its memory.
    data: Vec<u8>,
    /// The bytes of `data` the files use.
    used: usize,
    jobs: Vec<FileJob>,
}

/// The writer threads' shared state: the batch being filled, a bounded
/// queue of batches, how many batches are not yet written, the buffers
/// written batches gave back, and the first error.
///
/// Files go to the writers in batches ([`Writers::BATCH_FILES`] files or
/// [`Writers::BATCH_BYTES`] of data, whichever comes first), not one by one:
/// most files of a root are a few KiB, and handing each over on its own
/// cost a wake-up and a context switch per file, more CPU than writing it.
/// A batch's files share one buffer, used again and again: a fresh
/// allocation per file cost a page fault per new page (with transparent
/// huge pages, 2 MiB cleared at a time) and a `memset` of its size, 7% of
/// an agent's stream in `perf record` (tests/bench/RESULTS.md, "agent").
#[derive(Debug)]
pub(crate) struct Writers {
    batch: std::sync::Mutex<Batch>,
    queue: std::sync::Mutex<Option<std::sync::mpsc::SyncSender<Batch>>>,
    jobs: std::sync::Mutex<std::sync::mpsc::Receiver<Batch>>,
    pending: std::sync::Mutex<usize>,
    idle: std::sync::Condvar,
    spares: std::sync::Mutex<Vec<Vec<u8>>>,
    error: std::sync::Mutex<Option<UnpackError>>,
    failed: std::sync::atomic::AtomicBool,
}

impl Writers {
    /// Batches queued per writer at most (each holds up to about
    /// [`Writers::BATCH_BYTES`] + [`JOB_MAX`] of data).
    const DEPTH: usize = 4;
    /// Files in a batch at most.
    const BATCH_FILES: usize = 64;
    /// A batch is handed on once it holds this much data.
    const BATCH_BYTES: usize = 1024 * 1024;
    /// The most a batch's buffer holds: a file of up to [`JOB_MAX`] added
    /// to a batch just short of [`Writers::BATCH_BYTES`].
    const BATCH_CAPACITY: usize = Self::BATCH_BYTES + JOB_MAX as usize;

    pub(crate) fn new(writers: usize) -> Writers {
        let (tx, rx) = std::sync::mpsc::sync_channel(Self::DEPTH * writers);
        Writers {
            batch: std::sync::Mutex::new(Batch::default()),
            queue: std::sync::Mutex::new(Some(tx)),
            jobs: std::sync::Mutex::new(rx),
            pending: std::sync::Mutex::new(0),
            idle: std::sync::Condvar::new(),
            spares: std::sync::Mutex::new(Vec::new()),
            error: std::sync::Mutex::new(None),
            failed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        mutex.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a writer failed (its error is kept for [`Writers::take_error`]).
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Adds a file of `size` bytes (at most [`JOB_MAX`]) to the batch, its
    /// data put in place by `fill`, and hands the batch on once it is full
    /// (waiting while the queue is full). When `fill` fails, the file is
    /// not added.
    pub(crate) fn send(
        &self,
        dest: PathBuf,
        meta: FileMeta,
        size: usize,
        fill: impl FnOnce(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let full = {
            let mut batch = Self::lock(&self.batch);
            if batch.data.capacity() == 0 {
                batch.data = Self::lock(&self.spares)
                    .pop()
                    .unwrap_or_else(|| Vec::with_capacity(Self::BATCH_CAPACITY));
            }
            let start = batch.used;
            let end = start + size;
            if batch.data.len() < end {
                batch.data.resize(end, 0);
            }
            fill(&mut batch.data[start..end])?;
            batch.used = end;
            batch.jobs.push(FileJob {
                dest,
                at: start..end,
                meta,
            });
            (batch.jobs.len() >= Self::BATCH_FILES || batch.used >= Self::BATCH_BYTES)
                .then(|| std::mem::take(&mut *batch))
        };
        if let Some(batch) = full {
            self.queue_batch(batch);
        }
        Ok(())
    }

    /// Hands on the batch being filled, if it holds anything.
    fn flush(&self) {
        let batch = {
            let mut batch = Self::lock(&self.batch);
            if batch.jobs.is_empty() {
                return;
            }
            std::mem::take(&mut *batch)
        };
        self.queue_batch(batch);
    }

    fn queue_batch(&self, batch: Batch) {
        *Self::lock(&self.pending) += 1;
        let sent = Self::lock(&self.queue)
            .as_ref()
            .map(|tx| tx.clone())
            .map(|tx| tx.send(batch));
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
    pub(crate) fn drain(&self) {
        self.flush();
        let mut pending = Self::lock(&self.pending);
        while *pending > 0 {
            pending = self.idle.wait(pending).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The unpack failed: queued files are dropped unwritten.
    pub(crate) fn abandon(&self) {
        self.failed
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// No more files: the writers stop once the queue is empty.
    pub(crate) fn close(&self) {
        self.flush();
        Self::lock(&self.queue).take();
    }

    pub(crate) fn take_error(&self) -> Option<UnpackError> {
        Self::lock(&self.error).take()
    }

    /// A writer thread's loop: writes queued batches until the queue
    /// closes, and gives each batch's buffer back. After a failure the rest
    /// are dropped unwritten.
    pub(crate) fn work(&self) {
        loop {
            let batch = Self::lock(&self.jobs).recv();
            let Ok(batch) = batch else {
                return;
            };
            for job in &batch.jobs {
                if self.failed() {
                    break;
                }
                if let Err(err) = job.write(&batch.data) {
                    Self::lock(&self.error).get_or_insert(err);
                    self.failed
                        .store(true, std::sync::atomic::Ordering::Release);
                }
            }
            // No more buffers than batches ever were at once: the queue's,
            // the one being filled and the writers'.
            Self::lock(&self.spares).push(batch.data);
            self.finished();
        }
    }
}

/// Copies a sparse entry's data, seeking over zero blocks so holes stay holes.
pub(crate) fn copy_sparse<R: Read>(from: &mut R, to: &mut File) -> io::Result<()> {
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
pub(crate) const COPY_BUF: usize = 256 * 1024;

/// Copies an entry's data to `to` through `buf`, writing only full buffers
/// (and the rest at the end).
pub(crate) fn copy_data<R: Read>(from: &mut R, to: &mut File, buf: &mut [u8]) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::fs;
    use std::path::Path;

    use tar::EntryType;

    use super::*;
    use crate::{UnpackOptions, unpack_with};

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
}
