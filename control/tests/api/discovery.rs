//! Discovery against the service over HTTP, on every engine: an attested
//! unknown MAC gets the discovery boot with a one-time nonce; its report is
//! matched by switch port and bound or parked as the policy says; a
//! recabled known MAC warns on the timeline and is never rebound; every
//! attack on the nonce is refused with nothing stored; an admin assigns a
//! parked node and its next `/ipxe/` is a normal boot.

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use mprov_api::boot::{EVENTS_PATH, ImageFile};
use mprov_api::nads::{NONCE_HEADER, NONCE_PARAM, REPORT_PATH};
use mprov_control::db::{Engine, Val};
use serde_json::{Value, json};

use crate::boot::compute_url;
use crate::common::{Ctx, VERSION, inner};
use crate::scopes::{Cred, NODE_IP, attest, csr, hosted_image, ipxe, send};

/// Unknown MACs.
const U1: &str = "52:54:00:d1:00:01";
const U2: &str = "52:54:00:d1:00:02";
const U3: &str = "52:54:00:d1:00:03";
/// c02's MAC.
const M2: &str = "52:54:00:c0:00:02";

/// A service with a signer and CA, discovery policy `policy` and discovery
/// image `compute` (hosted by js1 on `prov`); switch `sw1` with ports
/// Ethernet1/1 (c01's eno1, no MAC), Ethernet1/2 (c02's eno1, MAC [`M2`])
/// and Ethernet1/3 (c03's eno1, no MAC).
async fn service(engine: Engine, policy: &str) -> (Ctx, tempfile::TempDir) {
    let c = Ctx::with_args(
        engine,
        &["--discovery-policy", policy, "--discovery-image", "compute"],
    )
    .await;
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
    hosted_image(&c).await;
    c.post(
        "switches",
        json!({"hostname": "sw1", "mgmt_mac": "00:11:22:33:44:55"}),
    )
    .await;
    for (n, host, mac) in [(1, "c01", None), (2, "c02", Some(M2)), (3, "c03", None)] {
        let port = c
            .post(
                "switchports",
                json!({"switch": "sw1", "name": format!("Ethernet1/{n}")}),
            )
            .await;
        c.post(
            "systems",
            json!({"hostname": host, "image": "compute",
                "nics": [{"name": "eno1", "mac": mac, "network": "prov", "bootable": true,
                    "switch_port": port["id"]}]}),
        )
        .await;
    }
    (c, tls)
}

/// `/ipxe/` for the attested unknown `mac`: the discovery boot; its nonce.
async fn discovery_nonce(c: &Ctx, mac: &str) -> String {
    attest(c, mac).await;
    let (status, script) = ipxe(&c.app, mac).await;
    assert_eq!(status, StatusCode::OK, "{script}");
    let script = script.as_str().unwrap().to_owned();
    assert!(
        script.contains(&format!(
            "kernel {} initrd=initramfs.img ",
            compute_url("10.0.0.2", ImageFile::Kernel)
        )) && script.contains(&format!(
            "initrd {}",
            compute_url("10.0.0.2", ImageFile::Initramfs)
        )),
        "the discovery image's kernel and initramfs from js1: {script}"
    );
    for arg in ["mprov_ca=", "mprov_url=", &format!("mprov_mac={mac}")] {
        assert!(script.contains(arg), "{arg} missing: {script}");
    }
    assert!(
        !script.contains("mprov_enroll") && !script.contains("mprov_image"),
        "a discovery boot enrolls nothing and streams no image: {script}"
    );
    script
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{NONCE_PARAM}=")))
        .unwrap_or_else(|| panic!("no discovery nonce in {script}"))
        .to_owned()
}

/// A report from `mac` that heard sw1's `port`.
fn heard_on(mac: &str, port: &str) -> Value {
    json!({
        "boot_mac": mac,
        "links": [{
            "interface": "eth0",
            "mac": mac,
            "neighbour": {
                "chassis_id": "00:11:22:33:44:55",
                "chassis_id_subtype": "mac-address",
                "port_id": port,
                "port_id_subtype": "interface-name",
                "system_name": "sw1",
                "port_description": null,
                "management_addresses": ["10.0.9.1"],
                "vlan": 1
            }
        }, {
            "interface": "eth1",
            "mac": "52:54:00:ff:ff:ff",
            "neighbour": null
        }],
        "hardware": {"vendor": "QEMU", "model": "Standard PC", "serial": null}
    })
}

/// `POST REPORT_PATH` with `nonce` (if any) and the raw `body`.
async fn post_report(c: &Ctx, nonce: Option<&str>, body: &str) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method("POST")
        .uri(REPORT_PATH)
        .header(VERSION, mprov_api::api_version())
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(n) = nonce {
        req = req.header(NONCE_HEADER, n);
    }
    let mut req = req.body(Body::from(body.to_owned())).unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
            NODE_IP, 40_000,
        ))));
    c.send(req).await
}

async fn report(c: &Ctx, nonce: &str, body: &Value) -> (StatusCode, Value) {
    post_report(c, Some(nonce), &body.to_string()).await
}

/// The MAC of `host`'s eno1.
async fn nic_mac(c: &Ctx, host: &str) -> Option<String> {
    let v = c
        .ok("GET", &format!("/api/v1/nics/?system={host}"), None)
        .await;
    v["items"][0]["mac"].as_str().map(str::to_owned)
}

/// The parked nodes' MACs.
async fn parked(c: &Ctx) -> Vec<String> {
    let v = c.ok("GET", "/api/v1/discovery/", None).await;
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["mac"].as_str().unwrap().to_owned())
        .collect()
}

/// What `/ipxe/` answers `mac` now (attested): a normal boot of `host`.
async fn boots_normally(c: &Ctx, mac: &str, host: &str) {
    attest(c, mac).await;
    let (status, script) = ipxe(&c.app, mac).await;
    assert_eq!(status, StatusCode::OK, "{script}");
    let script = script.as_str().unwrap();
    assert!(
        script.contains(&format!("echo mProv: booting {host}"))
            && script.contains("mprov_enroll=")
            && script.contains("mprov_image=compute:1")
            && !script.contains(NONCE_PARAM),
        "a normal boot of {host}: {script}"
    );
}

/// The details of `host`'s boot events.
async fn timeline(c: &Ctx, host: &str) -> Vec<String> {
    let (status, v) = send(
        &c.app,
        "GET",
        &format!("{EVENTS_PATH}?system={host}&boot=all"),
        &Cred::Key(c.key.clone()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| format!("{} {}", e["phase"], e["detail"]))
        .collect()
}

async fn count(c: &Ctx, table: &str) -> i64 {
    let db = &c.state.db;
    let mut q = db.sql();
    q.push(&format!("SELECT COUNT(*) AS n FROM {table}"));
    let r = q.query().fetch_one(db.pool()).await.unwrap();
    mprov_control::db::int(&r, "n").unwrap()
}

/// `manual` parks a match (naming it) and leaves the inventory alone; the
/// admin assigns it through the API, and its next `/ipxe/` is a normal boot.
pub(crate) async fn manual_parks_and_an_admin_assigns(engine: Engine) {
    let (c, _tls) = service(engine, "manual").await;
    let nonce = discovery_nonce(&c, U1).await;
    let rev = c.revision().await;
    let (status, v) = report(&c, &nonce, &heard_on(U1, "Eth1/1")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["outcome"], "parked", "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("c01 eno1")
            && v["reason"].as_str().unwrap().contains("policy manual"),
        "{v}"
    );
    assert_eq!(nic_mac(&c, "c01").await, None);
    assert_eq!(c.revision().await, rev, "nothing in the inventory changed");
    let list = c.ok("GET", "/api/v1/discovery/", None).await;
    let p = &list["items"][0];
    assert_eq!(p["mac"], U1, "{list}");
    assert_eq!(p["candidate"]["hostname"], "c01", "{list}");
    assert_eq!(
        p["report"]["hardware"]["vendor"], "QEMU",
        "the whole report: {list}"
    );
    assert_eq!(p["report"]["links"][0]["neighbour"]["port_id"], "Eth1/1");
    // Still unknown: the next /ipxe/ is discovery again, with a new nonce.
    let again = discovery_nonce(&c, U1).await;
    assert_ne!(again, nonce);

    // Bad assignments change nothing.
    for (body, status) in [
        (json!({"system": "c01"}), StatusCode::BAD_REQUEST),
        (
            json!({"system": "c09", "nic": "eno1"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"system": "c01", "nic": "eno9"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"system": "c02", "nic": "eno1"}),
            StatusCode::CONFLICT,
        ),
    ] {
        let (got, v) = c
            .call(
                "POST",
                &format!("/api/v1/discovery/{U1}/assign"),
                Some(body.clone()),
            )
            .await;
        assert_eq!(got, status, "{body}: {v}");
    }
    let (got, _) = c
        .call(
            "POST",
            &format!("/api/v1/discovery/{U2}/assign"),
            Some(json!({"system": "c01", "nic": "eno1"})),
        )
        .await;
    assert_eq!(got, StatusCode::NOT_FOUND, "U2 is not parked");
    assert_eq!(parked(&c).await, [U1]);

    let v = c
        .ok(
            "POST",
            &format!(
                "/api/v1/discovery/{}/assign",
                U1.to_uppercase().replace(':', "-")
            ),
            Some(json!({"system": "c01", "nic": "eno1"})),
        )
        .await;
    assert_eq!(
        (v["mac"].as_str(), v["hostname"].as_str()),
        (Some(U1), Some("c01")),
        "{v}"
    );
    assert_eq!(nic_mac(&c, "c01").await.as_deref(), Some(U1));
    assert!(c.revision().await > rev, "the boot config follows");
    assert!(parked(&c).await.is_empty());
    boots_normally(&c, U1, "c01").await;
    c.cleanup().await;
}

/// `open` binds a MAC to a matched NIC without one (the next `/ipxe/` is
/// a normal boot), parks a match whose NIC has one, and parks what matches
/// no port.
pub(crate) async fn open_binds_a_free_port(engine: Engine) {
    let (c, _tls) = service(engine, "open").await;
    let nonce = discovery_nonce(&c, U1).await;
    let rev = c.revision().await;
    let (status, v) = report(&c, &nonce, &heard_on(U1, "Ethernet1/1")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v, json!({"outcome": "matched", "hostname": "c01"}));
    assert_eq!(nic_mac(&c, "c01").await.as_deref(), Some(U1));
    assert!(c.revision().await > rev, "the boot config follows");
    assert!(parked(&c).await.is_empty());
    boots_normally(&c, U1, "c01").await;

    // c02's NIC has a MAC: open does not replace it.
    let nonce = discovery_nonce(&c, U2).await;
    let (_, v) = report(&c, &nonce, &heard_on(U2, "Ethernet1/2")).await;
    assert_eq!(v["outcome"], "parked", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("policy open"), "{v}");
    assert_eq!(nic_mac(&c, "c02").await.as_deref(), Some(M2));
    // A port no NIC is cabled to.
    let nonce = discovery_nonce(&c, U3).await;
    let (_, v) = report(&c, &nonce, &heard_on(U3, "Ethernet1/40")).await;
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("no NIC in the inventory"),
        "{v}"
    );
    assert_eq!(parked(&c).await, [U2, U3]);
    // Keyset pages.
    let page = c.ok("GET", "/api/v1/discovery/?limit=1", None).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    let next = page["next"].as_i64().expect("a next page");
    let page = c
        .ok(
            "GET",
            &format!("/api/v1/discovery/?limit=1&after={next}"),
            None,
        )
        .await;
    assert_eq!(page["items"][0]["mac"], U3, "{page}");
    assert!(page["next"].is_null(), "{page}");
    let (status, _) = c.call("GET", "/api/v1/discovery/?limit=0", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // Dismissed: gone from the list.
    let (status, _) = c
        .call("DELETE", &format!("/api/v1/discovery/{U3}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = c
        .call("DELETE", &format!("/api/v1/discovery/{U3}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(parked(&c).await, [U2]);
    c.cleanup().await;
}

/// `permissive` replaces a matched NIC's MAC, with the warning on the
/// system's timeline.
pub(crate) async fn permissive_replaces_with_a_warning(engine: Engine) {
    let (c, _tls) = service(engine, "permissive").await;
    let nonce = discovery_nonce(&c, U2).await;
    let (status, v) = report(&c, &nonce, &heard_on(U2, "Ethernet1/2")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v, json!({"outcome": "matched", "hostname": "c02"}));
    assert_eq!(nic_mac(&c, "c02").await.as_deref(), Some(U2));
    let events = timeline(&c, "c02").await;
    assert!(
        events
            .iter()
            .any(|e| e.contains("replaced the MAC of c02 eno1") && e.contains(M2)),
        "{events:?}"
    );
    boots_normally(&c, U2, "c02").await;
    c.cleanup().await;
}

/// A MAC the inventory holds, heard on another port than its NIC's, is not
/// rebound under `open` or `permissive`: the node is parked and the warning
/// is on the holder's timeline.
pub(crate) async fn recabled_mac_warns_and_is_not_rebound(engine: Engine) {
    for policy in ["open", "permissive"] {
        let (c, _tls) = service(engine, policy).await;
        // U3 boots discovery while unknown; then the inventory gets it on
        // c03 (Ethernet1/3), and the node reports hearing Ethernet1/1.
        let nonce = discovery_nonce(&c, U3).await;
        let nic = c.ok("GET", "/api/v1/nics/?system=c03", None).await["items"][0]["id"].clone();
        c.patch(&format!("/api/v1/nics/{nic}"), json!({"mac": U3}))
            .await;
        let rev = c.revision().await;
        let (status, v) = report(&c, &nonce, &heard_on(U3, "Ethernet1/1")).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["outcome"], "parked", "{policy}: {v}");
        assert!(v["reason"].as_str().unwrap().contains("recabled"), "{v}");
        assert_eq!(nic_mac(&c, "c01").await, None, "{policy}: c01 not bound");
        assert_eq!(nic_mac(&c, "c03").await.as_deref(), Some(U3));
        assert_eq!(c.revision().await, rev, "{policy}: nothing rebound");
        let events = timeline(&c, "c03").await;
        assert!(
            events.iter().any(|e| e.starts_with("\"failed\"")
                && e.contains("recabled")
                && e.contains("switch sw1 port Ethernet1/3")
                && e.contains("switch sw1 port Ethernet1/1")),
            "{policy}: {events:?}"
        );
        c.cleanup().await;
    }
}

/// Every attack on the discovery nonce is refused, with nothing stored: no
/// nonce, a wrong one, a used one, an expired one, one for another MAC, the
/// discovery nonce at the enrollment endpoint or as an API key; a body that
/// is not a report is a 400 that spends nothing.
pub(crate) async fn nonce_attacks_are_refused(engine: Engine) {
    let (c, _tls) = service(engine, "open").await;
    let n1 = discovery_nonce(&c, U1).await;
    let n2 = discovery_nonce(&c, U2).await;
    let body = heard_on(U1, "Ethernet1/1");
    let rev = c.revision().await;

    let (status, v) = post_report(&c, None, &body.to_string()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "no nonce: {v}");
    let (status, v) = post_report(&c, Some("  "), &body.to_string()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "an empty nonce: {v}");
    let (status, v) = report(&c, "not-a-nonce-at-all-000000", &body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a wrong nonce: {v}");
    // U2's nonce for U1's report.
    let (status, v) = report(&c, &n2, &body).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "another MAC's nonce: {v}");
    // The discovery nonce at the enrollment endpoint and as credentials.
    let (status, v) = send(
        &c.app,
        "POST",
        "/enroll/node/",
        &Cred::None,
        Some(json!({"nonce": n1, "csr": csr()})),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "enrollment: {v}");
    let (status, _) = send(
        &c.app,
        "GET",
        "/api/v1/systems/",
        &Cred::Key(n1.clone()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let mut req = Request::builder()
        .uri("/api/v1/systems/")
        .header(VERSION, mprov_api::api_version())
        .header(NONCE_HEADER, &n1)
        .body(Body::empty())
        .unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
            NODE_IP, 40_000,
        ))));
    let (status, _) = c.send(req).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the header is no credential elsewhere"
    );
    // Bodies that are not a report: 400 saying why, nothing spent.
    for bad in [
        "{",
        "[]",
        r#"{"boot_mac": 7}"#,
        r#"{"boot_mac": "x", "links": [], "hardware": {}}"#,
    ] {
        let (status, v) = post_report(&c, Some(&n1), bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    assert_eq!(count(&c, "discovered_nodes").await, 0, "nothing parked");
    assert_eq!(nic_mac(&c, "c01").await, None, "nothing bound");
    assert_eq!(c.revision().await, rev);

    // The good report; then its replay.
    let (status, v) = report(&c, &n1, &body).await;
    assert_eq!(
        (status, v["outcome"].as_str()),
        (StatusCode::OK, Some("matched")),
        "{v}"
    );
    let (status, v) = report(&c, &n1, &heard_on(U1, "Ethernet1/3")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a replay: {v}");
    assert!(
        v["message"].as_str().unwrap().contains("already used"),
        "{v}"
    );
    assert_eq!(nic_mac(&c, "c03").await, None, "the replay bound nothing");
    // U2's nonce, expired: refused, nothing parked.
    let db = &c.state.db;
    let mut q = db.sql();
    q.push("UPDATE discovery_nonces SET expires_at = ")
        .bind(Val::Text(Some("2000-01-01T00:00:00Z".into())))
        .push(" WHERE mac = ")
        .bind(Val::Text(Some(U2.into())));
    q.query().execute(db.pool()).await.unwrap();
    let (status, v) = report(&c, &n2, &heard_on(U2, "Ethernet1/2")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "expired: {v}");
    assert!(v["message"].as_str().unwrap().contains("expired"), "{v}");
    assert_eq!(count(&c, "discovered_nodes").await, 0);
    // A newer boot cancels the older nonce.
    let old = discovery_nonce(&c, U3).await;
    let new = discovery_nonce(&c, U3).await;
    let (status, _) = report(&c, &old, &heard_on(U3, "Ethernet1/3")).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "cancelled by the newer boot"
    );
    let (status, v) = report(&c, &new, &heard_on(U3, "Ethernet1/3")).await;
    assert_eq!(
        (status, v["hostname"].as_str()),
        (StatusCode::OK, Some("c03")),
        "{v}"
    );
    c.cleanup().await;
}

/// Without a discovery image, an unknown MAC gets the old script (add it
/// to the inventory) and no nonce is minted.
pub(crate) async fn without_a_discovery_image_no_nonce(engine: Engine) {
    let c = Ctx::new(engine).await;
    hosted_image(&c).await;
    attest(&c, U1).await;
    let (status, script) = ipxe(&c.app, U1).await;
    assert_eq!(status, StatusCode::OK);
    let script = script.as_str().unwrap();
    assert!(script.contains("is not in the inventory"), "{script}");
    assert!(!script.contains(NONCE_PARAM), "{script}");
    assert_eq!(count(&c, "discovery_nonces").await, 0);
    c.cleanup().await;
}

/// The admin page lists a parked node with what it reported and an assign
/// form; a read-only user sees no form and a forged post (with the
/// session's own CSRF token) is refused; an admin's post assigns it, and a
/// post without the token is refused.
pub(crate) async fn page_lists_and_assigns(engine: Engine) {
    use crate::pages::{add_user, get, post, sign_in};
    let (c, _tls) = service(engine, "manual").await;
    let nonce = discovery_nonce(&c, U1).await;
    report(&c, &nonce, &heard_on(U1, "Ethernet1/1")).await;
    add_user(&c, "viewer", "look but do not touch", false).await;
    add_user(&c, "ada", "correct horse battery", true).await;

    let viewer = sign_in(&c, "viewer", "look but do not touch").await;
    let seen = get(&c, "/admin/discovery/", Some(&viewer)).await;
    assert_eq!(seen.status, StatusCode::OK, "{}", seen.body);
    assert!(
        seen.body.contains(U1)
            && seen
                .body
                .contains("eth0 (52:54:00:d1:00:01): sw1 port Ethernet1/1")
            && seen
                .body
                .contains("eth1 (52:54:00:ff:ff:ff): nothing heard")
            && seen.body.contains("QEMU Standard PC")
            && seen.body.contains("policy manual"),
        "{}",
        seen.body
    );
    assert!(
        !seen.body.contains(&format!("/admin/discovery/{U1}/assign")),
        "no form to read-only users"
    );
    let csrf = seen.hidden("csrf");
    let forged = post(
        &c,
        &format!("/admin/discovery/{U1}/assign"),
        Some(&viewer),
        &[],
        &[("csrf", &csrf), ("system", "c01"), ("nic", "eno1")],
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "{}", forged.body);
    let forged = post(
        &c,
        &format!("/admin/discovery/{U1}/dismiss"),
        Some(&viewer),
        &[],
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "{}", forged.body);
    assert_eq!(nic_mac(&c, "c01").await, None);
    assert_eq!(parked(&c).await, [U1]);

    let admin = sign_in(&c, "ada", "correct horse battery").await;
    let form = get(&c, "/admin/discovery/", Some(&admin)).await;
    assert!(
        form.body.contains(&format!("/admin/discovery/{U1}/assign"))
            && form.body.contains("value=\"c01\"")
            && form.body.contains("value=\"eno1\""),
        "the form, filled with the match: {}",
        form.body
    );
    let csrf = form.hidden("csrf");
    let stale = post(
        &c,
        &format!("/admin/discovery/{U1}/assign"),
        Some(&admin),
        &[],
        &[("system", "c01"), ("nic", "eno1")],
    )
    .await;
    assert_eq!(stale.status, StatusCode::FORBIDDEN, "no CSRF token");
    let wrong = post(
        &c,
        &format!("/admin/discovery/{U1}/assign"),
        Some(&admin),
        &[],
        &[("csrf", &csrf), ("system", "c02"), ("nic", "eno1")],
    )
    .await;
    assert_eq!(wrong.status, StatusCode::BAD_REQUEST, "{}", wrong.body);
    assert!(wrong.body.contains("has MAC"), "{}", wrong.body);
    let done = post(
        &c,
        &format!("/admin/discovery/{U1}/assign"),
        Some(&admin),
        &[],
        &[("csrf", &csrf), ("system", "c01"), ("nic", "eno1")],
    )
    .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert!(
        done.body.contains(&format!("{U1} is bound to c01"))
            && done.body.contains("No discovered node is waiting"),
        "{}",
        done.body
    );
    assert_eq!(nic_mac(&c, "c01").await.as_deref(), Some(U1));
    boots_normally(&c, U1, "c01").await;
    c.cleanup().await;
}
