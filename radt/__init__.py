"""radt inside a training script: `with radt.run() as run: run.log_metric(...)`.

Under `radt train.py` the calls log to the run radt created and enforce --max-epoch and
--max-time: the first log_metric past a limit ends the `with` block (it raises StopTraining,
which the block swallows), so the code after the block runs, the checkpoint save included, and
the run ends FINISHED with the tag radt.stop_reason. A loop can also ask `run.should_stop(epoch)`
and break by itself. Run as plain `python train.py`, every call is a no-op, so the same script
works both ways.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["run", "RadtRun", "StopTraining", "under_radt"]
__version__ = "0.1.0"

# files in the run folder (RADT_RUN_DIR) through which the script tells radt what it does
from radt.rundir import CONTEXT_FILE, STARTED_FILE, STOP_REASON_FILE  # noqa: E402


class StopTraining(BaseException):
    """--max-epoch or --max-time reached at a log_metric inside `with radt.run()`: the block ends here and
    swallows it, so the code after the block runs. A BaseException, like KeyboardInterrupt, so that an
    `except Exception` in the training loop does not catch it."""


def under_radt() -> bool:
    """True when this process was started by `radt`."""
    return bool(os.environ.get("RADT_RUN_DIR")) and bool(os.environ.get("MLFLOW_RUN_ID"))


class RadtRun:
    """The run radt created for this script, as a context manager."""

    def __init__(self) -> None:
        self.active = under_radt()
        self.run_id = os.environ.get("MLFLOW_RUN_ID") if self.active else None
        self.run_dir = Path(os.environ["RADT_RUN_DIR"]) if self.active else None
        epoch = os.environ.get("RADT_MAX_EPOCH")
        deadline = os.environ.get("RADT_DEADLINE")
        self.max_epoch = int(epoch) if self.active and epoch else None
        self.deadline = float(deadline) if self.active and deadline else None
        self.manual = self.active and os.environ.get("RADT_MANUAL") == "1"
        self.nvtx_range = os.environ.get("RADT_NVTX_RANGE") if self.active else None
        self._mlflow = None
        self._nvtx_pop = None
        self._blocks = 0  # `with` blocks open on this object: where a stop can end the training without ending the process
        self._stop_reason: str | None = None

    def __enter__(self) -> RadtRun:
        self._blocks += 1
        return self._open()

    def _open(self) -> RadtRun:
        if not self.active:
            return self
        if self._mlflow is None:
            (self.run_dir / CONTEXT_FILE).touch()  # before MLflow's import: radt waits for this script at --max-time
        import mlflow

        self._mlflow = mlflow
        if mlflow.active_run() is None:
            mlflow.start_run(run_id=self.run_id)
        if self.manual:  # radt's sampler waits for this file
            (self.run_dir / STARTED_FILE).touch()
        if self.nvtx_range and self._nvtx_pop is None:
            self._nvtx_pop = _push_nvtx(self.nvtx_range)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: Any) -> bool:
        self._blocks = max(0, self._blocks - 1)
        if self._nvtx_pop is not None and not self._blocks:
            self._nvtx_pop()
            self._nvtx_pop = None
        return exc_type is not None and issubclass(exc_type, StopTraining)  # the training ends; the code after the block runs

    # --- logging (no-ops outside radt) -------------------------------------------------

    def log_metric(self, key: str, value: float, step: int | None = None) -> None:
        if self._client():
            self._mlflow.log_metric(key, value, step=step)
            self._check(step)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._client():
            self._mlflow.log_metrics(metrics, step=step)
            self._check(step)

    def log_param(self, key: str, value: Any) -> None:
        if self._client():
            self._mlflow.log_param(key, value)

    def log_params(self, params: dict[str, Any]) -> None:
        if self._client():
            self._mlflow.log_params(params)

    def set_tag(self, key: str, value: Any) -> None:
        if self._client():
            self._mlflow.set_tag(key, value)

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        if self._client():
            self._mlflow.log_artifact(path, artifact_path)

    # --- limits --------------------------------------------------------------------------

    def should_stop(self, epoch: int | None = None) -> bool:
        """True once --max-epoch (epoch >= it) or --max-time has been reached: save a checkpoint and break.

        The run records why (tag radt.stop_reason) and ends FINISHED when the script then exits 0."""
        reason = self._limit(epoch)
        if reason is not None:
            self._stopping(reason)
        return reason is not None

    def _limit(self, epoch: int | None) -> str | None:
        if self._stop_reason is not None:
            return self._stop_reason
        if epoch is not None and self.max_epoch is not None and epoch >= self.max_epoch:
            return "max_epoch"
        if self.deadline is not None and time.time() >= self.deadline:
            return "max_time"
        return None

    def _stopping(self, reason: str) -> None:
        if self._stop_reason is None and self.run_dir is not None:
            self._stop_reason = reason
            (self.run_dir / STOP_REASON_FILE).write_text(reason)
            print(f"radt: {reason.replace('_', '-')} reached, ending the training", file=sys.stderr, flush=True)

    def _check(self, step: int | None) -> None:
        if self._stop_reason is not None:
            return  # the script was told already (should_stop, or the block ended): what it logs after is its own business
        reason = self._limit(step)
        if reason is None:
            return
        self._stopping(reason)
        if self._blocks:
            raise StopTraining(reason)
        sys.exit(0)  # no `with` block to end: the script ends here, as a plain loop would at its last epoch

    def _client(self) -> bool:
        if not self.active:
            return False
        if self._mlflow is None:
            self._open()
        return True


def _push_nvtx(name: str):
    """Open the NVTX range an `nsys`/`ncu` listener captures; returns the function that closes it."""
    import importlib.util

    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.nvtx.range_push(name)
            return torch.cuda.nvtx.range_pop
    if importlib.util.find_spec("nvtx") is not None:
        import nvtx

        nvtx.push_range(name)
        return nvtx.pop_range
    print(f"radt: the profiler captures the NVTX range '{name}', but neither PyTorch with CUDA nor the nvtx package is here to open it; "
          "use the -raw listener to profile from the start", file=sys.stderr, flush=True)  # fmt: skip
    return None


def run() -> RadtRun:
    """`with radt.run() as run:` — the run radt started for this script (a no-op outside radt)."""
    return RadtRun()
