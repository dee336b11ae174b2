//! `GET /ipxe/?mac=<mac>`: the script a booting node's iPXE runs.
//!
//! The node is found by its MAC (never by its source address). A known node
//! that boots from the network gets its image's kernel and the agent
//! initramfs from a job server that holds the image's current version, with
//! a fresh one-time enrollment nonce and the CA's fingerprint on the kernel
//! command line; an unknown node gets the discovery script, a node set not
//! to netboot the local-boot script. iPXE cannot authenticate, so this is
//! public; what it hands out (a nonce) is single-use, short-lived and good
//! only for enrolling that one system.

use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use mprov_api::boot::{ImageFile, image_file_url, ipxe_chain_url, jobserver_base_url};
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use crate::db::crud::ListQuery;
use crate::db::kinds;

/// How long a node waits before asking again (unknown node, image not ready).
const RETRY_SECS: u32 = 30;

fn script(body: String) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

fn unsafe_value(e: mprov_ipxe::UnsafeValue) -> ApiError {
    ApiError::Internal(format!("iPXE script: {e}"))
}

/// `GET /ipxe/`.
pub async fn ipxe(State(st): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let mac = url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "mac")
        .map(|(_, v)| v.to_ascii_lowercase().replace('-', ":"))
        .ok_or_else(|| ApiError::invalid("mac", "add ?mac=${net0/mac} to the chain URL"))?;
    let ipxe_url = ipxe_chain_url(&st.config.public_url);
    let kind = |n| kinds::kind(n).ok_or_else(|| ApiError::Internal(format!("no kind {n}")));
    let nics = st
        .db
        .list(
            kind("nics")?,
            &ListQuery {
                filters: vec![("mac".into(), mac.clone())],
                ..ListQuery::default()
            },
        )
        .await?;
    let Some(system_id) = nics
        .items
        .first()
        .and_then(|n| n.get("system"))
        .and_then(Value::as_i64)
    else {
        tracing::info!(%mac, "ipxe: unknown node; sent the discovery script");
        return Ok(script(
            mprov_ipxe::discovery_script(&ipxe_url, RETRY_SECS).map_err(unsafe_value)?,
        ));
    };
    let system = st.db.get(kind("systems")?, &system_id.to_string()).await?;
    let hostname = system
        .get("hostname")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if system.get("netboot").and_then(Value::as_bool) == Some(false) {
        return Ok(script(mprov_ipxe::local_boot_script()));
    }
    let Some(image_id) = system.get("image").and_then(Value::as_i64) else {
        return Ok(script(
            mprov_ipxe::retry_script(
                &format!("{hostname} has no image; set one in the inventory"),
                &ipxe_url,
                RETRY_SECS,
            )
            .map_err(unsafe_value)?,
        ));
    };
    let image = st.db.get(kind("images")?, &image_id.to_string()).await?;
    let slug = image
        .get("slug")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let version = image.get("version").and_then(Value::as_i64).unwrap_or(1);
    let mut server = None;
    for id in image
        .get("jobservers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_i64)
    {
        let js = st.db.get(kind("jobservers")?, &id.to_string()).await?;
        let addr = js
            .get("addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let Some(addr) = addr {
            let port = js
                .get("port")
                .and_then(Value::as_i64)
                .and_then(|p| u16::try_from(p).ok());
            server = Some(jobserver_base_url(&addr, port));
            break;
        }
    }
    let Some(server) = server else {
        return Ok(script(
            mprov_ipxe::retry_script(
                &format!("image {slug} version {version} is on no job server yet"),
                &ipxe_url,
                RETRY_SECS,
            )
            .map_err(unsafe_value)?,
        ));
    };
    let nonce = crate::enroll::mint_nonce(&st.db, system_id).await?;
    let fingerprint = st
        .ca_fingerprint
        .as_deref()
        .ok_or_else(|| ApiError::Internal("no CA certificate to pin".into()))?;
    let args = vec![
        format!("mprov_enroll={nonce}"),
        format!("mprov_ca={fingerprint}"),
        format!("mprov_url={}", st.config.public_url),
        format!("mprov_image={slug}:{version}"),
    ];
    let kernel = image_file_url(&server, slug, version, ImageFile::Kernel);
    let initrd = image_file_url(&server, slug, version, ImageFile::Initramfs);
    tracing::info!(%hostname, %mac, image = %slug, version, "ipxe: boot script with a fresh enrollment nonce");
    Ok(script(
        mprov_ipxe::boot_script(&mprov_ipxe::Boot {
            hostname: &hostname,
            kernel_url: &kernel,
            initrd_url: &initrd,
            args: &args,
        })
        .map_err(unsafe_value)?,
    ))
}
