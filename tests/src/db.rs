//! Real MariaDB and PostgreSQL servers for tests.
//!
//! The control service speaks three SQL dialects through sqlx, and only a real
//! server catches a migration or a query that one engine rejects. So each test
//! process starts its own servers instead of using a system-wide instance:
//!
//! * Each server lives in its own `tempfile` folder, which holds its data, its
//!   unix socket, its pid file and its log. Nothing touches `/var/lib/mysql`,
//!   `/run/mysqld`, `/run/postgresql` or the default ports, and MariaDB runs with
//!   `--no-defaults` so `/etc/mysql` is never read.
//! * It listens on 127.0.0.1 on a port picked by binding port 0 and releasing it
//!   just before the server starts. Another process may take the port in between;
//!   when the server then fails with "Address already in use", we retry on a new
//!   port.
//! * When we are root, the server runs as its Debian system user (`postgres`,
//!   `mysql`; a dedicated `mprov-db` system user is created when that is
//!   missing), because PostgreSQL refuses to run as root; its folder is given to
//!   that user. When we are not root, it runs as us.
//! * It is ready when its own CLI client (`mariadb`, `psql`) runs `SELECT 1` over
//!   TCP as the `mprov` user; we poll a bounded number of times and never sleep a
//!   fixed time.
//! * Dropping the handle sends SIGTERM to the server, waits a bounded time, then
//!   sends SIGKILL, and removes the folder. [`DbServer::stop`] does the same
//!   and reports errors.
//!
//! Both servers have an admin user `mprov` with password `mprov` that may create
//! databases, so a test can make one database per case from [`DbServer::url`].

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::marker::PhantomData;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::sys::signal::Signal;
use nix::unistd::{User, geteuid};
use tempfile::TempDir;

use crate::process::Process;

/// The admin user that both servers create.
pub const USER: &str = "mprov";
/// The admin user's password. These servers only listen on loopback and only live
/// as long as a test.
pub const PASSWORD: &str = "mprov";

/// How often we pick a new port after a server found its port taken.
const PORT_TRIES: u32 = 5;
/// How often we try to connect while a server starts, and the pause between tries:
/// 600 × 100 ms is one minute, plenty on a loaded 2-core CI machine.
const READY_TRIES: u32 = 600;
const READY_INTERVAL: Duration = Duration::from_millis(100);
/// How long a server may take to stop after SIGTERM before it gets SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one CLI client run may take to connect.
const CONNECT_TIMEOUT_SECS: &str = "2";
/// The system user we create when the Debian package's user is missing.
const FALLBACK_SYSTEM_USER: &str = "mprov-db";
/// The name of each server's log file inside its folder. It gets the server's
/// stdout and stderr.
const LOG_FILE: &str = "server.log";
/// How many lines of a log an error message quotes.
const LOG_TAIL_LINES: usize = 30;

const SETPRIV: &str = "/usr/bin/setpriv";
const MARIADBD: &str = "/usr/sbin/mariadbd";
const MARIADB_INSTALL_DB: &str = "/usr/bin/mariadb-install-db";
const MARIADB_CLIENT: &str = "/usr/bin/mariadb";
const POSTGRESQL_LIB: &str = "/usr/lib/postgresql";

/// A database server of flavour `F` in a temporary folder, stopped when
/// dropped: [`MariaDb`] or [`Postgres`].
#[derive(Debug)]
pub struct DbServer<F: Flavor> {
    server: Server,
    /// The server's CLI client.
    client: PathBuf,
    flavor: PhantomData<F>,
}

/// What tells the two servers apart to the code they share.
pub trait Flavor {
    /// The URL scheme sqlx knows the server by.
    const SCHEME: &'static str;
    /// The database the admin URL names.
    const ADMIN_DB: &'static str;
    /// The signal that stops the server for an outage test.
    const SHUT_DOWN: Signal;
    /// Runs `sql` with the CLI client `client` as the admin user over TCP to
    /// `port`; its output.
    fn query(client: &Path, port: u16, sql: &str) -> Result<String>;
}

/// MariaDB: a clean shut-down (SIGTERM); the `mariadb` client's output is
/// tab-separated rows without column names.
#[derive(Debug)]
pub enum Maria {}

impl Flavor for Maria {
    const SCHEME: &'static str = "mysql";
    const ADMIN_DB: &'static str = "mysql";
    const SHUT_DOWN: Signal = Signal::SIGTERM;
    fn query(client: &Path, port: u16, sql: &str) -> Result<String> {
        let mut cmd = Command::new(client);
        cmd.arg("--no-defaults")
            .args(["--protocol=tcp", "--host=127.0.0.1"])
            .arg(format!("--port={port}"))
            .arg(format!("--user={USER}"))
            .arg(format!("--password={PASSWORD}"))
            .arg(format!("--connect-timeout={CONNECT_TIMEOUT_SECS}"))
            .args(["--batch", "--skip-column-names", "--execute", sql, "mysql"]);
        client_output(cmd, "mariadb")
    }
}

/// PostgreSQL: a fast shut-down (SIGINT: it disconnects its clients, as
/// `pg_ctl restart -m fast` does); `psql`'s output is unaligned rows
/// separated by `|`, without headers.
#[derive(Debug)]
pub enum Pg {}

impl Flavor for Pg {
    const SCHEME: &'static str = "postgres";
    const ADMIN_DB: &'static str = "postgres";
    const SHUT_DOWN: Signal = Signal::SIGINT;
    fn query(client: &Path, port: u16, sql: &str) -> Result<String> {
        let mut cmd = Command::new(client);
        cmd.env("PGPASSWORD", PASSWORD)
            .env("PGCONNECT_TIMEOUT", CONNECT_TIMEOUT_SECS)
            .args([
                "--no-psqlrc",
                "--no-password",
                "--no-align",
                "--tuples-only",
            ])
            .args(["--set", "ON_ERROR_STOP=1"])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--username", USER, "--dbname", "postgres"])
            .args(["--command", sql]);
        client_output(cmd, "psql")
    }
}

/// A MariaDB server in a temporary folder, stopped when dropped.
pub type MariaDb = DbServer<Maria>;

/// A PostgreSQL server in a temporary folder, stopped when dropped.
pub type Postgres = DbServer<Pg>;

impl<F: Flavor> DbServer<F> {
    fn new(server: Server, client: PathBuf) -> Self {
        Self {
            server,
            client,
            flavor: PhantomData,
        }
    }

    /// The admin URL, for sqlx: `mysql://mprov:mprov@127.0.0.1:PORT/mysql` or
    /// `postgres://mprov:mprov@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!(
            "{}://{USER}:{PASSWORD}@127.0.0.1:{}/{}",
            F::SCHEME,
            self.server.port,
            F::ADMIN_DB
        )
    }

    /// The loopback TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// The temporary folder that holds the data, the socket and the log.
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// Runs `sql` with the server's CLI client as the admin user and returns
    /// its output (see [`Maria`] and [`Pg`] for its shape).
    pub fn query(&self, sql: &str) -> Result<String> {
        F::query(&self.client, self.server.port, sql)
    }

    /// Stops the server and removes its folder, reporting what went wrong.
    pub fn stop(self) -> Result<()> {
        self.server.stop()
    }

    /// Stops the server (with [`Flavor::SHUT_DOWN`]) but keeps its folder and
    /// port, for an outage test; [`Self::start_again`] brings it back.
    pub fn shut_down(&mut self) -> Result<()> {
        self.server.shut_down(F::SHUT_DOWN)
    }

    /// Starts the server again on the same data and port, and waits until it
    /// answers.
    pub fn start_again(&mut self) -> Result<()> {
        self.server.start_again()
    }

    /// The server's process id while it runs (for SIGSTOP/SIGCONT).
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }
}

impl DbServer<Maria> {
    /// Initializes a data folder with `mariadb-install-db`, starts `mariadbd` on a
    /// free loopback port and waits until the `mprov` user can run `SELECT 1`.
    pub fn start() -> Result<Self> {
        let mariadbd = require(Path::new(MARIADBD), "mariadb-server")?;
        let install_db = require(Path::new(MARIADB_INSTALL_DB), "mariadb-server")?;
        let client = require(Path::new(MARIADB_CLIENT), "mariadb-client")?;
        let run_as = RunAs::service_user("mysql")?;
        let dir = run_as.temp_dir("mprov-mariadb-")?;
        let root = dir.path().to_path_buf();
        let data = root.join("data");

        let mut install = run_as.command(&install_db);
        // `--no-defaults` must come first. The root account keeps the default
        // unix_socket authentication, so it is reachable only through the socket in
        // our folder, by the OS user root.
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--skip-test-db", "--skip-name-resolve"]);
        run_logged(install, &root, "mariadb-install-db")?;

        // The init file runs before the server accepts connections, so the user
        // exists by the time the readiness check can log in with it.
        let init = root.join("init.sql");
        fs::write(
            &init,
            format!(
                "CREATE USER IF NOT EXISTS '{USER}'@'%' IDENTIFIED BY '{PASSWORD}';\n\
                 GRANT ALL PRIVILEGES ON *.* TO '{USER}'@'%' WITH GRANT OPTION;\n"
            ),
        )
        .with_context(|| format!("writing {}", init.display()))?;
        run_as.give(&init)?;

        let ready_client = client.clone();
        let server = Server::launch(
            "MariaDB",
            dir,
            move |port| {
                let mut cmd = run_as.command(&mariadbd);
                cmd.arg("--no-defaults")
                    .arg(format!("--datadir={}", data.display()))
                    .arg(format!("--socket={}", root.join("mysqld.sock").display()))
                    .arg(format!("--pid-file={}", root.join("mysqld.pid").display()))
                    .arg(format!("--tmpdir={}", root.display()))
                    .arg(format!("--init-file={}", init.display()))
                    .arg(format!("--port={port}"))
                    .args([
                        "--bind-address=127.0.0.1",
                        "--skip-name-resolve",
                        // What Debian's /etc/mysql sets, which --no-defaults skips:
                        // the compiled-in default is latin1.
                        "--character-set-server=utf8mb4",
                        "--collation-server=utf8mb4_general_ci",
                        // A test database need not survive a crash.
                        "--innodb-flush-log-at-trx-commit=0",
                    ]);
                cmd
            },
            move |port| Maria::query(&ready_client, port, "SELECT 1").is_ok(),
        )?;
        Ok(Self::new(server, client))
    }
}

impl DbServer<Pg> {
    /// Initializes a cluster with `initdb`, starts `postgres` on a free loopback
    /// port and waits until the `mprov` user can run `SELECT 1`.
    pub fn start() -> Result<Self> {
        let bin = postgres_bin_dir()?;
        let initdb = require(&bin.join("initdb"), "postgresql")?;
        let postgres = require(&bin.join("postgres"), "postgresql")?;
        let psql = psql_path(&bin)?;
        let run_as = RunAs::service_user("postgres")?;
        let dir = run_as.temp_dir("mprov-postgres-")?;
        let root = dir.path().to_path_buf();
        let data = root.join("data");

        let pwfile = root.join("password");
        fs::write(&pwfile, format!("{PASSWORD}\n"))
            .with_context(|| format!("writing {}", pwfile.display()))?;
        run_as.give(&pwfile)?;

        // The superuser is `mprov`. TCP needs its password; the unix socket in our
        // folder trusts local users.
        let mut cmd = run_as.command(&initdb);
        cmd.arg("--pgdata")
            .arg(&data)
            .args(["--username", USER])
            .arg(format!("--pwfile={}", pwfile.display()))
            .args([
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--no-locale",
                // A test cluster need not survive a crash.
                "--no-sync",
                "--no-instructions",
            ]);
        run_logged(cmd, &root, "initdb")?;

        let ready_psql = psql.clone();
        let server = Server::launch(
            "PostgreSQL",
            dir,
            move |port| {
                let mut cmd = run_as.command(&postgres);
                cmd.arg("-D")
                    .arg(&data)
                    .args(["-p", &port.to_string()])
                    .args(["-h", "127.0.0.1"])
                    .arg("-k")
                    .arg(&root)
                    .args(["-c", "fsync=off"])
                    .args(["-c", "synchronous_commit=off"])
                    .args(["-c", "full_page_writes=off"])
                    // Room for several sqlx pools in parallel tests.
                    .args(["-c", "max_connections=200"]);
                cmd
            },
            move |port| Pg::query(&ready_psql, port, "SELECT 1").is_ok(),
        )?;
        Ok(Self::new(server, psql))
    }
}

/// A server process that we started, and the folder it lives in.
///
/// No `Drop` here: the fields drop in order, so the process stops before the
/// folder is removed.
pub(crate) struct Server {
    name: &'static str,
    port: u16,
    /// `None` while shut down for an outage test.
    process: Option<Process>,
    dir: TempDir,
    /// Builds the server's command for a port, kept for a restart.
    command: Box<dyn Fn(u16) -> Command + Send + Sync>,
    /// Whether it answers on a port.
    ready: Box<dyn Fn(u16) -> bool + Send + Sync>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("process", &self.process)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// How a server's start ended.
enum Startup {
    Exited(ExitStatus),
    Ready,
    TimedOut,
}

impl Server {
    /// Starts the command that `command(port)` builds on a free port, and waits
    /// until `ready(port)` holds. Retries on a new port when the port was taken.
    pub(crate) fn launch(
        name: &'static str,
        dir: TempDir,
        command: impl Fn(u16) -> Command + Send + Sync + 'static,
        ready: impl Fn(u16) -> bool + Send + Sync + 'static,
    ) -> Result<Self> {
        let log_path = dir.path().join(LOG_FILE);
        for attempt in 1..=PORT_TRIES {
            let port = free_port()?;
            // Truncated per attempt: a previous attempt only lost its port.
            let log = File::create(&log_path)
                .with_context(|| format!("creating {}", log_path.display()))?;
            let mut cmd = command(port);
            cmd.current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(log.try_clone().context("duplicating the log file")?)
                .stderr(log);
            let child = cmd
                .spawn()
                .with_context(|| format!("starting {name}: {cmd:?}"))?;
            let mut process = Process::new(name, child, STOP_TIMEOUT);
            // On every early return below, `process` drops before `dir`, so the
            // server stops before its folder goes.
            match wait_ready(&mut process, || ready(port))? {
                Startup::Ready => {
                    return Ok(Self {
                        name,
                        port,
                        process: Some(process),
                        dir,
                        command: Box::new(command),
                        ready: Box::new(ready),
                    });
                }
                Startup::Exited(status) => {
                    let log = log_tail(&log_path);
                    if attempt < PORT_TRIES && log.contains("Address already in use") {
                        continue;
                    }
                    bail!(
                        "{name} exited with {status} before it was ready on port {port}; \
                         the end of its log:\n{log}"
                    );
                }
                Startup::TimedOut => {
                    let log = log_tail(&log_path);
                    let waited = READY_INTERVAL * READY_TRIES;
                    bail!(
                        "{name} was not ready on port {port} after {waited:?}; \
                         the end of its log:\n{log}"
                    );
                }
            }
        }
        bail!("{name}: every port we picked was taken ({PORT_TRIES} tries)")
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The loopback port it listens on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(Process::id)
    }

    /// Stops the process with `signal` (then SIGTERM, SIGKILL after bounded
    /// waits), keeping folder and port.
    fn shut_down(&mut self, signal: nix::sys::signal::Signal) -> Result<()> {
        let mut process = self
            .process
            .take()
            .with_context(|| format!("{} is not running", self.name))?;
        if let Some(pid) = process.id() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
            nix::sys::signal::kill(pid, signal)?;
            for _ in 0..READY_TRIES {
                if let Some(status) = process.try_wait()? {
                    if !status.success() {
                        bail!("{} exited with {status} when stopped", self.name);
                    }
                    // Reaped: nothing left for `stop` to signal.
                    std::mem::forget(process);
                    return Ok(());
                }
                thread::sleep(READY_INTERVAL);
            }
        }
        let status = process.stop()?;
        if !status.success() {
            bail!("{} exited with {status} when stopped", self.name);
        }
        Ok(())
    }

    /// Starts the process again on the same port and waits until it answers.
    fn start_again(&mut self) -> Result<()> {
        if self.process.is_some() {
            bail!("{} is already running", self.name);
        }
        let log_path = self.dir.path().join(LOG_FILE);
        let log = fs::OpenOptions::new()
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let mut cmd = (self.command)(self.port);
        cmd.current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating the log file")?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {} again: {cmd:?}", self.name))?;
        let mut process = Process::new(self.name, child, STOP_TIMEOUT);
        let port = self.port;
        match wait_ready(&mut process, || (self.ready)(port))? {
            Startup::Ready => {
                self.process = Some(process);
                Ok(())
            }
            Startup::Exited(status) => bail!(
                "{} exited with {status} when started again on port {port}; the end of its log:\n{}",
                self.name,
                log_tail(&log_path)
            ),
            Startup::TimedOut => bail!(
                "{} was not ready again on port {port}; the end of its log:\n{}",
                self.name,
                log_tail(&log_path)
            ),
        }
    }

    /// Stops the process, then removes the folder. Tries both even if the first
    /// fails.
    pub(crate) fn stop(self) -> Result<()> {
        let Self { process, dir, .. } = self;
        // SIGTERM is a clean shutdown for both servers, which then exit 0.
        let Some(process) = process else {
            let path = dir.path().to_path_buf();
            return dir
                .close()
                .with_context(|| format!("removing {}", path.display()));
        };
        let stopped = process.stop().and_then(|status| {
            if status.success() {
                Ok(())
            } else {
                Err(anyhow::anyhow!(
                    "the server exited with {status} when stopped"
                ))
            }
        });
        let path = dir.path().to_path_buf();
        let removed = dir
            .close()
            .with_context(|| format!("removing {}", path.display()));
        stopped.and(removed)
    }
}

/// Polls `ready` a bounded number of times while `process` runs.
fn wait_ready(process: &mut Process, ready: impl Fn() -> bool) -> Result<Startup> {
    for _ in 0..READY_TRIES {
        if let Some(status) = process.try_wait()? {
            return Ok(Startup::Exited(status));
        }
        if ready() {
            return Ok(Startup::Ready);
        }
        thread::sleep(READY_INTERVAL);
    }
    Ok(Startup::TimedOut)
}

/// Who runs the server's programs.
#[derive(Debug, Clone)]
pub(crate) struct RunAs {
    /// `None` when we are not root: the programs then run as us.
    user: Option<User>,
}

impl RunAs {
    /// As root, the system user `name`, or a dedicated one when it is missing.
    pub(crate) fn service_user(name: &str) -> Result<Self> {
        if !geteuid().is_root() {
            return Ok(Self { user: None });
        }
        require(Path::new(SETPRIV), "util-linux")?;
        if let Some(user) = lookup_user(name)? {
            return Ok(Self { user: Some(user) });
        }
        if let Some(user) = lookup_user(FALLBACK_SYSTEM_USER)? {
            return Ok(Self { user: Some(user) });
        }
        let status = Command::new("useradd")
            .args(["--system", "--user-group", "--no-create-home"])
            .args(["--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"])
            .arg(FALLBACK_SYSTEM_USER)
            .status()
            .context("running useradd (Debian package passwd)")?;
        // A test running in parallel may have created it first, which useradd
        // reports as a failure, so look again either way.
        match lookup_user(FALLBACK_SYSTEM_USER)? {
            Some(user) => Ok(Self { user: Some(user) }),
            None => bail!(
                "system user {name} is missing and `useradd --system {FALLBACK_SYSTEM_USER}` \
                 failed ({status})"
            ),
        }
    }

    /// A command that runs `program` as this user.
    ///
    /// We use `setpriv`, which execs the program, rather than `runuser`, which
    /// stays as the parent: on SIGTERM `runuser` forwards the signal, then sleeps
    /// two seconds and SIGKILLs the server whether it has finished or not. With
    /// `setpriv` the PID we spawn is the server's, so stopping it is a plain
    /// SIGTERM and wait.
    pub(crate) fn command(&self, program: &Path) -> Command {
        match &self.user {
            None => Command::new(program),
            Some(user) => {
                let mut cmd = Command::new(SETPRIV);
                cmd.arg(format!("--reuid={}", user.uid))
                    .arg(format!("--regid={}", user.gid))
                    .args(["--init-groups", "--reset-env", "--"])
                    .arg(program);
                cmd
            }
        }
    }

    /// A new temporary folder that this user owns.
    pub(crate) fn temp_dir(&self, prefix: &str) -> Result<TempDir> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .context("creating a temporary folder")?;
        self.give(dir.path())?;
        Ok(dir)
    }

    /// Makes `path` owned by this user, so the server can use it.
    pub(crate) fn give(&self, path: &Path) -> Result<()> {
        if let Some(user) = &self.user {
            chown(path, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .with_context(|| format!("giving {} to {}", path.display(), user.name))?;
        }
        Ok(())
    }
}

fn lookup_user(name: &str) -> Result<Option<User>> {
    User::from_name(name).with_context(|| format!("looking up system user {name}"))
}

/// Runs a one-shot setup program with its output in the folder's log, and fails
/// with the log's tail when it fails.
pub(crate) fn run_logged(mut cmd: Command, dir: &Path, what: &str) -> Result<()> {
    let log_path = dir.join(format!("{what}.log"));
    let log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let status = cmd
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("duplicating the log file")?)
        .stderr(log)
        .status()
        .with_context(|| format!("running {what}: {cmd:?}"))?;
    if !status.success() {
        bail!(
            "{what} failed ({status}); the end of its log:\n{}",
            log_tail(&log_path)
        );
    }
    Ok(())
}

fn client_output(mut cmd: Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{what} printed non-UTF-8"))
}

/// Picks a port that is free now by binding port 0 on loopback. The listener is
/// closed on return, just before the caller starts a server on the port.
fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// Returns `path` if it is a file, else an error naming the Debian package.
pub(crate) fn require(path: &Path, package: &str) -> Result<PathBuf> {
    if path.is_file() {
        Ok(path.to_path_buf())
    } else {
        bail!(
            "{} not found: install the Debian package {package} \
             (`apt-get install {package}`; `cargo xtask test` does it)",
            path.display()
        )
    }
}

/// The `bin` folder of the newest PostgreSQL server installed, e.g.
/// `/usr/lib/postgresql/15/bin`.
fn postgres_bin_dir() -> Result<PathBuf> {
    newest_version_bin(Path::new(POSTGRESQL_LIB), &["initdb", "postgres"])?.with_context(|| {
        format!(
            "no {POSTGRESQL_LIB}/<version>/bin/{{initdb,postgres}}: \
             install the Debian package postgresql \
             (`apt-get install postgresql`; `cargo xtask test` does it)"
        )
    })
}

/// `psql` of the server's version, or of the newest client installed.
fn psql_path(server_bin: &Path) -> Result<PathBuf> {
    let same = server_bin.join("psql");
    if same.is_file() {
        return Ok(same);
    }
    let bin = newest_version_bin(Path::new(POSTGRESQL_LIB), &["psql"])?.with_context(|| {
        format!(
            "no {POSTGRESQL_LIB}/<version>/bin/psql: install the Debian package \
             postgresql-client (`apt-get install postgresql-client`; `cargo xtask test` does it)"
        )
    })?;
    Ok(bin.join("psql"))
}

/// Among `<lib>/<major>/bin` folders that hold every program in `programs`, the
/// one with the highest numeric major version.
fn newest_version_bin(lib: &Path, programs: &[&str]) -> Result<Option<PathBuf>> {
    let entries = match fs::read_dir(lib) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err).with_context(|| format!("listing {}", lib.display())),
    };
    let mut best: Option<(u32, PathBuf)> = None;
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", lib.display()))?;
        let Some(version) = entry
            .file_name()
            .to_str()
            .and_then(|v| v.parse::<u32>().ok())
        else {
            continue;
        };
        let bin = entry.path().join("bin");
        if programs.iter().all(|p| bin.join(p).is_file())
            && best.as_ref().is_none_or(|(v, _)| version > *v)
        {
            best = Some((version, bin));
        }
    }
    Ok(best.map(|(_, bin)| bin))
}

/// The last lines of a log file, for error messages. Never fails: a missing log
/// says so.
fn log_tail(path: &Path) -> String {
    const MAX_BYTES: u64 = 16 * 1024;
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(MAX_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(LOG_TAIL_LINES);
            lines[start..].join("\n")
        }
        Err(err) => format!("(cannot read the log: {err})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_version_bin_picks_the_highest_complete_version() -> Result<()> {
        let lib = tempfile::tempdir()?;
        for (version, programs) in [
            ("9", &["initdb", "postgres"][..]),
            ("15", &["initdb", "postgres"]),
            ("17", &["psql"]),
            ("common", &["initdb", "postgres"]),
        ] {
            let bin = lib.path().join(version).join("bin");
            fs::create_dir_all(&bin)?;
            for program in programs {
                File::create(bin.join(program))?;
            }
        }
        let check = |programs: &[&str], expected: Option<&str>| -> Result<()> {
            let found = newest_version_bin(lib.path(), programs)?;
            let expected = expected.map(|v| lib.path().join(v).join("bin"));
            assert_eq!(found, expected, "{programs:?}");
            Ok(())
        };
        check(&["initdb", "postgres"], Some("15"))?;
        check(&["psql"], Some("17"))?;
        check(&["pg_ctl"], None)?;
        assert_eq!(
            newest_version_bin(&lib.path().join("absent"), &["psql"])?,
            None
        );
        Ok(())
    }

    /// A fake server: its first run finds the port taken, its second starts.
    fn flaky_server(_port: u16) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(
            "if [ -e tried ]; then touch started; exec sleep 600; fi; \
             touch tried; echo 'bind: Address already in use' >&2; exit 1",
        );
        cmd
    }

    #[test]
    fn launch_retries_when_the_port_is_taken() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let started = dir.path().join("started");
        let server = Server::launch("flaky", dir, flaky_server, move |_| started.exists())?;
        let folder = server.dir().to_path_buf();
        assert!(folder.join("tried").exists());
        // `sleep` dies of the SIGTERM, which a real server would handle.
        let err = server.stop().expect_err("sleep does not exit 0");
        assert!(format!("{err:#}").contains("signal: 15"), "{err:#}");
        assert!(!folder.exists());
        Ok(())
    }

    #[test]
    fn launch_reports_the_log_of_a_failed_start() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let folder = dir.path().to_path_buf();
        let failing = |_port| {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", "echo 'no such table: mysql.user' >&2; exit 3"]);
            cmd
        };
        let err = Server::launch("broken", dir, failing, |_| false).expect_err("it exits");
        let message = format!("{err:#}");
        assert!(
            message.contains("broken exited with exit status: 3"),
            "{message}"
        );
        assert!(message.contains("no such table: mysql.user"), "{message}");
        assert!(!folder.exists(), "the folder of a failed start is removed");
        Ok(())
    }

    #[test]
    fn require_names_the_package() {
        let err = require(Path::new("/nonexistent/mariadbd"), "mariadb-server")
            .expect_err("a missing binary is an error");
        let message = format!("{err:#}");
        assert!(message.contains("/nonexistent/mariadbd"), "{message}");
        assert!(
            message.contains("apt-get install mariadb-server"),
            "{message}"
        );
    }

    #[test]
    fn log_tail_keeps_the_last_lines() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("log");
        let text: Vec<String> = (0..100).map(|i| format!("line {i}")).collect();
        fs::write(&path, text.join("\n"))?;
        let tail = log_tail(&path);
        assert_eq!(tail.lines().count(), LOG_TAIL_LINES);
        assert_eq!(tail.lines().last(), Some("line 99"));
        assert!(log_tail(&dir.path().join("absent")).starts_with("(cannot read the log"));
        Ok(())
    }
}
