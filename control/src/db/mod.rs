//! The inventory database: one schema on SQLite, MariaDB or PostgreSQL.
//!
//! We use sqlx's `Any` driver so one binary serves all three engines chosen at
//! run time. The statements are generated from the static descriptors in
//! [`kinds`], so the only dialect differences we meet are the placeholder syntax
//! (`?` or `$n`) and how an insert returns its id; [`Sql`] handles both, which is
//! less machinery than a query-builder crate for the handful of statement shapes
//! we generate. Identifiers come only from the descriptors, never from requests;
//! every value is bound.
//!
//! Migrations live in `migrations/<engine>/` and run at every start.

pub mod crud;
pub mod health;
pub mod kinds;

use sqlx::any::{AnyPoolOptions, AnyRow, AnyTypeInfoKind};
use sqlx::{AnyPool, Row, ValueRef};

pub use crate::config::Engine;

/// How many values one statement binds at most. SQLite builds may cap a statement
/// at 999 variables, PostgreSQL and MariaDB at 65,535; we stay under the
/// smallest, so a group of any size is written in chunks.
pub const MAX_BINDS: usize = 900;

/// A bound value, typed so a `NULL` reaches PostgreSQL with its column's type.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    /// A boolean or NULL.
    Bool(Option<bool>),
    /// A double or NULL.
    Float(Option<f64>),
    /// An integer or NULL.
    Int(Option<i64>),
    /// Text or NULL.
    Text(Option<String>),
}

/// A statement being built: trusted text and bound values, rendered with the
/// engine's placeholders when it runs, so statements can be joined.
#[derive(Debug, Clone)]
pub struct Sql {
    engine: Engine,
    parts: Vec<Part>,
    args: Vec<Val>,
}

/// A piece of a statement.
#[derive(Debug, Clone)]
enum Part {
    /// Trusted SQL text.
    Text(String),
    /// The next bound value's placeholder.
    Arg,
}

impl Sql {
    /// An empty statement for `engine`.
    pub fn new(engine: Engine) -> Sql {
        Sql {
            engine,
            parts: Vec::new(),
            args: Vec::new(),
        }
    }

    /// Appends SQL text. Only trusted text (from descriptors) goes here.
    pub fn push(&mut self, text: &str) -> &mut Self {
        match self.parts.last_mut() {
            Some(Part::Text(t)) => t.push_str(text),
            _ => self.parts.push(Part::Text(text.to_owned())),
        }
        self
    }

    /// Appends a placeholder bound to `val`.
    pub fn bind(&mut self, val: Val) -> &mut Self {
        self.args.push(val);
        self.parts.push(Part::Arg);
        self
    }

    /// Appends `(?, ?, ...)` bound to `vals`.
    pub fn bind_list(&mut self, vals: impl IntoIterator<Item = Val>) -> &mut Self {
        self.push("(");
        for (i, v) in vals.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            self.bind(v);
        }
        self.push(")")
    }

    /// Appends another statement's text and values (a shared WHERE clause).
    pub fn append(&mut self, tail: &Sql) -> &mut Self {
        for part in &tail.parts {
            match part {
                Part::Text(t) => {
                    self.push(t);
                }
                Part::Arg => self.parts.push(Part::Arg),
            }
        }
        self.args.extend(tail.args.iter().cloned());
        self
    }

    /// `INSERT INTO <table> (<key>, <cols>) VALUES (...)`, or when a row
    /// with that `key` exists, an update of its `cols` instead: `ON
    /// CONFLICT (<key>) DO UPDATE` on SQLite and PostgreSQL, `ON DUPLICATE
    /// KEY UPDATE` on MariaDB. Table and column names are trusted text.
    pub fn upsert(engine: Engine, table: &str, key: (&str, Val), cols: Vec<(&str, Val)>) -> Sql {
        let mut sql = Sql::new(engine);
        let names: Vec<&str> = std::iter::once(key.0)
            .chain(cols.iter().map(|(c, _)| *c))
            .collect();
        sql.push(&format!(
            "INSERT INTO {table} ({}) VALUES ",
            names.join(", ")
        ))
        .bind_list(std::iter::once(key.1).chain(cols.iter().map(|(_, v)| v.clone())));
        let set: Vec<String> = cols
            .iter()
            .map(|(c, _)| match engine {
                Engine::Mysql => format!("{c} = VALUES({c})"),
                Engine::Postgres | Engine::Sqlite => format!("{c} = excluded.{c}"),
            })
            .collect();
        match engine {
            Engine::Mysql => sql.push(" ON DUPLICATE KEY UPDATE "),
            Engine::Postgres | Engine::Sqlite => {
                sql.push(&format!(" ON CONFLICT ({}) DO UPDATE SET ", key.0))
            }
        };
        sql.push(&set.join(", "));
        sql
    }

    /// The statement's text, with the engine's placeholders.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let mut n = 0;
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Arg => {
                    n += 1;
                    match self.engine {
                        Engine::Postgres => {
                            out.push('$');
                            out.push_str(&n.to_string());
                        }
                        Engine::Mysql | Engine::Sqlite => out.push('?'),
                    }
                }
            }
        }
        out
    }

    /// The sqlx query, with every value bound.
    pub fn query(&self) -> sqlx::query::Query<'static, sqlx::Any, sqlx::any::AnyArguments> {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(self.text()));
        for a in &self.args {
            q = match a {
                Val::Bool(v) => q.bind(*v),
                Val::Float(v) => q.bind(*v),
                Val::Int(v) => q.bind(*v),
                Val::Text(v) => q.bind(v.clone()),
            };
        }
        q
    }
}

/// Failure to open or migrate the database.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The URL's scheme is none of sqlite, mysql, postgres.
    #[error("unsupported database URL scheme in {url:?}: use sqlite:, mysql: or postgres:")]
    Scheme {
        /// The URL, with any password removed.
        url: String,
    },
    /// The server could not be reached or refused us.
    #[error("cannot connect to the {engine} database at {url}")]
    Connect {
        /// The engine.
        engine: Engine,
        /// The URL, with any password removed.
        url: String,
        /// What went wrong.
        #[source]
        err: sqlx::Error,
    },
    /// A migration failed.
    #[error("database migration failed on {engine}")]
    Migrate {
        /// The engine.
        engine: Engine,
        /// What went wrong.
        #[source]
        err: sqlx::migrate::MigrateError,
    },
}

/// The database: a pool and the engine behind it.
#[derive(Debug, Clone)]
pub struct Db {
    pool: AnyPool,
    engine: Engine,
    health: std::sync::Arc<health::Health>,
    /// The statements run through [`Db::fetch_all`] and
    /// [`Db::fetch_optional`], shared by every clone.
    statements: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// How long a request waits for a pooled connection to MariaDB or
/// PostgreSQL before it is answered 503 (sqlx's default is 30 s, which looks
/// like a hang to a client).
pub const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// What every SQLite connection is set to when it opens. WAL lets readers
/// run beside the writer; NORMAL syncing is durable across process crashes,
/// which is what WAL promises.
const SQLITE_PRAGMAS: [&str; 4] = [
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
    "PRAGMA busy_timeout = 10000",
];

/// A URL with its password replaced, for logs and errors.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            // set_password only fails on URLs that cannot have one.
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// The file of an SQLite URL (`sqlite://PATH?...` or `sqlite:PATH`), if it
/// names one (not `:memory:`).
pub fn sqlite_path(url: &str) -> Option<std::path::PathBuf> {
    let rest = url.strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path = rest.split('?').next()?;
    (!path.is_empty() && !path.starts_with(":memory:")).then(|| path.into())
}

impl Db {
    /// Connects to `url` (no migrations).
    pub async fn connect(url: &str) -> Result<Db, OpenError> {
        sqlx::any::install_default_drivers();
        let engine = Engine::from_url(url).ok_or_else(|| OpenError::Scheme {
            url: redact_url(url),
        })?;
        let mut opts = AnyPoolOptions::new().max_connections(match engine {
            // SQLite has one writer; a few readers are plenty.
            Engine::Sqlite => 4,
            Engine::Mysql | Engine::Postgres => 16,
        });
        if engine != Engine::Sqlite {
            opts = opts.acquire_timeout(ACQUIRE_TIMEOUT);
        }
        if engine == Engine::Sqlite {
            opts = opts.after_connect(|conn, _meta| {
                Box::pin(async move {
                    for pragma in SQLITE_PRAGMAS {
                        sqlx::query(pragma).execute(&mut *conn).await?;
                    }
                    Ok(())
                })
            });
        }
        let pool = opts.connect(url).await.map_err(|err| OpenError::Connect {
            engine,
            url: redact_url(url),
            err,
        })?;
        Ok(Db {
            pool,
            engine,
            health: std::sync::Arc::new(health::Health::new(url)),
            statements: std::sync::Arc::default(),
        })
    }

    /// Connects to `url` and runs every pending migration.
    pub async fn open(url: &str) -> Result<Db, OpenError> {
        let db = Db::connect(url).await?;
        db.migrate().await?;
        Ok(db)
    }

    /// Runs every pending migration for this engine.
    pub async fn migrate(&self) -> Result<(), OpenError> {
        migrator(self.engine)
            .run(&self.pool)
            .await
            .map_err(|err| OpenError::Migrate {
                engine: self.engine,
                err,
            })
    }

    /// Closes every connection of the pool and waits until they are closed.
    ///
    /// On SQLite this must come before the process opens and closes any of
    /// the database's files itself (to change their owner or mode, or to see
    /// whether it can open them): closing any descriptor of a file drops every
    /// POSIX lock the process holds on it, including those of the pool's
    /// connections, which go on believing they hold them. Another process
    /// (the `sqlite3` shell, a backup, a test) closing its own connection then
    /// thinks it is the last one, checkpoints and deletes the WAL under this
    /// process's feet: later reads fail with disk I/O errors or miss rows this
    /// process wrote.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// The engine.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Whether the database answers (see [`health`]).
    pub fn health(&self) -> &std::sync::Arc<health::Health> {
        &self.health
    }

    /// The pool.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// A new statement for this engine.
    pub fn sql(&self) -> Sql {
        Sql::new(self.engine)
    }

    /// Runs `sql` on the pool; every row. Counted (see [`Db::statements`]).
    pub async fn fetch_all(&self, sql: &Sql) -> Result<Vec<AnyRow>, sqlx::Error> {
        self.count();
        sql.query().fetch_all(&self.pool).await
    }

    /// Runs `sql` on the pool; its first row, if any. Counted (see
    /// [`Db::statements`]).
    pub async fn fetch_optional(&self, sql: &Sql) -> Result<Option<AnyRow>, sqlx::Error> {
        self.count();
        sql.query().fetch_optional(&self.pool).await
    }

    fn count(&self) {
        self.statements
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many statements [`Db::fetch_all`] and [`Db::fetch_optional`] have
    /// run, on this pool and its clones. Readers that promise a fixed number
    /// of statements (the node view) run every statement through them, so a
    /// test can hold them to it.
    pub fn statements(&self) -> u64 {
        self.statements.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The current inventory revision.
    pub async fn revision(&self) -> Result<i64, sqlx::Error> {
        let row = sqlx::query("SELECT revision FROM inventory_revision WHERE id = 1")
            .fetch_one(&self.pool)
            .await?;
        int(&row, "revision")
    }

    /// The row `select`, a statement that ends in `WHERE <column> = `,
    /// finds for the text `key`, if any.
    pub async fn row_where(&self, select: &str, key: &str) -> Result<Option<AnyRow>, sqlx::Error> {
        let mut sql = self.sql();
        sql.push(select).bind(Val::Text(Some(key.to_owned())));
        sql.query().fetch_optional(&self.pool).await
    }

    /// A setting's value.
    pub async fn setting(&self, name: &str) -> Result<Option<String>, sqlx::Error> {
        let row = self
            .row_where("SELECT value FROM settings WHERE name = ", name)
            .await?;
        row.map(|r| r.try_get::<String, _>("value")).transpose()
    }

    /// Sets a setting.
    pub async fn set_setting(&self, name: &str, value: &str) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let mut del = self.sql();
        del.push("DELETE FROM settings WHERE name = ")
            .bind(Val::Text(Some(name.into())));
        del.query().execute(&mut *tx).await?;
        let mut ins = self.sql();
        ins.push("INSERT INTO settings (name, value) VALUES ")
            .bind_list([Val::Text(Some(name.into())), Val::Text(Some(value.into()))]);
        ins.query().execute(&mut *tx).await?;
        tx.commit().await
    }

    /// Mints a one-time nonce into `table` (`enroll_nonces`,
    /// `discovery_nonces`: columns `owner_column`, `hash`, `created_at`,
    /// `expires_at`, `used_at`) for `owner`, good for `ttl`; only its hash
    /// is kept. In the same transaction it cancels the owner's earlier
    /// unused nonces (only the newest boot may use one) and deletes every
    /// expired row. Both names are the callers' constants, never input.
    pub async fn mint_nonce<E>(
        &self,
        table: &'static str,
        owner_column: &'static str,
        owner: Val,
        ttl: std::time::Duration,
    ) -> Result<String, E>
    where
        E: From<sqlx::Error> + From<jiff::Error>,
    {
        let nonce = crate::secrets::random_token(24);
        let expires = jiff::Timestamp::now()
            .checked_add(jiff::SignedDuration::try_from(ttl).unwrap_or_default())
            .map(crate::time::format_ts)?;
        let now = crate::time::now();
        let mut tx = self.pool.begin().await?;
        let mut gone = self.sql();
        gone.push(&format!("DELETE FROM {table} WHERE expires_at <= "))
            .bind(Val::Text(Some(now.clone())))
            .push(&format!(" OR ({owner_column} = "))
            .bind(owner.clone())
            .push(" AND used_at IS NULL)");
        gone.query().execute(&mut *tx).await?;
        let mut sql = self.sql();
        sql.push(&format!(
            "INSERT INTO {table} ({owner_column}, hash, created_at, expires_at) VALUES "
        ))
        .bind_list([
            owner,
            Val::Text(Some(crate::secrets::hash_api_secret(&nonce))),
            Val::Text(Some(now)),
            Val::Text(Some(expires)),
        ]);
        sql.query().execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(nonce)
    }
}

/// The migrations of `engine`, built into the binary.
pub fn migrator(engine: Engine) -> sqlx::migrate::Migrator {
    match engine {
        Engine::Mysql => sqlx::migrate!("migrations/mysql"),
        Engine::Postgres => sqlx::migrate!("migrations/postgres"),
        Engine::Sqlite => sqlx::migrate!("migrations/sqlite"),
    }
}

/// The tables `engine`'s migrations create, read from their statements (so
/// a restore drops only our own tables from a shared database).
pub fn known_tables(engine: Engine) -> std::collections::BTreeSet<String> {
    let mut tables = std::collections::BTreeSet::new();
    for m in migrator(engine).iter() {
        let sql = m.sql.as_str();
        let mut rest = sql;
        while let Some(at) = rest.find("CREATE TABLE ") {
            rest = &rest[at + "CREATE TABLE ".len()..];
            let name: String = rest
                .trim_start_matches("IF NOT EXISTS ")
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                tables.insert(name);
            }
        }
    }
    tables
}

/// Reads an integer column whatever width the engine gave it.
pub fn int(row: &AnyRow, col: &str) -> Result<i64, sqlx::Error> {
    opt_int(row, col)?.ok_or_else(|| sqlx::Error::ColumnDecode {
        index: col.to_owned(),
        source: "unexpected NULL".into(),
    })
}

/// The kind of value a column holds in this row, without decoding it.
fn kind_of(row: &AnyRow, col: &str) -> Result<AnyTypeInfoKind, sqlx::Error> {
    let raw = row.try_get_raw(col)?;
    Ok(if raw.is_null() {
        AnyTypeInfoKind::Null
    } else {
        raw.type_info().kind()
    })
}

/// Reads a nullable integer column whatever width the engine gave it.
/// (Dispatching on the value's kind avoids building an error per failed
/// decode, which would show on every row of a large list.)
pub fn opt_int(row: &AnyRow, col: &str) -> Result<Option<i64>, sqlx::Error> {
    match kind_of(row, col)? {
        AnyTypeInfoKind::Null => Ok(None),
        AnyTypeInfoKind::SmallInt => row.try_get::<i16, _>(col).map(|v| Some(i64::from(v))),
        AnyTypeInfoKind::Integer => row.try_get::<i32, _>(col).map(|v| Some(i64::from(v))),
        AnyTypeInfoKind::Bool => row.try_get::<bool, _>(col).map(|v| Some(i64::from(v))),
        _ => row.try_get::<i64, _>(col).map(Some),
    }
}

/// Reads a nullable boolean column, which SQLite and MariaDB keep as integers.
pub fn opt_bool(row: &AnyRow, col: &str) -> Result<Option<bool>, sqlx::Error> {
    match kind_of(row, col)? {
        AnyTypeInfoKind::Null => Ok(None),
        AnyTypeInfoKind::Bool => row.try_get::<bool, _>(col).map(Some),
        _ => opt_int(row, col).map(|v| v.map(|i| i != 0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_follow_the_engine() {
        for (engine, want) in [
            (Engine::Sqlite, "a = ? AND b IN (?, ?)"),
            (Engine::Mysql, "a = ? AND b IN (?, ?)"),
            (Engine::Postgres, "a = $1 AND b IN ($2, $3)"),
        ] {
            let mut s = Sql::new(engine);
            s.push("a = ").bind(Val::Int(Some(1))).push(" AND b IN ");
            s.bind_list([Val::Int(Some(2)), Val::Int(None)]);
            assert_eq!(s.text(), want);
            // Joined statements keep numbering in order.
            let mut joined = Sql::new(engine);
            joined
                .push("SELECT ")
                .bind(Val::Int(Some(0)))
                .push(", ")
                .append(&s);
            let shifted = if engine == Engine::Postgres {
                "SELECT $1, a = $2 AND b IN ($3, $4)"
            } else {
                "SELECT ?, a = ? AND b IN (?, ?)"
            };
            assert_eq!(joined.text(), shifted);
        }
    }

    #[test]
    fn upserts_follow_the_engine() {
        let sql = |engine| {
            Sql::upsert(
                engine,
                "t",
                ("k", Val::Int(Some(1))),
                vec![("a", Val::Text(None)), ("b", Val::Int(Some(2)))],
            )
            .text()
        };
        assert_eq!(
            sql(Engine::Sqlite),
            "INSERT INTO t (k, a, b) VALUES (?, ?, ?) ON CONFLICT (k) DO UPDATE SET a = excluded.a, b = excluded.b"
        );
        assert_eq!(
            sql(Engine::Postgres),
            "INSERT INTO t (k, a, b) VALUES ($1, $2, $3) ON CONFLICT (k) DO UPDATE SET a = excluded.a, b = excluded.b"
        );
        assert_eq!(
            sql(Engine::Mysql),
            "INSERT INTO t (k, a, b) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE a = VALUES(a), b = VALUES(b)"
        );
    }

    #[test]
    fn engine_names() {
        assert_eq!("django.db.backends.mysql".parse(), Ok(Engine::Mysql));
        assert_eq!("postgresql".parse(), Ok(Engine::Postgres));
        assert_eq!("".parse::<Engine>(), Err(()));
        assert_eq!(
            Engine::from_url("postgres://u@h/db"),
            Some(Engine::Postgres)
        );
        assert_eq!(Engine::from_url("sqlite:///x.db"), Some(Engine::Sqlite));
        assert_eq!(
            sqlite_path("sqlite:///s/mprov.sqlite3?mode=rwc"),
            Some("/s/mprov.sqlite3".into())
        );
        assert_eq!(sqlite_path("sqlite:rel.db"), Some("rel.db".into()));
        assert_eq!(sqlite_path("sqlite::memory:"), None);
        assert_eq!(sqlite_path("postgres://h/db"), None);
        assert_eq!(Engine::from_url("oracle://x"), None);
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("mysql://u:secret@h:3306/db"),
            "mysql://u:***@h:3306/db"
        );
        assert_eq!(
            redact_url("sqlite:///var/lib/x.db"),
            "sqlite:///var/lib/x.db"
        );
    }
}
