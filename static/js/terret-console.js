/* The operators' console (/ops/): its body follows a socket (out-of-band
 * swaps applied by htmx's ws extension, terret-live.js shows the socket's
 * state). A frame must not wipe what an operator is typing into a reason
 * box: while a field in the live body has focus and text, a frame is
 * skipped; the next one (a few seconds on at most) catches up. */
(function () {
  "use strict";
  document.addEventListener("htmx:wsBeforeMessage", function (e) {
    var el = document.activeElement, body = document.getElementById("console-body");
    var typing = el && (el.tagName === "TEXTAREA" || (el.tagName === "INPUT" && el.type === "text"));
    if (body && typing && body.contains(el) && el.value) e.preventDefault();
  });
})();
