//! The router's outermost layer: database outages become 503s, internal
//! errors are logged here (see `db::health` for the rules).
//!
//! * While the database is known to be down, every request but the two that
//!   need no database (`/ca.crt`, the OpenAPI document, which still get a 503
//!   when their authentication needs the database) is answered 503 at once.
//! * A response that carries [`Failure::Unavailable`] marks it down (logged
//!   once per outage). One that carries [`Failure::Internal`] has the
//!   database probed: when it does not answer, the request gets a 503 and the
//!   outage starts; otherwise the whole cause chain is logged once, with the
//!   request id the 500 answered.
//! * A request still running after [`WATCHDOG`] has the database probed
//!   (at most once per period for all requests); a failed probe ends it with
//!   a 503, so a network cut that never resets a connection cannot hang it.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::{ApiError, Failure};
use crate::db::health::WATCHDOG;

/// Paths that need no database.
pub(crate) const NO_DATABASE: &[&str] = &["/ca.crt", "/api/v1/openapi.json"];

/// The layer; see the module doc.
pub async fn outage_layer(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let health = st.db.health().clone();
    if health.is_down() && !NO_DATABASE.contains(&req.uri().path()) {
        return ApiError::DatabaseUnavailable("known down".into()).into_response();
    }
    let run = next.run(req);
    tokio::pin!(run);
    let resp = loop {
        tokio::select! {
            resp = &mut run => break resp,
            () = tokio::time::sleep(WATCHDOG) => {
                if health.is_down() {
                    return ApiError::DatabaseUnavailable("known down".into()).into_response();
                }
                if health.recently_ok(WATCHDOG) {
                    continue;
                }
                if let Err(cause) = health.probe().await {
                    health.mark_down(&cause);
                    return ApiError::DatabaseUnavailable(cause).into_response();
                }
            }
        }
    };
    match resp.extensions().get::<Failure>() {
        Some(Failure::Unavailable(cause)) => {
            health.mark_down(cause);
            resp
        }
        Some(Failure::Internal { request_id, cause }) => match health.probe().await {
            Ok(()) => {
                let cause = mprov_process::chain(&**cause);
                tracing::error!(%request_id, %cause, "request failed");
                resp
            }
            Err(probe) => {
                let cause = mprov_process::chain(&**cause);
                health.mark_down(&format!("{cause}; a new connection: {probe}"));
                ApiError::DatabaseUnavailable(probe).into_response()
            }
        },
        None => resp,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt as _;

    use crate::config::{Config, Settings};
    use crate::db::Db;
    use crate::secrets::{self, SecretBox};

    /// What the log writer was given.
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Log {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
        type Writer = Log;
        fn make_writer(&'a self) -> Log {
            self.clone()
        }
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        s: Settings,
    }

    /// A real internal error (the enrollment tokens' table dropped under
    /// the router, then a job server enrolls): the 500 names a request id
    /// and not the cause, and the one log line with that id has the whole
    /// cause chain.
    #[tokio::test]
    async fn a_500_answers_a_request_id_and_the_log_has_the_cause_chain() {
        use clap::Parser as _;
        let dir = tempfile::tempdir().unwrap();
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("t.sqlite3").display()
        );
        let argv = [
            "mprov-control",
            "--database-url",
            &url,
            "--hostname",
            "mpcc",
        ];
        let config = Config::from_settings(Cli::try_parse_from(argv).unwrap().s).unwrap();
        let db = Db::open(&url).await.unwrap();
        sqlx::query("DROP TABLE enroll_tokens")
            .execute(db.pool())
            .await
            .unwrap();
        let app = crate::http::router(Arc::new(crate::http::Inner::new(
            db,
            Arc::new(config),
            SecretBox::new("test secret key"),
        )));

        let log = Log::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(log.clone())
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let enrollment = serde_json::json!({
            "token": secrets::new_api_key().key,
            "name": "js1",
            "csr": "unused: the token is looked up first",
        });
        let request = Request::post("/enroll/jobserver/")
            .header("content-type", "application/json")
            .body(Body::from(enrollment.to_string()))
            .unwrap();
        let resp = app.oneshot(request).await.unwrap();
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let answer: mprov_api::ApiError = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer.error, "internal");
        let id = answer
            .message
            .rsplit_once("(request id ")
            .and_then(|(_, rest)| rest.strip_suffix(')'))
            .unwrap_or_else(|| panic!("no request id in {:?}", answer.message))
            .to_owned();
        assert!(id.len() >= 12, "{id:?}");
        let text = String::from_utf8_lossy(&body);
        for cause in ["enroll_tokens", "no such table", "database"] {
            assert!(!text.contains(cause), "the body tells the cause: {text}");
        }

        let logged = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = logged.lines().filter(|l| l.contains(&id)).collect();
        assert_eq!(lines.len(), 1, "{logged}");
        assert!(
            lines[0].contains("request failed")
                && lines[0].contains("enrollment database: ")
                && lines[0].contains("no such table: enroll_tokens"),
            "the log line lacks the cause chain: {}",
            lines[0]
        );
    }
}
