// gpumem status page: keeps the numbers current without reloading the page. Every sampling
// interval it asks /api/v1/snapshot whether a new sample exists; when one does, it fetches the
// page again and swaps in the new header, body and footer, keeping the charts (chart.js draws
// them from /api/v1/history) and the scroll position. Without JavaScript the page reloads itself
// (the refresh inside <noscript>).
(function () {
  "use strict";
  if (!window.fetch || !window.DOMParser) return;

  var intervalMs = Math.max(500, parseInt(document.body.getAttribute("data-interval-ms"), 10) || 1000);
  var lastTimestamp = null;

  function swap(html) {
    var next = new DOMParser().parseFromString(html, "text/html");
    var main = document.querySelector("main");
    var nextMain = next.querySelector("main");
    if (!main || !nextMain) return;
    // The canvases keep their drawings and chart.js its references to them.
    var kept = {};
    Array.prototype.forEach.call(main.querySelectorAll("canvas.chart"), function (c) {
      kept[c.getAttribute("data-gpu")] = c;
    });
    Array.prototype.forEach.call(nextMain.querySelectorAll("canvas.chart"), function (c) {
      var old = kept[c.getAttribute("data-gpu")];
      if (old) c.parentNode.replaceChild(old, c);
    });
    main.replaceWith(nextMain);
    ["header.top", "footer"].forEach(function (selector) {
      var now = document.querySelector(selector), then = next.querySelector(selector);
      if (now && then) now.replaceWith(then);
    });
    document.title = next.title;
    // How many times the page took a new sample; the browser test reads it.
    window.gpumemPageUpdates = (window.gpumemPageUpdates || 0) + 1;
  }

  function poll() {
    fetch("/api/v1/snapshot", { cache: "no-store" })
      .then(function (reply) { return reply.ok ? reply.json() : null; })
      .then(function (snapshot) {
        if (!snapshot || snapshot.timestamp_seconds === lastTimestamp) return null;
        var first = lastTimestamp === null;
        lastTimestamp = snapshot.timestamp_seconds;
        if (first) return null; // the page was just rendered from this sample
        return fetch("/", { cache: "no-store" }).then(function (reply) {
          return reply.ok ? reply.text() : null;
        });
      })
      .then(function (html) { if (html) swap(html); })
      .catch(function () { /* the exporter is restarting or gone; try again next tick */ })
      .then(function () { setTimeout(poll, intervalMs); });
  }

  poll();
})();
