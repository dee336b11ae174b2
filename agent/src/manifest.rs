//! The boot manifest (`mprov_api::boot::BootManifest`, read over mTLS from
//! the control service at `MANIFEST_PATH`), checked before anything is
//! fetched: the sha256 is 64 hex digits, the size is not zero, every source
//! is a plain `http://` or `https://` URL, the host name is one a kernel
//! takes, and the staging size is one tmpfs understands.
//!
//! It comes over mTLS from the service we pinned, but it is still parsed as
//! untrusted bytes (the `agent_manifest` fuzz target): a bug on the other
//! side must not become a panic of PID 1.

use mprov_api::boot::BootManifest;

use crate::image::Expected;

/// The most sources the agent tries.
pub const MAX_SOURCES: usize = 64;

/// A manifest the agent can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The system's host name.
    pub hostname: String,
    /// The image and version, for the console (`compute:3`).
    pub image: String,
    /// What the image must hash to.
    pub expected: Expected,
    /// Where to fetch it, best first.
    pub sources: Vec<String>,
    /// The staging tmpfs's `size=` option (`4G`, `50%`), if set.
    pub tmpfs_size: Option<String>,
}

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not the JSON of a boot manifest.
    #[error("the boot manifest is not valid JSON for this agent's version: {0}")]
    Json(String),
    /// The sha256 is not 64 hex digits.
    #[error("the boot manifest's sha256 {0:?} is not 64 hex digits")]
    Sha256(String),
    /// The size is zero.
    #[error("the boot manifest gives the image a size of 0 bytes: publish the version again")]
    EmptyImage,
    /// No source, or too many.
    #[error(
        "the boot manifest lists {0} job servers (1 to {MAX_SOURCES} wanted): is a job server hosting the image on the node's network?"
    )]
    Sources(usize),
    /// A source is not an http(s) URL.
    #[error("the boot manifest's source {0:?} is not an http:// or https:// URL")]
    Source(String),
    /// The host name is not one a kernel takes.
    #[error("the boot manifest's host name {0:?} is not a valid host name")]
    Hostname(String),
    /// The staging size is not a tmpfs size.
    #[error("the boot manifest's tmpfs_size {0:?} is not a size like 4G or 50%")]
    TmpfsSize(String),
}

/// Parses and checks a manifest's JSON.
pub fn parse(json: &[u8]) -> Result<Checked, ManifestError> {
    let manifest: BootManifest =
        serde_json::from_slice(json).map_err(|err| ManifestError::Json(err.to_string()))?;
    check(&manifest)
}

/// Checks a manifest.
pub fn check(manifest: &BootManifest) -> Result<Checked, ManifestError> {
    let mut sha256 = [0u8; 32];
    if manifest.sha256.len() != 64 || hex::decode_to_slice(&manifest.sha256, &mut sha256).is_err() {
        return Err(ManifestError::Sha256(manifest.sha256.clone()));
    }
    if manifest.size == 0 {
        return Err(ManifestError::EmptyImage);
    }
    if manifest.sources.is_empty() || manifest.sources.len() > MAX_SOURCES {
        return Err(ManifestError::Sources(manifest.sources.len()));
    }
    for source in &manifest.sources {
        if !source_ok(source) {
            return Err(ManifestError::Source(source.clone()));
        }
    }
    if !hostname_ok(&manifest.hostname) {
        return Err(ManifestError::Hostname(manifest.hostname.clone()));
    }
    if let Some(size) = &manifest.tmpfs_size
        && !tmpfs_size_ok(size)
    {
        return Err(ManifestError::TmpfsSize(size.clone()));
    }
    Ok(Checked {
        hostname: manifest.hostname.clone(),
        image: format!("{}:{}", manifest.image, manifest.version),
        expected: Expected {
            size: manifest.size,
            sha256,
        },
        sources: manifest.sources.clone(),
        tmpfs_size: manifest.tmpfs_size.clone(),
    })
}

/// An `http://` or `https://` URL with a host, printable ASCII only, at
/// most 2048 bytes.
fn source_ok(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return false;
    };
    url.len() <= 2048
        && url.bytes().all(|b| b.is_ascii_graphic())
        && rest
            .split(['/', '?', '#'])
            .next()
            .is_some_and(|host| !host.is_empty() && !host.contains('@'))
}

/// A host name: 1-63 of `[a-z0-9-]`, not starting or ending with `-`.
pub fn hostname_ok(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// A tmpfs `size=`: digits with an optional `k`, `m`, `g` (any case) or
/// `%` (1-100).
pub fn tmpfs_size_ok(size: &str) -> bool {
    let (digits, unit) = match size.char_indices().last() {
        Some((i, c)) if !c.is_ascii_digit() => (&size[..i], Some(c)),
        _ => (size, None),
    };
    if digits.is_empty() || digits.len() > 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    match unit {
        None | Some('k' | 'K' | 'm' | 'M' | 'g' | 'G') => {
            digits.parse::<u64>().is_ok_and(|n| n > 0)
        }
        Some('%') => digits.parse::<u64>().is_ok_and(|n| (1..=100).contains(&n)),
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> serde_json::Value {
        serde_json::json!({
            "system_id": 7, "hostname": "n01", "image": "compute", "version": 3,
            "size": 1234, "sha256": "ab".repeat(32),
            "sources": ["http://10.0.0.2:8081/images/compute/3/rootfs.tar.zst"],
            "tmpfs_size": "50%"
        })
    }

    #[test]
    fn a_good_manifest_checks() {
        let checked = parse(manifest().to_string().as_bytes()).expect("checks");
        assert_eq!(checked.image, "compute:3");
        assert_eq!(checked.expected.size, 1234);
        assert_eq!(checked.expected.sha256, [0xab; 32]);
        assert_eq!(checked.tmpfs_size.as_deref(), Some("50%"));
    }

    #[test]
    fn bad_manifests_say_what_is_wrong() {
        let with = |key: &str, value: serde_json::Value| {
            let mut m = manifest();
            m[key] = value;
            parse(m.to_string().as_bytes()).expect_err("refused")
        };
        assert!(matches!(
            with("sha256", "xyz".into()),
            ManifestError::Sha256(_)
        ));
        assert_eq!(with("size", 0.into()), ManifestError::EmptyImage);
        assert_eq!(
            with("sources", serde_json::json!([])),
            ManifestError::Sources(0)
        );
        for bad in [
            "ftp://x/y",
            "http://",
            "http:///x",
            "http://a b/",
            "http://u@h/",
        ] {
            assert!(
                matches!(
                    with("sources", serde_json::json!([bad])),
                    ManifestError::Source(_)
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            with("hostname", "N01".into()),
            ManifestError::Hostname(_)
        ));
        for bad in ["0", "50%x", "101%", "G", "-1G", ""] {
            assert!(
                matches!(with("tmpfs_size", bad.into()), ManifestError::TmpfsSize(_)),
                "{bad}"
            );
        }
        assert!(matches!(
            parse(b"{\"size\": -1}").expect_err("refused"),
            ManifestError::Json(_)
        ));
        for good in ["4G", "512m", "100%", "1048576"] {
            assert!(tmpfs_size_ok(good), "{good}");
        }
    }
}
