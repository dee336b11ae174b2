//! The test context: a fresh database on a real engine, the router in process,
//! and an admin API key.
//!
//! SQLite runs in a temporary folder. MariaDB and PostgreSQL are real servers
//! that `cargo xtask test` starts on loopback and names in `MPROV_TEST_MYSQL_URL`
//! and `MPROV_TEST_PG_URL`; each test makes its own database on them. A missing
//! server is a failure, never a skip.

use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use mprov_control::config::{Config, Settings};
use mprov_control::db::{Db, Engine, Sql, Val};
use mprov_control::http::{self, AppState};
use mprov_control::secrets::{self, SecretBox};
use serde_json::Value;
use tower::ServiceExt;

pub(crate) const VERSION: &str = "mProv-Version";

/// openssl's arguments for a new P-256 key (`req -newkey ...`).
pub(crate) const P256: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];

/// curl's arguments that print only the answer's status code.
pub(crate) const STATUS_ONLY: [&str; 5] = ["-sS", "-o", "/dev/null", "-w", "%{http_code}"];

/// The environment variable naming a running server for `engine`.
pub(crate) fn server_env(engine: Engine) -> Option<&'static str> {
    match engine {
        Engine::Sqlite => None,
        Engine::Mysql => Some("MPROV_TEST_MYSQL_URL"),
        Engine::Postgres => Some("MPROV_TEST_PG_URL"),
    }
}

/// A database of its own for one test.
pub(crate) struct TestDb {
    pub(crate) url: String,
    pub(crate) engine: Engine,
    _dir: tempfile::TempDir,
    admin: Option<(String, String)>,
}

impl TestDb {
    pub(crate) async fn new(engine: Engine) -> TestDb {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some(var) = server_env(engine) else {
            let url = format!(
                "sqlite://{}?mode=rwc",
                dir.path().join("t.sqlite3").display()
            );
            return TestDb {
                url,
                engine,
                _dir: dir,
                admin: None,
            };
        };
        let admin = std::env::var(var).unwrap_or_else(|_| {
            panic!("{var} is not set: run the tests with `cargo xtask test`, which starts MariaDB and PostgreSQL")
        });
        let name = format!("t_{}", hex::encode(secrets::random_bytes::<6>()));
        let db = Db::connect(&admin)
            .await
            .expect("connect to the test server");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(db.pool())
            .await
            .expect("create database");
        db.pool().close().await;
        let mut url = url::Url::parse(&admin).expect("admin url");
        url.set_path(&format!("/{name}"));
        TestDb {
            url: url.to_string(),
            engine,
            _dir: dir,
            admin: Some((admin, name)),
        }
    }

    /// Drops the test's database.
    pub(crate) async fn cleanup(self) {
        if let Some((admin, name)) = &self.admin {
            let db = Db::connect(admin)
                .await
                .expect("connect to the test server");
            let force = if self.engine == Engine::Postgres {
                " WITH (FORCE)"
            } else {
                ""
            };
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name}{force}")))
                .execute(db.pool())
                .await
                .expect("drop database");
            db.pool().close().await;
        }
    }
}

/// The start of an insert of bare systems ([`bind_bare_system`]), for tests
/// that need many quickly.
pub(crate) const INSERT_BARE_SYSTEMS: &str = "INSERT INTO systems (hostname, install_kernel_cmdline, initial_mods, tmpfs_root_size, prov_interface, config_params, stateful, netboot, created_at, updated_at) VALUES ";

/// Binds the values of one bare system `hostname` after [`INSERT_BARE_SYSTEMS`]:
/// empty fields, stateless, netbooting.
pub(crate) fn bind_bare_system(sql: &mut Sql, hostname: String) {
    let t = Val::Text(Some(String::new()));
    sql.bind_list([
        Val::Text(Some(hostname)),
        t.clone(),
        t.clone(),
        Val::Int(Some(0)),
        t.clone(),
        t.clone(),
        Val::Bool(Some(false)),
        Val::Bool(Some(true)),
        Val::Text(Some("2026-01-01T00:00:00Z".into())),
        Val::Text(Some("2026-01-01T00:00:00Z".into())),
    ]);
}

/// Runs `check` off the async runtime (it starts processes and waits on
/// them) with a fresh folder and a fresh database on `engine` (its URL);
/// what `check` returns.
pub(crate) async fn on_engine<T: Send + 'static>(
    engine: Engine,
    check: impl FnOnce(&Path, &str) -> T + Send + 'static,
) -> T {
    let db = TestDb::new(engine).await;
    let url = db.url.clone();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let out = tokio::task::spawn_blocking(move || check(&d, &url))
        .await
        .unwrap();
    db.cleanup().await;
    out
}

/// [`on_engine`] on SQLite.
pub(crate) async fn on_sqlite(check: fn(&Path, &str)) {
    on_engine(Engine::Sqlite, check).await;
}

/// Parses settings as the command line would, with `args` added.
pub(crate) fn config(db_url: &str, args: &[&str]) -> Config {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        s: Settings,
    }
    let mut argv = vec![
        "mprov-control",
        "--database-url",
        db_url,
        "--hostname",
        "mpcc",
    ];
    argv.extend_from_slice(args);
    Config::from_settings(Cli::try_parse_from(argv).expect("settings").s).expect("config")
}

/// The service's state over `db` with `cfg`, sealing secrets with the
/// tests' secret key.
pub(crate) fn inner(db: Db, cfg: Arc<Config>) -> http::Inner {
    http::Inner::new(db, cfg, SecretBox::new("test secret key"))
}

pub(crate) struct Ctx {
    pub(crate) app: Router,
    pub(crate) state: AppState,
    pub(crate) key: String,
    pub(crate) db: TestDb,
}

impl Ctx {
    pub(crate) async fn new(engine: Engine) -> Ctx {
        Ctx::with_args(engine, &[]).await
    }

    pub(crate) async fn with_args(engine: Engine, args: &[&str]) -> Ctx {
        let tdb = TestDb::new(engine).await;
        let cfg = config(&tdb.url, args);
        let db = Db::open(&tdb.url).await.expect("open database");
        assert_eq!(db.engine(), engine);
        let key = secrets::new_api_key();
        let mut sql = db.sql();
        sql.push(
            "INSERT INTO api_keys (name, prefix, hash, revoked, created_at, updated_at) VALUES ",
        );
        let now = Val::Text(Some("2026-01-01T00:00:00Z".into()));
        sql.bind_list([
            Val::Text(Some("test admin".into())),
            Val::Text(Some(key.prefix.clone())),
            Val::Text(Some(key.hash.clone())),
            Val::Bool(Some(false)),
            now.clone(),
            now,
        ]);
        sql.query().execute(db.pool()).await.expect("insert key");
        Ctx::serving(inner(db, Arc::new(cfg)), key.key, tdb)
    }

    /// A context serving `inner` to the admin with API key `key`, on `db`.
    pub(crate) fn serving(inner: http::Inner, key: String, db: TestDb) -> Ctx {
        let state = Arc::new(inner);
        Ctx {
            app: http::router(state.clone()),
            state,
            key,
            db,
        }
    }

    /// A context over an existing database (a restored one) that already
    /// holds the admin API key `key`.
    pub(crate) async fn on(tdb: TestDb, key: String) -> Ctx {
        let cfg = config(&tdb.url, &[]);
        let db = Db::open(&tdb.url).await.expect("open database");
        Ctx::serving(inner(db, Arc::new(cfg)), key, tdb)
    }

    pub(crate) async fn cleanup(self) {
        self.state.db.pool().close().await;
        self.db.cleanup().await;
    }

    /// A request as the admin, with the right version header.
    pub(crate) async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, format!("Api-Key {}", self.key))
            .header(VERSION, mprov_api::api_version());
        let body = match body {
            Some(v) => {
                req = req.header(header::CONTENT_TYPE, "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        self.send(req.body(body).expect("request")).await
    }

    /// Sends any request; the status and the JSON body (Null when empty).
    pub(crate) async fn send(&self, req: Request<Body>) -> (StatusCode, Value) {
        let (status, _, body) = self.send_full(req).await;
        (status, body)
    }

    pub(crate) async fn send_full(
        &self,
        req: Request<Body>,
    ) -> (StatusCode, axum::http::HeaderMap, Value) {
        let resp = self.app.clone().oneshot(req).await.expect("infallible");
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!(
                    "{status}: body is not JSON ({e}): {}",
                    String::from_utf8_lossy(&bytes)
                )
            })
        };
        assert!(!status.is_server_error(), "server error {status}: {body}");
        if status.is_client_error() {
            // Every error has the documented shape and says something.
            let msg = body["message"].as_str().unwrap_or_default();
            assert!(
                body["error"].is_string() && msg.len() > 5,
                "bad error body: {body}"
            );
        }
        (status, headers, body)
    }

    pub(crate) async fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, v) = self.call(method, path, body).await;
        assert!(status.is_success(), "{method} {path}: {status} {v}");
        v
    }

    /// Creates one object of `kind` as the admin; the created object.
    pub(crate) async fn post(&self, kind: &str, body: Value) -> Value {
        self.ok("POST", &format!("/api/v1/{kind}/"), Some(body))
            .await
    }

    /// Changes the object at `path` as the admin; the changed object.
    pub(crate) async fn patch(&self, path: &str, body: Value) -> Value {
        self.ok("PATCH", path, Some(body)).await
    }

    pub(crate) async fn revision(&self) -> i64 {
        self.ok("GET", "/api/v1/revision", None).await["revision"]
            .as_i64()
            .expect("revision")
    }
}

/// Generates one test per engine for each named async fn taking an `Engine`.
#[macro_export]
macro_rules! engine_tests {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(mprov_control::db::Engine::Sqlite).await } )*
        }
        mod mysql {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(mprov_control::db::Engine::Mysql).await } )*
        }
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(mprov_control::db::Engine::Postgres).await } )*
        }
    };
}
