//! The database side of backups: what tables and columns an engine has, one
//! consistent snapshot of them, and loading an archive's rows back.
//!
//! The schema is read from the database itself (SQLite's pragmas, the
//! `information_schema` of MariaDB and PostgreSQL), so a table or column a
//! migration adds is backed up without a change here. Table and column names
//! only ever come from that introspection (and are checked to be plain
//! identifiers); every value is bound.
//!
//! The snapshot is one read transaction whose isolation gives a single point
//! in time on each engine while the service keeps writing:
//! SQLite in WAL mode (a deferred transaction's first read fixes its
//! snapshot), PostgreSQL `REPEATABLE READ READ ONLY`, MariaDB `REPEATABLE
//! READ` with `START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use sqlx::AnyConnection;
use sqlx::any::{AnyRow, AnyTypeInfoKind};
use sqlx::{Row, ValueRef};

use super::archive::{Table, is_identifier};
use crate::db::{Engine, MAX_BINDS, Sql, Val};

/// sqlx's bookkeeping table, which a restore rebuilds by migrating.
pub const MIGRATIONS_TABLE: &str = "_sqlx_migrations";

/// How a column's values are bound on this engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColType {
    /// A real boolean (PostgreSQL); SQLite and MariaDB keep flags as integers.
    Bool,
    /// A floating-point number.
    Float,
    /// An integer.
    Int,
    /// Text.
    Text,
}

impl ColType {
    /// The type an engine's declared column type binds as.
    pub fn from_declared(declared: &str) -> ColType {
        let d = declared.to_ascii_lowercase();
        if d.contains("bool") {
            ColType::Bool
        } else if d.contains("int") {
            ColType::Int
        } else if ["real", "double", "float", "numeric", "decimal"]
            .iter()
            .any(|f| d.contains(f))
        {
            ColType::Float
        } else {
            ColType::Text
        }
    }
}

/// One table of the live schema.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSchema {
    /// Its name.
    pub name: String,
    /// Its columns, in order.
    pub columns: Vec<(String, ColType)>,
}

/// A failure while reading or loading rows.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// The archive's rows do not fit this schema.
    #[error("{0}")]
    Mismatch(String),
}

/// Quotes a (checked) identifier for `engine`.
fn quote(engine: Engine, name: &str) -> String {
    match engine {
        Engine::Mysql => format!("`{name}`"),
        Engine::Postgres | Engine::Sqlite => format!("\"{name}\""),
    }
}

/// Runs one statement with no arguments (no prepared statement, so MariaDB
/// takes transaction control statements too).
async fn exec(conn: &mut AnyConnection, sql: &'static str) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sql).execute(&mut *conn).await.map(|_| ())
}

/// The text of the first column of each row.
async fn strings(conn: &mut AnyConnection, sql: Sql) -> Result<Vec<Vec<String>>, sqlx::Error> {
    let rows = sql.query().fetch_all(&mut *conn).await?;
    rows.iter()
        .map(|r| (0..r.len()).map(|i| r.try_get::<String, _>(i)).collect())
        .collect()
}

/// The tables of the live schema (without sqlx's own), parents before the
/// tables that reference them, so rows load in that order.
pub async fn schema(
    conn: &mut AnyConnection,
    engine: Engine,
) -> Result<Vec<TableSchema>, sqlx::Error> {
    let mut columns: BTreeMap<String, Vec<(String, ColType)>> = BTreeMap::new();
    let mut parents: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    match engine {
        Engine::Sqlite => {
            let mut q = Sql::new(engine);
            q.push("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name");
            for row in strings(conn, q).await? {
                let name = row[0].clone();
                let mut q = Sql::new(engine);
                q.push("SELECT name, type FROM pragma_table_info(")
                    .bind(Val::Text(Some(name.clone())))
                    .push(") ORDER BY cid");
                let cols = strings(conn, q).await?;
                columns.insert(
                    name.clone(),
                    cols.iter()
                        .map(|c| (c[0].clone(), ColType::from_declared(&c[1])))
                        .collect(),
                );
                let mut q = Sql::new(engine);
                q.push("SELECT \"table\" FROM pragma_foreign_key_list(")
                    .bind(Val::Text(Some(name.clone())))
                    .push(")");
                let refs = strings(conn, q).await?;
                parents
                    .entry(name)
                    .or_default()
                    .extend(refs.into_iter().map(|r| r[0].clone()));
            }
        }
        Engine::Postgres | Engine::Mysql => {
            let (cols_sql, fk_sql) = if engine == Engine::Postgres {
                (
                    "SELECT CAST(table_name AS TEXT), CAST(column_name AS TEXT), CAST(data_type AS TEXT) \
                     FROM information_schema.columns c WHERE table_schema = current_schema() \
                     AND EXISTS (SELECT 1 FROM information_schema.tables t WHERE t.table_schema = c.table_schema \
                     AND t.table_name = c.table_name AND t.table_type = 'BASE TABLE') \
                     ORDER BY table_name, ordinal_position",
                    "SELECT CAST(tc.table_name AS TEXT), CAST(ccu.table_name AS TEXT) \
                     FROM information_schema.table_constraints tc \
                     JOIN information_schema.constraint_column_usage ccu \
                     ON tc.constraint_schema = ccu.constraint_schema AND tc.constraint_name = ccu.constraint_name \
                     WHERE tc.constraint_type = 'FOREIGN KEY' AND tc.table_schema = current_schema()",
                )
            } else {
                (
                    "SELECT c.table_name AS t, c.column_name AS c, c.data_type AS d \
                     FROM information_schema.columns c JOIN information_schema.tables t \
                     ON t.table_schema = c.table_schema AND t.table_name = c.table_name \
                     WHERE c.table_schema = DATABASE() AND t.table_type = 'BASE TABLE' \
                     AND c.is_generated = 'NEVER' \
                     ORDER BY c.table_name, c.ordinal_position",
                    "SELECT table_name AS t, referenced_table_name AS p \
                     FROM information_schema.referential_constraints WHERE constraint_schema = DATABASE()",
                )
            };
            let mut q = Sql::new(engine);
            q.push(cols_sql);
            for row in strings(conn, q).await? {
                columns
                    .entry(row[0].clone())
                    .or_default()
                    .push((row[1].clone(), ColType::from_declared(&row[2])));
            }
            let mut q = Sql::new(engine);
            q.push(fk_sql);
            for row in strings(conn, q).await? {
                parents
                    .entry(row[0].clone())
                    .or_default()
                    .insert(row[1].clone());
            }
        }
    }
    columns.remove(MIGRATIONS_TABLE);
    // Kahn's algorithm, alphabetical among equals; a table in a cycle (none
    // today) goes last, where a foreign key check would name it.
    let mut order = Vec::new();
    let mut left: BTreeSet<String> = columns.keys().cloned().collect();
    while !left.is_empty() {
        let ready: Vec<String> = left
            .iter()
            .filter(|t| {
                parents
                    .get(*t)
                    .is_none_or(|ps| ps.iter().all(|p| p == *t || !left.contains(p)))
            })
            .cloned()
            .collect();
        let next = if ready.is_empty() {
            left.iter().take(1).cloned().collect()
        } else {
            ready
        };
        for t in next {
            left.remove(&t);
            order.push(t);
        }
    }
    Ok(order
        .into_iter()
        .filter_map(|name| {
            let cols = columns.remove(&name)?;
            Some(TableSchema {
                name,
                columns: cols,
            })
        })
        .collect())
}

/// The newest migration applied, 0 when none is.
pub async fn schema_level(conn: &mut AnyConnection, engine: Engine) -> Result<i64, sqlx::Error> {
    let mut q = Sql::new(engine);
    q.push("SELECT COALESCE(MAX(version), 0) AS v FROM _sqlx_migrations WHERE success = ")
        .push(if engine == Engine::Postgres {
            "TRUE"
        } else {
            "1"
        });
    let row = q.query().fetch_one(&mut *conn).await?;
    crate::db::int(&row, "v")
}

/// Whether sqlx's migrations table exists (the database was ever migrated).
pub async fn is_migrated(conn: &mut AnyConnection, engine: Engine) -> Result<bool, sqlx::Error> {
    Ok(schema_tables_raw(conn, engine)
        .await?
        .iter()
        .any(|t| t == MIGRATIONS_TABLE))
}

/// Every table name, sqlx's included.
async fn schema_tables_raw(
    conn: &mut AnyConnection,
    engine: Engine,
) -> Result<Vec<String>, sqlx::Error> {
    let mut q = Sql::new(engine);
    q.push(match engine {
        Engine::Sqlite => "SELECT name FROM sqlite_master WHERE type = 'table'",
        Engine::Postgres => {
            "SELECT CAST(table_name AS TEXT) FROM information_schema.tables WHERE table_schema = current_schema()"
        }
        Engine::Mysql => {
            "SELECT table_name AS t FROM information_schema.tables WHERE table_schema = DATABASE()"
        }
    });
    Ok(strings(conn, q)
        .await?
        .into_iter()
        .map(|mut r| r.remove(0))
        .collect())
}

/// Opens the snapshot transaction on `conn`.
pub async fn begin_snapshot(conn: &mut AnyConnection, engine: Engine) -> Result<(), sqlx::Error> {
    match engine {
        Engine::Sqlite => exec(conn, "BEGIN DEFERRED").await,
        Engine::Postgres => exec(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await,
        Engine::Mysql => {
            exec(conn, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").await?;
            exec(
                conn,
                "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
            )
            .await
        }
    }
}

/// Ends the snapshot transaction (nothing was written).
pub async fn end_snapshot(conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
    exec(conn, "COMMIT").await
}

/// Every row of `t`, in primary-key order.
pub async fn read_table(
    conn: &mut AnyConnection,
    engine: Engine,
    t: &TableSchema,
) -> Result<Table, StoreError> {
    check_names(t)?;
    let cols: Vec<String> = t.columns.iter().map(|(c, _)| quote(engine, c)).collect();
    // Every column in order: the first is the id where there is one, and a
    // relation table's two columns are its key, so the order is total.
    let order: Vec<String> = (1..=cols.len()).map(|i| i.to_string()).collect();
    let mut q = Sql::new(engine);
    q.push(&format!(
        "SELECT {} FROM {} ORDER BY {}",
        cols.join(", "),
        quote(engine, &t.name),
        order.join(", ")
    ));
    let rows = q.query().fetch_all(&mut *conn).await?;
    let rows = rows
        .iter()
        .map(|r| (0..t.columns.len()).map(|i| cell(r, i)).collect())
        .collect::<Result<Vec<Vec<Value>>, sqlx::Error>>()?;
    Ok(Table {
        table: t.name.clone(),
        columns: t.columns.iter().map(|(c, _)| c.clone()).collect(),
        rows,
    })
}

fn check_names(t: &TableSchema) -> Result<(), StoreError> {
    if !is_identifier(&t.name) {
        return Err(StoreError::Mismatch(format!(
            "table {:?} has a name backups do not handle",
            t.name
        )));
    }
    if let Some((c, _)) = t.columns.iter().find(|(c, _)| !is_identifier(c)) {
        return Err(StoreError::Mismatch(format!(
            "column {}.{c:?} has a name backups do not handle",
            t.name
        )));
    }
    Ok(())
}

/// One value, as the engine-neutral JSON scalar.
fn cell(row: &AnyRow, i: usize) -> Result<Value, sqlx::Error> {
    let raw = row.try_get_raw(i)?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    Ok(match raw.type_info().kind() {
        AnyTypeInfoKind::Null => Value::Null,
        AnyTypeInfoKind::Bool => Value::from(row.try_get::<bool, _>(i)?),
        AnyTypeInfoKind::SmallInt => Value::from(row.try_get::<i16, _>(i)?),
        AnyTypeInfoKind::Integer => Value::from(row.try_get::<i32, _>(i)?),
        AnyTypeInfoKind::BigInt => Value::from(row.try_get::<i64, _>(i)?),
        AnyTypeInfoKind::Real => Value::from(f64::from(row.try_get::<f32, _>(i)?)),
        AnyTypeInfoKind::Double => Value::from(row.try_get::<f64, _>(i)?),
        AnyTypeInfoKind::Text | AnyTypeInfoKind::Blob => Value::from(row.try_get::<String, _>(i)?),
    })
}

/// The number of rows of `table`.
pub async fn count(
    conn: &mut AnyConnection,
    engine: Engine,
    table: &str,
) -> Result<i64, StoreError> {
    if !is_identifier(table) {
        return Err(StoreError::Mismatch(format!("bad table name {table:?}")));
    }
    let mut q = Sql::new(engine);
    q.push(&format!(
        "SELECT COUNT(*) AS n FROM {}",
        quote(engine, table)
    ));
    let row = q.query().fetch_one(&mut *conn).await?;
    Ok(crate::db::int(&row, "n")?)
}

/// Deletes every row of `t`.
pub async fn delete_all(
    conn: &mut AnyConnection,
    engine: Engine,
    t: &TableSchema,
) -> Result<(), StoreError> {
    check_names(t)?;
    let mut q = Sql::new(engine);
    q.push(&format!("DELETE FROM {}", quote(engine, &t.name)));
    q.query().execute(&mut *conn).await?;
    Ok(())
}

/// Drops `tables` (children first) and sqlx's migrations table.
pub async fn drop_tables(
    conn: &mut AnyConnection,
    engine: Engine,
    tables: &[TableSchema],
) -> Result<(), StoreError> {
    for t in tables.iter().rev() {
        check_names(t)?;
        let mut q = Sql::new(engine);
        q.push(&format!(
            "DROP TABLE IF EXISTS {}{}",
            quote(engine, &t.name),
            if engine == Engine::Postgres {
                " CASCADE"
            } else {
                ""
            }
        ));
        q.query().execute(&mut *conn).await?;
    }
    let mut q = Sql::new(engine);
    q.push(&format!(
        "DROP TABLE IF EXISTS {}",
        quote(engine, MIGRATIONS_TABLE)
    ));
    q.query().execute(&mut *conn).await?;
    Ok(())
}

/// Converts an archive value to what a `ty` column binds.
fn to_val(v: &Value, ty: ColType) -> Option<Val> {
    Some(match (ty, v) {
        (ColType::Bool, Value::Null) => Val::Bool(None),
        (ColType::Bool, Value::Bool(b)) => Val::Bool(Some(*b)),
        (ColType::Bool, Value::Number(n)) => Val::Bool(Some(n.as_i64()? != 0)),
        (ColType::Int, Value::Null) => Val::Int(None),
        (ColType::Int, Value::Bool(b)) => Val::Int(Some(i64::from(*b))),
        (ColType::Int, Value::Number(n)) => Val::Int(Some(n.as_i64()?)),
        (ColType::Float, Value::Null) => Val::Float(None),
        (ColType::Float, Value::Number(n)) => Val::Float(Some(n.as_f64()?)),
        (ColType::Text, Value::Null) => Val::Text(None),
        (ColType::Text, Value::String(s)) => Val::Text(Some(s.clone())),
        _ => return None,
    })
}

/// Loads `table`'s rows into the live table `t`, in statements of at most
/// [`MAX_BINDS`] values.
pub async fn insert_rows(
    conn: &mut AnyConnection,
    engine: Engine,
    t: &TableSchema,
    table: &Table,
) -> Result<(), StoreError> {
    check_names(t)?;
    let types: Vec<ColType> = table
        .columns
        .iter()
        .map(|c| {
            t.columns
                .iter()
                .find(|(name, _)| name == c)
                .map(|(_, ty)| *ty)
                .ok_or_else(|| {
                    StoreError::Mismatch(format!(
                        "the archive has column {}.{c}, which this schema does not",
                        t.name
                    ))
                })
        })
        .collect::<Result<_, _>>()?;
    if table.rows.is_empty() {
        return Ok(());
    }
    let head = format!(
        "INSERT INTO {} ({}) VALUES ",
        quote(engine, &t.name),
        table
            .columns
            .iter()
            .map(|c| quote(engine, c))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let per_statement = (MAX_BINDS / table.columns.len()).max(1);
    for (n, chunk) in table.rows.chunks(per_statement).enumerate() {
        let mut q = Sql::new(engine);
        q.push(&head);
        for (i, row) in chunk.iter().enumerate() {
            if i > 0 {
                q.push(", ");
            }
            let vals = row
                .iter()
                .zip(&types)
                .zip(&table.columns)
                .map(|((v, ty), c)| {
                    to_val(v, *ty).ok_or_else(|| {
                        StoreError::Mismatch(format!(
                            "row {} of {}: {c} = {v} does not fit a {ty:?} column",
                            n * per_statement + i,
                            t.name
                        ))
                    })
                })
                .collect::<Result<Vec<Val>, _>>()?;
            q.bind_list(vals);
        }
        q.query().execute(&mut *conn).await?;
    }
    Ok(())
}

/// Moves PostgreSQL's identity sequences past the restored ids, so the next
/// insert does not collide (SQLite and MariaDB do this by themselves).
pub async fn reset_sequences(
    conn: &mut AnyConnection,
    engine: Engine,
    tables: &[TableSchema],
) -> Result<(), StoreError> {
    if engine != Engine::Postgres {
        return Ok(());
    }
    for t in tables {
        check_names(t)?;
        if !t
            .columns
            .iter()
            .any(|(c, ty)| c == "id" && *ty == ColType::Int)
        {
            continue;
        }
        let mut q = Sql::new(engine);
        q.push(&format!(
            "SELECT CAST(setval(CAST(s AS regclass), COALESCE(m, 1), m IS NOT NULL) AS BIGINT) AS v \
             FROM (SELECT pg_get_serial_sequence('{name}', 'id') AS s, (SELECT MAX(id) FROM \"{name}\") AS m) x \
             WHERE s IS NOT NULL",
            name = t.name
        ));
        q.query().fetch_all(&mut *conn).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_types() {
        for (d, want) in [
            ("BOOLEAN", ColType::Bool),
            ("boolean", ColType::Bool),
            ("INTEGER", ColType::Int),
            ("bigint", ColType::Int),
            ("smallint", ColType::Int),
            ("REAL", ColType::Float),
            ("double precision", ColType::Float),
            ("double", ColType::Float),
            ("VARCHAR(255)", ColType::Text),
            ("character varying", ColType::Text),
            ("longtext", ColType::Text),
            ("TEXT", ColType::Text),
        ] {
            assert_eq!(ColType::from_declared(d), want, "{d}");
        }
    }

    #[test]
    fn values_bind_as_the_target_column() {
        use serde_json::json;
        assert_eq!(
            to_val(&json!(1), ColType::Bool),
            Some(Val::Bool(Some(true)))
        );
        assert_eq!(to_val(&json!(false), ColType::Int), Some(Val::Int(Some(0))));
        assert_eq!(
            to_val(&json!(2), ColType::Float),
            Some(Val::Float(Some(2.0)))
        );
        assert_eq!(to_val(&json!(null), ColType::Text), Some(Val::Text(None)));
        assert_eq!(to_val(&json!("x"), ColType::Int), None);
        assert_eq!(to_val(&json!(1.5), ColType::Int), None);
        assert_eq!(to_val(&json!(1), ColType::Text), None);
    }
}
