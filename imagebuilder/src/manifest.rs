//! `manifest.json`: what a built image version holds, and checking an image
//! against it.
//!
//! The job servers and the agent trust an image only as far as its manifest:
//! every artefact is listed with its size and SHA-256, so a node can verify
//! the stream it unpacks and a job server what it syncs. Verification here
//! goes further and decompresses `rootfs.tar.zst` (zstd checks each frame's
//! content checksum), reading the whole tar stream to compare the
//! uncompressed size and the entry count.

use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The manifest's file name in a version folder.
pub const MANIFEST: &str = "manifest.json";
/// The root archive's file name.
pub const ROOTFS: &str = "rootfs.tar.zst";
/// The kernel's file name.
pub const KERNEL: &str = "vmlinuz";
/// The agent initramfs's file name (`mprov_api::boot::ImageFile::Initramfs`).
pub const INITRAMFS: &str = "initramfs.img";
/// The manifest format written by this version.
pub const FORMAT: u32 = 1;

/// An image version's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The manifest format.
    pub format: u32,
    /// The image's slug.
    pub slug: String,
    /// The version number.
    pub version: u64,
    /// When it was built, RFC 3339 in UTC.
    pub created: String,
    /// Where the root came from (e.g. `dir:/srv/root`).
    pub source: String,
    /// The kernel's release (`uname -r`), when the image has a kernel.
    pub kernel_version: Option<String>,
    /// The tar stream's size before compression.
    pub uncompressed_size: u64,
    /// Entries in the root archive, of every type.
    pub file_count: u64,
    /// Every file of the version besides the manifest.
    pub artifacts: Vec<Artifact>,
}

/// One file of an image version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    /// Its file name in the version folder.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, lower-case hex.
    pub sha256: String,
}

/// Why reading a manifest or verifying an image failed.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The image does not match its manifest.
    #[error("{} does not match its manifest:\n  {}", dir.display(), problems.join("\n  "))]
    Mismatch {
        /// The version folder.
        dir: PathBuf,
        /// Each difference found.
        problems: Vec<String>,
    },
    /// The manifest is missing or malformed.
    #[error("reading {path}")]
    Read {
        /// The manifest.
        path: PathBuf,
        /// The cause.
        #[source]
        err: io::Error,
    },
}

impl Manifest {
    /// Reads `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest, VerifyError> {
        let path = dir.join(MANIFEST);
        let read_err = |err| VerifyError::Read {
            path: path.clone(),
            err,
        };
        let bytes = fs::read(&path).map_err(read_err)?;
        Self::from_slice(&bytes).map_err(read_err)
    }

    /// Parses a manifest.
    pub fn from_slice(bytes: &[u8]) -> io::Result<Manifest> {
        let manifest: Manifest = serde_json::from_slice(bytes)?;
        if manifest.format != FORMAT {
            return Err(io::Error::other(format!(
                "manifest format {} is not {FORMAT}",
                manifest.format
            )));
        }
        Ok(manifest)
    }

    /// The manifest as pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        // A struct of strings and numbers always serializes.
        let mut out = serde_json::to_string_pretty(self).unwrap_or_default();
        out.push('\n');
        out
    }

    /// The artefact called `name`.
    pub fn artifact(&self, name: &str) -> Option<&Artifact> {
        self.artifacts.iter().find(|a| a.name == name)
    }
}

/// Size and SHA-256 of a file.
pub fn hash_file(path: &Path) -> io::Result<(u64, String)> {
    let mut reader = BufReader::with_capacity(1 << 20, File::open(path)?);
    let mut hasher = Sha256::new();
    let mut buf = vec![0; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// Checks the version folder `dir` against its manifest: every artefact's
/// size and SHA-256, and the root archive's content (zstd checksums, the tar
/// stream's size and entry count). Returns the manifest when all match.
pub fn verify(dir: &Path) -> Result<Manifest, VerifyError> {
    let manifest = Manifest::read(dir)?;
    let mut problems = Vec::new();
    for artifact in &manifest.artifacts {
        let name = &artifact.name;
        if name.contains('/') || name == ".." || name == "." || name.is_empty() {
            problems.push(format!("{name:?} is not a file name"));
            continue;
        }
        match hash_file(&dir.join(name)) {
            Err(err) => problems.push(format!("{name}: {err}")),
            Ok((size, sha256)) => {
                if size != artifact.size {
                    problems.push(format!(
                        "{name}: size {size}, manifest says {}",
                        artifact.size
                    ));
                }
                if sha256 != artifact.sha256 {
                    problems.push(format!(
                        "{name}: sha256 {sha256}, manifest says {}",
                        artifact.sha256
                    ));
                }
            }
        }
    }
    match manifest.artifact(ROOTFS) {
        None => problems.push(format!("no {ROOTFS} in the manifest")),
        Some(_) => match count_tar(&dir.join(ROOTFS)) {
            Err(err) => problems.push(format!("{ROOTFS}: {err}")),
            Ok((size, entries)) => {
                if size != manifest.uncompressed_size {
                    problems.push(format!(
                        "{ROOTFS}: uncompressed size {size}, manifest says {}",
                        manifest.uncompressed_size
                    ));
                }
                if entries != manifest.file_count {
                    problems.push(format!(
                        "{ROOTFS}: {entries} entries, manifest says {}",
                        manifest.file_count
                    ));
                }
            }
        },
    }
    if problems.is_empty() {
        Ok(manifest)
    } else {
        Err(VerifyError::Mismatch {
            dir: dir.to_path_buf(),
            problems,
        })
    }
}

/// The decompressed size of a `.tar.zst` (to its end, padding included) and
/// its number of entries.
fn count_tar(path: &Path) -> io::Result<(u64, u64)> {
    let decoder = zstd::Decoder::new(File::open(path)?)?;
    let mut counted = CountReader {
        inner: decoder,
        count: 0,
    };
    let mut entries = 0;
    {
        let mut archive = tar::Archive::new(&mut counted);
        for entry in archive.entries()? {
            let mut entry = entry?;
            io::copy(&mut entry, &mut io::sink())?;
            entries += 1;
        }
    }
    io::copy(&mut counted, &mut io::sink())?;
    Ok((counted.count, entries))
}

struct CountReader<R> {
    inner: R,
    count: u64,
}

impl<R: Read> Read for CountReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}
