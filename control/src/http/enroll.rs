//! The enrollment endpoints: thin handlers over [`crate::enrollment`].
//!
//! `POST /enroll/jobserver/` and `POST /enroll/node/` are public (the token
//! or the nonce is the credential; a job server without a token enrolls on
//! an admin's API key instead), `POST /enroll/renew/` needs the client
//! certificate being renewed, and the token and credential endpoints under
//! `/api/v1/` are for admins.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use mprov_api::enroll::{Enrolled, JobserverEnrollment, NodeEnrollment, Renewal};

use super::AppState;
use super::error::ApiError;
use crate::access;
use crate::enrollment::{self, NewToken, TokenRequest};
use crate::identity::Principal;

/// `POST /enroll/jobserver/`: with a token, the token is the credential;
/// without one, an admin's credentials are
/// ([`access::may_enroll_jobserver`]).
pub async fn enroll_jobserver(
    State(st): State<AppState>,
    Extension(principal): Extension<Principal>,
    Json(body): Json<JobserverEnrollment>,
) -> Result<Json<Enrolled>, ApiError> {
    let (signer, seconds) = (st.signer.as_ref(), st.config.jobserver_cert_seconds);
    let enrolled = if body.token.trim().is_empty() {
        let admin = access::may_enroll_jobserver(&principal, st.config.shared_key_mode)?;
        enrollment::enroll_jobserver_by_admin(&st.db, signer, seconds, &admin, body).await?
    } else {
        enrollment::enroll_jobserver(&st.db, signer, seconds, body).await?
    };
    Ok(Json(enrolled))
}

/// `POST /enroll/node/`: a certificate naming the system the nonce was
/// minted for, and only it.
pub async fn enroll_node(
    State(st): State<AppState>,
    Json(body): Json<NodeEnrollment>,
) -> Result<Json<Enrolled>, ApiError> {
    let enrolled = enrollment::enroll_node(
        &st.db,
        st.signer.as_ref(),
        st.config.node_cert_seconds,
        body,
    )
    .await?;
    Ok(Json(enrolled))
}

/// `POST /enroll/renew/`: over mTLS, a new certificate for the same
/// identity; the one presented is revoked.
pub async fn renew(
    State(st): State<AppState>,
    Extension(principal): Extension<Principal>,
    Json(body): Json<Renewal>,
) -> Result<Json<Enrolled>, ApiError> {
    let machine = access::may_renew(&principal, st.config.shared_key_mode)?;
    st.within_budget(
        &st.renew_limiter,
        &format!("{}:{}", machine.profile.as_str(), machine.identity),
        "renewals",
    )?;
    let enrolled = enrollment::renew(
        &st.db,
        st.signer.as_ref(),
        st.config.node_cert_seconds,
        st.config.jobserver_cert_seconds,
        machine,
        body.csr,
    )
    .await?;
    Ok(Json(enrolled))
}

/// `POST /api/v1/enroll-tokens/` (admin): a new token, shown once.
pub async fn new_token(
    State(st): State<AppState>,
    Json(body): Json<TokenRequest>,
) -> Result<Json<NewToken>, ApiError> {
    Ok(Json(enrollment::new_token(&st.db, body).await?))
}

/// `GET /api/v1/credentials/`: every certificate issued to an agent,
/// newest first; `?identity=` and `?kind=` narrow it.
pub async fn list_credentials(
    State(st): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let items = enrollment::list_credentials(&st.db, &q).await?;
    let total = items.len();
    Ok(Json(serde_json::json!({"items": items, "total": total})))
}

/// `POST /api/v1/credentials/{id}/revoke`: the certificate stops working at
/// once (every request checks the allow-list).
pub async fn revoke_credential(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::invalid("id", "a credential's numeric id"))?;
    let (serial, revoked) = enrollment::revoke_credential(&st.db, id).await?;
    Ok(Json(
        serde_json::json!({"id": id, "serial": serial, "revoked": true, "already": !revoked}),
    ))
}
