//! `cargo xtask databases`: the MariaDB and PostgreSQL servers that
//! `cargo xtask test` starts, kept up for a developer's own `cargo test` runs.
//!
//! The control service's API tests run on all three engines and need two
//! servers named in `MPROV_TEST_MYSQL_URL` and `MPROV_TEST_PG_URL`. This
//! starts them the same way the test command does (each in its own temporary
//! folder, on a free loopback port), prints the two `export` lines (and writes
//! them to `--env-file` for `source`), and stops both on Ctrl-C or SIGTERM.
//! Each test makes its own database on them, so several test runs may share
//! one pair.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use super::{MYSQL_URL_VAR, PG_URL_VAR, step};
use crate::db::{MariaDb, Postgres};

/// Options of `cargo xtask databases`.
#[derive(Debug, Clone, Default)]
pub struct DatabasesOptions {
    /// Also write the `export` lines to this file (removed again on exit).
    pub env_file: Option<PathBuf>,
}

/// Starts both servers, says how to use them, and waits for a signal.
pub fn databases(options: &DatabasesOptions) -> Result<()> {
    // Caught before the servers start, so a Ctrl-C always reaches the
    // destructors that stop them.
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("catching signals")?;
    step("databases: start MariaDB and PostgreSQL");
    let mariadb = MariaDb::start().context("starting MariaDB")?;
    let postgres = Postgres::start().context("starting PostgreSQL")?;
    let exports = format!(
        "export {MYSQL_URL_VAR}={}\nexport {PG_URL_VAR}={}\n",
        mariadb.url(),
        postgres.url()
    );
    print!("{exports}");
    if let Some(file) = &options.env_file {
        fs::write(file, &exports).with_context(|| format!("writing {}", file.display()))?;
        eprintln!(
            "written to {}: `source` it in another shell",
            file.display()
        );
    }
    eprintln!("MariaDB and PostgreSQL are up until Ctrl-C");
    signals.forever().next();
    step("stop databases");
    if let Some(file) = &options.env_file {
        let _ = fs::remove_file(file);
    }
    let stopped_mariadb = mariadb.stop().context("stopping MariaDB");
    let stopped_postgres = postgres.stop().context("stopping PostgreSQL");
    stopped_mariadb.and(stopped_postgres)
}
