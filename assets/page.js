// The explore page's shell in the browser: the view in the URL (with history), the sticky HTML legend (its hover, and
// its leaving past the charts), the Live tab's "explore →" links (they add the run to the last explore view), and the
// Live cards of one workload on one time range.
(function () {
  const SAVED = "radt.explore.view"; // the query string of the last explore view, in this tab and across tabs
  const state = { acted: 0, synced: 0, pinned: null };

  // a user's own action (a click, a key): the next view change is theirs, so it gets a history entry
  ["pointerdown", "keydown"].forEach(function (kind) {
    document.addEventListener(kind, function () { state.acted = performance.now(); }, true);
  });

  // --- charts per row: an explore link that does not say (cols) gets WIDE_COLUMNS on a window of WIDE_SCREEN px or more,
  // app/view/views.py's default (one) below. Decided before Dash reads the URL (this file runs before the renderer starts, and
  // in-app links go through pushState), so the first draw is the right one; a link with cols=N keeps N.
  const WIDE_COLUMNS = 2, WIDE_SCREEN = 1400; // px of window; README's dashboard section says the same

  function isExplore(path) { return path === "/" || path.endsWith("/"); }

  // --- a long view goes in the URL's fragment: a view of 1,000 runs is 33k+ characters, and a request line over 4,094
  // (gunicorn's default; nginx's 8k buffers) is refused with HTTP 400. The browser never sends the fragment: a view of up to
  // IN_PATH characters is written ?view, a longer one #view; on load #view is moved into ?view for Dash to read (no request
  // is made), and the first sync writes it back as #view. app/view/views.py bounds what the page reads from it.
  const IN_PATH = 2000; // characters of a view kept in the URL's query string
  const VIEW_HASH = /^#[^#]*=/; // a fragment that holds a view (key=value...), not an anchor

  function viewHref(path, query) { return path + (query.length > IN_PATH ? "#" : "?") + query; }

  function viewOf(target) { // a URL's view: its query string, and the fragment's keys over it
    const params = new URLSearchParams(target.search);
    if (VIEW_HASH.test(target.hash)) { new URLSearchParams(target.hash.slice(1)).forEach(function (v, k) { params.set(k, v); }); }
    return params;
  }

  function withColumns(url) {
    if (url === undefined || url === null) { return url; }
    const target = new URL(String(url), window.location.href);
    const params = viewOf(target);
    if (!isExplore(target.pathname) || params.has("cols") || window.innerWidth < WIDE_SCREEN) { return url; }
    params.set("cols", String(WIDE_COLUMNS));
    return VIEW_HASH.test(target.hash) ? viewHref(target.pathname, params.toString()) : target.pathname + "?" + params.toString() + target.hash;
  }

  if (isExplore(window.location.pathname) && VIEW_HASH.test(window.location.hash)) { // #view: for Dash to read, before it starts
    window.history.replaceState(window.history.state, "", window.location.pathname + "?" + viewOf(window.location).toString());
  }
  const loaded = withColumns(window.location.href);
  if (loaded !== window.location.href) { window.history.replaceState(window.history.state, "", loaded); }
  const pushState = window.history.pushState.bind(window.history);
  window.history.pushState = function (data, title, url) { return pushState(data, title, withColumns(url)); };

  function saved() {
    try { return window.sessionStorage.getItem(SAVED) || window.localStorage.getItem(SAVED); } catch (e) { return null; }
  }

  function save(query) {
    try { window.sessionStorage.setItem(SAVED, query); window.localStorage.setItem(SAVED, query); } catch (e) { /* storage off: links open the run alone */ }
  }

  // --- the view in the URL: pushState after a user's change (back and forward step through views), replaceState otherwise
  function syncUrl(view) {
    if (!view) { return window.dash_clientside.no_update; }
    const query = new URLSearchParams(view).toString();
    if (window.location.pathname === "/" || window.location.pathname.endsWith("/")) { save(query); }
    const url = viewHref(window.location.pathname, query);
    if (window.location.pathname + window.location.search + window.location.hash !== url) {
      if (state.acted > state.synced) { window.history.pushState({ radtView: query }, "", url); }
      else { window.history.replaceState({ radtView: query }, "", url); }
    }
    state.synced = performance.now();
    return "";
  }

  // back or forward to another explore view: draw the view that URL holds
  window.addEventListener("popstate", function () {
    if (document.getElementById("charts")) { window.location.reload(); }
  });

  window.dash_clientside = Object.assign({}, window.dash_clientside, { radt_page: { sync_url: syncUrl } });

  // --- the sticky legend: hover highlights a run (charts.js dims the rest), a click keeps it highlighted
  function highlight(id) {
    const charts = window.radtCharts;
    if (charts && typeof charts.highlight === "function") { charts.highlight(id); }
    document.querySelectorAll(".chart-legend .legend-entry").forEach(function (entry) {
      entry.classList.toggle("dimmed", id !== null && entry.dataset.id !== id);
      entry.classList.toggle("pinned", state.pinned !== null && entry.dataset.id === state.pinned);
    });
  }

  function entryOf(event) {
    return event.target instanceof Element ? event.target.closest(".chart-legend .legend-entry") : null;
  }

  document.addEventListener("mouseover", function (event) {
    const entry = entryOf(event);
    if (entry) { highlight(entry.dataset.id); }
  });
  document.addEventListener("mouseout", function (event) {
    const entry = entryOf(event);
    if (entry && !(event.relatedTarget instanceof Element && entry.contains(event.relatedTarget))) { highlight(state.pinned); }
  });
  document.addEventListener("click", function (event) {
    const entry = entryOf(event);
    if (!entry) { return; }
    state.pinned = state.pinned === entry.dataset.id ? null : entry.dataset.id;
    highlight(state.pinned === null ? entry.dataset.id : state.pinned);
  });

  // --- the sticky legend (page.css) leaves once the charts' end scrolls under it: stuck over their last row it hid it for good,
  // the bar moving up with the end of its section
  let legendFrame = 0;
  function legendPast() {
    legendFrame = 0;
    const bar = document.querySelector(".page-bar"), section = document.querySelector(".chart-section");
    if (!bar || !section) { return; }
    const past = section.getBoundingClientRect().bottom < bar.offsetHeight + 8; // its margin below it, in the section
    if (bar.classList.contains("past-charts") !== past) { bar.classList.toggle("past-charts", past); }
  }
  function legendSoon() { if (!legendFrame) { legendFrame = window.requestAnimationFrame(legendPast); } }
  window.addEventListener("scroll", legendSoon, { passive: true });
  window.addEventListener("resize", legendSoon);

  // --- Live → explore: the run joins the last explore view (its experiment ticked, its zoom dropped to show the run whole)
  function exploreHref(link) {
    const params = new URLSearchParams(saved() || "");
    function add(key, value) {
      if (!value) { return; }
      const parts = (params.get(key) || "").split(",").filter(Boolean);
      if (!parts.includes(value)) { parts.push(value); }
      params.set(key, parts.join(","));
    }
    add("exp", link.dataset.exp);
    add("runs", link.dataset.run);
    params.delete("xr");
    // the explore page's path is the link's own (the dashboard's, under a reverse proxy's RADT_URL_PREFIX: /radt/)
    return viewHref(new URL(link.getAttribute("href") || "", window.location.href).pathname, params.toString());
  }

  function freshLink(event) {
    const link = event.target instanceof Element ? event.target.closest("a.explore-link[data-run]") : null;
    if (link) { link.setAttribute("href", exploreHref(link)); }
  }
  ["pointerdown", "mouseover", "focusin", "click"].forEach(function (kind) { document.addEventListener(kind, freshLink, true); });

  // --- Live: the cards of one workload (collocated runs) share one time range
  function sameRange() {
    if (!window.Plotly) { return; }
    document.querySelectorAll(".live-workload").forEach(function (workload) {
      const charts = Array.from(workload.querySelectorAll(".live-chart .js-plotly-plot")).filter(function (g) { return g._fullLayout && g.data; });
      if (charts.length < 2) { return; }
      let low = Infinity, high = -Infinity;
      charts.forEach(function (g) {
        const axis = g._fullLayout.xaxis;
        g.data.forEach(function (trace) {
          const xs = trace.x || [];
          if (!xs.length) { return; }
          low = Math.min(low, axis.d2l(xs[0]));
          high = Math.max(high, axis.d2l(xs[xs.length - 1]));
        });
      });
      if (!(high > low)) { return; }
      charts.forEach(function (g) {
        const axis = g._fullLayout.xaxis;
        const range = axis.range || [];
        if (Math.abs(axis.r2l(range[0]) - low) > 1 || Math.abs(axis.r2l(range[1]) - high) > 1) {
          window.Plotly.relayout(g, { "xaxis.range": [axis.l2r(low), axis.l2r(high)] });
        }
      });
    });
  }
  window.setInterval(sameRange, 1000);
})();
