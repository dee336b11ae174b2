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

/// Two layers: `low` (no HTTP) under `web` (HTTP).
const SPEC: Spec = Spec {
    layers: &[
        Layer {
            name: "low",
            modules: &["a", "b", "low", "store"],
            http: false,
        },
        Layer {
            name: "web",
            modules: &["web"],
            http: true,
        },
    ],
    http_crates: HTTP_CRATES,
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
