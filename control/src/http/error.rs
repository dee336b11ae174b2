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
use crate::discovery::store::DiscoveryError;
use crate::enrollment::EnrollError;
use crate::identity::IdentityError;
use crate::jobservers::RegisterError;
use crate::netboot::{NotBootable, ViewError};
use crate::passkeys::PasskeyError;

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

    /// The status, the stable code, the message and the field at fault.
    pub fn parts(&self) -> (StatusCode, &'static str, String, Option<String>) {
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

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        database(err)
    }
}

impl From<crate::bulk::BulkError> for ApiError {
    fn from(err: crate::bulk::BulkError) -> ApiError {
        use crate::bulk::BulkError;
        match err {
            BulkError::CountChanged { .. } => ApiError::Conflict {
                message: err.to_string(),
                field: Some("confirm_count".into()),
            },
            BulkError::Db(e) => e.into(),
            BulkError::Invalid { field, message } => ApiError::invalid(field, message),
        }
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
        let again = "boot the node again (through /ipxe/) for a new one";
        let new_token = "make a new one (mprov-control enroll-token --name <job server>)";
        match err {
            EnrollError::CredentialUnknown(id) => ApiError::NotFound(format!("no credential {id}")),
            EnrollError::CsrRefused(reason) => ApiError::bad_request("csr_refused", reason),
            e @ EnrollError::CsrTooLarge { .. } => ApiError::invalid("csr", e.to_string()),
            EnrollError::EnrollmentCollided { identity } => ApiError::Conflict {
                message: format!(
                    "{identity} is being enrolled by other requests at the same time; try again"
                ),
                field: None,
            },
            EnrollError::FilterUnknown(field) => {
                ApiError::invalid(&field, "filter by identity or kind")
            }
            EnrollError::JobServerLive { name } => ApiError::Conflict {
                message: format!(
                    "job server {name:?} already has a valid certificate, and this enrollment (a token for a new job server, or an admin's API key) is for a new job server; to replace its certificate, make a token for that (mprov-control enroll-token --name {name} --replace), or revoke the old one first"
                ),
                field: Some("name".into()),
            },
            EnrollError::NameInvalid(_) => ApiError::invalid(
                "name",
                "the job server's name (letters, digits, '-', '.', '_'): only that name can enroll with the token",
            ),
            EnrollError::NonceExpired(at) => {
                ApiError::Unauthorized(format!("this enrollment nonce expired at {at}; {again}"))
            }
            EnrollError::NonceRaced => ApiError::Unauthorized(format!(
                "this enrollment nonce was used by another request at the same time; {again}"
            )),
            EnrollError::NonceUnknown => ApiError::Unauthorized(format!(
                "the enrollment nonce is not valid (unknown, or cancelled by a newer boot of the node); {again}"
            )),
            EnrollError::NonceUsed(at) => ApiError::Unauthorized(format!(
                "this enrollment nonce was already used at {at}; {again}"
            )),
            EnrollError::SignerDown(err) => ApiError::Unavailable {
                message: format!(
                    "{err}; it is being started again: try again in a few seconds (nothing was enrolled, the token or nonce is not spent)"
                ),
                retry_after: 5,
            },
            EnrollError::TokenExpired(at) => ApiError::Unauthorized(format!(
                "this enrollment token expired at {at}; {new_token}"
            )),
            EnrollError::TokenForAnotherName { made_for, asked } => ApiError::Forbidden(format!(
                "this enrollment token was made for {made_for:?} and cannot enroll {asked:?}; make a token for that name (mprov-control enroll-token --name {asked})"
            )),
            EnrollError::TokenHoursOutOfRange(_) => ApiError::invalid(
                "hours",
                format!("between 1 and {} hours", crate::enrollment::MAX_TOKEN_HOURS),
            ),
            EnrollError::TokenRaced => ApiError::Unauthorized(format!(
                "this enrollment token was used by another request at the same time; {new_token}"
            )),
            EnrollError::TokenUnknown => {
                ApiError::Unauthorized(format!("the enrollment token is not valid; {new_token}"))
            }
            EnrollError::TokenUsed(at) => ApiError::Unauthorized(format!(
                "this enrollment token was already used at {at}; {new_token}"
            )),
            EnrollError::Db(ref db) if is_unavailable(db) => unavailable(db),
            e @ (EnrollError::Db(_) | EnrollError::NoSigner | EnrollError::Time(_)) => {
                ApiError::internal(e)
            }
        }
    }
}

impl From<DiscoveryError> for ApiError {
    fn from(err: DiscoveryError) -> Self {
        let again = "boot the node again (through /ipxe/) for a new one";
        match err {
            DiscoveryError::Db(e) => database(e),
            e @ DiscoveryError::MacInvalid(_) => ApiError::invalid("boot_mac", e.to_string()),
            e @ (DiscoveryError::MacTaken { .. } | DiscoveryError::NicRaced) => {
                ApiError::Conflict {
                    message: format!("{e}; nothing was changed"),
                    field: None,
                }
            }
            e @ DiscoveryError::NicHasMac { .. } => ApiError::Conflict {
                message: format!("{e}; send \"replace\": true to replace it"),
                field: Some("nic".into()),
            },
            e @ DiscoveryError::NicUnknown { .. } => ApiError::invalid("nic", e.to_string()),
            DiscoveryError::NonceMissing => ApiError::Unauthorized(format!(
                "a discovery report needs the one-time discovery nonce of its boot in the {} header",
                mprov_api::nads::NONCE_HEADER
            )),
            DiscoveryError::NonceExpired(at) => {
                ApiError::Unauthorized(format!("this discovery nonce expired at {at}; {again}"))
            }
            DiscoveryError::NonceForAnotherMac => ApiError::Forbidden(
                "this discovery nonce was minted for another MAC than the report's boot_mac".into(),
            ),
            DiscoveryError::NonceUnknown => ApiError::Unauthorized(format!(
                "the discovery nonce is not valid (unknown, or cancelled by a newer boot of the node); {again}"
            )),
            DiscoveryError::NonceUsed(at) => ApiError::Unauthorized(format!(
                "this discovery nonce was already used at {at}; {again}"
            )),
            e @ DiscoveryError::NotParked(_) => ApiError::NotFound(e.to_string()),
            e @ DiscoveryError::SystemUnknown(_) => ApiError::invalid("system", e.to_string()),
            e @ DiscoveryError::Time(_) => ApiError::internal(e),
        }
    }
}

impl From<PasskeyError> for ApiError {
    fn from(err: PasskeyError) -> Self {
        let again = "start again from the page";
        match err {
            PasskeyError::Db(e) => database(e),
            PasskeyError::TimeOutOfRange => ApiError::internal_in("passkey challenge", err),
            PasskeyError::TooManyPending => ApiError::TooManyRequests {
                message: err.to_string(),
                retry_after: 60,
            },
            PasskeyError::NameInvalid => ApiError::invalid("name", err.to_string()),
            PasskeyError::PasskeyNotFound | PasskeyError::UserUnknown(_) => {
                ApiError::NotFound(err.to_string())
            }
            PasskeyError::CredentialRegistered => ApiError::Conflict {
                message: "this passkey is registered already (to you or another user)".into(),
                field: None,
            },
            PasskeyError::HostIsAddress(_) | PasskeyError::HostNotAllowed(_) => {
                ApiError::bad_request(
                    "passkey_host",
                    format!("{err}; open the pages by the control host's name"),
                )
            }
            // A response that does not pass: the browser's or the
            // authenticator's fault, or an attack; the same answer.
            e @ (PasskeyError::ChallengeExpired
            | PasskeyError::ChallengeUsed
            | PasskeyError::ChallengeUnknown
            | PasskeyError::ChallengeOtherCeremony
            | PasskeyError::ChallengeOtherUser) => {
                ApiError::Unauthorized(format!("passkey refused: {e}; {again}"))
            }
            e @ (PasskeyError::CounterNotIncreased { .. }
            | PasskeyError::CredentialUnknown
            | PasskeyError::SignatureInvalid
            | PasskeyError::UserHandleMismatch
            | PasskeyError::UserNotPresent
            | PasskeyError::UserNotVerified
            | PasskeyError::OriginMismatch { .. }
            | PasskeyError::RpIdMismatch
            | PasskeyError::CrossOrigin
            | PasskeyError::TypeMismatch { .. }) => {
                ApiError::Unauthorized(format!("passkey refused: {e}"))
            }
            e @ (PasskeyError::AlgorithmUnsupported(_)
            | PasskeyError::AttestationFormat(_)
            | PasskeyError::AttestationMalformed(_)
            | PasskeyError::AttestationSignature
            | PasskeyError::AuthenticatorDataMalformed(_)
            | PasskeyError::Base64(_)
            | PasskeyError::ClientDataMalformed(_)
            | PasskeyError::CoseKeyMalformed(_)
            | PasskeyError::CredentialIdMismatch) => {
                ApiError::bad_request("passkey_response", format!("passkey refused: {e}"))
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
            BootError::LeaseRefused(why @ crate::boot::LeaseRefused::NoNetwork { .. }) => {
                ApiError::Forbidden(why.to_string())
            }
            BootError::LeaseRefused(why) => ApiError::invalid("ip", why.to_string()),
        }
    }
}

impl From<crate::board::BoardError> for ApiError {
    fn from(err: crate::board::BoardError) -> Self {
        match err {
            crate::board::BoardError::Db(db) => BootError::Db(db).into(),
            crate::board::BoardError::Boot(e) => e.into(),
        }
    }
}

impl From<RegisterError> for ApiError {
    fn from(err: RegisterError) -> Self {
        match &err {
            RegisterError::Db(db) if is_unavailable(db) => unavailable(db),
            // Two registrations racing for one host id or name: the loser
            // registers again and finds the winner's row.
            RegisterError::Db(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                ApiError::Conflict {
                    message: "another registration of this host id or name was written at the same time; register again".into(),
                    field: None,
                }
            }
            RegisterError::Db(_) => ApiError::internal(err),
            RegisterError::Invalid { field, message } => ApiError::invalid(field, message.clone()),
            RegisterError::HostIdHeld { .. } | RegisterError::HostIdAndNameSplit { .. } => {
                ApiError::Conflict {
                    message: err.to_string(),
                    field: Some("host_id".into()),
                }
            }
            RegisterError::NameHeld { .. } => ApiError::Conflict {
                message: err.to_string(),
                field: None,
            },
        }
    }
}

impl From<crate::scripts::ScriptsError> for ApiError {
    fn from(err: crate::scripts::ScriptsError) -> Self {
        use crate::scripts::ScriptsError as E;
        match err {
            E::Db(db) if is_unavailable(&db) => unavailable(&db),
            E::Db(db) => ApiError::internal_in("scripts", db),
            E::Effective(e) => ApiError::Conflict {
                message: e.to_string(),
                field: None,
            },
            E::NoImage(key) => ApiError::NotFound(format!("no image has id or name {key:?}")),
            E::NoScript(slug) => ApiError::NotFound(format!("no script {slug:?}")),
            E::NoSystem(key) => ApiError::NotFound(format!("no system has id or name {key:?}")),
            E::NotInPlan { host, slug } => {
                tracing::warn!(node = %host, script = %slug, "refused a script's content to a node whose plan does not have it");
                ApiError::Forbidden(format!(
                    "a node's certificate reaches only the scripts of its own post-boot plan; {slug:?} is not among {host}'s"
                ))
            }
            E::Report { field, message } => ApiError::invalid(field, message),
            E::Store(e) => e.into(),
        }
    }
}

impl From<ViewError> for ApiError {
    fn from(err: ViewError) -> Self {
        match &err {
            ViewError::Db(db) if is_unavailable(db) => unavailable(db),
            ViewError::Db(_) => ApiError::internal(err),
        }
    }
}

/// An image that cannot boot: the node (or its admin) must fix the
/// inventory first.
impl From<NotBootable> for ApiError {
    fn from(err: NotBootable) -> Self {
        ApiError::Conflict {
            field: err.field().map(str::to_owned),
            message: err.to_string(),
        }
    }
}

impl From<AccessError> for ApiError {
    fn from(err: AccessError) -> Self {
        match err {
            AccessError::Anonymous => ApiError::Unauthorized(
                "this needs a node's or a job server's certificate, or an admin's credentials"
                    .into(),
            ),
            AccessError::BootEventsReadOnly => ApiError::Forbidden(
                "this account may read boot events but not write them".into(),
            ),
            AccessError::Forbidden(m) => ApiError::Forbidden(m),
            AccessError::EnrollNeedsCredential => ApiError::Unauthorized(
                "a job server enrolls with its one-time token (\"token\", made by mprov-control enroll-token), or with an admin's API key ('Authorization: Api-Key <key>')".into(),
            ),
            AccessError::EnrollNeedsAdmin { who } => ApiError::Forbidden(format!(
                "{who} cannot enroll a job server: without a one-time token, enrolling needs an admin's API key (or an admin account)"
            )),
            AccessError::HeartbeatNotFromJobServer => ApiError::Forbidden(
                "a heartbeat comes from a job server's own certificate, which names it".into(),
            ),
            AccessError::NotFromJobServer { what } => ApiError::Forbidden(format!(
                "{what} come from a job server's own certificate, which names it"
            )),
            AccessError::ManifestNamesNoNode => {
                ApiError::invalid("system", "name the node: ?system=<host>")
            }
            AccessError::ManifestNotOwn => ApiError::Forbidden(
                "a boot manifest is for the node itself, with its own certificate".into(),
            ),
            AccessError::NodeHasNoSystem { host } => ApiError::Forbidden(format!(
                "no system {host}: the certificate names a node the inventory no longer has; an administrator adds it again (or revokes the certificate)"
            )),
            AccessError::NodeReadsAnother { host } => ApiError::Forbidden(format!(
                "a node's certificate reads its own boot events ({host}) only"
            )),
            AccessError::NodeWritesAnother { host } => ApiError::Forbidden(format!(
                "a node's certificate writes boot events for its own system ({host}) only"
            )),
            AccessError::PhaseNotReportedBy { by, phase } => {
                ApiError::invalid("phase", format!("{by} does not report {}", phase.as_str()))
            }
            AccessError::PlanNamesNothing { param } => ApiError::invalid(
                param,
                match param {
                    "image" => "name the image: ?mode=image-gen&image=<slug>",
                    _ => "name the node: ?mode=post-boot&system=<host>",
                },
            ),
            AccessError::ScriptsNotOwn { host } => ApiError::Forbidden(format!(
                "a node's certificate reaches only its own post-boot scripts ({host}): its own plan, which it gets without naming a system, and the scripts in it"
            )),
            AccessError::ScriptsNotFor { by, what } => {
                ApiError::Forbidden(format!("{by} does not get {what}"))
            }
            AccessError::RenewalNeedsCertificate => ApiError::Forbidden(
                "renewal needs the client certificate being renewed".into(),
            ),
            AccessError::ScriptServedReported => {
                ApiError::invalid("phase", "script_served is recorded by /ipxe/ itself")
            }
            AccessError::SharedKeyNamesNoNode => ApiError::Forbidden(
                "the shared API key cannot say which node it speaks for; use the node's certificate".into(),
            ),
            AccessError::SharedKeyOff => ApiError::Unauthorized(
                "the shared API key is turned off (MPROV_SHARED_KEY_MODE=off); enroll with a token instead".into(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each enrollment fact keeps the status the API promised before the
    /// facts had names, and its message says what to do.
    #[test]
    fn enrollment_facts_map_to_statuses_and_advice() {
        let check = |err: EnrollError, status: StatusCode, advice: &str| {
            let shown = format!("{err}");
            let (got, _, message, _) = ApiError::from(err).parts();
            assert_eq!(got, status, "{shown}");
            assert!(message.contains(advice), "{shown}: {message}");
        };
        let at = || "2026-01-01T00:00:00Z".to_owned();
        check(
            EnrollError::NonceUnknown,
            StatusCode::UNAUTHORIZED,
            "boot the node again",
        );
        check(
            EnrollError::NonceUsed(at()),
            StatusCode::UNAUTHORIZED,
            "already used at 2026",
        );
        check(
            EnrollError::NonceExpired(at()),
            StatusCode::UNAUTHORIZED,
            "expired at 2026",
        );
        check(
            EnrollError::NonceRaced,
            StatusCode::UNAUTHORIZED,
            "nonce was used by another request",
        );
        check(
            EnrollError::TokenUnknown,
            StatusCode::UNAUTHORIZED,
            "make a new one",
        );
        check(
            EnrollError::TokenUsed(at()),
            StatusCode::UNAUTHORIZED,
            "already used at 2026",
        );
        check(
            EnrollError::TokenExpired(at()),
            StatusCode::UNAUTHORIZED,
            "expired at 2026",
        );
        check(
            EnrollError::TokenRaced,
            StatusCode::UNAUTHORIZED,
            "make a new one",
        );
        check(
            EnrollError::TokenForAnotherName {
                made_for: "js9".into(),
                asked: "js1".into(),
            },
            StatusCode::FORBIDDEN,
            "enroll-token --name js1",
        );
        check(
            EnrollError::JobServerLive { name: "js1".into() },
            StatusCode::CONFLICT,
            "--replace",
        );
        check(
            EnrollError::EnrollmentCollided {
                identity: "js1".into(),
            },
            StatusCode::CONFLICT,
            "try again",
        );
        check(
            EnrollError::TokenHoursOutOfRange(0),
            StatusCode::BAD_REQUEST,
            "between 1 and 720",
        );
        check(
            EnrollError::NameInvalid("-x".into()),
            StatusCode::BAD_REQUEST,
            "letters, digits",
        );
        check(
            EnrollError::FilterUnknown("colour".into()),
            StatusCode::BAD_REQUEST,
            "identity or kind",
        );
        check(
            EnrollError::CredentialUnknown(7),
            StatusCode::NOT_FOUND,
            "no credential 7",
        );
        check(
            EnrollError::CsrRefused("weak key".into()),
            StatusCode::BAD_REQUEST,
            "weak key",
        );
        check(
            EnrollError::NoSigner,
            StatusCode::INTERNAL_SERVER_ERROR,
            "log has the cause",
        );
    }
}
