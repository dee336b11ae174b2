//! The admin pages in headless Chromium against a real `mprov-control
//! serve`: sign-in, the dashboard, sign-out, idle expiry, a cross-site post
//! from another origin refused by CSRF protection, and an accessibility
//! audit (axe-core) of every page visited. Screenshots go under the build
//! folder (`screenshots/`).

use std::time::Duration;

use anyhow::{Result, ensure};
use mprov_tests::browser::{Browser, PAGE_WAIT};
use mprov_tests::control::{Control, SUPERUSER_PASSWORD};
use mprov_tests::xtask::target_dir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::block_on;

/// A control service in `home` and an API client with its admin key.
fn control_and_client(home: &std::path::Path) -> Result<(Control, mprov_api::client::Client)> {
    let control = Control::start(&target_dir().join("debug"), home, None)?;
    let client = mprov_api::client::Client::new(
        &control.http,
        mprov_api::client::Auth::ApiKey(control.api_key()?),
    )?;
    Ok((control, client))
}

/// The first-start admin of [`Control::start`].
const ADMIN: &str = "admin";

/// Serves `html` to every request on a loopback port of its own (another
/// origin than the control service's), until the task is dropped; its URL.
async fn other_site(html: String) -> Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    // `localhost` is another site than `127.0.0.1` for the browser.
    let url = format!("http://localhost:{}/", listener.local_addr()?.port());
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).await;
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{html}",
                html.len()
            );
            let _ = conn.write_all(answer.as_bytes()).await;
        }
    });
    Ok((url, task))
}

#[test]
fn pages_sign_in_out_expire_and_refuse_cross_site_posts_in_chromium() -> Result<()> {
    block_on(async {
        let home = tempfile::tempdir()?;
        let control = Control::start(&target_dir().join("debug"), home.path(), None)?;
        let base = control.http.clone();
        let b = Browser::start().await?;

        // Without a session, any page leads to the sign-in form.
        b.open(&format!("{base}/admin/jobs/")).await?;
        ensure!(
            b.path().await?.starts_with("/admin/signin?next="),
            "{}",
            b.path().await?
        );
        b.assert_accessible("sign-in").await?;

        // A wrong password: the form again, with the message.
        b.fill("#username", ADMIN).await?;
        b.fill("#password", "not the password").await?;
        b.submit("#signin-form button[type=submit]").await?;
        let error = b.text("#signin-error").await?;
        ensure!(error.contains("wrong user name or password"), "{error}");

        b.sign_in(&base, ADMIN, SUPERUSER_PASSWORD).await?;
        ensure!(b.text("main h1").await? == "Dashboard");
        b.assert_accessible("dashboard").await?;
        let shot = b.screenshot("dashboard").await?;
        ensure!(std::fs::metadata(&shot)?.len() > 1000, "{}", shot.display());

        // Another site posts a sign-out form to us: refused, session kept.
        let form = format!(
            "<!doctype html><title>elsewhere</title><form id=f method=post action=\"{base}/admin/signout\">\
             <input name=csrf value=guessed></form><script>document.getElementById('f').submit()</script>"
        );
        let (evil, server) = other_site(form).await?;

        // The audit can fail: a page with an unlabelled field and an image
        // without a text alternative has critical findings.
        let (bad, bad_server) = other_site(
            "<!doctype html><html lang=en><title>bad</title><img src=x.png><input type=text>"
                .into(),
        )
        .await?;
        b.open(&bad).await?;
        let found = b.audit().await?;
        ensure!(
            found.iter().any(|v| v.id == "image-alt") && found.iter().any(|v| v.id == "label"),
            "axe-core found {found:?}"
        );
        bad_server.abort();

        b.open(&evil).await?;
        let refused = b
            .wait_for("the cross-site refusal", PAGE_WAIT, |h| h.contains("403"))
            .await?;
        ensure!(refused.contains("cross-site"), "{refused}");
        server.abort();
        b.open(&format!("{base}/admin/")).await?;
        ensure!(
            b.path().await? == "/admin/",
            "still signed in after the attack"
        );

        // A job server enrollment token and an API key, each shown once;
        // the key works on the API.
        b.open(&format!("{base}/admin/identities/")).await?;
        b.assert_accessible("identities").await?;
        b.fill("#token-name", "js-browser").await?;
        b.submit("#make-token").await?;
        let token = b.text("#shown-secret").await?;
        ensure!(token.contains('.'), "a token <prefix>.<secret>: {token:?}");
        b.fill("#key-name", "made in the browser").await?;
        b.submit("#make-key").await?;
        let key = b.text("#shown-secret").await?;
        b.open(&format!("{base}/admin/identities/")).await?;
        let again = b.source().await?;
        ensure!(
            !again.contains(&token) && !again.contains(&key),
            "a secret is shown once only"
        );
        ensure!(again.contains("made in the browser"));
        let out = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("Authorization: Api-Key {key}"))
            .arg("-H")
            .arg(format!(
                "{}: {}",
                mprov_api::VERSION_HEADER,
                mprov_api::api_version()
            ))
            .arg(format!("{base}/api/v1/systems/"))
            .output()?;
        ensure!(
            String::from_utf8_lossy(&out.stdout) == "200",
            "the key made in the page works on the API: {:?}",
            out
        );

        // Signing out ends the session.
        b.submit("form[action='/admin/signout'] button").await?;
        ensure!(b.text("#main [role=status]").await? == "You signed out.");
        b.open(&format!("{base}/admin/")).await?;
        ensure!(b.path().await?.starts_with("/admin/signin"));

        control.stop()?;

        // Idle for longer than SESSION_EXPIRE_SECONDS: signed out (a service
        // of its own with a short idle time, so the steps above never race it).
        let home = tempfile::tempdir()?;
        let brief = Control::start_with(
            &target_dir().join("debug"),
            home.path(),
            None,
            &[("SESSION_EXPIRE_SECONDS", "3")],
        )?;
        b.sign_in(&brief.http, ADMIN, SUPERUSER_PASSWORD).await?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        b.open(&format!("{}/admin/", brief.http)).await?;
        ensure!(
            b.path().await?.starts_with("/admin/signin"),
            "an idle session ended: {}",
            b.path().await?
        );
        b.close().await?;
        brief.stop()?;
        Ok(())
    })
}

/// The directory of the LDAP sign-in: ada an admin, bob read-only, cy in
/// no group.
const DIRECTORY: &str = "\
dn: ou=people,dc=example,dc=org
objectClass: organizationalUnit
ou: people

dn: ou=groups,dc=example,dc=org
objectClass: organizationalUnit
ou: groups

dn: uid=ada,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: ada
cn: Ada
sn: A
userPassword: ada-directory-pw

dn: uid=bob,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: bob
cn: Bob
sn: B
userPassword: bob-directory-pw

dn: uid=cy,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: cy
cn: Cy
sn: C
userPassword: cy-directory-pw

dn: cn=admins,ou=groups,dc=example,dc=org
objectClass: groupOfNames
cn: admins
member: uid=ada,ou=people,dc=example,dc=org

dn: cn=readers,ou=groups,dc=example,dc=org
objectClass: groupOfNames
cn: readers
member: uid=bob,ou=people,dc=example,dc=org
";

#[test]
fn pages_sign_in_through_a_real_ldap_directory_in_chromium() -> Result<()> {
    block_on(async {
        let slapd = mprov_tests::ldap::Slapd::start(DIRECTORY)?;
        let home = tempfile::tempdir()?;
        let uri = slapd.uri();
        let control = Control::start_with(
            &target_dir().join("debug"),
            home.path(),
            None,
            &[
                ("LDAP_ENABLED", "1"),
                ("LDAP_URI", &uri),
                (
                    "LDAP_USER_DN_TEMPLATE",
                    "uid=%(user)s,ou=people,dc=example,dc=org",
                ),
                ("LDAP_ADMIN_GROUP", "cn=admins,ou=groups,dc=example,dc=org"),
                (
                    "LDAP_READONLY_GROUP",
                    "cn=readers,ou=groups,dc=example,dc=org",
                ),
            ],
        )?;
        let base = control.http.clone();
        let b = Browser::start().await?;

        // A directory admin: no local account, signed in by the directory.
        b.sign_in(&base, "ada", "ada-directory-pw").await?;
        ensure!(b.text("main h1").await? == "Dashboard");
        ensure!(b.text(".who a").await? == "ada");
        ensure!(!b.source().await?.contains("read-only"));
        b.submit("form[action='/admin/signout'] button").await?;

        // A directory reader: read-only.
        b.sign_in(&base, "bob", "bob-directory-pw").await?;
        ensure!(b.text(".who .badge").await? == "read-only");
        b.submit("form[action='/admin/signout'] button").await?;

        // A wrong password, a user in no group, an empty password (the
        // form's own check; the domain refuses it before any bind too).
        for (user, password, expect) in [
            ("ada", "not-it", "wrong user name or password"),
            ("cy", "cy-directory-pw", "none of the groups"),
        ] {
            b.open(&format!("{base}/admin/signin")).await?;
            b.fill("#username", user).await?;
            b.fill("#password", password).await?;
            b.submit("#signin-form button[type=submit]").await?;
            let error = b.text("#signin-error").await?;
            ensure!(error.contains(expect), "{user}: {error}");
        }
        // Local accounts still sign in beside the directory.
        b.sign_in(&base, ADMIN, SUPERUSER_PASSWORD).await?;
        b.close().await?;
        control.stop()?;
        slapd.stop()?;
        Ok(())
    })
}

/// What [`watch_board`] saw of one node on the boot board.
#[derive(Debug)]
pub(crate) struct BoardSeen {
    /// The node's cell's letters, in the order seen, each once.
    pub letters: Vec<String>,
    /// How many of those changes arrived while the page stayed loaded (live,
    /// over server-sent events, not by reloading).
    pub live_changes: usize,
}

/// Watches the boot board in Chromium inside the lab namespace `ns` while
/// `hostname` boots, until its cell shows ready (R) or `limit` passes;
/// saves screenshots of the board mid-boot and of the node's timeline,
/// and audits both pages.
pub(crate) fn watch_board(
    ns: &str,
    base: String,
    password: String,
    hostname: String,
    limit: Duration,
) -> std::thread::JoinHandle<Result<BoardSeen>> {
    mprov_tests::browser::in_netns(ns, move || async move {
        let b = Browser::start().await?;
        b.sign_in(&base, ADMIN, &password).await?;
        b.open(&format!("{base}/admin/board/?by=group")).await?;
        b.assert_accessible("boot board").await?;
        // A mark on the loaded page: gone if the page reloads.
        b.client
            .execute("window.mprovMark = true; return null;", vec![])
            .await?;
        let read = format!(
            "const h = {host:?};\
             const a = [...document.querySelectorAll('#board a')].find(x => x.querySelector('.h') && x.querySelector('.h').textContent === h);\
             return [a ? a.querySelector('.l').textContent : '', window.mprovMark === true];",
            host = hostname
        );
        let deadline = std::time::Instant::now() + limit;
        let (mut letters, mut live_changes, mut shot) = (Vec::<String>::new(), 0, false);
        loop {
            let v = b.client.execute(&read, vec![]).await?;
            let letter = v[0].as_str().unwrap_or_default().to_owned();
            let marked = v[1].as_bool().unwrap_or(false);
            if !letter.is_empty() && letters.last() != Some(&letter) {
                if !letters.is_empty() && marked {
                    live_changes += 1;
                }
                letters.push(letter.clone());
            }
            if !shot && ["K", "E", "M", "S"].contains(&letter.as_str()) {
                b.screenshot("board-mid-boot").await?;
                shot = true;
            }
            if letter == "R" || std::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        ensure!(
            shot,
            "{hostname} never showed mid-boot on the board: {letters:?}"
        );
        let cell = format!(
            "return [...document.querySelectorAll('#board a')].find(x => x.querySelector('.h').textContent === {hostname:?}).getAttribute('href');"
        );
        let href = b.client.execute(&cell, vec![]).await?;
        b.open(&format!("{base}{}", href.as_str().unwrap_or_default()))
            .await?;
        b.assert_accessible("timeline").await?;
        b.screenshot("timeline").await?;
        b.close().await?;
        Ok(BoardSeen {
            letters,
            live_changes,
        })
    })
}
#[test]
fn pages_inventory_forms_and_a_2000_member_group_in_chromium() -> Result<()> {
    block_on(async {
        let home = tempfile::tempdir()?;
        let (control, client) = control_and_client(home.path())?;
        let base = control.http.clone();
        client
            .create("groups", &serde_json::json!({"slug": "big"}))
            .await?;
        let rows: Vec<serde_json::Value> = (0..2_001)
            .map(|i| serde_json::json!({"hostname": format!("n{i:05}")}))
            .collect();
        for chunk in rows.chunks(1_000) {
            client.bulk_create("systems", chunk).await?;
        }
        let members: Vec<String> = (0..2_000).map(|i| format!("n{i:05}")).collect();
        client
            .update("groups", "big", &serde_json::json!({"systems": members}))
            .await?;

        let b = Browser::start().await?;
        b.sign_in(&base, ADMIN, SUPERUSER_PASSWORD).await?;

        // The list: search, sort, keyset pages.
        b.open(&format!("{base}/admin/systems/?q=n0004&sort=-hostname"))
            .await?;
        ensure!(b.text(".summary").await?.starts_with("10 matching"));
        b.assert_accessible("systems list").await?;

        // Create a system, with an error first: shown next to its field.
        b.open(&format!("{base}/admin/systems/new")).await?;
        b.assert_accessible("new system").await?;
        b.fill("#f-hostname", "bad host").await?;
        b.fill("#f-tmpfs_root_size", "4").await?;
        b.submit("form.record button[type=submit]").await?;
        let msg = b.text("#e-hostname").await?;
        ensure!(!msg.is_empty(), "a message at the host name");
        let field = b.find("#f-hostname").await?;
        ensure!(field.attr("aria-invalid").await?.as_deref() == Some("true"));
        ensure!(field.prop("value").await?.as_deref() == Some("bad host"));
        b.assert_accessible("new system with an error").await?;
        b.fill("#f-hostname", "web01").await?;
        b.submit("form.record button[type=submit]").await?;
        ensure!(b.text("[role=status]").await? == "Saved.");
        b.assert_accessible("a system").await?;

        // Edit it.
        b.fill("#f-tmpfs_root_size", "12").await?;
        b.click("#f-stateful").await?;
        b.submit("form.record button[type=submit]").await?;
        ensure!(b.text("[role=status]").await? == "Saved.");
        let s = client.get("systems", "web01").await?;
        ensure!(s["tmpfs_root_size"] == 12 && s["stateful"] == true, "{s}");

        // The 2,000-member group: add one by search, remove one.
        b.open(&format!("{base}/admin/groups/big/systems/")).await?;
        ensure!(b.text("#members-h").await?.contains("(2000)"));
        b.assert_accessible("group members").await?;
        // Each click loads a new page: wait for it before the next.
        let within = PAGE_WAIT;
        b.fill("#aq", "n02000").await?;
        b.click("form[aria-label='Search systems to add'] button")
            .await?;
        b.wait_for("the search", within, |h| {
            h.contains("id=\"aq\" name=\"aq\" value=\"n02000\"")
        })
        .await?;
        b.click("button[aria-label='Add n02000']").await?;
        b.wait_for("2,001 members", within, |h| {
            h.contains("Current systems (2001)")
        })
        .await?;
        b.fill("#mq", "n00007").await?;
        b.click("form[aria-label='Search the current systems'] button")
            .await?;
        b.wait_for("the members' search", within, |h| {
            h.contains("id=\"mq\" name=\"mq\" value=\"n00007\"")
        })
        .await?;
        b.click("button[aria-label='Remove n00007']").await?;
        b.wait_for("2,000 members", within, |h| {
            h.contains("Current systems (2000)")
        })
        .await?;
        let g = client.get("groups", "big").await?;
        let ids = g["systems"].as_array().map(Vec::len);
        ensure!(ids == Some(2_000), "{ids:?}");
        b.assert_accessible("group members after edits").await?;

        // Delete asks first.
        b.open(&format!("{base}/admin/systems/web01/delete"))
            .await?;
        b.assert_accessible("delete a system").await?;
        b.submit("main form button.danger").await?;
        ensure!(b.path().await? == "/admin/systems/");

        b.close().await?;
        control.stop()?;
        Ok(())
    })
}

/// The systems filter in the browser: filter the list by group (the URL is
/// the bookmark), follow it to the bulk page, preview adding the result to
/// another group, confirm the count, and find the entry on the audit page;
/// axe-core audits each new page.
#[test]
fn pages_filter_bulk_add_and_audit_in_chromium() -> Result<()> {
    block_on(async {
        let home = tempfile::tempdir()?;
        let (control, client) = control_and_client(home.path())?;
        let base = control.http.clone();
        for g in ["compute", "spare"] {
            client
                .create("groups", &serde_json::json!({"slug": g}))
                .await?;
        }
        for (host, groups) in [
            ("c01", vec!["compute"]),
            ("c02", vec!["compute"]),
            ("x03", vec![]),
        ] {
            client
                .create(
                    "systems",
                    &serde_json::json!({"hostname": host, "groups": groups}),
                )
                .await?;
        }

        let b = Browser::start().await?;
        b.sign_in(&base, ADMIN, SUPERUSER_PASSWORD).await?;
        b.open(&format!("{base}/admin/systems/")).await?;
        b.fill("#filter", "group:compute").await?;
        b.submit("form.filters button[type=submit]").await?;
        // The URL carries the filter: it is the bookmark.
        ensure!(
            b.path().await?.contains("filter=group%3Acompute"),
            "{}",
            b.path().await?
        );
        ensure!(b.text(".summary").await?.starts_with("2 matching"));
        b.assert_accessible("systems filtered").await?;
        // A bad filter: the message beside the box.
        b.fill("#filter", "colour:red").await?;
        b.submit("form.filters button[type=submit]").await?;
        ensure!(b.text("#filter-error").await?.contains("unknown key"));
        b.assert_accessible("systems with a bad filter").await?;

        b.open(&format!("{base}/admin/systems/?filter=group%3Acompute"))
            .await?;
        b.submit("#bulk-link").await?;
        b.fill("#arg", "spare").await?;
        b.submit("#preview-button").await?;
        ensure!(b.text("#preview-h").await? == "2 systems match");
        ensure!(b.text("#preview-hosts").await? == "c01, c02");
        b.assert_accessible("bulk preview").await?;
        b.submit("#apply-button").await?;
        ensure!(b.path().await? == "/admin/audit/", "{}", b.path().await?);
        let row = b.text("#audit tbody tr").await?;
        ensure!(
            row.contains("add_to_group")
                && row.contains("group spare")
                && row.contains("group:compute"),
            "{row}"
        );
        b.assert_accessible("audit log").await?;
        let spare = client.get("groups", "spare").await?;
        ensure!(
            spare["systems"].as_array().map(Vec::len) == Some(2),
            "{spare}"
        );

        b.close().await?;
        control.stop()?;
        Ok(())
    })
}

/// An image's, a script's and a job's pages: the image's versions and its
/// Rebuild button (pressed: the image is at a new version with an
/// image-update job queued), who runs a script (a system through its
/// group), a failed job's output and its Retry button (pressed: pending
/// again), and the 404 page; axe-core audits each.
#[test]
fn pages_image_script_and_job_pages_in_chromium() -> Result<()> {
    use serde_json::json;
    block_on(async {
        let home = tempfile::tempdir()?;
        let (control, client) = control_and_client(home.path())?;
        let base = control.http.clone();
        client.create("images", &json!({"slug": "compute"})).await?;
        client
            .create(
                "scripts",
                &json!({"slug": "base", "script_type": "post-boot", "content": "#!/bin/sh\n"}),
            )
            .await?;
        client
            .create(
                "scripts",
                &json!({"slug": "setup", "script_type": "post-boot",
                    "content": "#!/bin/sh\necho setup\n", "depends_on": ["base"]}),
            )
            .await?;
        client
            .create("groups", &json!({"slug": "gpu", "scripts": ["setup"]}))
            .await?;
        client
            .create("systems", &json!({"hostname": "g01", "groups": ["gpu"]}))
            .await?;
        let job = client
            .create(
                "jobs",
                &json!({"module": "libgenders", "status": "failed", "return_code": 1,
                    "output": "genders: cannot write /etc/genders\n"}),
            )
            .await?;
        let job_id = job["id"].as_i64().unwrap_or_default();

        let b = Browser::start().await?;
        b.sign_in(&base, ADMIN, SUPERUSER_PASSWORD).await?;

        // The image: its versions, then Rebuild.
        b.open(&format!("{base}/admin/images/compute/")).await?;
        ensure!(b.text("#builds-h").await? == "Versions and builds");
        b.assert_accessible("an image").await?;
        b.submit("form[action$='/rebuild'] button").await?;
        ensure!(
            b.text("#builds [role=status]")
                .await?
                .contains("Rebuild requested")
        );
        let image = client.get("images", "compute").await?;
        ensure!(image["version"] == 2, "{image}");
        let queued = client
            .get_path("/api/v1/jobs/?module=image-update&status=pending")
            .await?;
        ensure!(
            queued["items"][0]["params"] == json!({"image": "compute", "version": 2}),
            "{queued}"
        );
        b.assert_accessible("an image after a rebuild").await?;

        // The script: its dependency and who runs it.
        b.open(&format!("{base}/admin/scripts/setup/")).await?;
        ensure!(b.text("#runners").await?.contains("from group:gpu"));
        b.find("a[href='/admin/scripts/base/']").await?;
        ensure!(
            b.find("#f-content").await?.attr("class").await?.as_deref() == Some("code"),
            "the editor is a code textarea"
        );
        b.assert_accessible("a script").await?;

        // The job: its output, then Retry.
        b.open(&format!("{base}/admin/jobs/{job_id}/")).await?;
        ensure!(b.text("pre.output").await?.contains("cannot write"));
        b.assert_accessible("a failed job").await?;
        b.submit("form[action$='/retry'] button").await?;
        ensure!(b.text("#job [role=status]").await?.contains("Queued again"));
        let job = client.get("jobs", &job_id.to_string()).await?;
        ensure!(job["status"] == "pending", "{job}");
        b.assert_accessible("a job queued again").await?;

        // A page that does not exist.
        b.open(&format!("{base}/admin/images/no-such-image/"))
            .await?;
        ensure!(b.source().await?.contains("404"));
        b.assert_accessible("the 404 page").await?;

        b.close().await?;
        control.stop()?;
        Ok(())
    })
}

/// Discovery's page: a node reports what it heard through the real
/// endpoint (curl, with the one-time nonce `/ipxe/` would have minted for
/// its MAC, minted in the service's own database), waits on
/// `/admin/discovery/` (under `manual`) with the switch port it heard and
/// the NIC cabled there filled in, and is assigned from its form: the NIC
/// has the MAC and nothing waits. axe-core audits the page both ways.
#[test]
fn pages_discovery_parks_and_assigns_in_chromium() -> Result<()> {
    use mprov_api::nads::{NONCE_HEADER, REPORT_PATH};
    use serde_json::json;
    const MAC: &str = "52:54:00:d1:5c:01";
    block_on(async {
        let home = tempfile::tempdir()?;
        let (control, client) = control_and_client(home.path())?;
        let base = control.http.clone();
        client
            .create("switches", &json!({"hostname": "sw1"}))
            .await?;
        let port = client
            .create(
                "switchports",
                &json!({"switch": "sw1", "name": "Ethernet1/1"}),
            )
            .await?;
        client
            .create("systems", &json!({"hostname": "c01"}))
            .await?;
        let nic = client
            .create(
                "nics",
                &json!({"system": "c01", "name": "eno1", "switch_port": port["id"]}),
            )
            .await?;

        let url = format!(
            "sqlite://{}?mode=rwc",
            home.path().join("var/db/mprov.sqlite3").display()
        );
        let db = mprov_control::db::Db::open(&url).await?;
        let nonce = mprov_control::discovery::store::mint_nonce(&db, MAC).await?;
        db.close().await;
        let report = json!({
            "boot_mac": MAC,
            "links": [{"interface": "eth0", "mac": MAC, "neighbour": {
                "chassis_id": "00:11:22:33:44:55", "chassis_id_subtype": "mac-address",
                "port_id": "Eth1/1", "port_id_subtype": "interface-name",
                "system_name": "sw1", "port_description": null,
                "management_addresses": [], "vlan": null}}],
            "hardware": {"vendor": "QEMU", "model": "Standard PC", "serial": null}
        });
        let out = std::process::Command::new("curl")
            .args(["-sS", "--fail-with-body", "-H"])
            .arg(mprov_api::version_header_line())
            .arg("-H")
            .arg(format!("{NONCE_HEADER}: {nonce}"))
            .args(["-H", "Content-Type: application/json", "--data"])
            .arg(report.to_string())
            .arg(format!("{base}{REPORT_PATH}"))
            .output()?;
        let answer = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && answer.contains("\"parked\""),
            "{answer} {}",
            String::from_utf8_lossy(&out.stderr)
        );

        let b = Browser::start().await?;
        b.sign_in(&base, ADMIN, SUPERUSER_PASSWORD).await?;
        b.open(&format!("{base}/admin/discovery/")).await?;
        let row = b.text("#parked tbody tr").await?;
        ensure!(
            row.contains(MAC) && row.contains("Eth1/1") && row.contains("QEMU"),
            "{row}"
        );
        let system = b
            .find("#parked input[name=system]")
            .await?
            .prop("value")
            .await?;
        ensure!(
            system.as_deref() == Some("c01"),
            "the matched system is filled in: {system:?}"
        );
        b.assert_accessible("discovery with a parked node").await?;
        b.submit(&format!("button[aria-label='Assign {MAC}']"))
            .await?;
        let done = b.text("#form-done").await?;
        ensure!(done.contains(MAC) && done.contains("c01"), "{done}");
        ensure!(
            b.text("#none-parked")
                .await?
                .starts_with("No discovered node")
        );
        b.assert_accessible("discovery, none waiting").await?;
        let bound = client.get("nics", &nic["id"].to_string()).await?;
        ensure!(bound["mac"] == MAC, "{bound}");

        b.close().await?;
        control.stop()?;
        Ok(())
    })
}
