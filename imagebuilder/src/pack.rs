//! Packs a root directory into `rootfs.tar.zst`.
//!
//! The archive is what the agent streams into a node's memory, so it must
//! carry everything a root filesystem needs and be the same bytes for the same
//! tree:
//!
//! - **Order.** A depth-first walk, each directory's entries sorted by the
//!   bytes of their names, parents before children; the root itself is the
//!   first entry, `./`.
//! - **Metadata.** Mode (setuid, setgid and sticky bits included), numeric
//!   owner and group (no user names: the image's `/etc/passwd` is the only
//!   authority), mtime in seconds.
//! - **Types.** Regular files, directories, symlinks, hard links (the first
//!   path in walk order holds the data, later ones link to it), character and
//!   block devices and FIFOs. Sockets cannot live in a tar archive (nor in GNU
//!   tar's); they are left out and counted in [`Packed::skipped`].
//! - **xattrs** (file capabilities, SELinux labels, `user.*`) as PAX
//!   `SCHILY.xattr.<name>` records, the convention GNU tar, bsdtar and the
//!   `tar` crate's reader share.
//! - **Sparse files** as GNU sparse entries, so a 1 GiB hole costs nothing.
//! - **Long names and link targets** through GNU long-name entries.
//! - **Mount points** inside the root are recorded as (empty) directories and
//!   not descended into, so a root with `/proc` or `/dev` mounted for the
//!   image-gen scripts packs cleanly.
//!
//! Why not the `tar` crate alone: its `Builder` writes headers, long names and
//! GNU sparse entries well (we use all three), but its directory walk follows
//! the file system's order, does not detect hard links, turns device nodes into
//! headers only through `append_path` with whatever metadata it chooses, and
//! 0.4.46 has no way to write PAX records. So the walk, the hard-link map, the
//! device and FIFO headers and the PAX xattr records are written here; regular
//! file data goes through `Builder::append_file` for its sparse support.
//!
//! Compression is zstd with the multithreaded encoder and a content checksum
//! in every frame; the compressed stream is hashed (SHA-256) as it is written,
//! so the file is read once.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{self, File, Metadata};
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tar::{EntryType, Header, HeaderMode};

use crate::progress;

/// The zstd level used unless told otherwise: fast to compress and to
/// decompress, within about 25 % of the best ratio on root file systems.
pub const DEFAULT_LEVEL: i32 = 3;

/// How to pack.
#[derive(Debug, Clone)]
pub struct PackOptions {
    /// zstd compression level (1..=19).
    pub level: i32,
    /// zstd worker threads; 0 compresses on the calling thread.
    pub threads: u32,
    /// Show a progress bar (only drawn when stderr is a terminal).
    pub progress: bool,
    /// Also report progress as lines (every tenth of the data packed).
    pub steps: Option<progress::Steps>,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            level: DEFAULT_LEVEL,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            progress: false,
            steps: None,
        }
    }
}

/// What [`pack`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// Size of the compressed file in bytes.
    pub size: u64,
    /// SHA-256 of the compressed file, lower-case hex.
    pub sha256: String,
    /// Size of the tar stream before compression.
    pub uncompressed_size: u64,
    /// Archive entries of every type, the root included.
    pub entries: u64,
    /// Paths left out because a tar archive cannot hold them (sockets).
    pub skipped: Vec<PathBuf>,
}

/// Why packing failed.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// The root is missing or not a directory.
    #[error("root {path} is not a directory")]
    NotADirectory {
        /// The root given.
        path: PathBuf,
    },
    /// Reading the tree failed.
    #[error("reading {path}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        err: io::Error,
    },
    /// Writing the archive failed.
    #[error("writing {path}")]
    Write {
        /// The archive.
        path: PathBuf,
        /// The cause.
        #[source]
        err: io::Error,
    },
}

/// One walked entry: its path inside the root and its metadata.
#[derive(Debug)]
struct Walked {
    rel: PathBuf,
    meta: Metadata,
}

/// Packs `root` into the zstd-compressed tar file `out` (created or
/// truncated).
pub fn pack(root: &Path, out: &Path, options: &PackOptions) -> Result<Packed, PackError> {
    let meta = fs::symlink_metadata(root).map_err(|err| match err.kind() {
        io::ErrorKind::NotFound => PackError::NotADirectory {
            path: root.to_path_buf(),
        },
        _ => PackError::Read {
            path: root.to_path_buf(),
            err,
        },
    })?;
    if !meta.is_dir() {
        return Err(PackError::NotADirectory {
            path: root.to_path_buf(),
        });
    }
    let mut walked = Vec::new();
    walk(root, Path::new(""), meta.dev(), &mut walked)?;
    let total: u64 = walked
        .iter()
        .filter(|w| w.meta.is_file())
        .map(|w| w.meta.len())
        .sum();

    let write_err = |err| PackError::Write {
        path: out.to_path_buf(),
        err,
    };
    let file = File::create(out).map_err(write_err)?;
    let hashed = HashWriter::new(BufWriter::with_capacity(1 << 20, file));
    let mut encoder = zstd::Encoder::new(hashed, options.level).map_err(write_err)?;
    encoder.include_checksum(true).map_err(write_err)?;
    if options.threads > 0 {
        encoder.multithread(options.threads).map_err(write_err)?;
    }
    let mut builder = tar::Builder::new(CountWriter {
        inner: encoder,
        count: 0,
    });
    builder.mode(HeaderMode::Complete);
    builder.follow_symlinks(false);
    builder.sparse(true);

    let bar = progress::bytes_bar(total, "packing", options.progress);
    let mut tenths = progress::Tenths::new(options.steps.as_ref(), "packing", total);
    let mut links: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let mut entries = 0;
    let mut skipped = Vec::new();
    for w in &walked {
        let full = root.join(&w.rel);
        let read_err = |err| PackError::Read {
            path: full.clone(),
            err,
        };
        let ft = w.meta.file_type();
        if ft.is_socket() {
            skipped.push(w.rel.clone());
            continue;
        }
        if !ft.is_dir() && w.meta.nlink() > 1 {
            let key = (w.meta.dev(), w.meta.ino());
            if let Some(first) = links.get(&key) {
                let mut header = header_from(&w.meta, EntryType::Link);
                builder
                    .append_link(&mut header, &w.rel, first)
                    .map_err(write_err)?;
                entries += 1;
                continue;
            }
            links.insert(key, w.rel.clone());
        }
        let xattrs = read_xattrs(&full).map_err(read_err)?;
        if !xattrs.is_empty() {
            append_pax(&mut builder, &xattrs).map_err(write_err)?;
        }
        if w.rel.as_os_str().is_empty() {
            // The root: `./`, which the tar crate's path setter refuses
            // (it drops `.` components and then has no name left).
            let mut header = header_from(&w.meta, EntryType::Directory);
            header.as_old_mut().name[..2].copy_from_slice(b"./");
            header.set_cksum();
            builder.append(&header, io::empty()).map_err(write_err)?;
        } else if ft.is_dir() {
            let mut header = header_from(&w.meta, EntryType::Directory);
            builder
                .append_data(&mut header, &w.rel, io::empty())
                .map_err(write_err)?;
        } else if ft.is_file() {
            let mut file = File::open(&full).map_err(read_err)?;
            // The metadata of the open file, so size and data agree even if
            // the file changed since the walk.
            builder
                .append_file(&w.rel, &mut file)
                .map_err(|err| classify(err, &full, out))?;
            bar.inc(w.meta.len());
            tenths.add(w.meta.len());
        } else if ft.is_symlink() {
            let target = fs::read_link(&full).map_err(read_err)?;
            let mut header = header_from(&w.meta, EntryType::Symlink);
            builder
                .append_link(&mut header, &w.rel, &target)
                .map_err(write_err)?;
        } else {
            let kind = if ft.is_char_device() {
                EntryType::Char
            } else if ft.is_block_device() {
                EntryType::Block
            } else {
                EntryType::Fifo
            };
            let mut header = header_from(&w.meta, kind);
            if kind != EntryType::Fifo {
                let (major, minor) = split_dev(w.meta.rdev());
                header.set_device_major(major).map_err(write_err)?;
                header.set_device_minor(minor).map_err(write_err)?;
            }
            builder
                .append_data(&mut header, &w.rel, io::empty())
                .map_err(write_err)?;
        }
        entries += 1;
    }
    bar.finish_and_clear();

    let counted = builder.into_inner().map_err(write_err)?;
    let uncompressed_size = counted.count;
    let hashed = counted.inner.finish().map_err(write_err)?;
    let (mut buffered, digest, size) = hashed.finish();
    buffered.flush().map_err(write_err)?;
    let file = buffered
        .into_inner()
        .map_err(|err| write_err(err.into_error()))?;
    file.sync_all().map_err(write_err)?;
    Ok(Packed {
        size,
        sha256: digest,
        uncompressed_size,
        entries,
        skipped,
    })
}

/// Walks `dir` (at `rel` inside the root) depth first, entries sorted by name
/// bytes, not descending into other file systems.
fn walk(dir: &Path, rel: &Path, root_dev: u64, out: &mut Vec<Walked>) -> Result<(), PackError> {
    let full = dir.join(rel);
    let read_err = |err| PackError::Read {
        path: full.clone(),
        err,
    };
    let meta = fs::symlink_metadata(&full).map_err(read_err)?;
    let descend = meta.is_dir() && meta.dev() == root_dev;
    out.push(Walked {
        rel: rel.to_path_buf(),
        meta,
    });
    if !descend {
        return Ok(());
    }
    let mut names: Vec<OsString> = fs::read_dir(&full)
        .map_err(read_err)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(read_err)?;
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in names {
        walk(dir, &rel.join(name), root_dev, out)?;
    }
    Ok(())
}

/// A GNU header with the entry's own metadata.
fn header_from(meta: &Metadata, kind: EntryType) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(meta.mode() & 0o7777);
    header.set_uid(u64::from(meta.uid()));
    header.set_gid(u64::from(meta.gid()));
    header.set_mtime(meta.mtime().max(0) as u64);
    header.set_size(0);
    header
}

/// Linux's `dev_t` split into major and minor (glibc's `gnu_dev_major` and
/// `gnu_dev_minor`).
fn split_dev(rdev: u64) -> (u32, u32) {
    let major = ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0x0000_0fff);
    let minor = ((rdev >> 12) & 0xffff_ff00) | (rdev & 0x0000_00ff);
    (major as u32, minor as u32)
}

/// The entry's xattrs (not following a symlink), sorted by name. A file
/// system without xattr support has none.
fn read_xattrs(path: &Path) -> io::Result<Vec<(OsString, Vec<u8>)>> {
    let names = match xattr::list(path) {
        Ok(names) => names,
        Err(err) if err.raw_os_error() == Some(nix::libc::ENOTSUP) => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let mut out = Vec::new();
    for name in names {
        if let Some(value) = xattr::get(path, &name)? {
            out.push((name, value));
        }
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(out)
}

/// Writes a PAX extended header (`x`) holding `SCHILY.xattr.*` records for the
/// entry that follows it.
fn append_pax<W: Write>(
    builder: &mut tar::Builder<W>,
    xattrs: &[(OsString, Vec<u8>)],
) -> io::Result<()> {
    let mut data = Vec::new();
    for (name, value) in xattrs {
        let mut key = b"SCHILY.xattr.".to_vec();
        key.extend_from_slice(name.as_bytes());
        pax_record(&mut data, &key, value);
    }
    let mut header = Header::new_ustar();
    header.set_entry_type(EntryType::XHeader);
    header.set_path("././@PaxHeader")?;
    header.set_mode(0o644);
    header.set_size(data.len() as u64);
    header.set_cksum();
    builder.append(&header, data.as_slice())
}

/// One PAX record, `"<len> <key>=<value>\n"`, where `len` counts the whole
/// record including its own digits.
fn pax_record(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let rest = 1 + key.len() + 1 + value.len() + 1;
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// `append_file` mixes read and write errors; a write error is ours to name
/// with the archive, anything else with the file read.
fn classify(err: io::Error, file: &Path, out: &Path) -> PackError {
    // The output side only fails with these on a full or broken disk; the
    // file side fails on anything else (vanished file, EIO on read).
    match err.raw_os_error() {
        Some(nix::libc::ENOSPC) | Some(nix::libc::EDQUOT) | Some(nix::libc::EPIPE) => {
            PackError::Write {
                path: out.to_path_buf(),
                err,
            }
        }
        _ => PackError::Read {
            path: file.to_path_buf(),
            err,
        },
    }
}

/// Counts the bytes written through it.
struct CountWriter<W> {
    inner: W,
    count: u64,
}

impl<W: Write> Write for CountWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Hashes and counts the bytes written through it.
struct HashWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> HashWriter<W> {
    fn new(inner: W) -> Self {
        HashWriter {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// The inner writer, the hex digest and the byte count.
    fn finish(self) -> (W, String, u64) {
        (self.inner, hex::encode(self.hasher.finalize()), self.count)
    }
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_record_length_counts_itself() {
        for (key, value, want) in [
            (&b"a"[..], &b"b"[..], &b"6 a=b\n"[..]),
            // 9 + one digit would be 10, which has two digits: 11.
            (b"abcd", b"xy", b"11 abcd=xy\n"),
        ] {
            let mut out = Vec::new();
            pax_record(&mut out, key, value);
            assert_eq!(out, want);
        }
    }

    #[test]
    fn split_dev_matches_linux_encoding() {
        // makedev(8, 1) for /dev/sda1 and a major/minor beyond 12/20 bits.
        assert_eq!(split_dev(nix::sys::stat::makedev(8, 1)), (8, 1));
        assert_eq!(
            split_dev(nix::sys::stat::makedev(0x1234, 0x56789)),
            (0x1234, 0x56789)
        );
    }

    #[test]
    fn missing_root_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = pack(
            &dir.path().join("nope"),
            &dir.path().join("out.tar.zst"),
            &PackOptions::default(),
        )
        .expect_err("missing root");
        assert!(matches!(err, PackError::NotADirectory { .. }), "{err:?}");
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
