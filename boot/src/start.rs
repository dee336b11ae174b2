//! The job server's start-up, one step per server: [`Start`] gathers the
//! running tasks, the metrics registry and the addresses bound, and each
//! step binds its sockets (failing at once if it cannot), spawns its server
//! and notes where it listens. [`Start::run`] then writes the
//! `--listen-file` ([`Listening`]) and runs everything until a signal or a
//! failure. `cli::run` calls the steps in order.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use mprov_api::boot::{BootConfig, BootEventReport};
use mprov_api::client::Client;
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cli::Cli;
use crate::{events, identity};

/// The metrics listener's limits: a few scrapers, each of which must start
/// a request soon after connecting.
const METRICS_LIMITS: mprov_process::listen::Limits = mprov_process::listen::Limits {
    max: 64,
    first_request: Duration::from_secs(10),
    idle: Duration::from_secs(60),
};

/// The current boot config, as every server reads it.
pub type Snapshot = watch::Receiver<Arc<BootConfig>>;

/// Where to queue boot timeline reports, when following the control service.
pub type Reports = Option<mpsc::Sender<BootEventReport>>;

/// The addresses the job server bound, by server: what `--listen-file`
/// holds, written once every socket is bound, as one JSON object from a
/// server's name to its `ip:port`, only for the servers that run. The
/// names: `dhcp`, `pxe` (proxyDHCP's port 4011), `tftp`, `dns` (UDP and
/// TCP on the same port), `http` (the image server), `https` (its TLS
/// listener for other job servers) and `metrics`. For
/// example `{"dns":"127.0.0.1:40531","http":"127.0.0.1:41871","metrics":"127.0.0.1:9102"}`.
pub type Listening = BTreeMap<&'static str, SocketAddr>;

/// The job server while it starts.
#[derive(Debug)]
pub struct Start {
    /// Cancelled on SIGTERM or Ctrl-C (caught from [`Start::new`] on).
    shutdown: CancellationToken,
    tasks: JoinSet<Result<()>>,
    registry: Registry,
    listening: Listening,
    /// A fixed boot config's sender, kept while the servers run: a closed
    /// channel would tell them the job server is shutting down.
    fixed: Option<watch::Sender<Arc<BootConfig>>>,
    /// Following the control service with a client certificate (enrolled).
    enrolled: bool,
    /// The image server's open streams, for the heartbeats.
    streams: crate::daemon::Streams,
}

impl Start {
    /// Nothing started yet; a signal from now on stops the job server
    /// cleanly, even during enrollment or while waiting for the control
    /// service.
    pub fn new() -> Result<Start> {
        let shutdown = CancellationToken::new();
        mprov_process::Signals::new()?.cancel_on_signal(shutdown.clone());
        Ok(Start {
            shutdown,
            tasks: JoinSet::new(),
            registry: Registry::with_prefix("mprov"),
            listening: Listening::new(),
            fixed: None,
            enrolled: false,
            streams: crate::daemon::Streams::default(),
        })
    }

    /// Cancelled once a signal came.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// A fixed boot config: the snapshot every server reads.
    pub fn fixed(&mut self, config: BootConfig) -> Snapshot {
        let (tx, snapshot) = watch::channel(Arc::new(config));
        self.fixed = Some(tx);
        snapshot
    }

    /// Follows the control service with `client`: a task keeps the snapshot
    /// up to date, and with this job server's certificate (`renewal`)
    /// another keeps it renewed (the heartbeats are [`Start::daemon`]'s).
    /// The snapshot, and the client to report the timeline with (as
    /// renewed).
    pub fn follow(
        &mut self,
        client: Client,
        renewal: Option<(identity::Control, identity::Identity)>,
    ) -> (Snapshot, watch::Receiver<Client>) {
        let (tx, snapshot) = watch::channel(Arc::new(BootConfig {
            revision: -1,
            ..Default::default()
        }));
        let (clients_tx, clients) = watch::channel(client);
        if let Some((control, me)) = renewal {
            let metrics = identity::CertMetrics::register(&mut self.registry);
            let stop = self.shutdown.clone();
            self.tasks.spawn(async move {
                identity::keep_renewed(control, me, clients_tx, metrics, stop).await;
                Ok(())
            });
            self.enrolled = true;
        }
        let (followed, stop) = (clients.clone(), self.shutdown.clone());
        self.tasks.spawn(async move {
            crate::snapshot::follow_with(followed, tx, stop).await;
            Ok(())
        });
        (snapshot, clients)
    }

    /// One queue of timeline reports (DHCP replies, boot file downloads) and
    /// one task posting them with `client`, when following the control
    /// service; none otherwise.
    pub fn timeline_reports(&mut self, client: Option<watch::Receiver<Client>>) -> Reports {
        let client = client?;
        let (tx, rx) = mpsc::channel(events::QUEUE);
        let stop = self.shutdown.clone();
        self.tasks.spawn(async move {
            events::report(client, rx, stop).await;
            Ok(())
        });
        Some(tx)
    }

    /// The image server: HTTP on `--http` unless `--no-http`, and HTTPS for
    /// other job servers on `--https` when enrolled and not `--no-https`
    /// (one state: one stream limit, one set of metrics), its tasks on
    /// `runtime`; the address HTTP bound.
    pub fn image_server(
        &mut self,
        cli: &Cli,
        snapshot: &Snapshot,
        reports: &Reports,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Option<SocketAddr>> {
        let https = !cli.no_https && self.enrolled;
        if cli.no_http && !https {
            return Ok(None);
        }
        let mut config = mprov_fileserver::Config::new(&cli.export);
        config.ipxe_dir = cli.tftp_root.clone();
        config.max_streams = cli.http_max_streams;
        config.stream_threshold = cli.http_stream_mib.saturating_mul(1 << 20);
        config.max_connections = cli.http_max_connections;
        let mut state = mprov_fileserver::ImageState::new(config, snapshot.clone());
        if let Some(reports) = reports.clone() {
            state = state.on_download(move |download| {
                if let Some(event) = events::from_download(download)
                    && reports.try_send(event).is_err()
                {
                    tracing::warn!("the boot event queue is full; a download report is dropped");
                }
            });
        }
        state.metrics().register(&mut self.registry);
        self.streams = crate::daemon::Streams::of(state.metrics());
        if https {
            self.https_images(cli, state.clone(), runtime)?;
        }
        if cli.no_http {
            return Ok(None);
        }
        // Bound here, registered with the image server's runtime there.
        let listener = std::net::TcpListener::bind(cli.http)
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .with_context(|| format!("HTTP: cannot bind {}", cli.http))?;
        let bound = listener.local_addr()?;
        tracing::info!("HTTP images on {bound} serving {}", cli.export.display());
        let stop = self.shutdown.clone();
        let served = runtime.spawn(async move {
            let listener = TcpListener::from_std(listener).context("HTTP listener")?;
            mprov_fileserver::serve(listener, state, stop)
                .await
                .context("HTTP image server")
        });
        self.tasks
            .spawn(async move { served.await.context("HTTP image server task")? });
        self.listening.insert("http", bound);
        Ok(Some(bound))
    }

    /// The HTTPS image listener on `--https` for other job servers'
    /// `image-sync`, with this job server's certificate ([`crate::tls`]).
    fn https_images(
        &mut self,
        cli: &Cli,
        state: mprov_fileserver::ImageState,
        runtime: &tokio::runtime::Handle,
    ) -> Result<()> {
        let ca = crate::config::ca_bundle(cli.ca_file.as_deref())?;
        let tls = crate::tls::server_config(&ca, identity::dir(&cli.state_dir))
            .context("HTTPS images")?;
        let listener = std::net::TcpListener::bind(cli.https)
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .with_context(|| format!("HTTPS: cannot bind {}", cli.https))?;
        let bound = listener.local_addr()?;
        tracing::info!(
            "HTTPS images for other job servers on {bound} serving {}",
            cli.export.display()
        );
        let stop = self.shutdown.clone();
        let served = runtime.spawn(async move {
            let listener = TcpListener::from_std(listener).context("HTTPS listener")?;
            mprov_fileserver::serve_tls(listener, tls, state, stop)
                .await
                .context("HTTPS image server")
        });
        self.tasks
            .spawn(async move { served.await.context("HTTPS image server task")? });
        self.listening.insert("https", bound);
        Ok(())
    }

    /// The DHCP server on `--dhcp` (and proxyDHCP's PXE port), for nodes
    /// that reach this job server at `server_ip`, sending UEFI HTTP boot
    /// clients to `http_boot_url`; its leases in `--state-dir`.
    pub fn dhcp(
        &mut self,
        cli: &Cli,
        server_ip: Ipv4Addr,
        http_boot_url: impl FnOnce(&str) -> Option<String>,
        snapshot: &Snapshot,
        reports: &Reports,
    ) -> Result<()> {
        std::fs::create_dir_all(&cli.state_dir)
            .with_context(|| format!("cannot create {}", cli.state_dir.display()))?;
        let mut config = mprov_dhcp::DhcpConfig::new(server_ip);
        config.proxy = cli.proxy_dhcp;
        config.http_boot_url = http_boot_url(&config.x64_efi_file);
        if let Some(url) = &config.http_boot_url {
            tracing::info!("UEFI HTTP boot clients get {url}");
        }
        let leases = mprov_dhcp::LeaseStore::open(
            &cli.state_dir.join("dhcp.leases"),
            mprov_dhcp::StoreOptions::default(),
        )
        .context("opening the DHCP lease log")?;
        let metrics = mprov_dhcp::Metrics::register(&mut self.registry);
        let mut server =
            mprov_dhcp::Server::new(config, snapshot.clone(), leases).with_metrics(metrics);
        if let Some(reports) = reports.clone() {
            let (sent_tx, sent_rx) = mpsc::channel(events::QUEUE);
            server = server.with_events(sent_tx);
            let again = server.recent_acks(
                mprov_dhcp::store::unix_now(),
                mprov_api::boot::ATTEST_WINDOW,
            );
            self.tasks.spawn(async move {
                events::report_again(again, &reports).await;
                events::forward_dhcp(sent_rx, reports).await;
                Ok(())
            });
        }
        let interface = cli.dhcp_interface.as_deref();
        let socket = dhcp_socket(cli.dhcp, interface)
            .with_context(|| format!("DHCP: cannot bind {}", cli.dhcp))?;
        let bound = socket.local_addr()?;
        tracing::info!(
            "DHCP on {bound}{}",
            if cli.proxy_dhcp { " (proxyDHCP)" } else { "" }
        );
        self.listening.insert("dhcp", bound);
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
            let socket = dhcp_socket(pxe, interface)
                .with_context(|| format!("proxyDHCP: cannot bind the PXE port {pxe}"))?;
            tracing::info!("proxyDHCP PXE boot server requests on {pxe}");
            self.listening.insert("pxe", socket.local_addr()?);
            let (server, stop) = (server.clone(), self.shutdown.clone());
            self.tasks
                .spawn(async move { server.run(socket, stop).await.context("proxyDHCP on 4011") });
        }
        let stop = self.shutdown.clone();
        self.tasks
            .spawn(async move { server.run(socket, stop).await.context("DHCP server") });
        Ok(())
    }

    /// IPv6 router advertisements on `--dhcp-interface`, or else on the
    /// provisioning interfaces of the first boot config (waited for); none
    /// found is a warning, not a failure.
    pub fn router_advertisements(&mut self, cli: &Cli, snapshot: &Snapshot) {
        let metrics = mprov_dhcp::ra::RaMetrics::register(&mut self.registry);
        let named = cli.dhcp_interface.clone();
        let (snapshot, stop) = (snapshot.clone(), self.shutdown.clone());
        self.tasks.spawn(async move {
            router_advertisements(named, snapshot, metrics, stop)
                .await
                .context("IPv6 router advertisements")
        });
    }

    /// The TFTP server on `--tftp`, serving `--tftp-root`.
    pub async fn tftp(&mut self, cli: &Cli, reports: &Reports) -> Result<()> {
        let mut server = mprov_tftp::Server::new(
            mprov_tftp::TftpConfig::new(&cli.tftp_root),
            &mut self.registry,
        );
        if let Some(reports) = reports.clone() {
            server = server.on_sent(move |sent| {
                if reports.try_send(events::from_tftp(sent)).is_err() {
                    tracing::warn!("the boot event queue is full; a TFTP report is dropped");
                }
            });
        }
        let socket = UdpSocket::bind(cli.tftp)
            .await
            .with_context(|| format!("TFTP: cannot bind {}", cli.tftp))?;
        let bound = socket.local_addr()?;
        tracing::info!("TFTP on {bound} serving {}", cli.tftp_root.display());
        self.listening.insert("tftp", bound);
        let stop = self.shutdown.clone();
        self.tasks
            .spawn(async move { server.run(socket, stop).await.context("TFTP server") });
        Ok(())
    }

    /// The DNS server on `--dns`, UDP and TCP on the same port (the UDP
    /// socket's, when the port asked for is 0).
    pub async fn dns(&mut self, cli: &Cli, snapshot: &Snapshot) -> Result<()> {
        let server = mprov_dns::Server::new(
            mprov_dns::DnsConfig::default(),
            snapshot.clone(),
            &mut self.registry,
        );
        let (udp, tcp) = mprov_dns::bind(cli.dns)
            .await
            .with_context(|| format!("DNS: cannot bind UDP and TCP {}", cli.dns))?;
        let bound = udp.local_addr()?;
        tracing::info!("DNS on {bound}");
        self.listening.insert("dns", bound);
        let stop = self.shutdown.clone();
        self.tasks
            .spawn(async move { server.run(udp, Some(tcp), stop).await.context("DNS server") });
        Ok(())
    }

    /// The daemon ([`crate::daemon`]) following the control service with
    /// `clients`: registration, heartbeats and jobs once enrolled (only a
    /// client certificate names the job server), and `libgenders` if
    /// listed.
    pub fn daemon(
        &mut self,
        cli: &Cli,
        clients: watch::Receiver<Client>,
        snapshot: &Snapshot,
        port: u16,
    ) -> Result<()> {
        let mut daemon = crate::daemon::Daemon::from_cli(cli, port, self.enrolled)?;
        if !self.enrolled {
            if !daemon.job_modules.is_empty() {
                tracing::warn!(
                    "no client certificate: not taking jobs (only an enrolled job server can)"
                );
            }
            daemon.job_modules.clear();
            daemon.heartbeat = Duration::ZERO;
        }
        let (snapshot, streams) = (snapshot.clone(), self.streams.clone());
        let stop = self.shutdown.clone();
        self.tasks.spawn(async move {
            daemon.run(clients, snapshot, streams, stop.clone()).await;
            // A daemon with nothing (left) to do is no server stopping on
            // its own: the boot services go on until the shutdown.
            stop.cancelled().await;
            Ok(())
        });
        Ok(())
    }

    /// Prometheus metrics of every server started so far, on `--metrics`
    /// (its own listener). The last server to start.
    pub async fn metrics(&mut self, cli: &Cli) -> Result<()> {
        let listener = TcpListener::bind(cli.metrics)
            .await
            .with_context(|| format!("metrics: cannot bind {}", cli.metrics))?;
        self.listening.insert("metrics", listener.local_addr()?);
        let registry = std::mem::replace(&mut self.registry, Registry::with_prefix("mprov"));
        let app = mprov_fileserver::metrics_router(Arc::new(registry));
        // Its own small cap and deadlines: a scraper makes one request a
        // few seconds apart, and nobody may hold the listener open.
        let guard = mprov_process::listen::Guard::new(
            mprov_process::listen::Registry::new(METRICS_LIMITS, "the metrics listener's cap"),
            axum_server::accept::DefaultAcceptor,
        );
        let handle = axum_server::Handle::new();
        let stopper = handle.clone();
        let stop = self.shutdown.clone();
        tokio::spawn(async move {
            stop.cancelled().await;
            stopper.graceful_shutdown(Some(Duration::from_secs(5)));
        });
        let listener = listener.into_std()?;
        self.tasks.spawn(async move {
            axum_server::from_tcp(listener)?
                .acceptor(guard)
                .handle(handle)
                .serve(app.into_make_service())
                .await
                .context("metrics listener")
        });
        Ok(())
    }

    /// Writes where every server listens to `listen_file` (if given), then
    /// runs until a signal, or until a server fails.
    pub async fn run(self, listen_file: Option<&Path>) -> Result<()> {
        let Start {
            shutdown,
            tasks,
            listening,
            fixed: _kept_until_the_end,
            ..
        } = self;
        if let Some(path) = listen_file {
            write_listen_file(path, &listening)?;
        }
        mprov_process::run_servers(tasks, shutdown).await
    }
}

/// Writes `listening` to `path` as JSON (mode 0644), atomically: a reader
/// sees no file or the whole of it.
pub fn write_listen_file(path: &Path, listening: &Listening) -> Result<()> {
    let mut text = serde_json::to_string(listening)?;
    text.push('\n');
    mprov_process::write_atomic(path, text.as_bytes(), 0o644)
        .with_context(|| format!("writing the listen file {}", path.display()))
}

/// Sends IPv6 router advertisements until `stop`: on `named` (the DHCP
/// interface) if given, or else on the provisioning interfaces of the first
/// boot config (which may still be on its way from the control service, so
/// this waits for it). Finding no interface is a warning, not a failure:
/// RAs only save iPXE some seconds.
async fn router_advertisements(
    named: Option<String>,
    mut snapshot: Snapshot,
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
    #[test]
    fn listen_file_is_a_json_object_of_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("listen.json");
        let mut listening = super::Listening::new();
        listening.insert("http", "127.0.0.1:41871".parse().unwrap());
        listening.insert("dns", "[::1]:53".parse().unwrap());
        super::write_listen_file(&path, &listening).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"dns\":\"[::1]:53\",\"http\":\"127.0.0.1:41871\"}\n"
        );
    }
}
