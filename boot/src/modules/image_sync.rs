//! The `image-sync` job module: copies a published image version from the
//! job server that hosts it, verifies it, and only then records that this
//! job server hosts it too.
//!
//! The job's parameters are `{"image": slug, "version": n, "from": name}`.
//!
//! # Trust
//!
//! What a version holds is the control service's record, made when the
//! building job server published it ([`recorded_files`]): every file's name,
//! size and SHA-256. The source job server is only where the bytes come
//! from, never an authority on them: each file is checked against the
//! record, and the source's `manifest.json` is copied only when its list of
//! files agrees with the record.
//!
//! # Transport
//!
//! Over HTTPS from the source's HTTPS image listener
//! (`https://<address>:<port>/images/<slug>/<version>/<file>`, the
//! addresses from the source's `jobservers` row, the port this job server's
//! own `--https` port: job servers share it). Both ends present their
//! enrolled certificates, signed by the control CA. Those name a job server
//! by a URI and hold no address, so the source's certificate is not
//! checked against the address it is reached at: a custom verifier checks
//! its signature chain against the control CA and that it names the job
//! server `from` ([`crate::tls`]). The source, in turn, serves only job
//! servers' certificates. A job server without a certificate (one that
//! follows the control service with the API key) copies over plain HTTP
//! from the source's image server (its row's `port`), and says so in the
//! job's output. Either way, the checksums from the control service, read
//! over its own API, are what make the copy trustworthy.
//!
//! # On disk
//!
//! Files are downloaded into `<export>/images/<slug>/.sync-<version>/`,
//! beside the version's folder on the same file system. A file already
//! there from an earlier attempt is continued with a `Range` request; a
//! dropped connection is resumed the same way, a few times
//! ([`SyncContext::attempts`]); a busy source's `503` is waited out as its
//! `Retry-After` says. When a file is complete its size and SHA-256 are
//! compared with the record; a resumed file that does not match is
//! downloaded again from its start once, and a mismatch after that fails
//! the job and removes the temporary folder (the source's copy is bad).
//! When every file matches, `manifest.json` is written, the folder synced and
//! renamed to `<version>/` in one step: the version folder is either
//! complete and verified, or absent. A transport failure keeps the
//! temporary folder, so the next attempt resumes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use mprov_api::client::Client;
use mprov_api::jobs::{HostedFile, Hosting, ImageFiles};
use mprov_image::Manifest;
use mprov_image::manifest::MANIFEST;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_RANGE, RANGE, RETRY_AFTER};
use serde::Deserialize;
use serde_json::Value;
use tokio::io::AsyncWriteExt as _;

/// The largest `manifest.json` accepted from a source.
const MAX_MANIFEST: usize = 1 << 20;

/// What the module needs from the job server.
#[derive(Debug, Clone)]
pub struct SyncContext {
    /// The export folder the image server serves; versions go to
    /// `<export>/images/<slug>/<version>/`.
    pub export: PathBuf,
    /// Requests per file that may fail (connection refused or dropped, a
    /// short body) before the job fails; each one resumes.
    pub attempts: u32,
    /// `503` answers per file waited out before the job fails.
    pub busy_retries: u32,
    /// The longest `Retry-After` honoured.
    pub max_retry_after: Duration,
    /// How to copy over HTTPS; `None`: over plain HTTP.
    pub tls: Option<SyncTls>,
}

/// How `image-sync` reaches the source's HTTPS image listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncTls {
    /// This job server's identity folder (its certificate and key, the
    /// client certificate presented).
    pub identity_dir: PathBuf,
    /// The control CA bundle (`--ca-file`); `None`: the system's.
    pub ca_file: Option<PathBuf>,
    /// The sources' HTTPS port: this job server's own `--https` port.
    pub port: u16,
}

impl SyncContext {
    /// Defaults for `export`: 5 attempts, 20 busy answers, waits of at most
    /// 30 s.
    pub fn new(export: impl Into<PathBuf>) -> SyncContext {
        SyncContext {
            export: export.into(),
            attempts: 5,
            busy_retries: 20,
            max_retry_after: Duration::from_secs(30),
            tls: None,
        }
    }
}

/// An `image-sync` job's parameters.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncParams {
    /// The image's slug.
    pub image: String,
    /// The version to copy.
    pub version: i64,
    /// The job server that hosts it.
    pub from: String,
}

/// Why copying a version failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A recorded file name cannot name a file in a version folder.
    #[error("the control service records a file {name:?}, which is not a plain file name")]
    BadName {
        /// The name.
        name: String,
    },
    /// The source stayed busy.
    #[error("{url}: the source answered 503 (busy) {times} times")]
    Busy {
        /// The file.
        url: String,
        /// How often.
        times: u32,
    },
    /// A downloaded file is not what the control service recorded.
    #[error(
        "{name} from {url} does not match the control service's record (size {size}, sha256 {sha256}; recorded size {want_size}, sha256 {want_sha256}): the source's copy is bad"
    )]
    Corrupt {
        /// The file.
        name: String,
        /// Where it came from.
        url: String,
        /// Its size.
        size: u64,
        /// Its SHA-256.
        sha256: String,
        /// The recorded size.
        want_size: u64,
        /// The recorded SHA-256.
        want_sha256: String,
    },
    /// The version's folder exists and does not match the record.
    #[error("{} exists and does not match the control service's record ({problem}); it is never overwritten", dir.display())]
    Exists {
        /// The folder.
        dir: PathBuf,
        /// The first difference.
        problem: String,
    },
    /// The source answered with an unexpected status.
    #[error("{url}: the source answered {status}")]
    Http {
        /// The file.
        url: String,
        /// The status.
        status: StatusCode,
    },
    /// A local file could not be handled.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        err: std::io::Error,
    },
    /// The source's `manifest.json` is missing or disagrees with the record.
    #[error("the source's manifest.json ({url}) {reason}")]
    Manifest {
        /// Its URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// No source address is known.
    #[error("no address to download from")]
    NoSource,
    /// The download failed over and over.
    #[error("downloading {url} failed {attempts} times, last: {last} ({kept} bytes kept in {} for the next attempt)", partial.display())]
    Transport {
        /// The file.
        url: String,
        /// Failed requests.
        attempts: u32,
        /// Bytes already downloaded.
        kept: u64,
        /// Where they are.
        partial: PathBuf,
        /// The last failure, with its causes.
        last: String,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SyncError + use<> {
    let path = path.to_path_buf();
    move |err| SyncError::Io { what, path, err }
}

/// Runs an `image-sync` job: reads the record, copies and verifies the
/// version, then records that this job server hosts it. Progress lines go
/// to `progress`.
pub async fn image_sync(
    ctx: &SyncContext,
    client: &Client,
    params: &Value,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<()> {
    let params: SyncParams = serde_json::from_value(params.clone()).context(
        "the job's parameters: want {\"image\": slug, \"version\": n, \"from\": job server}",
    )?;
    let files = recorded_files(client, &params.image, params.version).await?;
    let (http, sources) = transport(ctx, client, &params.from, progress).await?;
    copy_version(
        ctx,
        &http,
        &sources,
        &params.image,
        params.version,
        &files,
        progress,
    )
    .await
    .with_context(|| {
        format!(
            "copying {} version {} from {}",
            params.image, params.version, params.from
        )
    })?;
    client
        .record_hosting(&Hosting {
            image: params.image.clone(),
            version: params.version,
            files: None,
        })
        .await
        .with_context(|| {
            format!(
                "recording that this job server hosts {} version {}",
                params.image, params.version
            )
        })?;
    progress(&format!(
        "recorded: this job server hosts {} version {}",
        params.image, params.version
    ));
    Ok(())
}

/// The files the control service recorded for `slug`'s `version`, which
/// must be its current one.
pub async fn recorded_files(client: &Client, slug: &str, version: i64) -> Result<Vec<HostedFile>> {
    let image = client
        .get("images", slug)
        .await
        .with_context(|| format!("reading image {slug}"))?;
    let current = image.get("version").and_then(Value::as_i64);
    if current != Some(version) {
        bail!(
            "image {slug} is at version {} now: version {version} is superseded",
            current.map_or("(unknown)".to_string(), |v| v.to_string())
        );
    }
    let recorded = client
        .image_files(slug, Some(version))
        .await
        .with_context(|| format!("reading the recorded files of image {slug}"))?;
    checked_files(recorded, version)
}

/// The recorded files, if they are of `version` and there are some.
fn checked_files(recorded: ImageFiles, version: i64) -> Result<Vec<HostedFile>> {
    if recorded.version != version {
        bail!(
            "the control service's recorded files are of version {}, not {version}",
            recorded.version
        );
    }
    if recorded.files.is_empty() {
        bail!(
            "the control service has no files recorded for version {version}: it is not published yet"
        );
    }
    Ok(recorded.files)
}

/// The client and the base URLs to copy from job server `from` with: over
/// HTTPS when `ctx` says how and this job server has its certificate, else
/// over plain HTTP (said in the job's output).
pub async fn transport(
    ctx: &SyncContext,
    client: &Client,
    from: &str,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<(reqwest::Client, Vec<String>)> {
    let me = match &ctx.tls {
        Some(tls) => crate::identity::load(&tls.identity_dir)?.map(|me| (tls, me)),
        None => None,
    };
    let Some((tls, me)) = me else {
        progress("no job server certificate here: copying over plain HTTP");
        return Ok((http_client()?, source_urls(client, from).await?));
    };
    let ca = crate::config::ca_bundle(tls.ca_file.as_deref())?;
    let http = https_client(&ca, &me, from)?;
    let (addresses, _) = source_addresses(client, from).await?;
    let urls = addresses
        .iter()
        .map(|address| https_base_url(address, tls.port))
        .collect();
    progress(&format!(
        "copying over HTTPS from job server {from} (port {}): its certificate must come from the control CA and name it",
        tls.port
    ));
    Ok((http, urls))
}

/// `https://ADDRESS:PORT`, an IPv6 address in brackets.
pub fn https_base_url(address: &str, port: u16) -> String {
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => format!("https://[{v6}]:{port}"),
        _ => format!("https://{address}:{port}"),
    }
}

/// The addresses of job server `name` and its image server's HTTP port,
/// from its row.
pub async fn source_addresses(client: &Client, name: &str) -> Result<(Vec<String>, Option<u16>)> {
    let row = client
        .get("jobservers", name)
        .await
        .with_context(|| format!("reading job server {name}"))?;
    let port = row
        .get("port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok());
    let addresses: Vec<String> = row
        .get("addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    if addresses.is_empty() {
        bail!("job server {name} has no addresses to download from");
    }
    Ok((addresses, port))
}

/// The plain HTTP image-server base URLs of job server `name`, from its
/// row.
pub async fn source_urls(client: &Client, name: &str) -> Result<Vec<String>> {
    let (addresses, port) = source_addresses(client, name).await?;
    Ok(addresses
        .iter()
        .map(|address| mprov_api::boot::jobserver_base_url(address, port))
        .collect())
}

/// An HTTPS client for job server `source`'s image listener: `me` as the
/// client certificate, the server's checked against the CA bundle `ca_pem`
/// and for `source`'s name ([`crate::tls::client_config`]). Limits as
/// [`http_client`].
pub fn https_client(
    ca_pem: &str,
    me: &crate::identity::Identity,
    source: &str,
) -> Result<reqwest::Client> {
    let tls = crate::tls::client_config(ca_pem, me, source)?;
    client_builder()
        .tls_backend_preconfigured(tls)
        .build()
        .context("building the HTTPS client")
}

/// What both clients share: who they are, bounded connect and idle times,
/// no overall timeout (an image takes as long as it takes).
fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .user_agent(concat!(
            "mprov-jobserver/",
            env!("CARGO_PKG_VERSION"),
            " image-sync"
        ))
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(60))
}

/// An HTTP client for the image servers without TLS,
/// bounded connect and idle times, no overall timeout (an image takes as
/// long as it takes).
pub fn http_client() -> Result<reqwest::Client> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    client_builder().build().context("building the HTTP client")
}

/// Copies `slug`'s `version` from the image servers at `sources` (tried in
/// turn) into `<export>/images/<slug>/<version>/`, every file checked
/// against `files`. Needs no control service. Returns the version's folder.
pub async fn copy_version(
    ctx: &SyncContext,
    http: &reqwest::Client,
    sources: &[String],
    slug: &str,
    version: i64,
    files: &[HostedFile],
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<PathBuf, SyncError> {
    if sources.is_empty() {
        return Err(SyncError::NoSource);
    }
    for file in files {
        if !plain_name(&file.name) {
            return Err(SyncError::BadName {
                name: file.name.clone(),
            });
        }
    }
    let image_dir = ctx
        .export
        .join(mprov_api::boot::IMAGES_DIR)
        .join(plain_checked(slug)?);
    let dir = image_dir.join(version.to_string());
    if tokio::fs::symlink_metadata(&dir).await.is_ok() {
        if let Some(problem) = mismatch(&dir, files).await? {
            return Err(SyncError::Exists { dir, problem });
        }
        progress(&format!(
            "{} is already here and matches the record",
            dir.display()
        ));
        return Ok(dir);
    }
    let temp = image_dir.join(format!(".sync-{version}"));
    tokio::fs::create_dir_all(&temp)
        .await
        .map_err(io_err("creating", &temp))?;
    let from = Source {
        ctx,
        http,
        sources,
        path: format!("{}/{slug}/{version}", mprov_api::boot::IMAGES_DIR),
        progress,
    };
    let result = fill(&from, &temp, files).await;
    if let Err(err) = &result
        && matches!(err, SyncError::Corrupt { .. } | SyncError::Manifest { .. })
    {
        // The source's bytes are bad: nothing here is worth resuming.
        let _ = tokio::fs::remove_dir_all(&temp).await;
    }
    result?;
    sync_dir(&temp).await?;
    if tokio::fs::symlink_metadata(&dir).await.is_ok() {
        return Err(SyncError::Exists {
            dir,
            problem: "it appeared while copying".into(),
        });
    }
    tokio::fs::rename(&temp, &dir)
        .await
        .map_err(io_err("renaming into place", &dir))?;
    sync_dir(&image_dir).await?;
    progress(&format!("copied and verified {}", dir.display()));
    Ok(dir)
}

/// Downloads every file into `temp` and verifies it, then the manifest.
async fn fill(from: &Source<'_>, temp: &Path, files: &[HostedFile]) -> Result<(), SyncError> {
    for file in files {
        download_verified(from, &temp.join(&file.name), file).await?;
    }
    if !files.iter().any(|f| f.name == MANIFEST) {
        let bytes = from.manifest(files).await?;
        let path = temp.join(MANIFEST);
        let mut out = tokio::fs::File::create(&path)
            .await
            .map_err(io_err("writing", &path))?;
        out.write_all(&bytes)
            .await
            .map_err(io_err("writing", &path))?;
        out.sync_all().await.map_err(io_err("syncing", &path))?;
    }
    Ok(())
}

/// Where a version's files come from.
struct Source<'a> {
    ctx: &'a SyncContext,
    http: &'a reqwest::Client,
    sources: &'a [String],
    /// `images/<slug>/<version>`.
    path: String,
    progress: &'a (dyn Fn(&str) + Send + Sync),
}

impl Source<'_> {
    fn url(&self, base: usize, name: &str) -> String {
        format!("{}/{}/{name}", self.sources[base], self.path)
    }

    /// The source's `manifest.json`, when its files agree with `files`.
    async fn manifest(&self, files: &[HostedFile]) -> Result<Vec<u8>, SyncError> {
        let mut last = None;
        for base in 0..self.sources.len() {
            let url = self.url(base, MANIFEST);
            let bad = |reason: String| SyncError::Manifest {
                url: url.clone(),
                reason,
            };
            let response = match self.http.get(&url).send().await {
                Ok(r) => r,
                Err(err) => {
                    last = Some(bad(format!("could not be fetched: {err}")));
                    continue;
                }
            };
            if response.status() != StatusCode::OK {
                return Err(bad(format!("answered {}", response.status())));
            }
            let bytes = read_limited(response, MAX_MANIFEST).await.map_err(&bad)?;
            let manifest = Manifest::from_slice(&bytes)
                .map_err(|err| bad(format!("cannot be read: {err}")))?;
            let mut listed: Vec<(&str, u64, &str)> = manifest
                .artifacts
                .iter()
                .map(|a| (a.name.as_str(), a.size, a.sha256.as_str()))
                .collect();
            let mut recorded: Vec<(&str, u64, &str)> = files
                .iter()
                .map(|f| (f.name.as_str(), f.size, f.sha256.as_str()))
                .collect();
            listed.sort_unstable();
            recorded.sort_unstable();
            if listed != recorded {
                return Err(bad(
                    "lists other files than the control service records".into()
                ));
            }
            return Ok(bytes);
        }
        Err(last.unwrap_or(SyncError::NoSource))
    }
}

/// Reads a body of at most `limit` bytes.
async fn read_limited(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        if out.len() + chunk.len() > limit {
            return Err(format!("is larger than {limit} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Downloads `want` to `dest` (continuing what is there) and checks it
/// against the record; a resumed file that does not match starts over
/// once.
async fn download_verified(
    from: &Source<'_>,
    dest: &Path,
    want: &HostedFile,
) -> Result<(), SyncError> {
    let mut started_over = false;
    loop {
        let fetched = fetch(from, dest, want).await?;
        let check = dest.to_path_buf();
        let (size, sha256) =
            tokio::task::spawn_blocking(move || mprov_image::manifest::hash_file(&check))
                .await
                .map_err(|err| SyncError::Io {
                    what: "hashing",
                    path: dest.to_path_buf(),
                    err: std::io::Error::other(err),
                })?
                .map_err(io_err("hashing", dest))?;
        if size == want.size && sha256 == want.sha256 {
            (from.progress)(&format!(
                "{}: {} bytes, sha256 {sha256}: matches the record",
                want.name, size
            ));
            return Ok(());
        }
        if fetched.kept > 0 && !started_over {
            (from.progress)(&format!(
                "{}: does not match the record after resuming at {} bytes: downloading it again",
                want.name, fetched.kept
            ));
            truncate(dest).await?;
            started_over = true;
            continue;
        }
        let _ = tokio::fs::remove_file(dest).await;
        return Err(SyncError::Corrupt {
            name: want.name.clone(),
            url: fetched.url,
            size,
            sha256,
            want_size: want.size,
            want_sha256: want.sha256.clone(),
        });
    }
}

/// What [`fetch`] did.
#[derive(Debug)]
struct Fetched {
    /// Bytes of an earlier attempt it continued from (the first time).
    kept: u64,
    /// The URL the last bytes came from.
    url: String,
}

/// Brings `dest` to `want.size` bytes, continuing what it holds with
/// `Range` requests. Does not check the content.
async fn fetch(from: &Source<'_>, dest: &Path, want: &HostedFile) -> Result<Fetched, SyncError> {
    let size = want.size;
    let mut base = 0;
    let mut failures = 0;
    let mut busy = 0;
    let mut kept = None;
    let mut url = from.url(base, &want.name);
    loop {
        let mut have = file_len(dest).await?;
        if have > size && kept.is_none() {
            // Longer than the file: not a part of it.
            truncate(dest).await?;
            have = 0;
        }
        let first = *kept.get_or_insert(have);
        // Longer after downloading: the source's file is not the recorded
        // one, which verification reports.
        if have >= size {
            if first == size && size > 0 {
                (from.progress)(&format!("{}: complete from an earlier attempt", want.name));
            }
            return Ok(Fetched { kept: first, url });
        }
        url = from.url(base, &want.name);
        let mut request = from.http.get(&url);
        if have > 0 {
            (from.progress)(&format!(
                "{}: resuming at {have} of {size} bytes from {url}",
                want.name
            ));
            request = request.header(RANGE, format!("bytes={have}-"));
        } else {
            (from.progress)(&format!(
                "{}: downloading {} MiB from {url}",
                want.name,
                size >> 20
            ));
        }
        let failed = |failures: &mut u32, last: String| {
            *failures += 1;
            if *failures >= from.ctx.attempts {
                Err(SyncError::Transport {
                    url: url.clone(),
                    attempts: *failures,
                    kept: have,
                    partial: dest.to_path_buf(),
                    last,
                })
            } else {
                Ok(())
            }
        };
        let mut response = match request.send().await {
            Ok(r) => r,
            Err(err) => {
                let err = causes(&err);
                (from.progress)(&format!("{}: {url}: {err}", want.name));
                failed(&mut failures, err)?;
                // The next address, if there is one, after a pause.
                base = (base + 1) % from.sources.len();
                tokio::time::sleep(Duration::from_millis(500) * failures).await;
                continue;
            }
        };
        let append = match response.status() {
            StatusCode::PARTIAL_CONTENT
                if range_start(response.headers().get(CONTENT_RANGE)) == Some(have) =>
            {
                true
            }
            StatusCode::OK => {
                if have > 0 {
                    (from.progress)(&format!(
                        "{}: the source sent the whole file: starting over",
                        want.name
                    ));
                }
                false
            }
            StatusCode::PARTIAL_CONTENT | StatusCode::RANGE_NOT_SATISFIABLE => {
                // Not the range asked for: what we hold is of no use.
                (from.progress)(&format!(
                    "{}: the source cannot continue at {have} bytes: starting over",
                    want.name
                ));
                truncate(dest).await?;
                continue;
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                busy += 1;
                if busy > from.ctx.busy_retries {
                    return Err(SyncError::Busy { url, times: busy });
                }
                let wait =
                    retry_after(response.headers().get(RETRY_AFTER)).min(from.ctx.max_retry_after);
                (from.progress)(&format!(
                    "{}: the source is busy: waiting {} s",
                    want.name,
                    wait.as_secs()
                ));
                tokio::time::sleep(wait).await;
                continue;
            }
            status => return Err(SyncError::Http { url, status }),
        };
        let mut out = tokio::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(dest)
            .await
            .map_err(io_err("writing", dest))?;
        let mut done = if append { have } else { 0 };
        let mut tenth = done * 10 / size.max(1);
        let body = loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    out.write_all(&chunk)
                        .await
                        .map_err(io_err("writing", dest))?;
                    done += chunk.len() as u64;
                    if done > size {
                        // Not the recorded file; no need for the rest.
                        break Ok(());
                    }
                    let now = done.min(size) * 10 / size.max(1);
                    if now > tenth {
                        tenth = now;
                        (from.progress)(&format!(
                            "{}: {}% ({} of {} MiB)",
                            want.name,
                            now * 10,
                            done >> 20,
                            size >> 20
                        ));
                    }
                }
                Ok(None) => break Ok(()),
                Err(err) => break Err(err),
            }
        };
        out.sync_all().await.map_err(io_err("syncing", dest))?;
        drop(out);
        let stopped = match body {
            Err(err) => Some(causes(&err)),
            Ok(()) if done < size => Some("the body ended early".to_string()),
            Ok(()) => None,
        };
        if let Some(err) = stopped {
            (from.progress)(&format!("{}: stopped at {done} bytes: {err}", want.name));
            failed(&mut failures, err)?;
        }
    }
}

/// An error with its causes, `: `-separated (reqwest's own message is
/// brief: the cause says what happened).
fn causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

/// The first byte of a `Content-Range: bytes START-END/TOTAL`.
fn range_start(value: Option<&reqwest::header::HeaderValue>) -> Option<u64> {
    let text = value?.to_str().ok()?;
    let range = text.strip_prefix("bytes ")?;
    range.split('-').next()?.trim().parse().ok()
}

/// A `Retry-After` in seconds; 5 s when absent or a date.
fn retry_after(value: Option<&reqwest::header::HeaderValue>) -> Duration {
    let secs = value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(5);
    Duration::from_secs(secs.max(1))
}

/// Whether `name` names a file directly in a folder.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

fn plain_checked(slug: &str) -> Result<&str, SyncError> {
    if plain_name(slug) && !slug.starts_with('.') {
        Ok(slug)
    } else {
        Err(SyncError::BadName {
            name: slug.to_string(),
        })
    }
}

/// The first way a present version folder differs from `files`, if any.
async fn mismatch(dir: &Path, files: &[HostedFile]) -> Result<Option<String>, SyncError> {
    for file in files {
        let path = dir.join(&file.name);
        let hashed = path.clone();
        let result = tokio::task::spawn_blocking(move || mprov_image::manifest::hash_file(&hashed))
            .await
            .map_err(|err| SyncError::Io {
                what: "hashing",
                path: path.clone(),
                err: std::io::Error::other(err),
            })?;
        match result {
            Err(err) => return Ok(Some(format!("{}: {err}", file.name))),
            Ok((size, sha256)) if size != file.size || sha256 != file.sha256 => {
                return Ok(Some(format!("{}: size {size}, sha256 {sha256}", file.name)));
            }
            Ok(_) => {}
        }
    }
    Ok(None)
}

async fn file_len(path: &Path) -> Result<u64, SyncError> {
    match tokio::fs::metadata(path).await {
        Ok(m) => Ok(m.len()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(err) => Err(io_err("reading", path)(err)),
    }
}

async fn truncate(path: &Path) -> Result<(), SyncError> {
    tokio::fs::File::create(path)
        .await
        .map(drop)
        .map_err(io_err("truncating", path))
}

async fn sync_dir(dir: &Path) -> Result<(), SyncError> {
    let file = tokio::fs::File::open(dir)
        .await
        .map_err(io_err("syncing", dir))?;
    file.sync_all().await.map_err(io_err("syncing", dir))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use reqwest::header::HeaderValue;
    use serde_json::json;
    use tokio::io::AsyncReadExt as _;

    #[test]
    fn content_range_and_retry_after_parse() {
        let v = HeaderValue::from_static("bytes 100-999/1000");
        assert_eq!(range_start(Some(&v)), Some(100));
        assert_eq!(
            range_start(Some(&HeaderValue::from_static("bytes */1000"))),
            None
        );
        assert_eq!(range_start(None), None);
        assert_eq!(
            retry_after(Some(&HeaderValue::from_static("12"))),
            Duration::from_secs(12)
        );
        assert_eq!(
            retry_after(Some(&HeaderValue::from_static(
                "Wed, 21 Oct 2015 07:28:00 GMT"
            ))),
            Duration::from_secs(5)
        );
        assert_eq!(retry_after(None), Duration::from_secs(5));
    }

    #[test]
    fn recorded_files_must_be_of_the_version_and_some() {
        let file = HostedFile {
            name: "rootfs.tar.zst".into(),
            size: 3,
            sha256: "ab".into(),
        };
        let of = |version, files: Vec<HostedFile>| ImageFiles {
            image: "compute".into(),
            version,
            files,
        };
        let checked = checked_files(of(2, vec![file.clone()]), 2).unwrap();
        assert_eq!(checked.len(), 1);
        assert_eq!(checked[0], file);
        assert!(checked_files(of(3, vec![file]), 2).is_err());
        let err = checked_files(of(2, vec![]), 2).unwrap_err().to_string();
        assert!(err.contains("not published yet"), "{err}");
    }

    #[test]
    fn file_names_stay_in_their_folder() {
        for good in ["rootfs.tar.zst", "vmlinuz", "initramfs.img", ".x"] {
            assert!(plain_name(good), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "/etc/passwd", "a\0b"] {
            assert!(!plain_name(bad), "{bad:?}");
        }
        assert!(plain_checked(".sync-1").is_err());
    }

    /// A server answering each connection with the next scripted bytes
    /// (then closing it), keeping each request's head.
    async fn scripted(answers: Vec<Vec<u8>>) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let heads = Arc::new(Mutex::new(Vec::new()));
        let kept = heads.clone();
        tokio::spawn(async move {
            for answer in answers {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if conn.read(&mut byte).await.unwrap() == 0 {
                        break;
                    }
                    head.push(byte[0]);
                }
                kept.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).to_ascii_lowercase());
                conn.write_all(&answer).await.unwrap();
                conn.shutdown().await.unwrap();
            }
        });
        (base, heads)
    }

    #[tokio::test]
    async fn a_busy_source_is_waited_out_and_a_dropped_body_resumed() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let source = dir.path().join("source");
        std::fs::write(&source, &data).unwrap();
        let (size, sha256) = mprov_image::manifest::hash_file(&source).unwrap();
        let file = HostedFile {
            name: "rootfs.tar.zst".into(),
            size,
            sha256: sha256.clone(),
        };
        let manifest = Manifest {
            format: mprov_image::manifest::FORMAT,
            slug: "compute".into(),
            version: 2,
            created: "2026-12-03T00:00:00Z".into(),
            source: "dir:/x".into(),
            kernel_version: None,
            uncompressed_size: 1,
            file_count: 1,
            artifacts: vec![mprov_image::Artifact {
                name: file.name.clone(),
                size,
                sha256,
            }],
        }
        .to_json();
        let half = data.len() / 2;
        let len = data.len();
        let mut dropped = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n").into_bytes();
        dropped.extend_from_slice(&data[..half]);
        let mut rest = format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {half}-{}/{len}\r\nContent-Length: {}\r\n\r\n",
            len - 1,
            len - half
        )
        .into_bytes();
        rest.extend_from_slice(&data[half..]);
        let mut manifest_answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            manifest.len()
        )
        .into_bytes();
        manifest_answer.extend_from_slice(manifest.as_bytes());
        let (base, heads) = scripted(vec![
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"
                .to_vec(),
            dropped,
            rest,
            manifest_answer,
        ])
        .await;

        let ctx = SyncContext::new(dir.path().join("export"));
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = lines.clone();
        let progress = move |l: &str| sink.lock().unwrap().push(l.to_string());
        let http = http_client().unwrap();
        let copied = copy_version(&ctx, &http, &[base], "compute", 2, &[file], &progress)
            .await
            .unwrap();
        assert_eq!(std::fs::read(copied.join("rootfs.tar.zst")).unwrap(), data);
        assert_eq!(
            std::fs::read_to_string(copied.join(MANIFEST)).unwrap(),
            manifest
        );
        let heads = heads.lock().unwrap().clone();
        assert_eq!(heads.len(), 4, "{heads:#?}");
        assert!(!heads[1].contains("range:"), "{}", heads[1]);
        assert!(
            heads[2].contains(&format!("range: bytes={half}-\r\n")),
            "{}",
            heads[2]
        );
        assert!(heads[3].starts_with("get /images/compute/2/manifest.json "));
        let lines = lines.lock().unwrap().clone();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("the source is busy: waiting 1 s")),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("resuming at {half} of {len} bytes"))),
            "{lines:#?}"
        );
    }

    #[test]
    fn job_parameters_parse() {
        let p: SyncParams =
            serde_json::from_value(json!({"image": "compute", "version": 3, "from": "js1"}))
                .unwrap();
        assert_eq!(
            (p.image.as_str(), p.version, p.from.as_str()),
            ("compute", 3, "js1")
        );
        assert!(serde_json::from_value::<SyncParams>(json!({"image": "compute"})).is_err());
    }
}
