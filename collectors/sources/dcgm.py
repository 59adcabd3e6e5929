"""DCGM profiling metrics through a long-lived `dcgmi dmon` subprocess, parsed line by line.

Like radT: ask for the full profiling field set first and fall back to the basic fields
when the GPU or the host engine refuses the profiling module.

A MIG slice the run uses (`SamplingContext.slices`) is its own series, `system/gpu_0_mig_3_...`:
`dcgmi discovery -c` names the slice's DCGM GPU-instance entity id, dmon is asked for it beside
the GPUs (`-i 0,i:<id>`) and prints it as "GPU-I <id>". Where the hierarchy lacks the slice,
`describe()` says why under "mig_activity" and the GPU-level series go on.

Besides the activity, dmon is asked why the clocks are held down (field 112, a bitmask split into the three clocks_*
series), the last XID (230: kept where it changes, see EnergyBaseline.new_xid) and the volatile ECC totals (310, 311).
"""

from __future__ import annotations

import shutil
import subprocess
import threading

from radt.catalogue import DCGM_BASIC_FIELDS, DCGM_PROFILING_FIELDS, MetricName
from radt.collectors.process.proctree import die_with_parent
from radt.collectors.sources.base import MetricSource, SamplingContext, SourceUnavailable
from radt.collectors.sources.parsers import DmonParser, dmon_error, parse_mig_hierarchy
from radt.collectors.sources.toolmetrics import EnergyBaseline, dmon_metrics

START_TIMEOUT = 10.0  # seconds to wait for the first line of data before trying the next field set
DISCOVERY_TIMEOUT = 5.0  # seconds for `dcgmi discovery -c`
WHOLE = "the GPU-level series are the whole GPU's"


def _merge(latest: dict[str, float], row: dict[str, float]) -> None:
    """A new dmon row over the one not sampled yet; an XID waiting to be sampled is kept over a later row's 0 (an event, not a level)."""
    for where, value in row.items():
        if value == 0 and latest.get(where) and where.endswith(MetricName.XID_ERROR):
            continue
        latest[where] = value


class DcgmSource(MetricSource):
    name = "dcgm"
    gives = "gpu"

    def __init__(self, executable: str = "dcgmi") -> None:
        self.executable = executable
        self.proc: subprocess.Popen | None = None
        self.fields: list[int] = []
        self.errors: list[str] = []
        self._latest: dict[str, float] = {}
        self._lock = threading.Lock()
        self._energy = EnergyBaseline()
        self._reader: threading.Thread | None = None
        self.slices: dict[tuple[int, int], int] = {}  # (GPU, GPU instance id) -> DCGM GPU-instance entity id
        self._instances: dict[int, tuple[int, int]] = {}  # the same, the other way round, for dmon_metrics
        self.mig_activity: str | None = None  # why a slice's own series are not recorded

    def open(self, ctx: SamplingContext) -> None:
        exe = shutil.which(self.executable)
        if exe is None:
            raise SourceUnavailable("dcgmi not found on PATH; install DCGM (datacenter-gpu-manager) and start nv-hostengine, or drop 'dcgm' from -l")
        interval_ms = max(100, int(ctx.interval * 1000))
        self.slices = self._find_slices(exe, ctx.slices) if ctx.slices else {}
        entities = ctx.devices
        if self.slices:  # -i replaces dmon's default of every GPU: name the GPUs too
            gpus = ctx.devices if ctx.devices is not None else list(dict.fromkeys(gpu for gpu, _ in ctx.slices))
            entities = [*gpus, *(f"i:{entity}" for entity in self.slices.values())]
        self._instances = {entity: slot for slot, entity in self.slices.items()}
        for fields in (DCGM_PROFILING_FIELDS, DCGM_BASIC_FIELDS):
            command = [exe, "dmon", "-e", ",".join(map(str, fields)), "-d", str(interval_ms)]
            if entities is not None:
                command += ["-i", ",".join(map(str, entities))]
            if self._start(command):
                self.fields = fields
                if self.slices and fields is DCGM_BASIC_FIELDS:
                    self.mig_activity = f"unavailable: DCGM refused the profiling fields ({self.errors[-1] if self.errors else 'no output'}); {WHOLE}"
                return
        reasons = "; ".join(dict.fromkeys(self.errors)) or "no output"  # each distinct error once
        raise SourceUnavailable(f"dcgmi dmon gave no data ({reasons}); check that nv-hostengine runs")

    def _find_slices(self, exe: str, slices: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
        """The DCGM GPU-instance entity id of each slice found in `dcgmi discovery -c`; why the others are missing in mig_activity."""
        try:
            done = subprocess.run([exe, "discovery", "-c"], capture_output=True, text=True, timeout=DISCOVERY_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.mig_activity = f"unavailable: dcgmi discovery -c failed ({exc}); {WHOLE}"
            return {}
        hierarchy = parse_mig_hierarchy(done.stdout)
        if not hierarchy:  # an error ("Error: Cannot get hierarchy information from the hostengine. Return: ..."), or an empty table
            said = next(filter(None, map(dmon_error, (done.stdout + done.stderr).splitlines())), None)
            if said or done.returncode != 0:
                self.mig_activity = f"unavailable: dcgmi discovery -c failed ({said or f'exit code {done.returncode}'}); {WHOLE}"
                return {}
        found = {slot: hierarchy[slot] for slot in slices if slot in hierarchy}
        missing = [slot for slot in slices if slot not in hierarchy]
        if missing:
            named = ", ".join(f"GPU {gpu} instance {gi}" for gpu, gi in missing)
            self.mig_activity = f"unavailable: DCGM's MIG hierarchy (dcgmi discovery -c) has no {named}; {WHOLE}"
        return found

    def _start(self, command: list[str]) -> bool:
        """Start dmon and wait until it prints a data row (True) or an error / exits (False)."""
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, preexec_fn=die_with_parent)
        first = threading.Event()
        ok = {"value": False}
        self._reader = threading.Thread(target=self._read, args=(self.proc, first, ok), name="radt-dcgmi", daemon=True)
        self._reader.start()
        first.wait(START_TIMEOUT)
        if not ok["value"]:
            self._stop_process()
        return ok["value"]

    def _read(self, proc: subprocess.Popen, first: threading.Event, ok: dict) -> None:
        parser = DmonParser()
        for line in proc.stdout:
            error = dmon_error(line)
            if error:
                self.errors.append(error)
                if not first.is_set():
                    first.set()
                    return
                continue
            row = parser.feed(line)
            if row is None:
                continue
            metrics = dmon_metrics(row, self._energy, instances=self._instances)
            if not metrics:
                continue
            with self._lock:
                _merge(self._latest, metrics)
            if not first.is_set():
                ok["value"] = True
                first.set()
        first.set()

    def sample(self) -> dict[str, float]:
        with self._lock:
            latest, self._latest = self._latest, {}
        if not latest and self.proc is not None and self.proc.poll() is not None:
            # dmon died (host engine gone, GPU lost): say so, so the sampler reports it once and drops us
            last = f": {self.errors[-1]}" if self.errors else ""
            raise RuntimeError(f"dcgmi dmon exited with code {self.proc.returncode}{last}")
        return latest

    def describe(self) -> dict:
        facts: dict = {"dcgm_fields": self.fields, "errors": list(self.errors)}
        if self.slices:
            facts["mig_instances"] = {f"{gpu}/{gi}": entity for (gpu, gi), entity in self.slices.items()}
        if self.mig_activity:
            facts["mig_activity"] = self.mig_activity
        return facts

    def _stop_process(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._reader is not None:  # it ends at the pipe's EOF
            self._reader.join(5)
            self._reader = None
        if proc.stdout is not None:
            proc.stdout.close()

    def close(self) -> None:
        self._stop_process()
