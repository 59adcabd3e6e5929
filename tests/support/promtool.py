"""Debian's promtool (the prometheus package ships it; .ci/run installs it): its path, or a skip outside CI and a failure
under CI, where it must be there."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing under CI (Debian's prometheus package ships it; .ci/run installs it)")
        pytest.skip("needs promtool (Debian's prometheus package; .ci/run installs it)")
    return found


def check(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`promtool check ARGS`, its output as text."""
    return subprocess.run([promtool(), "check", *args], input=stdin, capture_output=True, text=True, timeout=60)
