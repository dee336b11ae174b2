//! The inventory pages, on every engine, through the router: a system
//! created and edited through the forms, each validation message next to
//! its field with a 4xx (wrong types, oversized values, unknown fields, a
//! stale token), a read-only session refused by the access rules, a
//! group's members added and removed one at a time, and a list page whose
//! statement count does not grow with the rows or the page's depth.

use axum::http::StatusCode;
use mprov_control::db::Engine;
use serde_json::{Value, json};

use super::common::Ctx;
use super::pages::{add_user, get, post, sign_in};

/// The systems, `n` of them named `{prefix}NNNN`, created through the API.
async fn systems(c: &Ctx, prefix: &str, n: usize) {
    let rows: Vec<Value> = (0..n)
        .map(|i| json!({"hostname": format!("{prefix}{i:04}")}))
        .collect();
    for chunk in rows.chunks(500) {
        c.ok(
            "POST",
            "/api/v1/systems/bulk",
            Some(Value::Array(chunk.to_vec())),
        )
        .await;
    }
}

async fn system(c: &Ctx, key: &str) -> Value {
    c.ok("GET", &format!("/api/v1/systems/{key}"), None).await
}

async fn pages_inventory_forms(engine: Engine) {
    let c = Ctx::new(engine).await;
    add_user(&c, "ada", "correct horse battery", true).await;
    let cookie = sign_in(&c, "ada", "correct horse battery").await;
    let ck = Some(cookie.as_str());
    c.post("images", json!({"slug": "rocky9"})).await;

    // The form comes from the descriptor: a select for the reference, a
    // checkbox for a boolean, a number for an integer, the server-kept
    // field shown and not editable.
    let form = get(&c, "/admin/systems/new", ck).await;
    assert_eq!(form.status, StatusCode::OK, "{}", form.body);
    for want in [
        "name=\"hostname\"",
        "<select id=\"f-image\" name=\"image\"",
        ">rocky9</option>",
        "type=\"checkbox\" id=\"f-netboot\"",
        "type=\"number\" id=\"f-tmpfs_root_size\"",
        "<textarea id=\"f-config_params\"",
    ] {
        assert!(form.body.contains(want), "{want} in {}", form.body);
    }
    assert!(!form.body.contains("name=\"run_request\""), "read-only");
    let csrf = form.hidden("csrf");

    // Created through the form.
    let made = post(
        &c,
        "/admin/systems/new",
        ck,
        &[],
        &[
            ("csrf", &csrf),
            ("hostname", "c01"),
            ("image", "rocky9"),
            ("tmpfs_root_size", "8"),
            ("netboot", "false"),
            ("netboot", "true"),
            ("stateful", "false"),
        ],
    )
    .await;
    assert_eq!(made.status, StatusCode::SEE_OTHER, "{}", made.body);
    let s = system(&c, "c01").await;
    assert_eq!(s["tmpfs_root_size"], 8);
    assert_eq!(s["netboot"], true);
    assert!(s["image"].is_i64());
    let id = s["id"].as_i64().expect("id");
    assert_eq!(made.location(), format!("/admin/systems/{id}/?saved=1"));
    let shown = get(&c, made.location(), ck).await;
    assert_eq!(shown.status, StatusCode::OK);
    assert!(shown.body.contains("value=\"c01\""), "{}", shown.body);

    // Each sort of bad input: the message next to its field, what was
    // typed kept, a 4xx.
    let cases: [(&str, &str, &str); 4] = [
        ("hostname", "bad host", "hostname"),
        ("tmpfs_root_size", "lots", "expected an integer"),
        ("initial_mods", &"m".repeat(300), "at most 255 characters"),
        ("config_params", "[1, 2]", "config_params"),
    ];
    for (field, value, says) in cases {
        let mut form = vec![("csrf", csrf.as_str()), ("hostname", "c02")];
        form.retain(|(k, _)| *k != field);
        form.push((field, value));
        let bad = post(&c, "/admin/systems/new", ck, &[], &form).await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{field}: {}", bad.body);
        let at = bad
            .body
            .find(&format!("id=\"e-{field}\""))
            .unwrap_or_else(|| panic!("no message at {field}: {}", bad.body));
        let msg = &bad.body[at..at + 400.min(bad.body.len() - at)];
        assert!(msg.contains(says), "{field}: {msg}");
        assert!(
            bad.body
                .contains(&format!("aria-describedby=\"d-{field} e-{field}\"")),
            "{field}"
        );
        assert!(bad.body.contains("aria-invalid=\"true\""), "{field}");
        if field != "config_params" {
            assert!(
                bad.body.contains(&format!("value=\"{value}\"")),
                "typed value kept"
            );
        }
    }
    let unknown = post(
        &c,
        "/admin/systems/new",
        ck,
        &[],
        &[("csrf", &csrf), ("hostname", "c02"), ("colour", "blue")],
    )
    .await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    assert!(
        unknown.body.contains("colour: unknown field"),
        "{}",
        unknown.body
    );
    let taken = post(
        &c,
        "/admin/systems/new",
        ck,
        &[],
        &[("csrf", &csrf), ("hostname", "c01")],
    )
    .await;
    assert!(taken.status.is_client_error(), "{}", taken.status);
    let stale = post(
        &c,
        "/admin/systems/new",
        ck,
        &[],
        &[("csrf", "old"), ("hostname", "c03")],
    )
    .await;
    assert_eq!(stale.status, StatusCode::FORBIDDEN);
    // A duplicate field of another type, an oversized body: still 4xx.
    let huge = "x".repeat(3 << 20);
    let big = post(
        &c,
        "/admin/systems/new",
        ck,
        &[],
        &[
            ("csrf", &csrf),
            ("hostname", "c04"),
            ("config_params", &huge),
        ],
    )
    .await;
    assert!(big.status.is_client_error(), "{}", big.status);
    let listed = c.ok("GET", "/api/v1/systems/", None).await;
    assert_eq!(listed["total"], 1, "nothing bad was written");

    // Edited through the form.
    let path = format!("/admin/systems/{id}/");
    let edit = post(
        &c,
        &path,
        ck,
        &[],
        &[
            ("csrf", &csrf),
            ("hostname", "c01"),
            ("image", ""),
            ("tmpfs_root_size", "16"),
            ("netboot", "false"),
            ("stateful", "false"),
            ("stateful", "true"),
        ],
    )
    .await;
    assert_eq!(edit.status, StatusCode::SEE_OTHER, "{}", edit.body);
    let s = system(&c, "c01").await;
    assert_eq!(s["tmpfs_root_size"], 16);
    assert_eq!(
        (s["netboot"].clone(), s["stateful"].clone()),
        (json!(false), json!(true))
    );
    assert!(s["image"].is_null());
    let bad_edit = post(
        &c,
        &path,
        ck,
        &[],
        &[("csrf", &csrf), ("tmpfs_root_size", "-3")],
    )
    .await;
    assert_eq!(bad_edit.status, StatusCode::BAD_REQUEST);
    assert!(bad_edit.body.contains("id=\"e-tmpfs_root_size\""));
    let ro = post(&c, &path, ck, &[], &[("csrf", &csrf), ("run_request", "5")]).await;
    assert_eq!(ro.status, StatusCode::BAD_REQUEST, "a server-kept field");

    // Delete asks first, then deletes.
    let confirm = get(&c, &format!("{path}delete"), ck).await;
    assert_eq!(confirm.status, StatusCode::OK);
    assert!(confirm.body.contains("cannot be undone"));

    // A read-only session reads everything and changes nothing.
    add_user(&c, "viewer", "look but do not touch", false).await;
    let vcookie = sign_in(&c, "viewer", "look but do not touch").await;
    let vk = Some(vcookie.as_str());
    let vlist = get(&c, "/admin/systems/", vk).await;
    assert_eq!(vlist.status, StatusCode::OK);
    assert!(vlist.body.contains(">c01<"), "{}", vlist.body);
    assert!(!vlist.body.contains("/admin/systems/new"));
    let vpage = get(&c, &path, vk).await;
    assert!(
        !vpage
            .body
            .contains("<form method=\"post\" action=\"/admin/systems/")
    );
    assert!(!vpage.body.contains("delete"));
    let vcsrf = vpage.hidden("csrf");
    for (target, form) in [
        (
            path.clone(),
            vec![("csrf", vcsrf.as_str()), ("tmpfs_root_size", "1")],
        ),
        (
            "/admin/systems/new".into(),
            vec![("csrf", vcsrf.as_str()), ("hostname", "v1")],
        ),
        (format!("{path}delete"), vec![("csrf", vcsrf.as_str())]),
    ] {
        let refused = post(&c, &target, vk, &[], &form).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{target}");
        assert!(
            refused
                .body
                .contains("may read the inventory but not change it")
        );
    }
    assert_eq!(system(&c, "c01").await["tmpfs_root_size"], 16);

    let gone = post(&c, &format!("{path}delete"), ck, &[], &[("csrf", &csrf)]).await;
    assert_eq!(gone.status, StatusCode::SEE_OTHER);
    let (status, _) = c.call("GET", "/api/v1/systems/c01", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    c.cleanup().await;
}

/// A page's statements and the page.
async fn count(c: &Ctx, ck: Option<&str>, path: impl Into<String>) -> (u64, super::pages::Answer) {
    let path = path.into();
    let before = c.state.db.statements();
    let page = get(c, &path, ck).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    (c.state.db.statements() - before, page)
}

async fn pages_inventory_lists(engine: Engine) {
    let c = Ctx::new(engine).await;
    add_user(&c, "ada", "correct horse battery", true).await;
    let cookie = sign_in(&c, "ada", "correct horse battery").await;
    let ck = Some(cookie.as_str());
    c.post("groups", json!({"slug": "rack1"})).await;
    systems(&c, "n", 10).await;

    let (small, _) = count(&c, ck, "/admin/systems/".to_owned()).await;
    systems(&c, "m", 490).await;
    let (large, first) = count(&c, ck, "/admin/systems/".to_owned()).await;
    assert_eq!(small, large, "statements per list page: 10 rows vs 500");
    // A deep page (keyset) costs the same.
    let end = first.body.find("\" rel=\"next\"").expect("a next link");
    let start = first.body[..end].rfind("href=\"?").expect("its href") + "href=\"?".len();
    let next = first.body[start..end].replace("&amp;", "&");
    assert!(next.contains("cursor="), "{next}");
    let (deep, second) = count(&c, ck, format!("/admin/systems/?{next}")).await;
    assert_eq!(deep, large, "a deeper page");
    assert!(second.body.contains(">m0040<"), "page two of 500 by id");
    assert!(!second.body.contains(">m0039<"));
    // Search, filter and sort, bookmarkable.
    let (_, found) = count(&c, ck, "/admin/systems/?q=M004&sort=-hostname".to_owned()).await;
    assert!(found.body.contains("10 matching"), "{}", found.body);
    let first_row = found.body.find(">m0049<").expect("m0049");
    assert!(
        first_row < found.body.find(">m0040<").expect("m0040"),
        "descending"
    );
    let (_, none) = count(&c, ck, "/admin/systems/?q=%25".to_owned()).await;
    assert!(
        none.body.contains("0 matching"),
        "% is a character, not a wildcard"
    );
    let bad = get(&c, "/admin/systems/?sort=config_params", ck).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let bad = get(&c, "/admin/systems/?colour=blue", ck).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let bad = get(&c, "/admin/systems/?cursor=zzz", ck).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    // A group's members: added and removed one at a time, whatever its size.
    let group = c.ok("GET", "/api/v1/groups/rack1", None).await;
    let gid = group["id"].as_i64().expect("id");
    let members: Vec<Value> = (0..400).map(|i| json!(format!("m{i:04}"))).collect();
    c.patch("/api/v1/groups/rack1", json!({"systems": members}))
        .await;
    let mpath = format!("/admin/groups/{gid}/systems/");
    let page = get(&c, &format!("{mpath}?aq=n0003"), ck).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("Current systems (400)"), "{}", page.body);
    assert!(page.body.contains("1 not yet linked"), "{}", page.body);
    let csrf = page.hidden("csrf");
    let n3 = c.ok("GET", "/api/v1/systems/n0003", None).await["id"].to_string();
    let added = post(
        &c,
        &format!("{mpath}?aq=n0003"),
        ck,
        &[],
        &[("csrf", &csrf), ("_op", "add"), ("target", &n3)],
    )
    .await;
    assert_eq!(added.status, StatusCode::SEE_OTHER, "{}", added.body);
    assert_eq!(added.location(), format!("{mpath}?aq=n0003"));
    let removed = post(
        &c,
        &mpath,
        ck,
        &[],
        &[("csrf", &csrf), ("_op", "remove"), ("target", "m0000")],
    )
    .await;
    assert_eq!(removed.status, StatusCode::SEE_OTHER, "{}", removed.body);
    let g = c.ok("GET", "/api/v1/groups/rack1", None).await;
    let ids = g["systems"].as_array().expect("systems");
    assert_eq!(ids.len(), 400);
    assert!(
        ids.iter()
            .any(|i| i.as_i64().map(|v| v.to_string()).as_deref() == Some(n3.as_str()))
    );
    let list = get(&c, "/admin/groups/", ck).await;
    assert!(
        list.body.contains(">400<"),
        "the member count: {}",
        list.body
    );
    let bad = post(
        &c,
        &mpath,
        ck,
        &[],
        &[("csrf", &csrf), ("_op", "add"), ("target", "nobody")],
    )
    .await;
    assert_eq!(bad.status, StatusCode::NOT_FOUND);
    c.cleanup().await;
}

crate::engine_tests!(pages_inventory_forms, pages_inventory_lists);
