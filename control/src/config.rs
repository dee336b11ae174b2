//! The control service's configuration: the process knobs (environment variables
//! with the original mProv's names, or command-line flags) parsed once into a
//! typed [`Config`] that is passed around in an `Arc`. No global state.
//!
//! Everything has an embedded default, so `mprov-control serve` runs with no
//! configuration at all: SQLite in the state folder, a generated secret key in
//! the config folder.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use ipnet::IpNet;

/// The default config folder: secret key, admin password, job server key.
pub const DEFAULT_CONFIG_DIR: &str = "/etc/mprov";
/// The default state folder: SQLite database, TLS material, backups.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/mprov";
/// The default listen address of the API.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:8080";
/// The default listen address of the HTTPS API.
pub const DEFAULT_HTTPS_LISTEN: &str = "0.0.0.0:443";
/// Path prefixes exempt from the version check by default: clients that cannot
/// send headers (iPXE) or that fetch what a client needs before it can check
/// versions (the CA certificate, the API description).
pub const DEFAULT_VERSION_EXEMPT: &[&str] =
    &["/ipxe/", "/ca.crt", "/static/", "/api/v1/openapi.json"];

/// The process knobs, as the command line and environment give them.
#[derive(Debug, Clone, clap::Args)]
pub struct Settings {
    /// Address and port of the HTTP API.
    #[arg(long, env = "MPROV_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Write the address actually bound to this file once listening (with
    /// --listen on port 0, how tests and scripts learn the port, race-free).
    #[arg(long, env = "MPROV_LISTEN_FILE")]
    pub listen_file: Option<PathBuf>,
    /// Address and port of the HTTPS API (with an optional client certificate
    /// from the install's CA); `off` serves plain HTTP only.
    #[arg(long, env = "MPROV_HTTPS_LISTEN", default_value = DEFAULT_HTTPS_LISTEN)]
    pub https_listen: String,
    /// Write the HTTPS address actually bound to this file once listening.
    #[arg(long, env = "MPROV_HTTPS_LISTEN_FILE")]
    pub https_listen_file: Option<PathBuf>,
    /// The TLS folder: this install's CA and HTTPS certificate (default:
    /// STATE_DIR/tls, i.e. /var/lib/mprov/tls).
    #[arg(long, env = "MPROV_TLS_DIR")]
    pub tls_dir: Option<PathBuf>,
    /// A site certificate (PEM, chain allowed) to serve on HTTPS instead of
    /// the install's own; needs MPROV_TLS_KEY. The CA is still made.
    #[arg(long, env = "MPROV_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The site certificate's key (PEM); needs MPROV_TLS_CERT.
    #[arg(long, env = "MPROV_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// The system user the web service becomes when started as root (made
    /// if missing); `root` keeps it root.
    #[arg(
        long = "service-user",
        env = "MPROV_SERVICE_USER",
        default_value = "mprov"
    )]
    pub user: String,
    /// The system user the signing helper becomes when started as root.
    #[arg(long, env = "MPROV_SIGNER_USER", default_value = "mprov-signer")]
    pub signer_user: String,
    /// Where the old shared API key (the job server key made at first start)
    /// is still accepted: all (default, warned about), nodes (only what a node
    /// does to itself) or off.
    #[arg(long, env = "MPROV_SHARED_KEY_MODE", default_value = "all")]
    pub shared_key_mode: SharedKeyMode,
    /// Config folder (secret key, admin password, job server API key).
    #[arg(long, env = "MPROV_CONFIG_DIR", default_value = DEFAULT_CONFIG_DIR)]
    pub config_dir: PathBuf,
    /// State folder (SQLite database, TLS material, backups).
    #[arg(long, env = "MPROV_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// A full database URL (sqlite:, mysql:, postgres:); overrides the DB_* variables.
    #[arg(long, env = "MPROV_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Database engine: sqlite (default), mysql/mariadb, postgres, or the
    /// original's django.db.backends.* names.
    #[arg(long, env = "DB_ENGINE")]
    pub db_engine: Option<String>,
    /// Database host.
    #[arg(long, env = "DB_HOST", default_value = "localhost")]
    pub db_host: String,
    /// Database port (default: the engine's).
    #[arg(long, env = "DB_PORT")]
    pub db_port: Option<u16>,
    /// Database name.
    #[arg(long, env = "DB_NAME", default_value = "mprov")]
    pub db_name: String,
    /// Database user.
    #[arg(long, env = "DB_USER", default_value = "mprov")]
    pub db_user: String,
    /// Database password.
    #[arg(long, env = "DB_PASS", hide_env_values = true, default_value = "")]
    pub db_pass: String,
    /// The control host's name (default: this machine's host name).
    #[arg(long, env = "MPROV_MPCC_HOSTNAME")]
    pub hostname: Option<String>,
    /// Comma-separated IPs the control host is reached by.
    #[arg(long, env = "MPROV_MPCC_IPs", default_value = "")]
    pub ips: String,
    /// The cluster's DNS domain.
    #[arg(long, env = "MPROV_DOMAINNAME", default_value = "")]
    pub domain: String,
    /// Further comma-separated host names or IPs the API is reached by
    /// (`*` allows any). localhost and 127.0.0.1 are always allowed.
    #[arg(long, env = "ALLOWED_HOSTS", default_value = "")]
    pub allowed_hosts: String,
    /// Time zone name, e.g. America/New_York (default: TZ, else UTC).
    #[arg(long, env = "TIME_ZONE")]
    pub time_zone: Option<String>,
    /// Seconds without a request after which an admin page session ends.
    #[arg(long, env = "SESSION_EXPIRE_SECONDS", default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..))]
    pub session_expire_seconds: u64,
    /// The most fields one posted admin page form may have.
    #[arg(long, env = "DATA_UPLOAD_MAX_NUMBER_FIELDS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub data_upload_max_number_fields: u64,
    /// Comma-separated addresses or CIDR ranges of reverse proxies whose
    /// X-Forwarded-For header is trusted.
    #[arg(long, env = "TRUSTED_PROXIES", default_value = "")]
    pub trusted_proxies: String,
    /// `1` turns the API version check off (development and CI only).
    #[arg(long, env = "MPROV_SKIP_VERSION_CHECK")]
    pub skip_version_check: Option<String>,
    /// Comma-separated path prefixes exempt from the version check
    /// (default: /ipxe/, /ca.crt, /static/, /api/v1/openapi.json).
    #[arg(long, env = "MPROV_VERSION_EXEMPT")]
    pub version_exempt: Option<String>,
    /// Comma-separated DNS resolvers that job servers forward names outside the
    /// cluster's domains to (none: such queries are refused).
    #[arg(long, env = "MPROV_DNS_UPSTREAMS", default_value = "")]
    pub dns_upstreams: String,
    /// `/ipxe/` requests a minute one MAC may make (a booting node makes one
    /// or two); beyond it, 429 with a retry script.
    #[arg(long, env = "MPROV_IPXE_LIMIT_PER_MAC", default_value_t = 12)]
    pub ipxe_limit_per_mac: u32,
    /// `/ipxe/` requests a minute in total (bursts up to a tenth of it at
    /// once); raise it for clusters that power on thousands of nodes at once.
    #[arg(long, env = "MPROV_IPXE_LIMIT_TOTAL", default_value_t = 30_000)]
    pub ipxe_limit_total: u32,
    /// The most connections open at once over HTTP and HTTPS together; a
    /// new one beyond it closes the longest-idle one. Lowered at start to
    /// what the process's file limit leaves room for.
    #[arg(long, env = "MPROV_MAX_CONNECTIONS", default_value_t = 16_384)]
    pub max_connections: usize,
    /// Boot events a minute one node's certificate may report about itself
    /// (a boot reports a few dozen); beyond it, 429.
    #[arg(long, env = "MPROV_BOOT_EVENTS_PER_MINUTE", default_value_t = 120)]
    pub boot_events_per_minute: u32,
    /// Boot events a minute one job server's certificate may report (it
    /// reports for every node it serves: several per node booting).
    #[arg(
        long,
        env = "MPROV_JOBSERVER_EVENTS_PER_MINUTE",
        default_value_t = 20_000
    )]
    pub jobserver_events_per_minute: u32,
    /// Certificate renewals an hour per node or job server (one renews
    /// once in weeks); beyond it, 429.
    #[arg(long, env = "MPROV_RENEWALS_PER_HOUR", default_value_t = 6)]
    pub renewals_per_hour: u32,
    /// Seconds a node still booting may go without a boot event before the
    /// boot board flags it stuck.
    #[arg(long, env = "MPROV_BOARD_STUCK_SECONDS", default_value_t = DEFAULT_BOARD_STUCK_SECONDS, value_parser = clap::value_parser!(u64).range(1..))]
    pub board_stuck_seconds: u64,
    /// Days boot events are kept; older ones are removed hourly.
    #[arg(long, env = "MPROV_BOOT_EVENTS_KEEP_DAYS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub boot_events_keep_days: u32,
    /// Minutes a job server may go without a heartbeat before its running
    /// jobs are failed, with that reason; 0 never fails them.
    #[arg(long, env = "JOBSERVER_FAIL_JOBS_AFTER_MINUTES", default_value_t = 10)]
    pub jobserver_fail_jobs_after_minutes: u32,
    /// Days a job server may go without a heartbeat before its row is
    /// deleted (its certificates revoked); 0 never deletes it.
    #[arg(long, env = "JOBSERVER_DELETE_AFTER_DAYS", default_value_t = 0)]
    pub jobserver_delete_after_days: u32,
    /// Seconds a new connection has to start its first request (the TLS
    /// handshake included) before it is closed.
    #[arg(long, env = "MPROV_FIRST_REQUEST_SECONDS", default_value_t = 10)]
    pub first_request_seconds: u64,
    /// Seconds a connection may stay open with no request in flight.
    #[arg(long, env = "MPROV_IDLE_SECONDS", default_value_t = 60)]
    pub idle_seconds: u64,
    /// The URL nodes reach this service by (default: `http://` the first of
    /// MPROV_MPCC_IPs, else the host name, and the listen port).
    #[arg(long, env = "MPROV_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// The admin password to set on first start instead of a random one.
    #[arg(long, env = "MPROV_SUPERUSER_PASSWORD", hide_env_values = true)]
    pub superuser_password: Option<String>,
    /// The install's secret key; generated and kept in the config folder if unset.
    #[arg(long, env = "SECRET_KEY", hide_env_values = true)]
    pub secret_key: Option<String>,
    /// Where `mprov-control backup` writes by default (root-only; default:
    /// STATE_DIR/backups, i.e. /var/lib/mprov/backups).
    #[arg(long, env = "MPROV_BACKUP_DIR")]
    pub backup_dir: Option<PathBuf>,
    /// Comma-separated folders a web server on this host serves, which a
    /// backup must never be written into (the TLS folder and
    /// STATE_DIR/export always count).
    #[arg(long, env = "MPROV_SERVED_DIRS", default_value = "")]
    pub served_dirs: String,
    /// How long a job server's certificate is valid, in seconds (default 90
    /// days, the most allowed; at least 60). Job servers renew theirs when a
    /// third is left, so a short value (tests, drills) exercises renewal.
    #[arg(long, env = "MPROV_JOBSERVER_CERT_SECONDS", value_parser = clap::value_parser!(u64).range(60..=JOBSERVER_MAX_SECONDS))]
    pub jobserver_cert_seconds: Option<u64>,
    /// How long a node's certificate is valid, in seconds (default 30 days,
    /// the most allowed; at least 60). A booted node's agent renews its own
    /// when a third is left, so a short value (tests, drills) exercises
    /// renewal.
    #[arg(long, env = "MPROV_NODE_CERT_SECONDS", value_parser = clap::value_parser!(u64).range(60..=NODE_MAX_SECONDS))]
    pub node_cert_seconds: Option<u64>,
    /// Seconds after a job server's last heartbeat on an address (or, for a
    /// job server that registered none, on its row) before `/ipxe/` and the
    /// boot manifest stop sending nodes there (default 45: three of the job
    /// server's default 15 s heartbeats).
    #[arg(long, env = "MPROV_JOBSERVER_STALE_SECONDS", default_value_t = DEFAULT_JOBSERVER_STALE_SECONDS, value_parser = clap::value_parser!(u64).range(1..))]
    pub jobserver_stale_seconds: u64,
    /// `1` (the default): the boot script hands the lease iPXE holds to the
    /// agent on the kernel command line, and the agent configures its
    /// interface from it without a DHCP exchange of its own (half the DHCP
    /// traffic of a mass boot). `0`: the agent always asks DHCP itself.
    #[arg(long, env = "MPROV_IPXE_CARRY_LEASE", default_value = "1", value_parser = parse_switch, action = clap::ArgAction::Set)]
    pub ipxe_carry_lease: bool,
    /// What a discovered node's match may bind without an admin: manual
    /// (default: everything waits for an admin), open (a MAC binds to a
    /// matched NIC that has none) or permissive (it may also replace one).
    #[arg(long, env = "MPROV_DISCOVERY_POLICY", default_value = "manual")]
    pub discovery_policy: DiscoveryPolicy,
    /// The image whose kernel and agent initramfs an unknown node boots in
    /// discovery mode (its slug); unset, an unknown node is only told to be
    /// added to the inventory.
    #[arg(long, env = "MPROV_DISCOVERY_IMAGE")]
    pub discovery_image: Option<String>,
    /// LDAP sign-in for the admin pages.
    #[command(flatten)]
    pub ldap: LdapSettings,
}

/// The LDAP knobs, with the original's names (`LDAP_ENABLED`, `LDAP_URI`,
/// `LDAP_USER_DN_TEMPLATE`, ...). Checked together by
/// [`LdapConfig::from_settings`]; see `crate::ldap` for how a sign-in uses
/// them.
#[derive(Clone, clap::Args)]
pub struct LdapSettings {
    /// `1` (or true, yes, on) signs admin-page users in against an LDAP
    /// directory too; the LDAP_* variables then say how.
    #[arg(long = "ldap-enabled", env = "LDAP_ENABLED", default_value = "0", value_parser = parse_switch, action = clap::ArgAction::Set)]
    pub enabled: bool,
    /// The directory's URI: `ldap://host[:port]` or `ldaps://host[:port]`.
    #[arg(long = "ldap-uri", env = "LDAP_URI", default_value = "")]
    pub uri: String,
    /// `1` upgrades an ldap:// connection with StartTLS before anything is
    /// sent (without it, an ldap:// URI sends passwords in clear).
    #[arg(long = "ldap-start-tls", env = "LDAP_START_TLS", default_value = "0", value_parser = parse_switch, action = clap::ArgAction::Set)]
    pub start_tls: bool,
    /// A PEM file of the CA certificates the directory's certificate is
    /// checked against (default: the system's roots).
    #[arg(long = "ldap-ca-file", env = "LDAP_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// The service account's DN, bound to search for the user and read the
    /// groups (unset: the search is anonymous and the groups are read as
    /// the user).
    #[arg(long = "ldap-bind-dn", env = "LDAP_BIND_DN", default_value = "")]
    pub bind_dn: String,
    /// The service account's password.
    #[arg(
        long = "ldap-bind-password",
        env = "LDAP_BIND_PASSWORD",
        hide_env_values = true
    )]
    pub bind_password: Option<SecretString>,
    /// A file holding the service account's password (one trailing newline
    /// is dropped), instead of LDAP_BIND_PASSWORD.
    #[arg(long = "ldap-bind-password-file", env = "LDAP_BIND_PASSWORD_FILE")]
    pub bind_password_file: Option<PathBuf>,
    /// Where users are searched (subtree), e.g. ou=people,dc=example,dc=org.
    #[arg(
        long = "ldap-user-search-base",
        env = "LDAP_USER_SEARCH_BASE",
        default_value = ""
    )]
    pub user_search_base: String,
    /// The filter that finds a user; `%(user)s` stands for the name typed
    /// (escaped). Exactly one entry must match.
    #[arg(long = "ldap-user-filter", env = "LDAP_USER_FILTER", default_value = DEFAULT_LDAP_USER_FILTER)]
    pub user_filter: String,
    /// A user's DN with `%(user)s` for the name typed (escaped), e.g.
    /// uid=%(user)s,ou=people,dc=example,dc=org; when set, used instead of
    /// the search.
    #[arg(
        long = "ldap-user-dn-template",
        env = "LDAP_USER_DN_TEMPLATE",
        default_value = ""
    )]
    pub user_dn_template: String,
    /// The DN of the group whose members are admins.
    #[arg(
        long = "ldap-admin-group",
        env = "LDAP_ADMIN_GROUP",
        default_value = ""
    )]
    pub admin_group: String,
    /// The DN of the group whose members may read everything and change
    /// nothing (LDAP_STAFF_GROUP, its old name, is read when it is unset).
    #[arg(
        long = "ldap-readonly-group",
        env = "LDAP_READONLY_GROUP",
        default_value = ""
    )]
    pub readonly_group: String,
    /// The old name of LDAP_READONLY_GROUP.
    #[arg(
        long = "ldap-staff-group",
        env = "LDAP_STAFF_GROUP",
        default_value = "",
        hide = true
    )]
    pub staff_group: String,
}

impl std::fmt::Debug for LdapSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Everything but the password, which `SecretString` hides.
        f.debug_struct("LdapSettings")
            .field("enabled", &self.enabled)
            .field("uri", &self.uri)
            .field("start_tls", &self.start_tls)
            .field("bind_dn", &self.bind_dn)
            .field("bind_password", &self.bind_password)
            .field("user_search_base", &self.user_search_base)
            .field("user_dn_template", &self.user_dn_template)
            .finish_non_exhaustive()
    }
}

/// The default `LDAP_USER_FILTER`.
pub const DEFAULT_LDAP_USER_FILTER: &str = "(uid=%(user)s)";
/// What stands for the user name in `LDAP_USER_FILTER` and
/// `LDAP_USER_DN_TEMPLATE` (the original's Python `%` placeholder).
pub const LDAP_USER_PLACEHOLDER: &str = "%(user)s";
/// How long one LDAP exchange (connecting with TLS, one bind, one search)
/// may take.
pub const DEFAULT_LDAP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A secret (a password) whose `Debug` shows only that it is there, so no
/// log of a configuration carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> SecretString {
        SecretString(secret.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretString(..)")
    }
}

impl std::str::FromStr for SecretString {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(SecretString(s.to_owned()))
    }
}

/// The validated LDAP configuration: where the directory is, how a user's
/// entry is found, and which groups give which role.
#[derive(Debug, Clone)]
pub struct LdapConfig {
    /// `ldap://` or `ldaps://` URI.
    pub uri: String,
    /// Upgrade an `ldap://` connection with StartTLS.
    pub start_tls: bool,
    /// The CA certificates (PEM) to check the server against; `None`: the
    /// system's roots.
    pub ca_file: Option<PathBuf>,
    /// The service account, if any.
    pub service: Option<LdapServiceAccount>,
    /// How a user name becomes a DN.
    pub lookup: LdapUserLookup,
    /// The admins' group DN.
    pub admin_group: Option<String>,
    /// The read-only users' group DN.
    pub readonly_group: Option<String>,
    /// The bound on each exchange with the server ([`DEFAULT_LDAP_TIMEOUT`]).
    pub timeout: std::time::Duration,
}

/// The service account that searches for users and reads groups.
#[derive(Debug, Clone)]
pub struct LdapServiceAccount {
    /// `LDAP_BIND_DN`.
    pub dn: String,
    /// `LDAP_BIND_PASSWORD` (or the content of `LDAP_BIND_PASSWORD_FILE`).
    pub password: SecretString,
}

/// How the DN of the user signing in is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LdapUserLookup {
    /// `LDAP_USER_DN_TEMPLATE`: the DN is the template with the name put in.
    DnTemplate(String),
    /// `LDAP_USER_SEARCH_BASE` and `LDAP_USER_FILTER`: the one entry the
    /// filter finds under the base (subtree).
    Search {
        /// The search base.
        base: String,
        /// The filter, with the placeholder.
        filter: String,
    },
}

impl LdapConfig {
    /// Checks the LDAP knobs: `None` when LDAP is off; an error naming what
    /// to set when it is on and cannot work. Reads the password file and
    /// the CA file once, so a missing one stops the start.
    pub fn from_settings(s: &LdapSettings) -> Result<Option<LdapConfig>, ConfigError> {
        if !s.enabled {
            return Ok(None);
        }
        let err = |var: &'static str, reason: String| ConfigError::Ldap { var, reason };
        let uri = s.uri.trim();
        if uri.is_empty() {
            return Err(err(
                "LDAP_URI",
                "LDAP_ENABLED is on but LDAP_URI is unset: set it to ldap://host or ldaps://host"
                    .into(),
            ));
        }
        let parsed = url::Url::parse(uri)
            .map_err(|e| err("LDAP_URI", format!("{uri:?} is not a URI ({e})")))?;
        if !matches!(parsed.scheme(), "ldap" | "ldaps")
            || parsed.host_str().is_none_or(str::is_empty)
        {
            return Err(err(
                "LDAP_URI",
                format!("{uri:?} is not ldap://host[:port] or ldaps://host[:port]"),
            ));
        }
        if s.start_tls && parsed.scheme() == "ldaps" {
            return Err(err(
                "LDAP_START_TLS",
                format!("{uri:?} is TLS already (ldaps://); StartTLS is for ldap:// URIs"),
            ));
        }
        if parsed.scheme() == "ldap" && !s.start_tls {
            tracing::warn!(
                "LDAP_URI={uri:?} without LDAP_START_TLS: passwords cross the network in clear"
            );
        }
        let ca_file = s.ca_file.clone().filter(|p| !p.as_os_str().is_empty());
        if let Some(path) = &ca_file {
            check_ca_file(path).map_err(|reason| err("LDAP_CA_FILE", reason))?;
        }

        let password = match (&s.bind_password, &s.bind_password_file) {
            (Some(_), Some(_)) => {
                return Err(err(
                    "LDAP_BIND_PASSWORD_FILE",
                    "set either LDAP_BIND_PASSWORD or LDAP_BIND_PASSWORD_FILE, not both".into(),
                ));
            }
            (Some(p), None) => Some(p.clone()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    err(
                        "LDAP_BIND_PASSWORD_FILE",
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                let one_line = text
                    .strip_suffix('\n')
                    .map(|t| t.strip_suffix('\r').unwrap_or(t))
                    .unwrap_or(&text);
                Some(SecretString::new(one_line))
            }
            (None, None) => None,
        }
        .filter(|p| !p.expose().is_empty());
        let bind_dn = s.bind_dn.trim();
        let service = match (bind_dn.is_empty(), password) {
            (true, None) => None,
            (false, Some(password)) => Some(LdapServiceAccount {
                dn: bind_dn.to_owned(),
                password,
            }),
            // An empty password would make the bind an unauthenticated one,
            // which servers answer with success and no rights.
            (false, None) => {
                return Err(err(
                    "LDAP_BIND_PASSWORD",
                    "LDAP_BIND_DN is set but its password is not: set LDAP_BIND_PASSWORD or LDAP_BIND_PASSWORD_FILE"
                        .into(),
                ));
            }
            (true, Some(_)) => {
                return Err(err(
                    "LDAP_BIND_DN",
                    "a bind password is set but LDAP_BIND_DN is not: set the service account's DN"
                        .into(),
                ));
            }
        };

        let template = s.user_dn_template.trim();
        let base = s.user_search_base.trim();
        let lookup = if !template.is_empty() {
            if !template.contains(LDAP_USER_PLACEHOLDER) {
                return Err(err(
                    "LDAP_USER_DN_TEMPLATE",
                    format!("{template:?} has no {LDAP_USER_PLACEHOLDER} for the user name"),
                ));
            }
            LdapUserLookup::DnTemplate(template.to_owned())
        } else if !base.is_empty() {
            let filter = s.user_filter.trim();
            if !filter.contains(LDAP_USER_PLACEHOLDER) {
                return Err(err(
                    "LDAP_USER_FILTER",
                    format!(
                        "{filter:?} has no {LDAP_USER_PLACEHOLDER}: every user would match the same entries"
                    ),
                ));
            }
            if ldap3::parse_filter(filter.replace(LDAP_USER_PLACEHOLDER, "x")).is_err() {
                return Err(err(
                    "LDAP_USER_FILTER",
                    format!("{filter:?} is not an LDAP filter (RFC 4515), e.g. (uid=%(user)s)"),
                ));
            }
            LdapUserLookup::Search {
                base: base.to_owned(),
                filter: filter.to_owned(),
            }
        } else {
            return Err(err(
                "LDAP_USER_SEARCH_BASE",
                "set LDAP_USER_SEARCH_BASE (with LDAP_USER_FILTER, default (uid=%(user)s)) or LDAP_USER_DN_TEMPLATE: otherwise no user can be found"
                    .into(),
            ));
        };

        let group = |v: &str| Some(v.trim().to_owned()).filter(|g| !g.is_empty());
        let admin_group = group(&s.admin_group);
        let readonly_group = group(&s.readonly_group).or_else(|| group(&s.staff_group));
        if admin_group.is_none() && readonly_group.is_none() {
            return Err(err(
                "LDAP_ADMIN_GROUP",
                "set LDAP_ADMIN_GROUP and/or LDAP_READONLY_GROUP (group DNs): a user in neither is refused, so without them nobody could sign in"
                    .into(),
            ));
        }
        Ok(Some(LdapConfig {
            uri: uri.to_owned(),
            start_tls: s.start_tls,
            ca_file,
            service,
            lookup,
            admin_group,
            readonly_group,
            timeout: DEFAULT_LDAP_TIMEOUT,
        }))
    }
}

/// Parses a boolean knob: 1, true, yes, on or 0, false, no, off, empty.
fn parse_switch(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        other => Err(format!(
            "{other:?} is not 1 or 0 (true, yes, on; false, no, off)"
        )),
    }
}

/// Checks that `path` holds at least one PEM certificate.
fn check_ca_file(path: &std::path::Path) -> Result<(), String> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not PEM certificates ({e})", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(())
}

/// A knob has a value we cannot use.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Unknown database engine.
    #[error("DB_ENGINE={0:?} is not sqlite, mysql (mariadb) or postgres")]
    Engine(String),
    /// An address that does not parse.
    #[error("{var}: {value:?} is not an IP address")]
    Ip {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// An HTTPS listen address that does not parse.
    #[error("MPROV_HTTPS_LISTEN: {0:?} is neither an address:port nor `off`")]
    HttpsListen(String),
    /// A proxy entry that does not parse.
    #[error("TRUSTED_PROXIES: {0:?} is not an IP address or CIDR range")]
    Proxy(String),
    /// An LDAP knob that cannot work, with what to set.
    #[error("{var}: {reason}")]
    Ldap {
        /// The variable to set or fix.
        var: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A public URL that cannot go into an iPXE script.
    #[error(
        "MPROV_PUBLIC_URL: {0:?} cannot go into an iPXE script (nodes chain to it): no spaces, quotes, `$`, `#`, `\\`, `;`, `&` or `|`"
    )]
    PublicUrl(String),
}

/// How long a node still booting may be quiet before the boot board flags
/// it stuck, unless `MPROV_BOARD_STUCK_SECONDS` says otherwise.
pub const DEFAULT_BOARD_STUCK_SECONDS: u64 = 600;

/// What one identity (a node's or a job server's certificate) may write,
/// and how long boot events are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteLimits {
    /// Boot events a minute per node.
    pub node_events_per_minute: u32,
    /// Boot events a minute per job server.
    pub jobserver_events_per_minute: u32,
    /// Renewals an hour per node or job server.
    pub renewals_per_hour: u32,
    /// Days boot events are kept.
    pub boot_events_keep_days: u32,
}

/// How long a job server may be silent (no heartbeat) before its running
/// jobs are failed and before it is deleted; zero turns either off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobServerSilence {
    /// `JOBSERVER_FAIL_JOBS_AFTER_MINUTES`.
    pub fail_jobs_after_minutes: u32,
    /// `JOBSERVER_DELETE_AFTER_DAYS`.
    pub delete_after_days: u32,
}

/// The admin pages' knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pages {
    /// How long a session lasts without a request (`SESSION_EXPIRE_SECONDS`).
    pub session_idle: std::time::Duration,
    /// The most fields one posted form may have (`DATA_UPLOAD_MAX_NUMBER_FIELDS`).
    pub max_fields: usize,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the API listens.
    pub listen: SocketAddr,
    /// Where to write the bound address, if anywhere.
    pub listen_file: Option<PathBuf>,
    /// Where the HTTPS API listens; `None`: HTTPS is off.
    pub https_listen: Option<SocketAddr>,
    /// Where to write the bound HTTPS address, if anywhere.
    pub https_listen_file: Option<PathBuf>,
    /// The TLS folder.
    pub tls_dir: PathBuf,
    /// Where the shared API key is accepted.
    pub shared_key_mode: SharedKeyMode,
    /// The web service's system user; `None`: stay as started.
    pub user: Option<String>,
    /// The signing helper's system user; `None`: stay as started.
    pub signer_user: Option<String>,
    /// A site certificate to serve instead of the install's own.
    pub tls_cert: Option<PathBuf>,
    /// The site certificate's key.
    pub tls_key: Option<PathBuf>,
    /// The config folder.
    pub config_dir: PathBuf,
    /// The state folder.
    pub state_dir: PathBuf,
    /// The database URL.
    pub database_url: String,
    /// The control host's name.
    pub hostname: String,
    /// Its IPs.
    pub ips: Vec<IpAddr>,
    /// The cluster domain.
    pub domain: String,
    /// A job server certificate's validity, seconds.
    pub jobserver_cert_seconds: u64,
    /// A node certificate's validity, seconds.
    pub node_cert_seconds: u64,
    /// How old a job server's last heartbeat may be before nodes are no
    /// longer sent to it.
    pub jobserver_stale: std::time::Duration,
    /// The boot script carries iPXE's lease to the agent.
    pub ipxe_carry_lease: bool,
    /// What a discovered node's match may bind without an admin.
    pub discovery_policy: DiscoveryPolicy,
    /// The image an unknown node boots in discovery mode, if any.
    pub discovery_image: Option<String>,
    /// Host header values accepted; `None` accepts any.
    pub allowed_hosts: Option<Vec<String>>,
    /// The time zone, and its name.
    pub time_zone: (String, jiff::tz::TimeZone),
    /// The admin pages' knobs.
    pub pages: Pages,
    /// Proxies whose X-Forwarded-For is trusted.
    pub trusted_proxies: Vec<IpNet>,
    /// The version check is off.
    pub skip_version_check: bool,
    /// Path prefixes exempt from the version check.
    pub version_exempt: Vec<String>,
    /// Resolvers job servers forward other names to.
    pub dns_upstreams: Vec<IpAddr>,
    /// The URL nodes reach this service by, without a trailing slash.
    pub public_url: String,
    /// `/ipxe/` requests a minute per MAC.
    pub ipxe_limit_per_mac: u32,
    /// `/ipxe/` requests a minute in total.
    pub ipxe_limit_total: u32,
    /// What a connection may hold, and for how long.
    pub connections: mprov_process::listen::Limits,
    /// The per-identity write budgets and the boot events' retention.
    pub writes: WriteLimits,
    /// When silent job servers' jobs are failed and their rows deleted.
    pub silence: JobServerSilence,
    /// `MPROV_BOARD_STUCK_SECONDS`: how long a node still booting may be
    /// quiet before the boot board flags it stuck.
    pub board_stuck_seconds: u64,
    /// The first-start admin password, if given.
    pub superuser_password: Option<String>,
    /// The secret key, if given in the environment.
    pub secret_key: Option<String>,
    /// The default backup folder.
    pub backup_dir: PathBuf,
    /// Further folders served to the network (see `backup::served_dirs`).
    pub served_dirs: Vec<PathBuf>,
    /// LDAP sign-in for the admin pages; `None`: off.
    pub ldap: Option<LdapConfig>,
}

fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split([',', ' ']).map(str::trim).filter(|x| !x.is_empty())
}

/// This machine's host name, short.
pub fn machine_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().split('.').next().unwrap_or_default().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "mprov-control".to_owned())
}

/// Picks the time zone: TIME_ZONE, else TZ, else UTC. A value that names no
/// zone is logged and UTC used, as the original did.
pub fn pick_time_zone(time_zone: Option<&str>, tz: Option<&str>) -> (String, jiff::tz::TimeZone) {
    let (var, wanted) = match (time_zone, tz) {
        (Some(v), _) if !v.is_empty() => ("TIME_ZONE", v),
        (_, Some(v)) if !v.is_empty() => ("TZ", v.trim_start_matches(':')),
        _ => return ("UTC".into(), jiff::tz::TimeZone::UTC),
    };
    match jiff::tz::TimeZone::get(wanted) {
        Ok(zone) => (wanted.to_owned(), zone),
        Err(err) => {
            tracing::warn!("{var}={wanted:?} is not a time zone name ({err}); using UTC");
            ("UTC".into(), jiff::tz::TimeZone::UTC)
        }
    }
}

impl Config {
    /// Validates the knobs.
    pub fn from_settings(s: Settings) -> Result<Config, ConfigError> {
        let database_url = match &s.database_url {
            Some(url) => url.clone(),
            None => database_url(&s)?,
        };
        let hostname = s
            .hostname
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(machine_hostname);
        let ips = list(&s.ips)
            .map(|v| {
                v.parse().map_err(|_| ConfigError::Ip {
                    var: "MPROV_MPCC_IPs",
                    value: v.into(),
                })
            })
            .collect::<Result<Vec<IpAddr>, _>>()?;
        let trusted_proxies = list(&s.trusted_proxies)
            .map(|v| {
                v.parse::<IpNet>()
                    .or_else(|_| v.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| ConfigError::Proxy(v.into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let extra: Vec<String> = list(&s.allowed_hosts)
            .map(str::to_ascii_lowercase)
            .collect();
        let allowed_hosts = if extra.iter().any(|h| h == "*") {
            None
        } else {
            let mut hosts = vec![
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
                "::1".to_owned(),
            ];
            hosts.push(hostname.to_ascii_lowercase());
            if !s.domain.is_empty() {
                hosts.push(format!("{}.{}", hostname, s.domain).to_ascii_lowercase());
            }
            hosts.extend(ips.iter().map(IpAddr::to_string));
            hosts.extend(extra);
            Some(hosts)
        };
        let dns_upstreams = list(&s.dns_upstreams)
            .map(|v| {
                v.parse().map_err(|_| ConfigError::Ip {
                    var: "MPROV_DNS_UPSTREAMS",
                    value: v.into(),
                })
            })
            .collect::<Result<Vec<IpAddr>, _>>()?;
        let public_url = match s.public_url.as_deref().filter(|u| !u.is_empty()) {
            Some(u) => u.trim_end_matches('/').to_owned(),
            None => {
                let host = match ips.first() {
                    Some(IpAddr::V6(v6)) => format!("[{v6}]"),
                    Some(ip) => ip.to_string(),
                    None => hostname.clone(),
                };
                format!("http://{host}:{}", s.listen.port())
            }
        };
        // Every `/ipxe/` answer chains to it: checked here once, so a refusal
        // there is always a retry script, never an error.
        if !mprov_ipxe::safe_word(&public_url)
            || !mprov_ipxe::safe_chain_url(&mprov_api::boot::ipxe_chain_url(&public_url))
        {
            return Err(ConfigError::PublicUrl(public_url));
        }
        let tz_env = std::env::var("TZ").ok();
        let version_exempt = match &s.version_exempt {
            Some(v) => list(v).map(str::to_owned).collect(),
            None => DEFAULT_VERSION_EXEMPT
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
        };
        let https_listen = match s.https_listen.trim() {
            "off" | "none" | "" => None,
            v => Some(
                v.parse::<SocketAddr>()
                    .map_err(|_| ConfigError::HttpsListen(v.to_owned()))?,
            ),
        };
        let tls_dir = s
            .tls_dir
            .clone()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or_else(|| s.state_dir.join("tls"));
        let nonempty = |p: Option<PathBuf>| p.filter(|p| !p.as_os_str().is_empty());
        let backup_dir =
            nonempty(s.backup_dir.clone()).unwrap_or_else(|| s.state_dir.join(BACKUP_DIR_NAME));
        let ldap = LdapConfig::from_settings(&s.ldap)?;
        let served_dirs = s
            .served_dirs
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .collect();
        Ok(Config {
            listen: s.listen,
            listen_file: s.listen_file,
            https_listen,
            https_listen_file: s.https_listen_file,
            tls_dir,
            shared_key_mode: s.shared_key_mode,
            user: Some(s.user).filter(|u| !u.is_empty() && u != "root"),
            signer_user: Some(s.signer_user).filter(|u| !u.is_empty() && u != "root"),
            tls_cert: nonempty(s.tls_cert),
            tls_key: nonempty(s.tls_key),
            config_dir: s.config_dir,
            state_dir: s.state_dir,
            database_url,
            hostname,
            ips,
            domain: s.domain,
            allowed_hosts,
            time_zone: pick_time_zone(s.time_zone.as_deref(), tz_env.as_deref()),
            pages: Pages {
                session_idle: std::time::Duration::from_secs(s.session_expire_seconds),
                max_fields: usize::try_from(s.data_upload_max_number_fields).unwrap_or(usize::MAX),
            },
            trusted_proxies,
            skip_version_check: mprov_api::skip_version_check(s.skip_version_check.as_deref()),
            version_exempt,
            dns_upstreams,
            public_url,
            ipxe_limit_per_mac: s.ipxe_limit_per_mac,
            ipxe_limit_total: s.ipxe_limit_total,
            connections: mprov_process::listen::Limits {
                max: s.max_connections.max(1),
                first_request: std::time::Duration::from_secs(s.first_request_seconds.max(1)),
                idle: std::time::Duration::from_secs(s.idle_seconds.max(1)),
            },
            writes: WriteLimits {
                node_events_per_minute: s.boot_events_per_minute.max(1),
                jobserver_events_per_minute: s.jobserver_events_per_minute.max(1),
                renewals_per_hour: s.renewals_per_hour.max(1),
                boot_events_keep_days: s.boot_events_keep_days.max(1),
            },
            board_stuck_seconds: s.board_stuck_seconds,
            silence: JobServerSilence {
                fail_jobs_after_minutes: s.jobserver_fail_jobs_after_minutes,
                delete_after_days: s.jobserver_delete_after_days,
            },
            superuser_password: s.superuser_password.filter(|p| !p.is_empty()),
            secret_key: s.secret_key.filter(|k| !k.is_empty()),
            backup_dir,
            served_dirs,
            ldap,
            jobserver_cert_seconds: s.jobserver_cert_seconds.unwrap_or(JOBSERVER_MAX_SECONDS),
            node_cert_seconds: s.node_cert_seconds.unwrap_or(NODE_MAX_SECONDS),
            jobserver_stale: std::time::Duration::from_secs(s.jobserver_stale_seconds.max(1)),
            ipxe_carry_lease: s.ipxe_carry_lease,
            discovery_policy: s.discovery_policy,
            discovery_image: s.discovery_image.filter(|i| !i.trim().is_empty()),
        })
    }

    /// Whether a `Host` header value is one we answer to.
    pub fn host_allowed(&self, host: &str) -> bool {
        let Some(allowed) = &self.allowed_hosts else {
            return true;
        };
        let name = strip_port(host).to_ascii_lowercase();
        allowed.contains(&name)
    }

    /// The URL a booting node's agent talks to (`mprov_url`): its requests
    /// after enrollment are mTLS, so it must be HTTPS. The public URL when
    /// it is HTTPS already; otherwise the same host on the HTTPS port (iPXE
    /// chains over plain HTTP, the agent does not). With HTTPS off, the
    /// public URL as it is (the agent then says it cannot use it).
    pub fn node_url(&self) -> String {
        let Some(https) = self.https_listen.filter(|a| a.port() != 0) else {
            return self.public_url.clone();
        };
        let Some(rest) = self.public_url.strip_prefix("http://") else {
            return self.public_url.clone();
        };
        let authority = rest.split('/').next().unwrap_or(rest);
        // The host without its port (an IPv6 host keeps its brackets).
        let host = match authority.rfind(']') {
            Some(end) => &authority[..=end],
            None => authority.split(':').next().unwrap_or(authority),
        };
        format!("https://{host}:{}", https.port())
    }

    /// The client's address: the peer, or when the peer is a trusted proxy, the
    /// nearest address in X-Forwarded-For that is not a trusted proxy.
    pub fn client_ip(&self, peer: IpAddr, forwarded_for: Option<&str>) -> IpAddr {
        let trusted = |ip: &IpAddr| self.trusted_proxies.iter().any(|n| n.contains(ip));
        if !trusted(&peer) {
            return peer;
        }
        let Some(xff) = forwarded_for else {
            return peer;
        };
        let mut client = peer;
        for hop in xff.rsplit(',').map(str::trim) {
            match hop.parse::<IpAddr>() {
                Ok(ip) => {
                    client = ip;
                    if !trusted(&ip) {
                        break;
                    }
                }
                // A malformed entry ends what we can trust.
                Err(_) => break,
            }
        }
        client
    }
}

fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.chars().all(|c| c.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

fn database_url(s: &Settings) -> Result<String, ConfigError> {
    let engine = s.db_engine.as_deref().unwrap_or("sqlite");
    let engine: Engine = engine
        .parse()
        .map_err(|()| ConfigError::Engine(engine.to_owned()))?;
    let auth = if s.db_pass.is_empty() {
        enc(&s.db_user)
    } else {
        format!("{}:{}", enc(&s.db_user), enc(&s.db_pass))
    };
    Ok(match engine {
        Engine::Sqlite => {
            format!(
                "sqlite://{}?mode=rwc",
                s.state_dir.join(DB_DIR).join(DB_FILE).display()
            )
        }
        Engine::Mysql => {
            format!(
                "mysql://{auth}@{}:{}/{}",
                s.db_host,
                s.db_port.unwrap_or(3306),
                enc(&s.db_name)
            )
        }
        Engine::Postgres => format!(
            "postgres://{auth}@{}:{}/{}",
            s.db_host,
            s.db_port.unwrap_or(5432),
            enc(&s.db_name)
        ),
    })
}

/// The SQLite database's folder inside the state folder: the one folder the
/// web service's user owns.
pub const DB_DIR: &str = "db";
/// The SQLite database's file name.
pub const DB_FILE: &str = "mprov.sqlite3";
/// What an SQLite database has beside its main file.
pub const DB_SUFFIXES: &[&str] = &["", "-wal", "-shm", "-journal"];

/// How long a job-server certificate is valid, in days.
pub const JOBSERVER_DAYS: u32 = 90;
/// The same in seconds: the default and the most `MPROV_JOBSERVER_CERT_SECONDS` may ask.
pub const JOBSERVER_MAX_SECONDS: u64 = JOBSERVER_DAYS as u64 * 86_400;
/// How long a node certificate is valid, in days.
pub const NODE_DAYS: u32 = 30;
/// The same in seconds: the default and the most `MPROV_NODE_CERT_SECONDS`
/// may ask.
pub const NODE_MAX_SECONDS: u64 = NODE_DAYS as u64 * 86_400;
/// How old a job server's last heartbeat may be, in seconds, before nodes
/// are no longer sent to it: three of the job server's default heartbeats
/// (`mprov-jobserver`'s `MPROV_HEARTBEAT`, 15 s), so one lost heartbeat
/// does not drop it.
pub const DEFAULT_JOBSERVER_STALE_SECONDS: u64 = 45;
/// The backups folder's name inside the state folder (the default).
pub const BACKUP_DIR_NAME: &str = "backups";

/// The database engine behind the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// MariaDB or MySQL.
    Mysql,
    /// PostgreSQL.
    Postgres,
    /// SQLite, the embedded default.
    Sqlite,
}

impl Engine {
    /// The engine a database URL names.
    pub fn from_url(url: &str) -> Option<Engine> {
        let scheme = url.split(':').next()?;
        match scheme {
            "sqlite" => Some(Engine::Sqlite),
            "mysql" | "mariadb" => Some(Engine::Mysql),
            "postgres" | "postgresql" => Some(Engine::Postgres),
            _ => None,
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Engine::Mysql => "mysql",
            Engine::Postgres => "postgres",
            Engine::Sqlite => "sqlite",
        })
    }
}

impl std::str::FromStr for Engine {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "sqlite" | "sqlite3" | "django.db.backends.sqlite3" => Ok(Engine::Sqlite),
            "mysql" | "mariadb" | "django.db.backends.mysql" => Ok(Engine::Mysql),
            "postgres" | "postgresql" | "django.db.backends.postgresql" => Ok(Engine::Postgres),
            _ => Err(()),
        }
    }
}

/// What a discovered node's match may bind without an admin
/// (`MPROV_DISCOVERY_POLICY`; see `crate::discovery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiscoveryPolicy {
    /// Everything waits for an admin (the default).
    #[default]
    Manual,
    /// A MAC binds to a matched NIC that has none.
    Open,
    /// A MAC binds to a matched NIC, replacing the one it has.
    Permissive,
}

impl DiscoveryPolicy {
    /// The policy's name, as configured.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoveryPolicy::Manual => "manual",
            DiscoveryPolicy::Open => "open",
            DiscoveryPolicy::Permissive => "permissive",
        }
    }
}

impl std::str::FromStr for DiscoveryPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "manual" | "" => Ok(DiscoveryPolicy::Manual),
            "open" => Ok(DiscoveryPolicy::Open),
            "permissive" => Ok(DiscoveryPolicy::Permissive),
            other => Err(format!(
                "MPROV_DISCOVERY_POLICY={other:?} is not manual, open or permissive"
            )),
        }
    }
}

impl std::fmt::Display for DiscoveryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the old shared API key is still accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedKeyMode {
    /// Everywhere, as an admin (as before certificates).
    All,
    /// Only for what a node does to itself.
    Nodes,
    /// Nowhere.
    Off,
}

impl std::str::FromStr for SharedKeyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "all" | "" => Ok(SharedKeyMode::All),
            "nodes" => Ok(SharedKeyMode::Nodes),
            "off" => Ok(SharedKeyMode::Off),
            other => Err(format!(
                "MPROV_SHARED_KEY_MODE={other:?} is not all, nodes or off"
            )),
        }
    }
}

/// The host of the example install the unit tests and the fuzz targets
/// configure, as `serve`'s arguments: `mpcc` in the domain `cluster`, at
/// 10.0.0.1, also reached as `admin.example`.
pub const EXAMPLE_HOST_ARGS: [&str; 8] = [
    "--hostname",
    "mpcc",
    "--domain",
    "cluster",
    "--ips",
    "10.0.0.1",
    "--allowed-hosts",
    "admin.example",
];

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        s: Settings,
    }

    fn config(args: &[&str]) -> Config {
        let mut argv = vec!["x"];
        argv.extend_from_slice(args);
        Config::from_settings(Cli::try_parse_from(argv).unwrap().s).unwrap()
    }

    #[test]
    fn the_board_flags_stuck_nodes_after_the_knobs_seconds() {
        assert_eq!(config(&[]).board_stuck_seconds, 600);
        assert_eq!(
            config(&["--board-stuck-seconds", "90"]).board_stuck_seconds,
            90
        );
        assert!(Cli::try_parse_from(["x", "--board-stuck-seconds", "0"]).is_err());
        let cmd = <Cli as clap::CommandFactory>::command();
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_id() == "board_stuck_seconds")
            .unwrap();
        assert_eq!(
            arg.get_env().and_then(|e| e.to_str()),
            Some("MPROV_BOARD_STUCK_SECONDS")
        );
    }

    #[test]
    fn silent_job_servers_follow_the_seeds_knobs() {
        assert_eq!(
            config(&[]).silence,
            JobServerSilence {
                fail_jobs_after_minutes: 10,
                delete_after_days: 0
            }
        );
        let c = config(&[
            "--jobserver-fail-jobs-after-minutes",
            "0",
            "--jobserver-delete-after-days",
            "30",
        ]);
        assert_eq!(
            c.silence,
            JobServerSilence {
                fail_jobs_after_minutes: 0,
                delete_after_days: 30
            }
        );
        // The seed's names, without a prefix.
        let cmd = <Cli as clap::CommandFactory>::command();
        let env = |id: &str| {
            cmd.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
        };
        assert_eq!(
            env("jobserver_fail_jobs_after_minutes").as_deref(),
            Some("JOBSERVER_FAIL_JOBS_AFTER_MINUTES")
        );
        assert_eq!(
            env("jobserver_delete_after_days").as_deref(),
            Some("JOBSERVER_DELETE_AFTER_DAYS")
        );
    }

    #[test]
    fn database_urls_from_db_variables() {
        let c = config(&["--state-dir", "/s"]);
        assert_eq!(c.database_url, "sqlite:///s/db/mprov.sqlite3?mode=rwc");
        let c = config(&[
            "--db-engine",
            "django.db.backends.mysql",
            "--db-host",
            "db",
            "--db-pass",
            "p@ss word",
        ]);
        assert_eq!(c.database_url, "mysql://mprov:p%40ss%20word@db:3306/mprov");
        let c = config(&[
            "--db-engine",
            "postgresql",
            "--db-port",
            "6432",
            "--db-user",
            "u",
        ]);
        assert_eq!(c.database_url, "postgres://u@localhost:6432/mprov");
        let mut argv = vec!["x", "--db-engine", "oracle"];
        argv.truncate(3);
        let s = Cli::try_parse_from(argv).unwrap().s;
        assert!(matches!(
            Config::from_settings(s),
            Err(ConfigError::Engine(_))
        ));
    }

    #[test]
    fn a_public_url_that_cannot_go_into_a_script_is_refused() {
        for bad in [
            "http://mpcc:8080/;reboot",
            "http://mpcc:8080/a b",
            "http://$x/",
        ] {
            let s = Cli::try_parse_from(["x", "--public-url", bad]).unwrap().s;
            assert!(
                matches!(Config::from_settings(s), Err(ConfigError::PublicUrl(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_node_url_is_the_public_host_on_the_https_port() {
        for (public_url, https_listen, node_url) in [
            (
                "http://10.99.0.1:8080/",
                "10.99.0.1:8443",
                "https://10.99.0.1:8443",
            ),
            ("http://[fd00::1]:8080", "[::]:443", "https://[fd00::1]:443"),
            (
                "https://mpcc.cluster:9443",
                "0.0.0.0:443",
                "https://mpcc.cluster:9443",
            ),
            ("http://mpcc:8080", "off", "http://mpcc:8080"),
        ] {
            let c = config(&["--public-url", public_url, "--https-listen", https_listen]);
            assert_eq!(c.node_url(), node_url, "{public_url} {https_listen}");
        }
    }

    #[test]
    fn allowed_hosts() {
        let c = config(&EXAMPLE_HOST_ARGS);
        for ok in [
            "localhost",
            "127.0.0.1:8080",
            "[::1]:80",
            "MPCC",
            "mpcc.cluster",
            "10.0.0.1",
            "admin.example",
        ] {
            assert!(c.host_allowed(ok), "{ok}");
        }
        for bad in ["evil.example", "10.0.0.2", "mpcc.other"] {
            assert!(!c.host_allowed(bad), "{bad}");
        }
        assert!(config(&["--allowed-hosts", "*"]).host_allowed("anything"));
    }

    #[test]
    fn forwarded_for_only_from_trusted_proxies() {
        let c = config(&["--trusted-proxies", "10.0.0.0/24,192.0.2.7"]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // An untrusted peer's header is ignored.
        assert_eq!(
            c.client_ip(ip("198.51.100.1"), Some("1.2.3.4")),
            ip("198.51.100.1")
        );
        // A trusted proxy: the nearest untrusted hop.
        assert_eq!(
            c.client_ip(ip("10.0.0.5"), Some("1.2.3.4, 192.0.2.7")),
            ip("1.2.3.4")
        );
        assert_eq!(
            c.client_ip(ip("10.0.0.5"), Some("5.5.5.5, 1.2.3.4")),
            ip("1.2.3.4")
        );
        assert_eq!(c.client_ip(ip("10.0.0.5"), None), ip("10.0.0.5"));
        assert_eq!(c.client_ip(ip("10.0.0.5"), Some("junk")), ip("10.0.0.5"));
    }

    #[test]
    fn time_zones() {
        assert_eq!(pick_time_zone(Some("Europe/Paris"), None).0, "Europe/Paris");
        assert_eq!(
            pick_time_zone(None, Some("America/New_York")).0,
            "America/New_York"
        );
        assert_eq!(
            pick_time_zone(Some("EST5EDT,M3.2.0,M11.1.0"), Some("Asia/Tokyo")).0,
            "UTC"
        );
        assert_eq!(pick_time_zone(None, None).0, "UTC");
    }

    fn ldap(args: &[&str]) -> Result<Option<LdapConfig>, ConfigError> {
        let mut argv = vec!["x"];
        argv.extend_from_slice(args);
        LdapConfig::from_settings(&Cli::try_parse_from(argv).unwrap().s.ldap)
    }

    fn ldap_refusal(args: &[&str]) -> (&'static str, String) {
        match ldap(args) {
            Err(ConfigError::Ldap { var, reason }) => (var, reason),
            other => panic!("{args:?}: {other:?}"),
        }
    }

    const LDAP_BASICS: [&str; 8] = [
        "--ldap-enabled",
        "1",
        "--ldap-uri",
        "ldap://dir.example:389",
        "--ldap-user-search-base",
        "ou=people,dc=example,dc=org",
        "--ldap-admin-group",
        "cn=admins,dc=example,dc=org",
    ];

    #[test]
    fn ldap_is_off_unless_enabled() {
        assert!(ldap(&[]).unwrap().is_none());
        assert!(ldap(&["--ldap-uri", "ldap://x"]).unwrap().is_none());
        assert!(config(&[]).ldap.is_none());
        // The original's names, without a prefix.
        let cmd = <Cli as clap::CommandFactory>::command();
        for (id, var) in [
            ("enabled", "LDAP_ENABLED"),
            ("uri", "LDAP_URI"),
            ("start_tls", "LDAP_START_TLS"),
            ("bind_dn", "LDAP_BIND_DN"),
            ("bind_password", "LDAP_BIND_PASSWORD"),
            ("user_dn_template", "LDAP_USER_DN_TEMPLATE"),
            ("user_search_base", "LDAP_USER_SEARCH_BASE"),
            ("admin_group", "LDAP_ADMIN_GROUP"),
            ("staff_group", "LDAP_STAFF_GROUP"),
        ] {
            let env = cmd
                .get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned());
            assert_eq!(env.as_deref(), Some(var), "{id}");
        }
    }

    #[test]
    fn ldap_knobs_make_a_config() {
        let c = ldap(&LDAP_BASICS).unwrap().unwrap();
        assert_eq!(c.uri, "ldap://dir.example:389");
        assert_eq!(
            c.lookup,
            LdapUserLookup::Search {
                base: "ou=people,dc=example,dc=org".into(),
                filter: DEFAULT_LDAP_USER_FILTER.into()
            }
        );
        assert_eq!(
            c.admin_group.as_deref(),
            Some("cn=admins,dc=example,dc=org")
        );
        assert_eq!(c.readonly_group, None);
        assert!(c.service.is_none());
        assert_eq!(c.timeout, DEFAULT_LDAP_TIMEOUT);

        // A template wins over the search; the old staff group name is
        // the read-only group's; the password comes from its file.
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "s3cret\n").unwrap();
        let mut args = LDAP_BASICS.to_vec();
        let pw_path = pw.to_str().unwrap();
        args.extend([
            "--ldap-user-dn-template",
            "uid=%(user)s,ou=people,dc=example,dc=org",
            "--ldap-staff-group",
            "cn=staff,dc=example,dc=org",
            "--ldap-bind-dn",
            "cn=svc,dc=example,dc=org",
            "--ldap-bind-password-file",
            pw_path,
            "--ldap-start-tls",
            "true",
        ]);
        let c = ldap(&args).unwrap().unwrap();
        assert_eq!(
            c.lookup,
            LdapUserLookup::DnTemplate("uid=%(user)s,ou=people,dc=example,dc=org".into())
        );
        assert_eq!(
            c.readonly_group.as_deref(),
            Some("cn=staff,dc=example,dc=org")
        );
        let service = c.service.as_ref().unwrap();
        assert_eq!(service.password.expose(), "s3cret");
        assert!(c.start_tls);
        assert!(!format!("{c:?}").contains("s3cret"));

        // LDAP_READONLY_GROUP wins over its old name.
        let mut args = LDAP_BASICS.to_vec();
        args.extend([
            "--ldap-staff-group",
            "cn=old",
            "--ldap-readonly-group",
            "cn=new",
        ]);
        assert_eq!(
            ldap(&args).unwrap().unwrap().readonly_group.as_deref(),
            Some("cn=new")
        );
    }

    #[test]
    fn ldap_refusals_say_what_to_set() {
        let without = |flag: &str| -> Vec<&str> {
            let mut args = Vec::new();
            for pair in LDAP_BASICS.chunks(2) {
                if pair[0] != flag {
                    args.extend_from_slice(pair);
                }
            }
            args
        };
        let (var, reason) = ldap_refusal(&without("--ldap-uri"));
        assert_eq!(var, "LDAP_URI");
        assert!(reason.contains("set it"), "{reason}");
        let (var, reason) = ldap_refusal(&without("--ldap-user-search-base"));
        assert_eq!(var, "LDAP_USER_SEARCH_BASE");
        assert!(reason.contains("LDAP_USER_DN_TEMPLATE"), "{reason}");
        let (var, reason) = ldap_refusal(&without("--ldap-admin-group"));
        assert_eq!(var, "LDAP_ADMIN_GROUP");
        assert!(reason.contains("LDAP_READONLY_GROUP"), "{reason}");

        for (extra, expected) in [
            (&["--ldap-uri", "http://dir.example"][..], "LDAP_URI"),
            (&["--ldap-uri", "ldap://"], "LDAP_URI"),
            (
                &["--ldap-uri", "ldaps://dir.example", "--ldap-start-tls", "1"],
                "LDAP_START_TLS",
            ),
            (&["--ldap-bind-dn", "cn=svc"], "LDAP_BIND_PASSWORD"),
            (&["--ldap-bind-password", "pw"], "LDAP_BIND_DN"),
            (&["--ldap-user-filter", "(uid=alice)"], "LDAP_USER_FILTER"),
            (
                &["--ldap-user-filter", "uid=%(user)s)("],
                "LDAP_USER_FILTER",
            ),
            (
                &["--ldap-user-dn-template", "uid=alice,dc=x"],
                "LDAP_USER_DN_TEMPLATE",
            ),
            (&["--ldap-ca-file", "/nonexistent/ca.pem"], "LDAP_CA_FILE"),
            (
                &[
                    "--ldap-bind-dn",
                    "cn=svc",
                    "--ldap-bind-password-file",
                    "/nonexistent/pw",
                ],
                "LDAP_BIND_PASSWORD_FILE",
            ),
        ] {
            // The basics, with what `extra` sets instead.
            let mut args: Vec<&str> = LDAP_BASICS
                .chunks(2)
                .filter(|pair| !extra.contains(&pair[0]))
                .flatten()
                .copied()
                .collect();
            args.extend_from_slice(extra);
            let (var, reason) = ldap_refusal(&args);
            assert_eq!(var, expected, "{extra:?}: {reason}");
            assert!(!reason.contains("pw\""), "{reason}");
        }
        // A switch that is neither on nor off is clap's error.
        let mut argv = vec!["x"];
        argv.extend(["--ldap-enabled", "maybe"]);
        assert!(Cli::try_parse_from(argv).is_err());
    }

    #[test]
    fn the_lease_is_carried_unless_switched_off() {
        assert!(config(&[]).ipxe_carry_lease);
        assert!(!config(&["--ipxe-carry-lease", "off"]).ipxe_carry_lease);
        assert!(config(&["--ipxe-carry-lease", "yes"]).ipxe_carry_lease);
    }

    #[test]
    fn version_knobs() {
        assert!(config(&["--skip-version-check", "1"]).skip_version_check);
        assert!(!config(&["--skip-version-check", "true"]).skip_version_check);
        assert!(!config(&[]).skip_version_check);
        assert_eq!(
            config(&["--version-exempt", "/a/, /b/"]).version_exempt,
            ["/a/", "/b/"]
        );
    }
}
