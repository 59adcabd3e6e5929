"""A script's flags that MLflow cannot take as param names (`--w[0] 1`, `--a,b 1`, `-x?`, `--opt+x 1`).

Before, MLflow's rule for param keys refused them after radt had created the run: a traceback, the script
never ran, and the run (and its `-w` parent) stayed RUNNING. Now each is stored under an escaped key that
reads like it (`w:5B0:5D`), the command param keeps it as typed, and the script runs as it would alone.
"""

from __future__ import annotations

import pytest

from tests.support.radtproc import radt_env, run_radt

ARGS = ["--w[0]", "1", "--a,b", "2", "-x?", "--opt+x", "3", "--lr=0.1"]
ESCAPED = {"w:5B0:5D": "1", "a:2Cb": "2", "x:3F": "True", "opt:2Bx": "3", "lr": "0.1"}


@pytest.mark.parametrize("workload", [None, "w1"], ids=["run", "workload"])
def test_flags_mlflow_cannot_name_are_params_under_an_escaped_key_and_the_script_runs(workload, store_uri, radt_home, tmp_path):
    from mlflow import MlflowClient

    (tmp_path / "args.py").write_text("import sys\nopen('argv.txt', 'w').write(repr(sys.argv[1:]))\n")
    chosen = ["-w", workload] if workload else []

    result = run_radt([*chosen, "-l", "host", "args.py", *ARGS], env=radt_env(radt_home, store_uri), cwd=tmp_path, timeout=120)

    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert (tmp_path / "argv.txt").read_text() == repr(ARGS), "the script ran with its arguments as typed"
    runs = {r.info.run_name: r for r in MlflowClient(store_uri).search_runs(["0"])}
    assert {r.info.status for r in runs.values()} == {"FINISHED"}, "no run (nor its workload parent) is left RUNNING"
    assert len(runs) == (2 if workload else 1)
    (run,) = [r for r in runs.values() if not r.info.run_name.startswith("workload ")]
    assert {k: v for k, v in run.data.params.items() if k in ESCAPED} == ESCAPED
    assert run.data.params["command"].endswith("args.py '--w[0]' 1 --a,b 2 '-x?' --opt+x 3 --lr=0.1"), "the flags as typed"


def test_escaped_keys_are_valid_for_mlflow_distinct_and_readable():
    """Every key passes MLflow's own validation, two names never share one, and a name MLflow takes is kept as typed."""
    from mlflow.utils.validation import _validate_param_name

    from radt.collectors.store.tracking import param_key, script_params

    names = ["w[0]", "a,b", "x?", "opt+x", "a:b", "a:3Ab", "a/", "..", ".", "a/./b", "/abs", "x€", "tab\there", "größe", "batch-size", "model.lr", "a b"]
    keys = [param_key(name) for name in names]
    for key in keys:
        _validate_param_name(key)
    assert len(set(keys)) == len(names)
    assert keys[:5] == ["w:5B0:5D", "a:2Cb", "x:3F", "opt:2Bx", "a:3Ab"] and keys[-4:] == names[-4:]
    assert script_params(["--=5"]) == {"arg0": "--=5"}, "a flag without a name is an argument"


def test_a_flag_named_like_radts_own_params_is_kept_under_script_prefix(store_uri, radt_home, tmp_path):
    """`train.py --command fit --max_epoch 7`: radt wrote its own `command` and `max_epoch` over the script's (the script's
    values were lost). Now the script's are `script:command` and `script:max_epoch`, radt's stay what they say."""
    from mlflow import MlflowClient
    from mlflow.utils.validation import _validate_param_name

    (tmp_path / "fit.py").write_text("print('fitted')\n")

    result = run_radt(["-l", "host", "fit.py", "--command", "fit", "--max_epoch", "7", "--manual"], env=radt_env(radt_home, store_uri), cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    (run,) = MlflowClient(store_uri).search_runs(["0"])
    params = run.data.params
    assert params["script:command"] == "fit" and params["script:max_epoch"] == "7" and params["script:manual"] == "True"
    assert params["command"].endswith("fit.py --command fit --max_epoch 7 --manual") and params["max_epoch"] == "None"
    _validate_param_name("script:command")
