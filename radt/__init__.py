"""radt inside a training script: `with radt.run() as run: run.log_metric(...)`.

Under `radt train.py` the calls log to the run radt created and enforce --max-epoch and
--max-time: the first log_metric past a limit ends the `with` block (it raises StopTraining,
which the block swallows), so the code after the block runs, the checkpoint save included, and
the run ends FINISHED with the tag radt.stop_reason. A loop can also ask `run.should_stop(epoch)`
and break by itself. Run as plain `python train.py`, every call is a no-op, so the same script
works both ways.

No call waits for the store and none imports MLflow: each appends one JSON line to the run folder's
script.jsonl (RADT_RUN_DIR), and radt's own process sends them on through its writer (queue, spool,
deadlines; collectors/run/scriptlog.py). A disk that refuses the line is said once on stderr and never
raised into the training loop; what radt rejects (an invalid key) is said on radt's stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["run", "RadtRun", "StopTraining", "under_radt"]
__version__ = "0.1.0"

# files in the run folder (RADT_RUN_DIR) through which the script tells radt what it does
from radt.rundir import CONTEXT_FILE, SCRIPT_ARTIFACTS_DIR, SCRIPT_LOG_FILE, STARTED_FILE, STOP_REASON_FILE  # noqa: E402


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
        self._log = ScriptLog(self.run_dir / SCRIPT_LOG_FILE) if self.active else None
        self._opened = False
        self._nvtx_pop = None
        self._blocks = 0  # `with` blocks open on this object: where a stop can end the training without ending the process
        self._stop_reason: str | None = None

    def __enter__(self) -> RadtRun:
        self._blocks += 1
        return self._open()

    def _open(self) -> RadtRun:
        if not self.active:
            return self
        if not self._opened:
            self._opened = True
            self._log.touch(self.run_dir / CONTEXT_FILE)  # radt waits for this script's own stop at --max-time
        if self.manual:  # radt's sampler waits for this file
            self._log.touch(self.run_dir / STARTED_FILE)
        if self.nvtx_range and self._nvtx_pop is None:
            self._nvtx_pop = _push_nvtx(self.nvtx_range)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: Any) -> bool:
        self._blocks = max(0, self._blocks - 1)
        if self._nvtx_pop is not None and not self._blocks:
            self._nvtx_pop()
            self._nvtx_pop = None
        return exc_type is not None and issubclass(exc_type, StopTraining)  # the training ends; the code after the block runs

    # --- logging (no-ops outside radt; never wait for the store) ---------------------------

    def log_metric(self, key: str, value: float, step: int | None = None) -> None:
        if self._client():
            self._log.metrics({key: value}, step)
            self._check(step)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._client():
            self._log.metrics(metrics, step)
            self._check(step)

    def log_param(self, key: str, value: Any) -> None:
        if self._client():
            self._log.append({"params": {key: str(value)}})

    def log_params(self, params: dict[str, Any]) -> None:
        if self._client():
            self._log.append({"params": {k: str(v) for k, v in params.items()}})

    def set_tag(self, key: str, value: Any) -> None:
        if self._client():
            self._log.append({"tags": {key: str(value)}})

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        """A copy of `path` now (a file or a folder, as MLflow takes it), uploaded by radt in the background."""
        if self._client():
            self._log.artifact(self.run_dir / SCRIPT_ARTIFACTS_DIR, path, artifact_path)

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
            self._log.touch(self.run_dir / STOP_REASON_FILE, reason)
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
        if not self._opened:
            self._open()
        return True


class ScriptLog:
    """The script's side of script.jsonl: one O_APPEND write per call, no fsync, no store, no MLflow.

    radt's process reads the file as it grows (collectors/run/scriptlog.py). A failing disk costs the calls
    it refuses, said once on stderr; it never raises into the training loop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.dropped = 0  # calls not recorded (the disk refused them, or a value that is not a number)
        self._fd: int | None = None
        self._torn = False  # a short write left a line without its newline: the next one starts a fresh line
        self._said: set[str] = set()

    def metrics(self, metrics: dict[str, float], step: int | None) -> None:
        now = int(time.time() * 1000)
        rows = []
        for key, value in metrics.items():
            try:
                rows.append([key, float(value), now, int(step or 0)])
            except (TypeError, ValueError, OverflowError):
                self.dropped += 1
                self.say(f"value:{key}", f"radt: run.log_metric({key!r}, {value!r}, step={step!r}): not a number; not recorded")
        if rows:
            self.append({"metrics": rows})

    def append(self, record: dict) -> None:
        try:
            line = json.dumps(record, separators=(",", ":")) + "\n"
        except (TypeError, ValueError) as exc:  # a key that is no string, a value JSON cannot hold
            self.dropped += 1
            self.say("json", f"radt: a run.log_* call could not be recorded ({exc}); keys must be strings")
            return
        data = ("\n" + line if self._torn else line).encode()
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            written = os.write(self._fd, data)  # one write: whole lines even from forked workers
            self._torn = written < len(data)
            if self._torn:
                self.dropped += 1
                self.say("disk", f"radt: cannot write {self.path} (disk full?); run.log_* calls are being dropped")
        except OSError as exc:
            self.dropped += 1
            self.say("disk", f"radt: cannot write {self.path} ({exc.strerror or exc}); run.log_* calls are being dropped")

    def artifact(self, stage: Path, path: str, artifact_path: str | None) -> None:
        """Copy now (the file may change or go once the call returns), as MLflow's local artifact store does."""
        source = Path(path)
        target = stage / f"{time.time_ns()}-{os.getpid()}" / source.name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                shutil.copy2(source, target)
        except OSError as exc:
            self.dropped += 1
            self.say(f"artifact:{path}", f"radt: run.log_artifact({path!r}): cannot copy it ({exc.strerror or exc}); not recorded")
            shutil.rmtree(target.parent, ignore_errors=True)
            return
        self.append({"artifact": str(target.relative_to(stage.parent)), "artifact_path": artifact_path})

    def touch(self, path: Path, text: str = "") -> None:
        """A flag file radt reads (context, started, stop_reason); a disk that refuses it is said, not raised."""
        try:
            path.write_text(text)
        except OSError as exc:
            self.say(f"flag:{path.name}", f"radt: cannot write {path} ({exc.strerror or exc})")

    def say(self, what: str, message: str) -> None:
        if what not in self._said:
            self._said.add(what)
            print(message, file=sys.stderr, flush=True)


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
