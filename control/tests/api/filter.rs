//! The systems filter language through `GET /api/v1/systems/?filter=` on
//! every engine (each key, negation, OR, globs, IPv4 prefixes, bad
//! filters), and bulk actions through `POST /api/v1/systems/actions`: the
//! preview, the confirmation against the current count, the audit log, and
//! read-only accounts refused.

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use mprov_api::boot::BootPhase;
use mprov_control::boot::{NewEvent, record_at};
use serde_json::{Value, json};

use crate::common::{Ctx, VERSION};
use mprov_control::db::Engine;

/// Four systems, three of them booted to different phases:
///
/// | host | groups | image | rack | NIC MAC, IPv4 (IPv6) | BMC | phase |
/// | c01 | compute | base | r1 | 52:54:00:00:00:01, 10.0.0.11 | 10.1.0.11 | ready |
/// | c02 | compute, gpu | gpu-img | r1 | 52:54:00:00:00:02, 10.0.0.70 (2001:db8::2) | 10.1.0.12 | failed |
/// | c03 | compute | base | Row 2 | 52:54:00:00:00:03, 10.0.1.5 | none | enrolled |
/// | s01 | none | none | none | aa:bb:cc:00:00:01, 192.168.1.1 | 10.2.0.1 | never seen |
async fn fleet(c: &Ctx) {
    c.post(
        "networks",
        json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 16}),
    )
    .await;
    for g in ["compute", "gpu", "spare"] {
        c.post("groups", json!({"slug": g})).await;
    }
    for i in ["base", "gpu-img"] {
        c.post("images", json!({"slug": i})).await;
    }
    let systems = [
        (
            "c01",
            vec!["compute"],
            Some("base"),
            Some("r1"),
            "52:54:00:00:00:01",
            "10.0.0.11",
            None,
            Some("10.1.0.11"),
        ),
        (
            "c02",
            vec!["compute", "gpu"],
            Some("gpu-img"),
            Some("r1"),
            "52:54:00:00:00:02",
            "10.0.0.70",
            Some("2001:db8::2"),
            Some("10.1.0.12"),
        ),
        (
            "c03",
            vec!["compute"],
            Some("base"),
            Some("Row 2"),
            "52:54:00:00:00:03",
            "10.0.1.5",
            None,
            None,
        ),
        (
            "s01",
            vec![],
            None,
            None,
            "aa:bb:cc:00:00:01",
            "192.168.1.1",
            None,
            Some("10.2.0.1"),
        ),
    ];
    for (host, groups, image, rack, mac, ipv4, ipv6, bmc) in systems {
        let sys = c
            .post(
                "systems",
                json!({
                    "hostname": host, "groups": groups, "image": image, "rack": rack,
                    "nics": [{"name": "eth0", "mac": mac, "ipv4": ipv4, "ipv6": ipv6, "network": "prov", "bootable": true}],
                }),
            )
            .await;
        if let Some(bmc) = bmc {
            c.post("bmcs", json!({"system": sys["id"], "ipv4": bmc, "vlan": 0}))
                .await;
        }
        let phase = match host {
            "c01" => Some(BootPhase::Ready),
            "c02" => Some(BootPhase::Failed),
            "c03" => Some(BootPhase::Enrolled),
            _ => None,
        };
        if let Some(phase) = phase {
            record_at(
                &c.state.db,
                NewEvent {
                    system_id: sys["id"].as_i64(),
                    mac: None,
                    phase,
                    source: "control".into(),
                    jobserver_id: None,
                    ip: None,
                    detail: String::new(),
                },
                "2026-01-01T00:00:00Z".parse().unwrap(),
            )
            .await
            .expect("record a boot event");
        }
    }
}

fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The host names `filter` lists, sorted; the list's total agrees.
async fn hosts(c: &Ctx, filter: &str) -> Vec<String> {
    let v = c
        .ok(
            "GET",
            &format!("/api/v1/systems/?filter={}&sort=hostname", encode(filter)),
            None,
        )
        .await;
    let names: Vec<String> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["hostname"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(v["total"], json!(names.len()), "{filter}: {v}");
    names
}

async fn filter_keys(engine: Engine) {
    let c = Ctx::new(engine).await;
    fleet(&c).await;
    let cases: &[(&str, &[&str])] = &[
        ("", &["c01", "c02", "c03", "s01"]),
        ("hostname:c02", &["c02"]),
        ("hostname:C*", &["c01", "c02", "c03"]),
        ("group:compute", &["c01", "c02", "c03"]),
        ("group:gpu", &["c02"]),
        ("group:spare", &[]),
        ("group:nosuch", &[]),
        ("-group:compute", &["s01"]),
        ("group:compute -group:gpu", &["c01", "c03"]),
        ("image:base", &["c01", "c03"]),
        ("image:gpu*", &["c02"]),
        ("-image:base", &["c02", "s01"]),
        ("rack:r1", &["c01", "c02"]),
        ("rack:\"row 2\"", &["c03"]),
        ("rack:r1,\"Row 2\"", &["c01", "c02", "c03"]),
        ("-rack:r1", &["c03", "s01"]),
        ("mac:52:54:00:00:00:03", &["c03"]),
        ("mac:52-54-00-00-00-01", &["c01"]),
        ("mac:52:54:00:*", &["c01", "c02", "c03"]),
        ("mac:AA:BB:*", &["s01"]),
        ("ip:10.0.0.11", &["c01"]),
        ("ip:2001:db8::2", &["c02"]),
        ("ip:2001:db8:*", &["c02"]),
        ("ip:10.0.0.0/24", &["c01", "c02"]),
        ("ip:10.0.0.64/26", &["c02"]),
        ("ip:10.0.0.0/26", &["c01"]),
        ("ip:10.0.0.0/16", &["c01", "c02", "c03"]),
        (
            "ip:10.0.0.0/8,192.168.1.0/24",
            &["c01", "c02", "c03", "s01"],
        ),
        ("ip:10.0.*", &["c01", "c02", "c03"]),
        ("-ip:10.0.0.0/24", &["c03", "s01"]),
        ("bmc:10.1.*", &["c01", "c02"]),
        ("bmc:10.1.0.12", &["c02"]),
        ("bmc:10.0.0.0/8", &["c01", "c02", "s01"]),
        ("-bmc:10.0.0.0/8", &["c03"]),
        ("phase:ready", &["c01"]),
        ("phase:failed,enrolled", &["c02", "c03"]),
        ("phase:none", &["s01"]),
        ("phase:ready,none", &["c01", "s01"]),
        ("-phase:ready", &["c02", "c03", "s01"]),
        (
            "group:compute rack:r1 -phase:ready mac:52:54:00:* ip:10.0.0.0/24 bmc:10.1.*",
            &["c02"],
        ),
        // Text that would be SQL or LIKE syntax is only ever a value.
        ("hostname:\"c0' OR '1'='1\"", &[]),
        ("hostname:c0_", &[]),
        ("hostname:%", &[]),
    ];
    for (filter, want) in cases {
        assert_eq!(hosts(&c, filter).await, *want, "filter {filter:?}");
    }
    // The filter combines with the list's own parameters.
    let v = c
        .ok(
            "GET",
            &format!(
                "/api/v1/systems/?filter={}&limit=1&sort=-hostname",
                encode("group:compute")
            ),
            None,
        )
        .await;
    assert_eq!(v["total"], 3);
    assert_eq!(v["items"][0]["hostname"], "c03");
    let next = v["next"].as_str().unwrap();
    let v = c
        .ok(
            "GET",
            &format!(
                "/api/v1/systems/?filter={}&limit=1&sort=-hostname&cursor={next}",
                encode("group:compute")
            ),
            None,
        )
        .await;
    assert_eq!(v["items"][0]["hostname"], "c02");
    c.cleanup().await;
}

async fn bad_filters(engine: Engine) {
    let c = Ctx::new(engine).await;
    let cases = [
        (
            "colour:red",
            "unknown key \"colour\"; the keys are: bmc, group, hostname, image, ip, mac, phase, rack",
        ),
        ("compute", "key:value"),
        ("phase:booting", "unknown phase \"booting\""),
        ("ip:10.0.0.0/40", "0 to 32"),
        ("ip:10.0.0.999", "not an IP address"),
        ("mac:52:54", "not a MAC address"),
        ("rack:\"open", "no closing"),
        ("group:", "value is missing"),
    ];
    for (filter, needle) in cases {
        let (status, v) = c
            .call(
                "GET",
                &format!("/api/v1/systems/?filter={}", encode(filter)),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{filter}: {v}");
        let msg = v["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{filter}: {msg}");
        assert!(
            msg.contains(filter),
            "{filter}: the message names the term: {msg}"
        );
        assert_eq!(v["field"], "filter");
    }
    // Other kinds say that only systems take a filter.
    let (status, v) = c.call("GET", "/api/v1/groups/?filter=rack:r1", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("only systems"),
        "{v}"
    );
    c.cleanup().await;
}

async fn action(c: &Ctx, body: Value) -> (StatusCode, Value) {
    c.call("POST", mprov_api::bulk::ACTIONS_PATH, Some(body))
        .await
}

fn groups_of(sys: &Value) -> usize {
    sys["groups"].as_array().unwrap().len()
}

async fn bulk_actions(engine: Engine) {
    let c = Ctx::new(engine).await;
    fleet(&c).await;
    let spare = c.ok("GET", "/api/v1/groups/spare", None).await["id"].clone();

    // A preview names the count and the first host names, and changes nothing.
    let rev = c.revision().await;
    let (status, v) = action(
        &c,
        json!({"filter": "rack:r1", "action": "add_to_group", "group": "spare"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({"applied": false, "count": 2, "hosts": ["c01", "c02"]})
    );
    assert_eq!(hosts(&c, "group:spare").await, Vec::<String>::new());
    assert_eq!(c.revision().await, rev, "a preview writes nothing");

    // A stale count: 409, nothing applied, nothing audited.
    let (status, v) = action(&c, json!({"filter": "rack:r1", "action": "add_to_group", "group": "spare", "confirm_count": 3})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("now matches 2 systems, not the 3"),
        "{v}"
    );
    assert_eq!(hosts(&c, "group:spare").await, Vec::<String>::new());
    let audit = c.ok("GET", mprov_api::bulk::AUDIT_PATH, None).await;
    assert_eq!(audit["items"], json!([]));

    // The confirmed count: applied, with one audit entry.
    let (status, v) = action(&c, json!({"filter": "rack:r1", "action": "add_to_group", "group": "spare", "confirm_count": 2})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["applied"], true);
    assert_eq!(v["count"], 2);
    assert_eq!(hosts(&c, "group:spare").await, ["c01", "c02"]);
    assert!(
        c.revision().await > rev,
        "an applied action bumps the revision"
    );
    let c02 = c.ok("GET", "/api/v1/systems/c02", None).await;
    assert_eq!(groups_of(&c02), 3, "{c02}");
    assert!(c02["groups"].as_array().unwrap().contains(&spare));

    // Adding again is a no-op for members; the count is still the filter's.
    let (status, v) = action(&c, json!({"filter": "group:compute", "action": "add_to_group", "group": "spare", "confirm_count": 3})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(hosts(&c, "group:spare").await, ["c01", "c02", "c03"]);

    // Remove, set the image, netboot off, scripts again.
    let (status, v) = action(&c, json!({"filter": "-group:gpu", "action": "remove_from_group", "group": "spare", "confirm_count": 3})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(hosts(&c, "group:spare").await, ["c02"]);
    let (status, v) = action(&c, json!({"filter": "phase:none", "action": "set_image", "image": "gpu-img", "confirm_count": 1})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(hosts(&c, "image:gpu-img").await, ["c02", "s01"]);
    let (status, v) = action(
        &c,
        json!({"filter": "rack:r1", "action": "set_netboot", "netboot": false, "confirm_count": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    for (host, netboot) in [("c01", false), ("c02", false), ("c03", true)] {
        let s = c.ok("GET", &format!("/api/v1/systems/{host}"), None).await;
        assert_eq!(s["netboot"], netboot, "{host}");
    }
    let before = c.ok("GET", "/api/v1/systems/c03", None).await["run_request"]
        .as_i64()
        .unwrap();
    let (status, v) = action(
        &c,
        json!({"filter": "hostname:c03,c01", "action": "run_scripts", "confirm_count": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let after = c.ok("GET", "/api/v1/systems/c03", None).await["run_request"]
        .as_i64()
        .unwrap();
    assert_eq!(after, before + 1);
    assert_eq!(
        c.ok("GET", "/api/v1/systems/c02", None).await["run_request"]
            .as_i64()
            .unwrap(),
        before,
        "a system the filter does not match keeps its run request"
    );

    // The audit log: newest first, who, what, the filter as written.
    let audit = c.ok("GET", mprov_api::bulk::AUDIT_PATH, None).await;
    let items = audit["items"].as_array().unwrap();
    assert_eq!(items.len(), 6, "{audit}");
    assert_eq!(items[0]["action"], "run_scripts");
    assert_eq!(items[0]["filter"], "hostname:c03,c01");
    assert_eq!(items[0]["count"], 2);
    assert_eq!(items[0]["who"], "api key test admin");
    let first = &items[5];
    assert_eq!(first["action"], "add_to_group");
    assert_eq!(first["filter"], "rack:r1");
    assert_eq!(first["detail"], "group spare");
    assert_eq!(first["count"], 2);
    // Keyset pages: two at a time, no entry twice, none lost.
    let mut seen = Vec::new();
    let mut path = format!("{}?limit=2", mprov_api::bulk::AUDIT_PATH);
    loop {
        let page = c.ok("GET", &path, None).await;
        for e in page["items"].as_array().unwrap() {
            seen.push(e["id"].as_i64().unwrap());
        }
        match page["next"].as_str() {
            Some(next) => path = format!("{}?limit=2&cursor={next}", mprov_api::bulk::AUDIT_PATH),
            None => break,
        }
    }
    let all: Vec<i64> = items.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert_eq!(seen, all);

    // Bad requests: 400 with the reason, nothing applied.
    let bad = [
        (
            json!({"filter": "colour:red", "action": "run_scripts"}),
            "unknown key",
        ),
        (
            json!({"filter": "", "action": "reboot"}),
            "unknown action \"reboot\"",
        ),
        (
            json!({"filter": "", "action": "add_to_group"}),
            "needs the group's slug",
        ),
        (
            json!({"filter": "", "action": "add_to_group", "group": "nosuch"}),
            "no group \"nosuch\"",
        ),
        (
            json!({"filter": "", "action": "set_image", "image": "nosuch", "confirm_count": 4}),
            "no image \"nosuch\"",
        ),
        (
            json!({"filter": "", "action": "run_scripts", "extra": 1}),
            "unknown field",
        ),
    ];
    for (body, needle) in bad {
        let (status, v) = action(&c, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(
            v["message"].as_str().unwrap().contains(needle),
            "{body}: {v}"
        );
    }
    let audit = c.ok("GET", mprov_api::bulk::AUDIT_PATH, None).await;
    assert_eq!(audit["items"].as_array().unwrap().len(), 6);
    c.cleanup().await;
}

/// A read-only account previews nothing and applies nothing (403), but
/// reads the filtered list and the audit log.
async fn bulk_read_only(engine: Engine) {
    let c = Ctx::new(engine).await;
    fleet(&c).await;
    c.post(
        "users",
        json!({"username": "ro", "password": "read-only-pass", "is_admin": false}),
    )
    .await;
    let basic = {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("ro:read-only-pass")
        )
    };
    let req = |method: &str, path: &str, body: Option<Value>| {
        let r = Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, basic.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(VERSION, mprov_api::api_version());
        r.body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap()
    };
    for body in [
        json!({"filter": "rack:r1", "action": "set_netboot", "netboot": false}),
        json!({"filter": "rack:r1", "action": "set_netboot", "netboot": false, "confirm_count": 2}),
    ] {
        let (status, v) = c
            .send(req("POST", mprov_api::bulk::ACTIONS_PATH, Some(body)))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    }
    assert_eq!(hosts(&c, "rack:r1").await.len(), 2);
    for host in ["c01", "c02"] {
        let s = c.ok("GET", &format!("/api/v1/systems/{host}"), None).await;
        assert_eq!(s["netboot"], true, "{host}");
    }
    let (status, v) = c
        .send(req(
            "GET",
            &format!("/api/v1/systems/?filter={}", encode("rack:r1")),
            None,
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["total"], 2);
    let (status, v) = c.send(req("GET", mprov_api::bulk::AUDIT_PATH, None)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["items"], json!([]));
    c.cleanup().await;
}

crate::engine_tests!(filter_keys, bad_filters, bulk_actions, bulk_read_only);
