//! The filter box on the systems list, the bulk action page and the audit
//! page, as a browser without JavaScript uses them: a bookmarkable
//! `?filter=`, a bad filter's message next to its box (400, never 500), the
//! preview with its count, the confirmation form carrying that count and
//! the CSRF token, a stale count refused (409), read-only accounts shown no
//! button and refused (403), and the audit entry.

use axum::http::StatusCode;
use mprov_control::db::Engine;
use serde_json::json;

use crate::common::Ctx;
use crate::pages::{add_user, get, post, sign_in};

fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

async fn members(c: &Ctx, group: &str) -> Vec<String> {
    let v = c
        .ok(
            "GET",
            &format!(
                "/api/v1/systems/?sort=hostname&filter={}",
                encode(&format!("group:{group}"))
            ),
            None,
        )
        .await;
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["hostname"].as_str().unwrap().to_owned())
        .collect()
}

async fn pages_filter_and_bulk(engine: Engine) {
    let c = Ctx::new(engine).await;
    for g in ["compute", "spare"] {
        c.post("groups", json!({"slug": g})).await;
    }
    for (host, groups) in [
        ("c01", vec!["compute"]),
        ("c02", vec!["compute"]),
        ("x03", vec![]),
    ] {
        c.post(
            "systems",
            json!({"hostname": host, "groups": groups, "rack": "r1"}),
        )
        .await;
    }
    add_user(&c, "ada", "correct horse battery", true).await;
    add_user(&c, "ro", "read-only-password", false).await;
    let admin = sign_in(&c, "ada", "correct horse battery").await;
    let reader = sign_in(&c, "ro", "read-only-password").await;

    // The list's filter box: the URL is the bookmark.
    let list = get(
        &c,
        &format!("/admin/systems/?filter={}", encode("group:compute")),
        Some(&admin),
    )
    .await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    assert!(
        list.body
            .contains(r#"id="filter" name="filter" value="group:compute""#),
        "{}",
        list.body
    );
    assert!(list.body.contains("2 matching"), "{}", list.body);
    assert!(list.body.contains(">c01<") && list.body.contains(">c02<"));
    assert!(!list.body.contains(">x03<"));
    assert!(
        list.body
            .contains("/admin/systems/bulk?filter=group%3Acompute"),
        "{}",
        list.body
    );
    // A bad filter: its message next to the box, a 400 page, no rows.
    let bad = get(
        &c,
        &format!("/admin/systems/?filter={}", encode("colour:red")),
        Some(&admin),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(bad.body.contains(r#"id="filter-error""#), "{}", bad.body);
    assert!(bad.body.contains("unknown key"), "{}", bad.body);
    assert!(bad.body.contains(r#"aria-invalid="true""#));
    assert!(!bad.body.contains(">c01<"));

    // The preview: the count, the host names, a form carrying the count.
    let path = format!(
        "/admin/systems/bulk?filter={}&action=add_to_group&arg=spare",
        encode("group:compute")
    );
    let preview = get(&c, &path, Some(&admin)).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    assert!(preview.body.contains("2 systems match"), "{}", preview.body);
    assert!(preview.body.contains("c01, c02"), "{}", preview.body);
    assert_eq!(preview.hidden("confirm_count"), "2");
    assert!(preview.body.contains(r#"id="apply-button""#));
    let csrf = preview.hidden("csrf");
    assert_eq!(
        members(&c, "spare").await,
        Vec::<String>::new(),
        "a preview changes nothing"
    );

    // A read-only account sees the preview without a button, and its post
    // is refused.
    let seen = get(&c, &path, Some(&reader)).await;
    assert_eq!(seen.status, StatusCode::OK, "{}", seen.body);
    assert!(seen.body.contains("2 systems match"));
    assert!(!seen.body.contains(r#"id="apply-button""#), "{}", seen.body);
    let reader_csrf = seen.hidden("csrf");
    let form = |csrf: &str, count: &str| {
        vec![
            ("csrf".to_owned(), csrf.to_owned()),
            ("filter".to_owned(), "group:compute".to_owned()),
            ("action".to_owned(), "add_to_group".to_owned()),
            ("arg".to_owned(), "spare".to_owned()),
            ("confirm_count".to_owned(), count.to_owned()),
        ]
    };
    let send = |cookie: String, fields: Vec<(String, String)>| {
        let c = &c;
        async move {
            let refs: Vec<(&str, &str)> = fields
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            post(c, "/admin/systems/bulk", Some(&cookie), &[], &refs).await
        }
    };
    let refused = send(reader.clone(), form(&reader_csrf, "2")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    // Another session's token: CSRF refuses it.
    let stale = send(admin.clone(), form(&reader_csrf, "2")).await;
    assert_eq!(stale.status, StatusCode::FORBIDDEN, "{}", stale.body);
    // A count that is not the filter's now: 409 with the new preview.
    let changed = send(admin.clone(), form(&csrf, "3")).await;
    assert_eq!(changed.status, StatusCode::CONFLICT, "{}", changed.body);
    assert!(
        changed.body.contains("now matches 2 systems, not the 3"),
        "{}",
        changed.body
    );
    assert_eq!(changed.hidden("confirm_count"), "2");
    assert_eq!(members(&c, "spare").await, Vec::<String>::new());

    // The confirmed count: applied, then the audit log.
    let done = send(admin.clone(), form(&csrf, "2")).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(done.location(), "/admin/audit/");
    assert_eq!(members(&c, "spare").await, ["c01", "c02"]);
    let audit = get(&c, "/admin/audit/", Some(&reader)).await;
    assert_eq!(audit.status, StatusCode::OK, "{}", audit.body);
    for needle in [
        "add_to_group",
        "group spare",
        "<td>ada</td>",
        "<td>2</td>",
        "<code>group:compute</code>",
    ] {
        assert!(audit.body.contains(needle), "{needle}: {}", audit.body);
    }

    // Bad input on the bulk page: a message, a 4xx, never a 500.
    for (query, needle) in [
        (
            format!(
                "filter={}&action=add_to_group&arg=spare",
                encode("rack:\"open")
            ),
            "no closing",
        ),
        (
            "filter=&action=add_to_group&arg=nosuch".to_owned(),
            "there is no group",
        ),
        ("filter=&action=reboot".to_owned(), "unknown action"),
        (
            "filter=&action=set_netboot&arg=maybe".to_owned(),
            "on or off",
        ),
    ] {
        let page = get(&c, &format!("/admin/systems/bulk?{query}"), Some(&admin)).await;
        assert_eq!(
            page.status,
            StatusCode::BAD_REQUEST,
            "{query}: {}",
            page.body
        );
        assert!(page.body.contains(needle), "{query}: {}", page.body);
        assert!(page.body.contains(r#"id="bulk-error""#));
        assert!(!page.body.contains(r#"id="apply-button""#));
    }
    let missing = send(
        admin.clone(),
        vec![
            ("csrf".into(), csrf.clone()),
            ("filter".into(), String::new()),
            ("action".into(), "run_scripts".into()),
        ],
    )
    .await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST, "{}", missing.body);
    assert!(
        missing.body.contains("carries no count"),
        "{}",
        missing.body
    );
    c.cleanup().await;
}

crate::engine_tests!(pages_filter_and_bulk);
