"""Shared state of the fake driver tools in this folder: an invocation log and the MIG/MPS state.

RADT_FAKE_TOOLS_LOG=FILE     every invocation appends a JSON line {tool, args, time, env}
RADT_FAKE_TOOLS_STATE=FILE   the MIG instances and MPS daemons the fakes hold (JSON)
RADT_FAKE_SMI_GPUS=N         GPUs that nvidia-smi lists (default 4, A100-SXM4-40GB)
RADT_FAKE_MIG_GPUS=2,3       GPUs in MIG mode (default 2)
RADT_FAKE_MIG_FAIL=PROFILE   creating this profile fails as on a GPU with no room left
RADT_FAKE_MIG_NO_PLACEMENTS=1  `mig -lgipp` is refused (a driver that will not list placements)
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_DEVICE_ORDER",
    "RADT_NVTX_RANGE",
    "NSYS_NVTX_PROFILER_REGISTER_ONLY",
)


def record(tool: str, args: list[str], **extra) -> None:
    path = os.environ.get("RADT_FAKE_TOOLS_LOG")
    if not path:
        return
    entry = {"tool": tool, "args": args, "time": time.time(), "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ}, **extra}
    with open(path, "a") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        log.write(json.dumps(entry) + "\n")


@contextmanager
def state():
    """The fakes' shared state, locked while a tool changes it."""
    path = Path(os.environ.get("RADT_FAKE_TOOLS_STATE", "/tmp/radt-fake-tools-state.json"))
    lock = open(str(path) + ".lock", "a")  # noqa: SIM115 - held across the yield
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        data = json.loads(path.read_text()) if path.exists() else {"mig": [], "mps": []}
        yield data
        path.write_text(json.dumps(data))
    finally:
        lock.close()


def gpu_count() -> int:
    return int(os.environ.get("RADT_FAKE_SMI_GPUS", "4"))


def mig_gpus() -> set[int]:
    return {int(g) for g in os.environ.get("RADT_FAKE_MIG_GPUS", "2").split(",") if g.strip()}
