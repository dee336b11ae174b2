//! A real `mprov-control serve` process for the Rust benchmarks: started on
//! port 0 (HTTP and HTTPS) with its addresses read back from listen files,
//! stopped with SIGTERM, with its CPU time (and its signing helper's); and
//! what the benchmarks share: CPU times from `/proc`, their result tables.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::process::Process;
use crate::xtask::{target_dir, workspace_root};

/// Builds `packages` with the `release` profile, or `dev` for a smoke run;
/// the folder holding the binaries.
pub fn build(packages: &[&str], smoke: bool) -> Result<PathBuf> {
    let root = workspace_root();
    let profile = if smoke { "dev" } else { "release" };
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(&root)
        .args(["build", "--quiet", "--profile", profile]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    let status = cmd
        .status()
        .with_context(|| format!("building {packages:?}"))?;
    ensure!(status.success(), "building {packages:?} failed");
    Ok(target_dir().join(if smoke { "debug" } else { "release" }))
}

/// The admin's password in the control service [`Control::start`] starts.
pub const SUPERUSER_PASSWORD: &str = "bench-password";

/// A running control service.
#[derive(Debug)]
pub struct Control {
    process: Process,
    /// Its process id.
    pub pid: u32,
    /// `http://127.0.0.1:<port>`.
    pub http: String,
    /// `https://127.0.0.1:<port>`.
    pub https: String,
    /// Its folder (etc/, var/, serve.log).
    pub home: PathBuf,
}

impl Control {
    /// Starts `bin/mprov-control serve` in `home` on `database_url` (SQLite
    /// in `home` when `None`).
    pub fn start(bin: &Path, home: &Path, database_url: Option<&str>) -> Result<Control> {
        Control::start_with(bin, home, database_url, &[])
    }

    /// [`Control::start`] with further environment variables `env`.
    pub fn start_with(
        bin: &Path,
        home: &Path,
        database_url: Option<&str>,
        env: &[(&str, &str)],
    ) -> Result<Control> {
        std::fs::create_dir_all(home)?;
        let (http_file, https_file) = (home.join("listen"), home.join("listen-https"));
        let mut cmd = Command::new(bin.join("mprov-control"));
        cmd.arg("serve")
            .env("MPROV_CONFIG_DIR", home.join("etc"))
            .env("MPROV_STATE_DIR", home.join("var"))
            .env("MPROV_LISTEN", "127.0.0.1:0")
            .env("MPROV_LISTEN_FILE", &http_file)
            .env("MPROV_HTTPS_LISTEN", "127.0.0.1:0")
            .env("MPROV_HTTPS_LISTEN_FILE", &https_file)
            .env("MPROV_SUPERUSER_PASSWORD", SUPERUSER_PASSWORD)
            .env("MPROV_LOG", "warn")
            // A power-on surge of thousands of nodes from one address: the
            // benchmarks measure enrollment, not the /ipxe/ limiter.
            .env("MPROV_IPXE_LIMIT_TOTAL", "1000000")
            .env_remove("MPROV_SKIP_VERSION_CHECK")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(home.join("serve.log"))?);
        if let Some(url) = database_url {
            cmd.env("MPROV_DATABASE_URL", url);
        }
        cmd.envs(env.iter().copied());
        let child = cmd.spawn().context("starting mprov-control")?;
        let pid = child.id();
        let mut process = Process::new("mprov-control", child, Duration::from_secs(20));
        let deadline = Instant::now() + Duration::from_secs(60);
        let read = |f: &Path| {
            std::fs::read_to_string(f)
                .ok()
                .map(|a| a.trim().to_owned())
                .filter(|a| !a.is_empty())
        };
        let (http, https) = loop {
            if let (Some(h), Some(s)) = (read(&http_file), read(&https_file)) {
                break (h, s);
            }
            if let Some(status) = process.try_wait()? {
                bail!(
                    "mprov-control exited with {status}; see {}",
                    home.join("serve.log").display()
                );
            }
            ensure!(
                Instant::now() < deadline,
                "mprov-control did not listen within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        Ok(Control {
            process,
            pid,
            http: format!("http://{http}"),
            https: format!("https://{https}"),
            home: home.to_owned(),
        })
    }

    /// The API key of the local job server, from the config folder.
    pub fn api_key(&self) -> Result<String> {
        let text = std::fs::read_to_string(self.home.join("etc/apikey"))?;
        Ok(text
            .trim()
            .trim_start_matches("export MPROV_APIKEY=")
            .to_owned())
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> Result<String> {
        Ok(std::fs::read_to_string(self.home.join("var/tls/ca.crt"))?)
    }

    /// CPU time of the service and of its children (the signing helper).
    pub fn cpu(&self) -> Result<Duration> {
        let mut total = cpu_time(self.pid)?;
        for task in std::fs::read_dir(format!("/proc/{}/task", self.pid))? {
            let children =
                std::fs::read_to_string(task?.path().join("children")).unwrap_or_default();
            for child in children
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
            {
                total += cpu_time(child).unwrap_or_default();
            }
        }
        Ok(total)
    }

    /// Stops it with SIGTERM and waits.
    pub fn stop(self) -> Result<()> {
        self.process.stop()?;
        Ok(())
    }
}

/// User plus system CPU time of a process, from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> Result<Duration> {
    Ok(stat_cpu(&pid.to_string())?.0)
}

/// From `/proc/<pid>/stat` (`pid` may be `self`): the user plus system CPU
/// time of the process, and that of its children it has waited for.
pub fn stat_cpu(pid: &str) -> Result<(Duration, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<u64> {
        Ok(fields
            .get(i)
            .with_context(|| format!("stat field {i}"))?
            .parse::<u64>()?)
    };
    // utime, stime, cutime, cstime. Linux reports in clock ticks of 1/100 s
    // on every architecture we run on.
    let ticks = |t: u64| Duration::from_millis(t * 10);
    Ok((
        ticks(field(11)? + field(12)?),
        ticks(field(13)? + field(14)?),
    ))
}

/// A benchmark's figures as a Markdown table under a title line, as
/// `tests/bench/RESULTS.md` keeps them.
pub fn markdown_table(title: &str, head: &[&str], rows: &[Vec<String>]) -> String {
    let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
    let mut out = format!("{title}\n");
    out.push_str(&line(
        &head.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>(),
    ));
    out.push_str(&line(&vec!["---".to_owned(); head.len()]));
    for row in rows {
        out.push_str(&line(row));
    }
    out
}
