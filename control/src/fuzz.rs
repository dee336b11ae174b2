//! Fuzzing entry points: the parsers of untrusted input, driven from raw bytes.
//!
//! Each `pub fn <target>(data: &[u8])` here is shared by two callers:
//!
//! * the cargo-fuzz target of the same name in `tests/fuzz/fuzz_targets/`,
//!   which libFuzzer runs on the nightly toolchain, and
//! * the stable test `fuzz::tests::replay_corpora`, which runs every file of
//!   `tests/fuzz/corpus/<target>/` through the entry point on every
//!   `cargo test`, so a crash once found stays fixed and the corpora cannot
//!   silently vanish (rustls and hickory-dns do the same).
//!
//! An entry point accepts any bytes and must never panic. Besides "no panic",
//! each asserts cheap properties that must hold for every input: a body that
//! validates carries only writable keys, a normalised MAC or host name parses
//! back to itself, merging a `config_params` mapping with itself changes
//! nothing, a client cannot spoof its address by prepending hops to
//! X-Forwarded-For. A failed assertion is a panic, so libFuzzer reports it as
//! a crash with the input that caused it.
//!
//! What each target reads from its bytes:
//!
//! * [`request_body`]: a JSON request body. An object is validated for every
//!   kind in create and update mode, and as a nested child (a system's NIC);
//!   an array is validated row by row as a bulk create of every kind.
//! * [`config_params`]: UTF-8 (lossy) YAML for a layer's `config_params`.
//! * [`effective_layers`]: a JSON array `[system, distro, image, group...]` of
//!   at most 6 layers; `null` leaves out the distro or the image.
//! * [`scalars`]: URL query pairs, and lines, each tried as a MAC, host name,
//!   slug, reference, API key and secret, directly and through [`validate()`].
//! * [`forwarded`]: a selector byte for the peer address, then the lines
//!   `X-Forwarded-For`, `Host` and an optional peer address.
//! * [`backup_archive`]: a selector byte, then a backup archive as
//!   `mprov-control restore` reads it from an untrusted file, or the inside
//!   of one table part, which the harness wraps in a well-formed archive.
//! * [`passkey_responses`]: a selector byte, then a WebAuthn attestation
//!   object, authenticatorData, clientDataJSON, a COSE key, or a whole
//!   registration or sign-in response as JSON, checked for the site
//!   `https://mpcc.cluster`.
//! * [`systems_filter`]: UTF-8 (lossy) text of a systems filter, as
//!   `?filter=`, the admin pages and `mash --filter` take it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::LazyLock;

use clap::Parser;
use serde_json::{Map, Value, json};

use crate::config::{Config, EXAMPLE_HOST_ARGS, Settings};
use crate::db::crud::filter::{Filter, MAX_FILTER_LEN};
use crate::db::crud::{
    FieldError, ListQuery, Mode, Obj, RefKey, StoreError, field_errors, parse_hostname, parse_mac,
    parse_slug, validate, writable_names,
};
use crate::db::kinds::{self, KINDS, Kind};
use crate::db::{Engine, MAX_BINDS, Sql};
use crate::effective::{EffectiveConfig, Layers, effective, validate_config_params, yaml_to_json};
use crate::passkeys::{self, CoseKey, Site};
use crate::secrets::{SecretBox, split_api_key};

/// A fuzzing entry point: takes any bytes, panics only on a bug.
pub type Target = fn(&[u8]);

/// Every target: its name (the corpus folder and the cargo-fuzz binary) and
/// its entry point.
pub const TARGETS: &[(&str, Target)] = &[
    ("backup_archive", backup_archive),
    ("config_params", config_params),
    ("effective_layers", effective_layers),
    ("forwarded", forwarded),
    ("passkey_responses", passkey_responses),
    ("request_body", request_body),
    ("scalars", scalars),
    ("systems_filter", systems_filter),
];

/// The most rows of a bulk body validated, so one input stays fast.
const MAX_BULK_ROWS: usize = 64;
/// The most lines of a [`scalars`] input tried.
const MAX_SCALARS: usize = 8;
/// The most layers of an [`effective_layers`] input.
const MAX_LAYERS: usize = 6;
/// The largest `config_params` the API accepts (see `crud::parse_field`).
const MAX_YAML: usize = 1 << 20;

/// The key of the `config_params` list that combines across layers.
const DISABLE_SCRIPTS: &str = "disable_scripts";

static SECRETS: LazyLock<SecretBox> = LazyLock::new(|| SecretBox::new("fuzz"));

/// A configuration as `mprov-control serve` builds it, trusting the proxies
/// in 10.0.0.0/8 and 2001:db8::/32.
static CONFIG: LazyLock<Config> = LazyLock::new(|| {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        settings: Settings,
    }
    let argv = [
        &["mprov-control", "--database-url", "sqlite::memory:"][..],
        &EXAMPLE_HOST_ARGS,
        &["--trusted-proxies", "10.0.0.0/8,2001:db8::/32"],
    ]
    .concat();
    // Fixed arguments: failing here is a bug in this harness, not in the input.
    #[allow(clippy::expect_used)]
    let cli = Cli::try_parse_from(argv).expect("the fuzz settings parse");
    #[allow(clippy::expect_used)]
    Config::from_settings(cli.settings).expect("the fuzz settings are valid")
});

/// Peers the [`forwarded`] selector byte picks from: trusted and untrusted,
/// IPv4, IPv6 and IPv4-mapped IPv6.
const PEERS: [&str; 5] = [
    "10.1.2.3",
    "198.51.100.1",
    "2001:db8::7",
    "::ffff:10.1.2.3",
    "127.0.0.1",
];

/// A JSON request body, validated for every kind.
pub fn request_body(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    match &value {
        Value::Object(body) => {
            for kind in KINDS {
                let created = check_body(kind, body, Mode::Create, "");
                let updated = check_body(kind, body, Mode::Update, "");
                // An update takes what a create takes, except nested children.
                let has_children = kind.children.iter().any(|c| body.contains_key(c.name));
                if created.is_ok() && !has_children {
                    assert!(
                        updated.is_ok(),
                        "{}: create accepts the body but update rejects it: {:?}",
                        kind.name,
                        updated.err()
                    );
                }
                for child in kind.children {
                    if let Some(child_kind) = kinds::kind(child.kind) {
                        let _ = check_body(child_kind, body, Mode::Child(child.parent_field), "");
                    }
                }
            }
        }
        Value::Array(rows) => {
            for kind in KINDS {
                let mut errors = Vec::new();
                for (i, row) in rows.iter().take(MAX_BULK_ROWS).enumerate() {
                    let path = format!("rows[{i}]");
                    match row.as_object() {
                        Some(obj) => {
                            if let Err(mut e) = check_body(kind, obj, Mode::Create, &path) {
                                errors.append(&mut e);
                            }
                        }
                        None => errors.push(FieldError {
                            path,
                            message: "expected an object".into(),
                        }),
                    }
                }
                if !errors.is_empty() {
                    check_errors(errors);
                }
            }
        }
        _ => {}
    }
}

/// Validates `body` and checks what the result promises.
fn check_body(
    kind: &'static Kind,
    body: &Obj,
    mode: Mode,
    path: &str,
) -> Result<(), Vec<FieldError>> {
    match validate(kind, body, mode, &SECRETS, path) {
        Ok(_) => {
            let writable: Vec<&str> = writable_names(kind).collect();
            for key in body.keys() {
                assert!(
                    writable.contains(&key.as_str()),
                    "{} {mode:?}: accepted {key:?}, which is not writable",
                    kind.name
                );
                assert!(
                    !matches!(mode, Mode::Child(parent) if parent == key.as_str()),
                    "{} {mode:?}: accepted the implied parent {key:?}",
                    kind.name
                );
                assert!(
                    mode == Mode::Create || !kind.children.iter().any(|c| c.name == key.as_str()),
                    "{} {mode:?}: accepted children {key:?} outside a create",
                    kind.name
                );
            }
            if mode != Mode::Update {
                for field in kind.fields.iter().filter(|f| f.required()) {
                    assert!(
                        body.contains_key(field.name) || mode == Mode::Child(field.name),
                        "{} {mode:?}: accepted a body without the required {:?}",
                        kind.name,
                        field.name
                    );
                }
            }
            Ok(())
        }
        Err(errors) => {
            assert!(
                !errors.is_empty(),
                "{}: an error without a field",
                kind.name
            );
            for e in &errors {
                assert!(
                    e.path.starts_with(path),
                    "{}: error path {:?} outside {path:?}",
                    kind.name,
                    e.path
                );
            }
            check_errors(errors.clone());
            Err(errors)
        }
    }
}

/// Turns field errors into the store error the API shows, as it does.
fn check_errors(errors: Vec<FieldError>) {
    let first = errors.first().map(|e| e.path.clone());
    match field_errors(errors) {
        StoreError::Invalid { field, message } => {
            assert_eq!(field, first);
            assert!(!message.is_empty());
        }
        other => panic!("field errors became {other:?}"),
    }
}

/// A layer's `config_params` YAML: validated, converted, and layered.
pub fn config_params(data: &[u8]) {
    let yaml = String::from_utf8_lossy(data);
    let checked = validate_config_params(&yaml);
    let parsed = yaml_to_json(&yaml);
    let mapping = match (&checked, &parsed) {
        (Ok(()), Ok(Value::Null)) => Map::new(),
        (Ok(()), Ok(Value::Object(m))) => m.clone(),
        (Ok(()), other) => panic!("valid config_params converted to {other:?}"),
        (Err(_), Ok(Value::Object(m))) => {
            // Only a malformed disable_scripts fails a mapping.
            assert!(
                m.contains_key(DISABLE_SCRIPTS),
                "a mapping without {DISABLE_SCRIPTS} was rejected: {checked:?}"
            );
            return;
        }
        (Err(_), _) => return,
    };

    // The API's validation agrees with the module's.
    if yaml.len() <= MAX_YAML {
        let systems = kinds::kind("systems");
        if let Some(systems) = systems {
            let body = json!({ "config_params": yaml });
            let body = body.as_object().cloned().unwrap_or_default();
            assert!(
                validate(systems, &body, Mode::Update, &SECRETS, "").is_ok(),
                "valid config_params rejected by the systems kind"
            );
        }
    }

    // The same mapping on every layer: merging is idempotent, and the
    // disable_scripts lists combine without duplicates.
    let layer = |name_key: &str, name: &str| -> Obj {
        let mut o = Obj::new();
        o.insert(name_key.to_owned(), Value::String(name.to_owned()));
        o.insert("config_params".to_owned(), Value::String(yaml.to_string()));
        o.insert("scripts".to_owned(), json!([1, 2, 3]));
        o
    };
    let (distro, group, image, system) = (
        layer("slug", "d"),
        layer("slug", "g"),
        layer("slug", "i"),
        layer("hostname", "h"),
    );
    let layers = Layers {
        distro: Some(&distro),
        groups: vec![&group],
        image: Some(&image),
        system: &system,
    };
    let got = match effective(&layers, &known_scripts()) {
        Ok(got) => got,
        Err(err) => panic!("valid config_params failed to layer: {err}"),
    };
    check_effective(&got, 4);
    let disabled = disabled_of(&mapping);
    assert_eq!(got.disable_scripts, disabled);
    let Value::Object(merged) = &got.config_params else {
        panic!("config_params is not an object");
    };
    let want_keys: Vec<&String> = mapping.keys().collect();
    let got_keys: Vec<&String> = merged.keys().collect();
    assert_eq!(got_keys, want_keys, "merging a mapping with itself");
    for (key, value) in &mapping {
        if key == DISABLE_SCRIPTS {
            assert_eq!(merged[key], json!(disabled));
        } else {
            assert_eq!(&merged[key], value, "merging {key:?} with itself");
        }
    }
    let kept: Vec<i64> = (1..=3)
        .filter(|id| !disabled.contains(&format!("s{id}")))
        .collect();
    let got_ids: Vec<i64> = got.scripts.iter().map(|s| s.id).collect();
    assert_eq!(got_ids, kept);

    // Over a base layer: the later layer's top-level values win.
    let base = json!({
        "slug": "base",
        "config_params": "base: 1\ndisable_scripts: [s1]\n",
    });
    let base = base.as_object().cloned().unwrap_or_default();
    let layers = Layers {
        distro: Some(&base),
        groups: vec![],
        image: None,
        system: &system,
    };
    let got = match effective(&layers, &known_scripts()) {
        Ok(got) => got,
        Err(err) => panic!("valid config_params failed over a base layer: {err}"),
    };
    check_effective(&got, 2);
    assert_eq!(got.disable_scripts.first().map(String::as_str), Some("s1"));
    for (key, value) in &mapping {
        if key != DISABLE_SCRIPTS {
            assert_eq!(&got.config_params[key], value, "{key:?} over a base layer");
        }
    }
}

/// The `disable_scripts` of one parsed mapping, without duplicates.
fn disabled_of(mapping: &Map<String, Value>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    // A single slug as a string is a list of one (blank: none).
    if let Some(Value::String(slug)) = mapping.get(DISABLE_SCRIPTS)
        && !slug.trim().is_empty()
    {
        out.push(slug.trim().to_owned());
    }
    if let Some(Value::Array(items)) = mapping.get(DISABLE_SCRIPTS) {
        for item in items {
            if let Value::String(slug) = item
                && !out.contains(slug)
            {
                out.push(slug.clone());
            }
        }
    }
    out
}

/// Scripts 1..=5 named `s1`..`s5`.
fn known_scripts() -> HashMap<i64, String> {
    (1..=5).map(|id| (id, format!("s{id}"))).collect()
}

/// What every effective configuration promises.
fn check_effective(got: &EffectiveConfig, layers: usize) {
    assert_eq!(got.layers.len(), layers);
    assert!(got.config_params.is_object());
    assert!(got.tmpfs_root_size >= 0);
    assert!(!got.kernel_cmdline.contains('\n'));
    for (i, m) in got.initial_mods.iter().enumerate() {
        assert!(!m.is_empty() && !m.contains(','), "module {m:?}");
        assert!(!got.initial_mods[..i].contains(m), "duplicate module {m:?}");
    }
    for (i, s) in got.scripts.iter().enumerate() {
        assert!(
            !got.disable_scripts.contains(&s.slug),
            "disabled {s:?} kept"
        );
        assert!(
            !got.scripts[..i].iter().any(|t| t.id == s.id),
            "duplicate {s:?}"
        );
    }
    if let Err(err) = serde_json::to_value(got) {
        panic!("effective config does not serialize: {err}");
    }
}

/// Arbitrary layers: `[system, distro, image, group...]`.
pub fn effective_layers(data: &[u8]) {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let items: Vec<&Value> = items.iter().take(MAX_LAYERS).collect();
    let empty = Obj::new();
    let system = items.first().and_then(|v| v.as_object()).unwrap_or(&empty);
    let distro = items.get(1).and_then(|v| v.as_object());
    let image = items.get(2).and_then(|v| v.as_object());
    let groups: Vec<&Obj> = items.iter().skip(3).filter_map(|v| v.as_object()).collect();
    let scripts = known_scripts();
    let layers = Layers {
        distro,
        groups: groups.clone(),
        image,
        system,
    };
    let count = 1 + usize::from(distro.is_some()) + usize::from(image.is_some()) + groups.len();
    match effective(&layers, &scripts) {
        Ok(got) => {
            check_effective(&got, count);
            // Groups apply by priority, then name: with distinct slugs the
            // order in which the caller passes them does not matter.
            let mut slugs: Vec<&str> = groups
                .iter()
                .filter_map(|g| g.get("slug").and_then(Value::as_str))
                .filter(|s| !s.is_empty())
                .collect();
            slugs.sort_unstable();
            slugs.dedup();
            if slugs.len() == groups.len() {
                let reversed = Layers {
                    groups: groups.iter().rev().copied().collect(),
                    ..layers
                };
                assert_eq!(
                    effective(&reversed, &scripts).ok(),
                    Some(got),
                    "group order changed the result"
                );
            }
        }
        Err(err) => {
            assert!(!err.to_string().is_empty());
        }
    }
}

/// Query pairs, and each line as every kind of scalar the API parses.
pub fn scalars(data: &[u8]) {
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(data).into_owned().collect();
    let n = pairs.len();
    let q = ListQuery::from_pairs(pairs);
    assert!(q.filters.len() <= n);
    for (k, _) in &q.filters {
        assert!(
            !matches!(k.as_str(), "sort" | "limit" | "cursor"),
            "{k:?} read as a filter"
        );
    }

    let text = String::from_utf8_lossy(data);
    for line in text.split('\n').take(MAX_SCALARS) {
        scalar(line);
    }
}

fn scalar(s: &str) {
    // Any text is a cursor a client may send back: it decodes or is refused.
    if let Some(at) = crate::db::crud::decode_cursor(s) {
        let again = crate::db::crud::encode_cursor(&at);
        assert_eq!(
            crate::db::crud::decode_cursor(&again).as_ref(),
            Some(&at),
            "{s:?}"
        );
    }
    let mac = parse_mac(s);
    if let Ok(m) = &mac {
        assert_eq!(m.len(), 17, "{m:?}");
        assert!(
            m.bytes().enumerate().all(|(i, b)| if i % 3 == 2 {
                b == b':'
            } else {
                matches!(b, b'0'..=b'9' | b'a'..=b'f')
            }),
            "{m:?}"
        );
        assert_eq!(
            parse_mac(m).as_ref(),
            Ok(m),
            "MAC {s:?} normalised to {m:?}"
        );
    }
    let host = parse_hostname(s);
    if let Ok(h) = &host {
        assert!(!h.is_empty() && h.len() <= 253, "{h:?}");
        assert_eq!(
            parse_hostname(h).as_ref(),
            Ok(h),
            "host {s:?} normalised to {h:?}"
        );
    }
    let slug = parse_slug(s);
    if let Ok(sl) = &slug {
        assert_eq!(sl, s);
        // A slug never reads as an id.
        assert_eq!(RefKey::parse_str(s), RefKey::Slug(s.to_owned()));
    }
    match RefKey::parse_str(s) {
        RefKey::Id(id) => assert_eq!(RefKey::parse_str(&id.to_string()), RefKey::Id(id)),
        RefKey::Slug(sl) => assert_eq!(sl, s),
    }
    if let Some((prefix, secret)) = split_api_key(s) {
        assert!(!prefix.is_empty() && !secret.is_empty() && !prefix.contains('.'));
        assert_eq!(format!("{prefix}.{secret}"), s);
    }
    if s.len() <= 1024 {
        let sealed = SECRETS.seal(s);
        assert_eq!(SECRETS.open(&sealed).ok().as_deref(), Some(s));
    }
    let _ = SECRETS.open(s);

    // The same text as a field of a body: the API agrees with the parsers.
    let accepts = |kind: &str, field: &str, value: Value| -> bool {
        let Some(kind) = kinds::kind(kind) else {
            return false;
        };
        let mut body = Obj::new();
        body.insert(field.to_owned(), value);
        check_body(kind, &body, Mode::Update, "").is_ok()
    };
    assert_eq!(accepts("nics", "mac", json!(s)), mac.is_ok(), "mac {s:?}");
    assert_eq!(
        accepts("nics", "hostname", json!(s)),
        host.is_ok(),
        "hostname {s:?}"
    );
    assert_eq!(
        accepts("groups", "slug", json!(s)),
        slug.is_ok(),
        "slug {s:?}"
    );
    for (kind, field, value) in [
        ("nics", "ipv4", json!(s)),
        ("nics", "ipv6", json!(s)),
        ("nics", "aliases", json!([s])),
        ("nics", "name", json!(s)),
        ("networks", "net_type", json!(s)),
        ("apikeys", "expires_at", json!(s)),
        ("bmcs", "password", json!(s)),
        ("users", "password", json!(s)),
        ("systems", "image", json!(s)),
        ("systems", "groups", json!([s])),
    ] {
        let _ = accepts(kind, field, value);
    }
}

/// `X-Forwarded-For` and `Host` headers.
pub fn forwarded(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let mut lines = text.splitn(3, '\n');
    let xff = lines.next().unwrap_or_default();
    let host = lines.next().unwrap_or_default();
    let peer_text = lines.next().unwrap_or_default();
    let fixed = PEERS[usize::from(selector) % PEERS.len()];
    let peer: IpAddr = match (selector >= 128, peer_text.trim().parse()) {
        (true, Ok(ip)) => ip,
        _ => match fixed.parse() {
            Ok(ip) => ip,
            Err(err) => panic!("peer {fixed:?}: {err}"),
        },
    };
    let config = &*CONFIG;
    let trusted = |ip: &IpAddr| config.trusted_proxies.iter().any(|n| n.contains(ip));

    assert_eq!(config.client_ip(peer, None), peer);
    let client = config.client_ip(peer, Some(xff));
    if !trusted(&peer) {
        assert_eq!(client, peer, "an untrusted peer's header was believed");
    } else if client != peer {
        // The client is one of the hops, and every hop nearer than it is a
        // trusted proxy.
        let hops: Vec<&str> = xff.split(',').map(str::trim).collect();
        let at = hops
            .iter()
            .rposition(|h| h.parse::<IpAddr>().ok() == Some(client));
        let Some(at) = at else {
            panic!("client {client} is neither the peer nor a hop of {xff:?}");
        };
        for hop in &hops[at + 1..] {
            let ip = hop.parse::<IpAddr>().ok();
            assert!(
                ip.is_some_and(|ip| trusted(&ip)),
                "hop {hop:?} nearer than {client} is not a trusted proxy"
            );
        }
    }
    if !trusted(&client) {
        // What the client prepends cannot change who it is.
        for spoof in ["10.0.0.9", "1.2.3.4", "junk", ""] {
            let spoofed = format!("{spoof},{xff}");
            assert_eq!(
                config.client_ip(peer, Some(&spoofed)),
                client,
                "prepending {spoof:?} to {xff:?}"
            );
        }
    }

    let allowed = config.host_allowed(host);
    assert_eq!(
        config.host_allowed(&host.to_ascii_uppercase()),
        allowed,
        "Host {host:?} is case-sensitive"
    );
    if !host.contains(':') && !host.starts_with('[') {
        assert_eq!(
            config.host_allowed(&format!("{host}:8080")),
            allowed,
            "Host {host:?} with a port"
        );
    }
}

/// The largest decompressed table part a [`backup_archive`] input may claim
/// when the harness writes its manifest (the format allows far more; a
/// fuzzer's memory limit does not).
const MAX_FUZZ_TABLE: usize = 1 << 20;

/// A backup archive, checked as `restore` checks it before touching the
/// database. The first byte picks what the rest is:
///
/// * even: the whole archive, as read from the file;
/// * `1 mod 4`: the decompressed JSON of one table part; the harness
///   compresses it and writes a manifest with the right size and hash, and
///   the row count the JSON's row list would have, so the checks behind the
///   hashes (the table's JSON, its names, its row widths) are reached;
/// * `3 mod 4`: the compressed bytes of one table part (any zstd frame, or
///   not), with the decompressed size taken from the next two bytes.
///
/// Whatever [`crate::backup::archive::open`] accepts must pack again into an
/// archive that opens to the same tables, secrets and manifest fields.
pub fn backup_archive(data: &[u8]) {
    use crate::backup::archive;

    let Some((&mode, rest)) = data.split_first() else {
        let _ = archive::open(data);
        return;
    };
    let bytes = match mode % 4 {
        1 => {
            let rows = serde_json::from_slice::<Value>(rest)
                .ok()
                .and_then(|v| Some(v.get("rows")?.as_array()?.len()))
                .unwrap_or(usize::from(mode >> 2));
            match zstd::bulk::compress(rest, 1) {
                Ok(part) => one_table_archive(&part, rest.len(), rows),
                Err(_) => return,
            }
        }
        3 => {
            let (size, part) = match rest {
                [a, b, part @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), part),
                _ => (0, rest),
            };
            one_table_archive(part, size.min(MAX_FUZZ_TABLE), usize::from(mode >> 2))
        }
        _ => rest.to_vec(),
    };
    let verified = match archive::open(&bytes) {
        Ok(v) => v,
        Err(err) => {
            assert!(!err.to_string().is_empty());
            return;
        }
    };
    // What opens is well-formed: rows as wide as their columns, one part per
    // table, the counts the manifest promised.
    for t in &verified.tables {
        assert!(archive::is_identifier(&t.table), "{:?}", t.table);
        assert!(t.rows.iter().all(|r| r.len() == t.columns.len()));
        let part = verified
            .manifest
            .parts
            .iter()
            .find(|p| p.path == format!("{}{}.json.zst", archive::TABLES, t.table));
        assert_eq!(
            part.and_then(|p| p.rows),
            Some(t.rows.len() as u64),
            "{}",
            t.table
        );
    }
    assert_eq!(verified.secrets.is_some(), verified.manifest.with_secrets);
    let again = archive::pack(archive::Contents {
        manifest: verified.manifest.clone(),
        tables: verified.tables.clone(),
        secrets: verified.secrets.clone(),
    });
    // Packing what was just read cannot fail: it is all in memory.
    #[allow(clippy::expect_used)]
    let again = archive::open(&again.expect("a verified archive packs again"))
        .unwrap_or_else(|e| panic!("a verified archive, packed again, is refused: {e}"));
    assert_eq!(again.tables, verified.tables);
    assert_eq!(again.secrets, verified.secrets);
    let mut fields = again.manifest.clone();
    fields.parts.clone_from(&verified.manifest.parts);
    assert_eq!(fields, verified.manifest, "the manifest's fields");
}

/// A well-formed archive around one table part `part` (compressed), with a
/// manifest that gives its true size and hash, `raw` decompressed bytes and
/// `rows` rows.
fn one_table_archive(part: &[u8], raw: usize, rows: usize) -> Vec<u8> {
    use sha2::Digest;

    use crate::backup::archive;
    let manifest = json!({
        "format": archive::FORMAT,
        "format_version": archive::FORMAT_VERSION,
        "mprov_version": "0.1.0",
        "engine": "sqlite",
        "schema_level": 1,
        "revision": 1,
        "created_at": "2026-01-01T00:00:00Z",
        "secret_key_id": "",
        "with_secrets": false,
        "parts": [{
            "path": format!("{}t.json.zst", archive::TABLES),
            "bytes": part.len(),
            "raw_bytes": raw,
            "rows": rows,
            "sha256": hex::encode(sha2::Sha256::digest(part)),
        }],
    });
    let manifest = manifest.to_string();
    let part_path = format!("{}t.json.zst", archive::TABLES);
    archive::tar_of([
        (archive::MANIFEST, manifest.as_bytes()),
        (part_path.as_str(), part),
    ])
    .unwrap_or_default()
}

/// The parsers and checks of WebAuthn responses (`passkeys`). The first
/// byte picks what the rest is: 0 an attestation object, 1
/// authenticatorData, 2 clientDataJSON, 3 a COSE key, 4 a registration
/// response (JSON), 5 a sign-in response (JSON); the JSON ones are checked
/// for the site `https://mpcc.cluster`.
pub fn passkey_responses(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    // The fixed site: failing here is a bug in this harness.
    #[allow(clippy::expect_used)]
    let site = Site::new(&CONFIG, true, "mpcc.cluster").expect("the fuzz site is allowed");
    match selector % 6 {
        0 => {
            if let Ok(att) = passkeys::parse_attestation_object(rest) {
                passkey_auth_data(&att.auth_data);
            }
        }
        1 => passkey_auth_data(rest),
        2 => {
            let _ = passkeys::parse_client_data(rest);
        }
        3 => {
            if let Ok(key) = CoseKey::parse(rest) {
                passkey_key(&key);
            }
        }
        4 => {
            let Ok(response) = serde_json::from_slice(rest) else {
                return;
            };
            if let Ok(checked) = passkeys::check_registration(&site, &response) {
                assert!(checked.credential_id.len() <= passkeys::MAX_CREDENTIAL_ID);
                match CoseKey::parse(&checked.key_cbor) {
                    Ok(key) => passkey_key(&key),
                    Err(err) => panic!("a registered key does not parse again: {err}"),
                }
            }
        }
        _ => {
            let Ok(response) = serde_json::from_slice(rest) else {
                return;
            };
            if let Ok(a) = passkeys::check_assertion(&site, &response) {
                // What was signed is the authenticator data and a hash.
                assert!(a.signed.len() >= 37 + 32);
            }
        }
    }
}

/// authenticatorData: what parses keeps its fixed fields where §6.1 puts
/// them, and an attested key parses again from its own bytes.
fn passkey_auth_data(bytes: &[u8]) {
    let Ok(auth) = passkeys::parse_authenticator_data(bytes) else {
        return;
    };
    assert_eq!(auth.rp_id_hash[..], bytes[..32]);
    assert_eq!(auth.flags, bytes[32]);
    assert_eq!(auth.sign_count.to_be_bytes()[..], bytes[33..37]);
    if auth.flags & 0xc0 == 0 {
        assert_eq!(bytes.len(), 37, "bytes beyond what the flags announce");
    }
    if let Some(cred) = &auth.credential {
        assert!(!cred.id.is_empty() && cred.id.len() <= passkeys::MAX_CREDENTIAL_ID);
        match CoseKey::parse(&cred.key_cbor) {
            Ok(key) => assert_eq!(key, cred.key),
            Err(err) => panic!("an attested key does not parse from its own bytes: {err}"),
        }
        passkey_key(&cred.key);
    }
}

/// A systems filter: one that parses prints to canonical text that parses
/// back to the same filter and prints the same (when the print stays within
/// [`MAX_FILTER_LEN`]: normalising a MAC or lowercasing may lengthen it),
/// and compiles on every engine within [`MAX_BINDS`] bound values, the
/// statement holding no value's text; an error names a term of the input
/// (or none, for the whole) and says something.
pub fn systems_filter(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let filter = match Filter::parse(&text) {
        Ok(f) => f,
        Err(e) => {
            assert!(!e.message.is_empty());
            assert!(e.term.is_empty() || text.contains(&e.term), "{e:?}");
            return;
        }
    };
    let printed = filter.to_string();
    if printed.len() <= MAX_FILTER_LEN {
        let again = Filter::parse(&printed)
            .unwrap_or_else(|e| panic!("{printed:?}, printed from {text:?}, does not parse: {e}"));
        assert_eq!(again, filter, "{printed:?}");
        assert_eq!(again.to_string(), printed);
    }
    for engine in [Engine::Sqlite, Engine::Mysql, Engine::Postgres] {
        let mut sql = Sql::new(engine);
        filter.push_condition(&mut sql);
        let statement = sql.text();
        if engine == Engine::Sqlite {
            assert!(statement.matches('?').count() <= MAX_BINDS, "{text:?}");
        }
        // Values are bound, never pasted: the statement is ASCII, and its
        // only quotes are those of `ESCAPE '!'`.
        assert!(statement.is_ascii(), "{statement}");
        assert_eq!(
            statement.matches('\'').count(),
            2 * statement.matches("ESCAPE '!'").count(),
            "{statement}"
        );
    }
}

/// A key is of an algorithm we offer, and never takes an empty signature.
fn passkey_key(key: &CoseKey) {
    assert!(passkeys::ALGORITHMS.contains(&key.alg()));
    assert!(!key.verify(b"message", b""));
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::path::{Path, PathBuf};

    use super::*;

    fn fuzz_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz")
    }

    /// Every file of every target's corpus runs through its entry point; a
    /// missing or empty corpus fails, so corpora cannot silently vanish.
    #[test]
    fn replay_corpora() {
        let mut failures = Vec::new();
        for (name, entry) in TARGETS {
            let dir = fuzz_dir().join("corpus").join(name);
            let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
                Ok(entries) => entries
                    .map(|e| e.map(|e| e.path()))
                    .collect::<Result<_, _>>()
                    .unwrap_or_else(|err| panic!("reading {}: {err}", dir.display())),
                Err(err) => panic!("the corpus of {name} is missing: {}: {err}", dir.display()),
            };
            files.retain(|p| p.is_file());
            files.sort();
            assert!(
                !files.is_empty(),
                "the corpus of {name} is empty: {}",
                dir.display()
            );
            for file in files {
                let data = std::fs::read(&file)
                    .unwrap_or_else(|err| panic!("reading {}: {err}", file.display()));
                if catch_unwind(AssertUnwindSafe(|| entry(&data))).is_err() {
                    failures.push(file.display().to_string());
                }
            }
        }
        assert!(failures.is_empty(), "inputs that panic: {failures:#?}");
    }

    /// Every cargo-fuzz target that calls into this module is listed in
    /// [`TARGETS`], and every entry of [`TARGETS`] has a target. Targets of
    /// other crates share the fuzz crate; their own tests replay them.
    #[test]
    fn targets_match_fuzz_binaries() {
        let dir = fuzz_dir().join("fuzz_targets");
        let mut ours = BTreeSet::new();
        for entry in
            std::fs::read_dir(&dir).unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        {
            let path = entry
                .map(|e| e.path())
                .unwrap_or_else(|err| panic!("{err}"));
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".rs"))
            else {
                continue;
            };
            let source = std::fs::read_to_string(&path)
                .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            if source.contains("mprov_control::fuzz::") {
                assert!(
                    source.contains(&format!("mprov_control::fuzz::{name}(")),
                    "{} must call mprov_control::fuzz::{name}",
                    path.display()
                );
                ours.insert(name.to_owned());
            }
        }
        let listed: BTreeSet<String> = TARGETS.iter().map(|(n, _)| (*n).to_owned()).collect();
        assert_eq!(ours, listed);
    }

    #[test]
    fn entry_points_take_any_bytes() {
        let inputs: [&[u8]; 6] = [
            b"",
            b"\0",
            b"\xff\xfe",
            b"{}",
            b"[]",
            b"[null, null, null, {}]",
        ];
        for (_, entry) in TARGETS {
            for input in inputs {
                entry(input);
            }
        }
    }

    /// The seeds of `passkey_responses`, made with a P-256 key of ring as an
    /// authenticator makes them: one of each selector, the whole responses
    /// valid for the fuzz site, each run through the target;
    /// `UPDATE_CORPUS=1` writes them into the corpus as `seed-*`.
    #[test]
    fn passkey_responses_seeds() {
        use base64::Engine as _;
        use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
        use ciborium::Value;
        use ring::rand::SystemRandom;
        use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};
        use sha2::{Digest, Sha256};

        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let point = key.public_key().as_ref();
        let cbor = |v: &Value| {
            let mut out = Vec::new();
            ciborium::into_writer(v, &mut out).unwrap();
            out
        };
        let cose = cbor(&Value::Map(vec![
            (1.into(), 2.into()),
            (3.into(), (-7).into()),
            ((-1).into(), 1.into()),
            ((-2).into(), Value::Bytes(point[1..33].to_vec())),
            ((-3).into(), Value::Bytes(point[33..65].to_vec())),
        ]));
        let ed = cbor(&Value::Map(vec![
            (1.into(), 1.into()),
            (3.into(), (-8).into()),
            ((-1).into(), 6.into()),
            ((-2).into(), Value::Bytes(vec![5; 32])),
        ]));
        let id = [7u8; 16];
        let rp_hash = Sha256::digest(b"mpcc.cluster");
        let head = |flags: u8, count: u32| [&rp_hash[..], &[flags], &count.to_be_bytes()].concat();
        let attested = [&head(0x45, 0)[..], &[0; 16], &[0, 16], &id, &cose].concat();
        let asserted = head(0x05, 1);
        let att = cbor(&Value::Map(vec![
            ("fmt".into(), "none".into()),
            ("attStmt".into(), Value::Map(vec![])),
            ("authData".into(), Value::Bytes(attested.clone())),
        ]));
        let client = |kind: &str| {
            serde_json::json!({"type": kind, "challenge": B64.encode([1u8; 32]), "origin": "https://mpcc.cluster", "crossOrigin": false})
                .to_string()
        };
        let registration = serde_json::json!({
            "id": B64.encode(id),
            "type": "public-key",
            "response": {
                "clientDataJSON": B64.encode(client("webauthn.create")),
                "attestationObject": B64.encode(&att),
            },
        })
        .to_string();
        let get = client("webauthn.get");
        let signed = [&asserted[..], &Sha256::digest(get.as_bytes())].concat();
        let sig = key.sign(&rng, &signed).unwrap();
        let assertion = serde_json::json!({
            "id": B64.encode(id),
            "type": "public-key",
            "response": {
                "clientDataJSON": B64.encode(&get),
                "authenticatorData": B64.encode(&asserted),
                "signature": B64.encode(sig.as_ref()),
                "userHandle": B64.encode(passkeys::user_handle("root")),
            },
        })
        .to_string();
        let seeds: Vec<(&str, Vec<u8>)> = vec![
            ("seed-attestation-none", [&[0u8][..], &att].concat()),
            ("seed-auth-data-attested", [&[1u8][..], &attested].concat()),
            ("seed-auth-data-asserted", [&[1u8][..], &asserted].concat()),
            ("seed-client-data", [&[2u8][..], get.as_bytes()].concat()),
            ("seed-cose-es256", [&[3u8][..], &cose].concat()),
            ("seed-cose-ed25519", [&[3u8][..], &ed].concat()),
            (
                "seed-registration",
                [&[4u8][..], registration.as_bytes()].concat(),
            ),
            (
                "seed-assertion",
                [&[5u8][..], assertion.as_bytes()].concat(),
            ),
        ];
        let update = std::env::var_os("UPDATE_CORPUS").is_some();
        let dir = fuzz_dir().join("corpus/passkey_responses");
        for (name, data) in &seeds {
            passkey_responses(data);
            if update {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join(name), data).unwrap();
            }
        }
        // The whole responses reach the end of their checks.
        let site = Site::new(&CONFIG, true, "mpcc.cluster").unwrap();
        let reg = serde_json::from_str(&registration).unwrap();
        assert!(passkeys::check_registration(&site, &reg).is_ok());
        let a: passkeys::AuthenticationResponse = serde_json::from_str(&assertion).unwrap();
        let a = passkeys::check_assertion(&site, &a).unwrap();
        assert!(
            CoseKey::parse(&cose)
                .unwrap()
                .verify(&a.signed, &a.signature)
        );
    }

    /// The hand-written seeds of `backup_archive` (a real small archive with
    /// and without secrets, truncated, with a flipped byte, of a newer
    /// format, and the two wrapped forms), each run through the target;
    /// `UPDATE_CORPUS=1` writes them into the corpus as `seed-*`.
    #[test]
    fn backup_archive_seeds() {
        use crate::backup::archive::{self, Contents, Manifest, Secrets, Table};
        let contents = |with_secrets: bool| Contents {
            manifest: Manifest {
                format: archive::FORMAT.into(),
                format_version: archive::FORMAT_VERSION,
                mprov_version: "0.1.0".into(),
                engine: "sqlite".into(),
                schema_level: 12,
                revision: 7,
                created_at: "2026-01-01T00:00:00Z".into(),
                secret_key_id: archive::secret_key_id("k"),
                with_secrets,
                parts: Vec::new(),
            },
            tables: vec![
                Table {
                    table: "scripts".into(),
                    columns: vec!["id".into(), "slug".into(), "content".into()],
                    rows: vec![
                        vec![json!(1), json!("motd"), json!("#!/bin/sh\necho hi\n")],
                        vec![json!(2), json!("ldap"), json!(null)],
                    ],
                },
                Table {
                    table: "jobservers".into(),
                    columns: vec!["id".into(), "load_avg".into(), "enabled".into()],
                    rows: vec![vec![json!(1), json!(0.25), json!(true)]],
                },
                Table {
                    table: "group_members".into(),
                    columns: vec!["group_id".into(), "system_id".into()],
                    rows: vec![],
                },
            ],
            secrets: with_secrets.then(|| Secrets {
                secret_key: "k".into(),
                tls_files: vec![("ca.crt".into(), 0o644, b"-----BEGIN".to_vec())],
            }),
        };
        let with = archive::pack(contents(true)).unwrap();
        let without = archive::pack(contents(false)).unwrap();
        let mut flipped = without.clone();
        let zstd_at = without
            .windows(4)
            .position(|w| w == [0x28, 0xb5, 0x2f, 0xfd])
            .unwrap();
        flipped[zstd_at + 8] ^= 1;
        // Same length, so the tar stays well-formed and only the manifest's
        // version differs.
        let mut newer = without.clone();
        let needle = b"\"format_version\": 1";
        let at = newer
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap();
        newer[at + needle.len() - 1] = b'9';
        let table = br#"{"table":"t","columns":["id","name"],"rows":[[1,"a"],[2,null],[3,0.5]]}"#;
        let frame = zstd::bulk::compress(table, 3).unwrap();
        let mut seeds: Vec<(&str, Vec<u8>)> = vec![
            ("seed-archive", [&[0u8][..], &without].concat()),
            ("seed-archive-secrets", [&[0u8][..], &with].concat()),
            (
                "seed-truncated",
                [&[0u8][..], &with[..with.len() / 2]].concat(),
            ),
            ("seed-flipped", [&[0u8][..], &flipped].concat()),
            ("seed-newer-format", [&[0u8][..], &newer].concat()),
            ("seed-table-json", [&[1u8][..], table].concat()),
        ];
        let len = u16::try_from(table.len()).unwrap().to_le_bytes();
        seeds.push((
            "seed-table-zstd",
            [&[3u8 | 3 << 2][..], &len, &frame].concat(),
        ));
        let update = std::env::var_os("UPDATE_CORPUS").is_some();
        let dir = fuzz_dir().join("corpus/backup_archive");
        for (name, data) in &seeds {
            backup_archive(data);
            if update {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join(name), data).unwrap();
            }
        }
        // The seeds reach both sides: the good ones open, the bad ones not.
        assert!(archive::open(&seeds[0].1[1..]).is_ok());
        assert!(archive::open(&seeds[1].1[1..]).is_ok());
        for bad in &seeds[2..5] {
            assert!(archive::open(&bad.1[1..]).is_err(), "{}", bad.0);
        }
        assert!(archive::open(&one_table_archive(&frame, table.len(), 3)).is_ok());
        assert!(matches!(
            archive::open(&one_table_archive(&frame, table.len(), 2)),
            Err(archive::ArchiveError::Table { .. })
        ));
    }

    #[test]
    fn request_bodies() {
        request_body(br#"{"hostname": "c01", "nics": [{"mac": "52-54-00-AB-CD-01"}]}"#);
        request_body(br#"[{"slug": "prov", "subnet": "10.0.0.0", "netmask": 24}, 3]"#);
        request_body(br#"{"hostname": "c01", "hostname": "c02"}"#);
    }

    #[test]
    fn scalar_round_trips() {
        scalars(b"52:54:00:AB:cd:01\nC01.Cluster.\ncompute-2\n12\n+12\nab12.secret");
        scalars(b"sort=-hostname&limit=x&cursor=%00&hostname=c%2001");
    }

    #[test]
    fn config_params_layer() {
        config_params(b"a: {b: 1}\ndisable_scripts: [s2, s2, s9]\n");
        config_params(b"x: &a {y: 1}\nz: *a\n");
        config_params(b"- not a mapping\n");
    }

    #[test]
    fn forwarded_headers() {
        // Peer 10.1.2.3 (trusted), a client behind two proxies.
        forwarded(b"\x001.2.3.4, 10.0.0.8\nMPCC.cluster:8080");
        // A peer given on the third line.
        forwarded(b"\x80junk, 5.6.7.8\n[::1]:80\n10.9.9.9");
        let ip = |s: &str| s.parse::<IpAddr>().ok();
        assert_eq!(
            ip("10.1.2.3").map(|p| CONFIG.client_ip(p, Some("1.2.3.4, 10.0.0.8"))),
            ip("1.2.3.4")
        );
    }
}
