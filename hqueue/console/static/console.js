// The hqueue console's live refresh: charts (uPlot) and the #live part of each page,
// polled every few seconds from this server only. No other script runs on these pages.
(function () {
  "use strict";
  var REFRESH_MS = 5000;
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
  // The data each chart last drew, by element id (tests read it through WebDriver).
  window.hqueueCharts = {};

  function fetchJSON(url) {
    return fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.json(); });
  }

  function columns(json, wanted) {
    var chart = json.chart || json;
    var names = Object.keys(chart).filter(function (k) {
      return k !== "t" && wanted.some(function (w) { return k === w || k.indexOf(w + ":") === 0; });
    }).sort();
    return {names: names, data: [chart.t].concat(names.map(function (n) { return chart[n]; }))};
  }

  // One request at a time per chart and for the live part: a page slower to answer than
  // REFRESH_MS had its refreshes pile up in the console's few threads.
  function draw(figure) {
    if (figure._busy) { return; }
    figure._busy = true;
    var wanted = figure.dataset.series.split(",");
    fetchJSON(figure.dataset.src).finally(function () { figure._busy = false; }).then(function (json) {
      var c = columns(json, wanted);
      window.hqueueCharts[figure.id] = {names: c.names, data: c.data};
      var key = c.names.join(",");
      if (figure._plot && figure._key === key) { figure._plot.setData(c.data); return; }
      if (figure._plot) { figure._plot.destroy(); }
      var series = [{}].concat(c.names.map(function (n, i) {
        return {label: n, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: false};
      }));
      var width = Math.max(300, Math.min(figure.clientWidth || 600, 900));
      figure._plot = new uPlot({width: width, height: 220, series: series, axes: [{}, {}],
                                scales: {x: {time: true}}}, c.data, figure);
      figure._key = key;
    }).catch(function () { figure.classList.add("stale"); });
  }

  function refreshLive() {
    var live = document.getElementById("live");
    if (!live || live.dataset.live !== "on" || document.hidden || live._busy) { return; }
    live._busy = true;
    fetch(window.location.href, {credentials: "same-origin", headers: {"X-Live": "1"}})
      .finally(function () { live._busy = false; })
      .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
      .then(function (html) { live.innerHTML = html; live.classList.remove("stale"); })  // escaped server side
      .catch(function () { live.classList.add("stale"); });
  }

  function tick() {
    document.querySelectorAll("figure.chart").forEach(draw);
    refreshLive();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("figure.chart").forEach(draw);
    window.setInterval(tick, REFRESH_MS);
  });
})();
