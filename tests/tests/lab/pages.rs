//! The admin pages in headless Chromium against a real `mprov-control
//! serve`: sign-in, the dashboard, sign-out, idle expiry, a cross-site post
//! from another origin refused by CSRF protection, and an accessibility
//! audit (axe-core) of every page visited. Screenshots go under the build
//! folder (`screenshots/`).

use std::time::Duration;

use anyhow::{Result, ensure};
use mprov_tests::browser::Browser;
use mprov_tests::control::{Control, SUPERUSER_PASSWORD};
use mprov_tests::xtask::target_dir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::block_on;

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
        let control = Control::start_with(
            &target_dir().join("debug"),
            home.path(),
            None,
            &[("SESSION_EXPIRE_SECONDS", "4")],
        )?;
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
        b.click("#signin-form button[type=submit]").await?;
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
            .wait_for("the cross-site refusal", Duration::from_secs(10), |h| {
                h.contains("403")
            })
            .await?;
        ensure!(refused.contains("cross-site"), "{refused}");
        server.abort();
        b.open(&format!("{base}/admin/")).await?;
        ensure!(
            b.path().await? == "/admin/",
            "still signed in after the attack"
        );

        // Signing out ends the session.
        b.click("form[action='/admin/signout'] button").await?;
        ensure!(b.text("#main [role=status]").await? == "You signed out.");
        b.open(&format!("{base}/admin/")).await?;
        ensure!(b.path().await?.starts_with("/admin/signin"));

        // Idle for longer than SESSION_EXPIRE_SECONDS: signed out.
        b.sign_in(&base, ADMIN, SUPERUSER_PASSWORD).await?;
        tokio::time::sleep(Duration::from_secs(6)).await;
        b.open(&format!("{base}/admin/")).await?;
        ensure!(
            b.path().await?.starts_with("/admin/signin"),
            "an idle session ended: {}",
            b.path().await?
        );

        b.close().await?;
        control.stop()?;
        Ok(())
    })
}

#[test]
fn pages_inventory_forms_and_a_2000_member_group_in_chromium() -> Result<()> {
    block_on(async {
        let home = tempfile::tempdir()?;
        let control = Control::start(&target_dir().join("debug"), home.path(), None)?;
        let base = control.http.clone();
        let client = mprov_api::client::Client::new(
            &base,
            mprov_api::client::Auth::ApiKey(control.api_key()?),
        )?;
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
        b.click("form.record button[type=submit]").await?;
        let msg = b.text("#e-hostname").await?;
        ensure!(!msg.is_empty(), "a message at the host name");
        let field = b.find("#f-hostname").await?;
        ensure!(field.attr("aria-invalid").await?.as_deref() == Some("true"));
        ensure!(field.prop("value").await?.as_deref() == Some("bad host"));
        b.assert_accessible("new system with an error").await?;
        b.fill("#f-hostname", "web01").await?;
        b.click("form.record button[type=submit]").await?;
        ensure!(b.text("[role=status]").await? == "Saved.");
        b.assert_accessible("a system").await?;

        // Edit it.
        b.fill("#f-tmpfs_root_size", "12").await?;
        b.click("#f-stateful").await?;
        b.click("form.record button[type=submit]").await?;
        ensure!(b.text("[role=status]").await? == "Saved.");
        let s = client.get("systems", "web01").await?;
        ensure!(s["tmpfs_root_size"] == 12 && s["stateful"] == true, "{s}");

        // The 2,000-member group: add one by search, remove one.
        b.open(&format!("{base}/admin/groups/big/systems/")).await?;
        ensure!(b.text("#members-h").await?.contains("(2000)"));
        b.assert_accessible("group members").await?;
        // Each click loads a new page: wait for it before the next.
        let within = Duration::from_secs(10);
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
        b.click("main form button.danger").await?;
        ensure!(b.path().await? == "/admin/systems/");

        b.close().await?;
        control.stop()?;
        Ok(())
    })
}
