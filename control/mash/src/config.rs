//! Where mash finds the control service and its credentials.
//!
//! Two layers: flags and environment variables first
//! (`MPROV_URL`, `MPROV_APIKEY`, or `MPROV_USER` and `MPROV_PASSWORD`), then a
//! TOML file, `--config` or the first of `$XDG_CONFIG_HOME/mprov/mash.toml`
//! (`~/.config/mprov/mash.toml`) and `/etc/mprov/mash.toml` that exists. The
//! environment wins so that one shell can point at a test install without
//! editing files; the file is not read at all when the environment says
//! everything, so a broken `/etc/mprov/mash.toml` cannot break a scripted run
//! that does not use it. Unknown keys in the file are errors: a typo such as
//! `api_key` must not silently fall back to other credentials.
//!
//! Credentials are one unit: an API key from the flags or environment wins,
//! then a user and password from there (either half may come from the file),
//! then the file's API key, then the file's user and password.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mprov_api::client::Auth;
use serde::Deserialize;

/// The file's name inside a config folder.
pub const FILE_NAME: &str = "mash.toml";

/// The system-wide config file.
pub const SYSTEM_CONFIG: &str = "/etc/mprov/mash.toml";

/// The connection flags; each also reads an environment variable.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Connection")]
pub struct ConnArgs {
    /// The control service's base URL, e.g. `https://mpcc.example:8443`.
    #[arg(long, env = "MPROV_URL", global = true, value_name = "URL")]
    pub url: Option<String>,

    /// An API key (Authorization: Api-Key). Prefer the environment variable to
    /// the flag, which other users can see in the process list.
    #[arg(
        long,
        env = "MPROV_APIKEY",
        hide_env_values = true,
        global = true,
        value_name = "KEY"
    )]
    pub apikey: Option<String>,

    /// User name for HTTP Basic authentication (with MPROV_PASSWORD).
    #[arg(long, env = "MPROV_USER", global = true, value_name = "USER")]
    pub user: Option<String>,

    /// Password for HTTP Basic authentication. Prefer the environment variable.
    #[arg(
        long,
        env = "MPROV_PASSWORD",
        hide_env_values = true,
        global = true,
        value_name = "PASSWORD"
    )]
    pub password: Option<String>,

    /// PEM file of the CA to trust for https:// (the install's ca.crt);
    /// the system's roots otherwise.
    #[arg(long, env = "MPROV_CA_CERT", global = true, value_name = "PEM")]
    pub ca_cert: Option<PathBuf>,

    /// The config file; by default the first that exists of
    /// $XDG_CONFIG_HOME/mprov/mash.toml and /etc/mprov/mash.toml.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The config file's contents.
#[derive(Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// The control service's base URL.
    pub url: Option<String>,
    /// An API key.
    pub apikey: Option<String>,
    /// A user name for Basic authentication.
    pub user: Option<String>,
    /// The password for Basic authentication.
    pub password: Option<String>,
    /// A PEM file of the CA to trust; relative to the file's folder.
    pub ca_cert: Option<PathBuf>,
}

// Hand-written so that secrets never reach the terminal.
impl fmt::Debug for FileConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |s: &Option<String>| s.as_ref().map(|_| "<redacted>");
        f.debug_struct("FileConfig")
            .field("url", &self.url)
            .field("apikey", &redact(&self.apikey))
            .field("user", &self.user)
            .field("password", &redact(&self.password))
            .field("ca_cert", &self.ca_cert)
            .finish()
    }
}

impl FileConfig {
    /// Parses a config file's text.
    pub fn from_toml(text: &str) -> Result<FileConfig> {
        Ok(toml::from_str(text)?)
    }

    /// Reads and parses the config file at `path`; a relative `ca_cert` is
    /// taken relative to the file's folder.
    pub fn read(path: &Path) -> Result<FileConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("could not read {}", path.display()))?;
        let mut config = FileConfig::from_toml(&text)
            .with_context(|| format!("invalid config file {}", path.display()))?;
        if let (Some(ca), Some(dir)) = (&config.ca_cert, path.parent())
            && ca.is_relative()
        {
            config.ca_cert = Some(dir.join(ca));
        }
        warn_if_readable_secrets(path, &config);
        Ok(config)
    }
}

/// Says so on stderr when a file holding a secret is readable by everyone.
fn warn_if_readable_secrets(path: &Path, config: &FileConfig) {
    use std::os::unix::fs::PermissionsExt;
    let has_secret = config.apikey.is_some() || config.password.is_some();
    let world_readable = std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o004 != 0);
    if has_secret && world_readable {
        eprintln!(
            "mash: warning: {} holds a secret and is readable by every user; chmod o-r it",
            path.display()
        );
    }
}

/// Where to connect and how to authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The control service's base URL.
    pub url: String,
    /// The credentials.
    pub auth: Auth,
    /// A PEM file of the CA to trust, if not the system's roots.
    pub ca_cert: Option<PathBuf>,
}

/// The default config files, most specific first, from the values of
/// `XDG_CONFIG_HOME` and `HOME`.
pub fn default_paths(xdg_config_home: Option<&str>, home: Option<&str>) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    // The XDG spec says to ignore an empty or relative XDG_CONFIG_HOME.
    match (
        xdg_config_home.filter(|p| p.starts_with('/')),
        home.filter(|h| !h.is_empty()),
    ) {
        (Some(xdg), _) => paths.push(Path::new(xdg).join("mprov").join(FILE_NAME)),
        (None, Some(home)) => paths.push(Path::new(home).join(".config/mprov").join(FILE_NAME)),
        (None, None) => {}
    }
    paths.push(PathBuf::from(SYSTEM_CONFIG));
    paths
}

/// The settings from the flags and environment, reading a config file only
/// when they leave something out.
pub fn load(args: &ConnArgs) -> Result<Settings> {
    let args = non_empty(args);
    let complete = args.url.is_some()
        && (args.apikey.is_some() || (args.user.is_some() && args.password.is_some()));
    let file = match &args.config {
        Some(path) => Some(FileConfig::read(path)?),
        None if complete => None,
        None => {
            let xdg = std::env::var("XDG_CONFIG_HOME").ok();
            let home = std::env::var("HOME").ok();
            match default_paths(xdg.as_deref(), home.as_deref())
                .into_iter()
                .find(|p| p.exists())
            {
                Some(path) => Some(FileConfig::read(&path)?),
                None => None,
            }
        }
    };
    resolve(&args, file.unwrap_or_default())
}

/// The flags with empty values dropped: `MPROV_APIKEY=` means unset.
fn non_empty(args: &ConnArgs) -> ConnArgs {
    let keep = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
    ConnArgs {
        url: keep(&args.url),
        apikey: keep(&args.apikey),
        user: keep(&args.user),
        password: keep(&args.password),
        ca_cert: args.ca_cert.clone().filter(|p| !p.as_os_str().is_empty()),
        config: args.config.clone(),
    }
}

/// Layers the flags and environment over the file.
pub fn resolve(args: &ConnArgs, file: FileConfig) -> Result<Settings> {
    let Some(url) = args.url.clone().or(file.url) else {
        bail!("no server URL: set MPROV_URL (or --url), or `url` in the config file");
    };
    let auth = if let Some(key) = &args.apikey {
        Auth::ApiKey(key.clone())
    } else if args.user.is_some() || args.password.is_some() {
        match (
            args.user.clone().or(file.user),
            args.password.clone().or(file.password),
        ) {
            (Some(user), Some(password)) => Auth::Basic { user, password },
            (None, _) => bail!("MPROV_PASSWORD is set but no user: set MPROV_USER too"),
            (_, None) => bail!("MPROV_USER is set but no password: set MPROV_PASSWORD too"),
        }
    } else if let Some(key) = file.apikey {
        Auth::ApiKey(key)
    } else {
        match (file.user, file.password) {
            (Some(user), Some(password)) => Auth::Basic { user, password },
            (Some(_), None) => bail!("the config file has a user but no password"),
            (None, Some(_)) => bail!("the config file has a password but no user"),
            (None, None) => bail!(
                "no credentials: set MPROV_APIKEY, or MPROV_USER and MPROV_PASSWORD, \
                 or `apikey` (or `user` and `password`) in the config file"
            ),
        }
    };
    Ok(Settings {
        url,
        auth,
        ca_cert: args.ca_cert.clone().or(file.ca_cert),
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn file_keys() {
        let text = r#"
            url = "https://mpcc:8443"
            apikey = "abc.def"
            user = "admin"
            password = "pw"
            ca_cert = "ca.crt"
        "#;
        let config = FileConfig::from_toml(text).expect("parse");
        assert_eq!(config.url.as_deref(), Some("https://mpcc:8443"));
        assert_eq!(config.apikey.as_deref(), Some("abc.def"));
        assert_eq!(config.user.as_deref(), Some("admin"));
        assert_eq!(config.password.as_deref(), Some("pw"));
        assert_eq!(config.ca_cert.as_deref(), Some(Path::new("ca.crt")));
        assert_eq!(
            FileConfig::from_toml("").expect("empty"),
            FileConfig::default()
        );
    }

    #[test]
    fn unknown_and_mistyped_keys_are_rejected() {
        for (text, message) in [
            ("api_key = \"x\"", "unknown field `api_key`"),
            ("url = \"u\"\n[extra]\n", "unknown field `extra`"),
            ("url = 8443", "invalid type"),
            // A syntax error: any message will do.
            ("url = ", ""),
        ] {
            let err = FileConfig::from_toml(text).expect_err(text);
            let msg = format!("{err:#}");
            assert!(msg.contains(message), "{text}: {msg}");
        }
    }

    #[test]
    fn read_names_the_file_and_resolves_ca_paths() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FILE_NAME);
        std::fs::write(
            &path,
            "url = \"http://h\"\nuser = \"u\"\npassword = \"p\"\nca_cert = \"ca.pem\"\n",
        )
        .expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let config = FileConfig::read(&path).expect("read");
        assert_eq!(config.ca_cert, Some(dir.path().join("ca.pem")));

        std::fs::write(&path, "apikey = \"k\"\ncolour = \"blue\"\n").expect("write");
        let err = format!("{:#}", FileConfig::read(&path).expect_err("unknown key"));
        assert!(
            err.contains(&path.display().to_string()) && err.contains("colour"),
            "{err}"
        );

        let err = format!(
            "{:#}",
            FileConfig::read(&dir.path().join("missing.toml")).expect_err("missing")
        );
        assert!(err.contains("missing.toml"), "{err}");
    }

    #[test]
    fn debug_redacts_secrets() {
        let config = FileConfig {
            apikey: Some("sekrit-key".into()),
            password: Some("sekrit-pw".into()),
            ..FileConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("sekrit"), "{shown}");
    }

    #[test]
    fn default_config_paths() {
        let system = PathBuf::from(SYSTEM_CONFIG);
        let check = |xdg: Option<&str>, home: Option<&str>, first: Option<&str>| {
            let mut expected: Vec<PathBuf> = first.into_iter().map(PathBuf::from).collect();
            expected.push(system.clone());
            assert_eq!(default_paths(xdg, home), expected, "{xdg:?} {home:?}");
        };
        check(Some("/x"), Some("/home/a"), Some("/x/mprov/mash.toml"));
        check(
            None,
            Some("/home/a"),
            Some("/home/a/.config/mprov/mash.toml"),
        );
        check(
            Some(""),
            Some("/home/a"),
            Some("/home/a/.config/mprov/mash.toml"),
        );
        check(
            Some("rel"),
            Some("/home/a"),
            Some("/home/a/.config/mprov/mash.toml"),
        );
        check(None, None, None);
    }

    fn args(
        url: Option<&str>,
        apikey: Option<&str>,
        user: Option<&str>,
        password: Option<&str>,
    ) -> ConnArgs {
        ConnArgs {
            url: url.map(Into::into),
            apikey: apikey.map(Into::into),
            user: user.map(Into::into),
            password: password.map(Into::into),
            ..ConnArgs::default()
        }
    }

    fn file(text: &str) -> FileConfig {
        FileConfig::from_toml(text).expect("file")
    }

    fn basic(user: &str, password: &str) -> Auth {
        Auth::Basic {
            user: user.into(),
            password: password.into(),
        }
    }

    #[test]
    fn layering() {
        let full_file =
            file("url = \"http://file\"\napikey = \"filekey\"\nuser = \"fu\"\npassword = \"fp\"");
        let check = |args: ConnArgs, file: FileConfig, expected: Result<(&str, Auth), &str>| match (
            resolve(&args, file),
            expected,
        ) {
            (Ok(got), Ok((url, auth))) => {
                assert_eq!(got.url, url, "{args:?}");
                assert_eq!(got.auth, auth, "{args:?}");
            }
            (Err(err), Err(message)) => {
                assert!(err.to_string().contains(message), "{args:?}: {err}")
            }
            (got, expected) => panic!("{args:?}: got {got:?}, expected {expected:?}"),
        };
        // The environment wins, as a unit.
        check(
            args(Some("http://env"), Some("envkey"), None, None),
            file("url = \"http://file\"\napikey = \"filekey\""),
            Ok(("http://env", Auth::ApiKey("envkey".into()))),
        );
        check(
            args(None, None, Some("eu"), Some("ep")),
            file("url = \"http://file\"\napikey = \"filekey\""),
            Ok(("http://file", basic("eu", "ep"))),
        );
        // A half of Basic from the environment takes the other half from the file.
        check(
            args(None, None, Some("eu"), None),
            full_file,
            Ok(("http://file", basic("eu", "fp"))),
        );
        check(
            args(Some("http://e"), None, None, Some("ep")),
            FileConfig::default(),
            Err("set MPROV_USER"),
        );
        check(
            args(Some("http://e"), None, Some("eu"), None),
            FileConfig::default(),
            Err("set MPROV_PASSWORD"),
        );
        // The file: an API key before a user and password.
        check(
            args(None, None, None, None),
            file("url = \"http://file\"\napikey = \"filekey\"\nuser = \"fu\"\npassword = \"fp\""),
            Ok(("http://file", Auth::ApiKey("filekey".into()))),
        );
        check(
            args(None, None, None, None),
            file("url = \"http://file\"\nuser = \"fu\"\npassword = \"fp\""),
            Ok(("http://file", basic("fu", "fp"))),
        );
        check(
            args(None, None, None, None),
            file("url = \"http://f\"\nuser = \"fu\""),
            Err("no password"),
        );
        check(
            args(None, None, None, None),
            file("url = \"http://f\""),
            Err("no credentials"),
        );
        check(
            args(None, Some("k"), None, None),
            FileConfig::default(),
            Err("no server URL"),
        );
    }

    #[test]
    fn empty_values_are_unset() {
        let a = non_empty(&args(Some(""), Some(""), Some("u"), Some("")));
        assert_eq!(
            (a.url, a.apikey, a.user, a.password),
            (None, None, Some("u".into()), None)
        );
    }
}
