//! A real OpenLDAP server (`slapd`) for tests, in the style of [`crate::db`]:
//!
//! * It lives in its own `tempfile` folder: a `cn=config` folder made with
//!   `slapadd -n0` from an LDIF (the mdb backend for [`SUFFIX`], with the
//!   root DN [`ROOT_DN`]), the data loaded with `slapadd -n1`, a TLS
//!   certificate for StartTLS, and its log. Nothing touches `/etc/ldap` or
//!   `/var/lib/ldap`, nor the system's slapd if one runs.
//! * It listens on `ldap://127.0.0.1:PORT` only, on a port picked free,
//!   retried when taken (as the database servers are).
//! * It runs in the foreground (`-d 0`: no fork, the PID we spawned is
//!   slapd's), as Debian's `openldap` user when we are root (through
//!   `setpriv`, which execs it), its folder given to that user.
//! * It is ready when `ldapwhoami -x` (anonymous) answers; we poll a
//!   bounded number of times.
//! * Dropping it stops slapd (SIGTERM, then SIGKILL after a bounded wait)
//!   and removes the folder; [`Slapd::stop`] does the same and reports.
//!
//! The certificate is made at start with rcgen: a test CA ([`Slapd::ca_pem`])
//! and a server certificate for `127.0.0.1` and `localhost` signed by it.
//!
//! The server allows an *unauthenticated* bind (a DN with an empty
//! password, `olcAllows: bind_anon_dn`), so a test can show that an empty
//! password "succeeds" against it when a client does not refuse it first.

use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};

use crate::db::{RunAs, Server, require, run_logged};

/// The directory's suffix: every entry lives under it.
pub const SUFFIX: &str = "dc=example,dc=org";
/// The root DN, which may do anything.
pub const ROOT_DN: &str = "cn=admin,dc=example,dc=org";
/// The root DN's password. This server only listens on loopback and only
/// lives as long as a test.
pub const ROOT_PASSWORD: &str = "rootpw";

const SLAPD: &str = "/usr/sbin/slapd";
const SLAPADD: &str = "/usr/sbin/slapadd";
const LDAPWHOAMI: &str = "/usr/bin/ldapwhoami";
/// Where Debian's slapd keeps its backends and overlays as modules.
const MODULE_DIR: &str = "/usr/lib/ldap";
const SCHEMA_DIR: &str = "/etc/ldap/schema";
/// The schemas loaded: people (`inetOrgPerson`), groups (`groupOfNames`,
/// `groupOfUniqueNames`, `posixGroup` from nis).
const SCHEMAS: &[&str] = &["core", "cosine", "nis", "inetorgperson"];

/// A slapd in a temporary folder, stopped when dropped.
#[derive(Debug)]
pub struct Slapd {
    server: Server,
    ca_pem: String,
    ca_file: PathBuf,
}

impl Slapd {
    /// Starts a slapd whose directory holds the suffix's entry and `data`
    /// (LDIF entries under [`SUFFIX`]), and waits until it answers.
    pub fn start(data: &str) -> Result<Slapd> {
        let slapd = require(Path::new(SLAPD), "slapd")?;
        let slapadd = require(Path::new(SLAPADD), "slapd")?;
        let whoami = require(Path::new(LDAPWHOAMI), "ldap-utils")?;
        for schema in SCHEMAS {
            require(
                &Path::new(SCHEMA_DIR).join(format!("{schema}.ldif")),
                "slapd",
            )?;
        }
        let run_as = RunAs::service_user("openldap")?;
        let dir = run_as.temp_dir("mprov-slapd-")?;
        let root = dir.path().to_path_buf();

        let tls = TestPki::new()?;
        let ca_file = root.join("ca.pem");
        let cert_file = root.join("server.pem");
        let key_file = root.join("server.key");
        for (path, pem) in [
            (&ca_file, &tls.ca_pem),
            (&cert_file, &tls.cert_pem),
            (&key_file, &tls.key_pem),
        ] {
            fs::write(path, pem).with_context(|| format!("writing {}", path.display()))?;
            run_as.give(path)?;
        }

        let config_dir = root.join("slapd.d");
        let data_dir = root.join("data");
        for d in [&config_dir, &data_dir] {
            fs::create_dir(d).with_context(|| format!("creating {}", d.display()))?;
            run_as.give(d)?;
        }
        let config_ldif = root.join("config.ldif");
        fs::write(
            &config_ldif,
            config_ldif_text(&data_dir, &cert_file, &key_file, &ca_file),
        )
        .with_context(|| format!("writing {}", config_ldif.display()))?;
        let data_ldif = root.join("data.ldif");
        fs::write(
            &data_ldif,
            format!(
                "dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\n\
                 dc: example\no: Example\n\n{data}"
            ),
        )
        .with_context(|| format!("writing {}", data_ldif.display()))?;

        let mut cmd = run_as.command(&slapadd);
        cmd.arg("-n0")
            .arg("-F")
            .arg(&config_dir)
            .arg("-l")
            .arg(&config_ldif);
        run_logged(cmd, &root, "slapadd-config")?;
        let mut cmd = run_as.command(&slapadd);
        cmd.arg("-n1")
            .arg("-F")
            .arg(&config_dir)
            .arg("-l")
            .arg(&data_ldif);
        run_logged(cmd, &root, "slapadd-data")?;

        let server = Server::launch(
            "slapd",
            dir,
            move |port| {
                let mut cmd = run_as.command(&slapd);
                // `-d 0`: stay in the foreground, log nothing but errors.
                cmd.args(["-d", "0"])
                    .arg("-F")
                    .arg(&config_dir)
                    .arg("-h")
                    .arg(format!("ldap://127.0.0.1:{port}/"));
                cmd
            },
            move |port| {
                Command::new(&whoami)
                    .args(["-x", "-o", "nettimeout=2", "-H"])
                    .arg(format!("ldap://127.0.0.1:{port}/"))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            },
        )?;
        Ok(Slapd {
            ca_file: server.dir().join("ca.pem"),
            server,
            ca_pem: tls.ca_pem,
        })
    }

    /// `ldap://127.0.0.1:PORT`.
    pub fn uri(&self) -> String {
        format!("ldap://127.0.0.1:{}", self.server.port())
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The test CA that signed the server's certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The same CA in a file.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// Its folder (config, data, log).
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// Stops slapd and removes its folder, reporting what went wrong.
    pub fn stop(self) -> Result<()> {
        self.server.stop()
    }
}

/// The `cn=config` LDIF: modules, schemas, TLS, the config database closed
/// to everyone, and the mdb database for [`SUFFIX`] where a password is
/// only for binding and everything else readable.
fn config_ldif_text(data_dir: &Path, cert: &Path, key: &Path, ca: &Path) -> String {
    let includes: String = SCHEMAS
        .iter()
        .map(|s| format!("include: file://{SCHEMA_DIR}/{s}.ldif\n"))
        .collect();
    format!(
        "dn: cn=config
objectClass: olcGlobal
cn: config
olcAllows: bind_anon_dn
olcTLSCACertificateFile: {ca}
olcTLSCertificateFile: {cert}
olcTLSCertificateKeyFile: {key}

dn: cn=module{{0}},cn=config
objectClass: olcModuleList
cn: module{{0}}
olcModulePath: {MODULE_DIR}
olcModuleLoad: back_mdb

dn: cn=schema,cn=config
objectClass: olcSchemaConfig
cn: schema

{includes}
dn: olcDatabase={{-1}}frontend,cn=config
objectClass: olcDatabaseConfig
objectClass: olcFrontendConfig
olcDatabase: {{-1}}frontend

dn: olcDatabase={{0}}config,cn=config
objectClass: olcDatabaseConfig
olcDatabase: {{0}}config
olcAccess: {{0}}to * by * none

dn: olcDatabase={{1}}mdb,cn=config
objectClass: olcDatabaseConfig
objectClass: olcMdbConfig
olcDatabase: {{1}}mdb
olcSuffix: {SUFFIX}
olcRootDN: {ROOT_DN}
olcRootPW: {ROOT_PASSWORD}
olcDbDirectory: {data}
olcAccess: {{0}}to attrs=userPassword by self write by anonymous auth by * none
olcAccess: {{1}}to * by * read
",
        ca = ca.display(),
        cert = cert.display(),
        key = key.display(),
        data = data_dir.display(),
    )
}

/// A test CA and a server certificate it signed, for `127.0.0.1` and
/// `localhost`, all PEM.
#[derive(Debug)]
pub struct TestPki {
    /// The CA's certificate.
    pub ca_pem: String,
    /// The server's certificate.
    pub cert_pem: String,
    /// The server's key.
    pub key_pem: String,
}

impl TestPki {
    /// Makes a new CA and server certificate.
    pub fn new() -> Result<TestPki> {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
            KeyUsagePurpose, SanType,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "mprov-tests LDAP CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;

        let key = KeyPair::generate()?;
        let mut server = CertificateParams::new(vec!["localhost".to_owned()])?;
        server
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        server
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        let cert = server.signed_by(&key, &ca)?;
        Ok(TestPki {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}
