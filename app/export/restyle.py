"""A figure restyled for print: a fixed size in inches, one font size, colour or monochrome (dash styles and markers),
the legend where asked in margin kept free for it, y ticks that do not collide, many charts as a grid of small multiples
that fits a page (7 × 9 in unless a height is given)."""

from __future__ import annotations

import dataclasses
import math
import re
from html import unescape
from typing import NamedTuple

import plotly.graph_objects as go

from radt.app.export.aggregates import cut_label
from radt.app.export.exportoptions import HEIGHT_RANGE, LEGENDS, SIZES, ExportError, ExportStyle
from radt.app.figures.figures import plain, wrap_words
from radt.app.figures.palette import PAPER, themed
from radt.app.figures.words import counted

CSS_DPI = 96  # Plotly's pixel is a CSS pixel: 96 per inch
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
MARKERS = ("circle", "square", "triangle-up", "diamond", "x", "cross", "star", "triangle-down")
GREYS = ("#000000", "#555555", "#888888")
PAGE_HEIGHT = 9.0  # inches: the default height a figure must fit (a single-column page's text block)
PAGE_LIMITS = {"single-column": 9.0, "double-column": 9.5, "slide": None}  # inches a figure may grow to, legend included
LEGEND_FONT_FLOOR = 6.0  # points: a legend that does not fit is set smaller down to this, then refused with the fix
MIN_ROW = 1.5  # inches: a chart row shorter than this is unreadable, so more columns are used first
MAX_COLUMNS = {"single-column": 1, "double-column": 2, "slide": 3}


def page_grid(charts: int, style: ExportStyle) -> int:
    """How many columns `charts` charts take at the style's width so that they fit its height (MIN_ROW tall rows or more):
    a slide's is its 16:9 page (9 in had put 8 charts in 4 rows of a 5.6 in slide, each too short for its tick labels)."""
    width_in, row_in = SIZES.get(style.size, SIZES["double-column"])
    limit = style.height or (width_in * 9 / 16 if row_in is None else PAGE_HEIGHT)
    overhead = 1.0 + (0.4 if style.legend in ("top", "bottom") else 0.0)  # titles, axes and a legend of about two lines, in inches
    widest = MAX_COLUMNS.get(style.size, 1)
    for columns in range(1, widest + 1):
        if math.ceil(charts / columns) * MIN_ROW + overhead <= limit:
            return columns
    return widest


def legend_blocks(figure: go.Figure) -> list[tuple[str, list[str]]]:
    """The legend as Plotly lays it out: per legend group its title ("" for none) and its entries' names, in order. A run's
    GPU and host series, envelopes and bands share its group and its one entry; a CDF's lines are one group per
    experiment, a title and an entry per workload (they had been counted one entry per experiment)."""
    blocks: dict[str, tuple[str, list[str]]] = {}
    for trace in figure.data:
        if trace.showlegend is False or not trace.name or (trace.legend or "legend") != "legend":
            continue
        title = trace.legendgrouptitle.text if trace.legendgrouptitle and trace.legendgrouptitle.text else ""
        _title, names = blocks.setdefault(trace.legendgroup or f"\0{trace.name}", (str(title), []))
        if str(trace.name) not in names:
            names.append(str(trace.name))
    return list(blocks.values())


LEGEND_CHARS = 60  # an exported legend entry's line at most this long, then '…' (a run's name is the user's)


def _cut_legend(out: go.Figure) -> None:
    """Each legend entry's lines cut at LEGEND_CHARS: a run named with 300 characters and no space ran past the figure."""
    for trace in out.data:
        if trace.name and len(str(trace.name)) > LEGEND_CHARS:  # a line of radt's own markup (<i>experiment</i>) is kept
            lines = str(trace.name).split("<br>")
            trace.name = "<br>".join(
                line if "<" in line or len(unescape(line)) <= LEGEND_CHARS else _plain(cut_label(unescape(line), LEGEND_CHARS)) for line in lines
            )


def _legend_texts(blocks: list[tuple[str, list[str]]]) -> list[str]:
    """Every line of text the legend holds: its groups' titles and its entries."""
    return [t for title, names in blocks for t in [*([title] if title else []), *names]]


def _wrap_legend(out: go.Figure, width_px: float, font: float) -> float:
    """A right-hand legend's entries and group titles wrapped at words to `width_px` (Plotly cuts them at the figure's
    edge); the legend's height in px."""
    for trace in out.data:
        if trace.name and (trace.legend or "legend") == "legend":
            trace.name = _wrapped(str(trace.name), width_px, font)
        if trace.legendgrouptitle and trace.legendgrouptitle.text:
            trace.legendgrouptitle.text = _wrapped(str(trace.legendgrouptitle.text), width_px, font)
    return sum(_entry_px(t, font) for t in _legend_texts(legend_blocks(out)))


def legend_names(figure: go.Figure) -> list[str]:
    """The names the legend shows, one per entry (group titles aside)."""
    return [name for _title, names in legend_blocks(figure) for name in names]


def _text_px(text: str, font: float) -> float:
    """About how wide a line of text is in pixels (DejaVu Sans: 0.64 em a character on average, with digits and capitals)."""
    return len(text) * 0.64 * font


ITEM_PX = 46  # what Plotly adds to a legend entry's text width: the 40 px symbol and the gap to the next column
SYMBOL_PX, ITEM_GAP_PX = 40, 5  # Plotly's legend symbol with the gaps around it (itemwidth 30, itemGap 5 each side); its itemGap
AUTOMARGIN_PX = 16  # of the plot's width, what Plotly's automargin may take before it lays out a legend's columns
LEGEND_BOX_PX = 10  # Plotly's padding of a legend's rows, 5 px above and 5 below (its itemGap): the box it draws
LEGEND_PAD_PX = LEGEND_BOX_PX + 2  # a legend above the charts: its box and a little air before the first chart's title
TICK_GAP_FONTS = 2.5  # font sizes between a y axis's neighbouring tick labels, at least: closer, "40k" stands on "30k"
TICK_STEPS = (1, 2, 2.5, 5)  # a y axis's tick step is one of these times a power of ten
PLOTLY_TICK_PX = 40  # Plotly's own least spacing of y tick labels: kept where a chart is tall enough


def legend_size(blocks: list[tuple[str, list[str]]], width_px: float, font: float) -> tuple[float, float]:
    """(height, text width) in px of a horizontal legend of `blocks` (legend_blocks) in `width_px`, entries of equal
    width: Plotly lays out `entrywidth` columns exactly (each entrywidth + SYMBOL_PX + ITEM_GAP_PX wide), a group's title and entries
    stacked in its column, an entry as tall as its lines, so the room reserved is the room drawn. A wrapped command is
    as wide as its widest line (counted as one line, six commands took one column, a third of the figure). The columns
    fit `width_px` less AUTOMARGIN_PX: the last x tick label and a y title at 6 pt push the plot narrower than its
    margins say, and Plotly wrapped the devices' key into a row more than was reserved, under the figure's edge."""
    if not blocks:
        return 0.0, 0.0
    text = max(_line_px(t, font) for t in _legend_texts(blocks)) + 4
    columns = max(1, int((width_px - AUTOMARGIN_PX + ITEM_GAP_PX) // (text + SYMBOL_PX + ITEM_GAP_PX)))  # Plotly's wrap

    def height(block: tuple[str, list[str]]) -> float:
        return sum(_entry_px(t, font) for t in _legend_texts([block]))

    return sum(max(height(b) for b in blocks[i : i + columns]) for i in range(0, len(blocks), columns)), text


def _line_px(text: str, font: float) -> float:
    """The width of Plotly text's widest line: its markup left out, its entities one character."""
    return max(_text_px(unescape(re.sub(r"<[^>]*>", "", line)), font) for line in text.split("<br>"))


def _entry_px(text: str, font: float) -> float:
    """A legend entry's (or group title's) height: a row, or its lines at Plotly's 1.3 line spacing."""
    return max(_row_px(font), (text.count("<br>") + 1) * 1.3 * font + 3)


def _row_px(font: float) -> float:
    """A legend row's height: Plotly's 19 px up to 12 px text, the text's line above that."""
    return max(19.0, 1.3 * font + 4)


def _dash_key(out: go.Figure) -> list[str]:
    """The small key of a view whose runs have several devices: which dash style is which GPU, node or slice, as a second
    legend of grey lines under the charts (the runs' legend names each run once). The keys' labels, in order."""
    by_dash: dict[str, list[str]] = {}
    for trace in out.data:
        meta = trace.meta if isinstance(trace.meta, dict) else {}
        if meta.get("run_id") and not meta.get("band") and meta.get("device") and meta.get("dash"):
            labels = by_dash.setdefault(str(meta["dash"]), [])
            if str(meta["device"]) not in labels:
                labels.append(str(meta["device"]))
    if len(by_dash) < 2:  # every series solid: one device per run, nothing to tell apart
        return []
    labels = []
    for dash, devices in by_dash.items():
        label = " / ".join(devices[:3]) + (f" +{len(devices) - 3}" if len(devices) > 3 else "")
        labels.append(label)
        out.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="lines",
                name=label,
                legend="legend2",
                showlegend=True,
                hoverinfo="skip",
                line={"color": "#555555", "width": 1.5, "dash": dash},
                meta={"key": True},
            )
        )
    return labels


@dataclasses.dataclass
class _Legends:
    """Where restyle put the runs' legend and the devices' key, and the room they took."""

    spot: dict = dataclasses.field(default_factory=dict)  # the runs' legend's layout, before its font
    font: float = 0.0  # the legends' font size: the figure's, or smaller where a short page needs it
    reserved: float = 0.0  # px above or below the charts for the runs' legend (top or bottom)
    key_px: float = 0.0  # px under the charts for the devices' key
    key_entry: float = 0.0  # px per key entry
    tall_in: float = 0.0  # inches the figure needs for a legend at the right


def restyle(figure: go.Figure, style: ExportStyle, charts: int, title: str | None = None) -> go.Figure:
    """The screen figure as a print figure: WebGL traces as SVG paths, fixed size, fonts, legend in its own margin, monochrome.

    `charts` rows-worth of charts are the figure's grid rows (the figure is laid out in columns already). The figure is
    as tall as its rows (the size's row height, at least MIN_ROW) and its legend need, within the size's page
    (PAGE_LIMITS), or exactly the style's height when it has one; a legend never overlaps a chart and is never cut:
    one entry per run in equal-width columns whose rows are reserved exactly, set smaller (to LEGEND_FONT_FLOOR) when
    the page is short, else ExportError naming the fix. Each chart's y tick labels stand TICK_GAP_FONTS apart, two at
    least, else ExportError naming the height that holds them. `title` becomes the PDF's title (kept in layout.meta)."""
    out, short = _print_figure(figure, style, charts, title)
    if short:
        raise ExportError(_short_rows(out, style, short, _fitting_height(figure, style, charts, short.height_in)))
    return out


def _print_figure(figure: go.Figure, style: ExportStyle, charts: int, title: str | None = None) -> tuple[go.Figure, _Short | None]:
    """restyle's figure, and where its rows are too short for two y tick labels, by how much."""
    if style.size not in SIZES:
        raise ExportError(f"size '{style.size}' is not one of {', '.join(SIZES)}")
    if style.legend not in LEGENDS:
        raise ExportError(f"legend '{style.legend}' is not one of {', '.join(LEGENDS)}")
    out = _print_traces(figure, style.monochrome)
    font_size = style.font_size
    width_in, row_in = SIZES[style.size]
    width_px = width_in * CSS_DPI
    blocks = legend_blocks(out) if style.legend != "none" else []
    names = [name for _title, block in blocks for name in block]
    keys = [("", [key]) for key in _dash_key(out)] if style.legend != "none" and not style.monochrome else []
    # t: the first row's chart titles where the figure has them, else the top tick label's upper half and a little air
    margin = {"l": 6 * font_size, "r": 10, "t": (2.4 if _chart_titles(out) else 1.2) * font_size, "b": 4.5 * font_size}
    limit_in = style.height or PAGE_LIMITS.get(style.size) or width_in * 9 / 16
    legends = _Legends(font=font_size)
    if names and style.legend in ("top", "bottom"):
        legends = _legend_across(blocks, keys, style, width_px, margin, limit_in)
    elif names:
        legends = _legend_right(out, blocks, keys, font_size, width_px, margin, limit_in)
    margin["b"] += _category_ticks(out, width_px - margin["l"] - margin["r"], font_size)
    if style.height:
        height_in = style.height
    elif row_in is None:
        height_in = max(width_in * 9 / 16, min(limit_in, math.ceil(legends.tall_in * 2) / 2))
    else:
        wanted = max(row_in * charts + (margin["t"] + margin["b"]) / CSS_DPI, legends.tall_in)
        height_in = min(limit_in, math.ceil(wanted * 2) / 2)  # whole half inches: whole pixels at any even DPI
    themed(out, PAPER).update_layout(
        width=round(width_px),
        height=round(height_in * CSS_DPI),
        font={"size": font_size, "family": "DejaVu Sans, Arial, sans-serif", "color": "#000000"},
        showlegend=bool(names),
        legend=legends.spot | {"font": {"size": legends.font}, "bgcolor": "rgba(0,0,0,0)", "tracegroupgap": 0},
        margin=margin,
        hovermode=False,
        meta={"title": title} if title else None,
    )
    _pin_legends(out, legends, style.legend == "bottom" and bool(names), bool(keys), round(height_in * CSS_DPI))
    _column_gaps(out, font_size)
    _row_gaps(out, font_size)
    short = _y_ticks(out, font_size)
    out.update_annotations(font={"size": font_size})  # the charts' titles
    return out, short


def _fitting_height(figure: go.Figure, style: ExportStyle, charts: int, height_in: float) -> float | None:
    """The least height from `height_in` up, in tenths of an inch, whose charts hold two y tick labels each (a taller page
    sets a shrunk legend at full size again, so the first estimate may fall short); None beyond HEIGHT_RANGE."""
    while height_in <= HEIGHT_RANGE[1]:
        _out, short = _print_figure(figure, dataclasses.replace(style, height=height_in), charts)
        if short is None:
            return height_in
        height_in = max(round(height_in + 0.1, 1), short.height_in)
    return None


def _print_traces(figure: go.Figure, monochrome: bool) -> go.Figure:
    """The figure with its WebGL traces as SVG ones (WebGL would become a bitmap inside an SVG or PDF), in monochrome
    where asked: a run (or workload) keeps its dash style and marker in every chart; its legend cut to one entry a run."""
    out = go.Figure(figure)
    out.data = ()
    series: dict[str, int] = {}
    for number, trace in enumerate(figure.data):
        spec = trace.to_plotly_json()
        if spec.get("type") == "scattergl":
            spec["type"] = "scatter"
        out.add_trace(go.Scatter(spec) if spec.get("type") == "scatter" else trace)
        if monochrome:
            _monochrome(out.data[-1], series.setdefault(trace.legendgroup or str(number), len(series)))
    _cut_legend(out)
    return out


def _legend_across(blocks: list, keys: list, style: ExportStyle, width_px: float, margin: dict, limit_in: float) -> _Legends:
    """The runs' legend in rows above or below the charts (the devices' key under them), its room added to `margin`; the
    font set smaller down to LEGEND_FONT_FLOOR until both take at most half the page, else ExportError naming the fix."""
    font = style.font_size
    plot_px = width_px - margin["l"] - margin["r"]
    while True:
        drawn, entry = legend_size(blocks, plot_px, font)
        reserved = drawn + LEGEND_PAD_PX
        key_px, key_entry = _key_room(keys, plot_px, font)
        needed = (reserved + key_px) / CSS_DPI  # the legends may take half the figure; the charts keep the rest
        if needed <= limit_in / 2 or font <= LEGEND_FONT_FLOOR:
            break
        font = max(LEGEND_FONT_FLOOR, font - 1)
    if needed > limit_in / 2:
        runs = sum(len(block) for _title, block in blocks)
        raise ExportError(
            f"the legend of {counted(runs, 'run')} does not fit a {limit_in:g} in {style.size} figure; "
            "use --legend right or none, a larger --size or --height, or fewer runs"
        )
    spot = {"orientation": "h", "x": 0, "xanchor": "left", "entrywidth": entry, "entrywidthmode": "pixels", "yref": "container"}
    if style.legend == "top":
        margin["t"] += reserved
        spot |= {"y": 1, "yanchor": "top"}
    else:  # the figure's last line: its box reserved, nothing under it (0.15 in more had been left blank)
        reserved = drawn + LEGEND_BOX_PX
        margin["b"] += reserved
        spot |= {"y": 0, "yanchor": "top"}  # y: set once the height is known (top-anchored: Plotly draws it as reserved)
    margin["b"] += key_px
    return _Legends(spot, font, reserved, key_px, key_entry)


def _legend_right(out: go.Figure, blocks: list, keys: list, font: float, width_px: float, margin: dict, limit_in: float) -> _Legends:
    """The runs' legend at the right, as wide as its longest name and at most 45 % of the figure (a longer name wraps at
    words), the devices' key under the charts; ExportError where it is taller than the page."""
    margin["r"] = min(width_px * 0.45, max(_line_px(t, font) for t in _legend_texts(blocks)) + ITEM_PX + 10)
    drawn = _wrap_legend(out, margin["r"] - ITEM_PX - 10, font)
    if drawn > (limit_in * CSS_DPI - margin["t"] - margin["b"]):
        runs = sum(len(block) for _title, block in blocks)
        raise ExportError(f"the legend of {counted(runs, 'run')} is taller than the {limit_in:g} in figure; use --legend top, or fewer runs")
    # Plotly draws a right-anchored legend ~8 px past the figure's edge: anchored that much inside it
    spot = {"orientation": "v", "x": 1 - 12 / width_px, "xanchor": "right", "xref": "container", "y": 1, "yanchor": "top"}
    key_px, key_entry = _key_room(keys, width_px - margin["l"] - margin["r"], font)
    margin["b"] += key_px
    return _Legends(spot, font, 0.0, key_px, key_entry, tall_in=(margin["t"] + drawn + LEGEND_PAD_PX) / CSS_DPI)


def _key_room(keys: list, plot_px: float, font: float) -> tuple[float, float]:
    """The devices' key under the charts: the px its box takes (none without keys) and its entries' width."""
    drawn, entry = legend_size(keys, plot_px, font)
    return (drawn + LEGEND_BOX_PX if keys else 0), entry


def _pin_legends(out: go.Figure, legends: _Legends, bottom: bool, keyed: bool, height_px: int) -> None:
    """Legends anchored from the figure's bottom, placed once its height is known: the runs' at the very bottom, the
    devices' key (legend2) above it."""
    if bottom:
        out.update_layout(legend_y=legends.reserved / height_px)
    if keyed:
        below = legends.reserved if bottom else 0.0
        out.update_layout(
            legend2={
                "orientation": "h",
                "x": 0,
                "xanchor": "left",
                "y": (legends.key_px + below) / height_px,
                "yanchor": "top",
                "yref": "container",
                "font": {"size": legends.font},
                "bgcolor": "rgba(0,0,0,0)",
                "entrywidth": legends.key_entry,
                "entrywidthmode": "pixels",
            }
        )


def _category_ticks(out: go.Figure, plot_px: float, font: float) -> float:
    """Category names under a bar or box chart that each keep to their category: as they are where they fit, wrapped at
    words onto up to three lines where that fits, else upright (eight workloads at a single column, tilted 30°, lay over
    each other and pushed the plot into half the figure). The bottom margin they need beyond one line, in pixels."""
    extra = 0.0
    for name, axis in out.layout.to_plotly_json().items():
        if not name.startswith("xaxis"):
            continue
        values = list(axis.get("categoryarray") or axis.get("tickvals") or [])
        labels = [cut_label(unescape(str(t))) for t in (axis.get("ticktext") or values)]  # a box chart's names are Plotly text (&amp;)
        if len(labels) < 2 or len(labels) != len(values) or not all(isinstance(v, str) for v in labels):
            continue
        domain = axis.get("domain") or [0, 1]
        room = (domain[1] - domain[0]) * plot_px / len(labels) - 6
        widest = max(_text_px(label, font) for label in labels)
        wrapped = [_wrapped(label, room, font) for label in labels]
        lines = max(w.count("<br>") + 1 for w in wrapped)
        if widest <= room:
            upright, ticktext = False, labels
        elif lines <= 3 and all(_text_px(line, font) <= room for w in wrapped for line in w.split("<br>")):
            upright, ticktext = False, wrapped
            extra = max(extra, (lines - 1) * 1.3 * font)
        else:
            upright, ticktext = True, labels
            extra = max(extra, widest - 1.3 * font)
        out.layout[name].update(tickmode="array", tickvals=values, ticktext=[_plain(t) for t in ticktext], tickangle=-90 if upright else 0)
    return extra


def _plain(text: str) -> str:
    """Text as Plotly text, its line breaks kept (a name's own '<' is never markup)."""
    return "<br>".join(plain(part) for part in text.split("<br>"))


def _column_gaps(out: go.Figure, font: float) -> None:
    """Room between side-by-side charts for the right one's tick labels and axis title (what the left margin holds for the
    first), in pixels of the print size: at a single column the collocation figure's "SMACT (0–1)" lay over its own
    ticks and against the left panel. The columns' x domains laid out again; a chart's title centred over it, wrapped
    at words where it is wider than its chart (the extra lines go up into the top margin)."""
    axes = {name: axis for name, axis in out.layout.to_plotly_json().items() if name.startswith("xaxis") and axis.get("domain")}
    lefts = sorted({round(a["domain"][0], 6) for a in axes.values()})
    if len(lefts) < 2:
        return
    plot_px = out.layout.width - out.layout.margin.l - out.layout.margin.r
    new = dict(zip(lefts, _slots(len(lefts), min(0.3, 6 * font / max(plot_px, 1))), strict=True))
    size = new[lefts[0]][1] - new[lefts[0]][0]
    centres = {}
    for name, axis in axes.items():
        low, high = new[round(axis["domain"][0], 6)]
        centres[(axis["domain"][0] + axis["domain"][1]) / 2] = (low + high) / 2
        out.layout[name].domain = [max(0.0, low), min(1.0, high)]
    lines = 1
    for annotation in _chart_titles(out):  # centred over their chart
        if annotation.x is not None:
            annotation.x = centres[min(centres, key=lambda c, x=annotation.x: abs(c - x))]
            annotation.text = _wrapped(str(annotation.text), size * plot_px, font)
            lines = max(lines, annotation.text.count("<br>") + 1)
    out.layout.margin.t += (lines - 1) * 1.3 * font


def _chart_titles(out: go.Figure) -> list:
    """make_subplots' chart titles: annotations in paper coordinates that stand on their chart's top (yanchor bottom)."""
    return [a for a in out.layout.annotations or () if a.xref == "paper" and a.yref == "paper" and a.yanchor == "bottom" and a.text]


def _slots(count: int, gap: float) -> list[tuple[float, float]]:
    """`count` equal spans of the figure's [0, 1] with `gap` between neighbours, the first at 0: its charts' domains."""
    size = (1 - gap * (count - 1)) / count
    return [(i * (size + gap), i * (size + gap) + size) for i in range(count)]


def _wrapped(text: str, width_px: float, font: float) -> str:
    """Plotly text wrapped at words into lines of at most `width_px` (a word longer than that stays whole)."""
    return "<br>".join(wrap_words(text.replace("<br>", " ").split(), lambda line: _text_px(line, font) <= width_px))


def _row_gaps(out: go.Figure, font: float) -> None:
    """Room between stacked chart rows for the upper row's tick labels and the lower row's title, in pixels of the print
    size (the screen's gaps are fractions of a taller figure): the rows' y domains laid out again, titles moved with them."""
    axes = {name: axis for name, axis in out.layout.to_plotly_json().items() if name.startswith("yaxis") and axis.get("domain")}
    tops = sorted({round(a["domain"][1], 6) for a in axes.values()}, reverse=True)
    if len(tops) < 2:
        return
    plot_px = out.layout.height - out.layout.margin.t - out.layout.margin.b
    spans = _slots(len(tops), min(0.35, _row_gap_px(font) / max(plot_px, 1)))
    if spans[0][1] <= spans[0][0]:
        return
    new = {top: (1 - high, 1 - low) for top, (low, high) in zip(tops, spans, strict=True)}  # the top row first
    moves = {}
    for name, axis in axes.items():
        low, high = new[round(axis["domain"][1], 6)]
        moves[round(axis["domain"][1], 6)] = high
        out.layout[name].domain = [max(0.0, low), min(1.0, high)]
    for annotation in _chart_titles(out):  # at their row's top
        if annotation.y is not None:
            nearest = min(moves, key=lambda top, y=annotation.y: abs(top - y))
            annotation.y = moves[nearest]


def _row_gap_px(font: float) -> float:
    """The room between stacked charts: the upper one's x tick labels and the lower one's title."""
    return 4.2 * font + 6


class _Short(NamedTuple):
    """Charts too short for two y tick labels: how many charts in how many rows, and the height in inches they need."""

    charts: int
    rows: int
    height_in: float


def _y_ticks(out: go.Figure, font: float) -> _Short | None:
    """Each chart's y tick labels at least TICK_GAP_FONTS font sizes apart, however short its row (Plotly's own choice
    drew GPU memory's 5 labels 9 px apart in each 43 px chart of 8 at a single column): a round step chosen from the
    chart's height in px, two labels at least; where a row is too short for two, what the figure would need."""
    plot_px = out.layout.height - out.layout.margin.t - out.layout.margin.b
    gap = TICK_GAP_FONTS * font
    charts, tops, wanted = 0, set(), 0.0  # wanted: the px a chart needs for two labels, where one lacks them
    for name, axis in out.layout.to_plotly_json().items():
        if not name.startswith("yaxis") or axis.get("type") not in (None, "-", "linear") or axis.get("tickmode") == "array":
            continue
        low, high = (axis.get("domain") or [0, 1])[:2]
        chart_px = (high - low) * plot_px
        charts, tops = charts + 1, tops | {round(high, 6)}
        limits = _numeric_range(axis.get("range"))
        if limits is None:  # Plotly's autorange: at most as many ticks as keep their labels apart
            plotly_ticks = int(min(max(chart_px / PLOTLY_TICK_PX, 4), 9)) + 1
            if chart_px // gap < plotly_ticks:
                out.layout[name].nticks = max(2, int(chart_px // gap))
            continue
        step = _tick_step(*limits, chart_px, gap)
        if step is None:
            widest = max(_round_steps(*limits, (limits[1] - limits[0]) / 100), default=limits[1] - limits[0])  # two labels, as far apart as they go
            wanted = max(wanted, gap * (limits[1] - limits[0]) / widest)
        else:
            out.layout[name].update(tickmode="linear", tick0=0, dtick=step)
    if not wanted:
        return None
    margin = out.layout.margin
    rows = len(tops)
    needed = (margin.t + margin.b + rows * wanted + (rows - 1) * _row_gap_px(font)) / CSS_DPI
    return _Short(charts, rows, math.ceil(needed * 10) / 10)


def _numeric_range(limits) -> tuple[float, float] | None:
    """An axis's range as (low, high) where it is two finite, distinct numbers, else None."""
    try:
        low, high = sorted(float(v) for v in limits)
    except (TypeError, ValueError):
        return None
    return (low, high) if math.isfinite(low) and math.isfinite(high) and high > low else None


def _round_steps(low: float, high: float, least: float) -> list[float]:
    """The round tick steps (TICK_STEPS times a power of ten) from `least` up, ascending, that put two ticks or more in [low, high]."""
    steps = [m * 10.0**k for k in range(math.floor(math.log10(least)), math.ceil(math.log10(high - low)) + 1) for m in TICK_STEPS]
    return [s for s in steps if s >= least * (1 - 1e-9) and math.floor(high / s + 1e-9) - math.ceil(low / s - 1e-9) >= 1]


def _tick_step(low: float, high: float, chart_px: float, gap: float) -> float | None:
    """The y tick step of a chart `chart_px` tall: Plotly's own spacing where that leaves three labels or more, else
    the smallest round step with labels `gap` px apart; None where no round step puts two labels that far apart."""
    if chart_px <= 0:
        return None
    span = high - low
    fitting = _round_steps(low, high, span * gap / chart_px)
    roomy = [s for s in fitting if s * chart_px / span >= PLOTLY_TICK_PX and math.floor(high / s + 1e-9) - math.ceil(low / s - 1e-9) >= 2]
    return (roomy or fitting or [None])[0]


def _short_rows(out: go.Figure, style: ExportStyle, short: _Short, fits_in: float | None) -> str:
    """What to do about charts too short for two y tick labels, in one line."""
    taller = f"give --height {fits_in:g} or more, " if fits_in else ""
    wider = ", or --size double-column (two charts a row)" if style.size == "single-column" else ""
    return (
        f"{counted(short.charts, 'chart')} in {counted(short.rows, 'row')} of a {out.layout.height / CSS_DPI:.4g} in {style.size} figure are too "
        f"short for two y-axis labels at {style.font_size:g} pt; {taller}a smaller --font-size, fewer charts{wider}"
    )


def _monochrome(trace, number: int) -> None:
    """Series told apart by dash style and marker instead of colour (a band stays a light grey fill)."""
    if trace.fill == "tonexty" or (trace.line and trace.line.width == 0) or (isinstance(trace.meta, dict) and trace.meta.get("band")):
        trace.fillcolor = "rgba(0,0,0,0.12)"
        trace.line.color = "rgba(0,0,0,0)"
        return
    trace.line.color = GREYS[number % len(GREYS)]
    trace.line.dash = DASHES[number % len(DASHES)]
    trace.mode = "lines+markers"
    # a dozen markers per line (Plotly's maxdisplayed), so they stay readable on a dense series
    trace.marker = {"symbol": MARKERS[number % len(MARKERS)], "size": 5, "color": trace.line.color, "maxdisplayed": 12}
