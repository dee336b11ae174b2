//! The pseudo filesystems PID 1 mounts before anything else.
//!
//! The kernel unpacks the initramfs into a bare rootfs and mounts nothing on
//! it (devtmpfs is mounted automatically only on a disk root), so `/proc`,
//! `/sys` and `/dev` are empty until we mount them. "Already mounted" (EBUSY)
//! is fine: a second run, or a kernel that did it, is not an error.

use std::fmt;

use nix::errno::Errno;
use nix::mount::{MsFlags, mount};
use thiserror::Error;

/// One mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mount {
    /// The file system type, also used as the source's name.
    pub fstype: &'static str,
    /// The mount point.
    pub target: &'static str,
    /// Mount flags.
    pub flags: MsFlags,
    /// File system options.
    pub data: &'static str,
}

impl fmt::Display for Mount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}", self.fstype, self.target)
    }
}

/// What PID 1 mounts, in order.
pub const MOUNTS: [Mount; 5] = [
    Mount {
        fstype: "proc",
        target: "/proc",
        flags: MsFlags::MS_NOSUID
            .union(MsFlags::MS_NODEV)
            .union(MsFlags::MS_NOEXEC),
        data: "",
    },
    Mount {
        fstype: "sysfs",
        target: "/sys",
        flags: MsFlags::MS_NOSUID
            .union(MsFlags::MS_NODEV)
            .union(MsFlags::MS_NOEXEC),
        data: "",
    },
    Mount {
        fstype: "devtmpfs",
        target: "/dev",
        flags: MsFlags::MS_NOSUID,
        data: "mode=0755",
    },
    Mount {
        fstype: "tmpfs",
        target: "/run",
        flags: MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV),
        data: "mode=0755",
    },
    Mount {
        fstype: "tmpfs",
        target: "/tmp",
        flags: MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV),
        data: "mode=1777",
    },
];

/// Why a mount failed.
#[derive(Debug, Error)]
pub enum MountError {
    /// The mount point could not be made.
    #[error("making the mount point")]
    MountPoint(#[source] std::io::Error),
    /// mount(2) failed.
    #[error("mount(2)")]
    Mount(#[source] Errno),
}

/// Mounts [`MOUNTS`] in order, going on after a failure.
pub fn mount_all() -> Vec<(Mount, Result<(), MountError>)> {
    MOUNTS.into_iter().map(|m| (m, mount_one(&m))).collect()
}

fn mount_one(m: &Mount) -> Result<(), MountError> {
    match std::fs::create_dir(m.target) {
        Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(MountError::MountPoint(err));
        }
        _ => {}
    }
    let data = (!m.data.is_empty()).then_some(m.data);
    match mount(Some(m.fstype), m.target, Some(m.fstype), m.flags, data) {
        Ok(()) | Err(Errno::EBUSY) => Ok(()),
        Err(errno) => Err(MountError::Mount(errno)),
    }
}
