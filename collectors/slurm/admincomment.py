"""Which GPUs a job had, from what a tool kept in its AdminComment (sacct keeps it; Slurm's accounting keeps no GPU index).

Three tools write there: radt's PrologSlurmctld (`radt-gres=NODES>GRES;...`), a site's prolog copying Slurm's own text of
each node's GPUs (`scontrol show job -d` prints `Nodes=n1 CPU_IDs=0-3 Mem=1024 GRES=gpu:2(IDX:0-1)`, src/scontrol/info_job.c;
a GRES of a type is `gpu:a100:2(IDX:0,2)`, of several `gpu:1g.10gb:1(IDX:0),gpu:3g.40gb:0(IDX:)`), and Princeton's jobstats,
whose slurmctld epilog replaces the AdminComment at the job's end with `JS1:` and its summary (JSON, gzipped, base64: per
node its CPUs, CPU time and memory, and per GPU, by the exporter's minor number, its mean utilization and memory). The
summary's figures are one per GPU and node over the whole job: radt keeps them marked as such, never as series.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from typing import NamedTuple

RADT_GRES = "AdminComment"  # Job.gpus_from: radt's prolog wrote the GPUs into the job's AdminComment
SLURM_GRES = "AdminComment (Slurm's GRES)"  # a site's prolog copied Slurm's GRES=...(IDX:...) there
JOBSTATS = "AdminComment (jobstats' summary)"  # jobstats' summary (JS1:) named the GPUs
LOOKED_FOR = "neither radt-gres=, GRES=...(IDX:...) nor a jobstats summary (JS1:)"

# one GRES with its indices: name, type (optional), count, IDX (Slurm's bit_fmt: 0-1,3); after GRES=, gres/, a comma or alone
_ITEM = re.compile(r"(?<![\w.-])(?P<name>[a-z]\w*)(?::(?P<type>[^\s:(),;=]+))?:(?P<count>\d+)\(idx:(?P<idx>[0-9,\-]*)\)", re.IGNORECASE)
_NODES = re.compile(r"(?<![\w.-])nodes=(?P<nodes>[^\s;]+)", re.IGNORECASE)
_RADT = re.compile(r"radt-gres=(\S*)")
_JS1 = re.compile(r"(?<!\S)(JS1):(\S*)", re.IGNORECASE)
_INFLATED_MAX = 1 << 24  # a summary is a few kB; a payload inflating past this is not one
_MOST_INDEX = 4096  # a GRES index at or past this is no node's (a node has tens of GPUs and MIG slices)


class GpuFigures(NamedTuple):
    """One GPU's figures over the whole job as jobstats summarised them (None where its summary has none)."""

    utilization_pct: float | None  # the GPU's mean utilization over the job (jobstats: avg_over_time of its duty cycle)
    memory_used_bytes: float | None  # the most memory the job held on it
    memory_total_bytes: float | None


class NodeFigures(NamedTuple):
    """One node's figures over the whole job as jobstats summarised them."""

    cpus: float | None  # the CPUs the job had there
    cpu_seconds: float | None  # the CPU time its processes used there
    memory_used_bytes: float | None  # the most memory they held
    memory_total_bytes: float | None  # the memory the job was given there
    gpus: dict[int, GpuFigures]  # by the exporter's minor number, which radt takes as the GPU's index


class Summary(NamedTuple):
    """jobstats' summary of a job: its run time and each node's figures, by Slurm's node name where one matches."""

    seconds: float | None  # the run time jobstats summarised (its total_time: end - start)
    nodes: dict[str, NodeFigures]

    def cpu_utilization_pct(self, node: str) -> float | None:
        """The share of the node's CPUs the job used over its run time, as jobstats reports it; None where it cannot say."""
        figures = self.nodes[node]
        if not (self.seconds and figures.cpus and figures.cpu_seconds is not None):
            return None
        return round(100 * figures.cpu_seconds / (self.seconds * figures.cpus), 1)


class Read(NamedTuple):
    """What an AdminComment says: node -> GPU indices (None: none known) and which tool said it, jobstats' summary where it
    holds one, and where it gives no GPU, what it was looked for and what it held."""

    gpus: dict[str, tuple[int, ...]] | None
    source: str
    summary: Summary | None
    note: str


def hostlist(text: str) -> tuple[str, ...]:
    """Slurm's hostlist: 'gpu[01-03,07],login1' -> ('gpu01', 'gpu02', 'gpu03', 'gpu07', 'login1'); ValueError where it is none."""
    hosts: list[str] = []
    for prefix, ranges, suffix, plain in re.findall(r"([^,\[]*)\[([^\]]*)\]([^,]*)|([^,\[\]]+)", text):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValueError(f"node list '{text}' is not a Slurm hostlist radt can read")
            for n in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{n:0{len(lo)}d}{suffix}")
    return tuple(h for h in hosts if h and h != "None")


def _range(text: str) -> set[int]:
    """Slurm's index list: '0-1,3' -> {0, 1, 3}; a part that is no index or range of them below _MOST_INDEX is left out."""
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, dash, hi = part.partition("-")
        last = hi if dash else lo
        if lo.isdigit() and last.isdigit() and int(last) < _MOST_INDEX:
            found.update(range(int(lo), int(last) + 1))
    return found


def gpu_indices(text: str) -> tuple[int, ...]:
    """The GPU indices of Slurm's GRES text: 'gpu:2(IDX:0-1),gpu:1g.10gb:1(IDX:3)' -> (0, 1, 3); another GRES's
    ('nic:1(IDX:0)') are none; '' or 'gpu:0(IDX:)' -> ()."""
    if "(idx:" not in text.lower():
        return ()
    found: set[int] = set()
    for item in _ITEM.finditer(text):
        if item.group("name").lower() == "gpu":
            found |= _range(item.group("idx"))
    return tuple(sorted(found))


def radt_gres(comment: str) -> dict[str, tuple[int, ...]] | None:
    """node -> GPU indices from radt's `radt-gres=NODES>GRES;...`; None where the comment holds none."""
    match = _RADT.search(comment or "")
    if not match:
        return None
    out: dict[str, tuple[int, ...]] = {}
    for entry in filter(None, match.group(1).split(";")):
        nodes, _, gres = entry.partition(">")
        for node in hostlist(nodes):
            out[node] = tuple(sorted(set(out.get(node, ())) | set(gpu_indices(gres))))
    return out


def slurm_gres(comment: str, nodes: tuple[str, ...]) -> tuple[dict[str, tuple[int, ...]] | None, str]:
    """node -> GPU indices from Slurm's own GRES text (each GRES for the `Nodes=` before it; without one, for the job's one
    node), and why none where it holds some but they cannot be placed; (None, '') where it holds none."""
    if "(idx:" not in comment.lower():  # no GRES with indices: not worth a scan (a jobstats summary is kilobytes of base64)
        return None, ""
    marks = [(m.start(), m.group("nodes")) for m in _NODES.finditer(comment)]
    named: dict[str, set[int]] = {}
    unnamed: set[int] = set()
    seen = False
    for item in _ITEM.finditer(comment):
        if item.group("name").lower() != "gpu":
            continue
        seen = True
        before = [text for at, text in marks if at < item.start()]
        if not before:
            unnamed |= _range(item.group("idx"))
            continue
        try:
            for node in hostlist(before[-1]):
                named.setdefault(node, set()).update(_range(item.group("idx")))
        except ValueError as exc:
            return None, f"the job's AdminComment holds Slurm's GRES, but {exc}"
    if not seen:
        return None, ""
    if named:
        return {node: tuple(sorted(found)) for node, found in named.items()}, ""
    if len(nodes) == 1:
        return {nodes[0]: tuple(sorted(unnamed))}, ""
    ran = f"the job ran on {len(nodes)} nodes ({','.join(nodes)})" if nodes else "the job has no node"
    return None, f"the job's AdminComment holds Slurm's GRES=...(IDX:...) but names no node (Nodes=) and {ran}: which node had which GPU is not known"


def _number(value: object) -> float | None:
    """A figure of the summary as it is (int or float); None for anything else."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _inflate(raw: bytes) -> bytes:
    """gzip (what jobstats writes) or zlib data, inflated; ValueError past _INFLATED_MAX."""
    inflater = zlib.decompressobj(47)  # 32 + 15: either header
    out = inflater.decompress(raw, _INFLATED_MAX)
    if inflater.unconsumed_tail:
        raise ValueError(f"it inflates past {_INFLATED_MAX >> 20} MiB")
    return out


def _slurm_node(name: str, nodes: tuple[str, ...]) -> str | None:
    """Slurm's name of the node jobstats names by its exporter's host (maybe a full domain name); None where none matches."""
    if name in nodes or not nodes:
        return name
    short = name.split(".")[0]
    matches = [node for node in nodes if node.split(".")[0] == short]
    return matches[0] if len(matches) == 1 else None


def _node_figures(entry: dict) -> NodeFigures:
    """One node's entry of the summary (jobstats.py's sp_node[node]) as figures."""
    keyed = [entry.get(key) if isinstance(entry.get(key), dict) else {} for key in ("gpu_utilization", "gpu_used_memory", "gpu_total_memory")]
    minors = sorted({int(k) for figures in keyed for k in figures if str(k).isdigit()})
    gpus = {g: GpuFigures(*(_number(figures.get(str(g))) for figures in keyed)) for g in minors}
    return NodeFigures(
        _number(entry.get("cpus")), _number(entry.get("total_time")), _number(entry.get("used_memory")), _number(entry.get("total_memory")), gpus
    )


def jobstats(comment: str, nodes: tuple[str, ...]) -> tuple[Summary | None, str]:
    """jobstats' summary in the comment (JS1:) with its nodes named as Slurm names them, or why there is none; (None, '')
    where the comment holds no JS1:."""
    match = _JS1.search(comment)
    if not match:
        return None, ""
    prefix, payload = match.groups()
    if payload.lower() in ("short", "none"):
        why = "the job ran too short for one" if payload.lower() == "short" else "Prometheus held no data of the job then"
        return None, f"the job's AdminComment holds jobstats' {prefix}:{payload}: jobstats kept no summary ({why})"
    if prefix == "js1":
        return None, (
            f"the job's AdminComment holds jobstats' summary in lower case ({_excerpt(match.group(0), 16)}), which no one can read: "
            "sacctmgr before Slurm 23.02 lowercases the AdminComment it stores (SchedMD bug 14338); jobstats' summaries need Slurm 23.02 or later"
        )
    try:
        data = json.loads(_inflate(base64.b64decode(payload, validate=True)))
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), dict):
            raise ValueError("its JSON has no 'nodes'")
    except (ValueError, zlib.error) as exc:
        return None, f"the job's AdminComment holds jobstats' JS1: but its summary cannot be read (base64 of gzipped JSON expected: {exc})"
    figures: dict[str, NodeFigures] = {}
    strangers = []
    for name, entry in data["nodes"].items():
        if not isinstance(entry, dict):
            continue
        node = _slurm_node(str(name), nodes)
        if node is None:
            strangers.append(str(name))
            node = str(name)
        figures[node] = _node_figures(entry)
    note = f"jobstats' summary names node {', '.join(strangers)}, which is none of the job's ({','.join(nodes)})" if strangers else ""
    return Summary(_number(data.get("total_time")), figures), note


def _excerpt(comment: str, most: int = 60) -> str:
    """The comment on one line, cut to `most` characters: what the messages quote of it."""
    text = " ".join(comment.split())
    return text if len(text) <= most else f"{text[: most - 1]}…"


def read(comment: str | None, nodes: tuple[str, ...]) -> Read:
    """What the job's AdminComment says of its GPUs (`nodes`: the job's, as Slurm lists them), in this order: radt's
    radt-gres=, Slurm's GRES=...(IDX:...), jobstats' summary; its summary in any case; what it held where none answered."""
    comment = comment or ""
    summary, summary_note = jobstats(comment, nodes)
    try:
        own = radt_gres(comment)
    except ValueError as exc:
        return Read(None, "", summary, f"the job's AdminComment holds radt-gres=, but {exc}")
    if own and any(own.values()):
        return Read(own, RADT_GRES, summary, "")
    gres, gres_note = slurm_gres(comment, nodes)
    if gres and any(gres.values()):
        return Read(gres, SLURM_GRES, summary, "")
    if summary is not None:
        named = {node: tuple(sorted(f.gpus)) for node, f in summary.nodes.items() if f.gpus and (node in nodes or not nodes)}
        if named:
            return Read(named, JOBSTATS, summary, "")
        return Read(None, "", summary, gres_note or summary_note or "the job's AdminComment holds jobstats' summary, which names no GPU")
    if not comment.strip():
        note = "the job's AdminComment is empty"
    else:
        note = gres_note or summary_note or f"the job's AdminComment holds {LOOKED_FOR} ('{_excerpt(comment)}')"
    return Read(None, "", summary, note)
