// The explore chart's zoom, kept in the browser: every Plotly relayout event is folded in here at
// once (a server callback would see only the latest event and drop a zoom followed by an autosize).
window.dash_clientside = Object.assign({}, window.dash_clientside, {
  radt: {
    zoom: function (relayout, previous, xMode, groupMode) {
      const axis = xMode + "-" + groupMode;
      const before = previous && previous.axis === axis ? previous.range : null;
      if (!relayout) { return window.dash_clientside.no_update; }
      let low = null, high = null, reset = false;
      for (const [name, value] of Object.entries(relayout)) {
        if (/^xaxis\d*\.autorange$/.test(name) && value) { reset = true; }
        else if (/^xaxis\d*\.range$/.test(name) && Array.isArray(value) && value.length === 2) { [low, high] = value; }
        else if (/^xaxis\d*\.range\[0\]$/.test(name)) { low = value; }
        else if (/^xaxis\d*\.range\[1\]$/.test(name)) { high = value; }
      }
      // a short run's "since start" axis counts seconds (app/figures/figures.py, layout.meta.x_per_minute): the view keeps minutes
      const graph = document.querySelector("#charts .js-plotly-plot");
      const perMinute = graph && graph.layout && graph.layout.meta && Number(graph.layout.meta.x_per_minute) > 1 ? Number(graph.layout.meta.x_per_minute) : 1;
      if (perMinute !== 1 && xMode === "relative" && low !== null && high !== null) { low = Number(low) / perMinute; high = Number(high) / perMinute; }
      const range = reset ? null : (low !== null && high !== null ? low + "," + high : before);
      if (range === before && previous && previous.axis === axis) { return window.dash_clientside.no_update; }
      return {axis: axis, range: range};
    }
  }
});
