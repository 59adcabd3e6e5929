"""Option parsing that users rely on: devices, listeners, radT-style script params."""

from __future__ import annotations

import pytest

from collectors.cli import parse_devices
from collectors.listeners import ListenerError, parse_listeners
from collectors.runner import build_command, exit_code, watched_devices
from collectors.tracking import script_params


def test_devices():
    assert parse_devices("0") == [0]
    assert parse_devices("1+2") == [1, 2]
    assert parse_devices("0,3") == [0, 3]
    assert parse_devices("-") is None and parse_devices(None) is None
    with pytest.raises(ValueError, match="bad -d '1\\+x'"):
        parse_devices("1+x")


def test_watched_devices_follow_d_then_cuda_visible_devices():
    assert watched_devices([2], "0,1") == [2]
    assert watched_devices(None, "1,3") == [1, 3]
    assert watched_devices(None, None) is None
    assert watched_devices(None, "") == []
    assert watched_devices(None, "GPU-8a1c,GPU-77ff") is None


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


def test_exit_code_of_a_signalled_child():
    assert exit_code(3) == 3
    assert exit_code(-2) == 130
    assert exit_code(-15) == 143
