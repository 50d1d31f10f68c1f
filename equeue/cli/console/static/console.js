// The console's own script: draws the uPlot charts from the JSON their page embeds
// (again after every htmx refresh), sends the CSRF token with htmx requests, ticks
// "select all" boxes, and skips a page's refresh while a box of it is ticked (the
// refresh would untick it: the dead letters' selection). No inline scripts: the pages' CSP forbids them.
(function () {
  "use strict";
  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];
  var charts = {};
  var MIN_SPAN = 60; // seconds: a young chart still reads as minutes, not sub-second ticks

  function span(u, min, max) {
    if (min == null || max == null) return [min, max];
    return [Math.min(min, max - MIN_SPAN), max];
  }

  function draw() {
    if (typeof uPlot === "undefined") return;
    document.querySelectorAll("[data-chart]").forEach(function (el) {
      var src = document.getElementById(el.dataset.chart);
      if (!src) return;
      var spec;
      try { spec = JSON.parse(src.textContent); } catch (e) { return; }
      var points = spec.data[0].length;
      if (points === 1) {
        // a lone sample: uPlot would spread it over days; an empty point a minute
        // earlier gives the axis its minute
        spec.data = spec.data.map(function (col, i) { return [i === 0 ? col[0] - MIN_SPAN : null].concat(col); });
      }
      var names = spec.series.join("|");
      var c = charts[el.id];
      if (c && (c.names !== names || !document.body.contains(c.el))) {
        c.plot.destroy();
        c = null;
      }
      if (!c) {
        var series = [{}].concat(spec.series.map(function (n, i) {
          return { label: n, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true };
        }));
        el.textContent = "";
        var opts = { width: Math.max(300, el.clientWidth || 600), height: 220, series: series, scales: { x: { time: true, range: span } } };
        c = { plot: new uPlot(opts, spec.data, el), names: names, el: el };
        charts[el.id] = c;
      } else {
        c.plot.setData(spec.data);
      }
      el.dataset.points = String(points);
    });
  }

  document.addEventListener("DOMContentLoaded", draw);
  document.addEventListener("htmx:afterSettle", draw);
  document.addEventListener("htmx:configRequest", function (e) {
    var meta = document.querySelector('meta[name="csrf-token"]');
    if (meta) e.detail.headers["X-CSRF-Token"] = meta.content;
  });
  document.addEventListener("htmx:beforeRequest", function (e) {
    var elt = e.detail && e.detail.elt;
    if (elt && elt.id === "live" && elt.querySelector("input[type=checkbox]:checked")) e.preventDefault();
  });
  document.addEventListener("change", function (e) {
    var t = e.target;
    if (t && t.matches && t.matches("[data-select-all]")) {
      document.querySelectorAll(t.dataset.selectAll).forEach(function (cb) { cb.checked = t.checked; });
    }
  });
})();
