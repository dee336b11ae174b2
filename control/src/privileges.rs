//! Dropping root: the signing helper and the web service each run as their
//! own system user once they hold what only root may open (the CA key for the
//! helper; the listening sockets, the HTTPS key and the folders for the web
//! service).

use std::path::Path;
use std::process::Command;

use nix::unistd::{Gid, Uid, User, chown, setgid, setgroups, setuid};

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
    /// A folder or file cannot be handed to the user.
    #[error("cannot give {} to {user}", path.display())]
    Chown {
        /// The path.
        path: std::path::PathBuf,
        /// The user.
        user: String,
        /// Why.
        #[source]
        err: nix::Error,
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
    if let Some(user) = User::from_name(name).map_err(|e| err(e.to_string()))? {
        return Ok(user);
    }
    let out = Command::new("useradd")
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
        .map_err(|e| err(format!("cannot run useradd: {e}")))?;
    // Two processes may make it at once: exit 9 is "already exists".
    if !out.status.success() && out.status.code() != Some(9) {
        return Err(err(format!(
            "useradd failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    tracing::info!("made the system user {name}");
    User::from_name(name)
        .map_err(|e| err(e.to_string()))?
        .ok_or_else(|| err("missing after useradd".into()))
}

/// Gives `path` to `user` (owner and group), keeping its mode.
pub fn give(path: &Path, user: &User) -> Result<(), PrivError> {
    chown(path, Some(user.uid), Some(user.gid)).map_err(|err| PrivError::Chown {
        path: path.to_owned(),
        user: user.name.clone(),
        err,
    })
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
