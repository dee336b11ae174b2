//! The layering check (`cargo xtask layering`): reads a crate's module tree
//! from its sources and reports what breaks the declared layers.
//!
//! The tree is found the way rustc finds it: from `src/lib.rs` (or
//! `src/main.rs`), every `mod name;` item to `name.rs` or `name/mod.rs`
//! beside its parent (`#[path]` honoured), inline `mod name { ... }` blocks
//! included. Items under `#[cfg(test)]` are left out: tests may reach across
//! layers. Every path a module names is resolved to a module of the tree
//! (`crate::`, `self::`, `super::`, a child module, or a name a `use` brought
//! in) or to an external crate (anything else with two segments or more).
//!
//! Three kinds of violation, given the [`Spec`]:
//!
//! * **cycle**: modules with the same parent that name each other, directly
//!   or around a loop (a child naming its parent or the reverse is not an
//!   edge: that is containment). Reported as the set of modules in each
//!   strongly connected component, with the edges that close it and where
//!   each is first named.
//! * **HTTP in a lower layer**: a module of a layer that may not speak HTTP
//!   names one of [`Spec::http_crates`] (`axum`, `http`, ...).
//! * **upward**: a module names a top-level module of a higher layer; and
//!   **unlayered**: a top-level module that no layer lists, so a new module
//!   has to be placed before it passes.
//! * **handler names a handler**: in a folder of handlers
//!   ([`Spec::handler_folders`], control's `http/`), every child module is a
//!   handler module except the folder's shared plumbing (its error type and
//!   middleware); a handler module may name the folder's own module (the
//!   router and the shared state, `http/mod.rs`) and the plumbing, never
//!   another handler module. What two handlers share belongs in the domain
//!   below them.
//! * **path in the access rules**: a module of [`Spec::pathless`]
//!   (control's `access`) holds no path: no string literal starting with
//!   `/` (in code or inside a macro call) and no constant named `*_PATH` or
//!   `*_PREFIX`. Which paths are public, or which a handler decides itself,
//!   is said by the router's structure, not by a list of exempt paths.
//!
//! The check is a plain function over a folder, unit-tested on fixture trees;
//! `cargo xtask layering` prints what it finds in each crate of [`CHECKED`]
//! (`control/src` against [`CONTROL`], the layers of the control service;
//! `agent/src` against [`AGENT`], cycles only), and `cargo xtask test` runs
//! it with `--deny` as one of its steps, so a violation fails the build.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use syn::visit::Visit;

use super::{step, workspace_root};

/// One layer: its name and its top-level modules.
#[derive(Debug, Clone, Copy)]
pub struct Layer {
    /// What the layer is, for messages.
    pub name: &'static str,
    /// Its top-level modules (`config`, `db`, ...).
    pub modules: &'static [&'static str],
    /// Whether its modules may name the HTTP crates.
    pub http: bool,
}

/// The layers of a crate, bottom-up, and what counts as HTTP.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Bottom first: a module may name modules of its own layer and lower.
    /// None: the crate is checked for cycles only.
    pub layers: &'static [Layer],
    /// The external crates only an HTTP layer may name.
    pub http_crates: &'static [&'static str],
    /// Folders whose child modules are handlers that may not name each
    /// other.
    pub handler_folders: &'static [HandlerFolder],
    /// Top-level modules that may hold no path (string literal starting with
    /// `/`, constant named `*_PATH` or `*_PREFIX`).
    pub pathless: &'static [&'static str],
}

/// A folder of handler modules.
#[derive(Debug, Clone, Copy)]
pub struct HandlerFolder {
    /// The folder's module, from the crate root (`["http"]`).
    pub folder: &'static [&'static str],
    /// Its child modules that are shared plumbing, not handlers: any child
    /// may name them.
    pub shared: &'static [&'static str],
}

/// The crates that carry HTTP types.
pub const HTTP_CRATES: &[&str] = &[
    "axum",
    "axum_server",
    "http",
    "http_body_util",
    "hyper",
    "tower_http",
];

/// The layers of the control service (issue 10), bottom-up. A module may
/// name its own layer and those below; only `http` and `cli` may name the
/// HTTP crates.
pub const CONTROL: Spec = Spec {
    layers: &[
        Layer {
            name: "1 config, secrets, time helpers",
            modules: &[
                "config",
                "effective",
                "privileges",
                "ratelimit",
                "secrets",
                "time",
            ],
            http: false,
        },
        Layer {
            name: "2 db and pki",
            modules: &["bootconfig", "db", "pki"],
            http: false,
        },
        Layer {
            name: "3 identity, enrollment, boot domain",
            modules: &[
                "backup",
                "board",
                "boot",
                "bulk",
                "discovery",
                "enrollment",
                "first_start",
                "identity",
                "jobs",
                "jobservers",
                "ldap",
                "netboot",
                "passkeys",
                "scripts",
                "sessions",
            ],
            http: false,
        },
        Layer {
            name: "4 access rules",
            modules: &["access"],
            http: false,
        },
        Layer {
            name: "5 http",
            modules: &["fuzz", "http"],
            http: true,
        },
        Layer {
            name: "6 cli",
            modules: &["cli"],
            http: true,
        },
    ],
    http_crates: HTTP_CRATES,
    // `error` is the one error type, `body` the JSON body extractor, `auth`
    // and `outage` the middleware; the router and `AppState` are `http`
    // itself. In `http/admin/`, `page` is the pages' shared plumbing (the
    // session layer, the chrome, forms, the error page) and `sections` the
    // read-only parts a kind's page shows beneath its form.
    handler_folders: &[
        HandlerFolder {
            folder: &["http"],
            shared: &["auth", "body", "error", "outage"],
        },
        HandlerFolder {
            folder: &["http", "admin"],
            shared: &["page", "sections"],
        },
    ],
    pathless: &["access"],
};

/// The node agent (issue 20): its modules form a DAG, with no layers
/// declared (the order is in `agent/src/lib.rs`'s docs).
pub const AGENT: Spec = Spec {
    layers: &[],
    http_crates: &[],
    handler_folders: &[],
    pathless: &[],
};

/// What `cargo xtask layering` checks: each crate's sources, from the
/// workspace root, and its spec.
pub const CHECKED: &[(&str, &Spec)] = &[("control/src", &CONTROL), ("agent/src", &AGENT)];

/// Options of `cargo xtask layering`.
#[derive(Debug, Clone, Default)]
pub struct LayeringOptions {
    /// Fail (exit non-zero) when there is any violation.
    pub deny: bool,
}

/// `cargo xtask layering`: prints the violations of each crate of
/// [`CHECKED`] against its spec; with `deny`, fails if there are any.
pub fn layering(options: &LayeringOptions) -> Result<()> {
    let root = workspace_root();
    let mut total = 0;
    for (dir, spec) in CHECKED {
        let src = root.join(dir);
        let what = if spec.layers.is_empty() {
            "cycles only"
        } else {
            "its layers"
        };
        step(&format!("layering: {} against {what}", src.display()));
        let violations = check(&src, spec)?;
        for violation in &violations {
            println!("{}", violation.display_relative(&root));
        }
        eprintln!("{} violation(s)", violations.len());
        total += violations.len();
    }
    if options.deny && total > 0 {
        bail!("{total} layering violation(s)");
    }
    Ok(())
}

/// Where a module names another module or a crate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Site {
    /// The source file.
    pub file: PathBuf,
    /// The line (1-based).
    pub line: usize,
    /// The path as written, `::`-joined.
    pub path: String,
}

impl Site {
    fn relative(&self, root: &Path) -> String {
        let file = self.file.strip_prefix(root).unwrap_or(&self.file);
        format!("{}:{} `{}`", file.display(), self.line, self.path)
    }
}

/// An edge of a cycle: `from` names `to` at `site` (and maybe elsewhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    /// The naming module, `::`-joined from the crate root.
    pub from: String,
    /// The module named.
    pub to: String,
    /// The first place it is named.
    pub site: Site,
    /// How many places name it in all.
    pub count: usize,
}

/// What breaks the layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Sibling modules that name each other around a loop.
    Cycle {
        /// The modules of the loop, sorted.
        modules: Vec<String>,
        /// The edges among them.
        edges: Vec<Edge>,
    },
    /// A module of a layer without HTTP names an HTTP crate.
    HttpInLowerLayer {
        /// The module.
        module: String,
        /// Its layer.
        layer: &'static str,
        /// The crate it names.
        krate: String,
        /// Where.
        site: Site,
    },
    /// A handler module names another handler module of its folder.
    HandlerNamesHandler {
        /// The naming handler module.
        from: String,
        /// The handler module named.
        to: String,
        /// Where.
        site: Site,
    },
    /// A module that may hold no path holds one.
    PathInPathless {
        /// The module.
        module: String,
        /// The literal or the constant's path, as written.
        path: String,
        /// Where.
        site: Site,
    },
    /// A top-level module no layer lists.
    Unlayered {
        /// The module.
        module: String,
    },
    /// A module names a module of a higher layer.
    Upward {
        /// The naming module.
        from: String,
        /// Its layer.
        from_layer: &'static str,
        /// The module named.
        to: String,
        /// Its layer.
        to_layer: &'static str,
        /// Where.
        site: Site,
    },
}

impl Violation {
    /// The violation as one or more lines, with file names relative to
    /// `root`.
    pub fn display_relative(&self, root: &Path) -> String {
        match self {
            Violation::Cycle { modules, edges } => {
                let mut out = format!("cycle: {}", modules.join(" <-> "));
                for edge in edges {
                    let more = match edge.count {
                        1 => String::new(),
                        n => format!(" (and {} more)", n - 1),
                    };
                    out.push_str(&format!(
                        "\n    {} -> {}: {}{more}",
                        edge.from,
                        edge.to,
                        edge.site.relative(root)
                    ));
                }
                out
            }
            Violation::HttpInLowerLayer {
                module,
                layer,
                krate,
                site,
            } => format!(
                "http in a lower layer: {module} (layer {layer}) names {krate}: {}",
                site.relative(root)
            ),
            Violation::HandlerNamesHandler { from, to, site } => format!(
                "handler names a handler: {from} names {to}: {}; move what they share into the domain, or into the folder's shared modules",
                site.relative(root)
            ),
            Violation::PathInPathless { module, path, site } => format!(
                "path in the access rules: {module} holds the path {path}: {}; say which paths are public (or decided by their handler) with the router's structure",
                site.relative(root)
            ),
            Violation::Unlayered { module } => {
                format!("unlayered: top-level module {module} is in no layer; add it to one")
            }
            Violation::Upward {
                from,
                from_layer,
                to,
                to_layer,
                site,
            } => format!(
                "upward: {from} (layer {from_layer}) names {to} (layer {to_layer}): {}",
                site.relative(root)
            ),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display_relative(Path::new("")))
    }
}

/// Reads the crate whose sources are in `src` and returns every violation
/// of `spec`: cycles first, then by module.
pub fn check(src: &Path, spec: &Spec) -> Result<Vec<Violation>> {
    let tree = ModuleTree::read(src)?;
    let mut violations = tree.cycles();
    violations.extend(tree.layer_violations(spec));
    violations.extend(tree.handler_violations(spec));
    violations.extend(tree.path_violations(spec));
    Ok(violations)
}

/// What one module names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A path inside the crate, from its root.
    Crate(Vec<String>),
    /// An external crate.
    External(String),
}

/// One module of the tree.
#[derive(Debug, Default)]
struct Module {
    /// Its child modules (not under `#[cfg(test)]`).
    children: BTreeSet<String>,
    /// Everything it names, with where.
    refs: Vec<(Target, Site)>,
    /// Its string literals that start with `/`, with where.
    slash_literals: Vec<Site>,
}

/// A crate's modules, keyed by their path from the root (empty: the root).
#[derive(Debug, Default)]
pub struct ModuleTree {
    modules: BTreeMap<Vec<String>, Module>,
}

impl ModuleTree {
    /// Reads the tree from `src/lib.rs`, else `src/main.rs`.
    pub fn read(src: &Path) -> Result<Self> {
        let root = ["lib.rs", "main.rs"]
            .iter()
            .map(|f| src.join(f))
            .find(|p| p.is_file())
            .with_context(|| format!("{} has neither lib.rs nor main.rs", src.display()))?;
        let mut tree = ModuleTree::default();
        tree.read_file(&root, src, Vec::new())?;
        Ok(tree)
    }

    /// The modules' paths, `::`-joined (`crate` for the root).
    pub fn module_names(&self) -> Vec<String> {
        self.modules.keys().map(|p| name(p)).collect()
    }

    /// Parses `file`, the module `path`, whose child modules live in `dir`.
    fn read_file(&mut self, file: &Path, dir: &Path, path: Vec<String>) -> Result<()> {
        let text =
            fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let parsed =
            syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
        self.read_items(&parsed.items, file, dir, path)
    }

    /// Records the module `path` made of `items` (from `file`), then its
    /// children.
    fn read_items(
        &mut self,
        items: &[syn::Item],
        file: &Path,
        dir: &Path,
        path: Vec<String>,
    ) -> Result<()> {
        let mut children = Vec::new();
        for item in items {
            if let syn::Item::Mod(m) = item
                && !is_cfg_test(&m.attrs)
            {
                children.push(m);
            }
        }
        let names: BTreeSet<String> = children.iter().map(|m| m.ident.to_string()).collect();
        let (refs, slash_literals) = collect_refs(items, file, &path, &names);
        self.modules.insert(
            path.clone(),
            Module {
                children: names,
                refs,
                slash_literals,
            },
        );
        for m in children {
            let mut child = path.clone();
            child.push(m.ident.to_string());
            let child_dir = dir.join(m.ident.to_string());
            if let Some((_, items)) = &m.content {
                self.read_items(items, file, &child_dir, child)?;
                continue;
            }
            let (child_file, grandchildren_dir) = match path_attr(&m.attrs) {
                Some(p) => {
                    let f = dir.join(p);
                    let d = f.with_extension("");
                    (f, d)
                }
                None => {
                    let flat = dir.join(format!("{}.rs", m.ident));
                    let nested = child_dir.join("mod.rs");
                    if flat.is_file() {
                        (flat, child_dir)
                    } else if nested.is_file() {
                        (nested, child_dir)
                    } else {
                        bail!(
                            "module {} declared in {} has no file ({} or {})",
                            name(&child),
                            file.display(),
                            flat.display(),
                            nested.display()
                        );
                    }
                }
            };
            self.read_file(&child_file, &grandchildren_dir, child)?;
        }
        Ok(())
    }

    /// The longest prefix of `path` that is a module of the tree.
    fn module_of<'a>(&self, path: &'a [String]) -> &'a [String] {
        (0..=path.len())
            .rev()
            .map(|n| &path[..n])
            .find(|p| self.modules.contains_key(*p))
            .unwrap_or(&[])
    }

    /// Sibling edges: for `from` naming module `to`, the children of their
    /// deepest common ancestor on the way to each; `None` when one contains
    /// the other.
    fn sibling_edge(from: &[String], to: &[String]) -> Option<(Vec<String>, Vec<String>)> {
        let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
        if common == from.len() || common == to.len() {
            return None;
        }
        Some((from[..=common].to_vec(), to[..=common].to_vec()))
    }

    /// Every strongly connected component of two or more siblings.
    fn cycles(&self) -> Vec<Violation> {
        // (from, to) → sites, for sibling pairs.
        let mut edges: BTreeMap<(Vec<String>, Vec<String>), Vec<Site>> = BTreeMap::new();
        for (path, module) in &self.modules {
            for (target, site) in &module.refs {
                let Target::Crate(abs) = target else { continue };
                let to = self.module_of(abs);
                if let Some(edge) = Self::sibling_edge(path, to) {
                    edges.entry(edge).or_default().push(site.clone());
                }
            }
        }
        let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        for (from, to) in edges.keys() {
            graph.entry(from.clone()).or_default().insert(to.clone());
            graph.entry(to.clone()).or_default();
        }
        let mut out = Vec::new();
        for component in strongly_connected(&graph) {
            if component.len() < 2 {
                continue;
            }
            let members: BTreeSet<&Vec<String>> = component.iter().collect();
            let mut cycle_edges = Vec::new();
            for ((from, to), sites) in &edges {
                if members.contains(from) && members.contains(to) {
                    let mut sites = sites.clone();
                    sites.sort();
                    cycle_edges.push(Edge {
                        from: name(from),
                        to: name(to),
                        site: sites[0].clone(),
                        count: sites.len(),
                    });
                }
            }
            let mut modules: Vec<String> = component.iter().map(|p| name(p)).collect();
            modules.sort();
            out.push(Violation::Cycle {
                modules,
                edges: cycle_edges,
            });
        }
        out
    }

    /// HTTP crates in lower layers, upward references and unlayered modules;
    /// none for a spec without layers.
    fn layer_violations(&self, spec: &Spec) -> Vec<Violation> {
        if spec.layers.is_empty() {
            return Vec::new();
        }
        let layer_of = |top: &str| spec.layers.iter().position(|l| l.modules.contains(&top));
        let mut out = Vec::new();
        let root = self.modules.get(&Vec::new());
        for top in root.into_iter().flat_map(|m| &m.children) {
            if layer_of(top).is_none() {
                out.push(Violation::Unlayered {
                    module: top.clone(),
                });
            }
        }
        for (path, module) in &self.modules {
            let Some(top) = path.first() else { continue };
            let Some(from_layer) = layer_of(top) else {
                continue;
            };
            let layer = &spec.layers[from_layer];
            // One report per module and crate, or module and target: the
            // first site, in source order.
            let mut crates_seen = BTreeSet::new();
            let mut modules_seen = BTreeSet::new();
            for (target, site) in &module.refs {
                match target {
                    Target::External(krate) => {
                        if !layer.http
                            && spec.http_crates.contains(&krate.as_str())
                            && crates_seen.insert(krate.clone())
                        {
                            out.push(Violation::HttpInLowerLayer {
                                module: name(path),
                                layer: layer.name,
                                krate: krate.clone(),
                                site: site.clone(),
                            });
                        }
                    }
                    Target::Crate(abs) => {
                        let Some(to_top) = abs.first() else { continue };
                        let Some(to_layer) = layer_of(to_top) else {
                            continue;
                        };
                        if to_layer > from_layer && modules_seen.insert(to_top.clone()) {
                            out.push(Violation::Upward {
                                from: name(path),
                                from_layer: layer.name,
                                to: name(self.module_of(abs)),
                                to_layer: spec.layers[to_layer].name,
                                site: site.clone(),
                            });
                        }
                    }
                }
            }
        }
        out
    }
}

impl ModuleTree {
    /// Handler modules naming other handler modules of their folder: one
    /// report per pair, at the first site.
    fn handler_violations(&self, spec: &Spec) -> Vec<Violation> {
        let mut out = Vec::new();
        for folder in spec.handler_folders {
            let depth = folder.folder.len();
            // The handler a module belongs to: the folder's child on its path.
            let handler = |path: &[String]| -> Option<String> {
                let child = path.get(depth)?;
                let inside = path[..depth].iter().zip(folder.folder).all(|(a, b)| a == b);
                (inside && !folder.shared.contains(&child.as_str())).then(|| child.clone())
            };
            for (path, module) in &self.modules {
                let Some(from) = handler(path) else { continue };
                let mut seen = BTreeSet::new();
                for (target, site) in &module.refs {
                    let Target::Crate(abs) = target else { continue };
                    let Some(to) = handler(self.module_of(abs)) else {
                        continue;
                    };
                    if to != from && seen.insert(to.clone()) {
                        let mut to_path: Vec<String> =
                            folder.folder.iter().map(|s| (*s).to_owned()).collect();
                        to_path.push(to);
                        out.push(Violation::HandlerNamesHandler {
                            from: name(path),
                            to: name(&to_path),
                            site: site.clone(),
                        });
                    }
                }
            }
        }
        out
    }

    /// Paths held by modules that may hold none.
    fn path_violations(&self, spec: &Spec) -> Vec<Violation> {
        let mut out = Vec::new();
        for (path, module) in &self.modules {
            let Some(top) = path.first() else { continue };
            if !spec.pathless.contains(&top.as_str()) {
                continue;
            }
            let constants = module.refs.iter().filter_map(|(_, site)| {
                let last = site.path.rsplit("::").next()?;
                (last.ends_with("_PATH") || last.ends_with("_PREFIX")).then_some(site)
            });
            let mut sites: Vec<&Site> = module.slash_literals.iter().chain(constants).collect();
            sites.sort();
            sites.dedup();
            for site in sites {
                out.push(Violation::PathInPathless {
                    module: name(path),
                    path: site.path.clone(),
                    site: site.clone(),
                });
            }
        }
        out
    }
}

/// `crate::a::b` for `[a, b]`, `crate` for the root.
fn name(path: &[String]) -> String {
    std::iter::once("crate")
        .chain(path.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("::")
}

/// Whether the attributes hold `#[cfg(test)]`.
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Ident>()
                .is_ok_and(|ident| ident == "test")
    })
}

/// The value of a `#[path = "..."]` attribute.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// Resolves the paths one module names.
struct Resolver<'a> {
    module: &'a [String],
    children: &'a BTreeSet<String>,
    /// Names a `use` brought in, and what they stand for.
    aliases: BTreeMap<String, Target>,
}

impl Resolver<'_> {
    /// What `segments` (as written in the module) stand for; `None` for a
    /// one-segment name that is not an alias (a local item or variable).
    fn resolve(&self, segments: &[String], in_use: bool) -> Option<Target> {
        let (first, rest) = segments.split_first()?;
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.module.to_vec(),
            "super" => {
                let mut base = self.module.to_vec();
                base.pop();
                let mut rest = rest;
                while let Some((s, r)) = rest.split_first()
                    && s == "super"
                {
                    base.pop();
                    rest = r;
                }
                base.extend(rest.iter().cloned());
                return Some(Target::Crate(base));
            }
            _ => {
                if let Some(target) = self.aliases.get(first) {
                    return Some(match target {
                        Target::Crate(path) => {
                            let mut path = path.clone();
                            path.extend(rest.iter().cloned());
                            Target::Crate(path)
                        }
                        Target::External(krate) => Target::External(krate.clone()),
                    });
                }
                if self.children.contains(first) {
                    let mut base = self.module.to_vec();
                    base.extend(segments.iter().cloned());
                    return Some(Target::Crate(base));
                }
                if rest.is_empty() && !in_use {
                    return None;
                }
                return Some(Target::External(first.clone()));
            }
        };
        base.extend(rest.iter().cloned());
        Some(Target::Crate(base))
    }
}

/// Everything the items of one module (its child modules excluded) name.
fn collect_refs(
    items: &[syn::Item],
    file: &Path,
    module: &[String],
    children: &BTreeSet<String>,
) -> (Vec<(Target, Site)>, Vec<Site>) {
    let mut resolver = Resolver {
        module,
        children,
        aliases: BTreeMap::new(),
    };
    let mut found = RefCollector::default();
    for item in items {
        found.visit_item(item);
    }
    // First the `use` items, which also bring names in; then every path.
    let mut refs = Vec::new();
    for (segments, binding, line) in &found.uses {
        if let Some(target) = resolver.resolve(segments, true) {
            if let Some(binding) = binding {
                resolver.aliases.insert(binding.clone(), target.clone());
            }
            refs.push((
                target,
                Site {
                    file: file.to_path_buf(),
                    line: *line,
                    path: segments.join("::"),
                },
            ));
        }
    }
    for (segments, line) in found.paths {
        if let Some(target) = resolver.resolve(&segments, false) {
            refs.push((
                target,
                Site {
                    file: file.to_path_buf(),
                    line,
                    path: segments.join("::"),
                },
            ));
        }
    }
    refs.sort_by_key(|(_, site)| site.line);
    let literals = found
        .slash_literals
        .into_iter()
        .map(|(text, line)| Site {
            file: file.to_path_buf(),
            line,
            path: format!("{text:?}"),
        })
        .collect();
    (refs, literals)
}

/// What the items of one module name, outside `#[cfg(test)]` functions and
/// impls (child modules are read on their own).
#[derive(Default)]
struct RefCollector {
    /// The leaves of `use` trees: full path, the name bound (none for globs
    /// and `_`), line.
    uses: Vec<(Vec<String>, Option<String>, usize)>,
    /// Every path outside `use` items (of one segment too: it may be an
    /// alias), with its line.
    paths: Vec<(Vec<String>, usize)>,
    /// String literals that start with `/`, in code and in macro calls,
    /// with their line.
    slash_literals: Vec<(String, usize)>,
}

impl RefCollector {
    fn tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let line = n.ident.span().start().line;
                if n.ident == "self" {
                    let bound = prefix.last().cloned();
                    self.uses.push((prefix.clone(), bound, line));
                } else {
                    let mut path = prefix.clone();
                    path.push(n.ident.to_string());
                    self.uses.push((path, Some(n.ident.to_string()), line));
                }
            }
            syn::UseTree::Rename(r) => {
                let line = r.ident.span().start().line;
                let mut path = prefix.clone();
                if r.ident != "self" {
                    path.push(r.ident.to_string());
                }
                let bound = (r.rename != "_").then(|| r.rename.to_string());
                self.uses.push((path, bound, line));
            }
            syn::UseTree::Glob(g) => {
                let line = g.star_token.spans[0].start().line;
                self.uses.push((prefix.clone(), None, line));
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.tree(prefix, tree);
                }
            }
        }
    }
}

impl RefCollector {
    /// The string literals among `tokens`, nested groups included.
    fn macro_tokens(&mut self, tokens: proc_macro2::TokenStream) {
        for token in tokens {
            match token {
                proc_macro2::TokenTree::Group(g) => self.macro_tokens(g.stream()),
                proc_macro2::TokenTree::Literal(l) => {
                    if let syn::Lit::Str(s) = syn::Lit::new(l) {
                        self.visit_lit_str(&s);
                    }
                }
                proc_macro2::TokenTree::Ident(_) | proc_macro2::TokenTree::Punct(_) => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for RefCollector {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if !is_cfg_test(&item.attrs) {
            self.tree(&mut Vec::new(), &item.tree);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if let Some(first) = path.segments.first() {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.paths.push((segments, first.ident.span().start().line));
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_lit_str(&mut self, lit: &'ast syn::LitStr) {
        let text = lit.value();
        if text.starts_with('/') {
            self.slash_literals.push((text, lit.span().start().line));
        }
    }

    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {
        // Doc comments and `#[path]` are no code: their text is not read.
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // A macro's arguments are tokens, not syntax: read its literals.
        self.macro_tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }

    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {
        // Child modules are read on their own.
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_cfg_test(&item.attrs) {
            syn::visit::visit_item_fn(self, item);
        }
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if !is_cfg_test(&item.attrs) {
            syn::visit::visit_item_impl(self, item);
        }
    }
}

/// Tarjan's strongly connected components, each sorted, in a stable order.
fn strongly_connected(
    graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
) -> Vec<Vec<Vec<String>>> {
    struct State<'g> {
        graph: &'g BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'g Vec<String>, usize>,
        low: BTreeMap<&'g Vec<String>, usize>,
        stack: Vec<&'g Vec<String>>,
        on_stack: BTreeSet<&'g Vec<String>>,
        next: usize,
        out: Vec<Vec<Vec<String>>>,
    }

    fn visit<'g>(s: &mut State<'g>, v: &'g Vec<String>) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in &s.graph[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }

    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v) {
            visit(&mut state, v);
        }
    }
    state.out.sort();
    state.out
}

#[cfg(test)]
mod tests;
