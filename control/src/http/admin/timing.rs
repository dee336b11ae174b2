//! `Server-Timing` on every signed-in page: the time the server spent on
//! it and the database statements it ran (counted by
//! [`Db::statements`](crate::db::Db::statements), so approximate while
//! other requests run at the same time). Browsers' developer tools show
//! it; `cargo xtask bench pages` reads it.

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

use crate::http::AppState;

/// Adds `Server-Timing: app;dur=<ms>, db;desc="<n> statements"`.
pub async fn layer(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let before = state.db.statements();
    let t0 = std::time::Instant::now();
    let mut resp = next.run(req).await;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    let n = state.db.statements().saturating_sub(before);
    if let Ok(v) = HeaderValue::from_str(&format!("app;dur={ms:.2}, db;desc=\"{n} statements\"")) {
        resp.headers_mut().insert("server-timing", v);
    }
    resp
}
