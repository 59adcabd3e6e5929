"""Option parsing that users rely on: devices, listeners, radT-style script params."""

from __future__ import annotations

from pathlib import Path

import pytest

from radt.collectors.cli import parse_devices
from radt.collectors.run.runner import build_command, exit_code, watched_devices
from radt.collectors.sources.listeners import ListenerError, parse_listeners
from radt.collectors.store.tracking import script_params


def test_devices():
    assert parse_devices("0") == [0]
    assert parse_devices("1+2") == [1, 2]
    assert parse_devices("0,3") == [0, 3]
    assert parse_devices("-") is None and parse_devices(None) is None
    assert parse_devices("GPU-8a1c+MIG-77f0,1") == ["GPU-8a1c", "MIG-77f0", 1]
    with pytest.raises(ValueError, match="bad -d '1\\+x'"):
        parse_devices("1+x")


def test_watched_devices_follow_d_then_cuda_visible_devices():
    assert watched_devices([2], "0,1") == [2]
    assert watched_devices(None, "1,3") == [1, 3]
    assert watched_devices(None, None) is None
    assert watched_devices(None, "") == []
    assert watched_devices(None, "GPU-8a1c,GPU-77ff") == []  # UUIDs NVML cannot map: no GPU by index, never every GPU (#25)


def test_listener_aliases_from_radt():
    assert parse_listeners("smi+top+dcgmi") == ["nvml", "host", "dcgm"]
    assert parse_listeners("ps+iostat") == ["host"]
    assert parse_listeners(None) == ["nvml", "host"]
    with pytest.raises(ListenerError, match="unknown listener 'gpustat'"):
        parse_listeners("nvml+gpustat")


def test_script_params_like_radt():
    params = script_params(["--batch-size", "256", "--lr=0.1", "--fp16", "--offset", "-3", "data/", "-v"])
    assert params == {"batch-size": "256", "lr": "0.1", "fp16": "True", "offset": "-3", "arg0": "data/", "v": "True"}


def test_build_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    command = build_command("train.py", ["--x", "1"])
    assert command[-3:] == ["train.py", "--x", "1"] and command[1] == "-u"
    assert build_command("true", [])[0] == "true"


def test_numbers_are_finite_and_in_range():
    from radt.collectors._common import UsageError, check_numbers

    check_numbers(0.1, 0.5, 0, 0)  # the smallest values that make sense
    check_numbers(1.0, None, None, 60.0)
    for args, message in [
        ((float("nan"), None, None, None), "--interval nan is not a finite number"),
        ((0.05, None, None, None), "--interval 0.05 is too short"),
        ((1.0, 0.0, None, None), "--max-time 0 is not a positive number of minutes"),
        ((1.0, float("-inf"), None, None), "--max-time -inf is not a positive number"),
        ((1.0, None, -1, None), "--max-epoch -1 is negative"),
        ((1.0, None, None, float("nan")), "--flush-timeout nan is not 0 or more seconds"),
    ]:
        with pytest.raises(UsageError, match=message):
            check_numbers(*args)


def test_run_letters_like_radt():
    from radt.runmodel import run_letter

    assert [run_letter(n) for n in (0, 1, 25, 26, 27, 701, 702)] == ["A", "B", "Z", "AA", "AB", "ZZ", "AAA"]


def test_exit_code_of_a_signalled_child():
    assert exit_code(3) == 3
    assert exit_code(-2) == 130
    assert exit_code(-15) == 143


def test_the_script_sees_gpus_numbered_as_nvidia_smi_and_the_csv_override(tmp_path, monkeypatch):
    from radt.collectors.run.runner import RunOptions, child_environment

    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    env = child_environment(RunOptions("train.py", devices=[1, 3]), "r", "0", tmp_path, None)
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID", "CUDA's default order is fastest first"
    mig = child_environment(RunOptions("train.py", devices=[2], cuda_visible="MIG-1234"), "r", "0", tmp_path, None)
    assert mig["CUDA_VISIBLE_DEVICES"] == "MIG-1234", "a CSV run's MIG instance (or MPS numbering) wins over -d"
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    assert child_environment(RunOptions("train.py", devices=[0]), "r", "0", tmp_path, None)["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST", "the user's choice is kept"


def test_the_script_gets_the_watched_gpus_uuids_under_the_users_own_cuda_order(tmp_path, monkeypatch):
    """DGX Station: -d 3 is NVML's 3 (the display GPU); under FASTEST_FIRST CUDA's 3 is another GPU, so the script gets the UUID."""
    import pynvml

    from radt.collectors.run.runner import RunOptions, check_devices, child_environment
    from tests.fakes.fake_nvml import dgx_station, install_fake

    install_fake(pynvml, dgx_station(), monkeypatch.setattr)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    opts = RunOptions("train.py", devices=[3])
    env = child_environment(opts, "r", "0", tmp_path, None, check_devices(opts.devices))
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"]) == (dgx_station()[3]["uuid"], "FASTEST_FIRST")
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    env = child_environment(opts, "r", "0", tmp_path, None, check_devices(opts.devices))
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"]) == ("3", "PCI_BUS_ID"), "integers where CUDA numbers as nvidia-smi does"


def test_profilers_are_listeners_too():
    from radt.collectors.run.profilers import wrap
    from radt.collectors.sources.listeners import parse_profiler

    assert parse_listeners("smi+top+nsys") == ["nvml", "host"] and parse_profiler("smi+top+nsys") == "nsys"
    assert parse_profiler("top+ncuraw") == "ncu-raw" and parse_profiler("smi+top") is None
    with pytest.raises(ListenerError, match="keep one profiler per run"):
        parse_profiler("nsys+ncu")
    command, env = wrap("ncu", ["python", "train.py"], Path("/logs"), "1_2_A")
    assert command[:5] == ["ncu", "--nvtx", "--nvtx-include", "profile/", "-f"] and command[-2:] == ["python", "train.py"]
    assert "/logs/ncu_1_2_A" in command and env == {"RADT_NVTX_RANGE": "profile"}
    raw, raw_env = wrap("nsys-raw", ["train"], Path("/logs"), "x")
    assert "--capture-range=nvtx" not in raw and raw_env == {}


def test_radt_options_after_an_experiment_csv_are_radts_own():
    """radT's users write `radt experiment.csv --dry-run`: radt refused it, with a hint to put --dry-run in the Params column."""
    from radt.collectors.cli import parse_options

    opts = parse_options(["--rerun", "experiment.csv", "--dry-run", "--interval", "0.5", "--max-epoch", "3"])
    assert (opts.script, opts.args) == ("experiment.csv", [])
    assert (opts.dry_run, opts.rerun, opts.interval, opts.max_epoch) == (True, True, 0.5, 3)
    # what is no option of radt's is still a script argument the CSV does not take (refused by the caller, with the fix)
    assert parse_options(["experiment.csv", "--dry-run", "--epochs", "3"]).args == ["--epochs", "3"]
    # after a script, every word is the script's
    script = parse_options(["train.py", "--dry-run", "--interval", "9"])
    assert (script.args, script.dry_run, script.interval) == (["--dry-run", "--interval", "9"], False, 1.0)


def test_experiment_csv_then_dry_run_prints_the_plan(tmp_path, radt_home):
    from tests.support.radtproc import radt_env, run_radt

    (tmp_path / "ok.py").write_text("print('ok')\n")
    (tmp_path / "experiment.csv").write_text("Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\nexp,1,,,-,-,ok.py,top,\n")
    before = (tmp_path / "experiment.csv").read_bytes()
    result = run_radt(["experiment.csv", "--dry-run"], env=radt_env(radt_home, f"sqlite:///{tmp_path / 'u.db'}"), cwd=tmp_path, timeout=60)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "ok.py" in result.stdout, result.stdout
    assert (tmp_path / "experiment.csv").read_bytes() == before and not (tmp_path / "u.db").exists(), "a dry run writes nothing"


def test_radt_help_and_the_bare_command_name_every_subcommand():
    """`radt --help` listed neither dashboard, rollup nor retain."""
    from radt.cli import COMMANDS, NOTHING_TO_DO
    from radt.collectors.cli import run_parser

    text = " ".join(run_parser().format_help().split())  # argparse wraps the description at any space
    missing = [name for name in COMMANDS if f"'radt {name}" not in text]
    assert not missing, f"radt --help does not name {missing}"
    assert not [name for name in COMMANDS if f"radt {name}" not in NOTHING_TO_DO]
