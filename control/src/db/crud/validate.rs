//! Checks a request body against its kind's descriptor and turns it into
//! typed values ready to bind. Pure: no database, no clock.

use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::Value;

use super::{FieldError, Mode, Obj, Pending, Prepared, RefKey, StoreError, field_errors};
use crate::db::Val;
use crate::db::kinds::{self, Access, Default, Field, Kind, Ty};
use crate::secrets::SecretBox;
use crate::time::format_ts;

/// Validates a request body against a kind.
pub fn validate(
    kind: &'static Kind,
    body: &Obj,
    mode: Mode,
    secrets: &SecretBox,
    path: &str,
) -> Result<Prepared, Vec<FieldError>> {
    let mut errors = Vec::new();
    let mut out = Prepared {
        cols: Vec::new(),
        m2m: Vec::new(),
        children: Vec::new(),
    };
    let at = |name: &str| {
        if path.is_empty() {
            name.to_owned()
        } else {
            format!("{path}.{name}")
        }
    };
    for (key, value) in body {
        if let Some(field) = kind.field(key) {
            if field.access == Access::ReadOnly {
                errors.push(FieldError::new(at(key), "is read-only; leave it out"));
                continue;
            }
            if mode == Mode::Child(field.name) {
                errors.push(FieldError::new(
                    at(key),
                    "is implied by the enclosing object; leave it out",
                ));
                continue;
            }
            match parse_field(field, value, secrets) {
                Ok(p) => out.cols.push((field, p)),
                Err(msg) => errors.push(FieldError::new(at(key), msg)),
            }
        } else if let Some(rel) = kind.relation(key) {
            match value.as_array() {
                Some(items) => {
                    let mut keys = Vec::with_capacity(items.len());
                    for (i, item) in items.iter().enumerate() {
                        match RefKey::parse_value(item) {
                            Some(k) => keys.push(k),
                            None => errors.push(FieldError::new(
                                format!("{}[{i}]", at(key)),
                                format!("expected the id or slug of one of {}", rel.kind),
                            )),
                        }
                    }
                    out.m2m.push((rel, keys));
                }
                None => errors.push(FieldError::new(
                    at(key),
                    format!("expected a list of ids or slugs of {}", rel.kind),
                )),
            }
        } else if let Some(child) = kind.children.iter().find(|c| c.name == key.as_str()) {
            if mode != Mode::Create {
                errors.push(FieldError::new(
                    at(key),
                    format!(
                        "can only be given on create; change them through /api/v1/{}/",
                        child.kind
                    ),
                ));
                continue;
            }
            let Some(child_kind) = kinds::kind(child.kind) else {
                continue;
            };
            match value.as_array() {
                Some(items) => {
                    let mut rows = Vec::new();
                    for (i, item) in items.iter().enumerate() {
                        let p = format!("{}[{i}]", at(key));
                        match item.as_object() {
                            Some(obj) => match validate(
                                child_kind,
                                obj,
                                Mode::Child(child.parent_field),
                                secrets,
                                &p,
                            ) {
                                Ok(prep) => rows.push(prep),
                                Err(mut e) => errors.append(&mut e),
                            },
                            None => errors.push(FieldError::new(p, "expected an object")),
                        }
                    }
                    out.children.push((child, rows));
                }
                None => errors.push(FieldError::new(at(key), "expected a list of objects")),
            }
        } else if key == "id"
            || (kind.timestamps && (key == "created_at" || key == "updated_at"))
            || kind.reported.iter().any(|r| r.name == key.as_str())
        {
            errors.push(FieldError::new(at(key), "is read-only; leave it out"));
        } else {
            let known: Vec<&str> = writable_names(kind).collect();
            errors.push(FieldError::new(
                at(key),
                format!("unknown field; {} takes: {}", kind.name, known.join(", ")),
            ));
        }
    }
    if mode != Mode::Update {
        for field in kind.fields {
            if body.contains_key(field.name) || mode == Mode::Child(field.name) {
                continue;
            }
            let Some(pending) = default_of(field) else {
                if field.access != Access::ReadOnly {
                    errors.push(FieldError::new(at(field.name), "is required"));
                }
                continue;
            };
            out.cols.push((field, pending));
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The value a create gives `field` when the body leaves it out; `None`
/// when it has no default (required, or set by the server).
pub(super) fn default_of(field: &Field) -> Option<Pending> {
    Some(match field.default {
        Default::None => return None,
        Default::Null => match field.ty {
            Ty::Ref(_) => Pending::Ref(None),
            _ => Pending::Val(null_of(field.ty)),
        },
        Default::Bool(b) => Pending::Val(Val::Bool(Some(b))),
        Default::Int(i) => match field.ty {
            Ty::Float => Pending::Val(Val::Float(Some(i as f64))),
            _ => Pending::Val(Val::Int(Some(i))),
        },
        Default::Str(s) => Pending::Val(Val::Text(Some(s.to_owned()))),
        Default::EmptyList => Pending::Val(Val::Text(Some("[]".into()))),
    })
}

/// Validates a body given as any JSON value, for callers that report errors as
/// one message (the command line, first start).
pub fn validate_value(
    kind: &'static Kind,
    body: &Value,
    mode: Mode,
    secrets: &SecretBox,
) -> Result<Prepared, StoreError> {
    let obj = body.as_object().ok_or_else(|| StoreError::Invalid {
        field: None,
        message: "expected a JSON object".into(),
    })?;
    validate(kind, obj, mode, secrets, "").map_err(field_errors)
}

/// The names a client may write for a kind.
pub fn writable_names(kind: &'static Kind) -> impl Iterator<Item = &'static str> {
    kind.fields
        .iter()
        .filter(|f| f.access != Access::ReadOnly)
        .map(|f| f.name)
        .chain(kind.m2m.iter().map(|m| m.name))
        .chain(kind.children.iter().map(|c| c.name))
}

pub(super) fn null_of(ty: Ty) -> Val {
    match ty {
        Ty::Bool => Val::Bool(None),
        Ty::Float => Val::Float(None),
        Ty::Int { .. } | Ty::Ref(_) => Val::Int(None),
        _ => Val::Text(None),
    }
}

pub(super) fn parse_field(
    field: &Field,
    value: &Value,
    secrets: &SecretBox,
) -> Result<Pending, String> {
    if value.is_null() {
        return if field.nullable {
            Ok(match field.ty {
                Ty::Ref(_) => Pending::Ref(None),
                ty => Pending::Val(null_of(ty)),
            })
        } else {
            Err("must not be null".into())
        };
    }
    let text = |v: String| Ok(Pending::Val(Val::Text(Some(v))));
    let string = || value.as_str().ok_or_else(|| "expected a string".to_owned());
    match field.ty {
        Ty::Bool => value
            .as_bool()
            .map(|b| Pending::Val(Val::Bool(Some(b))))
            .ok_or_else(|| "expected true or false".into()),
        Ty::Enum(allowed) => {
            let s = string()?;
            if allowed.contains(&s) {
                text(s.to_owned())
            } else {
                Err(format!("expected one of {}", allowed.join(", ")))
            }
        }
        Ty::Float => value
            .as_f64()
            .filter(|f| f.is_finite())
            .map(|f| Pending::Val(Val::Float(Some(f))))
            .ok_or_else(|| "expected a number".into()),
        Ty::Hostname => text(parse_hostname(string()?)?),
        Ty::Int { min, max } => {
            let i = value
                .as_i64()
                .ok_or_else(|| "expected an integer".to_owned())?;
            if i < min || i > max {
                Err(format!("must be between {min} and {max}"))
            } else {
                Ok(Pending::Val(Val::Int(Some(i))))
            }
        }
        Ty::Ipv4 => text(parse_ip::<Ipv4Addr>(string()?, "IPv4")?),
        Ty::Ipv6 => text(parse_ip::<Ipv6Addr>(string()?, "IPv6")?),
        Ty::Json => text(value.to_string()),
        Ty::Mac => text(parse_mac(string()?)?),
        Ty::Password => {
            let s = string()?;
            if s.chars().count() < 8 {
                Err("must be at least 8 characters".into())
            } else {
                Ok(Pending::Password(s.to_owned()))
            }
        }
        Ty::Ref(target) => RefKey::parse_value(value)
            .map(|k| Pending::Ref(Some(k)))
            .ok_or_else(|| format!("expected the id or slug of one of {target}")),
        Ty::Secret => {
            let s = string()?;
            if s.len() > 1024 {
                return Err("must be at most 1024 bytes".into());
            }
            text(secrets.seal(s))
        }
        Ty::Sha256 => text(parse_sha256(string()?)?),
        Ty::Slug => text(parse_slug(string()?)?),
        Ty::StrList => {
            let items = value
                .as_array()
                .ok_or_else(|| "expected a list of strings".to_owned())?;
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                let s = item
                    .as_str()
                    .ok_or_else(|| "expected a list of strings".to_owned())?;
                if s.is_empty() || s.len() > 255 {
                    return Err("each item must be 1 to 255 characters".into());
                }
                out.push(Value::String(s.to_owned()));
            }
            text(Value::Array(out).to_string())
        }
        Ty::Text { max } => {
            let s = string()?;
            if s.chars().count() > max {
                Err(format!("must be at most {max} characters"))
            } else {
                text(s.to_owned())
            }
        }
        Ty::Timestamp => {
            let s = string()?;
            let ts: jiff::Timestamp = s.parse().map_err(|_| {
                format!("{s:?} is not an RFC 3339 time such as 2026-01-31T12:00:00Z")
            })?;
            text(format_ts(ts))
        }
        Ty::Yaml => {
            let s = string()?;
            if s.len() > 1 << 20 {
                return Err("must be at most 1 MiB".into());
            }
            crate::effective::validate_config_params(s)?;
            text(s.to_owned())
        }
    }
}

/// An IP address of the family `A` (`family` names it in the error), in its
/// canonical form.
fn parse_ip<A: std::str::FromStr + std::fmt::Display>(
    s: &str,
    family: &str,
) -> Result<String, String> {
    let ip: A = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not an {family} address"))?;
    Ok(ip.to_string())
}

/// Normalises a MAC address to lowercase `aa:bb:cc:dd:ee:ff`. Accepts `:` or `-`
/// separators, Cisco's `aabb.ccdd.eeff`, or 12 bare hex digits.
pub fn parse_mac(s: &str) -> Result<String, String> {
    let hex: String = s
        .trim()
        .chars()
        .filter(|c| !matches!(c, ':' | '-' | '.'))
        .collect();
    let ok_shape = {
        let t = s.trim();
        let seps: Vec<char> = t.chars().filter(|c| matches!(c, ':' | '-' | '.')).collect();
        seps.is_empty()
            || (seps.len() == 5 && t.split([':', '-']).all(|p| p.len() == 2))
            || (seps.len() == 2 && t.split('.').all(|p| p.len() == 4))
    };
    if hex.len() != 12 || !ok_shape || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "{s:?} is not a MAC address such as 52:54:00:12:34:56"
        ));
    }
    let lower = hex.to_ascii_lowercase();
    let parts: Vec<&str> = (0..6).map(|i| &lower[i * 2..i * 2 + 2]).collect();
    Ok(parts.join(":"))
}

/// Checks a host name (RFC 1123 labels) and lowercases it.
pub fn parse_hostname(s: &str) -> Result<String, String> {
    let t = s.trim_end_matches('.');
    let valid = !t.is_empty()
        && t.len() <= 253
        && t.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
    if valid {
        Ok(t.to_ascii_lowercase())
    } else {
        Err(format!(
            "{s:?} is not a valid host name: use letters, digits and '-', labels of 1 to 63 characters separated by '.'"
        ))
    }
}

/// A SHA-256 digest: 32 bytes, written as 64 hex digits (lowercase when
/// shown). The one parser of a recorded checksum: the field's validation and
/// the node view both use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sha256([u8; 32]);

impl Sha256 {
    /// The digest's bytes.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::str::FromStr for Sha256 {
    type Err = String;

    /// 64 hex digits, either case.
    fn from_str(s: &str) -> Result<Sha256, String> {
        let mut out = [0u8; 32];
        match hex::decode_to_slice(s, &mut out) {
            Ok(()) => Ok(Sha256(out)),
            Err(_) => Err(format!(
                "{s:?} is not a SHA-256: write its 64 hex digits, as manifest.json has them"
            )),
        }
    }
}

impl std::fmt::Display for Sha256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// Checks a recorded SHA-256 field: 64 hex digits, stored lowercase, or
/// empty (none recorded yet).
pub fn parse_sha256(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Ok(String::new());
    }
    s.parse::<Sha256>().map(|d| d.to_string())
}

/// Checks a slug: lowercase letters, digits, `-` and `_`, not all digits (so it
/// never reads as an id).
pub fn parse_slug(s: &str) -> Result<String, String> {
    let valid = !s.is_empty()
        && s.len() <= 255
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && !s.chars().all(|c| c.is_ascii_digit())
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    if valid {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a valid slug: use lowercase letters, digits, '-' and '_', starting with a letter or digit, not only digits"
        ))
    }
}

pub(super) fn query_value(ty: Ty, raw: &str) -> Value {
    match ty {
        Ty::Bool => match raw {
            "true" | "True" | "1" => Value::Bool(true),
            "false" | "False" | "0" => Value::Bool(false),
            _ => Value::String(raw.to_owned()),
        },
        Ty::Int { .. } => raw
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(raw.into())),
        Ty::Float => raw
            .parse::<f64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(raw.into())),
        _ if raw == "null" => Value::Null,
        _ => Value::String(raw.to_owned()),
    }
}
