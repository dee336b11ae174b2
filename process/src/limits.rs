//! The open-file limit: raised to its hard limit at start, read by the
//! servers that size their connection caps from it.

use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit, setrlimit};

/// The open-file limit (`RLIMIT_NOFILE`) before and after [`raise_file_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimit {
    /// The soft limit found at start.
    pub was: u64,
    /// The soft limit in force now.
    pub now: u64,
}

/// Raises the soft limit on open files to the hard limit, so that a
/// service started with systemd's default (soft 1024, hard 524288) can hold
/// as many connections as its administrator allows. A hard limit of
/// "unlimited" (which Linux does not allow for open files) leaves the soft
/// limit as it is.
pub fn raise_file_limit() -> std::io::Result<FileLimit> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= hard || hard == RLIM_INFINITY {
        return Ok(FileLimit {
            was: soft,
            now: soft,
        });
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    Ok(FileLimit {
        was: soft,
        now: open_file_limit()?,
    })
}

/// The soft limit on open files in force now.
pub fn open_file_limit() -> std::io::Result<u64> {
    Ok(getrlimit(Resource::RLIMIT_NOFILE)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_reaches_the_hard_limit() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        // Lowered first (always allowed), so the raise has work to do.
        let low = hard.min(256);
        setrlimit(Resource::RLIMIT_NOFILE, low, hard).unwrap();
        assert_eq!(open_file_limit().unwrap(), low);
        let limit = raise_file_limit().unwrap();
        assert_eq!(limit.was, low);
        assert_eq!(limit.now, hard);
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (hard, hard));
        // Nothing left to raise.
        assert_eq!(
            raise_file_limit().unwrap(),
            FileLimit {
                was: hard,
                now: hard
            }
        );
    }
}
