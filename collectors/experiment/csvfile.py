"""radT's experiment CSV: read it, check every row before anything starts, write statuses back.

One row is one run; rows with the same Experiment and Workload run together. The file is
rewritten in place (temporary file, fsync, rename) with only the Status and Run cells changed,
so extra columns and the other cells survive (padding before a value is read as radT did, with
pandas' skipinitialspace, and not written back).
"""

from __future__ import annotations

import codecs
import csv
import io
import os
import shlex
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from radt.collectors._common import UsageError, check_name
from radt.collectors.experiment.collocation import CollocationError, MigProfile, placement_note
from radt.collectors.experiment.migplacement import MigLayout, Slot, fewest_dropped, memory_size, place, smaller_swap, why_not
from radt.collectors.run.command import build_command
from radt.collectors.sources.listeners import ListenerError, parse_listeners, parse_profiler
from radt.collocation import SHARED, Mode, from_key, parse_cell
from radt.errors import UserError
from radt.runmodel import run_letter

COLUMNS = ("Experiment", "Workload", "Status", "Run", "Devices", "Collocation", "File", "Listeners", "Params")
REQUIRED = ("Experiment", "Workload", "File")
EXTRA_COLUMNS = ("SlurmJob",)  # written by radt where a run needs it (--slurm: the workload's Slurm job id), read back like the others
WRITTEN = ("Status", "Run", "SlurmJob")  # the cells radt writes into the file; every other cell is the user's
DEFAULT_LISTENERS = "smi+top"  # radT's default, minus dcgmi, which needs a running nv-hostengine


class CsvError(UserError, ValueError):
    """The file or one of its cells cannot be used (unreadable, no header, a bad Devices or Collocation); the message says what to do."""


@dataclass
class Row:
    line: int  # line in the file, the header being line 1: what an editor or a spreadsheet shows
    cells: list[str]


@dataclass
class ExperimentFile:
    path: Path
    header: list[str]
    rows: list[Row]
    newline: str = "\n"
    index: dict[str, int] = field(default_factory=dict)
    bom: bool = False  # a spreadsheet's "CSV UTF-8" starts with one; written back, so the spreadsheet reads it as UTF-8 again
    unwritten: dict[int, Row] = field(default_factory=dict)  # rows whose Status or Run changed since the last save that worked
    refused: str = ""  # why the last save_or_say failed ("" when it worked)
    own_columns: dict[int, set[str]] = field(default_factory=dict)  # line when read -> the columns this radt wrote in that row
    unplaced: dict[int, Row] = field(default_factory=dict)  # of those, the ones the file on disk no longer holds as read
    known: bytes = b""  # the file's bytes as radt last read or wrote them
    edited: bool = False  # the file changed on disk since radt read it

    @classmethod
    def load(cls, path: Path) -> ExperimentFile:
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise CsvError(f"experiment file '{path}' not found; pass the path to your experiment CSV") from exc
        except OSError as exc:
            raise CsvError(f"cannot read '{path}' ({exc}); save it as a UTF-8 CSV") from exc
        return cls.parse(path, data)

    @classmethod
    def parse(cls, path: Path, data: bytes) -> ExperimentFile:
        """The experiment in `data`, the bytes of `path`; CsvError saying which row is wrong and how to mend it."""
        try:
            raw = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise CsvError(f"cannot read '{path}' ({exc}); save it as a UTF-8 CSV") from exc
        newline = "\r\n" if "\r\n" in raw else "\n"
        text = raw.replace("\r\n", "\n")
        if "\x00" in text:  # Popen refuses it once the workload's parent run exists: refuse it here, before anything starts
            raise CsvError(f"{path.name} row {text.count(chr(10), 0, text.index(chr(0))) + 1}: a NUL byte in a cell; save the file as a UTF-8 CSV without it")
        records = _records(path, text)
        if not records or not any(c.strip() for c in records[0][1]):
            raise CsvError(f"'{path}' has no header line; start it with {','.join(COLUMNS)}")
        header = records[0][1]
        index: dict[str, int] = {}
        for position, name in enumerate(header):
            canonical = next((c for c in COLUMNS + EXTRA_COLUMNS if c.lower() == name.strip().lower()), None)
            if canonical in index:  # which of the two a row means cannot be told
                raise CsvError(f"'{path}' line 1: column {canonical} appears twice (columns {index[canonical] + 1} and {position + 1}); keep one")
            if canonical:
                index[canonical] = position
        missing = [c for c in REQUIRED if c not in index]
        separator = next((s for s in (";", "\t") if len(header) == 1 and s in header[0]), None)
        if missing and separator:  # a spreadsheet's regional setting (";") or a tab-separated export
            shown = "a tab" if separator == "\t" else f"'{separator}'"
            raise CsvError(
                f"'{path}' line 1 is separated by {shown}, not commas; save it as a comma-separated CSV (a spreadsheet's \"CSV UTF-8 (comma delimited)\")"
            )
        if missing:
            raise CsvError(
                f"'{path}' line 1: no column {', '.join(missing)}; the header needs {','.join(COLUMNS)} (Status, Run, Devices, Collocation, Listeners, Params may be left out)"
            )
        rows = [Row(line, list(cells)) for line, cells in records[1:] if any(c.strip() for c in cells)]  # blank lines skipped
        if not rows:
            raise CsvError(f"'{path}' has a header but no rows; add one row per run, e.g. exp1,1,,,0,-,train.py,smi+top,--epochs 3")
        return cls(path, header, rows, newline, index, data.startswith(codecs.BOM_UTF8), known=data)

    def get(self, row: Row, column: str) -> str:
        position = self.index.get(column)
        if position is None or position >= len(row.cells):
            return ""
        return row.cells[position].strip()

    def set(self, row: Row, column: str, value: str) -> None:
        if column not in self.index:  # a file without Status/Run gets them at the end
            self.index[column] = len(self.header)
            self.header.append(column)
        position = self.index[column]
        row.cells.extend([""] * (position + 1 - len(row.cells)))
        row.cells[position] = value
        self.unwritten[row.line] = row
        self.own_columns.setdefault(row.line, set()).add(column)

    def save(self) -> None:
        """Write this radt's statuses into the file as it is on disk now, atomically: a crash leaves either the old file or
        the new one, never half of one. Rows the user added or changed since radt read it are kept as they are (a long
        experiment's CSV is edited while it runs); each row radt ran gets its cells where it is now. A symlink's target
        is the file rewritten (the link stays a link), with the file's permission bits (a group's shared CSV stays shared)."""
        target = self.path.resolve()
        current = target.read_bytes()
        disk = ExperimentFile.parse(self.path, current)
        self.edited = self.edited or current != self.known
        self.unplaced = disk.take(self)
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator=disk.newline)
        writer.writerow(disk.header)
        for row in sorted({r.line: r for r in disk.rows}.values(), key=lambda r: r.line):
            writer.writerow(row.cells)
        data = buffer.getvalue().encode("utf-8")
        data = codecs.BOM_UTF8 + data if disk.bom else data
        tmp = target.with_name(f".{target.name}.radt-tmp")
        try:
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                os.fchmod(out.fileno(), stat.S_IMODE(os.stat(target).st_mode))
                os.fsync(out.fileno())
            os.replace(tmp, target)
        finally:  # a write that failed (a full disk) leaves the old file whole and no temporary one beside it
            tmp.unlink(missing_ok=True)
        self.known = data
        self.unwritten.clear()

    def take(self, mine: ExperimentFile) -> dict[int, Row]:
        """Put the cells `mine` wrote (Status, Run, SlurmJob) into this file's rows that are the same rows: the n-th row of
        its kind (its cells but radt's) where the file holds as many of that kind as `mine`, else the row on its own line
        if that is still of its kind; the rows of `mine` with no match (edited or removed since read) are returned."""
        theirs: dict[tuple, list[Row]] = {}
        for row in self.rows:
            theirs.setdefault(self.identity(row), []).append(row)
        ours: dict[tuple, list[Row]] = {}
        for row in mine.rows:
            ours.setdefault(mine.identity(row), []).append(row)
        by_line = {r.line: r for r in self.rows}
        unplaced: dict[int, Row] = {}
        for row in (r for r in mine.rows if r.line in mine.own_columns):
            line, kind = row.line, mine.identity(row)
            same_line = by_line.get(line)
            if len(theirs.get(kind, [])) == len(ours[kind]):  # as many rows of its kind as read: the n-th is the n-th
                match = theirs[kind][ours[kind].index(row)]
            elif same_line is not None and self.identity(same_line) == kind:  # one of its kind added or removed: its own line
                match = same_line
            else:
                unplaced[line] = row
                continue
            for column in sorted(mine.own_columns[line], key=WRITTEN.index):
                self.set(match, column, mine.get(row, column))
        return unplaced

    def identity(self, row: Row) -> tuple:
        """A row as the user wrote it: each cell but those radt writes, by column name (a reordered header still matches)."""
        written = {c.lower() for c in WRITTEN}
        names = [h.strip().lower() for h in self.header]
        return tuple(sorted((names[i] if i < len(names) else f"#{i}", cell.strip()) for i, cell in enumerate(row.cells)
                            if cell.strip() and (i >= len(names) or names[i] not in written)))  # fmt: skip

    def save_or_say(self, report: Callable[[str], None]) -> bool:
        """save(), where a disk that refuses it (full, read-only, gone) or a file that no longer reads as an experiment is
        one line, not an exception: the CSV is the experiment's ledger, no training stops for it, and the statuses it
        lacks go with the next save that works."""
        was_edited = self.edited
        try:
            self.save()
        except (OSError, CsvError) as exc:
            reason = (exc.strerror or str(exc)) if isinstance(exc, OSError) else f"it no longer reads as an experiment: {exc}"
            if not self.refused:  # once per spell of refusals, not at every status
                report(f"radt: cannot write the statuses to {self.path} ({reason}); the runs go on, and the next status written brings them")
            self.refused = reason
            return False
        if self.refused:
            report(f"radt: {self.path} took the statuses it lacked; it is up to date again")
        self.refused = ""
        if self.edited and not was_edited:
            report(f"radt: {self.path} changed on disk since radt read it; radt writes its statuses into it as it is now and keeps your "
                   f"edits (rows you added or changed run with the next 'radt {self.path}')")  # fmt: skip
        return True

    def notes(self) -> list[str]:
        """What the CSV still lacks of this radt's statuses, and why: the last lines of a run (empty when it holds them all)."""
        out = []
        if self.unwritten:
            out.append(f"radt: {self.path} lacks what radt wrote of {self._cells(self.unwritten)} ({self.refused or 'not written'}); "
                       f"write these into it, or the next 'radt {self.path}' runs those rows again")  # fmt: skip
        placed_later = {line: row for line, row in self.unplaced.items() if line not in self.unwritten}
        if placed_later:
            out.append(f"radt: {self.path} no longer holds {self._rows(placed_later)} as radt read it (edited or removed), so its status "
                       f"{self._cells(placed_later, with_line=False)} is not written into it; the run is in the store")  # fmt: skip
        return out

    def say_notes(self, report: Callable[[str], None]) -> bool:
        """notes() said as a run's last lines; True where the disk refused statuses (the command then exits 1 at least)."""
        for note in self.notes():
            report(note)
        return bool(self.unwritten)

    def _rows(self, rows: dict[int, Row]) -> str:
        lines = sorted(rows)
        return f"row {lines[0]}" if len(lines) == 1 else "rows " + ", ".join(str(n) for n in lines)

    def _cells(self, rows: dict[int, Row], with_line: bool = True) -> str:
        columns = [c for c in WRITTEN if c in self.index]
        return ", ".join(
            (f"row {row.line} " if with_line else "") + "(" + ", ".join(f"{c} {self.get(row, c)}" for c in columns if self.get(row, c)) + ")"
            for row in sorted(rows.values(), key=lambda r: r.line)
        )


def _records(path: Path, text: str) -> list[tuple[int, list[str]]]:
    """(line, cells) of each CSV record, padding before a value skipped as radT's pandas did.

    A row is one line: a quote that is never closed would swallow the rows after it (and the
    statuses written back would drop them), so it is refused, as is a line break inside quotes
    and a cell over the csv module's limit (an unclosed quote in a long file)."""
    lines = text.split("\n")
    reader = csv.reader(io.StringIO(text), skipinitialspace=True)
    records, first = [], 1
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return records
        except csv.Error as exc:
            if "field larger than field limit" in str(exc):
                raise CsvError(
                    f"{path.name} row {first}: a cell runs past {csv.field_size_limit()} characters, the most a CSV cell may hold; "
                    'close the quote (") opened on this row, or shorten the cell'
                ) from exc
            raise CsvError(f"{path.name} row {first}: {exc}; fix the row") from exc
        last = reader.line_num
        if _unclosed("\n".join(lines[first - 1 : last])):
            swallowed = f", so rows {first + 1} to {last} are read as part of it" if last > first else ""
            raise CsvError(f'{path.name} row {first}: a quote (") opened on this row is not closed{swallowed}; close the quote')
        if last > first:
            raise CsvError(
                f"{path.name} row {first}: a quoted cell runs over lines {first} to {last}; a row is one line: remove the line break inside the quotes"
            )
        records.append((first, cells))
        first = last + 1


def _unclosed(record: str) -> bool:
    """The record's text ends inside a quoted cell (the lenient reader took the rest of the file into it)."""
    try:
        list(csv.reader(io.StringIO(record + "\n"), skipinitialspace=True, strict=True))
    except csv.Error as exc:
        return "unexpected end of data" in str(exc)
    return False


@dataclass
class PlannedRun:
    row: Row
    letter: str
    devices: list[int] | None
    collocation: str  # "-", "mps" or a MIG profile
    file: str
    params: list[str]
    listeners: str
    sources: list[str]
    profiler: str | None
    mig_slot: Slot | None = None  # the memory slices of its MIG slice, as the plan placed it (None: the driver places it)

    @property
    def mode(self) -> Mode:
        """The collocation's mode: nothing set up, MPS or MIG."""
        return from_key(self.collocation).mode

    @property
    def mig(self) -> bool:
        """The collocation is a MIG profile (not '-' or MPS)."""
        return self.mode is Mode.MIG


@dataclass
class Workload:
    experiment: str
    name: str
    runs: list[PlannedRun]
    statuses: list[str]
    notes: list[str] = field(default_factory=list)  # what the plan could not check as usual, for --dry-run (MIG placements' source)

    @property
    def label(self) -> str:
        return f"{self.experiment}/{self.name}"

    @property
    def mps_devices(self) -> list[int]:
        """The GPUs the workload's MPS runs use: one MPS daemon serves them all."""
        return sorted({d for r in self.runs if r.mode is Mode.MPS for d in r.devices or []})

    def state(self) -> str:
        """'finished' (every run FINISHED), 'failed' (all ended, one FAILED), else 'todo'."""
        words = [s.split()[0].upper() if s.split() else "" for s in self.statuses]
        if all(w == "FINISHED" for w in words):
            return "finished"
        if all(w in ("FINISHED", "FAILED") for w in words):
            return "failed"
        return "todo"


@dataclass
class Machine:
    """What the checks ask of this machine; tests and --dry-run use the real one, fakes sit below it."""

    gpu_count: Callable[[], int | None]
    mig_profiles: Callable[[int], dict[str, MigProfile]]
    has: Callable[[str], bool]
    gpu_uuids: Callable[[], list[str] | None] = lambda: None  # GPU UUIDs by NVML index (None: NVML unavailable)
    # a MIG GPU's placements and instances (None: slices are not created here, e.g. Slurm's, so none are placed)
    mig_layout: Callable[[int, dict[str, MigProfile]], MigLayout] | None = None


def real_machine() -> Machine:
    import shutil

    from radt.collectors.experiment.collocation import mig_layout, mig_profiles, smi_gpu_count

    def count() -> int | None:
        from radt.collectors.sources.nvml import gpu_count

        found = gpu_count()
        return found if found is not None else smi_gpu_count()

    def uuids() -> list[str] | None:
        from radt.collectors.sources.gpus import NvmlUnavailable, machine

        try:
            return [g.uuid for g in machine().gpus]
        except NvmlUnavailable:
            return None

    return Machine(count, mig_profiles, lambda exe: shutil.which(exe) is not None, uuids, mig_layout)


def parse_devices_cell(text: str) -> list[int | str] | None:
    """'0' or '1+2' -> GPU indices (nvidia-smi's); GPU UUIDs (or unique prefixes) kept as text, resolved by `plan`; '-' or empty -> None."""
    if text in ("", "-"):
        return None
    parts = [p.strip() for p in text.replace(",", "+").split("+")]
    if not all(p.isdigit() or (p.startswith("GPU-") and len(p) > 4) for p in parts):
        raise CsvError(f"Devices '{text}' is not a GPU index list; write 0, 1+2, a GPU UUID (GPU-...), or - for no GPU")
    return sorted({int(p) for p in parts if p.isdigit()}) + list(dict.fromkeys(p for p in parts if not p.isdigit()))


def resolve_uuids(devices: list[int | str], uuids: list[str] | None) -> list[int]:
    """Devices with their GPU UUIDs as NVML indices (what MPS, MIG set-up and -d take); ValueError names one this machine lacks."""
    indices = {d for d in devices if isinstance(d, int)}
    for token in (d for d in devices if isinstance(d, str)):
        if uuids is None:
            raise CsvError(f"Devices {token}: NVML is unavailable here, so the UUID cannot be matched to a GPU; write nvidia-smi's index instead")
        found = [i for i, u in enumerate(uuids) if u.lower().startswith(token.lower())]
        if len(found) != 1:
            raise CsvError(f"Devices {token} is {'no GPU' if not found else 'more than one GPU'} of this machine (nvidia-smi -L lists them); fix Devices")
        indices.add(found[0])
    return sorted(indices)


def collocation_label(collocation: str) -> str:
    """As users write it: MPS, a MIG profile, or -."""
    return from_key(collocation).cell


def parse_collocation(text: str) -> str:
    """'-'/'' -> '-'; 'mps' in any case -> 'mps'; a MIG profile such as '3g.20gb' as it is."""
    found = parse_cell(text)
    if found is not None:
        return found.key
    raise CsvError(f"Collocation '{text}' is not -, MPS or a MIG profile such as 1g.10gb or 3g.40gb")


def plan(exp: ExperimentFile, machine: Machine, *, rerun: bool = False) -> tuple[list[Workload], list[str]]:
    """Every workload in file order, and every problem found (each one line: file, row, problem, fix)."""
    problems: list[str] = []
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in exp.rows:
        groups.setdefault((exp.get(row, "Experiment"), exp.get(row, "Workload")), []).append(row)
    facts = _MachineFacts(machine)
    workloads = []
    for (experiment, name), rows in groups.items():
        workload = Workload(experiment, name, [], [exp.get(r, "Status") for r in rows])
        will_run = workload.state() == "todo" or (rerun and workload.state() == "failed")
        mig_wanted: dict[tuple[int, str], list[Row]] = {}
        mig_runs: dict[int, list[PlannedRun]] = {}
        sharing: dict[int, set[Mode]] = {}
        for number, row in enumerate(rows):
            where = f"{exp.path.name} row {row.line}"
            before = len(problems)

            def problem(text: str, where=where) -> None:
                problems.append(f"{where}: {text}")

            planned = _planned_run(exp, row, number, experiment, name, problem)
            workload.runs.append(planned)
            if not will_run or len(problems) > before:
                continue
            devices = _check_on_machine(planned, exp.path.resolve().parent, facts, problem)  # only for workloads that will run
            for d in devices or ():
                sharing.setdefault(d, set()).add(planned.mode)
            if planned.mig and devices:
                mig_wanted.setdefault((devices[0], planned.collocation), []).append(row)
                mig_runs.setdefault(devices[0], []).append(planned)
        for gpu, kinds in sharing.items():
            if {Mode.MIG, Mode.MPS} <= kinds:
                rows_text = ", ".join(str(r.line) for r in rows)
                problems.append(f"{exp.path.name} rows {rows_text}: workload {name} mixes MPS and MIG on GPU {gpu}; give each its own workload or GPU")
        refused = set()
        for (gpu, profile), wanting in mig_wanted.items():
            found = _mig_problem(facts.mig_profiles(gpu), gpu, profile, len(wanting), name)
            if found:
                problems.append(f"{exp.path.name} row {wanting[0].line}: {found}")
                refused.add(gpu)
        for gpu, runs in mig_runs.items():
            found = None if gpu in refused else _place_slices(facts, gpu, runs, workload)
            if found:
                problems.append(f"{exp.path.name} {_rows_text([r.row for r in runs])}: {found}")
        workloads.append(workload)
    return workloads, problems


class _MachineFacts:
    """What plan() asks the machine, each asked once and only when a row needs it (NVML and nvidia-smi are slow to start)."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self._gpus: int | None | str = "unknown"
        self._uuids: list[str] | None | str = "unknown"
        self._profiles: dict[int, dict[str, MigProfile] | str] = {}
        self._layouts: dict[int, MigLayout | str] = {}

    def gpu_count(self) -> int | None:
        if self._gpus == "unknown":
            self._gpus = self.machine.gpu_count()
        return self._gpus

    def gpu_uuids(self) -> list[str] | None:
        if self._uuids == "unknown":
            self._uuids = self.machine.gpu_uuids()
        return self._uuids

    def mig_profiles(self, gpu: int) -> dict[str, MigProfile] | str:
        """The GPU's MIG profiles, or the one line saying why they cannot be read."""
        if gpu not in self._profiles:
            try:
                self._profiles[gpu] = self.machine.mig_profiles(gpu)
            except CollocationError as exc:
                self._profiles[gpu] = str(exc)
        return self._profiles[gpu]

    def mig_layout(self, gpu: int) -> MigLayout | str | None:
        """The GPU's MIG placements and instances, the one line saying why they cannot be read, or None: none are placed here."""
        offered = self.mig_profiles(gpu)
        if self.machine.mig_layout is None or isinstance(offered, str):
            return None
        if gpu not in self._layouts:
            try:
                self._layouts[gpu] = self.machine.mig_layout(gpu, offered)
            except CollocationError as exc:
                self._layouts[gpu] = str(exc)
        return self._layouts[gpu]


def _planned_run(exp: ExperimentFile, row: Row, number: int, experiment: str, name: str, problem: Callable[[str], None]) -> PlannedRun:
    """A row's run as the file gives it; each cell that cannot be used is one problem (and a harmless stand-in)."""
    if not experiment:
        problem("Experiment is empty; give an MLflow experiment id or name")
    if not name:
        problem("Workload is empty; give the workload's number or name (rows with the same one run together)")
    for kind, column, value in (("experiment", "Experiment", experiment), ("workload", "Workload", name)):
        if not value:
            continue  # said above, in the file's own words
        try:
            check_name(kind, value, column)
        except UsageError as exc:
            problem(str(exc))
    try:
        devices = parse_devices_cell(exp.get(row, "Devices"))
    except ValueError as exc:
        problem(str(exc))
        devices = None
    try:
        collocation = parse_collocation(exp.get(row, "Collocation"))
    except ValueError as exc:
        problem(str(exc))
        collocation = SHARED.key
    listeners = exp.get(row, "Listeners") or DEFAULT_LISTENERS
    try:
        sources, profiler = parse_listeners(listeners), parse_profiler(listeners)
    except ListenerError as exc:
        problem(f"{exc}")
        sources, profiler = [], None
    try:
        params = shlex.split(exp.get(row, "Params"))
    except ValueError as exc:
        problem(f"Params cannot be split into arguments ({exc}); close the quote")
        params = []
    file = exp.get(row, "File")
    if not file:
        problem("File is empty; give the training script, e.g. train.py")
    planned = PlannedRun(row, run_letter(number), devices, collocation, file, params, listeners, sources, profiler)
    if planned.mode is not Mode.SHARED and devices is None:
        problem(f"Collocation {collocation_label(collocation)} needs a GPU; set Devices, e.g. 0")
    if planned.mig and devices is not None and len(devices) != 1:
        problem(f"a MIG instance lives on one GPU; give one device for {collocation}, not {'+'.join(map(str, devices))}")
    return planned


def _check_on_machine(planned: PlannedRun, base: Path, facts: _MachineFacts, problem: Callable[[str], None]) -> list[int] | None:
    """What the machine must offer a run that will start: its script, its tools, its GPUs; the run's GPU indices, None on a problem."""
    file = planned.file
    resolved = _resolve_file(file, base)
    try:
        if Path(resolved).is_dir():
            problem(f"File '{file}' is a folder; give the training script in it, e.g. {Path(file) / 'train.py'}")
        else:
            build_command(resolved, planned.params)
            planned.file = resolved
    except UsageError as exc:
        if Path(resolved).exists():  # there, but it cannot run (no x bit, a bad #! line): build_command says why and the fix
            problem(f"File '{file}': {str(exc).removeprefix('radt: ')}")
        else:
            places = " and ".join(dict.fromkeys(str(Path(folder).resolve()) for folder in (base, Path.cwd())))
            script, _space, arguments = file.partition(" ")
            if arguments and Path(_resolve_file(script, base)).is_file():  # `train.py --epochs 1` in File: the arguments belong in Params
                problem(f"File '{file}' holds arguments; put the script ({script}) in File and its arguments ({arguments.strip()}) in Params")
            else:
                problem(f"File '{file}' not found (looked in {places}); fix the path or create the script")
    if planned.profiler:
        from radt.collectors.run.profilers import EXECUTABLE

        if not facts.machine.has(EXECUTABLE[planned.profiler]):
            problem(f"listener '{planned.profiler}' needs '{EXECUTABLE[planned.profiler]}' on PATH; install Nsight or drop it from Listeners")
    if planned.mode is Mode.MPS and not facts.machine.has("nvidia-cuda-mps-control"):
        problem("Collocation MPS needs 'nvidia-cuda-mps-control' on PATH (it comes with the NVIDIA driver)")
    devices = planned.devices
    if devices and any(isinstance(d, str) for d in devices):
        try:
            devices = planned.devices = resolve_uuids(devices, facts.gpu_uuids())
        except ValueError as exc:
            problem(str(exc))
            return None
    if devices:
        gpus = facts.gpu_count()
        if isinstance(gpus, int) and max(devices) >= gpus:
            span = f"0 to {gpus - 1}" if gpus else "none"
            problem(f"GPU {max(devices)} does not exist on this machine (GPUs: {span}); fix Devices")
            return None
    return devices


def _mig_problem(offered: dict[str, MigProfile] | str, gpu: int, profile: str, wanted: int, workload: str) -> str | None:
    """Why a GPU cannot give a workload `wanted` instances of a MIG profile (None: it can)."""
    if isinstance(offered, str):
        return offered
    if profile not in offered:
        names = ", ".join(sorted(offered, key=lambda p: offered[p].profile_id)) or "none"
        return f"GPU {gpu} does not offer MIG profile {profile}; it offers {names}"
    if wanted > offered[profile].free:
        return f"workload {workload} wants {wanted} × {profile} on GPU {gpu}, which has {offered[profile].free} free; use fewer runs or a smaller profile"
    return None


def _place_slices(facts: _MachineFacts, gpu: int, runs: list[PlannedRun], workload: Workload) -> str | None:
    """Place a workload's MIG slices on GPU `gpu` together (each run's mig_slot), or say why they cannot be, with a fix."""
    layout = facts.mig_layout(gpu)
    if isinstance(layout, str):
        return f"{layout}; radt reads GPU {gpu}'s MIG instances to place the workload's slices (creating them needs the same rights)"
    if layout is None:
        return None
    if layout.fallback:
        workload.notes.append(placement_note(gpu, layout))
    if not layout.placements:
        return None
    profiles = [r.collocation for r in runs]
    starts = place(layout, profiles)
    if starts is not None:
        for run, start in zip(runs, starts, strict=True):
            run.mig_slot = Slot(start, memory_size(layout, run.collocation))
        return None
    return (
        f"workload {workload.name}'s MIG slices {' + '.join(profiles)} cannot be placed together on GPU {gpu} "
        f"({why_not(layout, profiles)}); {_placement_fix(layout, gpu, runs)}"
    )


def _placement_fix(layout: MigLayout, gpu: int, runs: list[PlannedRun]) -> str:
    """What makes the set fit: one row's smaller profile, or the fewest rows moved elsewhere (or the GPU freed)."""
    profiles = [r.collocation for r in runs]
    fixes = []
    swap = smaller_swap(layout, profiles)
    if swap:
        fixes.append(f"make row {runs[swap[0]].row.line} {swap[1]}")
    dropped = fewest_dropped(layout, profiles)
    if len(dropped) < len(runs):
        fixes.append(f"move {_rows_text([runs[i].row for i in dropped])} to another workload or GPU")
    elif layout.held:
        fixes.append(f"remove the GPU instances there ('sudo nvidia-smi mig -i {gpu} -gi ID -dci', then '-dgi') or use another GPU")
    else:
        fixes.append("use another GPU")
    return ", or ".join(fixes)


def _rows_text(rows: list[Row]) -> str:
    return f"row {rows[0].line}" if len(rows) == 1 else f"rows {', '.join(str(r.line) for r in rows)}"


def _resolve_file(file: str, base: Path) -> str:
    """A relative File is looked up next to the CSV first, then in the current folder; commands on PATH as they are."""
    path = Path(file)
    if path.is_absolute():
        return file
    beside = base / path
    if beside.exists():
        return str(beside)
    return file
