//! Where a started `mprov-jobserver` listens, from its `--listen-file`: the
//! job server writes it (atomically) once every server's socket is bound, so
//! a test waits for the file rather than for a line in the log or a probe
//! that answers, and learns the ports the system chose for port 0 binds.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long a job server may take to bind everything: a follower enrolls
/// and reaches the control service first.
pub const LISTEN_WAIT: Duration = Duration::from_secs(60);

/// The addresses a job server bound, by server (`dhcp`, `pxe`, `tftp`,
/// `dns`, `http`, `metrics`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listening(BTreeMap<String, SocketAddr>);

impl Listening {
    /// The listen file's text, parsed.
    pub fn parse(text: &str) -> Result<Listening> {
        serde_json::from_str(text)
            .map(Listening)
            .with_context(|| format!("the listen file is not a JSON object of addresses: {text}"))
    }

    /// Where `server` listens; an error naming what was bound if it does not.
    pub fn get(&self, server: &str) -> Result<SocketAddr> {
        self.0
            .get(server)
            .copied()
            .with_context(|| format!("the job server bound no {server}: {:?}", self.0))
    }

    /// The servers that listen, by name.
    pub fn servers(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

/// Waits (up to `limit`) until `file` exists, checking that `child` (the
/// job server that writes it) still runs; what it holds. Remove a stale
/// `file` before starting the job server.
pub fn wait(file: &Path, child: &mut Child, limit: Duration) -> Result<Listening> {
    wait_until(file, limit, || Ok(child.try_wait()?))
}

/// [`wait`] with `exited` telling whether the writer has exited.
pub(crate) fn wait_until(
    file: &Path,
    limit: Duration,
    mut exited: impl FnMut() -> Result<Option<ExitStatus>>,
) -> Result<Listening> {
    let deadline = Instant::now() + limit;
    loop {
        match std::fs::read_to_string(file) {
            Ok(text) => return Listening::parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
        }
        if let Some(status) = exited()? {
            bail!(
                "mprov-jobserver exited with {status} before it wrote its listen file {}",
                file.display()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "mprov-jobserver wrote no listen file {} within {limit:?}",
                file.display()
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::Duration;

    use super::{Listening, wait};

    #[test]
    fn parses_what_the_job_server_writes() {
        let l = Listening::parse(r#"{"dns":"[::1]:53","http":"127.0.0.1:41871"}"#).unwrap();
        assert_eq!(l.get("http").unwrap(), "127.0.0.1:41871".parse().unwrap());
        assert_eq!(l.get("dns").unwrap(), "[::1]:53".parse().unwrap());
        assert!(l.get("tftp").unwrap_err().to_string().contains("no tftp"));
        assert!(Listening::parse("127.0.0.1:80").is_err());
    }

    #[test]
    fn a_writer_that_exits_first_fails_the_wait_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
        let started = std::time::Instant::now();
        let err = wait(
            &dir.path().join("listen"),
            &mut child,
            Duration::from_secs(30),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("exited with exit status: 3"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn the_wait_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let err = wait(
            &dir.path().join("listen"),
            &mut child,
            Duration::from_millis(200),
        )
        .unwrap_err()
        .to_string();
        let _ = child.kill();
        let _ = child.wait();
        assert!(err.contains("wrote no listen file"), "{err}");
    }
}
