//! `cargo xtask`: the project's own commands (test, demo, bench, agent,
//! install, layering).
//!
//! This file only parses the command line; the commands live in
//! `mprov_tests::xtask`.

#![warn(missing_docs)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mprov_tests::xtask::{
    self, BenchOptions, DatabasesOptions, DemoOptions, InstallOptions, LayeringOptions, TestOptions,
};

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
    /// Start the MariaDB and PostgreSQL servers `cargo xtask test` uses and
    /// keep them up until Ctrl-C, printing the `export` lines that let a
    /// plain `cargo test -p mprov-control` run on all three engines.
    #[command(
        after_help = "Example:\n  cargo xtask databases --env-file /tmp/mprov-db.env &\n  source /tmp/mprov-db.env && cargo test -p mprov-control"
    )]
    Databases {
        /// Also write the export lines to FILE, for `source FILE`.
        #[arg(long, value_name = "FILE")]
        env_file: Option<PathBuf>,
    },
    /// The whole product on this machine (as root): install, build, a real
    /// Debian image, the control service and a job server on a lab bridge in
    /// a network namespace, a registered node netbooted in QEMU to "ready"
    /// with its timeline printed as it happens; then the stack stays up until
    /// Ctrl-C, and the demo says how to reach the API, mash and the admin
    /// password file.
    Demo {
        /// The short form CI runs: stop once the node is ready (exit 0), or
        /// fail saying where the chain stopped.
        #[arg(long)]
        check: bool,
    },
    /// Put mProv's binaries on PATH: `cargo install --path` of each binary
    /// crate (mprov-control, mash, mprov-jobserver, mprov-image,
    /// mprov-initramfs), release builds, into ~/.cargo/bin unless --root says
    /// otherwise. The node agent is not installed: `cargo xtask agent` builds
    /// its static binary for images and the initramfs.
    #[command(
        after_help = "Examples:\n  cargo xtask install                      # all, into ~/.cargo/bin\n  cargo xtask install --root /usr/local    # into /usr/local/bin (as root)\n  cargo xtask install mash                 # only mash"
    )]
    Install {
        /// Install into ROOT/bin (cargo's --root); default $CARGO_INSTALL_ROOT,
        /// else ~/.cargo. Also accepted as --prefix.
        #[arg(long, alias = "prefix", value_name = "ROOT")]
        root: Option<PathBuf>,
        /// Build with the dev profile: faster to build, slower to run.
        #[arg(long)]
        debug: bool,
        /// Only these binaries (default: all of them).
        #[arg(value_name = "BINARY")]
        bins: Vec<String>,
    },
    /// Print what breaks the control service's layers: module cycles in
    /// control/src, HTTP crates (axum, http, ...) named below the http
    /// layer, upward references and modules in no layer; and module cycles
    /// in agent/src. `cargo xtask test` runs it with --deny.
    Layering {
        /// Exit non-zero when there is any violation.
        #[arg(long)]
        deny: bool,
    },
    /// The boot storm: N simulated nodes (the agent's own code, many per
    /// process) power on at once against the job server and the control
    /// service in the lab, over a link shaped with tc; prints nodes ready
    /// and lost, time-to-ready percentiles, the run against the bandwidth
    /// bound, server CPU per node and boot-event figures, and saves a
    /// picture of nodes per phase (SVG). Fails if any node or event is lost.
    Storm {
        /// Nodes powered on at once.
        #[arg(long, default_value_t = 1000)]
        nodes: usize,
        /// The link's rate, as tc writes it (1gbit, 500mbit).
        #[arg(long, default_value = "1gbit")]
        rate: String,
        /// The image: small (busybox, a few MB) or debian (the lab's).
        #[arg(long, default_value = "small", value_parser = ["small", "debian"])]
        image: String,
        /// Where storm.txt and storm.svg go (default: `<target>/storm`).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Debug builds of the servers (faster to build, slower to run).
        #[arg(long)]
        debug: bool,
        /// A fault mid-storm: kill-jobserver (SIGKILL, then started again)
        /// or restart-control.
        #[arg(long, value_parser = ["kill-jobserver", "restart-control"])]
        fault: Option<String>,
        /// Seconds before a node that is not ready counts as lost.
        #[arg(long, default_value_t = 3600)]
        limit: u64,
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
        Cmd::Databases { env_file } => xtask::databases(&DatabasesOptions { env_file }),
        Cmd::Demo { check } => xtask::demo(&DemoOptions { check }),
        Cmd::Install { root, debug, bins } => xtask::install(&InstallOptions { root, debug, bins }),
        Cmd::Layering { deny } => xtask::layering(&LayeringOptions { deny }),
        Cmd::Storm {
            nodes,
            rate,
            image,
            out,
            debug,
            fault,
            limit,
        } => storm(nodes, &rate, &image, out, debug, fault.as_deref(), limit),
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

/// `cargo xtask storm`: the options into a run; fails unless it was clean.
fn storm(
    nodes: usize,
    rate: &str,
    image: &str,
    out: Option<PathBuf>,
    debug: bool,
    fault: Option<&str>,
    limit: u64,
) -> anyhow::Result<()> {
    use mprov_tests::storm::{self, Fault, ImageChoice, StormOptions};
    let options = StormOptions {
        nodes,
        rate_mbit: storm::parse_rate(rate)?,
        image: if image == "debian" {
            ImageChoice::Debian
        } else {
            ImageChoice::Small
        },
        out: out.unwrap_or_else(|| xtask::target_dir().join("storm")),
        release: !debug,
        fault: fault.map(|f| {
            if f == "kill-jobserver" {
                Fault::KillJobServer
            } else {
                Fault::RestartControl
            }
        }),
        limit: std::time::Duration::from_secs(limit),
    };
    let report = storm::run(&options)?;
    anyhow::ensure!(report.clean(), "the storm lost something (see above)");
    Ok(())
}
