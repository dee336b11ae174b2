//! LDAP sign-in for the admin pages: a user name and password checked
//! against a directory, and the role its groups give. No HTTP here: the
//! sign-in page calls [`authenticate`] and maps its [`LdapError`].
//!
//! One sign-in, in order (the configuration is `crate::config::LdapConfig`,
//! from the original's `LDAP_*` variables):
//!
//! 1. **Before any network I/O**, an empty password is refused (a simple
//!    bind with a DN and no password is an *unauthenticated* bind, RFC 4513
//!    §5.1.2, which many servers answer with success), and so is an empty
//!    or absurd user name (longer than [`MAX_USER_NAME`] bytes, control
//!    characters).
//! 2. Connect, with every exchange bounded by `LdapConfig::timeout` (5 s):
//!    `ldaps://`, or `ldap://` upgraded with StartTLS when `LDAP_START_TLS`
//!    is on. The server's certificate is checked against `LDAP_CA_FILE`
//!    when given, else the system's roots, always with ring as the crypto
//!    provider.
//! 3. Find the user's DN: with `LDAP_USER_DN_TEMPLATE`, the template with
//!    the name escaped for a DN (RFC 4514); otherwise bind as the service
//!    account (`LDAP_BIND_DN`; anonymously without one) and search
//!    `LDAP_USER_SEARCH_BASE` (subtree) with `LDAP_USER_FILTER`, the name
//!    escaped for a filter (RFC 4515), so `*` or `)(uid=*` match nobody.
//!    Exactly one entry must match.
//! 4. Bind as that DN with the password. An unknown user, several entries
//!    and a wrong password are the same [`LdapError::BadCredentials`], so
//!    the caller cannot tell which names exist.
//! 5. The role: rebound as the service account when there is one (else as
//!    the user), each configured group is read, admin first. **Membership**
//!    is one base-scope search on the group's entry with the filter
//!    `(|(member=DN)(uniqueMember=DN)(memberUid=NAME))`: the server
//!    compares with each attribute's matching rule, so a DN that differs in
//!    case or spacing still matches, and `groupOfNames`,
//!    `groupOfUniqueNames` and `posixGroup` all work without knowing which
//!    the site uses. The user's `memberOf` is not used: it exists only
//!    where the server keeps it (OpenLDAP's memberof overlay, Active
//!    Directory). Nested groups are not followed. In the admin group: an
//!    admin; else in the read-only group: read-only; else refused, naming
//!    the groups.
//!
//! The bind passwords are never put in an error or a log.

use std::sync::Arc;
use std::time::Duration;

use ldap3::{Ldap, LdapConnAsync, LdapConnSettings, LdapResult, Scope, SearchEntry};

use crate::config::{LDAP_USER_PLACEHOLDER, LdapConfig, LdapUserLookup};

/// The longest user name tried, in bytes: a longer one is refused unsent.
pub const MAX_USER_NAME: usize = 256;

/// LDAP result codes we act on (RFC 4511, appendix A).
const RC_SUCCESS: u32 = 0;
const RC_SIZE_LIMIT_EXCEEDED: u32 = 4;
const RC_NO_SUCH_OBJECT: u32 = 32;
const RC_INVALID_CREDENTIALS: u32 = 49;

/// What a signed-in directory user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LdapRole {
    /// A member of `LDAP_ADMIN_GROUP`: everything.
    Admin,
    /// A member of `LDAP_READONLY_GROUP` only: sees everything, changes
    /// nothing.
    ReadOnly,
}

/// A user the directory vouched for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LdapUser {
    /// The user name as the directory spells it (the value of the attribute
    /// the filter or template names, e.g. `uid`), else as typed.
    pub name: String,
    /// The user's entry.
    pub dn: String,
    /// What its groups give.
    pub role: LdapRole,
}

/// Why a sign-in failed.
#[derive(Debug, thiserror::Error)]
pub enum LdapError {
    /// The name and password do not match an entry: an unknown user, a
    /// name several entries match, or a wrong password (one error, so the
    /// answer does not tell which names exist).
    #[error("wrong user name or password")]
    BadCredentials,
    /// An empty password, refused before anything was sent.
    #[error(
        "empty password: refused without asking the directory (a bind without a password is an unauthenticated bind)"
    )]
    EmptyPassword,
    /// An empty or absurd user name, refused before anything was sent.
    #[error("user name refused: {0}")]
    InvalidUserName(&'static str),
    /// The configuration does not match the directory.
    #[error("LDAP misconfigured: {var}: {reason}")]
    Misconfigured {
        /// The variable to fix.
        var: &'static str,
        /// What the directory said.
        reason: String,
    },
    /// The password was right, but the user is in none of the groups.
    #[error("{user} is in none of the groups that allow a sign-in: {}", groups.join("; "))]
    NotInGroup {
        /// The user's DN.
        user: String,
        /// The groups checked.
        groups: Vec<String>,
    },
    /// The server refused an operation for another reason than the ones
    /// above.
    #[error("LDAP server {uri} refused the {op}: result code {rc} ({text})")]
    Server {
        /// The server.
        uri: String,
        /// What was asked (bind, search).
        op: &'static str,
        /// The LDAP result code.
        rc: u32,
        /// The server's diagnostic message.
        text: String,
    },
    /// The server did not answer in time.
    #[error("LDAP server {uri} did not answer within {seconds} s")]
    Timeout {
        /// The server.
        uri: String,
        /// The bound that passed.
        seconds: u64,
    },
    /// TLS (ldaps or StartTLS) could not be set up: a certificate that does
    /// not verify, a server without StartTLS, an unreadable CA file.
    #[error("TLS with the LDAP server {uri} failed: {reason}")]
    Tls {
        /// The server.
        uri: String,
        /// What failed.
        reason: String,
    },
    /// The server cannot be reached, or the connection broke.
    #[error("LDAP server {uri} unreachable")]
    Unreachable {
        /// The server.
        uri: String,
        /// What the connection said.
        #[source]
        err: Box<ldap3::LdapError>,
    },
}

/// Signs `username` in with `password` against the directory `cfg` names:
/// the user and its role, or why not (see the module doc for the steps).
pub async fn authenticate(
    cfg: &LdapConfig,
    username: &str,
    password: &str,
) -> Result<LdapUser, LdapError> {
    check_input(username, password)?;
    // Each exchange has its own bound; this one caps a server that answers
    // every step just in time.
    let overall = cfg.timeout.saturating_mul(8);
    match tokio::time::timeout(overall, sign_in(cfg, username, password)).await {
        Ok(result) => result,
        Err(_) => Err(LdapError::Timeout {
            uri: cfg.uri.clone(),
            seconds: overall.as_secs(),
        }),
    }
}

async fn sign_in(cfg: &LdapConfig, username: &str, password: &str) -> Result<LdapUser, LdapError> {
    let mut session = Session::open(cfg).await?;
    let result = session.sign_in(cfg, username, password).await;
    session.close().await;
    result
}

/// Refuses what must never reach the server: an empty password (an
/// unauthenticated bind "succeeds"), an empty or absurd name.
pub fn check_input(username: &str, password: &str) -> Result<(), LdapError> {
    if password.is_empty() {
        return Err(LdapError::EmptyPassword);
    }
    if username.trim().is_empty() {
        return Err(LdapError::InvalidUserName("empty"));
    }
    if username.len() > MAX_USER_NAME {
        return Err(LdapError::InvalidUserName("longer than 256 bytes"));
    }
    if username.chars().any(char::is_control) {
        return Err(LdapError::InvalidUserName("control characters"));
    }
    Ok(())
}

/// `LDAP_USER_FILTER` with the name put in, escaped for a filter (RFC 4515:
/// `*`, `(`, `)`, `\` and NUL become `\2a` and so on).
pub fn user_filter(filter: &str, username: &str) -> String {
    filter.replace(LDAP_USER_PLACEHOLDER, &ldap3::ldap_escape(username))
}

/// `LDAP_USER_DN_TEMPLATE` with the name put in, escaped for a DN value
/// (RFC 4514: `,`, `+`, `=`, `"`, `\`, `<`, `>`, `;`, a leading `#` or
/// space...).
pub fn user_dn(template: &str, username: &str) -> String {
    template.replace(LDAP_USER_PLACEHOLDER, &ldap3::dn_escape(username))
}

/// The attribute that holds the user name in a filter or DN template: the
/// one right before `=%(user)s` (`uid` in `(uid=%(user)s)` and in
/// `uid=%(user)s,ou=people,...`). `None` when the placeholder stands
/// elsewhere (`(mail=%(user)s@example.org)` still names `mail`, but a
/// template like `%(user)s@example.org` names none).
pub fn name_attribute(template: &str) -> Option<&str> {
    let at = template.find(LDAP_USER_PLACEHOLDER)?;
    let before = template[..at].strip_suffix('=')?;
    let start = before
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == ';' || c == '.'))
        .map_or(0, |i| i + 1);
    let attr = &before[start..];
    (!attr.is_empty()).then_some(attr)
}

/// The filter a group's entry matches when `dn` (or, for a `posixGroup`,
/// `name`) is a member. The values are escaped; the server compares them
/// with each attribute's own matching rule.
pub fn membership_filter(dn: &str, name: &str) -> String {
    let dn = ldap3::ldap_escape(dn);
    format!(
        "(|(member={dn})(uniqueMember={dn})(memberUid={}))",
        ldap3::ldap_escape(name)
    )
}

/// The groups to check, in the order that decides: admin first.
pub fn groups(cfg: &LdapConfig) -> Vec<(LdapRole, &str)> {
    [
        (LdapRole::Admin, cfg.admin_group.as_deref()),
        (LdapRole::ReadOnly, cfg.readonly_group.as_deref()),
    ]
    .into_iter()
    .filter_map(|(role, group)| group.map(|g| (role, g)))
    .collect()
}

/// The role given by the first group (in [`groups`] order) the user is in.
pub fn decide_role(memberships: &[(LdapRole, bool)]) -> Option<LdapRole> {
    memberships
        .iter()
        .find(|(_, member)| *member)
        .map(|(role, _)| *role)
}

/// The user's name as the directory spells it: among the attribute's
/// values, the one equal to the typed name ignoring case, else the first,
/// else the typed name.
pub fn spelled_name(values: &[String], typed: &str) -> String {
    values
        .iter()
        .find(|v| v.eq_ignore_ascii_case(typed))
        .or_else(|| values.first())
        .cloned()
        .unwrap_or_else(|| typed.to_owned())
}

/// One connection to the directory, its driver task aborted on drop.
struct Session {
    ldap: Ldap,
    uri: String,
    timeout: Duration,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Session {
    async fn open(cfg: &LdapConfig) -> Result<Session, LdapError> {
        let uri = cfg.uri.clone();
        let mut settings = LdapConnSettings::new()
            .set_conn_timeout(cfg.timeout)
            .set_starttls(cfg.start_tls);
        if cfg.start_tls || uri.starts_with("ldaps:") {
            settings = settings.set_config(tls_config(cfg)?);
        }
        let (conn, ldap) = LdapConnAsync::with_settings(settings, &uri)
            .await
            .map_err(|err| connect_error(&uri, cfg.timeout, err))?;
        let driver = tokio::spawn(async move {
            if let Err(err) = conn.drive().await {
                tracing::debug!("LDAP connection ended: {err}");
            }
        });
        Ok(Session {
            ldap,
            uri,
            timeout: cfg.timeout,
            driver,
        })
    }

    async fn close(mut self) {
        let _ = self.ldap.with_timeout(self.timeout).unbind().await;
    }

    async fn sign_in(
        &mut self,
        cfg: &LdapConfig,
        username: &str,
        password: &str,
    ) -> Result<LdapUser, LdapError> {
        let (dn, attr, mut names) = match &cfg.lookup {
            LdapUserLookup::DnTemplate(template) => {
                (user_dn(template, username), name_attribute(template), None)
            }
            LdapUserLookup::Search { base, filter } => {
                self.bind_service(cfg).await?;
                let attr = name_attribute(filter);
                let (dn, names) = self.find_user(base, filter, username, attr).await?;
                (dn, attr, Some(names))
            }
        };
        let bound = self.bind(&dn, password).await?;
        match bound.rc {
            RC_SUCCESS => {}
            RC_INVALID_CREDENTIALS => return Err(LdapError::BadCredentials),
            rc => return Err(self.refused("bind", rc, &bound)),
        }
        if names.is_none()
            && let Some(attr) = attr
        {
            // The user's own entry, read as the user: most directories let
            // one read oneself. If not, the name stays as typed.
            names = self.read_attr(&dn, attr).await.ok();
        }
        let name = spelled_name(names.as_deref().unwrap_or_default(), username);
        if cfg.service.is_some() {
            self.bind_service(cfg).await?;
        }
        let mut memberships = Vec::new();
        for (role, group) in groups(cfg) {
            let member = self.is_member(role, group, &dn, &name).await?;
            memberships.push((role, member));
            if member {
                break;
            }
        }
        match decide_role(&memberships) {
            Some(role) => Ok(LdapUser { name, dn, role }),
            None => Err(LdapError::NotInGroup {
                user: dn,
                groups: groups(cfg)
                    .into_iter()
                    .map(|(role, g)| match role {
                        LdapRole::Admin => format!("LDAP_ADMIN_GROUP {g}"),
                        LdapRole::ReadOnly => format!("LDAP_READONLY_GROUP {g}"),
                    })
                    .collect(),
            }),
        }
    }

    /// Binds as the service account, if there is one.
    async fn bind_service(&mut self, cfg: &LdapConfig) -> Result<(), LdapError> {
        let Some(service) = &cfg.service else {
            return Ok(());
        };
        let bound = self.bind(&service.dn, service.password.expose()).await?;
        match bound.rc {
            RC_SUCCESS => Ok(()),
            RC_INVALID_CREDENTIALS => Err(LdapError::Misconfigured {
                var: "LDAP_BIND_PASSWORD",
                reason: format!(
                    "the server refused the service account LDAP_BIND_DN={:?} with this password",
                    service.dn
                ),
            }),
            rc => Err(self.refused("service account's bind", rc, &bound)),
        }
    }

    async fn bind(&mut self, dn: &str, password: &str) -> Result<LdapResult, LdapError> {
        self.ldap
            .with_timeout(self.timeout)
            .simple_bind(dn, password)
            .await
            .map_err(|err| self.op_error(err))
    }

    /// The one entry the filter finds for `username` under `base`: its DN,
    /// and the values of `attr`.
    async fn find_user(
        &mut self,
        base: &str,
        filter: &str,
        username: &str,
        attr: Option<&str>,
    ) -> Result<(String, Vec<String>), LdapError> {
        let filter = user_filter(filter, username);
        // "1.1" asks for no attribute (RFC 4511 §4.5.1.8).
        let attrs = vec![attr.unwrap_or("1.1")];
        let (entries, result) = self.search(base, Scope::Subtree, &filter, attrs).await?;
        match result.rc {
            RC_SUCCESS | RC_SIZE_LIMIT_EXCEEDED => {}
            RC_NO_SUCH_OBJECT => {
                return Err(LdapError::Misconfigured {
                    var: "LDAP_USER_SEARCH_BASE",
                    reason: format!("no entry {base:?} in the directory"),
                });
            }
            rc => return Err(self.refused("user search", rc, &result)),
        }
        match <[SearchEntry; 1]>::try_from(entries) {
            Ok([mut entry]) => {
                let names = attr
                    .and_then(|a| take_attr(&mut entry, a))
                    .unwrap_or_default();
                Ok((entry.dn, names))
            }
            Err(entries) => {
                if entries.len() > 1 {
                    tracing::warn!(
                        "LDAP: LDAP_USER_FILTER matches {} or more entries for one user name; refused",
                        entries.len()
                    );
                }
                Err(LdapError::BadCredentials)
            }
        }
    }

    /// The values of `attr` in the entry `dn`.
    async fn read_attr(&mut self, dn: &str, attr: &str) -> Result<Vec<String>, LdapError> {
        let (entries, result) = self
            .search(dn, Scope::Base, "(objectClass=*)", vec![attr])
            .await?;
        if result.rc != RC_SUCCESS {
            return Err(self.refused("search", result.rc, &result));
        }
        Ok(entries
            .into_iter()
            .next()
            .and_then(|mut e| take_attr(&mut e, attr))
            .unwrap_or_default())
    }

    /// Whether the group `group` (configured for `role`) has the user as a
    /// member (see the module doc).
    async fn is_member(
        &mut self,
        role: LdapRole,
        group: &str,
        dn: &str,
        name: &str,
    ) -> Result<bool, LdapError> {
        let filter = membership_filter(dn, name);
        let (entries, result) = self
            .search(group, Scope::Base, &filter, vec!["1.1"])
            .await?;
        match result.rc {
            RC_SUCCESS => Ok(!entries.is_empty()),
            RC_NO_SUCH_OBJECT => Err(LdapError::Misconfigured {
                var: match role {
                    LdapRole::Admin => "LDAP_ADMIN_GROUP",
                    LdapRole::ReadOnly => "LDAP_READONLY_GROUP",
                },
                reason: format!("no entry {group:?} in the directory"),
            }),
            rc => Err(self.refused("group search", rc, &result)),
        }
    }

    /// A search's entries (references left out) and its result, whatever
    /// its code: the callers decide what a code means.
    async fn search(
        &mut self,
        base: &str,
        scope: Scope,
        filter: &str,
        attrs: Vec<&str>,
    ) -> Result<(Vec<SearchEntry>, LdapResult), LdapError> {
        let ldap3::SearchResult(entries, result) = self
            .ldap
            .with_timeout(self.timeout)
            // Two entries are enough to know a name is ambiguous.
            .with_search_options(ldap3::SearchOptions::new().sizelimit(2))
            .search(base, scope, filter, attrs)
            .await
            .map_err(|err| match err {
                ldap3::LdapError::FilterParsing => LdapError::Misconfigured {
                    var: "LDAP_USER_FILTER",
                    reason: format!("{filter:?} is not an LDAP filter"),
                },
                err => self.op_error(err),
            })?;
        let entries = entries
            .into_iter()
            .filter(|e| !e.is_ref() && !e.is_intermediate())
            .map(SearchEntry::construct)
            .collect();
        Ok((entries, result))
    }

    fn refused(&self, op: &'static str, rc: u32, result: &LdapResult) -> LdapError {
        LdapError::Server {
            uri: self.uri.clone(),
            op,
            rc,
            text: result.text.clone(),
        }
    }

    fn op_error(&self, err: ldap3::LdapError) -> LdapError {
        match err {
            ldap3::LdapError::Timeout { .. } => LdapError::Timeout {
                uri: self.uri.clone(),
                seconds: self.timeout.as_secs(),
            },
            err => LdapError::Unreachable {
                uri: self.uri.clone(),
                err: Box::new(err),
            },
        }
    }
}

/// An attribute's values, looked up ignoring case as LDAP names are.
fn take_attr(entry: &mut SearchEntry, attr: &str) -> Option<Vec<String>> {
    let key = entry
        .attrs
        .keys()
        .find(|k| k.eq_ignore_ascii_case(attr))?
        .clone();
    entry.attrs.remove(&key)
}

/// The TLS client configuration: ring, and the CA file's certificates or
/// the system's roots.
fn tls_config(cfg: &LdapConfig) -> Result<Arc<rustls::ClientConfig>, LdapError> {
    use rustls::pki_types::{CertificateDer, pem::PemObject as _};
    let tls = |reason: String| LdapError::Tls {
        uri: cfg.uri.clone(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    match &cfg.ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| tls(format!("LDAP_CA_FILE {}: {e}", path.display())))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(tls(format!(
                    "LDAP_CA_FILE {} holds no usable CA certificate",
                    path.display()
                )));
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
            if roots.is_empty() {
                return Err(tls(
                    "no system CA certificate found: set LDAP_CA_FILE".to_owned()
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// What a failed connect (TCP, TLS, StartTLS) means.
fn connect_error(uri: &str, timeout: Duration, err: ldap3::LdapError) -> LdapError {
    let uri = uri.to_owned();
    match err {
        ldap3::LdapError::Timeout { .. } => LdapError::Timeout {
            uri,
            seconds: timeout.as_secs(),
        },
        ldap3::LdapError::Rustls { source } => LdapError::Tls {
            uri,
            reason: source.to_string(),
        },
        ldap3::LdapError::DNSName { source } => LdapError::Tls {
            uri,
            reason: format!("the host is no name a certificate can hold ({source})"),
        },
        // StartTLS answered with an error code: the server has no TLS.
        ldap3::LdapError::LdapResult { result } => LdapError::Tls {
            uri,
            reason: format!(
                "the server refused StartTLS: result code {} ({})",
                result.rc, result.text
            ),
        },
        ldap3::LdapError::UrlParsing { .. } | ldap3::LdapError::UnknownScheme(_) => {
            LdapError::Misconfigured {
                var: "LDAP_URI",
                reason: format!("{uri:?} is not an ldap:// or ldaps:// URI"),
            }
        }
        // tokio-rustls reports a handshake failure as an I/O error around
        // the rustls error.
        ldap3::LdapError::Io { source }
            if source
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>()) =>
        {
            LdapError::Tls {
                uri,
                reason: source.to_string(),
            }
        }
        err => LdapError::Unreachable {
            uri,
            err: Box::new(err),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_LDAP_TIMEOUT;

    fn config(admin: Option<&str>, readonly: Option<&str>) -> LdapConfig {
        LdapConfig {
            uri: "ldap://127.0.0.1:1".into(),
            start_tls: false,
            ca_file: None,
            service: None,
            lookup: LdapUserLookup::DnTemplate("uid=%(user)s,dc=x".into()),
            admin_group: admin.map(str::to_owned),
            readonly_group: readonly.map(str::to_owned),
            timeout: DEFAULT_LDAP_TIMEOUT,
        }
    }

    #[test]
    fn filters_escape_the_name() {
        for (name, filter) in [
            ("alice", "(uid=alice)"),
            ("*", "(uid=\\2a)"),
            ("*)(uid=*", "(uid=\\2a\\29\\28uid=\\2a)"),
            ("admin)(|(uid=*", "(uid=admin\\29\\28|\\28uid=\\2a)"),
            ("a\\b", "(uid=a\\5cb)"),
            ("a\0b", "(uid=a\\00b)"),
            ("élodie", "(uid=élodie)"),
        ] {
            assert_eq!(user_filter("(uid=%(user)s)", name), filter, "{name:?}");
        }
        // Every occurrence is replaced.
        assert_eq!(
            user_filter("(|(uid=%(user)s)(mail=%(user)s))", "x*"),
            "(|(uid=x\\2a)(mail=x\\2a))"
        );
    }

    #[test]
    fn dn_templates_escape_the_name() {
        let t = "uid=%(user)s,ou=people,dc=example,dc=org";
        for (name, dn) in [
            ("alice", "uid=alice,ou=people,dc=example,dc=org"),
            (
                "x,ou=admins",
                "uid=x\\2cou\\3dadmins,ou=people,dc=example,dc=org",
            ),
            ("a+b", "uid=a\\2bb,ou=people,dc=example,dc=org"),
            ("#a ", "uid=\\23a\\20,ou=people,dc=example,dc=org"),
            ("a\\", "uid=a\\5c,ou=people,dc=example,dc=org"),
        ] {
            assert_eq!(user_dn(t, name), dn, "{name:?}");
        }
    }

    #[test]
    fn the_name_attribute_is_the_one_before_the_placeholder() {
        for (template, attr) in [
            ("(uid=%(user)s)", Some("uid")),
            (
                "(&(objectClass=person)(sAMAccountName=%(user)s))",
                Some("sAMAccountName"),
            ),
            ("uid=%(user)s,ou=people,dc=example,dc=org", Some("uid")),
            ("cn=%(user)s", Some("cn")),
            ("%(user)s@example.org", None),
            ("(uid=x%(user)s)", None),
            ("(=%(user)s)", None),
        ] {
            assert_eq!(name_attribute(template), attr, "{template}");
        }
    }

    #[test]
    fn membership_is_any_of_the_three_group_kinds() {
        assert_eq!(
            membership_filter("uid=a(b),dc=x", "a*"),
            "(|(member=uid=a\\28b\\29,dc=x)(uniqueMember=uid=a\\28b\\29,dc=x)(memberUid=a\\2a))"
        );
    }

    #[test]
    fn the_admin_group_decides_first() {
        use LdapRole::*;
        assert_eq!(decide_role(&[(Admin, true)]), Some(Admin));
        assert_eq!(
            decide_role(&[(Admin, false), (ReadOnly, true)]),
            Some(ReadOnly)
        );
        assert_eq!(decide_role(&[(Admin, true), (ReadOnly, true)]), Some(Admin));
        assert_eq!(decide_role(&[(Admin, false), (ReadOnly, false)]), None);
        assert_eq!(decide_role(&[(ReadOnly, false)]), None);
        assert_eq!(decide_role(&[]), None);

        let both = config(Some("cn=a"), Some("cn=r"));
        assert_eq!(groups(&both), [(Admin, "cn=a"), (ReadOnly, "cn=r")]);
        assert_eq!(groups(&config(None, Some("cn=r"))), [(ReadOnly, "cn=r")]);
        assert_eq!(groups(&config(Some("cn=a"), None)), [(Admin, "cn=a")]);
    }

    #[test]
    fn the_spelling_is_the_directorys() {
        let values = ["Alice".to_owned(), "alice2".to_owned()];
        assert_eq!(spelled_name(&values, "ALICE"), "Alice");
        assert_eq!(spelled_name(&values, "al"), "Alice");
        assert_eq!(spelled_name(&[], "bob"), "bob");
    }

    #[test]
    fn empty_passwords_and_absurd_names_are_refused_unsent() {
        assert!(matches!(
            check_input("alice", ""),
            Err(LdapError::EmptyPassword)
        ));
        for name in ["", "  ", "a\0b", "a\nb", &"x".repeat(MAX_USER_NAME + 1)] {
            assert!(
                matches!(check_input(name, "pw"), Err(LdapError::InvalidUserName(_))),
                "{name:?}"
            );
        }
        assert!(check_input("alice", "pw").is_ok());
        assert!(check_input(&"x".repeat(MAX_USER_NAME), "pw").is_ok());
    }

    #[tokio::test]
    async fn an_empty_password_never_connects() {
        // Port 1 on loopback has no server: a connect would fail with
        // Unreachable, so EmptyPassword shows nothing was tried.
        let cfg = config(Some("cn=a"), None);
        assert!(matches!(
            authenticate(&cfg, "alice", "").await,
            Err(LdapError::EmptyPassword)
        ));
        assert!(matches!(
            authenticate(&cfg, "alice", "pw").await,
            Err(LdapError::Unreachable { .. })
        ));
    }

    #[test]
    fn errors_name_the_groups_and_never_a_password() {
        let err = LdapError::NotInGroup {
            user: "uid=eve,dc=x".into(),
            groups: vec!["LDAP_ADMIN_GROUP cn=a".into()],
        };
        assert_eq!(
            err.to_string(),
            "uid=eve,dc=x is in none of the groups that allow a sign-in: LDAP_ADMIN_GROUP cn=a"
        );
        let mut cfg = config(None, None);
        cfg.service = Some(crate::config::LdapServiceAccount {
            dn: "cn=svc".into(),
            password: crate::config::SecretString::new("hunter2"),
        });
        assert!(!format!("{cfg:?}").contains("hunter2"));
    }
}
