//! The router's outermost layer: database outages become 503s, internal
//! errors are logged here (see `db::health` for the rules).
//!
//! * While the database is known to be down, every request but the two that
//!   need no database (`/ca.crt`, the OpenAPI document, which still get a 503
//!   when their authentication needs the database) is answered 503 at once.
//! * A response that carries [`Failure::Unavailable`] marks it down (logged
//!   once per outage). One that carries [`Failure::Internal`] has the
//!   database probed: when it does not answer, the request gets a 503 and the
//!   outage starts; otherwise the cause is logged as the request's failure.
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
        Some(Failure::Internal(cause)) => match health.probe().await {
            Ok(()) => {
                tracing::error!(%cause, "request failed");
                resp
            }
            Err(probe) => {
                health.mark_down(&format!("{cause}; a new connection: {probe}"));
                ApiError::DatabaseUnavailable(probe).into_response()
            }
        },
        None => resp,
    }
}
