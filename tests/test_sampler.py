"""One instrument per series: `-l nvml+dcgm` on a simulated H100 (the fake NVML below pynvml, the fake `dcgmi`
replaying a real dmon log), where both listeners read SMACT and power. Each series holds one listener's readings for
the whole run, the first named in -l (NVML's GPM gives SMACT a tick after DCGM does, and still keeps it)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.fakes.fake_nvml import H100
from tests.support.radtproc import radt_env, run_radt

LOG = Path(__file__).parent / "fixtures" / "real-tool-logs" / "mnist_dcgmi_dmon_18fields.txt"
GPUS = json.dumps([{**H100, "load": 0.7}])
NVML_SMACT = 0.7  # the fake H100's GPM at load 0.7 (tests/fakes/fake_nvml.py)
NVML_POWER = 60 + (560 - 60) * 0.7  # its power at that load, in W
TRAIN = textwrap.dedent(
    """
    import sys, time
    import radt
    from tests.support.stored import points

    with radt.run() as run:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if points(run.run_id, "system/gpu_0_sm_active") >= int(sys.argv[1]):
                break
    """
)


def recorded(column: str) -> set[float]:
    """The values the real dmon log holds for GPU 0 in `column` (what the fake dcgmi replays)."""
    values = set()
    for line in LOG.read_text().splitlines():
        if line.startswith("#Entity"):
            index = line.split().index(column) + 1  # "GPU 0" takes two fields where "#Entity" takes one
        elif line.startswith("GPU 0 "):
            cell = line.split()[index]
            if cell != "N/A":
                values.add(float(cell))
    return values


@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)  # which source a point comes from does not depend on the store
@pytest.mark.parametrize("listeners", ["nvml+dcgm+host", "dcgm+nvml+host"])
def test_a_series_two_listeners_read_holds_the_first_named_ones_readings_only(store_uri, radt_home, tmp_path, listeners):
    (tmp_path / "train.py").write_text(TRAIN)
    env = radt_env(radt_home, store_uri, fake_gpus=GPUS, fake_bin=True, extra={"RADT_FIXTURES": str(LOG.parent)})
    result = run_radt(["-e", "both", "-d", "0", "-l", listeners, "--interval", "0.2", "train.py", "6"], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first, second = listeners.split("+")[:2]
    client = MlflowClient(store_uri)
    run = client.search_runs([client.get_experiment_by_name("both").experiment_id], "tags.`radt.role` = 'run'")[0]
    smact = [m.value for m in client.get_metric_history(run.info.run_id, "system/gpu_0_sm_active")]
    power = [m.value for m in client.get_metric_history(run.info.run_id, "system/gpu_0_power_usage_watts")]
    assert len(smact) >= 6 and len(power) >= 6
    assert NVML_SMACT not in recorded("SMACT") and NVML_POWER not in recorded("POWER")  # so every value tells its instrument
    if first == "nvml":
        assert smact == pytest.approx([NVML_SMACT] * len(smact)) and power == pytest.approx([NVML_POWER] * len(power))
    else:
        assert set(smact) <= recorded("SMACT") and set(power) <= recorded("POWER")
    gr = [m.value for m in client.get_metric_history(run.info.run_id, "system/gpu_0_gr_engine_active")]
    assert gr and (set(gr) <= recorded("GRACT") if first == "dcgm" else NVML_SMACT < gr[0] < 1)
    sources = json.loads(Path(client.download_artifacts(run.info.run_id, "radt/radt-sources.json", str(tmp_path))).read_text())
    kept = sources[second]["series_kept_from"][first]
    assert {"system/gpu_0_sm_active", "system/gpu_0_power_usage_watts"} <= set(kept)
    assert not [k for k in kept if not k.startswith("system/gpu_0_")]  # the host's series are nobody else's
    said = [line for line in result.stderr.splitlines() if "both read" in line]
    assert len(said) == 1 and said[0].startswith(f"radt: listeners '{first}' and '{second}' both read system/gpu_0_"), result.stderr
