// The explore charts read like one instrument: a run highlighted everywhere (window.radtCharts.highlight, also from
// the page's legend and the summary table), and one crosshair: hovering any chart shows every chart's values at that x.
(function () {
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

  // Hovering one chart: the same x in every chart, each showing its own values (Plotly's hovermode "x").
  function crosshair(gd, event) {
    if (!event || !Array.isArray(event.xvals) || !event.xvals.length || !gd._fullLayout) { return; }
    const subplots = Object.keys(gd._fullLayout._plots || {});
    if (subplots.length < 2) { return; }
    window.Plotly.Fx.hover(gd, {xval: event.xvals[0]}, subplots, true); // true: no plotly_hover of its own
  }

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
    gd.on("plotly_hover", function (event) { crosshair(gd, event); });
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

  const observer = new MutationObserver(function () { bind(chart()); });
  function start() {
    observer.observe(document.body, {childList: true, subtree: true});
    bind(chart());
  }
  if (document.body) { start(); } else { document.addEventListener("DOMContentLoaded", start); }
})();
