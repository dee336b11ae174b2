//! Headless Chromium for the admin pages' tests, driven over WebDriver
//! (Debian's `chromium` and `chromium-driver`, through `fantoccini`): a
//! private ChromeDriver on a free loopback port, a fresh profile per
//! browser, screenshots saved under the build folder, an accessibility
//! audit with axe-core (from the npm registry, installed by `cargo xtask
//! test` under the build folder) run in the same page, and Chromium's
//! virtual authenticator for passkeys.
//!
//! A missing browser, driver or axe-core fails with what to install, never
//! a quiet skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::KillOnDrop;
use crate::xtask::target_dir;

/// The Chromium binary Debian installs.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Its WebDriver.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The axe-core release `cargo xtask test` installs (pinned).
pub const AXE_VERSION: &str = "4.11.0";

/// How long a page or an element on it is waited for: generous, as the
/// browser shares two CPUs with TCG guests in the full run.
pub const PAGE_WAIT: Duration = Duration::from_secs(60);

/// Where `cargo xtask test` installs npm packages: under the build folder.
pub fn npm_dir() -> PathBuf {
    target_dir().join("npm")
}

/// axe-core's script, as installed.
pub fn axe_js() -> PathBuf {
    npm_dir().join("node_modules/axe-core/axe.min.js")
}

/// Where the tests save screenshots: `<build folder>/screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    target_dir().join("screenshots")
}

/// A headless Chromium and its driver; both end when this is dropped.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    _driver: KillOnDrop,
    _profile: tempfile::TempDir,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Browser")
    }
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// One finding of the accessibility audit.
#[derive(Debug, Clone)]
pub struct Violation {
    /// axe's rule id.
    pub id: String,
    /// `minor`, `moderate`, `serious` or `critical`.
    pub impact: String,
    /// What the rule asks.
    pub help: String,
    /// The elements at fault (CSS selectors).
    pub targets: Vec<String>,
}

impl Browser {
    /// Starts ChromeDriver and a headless Chromium with a fresh profile.
    pub async fn start() -> Result<Browser> {
        for (bin, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
            ensure!(
                Path::new(bin).is_file(),
                "{bin} is missing: install Debian's {package} (`cargo xtask test` installs it)"
            );
        }
        let port = free_port()?;
        let log = tempfile::NamedTempFile::new()?;
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen()?)
            .spawn()
            .context("starting chromedriver")?;
        let driver = KillOnDrop(child);
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            ensure!(
                Instant::now() < deadline,
                "chromedriver did not listen on {port} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir()?;
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    // The tests run as root, where Chromium's sandbox cannot start.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1366,900",
                    "--lang=en-US",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&url)
            .await
            .with_context(|| {
                format!("starting a Chromium session through chromedriver at {url}")
            })?;
        Ok(Browser {
            client,
            _driver: driver,
            _profile: profile,
        })
    }

    /// Opens `url` and waits for the page to load.
    pub async fn open(&self, url: &str) -> Result<()> {
        self.client
            .goto(url)
            .await
            .with_context(|| format!("opening {url}"))?;
        Ok(())
    }

    /// The current page's path and query.
    pub async fn path(&self) -> Result<String> {
        let url = self.client.current_url().await?;
        Ok(match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        })
    }

    /// Types `text` into the field with CSS selector `css` (emptied first).
    pub async fn fill(&self, css: &str, text: &str) -> Result<()> {
        let el = self.find(css).await?;
        el.clear().await?;
        el.send_keys(text).await?;
        Ok(())
    }

    /// Clicks the element with CSS selector `css`.
    pub async fn click(&self, css: &str) -> Result<()> {
        self.find(css).await?.click().await?;
        Ok(())
    }

    /// Clicks `css`, which sends a form, and waits for the page it leads
    /// to. A click returns before the browser leaves the page, so a look
    /// right after it may still see (or lose mid-read) the old one.
    pub async fn submit(&self, css: &str) -> Result<()> {
        self.mark_page().await?;
        self.click(css).await?;
        self.wait_new_page(css).await
    }

    /// Like [`Browser::submit`] for a form that asks first: the dialog is
    /// accepted.
    pub async fn submit_confirmed(&self, css: &str) -> Result<()> {
        self.mark_page().await?;
        self.click(css).await?;
        self.client.accept_alert().await?;
        self.wait_new_page(css).await
    }

    /// Marks the current document, for [`Browser::wait_new_page`].
    async fn mark_page(&self) -> Result<()> {
        self.client
            .execute("window.__mprovOldPage = true;", vec![])
            .await?;
        Ok(())
    }

    /// Waits up to [`PAGE_WAIT`] for a loaded document without the mark.
    async fn wait_new_page(&self, after: &str) -> Result<()> {
        let deadline = Instant::now() + PAGE_WAIT;
        let check =
            "return window.__mprovOldPage === undefined && document.readyState === 'complete';";
        loop {
            // Mid-navigation a script may fail: that is "not yet".
            if let Ok(Value::Bool(true)) = self.client.execute(check, vec![]).await {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "no new page within {PAGE_WAIT:?} after clicking {after:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The element with CSS selector `css`, waited for up to [`PAGE_WAIT`].
    pub async fn find(&self, css: &str) -> Result<fantoccini::elements::Element> {
        match self
            .client
            .wait()
            .at_most(PAGE_WAIT)
            .for_element(Locator::Css(css))
            .await
        {
            Ok(el) => Ok(el),
            Err(e) => {
                let url = self.client.current_url().await.map(|u| u.to_string());
                let html = self.source().await.unwrap_or_default();
                Err(e).with_context(|| {
                    format!("no element {css:?} on {}:\n{html}", url.unwrap_or_default())
                })
            }
        }
    }

    /// The visible text of the element with CSS selector `css`.
    pub async fn text(&self, css: &str) -> Result<String> {
        Ok(self.find(css).await?.text().await?)
    }

    /// The page's whole HTML.
    pub async fn source(&self) -> Result<String> {
        Ok(self.client.source().await?)
    }

    /// Waits up to `within` until `check` holds for the page's HTML.
    pub async fn wait_for(
        &self,
        what: &str,
        within: Duration,
        check: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let deadline = Instant::now() + within;
        loop {
            let html = self.source().await?;
            if check(&html) {
                return Ok(html);
            }
            if Instant::now() > deadline {
                bail!("waited {within:?} for {what}; the page is:\n{html}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Signs in through the form at `base` (`http://host:port`).
    pub async fn sign_in(&self, base: &str, user: &str, password: &str) -> Result<()> {
        self.open(&format!("{base}/admin/signin")).await?;
        self.fill("#username", user).await?;
        self.fill("#password", password).await?;
        self.submit("#signin-form button[type=submit]").await?;
        let path = self.path().await?;
        ensure!(
            !path.starts_with("/admin/signin"),
            "signing in as {user} failed: still on {path}: {}",
            self.text("main").await.unwrap_or_default()
        );
        Ok(())
    }

    /// Saves a screenshot of the window as `<build folder>/screenshots/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> Result<PathBuf> {
        let png = self.client.screenshot().await?;
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png)?;
        Ok(path)
    }

    /// Runs axe-core on the current page; its serious and critical
    /// findings (the bar every page must pass).
    pub async fn audit(&self) -> Result<Vec<Violation>> {
        let js = axe_js();
        let source = std::fs::read_to_string(&js).with_context(|| {
            format!(
                "axe-core is missing at {}: `cargo xtask test` installs it (npm install --prefix {} axe-core@{AXE_VERSION})",
                js.display(),
                npm_dir().display()
            )
        })?;
        // Injected as a script of the page (through WebDriver, so the
        // page's Content-Security-Policy does not apply to it).
        self.client
            .execute(&source, vec![])
            .await
            .context("loading axe-core")?;
        let result = self
            .client
            .execute_async(
                "const done = arguments[arguments.length - 1];\
                 axe.run(document, {resultTypes: ['violations']})\
                   .then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,\
                     targets: v.nodes.map(n => n.target.join(' '))}))))\
                   .catch(e => done({error: String(e)}));",
                vec![],
            )
            .await
            .context("running axe-core")?;
        if let Some(e) = result.get("error") {
            bail!("axe-core failed: {e}");
        }
        let Some(list) = result.as_array() else {
            bail!("axe-core answered no list of violations: {result}");
        };
        Ok(list
            .iter()
            .map(|v| Violation {
                id: str_of(v, "id"),
                impact: str_of(v, "impact"),
                help: str_of(v, "help"),
                targets: v["targets"]
                    .as_array()
                    .map(|t| {
                        t.iter()
                            .filter_map(|x| x.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .filter(|v| v.impact == "serious" || v.impact == "critical")
            .collect())
    }

    /// Audits the current page and fails naming every serious or critical
    /// finding.
    pub async fn assert_accessible(&self, page: &str) -> Result<()> {
        let found = self.audit().await?;
        ensure!(
            found.is_empty(),
            "{page}: {} serious or critical accessibility violation(s):\n{}",
            found.len(),
            found
                .iter()
                .map(|v| format!("- {} ({}): {} at {:?}", v.id, v.impact, v.help, v.targets))
                .collect::<Vec<_>>()
                .join("\n")
        );
        Ok(())
    }

    /// Adds a Chromium virtual authenticator (CTAP2, internal, with
    /// resident keys and user verification) to this session; its id.
    pub async fn add_virtual_authenticator(&self) -> Result<String> {
        let answer = self
            .client
            .issue_cmd(VirtualAuthenticator)
            .await
            .context("adding a virtual authenticator")?;
        Ok(answer.as_str().unwrap_or_default().to_owned())
    }

    /// Ends the browser session.
    pub async fn close(self) -> Result<()> {
        self.client.close().await?;
        Ok(())
    }
}

fn str_of(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_default().to_owned()
}

/// WebDriver's `POST /session/{id}/webauthn/authenticator` (the Web
/// Authentication spec's extension command), which fantoccini has no
/// method for.
#[derive(Debug)]
struct VirtualAuthenticator;

impl fantoccini::wd::WebDriverCompatibleCommand for VirtualAuthenticator {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> std::result::Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/webauthn/authenticator",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        (
            http::Method::POST,
            Some(
                json!({
                    "protocol": "ctap2",
                    "transport": "internal",
                    "hasResidentKey": true,
                    "hasUserVerification": true,
                    "isUserConsenting": true,
                    "isUserVerified": true,
                })
                .to_string(),
            ),
        )
    }
}

/// Runs `work` on a thread of its own inside the network namespace `ns`
/// (its name under `/run/netns/`), with a current-thread tokio runtime:
/// a browser started there (ChromeDriver and Chromium are its children)
/// reaches the lab's servers, and every socket it opens stays there.
pub fn in_netns<T, F, Fut>(ns: &str, work: F) -> std::thread::JoinHandle<Result<T>>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>>,
{
    let path = PathBuf::from("/run/netns").join(ns);
    std::thread::spawn(move || -> Result<T> {
        let file =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(work())
    })
}
