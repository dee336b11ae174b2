//! Child processes that we started and must stop: SIGTERM, a bounded wait, then
//! SIGKILL, always by the PID we spawned and never by name.

use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A child process (a server, a client) killed (SIGKILL, by its PID) and
/// reaped on drop: for tests that start a process and need it gone at once
/// whatever happens, without the graceful stop (SIGTERM first) of the
/// servers this crate starts.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How often a stop checks whether the process has exited.
const STOP_POLL: Duration = Duration::from_millis(20);

/// A child process that is stopped when dropped.
#[derive(Debug)]
pub(crate) struct Process {
    name: String,
    /// `None` once stopped.
    child: Option<Child>,
    /// How long the process may take to exit after SIGTERM.
    stop_timeout: Duration,
}

impl Process {
    pub(crate) fn new(name: impl Into<String>, child: Child, stop_timeout: Duration) -> Self {
        Self {
            name: name.into(),
            child: Some(child),
            stop_timeout,
        }
    }

    /// Its process id, while it runs.
    pub(crate) fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The exit status if the process has exited, without waiting.
    pub(crate) fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        let name = &self.name;
        match self.child.as_mut() {
            Some(child) => child.try_wait().with_context(|| format!("checking {name}")),
            None => bail!("{name} was already stopped"),
        }
    }

    /// Kills the process at once (SIGKILL), as a crash would, and reaps it.
    pub(crate) fn kill(mut self) -> Result<ExitStatus> {
        let name = self.name.clone();
        match self.child.take() {
            Some(mut child) => {
                child.kill().with_context(|| format!("killing {name}"))?;
                child.wait().with_context(|| format!("waiting for {name}"))
            }
            None => bail!("{name} was already stopped"),
        }
    }

    /// Stops the process and returns how it exited. Fails if it had to be killed.
    pub(crate) fn stop(mut self) -> Result<ExitStatus> {
        let name = self.name.clone();
        match self.child.take() {
            Some(mut child) => stop_child(&mut child, self.stop_timeout)
                .with_context(|| format!("stopping {name}")),
            None => bail!("{name} was already stopped"),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take()
            && let Err(err) = stop_child(&mut child, self.stop_timeout)
        {
            eprintln!("mprov-tests: stopping {}: {err:#}", self.name);
        }
    }
}

/// Sends SIGTERM to `child`, waits up to `timeout` for it to exit, then sends
/// SIGKILL and fails.
fn stop_child(child: &mut Child, timeout: Duration) -> Result<ExitStatus> {
    if let Some(status) = child.try_wait()? {
        return Ok(status);
    }
    let pid = Pid::from_raw(i32::try_from(child.id()).context("PID out of range")?);
    kill(pid, Signal::SIGTERM).with_context(|| format!("sending SIGTERM to PID {pid}"))?;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        thread::sleep(STOP_POLL);
    }
    child
        .kill()
        .with_context(|| format!("sending SIGKILL to PID {pid}"))?;
    let status = child.wait()?;
    bail!("PID {pid} did not exit within {timeout:?} of SIGTERM and was killed ({status})")
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    use super::*;

    #[test]
    fn stop_sends_sigterm() -> Result<()> {
        let child = Command::new("sleep").arg("600").spawn()?;
        let process = Process::new("sleep", child, Duration::from_secs(10));
        let status = process.stop()?;
        assert_eq!(status.signal(), Some(Signal::SIGTERM as i32));
        Ok(())
    }

    #[test]
    fn stop_kills_what_ignores_sigterm() -> Result<()> {
        // The shell ignores SIGTERM and says so once it has set that up, so the
        // stop cannot race the trap.
        let mut child = Command::new("sh")
            .args(["-c", "trap '' TERM; echo ready; exec sleep 600"])
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().context("stdout")?),
            &mut line,
        )?;
        assert_eq!(line, "ready\n");
        let process = Process::new("stubborn", child, Duration::from_millis(200));
        let err = process.stop().expect_err("it had to be killed");
        assert!(format!("{err:#}").contains("was killed"), "{err:#}");
        Ok(())
    }

    #[test]
    fn stop_reports_an_exited_process() -> Result<()> {
        let child = Command::new("true").spawn()?;
        let mut process = Process::new("true", child, Duration::from_secs(10));
        // Bounded: `true` exits at once.
        for _ in 0..500 {
            if process.try_wait()?.is_some() {
                break;
            }
            thread::sleep(STOP_POLL);
        }
        assert!(process.stop()?.success());
        Ok(())
    }
}
