"""An idle dashboard tab costs nothing: no stylesheet of radt's animates forever. Chromium repaints an endless animation
every frame; without a GPU (a VM, a remote desktop, headless) the Live badge's pulsing dot kept 8 % of a core busy for as
long as a tab showing a running run stayed open (0.80 s of CPU in 10 s idle, against 0.05 s without it)."""

from __future__ import annotations

import re
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def test_no_stylesheet_animates_forever():
    endless = [
        f"{path.name}: {line.strip()}"
        for path in sorted(ASSETS.glob("*.css"))
        for line in path.read_text().splitlines()
        if re.search(r"\banimation[^;]*\binfinite\b", line)
    ]
    assert endless == []


def test_the_live_badge_still_says_a_run_went_live():
    css = (ASSETS / "page.css").read_text()
    assert re.search(r"\.live-badge \.dot \{ animation: radt-pulse [\d.]+s [\w-]+ [1-9]; \}", css), "the dot pulses a few times"
