// The boot board, live: follows /admin/board/events (server-sent events)
// and applies each cell the server sends to the grid the page rendered.
// A snapshot of another inventory revision (systems added, moved or
// removed) reloads the page; the board works without this file.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const board = document.getElementById("board");
  if (!board || !window.EventSource) {
    return;
  }
  const live = document.getElementById("board-live");
  const apply = (c) => {
    const a = document.getElementById("n" + c.id);
    if (!a) {
      return false;
    }
    a.className = c.class;
    a.title = c.label;
    a.setAttribute("aria-label", c.label);
    a.querySelector(".l").textContent = c.letter;
    a.querySelector(".p").textContent = c.sub;
    return true;
  };
  // The server's time in the pages' zone (TIME_ZONE), not the browser's.
  const said = (msg) => {
    if (live && msg.at) {
      live.textContent = "Updated " + msg.at;
    }
  };
  const source = new EventSource("/admin/board/events?by=" + encodeURIComponent(board.dataset.by));
  source.addEventListener("snapshot", (ev) => {
    const msg = JSON.parse(ev.data);
    if (String(msg.revision) !== board.dataset.revision || !msg.cells.every(apply)) {
      window.location.reload();
      return;
    }
    board.dataset.seq = msg.seq;
    said(msg);
  });
  source.addEventListener("update", (ev) => {
    const msg = JSON.parse(ev.data);
    msg.cells.forEach(apply);
    board.dataset.seq = msg.seq;
    said(msg);
  });
});
