// mProv admin pages: passkeys (WebAuthn). Registering (the account page's
// #passkey-register) and signing in (the sign-in page's #passkey-signin)
// work the same way: post the form's CSRF token to its data-options URL for
// the options, ask the browser's authenticator, put its answer (JSON) in
// the form's hidden "response" field and submit the form. Every check is
// the server's. No inline script anywhere (Content-Security-Policy).
"use strict";
(() => {
  const supported = () =>
    window.PublicKeyCredential &&
    typeof PublicKeyCredential.parseCreationOptionsFromJSON === "function";

  async function options(form) {
    const body = new URLSearchParams({ csrf: form.elements.csrf.value });
    const r = await fetch(form.dataset.options, {
      method: "POST",
      body,
      credentials: "same-origin",
    });
    if (!r.ok) {
      const page = new DOMParser().parseFromString(await r.text(), "text/html");
      const why = page.querySelector("main p") || page.body;
      throw new Error(why ? why.textContent.trim() : "HTTP " + r.status);
    }
    return r.json();
  }

  function wire(form, ask) {
    if (!form) {
      return;
    }
    const status = form.querySelector("[role=status]");
    if (!supported()) {
      if (status) {
        status.textContent = "This browser cannot use passkeys.";
      }
      return;
    }
    form.hidden = false;
    form.addEventListener("submit", async (ev) => {
      if (form.elements.response.value) {
        return;
      }
      ev.preventDefault();
      if (status) {
        status.textContent = "";
      }
      try {
        const cred = await ask(await options(form));
        form.elements.response.value = JSON.stringify(cred.toJSON());
        form.submit();
      } catch (e) {
        if (status) {
          status.textContent = "No passkey: " + (e && e.message ? e.message : e);
        }
      }
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    wire(document.getElementById("passkey-register"), (o) =>
      navigator.credentials.create({
        publicKey: PublicKeyCredential.parseCreationOptionsFromJSON(o),
      }),
    );
    wire(document.getElementById("passkey-signin"), (o) =>
      navigator.credentials.get({
        publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(o),
      }),
    );
  });
})();
