//! The agent when it is not PID 1: a small CLI.
//!
//! `script-runner` runs a plan of scripts once (a node's post-boot scripts,
//! or an image's image-gen scripts on a job server); `node` is the booted
//! node's long-running agent (`crate::node`); `nads` listens for LLDP and
//! reports the switch ports this node is cabled to (`crate::nads`). `/init`
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
    /// Listens for LLDP on every link that is up and tells which switch
    /// port each is cabled to (NADS), with the machine's vendor, model and
    /// serial from DMI; with --report, sends that to the control service.
    Nads(Nads),
    /// Runs scripts once, as the control service's plan lists them, and
    /// reports their results: a node's post-boot scripts (`-s -b`), or an
    /// image's image-gen scripts inside its root (`-i IMAGE --root DIR`).
    /// Exits non-zero, naming the scripts, when the plan is refused or a
    /// script fails.
    ScriptRunner(ScriptRunner),
    /// The booted node's agent (the image's mprov-agent unit): runs the
    /// post-boot scripts (reporting "ready" only when all succeeded), then
    /// runs them again when asked (`mash systems run-scripts`) and renews
    /// the node's certificate, until SIGTERM.
    Node {
        /// The root holding etc/mprov/ and etc/nologin (default /).
        #[arg(long, default_value = "/")]
        root: std::path::PathBuf,
        /// Seconds between two looks at the plan (jittered by a tenth).
        #[arg(long, default_value_t = crate::node::DEFAULT_POLL.as_secs())]
        poll: u64,
        /// Where each run's script files go (a private folder per run).
        #[arg(long, default_value = WORK_DIR)]
        work: std::path::PathBuf,
    },
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

/// `nads`: how long to listen, how to print, where to report.
#[derive(Debug, clap::Args)]
struct Nads {
    /// Seconds to listen at most; ends early once every link was heard.
    #[arg(long, default_value_t = mprov_api::nads::DEFAULT_WINDOW_SECONDS)]
    window: u64,
    /// Print the report as JSON (else a table).
    #[arg(long)]
    json: bool,
    /// The control service's URL: POST the report there.
    #[arg(long, value_name = "URL")]
    report: Option<String>,
    /// The one-time discovery nonce (else mprov_discover= on the kernel
    /// command line; without either, the node's own certificate in
    /// <root>/etc/mprov).
    #[arg(long, requires = "report")]
    nonce: Option<String>,
    /// The control service's CA certificate (PEM) to trust with the nonce
    /// (else the one mprov_ca= on the kernel command line pins).
    #[arg(long, requires = "report")]
    ca: Option<std::path::PathBuf>,
    /// The MAC the node booted from (else mprov_mac= on the kernel command
    /// line, else the first link's).
    #[arg(long)]
    boot_mac: Option<String>,
    /// The root holding sys/class/dmi/id and etc/mprov (default /).
    #[arg(long, default_value = "/")]
    root: std::path::PathBuf,
    /// The kernel command line to read mprov_* parameters from.
    #[arg(long, default_value = "/proc/cmdline")]
    cmdline: std::path::PathBuf,
}

/// Where a run's script and params files go on a node.
const WORK_DIR: &str = "/run/mprov";

/// `script-runner`: the seed's flags, the same exclusivity.
#[derive(Debug, clap::Args)]
struct ScriptRunner {
    /// The image whose scripts run, inside its root (`--root`). Mutually
    /// exclusive with -s.
    #[arg(
        short = 'i',
        long = "image",
        conflicts_with = "system",
        required_unless_present = "system",
        requires = "root"
    )]
    image: Option<String>,
    /// Runs the scripts against this system. Mutually exclusive with -i.
    #[arg(short = 's', long = "system")]
    system: bool,
    /// Post-boot mode (else image-gen).
    #[arg(short = 'b', long = "post-boot")]
    post_boot: bool,
    /// Run once (the seed's global option; the runner always runs once).
    #[arg(short = 'r', long = "run-once")]
    run_once: bool,
    /// Do not register as a job server (the seed's global option; the
    /// runner never registers).
    #[arg(short = 'd', long = "no-register")]
    no_register: bool,
    /// With -i: the image's root the scripts run chrooted in. With -s: the
    /// root holding etc/mprov/ and etc/nologin (default /).
    #[arg(long)]
    root: Option<std::path::PathBuf>,
    /// Where the run's script files go (with -s).
    #[arg(long, default_value = WORK_DIR)]
    work: std::path::PathBuf,
    /// The control service's URL, with --cert, --key and --ca: a job
    /// server's own identity instead of the node's in etc/mprov/.
    #[arg(long, requires_all = ["cert", "key", "ca"])]
    url: Option<String>,
    /// The client certificate, PEM.
    #[arg(long, requires = "url")]
    cert: Option<std::path::PathBuf>,
    /// Its private key, PEM.
    #[arg(long, requires = "url")]
    key: Option<std::path::PathBuf>,
    /// The control service's CA certificate, PEM.
    #[arg(long, requires = "url")]
    ca: Option<std::path::PathBuf>,
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
        Command::Nads(args) => match nads(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("mprov-agent: nads: {}", mprov_process::chain(&err));
                ExitCode::FAILURE
            }
        },
        Command::ScriptRunner(args) => script_runner(&args),
        Command::Node { root, poll, work } => {
            let stop = match crate::node::Stop::install() {
                Ok(stop) => stop,
                Err(err) => {
                    eprintln!("mprov-agent: installing the signal handlers: {err}");
                    return ExitCode::FAILURE;
                }
            };
            crate::node::run(
                &crate::node::Settings {
                    root,
                    work,
                    poll: std::time::Duration::from_secs(poll.max(1)),
                },
                &stop,
            );
            ExitCode::SUCCESS
        }
        Command::Version => {
            println!("mprov-agent {}", crate::VERSION);
            ExitCode::SUCCESS
        }
    }
}

fn nads(args: &Nads) -> Result<(), crate::nads::NadsError> {
    use crate::nads::{self, Credentials, NadsError};
    // The command line is optional: a booted node run by hand may be given
    // everything as flags, and a container has no /proc/cmdline of its own.
    let line = std::fs::read(&args.cmdline).unwrap_or_default();
    let params = BootParams::parse(&line);
    let given_mac = match &args.boot_mac {
        Some(mac) => Some(crate::cmdline::Mac::parse(mac.as_bytes()).map_err(NadsError::BootMac)?),
        None => params.mac(),
    };
    let links = nads::links_to_listen(&nads::interfaces());
    let boot_mac = nads::boot_mac(given_mac, &links);
    let names: Vec<&str> = links.iter().map(|l| l.interface.as_str()).collect();
    eprintln!(
        "mprov-agent: listening for LLDP on {} for at most {} s",
        if names.is_empty() {
            "no link".to_owned()
        } else {
            names.join(", ")
        },
        args.window
    );
    let heard = nads::listen(
        links,
        std::time::Duration::from_secs(args.window),
        &|line| eprintln!("mprov-agent: {line}"),
    )?;
    let report = heard.report(&boot_mac, nads::read_hardware(&args.root));
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(json) => println!("{json}"),
            Err(err) => eprintln!("mprov-agent: the report as JSON: {err}"),
        }
    } else {
        print!("{}", nads::table(&report));
    }
    let Some(url) = &args.report else {
        return Ok(());
    };
    let nonce = match &args.nonce {
        Some(nonce) => Some(crate::cmdline::Nonce::parse(nonce.as_bytes())),
        None => nads::discovery_nonce(&line),
    };
    let credentials = match nonce {
        Some(nonce) => {
            let nonce = nonce.map_err(NadsError::Nonce)?;
            let ca_pem = match (&args.ca, params.ca()) {
                (Some(path), _) => String::from_utf8_lossy(&nads::read_file(path)?).into_owned(),
                (None, Some(pin)) => {
                    crate::enroll::fetch_ca(url, pin.as_bytes()).map_err(NadsError::Report)?
                }
                (None, None) => return Err(NadsError::NoCa),
            };
            Credentials::Discovery { nonce, ca_pem }
        }
        None => Credentials::Node(
            crate::enroll::read_identity(&args.root)
                .map_err(NadsError::NoCredentials)?
                .0,
        ),
    };
    let outcome = nads::send(url, &report, &credentials)?;
    match outcome {
        mprov_api::nads::ReportOutcome::Matched { hostname } => {
            eprintln!("mprov-agent: matched: this node is {hostname}");
        }
        mprov_api::nads::ReportOutcome::Parked { reason } => {
            eprintln!("mprov-agent: parked as discovered: {reason}");
        }
    }
    Ok(())
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

fn script_runner(args: &ScriptRunner) -> ExitCode {
    use mprov_api::scripts::{RunOutcome, ScriptMode};
    let fail = |what: &str, err: &dyn std::error::Error| {
        eprintln!("mprov-agent: {what}: {}", mprov_process::chain(err));
        ExitCode::FAILURE
    };
    let root = args
        .root
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("/"));
    let session = match (&args.url, &args.cert, &args.key, &args.ca) {
        (Some(url), Some(cert), Some(key), Some(ca)) => {
            let read = |path: &std::path::Path| {
                std::fs::read_to_string(path).map_err(|err| crate::enroll::EnrollError::Io {
                    what: "reading",
                    path: path.display().to_string(),
                    err,
                })
            };
            (|| {
                let identity = crate::enroll::Identity {
                    key_pem: read(key)?,
                    cert_pem: read(cert)?,
                    ca_pem: read(ca)?,
                };
                crate::enroll::Control::new(url, &identity)
            })()
        }
        _ => {
            // -i runs inside an image's root, which holds no identity: the
            // node's own is under / then.
            let home = if args.system {
                root.as_path()
            } else {
                std::path::Path::new("/")
            };
            crate::enroll::read_identity(home)
                .and_then(|(identity, url)| crate::enroll::Control::new(&url, &identity))
        }
    };
    let control = match session {
        Ok(control) => control,
        Err(err) => return fail("reading the identity", &err),
    };
    let mode = if args.post_boot {
        ScriptMode::PostBoot
    } else {
        ScriptMode::ImageGen
    };
    let target = if args.system {
        crate::scripts::exec::Target::Local {
            root: root.clone(),
            work: args.work.clone(),
        }
    } else {
        crate::scripts::exec::Target::Image(root.clone())
    };
    let plan = match crate::scripts::fetch_plan(&control, mode, args.image.as_deref()) {
        Ok(plan) => plan,
        Err(err) => return fail("the script-runner", &err),
    };
    let stop = match crate::node::Stop::install() {
        Ok(stop) => stop,
        Err(err) => return fail("installing the signal handlers", &err),
    };
    let options =
        crate::scripts::exec::Options::new(target, mode == ScriptMode::PostBoot && args.system);
    let log = |line: &str| eprintln!("mprov-agent: {line}");
    match crate::scripts::run(&control, &plan, &options, stop.flag(), &log) {
        Ok(report) if report.outcome == RunOutcome::Success => ExitCode::SUCCESS,
        Ok(report) => {
            eprintln!(
                "mprov-agent: the scripts did not all run: {}",
                report.detail
            );
            for result in &report.results {
                if !result.output_tail.is_empty()
                    && result.status != mprov_api::scripts::ScriptStatus::Success
                {
                    eprintln!(
                        "--- {} ({:?}):\n{}",
                        result.slug, result.status, result.output_tail
                    );
                }
            }
            ExitCode::FAILURE
        }
        Err(err) => fail("the script-runner", &err),
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

    #[test]
    fn nads_flags() {
        let parse = |args: &[&str]| Cli::try_parse_from(["mprov-agent", "nads"].iter().chain(args));
        let Command::Nads(args) = parse(&[]).expect("parses").command else {
            panic!("not nads")
        };
        assert_eq!(args.window, mprov_api::nads::DEFAULT_WINDOW_SECONDS);
        assert!(!args.json && args.report.is_none());
        let Command::Nads(args) = parse(&[
            "--window",
            "5",
            "--json",
            "--report",
            "https://c",
            "--nonce",
            "n",
        ])
        .expect("parses")
        .command
        else {
            panic!("not nads")
        };
        assert_eq!((args.window, args.json), (5, true));
        // A nonce or a CA means nothing without somewhere to report.
        assert!(parse(&["--nonce", "n"]).is_err());
        assert!(parse(&["--ca", "ca.pem"]).is_err());
    }

    #[test]
    fn script_runner_flags_are_the_seed_s() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["mprov-agent", "script-runner"].iter().chain(args))
        };
        let cli = parse(&["-s", "-b", "-r", "-d"]).expect("parses");
        let Command::ScriptRunner(args) = cli.command else {
            panic!("not the runner")
        };
        assert!(args.system && args.post_boot && args.run_once && args.no_register);
        let cli = parse(&["-i", "compute", "--root", "/img"]).expect("parses");
        let Command::ScriptRunner(args) = cli.command else {
            panic!("not the runner")
        };
        assert_eq!(args.image.as_deref(), Some("compute"));
        // -i and -s exclude each other; one is needed; -i needs its root.
        assert!(parse(&["-i", "compute", "--root", "/img", "-s"]).is_err());
        assert!(parse(&["-b"]).is_err());
        assert!(parse(&["-i", "compute"]).is_err());
        // A job server's own identity comes whole.
        assert!(parse(&["-s", "--url", "https://c"]).is_err());
        assert!(
            parse(&[
                "-s",
                "--url",
                "https://c",
                "--cert",
                "c",
                "--key",
                "k",
                "--ca",
                "a"
            ])
            .is_ok()
        );
    }
}
