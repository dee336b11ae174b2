//! A small ext4 file system on a loop device, for tests that must fill a
//! disk: `truncate`, `mkfs.ext4`, `mount -o loop`, unmounted and removed on
//! drop. Needs root and e2fsprogs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Result;

/// A mounted loop file system; unmounted on drop.
#[derive(Debug)]
pub struct LoopFs {
    // Field order: the mount point is unmounted (Drop) before the folder
    // holding the backing file goes.
    mount: PathBuf,
    dir: tempfile::TempDir,
}

/// `len` bytes no compressor shrinks (xorshift64*, seeded by `seed`): what
/// fills a [`LoopFs`] for real.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

impl LoopFs {
    /// An empty ext4 file system of `mib` MiB, mounted in a new temporary
    /// folder.
    pub fn new(mib: u64) -> Result<LoopFs> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("fs.img");
        std::fs::File::create(&file)?.set_len(mib << 20)?;
        crate::lab::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&file))?;
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount)?;
        crate::lab::run(
            Command::new("mount")
                .args(["-o", "loop"])
                .arg(&file)
                .arg(&mount),
        )?;
        Ok(LoopFs { mount, dir })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mount
    }

    /// Bytes free for an unprivileged writer (`df`'s "Avail").
    pub fn available(&self) -> Result<u64> {
        let s = nix::sys::statvfs::statvfs(&self.mount)?;
        Ok(s.blocks_available() * s.fragment_size())
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        // `-d` frees the loop device too.
        let status = Command::new("umount")
            .arg("-d")
            .arg(&self.mount)
            .stdin(Stdio::null())
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!(
                "warning: could not unmount {} (backing file in {})",
                self.mount.display(),
                self.dir.path().display()
            );
        }
    }
}
