"""`radt report`: a report per run or Slurm job that a cluster team can mail, like Princeton's jobstats but with radt's metrics.

`radt report RUN_ID...`, `--experiment NAME`, `--user U [--since 7d]`: each run's header (name, user, Slurm account and
partition, state, times, nodes), its GPUs with their activity, the host's CPU, energy, carbon, cost and idle GPU-hours with
the basis they used, the findings with what to do, and what was not judged; after several runs, a summary. Plain text by
default, Markdown with --format markdown. Read-only: a run's stored diagnosis (radt.diagnosis*, radt.footprint.*) where it
is of the current rules, else one made now (stored.diagnoses) and not kept; `radt diagnose` keeps them. The only writes
are those of every read of the evidence: the rollups of a series another writer left stale, as the dashboard builds them.
"""

from __future__ import annotations

import math
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from radt import mlflowdb
from radt.catalogue import Device, MetricName
from radt.diagnosis import ACTIONS, LABELS, VERSION, Diagnosis, Evidence, Finding, GpuEvidence, codes_of, nominal_gb, parse_spans
from radt.errors import UserError
from radt.evidence import CHUNK, gather, memory_from_share
from radt.footprint import figures_of
from radt.options import store_parent
from radt.runmodel import (
    DIAGNOSIS_LACKING_TAG,
    DIAGNOSIS_PREFIX,
    DIAGNOSIS_SPANS_TAG,
    DIAGNOSIS_TAG,
    DIAGNOSIS_VERSION_TAG,
    FOOTPRINT_PREFIX,
    HOST_TAG,
    NODE_TAG,
    SLURM_JOB_TAG,
    SLURM_PARTITION_TAG,
    SLURM_PREFIX,
    diagnosis_tag,
    node_statuses,
    node_tag,
)
from radt.settings import display_uri, is_database_uri, tracking_uri

WIDTH = 100  # a text report's lines wrap here: a mail client shows them whole
BASIS_TAG = f"{FOOTPRINT_PREFIX}basis"
COMMON = 5  # findings the summary names, the most common first
# the GPU table: column, metric, what its cell says (a ratio's mean, a percentage's mean, a peak in GB, a mean in W)
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("SMACT", MetricName.SM_ACTIVE, "ratio"),
    ("SMOCC", MetricName.SM_OCCUPANCY, "ratio"),
    ("GRACT", MetricName.GR_ENGINE_ACTIVE, "ratio"),
    ("Tensor", MetricName.TENSOR_ACTIVE, "ratio"),
    ("DRAM", MetricName.DRAM_ACTIVE, "ratio"),
    ("GPU util", MetricName.UTILIZATION_PERCENTAGE, "percent"),
    ("Memory peak", MetricName.MEMORY_USAGE_MEGABYTES, "memory"),
    ("Power", MetricName.POWER_USAGE_WATTS, "watts"),
)


class ReportError(UserError):
    """A store, selection or output `radt report` cannot use; one line naming the fix."""


# --- what a report holds -------------------------------------------------------------------------------------------------


@dataclass
class Facts:
    """A run's row, experiment and the tags a report shows (Slurm facts, host, nodes, stored diagnosis and footprint)."""

    run_id: str
    name: str
    experiment: str
    user: str
    status: str
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class RunReport:
    """One run's report: its facts, evidence, diagnosis, footprint figures and their basis, and whether it was stored."""

    facts: Facts
    evidence: Evidence
    diagnosis: Diagnosis
    figures: dict[str, float]
    basis: str
    stored: bool


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    """A titled part of a report: `label: value` pairs, a table, bullet items (with an indented second line), notes."""

    title: str
    pairs: list[tuple[str, str]] = field(default_factory=list)
    table: Table | None = None
    items: list[tuple[str, str, str]] = field(default_factory=list)  # (label, text, what to do)
    bullets: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# --- reading ------------------------------------------------------------------------------------------------------------


def _engine(uri: str) -> sa.Engine:
    """The store's engine, read-only in spirit: a server URI, a missing SQLite file or a database without MLflow's tables refused."""
    from radt.collectors.store.sqltracking import make_engine

    shown = display_uri(uri)
    if not is_database_uri(uri):
        raise ReportError(
            f"{shown} is an MLflow server; radt report reads its database: give the backend store's URI (--store postgresql://... or sqlite:///...)"
        )
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :].split("?", 1)[0]).expanduser().is_file():
        raise ReportError(f"no store at {shown}; give the SQLite file of an existing store (--store or MLFLOW_TRACKING_URI)")
    return mlflowdb.check_store(make_engine(uri), shown, ReportError)


def _wanted_tag(t) -> sa.ColumnElement[bool]:
    """The tags a report shows: Slurm facts, the host and nodes, the stored diagnosis and footprint."""
    prefixes = (SLURM_PREFIX, DIAGNOSIS_PREFIX, FOOTPRINT_PREFIX, NODE_TAG)
    return sa.or_(t.key.in_([HOST_TAG, DIAGNOSIS_TAG]), *(t.key.startswith(p, autoescape=True) for p in prefixes))


def read_facts(engine: sa.Engine, run_ids: Sequence[str]) -> dict[str, Facts]:
    """run id -> its facts, one query for the rows and one for the tags per CHUNK runs."""
    r, e, t = mlflowdb.runs.c, mlflowdb.experiments.c, mlflowdb.tags.c
    out: dict[str, Facts] = {}
    for start in range(0, len(run_ids), CHUNK):
        part = list(run_ids[start : start + CHUNK])
        rows = sa.select(r.run_uuid, r.name, r.user_id, r.status, e.name.label("experiment")).join_from(
            mlflowdb.runs, mlflowdb.experiments, e.experiment_id == r.experiment_id
        )
        with engine.connect() as conn:
            for row in conn.execute(rows.where(r.run_uuid.in_(part))):
                out[row.run_uuid] = Facts(row.run_uuid, row.name or "", row.experiment or "", row.user_id or "", row.status or "")
            for run_id, key, value in conn.execute(sa.select(t.run_uuid, t.key, t.value).where(t.run_uuid.in_(part), _wanted_tag(t))):
                if run_id in out:
                    out[run_id].tags[key] = value or ""
    return out


def stored_diagnosis(tags: Mapping[str, str]) -> Diagnosis | None:
    """The diagnosis a run keeps in its tags, where it is of the current rules; else None."""
    if tags.get(DIAGNOSIS_VERSION_TAG) != str(VERSION):
        return None
    spans = parse_spans(tags.get(DIAGNOSIS_SPANS_TAG, ""))
    findings = [Finding(code, tags.get(diagnosis_tag(code), ""), spans.get(code)) for code in codes_of(tags)]
    return Diagnosis(findings, [part for part in tags.get(DIAGNOSIS_LACKING_TAG, "").split("; ") if part])


def build(engine: sa.Engine, run_ids: Sequence[str]) -> list[RunReport]:
    """Each run's report, in the order given: stored diagnoses as they are, the others diagnosed now (nothing written)."""
    from radt.collectors.diagnose.stored import judge, measured_gains
    from radt.footprint import footprint

    facts = read_facts(engine, run_ids)
    evidence = gather(engine, run_ids)
    stored = {run_id: d for run_id in run_ids if (d := stored_diagnosis(facts[run_id].tags)) is not None}
    missing = [run_id for run_id in run_ids if run_id not in stored]
    fresh, fresh_figures = judge([{r: evidence[r] for r in missing if r in evidence}], None, measured_gains(engine, missing))  # read once
    out = []
    for run_id in run_ids:
        tags = facts[run_id].tags if run_id in stored else fresh_figures.get(run_id, {})
        if not figures_of(tags).get("gpu_hours") and run_id in evidence:  # a stored diagnosis kept without its figures
            tags = footprint(evidence[run_id]).tags()
        diagnosis = stored.get(run_id) or fresh.get(run_id) or Diagnosis()
        out.append(RunReport(facts[run_id], evidence[run_id], diagnosis, figures_of(tags), tags.get(BASIS_TAG, ""), run_id in stored))
    return out


# --- the figures a report says ----------------------------------------------------------------------------------------------


def number(value: float) -> str:
    """A figure in four significant digits, as radt.footprint.* keeps it; from 1,000 on, whole and grouped (12,345)."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def ratio(value: float) -> str:
    """A DCGM ratio as the findings write it: 0.68, and 0.002 where two decimals would say 0."""
    return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"


def clock(ms: float) -> str:
    """A moment in the reader's local time, with its offset."""
    return datetime.fromtimestamp(ms / 1000).astimezone().strftime("%Y-%m-%d %H:%M:%S %z")


def duration(seconds: float) -> str:
    """HH:MM:SS, with D- before it from a day on (as Slurm writes elapsed times)."""
    days, rest = divmod(int(round(seconds)), 86_400)
    text = time.strftime("%H:%M:%S", time.gmtime(rest))
    return f"{days}-{text}" if days else text


def _cell(gpu: GpuEvidence, metric: str, kind: str) -> str | None:
    """One GPU's cell of the table; None where the GPU has no reading of that metric."""
    if kind == "memory":
        stats = next((s for name in (MetricName.PROCESS_MEMORY_MEGABYTES, metric) if name in gpu.series and (s := gpu.series[name].stats())), None)
    else:
        stats = gpu.series[metric].stats() if metric in gpu.series else None
    if stats is None:
        return None
    return {"ratio": ratio, "percent": lambda v: f"{v:.0f}%", "watts": lambda v: f"{v:.0f} W"}.get(kind, lambda v: f"{v / 1000:.2f} GB")(
        stats.peak if kind == "memory" else stats.mean
    )


def memory_total(gpu: GpuEvidence) -> float | None:
    """A GPU's memory size (MB): the evidence's (radt.gpus, else evidence.memory_from_share, the one rule)."""
    return gpu.memory_total_mb or memory_from_share(gpu)


def memory_sizes(evidence: Evidence) -> dict[Device, float]:
    """Each GPU's memory size (MB) where known; a GPU that held nothing takes the size of another of its model in the run."""
    own = {gpu.device: total for gpu in evidence.gpus if (total := memory_total(gpu))}
    by_model: dict[str, float] = {}
    for gpu in evidence.gpus:
        if gpu.device in own and gpu.model and gpu.device.mig is None:
            by_model[gpu.model] = max(by_model.get(gpu.model, 0.0), own[gpu.device])
    for gpu in evidence.gpus:
        if gpu.device not in own and gpu.device.mig is None and gpu.model in by_model:
            own[gpu.device] = by_model[gpu.model]
    return own


def _size(gpu: GpuEvidence, sizes: Mapping[Device, float]) -> str:
    gb = nominal_gb(sizes.get(gpu.device))
    return f"{gb} GB" if gb else "-"


def gpu_table(evidence: Evidence) -> tuple[Table, list[str]]:
    """The GPU table (label, model, memory, then every recorded column) and the columns no GPU recorded."""
    sizes = memory_sizes(evidence)
    cells = [[_cell(gpu, metric, kind) for _, metric, kind in COLUMNS] for gpu in evidence.gpus]
    kept = [i for i in range(len(COLUMNS)) if any(row[i] is not None for row in cells)]
    rows = [[gpu.device.label, gpu.model or "-", _size(gpu, sizes), *(row[i] or "-" for i in kept)] for gpu, row in zip(evidence.gpus, cells)]
    missing = [COLUMNS[i][0].lower() for i in range(len(COLUMNS)) if i not in kept]
    return Table(["GPU", "Model", "Memory", *(COLUMNS[i][0] for i in kept)], rows), missing


def gpus_line(evidence: Evidence) -> str:
    """'5: 4 × NVIDIA A100-SXM4-40GB (40 GB), 1 × NVIDIA DGX Display': the GPUs by model, with their size where known."""
    if not evidence.gpus:
        return "none recorded"
    sizes = memory_sizes(evidence)
    kinds = Counter((gpu.model or "model not recorded", _size(gpu, sizes)) for gpu in evidence.gpus)
    said = [f"{count} × {model}" + (f" ({size})" if size != "-" else "") for (model, size), count in kinds.most_common()]
    return f"{len(evidence.gpus)}: {', '.join(said)}"


def host_cpu(evidence: Evidence) -> list[tuple[str, str]]:
    """The host's CPU (% of all cores) and the run's processes' (cores), mean and peak, where recorded."""
    out = []
    host = evidence.host.get(MetricName.CPU_UTILIZATION_PERCENTAGE)
    own = evidence.host.get(MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE)
    if host is not None and (stats := host.stats()):
        out.append(("Host", f"mean {stats.mean:.0f}% of all cores, peak {stats.peak:.0f}%"))
    if own is not None and (stats := own.stats()):
        out.append(("Run's processes", f"mean {stats.mean / 100:.1f} cores, peak {stats.peak / 100:.1f}"))
    return out


def nodes_of(facts: Facts) -> list[str]:
    """The nodes a run or job ran on: a Slurm job's, a multi-node run's, else its host."""
    tags = facts.tags
    if tags.get(f"{SLURM_PREFIX}nodes"):
        return tags[f"{SLURM_PREFIX}nodes"].split(",")
    nodes = sorted(node_statuses(tags))
    if nodes:
        return [tags.get(node_tag(node, "host")) or node for node in nodes]
    return [tags[HOST_TAG]] if tags.get(HOST_TAG) else []


# --- one report as sections --------------------------------------------------------------------------------------------------


def title(report: RunReport) -> str:
    """'Run NAME (ID)', or 'Job JOBID NAME (ID)' for an imported Slurm job."""
    facts = report.facts
    job = facts.tags.get(SLURM_JOB_TAG)
    return f"Job {job} {facts.name} ({facts.run_id})" if job else f"Run {facts.name} ({facts.run_id})"


def header(report: RunReport) -> Section:
    facts, tags, ev = report.facts, report.facts.tags, report.evidence
    slurm = bool(tags.get(SLURM_JOB_TAG))
    pairs = [("Experiment", facts.experiment), ("User", tags.get(f"{SLURM_PREFIX}user") or facts.user or "unknown")]
    if slurm:
        pairs += [("Account", tags.get(f"{SLURM_PREFIX}account", "")), ("Partition", tags.get(SLURM_PARTITION_TAG, ""))]
        state = tags.get(f"{SLURM_PREFIX}state") or facts.status
        exit_code = tags.get(f"{SLURM_PREFIX}exit_code")
        pairs.append(("State", f"{state} (exit code {exit_code})" if exit_code else state))
    else:
        pairs.append(("State", facts.status))
    end = clock(ev.end_ms) + (" (still running: the figures are up to now)" if facts.status == "RUNNING" else "")
    pairs += [("Start", clock(ev.start_ms)), ("End", end), ("Duration", duration((ev.end_ms - ev.start_ms) / 1000))]
    nodes = nodes_of(facts)
    pairs.append(("Nodes" if len(nodes) > 1 else "Node", ", ".join(nodes) or "not recorded"))
    pairs.append(("GPUs", gpus_line(ev)))
    if slurm and tags.get(f"{SLURM_PREFIX}gpus_requested"):
        pairs.append(("GPUs requested", tags[f"{SLURM_PREFIX}gpus_requested"]))
    return Section(title(report), pairs)


def activity(report: RunReport) -> Section:
    section = Section("GPU activity (means over the run; memory as its peak)")
    if not report.evidence.gpus:
        section.notes.append("No GPU series recorded.")
        return section
    section.table, missing = gpu_table(report.evidence)
    if missing:
        section.notes.append(f"Not recorded: {', '.join(missing)}")
    return section


def footprint_section(report: RunReport) -> Section:
    figures, gpus = report.figures, len(report.evidence.gpus)
    gpu_hours, idle = figures.get("gpu_hours", 0.0), figures.get("idle_gpu_hours")
    pairs = [("GPU-hours", f"{number(gpu_hours)} ({gpus} GPUs × {duration(report.evidence.hours * 3600)})")]
    if idle is None:
        pairs.append(("Idle GPU-hours", "not judged (no GRACT, SMACT or GPU util series)"))
    else:
        pairs.append(("Idle GPU-hours", f"{number(idle)} ({idle / gpu_hours:.0%} of the GPU-hours)" if gpu_hours else number(idle)))
    pairs += _energy_pairs(figures.get("energy_kwh"), figures.get("co2_kg"))
    pairs += [("Cost", f"{number(figures.get('cost', 0.0))} {_currency(report.basis)}"), ("Basis", report.basis or "not recorded")]
    return Section("Energy, carbon and cost", pairs)


def _energy_pairs(kwh: float | None, co2: float | None, of: str = "") -> list[tuple[str, str]]:
    if kwh is None:
        return [("Energy", "not recorded (no GPU power series)"), ("CO2eq", "not recorded")]
    return [("Energy", f"{number(kwh)} kWh of the GPUs{of}"), ("CO2eq", f"{number(co2 or 0.0)} kg")]


def _currency(basis: str) -> str:
    """The currency a basis names ('... 2 USD per GPU-hour' -> 'USD')."""
    words = basis.removesuffix(" per GPU-hour").split()
    return words[-1] if words else ""


def split_action(finding: Finding) -> tuple[str, str]:
    """A finding's sentence and its action, where the sentence ends with its code's action (as every rule writes it)."""
    action = ACTIONS.get(finding.code, "")
    if action and finding.sentence.endswith(f"; {action}"):
        return finding.sentence[: -len(action) - 2], action
    return finding.sentence, ""


def findings_section(report: RunReport) -> Section:
    how = "stored on the run" if report.stored else "diagnosed for this report, not stored: radt diagnose keeps them on the run"
    section = Section(f"Findings ({how})")
    for finding in report.diagnosis.findings:
        text, action = split_action(finding)
        section.items.append((LABELS.get(finding.code, finding.code), text, action))
    if not report.diagnosis.findings:
        section.notes.append("Nothing found.")
    return section


def sections(report: RunReport) -> list[Section]:
    """A run's report, part by part."""
    cpu = host_cpu(report.evidence)
    out = [header(report), activity(report), Section("Host CPU", cpu, notes=[] if cpu else ["Not recorded (no CPU series)."])]
    out += [footprint_section(report), findings_section(report)]
    if report.diagnosis.lacking:
        out.append(Section("Not judged (metrics the run lacks)", bullets=list(report.diagnosis.lacking)))
    return out


def most_common(reports: Sequence[RunReport]) -> str:
    """'idle gpus (12 runs), small kernels (3), ...': the findings most runs have, each run counted once per code."""
    counts = Counter(code for r in reports for code in dict.fromkeys(r.diagnosis.codes)).most_common(COMMON)
    said = [f"{LABELS.get(code, code)} ({n})" for code, n in counts]
    if counts:
        said[0] = said[0][:-1] + f" run{'s' if counts[0][1] > 1 else ''})"
    return ", ".join(said)


def summary(reports: Sequence[RunReport]) -> Section:
    """Several runs summed up: their GPU-hours, idle GPU-hours, energy, carbon, cost, and the most common findings."""
    gpu_hours = math.fsum(r.figures.get("gpu_hours", 0.0) for r in reports)
    idle = math.fsum(r.figures.get("idle_gpu_hours", 0.0) for r in reports)
    powered = [r for r in reports if "energy_kwh" in r.figures]
    kwh = math.fsum(r.figures["energy_kwh"] for r in powered) if powered else None
    co2 = math.fsum(r.figures.get("co2_kg", 0.0) for r in powered)
    bases = sorted({r.basis for r in reports if r.basis})
    pairs = [
        ("Runs", f"{len(reports)} ({sum(bool(r.diagnosis.findings) for r in reports)} with findings)"),
        ("GPU-hours", number(gpu_hours)),
        ("Idle GPU-hours", f"{number(idle)} ({idle / gpu_hours:.0%} of the GPU-hours)" if gpu_hours else number(idle)),
        *_energy_pairs(kwh, co2, f" ({len(powered)} of {len(reports)} runs with GPU power)" if powered else ""),
        ("Cost", "; ".join(f"{number(math.fsum(r.figures.get('cost', 0.0) for r in reports if r.basis == b))} {_currency(b)}" for b in bases) or "-"),
        ("Basis", " | ".join(bases) or "not recorded"),
        ("Most common findings", most_common(reports) or "none"),
    ]
    return Section(f"Summary of {len(reports)} runs", pairs)


# --- rendering ------------------------------------------------------------------------------------------------------------


def _text_table(table: Table) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(table.columns, *table.rows)]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in (table.columns, *table.rows)]


def text(parts: Sequence[Section]) -> str:
    """Sections as plain text: the first title underlined with =, the others with -, pairs aligned, sentences wrapped at WIDTH."""
    blocks = []
    for i, section in enumerate(parts):
        lines = [section.title, ("=" if i == 0 else "-") * len(section.title)]
        width = max((len(label) for label, _ in section.pairs), default=0) + 2
        lines += [f"  {(label + ':').ljust(width)}{value}" for label, value in section.pairs]
        if section.table is not None:
            lines += _text_table(section.table)
        for label, said, action in section.items:
            lines += textwrap.wrap(f"{label}: {said}", WIDTH, initial_indent="  * ", subsequent_indent="    ")
            if action:
                lines += textwrap.wrap(f"What to do: {action}", WIDTH, initial_indent="    ", subsequent_indent="    ")
        lines += [wrapped for bullet in section.bullets for wrapped in textwrap.wrap(bullet, WIDTH, initial_indent="  - ", subsequent_indent="    ")]
        lines += [f"  {note}" for note in section.notes]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _md(cell: str) -> str:
    return cell.replace("|", "\\|")


def markdown(parts: Sequence[Section]) -> str:
    """Sections as Markdown: the first a level-2 heading, the others level 3; pairs as a list, the GPUs as a table."""
    blocks = []
    for i, section in enumerate(parts):
        lines = [f"{'##' if i == 0 else '###'} {section.title}", ""]
        lines += [f"- **{label}:** {value}" for label, value in section.pairs]
        if section.table is not None:
            lines += ["| " + " | ".join(map(_md, section.table.columns)) + " |", "|" + " --- |" * len(section.table.columns)]
            lines += ["| " + " | ".join(map(_md, row)) + " |" for row in section.table.rows]
        for label, said, action in section.items:
            lines.append(f"- **{label}:** {said}" + (f"  \n  *What to do:* {action}" if action else ""))
        lines += [f"- {bullet}" for bullet in section.bullets]
        if section.notes:
            lines += ["", *section.notes] if lines[-1] else section.notes
        blocks.append("\n".join(lines).rstrip("\n"))
    return "\n\n".join(blocks) + "\n"


RENDERERS: dict[str, Callable[[Sequence[Section]], str]] = {"text": text, "markdown": markdown}
SEPARATORS = {"text": "\n" + "=" * WIDTH + "\n\n", "markdown": "\n---\n\n"}


def render(reports: Sequence[RunReport], form: str) -> str:
    """Every run's report one after another, and a summary after several."""
    render_one = RENDERERS[form]
    parts = [render_one(sections(report)) for report in reports]
    if len(reports) > 1:
        parts.append(render_one([summary(reports)]))
    return SEPARATORS[form].join(parts)


# --- the command ------------------------------------------------------------------------------------------------------------


def _check_output(path: str | None) -> Path | None:
    """--output's file, checked before anything is read: its folder must exist."""
    if path is None:
        return None
    target = Path(path).expanduser()
    if not target.parent.is_dir():
        raise ReportError(f"--output {path}: the folder {target.parent} does not exist; create it or give a file in an existing folder")
    if target.is_dir():
        raise ReportError(f"--output {path} is a folder; give a file name such as {target / 'report.txt'}")
    return target


def _nothing(args) -> str:
    """Why the selection holds no run, for the one line said instead of a report."""
    said = [f"of user '{args.user}'" if args.user else "", f"of experiment '{args.experiment}'" if args.experiment else ""]
    since = f" started within {args.since}" if args.since else ""
    return f"radt report: no runs {' '.join(filter(None, said))}{since}; widen --since or name other runs".replace("  ", " ")


def main(argv: list[str]) -> int:
    from radt.cli import OneLineParser
    from radt.collectors.diagnose.command import select_runs

    parser = OneLineParser(
        parents=[store_parent()],
        prog="radt report",
        description="A report per run or Slurm job to mail: its GPUs and their activity, the host's CPU, energy, carbon, cost, "
        "the findings with what to do, and what was not judged; a summary after several runs. Keeps nothing on the runs (radt diagnose does).",
    )
    parser.add_argument("runs", nargs="*", metavar="RUN_ID", help="these runs")
    parser.add_argument("--experiment", help="every run of this experiment")
    parser.add_argument("--user", metavar="U", help="every run of this user (MLflow's user, or an imported Slurm job's user)")
    parser.add_argument("--since", metavar="SPAN", help="only runs started within this span, e.g. 7d, 12h")
    parser.add_argument("--format", choices=sorted(RENDERERS), default="text", help="plain text (default) or Markdown")
    parser.add_argument("--output", metavar="FILE", help="write the report to FILE (default: standard output)")
    args = parser.parse_args(argv)
    if not (args.runs or args.experiment or args.user or args.since):
        raise ReportError("name what to report: RUN_ID..., --experiment NAME, --user U or --since 7d")
    target = _check_output(args.output)
    engine = _engine(tracking_uri(args.store))
    try:
        run_ids = select_runs(engine, args.runs, args.experiment, args.since, args.user)
        if not run_ids:
            print(_nothing(args), file=sys.stderr)
            return 0
        started = time.perf_counter()
        document = render(build(engine, run_ids), args.format)
    finally:
        engine.dispose()
    if target is None:
        sys.stdout.write(document)
    else:
        target.write_text(document, encoding="utf-8")
        print(f"radt report: {len(run_ids)} runs written to {target} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0
