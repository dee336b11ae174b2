//! image-sync over HTTPS between job servers, against a real control
//! service on HTTPS and a real `mprov-jobserver` as the source (enrolled,
//! registered on 127.0.0.1, its plain HTTP image server off): the copying
//! side (job server js2, enrolled with its own token) copies over the
//! source's HTTPS listener with its certificate, continuing a partial file
//! with a `Range` request (the source's byte counter shows only the missing
//! bytes sent); `curl` with a node's certificate (signed by the same CA)
//! or with none is refused by the listener, and with js2's is served; a
//! server whose certificate is not from the control CA, or is another job
//! server's, is refused by the copying side.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use mprov_api::boot::BootConfig;
use mprov_api::client::{Auth, Client};
use mprov_boot::modules::image_sync::{SyncContext, SyncTls, copy_version, transport};
use mprov_boot::modules::image_update::hosted_files;
use mprov_fileserver::{Config, ImageState, serve_tls};
use mprov_image::{BuildOptions, KernelChoice, PackOptions, Recipe, Source};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::image_update::{root, snapshot};
use crate::{TlsControl, insert_api_key, listen_file, plain};

/// A progress sink that keeps the lines.
fn lines() -> (
    Arc<Mutex<Vec<String>>>,
    impl Fn(&str) + Send + Sync + 'static,
) {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let sink = kept.clone();
    (kept, move |line: &str| {
        sink.lock().unwrap().push(line.to_string())
    })
}

/// The bytes the source's image server sent, from its metrics.
async fn served_bytes(metrics: SocketAddr) -> Result<u64> {
    let text = reqwest::get(format!("http://{metrics}/metrics"))
        .await?
        .text()
        .await?;
    text.lines()
        // The job server's registry prefixes `mprov_` once more.
        .find_map(|l| l.strip_prefix("mprov_http_served_bytes_total "))
        .with_context(|| format!("no mprov_http_served_bytes_total in\n{text}"))?
        .trim()
        .parse()
        .context("the byte counter")
}

/// A certificate and key (PEM files in `dir`) for `uri`, signed by the CA in
/// `tls` (its `ca.crt` and `ca.key`) or, without one, self-signed.
fn certificate(dir: &Path, name: &str, uri: &str, tls: Option<&Path>) -> Result<(String, String)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.subject_alt_names = vec![rcgen::SanType::URI(uri.try_into()?)];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = match tls {
        Some(tls) => {
            let ca_key = rcgen::KeyPair::from_pem(&fs::read_to_string(tls.join("ca.key"))?)?;
            let issuer =
                rcgen::Issuer::from_ca_cert_pem(&fs::read_to_string(tls.join("ca.crt"))?, ca_key)?;
            params.signed_by(&key, &issuer)?
        }
        None => params.self_signed(&key)?,
    };
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    fs::write(&c, cert.pem())?;
    fs::write(&k, key.serialize_pem())?;
    Ok((c.display().to_string(), k.display().to_string()))
}

/// `curl` GETting `url` (its certificate not checked: the listener's
/// refusal is what is tested) with the client certificate `cert`, if any;
/// the HTTP status it got, or its error.
fn curl(url: &str, cert: Option<&(String, String)>) -> Result<u16, String> {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "-k",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "10",
    ]);
    if let Some((c, k)) = cert {
        cmd.args(["--cert", c, "--key", k]);
    }
    let out = cmd.arg(url).output().map_err(|e| e.to_string())?;
    let code = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() {
        code.parse().map_err(|_| code)
    } else {
        Err(format!(
            "curl failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// An HTTPS image server in process, serving `export` with the TLS of the
/// identity folder `identity` (a job server's listener, as `--https` sets
/// it up); its port.
async fn listener_with(
    ca_pem: &str,
    identity: &Path,
    export: &Path,
    stop: &CancellationToken,
) -> Result<u16> {
    let tls = mprov_boot::tls::server_config(ca_pem, identity.to_owned())?;
    let (_tx, rx) = watch::channel(Arc::new(BootConfig::default()));
    let state = ImageState::new(Config::new(export), rx);
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(serve_tls(listener, tls, state, stop.clone()));
    Ok(port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_sync_goes_over_https_resumes_and_checks_both_certificates() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path().to_owned();
    let control = TlsControl::start(&d, &[]).await;
    let ca_file = d.join("tls/ca.crt");

    // The source's export: version 1 of `compute`, with a kernel.
    let export = d.join("export");
    let src_root = d.join("root");
    root(&src_root, 1, 3)?;
    let kernel = d.join("vmlinuz-6.1.0-test");
    fs::write(&kernel, mprov_tests::loopfs::noise(98, 300_000))?;
    let built = mprov_image::build(
        &Recipe {
            slug: "compute".into(),
            source: Source::Dir(src_root),
            scripts: Vec::new(),
        },
        &BuildOptions {
            out: export.join("images"),
            version: Some(1),
            kernel: KernelChoice::File(kernel),
            agent: None,
            pack: PackOptions {
                threads: 2,
                ..PackOptions::default()
            },
            steps: None,
            scripts: None,
        },
    )?;
    let files = hosted_files(&built.manifest);
    let original = snapshot(&built.dir)?;
    let rootfs = original[Path::new("rootfs.tar.zst")].clone();
    let kernel_len = original[Path::new("vmlinuz")].len();
    let manifest_len = original[Path::new("manifest.json")].len();

    // The source: the real job server js1, HTTP off, HTTPS on (on
    // 127.0.0.1:0, as `follower_command` gives it).
    let log = d.join("js1.log");
    let export_arg = export.display().to_string();
    let mut js1 = control
        .start_jobserver(
            &d,
            &log,
            &[
                "--export",
                &export_arg,
                "--address",
                "127.0.0.1",
                "--heartbeat",
                "0",
            ],
        )
        .await;
    let bound = {
        let file = listen_file(&d);
        let log = log.clone();
        let child = &mut js1.0;
        mprov_tests::listen::wait(&file, child, Duration::from_secs(60))
            .with_context(|| plain(&fs::read_to_string(&log).unwrap_or_default()))?
    };
    let https = bound.get("https")?;
    ensure!(
        bound.get("http").is_err(),
        "the source serves plain HTTP: {bound:?}"
    );
    let metrics = bound.get("metrics")?;

    // js2, the copying side: enrolled with a token of its own.
    let token2 =
        mprov_control::enrollment::create_token(&control.db, "js2", Duration::from_secs(3600))
            .await?
            .token;
    let js2_dir = d.join("js2/identity");
    mprov_boot::identity::enroll(&control.url, &control.ca_pem, &token2, "js2", &js2_dir).await?;

    // An admin's view of the inventory; js1's row is its registration.
    let key = insert_api_key(&control.db, "admin").await;
    let admin = Client::builder(&control.url, Auth::ApiKey(key.key))
        .ca_certificates_pem(control.ca_pem.clone().into_bytes())
        .build()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let row = admin.get("jobservers", "js1").await;
        if let Ok(row) = &row
            && row["addresses"].as_array().is_some_and(|a| !a.is_empty())
        {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "js1 did not register: {row:?}\n{}",
            plain(&fs::read_to_string(&log).unwrap_or_default())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // 1. Over HTTPS, continuing a partial root archive.
    let target = d.join("target");
    let ctx = SyncContext {
        tls: Some(SyncTls {
            identity_dir: js2_dir.clone(),
            ca_file: Some(ca_file.clone()),
            port: https.port(),
        }),
        ..SyncContext::new(&target)
    };
    let (kept, sink) = lines();
    let (http, sources) = transport(&ctx, &admin, "js1", &sink).await?;
    ensure!(
        sources == [format!("https://127.0.0.1:{}", https.port())],
        "{sources:?}"
    );
    let temp = target.join("images/compute/.sync-1");
    fs::create_dir_all(&temp)?;
    let half = rootfs.len() / 2;
    fs::write(temp.join("rootfs.tar.zst"), &rootfs[..half])?;
    ensure!(served_bytes(metrics).await? == 0);
    let copied = copy_version(&ctx, &http, &sources, "compute", 1, &files, &sink).await?;
    ensure!(snapshot(&copied)? == original, "the copy differs");
    let kept = kept.lock().unwrap().clone();
    ensure!(
        kept.iter()
            .any(|l| l.contains(&format!("rootfs.tar.zst: resuming at {half} of"))),
        "{kept:#?}"
    );
    ensure!(
        kept.iter().any(|l| l.contains("copying over HTTPS")),
        "{kept:#?}"
    );
    let sent = served_bytes(metrics).await?;
    let due = (rootfs.len() - half + kernel_len + manifest_len) as u64;
    ensure!(
        sent == due,
        "the source sent {sent} bytes; the rest of the root archive, the kernel and the manifest are {due}"
    );

    // 2. The listener: a node's certificate from the same CA, or none, is
    // refused in the handshake; a job server's is served.
    let url = format!("https://{https}/images/compute/1/manifest.json");
    let js2_cert = (
        js2_dir
            .join(mprov_boot::identity::CERT_FILE)
            .display()
            .to_string(),
        js2_dir
            .join(mprov_boot::identity::KEY_FILE)
            .display()
            .to_string(),
    );
    ensure!(
        curl(&url, Some(&js2_cert)) == Ok(200),
        "{:?}",
        curl(&url, Some(&js2_cert))
    );
    let node = certificate(&d, "c01", "urn:mprov:node:c01", Some(&d.join("tls")))?;
    let refused = curl(&url, Some(&node));
    ensure!(
        refused.is_err(),
        "a node's certificate was served: {refused:?}"
    );
    let refused = curl(&url, None);
    ensure!(refused.is_err(), "no certificate was served: {refused:?}");
    let forged = certificate(&d, "forged", "urn:mprov:jobserver:js9", None)?;
    let refused = curl(&url, Some(&forged));
    ensure!(
        refused.is_err(),
        "a self-signed job server certificate was served: {refused:?}"
    );
    // Logged as each handshake fails, which may be after curl has given up.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = plain(&fs::read_to_string(&log)?);
        if text.matches("HTTPS file server: refused").count() >= 3 {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "the refusals are not logged:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 3. The copying side: a server whose certificate is not from the
    // control CA, and one that is job server js2 rather than js1.
    let stop = CancellationToken::new();
    let rogue_dir = d.join("rogue");
    fs::create_dir_all(&rogue_dir)?;
    let (c, k) = certificate(&rogue_dir, "jobserver", "urn:mprov:jobserver:js1", None)?;
    fs::rename(&c, rogue_dir.join(mprov_boot::identity::CERT_FILE))?;
    fs::rename(&k, rogue_dir.join(mprov_boot::identity::KEY_FILE))?;
    let rogue = listener_with(&control.ca_pem, &rogue_dir, &export, &stop).await?;
    let other = listener_with(&control.ca_pem, &js2_dir, &export, &stop).await?;
    for (port, what) in [(rogue, "UnknownIssuer"), (other, "not js1")] {
        let target = d.join(format!("target-{port}"));
        let ctx = SyncContext {
            attempts: 1,
            ..SyncContext::new(&target)
        };
        let (_, sink) = lines();
        let sources = [format!("https://127.0.0.1:{port}")];
        match copy_version(&ctx, &http, &sources, "compute", 1, &files, &sink).await {
            Ok(dir) => bail!("copied from a server that is not js1 to {}", dir.display()),
            Err(err) => ensure!(format!("{err}").contains(what), "{err}"),
        }
        ensure!(!target.join("images/compute/1").exists());
    }
    stop.cancel();
    drop(js1);
    control.stop().await;
    Ok(())
}
