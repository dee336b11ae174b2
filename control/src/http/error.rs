//! The one error type of the HTTP layer.
//!
//! Every failure a handler or middleware can have becomes an [`ApiError`], which
//! picks the status code and the JSON body (`{"error", "message", "field"}`)
//! the API conventions promise. An internal failure keeps its cause as an
//! error with its sources; the response carries it as a [`Failure`] with a
//! fresh request id, [`super::outage`] (the router's outermost layer) logs
//! the whole cause chain once under that id, and the client is answered
//! with the id only, never with the cause. A database that does not answer is a 503 with a
//! `Retry-After`, logged once per outage.

use std::error::Error as StdError;
use std::sync::Arc;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::access::AccessError;
use crate::boot::BootError;
use crate::db::crud::StoreError;
use crate::db::health::is_unavailable;
use crate::enrollment::EnrollError;
use crate::identity::IdentityError;

/// What went wrong with a request.
#[derive(Debug)]
pub enum ApiError {
    /// 400: the request is malformed or invalid.
    BadRequest {
        /// Stable code.
        code: &'static str,
        /// What to do.
        message: String,
        /// The field at fault.
        field: Option<String>,
    },
    /// 409: the request clashes with existing data.
    Conflict {
        /// What clashes.
        message: String,
        /// The field at fault.
        field: Option<String>,
    },
    /// 403: authenticated, but not allowed.
    Forbidden(String),
    /// 500: our fault; the cause, with its sources, goes to the log only.
    Internal(Box<dyn StdError + Send + Sync>),
    /// 405.
    MethodNotAllowed,
    /// 404.
    NotFound(String),
    /// 413.
    PayloadTooLarge(usize),
    /// 401, with a `WWW-Authenticate` challenge.
    Unauthorized(String),
    /// 503: the database does not answer; the cause goes to the log (once,
    /// by [`super::outage`]).
    DatabaseUnavailable(String),
    /// 415.
    UnsupportedMediaType,
    /// 503: a part of the service is down for now; try again in
    /// `retry_after` seconds.
    Unavailable {
        /// What is down and what to do.
        message: String,
        /// Seconds, for `Retry-After`.
        retry_after: u32,
    },
    /// 429: too many attempts; try again in `retry_after` seconds.
    TooManyRequests {
        /// What was limited.
        message: String,
        /// Seconds, for `Retry-After`.
        retry_after: u32,
    },
    /// 426: the client runs another version.
    UpgradeRequired {
        /// What the client sent, if anything.
        client: Option<String>,
    },
}

/// An internal error's cause with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct Cause {
    what: String,
    #[source]
    source: Box<dyn StdError + Send + Sync>,
}

impl ApiError {
    /// A 500 whose cause is `err` (an error, or a message).
    pub fn internal(err: impl Into<Box<dyn StdError + Send + Sync>>) -> ApiError {
        ApiError::Internal(err.into())
    }

    /// A 500 while doing `what`, caused by `err`.
    pub fn internal_in(
        what: impl Into<String>,
        err: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> ApiError {
        ApiError::Internal(Box::new(Cause {
            what: what.into(),
            source: err.into(),
        }))
    }

    /// A 400 naming the field at fault.
    pub fn invalid(field: &str, message: impl Into<String>) -> ApiError {
        ApiError::BadRequest {
            code: "invalid_field",
            message: message.into(),
            field: Some(field.to_owned()),
        }
    }

    /// A 400 about the request as a whole.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::BadRequest {
            code,
            message: message.into(),
            field: None,
        }
    }

    fn parts(&self) -> (StatusCode, &'static str, String, Option<String>) {
        match self {
            ApiError::BadRequest {
                code,
                message,
                field,
            } => (
                StatusCode::BAD_REQUEST,
                code,
                message.clone(),
                field.clone(),
            ),
            ApiError::Conflict { message, field } => (
                StatusCode::CONFLICT,
                "conflict",
                message.clone(),
                field.clone(),
            ),
            ApiError::Forbidden(m) => (StatusCode::FORBIDDEN, "forbidden", m.clone(), None),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error; the control service's log has the cause".into(),
                None,
            ),
            ApiError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this path does not take that method; see /api/v1/openapi.json".into(),
                None,
            ),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, "not_found", m.clone(), None),
            ApiError::PayloadTooLarge(limit) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!(
                    "the request body is over the {limit}-byte limit; send fewer rows per request"
                ),
                None,
            ),
            ApiError::Unauthorized(m) => {
                (StatusCode::UNAUTHORIZED, "unauthorized", m.clone(), None)
            }
            ApiError::DatabaseUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "database_unavailable",
                "the control service's database is not answering; the service retries by itself and serves again as soon as it is back (retry shortly; an admin should check the database server, its log has the cause)".into(),
                None,
            ),
            ApiError::Unavailable { message, .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                message.clone(),
                None,
            ),
            ApiError::TooManyRequests { message, .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_requests",
                message.clone(),
                None,
            ),
            ApiError::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as JSON with Content-Type: application/json".into(),
                None,
            ),
            ApiError::UpgradeRequired { client } => (
                StatusCode::UPGRADE_REQUIRED,
                "version_mismatch",
                format!(
                    "this control service is version {server}; the client sent {sent}. Run the same major.minor version of the control service, job servers, agents and mash (send header {h}: {server})",
                    server = mprov_api::api_version(),
                    sent = match client {
                        Some(v) => format!("version {v:?}"),
                        None => format!("no {} header", mprov_api::VERSION_HEADER),
                    },
                    h = mprov_api::VERSION_HEADER,
                ),
                None,
            ),
        }
    }
}

/// What a failed response carries for [`super::outage`], which logs it (or
/// turns it into a 503 when the database turns out to be down).
#[derive(Debug, Clone)]
pub enum Failure {
    /// An internal error: the id its response names, and its cause.
    Internal {
        /// The request id, in the response and the log line.
        request_id: String,
        /// The error, with its sources.
        cause: Arc<dyn StdError + Send + Sync>,
    },
    /// The database did not answer.
    Unavailable(String),
}

/// How long a client is told to wait before retrying a 503.
pub const RETRY_AFTER_SECS: &str = "2";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry_after = match &self {
            ApiError::Unavailable { retry_after, .. }
            | ApiError::TooManyRequests { retry_after, .. } => Some(*retry_after),
            _ => None,
        };
        let (status, error, mut message, field) = self.parts();
        let failure = match self {
            ApiError::Internal(cause) => {
                let request_id = crate::secrets::random_token(9);
                message = format!("{message} (request id {request_id})");
                Some(Failure::Internal {
                    request_id,
                    cause: Arc::from(cause),
                })
            }
            ApiError::DatabaseUnavailable(cause) => Some(Failure::Unavailable(cause)),
            _ => None,
        };
        let body = mprov_api::ApiError {
            error: error.to_owned(),
            message,
            field,
        };
        let mut resp = (status, axum::Json(body)).into_response();
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(f) = failure {
            if matches!(f, Failure::Unavailable(_)) {
                resp.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from_static(RETRY_AFTER_SECS),
                );
            }
            resp.extensions_mut().insert(f);
        }
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"mProv\", Api-Key"),
            );
        }
        resp
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound { kind, key } => {
                ApiError::NotFound(format!("no {kind} has id or name {key:?}"))
            }
            StoreError::Invalid { field, message } => ApiError::BadRequest {
                code: "invalid_field",
                message,
                field,
            },
            StoreError::Conflict { field, message } => ApiError::Conflict { message, field },
            StoreError::Db(e) => database(e),
            StoreError::Hash(e) => ApiError::internal_in("hashing a password", e),
        }
    }
}

/// A database error: a 503 while the database does not answer, else a 500
/// with the error as its cause.
fn database(e: sqlx::Error) -> ApiError {
    if is_unavailable(&e) {
        unavailable(&e)
    } else {
        ApiError::internal_in("database", e)
    }
}

/// The 503 of a database that does not answer.
fn unavailable(e: &sqlx::Error) -> ApiError {
    ApiError::DatabaseUnavailable(format!("database: {e}"))
}

impl From<EnrollError> for ApiError {
    fn from(err: EnrollError) -> Self {
        match err {
            EnrollError::Refused(m) => ApiError::Unauthorized(m),
            EnrollError::WrongName(m) => ApiError::Forbidden(m),
            EnrollError::Conflict { message, field } => ApiError::Conflict { message, field },
            EnrollError::Invalid { field, message } => ApiError::invalid(&field, message),
            EnrollError::NoCredential(id) => ApiError::NotFound(format!("no credential {id}")),
            EnrollError::CsrRefused(reason) => ApiError::bad_request("csr_refused", reason),
            e @ EnrollError::CsrTooLarge { .. } => ApiError::invalid("csr", e.to_string()),
            EnrollError::SignerDown { message, .. } => ApiError::Unavailable {
                message,
                retry_after: 5,
            },
            EnrollError::Db(ref db) if is_unavailable(db) => unavailable(db),
            e @ (EnrollError::Db(_) | EnrollError::NoSigner | EnrollError::Time(_)) => {
                ApiError::internal(e)
            }
        }
    }
}

impl From<IdentityError> for ApiError {
    fn from(err: IdentityError) -> Self {
        match err {
            IdentityError::Refused(m) => ApiError::Unauthorized(m),
            IdentityError::Throttled {
                message,
                retry_after,
            } => ApiError::TooManyRequests {
                message,
                retry_after,
            },
            IdentityError::Db(ref db) if is_unavailable(db) => unavailable(db),
            e @ (IdentityError::Db(_) | IdentityError::Join(_)) => ApiError::internal(e),
        }
    }
}

impl From<BootError> for ApiError {
    fn from(err: BootError) -> Self {
        match &err {
            BootError::Db(db) if is_unavailable(db) => unavailable(db),
            BootError::Db(_) => ApiError::internal(err),
        }
    }
}

impl From<AccessError> for ApiError {
    fn from(err: AccessError) -> Self {
        match err {
            AccessError::Forbidden(m) => ApiError::Forbidden(m),
            AccessError::Unauthorized(m) => ApiError::Unauthorized(m),
        }
    }
}
