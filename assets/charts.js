// The explore charts read like one instrument: a run highlighted everywhere (window.radtCharts.highlight, also from
// the page's legend and the summary table), one crosshair across every chart, and one small tooltip box for the chart
// under the cursor: the runs at that x sorted by value (as W&B does), names only; a click pins the nearest run's details
// (workload, status, parameters). Traces carry what the box prints in their meta (app/figures/figures.py); Plotly draws no label.
(function () {
  const TIP_ROWS = 12; // series listed in the box; the rest are counted
  const DIM = 0.15; // opacity of the runs not highlighted
  const WIDER = 1.8; // the highlighted run's lines, times their own width
  const state = {current: null};
  const widths = new WeakMap(); // trace object -> its line width as drawn by the server

  function chart() {
    return document.querySelector("#charts .js-plotly-plot");
  }

  function owner(trace) {
    const meta = trace && trace.meta;
    return meta ? meta.run_id || meta.workload_id || null : null;
  }

  function baseWidth(trace) {
    if (!widths.has(trace)) {
      widths.set(trace, trace.line && typeof trace.line.width === "number" ? trace.line.width : 1.5);
    }
    return widths.get(trace);
  }

  // Opacity and width of every trace for the current highlight; restyled only where they differ (no redraw loop).
  function apply(gd) {
    if (!gd || !Array.isArray(gd.data) || !gd.data.length) { return; }
    const id = state.current;
    const opacity = [], width = [], indices = [];
    gd.data.forEach(function (trace, i) {
      const base = baseWidth(trace);
      const band = trace.meta && trace.meta.band;
      const mine = id === null || owner(trace) === id;
      const o = mine ? 1 : DIM;
      const w = id !== null && mine && !band ? base * WIDER : base;
      const nowO = trace.opacity === undefined ? 1 : trace.opacity;
      const nowW = trace.line && typeof trace.line.width === "number" ? trace.line.width : base;
      if (nowO !== o || nowW !== w) {
        opacity.push(o);
        width.push(w);
        indices.push(i);
      }
    });
    if (indices.length) {
      window.Plotly.restyle(gd, {"opacity": opacity, "line.width": width}, indices);
    }
  }

  // Hovering one chart: the same x in every chart (the spike lines; the traces draw no label of their own).
  function crosshair(gd, event) {
    if (!event || !Array.isArray(event.xvals) || !event.xvals.length || !gd._fullLayout) { return; }
    const subplots = Object.keys(gd._fullLayout._plots || {});
    if (subplots.length < 2) { return; }
    window.Plotly.Fx.hover(gd, {xval: event.xvals[0]}, subplots, true); // true: no plotly_hover of its own
  }

  // A value as the legend and the table print it (pages/parts/legend.value_text): 4 significant figures, but every digit
  // before the point (44,708 MB, where 4 significant figures read 44,710 beside the legend's 44,708).
  function number(value, fmt) {
    if (typeof value !== "number" || !isFinite(value)) { return "–"; }
    if (fmt === ".3f") { return value.toFixed(3); }
    if (fmt === ".0f") { return value.toFixed(0); }
    const size = Math.abs(value);
    const decimals = size === 0 ? 0 : Math.min(4, Math.max(0, 3 - Math.floor(Math.log10(size))));
    return value.toLocaleString("en-US", {minimumFractionDigits: decimals, maximumFractionDigits: decimals});
  }

  function xText(gd, x) {
    const meta = (gd.layout && gd.layout.meta) || {};
    const title = String(meta.x_title || "");
    if (typeof x !== "number") { return String(x).replace("T", " ").slice(0, 19) + " UTC"; }
    if (title.indexOf("(s)") >= 0) { return x.toFixed(1) + " s since start"; }
    if (title.indexOf("(min)") >= 0) { return x.toFixed(2) + " min since start"; }
    return "step " + x.toLocaleString("en-US", {maximumFractionDigits: 0}); // every digit: step 12,345, not 12,350
  }

  // Plotly's dash styles as CSS stops, as pages/parts/legend.py draws them: the box's line looks like the chart's
  const DASH_STOPS = {dash: [5, 3], dot: [2, 2], dashdot: [5, 2, 2, 2], longdash: [8, 3], longdashdot: [8, 2, 2, 2]};

  function swatch(color, dash) {
    const span = document.createElement("span");
    span.className = "legend-swatch";
    const stops = DASH_STOPS[dash];
    let at = 0;
    const parts = (stops || []).map(function (length, i) {
      const part = (i % 2 === 0 ? color : "transparent") + " " + at + "px " + (at + length) + "px";
      at += length;
      return part;
    });
    span.style.borderTop = "none";
    span.style.height = "3px";
    span.style.background = stops ? "repeating-linear-gradient(90deg, " + parts.join(", ") + ")" : color;
    return span;
  }

  function box(className) {
    let el = document.querySelector("." + className);
    if (!el) {
      el = document.createElement("div");
      el.className = className;
      document.body.appendChild(el);
    }
    return el;
  }

  // `floor`: the highest the box may start (the hovered plot's top edge: above it lies the chart's title), unless the box
  // would then run past the window's bottom
  function place(el, x, y, floor) {
    const pad = 14, w = el.offsetWidth, h = el.offsetHeight;
    const left = x + pad + w > window.innerWidth ? Math.max(4, x - pad - w) : x + pad;
    const lowest = Math.max(4, window.innerHeight - h - 4);
    const top = Math.min(Math.max(4, floor || 0, y - h / 2), lowest);
    el.style.left = left + "px";
    el.style.top = top + "px";
  }

  // The top of the hovered point's plot area in the window (its y axis's offset in the figure).
  function plotTop(gd, point) {
    const axis = point && point.yaxis;
    return axis && typeof axis._offset === "number" ? gd.getBoundingClientRect().top + axis._offset : 0;
  }

  // The one box of the hovered chart: a line per series at the cursor, highest value first, at most TIP_ROWS.
  function tooltip(gd, event) {
    const points = (event && Array.isArray(event.points) ? event.points : []).filter(function (p) {
      const meta = p.data && p.data.meta;
      return meta && !meta.band && (meta.run_id || meta.workload_id) && typeof p.y === "number" && isFinite(p.y);
    });
    const tip = box("radt-tip");
    if (!points.length) { tip.style.display = "none"; return; }
    points.sort(function (a, b) { return b.y - a.y; });
    const first = points[0].data.meta;
    tip.replaceChildren();
    const head = document.createElement("div");
    head.className = "tip-head";
    head.textContent = first.metric + (first.unit ? " (" + first.unit + ")" : "") + " · " + xText(gd, points[0].x);
    tip.appendChild(head);
    points.slice(0, TIP_ROWS).forEach(function (p) {
      const meta = p.data.meta;
      const row = document.createElement("div");
      row.className = "tip-row";
      const name = document.createElement("span");
      name.className = "tip-name";
      name.textContent = meta.name + (meta.device ? " · " + meta.device : "") + (meta.mean ? " (mean)" : "");
      const value = document.createElement("span");
      value.className = "tip-value";
      value.textContent = number(p.y, meta.fmt);
      row.append(swatch(p.data.line && p.data.line.color, meta.dash), name, value);
      if (meta.where) { row.title = meta.where; }
      tip.appendChild(row);
    });
    const hint = document.createElement("div");
    hint.className = points.length > TIP_ROWS ? "tip-more" : "tip-hint";
    hint.textContent = (points.length > TIP_ROWS ? "+" + (points.length - TIP_ROWS) + " more lower · " : "") + "click: the nearest run's details";
    tip.appendChild(hint);
    tip.style.display = "block";
    const mouse = event.event || {};
    place(tip, mouse.clientX || 0, mouse.clientY || 0, plotTop(gd, points[0])); // never over the chart's title (issue 52)
  }

  function hideTip() {
    const tip = document.querySelector(".radt-tip");
    if (tip) { tip.style.display = "none"; }
  }

  // A click: the run whose point at that x lies nearest the cursor, its details in a box that stays until closed.
  function details(gd, event) {
    const mouse = event && event.event;
    const points = (event && Array.isArray(event.points) ? event.points : []).filter(function (p) {
      return p.data && p.data.meta && p.data.meta.run_id && !p.data.meta.band && typeof p.y === "number";
    });
    if (!points.length || !mouse) { return; }
    const top = gd.getBoundingClientRect().top;
    let nearest = points[0], best = Infinity;
    points.forEach(function (p) {
      const y = top + p.yaxis._offset + p.yaxis.l2p(p.y);
      if (Math.abs(y - mouse.clientY) < best) { best = Math.abs(y - mouse.clientY); nearest = p; }
    });
    const id = nearest.data.meta.run_id;
    const info = (gd.data.find(function (t) { return t.meta && t.meta.run_id === id && t.meta.detail; }) || {meta: {}}).meta.detail || {};
    const panel = box("radt-details");
    panel.replaceChildren();
    const close = document.createElement("button");
    close.className = "close";
    close.textContent = "×";
    close.title = "close (Esc)";
    close.addEventListener("click", function () { panel.style.display = "none"; });
    const title = document.createElement("strong");
    title.textContent = info.run || nearest.data.meta.name;
    const list = document.createElement("dl");
    const rows = [["workload", info.workload], ["status", info.status], ["series", nearest.data.meta.device], ["GPU", nearest.data.meta.where]];
    Object.entries(info.params || {}).forEach(function (kv) { rows.push(kv); });
    rows.forEach(function (kv) {
      if (!kv[1]) { return; }
      const dt = document.createElement("dt");
      dt.textContent = kv[0];
      const dd = document.createElement("dd");
      dd.textContent = kv[1];
      list.append(dt, dd);
    });
    panel.append(close, title, list);
    panel.style.display = "block";
    place(panel, mouse.clientX, mouse.clientY);
    api.highlight(id);
  }

  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape") {
      const panel = document.querySelector(".radt-details");
      if (panel) { panel.style.display = "none"; }
    }
  });
  // "per GPU" in the legend's header: each device's row, kept across redraws (the legend is drawn anew with the charts)
  document.addEventListener("click", function (event) {
    const toggle = event.target instanceof Element ? event.target.closest(".legend-devices-toggle") : null;
    if (toggle) { document.body.classList.toggle("radt-legend-devices"); event.stopPropagation(); fitLegend(); } // devices' rows: wider names
  }, true);

  // "max" and "last" in the legend's header (pages/parts/legend.py): those columns show where the table fits its box, fitted
  // again whenever the legend is drawn anew or the window resized, until the user picks; then as picked (this tab's session)
  const OPTIONAL = ["last", "max"]; // hidden in this order while the table is wider than its box; the mean always shows
  const PICKED = "radt-legend-stats";
  let picked = null; // {max: true, last: false} once the user has clicked one
  try { picked = JSON.parse(window.sessionStorage.getItem(PICKED) || "null"); } catch (e) { picked = null; }
  function showStat(k, on) { document.body.classList.toggle("radt-legend-no-" + k, !on); }
  function statShown(k) { return !document.body.classList.contains("radt-legend-no-" + k); }
  function fitLegend() {
    const table = document.querySelector(".chart-legend .legend-table");
    if (!table) { return; }
    const box = table.parentElement;
    OPTIONAL.forEach(function (k) { showStat(k, picked ? picked[k] !== false : true); });
    const heads = Array.from(table.querySelectorAll("thead th"));
    heads.forEach(function (th) { th.style.width = ""; }); // laid out afresh: the names in their mean columns, as Chromium sizes them
    table.querySelectorAll(".legend-chart-name").forEach(function (name) { name.style.width = ""; name.style.marginRight = ""; });
    if (!picked) {
      OPTIONAL.forEach(function (k) { if (box.scrollWidth > box.clientWidth) { showStat(k, false); } });
    }
    table.querySelectorAll(".legend-stat-toggle").forEach(function (b) {
      b.setAttribute("aria-pressed", String(statShown(b.dataset.stat)));
    });
    spanNames(heads);
    markBelow();
  }
  // The bar that stays over the charts is a fifth of the window at most (page.css): where the legend's rows need more it
  // scrolls, and the runs below its fold are counted under it (an overlay scrollbar shows no sign of them).
  function markBelow() {
    const box = document.querySelector(".chart-legend"), note = document.querySelector(".legend-below");
    if (!box || !note) { return; }
    for (let pass = 0; pass < 2; pass++) { // the note takes a line of the bar: counted again with it shown
      const bottom = box.getBoundingClientRect().bottom;
      const below = Array.from(box.querySelectorAll("tr.legend-entry:not(.legend-device)"))
        .filter(function (row) { return row.getBoundingClientRect().bottom > bottom + 0.5; }).length;
      const text = below ? "\u2193 " + below + (below === 1 ? " more run" : " more runs") + " below: scroll the legend" : "";
      if (note.textContent !== text) { note.textContent = text; }
    }
  }
  document.addEventListener("scroll", function (event) {
    if (event.target instanceof Element && event.target.classList.contains("chart-legend")) { markBelow(); }
  }, true);
  // A chart's name wrapped inside its mean column (4 lines for "CPU (% of all cores)") while its max column stood empty
  // beside it: each column's width is kept as laid out, then each name is widened over its chart's shown columns.
  function spanNames(heads) {
    const widths = heads.map(function (th) { return Math.floor(th.getBoundingClientRect().width); }); // read all, then write
    const spans = heads.map(function (th, i) {
      const name = th.querySelector(".legend-chart-name");
      if (!name) { return null; }
      let right = th.getBoundingClientRect().right - parseFloat(getComputedStyle(th).paddingRight);
      for (let j = i + 1; j < heads.length && !heads[j].classList.contains("legend-first"); j++) {
        if (heads[j].offsetParent !== null) { right = heads[j].getBoundingClientRect().right - parseFloat(getComputedStyle(heads[j]).paddingRight); }
      }
      const own = name.parentElement.getBoundingClientRect();
      return [name, Math.floor(right - own.left), own.width];
    });
    heads.forEach(function (th, i) { if (th.offsetParent !== null) { th.style.width = widths[i] + "px"; } });
    spans.forEach(function (s) {
      if (!s || s[1] <= s[2]) { return; }
      s[0].style.width = s[1] + "px";
      s[0].style.marginRight = (s[2] - s[1]) + "px"; // the column keeps its width: the name lies over its max and last
    });
  }
  document.addEventListener("click", function (event) {
    const toggle = event.target instanceof Element ? event.target.closest(".legend-stat-toggle") : null;
    if (!toggle) { return; }
    event.stopPropagation();
    picked = {};
    OPTIONAL.forEach(function (k) { picked[k] = statShown(k); });
    picked[toggle.dataset.stat] = !picked[toggle.dataset.stat];
    try { window.sessionStorage.setItem(PICKED, JSON.stringify(picked)); } catch (e) { /* storage off: kept for this page */ }
    fitLegend();
  }, true);
  window.addEventListener("resize", fitLegend);

  function legendItems(gd) {
    gd.querySelectorAll(".legend .traces").forEach(function (item) {
      if (item._radtBound) { return; }
      item._radtBound = true;
      const trace = function () {
        const d = item.__data__;
        return d && d[0] ? d[0].trace : null;
      };
      item.addEventListener("mouseenter", function () {
        const id = owner(trace());
        if (id) { api.preview(id); }
      });
      item.addEventListener("mouseleave", function () { api.preview(null); });
    });
  }

  function bind(gd) {
    if (!gd || gd._radtBound || typeof gd.on !== "function") { return; }
    gd._radtBound = true;
    gd.on("plotly_afterplot", function () {
      legendItems(gd);
      apply(gd);
    });
    gd.on("plotly_hover", function (event) {
      tooltip(gd, event);
      crosshair(gd, event);
    });
    gd.on("plotly_unhover", hideTip);
    gd.on("plotly_click", function (event) { details(gd, event); });
    gd.on("plotly_legendclick", function (event) {
      const id = owner(event && event.data ? event.data[event.curveNumber] : null);
      if (!id) { return true; }
      api.highlight(state.pinned === id ? null : id);
      return false; // a click highlights; Plotly's hide-this-trace stays on double-click
    });
    legendItems(gd);
    apply(gd);
  }

  const api = {
    // Highlight a run (or workload) id in every chart, dimming the rest; null restores all.
    highlight: function (id) {
      state.pinned = id || null;
      state.current = state.pinned;
      apply(chart());
    },
    // A hover preview (legend hover): the run highlighted while hovered, then the pinned one again.
    preview: function (id) {
      state.current = id || state.pinned || null;
      apply(chart());
    },
    current: function () { return state.current; },
  };
  state.pinned = null;
  window.radtCharts = api;

  function inLegend(record) {
    return record.target instanceof Element && record.target.closest(".chart-legend") !== null;
  }
  const observer = new MutationObserver(function (records) {
    bind(chart());
    if (records.some(inLegend)) { fitLegend(); } // the legend drawn anew: fitted to its box again
  });
  function start() {
    observer.observe(document.body, {childList: true, subtree: true});
    bind(chart());
    fitLegend();
  }
  if (document.body) { start(); } else { document.addEventListener("DOMContentLoaded", start); }
})();
