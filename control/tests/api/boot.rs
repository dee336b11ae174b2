//! The boot timeline, the boot manifest and `/ipxe/`'s defences, on every
//! engine: job servers write events for nodes with their own certificate,
//! a node writes and reads only its own, `/ipxe/` hands a nonce only to an
//! attested request, each new nonce cancels the earlier ones, a replayed
//! nonce is refused and lands on the timeline, and `/ipxe/` is rate-limited.

use axum::http::StatusCode;
use mprov_api::boot::{
    BatchOutcome, BootEvent, BootManifest, EVENTS_BATCH_PATH, EVENTS_PATH, ImageFile,
    MANIFEST_PATH, MAX_BATCH, image_file_url, jobserver_base_url,
};
use mprov_control::db::{Engine, Val};
use serde_json::{Value, json};

use crate::common::Ctx;
use crate::scopes::{
    Cred, SHA, attest, csr, ctx_with_signer, der_of, enroll_jobserver, ipxe, nonce_for, send,
};

const C01: &str = "52:54:00:12:00:01";
const C02: &str = "52:54:00:12:00:02";

/// Where job server `host`, on the default port, serves `file` of image
/// `compute` version 1.
pub(crate) fn compute_url(host: &str, file: ImageFile) -> String {
    image_file_url(&jobserver_base_url(host, None), "compute", 1, file)
}

fn events(v: &Value) -> Vec<BootEvent> {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
}

pub(crate) async fn boot_timeline_manifest_and_nonces(engine: Engine) {
    let (c, _tls) = ctx_with_signer(engine).await;
    let prov = c
        .post(
            "networks",
            json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 24}),
        )
        .await;
    let other = c
        .post(
            "networks",
            json!({"slug": "other", "subnet": "10.9.0.0", "netmask": 24}),
        )
        .await;
    let mut hosts = Vec::new();
    for (name, addr, net) in [
        ("js1", "10.0.0.2", &prov),
        ("js2", "10.0.0.3", &prov),
        ("js3", "10.9.0.2", &other),
    ] {
        let js = c
            .post(
                "jobservers",
                json!({"name": name, "addresses": [addr], "network": net["id"]}),
            )
            .await;
        hosts.push(js["id"].clone());
    }
    // What each last reported: js2 is the least loaded.
    for (name, load) in [("js1", 2.5), ("js2", 0.5), ("js3", 0.0)] {
        let db = &c.state.db;
        let mut sql = db.sql();
        sql.push("UPDATE jobservers SET load_avg = ")
            .bind(mprov_control::db::Val::Float(Some(load)))
            .push(" WHERE name = ")
            .bind(mprov_control::db::Val::Text(Some(name.into())));
        sql.query().execute(db.pool()).await.unwrap();
    }
    c.post(
        "groups",
        json!({"slug": "serial", "install_kernel_cmdline": "console=ttyS0,115200"}),
    )
    .await;
    c.post(
        "images",
        json!({"slug": "compute", "rootfs_sha256": SHA, "rootfs_size": 4242,
            "install_kernel_cmdline": "quiet", "tmpfs_root_size": 3, "jobservers": hosts}),
    )
    .await;
    for (host, mac) in [("c01", C01), ("c02", C02)] {
        c.post(
            "systems",
            json!({"hostname": host, "image": "compute", "groups": ["serial"],
                "nics": [{"mac": mac, "network": "prov", "bootable": true}]}),
        )
        .await;
    }

    // The job server's own certificate.
    let js1 = Cred::Cert(enroll_jobserver(&c, "js1").await);

    // The job server reports the lease; the event names the node.
    let (status, ev) = send(
        &c.app,
        "POST",
        EVENTS_PATH,
        &js1,
        Some(json!({"phase": "dhcp_acked", "mac": C01, "ip": "10.0.0.50"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{ev}");
    assert_eq!(ev["source"], "jobserver:js1");
    assert_eq!(ev["hostname"], "c01");
    let (status, v) = send(
        &c.app,
        "POST",
        EVENTS_PATH,
        &js1,
        Some(json!({"phase": "ready", "mac": C01})),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a job server does not report ready: {v}"
    );
    let (status, _) = send(
        &c.app,
        "POST",
        EVENTS_PATH,
        &Cred::None,
        Some(json!({"phase": "dhcp_acked", "mac": C01, "ip": "10.0.0.50"})),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "anonymous events are refused"
    );

    // The script: js2 (least loaded) then js1 on the node's network, never
    // js3; the layered arguments, then the agent's.
    let (status, script) = ipxe(&c.app, C01).await;
    assert_eq!(status, StatusCode::OK);
    let script = script.as_str().unwrap().to_owned();
    let first = script
        .find(&compute_url("10.0.0.3", ImageFile::Kernel))
        .expect(&script);
    let second = script
        .find(&compute_url("10.0.0.2", ImageFile::Kernel))
        .expect(&script);
    assert!(first < second, "{script}");
    assert!(!script.contains("10.9.0.2"), "{script}");
    for arg in [
        "initrd=initramfs.img",
        "console=ttyS0,115200",
        "quiet",
        "mprov_image=compute:1",
        &format!("mprov_mac={C01}"),
        "mprov_url=",
        "mprov_ca=",
    ] {
        assert!(
            script.contains(&format!(" {arg}")),
            "{arg} missing: {script}"
        );
    }
    let first_nonce = script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("mprov_enroll="))
        .unwrap()
        .to_owned();

    // Each new nonce cancels the earlier ones.
    let second_nonce = nonce_for(&c, C01).await;
    let enroll = |nonce: &str| {
        let app = c.app.clone();
        let body = json!({"nonce": nonce, "csr": csr()});
        async move { send(&app, "POST", "/enroll/node/", &Cred::None, Some(body)).await }
    };
    let (status, v) = enroll(&first_nonce).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "an earlier nonce: {v}");
    let (status, v) = enroll(&second_nonce).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let node1 = Cred::Cert(der_of(v["certificate"].as_str().unwrap()));
    let node2 = {
        let n = nonce_for(&c, C02).await;
        let (status, v) = enroll(&n).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        Cred::Cert(der_of(v["certificate"].as_str().unwrap()))
    };
    // One live nonce per system, whatever was asked before.
    {
        let r = sqlx::query("SELECT COUNT(*) AS n FROM enroll_nonces WHERE used_at IS NULL")
            .fetch_one(c.state.db.pool())
            .await
            .unwrap();
        assert_eq!(mprov_control::db::int(&r, "n").unwrap(), 0);
    }

    // The node writes its own steps; another node's are refused.
    for phase in ["enrolled", "image_started", "verified", "switch_root"] {
        let (status, v) = send(
            &c.app,
            "POST",
            EVENTS_PATH,
            &node1,
            Some(json!({"phase": phase, "detail": "step"})),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        assert_eq!(v["source"], "node:c01");
    }
    for body in [
        json!({"phase": "ready", "system": "c02"}),
        json!({"phase": "ready", "mac": C02}),
    ] {
        let (status, v) = send(&c.app, "POST", EVENTS_PATH, &node1, Some(body)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    }
    let (status, _) = send(
        &c.app,
        "POST",
        EVENTS_PATH,
        &node1,
        Some(json!({"phase": "dhcp_acked", "ip": "10.0.0.50"})),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a node cannot attest itself"
    );
    let (status, _) = send(
        &c.app,
        "GET",
        &format!("{EVENTS_PATH}?system=c02"),
        &node1,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (_, v) = send(
        &c.app,
        "GET",
        &format!("{EVENTS_PATH}?system=c02"),
        &Cred::Key(c.key.clone()),
        None,
    )
    .await;
    assert!(
        events(&v).iter().all(|e| e.source != "node:c01"),
        "c02's timeline holds nothing c01 wrote: {v}"
    );

    // The manifest: the recorded checksum, js2 then js1, the tmpfs size.
    let (status, m) = send(&c.app, "GET", MANIFEST_PATH, &node1, None).await;
    assert_eq!(status, StatusCode::OK, "{m}");
    let m: BootManifest = serde_json::from_value(m).unwrap();
    assert_eq!((m.image.as_str(), m.version, m.size), ("compute", 1, 4242));
    assert_eq!(m.sha256, SHA);
    assert_eq!(
        m.sources,
        [
            compute_url("10.0.0.3", ImageFile::Rootfs),
            compute_url("10.0.0.2", ImageFile::Rootfs)
        ]
    );
    assert_eq!(m.tmpfs_size.as_deref(), Some("3G"));
    let (status, _) = send(
        &c.app,
        "GET",
        &format!("{MANIFEST_PATH}?system=c01"),
        &node2,
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "c02 cannot read c01's manifest"
    );

    // The replayed nonce: refused, and on c01's timeline.
    let (status, v) = enroll(&second_nonce).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    let (status, v) = send(&c.app, "GET", EVENTS_PATH, &node1, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let timeline = events(&v);
    let phases: Vec<&str> = timeline.iter().map(|e| e.phase.as_str()).collect();
    assert_eq!(
        phases,
        [
            "script_served",
            "enrolled",
            "image_started",
            "verified",
            "switch_root",
            "failed"
        ],
        "the last boot, in order (the second script_served started it): {v}"
    );
    assert!(
        timeline.last().unwrap().detail.contains("already used"),
        "{v}"
    );

    // Ready ends the boot: the next DHCP starts a new one.
    let (status, ready) = send(
        &c.app,
        "POST",
        EVENTS_PATH,
        &node1,
        Some(json!({"phase": "ready"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{ready}");
    let (_, next) = send(
        &c.app,
        "POST",
        EVENTS_PATH,
        &js1,
        Some(json!({"phase": "dhcp_offered", "mac": C01, "ip": "10.0.0.50"})),
    )
    .await;
    assert_ne!(next["boot_id"], ready["boot_id"]);
    let (_, all) = send(
        &c.app,
        "GET",
        &format!("{EVENTS_PATH}?system=c01&boot=all"),
        &Cred::Key(c.key.clone()),
        None,
    )
    .await;
    assert_eq!(events(&all).len(), 11, "{all}");
    let (_, latest) = send(&c.app, "GET", EVENTS_PATH, &Cred::Key(c.key.clone()), None).await;
    let latest = events(&latest);
    assert_eq!(latest.len(), 2, "one line per node: {latest:?}");

    boot_events_in_batches(&c, &node1, &node2, &js1).await;
    c.cleanup().await;
}

/// What a batch's answer says was refused: (place, status).
fn refused(v: &Value) -> Vec<(usize, u16)> {
    let outcome: BatchOutcome =
        serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"));
    outcome
        .refused
        .iter()
        .map(|r| (r.index, r.status))
        .collect()
}

/// `EVENTS_BATCH_PATH`: each event of a batch is judged as it would be
/// alone; the refused ones are named by their place, the others stored in
/// order; each counts against the reporter's budget, all or none.
async fn boot_events_in_batches(c: &Ctx, node1: &Cred, node2: &Cred, js1: &Cred) {
    let timeline = |host: &'static str| {
        let app = c.app.clone();
        let key = Cred::Key(c.key.clone());
        async move {
            let (_, all) = send(
                &app,
                "GET",
                &format!("{EVENTS_PATH}?system={host}&boot=all"),
                &key,
                None,
            )
            .await;
            events(&all)
        }
    };
    let c02_before = timeline("c02").await.len();
    // A node: naming another node, or a job server's phase, is refused;
    // its own steps around them are stored, in order.
    let (status, v) = send(
        &c.app,
        "POST",
        EVENTS_BATCH_PATH,
        node1,
        Some(json!([
            {"phase": "progress", "detail": "batch: first"},
            {"phase": "progress", "system": "c02", "detail": "batch: not mine"},
            {"phase": "dhcp_acked", "detail": "batch: not a node's"},
            {"phase": "verified", "detail": "batch: last"},
        ])),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["stored"], 2, "{v}");
    assert_eq!(refused(&v), [(1, 403), (2, 400)], "{v}");
    let c01 = timeline("c01").await;
    let tail: Vec<(&str, &str)> = c01[c01.len() - 2..]
        .iter()
        .map(|e| (e.phase.as_str(), e.detail.as_str()))
        .collect();
    assert_eq!(
        tail,
        [("progress", "batch: first"), ("verified", "batch: last")]
    );
    assert!(
        c01.iter()
            .all(|e| e.source != "node:c01" || e.hostname.as_deref() == Some("c01"))
    );
    assert_eq!(
        timeline("c02").await.len(),
        c02_before,
        "nothing written for c02"
    );

    // A job server: a lease outside its network is refused, the rest kept.
    let (status, v) = send(
        &c.app,
        "POST",
        EVENTS_BATCH_PATH,
        js1,
        Some(json!([
            {"phase": "dhcp_acked", "mac": C02, "ip": "10.0.0.51"},
            {"phase": "dhcp_acked", "mac": C02, "ip": "10.9.0.60"},
            {"phase": "kernel_fetched", "system": "c02"},
        ])),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["stored"], 2, "{v}");
    let refusals = refused(&v);
    assert_eq!(refusals.len(), 1, "{v}");
    assert_eq!(refusals[0].0, 1, "{v}");
    assert!((400..500).contains(&refusals[0].1), "{v}");
    let c02: Vec<String> = timeline("c02")
        .await
        .iter()
        .skip(c02_before)
        .map(|e| {
            format!(
                "{} {}",
                e.phase.as_str(),
                e.ip.map(|i| i.to_string()).unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(c02, ["dhcp_acked 10.0.0.51", "kernel_fetched "], "{c02:?}");

    // Empty, too long, anonymous: refused whole.
    let too_many: Vec<Value> = (0..=MAX_BATCH)
        .map(|_| json!({"phase": "progress"}))
        .collect();
    for (body, cred, want) in [
        (json!([]), node2, StatusCode::BAD_REQUEST),
        (Value::Array(too_many), node2, StatusCode::BAD_REQUEST),
        (
            json!([{"phase": "progress"}]),
            &Cred::None,
            StatusCode::UNAUTHORIZED,
        ),
    ] {
        let (status, v) = send(&c.app, "POST", EVENTS_BATCH_PATH, cred, Some(body)).await;
        assert_eq!(status, want, "{v}");
    }
    assert_eq!(timeline("c02").await.len(), c02_before + 2);

    // The budget (120 a minute by default) counts each event: a full
    // batch fits, the next finds too few tokens and stores nothing.
    let full: Vec<Value> = (0..MAX_BATCH)
        .map(|i| json!({"phase": "progress", "detail": format!("{i}")}))
        .collect();
    let (status, v) = send(
        &c.app,
        "POST",
        EVENTS_BATCH_PATH,
        node2,
        Some(Value::Array(full.clone())),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["stored"], MAX_BATCH, "{v}");
    let (status, v) = send(
        &c.app,
        "POST",
        EVENTS_BATCH_PATH,
        node2,
        Some(Value::Array(full)),
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(timeline("c02").await.len(), c02_before + 2 + MAX_BATCH);
}

/// Nonce farming: one MAC asking again and again, and many MACs at once,
/// get 429 with a retry script beyond the limit.
pub(crate) async fn ipxe_rate_limits(engine: Engine) {
    let c = crate::common::Ctx::with_args(
        engine,
        &["--ipxe-limit-per-mac", "3", "--ipxe-limit-total", "100"],
    )
    .await;
    let ask = |mac: String| {
        let app = c.app.clone();
        async move { ipxe(&app, &mac).await }
    };
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        set.spawn(ask(C01.into()));
    }
    let mut statuses = Vec::new();
    while let Some(r) = set.join_next().await {
        let (status, body) = r.unwrap();
        if status == StatusCode::TOO_MANY_REQUESTS {
            let body = body.as_str().unwrap();
            assert!(
                body.starts_with("#!ipxe\n") && body.contains("chain "),
                "{body}"
            );
        }
        statuses.push(status);
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert!(
        ok <= 4,
        "one MAC got {ok} of 8 through a limit of 3 a minute: {statuses:?}"
    );
    assert!(statuses.contains(&StatusCode::TOO_MANY_REQUESTS));
    // In total: 100 a minute, bursting to 10.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..60 {
        set.spawn(ask(format!("52:54:00:13:00:{i:02x}")));
    }
    let mut refused = 0;
    while let Some(r) = set.join_next().await {
        if r.unwrap().0 == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
        }
    }
    assert!(refused > 0, "60 MACs at once all got through a total limit");
    c.cleanup().await;
}

/// curl, with the status code on the last line; the body and the status.
fn curl(args: &[&str]) -> (String, u16) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}", "-H"])
        .arg(mprov_api::version_header_line())
        .args(args)
        .output()
        .expect("curl must be installed");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (body.to_owned(), code.trim().parse().unwrap_or(0))
}

/// A key and a CSR (PEM) for `cn`, written to `dir/<name>.key`.
fn key_and_csr(dir: &std::path::Path, name: &str, cn: &str) -> (std::path::PathBuf, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    let csr = p.serialize_request(&key).unwrap().pem().unwrap();
    let path = dir.join(format!("{name}.key"));
    std::fs::write(&path, key.serialize_pem()).unwrap();
    (path, csr)
}

/// The attacks on `/ipxe/` and enrollment against the real `serve`,
/// from loopback with curl: an unattested `/ipxe/` gets no nonce and says
/// nothing about the MAC; once the job server (its own certificate, over
/// HTTPS) reported the lease, each nonce cancels the one before; farming one
/// MAC gets 429; a node cannot write another node's timeline.
pub(crate) fn attacks_on_the_real_service(dir: &std::path::Path, db_url: &str) {
    let s = crate::process::Server::start(dir, db_url, 1, &[("MPROV_IPXE_LIMIT_PER_MAC", "6")]);
    let http = format!("http://127.0.0.1:{}", s.port);
    let https = format!("https://127.0.0.1:{}", s.https_port);
    let ca = dir.join("var/tls/ca.crt");
    let ca = ca.to_str().unwrap();
    let key = std::fs::read_to_string(dir.join("etc/apikey")).unwrap();
    let key = key
        .trim()
        .trim_start_matches("export MPROV_APIKEY=")
        .to_owned();
    let admin = format!("Authorization: Api-Key {key}");
    let post = |path: &str, body: Value| {
        curl(&[
            "-H",
            &admin,
            "-H",
            "Content-Type: application/json",
            "-d",
            &body.to_string(),
            &format!("{http}{path}"),
        ])
    };
    for (path, body) in [
        (
            "/api/v1/networks/",
            json!({"slug": "lo", "subnet": "127.0.0.0", "netmask": 8}),
        ),
        (
            "/api/v1/jobservers/",
            json!({"name": "js1", "addresses": ["127.0.0.1"], "network": "lo"}),
        ),
        (
            "/api/v1/images/",
            json!({"slug": "compute", "rootfs_sha256": SHA, "rootfs_size": 1, "jobservers": ["js1"]}),
        ),
        (
            "/api/v1/systems/",
            json!({"hostname": "c01", "image": "compute", "nics": [{"mac": C01, "network": "lo"}]}),
        ),
        (
            "/api/v1/systems/",
            json!({"hostname": "c02", "image": "compute", "nics": [{"mac": C02, "network": "lo"}]}),
        ),
    ] {
        let (body, code) = post(path, body);
        assert_eq!(code, 201, "{path}: {body}");
    }
    let ipxe = |mac: &str| curl(&["-i", &format!("{http}/ipxe/?mac={mac}")]);
    let body_of = |r: &str| {
        r.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default()
    };

    // Unattested: no nonce, and the same answer as for an unknown MAC.
    let (known, code) = ipxe(C01);
    assert_eq!(code, 200, "{known}");
    let (unknown, _) = ipxe("52:54:00:12:00:99");
    assert!(
        !known.contains("mprov_enroll"),
        "an unattested request got a nonce: {known}"
    );
    assert_eq!(
        body_of(&known),
        body_of(&unknown),
        "the answer tells whether a MAC is known"
    );

    // The job server enrolls with a token made for it, and reports the
    // lease over HTTPS with its own certificate.
    let (v, code) = post("/api/v1/enroll-tokens/", json!({"name": "js1"}));
    assert_eq!(code, 200, "{v}");
    let v: Value = serde_json::from_str(&v).unwrap();
    let token = v["token"].as_str().unwrap().to_owned();
    let (js_key, csr) = key_and_csr(dir, "js1", "js1");
    let (v, code) = post(
        "/enroll/jobserver/",
        json!({"token": token.trim(), "name": "js1", "csr": csr}),
    );
    assert_eq!(code, 200, "{v}");
    let v: Value = serde_json::from_str(&v).unwrap();
    let js_crt = dir.join("js1.crt");
    std::fs::write(&js_crt, v["certificate"].as_str().unwrap()).unwrap();
    let as_cert = |crt: &std::path::Path,
                   k: &std::path::Path,
                   method: &str,
                   path: &str,
                   body: Option<Value>| {
        let mut args = vec![
            "--cacert".to_owned(),
            ca.to_owned(),
            "--cert".to_owned(),
            crt.to_str().unwrap().to_owned(),
            "--key".to_owned(),
            k.to_str().unwrap().to_owned(),
            "-X".to_owned(),
            method.to_owned(),
        ];
        if let Some(b) = body {
            args.extend([
                "-H".into(),
                "Content-Type: application/json".into(),
                "-d".into(),
                b.to_string(),
            ]);
        }
        args.push(format!("{https}{path}"));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        curl(&refs)
    };
    for mac in [C01, C02] {
        let (v, code) = as_cert(
            &js_crt,
            &js_key,
            "POST",
            EVENTS_PATH,
            Some(json!({"phase": "dhcp_acked", "mac": mac, "ip": "127.0.0.1"})),
        );
        assert_eq!(code, 201, "{v}");
    }

    // Attested: a nonce; the next one cancels it.
    let nonce = |r: &str| {
        r.split_whitespace()
            .find_map(|w| w.strip_prefix("mprov_enroll="))
            .unwrap_or_else(|| panic!("no nonce in {r}"))
            .to_owned()
    };
    let first = nonce(&ipxe(C01).0);
    let second = nonce(&ipxe(C01).0);
    let (k01, csr01) = key_and_csr(dir, "c01", "c01");
    let (v, code) = post("/enroll/node/", json!({"nonce": first, "csr": csr01}));
    assert_eq!(code, 401, "the earlier nonce still enrolled: {v}");
    let (v, code) = post("/enroll/node/", json!({"nonce": second, "csr": csr01}));
    assert_eq!(code, 200, "{v}");
    let v: Value = serde_json::from_str(&v).unwrap();
    let c01_crt = dir.join("c01.crt");
    std::fs::write(&c01_crt, v["certificate"].as_str().unwrap()).unwrap();

    // A node writing another node's timeline: refused, nothing stored.
    let (v, code) = as_cert(
        &c01_crt,
        &k01,
        "POST",
        EVENTS_PATH,
        Some(json!({"phase": "ready", "system": "c02"})),
    );
    assert_eq!(code, 403, "{v}");
    let (v, code) = as_cert(
        &c01_crt,
        &k01,
        "GET",
        &format!("{EVENTS_PATH}?system=c02"),
        None,
    );
    assert_eq!(code, 403, "{v}");
    let (v, _) = curl(&["-H", &admin, &format!("{http}{EVENTS_PATH}?system=c02")]);
    assert!(!v.contains("ready") && !v.contains("node:c01"), "{v}");
    // Its own timeline and manifest it reads.
    let (v, code) = as_cert(&c01_crt, &k01, "GET", MANIFEST_PATH, None);
    assert_eq!(code, 200, "{v}");
    assert!(
        v.contains(SHA) && v.contains(&compute_url("127.0.0.1", ImageFile::Rootfs)),
        "{v}"
    );

    // Farming one MAC: 429 with a retry script beyond the limit.
    let mut codes = Vec::new();
    for _ in 0..10 {
        let (r, code) = ipxe(C02);
        if code == 429 {
            assert!(
                r.contains("Retry-After") || r.contains("retry-after"),
                "{r}"
            );
            assert!(body_of(&r).starts_with("#!ipxe\n"), "{r}");
        }
        codes.push(code);
    }
    assert!(
        codes.contains(&429),
        "10 requests for one MAC, none refused: {codes:?}"
    );
    drop(s);
}

/// How many enrollment nonces were ever minted for the system `host`
/// (spent, cancelled or live).
async fn nonces_of(c: &Ctx, host: &str) -> i64 {
    let db = &c.state.db;
    let mut q = db.sql();
    q.push("SELECT COUNT(*) AS n FROM enroll_nonces e JOIN systems s ON s.id = e.system_id WHERE s.hostname = ")
        .bind(Val::Text(Some(host.to_owned())));
    let r = q.query().fetch_one(db.pool()).await.unwrap();
    mprov_control::db::int(&r, "n").unwrap()
}

/// `/ipxe/` for `mac` (attested) answers the retry script saying `why`,
/// with no nonce: none is minted for `host`.
async fn ipxe_refuses(c: &Ctx, app: &axum::Router, mac: &str, host: &str, why: &str) -> String {
    let before = nonces_of(c, host).await;
    let (status, script) = ipxe(app, mac).await;
    assert_eq!(status, StatusCode::OK, "{script}");
    let script = script.as_str().unwrap().to_owned();
    let lines: Vec<&str> = script.lines().collect();
    assert_eq!(lines.len(), 4, "a retry script: {script}");
    assert!(
        lines[0] == "#!ipxe"
            && lines[1].starts_with("echo mProv: ")
            && lines[2].starts_with("sleep "),
        "{script}"
    );
    assert!(
        lines[3].starts_with("chain ") && lines[3].contains("/ipxe/?mac="),
        "{script}"
    );
    assert!(lines[1].contains(why), "{why:?} not in {script}");
    for word in lines[1].split_whitespace() {
        assert!(
            !matches!(word, ";" | "&&" | "||") && !word.starts_with('#'),
            "the message adds a command: {script}"
        );
    }
    assert!(!script.contains("mprov_enroll"), "{script}");
    assert_eq!(
        nonces_of(c, host).await,
        before,
        "a nonce was minted: {script}"
    );
    script
}

/// The manifest of `host`, read as the admin, is refused (409) saying `why`.
async fn manifest_refuses(c: &Ctx, host: &str, why: &str, field: Option<&str>) {
    let (status, v) = send(
        &c.app,
        "GET",
        &format!("{MANIFEST_PATH}?system={host}"),
        &Cred::Key(c.key.clone()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains(why),
        "{why:?} not in {v}"
    );
    assert_eq!(v["field"].as_str(), field, "{v}");
}

/// One bootability rule for `/ipxe/` and the manifest: a checksum that
/// parses as a SHA-256 (and a malformed one refused when written), a size
/// above zero, a job server on the node's network hosting the version. Each
/// refusal is the retry script with its reason, and no nonce is minted.
pub(crate) async fn bootability_one_rule(engine: Engine) {
    let (c, _tls) = ctx_with_signer(engine).await;
    c.post(
        "networks",
        json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 24}),
    )
    .await;
    c.post(
        "networks",
        json!({"slug": "other", "subnet": "10.9.0.0", "netmask": 24}),
    )
    .await;
    c.post(
        "jobservers",
        json!({"name": "js1", "addresses": ["10.0.0.2"], "network": "prov"}),
    )
    .await;
    c.post(
        "jobservers",
        json!({"name": "js9", "addresses": ["10.9.0.2"], "network": "other"}),
    )
    .await;
    c.post(
        "images",
        json!({"slug": "compute", "rootfs_sha256": SHA, "rootfs_size": 4242, "jobservers": ["js1"]}),
    )
    .await;
    c.post(
        "systems",
        json!({"hostname": "c01", "image": "compute",
            "nics": [{"mac": C01, "network": "prov", "bootable": true}]}),
    )
    .await;
    attest(&c, C01).await;

    // A malformed checksum is refused when written, and nothing changes.
    let rev = c.revision().await;
    for bad in [
        "abc".to_owned(),
        "g".repeat(64),
        SHA[..63].to_owned(),
        format!("{SHA}0"),
        format!(" {}", &SHA[1..]),
    ] {
        let (status, v) = c
            .call(
                "PATCH",
                "/api/v1/images/compute",
                Some(json!({"rootfs_sha256": bad})),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {v}");
        assert_eq!(v["field"], "rootfs_sha256", "{v}");
        assert!(v["message"].as_str().unwrap().contains("SHA-256"), "{v}");
        let (status, v) = c
            .call(
                "POST",
                "/api/v1/images/",
                Some(json!({"slug": "other", "rootfs_sha256": bad})),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {v}");
    }
    assert_eq!(c.revision().await, rev, "a refused write wrote nothing");
    // Upper case is a SHA-256 too, kept in lower case.
    let img = c
        .patch(
            "/api/v1/images/compute",
            json!({"rootfs_sha256": SHA.to_ascii_uppercase()}),
        )
        .await;
    assert_eq!(img["rootfs_sha256"], SHA);

    // 1. The checksum parses: none recorded, or a malformed one written
    // before it was checked (straight into the table), is refused.
    c.patch("/api/v1/images/compute", json!({"rootfs_sha256": ""}))
        .await;
    let why = "has no recorded rootfs checksum";
    ipxe_refuses(&c, &c.app, C01, "c01", why).await;
    manifest_refuses(&c, "c01", why, Some("rootfs_sha256")).await;
    {
        let db = &c.state.db;
        let mut q = db.sql();
        q.push("UPDATE system_images SET rootfs_sha256 = ")
            .bind(Val::Text(Some("not-a-sha".into())))
            .push(" WHERE slug = ")
            .bind(Val::Text(Some("compute".into())));
        q.query().execute(db.pool()).await.unwrap();
    }
    let why = "\"not-a-sha\" is not a SHA-256";
    ipxe_refuses(&c, &c.app, C01, "c01", why).await;
    manifest_refuses(&c, "c01", why, Some("rootfs_sha256")).await;
    c.patch("/api/v1/images/compute", json!({"rootfs_sha256": SHA}))
        .await;

    // 2. The size is above zero.
    c.patch("/api/v1/images/compute", json!({"rootfs_size": 0}))
        .await;
    let why = "has a rootfs size of 0";
    ipxe_refuses(&c, &c.app, C01, "c01", why).await;
    manifest_refuses(&c, "c01", why, Some("rootfs_size")).await;
    c.patch("/api/v1/images/compute", json!({"rootfs_size": 4242}))
        .await;

    // 3. A job server on the node's network hosts the version: none at all,
    // then only one on another network.
    let why = "is on no job server of this node's network";
    for hosts in [json!([]), json!(["js9"])] {
        c.patch("/api/v1/images/compute", json!({"jobservers": hosts}))
            .await;
        ipxe_refuses(&c, &c.app, C01, "c01", why).await;
        manifest_refuses(&c, "c01", why, None).await;
    }

    // All three hold again: a boot script with a nonce, and a manifest. The
    // nonce count moves, so the checks above could have seen one.
    c.patch(
        "/api/v1/images/compute",
        json!({"jobservers": ["js1", "js9"]}),
    )
    .await;
    assert_eq!(nonces_of(&c, "c01").await, 0);
    let (status, script) = ipxe(&c.app, C01).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        script.as_str().unwrap().contains("mprov_enroll="),
        "{script}"
    );
    assert!(!script.as_str().unwrap().contains("10.9.0.2"), "{script}");
    assert_eq!(nonces_of(&c, "c01").await, 1);
    let (status, m) = send(
        &c.app,
        "GET",
        &format!("{MANIFEST_PATH}?system=c01"),
        &Cred::Key(c.key.clone()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{m}");
    let m: BootManifest = serde_json::from_value(m).unwrap();
    assert_eq!((m.sha256.as_str(), m.size), (SHA, 4242));
    assert_eq!(m.sources, [compute_url("10.0.0.2", ImageFile::Rootfs)]);
    c.cleanup().await;
}

/// Every refusal on the `/ipxe/` path is a retry script with its reason,
/// never a 500, and mints no nonce: iPXE's command separators in a kernel
/// command line, a job server's address unfit for a script, no CA
/// certificate to pin.
pub(crate) async fn ipxe_refusals_are_retry_scripts(engine: Engine) {
    let (c, _tls) = ctx_with_signer(engine).await;
    c.post(
        "networks",
        json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 24}),
    )
    .await;
    c.post(
        "jobservers",
        json!({"name": "js1", "addresses": ["10.0.0.2"], "network": "prov"}),
    )
    .await;
    c.post(
        "images",
        json!({"slug": "compute", "rootfs_sha256": SHA, "rootfs_size": 1, "jobservers": ["js1"]}),
    )
    .await;
    c.post(
        "groups",
        json!({"slug": "serial", "install_kernel_cmdline": "console=ttyS0 ; chain http://x/"}),
    )
    .await;
    c.post(
        "systems",
        json!({"hostname": "c01", "image": "compute", "groups": ["serial"], "nics": [{"mac": C01, "network": "prov"}]}),
    )
    .await;
    attest(&c, C01).await;

    // A second command smuggled into the kernel command line: the retry
    // script names the argument, and runs no `chain http://x/`.
    for line in [
        "console=ttyS0 ; chain http://x/",
        "console=ttyS0 && chain http://x/",
        "console=ttyS0 || chain http://x/",
        "console=ttyS0;chain http://x/",
    ] {
        c.patch(
            "/api/v1/groups/serial",
            json!({"install_kernel_cmdline": line}),
        )
        .await;
        let script = ipxe_refuses(&c, &c.app, C01, "c01", "fix install_kernel_cmdline").await;
        assert!(
            script.lines().all(|l| !l.starts_with("chain http://x/")),
            "{script}"
        );
    }
    c.patch(
        "/api/v1/groups/serial",
        json!({"install_kernel_cmdline": "console=ttyS0"}),
    )
    .await;

    // A job server's address that would change the script.
    c.patch(
        "/api/v1/jobservers/js1",
        json!({"addresses": ["10.0.0.2;reboot"]}),
    )
    .await;
    ipxe_refuses(&c, &c.app, C01, "c01", "job server js1: its address").await;
    c.patch("/api/v1/jobservers/js1", json!({"addresses": ["10.0.0.2"]}))
        .await;

    // The same service without its CA certificate: nothing to pin.
    let no_ca = mprov_control::http::router(std::sync::Arc::new(crate::common::inner(
        c.state.db.clone(),
        c.state.config.clone(),
    )));
    ipxe_refuses(&c, &no_ca, C01, "c01", "no CA certificate").await;

    // Fixed, it boots, with the group's argument.
    let (status, script) = ipxe(&c.app, C01).await;
    assert_eq!(status, StatusCode::OK);
    let script = script.as_str().unwrap();
    assert!(
        script.contains("mprov_enroll=") && script.contains(" console=ttyS0 "),
        "{script}"
    );
    assert_eq!(nonces_of(&c, "c01").await, 1);
    c.cleanup().await;
}

/// The node view costs a fixed number of statements: a system in 50 groups
/// (each with a script) as many as one in 1 group.
pub(crate) async fn node_view_statements_do_not_grow_with_groups(engine: Engine) {
    use mprov_control::netboot::{Lookup, NodeKey, view};

    let c = crate::common::Ctx::new(engine).await;
    c.post(
        "distros",
        json!({"slug": "deb", "install_kernel_cmdline": "quiet"}),
    )
    .await;
    let mut rows = Vec::new();
    for name in ["js1", "js2"] {
        rows.push(
            c.post(
                "jobservers",
                json!({"name": name, "addresses": ["10.0.0.2"]}),
            )
            .await,
        );
    }
    // One of them registered three addresses: still the same statement.
    for address in ["10.0.0.7", "10.0.2.7", "10.0.3.7"] {
        let db = &c.state.db;
        let mut sql = db.sql();
        sql.push(
            "INSERT INTO jobserver_addresses (jobserver_id, address, load_avg, streams) VALUES ",
        )
        .bind_list([
            Val::Int(rows[0]["id"].as_i64()),
            Val::Text(Some(address.into())),
            Val::Float(Some(0.0)),
            Val::Int(Some(0)),
        ]);
        sql.query().execute(db.pool()).await.unwrap();
    }
    c.post(
        "images",
        json!({"slug": "compute", "distro": "deb", "rootfs_sha256": SHA, "rootfs_size": 1, "jobservers": ["js1", "js2"]}),
    )
    .await;
    let mut groups = Vec::new();
    for i in 0..50 {
        let script = c
            .post(
                "scripts",
                json!({"slug": format!("s{i}"), "script_type": "post-boot"}),
            )
            .await;
        groups.push(json!({"slug": format!("g{i:02}"), "priority": i,
            "install_kernel_cmdline": format!("g{i:02}=1"), "scripts": [script["id"]]}));
    }
    c.ok("POST", "/api/v1/groups/bulk", Some(Value::Array(groups)))
        .await;
    let all: Vec<String> = (0..50).map(|i| format!("g{i:02}")).collect();
    c.post(
        "systems",
        json!({"hostname": "one", "image": "compute", "groups": ["g00"], "nics": [{"mac": C01}]}),
    )
    .await;
    c.post(
        "systems",
        json!({"hostname": "fifty", "image": "compute", "groups": all, "nics": [{"mac": C02}]}),
    )
    .await;

    let db = &c.state.db;
    let cost = |key: NodeKey<'static>| async move {
        let before = db.statements();
        let lookup = view::load(db, key).await.unwrap();
        let Lookup::Known(v) = lookup else {
            panic!("{key:?} not found")
        };
        (db.statements() - before, v)
    };
    let (one, v1) = cost(NodeKey::Host("one")).await;
    let (fifty, v50) = cost(NodeKey::Host("fifty")).await;
    assert_eq!(v1.layers.groups.len(), 1);
    assert_eq!(v50.layers.groups.len(), 50);
    assert_eq!(v50.jobservers.len(), 2);
    let registered: Vec<usize> = v50.jobservers.iter().map(|j| j.addresses.len()).collect();
    assert_eq!(registered, [3, 0], "{:?}", v50.jobservers);
    let cfg = v50.effective().unwrap();
    assert_eq!(cfg.scripts.len(), 50, "{cfg:?}");
    assert_eq!(cfg.layers.len(), 53, "{cfg:?}");
    assert!(
        cfg.kernel_cmdline.starts_with("quiet g00=1 g01=1"),
        "{cfg:?}"
    );
    assert_eq!(one, fifty, "1 group: {one} statements, 50 groups: {fifty}");
    assert!((1..=5).contains(&fifty), "{fifty} statements");
    // By MAC and by the API's key, the same.
    let (by_mac, v) = cost(NodeKey::Mac(C02)).await;
    assert_eq!((by_mac, v.hostname.as_str()), (fifty, "fifty"));
    let id = v.system_id.to_string();
    let id: &'static str = Box::leak(id.into_boxed_str());
    let (by_id, v) = cost(NodeKey::System(id)).await;
    assert_eq!((by_id, v.layers.groups.len()), (fifty, 50));
    // What the API shows is that view's.
    let shown = c.ok("GET", "/api/v1/systems/fifty/config", None).await;
    assert_eq!(shown, serde_json::to_value(&cfg).unwrap());
    c.cleanup().await;
}

/// Unattested `/ipxe/` requests waiting for a lease report run no
/// statement while they wait (they used to poll the database four times a
/// second each): 200 of them read the view and the lease reports once on
/// entry, then nothing until their wait ends; a lease report for one wakes
/// that one alone, which boots.
pub(crate) async fn waiting_ipxe_requests_run_no_statements(engine: Engine) {
    const FLOOD: usize = 200;
    let (c, _tls) = ctx_with_signer(engine).await;
    c.post(
        "networks",
        json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 24}),
    )
    .await;
    c.post(
        "jobservers",
        json!({"name": "js1", "addresses": ["10.0.0.2"], "network": "prov"}),
    )
    .await;
    c.post(
        "images",
        json!({"slug": "compute", "rootfs_sha256": SHA, "rootfs_size": 1, "jobservers": ["js1"]}),
    )
    .await;
    c.post(
        "systems",
        json!({"hostname": "c01", "image": "compute", "nics": [{"mac": C01, "network": "prov"}]}),
    )
    .await;
    let js1 = enroll_jobserver(&c, "js1").await;
    let db = c.state.db.clone();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ended = || done.load(std::sync::atomic::Ordering::SeqCst);
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..FLOOD {
        let (app, done) = (c.app.clone(), done.clone());
        flood.spawn(async move {
            let out = ipxe(
                &app,
                &format!("02:ee:00:00:{:02x}:{:02x}", i >> 8, i & 0xff),
            )
            .await;
            done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            out
        });
    }
    let real = {
        let app = c.app.clone();
        tokio::spawn(async move { ipxe(&app, C01).await })
    };
    // Every request has looked once (a view of at most five statements and
    // one read of the lease reports); then they wait.
    let entered = tokio::time::timeout(std::time::Duration::from_secs(4), async {
        while c.state.lease_waiters.waiting() < FLOOD + 1 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        entered.is_ok(),
        "only {} requests wait",
        c.state.lease_waiters.waiting()
    );
    // A request joins the waiters, then looks (so that no report is
    // missed): under load the last looks may still be running. Once the
    // count holds still for 300 ms (at most 1.5 s: they wait 5 s in all),
    // nothing may run while they wait.
    let mut before = db.statements();
    for _ in 0..5 {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let now = db.statements();
        if now == before {
            break;
        }
        before = now;
    }
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(db.statements(), before, "waiting requests ran statements");
    assert_eq!(ended(), 0, "a flood request ended early");
    // js1 reports the real node's lease: it alone is woken, and boots.
    let (status, v) = send(
        &c.app,
        "POST",
        EVENTS_PATH,
        &Cred::Cert(js1),
        Some(json!({"phase": "dhcp_acked", "mac": C01, "ip": "10.0.0.50"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let (status, script) = real.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(
        script.as_str().unwrap().contains("mprov_enroll="),
        "{script}"
    );
    assert_eq!(ended(), 0, "the real node waited for the flood");
    while let Some(r) = flood.join_next().await {
        let (status, script) = r.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert!(
            !script.as_str().unwrap().contains("mprov_enroll="),
            "{script}"
        );
    }
    c.cleanup().await;
}

/// Ages the heartbeat of the registered address `address` past any
/// staleness limit.
async fn silence(c: &Ctx, address: &str) {
    let db = &c.state.db;
    let mut sql = db.sql();
    sql.push(
        "UPDATE jobserver_addresses SET heartbeat_at = '2000-01-01T00:00:00Z' WHERE address = ",
    )
    .bind(Val::Text(Some(address.into())));
    sql.query().execute(db.pool()).await.unwrap();
}

/// The rootfs sources of `host`'s manifest, as the admin reads it, or the
/// refusal's status and message.
async fn manifest_sources(c: &Ctx, host: &str) -> Result<Vec<String>, (StatusCode, String)> {
    let (status, v) = c
        .call("GET", &format!("{MANIFEST_PATH}?system={host}"), None)
        .await;
    if status != StatusCode::OK {
        return Err((status, v["message"].as_str().unwrap_or_default().to_owned()));
    }
    let m: BootManifest = serde_json::from_value(v).unwrap();
    Ok(m.sources)
}

/// Job servers register themselves (no row made by hand), each address
/// placed on the network whose subnet holds it, and heartbeat per address;
/// the manifest and `/ipxe/` send a node only to a job server whose
/// heartbeat on the node's network is fresh, and say so when every one is
/// silent. A job server serving two subnets has leases accepted in both.
pub(crate) async fn registration_and_fresh_heartbeats(engine: Engine) {
    use mprov_api::boot::HEARTBEAT_PATH;
    use mprov_api::jobs::REGISTER_PATH;

    let (c, _tls) = ctx_with_signer(engine).await;
    let prov = c
        .post(
            "networks",
            json!({"slug": "prov", "subnet": "10.0.0.0", "netmask": 24}),
        )
        .await;
    let rack2 = c
        .post(
            "networks",
            json!({"slug": "rack2", "subnet": "10.0.2.0", "netmask": 24}),
        )
        .await;
    let js1 = Cred::Cert(enroll_jobserver(&c, "js1").await);
    let js2 = Cred::Cert(enroll_jobserver(&c, "js2").await);
    let rev = c.revision().await;
    let (status, reg) = send(
        &c.app,
        "POST",
        REGISTER_PATH,
        &js1,
        Some(json!({"host_id": "host-1", "modules": ["dnsmasq", "image-update"], "port": 8081,
            "addresses": [{"address": "10.0.0.2"}, {"address": "10.0.2.2"}, {"address": "192.0.2.9"}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reg}");
    assert!(
        c.revision().await > rev,
        "a registration bumps the revision"
    );
    assert_eq!(reg["name"], "js1");
    assert_eq!(
        reg["addresses"],
        json!([{"address": "10.0.0.2", "network": prov["id"]},
               {"address": "10.0.2.2", "network": rack2["id"]},
               {"address": "192.0.2.9", "network": null}]),
        "each address on the network holding it, or none"
    );
    let (status, v) = send(
        &c.app,
        "POST",
        REGISTER_PATH,
        &js2,
        Some(json!({"host_id": "host-2", "modules": [], "port": 8081, "addresses": [{"address": "10.0.0.3"}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    // The row as the API shows it: host id, modules, the row's addresses
    // and network mirroring the registered ones, each with its heartbeat.
    let row = c.ok("GET", "/api/v1/jobservers/js1", None).await;
    crate::assert_schema("JobServer", &row);
    assert_eq!(row["id"], reg["id"]);
    assert_eq!(row["host_id"], "host-1");
    assert_eq!(row["modules"], json!(["dnsmasq", "image-update"]));
    assert_eq!(
        row["addresses"],
        json!(["10.0.0.2", "10.0.2.2", "192.0.2.9"])
    );
    assert_eq!(row["network"], prov["id"]);
    let shown = row["registered_addresses"].as_array().unwrap();
    assert_eq!(shown.len(), 3, "{row}");
    assert!(shown.iter().all(|a| a["heartbeat_at"].is_null()), "{row}");
    // Read-only through the inventory API.
    let (status, v) = c
        .call(
            "PATCH",
            "/api/v1/jobservers/js1",
            Some(json!({"registered_addresses": []})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, v) = c
        .call(
            "PATCH",
            "/api/v1/jobservers/js1",
            Some(json!({"host_id": "x"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");

    c.post(
        "images",
        json!({"slug": "compute", "rootfs_sha256": SHA, "rootfs_size": 4242, "jobservers": ["js1", "js2"]}),
    )
    .await;
    for (host, mac, net) in [("c01", C01, "prov"), ("c02", C02, "rack2")] {
        c.post(
            "systems",
            json!({"hostname": host, "image": "compute", "nics": [{"mac": mac, "network": net, "bootable": true}]}),
        )
        .await;
    }

    // Registered, never heard from: nobody to send the node to, and the
    // reason says so, in the manifest and in /ipxe/.
    let (status, why) = manifest_sources(&c, "c01").await.unwrap_err();
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(why.contains("silent") && why.contains("js1, js2"), "{why}");
    attest(&c, C01).await;
    ipxe_refuses(&c, &c.app, C01, "c01", "is silent").await;

    // Heartbeats, one per address.
    let beat = |cred: &Cred, body: Value| {
        let (app, cred) = (c.app.clone(), cred.clone());
        async move { send(&app, "POST", HEARTBEAT_PATH, &cred, Some(body)).await }
    };
    for (cred, address, load) in [
        (&js1, "10.0.0.2", 2.0),
        (&js1, "10.0.2.2", 0.1),
        (&js2, "10.0.0.3", 1.0),
    ] {
        let (status, v) = beat(
            cred,
            json!({"load_avg": load, "address": address, "streams": 3}),
        )
        .await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{address}: {v}");
    }
    // An address it did not register: register first.
    let (status, v) = beat(&js2, json!({"load_avg": 0.0, "address": "10.0.0.2"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("register first"),
        "{v}"
    );
    let row = c.ok("GET", "/api/v1/jobservers/js1", None).await;
    let shown = &row["registered_addresses"];
    assert!(shown[0]["heartbeat_at"].is_string(), "{row}");
    assert_eq!(shown[0]["load_avg"], 2.0, "{row}");
    assert_eq!(shown[0]["streams"], 3, "{row}");
    assert!(shown[2]["heartbeat_at"].is_null(), "{row}");
    assert!(row["heartbeat_at"].is_string(), "{row}");

    // Each node to its own network's addresses, least loaded first.
    let url = |host: &str| compute_url(host, ImageFile::Rootfs);
    assert_eq!(
        manifest_sources(&c, "c01").await.unwrap(),
        [url("10.0.0.3"), url("10.0.0.2")]
    );
    assert_eq!(
        manifest_sources(&c, "c02").await.unwrap(),
        [url("10.0.2.2")]
    );
    let (status, script) = ipxe(&c.app, C01).await;
    assert_eq!(status, StatusCode::OK);
    let script = script.as_str().unwrap();
    assert!(
        script.contains(&compute_url("10.0.0.3", ImageFile::Kernel))
            && script.contains(&compute_url("10.0.0.2", ImageFile::Kernel))
            && !script.contains("10.0.2.2"),
        "{script}"
    );

    // js1 silent on prov (still heard on rack2): c01 goes to js2 only.
    silence(&c, "10.0.0.2").await;
    assert_eq!(
        manifest_sources(&c, "c01").await.unwrap(),
        [url("10.0.0.3")]
    );
    let (_, script) = ipxe(&c.app, C01).await;
    let script = script.as_str().unwrap();
    assert!(
        !script.contains("10.0.0.2") && script.contains("10.0.0.3"),
        "{script}"
    );
    assert_eq!(
        manifest_sources(&c, "c02").await.unwrap(),
        [url("10.0.2.2")]
    );
    // Both silent on prov: the retry says so.
    silence(&c, "10.0.0.3").await;
    let (status, why) = manifest_sources(&c, "c01").await.unwrap_err();
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(why.contains("silent"), "{why}");
    ipxe_refuses(&c, &c.app, C01, "c01", "is silent").await;
    // A heartbeat brings it back.
    let (status, _) = beat(&js2, json!({"load_avg": 1.0, "address": "10.0.0.3"})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        manifest_sources(&c, "c01").await.unwrap(),
        [url("10.0.0.3")]
    );

    // Leases: js1 serves prov and rack2, so a lease in either is accepted
    // (its row names only prov); outside both, refused.
    for ip in ["10.0.0.60", "10.0.2.60"] {
        let (status, v) = send(
            &c.app,
            "POST",
            EVENTS_PATH,
            &js1,
            Some(json!({"phase": "dhcp_acked", "mac": C02, "ip": ip})),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{ip}: {v}");
    }
    let (status, v) = send(
        &c.app,
        "POST",
        EVENTS_PATH,
        &js1,
        Some(json!({"phase": "dhcp_acked", "mac": C02, "ip": "10.0.9.60"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("10.0.0.0/24, 10.0.2.0/24"),
        "{v}"
    );

    // Registering again keeps the heartbeats of the addresses it lists
    // again, drops the others, and the row follows.
    let (status, v) = send(
        &c.app,
        "POST",
        REGISTER_PATH,
        &js1,
        Some(json!({"host_id": "host-1", "modules": ["dnsmasq"], "port": 8082,
            "addresses": [{"address": "10.0.2.2"}, {"address": "10.0.0.4", "network": rack2["id"]}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["id"], reg["id"]);
    let row = c.ok("GET", "/api/v1/jobservers/js1", None).await;
    assert_eq!(row["addresses"], json!(["10.0.2.2", "10.0.0.4"]));
    assert_eq!(row["network"], rack2["id"]);
    assert_eq!(row["port"], 8082);
    let shown = &row["registered_addresses"];
    assert_eq!(shown.as_array().unwrap().len(), 2, "{row}");
    assert!(shown[0]["heartbeat_at"].is_string(), "kept: {row}");
    assert_eq!(shown[1]["network"], rack2["id"], "as it named: {row}");
    assert!(shown[1]["heartbeat_at"].is_null(), "{row}");
    // A network that does not exist is refused, nothing changed.
    let (status, v) = send(
        &c.app,
        "POST",
        REGISTER_PATH,
        &js1,
        Some(json!({"host_id": "host-1", "modules": [], "port": 8081,
            "addresses": [{"address": "10.0.0.5", "network": 99_999}]})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["field"], "addresses[0].network", "{v}");
    assert_eq!(
        c.ok("GET", "/api/v1/jobservers/js1", None).await["addresses"],
        json!(["10.0.2.2", "10.0.0.4"])
    );
    // A job server looping on registration is cut off (each would wake
    // every job server's long-poll), and no other job server with it.
    let again = json!({"host_id": "host-2", "modules": [], "port": 8081, "addresses": [{"address": "10.0.0.3"}]});
    let mut statuses = Vec::new();
    for _ in 0..mprov_control::jobservers::REGISTRATIONS_PER_MINUTE + 2 {
        statuses.push(
            send(&c.app, "POST", REGISTER_PATH, &js2, Some(again.clone()))
                .await
                .0,
        );
    }
    assert!(
        statuses.contains(&StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    let (status, v) = send(
        &c.app,
        "POST",
        REGISTER_PATH,
        &js1,
        Some(json!({"host_id": "host-1", "modules": ["dnsmasq"], "port": 8082,
            "addresses": [{"address": "10.0.2.2"}, {"address": "10.0.0.4", "network": rack2["id"]}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    c.cleanup().await;
}
