//! The layering check on small fixture trees, and on control's and the
//! agent's real trees.

use super::*;

/// A source tree in a temporary folder: `(path under src/, contents)`.
fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let file = dir.path().join("src").join(path);
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(file, text).unwrap();
    }
    dir
}

/// Two layers: `low` (no HTTP) under `web` (HTTP); `web`'s children are
/// handlers but for `error` and `auth`, and `rules` may hold no path.
const SPEC: Spec = Spec {
    layers: &[
        Layer {
            name: "low",
            modules: &["a", "b", "low", "rules", "store"],
            http: false,
        },
        Layer {
            name: "web",
            modules: &["web"],
            http: true,
        },
    ],
    http_crates: HTTP_CRATES,
    handler_folders: &[HandlerFolder {
        folder: &["web"],
        shared: &["auth", "error"],
    }],
    pathless: &["rules"],
};

fn violations(files: &[(&str, &str)]) -> Vec<Violation> {
    let dir = tree(files);
    check(&dir.path().join("src"), &SPEC).unwrap()
}

#[test]
fn a_cycle_is_found_with_where_it_closes() {
    let found = violations(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::b::Thing;\npub fn g() {}\n"),
        (
            "b.rs",
            "pub struct Thing;\n\npub fn f() {\n    crate::a::g();\n}\n",
        ),
    ]);
    assert_eq!(found.len(), 1, "{found:#?}");
    let Violation::Cycle { modules, edges } = &found[0] else {
        panic!("{found:#?}");
    };
    assert_eq!(modules, &["crate::a", "crate::b"]);
    let edge = |from: &str, to: &str| {
        edges
            .iter()
            .find(|e| e.from == from && e.to == to)
            .unwrap_or_else(|| panic!("no edge {from} -> {to}: {edges:#?}"))
    };
    let ab = edge("crate::a", "crate::b");
    assert!(ab.site.file.ends_with("src/a.rs"), "{ab:?}");
    assert_eq!(
        (ab.site.line, ab.site.path.as_str()),
        (1, "crate::b::Thing")
    );
    let ba = edge("crate::b", "crate::a");
    assert!(ba.site.file.ends_with("src/b.rs"), "{ba:?}");
    assert_eq!((ba.site.line, ba.site.path.as_str()), (4, "crate::a::g"));
    assert_eq!(edges.len(), 2);
}

#[test]
fn a_cycle_through_nested_modules_and_super_is_found() {
    // a::inner names b through `super::super`, b names a::inner: the loop
    // is between the siblings a and b.
    let found = violations(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a/mod.rs", "mod inner;\n"),
        ("a/inner.rs", "fn f() { super::super::b::h() }\n"),
        ("b.rs", "use crate::a;\npub fn h() { a::inner_fn() }\n"),
    ]);
    let cycles: Vec<&Violation> = found
        .iter()
        .filter(|v| matches!(v, Violation::Cycle { .. }))
        .collect();
    assert_eq!(cycles.len(), 1, "{found:#?}");
    let Violation::Cycle { modules, .. } = cycles[0] else {
        unreachable!()
    };
    assert_eq!(modules, &["crate::a", "crate::b"]);
}

#[test]
fn an_http_import_in_a_lower_layer_is_found() {
    let found = violations(&[
        ("lib.rs", "mod low;\nmod web;\n"),
        (
            "low.rs",
            "//! A lower layer.\n\npub fn status() -> u16 {\n    http::StatusCode::OK.as_u16()\n}\n",
        ),
        (
            "web.rs",
            "use axum::Json;\nuse crate::low;\n\npub fn f() -> Json<u16> { Json(low::status()) }\n",
        ),
    ]);
    assert_eq!(found.len(), 1, "{found:#?}");
    let Violation::HttpInLowerLayer {
        module,
        layer,
        krate,
        site,
    } = &found[0]
    else {
        panic!("{found:#?}");
    };
    assert_eq!(
        (module.as_str(), *layer, krate.as_str()),
        ("crate::low", "low", "http")
    );
    assert_eq!((site.line, site.path.as_str()), (4, "http::StatusCode::OK"));
}

#[test]
fn an_upward_reference_and_an_unlayered_module_are_found() {
    let found = violations(&[
        ("lib.rs", "mod low;\nmod web;\nmod extra;\n"),
        ("low.rs", "use crate::web::Page;\n"),
        ("web.rs", "pub struct Page;\n"),
        ("extra.rs", ""),
    ]);
    assert!(
        found.contains(&Violation::Unlayered {
            module: "extra".into()
        }),
        "{found:#?}"
    );
    assert!(
        found.iter().any(|v| matches!(v,
            Violation::Upward { from, to, from_layer: "low", to_layer: "web", .. }
                if from == "crate::low" && to == "crate::web")),
        "{found:#?}"
    );
    assert_eq!(found.len(), 2, "{found:#?}");
}

#[test]
fn a_clean_tree_passes() {
    // Nested modules naming their parent (containment, not a cycle), an
    // inline module, a `#[path]` module, a local module named `http` (not
    // the crate), an alias, and test code that reaches up, which is left
    // out.
    let found = violations(&[
        (
            "lib.rs",
            "pub mod a;\npub mod b;\nmod web;\n#[path = \"store_impl.rs\"]\nmod store;\n",
        ),
        (
            "a/mod.rs",
            "mod inner;\npub mod http;\npub struct Shared;\n\
             pub fn f() -> u8 { http::code() }\n\
             #[cfg(test)]\nmod tests {\n    use crate::web::Page;\n}\n",
        ),
        (
            "a/inner.rs",
            "use super::Shared;\nuse crate::b::Value as V;\n",
        ),
        ("a/http.rs", "pub fn code() -> u8 { 0 }\n"),
        (
            "b.rs",
            "pub struct Value;\nmod nested {\n    use super::Value;\n}\n\
             #[cfg(test)]\nfn helper() { crate::web::serve(); }\n",
        ),
        (
            "store_impl.rs",
            "use crate::b;\npub fn get() -> b::Value { b::Value }\n",
        ),
        (
            "web.rs",
            "use axum::Router;\nuse crate::{a, b, store};\npub struct Page;\n\
             pub fn serve() { let _ = (a::f(), store::get()); }\n",
        ),
    ]);
    assert_eq!(found, [], "{found:#?}");
}

#[test]
fn a_missing_module_file_is_an_error() {
    let dir = tree(&[("lib.rs", "mod gone;\n")]);
    let err = check(&dir.path().join("src"), &SPEC).unwrap_err();
    assert!(format!("{err:#}").contains("crate::gone"), "{err:#}");
}

#[test]
fn reads_the_whole_control_tree() {
    let src = workspace_root().join("control").join("src");
    let tree = ModuleTree::read(&src).unwrap();
    let names = tree.module_names();
    for expected in [
        "crate",
        "crate::db::crud",
        "crate::http::auth",
        "crate::pki::helper",
        "crate::enrollment",
        "crate::identity",
        "crate::access",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
    }
    // Control is layered: no cycle, no HTTP below `http`, nothing upward.
    let found = check(&src, &CONTROL).unwrap();
    let shown: Vec<String> = found
        .iter()
        .map(|v| v.display_relative(&workspace_root()))
        .collect();
    assert!(found.is_empty(), "{}", shown.join("\n"));
}

#[test]
fn an_axum_import_in_a_lower_layer_is_found() {
    // A domain module that answers with an axum type: found at the `use`,
    // once per crate, while the HTTP layer above may name axum freely.
    let found = violations(&[
        (
            "lib.rs",
            "mod store;
mod web;
",
        ),
        (
            "store.rs",
            "use axum::response::IntoResponse;

pub fn get() -> impl IntoResponse {
    axum::Json(1u8)
}
",
        ),
        (
            "web.rs",
            "use axum::Router;

pub fn app() -> Router { let _ = crate::store::get(); Router::new() }
",
        ),
    ]);
    assert_eq!(found.len(), 1, "{found:#?}");
    let Violation::HttpInLowerLayer {
        module,
        krate,
        site,
        ..
    } = &found[0]
    else {
        panic!("{found:#?}");
    };
    assert_eq!((module.as_str(), krate.as_str()), ("crate::store", "axum"));
    assert_eq!(
        (site.line, site.path.as_str()),
        (1, "axum::response::IntoResponse")
    );
}

#[test]
fn a_handler_naming_another_handler_is_found() {
    // `boot` names `nodes` twice (once reported, at the first site); naming
    // the folder's root, its shared modules and its own submodule is fine,
    // and so is the root naming every handler (the router).
    let found = violations(&[
        ("lib.rs", "mod web;\n"),
        (
            "web/mod.rs",
            "mod auth;\nmod boot;\nmod error;\nmod nodes;\npub struct State;\n\
             pub fn router() { let _ = (boot::get, nodes::load); }\n",
        ),
        ("web/auth.rs", "pub fn check() {}\n"),
        ("web/error.rs", "pub struct ApiError;\n"),
        (
            "web/boot.rs",
            "mod parse;\nuse super::State;\nuse super::error::ApiError;\n\
             use super::nodes::load;\n\
             pub fn get() { super::auth::check(); parse::f(); crate::web::nodes::load(); }\n",
        ),
        ("web/boot/parse.rs", "pub fn f() { let _ = super::get; }\n"),
        (
            "web/nodes.rs",
            "use super::error::ApiError;\npub fn load() {}\n",
        ),
    ]);
    assert_eq!(found.len(), 1, "{found:#?}");
    let Violation::HandlerNamesHandler { from, to, site } = &found[0] else {
        panic!("{found:#?}");
    };
    assert_eq!(
        (from.as_str(), to.as_str()),
        ("crate::web::boot", "crate::web::nodes")
    );
    assert!(site.file.ends_with("src/web/boot.rs"), "{site:?}");
    assert_eq!((site.line, site.path.as_str()), (4, "super::nodes::load"));
    assert!(found[0].to_string().starts_with("handler names a handler"));
}

#[test]
fn a_handler_submodule_naming_another_handler_is_found() {
    // The rule holds for a handler's own submodules too.
    let found = violations(&[
        ("lib.rs", "mod web;\n"),
        ("web/mod.rs", "mod boot;\nmod nodes;\n"),
        ("web/boot/mod.rs", "mod parse;\n"),
        (
            "web/boot/parse.rs",
            "pub fn f() { crate::web::nodes::load() }\n",
        ),
        ("web/nodes.rs", "pub fn load() {}\n"),
    ]);
    assert!(
        matches!(found.as_slice(), [Violation::HandlerNamesHandler { from, to, .. }]
            if from == "crate::web::boot::parse" && to == "crate::web::nodes"),
        "{found:#?}"
    );
}

#[test]
fn a_spec_without_layers_checks_cycles_only() {
    let dir = tree(&[
        ("lib.rs", "mod a;\nmod b;\nmod web;\n"),
        ("a.rs", "pub fn f() { crate::b::g() }\n"),
        ("b.rs", "pub fn g() { crate::a::f() }\n"),
        ("web.rs", "use axum::Json;\npub fn h() { crate::a::f() }\n"),
    ]);
    let found = check(&dir.path().join("src"), &AGENT).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        matches!(&found[0], Violation::Cycle { modules, .. } if modules == &["crate::a", "crate::b"]),
        "{found:?}"
    );
}

#[test]
fn a_path_in_the_access_rules_is_found() {
    // An exemption list (inside a macro call too), a path literal in code,
    // and a path constant; doc comments, relative strings and test code are
    // not read.
    let found = violations(&[
        ("lib.rs", "mod rules;\n"),
        (
            "rules.rs",
            "//! Rules; `/api/v1/` in a doc comment is no code.\n\
             use mprov_api::boot::EVENTS_PATH;\n\
             /// /ca.crt is public.\n\
             pub fn is_public(path: &str) -> bool {\n\
             \x20   matches!(path, \"/ca.crt\" | \"/ipxe/\")\n\
             }\n\
             pub fn renew(path: &str) -> bool { path == \"/enroll/renew/\" || path == EVENTS_PATH }\n\
             pub fn kind(k: &str) -> bool { k == \"systems\" || k.contains('/') }\n\
             #[cfg(test)]\nfn t() -> &'static str { \"/test\" }\n",
        ),
    ]);
    let paths: Vec<(usize, &str)> = found
        .iter()
        .map(|v| match v {
            Violation::PathInPathless { module, path, site } => {
                assert_eq!(module, "crate::rules");
                assert!(site.file.ends_with("src/rules.rs"), "{site:?}");
                (site.line, path.as_str())
            }
            other => panic!("{other:#?}"),
        })
        .collect();
    assert_eq!(
        paths,
        [
            (2, "mprov_api::boot::EVENTS_PATH"),
            (5, "\"/ca.crt\""),
            (5, "\"/ipxe/\""),
            (7, "\"/enroll/renew/\""),
            (7, "EVENTS_PATH"),
        ],
        "{found:#?}"
    );
    assert!(found[0].to_string().starts_with("path in the access rules"));
}

#[test]
fn the_agent_tree_has_no_cycle() {
    let src = workspace_root().join("agent").join("src");
    let names = ModuleTree::read(&src).unwrap().module_names();
    for expected in ["crate::enroll", "crate::image::plan", "crate::init::boot"] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
    }
    let found = check(&src, &AGENT).unwrap();
    let shown: Vec<String> = found
        .iter()
        .map(|v| v.display_relative(&workspace_root()))
        .collect();
    assert!(found.is_empty(), "{}", shown.join("\n"));
}
