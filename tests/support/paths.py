"""Where things are: the repository, the real tool logs, the fakes, the test artifacts, the test Redis."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
FIXTURES = Path(os.environ.get("RADT_FIXTURES", TESTS / "fixtures" / "real-tool-logs"))  # a copy of shared/fixtures (see its README)
FAKE_BIN = TESTS / "fakes" / "bin"  # dcgmi replaying a real dmon log
FAKE_NVML_DIR = TESTS / "fakes" / "nvml_shadow"  # a pynvml that answers like a driver with the GPUs in RADT_FAKE_NVML
FAKE_TOOLS = TESTS / "fakes" / "gpu_tools"  # nvidia-smi, nvidia-cuda-mps-control, nsys, ncu that record each call
ARTIFACTS = Path(os.environ.get("RADT_TEST_ARTIFACTS", REPO / "test-artifacts"))  # screenshots
REDIS = os.environ.get("RADT_TEST_REDIS", "redis://127.0.0.1:6379/0")
