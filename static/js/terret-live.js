/* Terret's live pages: what htmx's ws extension leaves to the page.
 *
 * Every live page holds one socket (ws-connect) whose server sends rendered
 * fragments as out-of-band swaps; htmx applies them. Nothing is rendered
 * here. This script only:
 * - resumes a log socket from the last event the page shows: the extension
 *   reconnects with the URL it first used, so ?after= is brought up to date;
 * - reconnects after any drop but a refusal (4400-4404), with backoff;
 * - shows the socket's state in #live;
 * - keeps the log scrolled to the bottom if it was, sends on Enter, stops
 *   the turn on Esc (when the composer shows Stop), and follows the "show
 *   all events" box.
 * Design: docs/web.md.
 */
(function () {
  "use strict";

  var FINAL = { 4400: "disconnected", 4401: "signed out \u2014 reload to sign in", 4403: "access lost", 4404: "no such session" };
  var RETRIED = [1006, 1011, 1012, 1013];  // the codes the extension retries by itself

  function lastSeq() {
    var items = document.querySelectorAll("#log > li[data-seq]");
    var seq = 0;
    for (var i = 0; i < items.length; i++) seq = Math.max(seq, Number(items[i].getAttribute("data-seq")) || 0);
    return seq;
  }

  function setLive(text, cls) {
    var el = document.getElementById("live");
    if (el) { el.textContent = text; el.className = "live " + cls; }
  }

  function nearBottom() {
    var doc = document.documentElement;
    return window.innerHeight + window.scrollY >= doc.scrollHeight - 120;
  }

  htmx.config.wsReconnectDelay = function (retryCount) {
    return Math.min(5000, 250 * Math.pow(2, retryCount)) * (0.75 + Math.random() * 0.5);
  };

  htmx.createWebSocket = function (url) {
    return new WebSocket(/[?&]after=/.test(url) ? url.replace(/([?&]after=)\d*/, "$1" + lastSeq()) : url);
  };

  var wrapper = null, stick = false, stopped = false;
  document.addEventListener("htmx:wsConnecting", function () { setLive("connecting\u2026", "wait"); });
  document.addEventListener("htmx:wsOpen", function (e) { wrapper = e.detail.socketWrapper; setLive("live", "on"); });
  document.addEventListener("htmx:wsClose", function (e) {
    var code = e.detail.event.code;
    wrapper = e.detail.socketWrapper;
    if (FINAL[code]) { stopped = true; setLive(FINAL[code], "off"); return; }
    if (stopped) return;
    setLive("reconnecting\u2026", "wait");
    if (RETRIED.indexOf(code) < 0) {  // a clean close (a server going away): retry too
      var socket = wrapper;
      setTimeout(function () { if (!stopped && socket) socket.reconnect(); }, htmx.config.wsReconnectDelay(0));
    }
  });
  // What a reader sees of the conversation: its shown rows and the streamed text.
  function seen() {
    var rows = document.querySelectorAll("#log > li.ev:not(.meta)").length;
    var stream = document.getElementById("stream-text");
    return rows + ":" + (stream ? stream.textContent.length : 0);
  }
  function toBottom() { window.scrollTo(0, document.documentElement.scrollHeight); }
  function pill(show) {
    var p = document.getElementById("new-messages");
    if (p) p.hidden = !show;
  }
  var before = "";
  document.addEventListener("htmx:wsBeforeMessage", function () { stick = nearBottom(); before = seen(); });
  document.addEventListener("htmx:wsAfterMessage", function () {
    // Follow new messages unless the reader has scrolled up; then say there are some.
    if (stick) toBottom();
    else if (seen() !== before) pill(true);
    var title = document.getElementById("session-title");
    if (title && title.textContent && document.title.indexOf(title.textContent) !== 0) {
      document.title = title.textContent + " \u00b7 Terret";
    }
  });
  window.addEventListener("pagehide", function () { stopped = true; });
  window.addEventListener("pageshow", function (e) {
    // Back from the bfcache: the socket was closed meanwhile; resume from the page's last event.
    if (e.persisted && wrapper) { stopped = false; wrapper.reconnect(); }
  });

  // Enter sends, Shift+Enter starts a new line.
  document.addEventListener("keydown", function (e) {
    if (e.key !== "Enter" || e.shiftKey || e.ctrlKey || e.altKey || e.metaKey || e.isComposing) return;
    var t = e.target;
    if (!t || t.id !== "id_text") return;
    var form = t.form;
    if (!form || !t.value.trim()) return;
    e.preventDefault();
    if (form.requestSubmit) form.requestSubmit(); else form.submit();
  });

  // Esc presses Stop while it is shown (a turn is open: CSS keys it on #chat-facts' data-status).
  document.addEventListener("keydown", function (e) {
    if (e.key !== "Escape" || e.defaultPrevented || e.isComposing || e.repeat) return;
    if (e.shiftKey || e.ctrlKey || e.altKey || e.metaKey) return;
    var t = e.target;  // Esc in another form's field (an approval's reason) is that field's own
    if (t && t.closest && t.closest("input, textarea, select") && !t.closest("#composer")) return;
    var stop = document.getElementById("stop-button");
    if (!stop || stop.disabled || !stop.getClientRects().length) return;  // hidden: nothing to stop
    e.preventDefault();
    stop.click();
  });

  // The chat opens at its newest message (unless the address names an event).
  function openAtNewest() {
    if (!document.getElementById("log") || location.hash) return;
    toBottom();
  }
  document.addEventListener("DOMContentLoaded", openAtNewest);
  window.addEventListener("load", openAtNewest);
  window.addEventListener("scroll", function () { if (nearBottom()) pill(false); }, { passive: true });
  document.addEventListener("click", function (e) {
    if (e.target && e.target.id === "new-messages") { pill(false); toBottom(); }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var box = document.getElementById("show-meta"), chat = document.getElementById("chat");
    if (!box || !chat) return;
    var sync = function () { chat.classList.toggle("show-meta", box.checked); };
    box.addEventListener("change", sync);
    sync();
  });

  // --- the composer -------------------------------------------------------

  function freshKey() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID().replace(/-/g, "");
    var a = new Uint8Array(16);
    crypto.getRandomValues(a);
    return Array.prototype.map.call(a, function (b) { return ("0" + b.toString(16)).slice(-2); }).join("");
  }

  // Back or Forward may show the page from a cache, with a composer whose
  // idempotency key was spent: every send would replay the old receipt.
  // A page shown again gets a fresh key (the server also sends no-store).
  window.addEventListener("pageshow", function (e) {
    if (!e.persisted) return;
    var key = document.querySelector("#composer input[name=key]");
    if (key) key.value = freshKey();
  });

  // The character counter. Too long is refused here, visibly, and by the
  // server; the text is never cut (the box has no maxlength).
  function counted(box) {
    var max = Number(box.getAttribute("data-max-chars")) || 0;
    var count = document.getElementById("char-count");
    var n = box.value.length, over = max && n > max;
    if (count) {
      count.textContent = n.toLocaleString("en") + " / " + max.toLocaleString("en") +
        (over ? " \u2014 too long by " + (n - max).toLocaleString("en") + ": shorten it to send" : "");
      count.className = "char-count " + (over ? "over" : "muted");
    }
    box.setAttribute("aria-invalid", over ? "true" : "false");
    return !over;
  }
  document.addEventListener("input", function (e) { if (e.target && e.target.id === "id_text") counted(e.target); });
  document.addEventListener("submit", function (e) {
    var box = e.target && e.target.id === "composer" ? document.getElementById("id_text") : null;
    if (box && !counted(box)) { e.preventDefault(); e.stopImmediatePropagation(); box.focus(); }
  }, true);
  document.addEventListener("htmx:beforeRequest", function (e) {
    var box = e.target && e.target.id === "composer" ? document.getElementById("id_text") : null;
    if (box && !counted(box)) e.preventDefault();
  });

  // Suggestion chips on an empty chat fill the box and send.
  document.addEventListener("click", function (e) {
    var chip = e.target && e.target.closest ? e.target.closest("[data-suggest]") : null;
    if (chip) {
      var box = document.getElementById("id_text");
      if (!box) return;
      box.value = chip.getAttribute("data-suggest");
      counted(box);
      if (box.form.requestSubmit) box.form.requestSubmit(); else box.form.submit();
      return;
    }
    // Copy buttons of code blocks (rendered on the server, web/markdown.py).
    var copy = e.target && e.target.closest ? e.target.closest(".copy-code") : null;
    if (!copy) return;
    var pre = copy.parentNode.querySelector("pre");
    if (!pre || !navigator.clipboard) return;
    navigator.clipboard.writeText(pre.textContent).then(function () {
      copy.textContent = "Copied";
      setTimeout(function () { copy.textContent = "Copy"; }, 1500);
    }, function () { copy.textContent = "Copy failed"; });
  });

  // One assistant message per turn: a message that follows another in the
  // same turn (only quiet rows between) continues its bubble.
  function group() {
    var rows = document.querySelectorAll("#log > li.ev:not(.meta)");
    var prev = null;
    for (var i = 0; i < rows.length; i++) {
      var li = rows[i];
      var cont = !!prev && li.getAttribute("data-kind") === "assistant/message" &&
        prev.getAttribute("data-kind") === "assistant/message";
      li.classList.toggle("cont", cont);
      if (prev) prev.classList.toggle("has-cont", cont);
      prev = li;
    }
    if (prev) prev.classList.remove("has-cont");
  }
  var grouping = false;
  function regroup() {
    if (grouping) return;
    grouping = true;
    requestAnimationFrame(function () { grouping = false; group(); });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var log = document.getElementById("log");
    if (!log) return;
    group();
    new MutationObserver(regroup).observe(log, { childList: true });
    var meta = document.getElementById("show-meta");
    if (meta) meta.addEventListener("change", regroup);
  });

  // A schedule's time is typed as the reader's local time (datetime-local):
  // send the browser's offset from UTC at that moment with it (web/schedules.py).
  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (!form || form.id !== "schedule-form") return;
    var at = form.querySelector("input[type=datetime-local]"), offset = form.querySelector("input[name=tz_offset]");
    if (!at || !offset) return;
    offset.value = at.value ? String(new Date(at.value).getTimezoneOffset()) : "";
  }, true);

  // For tests and debugging only.
  window.terretLive = { lastSeq: lastSeq };
})();
