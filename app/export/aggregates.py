"""Comparison figures the radT papers print: per-run aggregates grouped by workload or collocation method, the
collocation figure (normalised throughput and GPU SMACT per method, per command), and one run's activity.

Pure functions from the comparison table (app/summary/compare.py, one row per run) or a run's series to Plotly figures; the
dashboard's comparison section and `radt export --figure` draw the same ones. Like is compared with like: by
collocation, each command (compare's "command" column) is its own series (a colour, a legend entry), so a bert run
alone never stands beside resnet runs collocated; runs of several experiments are told apart by the experiment's name.
"""

from __future__ import annotations

import math
import shlex
import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from radt.app.export.exportoptions import BY, COLLOCATION, KINDS, RATIO, STATS
from radt.app.figures.figures import plain, wrap_chars
from radt.app.figures.palette import PALETTE, PAPER, SERIES_DASHES, colors, dash_of, themed
from radt.app.figures.words import counted
from radt.app.summary.compare import PYTHON
from radt.catalogue import MetricName
from radt.collocation import ALONE, METHODS
from radt.errors import UserError

POOLED = ("partition", "user")  # groupings of a cluster's jobs: one series over every experiment (radt import --slurm makes one per user)
NO_GROUP = "(none)"  # the category of a run without the grouping's tag (a run not imported from Slurm)
COLLOCATION_PANELS = (("normalised", "throughput ÷ same command alone"), ("smact_mean", f"GPU SMACT ({RATIO})"))
ACTIVITY = (  # the activity figure's series: (catalogue name, label, scale to 0-1, dash)
    (MetricName.GR_ENGINE_ACTIVE, "GRACT", 1.0, "solid"),
    (MetricName.SM_ACTIVE, "SMACT", 1.0, "dash"),
    (MetricName.SM_OCCUPANCY, "SMOCC", 1.0, "dot"),
    (MetricName.UTILIZATION_PERCENTAGE, "nvidia-smi GPU util ÷ 100", 0.01, "dashdot"),
)
HEIGHT = 460  # px on the page: a plot area of 300 px or more under the title, beside the legend
MARGIN = {"l": 72, "r": 24, "t": 72, "b": 64}  # t: the title's own band above the plot (and the panels' titles)
MAX_SERIES = len(PALETTE)  # series one comparison figure tells apart: a colour each
LINE, LINES = 30, 3  # a legend entry's characters a line and lines at most; the tooltip has it whole
NO_COMMAND = "(no command)"  # a run that recorded neither a command nor radT's model (a plain MLflow run)
POINT_SPREAD = 0.28  # a run's point sits this share of its box's width either side of the centre (by its id: stable)
UNNAMED_BOX = "#57606a"  # the box of a figure with no legend (one series): no run's colour, its points are the runs' own


class FigureError(UserError, ValueError):
    """A comparison figure that cannot be drawn from these runs; the message says what to pick instead."""


@dataclass(frozen=True)
class Group:
    """The runs of one bar, box or CDF line: one series (a command by collocation, an experiment by workload) at one
    category (a collocation method, a workload)."""

    key: tuple[str, str]  # (experiment id, command) by collocation, (experiment id, "") by workload
    series: str  # by collocation the command, short (short_commands), plain text; "" by workload
    experiment: str  # the experiment's name where the runs come from several, else ""
    category: str
    values: np.ndarray
    run_ids: tuple[str, ...]
    runs: tuple[str, ...]
    detail: str = ""  # the series in full, for the tooltip (the whole command, its experiment)


def check(stat: str, by: str) -> None:
    """FigureError for a statistic or grouping radt does not know."""
    if stat not in STATS:
        raise FigureError(f"statistic '{str(stat)[:40]}' is not one of {', '.join(STATS)}")
    if by not in BY:
        raise FigureError(f"grouping '{str(by)[:40]}' is not one of {', '.join(BY)}")


def _runs(table: pd.DataFrame) -> pd.DataFrame:
    """The table's run rows (not its groups' rows), with every column the figures read."""
    runs = table[table["kind"] == "run"] if "kind" in table.columns else table
    runs = runs.reset_index(drop=True)
    for column, default in (("experiment_id", ""), ("command", ""), ("run", ""), ("run_id", "")):
        if column not in runs.columns:
            runs = runs.assign(**{column: default})
    return runs.assign(experiment_id=runs["experiment_id"].fillna("").astype(str), command=runs["command"].fillna("").astype(str))


def _number(runs: pd.DataFrame, column: str) -> pd.Series:
    """A numeric column of the table (NaN where it has none)."""
    return pd.to_numeric(runs[column], errors="coerce") if column in runs.columns else pd.Series(math.nan, index=runs.index)


def normalised(table: pd.DataFrame) -> pd.Series:
    """Per run row: steps/h ÷ the same command alone; for a run alone only where runs of its command that ran together are
    shown: its steps/h over the same baseline theirs are set against (the comparison table's figure for it). The alone bar
    beside a command's collocated ones is then 1, its runs' spread around it; a command that never shared a GPU is left out."""
    runs = _runs(table)
    out, rate, base = _number(runs, "normalised"), _number(runs, "steps_per_h"), _number(runs, "alone_steps_per_h")
    alone = runs["collocation"].eq(ALONE) if "collocation" in runs.columns else pd.Series(False, index=runs.index)
    for _key, members in runs.groupby(["experiment_id", "command"], sort=False):
        lone = members.index[alone[members.index]]
        known = base[members.index.difference(lone)].dropna()  # the baseline the collocated runs are set against
        out[lone] = rate[lone] / float(known.iloc[0]) if len(known) and float(known.iloc[0]) > 0 else math.nan
    return out


def experiment_label(experiment_id: str, experiments: Mapping[str, str] | None) -> str:
    """An experiment as the run picker names it (its id when the name is unknown)."""
    return (experiments or {}).get(str(experiment_id)) or f"experiment {experiment_id}"


LAUNCHERS = {
    "radt",
    "torchrun",
    "accelerate",
    "deepspeed",
    "bash",
    "sh",
    "srun",
    "mpirun",
    "uv",
    "poetry",
    "ncu",
    "ncu-raw",
    "nsys",
    "nsys-raw",
}  # and a Python of any version (compare.PYTHON); the profilers: compare.command_text names a profiled run's command after its profiler


def short_commands(commands: list[str]) -> dict[str, str]:
    """Command -> its short name for a legend: what tells it apart from the other commands shown. The script where scripts
    differ, and where one script runs with several argument lists, the arguments not all of them share; one command: all of it.
    A launcher names its script with it ("python train.py", "radt import": they were "python" and "radt")."""
    parsed = {c: _script(_words(c)) for c in dict.fromkeys(commands)}
    if len(parsed) < 2:
        return {c: c or NO_COMMAND for c in parsed}
    scripts: dict[str, list[str]] = {}
    for command, (script, _args) in parsed.items():
        scripts.setdefault(script, []).append(command)
    pairs = {c: _pairs(args) for c, (_script, args) in parsed.items()}
    shared = {
        script: set.intersection(*(set(pairs[c]) for c in siblings)) for script, siblings in scripts.items()
    }  # once a script: a 1,000-command sweep took 1.4 s
    out = {}
    for command, (script, _args) in parsed.items():
        several = len(scripts[script]) > 1
        kept = [script] if len(scripts) > 1 and script else []
        kept += [" ".join(p) for p in pairs[command] if p not in shared[script]] if several else []
        out[command] = " ".join(kept) if kept else (command or NO_COMMAND)
    if len(set(out.values())) < len(out):  # two that only the order of their arguments tells apart: say them whole
        return {c: c or NO_COMMAND for c in parsed}
    return out


SCRIPT_SUFFIXES = (".py", ".sh")  # a word a launcher runs: its script, where an option's value ("--nproc_per_node 8") is not


def _script(words: list[str]) -> tuple[str, list[str]]:
    """A command's script and its arguments. A launcher's script is named with it: the first word after it that is a
    script or another launcher (whose own script follows), else its first word that is no option ("radt import"); the
    launcher's options count as arguments ("torchrun train.py" with "--nproc_per_node 8"). Launchers in a row are
    followed in one pass: a command is anyone's text, and thousands of them once took a call each."""
    if not words:
        return "", []
    if not _launcher(words[0]):
        return words[0], words[1:]
    names: list[str] = []
    args: list[str] = []
    start = 0  # words[start] is a launcher
    while True:
        after = start + 1
        at = next((i for i in range(after, len(words)) if _launcher(words[i]) or words[i].endswith(SCRIPT_SUFFIXES)), None)
        if at is None:
            at = next((i for i in range(after, len(words)) if not words[i].startswith("-")), None)
        if at is None:  # no script after it: the launcher as written, and what follows it
            return " ".join([*names, words[start]]), args + words[after:]
        names.append(_file(words[start]))
        args += words[after:at]
        if not _launcher(words[at]):
            return " ".join([*names, words[at]]), args + words[at + 1 :]
        start = at


def _file(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _launcher(word: str) -> bool:
    """A launcher by its file name, a Python of any version included ("/opt/conda/bin/python3.10")."""
    name = _file(word)
    return name in LAUNCHERS or PYTHON.match(name) is not None


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def _pairs(words: list[str]) -> list[tuple[str, ...]]:
    """Arguments as options with their values: ['--lr', '0.1', '--amp'] -> [('--lr', '0.1'), ('--amp',)]."""
    out: list[tuple[str, ...]] = []
    for word in words:
        if out and not word.startswith("-") and len(out[-1]) == 1 and out[-1][0].startswith("-"):
            out[-1] = (out[-1][0], word)
        else:
            out.append((word,))
    return out


def legend_text(text: str, width: int = LINE, lines: int = LINES) -> str:
    """A legend entry as Plotly text: escaped, wrapped at words to `width` characters a line (a long command keeps the
    legend narrow instead of squeezing the plot), at most `lines` lines, the rest '…' (the tooltip has it whole)."""
    return "<br>".join(plain(r) for r in wrap_chars(str(text), width, lines))


def _check_series(series: Collection, by: str, limit: int) -> None:
    """FigureError where the runs make more series than `limit` (PALETTE's colours; a CDF's dashes): a 150-command sweep
    by collocation drew 150 one-pixel bars in repeated colours beside a 2,860 px legend (a series is a command by
    collocation, else an experiment)."""
    if len(series) <= limit:
        return
    if by == COLLOCATION:
        raise FigureError(
            f"these runs have {len(series)} different commands, more series than this figure tells apart ({limit}); "
            f"compare by workload, or filter the runs to {limit} commands or fewer (e.g. params.lr = '0.1')"
        )
    raise FigureError(
        f"these runs come from {len(series)} experiments, more series than this figure tells apart ({limit}); pick runs of {limit} experiments or fewer"
    )


def groups(table: pd.DataFrame, stat: str, by: str, experiments: Mapping[str, str] | None = None, limit: int = MAX_SERIES) -> list[Group]:
    """The runs' stat (NaN left out) per series and category, in a stable order: series as they first appear, collocation
    methods as the papers list them, workloads by name. By collocation a series is a command (with its experiment when
    the runs come from several); by workload it is the experiment (one series, unnamed, when there is one)."""
    check(stat, by)
    runs = _runs(table)
    if runs.empty:
        return []
    values = normalised(runs) if stat == "normalised" else pd.to_numeric(runs[stat], errors="coerce")
    several = runs["experiment_id"].nunique() > 1 and by not in POOLED
    experiment_ids = [""] * len(runs) if by in POOLED else runs["experiment_id"]
    keys = list(zip(experiment_ids, runs["command"] if by == COLLOCATION else [""] * len(runs), strict=True))
    column = runs[BY[by]] if BY[by] in runs.columns else pd.Series("", index=runs.index)
    categories = [str(c) or (NO_GROUP if by in POOLED else "") for c in column.fillna("")]
    members: dict[tuple, list[int]] = {}  # (series, category) -> its runs' rows, in one pass (it scanned every run for each pair)
    for i, (key, category, value) in enumerate(zip(keys, categories, values, strict=True)):
        if value == value:  # NaN: the run has no such figure
            members.setdefault((key, category), []).append(i)
    _check_series({key for key, _category in members}, by, limit)  # before the names: a sweep past the limit is told at once
    where = {k: experiment_label(k[0], experiments) if several else "" for k in keys}
    short = short_commands(list(runs["command"])) if by == COLLOCATION else {}
    names = {k: short.get(k[1], "") for k in keys}
    details = {k: " · ".join(t for t in ((k[1] or NO_COMMAND) if by == COLLOCATION else "", where[k]) if t) for k in keys}
    order = list(METHODS) if by == COLLOCATION else sorted(set(categories))
    order += [c for c in dict.fromkeys(categories) if c not in order]
    out = []
    for key in dict.fromkeys(keys):
        for category in order:
            rows = members.get((key, category))
            if rows:
                out.append(Group(key, names[key], where[key], category, values[rows].to_numpy(dtype=float), tuple(runs["run_id"][rows].astype(str)),
                                 tuple(runs["run"][rows].astype(str)), details[key]))  # fmt: skip
    return out


def _axis_title(stat: str) -> str:
    label, unit = STATS[stat]
    return f"{label} ({unit})"


def _empty(stat: str, by: str) -> FigureError:
    return FigureError(f"no run of these has a {STATS[stat][0]} to group by {by}; pick other runs or another statistic")


def _series(found: list[Group]) -> dict[tuple[str, str], list[Group]]:
    """The groups per series, in order: a series' groups are one trace (one colour, one legend entry)."""
    out: dict[tuple[str, str], list[Group]] = {}
    for group in found:
        out.setdefault(group.key, []).append(group)
    return out


def _categories(found: list[Group]) -> list[str]:
    return list(dict.fromkeys(g.category for g in found))


BAR_GAP, GROUP_GAP = 0.25, 0.08  # of a category's width: between categories, and between the bars that share one


def _lanes(found: list[Group]) -> dict[tuple[tuple[str, str], str], tuple[int, int]]:
    """Each (series, category): its place among the series that category holds, and how many it holds. Plotly's group
    mode kept a place for every series in every category: by workload over four experiments, one bar a quarter wide at
    the left of its tick, three empty places beside it."""
    held: dict[str, list[tuple[str, str]]] = {}
    for g in found:
        if g.key not in held.setdefault(g.category, []):
            held[g.category].append(g.key)
    return {(key, category): (k, len(keys)) for category, keys in held.items() for k, key in enumerate(keys)}


def _centre(lane: tuple[int, int], band: float) -> float:
    """A lane's centre from its category's tick, in categories: the category's series side by side in `band` of it."""
    k, n = lane
    return band * ((k + 0.5) / n - 0.5)


def _slot(lane: tuple[int, int], band: float) -> tuple[float, float]:
    """A bar's offset from its category's tick (its left edge) and its width, in categories (Plotly's bar offset, width)."""
    width = band / lane[1] * (1 - GROUP_GAP) if lane[1] > 1 else band
    return _centre(lane, band) - width / 2, width


LEGEND_LINE_PX, LEGEND_GAP_PX = 15.6, 10  # a legend text line at Plotly's 12 px font (1.3 spacing); the gap after an entry


def _legend_px(figure: go.Figure) -> float:
    """What the right-hand legend needs, top to bottom: each entry's lines (a command wraps to 4), each group's title once;
    counted generously, as Plotly's vertical legend scrolls what it cannot hold (which bars were whose, out of sight)."""
    titled, px = set(), 2 * LEGEND_GAP_PX
    for trace in figure.data:
        if trace.showlegend is False or not trace.name:
            continue
        texts = [str(trace.name)]
        if trace.legendgrouptitle and trace.legendgrouptitle.text and trace.legendgroup not in titled:
            titled.add(trace.legendgroup)
            texts.append(trace.legendgrouptitle.text)
        px += sum((text.count("<br>") + 1) * LEGEND_LINE_PX + 3 + LEGEND_GAP_PX for text in texts)
    return px


def _layout(figure: go.Figure, title: str, x_title: str, y_title: str, ratio: bool, legend: bool) -> go.Figure:
    """The page's layout: the title in a band of its own, the legend right of the plot (it grows the right margin, never
    covers a chart or a title) and as tall as its entries (the figure grows for it), axis titles clear of their tick labels."""
    needed = _legend_px(figure) if legend else 0.0
    themed(figure, PAPER).update_layout(
        title={"text": title, "x": 0, "xref": "container", "xanchor": "left", "y": 1, "yref": "container", "yanchor": "top",
               "pad": {"t": 14, "l": 12}, "font": {"size": 15}},
        height=max(HEIGHT, round(MARGIN["t"] + 24 + needed)),
        showlegend=legend,
        # beside the plot Plotly's legend scrolls past the plot's height; in px it may run on down the right margin
        legend={"orientation": "v", "x": 1.02, "xanchor": "left", "xref": "paper", "y": 1, "yanchor": "top", "yref": "paper", "maxheight": needed},
        margin=MARGIN,
    )  # fmt: skip
    figure.update_xaxes(title={"text": x_title, "standoff": 12}, automargin=True)
    figure.update_yaxes(title={"text": y_title, "standoff": 10}, automargin=True, rangemode="tozero")
    if ratio:
        figure.update_yaxes(range=[0, 1.02])
    return figure


LABEL_CHARS = 40  # a category's name under its chart at most this long, then '…' (a CSV's workload name is the user's)


def cut_label(text: str, limit: int = LABEL_CHARS) -> str:
    """A name at most `limit` characters, then '…': a category's 5,000 characters stood upright squeezed the plot to 64 px
    (whole on hover); an exported legend's entry (export.LEGEND_CHARS)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ticks(categories: list[str]) -> dict:
    """A category axis whose ticks are the categories' names as text, cut (cut_label); the values stay whole for the hover."""
    values = [plain(c) for c in categories]
    return {"categoryorder": "array", "categoryarray": values, "tickmode": "array", "tickvals": values, "ticktext": [plain(cut_label(c)) for c in categories]}


def entry(group: Group) -> str:
    """A series' legend entry as Plotly text: its command (wrapped), its experiment in italics under it; "" for none."""
    lines = [legend_text(group.series)] if group.series else []
    lines += [f"<i>{legend_text(group.experiment, lines=2)}</i>"] if group.experiment else []
    return "<br>".join(lines)


def _runs_text(group: Group) -> str:
    return plain(", ".join(group.runs[:6]) + (f" and {len(group.runs) - 6} more" if len(group.runs) > 6 else ""))


def _bars(found: list[Group], colour: str, name: str, lanes: dict, **extra) -> go.Bar:
    """One series' bars: the mean of each category's runs, whiskers to their minimum and maximum; the runs on hover.
    `name`: the legend entry, Plotly text already; `lanes`: _lanes of every bar of the panel (each centred on its tick)."""
    means = [float(np.mean(g.values)) for g in found]
    detail = plain(found[0].detail)
    slots = [_slot(lanes[(g.key, g.category)], 1 - BAR_GAP) for g in found]
    return go.Bar(
        x=[plain(g.category) for g in found],  # a workload's name as text: Plotly draws a category's own markup
        offset=[offset for offset, _width in slots],
        width=[width for _offset, width in slots],
        y=means,
        name=name,
        marker_color=colour,
        error_y={"type": "data", "symmetric": False, "array": [float(np.max(g.values)) - m for g, m in zip(found, means, strict=True)],
                 "arrayminus": [m - float(np.min(g.values)) for g, m in zip(found, means, strict=True)], "thickness": 1, "width": 4},
        customdata=[len(g.values) for g in found],
        hovertext=[_runs_text(g) for g in found],
        hovertemplate=[f"%{{x}}{f' · {detail}' if detail else ''}<br>mean %{{y:.4g}} (min–max of {counted(len(g.values), 'run')})<br>%{{hovertext}}<extra></extra>"
                       for g in found],  # a bar's own: "1 run" (it said "1 runs")
        **extra,
    )  # fmt: skip


def _title(text: str, by: str, named: bool) -> str:
    return text + (" · per command" if by == COLLOCATION and named else "")


def bar_figure(table: pd.DataFrame, stat: str, by: str, experiments: Mapping[str, str] | None = None) -> go.Figure:
    """Per series (command or experiment) a bar per category: the mean of its runs' stat; whiskers their minimum and maximum."""
    found = groups(table, stat, by, experiments)
    if not found:
        raise _empty(stat, by)
    series, lanes = _series(found), _lanes(found)
    figure = go.Figure(
        [
            _bars(members, PALETTE[j % len(PALETTE)], entry(members[0]) or STATS[stat][0], lanes, showlegend=bool(entry(members[0])))
            for j, members in enumerate(series.values())
        ]
    )  # one unnamed series (one experiment by workload) is in no legend: the axis title says what it is
    figure.update_layout(barmode="overlay")  # each bar's offset and width its own (_lanes): none overlap
    figure.update_xaxes(**_ticks(_categories(found)))
    named = any(entry(g) for g in found)
    title = _title(f"{STATS[stat][0]} by {by} (mean of runs, min–max)", by, named)
    return _layout(figure, title, by, _axis_title(stat), STATS[stat][1] == RATIO, named)


def _jitter(run_id: str) -> float:
    """A run's place across its box, -1..1, from its id: the same on every redraw and export."""
    return (zlib.crc32(str(run_id).encode("utf-8")) % 1001) / 500.0 - 1.0


def box_figure(table: pd.DataFrame, stat: str, by: str, experiments: Mapping[str, str] | None = None,
               colours: Mapping[str, str] | None = None) -> go.Figure:  # fmt: skip
    """Per series a box per category over its runs' stat, every run a point on it. With a legend (series named: commands,
    experiments) a point is its box's colour, the legend's (run colours inside a command's box read as other commands,
    issue 52); without one, the box is grey and a point the run's own colour (`colours`: run_id -> colour as
    palette.run_colors gives it for the view, so a run looks as on Explore, whose legend it then follows)."""
    found = groups(table, stat, by, experiments)
    if not found:
        raise _empty(stat, by)
    named = any(entry(g) for g in found)
    categories = _categories(found)
    series = _series(found)
    lanes = _lanes(found)  # boxes of several series at one category stand side by side, together centred on its tick
    width = 0.8 / max(n for _k, n in lanes.values())
    colours = dict(colours or {})
    colours |= colors((r for g in found for r in g.run_ids if r not in colours), kept=colours)  # runs beyond the view: the colours after its own
    figure = go.Figure()
    points: dict[str, list] = {"x": [], "y": [], "color": [], "customdata": [], "text": []}
    for j, members in enumerate(series.values()):
        centre = {g.category: categories.index(g.category) + _centre(lanes[(g.key, g.category)], 0.8) for g in members}
        figure.add_box(
            x=[centre[g.category] for g in members for _v in g.values],
            y=[float(v) for g in members for v in g.values],
            name=entry(members[0]) or STATS[stat][0],
            boxpoints=False,
            width=width * 0.7,
            line={"color": PALETTE[j % len(PALETTE)] if named else UNNAMED_BOX, "width": 1.5},
            fillcolor="rgba(0,0,0,0)",
            hoverinfo="y",
            showlegend=bool(entry(members[0])),
        )
        for g in members:
            for run_id, run, value in zip(g.run_ids, g.runs, g.values, strict=True):
                points["x"].append(centre[g.category] + _jitter(run_id) * width * POINT_SPREAD)
                points["y"].append(float(value))
                points["color"].append(PALETTE[j % len(PALETTE)] if named else colours[run_id])
                points["customdata"].append([run_id, g.category])
                points["text"].append(plain(f"{run} · {g.detail}" if g.detail else run))
    figure.add_scatter(
        x=points["x"],
        y=points["y"],
        mode="markers",
        marker={"color": points["color"], "size": 8, "line": {"color": "#ffffff", "width": 1}},
        customdata=points["customdata"],
        text=points["text"],
        hovertemplate="%{text}<br>%{customdata[1]}: %{y:.4g}<extra></extra>",
        showlegend=False,
        meta={"points": "runs", "colour": "series" if named else "run"},  # one point per run, customdata[0] its run id; "run": its colour on every page
    )
    figure.update_xaxes(tickvals=list(range(len(categories))), ticktext=[plain(cut_label(c)) for c in categories], range=[-0.5, len(categories) - 0.5],
                        showgrid=False, zeroline=False)  # fmt: skip
    return _layout(figure, _title(f"{STATS[stat][0]} by {by} (runs)", by, named), by, _axis_title(stat), STATS[stat][1] == RATIO, named)


def cdf_points(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF as a step line: the sorted values and the share of runs at or below each (1/n .. 1)."""
    xs = np.sort(np.asarray(values, dtype=float))
    return xs, np.arange(1, len(xs) + 1) / len(xs)


def cdf_figure(table: pd.DataFrame, stat: str, by: str, experiments: Mapping[str, str] | None = None) -> go.Figure:
    """Per category the empirical CDF of its runs' stat (share of runs at or below a value): a colour per category, a dash
    per series (so at most SERIES_DASHES' six series: a seventh drew as the first), the legend's entries under their series' name."""
    found = groups(table, stat, by, experiments, limit=len(SERIES_DASHES))
    if not found:
        raise _empty(stat, by)
    categories = _categories(found)
    if len(categories) > len(PALETTE):  # a category is a colour here: the 21st drew as the first
        what = {"collocation": "collocation methods"}.get(by, f"{by}s")
        raise FigureError(
            f"these runs fall in {len(categories)} {what}, more lines than a CDF tells apart ({len(PALETTE)} colours); "
            f"use bars or box plots, or pick runs of {len(PALETTE)} {what} or fewer"
        )
    series = list(_series(found))
    figure = go.Figure()
    for group in found:
        xs, ys = cdf_points(group.values)
        j = series.index(group.key)
        label = plain(f"{group.category} ({len(xs)})")
        extra = {"legendgroup": f"series {j}", "legendgrouptitle": {"text": entry(group)}} if entry(group) else {}
        figure.add_scatter(x=xs, y=ys, name=label, mode="lines+markers", marker={"size": 5},
                           line={"shape": "hv", "color": PALETTE[categories.index(group.category) % len(PALETTE)], "dash": dash_of(j)},
                           hovertemplate=f"{label}{' · ' + plain(group.detail) if group.detail else ''}<br>%{{x:.4g}}: %{{y:.0%}} of runs<extra></extra>",
                           **extra)  # fmt: skip
    figure = _layout(figure, _title(f"CDF of {STATS[stat][0]} by {by}", by, len(series) > 1), _axis_title(stat), "share of runs", False, True)
    figure.update_yaxes(range=[0, 1.02])
    if STATS[stat][1] == RATIO:
        figure.update_xaxes(range=[0, 1.02])
    return figure


def aggregate_figure(kind: str, table: pd.DataFrame, stat: str, by: str, experiments: Mapping[str, str] | None = None,
                     colours: Mapping[str, str] | None = None) -> go.Figure:  # fmt: skip
    """The bar, box or CDF figure of a comparison table, or the collocation figure (`stat` and `by` unused there)."""
    if kind == COLLOCATION:
        return collocation_figure(table, experiments)
    if kind not in KINDS:
        raise FigureError(f"figure '{str(kind)[:40]}' is not one of {', '.join((*KINDS, COLLOCATION))}")
    if kind == "box":
        return box_figure(table, stat, by, experiments, colours)
    return {"bar": bar_figure, "cdf": cdf_figure}[kind](table, stat, by, experiments)


def collocation_figure(table: pd.DataFrame, experiments: Mapping[str, str] | None = None) -> go.Figure:
    """The seed papers' collocation figure, two panels side by side: per method (alone, same GPU, MPS, MIG) and per
    command, the runs' throughput ÷ the same command alone (alone = 1) and their GPU SMACT; bars the mean of the runs,
    whiskers their minimum and maximum. A command is one colour and one legend entry for both panels."""
    panels = [groups(table, stat, COLLOCATION, experiments) for stat, _title in COLLOCATION_PANELS]
    if not panels[0]:
        raise FigureError(
            "none of these runs ran together with a throughput to set against the same command alone; pick runs that shared a GPU (same GPU, MPS, MIG) and an alone run of their command"
        )
    both = [g for found in panels for g in found]
    series = list(_series(both))
    categories = [m for m in dict.fromkeys([*METHODS, *_categories(both)]) if m in _categories(both)]
    figure = make_subplots(rows=1, cols=2, subplot_titles=[title for _stat, title in COLLOCATION_PANELS], horizontal_spacing=0.12)
    in_legend: set[tuple[str, str]] = set()
    for col, found in enumerate(panels, start=1):
        lanes = _lanes(found)
        for j, key in enumerate(series):
            members = [g for g in found if g.key == key]
            if members:
                name = entry(members[0]) or "runs"
                figure.add_trace(
                    _bars(members, PALETTE[j % len(PALETTE)], name, lanes, legendgroup=f"command {j}", showlegend=key not in in_legend), row=1, col=col
                )
                in_legend.add(key)
    figure.add_hline(y=1, line={"color": "#57606a", "width": 1, "dash": "dot"}, row=1, col=1)  # the same command alone
    figure.update_layout(barmode="overlay")  # each bar's offset and width its own (_lanes)
    figure.update_xaxes(**_ticks(categories))
    title = "Collocation per command: throughput ÷ alone and GPU SMACT (mean of runs, min–max)"
    figure = _layout(figure, title, "collocation", "", False, True)
    figure.update_yaxes(title={"text": "× alone"}, row=1, col=1)
    figure.update_yaxes(title={"text": f"SMACT ({RATIO})"}, range=[0, 1.02], row=1, col=2)
    figure.update_layout(margin={"t": MARGIN["t"] + 16})  # the panels' own titles under the figure's
    return figure


def busiest(per_device: Mapping[object, tuple[np.ndarray, np.ndarray]]) -> object | None:
    """The device whose series has the highest mean (a 5-GPU run's busy GPU); None when there are none."""
    means = {d: float(np.nanmean(v)) for d, (_x, v) in per_device.items() if len(v) and not np.all(np.isnan(v))}
    return max(means, key=means.get) if means else None


def activity_figure(series: Mapping[str, tuple[np.ndarray, np.ndarray]], title: str) -> go.Figure:
    """GRACT, SMACT and SMOCC of one GPU on one 0–1 axis over seconds since start, and nvidia-smi's utilisation where recorded:
    the engine can read busy (GRACT, nvidia-smi ~1) while few SMs work (SMACT) and fewer warps are resident (SMOCC).

    `series`: catalogue name -> (seconds since start, values as stored)."""
    figure = go.Figure()
    for i, (name, label, scale, dash) in enumerate(ACTIVITY):
        if name not in series:
            continue
        xs, values = series[name]
        mean = float(np.nanmean(values)) * scale if len(values) else math.nan
        figure.add_scatter(x=xs, y=np.asarray(values, dtype=float) * scale, name=f"{label} (mean {mean:.3f})", mode="lines",
                           line={"color": PALETTE[i], "dash": dash, "width": 1.5}, meta={"metric": name},
                           hovertemplate=f"{label}<br>%{{x:.0f}} s: %{{y:.3f}}<extra></extra>")  # fmt: skip
    if not figure.data:
        raise FigureError("the run recorded none of GRACT, SMACT, SMOCC; pick a run with DCGM or GPM metrics")
    return _layout(figure, plain(title), "time since start (s)", "activity (0–1)", True, True)
