/* topas-bench site: metric switch, scheduler chooser, sortable tables and the charts, drawn
   by the bundled plotly.js from the JSON each page carries (#page-data). No network. */
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("page-data").textContent || "{}");
  var state = { metric: "mean", chosen: null };  // chosen: null = every scheduler
  // Okabe-Ito (colour-blind safe) without its vermillion, which is too near TOPAS's red
  var LINES = ["#0072B2", "#E69F00", "#009E73", "#56B4E9", "#CC79A7", "#8C6D00", "#555555",
               "#000000"];
  var DASHES = ["solid", "dash", "dot", "dashdot", "longdash"];
  var FAMILY = { topas: "#C0392B", lever: "#E8A39B", baseline: "#0072B2", peer: "#009E73",
                 "peer-2026": "#CC79A7", other: "#8C8C8C" };
  var VERDICT = { win: "#1E7B34", loss: "#B3261E", tie: "#8C8C8C" };
  var CONFIG = { displaylogo: false, responsive: true,
                 modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  function chosen(name) { return state.chosen === null || state.chosen.has(name); }
  function hasPlotly() { return typeof window.Plotly !== "undefined"; }
  function fmt(v, unit) {
    if (v === null || v === undefined) { return "-"; }
    return unit === "s" ? v.toLocaleString("en", { maximumFractionDigits: 1,
                                                     minimumFractionDigits: 1 })
                        : v.toFixed(4);
  }
  function draw(el, traces, layout) {
    if (!hasPlotly()) { return false; }
    layout.font = { family: "DejaVu Sans, system-ui, sans-serif", size: 12 };
    layout.paper_bgcolor = "#fff";
    layout.plot_bgcolor = "#fff";
    window.Plotly.react(el, traces, layout, CONFIG);
    return true;
  }

  /* --- leaderboards: one horizontal bar per scheduler, its interval as an error bar ---- */
  function boardChart(el) {
    var board = (DATA.boards || {})[el.dataset.board];
    if (!board) { return; }
    var d = board[state.metric];
    var idx = [];
    for (var i = 0; i < d.s.length; i++) { if (chosen(d.s[i]) && d.v[i] !== null) { idx.push(i); } }
    var pick = function (a) { return idx.map(function (i) { return a[i]; }); };
    var v = pick(d.v), lo = pick(d.lo), hi = pick(d.hi), s = pick(d.s);
    var text = idx.map(function (i) {
      return "<b>" + d.s[i] + "</b><br>" + d.label + " " + fmt(d.v[i], d.unit) + " " + d.unit +
        (d.lo[i] !== null ? " [" + fmt(d.lo[i], d.unit) + ", " + fmt(d.hi[i], d.unit) + "]" : "") +
        "<br>leader's margin over it: " + d.margin[i] + "<br>verdict: " + d.verdict[i];
    });
    var trace = {
      type: "scatter", mode: "markers", y: s, x: v, hovertext: text, hoverinfo: "text",
      marker: { size: 9, color: pick(d.f).map(function (f) { return FAMILY[f] || FAMILY.other; }),
                line: { width: 1, color: "#333" } },
      error_x: { type: "data", symmetric: false, color: "#333", thickness: 1.2, width: 3,
                 array: v.map(function (x, k) { return hi[k] === null ? 0 : hi[k] - x; }),
                 arrayminus: v.map(function (x, k) { return lo[k] === null ? 0 : x - lo[k]; }) },
    };
    // a far outlier (more than 2.5 times the median) would squash every other point: the axis
    // stops short of it and a note at the edge names it with its value (zoom out to see it)
    var sorted = v.filter(function (x) { return x !== null; }).sort(function (a, b) { return a - b; });
    var median = sorted.length ? sorted[Math.floor(sorted.length / 2)] : 0;
    var far = idx.filter(function (i) { return d.lower && d.v[i] > 2.5 * median; });
    var near = idx.filter(function (i) { return far.indexOf(i) < 0; });
    var range;
    if (far.length && near.length) {
      var lows = near.map(function (i) { return d.lo[i] === null ? d.v[i] : d.lo[i]; });
      var highs = near.map(function (i) { return d.hi[i] === null ? d.v[i] : d.hi[i]; });
      var lo0 = Math.min.apply(null, lows), hi0 = Math.max.apply(null, highs);
      range = [lo0 - 0.05 * (hi0 - lo0), hi0 + 0.12 * (hi0 - lo0)];
    }
    var notes = far.map(function (i) {
      return { xref: "paper", x: 1, y: d.s[i], xanchor: "right", showarrow: false,
               text: d.s[i] + " " + fmt(d.v[i], d.unit) + " " + d.unit + " →",
               font: { size: 10, color: "#5b6570" } };
    });
    return draw(el, [trace], {
      height: Math.max(220, 24 * s.length + 70), margin: { l: 120, r: 20, t: 30, b: 45 },
      annotations: range ? notes : [],
      xaxis: { title: { text: d.label + " (" + d.unit + "), 95% interval over seeds" },
               range: range, zeroline: false, gridcolor: "#eee" },
      yaxis: { autorange: "reversed", automargin: true },
      title: { text: d.lower ? "lower is better" : "higher is better",
               font: { size: 11, color: "#5b6570" }, x: 0.01, y: 0.99 },
      showlegend: false,
    });
  }

  /* --- JCT distribution: TOPAS and the leaders drawn, the rest a click away ------------- */
  function cdfChart(el) {
    var c = DATA.cdf;
    if (!c) { return; }
    var traces = [], k = 0;
    c.series.forEach(function (s) {
      if (!chosen(s.s)) { return; }
      var top = s.f === "topas";
      var colour = top ? FAMILY.topas : LINES[k % LINES.length];
      var dash = top ? "solid" : DASHES[Math.floor(k / LINES.length) % DASHES.length];
      if (!top) { k += 1; }
      traces.push({ type: "scatter", mode: "lines", name: s.s, x: s.x, y: s.y,
                    visible: s.shown ? true : "legendonly", line: { color: colour, dash: dash,
                    width: top ? 3 : 1.6, shape: "hv" },
                    hovertemplate: "<b>" + s.s + "</b><br>JCT %{x:.1f} s<br>share of tasks %{y:.2f}<extra></extra>" });
    });
    return draw(el, traces, { height: 460, margin: { l: 60, r: 20, t: 20, b: 50 },
                       xaxis: { title: { text: "JCT (s)" }, gridcolor: "#eee" },
                       yaxis: { title: { text: "share of tasks" }, range: [0, 1.02], gridcolor: "#eee" },
                       legend: { orientation: "v", x: 1.01, y: 1 } });
  }

  /* --- levers: paired margins around zero with their intervals -------------------------- */
  function leverTraces(byMetric, labelKey) {
    var traces = [];
    Object.keys(byMetric).forEach(function (m) {
      var d = byMetric[m];
      var labels = d[labelKey].map(function (l) { return l + " (" + m + ")"; });
      traces.push({
        type: "scatter", mode: "markers", name: m + " JCT",
        x: d.margin.map(function (v) { return v === null ? null : 100 * v; }),
        y: labels, hovertext: labels.map(function (l, i) {
          return "<b>" + l + "</b><br>margin " + (100 * d.margin[i]).toFixed(1) +
            "% [" + (100 * d.lo[i]).toFixed(1) + ", " + (100 * d.hi[i]).toFixed(1) + "]<br>verdict: " +
            d.verdict[i];
        }), hoverinfo: "text",
        marker: { size: 10, symbol: m === "mean" ? "circle" : "diamond",
                  color: d.verdict.map(function (v) { return v === "tie" ? "#fff" : VERDICT[v]; }),
                  line: { width: 2, color: d.verdict.map(function (v) { return VERDICT[v] || "#333"; }) } },
        error_x: { type: "data", symmetric: false, color: "#555", thickness: 1.2, width: 3,
                   array: d.hi.map(function (h, i) { return 100 * (h - d.margin[i]); }),
                   arrayminus: d.lo.map(function (l, i) { return 100 * (d.margin[i] - l); }) },
      });
    });
    return traces;
  }
  function leverLayout(n) {
    return { height: Math.max(220, 2 * 24 * n + 100), margin: { l: 220, r: 20, t: 40, b: 50 },
             xaxis: { title: { text: "1 - TOPAS / lever off (%); above 0: the lever helps" },
                      zeroline: true, zerolinecolor: "#333", zerolinewidth: 1.5, gridcolor: "#eee" },
             yaxis: { automargin: true, autorange: "reversed" },
             legend: { orientation: "h", x: 0, y: 1.0, yanchor: "bottom" } };
  }
  function leverChart(el) {
    var l = DATA.levers;
    if (!l) { return; }
    var first = l[Object.keys(l)[0]];
    return draw(el, leverTraces(l, "lever"), leverLayout(first.lever.length));
  }
  function leverSourceChart(el) {
    var l = (DATA.levers || {})[el.dataset.id];
    if (!l || !Object.keys(l).length) { return; }
    var first = l[Object.keys(l)[0]];
    return draw(el, leverTraces(l, "x"), leverLayout(first.x.length));
  }

  /* --- timeline: four shared-time panels, then one residency strip per scheduler -------- */
  function timelineChart(el) {
    var t = DATA.timeline;
    if (!t) { return; }
    var runs = t.runs.filter(function (r) { return chosen(r.s); });
    var panels = [["in_system", "tasks in the system"], ["waiting", "calls waiting"],
                  ["kv_used_tokens", "KV tokens in use"], ["preemptions", "preemptions so far"]];
    var n = panels.length + runs.length, gap = 0.025, h = (1 - gap * (n - 1)) / n;
    var layout = { height: 170 * n, margin: { l: 130, r: 20, t: 30, b: 50 },
                   legend: { orientation: "h", x: 0, y: 1.0 + 20 / (170 * n) },
                   shapes: [], hovermode: "x unified" };
    var traces = [];
    function axis(i) { return i === 0 ? "" : String(i + 1); }
    for (var i = 0; i < n; i++) {
      var top = 1 - i * (h + gap);
      layout["yaxis" + axis(i)] = { domain: [top - h, top], gridcolor: "#eee", automargin: true,
                                     title: { text: i < panels.length ? panels[i][1] : runs[i - panels.length].s + ":<br>resident", font: { size: 11 } } };
      layout["xaxis" + axis(i)] = { anchor: "y" + axis(i), matches: i ? "x" : undefined,
                                     showticklabels: i === n - 1, gridcolor: "#eee",
                                     title: i === n - 1 ? { text: "time (s)" } : undefined };
    }
    runs.forEach(function (r, k) {
      var colour = r.f === "topas" ? FAMILY.topas : LINES[k % LINES.length];
      panels.forEach(function (p, i) {
        var s = r.series[p[0]];
        if (!s) { return; }
        traces.push({ type: "scatter", mode: "lines", x: s.t, y: s.v, name: r.s,
                      legendgroup: r.s, showlegend: i === 0, xaxis: "x" + axis(i),
                      yaxis: "y" + axis(i), line: { color: colour, width: r.f === "topas" ? 2.4 : 1.5,
                      shape: "hv", dash: DASHES[k % DASHES.length] },
                      hovertemplate: r.s + ": %{y:.1f}<extra></extra>" });
      });
      var agents = Object.keys(r.series).filter(function (k2) { return k2.indexOf("resident:") === 0; }).sort();
      if (agents.length) {
        var j = panels.length + k;
        traces.push({ type: "heatmap", x: r.series[agents[0]].t,
                      y: agents.map(function (a) { return a.slice(9); }),
                      z: agents.map(function (a) { return r.series[a].v; }),
                      zmin: 0, zmax: 1, colorscale: [[0, "#ffffff"], [1, "#333333"]],
                      showscale: false, xaxis: "x" + axis(j), yaxis: "y" + axis(j),
                      hovertemplate: r.s + ", %{y}: resident %{z:.0%} of the bin<extra></extra>" });
      }
    });
    layout.shapes.push({ type: "line", xref: "x3 domain", x0: 0, x1: 1, yref: "y3",
                         y0: t.budget, y1: t.budget, line: { dash: "dash", color: "#000", width: 1 } });
    layout.annotations = [{ xref: "x3 domain", x: 1, yref: "y3", y: t.budget, xanchor: "right",
                            yanchor: "bottom", text: "KV budget " + t.budget.toLocaleString("en"),
                            showarrow: false, font: { size: 10 } }];
    return draw(el, traces, layout);
  }

  var CHARTS = { board: boardChart, cdf: cdfChart, levers: leverChart,
                 "levers-source": leverSourceChart, timeline: timelineChart };
  function redraw() {
    document.querySelectorAll("[data-chart]").forEach(function (el) {
      var f = CHARTS[el.dataset.chart];
      if (f && el.offsetParent !== null && f(el)) { el.dataset.drawn = "1"; }
    });
  }

  /* --- controls --------------------------------------------------------------------------- */
  function setMetric(m) {
    state.metric = m;
    document.body.dataset.metric = m;
    document.querySelectorAll(".metric-switch button").forEach(function (b) {
      b.setAttribute("aria-pressed", String(b.dataset.metric === m));
    });
    redraw();
  }
  function applyChoice() {
    var boxes = document.querySelectorAll(".chooser input[type=checkbox]");
    var all = true, set = new Set();
    boxes.forEach(function (b) { if (b.checked) { set.add(b.value); } else { all = false; } });
    state.chosen = all ? null : set;
    document.querySelectorAll("tr[data-s]").forEach(function (tr) {
      tr.hidden = !chosen(tr.dataset.s);
    });
    var count = document.querySelector(".chosen-count");
    if (count) { count.textContent = all ? "all" : set.size + " of " + boxes.length; }
    redraw();
  }
  function preset(p) {
    var boxes = Array.prototype.slice.call(document.querySelectorAll(".chooser input[type=checkbox]"));
    boxes.forEach(function (b, i) {
      var fam = b.parentElement.className.replace("fam-", "");
      b.checked = p === "all" || fam === "topas" ||
        (p === "baseline" && fam === "baseline") ||
        (p === "peer" && (fam === "peer" || fam === "peer-2026")) ||
        (p === "top" && i < 8);
    });
    applyChoice();
  }
  function sortBy(th) {
    var table = th.closest("table"), tbody = table.tBodies[0];
    var col = Array.prototype.indexOf.call(th.parentElement.children, th);
    var asc = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    var num = th.dataset.type === "num";
    var rows = Array.prototype.slice.call(tbody.rows);
    rows.sort(function (a, b) {
      var x = a.cells[col], y = b.cells[col];
      var p = num ? parseFloat(x.dataset.v) : x.textContent, q = num ? parseFloat(y.dataset.v) : y.textContent;
      if (num) { p = isNaN(p) ? Infinity : p; q = isNaN(q) ? Infinity : q; }
      return (p < q ? -1 : p > q ? 1 : 0) * (asc ? 1 : -1);
    });
    rows.forEach(function (r) { tbody.appendChild(r); });
  }

  document.querySelectorAll(".metric-switch button").forEach(function (b) {
    b.addEventListener("click", function () { setMetric(b.dataset.metric); });
  });
  document.querySelectorAll(".chooser input[type=checkbox]").forEach(function (b) {
    b.addEventListener("change", applyChoice);
  });
  document.querySelectorAll(".chooser [data-preset]").forEach(function (b) {
    b.addEventListener("click", function () { preset(b.dataset.preset); });
  });
  document.querySelectorAll("table th").forEach(function (th) {
    th.addEventListener("click", function () { sortBy(th); });
  });
  document.querySelectorAll("details").forEach(function (d) {
    d.addEventListener("toggle", redraw);
  });
  window.topasSite = { setMetric: setMetric, preset: preset, state: state };
  redraw();
}());
