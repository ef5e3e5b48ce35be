/* The navigation bar's pending-approvals count, kept live, and the same
 * count in the tab's title ("(3) Approvals · Terret").
 *
 * Its own small socket (/ws/approvals/?count=1, approvals_app/consumers.py)
 * rather than htmx's ws extension: the page's main socket is the
 * extension's, and this one must not disturb its state. The server sends
 * {"type": "pending", "count": N} on connect, after every approval requested
 * or decided anywhere (coalesced), and every minute. Without JavaScript the
 * count rendered with the page stands.
 */
(function () {
  "use strict";

  var link = document.getElementById("nav-approvals");
  var badge = document.getElementById("pending-count");
  if (!link || !badge || !window.WebSocket) return;
  var count = Number(badge.getAttribute("data-count")) || 0;
  var PREFIX = /^\(\d+\) /;
  var FINAL = [4401, 4403];
  var socket = null, retries = 0, stopped = false;

  function applyTitle() {
    var bare = document.title.replace(PREFIX, "");
    var want = count > 0 ? "(" + count + ") " + bare : bare;
    if (document.title !== want) document.title = want;
  }

  function show(n) {
    count = n;
    badge.textContent = String(n);
    badge.setAttribute("data-count", String(n));
    badge.setAttribute("aria-label", n + " waiting for approval");
    badge.classList.toggle("none", n === 0);
    applyTitle();
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + link.getAttribute("data-socket"));
    socket.onopen = function () { retries = 0; };
    socket.onmessage = function (e) {
      var frame;
      try { frame = JSON.parse(e.data); } catch (err) { return; }
      if (frame && frame.type === "pending" && typeof frame.count === "number") show(frame.count);
    };
    socket.onclose = function (e) {
      socket = null;
      if (stopped || FINAL.indexOf(e.code) >= 0) return;
      var delay = Math.min(30000, 500 * Math.pow(2, retries++)) * (0.75 + Math.random() * 0.5);
      setTimeout(function () { if (!stopped && !socket) connect(); }, delay);
    };
  }

  // Other scripts set the title too (the chat page follows the session's title): keep the count in front.
  var title = document.querySelector("title");
  if (title && window.MutationObserver) {
    new MutationObserver(applyTitle).observe(title, { childList: true, characterData: true, subtree: true });
  }
  window.addEventListener("pagehide", function () { stopped = true; if (socket) socket.close(); });
  window.addEventListener("pageshow", function (e) { if (e.persisted) { stopped = false; if (!socket) connect(); } });
  applyTitle();
  connect();
})();
