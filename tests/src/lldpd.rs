//! lldpd speaking for a switch inside a lab namespace: the real LLDP agent
//! the NADS tests (`tests/tests/agent_nads.rs`) and the discovery boot of a
//! lab VM (`tests/tests/lab/discovery.rs`) hear. Needs lldpd (`cargo xtask
//! test` installs it and keeps its system service down).

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::netns::Netns;

/// lldpd speaking for a switch inside a namespace; stopped with SIGTERM
/// (then SIGKILL) on drop, so its privilege-separated child goes too.
#[derive(Debug)]
pub struct Lldpd {
    child: Child,
    log: PathBuf,
}

impl Lldpd {
    /// Starts lldpd on `interfaces` of `ns`, with `args` and the lldpcli
    /// `config` lines (after one that sends a frame every second).
    pub fn start(
        ns: &Netns,
        dir: &Path,
        interfaces: &[&str],
        args: &[&str],
        config: &[&str],
    ) -> Result<Lldpd> {
        let lldpd = Path::new("/usr/sbin/lldpd");
        ensure!(
            lldpd.is_file(),
            "{} is missing: apt-get install lldpd (`cargo xtask test` installs it)",
            lldpd.display()
        );
        let conf = dir.join("lldpd.conf");
        let mut lines = vec!["configure lldp tx-interval 1"];
        lines.extend_from_slice(config);
        std::fs::write(&conf, lines.join("\n") + "\n")?;
        let log = dir.join("lldpd.log");
        let child = ns
            .command(lldpd.to_str().context("path")?)
            .arg("-d")
            .arg("-u")
            .arg(dir.join("lldpd.sock"))
            .arg("-O")
            .arg(&conf)
            .arg("-I")
            .arg(interfaces.join(","))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting lldpd")?;
        Ok(Lldpd { child, log })
    }

    /// What lldpd logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Lldpd {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
