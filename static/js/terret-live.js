/* Terret live log client: follows one session's log over its websocket.
 *
 * The page is server-rendered up to state.last_seq. This client connects to
 * /ws/sessions/<id>/?after=<lastSeq>, appends every committed event the server
 * sends (each once: frames with seq <= lastSeq are dropped, a gap makes it
 * reconnect from lastSeq), streams token deltas into a transient bubble that
 * the durable assistant/message replaces, and reconnects with backoff after a
 * drop or a server restart. Protocol: docs/protocol.md. Design: docs/web.md.
 *
 * renderEvent() builds the same markup as the `event` partial of
 * templates/sessions/chat.html; keep the two in step.
 */
(function () {
  "use strict";

  var stateEl = document.getElementById("live-state");
  var log = document.getElementById("log");
  if (!stateEl || !log) return;
  var state = JSON.parse(stateEl.textContent);

  var META = {
    "turn/start": 1, "step/start": 1, "step/end": 1, "usage/recorded": 1, "session/titled": 1,
    "policy/updated": 1, "model/updated": 1, "agent/spawned": 1, "agent/disposed": 1
  };
  var STATUS = { idle: "idle", running: "running", waiting_approval: "waiting for approval" };

  var lastSeq = state.last_seq || 0;
  var openTurn = state.open_turn;
  var pending = {};
  (state.pending || []).forEach(function (id) { pending[id] = 1; });
  var cost = Number(state.cost) || 0;
  var unpriced = state.unpriced || 0;
  var currentStep = null;   // step of the latest step/start seen
  var closedStep = null;    // step whose assistant/message has committed

  var streaming = document.getElementById("streaming");
  var streamText = streaming ? streaming.querySelector(".text") : null;
  var streamStep = null;

  /* ------------------------------------------------------------ rendering */

  function h(tag, attrs) {
    var el = document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (attrs[k] === null || attrs[k] === undefined || attrs[k] === false) continue;
        if (k === "text") el.textContent = attrs[k];
        else el.setAttribute(k, attrs[k]);
      }
    }
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined || c === false) continue;
      el.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return el;
  }

  function pretty(raw) {
    var value = raw;
    if (typeof raw === "string") {
      try { value = JSON.parse(raw); } catch (e) { return raw; }
    }
    return JSON.stringify(value, null, 2);
  }

  function details(cls, summaryNodes, body, attrs) {
    var a = attrs || {};
    if (cls) a["class"] = cls;
    var summary = h("summary", null);
    summaryNodes.forEach(function (n) { if (n) summary.appendChild(typeof n === "string" ? document.createTextNode(n) : n); });
    return h("details", a, summary, h("pre", { text: body }));
  }

  function who(ev) {
    var d = ev.data || {};
    switch (ev.kind) {
      case "user/message": return "You";
      case "context/injected": return "Steer";
      case "input/queued": return ev.queued ? "Queued" : "Queued (landed)";
      case "assistant/message": return "Assistant";
      case "tool/result": return "Tool";
      case "approval/requested": case "approval/resolved": return "Approval";
      case "turn/end": case "turn/cancel_requested": return "Turn";
      case "session/compacted": return "Compaction";
      default: return ev.kind;
    }
  }

  function body(ev) {
    var d = ev.data || {};
    var out = [];
    switch (ev.kind) {
      case "user/message": case "context/injected":
        out.push(h("div", { "class": "text", text: d.text }));
        break;
      case "input/queued":
        out.push(h("div", { "class": "text", text: d.text }));
        if (ev.queued) out.push(h("div", { "class": "note", text: "queued \u2014 rides the agent's next step" }));
        break;
      case "assistant/message":
        if (d.content) out.push(h("div", { "class": "text", text: d.content }));
        (d.tool_calls || []).forEach(function (c) {
          out.push(details("tool-call", ["Tool call ", h("code", { text: c.name })], pretty(c.arguments || ""),
            { "data-call-id": c.id }));
        });
        break;
      case "tool/result":
        out.push(details("tool-result" + (d.is_error ? " error" : ""),
          ["Result of ", h("code", { text: d.name }), d.is_error ? " (error)" : null], d.content,
          { "data-call-id": d.call_id }));
        break;
      case "approval/requested":
        out.push(details("approval-args", ["Approval requested for ", h("code", { text: d.name })], pretty(d.args || {})));
        break;
      case "approval/resolved":
        out.push(h("div", {
          "class": "text verdict " + d.verdict,
          text: (d.verdict === "approve" ? "Approved" : "Denied") + (d.by ? " by " + d.by : "") + (d.reason ? ": " + d.reason : "")
        }));
        break;
      case "turn/end":
        out.push(h("div", { "class": "text status-" + d.status, text: "Turn " + d.status + (d.error ? ": " + d.error : "") }));
        break;
      case "turn/cancel_requested":
        out.push(h("div", { "class": "text", text: "Cancel requested" + (d.by ? " by " + d.by : "") }));
        break;
      case "session/compacted":
        out.push(details(null, ["Compacted events up to #" + d.upto_seq], d.summary));
        break;
      default:
        out.push(h("code", { "class": "json", text: JSON.stringify(d) }));
    }
    return out;
  }

  function renderEvent(ev) {
    var meta = !!META[ev.kind] || (ev.kind === "input/queued" && !ev.queued);
    var cls = "ev k-" + ev.kind.replace(/\//g, "-") + (meta ? " meta" : "") + (ev.queued ? " queued" : "");
    var at = ev.at || "";
    var li = h("li", { id: "ev-" + ev.seq, "data-seq": ev.seq, "data-kind": ev.kind, "class": cls },
      h("div", { "class": "ev-head" },
        h("span", { "class": "who", text: who(ev) }), " ",
        h("a", { "class": "seq", href: "#ev-" + ev.seq, text: "#" + ev.seq }), " ",
        h("time", { datetime: at, text: at.slice(11, 19) })));
    body(ev).forEach(function (n) { li.appendChild(n); });
    return li;
  }

  /* ------------------------------------------------------------ page state */

  function nearBottom() {
    var doc = document.documentElement;
    return window.innerHeight + window.scrollY >= doc.scrollHeight - 120;
  }

  function keepBottom(fn) {
    var stick = nearBottom();
    fn();
    if (stick) window.scrollTo(0, document.documentElement.scrollHeight);
  }

  function setText(id, text) {
    var el = document.getElementById(id);
    if (el) el.textContent = text;
  }

  function renderStatus() {
    var status = openTurn === null || openTurn === undefined ? "idle"
      : (Object.keys(pending).length ? "waiting_approval" : "running");
    var el = document.getElementById("status");
    if (el) { el.className = "badge " + status; el.textContent = STATUS[status]; }
    var cancel = document.getElementById("cancel-button");
    if (cancel) cancel.disabled = status === "idle";
    setText("cost", "$" + cost.toFixed(4) + (unpriced ? " + " + unpriced + " unpriced" : ""));
  }

  function addUsage(usage) {
    if (!usage || usage.cost === null || usage.cost === undefined) unpriced += 1;
    else cost += Number(usage.cost);
  }

  function landQueued(sourceSeq) {
    var li = document.getElementById("ev-" + sourceSeq);
    if (!li || !li.classList.contains("queued")) return;
    li.classList.remove("queued");
    li.classList.add("meta");
    var note = li.querySelector(".note");
    if (note) note.remove();
    var w = li.querySelector(".who");
    if (w) w.textContent = "Queued (landed)";
  }

  function clearStream() {
    streamStep = null;
    if (streaming) { streaming.hidden = true; streamText.textContent = ""; }
  }

  var approvalsBusy = false, approvalsDirty = false;
  function refreshApprovals() {
    if (approvalsBusy) { approvalsDirty = true; return; }
    approvalsBusy = true; approvalsDirty = false;
    fetch(state.page_url + "?fragment=approvals", { headers: { "HX-Request": "true" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        var old = document.getElementById("approvals");
        if (html === null || !old) return;
        var tpl = document.createElement("template");
        tpl.innerHTML = html.trim();
        var fresh = tpl.content.querySelector("#approvals");
        if (!fresh) return;
        old.replaceWith(fresh);
        if (window.htmx) window.htmx.process(fresh);
      })
      .catch(function () { /* the next approval event refreshes again */ })
      .then(function () {
        approvalsBusy = false;
        if (approvalsDirty) refreshApprovals();
      });
  }

  function apply(ev) {
    var d = ev.data || {};
    switch (ev.kind) {
      case "turn/start":
        openTurn = ev.seq; pending = {};
        break;
      case "turn/end":
        openTurn = null; pending = {}; clearStream(); closedStep = null; currentStep = null;
        refreshApprovals();
        break;
      case "step/start":
        currentStep = d.step; closedStep = null;
        break;
      case "assistant/message":
        closedStep = currentStep; clearStream();
        break;
      case "step/end":
        addUsage(d.usage);
        break;
      case "usage/recorded":
        addUsage(d.usage);
        break;
      case "approval/requested":
        pending[d.call_id] = 1; refreshApprovals();
        break;
      case "approval/resolved":
        delete pending[d.call_id]; refreshApprovals();
        break;
      case "session/titled":
        setText("session-title", d.title);
        document.title = d.title + " \u00b7 Terret";
        break;
      case "user/message": case "context/injected":
        if (d.source_seq) landQueued(d.source_seq);
        break;
    }
  }

  /* ------------------------------------------------------------ frames */

  var ws = null, attempt = 0, timer = null, stopped = false;
  var FINAL = { 4400: "disconnected", 4401: "signed out \u2014 reload to sign in", 4403: "access lost", 4404: "no such session" };

  function onEvent(f) {
    if (typeof f.seq !== "number" || f.seq <= lastSeq) return;  // already shown
    if (f.seq !== lastSeq + 1) {
      // A hole would mean a missed event: ask again from what we have
      // (with backoff, should a broken server keep doing it).
      reconnect(null);
      return;
    }
    var ev = { seq: f.seq, kind: f.kind, data: f.data || {}, at: f.at };
    ev.queued = ev.kind === "input/queued";  // until its context lands
    lastSeq = f.seq;
    if (!document.getElementById("ev-" + ev.seq)) {
      keepBottom(function () { log.appendChild(renderEvent(ev)); });
    }
    apply(ev);
    renderStatus();
  }

  function onDelta(f) {
    if (!streaming || typeof f.text !== "string") return;
    if (closedStep !== null && f.step === closedStep) return;  // late: its message is already shown
    keepBottom(function () {
      if (streamStep !== f.step) { streamText.textContent = ""; streamStep = f.step; }
      streamText.textContent += f.text;
      streaming.hidden = false;
    });
  }

  function setLive(text, cls) {
    var el = document.getElementById("live");
    if (el) { el.textContent = text; el.className = "live " + cls; }
  }

  function connect() {
    timer = null;
    if (stopped) return;
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var sock = new WebSocket(proto + location.host + state.ws_path + "?after=" + lastSeq);
    ws = sock;
    setLive("connecting\u2026", "wait");
    sock.onopen = function () { setLive("live", "on"); };
    sock.onmessage = function (msg) {
      if (sock !== ws) return;
      var f;
      try { f = JSON.parse(msg.data); } catch (e) { return; }
      attempt = 0;
      if (f.type === "event") onEvent(f);
      else if (f.type === "delta") onDelta(f);
      else if (f.type === "error") showError(f);
    };
    sock.onclose = function (e) {
      if (sock !== ws) return;
      ws = null;
      clearStream();  // deltas are live only; the durable message follows
      if (FINAL[e.code]) {
        // Refused for good (bad cursor, signed out, access lost, no such
        // session): retrying cannot help.
        stopped = true;
        setLive(FINAL[e.code], "off");
        return;
      }
      if (!stopped) reconnect(null);
    };
  }

  function reconnect(delay) {
    if (ws) { var old = ws; ws = null; try { old.close(); } catch (e) { /* closed */ } }
    if (timer) clearTimeout(timer);
    if (delay === null) {
      delay = Math.min(5000, 250 * Math.pow(2, attempt)) * (0.75 + Math.random() * 0.5);
      attempt += 1;
    }
    setLive("reconnecting\u2026", "wait");
    timer = setTimeout(connect, delay);
  }

  function showError(f) {
    var box = document.getElementById("approvals");
    if (!box || !f.message) return;
    var p = box.querySelector(".error") || box.insertBefore(h("p", { "class": "error", role: "alert" }), box.firstChild);
    p.textContent = f.message;
  }

  function send(frame) {
    if (ws && ws.readyState === WebSocket.OPEN) { ws.send(JSON.stringify(frame)); return true; }
    return false;
  }

  /* ------------------------------------------------------------ controls */

  // Fallback approval buttons (rendered only while approvals/inline.html is
  // absent) send verdict frames over the socket.
  document.addEventListener("click", function (e) {
    var btn = e.target.closest ? e.target.closest("#approvals button[data-verdict]") : null;
    if (!btn) return;
    if (!send({ type: btn.getAttribute("data-verdict"), call_id: btn.getAttribute("data-call-id") })) {
      showError({ message: "Not connected; try again in a moment." });
    }
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

  var metaBox = document.getElementById("show-meta");
  if (metaBox) {
    var chat = document.getElementById("chat");
    var sync = function () { chat.classList.toggle("show-meta", metaBox.checked); };
    metaBox.addEventListener("change", sync);
    sync();
  }

  window.addEventListener("online", function () { if (!ws) reconnect(0); });
  window.addEventListener("pagehide", function () { stopped = true; if (ws) ws.close(); });
  window.addEventListener("pageshow", function (e) {
    if (e.persisted && state.live) { stopped = false; reconnect(0); }  // back from the bfcache
  });

  // Exposed for tests and debugging only.
  window.terretLive = { lastSeq: function () { return lastSeq; }, send: send };

  if (state.live) connect();
})();
