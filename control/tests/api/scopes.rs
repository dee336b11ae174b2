//! Every endpoint against every identity: the expected allow or deny is
//! written here from the scope rules, independently of
//! `http::scope`, and every disagreement is a violation. Bodies are chosen so
//! that an allowed request fails validation (400/404) instead of changing
//! anything, which keeps the walk free of side effects.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use mprov_api::boot::ImageFile;
use mprov_control::db::Engine;
use mprov_control::http::{self, AppState};
use rcgen::{CertificateParams, DistinguishedName, KeyPair};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use crate::boot::compute_url;
use crate::common::{Ctx, VERSION, config, inner};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Anonymous,
    Admin,
    NodeA,
    NodeB,
    JobServer,
    Revoked,
    Shared,
}

/// How a request is authenticated.
#[derive(Clone)]
pub(crate) enum Cred {
    None,
    Key(String),
    Cert(Vec<u8>),
}

pub(crate) fn csr() -> String {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name = DistinguishedName::new();
    p.serialize_request(&key).unwrap().pem().unwrap()
}

/// An anonymous GET of the /ipxe/ script for `mac`.
pub(crate) async fn ipxe(app: &axum::Router, mac: &str) -> (StatusCode, Value) {
    send(app, "GET", &format!("/ipxe/?mac={mac}"), &Cred::None, None).await
}

pub(crate) async fn send(
    app: &axum::Router,
    method: &str,
    path: &str,
    cred: &Cred,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(VERSION, mprov_api::api_version());
    if let Cred::Key(k) = cred {
        req = req.header(header::AUTHORIZATION, format!("Api-Key {k}"));
    }
    let body = match body {
        Some(v) => {
            req = req.header(header::CONTENT_TYPE, "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    let mut req = req.body(body).unwrap();
    // Every request comes from the address a job server leased the node.
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
            NODE_IP, 40_000,
        ))));
    if let Cred::Cert(der) = cred {
        let mut info = axum_server::tls::TlsInfo::default();
        info.peer_certificates = vec![der.clone()];
        req.extensions_mut().insert(Arc::new(info));
    }
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
    assert!(!status.is_server_error(), "{method} {path}: {status} {v}");
    (status, v)
}

/// The address the requests come from.
pub(crate) const NODE_IP: [u8; 4] = [10, 0, 0, 50];

/// A 64-hex rootfs checksum, as publishing an image records.
pub(crate) const SHA: &str = "5e0a0d1c9f2b7e3a4d6c8b0a1f3e5d7c9b1a3f5e7d9c1b3a5f7e9d1c3b5a7f90";

/// What the job server js1 reports when it leases `NODE_IP` to `mac`: the
/// event that lets `/ipxe/` answer that MAC from that address.
pub(crate) async fn attest(c: &Ctx, mac: &str) {
    attest_on(&c.state.db, "js1", mac, NODE_IP.into()).await;
}

/// What job server `jobserver` reports when it leases `ip` to `mac`.
pub(crate) async fn attest_on(
    db: &mprov_control::db::Db,
    jobserver: &str,
    mac: &str,
    ip: std::net::IpAddr,
) {
    let mut q = db.sql();
    q.push("SELECT id FROM jobservers WHERE name = ")
        .bind(mprov_control::db::Val::Text(Some(jobserver.to_owned())));
    let r = q.query().fetch_one(db.pool()).await.unwrap();
    let js = mprov_control::db::int(&r, "id").unwrap();
    let mac = mac.to_ascii_lowercase().replace('-', ":");
    let mut q = db.sql();
    q.push("SELECT system_id FROM network_interfaces WHERE mac = ")
        .bind(mprov_control::db::Val::Text(Some(mac.clone())));
    let system = q
        .query()
        .fetch_optional(db.pool())
        .await
        .unwrap()
        .map(|r| mprov_control::db::int(&r, "system_id").unwrap());
    mprov_control::boot::record(
        db,
        mprov_control::boot::NewEvent {
            system_id: system,
            mac: Some(mac),
            phase: mprov_api::boot::BootPhase::DhcpAcked,
            source: format!("jobserver:{jobserver}"),
            jobserver_id: Some(js),
            ip: Some(ip),
            detail: String::new(),
        },
    )
    .await
    .unwrap();
}

pub(crate) fn der_of(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// Enrolls job server `name` with a fresh token; its certificate (DER).
pub(crate) async fn enroll_jobserver(c: &Ctx, name: &str) -> Vec<u8> {
    let token = c.post("enroll-tokens", json!({"name": name})).await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, v) = send(
        &c.app,
        "POST",
        "/enroll/jobserver/",
        &Cred::None,
        Some(json!({"token": token, "name": name, "csr": csr()})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    der_of(v["certificate"].as_str().unwrap())
}

/// Enrolls a node through /ipxe/ and /enroll/node/; its certificate (DER).
pub(crate) async fn enroll_node(c: &Ctx, mac: &str) -> Vec<u8> {
    attest(c, mac).await;
    let app = &c.app;
    let (status, script) = ipxe(app, mac).await;
    assert_eq!(status, StatusCode::OK, "{script}");
    let script = script.as_str().unwrap().to_owned();
    let nonce = script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("mprov_enroll="))
        .unwrap_or_else(|| panic!("no nonce in {script}"))
        .to_owned();
    let (status, v) = send(
        app,
        "POST",
        "/enroll/node/",
        &Cred::None,
        Some(json!({"nonce": nonce, "csr": csr()})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    der_of(v["certificate"].as_str().unwrap())
}

/// `c`'s state and CA under `--shared-key-mode mode`.
fn with_mode(c: &Ctx, mode: &str) -> http::Inner {
    let cfg = config(&c.db.url, &["--shared-key-mode", mode]);
    inner(c.state.db.clone(), Arc::new(cfg)).with_ca(c.state.ca_pem.clone().unwrap())
}

pub(crate) async fn ctx_with_signer(engine: Engine) -> (Ctx, tempfile::TempDir) {
    let c = Ctx::new(engine).await;
    let tls = tempfile::tempdir().unwrap();
    let signer =
        mprov_control::pki::SignerClient::in_process(&tls.path().join("tls"), "mpcc").unwrap();
    let ca = signer.ca_pem().to_owned();
    let c = Ctx::serving(
        inner(c.state.db.clone(), c.state.config.clone())
            .with_ca(ca)
            .with_signer(signer),
        c.key,
        c.db,
    );
    (c, tls)
}

/// The expected outcome, from the rules in the issue: `true` = allowed.
fn expected(who: Who, mode: &str, method: &str, path: &str, ids: &Ids) -> bool {
    let read = method == "GET";
    let public = matches!(path, "/api/v1/openapi.json" | "/ca.crt")
        || path.starts_with("/ipxe/")
        || path == "/enroll/jobserver/"
        || path == "/enroll/node/";
    let private = ["apikeys", "users", "enroll-tokens", "credentials"]
        .iter()
        .any(|k| path.starts_with(&format!("/api/v1/{k}")));
    let node_self = |host: &str, id: i64, nic: i64, bmc: i64| {
        let own_system = [
            format!("/api/v1/systems/{host}"),
            format!("/api/v1/systems/{id}"),
        ];
        // A node writes none of the inventory's fields (the field walk
        // below checks each one); the bodies here name an unknown field.
        let reads = [
            format!("/api/v1/systems/{host}/config"),
            format!("/api/v1/nics/{nic}"),
            format!("/api/v1/bmcs/{bmc}"),
            format!("/api/v1/nics/?system={host}"),
            format!("/api/v1/bmcs/?system={id}"),
        ];
        method == "GET" && own_system.iter().chain(reads.iter()).any(|p| p == path)
    };
    // Claiming and hosting are a job server's own, with its certificate:
    // not even an admin's (nobody else can say which job server it is).
    if path == mprov_api::jobs::CLAIM_PATH || path == mprov_api::jobs::HOSTING_PATH {
        return who == Who::JobServer;
    }
    // The script-runner's calls (issue 23): a node its own post-boot plan
    // (naming no system) and results; a job server image-gen plans and any
    // content; admins read any plan and content and queue runs; nobody else
    // reports results.
    let runner = path.starts_with(mprov_api::scripts::PLAN_PATH)
        || (path.starts_with("/api/v1/scripts/") && path.ends_with("/content"))
        || path == mprov_api::scripts::RESULTS_PATH
        || path.ends_with("/run-scripts");
    if runner {
        let admin = who == Who::Admin || (who == Who::Shared && mode == "all");
        let node = matches!(who, Who::NodeA | Who::NodeB);
        let js = who == Who::JobServer;
        return if path.ends_with("/run-scripts") {
            admin
        } else if path == mprov_api::scripts::RESULTS_PATH {
            node
        } else if path.contains("mode=image-gen") || path.ends_with("/content") {
            admin || js
        } else if path.contains("system=") {
            admin
        } else {
            admin || node
        };
    }
    // Renewal is for the holder of an agent certificate only.
    if path == "/enroll/renew/" {
        return matches!(who, Who::NodeA | Who::NodeB | Who::JobServer);
    }
    match who {
        Who::Anonymous => public,
        Who::Admin => true,
        // A revoked certificate is refused before anything else.
        Who::Revoked => false,
        Who::NodeA => public || node_self("c01", ids.a, ids.nic_a, ids.bmc_a),
        Who::NodeB => public || node_self("c02", ids.b, ids.nic_b, ids.bmc_b),
        Who::JobServer => {
            public
                || (path.starts_with("/api/v1/") && !private && read)
                || (method == "PATCH" && path == format!("/api/v1/jobs/{}", ids.own_job))
                || (matches!(method, "PUT" | "DELETE")
                    && path == "/api/v1/images/no-such-image/hosts/js1")
        }
        Who::Shared => match mode {
            "all" => true,
            "off" => public,
            _ => {
                public
                    || node_self("c01", ids.a, ids.nic_a, ids.bmc_a)
                    || node_self("c02", ids.b, ids.nic_b, ids.bmc_b)
            }
        },
    }
}

struct Ids {
    a: i64,
    b: i64,
    nic_a: i64,
    nic_b: i64,
    bmc_a: i64,
    bmc_b: i64,
    own_job: i64,
    other_job: i64,
}

/// Every endpoint: (method, path, body).
fn endpoints(ids: &Ids) -> Vec<(&'static str, String, Option<Value>)> {
    let bad = json!({"no_such_field": 1});
    let mut out: Vec<(&'static str, String, Option<Value>)> = vec![
        ("GET", "/api/v1/".into(), None),
        ("GET", "/api/v1/openapi.json".into(), None),
        ("GET", "/api/v1/revision".into(), None),
        ("GET", "/api/v1/bootconfig".into(), None),
        ("GET", "/ca.crt".into(), None),
        ("GET", "/ipxe/?mac=aa:bb:cc:00:00:99".into(), None),
        // Wrong types: an allowed request fails to parse (4xx, not 401/403).
        (
            "POST",
            "/enroll/jobserver/".into(),
            Some(json!({"token": 1})),
        ),
        ("POST", "/enroll/node/".into(), Some(json!({"nonce": 1}))),
        (
            "POST",
            "/enroll/renew/".into(),
            Some(json!({"csr": "not a csr"})),
        ),
        (
            "POST",
            "/api/v1/enroll-tokens/".into(),
            Some(json!({"hours": 0})),
        ),
        ("GET", "/api/v1/systems/c01/config".into(), None),
        ("GET", "/api/v1/systems/c02/config".into(), None),
        ("GET", "/api/v1/nics/?system=c01".into(), None),
        // Allowed, and changing nothing: no job of that module, no such
        // image.
        (
            "POST",
            mprov_api::jobs::CLAIM_PATH.into(),
            Some(json!({"modules": ["no-such-module"]})),
        ),
        (
            "POST",
            mprov_api::jobs::HOSTING_PATH.into(),
            Some(json!({"image": "no-such-image", "version": 1})),
        ),
        (
            "GET",
            mprov_api::jobs::image_files_path("no-such-image"),
            None,
        ),
        ("GET", mprov_api::jobs::image_files_path("compute"), None),
        ("GET", "/api/v1/nics/?system=c02".into(), None),
        // The script-runner's: allowed requests answer 2xx or 400/404 and
        // change nothing (an empty report writes no event; no such system
        // has a run to queue).
        ("GET", "/api/v1/scripts/plan?mode=post-boot".into(), None),
        (
            "GET",
            "/api/v1/scripts/plan?mode=post-boot&system=c02".into(),
            None,
        ),
        (
            "GET",
            "/api/v1/scripts/plan?mode=image-gen&image=compute".into(),
            None,
        ),
        (
            "GET",
            mprov_api::scripts::content_path("no-such-script"),
            None,
        ),
        (
            "POST",
            mprov_api::scripts::RESULTS_PATH.into(),
            Some(json!({"mode": "post-boot", "outcome": "success", "results": []})),
        ),
        ("POST", mprov_api::scripts::run_path("no-such-system"), None),
        // Retrying a job is an admin's inventory write (no such job: 404).
        ("POST", "/api/v1/jobs/no-such-job/retry".into(), None),
        ("GET", format!("/api/v1/bmcs/?system={}", ids.a), None),
        ("PATCH", "/api/v1/jobservers/js1".into(), Some(bad.clone())),
        ("PATCH", "/api/v1/jobservers/js2".into(), Some(bad.clone())),
        // A field a job server may write, of the wrong type: allowed, then
        // refused by validation (an unknown field is an access refusal).
        (
            "PATCH",
            format!("/api/v1/jobs/{}", ids.own_job),
            Some(json!({"status": 1})),
        ),
        (
            "PATCH",
            format!("/api/v1/jobs/{}", ids.other_job),
            Some(bad.clone()),
        ),
    ];
    let keys = |kind: &str| -> Vec<String> {
        match kind {
            "systems" => vec!["c01".into(), "c02".into(), ids.a.to_string()],
            "nics" => vec![ids.nic_a.to_string(), ids.nic_b.to_string()],
            "bmcs" => vec![ids.bmc_a.to_string(), ids.bmc_b.to_string()],
            _ => vec!["no-such-object".into()],
        }
    };
    for kind in mprov_control::db::kinds::KINDS {
        let base = format!("/api/v1/{}/", kind.name);
        out.push(("GET", base.clone(), None));
        out.push(("POST", base.clone(), Some(bad.clone())));
        out.push(("POST", format!("{base}bulk"), Some(json!([bad.clone()]))));
        for key in keys(kind.name) {
            out.push(("GET", format!("{base}{key}"), None));
            out.push(("PATCH", format!("{base}{key}"), Some(bad.clone())));
            // Deleting a real object would change the walk; only unknown keys.
            if key == "no-such-object" {
                out.push(("DELETE", format!("{base}{key}"), None));
            }
        }
    }
    out
}

/// Job server js1 of network `prov` (10.0.0.0/24, where `NODE_IP` is)
/// hosting image `compute`: the job server and the image.
pub(crate) async fn hosted_image(c: &Ctx) -> (Value, Value) {
    c.post(
        "networks",
        json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 24}),
    )
    .await;
    let js = c
        .post(
            "jobservers",
            json!({"name": "js1", "addresses": ["10.0.0.2"], "network": "prov"}),
        )
        .await;
    let image = c
        .post(
            "images",
            json!({"slug": "compute", "rootfs_sha256": SHA, "rootfs_size": 1000}),
        )
        .await;
    c.patch("/api/v1/images/compute", json!({"jobservers": [js["id"]]}))
        .await;
    (js, image)
}

pub(crate) async fn every_endpoint_with_every_identity(engine: Engine) {
    let (c, tls) = ctx_with_signer(engine).await;
    // Inventory: two nodes with a NIC and a BMC each, an image on job server js1.
    let (js1, image) = hosted_image(&c).await;
    c.post("jobservers", json!({"name": "js2"})).await;
    let mut ids = Ids {
        a: 0,
        b: 0,
        nic_a: 0,
        nic_b: 0,
        bmc_a: 0,
        bmc_b: 0,
        own_job: 0,
        other_job: 0,
    };
    for (host, mac, n) in [
        ("c01", "aa:bb:cc:00:00:01", 0),
        ("c02", "aa:bb:cc:00:00:02", 1),
    ] {
        let s = c
            .post(
                "systems",
                json!({"hostname": host, "image": image["id"], "nics": [{"mac": mac, "network": "prov"}]}),
            )
            .await;
        let id = s["id"].as_i64().unwrap();
        let nic = s["nics"][0]["id"].as_i64().unwrap();
        let bmc = c.post("bmcs", json!({"system": id})).await["id"]
            .as_i64()
            .unwrap();
        if n == 0 {
            (ids.a, ids.nic_a, ids.bmc_a) = (id, nic, bmc);
        } else {
            (ids.b, ids.nic_b, ids.bmc_b) = (id, nic, bmc);
        }
    }
    ids.own_job = c
        .post("jobs", json!({"module": "sync", "jobserver": js1["id"]}))
        .await["id"]
        .as_i64()
        .unwrap();
    ids.other_job = c.post("jobs", json!({"module": "sync"})).await["id"]
        .as_i64()
        .unwrap();

    // Credentials: two nodes, a job server, a revoked node certificate.
    let revoked = enroll_node(&c, "aa:bb:cc:00:00:01").await;
    let node_a = enroll_node(&c, "aa:bb:cc:00:00:01").await;
    let node_b = enroll_node(&c, "aa:bb:cc:00:00:02").await;
    // The unknown MAC the walk asks /ipxe/ for: leased, so it is answered at once.
    attest(&c, "aa:bb:cc:00:00:99").await;
    let jobserver = enroll_jobserver(&c, "js1").await;
    // The shared key made at first start.
    let shared = mprov_control::secrets::new_api_key();
    {
        let db = &c.state.db;
        let mut sql = db.sql();
        sql.push(
            "INSERT INTO api_keys (name, prefix, hash, revoked, created_at, updated_at) VALUES ",
        );
        let now = mprov_control::db::Val::Text(Some("2026-01-01T00:00:00Z".into()));
        sql.bind_list([
            mprov_control::db::Val::Text(Some("local job server".into())),
            mprov_control::db::Val::Text(Some(shared.prefix.clone())),
            mprov_control::db::Val::Text(Some(shared.hash.clone())),
            mprov_control::db::Val::Bool(Some(false)),
            now.clone(),
            now,
        ]);
        sql.query().execute(db.pool()).await.unwrap();
        db.set_setting(
            mprov_control::first_start::SHARED_KEY_SETTING,
            &shared.prefix,
        )
        .await
        .unwrap();
    }

    let mut violations = Vec::new();
    let mut checked = 0;
    for mode in ["all", "nodes", "off"] {
        let state: AppState = Arc::new(with_mode(&c, mode).with_signer(
            mprov_control::pki::SignerClient::in_process(&tls.path().join("tls"), "mpcc").unwrap(),
        ));
        let app = http::router(state);
        let identities: Vec<(Who, Cred)> = if mode == "all" {
            vec![
                (Who::Anonymous, Cred::None),
                (Who::Admin, Cred::Key(c.key.clone())),
                (Who::NodeA, Cred::Cert(node_a.clone())),
                (Who::NodeB, Cred::Cert(node_b.clone())),
                (Who::JobServer, Cred::Cert(jobserver.clone())),
                (Who::Revoked, Cred::Cert(revoked.clone())),
                (Who::Shared, Cred::Key(shared.key.clone())),
            ]
        } else {
            vec![(Who::Shared, Cred::Key(shared.key.clone()))]
        };
        for (who, cred) in &identities {
            for (method, path, body) in endpoints(&ids) {
                let (status, v) = send(&app, method, &path, cred, body).await;
                let denied = status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN;
                checked += 1;
                if denied == expected(*who, mode, method, &path, &ids) {
                    violations.push(format!("{who:?} mode={mode} {method} {path}: {status} {v}"));
                }
            }
        }
    }
    assert!(checked > 300, "walked only {checked} requests");

    // The field dimension: every writable field of a node's own system, NIC
    // and BMC, written by every identity that is not an admin, with the
    // values an attacker would write (`attack_value`). Each must be refused,
    // and nothing may change.
    let before = snapshot_own(&c, &ids).await;
    let mut fields_checked = 0;
    for mode in ["all", "nodes"] {
        let state: AppState = Arc::new(with_mode(&c, mode));
        let app = http::router(state);
        let mut identities: Vec<(Who, Cred)> = vec![(Who::Shared, Cred::Key(shared.key.clone()))];
        if mode == "all" {
            identities = vec![
                (Who::Anonymous, Cred::None),
                (Who::NodeA, Cred::Cert(node_a.clone())),
                (Who::NodeB, Cred::Cert(node_b.clone())),
                (Who::JobServer, Cred::Cert(jobserver.clone())),
                (Who::Revoked, Cred::Cert(revoked.clone())),
            ];
        }
        for (who, cred) in &identities {
            for (kind, key) in [
                ("systems", "c01".to_owned()),
                ("nics", ids.nic_a.to_string()),
                ("bmcs", ids.bmc_a.to_string()),
            ] {
                let k = mprov_control::db::kinds::kind(kind).unwrap();
                let names = k
                    .fields
                    .iter()
                    .map(|f| f.name)
                    .chain(k.m2m.iter().map(|m| m.name))
                    .chain(k.children.iter().map(|ch| ch.name));
                for field in names {
                    let body = json!({ field: attack_value(field, &ids) });
                    let path = format!("/api/v1/{kind}/{key}");
                    let (status, v) = send(&app, "PATCH", &path, cred, Some(body.clone())).await;
                    fields_checked += 1;
                    let refused =
                        status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN;
                    if !refused {
                        violations.push(format!(
                            "{who:?} mode={mode} PATCH {path} {body}: {status} {v}"
                        ));
                    }
                }
            }
        }
    }
    assert!(fields_checked > 100, "walked only {fields_checked} fields");
    assert_eq!(
        snapshot_own(&c, &ids).await,
        before,
        "the field walk changed data"
    );

    // A job server says which images it holds: itself only.
    let js = Cred::Cert(jobserver.clone());
    let (status, _) = send(&c.app, "PUT", "/api/v1/images/compute/hosts/js2", &js, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    c.patch("/api/v1/images/compute", json!({"jobservers": []}))
        .await;
    let (status, v) = send(&c.app, "PUT", "/api/v1/images/compute/hosts/js1", &js, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["jobservers"], json!([js1["id"]]), "{v}");
    let (_, again) = send(&c.app, "PUT", "/api/v1/images/compute/hosts/js1", &js, None).await;
    assert_eq!(
        again["jobservers"],
        json!([js1["id"]]),
        "idempotent: {again}"
    );
    let (status, v) = send(
        &c.app,
        "DELETE",
        "/api/v1/images/compute/hosts/js1",
        &js,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["jobservers"], json!([]), "{v}");
    assert!(
        violations.is_empty(),
        "{} violations of {checked}:\n{}",
        violations.len(),
        violations.join("\n")
    );
    c.cleanup().await;
}

/// What an attacker would write into `field`: another
/// node's id, the control host's names, a shell as init, a new password.
fn attack_value(field: &str, ids: &Ids) -> Value {
    match field {
        "system" => json!(ids.b),
        "hostname" => json!("mpcc"),
        "aliases" => json!(["mpcc", "js1"]),
        "install_kernel_cmdline" => json!("init=/bin/sh"),
        "groups" | "scripts" | "jobservers" => json!([1]),
        "nics" => json!([{"mac": "aa:bb:cc:00:00:02"}]),
        "password" | "username" => json!("attacker"),
        "image" | "network" | "switch_port" | "distro" => json!(1),
        "mac" => json!("aa:bb:cc:00:00:77"),
        "ipv4" => json!("10.0.0.1"),
        "ipv6" => json!("fd00::1"),
        "mtu" => json!(9000),
        "tmpfs_root_size" => json!(1),
        "stateful" | "netboot" | "bootable" | "is_gateway" => json!(false),
        _ => json!("x"),
    }
}

/// Node A's system, NIC and BMC as an admin sees them.
async fn snapshot_own(c: &Ctx, ids: &Ids) -> Vec<Value> {
    let mut out = Vec::new();
    for path in [
        "/api/v1/systems/c01".to_owned(),
        "/api/v1/systems/c02".to_owned(),
        format!("/api/v1/nics/{}", ids.nic_a),
        format!("/api/v1/bmcs/{}", ids.bmc_a),
        "/api/v1/revision".to_owned(),
    ] {
        out.push(c.ok("GET", &path, None).await);
    }
    out
}

/// The nonce from a fresh /ipxe/ script for `mac`.
pub(crate) async fn nonce_for(c: &Ctx, mac: &str) -> String {
    attest(c, mac).await;
    let (status, script) = ipxe(&c.app, mac).await;
    assert_eq!(status, StatusCode::OK, "{script}");
    let script = script.as_str().unwrap().to_owned();
    assert!(script.contains("mprov_ca="), "{script}");
    script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("mprov_enroll="))
        .unwrap_or_else(|| panic!("no nonce in {script}"))
        .to_owned()
}

pub(crate) async fn node_enrollment_refusals(engine: Engine) {
    let (c, _tls) = ctx_with_signer(engine).await;
    let (_, image) = hosted_image(&c).await;
    for (host, mac) in [("c01", "aa:bb:cc:00:00:01"), ("c02", "aa:bb:cc:00:00:02")] {
        c.post(
            "systems",
            json!({"hostname": host, "image": image["id"], "nics": [{"mac": mac, "network": "prov"}]}),
        )
        .await;
    }
    let enroll = |nonce: String, csr: String| {
        let app = c.app.clone();
        async move {
            send(
                &app,
                "POST",
                "/enroll/node/",
                &Cred::None,
                Some(json!({"nonce": nonce, "csr": csr})),
            )
            .await
        }
    };
    let csr_named = |cn: &str, ca: bool| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        if ca {
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        }
        p.serialize_request(&key).unwrap().pem().unwrap()
    };

    // Without the job server's lease report, the same retry script for a
    // known and an unknown MAC, and no nonce.
    let (_, unattested) = ipxe(&c.app, "aa:bb:cc:00:00:01").await;
    let (_, unknown) = ipxe(&c.app, "aa:bb:cc:00:00:98").await;
    assert_eq!(unattested, unknown);
    let unattested = unattested.as_str().unwrap();
    assert!(
        unattested.contains("waiting for the job server") && !unattested.contains("mprov_enroll"),
        "{unattested}"
    );
    // The script: kernel and the image's agent initramfs from js1 on the
    // port mprov-jobserver serves, the nonce and the CA pin.
    attest(&c, "aa:bb:cc:00:00:01").await;
    let (_, script) = ipxe(&c.app, "AA-BB-CC-00-00-01").await;
    let script = script.as_str().unwrap();
    assert!(
        script.contains(&format!(
            "kernel {} initrd=initramfs.img",
            compute_url("10.0.0.2", ImageFile::Kernel)
        )),
        "{script}"
    );
    assert!(
        script.contains(&format!(
            "initrd {}",
            compute_url("10.0.0.2", ImageFile::Initramfs)
        )),
        "{script}"
    );
    let fp = script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("mprov_ca="))
        .unwrap();
    assert_eq!(fp.len(), 64);
    // Unknown node: the discovery script; not netbooting: local boot.
    attest(&c, "aa:bb:cc:00:00:99").await;
    attest(&c, "aa:bb:cc:00:00:02").await;
    let (_, d) = ipxe(&c.app, "aa:bb:cc:00:00:99").await;
    assert!(d.as_str().unwrap().contains("not in the inventory"), "{d}");
    c.patch("/api/v1/systems/c02", json!({"netboot": false}))
        .await;
    let (_, l) = ipxe(&c.app, "aa:bb:cc:00:00:02").await;
    assert!(l.as_str().unwrap().contains("\nexit\n"), "{l}");
    c.patch("/api/v1/systems/c02", json!({"netboot": true}))
        .await;
    let (status, _) = send(&c.app, "GET", "/ipxe/", &Cred::None, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no mac");

    // A CSR for another node's name, or asking for CA rights: refused, and
    // the nonce is still good afterwards.
    let nonce = nonce_for(&c, "aa:bb:cc:00:00:01").await;
    let (status, v) = enroll(nonce.clone(), csr_named("c02", false)).await;
    assert!(
        status == StatusCode::BAD_REQUEST && v["message"].as_str().unwrap().contains("c02"),
        "{status} {v}"
    );
    let (status, v) = enroll(nonce.clone(), csr_named("c01", true)).await;
    assert!(
        status == StatusCode::BAD_REQUEST && v["message"].as_str().unwrap().contains("CA rights"),
        "{status} {v}"
    );
    let (status, v) = enroll(nonce.clone(), csr_named("c01", false)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let der = der_of(v["certificate"].as_str().unwrap());
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let cn: Vec<_> = cert
        .subject()
        .iter_common_name()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        cn,
        ["c01"],
        "a nonce minted for c01 gives a certificate for c01 only"
    );
    // Replayed.
    let (status, v) = enroll(nonce, csr()).await;
    assert!(
        status == StatusCode::UNAUTHORIZED
            && v["message"].as_str().unwrap().contains("already used"),
        "{status} {v}"
    );
    // Unknown.
    let (status, v) = enroll("not-a-nonce".into(), csr()).await;
    assert!(
        status == StatusCode::UNAUTHORIZED && v["message"].as_str().unwrap().contains("not valid"),
        "{status} {v}"
    );
    // Expired.
    let old = nonce_for(&c, "aa:bb:cc:00:00:02").await;
    {
        let db = &c.state.db;
        let mut sql = db.sql();
        sql.push("UPDATE enroll_nonces SET expires_at = ");
        sql.bind(mprov_control::db::Val::Text(Some(
            "2000-01-01T00:00:00Z".into(),
        )));
        sql.push(" WHERE used_at IS NULL");
        sql.query().execute(db.pool()).await.unwrap();
    }
    let (status, v) = enroll(old, csr()).await;
    assert!(
        status == StatusCode::UNAUTHORIZED && v["message"].as_str().unwrap().contains("expired"),
        "{status} {v}"
    );

    // Renewal over mTLS: a new certificate, the old one revoked.
    let (status, v) = send(
        &c.app,
        "POST",
        "/enroll/renew/",
        &Cred::Cert(der.clone()),
        Some(json!({"csr": csr()})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let renewed = der_of(v["certificate"].as_str().unwrap());
    let (status, _) = send(&c.app, "GET", "/api/v1/systems/c01", &Cred::Cert(der), None).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the renewed-away certificate is revoked"
    );
    let (status, me) = send(
        &c.app,
        "GET",
        "/api/v1/systems/c01",
        &Cred::Cert(renewed),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{me}");
    c.cleanup().await;
}
