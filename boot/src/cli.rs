//! `mprov-jobserver`: starts the boot services on one host and feeds them the
//! boot config, followed live from the control service or read from a file.
//!
//! Every server is optional (`--no-dhcp`, ...), binds where it is told, and
//! stops on SIGTERM or Ctrl-C after in-flight work drains.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use mprov_api::boot::BootConfig;
use mprov_api::client::{Auth, Client};
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{events, identity, snapshot};

/// The mProv job server: DHCP, TFTP, DNS and HTTP image servers for network
/// boot, answering from the control service's inventory.
///
/// Give either --control-url to follow the control service, or --boot-config
/// FILE to serve a fixed snapshot (standalone mode).
///
/// Over HTTPS the job server authenticates with its own certificate: the
/// first start enrolls with a one-time token (--enroll-token, or the file the
/// control service leaves for the job server on its own host) and keeps the
/// certificate in the state folder. Over HTTP, or before enrolling, it uses
/// the API key.
#[derive(Debug, Parser)]
#[command(name = "mprov-jobserver", version)]
pub struct Cli {
    /// The control service's URL, e.g. http://10.0.0.1:8080.
    #[arg(long, env = "MPROV_URL", conflicts_with = "boot_config")]
    control_url: Option<String>,
    /// The API key (default: read from --apikey-file).
    #[arg(long, env = "MPROV_APIKEY", hide_env_values = true)]
    apikey: Option<String>,
    /// A file holding `export MPROV_APIKEY=<key>`, as the control service
    /// writes for the job server on its own host.
    #[arg(long, default_value = "/etc/mprov/apikey")]
    apikey_file: PathBuf,
    /// The CA certificate to trust for an https:// control URL (the control
    /// service's ca.crt).
    #[arg(
        long,
        env = "MPROV_CA_FILE",
        default_value = "/var/lib/mprov/tls/ca.crt"
    )]
    ca_file: PathBuf,
    /// A one-time enrollment token (`mprov-control enroll-token`), used once
    /// when the job server has no certificate yet.
    #[arg(long, env = "MPROV_ENROLL_TOKEN", hide_env_values = true)]
    enroll_token: Option<String>,
    /// The file holding a token, as the control service writes for the job
    /// server on its own host.
    #[arg(long, default_value = "/etc/mprov/enroll_token")]
    enroll_token_file: PathBuf,
    /// This job server's name in the inventory and in its certificate
    /// (default: the host name).
    #[arg(long, env = "MPROV_JOBSERVER_NAME")]
    name: Option<String>,
    /// Seconds between reports of this machine's load average to the
    /// control service (with the job server's certificate), by which
    /// `/ipxe/` sends nodes to the least loaded job server first. 0: never
    /// (the job server keeps the load it last reported, 0 if none).
    #[arg(long, env = "MPROV_HEARTBEAT", default_value_t = events::HEARTBEAT_EVERY.as_secs())]
    heartbeat: u64,
    /// Serve this boot config snapshot (JSON or YAML) instead of following the
    /// control service.
    #[arg(long)]
    boot_config: Option<PathBuf>,
    /// The address nodes reach this job server at (DHCP server id,
    /// next-server).
    #[arg(long, env = "MPROV_ADDRESS")]
    server_ip: Option<Ipv4Addr>,
    /// DHCP listen address.
    #[arg(long, default_value = "0.0.0.0:67")]
    dhcp: SocketAddr,
    /// Do not serve DHCP.
    #[arg(long)]
    no_dhcp: bool,
    /// The provisioning interface DHCP serves (SO_BINDTODEVICE). Broadcast
    /// replies leave through it even when the host has no route for them;
    /// without it they follow the routing table.
    #[arg(long, env = "MPROV_DHCP_INTERFACE")]
    dhcp_interface: Option<String>,
    /// proxyDHCP: hand out boot information only, beside a site's own DHCP
    /// server. Its OFFER names no boot file: PXE clients then ask on port
    /// 4011 of --server-ip (the PXE specification's boot server request) and
    /// get the boot file there.
    #[arg(long)]
    proxy_dhcp: bool,
    /// The boot URL for UEFI HTTP boot clients (architecture 16), answered
    /// with class `HTTPClient`. A network's `http_boot_url` in the boot
    /// config overrides it. Default: the x86-64 iPXE binary on this job
    /// server's image server, http://SERVER_IP:HTTP_PORT/boot/snponly.efi
    /// (none with --no-http).
    #[arg(long, env = "MPROV_HTTP_BOOT_URL")]
    http_boot_url: Option<String>,
    /// Do not send IPv6 router advertisements.
    ///
    /// By default the job server sends them on the provisioning interfaces:
    /// the --dhcp-interface, or else every interface that is up and has an
    /// IPv4 address in one of the boot config's networks. They say "no
    /// default router, no DHCPv6" and offer each /64 prefix of the interface
    /// for SLAAC (none if it has none). Without an RA on the link, iPXE waits
    /// about 13 s for IPv6 autoconfiguration before it runs its script.
    /// Needs CAP_NET_RAW.
    #[arg(long, env = "MPROV_NO_RA")]
    no_ra: bool,
    /// TFTP listen address.
    #[arg(long, default_value = "0.0.0.0:69")]
    tftp: SocketAddr,
    /// Do not serve TFTP.
    #[arg(long)]
    no_tftp: bool,
    /// The folder TFTP serves: the iPXE binaries.
    #[arg(long, default_value = "/usr/lib/ipxe")]
    tftp_root: PathBuf,
    /// DNS listen address (UDP and TCP).
    #[arg(long, default_value = "0.0.0.0:53")]
    dns: SocketAddr,
    /// Do not serve DNS.
    #[arg(long)]
    no_dns: bool,
    /// HTTP image server listen address.
    #[arg(long, default_value = "0.0.0.0:8081")]
    http: SocketAddr,
    /// Do not serve images over HTTP.
    #[arg(long)]
    no_http: bool,
    /// Image streams served at once. Beyond it a node is told `503` with a
    /// `Retry-After` (5-15 s) instead of slowing everyone down; a client that
    /// honours it (`curl --retry` does) comes back then. 64 streams share a
    /// 10 GbE link at about 150 Mbit/s each.
    #[arg(long, env = "MPROV_HTTP_MAX_STREAMS", default_value_t = mprov_fileserver::DEFAULT_MAX_STREAMS, value_parser = clap::value_parser!(usize))]
    http_max_streams: usize,
    /// Size in MiB from which an `/images/` download counts as a stream
    /// under --http-max-streams. Keep kernels and initramfs files below it:
    /// iPXE fetches those and does not retry a 503. 0 puts every download
    /// under the limit.
    #[arg(long, env = "MPROV_HTTP_STREAM_MIB", default_value_t = mprov_fileserver::DEFAULT_STREAM_THRESHOLD >> 20)]
    http_stream_mib: u64,
    /// Connections the image server keeps open at once. At the limit a new
    /// connection closes the one idle longest (waiting for a request), so
    /// a flood of idle connections cannot keep a node out; a warning says
    /// so, at most every 10 s. Lowered to what the open-file limit allows
    /// (half of it, less 256), which the job server raises to its hard
    /// limit at start.
    #[arg(long, env = "MPROV_HTTP_MAX_CONNECTIONS", default_value_t = mprov_fileserver::DEFAULT_MAX_CONNECTIONS, value_parser = clap::value_parser!(usize))]
    http_max_connections: usize,
    /// The export folder: `images/<slug>/<version>/...`
    #[arg(long, default_value = "/var/lib/mprov/export")]
    export: PathBuf,
    /// Prometheus metrics listen address (its own listener).
    #[arg(long, default_value = "127.0.0.1:9102")]
    metrics: SocketAddr,
    /// Where the DHCP lease log lives.
    #[arg(long, default_value = "/var/lib/mprov/jobserver")]
    state_dir: PathBuf,
    /// Log filter, e.g. info or mprov_dhcp=debug.
    #[arg(long, env = "MPROV_LOG", default_value = "info")]
    log: String,
}

/// Runs the command line; the process's exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    mprov_process::logging::init(&cli.log);
    match mprov_process::raise_file_limit() {
        Ok(l) if l.now > l.was => {
            tracing::info!("open-file limit raised from {} to {}", l.was, l.now)
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
    }
    // The image server gets worker threads of its own: `sendfile` reads the
    // file in the calling thread, and an image that is not in the page cache
    // stalls that thread for the length of a disk read. Those stalls must not
    // delay a DHCP, DNS or TFTP answer during a cluster-wide boot.
    let runtimes = tokio::runtime::Runtime::new().and_then(|main| {
        let http = tokio::runtime::Builder::new_multi_thread()
            .thread_name("mprov-http")
            .enable_all()
            .build()?;
        Ok((main, http))
    });
    let (runtime, http_runtime) = match runtimes {
        Ok(runtimes) => runtimes,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    mprov_process::exit(runtime.block_on(run(cli, http_runtime.handle())))
}

fn read_apikey(cli: &Cli) -> Result<String> {
    if let Some(k) = cli.apikey.as_deref().filter(|k| !k.is_empty()) {
        return Ok(k.to_owned());
    }
    let text = std::fs::read_to_string(&cli.apikey_file).with_context(|| {
        format!(
            "no API key: set MPROV_APIKEY or --apikey, or make {} (the control service writes it on its own host)",
            cli.apikey_file.display()
        )
    })?;
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("export MPROV_APIKEY=")
                .or_else(|| l.trim().strip_prefix("MPROV_APIKEY="))
        })
        .map(|k| k.trim_matches(['"', '\'']).to_owned())
        .with_context(|| {
            format!(
                "{} holds no MPROV_APIKEY=<key> line",
                cli.apikey_file.display()
            )
        })
}

/// The client the boot config is followed with: over HTTPS with this job
/// server's certificate (enrolling first if it has none and a token is at
/// hand), else with the API key. With a certificate, also what renewing it
/// needs.
async fn control_client(
    cli: &Cli,
    url: &str,
) -> Result<(Client, Option<(identity::Control, identity::Identity)>)> {
    if !url.starts_with("https://") {
        tracing::info!("following the boot config of {url} with the API key");
        return Ok((Client::new(url, Auth::ApiKey(read_apikey(cli)?))?, None));
    }
    let ca = std::fs::read_to_string(&cli.ca_file).with_context(|| {
        format!(
            "an https:// control URL needs the control service's CA certificate: copy its ca.crt to {} or give --ca-file",
            cli.ca_file.display()
        )
    })?;
    let dir = identity::dir(&cli.state_dir);
    let kept = identity::load(&dir)?;
    let token = cli
        .enroll_token
        .clone()
        .filter(|t| !t.trim().is_empty())
        .or_else(|| std::fs::read_to_string(&cli.enroll_token_file).ok())
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty());
    let name = cli.name.clone().unwrap_or_else(host_name);
    let me = match (kept, token) {
        (Some(me), _) => Some(me),
        (None, Some(token)) => Some(identity::enroll(url, &ca, &token, &name, &dir).await?),
        (None, None) => None,
    };
    match me {
        Some(me) => {
            tracing::info!(
                "following the boot config of {url} as job server {name} (client certificate)"
            );
            let control = identity::Control {
                url: url.to_owned(),
                ca_pem: ca,
                name,
                dir,
            };
            Ok((control.client(&me)?, Some((control, me))))
        }
        None => {
            tracing::warn!(
                "no certificate and no enrollment token: following {url} with the shared API key; enroll this job server with `mprov-control enroll-token`"
            );
            let client = Client::builder(url, Auth::ApiKey(read_apikey(cli)?))
                .ca_certificates_pem(ca.into_bytes())
                .build()?;
            Ok((client, None))
        }
    }
}

/// The UEFI HTTP boot URL: as given (empty: none), else the image
/// server's copy of the x86-64 iPXE binary, if the image server runs.
fn http_boot_url(cli: &Cli, server_ip: Ipv4Addr, efi_file: &str) -> Option<String> {
    match cli.http_boot_url.as_deref().map(str::trim) {
        Some("") => None,
        Some(url) => Some(url.to_owned()),
        None if cli.no_http => None,
        None => Some(format!(
            "{}/boot/{efi_file}",
            mprov_api::boot::jobserver_base_url(&server_ip.to_string(), Some(cli.http.port()))
        )),
    }
}

/// This host's short name.
fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .map(|h| h.split('.').next().unwrap_or_default().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "jobserver".into())
}

/// Runs the job server; the image server's tasks go to `http`.
async fn run(cli: Cli, http: &tokio::runtime::Handle) -> Result<()> {
    // Caught from the very start: a stop during enrollment or while waiting
    // for the control service ends the job server cleanly.
    let shutdown = CancellationToken::new();
    mprov_process::Signals::new()?.cancel_on_signal(shutdown.clone());
    let mut tasks: JoinSet<Result<()>> = JoinSet::new();

    // The boot timeline's reporter, when following the control service.
    let mut reporter: Option<watch::Receiver<Client>> = None;
    // Where the boot config comes from.
    let (tx, rx) = watch::channel(Arc::new(BootConfig {
        revision: -1,
        ..Default::default()
    }));
    let mut registry = Registry::with_prefix("mprov");
    match (&cli.boot_config, &cli.control_url) {
        (Some(path), _) => {
            let cfg = snapshot::read_file(path)?;
            tracing::info!(
                "serving the boot config in {} (revision {})",
                path.display(),
                cfg.revision
            );
            tx.send_replace(Arc::new(cfg));
        }
        (None, Some(url)) => {
            let (client, renewal) = tokio::select! {
                found = control_client(&cli, url) => found?,
                () = shutdown.cancelled() => return Ok(()),
            };
            let (clients_tx, clients) = watch::channel(client);
            reporter = Some(clients.clone());
            if let Some((control, me)) = renewal {
                let metrics = identity::CertMetrics::register(&mut registry);
                let stop = shutdown.clone();
                tasks.spawn(async move {
                    identity::keep_renewed(control, me, clients_tx, metrics, stop).await;
                    Ok(())
                });
                // Its load, for /ipxe/'s order: only its certificate names it.
                if cli.heartbeat > 0 {
                    let every = Duration::from_secs(cli.heartbeat);
                    let (clients, stop) = (clients.clone(), shutdown.clone());
                    tasks.spawn(async move {
                        events::heartbeat(clients, every, stop).await;
                        Ok(())
                    });
                }
            }
            let stop = shutdown.clone();
            tasks.spawn(async move {
                snapshot::follow_with(clients, tx, stop).await;
                Ok(())
            });
        }
        (None, None) => bail!(
            "give --control-url (MPROV_URL) to follow the control service, or --boot-config FILE"
        ),
    }

    // One queue of timeline reports (DHCP replies, boot file downloads) and
    // one task posting them, when following the control service.
    let events_tx = match reporter.clone() {
        Some(client) => {
            let (events_tx, events_rx) = mpsc::channel(events::QUEUE);
            let stop = shutdown.clone();
            tasks.spawn(async move {
                events::report(client, events_rx, stop).await;
                Ok(())
            });
            Some(events_tx)
        }
        None => None,
    };

    if !cli.no_dhcp {
        let server_ip = cli.server_ip.context(
            "DHCP needs --server-ip (MPROV_ADDRESS), the address nodes reach this job server at; or give --no-dhcp",
        )?;
        std::fs::create_dir_all(&cli.state_dir)
            .with_context(|| format!("cannot create {}", cli.state_dir.display()))?;
        let mut config = mprov_dhcp::DhcpConfig::new(server_ip);
        config.proxy = cli.proxy_dhcp;
        config.http_boot_url = http_boot_url(&cli, server_ip, &config.x64_efi_file);
        if let Some(url) = &config.http_boot_url {
            tracing::info!("UEFI HTTP boot clients get {url}");
        }
        let leases = mprov_dhcp::LeaseStore::open(
            &cli.state_dir.join("dhcp.leases"),
            mprov_dhcp::StoreOptions::default(),
        )
        .context("opening the DHCP lease log")?;
        let metrics = mprov_dhcp::Metrics::register(&mut registry);
        let mut server =
            mprov_dhcp::Server::new(config.clone(), rx.clone(), leases).with_metrics(metrics);
        if let Some(events_tx) = events_tx.clone() {
            let (sent_tx, sent_rx) = mpsc::channel(events::QUEUE);
            server = server.with_events(sent_tx);
            tasks.spawn(async move {
                events::forward_dhcp(sent_rx, events_tx).await;
                Ok(())
            });
        }
        let socket = dhcp_socket(cli.dhcp, cli.dhcp_interface.as_deref())
            .with_context(|| format!("DHCP: cannot bind {}", cli.dhcp))?;
        tracing::info!(
            "DHCP on {}{}",
            cli.dhcp,
            if cli.proxy_dhcp { " (proxyDHCP)" } else { "" }
        );
        if cli.proxy_dhcp {
            // PXE clients send their boot server request to the proxy's
            // server identifier, and iPXE and EDK2 take the answer only from
            // there: on a wildcard DHCP socket, 4011 binds that address, so
            // that replies leave from it whatever the routes say.
            let pxe_ip = if cli.dhcp.ip().is_unspecified() {
                IpAddr::V4(server_ip)
            } else {
                cli.dhcp.ip()
            };
            let pxe = SocketAddr::new(pxe_ip, mprov_dhcp::handler::PXE_PORT);
            let socket = dhcp_socket(pxe, cli.dhcp_interface.as_deref())
                .with_context(|| format!("proxyDHCP: cannot bind the PXE port {pxe}"))?;
            tracing::info!("proxyDHCP PXE boot server requests on {pxe}");
            let (server, stop) = (server.clone(), shutdown.clone());
            tasks.spawn(async move { server.run(socket, stop).await.context("proxyDHCP on 4011") });
        }
        let stop = shutdown.clone();
        tasks.spawn(async move { server.run(socket, stop).await.context("DHCP server") });
    }

    if !cli.no_ra {
        let metrics = mprov_dhcp::ra::RaMetrics::register(&mut registry);
        let named = cli.dhcp_interface.clone();
        let snapshot = rx.clone();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            router_advertisements(named, snapshot, metrics, stop)
                .await
                .context("IPv6 router advertisements")
        });
    }

    if !cli.no_tftp {
        let mut server =
            mprov_tftp::Server::new(mprov_tftp::TftpConfig::new(&cli.tftp_root), &mut registry);
        if let Some(events_tx) = events_tx.clone() {
            server = server.on_sent(move |sent| {
                if events_tx.try_send(events::from_tftp(sent)).is_err() {
                    tracing::warn!("the boot event queue is full; a TFTP report is dropped");
                }
            });
        }
        let socket = UdpSocket::bind(cli.tftp)
            .await
            .with_context(|| format!("TFTP: cannot bind {}", cli.tftp))?;
        tracing::info!("TFTP on {} serving {}", cli.tftp, cli.tftp_root.display());
        let stop = shutdown.clone();
        tasks.spawn(async move { server.run(socket, stop).await.context("TFTP server") });
    }

    if !cli.no_dns {
        let server =
            mprov_dns::Server::new(mprov_dns::DnsConfig::default(), rx.clone(), &mut registry);
        let udp = UdpSocket::bind(cli.dns)
            .await
            .with_context(|| format!("DNS: cannot bind {}", cli.dns))?;
        let tcp = TcpListener::bind(cli.dns)
            .await
            .with_context(|| format!("DNS: cannot bind TCP {}", cli.dns))?;
        tracing::info!("DNS on {}", cli.dns);
        let stop = shutdown.clone();
        tasks.spawn(async move { server.run(udp, Some(tcp), stop).await.context("DNS server") });
    }

    if !cli.no_http {
        let mut config = mprov_fileserver::Config::new(&cli.export);
        config.ipxe_dir = cli.tftp_root.clone();
        config.max_streams = cli.http_max_streams;
        config.stream_threshold = cli.http_stream_mib.saturating_mul(1 << 20);
        config.max_connections = cli.http_max_connections;
        let mut state = mprov_fileserver::ImageState::new(config, rx.clone());
        if let Some(events_tx) = events_tx.clone() {
            state = state.on_download(move |download| {
                if let Some(event) = events::from_download(download)
                    && events_tx.try_send(event).is_err()
                {
                    tracing::warn!("the boot event queue is full; a download report is dropped");
                }
            });
        }
        state.metrics().register(&mut registry);
        // Bound here, registered with the image server's runtime there.
        let listener = std::net::TcpListener::bind(cli.http)
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .with_context(|| format!("HTTP: cannot bind {}", cli.http))?;
        tracing::info!(
            "HTTP images on {} serving {}",
            cli.http,
            cli.export.display()
        );
        let stop = shutdown.clone();
        let served = http.spawn(async move {
            let listener = TcpListener::from_std(listener).context("HTTP listener")?;
            mprov_fileserver::serve(listener, state, stop)
                .await
                .context("HTTP image server")
        });
        tasks.spawn(async move { served.await.context("HTTP image server task")? });
    }

    let metrics = TcpListener::bind(cli.metrics)
        .await
        .with_context(|| format!("metrics: cannot bind {}", cli.metrics))?;
    let app = mprov_fileserver::metrics_router(Arc::new(registry));
    let stop = shutdown.clone();
    tasks.spawn(async move {
        axum::serve(metrics, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
            .context("metrics listener")
    });

    // Run until a signal, or until a server fails.
    mprov_process::run_servers(tasks, shutdown).await
}

/// Sends IPv6 router advertisements until `stop`: on `named` (the DHCP
/// interface) if given, or else on the provisioning interfaces of the first
/// boot config (which may still be on its way from the control service, so
/// this waits for it). Finding no interface is a warning, not a failure:
/// RAs only save iPXE some seconds.
async fn router_advertisements(
    named: Option<String>,
    mut snapshot: watch::Receiver<Arc<BootConfig>>,
    metrics: mprov_dhcp::ra::RaMetrics,
    stop: CancellationToken,
) -> Result<()> {
    use mprov_dhcp::ra::{self, Interface};
    let chosen = match named {
        Some(name) => {
            let iface = Interface::list()
                .context("listing the network interfaces")?
                .into_iter()
                .find(|i| i.name == name)
                .with_context(|| format!("no network interface {name}"))?;
            if !iface.up || !iface.multicast {
                tracing::warn!("{name} is down or cannot multicast: RAs may not reach anyone");
            }
            vec![iface]
        }
        None => {
            let config = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                c = snapshot.wait_for(|c| c.revision >= 0) => match c {
                    Ok(c) => Arc::clone(&c),
                    // The snapshot's sender is gone: we are shutting down.
                    Err(_) => return Ok(()),
                },
            };
            let networks: Vec<(Ipv4Addr, u8)> = config
                .networks
                .iter()
                .map(|n| (n.subnet, n.prefix))
                .collect();
            let all = Interface::list().context("listing the network interfaces")?;
            ra::provisioning_interfaces(&all, &networks)
        }
    };
    if chosen.is_empty() {
        tracing::warn!(
            "no IPv6 router advertisements: no interface is up with an IPv4 address in the boot config's networks; name one with --dhcp-interface, or give --no-ra"
        );
        stop.cancelled().await;
        return Ok(());
    }
    let mut links = Vec::new();
    let mut described = Vec::new();
    for iface in chosen {
        if iface.link_local().is_none() {
            tracing::warn!(
                "{} has no IPv6 link-local address (yet): hosts ignore RAs from any other source address",
                iface.name
            );
        }
        let prefixes: Vec<String> = iface.prefixes().iter().map(|p| format!("{p}/64")).collect();
        described.push(if prefixes.is_empty() {
            format!("{} (no IPv6 prefix)", iface.name)
        } else {
            format!("{} (prefix {})", iface.name, prefixes.join(", "))
        });
        let socket = ra::open_socket(&iface).with_context(|| {
            format!(
                "cannot open a raw ICMPv6 socket on {} (needs CAP_NET_RAW; --no-ra turns RAs off)",
                iface.name
            )
        })?;
        links.push((iface, socket));
    }
    tracing::info!(
        "IPv6 router advertisements (router lifetime 0: no default route) on {}",
        described.join(", ")
    );
    ra::Server::new(ra::RaConfig::default())
        .with_metrics(metrics)
        .run(links, stop)
        .await?;
    Ok(())
}

/// A DHCP socket: broadcast allowed, address reusable (a proxyDHCP and a
/// site's server may share the host), bound to one interface when asked.
fn dhcp_socket(addr: SocketAddr, interface: Option<&str>) -> Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_address(true)?;
    socket.set_broadcast(true)?;
    if let Some(name) = interface {
        socket
            .bind_device(Some(name.as_bytes()))
            .with_context(|| format!("cannot bind to interface {name}"))?;
    }
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    Ok(UdpSocket::from_std(socket.into())?)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn http_boot_url_defaults_to_the_image_server() {
        let ip = "10.0.0.1".parse().unwrap();
        let url = |args: &[&str]| {
            let mut argv = vec!["mprov-jobserver", "--boot-config", "b.json"];
            argv.extend_from_slice(args);
            super::http_boot_url(&Cli::try_parse_from(argv).unwrap(), ip, "snponly.efi")
        };
        assert_eq!(
            url(&[]).as_deref(),
            Some("http://10.0.0.1:8081/boot/snponly.efi")
        );
        assert_eq!(
            url(&["--http", "0.0.0.0:80"]).as_deref(),
            Some("http://10.0.0.1:80/boot/snponly.efi")
        );
        assert_eq!(url(&["--no-http"]), None);
        assert_eq!(
            url(&["--http-boot-url", "http://x/y.efi"]).as_deref(),
            Some("http://x/y.efi")
        );
        assert_eq!(url(&["--http-boot-url", ""]), None);
    }

    #[test]
    fn router_advertisements_are_on_unless_no_ra() {
        let on = Cli::try_parse_from(["mprov-jobserver", "--boot-config", "b.json"]).unwrap();
        assert!(!on.no_ra);
        let off =
            Cli::try_parse_from(["mprov-jobserver", "--boot-config", "b.json", "--no-ra"]).unwrap();
        assert!(off.no_ra);
    }
}
