//! `mprov-jobserver`: starts the boot services on one host and feeds them the
//! boot config, followed live from the control service or read from a file.
//!
//! Every server is optional (`--no-dhcp`, ...), binds where it is told
//! (`--listen-file` says where, port 0 included), and stops on SIGTERM or
//! Ctrl-C after in-flight work drains. The start-up steps are in
//! [`crate::start`].

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;
use mprov_api::client::{Auth, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::daemon::retry::{self, Failure};
use crate::start::{Snapshot, Start};
use crate::{daemon, events, identity, modules, snapshot};

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
///
/// CONFIGURATION. The settings come from the command line, then the config
/// file (-c FILE, default /etc/mprov/jobserver.yaml, or jobserver.yaml in
/// MPROV_CONFIG_DIR), then the environment variables named below, then the
/// defaults: a flag given on the command line wins. The file is the seed's
/// format: a YAML list of one-key maps, `- global: {...}` (mprovURL,
/// apikey, heartbeatInterval, runonce, caBundle, logLevel, hostId,
/// logTimestamps, myaddress, addresses, jobmodules; and ours: httpsPort,
/// the --https port), plugin sections such
/// as `- dnsmasq: {enableDHCP: true, enableDNS: false, enableTFTP: true}`,
/// and `- !include plugins/*.yaml` (relative to the including file; a
/// pattern may match nothing, a plain path must exist). Unknown keys are
/// errors, reported with the file and line. The job modules (jobmodules,
/// or -m a,b): dnsmasq (DHCP, DNS and TFTP), mprov-webserver (the HTTP
/// image server), image-update, image-sync, image-delete, libgenders; a
/// server whose module is not listed does not run. The seed's repo-*,
/// nads and script-runner are not in this release and are skipped with a
/// warning.
///
/// When MPROV_URL, MPROV_APIKEY, MPROV_ADDRESS or MPROV_MODS (space
/// separated) is set and no other config file is chosen, the job server
/// writes /etc/mprov/jobserver.yaml from them at every start (mode 0600,
/// edits are lost; put your own settings in plugins/*.yaml beside it, or
/// in a file of your own given with -c). MPROV_ARGS holds more arguments,
/// split as a shell would and read after the command line's (e.g.
/// MPROV_ARGS="-c /etc/mprov/jobserver-local.yaml").
///
/// LOGS go to standard error. Each line is tagged `[E]`, `[W]`, `[I]` or `[D]` and
/// its module, stamped in the time zone TZ names unless standard error is
/// journald's (JOURNAL_STREAM names it; logTimestamps or --log-timestamps
/// decide otherwise). Under journald each line also carries its syslog
/// priority (<3> error ... <7> debug), so `journalctl -p warning` shows
/// warnings and errors only. Colour only on a terminal.
#[derive(Debug, Parser)]
#[command(name = "mprov-jobserver", version)]
pub struct Cli {
    /// The control service's URL, e.g. http://10.0.0.1:8080 (mprovURL;
    /// MPROV_URL through the rendered config file).
    #[arg(long, conflicts_with = "boot_config")]
    pub(crate) control_url: Option<String>,
    /// The API key (apikey; MPROV_APIKEY through the rendered config file;
    /// default: read from --apikey-file).
    #[arg(long)]
    pub(crate) apikey: Option<String>,
    /// A file holding `export MPROV_APIKEY=<key>`, as the control service
    /// writes for the job server on its own host.
    #[arg(long, default_value = "/etc/mprov/apikey")]
    pub(crate) apikey_file: PathBuf,
    /// The CA certificate to trust for an https:// control URL (caBundle).
    /// Default: the control service's ca.crt,
    /// /var/lib/mprov/tls/ca.crt, if this host has it, else the system's CA
    /// bundle.
    #[arg(long, env = "MPROV_CA_FILE")]
    pub(crate) ca_file: Option<PathBuf>,
    /// A one-time enrollment token (`mprov-control enroll-token`), used once
    /// when the job server has no certificate yet.
    #[arg(long, env = "MPROV_ENROLL_TOKEN", hide_env_values = true)]
    pub(crate) enroll_token: Option<String>,
    /// The file holding a token, as the control service writes for the job
    /// server on its own host.
    #[arg(long, default_value = "/etc/mprov/enroll_token")]
    pub(crate) enroll_token_file: PathBuf,
    /// This job server's name in the inventory and in its certificate
    /// (default: the host name).
    #[arg(long, env = "MPROV_JOBSERVER_NAME")]
    pub(crate) name: Option<String>,
    /// Seconds between reports of this machine's load average to the
    /// control service (with the job server's certificate), by which
    /// `/ipxe/` sends nodes to the least loaded job server first. 0: never
    /// (the job server keeps the load it last reported, 0 if none).
    #[arg(long, env = "MPROV_HEARTBEAT", default_value_t = events::HEARTBEAT_EVERY.as_secs())]
    pub(crate) heartbeat: u64,
    /// Serve this boot config snapshot (JSON or YAML) instead of following the
    /// control service.
    #[arg(long)]
    pub(crate) boot_config: Option<PathBuf>,
    /// The address nodes reach this job server at (DHCP server id,
    /// next-server): myaddress, MPROV_ADDRESS through the rendered config
    /// file.
    #[arg(long)]
    pub(crate) server_ip: Option<Ipv4Addr>,
    /// DHCP listen address.
    #[arg(long, default_value = "0.0.0.0:67")]
    pub(crate) dhcp: SocketAddr,
    /// Do not serve DHCP.
    #[arg(long)]
    pub(crate) no_dhcp: bool,
    /// The provisioning interface DHCP serves (SO_BINDTODEVICE). Broadcast
    /// replies leave through it even when the host has no route for them;
    /// without it they follow the routing table.
    #[arg(long, env = "MPROV_DHCP_INTERFACE")]
    pub(crate) dhcp_interface: Option<String>,
    /// proxyDHCP: hand out boot information only, beside a site's own DHCP
    /// server. Its OFFER names no boot file: PXE clients then ask on port
    /// 4011 of --server-ip (the PXE specification's boot server request) and
    /// get the boot file there.
    #[arg(long)]
    pub(crate) proxy_dhcp: bool,
    /// The boot URL for UEFI HTTP boot clients (architecture 16), answered
    /// with class `HTTPClient`. A network's `http_boot_url` in the boot
    /// config overrides it. Default: the x86-64 iPXE binary on this job
    /// server's image server, http://SERVER_IP:HTTP_PORT/boot/snponly.efi
    /// (none with --no-http).
    #[arg(long, env = "MPROV_HTTP_BOOT_URL")]
    pub(crate) http_boot_url: Option<String>,
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
    pub(crate) no_ra: bool,
    /// TFTP listen address.
    #[arg(long, default_value = "0.0.0.0:69")]
    pub(crate) tftp: SocketAddr,
    /// Do not serve TFTP.
    #[arg(long)]
    pub(crate) no_tftp: bool,
    /// The folder TFTP serves: the iPXE binaries.
    #[arg(long, default_value = "/usr/lib/ipxe")]
    pub(crate) tftp_root: PathBuf,
    /// DNS listen address (UDP and TCP).
    #[arg(long, default_value = "0.0.0.0:53")]
    pub(crate) dns: SocketAddr,
    /// Do not serve DNS.
    #[arg(long)]
    pub(crate) no_dns: bool,
    /// HTTP image server listen address.
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub(crate) http: SocketAddr,
    /// Do not serve images over HTTP.
    #[arg(long)]
    pub(crate) no_http: bool,
    /// HTTPS image listen address, for other job servers' `image-sync`
    /// (client certificate of a job server required; see
    /// `crate::tls`). Served only once enrolled. Job servers copy from each
    /// other on this port: keep it the same on all of them (httpsPort).
    #[arg(long, default_value_t = SocketAddr::from(([0, 0, 0, 0], crate::tls::DEFAULT_HTTPS_PORT)))]
    pub(crate) https: SocketAddr,
    /// Do not serve images over HTTPS to other job servers.
    #[arg(long)]
    pub(crate) no_https: bool,
    /// Image streams served at once. Beyond it a node is told `503` with a
    /// `Retry-After` (5-15 s) instead of slowing everyone down; a client that
    /// honours it (`curl --retry` does) comes back then. 64 streams share a
    /// 10 GbE link at about 150 Mbit/s each.
    #[arg(long, env = "MPROV_HTTP_MAX_STREAMS", default_value_t = mprov_fileserver::DEFAULT_MAX_STREAMS, value_parser = clap::value_parser!(usize))]
    pub(crate) http_max_streams: usize,
    /// Size in MiB from which an `/images/` download counts as a stream
    /// under --http-max-streams. Keep kernels and initramfs files below it:
    /// iPXE fetches those and does not retry a 503. 0 puts every download
    /// under the limit.
    #[arg(long, env = "MPROV_HTTP_STREAM_MIB", default_value_t = mprov_fileserver::DEFAULT_STREAM_THRESHOLD >> 20)]
    pub(crate) http_stream_mib: u64,
    /// Connections the image server keeps open at once. At the limit a new
    /// connection closes the one idle longest (waiting for a request), so
    /// a flood of idle connections cannot keep a node out; a warning says
    /// so, at most every 10 s. Lowered to what the open-file limit allows
    /// (half of it, less 256), which the job server raises to its hard
    /// limit at start.
    #[arg(long, env = "MPROV_HTTP_MAX_CONNECTIONS", default_value_t = mprov_fileserver::DEFAULT_MAX_CONNECTIONS, value_parser = clap::value_parser!(usize))]
    pub(crate) http_max_connections: usize,
    /// The export folder: `images/<slug>/<version>/...`
    #[arg(long, default_value = "/var/lib/mprov/export")]
    pub(crate) export: PathBuf,
    /// Prometheus metrics listen address (its own listener).
    #[arg(long, default_value = "127.0.0.1:9102")]
    pub(crate) metrics: SocketAddr,
    /// Where the DHCP lease log lives.
    #[arg(long, default_value = "/var/lib/mprov/jobserver")]
    pub(crate) state_dir: PathBuf,
    /// Log filter, e.g. info or mprov_dhcp=debug (over logLevel: error,
    /// warning, info or debug).
    #[arg(long, env = "MPROV_LOG", default_value = "info")]
    pub(crate) log: String,
    /// Stamp each log line with the time (logTimestamps). Default: unless
    /// standard error is journald's.
    #[arg(long, value_name = "BOOL")]
    pub(crate) log_timestamps: Option<bool>,
    /// The config file (see CONFIGURATION above). Default:
    /// /etc/mprov/jobserver.yaml if it exists.
    #[arg(short = 'c', long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Once every server's socket is bound, write where each listens to
    /// FILE (atomically): one JSON object from the server's name (`dhcp`,
    /// `pxe`, `tftp`, `dns`, `http`, `https`, `metrics`; only those that run) to its
    /// `ip:port`, e.g. `{"http":"127.0.0.1:41871","metrics":"127.0.0.1:9102"}`.
    /// With port 0 binds, the ports the system chose.
    #[arg(long, value_name = "FILE")]
    pub(crate) listen_file: Option<PathBuf>,
    // The daemon's settings, which the config file also sets.
    /// The modules to run, comma-separated: job modules (`image-update`,
    /// `image-sync`, `image-delete`), the `libgenders` follower, and the
    /// seed's names of the boot services (`dnsmasq`, `mprov-webserver`).
    /// See `crate::daemon`.
    #[arg(short = 'm', long, value_delimiter = ',')]
    pub(crate) modules: Vec<String>,
    /// Run once (runonce), then exit. With only the boot services listed
    /// (dnsmasq, mprov-webserver): bind every server, write the listen
    /// file, and stop. Otherwise: enroll, register (unless -d), run the
    /// jobs pending now of the job modules listed (and write the genders
    /// file, with libgenders), serving nothing.
    #[arg(short = 'r', long)]
    pub(crate) run_once: bool,
    /// Do not register this job server's row (it must exist already).
    #[arg(short = 'd', long)]
    pub(crate) no_register: bool,
    /// This host's id for the control service (default: a random one, made
    /// once and kept in `host-id` next to the config).
    #[arg(long)]
    pub(crate) host_id: Option<String>,
    /// An address nodes reach this job server at, as `ADDR` or
    /// `ADDR@NETWORK_ID`; repeat for several. One `none` registers none.
    /// Default: the addresses of the interfaces that are up (see
    /// `crate::daemon::addresses`).
    #[arg(long = "address", value_name = "ADDR[@NETWORK_ID]")]
    pub(crate) addresses: Vec<String>,
    /// Each address's own control-service URL, from the config's
    /// `addresses:` (`{address, mprovURL}`): that address's heartbeats go
    /// there.
    #[arg(skip)]
    pub(crate) address_urls: Vec<(std::net::IpAddr, String)>,
    /// The agent binary (built static) that `image-update` puts in every
    /// image it builds, as its initramfs's `/init`. Default:
    /// /usr/lib/mprov/mprov-agent.
    #[arg(long, env = "MPROV_AGENT", value_name = "FILE")]
    pub(crate) agent: Option<PathBuf>,
}

/// Runs the command line; the process's exit code.
pub fn main() -> ExitCode {
    let (cli, warnings) = match crate::config::command_line::parse() {
        Ok(parsed) => parsed,
        Err(e) => return mprov_process::exit(Err(e)),
    };
    mprov_process::logging::set_time_zone(jiff::tz::TimeZone::system());
    mprov_process::logging::init_with(&cli.log, cli.log_timestamps);
    for w in warnings {
        tracing::warn!("{w}");
    }
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
/// server's certificate (enrolling first if it has none: with a token if
/// one is at hand, else with the API key), else with the API key. With a certificate, also what renewing it
/// needs.
pub(crate) async fn control_client(
    cli: &Cli,
    url: &str,
    stop: &CancellationToken,
) -> Result<(Client, Option<(identity::Control, identity::Identity)>)> {
    if !url.starts_with("https://") {
        tracing::info!("following the boot config of {url} with the API key");
        return Ok((Client::new(url, Auth::ApiKey(read_apikey(cli)?))?, None));
    }
    let ca = crate::config::ca_bundle(cli.ca_file.as_deref())?;
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
        (None, Some(token)) => {
            // Until the control service answers, in a version this job
            // server speaks: each kind of failure logged once.
            let enrolled = retry::until_ok("enrolling", url, stop, Failure::transient, || {
                identity::enroll(url, &ca, &token, &name, &dir)
            });
            Some(enrolled.await.context("stopped while enrolling")??)
        }
        // The seed's setup: an API key alone. An admin's key enrolls the
        // job server (retried like a token); a refused one leaves it
        // following with the key, as before it could enroll.
        (None, None) => match read_apikey(cli) {
            Err(_) => None,
            Ok(key) => {
                let enrolled = retry::until_ok(
                    "enrolling with the API key",
                    url,
                    stop,
                    Failure::transient,
                    || identity::enroll_with_apikey(url, &ca, &key, &name, &dir),
                );
                match enrolled.await.context("stopped while enrolling")? {
                    Ok(me) => Some(me),
                    Err(err) => {
                        tracing::warn!("{err:#}");
                        None
                    }
                }
            }
        },
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
                "no certificate, no enrollment token, and no API key that may enroll: following {url} with the shared API key; enroll this job server with `mprov-control enroll-token`, or give it an admin's API key"
            );
            let client = Client::builder(url, Auth::ApiKey(read_apikey(cli)?))
                .ca_certificates_pem(ca.into_bytes())
                .build()?;
            Ok((client, None))
        }
    }
}

/// The UEFI HTTP boot URL: as given (empty: none), else the copy of the
/// x86-64 iPXE binary on the image server bound at `image_server`, if it
/// runs.
fn http_boot_url(
    cli: &Cli,
    server_ip: Ipv4Addr,
    efi_file: &str,
    image_server: Option<SocketAddr>,
) -> Option<String> {
    match cli.http_boot_url.as_deref().map(str::trim) {
        Some("") => None,
        Some(url) => Some(url.to_owned()),
        None => image_server.map(|bound| {
            format!(
                "{}/boot/{efi_file}",
                mprov_api::boot::jobserver_base_url(&server_ip.to_string(), Some(bound.port()))
            )
        }),
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

/// Runs the job server, one step per server, each started only once the
/// ones before it are; the image server's tasks go to `http`.
async fn run(cli: Cli, http: &tokio::runtime::Handle) -> Result<()> {
    let mut start = Start::new()?;
    // Run once: the boot services bind and stop only when they are all
    // the list names; else the pending jobs run and nothing is served.
    let only_boot_services = !cli.modules.is_empty()
        && (cli.modules.iter()).all(|m| modules::BOOT_SERVICES.contains(&m.as_str()));
    if cli.run_once && !only_boot_services {
        return daemon::run_once(&cli, start.shutdown()).await;
    }
    let Some((snapshot, reporter)) = boot_config(&cli, &mut start).await? else {
        // Stopped while enrolling or waiting for the control service.
        return Ok(());
    };
    let followed = reporter.clone();
    let reports = start.timeline_reports(reporter);
    let image_server = start.image_server(&cli, &snapshot, &reports, http)?;
    if !cli.no_dhcp {
        let server_ip = cli.server_ip.context(
            "DHCP needs --server-ip (MPROV_ADDRESS), the address nodes reach this job server at; or give --no-dhcp",
        )?;
        let boot_url = |efi: &str| http_boot_url(&cli, server_ip, efi, image_server);
        start.dhcp(&cli, server_ip, boot_url, &snapshot, &reports)?;
    }
    if !cli.no_ra {
        start.router_advertisements(&cli, &snapshot);
    }
    if !cli.no_tftp {
        start.tftp(&cli, &reports).await?;
    }
    if !cli.no_dns {
        start.dns(&cli, &snapshot).await?;
    }
    match followed {
        Some(clients) => {
            let port = image_server.map_or(cli.http.port(), |bound| bound.port());
            start.daemon(&cli, clients, &snapshot, port)?;
        }
        None if !cli.modules.is_empty() => tracing::warn!(
            "serving a fixed boot config: no control service to register with or take jobs from"
        ),
        None => {}
    }
    start.metrics(&cli).await?;
    if cli.run_once {
        // Once, with the boot services only: every server bound and the
        // listen file written, then stopped as on a signal.
        tracing::info!("run once: every server is bound; stopping");
        start.shutdown().cancel();
    }
    start.run(cli.listen_file.as_deref()).await
}

/// Where the boot config comes from: the `--boot-config` file, or the
/// control service followed live (enrolling first when need be). The
/// snapshot, and when following, the client to report the timeline with;
/// `None` if a signal came while waiting for the control service.
async fn boot_config(
    cli: &Cli,
    start: &mut Start,
) -> Result<Option<(Snapshot, Option<watch::Receiver<Client>>)>> {
    match (&cli.boot_config, &cli.control_url) {
        (Some(path), _) => {
            let config = snapshot::read_file(path)?;
            tracing::info!(
                "serving the boot config in {} (revision {})",
                path.display(),
                config.revision
            );
            Ok(Some((start.fixed(config), None)))
        }
        (None, Some(url)) => {
            let stop = start.shutdown().clone();
            let (client, renewal) = tokio::select! {
                found = control_client(cli, url, &stop) => match found {
                    // Stopped while retrying its enrollment.
                    Err(_) if stop.is_cancelled() => return Ok(None),
                    found => found?,
                },
                () = stop.cancelled() => return Ok(None),
            };
            let (snapshot, clients) = start.follow(client, renewal);
            Ok(Some((snapshot, Some(clients))))
        }
        (None, None) => bail!(
            "give --control-url (MPROV_URL) to follow the control service, or --boot-config FILE"
        ),
    }
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
            let cli = Cli::try_parse_from(argv).unwrap();
            // Bound where asked (these ports are not 0).
            let bound = (!cli.no_http).then_some(cli.http);
            super::http_boot_url(&cli, ip, "snponly.efi", bound)
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
        // A port 0 bind: the port the image server got, not 0.
        let argv = [
            "mprov-jobserver",
            "--boot-config",
            "b.json",
            "--http",
            "0.0.0.0:0",
        ];
        let cli = Cli::try_parse_from(argv).unwrap();
        let bound = Some("0.0.0.0:40123".parse().unwrap());
        assert_eq!(
            super::http_boot_url(&cli, ip, "snponly.efi", bound).as_deref(),
            Some("http://10.0.0.1:40123/boot/snponly.efi")
        );
    }

    #[test]
    fn daemon_flags() {
        let cli = Cli::try_parse_from([
            "mprov-jobserver",
            "--control-url",
            "https://c",
            "-m",
            "image-delete,libgenders",
            "-m",
            "dnsmasq",
            "-r",
            "-d",
            "--host-id",
            "rack4-js01",
            "--address",
            "10.0.0.1",
            "--address",
            "fd00::1@2",
        ])
        .unwrap();
        assert_eq!(cli.modules, ["image-delete", "libgenders", "dnsmasq"]);
        assert!(cli.run_once && cli.no_register);
        assert_eq!(cli.host_id.as_deref(), Some("rack4-js01"));
        assert_eq!(cli.addresses, ["10.0.0.1", "fd00::1@2"]);
        let none = Cli::try_parse_from(["mprov-jobserver", "--boot-config", "b.json"]).unwrap();
        assert!(none.modules.is_empty() && none.addresses.is_empty());
        assert!(!none.run_once && !none.no_register && none.host_id.is_none());
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
