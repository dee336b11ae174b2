//! The jobs queue: atomic claims under concurrency, what a job server may
//! write of its jobs, publishing and copying image versions, the jobs
//! inventory changes queue, and the sweeps of silent job servers with a
//! controlled clock. In process, on every engine.

use std::collections::{BTreeMap, HashMap};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use mprov_api::jobs::{CLAIM_PATH, HOSTING_PATH, MAX_OUTPUT, REGISTER_PATH, image_files_path};
use mprov_control::config::JobServerSilence;
use mprov_control::db::{Engine, Val};
use serde_json::{Value, json};

use crate::common::{Ctx, VERSION};
use crate::scopes::{
    Cred, SHA, ctx_with_signer, enroll_jobserver, enroll_node, hosted_image, send,
};

/// Creates job server `name` running `modules` and enrolls it: its
/// certificate.
async fn jobserver(c: &Ctx, name: &str, modules: &[&str]) -> (i64, Cred) {
    let row = c
        .post("jobservers", json!({"name": name, "modules": modules}))
        .await;
    let der = enroll_jobserver(c, name).await;
    (row["id"].as_i64().unwrap(), Cred::Cert(der))
}

async fn claim(c: &Ctx, who: &Cred, modules: &[&str]) -> (StatusCode, Value) {
    send(
        &c.app,
        "POST",
        CLAIM_PATH,
        who,
        Some(json!({ "modules": modules })),
    )
    .await
}

/// Registers the job server `who` with `modules` at `address` (its
/// network: the one whose subnet holds it).
async fn register(c: &Ctx, who: &Cred, modules: Value, address: &str) {
    let (status, v) = send(
        &c.app,
        "POST",
        REGISTER_PATH,
        who,
        Some(
            json!({"host_id": format!("host-{address}"), "modules": modules, "port": 8081,
            "addresses": [{"address": address}]}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

async fn job(c: &Ctx, id: &Value) -> Value {
    c.ok("GET", &format!("/api/v1/jobs/{id}"), None).await
}

/// 32 job servers, each with its own certificate, claim one pending job at
/// once: exactly one wins it; then 64 jobs among the 32, each claimed
/// exactly once, by the job server its row names.
pub(crate) async fn claim_race(engine: Engine) {
    const CLAIMERS: usize = 32;
    const JOBS: usize = 64;
    let (c, _tls) = ctx_with_signer(engine).await;
    let mut claimers = Vec::new();
    for i in 0..CLAIMERS {
        claimers.push(jobserver(&c, &format!("js{i:02}"), &["image-update", "libgenders"]).await);
    }
    let only = c
        .post(
            "jobs",
            json!({"module": "image-update", "params": {"image": "compute", "version": 2}}),
        )
        .await;
    let rev = c.revision().await;
    // Every claimer starts at once.
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(CLAIMERS));
    let mut racers = tokio::task::JoinSet::new();
    for (i, (id, cred)) in claimers.iter().cloned().enumerate() {
        let (app, barrier) = (c.app.clone(), barrier.clone());
        racers.spawn(async move {
            barrier.wait().await;
            let body = json!({"modules": ["image-update"]});
            let (status, v) = send(&app, "POST", CLAIM_PATH, &cred, Some(body)).await;
            (i, id, status, v)
        });
    }
    let mut winners = Vec::new();
    while let Some(r) = racers.join_next().await {
        let (i, id, status, v) = r.unwrap();
        match status {
            StatusCode::OK => winners.push((i, id, v)),
            StatusCode::NO_CONTENT => assert_eq!(v, Value::String(String::new()), "{i}"),
            other => panic!("claimer {i}: {other} {v}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one winner: {winners:?}");
    let (_, winner, got) = &winners[0];
    assert_eq!(got["id"], only["id"]);
    assert_eq!(got["module"], "image-update");
    assert_eq!(got["params"], json!({"image": "compute", "version": 2}));
    let stored = job(&c, &only["id"]).await;
    assert_eq!(stored["status"], "running");
    assert_eq!(stored["jobserver"], json!(winner));
    assert!(stored["started_at"].is_string(), "{stored}");
    assert_eq!(c.revision().await, rev + 1, "one claim, one revision");

    // Many jobs, many claimers: each claims until nothing is left.
    for i in 0..JOBS {
        c.post("jobs", json!({"module": "libgenders", "params": {"n": i}}))
            .await;
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(CLAIMERS));
    let mut racers = tokio::task::JoinSet::new();
    for (id, cred) in claimers.iter().cloned() {
        let (app, barrier) = (c.app.clone(), barrier.clone());
        racers.spawn(async move {
            barrier.wait().await;
            let mut mine = Vec::new();
            // Bounded: never more claims than jobs plus the last empty one.
            for _ in 0..=JOBS {
                let body = json!({"modules": ["libgenders", "image-update"]});
                let (status, v) = send(&app, "POST", CLAIM_PATH, &cred, Some(body)).await;
                match status {
                    StatusCode::OK => mine.push(v["id"].as_i64().unwrap()),
                    StatusCode::NO_CONTENT => break,
                    other => panic!("{other} {v}"),
                }
            }
            (id, mine)
        });
    }
    let mut by_job: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    while let Some(r) = racers.join_next().await {
        let (jobserver, mine) = r.unwrap();
        for j in mine {
            by_job.entry(j).or_default().push(jobserver);
        }
    }
    assert_eq!(by_job.len(), JOBS, "every job claimed");
    for (j, who) in &by_job {
        assert_eq!(who.len(), 1, "job {j} claimed by {who:?}");
        let stored = job(&c, &json!(j)).await;
        assert_eq!(stored["status"], "running");
        assert_eq!(stored["jobserver"], json!(who[0]), "job {j}");
    }
    let pending = c.ok("GET", "/api/v1/jobs/?status=pending", None).await;
    assert_eq!(pending["total"], 0, "{pending}");
    c.cleanup().await;
}

/// What a claim takes (the oldest pending job of its modules, for anyone
/// or for itself), who may claim (a job server's own certificate only),
/// and what a job server may write of the jobs it claimed.
pub(crate) async fn claims_and_reports(engine: Engine) {
    let (c, _tls) = ctx_with_signer(engine).await;
    // js1 of network prov, a node c01 on it, and a read-only account.
    let (js1_row, image) = hosted_image(&c).await;
    c.post("systems", json!({"hostname": "c01", "image": image["id"], "nics": [{"mac": "aa:bb:cc:00:22:01", "network": "prov"}]}))
        .await;
    let node = Cred::Cert(enroll_node(&c, "aa:bb:cc:00:22:01").await);
    let js1 = Cred::Cert(enroll_jobserver(&c, "js1").await);
    let js1_id = js1_row["id"].as_i64().unwrap();
    c.patch(
        "/api/v1/jobservers/js1",
        json!({"modules": ["libgenders", "image-sync"]}),
    )
    .await;
    let (js2_id, js2) = jobserver(&c, "js2", &["image-sync"]).await;
    c.post(
        "users",
        json!({"username": "ro", "password": "read-only-pass", "is_admin": false}),
    )
    .await;

    let first = c.post("jobs", json!({"module": "libgenders"})).await;
    let for_js2 = c
        .post(
            "jobs",
            json!({"module": "image-sync", "for_jobserver": js2_id}),
        )
        .await;
    let second = c.post("jobs", json!({"module": "libgenders"})).await;
    let sync_any = c.post("jobs", json!({"module": "image-sync"})).await;

    // Nobody but a job server's certificate claims: not a node, not an
    // admin, not a read-only account, not the anonymous.
    let basic = |user: &str, pass: &str| {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
        )
    };
    let as_user = |auth: String| {
        Request::builder()
            .method("POST")
            .uri(CLAIM_PATH)
            .header(header::AUTHORIZATION, auth)
            .header(header::CONTENT_TYPE, "application/json")
            .header(VERSION, mprov_api::api_version())
            .body(Body::from(json!({"modules": ["libgenders"]}).to_string()))
            .unwrap()
    };
    let (status, v) = c.send(as_user(basic("ro", "read-only-pass"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "read-only: {v}");
    let (status, v) = c.send(as_user(format!("Api-Key {}", c.key))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "admin: {v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("job server's own certificate"),
        "{v}"
    );
    let (status, v) = claim(&c, &node, &["libgenders"]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "node: {v}");
    let (status, _) = claim(&c, &Cred::None, &["libgenders"]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    for id in [&first["id"], &second["id"]] {
        assert_eq!(
            job(&c, id).await["status"],
            "pending",
            "nothing was claimed"
        );
    }

    // Oldest first, of the modules named; a job for js2 is js2's alone.
    let (status, v) = claim(&c, &js1, &[]).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    let (_, v) = claim(&c, &js1, &["libgenders", "image-sync"]).await;
    assert_eq!(v["id"], first["id"]);
    let (_, v) = claim(&c, &js1, &["image-sync"]).await;
    assert_eq!(v["id"], sync_any["id"], "the job for js2 is skipped");
    let (status, _) = claim(&c, &js1, &["image-sync"]).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, v) = claim(&c, &js2, &["image-sync"]).await;
    assert_eq!(v["id"], for_js2["id"]);
    let (status, _) = claim(&c, &js2, &["nothing-of-the-kind"]).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    // js2 writes nothing of js1's job, js1 only the report fields of its own.
    let path = |j: &Value| format!("/api/v1/jobs/{}", j["id"]);
    let before = job(&c, &first["id"]).await;
    for body in [
        json!({"status": "failed"}),
        json!({"output": "js2 was here"}),
        json!({"jobserver": js2_id}),
    ] {
        let (status, v) = send(&c.app, "PATCH", &path(&first), &js2, Some(body)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    }
    let (status, v) = send(
        &c.app,
        "PATCH",
        &path(&first),
        &js1,
        Some(json!({"for_jobserver": js1_id})),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(
        job(&c, &first["id"]).await,
        before,
        "the refused writes changed the job"
    );
    // Output is bounded: a longer report is refused, naming the field.
    let long = "x".repeat(MAX_OUTPUT + 1);
    let (status, v) = send(
        &c.app,
        "PATCH",
        &path(&first),
        &js1,
        Some(json!({"output": long})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["message"].as_str().unwrap().contains("output"), "{v}");
    let tail = "y".repeat(MAX_OUTPUT);
    let (status, v) = send(
        &c.app,
        "PATCH",
        &path(&first),
        &js1,
        Some(json!({"output": tail})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", v["message"]);
    // A final state without an end time gets one; a given one is kept.
    let (status, v) = send(
        &c.app,
        "PATCH",
        &path(&first),
        &js1,
        Some(json!({"status": "success", "return_code": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["ended_at"].is_string(), "{v}");
    let (status, v) = send(
        &c.app,
        "PATCH",
        &path(&second),
        &js1,
        Some(json!({"status": "failed"})),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "not claimed by js1: {v}");
    let (_, v) = claim(&c, &js1, &["libgenders"]).await;
    assert_eq!(v["id"], second["id"]);
    let (_, v) = send(
        &c.app,
        "PATCH",
        &path(&second),
        &js1,
        Some(json!({"status": "running", "output": "half"})),
    )
    .await;
    assert!(v["ended_at"].is_null(), "still running: {v}");
    let (_, v) = send(
        &c.app,
        "PATCH",
        &path(&second),
        &js1,
        Some(json!({"status": "failed", "ended_at": "2026-12-01T10:00:00Z"})),
    )
    .await;
    assert_eq!(v["ended_at"], "2026-12-01T10:00:00Z");
    c.cleanup().await;
}

/// A job server takes only jobs of the modules it registered: one without
/// image-update never gets an image-update job, whatever its claim names;
/// one with it does. Registering it later lets it take them.
pub(crate) async fn claims_follow_registered_modules(engine: Engine) {
    let (c, _tls) = ctx_with_signer(engine).await;
    let (_, syncer) = jobserver(&c, "js1", &["image-sync"]).await;
    let (builder_id, builder) = jobserver(&c, "js2", &["image-update"]).await;
    let (_, late) = jobserver(&c, "js3", &[]).await;
    let update = c
        .post(
            "jobs",
            json!({"module": "image-update", "params": {"image": "compute", "version": 2}}),
        )
        .await;
    for (who, modules) in [
        (&syncer, &["image-update"][..]),
        (&syncer, &["image-sync", "image-update"][..]),
        (&late, &["image-update"][..]),
    ] {
        let (status, v) = claim(&c, who, modules).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{modules:?}: {v}");
    }
    assert_eq!(job(&c, &update["id"]).await["status"], "pending");
    let (status, v) = claim(&c, &builder, &["image-sync", "image-update"]).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["id"], update["id"]);
    assert_eq!(job(&c, &update["id"]).await["jobserver"], json!(builder_id));

    // js3 registers image-update: from then on it takes such jobs.
    let next = c.post("jobs", json!({"module": "image-update"})).await;
    register(&c, &late, json!(["image-update"]), "10.9.0.3").await;
    let (status, v) = claim(&c, &late, &["image-update"]).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["id"], next["id"]);
    c.cleanup().await;
}

fn files(rootfs_sha: &str) -> Value {
    json!([
        {"name": "rootfs.tar.zst", "size": 4096, "sha256": rootfs_sha},
        {"name": "vmlinuz", "size": 100, "sha256": SHA},
        {"name": "manifest.json", "size": 10, "sha256": SHA},
    ])
}

/// A rebuild queues an image-update; the builder publishes the new version
/// with its files (the image's checksum and hosts follow, each other job
/// server running image-sync gets a job for it), a copy is recorded only
/// for a version with files, and only the current version is hosted. An
/// image deleted queues its image-delete.
pub(crate) async fn publish_and_copy(engine: Engine) {
    let (c, _tls) = ctx_with_signer(engine).await;
    // Network a holds the builder js1, the copier js2 and js4; network b
    // holds js3 and js5; compute's only system is on a.
    let (js1, builder) = jobserver(&c, "js1", &["image-update", "image-sync"]).await;
    let (js2, copier) = jobserver(&c, "js2", &["image-sync"]).await;
    let (js3, b_copier) = jobserver(&c, "js3", &["image-sync", "image-delete"]).await;
    let (_, bystander) = jobserver(&c, "js4", &["libgenders"]).await;
    let (js5, _) = jobserver(&c, "js5", &["image-sync"]).await;
    c.post(
        "networks",
        json!({"slug": "a", "subnet": "10.1.0.0", "netmask": 24}),
    )
    .await;
    c.post(
        "networks",
        json!({"slug": "b", "subnet": "10.2.0.0", "netmask": 24}),
    )
    .await;
    for (who, modules, address) in [
        (&builder, json!(["image-update", "image-sync"]), "10.1.0.1"),
        (&copier, json!(["image-sync"]), "10.1.0.2"),
        (&b_copier, json!(["image-sync", "image-delete"]), "10.2.0.3"),
        (&bystander, json!(["libgenders"]), "10.1.0.4"),
    ] {
        register(&c, who, modules, address).await;
    }
    // js5 never registered: its row's address and network place it on b.
    c.patch(
        "/api/v1/jobservers/js5",
        json!({"addresses": ["10.2.0.5"], "network": "b"}),
    )
    .await;
    let image = c.post("images", json!({"slug": "compute"})).await;
    c.post("systems", json!({"hostname": "a01", "image": image["id"], "nics": [{"mac": "aa:bb:cc:00:23:01", "network": "a"}]}))
        .await;
    // A system of network b on another image does not count.
    let other = c.post("images", json!({"slug": "other"})).await;
    c.post("systems", json!({"hostname": "b01", "image": other["id"], "nics": [{"mac": "aa:bb:cc:00:23:02", "network": "b"}]}))
        .await;
    c.patch("/api/v1/images/compute", json!({"needs_rebuild": true}))
        .await;
    let (_, build) = claim(&c, &builder, &["image-update"]).await;
    assert_eq!(build["params"], json!({"image": "compute", "version": 2}));

    let host = |who: &Cred, body: Value| {
        let (app, who) = (c.app.clone(), who.clone());
        async move { send(&app, "POST", HOSTING_PATH, &who, Some(body)).await }
    };
    let rootfs = "ab".repeat(32);
    // Not the current version, no files yet, no rootfs among them: refused.
    let (status, v) = host(
        &builder,
        json!({"image": "compute", "version": 1, "files": files(&rootfs)}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(v["message"].as_str().unwrap().contains("version 2"), "{v}");
    let (status, v) = host(&copier, json!({"image": "compute", "version": 2})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(v["message"].as_str().unwrap().contains("no files"), "{v}");
    let (status, v) = host(&builder, json!({"image": "compute", "version": 2, "files": [{"name": "vmlinuz", "size": 1, "sha256": SHA}]})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("rootfs.tar.zst"),
        "{v}"
    );
    let (status, v) = host(&builder, json!({"image": "nope", "version": 2})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    // Nobody but a job server records hosting.
    let admin = Cred::Key(c.key.clone());
    let (status, v) = host(
        &admin,
        json!({"image": "compute", "version": 2, "files": files(&rootfs)}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let image = c.ok("GET", "/api/v1/images/compute", None).await;
    assert_eq!(
        (&image["rootfs_sha256"], &image["jobservers"]),
        (&json!(""), &json!([]))
    );
    assert_eq!(
        c.ok("GET", "/api/v1/jobs/?module=image-sync", None).await["total"],
        0
    );

    // The builder publishes.
    let rev = c.revision().await;
    let (status, v) = host(
        &builder,
        json!({"image": "compute", "version": 2, "files": files(&rootfs)}),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    assert_eq!(c.revision().await, rev + 1);
    let image = c.ok("GET", "/api/v1/images/compute", None).await;
    assert_eq!(image["rootfs_sha256"], rootfs.as_str());
    assert_eq!(image["rootfs_size"], 4096);
    assert_eq!(image["needs_rebuild"], false);
    assert_eq!(image["jobservers"], json!([js1]));
    let syncs = c
        .ok("GET", "/api/v1/jobs/?module=image-sync&sort=id", None)
        .await;
    let targets: Vec<&Value> = syncs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| &j["for_jobserver"])
        .collect();
    assert_eq!(
        targets,
        [&json!(js2)],
        "only network a's job servers copy it: {syncs}"
    );
    for j in syncs["items"].as_array().unwrap() {
        assert_eq!(
            j["params"],
            json!({"image": "compute", "version": 2, "from": "js1"})
        );
    }
    // Published again (a retried build): no second round of copies.
    let (status, _) = host(
        &builder,
        json!({"image": "compute", "version": 2, "files": files(&rootfs)}),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        c.ok("GET", "/api/v1/jobs/?module=image-sync", None).await["total"],
        1
    );
    let (status, _) = claim(&c, &b_copier, &["image-sync"]).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "js3 is on network b");

    // A copier reads the files it verifies against, claims its job and
    // records its copy.
    let (status, listed) = send(&c.app, "GET", &image_files_path("compute"), &copier, None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let typed: mprov_api::jobs::ImageFiles = serde_json::from_value(listed.clone()).unwrap();
    assert_eq!(
        (typed.image.as_str(), typed.version, typed.files.len()),
        ("compute", 2, 3)
    );
    let by_name: HashMap<&str, &str> = typed
        .files
        .iter()
        .map(|f| (f.name.as_str(), f.sha256.as_str()))
        .collect();
    assert_eq!(by_name["rootfs.tar.zst"], rootfs);
    crate::assert_schema("ImageFiles", &listed);
    let (_, old) = send(
        &c.app,
        "GET",
        &format!("{}?version=1", image_files_path("compute")),
        &copier,
        None,
    )
    .await;
    assert_eq!(
        old["files"],
        json!([]),
        "nothing was recorded for version 1"
    );
    let (status, _) = send(
        &c.app,
        "GET",
        &format!("{}?colour=red", image_files_path("compute")),
        &copier,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = claim(&c, &bystander, &["image-sync"]).await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "js4 does not run image-sync: no job for it"
    );
    let (_, sync) = claim(&c, &copier, &["image-sync"]).await;
    assert_eq!(sync["params"]["from"], "js1");
    let (status, v) = host(&copier, json!({"image": "compute", "version": 2})).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    let image = c.ok("GET", "/api/v1/images/compute", None).await;
    assert_eq!(image["jobservers"], json!([js1, js2]));

    // The next rebuild: version 2 is no longer hosted; its copies are refused.
    c.patch("/api/v1/images/compute", json!({"needs_rebuild": true}))
        .await;
    let (status, v) = host(&copier, json!({"image": "compute", "version": 2})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");

    // Once a system of network b uses compute, b's job servers (the
    // registered js3 and the hand-made js5) copy its next version as well.
    c.patch("/api/v1/systems/b01", json!({"image": image["id"]}))
        .await;
    let (status, v) = host(
        &builder,
        json!({"image": "compute", "version": 3, "files": files(&rootfs)}),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    let syncs = c
        .ok(
            "GET",
            "/api/v1/jobs/?module=image-sync&status=pending&sort=id",
            None,
        )
        .await;
    let targets: Vec<&Value> = syncs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| &j["for_jobserver"])
        .collect();
    assert_eq!(targets, [&json!(js2), &json!(js3), &json!(js5)], "{syncs}");

    // The image deleted: an image-delete job that outlives it.
    c.ok("DELETE", "/api/v1/images/compute", None).await;
    let deletes = c.ok("GET", "/api/v1/jobs/?module=image-delete", None).await;
    assert_eq!(deletes["total"], 1, "{deletes}");
    assert_eq!(
        deletes["items"][0]["params"],
        json!({"image": "compute", "version": 3})
    );
    assert_eq!(deletes["items"][0]["status"], "pending");
    c.cleanup().await;
}

/// Sets job server `name`'s last heartbeat.
async fn heard_at(c: &Ctx, name: &str, at: &str) {
    let db = &c.state.db;
    let mut sql = db.sql();
    sql.push("UPDATE jobservers SET heartbeat_at = ")
        .bind(Val::Text(Some(at.into())))
        .push(" WHERE name = ")
        .bind(Val::Text(Some(name.into())));
    sql.query().execute(db.pool()).await.unwrap();
}

/// The sweeps with a controlled clock: the running jobs of a job server
/// silent for the limit fail with the reason, a fresh one's do not; a job
/// server silent for days is deleted with its certificates revoked; zero
/// turns each off.
pub(crate) async fn sweeps_with_a_controlled_clock(engine: Engine) {
    let (c, _tls) = ctx_with_signer(engine).await;
    let (_, silent) = jobserver(&c, "js1", &["libgenders"]).await;
    let (_, fresh) = jobserver(&c, "js2", &["libgenders"]).await;
    let (_, gone) = jobserver(&c, "js3", &["libgenders"]).await;
    for _ in 0..2 {
        c.post("jobs", json!({"module": "libgenders"})).await;
    }
    let (_, a) = claim(&c, &silent, &["libgenders"]).await;
    let (_, b) = claim(&c, &fresh, &["libgenders"]).await;
    send(
        &c.app,
        "PATCH",
        &format!("/api/v1/jobs/{}", a["id"]),
        &silent,
        Some(json!({"output": "building\n"})),
    )
    .await;
    let now: jiff::Timestamp = "2026-12-03T12:00:00Z".parse().unwrap();
    heard_at(&c, "js1", "2026-12-03T11:49:00Z").await;
    heard_at(&c, "js2", "2026-12-03T11:51:00Z").await;
    heard_at(&c, "js3", "2026-11-30T11:59:00Z").await;
    let sweep = |limits: JobServerSilence| mprov_control::jobs::sweep(&c.state.db, now, limits);
    let off = JobServerSilence {
        fail_jobs_after_minutes: 0,
        delete_after_days: 0,
    };
    assert_eq!(sweep(off).await.unwrap(), Default::default());
    assert_eq!(job(&c, &a["id"]).await["status"], "running");

    let rev = c.revision().await;
    let swept = sweep(JobServerSilence {
        fail_jobs_after_minutes: 10,
        ..off
    })
    .await
    .unwrap();
    assert_eq!(swept.failed_jobs, [a["id"].as_i64().unwrap()]);
    assert!(swept.deleted_jobservers.is_empty());
    assert_eq!(c.revision().await, rev + 1);
    let failed = job(&c, &a["id"]).await;
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["ended_at"], "2026-12-03T12:00:00Z");
    let output = failed["output"].as_str().unwrap();
    assert!(output.starts_with("building\n"), "{output}");
    assert!(
        output.contains("job server js1 was last heard from at 2026-12-03T11:49:00Z")
            && output.contains("JOBSERVER_FAIL_JOBS_AFTER_MINUTES"),
        "{output}"
    );
    assert_eq!(
        job(&c, &b["id"]).await["status"],
        "running",
        "js2 was heard 9 minutes ago"
    );
    // Once failed, a job stays failed at the next sweep.
    let again = sweep(JobServerSilence {
        fail_jobs_after_minutes: 10,
        ..off
    })
    .await
    .unwrap();
    assert!(again.failed_jobs.is_empty(), "{again:?}");

    // Days of silence: js3 goes, its certificate with it; 3 days is not 4.
    let live = |name: &'static str| {
        let c = &c;
        async move {
            let v = c
                .ok(
                    "GET",
                    &format!("/api/v1/credentials/?identity={name}"),
                    None,
                )
                .await;
            v["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|x| x["revoked_at"].is_null())
                .count()
        }
    };
    assert_eq!(live("js3").await, 1);
    let kept = sweep(JobServerSilence {
        delete_after_days: 4,
        ..off
    })
    .await
    .unwrap();
    assert!(kept.deleted_jobservers.is_empty(), "{kept:?}");
    let swept = sweep(JobServerSilence {
        delete_after_days: 2,
        ..off
    })
    .await
    .unwrap();
    assert_eq!(swept.deleted_jobservers, ["js3"]);
    assert_eq!(live("js3").await, 0, "its certificate was revoked");
    let (status, _) = c.call("GET", "/api/v1/jobservers/js3", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = claim(&c, &gone, &["libgenders"]).await;
    assert!(
        status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN,
        "{status}"
    );
    assert_eq!(live("js1").await, 1, "js1 was silent for minutes, not days");
    c.cleanup().await;
}
