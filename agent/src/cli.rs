//! The agent when it is not PID 1: a small CLI.
//!
//! Later issues add the node's other roles (`script-runner`, `nads`). `/init`
//! itself has no subcommand on purpose: it mounts, loads modules and powers
//! the machine off, so it runs only as PID 1 (see `main.rs`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cmdline::BootParams;

/// mProv's node agent. As PID 1 (the initramfs's /init) it prepares the node
/// and reports on the console; otherwise it is this CLI.
#[derive(Debug, Parser)]
#[command(name = "mprov-agent", version = crate::VERSION)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Prints the mprov_* parameters of a kernel command line (the nonce
    /// redacted).
    Cmdline {
        /// The command line; /proc/cmdline if not given.
        line: Option<String>,
    },
    /// Reports this node "ready" to the control service with its own
    /// certificate (run by the image's mprov-agent unit after boot). Reads
    /// the identity /init left in /etc/mprov (node.key, node.crt, ca.crt,
    /// control-url).
    Ready {
        /// The root holding etc/mprov/ (default /).
        #[arg(long, default_value = "/")]
        root: std::path::PathBuf,
        /// Free text for the timeline.
        #[arg(long, default_value = "booted to multi-user")]
        detail: String,
    },
    /// Prints the agent's version.
    Version,
    /// Streams a rootfs.tar.zst into a folder as /init does: hashed,
    /// decompressed and unpacked in one pass, resumed with Range after a
    /// drop, waiting on 503, falling back to the next URL on a checksum
    /// mismatch or a dead server. Exits non-zero unless the image verified.
    Fetch {
        /// The image's size in bytes (as the control service recorded it).
        #[arg(long)]
        size: u64,
        /// Its sha256, hex (as the control service recorded it).
        #[arg(long)]
        sha256: String,
        /// The folder to unpack into; created if missing, emptied first.
        #[arg(long)]
        into: std::path::PathBuf,
        /// Print each step (resumes, waits, fallbacks, progress) on stderr.
        #[arg(long)]
        verbose: bool,
        /// The image's URLs, best first.
        #[arg(required = true)]
        urls: Vec<String>,
    },
}

/// Parses the arguments and runs the command.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Cmdline { line } => {
            let line = match line {
                Some(line) => line.into_bytes(),
                None => match std::fs::read("/proc/cmdline") {
                    Ok(line) => line,
                    Err(err) => {
                        eprintln!("mprov-agent: reading /proc/cmdline: {err}");
                        return ExitCode::FAILURE;
                    }
                },
            };
            let params = BootParams::parse(&line);
            for line in params.report() {
                println!("{line}");
            }
            if params.errors().is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Fetch {
            size,
            sha256,
            into,
            verbose,
            urls,
        } => fetch(size, &sha256, &into, verbose, &urls),
        Command::Ready { root, detail } => ready(&root, &detail),
        Command::Version => {
            println!("mprov-agent {}", crate::VERSION);
            ExitCode::SUCCESS
        }
    }
}

fn ready(root: &std::path::Path, detail: &str) -> ExitCode {
    let result = crate::enroll::read_identity(root).and_then(|(identity, url)| {
        crate::enroll::Control::new(&url, &identity)?
            .report(mprov_api::boot::BootPhase::Ready, detail)
    });
    match result {
        Ok(()) => {
            println!("mprov-agent: reported ready");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!(
                "mprov-agent: reporting ready: {}",
                mprov_process::chain(&err)
            );
            ExitCode::FAILURE
        }
    }
}

fn fetch(
    size: u64,
    sha256: &str,
    into: &std::path::Path,
    verbose: bool,
    urls: &[String],
) -> ExitCode {
    let mut digest = [0u8; 32];
    if hex::decode_to_slice(sha256.trim(), &mut digest).is_err() {
        eprintln!("mprov-agent: --sha256 must be 64 hex digits, got {sha256:?}");
        return ExitCode::FAILURE;
    }
    if let Err(err) = std::fs::create_dir_all(into) {
        eprintln!("mprov-agent: creating {}: {err}", into.display());
        return ExitCode::FAILURE;
    }
    let client = match crate::image::client() {
        Ok(client) => client,
        Err(err) => {
            eprintln!("mprov-agent: {}", mprov_process::chain(&err));
            return ExitCode::FAILURE;
        }
    };
    let expected = crate::image::Expected {
        size,
        sha256: digest,
    };
    let options = mprov_unpack::UnpackOptions {
        whiteouts: false,
        preserve_owner: nix::unistd::geteuid().is_root(),
    };
    let observe = |event: &crate::image::Event<'_>| {
        if verbose && !matches!(event, crate::image::Event::Progress { .. }) {
            eprintln!("mprov-agent: {}", crate::image::describe(event));
        }
    };
    match crate::image::fetch(&client, urls, &expected, into, options, &observe) {
        Ok(root) => {
            let done = root.unpacked();
            println!(
                "verified {} ({size} bytes, {} entries) into {}",
                root.source(),
                done.entries,
                root.path().display()
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("mprov-agent: {}", mprov_process::chain(&err));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
        let cli =
            Cli::try_parse_from(["mprov-agent", "cmdline", "mprov_url=http://a"]).expect("parses");
        assert!(matches!(cli.command, Command::Cmdline { line: Some(_) }));
        assert!(Cli::try_parse_from(["mprov-agent"]).is_err());
    }
}
