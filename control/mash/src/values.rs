//! `field=value` arguments to JSON objects, for `add` and `edit`.
//!
//! The syntax is the one shells make easy: `field=value`, where the field's
//! [`Class`] says what the text means (`true`/`false`, an integer, a
//! comma-separated list, an id or a slug), `null` is JSON `null` for every
//! field, and `field:=<json>` sends any JSON as it is (httpie's convention),
//! which is the way to send nested values such as a system's `nics`, or the
//! string `"null"`.

use anyhow::{Context, Result, bail};
use serde_json::{Map, Number, Value};

use crate::kinds::{Class, KindInfo};

/// Turns `field=value` and `field:=json` arguments into one JSON object,
/// refusing a field given twice.
pub(crate) fn parse_assignments(kind: &KindInfo, args: &[String]) -> Result<Map<String, Value>> {
    let mut out = Map::new();
    for arg in args {
        let (field, value) = parse_assignment(kind, arg)?;
        if out.insert(field.clone(), value).is_some() {
            bail!("{field} is given twice");
        }
    }
    Ok(out)
}

/// One `field=value` or `field:=json` argument.
pub(crate) fn parse_assignment(kind: &KindInfo, arg: &str) -> Result<(String, Value)> {
    let Some((field, text)) = arg.split_once('=') else {
        bail!("{arg:?} is not field=value (or field:=json)");
    };
    if let Some(field) = field.strip_suffix(':') {
        check_name(arg, field)?;
        let value = serde_json::from_str(text)
            .with_context(|| format!("the value of {field} is not valid JSON"))?;
        return Ok((field.to_owned(), value));
    }
    check_name(arg, field)?;
    let value = parse_value(kind.class(field), text)
        .with_context(|| format!("invalid value for {field}"))?;
    Ok((field.to_owned(), value))
}

fn check_name(arg: &str, field: &str) -> Result<()> {
    if field.is_empty() || !field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        bail!("{arg:?}: {field:?} is not a field name");
    }
    Ok(())
}

/// One value's text, read as `class` says; `null` is `null` for every class.
pub(crate) fn parse_value(class: Class, text: &str) -> Result<Value> {
    if text == "null" {
        return Ok(Value::Null);
    }
    Ok(match class {
        Class::Bool => match text.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => bail!("{text:?} is not true or false"),
        },
        Class::Float => {
            let f: f64 = text
                .trim()
                .parse()
                .with_context(|| format!("{text:?} is not a number"))?;
            Value::Number(Number::from_f64(f).with_context(|| format!("{text:?} is not finite"))?)
        }
        Class::Int => Value::from(
            text.trim()
                .parse::<i64>()
                .with_context(|| format!("{text:?} is not an integer"))?,
        ),
        Class::IdList => Value::Array(list_items(text).map(id_or_slug).collect()),
        Class::Json => serde_json::from_str(text).unwrap_or_else(|_| Value::from(text)),
        Class::Ref => id_or_slug(text.trim()),
        Class::StrList => Value::Array(list_items(text).map(Value::from).collect()),
        Class::Text => Value::from(text),
    })
}

/// The items of a comma-separated list, trimmed; empty items are dropped, so
/// an empty value is the empty list.
fn list_items(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// An id when the text is all digits, else a slug: the server accepts either
/// for references.
pub(crate) fn id_or_slug(text: &str) -> Value {
    if !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && let Ok(id) = text.parse::<i64>()
    {
        return Value::from(id);
    }
    Value::from(text)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kinds::kind;

    #[test]
    fn values_by_class() {
        let check = |class: Class, text: &str, expected: Option<Value>| {
            let got = parse_value(class, text).ok();
            assert_eq!(got, expected, "{class:?} {text:?}");
        };
        check(Class::Bool, "true", Some(json!(true)));
        check(Class::Bool, "False", Some(json!(false)));
        check(Class::Bool, "yes", None);
        check(Class::Bool, "null", Some(Value::Null));
        check(Class::Int, "42", Some(json!(42)));
        check(Class::Int, "-7", Some(json!(-7)));
        check(Class::Int, "4.2", None);
        check(Class::Int, "", None);
        check(Class::Float, "0.5", Some(json!(0.5)));
        check(Class::Float, "inf", None);
        check(
            Class::IdList,
            "compute,3, gpu ",
            Some(json!(["compute", 3, "gpu"])),
        );
        check(Class::IdList, "", Some(json!([])));
        check(Class::IdList, "a,,b", Some(json!(["a", "b"])));
        check(
            Class::StrList,
            "10.0.0.1,10.0.0.2",
            Some(json!(["10.0.0.1", "10.0.0.2"])),
        );
        check(Class::StrList, "7", Some(json!(["7"])));
        check(Class::Ref, "12", Some(json!(12)));
        check(Class::Ref, "rocky9", Some(json!("rocky9")));
        check(Class::Ref, "-1", Some(json!("-1")));
        check(
            Class::Ref,
            "99999999999999999999",
            Some(json!("99999999999999999999")),
        );
        check(Class::Text, "2024", Some(json!("2024")));
        check(
            Class::Text,
            "console=ttyS0,115200",
            Some(json!("console=ttyS0,115200")),
        );
        check(Class::Text, " spaced ", Some(json!(" spaced ")));
        check(Class::Text, "", Some(json!("")));
        check(Class::Json, r#"{"a":1}"#, Some(json!({"a": 1})));
        check(Class::Json, "not json", Some(json!("not json")));
    }

    #[test]
    fn assignments() {
        let systems = kind("systems").expect("systems");
        let args: Vec<String> = [
            "hostname=n001",
            "image=rocky9",
            "groups=compute,gpu",
            "netboot=false",
            "tmpfs_root_size=8",
            "install_kernel_cmdline=console=ttyS0,115200",
            "config_params=null",
            r#"nics:=[{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff"}]"#,
            "prov_interface:=\"null\"",
        ]
        .map(String::from)
        .to_vec();
        let got = parse_assignments(systems, &args).expect("parse");
        assert_eq!(
            Value::Object(got),
            json!({
                "hostname": "n001",
                "image": "rocky9",
                "groups": ["compute", "gpu"],
                "netboot": false,
                "tmpfs_root_size": 8,
                "install_kernel_cmdline": "console=ttyS0,115200",
                "config_params": null,
                "nics": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff"}],
                "prov_interface": "null",
            })
        );
    }

    #[test]
    fn bad_assignments() {
        let systems = kind("systems").expect("systems");
        for (args, message) in [
            (&["hostname"][..], "is not field=value"),
            (&["=x"], "is not a field name"),
            (&["a b=x"], "is not a field name"),
            (&["netboot=maybe"], "invalid value for netboot"),
            (
                &["tmpfs_root_size=big"],
                "invalid value for tmpfs_root_size",
            ),
            (&["nics:=[oops"], "the value of nics is not valid JSON"),
            (&["hostname=a", "hostname=b"], "hostname is given twice"),
        ] {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            let err = parse_assignments(systems, &args).expect_err(message);
            assert!(format!("{err:#}").contains(message), "{args:?}: {err:#}");
        }
    }
}
