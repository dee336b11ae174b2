//! `cargo xtask`: the project's own commands (test, demo, bench, agent).
//!
//! This file only parses the command line; the commands live in
//! `mprov_tests::xtask`.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mprov_tests::xtask::{self, BenchOptions, DemoOptions, TestOptions};

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "mProv's own commands"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Build the node agent as a small static binary (musl, else glibc
    /// static) and print its path: what `mprov-image build --agent` installs
    /// and what initramfs images run as /init.
    Agent,
    /// Benchmarks under tests/bench/: all of them, or the one named.
    Bench {
        /// The benchmark to run.
        name: Option<String>,
        /// A short run that only proves each benchmark works.
        #[arg(long)]
        smoke: bool,
    },
    /// Build and run the control service on its embedded defaults, with its
    /// config and state under target/demo/, until Ctrl-C.
    Demo {
        /// Where the API listens.
        #[arg(long, env = "MPROV_LISTEN", default_value = xtask::DEFAULT_LISTEN)]
        listen: SocketAddr,
        /// Stop right after the API answered, and exit 0.
        #[arg(long)]
        check: bool,
    },
    /// Install what the tests need, then run fmt, clippy and every test with
    /// real MariaDB and PostgreSQL servers.
    Test {
        /// Extra arguments for `cargo test --workspace`, after `--`.
        #[arg(last = true)]
        cargo_test_args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Cmd::Agent => mprov_tests::agent::build_static().map(|agent| {
            eprintln!(
                "mprov-agent for {}: {} bytes, {}",
                agent.target, agent.size, agent.file_type
            );
            println!("{}", agent.path.display());
        }),
        Cmd::Bench { name, smoke } => xtask::bench(&BenchOptions { name, smoke }),
        Cmd::Demo { listen, check } => xtask::demo(&DemoOptions { listen, check }),
        Cmd::Test { cargo_test_args } => xtask::test(&TestOptions { cargo_test_args }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}
