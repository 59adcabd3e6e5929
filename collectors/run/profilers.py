"""Workload listeners `nsys` and `ncu`: wrap the training command, reports land in the run's logs.

As radT did, the plain variants capture only the NVTX range `profile` (which `radt.run()` opens
around the training when a profiler wraps it); the `-raw` variants capture from the start
(`ncu-raw` stops after 100 kernels, or the report grows without bound).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from radt.collectors._common import UsageError

NVTX_RANGE = "profile"
EXECUTABLE = {"nsys": "nsys", "nsys-raw": "nsys", "ncu": "ncu", "ncu-raw": "ncu"}


def profiler_arguments(profiler: str, report: Path) -> list[str]:
    """The profiler's own arguments before the training command; `report` has no suffix."""
    if profiler == "nsys":
        return ["nsys", "profile", "--capture-range=nvtx", f"--nvtx-capture={NVTX_RANGE}", "--capture-range-end=repeat", "--cuda-memory-usage=true",
                "-t", "cuda,nvtx", "-f", "true", "-w", "true", "-o", str(report)]  # fmt: skip
    if profiler == "nsys-raw":
        return ["nsys", "profile", "--cuda-memory-usage=true", "-t", "cuda,nvtx", "-f", "true", "-w", "true", "-o", str(report)]
    if profiler == "ncu":
        return ["ncu", "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/", "-f", "-o", str(report)]
    if profiler == "ncu-raw":
        return ["ncu", "-c", "100", "-f", "-o", str(report)]
    raise UsageError(f"unknown profiler '{profiler}'; use nsys, ncu, nsys-raw or ncu-raw")


def check_profiler(profiler: str) -> None:
    """Refuse a profiler whose executable is not on PATH, before anything starts."""
    exe = EXECUTABLE[profiler]
    if shutil.which(exe) is None:
        suite = "Nsight Systems" if exe == "nsys" else "Nsight Compute"
        raise UsageError(f"listener '{profiler}' needs '{exe}' on PATH; install {suite} or add its bin folder to PATH, or drop '{profiler}' from the listeners")


def wrap(profiler: str | None, command: list[str], logs: Path, name: str) -> tuple[list[str], dict[str, str]]:
    """The command run under the profiler (reports written to logs/, attached as artifacts), and its extra environment."""
    if profiler is None:
        return command, {}
    env = {"RADT_NVTX_RANGE": NVTX_RANGE} if not profiler.endswith("-raw") else {}
    if profiler == "nsys":
        env["NSYS_NVTX_PROFILER_REGISTER_ONLY"] = "0"  # match the unregistered string 'profile'
    return [*profiler_arguments(profiler, logs / f"{profiler.split('-')[0]}_{name}"), *command], env
