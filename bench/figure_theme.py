"""What radt's template costs each figure the dashboard builds: `update_layout(template=NAME)` (Plotly validates the
whole registered template again, every figure) against palette.themed (set as Plotly sets its default template), side
by side in one process, on the figures a callback answers with: an empty figure's message, a Live card, a comparison
bar figure and an export page.

    .venv/bin/python bench/figure_theme.py [--tries 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import plotly.graph_objects as go

from radt.app.figures.palette import PAPER, SCREEN, themed


def _validated(fig: go.Figure, name: str) -> go.Figure:
    """The baseline: the template given by name, as every figure of radt was themed before."""
    return fig.update_layout(template=name)


def _figures(theme: Callable[[go.Figure, str], go.Figure]) -> dict[str, Callable[[], dict]]:
    """Each figure shape, built and serialised (what Dash sends) with THEME."""
    xs = list(range(600))

    def empty() -> dict:
        fig = go.Figure()
        fig.add_annotation(text="pick a run", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
        return theme(fig, SCREEN).update_layout(height=260, xaxis={"visible": False}, yaxis={"visible": False}).to_plotly_json()

    def live_card() -> dict:
        fig = go.Figure([go.Scatter(x=xs, y=[i % 7 / 7 for i in xs], mode="lines", name=f"GPU {g}") for g in range(4)])
        return theme(fig, SCREEN).update_layout(height=230, showlegend=True, yaxis={"range": [0, 1.02]}).to_plotly_json()

    def bars() -> dict:
        fig = go.Figure([go.Bar(x=["same GPU", "MPS", "MIG"], y=[0.4, 0.5, 0.6], name=f"workload {w}") for w in range(3)])
        return theme(fig, PAPER).update_layout(height=420, title={"text": "SMACT"}).to_plotly_json()

    return {"empty figure": empty, "Live card (4 GPUs, 600 points)": live_card, "comparison bars": bars}


def _median_ms(build: Callable[[], dict], tries: int) -> float:
    build()
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        build()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=200, help="figures built per shape and contender (median reported)")
    args = parser.parse_args()
    before, after = _figures(_validated), _figures(themed)
    for shape in before:
        if before[shape]() != after[shape]():
            raise SystemExit(f"{shape}: themed() gives another figure than the template's name")
    print(f"{'figure':34s} {'by name':>9s} {'themed':>9s} {'ratio':>6s}")
    for shape in before:
        slow, fast = _median_ms(before[shape], args.tries), _median_ms(after[shape], args.tries)
        print(f"{shape:34s} {slow:7.2f} ms {fast:7.2f} ms {fast / slow:6.2f}")


if __name__ == "__main__":
    main()
