//! Passkeys in headless Chromium against a real `mprov-control serve`, with
//! Chromium's virtual authenticator (CTAP2, internal, resident keys, user
//! verification): registered from a signed-in session on the account page,
//! then, signed out, used to sign in, which starts a session like a
//! password does. The pages are opened as `http://localhost:<port>`: a
//! passkey's RP id is a host name, and `localhost` is a secure context
//! over plain HTTP.

use anyhow::{Result, ensure};
use mprov_tests::browser::{Browser, PAGE_WAIT};
use mprov_tests::control::{Control, SUPERUSER_PASSWORD};
use mprov_tests::xtask::target_dir;

use super::block_on;

/// The first-start admin of [`Control::start`].
const ADMIN: &str = "admin";

#[test]
fn passkey_registered_then_used_to_sign_in_in_chromium() -> Result<()> {
    block_on(async {
        let home = tempfile::tempdir()?;
        let control = Control::start(&target_dir().join("debug"), home.path(), None)?;
        let base = control.http.replace("127.0.0.1", "localhost");
        let b = Browser::start().await?;
        b.open(&format!("{base}/admin/signin")).await?;
        b.add_virtual_authenticator().await?;

        // Registered from a signed-in session.
        b.sign_in(&base, ADMIN, SUPERUSER_PASSWORD).await?;
        b.open(&format!("{base}/admin/account/")).await?;
        ensure!(b.text("#no-passkeys").await?.contains("no passkey"));
        b.assert_accessible("account").await?;
        b.fill("#passkey-name", "virtual laptop").await?;
        b.click("#passkey-register button[type=submit]").await?;
        b.wait_for("the new passkey in the list", PAGE_WAIT, |h| {
            h.contains("id=\"passkeys\"")
        })
        .await?;
        ensure!(b.text("#passkeys .passkey-name").await? == "virtual laptop");
        ensure!(b.text("#passkeys .passkey-used").await? == "never");
        b.assert_accessible("account with a passkey").await?;

        // Signed out, then in with the passkey alone.
        b.submit("form[action='/admin/signout'] button").await?;
        ensure!(b.text("#main [role=status]").await? == "You signed out.");
        b.assert_accessible("sign-in with the passkey button")
            .await?;
        b.click("#passkey-signin button[type=submit]").await?;
        b.wait_for("the dashboard after a passkey sign-in", PAGE_WAIT, |h| {
            h.contains("<h1>Dashboard</h1>")
        })
        .await?;
        ensure!(b.path().await? == "/admin/", "{}", b.path().await?);
        ensure!(b.text(".who a").await? == ADMIN);
        b.open(&format!("{base}/admin/account/")).await?;
        let used = b.text("#passkeys .passkey-used").await?;
        ensure!(used != "never", "the sign-in was recorded: {used}");

        // Deleted, it no longer signs in.
        b.submit_confirmed("#passkeys form button").await?;
        ensure!(b.text("#no-passkeys").await?.contains("no passkey"));
        b.submit("form[action='/admin/signout'] button").await?;
        b.click("#passkey-signin button[type=submit]").await?;
        let refused = b
            .wait_for("the refusal of a deleted passkey", PAGE_WAIT, |h| {
                h.contains("id=\"signin-error\"")
            })
            .await?;
        ensure!(
            refused.contains("no passkey has this credential id"),
            "{refused}"
        );

        b.close().await?;
        control.stop()?;
        Ok(())
    })
}
