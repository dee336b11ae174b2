//! A system's effective configuration, computed from its layers.
//!
//! A system's boot settings are not stored in one place. Each of them can be
//! set on the OS distro of the system's image, on each group the system belongs
//! to, on the image and on the system itself. The effective value comes from
//! applying those layers in that order, with groups in ascending `priority`
//! and then by `slug`, so that ties still give the same order on every
//! database engine. The rules are the original mProv's, so that an inventory
//! moved over boots the same way:
//!
//! * Text fields drop lines whose first non-blank character is `#` and trim
//!   the rest. A value that is then empty inherits what the earlier layers
//!   set. This lets an administrator leave a commented-out value in place.
//! * `install_kernel_cmdline` appends, separated by a space, and
//!   `initial_mods` appends, separated by a comma, so a group can add
//!   `console=ttyS0` without repeating the distro's arguments. A value that
//!   starts with `=` replaces everything before it (the `=` is stripped):
//!   this is the escape hatch for a layer that must start over, and a bare
//!   `=` clears the field.
//! * `prov_interface` replaces when it is not empty, and `tmpfs_root_size`
//!   replaces when it is not zero.
//! * `config_params` is YAML text holding a mapping. Mappings merge deeply
//!   by key, and lists and scalars are replaced by the later layer. The
//!   exception is the top-level `disable_scripts` list: the lists of all
//!   layers are combined, so any layer can switch a script off and no later
//!   layer silently switches it back on. A single slug may be given as a
//!   string (`disable_scripts: postboot1`, as the original wrote it); it
//!   counts as a list of one. A slug that names no script is kept in the
//!   list and matches nothing: whoever runs the scripts warns about it.
//! * Scripts are the union of every layer's script ids in layer order, less
//!   those whose slug is in `disable_scripts`; each names the first layer
//!   that listed it (`distro`, `group:<slug>`, `image` or `system`). Ordering them by their
//!   dependencies is the caller's job: it needs the dependency graph, and this
//!   module only decides which scripts apply.
//!
//! The module is pure: no I/O, no database and no async. The caller loads the
//! layers as the JSON objects that the API returns and passes the scripts'
//! slugs by id. This keeps the rules testable on their own, and lets the API
//! show exactly what a node will get. Fields that are missing or `null`
//! inherit. A field of the wrong type is an error, not a silent default,
//! because it means that the caller and the schema disagree.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use serde_json::{Map, Value};

/// The top-level `config_params` key whose lists combine across layers.
const DISABLE_SCRIPTS: &str = "disable_scripts";

/// The layers of one system, as the JSON objects that the API returns.
#[derive(Debug, Clone)]
pub struct Layers<'a> {
    /// The OS distro of the system's image, if the system has an image and
    /// the image has a distro.
    pub distro: Option<&'a Map<String, Value>>,
    /// The system's groups, in any order: [`effective`] sorts them.
    pub groups: Vec<&'a Map<String, Value>>,
    /// The system's image, if any.
    pub image: Option<&'a Map<String, Value>>,
    /// The system itself.
    pub system: &'a Map<String, Value>,
}

/// A system's configuration after all of its layers have been applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EffectiveConfig {
    /// The kernel command line to install with, arguments separated by spaces.
    pub kernel_cmdline: String,
    /// The modules to load in the initramfs, without duplicates, in the order
    /// in which they were first named.
    pub initial_mods: Vec<String>,
    /// The size of the root tmpfs in GiB; 0 when no layer sets it.
    pub tmpfs_root_size: i64,
    /// The provisioning interface; empty when no layer sets it.
    pub prov_interface: String,
    /// The merged `config_params`: always a JSON object. When any layer has
    /// `disable_scripts`, its value here is the combined list.
    pub config_params: Value,
    /// The slugs of the scripts that are switched off, from all layers, in the
    /// order in which they were first named.
    pub disable_scripts: Vec<String>,
    /// The scripts that apply, in layer order, without the disabled ones.
    pub scripts: Vec<ScriptRef>,
    /// The layers that were applied, in order, e.g. `group gpu`.
    pub layers: Vec<String>,
}

/// A script of the effective configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScriptRef {
    /// The script's id.
    pub id: i64,
    /// The script's slug.
    pub slug: String,
    /// The first layer that listed it: `distro`, `group:<slug>`, `image` or
    /// `system`.
    pub layer: String,
}

/// Why the effective configuration could not be computed.
///
/// `layer` names the layer at fault as the kind followed by the quoted name,
/// e.g. `group "gpu"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EffectiveError {
    /// A layer's `config_params` is not valid YAML, or not a mapping.
    #[error("config_params of {layer} is invalid: {reason}")]
    ConfigParams {
        /// The layer at fault.
        layer: String,
        /// What is wrong, with the line and column when the parser gives them.
        reason: String,
    },
    /// A field of a layer has the wrong JSON type.
    #[error("{field} of {layer} must be {expected}")]
    Field {
        /// The layer at fault.
        layer: String,
        /// The field's JSON name.
        field: &'static str,
        /// What the field must hold, e.g. `a string`.
        expected: &'static str,
    },
    /// A layer lists a script id that is not among the known scripts.
    #[error("{layer} lists script {id}, which does not exist")]
    UnknownScript {
        /// The layer at fault.
        layer: String,
        /// The unknown id.
        id: i64,
    },
}

/// Computes the effective configuration of a system from its layers.
///
/// `scripts` maps every script id that the layers may list to its slug. An id
/// that is missing from it is an error rather than being skipped, so that a
/// caller that passes too few scripts finds out.
pub fn effective(
    layers: &Layers<'_>,
    scripts: &HashMap<i64, String>,
) -> Result<EffectiveConfig, EffectiveError> {
    let mut acc = Accumulator::default();
    for layer in ordered(layers)? {
        acc.apply(&layer, scripts)?;
    }
    Ok(acc.finish(scripts))
}

/// Checks `config_params` text before it is stored.
///
/// The text must be empty, hold only comments, or parse to a mapping. When it
/// has a top-level `disable_scripts`, that must be a slug or a list of slugs. The
/// error says what is wrong, with the line and column when the YAML parser
/// gives them.
pub fn validate_config_params(yaml: &str) -> Result<(), String> {
    parse_params(yaml).map(|_| ())
}

/// The most YAML nodes one `config_params` value may hold, aliases expanded.
pub const MAX_YAML_NODES: usize = 10_000;

/// Parses one YAML document into JSON.
///
/// An empty document, or one with only comments, gives `null`. The default
/// limits of the parser apply (nesting depth, alias expansion, size), with at
/// most [`MAX_YAML_NODES`] nodes, so
/// hostile input fails with an error instead of exhausting memory. Duplicate
/// keys and non-finite floats are errors, because JSON cannot hold the
/// latter and the meaning of the former is unclear.
pub fn yaml_to_json(yaml: &str) -> Result<Value, String> {
    // Without the snippet, the message is one line ending in "at line L,
    // column C", which suits an API error. The user formatter leaves out
    // hints meant for programmers, such as which parser option to change.
    // Config params are small documents written by people. A node budget far
    // below the parser's default (250,000) stops alias amplification early: a
    // 200-byte value must not expand to hundreds of kilobytes, as every member
    // system of a group re-reads its layers.
    let options = serde_saphyr::options! {
        with_snippet: false,
        budget: serde_saphyr::budget! { max_nodes: MAX_YAML_NODES },
    };
    serde_saphyr::from_str_with_options(yaml, options)
        .map_err(|err| err.render_with_formatter(&serde_saphyr::UserMessageFormatter))
}

/// One layer, named for messages.
struct Layer<'a> {
    /// `distro`, `group`, `image` or `system`.
    kind: &'static str,
    /// The slug (or the system's host name).
    name: String,
    fields: &'a Map<String, Value>,
}

impl<'a> Layer<'a> {
    /// Wraps `fields`, named by its `name_key` field, or by its id when that
    /// field is missing.
    fn new(kind: &'static str, fields: &'a Map<String, Value>, name_key: &str) -> Self {
        let name = match (fields.get(name_key), fields.get("id")) {
            (Some(Value::String(name)), _) if !name.is_empty() => name.clone(),
            (_, Some(Value::Number(id))) => format!("#{id}"),
            _ => "?".to_owned(),
        };
        Layer { kind, name, fields }
    }

    /// The name for error messages: `group "gpu"`.
    fn quoted(&self) -> String {
        format!("{} {:?}", self.kind, self.name)
    }

    /// The name a script's layer has in a plan: `group:gpu`, or the kind
    /// alone for the other layers (there is one of each).
    fn script_layer(&self) -> String {
        match self.kind {
            "group" => format!("group:{}", self.name),
            kind => kind.to_owned(),
        }
    }

    /// The name for [`EffectiveConfig::layers`]: `group gpu`.
    fn label(&self) -> String {
        format!("{} {}", self.kind, self.name)
    }

    fn wrong_type(&self, field: &'static str, expected: &'static str) -> EffectiveError {
        EffectiveError::Field {
            layer: self.quoted(),
            field,
            expected,
        }
    }

    /// A string field as it is; `None` when missing or null.
    fn raw_text(&self, field: &'static str) -> Result<Option<&'a str>, EffectiveError> {
        match self.fields.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(self.wrong_type(field, "a string")),
        }
    }

    /// A string field with comment lines dropped and the other lines trimmed
    /// and joined with `sep`; `None` when that leaves nothing.
    fn text(&self, field: &'static str, sep: &str) -> Result<Option<String>, EffectiveError> {
        Ok(self
            .raw_text(field)?
            .map(|text| clean(text, sep))
            .filter(|text| !text.is_empty()))
    }

    /// An integer field; `None` when missing or null.
    fn int(&self, field: &'static str) -> Result<Option<i64>, EffectiveError> {
        match self.fields.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.wrong_type(field, "an integer")),
        }
    }

    /// The `scripts` field: a list of ids, empty when missing or null.
    fn script_ids(&self) -> Result<Vec<i64>, EffectiveError> {
        const EXPECTED: &str = "a list of script ids";
        match self.fields.get("scripts") {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|id| {
                    id.as_i64()
                        .ok_or_else(|| self.wrong_type("scripts", EXPECTED))
                })
                .collect(),
            Some(_) => Err(self.wrong_type("scripts", EXPECTED)),
        }
    }
}

/// The layers in the order in which they apply.
fn ordered<'a>(layers: &Layers<'a>) -> Result<Vec<Layer<'a>>, EffectiveError> {
    let mut groups = layers
        .groups
        .iter()
        .map(|fields| {
            let layer = Layer::new("group", fields, "slug");
            Ok((layer.int("priority")?.unwrap_or(0), layer))
        })
        .collect::<Result<Vec<_>, EffectiveError>>()?;
    groups.sort_by(|(pa, a), (pb, b)| pa.cmp(pb).then_with(|| a.name.cmp(&b.name)));

    let mut out = Vec::with_capacity(groups.len() + 3);
    out.extend(
        layers
            .distro
            .map(|fields| Layer::new("distro", fields, "slug")),
    );
    out.extend(groups.into_iter().map(|(_, layer)| layer));
    out.extend(
        layers
            .image
            .map(|fields| Layer::new("image", fields, "slug")),
    );
    out.push(Layer::new("system", layers.system, "hostname"));
    Ok(out)
}

/// The configuration so far, as the layers are applied one by one.
#[derive(Default)]
struct Accumulator {
    kernel_cmdline: String,
    initial_mods: Vec<String>,
    tmpfs_root_size: i64,
    prov_interface: String,
    config_params: Map<String, Value>,
    /// `None` until a layer has `disable_scripts`, so that the key appears in
    /// `config_params` only when some layer used it.
    disable_scripts: Option<Vec<String>>,
    /// Script ids in layer order, each with the layer that first listed it.
    script_ids: Vec<(i64, String)>,
    layers: Vec<String>,
}

impl Accumulator {
    fn apply(
        &mut self,
        layer: &Layer<'_>,
        scripts: &HashMap<i64, String>,
    ) -> Result<(), EffectiveError> {
        if let Some(args) = layer.text("install_kernel_cmdline", " ")? {
            match args.strip_prefix('=') {
                Some(rest) => self.kernel_cmdline = rest.trim_start().to_owned(),
                None => {
                    if !self.kernel_cmdline.is_empty() {
                        self.kernel_cmdline.push(' ');
                    }
                    self.kernel_cmdline.push_str(&args);
                }
            }
        }

        if let Some(mods) = layer.text("initial_mods", ",")? {
            let mods = match mods.strip_prefix('=') {
                Some(rest) => {
                    self.initial_mods.clear();
                    rest
                }
                None => &mods,
            };
            for module in mods.split(',').map(str::trim).filter(|m| !m.is_empty()) {
                push_unique(&mut self.initial_mods, module);
            }
        }

        match layer.int("tmpfs_root_size")? {
            Some(size) if size < 0 => {
                return Err(layer.wrong_type("tmpfs_root_size", "a non-negative integer"));
            }
            Some(size) if size > 0 => self.tmpfs_root_size = size,
            _ => {}
        }

        if let Some(interface) = layer.text("prov_interface", " ")? {
            self.prov_interface = interface;
        }

        if let Some(yaml) = layer.raw_text("config_params")? {
            let LayerParams { params, disabled } =
                parse_params(yaml).map_err(|reason| EffectiveError::ConfigParams {
                    layer: layer.quoted(),
                    reason,
                })?;
            merge(&mut self.config_params, params);
            if let Some(disabled) = disabled {
                let combined = self.disable_scripts.get_or_insert_with(Vec::new);
                for slug in &disabled {
                    push_unique(combined, slug);
                }
            }
        }

        for id in layer.script_ids()? {
            if !scripts.contains_key(&id) {
                return Err(EffectiveError::UnknownScript {
                    layer: layer.quoted(),
                    id,
                });
            }
            if !self.script_ids.iter().any(|(have, _)| *have == id) {
                self.script_ids.push((id, layer.script_layer()));
            }
        }

        self.layers.push(layer.label());
        Ok(())
    }

    fn finish(mut self, scripts: &HashMap<i64, String>) -> EffectiveConfig {
        let disable_scripts = match self.disable_scripts {
            Some(disabled) => {
                // The merge left the last layer's list here; the combined one
                // replaces it (in place, so the key keeps its position).
                let list = disabled.iter().cloned().map(Value::String).collect();
                self.config_params
                    .insert(DISABLE_SCRIPTS.to_owned(), Value::Array(list));
                disabled
            }
            None => Vec::new(),
        };
        let disabled: HashSet<&str> = disable_scripts.iter().map(String::as_str).collect();
        let scripts = self
            .script_ids
            .into_iter()
            .filter_map(|(id, layer)| {
                // `apply` checked every id, so the lookup only fails if the
                // caller's map changed in between, which it cannot.
                let slug = scripts.get(&id)?;
                (!disabled.contains(slug.as_str())).then(|| ScriptRef {
                    id,
                    slug: slug.clone(),
                    layer,
                })
            })
            .collect();

        EffectiveConfig {
            kernel_cmdline: self.kernel_cmdline,
            initial_mods: self.initial_mods,
            tmpfs_root_size: self.tmpfs_root_size,
            prov_interface: self.prov_interface,
            config_params: Value::Object(self.config_params),
            disable_scripts,
            scripts,
            layers: self.layers,
        }
    }
}

/// Drops the lines that start with `#` (after leading blanks), trims the
/// others and joins the non-empty ones with `sep`.
fn clean(text: &str, sep: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect::<Vec<_>>()
        .join(sep)
}

fn push_unique(list: &mut Vec<String>, item: &str) {
    if !list.iter().any(|have| have == item) {
        list.push(item.to_owned());
    }
}

/// One layer's `config_params`, parsed.
struct LayerParams {
    /// The mapping, `disable_scripts` included.
    params: Map<String, Value>,
    /// The `disable_scripts` list, when the key is present (`null` counts as
    /// an empty list).
    disabled: Option<Vec<String>>,
}

/// Parses one layer's `config_params`, which must be a mapping (or empty).
fn parse_params(yaml: &str) -> Result<LayerParams, String> {
    let params = match yaml_to_json(yaml)? {
        Value::Null => Map::new(),
        Value::Object(params) => params,
        other => {
            return Err(format!(
                "expected a mapping of keys to values, found {}",
                describe(&other)
            ));
        }
    };
    let disabled = match params.get(DISABLE_SCRIPTS) {
        None => None,
        Some(Value::Null) => Some(Vec::new()),
        // The seed's single-slug form, `disable_scripts: postboot1`.
        Some(Value::String(slug)) => Some(
            Some(slug.trim())
                .filter(|slug| !slug.is_empty())
                .map(str::to_owned)
                .into_iter()
                .collect(),
        ),
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|item| match item {
                    Value::String(slug) => Ok(slug.clone()),
                    other => Err(format!(
                        "{DISABLE_SCRIPTS} entries must be script slugs, found {} \
                         (quote a slug that looks like a number)",
                        describe(other)
                    )),
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(other) => {
            return Err(format!(
                "{DISABLE_SCRIPTS} must be a script slug or a list of them, found {}",
                describe(other)
            ));
        }
    };
    Ok(LayerParams { params, disabled })
}

/// Merges `over` into `base`: mappings merge by key, recursively; any other
/// value in `over` replaces the one in `base`. Recursion is bounded by the
/// YAML parser's nesting limit.
fn merge(base: &mut Map<String, Value>, over: Map<String, Value>) {
    for (key, value) in over {
        match value {
            Value::Object(over) => {
                if let Some(Value::Object(base)) = base.get_mut(&key) {
                    merge(base, over);
                } else {
                    base.insert(key, Value::Object(over));
                }
            }
            value => {
                base.insert(key, value);
            }
        }
    }
}

/// What kind of JSON value `value` is, for messages.
fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A JSON object literal as a layer.
    fn obj(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    /// Scripts 1..=5 named `s1`..`s5`.
    fn known_scripts() -> HashMap<i64, String> {
        (1..=5).map(|id| (id, format!("s{id}"))).collect()
    }

    /// Puts `values[i]` into `field` of the distro, one group, the image and
    /// the system, in that order, and computes the result.
    fn stack(field: &str, values: [Value; 4]) -> Result<EffectiveConfig, EffectiveError> {
        let [d, g, i, s] = values;
        let distro = obj(json!({ "slug": "debian-12", field: d }));
        let group = obj(json!({ "slug": "gpu", "priority": 0, field: g }));
        let image = obj(json!({ "slug": "compute", field: i }));
        let system = obj(json!({ "hostname": "c01", field: s }));
        let layers = Layers {
            distro: Some(&distro),
            groups: vec![&group],
            image: Some(&image),
            system: &system,
        };
        effective(&layers, &known_scripts())
    }

    fn strs(values: [&str; 4]) -> [Value; 4] {
        values.map(|v| json!(v))
    }

    /// Stacks each case's four values into `field` (see [`stack`]) and
    /// compares what `pick` reads of the result with the case's expectation.
    #[track_caller]
    fn check_cases<V, T, E>(field: &str, pick: impl Fn(EffectiveConfig) -> T, cases: &[([V; 4], E)])
    where
        V: Into<Value> + Copy + std::fmt::Debug,
        T: PartialEq<E> + std::fmt::Debug,
        E: Copy + std::fmt::Debug,
    {
        for &(values, expected) in cases {
            let got = stack(field, values.map(Into::into)).expect("effective");
            assert_eq!(pick(got), expected, "{values:?}");
        }
    }

    #[test]
    fn kernel_cmdline_appends_or_replaces() {
        check_cases(
            "install_kernel_cmdline",
            |c| c.kernel_cmdline,
            &[
                (["", "", "", ""], ""),
                (["quiet", "", "", ""], "quiet"),
                (
                    ["quiet", "console=ttyS0", "", "splash"],
                    "quiet console=ttyS0 splash",
                ),
                (["=quiet", "", "", ""], "quiet"),
                (["quiet", "=console=ttyS0", "", ""], "console=ttyS0"),
                (["quiet", "a", "=b", "c"], "b c"),
                (["quiet", "a", "b", "=c"], "c"),
                (["quiet", "a", "b", "= c d"], "c d"),
                (["quiet", "", "", "="], ""),
                (["quiet", "=", "x", ""], "x"),
                // Comment lines go, other lines are trimmed and joined with a space.
                (["quiet\n# debug\n  splash  ", "", "", ""], "quiet splash"),
                (["quiet", "# only a comment", "   ", "\n\n"], "quiet"),
                (["quiet", "# why\n=ro", "", ""], "ro"),
                // A `=` later in the value is part of an argument.
                (["quiet", "a =b", "", ""], "quiet a =b"),
            ],
        );
    }

    #[test]
    fn initial_mods_append_or_replace_without_duplicates() {
        let cases: &[([&str; 4], &[&str])] = &[
            (["", "", "", ""], &[]),
            (["e1000", "", "", ""], &["e1000"]),
            (["a,b", "c", "d", "e"], &["a", "b", "c", "d", "e"]),
            (["a,b", "b,c", "", "a"], &["a", "b", "c"]),
            (["=a", "", "", ""], &["a"]),
            (["a,b", "=c", "", "d"], &["c", "d"]),
            (["a", "b", "=c,a", ""], &["c", "a"]),
            (["a", "b", "c", "=d"], &["d"]),
            (["a", "b", "c", "="], &[]),
            ([" a , b ,, ", "", "", ""], &["a", "b"]),
            (["a\n# b\nc", "", "", ""], &["a", "c"]),
            (["a", "# =x", "", ""], &["a"]),
            (["a", "# reset\n=x", "", ""], &["x"]),
        ];
        check_cases("initial_mods", |c| c.initial_mods, cases);
    }

    #[test]
    fn tmpfs_and_interface_replace_when_set() {
        check_cases(
            "tmpfs_root_size",
            |c| c.tmpfs_root_size,
            &[
                ([0, 0, 0, 0], 0),
                ([4, 0, 0, 0], 4),
                ([4, 0, 8, 0], 8),
                ([4, 16, 8, 2], 2),
                ([0, 16, 0, 0], 16),
            ],
        );
        check_cases(
            "prov_interface",
            |c| c.prov_interface,
            &[
                (["", "", "", ""], ""),
                (["eth0", "", "", ""], "eth0"),
                (["eth0", "ib0", "", ""], "ib0"),
                (["eth0", "ib0", "# eno1", " "], "ib0"),
                (["eth0", "", "", " eno1 "], "eno1"),
            ],
        );
    }

    #[test]
    fn missing_and_null_fields_inherit() {
        let distro =
            obj(json!({ "slug": "d", "install_kernel_cmdline": "quiet", "tmpfs_root_size": 4 }));
        let system = obj(
            json!({ "hostname": "c01", "install_kernel_cmdline": null, "tmpfs_root_size": null }),
        );
        let layers = Layers {
            distro: Some(&distro),
            groups: vec![],
            image: None,
            system: &system,
        };
        let got = effective(&layers, &HashMap::new()).expect("effective");
        assert_eq!(got.kernel_cmdline, "quiet");
        assert_eq!(got.tmpfs_root_size, 4);
        assert_eq!(got.layers, ["distro d", "system c01"]);
        assert_eq!(got.config_params, json!({}));

        let system = obj(json!({}));
        let layers = Layers {
            distro: None,
            groups: vec![],
            image: None,
            system: &system,
        };
        let got = effective(&layers, &HashMap::new()).expect("effective");
        assert_eq!(got.layers, ["system ?"]);
    }

    #[test]
    fn groups_apply_by_priority_then_slug() {
        #[track_caller]
        fn check(groups: &[Value], expected: &[&str]) {
            let groups: Vec<_> = groups.iter().cloned().map(obj).collect();
            let system = obj(json!({ "hostname": "c01" }));
            let layers = Layers {
                distro: None,
                groups: groups.iter().collect(),
                image: None,
                system: &system,
            };
            let got = effective(&layers, &HashMap::new()).expect("effective");
            let mut want: Vec<String> = expected.iter().map(|g| format!("group {g}")).collect();
            want.push("system c01".to_owned());
            assert_eq!(got.layers, want);
            // Appending follows the same order.
            assert_eq!(got.kernel_cmdline, expected.join(" "));
        }
        fn g(slug: &str, priority: Value) -> Value {
            json!({ "slug": slug, "priority": priority, "install_kernel_cmdline": slug })
        }
        check(&[], &[]);
        check(&[g("b", json!(0)), g("a", json!(0))], &["a", "b"]);
        check(&[g("a", json!(10)), g("b", json!(-5))], &["b", "a"]);
        check(
            &[
                g("b", json!(0)),
                g("c", json!(10)),
                g("z", json!(-5)),
                g("a", json!(0)),
            ],
            &["z", "a", "b", "c"],
        );
        // A missing priority counts as 0.
        check(
            &[
                g("m", json!(1)),
                g("n", Value::Null),
                json!({ "slug": "a", "install_kernel_cmdline": "a" }),
            ],
            &["a", "n", "m"],
        );
    }

    #[test]
    fn config_params_merge_deeply() {
        #[track_caller]
        fn check(values: [&str; 4], expected: Value) {
            let got = stack("config_params", strs(values)).expect("effective");
            assert_eq!(got.config_params, expected, "{values:?}");
            // Key order is kept: earlier layers' keys first.
            assert_eq!(
                got.config_params.to_string(),
                expected.to_string(),
                "{values:?}"
            );
        }
        check(["", "", "", ""], json!({}));
        check(["# nothing here\n", "", "---\n", ""], json!({}));
        check(["a: 1", "b: 2", "", "a: 3"], json!({ "a": 3, "b": 2 }));
        // Nested maps merge by key.
        check(
            [
                "net:\n  mtu: 1500\n  dns: {search: lab}",
                "net:\n  mtu: 9000",
                "",
                "net: {dns: {servers: [x]}}",
            ],
            json!({ "net": { "mtu": 9000, "dns": { "search": "lab", "servers": ["x"] } } }),
        );
        // Lists are replaced, not appended.
        check(["ntp: [a, b]", "ntp: [c]", "", ""], json!({ "ntp": ["c"] }));
        // A scalar replaces a map and a map replaces a scalar.
        check(["a: {b: 1}", "a: 2", "", ""], json!({ "a": 2 }));
        check(
            ["a: 2", "a: {b: 1}", "", "a: {c: 3}"],
            json!({ "a": { "b": 1, "c": 3 } }),
        );
        // An explicit null replaces too.
        check(["a: {b: 1}", "", "", "a: ~"], json!({ "a": null }));
        // `disable_scripts` is combined only at the top level.
        check(
            [
                "x: {disable_scripts: [a]}",
                "x: {disable_scripts: [b]}",
                "",
                "",
            ],
            json!({ "x": { "disable_scripts": ["b"] } }),
        );
    }

    #[test]
    fn disable_scripts_combine_and_remove_scripts() {
        #[track_caller]
        fn check(params: [&str; 4], scripts: [&[i64]; 4], disabled: &[&str], kept: &[i64]) {
            let [d, g, i, s] = params;
            let [sd, sg, si, ss] = scripts;
            let distro = obj(json!({ "slug": "d", "config_params": d, "scripts": sd }));
            let group = obj(json!({ "slug": "g", "config_params": g, "scripts": sg }));
            let image = obj(json!({ "slug": "i", "config_params": i, "scripts": si }));
            let system = obj(json!({ "hostname": "c01", "config_params": s, "scripts": ss }));
            let layers = Layers {
                distro: Some(&distro),
                groups: vec![&group],
                image: Some(&image),
                system: &system,
            };
            let got = effective(&layers, &known_scripts()).expect("effective");
            assert_eq!(got.disable_scripts, disabled, "{params:?}");
            let ids: Vec<i64> = got.scripts.iter().map(|s| s.id).collect();
            assert_eq!(ids, kept, "{params:?} {scripts:?}");
            for script in &got.scripts {
                assert_eq!(script.slug, format!("s{}", script.id));
            }
            if params.iter().any(|p| p.contains(DISABLE_SCRIPTS)) {
                assert_eq!(got.config_params[DISABLE_SCRIPTS], json!(disabled));
            } else {
                assert!(got.config_params.get(DISABLE_SCRIPTS).is_none());
            }
        }
        let none = ["", "", "", ""];
        check(none, [&[], &[], &[], &[]], &[], &[]);
        // The union in layer order, without duplicates.
        check(none, [&[3, 1], &[2, 1], &[], &[5, 3]], &[], &[3, 1, 2, 5]);
        // A later layer can disable an earlier layer's script, and vice versa.
        check(
            ["disable_scripts: [s5]", "", "", "disable_scripts: [s1]"],
            [&[1, 2], &[], &[3], &[5]],
            &["s5", "s1"],
            &[2, 3],
        );
        // Lists combine without duplicates; a later list does not undo one.
        check(
            [
                "disable_scripts: [s1, s2]",
                "disable_scripts: [s2]",
                "disable_scripts: []",
                "disable_scripts: ~",
            ],
            [&[1, 2, 3], &[], &[], &[]],
            &["s1", "s2"],
            &[3],
        );
        // Unknown slugs are kept in the list but match nothing.
        check(
            ["disable_scripts: [nope]", "", "", ""],
            [&[1], &[], &[], &[]],
            &["nope"],
            &[1],
        );
        // A single slug as a string (the seed's form) is a list of one, in
        // any layer, and combines with the lists of the others.
        check(
            ["", "disable_scripts: s2", "", "disable_scripts: [s3]"],
            [&[1, 2], &[3], &[], &[]],
            &["s2", "s3"],
            &[1],
        );
        check(
            ["disable_scripts: ' s1 '", "", "disable_scripts: ''", ""],
            [&[1, 2], &[], &[], &[]],
            &["s1"],
            &[2],
        );
    }

    #[test]
    fn bad_config_params_name_the_layer() {
        #[track_caller]
        fn check(values: [&str; 4], layer: &str, reason_has: &str) {
            let err = stack("config_params", strs(values)).expect_err("should fail");
            let EffectiveError::ConfigParams {
                layer: got_layer,
                reason,
            } = &err
            else {
                panic!("unexpected error {err:?}");
            };
            assert_eq!(got_layer, layer, "{values:?}");
            assert!(
                reason.contains(reason_has),
                "{reason:?} lacks {reason_has:?}"
            );
            assert!(
                err.to_string()
                    .starts_with(&format!("config_params of {layer} is invalid: "))
            );
        }
        check(
            ["a: [1,", "", "", ""],
            "distro \"debian-12\"",
            "line 1, column 4",
        );
        check(["", "a: 1\n  b: 2", "", ""], "group \"gpu\"", "line 2");
        check(
            ["", "", "- a\n- b", ""],
            "image \"compute\"",
            "found a list",
        );
        check(
            ["", "", "", "just text"],
            "system \"c01\"",
            "found a string",
        );
        check(["", "", "", "42"], "system \"c01\"", "found a number");
        check(["", "a: 1\na: 2", "", ""], "group \"gpu\"", "duplicate");
        check(
            ["", "disable_scripts: {s1: 1}", "", ""],
            "group \"gpu\"",
            "must be a script slug or a list of them",
        );
        check(
            ["", "disable_scripts: [1]", "", ""],
            "group \"gpu\"",
            "found a number",
        );
    }

    #[test]
    fn wrong_field_types_are_errors() {
        #[track_caller]
        fn check(field: &str, value: Value, expected: EffectiveError) {
            let values = [Value::Null, value, Value::Null, Value::Null];
            let got = stack(field, values).expect_err("should fail");
            assert_eq!(got, expected);
        }
        let field = |field, expected| EffectiveError::Field {
            layer: "group \"gpu\"".to_owned(),
            field,
            expected,
        };
        check(
            "install_kernel_cmdline",
            json!(1),
            field("install_kernel_cmdline", "a string"),
        );
        check(
            "initial_mods",
            json!(["a"]),
            field("initial_mods", "a string"),
        );
        check(
            "config_params",
            json!({ "a": 1 }),
            field("config_params", "a string"),
        );
        check(
            "tmpfs_root_size",
            json!("4"),
            field("tmpfs_root_size", "an integer"),
        );
        check(
            "tmpfs_root_size",
            json!(1.5),
            field("tmpfs_root_size", "an integer"),
        );
        check(
            "tmpfs_root_size",
            json!(-1),
            field("tmpfs_root_size", "a non-negative integer"),
        );
        check(
            "scripts",
            json!([1, "s2"]),
            field("scripts", "a list of script ids"),
        );
        check(
            "scripts",
            json!(1),
            field("scripts", "a list of script ids"),
        );
        check(
            "scripts",
            json!([9]),
            EffectiveError::UnknownScript {
                layer: "group \"gpu\"".to_owned(),
                id: 9,
            },
        );
        check("priority", json!("high"), field("priority", "an integer"));
    }

    #[test]
    fn validate_config_params_accepts_only_mappings() {
        #[track_caller]
        fn check(yaml: &str, expected: Result<(), &str>) {
            match (validate_config_params(yaml), expected) {
                (Ok(()), Ok(())) => {}
                (Err(got), Err(want)) => {
                    assert!(got.contains(want), "{yaml:?}: {got:?} lacks {want:?}")
                }
                (got, want) => panic!("{yaml:?}: got {got:?}, want {want:?}"),
            }
        }
        check("", Ok(()));
        check("  \n", Ok(()));
        check("# just a note\n# and another\n", Ok(()));
        check("a: 1\nb: {c: [1, 2]}\n", Ok(()));
        check("disable_scripts: [a, b]\n", Ok(()));
        check("disable_scripts:\n", Ok(()));
        check(
            "- a\n- b\n",
            Err("expected a mapping of keys to values, found a list"),
        );
        check("hello", Err("found a string"));
        check("true", Err("found a boolean"));
        check("a: [1,\n", Err("at line 1, column 4"));
        check("a: 'open\n", Err("line 1"));
        check("a: 1\na: 2\n", Err("duplicate mapping key `a`"));
        check("a: 1\n---\nb: 2\n", Err("multiple"));
        check("a: .inf\n", Err("not a finite number"));
        check(
            "disable_scripts: {a: 1}\n",
            Err("must be a script slug or a list of them, found a mapping"),
        );
        check("disable_scripts: postboot1\n", Ok(()));
        check("disable_scripts: 5\n", Err("found a number"));
        check("disable_scripts: [a, [b]]\n", Err("found a list"));
    }

    #[test]
    fn yaml_to_json_converts_scalars() {
        #[track_caller]
        fn check(yaml: &str, expected: Value) {
            assert_eq!(yaml_to_json(yaml).expect("parses"), expected, "{yaml:?}");
        }
        check("", Value::Null);
        check("# c", Value::Null);
        check(
            "a: 1\nb: 1.5\nc: true\nd: ~\ne: text\nf: '1'",
            json!({ "a": 1, "b": 1.5, "c": true, "d": null, "e": "text", "f": "1" }),
        );
        check(
            "a: &x {b: 1}\nc: *x",
            json!({ "a": { "b": 1 }, "c": { "b": 1 } }),
        );
        check("[1, two]", json!([1, "two"]));
    }

    #[test]
    fn serializes_as_the_api_shows_it() {
        let distro = obj(json!({
            "slug": "debian-12", "install_kernel_cmdline": "quiet", "initial_mods": "e1000",
            "config_params": "disable_scripts: [s2]\nntp: pool", "scripts": [1, 2],
        }));
        let system =
            obj(json!({ "hostname": "c01", "tmpfs_root_size": 8, "prov_interface": "eno1" }));
        let layers = Layers {
            distro: Some(&distro),
            groups: vec![],
            image: None,
            system: &system,
        };
        let got = effective(&layers, &known_scripts()).expect("effective");
        assert_eq!(
            serde_json::to_value(&got).expect("serializes"),
            json!({
                "kernel_cmdline": "quiet",
                "initial_mods": ["e1000"],
                "tmpfs_root_size": 8,
                "prov_interface": "eno1",
                "config_params": { "disable_scripts": ["s2"], "ntp": "pool" },
                "disable_scripts": ["s2"],
                "scripts": [{ "id": 1, "slug": "s1", "layer": "distro" }],
                "layers": ["distro debian-12", "system c01"],
            })
        );
    }
}
