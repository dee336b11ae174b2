//! The pages of an image, a script and a job, on every engine, through the
//! router: an image's versions with their build jobs, checksums and hosts,
//! and its Rebuild button; who runs a script (through a group, through the
//! image, not where a layer disables it: as the node's plan says), a page
//! at a time; a job's status and output, and Retry through the API and the
//! page. Read-only users and job servers are refused, a job that did not
//! fail is refused with its state, and bad input to the new forms is a
//! 4xx with a message.

use axum::http::StatusCode;
use mprov_api::jobs::{CLAIM_PATH, HOSTING_PATH};
use mprov_control::db::Engine;
use serde_json::{Value, json};

use super::common::Ctx;
use super::pages::{add_user, get, post, sign_in};
use super::scopes::{Cred, SHA, ctx_with_signer, enroll_jobserver, send};

/// An admin's and a read-only user's session cookies.
async fn sessions(c: &Ctx) -> (String, String) {
    add_user(c, "ada", "correct horse battery", true).await;
    add_user(c, "bob", "staple battery horse", false).await;
    (
        sign_in(c, "ada", "correct horse battery").await,
        sign_in(c, "bob", "staple battery horse").await,
    )
}

async fn pages_details_image_builds_and_rebuild(engine: Engine) {
    let (c, _tls) = ctx_with_signer(engine).await;
    let (ada, bob) = sessions(&c).await;
    let (ada, bob) = (Some(ada.as_str()), Some(bob.as_str()));
    c.post(
        "jobservers",
        json!({"name": "js1", "modules": ["image-update"]}),
    )
    .await;
    let js1 = Cred::Cert(enroll_jobserver(&c, "js1").await);
    let image = c.post("images", json!({"slug": "compute"})).await;
    let id = image["id"].as_i64().expect("id");
    // Version 2 is built by js1 and published with its files.
    c.patch("/api/v1/images/compute", json!({"needs_rebuild": true}))
        .await;
    let (status, job) = send(
        &c.app,
        "POST",
        CLAIM_PATH,
        &js1,
        Some(json!({"modules": ["image-update"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{job}");
    let rootfs = "cd".repeat(32);
    let (status, v) = send(
        &c.app,
        "POST",
        HOSTING_PATH,
        &js1,
        Some(json!({"image": "compute", "version": 2, "files": [
            {"name": "rootfs.tar.zst", "size": 4096, "sha256": rootfs},
            {"name": "vmlinuz", "size": 100, "sha256": SHA},
        ]})),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    c.patch(
        &format!("/api/v1/jobs/{}", job["id"]),
        json!({"status": "success", "return_code": 0}),
    )
    .await;

    // The page: the current version, its checksum, its build job and host.
    let page = get(&c, &format!("/admin/images/{id}/"), ada).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let builds = &page.body[page.body.find("Versions and builds").expect("section")..];
    for want in [
        "<td>2 (current)</td>",
        rootfs.as_str(),
        &format!("href=\"/admin/jobs/{}/\"", job["id"]),
        "status-success",
        "on js1",
        "<td>js1</td>",
        &format!("action=\"/admin/images/{id}/rebuild\""),
    ] {
        assert!(builds.contains(want), "{want} in {builds}");
    }
    let csrf = page.hidden("csrf");

    // A read-only user sees it without the button, and may not press it.
    let read_only = get(&c, "/admin/images/compute/", bob).await;
    assert_eq!(read_only.status, StatusCode::OK);
    assert!(read_only.body.contains(rootfs.as_str()));
    assert!(!read_only.body.contains("/rebuild\""), "{}", read_only.body);
    let bob_csrf = read_only.hidden("csrf");
    let refused = post(
        &c,
        "/admin/images/compute/rebuild",
        bob,
        &[],
        &[("csrf", &bob_csrf)],
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    // Bad input: a stale token, a field the button does not send, no such
    // image; none of them rebuilds anything.
    for (path, form, want, says) in [
        (
            "/admin/images/compute/rebuild",
            vec![("csrf", "stale")],
            StatusCode::FORBIDDEN,
            "security token",
        ),
        (
            "/admin/images/compute/rebuild",
            vec![("csrf", csrf.as_str()), ("version", "9")],
            StatusCode::BAD_REQUEST,
            "unknown field",
        ),
        (
            "/admin/images/nope/rebuild",
            vec![("csrf", csrf.as_str())],
            StatusCode::NOT_FOUND,
            "nope",
        ),
    ] {
        let bad = post(&c, path, ada, &[], &form).await;
        assert_eq!(bad.status, want, "{path} {form:?}: {}", bad.body);
        assert!(bad.body.contains(says), "{says} in {}", bad.body);
    }
    let stored = c.ok("GET", "/api/v1/images/compute", None).await;
    assert_eq!(stored["version"], 2, "nothing rebuilt yet");

    // Rebuild: what the API's rebuild does.
    let done = post(
        &c,
        "/admin/images/compute/rebuild",
        ada,
        &[],
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(done.location(), format!("/admin/images/{id}/?rebuilt=1"));
    let stored = c.ok("GET", "/api/v1/images/compute", None).await;
    assert_eq!(stored["version"], 3);
    assert_eq!(stored["rootfs_sha256"], "");
    assert_eq!(stored["jobservers"], json!([]));
    let queued = c
        .ok(
            "GET",
            "/api/v1/jobs/?module=image-update&status=pending",
            None,
        )
        .await;
    let params: Vec<&Value> = queued["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|j| &j["params"])
        .collect();
    assert_eq!(params, [&json!({"image": "compute", "version": 3})]);
    let after = get(&c, done.location(), ada).await;
    assert_eq!(after.status, StatusCode::OK);
    let builds = &after.body[after.body.find("Versions and builds").expect("section")..];
    for want in [
        "Rebuild requested",
        "<td>3 (current)</td>",
        "not published",
        "no job server yet",
        "status-pending",
        "<td>2</td>",
        rootfs.as_str(),
    ] {
        assert!(builds.contains(want), "{want} in {builds}");
    }
    c.cleanup().await;
}

async fn pages_details_who_runs_a_script(engine: Engine) {
    let c = Ctx::new(engine).await;
    let (ada, bob) = sessions(&c).await;
    let (ada, bob) = (Some(ada.as_str()), Some(bob.as_str()));
    c.post(
        "scripts",
        json!({"slug": "base", "script_type": "post-boot", "content": "#!/bin/sh\n"}),
    )
    .await;
    let setup = c
        .post(
            "scripts",
            json!({"slug": "setup", "script_type": "post-boot", "content": "#!/bin/sh\necho setup\n", "depends_on": ["base"]}),
        )
        .await;
    let id = setup["id"].as_i64().expect("id");
    c.post("groups", json!({"slug": "gpu", "scripts": ["setup"]}))
        .await;
    c.post("images", json!({"slug": "compute", "scripts": ["setup"]}))
        .await;
    // Through the group; through the group but disabled by its own layer;
    // through the image; not at all.
    c.post("systems", json!({"hostname": "g01", "groups": ["gpu"]}))
        .await;
    c.post(
        "systems",
        json!({"hostname": "d01", "groups": ["gpu"], "config_params": "disable_scripts: [setup]"}),
    )
    .await;
    c.post("systems", json!({"hostname": "i01", "image": "compute"}))
        .await;
    c.post("systems", json!({"hostname": "n01"})).await;

    let page = get(&c, &format!("/admin/scripts/{id}/"), bob).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let deps = &page.body[page.body.find("Depends on</h2>").expect("deps")..];
    assert!(
        deps.contains("<a href=\"/admin/scripts/base/\">base</a>"),
        "{deps}"
    );
    let runners = &page.body[page.body.find("Who runs it").expect("runners")..];
    assert!(runners.contains("3 system(s) list it"), "{runners}");
    let row = |host: &str| {
        let at = runners
            .find(&format!(">{host}</a>"))
            .unwrap_or_else(|| panic!("{host} in {runners}"));
        runners[at..at + runners[at..].find("</tr>").expect("row end")].to_owned()
    };
    assert!(row("g01").contains("runs-yes") && row("g01").contains("from group:gpu"));
    assert!(row("i01").contains("runs-yes") && row("i01").contains("from image"));
    assert!(row("d01").contains("runs-disabled"), "{}", row("d01"));
    assert!(!runners.contains(">n01</a>"), "{runners}");
    // The page says what the plans say.
    for (host, runs) in [("g01", true), ("i01", true), ("d01", false), ("n01", false)] {
        let plan = c
            .ok(
                "GET",
                &format!("/api/v1/scripts/plan?mode=post-boot&system={host}"),
                None,
            )
            .await;
        let has = plan["scripts"]
            .as_array()
            .expect("scripts")
            .iter()
            .any(|s| s["slug"] == "setup");
        assert_eq!(has, runs, "{host}: {plan}");
    }

    // Many systems: a page at a time, with the count.
    let many: Vec<Value> = (0..30)
        .map(|i| json!({"hostname": format!("m{i:03}"), "groups": ["gpu"]}))
        .collect();
    c.ok("POST", "/api/v1/systems/bulk", Some(Value::Array(many)))
        .await;
    let first = get(&c, "/admin/scripts/setup/", ada).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(
        first.body.contains("33 system(s) list it"),
        "{}",
        first.body
    );
    assert_eq!(first.body.matches("class=\"runs-").count(), 25);
    let next_at = first.body.find("?after=").expect("a next link");
    let next: String = first.body[next_at..]
        .chars()
        .take_while(|ch| *ch != '"' && *ch != '#')
        .collect();
    let second = get(&c, &format!("/admin/scripts/{id}/{next}"), ada).await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.body);
    assert_eq!(second.body.matches("class=\"runs-").count(), 8);
    assert!(!second.body.contains("?after="), "the last page");
    let bad = get(&c, "/admin/scripts/setup/?after=soon", ada).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("after"), "{}", bad.body);

    // The editor: a monospace textarea that keeps the script's lines,
    // stored with Unix line ends whatever the browser sent.
    assert!(
        first.body.contains(
            "<textarea id=\"f-content\" name=\"content\" rows=\"20\" cols=\"60\" class=\"code\""
        ),
        "{}",
        first.body
    );
    assert!(first.body.contains(">\n#!/bin/sh\necho setup\n</textarea>"));
    let csrf = first.hidden("csrf");
    let saved = post(
        &c,
        &format!("/admin/scripts/{id}/"),
        ada,
        &[],
        &[
            ("csrf", &csrf),
            ("slug", "setup"),
            ("script_type", "post-boot"),
            ("content", "\n#!/bin/sh\r\necho  two\r\n\techo tab\r\n"),
        ],
    )
    .await;
    assert_eq!(saved.status, StatusCode::SEE_OTHER, "{}", saved.body);
    let stored = c.ok("GET", "/api/v1/scripts/setup", None).await;
    assert_eq!(stored["content"], "\n#!/bin/sh\necho  two\n\techo tab\n");
    c.cleanup().await;
}

async fn pages_details_job_retry(engine: Engine) {
    let (c, _tls) = ctx_with_signer(engine).await;
    let (ada, bob) = sessions(&c).await;
    let (ada, bob) = (Some(ada.as_str()), Some(bob.as_str()));
    c.post(
        "jobservers",
        json!({"name": "js1", "modules": ["libgenders"]}),
    )
    .await;
    let js1 = Cred::Cert(enroll_jobserver(&c, "js1").await);
    let job = |status: &str| {
        let c = &c;
        let status = status.to_owned();
        async move {
            c.post(
                "jobs",
                json!({"module": "libgenders", "status": status, "output": "boom\n", "return_code": 2}),
            )
            .await["id"]
                .as_i64()
                .expect("id")
        }
    };

    // Through the API: a failed job is queued again, keeping its output.
    let failed = job("failed").await;
    let retry = |id: String| format!("/api/v1/jobs/{id}/retry");
    let (status, v) = send(&c.app, "POST", &retry(failed.to_string()), &js1, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a job server: {v}");
    let again = c.ok("POST", &retry(failed.to_string()), None).await;
    assert_eq!(again["status"], "pending");
    assert_eq!(again["jobserver"], Value::Null);
    assert_eq!(again["ended_at"], Value::Null);
    assert_eq!(again["return_code"], Value::Null);
    let output = again["output"].as_str().expect("output");
    assert!(
        output.starts_with("boom\n") && output.contains("queued again"),
        "{output}"
    );
    // It is claimable again.
    let (status, claimed) = send(
        &c.app,
        "POST",
        CLAIM_PATH,
        &js1,
        Some(json!({"modules": ["libgenders"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{claimed}");
    assert_eq!(claimed["id"], json!(failed));
    // Anything but a failed job is refused with its state; no job is 404.
    let done = job("success").await;
    for (key, want, says) in [
        (failed.to_string(), StatusCode::CONFLICT, "is running"),
        (done.to_string(), StatusCode::CONFLICT, "succeeded"),
        ("999999".to_owned(), StatusCode::NOT_FOUND, "999999"),
        ("abc".to_owned(), StatusCode::NOT_FOUND, "abc"),
    ] {
        let (status, v) = c.call("POST", &retry(key.clone()), None).await;
        assert_eq!(status, want, "{key}: {v}");
        assert!(
            v["message"].as_str().unwrap_or_default().contains(says),
            "{v}"
        );
    }

    // Through the page: status, output and the button.
    let failed = job("failed").await;
    let path = format!("/admin/jobs/{failed}/");
    let page = get(&c, &path, ada).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let section = &page.body[page.body.find("Status and output").expect("section")..];
    for want in [
        "class=\"status-failed\">failed</dd>",
        "<dd>2</dd>",
        ">boom\n</pre>",
        &format!("action=\"/admin/jobs/{failed}/retry\""),
    ] {
        assert!(section.contains(want), "{want} in {section}");
    }
    let csrf = page.hidden("csrf");
    let read_only = get(&c, &path, bob).await;
    assert!(!read_only.body.contains("/retry\""), "{}", read_only.body);
    let bob_csrf = read_only.hidden("csrf");
    let retry_page = format!("/admin/jobs/{failed}/retry");
    let refused = post(&c, &retry_page, bob, &[], &[("csrf", &bob_csrf)]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    for (form, want) in [
        (vec![("csrf", "stale")], StatusCode::FORBIDDEN),
        (
            vec![("csrf", csrf.as_str()), ("status", "pending")],
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let bad = post(&c, &retry_page, ada, &[], &form).await;
        assert_eq!(bad.status, want, "{form:?}: {}", bad.body);
    }
    let stored = c.ok("GET", &format!("/api/v1/jobs/{failed}"), None).await;
    assert_eq!(stored["status"], "failed", "nothing retried yet");
    let done = post(&c, &retry_page, ada, &[], &[("csrf", &csrf)]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(done.location(), format!("{path}?retried=1"));
    let after = get(&c, done.location(), ada).await;
    let section = &after.body[after.body.find("Status and output").expect("section")..];
    assert!(section.contains("Queued again"), "{section}");
    assert!(section.contains("class=\"status-pending\">pending</dd>"));
    assert!(!section.contains("/retry\""), "no button for a pending job");
    // Pressed again (a stale page): refused with the job's state.
    let twice = post(&c, &retry_page, ada, &[], &[("csrf", &csrf)]).await;
    assert_eq!(twice.status, StatusCode::CONFLICT, "{}", twice.body);
    assert!(twice.body.contains("is pending"), "{}", twice.body);
    let missing = post(&c, "/admin/jobs/nope/retry", ada, &[], &[("csrf", &csrf)]).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.body);
    c.cleanup().await;
}

crate::engine_tests!(
    pages_details_image_builds_and_rebuild,
    pages_details_who_runs_a_script,
    pages_details_job_retry,
);
