"""`pynvml` for subprocess tests: the real nvidia-ml-py, with its function entry points answered by FakeNvml.

Put this folder first on PYTHONPATH and set RADT_FAKE_NVML to a JSON list of GPU specs (see
tests/fakes/fake_nvml.py); `import pynvml` then gets every constant, struct and NVMLError class of
the real module from site-packages, and the driver calls go to the simulated GPUs. Without
RADT_FAKE_NVML the fake has no library, like a machine without the NVIDIA driver; a real driver is
never touched.
"""

import importlib.util
import os
import sys
from importlib.machinery import PathFinder
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _load(name: str, origin: str):
    spec = importlib.util.spec_from_file_location(name, origin)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the real pynvml registers its NVMLError subclasses through sys.modules[__name__]
    spec.loader.exec_module(module)
    return module


def _real_origin() -> str:
    search = [entry for entry in sys.path if Path(entry or os.getcwd()).resolve() != _HERE]
    spec = PathFinder.find_spec("pynvml", search)
    if spec is None or not spec.origin:
        raise ImportError("the real pynvml (package nvidia-ml-py) is not installed; the fake shadows it and needs it")
    return spec.origin


_real = _load("_radt_real_pynvml", _real_origin())
globals().update({name: value for name, value in vars(_real).items() if not name.startswith("__")})

_fake_module = _load("_radt_fake_nvml", str(_HERE.parent / "fake_nvml.py"))
radt_fake = _fake_module.FakeNvml.from_config(os.environ.get("RADT_FAKE_NVML") or "null", nvml=_real)
globals().update(radt_fake.functions())
