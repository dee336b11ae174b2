//! The agent when it is not PID 1: a small CLI.
//!
//! Later issues add the roles of DESIGN.md (`script-runner`, `nads`). `/init`
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
    /// Prints the agent's version.
    Version,
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
        Command::Version => {
            println!("mprov-agent {}", crate::VERSION);
            ExitCode::SUCCESS
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
