use std::path::Path;

use super::fuzz::Memory;
use super::*;

const MAIN: &str = "/etc/mprov/jobserver.yaml";

fn load_files(files: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let memory = Memory::new(files.iter().copied());
    load(Path::new(MAIN), &memory)
}

fn error(files: &[(&str, &str)]) -> String {
    match load_files(files) {
        Ok(c) => panic!("loaded: {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn seed_style_config_loads() {
    let config = load_files(&[
        (
            MAIN,
            "- global:\n    mprovURL: \"http://mprov.local.cluster\"\n    apikey: 'k'\n    heartbeatInterval: 10\n    myaddress: 'mprov.local.cluster'\n    jobmodules:\n      - repo-delete\n      - image-update\n      - mprov-webserver\n      - dnsmasq\n\n- !include plugins/*.yaml\n",
        ),
        ("/etc/mprov/plugins/dnsmasq.yaml", "- dnsmasq:\n    enableDNS: false\n"),
        ("/etc/mprov/plugins/.hidden.yaml", "not: [valid"),
        ("/etc/mprov/plugins/notes.txt", "not: [valid"),
    ])
    .unwrap();
    assert_eq!(
        config.mprov_url.as_deref(),
        Some("http://mprov.local.cluster")
    );
    assert_eq!(config.heartbeat_interval, Some(10));
    assert_eq!(
        config.modules,
        Some(vec![
            "image-update".into(),
            "mprov-webserver".into(),
            "dnsmasq".into()
        ])
    );
    assert_eq!(
        config.boot_services,
        BootServices {
            dhcp: true,
            dns: false,
            tftp: true
        }
    );
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert!(
        config.warnings[0].starts_with("/etc/mprov/jobserver.yaml:7:"),
        "{:?}",
        config.warnings
    );
    assert!(!format!("{config:?}").contains("'k'") && format!("{config:?}").contains("redacted"));
}

#[test]
fn errors_name_file_and_line() {
    let e = error(&[(MAIN, "- global:\n    mprovURL: [unclosed\n")]);
    assert!(e.starts_with("/etc/mprov/jobserver.yaml:"), "{e}");
    let e = error(&[(MAIN, "- global:\n    mprovURL: x\n    colour: blue\n")]);
    assert!(e.starts_with("/etc/mprov/jobserver.yaml:3:"), "{e}");
    assert!(e.contains("colour"), "{e}");
    let e = error(&[
        (MAIN, "- !include plugins/*.yaml\n"),
        (
            "/etc/mprov/plugins/x.yaml",
            "- dnsmasq:\n    enableDHCP: false\n    enableDNS: maybe\n",
        ),
    ]);
    assert!(e.starts_with("/etc/mprov/plugins/x.yaml:3:"), "{e}");
    let e = error(&[(MAIN, "- global: {}\n- !include missing.yaml\n")]);
    assert!(e.starts_with("/etc/mprov/jobserver.yaml:2:"), "{e}");
    assert!(e.contains("/etc/mprov/missing.yaml does not exist"), "{e}");
    let e = error(&[(MAIN, "- global:\n    jobmodules: [dnsmasq, dhcpd]\n")]);
    assert!(e.starts_with("/etc/mprov/jobserver.yaml:2:"), "{e}");
    assert!(e.contains("unknown job module `dhcpd`"), "{e}");
    let e = error(&[(MAIN, "- webserver: {}\n")]);
    assert!(e.starts_with("/etc/mprov/jobserver.yaml:1:"), "{e}");
    let e = error(&[(MAIN, "- global: {}\n- dnsmasq: {}\n- global: {}\n")]);
    assert!(
        e.starts_with("/etc/mprov/jobserver.yaml:3:") && e.contains(":1:"),
        "{e}"
    );
    let e = error(&[(MAIN, "- global:\n    logLevel: verbose\n")]);
    assert!(e.starts_with("/etc/mprov/jobserver.yaml:2:"), "{e}");
}

#[test]
fn includes_nest_but_not_in_a_cycle_or_too_deep() {
    let config = load_files(&[
        (MAIN, "- !include a/one.yaml\n"),
        ("/etc/mprov/a/one.yaml", "- !include ../b/*.yaml\n"),
        ("/etc/mprov/b/two.yaml", "- global:\n    hostId: deep\n"),
    ])
    .unwrap();
    assert_eq!(config.host_id.as_deref(), Some("deep"));
    let e = error(&[
        (MAIN, "- !include a.yaml\n"),
        ("/etc/mprov/a.yaml", "- !include ./jobserver.yaml\n"),
    ]);
    assert!(
        e.starts_with("/etc/mprov/a.yaml:1:") && e.contains("cycle"),
        "{e}"
    );
    let mut files = vec![(MAIN.to_owned(), "- !include d1.yaml\n".to_owned())];
    for i in 1..=9 {
        files.push((
            format!("/etc/mprov/d{i}.yaml"),
            format!("- !include d{}.yaml\n", i + 1),
        ));
    }
    files.push(("/etc/mprov/d10.yaml".into(), "- global: {}\n".into()));
    let memory = Memory::new(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let e = load(Path::new(MAIN), &memory).unwrap_err().to_string();
    assert!(
        e.starts_with("/etc/mprov/d8.yaml:1:") && e.contains("more than 8"),
        "{e}"
    );
    // Eight deep is fine.
    files.truncate(9);
    files.push(("/etc/mprov/d8.yaml".into(), "- global: {}\n".into()));
    let memory = Memory::new(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    load(Path::new(MAIN), &memory).unwrap();
}

#[test]
fn a_glob_may_match_nothing_and_files_may_be_empty() {
    let config = load_files(&[
        (
            MAIN,
            "# nothing but\n- !include plugins/*.yaml\n- !include none/*.yaml\n",
        ),
        ("/etc/mprov/plugins/empty.yaml", "# comments only\n"),
    ])
    .unwrap();
    assert_eq!(config, Config::default());
    let e = error(&[(MAIN, "- !include a*/x.yaml\n")]);
    assert!(e.contains("only the file name"), "{e}");
}

#[test]
fn addresses_take_both_forms() {
    let config = load_files(&[(
        MAIN,
        "- global:\n    addresses:\n      - 172.16.0.5\n      - address: 10.20.0.5\n        network: 3\n        mprovURL: \"http://10.20.0.1/\"\n",
    )])
    .unwrap();
    let addresses = config.addresses.unwrap();
    assert_eq!(addresses[0], "172.16.0.5".parse().unwrap());
    assert_eq!(addresses[1].network, Some(3));
    assert_eq!(addresses[1].mprov_url.as_deref(), Some("http://10.20.0.1/"));
    let none = load_files(&[(MAIN, "- global:\n    addresses: []\n")]).unwrap();
    assert_eq!(none.addresses, Some(vec![]));
    let e = error(&[(
        MAIN,
        "- global:\n    addresses:\n      - 10.0.0.1\n      - nowhere\n",
    )]);
    assert!(e.starts_with("/etc/mprov/jobserver.yaml:4:"), "{e}");
    let e = error(&[(
        MAIN,
        "- global:\n    addresses:\n      - address: 10.0.0.1\n        net: 3\n",
    )]);
    assert!(e.starts_with("/etc/mprov/jobserver.yaml:4:"), "{e}");
}

#[test]
fn wildcards_match_file_names() {
    let check =
        |p: &str, n: &str, expected: bool| assert_eq!(wildcard_match(p, n), expected, "{p} {n}");
    check("*.yaml", "dnsmasq.yaml", true);
    check("*.yaml", "dnsmasq.yml", false);
    check("*", "", true);
    check("a?c", "abc", true);
    check("a*b*c", "axxbyyc", true);
    check("a*b*c", "axxbyy", false);
    check("*x*", "yyy", false);
}

#[test]
fn rendered_file_loads_back() {
    let env = render::Environment::from_lookup(|name| match name {
        "MPROV_URL" => Some("http://10.0.0.1:8080/".into()),
        "MPROV_APIKEY" => Some("a'b\"c: #d".into()),
        "MPROV_ADDRESS" => Some("10.0.0.2".into()),
        "MPROV_MODS" => Some(" dnsmasq  mprov-webserver ".into()),
        _ => None,
    });
    assert!(env.is_set());
    let text = render::text(&env, 15);
    assert!(text.starts_with("# Written by mprov-jobserver"), "{text}");
    assert!(
        text.trim_end().ends_with("- !include plugins/*.yaml"),
        "{text}"
    );
    let config = load_text(Path::new(MAIN), &text, &Memory::default()).unwrap();
    assert_eq!(config.apikey.as_deref(), Some("a'b\"c: #d"));
    assert_eq!(config.mprov_url.as_deref(), Some("http://10.0.0.1:8080/"));
    assert_eq!(
        config.modules,
        Some(vec!["dnsmasq".into(), "mprov-webserver".into()])
    );
    assert_eq!(config.heartbeat_interval, Some(15));
    assert!(!render::Environment::from_lookup(|_| None).is_set());
}

/// Replays the fuzz corpus on stable, with every line-prefix of each seed
/// as a cheap stand-in for the fuzzer.
#[test]
fn fuzz_corpus_replays() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/corpus/jobserver_config");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).expect("the jobserver_config corpus") {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        fuzz::fuzz_config(&data);
        for (i, _) in data
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n' || **b == b':')
        {
            fuzz::fuzz_config(&data[..i]);
        }
        seeds += 1;
    }
    assert!(seeds >= 4, "corpus has only {seeds} files");
}
