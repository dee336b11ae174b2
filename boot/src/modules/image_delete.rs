//! `image-delete`: removes an image's files from the export folder.
//!
//! Parameters: `{"image": "<slug>", "version": <n>}`, the version optional.
//! Without it, `<export>/images/<slug>/` goes; with it, only
//! `<export>/images/<slug>/<n>/`. The slug must be a plain one (letters,
//! digits, `-`, `_`, `.`; not starting with `.`), so nothing outside the
//! export folder's `images/` can be named; a symbolic link there is removed
//! as a link, never followed. Files already gone are not an error. The
//! control service drops the hosting records itself.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mprov_api::jobs::Job;

use super::{ExitInfo, Module, Progress};

/// The `image-delete` module over one export folder.
#[derive(Debug, Clone)]
pub struct ImageDelete {
    export: PathBuf,
}

/// What a job asks to remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The image's slug.
    pub image: String,
    /// One version only, if given.
    pub version: Option<i64>,
}

/// Whether `slug` is a plain slug: one path component, no traversal.
pub fn plain_slug(slug: &str) -> bool {
    !slug.is_empty()
        && slug.len() <= 128
        && !slug.starts_with('.')
        && slug
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A job's parameters as a [`Target`].
pub fn target(params: &serde_json::Value) -> Result<Target> {
    let Some(image) = params.get("image").and_then(serde_json::Value::as_str) else {
        bail!("the job's params name no image (want {{\"image\": \"<slug>\"}})");
    };
    if !plain_slug(image) {
        bail!("refusing image {image:?}: not a plain slug (letters, digits, -, _, .)");
    }
    let version = match params.get("version") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(n) if n >= 1 => Some(n),
            _ => bail!("the job's version {v} is not a positive whole number"),
        },
    };
    Ok(Target {
        image: image.to_owned(),
        version,
    })
}

/// The folder `target` names under `export`.
pub fn folder(export: &Path, target: &Target) -> PathBuf {
    let image = export.join("images").join(&target.image);
    match target.version {
        Some(v) => image.join(v.to_string()),
        None => image,
    }
}

/// Removes `path` (a folder, or a link or file in its place); whether
/// anything was there.
pub fn remove(path: &Path) -> std::io::Result<bool> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let removed = if meta.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match removed {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

impl ImageDelete {
    /// Over the export folder `export`.
    pub fn new(export: &Path) -> ImageDelete {
        ImageDelete {
            export: export.to_owned(),
        }
    }

    /// Removes what `params` name; the folder and whether it was there.
    pub fn delete(&self, params: &serde_json::Value) -> Result<(PathBuf, bool)> {
        let target = target(params)?;
        let path = folder(&self.export, &target);
        if target.version.is_some() {
            // The version's folder is reached through the image's: that
            // one must not lead elsewhere.
            let image = folder(
                &self.export,
                &Target {
                    version: None,
                    ..target.clone()
                },
            );
            if std::fs::symlink_metadata(&image).is_ok_and(|m| m.file_type().is_symlink()) {
                bail!("refusing {}: a symbolic link", image.display());
            }
        }
        let was = remove(&path).with_context(|| format!("cannot remove {}", path.display()))?;
        Ok((path, was))
    }
}

#[async_trait::async_trait]
impl Module for ImageDelete {
    async fn run(&self, job: &Job, progress: &Progress) -> Result<ExitInfo> {
        let this = self.clone();
        let params = job.params.clone();
        let (path, was) = tokio::task::spawn_blocking(move || this.delete(&params))
            .await
            .context("the removal task")??;
        if was {
            progress.line(format!("removed {}", path.display()));
        } else {
            progress.line(format!("{} was already gone", path.display()));
        }
        Ok(ExitInfo::success())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tree(export: &Path) {
        for (dir, file) in [
            ("images/compute/1", "rootfs.tar.zst"),
            ("images/compute/2", "rootfs.tar.zst"),
            ("images/compute-gpu/1", "vmlinuz"),
            ("images/login/3", "vmlinuz"),
        ] {
            std::fs::create_dir_all(export.join(dir)).unwrap();
            std::fs::write(export.join(dir).join(file), b"x").unwrap();
        }
    }

    #[test]
    fn removes_exactly_its_image_or_version() {
        let dir = tempfile::tempdir().unwrap();
        let export = dir.path();
        tree(export);
        let m = ImageDelete::new(export);
        let (path, was) = m
            .delete(&json!({"image": "compute", "version": 2}))
            .unwrap();
        assert!(was);
        assert_eq!(path, export.join("images/compute/2"));
        assert!(!export.join("images/compute/2").exists());
        assert!(export.join("images/compute/1/rootfs.tar.zst").exists());
        let (_, was) = m.delete(&json!({"image": "compute"})).unwrap();
        assert!(was);
        assert!(!export.join("images/compute").exists());
        assert!(export.join("images/compute-gpu/1/vmlinuz").exists());
        assert!(export.join("images/login/3/vmlinuz").exists());
        // Already gone: fine, and says so.
        let (_, was) = m
            .delete(&json!({"image": "compute", "version": null}))
            .unwrap();
        assert!(!was);
    }

    #[test]
    fn refuses_what_is_not_a_plain_slug_or_version() {
        let dir = tempfile::tempdir().unwrap();
        tree(dir.path());
        let m = ImageDelete::new(&dir.path().join("sub"));
        for bad in [
            json!({}),
            json!({"image": ""}),
            json!({"image": ".."}),
            json!({"image": "../images"}),
            json!({"image": "a/b"}),
            json!({"image": "/etc"}),
            json!({"image": ".hidden"}),
            json!({"image": 3}),
            json!({"image": "compute", "version": 0}),
            json!({"image": "compute", "version": "../.."}),
            json!({"image": "compute", "version": 1.5}),
        ] {
            assert!(m.delete(&bad).is_err(), "{bad}");
        }
        assert!(dir.path().join("images/compute/1").exists());
    }

    #[test]
    fn a_link_in_place_of_an_image_is_removed_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (export, outside) = (dir.path().join("export"), dir.path().join("outside"));
        std::fs::create_dir_all(export.join("images")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, export.join("images/evil")).unwrap();
        let (_, was) = ImageDelete::new(&export)
            .delete(&json!({"image": "evil"}))
            .unwrap();
        assert!(was);
        assert!(!export.join("images/evil").exists());
        assert!(outside.join("keep").exists());
        std::fs::create_dir_all(outside.join("1")).unwrap();
        std::os::unix::fs::symlink(&outside, export.join("images/evil")).unwrap();
        assert!(
            ImageDelete::new(&export)
                .delete(&json!({"image": "evil", "version": 1}))
                .is_err()
        );
        assert!(outside.join("1").exists());
    }
}
