//! A cpio `newc` writer: the format the Linux kernel unpacks into its initial
//! root file system (`Documentation/driver-api/early-userspace/buffer-format.rst`)
//! and that GNU cpio writes with `-H newc`.
//!
//! Each entry is a 110-byte ASCII header (the magic `070701` and thirteen
//! 8-digit hex fields), the NUL-terminated name padded to a multiple of four
//! bytes, then the data padded the same way. The archive ends with an entry
//! named `TRAILER!!!`.
//!
//! Why not a crate: the crates registry's cpio writers (`cpio`, `kpea`,
//! `librarium`) write one header at a time, and the format itself is the
//! easy part. What this module is for is the policy around it, which none of
//! them offers: a deterministic archive (entries sorted by name, inode numbers
//! given in that order, a fixed mtime unless one is given), parents created
//! implicitly, hard links written the `newc` way (one inode number, `nlink` on
//! every name, the data on the last name only), device nodes written as
//! headers so that no root is needed, and names checked before anything is
//! written. So the writer is ours, in a page of code.
//!
//! Nothing here needs privileges: device nodes, owners and modes are just
//! numbers in headers. The only I/O is reading the files an entry names (at
//! write time, streamed) and writing to the writer given.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::str::FromStr;

use thiserror::Error;

/// The longest name accepted, in bytes: the kernel's `PATH_MAX` less the NUL.
pub const NAME_MAX: usize = 4095;

/// The largest file `newc` can hold: its size field has 8 hex digits.
pub const FILE_SIZE_MAX: u64 = u32::MAX as u64;

/// The gzip level used by [`Compression::Gzip`] (the best, as `gzip -9`).
pub const GZIP_LEVEL: u32 = 9;

/// The zstd level used by [`Compression::Zstd`].
pub const ZSTD_LEVEL: i32 = 19;

/// The zstd worker threads. Fixed, not the machine's core count, so that the
/// same archive compresses to the same bytes on every machine.
pub const ZSTD_WORKERS: u32 = 2;

const MAGIC: &[u8] = b"070701";
const HEADER_LEN: usize = 110;
const TRAILER: &str = "TRAILER!!!";

const S_IFIFO: u32 = 0o010_000;
const S_IFCHR: u32 = 0o020_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFBLK: u32 = 0o060_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;

/// A device node's type and number (`major`, `minor`), for
/// [`Archive::device`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// A block device.
    Block(u32, u32),
    /// A character device.
    Char(u32, u32),
}

/// The permission and owner of an entry. The mtime defaults to the archive's
/// ([`Archive::with_mtime`], 0 unless set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// Permission bits, including setuid, setgid and sticky (at most `0o7777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time in seconds since the epoch; `None` for the archive's.
    pub mtime: Option<u32>,
}

impl Meta {
    /// Root-owned with these permission bits.
    pub const fn new(mode: u32) -> Self {
        Self {
            mode,
            uid: 0,
            gid: 0,
            mtime: None,
        }
    }

    /// The same with this owner and group.
    pub const fn owner(self, uid: u32, gid: u32) -> Self {
        Self { uid, gid, ..self }
    }

    /// The same with this modification time.
    pub const fn mtime(self, mtime: u32) -> Self {
        Self {
            mtime: Some(mtime),
            ..self
        }
    }
}

/// Where a regular file's data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contents {
    /// These bytes.
    Bytes(Vec<u8>),
    /// The file at this path, opened and streamed when the archive is written.
    Path(PathBuf),
}

impl From<Vec<u8>> for Contents {
    fn from(bytes: Vec<u8>) -> Self {
        Self::Bytes(bytes)
    }
}

impl From<&[u8]> for Contents {
    fn from(bytes: &[u8]) -> Self {
        Self::Bytes(bytes.to_vec())
    }
}

impl From<&str> for Contents {
    fn from(text: &str) -> Self {
        Self::Bytes(text.as_bytes().to_vec())
    }
}

impl From<PathBuf> for Contents {
    fn from(path: PathBuf) -> Self {
        Self::Path(path)
    }
}

/// How the archive is compressed. The kernel unpacks all three when built with
/// `CONFIG_RD_GZIP` and `CONFIG_RD_ZSTD`, as Debian's is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// gzip at [`GZIP_LEVEL`], with a zero mtime and no file name in its header.
    Gzip,
    /// None: the bare cpio archive.
    None,
    /// zstd at [`ZSTD_LEVEL`] on [`ZSTD_WORKERS`] threads, with a checksum.
    Zstd,
}

impl FromStr for Compression {
    type Err = UnknownCompression;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "gzip" | "gz" => Ok(Self::Gzip),
            "none" => Ok(Self::None),
            "zstd" | "zst" => Ok(Self::Zstd),
            _ => Err(UnknownCompression(s.to_owned())),
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Gzip => "gzip",
            Self::None => "none",
            Self::Zstd => "zstd",
        })
    }
}

/// A compression name that is none of `gzip`, `none`, `zstd`.
#[derive(Debug, Error)]
#[error("unknown compression {0:?}: use gzip, zstd or none")]
pub struct UnknownCompression(pub String);

/// Why an entry name was refused. Names are relative (`init`,
/// `lib/modules/x.ko`), like those `find .` gives without the `./`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    /// It starts with `/`.
    #[error("entry name {0:?} is absolute; names are relative to the archive's root")]
    Absolute(String),
    /// It is empty.
    #[error("entry name is empty")]
    Empty,
    /// It has an empty or `.` component (`a//b`, `./a`, `a/`).
    #[error("entry name {0:?} has an empty or `.` component")]
    EmptyComponent(String),
    /// It contains a NUL byte, which ends a name in a header.
    #[error("entry name {0:?} contains a NUL byte")]
    Nul(String),
    /// It has a `..` component, which would escape the archive's root.
    #[error("entry name {0:?} has a `..` component")]
    ParentComponent(String),
    /// It is longer than [`NAME_MAX`] bytes.
    #[error("entry name of {len} bytes is longer than {NAME_MAX}: {name:?}")]
    TooLong {
        /// The name.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
}

/// Why an entry could not be added.
#[derive(Debug, Error)]
pub enum EntryError {
    /// The name is already in the archive.
    #[error("{0:?} is already in the archive")]
    Duplicate(String),
    /// The mode has bits beyond the permission bits (the type comes from the
    /// entry kind).
    #[error("mode {mode:#o} of {name:?} has bits beyond 0o7777")]
    InvalidMode {
        /// The entry.
        name: String,
        /// The mode given.
        mode: u32,
    },
    /// The entry name, or a hard link's target name, is not acceptable.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A symlink's target is empty or holds a NUL byte.
    #[error("symlink {name:?} has an empty target or one with a NUL byte")]
    SymlinkTarget {
        /// The symlink.
        name: String,
    },
}

/// Why the archive could not be written.
#[derive(Debug, Error)]
pub enum WriteError {
    /// Compressing (or finishing the compressed stream) failed.
    #[error("compressing the archive with {compression}")]
    Compress {
        /// The compression.
        compression: Compression,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// A file is larger than `newc` can hold.
    #[error("{name:?} is {size} bytes, more than newc's {FILE_SIZE_MAX}")]
    FileTooLarge {
        /// The entry.
        name: String,
        /// Its size.
        size: u64,
    },
    /// A hard link's target is not a regular file entry of the archive.
    #[error("hard link {name:?} points to {target:?}, which is not a regular file in the archive")]
    LinkTarget {
        /// The hard link.
        name: String,
        /// What it points to.
        target: String,
    },
    /// An entry's parent is in the archive but is not a directory.
    #[error("{name:?} needs {parent:?} to be a directory, but it is not one")]
    NotADirectory {
        /// The entry.
        name: String,
        /// Its parent.
        parent: String,
    },
    /// Writing to the output failed.
    #[error("writing the archive")]
    Output(#[source] io::Error),
    /// A file given by path could not be opened, read or examined.
    #[error("reading {path} for {name:?}")]
    Source {
        /// The entry.
        name: String,
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// A file given by path changed size while it was written.
    #[error("{path} for {name:?} changed size while it was archived (expected {expected} bytes)")]
    SourceChanged {
        /// The entry.
        name: String,
        /// The file.
        path: PathBuf,
        /// The size it had when its header was written.
        expected: u64,
    },
    /// A path given as a file's contents is not a regular file.
    #[error("{path} for {name:?} is not a regular file")]
    SourceNotAFile {
        /// The entry.
        name: String,
        /// The path.
        path: PathBuf,
    },
}

/// The entries of a `newc` archive, written in name order by
/// [`Archive::write`].
#[derive(Debug, Clone, Default)]
pub struct Archive {
    entries: BTreeMap<String, Entry>,
    mtime: u32,
}

#[derive(Debug, Clone)]
struct Entry {
    kind: Kind,
    meta: Meta,
}

#[derive(Debug, Clone)]
enum Kind {
    Device(Device),
    Directory,
    Fifo,
    File(Contents),
    HardLink(String),
    Symlink(Vec<u8>),
}

/// What [`Archive::write`] writes for a parent nobody added.
const IMPLICIT_DIR: Entry = Entry {
    kind: Kind::Directory,
    meta: Meta::new(0o755),
};

impl Archive {
    /// An empty archive whose entries have mtime 0 unless given one.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same with this default mtime (e.g. from `SOURCE_DATE_EPOCH`).
    pub fn with_mtime(mut self, mtime: u32) -> Self {
        self.mtime = mtime;
        self
    }

    /// Adds a directory.
    pub fn dir(&mut self, name: &str, meta: Meta) -> Result<&mut Self, EntryError> {
        self.insert(name, Kind::Directory, meta)
    }

    /// Adds a regular file.
    pub fn file(
        &mut self,
        name: &str,
        contents: impl Into<Contents>,
        meta: Meta,
    ) -> Result<&mut Self, EntryError> {
        self.insert(name, Kind::File(contents.into()), meta)
    }

    /// Adds a symbolic link to `target` (which may be absolute: it is resolved
    /// on the unpacked system). Its permission bits are `0o777`.
    pub fn symlink(
        &mut self,
        name: &str,
        target: &str,
        owner: (u32, u32),
    ) -> Result<&mut Self, EntryError> {
        if target.is_empty() || target.contains('\0') {
            return Err(EntryError::SymlinkTarget {
                name: name.to_owned(),
            });
        }
        let meta = Meta::new(0o777).owner(owner.0, owner.1);
        self.insert(name, Kind::Symlink(target.as_bytes().to_vec()), meta)
    }

    /// Adds a hard link to the regular file `target`, which must be in the
    /// archive when it is written. It shares the target's inode, so its mode,
    /// owner and mtime.
    pub fn hard_link(&mut self, name: &str, target: &str) -> Result<&mut Self, EntryError> {
        check_name(target)?;
        self.insert(name, Kind::HardLink(target.to_owned()), Meta::new(0))
    }

    /// Adds a device node, character or block (written as a header: no
    /// root needed).
    pub fn device(
        &mut self,
        name: &str,
        device: Device,
        meta: Meta,
    ) -> Result<&mut Self, EntryError> {
        self.insert(name, Kind::Device(device), meta)
    }

    /// Adds a named pipe.
    pub fn fifo(&mut self, name: &str, meta: Meta) -> Result<&mut Self, EntryError> {
        self.insert(name, Kind::Fifo, meta)
    }

    /// Whether an entry of this name was added (implicit parents are not).
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    fn insert(&mut self, name: &str, kind: Kind, meta: Meta) -> Result<&mut Self, EntryError> {
        check_name(name)?;
        if meta.mode & !0o7777 != 0 {
            return Err(EntryError::InvalidMode {
                name: name.to_owned(),
                mode: meta.mode,
            });
        }
        if self.entries.contains_key(name) {
            return Err(EntryError::Duplicate(name.to_owned()));
        }
        self.entries.insert(name.to_owned(), Entry { kind, meta });
        Ok(self)
    }

    /// Writes the archive, compressed, into `out` and returns it.
    pub fn write_compressed<W: Write>(
        &self,
        out: W,
        compression: Compression,
    ) -> Result<W, WriteError> {
        let compress = |source| WriteError::Compress {
            compression,
            source,
        };
        match compression {
            Compression::None => self.write(out),
            Compression::Gzip => {
                let encoder = flate2::GzBuilder::new()
                    .mtime(0)
                    .write(out, flate2::Compression::new(GZIP_LEVEL));
                self.write(encoder)?.finish().map_err(compress)
            }
            Compression::Zstd => {
                let mut encoder =
                    zstd::stream::write::Encoder::new(out, ZSTD_LEVEL).map_err(compress)?;
                encoder.include_checksum(true).map_err(compress)?;
                encoder.multithread(ZSTD_WORKERS).map_err(compress)?;
                self.write(encoder)?.finish().map_err(compress)
            }
        }
    }

    /// The archive's bytes, compressed.
    pub fn to_bytes(&self, compression: Compression) -> Result<Vec<u8>, WriteError> {
        self.write_compressed(Vec::new(), compression)
    }

    /// Writes the bare archive into `out` and returns it: every entry in name
    /// order (so parents first), each missing parent as a root-owned `0755`
    /// directory, then the trailer.
    pub fn write<W: Write>(&self, out: W) -> Result<W, WriteError> {
        let implicit = IMPLICIT_DIR;
        let mut all: BTreeMap<&str, &Entry> =
            self.entries.iter().map(|(n, e)| (n.as_str(), e)).collect();
        for name in self.entries.keys() {
            for parent in ancestors(name) {
                all.entry(parent).or_insert(&implicit);
            }
        }

        // Parents are directories; count subdirectories for each `nlink`.
        let mut subdirs: HashMap<&str, u32> = HashMap::new();
        for (name, entry) in &all {
            if let Some(parent) = ancestors(name).last() {
                let Some(p) = all.get(parent) else { continue };
                if !matches!(p.kind, Kind::Directory) {
                    return Err(WriteError::NotADirectory {
                        name: (*name).to_owned(),
                        parent: parent.to_owned(),
                    });
                }
                if matches!(entry.kind, Kind::Directory) {
                    *subdirs.entry(parent).or_default() += 1;
                }
            }
        }

        // Hard link groups, keyed by the target file: every name, in order.
        let mut groups: HashMap<&str, Vec<&str>> = HashMap::new();
        for (name, entry) in &all {
            if let Kind::HardLink(target) = &entry.kind {
                match all.get(target.as_str()) {
                    Some(Entry {
                        kind: Kind::File(_),
                        ..
                    }) => groups.entry(target.as_str()).or_default().push(name),
                    _ => {
                        return Err(WriteError::LinkTarget {
                            name: (*name).to_owned(),
                            target: target.clone(),
                        });
                    }
                }
            }
        }
        for (target, names) in &mut groups {
            names.push(target);
            names.sort_unstable();
        }

        let mut w = Counting {
            inner: out,
            count: 0,
        };
        let mut next_ino = 1u32;
        let mut group_ino: HashMap<&str, u32> = HashMap::new();
        for (name, entry) in &all {
            // A hard link is written with its target's inode and metadata.
            let (target, group) = match &entry.kind {
                Kind::HardLink(t) => (t.as_str(), groups.get(t.as_str())),
                Kind::File(_) => (*name, groups.get(name)),
                _ => (*name, None),
            };
            let ino = match group {
                Some(_) => *group_ino.entry(target).or_insert_with(|| {
                    next_ino += 1;
                    next_ino - 1
                }),
                None => {
                    next_ino += 1;
                    next_ino - 1
                }
            };
            let (entry, nlink) = match group {
                Some(names) => (all[target], names.len() as u32),
                None if matches!(entry.kind, Kind::Directory) => {
                    (*entry, 2 + subdirs.get(name).copied().unwrap_or(0))
                }
                None => (*entry, 1),
            };
            let carries_data = group.is_none_or(|names| names.last() == Some(name));
            let mtime = entry.meta.mtime.unwrap_or(self.mtime);
            let mut header = Header {
                ino,
                mode: entry.meta.mode,
                uid: entry.meta.uid,
                gid: entry.meta.gid,
                nlink,
                mtime,
                filesize: 0,
                rdev: (0, 0),
            };
            match &entry.kind {
                Kind::Device(device) => {
                    let (type_bits, rdev) = match *device {
                        Device::Block(major, minor) => (S_IFBLK, (major, minor)),
                        Device::Char(major, minor) => (S_IFCHR, (major, minor)),
                    };
                    header.mode |= type_bits;
                    header.rdev = rdev;
                    header.write(&mut w, name)?;
                }
                Kind::Directory => {
                    header.mode |= S_IFDIR;
                    header.write(&mut w, name)?;
                }
                Kind::Fifo => {
                    header.mode |= S_IFIFO;
                    header.write(&mut w, name)?;
                }
                Kind::Symlink(link) => {
                    header.mode |= S_IFLNK;
                    header.filesize = link.len() as u32;
                    header.write(&mut w, name)?;
                    w.write_all(link).map_err(WriteError::Output)?;
                    w.pad()?;
                }
                Kind::File(contents) => {
                    header.mode |= S_IFREG;
                    if !carries_data {
                        header.write(&mut w, name)?;
                    } else {
                        write_file(&mut w, header, name, contents)?;
                    }
                }
                // `entry` is the group's target, a file (checked above).
                Kind::HardLink(_) => {}
            }
        }
        let trailer = Header {
            ino: 0,
            mode: 0,
            uid: 0,
            gid: 0,
            nlink: 1,
            mtime: 0,
            filesize: 0,
            rdev: (0, 0),
        };
        trailer.write(&mut w, TRAILER)?;
        w.inner.flush().map_err(WriteError::Output)?;
        Ok(w.inner)
    }
}

/// Checks that `name` is a normal relative path of acceptable length.
fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.contains('\0') {
        return Err(NameError::Nul(name.to_owned()));
    }
    if name.len() > NAME_MAX {
        return Err(NameError::TooLong {
            name: name.to_owned(),
            len: name.len(),
        });
    }
    if name.starts_with('/') {
        return Err(NameError::Absolute(name.to_owned()));
    }
    for component in name.split('/') {
        match component {
            ".." => return Err(NameError::ParentComponent(name.to_owned())),
            "" | "." => return Err(NameError::EmptyComponent(name.to_owned())),
            _ => {}
        }
    }
    Ok(())
}

/// `a`, `a/b` for `a/b/c`: every proper ancestor, outermost first.
fn ancestors(name: &str) -> impl Iterator<Item = &str> {
    name.match_indices('/').map(move |(i, _)| &name[..i])
}

fn write_file<W: Write>(
    w: &mut Counting<W>,
    mut header: Header,
    name: &str,
    contents: &Contents,
) -> Result<(), WriteError> {
    let too_large = |size| WriteError::FileTooLarge {
        name: name.to_owned(),
        size,
    };
    match contents {
        Contents::Bytes(bytes) => {
            let size = bytes.len() as u64;
            header.filesize = u32::try_from(size).map_err(|_| too_large(size))?;
            header.write(w, name)?;
            w.write_all(bytes).map_err(WriteError::Output)?;
        }
        Contents::Path(path) => {
            let source = |source| WriteError::Source {
                name: name.to_owned(),
                path: path.clone(),
                source,
            };
            let file = File::open(path).map_err(source)?;
            let metadata = file.metadata().map_err(source)?;
            if !metadata.is_file() {
                return Err(WriteError::SourceNotAFile {
                    name: name.to_owned(),
                    path: path.clone(),
                });
            }
            let size = metadata.len();
            header.filesize = u32::try_from(size).map_err(|_| too_large(size))?;
            header.write(w, name)?;
            let mut reader = file.take(size);
            let mut buf = vec![0u8; 64 * 1024];
            let mut copied = 0u64;
            loop {
                let n = match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(source(e)),
                };
                w.write_all(&buf[..n]).map_err(WriteError::Output)?;
                copied += n as u64;
            }
            let mut file = reader.into_inner();
            let grew = file.read(&mut [0u8; 1]).map_err(source)? != 0;
            if copied != size || grew {
                return Err(WriteError::SourceChanged {
                    name: name.to_owned(),
                    path: path.clone(),
                    expected: size,
                });
            }
        }
    }
    w.pad()
}

/// The fields of a header that vary; `dev` and `check` are always 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    ino: u32,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    mtime: u32,
    filesize: u32,
    rdev: (u32, u32),
}

impl Header {
    /// Writes the header and the padded name.
    fn write<W: Write>(&self, w: &mut Counting<W>, name: &str) -> Result<(), WriteError> {
        let mut buf = Vec::with_capacity(HEADER_LEN + name.len() + 4);
        buf.extend_from_slice(MAGIC);
        let namesize = name.len() as u32 + 1;
        for field in [
            self.ino,
            self.mode,
            self.uid,
            self.gid,
            self.nlink,
            self.mtime,
            self.filesize,
            0, // devmajor
            0, // devminor
            self.rdev.0,
            self.rdev.1,
            namesize,
            0, // check
        ] {
            buf.extend_from_slice(format!("{field:08X}").as_bytes());
        }
        buf.extend_from_slice(name.as_bytes());
        buf.push(0);
        w.write_all(&buf).map_err(WriteError::Output)?;
        w.pad()
    }
}

/// A writer that knows its offset, for the 4-byte alignment.
struct Counting<W> {
    inner: W,
    count: u64,
}

impl<W: Write> Counting<W> {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.inner.write_all(buf)?;
        self.count += buf.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> Result<(), WriteError> {
        let pad = (4 - (self.count % 4) as usize) % 4;
        self.write_all(&[0u8; 3][..pad]).map_err(WriteError::Output)
    }
}

#[cfg(test)]
mod tests;
