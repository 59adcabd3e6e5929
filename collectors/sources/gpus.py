"""Which physical GPUs a run uses, by UUID and PCI bus id, never by position alone.

Two numberings meet here. NVML (nvidia-smi, DCGM, radt's keys `system/gpu_<i>_...`, `-d`) numbers
GPUs by PCI bus id. CUDA (what the training script sees) numbers them fastest first unless
CUDA_DEVICE_ORDER=PCI_BUS_ID, and CUDA_VISIBLE_DEVICES may name them by that number, by a GPU UUID or
a unique prefix of one, or by a MIG device UUID (also the old `MIG-GPU-<uuid>/<gi>/<ci>` form); CUDA
stops at the first entry it cannot resolve. On a DGX Station the "DGX Display" GPU sits at NVML
index 3 by its bus id while CUDA, fastest first, calls the fourth A100 "3" (NVML index 4).

Plain functions returning named tuples, psutil style: `machine()` lists the GPUs and MIG devices,
`cuda_order()` gives CUDA's numbering, `visible_devices()` resolves CUDA_VISIBLE_DEVICES,
`resolve_tokens()` resolves `-d`, and `plan()` puts them together for a run: what the script is
given and which series radt writes (a whole GPU `gpu_0`, or a MIG slice `gpu_0_mig_3` named by its
GPU instance id, the catalogue's `key(name, gpu, mig=gi)`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import NamedTuple

import pynvml

from radt.errors import UserError

TAG_CHARS = 8000  # MLflow's limit on a tag value
PCI_BUS_ID = "PCI_BUS_ID"
_INDEX = re.compile(r"^\d+")  # CUDA reads an index like strtoul: "1gpu" is 1 (PyTorch's emulation agrees)
OLD_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)$")  # MIG-GPU-<uuid>/<gi>/<ci>, drivers before R470
_PROFILE = re.compile(r"\bMIG\s+(\S+)$")  # "NVIDIA A100-SXM4-40GB MIG 1g.5gb" -> 1g.5gb


class NvmlUnavailable(Exception):
    """NVML cannot be loaded or cannot list the GPUs; the message is NVML's reason."""


class DeviceError(UserError, ValueError):
    """A `-d` entry this machine lacks; the message names it and the fix."""


class Gpu(NamedTuple):
    index: int  # NVML's (nvidia-smi's) index
    uuid: str
    pci_bus_id: str  # "00000000:07:00.0"
    name: str
    compute_capability: tuple[int, int] | None
    cores: int | None  # CUDA cores
    max_sm_clock_mhz: int | None
    mig_mode: bool
    memory_total_bytes: int | None
    gpm_supported: bool


class MigDevice(NamedTuple):
    gpu: int  # NVML index of its GPU
    index: int  # MIG device index on that GPU (nvmlDeviceGetMigDeviceHandleByIndex)
    uuid: str
    name: str
    profile: str | None  # "1g.10gb"
    gpu_instance: int  # nvidia-smi's "GI ID": the `mig=` of the series keys
    compute_instance: int
    memory_total_bytes: int | None


class Machine(NamedTuple):
    driver: str
    gpus: list[Gpu]
    migs: list[MigDevice]


class Watched(NamedTuple):
    """One device the run writes series for: a whole GPU, or a MIG slice of it; `cuda` is the script's ordinal for it."""

    gpu: Gpu
    mig: MigDevice | None = None
    cuda: int | None = None

    @property
    def series(self) -> str:
        return f"gpu_{self.gpu.index}" + (f"_mig_{self.mig.gpu_instance}" if self.mig else "")


class Order(NamedTuple):
    gpus: list[Gpu]  # in CUDA's numbering
    doubt: str | None  # why the estimate of FASTEST_FIRST may be wrong; None when it is certain


class Plan(NamedTuple):
    """What a run gives its script and what it watches."""

    machine: Machine | None  # None: NVML unavailable, the mapping cannot be known
    watched: list[Watched] | None  # devices the script sees (None: unknown)
    visible: str | None  # CUDA_VISIBLE_DEVICES for the script; None: leave the environment's
    order: str | None  # CUDA_DEVICE_ORDER for the script where the user set none
    notes: list[str]  # one line each, for stderr
    fallback: list[int] | None = None  # without NVML: the indices watched as radt always did (None: every GPU)
    reason: str = ""  # why NVML is unavailable
    unmapped: tuple[str, ...] = ()  # without NVML: the GPU-/MIG- UUIDs the script was given, for the exporter's labels to place

    @property
    def indices(self) -> list[int] | None:
        """NVML indices of the GPUs whose own series are written (a slice's GPU included: its power, clocks)."""
        if self.watched is None:
            return self.fallback
        return sorted({w.gpu.index for w in self.watched})

    @property
    def slices(self) -> list[tuple[int, int]]:
        """(NVML GPU index, GPU instance id) of each MIG slice watched."""
        return [(w.gpu.index, w.mig.gpu_instance) for w in self.watched or [] if w.mig]


# --- the machine ---------------------------------------------------------------------------


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _call(name: str, *args):
    """A pynvml call that may be missing from this nvidia-ml-py or unsupported by this GPU/driver: None then."""
    function = getattr(pynvml, name, None)
    if function is None:
        return None
    try:
        return function(*args)
    except pynvml.NVMLError:
        return None


def gpm_supported(handle) -> bool:
    """Whether the GPU offers GPM (Hopper and newer); False where the driver or pynvml has no GPM."""
    try:
        return bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except Exception:
        return False


def mig_handles(handle) -> list[tuple[int, object]]:
    """(MIG device index, handle) of every MIG device of a GPU in MIG mode; [] otherwise."""
    count = _call("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    found = []
    for index in range(count):
        mig = _call("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)  # NOT_FOUND for an empty slot
        if mig is not None:
            found.append((index, mig))
    return found


def mig_handle(handle, gpu_instance: int):
    """The MIG device handle of GPU instance `gpu_instance` on this GPU (its first compute instance), or None."""
    for _, mig in mig_handles(handle):
        if _call("nvmlDeviceGetGpuInstanceId", mig) == gpu_instance:
            return mig
    return None


def _pci_bus_id(handle) -> str:
    info = _call("nvmlDeviceGetPciInfo", handle)
    return _text(info.busId) if info is not None else ""


def _mig_mode(handle) -> bool:
    mode = _call("nvmlDeviceGetMigMode", handle)
    return bool(mode) and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE


def machine() -> Machine:
    """This machine's GPUs (NVML order) and MIG devices; raises NvmlUnavailable with NVML's reason."""
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no library
        raise NvmlUnavailable(str(exc)) from exc
    try:
        gpus, migs = [], []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            capability = _call("nvmlDeviceGetCudaComputeCapability", handle)
            memory = _call("nvmlDeviceGetMemoryInfo", handle)
            mig_mode = _mig_mode(handle)
            gpus.append(
                Gpu(
                    index=index,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    pci_bus_id=_pci_bus_id(handle),
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    compute_capability=tuple(capability) if capability else None,
                    cores=_call("nvmlDeviceGetNumGpuCores", handle),
                    max_sm_clock_mhz=_call("nvmlDeviceGetMaxClockInfo", handle, pynvml.NVML_CLOCK_SM),
                    mig_mode=mig_mode,
                    memory_total_bytes=int(memory.total) if memory is not None else None,
                    gpm_supported=gpm_supported(handle),
                )
            )
            for mig_index, mig in mig_handles(handle) if mig_mode else []:
                name = _text(_call("nvmlDeviceGetName", mig) or "")
                profile = _PROFILE.search(name)
                mig_memory = _call("nvmlDeviceGetMemoryInfo", mig)
                migs.append(
                    MigDevice(
                        gpu=index,
                        index=mig_index,
                        uuid=_text(pynvml.nvmlDeviceGetUUID(mig)),
                        name=name,
                        profile=profile.group(1) if profile else None,
                        gpu_instance=int(pynvml.nvmlDeviceGetGpuInstanceId(mig)),
                        compute_instance=int(_call("nvmlDeviceGetComputeInstanceId", mig) or 0),
                        memory_total_bytes=int(mig_memory.total) if mig_memory is not None else None,
                    )
                )
        return Machine(_text(pynvml.nvmlSystemGetDriverVersion()), gpus, migs)
    except pynvml.NVMLError as exc:  # a driver that loads but cannot enumerate
        raise NvmlUnavailable(str(exc)) from exc
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def slices_in_use(pids: set[int], gpu_indices: list[int]) -> set[tuple[int, int]]:
    """(GPU, GPU instance id) of each MIG slice of these GPUs that one of `pids` runs on, by each MIG device's process
    list (no privilege needed, unlike the whole GPU's); empty without NVML or where none does."""
    if not pids or not gpu_indices:
        return set()
    try:
        pynvml.nvmlInit()
    except Exception:
        return set()
    found: set[tuple[int, int]] = set()
    try:
        for index in gpu_indices:
            handle = _call("nvmlDeviceGetHandleByIndex", index)
            for _, mig in mig_handles(handle) if handle is not None and _mig_mode(handle) else []:
                procs = _call("nvmlDeviceGetComputeRunningProcesses", mig) or []
                gi = _call("nvmlDeviceGetGpuInstanceId", mig)
                if gi is not None and any(p.pid in pids for p in procs):
                    found.add((index, int(gi)))
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return found


# --- CUDA's numbering ----------------------------------------------------------------------


def _throughput(gpu: Gpu) -> int | None:
    return gpu.cores * gpu.max_sm_clock_mhz if gpu.cores and gpu.max_sm_clock_mhz else None


def _faster(gpu: Gpu) -> tuple:
    capability = gpu.compute_capability or (0, 0)
    return (-capability[0], -capability[1], -(_throughput(gpu) or 0), gpu.pci_bus_id.lower())


def cuda_order(gpus: list[Gpu], order: str | None) -> Order:
    """The GPUs in CUDA's numbering under CUDA_DEVICE_ORDER `order` (unset, or anything but PCI_BUS_ID: FASTEST_FIRST).

    FASTEST_FIRST is "fastest device first, ties by PCI bus id" by a heuristic CUDA does not publish;
    radt estimates it by compute capability, then CUDA cores x max SM clock. Identical models tie, so
    the order is the PCI order for sure; mixed models give a `doubt` where the estimate may be wrong:
    equal compute capability, a figure NVML would not give, or capability and throughput disagreeing.
    """
    by_pci = sorted(gpus, key=lambda g: g.pci_bus_id.lower())
    if order == PCI_BUS_ID or len({g.name for g in gpus}) <= 1:
        return Order(by_pci, None)
    ranked = sorted(by_pci, key=_faster)
    doubtful = set()
    for a in gpus:
        for b in gpus:
            if a.name >= b.name:
                continue
            ta, tb = _throughput(a), _throughput(b)
            if a.compute_capability is None or b.compute_capability is None or ta is None or tb is None:
                doubtful.add(f"NVML gives no speed figures for {a.name if ta is None or a.compute_capability is None else b.name}")
            elif a.compute_capability == b.compute_capability:
                doubtful.add(f"{a.name} and {b.name} share compute capability {a.compute_capability[0]}.{a.compute_capability[1]}")
            elif (a.compute_capability > b.compute_capability) != (ta > tb):
                doubtful.add(f"{a.name} and {b.name} rank differently by compute capability and by cores x clock")
    doubt = "; ".join(sorted(doubtful)) if doubtful else None
    return Order(ranked, doubt)


def _order_doubt_note(visible: str, doubt: str) -> str:
    return (
        f"radt: CUDA_VISIBLE_DEVICES={visible} counts GPUs in CUDA's default order (fastest first), which radt can only estimate here "
        f"({doubt}); the GPUs watched may not be the script's: set CUDA_DEVICE_ORDER=PCI_BUS_ID or give -d/UUIDs"
    )


def _by_uuid(token: str, candidates: list) -> object | None:
    """The one candidate whose UUID starts with `token` (CUDA accepts a unique prefix); None if none or several."""
    found = [c for c in candidates if c.uuid.lower().startswith(token.lower())]
    exact = [c for c in found if c.uuid.lower() == token.lower()]
    return (exact or found)[0] if len(exact or found) == 1 else None


def _resolve_token(token: str, numbered: list[Gpu], mach: Machine) -> Watched | None:
    """One CUDA_VISIBLE_DEVICES entry as CUDA reads it; None where CUDA would stop."""
    token = token.strip()
    if token.startswith("MIG-"):
        old = OLD_MIG.match(token)
        if old:
            gpu = _by_uuid(old.group(1), mach.gpus)
            mig = next((m for m in mach.migs if gpu and m.gpu == gpu.index and (m.gpu_instance, m.compute_instance) == tuple(map(int, old.groups()[1:]))), None)
        else:
            mig = _by_uuid(token, mach.migs)
        return Watched(mach.gpus[mig.gpu], mig) if mig else None
    if token.startswith("GPU-"):
        gpu = _by_uuid(token, mach.gpus)
        return Watched(gpu) if gpu else None
    number = _INDEX.match(token)
    if number and int(number.group()) < len(numbered):
        return Watched(numbered[int(number.group())])
    return None


def visible_devices(visible: str | None, mach: Machine, order: str | None) -> tuple[list[Watched], list[str]]:
    """What a script sees under CUDA_VISIBLE_DEVICES `visible` and CUDA_DEVICE_ORDER `order`: devices with their CUDA ordinals, and notes.

    Unset: every GPU. Empty: none. Else entry by entry until one CUDA cannot resolve (an index past
    the last GPU, -1, an unknown or ambiguous UUID prefix) or one repeats: CUDA stops there.
    """
    numbered = cuda_order(mach.gpus, order)
    if visible is None:
        return [Watched(g, None, i) for i, g in enumerate(numbered.gpus)], []
    tokens = visible.split(",") if visible.strip() else []
    watched: list[Watched] = []
    notes: list[str] = []
    for token in tokens:
        found = _resolve_token(token, numbered.gpus, mach)
        if found is None or any((w.gpu.index, w.mig) == (found.gpu.index, found.mig) for w in watched):
            why = "repeats an earlier entry" if found else "is no GPU or MIG device of this machine"
            notes.append(
                f"radt: CUDA_VISIBLE_DEVICES={visible}: '{token.strip()}' {why}; CUDA stops there, so the script sees {len(watched)} device(s) and radt watches those"
            )
            break
        watched.append(found._replace(cuda=len(watched)))
    uses_index = any(_INDEX.match(t.strip()) for t in tokens[: len(watched) + 1])
    if uses_index and numbered.doubt and order != PCI_BUS_ID:
        notes.append(_order_doubt_note(visible, numbered.doubt))
    return watched, notes


# --- -d ------------------------------------------------------------------------------------


def device_tokens(spec: str | None) -> list[int | str] | None:
    """-d as typed: '0+1' or '0,1' -> [0, 1]; GPU-/MIG- UUIDs kept as text; '-' or empty -> None."""
    if spec is None or spec.strip() in ("", "-"):
        return None
    tokens: list[int | str] = []
    for part in (p.strip() for p in spec.replace(",", "+").split("+")):
        if part.isdigit():
            tokens.append(int(part))
        elif part.startswith(("GPU-", "MIG-")) and len(part) > 4:
            tokens.append(part)
        else:
            raise DeviceError(
                f"bad -d '{spec}': give GPU indices (nvidia-smi's numbering) or GPU-/MIG- UUIDs joined with '+', e.g. -d 0, -d 0+1 or -d GPU-8a1c"
            )
    return list(dict.fromkeys(tokens))


def resolve_tokens(tokens: list[int | str], mach: Machine) -> list[Watched]:
    """-d entries as this machine's devices (indices are NVML's); DeviceError names the first it lacks."""
    watched = []
    for token in tokens:
        if isinstance(token, int):
            if token >= len(mach.gpus):
                span = f"0 to {len(mach.gpus) - 1}" if mach.gpus else "none"
                raise DeviceError(f"GPU {token} does not exist on this machine (GPUs: {span}); fix -d")
            watched.append(Watched(mach.gpus[token]))
            continue
        pool = mach.migs if token.startswith("MIG-") else mach.gpus
        matches = [d for d in pool if d.uuid.lower().startswith(token.lower())]
        found = _resolve_token(token, mach.gpus, mach)
        if found is None:
            if len(matches) > 1:
                raise DeviceError(f"-d {token} matches {len(matches)} devices ({', '.join(m.uuid for m in matches)}); give more of the UUID")
            raise DeviceError(f"-d {token} is no GPU or MIG device of this machine; fix -d (nvidia-smi -L lists them)")
        watched.append(found)
    return list({(w.gpu.index, w.mig): w for w in watched}.values())


# --- a run's plan --------------------------------------------------------------------------


def _tokens(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def fallback_indices(devices: list[int | str] | None, visible: str | None, environ: Mapping[str, str] | None = None) -> tuple[list[int] | None, str | None]:
    """Without NVML: -d's indices, else CUDA_VISIBLE_DEVICES when it lists indices, else every GPU (None); and a note.

    UUIDs (GPU-/MIG-) never widen to every GPU: only -d's indices, or on a Slurm node SLURM_JOB_GPUS for GPU UUIDs
    (Slurm's own GPUs of the job), are watched by index; what the UUIDs are is left to the exporter's labels (`unmapped`)."""
    given = [str(d) for d in devices] if devices is not None else _tokens(visible)
    if devices is None and visible is None:
        return None, None
    if not given:
        return [], None  # CUDA_VISIBLE_DEVICES="" hides every GPU
    indices = [int(t) for t in given if t.isdigit()]
    uuids = [t for t in given if not t.isdigit()]
    if not uuids:
        return indices, None
    slurm = _tokens((environ or {}).get("SLURM_JOB_GPUS"))
    if not indices and slurm and all(t.isdigit() for t in slurm) and all(t.upper().startswith("GPU-") for t in uuids):
        indices = [int(t) for t in slurm]
    where = f"-d {'+'.join(given)}" if devices is not None else f"CUDA_VISIBLE_DEVICES={visible}"
    return indices, (
        f"radt: {where} names devices radt cannot map to a GPU here (NVML unavailable): the nvml and dcgm listeners watch "
        + (f"GPU {', '.join(map(str, indices))} only" if indices else "none of them")
        + "; prometheus keeps only series its labels prove are this run's (the UUIDs, this Slurm job's jobid)"
    )


def unmapped(devices: list[int | str] | None, visible: str | None) -> tuple[str, ...]:
    """The GPU-/MIG- UUIDs among -d, else CUDA_VISIBLE_DEVICES: without NVML, the exporter's labels say which series they are."""
    given = [str(d) for d in devices] if devices is not None else _tokens(visible)
    return tuple(t for t in given if t.upper().startswith(("GPU-", "MIG-")))


def unchecked_note(devices: list[int | str], visible: str | None, reason: str) -> str:
    """What radt could not check of -d without NVML, and what the script gets: the one GPU truth radt has is NVML's, so
    `-d 99` is refused wherever NVML answers, and said plainly here where it does not."""
    why = f"NVML cannot be loaded here ({reason})" if reason else "NVML cannot be loaded here"
    return (
        f"radt: -d {'+'.join(map(str, devices))} is not checked: {why}, so radt cannot tell which GPUs this machine has; "
        f"the script gets CUDA_VISIBLE_DEVICES={visible} as given (no GPU, where that GPU does not exist)"
    )


def plan_without_nvml(devices: list[int | str] | None, cuda_visible: str | None, environ: Mapping[str, str], reason: str = "") -> Plan:
    """radt's behaviour where the mapping cannot be known: -d as given, CUDA numbering GPUs by PCI bus id; UUIDs never widen to every GPU."""
    visible = ",".join(map(str, devices)) if devices is not None else None
    order = PCI_BUS_ID if devices is not None else None
    if cuda_visible is not None:
        visible = cuda_visible
    notes = [unchecked_note(devices, visible, reason)] if devices else []
    seen = environ.get("CUDA_VISIBLE_DEVICES")
    fallback, note = fallback_indices(devices, seen, environ)
    return Plan(None, None, visible, order, notes + ([note] if note else []), fallback, reason, unmapped(devices, seen))


def plan(devices: list[int | str] | None, cuda_visible: str | None, environ: Mapping[str, str], mach: Machine) -> Plan:
    """The script's CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER and the devices radt watches, so that the two are always the same.

    -d (NVML indices or UUIDs) gives the script integer indices with CUDA_DEVICE_ORDER=PCI_BUS_ID
    (scripts parse integer lists) unless the user chose another CUDA_DEVICE_ORDER or a MIG slice is
    wanted: then the UUIDs, which mean the same device in any order. The CSV scheduler's
    --cuda-visible (a MIG device it created) is watched when it names a device on -d's GPUs; an MPS
    daemon's numbering cannot be resolved, so -d's GPUs are watched then. Without -d, radt watches
    what CUDA_VISIBLE_DEVICES shows the script. DeviceError for a -d entry the machine lacks.
    """
    user_order = environ.get("CUDA_DEVICE_ORDER")
    if devices is None:
        watched, notes = visible_devices(environ.get("CUDA_VISIBLE_DEVICES"), mach, user_order)
        return Plan(mach, watched, None, None, notes)
    chosen = resolve_tokens(devices, mach)
    notes: list[str] = []
    if cuda_visible is not None:
        uuids = [t.strip() for t in cuda_visible.split(",")]
        if all(t.startswith(("GPU-", "MIG-")) for t in uuids):
            seen, seen_notes = visible_devices(cuda_visible, mach, PCI_BUS_ID)
            if seen and {w.gpu.index for w in seen} <= {w.gpu.index for w in chosen}:
                return Plan(mach, seen, cuda_visible, None, seen_notes)
            notes.append(f"radt: the script's CUDA_VISIBLE_DEVICES={cuda_visible} names no device of -d here; watching -d's GPUs")
        return Plan(mach, [w._replace(cuda=None) for w in chosen], cuda_visible, None, notes)  # an MPS daemon numbers its own GPUs
    if any(w.mig for w in chosen) or user_order not in (None, PCI_BUS_ID):
        visible = ",".join((w.mig or w.gpu).uuid for w in chosen)
        return Plan(mach, [w._replace(cuda=i) for i, w in enumerate(chosen)], visible, None, notes)
    rank = {g.index: i for i, g in enumerate(cuda_order(mach.gpus, PCI_BUS_ID).gpus)}
    visible = ",".join(str(rank[w.gpu.index]) for w in chosen)
    return Plan(mach, [w._replace(cuda=i) for i, w in enumerate(chosen)], visible, PCI_BUS_ID, notes)


# --- what the run records ------------------------------------------------------------------


def entry(watched: Watched) -> dict:
    """One series of the run as the radt.gpus tag and the inventory's "watched" list record it."""
    return {
        "series": watched.series,
        "index": watched.gpu.index,
        "name": watched.gpu.name,
        "uuid": (watched.mig or watched.gpu).uuid,
        "pci_bus_id": watched.gpu.pci_bus_id,
        "mig_profile": watched.mig.profile if watched.mig else None,
        "gpu_instance": watched.mig.gpu_instance if watched.mig else None,
        "cuda": watched.cuda,
        "memory_total_mb": _mb((watched.mig or watched.gpu).memory_total_bytes),  # what the diagnosis says a MIG slice against
    }


def _mb(total_bytes: int | None) -> float | None:
    """Bytes as MLflow's megabytes (10^6 bytes), whole; None where NVML did not say."""
    return round(total_bytes / 1e6) if total_bytes else None


def with_slices(plan: Plan, found: list[tuple[int, int]]) -> list[Watched]:
    """The plan's devices and the MIG slices the run's processes were found on (of a GPU in MIG mode given whole), for radt.gpus."""
    if plan.machine is None or plan.watched is None:
        return plan.watched or []
    migs = {(m.gpu, m.gpu_instance): m for m in plan.machine.migs}
    extra = [Watched(plan.machine.gpus[gpu], migs[(gpu, gi)]) for gpu, gi in found if (gpu, gi) in migs and (gpu, gi) not in plan.slices]
    return [*plan.watched, *extra]


def series_entries(watched: list[Watched]) -> list[dict]:
    """Every series the run writes: each watched device, and the whole GPU of each slice (its power, clocks), whose `cuda` is null."""
    whole = {w.gpu.index: w for w in watched if w.mig is None}
    for w in watched:
        whole.setdefault(w.gpu.index, Watched(w.gpu))
    rows = [*whole.values(), *(w for w in watched if w.mig)]
    return [entry(w) for w in sorted(rows, key=lambda w: (w.gpu.index, -1 if w.mig is None else w.mig.gpu_instance))]


def gpus_tag(entries: list[dict]) -> str:
    """The radt.gpus tag value: compact JSON that fits MLflow's limit (names, then bus ids, then entries dropped if it must)."""
    for drop in ((), ("name",), ("name", "pci_bus_id")):
        rows = [{k: v for k, v in e.items() if k not in drop} for e in entries]
        text = json.dumps(rows, separators=(",", ":"))
        if len(text) <= TAG_CHARS:
            return text
    while rows and len(text) > TAG_CHARS:
        rows.pop()
        text = json.dumps(rows, separators=(",", ":"))
    return text
