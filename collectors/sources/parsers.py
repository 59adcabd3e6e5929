"""Parsers for the text that `dcgmi dmon`, `nvidia-smi --format=csv` and `top -b` print.

Pure functions over lines, shared by the live samplers (which feed one line at a time) and by
`radt import` (which feeds whole files). Values that read `N/A` come back as None.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, time

from radt.catalogue import MetricName

NA_VALUES = {"N/A", "[N/A]", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", "ERR!", "-"}


def _number(text: str) -> float | None:
    """A float, or None for N/A-like cells."""
    text = text.strip()
    if text in NA_VALUES or not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


# --------------------------------------------------------------------------- dcgmi dmon


@dataclass
class DmonRow:
    """One entity line of `dcgmi dmon`: values keyed by column tag (GRACT, SMACT, ...)."""

    sample: int  # 0-based sample number; a new sample starts when an entity repeats
    entity: str  # "GPU 0", "GPU-I 3", ...
    gpu: int | None  # the GPU index for "GPU n" entities
    values: dict[str, float | None]


class DmonParser:
    """Stateful line parser for `dcgmi dmon`, fed line by line (live) or from a file."""

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.sample = -1
        self._seen: set[str] = set()
        self.short_lines = 0  # data lines with fewer cells than the header names (a log cut while written): left out

    def feed(self, line: str) -> DmonRow | None:
        stripped = line.strip()
        if not stripped:
            return None
        if stripped.startswith("#"):  # header: "#Entity   GPUTL  MCUTL ..."
            parts = stripped.lstrip("#").split()
            self.tags = [p.upper() for p in parts[1:]]
            return None
        if stripped.startswith("ID") or not self.tags:  # units line ("ID   W   mJ   KB/")
            return None
        parts = stripped.split()
        if len(parts) < 2 + len(self.tags):
            self.short_lines += 1
            return None
        entity = f"{parts[0]} {parts[1]}"
        cells = parts[2 : 2 + len(self.tags)]
        if entity in self._seen or self.sample < 0:
            self.sample += 1
            self._seen = set()
        self._seen.add(entity)
        gpu = int(parts[1]) if parts[0] == "GPU" and parts[1].isdigit() else None
        return DmonRow(self.sample, entity, gpu, {tag: _number(c) for tag, c in zip(self.tags, cells)})


def parse_dcgmi_dmon(lines: Iterable[str], left_out: list[int] | None = None) -> Iterator[DmonRow]:
    """The rows of a dmon log; `left_out` (if given) receives the line numbers (from 1) of data lines too short to read."""
    parser = DmonParser()
    for number, line in enumerate(lines, 1):
        short = parser.short_lines
        row = parser.feed(line)
        if row is not None:
            yield row
        elif left_out is not None and parser.short_lines > short:
            left_out.append(number)


def dmon_error(line: str) -> str | None:
    """The error `dcgmi dmon` printed instead of data, if this line is one."""
    lowered = line.lower()
    if "error" in lowered or "not supported" in lowered or "unable to" in lowered:
        return line.strip()
    return None


# --------------------------------------------------------------------------- dcgmi discovery -c

# A GPU instance line of `dcgmi discovery -c`: "| -> I 0/1          | GPU Instance (EntityID: 100)      |"
# (NVML GPU index / GPU instance id, then the DCGM entity id, as DCGM's FormatMigHierarchy prints them);
# compute instance lines ("CI 0/1/0", older DCGM's "C ...") do not match.
_INSTANCE_LINE = re.compile(r"(?<![A-Za-z])I\s+(\d+)\s*/\s*(\d+)\s*\|\s*GPU Instance\s*\(EntityID:\s*(\d+)\s*\)")


def parse_mig_hierarchy(text: str) -> dict[tuple[int, int], int]:
    """{(NVML GPU index, GPU instance id): DCGM GPU-instance entity id} from what `dcgmi discovery -c` prints."""
    return {(int(gpu), int(gi)): int(entity) for gpu, gi, entity in _INSTANCE_LINE.findall(text)}


# --------------------------------------------------------------------------- nvidia-smi csv


@dataclass
class SmiRow:
    """One GPU line of `nvidia-smi --query-gpu=... --format=csv`."""

    sample: int
    gpu: int
    timestamp: float | None  # epoch seconds when the CSV has a timestamp column
    values: dict[str, float | None]  # numeric columns by query name ("utilization.gpu")
    text: dict[str, str]  # every column as printed, units stripped ("name", "pstate", ...)


_HEADER_UNIT = re.compile(r"\s*\[.*?\]\s*$")
_VALUE_UNIT = re.compile(r"^(-?[\d.]+)\s*(%|MiB|W|MHz|C|KiB|GiB|B)?$")
_IDENTITY_COLUMNS = ("index", "uuid", "pci.bus_id", "gpu_uuid", "gpu_bus_id")
_STABLE_COLUMNS = ("name", "gpu_name", "memory.total", "serial", "uuid", "pci.bus_id")


def _smi_value(cell: str, column: str) -> float | None:
    if column == MetricName.PSTATE:
        return float(cell[1:]) if cell.startswith("P") and cell[1:].isdigit() else None
    match = _VALUE_UNIT.match(cell)
    return float(match.group(1)) if match else None


def _smi_timestamp(cell: str) -> float | None:
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            return datetime.strptime(cell, fmt).timestamp()
        except ValueError:
            continue
    return None


def _period(keys: list[tuple]) -> int:
    """Smallest p such that keys repeat with period p (the GPU count when rows cycle)."""
    n = len(keys)
    for p in range(1, n + 1):
        if all(keys[i] == keys[i + p] for i in range(n - p)):
            return p
    return n


def parse_nvidia_smi_csv(lines: Iterable[str], gpu_count: int | None = None, left_out: list[int] | None = None) -> list[SmiRow]:
    """Rows of an nvidia-smi CSV log, each assigned its GPU and sample number.

    GPUs are identified by an `index`/`uuid`/`pci.bus_id` column when queried; else by the
    timestamp bursts of `-l`; else by the period of stable columns (name, memory.total);
    `gpu_count` overrides the guess. `left_out` (if given) receives the line numbers (from 1) of
    lines whose cells are not the header's (a last line cut while written, an error nvidia-smi printed).
    """
    columns, raw = _smi_cells(lines, left_out)
    if columns is None:
        return []
    ts_col = columns.index("timestamp") if "timestamp" in columns else None
    timestamps = [_smi_timestamp(r[ts_col]) if ts_col is not None else None for r in raw]
    ident_col = next((columns.index(c) for c in _IDENTITY_COLUMNS if c in columns), None)
    if ident_col is not None:
        gpus, samples = _smi_gpus_by_identity([r[ident_col] for r in raw], numbered=columns[ident_col] == "index")
    else:
        if gpu_count is None:
            gpu_count = _smi_gpu_count(columns, raw, timestamps)
        gpus = [i % gpu_count for i in range(len(raw))]
        samples = [i // gpu_count for i in range(len(raw))]
    return [
        SmiRow(sample, gpu, ts, {c: _smi_value(v, c) for c, v in zip(columns, r) if c != "timestamp"}, dict(zip(columns, r)))
        for r, gpu, sample, ts in zip(raw, gpus, samples, timestamps)
    ]


def _smi_cells(lines: Iterable[str], left_out: list[int] | None) -> tuple[list[str] | None, list[list[str]]]:
    """The header's column names (units stripped) and each data line's cells; a repeated header is skipped, a line of
    another width is left out (its number added to `left_out`)."""
    header: list[str] | None = None
    raw: list[list[str]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.rstrip("\n").split(",")]
        names = [_HEADER_UNIT.sub("", c).strip() for c in cells]
        if header is None:
            header = names
        elif names == header:
            continue  # nvidia-smi repeats its header when restarted into the same file
        elif len(cells) == len(header):
            raw.append(cells)
        elif left_out is not None:
            left_out.append(number)
    return header, raw


def _smi_gpus_by_identity(idents: list[str], numbered: bool) -> tuple[list[int], list[int]]:
    """Each row's GPU and sample number from its identity cell: an `index` is the GPU's number, any other identity is
    numbered in order of appearance; a sample ends where a GPU comes round again."""
    order: dict[str, int] = {}
    gpus: list[int] = []
    samples: list[int] = []
    seen: set[str] = set()
    sample = -1
    for ident in idents:
        if ident not in order:
            order[ident] = int(ident) if numbered and ident.isdigit() else len(order)
        if ident in seen or sample < 0:
            sample, seen = sample + 1, set()
        seen.add(ident)
        gpus.append(order[ident])
        samples.append(sample)
    return gpus, samples


def _smi_gpu_count(columns: list[str], raw: list[list[str]], timestamps: list[float | None]) -> int:
    """The GPU count of a log without an identity column: the first timestamp burst of `-l`, else the period of the
    stable columns, else 1."""
    if raw and all(t is not None for t in timestamps):
        # `-l` prints all GPUs within milliseconds, then sleeps: split on the gaps.
        burst = 1
        for earlier, later in zip(timestamps, timestamps[1:]):
            if later - earlier > 0.25:
                break
            burst += 1
        return burst
    stable = [i for i, c in enumerate(columns) if c in _STABLE_COLUMNS]
    return _period([tuple(r[i] for i in stable) for r in raw]) if stable else 1


# --------------------------------------------------------------------------- top -b


@dataclass
class TopProcess:
    pid: int
    user: str
    command: str
    cpu_percent: float
    mem_percent: float
    rss_bytes: float


@dataclass
class TopFrame:
    """One screen of `top -b`: summary lines and the process table."""

    clock: time
    cpu_percent: float | None = None  # 100 - idle
    mem_total_mb: float | None = None
    mem_used_mb: float | None = None
    swap_used_mb: float | None = None
    processes: list[TopProcess] = field(default_factory=list)


_TOP_HEAD = re.compile(r"^top - (\d{1,2}):(\d{2}):(\d{2})")
_TOP_CPU_N = re.compile(r"%Cpu\d+\s*:")
_UNIT_BYTES = {"KiB": 1024.0, "MiB": 1024.0**2, "GiB": 1024.0**3, "TiB": 1024.0**4, "PiB": 1024.0**5, "EiB": 1024.0**6}
_SIZE_SUFFIX = {"k": 1024.0, "m": 1024.0**2, "g": 1024.0**3, "t": 1024.0**4, "p": 1024.0**5, "e": 1024.0**6}


def _top_size(cell: str, default_unit: float) -> float:
    """RES column: plain numbers are in top's memory unit (KiB by default), or '12.2g'."""
    suffix = cell[-1:].lower()
    if suffix in _SIZE_SUFFIX:
        return float(cell[:-1]) * _SIZE_SUFFIX[suffix]
    return float(cell) * default_unit


def _top_fields(text: str) -> dict[str, float]:
    """'515637.3 total, 508028.2 free, 3349.7 used' -> {'total': ..., 'free': ..., 'used': ...}."""
    out = {}
    for part in re.split(r"[,.]\s+(?=\d)|,\s*", text):
        bits = part.strip().split()
        if len(bits) >= 2:
            try:
                out[bits[1].rstrip(".")] = float(bits[0])
            except ValueError:
                pass
    return out


def parse_top_batch(lines: Iterable[str]) -> Iterator[TopFrame]:
    frame: TopFrame | None = None
    columns: list[str] | None = None
    mem_unit = 1024.0  # bytes per unit of the summary lines; RES defaults to KiB
    busy: list[float] = []  # 100 - idle of each per-CPU line of this frame
    for line in lines:
        head = _TOP_HEAD.match(line)
        if head:
            if frame is not None:
                yield _with_cpu_mean(frame, busy)
            frame = TopFrame(time(int(head.group(1)), int(head.group(2)), int(head.group(3))))
            columns, busy = None, []
            continue
        if frame is None:
            continue
        stripped = line.strip()
        if stripped.startswith("%Cpu(s)"):
            fields = _top_fields(stripped.split(":", 1)[1])
            if "id" in fields:
                frame.cpu_percent = round(100.0 - fields["id"], 3)
        elif _TOP_CPU_N.match(stripped):  # per-CPU lines (top's '1' toggle), one or more per line
            for part in _TOP_CPU_N.split(stripped)[1:]:
                fields = _top_fields(part)
                if "id" in fields:
                    busy.append(100.0 - fields["id"])
        elif re.match(r"^[KMGTPE]iB Mem", stripped):
            mem_unit = _UNIT_BYTES[stripped[:3]]
            fields = _top_fields(stripped.split(":", 1)[1])
            scale = mem_unit / 1e6
            if "total" in fields:
                frame.mem_total_mb = fields["total"] * scale
            if "used" in fields:
                frame.mem_used_mb = fields["used"] * scale
        elif re.match(r"^[KMGTPE]iB Swap", stripped):
            fields = _top_fields(stripped.split(":", 1)[1])
            if "used" in fields:
                frame.swap_used_mb = fields["used"] * _UNIT_BYTES[stripped[:3]] / 1e6
        elif stripped.startswith("PID"):
            columns = stripped.split()
        elif columns and stripped:
            parts = stripped.split(None, len(columns) - 1)
            if len(parts) < len(columns):
                continue
            row = dict(zip(columns, parts))
            try:
                frame.processes.append(
                    TopProcess(
                        pid=int(row["PID"]),
                        user=row.get("USER", ""),
                        command=row.get("COMMAND", ""),
                        cpu_percent=float(row.get("%CPU", "0")),
                        mem_percent=float(row.get("%MEM", "0")),
                        rss_bytes=_top_size(row.get("RES", "0"), 1024.0),
                    )
                )
            except ValueError:
                continue
    if frame is not None:
        yield _with_cpu_mean(frame, busy)


def _with_cpu_mean(frame: TopFrame, busy: list[float]) -> TopFrame:
    """Without a `%Cpu(s)` summary (per-CPU display), the system CPU is the mean over the CPUs."""
    if frame.cpu_percent is None and busy:
        frame.cpu_percent = round(sum(busy) / len(busy), 3)
    return frame


# --------------------------------------------------------------------------- detection


def detect_format(head: str) -> str | None:
    """'dcgmi', 'nvidia-smi' or 'top' from the first lines of a log; None if unknown."""
    for line in head.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#Entity") or re.match(r"^GPU(-I|-CI)?\s+\d+\s", stripped):
            return "dcgmi"
        if _TOP_HEAD.match(stripped):
            return "top"
        if "," in stripped and _is_smi_header(stripped):
            return "nvidia-smi"
        return None
    return None


# nvidia-smi --query-gpu field names (`nvidia-smi --help-query-gpu`): whole names, or groups by prefix.
_SMI_FIELD = re.compile(
    r"^(?:(?:name|gpu_name|index|count|timestamp|pstate|uuid|gpu_uuid|serial|gpu_serial|gpu_bus_id|driver_version|vbios_version"
    r"|compute_mode|compute_cap|persistence_mode|display_mode|display_active|accounting\.mode)$"
    r"|(?:pci|pcie|utilization|memory|power|enforced|temperature|clocks|clocks_throttle_reasons|clocks_event_reasons|fan|ecc|encoder"
    r"|mig|retired_pages|inforom|gom|protected_memory|reset_status)\.)"
)
_SMI_CELL = re.compile(r"^[a-z][a-z0-9_.]*$")


def _is_smi_header(line: str) -> bool:
    """An nvidia-smi CSV header: every cell a query field name (units stripped), whatever the order."""
    names = [_HEADER_UNIT.sub("", c).strip() for c in line.split(",")]
    return all(_SMI_CELL.match(n) for n in names) and any(_SMI_FIELD.match(n) for n in names)
