//! Container images as a source: an OCI image layout (a directory, or a tar
//! of one, which is what `docker save` writes since Docker 25, `skopeo copy
//! oci-archive:` and `umoci` too) or the older `docker save` archive (a tar
//! with `manifest.json` listing layer tars).
//!
//! The layers are applied in order into the build's root with
//! [`crate::unpack()`], whiteouts honoured. Every OCI blob read (manifests and
//! layers) is checked against its descriptor's SHA-256 digest as it streams,
//! so a truncated or altered archive fails the build with the digest named.
//! Layers may be plain tar, gzip or zstd; the compression is sniffed from the
//! first bytes rather than trusted from the media type (docker's old layers
//! carry none).
//!
//! The JSON is read with small serde structs of just the fields used here, not
//! `oci-spec`: that crate models (and validates) the whole spec, with builders
//! and getters we would not use, for four fields.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::progress;
use crate::unpack::{self, UnpackError, UnpackOptions, confine};

/// The annotation naming an image in an OCI index.
const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The media types of an OCI index and a Docker manifest list.
const INDEX_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// Why reading or applying a container image failed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The source archive could not be unpacked.
    #[error("unpacking the archive {path}")]
    Archive {
        /// The archive.
        path: PathBuf,
        /// The cause.
        #[source]
        err: io::Error,
    },
    /// A blob's content does not match its digest.
    #[error("blob {digest} is corrupt: its content hashes to sha256:{actual}")]
    BlobDigest {
        /// The digest the descriptor promises.
        digest: String,
        /// What the content hashes to.
        actual: String,
    },
    /// A digest that is not `sha256:` and 64 hex digits.
    #[error("unsupported or malformed digest {digest:?}")]
    Digest {
        /// The digest as written.
        digest: String,
    },
    /// An index holds several images and none was chosen.
    #[error("the archive holds several images; choose one with --ref: {}", refs.join(", "))]
    Ambiguous {
        /// The names found.
        refs: Vec<String>,
    },
    /// A JSON document is missing or malformed.
    #[error("reading {path}")]
    Json {
        /// The document.
        path: PathBuf,
        /// The cause.
        #[source]
        err: io::Error,
    },
    /// A layer could not be read or applied.
    #[error("applying layer {layer}")]
    Layer {
        /// The layer's digest or path.
        layer: String,
        /// The cause.
        #[source]
        err: UnpackError,
    },
    /// A path in `manifest.json` leads out of the archive.
    #[error("layer path {path:?} leads out of the archive")]
    LayerPath {
        /// The path as written.
        path: String,
    },
    /// The source is neither an OCI layout nor a `docker save` archive.
    #[error("{path} is neither an OCI image layout nor a docker save archive")]
    NotAnImage {
        /// The source.
        path: PathBuf,
    },
    /// No image carries the name asked for.
    #[error("no image named {reference:?}; there are: {}", refs.join(", "))]
    NoSuchRef {
        /// The name asked for.
        reference: String,
        /// The names found.
        refs: Vec<String>,
    },
}

/// What [`apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Layers applied.
    pub layers: usize,
    /// Entries written, all layers together.
    pub entries: u64,
    /// Whiteouts applied, all layers together.
    pub whiteouts: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    digest: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

/// An OCI index or image manifest: an index has `manifests`, an image
/// `layers`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Vec<Descriptor>,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct DockerImage {
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

/// Applies the image at `source` (a layout directory or an archive file) into
/// `root`. An archive is unpacked into `scratch` first. `reference` picks an
/// image when the source holds several (an OCI ref name, or a docker tag).
pub fn apply(
    source: &Path,
    reference: Option<&str>,
    root: &Path,
    scratch: &Path,
    options: UnpackOptions,
    show_progress: bool,
) -> Result<Applied, OciError> {
    let dir = if source.is_dir() {
        source.to_path_buf()
    } else {
        let archive_err = |err| OciError::Archive {
            path: source.to_path_buf(),
            err,
        };
        let file = File::open(source).map_err(archive_err)?;
        let reader = decompressed(BufReader::new(file)).map_err(archive_err)?;
        tar::Archive::new(reader)
            .unpack(scratch)
            .map_err(archive_err)?;
        scratch.to_path_buf()
    };
    let layers = if dir.join("index.json").is_file() {
        oci_layers(&dir, reference)?
    } else if dir.join("manifest.json").is_file() {
        docker_layers(&dir, reference)?
    } else {
        return Err(OciError::NotAnImage {
            path: source.to_path_buf(),
        });
    };

    let mut applied = Applied {
        layers: 0,
        entries: 0,
        whiteouts: 0,
    };
    let options = UnpackOptions {
        whiteouts: true,
        ..options
    };
    for layer in &layers {
        let done = apply_layer(layer, root, options, show_progress)?;
        applied.layers += 1;
        applied.entries += done.entries;
        applied.whiteouts += done.whiteouts;
    }
    Ok(applied)
}

/// A layer to apply: its file and, for OCI blobs, the digest to check.
#[derive(Debug)]
struct Layer {
    path: PathBuf,
    name: String,
    digest: Option<String>,
}

/// The layers of the chosen image of an OCI layout, bottom first.
fn oci_layers(dir: &Path, reference: Option<&str>) -> Result<Vec<Layer>, OciError> {
    let index: Document = read_json(&dir.join("index.json"))?;
    let chosen = choose(&index.manifests, reference)?;
    let mut doc: Document = read_blob_json(dir, &chosen.digest)?;
    // An image index (multi-platform): take this machine's platform.
    let mut depth = 0;
    while doc.layers.is_empty() && !doc.manifests.is_empty() {
        depth += 1;
        let is_index = doc
            .media_type
            .as_deref()
            .is_none_or(|t| INDEX_TYPES.contains(&t));
        if depth > 4 || !is_index {
            break;
        }
        let arch = go_arch();
        let found = doc
            .manifests
            .iter()
            .find(|m| {
                m.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == arch)
            })
            .or(doc.manifests.first())
            .map(|m| m.digest.clone());
        match found {
            Some(digest) => doc = read_blob_json(dir, &digest)?,
            None => break,
        }
    }
    doc.layers
        .iter()
        .map(|d| {
            Ok(Layer {
                path: blob_path(dir, &d.digest)?,
                name: d.digest.clone(),
                digest: Some(d.digest.clone()),
            })
        })
        .collect()
}

/// Picks the descriptor named `reference`, or the only one.
fn choose<'a>(
    manifests: &'a [Descriptor],
    reference: Option<&str>,
) -> Result<&'a Descriptor, OciError> {
    let refs: Vec<String> = manifests
        .iter()
        .map(|m| {
            m.annotations
                .get(REF_NAME)
                .cloned()
                .unwrap_or_else(|| m.digest.clone())
        })
        .collect();
    match reference {
        Some(wanted) => manifests
            .iter()
            .zip(&refs)
            .find(|(m, name)| *name == wanted || m.digest == wanted)
            .map(|(m, _)| m)
            .ok_or_else(|| OciError::NoSuchRef {
                reference: wanted.to_string(),
                refs,
            }),
        None if manifests.len() == 1 => Ok(&manifests[0]),
        None => Err(OciError::Ambiguous { refs }),
    }
}

/// The layers of the chosen image of a `docker save` archive, bottom first.
fn docker_layers(dir: &Path, reference: Option<&str>) -> Result<Vec<Layer>, OciError> {
    let images: Vec<DockerImage> = read_json(&dir.join("manifest.json"))?;
    let tags = |i: &DockerImage| i.repo_tags.clone().unwrap_or_default();
    let all: Vec<String> = images.iter().flat_map(tags).collect();
    let image = match reference {
        Some(wanted) => images
            .iter()
            .find(|i| tags(i).iter().any(|t| t == wanted))
            .ok_or_else(|| OciError::NoSuchRef {
                reference: wanted.to_string(),
                refs: all.clone(),
            })?,
        None if images.len() == 1 => &images[0],
        None => return Err(OciError::Ambiguous { refs: all }),
    };
    image
        .layers
        .iter()
        .map(|raw| {
            let rel = confine(raw.as_bytes())
                .filter(|p| !p.as_os_str().is_empty())
                .ok_or_else(|| OciError::LayerPath { path: raw.clone() })?;
            // Docker 25+ names layers by their blob path: check the digest too.
            let digest = raw
                .strip_prefix("blobs/sha256/")
                .map(|hex| format!("sha256:{hex}"));
            Ok(Layer {
                path: dir.join(rel),
                name: raw.clone(),
                digest,
            })
        })
        .collect()
}

/// Streams one layer into the root, checking its digest.
fn apply_layer(
    layer: &Layer,
    root: &Path,
    options: UnpackOptions,
    show_progress: bool,
) -> Result<unpack::Unpacked, OciError> {
    let layer_err = |err| OciError::Layer {
        layer: layer.name.clone(),
        err,
    };
    let io_err = |err| layer_err(UnpackError::Read { err });
    let file = File::open(&layer.path).map_err(io_err)?;
    let total = file.metadata().map_err(io_err)?.len();
    let bar = progress::bytes_bar(total, "layer", show_progress);
    let mut hashed = HashReader::new(bar.wrap_read(file));
    let done = {
        let reader =
            decompressed(BufReader::with_capacity(1 << 20, &mut hashed)).map_err(io_err)?;
        unpack::unpack(reader, root, options).map_err(layer_err)?
    };
    // The tar reader stops at the end-of-archive blocks: hash the rest too.
    io::copy(&mut hashed, &mut io::sink()).map_err(io_err)?;
    bar.finish_and_clear();
    if let Some(digest) = &layer.digest {
        let actual = hex::encode(hashed.hasher.finalize());
        if digest.strip_prefix("sha256:") != Some(actual.as_str()) {
            return Err(OciError::BlobDigest {
                digest: digest.clone(),
                actual,
            });
        }
    }
    Ok(done)
}

/// A reader that decompresses gzip or zstd, sniffed from the magic bytes, or
/// passes plain data through.
fn decompressed<'a, R: BufRead + 'a>(mut reader: R) -> io::Result<Box<dyn Read + 'a>> {
    let head = reader.fill_buf()?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::bufread::MultiGzDecoder::new(reader)))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Ok(Box::new(zstd::Decoder::with_buffer(reader)?))
    } else {
        Ok(Box::new(reader))
    }
}

/// `blobs/sha256/<hex>` for a well-formed digest.
fn blob_path(dir: &Path, digest: &str) -> Result<PathBuf, OciError> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(dir.join("blobs").join("sha256").join(hex))
        }
        _ => Err(OciError::Digest {
            digest: digest.to_string(),
        }),
    }
}

/// A JSON blob, checked against its digest.
fn read_blob_json<T: DeserializeOwned>(dir: &Path, digest: &str) -> Result<T, OciError> {
    let path = blob_path(dir, digest)?;
    let json_err = |err| OciError::Json {
        path: path.clone(),
        err,
    };
    let bytes = std::fs::read(&path).map_err(json_err)?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if digest.strip_prefix("sha256:") != Some(actual.as_str()) {
        return Err(OciError::BlobDigest {
            digest: digest.to_string(),
            actual,
        });
    }
    serde_json::from_slice(&bytes).map_err(|err| json_err(err.into()))
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, OciError> {
    let json_err = |err| OciError::Json {
        path: path.to_path_buf(),
        err,
    };
    let bytes = std::fs::read(path).map_err(json_err)?;
    serde_json::from_slice(&bytes).map_err(|err| json_err(err.into()))
}

/// This machine's architecture as OCI (Go's `GOARCH`) spells it.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// Hashes what is read through it.
struct HashReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R> HashReader<R> {
    fn new(inner: R) -> Self {
        HashReader {
            inner,
            hasher: Sha256::new(),
        }
    }
}

impl<R: Read> Read for HashReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_paths_need_a_sha256_digest() {
        let dir = Path::new("/l");
        let hex = "ab".repeat(32);
        assert_eq!(
            blob_path(dir, &format!("sha256:{hex}")).expect("valid"),
            Path::new("/l/blobs/sha256").join(&hex)
        );
        for bad in [
            "sha256:../../etc/passwd".to_string(),
            "sha512:00".to_string(),
            format!("sha256:{}", "AB".repeat(32)),
        ] {
            assert!(
                matches!(blob_path(dir, &bad), Err(OciError::Digest { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn choose_by_ref_name_or_the_only_one() {
        let d = |digest: &str, name: Option<&str>| Descriptor {
            digest: digest.into(),
            annotations: name
                .map(|n| BTreeMap::from([(REF_NAME.to_string(), n.to_string())]))
                .unwrap_or_default(),
            platform: None,
        };
        let one = [d("sha256:1", None)];
        assert_eq!(choose(&one, None).expect("only one").digest, "sha256:1");
        let two = [d("sha256:1", Some("a")), d("sha256:2", Some("b"))];
        assert_eq!(choose(&two, Some("b")).expect("b").digest, "sha256:2");
        assert!(matches!(
            choose(&two, None),
            Err(OciError::Ambiguous { .. })
        ));
        let err = choose(&two, Some("c")).expect_err("no c");
        assert_eq!(err.to_string(), "no image named \"c\"; there are: a, b");
    }
}
