//! The lab's own tests: its database servers start, answer through the CLI
//! clients and through sqlx with the URLs they give, and leave nothing behind.
//!
//! The one integration-test binary of this crate (STYLE.md point 24).

use std::future::Future;

use anyhow::{Context, Result};
use mprov_tests::db::{MariaDb, Postgres};

/// Runs `future` to completion on a fresh current-thread runtime.
fn block_on<T>(future: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building a tokio runtime")?
        .block_on(future)
}

#[test]
fn mariadb_starts_answers_and_cleans_up() -> Result<()> {
    let db = MariaDb::start()?;
    let dir = db.dir().to_path_buf();
    assert!(dir.join("data").is_dir(), "{}", dir.display());
    assert_eq!(
        db.url(),
        format!("mysql://mprov:mprov@127.0.0.1:{}/mysql", db.port())
    );

    assert_eq!(db.query("SELECT 1")?, "1\n");
    // The admin user may create databases, as each test case will.
    db.query("CREATE DATABASE lab_cli; DROP DATABASE lab_cli")?;
    // MariaDB speaks utf8mb4 as Debian configures it, although we skip /etc/mysql.
    assert_eq!(db.query("SELECT @@character_set_server")?, "utf8mb4\n");

    let url = db.url();
    block_on(async move {
        let pool = sqlx::MySqlPool::connect(&url).await?;
        let one: i64 = sqlx::query_scalar("SELECT 1").fetch_one(&pool).await?;
        assert_eq!(one, 1);
        sqlx::query("CREATE DATABASE lab_sqlx")
            .execute(&pool)
            .await?;
        sqlx::query("DROP DATABASE lab_sqlx").execute(&pool).await?;
        pool.close().await;
        Ok(())
    })?;

    drop(db);
    assert!(!dir.exists(), "{} is still there", dir.display());
    Ok(())
}

#[test]
fn postgres_starts_answers_and_cleans_up() -> Result<()> {
    let db = Postgres::start()?;
    let dir = db.dir().to_path_buf();
    assert!(dir.join("data").is_dir(), "{}", dir.display());
    assert_eq!(
        db.url(),
        format!("postgres://mprov:mprov@127.0.0.1:{}/postgres", db.port())
    );

    assert_eq!(db.query("SELECT 1")?, "1\n");
    db.query("CREATE DATABASE lab_cli")?;
    db.query("DROP DATABASE lab_cli")?;
    assert_eq!(db.query("SHOW server_encoding")?, "UTF8\n");

    let url = db.url();
    block_on(async move {
        let pool = sqlx::PgPool::connect(&url).await?;
        let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&pool).await?;
        assert_eq!(one, 1);
        sqlx::query("CREATE DATABASE lab_sqlx")
            .execute(&pool)
            .await?;
        sqlx::query("DROP DATABASE lab_sqlx").execute(&pool).await?;
        pool.close().await;
        Ok(())
    })?;

    drop(db);
    assert!(!dir.exists(), "{} is still there", dir.display());
    Ok(())
}

#[test]
fn stop_shuts_down_cleanly_and_removes_the_folder() -> Result<()> {
    let mariadb = MariaDb::start()?;
    let postgres = Postgres::start()?;
    assert_ne!(mariadb.port(), postgres.port());
    let dirs = [mariadb.dir().to_path_buf(), postgres.dir().to_path_buf()];

    // `stop` fails unless each server exits 0 on SIGTERM.
    mariadb.stop()?;
    postgres.stop()?;
    for dir in dirs {
        assert!(!dir.exists(), "{} is still there", dir.display());
    }
    Ok(())
}
