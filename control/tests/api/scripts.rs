//! The script-runner's endpoints (issue 23) on every engine, with real node
//! and job-server certificates: the plan from every layer with a script
//! disabled at group level as a single string, content and results scoped
//! to the node's own plan and timeline, image-gen plans and stored runs,
//! run-scripts, and a node certificate of a test-set validity renewed.

use axum::http::StatusCode;
use mprov_control::db::Engine;
use serde_json::{Value, json};

use crate::common::{Ctx, inner};
use crate::scopes::{Cred, csr, der_of, enroll_jobserver, enroll_node, hosted_image, send};

/// How long node certificates last in these tests.
const NODE_CERT_SECONDS: i64 = 120;

/// A context with a signing helper whose node certificates last
/// [`NODE_CERT_SECONDS`].
async fn ctx(engine: Engine) -> (Ctx, tempfile::TempDir) {
    let secs = NODE_CERT_SECONDS.to_string();
    let c = Ctx::with_args(engine, &["--node-cert-seconds", &secs]).await;
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

/// A script `slug` of `script_type`, whose content names it.
async fn script(c: &Ctx, slug: &str, script_type: &str, extra: Value) -> i64 {
    let mut body = json!({"slug": slug, "script_type": script_type, "content": format!("#!/bin/sh\necho {slug}\n")});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    c.post("scripts", body).await["id"].as_i64().unwrap()
}

fn slugs(plan: &Value) -> Vec<(String, String)> {
    plan["scripts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["slug"].as_str().unwrap().to_owned(),
                s["layer"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// The events of `host`'s last boot, as the admin reads them.
async fn timeline(c: &Ctx, host: &str) -> Vec<Value> {
    c.ok("GET", &format!("/api/v1/boot/events?system={host}"), None)
        .await
        .as_array()
        .unwrap()
        .clone()
}

pub(crate) async fn plans_content_results_and_reruns(engine: Engine) {
    let (c, _tls) = ctx(engine).await;
    hosted_image(&c).await;
    let d_post = script(&c, "d-post", "post-boot", json!({})).await;
    let d_off = script(&c, "d-off", "post-boot", json!({})).await;
    let d_gen = script(&c, "d-gen", "image-gen", json!({})).await;
    let g1 = script(&c, "g-post1", "post-boot", json!({})).await;
    let g2 = script(
        &c,
        "g-post2",
        "post-boot",
        json!({"depends_on": ["g-post1"], "timeout_seconds": 30}),
    )
    .await;
    let i_post = script(&c, "i-post", "post-boot", json!({})).await;
    let i_gen = script(&c, "i-gen", "image-gen", json!({"depends_on": ["d-gen"]})).await;
    let s_post = script(&c, "s-post", "post-boot", json!({})).await;
    let other = script(&c, "other-post", "post-boot", json!({})).await;
    // A timeout must be a positive number of seconds.
    let (status, v) = c
        .call(
            "POST",
            "/api/v1/scripts/",
            Some(json!({"slug": "bad", "script_type": "post-boot", "timeout_seconds": 0})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");

    c.post(
        "distros",
        json!({"slug": "deb", "scripts": [d_post, d_off, d_gen], "config_params": "ntp: pool\n"}),
    )
    .await;
    c.patch(
        "/api/v1/images/compute",
        json!({"distro": "deb", "scripts": [i_post, i_gen], "config_params": "image_key: 1\n"}),
    )
    .await;
    // The seed's form: one slug as a string, at group level.
    c.post(
        "groups",
        json!({"slug": "gpu", "scripts": [g1, g2], "config_params": "disable_scripts: d-off\nshared: group\n"}),
    )
    .await;
    c.post(
        "systems",
        json!({"hostname": "c01", "image": "compute", "groups": ["gpu"], "scripts": [s_post],
            "config_params": "site: c01-site\n",
            "nics": [{"mac": "aa:bb:cc:00:23:01", "network": "prov"}]}),
    )
    .await;
    c.post(
        "systems",
        json!({"hostname": "c02", "image": "compute", "scripts": [other],
            "config_params": "only_c02: c02-secret-param\n",
            "nics": [{"mac": "aa:bb:cc:00:23:02", "network": "prov"}]}),
    )
    .await;
    c.post("bmcs", json!({"system": "c01", "password": "bmc-hunter2"}))
        .await;
    let a = Cred::Cert(enroll_node(&c, "aa:bb:cc:00:23:01").await);
    let b = Cred::Cert(enroll_node(&c, "aa:bb:cc:00:23:02").await);
    let js = Cred::Cert(enroll_jobserver(&c, "js1").await);
    let admin = Cred::Key(c.key.clone());
    let app = &c.app;

    // The node's own plan: every layer in order, d-off disabled by the group.
    let (status, plan) = send(app, "GET", "/api/v1/scripts/plan?mode=post-boot", &a, None).await;
    assert_eq!(status, StatusCode::OK, "{plan}");
    assert_eq!(
        slugs(&plan),
        pairs(&[
            ("d-post", "distro"),
            ("g-post1", "group:gpu"),
            ("g-post2", "group:gpu"),
            ("i-post", "image"),
            ("s-post", "system"),
        ])
    );
    assert_eq!(plan["mode"], "post-boot");
    assert_eq!(plan["host"], "c01");
    assert_eq!(plan["image"], "compute");
    assert_eq!(plan["groups"], json!(["gpu"]));
    assert_eq!(plan["disabled"], json!(["d-off"]));
    assert_eq!(plan["run_request"], 0);
    let g2_planned = &plan["scripts"][2];
    assert_eq!(g2_planned["depends_on"], json!(["g-post1"]));
    assert_eq!(g2_planned["timeout_seconds"], 30);
    assert_eq!(plan["scripts"][0]["timeout_seconds"], Value::Null);
    assert_eq!(
        g2_planned["sha256"],
        mprov_control::scripts::content_sha256("#!/bin/sh\necho g-post2\n")
    );
    for (k, v) in [
        ("ntp", json!("pool")),
        ("shared", json!("group")),
        ("site", json!("c01-site")),
        ("image_key", json!(1)),
        ("disable_scripts", json!(["d-off"])),
    ] {
        assert_eq!(plan["params"][k], v, "{k}");
    }
    let text = plan.to_string();
    assert!(
        !text.contains("c02-secret-param") && !text.contains("bmc-hunter2"),
        "another node's params or a secret: {text}"
    );
    // The API's effective config and the plan agree on what is left out.
    let cfg = c.ok("GET", "/api/v1/systems/c01/config", None).await;
    let cfg_slugs: Vec<&str> = cfg["scripts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["slug"].as_str().unwrap())
        .collect();
    assert!(!cfg_slugs.contains(&"d-off") && cfg_slugs.contains(&"d-gen"));

    // A node names no system, not even itself, and takes no other parameter.
    for (q, want) in [
        ("&system=c02", StatusCode::FORBIDDEN),
        ("&system=c01", StatusCode::FORBIDDEN),
        ("&host=c02", StatusCode::BAD_REQUEST),
        ("&image=compute", StatusCode::BAD_REQUEST),
    ] {
        let (status, v) = send(
            app,
            "GET",
            &format!("/api/v1/scripts/plan?mode=post-boot{q}"),
            &a,
            None,
        )
        .await;
        assert_eq!(status, want, "{q}: {v}");
        assert!(!v.to_string().contains("other-post"), "{v}");
    }
    let (status, _) = send(
        app,
        "GET",
        "/api/v1/scripts/plan?mode=image-gen&image=compute",
        &a,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Node b gets its own.
    let (_, plan_b) = send(app, "GET", "/api/v1/scripts/plan?mode=post-boot", &b, None).await;
    assert!(slugs(&plan_b).contains(&("other-post".into(), "system".into())));
    assert_eq!(plan_b["host"], "c02");
    // Admins name the node; the job server gets none.
    let (status, v) = send(
        app,
        "GET",
        "/api/v1/scripts/plan?mode=post-boot&system=c02",
        &admin,
        None,
    )
    .await;
    assert_eq!((status, &v["host"]), (StatusCode::OK, &json!("c02")));
    let (status, _) = send(
        app,
        "GET",
        "/api/v1/scripts/plan?mode=post-boot",
        &admin,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = send(
        app,
        "GET",
        "/api/v1/scripts/plan?mode=post-boot&system=c01",
        &js,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = send(
        app,
        "GET",
        "/api/v1/scripts/plan?mode=post-boot",
        &Cred::None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // An image's image-gen plan, for its job server: distro then image.
    let (status, gen_plan) = send(
        app,
        "GET",
        "/api/v1/scripts/plan?mode=image-gen&image=compute",
        &js,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{gen_plan}");
    assert_eq!(
        slugs(&gen_plan),
        pairs(&[("d-gen", "distro"), ("i-gen", "image")])
    );
    assert_eq!(gen_plan["scripts"][1]["depends_on"], json!(["d-gen"]));
    assert_eq!(gen_plan["image"], "compute");
    assert_eq!(gen_plan["host"], Value::Null);
    assert_eq!(gen_plan["params"]["ntp"], "pool");
    let (status, _) = send(
        app,
        "GET",
        "/api/v1/scripts/plan?mode=image-gen&image=nope",
        &js,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Content: a node only its own plan's scripts; others any.
    let content = |slug: &str| format!("/api/v1/scripts/{slug}/content");
    let (status, body) = send(app, "GET", &content("g-post2"), &a, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!("#!/bin/sh\necho g-post2\n"));
    for slug in ["other-post", "d-off", "d-gen", "no-such-script"] {
        let (status, v) = send(app, "GET", &content(slug), &a, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{slug}: {v}");
    }
    for who in [&js, &admin] {
        let (status, body) = send(app, "GET", &content("other-post"), who, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, json!("#!/bin/sh\necho other-post\n"));
    }
    let (status, _) = send(app, "GET", &content("no-such-script"), &admin, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = send(app, "GET", &content("g-post2"), &Cred::None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Results: onto the node's own timeline, one script event each and a
    // failed event naming the script.
    let long_tail = format!("{}the last line\n", "x".repeat(8000));
    let report = json!({
        "mode": "post-boot", "run_request": 0, "outcome": "failed",
        "detail": "g-post2 exited with 3",
        "results": [
            {"slug": "g-post1", "status": "success", "exit_code": 0, "duration_ms": 120, "output_tail": "mounted\n"},
            {"slug": "g-post2", "status": "failed", "exit_code": 3, "duration_ms": 2500, "output_tail": long_tail},
            {"slug": "s-post", "status": "not_run"}
        ]
    });
    let (status, v) = send(
        app,
        "POST",
        "/api/v1/scripts/results",
        &a,
        Some(report.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let events = timeline(&c, "c01").await;
    let tail: Vec<(&str, &str)> = events[events.len() - 4..]
        .iter()
        .map(|e| (e["phase"].as_str().unwrap(), e["detail"].as_str().unwrap()))
        .collect();
    assert_eq!(tail[0].0, "script");
    assert_eq!(
        tail[0].1,
        "g-post1: success, exit 0, 0.1 s; output tail:\nmounted\n"
    );
    assert_eq!(tail[1].0, "script");
    assert!(
        tail[1]
            .1
            .starts_with("g-post2: failed, exit 3, 2.5 s; output tail:\n")
            && tail[1].1.ends_with("the last line\n")
            && tail[1].1.len() <= 4096,
        "{}",
        tail[1].1
    );
    assert_eq!(tail[2], ("script", "s-post: not run"));
    assert_eq!(
        tail[3],
        (
            "failed",
            "post-boot scripts failed (g-post2): g-post2 exited with 3"
        )
    );
    assert!(events.iter().all(|e| e["source"] == "node:c01"
        || !e["detail"].as_str().unwrap().contains("g-post")));
    // A report naming another node is refused whole; c02's timeline stays
    // as it was.
    let before_b = timeline(&c, "c02").await;
    for extra in [json!({"system": "c02"}), json!({"host": "c02"})] {
        let mut forged = report.clone();
        forged
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().cloned().unwrap());
        let (status, v) = send(app, "POST", "/api/v1/scripts/results", &a, Some(forged)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
        assert!(
            v["message"].as_str().unwrap().contains("unknown field"),
            "{v}"
        );
    }
    assert_eq!(timeline(&c, "c02").await, before_b);
    // Bad reports: clear 400s.
    for bad in [
        json!("not a report"),
        json!({"mode": "post-boot", "outcome": "maybe", "results": []}),
        json!({"mode": "post-boot", "outcome": "success", "results": [{"slug": "a", "status": "success", "output_tail": "x".repeat(16 * 1024 + 1)}]}),
        json!({"mode": "post-boot", "image": "compute", "outcome": "success", "results": []}),
    ] {
        let (status, v) = send(app, "POST", "/api/v1/scripts/results", &a, Some(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    }
    // A node reports no image-gen run, a job server no post-boot run, an
    // admin neither.
    let gen_report = json!({"mode": "image-gen", "image": "compute", "outcome": "success",
        "results": [{"slug": "d-gen", "status": "success", "exit_code": 0, "duration_ms": 5, "output_tail": "built\n"}]});
    let (status, _) = send(
        app,
        "POST",
        "/api/v1/scripts/results",
        &a,
        Some(gen_report.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for who in [&js, &admin] {
        let (status, _) = send(
            app,
            "POST",
            "/api/v1/scripts/results",
            who,
            Some(report.clone()),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
    }
    // A job server's image-gen run is stored, on no timeline.
    let events_before = mprov_control::boot::count(&c.state.db).await.unwrap();
    let (status, v) = send(
        app,
        "POST",
        "/api/v1/scripts/results",
        &js,
        Some(gen_report),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(
        mprov_control::boot::count(&c.state.db).await.unwrap(),
        events_before
    );
    let runs = mprov_control::scripts::image_runs(&c.state.db, "compute", 10)
        .await
        .unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].0, "jobserver:js1");
    assert_eq!(runs[0].1, "success");
    assert_eq!(runs[0].3[0].slug, "d-gen");

    // Run again: admins only; the plan shows the new request.
    for who in [&a, &js] {
        let (status, v) = send(app, "POST", "/api/v1/systems/c01/run-scripts", who, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    }
    let (status, _) = send(
        app,
        "POST",
        "/api/v1/systems/c01/run-scripts",
        &Cred::None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    for n in 1..=2 {
        let (status, v) = send(app, "POST", "/api/v1/systems/c01/run-scripts", &admin, None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v, json!({"system": "c01", "run_request": n}));
    }
    let (_, plan) = send(app, "GET", "/api/v1/scripts/plan?mode=post-boot", &a, None).await;
    assert_eq!(plan["run_request"], 2);
    let (_, plan_b) = send(app, "GET", "/api/v1/scripts/plan?mode=post-boot", &b, None).await;
    assert_eq!(plan_b["run_request"], 0, "only c01's was bumped");
    let (status, _) = send(
        app,
        "POST",
        "/api/v1/systems/no-such/run-scripts",
        &admin,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        c.ok("GET", "/api/v1/systems/c01", None).await["run_request"],
        2
    );

    // Another node's config through the inventory: refused.
    let (status, _) = send(app, "GET", "/api/v1/systems/c02/config", &a, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // The node certificate lasts what the setting says; renewing it revokes
    // the old one and the new one gets the plan.
    let Cred::Cert(old) = &a else { unreachable!() };
    let (status, v) = send(
        app,
        "POST",
        "/enroll/renew/",
        &a,
        Some(json!({"csr": csr()})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let not_after: jiff::Timestamp = v["not_after"].as_str().unwrap().parse().unwrap();
    let left = not_after.as_second() - jiff::Timestamp::now().as_second();
    assert!(
        (NODE_CERT_SECONDS - 30..=NODE_CERT_SECONDS + 5).contains(&left),
        "{left} s left"
    );
    let renewed = Cred::Cert(der_of(v["certificate"].as_str().unwrap()));
    let (status, _) = send(
        app,
        "GET",
        "/api/v1/scripts/plan?mode=post-boot",
        &Cred::Cert(old.clone()),
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the old certificate is revoked"
    );
    let (status, _) = send(
        app,
        "GET",
        "/api/v1/scripts/plan?mode=post-boot",
        &renewed,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    c.cleanup().await;
}

/// A disabled slug that names no script is kept (and warned about), never
/// refused; a config of the wrong shape still is.
pub(crate) async fn disable_scripts_forms(engine: Engine) {
    let c = Ctx::new(engine).await;
    for (i, (params, want)) in [
        ("disable_scripts: postboot1\n", StatusCode::CREATED),
        ("disable_scripts: [a, b]\n", StatusCode::CREATED),
        ("disable_scripts: {a: 1}\n", StatusCode::BAD_REQUEST),
    ]
    .into_iter()
    .enumerate()
    {
        let slug = format!("g{i}");
        let (status, v) = c
            .call(
                "POST",
                "/api/v1/groups/",
                Some(json!({"slug": slug, "config_params": params})),
            )
            .await;
        assert_eq!(status, want, "{params}: {v}");
    }
    c.post("systems", json!({"hostname": "c09", "groups": ["g0"]}))
        .await;
    let cfg = c.ok("GET", "/api/v1/systems/c09/config", None).await;
    assert_eq!(cfg["disable_scripts"], json!(["postboot1"]));
    c.cleanup().await;
}
