"""`radt [options] train.py [args...]` and `radt [--dry-run] [--rerun] experiment.csv` (radt/cli.py dispatches here).

User mistakes end in one line naming the problem and the fix, and exit code 2; the script's
own exit code is passed through otherwise.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

from radt.artifacts import configure as configure_artifacts
from radt.cli import OneLineParser, commands_text
from radt.collectors._common import UsageError, check_host, check_name, check_numbers
from radt.collectors.run.command import build_command, check_script
from radt.collectors.run.profilers import check_profiler
from radt.collectors.sources.listeners import DEFAULT, ListenerError, parse_listeners, parse_profiler
from radt.collocation import SHARED
from radt.errors import report
from radt.options import recording_parent, store_parent
from radt.settings import check_radt_home, tracking_uri


def parse_devices(spec: str | None) -> list[int | str] | None:
    """'0+1' or '0,1' -> [0, 1] (nvidia-smi's indices); GPU-/MIG- UUIDs kept as text; '-' or empty -> None (no GPU pinning)."""
    from radt.collectors.sources.gpus import device_tokens

    return device_tokens(spec)


def process_ends(code: int) -> int:
    """`code`, which radt's entry points exit with next: the heap is frozen first, so that the interpreter's
    last garbage collections skip SQLAlchemy's and radt's objects (0.2-0.5 s of a two-core machine at exit)."""
    gc.freeze()
    return code


SCHEDULER_ONLY = "is the scheduler's own option: run the workload from its CSV (radt experiment.csv)"


def check_gate(text: str) -> Path:
    """--start-gate, the CSV scheduler's: a radt-gate-* folder of this user's that it made for one workload. Any other
    path (`/etc`) was waited at for ever, its run RUNNING, with files written into it."""
    from radt.collectors.experiment.workloads import GATE_PREFIX

    path = Path(text)
    try:
        usable = path.name.startswith(GATE_PREFIX) and path.is_dir() and path.stat().st_uid == os.getuid() and os.access(path, os.W_OK | os.X_OK)
    except OSError:
        usable = False
    if not usable:
        raise UsageError(
            f"--start-gate {text} is not a start-gate folder of radt's CSV scheduler ({GATE_PREFIX}*, made for one workload); --start-gate {SCHEDULER_ONLY}"
        )
    return path


def run_parser(script: bool = True) -> argparse.ArgumentParser:
    """radt's own options and, with `script`, the script (or experiment CSV) and the script's arguments after it."""
    parser = OneLineParser(
        parents=[store_parent(), recording_parent("at exit")],
        prog="radt",
        description="Track a training script's hardware metrics in MLflow: radt [options] train.py [script args]. "
        "Run a whole experiment of collocated workloads: radt [--dry-run] [--rerun] experiment.csv (radt's options may follow the CSV). "
        f"Also: {commands_text()}; each has its own --help.",
    )
    parser.add_argument("-e", "--experiment", help="MLflow experiment name or id (created if new)")
    parser.add_argument("-n", "--name", help="run name")
    parser.add_argument("-w", "--workload", help="workload this run belongs to (a parent run groups them)")
    parser.add_argument(
        "-d",
        "--devices",
        help="GPUs to use and watch, joined with '+': nvidia-smi's indices (0+1) or UUIDs (GPU-..., MIG-... for a MIG slice); sets CUDA_VISIBLE_DEVICES",
    )
    parser.add_argument(
        "-l",
        "--listeners",
        default=DEFAULT,
        help=f"sources joined with '+': nvml, dcgm, host (radT's smi, dcgmi, top, ps, iostat work too), plus at most one profiler that wraps the script: nsys, ncu, nsys-raw, ncu-raw; default {DEFAULT}",
    )
    parser.add_argument(
        "--prometheus",
        metavar="URL",
        help="the cluster's Prometheus server (http://prometheus:9090) whose dcgm-exporter series the prometheus listener reads "
        "for this node's GPUs; adds that listener to a single run (a CSV's rows name it in Listeners); default RADT_PROMETHEUS_URL",
    )
    parser.add_argument(
        "--host",
        metavar="NAME",
        help="this node's name as its exporter labels it in Prometheus (Hostname or hostname; a pod or container has another name "
        "of its own), also the run's radt.host tag; default RADT_HOST, else this machine's host name",
    )
    parser.add_argument("--max-epoch", type=int, help="stop the training cleanly after this epoch (radt.run() context)")
    parser.add_argument("--max-time", type=float, help="stop the training cleanly after this many minutes")
    parser.add_argument("--manual", action="store_true", help="start sampling when the script enters 'with radt.run()'")
    parser.add_argument(
        "--artifacts",
        metavar="URI",
        help="where new experiments keep their artifacts (logs, nsys/ncu reports) as URI/<experiment>: a folder every host mounts, "
        "mlflow-artifacts://HOST:5000/path (an mlflow server's), s3://bucket/path...; default RADT_ARTIFACT_URI, else ~/.radt/artifacts",
    )
    parser.add_argument("--dry-run", action="store_true", help="CSV experiments: print the plan (workloads, devices, set-up, commands) and start nothing")
    parser.add_argument("--rerun", action="store_true", help="CSV experiments: run FAILED workloads again (FINISHED ones are always skipped)")
    parser.add_argument(
        "--slurm", action="store_true", help="CSV experiments: submit each workload as one Slurm job (sbatch) and watch it; Ctrl-C cancels the jobs"
    )
    parser.add_argument("--slurm-partition", help="--slurm: the partition to submit to (sbatch --partition)")
    parser.add_argument("--slurm-account", help="--slurm: the account to charge (sbatch --account)")
    parser.add_argument("--slurm-time", help="--slurm: each job's time limit (sbatch --time, e.g. 2:00:00)")
    parser.add_argument("--sbatch", default="", help="--slurm: further sbatch options as one argument, e.g. --sbatch='--qos=high --mem=64G'")
    parser.add_argument("--slurm-rows", help=argparse.SUPPRESS)  # a --slurm job's: the CSV rows of the one workload it runs
    parser.add_argument("--letter", help=argparse.SUPPRESS)  # the CSV scheduler's; a -w run without it takes the next free letter
    parser.add_argument("--collocation", default=SHARED.cell, help=argparse.SUPPRESS)
    parser.add_argument("--parent-run", help=argparse.SUPPRESS)  # the CSV scheduler's workload run
    parser.add_argument("--cuda-visible", help=argparse.SUPPRESS)  # a MIG UUID or an MPS daemon's numbering
    parser.add_argument("--start-gate", help=argparse.SUPPRESS)  # the CSV scheduler's synchronised start
    if script:
        parser.add_argument("script", help="training script (.py), command, or experiment CSV (.csv)")
        parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script; after an experiment CSV, radt's own options")
    return parser


def parse_options(argv: list[str]) -> argparse.Namespace:
    """The command line: radt's options before the script, and after an experiment CSV too (radT's order,
    `radt experiment.csv --dry-run`), since a CSV takes no script arguments; after a script every word is the script's.
    What is left after a CSV stays in `args`, for _experiment to refuse with the fix."""
    opts = run_parser().parse_args(argv)
    if opts.script.lower().endswith(".csv") and opts.args:
        opts, opts.args = run_parser(script=False).parse_known_args(opts.args, namespace=opts)
    return opts


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = parse_options(argv)
    try:  # the user's mistakes first, before MLflow is even imported (two seconds): one line, exit 2
        check_numbers(opts.interval, opts.max_time, opts.max_epoch, opts.flush_timeout)
        if not opts.dry_run:  # before the reaper, the store and the run: a full or read-only RADT_HOME leaves nothing behind
            check_radt_home()
        store = tracking_uri(opts.store)
        configure_artifacts(opts.artifacts, store)  # RADT_ARTIFACT_URI, which the runs it starts inherit
        if opts.prometheus is not None:
            from radt.collectors.sources.promql import check_url

            os.environ["RADT_PROMETHEUS_URL"] = check_url(opts.prometheus)  # as the runs of a CSV experiment read it
        if opts.host is not None:
            if opts.slurm:
                raise UsageError("--host names this node; a --slurm job runs on the node Slurm picks, under that node's name: drop --host")
            os.environ["RADT_HOST"] = check_host(opts.host)
        if opts.start_gate is not None:
            check_gate(opts.start_gate)
        if opts.script.lower().endswith(".csv"):
            return _experiment(opts, store)
        if opts.dry_run or opts.rerun or opts.slurm:
            if opts.slurm:
                raise UsageError("--slurm is for CSV experiments: radt --slurm experiment.csv (a single run inside a Slurm job: srun radt train.py)")
            raise UsageError("--dry-run and --rerun are for CSV experiments: radt --dry-run experiment.csv")
        for kind, label, value in (("experiment", "-e", opts.experiment), ("run", "-n", opts.name), ("workload", "-w", opts.workload)):
            check_name(kind, value, label)
        devices = parse_devices(opts.devices)
        listeners = parse_listeners(opts.listeners)
        if opts.prometheus is not None and "prometheus" not in listeners:
            listeners.append("prometheus")
        profiler = parse_profiler(opts.listeners)
        if profiler:
            check_profiler(profiler)
        check_script(opts.script)
        build_command(opts.script, opts.args)
    except (ListenerError, UsageError, ValueError) as exc:
        print(f"radt: {exc}", file=sys.stderr)
        return 2
    from radt.collectors.recovery.reaper import reap
    from radt.collectors.run.runner import RunOptions, run_script
    from radt.collectors.store.nodes import ignored_run_id
    from radt.collectors.store.tracking import StoreError

    note = ignored_run_id(os.environ)  # MLFLOW_RUN_ID that names no run to join: said, not ignored without a word
    if note:
        report(note)

    try:
        run = RunOptions(
            script=opts.script,
            script_args=opts.args,
            store=store,
            experiment=opts.experiment,
            name=opts.name,
            workload=opts.workload,
            devices=devices,
            listeners=listeners,
            interval=opts.interval,
            max_epoch=opts.max_epoch,
            max_time=opts.max_time,
            manual=opts.manual,
            letter=opts.letter or ("" if opts.workload and not opts.parent_run else "A"),  # "": tracking picks the workload's next letter
            collocation=opts.collocation,
            flush_timeout=opts.flush_timeout,
            profiler=profiler,
            parent_run=opts.parent_run,
            cuda_visible=opts.cuda_visible,
            start_gate=Path(opts.start_gate) if opts.start_gate else None,
        )
        if run.start_gate is None:  # a CSV run's scheduler has done it
            reap(store=run.store, wait=False)  # trees and runs that killed radt processes left (collectors/recovery/reaper.py)
        return process_ends(run_script(run))
    except (UsageError, ListenerError, StoreError, ValueError) as exc:
        print(f"radt: {exc}", file=sys.stderr)
        return 2


def _experiment(opts: argparse.Namespace, store: str) -> int:
    """`radt [--dry-run] [--rerun] experiment.csv`: options for single runs that make no sense here are refused."""
    if opts.args:
        raise UsageError(f"a CSV experiment takes no script arguments ({' '.join(opts.args)}); put them in the Params column")
    given = [
        flag for flag, value in (("-e", opts.experiment), ("-n", opts.name), ("-w", opts.workload), ("-d", opts.devices), ("--manual", opts.manual)) if value
    ]
    if opts.listeners != DEFAULT:
        given.append("-l")
    if given:
        raise UsageError(f"{', '.join(given)} do not apply to a CSV experiment; set Experiment, Workload, Devices and Listeners per row in {opts.script}")
    slurm_given = [flag for flag, value in (("--slurm-partition", opts.slurm_partition), ("--slurm-account", opts.slurm_account),
                                            ("--slurm-time", opts.slurm_time), ("--sbatch", opts.sbatch)) if value]  # fmt: skip
    if slurm_given and not opts.slurm:
        raise UsageError(f"{', '.join(slurm_given)} only apply with --slurm; add it: radt --slurm {slurm_given[0]} ... {opts.script}")
    import shlex

    try:
        sbatch = shlex.split(opts.sbatch)
    except ValueError as exc:
        raise UsageError(f"--sbatch '{opts.sbatch}' cannot be split into options ({exc}); close the quote") from exc
    from radt.collectors.experiment.scheduler import ExperimentOptions, run_experiment
    from radt.collectors.store.tracking import StoreError

    experiment = ExperimentOptions(
        csv=Path(opts.script),
        store=store,
        dry_run=opts.dry_run,
        rerun=opts.rerun,
        interval=opts.interval,
        max_epoch=opts.max_epoch,
        max_time=opts.max_time,
        flush_timeout=opts.flush_timeout,
    )
    try:
        if opts.slurm_rows:  # inside a job that `radt experiment.csv --slurm` submitted
            from radt.collectors.slurm.job import run_job

            experiment.csv = experiment.csv.resolve()
            return process_ends(run_job(experiment, [int(line) for line in opts.slurm_rows.split(",")]))
        if opts.slurm:
            from radt.collectors.slurm.jobscript import SlurmOptions
            from radt.collectors.slurm.submitter import submit_experiment

            slurm = SlurmOptions(opts.slurm_partition, opts.slurm_account, opts.slurm_time, sbatch)
            return process_ends(submit_experiment(experiment, slurm))
        from radt.collectors.recovery.reaper import reap

        return process_ends(run_experiment(experiment, lambda: reap(report, store=store, wait=False)))
    except StoreError as exc:
        print(f"radt: {exc}", file=sys.stderr)
        return 2
