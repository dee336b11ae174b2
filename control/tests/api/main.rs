//! The control service's API suite. Every test runs on SQLite, MariaDB and
//! PostgreSQL (see `common`), against the router in process.

mod attacks;
mod backup;
mod board;
mod boot;
mod common;
mod discovery;
mod filter;
mod flood;
mod jobs;
mod limits;
mod logs;
mod openapi;
mod pages;
mod pages_bulk;
mod pages_details;
mod pages_inventory;
mod passkeys;
mod process;
mod scopes;
mod scripts;
mod tls;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use common::{Ctx, INSERT_BARE_SYSTEMS, VERSION, bind_bare_system};
use mprov_control::db::Engine;
use serde_json::{Value, json};

/// Checks a response body against its schema in the OpenAPI document.
fn assert_schema(schema: &str, value: &Value) {
    let doc = mprov_control::http::openapi::document();
    let root =
        json!({"$ref": format!("#/components/schemas/{schema}"), "components": doc["components"]});
    let validator = jsonschema::validator_for(&root).expect("schema compiles");
    if let Err(e) = validator.validate(value) {
        panic!("response does not match schema {schema}: {e}\n{value:#}");
    }
}

async fn crud_round_trip(engine: Engine) {
    let c = Ctx::new(engine).await;
    let rev0 = c.revision().await;
    let net = c
        .post(
            "networks",
            json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 24, "isdhcp": true}),
        )
        .await;
    assert_schema("Network", &net);
    let distro = c
        .post(
            "distros",
            json!({"slug": "rocky-9", "initial_mods": "e1000"}),
        )
        .await;
    let image = c
        .post("images", json!({"slug": "compute", "distro": "rocky-9"}))
        .await;
    assert_eq!(image["distro"], distro["id"]);
    let group = c
        .post("groups", json!({"slug": "gpu", "priority": 5}))
        .await;
    let sys = c
        .post("systems", json!({
                "hostname": "C01",
                "image": "compute",
                "groups": ["gpu"],
                "nics": [{"name": "eth0", "mac": "52-54-00-AA-BB-01", "ipv4": "10.0.0.21", "network": "prov", "bootable": true}]
            }))
        .await;
    assert_schema("System", &sys);
    assert_eq!(sys["hostname"], "c01");
    assert_eq!(sys["image"], image["id"]);
    assert_eq!(sys["groups"], json!([group["id"]]));
    assert_eq!(sys["nics"][0]["mac"], "52:54:00:aa:bb:01");
    assert_eq!(sys["nics"][0]["network"], net["id"]);
    assert!(c.revision().await > rev0, "writes bump the revision");

    // Get by id and by slug; the NIC is its own resource too.
    let id = sys["id"].as_i64().unwrap();
    assert_eq!(
        c.ok("GET", &format!("/api/v1/systems/{id}"), None).await,
        sys
    );
    assert_eq!(c.ok("GET", "/api/v1/systems/c01/", None).await, sys);
    let nics = c
        .ok("GET", &format!("/api/v1/nics/?system={id}"), None)
        .await;
    assert_schema("NicList", &nics);
    assert_eq!(nics["total"], 1);

    // Filters on fields and relations, sorting, paging.
    for h in ["c03", "c02", "c04"] {
        c.post("systems", json!({"hostname": h})).await;
    }
    let list = c
        .ok("GET", "/api/v1/systems/?sort=-hostname&limit=2", None)
        .await;
    assert_schema("SystemList", &list);
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["hostname"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["c04", "c03"]);
    assert_eq!(list["total"], 4);
    let next = list["next"].as_str().unwrap();
    let page2 = c
        .ok(
            "GET",
            &format!("/api/v1/systems/?sort=-hostname&limit=2&cursor={next}"),
            None,
        )
        .await;
    let names2: Vec<&str> = page2["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["hostname"].as_str().unwrap())
        .collect();
    assert_eq!(names2, ["c02", "c01"]);
    assert_eq!(page2["next"], Value::Null);
    let in_gpu = c.ok("GET", "/api/v1/systems/?groups=gpu", None).await;
    assert_eq!(in_gpu["total"], 1);
    let by_image = c.ok("GET", "/api/v1/systems/?image=compute", None).await;
    assert_eq!(by_image["total"], 1);
    let no_image = c.ok("GET", "/api/v1/systems/?image=null", None).await;
    assert_eq!(no_image["total"], 3);

    // Update: only the fields given; relations replaced.
    let upd = c
        .patch(
            "/api/v1/systems/c01",
            json!({"stateful": true, "groups": []}),
        )
        .await;
    assert_eq!(upd["stateful"], true);
    assert_eq!(upd["groups"], json!([]));
    assert_eq!(upd["image"], image["id"]);

    // An update that changes nothing writes nothing: the same row back and
    // no new revision (every job server would fetch the boot config again).
    let rev = c.revision().await;
    for same in [json!({}), json!({"stateful": true, "groups": []})] {
        let again = c.patch("/api/v1/systems/c01", same).await;
        assert_eq!(again, upd);
    }
    assert_eq!(
        c.revision().await,
        rev,
        "a no-op update bumped the revision"
    );
    let changed = c
        .patch("/api/v1/systems/c01", json!({"stateful": false}))
        .await;
    assert_eq!(changed["stateful"], false);
    assert_eq!(c.revision().await, rev + 1);
    c.patch("/api/v1/systems/c01", json!({"stateful": true}))
        .await;

    // Delete takes the NICs along.
    let rev = c.revision().await;
    let (status, body) = c.call("DELETE", "/api/v1/systems/c01", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(c.revision().await, rev + 1);
    assert_eq!(
        c.call("GET", "/api/v1/systems/c01", None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(c.ok("GET", "/api/v1/nics/", None).await["total"], 0);
    assert_eq!(
        c.call("DELETE", "/api/v1/systems/c01", None).await.0,
        StatusCode::NOT_FOUND
    );
    c.cleanup().await;
}

fn system_rows(n: usize, start: usize) -> Vec<Value> {
    (start..start + n)
        .map(|i| {
            json!({
                "hostname": format!("n{i:05}"),
                "groups": ["all"],
                "nics": [{"name": "eth0", "mac": format!("02:00:00:{:02x}:{:02x}:{:02x}", i >> 16 & 0xff, i >> 8 & 0xff, i & 0xff), "ipv4": format!("10.{}.{}.{}", i >> 16 & 0xff, i >> 8 & 0xff, i & 0xff), "bootable": true}]
            })
        })
        .collect()
}

/// A bulk create of `rows` is refused with `status`, its message naming
/// every place in `names`.
async fn bulk_refused(c: &Ctx, rows: &[Value], status: StatusCode, names: &[&str]) {
    let (got, err) = c
        .call(
            "POST",
            "/api/v1/systems/bulk",
            Some(Value::Array(rows.to_vec())),
        )
        .await;
    assert_eq!(got, status, "{err}");
    let msg = err["message"].as_str().unwrap();
    assert!(names.iter().all(|n| msg.contains(n)), "{err}");
}

async fn bulk_create_is_all_or_nothing(engine: Engine) {
    let c = Ctx::new(engine).await;
    c.post("groups", json!({"slug": "all"})).await;
    let created = c
        .ok(
            "POST",
            "/api/v1/systems/bulk",
            Some(Value::Array(system_rows(1000, 0))),
        )
        .await;
    assert_schema("BulkCreated", &created);
    assert_eq!(created["ids"].as_array().unwrap().len(), 1000);
    let list = c.ok("GET", "/api/v1/systems/?limit=1000", None).await;
    assert_eq!(list["total"], 1000);
    assert!(
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["nics"].as_array().unwrap().len() == 1)
    );
    assert_eq!(
        c.ok("GET", "/api/v1/groups/all", None).await["systems"]
            .as_array()
            .unwrap()
            .len(),
        1000
    );

    // Two bad rows: nothing is written and both are named.
    let mut rows = system_rows(10, 5000);
    rows[3]["nics"][0]["mac"] = json!("not-a-mac");
    rows[7]["hostname"] = json!("n00001"); // taken by the first batch
    let rev = c.revision().await;
    bulk_refused(&c, &rows, StatusCode::BAD_REQUEST, &["rows[3].nics[0].mac"]).await;
    rows[3]["nics"][0]["mac"] = json!("02:99:00:00:00:01");
    bulk_refused(&c, &rows, StatusCode::CONFLICT, &["rows[7].hostname"]).await;
    // A MAC given twice in one batch names both places.
    rows[7]["hostname"] = json!("fresh");
    rows[8]["nics"][0]["mac"] = rows[2]["nics"][0]["mac"].clone();
    bulk_refused(
        &c,
        &rows,
        StatusCode::CONFLICT,
        &["rows[8].nics[0].mac", "rows[2].nics[0].mac"],
    )
    .await;
    assert_eq!(
        c.ok("GET", "/api/v1/systems/?limit=1", None).await["total"],
        1000,
        "nothing written"
    );
    assert_eq!(
        c.revision().await,
        rev,
        "failed writes do not bump the revision"
    );
    c.cleanup().await;
}

async fn group_of_70000(engine: Engine) {
    let c = Ctx::new(engine).await;
    const N: usize = 70_000;
    // Make the systems straight in the database: what is under test is the
    // group's save and load through the API, past every engine's bind limit.
    let db = &c.state.db;
    let mut tx = db.pool().begin().await.unwrap();
    for chunk in (0..N).collect::<Vec<_>>().chunks(400) {
        let mut sql = db.sql();
        sql.push(INSERT_BARE_SYSTEMS);
        for (j, i) in chunk.iter().enumerate() {
            if j > 0 {
                sql.push(", ");
            }
            bind_bare_system(&mut sql, format!("h{i}"));
        }
        sql.query().execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    let ids: Vec<i64> = {
        let mut ids = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let path = match &cursor {
                Some(cur) => format!("/api/v1/systems/?limit=1000&cursor={cur}"),
                None => "/api/v1/systems/?limit=1000".into(),
            };
            let page = c.ok("GET", &path, None).await;
            ids.extend(
                page["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s["id"].as_i64().unwrap()),
            );
            match page["next"].as_str() {
                Some(n) => cursor = Some(n.to_owned()),
                None => break,
            }
        }
        ids
    };
    assert_eq!(ids.len(), N);
    let group = c
        .post("groups", json!({"slug": "everyone", "systems": ids}))
        .await;
    assert_eq!(group["systems"].as_array().unwrap().len(), N);
    let loaded = c.ok("GET", "/api/v1/groups/everyone", None).await;
    let mut got: Vec<i64> = loaded["systems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    got.sort_unstable();
    let mut want = ids.clone();
    want.sort_unstable();
    assert_eq!(got, want);
    // Shrinking it replaces the set.
    let half: Vec<i64> = ids[..N / 2].to_vec();
    let upd = c
        .patch("/api/v1/groups/everyone", json!({"systems": half}))
        .await;
    assert_eq!(upd["systems"].as_array().unwrap().len(), N / 2);
    assert_eq!(
        c.ok("GET", "/api/v1/systems/?groups=everyone&limit=1", None)
            .await["total"],
        N / 2
    );
    c.cleanup().await;
}

async fn bad_input_gets_clear_4xx(engine: Engine) {
    let c = Ctx::new(engine).await;
    let auth = format!("Api-Key {}", c.key);
    let raw = |method: &str, path: &str, ct: Option<&str>, body: Vec<u8>| {
        let mut r = Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, &auth)
            .header(VERSION, mprov_api::api_version());
        if let Some(ct) = ct {
            r = r.header(header::CONTENT_TYPE, ct);
        }
        r.body(Body::from(body)).unwrap()
    };
    let json_ct = Some("application/json");
    for (req, want, needle) in [
        (
            raw(
                "POST",
                "/api/v1/systems/",
                json_ct,
                b"{\"hostname\": ".to_vec(),
            ),
            StatusCode::BAD_REQUEST,
            "not valid JSON",
        ),
        (
            raw("POST", "/api/v1/systems/", json_ct, b"[1,2]".to_vec()),
            StatusCode::BAD_REQUEST,
            "expected a JSON object",
        ),
        (
            raw(
                "POST",
                "/api/v1/systems/",
                Some("text/plain"),
                b"hostname=x".to_vec(),
            ),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "JSON",
        ),
        (
            raw("POST", "/api/v1/systems/", json_ct, vec![b' '; 17 << 20]),
            StatusCode::PAYLOAD_TOO_LARGE,
            "limit",
        ),
        (
            raw("POST", "/api/v1/systems/bulk", json_ct, b"{}".to_vec()),
            StatusCode::BAD_REQUEST,
            "list",
        ),
        (
            raw("POST", "/api/v1/systems/bulk", json_ct, b"[]".to_vec()),
            StatusCode::BAD_REQUEST,
            "1 to",
        ),
        (
            raw("PUT", "/api/v1/systems/", json_ct, b"{}".to_vec()),
            StatusCode::METHOD_NOT_ALLOWED,
            "method",
        ),
        (
            raw("GET", "/api/v1/nothing/", None, vec![]),
            StatusCode::NOT_FOUND,
            "no such endpoint",
        ),
    ] {
        let (status, body) = c.send(req).await;
        assert_eq!(status, want, "{body}");
        assert!(
            body["message"].as_str().unwrap().contains(needle),
            "{needle:?} not in {body}"
        );
    }
    for (body, field, needle) in [
        (json!({"hostname": 5}), "hostname", "expected a string"),
        (
            json!({"hostname": "a b"}),
            "hostname",
            "not a valid host name",
        ),
        (
            json!({"hostname": "x", "colour": 1}),
            "colour",
            "unknown field",
        ),
        (json!({"hostname": "x", "id": 1}), "id", "read-only"),
        (
            json!({"hostname": "x", "tmpfs_root_size": "8"}),
            "tmpfs_root_size",
            "integer",
        ),
        (
            json!({"hostname": "x", "tmpfs_root_size": -1}),
            "tmpfs_root_size",
            "between",
        ),
        (
            json!({"hostname": "x", "stateful": "yes"}),
            "stateful",
            "true or false",
        ),
        (
            json!({"hostname": "x", "image": "nope"}),
            "image",
            "no images",
        ),
        (json!({"hostname": "x", "groups": "gpu"}), "groups", "list"),
        (
            json!({"hostname": "x", "config_params": "a: [1"}),
            "config_params",
            "line",
        ),
        (
            json!({"hostname": "x", "config_params": "- a list"}),
            "config_params",
            "mapping",
        ),
        (
            json!({"hostname": "x", "nics": [{"mac": "52:54:00:zz:00:01"}]}),
            "nics[0].mac",
            "MAC",
        ),
        (
            json!({"hostname": "x", "nics": [{"ipv4": "10.0.0.300"}]}),
            "nics[0].ipv4",
            "IPv4",
        ),
        (
            json!({"hostname": "x", "nics": [{"ipv6": "fe80::g"}]}),
            "nics[0].ipv6",
            "IPv6",
        ),
        (
            json!({"hostname": "x", "nics": [{"mtu": 10}]}),
            "nics[0].mtu",
            "between",
        ),
        (json!({}), "hostname", "required"),
    ] {
        let (status, err) = c.call("POST", "/api/v1/systems/", Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {err}");
        assert_schema("Error", &err);
        assert_eq!(err["field"], field, "{body} -> {err}");
        assert!(
            err["message"].as_str().unwrap().contains(needle),
            "{needle:?} not in {err}"
        );
    }
    for (path, field) in [
        ("/api/v1/systems/?colour=red", "colour"),
        ("/api/v1/systems/?sort=config_params", "sort"),
        ("/api/v1/systems/?limit=0", "limit"),
        ("/api/v1/systems/?limit=abc", "limit"),
        ("/api/v1/systems/?cursor=zzz", "cursor"),
        ("/api/v1/systems/?tmpfs_root_size=big", "tmpfs_root_size"),
        ("/api/v1/bmcs/?password=x", "password"),
    ] {
        let (status, err) = c.call("GET", path, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} -> {err}");
        assert_eq!(err["field"], field, "{path} -> {err}");
    }
    // Patch: unknown fields and children are refused; a missing row is 404.
    c.post("systems", json!({"hostname": "x1"})).await;
    let (status, err) = c
        .call("PATCH", "/api/v1/systems/x1", Some(json!({"nics": []})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        err["message"].as_str().unwrap().contains("/api/v1/nics/"),
        "{err}"
    );
    assert_eq!(
        c.call("PATCH", "/api/v1/systems/nope", Some(json!({})))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    let (status, err) = c
        .call("POST", "/api/v1/systems/", Some(json!({"hostname": "X1"})))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    assert_eq!(err["field"], "hostname");
    c.cleanup().await;
}

async fn auth_and_version_lock(engine: Engine) {
    let c = Ctx::new(engine).await;
    let v = mprov_api::api_version();
    let req = |auth: Option<String>, version: Option<&str>, path: &str| {
        let mut r = Request::builder().uri(path);
        if let Some(a) = auth {
            r = r.header(header::AUTHORIZATION, a);
        }
        if let Some(v) = version {
            r = r.header(VERSION, v);
        }
        r.body(Body::empty()).unwrap()
    };
    let key = Some(format!("Api-Key {}", c.key));
    let bad_key = Some(format!("Api-Key {}x", c.key));
    let sys = "/api/v1/systems/";
    // Authentication first (401), then the version (426).
    for (auth, version, want) in [
        (None, Some(v), StatusCode::UNAUTHORIZED),
        (None, None, StatusCode::UNAUTHORIZED),
        (bad_key.clone(), Some("0.0"), StatusCode::UNAUTHORIZED),
        (Some("Bearer abc".into()), Some(v), StatusCode::UNAUTHORIZED),
        (
            Some("Api-Key nodot".into()),
            Some(v),
            StatusCode::UNAUTHORIZED,
        ),
        (key.clone(), Some(v), StatusCode::OK),
        (key.clone(), Some("0.0"), StatusCode::UPGRADE_REQUIRED),
        (key.clone(), Some("99.1"), StatusCode::UPGRADE_REQUIRED),
        (key.clone(), None, StatusCode::UPGRADE_REQUIRED),
    ] {
        let (status, headers, body) = c.send_full(req(auth.clone(), version, sys)).await;
        assert_eq!(status, want, "{auth:?} {version:?}: {body}");
        assert_eq!(headers[VERSION], v, "every response carries the version");
        if status == StatusCode::UPGRADE_REQUIRED {
            let msg = body["message"].as_str().unwrap();
            assert!(msg.contains(v), "names the server's version: {msg}");
            if let Some(sent) = version {
                assert!(msg.contains(sent), "names the client's version: {msg}");
            }
        }
        if status == StatusCode::UNAUTHORIZED {
            assert!(headers.contains_key(header::WWW_AUTHENTICATE));
        }
    }
    // The API description is public and exempt.
    assert_eq!(
        c.send(req(None, None, "/api/v1/openapi.json")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        c.send(req(key.clone(), None, "/api/v1/openapi.json"))
            .await
            .0,
        StatusCode::OK
    );

    // Basic auth with a user; a read-only user cannot write.
    c.post(
        "users",
        json!({"username": "ops", "password": "correct horse", "is_admin": false}),
    )
    .await;
    let basic = |u: &str, p: &str| {
        use base64::Engine as _;
        Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
        ))
    };
    assert_eq!(
        c.send(req(basic("ops", "correct horse"), Some(v), sys))
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        c.send(req(basic("ops", "correct horse"), Some(v), sys))
            .await
            .0,
        StatusCode::OK,
        "cached"
    );
    assert_eq!(
        c.send(req(basic("ops", "wrong"), Some(v), sys)).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        c.send(req(basic("nobody", "x"), Some(v), sys)).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        c.send(req(basic("ops", "correct horse"), None, sys))
            .await
            .0,
        StatusCode::UPGRADE_REQUIRED
    );
    let write = Request::builder()
        .method("POST")
        .uri(sys)
        .header(
            header::AUTHORIZATION,
            basic("ops", "correct horse").unwrap(),
        )
        .header(VERSION, v)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({"hostname": "x"}).to_string()))
        .unwrap();
    assert_eq!(c.send(write).await.0, StatusCode::FORBIDDEN);
    let user = c.ok("GET", "/api/v1/users/ops", None).await;
    assert_schema("User", &user);
    assert!(
        user.get("password").is_none(),
        "password hashes are never returned"
    );

    // API keys: shown once, revocable, expiring.
    let made = c.post("apikeys", json!({"name": "ci"})).await;
    assert_schema("ApiKey", &made);
    let new_key = Some(format!("Api-Key {}", made["key"].as_str().unwrap()));
    assert_eq!(
        c.send(req(new_key.clone(), Some(v), sys)).await.0,
        StatusCode::OK
    );
    let listed = c
        .ok("GET", &format!("/api/v1/apikeys/{}", made["id"]), None)
        .await;
    assert!(
        listed.get("key").is_none() && listed.get("hash").is_none(),
        "{listed}"
    );
    c.patch(
        &format!("/api/v1/apikeys/{}", made["id"]),
        json!({"revoked": true}),
    )
    .await;
    let (status, body) = c.send(req(new_key, Some(v), sys)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body["message"].as_str().unwrap().contains("revoked"));
    let old = c
        .post(
            "apikeys",
            json!({"name": "old", "expires_at": "2020-01-01T00:00:00Z"}),
        )
        .await;
    let (status, body) = c
        .send(req(
            Some(format!("Api-Key {}", old["key"].as_str().unwrap())),
            Some(v),
            sys,
        ))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body["message"].as_str().unwrap().contains("expired"));

    // Host header check.
    let mut evil = req(key.clone(), Some(v), sys);
    evil.headers_mut()
        .insert(header::HOST, "evil.example".parse().unwrap());
    let (status, body) = c.send(evil).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["message"].as_str().unwrap().contains("ALLOWED_HOSTS"));
    let mut local = req(key.clone(), Some(v), sys);
    local
        .headers_mut()
        .insert(header::HOST, "localhost:8080".parse().unwrap());
    assert_eq!(c.send(local).await.0, StatusCode::OK);
    c.cleanup().await;

    // The skip variable: only exactly "1" turns the check off; exempt paths too.
    for (args, want) in [
        (vec!["--skip-version-check", "1"], StatusCode::OK),
        (
            vec!["--skip-version-check", "true"],
            StatusCode::UPGRADE_REQUIRED,
        ),
        (
            vec!["--skip-version-check", ""],
            StatusCode::UPGRADE_REQUIRED,
        ),
        (vec![], StatusCode::UPGRADE_REQUIRED),
        (vec!["--version-exempt", "/api/v1/systems/"], StatusCode::OK),
    ] {
        let c = Ctx::with_args(engine, &args).await;
        let key = Some(format!("Api-Key {}", c.key));
        assert_eq!(
            c.send(req(key.clone(), None, sys)).await.0,
            want,
            "{args:?}"
        );
        assert_eq!(
            c.send(req(key.clone(), Some("0.0"), sys)).await.0,
            want,
            "{args:?}"
        );
        assert_eq!(
            c.send(req(None, None, sys)).await.0,
            StatusCode::UNAUTHORIZED,
            "auth is still checked"
        );
        c.cleanup().await;
    }
}

async fn secrets_are_encrypted_and_never_returned(engine: Engine) {
    let c = Ctx::new(engine).await;
    c.post("systems", json!({"hostname": "c01"})).await;
    let bmc = c
        .post("bmcs", json!({"system": "c01", "ipv4": "10.1.0.21", "username": "root", "password": "calvin-secret"}))
        .await;
    assert_schema("Bmc", &bmc);
    assert_eq!(bmc["password_set"], true);
    assert!(bmc.get("password").is_none());
    let listed = c.ok("GET", "/api/v1/bmcs/", None).await;
    assert!(!listed.to_string().contains("calvin"), "{listed}");
    let row = sqlx::query("SELECT password FROM bmcs")
        .fetch_one(c.state.db.pool())
        .await
        .unwrap();
    let stored: String = sqlx::Row::try_get(&row, "password").unwrap();
    assert!(
        stored.starts_with("v1:") && !stored.contains("calvin"),
        "{stored}"
    );
    assert_eq!(c.state.secrets.open(&stored).unwrap(), "calvin-secret");
    let cleared = c
        .patch(
            &format!("/api/v1/bmcs/{}", bmc["id"]),
            json!({"password": null}),
        )
        .await;
    assert_eq!(cleared["password_set"], false);
    c.cleanup().await;
}

async fn effective_config_layers(engine: Engine) {
    let c = Ctx::new(engine).await;
    let s1 = c
        .post(
            "scripts",
            json!({"slug": "motd", "script_type": "post-boot", "content": "echo hi"}),
        )
        .await;
    c.post(
        "scripts",
        json!({"slug": "ldap", "script_type": "post-boot"}),
    )
    .await;
    c.post("distros", json!({"slug": "d", "install_kernel_cmdline": "console=ttyS0", "initial_mods": "e1000", "tmpfs_root_size": 8, "scripts": ["motd", "ldap"], "config_params": "ntp:\n  server: a\n"}))
    .await;
    c.post(
        "images",
        json!({"slug": "img", "distro": "d", "initial_mods": "virtio_net"}),
    )
    .await;
    c.post(
        "groups",
        json!({"slug": "late", "priority": 10, "install_kernel_cmdline": "=quiet"}),
    )
    .await;
    c.post("groups", json!({"slug": "early", "priority": 1, "config_params": "disable_scripts: [ldap]\nntp:\n  pool: b\n"})).await;
    c.post("systems", json!({"hostname": "c01", "image": "img", "groups": ["late", "early"], "tmpfs_root_size": 16, "install_kernel_cmdline": "mitigations=off"}))
    .await;
    let eff = c.ok("GET", "/api/v1/systems/c01/config", None).await;
    assert_schema("EffectiveConfig", &eff);
    assert_eq!(eff["kernel_cmdline"], "quiet mitigations=off");
    assert_eq!(eff["initial_mods"], json!(["e1000", "virtio_net"]));
    assert_eq!(eff["tmpfs_root_size"], 16);
    assert_eq!(
        eff["config_params"]["ntp"],
        json!({"server": "a", "pool": "b"})
    );
    assert_eq!(
        eff["scripts"],
        json!([{"id": s1["id"], "slug": "motd", "layer": "distro"}])
    );
    assert_eq!(
        eff["layers"],
        json!([
            "distro d",
            "group early",
            "group late",
            "image img",
            "system c01"
        ])
    );
    assert_eq!(
        c.call("GET", "/api/v1/systems/nope/config", None).await.0,
        StatusCode::NOT_FOUND
    );
    c.cleanup().await;
}

async fn versions_and_rebuilds(engine: Engine) {
    let c = Ctx::new(engine).await;
    let js = c
        .post(
            "jobservers",
            json!({"name": "js1", "addresses": ["10.0.0.2"]}),
        )
        .await;
    assert_schema("JobServer", &js);
    let img = c.post("images", json!({"slug": "compute"})).await;
    assert_eq!(img["version"], 1);
    c.patch("/api/v1/images/compute", json!({"jobservers": ["js1"]}))
        .await;
    let img = c
        .patch("/api/v1/images/compute", json!({"needs_rebuild": true}))
        .await;
    assert_eq!(img["version"], 2);
    assert_eq!(
        img["jobservers"],
        json!([]),
        "no job server hosts the new version yet"
    );
    let jobs = c.ok("GET", "/api/v1/jobs/?module=image-update", None).await;
    assert_schema("JobList", &jobs);
    assert_eq!(jobs["total"], 1);
    assert_eq!(
        jobs["items"][0]["params"],
        json!({"image": "compute", "version": 2})
    );
    assert_eq!(jobs["items"][0]["status"], "pending");
    let (status, _) = c
        .call(
            "PATCH",
            "/api/v1/images/compute",
            Some(json!({"version": 7})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "version is the server's");

    let s = c
        .post(
            "scripts",
            json!({"slug": "s", "script_type": "image-gen", "content": "a"}),
        )
        .await;
    assert_eq!(s["version"], 1);
    assert_eq!(
        c.patch("/api/v1/scripts/s", json!({"content": "a"})).await["version"],
        1
    );
    assert_eq!(
        c.patch("/api/v1/scripts/s", json!({"content": "b"})).await["version"],
        2
    );
    c.cleanup().await;
}

async fn every_kind_round_trips_its_schema(engine: Engine) {
    let c = Ctx::new(engine).await;
    let index = c.ok("GET", "/api/v1/", None).await;
    assert_eq!(
        index["kinds"].as_array().unwrap().len(),
        mprov_control::db::kinds::KINDS.len()
    );
    c.post(
        "networks",
        json!({"slug": "mgmt", "subnet": "10.1.0.0", "netmask": 16}),
    )
    .await;
    c.post(
        "switches",
        json!({"hostname": "sw1", "network": "mgmt", "mgmt_ip": "10.1.0.2"}),
    )
    .await;
    c.post("switchports", json!({"switch": "sw1", "name": "5"}))
        .await;
    c.post(
        "repos",
        json!({"slug": "baseos", "url": "http://mirror.invalid/baseos"}),
    )
    .await;
    c.post(
        "jobs",
        json!({"module": "libgenders", "params": {"x": [1, 2]}}),
    )
    .await;
    for kind in mprov_control::db::kinds::KINDS {
        let list = c.ok("GET", &format!("/api/v1/{}/", kind.name), None).await;
        assert_schema(&format!("{}List", kind.schema), &list);
    }
    c.cleanup().await;
}

async fn boot_config_long_poll(engine: Engine) {
    let c = Ctx::with_args(
        engine,
        &[
            "--dns-upstreams",
            "192.0.2.53",
            "--public-url",
            "http://10.0.0.1:8080/",
        ],
    )
    .await;
    c.post("networks", json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 24, "isdhcp": true, "dhcp_start": "10.0.0.100", "dhcp_end": "10.0.0.199", "domain": "cluster"})).await;
    c.post(
        "networks",
        json!({"slug": "rack2", "subnet": "10.2.0.0", "netmask": 24}),
    )
    .await;
    c.post(
        "switches",
        json!({"hostname": "sw1", "mgmt_ip": "10.0.0.2", "mgmt_mac": "02:00:00:00:00:02"}),
    )
    .await;
    let port = c
        .post(
            "switchports",
            json!({"switch": "sw1", "name": "7", "network": "rack2"}),
        )
        .await;
    c.post("systems", json!({"hostname": "c01", "nics": [
        {"name": "eth0", "mac": "52:54:00:00:00:01", "ipv4": "10.0.0.21", "network": "prov", "bootable": true, "aliases": ["head"]},
        {"name": "eth1", "mac": "52:54:00:00:00:02", "ipv4": "10.2.0.21", "network": "prov", "switch_port": port["id"]}
    ]})).await;
    c.post("bmcs", json!({"system": "c01", "ipv4": "10.0.0.121", "mac": "52:54:00:00:01:01", "network": "prov"})).await;

    let snap = c.ok("GET", "/api/v1/bootconfig", None).await;
    assert_schema("BootConfig", &snap);
    let typed: mprov_api::boot::BootConfig =
        serde_json::from_value(snap.clone()).expect("client type reads it");
    assert_eq!(typed.revision, c.revision().await);
    assert_eq!(
        typed.upstream_resolvers,
        ["192.0.2.53".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(
        typed.boot.ipxe_script_url.as_deref(),
        Some(mprov_api::boot::ipxe_chain_url("http://10.0.0.1:8080").as_str())
    );
    let chain = typed.boot.ipxe_script_url.as_deref().unwrap();
    for var in ["${net0/mac}", "${platform}", "${buildarch}"] {
        assert!(
            chain.contains(var),
            "what iPXE fills in is on the URL: {chain}"
        );
    }
    let prov = typed.networks.iter().find(|n| n.slug == "prov").unwrap();
    assert_eq!(
        prov.pool,
        Some(("10.0.0.100".parse().unwrap(), "10.0.0.199".parse().unwrap()))
    );
    assert!(prov.dhcp && prov.prefix == 24 && prov.domain == "cluster");
    let host = |mac: &str| {
        typed
            .hosts
            .iter()
            .find(|h| h.mac.as_deref() == Some(mac))
            .unwrap()
            .clone()
    };
    let eth0 = host("52:54:00:00:00:01");
    assert_eq!(
        (
            eth0.hostname.as_str(),
            eth0.aliases.as_slice(),
            eth0.bootable
        ),
        ("c01", &["head".to_owned()][..], true)
    );
    assert_eq!(
        host("52:54:00:00:00:02").network.as_deref(),
        Some("rack2"),
        "the switch port's network wins"
    );
    assert_eq!(host("52:54:00:00:01:01").hostname, "c01-bmc");
    assert_eq!(host("02:00:00:00:00:02").hostname, "sw1");

    // Long-poll: no change → 204 after the wait; a write → the new snapshot.
    let rev = typed.revision;
    let (status, _) = c
        .call(
            "GET",
            &format!("/api/v1/bootconfig?after={rev}&wait=1"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let waiter = {
        let app = c.app.clone();
        let key = c.key.clone();
        tokio::spawn(async move {
            use tower::ServiceExt;
            let req = Request::builder()
                .uri(format!("/api/v1/bootconfig?after={rev}&wait=60"))
                .header(header::AUTHORIZATION, format!("Api-Key {key}"))
                .header(VERSION, mprov_api::api_version())
                .body(Body::empty())
                .unwrap();
            let resp = app.oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap()
                .to_bytes();
            (
                status,
                serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
            )
        })
    };
    c.patch("/api/v1/nics/1", json!({"mac": "52:54:00:00:00:99"}))
        .await;
    let (status, newer) = waiter.await.unwrap();
    assert_eq!(
        status,
        StatusCode::OK,
        "woken by the write well before the 60 s wait"
    );
    assert!(newer["revision"].as_i64().unwrap() > rev);
    assert!(newer.to_string().contains("52:54:00:00:00:99"));
    for bad in ["after=x", "wait=-1", "colour=red"] {
        assert_eq!(
            c.call("GET", &format!("/api/v1/bootconfig?{bad}"), None)
                .await
                .0,
            StatusCode::BAD_REQUEST,
            "{bad}"
        );
    }
    c.cleanup().await;
}

async fn first_start_files_and_log(engine: Engine) {
    process::first_start(engine).await;
}

async fn subcommands(engine: Engine) {
    process::subcommands(engine).await;
}

async fn every_endpoint_with_every_identity(engine: Engine) {
    scopes::every_endpoint_with_every_identity(engine).await;
}

/// Races on what must be used once (one nonce, one token, one identity, ×20 each).
mod races {
    use mprov_control::db::Engine;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql_concurrent_enrollments_leave_one_valid_certificate() {
        crate::attacks::races(Engine::Mysql).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_concurrent_enrollments_leave_one_valid_certificate() {
        crate::attacks::races(Engine::Postgres).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_concurrent_enrollments_leave_one_valid_certificate() {
        crate::attacks::races(Engine::Sqlite).await;
    }
}

async fn node_enrollment_refusals(engine: Engine) {
    scopes::node_enrollment_refusals(engine).await;
}

async fn boot_timeline_manifest_and_nonces(engine: Engine) {
    boot::boot_timeline_manifest_and_nonces(engine).await;
}

async fn ipxe_rate_limits(engine: Engine) {
    boot::ipxe_rate_limits(engine).await;
}

async fn bootability_one_rule(engine: Engine) {
    boot::bootability_one_rule(engine).await;
}

async fn ipxe_refusals_are_retry_scripts(engine: Engine) {
    boot::ipxe_refusals_are_retry_scripts(engine).await;
}

async fn node_view_statements_do_not_grow_with_groups(engine: Engine) {
    boot::node_view_statements_do_not_grow_with_groups(engine).await;
}

async fn waiting_ipxe_requests_run_no_statements(engine: Engine) {
    boot::waiting_ipxe_requests_run_no_statements(engine).await;
}

async fn registration_and_fresh_heartbeats(engine: Engine) {
    boot::registration_and_fresh_heartbeats(engine).await;
}

async fn openapi_lists_every_status_answered(engine: Engine) {
    openapi::every_status_answered_is_documented(engine).await;
}

async fn jobs_claim_race(engine: Engine) {
    jobs::claim_race(engine).await;
}

async fn jobs_claims_and_reports(engine: Engine) {
    jobs::claims_and_reports(engine).await;
}

async fn jobs_claims_follow_registered_modules(engine: Engine) {
    jobs::claims_follow_registered_modules(engine).await;
}

async fn jobs_publish_and_copy(engine: Engine) {
    jobs::publish_and_copy(engine).await;
}

async fn jobs_sweeps_with_a_controlled_clock(engine: Engine) {
    jobs::sweeps_with_a_controlled_clock(engine).await;
}

async fn scripts_plans_content_results_and_reruns(engine: Engine) {
    scripts::plans_content_results_and_reruns(engine).await;
}

async fn scripts_disable_scripts_forms(engine: Engine) {
    scripts::disable_scripts_forms(engine).await;
}

async fn board_states_snapshot_feed_and_timeline(engine: Engine) {
    board::states_snapshot_feed_and_timeline(engine).await;
}

async fn board_statements_do_not_grow_with_systems(engine: Engine) {
    board::statements_do_not_grow_with_systems(engine).await;
}

async fn board_migration_backfill_maps_phases_as_the_code_does(engine: Engine) {
    board::migration_backfill_maps_phases_as_the_code_does(engine).await;
}

async fn board_pages_show_the_board_and_a_timeline(engine: Engine) {
    board::pages_show_the_board_and_a_timeline(engine).await;
}

async fn discovery_manual_parks_and_an_admin_assigns(engine: Engine) {
    discovery::manual_parks_and_an_admin_assigns(engine).await;
}

async fn discovery_open_binds_a_free_port(engine: Engine) {
    discovery::open_binds_a_free_port(engine).await;
}

async fn discovery_permissive_replaces_with_a_warning(engine: Engine) {
    discovery::permissive_replaces_with_a_warning(engine).await;
}

async fn discovery_recabled_mac_warns_and_is_not_rebound(engine: Engine) {
    discovery::recabled_mac_warns_and_is_not_rebound(engine).await;
}

async fn discovery_nonce_attacks_are_refused(engine: Engine) {
    discovery::nonce_attacks_are_refused(engine).await;
}

async fn discovery_page_lists_and_assigns(engine: Engine) {
    discovery::page_lists_and_assigns(engine).await;
}

async fn discovery_without_a_discovery_image_no_nonce(engine: Engine) {
    discovery::without_a_discovery_image_no_nonce(engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn board_feed_on_a_real_service() {
    common::on_sqlite(board::feed_on_a_real_service).await;
}

engine_tests!(
    discovery_manual_parks_and_an_admin_assigns,
    discovery_open_binds_a_free_port,
    discovery_permissive_replaces_with_a_warning,
    discovery_recabled_mac_warns_and_is_not_rebound,
    discovery_nonce_attacks_are_refused,
    discovery_without_a_discovery_image_no_nonce,
    discovery_page_lists_and_assigns,
    board_pages_show_the_board_and_a_timeline,
    board_states_snapshot_feed_and_timeline,
    board_statements_do_not_grow_with_systems,
    board_migration_backfill_maps_phases_as_the_code_does,
    scripts_plans_content_results_and_reruns,
    scripts_disable_scripts_forms,
    jobs_claim_race,
    jobs_claims_and_reports,
    jobs_claims_follow_registered_modules,
    jobs_publish_and_copy,
    jobs_sweeps_with_a_controlled_clock,
    boot_timeline_manifest_and_nonces,
    ipxe_rate_limits,
    bootability_one_rule,
    ipxe_refusals_are_retry_scripts,
    node_view_statements_do_not_grow_with_groups,
    waiting_ipxe_requests_run_no_statements,
    registration_and_fresh_heartbeats,
    openapi_lists_every_status_answered,
    every_endpoint_with_every_identity,
    node_enrollment_refusals,
    crud_round_trip,
    bulk_create_is_all_or_nothing,
    group_of_70000,
    bad_input_gets_clear_4xx,
    auth_and_version_lock,
    secrets_are_encrypted_and_never_returned,
    effective_config_layers,
    versions_and_rebuilds,
    every_kind_round_trips_its_schema,
    first_start_files_and_log,
    subcommands,
    boot_config_long_poll,
);

#[test]
fn openapi_matches_its_snapshot() {
    let doc = mprov_control::http::openapi::document();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/openapi.json");
    let rendered = format!("{}\n", serde_json::to_string_pretty(doc).unwrap());
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(path, &rendered).unwrap();
    }
    let stored = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        stored == rendered,
        "the OpenAPI document changed; review it and run with UPDATE_SNAPSHOTS=1 to accept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipxe_attacks_on_the_real_service() {
    common::on_sqlite(boot::attacks_on_the_real_service).await;
}
