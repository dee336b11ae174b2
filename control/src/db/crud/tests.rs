use serde_json::json;

use super::*;
use crate::db::kinds;
use crate::secrets::SecretBox;

#[test]
fn macs_normalise() {
    for (input, want) in [
        ("52:54:00:AB:cd:01", Some("52:54:00:ab:cd:01")),
        ("52-54-00-ab-cd-01", Some("52:54:00:ab:cd:01")),
        ("5254.00ab.cd01", Some("52:54:00:ab:cd:01")),
        ("525400abcd01", Some("52:54:00:ab:cd:01")),
        ("52:54:00:ab:cd", None),
        ("52:54:00:ab:cd:0g", None),
        ("5:254:00:ab:cd:01", None),
        ("", None),
    ] {
        assert_eq!(parse_mac(input).ok().as_deref(), want, "{input}");
    }
}

#[test]
fn hostnames_and_slugs() {
    assert_eq!(parse_hostname("C01.cluster.").unwrap(), "c01.cluster");
    for bad in ["", "-a", "a..b", "a b", &"x".repeat(64)] {
        assert!(parse_hostname(bad).is_err(), "{bad}");
    }
    assert!(parse_slug("compute-2").is_ok());
    for bad in ["", "123", "Compute", "-x", "a/b"] {
        assert!(parse_slug(bad).is_err(), "{bad}");
    }
}

#[test]
fn cursors_round_trip() {
    let at = read::Cursor {
        s: "-hostname".into(),
        v: json!("c01"),
        i: 4200,
    };
    assert_eq!(decode_cursor(&encode_cursor(&at)), Some(at));
    let odd = read::Cursor {
        s: String::new(),
        v: json!([1]),
        i: 1,
    };
    assert_eq!(
        decode_cursor(&encode_cursor(&odd)),
        None,
        "values are scalars"
    );
    assert_eq!(decode_cursor("garbage!"), None);
    assert_eq!(decode_cursor(""), None);
}

#[test]
fn ref_keys() {
    assert_eq!(RefKey::parse_str("12"), RefKey::Id(12));
    assert_eq!(RefKey::parse_str("+12"), RefKey::Slug("+12".into()));
    assert_eq!(RefKey::parse_str("c01"), RefKey::Slug("c01".into()));
}

#[test]
fn validation_names_every_bad_field() {
    let sb = SecretBox::new("k");
    let systems = kinds::kind("systems").unwrap();
    let body = json!({
        "hostname": "bad host",
        "colour": "blue",
        "id": 3,
        "nics": [{"mac": "zz", "mtu": "big"}, {"system": 1}],
        "tmpfs_root_size": 1.5,
    });
    let errs = validate(systems, body.as_object().unwrap(), Mode::Create, &sb, "").unwrap_err();
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    for want in [
        "hostname",
        "colour",
        "id",
        "nics[0].mac",
        "nics[0].mtu",
        "nics[1].system",
        "tmpfs_root_size",
    ] {
        assert!(paths.contains(&want), "{want} missing from {paths:?}");
    }
}

#[test]
fn create_requires_and_defaults() {
    let sb = SecretBox::new("k");
    let nets = kinds::kind("networks").unwrap();
    let errs = validate(nets, &Obj::new(), Mode::Create, &sb, "").unwrap_err();
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["slug", "subnet", "netmask"]);
    let ok = validate(
        nets,
        json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 24})
            .as_object()
            .unwrap(),
        Mode::Create,
        &sb,
        "",
    )
    .unwrap();
    assert!(ok.value("isdhcp").is_some());
    // Updates take only what is given.
    let upd = validate(
        nets,
        json!({"vlan": 5}).as_object().unwrap(),
        Mode::Update,
        &sb,
        "",
    )
    .unwrap();
    assert_eq!(upd.cols.len(), 1);
}

#[test]
fn ip_addresses_take_their_canonical_form() {
    let sb = SecretBox::new("k");
    let nics = kinds::kind("nics").unwrap();
    let check =
        |body: serde_json::Value| validate(nics, body.as_object().unwrap(), Mode::Create, &sb, "");
    let ok = check(json!({"system": 1, "ipv4": " 10.1.2.3 ", "ipv6": "2001:DB8:0::1"})).unwrap();
    let text = |name| match ok.value(name) {
        Some(Pending::Val(Val::Text(Some(s)))) => s.clone(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(text("ipv4"), "10.1.2.3");
    assert_eq!(text("ipv6"), "2001:db8::1");
    let errs = check(json!({"system": 1, "ipv4": "10.1.2", "ipv6": "10.1.2.3"})).unwrap_err();
    let messages: Vec<&str> = errs.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "\"10.1.2\" is not an IPv4 address",
            "\"10.1.2.3\" is not an IPv6 address"
        ]
    );
}
