//! The pages' static files, built into the binary: every asset is served by
//! the control service itself, so the pages work on a cluster network with
//! no way out (no CDN, no font service).

use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::page::PageError;

/// Every file under `/admin/static/`: its name, type and bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "mprov.css",
        "text/css; charset=utf-8",
        include_bytes!("../../../static/admin/mprov.css"),
    ),
    (
        "board.css",
        "text/css; charset=utf-8",
        include_bytes!("../../../static/admin/board.css"),
    ),
    (
        "board.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../static/admin/board.js"),
    ),
    (
        "mprov.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../static/admin/mprov.js"),
    ),
    (
        "passkeys.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../static/admin/passkeys.js"),
    ),
];

/// `GET /admin/static/{name}`; URLs carry the release (`?v=`), so an asset
/// may be cached for a day.
pub async fn serve(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, ty, bytes)) => {
            let mut resp = (*bytes).into_response();
            let h = resp.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ty));
            h.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=86400"),
            );
            resp
        }
        None => PageError::not_found(format!("no static file {name:?}")).into_response(),
    }
}
