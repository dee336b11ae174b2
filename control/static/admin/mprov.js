// mProv admin pages: small progressive enhancements; every page works
// without this file. No inline script anywhere (Content-Security-Policy).
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  // A form or button with data-confirm asks before it is sent.
  document.querySelectorAll("form[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (ev) => {
      if (!window.confirm(form.dataset.confirm)) {
        ev.preventDefault();
      }
    });
  });
});
