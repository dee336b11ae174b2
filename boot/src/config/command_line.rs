//! The job server's settings from their sources, in order of precedence:
//! the command line (with `MPROV_ARGS` appended, split as a shell would),
//! the config file, the environment variables clap reads, the defaults.
//!
//! [`parse`] does the I/O (the arguments, the environment, writing the
//! rendered file, reading the config); [`apply`] is the merge, a function
//! of the parsed command line and the loaded [`Config`].

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};

use super::{Config, Disk, MODULES, NOT_IN_THIS_RELEASE, load, load_text, render};
use crate::cli::Cli;

/// The folder of the default config file: `MPROV_CONFIG_DIR`, else
/// [`super::DEFAULT_DIR`].
pub fn config_dir() -> PathBuf {
    std::env::var_os("MPROV_CONFIG_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(super::DEFAULT_DIR))
}

/// The command line and the config file, merged; and the warnings to log
/// once logging is up. A command-line error (or `--help`) exits here, as
/// clap does.
pub fn parse() -> Result<(Cli, Vec<String>)> {
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    if let Some(extra) = std::env::var("MPROV_ARGS")
        .ok()
        .filter(|a| !a.trim().is_empty())
    {
        let words = shlex::split(&extra)
            .with_context(|| format!("MPROV_ARGS is not valid shell words: {extra:?}"))?;
        argv.extend(words.into_iter().map(OsString::from));
    }
    let matches = Cli::command()
        .try_get_matches_from(argv)
        .unwrap_or_else(|e| e.exit());
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let default_path = config_dir().join(super::FILE_NAME);
    let mut warnings = Vec::new();
    let chosen = cli.config.clone().filter(|p| *p != default_path);
    let env = render::Environment::from_process();
    let config = match chosen {
        Some(path) => Some(load(&path, &Disk)?),
        None if env.is_set() => {
            let text = render::text(&env, crate::events::HEARTBEAT_EVERY.as_secs());
            if let Err(e) = render::write(&default_path, &text) {
                warnings.push(format!(
                    "cannot write {} from the environment ({e}); using the environment as it is",
                    default_path.display()
                ));
            }
            Some(load_text(&default_path, &text, &Disk)?)
        }
        None => match std::fs::read_to_string(&default_path) {
            Ok(text) => Some(load_text(&default_path, &text, &Disk)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && cli.config.is_none() => None,
            Err(err) => {
                return Err(super::ConfigError::Read {
                    file: default_path,
                    err,
                }
                .into());
            }
        },
    };
    let config = config.unwrap_or_default();
    warnings.extend(config.warnings.iter().cloned());
    let (cli, more) = apply(cli, &matches, config)?;
    warnings.extend(more);
    Ok((cli, warnings))
}

/// The config's `addresses:` as `--address` takes them: `ADDR` or
/// `ADDR@NETWORK_ID`, and `none` for an empty list.
fn as_arguments(list: &[super::Address]) -> Vec<String> {
    if list.is_empty() {
        return vec!["none".to_owned()];
    }
    list.iter()
        .map(|a| match a.network {
            Some(network) => format!("{}@{network}", a.address),
            None => a.address.to_string(),
        })
        .collect()
}

/// `cli` with the settings of `config` that the command line did not give;
/// the warnings about it.
pub fn apply(mut cli: Cli, matches: &ArgMatches, config: Config) -> Result<(Cli, Vec<String>)> {
    let given = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
    let mut warnings = Vec::new();
    if !given("control_url") && config.mprov_url.is_some() {
        cli.control_url = config.mprov_url;
    }
    if !given("apikey") && config.apikey.is_some() {
        cli.apikey = config.apikey;
    }
    if !given("heartbeat")
        && let Some(h) = config.heartbeat_interval
    {
        cli.heartbeat = h;
    }
    if !given("ca_file") && config.ca_bundle.is_some() {
        cli.ca_file = config.ca_bundle;
    }
    // MPROV_LOG, a debugging aid, also wins over logLevel.
    let log_given = matches!(
        matches.value_source("log"),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    );
    if !log_given && let Some(level) = config.log_level {
        cli.log = level.filter().to_owned();
    }
    if !given("log_timestamps") && config.log_timestamps.is_some() {
        cli.log_timestamps = config.log_timestamps;
    }
    if !given("server_ip")
        && let Some((address, at)) = &config.myaddress
    {
        cli.server_ip =
            Some(ipv4_of(address).with_context(|| format!("{at}: myaddress {address:?}"))?);
    }
    if !given("run_once")
        && let Some(once) = config.runonce
    {
        cli.run_once = once;
    }
    if !given("https")
        && let Some(port) = config.https_port
    {
        cli.https.set_port(port);
    }
    if !given("host_id") && config.host_id.is_some() {
        cli.host_id = config.host_id;
    }
    if !given("addresses")
        && let Some(list) = config.addresses
    {
        cli.address_urls = list
            .iter()
            .filter_map(|a| Some((a.address, a.mprov_url.clone()?)))
            .collect();
        cli.addresses = as_arguments(&list);
    }
    let modules = if given("modules") {
        let mut listed = Vec::new();
        for m in std::mem::take(&mut cli.modules) {
            let m = m.trim().to_owned();
            if NOT_IN_THIS_RELEASE.contains(&m.as_str()) {
                warnings.push(format!(
                    "-m: the job module `{m}` is not in this release of mProv; it does not run"
                ));
            } else if !MODULES.contains(&m.as_str()) {
                bail!(
                    "-m: unknown job module `{m}`; the job modules are {}",
                    MODULES.join(", ")
                );
            } else if !listed.contains(&m) {
                listed.push(m);
            }
        }
        Some(listed)
    } else {
        config.modules
    };
    // The servers: each runs if its module is listed (when a list is
    // given) and its plugin switch is on, and no --no-* flag stops it.
    let services = config.boot_services;
    let listed = |name: &str| modules.as_ref().is_none_or(|m| m.iter().any(|n| n == name));
    let dnsmasq = listed(mprov_api::jobs::module::DNSMASQ);
    cli.no_dhcp |= !(dnsmasq && services.dhcp);
    cli.no_ra |= !(dnsmasq && services.dhcp);
    cli.no_dns |= !(dnsmasq && services.dns);
    cli.no_tftp |= !(dnsmasq && services.tftp);
    cli.no_http |= !listed(mprov_api::jobs::module::WEBSERVER);
    if let Some(modules) = modules {
        cli.modules = modules;
    }
    Ok((cli, warnings))
}

/// `myaddress`: an IPv4 address, or a name that resolves to one.
fn ipv4_of(address: &str) -> Result<Ipv4Addr> {
    match address.trim().parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => return Ok(ip),
        Ok(IpAddr::V6(_)) => bail!("the DHCP server needs an IPv4 address, not an IPv6 one"),
        Err(_) => {}
    }
    let found = (address.trim(), 0)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {address:?}"))?
        .find_map(|a| match a.ip() {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        });
    found.with_context(|| format!("{address:?} has no IPv4 address"))
}

/// Where the system's CA bundle is, on the distributions we run on.
const SYSTEM_CA_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The control service's CA certificate on its own host.
const CONTROL_CA: &str = "/var/lib/mprov/tls/ca.crt";

/// The CA certificates to trust for an https:// control URL (PEM): the
/// file given (`--ca-file`, `caBundle`), else the control service's
/// ca.crt if this host has it, else the system's bundle.
pub fn ca_bundle(given: Option<&Path>) -> Result<String> {
    if let Some(path) = given {
        return std::fs::read_to_string(path).with_context(|| {
            format!(
                "cannot read the CA bundle {} (caBundle or --ca-file)",
                path.display()
            )
        });
    }
    for path in std::iter::once(CONTROL_CA).chain(SYSTEM_CA_BUNDLES) {
        match std::fs::read_to_string(path) {
            Ok(pem) => return Ok(pem),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot read {path}")),
        }
    }
    bail!(
        "an https:// control URL needs a CA certificate: set caBundle (or --ca-file) to the control service's ca.crt; found neither {CONTROL_CA} nor a system CA bundle"
    )
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    use super::apply;
    use crate::cli::Cli;
    use crate::config::{BootServices, Config};

    fn applied(args: &[&str], config: Config) -> anyhow::Result<Cli> {
        let mut argv = vec!["mprov-jobserver", "--boot-config", "b.json"];
        argv.extend_from_slice(args);
        let matches = Cli::command().try_get_matches_from(argv).unwrap();
        let cli = Cli::from_arg_matches(&matches).unwrap();
        apply(cli, &matches, config).map(|(cli, _)| cli)
    }

    #[test]
    fn the_command_line_wins_over_the_file() {
        let config = Config {
            heartbeat_interval: Some(10),
            apikey: Some("file".into()),
            myaddress: Some(("10.0.0.9".into(), where_())),
            runonce: Some(true),
            ..Config::default()
        };
        let cli = applied(
            &["--heartbeat", "3", "--server-ip", "10.0.0.1"],
            config.clone(),
        )
        .unwrap();
        assert_eq!(cli.heartbeat, 3);
        assert_eq!(cli.server_ip, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(cli.apikey.as_deref(), Some("file"));
        assert!(cli.run_once);
        let cli = applied(&[], config).unwrap();
        assert_eq!(cli.heartbeat, 10);
        assert_eq!(cli.server_ip, Some("10.0.0.9".parse().unwrap()));
        // logLevel, unless --log says otherwise.
        let config = Config {
            log_level: Some(crate::config::LogLevel::Warning),
            log_timestamps: Some(false),
            ..Config::default()
        };
        if std::env::var_os("MPROV_LOG").is_none() {
            assert_eq!(applied(&[], config.clone()).unwrap().log, "warn");
        }
        let cli = applied(&["--log", "debug", "--log-timestamps", "true"], config).unwrap();
        assert_eq!(
            (cli.log.as_str(), cli.log_timestamps),
            ("debug", Some(true))
        );
    }

    #[test]
    fn modules_decide_the_servers() {
        let config = Config {
            modules: Some(vec!["dnsmasq".into()]),
            boot_services: BootServices {
                dhcp: true,
                dns: false,
                tftp: true,
            },
            ..Config::default()
        };
        let cli = applied(&[], config.clone()).unwrap();
        assert!(!cli.no_dhcp && !cli.no_tftp && cli.no_dns && cli.no_http);
        let cli = applied(&["-m", "mprov-webserver,repo-sync"], config.clone()).unwrap();
        assert!(cli.no_dhcp && cli.no_tftp && cli.no_dns && cli.no_ra && !cli.no_http);
        assert_eq!(cli.modules, ["mprov-webserver"]);
        assert!(applied(&["-m", "dhcpd"], config).is_err());
        // No list anywhere: every server, as before.
        let cli = applied(&[], Config::default()).unwrap();
        assert!(!cli.no_dhcp && !cli.no_dns && !cli.no_tftp && !cli.no_http);
    }

    #[test]
    fn https_port_and_per_address_urls_come_from_the_config() {
        let text = "- global:\n    httpsPort: 9443\n    addresses:\n      - 10.0.0.1\n      - address: 10.1.0.1\n        mprovURL: \"https://10.1.0.254:8443\"\n";
        let memory = crate::config::fuzz::Memory::new([("/x.yaml", text)]);
        let config = crate::config::load(std::path::Path::new("/x.yaml"), &memory).unwrap();
        let cli = applied(&[], config.clone()).unwrap();
        assert_eq!(cli.https.port(), 9443);
        assert_eq!(
            cli.address_urls,
            [(
                "10.1.0.1".parse().unwrap(),
                "https://10.1.0.254:8443".to_owned()
            )]
        );
        let cli = applied(&["--https", "127.0.0.1:7443"], config).unwrap();
        assert_eq!(cli.https.port(), 7443);
    }

    #[test]
    fn myaddress_is_ipv4_or_a_name() {
        let config = |a: &str| Config {
            myaddress: Some((a.into(), where_())),
            ..Config::default()
        };
        assert!(
            applied(&[], config("localhost"))
                .unwrap()
                .server_ip
                .is_some()
        );
        let e = format!("{:#}", applied(&[], config("fd00::1")).unwrap_err());
        assert!(e.starts_with("/x.yaml:4:5: myaddress"), "{e}");
    }

    fn where_() -> crate::config::Where {
        crate::config::Where {
            file: "/x.yaml".into(),
            line: 4,
            column: 5,
        }
    }
}
