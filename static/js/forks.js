// Forks on the chat page (templates/sessions/_fork_actions.html,
// sessions_app/web/forks.py): "Edit and resend" on the user's messages,
// "Regenerate" on the assistant's, and the "forked here →" markers placed
// after the events they fork from. Rows the page's socket adds later get
// their actions too. The forms are plain POSTs: the server makes the fork
// and sends the browser to it.
(function () {
  "use strict";

  function config() {
    return document.getElementById("fork-config");
  }

  function form(action, fields) {
    const cfg = config();
    const f = document.createElement("form");
    f.method = "post";
    f.action = action;
    const all = Object.assign({ csrfmiddlewaretoken: cfg.dataset.csrf }, fields);
    for (const [name, value] of Object.entries(all)) {
      const input = document.createElement("input");
      input.type = "hidden";
      input.name = name;
      input.value = value;
      f.appendChild(input);
    }
    return f;
  }

  // The label is the button's accessible name and is drawn by CSS
  // (data-label), so it is no part of the message's text: copying a message,
  // or reading its row's text, gets the message alone.
  function button(label, cls, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = cls;
    b.setAttribute("aria-label", label);
    b.dataset.label = label;
    b.addEventListener("click", onClick);
    return b;
  }

  // The message's text as it was sent (the row shows it rendered as Markdown).
  async function rawText(seq) {
    const url = `${config().dataset.eventsUrl}?after=${seq - 1}&limit=1`;
    const reply = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!reply.ok) return "";
    const body = await reply.json();
    const ev = (body.events || [])[0];
    return ev && ev.seq === seq ? ev.data.text || ev.data.content || "" : "";
  }

  async function openEditor(li, seq, bar) {
    if (li.querySelector(".fork-edit")) return;
    const cfg = config();
    const f = form(cfg.dataset.editUrl, { seq: String(seq) });
    f.className = "fork-edit";
    const label = document.createElement("label");
    label.textContent = "Edited message (sent in a fork; this session stays as it is)";
    const box = document.createElement("textarea");
    box.name = "text";
    box.rows = 3;
    box.required = true;
    box.id = `fork-edit-${seq}`;
    label.htmlFor = box.id;
    box.value = await rawText(seq);
    const send = document.createElement("button");
    send.type = "submit";
    send.className = "primary";
    send.textContent = "Send in a fork";
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.textContent = "Cancel";
    cancel.addEventListener("click", () => {
      f.remove();
      bar.hidden = false;
    });
    f.append(label, box, send, cancel);
    bar.hidden = true;
    li.appendChild(f);
    box.focus();
  }

  function regenerate(seq) {
    const f = form(config().dataset.regenerateUrl, { seq: String(seq) });
    f.hidden = true;
    document.body.appendChild(f);
    f.submit();
  }

  // Copy a whole message as it was written (its Markdown), or as shown if
  // the log cannot be read.
  async function copyMessage(li, seq, b) {
    let text = "";
    try {
      text = await rawText(seq);
    } catch (e) {
      text = "";
    }
    if (!text) {
      const shown = li.querySelector(".text");
      text = shown ? shown.innerText : "";
    }
    try {
      await navigator.clipboard.writeText(text);
      b.dataset.label = "Copied";
    } catch (e) {
      b.dataset.label = "Copy failed";
    }
    setTimeout(() => {
      b.dataset.label = "Copy";
    }, 1500);
  }

  // Hover actions of a message: copy it; edit and resend (the user's) or
  // regenerate (the assistant's), each in a fork.
  function decorate(li) {
    const cfg = config();
    if (!cfg || li.dataset.forkable === "done") return;
    const seq = Number(li.dataset.seq);
    const kind = li.dataset.kind;
    if (!seq || (kind !== "user/message" && kind !== "assistant/message")) return;
    li.dataset.forkable = "done";
    const bar = document.createElement("div");
    bar.className = "fork-actions msg-actions";
    const copy = button("Copy", "copy-message", () => copyMessage(li, seq, copy));
    // Not "Copy message": the composer is found by its label "Message".
    copy.setAttribute("aria-label", "Copy the whole text");
    bar.appendChild(copy);
    // A fork's seed (its copied history) forks only as a whole: act on the parent instead.
    if (seq > Number(cfg.dataset.seedUpto || 0)) {
      if (kind === "user/message") {
        bar.appendChild(button("Edit and resend", "fork-edit-button", () => openEditor(li, seq, bar)));
      } else {
        bar.appendChild(button("Regenerate", "fork-regenerate-button", () => regenerate(seq)));
      }
    }
    li.appendChild(bar);
  }

  function placeMarks() {
    const marks = document.getElementById("fork-marks");
    if (!marks) return;
    for (const item of marks.querySelectorAll("li[data-at]")) {
      const at = item.dataset.at;
      const row = document.getElementById(`ev-${at}`);
      const id = `fork-mark-${at}-${item.querySelector("a").getAttribute("href")}`;
      if (!row || document.getElementById(id)) continue;
      const mark = document.createElement("li");
      mark.className = "fork-mark";
      mark.id = id;
      mark.innerHTML = item.innerHTML;
      row.after(mark);
    }
  }

  // The `‹ 1/2 ›` branch switchers, after the event they name and its marks.
  function placeSwitches() {
    const list = document.getElementById("fork-switches");
    if (!list) return;
    for (const item of list.querySelectorAll("li[data-at]")) {
      const at = item.dataset.at;
      const row = document.getElementById(`ev-${at}`);
      const id = `branch-switch-${at}`;
      if (!row || document.getElementById(id)) continue;
      let after = row;
      while (after.nextElementSibling && after.nextElementSibling.classList.contains("fork-mark")) {
        after = after.nextElementSibling;
      }
      const sw = document.createElement("li");
      sw.className = "branch-switch";
      sw.id = id;
      sw.innerHTML = item.innerHTML;
      after.after(sw);
    }
  }

  function refresh() {
    if (!config()) return;
    document.querySelectorAll("#log > li.ev").forEach(decorate);
    placeMarks();
    placeSwitches();
  }

  // Rows arrive by the page's socket (htmx out-of-band swaps, which may also
  // replace a row or the log itself), so watch the whole body, once a frame.
  let queued = false;
  function soon() {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      refresh();
    });
  }

  function start() {
    new MutationObserver(soon).observe(document.body, { childList: true, subtree: true });
    refresh();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
