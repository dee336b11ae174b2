//! Dropping root: the signing helper and the web service each run as their
//! own system user once they hold what only root may open (the CA key for the
//! helper; the listening sockets, the HTTPS key and the folders for the web
//! service).
//!
//! The hand-over of files is written so that the service user cannot turn it
//! against root:
//! - no link is ever followed: every file is opened with `O_NOFOLLOW`, checked
//!   to be a regular file or a folder, and changed through that descriptor
//!   (`fchown`, `fchmod`), so a link planted by the service user is skipped
//!   and a file swapped in between check and change is never the one changed;
//! - a regular file handed to the service user must have one link and belong
//!   to root or that user already: a hard link is the file it links to, so a
//!   root-owned file hard-linked into the database's folder (the service user
//!   can make one where `fs.protected_hardlinks` is 0) would otherwise be
//!   handed over; such a file stops the start, checked on the descriptor
//!   that is then changed ([`handover_problem`]);
//! - the config folder, the state folder and the TLS folder stay root's; the
//!   service user gets only the SQLite database's own folder (`state/db/` by
//!   default), which must not hold or be above any of the others;
//! - a folder the service user must reach is checked before the switch, and a
//!   parent it cannot enter (root's 0700 home, say) stops the start with the
//!   folder named and what to do.

use std::fs::{self, DirBuilder, File, Metadata, OpenOptions};
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

use nix::sys::stat::{Mode, fchmod};
use nix::unistd::{Gid, Uid, User, fchown, setgid, setgroups, setuid};

/// Where `useradd` is looked for: `serve` may start with an empty `PATH`.
const USERADD: &[&str] = &["/usr/sbin/useradd", "/sbin/useradd", "/usr/bin/useradd"];

/// Switching users failed.
#[derive(Debug, thiserror::Error)]
pub enum PrivError {
    /// The user cannot be looked up or made.
    #[error("system user {name}: {reason}")]
    User {
        /// The user.
        name: String,
        /// Why.
        reason: String,
    },
    /// The user database cannot be read, or useradd cannot be run.
    #[error("system user {name}: {what}")]
    UserIo {
        /// The user.
        name: String,
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        err: std::io::Error,
    },
    /// A folder or file cannot be given its owner or mode.
    #[error("cannot set the owner or mode of {}", path.display())]
    Chown {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        err: std::io::Error,
    },
    /// A folder the service needs is a link, or not a folder.
    #[error(
        "{} is {what}; mProv never follows links in its folders: replace it with a real folder (owned by root, mode 0700)",
        path.display()
    )]
    NotAFolder {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        what: &'static str,
    },
    /// The service user cannot enter a folder above its database.
    #[error(
        "the service user {user} cannot reach {}: {} (mode {mode:04o}, owner uid {owner}) does not let it pass. Keep the state folder outside {} (e.g. MPROV_STATE_DIR=/var/lib/mprov), or let it pass with `chmod o+x {}`",
        target.display(), blocker.display(), blocker.display(), blocker.display()
    )]
    Unreachable {
        /// The user.
        user: String,
        /// What it must reach.
        target: PathBuf,
        /// The folder in the way.
        blocker: PathBuf,
        /// Its mode.
        mode: u32,
        /// Its owner.
        owner: u32,
    },
    /// The SQLite database's folder would give the service user too much.
    #[error(
        "the SQLite database's folder {} {why}; the service user must own that folder, so it must hold nothing else of mProv's: put the database in a folder of its own, e.g. MPROV_DATABASE_URL=sqlite://{}?mode=rwc",
        dir.display(), suggested.display()
    )]
    SharedDbFolder {
        /// The folder.
        dir: PathBuf,
        /// Why it cannot be handed over.
        why: String,
        /// Where the database could go instead.
        suggested: PathBuf,
    },
    /// A file in the service user's folder that must not be handed over or
    /// opened as root.
    #[error("{}: {problem}", path.display())]
    NoHandover {
        /// The path.
        path: PathBuf,
        /// What is wrong and what to do.
        problem: Handover,
    },
    /// The switch itself failed.
    #[error("cannot switch to user {user}")]
    Switch {
        /// The user.
        user: String,
        /// Why.
        #[source]
        err: nix::Error,
    },
    /// After switching, root could be regained: refuse to go on.
    #[error("switched to {0} but could still become root again")]
    Regained(String),
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    Uid::effective().is_root()
}

/// The system user `name`, made (no home, no login shell) if missing.
pub fn system_user(name: &str) -> Result<User, PrivError> {
    let err = |reason: String| PrivError::User {
        name: name.to_owned(),
        reason,
    };
    let io = |what| {
        move |err: std::io::Error| PrivError::UserIo {
            name: name.to_owned(),
            what,
            err,
        }
    };
    let lookup = || User::from_name(name).map_err(|e| io("looking it up")(e.into()));
    if let Some(user) = lookup()? {
        return Ok(user);
    }
    let useradd = USERADD
        .iter()
        .find(|p| Path::new(p).is_file())
        .ok_or_else(|| {
            err(format!(
                "it does not exist and useradd is not in {} (install the passwd package, or make the user: useradd --system --user-group --no-create-home --shell /usr/sbin/nologin {name})",
                USERADD.join(", ")
            ))
        })?;
    let out = Command::new(useradd)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .args([
            "--system",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--user-group",
            name,
        ])
        .output()
        .map_err(io("running useradd"))?;
    // Two processes may make it at once: exit 9 is "already exists".
    if !out.status.success() && out.status.code() != Some(9) {
        return Err(err(format!(
            "useradd failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    tracing::info!("made the system user {name}");
    lookup()?.ok_or_else(|| err("missing after useradd".into()))
}

/// What a path is, read without following a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A folder.
    Folder,
    /// A symbolic link.
    Link,
    /// Anything else (device, socket, fifo).
    Other,
    /// Nothing there.
    Missing,
}

/// What `path` is, without following a link.
pub fn kind_of(path: &Path) -> std::io::Result<Kind> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Ok(Kind::Link),
        Ok(m) if m.is_dir() => Ok(Kind::Folder),
        Ok(m) if m.is_file() => Ok(Kind::File),
        Ok(_) => Ok(Kind::Other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Kind::Missing),
        Err(e) => Err(e),
    }
}

/// Opens `path` for reading without following a link: `None` for a link or
/// anything that is neither a regular file nor a folder. The metadata is the
/// descriptor's own, so it describes the file that was opened.
pub fn open_nofollow(path: &Path) -> std::io::Result<Option<(File, Metadata)>> {
    if !matches!(kind_of(path)?, Kind::File | Kind::Folder) {
        return Ok(None);
    }
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        // Swapped for a link since the check.
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !(meta.is_file() || meta.is_dir()) {
        return Ok(None);
    }
    Ok(Some((file, meta)))
}

/// Who should own a path: `None` leaves the owner as it is (a service not
/// started as root cannot give files away).
pub type Owner = Option<(Uid, Gid)>;

/// Why a file in the service user's folder is neither handed to it nor
/// opened as root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Handover {
    /// More than one link: it is also another file, perhaps root's.
    #[error(
        "it has {links} hard links, so it is also another file (perhaps one of root's), and mProv hands it to the service user and opens it as root: stop the service, move it aside, and if it is your database put a copy of it back (`cp --preserve=all <aside> <file>`, one link)"
    )]
    HardLinked {
        /// The link count.
        links: u64,
    },
    /// Owned by someone other than root or the service user.
    #[error(
        "it belongs to uid {owner}, neither root nor the service user: mProv never hands another user's file to the service user; move it aside (and restore the database from a backup if it was replaced)"
    )]
    ForeignOwner {
        /// Its owner.
        owner: u32,
    },
}

/// Whether a regular file with `links` links, owned by `owner`, may be
/// handed to the service user (or opened as root in its folder): one link,
/// and an owner among `allowed` (root, the service user). Pure.
pub fn handover_problem(links: u64, owner: u32, allowed: &[u32]) -> Option<Handover> {
    if links > 1 {
        return Some(Handover::HardLinked { links });
    }
    if !allowed.contains(&owner) {
        return Some(Handover::ForeignOwner { owner });
    }
    None
}

/// Checks the regular file at `path`, if there is one, as
/// [`handover_problem`] does, on a descriptor opened without following a
/// link; the service user's folder is checked before root opens the
/// database in it. A link or an odd file is left to the callers' own checks.
pub fn check_handover(path: &Path, allowed: &[u32]) -> Result<(), PrivError> {
    let fail = |err: std::io::Error| PrivError::Chown {
        path: path.to_owned(),
        err,
    };
    match open_nofollow(path).map_err(fail)? {
        Some((_, meta)) if meta.is_file() => {
            match handover_problem(meta.nlink(), meta.uid(), allowed) {
                Some(problem) => Err(PrivError::NoHandover {
                    path: path.to_owned(),
                    problem,
                }),
                None => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// Sets the owner and mode of `path` through a descriptor opened without
/// following links. Returns what the path was; a link or an odd file is left
/// alone (and reported), never followed. A regular file given to a user
/// other than root must pass [`handover_problem`] (checked on the same
/// descriptor), or nothing is changed.
pub fn set_owner_mode(path: &Path, owner: Owner, mode: u32) -> Result<Kind, PrivError> {
    let fail = |err: std::io::Error| PrivError::Chown {
        path: path.to_owned(),
        err,
    };
    let Some((file, meta)) = open_nofollow(path).map_err(fail)? else {
        return kind_of(path).map_err(fail);
    };
    if let Some((uid, _)) = owner
        && !uid.is_root()
        && meta.is_file()
        && let Some(problem) = handover_problem(meta.nlink(), meta.uid(), &[0, uid.as_raw()])
    {
        return Err(PrivError::NoHandover {
            path: path.to_owned(),
            problem,
        });
    }
    if let Some((uid, gid)) = owner
        && (meta.uid() != uid.as_raw() || meta.gid() != gid.as_raw())
    {
        fchown(&file, Some(uid), Some(gid)).map_err(|e| fail(e.into()))?;
    }
    if meta.mode() & 0o7777 != mode {
        fchmod(&file, Mode::from_bits_truncate(mode)).map_err(|e| fail(e.into()))?;
    }
    Ok(if meta.is_dir() {
        Kind::Folder
    } else {
        Kind::File
    })
}

/// Makes sure `dir` is a real folder (not a link) with `owner` and `mode`.
pub fn own_folder(dir: &Path, owner: Owner, mode: u32) -> Result<(), PrivError> {
    match set_owner_mode(dir, owner, mode)? {
        Kind::Folder => Ok(()),
        Kind::Link => Err(PrivError::NotAFolder {
            path: dir.to_owned(),
            what: "a symbolic link",
        }),
        Kind::Missing => Err(PrivError::NotAFolder {
            path: dir.to_owned(),
            what: "missing",
        }),
        Kind::File | Kind::Other => Err(PrivError::NotAFolder {
            path: dir.to_owned(),
            what: "not a folder",
        }),
    }
}

/// Tightens a folder the service keeps to itself: the folder gets `owner`
/// and `mode`, each regular file in it `owner` and owner-only access (read
/// and write, or read only for files that were read-only), each folder in it
/// `owner` and 0700 (not its content). Links are skipped with a warning, never followed.
pub fn tighten_tree(dir: &Path, owner: Owner, mode: u32) -> Result<(), PrivError> {
    own_folder(dir, owner, mode)?;
    let fail = |err: std::io::Error| PrivError::Chown {
        path: dir.to_owned(),
        err,
    };
    for entry in std::fs::read_dir(dir).map_err(fail)? {
        let path = entry.map_err(fail)?.path();
        match kind_of(&path).map_err(fail)? {
            Kind::File => {
                let m = std::fs::symlink_metadata(&path).map_err(fail)?.mode();
                set_owner_mode(&path, owner, (m & 0o600) | 0o400)?;
            }
            Kind::Folder => {
                set_owner_mode(&path, owner, 0o700)?;
            }
            Kind::Link => tracing::warn!(
                "{} is a symbolic link; it is left alone and never followed (remove it: mProv does not put links there)",
                path.display()
            ),
            Kind::Other | Kind::Missing => {}
        }
    }
    Ok(())
}

/// Whether `user` may pass through (search) a folder with this metadata.
fn may_search(meta: &Metadata, user: &User) -> bool {
    let mode = meta.mode();
    if meta.uid() == user.uid.as_raw() {
        return mode & 0o100 != 0;
    }
    if meta.gid() == user.gid.as_raw() {
        return mode & 0o010 != 0;
    }
    mode & 0o001 != 0
}

/// Checks that `user` can reach `target` through every folder above it.
pub fn check_reachable(target: &Path, user: &User) -> Result<(), PrivError> {
    let mut blockers = Vec::new();
    for dir in target.ancestors().skip(1) {
        if dir.as_os_str().is_empty() {
            continue;
        }
        let meta = std::fs::metadata(dir).map_err(|err| PrivError::Chown {
            path: dir.to_owned(),
            err,
        })?;
        if !may_search(&meta, user) {
            blockers.push((dir.to_owned(), meta.mode() & 0o7777, meta.uid()));
        }
    }
    // The highest folder in the way is the one to name.
    match blockers.pop() {
        Some((blocker, mode, owner)) => Err(PrivError::Unreachable {
            user: user.name.clone(),
            target: target.to_owned(),
            blocker,
            mode,
            owner,
        }),
        None => Ok(()),
    }
}

/// The SQLite database's folder may be handed to the service user only if
/// it holds nothing else of mProv's: it must not be, or be above, any of
/// `keep` (the config, state and TLS folders), and it must not be a shared
/// folder (sticky or writable by others, like /tmp). Pure: decides from
/// paths and the folder's mode.
pub fn db_folder_problem(db_dir: &Path, keep: &[&Path], mode: u32) -> Option<String> {
    if db_dir.parent().is_none() {
        return Some("is the root folder".into());
    }
    for k in keep {
        if k.starts_with(db_dir) {
            return Some(format!("holds {}", k.display()));
        }
    }
    if mode & 0o1000 != 0 || mode & 0o022 != 0 {
        return Some(format!(
            "is shared with other users (mode {:04o})",
            mode & 0o7777
        ));
    }
    None
}

/// Becomes `user` for good: supplementary groups, group, then user.
pub fn drop_to(user: &User) -> Result<(), PrivError> {
    let switch = |err| PrivError::Switch {
        user: user.name.clone(),
        err,
    };
    setgroups(&[user.gid]).map_err(switch)?;
    setgid(user.gid).map_err(switch)?;
    setuid(user.uid).map_err(switch)?;
    if setuid(Uid::from_raw(0)).is_ok() || setgid(Gid::from_raw(0)).is_ok() {
        return Err(PrivError::Regained(user.name.clone()));
    }
    Ok(())
}

/// Creates `dir` with `mode` if it is missing. Folders above it that must be
/// made get 0755: only the last folder of a new path is private, so a user
/// the service hands a folder to can still reach it.
pub fn make_dir(dir: &Path, mode: u32) -> anyhow::Result<()> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .collect();
    for p in missing.iter().rev() {
        let m = if *p == dir { mode } else { 0o755 };
        match DirBuilder::new().mode(m).create(p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", p.display())),
        }
        // The umask (077 in the service) must not take away what was asked.
        fs::set_permissions(p, fs::Permissions::from_mode(m))
            .with_context(|| format!("cannot set the mode of {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_single_link_owned_by_root_or_the_user_is_handed_over() {
        let allowed = [0, 990];
        assert_eq!(handover_problem(1, 0, &allowed), None);
        assert_eq!(handover_problem(1, 990, &allowed), None);
        assert_eq!(
            handover_problem(2, 0, &allowed),
            Some(Handover::HardLinked { links: 2 })
        );
        assert_eq!(
            handover_problem(2, 990, &allowed),
            Some(Handover::HardLinked { links: 2 })
        );
        assert_eq!(
            handover_problem(1, 1000, &allowed),
            Some(Handover::ForeignOwner { owner: 1000 })
        );
    }

    #[test]
    fn a_hard_link_is_refused_on_its_descriptor_and_left_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let me = Uid::effective().as_raw();
        check_handover(&file, &[me]).unwrap();
        std::fs::hard_link(&file, dir.path().join("other")).unwrap();
        let err = check_handover(&file, &[me]).unwrap_err();
        assert!(err.to_string().contains("2 hard links"), "{err}");
        // Given to a user other than root: refused, the mode unchanged.
        let owner = Some((Uid::from_raw(me.max(1)), Gid::effective()));
        let err = set_owner_mode(&file, owner, 0o600).unwrap_err();
        assert!(matches!(err, PrivError::NoHandover { .. }), "{err}");
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o777, 0o644);
        // Missing and links are the callers' business.
        check_handover(&dir.path().join("missing"), &[me]).unwrap();
    }
}
