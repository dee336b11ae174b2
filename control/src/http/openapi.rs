//! The OpenAPI 3.1 document of the REST API, generated from the same kind
//! descriptors the handlers use, so it cannot describe an API we do not serve.
//! A snapshot lives in the tests, and the tests check live responses against it.

use std::sync::OnceLock;

use mprov_api::boot::BootPhase;
use serde_json::{Map, Value, json};

use crate::db::kinds::{self, Access, KINDS, Kind, Ty};

/// `GET /api/v1/openapi.json`.
pub async fn serve() -> axum::Json<&'static Value> {
    axum::Json(document())
}

/// The document, built once.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(build)
}

fn nullable(schema: Value, null: bool) -> Value {
    // `{}` (any JSON) already takes null.
    if !null || schema.as_object().is_some_and(|o| o.is_empty()) {
        return schema;
    }
    match schema {
        Value::Object(mut o) => match o.get("type").cloned() {
            Some(Value::String(t)) => {
                o.insert("type".into(), json!([t, "null"]));
                if let Some(Value::Array(e)) = o.get_mut("enum") {
                    e.push(Value::Null);
                }
                Value::Object(o)
            }
            _ => json!({"oneOf": [Value::Object(o), {"type": "null"}]}),
        },
        other => other,
    }
}

/// The schema of a field's value; `write` for request bodies.
fn ty_schema(ty: Ty, write: bool) -> Value {
    match ty {
        Ty::Bool => json!({"type": "boolean"}),
        Ty::Enum(values) => json!({"type": "string", "enum": values}),
        Ty::Float => json!({"type": "number"}),
        Ty::Hostname => json!({"type": "string", "maxLength": 253}),
        Ty::Int { min, max } => {
            let mut o = Map::new();
            o.insert("type".into(), json!("integer"));
            if min != i64::MIN {
                o.insert("minimum".into(), json!(min));
            }
            if max != i64::MAX {
                o.insert("maximum".into(), json!(max));
            }
            Value::Object(o)
        }
        Ty::Ipv4 => json!({"type": "string", "format": "ipv4"}),
        Ty::Ipv6 => json!({"type": "string", "format": "ipv6"}),
        Ty::Json => json!({}),
        Ty::Mac => {
            if write {
                json!({"type": "string"})
            } else {
                json!({"type": "string", "pattern": "^[0-9a-f]{2}(:[0-9a-f]{2}){5}$"})
            }
        }
        Ty::Password | Ty::Secret => json!({"type": "string"}),
        Ty::Ref(_) => {
            if write {
                json!({"oneOf": [{"type": "integer"}, {"type": "string"}]})
            } else {
                json!({"type": "integer"})
            }
        }
        Ty::Sha256 => {
            json!({"type": "string", "pattern": "^([0-9a-fA-F]{64})?$", "maxLength": 64})
        }
        Ty::Slug => json!({"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]*$", "maxLength": 255}),
        Ty::StrList => json!({"type": "array", "items": {"type": "string"}}),
        Ty::Text { max } => json!({"type": "string", "maxLength": max}),
        Ty::Timestamp => json!({"type": "string", "format": "date-time"}),
        Ty::Yaml => json!({"type": "string", "description": "YAML mapping"}),
    }
}

fn described(mut schema: Value, doc: &str) -> Value {
    if let Value::Object(o) = &mut schema
        && !doc.is_empty()
    {
        o.insert("description".into(), json!(doc));
    }
    schema
}

fn read_schema(kind: &Kind) -> Value {
    let mut props = Map::new();
    props.insert("id".into(), json!({"type": "integer"}));
    for f in kind.fields {
        match f.ty {
            Ty::Password => {}
            Ty::Secret => {
                props.insert(
                    format!("{}_set", f.name),
                    json!({"type": "boolean", "description": format!("Whether {} is set (the value is never returned).", f.name)}),
                );
            }
            ty => {
                props.insert(
                    f.name.into(),
                    described(nullable(ty_schema(ty, false), f.nullable), f.doc),
                );
            }
        }
    }
    for m in kind.m2m {
        props.insert(
            m.name.into(),
            json!({"type": "array", "items": {"type": "integer"}, "description": m.doc}),
        );
    }
    for c in kind.children {
        let schema = kinds::kind(c.kind).map(|k| k.schema).unwrap_or_default();
        props.insert(
            c.name.into(),
            json!({"type": "array", "items": {"$ref": format!("#/components/schemas/{schema}")}}),
        );
    }
    for r in kind.reported {
        let mut item = Map::new();
        item.insert("id".into(), json!({"type": "integer"}));
        for f in r.fields {
            item.insert(
                f.name.into(),
                described(nullable(ty_schema(f.ty, false), f.nullable), f.doc),
            );
        }
        let required: Vec<String> = item.keys().cloned().collect();
        props.insert(
            r.name.into(),
            json!({"type": "array", "readOnly": true, "description": r.doc, "items": {"type": "object", "properties": item, "required": required, "additionalProperties": false}}),
        );
    }
    if kind.timestamps {
        for t in ["created_at", "updated_at"] {
            props.insert(t.into(), json!({"type": "string", "format": "date-time"}));
        }
    }
    let required: Vec<String> = props.keys().cloned().collect();
    if let Some(issued) = kind.issues {
        props.insert(
            issued.field().into(),
            json!({"type": "string", "description": issued.doc()}),
        );
    }
    json!({"type": "object", "description": kind.doc, "properties": props, "required": required, "additionalProperties": false})
}

/// The body schema of a create (`required` true), an update, or a nested child
/// (`skip` names the implied parent field).
fn write_schema(kind: &Kind, required: bool, skip: Option<&str>) -> Value {
    let mut props = Map::new();
    let mut req = Vec::new();
    for f in kind.fields {
        if f.access == Access::ReadOnly || Some(f.name) == skip {
            continue;
        }
        props.insert(
            f.name.into(),
            described(nullable(ty_schema(f.ty, true), f.nullable), f.doc),
        );
        if required && f.required() {
            req.push(f.name);
        }
    }
    for m in kind.m2m {
        props.insert(
            m.name.into(),
            json!({"type": "array", "items": {"oneOf": [{"type": "integer"}, {"type": "string"}]}, "description": m.doc}),
        );
    }
    if required && skip.is_none() {
        for c in kind.children {
            let schema = kinds::kind(c.kind).map(|k| k.schema).unwrap_or_default();
            props.insert(c.name.into(), json!({"type": "array", "items": {"$ref": format!("#/components/schemas/{schema}Nested")}}));
        }
    }
    let mut o = json!({"type": "object", "properties": props, "additionalProperties": false});
    if !req.is_empty() {
        o["required"] = json!(req);
    }
    o
}

fn error_responses(codes: &[&str]) -> Map<String, Value> {
    let mut m = Map::new();
    for c in codes {
        m.insert(
            (*c).into(),
            json!({"description": match *c {
                "400" => "Invalid request: the message names the field.",
                "401" => "Missing or wrong credentials.",
                "403" => "Not allowed for this account.",
                "404" => "No such row.",
                "409" => "Conflicts with existing rows.",
                "413" => "Body too large.",
                "415" => "The body is not sent as `Content-Type: application/json`.",
                "426" => "The client sent another mProv-Version (or none).",
                "429" => "Too many wrong passwords from this address for this user, or too many password checks waiting; try again after `Retry-After` seconds.",
                "500" => "Our fault; the control service's log has the cause.",
                "503" => "The database is not answering (or, for enrollment, the signing helper is down); try again after `Retry-After` seconds.",
                _ => "Error.",
            }, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
        );
    }
    m
}

fn ok(status: &str, description: &str, schema: Value) -> Map<String, Value> {
    let mut m = error_responses(&["400", "401", "426"]);
    m.insert(
        status.into(),
        json!({"description": description, "content": {"application/json": {"schema": schema}}}),
    );
    m
}

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn body(name: &str) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": schema_ref(name)}}})
}

fn key_param(kind: &Kind) -> Value {
    let how = match kind.slug {
        Some(s) => format!("The row's id, or its {s}."),
        None => "The row's id.".into(),
    };
    json!({"name": "key", "in": "path", "required": true, "schema": {"type": "string"}, "description": how})
}

fn list_params(kind: &Kind) -> Vec<Value> {
    let mut p = vec![
        json!({"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": crate::db::crud::MAX_LIMIT}, "description": "Page size (default 100)."}),
        json!({"name": "cursor", "in": "query", "schema": {"type": "string"}, "description": "The `next` of the previous page."}),
        json!({"name": "sort", "in": "query", "schema": {"type": "string"}, "description": "A field to sort by; prefix `-` for descending."}),
        json!({"name": "q", "in": "query", "schema": {"type": "string"}, "description": "Search: rows whose slug or short text fields contain this, ignoring case."}),
    ];
    if kind.name == "systems" {
        p.push(json!({"name": "filter", "in": "query", "schema": {"type": "string", "maxLength": crate::db::crud::filter::MAX_FILTER_LEN}, "description": FILTER_DOC}));
    }
    for f in kind.fields {
        if matches!(
            f.ty,
            Ty::Password | Ty::Secret | Ty::Json | Ty::StrList | Ty::Yaml
        ) {
            continue;
        }
        p.push(json!({"name": f.name, "in": "query", "schema": {"type": "string"}, "description": format!("Only rows whose {} equals this.", f.name)}));
    }
    for m in kind.m2m {
        p.push(json!({"name": m.name, "in": "query", "schema": {"type": "string"}, "description": format!("Only rows linked to this {} (id or slug).", m.kind)}));
    }
    p
}

fn boot_config_schema() -> Value {
    let ip = json!({"type": "string"});
    let v4 = json!({"type": "string", "format": "ipv4"});
    let v4_or_null = json!({"type": ["string", "null"], "format": "ipv4"});
    json!({"type": "object", "additionalProperties": false,
    "required": ["revision", "networks", "hosts", "upstream_resolvers", "boot"],
    "properties": {
        "revision": {"type": "integer"},
        "networks": {"type": "array", "items": {"type": "object", "additionalProperties": false,
            "required": ["slug", "subnet", "prefix", "gateway", "nameservers", "domain", "pool", "dhcp", "dns", "netboot", "mtu"],
            "properties": {
                "slug": {"type": "string"}, "subnet": v4, "prefix": {"type": "integer", "minimum": 0, "maximum": 32},
                "gateway": v4_or_null, "nameservers": {"type": "array", "items": v4},
                "domain": {"type": "string"},
                "pool": {"oneOf": [{"type": "null"}, {"type": "array", "items": v4, "minItems": 2, "maxItems": 2}]},
                "dhcp": {"type": "boolean"}, "dns": {"type": "boolean"}, "netboot": {"type": "boolean"},
                "mtu": {"type": ["integer", "null"]}
            }}},
        "hosts": {"type": "array", "items": {"type": "object", "additionalProperties": false,
            "required": ["mac", "ipv4", "ipv6", "hostname", "aliases", "network", "netboot", "bootable"],
            "properties": {
                "mac": {"type": ["string", "null"]}, "ipv4": v4_or_null, "ipv6": {"type": ["string", "null"]},
                "hostname": {"type": "string"}, "aliases": {"type": "array", "items": {"type": "string"}},
                "network": {"type": ["string", "null"]}, "netboot": {"type": "boolean"}, "bootable": {"type": "boolean"}
            }}},
        "upstream_resolvers": {"type": "array", "items": ip},
        "boot": {"type": "object", "additionalProperties": false, "properties": {"ipxe_script_url": {"type": ["string", "null"]}}}
    }})
}

fn build() -> Value {
    let mut schemas = Map::new();
    let mut paths = Map::new();
    schemas.insert(
        "Error".into(),
        json!({"type": "object", "properties": {
            "error": {"type": "string"}, "message": {"type": "string"}, "field": {"type": "string"}
        }, "required": ["error", "message"], "additionalProperties": false}),
    );
    schemas.insert(
        "BulkCreated".into(),
        json!({"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "integer"}}}, "required": ["ids"], "additionalProperties": false}),
    );
    for kind in KINDS {
        let s = kind.schema;
        schemas.insert(s.into(), read_schema(kind));
        schemas.insert(format!("{s}Create"), write_schema(kind, true, None));
        schemas.insert(format!("{s}Update"), write_schema(kind, false, None));
        schemas.insert(
            format!("{s}List"),
            json!({"type": "object", "properties": {
                "items": {"type": "array", "items": schema_ref(s)},
                "total": {"type": "integer", "minimum": 0},
                "next": {"type": ["string", "null"]}
            }, "required": ["items", "total", "next"], "additionalProperties": false}),
        );
        for parent in KINDS {
            for c in parent.children.iter().filter(|c| c.kind == kind.name) {
                schemas.insert(
                    format!("{s}Nested"),
                    write_schema(kind, true, Some(c.parent_field)),
                );
            }
        }
        let tag = kind.name;
        let mut create = ok("201", "Created.", schema_ref(s));
        create.extend(error_responses(&["403", "409", "413", "415"]));
        paths.insert(
            format!("/api/v1/{}/", kind.name),
            json!({
                "get": {"tags": [tag], "summary": format!("List {}", kind.name), "parameters": list_params(kind), "responses": ok("200", "One page.", schema_ref(&format!("{s}List")))},
                "post": {"tags": [tag], "summary": format!("Create one of {}", kind.name), "requestBody": body(&format!("{s}Create")), "responses": create},
            }),
        );
        let mut bulk = ok(
            "201",
            "All created, in one transaction.",
            schema_ref("BulkCreated"),
        );
        bulk.extend(error_responses(&["403", "409", "413", "415"]));
        paths.insert(
            format!("/api/v1/{}/bulk", kind.name),
            json!({"post": {"tags": [tag], "summary": format!("Create many {} in one transaction: all or none", kind.name),
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "array", "items": schema_ref(&format!("{s}Create"))}}}},
                "responses": bulk}}),
        );
        let mut one = ok("200", "The row.", schema_ref(s));
        one.extend(error_responses(&["404"]));
        let mut upd = one.clone();
        upd.extend(error_responses(&["403", "409", "413", "415"]));
        let mut del = error_responses(&["401", "403", "404", "426"]);
        del.insert("204".into(), json!({"description": "Deleted."}));
        paths.insert(
            format!("/api/v1/{}/{{key}}", kind.name),
            json!({
                "parameters": [key_param(kind)],
                "get": {"tags": [tag], "summary": "Get one", "responses": one},
                "patch": {"tags": [tag], "summary": "Change the fields given", "requestBody": body(&format!("{s}Update")), "responses": upd},
                "delete": {"tags": [tag], "summary": "Delete", "responses": del},
            }),
        );
    }
    schemas.insert(
        "Revision".into(),
        json!({"type": "object", "properties": {"revision": {"type": "integer"}}, "required": ["revision"], "additionalProperties": false}),
    );
    schemas.insert(
        "EffectiveConfig".into(),
        json!({"type": "object", "properties": {
            "kernel_cmdline": {"type": "string"},
            "initial_mods": {"type": "array", "items": {"type": "string"}},
            "tmpfs_root_size": {"type": "integer"},
            "prov_interface": {"type": "string"},
            "config_params": {"type": "object"},
            "disable_scripts": {"type": "array", "items": {"type": "string"}},
            "scripts": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}, "slug": {"type": "string"}, "layer": {"type": "string", "description": "The first layer that listed it: distro, group:<slug>, image or system."}}, "required": ["id", "slug", "layer"], "additionalProperties": false}},
            "layers": {"type": "array", "items": {"type": "string"}}
        }, "required": ["kernel_cmdline", "initial_mods", "tmpfs_root_size", "prov_interface", "config_params", "disable_scripts", "scripts", "layers"], "additionalProperties": false}),
    );
    schemas.insert("BootConfig".into(), boot_config_schema());
    let mut boot = ok(
        "200",
        "The snapshot, read at the revision it carries.",
        schema_ref("BootConfig"),
    );
    boot.insert(
        "204".into(),
        json!({"description": "No change within `wait` seconds."}),
    );
    paths.insert(
        "/api/v1/bootconfig".into(),
        json!({"get": {"summary": "The boot config snapshot job servers follow (long-poll)", "parameters": [
            {"name": "after", "in": "query", "schema": {"type": "integer"}, "description": "Answer once the revision is past this one."},
            {"name": "wait", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": 60}, "description": "Seconds to wait for a change (default 0)."}
        ], "responses": boot}}),
    );
    paths.insert(
        "/api/v1/revision".into(),
        json!({"get": {"summary": "The inventory revision, bumped by every write", "responses": ok("200", "The revision.", schema_ref("Revision"))}}),
    );
    let mut cfg = ok(
        "200",
        "The merged configuration.",
        schema_ref("EffectiveConfig"),
    );
    cfg.extend(error_responses(&["404", "409"]));
    paths.insert(
        "/api/v1/systems/{key}/config".into(),
        json!({"parameters": [key_param(&KINDS[0])], "get": {"tags": ["systems"], "summary": "The effective config: distro → groups → image → system", "responses": cfg}}),
    );
    paths.insert(
        "/api/v1/".into(),
        json!({"get": {"summary": "The API index", "responses": ok("200", "Kinds and paths.", json!({"type": "object"}))}}),
    );
    paths.insert(
        "/api/v1/openapi.json".into(),
        json!({"get": {"summary": "This document (no authentication)", "security": [], "responses": {"200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}}}}}),
    );
    enrollment_paths(&mut paths, &mut schemas);
    discovery_paths(&mut paths, &mut schemas);
    bulk_paths(&mut paths);
    answered_everywhere(&mut paths);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "mProv control service",
            "version": mprov_api::api_version(),
            "description": "The inventory and boot API of mProv. Every authenticated request sends `mProv-Version: <major.minor>`; another version, or none, gets 426."
        },
        "security": [{"apiKey": []}, {"basic": []}, {"clientCertificate": []}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "apiKey": {"type": "apiKey", "in": "header", "name": "Authorization", "description": "`Api-Key <key>`"},
                "basic": {"type": "http", "scheme": "basic"},
                "clientCertificate": {"type": "mutualTLS", "description": "A certificate from enrollment (HTTPS only)"}
            }
        }
    })
}

/// The statuses any operation can answer, whatever its handler: 500 (a
/// bug or a failed query, the cause in the log), 503 while the database is
/// down (every path that reads it: [`super::outage`]), and 429 from the
/// password throttle on every operation that takes HTTP Basic.
fn answered_everywhere(paths: &mut Map<String, Value>) {
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in item.iter_mut() {
            if method == "parameters" {
                continue;
            }
            let basic = match op.get("security") {
                None => true,
                Some(s) => s
                    .as_array()
                    .is_some_and(|s| s.iter().any(|r| r.get("basic").is_some())),
            };
            let mut extra = vec!["500"];
            if !super::outage::NO_DATABASE.contains(&path.as_str()) {
                extra.push("503");
            }
            if basic {
                extra.push("429");
            }
            let responses = op["responses"].as_object_mut().expect("responses");
            for (code, entry) in error_responses(&extra) {
                responses.entry(code).or_insert(entry);
            }
        }
    }
}

/// What axum's JSON reader answers for a body it cannot take, before the
/// handler runs: plain text, not the API's error body. 400 is shared with
/// the handler's own refusals, which are JSON.
fn json_reader_refusals(responses: &mut Map<String, Value>) {
    let text = json!({"text/plain": {"schema": {"type": "string"}}});
    let mut invalid = error_responses(&["400"]);
    invalid["400"]["description"] = json!(
        "Invalid request: JSON that does not parse (plain text, from the JSON reader), or a value the handler refuses (the API's error body)."
    );
    invalid["400"]["content"]["text/plain"] = json!({"schema": {"type": "string"}});
    responses.extend(invalid);
    for (code, description) in [
        ("413", "Body too large."),
        (
            "415",
            "The body is not sent as `Content-Type: application/json`.",
        ),
        (
            "422",
            "The JSON does not have the request's shape: a field missing, unknown or of the wrong type.",
        ),
    ] {
        responses.insert(
            code.into(),
            json!({"description": description, "content": text.clone()}),
        );
    }
}

/// The CA certificate, `/ipxe/`, enrollment, tokens and credentials.
fn enrollment_paths(paths: &mut Map<String, Value>, schemas: &mut Map<String, Value>) {
    let text = |desc: &str, mime: &str| json!({"200": {"description": desc, "content": {mime: {"schema": {"type": "string"}}}}});
    schemas.insert(
        "Enrolled".into(),
        json!({"type": "object", "properties": {
            "certificate": {"type": "string", "description": "The agent's certificate, PEM."},
            "ca": {"type": "string", "description": "The CA certificate, PEM."},
            "not_after": {"type": "string", "description": "When the certificate ends (RFC 3339)."}
        }, "required": ["certificate", "ca", "not_after"], "additionalProperties": false}),
    );
    let enrolled = |extra: &[&str]| {
        let mut r = ok("200", "The new certificate.", schema_ref("Enrolled"));
        r.extend(error_responses(extra));
        json_reader_refusals(&mut r);
        r
    };
    let request = |props: Value, required: &[&str]| {
        json!({"required": true, "content": {"application/json": {"schema": {
            "type": "object", "properties": props, "required": required, "additionalProperties": false
        }}}})
    };
    paths.insert(
        "/ca.crt".into(),
        json!({"get": {"summary": "This install's CA certificate (no authentication)", "security": [],
            "responses": text("PEM", "application/x-pem-file")}}),
    );
    let mut ipxe = error_responses(&["400"]);
    ipxe.insert(
        "200".into(),
        text("An iPXE script", "text/plain")["200"].clone(),
    );
    ipxe["400"]["description"] = json!("No `mac`, or one that is not a MAC address.");
    ipxe.insert(
        "429".into(),
        json!({"description": "Beyond the rate limit (per MAC or in total): a retry script, with `Retry-After`.", "content": {"text/plain": {"schema": {"type": "string"}}}}),
    );
    paths.insert(
        "/ipxe/".into(),
        json!({"get": {"summary": "The iPXE script of the node with this MAC: boot (with a one-time enrollment nonce), discovery or local boot, once a job server on the node's network reported leasing the request's address to that MAC; else a retry script, the same for every MAC; 429 with a retry script beyond the rate limit (no authentication)",
            "security": [],
            "parameters": [{"name": "mac", "in": "query", "required": true, "schema": {"type": "string"}}],
            "responses": ipxe}}),
    );
    paths.insert(
        "/enroll/jobserver/".into(),
        json!({"post": {"summary": "Enroll a job server with its CSR and a one-time token, or without a token on an admin's API key (the seed's apikey: 403 for a key or account that is no admin's, 401 with neither). 409 when the name holds a valid certificate and the token is not a replace token",
            "security": [{}, {"apiKey": []}, {"basic": []}],
            "requestBody": request(json!({"token": {"type": "string", "description": "The one-time token; left out or empty: the request's Authorization must be an admin's."}, "name": {"type": "string"}, "csr": {"type": "string"}}), &["name", "csr"]),
            "responses": enrolled(&["400", "401", "403", "409", "426"])}}),
    );
    paths.insert(
        "/enroll/node/".into(),
        json!({"post": {"summary": "Enroll a node with the nonce from its kernel command line and its CSR", "security": [],
            "requestBody": request(json!({"nonce": {"type": "string"}, "csr": {"type": "string"}}), &["nonce", "csr"]),
            "responses": enrolled(&["400", "401"])}}),
    );
    paths.insert(
        "/enroll/renew/".into(),
        json!({"post": {"summary": "A new certificate for the agent whose certificate this request presents; that one is revoked",
            "security": [{"clientCertificate": []}],
            "requestBody": request(json!({"csr": {"type": "string"}}), &["csr"]),
            "responses": enrolled(&["400", "401", "403", "426"])}}),
    );
    let mut token = ok(
        "200",
        "The token, shown once.",
        json!({"type": "object", "properties": {
        "token": {"type": "string"}, "expires_at": {"type": "string"}
    }, "required": ["token", "expires_at"], "additionalProperties": false}),
    );
    token.extend(error_responses(&["400", "401", "403", "426"]));
    json_reader_refusals(&mut token);
    paths.insert(
        "/api/v1/enroll-tokens/".into(),
        json!({"post": {"summary": "A one-time job-server enrollment token (admin)",
            "requestBody": request(json!({"name": {"type": "string"}, "hours": {"type": "integer", "minimum": 1, "maximum": 720},
                "purpose": {"type": "string", "enum": ["new", "replace"], "description": "`new` (default): a job server with no valid certificate; `replace`: a new certificate for a live job server, whose old one is revoked."}}), &[]),
            "responses": token}}),
    );
    schemas.insert(
        "Credential".into(),
        json!({"type": "object", "properties": {
            "id": {"type": "integer"}, "serial": {"type": "string"},
            "kind": {"type": "string", "enum": ["node", "jobserver"]}, "identity": {"type": "string"},
            "not_after": {"type": "string"}, "created_at": {"type": "string"},
            "revoked_at": {"type": ["string", "null"]}, "revoke_reason": {"type": ["string", "null"]}
        }, "required": ["id", "serial", "kind", "identity", "not_after", "created_at", "revoked_at", "revoke_reason"], "additionalProperties": false}),
    );
    let mut list = ok(
        "200",
        "Newest first.",
        json!({"type": "object", "properties": {
        "items": {"type": "array", "items": schema_ref("Credential")}, "total": {"type": "integer"}
    }, "required": ["items", "total"], "additionalProperties": false}),
    );
    list.extend(error_responses(&["400", "401", "403", "426"]));
    paths.insert(
        "/api/v1/credentials/".into(),
        json!({"get": {"summary": "Certificates issued to agents",
            "parameters": [
                {"name": "identity", "in": "query", "schema": {"type": "string"}},
                {"name": "kind", "in": "query", "schema": {"type": "string"}}
            ],
            "responses": list}}),
    );
    let mut hosted = ok("200", "The image with its hosts.", schema_ref("Image"));
    hosted.extend(error_responses(&["401", "403", "404", "426"]));
    paths.insert(
        "/api/v1/images/{key}/hosts/{jobserver}".into(),
        json!({"parameters": [
                {"name": "key", "in": "path", "required": true, "schema": {"type": "string"}},
                {"name": "jobserver", "in": "path", "required": true, "schema": {"type": "string"}}
            ],
            "put": {"tags": ["images"], "summary": "The job server holds the image's current version (a job server may say so of itself)", "responses": hosted.clone()},
            "delete": {"tags": ["images"], "summary": "The job server no longer holds it", "responses": hosted}}),
    );
    let mut revoked = ok("200", "Revoked.", json!({"type": "object"}));
    revoked.extend(error_responses(&["400", "401", "403", "404", "426"]));
    paths.insert(
        "/api/v1/credentials/{id}/revoke".into(),
        json!({"parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "integer"}}],
            "post": {"summary": "Revoke a certificate at once (admin)", "responses": revoked}}),
    );
    boot_paths(paths, schemas);
    jobs_paths(paths, schemas);
    scripts_paths(paths, schemas);
}

/// The script-runner's calls: a plan, a script's content, a run's report,
/// and asking a node to run its scripts again.
fn scripts_paths(paths: &mut Map<String, Value>, schemas: &mut Map<String, Value>) {
    use mprov_api::scripts::{
        CONTENT_ROUTE, DEFAULT_TIMEOUT_SECONDS, MAX_OUTPUT_TAIL, PLAN_PATH, RESULTS_PATH, RUN_ROUTE,
    };
    let mode = json!({"type": "string", "enum": ["image-gen", "post-boot"]});
    schemas.insert(
        "PlannedScript".into(),
        json!({"type": "object", "properties": {
            "slug": {"type": "string"},
            "version": {"type": "integer", "description": "Its content version."},
            "sha256": {"type": "string", "description": "The hex SHA-256 of its content, which the runner checks before running anything."},
            "depends_on": {"type": "array", "items": {"type": "string"}, "description": "Slugs of the scripts that must run before it."},
            "timeout_seconds": {"type": ["integer", "null"], "minimum": 1, "description": format!("Its timeout; null: {DEFAULT_TIMEOUT_SECONDS} s.")},
            "layer": {"type": "string", "description": "The layer that listed it: distro, group:<slug>, image or system."}
        }, "required": ["slug", "version", "sha256", "depends_on", "timeout_seconds", "layer"], "additionalProperties": false}),
    );
    schemas.insert(
        "ScriptPlan".into(),
        json!({"type": "object", "properties": {
            "mode": mode.clone(),
            "host": {"type": ["string", "null"], "description": "The node's host name (post-boot)."},
            "image": {"type": ["string", "null"], "description": "The image's slug."},
            "groups": {"type": "array", "items": {"type": "string"}, "description": "The node's groups, in layer order (post-boot)."},
            "params": {"type": "object", "description": "The effective config params of the node's (or the image's) own layers, without secrets: what each script gets on its standard input."},
            "scripts": {"type": "array", "items": schema_ref("PlannedScript"), "description": "The scripts of this mode from every layer, in layer order, without the disabled ones. Unordered by dependencies: the runner orders them."},
            "disabled": {"type": "array", "items": {"type": "string"}, "description": "disable_scripts of every layer, combined."},
            "run_request": {"type": "integer", "description": "Bumped by each run-scripts request."}
        }, "required": ["mode", "host", "image", "groups", "params", "scripts", "disabled", "run_request"], "additionalProperties": false}),
    );
    schemas.insert(
        "ScriptResult".into(),
        json!({"type": "object", "properties": {
            "slug": {"type": "string", "minLength": 1},
            "status": {"type": "string", "enum": ["success", "failed", "timed_out", "not_run"]},
            "exit_code": {"type": ["integer", "null"]},
            "duration_ms": {"type": "integer", "minimum": 0},
            "output_tail": {"type": "string", "maxLength": MAX_OUTPUT_TAIL, "description": format!("The last {MAX_OUTPUT_TAIL} bytes (at most) of its output.")}
        }, "required": ["slug", "status"], "additionalProperties": false}),
    );
    schemas.insert(
        "RunReport".into(),
        json!({"type": "object", "properties": {
            "mode": mode,
            "image": {"type": ["string", "null"], "description": "The image (image-gen only)."},
            "run_request": {"type": "integer"},
            "outcome": {"type": "string", "enum": ["success", "failed", "refused"]},
            "detail": {"type": "string", "maxLength": MAX_OUTPUT_TAIL, "description": "Why it failed or was refused, naming the scripts."},
            "results": {"type": "array", "items": schema_ref("ScriptResult"), "maxItems": crate::scripts::MAX_RESULTS}
        }, "required": ["mode", "outcome", "results"], "additionalProperties": false}),
    );
    let mut plan = ok("200", "The plan.", schema_ref("ScriptPlan"));
    plan.extend(error_responses(&["400", "401", "403", "404", "409", "426"]));
    paths.insert(
        PLAN_PATH.into(),
        json!({"get": {"summary": "What the script-runner runs: with a node's certificate, its own system's post-boot plan (it names no system); with a job server's, an image's image-gen plan. Administrators and readers name the node (system) or the image",
            "tags": ["scripts"],
            "security": [{"clientCertificate": []}, {"apiKey": []}, {"basic": []}],
            "parameters": [
                {"name": "mode", "in": "query", "required": true, "schema": {"type": "string", "enum": ["image-gen", "post-boot"]}},
                {"name": "image", "in": "query", "schema": {"type": "string"}, "description": "The image (image-gen)."},
                {"name": "system", "in": "query", "schema": {"type": "string"}, "description": "The node, for administrators and readers (post-boot); a node's certificate names none."}
            ],
            "responses": plan}}),
    );
    let mut content = error_responses(&["401", "403", "404", "426"]);
    content.insert(
        "200".into(),
        json!({"description": "The script, as stored.", "content": {"application/octet-stream": {"schema": {"type": "string"}}}}),
    );
    paths.insert(
        CONTENT_ROUTE.into(),
        json!({"parameters": [{"name": "slug", "in": "path", "required": true, "schema": {"type": "string"}}],
            "get": {"summary": "A script's content: a node's certificate only for the scripts of its own post-boot plan (403 for any other, known or not); job servers, administrators and readers any",
                "tags": ["scripts"],
                "security": [{"clientCertificate": []}, {"apiKey": []}, {"basic": []}],
                "responses": content}}),
    );
    let mut recorded = ok(
        "201",
        "Recorded: how many timeline events (post-boot) or scripts (image-gen).",
        json!({"type": "object", "properties": {"recorded": {"type": "integer"}}, "required": ["recorded"], "additionalProperties": false}),
    );
    recorded.extend(error_responses(&["401", "403", "404", "415", "426", "429"]));
    recorded["400"]["description"] = json!(
        "Not a run report (malformed JSON, a field missing, unknown or of the wrong type), or one out of bounds; the message says which."
    );
    recorded.insert(
        "413".into(),
        json!({"description": format!("Body over {} bytes.", crate::scripts::MAX_REPORT_BYTES), "content": {"text/plain": {"schema": {"type": "string"}}}}),
    );
    paths.insert(
        RESULTS_PATH.into(),
        json!({"post": {"summary": "A script run's report: from a node's certificate, its own post-boot run, written on its own boot timeline (a script event per script, and failed when the run failed or was refused); from a job server's, an image-gen run, stored. A report names no node",
            "tags": ["scripts"],
            "security": [{"clientCertificate": []}],
            "requestBody": body("RunReport"),
            "responses": recorded}}),
    );
    let mut rerun = ok(
        "200",
        "The system's new run request.",
        json!({"type": "object", "properties": {
            "system": {"type": "string", "description": "Its host name."},
            "run_request": {"type": "integer"}
        }, "required": ["system", "run_request"], "additionalProperties": false}),
    );
    rerun.extend(error_responses(&["401", "403", "404", "426"]));
    paths.insert(
        RUN_ROUTE.into(),
        json!({"parameters": [{"name": "key", "in": "path", "required": true, "schema": {"type": "string"}, "description": "The system's id or host name."}],
            "post": {"summary": "Run the node's post-boot scripts again, without a reboot (administrators): bumps its run_request, which its agent sees in its plan",
                "tags": ["systems"],
                "responses": rerun}}),
    );
}

/// Discovery: a node's NADS report (the discovery nonce is its
/// credential), and the parked nodes an admin lists, assigns and dismisses.
fn discovery_paths(paths: &mut Map<String, Value>, schemas: &mut Map<String, Value>) {
    use mprov_api::nads::{NONCE_HEADER, REPORT_PATH};
    let text_or_null = json!({"type": ["string", "null"]});
    schemas.insert(
        "NadsNeighbour".into(),
        json!({"type": "object", "description": "What one LLDP frame said about the switch port at the other end.", "properties": {
            "chassis_id": {"type": "string"},
            "chassis_id_subtype": {"type": "string"},
            "port_id": {"type": "string"},
            "port_id_subtype": {"type": "string"},
            "system_name": text_or_null.clone(),
            "port_description": text_or_null.clone(),
            "management_addresses": {"type": "array", "items": {"type": "string"}},
            "vlan": {"type": ["integer", "null"], "minimum": 0, "maximum": 65535}
        }, "required": ["chassis_id", "chassis_id_subtype", "port_id", "port_id_subtype", "management_addresses"]}),
    );
    schemas.insert(
        "NadsReport".into(),
        json!({"type": "object", "description": "What a node in discovery heard on each link that was up, and its DMI facts.", "properties": {
            "boot_mac": {"type": "string", "description": "The MAC it booted from: the one its discovery nonce is bound to, and the only one a report binds."},
            "links": {"type": "array", "items": {"type": "object", "properties": {
                "interface": {"type": "string"},
                "mac": {"type": "string"},
                "neighbour": {"oneOf": [schema_ref("NadsNeighbour"), {"type": "null"}], "description": "null: nothing heard in the window."}
            }, "required": ["interface", "mac", "neighbour"]}},
            "hardware": {"type": "object", "properties": {
                "vendor": text_or_null.clone(), "model": text_or_null.clone(), "serial": text_or_null
            }}
        }, "required": ["boot_mac", "links", "hardware"]}),
    );
    schemas.insert(
        "ReportOutcome".into(),
        json!({"oneOf": [
            {"type": "object", "properties": {"outcome": {"const": "matched"}, "hostname": {"type": "string"}}, "required": ["outcome", "hostname"], "additionalProperties": false},
            {"type": "object", "properties": {"outcome": {"const": "parked"}, "reason": {"type": "string"}}, "required": ["outcome", "reason"], "additionalProperties": false}
        ]}),
    );
    schemas.insert(
        "DiscoveredNode".into(),
        json!({"type": "object", "properties": {
            "id": {"type": "integer"},
            "mac": {"type": "string"},
            "reason": {"type": "string", "description": "Why it waits."},
            "candidate": {"oneOf": [{"type": "object", "properties": {
                "nic": {"type": "integer"}, "nic_name": {"type": "string"},
                "system": {"type": "integer"}, "hostname": {"type": "string"}
            }, "required": ["nic", "nic_name", "system", "hostname"], "additionalProperties": false}, {"type": "null"}], "description": "The NIC its switch port matched, if any."},
            "report": schema_ref("NadsReport"),
            "first_seen": {"type": "string"},
            "last_seen": {"type": "string"}
        }, "required": ["id", "mac", "reason", "candidate", "report", "first_seen", "last_seen"], "additionalProperties": false}),
    );
    let mut outcome = ok(
        "200",
        "Matched (the MAC is bound; the next boot is a normal one) or parked for an admin.",
        schema_ref("ReportOutcome"),
    );
    outcome.extend(error_responses(&["403", "426"]));
    outcome["400"]["description"] =
        json!("Not a NADS report, or its boot_mac is not a MAC; the message says why.");
    outcome["401"]["description"] = json!(
        "No discovery nonce, or one that is unknown, used, expired or cancelled by a newer boot; nothing was stored."
    );
    outcome["403"]["description"] = json!(
        "The nonce was minted for another MAC than the report's boot_mac; nothing was stored."
    );
    outcome.insert(
        "413".into(),
        json!({"description": format!("Body over {} bytes.", super::discovery::MAX_REPORT_BYTES), "content": {"text/plain": {"schema": {"type": "string"}}}}),
    );
    outcome.insert(
        "409".into(),
        json!({"description": "The NIC's MAC changed while the report was applied; nothing was stored.", "content": {"application/json": {"schema": schema_ref("Error")}}}),
    );
    paths.insert(
        REPORT_PATH.into(),
        json!({"post": {"summary": "A node in discovery reports what it heard over LLDP, with the one-time discovery nonce of its boot (its kernel command line's mprov_discover) in the mProv-Discovery-Nonce header: matched by switch port and bound as MPROV_DISCOVERY_POLICY allows, or parked for an admin",
            "tags": ["discovery"],
            "security": [],
            "parameters": [{"name": NONCE_HEADER, "in": "header", "required": true, "schema": {"type": "string"}, "description": "The discovery nonce, good for one report of the MAC it was minted for."}],
            "requestBody": body("NadsReport"),
            "responses": outcome}}),
    );
    let mut list = ok(
        "200",
        "One page of parked nodes, in id order.",
        json!({"type": "object", "properties": {
            "items": {"type": "array", "items": schema_ref("DiscoveredNode")},
            "next": {"type": ["integer", "null"], "description": "The after of the next page; null on the last."}
        }, "required": ["items", "next"], "additionalProperties": false}),
    );
    list.extend(error_responses(&["403"]));
    paths.insert(
        "/api/v1/discovery/".into(),
        json!({"get": {"summary": "The discovered nodes parked for an admin, with everything each reported",
            "tags": ["discovery"],
            "parameters": [
                {"name": "after", "in": "query", "schema": {"type": "integer"}, "description": "The id after which the page starts (the previous page's next)."},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": crate::discovery::store::MAX_PAGE}, "description": "At most this many (default 100)."}
            ],
            "responses": list}}),
    );
    let mac_param = json!({"name": "mac", "in": "path", "required": true, "schema": {"type": "string"}, "description": "The parked node's MAC."});
    schemas.insert(
        "DiscoveryAssign".into(),
        json!({"type": "object", "properties": {
            "system": {"oneOf": [{"type": "integer"}, {"type": "string"}], "description": "The system's id or host name."},
            "nic": {"oneOf": [{"type": "integer"}, {"type": "string"}], "description": "The NIC's id, or its name on that system."},
            "replace": {"type": "boolean", "description": "Replace the MAC the NIC has (default false: 409 if it has one)."}
        }, "required": ["system", "nic"], "additionalProperties": false}),
    );
    let mut assigned = ok(
        "200",
        "Bound: the node's next boot is a normal one.",
        json!({"type": "object", "properties": {
            "mac": {"type": "string"}, "hostname": {"type": "string"}, "nic": {"type": "integer"},
            "replaced": {"type": ["string", "null"], "description": "The MAC the NIC had."}
        }, "required": ["mac", "hostname", "nic", "replaced"], "additionalProperties": false}),
    );
    assigned.extend(error_responses(&["403", "404", "409"]));
    paths.insert(
        "/api/v1/discovery/{mac}/assign".into(),
        json!({"parameters": [mac_param.clone()],
            "post": {"summary": "Bind a parked node's MAC to a system's NIC (administrators)",
                "tags": ["discovery"],
                "requestBody": body("DiscoveryAssign"),
                "responses": assigned}}),
    );
    let mut dismissed = error_responses(&["400", "401", "403", "404", "426"]);
    dismissed.insert(
        "204".into(),
        json!({"description": "Forgotten; its next discovery boot parks it again."}),
    );
    paths.insert(
        "/api/v1/discovery/{mac}".into(),
        json!({"parameters": [mac_param],
            "delete": {"summary": "Dismiss a parked node (administrators)",
                "tags": ["discovery"],
                "responses": dismissed}}),
    );
}

/// The systems filter language, as the `filter` parameter and bulk
/// actions describe it.
const FILTER_DOC: &str = "A systems filter: terms separated by spaces, all of which must match. A term is `key:value`; `key:a,b` matches either value, a leading `-` negates it, `*` matches any run of characters, a value with spaces is double-quoted. Keys: hostname, group, image, rack, mac, ip (an address, an IPv4 prefix such as 10.0.0.0/24, or a glob), bmc (the BMC's IPv4 address, as ip), phase (dhcp, ipxe, kernel, enrolled, image, scripts, ready, failed, or none for never seen). Example: `group:compute rack:r1 -phase:ready mac:52:54:00:* ip:10.0.0.0/24`. A bad filter is a 400 whose message names the term and what is allowed.";

/// Bulk actions on the systems a filter matches, and the audit log.
fn bulk_paths(paths: &mut Map<String, Value>) {
    use mprov_api::bulk::{ACTIONS_PATH, AUDIT_PATH};
    let mut answer = ok(
        "200",
        "A preview (`applied` false: the count and the first host names) or the action applied to `count` systems.",
        json!({"type": "object", "additionalProperties": false, "required": ["applied", "count", "hosts"], "properties": {
            "applied": {"type": "boolean"},
            "count": {"type": "integer", "minimum": 0},
            "hosts": {"type": "array", "items": {"type": "string"}, "maxItems": crate::bulk::PREVIEW_HOSTS}
        }}),
    );
    answer.extend(error_responses(&["403", "409", "413", "415"]));
    answer.insert(
        "409".into(),
        json!({"description": "The filter no longer matches `confirm_count` systems: nothing was changed; preview again.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
    );
    paths.insert(
        ACTIONS_PATH.into(),
        json!({"post": {"tags": ["systems"],
            "summary": "A bulk action on every system a filter matches (administrators): without confirm_count a preview; with it, applied in one transaction with an audit entry if the filter still matches exactly that many systems",
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": false, "required": ["filter", "action"], "properties": {
                    "filter": {"type": "string", "description": FILTER_DOC},
                    "action": {"type": "string", "enum": crate::bulk::ACTIONS},
                    "group": {"type": "string", "description": "The group's slug (add_to_group, remove_from_group)."},
                    "image": {"type": "string", "description": "The image's slug (set_image)."},
                    "netboot": {"type": "boolean", "description": "set_netboot: boot from the network, or locally."},
                    "confirm_count": {"type": "integer", "minimum": 0, "description": "The count the preview showed."}
                }}}}},
            "responses": answer}}),
    );
    let entry = json!({"type": "object", "additionalProperties": false,
    "required": ["id", "at", "who", "action", "filter", "count", "detail"], "properties": {
        "id": {"type": "integer"},
        "at": {"type": "string", "description": "RFC 3339, UTC."},
        "who": {"type": "string", "description": "The account or API key."},
        "action": {"type": "string"},
        "filter": {"type": "string", "description": "The filter as written."},
        "count": {"type": "integer", "description": "How many systems it changed."},
        "detail": {"type": "string", "description": "What it set, e.g. `group compute`."}
    }});
    paths.insert(
        AUDIT_PATH.into(),
        json!({"get": {"summary": "The audit log of bulk actions, newest first (keyset pages)",
            "parameters": [
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": crate::bulk::MAX_AUDIT_LIMIT}, "description": "Page size (default 100)."},
                {"name": "cursor", "in": "query", "schema": {"type": "string"}, "description": "The `next` of the previous page."}
            ],
            "responses": ok("200", "A page of entries.", json!({"type": "object", "additionalProperties": false, "required": ["items", "next"], "properties": {
                "items": {"type": "array", "items": entry},
                "next": {"type": ["string", "null"]}
            }}))}}),
    );
}

/// The job server's own calls for the jobs queue: claiming and hosting, and
/// the files recorded for an image version.
fn jobs_paths(paths: &mut Map<String, Value>, schemas: &mut Map<String, Value>) {
    let file = json!({"type": "object", "properties": {
        "name": {"type": "string", "description": "Its name in the version folder (rootfs.tar.zst, vmlinuz, ...)."},
        "size": {"type": "integer", "minimum": 0, "description": "Its size in bytes."},
        "sha256": {"type": "string", "description": "Its SHA-256, 64 hex digits."}
    }, "required": ["name", "size", "sha256"], "additionalProperties": false});
    schemas.insert("HostedFile".into(), file);
    schemas.insert(
        "ImageFiles".into(),
        json!({"type": "object", "properties": {
            "image": {"type": "string", "description": "The image's slug."},
            "version": {"type": "integer"},
            "files": {"type": "array", "items": schema_ref("HostedFile"), "description": "By name; empty when none were recorded."}
        }, "required": ["image", "version", "files"], "additionalProperties": false}),
    );
    schemas.insert(
        "ClaimedJob".into(),
        json!({"type": "object", "properties": {
            "id": {"type": "integer", "description": "PATCH /api/v1/jobs/{id} reports on it."},
            "module": {"type": "string"},
            "params": {"description": "The module's parameters, e.g. {\"image\": \"compute\", \"version\": 3}."}
        }, "required": ["id", "module", "params"], "additionalProperties": false}),
    );
    let mut claimed = ok(
        "200",
        "The job, now running and claimed by this job server.",
        schema_ref("ClaimedJob"),
    );
    claimed.insert(
        "204".into(),
        json!({"description": "No pending job of these modules (empty body)."}),
    );
    claimed.extend(error_responses(&["401", "403", "426"]));
    json_reader_refusals(&mut claimed);
    paths.insert(
        mprov_api::jobs::CLAIM_PATH.into(),
        json!({"post": {"summary": "Claim the oldest pending job of these modules, for anyone or for this job server, of the modules it registered only (a module named but not registered gets nothing): a job server's own certificate only. Atomic: of concurrent claims, one wins each job",
            "tags": ["jobs"],
            "security": [{"clientCertificate": []}],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "type": "object", "properties": {
                    "modules": {"type": "array", "items": {"type": "string"}, "maxItems": 64, "description": "The job modules it runs."}
                }, "required": ["modules"], "additionalProperties": false}}}},
            "responses": claimed}}),
    );
    let mut hosted = error_responses(&["401", "403", "404", "409", "426"]);
    hosted.insert(
        "204".into(),
        json!({"description": "Recorded: this job server hosts the version."}),
    );
    json_reader_refusals(&mut hosted);
    paths.insert(
        mprov_api::jobs::HOSTING_PATH.into(),
        json!({"post": {"summary": "This job server hosts an image's current version (409 for any other). With files (it built it): records them and the rootfs checksum and size, clears the rebuild request, and queues an image-sync for every other job server running that module on a network one of the image's systems boots on. Without (a copy, verified against the recorded files): only for a version with files recorded (else 409)",
            "tags": ["jobs"],
            "security": [{"clientCertificate": []}],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "type": "object", "properties": {
                    "image": {"type": "string", "description": "The image's slug."},
                    "version": {"type": "integer"},
                    "files": {"type": ["array", "null"], "items": schema_ref("HostedFile"), "maxItems": crate::jobs::MAX_FILES, "description": "The version's files, rootfs.tar.zst among them: only from the job server that built it."}
                }, "required": ["image", "version"], "additionalProperties": false}}}},
            "responses": hosted}}),
    );
    let mut listed = ok("200", "The recorded files.", schema_ref("ImageFiles"));
    listed.extend(error_responses(&["400", "401", "403", "404", "426"]));
    paths.insert(
        mprov_api::jobs::IMAGE_FILES_ROUTE.into(),
        json!({"parameters": [{"name": "key", "in": "path", "required": true, "schema": {"type": "string"}, "description": "The image's id or slug."}],
            "get": {"summary": "The files recorded for an image version, which a copy is verified against (job servers and administrators)",
                "tags": ["images"],
                "parameters": [{"name": "version", "in": "query", "schema": {"type": "integer"}, "description": "The version; default the current one."}],
                "responses": listed}}),
    );
    let mut retried = ok("200", "The job, pending again.", schema_ref("Job"));
    retried.extend(error_responses(&["401", "403", "404", "409", "426"]));
    paths.insert(
        mprov_api::jobs::RETRY_ROUTE.into(),
        json!({"parameters": [{"name": "key", "in": "path", "required": true, "schema": {"type": "string"}, "description": "The job's id."}],
            "post": {"summary": "Queue a failed job again (administrators): a job its job server reported failed, or one failed because its job server fell silent. It becomes pending, claimed by nobody, with its start, end and return code cleared and its output kept with a line saying so; a job for one job server stays for it. Any other job is refused (409) with its state",
                "tags": ["jobs"],
                "responses": retried}}),
    );
}

/// The boot timeline, the boot manifest, and a job server's heartbeat and
/// registration.
fn boot_paths(paths: &mut Map<String, Value>, schemas: &mut Map<String, Value>) {
    let phases: Vec<&str> = BootPhase::ALL.iter().map(|p| p.as_str()).collect();
    schemas.insert(
        "BootEvent".into(),
        json!({"type": "object", "properties": {
            "id": {"type": "integer"},
            "system": {"type": ["integer", "null"], "description": "The system's id, if the node is known."},
            "hostname": {"type": ["string", "null"]},
            "mac": {"type": ["string", "null"]},
            "boot_id": {"type": "integer", "description": "The boot this event belongs to."},
            "phase": {"type": "string", "enum": phases},
            "at": {"type": "string", "description": "When it was recorded (RFC 3339, UTC)."},
            "source": {"type": "string", "description": "jobserver:<name>, node:<host>, control, or the admin's user:/apikey: name."},
            "ip": {"type": ["string", "null"]},
            "detail": {"type": "string"}
        }, "required": ["id", "boot_id", "phase", "at", "source", "detail"], "additionalProperties": false}),
    );
    schemas.insert(
        "BootManifest".into(),
        json!({"type": "object", "properties": {
            "system_id": {"type": "integer"}, "hostname": {"type": "string"},
            "image": {"type": "string"}, "version": {"type": "integer"},
            "size": {"type": "integer", "description": "rootfs.tar.zst's size in bytes."},
            "sha256": {"type": "string", "description": "The checksum recorded when the version was published; the node verifies the stream against it."},
            "sources": {"type": "array", "items": {"type": "string"}, "description": "rootfs.tar.zst on the eligible job servers, best first."},
            "tmpfs_size": {"type": ["string", "null"]}
        }, "required": ["system_id", "hostname", "image", "version", "size", "sha256", "sources"], "additionalProperties": false}),
    );
    let mut listed = ok(
        "200",
        "Oldest first.",
        json!({"type": "array", "items": schema_ref("BootEvent")}),
    );
    listed.extend(error_responses(&["400", "401", "403", "404", "426"]));
    let mut created = ok("201", "The stored event.", schema_ref("BootEvent"));
    created.extend(error_responses(&["400", "401", "403", "426"]));
    json_reader_refusals(&mut created);
    paths.insert(
        mprov_api::boot::EVENTS_PATH.into(),
        json!({
            "get": {"summary": "A node's boot timeline: its last boot (boot=all: every boot); without system or mac, the latest event of every node. A node's certificate reads its own only",
                "parameters": [
                    {"name": "system", "in": "query", "schema": {"type": "string"}, "description": "Host name or id."},
                    {"name": "mac", "in": "query", "schema": {"type": "string"}, "description": "A node the inventory does not know."},
                    {"name": "boot", "in": "query", "schema": {"type": "string", "enum": ["last", "all"]}}
                ],
                "responses": listed},
            "post": {"summary": "Report a step of a boot: a node for itself only (its certificate), a job server for the node it names by mac, system or leased ip",
                "security": [{"clientCertificate": []}, {"apiKey": []}, {"basic": []}],
                "requestBody": {"required": true, "content": {"application/json": {"schema": schema_ref("BootEventReport")}}},
                "responses": created}
        }),
    );
    schemas.insert(
        "BootEventReport".into(),
        json!({"type": "object", "properties": {
            "phase": {"type": "string", "enum": phases},
            "mac": {"type": ["string", "null"]}, "system": {"type": ["string", "null"]},
            "ip": {"type": ["string", "null"]}, "detail": {"type": "string"}
        }, "required": ["phase"], "additionalProperties": false}),
    );
    schemas.insert(
        "BatchOutcome".into(),
        json!({"type": "object", "properties": {
            "stored": {"type": "integer", "description": "How many events were stored (in order, in one transaction)."},
            "refused": {"type": "array", "items": {"type": "object", "properties": {
                "index": {"type": "integer", "description": "The event's place in the batch, from 0."},
                "status": {"type": "integer", "description": "What the one-event path would have answered."},
                "error": {"type": "string"}, "message": {"type": "string"}
            }, "required": ["index", "status", "error", "message"], "additionalProperties": false}}
        }, "required": ["stored"], "additionalProperties": false}),
    );
    let mut batched = ok(
        "200",
        "What was stored and which events were refused, and why.",
        schema_ref("BatchOutcome"),
    );
    batched.extend(error_responses(&["400", "401", "403", "426", "429"]));
    json_reader_refusals(&mut batched);
    paths.insert(
        mprov_api::boot::EVENTS_BATCH_PATH.into(),
        json!({"post": {"summary": format!("Report up to {} steps of boots at once (a job server's queue, a node's reports made while a post was in flight): each judged as the one-event path judges it; the refused ones are named in the answer, the others stored. Each event counts against the reporter's budget of boot events (429 for the whole batch when it does not fit)", mprov_api::boot::MAX_BATCH),
            "security": [{"clientCertificate": []}, {"apiKey": []}, {"basic": []}],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "type": "array", "minItems": 1, "maxItems": mprov_api::boot::MAX_BATCH,
                "items": schema_ref("BootEventReport")}}}},
            "responses": batched}}),
    );
    let mut beat = error_responses(&["400", "401", "403", "409", "426"]);
    beat.insert(
        "204".into(),
        json!({"description": "Stored on the job server's row (and on the address's, when one is named)."}),
    );
    json_reader_refusals(&mut beat);
    paths.insert(
        mprov_api::boot::HEARTBEAT_PATH.into(),
        json!({"post": {"summary": "A job server's heartbeat on one of its registered addresses, with its own certificate (which names the row written): /ipxe/ and the boot manifest send a node only to an address on its network heard from within MPROV_JOBSERVER_STALE_SECONDS, least loaded first. An address it did not register is refused (409: register first)",
            "security": [{"clientCertificate": []}],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "type": "object", "properties": {
                    "load_avg": {"type": "number", "minimum": 0, "maximum": 1e6, "description": "Its one-minute load average."},
                    "address": {"type": ["string", "null"], "description": "The registered address this heartbeat is for; null stamps only the row (a job server that registered no addresses)."},
                    "streams": {"type": "integer", "minimum": 0, "maximum": u32::MAX, "description": "Image streams it is serving now."}
                }, "required": ["load_avg"], "additionalProperties": false}}}},
            "responses": beat}}),
    );
    let address = json!({"type": "object", "properties": {
        "address": {"type": "string", "description": "An address nodes reach it at."},
        "network": {"type": ["integer", "null"], "description": "The network's id; null: the network whose subnet holds the address, if one does."}
    }, "required": ["address"], "additionalProperties": false});
    schemas.insert(
        "Registered".into(),
        json!({"type": "object", "properties": {
            "id": {"type": "integer", "description": "The job server's row id."},
            "name": {"type": "string", "description": "Its name: its certificate's."},
            "addresses": {"type": "array", "items": address, "description": "Its addresses, each with the network it was placed on (null: none holds it, and no node is sent there)."}
        }, "required": ["id", "name", "addresses"], "additionalProperties": false}),
    );
    let mut registered = ok("200", "Its row, found or made.", schema_ref("Registered"));
    registered.extend(error_responses(&["400", "401", "403", "409", "426"]));
    registered.insert(
        "429".into(),
        json!({"description": format!("More than {} registrations a minute from this job server; try again after `Retry-After` seconds.", crate::jobservers::REGISTRATIONS_PER_MINUTE),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
    );
    json_reader_refusals(&mut registered);
    paths.insert(
        mprov_api::jobs::REGISTER_PATH.into(),
        json!({"post": {"summary": "A job server registers its row with its own certificate, whose name is the row's: found by host id (a renamed host keeps its row, unless the old name's certificate is still valid: 409), else by name (a row made by hand), else made; its modules, port and addresses are set, each address on the network it names or whose subnet holds it",
            "security": [{"clientCertificate": []}],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "type": "object", "properties": {
                    "host_id": {"type": "string", "minLength": 1, "maxLength": 255, "description": "The stable id of its host, kept beside its config."},
                    "modules": {"type": "array", "items": {"type": "string"}, "maxItems": 64, "description": "The job modules it runs."},
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "Its image server's HTTP port."},
                    "addresses": {"type": "array", "items": address, "maxItems": 64, "description": "The addresses it serves nodes on; each heartbeats on its own."}
                }, "required": ["host_id", "modules", "port", "addresses"], "additionalProperties": false}}}},
            "responses": registered}}),
    );
    let mut manifest = ok("200", "What the node boots.", schema_ref("BootManifest"));
    manifest.extend(error_responses(&["400", "401", "403", "404", "409", "426"]));
    paths.insert(
        mprov_api::boot::MANIFEST_PATH.into(),
        json!({"get": {"summary": "The boot manifest of the node whose certificate this request presents (admins: ?system=)",
            "security": [{"clientCertificate": []}, {"apiKey": []}, {"basic": []}],
            "parameters": [{"name": "system", "in": "query", "schema": {"type": "string"}}],
            "responses": manifest}}),
    );
}
