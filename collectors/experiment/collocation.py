"""Collocation set-up for a workload: MPS control daemons and MIG instances, always undone.

Everything goes through the driver's own tools (`nvidia-smi mig`, `nvidia-cuda-mps-control`), as
an administrator would type it; what was set up is registered on an ExitStack at once, so a
crash, a failed run or Ctrl-C tears it down in reverse order. radt never changes the MIG mode
itself (that needs an idle GPU and a reset): it only creates and destroys instances.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from radt.collectors.experiment.migplacement import DRIVER, Held, MigLayout, model_layout, parse_instances, parse_placements, place, why_not
from radt.collocation import Mode
from radt.errors import UserError

_LGIP_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s")
_GPU_LINE = re.compile(r"^GPU\s+(\d+):.*\(UUID:\s*(GPU-[^)\s]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG\s.*\(UUID:\s*(MIG-[^)\s]+)\)")
TOOL_TIMEOUT = 120  # seconds; instance creation on a busy driver takes a few


class CollocationError(UserError, RuntimeError):
    """A collocation set-up that cannot be done; the message says what to do."""


@dataclass(frozen=True)
class MigProfile:
    name: str
    profile_id: int
    free: int
    total: int


@dataclass(frozen=True)
class MigInstance:
    gpu: int
    profile: str
    gpu_instance: int
    compute_instance: int | None
    uuid: str


@dataclass(frozen=True)
class MpsDaemon:
    devices: tuple[int, ...]
    pipe_dir: Path
    log_dir: Path

    def client_env(self, devices: list[int]) -> dict[str, str]:
        """A client's environment: the daemon's pipes, and its GPUs as the daemon numbers them (MPS remaps them)."""
        visible = ",".join(str(self.devices.index(d)) for d in devices)
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir), "CUDA_VISIBLE_DEVICES": visible}


def _tool(args: list[str], *, stdin: str | None = None, env: dict | None = None) -> str:
    """Run a driver tool; its output, or CollocationError naming the command and its first line of complaint."""
    try:
        done = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=TOOL_TIMEOUT, env=env)
    except FileNotFoundError as exc:
        raise CollocationError(f"'{args[0]}' not found on PATH; it comes with the NVIDIA driver, install it or add its folder to PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise CollocationError(f"'{' '.join(args)}' did not answer in {TOOL_TIMEOUT} s; check the driver with nvidia-smi") from exc
    text = (done.stdout or "") + (done.stderr or "")
    if done.returncode != 0:
        complaint = next((line.strip() for line in text.splitlines() if line.strip()), f"exit code {done.returncode}")
        raise CollocationError(f"'{' '.join(args)}' failed: {complaint}")
    return text


def smi_gpu_count() -> int | None:
    """GPUs that `nvidia-smi -L` lists, or None where nvidia-smi is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        return sum(1 for line in _tool(["nvidia-smi", "-L"]).splitlines() if _GPU_LINE.match(line))
    except CollocationError:
        return None


def mig_profiles(gpu: int) -> dict[str, MigProfile]:
    """The GPU instance profiles GPU `gpu` offers now (`nvidia-smi mig -lgip`); refuses a GPU not in MIG mode."""
    try:
        text = _tool(["nvidia-smi", "mig", "-i", str(gpu), "-lgip"])
    except CollocationError as exc:
        if " failed: " not in str(exc):  # nvidia-smi missing or hanging: say that, not "MIG mode"
            raise
        text = str(exc).split(" failed: ", 1)[1]
    profiles = {}
    for line in text.splitlines():
        match = _LGIP_ROW.match(line)
        if match and int(match.group(1)) == gpu:
            name = match.group(2)
            profiles[name] = MigProfile(name, int(match.group(3)), int(match.group(4)), int(match.group(5)))
    if not profiles:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "no output")
        raise CollocationError(
            f"GPU {gpu} is not in MIG mode ({first}); enable it with 'sudo nvidia-smi -i {gpu} -mig 1' on an idle GPU, or use collocation - or MPS"
        )
    return profiles


def mig_layout(gpu: int, offered: dict[str, MigProfile]) -> MigLayout:
    """GPU `gpu`'s placements (`nvidia-smi mig -lgipp`; radt's table for its model where the GPU does not answer, said in
    `fallback`) and the GPU instances on it now (`-lgi`), less those a killed radt left (undone before anything starts)."""
    free = {name: profile.free for name, profile in offered.items()}
    leftovers = _left_by_dead_radts()
    held = tuple(h for h in mig_instances(gpu) if (gpu, h.gpu_instance) not in leftovers)
    try:
        text = _tool(["nvidia-smi", "mig", "-i", str(gpu), "-lgipp"])
        placements = parse_placements(text, gpu, {p.profile_id: name for name, p in offered.items()})
        missing = [name for name in offered if name not in placements]
        fallback = f"'nvidia-smi mig -i {gpu} -lgipp' listed no placement of {', '.join(missing)}" if missing else ""
    except CollocationError as exc:
        placements, fallback = {}, str(exc)
    if not fallback:
        return MigLayout(placements, held, free)
    known = model_layout(offered)
    if known is None:
        return MigLayout({}, held, free, basis="no placement table", fallback=fallback)
    return MigLayout(known[1].placements, held, free, basis=known[1].basis, fallback=fallback)


def mig_instances(gpu: int) -> tuple[Held, ...]:
    """The GPU instances on GPU `gpu` with their placements (`nvidia-smi mig -lgi`); none where it finds none."""
    try:
        return parse_instances(_tool(["nvidia-smi", "mig", "-i", str(gpu), "-lgi"]), gpu)
    except CollocationError as exc:
        if "No GPU instances found" in str(exc):  # the driver's answer for an empty GPU, with a failing exit code
            return ()
        raise


def placed_slices(gpu: int, profiles: list[str], report: Callable[[str], None]) -> list[int | None]:
    """Where each of a workload's MIG slices goes on GPU `gpu` now (the GPU may have changed since the plan); None for
    each where no placement table is known (the driver places them); CollocationError where they no longer fit."""
    layout = mig_layout(gpu, mig_profiles(gpu))
    if layout.fallback:
        report(f"radt: {placement_note(gpu, layout)}")
    if not layout.placements:
        return [None] * len(profiles)
    starts = place(layout, profiles)
    if starts is None:
        raise CollocationError(
            f"GPU {gpu} cannot hold MIG {' + '.join(profiles)} together now ({why_not(layout, profiles)}); its GPU instances "
            "changed since the plan: remove the new ones or give the workload another GPU, then run the same command with --rerun"
        )
    return list(starts)


def placement_note(gpu: int, layout: MigLayout) -> str:
    """One line saying where GPU `gpu`'s placements came from when not from the driver."""
    if not layout.placements:
        return f"MIG placements on GPU {gpu} unknown ({layout.fallback}; radt has no table for its profiles): the driver places the slices itself"
    return f"MIG placements on GPU {gpu} from {layout.basis} instead of {DRIVER} ({layout.fallback})"


def _left_by_dead_radts() -> set[tuple[int, int]]:
    """(GPU, GPU instance) of the MIG instances the journal holds for radts that are gone: removed before anything starts."""
    import json

    import psutil

    path = _journal()
    entries = json.loads(path.read_text()) if path.exists() else []
    return {(e["gpu"], e["gi"]) for e in entries if e.get("kind") == Mode.MIG.value and not psutil.pid_exists(e["pid"])}


def mig_uuids(gpu: int) -> list[str]:
    """UUIDs of the MIG devices of GPU `gpu`, from `nvidia-smi -L`."""
    uuids: list[str] = []
    current = None
    for line in _tool(["nvidia-smi", "-L"]).splitlines():
        gpu_match = _GPU_LINE.match(line)
        if gpu_match:
            current = int(gpu_match.group(1))
            continue
        mig_match = _MIG_LINE.match(line)
        if mig_match and current == gpu:
            uuids.append(mig_match.group(1))
    return uuids


def create_mig(gpu: int, profile: str, start: int | None = None) -> MigInstance:
    """A GPU instance with its default compute instance, at memory slice `start` where the plan placed it (else where the
    driver puts it); its device UUID is the one `nvidia-smi -L` did not list before."""
    before = set(mig_uuids(gpu))
    tuple_ = profile if start is None else f"{profile}:{start}"  # nvidia-smi's profile tuple: a profile and its placement
    text = _tool(["nvidia-smi", "mig", "-i", str(gpu), "-cgi", tuple_, "-C"])
    gi = re.search(r"created GPU instance ID\s+(\d+)", text)
    ci = re.search(r"created compute instance ID\s+(\d+)", text)
    if gi is None:
        raise CollocationError(f"'nvidia-smi mig -i {gpu} -cgi {tuple_} -C' said nothing about a GPU instance: {text.strip()[:200]}")
    instance = MigInstance(gpu, profile, int(gi.group(1)), int(ci.group(1)) if ci else None, "")
    new = [u for u in mig_uuids(gpu) if u not in before]
    if len(new) != 1:
        destroy_mig(instance)
        raise CollocationError(
            f"MIG {profile} on GPU {gpu}: expected one new MIG device in 'nvidia-smi -L', found {len(new)}; is another tool changing MIG instances?"
        )
    return MigInstance(gpu, profile, instance.gpu_instance, instance.compute_instance, new[0])


def destroy_mig(instance: MigInstance) -> None:
    """Remove the compute instance, then the GPU instance."""
    gpu, gi = str(instance.gpu), str(instance.gpu_instance)
    if instance.compute_instance is not None:
        _tool(["nvidia-smi", "mig", "-i", gpu, "-gi", gi, "-ci", str(instance.compute_instance), "-dci"])
    _tool(["nvidia-smi", "mig", "-i", gpu, "-gi", gi, "-dgi"])


def _mps_env(daemon: MpsDaemon) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(daemon.log_dir)})
    env.update({"CUDA_VISIBLE_DEVICES": ",".join(map(str, daemon.devices)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    return env


def start_mps(devices: list[int]) -> MpsDaemon:
    """An MPS control daemon of radt's own (private pipe folder, so a system-wide daemon is left alone)."""
    root = Path(tempfile.mkdtemp(prefix="radt-mps-"))  # short: UNIX socket paths end at 108 bytes
    daemon = MpsDaemon(tuple(sorted(devices)), root / "pipe", root / "log")
    daemon.pipe_dir.mkdir()
    daemon.log_dir.mkdir()
    try:
        _tool(["nvidia-cuda-mps-control", "-d"], env=_mps_env(daemon))
    except CollocationError:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return daemon


def stop_mps(daemon: MpsDaemon) -> None:
    """`echo quit | nvidia-cuda-mps-control` for radt's daemon; its folder goes with it."""
    _tool(["nvidia-cuda-mps-control"], stdin="quit\n", env=_mps_env(daemon))
    shutil.rmtree(daemon.pipe_dir.parent, ignore_errors=True)


def _journal() -> Path:
    """What radt has set up and not yet undone, so a radt killed with SIGKILL is cleaned up after next time."""
    from radt.settings import radt_home

    return radt_home() / "collocation-journal.json"


def _journal_edit(change: Callable[[list[dict]], list[dict]]) -> None:
    import fcntl
    import json

    path = _journal()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = json.loads(path.read_text()) if path.exists() else []
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(change(entries)))
        tmp.replace(path)


def _undo_entry(entry: dict) -> None:
    if entry["kind"] == Mode.MPS.value:
        stop_mps(MpsDaemon(tuple(entry["devices"]), Path(entry["pipe_dir"]), Path(entry["log_dir"])))
    else:
        destroy_mig(MigInstance(entry["gpu"], entry["profile"], entry["gi"], entry["ci"], entry["uuid"]))


def undo_leftovers(report: Callable[[str], None]) -> None:
    """Undo the set-up of experiments whose radt died before it could (pid gone), and say so."""
    import psutil

    if not _journal().exists():
        return
    left: list[dict] = []

    def keep_live(entries: list[dict]) -> list[dict]:
        left.extend(e for e in entries if not psutil.pid_exists(e["pid"]))
        return [e for e in entries if psutil.pid_exists(e["pid"])]

    _journal_edit(keep_live)
    for entry in left:
        what = (
            f"MPS daemon for GPU {'+'.join(map(str, entry.get('devices', [])))}"
            if entry["kind"] == Mode.MPS.value
            else f"MIG {entry.get('profile')} on GPU {entry.get('gpu')}"
        )
        try:
            _undo_entry(entry)
            report(f"radt: removed the {what} that an experiment killed before its tear-down (radt pid {entry['pid']}) left behind")
        except CollocationError as exc:
            report(f"radt: the {what} left by a killed experiment could not be removed ({exc}); remove it by hand")


class Setup:
    """What one workload set up; `close()` undoes it in reverse order, reporting (not raising) what could not be undone.

    Each step is also written to a journal in RADT_HOME until it is undone (see undo_leftovers)."""

    def __init__(self, report: Callable[[str], None]) -> None:
        self.report = report
        self._stack = ExitStack()

    def _remember(self, entry: dict) -> dict:
        entry = {**entry, "pid": os.getpid()}
        _journal_edit(lambda entries: [*entries, entry])
        return entry

    def mps(self, devices: list[int]) -> MpsDaemon:
        daemon = start_mps(devices)
        entry = self._remember({"kind": Mode.MPS.value, "devices": list(daemon.devices), "pipe_dir": str(daemon.pipe_dir), "log_dir": str(daemon.log_dir)})
        self.report(f"radt: MPS control daemon started for GPU {'+'.join(map(str, daemon.devices))}")
        fix = f"stop it with: echo quit | CUDA_MPS_PIPE_DIRECTORY={daemon.pipe_dir} nvidia-cuda-mps-control"
        self._stack.callback(self._undo, "stop the MPS daemon", fix, entry)
        return daemon

    def mig(self, gpu: int, profile: str, start: int | None = None) -> MigInstance:
        instance = create_mig(gpu, profile, start)
        entry = self._remember(
            {"kind": Mode.MIG.value, "gpu": gpu, "profile": profile, "gi": instance.gpu_instance, "ci": instance.compute_instance, "uuid": instance.uuid}
        )
        self.report(f"radt: MIG {profile} created on GPU {gpu} (GPU instance {instance.gpu_instance}, {instance.uuid})")
        fix = f"remove it with 'sudo nvidia-smi mig -i {gpu} -gi {instance.gpu_instance} -dci' and then '... -dgi'"
        self._stack.callback(self._undo, f"remove MIG GPU instance {instance.gpu_instance} of GPU {gpu}", fix, entry)
        return instance

    def _undo(self, what: str, fix: str, entry: dict) -> None:
        try:
            _undo_entry(entry)
            _journal_edit(lambda entries: [e for e in entries if e != entry])
        except Exception as exc:  # keep undoing the rest; say what is left for the user
            self.report(f"radt: could not {what} ({exc}); {fix}")

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Setup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
