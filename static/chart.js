// gpumem status page: the "last hour" chart of each device (in use, reserved, device used).
// The only script on the page. It polls /api/v1/history every sampling interval, asking only
// for points newer than the ones it has, and redraws each <canvas class="chart">.
(function () {
  "use strict";

  var canvases = Array.prototype.slice.call(document.querySelectorAll("canvas.chart"));
  if (!canvases.length || !window.fetch) return;

  var intervalMs = Math.max(500, parseInt(document.body.getAttribute("data-interval-ms"), 10) || 1000);
  var WINDOW_SECONDS = 3600;
  var MIN_SPAN_SECONDS = 60;
  var COLORS = { inUse: "#2563eb", reserved: "#8fb5f8", device: "#d97706", grid: "#e8ecf1", text: "#667085" };
  var GIB = 1024 * 1024 * 1024;
  var points = [];
  var lastT = null;

  function formatBytes(bytes) {
    if (bytes <= 0) return "0";
    if (bytes >= GIB) return (bytes / GIB).toFixed(bytes >= 10 * GIB ? 0 : 1) + " GiB";
    return (bytes / (1024 * 1024)).toFixed(0) + " MiB";
  }

  // "-45s", "-90s", "-5m", "-7m30s": exact, so neighbouring ticks never print the same label.
  function formatAgo(seconds) {
    var s = Math.round(seconds);
    if (s < 1) return "now";
    if (s < 120) return "-" + s + "s";
    var m = Math.floor(s / 60), rest = s % 60;
    return "-" + m + "m" + (rest ? (rest < 10 ? "0" : "") + rest + "s" : "");
  }

  // A tick step giving four to six labels over `span` seconds.
  function tickStep(span) {
    var steps = [10, 15, 30, 60, 120, 300, 600, 900, 1200];
    for (var i = 0; i < steps.length; i++) if (span / steps[i] <= 6) return steps[i];
    return 1200;
  }

  function series(gpu, field) {
    return points.map(function (p) {
      for (var i = 0; i < p.devices.length; i++) {
        if (p.devices[i].gpu === gpu) return { t: p.t, v: p.devices[i][field] };
      }
      return { t: p.t, v: null };
    });
  }

  function draw(canvas) {
    var box = canvas.getBoundingClientRect();
    var ratio = window.devicePixelRatio || 1;
    var width = Math.max(200, Math.round(box.width));
    var height = Math.max(120, Math.round(box.height));
    if (canvas.width !== width * ratio || canvas.height !== height * ratio) {
      canvas.width = width * ratio;
      canvas.height = height * ratio;
    }
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);

    var gpu = parseInt(canvas.getAttribute("data-gpu"), 10);
    var total = parseFloat(canvas.getAttribute("data-total")) || 1;
    var left = 58, right = 12, top = 10, bottom = 24;
    var plotW = width - left - right, plotH = height - top - bottom;
    var end = points.length ? points[points.length - 1].t : Date.now() / 1000;
    var start = points.length ? Math.max(points[0].t, end - WINDOW_SECONDS) : end - MIN_SPAN_SECONDS;
    if (end - start < MIN_SPAN_SECONDS) start = end - MIN_SPAN_SECONDS;
    var x = function (t) { return left + ((t - start) / (end - start)) * plotW; };
    var y = function (v) { return top + plotH - (Math.min(v, total) / total) * plotH; };

    ctx.font = "11px system-ui, sans-serif";
    ctx.lineWidth = 1;
    ctx.fillStyle = COLORS.text;
    ctx.strokeStyle = COLORS.grid;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (var q = 0; q <= 4; q++) {
      var gy = Math.round(y((total * q) / 4)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(left, gy);
      ctx.lineTo(width - right, gy);
      ctx.stroke();
      ctx.fillText(formatBytes((total * q) / 4), left - 8, gy);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    var step = tickStep(end - start);
    for (var ago = 0; ago <= end - start + 0.001; ago += step) {
      ctx.fillText(formatAgo(ago), x(end - ago), top + plotH + 7);
    }

    if (!points.length) {
      ctx.fillText("waiting for samples…", left + plotW / 2, top + plotH / 2);
      return;
    }
    var visible = function (s) { return s.filter(function (p) { return p.t >= start; }); };
    var reserved = visible(series(gpu, "reserved_bytes"));
    var inUse = visible(series(gpu, "in_use_bytes"));
    var device = visible(series(gpu, "device_used_bytes"));
    area(ctx, reserved, x, y, "rgba(143, 181, 248, 0.22)");
    area(ctx, inUse, x, y, "rgba(37, 99, 235, 0.16)");
    line(ctx, device, x, y, COLORS.device, 2);
    line(ctx, reserved, x, y, COLORS.reserved, 2);
    line(ctx, inUse, x, y, COLORS.inUse, 2);
  }

  // Draws the values as a line, leaving gaps where a sample had no value.
  function line(ctx, s, x, y, color, width) {
    ctx.strokeStyle = color;
    ctx.lineWidth = width;
    ctx.lineJoin = "round";
    ctx.beginPath();
    var drawing = false;
    s.forEach(function (p) {
      if (p.v === null || p.v === undefined) { drawing = false; return; }
      if (drawing) ctx.lineTo(x(p.t), y(p.v)); else ctx.moveTo(x(p.t), y(p.v));
      drawing = true;
    });
    ctx.stroke();
  }

  function area(ctx, s, x, y, fill) {
    var known = s.filter(function (p) { return p.v !== null && p.v !== undefined; });
    if (known.length < 2) return;
    ctx.fillStyle = fill;
    ctx.beginPath();
    ctx.moveTo(x(known[0].t), y(0));
    known.forEach(function (p) { ctx.lineTo(x(p.t), y(p.v)); });
    ctx.lineTo(x(known[known.length - 1].t), y(0));
    ctx.closePath();
    ctx.fill();
  }

  function drawAll() { canvases.forEach(draw); }

  function poll() {
    var url = "/api/v1/history" + (lastT === null ? "" : "?since=" + lastT);
    fetch(url, { cache: "no-store" })
      .then(function (reply) { return reply.ok ? reply.json() : null; })
      .then(function (history) {
        if (!history || !history.points) return;
        var fresh = history.points.length > 0;
        if (fresh) {
          points = points.concat(history.points);
          lastT = points[points.length - 1].t;
          var cutoff = lastT - WINDOW_SECONDS;
          while (points.length && points[0].t < cutoff) points.shift();
        }
        drawAll();
        // How many times new samples reached the charts; the browser test reads it.
        if (fresh) window.gpumemChartUpdates = (window.gpumemChartUpdates || 0) + 1;
      })
      .catch(function () { /* the exporter is restarting or gone; try again next tick */ })
      .then(function () { setTimeout(poll, intervalMs); });
  }

  window.addEventListener("resize", drawAll);
  drawAll();
  poll();
})();
