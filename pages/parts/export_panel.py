"""The explore page's export panel: paper figures, their data, the comparison table, and saved views (app/export/, app/view/views.py).

No page of its own: explore.py places ``layout()`` and calls ``register()`` each time Dash loads
that page, so every dashboard built in a process gets these callbacks once.
"""

from __future__ import annotations

from urllib.parse import urlencode

import dash
from dash import ALL, Input, Output, State, callback, clientside_callback, ctx, dcc, html

from radt.app.view.views import View, ViewError, save_view
from radt.pages.parts import ids


def layout() -> list:
    """The panel (size, font, colour or monochrome, legend, DPI; PNG/SVG/PDF/CSV downloads; save and open a view) and its download holders."""
    from radt.app.export.exportoptions import LEGENDS, SIZES

    panel = html.Details(
        [
            html.Summary("Export"),
            html.Div(
                [
                    html.Label(["size", dcc.Dropdown(id=ids.EXPORT_SIZE, options=list(SIZES), value="double-column", clearable=False)]),
                    # no min/max: the browser would send an out-of-range number as nothing; the server bounds them and says so
                    html.Label(["font (pt)", dcc.Input(id=ids.EXPORT_FONT, type="number", value=9)]),
                    html.Label(["DPI (PNG)", dcc.Input(id=ids.EXPORT_DPI, type="number", value=300)]),
                    html.Label(["height (in)", dcc.Input(id=ids.EXPORT_HEIGHT, type="number", placeholder="fit 9", step=0.1)]),
                    html.Label(["legend", dcc.Dropdown(id=ids.EXPORT_LEGEND, options=list(LEGENDS), value="top", clearable=False)]),
                    dcc.RadioItems(
                        id=ids.EXPORT_COLOUR,
                        options=[{"label": "colour", "value": "colour"}, {"label": "monochrome", "value": "mono"}],
                        value="colour",
                        inline=True,
                    ),
                ],
                className="export-options",
            ),
            html.Div([html.Span("charts: "), dcc.Checklist(id=ids.EXPORT_CHARTS, options=[], value=[], inline=True)], className="export-charts"),
            html.Div(
                [html.Button(fmt.upper(), id=ids.export_button(fmt), n_clicks=0, className="export-button") for fmt in ("png", "svg", "pdf", "csv")]
                + [html.Button("table CSV", id=ids.export_button("table"), n_clicks=0, className="export-button")]
                + [html.Button("comparison PDF", id=ids.export_button("comparison"), n_clicks=0, className="export-button")]
                + [
                    html.Button("save view", id=ids.SAVE_VIEW, n_clicks=0, className="export-button"),
                    dcc.Upload(html.Button("open view", className="export-button"), id=ids.OPEN_VIEW),
                ],
                className="export-buttons",
            ),
            html.Div(id=ids.EXPORT_STATUS, className="export-status"),
        ],
        className="export",
    )
    return [panel, dcc.Download(id=ids.EXPORT_DOWNLOAD), dcc.Store(id=ids.OPEN_VIEW_QUERY), html.Div(id=ids.OPEN_VIEW_SINK, hidden=True)]


def view_query(view: dict) -> str:
    """The query string of a view, as the page writes it into the URL."""
    return urlencode(view)


def export_charts(metric_specs):
    """Every chart on screen is exported unless unticked here."""
    from radt.app.view.data import spec_metric

    specs = View.from_dict({"metrics": metric_specs}).metrics if metric_specs else []
    return [{"label": spec_metric(spec).label, "value": spec} for spec in specs], specs


def export(_clicks, _save, view_data, size, font, dpi, legend, colour, charts, height=None, kind="bar", by="workload", stat="smact_mean", run=None):
    """The chosen file as a download, with a line saying what was left out or what went wrong."""
    from radt.app.export.exportoptions import FORMATS, ExportError, ExportStyle, check_style
    from radt.app.export.image import image_bytes
    from radt.app.export.paper import comparison_figure, comparison_table, figure_for
    from radt.app.export.tables import data_csv, table_csv

    view = View.from_dict(view_data)
    if ctx.triggered_id == ids.SAVE_VIEW:
        return {"content": save_view(view), "filename": "radt-view.json", "type": "application/json"}, "view saved"
    fmt = ctx.triggered_id.get(ids.FORMAT_KEY) if isinstance(ctx.triggered_id, dict) else None
    charts = [c for c in charts if c in view.metrics] if isinstance(charts, list) else []  # the view's own (checked) metrics only
    try:
        if fmt == "table":
            csv_text = table_csv(comparison_table(view))
            return {"content": csv_text, "filename": "radt-table.csv", "type": "text/csv"}, "comparison table exported"
        if fmt == "comparison":  # the figure of the comparison section, as chosen there
            style = check_style(ExportStyle(size, 9 if font is None else font, colour == "mono", legend, dpi, height=height), "pdf")
            figure = comparison_figure(view, style, kind or "bar", stat or "smact_mean", by or "workload", run if isinstance(run, str) else None)
            return dcc.send_bytes(image_bytes(figure, "pdf", style.dpi), f"radt-{kind}.pdf"), f"comparison figure ({kind}) exported"
        if fmt not in FORMATS:
            return dash.no_update, f"cannot export '{str(fmt)[:20]}'; choose PNG, SVG, PDF or CSV"
        if not charts:
            return dash.no_update, "tick at least one chart to export"
        if fmt == "csv":
            text, missing = data_csv(view, charts)
            download = {"content": text, "filename": "radt-data.csv", "type": "text/csv"}
        else:  # bounded here, not by the form: a request can carry any DPI (a PNG's pixels are capped in image_bytes)
            style = check_style(ExportStyle(size, 9 if font is None else font, colour == "mono", legend, dpi, charts, height), fmt)
            figure, missing = figure_for(view, style)
            download = dcc.send_bytes(image_bytes(figure, fmt, style.dpi), f"radt-figure.{fmt}")
    except (ExportError, ValueError) as exc:
        return dash.no_update, str(exc)
    left_out = "; ".join(f"{spec.partition(':')[2]} absent from {', '.join(names)}" for spec, names in missing.items())
    return download, f"{fmt.upper()} exported" + (f" ({left_out}: those runs are left out of that chart)" if left_out else "")


def open_view(contents: str | None):
    """A saved view file opens as this page's URL (the URL is the view)."""
    import base64
    import json

    try:
        raw = json.loads(base64.b64decode((contents if isinstance(contents, str) and "," in contents else ",").split(",", 1)[1]))
        if not isinstance(raw, dict) or "runs" not in raw:
            raise ViewError("not a radt view (no 'runs')")
    except (ValueError, ViewError) as exc:
        return dash.no_update, f"cannot open that file: {exc}; choose a view saved with 'save view'"
    return view_query(View.from_dict(raw).to_dict()), "opening the view"


def register() -> None:
    """The panel's callbacks, for the dashboard Dash is building now (called as Dash loads the explore page)."""
    callback(Output(ids.EXPORT_CHARTS, "options"), Output(ids.EXPORT_CHARTS, "value"), Input(ids.METRICS, "value"))(export_charts)
    callback(
        Output(ids.EXPORT_DOWNLOAD, "data"),
        Output(ids.EXPORT_STATUS, "children"),
        Input(ids.export_button(ALL), "n_clicks"),
        Input(ids.SAVE_VIEW, "n_clicks"),
        State(ids.VIEW, "data"),
        State(ids.EXPORT_SIZE, "value"),
        State(ids.EXPORT_FONT, "value"),
        State(ids.EXPORT_DPI, "value"),
        State(ids.EXPORT_LEGEND, "value"),
        State(ids.EXPORT_COLOUR, "value"),
        State(ids.EXPORT_CHARTS, "value"),
        State(ids.EXPORT_HEIGHT, "value"),
        State(ids.COMPARE_KIND, "value"),
        State(ids.COMPARE_BY, "value"),
        State(ids.COMPARE_STAT, "value"),
        State(ids.COMPARE_RUN, "value"),
        prevent_initial_call=True,
    )(export)
    callback(
        Output(ids.OPEN_VIEW_QUERY, "data"),
        Output(ids.EXPORT_STATUS, "children", allow_duplicate=True),
        Input(ids.OPEN_VIEW, "contents"),
        prevent_initial_call=True,
    )(open_view)
    clientside_callback(  # the URL is the view: open the saved one by loading its URL
        "function(query) { if (query) { window.location.assign(window.location.pathname + '?' + query); } return ''; }",
        Output(ids.OPEN_VIEW_SINK, "children"),
        Input(ids.OPEN_VIEW_QUERY, "data"),
        prevent_initial_call=True,
    )
