//! The JSON request body extractor every JSON handler shares ([`JsonBody`]):
//! plumbing, with the one error format, not a handler.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde_json::Value;

use super::error::ApiError;

/// A JSON request body, with our error format for every way it can be wrong.
#[derive(Debug)]
pub struct JsonBody(pub Value);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or_default().to_ascii_lowercase();
            if !ct.starts_with("application/json") {
                return Err(ApiError::UnsupportedMediaType);
            }
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge(super::BODY_LIMIT)
            } else {
                ApiError::bad_request(
                    "bad_body",
                    format!("could not read the body: {}", e.body_text()),
                )
            }
        })?;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            ApiError::bad_request("malformed_json", format!("the body is not valid JSON: {e}"))
        })
    }
}
