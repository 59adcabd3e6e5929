"""A sweep's commands in the comparison figures and the summary table: `short_commands` (the names every summary table,
Live page and figure legend gives a sweep's runs) and `groups` (a figure's series by collocation), the code of a base
commit and this tree's side by side in one process, on sweeps of 100 to 1,000 commands (`python train.py --model M --lr
X --bs 64`, each run alone and under MPS). Both read every command's options again for each command before: quadratic.

    .venv/bin/python bench/sweep_names.py [--base REV] [--rounds 3]      # default base: 1aac185, before the change

Prints a line a size: the base's median, this tree's, and their ratio; the names are checked to be the same.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _base_module(rev: str):
    """app/export/aggregates.py as it was at REV, loaded beside this tree's as its own module."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:app/export/aggregates.py"], capture_output=True, text=True, check=True).stdout
    path = Path(f"/tmp/radt_bench_aggregates_{rev}.py")
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"radt.app._aggregates_{rev}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up by name
    spec.loader.exec_module(module)
    return module


def _sweep(n: int):
    import pandas as pd

    rng = random.Random(n)
    commands = [f"python train.py --model m{i % 2} --lr {rng.random():.5f} --bs 64" for i in range(n)]
    rows = [
        {"kind": "run", "experiment_id": "1", "command": c, "run": f"r{i}{m}", "run_id": f"{i:06d}{m}".ljust(32, "0"),
         "collocation": method, "workload": f"w{i}", "smact_mean": rng.random()}
        for i, c in enumerate(commands) for m, method in enumerate(("alone", "MPS"))
    ]  # fmt: skip
    return commands, pd.DataFrame(rows)


def _median(call, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="1aac185", help="the commit to compare with (default 1aac185)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from radt.app.export import aggregates as new

    old = _base_module(args.base)
    new.MAX_SERIES = 10**6  # time the grouping itself, past the series this tree draws
    for n in (100, 300, 1000):
        commands, table = _sweep(n)
        assert old.short_commands(commands) == new.short_commands(commands), "the same names"
        for name, call_old, call_new in (
            ("short_commands", functools.partial(old.short_commands, commands), functools.partial(new.short_commands, commands)),
            (
                "groups by collocation",
                functools.partial(old.groups, table, "smact_mean", "collocation"),
                functools.partial(new.groups, table, "smact_mean", "collocation"),
            ),
        ):
            before, after = _median(call_old, args.rounds), _median(call_new, args.rounds)
            print(f"{n:5d} commands  {name:22s} base {before * 1000:8.1f} ms   this tree {after * 1000:7.1f} ms   ratio {after / before:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
