//! mash, the mProv admin shell: the inventory from a terminal or a script.
//!
//! mash is a thin layer over the REST API through `mprov_api::client`: every
//! command is one request (or one page-following list), so what mash can do
//! and what the API allows never drift apart, and the server stays the only
//! place that validates. What mash adds is what a command line needs: the
//! connection settings ([`config`]), `field=value` arguments (`values`),
//! tables (`output`) and the CSV import (`import`).
//!
//! Commands read `mash <kind> <action>`, one subcommand per kind of the API
//! (`systems`, `groups`, `nics`, ...), plus `mash import <file.csv>`. They are
//! explicit enum variants rather than generated from the kinds table so that
//! `--help` lists them with a sentence each.
//!
//! The binary is `src/main.rs`; everything it does is here, so tests can run
//! the same code.

#![warn(missing_docs)]

mod boot;
mod bulk;
pub mod config;
mod discovery;
mod import;
mod jobs;
mod jobservers;
mod kinds;
pub mod output;
mod values;

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use mprov_api::client::{Client, ClientError};
use serde_json::Value;

use crate::config::ConnArgs;
use crate::kinds::KindInfo;
use crate::output::Format;

const AFTER_HELP: &str = "\
Connection settings come from the flags, then the environment, then a config file:
  MPROV_URL                    the control service, e.g. https://mpcc.example:8443
  MPROV_APIKEY                 an API key, or else
  MPROV_USER, MPROV_PASSWORD   a user name and password (HTTP Basic)
  MPROV_CA_CERT                the CA to trust for https (the install's ca.crt)
  MPROV_SKIP_VERSION_CHECK=1   talk to a server of another version (development only)

The config file is --config FILE, else the first of $XDG_CONFIG_HOME/mprov/mash.toml
(~/.config/mprov/mash.toml) and /etc/mprov/mash.toml that exists. It is TOML with the
keys url, apikey, user, password and ca_cert (relative to the file); any other key is
an error. Keep it private (chmod 600) when it holds a secret:
    url = \"https://mpcc.example:8443\"
    apikey = \"<key>\"

mash and the control service must run the same major.minor version: upgrade them together.

Examples:
  mash systems list --filter image=rocky9 --sort -hostname
  mash systems show n001 --json
  mash systems add hostname=n001 image=rocky9 groups=compute,gpu \\
      'nics:=[{\"name\":\"eth0\",\"mac\":\"aa:bb:cc:dd:ee:01\",\"bootable\":true}]'
  mash groups edit compute priority=10
  mash systems delete n001
  mash import nodes.csv";

const KIND_AFTER_HELP: &str = "\
Rows are named by id, or by their slug where the kind has one (a system's hostname,
a group's slug, ...).

Values of add and edit: FIELD=VALUE, read as the field's type says: true/false,
integers, comma-separated lists (groups=compute,gpu; groups= is the empty list),
ids or slugs for references (image=rocky9), null for null, anything else as text.
FIELD:=JSON sends any JSON as it is (nics:=[{...}], name:='\"null\"').
--json '<object>' gives the whole body at once; FIELD=VALUE arguments override it.";

const IMPORT_AFTER_HELP: &str = "\
The CSV's header names its columns, in any order; only hostname is required:
  hostname,image,groups,nic,mac,ipv4,ipv6,network,bootable
One NIC per row: rows with the same hostname add NICs to the same system. groups are
separated by ';'. Blank cells are left out, so the server's defaults apply. Lines
starting with # are comments.

The whole file is sent as one bulk create: every system is created, or none is. When
the server refuses, each bad row is reported with its line in the file.

Example:
  hostname,image,groups,nic,mac,ipv4,network,bootable
  n001,rocky9,compute;gpu,eth0,aa:bb:cc:dd:ee:01,10.0.0.1,prov,true
  n001,,,ib0,,10.1.0.1,ib,false";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "mash",
    version,
    about = "mash, the mProv admin shell: list, show, add, edit, delete and import inventory",
    after_help = AFTER_HELP,
    propagate_version = true
)]
pub struct Cli {
    /// Where the control service is and who we are.
    #[command(flatten)]
    pub conn: ConnArgs,

    /// How to print results.
    #[arg(
        short,
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "MPROV_OUTPUT",
        help_heading = "Output"
    )]
    pub output: Format,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands: one per kind, and `import`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Machines of the cluster (key: id or hostname); run-scripts runs a
    /// node's post-boot scripts again
    Systems(SystemsArgs),
    /// Groups of systems sharing config layers (key: id or slug)
    Groups(KindArgs),
    /// Network interfaces of systems (key: id)
    Nics(KindArgs),
    /// IPv4 networks of the cluster (key: id or slug)
    Networks(KindArgs),
    /// Network switches (key: id or hostname)
    Switches(KindArgs),
    /// Ports of switches (key: id)
    Switchports(KindArgs),
    /// Baseboard management controllers (key: id)
    Bmcs(KindArgs),
    /// Operating system distributions (key: id or slug)
    Distros(KindArgs),
    /// Node images (key: id or slug)
    Images(KindArgs),
    /// Package repositories (key: id or slug)
    Repos(KindArgs),
    /// Image-gen and post-boot scripts (key: id or slug)
    Scripts(KindArgs),
    /// Job servers: list and show each one's addresses with their network,
    /// heartbeat age, load and image streams, and its modules (key: id or
    /// name)
    ///
    /// `list` and `show` print one line per address the job server
    /// registered: the network it serves there, how long ago its last
    /// heartbeat from there came ("12 s ago", "never"), the load and image
    /// streams that heartbeat carried, and the job server's modules. Nodes
    /// are sent only to an address on their network heard from within
    /// MPROV_JOBSERVER_STALE_SECONDS (45 s by default) of the control
    /// service. A job server that registered no addresses (a row made by
    /// hand) shows its row's addresses and heartbeat on one line. --json
    /// prints the rows as the API returns them.
    Jobservers(KindArgs),
    /// The jobs queue: list jobs, show one with its whole output (key: id)
    Jobs(JobsArgs),
    /// API keys; adding one prints the key, once (key: id)
    Apikeys(KindArgs),
    /// Administrator accounts (key: id or username)
    Users(KindArgs),
    /// Create systems from a CSV file, all in one transaction
    #[command(after_help = IMPORT_AFTER_HELP)]
    Import(ImportArgs),
    /// Boot timelines: what each node's boot went through, step by step
    Boot(BootArgs),
    /// The audit log: every bulk action applied, newest first
    Audit {
        /// Show at most N entries
        #[arg(short, long, value_name = "N")]
        limit: Option<u32>,
        /// Print JSON (the same as --output json)
        #[arg(long)]
        json: bool,
    },
    /// Discovered nodes parked for an admin: list them, assign one to a
    /// system's NIC (its next boot is a normal one), or dismiss one
    Discovery(DiscoveryArgs),
}

/// The arguments of `mash discovery`.
#[derive(Debug, Args)]
pub struct DiscoveryArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: DiscoveryAction,
}

/// What `mash discovery` does.
#[derive(Debug, Subcommand)]
pub enum DiscoveryAction {
    /// The parked nodes: MAC, the switch port each heard, its hardware,
    /// the NIC it matched and why it waits
    List {
        /// Print JSON (the same as --output json)
        #[arg(long)]
        json: bool,
    },
    /// Bind a parked node's MAC to a system's NIC
    Assign {
        /// The parked node's MAC
        mac: String,
        /// The system (id or host name)
        system: String,
        /// The NIC (id, or its name on the system)
        nic: String,
        /// Replace the MAC the NIC has
        #[arg(long)]
        replace: bool,
    },
    /// Forget a parked node (its next discovery boot parks it again)
    Dismiss {
        /// The parked node's MAC
        mac: String,
    },
}

const JOBS_AFTER_HELP: &str = "\
Job servers claim the jobs of their modules, oldest first, and report each one's
status, output and exit code. States: pending, running, success, failed.

Examples:
  mash jobs                              every job, newest first
  mash jobs --status failed --module image-update
  mash jobs show 42                      one job with its whole output
  mash jobs add module=libgenders        queue a job by hand
  mash jobs delete 42";

/// The arguments of `mash jobs`: a list unless an action is named.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, after_help = JOBS_AFTER_HELP)]
pub struct JobsArgs {
    /// What to do; without one, list the jobs.
    #[command(subcommand)]
    pub action: Option<JobsAction>,
    /// What `mash jobs` alone lists.
    #[command(flatten)]
    pub list: JobsList,
}

/// Which jobs a list shows.
#[derive(Debug, Args, Default)]
pub struct JobsList {
    /// Only jobs in this state (pending, running, success, failed)
    #[arg(long, value_name = "STATE")]
    pub status: Option<String>,
    /// Only jobs of this module (image-update, image-sync, ...)
    #[arg(long, value_name = "MODULE")]
    pub module: Option<String>,
    /// Only jobs claimed by this job server (id or name)
    #[arg(long, value_name = "JOBSERVER")]
    pub jobserver: Option<String>,
    /// Show at most N jobs, newest first
    #[arg(short, long, value_name = "N")]
    pub limit: Option<u32>,
    /// Print JSON (the same as --output json)
    #[arg(long)]
    pub json: bool,
}

/// What `mash jobs` does.
#[derive(Debug, Subcommand)]
pub enum JobsAction {
    /// List jobs, newest first: id, module, state, job server, times, exit code
    #[command(visible_alias = "ls")]
    List(JobsList),
    /// Show one job with its whole output
    #[command(visible_alias = "get")]
    Show {
        /// The job's id
        id: String,
        /// Print JSON (the same as --output json)
        #[arg(long)]
        json: bool,
    },
    /// Queue a job from FIELD=VALUE arguments (module=..., params:=JSON)
    #[command(visible_alias = "create")]
    Add {
        /// The fields: FIELD=VALUE or FIELD:=JSON
        #[arg(value_name = "FIELD=VALUE")]
        fields: Vec<String>,
        /// The body as one JSON object
        #[arg(long, value_name = "OBJECT")]
        json: Option<String>,
    },
    /// Change fields of a job
    #[command(visible_alias = "update")]
    Edit {
        /// The job's id
        key: String,
        /// The fields to change: FIELD=VALUE or FIELD:=JSON
        #[arg(value_name = "FIELD=VALUE")]
        fields: Vec<String>,
        /// The changes as one JSON object
        #[arg(long, value_name = "OBJECT")]
        json: Option<String>,
    },
    /// Delete a job
    #[command(visible_alias = "rm")]
    Delete {
        /// The job's id
        key: String,
    },
}

impl JobsArgs {
    /// The generic action this stands for, when it is one (add, edit,
    /// delete); list and show are the jobs' own.
    fn generic(&self) -> Option<Action> {
        Some(match self.action.as_ref()? {
            JobsAction::Add { fields, json } => Action::Add {
                fields: fields.clone(),
                json: json.clone(),
            },
            JobsAction::Edit { key, fields, json } => Action::Edit {
                key: key.clone(),
                fields: fields.clone(),
                json: json.clone(),
            },
            JobsAction::Delete { key } => Action::Delete { key: key.clone() },
            JobsAction::List(_) | JobsAction::Show { .. } => return None,
        })
    }
}

/// The arguments of `mash boot`.
#[derive(Debug, Args)]
pub struct BootArgs {
    /// What to show.
    #[command(subcommand)]
    pub action: BootAction,
}

/// What `mash boot` shows.
#[derive(Debug, Subcommand)]
pub enum BootAction {
    /// A node's last boot, each step with how long it took until the next;
    /// without HOST, the latest step of every node
    Status {
        /// The node's host name or id
        host: Option<String>,
        /// Every boot of the node, not only the last
        #[arg(long)]
        all: bool,
        /// Print JSON (the same as --output json)
        #[arg(long)]
        json: bool,
    },
}

impl Command {
    /// The kind a kind command is about, and its arguments.
    fn kind(&self) -> Option<(&'static str, &Action)> {
        let (name, args) = match self {
            Command::Jobs(_) => return None,
            Command::Systems(SystemsArgs { action }) => {
                return match action {
                    SystemsAction::Kind(a) => Some(("systems", a)),
                    SystemsAction::RunScripts { .. } | SystemsAction::Bulk { .. } => None,
                };
            }
            Command::Groups(a) => ("groups", a),
            Command::Nics(a) => ("nics", a),
            Command::Networks(a) => ("networks", a),
            Command::Switches(a) => ("switches", a),
            Command::Switchports(a) => ("switchports", a),
            Command::Bmcs(a) => ("bmcs", a),
            Command::Distros(a) => ("distros", a),
            Command::Images(a) => ("images", a),
            Command::Repos(a) => ("repos", a),
            Command::Scripts(a) => ("scripts", a),
            Command::Jobservers(a) => ("jobservers", a),
            Command::Apikeys(a) => ("apikeys", a),
            Command::Users(a) => ("users", a),
            Command::Import(_)
            | Command::Boot(_)
            | Command::Discovery(_)
            | Command::Audit { .. } => return None,
        };
        Some((name, &args.action))
    }
}

const SYSTEMS_AFTER_HELP: &str = "\
Rows are named by id, or by their hostname.

Values of add and edit: FIELD=VALUE, read as the field's type says: true/false,
integers, comma-separated lists (groups=compute,gpu; groups= is the empty list),
ids or slugs for references (image=rocky9), null for null, anything else as text.
FIELD:=JSON sends any JSON as it is (nics:=[{...}], name:='\"null\"').
--json '<object>' gives the whole body at once; FIELD=VALUE arguments override it.

mash systems run-scripts HOST asks the node to run its post-boot scripts again,
without a reboot; mash boot status HOST then shows each script as it ends.

A filter selects systems, in list --filter and bulk --filter: terms separated by
spaces, all of which must match. A term is KEY:VALUE; KEY:A,B matches either value,
a leading - negates it, * matches any run of characters, a value with spaces is
double-quoted. Keys: hostname, group, image, rack, mac, ip (an address, an IPv4
prefix such as 10.0.0.0/24, or a glob), bmc (the BMC's IPv4 address, as ip), phase
(dhcp, ipxe, kernel, enrolled, image, scripts, ready, failed, or none).
  mash systems list --filter 'group:compute rack:r1 -phase:ready'
  mash systems list --filter 'mac:52:54:00:* ip:10.0.0.0/24'
(--filter FIELD=VALUE still filters on one field, as for every kind.)

mash systems bulk ACTION [ARG] --filter F changes every system F matches: first it
prints how many match and the first host names, and changes nothing; run it again
with --confirm N, N that count, to apply it (refused if the count changed meanwhile).
Each applied action is in the audit log (mash audit). Actions:
  add-to-group GROUP, remove-from-group GROUP, set-image IMAGE, set-netboot on|off,
  run-scripts
  mash systems bulk add-to-group gpu --filter 'rack:r1 -group:gpu'
  mash systems bulk add-to-group gpu --filter 'rack:r1 -group:gpu' --confirm 40";

/// The arguments of `mash systems`: the kind's actions and run-scripts.
#[derive(Debug, Args)]
#[command(after_help = SYSTEMS_AFTER_HELP)]
pub struct SystemsArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: SystemsAction,
}

/// What `mash systems` does.
#[derive(Debug, Subcommand)]
pub enum SystemsAction {
    /// The actions of every kind.
    #[command(flatten)]
    Kind(Action),
    /// Run the node's post-boot scripts again, without a reboot (its agent
    /// picks the request up)
    RunScripts {
        /// The node's host name or id
        host: String,
    },
    /// Change every system a filter matches: a preview (the count and the
    /// first host names) unless --confirm gives that count
    Bulk {
        /// add-to-group, remove-from-group, set-image, set-netboot or
        /// run-scripts
        action: String,
        /// The group or image (slug), or on/off for set-netboot
        arg: Option<String>,
        /// The systems: a filter such as 'group:compute -phase:ready'
        #[arg(short, long, value_name = "FILTER", allow_hyphen_values = true)]
        filter: String,
        /// Apply it, if the filter still matches exactly N systems
        #[arg(long, value_name = "N")]
        confirm: Option<u64>,
    },
}

/// The arguments of a kind command.
#[derive(Debug, Args)]
#[command(after_help = KIND_AFTER_HELP)]
pub struct KindArgs {
    /// What to do with rows of this kind.
    #[command(subcommand)]
    pub action: Action,
}

/// What to do with rows of a kind.
#[derive(Debug, Subcommand)]
pub enum Action {
    /// List rows (all of them, page by page, unless --limit)
    #[command(visible_alias = "ls")]
    List {
        /// Only rows whose FIELD equals VALUE; on systems also a filter such
        /// as 'group:compute -phase:ready' (see mash systems --help); repeat
        /// to narrow further
        #[arg(
            short,
            long = "filter",
            value_name = "FIELD=VALUE|FILTER",
            allow_hyphen_values = true
        )]
        filters: Vec<String>,
        /// Sort by FIELD, or by -FIELD for descending order
        #[arg(short, long, value_name = "FIELD", allow_hyphen_values = true)]
        sort: Option<String>,
        /// Show at most N rows
        #[arg(short, long, value_name = "N")]
        limit: Option<u32>,
        /// Print JSON (the same as --output json)
        #[arg(long)]
        json: bool,
    },
    /// Show one row, every field
    #[command(visible_alias = "get")]
    Show {
        /// The row's id or slug
        key: String,
        /// Print JSON (the same as --output json)
        #[arg(long)]
        json: bool,
    },
    /// Create a row from FIELD=VALUE arguments and print it as stored
    #[command(visible_alias = "create")]
    Add {
        /// The fields: FIELD=VALUE or FIELD:=JSON
        #[arg(value_name = "FIELD=VALUE")]
        fields: Vec<String>,
        /// The body as one JSON object
        #[arg(long, value_name = "OBJECT")]
        json: Option<String>,
    },
    /// Change fields of a row and print it as stored
    #[command(visible_alias = "update")]
    Edit {
        /// The row's id or slug
        key: String,
        /// The fields to change: FIELD=VALUE or FIELD:=JSON
        #[arg(value_name = "FIELD=VALUE")]
        fields: Vec<String>,
        /// The changes as one JSON object
        #[arg(long, value_name = "OBJECT")]
        json: Option<String>,
    },
    /// Delete a row
    #[command(visible_alias = "rm")]
    Delete {
        /// The row's id or slug
        key: String,
    },
}

/// The arguments of `mash import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The CSV file; - reads standard input
    #[arg(value_name = "FILE.csv")]
    pub file: PathBuf,
    /// Print the bulk body as JSON instead of sending it
    #[arg(long)]
    pub dry_run: bool,
    /// Report at most N of the server's complaints; 0 reports all
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub max_errors: usize,
}

/// Runs a parsed command line, printing results to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    runtime.block_on(run_async(cli, out))
}

async fn run_async(cli: Cli, out: &mut dyn Write) -> Result<()> {
    if let Command::Import(args) = &cli.command {
        return import(&cli, args, out).await;
    }
    if let Command::Boot(BootArgs {
        action: BootAction::Status { host, all, json },
    }) = &cli.command
    {
        let client = connect(&cli.conn)?;
        let format = if *json { Format::Json } else { cli.output };
        return boot::status(&client, host.as_deref(), *all, format, out).await;
    }
    if let Command::Jobs(args) = &cli.command {
        return jobs_command(&cli, args, out).await;
    }
    if let Command::Discovery(DiscoveryArgs { action }) = &cli.command {
        let client = connect(&cli.conn)?;
        return discovery::run(&client, action, cli.output, out).await;
    }
    if let Command::Systems(SystemsArgs {
        action:
            SystemsAction::Bulk {
                action,
                arg,
                filter,
                confirm,
            },
    }) = &cli.command
    {
        let client = connect(&cli.conn)?;
        return bulk::bulk(
            &client,
            action,
            arg.as_deref(),
            filter,
            *confirm,
            cli.output,
            out,
        )
        .await;
    }
    if let Command::Audit { limit, json } = &cli.command {
        let client = connect(&cli.conn)?;
        let format = if *json { Format::Json } else { cli.output };
        return bulk::audit(&client, *limit, format, out).await;
    }
    if let Command::Systems(SystemsArgs {
        action: SystemsAction::RunScripts { host },
    }) = &cli.command
    {
        let client = connect(&cli.conn)?;
        return run_scripts(&client, host, cli.output, out).await;
    }
    let Some((name, action)) = cli.command.kind() else {
        bail!("no such command");
    };
    run_kind(&cli, name, action, out).await
}

/// `mash systems run-scripts HOST`: queues the run and says what happens
/// next.
async fn run_scripts(
    client: &Client,
    host: &str,
    format: Format,
    out: &mut dyn Write,
) -> Result<()> {
    let requested = client
        .run_scripts(host)
        .await
        .with_context(|| format!("could not ask {host} to run its scripts again"))?;
    if format == Format::Json {
        let v = serde_json::to_value(&requested)?;
        write!(out, "{}", output::json(&v))?;
        return Ok(());
    }
    let system = &requested.system;
    writeln!(
        out,
        "{system}: a new run of its post-boot scripts is queued (run request {}).\n\
         Its agent runs them when it next reads its plan: /etc/nologin is up while they run,\n\
         each script shows on its boot timeline as it ends, and a failure leaves the node failed\n\
         with the script's exit code and output. Follow it with: mash boot status {system}",
        requested.run_request
    )?;
    Ok(())
}

/// `mash jobs`: its own list and show, the generic add, edit and delete.
async fn jobs_command(cli: &Cli, args: &JobsArgs, out: &mut dyn Write) -> Result<()> {
    if let Some(action) = args.generic() {
        return run_kind(cli, "jobs", &action, out).await;
    }
    let client = connect(&cli.conn)?;
    let format = |json: bool| if json { Format::Json } else { cli.output };
    match &args.action {
        Some(JobsAction::Show { id, json }) => jobs::show(&client, id, format(*json), out).await,
        action => {
            let l = match action {
                Some(JobsAction::List(l)) => l,
                _ => &args.list,
            };
            let filters = jobs::Filters {
                status: l.status.clone(),
                module: l.module.clone(),
                jobserver: l.jobserver.clone(),
                limit: l.limit,
            };
            jobs::list(&client, &filters, format(l.json), out).await
        }
    }
}

/// A generic action on rows of the kind `name`.
async fn run_kind(cli: &Cli, name: &str, action: &Action, out: &mut dyn Write) -> Result<()> {
    let kind = kinds::kind(name).with_context(|| format!("mash does not know the kind {name}"))?;
    let client = connect(&cli.conn)?;
    match action {
        Action::List {
            filters,
            sort,
            limit,
            json,
        } => {
            let format = if *json { Format::Json } else { cli.output };
            list(&client, kind, filters, sort.as_deref(), *limit, format, out).await
        }
        Action::Show { key, json } => {
            let format = if *json { Format::Json } else { cli.output };
            let item = client
                .get(kind.name, key)
                .await
                .with_context(|| format!("could not show {} {key}", kind.name))?;
            if kind.name == "jobservers" && format == Format::Table {
                let text = jobservers::show(&item, &network_slugs(&client).await, unix_now());
                out.write_all(text.as_bytes())?;
                return Ok(());
            }
            print_object(&item, format, out)
        }
        Action::Add { fields, json } => {
            let body = body(kind, json.as_deref(), fields)?;
            let item = client
                .create(kind.name, &body)
                .await
                .with_context(|| format!("could not add to {}", kind.name))?;
            print_object(&item, cli.output, out)
        }
        Action::Edit { key, fields, json } => {
            let body = body(kind, json.as_deref(), fields)?;
            let item = client
                .update(kind.name, key, &body)
                .await
                .with_context(|| format!("could not edit {} {key}", kind.name))?;
            print_object(&item, cli.output, out)
        }
        Action::Delete { key } => {
            client
                .delete(kind.name, key)
                .await
                .with_context(|| format!("could not delete {} {key}", kind.name))?;
            if cli.output == Format::Table {
                writeln!(out, "deleted {} {key}", kind.name)?;
            }
            Ok(())
        }
    }
}

/// A client from the connection flags, environment and config file.
fn connect(conn: &ConnArgs) -> Result<Client> {
    let settings = config::load(conn)?;
    let mut builder = Client::builder(&settings.url, settings.auth);
    if let Some(path) = &settings.ca_cert {
        let pem = std::fs::read(path)
            .with_context(|| format!("could not read the CA certificate {}", path.display()))?;
        builder = builder.ca_certificates_pem(pem);
    }
    Ok(builder.build()?)
}

async fn list(
    client: &Client,
    kind: &KindInfo,
    filters: &[String],
    sort: Option<&str>,
    limit: Option<u32>,
    format: Format,
    out: &mut dyn Write,
) -> Result<()> {
    let mut query: Vec<(String, String)> = Vec::new();
    let mut expression = Vec::new();
    for filter in filters {
        match field_filter(filter) {
            Some((field, value)) => query.push((field.to_owned(), value.to_owned())),
            None => expression.push(filter.as_str()),
        }
    }
    if !expression.is_empty() {
        // Terms are ANDed, so several --filter expressions are one.
        query.push(("filter".to_owned(), expression.join(" ")));
    }
    if let Some(sort) = sort {
        query.push(("sort".to_owned(), sort.to_owned()));
    }
    let context = || format!("could not list {}", kind.name);
    let items = match limit {
        Some(limit) => {
            query.push(("limit".to_owned(), limit.to_string()));
            let page = client.list(kind.name, &query).await.with_context(context)?;
            if page.total > page.items.len() as u64 && format == Format::Table {
                eprintln!(
                    "mash: showing {} of {} {}; raise --limit, or drop it to see all",
                    page.items.len(),
                    page.total,
                    kind.name
                );
            }
            page.items
        }
        None => client
            .list_all(kind.name, &query)
            .await
            .with_context(context)?,
    };
    match format {
        Format::Json => out.write_all(output::json(&Value::Array(items)).as_bytes())?,
        Format::Table if kind.name == "jobservers" => {
            let text = jobservers::table(&items, &network_slugs(client).await, unix_now());
            out.write_all(text.as_bytes())?;
        }
        Format::Table => out.write_all(output::list_table(kind, &items).as_bytes())?,
    }
    Ok(())
}

/// A `--filter` of the form FIELD=VALUE (a field name, then `=` before
/// any `:`), else `None`: a filter expression (`group:compute`).
fn field_filter(filter: &str) -> Option<(&str, &str)> {
    let (field, value) = filter.split_once('=')?;
    let name = !field.is_empty()
        && field
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    name.then_some((field, value))
}

/// The networks' slugs by id, to name them in tables; empty when they
/// cannot be read (the tables show ids then).
async fn network_slugs(client: &Client) -> std::collections::HashMap<i64, String> {
    let no_query: &[(&str, &str)] = &[];
    client
        .list_all("networks", no_query)
        .await
        .unwrap_or_default()
        .iter()
        .filter_map(|n| Some((n["id"].as_i64()?, n["slug"].as_str()?.to_owned())))
        .collect()
}

/// Seconds since the epoch, now.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn print_object(item: &Value, format: Format, out: &mut dyn Write) -> Result<()> {
    let text = match format {
        Format::Json => output::json(item),
        Format::Table => output::object_table(item),
    };
    out.write_all(text.as_bytes())?;
    Ok(())
}

/// The body of an add or edit: the `--json` object, then the `FIELD=VALUE`
/// arguments over it.
fn body(kind: &KindInfo, json: Option<&str>, fields: &[String]) -> Result<Value> {
    let mut body = match json {
        Some(text) => match serde_json::from_str(text).context("--json is not valid JSON")? {
            Value::Object(map) => map,
            _ => bail!("--json must be a JSON object"),
        },
        None => serde_json::Map::new(),
    };
    body.extend(values::parse_assignments(kind, fields)?);
    if body.is_empty() {
        bail!("no fields given: pass FIELD=VALUE arguments or --json '<object>'");
    }
    Ok(Value::Object(body))
}

async fn import(cli: &Cli, args: &ImportArgs, out: &mut dyn Write) -> Result<()> {
    let started = Instant::now();
    let name = args.file.display().to_string();
    let parsed = if name == "-" {
        import::from_csv(std::io::stdin().lock())
    } else {
        let file =
            std::fs::File::open(&args.file).with_context(|| format!("could not open {name}"))?;
        import::from_csv(std::io::BufReader::new(file))
    }
    .with_context(|| format!("{name} is not a valid import file"))?;
    if args.dry_run {
        out.write_all(output::json(&Value::Array(parsed.rows)).as_bytes())?;
        return Ok(());
    }
    if parsed.rows.is_empty() {
        bail!("{name} has no systems to import");
    }
    let client = connect(&cli.conn)?;
    let created = match client.bulk_create("systems", &parsed.rows).await {
        Ok(created) => created,
        Err(ClientError::Api { status, body }) if status.is_client_error() => bail!(
            "the server refused the import ({status}: {}); nothing was created:\n{}",
            body.error,
            parsed.lines.explain(&body, args.max_errors)
        ),
        Err(err) => return Err(err).with_context(|| format!("could not import {name}")),
    };
    let seconds = started.elapsed().as_secs_f64();
    match cli.output {
        Format::Json => out.write_all(output::json(&serde_json::to_value(&created)?).as_bytes())?,
        Format::Table => writeln!(
            out,
            "imported {} systems in {seconds:.2} s",
            created.ids.len()
        )?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use serde_json::json;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_kind_has_a_command_and_back() {
        let cmd = Cli::command();
        for kind in kinds::KINDS {
            let sub = cmd
                .find_subcommand(kind.name)
                .unwrap_or_else(|| panic!("no command for {}", kind.name));
            let cli = Cli::try_parse_from(["mash", kind.name, "list"]).expect("parse");
            if kind.name == "jobs" {
                assert!(matches!(cli.command, Command::Jobs(_)));
            } else {
                assert_eq!(cli.command.kind().map(|(n, _)| n), Some(kind.name));
            }
            assert!(sub.get_about().is_some(), "{}", kind.name);
        }
        let kind_commands = cmd
            .get_subcommands()
            .filter(|s| !matches!(s.get_name(), "import" | "boot" | "audit" | "discovery"))
            .count();
        assert_eq!(kind_commands, kinds::KINDS.len());
    }

    #[test]
    fn boot_status_takes_an_optional_host() {
        let cli = Cli::try_parse_from(["mash", "boot", "status", "c01", "--all"]).expect("parse");
        assert!(matches!(
            cli.command,
            Command::Boot(BootArgs {
                action: BootAction::Status { host: Some(ref h), all: true, json: false }
            }) if h == "c01"
        ));
        let cli = Cli::try_parse_from(["mash", "boot", "status"]).expect("parse");
        assert!(matches!(
            cli.command,
            Command::Boot(BootArgs {
                action: BootAction::Status { host: None, .. }
            })
        ));
    }

    #[test]
    fn jobs_list_alone_or_with_list_and_show_one() {
        let parse = |args: &[&str]| match Cli::try_parse_from(args).expect("parse").command {
            Command::Jobs(a) => a,
            other => panic!("{other:?}"),
        };
        let a = parse(&[
            "mash",
            "jobs",
            "--status",
            "failed",
            "--module",
            "image-update",
        ]);
        assert!(a.action.is_none());
        assert_eq!(
            (a.list.status.as_deref(), a.list.module.as_deref()),
            (Some("failed"), Some("image-update"))
        );
        let a = parse(&["mash", "jobs", "list", "--status", "running", "-l", "5"]);
        assert!(
            matches!(a.action, Some(JobsAction::List(JobsList { ref status, limit: Some(5), .. })) if status.as_deref() == Some("running"))
        );
        let a = parse(&["mash", "jobs", "show", "42"]);
        assert!(matches!(a.action, Some(JobsAction::Show { ref id, json: false }) if id == "42"));
        assert!(a.generic().is_none());
        let a = parse(&["mash", "jobs", "delete", "42"]);
        assert!(matches!(a.generic(), Some(Action::Delete { ref key }) if key == "42"));
        assert!(Cli::try_parse_from(["mash", "jobs", "show"]).is_err());
        assert!(Cli::try_parse_from(["mash", "jobs", "--status", "failed", "show", "1"]).is_err());
        let help = Cli::command()
            .find_subcommand_mut("jobs")
            .expect("jobs")
            .render_long_help()
            .to_string();
        for needle in [
            "--status",
            "--module",
            "show",
            "whole output",
            "mash jobs show 42",
        ] {
            assert!(help.contains(needle), "{needle} missing from:\n{help}");
        }
    }

    #[test]
    fn parsing() {
        let cli = Cli::try_parse_from([
            "mash",
            "systems",
            "list",
            "-f",
            "image=rocky9",
            "--filter",
            "netboot=true",
            "--sort",
            "-hostname",
            "--limit",
            "5",
            "--json",
        ])
        .expect("parse");
        match cli.command {
            Command::Systems(SystemsArgs {
                action:
                    SystemsAction::Kind(Action::List {
                        filters,
                        sort,
                        limit,
                        json,
                    }),
            }) => {
                assert_eq!(filters, ["image=rocky9", "netboot=true"]);
                assert_eq!(sort.as_deref(), Some("-hostname"));
                assert_eq!(limit, Some(5));
                assert!(json);
            }
            other => panic!("{other:?}"),
        }
        let cli = Cli::try_parse_from([
            "mash",
            "groups",
            "add",
            "slug=gpu",
            "--json",
            "{\"priority\":3}",
            "-o",
            "json",
        ])
        .expect("parse");
        assert_eq!(cli.output, Format::Json);
        assert!(matches!(
            cli.command,
            Command::Groups(KindArgs {
                action: Action::Add { .. }
            })
        ));
        assert!(Cli::try_parse_from(["mash", "widgets", "list"]).is_err());
        assert!(Cli::try_parse_from(["mash", "systems", "show"]).is_err());
        let cli = Cli::try_parse_from(["mash", "systems", "run-scripts", "c01"]).expect("parse");
        assert!(matches!(
            cli.command,
            Command::Systems(SystemsArgs {
                action: SystemsAction::RunScripts { ref host },
            }) if host == "c01"
        ));
        assert!(cli.command.kind().is_none());
        assert!(Cli::try_parse_from(["mash", "systems", "run-scripts"]).is_err());
        assert!(Cli::try_parse_from(["mash", "groups", "run-scripts", "g"]).is_err());
    }

    #[test]
    fn bodies() {
        let systems = kinds::kind("systems").expect("systems");
        let fields = ["netboot=false".to_owned(), "hostname=n2".to_owned()];
        assert_eq!(
            body(
                systems,
                Some(r#"{"hostname":"n1","image":"rocky9"}"#),
                &fields
            )
            .expect("body"),
            json!({"hostname": "n2", "image": "rocky9", "netboot": false})
        );
        for (json, fields, message) in [
            (None, &[][..], "no fields given"),
            (Some("[1]"), &[][..], "must be a JSON object"),
            (Some("{"), &[][..], "not valid JSON"),
        ] {
            let err = body(systems, json, fields).expect_err(message);
            assert!(format!("{err:#}").contains(message), "{err:#}");
        }
    }

    #[test]
    fn help_describes_the_environment_and_the_config_file() {
        let help = Cli::command().render_long_help().to_string();
        for needle in [
            "MPROV_URL",
            "MPROV_APIKEY",
            "MPROV_USER",
            "MPROV_PASSWORD",
            "mash.toml",
            "/etc/mprov",
        ] {
            assert!(help.contains(needle), "{needle} missing from:\n{help}");
        }
    }

    #[test]
    fn a_filter_is_field_equals_value_or_an_expression() {
        assert_eq!(field_filter("image=rocky9"), Some(("image", "rocky9")));
        assert_eq!(field_filter("run_request=0"), Some(("run_request", "0")));
        assert_eq!(field_filter("group:compute"), None);
        assert_eq!(field_filter("rack:\"a=b\""), None);
        assert_eq!(field_filter("-phase:ready"), None);
        assert_eq!(field_filter("=x"), None);
    }
}
